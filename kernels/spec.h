/* spec.h — the scalar spec's pieces that kernels/cpu (C) and kernels/cuda (nvcc, and the
   host C++ compiler under cuemu.h) both compute with, written once so the CUDA kernels
   cannot drift from the CPU's: MAXPS and MINPS, the 16-lane halving trees (dot.h says
   where they come from), exp1, the project's e^x (exp.h says how it is built), the GGUF
   block layouts' sizes and bit fields, and the 8-bit quantization of a block of x the
   block-type matmuls share (quant.h). */
#ifndef PD_SPEC_H
#define PD_SPEC_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define PD_SPEC static __host__ __device__ inline
#else
#define PD_SPEC static inline
#endif

PD_SPEC float max1(float a, float b) { return a > b ? a : b; } /* MAXPS */
PD_SPEC float min1(float a, float b) { return a < b ? a : b; } /* MINPS */

/* the halving tree over s[16] (overwritten) */
PD_SPEC float tree_sum16(float *s) {
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) s[l] += s[l + w];
    return s[0];
}
PD_SPEC float tree_max16(const float *v) {
    float t[8];
    for (int l = 0; l < 8; l++) t[l] = max1(v[l + 8], v[l]);
    for (int l = 0; l < 4; l++) t[l] = max1(t[l + 4], t[l]);
    return max1(max1(t[0], t[2]), max1(t[1], t[3]));
}

PD_SPEC float pow2i(int k) { /* 2^k, -126 ≤ k ≤ 127 */
    uint32_t u = (uint32_t)(k + 127) << 23;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
PD_SPEC float exp1(float x) {
    x = max1(min1(x, 88.7f), -103.0f);
    float n = nearbyintf(x * 1.44269504f);
    float r = fmaf(-n, 0.693359375f, x);
    r = fmaf(-n, -2.12194440e-4f, r);
    float y = 1.3981999507e-3f;
    y = fmaf(y, r, 8.3334519073e-3f);
    y = fmaf(y, r, 4.1665795894e-2f);
    y = fmaf(y, r, 1.6666665459e-1f);
    y = fmaf(y, r, 5.0000001201e-1f);
    y = fmaf(y, r * r, r + 1.0f);
    int k = (int)n, k1 = (int)floorf(n * 0.5f);
    return y * pow2i(k1) * pow2i(k - k1);
}

/* GGUF's block types as the CPU's and the CUDA kernels read them (quant.h says more) */
#define QK 32          /* elements per block of Q8_0, Q4_0, Q4_1, Q5_0 */
#define QK_K 256       /* elements per super-block of the K types */
#define Q8_0_BYTES 34  /* f16 d; int8 qs[32] */
#define Q4_0_BYTES 18  /* f16 d; qs[16]: element j in the low nibble of byte j, j + 16 in its high */
#define Q4_1_BYTES 20  /* f16 d, m; qs[16] as Q4_0 */
#define Q5_0_BYTES 22  /* f16 d; qh (4 bytes, little-endian: bit j is element j's fifth bit); qs[16] as Q4_0 */
#define Q4_K_BYTES 144 /* f16 d, dmin; scales[12] (8 × 6-bit scale, 8 × 6-bit min); qs[128] */
#define Q5_K_BYTES 176 /* f16 d, dmin; scales[12]; qh[32] (the fifth bits); qs[128] */
#define Q6_K_BYTES 210 /* ql[128]; qh[64]; int8 scales[16]; f16 d */

/* Q5_0's fifth bits of a block, as a mask over its 32 elements */
PD_SPEC uint32_t q5_high(const uint8_t *blk) {
    return (uint32_t)blk[2] | (uint32_t)blk[3] << 8 | (uint32_t)blk[4] << 16 | (uint32_t)blk[5] << 24;
}

/* ggml's get_scale_min_k4: sub-block j's 6-bit scale and minimum from a K block's scales[12] */
PD_SPEC void scale_min_k4(int j, const uint8_t *q, int *d, int *m) {
    if (j < 4) *d = q[j] & 63, *m = q[j + 4] & 63;
    else *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
}

/* quant.h's rule for a block of 32 elements of x (those past n are 0): q[32] and the
   block's scale d, returned; Σ q in *sum */
PD_SPEC float q8_block(const float *x, int n, int8_t *q, int32_t *sum) {
    float v[32], amax = 0;
    for (int i = 0; i < 32; i++) {
        v[i] = i < n ? x[i] : 0.0f;
        amax = max1(fabsf(v[i]), amax);
    }
    float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    int32_t s = 0;
    for (int i = 0; i < 32; i++) {
        float r = nearbyintf(v[i] * id);
        r = r > 127 ? 127 : r < -127 ? -127 : r;
        q[i] = (int8_t)r;
        s += (int32_t)r;
    }
    *sum = s;
    return d;
}
#endif
