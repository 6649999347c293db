// Warp-per-row GEMVs (f32/f16/bf16 and quantised weights, and int8 activations with dp4a),
// and weights dequantised to bf16 / f32 rows for cuBLAS.

// The end of a warp-per-row GEMV (`gemv`, `gemv_q8`): each warp's sums `acc` over its lanes,
// then the `split` warps of row n added in warp order by the first, into y [T, rows1] for rows
// n < rows1 and y2 [T, N - rows1] for the others. Every thread of the block calls it.
template <int MAXT>
__device__ __forceinline__ void store_row_sums(const float* acc, int n, int N, int T, int split, int rows1, float* y, float* y2) {
    __shared__ float parts[4][MAXT];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, part = warp % split;
#pragma unroll
    for (int t = 0; t < MAXT; t++) {
        float v = warp_sum(acc[t]);
        if (lane == 0) parts[warp][t] = v;
    }
    __syncthreads();
    if (n >= N || part != 0 || lane != 0) return;
#pragma unroll
    for (int t = 0; t < MAXT; t++) {
        if (t < T) {
            float v = parts[warp][t];
            for (int p = 1; p < split; p++) v += parts[warp + p][t];
            if (n < rows1)
                y[(long)t * rows1 + n] = v;
            else
                y2[(long)t * (N - rows1) + n - rows1] = v;
        }
    }
}

// The row a warp of a warp-per-row GEMV (`gemv`, `gemv_floats`, `gemv_q8`) takes: the block's
// 4 warps cover 4 / split rows of group `bx`, `split` warps a row; part `part` of row `n` (live
// when n < N; `row` stays in bounds either way).
struct RowWarp {
    int lane, n, part;
    bool live;
    const u8* row;
};

__device__ __forceinline__ RowWarp row_warp(const u8* W, long row_bytes, int N, int split, int bx) {
    int warp = threadIdx.x >> 5, n = bx * (4 / split) + warp / split;
    return {(int)(threadIdx.x & 31), n, warp % split, n < N, W + (long)min(n, N - 1) * row_bytes};
}

// Values q·4 .. q·4 + 3 of a float row (f32, f16 or bf16; rows start 8-byte aligned).
template <int F>
__device__ __forceinline__ float4 load_quad(const u8* row, int q) {
    if (F == FMT_F32) return ((const float4*)row)[q];
    uint2 h = ((const uint2*)row)[q];
    u16 v[4] = {(u16)(h.x & 0xffff), (u16)(h.x >> 16), (u16)(h.y & 0xffff), (u16)(h.y >> 16)};
    if (F == FMT_F16) return make_float4(f16_to_f32(v[0]), f16_to_f32(v[1]), f16_to_f32(v[2]), f16_to_f32(v[3]));
    return make_float4(bf16_to_f32(v[0]), bf16_to_f32(v[1]), bf16_to_f32(v[2]), bf16_to_f32(v[3]));
}

// `gemv` for float rows (K a multiple of 4): a warp reads runs of 512 values, lane i the quads
// i, i + 32, i + 64, i + 96 of the run, so that each load instruction reads 32 consecutive
// quads of the row and of x (a lane reading a 32-value sub-block of its own touched 32 lines
// per instruction: the L1, not memory, bounded the MoE router at 15 µs for four tokens). Run
// r goes to part r % split; a lane sums its quads per run, then adds the run to its total,
// in an order set by K and split alone.
template <int F, int MAXT>
__device__ void gemv_floats(const u8* W, long row_bytes, const float* x, float* y, float* y2, int N, int K, int T,
                            int split, int rows1, int bx) {
    auto [lane, n, part, live, row] = row_warp(W, row_bytes, N, split, bx);
    float acc[MAXT];
#pragma unroll
    for (int t = 0; t < MAXT; t++) acc[t] = 0.0f;
    int quads = K / 4;
    for (int r = part; live && 128 * r < quads; r += split) {
        float4 w[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int q = 128 * r + lane + 32 * i;
            w[i] = q < quads ? load_quad<F>(row, q) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int t = 0; t < MAXT; t++) {
            if (t < T) {
                const float4* xs = (const float4*)(x + (long)t * K);
                float sum = 0.0f;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    int q = 128 * r + lane + 32 * i;
                    if (q < quads) {
                        float4 v = xs[q];
                        sum += w[i].x * v.x + w[i].y * v.y + w[i].z * v.z + w[i].w * v.w;
                    }
                }
                acc[t] += sum;
            }
        }
    }
    store_row_sums<MAXT>(acc, n, N, T, split, rows1, y, y2);
}

// y[t, n] = Σ_k W[n, k] x[t, k] for t < T ≤ MAXT, the f32 decode of every format (the exact
// reference, and the GEMV of formats no faster kernel reads); float rows go to `gemv_floats`. `split` warps (1, 2 or 4 of the
// block's 4) share a row, each taking every split-th run of 32 sub-blocks (lane i of part p:
// sub-blocks i + 32p, i + 32p + 32·split, ...), summed in warp order: a matrix of few rows (the
// MoE router) still fills the GPU. `bx` is the block's group of rows. Rows n < rows1 go to
// y [T, rows1], the others to y2 [T, N - rows1] (two products of one input stacked into one
// weight). The order of sums depends on the shape and split only, never on T.
template <int F, int MAXT>
__device__ void gemv(const u8* W, long row_bytes, Affine a, const float* x, float* y, float* y2, int N, int K,
                     int T, int split, int rows1, int bx) {
    if (F == FMT_F32 || F == FMT_F16 || F == FMT_BF16) {
        gemv_floats<F, MAXT>(W, row_bytes, x, y, y2, N, K, T, split, rows1, bx);
        return;
    }
    auto [lane, n, part, live, row] = row_warp(W, row_bytes, N, split, bx);
    float acc[MAXT];
#pragma unroll
    for (int t = 0; t < MAXT; t++) acc[t] = 0.0f;
#pragma unroll 2
    for (int s = lane + 32 * part; live && s < K / 32; s += 32 * split) {
        float w[32];
        deq32<F>(row, s, w, a, n, K);
#pragma unroll
        for (int t = 0; t < MAXT; t++) {
            if (t < T) {
                const float4* xs = (const float4*)(x + (long)t * K + 32 * s);
                float sum = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    float4 v = xs[i];
                    sum += w[4 * i] * v.x + w[4 * i + 1] * v.y + w[4 * i + 2] * v.z + w[4 * i + 3] * v.w;
                }
                acc[t] += sum;
            }
        }
    }
    store_row_sums<MAXT>(acc, n, N, T, split, rows1, y, y2);
}

// W as bf16 (or f32) [N, K] for the cuBLAS prefill GEMM: one thread per sub-block of 32
// values, 128 threads per block. A warp's 32 sub-blocks are consecutive in the output (sub-block
// i starts at value 32·i), so the warp stages them in shared memory and stores them as one
// contiguous run, 16 bytes per lane (32 scattered 2-byte stores per thread ran at a twentieth
// of the memory bandwidth).
template <int F, bool BF16>
__device__ void dequant_rows(const u8* W, long row_bytes, Affine a, void* out, int N, int K) {
    __shared__ __align__(16) float stage[4][32 * 32];
    long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long subs = (long)N * (K / 32);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    long first = idx - lane;
    if (first >= subs) return;  // the whole warp
    if (idx < subs) {
        int n = (int)(idx / (K / 32)), s = (int)(idx % (K / 32));
        float w[32];
        deq32<F>(W + (long)n * row_bytes, s, w, a, n, K);
        if (BF16) {
            u16* st = (u16*)stage[warp] + lane * 32;
#pragma unroll
            for (int i = 0; i < 32; i++) st[i] = f32_to_bf16(w[i]);
        } else {
            float* st = stage[warp] + lane * 32;
#pragma unroll
            for (int i = 0; i < 32; i++) st[i] = w[i];
        }
    }
    __syncwarp();
    const int sub_bytes = BF16 ? 64 : 128;
    long valid = subs - first < 32 ? subs - first : 32;
    int vectors = (int)(valid * sub_bytes / 16);
    const uint4* src = (const uint4*)stage[warp];
    uint4* dst = (uint4*)((u8*)out + first * sub_bytes);
    for (int v = lane; v < vectors; v += 32) dst[v] = src[v];
}

// gemv_*: up to GEMV_MAX_T tokens share each weight read; gemv1_*: one token a group of
// gridDim.x / T blocks, each group the launch a single token gets (see gemv1_q8_*).
#define WEIGHT_KERNELS(NAME, F)                                                                   \
    extern "C" __global__ void gemv_##NAME(const u8* W, long row_bytes, const float* scales,       \
                                           const float* biases, int group, const float* x,        \
                                           float* y, float* y2, int N, int K, int T, int split,   \
                                           int rows1) {                                           \
        GRID_PROLOGUE();                                                                          \
        Affine a = {scales, biases, group};                                                       \
        gemv<F, GEMV_MAX_T>(W, row_bytes, a, x, y, y2, N, K, T, split, rows1, blockIdx.x);        \
    }                                                                                             \
    extern "C" __global__ void gemv1_##NAME(const u8* W, long row_bytes, const float* scales,      \
                                            const float* biases, int group, const float* x,       \
                                            float* y, float* y2, int N, int K, int T, int split,  \
                                            int rows1) {                                          \
        GRID_PROLOGUE();                                                                          \
        Affine a = {scales, biases, group};                                                       \
        int per = gridDim.x / T, t = blockIdx.x / per;                                            \
        gemv<F, 1>(W, row_bytes, a, x + (long)t * K, y + (long)t * rows1, y2 + (long)t * (N - rows1), \
                   N, K, 1, split, rows1, blockIdx.x % per);                                      \
    }                                                                                             \
    extern "C" __global__ void dequant_bf16_##NAME(const u8* W, long row_bytes,                   \
                                                   const float* scales, const float* biases,      \
                                                   int group, void* out, int N, int K) {          \
        GRID_PROLOGUE();                                                                          \
        Affine a = {scales, biases, group};                                                       \
        dequant_rows<F, true>(W, row_bytes, a, out, N, K);                                        \
    }                                                                                             \
    extern "C" __global__ void dequant_f32_##NAME(const u8* W, long row_bytes,                    \
                                                  const float* scales, const float* biases,       \
                                                  int group, void* out, int N, int K) {           \
        GRID_PROLOGUE();                                                                          \
        Affine a = {scales, biases, group};                                                       \
        dequant_rows<F, false>(W, row_bytes, a, out, N, K);                                       \
    }

WEIGHT_KERNELS(f32, FMT_F32)
WEIGHT_KERNELS(f16, FMT_F16)
WEIGHT_KERNELS(bf16, FMT_BF16)
WEIGHT_KERNELS(q4_0, FMT_Q4_0)
WEIGHT_KERNELS(q4_1, FMT_Q4_1)
WEIGHT_KERNELS(q5_0, FMT_Q5_0)
WEIGHT_KERNELS(q5_1, FMT_Q5_1)
WEIGHT_KERNELS(q8_0, FMT_Q8_0)
WEIGHT_KERNELS(q2_k, FMT_Q2_K)
WEIGHT_KERNELS(q3_k, FMT_Q3_K)
WEIGHT_KERNELS(q4_k, FMT_Q4_K)
WEIGHT_KERNELS(q5_k, FMT_Q5_K)
WEIGHT_KERNELS(q6_k, FMT_Q6_K)
WEIGHT_KERNELS(iq4_nl, FMT_IQ4_NL)
WEIGHT_KERNELS(iq4_xs, FMT_IQ4_XS)
WEIGHT_KERNELS(affine4, FMT_AFFINE4)
WEIGHT_KERNELS(affine8, FMT_AFFINE8)

// ---------------------------------------------------------------------------------------------
// Integer GEMV for Q5_K and Q8_0 (Q4_K and Q6_K have the tensor-core GEMV further below): the
// activations quantised to int8 per 32 values (scale xd, exact sum xs), the weights' integer
// codes multiplied four at a time with dp4a. Far fewer instructions than decoding every weight
// to f32; the activation rounding is llama.cpp's (Q8_1). The f32 kernels above stay the exact
// reference (Gpu::set_exact).

// Block blk of 32 values, v the lane's, by one warp: xq[32·blk + lane], xd[blk], xs[blk].
__device__ __forceinline__ void quantize_q8_block(float v, i8* xq, float* xd, float* xs, long blk) {
    int lane = threadIdx.x & 31;
    float amax = warp_max(fabsf(v));
    float sum = warp_sum(v);
    float d = amax / 127.0f;
    xq[blk * 32 + lane] = (i8)(d > 0.0f ? roundf(v / d) : 0.0f);
    if (lane == 0) {
        xd[blk] = d;
        xs[blk] = sum;
    }
}

// One warp per 32 values of x [T, K]: xq [T, K] int8, xd and xs [T, K/32].
extern "C" __global__ void quantize_q8(const float* x, i8* xq, float* xd, float* xs, long blocks) {
    GRID_PROLOGUE_BRIDGE();
    long blk = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (blk >= blocks) return;
    quantize_q8_block(x[blk * 32 + (threadIdx.x & 31)], xq, xd, xs, blk);
}

// quantize_q8 of silu(g) · u (the values silu_mul writes): the int8 input of an MLP's down
// product, one warp per 32 values.
extern "C" __global__ void silu_mul_to_q8(const float* g, const float* u, i8* xq, float* xd, float* xs, long blocks) {
    GRID_PROLOGUE_BRIDGE();
    long blk = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (blk >= blocks) return;
    long i = blk * 32 + (threadIdx.x & 31);
    quantize_q8_block(silu(g[i]) * u[i], xq, xd, xs, blk);
}

// Σ over one sub-block of w · x, from its codes and one token's quantised activations.
template <int F>
__device__ __forceinline__ float dot_codes(const Codes& c, const int* xq, float xd, float xs) {
    if (F == FMT_Q6_K) {
        int isum[2] = {0, 0}, xsum[2] = {0, 0};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            isum[i >> 2] = __dp4a((int)c.v[i], xq[i], isum[i >> 2]);
            xsum[i >> 2] = __dp4a(0x01010101, xq[i], xsum[i >> 2]);
        }
        // The codes are stored biased by 32.
        return xd * (c.scale * (float)(isum[0] - 32 * xsum[0]) + c.scale2 * (float)(isum[1] - 32 * xsum[1]));
    }
    int isum = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) isum = __dp4a((int)c.v[i], xq[i], isum);
    if (F == FMT_Q8_0) return c.scale * xd * (float)isum;
    return c.scale * xd * (float)isum - c.minus * xs;
}

// MAXT: tokens per launch, a compile-time bound so that a one-token decode keeps few
// registers (occupancy hides the memory latency) while a verify block shares each decode.
// `split` warps (1, 2 or 4 of the block's 4) share a row, each taking every split-th run of 32
// sub-blocks, summed in warp order: a matrix of few rows (the GDN gate projections) still
// fills the GPU. `bx` is the block's group of rows. Rows n < rows1 go to y [T, rows1], the
// others to y2 [T, N - rows1] (two products of one input stacked into one weight).
template <int F, int MAXT>
__device__ void gemv_q8(const u8* W, long row_bytes, const i8* xq, const float* xd, const float* xs, float* y,
                        float* y2, int N, int K, int T, int split, int rows1, int bx) {
    auto [lane, n, part, live, row] = row_warp(W, row_bytes, N, split, bx);
    float acc[MAXT];
#pragma unroll
    for (int t = 0; t < MAXT; t++) acc[t] = 0.0f;
    int subs = K / 32;
#pragma unroll 2
    for (int s = lane + 32 * part; live && s < subs; s += 32 * split) {
        Codes c = load_codes<F>(row, s, K, n);
#pragma unroll
        for (int t = 0; t < MAXT; t++) {
            if (t < T) {
                const uint4* xp = (const uint4*)(xq + (long)t * K + 32 * s);
                uint4 a0 = xp[0], a1 = xp[1];
                int xw[8] = {(int)a0.x, (int)a0.y, (int)a0.z, (int)a0.w, (int)a1.x, (int)a1.y, (int)a1.z, (int)a1.w};
                acc[t] += dot_codes<F>(c, xw, xd[(long)t * subs + s], xs[(long)t * subs + s]);
            }
        }
    }
    store_row_sums<MAXT>(acc, n, N, T, split, rows1, y, y2);
}

// gemv1_q8_*: one token a group of gridDim.x / T blocks, each group the launch a single token
// gets: for matrices of few rows (0.25 MB for the GDN gate projections, re-read from L2 per
// token), where a 16-token gemv_q8 walked its tokens in 48 blocks and cost 5.5× one token.
#define Q8_KERNEL(NAME, F)                                                                        \
    extern "C" __global__ void gemv_q8_##NAME(const u8* W, long row_bytes, const i8* xq,          \
                                              const float* xd, const float* xs, float* y,         \
                                              float* y2, int N, int K, int T, int split,          \
                                              int rows1) {                                        \
        GRID_PROLOGUE();                                                                          \
        gemv_q8<F, GEMV_MAX_T>(W, row_bytes, xq, xd, xs, y, y2, N, K, T, split, rows1, blockIdx.x); \
    }                                                                                             \
    extern "C" __global__ void gemv1_q8_##NAME(const u8* W, long row_bytes, const i8* xq,         \
                                               const float* xd, const float* xs, float* y,        \
                                               float* y2, int N, int K, int T, int split,         \
                                               int rows1) {                                       \
        GRID_PROLOGUE();                                                                          \
        int per = gridDim.x / T, t = blockIdx.x / per;                                            \
        long subs = (long)t * (K / 32);                                                           \
        gemv_q8<F, 1>(W, row_bytes, xq + (long)t * K, xd + subs, xs + subs, y + (long)t * rows1,  \
                      y2 + (long)t * (N - rows1), N, K, 1, split, rows1, blockIdx.x % per);       \
    }

Q8_KERNEL(q5_k, FMT_Q5_K)
Q8_KERNEL(q8_0, FMT_Q8_0)
