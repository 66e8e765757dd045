/* qmatvec.c — an approximate y[rows] = x[cols] · W^T in 8-bit integers, for what only
   drafts (Medusa heads' ResBlocks and own LM heads): a quarter of f32's bytes, so a
   head's matrices sit in L1 and cache beside the model instead of pushing it out.
   Never used for what the model outputs.

   Each row of W keeps its own scale (max |w| / 127, rounded to the nearest integer in
   [-127, 127]); x is quantized the same way per call, then offset by 128 to unsigned,
   which is what VNNI's vpdpbusd multiplies (u8 × s8, four products into each 32-bit
   lane); the offset is taken back out with each row's precomputed sum:
       y_r = sx · sw_r · (Σ_j (qx_j + 128) qw_rj − 128 Σ_j qw_rj)
   Packed: panels of 16 rows; in a panel, for each quad of columns, the 16 rows' 4
   bytes side by side (one 64-byte vector); then rows' scales (float) and sums (int32).
   The integer sums are exact, so the vector and the plain C paths agree bit for bit. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend.h"

#define QPANEL 16
#define MAX_QCOLS 4096

static int quads(int cols) { return (cols + 3) / 4; }
#define QGROUP 4 /* panels a pass takes together: four independent chains */
static size_t panels(int rows) { return (size_t)(rows + QPANEL * QGROUP - 1) / (QPANEL * QGROUP) * QGROUP; }
static size_t weight_bytes(int rows, int cols) { return panels(rows) * quads(cols) * QPANEL * 4; }

size_t k_q8_bytes(int rows, int cols) { return weight_bytes(rows, cols) + panels(rows) * QPANEL * 8; }

static int8_t q8(float v, float inv) {
    float q = nearbyintf(v * inv);
    return (int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
}

int k_q8_pack(void *dst, const float *w, int rows, int cols) {
    if (cols < 1 || cols > MAX_QCOLS) return -1;
    int8_t *P = dst;
    size_t R = panels(rows) * QPANEL;
    float *scale = (float *)((char *)dst + weight_bytes(rows, cols));
    int32_t *sum = (int32_t *)(scale + R);
    memset(dst, 0, k_q8_bytes(rows, cols));
    for (int r = 0; r < rows; r++) {
        const float *row = w + (size_t)r * cols;
        float mx = 0;
        for (int c = 0; c < cols; c++) mx = fabsf(row[c]) > mx ? fabsf(row[c]) : mx;
        scale[r] = mx / 127;
        int8_t *panel = P + (size_t)(r / QPANEL) * quads(cols) * QPANEL * 4;
        for (int c = 0; c < cols; c++) {
            int8_t q = mx > 0 ? q8(row[c], 127 / mx) : 0;
            panel[((size_t)(c / 4) * QPANEL + r % QPANEL) * 4 + c % 4] = q;
            sum[r] += q;
        }
    }
    return 0;
}

/* x as unsigned bytes, qx + 128, cols padded to a quad with 128 (qx = 0); returns sx.
   Rounding is to nearest even in both paths (cvtps_epi32 under the default MXCSR) */
static float quantize_x(uint8_t *ux, const float *x, int cols) {
    float mx = 0;
    int c = 0;
#if defined(__AVX512F__)
    __m512 m = _mm512_setzero_ps();
    for (; c + 16 <= cols; c += 16)
        m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + c)), m); /* NaN: kept out, as below */
    mx = _mm512_reduce_max_ps(m);
#endif
    for (; c < cols; c++) mx = fabsf(x[c]) > mx ? fabsf(x[c]) : mx;
    c = 0;
#if defined(__AVX512F__)
    if (mx > 0) {
        __m512 inv = _mm512_set1_ps(127 / mx);
        for (; c + 16 <= cols; c += 16) {
            __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + c), inv)); /* |q| ≤ 127 */
            _mm_storeu_si128((__m128i *)(ux + c), _mm512_cvtepi32_epi8(_mm512_add_epi32(q, _mm512_set1_epi32(128))));
        }
    }
#endif
    for (; c < quads(cols) * 4; c++) ux[c] = (uint8_t)(c < cols && mx > 0 ? q8(x[c], 127 / mx) + 128 : 128);
    return mx / 127;
}

#if defined(__AVX512VNNI__)
/* one panel's rows from their integer sums a: out[QPANEL] = sx · scale · (a − 128 sum) */
static inline void panel_out(float *out, __m512i a, float sx, const float *scale, const int32_t *sum) {
    __m512i d = _mm512_sub_epi32(a, _mm512_slli_epi32(_mm512_loadu_si512((const void *)sum), 7));
    _mm512_storeu_ps(out,
                     _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(sx), _mm512_loadu_ps(scale)), _mm512_cvtepi32_ps(d)));
}
#endif

/* QGROUP panels' rows from `panel` on: out[QGROUP * QPANEL] = sx · scale · (Σ − 128 sum) */
static void dot_panels(float *out, const int8_t *panel, const uint8_t *ux, int nq, float sx, const float *scale,
                       const int32_t *sum) {
    size_t stride = (size_t)nq * QPANEL * 4;
#if defined(__AVX512VNNI__)
    _Static_assert(QGROUP == 4, "four chains, written out so that they stay in registers");
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (int c = 0; c < nq; c++, panel += QPANEL * 4) { /* independent chains: the latency hides */
        int32_t xq;
        memcpy(&xq, ux + 4 * c, 4);
        __m512i xb = _mm512_set1_epi32(xq);
        a0 = _mm512_dpbusd_epi32(a0, xb, _mm512_loadu_si512((const void *)panel));
        a1 = _mm512_dpbusd_epi32(a1, xb, _mm512_loadu_si512((const void *)(panel + stride)));
        a2 = _mm512_dpbusd_epi32(a2, xb, _mm512_loadu_si512((const void *)(panel + 2 * stride)));
        a3 = _mm512_dpbusd_epi32(a3, xb, _mm512_loadu_si512((const void *)(panel + 3 * stride)));
    }
    panel_out(out, a0, sx, scale, sum);
    panel_out(out + QPANEL, a1, sx, scale + QPANEL, sum + QPANEL);
    panel_out(out + 2 * QPANEL, a2, sx, scale + 2 * QPANEL, sum + 2 * QPANEL);
    panel_out(out + 3 * QPANEL, a3, sx, scale + 3 * QPANEL, sum + 3 * QPANEL);
#elif defined(__AVXVNNI__)
    /* the same with the VEX vpdpbusd: a panel's 16 rows in two vectors of 8 */
    for (int i = 0; i < QGROUP; i++, panel += stride) {
        __m256i a[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int c = 0; c < nq; c++) {
            int32_t xq;
            memcpy(&xq, ux + 4 * c, 4);
            __m256i xb = _mm256_set1_epi32(xq);
            for (int h = 0; h < 2; h++)
                a[h] = _mm256_dpbusd_avx_epi32(
                    a[h], xb, _mm256_loadu_si256((const __m256i *)(panel + (size_t)c * QPANEL * 4) + h));
        }
        for (int h = 0; h < 2; h++) {
            int o = i * QPANEL + 8 * h;
            __m256i d = _mm256_sub_epi32(a[h], _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(sum + o)), 7));
            _mm256_storeu_ps(out + o, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(sx), _mm256_loadu_ps(scale + o)),
                                                    _mm256_cvtepi32_ps(d)));
        }
    }
#elif defined(__AVX2__)
    /* u8 and s8 widened to 16 bits, so that madd's pair sums are exact (maddubs would
       saturate); a row's two pair sums land side by side and are added at the end */
    for (int i = 0; i < QGROUP; i++, panel += stride) {
        __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                          _mm256_setzero_si256()};
        for (int c = 0; c < nq; c++) {
            const int8_t *w = panel + (size_t)c * QPANEL * 4;
            uint64_t xq = (uint64_t)ux[4 * c] | (uint64_t)ux[4 * c + 1] << 16 | (uint64_t)ux[4 * c + 2] << 32 |
                          (uint64_t)ux[4 * c + 3] << 48;
            __m256i xv = _mm256_set1_epi64x((long long)xq);
            for (int k = 0; k < 4; k++) {
                __m256i wk = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 16 * k)));
                acc[k] = _mm256_add_epi32(acc[k], _mm256_madd_epi16(wk, xv));
            }
        }
        int32_t pair[2 * QPANEL];
        for (int k = 0; k < 4; k++) _mm256_storeu_si256((__m256i *)(pair + 8 * k), acc[k]);
        for (int q = 0; q < QPANEL; q++)
            out[i * QPANEL + q] =
                sx * scale[i * QPANEL + q] * (float)(pair[2 * q] + pair[2 * q + 1] - 128 * sum[i * QPANEL + q]);
    }
#else
    for (int i = 0; i < QGROUP; i++, panel += stride)
        for (int q = 0; q < QPANEL; q++) {
            int32_t s = 0;
            for (int c = 0; c < nq * 4; c++) s += ux[c] * panel[((size_t)(c / 4) * QPANEL + q) * 4 + c % 4];
            out[i * QPANEL + q] = sx * scale[i * QPANEL + q] * (float)(s - 128 * sum[i * QPANEL + q]);
        }
#endif
}

void k_q8_matvec(float *y, const float *x, const void *packed, int rows, int cols) {
    uint8_t ux[MAX_QCOLS];
    float sx = quantize_x(ux, x, cols), out[QGROUP * QPANEL];
    int nq = quads(cols);
    const int8_t *P = packed;
    const float *scale = (const float *)((const char *)packed + weight_bytes(rows, cols));
    const int32_t *sum = (const int32_t *)(scale + panels(rows) * QPANEL);
    for (size_t p = 0; p < panels(rows); p += QGROUP) {
        size_t r0 = p * QPANEL, m = rows - r0 < QGROUP * QPANEL ? rows - r0 : QGROUP * QPANEL;
        float *dst = m == QGROUP * QPANEL ? y + r0 : out; /* a short last group goes through out */
        dot_panels(dst, P + p * nq * QPANEL * 4, ux, nq, sx, scale + r0, sum + r0);
        if (dst == out) memcpy(y + r0, out, sizeof(float) * m);
    }
}
