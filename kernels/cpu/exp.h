/* exp.h — e^x for softmax and SiLU, and softmax's exponent pass, shared by ops.c and
   attention.c so that both compute the same bits. */
#ifndef PD_EXP_H
#define PD_EXP_H
#include <immintrin.h>
#include <math.h>

#ifdef __AVX512F__
/* e^x to about 1 ulp: x = n ln2 + r, |r| ≤ ln2/2, a degree-6 polynomial for e^r,
   then 2^n by scalef. Our own, so every build computes the same bits. */
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
#else
static inline float exp_sum(float *x, int n, float m) {
    float sum = 0;
    for (int i = 0; i < n; i++) sum += (x[i] = expf(x[i] - m));
    return sum;
}
#endif
#endif
