// splash CUDA kernels: the files of this directory, compiled by NVRTC as one unit in the order
// of `KERNEL_FILES` (compile.rs), each using what the earlier ones define, at first use with the
// model's dimensions as compile-time constants (HEAD_DIM: attention head dim; GDN_DK / GDN_DV:
// Gated DeltaNet key and value head dims). Every kernel has a CPU twin in `src/cpu/` that
// defines it. This file: the types, dimensions and helpers every kernel uses.
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
// Once its wait is over it lets the next kernel launch: so at most one launched kernel waits
// behind the running one, holding few SM slots. Letting it launch before the wait
// (SPLASH_DEPENDENT_LAUNCH=early, GRID_TRIGGER_EARLY) chains waiting kernels that can hold slots
// the running one needs; it was no faster on the H100 (BENCHMARKS.md, 2026-12-06). The next
// kernel's blocks take SM slots only once all of this one's blocks have started, so the earliest
// kernel always runs (no kernel here waits on another block).
#if !defined(KERNEL_EMULATION) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define GRID_WAIT_NOW() asm volatile("griddepcontrol.wait;" ::: "memory")
#define GRID_LAUNCH_NEXT() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
#else
#define GRID_WAIT_NOW()
#define GRID_LAUNCH_NEXT()
#endif

#ifdef TIMELINE
// SPLASH_TIMELINE (a measurement build): thread 0 of each of a launch's first TIMELINE_BLOCKS
// blocks records its launch at its wait, the grid's id, its blocks, the SM and the global timer
// (ns) when the block arrived and when the wait returned, into a ring the host reads back
// (Gpu::timeline). A launch's earliest return from the wait is when the launch before it
// completed, so consecutive launches' returns bound the time each held the stream, as run, with
// the dependent launches' overlap. The first blocks are the first to start (they include the
// earliest return); every block of a 16-row pass's expert products overran the ring.
#define TIMELINE_CAP (1 << 20)
#define TIMELINE_BLOCKS 256
struct TimelineRecord {
    unsigned long long grid, arrived, released;
    unsigned int blocks, sm;
};
__device__ TimelineRecord timeline_records[TIMELINE_CAP];
__device__ unsigned long long timeline_count;
__device__ __forceinline__ unsigned long long timeline_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void timeline_wait() {
    unsigned long long arrived = timeline_now();
    GRID_WAIT_NOW();
    if (threadIdx.x != 0 || blockIdx.x >= TIMELINE_BLOCKS) return;
    unsigned long long grid, released = timeline_now();
    unsigned int sm;
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(grid));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    unsigned long long i = atomicAdd(&timeline_count, 1ull) % TIMELINE_CAP;
    timeline_records[i] = {grid, arrived, released, gridDim.x, sm};
}
#define GRID_WAIT() timeline_wait()
#else
#define GRID_WAIT() GRID_WAIT_NOW()
#endif
#define GRID_PROLOGUE_EARLY() \
    do {                      \
        GRID_LAUNCH_NEXT();   \
        GRID_WAIT();          \
    } while (0)
#ifdef GRID_TRIGGER_EARLY
#define GRID_PROLOGUE() GRID_PROLOGUE_EARLY()
#else
#define GRID_PROLOGUE()     \
    do {                    \
        GRID_WAIT();        \
        GRID_LAUNCH_NEXT(); \
    } while (0)
#endif
// The prologue of a kernel of a few blocks between two products (a norm, an input conversion).
// With GRID_BRIDGE_EARLY (SPLASH_DEPENDENT_LAUNCH=bridge) it lets the next kernel launch before
// its own wait: the product after it then takes the SM slots that the product before it frees in
// its last wave and loads its first weights there, while the bridge itself holds a few slots.
#ifdef GRID_BRIDGE_EARLY
#define GRID_PROLOGUE_BRIDGE() GRID_PROLOGUE_EARLY()
#else
#define GRID_PROLOGUE_BRIDGE() GRID_PROLOGUE()
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

// Copies `bytes` (16, or 4 for cp_async4) from global to shared memory without registers,
// zero-filling what is past `src_bytes` (0: nothing is read). cp_async_commit closes this
// thread's group of copies; cp_async_wait_one waits until all but its latest group landed,
// cp_async_wait_all (closing the group) until all did; a barrier then shows them to the others.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
    u32 d = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, int src_bytes) {
    u32 d = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_one() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() {
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
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

// A MoE layer's sum of its pairs for token t, value i: Σ_j w[t·per + j] · y[(t·per + j)·d + i]
// added to acc in order j, one fma each (moe_combine, and the residual add that takes its place,
// add_row, with the same bits). A batch of PAIR_BATCH pairs' loads are all asked for before its
// first fma: a loop of one load and its fma waits out a round trip a pair (a decode step's 9
// pairs held a one-block launch 4 µs longer than its other rows' launches). 5: a Qwen3.5 MoE
// token's 9 pairs (8 experts, the shared one) in two round trips; 9 float4 in flight do not fit
// add_rms_norm_to_f16_tc's 64 registers (ptxas spills).
#ifndef PAIR_BATCH
#define PAIR_BATCH 5
#endif
__device__ __forceinline__ float pair_sum(const float* y, const float* w, int per, long t, int d, int i, float acc) {
    for (int j0 = 0; j0 < per; j0 += PAIR_BATCH) {
        float wj[PAIR_BATCH], v[PAIR_BATCH];
#pragma unroll
        for (int u = 0; u < PAIR_BATCH; u++)
            if (j0 + u < per) {
                wj[u] = w[t * per + j0 + u];
                v[u] = y[(t * per + j0 + u) * d + i];
            }
#pragma unroll
        for (int u = 0; u < PAIR_BATCH; u++)
            if (j0 + u < per) acc = fmaf(wj[u], v[u], acc);
    }
    return acc;
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
