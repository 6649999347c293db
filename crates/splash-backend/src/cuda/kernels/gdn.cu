// Gated DeltaNet

// Up to SEQ_SLOTS sequences of one pass, by value in a kernel's parameters (a captured graph
// keeps them): sequence i has rows off[i] .. off[i] + n[i] - 1 of the pass and its own state.
// A sequence whose pass is recorded for a rollback has save[k][i] != 0: where the kernel
// copies what it reads (its state before the pass, its inputs), as it reads them.
#define SEQ_SLOTS 16
struct SeqSlots {
    u64 state[SEQ_SLOTS];
    u64 save[3][SEQ_SLOTS];
    int off[SEQ_SLOTS], n[SEQ_SLOTS];
};

// Depthwise causal conv + SiLU over x [T, C] with state [K-1, C] (oldest first), advanced past
// x (y must not alias x). Thread (chunk, c) runs channel c over `conv_steps(K)` tokens from
// steps·chunk, its history read from the state (chunk 0) or from x: a pass is as parallel as
// its tokens (a 16-token verify block is 4 chunks, where 16 tokens a thread left it 80 blocks
// walking them in turn). Each output sums its taps in the same order however the pass is cut.
// Chunk 0's thread alone reads and then rewrites the state; a chunk is at least K-1 tokens, so
// no other reads it. Grid: ceil(C / blockDim) · ceil(T / steps) blocks, chunk-major.
__device__ __forceinline__ int conv_steps(int K) { return K - 1 > 4 ? K - 1 : 4; }
// Block `blk` of a conv over one sequence's T rows: (C / blockDim.x chunks of channels) × (T /
// steps chunks of rows). Non-null save_state / save_x get the state before the pass and the
// input rows (a recorded pass).
// The state is read from state_in and left in state (the same buffer but for a rollback replay).
// KC > 0: the taps are the constant KC (the history in registers: with a run-time K, nvcc keeps
// it in local memory); KC = 0: K taps, up to 9.
template <int KC>
__device__ __forceinline__ void conv1d_silu_taps(int blk, const float* x, float* y, const float* state_in, float* state,
                                                 const float* w, int T, int C, int k_rt, float* save_state,
                                                 float* save_x) {
    const int K = KC > 0 ? KC : k_rt;
    int per_chunk = (C + blockDim.x - 1) / blockDim.x;
    int chunk = blk / per_chunk;
    int c = (blk % per_chunk) * blockDim.x + threadIdx.x;
    int steps = conv_steps(K);
    if (c >= C || (chunk > 0 && chunk * steps >= T)) return;
    int t0 = chunk * steps, t1 = min(T, t0 + steps);
    float hist[KC > 0 ? KC : 8], old[KC > 0 ? KC : 8];
#pragma unroll
    for (int j = 0; j < K - 1; j++) {
        int e = t0 - (K - 1) + j;  // position of history slot j; < 0 is in the state
        old[j] = chunk == 0 ? state_in[(long)j * C + c] : 0.0f;
        hist[j] = e < 0 ? state_in[(long)(e + K - 1) * C + c] : x[(long)e * C + c];
        if (save_state && chunk == 0) save_state[(long)j * C + c] = old[j];
    }
    for (int t = t0; t < t1; t++) {
        float xv = x[(long)t * C + c];
        if (save_x) save_x[(long)t * C + c] = xv;
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < K - 1; j++) acc += w[c * K + j] * hist[j];
        acc += w[c * K + K - 1] * xv;
        y[(long)t * C + c] = silu(acc);
#pragma unroll
        for (int j = 0; j < K - 2; j++) hist[j] = hist[j + 1];
        if (K > 1) hist[K - 2] = xv;
    }
    if (chunk != 0) return;
    // The new state: the last K-1 rows of [old state ; x].
#pragma unroll
    for (int j = 0; j < K - 1; j++) {
        int e = T + j;  // index into [old state (K-1 rows) ; x (T rows)]
        float v = 0.0f;
#pragma unroll
        for (int m = 0; m < K - 1; m++)  // old[e], by constant indices
            if (m == e) v = old[m];
        state[(long)j * C + c] = e < K - 1 ? v : x[(long)(e - (K - 1)) * C + c];
    }
}

// The conv of Qwen3.5's 4 taps, or of any K ≤ 9.
__device__ __forceinline__ void conv1d_silu_block(int blk, const float* x, float* y, const float* state_in,
                                                  float* state, const float* w, int T, int C, int K,
                                                  float* save_state = nullptr, float* save_x = nullptr) {
    if (K == 4)
        conv1d_silu_taps<4>(blk, x, y, state_in, state, w, T, C, K, save_state, save_x);
    else
        conv1d_silu_taps<0>(blk, x, y, state_in, state, w, T, C, K, save_state, save_x);
}

extern "C" __global__ void conv1d_silu(const float* x, float* y, float* state, const float* w, int T, int C,
                                       int K) {
    GRID_PROLOGUE();
    conv1d_silu_block(blockIdx.x, x, y, state, state, w, T, C, K);
}

// conv1d_silu over the sequences of a pass in one launch: `per` blocks a sequence (as many as
// the longest needs), each sequence's rows and conv state from `seqs`; a recorded sequence
// saves its conv state to save[0] and its input rows to save[1].
extern "C" __global__ void conv1d_silu_seqs(const float* x, float* y, SeqSlots seqs, const float* w, int per,
                                            int C, int K) {
    GRID_PROLOGUE();
    int i = blockIdx.x / per;
    long off = (long)seqs.off[i] * C;
    float* state = (float*)seqs.state[i];
    conv1d_silu_block(blockIdx.x % per, x + off, y + off, state, state, w, seqs.n[i], C, K, (float*)seqs.save[0][i],
                      (float*)seqs.save[1][i]);
}

// beta = sigmoid(b), g = neg_a[h] · softplus(a + dt_bias[h]) for b, a [T, hv], in place.
extern "C" __global__ void gdn_gates(float* b, float* a, const float* dt_bias, const float* neg_a, int hv,
                                     long n) {
    GRID_PROLOGUE();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int h = (int)(i % hv);
    b[i] = sigmoid(b[i]);
    a[i] = neg_a[h] * softplus(a[i] + dt_bias[h]);
}

// The gated delta rule, token by token. `mixed` [T, C] holds q | k | v after the conv (C =
// 2·hk·GDN_DK + hv·GDN_DV); q and k are L2-normalised here (q also scaled by dk^-0.5). The
// state [GDN_DK, GDN_DV] of a value head is split over blocks of GDN_COLS columns; each column
// over GDN_SLICES adjacent lanes, each holding GDN_DK / GDN_SLICES of its rows in registers (a
// thread per whole column made only hv blocks, too few to read the state at speed; four, eight
// or sixteen lanes a column of 128 rows measured the same on the H200, BENCHMARKS.md 2026-12-02
// sixth session). `tiled`: value head h reads key head h % hk (GGUF order), else h / (hv/hk). Block:
// 128 threads; the host's grid (ops.rs, `scan_columns`) follows GDN_SLICES.
//
// Tokens are staged GDN_STAGE at a time in shared memory (q and k normalised, the gates and
// the block's values), so the scan itself runs without block barriers: a prefill of thousands
// of tokens is a chain of short steps, not of barrier round trips. Each token's norm is one
// warp's sum in a fixed order, whatever the pass length: a token gets the same bits in a
// decode step, a verify block or a prefill.
#ifndef GDN_SLICES
#define GDN_SLICES (GDN_DK >= 32 ? 8 : 4)
#endif
#define GDN_COLS (128 / GDN_SLICES)
#define GDN_STAGE 16
// A scan block runs a whole pass, so all of a launch's blocks must be resident at once (a 27B
// layer's 384 blocks are three an SM): at most 168 registers a thread.
#define GDN_BOUNDS __launch_bounds__(128, 3)
static_assert(GDN_DK % (4 * GDN_SLICES) == 0, "the GDN key dim splits over GDN_SLICES lanes, 4 sums each");
static_assert(GDN_DV % 4 == 0, "the GDN scan loads values four at a time");
// Slice r's rows start at r·(R + 4) floats: 16-byte aligned runs for vector loads, and the
// slices' loads of one step fall in distinct banks.
#define GDN_ROW(i) ((i) + 4 * ((i) / (GDN_DK / GDN_SLICES)))
// static: its __shared__ arrays, sized by GDN_DK, must not be merged with another build's when
// the host emulation loads kernels of several dimensions into one process.
// The state is read from state_in and left in state (the same buffer but for a rollback replay,
// which passes no `out`).
static __device__ __forceinline__ void gdn_recurrent_block(int blk, const float* mixed, const float* g, const float* beta,
                                                    const float* state_in, float* state, float* out, int T, int hk,
                                                    int hv, int tiled, float* save_state = nullptr,
                                                    float* save_g = nullptr, float* save_beta = nullptr,
                                                    const float* dt_bias = nullptr, const float* neg_a = nullptr) {
    const int DK = GDN_DK, DV = GDN_DV, R = GDN_DK / GDN_SLICES, ROW = GDN_DK + 4 * GDN_SLICES;
    int groups = (DV + GDN_COLS - 1) / GDN_COLS;
    int h = blk / groups, r = threadIdx.x % GDN_SLICES;
    int c0 = (blk % groups) * GDN_COLS, col = threadIdx.x / GDN_SLICES, c = c0 + col;
    bool active = c < DV;
    int kh = tiled ? h % hk : h / (hv / hk);
    int C = 2 * hk * DK + hv * DV;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __shared__ __align__(16) float qs[GDN_STAGE][ROW];
    __shared__ __align__(16) float ks[GDN_STAGE][ROW];
    __shared__ __align__(16) float vs[GDN_STAGE][GDN_COLS];
    __shared__ float qinv[GDN_STAGE], kinv[GDN_STAGE], decay[GDN_STAGE], bt[GDN_STAGE];
    float s[R];
    const float* st_in = state_in + (long)h * DK * DV;
    float* st = state + (long)h * DK * DV;
#pragma unroll
    for (int j = 0; j < R; j++) s[j] = active ? st_in[(long)(r * R + j) * DV + c] : 0.0f;
    if (save_state && active) {
#pragma unroll
        for (int j = 0; j < R; j++) save_state[(long)h * DK * DV + (long)(r * R + j) * DV + c] = s[j];
    }
    float qscale = rsqrtf((float)DK);
    // A stage's inputs, a thread's share in registers: the next stage's loads are in flight
    // while this one is scanned (loaded at the stage's start, a prefill's scan waited on a
    // global load every 16 tokens, and on each token's gates in turn).
    // Four values a load: a token's q, k and block's values are contiguous runs of DK and
    // GDN_COLS (both multiples of 4, as C is).
    const int UQK = (GDN_STAGE * DK / 4 + 127) / 128, UV = (GDN_STAGE * GDN_COLS / 4 + 127) / 128;
    float4 pq[UQK], pk[UQK], pv[UV];
    float pg = 0.0f, pb = 0.0f;
    auto fetch = [&](int t0) {
        int n = min(GDN_STAGE, T - t0);
#pragma unroll
        for (int u = 0; u < UQK; u++) {
            int e = 4 * (threadIdx.x + 128 * u), tt = e / DK, i = e % DK;
            const float* row = mixed + (long)(t0 + tt) * C;
            if (tt < n) {
                pq[u] = *(const float4*)(row + kh * DK + i);
                pk[u] = *(const float4*)(row + hk * DK + kh * DK + i);
            }
        }
#pragma unroll
        for (int u = 0; u < UV; u++) {
            int e = 4 * (threadIdx.x + 128 * u), tt = e / GDN_COLS, cc = c0 + e % GDN_COLS;
            if (tt < n)
                pv[u] = cc < DV ? *(const float4*)(mixed + (long)(t0 + tt) * C + 2 * hk * DK + h * DV + cc)
                                : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        if ((int)threadIdx.x < n) {
            pg = g[(long)(t0 + threadIdx.x) * hv + h];
            pb = beta[(long)(t0 + threadIdx.x) * hv + h];
            if (neg_a) {  // raw a and b: gdn_gates' values
                pb = sigmoid(pb);
                pg = neg_a[h] * softplus(pg + dt_bias[h]);
            }
        }
    };
    fetch(0);
    for (int t0 = 0; t0 < T; t0 += GDN_STAGE) {
        int n = min(GDN_STAGE, T - t0);
        __syncthreads();  // the previous stage is consumed
#pragma unroll
        for (int u = 0; u < UQK; u++) {
            int e = 4 * (threadIdx.x + 128 * u), tt = e / DK, i = e % DK;
            if (tt < n) {
                *(float4*)&qs[tt][GDN_ROW(i)] = pq[u];
                *(float4*)&ks[tt][GDN_ROW(i)] = pk[u];
            }
        }
#pragma unroll
        for (int u = 0; u < UV; u++) {
            int e = 4 * (threadIdx.x + 128 * u), tt = e / GDN_COLS;
            if (tt < n) *(float4*)&vs[tt][e % GDN_COLS] = pv[u];
        }
        if ((int)threadIdx.x < n) {
            int tt = threadIdx.x;
            decay[tt] = expf(pg);
            bt[tt] = pb;
            // The head's first block of columns keeps its gates for a rollback.
            if (save_g && c0 == 0) {
                save_g[(long)(t0 + tt) * hv + h] = pg;
                save_beta[(long)(t0 + tt) * hv + h] = pb;
            }
        }
        __syncthreads();
        if (t0 + GDN_STAGE < T) fetch(t0 + GDN_STAGE);
        // Warp w: the norms of tokens w, w + 4, ...
        for (int tt = warp; tt < n; tt += blockDim.x >> 5) {
            float qss = 0.0f, kss = 0.0f;
            for (int i = lane; i < DK; i += 32) {
                float qv = qs[tt][GDN_ROW(i)], kv = ks[tt][GDN_ROW(i)];
                qss += qv * qv;
                kss += kv * kv;
            }
            qss = warp_sum(qss);
            kss = warp_sum(kss);
            if (lane == 0) {
                qinv[tt] = rsqrtf(qss + 1e-6f) * qscale;
                kinv[tt] = rsqrtf(kss + 1e-6f);
            }
        }
        __syncthreads();
        // q and k normalised in place, once a token for all the block's columns.
        for (int e = threadIdx.x; e < n * DK; e += blockDim.x) {
            int tt = e / DK, i = GDN_ROW(e % DK);
            qs[tt][i] *= qinv[tt];
            ks[tt][i] *= kinv[tt];
        }
        __syncthreads();
        for (int tt = 0; tt < n; tt++) {
            const float4* kr = (const float4*)&ks[tt][r * (R + 4)];
            const float4* qr = (const float4*)&qs[tt][r * (R + 4)];
            float dec = decay[tt];
            // Four interleaved partial sums: a step is a chain of R/4 dependent adds, not R.
            float kv4[R];
            float kp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int m = 0; m < R / 4; m++) {
                float4 kq = kr[m];
                kv4[4 * m] = kq.x, kv4[4 * m + 1] = kq.y, kv4[4 * m + 2] = kq.z, kv4[4 * m + 3] = kq.w;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    s[4 * m + e] *= dec;
                    kp[e] += s[4 * m + e] * kv4[4 * m + e];
                }
            }
            float kv = (kp[0] + kp[1]) + (kp[2] + kp[3]);
            // Sums over the column's slices (adjacent lanes): a butterfly, the same bits in
            // every lane.
#pragma unroll
            for (int o = 1; o < GDN_SLICES; o <<= 1) kv += __shfl_xor_sync(0xffffffffu, kv, o);
            float delta = (vs[tt][col] - kv) * bt[tt];
            float op[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int m = 0; m < R / 4; m++) {
                float4 qq = qr[m];
                float qv[4] = {qq.x, qq.y, qq.z, qq.w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    s[4 * m + e] += kv4[4 * m + e] * delta;
                    op[e] += s[4 * m + e] * qv[e];
                }
            }
            float o = (op[0] + op[1]) + (op[2] + op[3]);
#pragma unroll
            for (int d = 1; d < GDN_SLICES; d <<= 1) o += __shfl_xor_sync(0xffffffffu, o, d);
            if (out && active && r == 0) out[((long)(t0 + tt) * hv + h) * DV + c] = o;
        }
    }
    if (active) {
#pragma unroll
        for (int j = 0; j < R; j++) st[(long)(r * R + j) * DV + c] = s[j];
    }
}

extern "C" __global__ void GDN_BOUNDS gdn_recurrent(const float* mixed, const float* g, const float* beta, float* state,
                                         float* out, int T, int hk, int hv, int tiled) {
    GRID_PROLOGUE();
    gdn_recurrent_block(blockIdx.x, mixed, g, beta, state, state, out, T, hk, hv, tiled);
}

// gdn_recurrent over the sequences of a pass in one launch: hv · ceil(GDN_DV / GDN_COLS) blocks a
// sequence, each sequence's rows and recurrent state from `seqs`; a recorded sequence saves its
// recurrent state to save[0] and its gates g, beta to save[1], save[2]. With neg_a, g and beta
// are the raw a and b, made gates here as gdn_gates makes them (a launch fewer).
extern "C" __global__ void GDN_BOUNDS gdn_recurrent_seqs(const float* mixed, const float* g, const float* beta, SeqSlots seqs,
                                              float* out, int hk, int hv, int tiled, const float* dt_bias,
                                              const float* neg_a) {
    GRID_PROLOGUE();
    int per = hv * ((GDN_DV + GDN_COLS - 1) / GDN_COLS), i = blockIdx.x / per;
    long off = seqs.off[i];
    float* state = (float*)seqs.state[i];
    gdn_recurrent_block(blockIdx.x % per, mixed + off * (2 * hk * GDN_DK + hv * GDN_DV), g + off * hv,
                        beta + off * hv, state, state, out + off * hv * GDN_DV, seqs.n[i], hk, hv, tiled,
                        (float*)seqs.save[0][i], (float*)seqs.save[1][i], (float*)seqs.save[2][i], dt_bias, neg_a);
}

// The GDN layers of one sequence in a rollback after a recorded pass, by value in a kernel's
// parameters: layer i's state as saved before the pass (read), its live state (written), and
// three buffers per layer (see each kernel). One launch for all the layers of a model, where a
// launch per layer made the rollback of a 27B verify some 200 small kernels and copies.
#define LAYER_SLOTS 64
struct LayerSlots {
    u64 saved[LAYER_SLOTS], live[LAYER_SLOTS], buf[3][LAYER_SLOTS];
};

// The conv of a rollback: layer i from its saved state over its recorded input rows buf[0]
// [T, C] (conv weights buf[1]) into buf[2] [T, C], its live state left past them: the bits of
// the recorded pass's first T rows. T = 0 restores the saved state. `per` blocks a layer.
extern "C" __global__ void conv1d_silu_replay(LayerSlots layers, int per, int T, int C, int K) {
    GRID_PROLOGUE();
    int i = blockIdx.x / per;
    conv1d_silu_block(blockIdx.x % per, (const float*)layers.buf[0][i], (float*)layers.buf[2][i],
                      (const float*)layers.saved[i], (float*)layers.live[i], (const float*)layers.buf[1][i], T, C,
                      K);
}

// The scan of a rollback: layer i from its saved state over the conv outputs buf[0] [T, C]
// and its recorded gates g = buf[1], beta = buf[2] [T, hv], its live state left past them
// (the outputs themselves are not needed). hv · ceil(GDN_DV / GDN_COLS) blocks a layer.
extern "C" __global__ void GDN_BOUNDS gdn_recurrent_replay(LayerSlots layers, int T, int hk, int hv, int tiled) {
    GRID_PROLOGUE();
    int per = hv * ((GDN_DV + GDN_COLS - 1) / GDN_COLS), i = blockIdx.x / per;
    gdn_recurrent_block(blockIdx.x % per, (const float*)layers.buf[0][i], (const float*)layers.buf[1][i],
                        (const float*)layers.buf[2][i], (const float*)layers.saved[i], (float*)layers.live[i],
                        nullptr, T, hk, hv, tiled);
}
