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

// x[i] = act(x[i] + b[i % cols]) over n values: a linear layer's bias and activation.
extern "C" __global__ void bias_act(float* x, const float* b, int cols, long n, int act) {
    GRID_PROLOGUE();
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        float v = x[i] + b[i % cols];
        if (act == ACT_GELU_TANH)
            v = 0.5f * v * (1.0f + tanhf(0.7978846f * (v + 0.044715f * v * v * v)));
        else if (act == ACT_GELU_ERF)
            v = 0.5f * v * (1.0f + erff(v * 0.70710678f));
        x[i] = v;
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
// k turned by the 2-D rotary (rotate-half with cos, sin `[n, hd]`), q times `scale`. One block
// per (row, head).
extern "C" __global__ void vision_qkv(const float* qkv, const float* cos_t, const float* sin_t, u16* q, u16* k,
                                      u16* v, int n, int heads, int hd, int hdp, float scale) {
    GRID_PROLOGUE();
    int r = blockIdx.x / heads, h = blockIdx.x % heads, half = hd / 2;
    const float* src = qkv + (long)r * 3 * heads * hd + h * hd;
    const float *c = cos_t + (long)r * hd, *s = sin_t + (long)r * hd;
    long at = ((long)h * n + r) * hdp;
    for (int j = threadIdx.x; j < hdp; j += blockDim.x) {
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

#define VA_WARPS 4
#define VA_KEYS 32

// Attention of every patch to every patch of one image, flash style (see flash_prefill in
// attention.cu, whose fragment layouts this follows): block (tile, head) takes VA_WARPS·16
// queries of one head, its warps share each tile of VA_KEYS keys and values in shared memory,
// S = Q·Kᵀ and O += P·V are mma.sync m16n8k16 with f32 accumulation, the softmax online. q, k,
// v are f16 `[heads, n, HDP]` (q scaled, padding zero); out is f32 `[n, heads · hd]`.
template <int HDP>
static __device__ __forceinline__ void vision_attention_body(const u16* q, const u16* k, const u16* v, float* out,
                                                             int n, int heads, int hd) {
    const int DK = HDP / 16, DN = HDP / 8, NK = VA_KEYS / 8;
    __shared__ __align__(16) u16 kt[VA_KEYS][HDP + 8];
    __shared__ __align__(16) u16 vt[VA_KEYS][HDP + 8];
    int h = blockIdx.x % heads, t0 = (blockIdx.x / heads) * 16 * VA_WARPS;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, qd = lane & 3;
    int ta = t0 + 16 * warp + g, tb = ta + 8;
    const u16 *qh = q + (long)h * n * HDP, *kh = k + (long)h * n * HDP, *vh = v + (long)h * n * HDP;

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

    for (int j0 = 0; j0 < n; j0 += VA_KEYS) {
        __syncthreads();  // the previous tile is consumed
        // 16 bytes (8 halves) a thread and step; keys past n are zero (and masked).
        for (int u = threadIdx.x; u < VA_KEYS * (HDP / 8); u += blockDim.x) {
            int jj = u / (HDP / 8), d = 8 * (u % (HDP / 8)), j = j0 + jj;
            uint4 kw = make_uint4(0, 0, 0, 0), vw = make_uint4(0, 0, 0, 0);
            if (j < n) {
                kw = *(const uint4*)&kh[(long)j * HDP + d];
                vw = *(const uint4*)&vh[(long)j * HDP + d];
            }
            *(uint4*)&kt[jj][d] = kw;
            *(uint4*)&vt[jj][d] = vw;
        }
        __syncthreads();

        float sc[NK][4];
#pragma unroll
        for (int i = 0; i < NK; i++) {
            sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.0f;
#pragma unroll
            for (int s = 0; s + 1 < DK; s += 2) {
                u32 b[4];
                ldmatrix_x4<false>(b, &kt[8 * i + (lane & 7)][16 * s + 8 * (lane >> 3)]);
                mma_f16_16816(sc[i], qf[s][0], qf[s][1], qf[s][2], qf[s][3], b[0], b[1]);
                mma_f16_16816(sc[i], qf[s + 1][0], qf[s + 1][1], qf[s + 1][2], qf[s + 1][3], b[2], b[3]);
            }
            if (DK & 1) {
                const int s = DK - 1;
                u32 b0 = *(const u32*)&kt[8 * i + g][16 * s + 2 * qd];
                u32 b1 = *(const u32*)&kt[8 * i + g][16 * s + 8 + 2 * qd];
                mma_f16_16816(sc[i], qf[s][0], qf[s][1], qf[s][2], qf[s][3], b0, b1);
            }
        }
        float mxa = NEG_INF, mxb = NEG_INF;
#pragma unroll
        for (int i = 0; i < NK; i++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                if (j0 + 8 * i + 2 * qd + e >= n) sc[i][e] = sc[i][2 + e] = NEG_INF;
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
        float ca = expf(ma - na), cb = expf(mb - nb);
        ma = na;
        mb = nb;
        sa *= ca;
        sb *= cb;
#pragma unroll
        for (int i = 0; i < NK; i++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                sc[i][e] = expf(sc[i][e] - ma);
                sc[i][2 + e] = expf(sc[i][2 + e] - mb);
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
        for (int kk = 0; kk < VA_KEYS / 16; kk++) {
            u32 a0 = pack_f16(sc[2 * kk][0], sc[2 * kk][1]), a1 = pack_f16(sc[2 * kk][2], sc[2 * kk][3]);
            u32 a2 = pack_f16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
            u32 a3 = pack_f16(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
            const u16* vrow = &vt[16 * kk + 8 * ((lane >> 3) & 1) + (lane & 7)][8 * (lane >> 4)];
#pragma unroll
            for (int i = 0; i < DN; i += 2) {
                u32 b[4];
                ldmatrix_x4<true>(b, vrow + 8 * i);
                mma_f16_16816(o[i], a0, a1, a2, a3, b[0], b[1]);
                mma_f16_16816(o[i + 1], a0, a1, a2, a3, b[2], b[3]);
            }
        }
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
