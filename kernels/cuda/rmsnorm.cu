/* rmsnorm.cu — k_rmsnorm (kernels/cpu/ops.c) bit for bit: one block of 64 threads per row.
   Thread j is dot.h's accumulator j / 16, lane j % 16: it sums x[i]^2 for i = j mod 64 in
   ascending i by FMA, the same chain dot_f32 keeps in that slot. Then the accumulators
   combine as (a0 + a1) + (a2 + a3) and the 16 lanes by the halving tree (+8, +4, +2, +1),
   here shuffles down within warp 0. Build with nvcc -fmad=false: no contraction but the
   FMAs written as such; the division and square root are IEEE (__fdiv_rn, __fsqrt_rn). */
#include "cuda_kernels.h"
#include "cuemu.h"

#define RMS_THREADS 64 /* dot.h's 4 accumulators x 16 lanes */

static __global__ void rmsnorm_kernel(float *y, const float *x, const float *g, int dim, float eps) {
    __shared__ float part[RMS_THREADS];
    __shared__ float scale;
    const float *xt = x + (size_t)blockIdx.x * dim;
    float *yt = y + (size_t)blockIdx.x * dim;
    int j = threadIdx.x;
    float acc = 0.0f;
    for (int i = j; i < dim; i += RMS_THREADS) acc = __fmaf_rn(xt[i], xt[i], acc);
    part[j] = acc;
    __syncthreads();
    if (j < 32) { /* warp 0, all of it for the shuffles; lanes 16-31 carry nothing read */
        int l = j & 15;
        float s = (part[l] + part[16 + l]) + (part[32 + l] + part[48 + l]);
        for (int w = 8; w >= 1; w /= 2) s += __shfl_down_sync(0xffffffffu, s, w);
        if (j == 0) scale = __fdiv_rn(1.0f, __fsqrt_rn(__fdiv_rn(s, (float)dim) + eps));
    }
    __syncthreads();
    float sc = scale;
    for (int i = j; i < dim; i += RMS_THREADS) yt[i] = g[i] * (sc * xt[i]);
}

void cuda_rmsnorm(float *y, const float *x, const float *g, int n, int dim, float eps) {
    if (n <= 0) return;
    CUEMU_LAUNCH(rmsnorm_kernel, dim3(n), dim3(RMS_THREADS), 0, y, x, g, dim, eps);
}
