/* spec.cuh — what the .cu files compute with beyond cuemu.h: the scalar spec's shared
   pieces (spec.h: max1, min1, the halving trees, exp1, the block types' layouts), a block
   type's bytes a block, and float bits both ways. */
#ifndef PD_SPEC_CUH
#define PD_SPEC_CUH
#include "cuemu.h"
#include "spec.h"
#include "backend.h"

/* bytes of one block of a GGUF block type (spec.h's sizes) */
static __device__ __forceinline__ int q_block_bytes(WType wt) {
    switch (wt) {
    case WT_Q8_0:
        return Q8_0_BYTES;
    case WT_Q4_0:
        return Q4_0_BYTES;
    case WT_Q4_1:
        return Q4_1_BYTES;
    case WT_Q5_0:
        return Q5_0_BYTES;
    case WT_Q4_K:
        return Q4_K_BYTES;
    case WT_Q5_K:
        return Q5_K_BYTES;
    default:
        return Q6_K_BYTES;
    }
}

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
/* half.h's half_to_float: IEEE half → float exactly (subnormals scaled, NaN quieted) */
static __device__ __forceinline__ float f16_f32(const uint8_t *p) {
    uint32_t h = (uint32_t)p[0] | (uint32_t)p[1] << 8;
    uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (e == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13) | (man ? 0x400000u : 0));
    if (e) return bits_f32(sign | ((e + 127 - 15) << 23) | (man << 13));
    return bits_f32(f32_bits((float)man * 0x1p-24f) | sign);
}
#endif
