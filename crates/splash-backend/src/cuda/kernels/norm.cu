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

// Row t's float4 i of x plus that of y (or of its pairs' sum, each pair by one fma in order j).
__device__ __forceinline__ float4 added4(const float* xr, const float* y, int d, const float* pw, int per, long t,
                                         int i) {
    float4 a = ((const float4*)xr)[i], b = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (!per) b = ((const float4*)(y + t * d))[i];
    // pair_sum, four values at a time, its loads batched the same way.
    for (int j0 = 0; j0 < per; j0 += PAIR_BATCH) {
        float wj[PAIR_BATCH];
        float4 v[PAIR_BATCH];
#pragma unroll
        for (int u = 0; u < PAIR_BATCH; u++)
            if (j0 + u < per) {
                wj[u] = pw[t * per + j0 + u];
                v[u] = ((const float4*)(y + (t * per + j0 + u) * d))[i];
            }
#pragma unroll
        for (int u = 0; u < PAIR_BATCH; u++)
            if (j0 + u < per)
                b = make_float4(fmaf(wj[u], v[u].x, b.x), fmaf(wj[u], v[u].y, b.y), fmaf(wj[u], v[u].z, b.z),
                                fmaf(wj[u], v[u].w, b.w));
    }
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// xr += row blockIdx.x of y (or its pairs' sum) for one row, by the whole block, each thread
// adding the values rms_norm_row then gives it.
__device__ __forceinline__ void add_row(float* xr, const float* y, int d, const float* pw, int per) {
    long t = blockIdx.x;
    if ((d & 3) == 0) {
        for (int i = threadIdx.x; i < d / 4; i += blockDim.x) ((float4*)xr)[i] = added4(xr, y, d, pw, per, t, i);
    } else {
        for (int i = threadIdx.x; i < d; i += blockDim.x)
            xr[i] += per ? pair_sum(y, pw, per, t, d, i, 0.0f) : y[t * d + i];
    }
}

// The residual add and the next norm in one launch: x[r] += y[r], then out[r] = rms_norm(x[r])
// · w, with the bits of add_in_place then rms_norm (each thread adds the values it then reads).
// One block per row; out must not alias x or y. With per > 0, y [T·per, d] holds a MoE layer's
// pairs and pw [T·per] their weights: x[r] += their sum, the bits of moe_combine (no gate) then
// add_in_place, a launch fewer. At most 64 registers (its pair loads batched), for rows of
// 1,024 threads.
extern "C" __global__ void __launch_bounds__(1024)
    add_rms_norm(float* x, const float* y, const float* w, float* out, int d, float eps, const float* pw, int per) {
    GRID_PROLOGUE_BRIDGE();
    float* xr = x + (long)blockIdx.x * d;
    add_row(xr, y, d, pw, per);
    rms_norm_row(xr, w, out + (long)blockIdx.x * d, d, eps);
}

// Rows add_rms_norm_to_f16_tc keeps on chip: up to NORM_ROW_MAX values, K float4 a thread.
#define NORM_ROW_MAX 8192

// add_rms_norm of row blockIdx.x on chip, K float4 a thread (n4 ≤ K · blockDim.x): the norm's
// weights loaded before the wait (no kernel writes them), each thread keeping the sums it adds;
// the normed row to o and to `row` in shared memory. The sums of add_row then rms_norm_row, in
// the same order. PAIRS: y holds pairs (per > 0), a thread's pair loads all in flight together
// (added4), which fits the 64 registers only at one float4 a thread.
template <int K, bool PAIRS>
__device__ __forceinline__ void add_rms_norm_on_chip(float* xr, const float* y, const float* w, float* o, float* row,
                                                     int d, float eps, const float* pw, int per) {
    int n4 = d / 4;
    float4 g[K], v[K];
#pragma unroll
    for (int k = 0; k < K; k++) {
        int i = threadIdx.x + k * blockDim.x;
        if (i < n4) g[k] = ((const float4*)w)[i];
    }
    GRID_PROLOGUE_BRIDGE();
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < K; k++) {
        int i = threadIdx.x + k * blockDim.x;
        if (i >= n4) continue;
        v[k] = added4(xr, y, d, pw, PAIRS ? per : 0, blockIdx.x, i);
        ((float4*)xr)[i] = v[k];
        ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
    }
    float inv = rsqrtf(block_sum(ss) / (float)d + eps);
#pragma unroll
    for (int k = 0; k < K; k++) {
        int i = threadIdx.x + k * blockDim.x;
        if (i >= n4) continue;
        float4 r = make_float4(v[k].x * inv * g[k].x, v[k].y * inv * g[k].y, v[k].z * inv * g[k].z,
                               v[k].w * inv * g[k].w);
        ((float4*)o)[i] = r;
        ((float4*)row)[i] = r;
    }
}

// add_rms_norm, then to_f16_tc of each out row, in one launch: the block's warps convert the
// row's 256-value blocks once the row is written (the bits of the two kernels). d is a multiple
// of 256 when xh is given. With xq, also (or only, without xh) quantize_q8 of the row (for a
// dp4a product of the same rows).
// A row of up to NORM_ROW_MAX values stays on chip (add_rms_norm_on_chip): the conversions read
// the normed row from shared memory, not back from memory (its five or so dependent round trips
// were most of this launch); a MoE layer's pairs, at one float4 a thread. Other rows take the
// same arithmetic through memory. At most 64 registers, so that a hidden-size row's 1,024
// threads fit an SM.
extern "C" __global__ void __launch_bounds__(1024)
    add_rms_norm_to_f16_tc(float* x, const float* y, const float* w, float* out, u16* xh, float* xscale, int d,
                           float eps, i8* xq, float* xd, float* xs, i8* bq, float* bd, short* bs, const float* pw,
                           int per) {
    __shared__ float row[NORM_ROW_MAX];
    float *xr = x + (long)blockIdx.x * d, *o = out + (long)blockIdx.x * d;
    const float* normed = o;
    int n4 = d / 4;
    bool on_chip = (d & 3) == 0 && d <= NORM_ROW_MAX;
    if (on_chip && per && n4 <= (int)blockDim.x) {
        add_rms_norm_on_chip<1, true>(xr, y, w, o, row, d, eps, pw, per);
        normed = row;
    } else if (on_chip && !per && n4 <= 2 * (int)blockDim.x) {
        add_rms_norm_on_chip<2, false>(xr, y, w, o, row, d, eps, pw, per);
        normed = row;
    } else {
        GRID_PROLOGUE_BRIDGE();
        add_row(xr, y, d, pw, per);
        rms_norm_row(xr, w, o, d, eps);
    }
    __syncthreads();  // the row is written
    int per_row = xh || bq ? d >> 8 : 0;
    for (int b = threadIdx.x >> 5; b < per_row; b += blockDim.x >> 5) {
        const float* ob = normed + 256 * b;
        tc_input_block([&](int i) { return ob[i]; }, xh, xscale, bq, bd, bs, (long)blockIdx.x * per_row + b, per_row,
                       gridDim.x);
    }
    if (!xq) return;
    for (int b = threadIdx.x >> 5; b < d / 32; b += blockDim.x >> 5)
        quantize_q8_block(normed[32 * b + (threadIdx.x & 31)], xq, xd, xs, (long)blockIdx.x * (d / 32) + b);
}

// add_rms_norm, each out row also in bf16 (ob, cuBLAS's input: the bits of to_bf16 of out).
extern "C" __global__ void add_rms_norm_to_bf16(float* x, const float* y, const float* w, float* out, u16* ob,
                                                int d, float eps, const float* pw, int per) {
    GRID_PROLOGUE();
    float* xr = x + (long)blockIdx.x * d;
    add_row(xr, y, d, pw, per);
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

// rms_norm_gated, then to_f16_tc of the output (the bits of the two kernels) for the product that
// reads it: a warp per 256-value block, which is 256 / d whole rows (d divides 256, d >= 32),
// each row's sum as rms_norm_gated_row makes it. `blocks` = rows · d / 256, nb of them a token.
extern "C" __global__ void rms_norm_gated_to_f16_tc(const float* x, const float* z, const float* w, float* out,
                                                    u16* xh, float* xscale, int d, float eps, long blocks, i8* bq,
                                                    float* bd, short* bs, int nb) {
    GRID_PROLOGUE_BRIDGE();
    int lane = threadIdx.x & 31;
    long blk = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (blk >= blocks) return;  // the whole warp
    long base = 256 * blk;
    int per = 256 / d;
    // Read by constant indices only, so that inv stays in registers (an index known at run time
    // puts the array in local memory).
    float inv[8];
#pragma unroll
    for (int r = 0; r < 8; r++) {
        if (r >= per) break;
        const float* xr = x + base + (long)r * d;
        float ss = 0.0f;
        for (int i = lane; i < d; i += 32) ss += xr[i] * xr[i];
        inv[r] = rsqrtf(warp_sum(ss) / (float)d + eps);
    }
    tc_input_block(
        [&](int i) {
            int r = i / d, c = i - r * d;
            float ir = inv[0];
#pragma unroll
            for (int m = 1; m < 8; m++)
                if (m == r) ir = inv[m];
            float o = w[c] * (x[base + i] * ir) * silu(z[base + i]);
            out[base + i] = o;
            return o;
        },
        xh, xscale, bq, bd, bs, blk, nb, blocks / nb);
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
