/* dot.h — the one reduction order every CPU kernel uses for a dot product.
   Element i goes to accumulator (i / 16) % 4, lane i % 16; the four accumulators are
   added as (a0 + a1) + (a2 + a3) and the lanes by _mm512_reduce_add_ps. Every path
   (one token, a tile of tokens, a tail) follows it, which is what makes the forward
   pass batch-invariant. */
#ifndef PD_DOT_H
#define PD_DOT_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#ifdef __AVX512F__
static inline __m512 load_f32(const float *p, int left) {
    return left >= 16 ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps((__mmask16)((1u << left) - 1), p);
}
static inline __m512 load_bf16(const uint16_t *p, int left) {
    __m256i h = left >= 16 ? _mm256_loadu_si256((const __m256i *)p)
                           : _mm256_maskz_loadu_epi16((__mmask16)((1u << left) - 1), p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline float dot_f32(const float *a, const float *b, int n) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int i = 0, k = 0; i < n; i += 16, k = (k + 1) & 3)
        acc[k] = _mm512_fmadd_ps(load_f32(a + i, n - i), load_f32(b + i, n - i), acc[k]);
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
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
