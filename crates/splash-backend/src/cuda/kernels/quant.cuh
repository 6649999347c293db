// How the kernels read weights: the stored formats and their 32-value decoding.

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
