// Gated attention: the KV cache, decode attention (split and combined), flash prefill, the
// output gate.

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

// Query heads of one KV head that a block of decode attention may take at once: each key run it
// loads serves all of them, where one head a block reads every key once per head of its GQA
// group (6 or 8), from L2 at best. For a pass of several rows the host passes the largest divisor
// of hq / hkv up to this, for one row 1 (ops::attention_heads); 1..4, SPLASH_ATTENTION_HEADS
// (KernelOptions::attention_heads, 4 unless set): more heads take more registers (142 against 96
// at head dim 256 for 4).
#ifndef ATTN_HEADS_MAX
#define ATTN_HEADS_MAX 4
#endif
// One head a block: at most 96 registers, five blocks an SM (the one-row kernels always; a 32K
// one-row pass lost 13 % to the grouped kernel's 142 registers). The grouped kernels are bound
// only when they too take one head.
#define ATTN_ONE_HEAD_BOUNDS __launch_bounds__(32 * ATTN_WARPS, 5)
#if ATTN_HEADS_MAX == 1
#define ATTN_BOUNDS ATTN_ONE_HEAD_BOUNDS
#else
#define ATTN_BOUNDS
#endif

// The shared memory of attend_heads for up to MAXH heads, declared by each kernel that calls it
// (one copy for every instantiation): the heads' queries, lane-major so that a warp's reads take
// distinct banks, and each warp's running max, sum and output per head for the merge.
template <int MAXH>
struct AttnShared {
    float q[MAXH][HEAD_DPL][32];
    float m[MAXH][ATTN_WARPS], l[MAXH][ATTN_WARPS];
    float acc[MAXH][ATTN_WARPS][32 * HEAD_DPL];
};

// Attention of the HB query heads h0.. (of one KV head) of one token, q [hq, HEAD_DIM] its query
// rows, over cache rows [lo, hi) of [S, hkv, HEAD_DIM], by the whole block: each warp runs an
// online softmax per head over runs of ATTN_UNROLL keys (warp w takes keys lo + ATTN_UNROLL·(w +
// ATTN_WARPS·i) + u), loading each run once for all the heads, lane i holding dims [i·DPL,
// (i+1)·DPL); the warps are then merged per head. A head's sums depend only on its query and
// [lo, hi) (HB is fixed by the model's shape), so a row gets the same bits in any pass. Head g's
// record is at dst + g·stride: with `normalise`, its output Σ_j e_j · v_j / Σ_j e_j; otherwise
// its max, its sum and its unnormalised output (relative to that max), for attention_combine.
template <int HB, int MAXH>
__device__ void attend_heads(AttnShared<MAXH>* sh, const float* q, const u8* kc, const float* ks, const u8* vc,
                             const float* vs, int fmt, int h0, int hq, int hkv, int lo, int hi, float scale,
                             float* dst, long stride, bool normalise) {
    const int DPL = HEAD_DPL;
    int kvh = h0 / (hq / hkv);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int e = threadIdx.x; e < HB * 32 * DPL; e += blockDim.x) {
        int g = e / (32 * DPL), dim = e % (32 * DPL);
        sh->q[g][dim % DPL][dim / DPL] = IN_HEAD(dim) ? q[(long)(h0 + g) * HEAD_DIM + dim] : 0.0f;
    }
    __syncthreads();
    float m[HB], l[HB], acc[HB][DPL];
#pragma unroll
    for (int g = 0; g < HB; g++) {
        m[g] = NEG_INF;
        l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[g][i] = 0.0f;
    }
    for (int j0 = lo + ATTN_UNROLL * warp; j0 < hi; j0 += ATTN_UNROLL * ATTN_WARPS) {
        float kr[ATTN_UNROLL][DPL], vr[ATTN_UNROLL][DPL];
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
#pragma unroll
        for (int g = 0; g < HB; g++) {
            // Key j0 is in range, so the new max is finite; keys past hi score −inf (weight 0).
            float sc[ATTN_UNROLL], m2 = m[g];
#pragma unroll
            for (int u = 0; u < ATTN_UNROLL; u++) {
                float p = 0.0f;
#pragma unroll
                for (int i = 0; i < DPL; i++) p += sh->q[g][i][lane] * kr[u][i];
                sc[u] = j0 + u < hi ? warp_sum(p) * scale : NEG_INF;
                m2 = fmaxf(m2, sc[u]);
            }
            float corr = expf(m[g] - m2);
            l[g] *= corr;
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[g][i] *= corr;
#pragma unroll
            for (int u = 0; u < ATTN_UNROLL; u++) {
                float e = expf(sc[u] - m2);
                l[g] += e;
#pragma unroll
                for (int i = 0; i < DPL; i++) acc[g][i] += e * vr[u][i];
            }
            m[g] = m2;
        }
    }
#pragma unroll
    for (int g = 0; g < HB; g++) {
        if (lane == 0) {
            sh->m[g][warp] = m[g];
            sh->l[g][warp] = l[g];
        }
#pragma unroll
        for (int i = 0; i < DPL; i++) sh->acc[g][warp][lane * DPL + i] = acc[g][i];
    }
    __syncthreads();
    for (int g = 0; g < HB; g++) {
        float mt = NEG_INF;
        for (int w = 0; w < ATTN_WARPS; w++) mt = fmaxf(mt, sh->m[g][w]);
        float lt = 0.0f;
        for (int w = 0; w < ATTN_WARPS; w++) lt += sh->l[g][w] * (sh->m[g][w] == NEG_INF ? 0.0f : expf(sh->m[g][w] - mt));
        float* d = dst + g * stride;
        for (int i = threadIdx.x; i < HEAD_DIM; i += blockDim.x) {
            float v = 0.0f;
            for (int w = 0; w < ATTN_WARPS; w++)
                if (sh->m[g][w] != NEG_INF) v += sh->acc[g][w][i] * expf(sh->m[g][w] - mt);
            if (normalise)
                d[i] = v / lt;
            else
                d[2 + i] = v;
        }
        if (!normalise && threadIdx.x == 0) {
            d[0] = mt;
            d[1] = lt;
        }
    }
}

// attend_heads for the `hb` (1..MAXH) heads the host chose.
template <int MAXH>
__device__ __forceinline__ void attend_group(int hb, AttnShared<MAXH>* sh, const float* q, const u8* kc,
                                             const float* ks, const u8* vc, const float* vs, int fmt, int h0, int hq,
                                             int hkv, int lo, int hi, float scale, float* dst, long stride,
                                             bool normalise) {
#define ATTEND_HEADS(HB) \
    attend_heads<HB, MAXH>(sh, q, kc, ks, vc, vs, fmt, h0, hq, hkv, lo, hi, scale, dst, stride, normalise)
    // Only the counts up to MAXH are compiled (their registers are the kernel's).
    if constexpr (MAXH >= 4)
        if (hb == 4) return ATTEND_HEADS(4);
    if constexpr (MAXH >= 3)
        if (hb == 3) return ATTEND_HEADS(3);
    if constexpr (MAXH >= 2)
        if (hb == 2) return ATTEND_HEADS(2);
    ATTEND_HEADS(1);
#undef ATTEND_HEADS
}

// GQA attention: q [T, hq, HEAD_DIM] at positions pos0.. over the cache [S, hkv, HEAD_DIM]
// (row j = position j), keys as `key_range` says. One block per (token, `hb` query heads).
extern "C" __global__ void ATTN_BOUNDS attention(const float* q, const u8* kc, const float* ks, const u8* vc,
                                     const float* vs, float* out, int fmt, int hq, int hkv, int pos0,
                                     const int* pos_at, float scale, int block, int window, int hb) {
    GRID_PROLOGUE();
    __shared__ AttnShared<ATTN_HEADS_MAX> sh;
    int t = blockIdx.x / (hq / hb), h0 = blockIdx.x % (hq / hb) * hb, lo, hi;
    key_range(t, position(pos0, pos_at), block, window, &lo, &hi);
    attend_group(hb, &sh, q + (long)t * hq * HEAD_DIM, kc, ks, vc, vs, fmt, h0, hq, hkv, lo, hi, scale,
                 out + ((long)t * hq + h0) * HEAD_DIM, HEAD_DIM, true);
}

// Keys per chunk of the split attention below (SPLASH_ATTENTION_CHUNK: a multiple of 32).
#ifndef ATTN_CHUNK
#define ATTN_CHUNK 256
#endif

// Split attention for a few query rows over a long context (flash-decoding): block
// (token, hb heads, chunk c) attends to the keys of its token's range that fall in
// [c·ATTN_CHUNK, (c+1)·ATTN_CHUNK), and writes each head's max, sum and unnormalised output to
// part[row, c, 0 | 1 | 2..] (row = token · hq + head); attention_combine merges the chunks in
// order. The chunks are fixed by position, so a query's result depends only on its own key
// range: a verify block gives each row what token-by-token decoding gives. 1-D grid,
// chunk-major: block = c · (T · hq / hb) + group, so the blocks running at once read a few
// chunks of keys, which stay in L2 for all the rows (row-major, they spanned the whole context:
// at 32K that no longer fits L2, and every row of a verify block read its keys from memory
// again). With a window, the chunks start at the one holding the first query's first key (the
// keys before it are outside every query's window), so a sliding layer's launch covers its
// window, not the whole context. Two kernels: `attention_part` takes one head a block (hb 1,
// at most 96 registers), `attention_part_grouped` up to ATTN_HEADS_MAX.
template <int MAXH>
__device__ __forceinline__ void attention_part_body(const float* q, const u8* kc, const float* ks, const u8* vc,
                                                    const float* vs, float* part, int fmt, int hq, int hkv, int pos0,
                                                    const int* pos_at, float scale, int block, int window,
                                                    int nchunks, int hb) {
    GRID_PROLOGUE();
    __shared__ AttnShared<MAXH> sh;
    int groups = gridDim.x / nchunks, gi = blockIdx.x % groups, c = blockIdx.x / groups;
    int t = gi / (hq / hb), h0 = gi % (hq / hb) * hb;
    int pos = position(pos0, pos_at), lo, hi;
    key_range(t, pos, block, window, &lo, &hi);
    int first = window > 0 ? max(0, pos - window + 1) / ATTN_CHUNK : 0, at = (first + c) * ATTN_CHUNK;
    float* dst = part + (((long)t * hq + h0) * nchunks + c) * (HEAD_DIM + 2);
    attend_group(hb, &sh, q + (long)t * hq * HEAD_DIM, kc, ks, vc, vs, fmt, h0, hq, hkv, max(lo, at),
                 min(hi, at + ATTN_CHUNK), scale, dst, (long)nchunks * (HEAD_DIM + 2), false);
}

#define ATTENTION_PART(NAME, BOUNDS, MAXH)                                                                     \
    extern "C" __global__ void BOUNDS NAME(const float* q, const u8* kc, const float* ks, const u8* vc,          \
                                           const float* vs, float* part, int fmt, int hq, int hkv, int pos0,   \
                                           const int* pos_at, float scale, int block, int window, int nchunks, \
                                           int hb) {                                                           \
        attention_part_body<MAXH>(q, kc, ks, vc, vs, part, fmt, hq, hkv, pos0, pos_at, scale, block, window,    \
                                  nchunks, hb);                                                                \
    }
ATTENTION_PART(attention_part, ATTN_ONE_HEAD_BOUNDS, 1)
ATTENTION_PART(attention_part_grouped, ATTN_BOUNDS, ATTN_HEADS_MAX)

// Block blockIdx.x of a `*_seqs` split attention: chunk c, sequence i, its first query row
// `row` (token t, head row % hq), the token's keys [lo, hi) and the record dst; false when the
// sequence has no such row (fewer tokens than the longest).
struct SeqsBlock {
    int c, i, row, t, lo, hi;
    float* dst;
};
__device__ __forceinline__ bool seqs_block(const AttnSlots& s, float* part, int hq, int rows, int nchunks, int hb,
                                           SeqsBlock* b) {
    int groups = rows / hb, seqs = gridDim.x / (groups * nchunks);
    b->c = blockIdx.x / (seqs * groups), b->i = blockIdx.x / groups % seqs, b->row = blockIdx.x % groups * hb;
    if (b->row >= s.n[b->i] * hq) return false;
    b->t = b->row / hq;
    key_range(b->t, slot_position(s, b->i), 0, 0, &b->lo, &b->hi);
    b->dst = part + (((long)b->i * rows + b->row) * nchunks + b->c) * (HEAD_DIM + 2);
    return true;
}

// Split attention of every sequence's rows (causal, no window: the target's layers) over its
// own caches: block (chunk c, sequence i, hb heads of a row) as attention_part's, `rows` = hq ·
// the most tokens of a sequence, writing part[i, row, c]. Every sequence takes `nchunks` chunks,
// the most any needs: past its keys a chunk is empty (max −inf), which attention_combine skips,
// so each row gets the bits of its sequence's own launch. One head a block or grouped, as
// attention_part.
template <int MAXH>
__device__ __forceinline__ void attention_part_seqs_body(const float* q, float* part, int fmt, int hq, int hkv,
                                                         float scale, AttnSlots s, int rows, int nchunks, int hb) {
    GRID_PROLOGUE();
    __shared__ AttnShared<MAXH> sh;
    SeqsBlock b;
    if (!seqs_block(s, part, hq, rows, nchunks, hb, &b)) return;
    int c = b.c, i = b.i, row = b.row, t = b.t, lo = b.lo, hi = b.hi;
    float* dst = b.dst;
    long stride = (long)nchunks * (HEAD_DIM + 2);
    if (max(lo, c * ATTN_CHUNK) >= min(hi, (c + 1) * ATTN_CHUNK)) {
        // No key of this chunk (a sequence shorter than the longest): its max alone, −inf.
        if (threadIdx.x < hb) dst[threadIdx.x * stride] = NEG_INF;
        return;
    }
    attend_group(hb, &sh, q + ((long)s.off[i] * hq + (long)t * hq) * HEAD_DIM, (const u8*)s.kc[i],
                 (const float*)s.ks[i], (const u8*)s.vc[i], (const float*)s.vs[i], fmt, row % hq, hq, hkv,
                 max(lo, c * ATTN_CHUNK), min(hi, (c + 1) * ATTN_CHUNK), scale, dst, stride, false);
}

#define ATTENTION_PART_SEQS(NAME, BOUNDS, MAXH)                                                                   \
    extern "C" __global__ void BOUNDS NAME(const float* q, float* part, int fmt, int hq, int hkv, float scale,     \
                                           AttnSlots s, int rows, int nchunks, int hb) {                          \
        attention_part_seqs_body<MAXH>(q, part, fmt, hq, hkv, scale, s, rows, nchunks, hb);                      \
    }
ATTENTION_PART_SEQS(attention_part_seqs, ATTN_ONE_HEAD_BOUNDS, 1)
ATTENTION_PART_SEQS(attention_part_seqs_grouped, ATTN_BOUNDS, ATTN_HEADS_MAX)

// Chunk weights combine_row holds in shared memory at once, and its threads (the launches' 128).
#define COMBINE_TILE 512
#define COMBINE_THREADS 128
#define COMBINE_DIMS ((HEAD_DIM + COMBINE_THREADS - 1) / COMBINE_THREADS)

// The chunks of a row's partial results p [nchunks, HEAD_DIM + 2] merged in order into o by the
// whole block. Chunk c's weight expf(m_c - max) is computed once, by one thread, into shared
// memory; each thread then sums its dims over the chunks in order with the loads of several
// chunks in flight (a 32K context has 128 chunks: one thread walking them, a load and an expf at
// a time, took longer than the attention itself). Chunks after the last one with keys are not
// read: a graph's pass is launched for the cache's capacity, not the context. The sums are those
// of the serial merge, term for term, so the bits are too.
__device__ __forceinline__ void combine_row(const float* p, float* o, int nchunks) {
    __shared__ float w[COMBINE_TILE];
    __shared__ float total;
    const long S = HEAD_DIM + 2;
    float mt = NEG_INF, live = 0.0f;  // live: one past the last chunk with keys (exact in a float)
    for (int c = threadIdx.x; c < nchunks; c += COMBINE_THREADS) {
        float mc = p[c * S];
        mt = fmaxf(mt, mc);
        if (mc != NEG_INF) live = (float)(c + 1);
    }
    mt = block_max(mt);
    nchunks = (int)block_max(live);
    float lt = 0.0f, v[COMBINE_DIMS];
#pragma unroll
    for (int k = 0; k < COMBINE_DIMS; k++) v[k] = 0.0f;
    for (int t0 = 0; t0 < nchunks; t0 += COMBINE_TILE) {
        int n = min(COMBINE_TILE, nchunks - t0);
        const float* pt = p + t0 * S;
        __syncthreads();  // the previous tile's weights are read
        for (int c = threadIdx.x; c < n; c += COMBINE_THREADS) {
            float mc = pt[c * S];
            w[c] = mc == NEG_INF ? -1.0f : expf(mc - mt);  // -1: an empty chunk, skipped
        }
        __syncthreads();
        if (threadIdx.x == 0)
            for (int c = 0; c < n; c++)
                if (w[c] >= 0.0f) lt += pt[c * S + 1] * w[c];
#pragma unroll
        for (int k = 0; k < COMBINE_DIMS; k++) {
            int i = threadIdx.x + k * COMBINE_THREADS;
            if (i >= HEAD_DIM) break;
#pragma unroll 8
            for (int c = 0; c < n; c++) {
                float x = pt[c * S + 2 + i];  // loaded for an empty chunk too: in bounds, unused
                if (w[c] >= 0.0f) v[k] += x * w[c];
            }
        }
    }
    if (threadIdx.x == 0) total = lt;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < COMBINE_DIMS; k++) {
        int i = threadIdx.x + k * COMBINE_THREADS;
        if (i < HEAD_DIM) o[i] = v[k] / total;
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

// Split attention over an int8 cache with the keys staged in shared memory (`*_staged`, the
// default for int8 caches of head dim 128 or 256): a block takes the hb query heads
// h0.. of one KV head of one row over one ATTN_CHUNK chunk and reads each key and value once for
// all of them, in tiles of STAGED_KEYS keys copied a tile ahead (cp.async). A tile's scores:
// warp w sums dims [w·D/4, (w+1)·D/4) of the lane-th key against every head's query (the keys'
// codes converted once for all heads; the four quarters added in order), times the key's scale and
// `scale`. Then an online softmax per head over the tiles (warp g % 4 keeps head g's max and sum),
// and each thread accumulates D/128 dims of every head's output from the values' codes times
// e_j · value scale. The warp-per-key kernels above reduced every (head, key) score across a warp
// and read each key once per head: at 32K of context they reached about 8 % of the bandwidth.
// A head's sums depend only on its query and key range and on tile boundaries fixed by position,
// never on hb or the pass, so a row gets the same bits in any pass and any grouping. The record is
// attention_part's (max, sum, unnormalised output), for attention_combine.
#if HEAD_DIM % 128 == 0 && HEAD_DIM <= 256
#define STAGED_KEYS 32
#define STAGED_HEADS 8
// Bytes per staged key row: 16 more than the head puts the 16-byte reads of 8 lanes (8 rows) on
// distinct banks.
#define STAGED_KEY_STRIDE (HEAD_DIM + 16)
#define STAGED_QUARTER (HEAD_DIM / 4)
#define STAGED_DIMS (HEAD_DIM / 128)

struct alignas(16) StagedTile {
    u8 k[STAGED_KEYS][STAGED_KEY_STRIDE];
    u8 v[STAGED_KEYS][HEAD_DIM];
    float ks[STAGED_KEYS], vs[STAGED_KEYS];
};

struct alignas(16) StagedShared {
    float q[STAGED_HEADS][HEAD_DIM];
    StagedTile tile[2];
    float part[4][STAGED_HEADS][STAGED_KEYS];  // each quarter's partial scores
    float p[STAGED_HEADS][STAGED_KEYS];        // e_j times the value's scale
    float corr[STAGED_HEADS];                  // how much the running output shrinks this tile
};

// Byte i of w as the signed int8 it stores, in f32: 2^23 + (b ^ 0x80) built in the mantissa,
// less 2^23 + 128 (exact; a byte permute and an add where a conversion takes a slower pipe).
__device__ __forceinline__ float staged_code(u32 w, int i) {
    return __int_as_float((int)__byte_perm(w ^ 0x80808080u, 0x4B000000u, 0x7540u + i)) - 8388736.0f;
}

// Keys and values j0 .. j0 + STAGED_KEYS of head kvh into `t`, in flight: rows outside [lo, hi)
// read nothing and are zero (their scores are masked).
__device__ __forceinline__ void staged_fetch(StagedTile* t, const u8* kc, const float* ks, const u8* vc,
                                             const float* vs, int j0, int lo, int hi, int kvh, int hkv) {
    for (int c = threadIdx.x; c < STAGED_KEYS * (HEAD_DIM / 16); c += blockDim.x) {
        int jj = c / (HEAD_DIM / 16), d = 16 * (c % (HEAD_DIM / 16)), j = j0 + jj;
        bool in = j >= lo && j < hi;
        long e = ((long)(in ? j : lo) * hkv + kvh) * HEAD_DIM + d;  // in the cache either way
        cp_async16(&t->k[jj][d], kc + e, in ? 16 : 0);
        cp_async16(&t->v[jj][d], vc + e, in ? 16 : 0);
    }
    for (int jj = threadIdx.x; jj < STAGED_KEYS; jj += blockDim.x) {
        int j = j0 + jj;
        bool in = j >= lo && j < hi;
        long r = (long)(in ? j : lo) * hkv + kvh;
        cp_async4(&t->ks[jj], ks + r, in ? 4 : 0);
        cp_async4(&t->vs[jj], vs + r, in ? 4 : 0);
    }
}

// The hb (1..STAGED_HEADS) heads h0.. of one row, q [hq, HEAD_DIM] its queries, over the keys
// [lo, hi) ∩ [at, at + ATTN_CHUNK); head g's record at dst + g·stride. 128 threads.
__device__ void attend_staged(StagedShared* sh, const float* q, const u8* kc, const float* ks, const u8* vc,
                              const float* vs, int h0, int hb, int hq, int hkv, int lo, int hi, int at, float scale,
                              float* dst, long stride) {
    int kvh = h0 / (hq / hkv), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int k0 = max(lo, at), k1 = min(hi, at + ATTN_CHUNK);
    for (int e = threadIdx.x; e < hb * HEAD_DIM; e += blockDim.x)
        sh->q[e / HEAD_DIM][e % HEAD_DIM] = q[(long)h0 * HEAD_DIM + e];
    // Tiles start at fixed positions (at + STAGED_KEYS·n); those without keys in range are skipped.
    int first = at + max(0, k0 - at) / STAGED_KEYS * STAGED_KEYS;
    if (k0 < k1) staged_fetch(&sh->tile[0], kc, ks, vc, vs, first, k0, k1, kvh, hkv);
    // Warp w keeps the max and sum of heads w and w + 4.
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f}, acc[STAGED_HEADS][STAGED_DIMS];
#pragma unroll
    for (int g = 0; g < STAGED_HEADS; g++)
#pragma unroll
        for (int i = 0; i < STAGED_DIMS; i++) acc[g][i] = 0.0f;
    int b = 0;
    for (int j0 = first; j0 < k1; j0 += STAGED_KEYS, b ^= 1) {
        cp_async_wait_all();
        __syncthreads();  // the tile is in; every thread is done with the other one
        if (j0 + STAGED_KEYS < k1)
            staged_fetch(&sh->tile[b ^ 1], kc, ks, vc, vs, j0 + STAGED_KEYS, k0, k1, kvh, hkv);
        const StagedTile* t = &sh->tile[b];
        // Scores: this warp's quarter of the dims of key `lane`.
        float s[STAGED_HEADS];
#pragma unroll
        for (int g = 0; g < STAGED_HEADS; g++) s[g] = 0.0f;
#pragma unroll
        for (int c = 0; c < STAGED_QUARTER / 16; c++) {
            int d0 = warp * STAGED_QUARTER + 16 * c;
            uint4 w = *(const uint4*)&t->k[lane][d0];
            u32 ws[4] = {w.x, w.y, w.z, w.w};
            float kf[16];
#pragma unroll
            for (int i = 0; i < 16; i++) kf[i] = staged_code(ws[i / 4], i % 4);
#pragma unroll
            for (int g = 0; g < STAGED_HEADS; g++) {
                if (g >= hb) break;
#pragma unroll
                for (int i = 0; i < 16; i += 4) {
                    float4 qq = *(const float4*)&sh->q[g][d0 + i];
                    s[g] = fmaf(qq.x, kf[i], s[g]);
                    s[g] = fmaf(qq.y, kf[i + 1], s[g]);
                    s[g] = fmaf(qq.z, kf[i + 2], s[g]);
                    s[g] = fmaf(qq.w, kf[i + 3], s[g]);
                }
            }
        }
#pragma unroll
        for (int g = 0; g < STAGED_HEADS; g++)
            if (g < hb) sh->part[warp][g][lane] = s[g];
        __syncthreads();
        // The softmax of heads warp and warp + 4 over this tile.
#pragma unroll
        for (int k = 0; k < 2; k++) {
            int g = warp + 4 * k, j = j0 + lane;
            if (g >= hb) break;
            bool in = j >= k0 && j < k1;
            float sc = ((sh->part[0][g][lane] + sh->part[1][g][lane]) + (sh->part[2][g][lane] + sh->part[3][g][lane])) *
                       t->ks[lane] * scale;
            // The tile has a key in range, so the new max is finite.
            float m2 = fmaxf(m[k], warp_max(in ? sc : NEG_INF));
            float e = in ? expf(sc - m2) : 0.0f, corr = expf(m[k] - m2);
            l[k] = l[k] * corr + warp_sum(e);
            m[k] = m2;
            sh->p[g][lane] = e * t->vs[lane];
            if (lane == 0) sh->corr[g] = corr;
        }
        __syncthreads();
        // Outputs: dims threadIdx.x·STAGED_DIMS.. of every head.
#pragma unroll
        for (int g = 0; g < STAGED_HEADS; g++) {
            if (g >= hb) break;
            float corr = sh->corr[g];
#pragma unroll
            for (int i = 0; i < STAGED_DIMS; i++) acc[g][i] *= corr;
        }
#pragma unroll
        for (int jj = 0; jj < STAGED_KEYS; jj += 4) {
            float vf[4][STAGED_DIMS];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const u8* vr = &t->v[jj + u][threadIdx.x * STAGED_DIMS];
                u32 w = STAGED_DIMS == 2 ? (u32)*(const u16*)vr : (u32)*vr;
#pragma unroll
                for (int i = 0; i < STAGED_DIMS; i++) vf[u][i] = staged_code(w, i);
            }
#pragma unroll
            for (int g = 0; g < STAGED_HEADS; g++) {
                if (g >= hb) break;
                float4 pp = *(const float4*)&sh->p[g][jj];
                float pu[4] = {pp.x, pp.y, pp.z, pp.w};
#pragma unroll
                for (int u = 0; u < 4; u++)
#pragma unroll
                    for (int i = 0; i < STAGED_DIMS; i++) acc[g][i] = fmaf(pu[u], vf[u][i], acc[g][i]);
            }
        }
    }
#pragma unroll
    for (int g = 0; g < STAGED_HEADS; g++) {
        if (g >= hb) break;
#pragma unroll
        for (int i = 0; i < STAGED_DIMS; i++) dst[g * stride + 2 + threadIdx.x * STAGED_DIMS + i] = acc[g][i];
    }
#pragma unroll
    for (int k = 0; k < 2; k++) {
        int g = warp + 4 * k;
        if (g < hb && lane == 0) {
            dst[g * stride] = m[k];
            dst[g * stride + 1] = l[k];
        }
    }
}

// attention_part over an int8 cache, staged: the same grid and record, hb up to STAGED_HEADS.
extern "C" __global__ void __launch_bounds__(128) attention_part_staged(
    const float* q, const u8* kc, const float* ks, const u8* vc, const float* vs, float* part, int hq, int hkv,
    int pos0, const int* pos_at, float scale, int block, int window, int nchunks, int hb) {
    GRID_PROLOGUE();
    __shared__ StagedShared sh;
    int groups = gridDim.x / nchunks, gi = blockIdx.x % groups, c = blockIdx.x / groups;
    int t = gi / (hq / hb), h0 = gi % (hq / hb) * hb;
    int pos = position(pos0, pos_at), lo, hi;
    key_range(t, pos, block, window, &lo, &hi);
    int first = window > 0 ? max(0, pos - window + 1) / ATTN_CHUNK : 0;
    float* dst = part + (((long)t * hq + h0) * nchunks + c) * (HEAD_DIM + 2);
    attend_staged(&sh, q + (long)t * hq * HEAD_DIM, kc, ks, vc, vs, h0, hb, hq, hkv, lo, hi,
                  (first + c) * ATTN_CHUNK, scale, dst, (long)nchunks * (HEAD_DIM + 2));
}

// attention_part_seqs over int8 caches, staged: the same grid and records.
extern "C" __global__ void __launch_bounds__(128) attention_part_seqs_staged(const float* q, float* part, int hq,
                                                                             int hkv, float scale, AttnSlots s,
                                                                             int rows, int nchunks, int hb) {
    GRID_PROLOGUE();
    __shared__ StagedShared sh;
    SeqsBlock b;
    if (!seqs_block(s, part, hq, rows, nchunks, hb, &b)) return;
    int i = b.i;
    attend_staged(&sh, q + ((long)s.off[i] + b.t) * hq * HEAD_DIM, (const u8*)s.kc[i], (const float*)s.ks[i],
                  (const u8*)s.vc[i], (const float*)s.vs[i], b.row % hq, hb, hq, hkv, b.lo, b.hi, b.c * ATTN_CHUNK,
                  scale, b.dst, (long)nchunks * (HEAD_DIM + 2));
}
#else
// Other head dims keep the warp-per-key kernels (ops::staged_attention); these are declared so
// that every build has the kernels cuda/signatures.rs lists, and are never launched.
extern "C" __global__ void attention_part_staged(const float*, const u8*, const float*, const u8*, const float*,
                                                 float*, int, int, int, const int*, float, int, int, int, int) {}
extern "C" __global__ void attention_part_seqs_staged(const float*, float*, int, int, float, AttnSlots, int, int,
                                                      int) {}
#endif

#if HEAD_DIM % 16 == 0
#define FA_WARPS 4
#define FA_KEYS 32
// Halves per shared-memory row: 8 more than the head keeps the fragment loads conflict-free.
#define FA_STRIDE (HEAD_DIM + 8)

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

// x *= sigmoid(gate), elementwise (the attention output gate).
extern "C" __global__ void sigmoid_gate(float* x, const float* gate, long n) {
    GRID_PROLOGUE();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= sigmoid(gate[i]);
}

// sigmoid_gate, then to_f16_tc of x for the output product (the bits of the two kernels): a warp
// per 256-value block, nb of them a token.
extern "C" __global__ void sigmoid_gate_to_f16_tc(float* x, const float* gate, u16* xh, float* xscale, long blocks,
                                                   i8* bq, float* bd, short* bs, int nb) {
    GRID_PROLOGUE_BRIDGE();
    long blk = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (blk >= blocks) return;
    float* xb = x + 256 * blk;
    const float* gb = gate + 256 * blk;
    tc_input_block(
        [&](int i) {
            float v = xb[i] * sigmoid(gb[i]);
            xb[i] = v;
            return v;
        },
        xh, xscale, bq, bd, bs, blk, nb, blocks / nb);
}
