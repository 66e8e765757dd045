/* dot.h — the 16-lane reductions every build computes in the same order, and the dot
   product of the per-row kernels (rmsnorm's sum of squares): element i goes to
   accumulator (i / 16) % 4, lane i % 16, by fused multiply-add; the four accumulators
   are added as (a0 + a1) + (a2 + a3) and the 16 lanes by the halving tree (lane i +
   lane i+8, then +4, +2, +1 apart). A maximum over 16 lanes takes MAXPS's rule,
   max(a, b) = a > b ? a : b, in the order GCC's _mm512_reduce_max_ps does. The scalar
   code is the spec; the AVX-512 and AVX2 paths (an AVX2 "vector" is two halves, lanes
   0-7 and 8-15) compute the same bits. (matmul.c and attention.c keep FMA chains of
   their own, described there.) */
#ifndef PD_DOT_H
#define PD_DOT_H
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "spec.h" /* max1, min1, tree_sum16, tree_max16 */

#if defined(__AVX512F__)
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
    __m256 s8 =
        _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
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
#elif defined(__AVX2__) && defined(__FMA__)
#define PD_AVX2 1
/* all-ones in the lanes below left (0..8) */
static inline __m256 lanes_below(int left) {
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}
/* 8 floats, lanes past the end set to fill (those are never read) */
static inline __m256 load8_or(const float *p, int left, float fill) {
    if (left >= 8) return _mm256_loadu_ps(p);
    if (left <= 0) return _mm256_set1_ps(fill);
    __m256 m = lanes_below(left);
    return _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, _mm256_castps_si256(m)), m);
}
static inline void store8_n(float *p, __m256 v, int left) {
    if (left >= 8) _mm256_storeu_ps(p, v);
    else if (left > 0) _mm256_maskstore_ps(p, _mm256_castps_si256(lanes_below(left)), v);
}
/* the tree over lanes lo (0-7) and hi (8-15) */
static inline float hsum2(__m256 lo, __m256 hi) {
    __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
static inline float hmax2(__m256 lo, __m256 hi) {
    __m256 t8 = _mm256_max_ps(hi, lo);
    __m128 t4 = _mm_max_ps(_mm256_extractf128_ps(t8, 1), _mm256_castps256_ps128(t8));
    __m128 t2 = _mm_max_ps(t4, _mm_shuffle_ps(t4, t4, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(_mm_max_ps(t2, _mm_shuffle_ps(t2, t2, _MM_SHUFFLE(0, 1, 0, 1))));
}
static inline float dot_f32(const float *a, const float *b, int n) {
    __m256 acc[8]; /* accumulator k/2, half k%2 */
    for (int k = 0; k < 8; k++) acc[k] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 64 <= n; i += 64)
#pragma GCC unroll 8
        for (int k = 0; k < 8; k++)
            acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * k), _mm256_loadu_ps(b + i + 8 * k), acc[k]);
    for (int k = 0; i + 8 * k < n; k++)
        acc[k] = _mm256_fmadd_ps(load8_or(a + i + 8 * k, n - i - 8 * k, 0), load8_or(b + i + 8 * k, n - i - 8 * k, 0),
                                 acc[k]);
    __m256 lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[4], acc[6]));
    __m256 hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[3]), _mm256_add_ps(acc[5], acc[7]));
    return hsum2(lo, hi);
}
#else
static inline float dot_f32(const float *a, const float *b, int n) {
    float acc[4][16];
    memset(acc, 0, sizeof acc);
    for (int i = 0; i < n; i++) acc[(i / 16) % 4][i % 16] = fmaf(a[i], b[i], acc[(i / 16) % 4][i % 16]);
    float s[16];
    for (int l = 0; l < 16; l++) s[l] = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
    return tree_sum16(s);
}
#endif
#endif
