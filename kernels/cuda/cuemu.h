/* cuemu.h — one .cu source for nvcc and for the host C++ compiler (g++ -x c++ -std=c++17
   -DCUEMU). Under CUEMU each CUDA thread is a cooperative fiber (ucontext): blocks run one
   after another; a block's threads run in the order cuemu_order names (0 first-to-last,
   1 last-to-first; -1, the default, reads CUEMU_ORDER=reverse from the environment) and
   switch only at __syncthreads, __syncwarp and the shuffles, so a missing barrier reads
   another order's data. Fibers are never preempted, so atomics are plain read-modify-writes.
   __shared__ variables are function statics placed in one linker section, which is filled
   with 0xff bytes (NaN floats) before each block; dynamic shared memory (the launch's shmem
   bytes) is CUEMU_DYN_SHARED(type, name), poisoned the same way. Shuffles assume the whole
   warp (every lane the block has) takes part, as a full mask says. */
#ifndef PD_CUEMU_H
#define PD_CUEMU_H

#ifndef CUEMU
#include <cuda_runtime.h>
/* device_cuda.c's: the stream the calling thread's device call runs on, and the check
   after each launch that keeps the first error with the kernel's name */
extern "C" cudaStream_t pd_cuda_stream(void);
extern "C" void pd_cuda_launched(const char *kernel);
#define CUEMU_LAUNCH(kernel, grid, block, shmem, ...)                                                                  \
    do {                                                                                                               \
        kernel<<<(grid), (block), (shmem), pd_cuda_stream()>>>(__VA_ARGS__);                                           \
        pd_cuda_launched(#kernel);                                                                                     \
    } while (0)
#define CUEMU_DYN_SHARED(type, name) extern __shared__ type name[]
#else
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <ucontext.h>
#include <vector>

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ __attribute__((section("cuemu_shared"))) static
#define CUEMU_DYN_SHARED(type, name) type *name = (type *)cuemu::dyn_shmem.data()
#define CUEMU_LAUNCH(kernel, grid, block, shmem, ...)                                                                  \
    cuemu::launch(dim3(grid), dim3(block), (shmem), [&] { kernel(__VA_ARGS__); })

inline int cuemu_order = -1;
extern "C" char __start_cuemu_shared[] __attribute__((weak)), __stop_cuemu_shared[] __attribute__((weak));

/* A switch is ucontext's under ASan (which follows swapcontext) and off x86-64; else six
   callee-saved registers and the stack pointer, here, since swapcontext's signal-mask
   system calls made a fiber cost microseconds and a forward pass seconds. */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define CUEMU_FAST_SWITCH 1
/* saves the callee-saved registers on this stack, *from = rsp, rsp = to, restores */
extern "C" void cuemu_switch(void **from, void *to);
asm(".text\n.weak cuemu_switch\n.type cuemu_switch,@function\ncuemu_switch:\n"
    "pushq %rbp\npushq %rbx\npushq %r12\npushq %r13\npushq %r14\npushq %r15\n"
    "movq %rsp, (%rdi)\nmovq %rsi, %rsp\n"
    "popq %r15\npopq %r14\npopq %r13\npopq %r12\npopq %rbx\npopq %rbp\nret\n"
    ".size cuemu_switch, .-cuemu_switch\n");
#endif

namespace cuemu {
enum { RUN, AT_BLOCK, AT_WARP, DONE };
struct Thread {
#ifdef CUEMU_FAST_SWITCH
    void *sp;
#else
    ucontext_t ctx;
#endif
    int state;
    dim3 idx;
    uint64_t out; /* this lane's shuffle operand */
};
inline std::vector<Thread> th;
inline std::vector<uint64_t> warp_in; /* each lane's operand, copied when its warp is released */
inline std::vector<char> dyn_shmem;
inline std::unique_ptr<char[]> stacks; /* kept between launches: a fresh stack faults its pages in */
inline size_t stacks_for;
#ifdef CUEMU_FAST_SWITCH
inline void *sched;
#else
inline ucontext_t sched;
#endif
inline Thread *cur;
inline dim3 block_idx, block_dim, grid_dim;
inline const std::function<void()> *body;
inline size_t stack_bytes = 256 << 10;
inline std::mutex one_launch; /* the state above is the emulated GPU's: one launch at a time */

inline void yield(int state) {
    cur->state = state;
#ifdef CUEMU_FAST_SWITCH
    cuemu_switch(&cur->sp, sched);
#else
    swapcontext(&cur->ctx, &sched);
#endif
}
inline void entry() {
    (*body)();
#ifdef CUEMU_FAST_SWITCH
    yield(DONE); /* never resumed */
#else
    cur->state = DONE; /* uc_link returns to the scheduler */
#endif
}
/* the writes bypass ASan's checks: the section may hold its redzones between variables */
__attribute__((no_sanitize_address)) inline void poison(char *p, char *end) {
    for (; p < end; p++) *(volatile char *)p = (char)0xff;
}

#ifdef CUEMU_FAST_SWITCH
/* the stack as cuemu_switch leaves it: six zero registers, then entry as the return
   address, placed so that entry starts with rsp = 8 mod 16, as after a call */
inline void make_fiber(Thread &t, char *stack) {
    t.state = RUN;
    uintptr_t top = ((uintptr_t)stack + stack_bytes) & ~(uintptr_t)15;
    void **sp = (void **)(top - 16);
    sp[0] = (void *)&entry;
    sp -= 6;
    memset(sp, 0, 6 * sizeof *sp);
    t.sp = sp;
}
inline void enter(Thread &t) { cuemu_switch(&sched, t.sp); }
#else
inline void enter(Thread &t) { swapcontext(&sched, &t.ctx); }
/* apart: getcontext returns twice, which would clobber launch's loop variables */
__attribute__((noinline)) inline void make_fiber(Thread &t, char *stack) {
    t.state = RUN;
    getcontext(&t.ctx);
    t.ctx.uc_stack.ss_sp = stack;
    t.ctx.uc_stack.ss_size = stack_bytes;
    t.ctx.uc_link = &sched;
    makecontext(&t.ctx, entry, 0);
}
#endif

/* runs every runnable fiber once in launch order, then releases a warp whose live lanes
   all wait at a warp op, else the block once every live thread waits at __syncthreads */
inline void run_block(size_t n, bool reverse) {
    for (;;) {
        bool live = false;
        for (size_t k = 0; k < n; k++) {
            Thread &t = th[reverse ? n - 1 - k : k];
            if (t.state == RUN) cur = &t, enter(t);
            live |= t.state != DONE;
        }
        if (!live) return;
        bool released = false, all_block = true;
        for (size_t w = 0; w < n; w += 32) {
            size_t e = w + 32 < n ? w + 32 : n;
            size_t at_warp = 0, done = 0;
            for (size_t i = w; i < e; i++) at_warp += th[i].state == AT_WARP, done += th[i].state == DONE;
            for (size_t i = w; i < e; i++) all_block &= th[i].state == AT_BLOCK || th[i].state == DONE;
            if (!at_warp || at_warp + done < e - w) continue;
            for (size_t i = w; i < e; i++) warp_in[i] = th[i].out, th[i].state = th[i].state == DONE ? DONE : RUN;
            released = true;
        }
        if (released) continue;
        if (!all_block) {
            fprintf(stderr, "cuemu: deadlock: threads wait at different barriers\n");
            abort();
        }
        for (size_t i = 0; i < n; i++) th[i].state = th[i].state == DONE ? DONE : RUN;
    }
}

inline void launch(dim3 grid, dim3 block, size_t shmem, const std::function<void()> &f) {
    std::lock_guard<std::mutex> hold(one_launch);
    if (cuemu_order < 0) {
        const char *e = getenv("CUEMU_ORDER");
        cuemu_order = e && !strcmp(e, "reverse");
    }
    size_t n = (size_t)block.x * block.y * block.z;
    if (n > stacks_for) stacks.reset(new char[n * stack_bytes]), stacks_for = n; /* untouched pages stay unmapped */
    th.assign(n, Thread());
    warp_in.assign(n, 0);
    dyn_shmem.assign(shmem, 0);
    body = &f, grid_dim = grid, block_dim = block;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                block_idx = dim3(bx, by, bz);
                poison(__start_cuemu_shared, __stop_cuemu_shared);
                poison(dyn_shmem.data(), dyn_shmem.data() + shmem);
                for (size_t i = 0; i < n; i++) {
                    th[i].idx = dim3(i % block.x, i / block.x % block.y, i / ((size_t)block.x * block.y));
                    make_fiber(th[i], &stacks[i * stack_bytes]);
                }
                run_block(n, cuemu_order == 1);
            }
}

/* lane, srcLane → the operand srcLane gave at this warp op (its own where out of range) */
template <class T> inline T shfl(T v, int src, bool valid) {
    static_assert(sizeof(T) <= sizeof(uint64_t), "a shuffle moves at most 8 bytes");
    size_t me = cur - th.data(), w = me / 32 * 32;
    memcpy(&cur->out, &v, sizeof v);
    yield(AT_WARP);
    if (valid && w + src < th.size()) memcpy(&v, &warp_in[w + src], sizeof v);
    return v;
}
inline int lane() { return (int)((cur - th.data()) % 32); }
} // namespace cuemu

#define threadIdx (cuemu::cur->idx)
#define blockIdx (cuemu::block_idx)
#define blockDim (cuemu::block_dim)
#define gridDim (cuemu::grid_dim)
inline void __syncthreads() { cuemu::yield(cuemu::AT_BLOCK); }
inline void __syncwarp(unsigned = 0xffffffffu) { cuemu::shfl(0, 0, false); }
template <class T> inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
    int l = cuemu::lane();
    return cuemu::shfl(v, (l & ~(width - 1)) + (src & (width - 1)), true);
}
template <class T> inline T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
    int l = cuemu::lane(), s = l ^ mask;
    return cuemu::shfl(v, s, (s & ~(width - 1)) == (l & ~(width - 1)));
}
template <class T> inline T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
    int l = cuemu::lane();
    return cuemu::shfl(v, l + (int)delta, (l & (width - 1)) + (int)delta < width);
}
template <class T> inline T atomicAdd(T *p, T v) {
    T old = *p;
    *p = old + v;
    return old;
}
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
#endif
#endif
