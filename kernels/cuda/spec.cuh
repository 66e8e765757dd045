/* spec.cuh — the scalar spec's helpers (kernels/cpu/dot.h, exp.h) as device functions,
   for the .cu files that reduce or exponentiate: the same operations in the same order. */
#ifndef PD_SPEC_CUH
#define PD_SPEC_CUH
#include <stdint.h>
#include <string.h>

#include "cuemu.h"

__device__ __forceinline__ float max1(float a, float b) { return a > b ? a : b; } /* MAXPS */
__device__ __forceinline__ float min1(float a, float b) { return a < b ? a : b; } /* MINPS */

__device__ __forceinline__ float bits_f32(uint32_t w) {
#ifdef CUEMU
    float f;
    memcpy(&f, &w, sizeof f);
    return f;
#else
    return __uint_as_float(w);
#endif
}
__device__ __forceinline__ uint32_t f32_bits(float f) {
#ifdef CUEMU
    uint32_t w;
    memcpy(&w, &f, sizeof w);
    return w;
#else
    return __float_as_uint(f);
#endif
}

/* exp.h's exp1 (nearbyintf → rintf: both round to nearest even) */
__device__ __forceinline__ float pow2i(int k) { return bits_f32((uint32_t)(k + 127) << 23); }
__device__ __forceinline__ float exp1(float x) {
    x = max1(min1(x, 88.7f), -103.0f);
    float n = rintf(x * 1.44269504f);
    float r = __fmaf_rn(-n, 0.693359375f, x);
    r = __fmaf_rn(-n, -2.12194440e-4f, r);
    float y = 1.3981999507e-3f;
    y = __fmaf_rn(y, r, 8.3334519073e-3f);
    y = __fmaf_rn(y, r, 4.1665795894e-2f);
    y = __fmaf_rn(y, r, 1.6666665459e-1f);
    y = __fmaf_rn(y, r, 5.0000001201e-1f);
    y = __fmaf_rn(y, r * r, r + 1.0f);
    int k = (int)n, k1 = (int)floorf(n * 0.5f);
    return y * pow2i(k1) * pow2i(k - k1);
}

/* dot.h's halving trees over v[0..15] */
__device__ __forceinline__ float tree_sum16(const float *v) {
    float s[16];
    for (int l = 0; l < 16; l++) s[l] = v[l];
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) s[l] += s[l + w];
    return s[0];
}
__device__ __forceinline__ float tree_max16(const float *v) {
    float t[8];
    for (int l = 0; l < 8; l++) t[l] = max1(v[l + 8], v[l]);
    for (int l = 0; l < 4; l++) t[l] = max1(t[l + 4], t[l]);
    return max1(max1(t[0], t[2]), max1(t[1], t[3]));
}
#endif
