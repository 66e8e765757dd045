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
   never depends on the batch. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "backend.h"
#include "exp.h"
#include "pool.h"

#define MAX_GROUP 8 /* query heads a unit scores together (larger groups go in parts) */

typedef struct {
    const AttnArgs *a;
    int t, kvh;
    int g;           /* query heads in this unit */
    int shift;       /* log2 of the block size when it is a power of two, else -1 */
    int nc;          /* keys read from the blocks: 0 .. nc-1 */
    const int *lone; /* slots of keys nc, nc+1, ... (less lone_base) */
    int n_lone, lone_base;
    const float *q[MAX_GROUP]; /* [hd] each */
    float *out[MAX_GROUP];     /* [hd] each */
} Unit;

/* this unit's kv head in slot's block of a layer array (keys or values): [hd][block_size],
   from the slot's column */
static inline const float *column(const Unit *u, const float *base, int slot) {
    const AttnArgs *a = u->a;
    int blk = u->shift >= 0 ? slot >> u->shift : slot / a->block_size; /* no division per chunk */
    return base + (size_t)a->table[u->t][blk] * a->block_stride + (size_t)u->kvh * a->hd * a->block_size +
           (slot - blk * a->block_size);
}

static inline int lone_slot(const Unit *u, int x) { return u->lone_base + u->lone[x]; }

static float score_one(const Unit *u, const float *q, int slot) {
    const float *K = column(u, u->a->k, slot);
    float s = 0;
    for (int d = 0; d < u->a->hd; d++) s = fmaf(q[d], K[(size_t)d * u->a->block_size], s);
    return s * u->a->scale;
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
SCORE_G(2) SCORE_G(3) SCORE_G(4) SCORE_G(5) SCORE_G(6) SCORE_G(7)
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
        for (int h = 0; h < GT && h0 + h < u->g; h++) inv[h0 + h] = 1.0f / _mm512_reduce_add_ps(sum[h]);
    _Alignas(64) float r[16];
    __m512 iv = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int h = 0; h < GT; h++)
        iv = _mm512_mask_mov_ps(iv, (__mmask16)(((1u << DT) - 1) << (h * DT)), _mm512_set1_ps(inv[hc[h]]));
    __m512 res = _mm512_mul_ps(tree16(acc), iv);
    if (DT == hd && h0 + GT <= u->g) { /* whole heads, side by side in out */
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
TILE_FN(2, 0) TILE_FN(4, 0) TILE_FN(8, 0) TILE_FN(1, 1) TILE_FN(2, 1) TILE_FN(4, 1)
    TILE_FN(8, 1) static const TileFn TILES[2][4] = {{tile_1_0, tile_2_0, tile_4_0, tile_8_0},
                                                     {tile_1_1, tile_2_1, tile_4_1, tile_8_1}};

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
        inv[h] = 1.0f / exp_sum(p[h], u->nc + u->n_lone, mx[h]); /* the division comes last */
    for (int h0 = 0; h0 < u->g; h0 += GT)
        for (int d0 = 0; d0 < u->a->hd; d0 += DT) TILES[0][lg](u, p, mx, inv, h0, d0);
}
#endif

#if defined(PD_AVX2)
/* the same lanes as AVX-512's, a 16-key chunk in two halves; heads four at a time */
static void score_avx2(const Unit *u, float *const *p, float *max) {
    const AttnArgs *a = u->a;
    __m256 sc = _mm256_set1_ps(a->scale);
    for (int h0 = 0; h0 < u->g; h0 += 4) {
        int G = u->g - h0 < 4 ? u->g - h0 : 4;
        __m256 mx[4][2];
        for (int h = 0; h < 4; h++) mx[h][0] = mx[h][1] = _mm256_set1_ps(-INFINITY);
        for (int j = 0; j < u->nc; j += 16) {
            const float *K = column(u, a->k, j);
            int left = u->nc - j;
            __m256 acc[4][2];
            for (int h = 0; h < 4; h++) acc[h][0] = acc[h][1] = _mm256_setzero_ps();
            for (int d = 0; d < a->hd; d++) {
                const float *Kd = K + (size_t)d * a->block_size;
                __m256 k0 = load8_or(Kd, left, 0), k1 = load8_or(Kd + 8, left - 8, 0);
#pragma GCC unroll 4
                for (int h = 0; h < 4; h++) {
                    if (h >= G) break;
                    __m256 q = _mm256_set1_ps(u->q[h0 + h][d]);
                    acc[h][0] = _mm256_fmadd_ps(q, k0, acc[h][0]);
                    acc[h][1] = _mm256_fmadd_ps(q, k1, acc[h][1]);
                }
            }
            __m256 m0 = lanes_below(left), m1 = lanes_below(left - 8);
            for (int h = 0; h < G; h++) {
                __m256 s0 = _mm256_mul_ps(acc[h][0], sc), s1 = _mm256_mul_ps(acc[h][1], sc);
                store8_n(p[h0 + h] + j, s0, left);
                store8_n(p[h0 + h] + j + 8, s1, left - 8);
                mx[h][0] = _mm256_blendv_ps(mx[h][0], _mm256_max_ps(mx[h][0], s0), m0);
                mx[h][1] = _mm256_blendv_ps(mx[h][1], _mm256_max_ps(mx[h][1], s1), m1);
            }
        }
        for (int h = 0; h < G; h++) max[h0 + h] = hmax2(mx[h][0], mx[h][1]);
    }
}

/* four dimensions of a head at a time: their 16 partials in registers over the
   committed keys, then the lone keys lane by lane and the tree */
static void weighted_sums_avx2(const Unit *u, float *const *p, const float *mx) {
    const AttnArgs *a = u->a;
    int nk = u->nc + u->n_lone, bs = a->block_size;
    for (int h = 0; h < u->g; h++) {
        float inv = 1.0f / exp_sum(p[h], nk, mx[h]);
        for (int d0 = 0; d0 < a->hd; d0 += 4) {
            int D = a->hd - d0 < 4 ? a->hd - d0 : 4;
            __m256 acc[4][2];
            for (int d = 0; d < 4; d++) acc[d][0] = acc[d][1] = _mm256_setzero_ps();
            for (int j = 0; j < u->nc; j += 16) {
                int left = u->nc - j;
                __m256 p0 = load8_or(p[h] + j, left, 0), p1 = load8_or(p[h] + j + 8, left - 8, 0);
                const float *V = column(u, a->v, j) + (size_t)d0 * bs;
#pragma GCC unroll 4
                for (int d = 0; d < 4; d++) {
                    if (d >= D) break;
                    acc[d][0] = _mm256_fmadd_ps(p0, load8_or(V + (size_t)d * bs, left, 0), acc[d][0]);
                    acc[d][1] = _mm256_fmadd_ps(p1, load8_or(V + (size_t)d * bs + 8, left - 8, 0), acc[d][1]);
                }
            }
            for (int d = 0; d < D; d++) {
                float s[16];
                _mm256_storeu_ps(s, acc[d][0]);
                _mm256_storeu_ps(s + 8, acc[d][1]);
                for (int x = 0; x < u->n_lone; x++) {
                    int j = u->nc + x;
                    s[j & 15] = fmaf(p[h][j], column(u, a->v, lone_slot(u, x))[(size_t)(d0 + d) * bs], s[j & 15]);
                }
                u->out[h][d0 + d] = tree_sum16(s) * inv;
            }
        }
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
    int nk = u->nc + u->n_lone, bs = u->a->block_size;
    float inv[MAX_GROUP];
    for (int h = 0; h < u->g; h++) inv[h] = 1.0f / exp_sum(p[h], nk, mx[h]);
    for (int h = 0; h < u->g; h++)
        for (int d = 0; d < u->a->hd; d++) {
            float acc[16] = {0};
            for (int j = 0; j < nk; j++) {
                const float *V = column(u, u->a->v, j < u->nc ? j : lone_slot(u, j - u->nc));
                acc[j & 15] = fmaf(p[h][j], V[(size_t)d * bs], acc[j & 15]);
            }
            u->out[h][d] = tree_sum16(acc) * inv[h];
        }
}

typedef struct {
    const AttnArgs *a;
    int rel; /* extra holds offsets from n_ctx */
} Job;

static void attend(void *ctx, int b, int e) {
    const Job *job = ctx;
    const AttnArgs *a = job->a;
    int qdim = a->n_heads * a->hd, group = a->n_heads / a->n_kv, parts = (group + MAX_GROUP - 1) / MAX_GROUP;
    int maxk = 0;
    for (int t = b / (a->n_kv * parts); t <= (e - 1) / (a->n_kv * parts); t++) {
        int nk = a->n_ctx[t] + a->extra_off[t + 1] - a->extra_off[t];
        maxk = nk > maxk ? nk : maxk;
    }
    int stride = (maxk + 15) / 16 * 16 + 16;                        /* whole chunks, each head's row 64-byte aligned */
    float raw[MAX_GROUP * stride + 16];                             /* scores [heads][keys]: 4 bytes a key and head */
    float *buf = (float *)(((uintptr_t)raw + 63) & ~(uintptr_t)63); /* no chunk straddles two cache lines */
    int shift = __builtin_ctz((unsigned)a->block_size), fast = a->block_size % 16 == 0;
    if (a->block_size != 1 << shift) shift = -1;
    for (int i = b; i < e; i++) {
        int t = i / (a->n_kv * parts), kvh = i / parts % a->n_kv, part = i % parts;
        const int *extra = a->extra + a->extra_off[t];
        int n_extra = a->extra_off[t + 1] - a->extra_off[t], run = 0, rel = job->rel ? a->n_ctx[t] : 0;
        while (run < n_extra && extra[run] + rel == a->n_ctx[t] + run) run++; /* they continue the committed slots */
        Unit u = {a, t, kvh, 0, shift, a->n_ctx[t] + run, extra + run, n_extra - run, rel, {0}, {0}};
        int h_first = kvh * group + part * MAX_GROUP, h_end = kvh * group + group;
        u.g = h_end - h_first < MAX_GROUP ? h_end - h_first : MAX_GROUP;
        float *p[MAX_GROUP], mx[MAX_GROUP];
        for (int h = 0; h < u.g; h++) {
            u.q[h] = a->q + (size_t)t * a->q_stride + (size_t)(h_first + h) * a->hd;
            u.out[h] = a->out + (size_t)t * qdim + (size_t)(h_first + h) * a->hd;
            p[h] = buf + (size_t)h * stride;
        }
#if defined(__AVX512F__)
        if (fast) SCORE[u.g](&u, p, mx);
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
        if (fast) weighted_sums(&u, p, mx);
        else
#elif defined(PD_AVX2)
        if (fast) weighted_sums_avx2(&u, p, mx);
        else
#endif
            weighted_sums_scalar(&u, p, mx);
    }
    (void)fast;
}

static void attention(const AttnArgs *a, int rel) {
    Job job = {a, rel};
    int keys = 0, group = a->n_heads / a->n_kv, parts = (group + MAX_GROUP - 1) / MAX_GROUP;
    for (int t = 0; t < a->n; t++) keys += a->n_ctx[t] + a->extra_off[t + 1] - a->extra_off[t];
    int units = a->n * a->n_kv * parts;
    int min_units = 1 + 4096 / (1 + keys * (group / parts) / (a->n ? a->n : 1));
    pool_run(attend, &job, units, 1, min_units);
}

void k_attention(const AttnArgs *a) { attention(a, 0); }
void k_attention_rel(const AttnArgs *a) { attention(a, 1); }
