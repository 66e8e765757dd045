/* attention.c — one unit of work is a token and a kv head with the query heads that
   share it (GQA): the keys and values are read once for all of them. Units never
   depend on each other, so threads split them and tokens stay batch-invariant.
   Keys are transposed within a block, so a block's scores come 16 at a time from hd
   vector FMAs; a lone slot (a batch ancestor) takes the same FMA chain one lane at a
   time. For each (query head, key) the score is that sequential chain, and for each
   (query head, dimension) the weighted sum keeps four partials by key index mod 4,
   whichever path computes it. */
#include <immintrin.h>
#include <math.h>

#include "backend.h"
#include "pool.h"

#define MAX_GROUP 8 /* query heads a unit scores together (larger groups go in parts) */

typedef struct {
    const AttnArgs *a;
    int t, kvh;
    int g;                     /* query heads in this unit */
    const float *q[MAX_GROUP]; /* [hd] each */
    float *out[MAX_GROUP];     /* [hd] each */
} Unit;

/* the K of slot's block for this unit's kv head: [hd][block_size] */
static const float *key_block(const Unit *u, int slot) {
    const AttnArgs *a = u->a;
    return a->k + (size_t)a->table[u->t][slot / a->block_size] * a->block_stride +
           (size_t)u->kvh * a->hd * a->block_size;
}

static const float *value_row(const Unit *u, int slot) {
    const AttnArgs *a = u->a;
    return a->v + (size_t)a->table[u->t][slot / a->block_size] * a->block_stride +
           ((size_t)(slot % a->block_size) * a->n_kv + u->kvh) * a->hd;
}

static float score_one(const Unit *u, const float *q, int slot) {
    const float *K = key_block(u, slot) + slot % u->a->block_size;
    float s = 0;
    for (int d = 0; d < u->a->hd; d++) s = fmaf(q[d], K[(size_t)d * u->a->block_size], s);
    return s * u->a->scale;
}

#ifdef __AVX512F__
/* G heads × C chunks of 16 keys from j: G*C independent chains. Inlined with constant
   G and C, so the chains live in registers. */
static inline __attribute__((always_inline)) void score_chunks(const Unit *u, float *const *p, int j, int n_ctx,
                                                               const int G, const int C) {
    const AttnArgs *a = u->a;
    const float *K[4];
    __mmask16 m[4];
    __m512 acc[MAX_GROUP][4];
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        int left = n_ctx - j - 16 * c;
        m[c] = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
        K[c] = key_block(u, j + 16 * c) + (j + 16 * c) % a->block_size;
#pragma GCC unroll 8
        for (int h = 0; h < G; h++) acc[h][c] = _mm512_setzero_ps();
    }
    for (int d = 0; d < a->hd; d++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            __m512 kd = _mm512_maskz_loadu_ps(m[c], K[c] + (size_t)d * a->block_size);
#pragma GCC unroll 8
            for (int h = 0; h < G; h++) acc[h][c] = _mm512_fmadd_ps(_mm512_set1_ps(u->q[h][d]), kd, acc[h][c]);
        }
    __m512 sc = _mm512_set1_ps(a->scale);
#pragma GCC unroll 8
    for (int h = 0; h < G; h++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) _mm512_mask_storeu_ps(p[h] + j + 16 * c, m[c], _mm512_mul_ps(acc[h][c], sc));
}

/* enough chains in flight: 4 chunks for one head, 2 for two, 1 for more */
#define SCORE_G(G)                                                                          \
    static void score_g##G(const Unit *u, float *const *p, int n_ctx) {                     \
        const int C = G >= 4 ? 1 : 4 / G;                                                   \
        int j = 0;                                                                          \
        for (; j + 16 * C <= n_ctx; j += 16 * C) score_chunks(u, p, j, n_ctx, G, C);        \
        for (; j < n_ctx; j += 16) score_chunks(u, p, j, n_ctx, G, 1);                      \
    }
SCORE_G(1) SCORE_G(2) SCORE_G(3) SCORE_G(4) SCORE_G(5) SCORE_G(6) SCORE_G(7) SCORE_G(8)
static void (*const SCORE[MAX_GROUP + 1])(const Unit *, float *const *, int) = {
    0, score_g1, score_g2, score_g3, score_g4, score_g5, score_g6, score_g7, score_g8};

/* out_h[d..d+16) += Σ_j p_h[j] v_j, four partials by j mod 4, for G ≤ 4 heads */
static inline __attribute__((always_inline)) void sum_chunk(const Unit *u, const float *const *p, int d, int n_ctx,
                                                            const int *extra, int n_extra, const float *inv,
                                                            int h0, const int G) {
    const AttnArgs *a = u->a;
    int bs = a->block_size, row = a->n_kv * a->hd, left = a->hd - d;
    __mmask16 m = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int h = 0; h < G; h++)
        for (int r = 0; r < 4; r++) acc[h][r] = _mm512_setzero_ps();
    int j = 0;
    for (int b0 = 0; b0 < n_ctx; b0 += bs) {
        const float *V = value_row(u, b0) + d;
        int end = b0 + bs < n_ctx ? b0 + bs : n_ctx;
        for (; j + 4 <= end && bs % 4 == 0; j += 4, V += 4 * row)
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                __m512 v = _mm512_maskz_loadu_ps(m, V + r * row);
#pragma GCC unroll 4
                for (int h = 0; h < G; h++)
                    acc[h][r] = _mm512_fmadd_ps(_mm512_set1_ps(p[h0 + h][j + r]), v, acc[h][r]);
            }
        for (; j < end; j++, V += row) {
            __m512 v = _mm512_maskz_loadu_ps(m, V);
#pragma GCC unroll 4
            for (int h = 0; h < G; h++)
                acc[h][j & 3] = _mm512_fmadd_ps(_mm512_set1_ps(p[h0 + h][j]), v, acc[h][j & 3]);
        }
    }
    for (int x = 0; x < n_extra; x++, j++) {
        __m512 v = _mm512_maskz_loadu_ps(m, value_row(u, extra[x]) + d);
#pragma GCC unroll 4
        for (int h = 0; h < G; h++) acc[h][j & 3] = _mm512_fmadd_ps(_mm512_set1_ps(p[h0 + h][j]), v, acc[h][j & 3]);
    }
#pragma GCC unroll 4
    for (int h = 0; h < G; h++)
        _mm512_mask_storeu_ps(u->out[h0 + h] + d, m,
                              _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(acc[h][0], acc[h][1]), _mm512_add_ps(acc[h][2], acc[h][3])),
                                            _mm512_set1_ps(inv[h0 + h])));
}

static void weighted_sums(const Unit *u, const float *const *p, int n_ctx, const int *extra, int n_extra,
                          const float *inv) {
    for (int d = 0; d < u->a->hd; d += 16)
        for (int h0 = 0; h0 < u->g; h0 += 4) {
            int g = u->g - h0 < 4 ? u->g - h0 : 4;
            switch (g) {
            case 4: sum_chunk(u, p, d, n_ctx, extra, n_extra, inv, h0, 4); break;
            case 3: sum_chunk(u, p, d, n_ctx, extra, n_extra, inv, h0, 3); break;
            case 2: sum_chunk(u, p, d, n_ctx, extra, n_extra, inv, h0, 2); break;
            default: sum_chunk(u, p, d, n_ctx, extra, n_extra, inv, h0, 1); break;
            }
        }
}
#else
static void score_scalar(const Unit *u, float *const *p, int n_ctx) {
    for (int h = 0; h < u->g; h++)
        for (int j = 0; j < n_ctx; j++) p[h][j] = score_one(u, u->q[h], j);
}
static void (*const SCORE[MAX_GROUP + 1])(const Unit *, float *const *, int) = {
    0, score_scalar, score_scalar, score_scalar, score_scalar, score_scalar, score_scalar, score_scalar, score_scalar};

static void weighted_sums(const Unit *u, const float *const *p, int n_ctx, const int *extra, int n_extra,
                          const float *inv) {
    int nk = n_ctx + n_extra;
    for (int h = 0; h < u->g; h++)
        for (int d = 0; d < u->a->hd; d++) {
            float acc[4] = {0, 0, 0, 0};
            for (int j = 0; j < nk; j++)
                acc[j & 3] = fmaf(p[h][j], value_row(u, j < n_ctx ? j : extra[j - n_ctx])[d], acc[j & 3]);
            u->out[h][d] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) * inv[h];
        }
}
#endif

static void attend(void *ctx, int b, int e) {
    const AttnArgs *a = ctx;
    int qdim = a->n_heads * a->hd, group = a->n_heads / a->n_kv, parts = (group + MAX_GROUP - 1) / MAX_GROUP;
    int maxk = 0;
    for (int t = b / (a->n_kv * parts); t <= (e - 1) / (a->n_kv * parts); t++) {
        int nk = a->n_ctx[t] + a->extra_off[t + 1] - a->extra_off[t];
        maxk = nk > maxk ? nk : maxk;
    }
    int stride = maxk + 64; /* a whole last chunk may be stored */
    float buf[MAX_GROUP * stride]; /* scores [heads][keys]: 4 bytes a key and head */
    for (int i = b; i < e; i++) {
        int t = i / (a->n_kv * parts), kvh = i / parts % a->n_kv, part = i % parts;
        Unit u = {a, t, kvh, 0, {0}, {0}};
        int h_first = kvh * group + part * MAX_GROUP, h_end = kvh * group + group;
        u.g = h_end - h_first < MAX_GROUP ? h_end - h_first : MAX_GROUP;
        float *p[MAX_GROUP], inv[MAX_GROUP];
        for (int h = 0; h < u.g; h++) {
            u.q[h] = a->q + (size_t)t * qdim + (size_t)(h_first + h) * a->hd;
            u.out[h] = a->out + (size_t)t * qdim + (size_t)(h_first + h) * a->hd;
            p[h] = buf + (size_t)h * stride;
        }
        const int *extra = a->extra + a->extra_off[t];
        int n_ctx = a->n_ctx[t], n_extra = a->extra_off[t + 1] - a->extra_off[t];
        if (a->block_size % 16 == 0) SCORE[u.g](&u, p, n_ctx);
        else
            for (int h = 0; h < u.g; h++)
                for (int j = 0; j < n_ctx; j++) p[h][j] = score_one(&u, u.q[h], j);
        for (int h = 0; h < u.g; h++) {
            for (int x = 0; x < n_extra; x++) p[h][n_ctx + x] = score_one(&u, u.q[h], extra[x]);
            float mx;
            inv[h] = 1.0f / k_exp_sum(p[h], n_ctx + n_extra, &mx); /* softmax's division comes last */
        }
        weighted_sums(&u, (const float *const *)p, n_ctx, extra, n_extra, inv);
    }
}

void k_attention(const AttnArgs *a) {
    int keys = 0, group = a->n_heads / a->n_kv, parts = (group + MAX_GROUP - 1) / MAX_GROUP;
    for (int t = 0; t < a->n; t++) keys += a->n_ctx[t] + a->extra_off[t + 1] - a->extra_off[t];
    int units = a->n * a->n_kv * parts;
    int min_units = 1 + 4096 / (1 + keys * (group / parts) / (a->n ? a->n : 1));
    pool_run(attend, (void *)a, units, 1, min_units);
}
