/* dot.h — a dot product in one fixed order, for the per-row kernels (rmsnorm's sum of
   squares): element i goes to accumulator (i / 16) % 4, lane i % 16; the four
   accumulators are added as (a0 + a1) + (a2 + a3) and the 16 lanes by hsum's tree
   (lane i + lane i+8, then +4, +2, +1 apart). The result depends on the row alone,
   never on how many rows a call has. (matmul.c and attention.c keep FMA chains of
   their own, described there.) */
#ifndef PD_DOT_H
#define PD_DOT_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#ifdef __AVX512F__
static inline __m512 load_f32(const float *p, int left) {
    return left >= 16 ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps((__mmask16)((1u << left) - 1), p);
}
/* 16 floats, lanes past the end set to fill */
static inline __m512 load_f32_or(const float *p, int left, float fill) {
    if (left >= 16) return _mm512_loadu_ps(p);
    return _mm512_mask_loadu_ps(_mm512_set1_ps(fill), (__mmask16)((1u << left) - 1), p);
}
/* the lane tree: ((v_i + v_i+8) + (.. +4)) + (.. +2) + (.. +1) */
static inline float hsum(__m512 v) {
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
static inline float dot_f32(const float *a, const float *b, int n) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), a3);
    }
    if (i < n) a0 = _mm512_fmadd_ps(load_f32(a + i, n - i), load_f32(b + i, n - i), a0);
    if (i + 16 < n) a1 = _mm512_fmadd_ps(load_f32(a + i + 16, n - i - 16), load_f32(b + i + 16, n - i - 16), a1);
    if (i + 32 < n) a2 = _mm512_fmadd_ps(load_f32(a + i + 32, n - i - 32), load_f32(b + i + 32, n - i - 32), a2);
    if (i + 48 < n) a3 = _mm512_fmadd_ps(load_f32(a + i + 48, n - i - 48), load_f32(b + i + 48, n - i - 48), a3);
    return hsum(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}
#else
/* the same order in scalar code, for machines without AVX-512 */
static inline float dot_f32(const float *a, const float *b, int n) {
    float acc[4][16];
    memset(acc, 0, sizeof acc);
    for (int i = 0; i < n; i++) acc[(i / 16) % 4][i % 16] += a[i] * b[i];
    float s[16];
    for (int l = 0; l < 16; l++) s[l] = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) s[l] += s[l + w];
    return s[0];
}
#endif
#endif
