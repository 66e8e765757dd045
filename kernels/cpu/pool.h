/* pool.h — the CPU backend's thread pool (internal to kernels/cpu). */
#ifndef PD_POOL_H
#define PD_POOL_H
/* runs fn(ctx, begin, end) over [0, n) split into contiguous chunks, one per thread,
   each chunk's bounds a multiple of `align` (except the end). Runs on the calling
   thread alone when n is below min_per_thread × 2. */
typedef void (*PoolFn)(void *ctx, int begin, int end);
void pool_run(PoolFn fn, void *ctx, int n, int align, int min_per_thread);
#endif
