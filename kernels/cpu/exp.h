/* exp.h — e^x for softmax and SiLU, and softmax's exponent pass, shared by ops.c and
   attention.c. exp1 (spec.h) is the spec, our own so that every build and backend computes the
   same bits: clamp x to [-103, 88.7] (MINPS then MAXPS, so a NaN becomes 88.7), x = n
   ln2 + r with n = x log2(e) rounded to nearest even and ln2 in two parts, a degree-6
   polynomial for e^r by fused multiply-adds, then y 2^n rounded once (AVX-512's
   scalef; elsewhere y 2^⌊n/2⌋, which is exact, times 2^(n-⌊n/2⌋)). About 1 ulp. */
#ifndef PD_EXP_H
#define PD_EXP_H
#include "dot.h" /* and spec.h: exp1 */

#if defined(__AVX512F__)
static inline __m512 exp_ps(__m512 x) {
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.7f)), _mm512_set1_ps(-103.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.3981999507e-3f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);
}

/* x[i] = e^(x[i] - m) in place, returning their sum: lane i % 16 in index order, then
   the reduction's tree */
static inline float exp_sum(float *x, int n, float m) {
    __m512 vm = _mm512_set1_ps(m), sum = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 e = _mm512_maskz_mov_ps(k, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), vm)));
        _mm512_mask_storeu_ps(x + i, k, e);
        sum = _mm512_add_ps(sum, e);
    }
    return _mm512_reduce_add_ps(sum);
}
#elif defined(PD_AVX2)
static inline __m256 exp8(__m256 x) {
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.7f)), _mm256_set1_ps(-103.0f));
    __m256 n =
        _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.3981999507e-3f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i k = _mm256_cvtps_epi32(n), k1 = _mm256_srai_epi32(k, 1), bias = _mm256_set1_epi32(127);
    __m256 p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, bias), 23));
    __m256 p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(k, k1), bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(y, p1), p2);
}
static inline float exp_sum(float *x, int n, float m) {
    __m256 vm = _mm256_set1_ps(m), lo = _mm256_setzero_ps(), hi = lo;
    for (int i = 0; i < n; i += 16) {
        __m256 e0 = _mm256_and_ps(lanes_below(n - i), exp8(_mm256_sub_ps(load8_or(x + i, n - i, 0), vm)));
        __m256 e1 = _mm256_and_ps(lanes_below(n - i - 8), exp8(_mm256_sub_ps(load8_or(x + i + 8, n - i - 8, 0), vm)));
        store8_n(x + i, e0, n - i);
        store8_n(x + i + 8, e1, n - i - 8);
        lo = _mm256_add_ps(lo, e0), hi = _mm256_add_ps(hi, e1);
    }
    return hsum2(lo, hi);
}
#else
static inline float exp_sum(float *x, int n, float m) {
    float lane[16] = {0};
    for (int i = 0; i < n; i++) lane[i % 16] += x[i] = exp1(x[i] - m);
    return tree_sum16(lane);
}
#endif
#endif
