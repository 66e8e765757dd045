/* quant.c — y[n][rows] = x[n][cols] · W^T for Q8_0, Q4_0, Q4_1 and Q5_0 weights, by quant.h's rule.

   x is quantized once per call (the caller's thread), then the threads take groups of
   rows (8; 16 in the AVX-512 VNNI path). A vector path keeps a group's rows in the lanes
   of a vector, from panels q32_pack lays out at load (for each 4-element quad, the rows'
   4 bytes side by side), so that maddubs (or vpdpbusd) against the token's broadcast
   quad gives each row's sums in its own lane, with no horizontal adds, and one fmadd per
   block advances the rows' chains: the scalar chain's operations lane by lane, so the
   bits are the spec's. Several tokens share each block as it is unpacked, so verifying
   n tokens reads the weights from memory once. */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "quant.h"
#include "spec.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) &&               \
    defined(__FMA__) && defined(__F16C__)
#define VNNI 1
#define GROUP 16 /* rows a group (and a vector of int32 or float) holds */
#else
#define GROUP 8
#if defined(__AVXVNNI__)
#define AVX_VNNI 1 /* AVX2 with the VEX vpdpbusd (Alder Lake and later cores without AVX-512) */
#endif
#endif
#define STACK_BYTES 32768
#define TILE 64 /* tokens a group's blocks take at a time */

static size_t block_bytes(WType wt) {
    return wt == WT_Q8_0 ? Q8_0_BYTES : wt == WT_Q4_0 ? Q4_0_BYTES : wt == WT_Q5_0 ? Q5_0_BYTES : Q4_1_BYTES;
}

/* what the weights' bytes hold above their values as unsigned (the vector paths' integer
   sums take off·Σq back out): Q4_0's 8, Q5_0's 16, and Q8_0's 128 where VNNI multiplies it
   as w + 128 */
static int offset(WType wt) {
#if defined(VNNI) || defined(AVX_VNNI)
    if (wt == WT_Q8_0) return 128;
#endif
    return wt == WT_Q4_0 ? 8 : wt == WT_Q5_0 ? 16 : 0;
}

/* x's rows quantized: per block 32 int8, the scale, Σq as a float (Q4_1's minima term),
   and −offset·Σq, where the block's integer sum starts (all exact) */
typedef struct {
    int8_t *q;   /* [n][nb][QK] */
    float *d;    /* [n][nb] */
    int32_t *so; /* [n][nb] */
    float *sf;   /* [n][nb] */
} QX;

#ifdef __AVX512F__
/* q8_block, 16 lanes at a time: the same operations element by element (a maximum of
   absolute values is exact in any order), so the same bits */
static float q8_block16(const float *x, int n, int8_t *q, int32_t *sum) {
    __mmask16 m0 = n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1);
    __mmask16 m1 = n >= 32 ? 0xffff : n > 16 ? (__mmask16)((1u << (n - 16)) - 1) : 0;
    __m512 v[2] = {_mm512_maskz_loadu_ps(m0, x), _mm512_maskz_loadu_ps(m1, x + 16)};
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
    float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    __m512i s = _mm512_setzero_si512();
    for (int h = 0; h < 2; h++) {
        __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(v[h], _mm512_set1_ps(id)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512i i = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-127)), _mm512_set1_ps(127)));
        _mm_storeu_si128((__m128i *)(q + 16 * h), _mm512_cvtepi32_epi8(i));
        s = _mm512_add_epi32(s, i);
    }
    *sum = _mm512_reduce_add_epi32(s);
    return d;
}
#elif defined(__AVX2__)
/* q8_block, 8 lanes at a time (the same operations, so the same bits, as above) */
static float q8_block8(const float *x, int n, int8_t *q, int32_t *sum) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], amax = _mm256_setzero_ps();
    for (int k = 0; k < 4; k++) {
        int left = n - 8 * k;
        __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        v[k] = left >= 8  ? _mm256_loadu_ps(x + 8 * k)
               : left > 0 ? _mm256_maskload_ps(x + 8 * k, m)
                          : _mm256_setzero_ps();
        amax = _mm256_max_ps(_mm256_andnot_ps(sign, v[k]), amax);
    }
    __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(amax, 1), _mm256_castps256_ps128(amax));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    float a = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    float d = a / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    __m256i i[4], s = _mm256_setzero_si256();
    for (int k = 0; k < 4; k++) {
        __m256 r =
            _mm256_round_ps(_mm256_mul_ps(v[k], _mm256_set1_ps(id)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        i[k] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-127)), _mm256_set1_ps(127)));
        s = _mm256_add_epi32(s, i[k]);
    }
    /* the packs work within 128-bit halves: dwords come out 0 2 4 6 1 3 5 7 */
    __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    __m128i s4 = _mm_add_epi32(_mm256_extracti128_si256(s, 1), _mm256_castsi256_si128(s));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    *sum = _mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1)));
    return d;
}
#endif

static void quantize_row(int8_t *q, float *d, int32_t *so, float *sf, const float *x, int cols, int off) {
    int nb = (cols + QK - 1) / QK;
    for (int b = 0; b < nb; b++) {
        int32_t si;
#ifdef __AVX512F__
        d[b] = q8_block16(x + b * QK, cols - b * QK, q + b * QK, &si);
#elif defined(__AVX2__)
        d[b] = q8_block8(x + b * QK, cols - b * QK, q + b * QK, &si);
#else
        d[b] = q8_block(x + b * QK, cols - b * QK, q + b * QK, &si);
#endif
        sf[b] = (float)si;
        so[b] = -off * si;
    }
}

typedef struct {
    float *y;
    const QIndex *w;
    WType wt;
    int n, cols, rows, nb;
    size_t row_bytes;
    QX x;
} Job;

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define INLINE static inline __attribute__((always_inline))
#define PANELS_KEPT 1
/* The vector paths keep a group's rows (8 for AVX2, 16 for AVX-512) in the lanes of a
   vector, so q32_pack lays each group out once, at load: per block its quads as panels
   (vector k: quad k of the block for the group's rows, 4 bytes each; Q4: one vector of
   bytes holds quads k and k + 4, as low and high nibbles; Q5_0: then one vector whose
   byte i holds, in bit k, the fifth bit of byte i of quad k), then its f16 scales (d;
   Q4_1: then m), the group's blocks one after another (or in pairs, below): one
   stream, read straight into registers (the scales apart from the quads, two streams a
   group, halved the read rate). */
static size_t panel_qs(WType wt) { return (size_t)GROUP * 4 * (wt == WT_Q8_0 ? 8 : wt == WT_Q5_0 ? 5 : 4); }
static size_t panel_sc(WType wt) { return (size_t)GROUP * 2 * (wt == WT_Q4_1 ? 2 : 1); }
static size_t panel_bytes(WType wt) { return panel_qs(wt) + panel_sc(wt); } /* GROUP blocks' bytes */
/* Where a block's panels are not a whole number of vectors (Q8_0, Q4_0, Q5_0: 16 or 32
   bytes of scales after the quads), blocks go in pairs, the two quads' panels and then
   the two scales' panels, so that every quads' vector sits on a vector boundary (unpaired,
   a quarter of AVX2's loads and half of AVX-512's crossed two cache lines). An odd last
   block keeps its pair's room. */
INLINE int unit_blocks(WType wt) { return panel_bytes(wt) % (GROUP * 4) ? 2 : 1; }
INLINE size_t unit_bytes(WType wt) { return unit_blocks(wt) * panel_bytes(wt); }
INLINE size_t quads_at(WType wt, int b) {
    if (unit_blocks(wt) == 1) return (size_t)b * panel_bytes(wt);
    return (size_t)(b >> 1) * unit_bytes(wt) + (size_t)(b & 1) * panel_qs(wt);
}
INLINE size_t scales_at(WType wt, int b) {
    if (unit_blocks(wt) == 1) return (size_t)b * panel_bytes(wt) + panel_qs(wt);
    return (size_t)(b >> 1) * unit_bytes(wt) + 2 * panel_qs(wt) + (size_t)(b & 1) * panel_sc(wt);
}
static size_t group_bytes(WType wt, int nb) {
    int u = unit_blocks(wt);
    return ((size_t)(nb + u - 1) / u * unit_bytes(wt) + 63) & ~(size_t)63;
}

#ifdef VNNI
/* AVX-512 VNNI: vpdpbusd multiplies unsigned bytes by signed ones and adds each 4 into
   an int32 lane, exactly: a vector holds quad k of the 16 rows, against the token's quad
   k broadcast. Q8_0's signed weights go in as w ^ 0x80 = w + 128, taken back as 128·Σq.
   The integer sums, so the bits, are the scalar spec's. Tokens take a group's blocks
   TT at a time, each block unpacked once for all of them. */
#define TT 8
/* quad8 (quant.h) in 16 lanes */
INLINE __m512i quad16(const int8_t *p) { return _mm512_broadcastd_epi32(_mm_loadu_si32(p)); }
INLINE void unpack16(__m512i w[8], const uint8_t *q, const WType wt) {
    if (wt == WT_Q8_0) {
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) w[k] =
            _mm512_xor_si512(_mm512_loadu_si512(q + 64 * k), flip);
        return;
    }
    const __m512i low = _mm512_set1_epi8(0x0f);
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
        __m512i v = _mm512_loadu_si512(q + 64 * k);
        w[k] = _mm512_and_si512(v, low), w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    }
    if (wt == WT_Q5_0) { /* bit k to bit 4 (16-bit shifts: the mask keeps each byte's own), or'd in */
        const __m512i h = _mm512_loadu_si512(q + 256), bit4 = _mm512_set1_epi8(0x10);
        w[0] = _mm512_ternarylogic_epi32(w[0], _mm512_slli_epi16(h, 4), bit4, 0xf8);
        w[1] = _mm512_ternarylogic_epi32(w[1], _mm512_slli_epi16(h, 3), bit4, 0xf8);
        w[2] = _mm512_ternarylogic_epi32(w[2], _mm512_slli_epi16(h, 2), bit4, 0xf8);
        w[3] = _mm512_ternarylogic_epi32(w[3], _mm512_slli_epi16(h, 1), bit4, 0xf8);
        w[4] = _mm512_ternarylogic_epi32(w[4], h, bit4, 0xf8);
        w[5] = _mm512_ternarylogic_epi32(w[5], _mm512_srli_epi16(h, 1), bit4, 0xf8);
        w[6] = _mm512_ternarylogic_epi32(w[6], _mm512_srli_epi16(h, 2), bit4, 0xf8);
        w[7] = _mm512_ternarylogic_epi32(w[7], _mm512_srli_epi16(h, 3), bit4, 0xf8);
    }
}
/* NT tokens from tt (acc's rows from t0) for one group, their chains in registers;
   first: the tile that prefetches */
INLINE void tile16(const Job *j, const uint8_t *G, float *acc, int t0, int tt, const int NT, int first,
                   const WType wt) {
    const size_t pb = panel_bytes(wt);
    const int off = offset(wt);
    const QX *x = &j->x;
    __m512 a[TT];
    _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) a[t] = _mm512_setzero_ps();
    const uint8_t *next = G + PREFETCH;
    for (int b = 0; b < j->nb; b++) {
        if (first) prefetch(&next, G + (b + 1) * pb, PREFETCH);
        __m512i w[8];
        unpack16(w, G + quads_at(wt, b), wt);
        const uint8_t *sc = G + scales_at(wt, b);
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sc)), m = d;
        if (wt == WT_Q4_1) m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc + 32)));
        _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) {
            size_t o = (size_t)(tt + t) * j->nb + b;
            const int8_t *xq = x->q + o * QK;
            __m512i s0 =
                _mm512_dpbusd_epi32(off ? _mm512_set1_epi32(x->so[o]) : _mm512_setzero_si512(), w[0], quad16(xq));
            __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], quad16(xq + 4));
            _Pragma("GCC unroll 8") for (int k = 2; k < 8; k += 2) {
                s0 = _mm512_dpbusd_epi32(s0, w[k], quad16(xq + 4 * k));
                s1 = _mm512_dpbusd_epi32(s1, w[k + 1], quad16(xq + 4 * k + 4));
            }
            __m512i sum = _mm512_add_epi32(s0, s1);
            __m512 vdx = _mm512_set1_ps(x->d[o]);
            a[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, vdx), _mm512_cvtepi32_ps(sum), a[t]);
            if (wt == WT_Q4_1) a[t] = _mm512_fmadd_ps(_mm512_mul_ps(m, vdx), _mm512_set1_ps(x->sf[o]), a[t]);
        }
    }
    _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) _mm512_storeu_ps(acc + (size_t)(tt - t0 + t) * GROUP, a[t]);
}
/* one group of 16 rows (its panels G) for nt tokens from t0 */
INLINE void group_vec(const Job *j, const uint8_t *G, float *acc /* [nt][GROUP] */, int t0, int nt, const WType wt) {
    for (int tt = t0; tt < t0 + nt; tt += TT) {
        int left = t0 + nt - tt;
        /* NT a constant in each call, so that the chains stay in registers */
#define TILE16(k) tile16(j, G, acc, t0, tt, k, tt == t0, wt)
        if (left >= 8) TILE16(8);
        else if (left == 7) TILE16(7);
        else if (left == 6) TILE16(6);
        else if (left == 5) TILE16(5);
        else if (left == 4) TILE16(4);
        else if (left == 3) TILE16(3);
        else if (left == 2) TILE16(2);
        else TILE16(1);
#undef TILE16
    }
}
#else
/* a block's scales as floats (d; Q4_1: and m), s its panel's */
INLINE void load_scales(__m256 *d, __m256 *m, const uint8_t *s, const WType wt) {
    *d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)s));
    *m = wt == WT_Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 16))) : *d;
}

typedef __m256i PV;
/* a block of 8 rows as panels, w[k] = quad k (Q4: the nibbles as bytes; Q5_0: with the
   fifth bit as 16; Q8_0: then |w| in w[8 + k], or with AVX-VNNI w + 128 as unsigned) */
INLINE void unpack(__m256i w[16], const uint8_t *q, const WType wt) {
    if (wt == WT_Q8_0) {
        _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {
            w[k] = _mm256_loadu_si256((const __m256i *)q + k);
#ifdef AVX_VNNI
            w[k] = _mm256_xor_si256(w[k], _mm256_set1_epi8((char)0x80));
#else
            w[k + 8] = _mm256_abs_epi8(w[k]);
#endif
        }
        return;
    }
    const __m256i low = _mm256_set1_epi8(0x0f);
    _Pragma("GCC unroll 8") for (int k = 0; k < 4; k++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)q + k);
        w[k + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        w[k] = _mm256_and_si256(v, low);
    }
    if (wt == WT_Q5_0) { /* bit k of each byte to bit 4 (16-bit shifts: the mask keeps each byte's own) */
        const __m256i h = _mm256_loadu_si256((const __m256i *)q + 4), bit4 = _mm256_set1_epi8(0x10);
        w[0] = _mm256_or_si256(w[0], _mm256_and_si256(_mm256_slli_epi16(h, 4), bit4));
        w[1] = _mm256_or_si256(w[1], _mm256_and_si256(_mm256_slli_epi16(h, 3), bit4));
        w[2] = _mm256_or_si256(w[2], _mm256_and_si256(_mm256_slli_epi16(h, 2), bit4));
        w[3] = _mm256_or_si256(w[3], _mm256_and_si256(_mm256_slli_epi16(h, 1), bit4));
        w[4] = _mm256_or_si256(w[4], _mm256_and_si256(h, bit4));
        w[5] = _mm256_or_si256(w[5], _mm256_and_si256(_mm256_srli_epi16(h, 1), bit4));
        w[6] = _mm256_or_si256(w[6], _mm256_and_si256(_mm256_srli_epi16(h, 2), bit4));
        w[7] = _mm256_or_si256(w[7], _mm256_and_si256(_mm256_srli_epi16(h, 3), bit4));
    }
}

#ifndef AVX_VNNI
/* Q8_0's quad k for 8 rows (aw = |w|): the pairs' sums, then each lane's 4 products */
INLINE __m256i q8_quad(__m256i aw, __m256i w, const int8_t *xq) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(quad8(xq), w)), _mm256_set1_epi16(1));
}
#endif
/* one token's block: 8 rows' integer sums (Q8_0's sign moved onto x, so that maddubs
   multiplies |w| ≤ 128 by x·sign(w): a pair ≤ 2·128·127) */
INLINE __m256i block_sum(const __m256i w[16], const int8_t *xb, int32_t so, const WType wt) {
    __m256i sum;
#ifdef AVX_VNNI
    (void)wt;
    /* vpdpbusd: 4 u8 × s8 products into each int32 lane, exact; the weights' offsets
       (Q8_0's +128 included) come back out through so, as in the AVX-512 path */
    __m256i s0 = _mm256_set1_epi32(so), s1 = _mm256_setzero_si256();
    _Pragma("GCC unroll 8") for (int k = 0; k < 8; k += 2) {
        const __m256i q0 = quad8(xb + 4 * k), q1 = quad8(xb + 4 * k + 4);
        s0 = _mm256_dpbusd_avx_epi32(s0, w[k], q0);
        s1 = _mm256_dpbusd_avx_epi32(s1, w[k + 1], q1);
    }
    sum = _mm256_add_epi32(s0, s1);
#else
    const __m256i ones = _mm256_set1_epi16(1);
    if (wt == WT_Q5_0) { /* 5-bit values: a quad pair's 16-bit sums stay exact (≤ 2·2·31·127), not 8 quads' */
        __m256i s0 = _mm256_setzero_si256(), s1 = s0;
        _Pragma("GCC unroll 8") for (int k = 0; k < 8; k += 2) {
            const __m256i q0 = quad8(xb + 4 * k), q1 = quad8(xb + 4 * k + 4);
            __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(w[k], q0), _mm256_maddubs_epi16(w[k + 1], q1));
            if (k < 4) s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(p, ones));
            else s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(p, ones));
        }
        sum = _mm256_add_epi32(_mm256_add_epi32(s0, s1), _mm256_set1_epi32(so));
    } else { /* Q8_0 (Q4_0 and Q4_1 take q4_steps) */
        __m256i s0 = _mm256_setzero_si256(), s1 = s0;
        _Pragma("GCC unroll 8") for (int k = 0; k < 8; k += 2) {
            s0 = _mm256_add_epi32(s0, q8_quad(w[k + 8], w[k], xb + 4 * k));
            s1 = _mm256_add_epi32(s1, q8_quad(w[k + 9], w[k + 1], xb + 4 * k + 4));
            KEEP_CHAINS(s0, s1);
        }
        sum = _mm256_add_epi32(s0, s1);
    }
#endif
    return sum;
}
#ifndef AVX_VNNI
/* Q8_0's block_sum for one token, each quad from the panel (q) straight into its
   product: unpacked all at once, the 16 vectors filled the 16 registers and spilled,
   the tokens' chain with them. The same integer sum. */
INLINE __m256i q8_sum(const uint8_t *q, const int8_t *xb) {
    __m256i s0 = _mm256_setzero_si256(), s1 = s0;
    _Pragma("GCC unroll 8") for (int k = 0; k < 8; k += 2) {
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)q + k),
                      w1 = _mm256_loadu_si256((const __m256i *)q + k + 1);
        s0 = _mm256_add_epi32(s0, q8_quad(_mm256_abs_epi8(w0), w0, xb + 4 * k));
        s1 = _mm256_add_epi32(s1, q8_quad(_mm256_abs_epi8(w1), w1, xb + 4 * k + 4));
    }
    return _mm256_add_epi32(s0, s1);
}
#endif
/* the block's float chain step: acc + d·dx·sum (+ m·dx·Σx for Q4_1) */
INLINE __m256 fold(__m256 acc, __m256i sum, __m256 d, __m256 m, float dx, float sf, const WType wt) {
    __m256 vdx = _mm256_set1_ps(dx);
    acc = _mm256_fmadd_ps(_mm256_mul_ps(d, vdx), _mm256_cvtepi32_ps(sum), acc);
    if (wt == WT_Q4_1) acc = _mm256_fmadd_ps(_mm256_mul_ps(m, vdx), _mm256_set1_ps(sf), acc);
    return acc;
}
INLINE __m256 step(__m256 acc, const __m256i w[16], __m256 d, __m256 m, const int8_t *xb, float dx, int32_t so,
                   float sf, const WType wt) {
    return fold(acc, block_sum(w, xb, so, wt), d, m, dx, sf, wt);
}

#define TT 4 /* tokens a tile takes */
/* a block's step for NT tokens, their chains a[t] (x's blocks nb apart from ob; sc: its
   scales). From 3 tokens on, every token's integer sums first, then the chains: the
   chains no longer share the registers with the unpacked quads (which spilled them) */
INLINE void steps(__m256 *a, const PV *w, const uint8_t *sc, const Job *j, size_t ob, const int NT, const WType wt) {
    __m256 d, m;
    if (NT < 3) {
        load_scales(&d, &m, sc, wt);
        _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++, ob += j->nb) {
            a[t] = step(a[t], w, d, m, j->x.q + ob * QK, j->x.d[ob], j->x.so[ob], j->x.sf[ob], wt);
        }
        return;
    }
    _Alignas(32) int32_t sum[TT][8];
    size_t o = ob;
    _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++, o += j->nb)
        _mm256_store_si256((__m256i *)sum[t], block_sum(w, j->x.q + o * QK, j->x.so[o], wt));
    load_scales(&d, &m, sc, wt);
    _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++, ob += j->nb) a[t] =
        fold(a[t], _mm256_load_si256((const __m256i *)sum[t]), d, m, j->x.d[ob], j->x.sf[ob], wt);
}
#ifndef AVX_VNNI
/* Q4_0 / Q4_1 for NT tokens: each of the block's 4 vectors split into its two quads and
   multiplied into every token's 16-bit sums at once, so that two weight vectors, the
   sums and the chains are all that is live (KEEP_CHAIN). The 16-bit sums of all 8 quads
   stay exact, ≤ 8·2·15·127. */
INLINE void q4_steps(__m256 *a, const uint8_t *q, const uint8_t *sc, const Job *j, size_t ob, const int NT,
                     const WType wt) {
    const __m256i low = _mm256_set1_epi8(0x0f);
    __m256i s[TT];
    _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) s[t] = _mm256_setzero_si256();
    _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)q + k);
        const __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) {
            const int8_t *xb = j->x.q + (ob + (size_t)t * j->nb) * QK;
            s[t] = _mm256_add_epi16(s[t], _mm256_maddubs_epi16(lo, quad8(xb + 4 * k)));
            KEEP_CHAIN(s[t]);
            s[t] = _mm256_add_epi16(s[t], _mm256_maddubs_epi16(hi, quad8(xb + 4 * k + 16)));
            KEEP_CHAIN(s[t]);
        }
    }
    __m256 d, m;
    load_scales(&d, &m, sc, wt);
    _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++, ob += j->nb) {
        __m256i sum = _mm256_madd_epi16(s[t], _mm256_set1_epi16(1));
        if (wt == WT_Q4_0) sum = _mm256_add_epi32(sum, _mm256_set1_epi32(j->x.so[ob]));
        a[t] = fold(a[t], sum, d, m, j->x.d[ob], j->x.sf[ob], wt);
    }
}
#endif
/* one block (its quads' panel q, its scales' sc) into NT tokens' chains */
INLINE void block(__m256 *a, const uint8_t *q, const uint8_t *sc, const Job *j, size_t ob, const int NT,
                  const WType wt) {
#ifndef AVX_VNNI
    if (wt == WT_Q4_0 || wt == WT_Q4_1) {
        q4_steps(a, q, sc, j, ob, NT, wt);
        return;
    }
    if (wt == WT_Q8_0 && NT == 1) {
        __m256 d, m;
        load_scales(&d, &m, sc, wt);
        a[0] = fold(a[0], q8_sum(q, j->x.q + ob * QK), d, m, j->x.d[ob], 0, wt);
        return;
    }
#endif
    PV w[16];
    unpack(w, q, wt);
    steps(a, w, sc, j, ob, NT, wt);
}
/* NT (1 to TT) tokens from t0 for one group of 8 rows, each block straight from the
   panels into registers, the tokens' chains side by side; first: the tile that
   prefetches (later tiles find the group's panels in L1) */
INLINE void direct(const Job *j, const uint8_t *G, float *acc, int t0, const int NT, int first, const WType wt) {
    const size_t pb = panel_bytes(wt);
    size_t o = (size_t)t0 * j->nb;
    __m256 a[TT];
    _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) a[t] = _mm256_setzero_ps();
    const uint8_t *next = G + PREFETCH_Q32;
    if (unit_blocks(wt) == 1)
        for (int b = 0; b < j->nb; b++) {
            if (first) prefetch(&next, G + (b + 1) * pb, PREFETCH_Q32);
            block(a, G + quads_at(wt, b), G + scales_at(wt, b), j, o + b, NT, wt);
        }
    else {
        const uint8_t *P = G; /* a pair's blocks from a pointer: indexing each block's place cost 15 % */
        for (int b = 0; b < j->nb; P += unit_bytes(wt))
            for (int h = 0; h < 2 && b < j->nb; h++, b++) {
                if (first) prefetch(&next, P + (h + 1) * pb, PREFETCH_Q32);
                block(a, P + h * panel_qs(wt), P + 2 * panel_qs(wt) + h * panel_sc(wt), j, o + b, NT, wt);
            }
    }
    _Pragma("GCC unroll 4") for (int t = 0; t < NT; t++) _mm256_storeu_ps(acc + (size_t)t * GROUP, a[t]);
}

/* One group of 8 rows (its panels G) for every token, TT tokens at a time, each tile's
   blocks unpacked again from the panels: cheaper than staging them unpacked, which left
   the unpacking's memory reads and the tokens' arithmetic unoverlapped */
INLINE void group_vec(const Job *j, const uint8_t *G, float *acc /* [nt][GROUP] */, int t0, int nt, const WType wt) {
    for (int tt = t0; tt < t0 + nt; tt += TT) {
        int left = t0 + nt - tt, first = tt == t0;
        float *at = acc + (size_t)(tt - t0) * GROUP;
        /* NT a constant in each call, so that the chains stay in registers */
        if (left >= 4) direct(j, G, at, tt, 4, first, wt);
        else if (left == 3) direct(j, G, at, tt, 3, first, wt);
        else if (left == 2) direct(j, G, at, tt, 2, first, wt);
        else direct(j, G, at, tt, 1, first, wt);
    }
}
#endif
static void group_q8_0(const Job *j, const uint8_t *G, float *acc, int t0, int nt) {
    group_vec(j, G, acc, t0, nt, WT_Q8_0);
}
static void group_q4_0(const Job *j, const uint8_t *G, float *acc, int t0, int nt) {
    group_vec(j, G, acc, t0, nt, WT_Q4_0);
}
static void group_q4_1(const Job *j, const uint8_t *G, float *acc, int t0, int nt) {
    group_vec(j, G, acc, t0, nt, WT_Q4_1);
}
static void group_q5_0(const Job *j, const uint8_t *G, float *acc, int t0, int nt) {
    group_vec(j, G, acc, t0, nt, WT_Q5_0);
}
#else
/* the spec: each output one fmaf chain over its row's blocks in order */
static void group_scalar(const Job *j, const uint8_t *const p[GROUP], float *acc /* [nt][GROUP] */, int t0, int nt) {
    const size_t bb = block_bytes(j->wt);
    for (int i = 0; i < GROUP; i++)
        for (int t = t0; t < t0 + nt; t++) {
            float a = 0;
            for (int b = 0; b < j->nb; b++) {
                const uint8_t *blk = p[i] + (size_t)b * bb;
                size_t xo = (size_t)t * j->nb + b;
                const int8_t *xq = j->x.q + xo * QK;
                float dx = j->x.d[xo], dw = q_f16(blk);
                int32_t s = 0;
                if (j->wt == WT_Q8_0) {
                    for (int k = 0; k < QK; k++) s += (int8_t)blk[2 + k] * xq[k];
                } else if (j->wt == WT_Q5_0) {
                    uint32_t qh = q5_high(blk);
                    for (int k = 0; k < QK / 2; k++)
                        s += (((blk[6 + k] & 15) | (int)(qh >> k & 1) << 4) - 16) * xq[k] +
                             (((blk[6 + k] >> 4) | (int)(qh >> (k + 16) & 1) << 4) - 16) * xq[k + QK / 2];
                } else {
                    const uint8_t *qs = blk + (j->wt == WT_Q4_1 ? 4 : 2);
                    int off = j->wt == WT_Q4_0 ? 8 : 0;
                    for (int k = 0; k < QK / 2; k++)
                        s += ((qs[k] & 15) - off) * xq[k] + ((qs[k] >> 4) - off) * xq[k + QK / 2];
                }
                a = fmaf(dw * dx, (float)s, a);
                if (j->wt == WT_Q4_1) a = fmaf(q_f16(blk + 2) * dx, j->x.sf[xo], a);
            }
            acc[(size_t)(t - t0) * GROUP + i] = a;
        }
}
#endif

static void matmul_rows(void *ctx, int begin, int end) {
    const Job *j = ctx;
    _Alignas(32) float acc[GROUP * TILE];
    for (int r0 = begin; r0 < end; r0 += GROUP) {
        int nr = end - r0 < GROUP ? end - r0 : GROUP;
#ifdef PANELS_KEPT
        const uint8_t *G = j->w->panels[0] + (size_t)(r0 / GROUP) * group_bytes(j->wt, j->nb);
#else
        const uint8_t *p[GROUP];
        for (int i = 0; i < GROUP; i++) p[i] = q_row(j->w, j->row_bytes, r0 + (i < nr ? i : nr - 1));
#endif
        for (int t0 = 0; t0 < j->n; t0 += TILE) {
            int nt = j->n - t0 < TILE ? j->n - t0 : TILE;
#ifdef PANELS_KEPT
            if (j->wt == WT_Q8_0) group_q8_0(j, G, acc, t0, nt);
            else if (j->wt == WT_Q4_0) group_q4_0(j, G, acc, t0, nt);
            else if (j->wt == WT_Q5_0) group_q5_0(j, G, acc, t0, nt);
            else group_q4_1(j, G, acc, t0, nt);
#else
            group_scalar(j, p, acc, t0, nt);
#endif
            for (int t = 0; t < nt; t++) /* a whole group's copy a constant size: vector moves, not rep movs */
                if (nr == GROUP)
                    memcpy(j->y + (size_t)(t0 + t) * j->rows + r0, acc + (size_t)t * GROUP, sizeof(float) * GROUP);
                else memcpy(j->y + (size_t)(t0 + t) * j->rows + r0, acc + (size_t)t * GROUP, sizeof(float) * nr);
        }
    }
}

/* n tokens whose quantized rows fit buf */
static void matmul_tokens(float *y, const float *x, const QIndex *w, WType wt, int n, int cols, int rows,
                          unsigned char *buf) {
    int nb = (cols + QK - 1) / QK;
    Job j = {y, w, wt, n, cols, rows, nb, q_row_bytes(wt, cols), {0}};
    j.x.q = (int8_t *)buf;
    j.x.d = (float *)(buf + (size_t)n * nb * QK);
    j.x.so = (int32_t *)(j.x.d + (size_t)n * nb);
    j.x.sf = (float *)(j.x.so + (size_t)n * nb);
    for (int t = 0; t < n; t++) {
        size_t o = (size_t)t * nb;
        quantize_row(j.x.q + o * QK, j.x.d + o, j.x.so + o, j.x.sf + o, x + (size_t)t * cols, cols, offset(wt));
    }
    /* below ~64K multiply-adds per thread the hand-off costs more than it saves */
    long per_row = (long)cols * n;
    pool_run(matmul_rows, &j, rows, GROUP, 1 + (int)(65536 / per_row));
}

void q32_matmul(float *y, const float *x, const QIndex *w, WType wt, int n, int cols, int rows) {
    if (n < 1 || rows < 1 || cols < 1) return;
    size_t per_token = (size_t)(cols + QK - 1) / QK * (QK + 3 * sizeof(float)), bytes = per_token * (size_t)n;
    _Alignas(64) unsigned char stack[STACK_BYTES];
    unsigned char *buf = bytes <= sizeof stack ? stack : aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (buf) {
        matmul_tokens(y, x, w, wt, n, cols, rows, buf);
        if (buf != stack) free(buf);
        return;
    }
    /* out of memory: as many tokens at a time as the stack holds (the same bits; the
       weights read once per batch of them), or NaN where not even one fits */
    int fit = (int)(sizeof stack / per_token);
    for (int t0 = 0; t0 < n; t0 += fit ? fit : n) {
        int nt = n - t0 < fit ? n - t0 : fit;
        if (nt) matmul_tokens(y + (size_t)t0 * rows, x + (size_t)t0 * cols, w, wt, nt, cols, rows, stack);
        else
            for (size_t i = 0; i < (size_t)n * rows; i++) y[i] = NAN;
    }
}

#ifdef PANELS_KEPT
size_t q32_panel_bytes(WType wt, int rows, int cols) {
    return (size_t)((rows + GROUP - 1) / GROUP) * group_bytes(wt, (cols + QK - 1) / QK);
}

/* bits 0, 4, 8, ..., 28 of v as one byte */
static uint8_t gather_fifth(uint32_t v) {
    v &= 0x11111111u;
    v = (v | v >> 3) & 0x03030303u;
    v = (v | v >> 6) & 0x000f000fu;
    return (uint8_t)(v | v >> 12);
}

static void pack_groups(void *ctx, int begin, int end) {
    const PackJob *p = ctx;
    const WType wt = p->wt;
    const int nb = (p->cols + QK - 1) / QK;
    const size_t bb = block_bytes(wt), rb = q_row_bytes(wt, p->cols);
    const int off = wt == WT_Q8_0 || wt == WT_Q4_0 ? 2 : wt == WT_Q4_1 ? 4 : 6, quads = wt == WT_Q8_0 ? 8 : 4;
    for (int g = begin; g < end; g++) {
        uint8_t *G = p->dst + (size_t)g * group_bytes(wt, nb);
        memset(G, 0, group_bytes(wt, nb)); /* a short group's missing rows: zero scales */
        for (int i = 0; i < GROUP && g * GROUP + i < p->rows; i++) {
            const uint8_t *row = q_row(p->w, rb, g * GROUP + i);
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = row + (size_t)b * bb;
                uint8_t *Q = G + quads_at(wt, b), *S = G + scales_at(wt, b);
                for (int k = 0; k < quads; k++) memcpy(Q + k * GROUP * 4 + i * 4, blk + off + 4 * k, 4);
                memcpy(S + i * 2, blk, 2);
                if (wt == WT_Q4_1) memcpy(S + GROUP * 2 + i * 2, blk + 2, 2);
                for (int e = 0; wt == WT_Q5_0 && e < 4; e++) /* bit j: element 4j + e's fifth bit */
                    Q[4 * GROUP * 4 + i * 4 + e] = gather_fifth(q5_high(blk) >> e);
            }
        }
    }
}

void q32_pack(uint8_t *dst, const QIndex *w, WType wt, int cols, int rows) {
    PackJob p = {dst, w, wt, cols, rows};
    pool_run(pack_groups, &p, (rows + GROUP - 1) / GROUP, 1, 64);
}
#else
size_t q32_panel_bytes(WType wt, int rows, int cols) {
    (void)wt, (void)rows, (void)cols;
    return 0;
}
void q32_pack(uint8_t *dst, const QIndex *w, WType wt, int cols, int rows) {
    (void)dst, (void)w, (void)wt, (void)cols, (void)rows;
}
#endif

/* as ggml's dequantize_row_q8_0 / q4_0 / q4_1 / q5_0: d·q, (q − 8)·d, d·q + m (two
   roundings), (q − 16)·d */
void q32_row_to_f32(float *y, const void *w, WType wt, size_t row, int cols) {
    const uint8_t *r = (const uint8_t *)w + row * q_row_bytes(wt, cols);
    const size_t bb = block_bytes(wt);
    for (int c0 = 0, b = 0; c0 < cols; c0 += QK, b++) {
        const uint8_t *blk = r + (size_t)b * bb;
        float d = q_f16(blk), v[QK];
        if (wt == WT_Q8_0) {
            for (int k = 0; k < QK; k++) v[k] = (float)(int8_t)blk[2 + k] * d;
        } else if (wt == WT_Q4_0) {
            for (int k = 0; k < QK / 2; k++)
                v[k] = (float)((blk[2 + k] & 15) - 8) * d, v[k + QK / 2] = (float)((blk[2 + k] >> 4) - 8) * d;
        } else if (wt == WT_Q5_0) {
            uint32_t qh = q5_high(blk);
            for (int k = 0; k < QK / 2; k++) {
                v[k] = (float)((((blk[6 + k] & 15) | (int)(qh >> k & 1) << 4)) - 16) * d;
                v[k + QK / 2] = (float)((((blk[6 + k] >> 4) | (int)(qh >> (k + 16) & 1) << 4)) - 16) * d;
            }
        } else {
            float m = q_f16(blk + 2);
            for (int k = 0; k < QK / 2; k++) {
                float p0 = (float)(blk[4 + k] & 15) * d, p1 = (float)(blk[4 + k] >> 4) * d;
                v[k] = p0 + m, v[k + QK / 2] = p1 + m;
            }
        }
        memcpy(y + c0, v, sizeof(float) * (size_t)(cols - c0 < QK ? cols - c0 : QK));
    }
}
