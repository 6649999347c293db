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

// Programmatic dependent launch (sm_90 and up; the host asks for it, see Gpu::launch): a
// kernel may start while the one before it in the stream is still running, so its launch and
// first loads overlap the other's last wave. Every kernel therefore waits for the one before it
// (and so, transitively, for everything earlier) to complete before it touches memory that
// another kernel writes or reads; only weights, which no kernel writes, may be loaded before.
// It lets the next kernel launch first: that one's blocks take SM slots only once all of this
// one's blocks have started, so the earliest kernel always runs (no kernel here waits on another
// block).
#if !defined(KERNEL_EMULATION) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GRID_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define GRID_LAUNCH_NEXT() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define GRID_WAIT()
#define GRID_LAUNCH_NEXT()
#endif
// GRID_TRIGGER_LATE (SPLASH_DEPENDENT_LAUNCH=late, a measurement switch): the next kernel may
// launch only once this one's wait is over, which bounds the chain of launched, waiting kernels
// to one.
#ifdef GRID_TRIGGER_LATE
#define GRID_PROLOGUE()     \
    do {                    \
        GRID_WAIT();        \
        GRID_LAUNCH_NEXT(); \
    } while (0)
#else
#define GRID_PROLOGUE()     \
    do {                    \
        GRID_LAUNCH_NEXT(); \
        GRID_WAIT();        \
    } while (0)
#endif

__device__ __forceinline__ float bf16_to_f32(u16 h) { return __uint_as_float(((u32)h) << 16); }

#ifndef KERNEL_EMULATION  // tests/host_cuda/cuda_host.h defines these on the CPU
__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#endif

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

// Maximum over the block, as block_sum.
__device__ float block_max(float v) {
    __shared__ float partial[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    float m = lane < warps ? partial[lane] : NEG_INF;
    return warp_max(m);
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

// Q4_K and Q6_K on the device are tiled (src/cuda/weights.rs): rows in tiles of 16, each
// 256-value block of a tile one contiguous segment of 16 stored blocks, so that a warp's load
// instruction reads 512 contiguous bytes. Row n's pointer W + n·row_bytes stays the tile's
// start plus (n & 15)·row_bytes; these give a block's segment and the places of row n in it.
#define Q4K_SEGMENT 2304  // 16 × 144: headers [16 × 16], then 4 parts of 512 code bytes
#define Q6K_SEGMENT 3360  // 16 × 210: 6 parts of 512 code bytes, scales [16 × 16], d [16 × 2]

__device__ __forceinline__ const u8* tile_segment(const u8* row, int n, int blk, int K, int block_bytes) {
    long row_bytes = (long)(K >> 8) * block_bytes;
    return row - (long)(n & 15) * row_bytes + (long)blk * 16 * block_bytes;
}

// Byte o (a multiple of 16) of row r's stored Q4_K codes (qs) in its segment: part 2·(r >> 3) +
// ((o >> 5) & 1), lane 4·(r & 7) + q where q covers code bytes 64·(q >> 1) + 16·(q & 1).
__device__ __forceinline__ const u8* q4k_codes(const u8* seg, int r, int o) {
    int u = o >> 4, part = 2 * (r >> 3) + ((u >> 1) & 1), q = (u & 1) | ((u >> 2) << 1);
    return seg + 256 + 512 * part + 16 * (4 * (r & 7) + q);
}

// Byte o (a multiple of 16) of row r's stored Q6_K ql (hi = false, o < 128) or qh (hi, o < 64).
__device__ __forceinline__ const u8* q6k_codes(const u8* seg, int r, int o, bool hi) {
    int k, q;
    if (hi) {
        k = 2;
        q = 2 * (o >> 5) + ((o >> 4) & 1);
    } else {
        k = (o >> 5) & 1;
        q = 2 * (o >> 6) + ((o >> 4) & 1);
    }
    return seg + 512 * (3 * (r >> 3) + k) + 16 * (4 * (r & 7) + q);
}

template <int F>
__device__ __forceinline__ Codes load_codes(const u8* row, int s, int K, int n) {
    Codes c;
    if (F == FMT_Q4_K || F == FMT_Q5_K) {
        int j = s & 7, r = n & 15;
        const u8* b = F == FMT_Q4_K ? tile_segment(row, n, s >> 3, K, 144) : row + 176 * (s >> 3);
        uint4 hv = *(const uint4*)(F == FMT_Q4_K ? b + 16 * r : b);
        u32 hw[4] = {hv.x, hv.y, hv.z, hv.w};
        float d = f16_to_f32((u16)(hw[0] & 0xffff)), dmin = f16_to_f32((u16)(hw[0] >> 16)), sc, m;
        u8 sb[12];
#pragma unroll
        for (int i = 0; i < 12; i++) sb[i] = (u8)WBYTE(hw, i + 4);
        scale_min_k4(j, sb, sc, m);
        c.scale = d * sc;
        c.minus = dmin * m;
        uint4 q0, q1;
        if (F == FMT_Q4_K) {
            q0 = *(const uint4*)q4k_codes(b, r, 32 * (j >> 1));
            q1 = *(const uint4*)q4k_codes(b, r, 32 * (j >> 1) + 16);
        } else {
            const uint4* qp = (const uint4*)(b + 48 + 32 * (j >> 1));
            q0 = qp[0];
            q1 = qp[1];
        }
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
        const u8* seg = tile_segment(row, n, s >> 3, K, 210);
        int j = s & 7, h = j >> 2, m = j & 3, r = n & 15;
        u16 scw = *(const u16*)(seg + 3072 + 16 * r + 8 * h + 2 * m);
        float d = f16_to_f32(*(const u16*)(seg + 3328 + 2 * r));
        c.scale = d * (float)(i8)(scw & 0xff);
        c.scale2 = d * (float)(i8)(scw >> 8);
        int lo_at = 64 * h + (m & 1) * 32;
        uint4 l0 = *(const uint4*)q6k_codes(seg, r, lo_at, false), l1 = *(const uint4*)q6k_codes(seg, r, lo_at + 16, false);
        uint4 h0 = *(const uint4*)q6k_codes(seg, r, 32 * h, true), h1 = *(const uint4*)q6k_codes(seg, r, 32 * h + 16, true);
        u32 lw[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
        u32 hw[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
        for (int i = 0; i < 8; i++) {
            u32 lo = m < 2 ? (lw[i] & 0x0f0f0f0fu) : ((lw[i] >> 4) & 0x0f0f0f0fu);
            c.v[i] = lo | (((hw[i] >> (2 * m)) & 0x03030303u) << 4);
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
        Codes c = load_codes<F>(row, s, k, n);
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
        Codes c = load_codes<F>(row, s, k, n);
#pragma unroll
        for (int l = 0; l < 32; l++) w[l] = c.scale * (float)WBYTE(c.v, l) - c.minus;
    } else if (F == FMT_Q6_K) {
        Codes c = load_codes<F>(row, s, k, n);
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

// One warp per 32 values of x [T, K]: xq [T, K] int8, xd and xs [T, K/32].
extern "C" __global__ void quantize_q8(const float* x, i8* xq, float* xd, float* xs, long blocks) {
    GRID_PROLOGUE();
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

// ---------------------------------------------------------------------------------------------
// Tensor-core GEMV for the 256-value k-quants Q4_K and Q6_K, 1..16 tokens per launch (decode, a
// speculative verify block, the rows of a batched pass). Weights are decoded to f16 (the stored
// value rounded once), activations are f16 scaled per token and 256-value block by a power of
// two (nothing overflows, small values keep their precision), and mma.sync m16n8k16 multiplies
// 16 weight rows by 8 tokens with f32 accumulation; each block's sums are scaled back in f32.
// Each weight byte is read once per launch whatever the token count, so 16 tokens cost about
// what one costs; and a token's column of the mma never mixes with another's, so every token
// gets the same bits alone or in a block.
//
// Fragments (PTX ISA, m16n8k16 .f16, lane = 4·g + q): A (weight rows × k) a0 = row g, k 2q..2q+1;
// a1 = row g+8, same k; a2, a3 = the same rows at k 2q+8..2q+9. B (k × tokens) b0 = token g,
// k 2q..2q+1; b1 = k 2q+8..2q+9. C c0, c1 = row g, tokens 2q, 2q+1; c2, c3 = row g+8.
//
// The k order inside an mma is free as long as A and B agree. Per 256-value block, lane q owns
// the 64 values 128·(q>>1) + 32·m + 16·(q&1) + 4·j + {0..3} (m, j < 4): 16-byte loads of
// contiguous code bytes in both formats. Its mma 4j+m takes a code word's bytes 0, 2 as
// (a0 or a1) and bytes 1, 3 as (a2 or a3): value order base, base+2, base+1, base+3.
// `to_f16_tc` writes the activations in exactly that order: lane q's eight halves of mmas
// 2u, 2u+1 at halves 32u + 8q of the token's block, so that a quad's loads are contiguous.

// Warps of one block split a 16-row tile's K; the host picks how many (at most this).
#define TC_WARPS_MAX 8

// Segments a warp asks the L2 for ahead of the one it loads into registers (prefetch.global.L2,
// no registers held). Two measured best on the H200 (BENCHMARKS.md, 2026-12-02, L2 requests):
// the 27B Q4_K down product 31.3 -> 28.0 us at 1 token, the 16-token Q6_K one 44.3 -> 41.8;
// 4 and 8 gained less. SPLASH_GEMV_L2_AHEAD sets it (0: off), a measurement switch.
#ifndef TC_L2_AHEAD
#define TC_L2_AHEAD 2
#endif

// Asks the L2 for the `bytes` at p (a 16-byte aligned segment), a 128-byte line per lane.
__device__ __forceinline__ void l2_prefetch(const u8* p, int bytes, int lane) {
#ifndef KERNEL_EMULATION
    if (128 * lane < bytes) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + 128 * lane));
#endif
}

#ifndef KERNEL_EMULATION  // tests/host_cuda/cuda_host.h defines these on the CPU
__device__ __forceinline__ u32 h2_sub(u32 a, u32 b) {
    u32 r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

__device__ __forceinline__ u32 h2_fma(u32 a, u32 b, u32 c) {
    u32 r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

__device__ __forceinline__ u32 h2_mul(u32 a, u32 b) {
    u32 r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
#endif

#ifndef KERNEL_EMULATION  // tests/host_cuda/cuda_host.h defines these on the CPU
__device__ __forceinline__ void mma_f16_16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
#endif

__device__ __forceinline__ u32 word_of(uint4 v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }

// One row's share of a block for lane (g, q), as loaded. Q4_K: a = header (d, dmin, scales), b
// and c = code bytes of sub-blocks 4n, 4n+1 and 4n+2, 4n+3 (n = q>>1). Q6_K: a, b = low bits
// (ql), c = high bits (qh), s = the lane's half of the block's 16 scales, d = the block scale.
struct TcRaw {
    uint4 a, b, c;
    uint2 s;
    u32 d;
};

// Weights are read once per launch: loads that do not allocate in L1 leave it to the
// activations, which every tile reads again.
#ifndef KERNEL_EMULATION  // tests/host_cuda/cuda_host.h defines these on the CPU
__device__ __forceinline__ uint4 ld_stream(const void* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}
#endif

// Row g + 8·half of block `seg` (a tile segment, see tile_segment): every load is one warp-wide
// run of contiguous bytes.
template <int F>
__device__ __forceinline__ TcRaw tc_load(const u8* seg, int half, int lane) {
    TcRaw r;
    int g = lane >> 2, q = lane & 3, row = g + 8 * half;
    if (F == FMT_Q4_K) {
        r.a = ld_stream(seg + 16 * row);
        r.b = ld_stream(seg + 256 + 512 * (2 * half) + 16 * lane);
        r.c = ld_stream(seg + 256 + 512 * (2 * half + 1) + 16 * lane);
    } else {
        r.a = ld_stream(seg + 512 * (3 * half) + 16 * lane);
        r.b = ld_stream(seg + 512 * (3 * half + 1) + 16 * lane);
        r.c = ld_stream(seg + 512 * (3 * half + 2) + 16 * lane);
        r.s = *(const uint2*)(seg + 3072 + 16 * row + 8 * (q >> 1));
        r.d = *(const u16*)(seg + 3328 + 2 * row);
    }
    return r;
}

// The f16x2 factors of lane q's four sub-blocks m: Q4_K value = mul·code + add (mul = d·sc,
// add = −dmin·m); Q6_K value = mul·(code − 32) (mul = d·sc).
struct TcScales {
    u32 mul[4], add[4];
};

// (1024 + c, 1024 + c) as f16x2 for the byte c of `w` that `byte` (0..3) picks: the byte under
// the exponent of 1024 (halves 0x64cc), exact for every byte value.
__device__ __forceinline__ u32 h2_1024_plus_byte(u32 w, u32 byte) {
    return __byte_perm(w, 0x64u, byte | 0x4040u | (byte << 8));
}

// The scales in f16 arithmetic: code factor × block scale, each a 6-bit (Q4_K) or 8-bit (Q6_K)
// integer times an f16, rounded once, as the f32 product converted to f16 rounds.
template <int F>
__device__ __forceinline__ TcScales tc_scales(const TcRaw& r, int q) {
    TcScales s;
    if (F == FMT_Q4_K) {
        u32 d = __byte_perm(r.a.x, 0, 0x1010u), neg_dmin = __byte_perm(r.a.x, 0, 0x3232u) ^ 0x80008000u;
        // Sub-blocks 4n..4n+3 (llama.cpp's get_scale_min_k4, four at a time).
        u32 sc, mn;
        if ((q >> 1) == 0) {
            sc = r.a.y & 0x3f3f3f3fu;
            mn = r.a.z & 0x3f3f3f3fu;
        } else {
            sc = (r.a.w & 0x0f0f0f0fu) | ((r.a.y >> 2) & 0x30303030u);
            mn = ((r.a.w >> 4) & 0x0f0f0f0fu) | ((r.a.z >> 2) & 0x30303030u);
        }
#pragma unroll
        for (int m = 0; m < 4; m++) {
            s.mul[m] = h2_mul(h2_sub(h2_1024_plus_byte(sc, m), 0x64006400u), d);
            s.add[m] = h2_mul(h2_sub(h2_1024_plus_byte(mn, m), 0x64006400u), neg_dmin);
        }
    } else {
        u32 d = __byte_perm(r.d, 0, 0x1010u);
        // Sub-block m of this lane uses scale 8n + (q&1) + 2m: bytes (q&1) + 2m of s. The
        // scales are signed: flipping the sign bit maps them to c + 128, so 1024 + 128 less.
        u32 o = q & 1;
#pragma unroll
        for (int m = 0; m < 4; m++) {
            u32 w = (m < 2 ? r.s.x : r.s.y) ^ 0x80808080u;
            s.mul[m] = h2_mul(h2_sub(h2_1024_plus_byte(w, o + 2 * (m & 1)), 0x64806480u), d);
            s.add[m] = 0;
        }
    }
    return s;
}

// The f16 weight pairs of mma 4j+m: p0 = values base, base+2; p1 = base+1, base+3.
template <int F>
__device__ __forceinline__ void tc_pairs(const TcRaw& r, const TcScales& s, int j, int m, u32& p0, u32& p1) {
    const u32 magic = 0x64006400u;  // f16 1024 in both halves: 1024 + code, exactly
    if (F == FMT_Q4_K) {
        u32 w = word_of(m < 2 ? r.b : r.c, j) >> (4 * (m & 1));
        u32 h0 = (w & 0x000f000fu) | magic, h1 = ((w >> 8) & 0x000f000fu) | magic;
        p0 = h2_fma(h2_sub(h0, magic), s.mul[m], s.add[m]);
        p1 = h2_fma(h2_sub(h1, magic), s.mul[m], s.add[m]);
    } else {
        u32 lo = word_of(r.a, j), hi = word_of(r.b, j), h = word_of(r.c, j);
        u32 v;
        if (m == 0) v = (lo & 0x0f0f0f0fu) | ((h << 4) & 0x30303030u);
        else if (m == 1) v = (hi & 0x0f0f0f0fu) | ((h << 2) & 0x30303030u);
        else if (m == 2) v = ((lo >> 4) & 0x0f0f0f0fu) | (h & 0x30303030u);
        else v = ((hi >> 4) & 0x0f0f0f0fu) | ((h >> 2) & 0x30303030u);
        const u32 bias = 0x64206420u;  // f16 1056 = 1024 + the code offset 32
        u32 h0 = (v & 0x003f003fu) | magic, h1 = ((v >> 8) & 0x003f003fu) | magic;
        p0 = h2_mul(h2_sub(h0, bias), s.mul[m]);
        p1 = h2_mul(h2_sub(h1, bias), s.mul[m]);
    }
}

// One 256-value block b of a 16-row tile (its two halves' raw loads r0, r1) times the NT·8
// token columns: c[i] += xscale · (W x) over the block; x[i] points at token 8i + g's
// activations (lane (g, q)). Each column's sums are its own, whatever NT.
template <int F, int NT>
__device__ __forceinline__ void tc_block(const TcRaw& r0, const TcRaw& r1, int b, int q, const uint4* const (&x)[NT],
                                         const float* const (&xs)[NT][2], float (&c)[NT][4]) {
    TcScales s0 = tc_scales<F>(r0, q), s1 = tc_scales<F>(r1, q);
    float cb[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++) cb[i][0] = cb[i][1] = cb[i][2] = cb[i][3] = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint4 xv[NT][2];
#pragma unroll
        for (int i = 0; i < NT; i++) {
            xv[i][0] = x[i][32 * b + 8 * j];
            xv[i][1] = x[i][32 * b + 8 * j + 4];
        }
#pragma unroll
        for (int m = 0; m < 4; m++) {
            u32 a0, a2, a1, a3;
            tc_pairs<F>(r0, s0, j, m, a0, a2);
            tc_pairs<F>(r1, s1, j, m, a1, a3);
#pragma unroll
            for (int i = 0; i < NT; i++) {
                uint4 v = xv[i][m >> 1];
                mma_f16_16816(cb[i], a0, a1, a2, a3, (m & 1) ? v.z : v.x, (m & 1) ? v.w : v.y);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < NT; i++) {
        float sa = xs[i][0][b], sb = xs[i][1][b];
        c[i][0] += sa * cb[i][0];
        c[i][1] += sb * cb[i][1];
        c[i][2] += sa * cb[i][2];
        c[i][3] += sb * cb[i][3];
    }
}

// One chain's sums of a tile (lane (g, q) holds rows g, g + 8 × tokens 8i + 2q + {0, 1} in
// c[i]) into the block's shared partial sums.
template <int NT>
__device__ __forceinline__ void tc_chain_store(const float (&c)[NT][4], float (*part)[32][4 * NT], int chain) {
    int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) part[chain][lane][4 * i + e] = c[i][e];
}

// The end of a 16-row tile's product (or of a piece of one): the `chains` partial sums added in
// chain order by warp 0 and written, rows n < split to y [T, split], the others to
// y2 [T, N - split]; with `cols`, token t goes to row cols[t]; with `partial`, to
// partial[16·t + n - n0] instead (a piece of a tile).
template <int NT>
__device__ __forceinline__ void tc_tile_sum(float (*part)[32][4 * NT], int chains, int n0, float* y, float* y2,
                                            int split, int N, int T, const int* cols, float* partial = nullptr) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int g = lane >> 2, q = lane & 3;
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int i = 0; i < NT; i++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float v = 0.0f;
            for (int w = 0; w < chains; w++) v += part[w][lane][4 * i + e];
            int t = 8 * i + 2 * q + (e & 1), n = n0 + g + 8 * (e >> 1);
            if (t >= T || n >= N) continue;
            long r = cols ? cols[t] : t;
            if (partial)
                partial[16 * t + n - n0] = v;
            else if (n < split)
                y[r * split + n] = v;
            else
                y2[r * (N - split) + n - split] = v;
        }
    }
}

// y[t, n] = Σ_b xscale[t, b] · Σ_{k in block b} W[n, k] xh[t, k] for t < T ≤ 8·NT. Block: the
// 16-row tile `tile_index`, its K blocks split into `chains` sums (chain j: b = j, j + chains,
// ...), added in chain order. The block's warps take the chains in turn (warp w: chains w,
// w + warps, ...), so the warp count sets the parallelism and `chains` alone the bits: a row's
// sums depend on the shape only, and any token count gives each token the bits it gets alone.
// Rows n < split go to y [T, split], the others to y2 [T, N - split] (two products of one input
// stacked into one weight). With `cols`, column t reads activation row cols[t] / col_div and
// writes row cols[t] of y (the pairs of a MoE layer, see gemv_tc_experts).
template <int F, int NT>
__device__ void gemv_tc(const u8* W, long row_bytes, const u16* xh, const float* xscale, float* y, float* y2,
                        int split, int N, int K, int T, int tile_index, const int* cols, int col_div, int chains) {
    __shared__ float part[TC_WARPS_MAX][32][4 * NT];
    int warps = blockDim.x >> 5, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int g = lane >> 2, q = lane & 3;
    int n0 = tile_index * 16, nb = K >> 8;
    constexpr int seg_bytes = F == FMT_Q4_K ? Q4K_SEGMENT : Q6K_SEGMENT;
    // The tile's segments (rows are padded to whole tiles on the device).
    const u8* tile = W + (long)n0 * row_bytes;
    // Tokens past T repeat the last one (their columns are not written).
#define TC_XROW(t) (cols ? cols[t] / col_div : (t))
    const uint4* x[NT];
#pragma unroll
    for (int i = 0; i < NT; i++) x[i] = (const uint4*)(xh + (long)TC_XROW(min(8 * i + g, T - 1)) * K + 8 * q);
    float c[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++) c[i][0] = c[i][1] = c[i][2] = c[i][3] = 0.0f;
    // The scales of this lane's C tokens 8i + 2q + {0, 1}.
    const float* xs[NT][2];
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int e = 0; e < 2; e++) xs[i][e] = xscale + (long)TC_XROW(min(8 * i + 2 * q + e, T - 1)) * nb;
#undef TC_XROW
    // This warp's units (chain j, block b) in order: chain j = warp from block b = j, then chain
    // j + warps, ... (chains ≤ nb, so every chain has a block).
    auto after = [&](int& uj, int& ub) {
        ub += chains;
        if (ub >= nb) uj = ub = uj + warps;
    };
    int j = warp, b = warp;
    bool have = warp < chains;
    TcRaw r0, r1;
    if (have) {
        r0 = tc_load<F>(tile + (long)b * seg_bytes, 0, lane);
        r1 = tc_load<F>(tile + (long)b * seg_bytes, 1, lane);
    }
    // Units 2 .. TC_L2_AHEAD asked of the L2 now, then each step the one TC_L2_AHEAD past the
    // next (pj, pb): across chains too, so a warp walking one-block chains still reads ahead.
    int pj = j, pb = b;
    after(pj, pb);
    after(pj, pb);
    for (int d = 2; d <= TC_L2_AHEAD && pj < chains; d++) {
        l2_prefetch(tile + (long)pb * seg_bytes, seg_bytes, lane);
        after(pj, pb);
    }
    // The first weights are in flight; everything else comes from the kernels before.
    GRID_PROLOGUE();
    while (have) {
        // The next unit's loads are in flight while this one is decoded and multiplied (more
        // in flight, in registers or through a ring of shared-memory slots that the copy engine
        // fills, was measured slower: BENCHMARKS.md, 2026-12-01 and 2026-12-02).
        int nj = j, nbk = b;
        after(nj, nbk);
        bool next = nj < chains;
        if (TC_L2_AHEAD > 0 && pj < chains) {
            l2_prefetch(tile + (long)pb * seg_bytes, seg_bytes, lane);
            after(pj, pb);
        }
        TcRaw n0r, n1r;
        if (next) {
            n0r = tc_load<F>(tile + (long)nbk * seg_bytes, 0, lane);
            n1r = tc_load<F>(tile + (long)nbk * seg_bytes, 1, lane);
        }
        tc_block<F, NT>(r0, r1, b, q, x, xs, c);
        if (nj != j) {
            tc_chain_store<NT>(c, part, j);
#pragma unroll
            for (int i = 0; i < NT; i++) c[i][0] = c[i][1] = c[i][2] = c[i][3] = 0.0f;
        }
        r0 = n0r;
        r1 = n1r;
        j = nj;
        b = nbk;
        have = next;
    }
    tc_tile_sum<NT>(part, chains, n0, y, y2, split, N, T, cols);
}

// Stream-K: the same products with the work of the whole matrix, (tile, 256-value block)
// units in tile-major order, cut into gridDim.x equal ranges, one per block. A launch of a
// mid-sized matrix then keeps every SM streaming weights to the end, where a block per tile
// left a partial last wave running alone. A block's range covers the end of one tile, whole
// tiles and the start of another; its warps split each piece's blocks as gemv_tc splits a
// tile's (b = first + warp, + warps, ...), summed in warp order. A whole tile is written out;
// a piece of one goes to partials [tile, piece, 8·NT tokens, 16 rows], which
// gemv_tc_fixup sums in piece order. The cut depends on the shape and the grid only, so every
// token gets the same bits in any launch of up to 16 tokens.
//
// The block that holds unit u: the last c with floor(c·U / grid) ≤ u.
__device__ __forceinline__ int stream_k_block(long u, long units, int grid) {
    return (int)(((u + 1) * grid - 1) / units);
}

template <int F, int NT>
__device__ void gemv_tcs(const u8* W, long row_bytes, const u16* xh, const float* xscale, float* y, float* y2,
                         int split, int N, int K, int T, float* partials, int max_pieces) {
    __shared__ float part[TC_WARPS_MAX][32][4 * NT];
    int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = lane >> 2, q = lane & 3;
    int nb = K >> 8, tiles = (N + 15) / 16;
    long units = (long)tiles * nb;
    // Unit u's segment is at W + u·seg_bytes (a tile's 16 rows are nb segments).
    int u0 = (int)((long)blockIdx.x * units / gridDim.x), u1 = (int)((long)(blockIdx.x + 1) * units / gridDim.x);
    const int seg_bytes = F == FMT_Q4_K ? Q4K_SEGMENT : Q6K_SEGMENT;
    const uint4* x[NT];
#pragma unroll
    for (int i = 0; i < NT; i++) x[i] = (const uint4*)(xh + (long)min(8 * i + g, T - 1) * K + 8 * q);
    const float* xs[NT][2];
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int e = 0; e < 2; e++) xs[i][e] = xscale + (long)min(8 * i + 2 * q + e, T - 1) * nb;
    // The block's pieces: tile t from b_lo(t) to b_hi(t). A warp takes b = b_lo + warp, + warps,
    // ... in each, in order, the next one's loads in flight while one is multiplied (across
    // pieces too).
    int first = u0 / nb, last = (u1 - 1) / nb;
#define TCS_LO(t) ((t) == first ? u0 - (t) * nb : 0)
#define TCS_HI(t) min(nb, u1 - (t) * nb)
    // (t, b) moved on to this warp's first unit at or after it: past a piece's end, block `warp`
    // of the next tile (the pieces after the first start at 0); t > last when none is left.
    auto settle = [&](int& t, int& b) {
        while (t <= last && b >= TCS_HI(t)) {
            t++;
            b = warp;
        }
    };
    // Unit (t, b)'s two halves, when there is one.
    auto load = [&](int t, int b, TcRaw& h0, TcRaw& h1) {
        if (t > last) return;
        h0 = tc_load<F>(W + (long)(t * nb + b) * seg_bytes, 0, lane);
        h1 = tc_load<F>(W + (long)(t * nb + b) * seg_bytes, 1, lane);
    };
    int pt = first, pb = TCS_LO(first) + warp;
    settle(pt, pb);
    TcRaw r0, r1;
    load(pt, pb, r0, r1);
    // The first weights are in flight; everything else comes from the kernels before.
    GRID_PROLOGUE();
    for (int tile = first; tile <= last; tile++) {
        float c[NT][4];
#pragma unroll
        for (int i = 0; i < NT; i++) c[i][0] = c[i][1] = c[i][2] = c[i][3] = 0.0f;
        while (pt == tile) {
            int nt = pt, nbk = pb + warps;
            settle(nt, nbk);
            TcRaw n0r, n1r;
            load(nt, nbk, n0r, n1r);
            tc_block<F, NT>(r0, r1, pb, q, x, xs, c);
            r0 = n0r;
            r1 = n1r;
            pt = nt;
            pb = nbk;
        }
        __syncthreads();  // the previous piece's sums are read
        // A whole tile goes to y; a piece of one to partials [tile, piece, 16 tokens, 16 rows].
        bool whole = TCS_LO(tile) == 0 && TCS_HI(tile) == nb;
        int piece = blockIdx.x - stream_k_block((long)tile * nb, units, gridDim.x);
        float* partial = whole ? nullptr : partials + ((long)tile * max_pieces + piece) * 256;
        tc_chain_store<NT>(c, part, warp);
        tc_tile_sum<NT>(part, warps, tile * 16, y, y2, split, N, T, nullptr, partial);
    }
#undef TCS_LO
#undef TCS_HI
}

// Sums the pieces of the tiles that gemv_tcs split over several blocks, in piece order: one
// thread per (tile, token, row); `grid` is gemv_tcs's block count.
extern "C" __global__ void gemv_tc_fixup(const float* partials, float* y, float* y2, int split, int N, int K,
                                         int T, int grid, int max_pieces) {
    GRID_PROLOGUE();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    int tiles = (N + 15) / 16, nb = K >> 8;
    if (i >= (long)tiles * T * 16) return;
    int tile = (int)(i / (T * 16)), t = (int)(i / 16 % T), r = (int)(i % 16), n = tile * 16 + r;
    long units = (long)tiles * nb;
    int first = stream_k_block((long)tile * nb, units, grid), last = stream_k_block((long)tile * nb + nb - 1, units, grid);
    if (first == last || n >= N) return;  // a whole tile, written by its block
    float v = 0.0f;
    for (int p = 0; p <= last - first; p++) v += partials[(((long)tile * max_pieces + p) * 16 + t) * 16 + r];
    if (n < split)
        y[(long)t * split + n] = v;
    else
        y2[(long)t * (N - split) + n - split] = v;
}

// This block's share of a grouped expert product: its table and that table's output, its
// slot `a` among the active experts and its 16-row tile. The expert is active[a] (−1: none,
// fewer are active than the grid allows), its pairs order[offsets[a] .. offsets[a + 1]].
struct ExpertBlock {
    const u64* table;
    float* y;
    int a, tile;
};

__device__ __forceinline__ ExpertBlock expert_block(const u64* table, float* y, const u64* table_b, float* y_b,
                                                    int N) {
    int per = table_b ? gridDim.x / 2 : gridDim.x;
    if (blockIdx.x >= per) {
        table = table_b;
        y = y_b;
    }
    int blk = blockIdx.x % per, tiles = (N + 15) / 16;
    return {table, y, blk / tiles, blk % tiles};
}

// The expert products of a MoE layer, grouped by expert (moe_group): block (a, tile) multiplies
// tile `tile` of the a-th active expert's weight (its pointer in `table`) by every pair routed
// to it, 16 columns at a time, so each expert's weights are read once however many tokens chose
// it. Pair p reads activation row p / col_div (its token for gate / up, the pair itself for
// down) and writes row p of y; each pair gets what its token alone would get. With a second
// table (table_b, y_b: the up products beside the gate ones), the second half of the grid does
// the same for it. A prefill pass's products (dozens of pairs an expert) take gemm_tc_experts.
template <int F>
__device__ void gemv_tc_experts(const u64* table, float* y, const u64* table_b, float* y_b, const int* active,
                                const int* offsets, const int* order, long row_bytes, const u16* xh,
                                const float* xscale, int N, int K, int col_div, int chains) {
    ExpertBlock eb = expert_block(table, y, table_b, y_b, N);
    int e = active[eb.a];
    if (e < 0) return;  // the whole block
    const u8* W = (const u8*)eb.table[e];
    int off = offsets[eb.a], cnt = offsets[eb.a + 1] - off;
    for (int c0 = 0; c0 < cnt; c0 += 16) {
        int n = min(16, cnt - c0);
        const int* cols = order + off + c0;
        if (n <= 8)
            gemv_tc<F, 1>(W, row_bytes, xh, xscale, eb.y, nullptr, N, N, K, n, eb.tile, cols, col_div, chains);
        else
            gemv_tc<F, 2>(W, row_bytes, xh, xscale, eb.y, nullptr, N, N, K, n, eb.tile, cols, col_div, chains);
        __syncthreads();  // the next chunk reuses the partial sums' shared memory
    }
}

// Pairs of one expert that gemm_tc_experts multiplies per decoding of a 256-value block.
#define EXPERT_SPAN 64

// The grouped expert products of a prefill pass (dozens of pairs an expert): the blocks of
// gemv_tc_experts, but a warp decodes each 256-value block of its chains into registers once
// (the 16 mmas' A fragments) and multiplies it by up to EXPERT_SPAN pairs, two 8-pair groups at
// a time, where gemv_tc_experts decodes it again for every 16 pairs. The chains' sums wait in
// shared memory and are added in chain order, so every pair gets the bits gemv_tc_experts (and
// its token alone) gives.
template <int F>
__device__ void gemm_tc_experts(const u64* table, float* y, const u64* table_b, float* y_b, const int* active,
                                const int* offsets, const int* order, long row_bytes, const u16* xh,
                                const float* xscale, int N, int K, int col_div, int chains) {
    // [chain][8-pair group][lane][c0..c3]: the C fragments of tc_block, one per group.
    __shared__ float part[TC_WARPS_MAX][EXPERT_SPAN / 8][32][4];
    ExpertBlock eb = expert_block(table, y, table_b, y_b, N);
    int e = active[eb.a];
    if (e < 0) return;  // the whole block
    int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = lane >> 2, q = lane & 3;
    int n0 = eb.tile * 16, nb = K >> 8;
    constexpr int seg_bytes = F == FMT_Q4_K ? Q4K_SEGMENT : Q6K_SEGMENT;
    const u8* tile = (const u8*)eb.table[e] + (long)n0 * row_bytes;
    int off = offsets[eb.a], cnt = offsets[eb.a + 1] - off;
    for (int c0 = 0; c0 < cnt; c0 += EXPERT_SPAN) {
        int n = min(EXPERT_SPAN, cnt - c0), groups = (n + 7) / 8;
        const int* cols = order + off + c0;
        // Activation row of the span's pair t (pairs past n repeat the last; not written).
        auto xrow = [&](int t) { return (long)(cols[min(t, n - 1)] / col_div); };
        for (int j = warp; j < chains; j += warps) {
            for (int i = 0; i < groups; i++)
#pragma unroll
                for (int c = 0; c < 4; c++) part[j][i][lane][c] = 0.0f;
            for (int b = j; b < nb; b += chains) {
                // The block's A fragments: mma 4jj+m takes frag[jj][m] (tc_block's a0, a1, a2, a3).
                u32 frag[4][4][4];
                {
                    TcRaw r0 = tc_load<F>(tile + (long)b * seg_bytes, 0, lane);
                    TcRaw r1 = tc_load<F>(tile + (long)b * seg_bytes, 1, lane);
                    // This warp's next block asked of the L2 while this one is multiplied.
                    int next = b + chains < nb ? b + chains : j + warps < chains ? j + warps : -1;
                    if (next >= 0) l2_prefetch(tile + (long)next * seg_bytes, seg_bytes, lane);
                    TcScales s0 = tc_scales<F>(r0, q), s1 = tc_scales<F>(r1, q);
#pragma unroll
                    for (int jj = 0; jj < 4; jj++)
#pragma unroll
                        for (int m = 0; m < 4; m++) {
                            tc_pairs<F>(r0, s0, jj, m, frag[jj][m][0], frag[jj][m][2]);
                            tc_pairs<F>(r1, s1, jj, m, frag[jj][m][1], frag[jj][m][3]);
                        }
                }
                // Two groups of 8 pairs at a time (two independent mma chains); a second group
                // past the span's last is computed on repeated pairs and dropped.
                for (int i = 0; i < groups; i += 2) {
                    const uint4* x[2];
                    float cb[2][4];
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        x[h] = (const uint4*)(xh + xrow(8 * (i + h) + g) * K + 8 * q);
                        cb[h][0] = cb[h][1] = cb[h][2] = cb[h][3] = 0.0f;
                    }
#pragma unroll
                    for (int jj = 0; jj < 4; jj++) {
                        uint4 xv[2][2];
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            xv[h][0] = x[h][32 * b + 8 * jj];
                            xv[h][1] = x[h][32 * b + 8 * jj + 4];
                        }
#pragma unroll
                        for (int m = 0; m < 4; m++)
#pragma unroll
                            for (int h = 0; h < 2; h++) {
                                uint4 v = xv[h][m >> 1];
                                const u32* f = frag[jj][m];
                                mma_f16_16816(cb[h], f[0], f[1], f[2], f[3], (m & 1) ? v.z : v.x, (m & 1) ? v.w : v.y);
                            }
                    }
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        if (i + h >= groups) break;
                        float sa = xscale[xrow(8 * (i + h) + 2 * q) * nb + b];
                        float sb = xscale[xrow(8 * (i + h) + 2 * q + 1) * nb + b];
                        float* c = part[j][i + h][lane];
                        c[0] += sa * cb[h][0];
                        c[1] += sb * cb[h][1];
                        c[2] += sa * cb[h][2];
                        c[3] += sb * cb[h][3];
                    }
                }
            }
        }
        __syncthreads();
        // The chains added in chain order (tc_tile_sum), one C value a thread.
        for (int v = threadIdx.x; v < groups * 128; v += blockDim.x) {
            int i = v >> 7, l = (v >> 2) & 31, c = v & 3;
            float sum = 0.0f;
            for (int w = 0; w < chains; w++) sum += part[w][i][l][c];
            int t = 8 * i + 2 * (l & 3) + (c & 1), row = n0 + (l >> 2) + 8 * (c >> 1);
            if (t < n && row < N) eb.y[(long)cols[t] * N + row] = sum;
        }
        __syncthreads();  // the next span reuses the sums' shared memory
    }
}

// At most 96 registers for the 1..8-token Q4_K kernel: five 4-warp blocks per SM instead of four
// (106 uncapped, no spills at 96). Measured on the H200: 27B gate / up 26.0 → 24.5 µs, GDN qkv
// 17.6 → 14.8 µs. The Q6_K kernel spills at 96 and got slower, so it stays uncapped.
#ifndef KERNEL_EMULATION
#define TC8_REGS_q4_k __maxnreg__(96)
#else
#define TC8_REGS_q4_k
#endif
#define TC8_REGS_q6_k
// Stream-K blocks: at most 128 registers, four 4-warp blocks per SM (132-152 uncapped; at 96 the
// Q4_K one spills 60 bytes).
#ifndef KERNEL_EMULATION
#define TCS_REGS __maxnreg__(128)
#else
#define TCS_REGS
#endif

// The grouped expert GEMV's registers: Q4_K's at most 128 (sixteen warps an SM instead of
// eight at its uncapped ~230; measured on the H200, 35B-A3B gate / up at 1 / 4 / 16 tokens:
// 5.3 / 12.4 / 47.4 µs → 5.2 / 11.4 / 37.1), Q6_K's uncapped (slower capped at 1 and 4 tokens),
// unless EXPERT_REGS caps both (SPLASH_EXPERT_REGS, a measurement switch).
#if defined(KERNEL_EMULATION)
#define EXPERT_REGS_q4_k
#define EXPERT_REGS_q6_k
#elif defined(EXPERT_REGS)
#define EXPERT_REGS_q4_k __maxnreg__(EXPERT_REGS)
#define EXPERT_REGS_q6_k __maxnreg__(EXPERT_REGS)
#else
#define EXPERT_REGS_q4_k __maxnreg__(128)
#define EXPERT_REGS_q6_k
#endif

// gemm_tc_experts: 64 registers of A fragments; 128 keeps four 4-warp blocks an SM (their
// shared sums, 32 KB a block, allow seven).
#ifndef KERNEL_EMULATION
#define GEMM_EXPERT_REGS __maxnreg__(128)
#else
#define GEMM_EXPERT_REGS
#endif

// A grouped expert kernel NAME (registers capped by REGS) running the device function given
// after them: the signature ops::launch_experts passes.
#define EXPERT_KERNEL(REGS, NAME, ...)                                                              \
    extern "C" __global__ void REGS NAME(const u64* table, float* y, const u64* table_b, float* y_b, \
                                         const int* active, const int* offsets, const int* order,    \
                                         long row_bytes, const u16* xh, const float* xscale, int N,  \
                                         int K, int col_div, int chains) {                           \
        GRID_PROLOGUE();                                                                            \
        __VA_ARGS__(table, y, table_b, y_b, active, offsets, order, row_bytes, xh, xscale, N, K,    \
                    col_div, chains);                                                               \
    }

// gemv_tc8_*: up to 8 tokens, gemv_tc16_*: up to 16, a tile per block; gemv_tcs*: stream-K (the
// kernel bench's comparison).
#define TC_KERNEL(NAME, F)                                                                        \
    extern "C" __global__ void TC8_REGS_##NAME gemv_tc8_##NAME(                                   \
        const u8* W, long row_bytes, const u16* xh, const float* xscale, float* y, float* y2,     \
        int split, int N, int K, int T) {                                                         \
        gemv_tc<F, 1>(W, row_bytes, xh, xscale, y, y2, split, N, K, T, blockIdx.x, nullptr, 1, blockDim.x >> 5); \
    }                                                                                             \
    extern "C" __global__ void TCS_REGS gemv_tcs8_##NAME(                                         \
        const u8* W, long row_bytes, const u16* xh, const float* xscale, float* y, float* y2,     \
        int split, int N, int K, int T, float* partials, int max_pieces) {                        \
        gemv_tcs<F, 1>(W, row_bytes, xh, xscale, y, y2, split, N, K, T, partials, max_pieces);    \
    }                                                                                             \
    extern "C" __global__ void TCS_REGS gemv_tcs16_##NAME(                                        \
        const u8* W, long row_bytes, const u16* xh, const float* xscale, float* y, float* y2,     \
        int split, int N, int K, int T, float* partials, int max_pieces) {                        \
        gemv_tcs<F, 2>(W, row_bytes, xh, xscale, y, y2, split, N, K, T, partials, max_pieces);    \
    }                                                                                             \
    extern "C" __global__ void gemv_tc16_##NAME(const u8* W, long row_bytes, const u16* xh,       \
                                                const float* xscale, float* y, float* y2,         \
                                                int split, int N, int K, int T) {                 \
        gemv_tc<F, 2>(W, row_bytes, xh, xscale, y, y2, split, N, K, T, blockIdx.x, nullptr, 1, blockDim.x >> 5); \
    }                                                                                             \
    EXPERT_KERNEL(EXPERT_REGS_##NAME, gemv_tc_experts_##NAME, gemv_tc_experts<F>)               \
    EXPERT_KERNEL(GEMM_EXPERT_REGS, gemm_tc_experts_##NAME, gemm_tc_experts<F>)

TC_KERNEL(q4_k, FMT_Q4_K)
TC_KERNEL(q6_k, FMT_Q6_K)

// Activation block w (256 values, value(i) its i-th) → xh[256·w..] f16 in the tensor-core GEMV's
// k order, scaled by the power of two xscale[w] that puts its largest magnitude below 2^14. One
// warp per block; lane l writes the block's halves 8l..8l+7.
template <class Value>
__device__ __forceinline__ void to_f16_tc_block(Value value, u16* xh, float* xscale, long w) {
    int lane = threadIdx.x & 31;
    float v[8];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int r = 8 * lane + i, q = (r >> 3) & 3, idx = 8 * (r >> 5) + (r & 7), mi = idx >> 2, slot = idx & 3;
        int base = 128 * (q >> 1) + 32 * (mi & 3) + 16 * (q & 1) + 4 * (mi >> 2);
        v[i] = value(base + (slot == 0 ? 0 : slot == 1 ? 2 : slot == 2 ? 1 : 3));
        amax = fmaxf(amax, fabsf(v[i]));
    }
    amax = warp_max(amax);
    int e = 0;
    if (amax > 0.0f && amax <= 3.0e38f) frexpf(amax, &e);
    e = max(e, -100);  // keeps 2^(14-e) finite
    float inv = ldexpf(1.0f, 14 - e);
    if (lane == 0) xscale[w] = ldexpf(1.0f, e - 14);
    u32 h[4];
#pragma unroll
    for (int i = 0; i < 4; i++) h[i] = (u32)f32_to_f16(v[2 * i] * inv) | ((u32)f32_to_f16(v[2 * i + 1] * inv) << 16);
    ((uint4*)(xh + 256 * w))[lane] = make_uint4(h[0], h[1], h[2], h[3]);
}

// x [T, K] f32 → xh [T, K] and xscale [T, K / 256] (to_f16_tc_block).
extern "C" __global__ void to_f16_tc(const float* x, u16* xh, float* xscale, long blocks) {
    GRID_PROLOGUE();
    long w = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (w >= blocks) return;
    const float* xb = x + 256 * w;
    to_f16_tc_block([&](int i) { return xb[i]; }, xh, xscale, w);
}

// to_f16_tc of silu(g) * u (SwiGLU, the values silu_mul writes), for the MLP's down product.
extern "C" __global__ void silu_mul_to_f16_tc(const float* g, const float* u, u16* xh, float* xscale,
                                              long blocks) {
    GRID_PROLOGUE();
    long w = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (w >= blocks) return;
    const float *gb = g + 256 * w, *ub = u + 256 * w;
    to_f16_tc_block([&](int i) { return silu(gb[i]) * ub[i]; }, xh, xscale, w);
}

// out[i..i+4) = bf16 of value(i..i+4) clipped to n, for thread i / 4: one 16-byte load of each
// f32 input and one 8-byte store when x, out and n allow (a thread a value, with scalar loads,
// ran at under a third of the copy bandwidth on prefill's activations).
template <class Value>
__device__ __forceinline__ void bf16_quad(Value value, const float* x, const float* x2, u16* out, long n) {
    long i = 4 * ((long)blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n) return;
    bool vec = i + 4 <= n && (((unsigned long long)x | (unsigned long long)x2) & 15) == 0 &&
               ((unsigned long long)out & 7) == 0;
    if (vec) {
        float4 a = *(const float4*)(x + i), b = x2 ? *(const float4*)(x2 + i) : a;
        uint2 o;
        o.x = (u32)f32_to_bf16(value(a.x, b.x)) | ((u32)f32_to_bf16(value(a.y, b.y)) << 16);
        o.y = (u32)f32_to_bf16(value(a.z, b.z)) | ((u32)f32_to_bf16(value(a.w, b.w)) << 16);
        *(uint2*)(out + i) = o;
        return;
    }
    for (long j = i; j < n && j < i + 4; j++) out[j] = f32_to_bf16(value(x[j], x2 ? x2[j] : x[j]));
}

// f32 → bf16 (activations for the cuBLAS GEMM), four values a thread.
extern "C" __global__ void to_bf16(const float* x, u16* out, long n) {
    GRID_PROLOGUE();
    bf16_quad([](float a, float) { return a; }, x, nullptr, out, n);
}

// bf16 of silu(g) · u (the values silu_mul writes), the down product's cuBLAS input, four
// values a thread.
extern "C" __global__ void silu_mul_to_bf16(const float* g, const float* u, u16* out, long n) {
    GRID_PROLOGUE();
    bf16_quad([](float a, float b) { return silu(a) * b; }, g, u, out, n);
}

// ---------------------------------------------------------------------------------------------
// Norms and elementwise ops

// o = xr * rsqrt(mean(xr²) + eps) * w for one row, by the whole block (o may alias xr). Rows of
// a multiple of 4 go by float4 (a hidden-size row in one or two loads per thread: a loop of
// dependent scalar loads made the one-row norm of decode cost 18 µs). Thread i reads exactly
// the values a float4 (or scalar) loop of stride blockDim.x gives it.
// With `ob`, the row's bf16 too (cuBLAS's input: the bits of to_bf16 of o).
__device__ __forceinline__ void rms_norm_row(const float* xr, const float* w, float* o, int d, float eps,
                                             u16* ob = nullptr) {
    float ss = 0.0f;
    if ((d & 3) == 0) {
        const float4* x4 = (const float4*)xr;
        for (int i = threadIdx.x; i < d / 4; i += blockDim.x) {
            float4 v = x4[i];
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        float inv = rsqrtf(block_sum(ss) / (float)d + eps);
        for (int i = threadIdx.x; i < d / 4; i += blockDim.x) {
            float4 v = x4[i], g = ((const float4*)w)[i];
            float4 r = make_float4(v.x * inv * g.x, v.y * inv * g.y, v.z * inv * g.z, v.w * inv * g.w);
            ((float4*)o)[i] = r;
            if (ob)
                ((uint2*)ob)[i] = make_uint2((u32)f32_to_bf16(r.x) | ((u32)f32_to_bf16(r.y) << 16),
                                             (u32)f32_to_bf16(r.z) | ((u32)f32_to_bf16(r.w) << 16));
        }
        return;
    }
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
    float inv = rsqrtf(block_sum(ss) / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        o[i] = xr[i] * inv * w[i];
        if (ob) ob[i] = f32_to_bf16(o[i]);
    }
}

// out[r] = x[r] * rsqrt(mean(x[r]²) + eps) * w, one block per row (out may alias x).
extern "C" __global__ void rms_norm(const float* x, const float* w, float* out, int d, float eps) {
    GRID_PROLOGUE();
    rms_norm_row(x + (long)blockIdx.x * d, w, out + (long)blockIdx.x * d, d, eps);
}

// The residual add and the next norm in one launch: x[r] += y[r], then out[r] = rms_norm(x[r])
// · w, with the bits of add_in_place then rms_norm (each thread adds the values it then reads).
// One block per row; out must not alias x or y.
// xr += yr for one row, by the whole block, each thread adding the values rms_norm_row then
// gives it.
__device__ __forceinline__ void add_row(float* xr, const float* yr, int d) {
    if ((d & 3) == 0) {
        for (int i = threadIdx.x; i < d / 4; i += blockDim.x) {
            float4 a = ((float4*)xr)[i], b = ((const float4*)yr)[i];
            ((float4*)xr)[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
        }
    } else {
        for (int i = threadIdx.x; i < d; i += blockDim.x) xr[i] += yr[i];
    }
}

extern "C" __global__ void add_rms_norm(float* x, const float* y, const float* w, float* out, int d, float eps) {
    GRID_PROLOGUE();
    float* xr = x + (long)blockIdx.x * d;
    add_row(xr, y + (long)blockIdx.x * d, d);
    rms_norm_row(xr, w, out + (long)blockIdx.x * d, d, eps);
}

// add_rms_norm, then to_f16_tc of each out row, in one launch: the block's warps convert the
// row's 256-value blocks once the row is written (the bits of the two kernels). d is a multiple
// of 256.
extern "C" __global__ void add_rms_norm_to_f16_tc(float* x, const float* y, const float* w, float* out, u16* xh,
                                                  float* xscale, int d, float eps) {
    GRID_PROLOGUE();
    float *xr = x + (long)blockIdx.x * d, *o = out + (long)blockIdx.x * d;
    add_row(xr, y + (long)blockIdx.x * d, d);
    rms_norm_row(xr, w, o, d, eps);
    __syncthreads();  // the row is written
    int per_row = d >> 8;
    for (int b = threadIdx.x >> 5; b < per_row; b += blockDim.x >> 5) {
        const float* ob = o + 256 * b;
        to_f16_tc_block([&](int i) { return ob[i]; }, xh, xscale, (long)blockIdx.x * per_row + b);
    }
}

// add_rms_norm, each out row also in bf16 (ob, cuBLAS's input: the bits of to_bf16 of out).
extern "C" __global__ void add_rms_norm_to_bf16(float* x, const float* y, const float* w, float* out, u16* ob,
                                                int d, float eps) {
    GRID_PROLOGUE();
    float* xr = x + (long)blockIdx.x * d;
    add_row(xr, y + (long)blockIdx.x * d, d);
    rms_norm_row(xr, w, out + (long)blockIdx.x * d, d, eps, ob + (long)blockIdx.x * d);
}

// The GDN output norm: w * rms_norm(x) * silu(z), one warp per row of d (a head: 128 values,
// four a lane, no block barrier; a block a row with its two barriers kept a 2,048-token pass's
// 65,536 rows at a third of the bandwidth); with `ob`, also in bf16 (the bits of to_bf16 of out).
__device__ __forceinline__ void rms_norm_gated_row(const float* x, const float* z, const float* w, float* out,
                                                   u16* ob, int rows, int d, float eps) {
    int lane = threadIdx.x & 31;
    long row = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;  // the whole warp
    long base = row * d;
    float ss = 0.0f;
    for (int i = lane; i < d; i += 32) ss += x[base + i] * x[base + i];
    float inv = rsqrtf(warp_sum(ss) / (float)d + eps);
    for (int i = lane; i < d; i += 32) {
        float o = w[i] * (x[base + i] * inv) * silu(z[base + i]);
        out[base + i] = o;
        if (ob) ob[base + i] = f32_to_bf16(o);
    }
}

extern "C" __global__ void rms_norm_gated(const float* x, const float* z, const float* w, float* out, int rows,
                                          int d, float eps) {
    GRID_PROLOGUE();
    rms_norm_gated_row(x, z, w, out, nullptr, rows, d, eps);
}

extern "C" __global__ void rms_norm_gated_to_bf16(const float* x, const float* z, const float* w, float* out,
                                                  u16* ob, int rows, int d, float eps) {
    GRID_PROLOGUE();
    rms_norm_gated_row(x, z, w, out, ob, rows, d, eps);
}

extern "C" __global__ void add_in_place(float* x, const float* y, long n) {
    GRID_PROLOGUE();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// g = silu(g) * u (SwiGLU).
extern "C" __global__ void silu_mul(float* g, const float* u, long n) {
    GRID_PROLOGUE();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] = silu(g[i]) * u[i];
}

// x[t, :] *= sigmoid(g[t]) (the shared-expert gate): one block per row.
extern "C" __global__ void scale_rows_sigmoid(float* x, const float* g, int d) {
    GRID_PROLOGUE();
    float s = sigmoid(g[blockIdx.x]);
    for (int i = threadIdx.x; i < d; i += blockDim.x) x[(long)blockIdx.x * d + i] *= s;
}

// out[i, :] = x[idx[i], :].
extern "C" __global__ void gather_rows(const float* x, const int* idx, float* out, int d) {
    GRID_PROLOGUE();
    const float* src = x + (long)idx[blockIdx.x] * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) out[(long)blockIdx.x * d + i] = src[i];
}

// out[idx[i], :] += w[i] * y[i, :] (rows of idx are distinct within one launch).
extern "C" __global__ void scatter_add_rows(const float* y, const int* idx, const float* w, float* out, int d) {
    GRID_PROLOGUE();
    float* dst = out + (long)idx[blockIdx.x] * d;
    float s = w[blockIdx.x];
    for (int i = threadIdx.x; i < d; i += blockDim.x) dst[i] += s * y[(long)blockIdx.x * d + i];
}

// ---------------------------------------------------------------------------------------------
// Mixture of experts on the device (few tokens: decode, verify blocks, batched passes). Pair
// p = t·k + j is token t's j-th expert; the expert products are gemv_tc_experts_* above.

// The router of one token per block (E ≤ 1024 experts): softmax over its logits, the top_k most
// probable experts (ties: the lower index first), their probabilities renormalised to sum 1,
// summed in that order (as ffn.rs::route). ids, weights [T, top_k].
// Threads of a moe_route block, the most experts a token keeps, and the experts a thread holds.
#define MOE_ROUTE_THREADS 256
#define MOE_TOP_K_MAX 32
#define MOE_PER_THREAD (1024 / MOE_ROUTE_THREADS)

// The best (largest value, then lowest id) of the warp's candidates v[k], id[k] (k < n, each
// lane its own), to every lane; the lane that held it takes it out (value −inf).
__device__ __forceinline__ void warp_best(float* v, int* id, int n, float* best_v, int* best_i, int* best_k) {
    float bv = NEG_INF;
    int bi = 0x7fffffff, bk = -1;
    for (int k = 0; k < n; k++)
        if (v[k] > bv || (v[k] == bv && id[k] < bi)) {
            bv = v[k];
            bi = id[k];
            bk = k;
        }
    int owner = threadIdx.x & 31;
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        int oo = __shfl_xor_sync(0xffffffffu, owner, o);
        if (ov > bv || (ov == bv && oi < bi)) {
            bv = ov;
            bi = oi;
            owner = oo;
        }
    }
    if ((threadIdx.x & 31) == owner && bk >= 0) v[bk] = NEG_INF;
    *best_v = bv;
    *best_i = bi;
    *best_k = bk;
}

extern "C" __global__ void moe_route(const float* logits, int* ids, float* weights, int E, int top_k) {
    GRID_PROLOGUE();
    __shared__ float p[1024];
    const float* l = logits + (long)blockIdx.x * E;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    float m = NEG_INF;
    for (int e = threadIdx.x; e < E; e += blockDim.x) m = fmaxf(m, l[e]);
    m = block_max(m);
    float s = 0.0f;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        p[e] = expf(l[e] - m);
        s += p[e];
    }
    s = block_sum(s);
    for (int e = threadIdx.x; e < E; e += blockDim.x) p[e] /= s;
    __syncthreads();
    int* out_i = ids + (long)blockIdx.x * top_k;
    float* out_w = weights + (long)blockIdx.x * top_k;
    // Each warp's top_k of its experts (e = threadIdx.x, + blockDim.x, ...), then warp 0's top_k
    // of those: the block's top_k in order, with no block-wide round per expert chosen.
    __shared__ float cand_v[MOE_ROUTE_THREADS / 32 * MOE_TOP_K_MAX];
    __shared__ int cand_i[MOE_ROUTE_THREADS / 32 * MOE_TOP_K_MAX];
    float mine_v[MOE_PER_THREAD];
    int mine_i[MOE_PER_THREAD];
#pragma unroll
    for (int k = 0; k < MOE_PER_THREAD; k++) {
        int e = threadIdx.x + k * blockDim.x;
        mine_v[k] = e < E ? p[e] : NEG_INF;
        mine_i[k] = e < E ? e : E;
    }
    for (int j = 0; j < top_k; j++) {
        float bv;
        int bi, bk;
        warp_best(mine_v, mine_i, MOE_PER_THREAD, &bv, &bi, &bk);
        if (lane == 0) {
            cand_v[warp * top_k + j] = bv;
            cand_i[warp * top_k + j] = bi;
        }
    }
    __syncthreads();
    if (warp == 0) {
        float v[MOE_ROUTE_THREADS / 32 * MOE_TOP_K_MAX / 32];
        int id[MOE_ROUTE_THREADS / 32 * MOE_TOP_K_MAX / 32];
        int n = warps * top_k;
#pragma unroll
        for (int k = 0; k < MOE_ROUTE_THREADS / 32 * MOE_TOP_K_MAX / 32; k++) {
            int c = lane + 32 * k;
            v[k] = c < n ? cand_v[c] : NEG_INF;
            id[k] = c < n ? cand_i[c] : E;
        }
        for (int j = 0; j < top_k; j++) {
            float bv;
            int bi, bk;
            warp_best(v, id, MOE_ROUTE_THREADS / 32 * MOE_TOP_K_MAX / 32, &bv, &bi, &bk);
            if (lane == 0) {
                out_i[j] = bi;
                out_w[j] = bv;
            }
        }
    }
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int j = 0; j < top_k; j++) sum += out_w[j];
        for (int j = 0; j < top_k; j++) out_w[j] /= sum;
    }
}

// The slots of a MoE layer's active experts, from thread e's count c of expert e's pairs (one
// block, a thread an expert, E ≤ 1024): the active experts in increasing order (active[a]; -1
// after the last, up to `slots`), offsets[a], offsets[a + 1] bounding their pairs in `order`.
// Returns where expert e's pairs start.
static __device__ int group_slots(int c, int E, int slots, int* active, int* offsets) {
    __shared__ int warp_pairs[32], warp_active[32], total[2];
    int e = threadIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // Exclusive scans over the experts of the pair counts (where an expert's pairs start) and of
    // the active flags (its slot).
    int on = c > 0, cs = c, os = on;
    for (int o = 1; o < 32; o <<= 1) {
        int uc = __shfl_up_sync(0xffffffffu, cs, o), uo = __shfl_up_sync(0xffffffffu, os, o);
        if (lane >= o) {
            cs += uc;
            os += uo;
        }
    }
    if (lane == 31) {
        warp_pairs[warp] = cs;
        warp_active[warp] = os;
    }
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x >> 5;
        int wc = lane < nw ? warp_pairs[lane] : 0, wo = lane < nw ? warp_active[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            int uc = __shfl_up_sync(0xffffffffu, wc, o), uo = __shfl_up_sync(0xffffffffu, wo, o);
            if (lane >= o) {
                wc += uc;
                wo += uo;
            }
        }
        if (lane < nw) {
            warp_pairs[lane] = wc;  // inclusive: the pairs and active experts up to warp `lane`
            warp_active[lane] = wo;
        }
        if (lane == nw - 1) {
            total[0] = wc;
            total[1] = wo;
        }
    }
    __syncthreads();
    int before_p = cs - c + (warp > 0 ? warp_pairs[warp - 1] : 0);
    int before_a = os - on + (warp > 0 ? warp_active[warp - 1] : 0);
    if (on) {
        active[before_a] = e;
        offsets[before_a] = before_p;
    }
    // After the last active expert: -1 up to `slots`, each bounding no pairs.
    int used = total[1], all = total[0];
    if (threadIdx.x == 0) offsets[used] = all;
    for (int i = used + threadIdx.x; i < slots; i += blockDim.x) {
        active[i] = -1;
        offsets[i + 1] = all;
    }
    return before_p;
}

// The pairs of a MoE layer grouped by expert for gemv_tc_experts: the slots (group_slots) and
// in `order` each expert's pairs in increasing order. One block of 1,024 threads, E ≤ 1024; for
// up to 1,024 pairs (decode steps, verify blocks, short passes: ops::moe_route gives longer
// passes moe_group_counts, moe_group_slots and moe_group_scatter).
extern "C" __global__ void moe_group(const int* ids, int pairs, int E, int slots, int* active, int* offsets,
                                     int* order) {
    GRID_PROLOGUE();
    __shared__ int count[1024];
    int e = threadIdx.x;
    if (e < E) count[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) atomicAdd(&count[ids[p]], 1);
    __syncthreads();
    int c = e < E ? count[e] : 0, on = c > 0;
    int before_p = group_slots(c, E, slots, active, offsets);
    // Each active expert's thread lists its pairs in order, over the pairs staged a block at a
    // time in shared memory: O(pairs) a thread (counting each pair's earlier ones was
    // O(pairs²) over the block, a 2,048-token prefill chunk's 16,384 pairs included).
    __shared__ int stage[1024];
    int next = before_p;
    for (int p0 = 0; p0 < pairs; p0 += blockDim.x) {
        int n = min((int)blockDim.x, pairs - p0);
        __syncthreads();
        if (threadIdx.x < n) stage[threadIdx.x] = ids[p0 + threadIdx.x];
        __syncthreads();
        if (on)
            for (int i = 0; i < n; i++)
                if (stage[i] == e) order[next++] = p0 + i;
    }
}

// A prefill pass's grouping (moe_group's result for thousands of pairs, over many blocks), in
// three launches: each chunk of MOE_GROUP_CHUNK pairs counts its pairs per expert into
// counts [chunks, E]; one block sums them, writes the slots and turns counts into each chunk's
// first position per expert; each chunk writes its pairs there in order.
#define MOE_GROUP_CHUNK 256

extern "C" __global__ void moe_group_counts(const int* ids, int pairs, int E, int* counts) {
    GRID_PROLOGUE();
    __shared__ int hist[1024];
    for (int e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
    __syncthreads();
    int p = blockIdx.x * MOE_GROUP_CHUNK + threadIdx.x;
    if (threadIdx.x < MOE_GROUP_CHUNK && p < pairs) atomicAdd(&hist[ids[p]], 1);
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) counts[(long)blockIdx.x * E + e] = hist[e];
}

// One block of 1,024 threads, a thread an expert.
extern "C" __global__ void moe_group_slots(int* counts, int chunks, int E, int slots, int* active, int* offsets) {
    GRID_PROLOGUE();
    int e = threadIdx.x, c = 0;
    if (e < E)
        for (int i = 0; i < chunks; i++) {
            int n = counts[(long)i * E + e];
            counts[(long)i * E + e] = c;
            c += n;
        }
    int start = group_slots(c, E, slots, active, offsets);
    if (e < E)
        for (int i = 0; i < chunks; i++) counts[(long)i * E + e] += start;
}

// A block a chunk, MOE_GROUP_CHUNK threads: a pair's place is its chunk's first for its expert
// plus the chunk's earlier pairs of that expert.
extern "C" __global__ void moe_group_scatter(const int* ids, int pairs, int E, const int* counts, int* order) {
    GRID_PROLOGUE();
    __shared__ int stage[MOE_GROUP_CHUNK];
    int p0 = blockIdx.x * MOE_GROUP_CHUNK, t = threadIdx.x, n = min(MOE_GROUP_CHUNK, pairs - p0);
    if (t < n) stage[t] = ids[p0 + t];
    __syncthreads();
    if (t >= n) return;
    int id = stage[t], rank = 0;
    for (int i = 0; i < t; i++) rank += stage[i] == id;
    order[counts[(long)blockIdx.x * E + id] + rank] = p0 + t;
}

// out[t, :] = out[t, :] · sigmoid(gate[t]) (without a gate: as it is) + Σ_j w[t, j] · y[t·k + j, :],
// the experts added in order j.
extern "C" __global__ void moe_combine(const float* y, const float* w, float* out, const float* gate, int top_k,
                                       int d) {
    GRID_PROLOGUE();
    // Block (t, c) takes values c·blockDim.x .. of token t: one value a thread, so the top_k
    // loads of each are in flight together (a block a token walked its values in turn).
    int chunks = (d + blockDim.x - 1) / blockDim.x;
    long t = blockIdx.x / chunks;
    // The shared expert's gate first, as scale_rows_sigmoid applies it.
    float s = gate ? sigmoid(gate[t]) : 1.0f;
    int i0 = blockIdx.x % chunks * blockDim.x;
    for (int i = i0 + threadIdx.x; i < min(d, i0 + (int)blockDim.x); i += blockDim.x) {
        float acc = gate ? out[t * d + i] * s : out[t * d + i];
        for (int j = 0; j < top_k; j++) acc += w[t * top_k + j] * y[(t * top_k + j) * d + i];
        out[t * d + i] = acc;
    }
}

// ---------------------------------------------------------------------------------------------
// Gated attention

// The q_proj output is per head [q(D) | gate(D)]: split it into q [rows, D] and gate [rows, D].
extern "C" __global__ void split_q_gate(const float* qg, float* q, float* gate, int d) {
    GRID_PROLOGUE();
    long r = blockIdx.x;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        q[r * d + i] = qg[r * 2 * d + i];
        gate[r * d + i] = qg[r * 2 * d + d + i];
    }
}

// A pass's first position: pos0, plus the int at pos_at when it is set (a captured graph
// replayed at many positions reads it from there).
__device__ __forceinline__ int position(int pos0, const int* pos_at) { return pos_at ? pos0 + *pos_at : pos0; }

// Partial NeoX RoPE on x [T, heads, d]: dim j < rot/2 pairs with j + rot/2. One block per
// (token, head).
__device__ __forceinline__ void rope_row(float* h, const float* inv_freq, int rot, int pos) {
    int half = rot / 2;
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        float angle = (float)pos * inv_freq[j];
        float c = cosf(angle), s = sinf(angle);
        float a = h[j], b = h[j + half];
        h[j] = a * c - b * s;
        h[j + half] = b * c + a * s;
    }
}

extern "C" __global__ void rope(float* x, const float* inv_freq, int heads, int d, int rot, int pos0,
                                const int* pos_at) {
    GRID_PROLOGUE();
    int t = blockIdx.x / heads;
    rope_row(x + (long)blockIdx.x * d, inv_freq, rot, position(pos0, pos_at) + t);
}

// Up to ATTN_SLOTS sequences of an attention layer's pass, by value in a kernel's parameters (a
// captured graph keeps them): sequence i has rows off[i] .. off[i] + n[i] - 1 of the pass, its
// first position pos0[i] (plus *pos_at[i] when that is not null, see `position`) and its caches
// kc/ks (keys, int8 scales) and vc/vs (values).
#define ATTN_SLOTS 16
struct AttnSlots {
    u64 kc[ATTN_SLOTS], ks[ATTN_SLOTS], vc[ATTN_SLOTS], vs[ATTN_SLOTS], pos_at[ATTN_SLOTS];
    int pos0[ATTN_SLOTS], off[ATTN_SLOTS], n[ATTN_SLOTS];
};

__device__ __forceinline__ int slot_position(const AttnSlots& s, int i) {
    return position(s.pos0[i], (const int*)s.pos_at[i]);
}

// RoPE of every sequence's query rows q [T, hq, d] and key rows k [T, hkv, d] at its own
// positions: `per` = (hq + hkv) · its most tokens blocks a sequence, one per (token, head).
extern "C" __global__ void rope_seqs(float* q, float* k, const float* inv_freq, int hq, int hkv, int d, int rot,
                                     AttnSlots s, int per) {
    GRID_PROLOGUE();
    int i = blockIdx.x / per, b = blockIdx.x % per, heads = hq + hkv;
    int t = b / heads, h = b % heads;
    if (t >= s.n[i]) return;
    long row = s.off[i] + t;
    float* x = h < hq ? q + (row * hq + h) * d : k + (row * hkv + h - hq) * d;
    rope_row(x, inv_freq, rot, slot_position(s, i) + t);
}

// KV cache formats (src/cpu/kv.rs): 0 f32, 1 bf16, 2 int8 with one f32 scale per row.
#define KV_F32 0
#define KV_BF16 1
#define KV_INT8 2

// Appends rows x [T, hkv, d] at position pos0 (row pos0·hkv) of the cache. One block per row.
// Row xr [d] into cache row r (by the whole block).
__device__ __forceinline__ void kv_append_row(const float* xr, u8* cache, float* scales, int fmt, int d, long r) {
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

extern "C" __global__ void kv_append(const float* x, u8* cache, float* scales, int fmt, int d, int hkv, int pos0,
                                     const int* pos_at) {
    GRID_PROLOGUE();
    long r = (long)position(pos0, pos_at) * hkv + blockIdx.x;
    kv_append_row(x + (long)blockIdx.x * d, cache, scales, fmt, d, r);
}

// The key rows k and value rows v [T, hkv, d] of every sequence appended to its own caches at
// its positions: `per` = 2 · hkv · its most tokens blocks a sequence (keys, then values), one
// per (token, head).
extern "C" __global__ void kv_append_seqs(const float* k, const float* v, int fmt, int d, int hkv, AttnSlots s,
                                          int per) {
    GRID_PROLOGUE();
    int i = blockIdx.x / per, b = blockIdx.x % per, half = per / 2;
    bool value = b >= half;
    int local = b % half, t = local / hkv;
    if (t >= s.n[i]) return;
    long r = (long)(slot_position(s, i) + t) * hkv + local % hkv;
    const float* xr = (value ? v : k) + ((long)s.off[i] * hkv + local) * d;
    kv_append_row(xr, (u8*)(value ? s.vc[i] : s.kc[i]), (float*)(value ? s.vs[i] : s.ks[i]), fmt, d, r);
}

// Head dims per lane of a warp; a head dim that is not a multiple of 32 (small drafts) leaves
// the last lanes' extra dims idle (IN_HEAD folds to true otherwise).
#define HEAD_DPL ((HEAD_DIM + 31) / 32)
#define IN_HEAD(i) (HEAD_DIM % 32 == 0 || (i) < HEAD_DIM)

__device__ __forceinline__ void kv_load(const u8* cache, const float* scales, int fmt, long r, int i0, float* out) {
    if (HEAD_DPL == 8 && HEAD_DIM % 32 == 0) {
        // Eight dims a lane (head dim 256): one vector load instead of eight.
        long e = r * HEAD_DIM + i0;
        if (fmt == KV_INT8) {
            uint2 w = *(const uint2*)((const i8*)cache + e);
            float s = scales[r];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                out[i] = (float)(i8)(w.x >> (8 * i)) * s;
                out[4 + i] = (float)(i8)(w.y >> (8 * i)) * s;
            }
        } else if (fmt == KV_BF16) {
            uint4 w = *(const uint4*)((const u16*)cache + e);
            u32 ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                out[2 * i] = bf16_to_f32(ws[i] & 0xffffu);
                out[2 * i + 1] = bf16_to_f32(ws[i] >> 16);
            }
        } else {
            float4 a = *(const float4*)((const float*)cache + e), b = *(const float4*)((const float*)cache + e + 4);
            out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
            out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
        }
        return;
    }
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

// Keys a warp of `attend` loads at once: their loads are in flight together, where one key at
// a time waited a memory latency per key (a 1K-context decode block walked 256 keys a warp).
#define ATTN_UNROLL 4

// Attention of query row `row` (token, query head) of q [T, hq, HEAD_DIM] over cache rows
// [lo, hi) of [S, hkv, HEAD_DIM], by the whole block: each warp runs an online softmax over
// runs of ATTN_UNROLL keys (warp w takes keys lo + ATTN_UNROLL·(w + ATTN_WARPS·i) + u), lane i
// holding dims [i·DPL, (i+1)·DPL); the warps are then merged. The order of the sums depends
// only on [lo, hi), so a row gets the same bits in any pass.
// Writes dst[i] = Σ_j e_j · v_j (relative to the block's max), divided by the sum when
// `normalise`; otherwise thread 0 also writes the max and the sum to *m_out and *l_out.
__device__ void attend(const float* q, const u8* kc, const float* ks, const u8* vc, const float* vs,
                       int fmt, int row, int hq, int hkv, int lo, int hi, float scale, float* dst,
                       bool normalise, float* m_out, float* l_out) {
    const int DPL = HEAD_DPL;
    int h = row % hq, kvh = h / (hq / hkv);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float* qv = q + (long)row * HEAD_DIM + lane * DPL;
    float qr[DPL], acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        qr[i] = IN_HEAD(lane * DPL + i) ? qv[i] : 0.0f;
        acc[i] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    for (int j0 = lo + ATTN_UNROLL * warp; j0 < hi; j0 += ATTN_UNROLL * ATTN_WARPS) {
        float kr[ATTN_UNROLL][DPL], vr[ATTN_UNROLL][DPL], sc[ATTN_UNROLL];
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; u++) {
            if (j0 + u < hi) {
                long r = (long)(j0 + u) * hkv + kvh;
                kv_load(kc, ks, fmt, r, lane * DPL, kr[u]);
                kv_load(vc, vs, fmt, r, lane * DPL, vr[u]);
            } else {
#pragma unroll
                for (int i = 0; i < DPL; i++) kr[u][i] = vr[u][i] = 0.0f;
            }
        }
        // Key j0 is in range, so the new max is finite; keys past hi score −inf (weight 0).
        float m2 = m;
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; u++) {
            float p = 0.0f;
#pragma unroll
            for (int i = 0; i < DPL; i++) p += qr[i] * kr[u][i];
            sc[u] = j0 + u < hi ? warp_sum(p) * scale : NEG_INF;
            m2 = fmaxf(m2, sc[u]);
        }
        float corr = expf(m - m2);
        l *= corr;
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[i] *= corr;
#pragma unroll
        for (int u = 0; u < ATTN_UNROLL; u++) {
            float e = expf(sc[u] - m2);
            l += e;
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[i] += e * vr[u][i];
        }
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
                                     const int* pos_at, float scale, int block, int window) {
    GRID_PROLOGUE();
    int lo, hi;
    key_range(blockIdx.x / hq, position(pos0, pos_at), block, window, &lo, &hi);
    attend(q, kc, ks, vc, vs, fmt, blockIdx.x, hq, hkv, lo, hi, scale, out + (long)blockIdx.x * HEAD_DIM,
           true, nullptr, nullptr);
}

// Keys per chunk of the split attention below.
#define ATTN_CHUNK 256

// Split attention for a few query rows over a long context (flash-decoding): block
// (row, chunk c) attends to the keys of its row's range that fall in
// [c·ATTN_CHUNK, (c+1)·ATTN_CHUNK), and writes its max, sum and unnormalised output to
// part[row, c, 0 | 1 | 2..]; attention_combine merges the chunks in order. The chunks are
// fixed by position, so a query's result depends only on its own key range: a verify block
// gives each row what token-by-token decoding gives. 1-D grid, chunk-major: block = c · rows +
// row, so the blocks running at once read a few chunks of keys, which stay in L2 for all the
// rows (row-major, they spanned the whole context: at 32K that no longer fits L2, and every
// row of a verify block read its keys from memory again). With a window, the chunks start at
// the one holding the first query's first key (the keys before it are outside every query's
// window), so a sliding layer's launch covers its window, not the whole context.
extern "C" __global__ void attention_part(const float* q, const u8* kc, const float* ks, const u8* vc,
                                          const float* vs, float* part, int fmt, int hq, int hkv, int pos0,
                                          const int* pos_at, float scale, int block, int window, int nchunks) {
    GRID_PROLOGUE();
    int rows = gridDim.x / nchunks, row = blockIdx.x % rows, c = blockIdx.x / rows;
    int pos = position(pos0, pos_at), lo, hi;
    key_range(row / hq, pos, block, window, &lo, &hi);
    int first = window > 0 ? max(0, pos - window + 1) / ATTN_CHUNK : 0, at = (first + c) * ATTN_CHUNK;
    float* dst = part + ((long)row * nchunks + c) * (HEAD_DIM + 2);
    attend(q, kc, ks, vc, vs, fmt, row, hq, hkv, max(lo, at), min(hi, at + ATTN_CHUNK), scale, dst + 2, false,
           dst, dst + 1);
}

// Split attention of every sequence's rows (causal, no window: the target's layers) over its
// own caches: block (chunk c, sequence i, row) as attention_part's, `rows` = hq · the most
// tokens of a sequence, writing part[i, row, c]. Every sequence takes `nchunks` chunks, the most
// any needs: past its keys a chunk is empty (max −inf), which attention_combine skips, so each
// row gets the bits of its sequence's own launch.
extern "C" __global__ void attention_part_seqs(const float* q, float* part, int fmt, int hq, int hkv, float scale,
                                               AttnSlots s, int rows, int nchunks) {
    GRID_PROLOGUE();
    int seqs = gridDim.x / (rows * nchunks);
    int c = blockIdx.x / (seqs * rows), i = blockIdx.x / rows % seqs, row = blockIdx.x % rows;
    if (row >= s.n[i] * hq) return;
    int lo, hi;
    key_range(row / hq, slot_position(s, i), 0, 0, &lo, &hi);
    float* dst = part + (((long)i * rows + row) * nchunks + c) * (HEAD_DIM + 2);
    if (max(lo, c * ATTN_CHUNK) >= min(hi, (c + 1) * ATTN_CHUNK)) {
        // No key of this chunk (a sequence shorter than the longest): its max alone, −inf.
        if (threadIdx.x == 0) dst[0] = NEG_INF;
        return;
    }
    attend(q + (long)s.off[i] * hq * HEAD_DIM, (const u8*)s.kc[i], (const float*)s.ks[i], (const u8*)s.vc[i],
           (const float*)s.vs[i], fmt, row, hq, hkv, max(lo, c * ATTN_CHUNK), min(hi, (c + 1) * ATTN_CHUNK), scale,
           dst + 2, false, dst, dst + 1);
}

// The chunks of a row's partial results p [nchunks, HEAD_DIM + 2] merged in order into o.
__device__ __forceinline__ void combine_row(const float* p, float* o, int nchunks) {
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
        o[i] = v / lt;
    }
}

// Merges the chunks of attention_part, in order: one block per row.
extern "C" __global__ void attention_combine(const float* part, float* out, int nchunks) {
    GRID_PROLOGUE();
    combine_row(part + (long)blockIdx.x * nchunks * (HEAD_DIM + 2), out + (long)blockIdx.x * HEAD_DIM, nchunks);
}

// attention_combine for attention_part_seqs: block (sequence i, row) writes row off[i]·hq + row.
extern "C" __global__ void attention_combine_seqs(const float* part, float* out, int hq, AttnSlots s, int rows,
                                                  int nchunks) {
    GRID_PROLOGUE();
    int i = blockIdx.x / rows, row = blockIdx.x % rows;
    if (row >= s.n[i] * hq) return;
    combine_row(part + (long)blockIdx.x * nchunks * (HEAD_DIM + 2),
                out + ((long)s.off[i] * hq + row) * HEAD_DIM, nchunks);
}

// Attention of a long pass (prefill) on the tensor cores, flash-attention style: block
// (tile, query head) takes FA_WARPS·16 consecutive tokens of one query head; its warps share
// each tile of FA_KEYS keys and values, dequantised to f16 in shared memory, and each warp
// keeps its 16 query rows' f16 fragments, scores and output in registers: S = Q·Kᵀ and O += P·V
// are mma.sync m16n8k16 with f32 accumulation, the softmax is online (a running max and sum
// per row, as in `attend`). Scores come out in the C layout (lane 4g + q: rows g and g + 8,
// keys 2q, 2q + 1 of each 8) which is the A layout of P·V, so P never leaves the registers.
// The queries are scaled by `scale` before the f16 rounding. Same arguments as `attention`,
// plus the pass's token count and a split of the keys: a short pass over a long context (the
// next turn of a conversation: a few dozen tokens after thousands) has too few query tiles to
// fill the GPU, so block (tile, head, c) takes only keys [c·chunk, (c+1)·chunk) and, with
// nchunks > 1, writes its rows' max, sum and unnormalised output to part [row, c, 2 + HEAD_DIM]
// for attention_combine. Grid: ceil(T / (16·FA_WARPS)) · hq · nchunks blocks of 32·FA_WARPS.
#if HEAD_DIM % 16 == 0
#define FA_WARPS 4
#define FA_KEYS 32
// Halves per shared-memory row: 8 more than the head keeps the fragment loads conflict-free.
#define FA_STRIDE (HEAD_DIM + 8)

__device__ __forceinline__ u32 pack_f16(float lo, float hi) {
    return (u32)f32_to_f16(lo) | ((u32)f32_to_f16(hi) << 16);
}

// Four 8×8 f16 matrices from shared memory, lane l giving row l % 8 of matrix l / 8 (16 bytes,
// 16-byte aligned): r[j] of lane 4g + q holds matrix j's (row g, columns 2q, 2q + 1), or with
// `trans` its (rows 2q, 2q + 1, column g): an mma's B fragment in one instruction where
// element loads took two (keys) or four (values) and their shifts.
#ifndef KERNEL_EMULATION  // kernels_on_host.h defines it on the CPU
template <bool trans>
__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], const u16* row) {
    u32 a = (u32)__cvta_generic_to_shared(row);
    if (trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a)
                     : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a)
                     : "memory");
}
#endif

// Copies `bytes` (16, or 4 for cp_async4) from global to shared memory without registers,
// zero-filling what is past `src_bytes` (0: nothing is read); cp_async_wait_all waits for this
// thread's copies, which a barrier then shows to the block.
#ifndef KERNEL_EMULATION  // kernels_on_host.h defines them on the CPU
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
    u32 d = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, int src_bytes) {
    u32 d = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
}
#endif

// The four int8 values of `w` times their row's scale, in f32 (the tiles round them to f16).
__device__ __forceinline__ void int8_quad(u32 w, float scale, float (&v)[4]) {
#pragma unroll
    for (int i = 0; i < 4; i++) v[i] = (float)(i8)(w >> (8 * i)) * scale;
}

// Keys and values j0 .. j0 + FA_KEYS of head kvh as f16 in the tiles, four values per thread
// and step; keys past `end` are zero (never read unmasked).
static __device__ __forceinline__ void fa_load(u16 (*kt)[FA_STRIDE], u16 (*vt)[FA_STRIDE], const u8* kc,
                                               const float* ks, const u8* vc, const float* vs, int fmt, int j0,
                                               int end, int kvh, int hkv) {
    for (int u = threadIdx.x; u < FA_KEYS * (HEAD_DIM / 4); u += blockDim.x) {
        int jj = u / (HEAD_DIM / 4), d = 4 * (u % (HEAD_DIM / 4)), j = j0 + jj;
        float kv4[4] = {0.0f, 0.0f, 0.0f, 0.0f}, vv4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (j < end) {
            long r = (long)j * hkv + kvh, e = r * HEAD_DIM + d;
            if (fmt == KV_INT8) {
                int8_quad(*(const u32*)(kc + e), ks[r], kv4);
                int8_quad(*(const u32*)(vc + e), vs[r], vv4);
            } else if (fmt == KV_BF16) {
                uint2 kw = *(const uint2*)((const u16*)kc + e), vw = *(const uint2*)((const u16*)vc + e);
                kv4[0] = bf16_to_f32(kw.x & 0xffffu), kv4[1] = bf16_to_f32(kw.x >> 16);
                kv4[2] = bf16_to_f32(kw.y & 0xffffu), kv4[3] = bf16_to_f32(kw.y >> 16);
                vv4[0] = bf16_to_f32(vw.x & 0xffffu), vv4[1] = bf16_to_f32(vw.x >> 16);
                vv4[2] = bf16_to_f32(vw.y & 0xffffu), vv4[3] = bf16_to_f32(vw.y >> 16);
            } else {
                float4 kw = *(const float4*)((const float*)kc + e), vw = *(const float4*)((const float*)vc + e);
                kv4[0] = kw.x, kv4[1] = kw.y, kv4[2] = kw.z, kv4[3] = kw.w;
                vv4[0] = vw.x, vv4[1] = vw.y, vv4[2] = vw.z, vv4[3] = vw.w;
            }
        }
        *(uint2*)&kt[jj][d] = uint2{pack_f16(kv4[0], kv4[1]), pack_f16(kv4[2], kv4[3])};
        *(uint2*)&vt[jj][d] = uint2{pack_f16(vv4[0], vv4[1]), pack_f16(vv4[2], vv4[3])};
    }
}

// The int8 keys or values j0 .. j0 + FA_KEYS of head kvh, as stored (rows past `end` zero, scales
// too), copied into raw / raw_scale in flight (cp.async): nothing waits for them until
// fa_convert.
static __device__ __forceinline__ void fa_fetch(u8 (*raw)[HEAD_DIM], float* raw_scale, const u8* cache,
                                                const float* scales, int j0, int end, int kvh, int hkv) {
    for (int c = threadIdx.x; c < FA_KEYS * (HEAD_DIM / 16); c += blockDim.x) {
        int jj = c / (HEAD_DIM / 16), d = 16 * (c % (HEAD_DIM / 16)), j = j0 + jj;
        // A row past the end reads nothing; its address stays inside the cache.
        long r = (long)min(j, end - 1) * hkv + kvh;
        cp_async16(&raw[jj][d], cache + r * HEAD_DIM + d, j < end ? 16 : 0);
    }
    for (int jj = threadIdx.x; jj < FA_KEYS; jj += blockDim.x) {
        int j = j0 + jj;
        cp_async4(&raw_scale[jj], scales + (long)min(j, end - 1) * hkv + kvh, j < end ? 4 : 0);
    }
}

// The fetched int8 rows as f16 in the tile (the values attention_prefill's own loads give: the
// f32 product with the row's scale, rounded once).
static __device__ __forceinline__ void fa_convert(u16 (*tile)[FA_STRIDE], const u8 (*raw)[HEAD_DIM],
                                                  const float* raw_scale) {
    for (int u = threadIdx.x; u < FA_KEYS * (HEAD_DIM / 4); u += blockDim.x) {
        int jj = u / (HEAD_DIM / 4), d = 4 * (u % (HEAD_DIM / 4));
        float v[4];
        int8_quad(*(const u32*)&raw[jj][d], raw_scale[jj], v);
        *(uint2*)&tile[jj][d] = uint2{pack_f16(v[0], v[1]), pack_f16(v[2], v[3])};
    }
}

// The body of attention_prefill (ASYNC false) and attention_prefill_async (ASYNC true, int8
// caches): the async one copies each tile's raw keys while the block multiplies the previous
// tile's probabilities by its values, and the raw values while it scores the keys, then
// converts them from shared memory; the other loads and converts each tile from global memory
// between two barriers, the block waiting on the loads. The same tiles and products: the same
// bits. Static, as every function with dims-sized shared memory: on the host, where several dims'
// builds share a process, an inline function's statics would be one copy for all of them.
template <bool ASYNC>
static __device__ __forceinline__ void flash_prefill(const float* q, const u8* kc, const float* ks, const u8* vc,
                                                     const float* vs, float* out, int fmt, int hq, int hkv, int pos0,
                                                     const int* pos_at, float scale, int block, int window, int T,
                                                     int chunk, int nchunks, float* part) {
    __shared__ __align__(16) u16 kt[FA_KEYS][FA_STRIDE];
    __shared__ __align__(16) u16 vt[FA_KEYS][FA_STRIDE];
    __shared__ __align__(16) u8 raw[ASYNC ? FA_KEYS : 1][HEAD_DIM];
    __shared__ float raw_scale[FA_KEYS];
    const int DK = HEAD_DIM / 16, DN = HEAD_DIM / 8, NK = FA_KEYS / 8;
    int split = blockIdx.x % nchunks, h = (blockIdx.x / nchunks) % hq, kvh = h / (hq / hkv);
    int t0 = (blockIdx.x / nchunks / hq) * 16 * FA_WARPS;
    int klo = split * chunk, khi = klo + chunk;  // this block's share of the keys
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, qd = lane & 3;
    int pos = position(pos0, pos_at);
    // This lane's rows (tokens ta, tb = ta + 8), clamped into the pass for loads.
    int ta = t0 + 16 * warp + g, tb = ta + 8;
    int la, ha, lb, hb;
    key_range(min(ta, T - 1), pos, block, window, &la, &ha);
    key_range(min(tb, T - 1), pos, block, window, &lb, &hb);
    // Key ranges grow with the token in both masks (causal, draft block): the first and last
    // token bound the warp's and the block's.
    int wlo, whi, blo, bhi, unused;
    key_range(min(t0 + 16 * warp, T - 1), pos, block, window, &wlo, &unused);
    key_range(min(t0 + 16 * warp + 15, T - 1), pos, block, window, &unused, &whi);
    key_range(t0, pos, block, window, &blo, &unused);
    key_range(min(t0 + 16 * FA_WARPS - 1, T - 1), pos, block, window, &unused, &bhi);
    la = max(la, klo), lb = max(lb, klo), wlo = max(wlo, klo), blo = max(blo, klo);
    ha = min(ha, khi), hb = min(hb, khi), whi = min(whi, khi), bhi = min(bhi, khi);

    u32 qf[DK][4];
    {
        const float* qa = q + ((long)min(ta, T - 1) * hq + h) * HEAD_DIM;
        const float* qb = q + ((long)min(tb, T - 1) * hq + h) * HEAD_DIM;
#pragma unroll
        for (int s = 0; s < DK; s++) {
            int d = 16 * s + 2 * qd;
            qf[s][0] = pack_f16(qa[d] * scale, qa[d + 1] * scale);
            qf[s][1] = pack_f16(qb[d] * scale, qb[d + 1] * scale);
            qf[s][2] = pack_f16(qa[d + 8] * scale, qa[d + 9] * scale);
            qf[s][3] = pack_f16(qb[d + 8] * scale, qb[d + 9] * scale);
        }
    }
    float o[DN][4];
#pragma unroll
    for (int n = 0; n < DN; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float ma = NEG_INF, mb = NEG_INF, sa = 0.0f, sb = 0.0f;  // running max; this lane's share of the sum

    int first = blo / FA_KEYS * FA_KEYS;
    if (ASYNC && first < bhi) fa_fetch(raw, raw_scale, kc, ks, first, bhi, kvh, hkv);
    for (int j0 = first; j0 < bhi; j0 += FA_KEYS) {
        bool mine = j0 < whi && j0 + FA_KEYS > wlo;  // a key of this tile for this warp
        if (ASYNC) {
            cp_async_wait_all();
            __syncthreads();  // the raw keys are in; the previous tile's scores are done
            fa_convert(kt, raw, raw_scale);
            __syncthreads();
            fa_fetch(raw, raw_scale, vc, vs, j0, bhi, kvh, hkv);
        } else {
            __syncthreads();  // the previous tile is consumed
            fa_load(kt, vt, kc, ks, vc, vs, fmt, j0, bhi, kvh, hkv);
            __syncthreads();
        }

        // Scores of rows a, b against keys j0 + 8n + 2qd + {0, 1}.
        float sc[NK][4];
        if (mine) {
#pragma unroll
            for (int n = 0; n < NK; n++) {
                sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
                // Dims 16s .. 16s + 31 of keys 8n .. 8n + 7: the B fragments of mmas s and s + 1.
#pragma unroll
                for (int s = 0; s + 1 < DK; s += 2) {
                    u32 b[4];
                    ldmatrix_x4<false>(b, &kt[8 * n + (lane & 7)][16 * s + 8 * (lane >> 3)]);
                    mma_f16_16816(sc[n], qf[s][0], qf[s][1], qf[s][2], qf[s][3], b[0], b[1]);
                    mma_f16_16816(sc[n], qf[s + 1][0], qf[s + 1][1], qf[s + 1][2], qf[s + 1][3], b[2], b[3]);
                }
                if (DK & 1) {
                    const int s = DK - 1;
                    u32 b0 = *(const u32*)&kt[8 * n + g][16 * s + 2 * qd];
                    u32 b1 = *(const u32*)&kt[8 * n + g][16 * s + 8 + 2 * qd];
                    mma_f16_16816(sc[n], qf[s][0], qf[s][1], qf[s][2], qf[s][3], b0, b1);
                }
            }
        }
        // P in f16, the A fragments of O += P·V (the scores die here: fewer registers live
        // while the async kernel converts the values).
        u32 pa[FA_KEYS / 16][4];
        if (mine) {
            float mxa = NEG_INF, mxb = NEG_INF;
#pragma unroll
            for (int n = 0; n < NK; n++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int j = j0 + 8 * n + 2 * qd + e;
                    if (j < la || j >= ha) sc[n][e] = NEG_INF;
                    if (j < lb || j >= hb) sc[n][2 + e] = NEG_INF;
                    mxa = fmaxf(mxa, sc[n][e]);
                    mxb = fmaxf(mxb, sc[n][2 + e]);
                }
            }
            // The row's max over its quad (the four lanes holding its keys).
            mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, 1));
            mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, 2));
            mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, 1));
            mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, 2));
            float na = fmaxf(ma, mxa), nb = fmaxf(mb, mxb);
            // A row with no key yet keeps max −inf: its factors are 0, not NaN.
            float ca = na == NEG_INF ? 1.0f : expf(ma - na), cb = nb == NEG_INF ? 1.0f : expf(mb - nb);
            ma = na;
            mb = nb;
            sa *= ca;
            sb *= cb;
#pragma unroll
            for (int n = 0; n < NK; n++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    sc[n][e] = sc[n][e] == NEG_INF ? 0.0f : expf(sc[n][e] - ma);
                    sc[n][2 + e] = sc[n][2 + e] == NEG_INF ? 0.0f : expf(sc[n][2 + e] - mb);
                    sa += sc[n][e];
                    sb += sc[n][2 + e];
                }
            }
#pragma unroll
            for (int n = 0; n < DN; n++) {
                o[n][0] *= ca;
                o[n][1] *= ca;
                o[n][2] *= cb;
                o[n][3] *= cb;
            }
#pragma unroll
            for (int kk = 0; kk < FA_KEYS / 16; kk++) {
                pa[kk][0] = pack_f16(sc[2 * kk][0], sc[2 * kk][1]);
                pa[kk][1] = pack_f16(sc[2 * kk][2], sc[2 * kk][3]);
                pa[kk][2] = pack_f16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
                pa[kk][3] = pack_f16(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
            }
        }
        if (ASYNC) {
            cp_async_wait_all();
            __syncthreads();  // the raw values are in; the previous tile's products are done
            fa_convert(vt, raw, raw_scale);
            __syncthreads();
            if (j0 + FA_KEYS < bhi) fa_fetch(raw, raw_scale, kc, ks, j0 + FA_KEYS, bhi, kvh, hkv);
        }
        if (!mine) continue;
        // O += P·V, 16 keys per mma: P's A fragment is two adjacent score tiles.
#pragma unroll
        for (int kk = 0; kk < FA_KEYS / 16; kk++) {
            const u32 a0 = pa[kk][0], a1 = pa[kk][1], a2 = pa[kk][2], a3 = pa[kk][3];
            // Keys 16kk .. 16kk + 15 of dims 8n .. 8n + 15, transposed: the B fragments of
            // output tiles n and n + 1 (DN is even: HEAD_DIM is a multiple of 16).
            const u16* vrow = &vt[16 * kk + 8 * ((lane >> 3) & 1) + (lane & 7)][8 * (lane >> 4)];
#pragma unroll
            for (int n = 0; n < DN; n += 2) {
                u32 b[4];
                ldmatrix_x4<true>(b, vrow + 8 * n);
                mma_f16_16816(o[n], a0, a1, a2, a3, b[0], b[1]);
                mma_f16_16816(o[n + 1], a0, a1, a2, a3, b[2], b[3]);
            }
        }
    }
    sa += __shfl_xor_sync(0xffffffffu, sa, 1);
    sa += __shfl_xor_sync(0xffffffffu, sa, 2);
    sb += __shfl_xor_sync(0xffffffffu, sb, 1);
    sb += __shfl_xor_sync(0xffffffffu, sb, 2);
    if (nchunks > 1) {
        // Unnormalised, relative to the running max; a row without keys here has max −inf.
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            int t = rr ? tb : ta;
            if (t >= T) continue;
            float* dst = part + (((long)t * hq + h) * nchunks + split) * (HEAD_DIM + 2);
            if (qd == 0) {
                dst[0] = rr ? mb : ma;
                dst[1] = rr ? sb : sa;
            }
#pragma unroll
            for (int n = 0; n < DN; n++) {
                dst[2 + 8 * n + 2 * qd] = o[n][2 * rr];
                dst[2 + 8 * n + 2 * qd + 1] = o[n][2 * rr + 1];
            }
        }
        return;
    }
    float ia = sa > 0.0f ? 1.0f / sa : 0.0f, ib = sb > 0.0f ? 1.0f / sb : 0.0f;
#pragma unroll
    for (int n = 0; n < DN; n++) {
        int d = 8 * n + 2 * qd;
        if (ta < T) {
            float* oa = out + ((long)ta * hq + h) * HEAD_DIM + d;
            oa[0] = o[n][0] * ia;
            oa[1] = o[n][1] * ia;
        }
        if (tb < T) {
            float* ob = out + ((long)tb * hq + h) * HEAD_DIM + d;
            ob[0] = o[n][2] * ib;
            ob[1] = o[n][3] * ib;
        }
    }
}

#define FLASH_PREFILL_KERNEL(NAME, ASYNC)                                                                       \
    extern "C" __global__ void __launch_bounds__(32 * FA_WARPS)                                                 \
        NAME(const float* q, const u8* kc, const float* ks, const u8* vc, const float* vs, float* out, int fmt, \
             int hq, int hkv, int pos0, const int* pos_at, float scale, int block, int window, int T, int chunk, \
             int nchunks, float* part) {                                                                        \
        GRID_PROLOGUE();                                                                                        \
        flash_prefill<ASYNC>(q, kc, ks, vc, vs, out, fmt, hq, hkv, pos0, pos_at, scale, block, window, T, chunk, \
                             nchunks, part);                                                                    \
    }
FLASH_PREFILL_KERNEL(attention_prefill, false)
FLASH_PREFILL_KERNEL(attention_prefill_async, true)
#endif

// DFlash2's grouped dynamic causal conv inside one block (CPU twin: cpu::grouped_dynamic_conv):
// out[t, c] = Σ_{o<K, o≤t} (base[o, c] + dyn[t·stride + o·G + c/group]) · x[t−o, c], G = H/group,
// summed from o = 0 up as the CPU does. `dyn` rows are `stride` apart: the kernel projection
// writes both sides of a sublayer side by side. One thread per (t, c); out must not alias x.
extern "C" __global__ void grouped_dynamic_conv(const float* x, const float* dyn, long stride, const float* base,
                                                float* out, int T, int H, int K, int group) {
    GRID_PROLOGUE();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)T * H) return;
    int t = (int)(i / H), c = (int)(i % H), G = H / group;
    float acc = 0.0f;
    for (int o = 0; o < K && o <= t; o++)
        acc += (base[o * H + c] + dyn[t * stride + o * G + c / group]) * x[(long)(t - o) * H + c];
    out[i] = acc;
}

// The k best entries of each row of logits [R, V] (value descending, id ascending on ties),
// after a draft's shaping: v·mult, then cap·tanh(v/cap) when cap > 0. Writes ids [R, k] and
// values [R, k], best first: what DFlash2's candidate selector walks (and with k = 1 a greedy
// pass's argmax), without the row leaving the GPU. Two stages: blocks of TOPK_THREADS over
// TOPK_CHUNK values of a row, then (for rows of several chunks) one block per row over the
// chunks' candidates. In a block each thread keeps the best k of its entries, then k rounds
// pick the block's best head and its owner pops it. k ≤ TOPK_MAX ≤ V.
#define TOPK_MAX 32
#define TOPK_THREADS 256
#define TOPK_PER_THREAD 8
#define TOPK_CHUNK (TOPK_THREADS * TOPK_PER_THREAD)
__device__ __forceinline__ bool topk_better(float v, int i, float w, int j) { return v > w || (v == w && i < j); }

// Inserts (v, id) into a thread's list of its best n ≤ k entries, best first.
__device__ __forceinline__ void topk_insert(float* bv, int* bi, int& n, int k, float v, int id) {
    if (n == k && !topk_better(v, id, bv[k - 1], bi[k - 1])) return;
    int j = n < k ? n : k - 1;
    while (j > 0 && topk_better(v, id, bv[j - 1], bi[j - 1])) {
        bv[j] = bv[j - 1];
        bi[j] = bi[j - 1];
        j--;
    }
    bv[j] = v;
    bi[j] = id;
    if (n < k) n++;
}

// The block's best k of its threads' lists into ids / vals [k], best first; a slot no thread
// filled gets (-inf, INT_MAX), which loses to every entry of a later merge.
__device__ void topk_block_merge(const float* bv, const int* bi, int n, int k, int* ids, float* vals) {
    __shared__ float sv[TOPK_THREADS];
    __shared__ int si[TOPK_THREADS], sowner[TOPK_THREADS];
    int head = 0, t = threadIdx.x;
    for (int r = 0; r < k; r++) {
        bool has = head < n;
        sv[t] = has ? bv[head] : NEG_INF;
        si[t] = has ? bi[head] : 0x7fffffff;
        sowner[t] = t;
        __syncthreads();
        for (int s = TOPK_THREADS / 2; s > 0; s >>= 1) {
            if (t < s && topk_better(sv[t + s], si[t + s], sv[t], si[t])) {
                sv[t] = sv[t + s];
                si[t] = si[t + s];
                sowner[t] = sowner[t + s];
            }
            __syncthreads();
        }
        if (t == 0) {
            ids[r] = si[0];
            vals[r] = sv[0];
        }
        if (sowner[0] == t) head++;
        __syncthreads();
    }
}

// First stage of a row top-k: block (row, part) keeps the best k of values
// part·TOPK_CHUNK .. (part + 1)·TOPK_CHUNK of its row (after v·mult and the softcap) in
// ids / vals [rows, parts, k]. A thread's TOPK_PER_THREAD values are loaded before any is
// compared: one block walking a 248,320-value row load by load took half a millisecond.
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
    top_k_part(const float* logits, int V, int k, float mult, float cap, int parts, int* ids, float* vals) {
    GRID_PROLOGUE();
    int row = blockIdx.x / parts, part = blockIdx.x % parts;
    const float* x = logits + (long)row * V;
    int c0 = part * TOPK_CHUNK + threadIdx.x;
    float v[TOPK_PER_THREAD];
#pragma unroll
    for (int j = 0; j < TOPK_PER_THREAD; j++) {
        int i = c0 + j * TOPK_THREADS;
        v[j] = i < V ? x[i] : 0.0f;
    }
    float bv[TOPK_MAX];
    int bi[TOPK_MAX];
    int n = 0;
    // Ids come ascending: an entry equal to the worst kept loses the tie.
#pragma unroll
    for (int j = 0; j < TOPK_PER_THREAD; j++) {
        int i = c0 + j * TOPK_THREADS;
        if (i >= V) break;
        float y = v[j] * mult;
        if (cap > 0.0f) y = tanhf(y / cap) * cap;
        topk_insert(bv, bi, n, k, y, i);
    }
    long out = (long)blockIdx.x * k;
    topk_block_merge(bv, bi, n, k, ids + out, vals + out);
}

// Second stage: each row's best k of its parts' candidates [rows, n, k] (n = parts · k).
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
    top_k_merge(const int* ids_in, const float* vals_in, int n_in, int k, int* ids, float* vals) {
    GRID_PROLOGUE();
    long base = (long)blockIdx.x * n_in;
    float bv[TOPK_MAX];
    int bi[TOPK_MAX];
    int n = 0;
    for (int i = threadIdx.x; i < n_in; i += TOPK_THREADS) topk_insert(bv, bi, n, k, vals_in[base + i], ids_in[base + i]);
    long out = (long)blockIdx.x * k;
    topk_block_merge(bv, bi, n, k, ids + out, vals + out);
}

// x *= sigmoid(gate), elementwise (the attention output gate).
extern "C" __global__ void sigmoid_gate(float* x, const float* gate, long n) {
    GRID_PROLOGUE();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= sigmoid(gate[i]);
}

// ---------------------------------------------------------------------------------------------
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
__device__ __forceinline__ void conv1d_silu_block(int blk, const float* x, float* y, const float* state_in,
                                                  float* state, const float* w, int T, int C, int K,
                                                  float* save_state = nullptr, float* save_x = nullptr) {
    int per_chunk = (C + blockDim.x - 1) / blockDim.x;
    int chunk = blk / per_chunk;
    int c = (blk % per_chunk) * blockDim.x + threadIdx.x;
    int steps = conv_steps(K);
    if (c >= C || (chunk > 0 && chunk * steps >= T)) return;
    int t0 = chunk * steps, t1 = min(T, t0 + steps);
    float hist[8], old[8];
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
        for (int j = 0; j < K - 1; j++) acc += w[c * K + j] * hist[j];
        acc += w[c * K + K - 1] * xv;
        y[(long)t * C + c] = silu(acc);
        for (int j = 0; j < K - 2; j++) hist[j] = hist[j + 1];
        if (K > 1) hist[K - 2] = xv;
    }
    if (chunk != 0) return;
    // The new state: the last K-1 rows of [old state ; x].
    for (int j = 0; j < K - 1; j++) {
        int e = T + j;  // index into [old state (K-1 rows) ; x (T rows)]
        state[(long)j * C + c] = e < K - 1 ? old[e] : x[(long)(e - (K - 1)) * C + c];
    }
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
                                                    float* save_g = nullptr, float* save_beta = nullptr) {
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
// recurrent state to save[0] and its gates g, beta to save[1], save[2].
extern "C" __global__ void GDN_BOUNDS gdn_recurrent_seqs(const float* mixed, const float* g, const float* beta, SeqSlots seqs,
                                              float* out, int hk, int hv, int tiled) {
    GRID_PROLOGUE();
    int per = hv * ((GDN_DV + GDN_COLS - 1) / GDN_COLS), i = blockIdx.x / per;
    long off = seqs.off[i];
    float* state = (float*)seqs.state[i];
    gdn_recurrent_block(blockIdx.x % per, mixed + off * (2 * hk * GDN_DK + hv * GDN_DV), g + off * hv,
                        beta + off * hv, state, state, out + off * hv * GDN_DV, seqs.n[i], hk, hv, tiled,
                        (float*)seqs.save[0][i], (float*)seqs.save[1][i], (float*)seqs.save[2][i]);
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

// ---------------------------------------------------------------------------------------------
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
