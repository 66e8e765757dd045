/* test_cuemu.cpp — the CUDA kernels under cuemu (kernels/cuda/cuemu.h) against the CPU
   kernels bit for bit, in both thread orders; and the emulator's own checks: a missing
   barrier shows in one order, shuffles and atomics equal plain C, shared memory starts
   poisoned. */
#include <cstring>
#include <vector>

#include "check.h"
#include "cuda/cuda_kernels.h"
#include "cuda/cuemu.h"
#include "rand.h"

static void test_rmsnorm(void) {
    static const int dims[] = {1, 7, 64, 65, 576, 1000};
    for (int order = 0; order < 2; order++)
        for (int d : dims) {
            int n = 8;
            test_rng = 0x5eed0024 + d; /* both orders see the same rows */
            std::vector<float> x((size_t)n * d), g(d), want(x.size()), got(x.size(), 1.0f);
            for (float &v : x) v = frand(-3.0f, 3.0f);
            for (float &v : g) v = frand(0.5f, 1.5f);
            cuemu_order = order;
            k_rmsnorm(want.data(), x.data(), g.data(), n, d, 1e-5f);
            cuda_rmsnorm(got.data(), x.data(), g.data(), n, d, 1e-5f);
            CHECK(!memcmp(want.data(), got.data(), got.size() * sizeof(float)), "rmsnorm dim %d rows %d order %d", d, n,
                  order);
        }
}

/* out[t] = thread t - 1's value through shared memory: with the barrier, every order
   agrees; without it, first-to-last happens to pass and last-to-first reads the slot
   before it is written */
__global__ void neighbour(float *out, bool barrier) {
    __shared__ float s[32];
    int t = threadIdx.x;
    s[t] = (float)t;
    if (barrier) __syncthreads();
    out[blockIdx.x * 32 + t] = s[t ? t - 1 : 0];
}

static void test_barrier(void) {
    float ref[64], got[64];
    for (int i = 0; i < 64; i++) ref[i] = (float)(i % 32 ? i % 32 - 1 : 0);
    for (int order = 0; order < 2; order++) {
        cuemu_order = order;
        CUEMU_LAUNCH(neighbour, 2, 32, 0, got, true);
        CHECK(!memcmp(ref, got, sizeof got), "with the barrier, order %d", order);
    }
    cuemu_order = 0;
    CUEMU_LAUNCH(neighbour, 2, 32, 0, got, false);
    CHECK(!memcmp(ref, got, sizeof got), "first-to-last hides the missing barrier");
    cuemu_order = 1;
    CUEMU_LAUNCH(neighbour, 2, 32, 0, got, false);
    CHECK(memcmp(ref, got, sizeof got) != 0, "last-to-first must catch the missing barrier");
    CHECK(got[33] != got[33], "the unwritten slot reads as poison (NaN) in the second block too: %g", got[33]);
}

/* per lane: shuffles from a fixed lane, by xor, down; plus atomics on a block total */
__global__ void warp_ops(int *shf, int *xr, int *dn, float *fsum, int *isum, float *dyn_out) {
    CUEMU_DYN_SHARED(float, dyn);
    int t = threadIdx.x, l = t % 32;
    int v = 1000 * (t / 32) + l * l;
    shf[t] = __shfl_sync(0xffffffffu, v, 5);
    xr[t] = __shfl_xor_sync(0xffffffffu, v, 3);
    int d = __shfl_down_sync(0xffffffffu, v, 4);
    __syncwarp();
    dn[t] = d;
    atomicAdd(fsum, 0.5f * t);
    atomicAdd(isum, t);
    if (t == 0) dyn_out[0] = dyn[0]; /* read before any write: poison */
}

static void test_warp_ops(void) {
    enum { N = 64 };
    int shf[N], xr[N], dn[N], isum = 0;
    float fsum = 0.0f, dyn0 = 0.0f;
    for (int order = 0; order < 2; order++) {
        cuemu_order = order;
        fsum = 0.0f, isum = 0;
        CUEMU_LAUNCH(warp_ops, 1, N, 4 * sizeof(float), shf, xr, dn, &fsum, &isum, &dyn0);
        int bad = 0;
        float fs = 0.0f;
        for (int t = 0; t < N; t++) {
            int w = t / 32, l = t % 32;
            auto val = [&](int lane) { return 1000 * w + lane * lane; };
            bad += shf[t] != val(5);
            bad += xr[t] != val(l ^ 3);
            bad += dn[t] != (l + 4 < 32 ? val(l + 4) : val(l));
        }
        /* atomics add in the launch order: the same float sum, run in that order here */
        for (int k = 0; k < N; k++) fs += 0.5f * (order ? N - 1 - k : k);
        CHECK(bad == 0, "%d shuffle results differ, order %d", bad, order);
        CHECK(isum == N * (N - 1) / 2 && fsum == fs, "atomicAdd: %d %g, want %d %g", isum, fsum, N * (N - 1) / 2, fs);
        CHECK(dyn0 != dyn0, "dynamic shared memory starts poisoned: %g", dyn0);
    }
}

int main(void) {
    test_rmsnorm();
    test_barrier();
    test_warp_ops();
    return check_done("cuemu");
}
