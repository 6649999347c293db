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

#define VA_WARPS 8

#ifndef KERNEL_EMULATION  // kernels_on_host.h defines them on the CPU
// Closes this thread's group of cp.async copies; waits until all but the latest group landed.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_one() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
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
// attention.cu, whose fragment layouts this follows): block (tile, head) takes VA_WARPS·16
// queries of one head, its warps share each tile of KEYS keys and values in shared memory (two
// tiles: the next one is copied while this one is used), S = Q·Kᵀ and O += P·V are mma.sync
// m16n8k16 with f32 accumulation, the softmax online and in base 2 (q carries log2 e). q, k, v
// are f16 `[heads, n, HDP]` (q scaled, padding zero); out is f32 `[n, heads · hd]`.
template <int HDP>
static __device__ __forceinline__ void vision_attention_body(const u16* q, const u16* k, const u16* v, float* out,
                                                             int n, int heads, int hd) {
    // Two tiles of keys and values within 48 KB of static shared memory.
    constexpr int KEYS = HDP <= 80 ? 64 : 32;
    const int DK = HDP / 16, DN = HDP / 8, NK = KEYS / 8;
    __shared__ __align__(16) u16 kt[2][KEYS][HDP + 8];
    __shared__ __align__(16) u16 vt[2][KEYS][HDP + 8];
    int h = blockIdx.x % heads, t0 = (blockIdx.x / heads) * 16 * VA_WARPS;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, qd = lane & 3;
    int ta = t0 + 16 * warp + g, tb = ta + 8;
    const u16 *qh = q + (long)h * n * HDP, *kh = k + (long)h * n * HDP, *vh = v + (long)h * n * HDP;

    va_fetch<HDP, KEYS>(kt[0], vt[0], kh, vh, 0, n);
    cp_async_commit();
    u32 qf[DK][4];
    {
        const u16* qa = qh + (long)min(ta, n - 1) * HDP;
        const u16* qb = qh + (long)min(tb, n - 1) * HDP;
#pragma unroll
        for (int s = 0; s < DK; s++) {
            int d = 16 * s + 2 * qd;
            qf[s][0] = *(const u32*)&qa[d];
            qf[s][1] = *(const u32*)&qb[d];
            qf[s][2] = *(const u32*)&qa[d + 8];
            qf[s][3] = *(const u32*)&qb[d + 8];
        }
    }
    float o[DN][4];
#pragma unroll
    for (int i = 0; i < DN; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float ma = NEG_INF, mb = NEG_INF, sa = 0.0f, sb = 0.0f;

    for (int j0 = 0, t = 0; j0 < n; j0 += KEYS, t ^= 1) {
        if (j0 + KEYS < n) {
            va_fetch<HDP, KEYS>(kt[t ^ 1], vt[t ^ 1], kh, vh, j0 + KEYS, n);
            cp_async_commit();
            cp_async_wait_one();
        } else {
            cp_async_wait_all();
        }
        __syncthreads();  // tile t is in for every thread

        float sc[NK][4];
#pragma unroll
        for (int i = 0; i < NK; i++) {
            sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.0f;
#pragma unroll
            for (int s = 0; s + 1 < DK; s += 2) {
                u32 b[4];
                ldmatrix_x4<false>(b, &kt[t][8 * i + (lane & 7)][16 * s + 8 * (lane >> 3)]);
                mma_f16_16816(sc[i], qf[s][0], qf[s][1], qf[s][2], qf[s][3], b[0], b[1]);
                mma_f16_16816(sc[i], qf[s + 1][0], qf[s + 1][1], qf[s + 1][2], qf[s + 1][3], b[2], b[3]);
            }
            if (DK & 1) {
                const int s = DK - 1;
                u32 b0 = *(const u32*)&kt[t][8 * i + g][16 * s + 2 * qd];
                u32 b1 = *(const u32*)&kt[t][8 * i + g][16 * s + 8 + 2 * qd];
                mma_f16_16816(sc[i], qf[s][0], qf[s][1], qf[s][2], qf[s][3], b0, b1);
            }
        }
        if (j0 + KEYS > n) {  // the last tile: keys past n do not count
#pragma unroll
            for (int i = 0; i < NK; i++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    if (j0 + 8 * i + 2 * qd + e >= n) sc[i][e] = sc[i][2 + e] = NEG_INF;
        }
        float mxa = NEG_INF, mxb = NEG_INF;
#pragma unroll
        for (int i = 0; i < NK; i++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                mxa = fmaxf(mxa, sc[i][e]);
                mxb = fmaxf(mxb, sc[i][2 + e]);
            }
        }
        mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, 1));
        mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, 2));
        mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, 1));
        mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, 2));
        // Every tile holds a key (j0 < n): the new max is finite.
        float na = fmaxf(ma, mxa), nb = fmaxf(mb, mxb);
        float ca = fast_exp2(ma - na), cb = fast_exp2(mb - nb);
        ma = na;
        mb = nb;
        sa *= ca;
        sb *= cb;
#pragma unroll
        for (int i = 0; i < NK; i++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                sc[i][e] = fast_exp2(sc[i][e] - ma);
                sc[i][2 + e] = fast_exp2(sc[i][2 + e] - mb);
                sa += sc[i][e];
                sb += sc[i][2 + e];
            }
        }
#pragma unroll
        for (int i = 0; i < DN; i++) {
            o[i][0] *= ca;
            o[i][1] *= ca;
            o[i][2] *= cb;
            o[i][3] *= cb;
        }
#pragma unroll
        for (int kk = 0; kk < KEYS / 16; kk++) {
            u32 a0 = pack_f16(sc[2 * kk][0], sc[2 * kk][1]), a1 = pack_f16(sc[2 * kk][2], sc[2 * kk][3]);
            u32 a2 = pack_f16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
            u32 a3 = pack_f16(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
            const u16* vrow = &vt[t][16 * kk + 8 * ((lane >> 3) & 1) + (lane & 7)][8 * (lane >> 4)];
#pragma unroll
            for (int i = 0; i < DN; i += 2) {
                u32 b[4];
                ldmatrix_x4<true>(b, vrow + 8 * i);
                mma_f16_16816(o[i], a0, a1, a2, a3, b[0], b[1]);
                mma_f16_16816(o[i + 1], a0, a1, a2, a3, b[2], b[3]);
            }
        }
        __syncthreads();  // tile t is consumed before the next iteration copies over it
    }
    sa += __shfl_xor_sync(0xffffffffu, sa, 1);
    sa += __shfl_xor_sync(0xffffffffu, sa, 2);
    sb += __shfl_xor_sync(0xffffffffu, sb, 1);
    sb += __shfl_xor_sync(0xffffffffu, sb, 2);
    int d = heads * hd;
#pragma unroll
    for (int i = 0; i < DN; i++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
            int c = 8 * i + 2 * qd + e;
            if (c >= hd) continue;
            if (ta < n) out[(long)ta * d + h * hd + c] = o[i][e] / sa;
            if (tb < n) out[(long)tb * d + h * hd + c] = o[i][2 + e] / sb;
        }
    }
}

// One kernel per padded head dim; grid ceil(n / (16·VA_WARPS)) · heads blocks of 32·VA_WARPS.
#define VISION_ATTENTION(HDP)                                                                             \
    extern "C" __global__ void vision_attention_##HDP(const u16* q, const u16* k, const u16* v, float* out, \
                                                      int n, int heads, int hd) {                          \
        GRID_PROLOGUE();                                                                                  \
        vision_attention_body<HDP>(q, k, v, out, n, heads, hd);                                           \
    }
VISION_ATTENTION(16)
VISION_ATTENTION(32)
VISION_ATTENTION(48)
VISION_ATTENTION(64)
VISION_ATTENTION(80)
VISION_ATTENTION(96)
VISION_ATTENTION(128)
