// Chunked GDN prefill (model-spec 2.4, "chunked prefill"; HF torch_chunk_gated_delta_rule): a
// prefill's scan as matrix products over chunks of GDN_CHUNK tokens. gdn_chunk_prep does what
// needs no state, every (chunk, value head) at once: the keys' Gram matrix A, the solve
// (I + A)[U | W] = [βv | βk e^Γ] and the decayed q kᵀ products P. gdn_chunk_scan then walks the
// chunks of each head in order on tensor cores: Vn = U − W S, O = (q e^Γ) S + P Vn and
// S = e^{Γ_L} S + (k e^{Γ_L−Γ})ᵀ Vn. The per-token scan does as many multiply-adds a token
// (≈ 4·dk·dv) on the CUDA cores, so only a tensor-core form can pay; this one does not yet
// (opt-in, SPLASH_GDN_CHUNKED=1): on the H200 a 27B 2,048-token layer took 984 µs in the scan
// (30 µs a chunk, latency-bound: one block per 32 columns of a head, its k steps' loads from
// L2) and 412 µs in the prep, where the per-token scan takes about 900 µs. Decode rows and
// verify blocks always take the per-token scan, so a verified token gets its decode bits.

#define GDN_CHUNK 64
// Floats of one (chunk, value head) in the prepared scratch: U [C, DV], W [C, DK], P [C, C],
// fq [C] (q's factor: 1/‖q‖ · dk^-½ · e^Γ), fk [C] (k's: 1/‖k‖ · e^{Γ_L−Γ}), then e^{Γ_L}.
#define GDN_CHUNK_SCRATCH (GDN_CHUNK * (GDN_DV + GDN_DK + GDN_CHUNK + 2) + 4)
// State columns a gdn_chunk_scan block advances (ops.rs `chunk_scan_blocks` follows).
#define GDN_CHUNK_COLS (GDN_DV < 32 ? GDN_DV : 32)
// The shapes the chunked kernels take (others build without them; ops.rs `gdn_chunked` says
// so): state rows in 16-row mma tiles, columns in 8-column ones, a column of [U | W] a thread.
#define GDN_CHUNKED_FITS \
    (GDN_DK % 16 == 0 && GDN_DV % 8 == 0 && GDN_DV % GDN_CHUNK_COLS == 0 && GDN_DK + GDN_DV <= 256)

#ifndef KERNEL_EMULATION  // tests/host_cuda/cuda_host.h defines these on the CPU
// f32 → tf32 (round to nearest, ties away), as a b32 register.
__device__ __forceinline__ u32 f32_to_tf32(float x) {
    u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ void mma_tf32_1688(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
#endif

// An f32 as the sum of two tf32s: products of the three leading pairs keep about f32's
// precision (tf32 alone keeps 10 bits of mantissa, too coarse next to the CPU's f32 scan).
struct Tf32x2 {
    u32 hi, lo;
};

__device__ __forceinline__ Tf32x2 tf32_split(float x) {
    u32 hi = f32_to_tf32(x);
    return {hi, f32_to_tf32(x - __uint_as_float(hi))};
}

// c += A B for an m16n8k8 tile in split tf32 (fragments as mma.sync m16n8k8 .tf32, lane = 4g + q:
// a0 = A[g][q], a1 = A[g+8][q], a2 = A[g][q+4], a3 = A[g+8][q+4]; b0 = B[q][g], b1 = B[q+4][g];
// c0, c1 = C[g][2q, 2q+1], c2, c3 = C[g+8][2q, 2q+1]). The small terms first.
__device__ __forceinline__ void mma_tf32x3(float* c, const Tf32x2 (&a)[4], const Tf32x2 (&b)[2]) {
    mma_tf32_1688(c, a[0].lo, a[1].lo, a[2].lo, a[3].lo, b[0].hi, b[1].hi);
    mma_tf32_1688(c, a[0].hi, a[1].hi, a[2].hi, a[3].hi, b[0].lo, b[1].lo);
    mma_tf32_1688(c, a[0].hi, a[1].hi, a[2].hi, a[3].hi, b[0].hi, b[1].hi);
}

#if GDN_CHUNKED_FITS
// What the scan of one (chunk, value head) needs beside the state: block chunk · hv + h, 256
// threads, of T tokens of `mixed` [T, 2·hk·DK + hv·DV] (q, k, v after the conv) and the gates
// g, beta [T, hv]; into scratch + block · GDN_CHUNK_SCRATCH. Rows past the pass are zeros.
extern "C" __global__ void __launch_bounds__(256)
    gdn_chunk_prep(const float* mixed, const float* g, const float* beta, float* scratch, int T, int hk, int hv,
                   int tiled) {
    GRID_PROLOGUE();
    const int DK = GDN_DK, DV = GDN_DV, C = GDN_CHUNK;
    int h = blockIdx.x % hv, t0 = (blockIdx.x / hv) * C, L = min(C, T - t0);
    int kh = tiled ? h % hk : h / (hv / hk);
    long width = 2 * hk * DK + hv * DV;
    const float* qrow = mixed + t0 * width + kh * DK;  // token i's q at qrow + i·width
    const float* krow = qrow + hk * DK;
    const float* vrow = mixed + t0 * width + 2 * hk * DK + h * DV;
    float* U = scratch + (long)blockIdx.x * GDN_CHUNK_SCRATCH;
    float *Wm = U + C * DV, *P = Wm + C * DK, *fq = P + C * C, *fk = fq + C;
    __shared__ float qs[C][33], ks[C][33];  // 32 key dims of the chunk's q and k at a time
    __shared__ float as[C][C + 1];
    __shared__ float qinv[C], kinv[C], gam[C], bet[C];
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    for (int i = warp; i < C; i += 8) {
        float qss = 0.0f, kss = 0.0f;
        if (i < L)
            for (int d = lane; d < DK; d += 32) {
                float a = qrow[i * width + d], b = krow[i * width + d];
                qss += a * a;
                kss += b * b;
            }
        qss = warp_sum(qss);
        kss = warp_sum(kss);
        if (lane == 0) {
            qinv[i] = i < L ? rsqrtf(qss + 1e-6f) * rsqrtf((float)DK) : 0.0f;
            kinv[i] = i < L ? rsqrtf(kss + 1e-6f) : 0.0f;
        }
    }
    if (tid == 0) {
        // Γ: the cumulative log decay inside the chunk (constant past its last token).
        float acc = 0.0f;
        for (int i = 0; i < C; i++) {
            if (i < L) acc += g[(long)(t0 + i) * hv + h];
            gam[i] = acc;
            bet[i] = i < L ? beta[(long)(t0 + i) * hv + h] : 0.0f;
        }
    }
    // The raw products q_i·k_j and k_i·k_j: thread (ti, tj) takes rows 4ti + a, columns tj + 16b.
    int ti = tid >> 4, tj = tid & 15;
    float gq[4][4], gk[4][4];
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) gq[a][b] = gk[a][b] = 0.0f;
    for (int d0 = 0; d0 < DK; d0 += 32) {
        int w = min(32, DK - d0);
        __syncthreads();  // the previous slice is consumed
        for (int e = tid; e < C * 32; e += 256) {
            int i = e >> 5, d = e & 31;
            bool in = i < L && d < w;
            qs[i][d] = in ? qrow[i * width + d0 + d] : 0.0f;
            ks[i][d] = in ? krow[i * width + d0 + d] : 0.0f;
        }
        __syncthreads();
        for (int d = 0; d < w; d++) {
            float kj[4], ki[4], qi[4];
#pragma unroll
            for (int b = 0; b < 4; b++) kj[b] = ks[tj + 16 * b][d];
#pragma unroll
            for (int a = 0; a < 4; a++) {
                ki[a] = ks[4 * ti + a][d];
                qi[a] = qs[4 * ti + a][d];
            }
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    gk[a][b] += ki[a] * kj[b];
                    gq[a][b] += qi[a] * kj[b];
                }
        }
    }
    // A = strictly lower (βk kᵀ ⊙ D) into shared memory; P = lower (q kᵀ ⊙ D) to the scratch
    // (D[i][j] = e^{Γi−Γj}, never evaluated above the diagonal, where it can overflow).
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) {
            int i = 4 * ti + a, j = tj + 16 * b;
            float dec = j <= i ? expf(gam[i] - gam[j]) : 0.0f;
            as[i][j] = j < i ? bet[i] * kinv[i] * kinv[j] * gk[a][b] * dec : 0.0f;
            P[i * C + j] = qinv[i] * kinv[j] * gq[a][b] * dec;
        }
    __syncthreads();
    // (I + A) [U | W] = [βv | βk e^Γ] by forward substitution, a column a thread in registers
    // (one column each: in a loop over columns the compiler hoists A's 2,016 loads out of it).
    if (int col = tid; col < DV + DK) {
        float x[C];
#pragma unroll
        for (int i = 0; i < C; i++) {
            float in = 0.0f;
            if (i < L) in = col < DV ? vrow[i * width + col] : krow[i * width + col - DV] * kinv[i] * expf(gam[i]);
            x[i] = bet[i] * in;
        }
#pragma unroll
        for (int i = 1; i < C; i++) {
            float acc = x[i];
#pragma unroll
            for (int j = 0; j < i; j++) acc -= as[i][j] * x[j];
            x[i] = acc;
        }
#pragma unroll
        for (int i = 0; i < C; i++) {
            if (col < DV)
                U[i * DV + col] = x[i];
            else
                Wm[i * DK + col - DV] = x[i];
        }
    }
    if (tid < C) {
        fq[tid] = qinv[tid] * expf(gam[tid]);
        fk[tid] = kinv[tid] * expf(gam[L - 1] - gam[tid]);
        if (tid == 0) fk[C] = expf(gam[L - 1]);
    }
}

// acc += A B over k < k_end for one 16-row tile in split tf32, lane (g, q): a(i, k) is the tile's
// row i at k, B [K][8·NT] in shared memory (rows padded by 8). Unrolled, so that every k step's
// loads are in flight at once.
template <int K, int NT, class Rows>
__device__ __forceinline__ void mma_tile_tf32x3(float (&acc)[NT][4], Rows a, const float (*B)[8 * NT + 8],
                                                int k_end, int g, int q) {
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 8) {
        if (k0 >= k_end) break;
        Tf32x2 af[4] = {tf32_split(a(g, k0 + q)), tf32_split(a(g + 8, k0 + q)), tf32_split(a(g, k0 + q + 4)),
                        tf32_split(a(g + 8, k0 + q + 4))};
#pragma unroll
        for (int n = 0; n < NT; n++) {
            Tf32x2 b[2] = {tf32_split(B[k0 + q][8 * n + g]), tf32_split(B[k0 + q + 4][8 * n + g])};
            mma_tf32x3(acc[n], af, b);
        }
    }
}

// The chunks of T tokens in order, on the prepared scratch (gdn_chunk_prep): block
// h · (DV / GDN_CHUNK_COLS) + group advances columns group · GDN_CHUNK_COLS.. of value head h's
// state [DK, DV] (in shared memory) and writes those columns of out [T, hv, DV]. 256 threads:
// warps 0-3 take W S, warps 4-7 (q e^Γ) S; then warps 4-7 add P Vn to their outputs while
// warps 0-3 advance the state.
extern "C" __global__ void __launch_bounds__(256)
    gdn_chunk_scan(const float* mixed, const float* scratch, float* state, float* out, int T, int hk, int hv,
                   int tiled) {
    GRID_PROLOGUE();
    const int DK = GDN_DK, DV = GDN_DV, C = GDN_CHUNK, SC = GDN_CHUNK_COLS, NT = GDN_CHUNK_COLS / 8;
    int groups = DV / SC, h = blockIdx.x / groups, c0 = (blockIdx.x % groups) * SC;
    int kh = tiled ? h % hk : h / (hv / hk);
    long width = 2 * hk * DK + hv * DV;
    // Rows padded by 8 floats: a fragment's lanes (4 rows × 8 columns) fall in distinct banks.
    __shared__ float S[DK][SC + 8];
    __shared__ float vn[C][SC + 8];
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    float* st = state + (long)h * DK * DV + c0;
    for (int e = tid; e < DK * SC; e += 256) S[e / SC][e % SC] = st[(long)(e / SC) * DV + e % SC];
    for (int t0 = 0; t0 < T; t0 += C) {
        int L = min(C, T - t0);
        const float* U = scratch + (long)((t0 / C) * hv + h) * GDN_CHUNK_SCRATCH;
        const float *Wm = U + C * DV, *P = Wm + C * DK, *fq = P + C * C, *fk = fq + C;
        const float* qrow = mixed + t0 * width + kh * DK;
        const float* krow = qrow + hk * DK;
        __syncthreads();  // the previous chunk's state is written
        float acc[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
        {
            // Rows r0.. of W (warps 0-3) or of q e^Γ (warps 4-7) times S.
            int r0 = 16 * (warp & 3);
            bool isq = warp >= 4;
            float f0 = isq && r0 + g < L ? fq[r0 + g] : 0.0f, f8 = isq && r0 + g + 8 < L ? fq[r0 + g + 8] : 0.0f;
            auto rows = [&](int i, int k) {
                float f = i < 8 ? f0 : f8;
                return isq ? (f != 0.0f ? qrow[(r0 + i) * width + k] * f : 0.0f) : Wm[(r0 + i) * DK + k];
            };
            mma_tile_tf32x3<DK>(acc, rows, S, DK, g, q);
        }
        if (warp < 4) {
            // Vn = U − W S.
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int row = 16 * warp + g + 8 * (e >> 1), col = 8 * n + 2 * q + (e & 1);
                    vn[row][col] = U[row * DV + c0 + col] - acc[n][e];
                }
        }
        __syncthreads();  // Vn is complete; every read of S is done
        if (warp >= 4) {
            // O = (q e^Γ) S + P Vn; P is zero past the diagonal, so k stops at the tile's last row.
            int r0 = 16 * (warp - 4);
            mma_tile_tf32x3<C>(acc, [&](int i, int k) { return P[(r0 + i) * C + k]; }, vn, r0 + 16, g, q);
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int row = r0 + g + 8 * (e >> 1), col = 8 * n + 2 * q + (e & 1);
                    if (row < L) out[((long)(t0 + row) * hv + h) * DV + c0 + col] = acc[n][e];
                }
        } else {
            // S = e^{Γ_L} S + (k e^{Γ_L−Γ})ᵀ Vn, 16 state rows at a time.
            float gl = fk[C];
            for (int mt = warp; mt < DK / 16; mt += 4) {
                int m = 16 * mt + g;
                float s4[NT][4];
#pragma unroll
                for (int n = 0; n < NT; n++) s4[n][0] = s4[n][1] = s4[n][2] = s4[n][3] = 0.0f;
                // Row i of the tile, token j: (k e^{Γ_L−Γ})[j][16·mt + i].
                auto rows = [&](int i, int j) { return j < L ? krow[j * width + 16 * mt + i] * fk[j] : 0.0f; };
                mma_tile_tf32x3<C>(s4, rows, vn, C, g, q);
#pragma unroll
                for (int n = 0; n < NT; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int row = m + 8 * (e >> 1), col = 8 * n + 2 * q + (e & 1);
                        S[row][col] = gl * S[row][col] + s4[n][e];
                    }
            }
        }
    }
    __syncthreads();
    for (int e = tid; e < DK * SC; e += 256) st[(long)(e / SC) * DV + e % SC] = S[e / SC][e % SC];
}
#endif  // GDN_CHUNKED_FITS
