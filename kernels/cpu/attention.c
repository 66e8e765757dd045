/* attention.c — one unit of work is a token and a kv head with the query heads that
   share it (GQA): the keys and values are read once for all of them. Units never
   depend on each other, so threads split them and tokens stay batch-invariant.
   Keys and values are both transposed within a block ([hd][block_size] per kv head),
   so a block's keys are taken 16 at a time, one vector per dimension.
   The keys a token sees are numbered j = 0, 1, ... in position order: its sequence's
   committed slots, then the visible slots of its batch. While those continue the
   committed run they are read from the blocks like committed ones; the rest (a tree's
   ancestors) are "lone" keys, read one slot at a time into the same arithmetic.
   For each (query head, key) the score is the sequential FMA chain over the head's
   dimensions. For each (query head, dimension) the weighted sum keeps 16 partials,
   partial i taking keys j ≡ i mod 16 in key order, added by the halving tree (i + 8,
   then + 4, + 2, + 1 apart). Every path computes exactly that, so a token's result
   never depends on the batch.
   A bf16 or q8_0 cache is read in place: each element is widened (bf16, exact) or
   dequantized as its scale times its integer (q8_0, one rounding) where the f32 cache's
   element would be loaded, and the chains are the same.
   FlashDecoding: a token with more than ATT_SPLIT keys is split into chunks of
   ATT_SPLIT keys by key index; each chunk is a unit computed exactly as a token with
   only those keys would be, giving its maximum, sum and unnormalized weighted sums,
   and the chunks are recombined in chunk order (backend.h's spec). */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "exp.h"
#include "pool.h"

#define MAX_GROUP 8 /* query heads a unit scores together (larger groups go in parts) */

typedef struct {
    const AttnArgs *a;
    int t, kvh;
    int g;           /* query heads in this unit */
    int shift;       /* log2 of the block size when it is a power of two, else -1 */
    int nc;          /* keys read from the blocks: 0 .. nc-1 (slots slot0 + j) */
    const int *lone; /* slots of keys nc, nc+1, ... (less lone_base) */
    int n_lone, lone_base;
    int slot0;                 /* the first key's slot: the chunk's first key index */
    float *sums;               /* a chunk of a split token: each head's sum goes here, out unnormalized */
    const float *q[MAX_GROUP]; /* [hd] each */
    float *out[MAX_GROUP];     /* [hd] each */
} Unit;

/* this unit's kv head in slot's block of a layer array (keys or values): [hd][block_size],
   from the slot's column; the offset in elements of any KV type */
static inline size_t col_off(const Unit *u, int slot) {
    const AttnArgs *a = u->a;
    slot += u->slot0;
    int blk = u->shift >= 0 ? slot >> u->shift : slot / a->block_size; /* no division per chunk */
    return (size_t)a->table[u->t][blk] * a->block_stride + (size_t)u->kvh * a->hd * a->block_size +
           (slot - blk * a->block_size);
}
static inline const float *column(const Unit *u, const float *base, int slot) { return base + col_off(u, slot); }

/* a q8_0 slot's scale for this unit's kv head, in a layer's scales */
static inline size_t scale_off(const Unit *u, int slot) {
    const AttnArgs *a = u->a;
    slot += u->slot0;
    int blk = u->shift >= 0 ? slot >> u->shift : slot / a->block_size;
    return (size_t)a->table[u->t][blk] * a->scale_stride + (size_t)u->kvh * a->block_size +
           (slot - blk * a->block_size);
}

static inline float bf16_f32(uint16_t h) {
    uint32_t w = (uint32_t)h << 16;
    float f;
    memcpy(&f, &w, sizeof f);
    return f;
}

/* dimension d of slot's key (val 0) or value (val 1) as attention computes with it */
static inline float elem(const Unit *u, int val, int slot, int d) {
    const AttnArgs *a = u->a;
    size_t at = col_off(u, slot) + (size_t)d * a->block_size;
    switch (a->kv_type) {
    case KV_BF16:
        return bf16_f32(((const uint16_t *)(val ? a->vq : a->kq))[at]);
    case KV_Q8_0:
        return (val ? a->v_scale : a->k_scale)[scale_off(u, slot)] * (float)((const int8_t *)(val ? a->vq : a->kq))[at];
    default:
        return (val ? a->v : a->k)[at];
    }
}

static inline int lone_slot(const Unit *u, int x) { return u->lone_base + u->lone[x] - u->slot0; }

/* 1 / sum, what out is multiplied by; a chunk of a split token keeps the sum instead */
static inline float inv_of(const Unit *u, int h, float sum) {
    if (!u->sums) return 1.0f / sum;
    u->sums[h] = sum;
    return 1.0f;
}

static float score_one(const Unit *u, const float *q, int slot) {
    float s = 0;
    if (u->a->kv_type == KV_F32) {
        const float *K = column(u, u->a->k, slot);
        for (int d = 0; d < u->a->hd; d++) s = fmaf(q[d], K[(size_t)d * u->a->block_size], s);
    } else
        for (int d = 0; d < u->a->hd; d++) s = fmaf(q[d], elem(u, 0, slot, d), s);
    return s * u->a->scale;
}

/* dimension d of slot's value */
static inline float value_at(const Unit *u, int slot, int d) {
    return u->a->kv_type == KV_F32 ? column(u, u->a->v, slot)[(size_t)d * u->a->block_size] : elem(u, 1, slot, d);
}

#ifdef __AVX512F__
static inline __mmask16 first_lanes(int left) {
    return left >= 16 ? 0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
}

/* G heads × C chunks of 16 keys from j: G*C independent chains. Inlined with constant
   G and C, so the chains live in registers. */
static inline __attribute__((always_inline)) void score_chunks(const Unit *u, float *const *p, __m512 *mx, int j,
                                                               const int G, const int C) {
    const AttnArgs *a = u->a;
    const float *K[8];
    __mmask16 m[8];
    __m512 acc[MAX_GROUP][8];
#pragma GCC unroll 8
    for (int c = 0; c < C; c++) {
        m[c] = first_lanes(u->nc - j - 16 * c);
        K[c] = column(u, a->k, j + 16 * c);
#pragma GCC unroll 8
        for (int h = 0; h < G; h++) acc[h][c] = _mm512_setzero_ps();
    }
#pragma GCC unroll 8
    for (int d = 0; d < a->hd; d++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            __m512 kd = _mm512_maskz_loadu_ps(m[c], K[c] + (size_t)d * a->block_size);
#pragma GCC unroll 8
            for (int h = 0; h < G; h++) acc[h][c] = _mm512_fmadd_ps(_mm512_set1_ps(u->q[h][d]), kd, acc[h][c]);
        }
    __m512 sc = _mm512_set1_ps(a->scale);
#pragma GCC unroll 8
    for (int h = 0; h < G; h++)
#pragma GCC unroll 8
        for (int c = 0; c < C; c++) {
            __m512 s = _mm512_mul_ps(acc[h][c], sc);
            _mm512_mask_storeu_ps(p[h] + j + 16 * c, m[c], s);
            mx[h] = _mm512_mask_max_ps(mx[h], m[c], mx[h], s);
        }
}

/* the scores of keys 0..nc-1 and each head's largest; enough chains in flight: 8
   chunks for one head, 4 for two, 2 for three or four, 1 for more */
#define SCORE_G(G)                                                                                                     \
    static void score_g##G(const Unit *u, float *const *p, float *max) {                                               \
        const int C = G >= 8 ? 1 : 8 / G;                                                                              \
        __m512 mx[G];                                                                                                  \
        for (int h = 0; h < G; h++) mx[h] = _mm512_set1_ps(-INFINITY);                                                 \
        int j = 0;                                                                                                     \
        for (; j + 16 * C <= u->nc; j += 16 * C) score_chunks(u, p, mx, j, G, C);                                      \
        for (; j < u->nc; j += 16) score_chunks(u, p, mx, j, G, 1);                                                    \
        for (int h = 0; h < G; h++) max[h] = _mm512_reduce_max_ps(mx[h]);                                              \
    }
SCORE_G(1)
SCORE_G(2)
SCORE_G(3) SCORE_G(4) SCORE_G(5) SCORE_G(6) SCORE_G(7)
    SCORE_G(8) static void (*const SCORE[MAX_GROUP + 1])(const Unit *, float *const *, float *) = {
        0, score_g1, score_g2, score_g3, score_g4, score_g5, score_g6, score_g7, score_g8};

/* 16 vectors → one: lane i of the result is v[perm(i)]'s lanes added by the halving
   tree, where the tree's own output order is undone by feeding v transposed 4×4 */
static inline __m512 tree16(const __m512 *v) {
    __m512 w[8], z[4], s[2];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) { /* + 8 apart: lanes 0-7 from one vector, 8-15 from the next */
        __m512 a = v[(2 * i) % 4 * 4 + (2 * i) / 4], b = v[(2 * i + 1) % 4 * 4 + (2 * i + 1) / 4];
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) /* + 4 apart */
        z[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0xdd));
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) /* + 2 apart */
        s[i] = _mm512_add_ps(_mm512_shuffle_ps(z[2 * i], z[2 * i + 1], 0x44),
                             _mm512_shuffle_ps(z[2 * i], z[2 * i + 1], 0xee));
    return _mm512_add_ps(_mm512_shuffle_ps(s[0], s[1], 0x88), _mm512_shuffle_ps(s[0], s[1], 0xdd)); /* + 1 */
}

/* GT heads from h0 × DT dimensions from d0 (GT*DT = 16; heads and dimensions past the
   unit's are clamped, computed and not stored): acc[h*DT + d] holds the 16 partials of
   Σ_j p_h[j] v_j[d]. With EXP (a tile that covers the whole unit) p holds the scores:
   softmax's exponent pass happens here, chunk by chunk, as exp_sum would do it, and
   sets inv. */
static inline __attribute__((always_inline)) void sum_tile(const Unit *u, float *const *p, const float *mx, float *inv,
                                                           int h0, int d0, const int GT, const int DT, const int EXP) {
    const AttnArgs *a = u->a;
    int bs = a->block_size, hd = a->hd;
    float *ph[8];
    int hc[8], dd[16]; /* clamped head and dimension offsets */
#pragma GCC unroll 8
    for (int h = 0; h < GT; h++) {
        hc[h] = h0 + h < u->g ? h0 + h : h0;
        ph[h] = p[hc[h]];
    }
#pragma GCC unroll 16
    for (int d = 0; d < DT; d++) dd[d] = (d0 + d < hd ? d0 + d : hd - 1) * bs;
    __m512 acc[16], sum[8];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int h = 0; h < GT; h++) sum[h] = _mm512_setzero_ps();
    for (int j = 0, end = EXP ? u->nc + u->n_lone : u->nc; j < end; j += 16) {
        __mmask16 m = first_lanes(u->nc - j);
        __m512 pv[8];
        if (EXP) { /* all loads before the stores: a clamped head reads the same scores */
            __mmask16 k = first_lanes(end - j);
#pragma GCC unroll 8
            for (int h = 0; h < GT; h++) pv[h] = _mm512_maskz_loadu_ps(k, ph[h] + j);
#pragma GCC unroll 8
            for (int h = 0; h < GT; h++) {
                pv[h] = _mm512_maskz_mov_ps(k, exp_ps(_mm512_sub_ps(pv[h], _mm512_set1_ps(mx[hc[h]]))));
                _mm512_mask_storeu_ps(ph[h] + j, k & ~m, pv[h]); /* only the lone keys read theirs back */
                sum[h] = _mm512_add_ps(sum[h], pv[h]);
                pv[h] = _mm512_maskz_mov_ps(m, pv[h]);
            }
            if (!m) continue;
        } else
#pragma GCC unroll 8
            for (int h = 0; h < GT; h++) pv[h] = _mm512_maskz_loadu_ps(m, ph[h] + j);
        const float *V = column(u, a->v, j);
#pragma GCC unroll 16
        for (int d = 0; d < DT; d++) {
            __m512 v = _mm512_maskz_loadu_ps(m, V + dd[d]);
#pragma GCC unroll 8
            for (int h = 0; h < GT; h++) acc[h * DT + d] = _mm512_fmadd_ps(pv[h], v, acc[h * DT + d]);
        }
    }
    for (int x = 0; x < u->n_lone; x++) { /* key nc + x goes to partial (nc + x) % 16 */
        int j = u->nc + x;
        __mmask16 lane = (__mmask16)(1u << (j & 15));
        const float *V = column(u, a->v, lone_slot(u, x));
#pragma GCC unroll 16
        for (int d = 0; d < DT; d++) {
            __m512 v = _mm512_set1_ps(V[dd[d]]);
#pragma GCC unroll 8
            for (int h = 0; h < GT; h++)
                acc[h * DT + d] = _mm512_mask3_fmadd_ps(_mm512_set1_ps(ph[h][j]), v, acc[h * DT + d], lane);
        }
    }
    if (EXP)
        for (int h = 0; h < GT && h0 + h < u->g; h++) inv[h0 + h] = inv_of(u, h0 + h, _mm512_reduce_add_ps(sum[h]));
    _Alignas(64) float r[16];
    __m512 iv = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int h = 0; h < GT; h++)
        iv = _mm512_mask_mov_ps(iv, (__mmask16)(((1u << DT) - 1) << (h * DT)), _mm512_set1_ps(inv[hc[h]]));
    __m512 res = _mm512_mul_ps(tree16(acc), iv);
    if (DT == hd && h0 + GT <= u->g && !u->sums) { /* whole heads, side by side (a chunk's are hd + 2 apart) */
        _mm512_storeu_ps(u->out[h0], res);
        return;
    }
    _mm512_storeu_ps(r, res);
    for (int h = 0; h < GT && h0 + h < u->g; h++)
        for (int d = 0; d < DT && d0 + d < hd; d++) u->out[h0 + h][d0 + d] = r[h * DT + d];
}

/* the tile shapes, with and without the exponent pass: TILES[exp][log2 GT] */
typedef void (*TileFn)(const Unit *, float *const *, const float *, float *, int, int);
#define TILE_FN(GT, EXP)                                                                                               \
    static void tile_##GT##_##EXP(const Unit *u, float *const *p, const float *mx, float *inv, int h0, int d0) {       \
        sum_tile(u, p, mx, inv, h0, d0, GT, 16 / GT, EXP);                                                             \
    }
TILE_FN(1, 0)
TILE_FN(2, 0)
TILE_FN(4, 0) TILE_FN(8, 0) TILE_FN(1, 1) TILE_FN(2, 1) TILE_FN(4, 1) TILE_FN(8, 1) static const TileFn TILES[2][4] = {
    {tile_1_0, tile_2_0, tile_4_0, tile_8_0}, {tile_1_1, tile_2_1, tile_4_1, tile_8_1}};

/* softmax and the weighted sums, from the scores in p and their maxima */
static void weighted_sums(const Unit *u, float *const *p, const float *mx) {
    int lg = u->g >= 8 ? 3 : u->g >= 4 ? 2 : u->g >= 2 ? 1 : 0; /* GT = 2^lg heads a tile */
    while (lg < 3 && 16 >> lg > u->a->hd) lg++;                 /* no dimension tile wider than a head */
    int GT = 1 << lg, DT = 16 / GT;
    float inv[MAX_GROUP] = {0};
    if (u->g <= GT && u->a->hd <= DT) { /* one tile: the exponents are taken on the way */
        TILES[1][lg](u, p, mx, inv, 0, 0);
        return;
    }
    for (int h = 0; h < u->g; h++)
        inv[h] = inv_of(u, h, exp_sum(p[h], u->nc + u->n_lone, mx[h])); /* the division comes last */
    for (int h0 = 0; h0 < u->g; h0 += GT)
        for (int d0 = 0; d0 < u->a->hd; d0 += DT) TILES[0][lg](u, p, mx, inv, h0, d0);
}
#endif

#if defined(PD_AVX2)
/* one dimension of a 16-slot chunk (at: its offset in elements) as two vectors, each
   element as elem() computes it, lanes at or past left 0. A chunk never straddles a
   block (the block size is a multiple of 16), so bf16 and int8 read it whole. */
static inline __attribute__((always_inline)) void load16(const void *base, size_t at, __m256 s0, __m256 s1, __m256 m0,
                                                         __m256 m1, int left, __m256 *lo, __m256 *hi, const int T) {
    if (T == KV_F32) {
        const float *x = (const float *)base + at;
        *lo = load8_or(x, left, 0), *hi = load8_or(x + 8, left - 8, 0);
    } else if (T == KV_BF16) {
        const uint16_t *x = (const uint16_t *)base + at;
        __m256i w0 = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)x));
        __m256i w1 = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + 8)));
        *lo = _mm256_and_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w0, 16)), m0);
        *hi = _mm256_and_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w1, 16)), m1);
    } else {
        __m128i b = _mm_loadu_si128((const __m128i *)((const int8_t *)base + at));
        __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)),
               q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
        *lo = _mm256_and_ps(_mm256_mul_ps(s0, q0), m0);
        *hi = _mm256_and_ps(_mm256_mul_ps(s1, q1), m1);
    }
}

/* a chunk's 16 scales (q8_0; zeros otherwise) */
static inline __attribute__((always_inline)) void scales16(const Unit *u, const float *scale, int j, __m256 *s0,
                                                           __m256 *s1, const int T) {
    *s0 = *s1 = _mm256_setzero_ps();
    if (T == KV_Q8_0) {
        const float *S = scale + scale_off(u, j);
        *s0 = _mm256_loadu_ps(S), *s1 = _mm256_loadu_ps(S + 8);
    }
}

/* the same lanes as AVX-512's, a 16-key chunk in two halves; G heads from h0 (G a
   constant once inlined: with a run-time count GCC kept the chains in memory) */
static inline __attribute__((always_inline)) void score_heads(const Unit *u, float *const *p, float *max, int h0,
                                                              const int G, const int T) {
    const AttnArgs *a = u->a;
    const void *kb = T == KV_F32 ? (const void *)a->k : a->kq;
    const char *vbytes = T == KV_F32 ? (const char *)a->v : (const char *)a->vq;
    const int esize = T == KV_F32 ? 4 : T == KV_BF16 ? 2 : 1;
    __m256 sc = _mm256_set1_ps(a->scale), mx[4][2];
    _Pragma("GCC unroll 4") for (int h = 0; h < G; h++) mx[h][0] = mx[h][1] = _mm256_set1_ps(-INFINITY);
    for (int j = 0; j < u->nc; j += 16) {
        size_t K = col_off(u, j);
        int left = u->nc - j;
        __m256 m0 = lanes_below(left), m1 = lanes_below(left - 8), s0, s1, acc[4][2];
        scales16(u, a->k_scale, j, &s0, &s1, T);
        _Pragma("GCC unroll 4") for (int h = 0; h < G; h++) acc[h][0] = acc[h][1] = _mm256_setzero_ps();
        for (int d = 0; d < a->hd; d++) {
            __m256 k0, k1;
            load16(kb, K + (size_t)d * a->block_size, s0, s1, m0, m1, left, &k0, &k1, T);
            /* the values' same line, for the weighted sums: they read each block a few lines
               a pass, too little for the core's prefetchers to follow */
            if ((d * esize) % 4 == 0) _mm_prefetch(vbytes + (K + (size_t)d * a->block_size) * esize, _MM_HINT_T0);
            _Pragma("GCC unroll 4") for (int h = 0; h < G; h++) {
                __m256 q = _mm256_set1_ps(u->q[h0 + h][d]);
                acc[h][0] = _mm256_fmadd_ps(q, k0, acc[h][0]);
                acc[h][1] = _mm256_fmadd_ps(q, k1, acc[h][1]);
            }
        }
        _Pragma("GCC unroll 4") for (int h = 0; h < G; h++) {
            __m256 r0 = _mm256_mul_ps(acc[h][0], sc), r1 = _mm256_mul_ps(acc[h][1], sc);
            store8_n(p[h0 + h] + j, r0, left);
            store8_n(p[h0 + h] + j + 8, r1, left - 8);
            mx[h][0] = _mm256_blendv_ps(mx[h][0], _mm256_max_ps(mx[h][0], r0), m0);
            mx[h][1] = _mm256_blendv_ps(mx[h][1], _mm256_max_ps(mx[h][1], r1), m1);
        }
    }
    _Pragma("GCC unroll 4") for (int h = 0; h < G; h++) max[h0 + h] = hmax2(mx[h][0], mx[h][1]);
}
/* heads four at a time */
static inline __attribute__((always_inline)) void score_avx2_t(const Unit *u, float *const *p, float *max,
                                                               const int T) {
    for (int h0 = 0; h0 < u->g; h0 += 4) {
        int left = u->g - h0;
        if (left >= 4) score_heads(u, p, max, h0, 4, T);
        else if (left == 3) score_heads(u, p, max, h0, 3, T);
        else if (left == 2) score_heads(u, p, max, h0, 2, T);
        else score_heads(u, p, max, h0, 1, T);
    }
}
static void score_avx2(const Unit *u, float *const *p, float *max) {
    switch (u->a->kv_type) {
    case KV_BF16:
        score_avx2_t(u, p, max, KV_BF16);
        break;
    case KV_Q8_0:
        score_avx2_t(u, p, max, KV_Q8_0);
        break;
    default:
        score_avx2_t(u, p, max, KV_F32);
    }
}

/* one 16-key chunk from j into the partials of G heads × D dimensions from h0 and d0:
   each chunk's values read once for all G heads (a head at a time, the values of a
   chunk of 256 keys came from L2 once per head). FULL: all 16 keys there, so that the
   loads are plain and the scores' loads fold into the FMAs */
static inline __attribute__((always_inline)) void sum_chunk(const Unit *u, float *const *p, __m256 acc[4][4][2], int h0,
                                                            int d0, int j, const int FULL, const int G, const int D,
                                                            const int T) {
    const AttnArgs *a = u->a;
    const void *vb = T == KV_F32 ? (const void *)a->v : a->vq;
    int left = FULL ? 16 : u->nc - j;
    __m256 m0 = lanes_below(left), m1 = lanes_below(left - 8), s0, s1;
    scales16(u, a->v_scale, j, &s0, &s1, T);
    size_t V = col_off(u, j) + (size_t)d0 * a->block_size;
    _Pragma("GCC unroll 4") for (int d = 0; d < D; d++) {
        __m256 v0, v1;
        load16(vb, V + (size_t)d * a->block_size, s0, s1, m0, m1, left, &v0, &v1, T);
        _Pragma("GCC unroll 4") for (int h = 0; h < G; h++) {
            const float *ph = p[h0 + h] + j;
            acc[h][d][0] = _mm256_fmadd_ps(FULL ? _mm256_loadu_ps(ph) : load8_or(ph, left, 0), v0, acc[h][d][0]);
            acc[h][d][1] =
                _mm256_fmadd_ps(FULL ? _mm256_loadu_ps(ph + 8) : load8_or(ph + 8, left - 8, 0), v1, acc[h][d][1]);
        }
    }
}
/* G heads from h0 × D dimensions from d0: their 16 partials in registers over the
   committed keys, then the lone keys lane by lane, then the tree, all in registers (G
   and D constants once inlined; a store's lanes read back one by one stalled) */
static inline __attribute__((always_inline)) void sum_dims(const Unit *u, float *const *p, int h0, int d0,
                                                           const float *inv, const int G, const int D, const int T) {
    __m256 acc[4][4][2];
    _Pragma("GCC unroll 4") for (int h = 0; h < G; h++) _Pragma("GCC unroll 4") for (int d = 0; d < D; d++)
        acc[h][d][0] = acc[h][d][1] = _mm256_setzero_ps();
    int j = 0;
    for (; j + 16 <= u->nc; j += 16) sum_chunk(u, p, acc, h0, d0, j, 1, G, D, T);
    if (j < u->nc) sum_chunk(u, p, acc, h0, d0, j, 0, G, D, T);
    for (int x = 0; x < u->n_lone; x++) { /* lane j % 16 alone takes the key (a blend: other lanes keep their bits) */
        int jx = u->nc + x, slot = lone_slot(u, x);
        __m256 lane = _mm256_castsi256_ps(
            _mm256_cmpeq_epi32(_mm256_set1_epi32(jx & 7), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
        _Pragma("GCC unroll 4") for (int d = 0; d < D; d++) {
            __m256 v = _mm256_set1_ps(value_at(u, slot, d0 + d));
            _Pragma("GCC unroll 4") for (int h = 0; h < G; h++) {
                __m256 *half = &acc[h][d][(jx >> 3) & 1];
                __m256 f = _mm256_fmadd_ps(_mm256_set1_ps(p[h0 + h][jx]), v, *half);
                *half = _mm256_blendv_ps(*half, f, lane);
            }
        }
    }
    _Pragma("GCC unroll 4") for (int h = 0; h < G; h++) _Pragma("GCC unroll 4") for (int d = 0; d < D; d++)
        u->out[h0 + h][d0 + d] = hsum2(acc[h][d][0], acc[h][d][1]) * inv[h0 + h];
}
/* G heads from h0 over all dimensions, D at a time (G · D ≤ 6: 12 chains) */
static inline __attribute__((always_inline)) void sum_heads(const Unit *u, float *const *p, int h0, const float *inv,
                                                            const int G, const int D, const int T) {
    int d0 = 0, hd = u->a->hd;
    for (; d0 + D <= hd; d0 += D) sum_dims(u, p, h0, d0, inv, G, D, T);
    for (; d0 < hd; d0++) sum_dims(u, p, h0, d0, inv, G, 1, T);
}
/* the heads up to 4 at a time */
static inline __attribute__((always_inline)) void weighted_sums_avx2_t(const Unit *u, float *const *p, const float *mx,
                                                                       const int T) {
    int nk = u->nc + u->n_lone;
    float inv[MAX_GROUP];
    for (int h = 0; h < u->g; h++) inv[h] = inv_of(u, h, exp_sum(p[h], nk, mx[h]));
    for (int h0 = 0; h0 < u->g; h0 += 4) {
        int left = u->g - h0;
        if (left >= 4) sum_heads(u, p, h0, inv, 4, 1, T);
        else if (left == 3) sum_heads(u, p, h0, inv, 3, 2, T);
        else if (left == 2) sum_heads(u, p, h0, inv, 2, 3, T);
        else sum_heads(u, p, h0, inv, 1, 4, T);
    }
}
static void weighted_sums_avx2(const Unit *u, float *const *p, const float *mx) {
    switch (u->a->kv_type) {
    case KV_BF16:
        weighted_sums_avx2_t(u, p, mx, KV_BF16);
        break;
    case KV_Q8_0:
        weighted_sums_avx2_t(u, p, mx, KV_Q8_0);
        break;
    default:
        weighted_sums_avx2_t(u, p, mx, KV_F32);
    }
}
#endif

/* the spec, one lane at a time: any build, any block size */
static void score_scalar(const Unit *u, float *const *p, float *max) {
    for (int h = 0; h < u->g; h++) {
        float lane[16];
        for (int l = 0; l < 16; l++) lane[l] = -INFINITY;
        for (int j = 0; j < u->nc; j++) {
            p[h][j] = score_one(u, u->q[h], j);
            lane[j % 16] = max1(lane[j % 16], p[h][j]);
        }
        max[h] = tree_max16(lane);
    }
}

static void weighted_sums_scalar(const Unit *u, float *const *p, const float *mx) {
    int nk = u->nc + u->n_lone;
    float inv[MAX_GROUP];
    for (int h = 0; h < u->g; h++) inv[h] = inv_of(u, h, exp_sum(p[h], nk, mx[h]));
    for (int h = 0; h < u->g; h++)
        for (int d = 0; d < u->a->hd; d++) {
            float acc[16] = {0};
            for (int j = 0; j < nk; j++)
                acc[j & 15] = fmaf(p[h][j], value_at(u, j < u->nc ? j : lone_slot(u, j - u->nc), d), acc[j & 15]);
            u->out[h][d] = tree_sum16(acc) * inv[h];
        }
}

typedef struct {
    const AttnArgs *a;
    int rel;      /* extra holds offsets from n_ctx */
    int mc;       /* chunks of the call's longest token: 1 when none is split */
    int t0, nt;   /* the tokens of this pass */
    float *split; /* [nt][n_heads][ml][hd + 2]: each chunk's weighted sums, maximum, sum */
    int ml;
} Job;

/* chunk c of token t's query head h in the pass's room */
static float *chunk_at(const Job *job, int t, int h, int c) {
    return job->split + (((size_t)(t - job->t0) * job->a->n_heads + h) * job->ml + c) * (job->a->hd + 2);
}

static int keys_of(const AttnArgs *a, int t) { return a->n_ctx[t] + a->extra_off[t + 1] - a->extra_off[t]; }

/* a unit is (chunk, kv head, part of its query heads, token), the token varying fastest:
   a tree's or a verified run's tokens see the same committed keys and values, which the
   first token's unit has just brought into the caches */
static void attend(void *ctx, int b, int e) {
    const Job *job = ctx;
    const AttnArgs *a = job->a;
    int qdim = a->n_heads * a->hd, group = a->n_heads / a->n_kv, parts = (group + MAX_GROUP - 1) / MAX_GROUP;
    int maxk = 0;
    for (int t = job->t0; t < job->t0 + job->nt; t++) {
        int nk = keys_of(a, t);
        maxk = nk > maxk ? nk : maxk;
    }
    maxk = maxk < ATT_SPLIT ? maxk : ATT_SPLIT;
    int stride = (maxk + 15) / 16 * 16 + 16;                        /* whole chunks, each head's row 64-byte aligned */
    float raw[MAX_GROUP * stride + 16];                             /* scores [heads][keys]: 4 bytes a key and head */
    float *buf = (float *)(((uintptr_t)raw + 63) & ~(uintptr_t)63); /* no chunk straddles two cache lines */
    int shift = __builtin_ctz((unsigned)a->block_size), fast = a->block_size % 16 == 0;
    if (a->block_size != 1 << shift) shift = -1;
    int fast512 = fast && a->kv_type == KV_F32; /* no AVX-512 path for bf16 / q8_0: the scalar spec */
    (void)fast512;
    for (int i = b; i < e; i++) {
        int t = job->t0 + i % job->nt, r = i / job->nt, part = r % parts, kvh = r / parts % a->n_kv,
            c = r / (parts * a->n_kv);
        int nk = keys_of(a, t), nch = attn_chunks(nk);
        if (c >= nch) continue;
        const int *extra = a->extra + a->extra_off[t];
        int n_extra = nk - a->n_ctx[t], run = 0, rel = job->rel ? a->n_ctx[t] : 0;
        while (run < n_extra && extra[run] + rel == a->n_ctx[t] + run) run++; /* they continue the committed slots */
        int nc = a->n_ctx[t] + run, j0 = c * ATT_SPLIT, j1 = nk - j0 < ATT_SPLIT ? nk : j0 + ATT_SPLIT;
        int lone0 = j0 > nc ? j0 : nc;     /* the chunk's first lone key */
        int cn = (j1 < nc ? j1 : nc) - j0; /* committed keys in the chunk */
        float sums[MAX_GROUP];
        Unit u = {.a = a,
                  .t = t,
                  .kvh = kvh,
                  .shift = shift,
                  .nc = cn > 0 ? cn : 0,
                  .lone = extra + lone0 - a->n_ctx[t],
                  .n_lone = j1 > lone0 ? j1 - lone0 : 0,
                  .lone_base = rel,
                  .slot0 = j0,
                  .sums = nch > 1 ? sums : NULL};
        int h_first = kvh * group + part * MAX_GROUP, h_end = kvh * group + group;
        u.g = h_end - h_first < MAX_GROUP ? h_end - h_first : MAX_GROUP;
        float *p[MAX_GROUP], mx[MAX_GROUP];
        for (int h = 0; h < u.g; h++) {
            u.q[h] = a->q + (size_t)t * a->q_stride + (size_t)(h_first + h) * a->hd;
            u.out[h] =
                nch == 1 ? a->out + (size_t)t * qdim + (size_t)(h_first + h) * a->hd : chunk_at(job, t, h_first + h, c);
            p[h] = buf + (size_t)h * stride;
        }
#if defined(__AVX512F__)
        if (fast512) SCORE[u.g](&u, p, mx);
        else
#elif defined(PD_AVX2)
        if (fast) score_avx2(&u, p, mx);
        else
#endif
            score_scalar(&u, p, mx);
        for (int h = 0; h < u.g; h++)
            for (int x = 0; x < u.n_lone; x++) {
                float s = p[h][u.nc + x] = score_one(&u, u.q[h], lone_slot(&u, x));
                mx[h] = max1(s, mx[h]);
            }
#if defined(__AVX512F__)
        if (fast512) weighted_sums(&u, p, mx);
        else
#elif defined(PD_AVX2)
        if (fast) weighted_sums_avx2(&u, p, mx);
        else
#endif
            weighted_sums_scalar(&u, p, mx);
        for (int h = 0; h < u.g && u.sums; h++) u.out[h][a->hd] = mx[h], u.out[h][a->hd + 1] = sums[h];
    }
    (void)fast;
}

/* a split token's chunks recombined in chunk order (backend.h's spec); a unit is
   (token, query head) */
static void combine(void *ctx, int b, int e) {
    const Job *job = ctx;
    const AttnArgs *a = job->a;
    int hd = a->hd;
    for (int i = b; i < e; i++) {
        int t = job->t0 + i / a->n_heads, h = i % a->n_heads, nch = attn_chunks(keys_of(a, t));
        if (nch == 1) continue;
        const float *part = chunk_at(job, t, h, 0);
        float m = part[hd], sum = 0;
        for (int c = 1; c < nch; c++) m = max1(m, part[(size_t)c * (hd + 2) + hd]);
        float *out = a->out + (size_t)t * a->n_heads * hd + (size_t)h * hd;
        for (int d = 0; d < hd; d++) out[d] = 0;
        for (int c = 0; c < nch; c++) {
            const float *pc = part + (size_t)c * (hd + 2);
            float w = exp1(pc[hd] - m);
            sum = fmaf(pc[hd + 1], w, sum);
            for (int d = 0; d < hd; d++) out[d] = fmaf(pc[d], w, out[d]);
        }
        float inv = 1.0f / sum;
        for (int d = 0; d < hd; d++) out[d] *= inv;
    }
}

static void attention(const AttnArgs *a, int rel) {
    int keys = 0, mc = 1, group = a->n_heads / a->n_kv, parts = (group + MAX_GROUP - 1) / MAX_GROUP;
    for (int t = 0; t < a->n; t++) {
        int nk = keys_of(a, t), c = attn_chunks(nk);
        keys += nk, mc = c > mc ? c : mc;
    }
    Job job = {a, rel, mc, 0, 0, a->split, a->max_chunks};
    int per = a->n; /* tokens a pass: all, unless their chunks need more room than there is */
    float *own = NULL;
    if (mc > 1) {
        per = a->split_tokens;
        if (!a->split || a->max_chunks < mc || per < 1) { /* a caller without room: this call's own */
            per = a->n < ATT_SPLIT_TOKENS ? a->n : ATT_SPLIT_TOKENS;
            own = malloc(sizeof(float) * (size_t)per * a->n_heads * mc * (a->hd + 2));
            if (!own) {
                for (size_t i = 0; i < (size_t)a->n * a->n_heads * a->hd; i++) a->out[i] = NAN;
                return;
            }
            job.split = own, job.ml = mc;
        }
    }
    int min_units = 1 + 4096 / (1 + keys * (group / parts) / ((a->n ? a->n : 1) * mc));
    for (job.t0 = 0; job.t0 < a->n; job.t0 += per) {
        job.nt = a->n - job.t0 < per ? a->n - job.t0 : per;
        pool_run(attend, &job, job.nt * mc * a->n_kv * parts, 1, min_units);
        if (mc > 1) pool_run(combine, &job, job.nt * a->n_heads, 1, 1 + 4096 / (1 + mc * a->hd));
    }
    free(own);
}

void k_attention(const AttnArgs *a) { attention(a, 0); }
void k_attention_rel(const AttnArgs *a) { attention(a, 1); }

/* ---- writing a typed cache ---- */

static uint16_t f32_bf16(float f) {
    uint32_t w;
    memcpy(&w, &f, sizeof w);
    if ((w & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((w >> 16) | 0x40); /* NaN: quiet, sign kept */
    return (uint16_t)((w + 0x7fffu + ((w >> 16) & 1)) >> 16);
}

/* one kv head's hd values (x) into int8 q (stride apart) and its scale, the rule in
   backend.h */
static float q8_head(const float *x, int hd, int8_t *q, size_t stride) {
    float amax = 0;
    for (int i = 0; i < hd; i++) {
        float m = fabsf(x[i]);
        amax = m > amax ? m : amax;
    }
    float d = amax / 127.0f;
    for (int i = 0; i < hd; i++) {
        float r = d != 0 ? nearbyintf(x[i] / d) : 0;
        q[(size_t)i * stride] = (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r == r ? r : 0);
    }
    return d;
}

void k_kv_write_typed(KVType t, void *k, void *v, float *ks, float *vs, size_t block_stride, size_t scale_stride,
                      int block_size, int n_kv, int hd, const int *const *table, const int32_t *slot, const float *src,
                      size_t src_stride, size_t v_off, int n) {
    int kv_dim = n_kv * hd;
    if (t == KV_F32) {
        k_kv_write(k, v, block_stride, block_size, kv_dim, table, slot, src, src_stride, v_off, n);
        return;
    }
    for (int i = 0; i < n; i++) {
        const float *sk = src + (size_t)i * src_stride, *sv = sk + v_off;
        size_t blk = (size_t)table[i][slot[i] / block_size], col = (size_t)(slot[i] % block_size);
        size_t b = blk * block_stride + col;
        if (t == KV_BF16) {
            uint16_t *K = k, *V = v;
            for (int d = 0; d < kv_dim; d++) {
                K[b + (size_t)d * block_size] = f32_bf16(sk[d]);
                V[b + (size_t)d * block_size] = f32_bf16(sv[d]);
            }
            continue;
        }
        int8_t *K = k, *V = v;
        size_t sb = blk * scale_stride + col;
        for (int h = 0; h < n_kv; h++) {
            size_t at = b + (size_t)h * hd * block_size;
            ks[sb + (size_t)h * block_size] = q8_head(sk + (size_t)h * hd, hd, K + at, (size_t)block_size);
            vs[sb + (size_t)h * block_size] = q8_head(sv + (size_t)h * hd, hd, V + at, (size_t)block_size);
        }
    }
}
