/* quant_k.c — the K block types (Q4_K, Q5_K, Q6_K): the integer matmul of quant.h's rule
   and ggml's dequantization.

   x is quantized once per call, per 256 elements, on the caller's thread; its per-16
   sums of q serve the minima terms (and Q6_K's −32 offset). Rows go to the pool in
   groups of 8. The vector paths read each group from panels qk_pack lays out at load
   (one stream a group, prefetched into L2) and keep its 8 rows' fmaf chains in the
   lanes of one vector, each row's integer sums exact in its own lane, so their order
   never shows; a super-block's panels stay in L1 while every token of the call takes
   them. The scalar path (the spec) reads the blocks in place. */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "quant.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QK_AVX2 1
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define QK_VNNI 1
#elif defined(__AVXVNNI__)
#define QK_AVXVNNI 1 /* the AVX2 path with the VEX vpdpbusd */
#endif
#endif

#define GROUP 8 /* rows per lane vector */

/* one super-block of x: q, sums of q per 16, scale */
typedef struct {
    int8_t q[QK_K];
    int16_t bs[16];
    int32_t aux[16]; /* prep_x's */
    float d;
    int32_t pad[7];
#ifdef QK_VNNI
    int8_t e[32 * 64]; /* prep_x's */
#endif
} XBlock;
#define XSTACK (24576 / sizeof(XBlock)) /* x blocks on the stack: a few tokens of a small model */

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
#define INLINE static inline __attribute__((always_inline))
/* qk_pack lays each group of 8 rows out once, at load, one stream per group: per
   super-block its quads as panels (32 bytes: one quad of the 8 rows, row i at 4i), paired
   so that a 64-byte load holds the same quad of two sub-blocks (Q4_K / Q5_K: of chunks
   2cp and 2cp + 1, Q6_K: of ql and ql + 32), then Q5_K / Q6_K's high bits as panels, the
   6-bit scales and minima decoded into bytes (SC: per pair of sub-blocks that share a
   vector, their 8 rows' scales; MN: per pair (2p, 2p + 1), each row's two minima), then
   the 8 rows' f16 d (and dmin). Offsets within a super-block's panels: */
enum {
    Q4_SC = 1024,
    Q4_MN = 1088,
    Q4_D = 1152,
    Q4_SB = 1184,
    Q5_QH = 1024,
    Q5_SC = 1280,
    Q5_MN = 1344,
    Q5_D = 1408,
    Q5_SB = 1440,
    Q6_QH = 1024,
    Q6_SC = 1536,
    Q6_D = 1664,
    Q6_SB = 1680
};
static size_t sb_bytes(WType wt) { return wt == WT_Q4_K ? Q4_SB : wt == WT_Q5_K ? Q5_SB : Q6_SB; }
static size_t group_bytes(WType wt, int nb) { return ((size_t)nb * sb_bytes(wt) + 63) & ~(size_t)63; }

/* x's per-type extras: Q4_K / Q5_K: aux[p] = the sums of q of sub-blocks 2p, 2p + 1 as
   an int16 pair; Q6_K: VNNI (either): −32·Σq per 16, AVX2: per 16 the int16 pair 32·Σ q of each
   quad's elements 0, 1 and 2, 3 (what a maddubs lane's −32 offsets add up to).
   VNNI: then the quads expanded, e[i] = 64 bytes: a quad broadcast over 8 lanes, then
   the quad its pair partner reads */
static void prep_x(XBlock *xb, WType wt, int nb) {
    for (int b = 0; b < nb; b++, xb++) {
        if (wt == WT_Q6_K)
            for (int j = 0; j < 16; j++) {
#if defined(QK_VNNI) || defined(QK_AVXVNNI)
                xb->aux[j] = -32 * xb->bs[j];
#else
                int lo = 0, hi = 0;
                for (int k = 0; k < 4; k++) {
                    const int8_t *q = xb->q + 16 * j + 4 * k;
                    lo += q[0] + q[1], hi += q[2] + q[3];
                }
                xb->aux[j] = (int32_t)((uint32_t)(uint16_t)(32 * lo) | (uint32_t)(uint16_t)(32 * hi) << 16);
#endif
            }
        else
            for (int p = 0; p < 4; p++) {
                int a = xb->bs[4 * p] + xb->bs[4 * p + 1], c = xb->bs[4 * p + 2] + xb->bs[4 * p + 3];
                xb->aux[p] = (int32_t)((uint32_t)(uint16_t)a | (uint32_t)(uint16_t)c << 16);
            }
#ifdef QK_VNNI
        for (int i = 0; i < 32; i++) {
            int o = i >> 1, k = o & 7, nib = i & 1, e0, e1;
            if (wt == WT_Q6_K) e0 = 128 * (o >> 3) + 64 * nib + 4 * k, e1 = e0 + 32;
            else e0 = 128 * (o >> 3) + 32 * nib + 4 * k, e1 = e0 + 64;
            for (int l = 0; l < 8; l++) {
                memcpy(xb->e + 64 * i + 4 * l, xb->q + e0, 4);
                memcpy(xb->e + 64 * i + 32 + 4 * l, xb->q + e1, 4);
            }
        }
#endif
    }
}

#ifdef QK_VNNI
/* AVX-512 VNNI: vpdpbusd sums 4 u8 × s8 products into each int32 lane exactly, so one
   64-byte vector advances two sub-blocks of the 8 rows; each sub-block's int32 sums are
   multiplied by its scale (vpmulld) and the halves added: Σ_j sc_j Σ q·qx in integers,
   as the spec's. Q6_K's −32 enters as each sum's starting value, −32·Σqx. */
#define HALVES(a, b) _mm512_inserti64x4(_mm512_set1_epi16(a), _mm256_set1_epi16(b), 1)
/* [v0 in 8 lanes | v1 in 8 lanes] */
INLINE __m512i pair32(int32_t v0, int32_t v1) { return _mm512_mask_set1_epi32(_mm512_set1_epi32(v0), 0xff00, v1); }
INLINE __m256i fold(__m512i v) { return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)); }

INLINE void step(__m256 *acc, const uint8_t *P, const XBlock *xb, const int one, const WType wt) {
    (void)one;
    const __m512i low = _mm512_set1_epi8(0x0f);
    const __m512i *e = (const __m512i *)xb->e;
    __m512i S = _mm512_setzero_si512();
    __m256 dx = _mm256_set1_ps(xb->d);
    if (wt == WT_Q6_K) {
        const __m512i m30 = _mm512_set1_epi8(0x30), sl = HALVES(4, 2), sr = HALVES(0, 2);
        const uint8_t *SC = P + Q6_SC;
        for (int h = 0; h < 2; h++) {
            __m512i A[2][2];
            for (int s = 0; s < 2; s++)
                for (int nib = 0; nib < 2; nib++) {
                    int j = 8 * h + 4 * nib + s;
                    A[s][nib] = pair32(xb->aux[j], xb->aux[j + 2]);
                }
            _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
                const int o = h * 8 + k;
                __m512i L = _mm512_loadu_si512(P + 64 * o);
                __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(P + Q6_QH + 32 * o)));
                __m512i lo = _mm512_ternarylogic_epi32(_mm512_and_si512(L, low), _mm512_sllv_epi16(H, sl), m30, 0xf8);
                __m512i hi = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(L, 4), low),
                                                       _mm512_srlv_epi16(H, sr), m30, 0xf8);
                A[k >> 2][0] = _mm512_dpbusd_epi32(A[k >> 2][0], lo, _mm512_loadu_si512(e + 2 * o));
                A[k >> 2][1] = _mm512_dpbusd_epi32(A[k >> 2][1], hi, _mm512_loadu_si512(e + 2 * o + 1));
            }
            for (int s = 0; s < 2; s++)
                for (int nib = 0; nib < 2; nib++) {
                    __m512i sc =
                        _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(SC + (h * 4 + s * 2 + nib) * 16)));
                    S = _mm512_add_epi32(S, _mm512_mullo_epi32(A[s][nib], sc));
                }
        }
        __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(P + Q6_D)));
        *acc = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(fold(S)), *acc);
        return;
    }
    const int q5 = wt == WT_Q5_K;
    const size_t SCo = q5 ? Q5_SC : Q4_SC, MNo = q5 ? Q5_MN : Q4_MN, Do = q5 ? Q5_D : Q4_D;
    const __m512i bit4 = _mm512_set1_epi8(0x10);
    for (int cp = 0; cp < 2; cp++) {
        /* Q5_K: chunk c's fifth bits are bits 2c (low nibbles) and 2c + 1 of qh, to bit 4 */
        const __m512i shl = cp ? HALVES(0, 2) : HALVES(4, 2), shh = cp ? HALVES(1, 3) : HALVES(3, 1);
        __m512i A[2][2] = {{_mm512_setzero_si512(), _mm512_setzero_si512()},
                           {_mm512_setzero_si512(), _mm512_setzero_si512()}};
        _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
            const int o = cp * 8 + k;
            __m512i v = _mm512_loadu_si512(P + 64 * o);
            __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
            if (q5) {
                __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(P + Q5_QH + 32 * k)));
                lo = _mm512_ternarylogic_epi32(lo, cp ? _mm512_srlv_epi16(H, shl) : _mm512_sllv_epi16(H, shl), bit4,
                                               0xf8);
                hi = _mm512_ternarylogic_epi32(hi, cp ? _mm512_srlv_epi16(H, shh) : _mm512_sllv_epi16(H, shh), bit4,
                                               0xf8);
            }
            A[0][k & 1] = _mm512_dpbusd_epi32(A[0][k & 1], lo, _mm512_loadu_si512(e + 2 * o));
            A[1][k & 1] = _mm512_dpbusd_epi32(A[1][k & 1], hi, _mm512_loadu_si512(e + 2 * o + 1));
        }
        for (int nib = 0; nib < 2; nib++) {
            __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(P + SCo + (cp * 2 + nib) * 16)));
            S = _mm512_add_epi32(S, _mm512_mullo_epi32(_mm512_add_epi32(A[nib][0], A[nib][1]), sc));
        }
    }
    __m512i M = _mm512_dpwssd_epi32(_mm512_setzero_si512(),
                                    _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(P + MNo))),
                                    pair32(xb->aux[0], xb->aux[1]));
    M = _mm512_dpwssd_epi32(M, _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(P + MNo + 32))),
                            pair32(xb->aux[2], xb->aux[3]));
    __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(P + Do)));
    __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(P + Do + 16)));
    *acc = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(fold(S)), *acc);
    *acc =
        _mm256_fmadd_ps(_mm256_xor_ps(_mm256_mul_ps(dm, dx), _mm256_set1_ps(-0.0f)), _mm256_cvtepi32_ps(fold(M)), *acc);
}
#undef HALVES
#else
/* AVX2: maddubs against x's quad broadcast gives each row's pair sums in its own lane
   (AVX-VNNI: vpdpbusd its int32 sub-block sums, exact, then times the scale);
   a sub-block's 16-bit sums stay exact (Q4_K: 8 quads ≤ 8·2·15·127; Q5_K: 4 quads ≤
   4·2·31·127; Q6_K: wrapping, less the −32 offsets, ≤ 8·32·127 in magnitude), then
   madd by the scale (in both halves of the row's int32 lane) makes them int32. */
/* the 8 rows' scales at p (bytes) as int32 lanes */
INLINE __m256i scale32(const uint8_t *p, int sign) {
    __m128i b = _mm_loadl_epi64((const __m128i *)p);
    return sign ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b);
}
/* the same in both int16 halves of each int32 lane */
INLINE __m256i scale2(const uint8_t *p, int sign) {
    __m256i v = scale32(p, sign);
    return _mm256_blend_epi16(v, _mm256_slli_epi32(v, 16), 0xAA);
}
INLINE __m256i bit_to_16(__m256i hb, int p) {
    return _mm256_and_si256(p <= 4 ? _mm256_slli_epi16(hb, 4 - p) : _mm256_srli_epi16(hb, p - 4), _mm256_set1_epi8(16));
}

/* Q4_K / Q5_K chunk c (sub-blocks 2c, 2c + 1) of the 8 rows' super-block: S += Σ sc · Σ q·qx */
INLINE __m256i chunk(__m256i S, const uint8_t *P, const int8_t *xq, int c, size_t SCo, const WType wt) {
    const __m256i low = _mm256_set1_epi8(0x0f);
    const int q5 = wt == WT_Q5_K;
    __m256i a[2][2] = {{_mm256_setzero_si256(), _mm256_setzero_si256()},
                       {_mm256_setzero_si256(), _mm256_setzero_si256()}};
    _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(P + ((c >> 1) * 8 + k) * 64 + (c & 1) * 32));
        __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        if (q5) {
            __m256i hb = _mm256_loadu_si256((const __m256i *)(P + Q5_QH + 32 * k));
            lo = _mm256_or_si256(lo, bit_to_16(hb, 2 * c)), hi = _mm256_or_si256(hi, bit_to_16(hb, 2 * c + 1));
        }
#ifdef QK_AVXVNNI
        a[0][k & 1] = _mm256_dpbusd_avx_epi32(a[0][k & 1], lo, quad8(xq + 64 * c + 4 * k));
        a[1][k & 1] = _mm256_dpbusd_avx_epi32(a[1][k & 1], hi, quad8(xq + 64 * c + 32 + 4 * k));
#else
        a[0][k >> 2] = _mm256_add_epi16(a[0][k >> 2], _mm256_maddubs_epi16(lo, quad8(xq + 64 * c + 4 * k)));
        a[1][k >> 2] = _mm256_add_epi16(a[1][k >> 2], _mm256_maddubs_epi16(hi, quad8(xq + 64 * c + 32 + 4 * k)));
#endif
    }
    for (int nib = 0; nib < 2; nib++) {
        const uint8_t *sc = P + SCo + ((c >> 1) * 2 + nib) * 16 + (c & 1) * 8;
#ifdef QK_AVXVNNI
        S = _mm256_add_epi32(S, _mm256_mullo_epi32(_mm256_add_epi32(a[nib][0], a[nib][1]), scale32(sc, 0)));
#else
        __m256i s2 = scale2(sc, 0);
        S = _mm256_add_epi32(S, _mm256_add_epi32(_mm256_madd_epi16(a[nib][0], s2), _mm256_madd_epi16(a[nib][1], s2)));
#endif
    }
    return S;
}

/* one: the call takes a single token (a constant at each call site) */
INLINE void step(__m256 *acc, const uint8_t *P, const XBlock *xb, const int one, const WType wt) {
    const __m256i low = _mm256_set1_epi8(0x0f);
    const int8_t *xq = xb->q;
    __m256i S = _mm256_setzero_si256();
    __m256 dx = _mm256_set1_ps(xb->d);
    if (wt == WT_Q6_K) {
        const __m256i m30 = _mm256_set1_epi8(0x30);
        /* the four sums a[g] must stay in registers: with h and s unrolled they spilled,
           with the g loops rolled they lived in memory */
        _Pragma("GCC unroll 1") for (int h = 0; h < 2; h++) {
            _Pragma("GCC unroll 1") for (int s = 0; s < 2; s++) {
#ifdef QK_AVXVNNI /* each sum starts at its −32 offsets' share, −32·Σqx */
                __m256i a[4];
                _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) a[g] =
                    _mm256_set1_epi32(xb->aux[8 * h + 2 * g + s]);
#else
                __m256i a[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                                _mm256_setzero_si256()};
#endif
                _Pragma("GCC unroll 4") for (int k = 4 * s; k < 4 * s + 4; k++) {
                    const int o = h * 8 + k;
                    __m256i L0 = _mm256_loadu_si256((const __m256i *)(P + 64 * o)),
                            L1 = _mm256_loadu_si256((const __m256i *)(P + 64 * o + 32)),
                            H = _mm256_loadu_si256((const __m256i *)(P + Q6_QH + 32 * o));
                    __m256i q[4] = {
                        _mm256_or_si256(_mm256_and_si256(L0, low), _mm256_and_si256(_mm256_slli_epi16(H, 4), m30)),
                        _mm256_or_si256(_mm256_and_si256(L1, low), _mm256_and_si256(_mm256_slli_epi16(H, 2), m30)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L0, 4), low), _mm256_and_si256(H, m30)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L1, 4), low),
                                        _mm256_and_si256(_mm256_srli_epi16(H, 2), m30))};
                    _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++)
#ifdef QK_AVXVNNI
                        a[g] = _mm256_dpbusd_avx_epi32(a[g], q[g], quad8(xq + 128 * h + 32 * g + 4 * k));
#else
                    {
                        a[g] = _mm256_add_epi16(a[g], _mm256_maddubs_epi16(q[g], quad8(xq + 128 * h + 32 * g + 4 * k)));
                        KEEP_CHAIN(a[g]);
                    }
#endif
                }
                _Pragma("GCC unroll 4") for (int g = 0; g < 4; g++) {
                    const uint8_t *sc = P + Q6_SC + (h * 4 + s * 2 + (g >> 1)) * 16 + (g & 1) * 8;
#ifdef QK_AVXVNNI
                    S = _mm256_add_epi32(S, _mm256_mullo_epi32(a[g], scale32(sc, 1)));
#else
                    __m256i c = _mm256_sub_epi16(a[g], _mm256_set1_epi32(xb->aux[8 * h + 2 * g + s]));
                    S = _mm256_add_epi32(S, _mm256_madd_epi16(c, scale2(sc, 1)));
#endif
                }
            }
        }
        __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(P + Q6_D)));
        *acc = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(S), *acc);
        return;
    }
    const int q5 = wt == WT_Q5_K;
    const size_t SCo = q5 ? Q5_SC : Q4_SC, MNo = q5 ? Q5_MN : Q4_MN, Do = q5 ? Q5_D : Q4_D;
    /* the chunks one at a time: unrolled, the compiler hoisted the four chunks' loads and
       spilled them. Except Q5_K's for several tokens, whose fifth bits' shifts then cost
       more than the spills */
    if (q5 && !one) _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) S = chunk(S, P, xq, c, SCo, wt);
    else _Pragma("GCC unroll 1") for (int c = 0; c < 4; c++) S = chunk(S, P, xq, c, SCo, wt);
    __m256i M = _mm256_setzero_si256();
    for (int p = 0; p < 4; p++)
        M = _mm256_add_epi32(
            M, _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(P + MNo + 16 * p))),
                                 _mm256_set1_epi32(xb->aux[p])));
    __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(P + Do)));
    __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(P + Do + 16)));
    *acc = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(S), *acc);
    *acc = _mm256_fmadd_ps(_mm256_xor_ps(_mm256_mul_ps(dm, dx), _mm256_set1_ps(-0.0f)), _mm256_cvtepi32_ps(M), *acc);
}
#endif

#define TILE 64 /* tokens a group's super-block (≤ 1.7 KB, in L1) serves before the next */
/* one group (its panels G) for tokens [t0, t0 + nt): each super-block read from memory
   once, its 8 rows' chains advanced for every token in turn */
INLINE void group(const QkJob *j, const uint8_t *G, __m256 *acc, int t0, int nt, const WType wt) {
    const size_t sb = sb_bytes(wt);
    const uint8_t *next = G + PREFETCH;
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int b = 0; b < j->nb; b++) {
        prefetch(&next, G + (b + 1) * sb, PREFETCH);
        const XBlock *xb = j->xb + (size_t)t0 * j->nb + b;
        if (nt == 1) step(acc, G + b * sb, xb, 1, wt);
        else
            for (int t = 0; t < nt; t++) step(acc + t, G + b * sb, xb + (size_t)t * j->nb, 0, wt);
    }
}
static void group_q4(const QkJob *j, const uint8_t *G, __m256 *acc, int t0, int nt) {
    group(j, G, acc, t0, nt, WT_Q4_K);
}
static void group_q5(const QkJob *j, const uint8_t *G, __m256 *acc, int t0, int nt) {
    group(j, G, acc, t0, nt, WT_Q5_K);
}
static void group_q6(const QkJob *j, const uint8_t *G, __m256 *acc, int t0, int nt) {
    group(j, G, acc, t0, nt, WT_Q6_K);
}

static void qk_groups(void *ctx, int begin, int end) {
    const QkJob *j = ctx;
    _Alignas(32) __m256 acc[TILE];
    for (int r0 = begin; r0 < end; r0 += GROUP) {
        const uint8_t *G = j->w->panels[0] + (size_t)(r0 / GROUP) * group_bytes(j->wt, j->nb);
        int nr = j->rows - r0 < GROUP ? j->rows - r0 : GROUP;
        for (int t0 = 0; t0 < j->n; t0 += TILE) {
            int nt = j->n - t0 < TILE ? j->n - t0 : TILE;
            if (j->wt == WT_Q4_K) group_q4(j, G, acc, t0, nt);
            else if (j->wt == WT_Q5_K) group_q5(j, G, acc, t0, nt);
            else group_q6(j, G, acc, t0, nt);
            for (int t = 0; t < nt; t++) {
                float *y = j->y + (size_t)(t0 + t) * j->rows + r0, o[8];
                if (nr == GROUP) _mm256_storeu_ps(y, acc[t]);
                else {
                    _mm256_storeu_ps(o, acc[t]);
                    memcpy(y, o, sizeof(float) * nr);
                }
            }
        }
    }
}

size_t qk_panel_bytes(WType wt, int rows, int cols) {
    return (size_t)((rows + GROUP - 1) / GROUP) * group_bytes(wt, (cols + QK_K - 1) / QK_K);
}

static void pack_groups(void *ctx, int begin, int end) {
    const PackJob *p = ctx;
    const WType wt = p->wt;
    const int nb = (p->cols + QK_K - 1) / QK_K;
    const size_t bb = block_bytes(wt), rb = q_row_bytes(wt, p->cols), sb = sb_bytes(wt), gb = group_bytes(wt, nb);
    for (int g = begin; g < end; g++) {
        uint8_t *G = p->dst + (size_t)g * gb;
        memset(G, 0, gb); /* a short group's missing rows: zero scales */
        for (int i = 0; i < GROUP && g * GROUP + i < p->rows; i++) {
            const uint8_t *row = q_row(p->w, rb, g * GROUP + i);
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = row + (size_t)b * bb;
                uint8_t *P = G + b * sb;
                if (wt == WT_Q6_K) {
                    for (int h = 0; h < 2; h++)
                        for (int k = 0; k < 8; k++) {
                            int o = h * 8 + k;
                            memcpy(P + 64 * o + 4 * i, blk + 64 * h + 4 * k, 4);
                            memcpy(P + 64 * o + 32 + 4 * i, blk + 64 * h + 32 + 4 * k, 4);
                            memcpy(P + Q6_QH + 32 * o + 4 * i, blk + 128 + 32 * h + 4 * k, 4);
                        }
                    for (int j = 0; j < 16; j++) {
                        int h = j >> 3, r = j & 7;
                        P[Q6_SC + (h * 4 + (r & 1) * 2 + (r >> 2)) * 16 + ((r >> 1) & 1) * 8 + i] = blk[192 + j];
                    }
                    memcpy(P + Q6_D + 2 * i, blk + 208, 2);
                    continue;
                }
                const int q5 = wt == WT_Q5_K;
                const uint8_t *qs = blk + (q5 ? 48 : 16);
                for (int c = 0; c < 4; c++)
                    for (int k = 0; k < 8; k++)
                        memcpy(P + ((c >> 1) * 8 + k) * 64 + (c & 1) * 32 + 4 * i, qs + 32 * c + 4 * k, 4);
                if (q5)
                    for (int k = 0; k < 8; k++) memcpy(P + Q5_QH + 32 * k + 4 * i, blk + 16 + 4 * k, 4);
                const size_t SCo = q5 ? Q5_SC : Q4_SC, MNo = q5 ? Q5_MN : Q4_MN, Do = q5 ? Q5_D : Q4_D;
                for (int j = 0; j < 8; j++) {
                    int sc, m;
                    scale_min_k4(j, blk + 4, &sc, &m);
                    P[SCo + ((j >> 2) * 2 + (j & 1)) * 16 + ((j >> 1) & 1) * 8 + i] = (uint8_t)sc;
                    P[MNo + (j >> 1) * 16 + 2 * i + (j & 1)] = (uint8_t)m;
                }
                memcpy(P + Do + 2 * i, blk, 2);
                memcpy(P + Do + 16 + 2 * i, blk + 2, 2);
            }
        }
    }
}

void qk_pack(uint8_t *dst, const QIndex *w, WType wt, int cols, int rows) {
    PackJob p = {dst, w, wt, cols, rows};
    pool_run(pack_groups, &p, (rows + GROUP - 1) / GROUP, 1, 64);
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
size_t qk_panel_bytes(WType wt, int rows, int cols) {
    (void)wt, (void)rows, (void)cols;
    return 0;
}
void qk_pack(uint8_t *dst, const QIndex *w, WType wt, int cols, int rows) {
    (void)dst, (void)w, (void)wt, (void)cols, (void)rows;
}
#endif

/* n tokens whose quantized rows fit xb */
static void matmul_tokens(float *y, const float *x, const QIndex *w, WType wt, int n, int cols, int rows, XBlock *xb) {
    int nb = (cols + QK_K - 1) / QK_K;
    for (int t = 0; t < n; t++) {
        quantize_x(xb + (size_t)t * nb, x + (size_t)t * cols, cols);
#ifdef QK_AVX2
        prep_x(xb + (size_t)t * nb, wt, nb);
#endif
    }
    QkJob j = {y, xb, w, wt, n, nb, rows, cols, q_row_bytes(wt, cols)};
    /* below ~128K multiply-adds per thread the hand-off costs more than it saves */
    size_t per_row = (size_t)nb * QK_K * n;
    pool_run(qk_groups, &j, rows, GROUP, 1 + (int)(131072 / per_row));
}

void qk_matmul(float *y, const float *x, const QIndex *w, WType wt, int n, int cols, int rows) {
    if (n <= 0 || rows <= 0) return;
    int nb = (cols + QK_K - 1) / QK_K;
    size_t need = (size_t)n * nb * sizeof(XBlock);
    _Alignas(64) XBlock stack[XSTACK];
    XBlock *xb = need <= sizeof stack ? stack : aligned_alloc(64, (need + 63) & ~(size_t)63);
    if (xb) {
        matmul_tokens(y, x, w, wt, n, cols, rows, xb);
        if (xb != stack) free(xb);
        return;
    }
    /* out of memory: as many tokens at a time as the stack holds (the same bits), or NaN
       where not even one fits */
    int fit = (int)(XSTACK / nb);
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
