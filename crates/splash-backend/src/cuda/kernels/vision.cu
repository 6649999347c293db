// The vision tower (Qwen3.5 / 3.6): LayerNorm with bias, bias plus GELU, the learned positions,
// the 2-D rotary split of q, k, v into f16 heads, and bidirectional flash attention over one
// image's patches on the tensor cores. The products are cuBLAS's (ops/vision.rs).

// out[r] = (x[r] − mean) / sqrt(var + eps) · w + b, one block per row (out may alias x); the
// variance of the centred values, as the CPU reference computes it.
extern "C" __global__ void layer_norm(const float* x, const float* w, const float* b, float* out, int d, float eps) {
    GRID_PROLOGUE();
    const float* xr = x + (long)blockIdx.x * d;
    float* o = out + (long)blockIdx.x * d;
    float s = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) s += xr[i];
    float mean = block_sum(s) / (float)d;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += (xr[i] - mean) * (xr[i] - mean);
    float inv = 1.0f / sqrtf(block_sum(ss) / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] = (xr[i] - mean) * inv * w[i] + b[i];
}

#define ACT_NONE 0
#define ACT_GELU_TANH 1
#define ACT_GELU_ERF 2

__device__ __forceinline__ float activate(float v, int act) {
    if (act == ACT_GELU_TANH) return 0.5f * v * (1.0f + tanhf(0.7978846f * (v + 0.044715f * v * v * v)));
    if (act == ACT_GELU_ERF) return 0.5f * v * (1.0f + erff(v * 0.70710678f));
    return v;
}

// A linear layer's bias and activation over `rows` rows of `cols`: y = act(y + b), or with
// `residual`, residual += act(y + b) (y unchanged). One block per row at a time.
extern "C" __global__ void bias_act(float* y, const float* b, float* residual, int rows, int cols, int act) {
    GRID_PROLOGUE();
    for (long r = blockIdx.x; r < rows; r += gridDim.x) {
        float* yr = y + r * cols;
        float* out = residual ? residual + r * cols : yr;
        if ((cols & 3) == 0) {
            for (int c = threadIdx.x; c < cols / 4; c += blockDim.x) {
                float4 v = ((const float4*)yr)[c], bb = ((const float4*)b)[c];
                float4 o = make_float4(activate(v.x + bb.x, act), activate(v.y + bb.y, act),
                                       activate(v.z + bb.z, act), activate(v.w + bb.w, act));
                if (residual) {
                    float4 a = ((float4*)out)[c];
                    o = make_float4(a.x + o.x, a.y + o.y, a.z + o.z, a.w + o.w);
                }
                ((float4*)out)[c] = o;
            }
        } else {
            for (int c = threadIdx.x; c < cols; c += blockDim.x) {
                float o = activate(yr[c] + b[c], act);
                out[c] = residual ? out[c] + o : o;
            }
        }
    }
}

// x[r] += Σ_j weights[4r + j] · table[taps[4r + j]]: the learned positions resampled
// bilinearly (the four taps and weights of each patch come from the host), one block per row.
extern "C" __global__ void add_position_taps(float* x, const float* table, const int* taps, const float* weights,
                                             int d) {
    GRID_PROLOGUE();
    int r = blockIdx.x;
    const int* t = taps + 4 * r;
    const float* wt = weights + 4 * r;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float p = table[(long)t[0] * d + i] * wt[0];
        p += table[(long)t[1] * d + i] * wt[1];
        p += table[(long)t[2] * d + i] * wt[2];
        p += table[(long)t[3] * d + i] * wt[3];
        x[(long)r * d + i] += p;
    }
}

// The rows of qkv `[n, 3, heads, hd]` as f16 heads `[heads, n, hdp]` (dims past hd zero): q and
// k turned by the 2-D rotary (rotate-half with cos, sin `[n, hd]`), q times `scale` (the
// attention's scale and log2 e: its softmax is in base 2). One block per row.
extern "C" __global__ void vision_qkv(const float* qkv, const float* cos_t, const float* sin_t, u16* q, u16* k,
                                      u16* v, int n, int heads, int hd, int hdp, float scale) {
    GRID_PROLOGUE();
    int r = blockIdx.x, half = hd / 2;
    const float *c = cos_t + (long)r * hd, *s = sin_t + (long)r * hd;
    for (int u = threadIdx.x; u < heads * hdp; u += blockDim.x) {
        int h = u / hdp, j = u % hdp;
        const float* src = qkv + (long)r * 3 * heads * hd + h * hd;
        long at = ((long)h * n + r) * hdp;
        if (j >= hd) {
            q[at + j] = k[at + j] = v[at + j] = 0;
            continue;
        }
        int o = j < half ? j + half : j - half;
        float sign = j < half ? -1.0f : 1.0f;
        const float *qs = src, *ks = src + heads * hd;
        q[at + j] = f32_to_f16((qs[j] * c[j] + sign * qs[o] * s[j]) * scale);
        k[at + j] = f32_to_f16(ks[j] * c[j] + sign * ks[o] * s[j]);
        v[at + j] = f32_to_f16(src[2 * heads * hd + j]);
    }
}

// Queries of one block of vision_attention.
#define VA_QUERIES 128

#ifndef KERNEL_EMULATION  // kernels_on_host.h defines them on the CPU
// 2^x by the special-function unit (relative error about 2⁻²²; 2^−∞ = 0).
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
#endif

// Keys and values j0 .. j0 + KEYS of one head into the tiles, in flight (cp.async, 16 bytes a
// copy); rows past n are zero (and masked).
template <int HDP, int KEYS>
static __device__ __forceinline__ void va_fetch(u16 (*kt)[HDP + 8], u16 (*vt)[HDP + 8], const u16* kh,
                                                const u16* vh, int j0, int n) {
    for (int u = threadIdx.x; u < KEYS * (HDP / 8); u += blockDim.x) {
        int jj = u / (HDP / 8), d = 8 * (u % (HDP / 8)), j = j0 + jj;
        long at = (long)min(j, n - 1) * HDP + d;
        cp_async16(&kt[jj][d], kh + at, j < n ? 16 : 0);
        cp_async16(&vt[jj][d], vh + at, j < n ? 16 : 0);
    }
}

// Attention of every patch to every patch of one image, flash style (see flash_prefill in
// attention.cu, whose fragment layouts this follows): block (tile, head) takes VA_QUERIES
// queries of one head, each of its VA_QUERIES / (16·QT) warps QT tiles of 16, and the warps
// share each tile of KEYS keys and values in shared memory (two tiles: the next one is copied
// while this one is used). S = Q·Kᵀ and O += P·V are mma.sync m16n8k16 with f32 accumulation,
// the softmax online and in base 2 (q carries log2 e). With QT = 2 each key and value fragment
// read from shared memory serves two query tiles: at head dim 80 one tile's reads take longer
// than its products. q, k, v are f16 `[heads, n, HDP]` (q scaled, padding zero); out is f32
// `[n, heads · hd]`.
template <int HDP, int QT>
static __device__ __forceinline__ void vision_attention_body(const u16* q, const u16* k, const u16* v, float* out,
                                                             int n, int heads, int hd) {
    // Two tiles of keys and values within 48 KB of static shared memory.
    constexpr int KEYS = HDP <= 80 ? 64 : 32;
    const int DK = HDP / 16, DN = HDP / 8, NK = KEYS / 8;
    __shared__ __align__(16) u16 kt[2][KEYS][HDP + 8];
    __shared__ __align__(16) u16 vt[2][KEYS][HDP + 8];
    int h = blockIdx.x % heads, t0 = (blockIdx.x / heads) * VA_QUERIES;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, qd = lane & 3;
    // Rows g and g + 8 of each of this warp's query tiles.
    int ta[QT], tb[QT];
#pragma unroll
    for (int r = 0; r < QT; r++) {
        ta[r] = t0 + 16 * (QT * warp + r) + g;
        tb[r] = ta[r] + 8;
    }
    const u16 *qh = q + (long)h * n * HDP, *kh = k + (long)h * n * HDP, *vh = v + (long)h * n * HDP;

    va_fetch<HDP, KEYS>(kt[0], vt[0], kh, vh, 0, n);
    cp_async_commit();
    u32 qf[QT][DK][4];
#pragma unroll
    for (int r = 0; r < QT; r++) {
        const u16* qa = qh + (long)min(ta[r], n - 1) * HDP;
        const u16* qb = qh + (long)min(tb[r], n - 1) * HDP;
#pragma unroll
        for (int s = 0; s < DK; s++) {
            int d = 16 * s + 2 * qd;
            qf[r][s][0] = *(const u32*)&qa[d];
            qf[r][s][1] = *(const u32*)&qb[d];
            qf[r][s][2] = *(const u32*)&qa[d + 8];
            qf[r][s][3] = *(const u32*)&qb[d + 8];
        }
    }
    float o[QT][DN][4];
    float ma[QT], mb[QT], sa[QT], sb[QT];
#pragma unroll
    for (int r = 0; r < QT; r++) {
#pragma unroll
        for (int i = 0; i < DN; i++) o[r][i][0] = o[r][i][1] = o[r][i][2] = o[r][i][3] = 0.0f;
        ma[r] = mb[r] = NEG_INF;
        sa[r] = sb[r] = 0.0f;
    }

    for (int j0 = 0, t = 0; j0 < n; j0 += KEYS, t ^= 1) {
        if (j0 + KEYS < n) {
            va_fetch<HDP, KEYS>(kt[t ^ 1], vt[t ^ 1], kh, vh, j0 + KEYS, n);
            cp_async_commit();
            cp_async_wait_one();
        } else {
            cp_async_wait_all();
        }
        __syncthreads();  // tile t is in for every thread

        float sc[QT][NK][4];
#pragma unroll
        for (int i = 0; i < NK; i++) {
#pragma unroll
            for (int r = 0; r < QT; r++) sc[r][i][0] = sc[r][i][1] = sc[r][i][2] = sc[r][i][3] = 0.0f;
#pragma unroll
            for (int s = 0; s + 1 < DK; s += 2) {
                u32 b[4];
                ldmatrix_x4<false>(b, &kt[t][8 * i + (lane & 7)][16 * s + 8 * (lane >> 3)]);
#pragma unroll
                for (int r = 0; r < QT; r++) {
                    mma_f16_16816(sc[r][i], qf[r][s][0], qf[r][s][1], qf[r][s][2], qf[r][s][3], b[0], b[1]);
                    mma_f16_16816(sc[r][i], qf[r][s + 1][0], qf[r][s + 1][1], qf[r][s + 1][2], qf[r][s + 1][3],
                                  b[2], b[3]);
                }
            }
            if (DK & 1) {
                const int s = DK - 1;
                u32 b0 = *(const u32*)&kt[t][8 * i + g][16 * s + 2 * qd];
                u32 b1 = *(const u32*)&kt[t][8 * i + g][16 * s + 8 + 2 * qd];
#pragma unroll
                for (int r = 0; r < QT; r++)
                    mma_f16_16816(sc[r][i], qf[r][s][0], qf[r][s][1], qf[r][s][2], qf[r][s][3], b0, b1);
            }
        }
        if (j0 + KEYS > n) {  // the last tile: keys past n do not count
#pragma unroll
            for (int i = 0; i < NK; i++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    if (j0 + 8 * i + 2 * qd + e >= n)
#pragma unroll
                        for (int r = 0; r < QT; r++) sc[r][i][e] = sc[r][i][2 + e] = NEG_INF;
        }
        float ca[QT], cb[QT];
#pragma unroll
        for (int r = 0; r < QT; r++) {
            float mxa = NEG_INF, mxb = NEG_INF;
#pragma unroll
            for (int i = 0; i < NK; i++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    mxa = fmaxf(mxa, sc[r][i][e]);
                    mxb = fmaxf(mxb, sc[r][i][2 + e]);
                }
            }
            mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, 1));
            mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, 2));
            mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, 1));
            mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, 2));
            // Every tile holds a key (j0 < n): the new max is finite.
            float na = fmaxf(ma[r], mxa), nb = fmaxf(mb[r], mxb);
            ca[r] = fast_exp2(ma[r] - na);
            cb[r] = fast_exp2(mb[r] - nb);
            ma[r] = na;
            mb[r] = nb;
            sa[r] *= ca[r];
            sb[r] *= cb[r];
#pragma unroll
            for (int i = 0; i < NK; i++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    sc[r][i][e] = fast_exp2(sc[r][i][e] - ma[r]);
                    sc[r][i][2 + e] = fast_exp2(sc[r][i][2 + e] - mb[r]);
                    sa[r] += sc[r][i][e];
                    sb[r] += sc[r][i][2 + e];
                }
            }
#pragma unroll
            for (int i = 0; i < DN; i++) {
                o[r][i][0] *= ca[r];
                o[r][i][1] *= ca[r];
                o[r][i][2] *= cb[r];
                o[r][i][3] *= cb[r];
            }
        }
#pragma unroll
        for (int kk = 0; kk < KEYS / 16; kk++) {
            u32 a[QT][4];
#pragma unroll
            for (int r = 0; r < QT; r++) {
                a[r][0] = pack_f16(sc[r][2 * kk][0], sc[r][2 * kk][1]);
                a[r][1] = pack_f16(sc[r][2 * kk][2], sc[r][2 * kk][3]);
                a[r][2] = pack_f16(sc[r][2 * kk + 1][0], sc[r][2 * kk + 1][1]);
                a[r][3] = pack_f16(sc[r][2 * kk + 1][2], sc[r][2 * kk + 1][3]);
            }
            const u16* vrow = &vt[t][16 * kk + 8 * ((lane >> 3) & 1) + (lane & 7)][8 * (lane >> 4)];
#pragma unroll
            for (int i = 0; i < DN; i += 2) {
                u32 b[4];
                ldmatrix_x4<true>(b, vrow + 8 * i);
#pragma unroll
                for (int r = 0; r < QT; r++) {
                    mma_f16_16816(o[r][i], a[r][0], a[r][1], a[r][2], a[r][3], b[0], b[1]);
                    mma_f16_16816(o[r][i + 1], a[r][0], a[r][1], a[r][2], a[r][3], b[2], b[3]);
                }
            }
        }
        __syncthreads();  // tile t is consumed before the next iteration copies over it
    }
    int d = heads * hd;
#pragma unroll
    for (int r = 0; r < QT; r++) {
        float fa = sa[r], fb = sb[r];
        fa += __shfl_xor_sync(0xffffffffu, fa, 1);
        fa += __shfl_xor_sync(0xffffffffu, fa, 2);
        fb += __shfl_xor_sync(0xffffffffu, fb, 1);
        fb += __shfl_xor_sync(0xffffffffu, fb, 2);
#pragma unroll
        for (int i = 0; i < DN; i++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int c = 8 * i + 2 * qd + e;
                if (c >= hd) continue;
                if (ta[r] < n) out[(long)ta[r] * d + h * hd + c] = o[r][i][e] / fa;
                if (tb[r] < n) out[(long)tb[r] * d + h * hd + c] = o[r][i][2 + e] / fb;
            }
        }
    }
}

// One kernel per padded head dim and query tiles a warp; grid ceil(n / VA_QUERIES) · heads
// blocks of 2·VA_QUERIES / QT threads.
#define VISION_ATTENTION(HDP, QT, NAME)                                                                 \
    extern "C" __global__ void NAME(const u16* q, const u16* k, const u16* v, float* out, int n, int heads, \
                                    int hd) {                                                           \
        GRID_PROLOGUE();                                                                                \
        vision_attention_body<HDP, QT>(q, k, v, out, n, heads, hd);                                     \
    }
VISION_ATTENTION(16, 1, vision_attention_16)
VISION_ATTENTION(32, 1, vision_attention_32)
VISION_ATTENTION(48, 1, vision_attention_48)
VISION_ATTENTION(64, 1, vision_attention_64)
VISION_ATTENTION(80, 1, vision_attention_80)
VISION_ATTENTION(96, 1, vision_attention_96)
VISION_ATTENTION(128, 1, vision_attention_128)
// Two query tiles a warp, where the registers allow it.
VISION_ATTENTION(16, 2, vision_attention_16x2)
VISION_ATTENTION(32, 2, vision_attention_32x2)
VISION_ATTENTION(48, 2, vision_attention_48x2)
VISION_ATTENTION(64, 2, vision_attention_64x2)
VISION_ATTENTION(80, 2, vision_attention_80x2)
