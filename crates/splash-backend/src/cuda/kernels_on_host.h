// Runs the CUDA kernels (`src/cuda/kernels/`, concatenated as compile.rs gives them to NVRTC)
// on the CPU, for tests on machines without a GPU: they are compiled as C++ (g++ -std=c++20
// -include kernels_on_host.h -DKERNEL_EMULATION) into a shared library that
// `src/cuda/kernels_on_host.rs` loads and compares with the CPU ops.
//
// A launch runs its blocks one after another; a block runs as blockDim.x cooperative threads
// (fibers on the calling thread), so __syncthreads, warp shuffles and the warp-wide
// mma.sync behave as on the device: a thread that reaches a barrier yields until the others
// arrive. One OS thread per CUDA thread made every barrier a round of futex wake-ups, which on
// a 2-core machine cost more than the arithmetic. `__shared__` variables become function
// statics: one copy, reused by each block in turn. A thread that returns leaves its block's
// and its warp's barriers, as exited threads do on the GPU. The PTX helpers of the kernels (f16
// conversions and arithmetic, mma.sync m16n8k16, streaming loads) are guarded by
// KERNEL_EMULATION there and defined here with the semantics the PTX ISA gives them.
#pragma once

#include <sys/mman.h>
#include <ucontext.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __constant__
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)

struct uint3 {
    unsigned x, y, z;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

namespace emu {

// A cooperative thread's saved context. On x86-64 a switch saves the callee-saved registers
// on the stack and swaps stack pointers (swapcontext also saves the signal mask: a system call
// per switch, half of the emulation's time); elsewhere ucontext does it.
#if defined(__x86_64__)
struct Context {
    void* sp = nullptr;
};
extern "C" void emu_switch(void** save_sp, void* load_sp);
asm(R"(
    .text
    .p2align 4
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
)");
inline void switch_context(Context& from, Context& to) { emu_switch(&from.sp, to.sp); }
// A fresh context on `stack` that starts in `entry`, which must never return.
inline void make_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
    auto* top = (uint64_t*)(((uintptr_t)(stack + bytes) & ~(uintptr_t)15) - 16);
    top[0] = (uint64_t)entry;  // at a 16-byte boundary, so `entry` starts as if called
    top[1] = 0;
    uint64_t* sp = top - 7;    // rbp, rbx, r12-r15 (zero), then mxcsr and the x87 control word
    for (int i = 1; i < 7; i++) sp[i] = 0;
    uint32_t mxcsr;
    uint16_t fpcw;
    asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(mxcsr), "=m"(fpcw));
    std::memcpy(sp, &mxcsr, 4);
    std::memcpy((char*)sp + 4, &fpcw, 2);
    c.sp = sp;
}
#else
struct Context {
    ucontext_t uc;
};
inline void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
inline void make_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack;
    c.uc.uc_stack.ss_size = bytes;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, entry, 0);
}
#endif

// A barrier of the cooperative threads of one block (or warp): the waiting ones yield to the
// scheduler until the last one arrives and opens the next phase.
struct Barrier {
    unsigned expected = 0, arrived = 0, phase = 0;
    void reset(unsigned n) {
        expected = n;
        arrived = 0;
    }
    void arrive_and_wait();
    // A thread that exits: it no longer takes part, and may be the one the others wait for.
    void arrive_and_drop() {
        if (--expected > 0 && arrived == expected) open();
    }
    void open() {
        arrived = 0;
        phase++;
    }
};

// One launch: the threads of the block that runs, its barriers, and the lanes' exchange
// slots for shuffles and mma.
struct Launch {
    Barrier block;
    std::vector<Barrier> warps;
    std::vector<uint64_t> slot;
    std::vector<float> frag;  // 10 values per lane: a0..a3, b0, b1 (as bits), c0..c3
    std::vector<Context> fiber;
    std::vector<char> done;
    Context scheduler;
    unsigned running = 0;
    void (*body)(void*) = nullptr;
    void* ctx = nullptr;
    explicit Launch(unsigned n)
        : warps((n + 31) / 32), slot(n), frag(n * 10), fiber(n), done(n) {}
};

inline Launch* current = nullptr;
inline uint3 thread_idx{0, 0, 0};
inline uint3 block_idx{0, 0, 0};
inline uint3 block_dim{1, 1, 1};
inline uint3 grid_dim{1, 1, 1};

// The running thread gives the CPU back to the block's scheduler.
inline void yield() {
    Launch& l = *current;
    switch_context(l.fiber[l.running], l.scheduler);
}

inline void Barrier::arrive_and_wait() {
    unsigned mine = phase;
    if (++arrived == expected) {
        open();
        return;
    }
    while (phase == mine) yield();
}

inline unsigned warp_of() { return thread_idx.x / 32; }
inline Barrier& warp_barrier() { return current->warps[warp_of()]; }

template <class T>
T shuffle(T v, unsigned src_lane) {
    static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
    Launch& l = *current;
    unsigned t = thread_idx.x, base = t & ~31u;
    std::memcpy(&l.slot[t], &v, sizeof(T));
    warp_barrier().arrive_and_wait();
    T r;
    std::memcpy(&r, &l.slot[base + (src_lane & 31)], sizeof(T));
    warp_barrier().arrive_and_wait();
    return r;
}

}  // namespace emu

#define threadIdx (emu::thread_idx)
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)

inline void __syncthreads() { emu::current->block.arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::warp_barrier().arrive_and_wait(); }

template <class T>
T __shfl_xor_sync(unsigned, T v, int mask) {
    return emu::shuffle(v, (emu::thread_idx.x & 31) ^ (unsigned)mask);
}
template <class T>
T __shfl_sync(unsigned, T v, int src) {
    return emu::shuffle(v, (unsigned)src);
}
// Lanes below `delta` get their own value back, as on the GPU.
template <class T>
T __shfl_up_sync(unsigned, T v, unsigned delta) {
    unsigned lane = emu::thread_idx.x & 31;
    return emu::shuffle(v, lane >= delta ? lane - delta : lane);
}

inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
}
// dp2a: two int16 halves of a times bytes 0, 1 (lo) or 2, 3 (hi) of b, signed, plus c.
inline int __dp2a_lo(int a, int b, int c) {
    return c + (int)(short)(a & 0xffff) * (int)(signed char)b + (int)(short)(a >> 16) * (int)(signed char)(b >> 8);
}
inline int __dp2a_hi(int a, int b, int c) {
    return c + (int)(short)(a & 0xffff) * (int)(signed char)(b >> 16) + (int)(short)(a >> 16) * (int)(signed char)(b >> 24);
}
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
// Blocks run one after another on one OS thread: every write is seen by the blocks after it.
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
template <class T>
T __ldcg(const T* p) {
    return *p;
}
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }

inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }

// ---- The PTX helpers of the kernels ---------------------------------------------------------

inline float f16_to_f32(unsigned short h) {
    _Float16 x;
    std::memcpy(&x, &h, 2);
    return (float)x;
}
inline unsigned short f32_to_f16(float f) {
    _Float16 x = (_Float16)f;  // round to nearest even, as cvt.rn.f16.f32
    unsigned short h;
    std::memcpy(&h, &x, 2);
    return h;
}

namespace emu {
inline float lo(unsigned v) { return f16_to_f32((unsigned short)(v & 0xffffu)); }
inline float hi(unsigned v) { return f16_to_f32((unsigned short)(v >> 16)); }
inline unsigned pack(double l, double h) {
    return (unsigned)f32_to_f16((float)l) | ((unsigned)f32_to_f16((float)h) << 16);
}
}  // namespace emu

// f16x2 arithmetic, each half rounded once (products of halves are exact in double).
inline unsigned h2_sub(unsigned a, unsigned b) {
    return emu::pack((double)emu::lo(a) - emu::lo(b), (double)emu::hi(a) - emu::hi(b));
}
inline unsigned h2_fma(unsigned a, unsigned b, unsigned c) {
    return emu::pack((double)emu::lo(a) * emu::lo(b) + emu::lo(c), (double)emu::hi(a) * emu::hi(b) + emu::hi(c));
}
inline unsigned h2_mul(unsigned a, unsigned b) {
    return emu::pack((double)emu::lo(a) * emu::lo(b), (double)emu::hi(a) * emu::hi(b));
}

// prmt.b32 without the sign modes: byte i of the result is byte (s >> 4i) & 7 of x (bytes 0-3)
// then y (bytes 4-7).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    unsigned long long both = (unsigned long long)x | ((unsigned long long)y << 32);
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)((both >> (8 * ((s >> (4 * i)) & 7))) & 0xffu) << (8 * i);
    return r;
}

inline uint4 ld_stream(const void* p) {
    uint4 v;
    std::memcpy(&v, p, 16);
    return v;
}

// One warp-wide mma: each lane's six fragment registers and four accumulators go through the
// launch's scratch, and lane (g, q)'s C elements (rows g, g + 8, columns 2q, 2q + 1) become
// dot(reg, row, col, c) over the lanes' registers (reg(lane, i): lane's register i as loaded).
template <class Dot>
inline void warp_mma(float* c, const unsigned (&regs)[6], Dot dot) {
    emu::Launch& l = *emu::current;
    unsigned t = emu::thread_idx.x, base = t & ~31u;
    float* mine = &l.frag[t * 10];
    std::memcpy(mine, regs, sizeof regs);
    for (int i = 0; i < 4; i++) mine[6 + i] = c[i];
    emu::warp_barrier().arrive_and_wait();
    auto reg = [&](int lane, int i) {
        unsigned r;
        std::memcpy(&r, &l.frag[(base + lane) * 10 + i], 4);
        return r;
    };
    int g = (t & 31) >> 2, q = t & 3;
    float d[4];
    for (int i = 0; i < 4; i++) d[i] = dot(reg, g + 8 * (i >> 1), 2 * q + (i & 1), l.frag[t * 10 + 6 + i]);
    emu::warp_barrier().arrive_and_wait();
    for (int i = 0; i < 4; i++) c[i] = d[i];
}

// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32, lane = 4g + q (PTX ISA fragment layout):
// A (16×16) a0 = A[g][2q, 2q+1], a1 = A[g+8][2q, 2q+1], a2 = A[g][2q+8, 2q+9], a3 = A[g+8][2q+8, 2q+9];
// B (16×8)  b0 = B[2q, 2q+1][g], b1 = B[2q+8, 2q+9][g];
// C (16×8)  c0, c1 = C[g][2q, 2q+1], c2, c3 = C[g+8][2q, 2q+1]. Lower half = lower index.
inline void mma_f16_16816(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                          unsigned b1) {
    warp_mma(c, {a0, a1, a2, a3, b0, b1}, [](auto reg, int row, int col, float acc) {
        auto half_of = [](unsigned r, int which) { return which ? emu::hi(r) : emu::lo(r); };
        // A[row][k] and B[k][col] read back from the lanes that hold them.
        auto A = [&](int k) { return half_of(reg(4 * (row & 7) + ((k & 7) >> 1), (row >> 3) + 2 * (k >> 3)), k & 1); };
        auto B = [&](int k) { return half_of(reg(4 * col + ((k & 7) >> 1), 4 + (k >> 3)), k & 1); };
        for (int k = 0; k < 16; k++) acc += A(k) * B(k);
        return acc;
    });
}

// mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32, lane = 4g + q (PTX ISA fragment layout):
// A (16×32) a0 = A[g][4q..4q+3], a1 = A[g+8][4q..4q+3], a2 = A[g][16+4q..], a3 = A[g+8][16+4q..];
// B (32×8) b0 = B[4q..4q+3][g], b1 = B[16+4q..][g]; C as m16n8k16's. Lowest byte = lowest k.
// The int accumulators travel through warp_mma's float slots as bits.
inline void mma_s8_16832(int* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    float bits[4];
    std::memcpy(bits, c, sizeof bits);
    warp_mma(bits, {a0, a1, a2, a3, b0, b1}, [](auto reg, int row, int col, float acc) {
        auto byte = [](unsigned r, int k) { return (int)(signed char)(r >> (8 * (k & 3))); };
        auto A = [&](int k) { return byte(reg(4 * (row & 7) + ((k & 15) >> 2), (row >> 3) + 2 * (k >> 4)), k); };
        auto B = [&](int k) { return byte(reg(4 * col + ((k & 15) >> 2), 4 + (k >> 4)), k); };
        int sum;
        std::memcpy(&sum, &acc, 4);
        for (int k = 0; k < 32; k++) sum += A(k) * B(k);
        float out;
        std::memcpy(&out, &sum, 4);
        return out;
    });
    std::memcpy(c, bits, sizeof bits);
}

// cvt.rna.tf32.f32: the f32 rounded to 10 mantissa bits, to nearest with ties away from zero
// (on the magnitude: sign and magnitude are separate bits), low 13 bits zero.
inline unsigned f32_to_tf32(float x) {
    unsigned u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return u;  // inf / NaN as they are
    return (u + 0x1000u) & 0xffffe000u;
}

// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32, lane = 4g + q (PTX ISA fragment layout):
// A (16×8) a0 = A[g][q], a1 = A[g+8][q], a2 = A[g][q+4], a3 = A[g+8][q+4]; B (8×8) b0 = B[q][g],
// b1 = B[q+4][g]; C as m16n8k16's. tf32 products are exact in double.
inline void mma_tf32_1688(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                          unsigned b1) {
    warp_mma(c, {a0, a1, a2, a3, b0, b1}, [](auto reg, int row, int col, float acc) {
        auto val = [&](int lane, int i) {
            unsigned r = reg(lane, i);
            float f;
            std::memcpy(&f, &r, 4);
            return (double)f;
        };
        double sum = acc;
        for (int k = 0; k < 8; k++)
            sum += val(4 * (row & 7) + (k & 3), (row >> 3) + 2 * (k >> 2)) * val(4 * col + (k & 3), 4 + (k >> 2));
        return (float)sum;
    });
}

// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: lane l gives the address of row l % 8 of
// matrix l / 8; r[j] of lane 4g + q = matrix j's (row g, columns 2q, 2q + 1), or transposed
// (rows 2q, 2q + 1, column g). Lower half = lower index.
template <bool trans>
inline void ldmatrix_x4(unsigned (&r)[4], const unsigned short* row) {
    unsigned lane = emu::thread_idx.x & 31, g = lane >> 2, q = lane & 3;
    for (unsigned j = 0; j < 4; j++) {
        if (trans) {
            const unsigned short* lo = emu::shuffle(row, 8 * j + 2 * q);
            const unsigned short* hi = emu::shuffle(row, 8 * j + 2 * q + 1);
            r[j] = (unsigned)lo[g] | ((unsigned)hi[g] << 16);
        } else {
            const unsigned short* p = emu::shuffle(row, 8 * j + g);
            r[j] = (unsigned)p[2 * q] | ((unsigned)p[2 * q + 1] << 16);
        }
    }
}

// cp.async (.cg 16 bytes, .ca 4) with a source size: the first src_bytes copied, the rest zero.
// Synchronous here, so waiting for them is nothing.
inline void cp_async_n(void* dst, const void* src, int bytes, int src_bytes) {
    // Misaligned addresses are an error on the device.
    if ((uintptr_t)dst % bytes != 0 || (uintptr_t)src % bytes != 0) std::abort();
    std::memset(dst, 0, bytes);
    if (src_bytes > 0) std::memcpy(dst, src, src_bytes);
}
inline void cp_async16(void* dst, const void* src, int src_bytes) { cp_async_n(dst, src, 16, src_bytes); }
inline void cp_async4(void* dst, const void* src, int src_bytes) { cp_async_n(dst, src, 4, src_bytes); }
inline void cp_async_wait_all() {}
inline void cp_async_commit() {}
inline void cp_async_wait_one() {}
inline float fast_exp2(float x) { return std::exp2(x); }

// ---- Launches ------------------------------------------------------------------------------

namespace emu {
// A thread's life: the kernel, then it leaves the barriers and hands the CPU back for good.
inline void thread_main() {
    Launch& l = *current;
    l.body(l.ctx);
    l.block.arrive_and_drop();
    l.warps[l.running / 32].arrive_and_drop();
    l.done[l.running] = 1;
    yield();
    std::abort();  // a finished thread is never resumed
}
}  // namespace emu

// Runs `body(ctx)` as a kernel launch of `grid` blocks of `block` threads (1-D); the body calls
// one kernel with its arguments. Returns when every block has run.
extern "C" void host_launch(unsigned grid, unsigned block, void (*body)(void*), void* ctx) {
    // Kernels keep small arrays on their stacks; pages are only committed where touched.
    constexpr size_t stack_bytes = 256 << 10;
    size_t all = stack_bytes * block;
    void* stacks = mmap(nullptr, all, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (stacks == MAP_FAILED) std::abort();
    emu::Launch l(block);
    l.body = body;
    l.ctx = ctx;
    emu::current = &l;
    emu::grid_dim = {grid, 1, 1};
    emu::block_dim = {block, 1, 1};
    for (unsigned b = 0; b < grid; b++) {
        emu::block_idx = {b, 0, 0};
        l.block.reset(block);
        for (unsigned w = 0; w < l.warps.size(); w++) l.warps[w].reset(std::min(32u, block - 32 * w));
        for (unsigned t = 0; t < block; t++) {
            emu::make_context(l.fiber[t], (char*)stacks + t * stack_bytes, stack_bytes, emu::thread_main);
            l.done[t] = 0;
        }
        // Round robin: each thread runs until it waits at a barrier or returns.
        for (unsigned live = block; live > 0;) {
            for (unsigned t = 0; t < block; t++) {
                if (l.done[t]) continue;
                l.running = t;
                emu::thread_idx = {t, 0, 0};
                emu::switch_context(l.scheduler, l.fiber[t]);
                live -= l.done[t];
            }
        }
    }
    emu::current = nullptr;
    munmap(stacks, all);
}
