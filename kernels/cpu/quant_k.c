/* quant_k.c — the K block types (Q4_K, Q5_K, Q6_K): the integer matmul of quant.h's rule
   and ggml's dequantization.

   x is quantized once per call, per 256 elements, on the caller's thread; its per-16
   sums of q serve the minima terms (and Q6_K's −32 offset). Rows go to the pool in
   groups of 8; a group's blocks are read from memory once and stay in L1 while every
   token of the call (in tiles of TT) takes them. The AVX2 path keeps 8 rows' fmaf
   chains in the lanes of one vector: each row's integer sums are exact (maddubs pairs
   stay within 2·63·127 < 32767; Q6_K takes q + 32 and subtracts 32·Σ sc·Σqx), reduced
   across a row by integer adds, so their order never shows. */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "quant.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QK_AVX2 1
#endif

#define GROUP 8    /* rows per lane vector */
#define PREFETCH 1 /* groups ahead */
#define TT 4       /* tokens per tile: their sums stay in registers */

/* one super-block of x: q, sums of q per 16, scale */
typedef struct {
    int8_t q[QK_K];
    int16_t bs[16];
    float d;
    int32_t pad[7];
} XBlock;

static void quantize_x(XBlock *xb, const float *x, int cols) {
    for (int b = 0; b * QK_K < cols; b++, xb++) {
        int m = cols - b * QK_K < QK_K ? cols - b * QK_K : QK_K;
        const float *v = x + (size_t)b * QK_K;
#ifdef QK_AVX2
        _Alignas(32) float pad[QK_K];
        if (m < QK_K) { /* the short last block: zeros past cols, as the rule says */
            memset(pad, 0, sizeof pad);
            memcpy(pad, v, sizeof(float) * m);
            v = pad;
        }
        const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        __m256 mx = _mm256_setzero_ps();
        for (int i = 0; i < QK_K; i += 8) mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(v + i), abs));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4))); /* max is exact in any order */
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0;
        const __m256 vid = _mm256_set1_ps(id), hi = _mm256_set1_ps(127), lo = _mm256_set1_ps(-127);
        for (int i = 0; i < QK_K; i += 32) {
            __m256 f[4];
            __m256i q[4];
            for (int k = 0; k < 4; k++) {
                f[k] = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i + 8 * k), vid),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                f[k] = _mm256_min_ps(_mm256_max_ps(f[k], lo), hi);
                q[k] = _mm256_cvtps_epi32(f[k]);
            }
            __m256i b8 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            b8 = _mm256_permutevar8x32_epi32(b8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(xb->q + i), b8);
            for (int k = 0; k < 2; k++) { /* sums of 16 small integers: exact as floats */
                __m256 s8 = _mm256_add_ps(f[2 * k], f[2 * k + 1]);
                __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
                s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
                xb->bs[i / 16 + k] = (int16_t)_mm_cvtss_f32(_mm_add_ss(s4, _mm_movehdup_ps(s4)));
            }
        }
#else
        float amax = 0;
        for (int i = 0; i < m; i++) amax = fabsf(v[i]) > amax ? fabsf(v[i]) : amax;
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0;
        for (int i = 0; i < QK_K; i++) {
            float q = i < m ? nearbyintf(v[i] * id) : 0;
            xb->q[i] = (int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
        }
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int i = 0; i < 16; i++) s += xb->q[16 * j + i];
            xb->bs[j] = (int16_t)s;
        }
#endif
        xb->d = d;
    }
}

/* ggml's get_scale_min_k4 */
static inline void scale_min_k4(int j, const uint8_t *q, int *d, int *m) {
    if (j < 4) *d = q[j] & 63, *m = q[j + 4] & 63;
    else *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
}

static size_t block_bytes(WType wt) { return wt == WT_Q4_K ? Q4_K_BYTES : wt == WT_Q5_K ? Q5_K_BYTES : Q6_K_BYTES; }

#ifndef QK_AVX2
/* the spec: row `w` (nb super-blocks) against one token's quantized x */
static float row_dot(const uint8_t *w, WType wt, const XBlock *xb, int nb) {
    float acc = 0;
    for (int b = 0; b < nb; b++, xb++) {
        const int8_t *qx = xb->q;
        if (wt == WT_Q6_K) {
            const uint8_t *ql = w, *qh = w + 128;
            const int8_t *sc = (const int8_t *)(w + 192);
            int32_t s = 0;
            for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, qx += 128) {
                int32_t p[8] = {0};
                for (int l = 0; l < 32; l++) {
                    int is = l / 16;
                    p[is + 0] += (((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32) * qx[l];
                    p[is + 2] += (((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32) * qx[l + 32];
                    p[is + 4] += (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32) * qx[l + 64];
                    p[is + 6] += (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32) * qx[l + 96];
                }
                for (int j = 0; j < 8; j++) s += sc[j] * p[j];
            }
            acc = fmaf(q_f16(w + 208) * xb->d, (float)s, acc);
        } else {
            const uint8_t *qh = w + 16, *qs = w + (wt == WT_Q4_K ? 16 : 48);
            int32_t s = 0, ms = 0;
            for (int j = 0; j < 8; j++) {
                int sc, m, p = 0;
                scale_min_k4(j, w + 4, &sc, &m);
                const uint8_t *q = qs + 32 * (j / 2);
                for (int l = 0; l < 32; l++) {
                    int v = j & 1 ? q[l] >> 4 : q[l] & 0xF;
                    if (wt == WT_Q5_K) v += (qh[l] >> j & 1) << 4;
                    p += v * qx[32 * j + l];
                }
                s += sc * p, ms += m * (xb->bs[2 * j] + xb->bs[2 * j + 1]);
            }
            acc = fmaf(q_f16(w) * xb->d, (float)s, acc);
            acc = fmaf(-(q_f16(w + 2) * xb->d), (float)ms, acc);
        }
        w += block_bytes(wt);
    }
    return acc;
}
#endif

typedef struct {
    float *y;
    const XBlock *xb;
    const QIndex *w;
    WType wt;
    int n, nb, rows, cols;
    size_t row_bytes;
} QkJob;

#ifdef QK_AVX2
/* the 8 vectors' lane sums, vector k's in lane k */
static inline __m256i reduce8(const __m256i *v) {
    __m256i a = _mm256_hadd_epi32(v[0], v[1]), b = _mm256_hadd_epi32(v[2], v[3]);
    __m256i c = _mm256_hadd_epi32(v[4], v[5]), d = _mm256_hadd_epi32(v[6], v[7]);
    __m256i ab = _mm256_hadd_epi32(a, b), cd = _mm256_hadd_epi32(c, d);
    return _mm256_add_epi32(_mm256_permute2x128_si256(ab, cd, 0x20), _mm256_permute2x128_si256(ab, cd, 0x31));
}
/* vpshufb masks: [i] broadcasts int16 lane i of each 128-bit half; [8 + i] lane 2i of
   the low half and 2i + 1 of the high half */
static const uint8_t BCAST16[12][32] __attribute__((aligned(32))) = {
#define B16(lo, hi)                                                                                                    \
    {                                                                                                                  \
        2 * lo, 2 * lo + 1, 2 * lo, 2 * lo + 1, 2 * lo, 2 * lo + 1, 2 * lo, 2 * lo + 1, 2 * lo, 2 * lo + 1, 2 * lo,    \
            2 * lo + 1, 2 * lo, 2 * lo + 1, 2 * lo, 2 * lo + 1, 2 * hi, 2 * hi + 1, 2 * hi, 2 * hi + 1, 2 * hi,        \
            2 * hi + 1, 2 * hi, 2 * hi + 1, 2 * hi, 2 * hi + 1, 2 * hi, 2 * hi + 1, 2 * hi, 2 * hi + 1, 2 * hi,        \
            2 * hi + 1                                                                                                 \
    }
    B16(0, 0), B16(1, 1), B16(2, 2), B16(3, 3), B16(4, 4), B16(5, 5), B16(6, 6),
    B16(7, 7), B16(0, 1), B16(2, 3), B16(4, 5), B16(6, 7)
#undef B16
};
static inline __m256i bcast16(int i) { return _mm256_load_si256((const __m256i *)BCAST16[i]); }
/* the f16 at byte off of each of 8 blocks */
static inline __m256 f16x8(const uint8_t *const *p, size_t off) {
    uint16_t h[8];
    for (int k = 0; k < 8; k++) memcpy(&h[k], p[k] + off, 2);
    return _mm256_cvtph_ps(_mm_setr_epi16((short)h[0], (short)h[1], (short)h[2], (short)h[3], (short)h[4], (short)h[5],
                                          (short)h[6], (short)h[7]));
}
/* Q4_K / Q5_K's 12 scale bytes (at s, 16 readable) → 8 scales, then 8 minima, as bytes
   (get_scale_min_k4 in lanes) */
static inline __m128i scales_k4(const uint8_t *s) {
    __m128i v = _mm_loadu_si128((const __m128i *)s);
    __m128i a = _mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    __m128i b = _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
    a = _mm_blendv_epi8(a, _mm_srli_epi16(a, 4), _mm_setr_epi32(0, 0, 0, -1));
    __m128i lo = _mm_and_si128(a, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 15, 15, 15, 15));
    __m128i hi = _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(b, 6), _mm_set1_epi8(3)), 4);
    return _mm_or_si128(lo, hi);
}

/* bit p of each byte, moved to bit 4 (16-bit shifts: no other bit reaches bit 4 of a byte) */
static inline __m256i bit_to_16(__m256i hb, int p) {
    return _mm256_and_si256(p <= 4 ? _mm256_slli_epi16(hb, 4 - p) : _mm256_srli_epi16(hb, p - 4), _mm256_set1_epi8(16));
}

/* one row's super-block (Q4_K / Q5_K) against NT tokens: the lane vectors of
   Σ sc_j Σ q·qx (v) and Σ m_j Σ qx (mv). Inlined per NT so the sums stay in registers. */
static inline __attribute__((always_inline)) void row_q45(const uint8_t *b, int q5, int nc, const XBlock *const *xb,
                                                          const int NT, __m256i *v, __m256i *mv) {
    const __m256i low = _mm256_set1_epi8(0xF);
    __m128i sm = scales_k4(b + 4);
    __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
    __m256i m16 = _mm256_cvtepu8_epi16(
        _mm_shuffle_epi8(sm, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)));
    const uint8_t *qs = b + (q5 ? 48 : 16);
    __m256i hb = q5 ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
    __m256i s[4];
    for (int t = 0; t < NT; t++) s[t] = _mm256_setzero_si256();
#define CHUNK(c)                                                                                                       \
    do {                                                                                                               \
        __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * (c)));                                            \
        __m256i q0 = _mm256_and_si256(raw, low), q1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);                \
        if (q5) {                                                                                                      \
            q0 = _mm256_or_si256(q0, bit_to_16(hb, 2 * (c)));                                                          \
            q1 = _mm256_or_si256(q1, bit_to_16(hb, 2 * (c) + 1));                                                      \
        }                                                                                                              \
        __m256i s0 = _mm256_shuffle_epi8(sc, bcast16(2 * (c)));                                                        \
        __m256i s1 = _mm256_shuffle_epi8(sc, bcast16(2 * (c) + 1));                                                    \
        _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) {                                                         \
            const __m256i *x = (const __m256i *)(xb[t]->q + 64 * (c));                                                 \
            __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(q0, _mm256_loadu_si256(x)), s0);                       \
            __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(q1, _mm256_loadu_si256(x + 1)), s1);                   \
            s[t] = _mm256_add_epi32(s[t], _mm256_add_epi32(p0, p1));                                                   \
        }                                                                                                              \
    } while (0)
    CHUNK(0);
    if (nc > 1) CHUNK(1);
    if (nc > 2) CHUNK(2);
    if (nc > 3) CHUNK(3);
#undef CHUNK
    for (int t = 0; t < NT; t++)
        v[t] = s[t], mv[t] = _mm256_madd_epi16(m16, _mm256_loadu_si256((const __m256i *)xb[t]->bs));
}

/* one row's Q6_K super-block against NT tokens: Σ sc_j Σ (q+32)·qx − 32 Σ sc_j Σ qx in lanes */
static inline __attribute__((always_inline)) void row_q6(const uint8_t *b, int nv, const XBlock *const *xb,
                                                         const int NT, __m256i *v) {
    const __m256i low = _mm256_set1_epi8(0xF), three = _mm256_set1_epi8(3);
    __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
    __m256i s[4];
    for (int t = 0; t < NT; t++) s[t] = _mm256_setzero_si256();
    for (int h = 0; h < 2 && nv > 4 * h; h++) {
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        __m256i sc = h ? _mm256_permute2x128_si256(sc16, sc16, 0x11) : _mm256_permute2x128_si256(sc16, sc16, 0x00);
        __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
        __m256i hh = _mm256_loadu_si256((const __m256i *)qh);
        __m256i q[4] = {_mm256_or_si256(_mm256_and_si256(l0, low), _mm256_slli_epi16(_mm256_and_si256(hh, three), 4)),
                        _mm256_or_si256(_mm256_and_si256(l1, low),
                                        _mm256_and_si256(_mm256_slli_epi16(hh, 2), _mm256_set1_epi8(0x30))),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low),
                                        _mm256_and_si256(hh, _mm256_set1_epi8(0x30))),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low),
                                        _mm256_and_si256(_mm256_srli_epi16(hh, 2), _mm256_set1_epi8(0x30)))};
        __m256i scl[4] = {_mm256_shuffle_epi8(sc, bcast16(8)), _mm256_shuffle_epi8(sc, bcast16(9)),
                          _mm256_shuffle_epi8(sc, bcast16(10)), _mm256_shuffle_epi8(sc, bcast16(11))};
        _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) {
            const __m256i *x = (const __m256i *)(xb[t]->q + 128 * h);
            __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(q[0], _mm256_loadu_si256(x)), scl[0]);
            __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(q[1], _mm256_loadu_si256(x + 1)), scl[1]);
            s[t] = _mm256_add_epi32(s[t], _mm256_add_epi32(p0, p1));
            if (nv - 4 * h > 2) {
                __m256i p2 = _mm256_madd_epi16(_mm256_maddubs_epi16(q[2], _mm256_loadu_si256(x + 2)), scl[2]);
                __m256i p3 = _mm256_madd_epi16(_mm256_maddubs_epi16(q[3], _mm256_loadu_si256(x + 3)), scl[3]);
                s[t] = _mm256_add_epi32(s[t], _mm256_add_epi32(p2, p3));
            }
        }
    }
    for (int t = 0; t < NT; t++) {
        __m256i off = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)xb[t]->bs));
        v[t] = _mm256_sub_epi32(s[t], _mm256_slli_epi32(off, 5));
    }
}

/* 8 rows' super-block against NT tokens, x's first `valid` elements (the rest are 0, so
   leaving their products out changes no sum) */
static inline __attribute__((always_inline)) void rows8(const uint8_t *const *w, WType wt, int valid,
                                                        const XBlock *const *xb, const int NT, __m256i (*v)[TT],
                                                        __m256i (*mv)[TT]) {
    if (wt == WT_Q6_K)
        for (int k = 0; k < 8; k++) row_q6(w[k], (valid + 31) / 32, xb, NT, v[k]);
    else if (wt == WT_Q5_K)
        for (int k = 0; k < 8; k++) row_q45(w[k], 1, (valid + 63) / 64, xb, NT, v[k], mv[k]);
    else
        for (int k = 0; k < 8; k++) row_q45(w[k], 0, (valid + 63) / 64, xb, NT, v[k], mv[k]);
}

static void qk_groups(void *ctx, int begin, int end) {
    const QkJob *j = ctx;
    size_t bb = block_bytes(j->wt);
    for (int r0 = begin; r0 < end; r0 += GROUP) {
        const uint8_t *row[8];
        for (int k = 0; k < 8; k++) /* a short group repeats its last row in the spare lanes */
            row[k] = q_row(j->w, j->row_bytes, r0 + k < j->rows ? r0 + k : j->rows - 1);
        /* the rows PREFETCH groups on, fetched into L2 a block at a time as this group reads
           its own: 8 interleaved row streams defeat the hardware prefetcher (into L1, the
           fetches held up the loads: 137 against 172 tok/s on SmolLM2 Q4_K_M) */
        const uint8_t *ahead[8];
        int na = 0;
        for (int k = 0; k < 8 && r0 + PREFETCH * GROUP + k < j->rows; k++)
            ahead[na++] = q_row(j->w, j->row_bytes, r0 + PREFETCH * GROUP + k);
        for (int t0 = 0; t0 < j->n; t0 += TT) {
            int nt = j->n - t0 < TT ? j->n - t0 : TT;
            __m256 acc[TT];
            for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
            for (int b = 0; b < j->nb; b++) {
                const uint8_t *w[8];
                const XBlock *xb[TT];
                __m256i v[8][TT], mv[8][TT];
                for (int k = 0; k < 8; k++) w[k] = row[k] + b * bb;
                int valid = j->cols - b * QK_K < QK_K ? j->cols - b * QK_K : QK_K;
                if (t0 == 0)
                    for (int k = 0; k < na; k++)
                        for (size_t o = 0; o < bb; o += 64)
                            _mm_prefetch((const char *)ahead[k] + b * bb + o, _MM_HINT_T1);
                for (int t = 0; t < nt; t++) xb[t] = j->xb + (size_t)(t0 + t) * j->nb + b;
                switch (nt) {
                case 1:
                    rows8(w, j->wt, valid, xb, 1, v, mv);
                    break;
                case 2:
                    rows8(w, j->wt, valid, xb, 2, v, mv);
                    break;
                case 3:
                    rows8(w, j->wt, valid, xb, 3, v, mv);
                    break;
                default:
                    rows8(w, j->wt, valid, xb, 4, v, mv);
                    break;
                }
                __m256 d = f16x8(w, j->wt == WT_Q6_K ? 208 : 0);
                __m256 dm = j->wt == WT_Q6_K ? d : f16x8(w, 2);
                for (int t = 0; t < nt; t++) {
                    __m256i s[8];
                    for (int k = 0; k < 8; k++) s[k] = v[k][t];
                    __m256 dx = _mm256_set1_ps(xb[t]->d);
                    acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(reduce8(s)), acc[t]);
                    if (j->wt != WT_Q6_K) {
                        for (int k = 0; k < 8; k++) s[k] = mv[k][t];
                        acc[t] = _mm256_fmadd_ps(_mm256_xor_ps(_mm256_mul_ps(dm, dx), _mm256_set1_ps(-0.0f)),
                                                 _mm256_cvtepi32_ps(reduce8(s)), acc[t]);
                    }
                }
            }
            int nr = j->rows - r0 < GROUP ? j->rows - r0 : GROUP;
            for (int t = 0; t < nt; t++) {
                float *y = j->y + (size_t)(t0 + t) * j->rows + r0, o[8];
                if (nr == GROUP) _mm256_storeu_ps(y, acc[t]);
                else {
                    _mm256_storeu_ps(o, acc[t]);
                    for (int k = 0; k < nr; k++) y[k] = o[k];
                }
            }
        }
    }
}
#else
static void qk_groups(void *ctx, int begin, int end) {
    const QkJob *j = ctx;
    for (int r = begin; r < end; r++) {
        const uint8_t *w = q_row(j->w, j->row_bytes, r);
        for (int t = 0; t < j->n; t++)
            j->y[(size_t)t * j->rows + r] = row_dot(w, j->wt, j->xb + (size_t)t * j->nb, j->nb);
    }
}
#endif

/* n tokens whose quantized rows fit xb */
static void matmul_tokens(float *y, const float *x, const QIndex *w, WType wt, int n, int cols, int rows, XBlock *xb) {
    int nb = (cols + QK_K - 1) / QK_K;
    for (int t = 0; t < n; t++) quantize_x(xb + (size_t)t * nb, x + (size_t)t * cols, cols);
    QkJob j = {y, xb, w, wt, n, nb, rows, cols, q_row_bytes(wt, cols)};
    /* below ~128K multiply-adds per thread the hand-off costs more than it saves */
    size_t per_row = (size_t)nb * QK_K * n;
    pool_run(qk_groups, &j, rows, GROUP, 1 + (int)(131072 / per_row));
}

void qk_matmul(float *y, const float *x, const QIndex *w, WType wt, int n, int cols, int rows) {
    if (n <= 0 || rows <= 0) return;
    int nb = (cols + QK_K - 1) / QK_K;
    size_t need = (size_t)n * nb * sizeof(XBlock);
    _Alignas(64) XBlock stack[64]; /* 20 KB: a few tokens of a small model */
    XBlock *xb = need <= sizeof stack ? stack : aligned_alloc(64, (need + 63) & ~(size_t)63);
    if (xb) {
        matmul_tokens(y, x, w, wt, n, cols, rows, xb);
        if (xb != stack) free(xb);
        return;
    }
    /* out of memory: as many tokens at a time as the stack holds (the same bits), or NaN
       where not even one fits */
    int fit = (int)(64 / nb);
    for (int t0 = 0; t0 < n; t0 += fit ? fit : n) {
        int nt = n - t0 < fit ? n - t0 : fit;
        if (nt) matmul_tokens(y + (size_t)t0 * rows, x + (size_t)t0 * cols, w, wt, nt, cols, rows, stack);
        else
            for (size_t i = 0; i < (size_t)n * rows; i++) y[i] = NAN;
    }
}

void qk_row_to_f32(float *y, const void *w, WType wt, size_t row, int cols) {
    int nb = (cols + QK_K - 1) / QK_K;
    const uint8_t *b = (const uint8_t *)w + row * q_row_bytes(wt, cols);
    float tmp[QK_K];
    for (int i = 0; i < nb; i++, b += block_bytes(wt)) {
        int m = cols - i * QK_K < QK_K ? cols - i * QK_K : QK_K;
        float *o = m == QK_K ? y + (size_t)i * QK_K : tmp;
        if (wt == WT_Q6_K) { /* dequantize_row_q6_K */
            const float d = q_f16(b + 208);
            const uint8_t *ql = b, *qh = b + 128;
            const int8_t *sc = (const int8_t *)(b + 192);
            float *yy = o;
            for (int h = 0; h < 2; h++, yy += 128, ql += 64, qh += 32, sc += 8)
                for (int l = 0; l < 32; l++) {
                    int is = l / 16;
                    const int8_t q1 = (int8_t)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                    const int8_t q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                    const int8_t q3 = (int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                    const int8_t q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                    yy[l + 0] = d * sc[is + 0] * q1;
                    yy[l + 32] = d * sc[is + 2] * q2;
                    yy[l + 64] = d * sc[is + 4] * q3;
                    yy[l + 96] = d * sc[is + 6] * q4;
                }
        } else { /* dequantize_row_q4_K, _q5_K */
            const float d = q_f16(b), min = q_f16(b + 2);
            const uint8_t *scales = b + 4, *qh = b + 16, *ql = b + (wt == WT_Q4_K ? 16 : 48);
            float *yy = o;
            int is = 0;
            uint8_t u1 = 1, u2 = 2;
            for (int j = 0; j < QK_K; j += 64, ql += 32, is += 2, u1 <<= 2, u2 <<= 2) {
                int sc, m;
                scale_min_k4(is + 0, scales, &sc, &m);
                const float d1 = d * sc, m1 = min * m;
                scale_min_k4(is + 1, scales, &sc, &m);
                const float d2 = d * sc, m2 = min * m;
                if (wt == WT_Q4_K) {
                    for (int l = 0; l < 32; ++l) *yy++ = d1 * (ql[l] & 0xF) - m1;
                    for (int l = 0; l < 32; ++l) *yy++ = d2 * (ql[l] >> 4) - m2;
                } else {
                    for (int l = 0; l < 32; ++l) *yy++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
                    for (int l = 0; l < 32; ++l) *yy++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
                }
            }
        }
        if (o == tmp) memcpy(y + (size_t)i * QK_K, tmp, sizeof(float) * m);
    }
}
