// splash CUDA kernels, compiled by NVRTC at first use with the model's dimensions as
// compile-time constants (HEAD_DIM: attention head dim; GDN_DK / GDN_DV: Gated DeltaNet key
// and value head dims). Every kernel has a CPU twin in `src/cpu/` that defines it.
//
// Activations are f32 row-major. Weights stay in their stored format; `deq32<F>` decodes the
// 32-element sub-block `s` of a row, following `src/ggml/dequant.rs` for GGML blocks and the
// MLX affine formula for packed codes.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#ifndef HEAD_DIM
#define HEAD_DIM 256
#endif
#ifndef GDN_DK
#define GDN_DK 128
#endif
#ifndef GDN_DV
#define GDN_DV 128
#endif

#define NEG_INF (__int_as_float(0xff800000))

// Tokens handled by one GEMV launch (more are split into launches by the host): a 16-row
// speculative verify block is one launch.
#define GEMV_MAX_T 16

__device__ __forceinline__ float bf16_to_f32(u16 h) { return __uint_as_float(((u32)h) << 16); }

__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h));
    return f;
}

// Round to nearest even, as half::bf16::from_f32 does for finite values.
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

__device__ __forceinline__ float ld_half(const u8* p) { return f16_to_f32((u16)(p[0] | (p[1] << 8))); }
__device__ __forceinline__ u16 ld_u16(const u8* p) { return (u16)(p[0] | (p[1] << 8)); }
__device__ __forceinline__ u32 ld_u32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

// Byte i of a little-endian array of 32-bit words.
#define WBYTE(w, i) (((w)[(i) >> 2] >> (8 * ((i) & 3))) & 0xffu)

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the sum.
__device__ float block_sum(float v) {
    __shared__ float partial[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    float s = lane < warps ? partial[lane] : 0.0f;
    return warp_sum(s);
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// ---------------------------------------------------------------------------------------------
// Weight formats (codes shared with src/cuda/weights.rs)

#define FMT_F32 0
#define FMT_F16 1
#define FMT_BF16 2
#define FMT_Q4_0 3
#define FMT_Q4_1 4
#define FMT_Q5_0 5
#define FMT_Q5_1 6
#define FMT_Q8_0 7
#define FMT_Q2_K 8
#define FMT_Q3_K 9
#define FMT_Q4_K 10
#define FMT_Q5_K 11
#define FMT_Q6_K 12
#define FMT_IQ4_NL 13
#define FMT_IQ4_XS 14
#define FMT_AFFINE4 15
#define FMT_AFFINE8 16

__constant__ float KVALUES_IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                        1,    13,   25,  38,  53,  69,  89,  113};

// Per-row group scales and biases of an affine (MLX) weight, as f32.
struct Affine {
    const float* scales;
    const float* biases;
    int group;
};

__device__ __forceinline__ void scale_min_k4(int j, const u8* s, float& sc, float& m) {
    if (j < 4) {
        sc = (float)(s[j] & 63);
        m = (float)(s[j + 4] & 63);
    } else {
        sc = (float)((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
        m = (float)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

// The 16 six-bit scales of a Q3_K block (llama.cpp's aux-word shuffle, one scale at a time).
__device__ __forceinline__ int q3k_scale(const u8* s, int is) {
    int g = is >> 2, b = is & 3;
    int low = (g == 0) ? (s[b] & 15) : (g == 1) ? (s[4 + b] & 15) : (g == 2) ? (s[b] >> 4) : (s[4 + b] >> 4);
    int high = (s[8 + b] >> (2 * g)) & 3;
    return (low | (high << 4)) - 32;
}

__device__ __forceinline__ u32 ld_u32_2(const u8* p) {
    const u16* h = (const u16*)p;
    return (u32)h[0] | ((u32)h[1] << 16);
}

// The integer codes of one 32-value sub-block of a Q4_K/Q5_K/Q6_K/Q8_0 row, packed four per
// word (Q6_K biased by 32, Q8_0 signed), with the scales that turn them into values: what both
// the f32 decode (deq32) and the integer GEMV (decoded once, reused for every token) read.
struct Codes {
    u32 v[8];
    float scale;   // Q4_K/Q5_K: d·sc; Q6_K: d·sc of the first 16 values; Q8_0: d
    float scale2;  // Q6_K: d·sc of the last 16 values
    float minus;   // Q4_K/Q5_K: dmin·m (subtracted once per Σx)
};

template <int F>
__device__ __forceinline__ Codes load_codes(const u8* row, int s) {
    Codes c;
    if (F == FMT_Q4_K || F == FMT_Q5_K) {
        const int bytes = F == FMT_Q4_K ? 144 : 176;
        const u8* b = row + bytes * (s >> 3);
        int j = s & 7;
        uint4 hv = *(const uint4*)b;
        u32 hw[4] = {hv.x, hv.y, hv.z, hv.w};
        float d = f16_to_f32((u16)(hw[0] & 0xffff)), dmin = f16_to_f32((u16)(hw[0] >> 16)), sc, m;
        u8 sb[12];
#pragma unroll
        for (int i = 0; i < 12; i++) sb[i] = (u8)WBYTE(hw, i + 4);
        scale_min_k4(j, sb, sc, m);
        c.scale = d * sc;
        c.minus = dmin * m;
        const uint4* qp = (const uint4*)(b + (F == FMT_Q4_K ? 16 : 48) + 32 * (j >> 1));
        uint4 q0 = qp[0], q1 = qp[1];
        u32 qw[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
        u32 hq[8];
        if (F == FMT_Q5_K) {
            uint4 h0 = ((const uint4*)(b + 16))[0], h1 = ((const uint4*)(b + 16))[1];
            hq[0] = h0.x; hq[1] = h0.y; hq[2] = h0.z; hq[3] = h0.w;
            hq[4] = h1.x; hq[5] = h1.y; hq[6] = h1.z; hq[7] = h1.w;
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            u32 v = (j & 1) ? ((qw[i] >> 4) & 0x0f0f0f0fu) : (qw[i] & 0x0f0f0f0fu);
            if (F == FMT_Q5_K) v |= ((hq[i] >> j) & 0x01010101u) << 4;
            c.v[i] = v;
        }
    } else if (F == FMT_Q6_K) {
        const u8* b = row + 210 * (s >> 3);
        int j = s & 7, n = j >> 2, m = j & 3;
        const u8* ql = b + 64 * n + (m & 1) * 32;
        const u8* qh = b + 128 + 32 * n;
        u16 scw = ((const u16*)(b + 192 + 8 * n))[m];
        float d = f16_to_f32(((const u16*)(b + 208))[0]);
        c.scale = d * (float)(i8)(scw & 0xff);
        c.scale2 = d * (float)(i8)(scw >> 8);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            u32 lw = ld_u32_2(ql + 4 * i), hw2 = ld_u32_2(qh + 4 * i);
            u32 lo = m < 2 ? (lw & 0x0f0f0f0fu) : ((lw >> 4) & 0x0f0f0f0fu);
            c.v[i] = lo | (((hw2 >> (2 * m)) & 0x03030303u) << 4);
        }
    } else {  // FMT_Q8_0
        const u8* b = row + 34 * s;
        c.scale = f16_to_f32(((const u16*)b)[0]);
#pragma unroll
        for (int i = 0; i < 8; i++) c.v[i] = ld_u32_2(b + 2 + 4 * i);
    }
    return c;
}

// Decodes values 32s..32s+31 of `row` into w.
template <int F>
__device__ __forceinline__ void deq32(const u8* row, int s, float* w, const Affine& a, int n, int k) {
    if (F == FMT_F32) {
        const float* p = (const float*)row + 32 * s;
#pragma unroll
        for (int i = 0; i < 32; i++) w[i] = p[i];
    } else if (F == FMT_F16 || F == FMT_BF16) {
        // Rows are 64-byte aligned (K a multiple of 32 when this path runs): 16-byte loads.
        const uint4* p = (const uint4*)((const u16*)row + 32 * s);
#pragma unroll
        for (int v = 0; v < 4; v++) {
            uint4 q = p[v];
            u32 words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
            for (int i = 0; i < 8; i++) {
                u16 h = (u16)(words[i >> 1] >> (16 * (i & 1)));
                w[8 * v + i] = F == FMT_F16 ? f16_to_f32(h) : bf16_to_f32(h);
            }
        }
    } else if (F == FMT_Q4_0) {
        const u8* b = row + 18 * s;
        float d = ld_half(b);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            w[j] = (float)((int)(b[2 + j] & 15) - 8) * d;
            w[j + 16] = (float)((int)(b[2 + j] >> 4) - 8) * d;
        }
    } else if (F == FMT_Q4_1) {
        const u8* b = row + 20 * s;
        float d = ld_half(b), m = ld_half(b + 2);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            w[j] = (float)(b[4 + j] & 15) * d + m;
            w[j + 16] = (float)(b[4 + j] >> 4) * d + m;
        }
    } else if (F == FMT_Q5_0) {
        const u8* b = row + 22 * s;
        float d = ld_half(b);
        u32 qh = ld_u32(b + 2);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            u32 h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
            w[j] = (float)((int)((b[6 + j] & 15) | h0) - 16) * d;
            w[j + 16] = (float)((int)((b[6 + j] >> 4) | h1) - 16) * d;
        }
    } else if (F == FMT_Q5_1) {
        const u8* b = row + 24 * s;
        float d = ld_half(b), m = ld_half(b + 2);
        u32 qh = ld_u32(b + 4);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            u32 h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
            w[j] = (float)((b[8 + j] & 15) | h0) * d + m;
            w[j + 16] = (float)((b[8 + j] >> 4) | h1) * d + m;
        }
    } else if (F == FMT_Q8_0) {
        Codes c = load_codes<F>(row, s);
#pragma unroll
        for (int l = 0; l < 32; l++) w[l] = c.scale * (float)(i8)WBYTE(c.v, l);
    } else if (F == FMT_IQ4_NL) {
        const u8* b = row + 18 * s;
        float d = ld_half(b);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            w[j] = d * KVALUES_IQ4NL[b[2 + j] & 15];
            w[j + 16] = d * KVALUES_IQ4NL[b[2 + j] >> 4];
        }
    } else if (F == FMT_Q2_K) {
        const u8* b = row + 84 * (s >> 3);
        int j = s & 7, n = j >> 2, jj = j & 3, shift = 2 * jj;
        const u8* scales = b;
        const u8* qs = b + 16 + 32 * n;
        float d = ld_half(b + 80), dmin = ld_half(b + 82);
#pragma unroll
        for (int l = 0; l < 32; l++) {
            u8 sc = scales[8 * n + 2 * jj + (l >> 4)];
            float dl = d * (float)(sc & 15), ml = dmin * (float)(sc >> 4);
            w[l] = dl * (float)((qs[l] >> shift) & 3) - ml;
        }
    } else if (F == FMT_Q3_K) {
        const u8* b = row + 110 * (s >> 3);
        int j = s & 7, n = j >> 2, jj = j & 3, shift = 2 * jj;
        const u8* hm = b;
        const u8* qs = b + 32 + 32 * n;
        float d = ld_half(b + 108);
        u8 m = (u8)(1u << (4 * n + jj));
#pragma unroll
        for (int l = 0; l < 32; l++) {
            float dl = d * (float)q3k_scale(b + 96, 8 * n + 2 * jj + (l >> 4));
            int q = (int)((qs[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4);
            w[l] = dl * (float)q;
        }
    } else if (F == FMT_Q4_K || F == FMT_Q5_K) {
        Codes c = load_codes<F>(row, s);
#pragma unroll
        for (int l = 0; l < 32; l++) w[l] = c.scale * (float)WBYTE(c.v, l) - c.minus;
    } else if (F == FMT_Q6_K) {
        Codes c = load_codes<F>(row, s);
#pragma unroll
        for (int l = 0; l < 32; l++) w[l] = (l < 16 ? c.scale : c.scale2) * (float)((int)WBYTE(c.v, l) - 32);
    } else if (F == FMT_IQ4_XS) {
        const u8* b = row + 136 * (s >> 3);
        int j = s & 7;
        float d = ld_half(b);
        u16 sh = ld_u16(b + 2);
        int ls = ((b[4 + j / 2] >> (4 * (j % 2))) & 15) | (((sh >> (2 * j)) & 3) << 4);
        float dl = d * (float)(ls - 32);
        // 136-byte blocks are 8-byte aligned: the 16 code bytes in two 8-byte loads.
        const uint2* qp = (const uint2*)(b + 8 + 16 * j);
        uint2 a0 = qp[0], a1 = qp[1];
        u32 qw[4] = {a0.x, a0.y, a1.x, a1.y};
#pragma unroll
        for (int l = 0; l < 16; l++) {
            u32 byte = WBYTE(qw, l);
            w[l] = dl * KVALUES_IQ4NL[byte & 15];
            w[l + 16] = dl * KVALUES_IQ4NL[byte >> 4];
        }
    } else if (F == FMT_AFFINE4 || F == FMT_AFFINE8) {
        const int bits = F == FMT_AFFINE4 ? 4 : 8, per_word = 32 / bits;
        const u32* words = (const u32*)row + (32 / per_word) * s;
        int g = (32 * s) / a.group;
        float sc = a.scales[(long)n * (k / a.group) + g], bi = a.biases[(long)n * (k / a.group) + g];
#pragma unroll
        for (int i = 0; i < 32; i++) {
            u32 q = (words[i / per_word] >> (bits * (i % per_word))) & ((1u << bits) - 1);
            w[i] = sc * (float)q + bi;
        }
    }
}

// y[t, n] = Σ_k W[n, k] x[t, k] for t < T ≤ GEMV_MAX_T. One warp per output row; lane i
// decodes sub-blocks i, i+32, ... of the row and multiplies them with every token.
template <int F>
__device__ void gemv(const u8* W, long row_bytes, Affine a, const float* x, float* y, int N, int K, int T) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int n = blockIdx.x * (blockDim.x >> 5) + warp;
    if (n >= N) return;
    const u8* row = W + (long)n * row_bytes;
    float acc[GEMV_MAX_T];
#pragma unroll
    for (int t = 0; t < GEMV_MAX_T; t++) acc[t] = 0.0f;
#pragma unroll 2
    for (int s = lane; s < K / 32; s += 32) {
        float w[32];
        deq32<F>(row, s, w, a, n, K);
#pragma unroll
        for (int t = 0; t < GEMV_MAX_T; t++) {
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
    // Float rows may end in a partial sub-block (K % 32 != 0): one element per lane.
    if (F == FMT_F32 || F == FMT_F16 || F == FMT_BF16) {
        int e = (K / 32) * 32 + lane;
        if (e < K) {
            float w = F == FMT_F32 ? ((const float*)row)[e]
                    : F == FMT_F16 ? f16_to_f32(((const u16*)row)[e])
                                   : bf16_to_f32(((const u16*)row)[e]);
#pragma unroll
            for (int t = 0; t < GEMV_MAX_T; t++)
                if (t < T) acc[t] += w * x[(long)t * K + e];
        }
    }
#pragma unroll
    for (int t = 0; t < GEMV_MAX_T; t++) {
        if (t < T) {
            float v = warp_sum(acc[t]);
            if (lane == 0) y[(long)t * N + n] = v;
        }
    }
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

#define WEIGHT_KERNELS(NAME, F)                                                                   \
    extern "C" __global__ void gemv_##NAME(const u8* W, long row_bytes, const float* scales,       \
                                           const float* biases, int group, const float* x,        \
                                           float* y, int N, int K, int T) {                       \
        Affine a = {scales, biases, group};                                                       \
        gemv<F>(W, row_bytes, a, x, y, N, K, T);                                                  \
    }                                                                                             \
    extern "C" __global__ void dequant_bf16_##NAME(const u8* W, long row_bytes,                   \
                                                   const float* scales, const float* biases,      \
                                                   int group, void* out, int N, int K) {          \
        Affine a = {scales, biases, group};                                                       \
        dequant_rows<F, true>(W, row_bytes, a, out, N, K);                                        \
    }                                                                                             \
    extern "C" __global__ void dequant_f32_##NAME(const u8* W, long row_bytes,                    \
                                                  const float* scales, const float* biases,       \
                                                  int group, void* out, int N, int K) {           \
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
// Integer GEMV: the activations quantised to int8 per 32 values (scale xd, exact sum xs), the
// weights' integer codes multiplied four at a time with dp4a, or by tensor cores (further
// below). Far fewer instructions than decoding every weight to f32; the activation rounding is
// llama.cpp's (Q8_1). The f32 kernels above stay the exact reference (Gpu::set_exact).

// One warp per 32 values of x [T, K]: xq [T, K] int8, xd and xs [T, K/32].
extern "C" __global__ void quantize_q8(const float* x, i8* xq, float* xd, float* xs, long blocks) {
    long blk = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (blk >= blocks) return;
    float v = x[blk * 32 + lane];
    float amax = warp_max(fabsf(v));
    float sum = warp_sum(v);
    float d = amax / 127.0f;
    xq[blk * 32 + lane] = (i8)(d > 0.0f ? roundf(v / d) : 0.0f);
    if (lane == 0) {
        xd[blk] = d;
        xs[blk] = sum;
    }
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
template <int F, int MAXT>
__device__ void gemv_q8(const u8* W, long row_bytes, const i8* xq, const float* xd, const float* xs, float* y,
                        int N, int K, int T) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int n = blockIdx.x * (blockDim.x >> 5) + warp;
    if (n >= N) return;
    const u8* row = W + (long)n * row_bytes;
    float acc[MAXT];
#pragma unroll
    for (int t = 0; t < MAXT; t++) acc[t] = 0.0f;
    int subs = K / 32;
#pragma unroll 2
    for (int s = lane; s < subs; s += 32) {
        Codes c = load_codes<F>(row, s);
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
#pragma unroll
    for (int t = 0; t < MAXT; t++) {
        if (t < T) {
            float v = warp_sum(acc[t]);
            if (lane == 0) y[(long)t * N + n] = v;
        }
    }
}

#define Q8_KERNEL(NAME, F)                                                                        \
    extern "C" __global__ void gemv_q8_##NAME(const u8* W, long row_bytes, const i8* xq,          \
                                              const float* xd, const float* xs, float* y, int N,  \
                                              int K, int T) {                                     \
        gemv_q8<F, GEMV_MAX_T>(W, row_bytes, xq, xd, xs, y, N, K, T);                             \
    }                                                                                             \
    extern "C" __global__ void gemv1_q8_##NAME(const u8* W, long row_bytes, const i8* xq,         \
                                               const float* xd, const float* xs, float* y, int N, \
                                               int K, int T) {                                    \
        gemv_q8<F, 1>(W, row_bytes, xq, xd, xs, y, N, K, 1);                                      \
    }

Q8_KERNEL(q4_k, FMT_Q4_K)
Q8_KERNEL(q5_k, FMT_Q5_K)
Q8_KERNEL(q6_k, FMT_Q6_K)
Q8_KERNEL(q8_0, FMT_Q8_0)

// ---------------------------------------------------------------------------------------------
// Tensor-core GEMV for 1..16 tokens (decode, a speculative verify block): the int8 codes of 8
// weight rows times the int8 activations of up to 16 tokens with mma.sync (s8 → s32), scaled
// in f32 per (row, token, sub-block). Each weight byte is read once per launch whatever the
// token count, so a block costs about what one token costs; and a token's sums do not depend
// on the others, so verify logits equal decode logits bit for bit. One block of MMA_WARPS
// warps per 8 rows; the warps split K.

#define MMA_WARPS 4

__device__ __forceinline__ void mma_s8_16816(int* c, u32 a0, u32 a1, u32 b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b));
}

__device__ __forceinline__ void mma_s8_16832(int* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Fragment layout (PTX ISA, mma.m16n8k16 / m16n8k32 with .s8): lane = 4·g + q. A (tokens ×
// k): token g (and g+8), k 4q..4q+3 (and 16+4q..). B (k × rows): the same k of row g. C: c0,
// c1 are token g, rows 2q, 2q+1; c2, c3 token g+8.
//
// A warp works in rounds of 4 sub-blocks × its 8 rows: lane (g, q) decodes sub-block q of row
// g once into shared memory, then the 4 mma steps read their B fragments from there (no lane
// decodes what another does). Q6_K has a scale per half sub-block: two k16 mmas; the other
// formats one k32 mma.
template <int F>
__device__ void gemv_mma(const u8* W, long row_bytes, const i8* xq, const float* xd, const float* xs, float* y,
                         int N, int K, int T) {
    __shared__ __align__(16) u32 codes[MMA_WARPS][4][8][8];
    __shared__ float scales[MMA_WARPS][4][8][3];
    __shared__ float part[MMA_WARPS][32][4];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = lane >> 2, q = lane & 3;
    int n0 = blockIdx.x * 8;
    const u8* row = W + (long)min(n0 + g, N - 1) * row_bytes;
    int subs = K / 32;
    bool v0 = g < T, v1 = g + 8 < T;
    const i8* x0 = xq + (long)g * K + 4 * q;
    const i8* x1 = xq + (long)(g + 8) * K + 4 * q;
    const float *xd0 = xd + (long)g * subs, *xd1 = xd + (long)(g + 8) * subs;
    const float *xs0 = xs + (long)g * subs, *xs1 = xs + (long)(g + 8) * subs;
    u32(*my)[8][8] = codes[warp];
    float(*sc)[8][3] = scales[warp];
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int s0 = 4 * warp; s0 < subs; s0 += 4 * MMA_WARPS) {
        if (s0 + q < subs) {
            Codes c = load_codes<F>(row, s0 + q);
            u32 v[8];
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = F == FMT_Q6_K ? __vsub4(c.v[i], 0x20202020u) : c.v[i];
            uint4* dst = (uint4*)my[q][g];
            dst[0] = make_uint4(v[0], v[1], v[2], v[3]);
            dst[1] = make_uint4(v[4], v[5], v[6], v[7]);
            sc[q][g][0] = c.scale;
            sc[q][g][1] = F == FMT_Q6_K ? c.scale2 : c.scale;
            sc[q][g][2] = (F == FMT_Q4_K || F == FMT_Q5_K) ? c.minus : 0.0f;
        }
        __syncwarp();
        int steps = min(4, subs - s0);
        for (int j = 0; j < steps; j++) {
            int s = s0 + j;
            u32 blo = my[j][g][q], bhi = my[j][g][4 + q];
            u32 a0lo = v0 ? *(const u32*)(x0 + 32 * s) : 0u, a0hi = v0 ? *(const u32*)(x0 + 32 * s + 16) : 0u;
            u32 a1lo = v1 ? *(const u32*)(x1 + 32 * s) : 0u, a1hi = v1 ? *(const u32*)(x1 + 32 * s + 16) : 0u;
            float d0 = v0 ? xd0[s] : 0.0f, d1 = v1 ? xd1[s] : 0.0f;
            float m0 = v0 ? xs0[s] : 0.0f, m1 = v1 ? xs1[s] : 0.0f;
            if (F == FMT_Q6_K) {
                int clo[4] = {0, 0, 0, 0}, chi[4] = {0, 0, 0, 0};
                mma_s8_16816(clo, a0lo, a1lo, blo);
                mma_s8_16816(chi, a0hi, a1hi, bhi);
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    float a = sc[j][2 * q + r][0], b = sc[j][2 * q + r][1];
                    acc[r] += d0 * (a * (float)clo[r] + b * (float)chi[r]);
                    acc[2 + r] += d1 * (a * (float)clo[2 + r] + b * (float)chi[2 + r]);
                }
            } else {
                int cc[4] = {0, 0, 0, 0};
                mma_s8_16832(cc, a0lo, a1lo, a0hi, a1hi, blo, bhi);
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    float a = sc[j][2 * q + r][0], m = sc[j][2 * q + r][2];
                    acc[r] += d0 * a * (float)cc[r] - m * m0;
                    acc[2 + r] += d1 * a * (float)cc[2 + r] - m * m1;
                }
            }
        }
        __syncwarp();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) part[warp][lane][i] = acc[i];
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float v = 0.0f;
        for (int w = 0; w < MMA_WARPS; w++) v += part[w][lane][i];
        int t = g + (i >> 1) * 8, n = n0 + 2 * q + (i & 1);
        if (t < T && n < N) y[(long)t * N + n] = v;
    }
}

#define MMA_KERNEL(NAME, F)                                                                       \
    extern "C" __global__ void gemv_mma_##NAME(const u8* W, long row_bytes, const i8* xq,         \
                                               const float* xd, const float* xs, float* y, int N, \
                                               int K, int T) {                                    \
        gemv_mma<F>(W, row_bytes, xq, xd, xs, y, N, K, T);                                        \
    }

MMA_KERNEL(q4_k, FMT_Q4_K)
MMA_KERNEL(q5_k, FMT_Q5_K)
MMA_KERNEL(q6_k, FMT_Q6_K)
MMA_KERNEL(q8_0, FMT_Q8_0)

// f32 → bf16, elementwise (activations for the cuBLAS GEMM).
extern "C" __global__ void to_bf16(const float* x, u16* out, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f32_to_bf16(x[i]);
}

// ---------------------------------------------------------------------------------------------
// Norms and elementwise ops

// out[r] = x[r] * rsqrt(mean(x[r]²) + eps) * w, one block per row (out may alias x).
extern "C" __global__ void rms_norm(const float* x, const float* w, float* out, int d, float eps) {
    const float* xr = x + (long)blockIdx.x * d;
    float* o = out + (long)blockIdx.x * d;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
    float inv = rsqrtf(block_sum(ss) / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] = xr[i] * inv * w[i];
}

// The GDN output norm: w * rms_norm(x) * silu(z), one block per row of d.
extern "C" __global__ void rms_norm_gated(const float* x, const float* z, const float* w, float* out, int d,
                                          float eps) {
    long base = (long)blockIdx.x * d;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += x[base + i] * x[base + i];
    float inv = rsqrtf(block_sum(ss) / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) out[base + i] = w[i] * (x[base + i] * inv) * silu(z[base + i]);
}

extern "C" __global__ void add_in_place(float* x, const float* y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// g = silu(g) * u (SwiGLU).
extern "C" __global__ void silu_mul(float* g, const float* u, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = silu(g[i]) * u[i];
}

// x[t, :] *= sigmoid(g[t]) (the shared-expert gate): one block per row.
extern "C" __global__ void scale_rows_sigmoid(float* x, const float* g, int d) {
    float s = sigmoid(g[blockIdx.x]);
    for (int i = threadIdx.x; i < d; i += blockDim.x) x[(long)blockIdx.x * d + i] *= s;
}

// out[i, :] = x[idx[i], :].
extern "C" __global__ void gather_rows(const float* x, const int* idx, float* out, int d) {
    const float* src = x + (long)idx[blockIdx.x] * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) out[(long)blockIdx.x * d + i] = src[i];
}

// out[idx[i], :] += w[i] * y[i, :] (rows of idx are distinct within one launch).
extern "C" __global__ void scatter_add_rows(const float* y, const int* idx, const float* w, float* out, int d) {
    float* dst = out + (long)idx[blockIdx.x] * d;
    float s = w[blockIdx.x];
    for (int i = threadIdx.x; i < d; i += blockDim.x) dst[i] += s * y[(long)blockIdx.x * d + i];
}

// ---------------------------------------------------------------------------------------------
// Gated attention

// The q_proj output is per head [q(D) | gate(D)]: split it into q [rows, D] and gate [rows, D].
extern "C" __global__ void split_q_gate(const float* qg, float* q, float* gate, int d) {
    long r = blockIdx.x;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        q[r * d + i] = qg[r * 2 * d + i];
        gate[r * d + i] = qg[r * 2 * d + d + i];
    }
}

// Partial NeoX RoPE on x [T, heads, d]: dim j < rot/2 pairs with j + rot/2. One block per
// (token, head).
extern "C" __global__ void rope(float* x, const float* inv_freq, int heads, int d, int rot, int pos0) {
    int t = blockIdx.x / heads;
    float* h = x + (long)blockIdx.x * d;
    int half = rot / 2;
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        float angle = (float)(pos0 + t) * inv_freq[j];
        float c = cosf(angle), s = sinf(angle);
        float a = h[j], b = h[j + half];
        h[j] = a * c - b * s;
        h[j + half] = b * c + a * s;
    }
}

// KV cache formats (src/cpu/kv.rs): 0 f32, 1 bf16, 2 int8 with one f32 scale per row.
#define KV_F32 0
#define KV_BF16 1
#define KV_INT8 2

// Appends rows x [T, hkv, d] at row pos0*hkv of the cache. One block per row.
extern "C" __global__ void kv_append(const float* x, u8* cache, float* scales, int fmt, int d, long row0) {
    long r = row0 + blockIdx.x;
    const float* xr = x + (long)blockIdx.x * d;
    if (fmt == KV_F32) {
        for (int i = threadIdx.x; i < d; i += blockDim.x) ((float*)cache)[r * d + i] = xr[i];
    } else if (fmt == KV_BF16) {
        for (int i = threadIdx.x; i < d; i += blockDim.x) ((u16*)cache)[r * d + i] = f32_to_bf16(xr[i]);
    } else {
        __shared__ float red[32];
        float m = 0.0f;
        for (int i = threadIdx.x; i < d; i += blockDim.x) m = fmaxf(m, fabsf(xr[i]));
        m = warp_max(m);
        if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
        __syncthreads();
        if (threadIdx.x < 32) {
            float v = threadIdx.x < (blockDim.x >> 5) ? red[threadIdx.x] : 0.0f;
            v = warp_max(v);
            if (threadIdx.x == 0) red[0] = v;
        }
        __syncthreads();
        float s = red[0] > 0.0f ? red[0] / 127.0f : 1.0f;
        float inv = 1.0f / s;
        for (int i = threadIdx.x; i < d; i += blockDim.x)
            ((i8*)cache)[r * d + i] = (i8)fminf(127.0f, fmaxf(-127.0f, roundf(xr[i] * inv)));
        if (threadIdx.x == 0) scales[r] = s;
    }
}

// Head dims per lane of a warp; a head dim that is not a multiple of 32 (small drafts) leaves
// the last lanes' extra dims idle (IN_HEAD folds to true otherwise).
#define HEAD_DPL ((HEAD_DIM + 31) / 32)
#define IN_HEAD(i) (HEAD_DIM % 32 == 0 || (i) < HEAD_DIM)

__device__ __forceinline__ void kv_load(const u8* cache, const float* scales, int fmt, long r, int i0, float* out) {
#pragma unroll
    for (int i = 0; i < HEAD_DPL; i++) {
        long e = r * HEAD_DIM + i0 + i;
        out[i] = !IN_HEAD(i0 + i) ? 0.0f
               : fmt == KV_F32 ? ((const float*)cache)[e]
               : fmt == KV_BF16 ? bf16_to_f32(((const u16*)cache)[e])
                                : (float)((const i8*)cache)[e] * scales[r];
    }
}

#define ATTN_WARPS 4

// The keys [*lo, *hi) query t (at position pos0 + t) sees. Causal (`block` 0): keys
// 0..=pos0+t. A DFlash draft block (`block` = T): keys 0..pos0+T. `window` > 0 keeps only keys
// with |q_pos - k_pos| < window.
__device__ __forceinline__ void key_range(int t, int pos0, int block, int window, int* lo, int* hi) {
    int qp = pos0 + t;
    *lo = 0;
    *hi = block > 0 ? pos0 + block : qp + 1;
    if (window > 0) {
        *lo = max(0, qp - window + 1);
        *hi = min(*hi, qp + window);
    }
}

// Attention of query row `row` (token, query head) of q [T, hq, HEAD_DIM] over cache rows
// [lo, hi) of [S, hkv, HEAD_DIM], by the whole block: each warp runs an online softmax over
// every ATTN_WARPS-th key, lane i holding dims [i·DPL, (i+1)·DPL); the warps are then merged.
// Writes dst[i] = Σ_j e_j · v_j (relative to the block's max), divided by the sum when
// `normalise`; otherwise thread 0 also writes the max and the sum to *m_out and *l_out.
__device__ void attend(const float* q, const u8* kc, const float* ks, const u8* vc, const float* vs,
                       int fmt, int row, int hq, int hkv, int lo, int hi, float scale, float* dst,
                       bool normalise, float* m_out, float* l_out) {
    const int DPL = HEAD_DPL;
    int h = row % hq, kvh = h / (hq / hkv);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float* qv = q + (long)row * HEAD_DIM + lane * DPL;
    float qr[DPL], acc[DPL], kr[DPL], vr[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        qr[i] = IN_HEAD(lane * DPL + i) ? qv[i] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    for (int j = lo + warp; j < hi; j += ATTN_WARPS) {
        long r = (long)j * hkv + kvh;
        kv_load(kc, ks, fmt, r, lane * DPL, kr);
        float p = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; i++) p += qr[i] * kr[i];
        float sc = warp_sum(p) * scale;
        float m2 = fmaxf(m, sc);
        float corr = expf(m - m2), e = expf(sc - m2);
        kv_load(vc, vs, fmt, r, lane * DPL, vr);
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[i] = acc[i] * corr + e * vr[i];
        l = l * corr + e;
        m = m2;
    }
    __shared__ float sm[ATTN_WARPS], sl[ATTN_WARPS], sacc[ATTN_WARPS][32 * HEAD_DPL];
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
#pragma unroll
    for (int i = 0; i < DPL; i++) sacc[warp][lane * DPL + i] = acc[i];
    __syncthreads();
    float mt = NEG_INF;
    for (int w = 0; w < ATTN_WARPS; w++) mt = fmaxf(mt, sm[w]);
    float lt = 0.0f;
    for (int w = 0; w < ATTN_WARPS; w++) lt += sl[w] * (sm[w] == NEG_INF ? 0.0f : expf(sm[w] - mt));
    for (int i = threadIdx.x; i < HEAD_DIM; i += blockDim.x) {
        float v = 0.0f;
        for (int w = 0; w < ATTN_WARPS; w++)
            if (sm[w] != NEG_INF) v += sacc[w][i] * expf(sm[w] - mt);
        dst[i] = normalise ? v / lt : v;
    }
    if (!normalise && threadIdx.x == 0) {
        *m_out = mt;
        *l_out = lt;
    }
}

// GQA attention: q [T, hq, HEAD_DIM] at positions pos0.. over the cache [S, hkv, HEAD_DIM]
// (row j = position j), keys as `key_range` says. One block per (token, query head).
extern "C" __global__ void attention(const float* q, const u8* kc, const float* ks, const u8* vc,
                                     const float* vs, float* out, int fmt, int hq, int hkv, int pos0,
                                     float scale, int block, int window) {
    int lo, hi;
    key_range(blockIdx.x / hq, pos0, block, window, &lo, &hi);
    attend(q, kc, ks, vc, vs, fmt, blockIdx.x, hq, hkv, lo, hi, scale, out + (long)blockIdx.x * HEAD_DIM,
           true, nullptr, nullptr);
}

// Keys per chunk of the split attention below.
#define ATTN_CHUNK 1024

// Split attention for a few query rows over a long context (flash-decoding): block
// (row, chunk c) attends to the keys of its row's range that fall in
// [c·ATTN_CHUNK, (c+1)·ATTN_CHUNK), and writes its max, sum and unnormalised output to
// part[row, c, 0 | 1 | 2..]; attention_combine merges the chunks in order. The chunks are
// fixed by position, so a query's result depends only on its own key range: a verify block
// gives each row what token-by-token decoding gives. 1-D grid: block = row · nchunks + c.
extern "C" __global__ void attention_part(const float* q, const u8* kc, const float* ks, const u8* vc,
                                          const float* vs, float* part, int fmt, int hq, int hkv, int pos0,
                                          float scale, int block, int window, int nchunks) {
    int row = blockIdx.x / nchunks, c = blockIdx.x % nchunks;
    int lo, hi;
    key_range(row / hq, pos0, block, window, &lo, &hi);
    float* dst = part + (long)blockIdx.x * (HEAD_DIM + 2);
    attend(q, kc, ks, vc, vs, fmt, row, hq, hkv, max(lo, c * ATTN_CHUNK), min(hi, (c + 1) * ATTN_CHUNK),
           scale, dst + 2, false, dst, dst + 1);
}

// Merges the chunks of attention_part, in order: one block per row.
extern "C" __global__ void attention_combine(const float* part, float* out, int nchunks) {
    const float* p = part + (long)blockIdx.x * nchunks * (HEAD_DIM + 2);
    float mt = NEG_INF;
    for (int c = 0; c < nchunks; c++) mt = fmaxf(mt, p[c * (HEAD_DIM + 2)]);
    float lt = 0.0f;
    for (int c = 0; c < nchunks; c++) {
        float mc = p[c * (HEAD_DIM + 2)];
        if (mc != NEG_INF) lt += p[c * (HEAD_DIM + 2) + 1] * expf(mc - mt);
    }
    for (int i = threadIdx.x; i < HEAD_DIM; i += blockDim.x) {
        float v = 0.0f;
        for (int c = 0; c < nchunks; c++) {
            float mc = p[c * (HEAD_DIM + 2)];
            if (mc != NEG_INF) v += p[c * (HEAD_DIM + 2) + 2 + i] * expf(mc - mt);
        }
        out[(long)blockIdx.x * HEAD_DIM + i] = v / lt;
    }
}

// x *= sigmoid(gate), elementwise (the attention output gate).
extern "C" __global__ void sigmoid_gate(float* x, const float* gate, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= sigmoid(gate[i]);
}

// ---------------------------------------------------------------------------------------------
// Gated DeltaNet

// Depthwise causal conv + SiLU over x [T, C] with state [K-1, C] (oldest first), advanced past
// x. One thread per channel.
extern "C" __global__ void conv1d_silu(const float* x, float* y, float* state, const float* w, int T, int C,
                                       int K) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float hist[8];
    for (int j = 0; j < K - 1; j++) hist[j] = state[(long)j * C + c];
    for (int t = 0; t < T; t++) {
        float xv = x[(long)t * C + c];
        float acc = 0.0f;
        for (int j = 0; j < K - 1; j++) acc += w[c * K + j] * hist[j];
        acc += w[c * K + K - 1] * xv;
        y[(long)t * C + c] = silu(acc);
        for (int j = 0; j < K - 2; j++) hist[j] = hist[j + 1];
        if (K > 1) hist[K - 2] = xv;
    }
    for (int j = 0; j < K - 1; j++) state[(long)j * C + c] = hist[j];
}

// beta = sigmoid(b), g = neg_a[h] · softplus(a + dt_bias[h]) for b, a [T, hv], in place.
extern "C" __global__ void gdn_gates(float* b, float* a, const float* dt_bias, const float* neg_a, int hv,
                                     long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int h = (int)(i % hv);
    b[i] = sigmoid(b[i]);
    a[i] = neg_a[h] * softplus(a[i] + dt_bias[h]);
}

// The gated delta rule, token by token. `mixed` [T, C] holds q | k | v after the conv (C =
// 2·hk·GDN_DK + hv·GDN_DV); q and k are L2-normalised here (q also scaled by dk^-0.5). One
// block per value head of at least GDN_DV threads (a multiple of 32): thread c < GDN_DV owns
// column c of the head's state [GDN_DK, GDN_DV] in registers. `tiled`: value head h reads key
// head h % hk (GGUF order), else h / (hv/hk).
extern "C" __global__ void gdn_recurrent(const float* mixed, const float* g, const float* beta, float* state,
                                         float* out, int T, int hk, int hv, int tiled) {
    const int DK = GDN_DK, DV = GDN_DV;
    int h = blockIdx.x, c = threadIdx.x;
    bool active = c < DV;
    int kh = tiled ? h % hk : h / (hv / hk);
    int C = 2 * hk * DK + hv * DV;
    __shared__ float qs[DK], ks[DK], red[2][32];
    float s[DK];
    float* st = state + (long)h * DK * DV;
#pragma unroll
    for (int i = 0; i < DK; i++) s[i] = active ? st[i * DV + c] : 0.0f;
    float qscale = rsqrtf((float)DK);
    int warps = blockDim.x >> 5;
    for (int t = 0; t < T; t++) {
        const float* row = mixed + (long)t * C;
        float qss = 0.0f, kss = 0.0f;
        for (int i = c; i < DK; i += blockDim.x) {
            float qv = row[kh * DK + i], kv = row[hk * DK + kh * DK + i];
            qs[i] = qv;
            ks[i] = kv;
            qss += qv * qv;
            kss += kv * kv;
        }
        qss = warp_sum(qss);
        kss = warp_sum(kss);
        if ((c & 31) == 0) {
            red[0][c >> 5] = qss;
            red[1][c >> 5] = kss;
        }
        __syncthreads();
        float qn = 0.0f, kn = 0.0f;
        for (int w = 0; w < warps; w++) {
            qn += red[0][w];
            kn += red[1][w];
        }
        float qinv = rsqrtf(qn + 1e-6f) * qscale, kinv = rsqrtf(kn + 1e-6f);
        if (active) {
            float decay = expf(g[(long)t * hv + h]), b = beta[(long)t * hv + h];
            float v = row[2 * hk * DK + h * DV + c];
            float kv = 0.0f;
#pragma unroll
            for (int i = 0; i < DK; i++) {
                s[i] *= decay;
                kv += s[i] * (ks[i] * kinv);
            }
            float delta = (v - kv) * b;
            float o = 0.0f;
#pragma unroll
            for (int i = 0; i < DK; i++) {
                s[i] += (ks[i] * kinv) * delta;
                o += s[i] * (qs[i] * qinv);
            }
            out[((long)t * hv + h) * DV + c] = o;
        }
        __syncthreads();
    }
    if (active) {
#pragma unroll
        for (int i = 0; i < DK; i++) st[i * DV + c] = s[i];
    }
}
