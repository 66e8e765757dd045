/* spec.cuh — what the .cu files compute with beyond cuemu.h: the scalar spec's shared
   pieces (spec.h: max1, min1, the halving trees, exp1) and float bits both ways. */
#ifndef PD_SPEC_CUH
#define PD_SPEC_CUH
#include "cuemu.h"
#include "spec.h"

static __device__ __forceinline__ float bits_f32(uint32_t w) {
    float f;
    memcpy(&f, &w, sizeof f);
    return f;
}
static __device__ __forceinline__ uint32_t f32_bits(float f) {
    uint32_t w;
    memcpy(&w, &f, sizeof w);
    return w;
}
#endif
