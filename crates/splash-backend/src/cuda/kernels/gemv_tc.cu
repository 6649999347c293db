// Tensor-core GEMVs for Q4_K and Q6_K (tiled and stream-K), the grouped expert products, and
// the f16 / bf16 conversions of their inputs.

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

// The 6-bit Q6_K codes (0..63, a byte each) of sub-block m of a lane's word: lo and hi its low
// bits (ql words of r.a and r.b), h its high bits (qh, r.c).
__device__ __forceinline__ u32 q6k_codes(u32 lo, u32 hi, u32 h, int m) {
    if (m == 0) return (lo & 0x0f0f0f0fu) | ((h << 4) & 0x30303030u);
    if (m == 1) return (hi & 0x0f0f0f0fu) | ((h << 2) & 0x30303030u);
    if (m == 2) return ((lo >> 4) & 0x0f0f0f0fu) | (h & 0x30303030u);
    return ((hi >> 4) & 0x0f0f0f0fu) | ((h >> 2) & 0x30303030u);
}

// Four Q6_K codes less 32, as signed bytes: bit 5 flipped, then sign-extended from it.
__device__ __forceinline__ u32 q6k_signed(u32 v) {
    u32 u = v ^ 0x20202020u;
    return u | ((u & 0x20202020u) * 6u);
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

// The 6-bit scales (sc) and minimums (mn) of lane q's four Q4_K sub-blocks 4n..4n+3 (n = q>>1),
// a byte each, from the row's header in r.a (llama.cpp's get_scale_min_k4, four at a time).
__device__ __forceinline__ void q4k_scale_words(const TcRaw& r, int q, u32& sc, u32& mn) {
    if ((q >> 1) == 0) {
        sc = r.a.y & 0x3f3f3f3fu;
        mn = r.a.z & 0x3f3f3f3fu;
    } else {
        sc = (r.a.w & 0x0f0f0f0fu) | ((r.a.y >> 2) & 0x30303030u);
        mn = ((r.a.w >> 4) & 0x0f0f0f0fu) | ((r.a.z >> 2) & 0x30303030u);
    }
}

// The scales in f16 arithmetic: code factor × block scale, each a 6-bit (Q4_K) or 8-bit (Q6_K)
// integer times an f16, rounded once, as the f32 product converted to f16 rounds.
template <int F>
__device__ __forceinline__ TcScales tc_scales(const TcRaw& r, int q) {
    TcScales s;
    if (F == FMT_Q4_K) {
        u32 d = __byte_perm(r.a.x, 0, 0x1010u), neg_dmin = __byte_perm(r.a.x, 0, 0x3232u) ^ 0x80008000u;
        u32 sc, mn;
        q4k_scale_words(r, q, sc, mn);
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
        u32 v = q6k_codes(word_of(r.a, j), word_of(r.b, j), word_of(r.c, j), m);
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

// Walks this warp's units (chain j, 256-value block b) of a 16-row tile of `nb` blocks in order:
// chain j = warp from block b = j, then b = j + chains, ...; then chain j + warps (chains ≤ nb,
// so every chain has a block). `unit(r0, r1, b)` works on a unit's two halves (rows g and g + 8)
// while the next unit's loads are in flight; `chain_done(j)` follows the last unit of chain j.
// The first weights are asked for before GRID_PROLOGUE: everything else comes from the kernels
// before.
template <int F, class Unit, class ChainDone>
__device__ __forceinline__ void tile_units(const u8* tile, int nb, int chains, Unit unit, ChainDone chain_done) {
    int warps = blockDim.x >> 5, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr int seg_bytes = F == FMT_Q4_K ? Q4K_SEGMENT : Q6K_SEGMENT;
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
        unit(r0, r1, b);
        if (nj != j) chain_done(j);
        r0 = n0r;
        r1 = n1r;
        j = nj;
        b = nbk;
        have = next;
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
    int lane = threadIdx.x & 31;
    int g = lane >> 2, q = lane & 3;
    int n0 = tile_index * 16, nb = K >> 8;
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
    tile_units<F>(
        tile, nb, chains, [&](const TcRaw& r0, const TcRaw& r1, int b) { tc_block<F, NT>(r0, r1, b, q, x, xs, c); },
        [&](int j) {
            tc_chain_store<NT>(c, part, j);
#pragma unroll
            for (int i = 0; i < NT; i++) c[i][0] = c[i][1] = c[i][2] = c[i][3] = 0.0f;
        });
    tc_tile_sum<NT>(part, chains, n0, y, y2, split, N, T, cols);
}

// ---------------------------------------------------------------------------------------------
// The int8 GEMV of the same tiles (`SPLASH_TILED_GEMV=int8`): activations rounded to int8 per 32
// values (quantize_q8: codes, scale xd, exact sum xs), the weights' integer codes multiplied
// four at a time with dp4a, each sub-block's integer sum scaled once in f32. A 4-bit code costs
// a mask and a quarter of a dp4a where the tensor-core GEMV's f16 decoding costs about one and
// a half f16x2 operations: a one-token product issues about half the instructions. A lane
// reads the tensor-core GEMV's loads (tc_load, tile_units): lane (g, q) holds rows g and g + 8,
// the values 128·(q>>1) + 32m + 16·(q&1) + 4j + {0..3} of each block in word j of sub-block m,
// in byte order. A token's sums never meet another's, so any token count gives the same bits.

// A small integer as f32, exactly (|i| < 2^22), in two full-rate operations.
__device__ __forceinline__ float small_int_to_float(int i) { return __int_as_float(0x4B400000 + i) - 12582912.0f; }

// Byte `b` (0..3) of w, unsigned, as f32.
__device__ __forceinline__ float byte_to_float(u32 w, int b) {
    return __int_as_float((int)__byte_perm(w, 0x4B000000u, 0x7540u | b)) - 8388608.0f;
}

// One row's share of a block for lane (g, q), decoded once for every token: v[m][j] the signed
// byte codes (Q4_K: 0..15; Q6_K: code − 32) of the values above, value = mul[m]·code −
// minus[m]. The minimum is subtracted once per sub-block, as minus[m]·Σx over its 32 values, by
// the even lane of the pair that shares it (minus is 0 in the odd lane and in Q6_K).
struct Q8Row {
    u32 v[4][4];
    float mul[4], minus[4];
};

template <int F>
__device__ __forceinline__ Q8Row q8_row(const TcRaw& r, int q) {
    Q8Row w;
    if (F == FMT_Q4_K) {
        float d = f16_to_f32((u16)(r.a.x & 0xffff)), dmin = f16_to_f32((u16)(r.a.x >> 16));
        u32 sc, mn;
        q4k_scale_words(r, q, sc, mn);
        float keep = (q & 1) ? 0.0f : 1.0f;
#pragma unroll
        for (int m = 0; m < 4; m++) {
            w.mul[m] = d * byte_to_float(sc, m);
            w.minus[m] = keep * dmin * byte_to_float(mn, m);
#pragma unroll
            for (int j = 0; j < 4; j++) w.v[m][j] = (word_of(m < 2 ? r.b : r.c, j) >> (4 * (m & 1))) & 0x0f0f0f0fu;
        }
    } else {
        float d = f16_to_f32((u16)(r.d & 0xffff));
        u32 o = q & 1;
#pragma unroll
        for (int m = 0; m < 4; m++) {
            // Sub-block m's scale is byte (q&1) + 2m of the lane's eight, signed: flipping the
            // sign bit maps it to c + 128.
            u32 sw = (m < 2 ? r.s.x : r.s.y) ^ 0x80808080u;
            w.mul[m] = d * (byte_to_float(sw, o + 2 * (m & 1)) - 128.0f);
            w.minus[m] = 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++) w.v[m][j] = q6k_signed(q6k_codes(word_of(r.a, j), word_of(r.b, j), word_of(r.c, j), m));
        }
    }
    return w;
}

// acc + one token's Σ over a row's share of a block: xv[m] the token's 16 int8 values of
// sub-block m for this lane, xd / xs the sub-blocks' scales and sums.
__device__ __forceinline__ float q8_row_dot(const Q8Row& w, const uint4 (&xv)[4], float4 xd, float4 xs, float acc) {
    float d[4] = {xd.x, xd.y, xd.z, xd.w}, s[4] = {xs.x, xs.y, xs.z, xs.w};
#pragma unroll
    for (int m = 0; m < 4; m++) {
        int isum = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) isum = __dp4a((int)w.v[m][j], (int)word_of(xv[m], j), isum);
        acc = fmaf(w.mul[m], d[m] * small_int_to_float(isum), acc);
        acc = fmaf(-w.minus[m], s[m], acc);
    }
    return acc;
}

// y[t, n] = Σ_k W[n, k] x[t, k] for t < T ≤ MAXT, over the tiles as gemv_tc walks them (the same
// chains and their order, `split` and the outputs), from xq [T, K], xd and xs [T, K / 32].
template <int F, int MAXT>
__device__ void gemv_q8_tiles(const u8* W, long row_bytes, const i8* xq, const float* xd, const float* xs, float* y,
                              float* y2, int split, int N, int K, int T, int chains) {
    constexpr int NT = (MAXT + 7) / 8;
    __shared__ float part[TC_WARPS_MAX][32][4 * NT];
    int lane = threadIdx.x & 31, q = lane & 3;
    int n0 = blockIdx.x * 16, nb = K >> 8, subs = K >> 5;
    const u8* tile = W + (long)n0 * row_bytes;
    // This lane's values of token 0's block 0, and its sub-blocks' scales and sums.
    const i8* xl = xq + 128 * (q >> 1) + 16 * (q & 1);
    const float *dl = xd + 4 * (q >> 1), *sl = xs + 4 * (q >> 1);
    float acc[MAXT][2];
#pragma unroll
    for (int t = 0; t < MAXT; t++) acc[t][0] = acc[t][1] = 0.0f;
    tile_units<F>(
        tile, nb, chains,
        [&](const TcRaw& r0, const TcRaw& r1, int b) {
            Q8Row w0 = q8_row<F>(r0, q), w1 = q8_row<F>(r1, q);
#pragma unroll
            for (int t = 0; t < MAXT; t++) {
                if (t < T) {
                    const uint4* xp = (const uint4*)(xl + (long)t * K + 256 * b);
                    uint4 xv[4] = {xp[0], xp[2], xp[4], xp[6]};
                    float4 d4 = *(const float4*)(dl + (long)t * subs + 8 * b);
                    float4 s4 = *(const float4*)(sl + (long)t * subs + 8 * b);
                    acc[t][0] = q8_row_dot(w0, xv, d4, s4, acc[t][0]);
                    acc[t][1] = q8_row_dot(w1, xv, d4, s4, acc[t][1]);
                }
            }
        },
        [&](int j) {
            // The chain's sums over the quad's lanes, into the tensor-core GEMV's layout of
            // partial sums: lane (g, q') holds tokens 8i + 2q' + {0, 1} at 4i + {0, 1} (row g)
            // and 4i + {2, 3} (row g + 8).
#pragma unroll
            for (int t = 0; t < MAXT; t++) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float v = acc[t][h];
                    v += __shfl_xor_sync(0xffffffffu, v, 1);
                    v += __shfl_xor_sync(0xffffffffu, v, 2);
                    if (((t & 7) >> 1) == q) part[j][lane][4 * (t >> 3) + (t & 1) + 2 * h] = v;
                    acc[t][h] = 0.0f;
                }
            }
        });
    tc_tile_sum<NT>(part, chains, n0, y, y2, split, N, T, nullptr);
}

// ---------------------------------------------------------------------------------------------
// The int8 tensor-core GEMV of Q4_K and Q6_K tiles (`SPLASH_TILED_GEMV=int8-mma`): activations
// rounded to int8 per 256-value block (quantize_q8_blocks: the codes in this kernel's k order,
// one scale xd a block, the codes' sum xs per 32 values), each 32-value sub-block s multiplied
// by mma.sync m16n8k32 (s8 × s8 → s32), the sub-blocks' sums weighted by their scales in integer
// arithmetic, and each block scaled once in f32:
//     Q4_K: y += xd · (d · Σ_s sc_s · Σ_k code·x  −  dmin · Σ_s mn_s · xs_s)
//     Q6_K: y += xd · d · Σ_h sc_h · Σ_k (code − 32)·x    (h: the block's 16-value halves)
// Everything before that step is exact, so a block's integers are the same whatever
// instructions made them, and a token's column never meets another's: any batch gives a token
// its bits. The f32 work is per block and token, not per sub-block, so 16 tokens cost little
// more than one (the dp4a kernel above scales every sub-block of every token).
//
// Fragments (m16n8k32 .s8, lane = 4g + q): a0 = row g, k 4q..4q+3; a1 = row g + 8, the same k;
// a2, a3 = those rows at k 16+4q..16+4q+3; b0 = token g, k 4q..4q+3; b1 = k 16+4q..; C as
// m16n8k16's (c0, c1 = row g, tokens 2q, 2q+1; c2, c3 = row g + 8). The tile's loads (tc_load)
// give lane q the values 16·(q&1) + 0..15 of sub-blocks 4·(q>>1)..+3 (word j: values 4j..4j+3
// of that half). Lanes q and q^2 swap their words 2 and 3, so that lane q holds the values
// 16·(q&1) + 8·[s>>2 != q>>1] + 0..7 of every sub-block s: the first four are its k 4q..4q+3,
// the last four its k 16+4q... quantize_q8_blocks writes a token's bytes in that order, lane
// q's 64 in four 16-byte chunks (chunk k: sub-blocks 2k, 2k + 1; where they lie: q8_spot).
//
// A Q6_K scale covers 16 values, one half of a sub-block, and lane q's values are all of half
// q&1. So each sub-block takes two mmas: one over all 32 values and one with the odd lanes'
// activations zeroed (half 0 alone); half 1 is their difference.

#ifndef KERNEL_EMULATION  // kernels_on_host.h defines it on the CPU
__device__ __forceinline__ void mma_s8_16832(int* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
#endif

// Where lane q's 8 values of sub-block s start within it (see above).
__device__ __forceinline__ int q8_blocks_offset(int q, int s) { return 16 * (q & 1) + ((s >> 2) != (q >> 1) ? 8 : 0); }

// Where a batch's int8 blocks lie (quantize_q8_blocks writes them, the GEMVs below read them):
// in groups of GEMV_MAX_T tokens (a launch's; the last group holds the rest), group after group.
// In a group of G tokens block b of all G lies together: its codes 256·G bytes from 256·G·b,
// its scales xd[G·b + t] and sums xs[8·(G·b + t) + s] from the group's first. In the codes, lane
// q's 16-byte chunk k (0..3) of token t lies at 16 · q8_chunk(q, k, t, G): with G > 1 the
// tokens' chunks k together, so that an mma's load of chunk k for 8 tokens (lane (g, q): token
// g's lane q) reads 512 contiguous bytes, four lines, and a 16-token unit's scales and sums lie
// in three (a row a token, the layout before 2026-12-07, took 16 lines a load and 32 for those);
// a lone token (one-token decode) keeps a lane's chunks together, which its dp4a build reads
// faster than chunks k together (BENCHMARKS.md, 2026-12-07, thirtieth session).
__device__ __forceinline__ constexpr int q8_chunk(int q, int k, int t, int G) {
    return G == 1 ? 4 * q + k : 4 * (k * G + t) + q;
}

// Block b of token t of a batch of T tokens of nb blocks: the scale index of the group's block
// b (`at`; its codes at 256·at, its sums at 8·at), the group's tokens and t's place in it.
struct Q8Spot {
    long at;
    int group, t;
};
__device__ __forceinline__ Q8Spot q8_spot(long w, int nb, long T) {
    long t = w / nb, first = t - t % GEMV_MAX_T;
    int b = (int)(w - t * nb);
    int group = (int)min((long)GEMV_MAX_T, T - first);
    return {first * nb + (long)b * group, group, (int)(t - first)};
}

// One row of a tile (rows g or g + 8 of lane (g, q)) as the mma takes it: w[s][0] and w[s][1]
// the codes of its a0/a1 and a2/a3 registers for sub-block s (Q4_K: 0..15; Q6_K: code − 32,
// signed). Q4_K: sc[h] and mn[h] the 6-bit scales and minimums of sub-blocks 4h..4h+3, a byte
// each, and the block scales d and dmin. Q6_K: sc[0..3] the row's 16 signed scales, d.
struct I8Row {
    u32 w[8][2];
    u32 sc[4], mn[2];
    float d, dmin;
};

template <int F>
__device__ __forceinline__ I8Row i8_row(const TcRaw& r) {
    I8Row o;
    int q = threadIdx.x & 3;
    bool low = (q >> 1) == 0;  // this lane's own sub-blocks are 0..3
    // The partner's words 2 and 3 of the code words b and c (and of a, Q6_K's low bits below),
    // for the sub-blocks this lane lacks.
    u32 pb[2] = {__shfl_xor_sync(0xffffffffu, r.b.z, 2), __shfl_xor_sync(0xffffffffu, r.b.w, 2)};
    u32 pc[2] = {__shfl_xor_sync(0xffffffffu, r.c.z, 2), __shfl_xor_sync(0xffffffffu, r.c.w, 2)};
    if (F == FMT_Q4_K) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            u32 ob = h ? r.b.y : r.b.x, oc = h ? r.c.y : r.c.x;
            // Nibble words of sub-blocks 0..3 (lo) and 4..7 (hi): low nibbles m = 0 / 2, high
            // m = 1 / 3.
            u32 lb = low ? ob : pb[h], lc = low ? oc : pc[h], hb = low ? pb[h] : ob, hc = low ? pc[h] : oc;
            o.w[0][h] = lb & 0x0f0f0f0fu;
            o.w[1][h] = (lb >> 4) & 0x0f0f0f0fu;
            o.w[2][h] = lc & 0x0f0f0f0fu;
            o.w[3][h] = (lc >> 4) & 0x0f0f0f0fu;
            o.w[4][h] = hb & 0x0f0f0f0fu;
            o.w[5][h] = (hb >> 4) & 0x0f0f0f0fu;
            o.w[6][h] = hc & 0x0f0f0f0fu;
            o.w[7][h] = (hc >> 4) & 0x0f0f0f0fu;
        }
        q4k_scale_words(r, 0, o.sc[0], o.mn[0]);
        q4k_scale_words(r, 2, o.sc[1], o.mn[1]);
        o.d = f16_to_f32((u16)(r.a.x & 0xffff));
        o.dmin = f16_to_f32((u16)(r.a.x >> 16));
    } else {
        u32 pa[2] = {__shfl_xor_sync(0xffffffffu, r.a.z, 2), __shfl_xor_sync(0xffffffffu, r.a.w, 2)};
#pragma unroll
        for (int h = 0; h < 2; h++) {
            u32 oa = h ? r.a.y : r.a.x, ob = h ? r.b.y : r.b.x, oc = h ? r.c.y : r.c.x;
#pragma unroll
            for (int m = 0; m < 4; m++) {
                u32 own = q6k_signed(q6k_codes(oa, ob, oc, m));
                u32 other = q6k_signed(q6k_codes(pa[h], pb[h], pc[h], m));
                o.w[m][h] = low ? own : other;
                o.w[4 + m][h] = low ? other : own;
            }
        }
        // The row's 16 scales: this lane has 8n..8n+7 (n = q>>1), its partner the others.
        u32 ps[2] = {__shfl_xor_sync(0xffffffffu, r.s.x, 2), __shfl_xor_sync(0xffffffffu, r.s.y, 2)};
        o.sc[0] = low ? r.s.x : ps[0];
        o.sc[1] = low ? r.s.y : ps[1];
        o.sc[2] = low ? ps[0] : r.s.x;
        o.sc[3] = low ? ps[1] : r.s.y;
        o.d = f16_to_f32((u16)(r.d & 0xffff));
    }
    return o;
}

// Byte s & 3 of the word of sub-blocks 4·(s>>2)..: a Q4_K scale or minimum.
__device__ __forceinline__ int i8_byte(const u32* w, int s) { return (int)((w[s >> 2] >> (8 * (s & 3))) & 0xffu); }

// Q6_K scale i (0..15) of a row, signed.
__device__ __forceinline__ int i8_signed_byte(const u32 (&w)[4], int i) {
    return (int)(w[i >> 2] << (24 - 8 * (i & 3))) >> 24;
}

// Σ_s mn_s · xs_s over a block's 8 sub-blocks: xs the token's 8 sums (int16 pairs).
__device__ __forceinline__ int i8_minimums(const u32* mn, uint4 xs) {
    int v = __dp2a_lo((int)xs.x, (int)mn[0], 0);
    v = __dp2a_hi((int)xs.y, (int)mn[0], v);
    v = __dp2a_lo((int)xs.z, (int)mn[1], v);
    return __dp2a_hi((int)xs.w, (int)mn[1], v);
}

// gemv_i8tc's chain sums of each NT, one array for every instance in a kernel (a product group
// has two).
__shared__ float i8tc_part1[TC_WARPS_MAX][32][4];
__shared__ float i8tc_part2[TC_WARPS_MAX][32][8];

// y[t, n] = Σ_k W[n, k] x[t, k] for 2 ≤ T ≤ 8·NT (one token runs gemv1_i8tc, which reads a lone
// token's layout and gives these bits) over the tiles as gemv_tc walks them (the same
// chains and their order, `split` and the outputs), from one group of T tokens' int8 blocks (codes
// xq, scales xd, sums xs (Q4_K only); see q8_spot). The block takes 16-row tile `tile`.
template <int F, int NT>
__device__ void gemv_i8tc(const u8* W, long row_bytes, const i8* xq, const float* xd, const short* xs, float* y,
                          float* y2, int split, int N, int K, int T, int chains, int tile_index) {
    static_assert(NT == 1 || NT == 2, "gemv_i8tc: 8 or 16 tokens");
    auto part = reinterpret_cast<float(*)[32][4 * NT]>(NT == 1 ? &i8tc_part1[0][0][0] : &i8tc_part2[0][0][0]);
    int lane = threadIdx.x & 31;
    int g = lane >> 2, q = lane & 3;
    int n0 = tile_index * 16, nb = K >> 8;
    const u8* tile = W + (long)n0 * row_bytes;
    // In a block's activations (uint4): token 8i + g's codes from ox[i] (this lane's 16 bytes of
    // chunk 0; chunk k 4·T·k on: q8_chunk for T ≥ 2), tokens 8i + 2q + e's scales and sums at
    // ot[i][e]. Tokens past T repeat the last one (their columns are not written).
    int ox[NT], ot[NT][2];
#pragma unroll
    for (int i = 0; i < NT; i++) {
        ox[i] = 4 * min(8 * i + g, T - 1) + q;
#pragma unroll
        for (int e = 0; e < 2; e++) ot[i][e] = min(8 * i + 2 * q + e, T - 1);
    }
    // Q6_K: the activations of half 0 (even lanes) alone.
    const u32 half0 = (q & 1) ? 0u : 0xffffffffu;
    float c[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++) c[i][0] = c[i][1] = c[i][2] = c[i][3] = 0.0f;
    tile_units<F>(
        tile, nb, chains,
        [&](const TcRaw& r0, const TcRaw& r1, int b) {
            // The unit's block of the tokens' codes, sums and scales.
            const uint4* codes = (const uint4*)(xq + 256L * T * b);
            const uint4* sums = (const uint4*)xs + (long)T * b;
            const float* scales = xd + (long)T * b;
            I8Row w0 = i8_row<F>(r0), w1 = i8_row<F>(r1);
#pragma unroll
            for (int i = 0; i < NT; i++) {
                uint4 v[4];
#pragma unroll
                for (int k = 0; k < 4; k++) v[k] = codes[ox[i] + 4 * T * k];
                int s1[4] = {0, 0, 0, 0};
#pragma unroll
                for (int s = 0; s < 8; s++) {
                    int cs[4] = {0, 0, 0, 0};
                    u32 b0 = word_of(v[s >> 1], 2 * (s & 1)), b1 = word_of(v[s >> 1], 2 * (s & 1) + 1);
                    mma_s8_16832(cs, w0.w[s][0], w1.w[s][0], w0.w[s][1], w1.w[s][1], b0, b1);
                    if (F == FMT_Q4_K) {
                        int sg = i8_byte(w0.sc, s), sg8 = i8_byte(w1.sc, s);
                        s1[0] += sg * cs[0];
                        s1[1] += sg * cs[1];
                        s1[2] += sg8 * cs[2];
                        s1[3] += sg8 * cs[3];
                    } else {
                        int h0[4] = {0, 0, 0, 0};
                        mma_s8_16832(h0, w0.w[s][0], w1.w[s][0], w0.w[s][1], w1.w[s][1], b0 & half0, b1 & half0);
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const I8Row& w = e < 2 ? w0 : w1;
                            int lo = i8_signed_byte(w.sc, 2 * s), hi = i8_signed_byte(w.sc, 2 * s + 1);
                            // lo·h0 + hi·(all − h0)
                            s1[e] += hi * cs[e] + (lo - hi) * h0[e];
                        }
                    }
                }
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const I8Row& w = e < 2 ? w0 : w1;
                    float block;
                    if (F == FMT_Q4_K)
                        block = fmaf(w.d, (float)s1[e], -(w.dmin * (float)i8_minimums(w.mn, sums[ot[i][e & 1]])));
                    else
                        block = w.d * (float)s1[e];
                    c[i][e] = fmaf(scales[ot[i][e & 1]], block, c[i][e]);
                }
            }
        },
        [&](int j) {
            tc_chain_store<NT>(c, part, j);
#pragma unroll
            for (int i = 0; i < NT; i++) c[i][0] = c[i][1] = c[i][2] = c[i][3] = 0.0f;
        });
    tc_tile_sum<NT>(part, chains, n0, y, y2, split, N, T, nullptr);
}

// The one-token build of gemv_i8tc, with its bits: each block's integer sums are the same
// integers made another way, and the f32 steps, the chains and their sum are gemv_i8tc's. A lane
// multiplies its own loads by dp4a (values 16·(q&1) + 0..15 of sub-blocks 4n..4n+3, n = q>>1,
// the layout gemv_q8_tiles reads) and the quad adds its four shares: no word swap between lanes
// and no mma whose seven other token columns would be wasted. In quantize_q8_blocks' order the
// first eight of those values of sub-block s are in lane q's chunk s / 2 of the block, the last
// eight in lane q^2's (its share of s).
template <int F>
__device__ void gemv1_i8tc(const u8* W, long row_bytes, const i8* xq, const float* xd, const short* xs, float* y,
                           float* y2, int split, int N, int K, int chains, int tile_index) {
    __shared__ float part[TC_WARPS_MAX][32][4];
    int lane = threadIdx.x & 31, q = lane & 3, n = q >> 1;
    int n0 = tile_index * 16, nb = K >> 8;
    const u8* tile = W + (long)n0 * row_bytes;
    // Chunks 2n and 2n + 1 (`step` bytes on) of lane q (the first eight of each sub-block's
    // values) and of lane q^2.
    const i8* first = xq + 16 * q8_chunk(q, 2 * n, 0, 1);
    const i8* last = xq + 16 * q8_chunk(q ^ 2, 2 * n, 0, 1);
    constexpr int step = 16 * (q8_chunk(0, 1, 0, 1) - q8_chunk(0, 0, 0, 1));
    float c[2] = {0.0f, 0.0f};
    // A row's Σ over block b's sub-blocks of scale · Σ code·x, from the lane's share (Q4_K: sc
    // its four scales, a byte each) and the quad's others.
    auto quad_sum = [&](const TcRaw& r, const u32 (&x)[4][4], u32 sc) {
        int sum = 0;
#pragma unroll
        for (int m = 0; m < 4; m++) {
            int dot = 0, scale;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                u32 code = F == FMT_Q4_K ? (word_of(m < 2 ? r.b : r.c, j) >> (4 * (m & 1))) & 0x0f0f0f0fu
                                         : q6k_signed(q6k_codes(word_of(r.a, j), word_of(r.b, j), word_of(r.c, j), m));
                dot = __dp4a((int)code, (int)x[m][j], dot);
            }
            if (F == FMT_Q4_K)
                scale = i8_byte(&sc, m);
            else  // scale (q&1) + 2m of the lane's eight (see tc_scales)
                scale = (int)((m < 2 ? r.s.x : r.s.y) << (24 - 8 * ((q & 1) + 2 * (m & 1)))) >> 24;
            sum += scale * dot;
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        return sum + __shfl_xor_sync(0xffffffffu, sum, 2);
    };
    tile_units<F>(
        tile, nb, chains,
        [&](const TcRaw& r0, const TcRaw& r1, int b) {
            const i8 *f = first + 256 * b, *l = last + 256 * b;
            uint4 f0 = *(const uint4*)f, f1 = *(const uint4*)(f + step);
            uint4 l0 = *(const uint4*)l, l1 = *(const uint4*)(l + step);
            const u32 x[4][4] = {{f0.x, f0.y, l0.x, l0.y}, {f0.z, f0.w, l0.z, l0.w},
                                 {f1.x, f1.y, l1.x, l1.y}, {f1.z, f1.w, l1.z, l1.w}};
            float xdb = xd[b];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const TcRaw& r = h ? r1 : r0;
                float block;
                if (F == FMT_Q4_K) {
                    // The scales and minimums of sub-blocks 0..3 and 4..7.
                    u32 sc[2], mn[2];
                    q4k_scale_words(r, 0, sc[0], mn[0]);
                    q4k_scale_words(r, 2, sc[1], mn[1]);
                    float d = f16_to_f32((u16)(r.a.x & 0xffff)), dmin = f16_to_f32((u16)(r.a.x >> 16));
                    float s = (float)quad_sum(r, x, sc[n]);
                    block = fmaf(d, s, -(dmin * (float)i8_minimums(mn, ((const uint4*)xs)[b])));
                } else {
                    block = f16_to_f32((u16)(r.d & 0xffff)) * (float)quad_sum(r, x, 0);
                }
                c[h] = fmaf(xdb, block, c[h]);
            }
        },
        [&](int j) {
            // gemv_i8tc's layout, where a lone token fills every column of its lane.
            float(&p)[4] = part[j][lane];
            p[0] = p[1] = c[0];
            p[2] = p[3] = c[1];
            c[0] = c[1] = 0.0f;
        });
    tc_tile_sum<1>(part, chains, n0, y, y2, split, N, 1, nullptr);
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

// The expert products of a MoE layer, grouped by expert (ops::moe_route): block (a, tile) multiplies
// tile `tile` of the a-th active expert's weight (its pointer in `table`) by every pair routed
// to it, 16 columns at a time, so each expert's weights are read once however many tokens chose
// it. Pair p reads activation row p / col_div (its token for gate / up, the pair itself for
// down) and writes row p of y; each pair gets what its token alone would get. With a second
// table (table_b, y_b: the up products beside the gate ones), the second half of the grid does
// the same for it. A prefill pass's products (dozens of pairs an expert) take gemm_tc_experts.
// WIDE: up to 16 pairs at a time (the 16-column build beside the 8-column one); without it, 8
// at a time, and the kernel keeps only the 8-column build's registers (an expert has at most
// as many pairs as the pass has tokens). The same bits either way (each pair's sums are its
// own). ops::launch_experts takes the 8-pair build for one-token passes only: on an H100 it
// made the 35B-A3B's one-token pass 0.03-0.11 ms faster and its 4- and 8-row passes 0.15-0.35
// ms slower (BENCHMARKS.md, thirty-fourth session).
template <int F, bool WIDE>
__device__ void gemv_tc_experts(const u64* table, float* y, const u64* table_b, float* y_b, const int* active,
                                const int* offsets, const int* order, long row_bytes, const u16* xh,
                                const float* xscale, int N, int K, int col_div, int chains) {
    ExpertBlock eb = expert_block(table, y, table_b, y_b, N);
    int e = active[eb.a];
    if (e < 0) return;  // the whole block
    const u8* W = (const u8*)eb.table[e];
    int off = offsets[eb.a], cnt = offsets[eb.a + 1] - off;
    const int step = WIDE ? 16 : 8;
    for (int c0 = 0; c0 < cnt; c0 += step) {
        int n = min(step, cnt - c0);
        const int* cols = order + off + c0;
        if (!WIDE || n <= 8)
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
// 5.3 / 12.4 / 47.4 µs → 5.2 / 11.4 / 37.1; it spills about 200 bytes a thread), Q6_K's
// uncapped (slower capped at 1 and 4 tokens), unless EXPERT_REGS caps both (SPLASH_EXPERT_REGS,
// a measurement switch). The 8-pair build (EXPERT8_REGS_*, one-token passes): Q4_K's at most
// 136, where it needs 135 and spills nothing (ptxas spilled 20 bytes at a cap of 144); Q6_K's
// uncapped (162).
#if defined(KERNEL_EMULATION)
#define EXPERT_REGS_q4_k
#define EXPERT_REGS_q6_k
#define EXPERT8_REGS_q4_k
#define EXPERT8_REGS_q6_k
#elif defined(EXPERT_REGS)
#define EXPERT_REGS_q4_k __maxnreg__(EXPERT_REGS)
#define EXPERT_REGS_q6_k __maxnreg__(EXPERT_REGS)
#define EXPERT8_REGS_q4_k __maxnreg__(EXPERT_REGS)
#define EXPERT8_REGS_q6_k __maxnreg__(EXPERT_REGS)
#else
#define EXPERT_REGS_q4_k __maxnreg__(128)
#define EXPERT_REGS_q6_k
#define EXPERT8_REGS_q4_k __maxnreg__(136)
#define EXPERT8_REGS_q6_k
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
    EXPERT_KERNEL(EXPERT_REGS_##NAME, gemv_tc_experts_##NAME, gemv_tc_experts<F, true>)         \
    EXPERT_KERNEL(EXPERT8_REGS_##NAME, gemv_tc_experts8_##NAME, gemv_tc_experts<F, false>)      \
    EXPERT_KERNEL(GEMM_EXPERT_REGS, gemm_tc_experts_##NAME, gemm_tc_experts<F>)

// gemv{1,2,4,8}_q8t_*: the int8 GEMV of the tiles for up to that many tokens, gemv_q8t_*: up to
// 16. Each build keeps the registers its tokens need (a token's bits are the same in all).
#define Q8_TILES_BUILD(NAME, F, PREFIX, MAXT)                                                     \
    extern "C" __global__ void PREFIX##_q8t_##NAME(const u8* W, long row_bytes, const i8* xq,     \
                                                   const float* xd, const float* xs, float* y,    \
                                                   float* y2, int split, int N, int K, int T) {   \
        gemv_q8_tiles<F, MAXT>(W, row_bytes, xq, xd, xs, y, y2, split, N, K, T, blockDim.x >> 5); \
    }
#define Q8_TILES_KERNEL(NAME, F)              \
    Q8_TILES_BUILD(NAME, F, gemv1, 1)         \
    Q8_TILES_BUILD(NAME, F, gemv2, 2)         \
    Q8_TILES_BUILD(NAME, F, gemv4, 4)         \
    Q8_TILES_BUILD(NAME, F, gemv8, 8)         \
    Q8_TILES_BUILD(NAME, F, gemv, GEMV_MAX_T)

// gemv8_i8tc_*: the int8 tensor-core GEMV for 2 to 8 tokens, gemv_i8tc_*: up to 16. The 8-token
// builds at most I8TC8_REGS registers (occupancy hides the weights' latency).
#if !defined(KERNEL_EMULATION) && !defined(I8TC8_REGS)
#define I8TC8_REGS 128
#endif
#ifdef KERNEL_EMULATION
#define I8TC_REGS_gemv8
#else
#define I8TC_REGS_gemv8 __maxnreg__(I8TC8_REGS)
#endif
// The 16-token builds and gemv_group at most I8TC16_REGS registers (SPLASH_INT8_MMA16_REGS,
// default 168: three 4-warp blocks an SM, without spills; uncapped they take 174–178), e.g.
// 128 for four.
#ifndef I8TC16_REGS
#define I8TC16_REGS 168
#endif
#ifdef KERNEL_EMULATION
#define I8TC_REGS_gemv
#else
#define I8TC_REGS_gemv __maxnreg__(I8TC16_REGS)
#endif
#define I8TC_BUILD(PREFIX, NT, NAME, F)                                                                 \
    extern "C" __global__ void I8TC_REGS_##PREFIX PREFIX##_i8tc_##NAME(const u8* W, long row_bytes, const i8* xq, \
                                                  const float* xd, const short* xs, float* y, float* y2,      \
                                                  int split, int N, int K, int T) {                           \
        gemv_i8tc<F, NT>(W, row_bytes, xq, xd, xs, y, y2, split, N, K, T, blockDim.x >> 5, blockIdx.x);       \
    }
// gemv1_i8tc_*: one token, gemv_i8tc's bits (T must be 1). Q4_K's at most 80 registers, its own
// count: six 4-warp blocks an SM (registers go to a warp in 256s).
#ifdef KERNEL_EMULATION
#define I8TC1_REGS_q4_k
#else
#define I8TC1_REGS_q4_k __maxnreg__(80)
#endif
#define I8TC1_REGS_q6_k
#define I8TC1_BUILD(NAME, F)                                                                           \
    extern "C" __global__ void I8TC1_REGS_##NAME gemv1_i8tc_##NAME(const u8* W, long row_bytes, const i8* xq, const float* xd, \
                                                 const short* xs, float* y, float* y2, int split, int N,     \
                                                 int K, int T) {                                              \
        gemv1_i8tc<F>(W, row_bytes, xq, xd, xs, y, y2, split, N, K, blockDim.x >> 5, blockIdx.x);            \
    }
I8TC1_BUILD(q4_k, FMT_Q4_K)
I8TC1_BUILD(q6_k, FMT_Q6_K)
I8TC_BUILD(gemv8, 1, q4_k, FMT_Q4_K)
I8TC_BUILD(gemv, 2, q4_k, FMT_Q4_K)
I8TC_BUILD(gemv8, 1, q6_k, FMT_Q6_K)
I8TC_BUILD(gemv, 2, q6_k, FMT_Q6_K)

// The products of one input by up to PRODUCT_GROUP_MAX weights in one launch (a GDN layer's
// q/k/v/z and b/a, an attention layer's q, k and v), so that the small ones run beside the large
// one instead of after it: product i takes blocks end[i - 1] .. end[i] - 1. A Q4_K or Q6_K
// product runs gemv_i8tc on tile (block − its first) with its own `chains` (the bits of its own
// launch; the block's warps take the chains in turn); a Q8_0 one (few rows) runs gemv1_q8_q8_0's
// blocks, end[i] − end[i − 1] = T · its blocks a token. Blocks of 4 warps, the row GEMV's.
#define PRODUCT_GROUP_MAX 4
struct ProductGroup {
    u64 w[PRODUCT_GROUP_MAX], y[PRODUCT_GROUP_MAX], y2[PRODUCT_GROUP_MAX];
    long row_bytes[PRODUCT_GROUP_MAX];
    int fmt[PRODUCT_GROUP_MAX], n[PRODUCT_GROUP_MAX], split[PRODUCT_GROUP_MAX], chains[PRODUCT_GROUP_MAX],
        end[PRODUCT_GROUP_MAX];
};

// NT = 0: one token on gemv1_i8tc (the same bits; the others take 2 to 8·NT).
template <int NT>
__device__ __forceinline__ void product_group(const ProductGroup& g, const i8* bq, const float* bd, const short* bs,
                                           const i8* xq, const float* xd, const float* xs, int K, int T) {
    int i = 0;
    while (i < PRODUCT_GROUP_MAX - 1 && (int)blockIdx.x >= g.end[i]) i++;
    int first = i ? g.end[i - 1] : 0, local = blockIdx.x - first;
    const u8* W = (const u8*)g.w[i];
    float *y = (float*)g.y[i], *y2 = (float*)g.y2[i];
    int N = g.n[i], split = g.split[i];
    if (NT == 0 && g.fmt[i] == FMT_Q4_K) {
        gemv1_i8tc<FMT_Q4_K>(W, g.row_bytes[i], bq, bd, bs, y, y2, split, N, K, g.chains[i], local);
    } else if (NT == 0 && g.fmt[i] == FMT_Q6_K) {
        gemv1_i8tc<FMT_Q6_K>(W, g.row_bytes[i], bq, bd, bs, y, y2, split, N, K, g.chains[i], local);
    } else if (g.fmt[i] == FMT_Q4_K) {
        gemv_i8tc<FMT_Q4_K, NT ? NT : 1>(W, g.row_bytes[i], bq, bd, bs, y, y2, split, N, K, T, g.chains[i], local);
    } else if (g.fmt[i] == FMT_Q6_K) {
        gemv_i8tc<FMT_Q6_K, NT ? NT : 1>(W, g.row_bytes[i], bq, bd, bs, y, y2, split, N, K, T, g.chains[i], local);
    } else {
        GRID_PROLOGUE();
        int per = (g.end[i] - first) / T, t = local / per;
        long subs = (long)t * (K / 32);
        gemv_q8<FMT_Q8_0, 1>(W, g.row_bytes[i], xq + (long)t * K, xd + subs, xs + subs, y + (long)t * split,
                             y2 + (long)t * (N - split), N, K, 1, 4, split, local % per);
    }
}

// The 16-token build at most I8TC16_REGS registers, as gemv_i8tc's. The one-token build takes
// what its Q6_K path needs (122: four 4-warp blocks an SM); capped at 96, the least without
// spills (five an SM), it ran no faster on an H100 (BENCHMARKS.md, thirty-fourth session).
#ifdef KERNEL_EMULATION
#define GROUP_REGS_gemv1
#define GROUP_REGS_gemv8
#define GROUP_REGS_gemv
#else
#define GROUP_REGS_gemv1
#define GROUP_REGS_gemv8 __maxnreg__(I8TC8_REGS)
#define GROUP_REGS_gemv __maxnreg__(I8TC16_REGS)
#endif
#define GROUP_BUILD(PREFIX, NT)                                                                            \
    extern "C" __global__ void GROUP_REGS_##PREFIX PREFIX##_group(ProductGroup g, const i8* bq, const float* bd, \
                                                                  const short* bs, const i8* xq,             \
                                                                  const float* xd, const float* xs, int K,   \
                                                                  int T) {                                   \
        product_group<NT>(g, bq, bd, bs, xq, xd, xs, K, T);                                                 \
    }
GROUP_BUILD(gemv1, 0)
GROUP_BUILD(gemv8, 1)
GROUP_BUILD(gemv, 2)

TC_KERNEL(q4_k, FMT_Q4_K)
TC_KERNEL(q6_k, FMT_Q6_K)
Q8_TILES_KERNEL(q4_k, FMT_Q4_K)
Q8_TILES_KERNEL(q6_k, FMT_Q6_K)

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

// Activation block w (256 values, value(i) its i-th; block w % nb of token w / nb of T) → the
// int8 tensor-core GEMV's input where q8_spot puts it: the codes in its k order (lane q's 8
// values of sub-block s at 8 (s & 1) in its chunk s / 2), the scale max |value| / 127 (codes
// rounded as quantize_q8 rounds), and the codes' sum per 32 values. One warp per block; lane
// l = 8q + s writes those 8 bytes.
template <class Value>
__device__ __forceinline__ void q8_blocks_block(Value value, i8* xq, float* xd, short* xs, long w, int nb, long T) {
    int lane = threadIdx.x & 31, q = lane >> 3, s = lane & 7;
    int base = 32 * s + q8_blocks_offset(q, s);
    float v[8];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        v[i] = value(base + i);
        amax = fmaxf(amax, fabsf(v[i]));
    }
    amax = warp_max(amax);
    float d = amax / 127.0f;
    u32 packed[2] = {0, 0};
    int sum = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int code = d > 0.0f ? (int)roundf(v[i] / d) : 0;
        sum += code;
        packed[i >> 2] |= (u32)(code & 0xff) << (8 * (i & 3));
    }
    Q8Spot at = q8_spot(w, nb, T);
    long codes = 256 * at.at + 16 * q8_chunk(q, s >> 1, at.t, at.group) + 8 * (s & 1);
    *(uint2*)(xq + codes) = make_uint2(packed[0], packed[1]);
    // Sub-block s is in lanes s, s + 8, s + 16, s + 24.
    sum += __shfl_xor_sync(0xffffffffu, sum, 8);
    sum += __shfl_xor_sync(0xffffffffu, sum, 16);
    if (q == 0) xs[8 * (at.at + at.t) + s] = (short)sum;
    if (lane == 0) xd[at.at + at.t] = d;
}

// A conversion's output block w of T tokens' nb each: the tensor-core GEMV's f16 (xh, xscale),
// or with xh null the int8 tensor-core GEMV's int8 blocks (bq, bd, bs).
template <class Value>
__device__ __forceinline__ void tc_input_block(Value value, u16* xh, float* xscale, i8* bq, float* bd, short* bs,
                                               long w, int nb, long T) {
    if (xh)
        to_f16_tc_block(value, xh, xscale, w);
    else
        q8_blocks_block(value, bq, bd, bs, w, nb, T);
}

// x [T, K] f32 (`blocks` = T · nb blocks of 256) → the int8 blocks xq, xd, xs (q8_blocks_block).
extern "C" __global__ void quantize_q8_blocks(const float* x, i8* xq, float* xd, short* xs, long blocks, int nb) {
    GRID_PROLOGUE_BRIDGE();
    long w = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (w >= blocks) return;
    const float* xb = x + 256 * w;
    q8_blocks_block([&](int i) { return xb[i]; }, xq, xd, xs, w, nb, blocks / nb);
}

// quantize_q8_blocks of silu(g) · u (the values silu_mul writes): the MLP's down product input.
extern "C" __global__ void silu_mul_to_q8_blocks(const float* g, const float* u, i8* xq, float* xd, short* xs,
                                                 long blocks, int nb) {
    GRID_PROLOGUE_BRIDGE();
    long w = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (w >= blocks) return;
    const float *gb = g + 256 * w, *ub = u + 256 * w;
    q8_blocks_block([&](int i) { return silu(gb[i]) * ub[i]; }, xq, xd, xs, w, nb, blocks / nb);
}

// x [T, K] f32 → xh [T, K] and xscale [T, K / 256] (to_f16_tc_block).
extern "C" __global__ void to_f16_tc(const float* x, u16* xh, float* xscale, long blocks) {
    GRID_PROLOGUE_BRIDGE();
    long w = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (w >= blocks) return;
    const float* xb = x + 256 * w;
    to_f16_tc_block([&](int i) { return xb[i]; }, xh, xscale, w);
}

// to_f16_tc of silu(g) * u (SwiGLU, the values silu_mul writes), for the MLP's down product.
extern "C" __global__ void silu_mul_to_f16_tc(const float* g, const float* u, u16* xh, float* xscale,
                                              long blocks) {
    GRID_PROLOGUE_BRIDGE();
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
