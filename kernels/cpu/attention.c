/* attention.c — each (token, head) pair is one unit of work: scores over the visible
   keys, softmax, weighted sum of values. One pair never depends on another, so
   threads split the pairs and tokens stay batch-invariant. Keys are transposed within
   a block, so a block's scores come 16 at a time from hd vector FMAs; a lone slot
   (a batch ancestor) takes the same FMA chain one lane at a time. */
#include <math.h>

#include "backend.h"
#include "dot.h"
#include "pool.h"

typedef struct {
    const AttnArgs *a;
    int t, kvh;
    const float *q;
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

static float score_one(const Unit *u, int slot) {
    const float *K = key_block(u, slot) + slot % u->a->block_size;
    float s = 0;
    for (int d = 0; d < u->a->hd; d++) s = fmaf(u->q[d], K[(size_t)d * u->a->block_size], s);
    return s * u->a->scale;
}

/* p[0..n_ctx) for the committed slots */
static void score_context(const Unit *u, float *p, int n_ctx) {
    int j = 0;
#ifdef __AVX512F__
    const AttnArgs *a = u->a;
    if (a->block_size % 16 == 0) {
        __m512 sc = _mm512_set1_ps(a->scale);
        /* four chunks of 16 keys at once: independent FMA chains hide the latency */
        for (; j + 64 <= n_ctx; j += 64) {
            const float *K[4];
            __m512 acc[4];
            for (int c = 0; c < 4; c++) {
                K[c] = key_block(u, j + 16 * c) + (j + 16 * c) % a->block_size;
                acc[c] = _mm512_setzero_ps();
            }
            for (int d = 0; d < a->hd; d++) {
                __m512 qd = _mm512_set1_ps(u->q[d]);
                for (int c = 0; c < 4; c++)
                    acc[c] = _mm512_fmadd_ps(qd, _mm512_loadu_ps(K[c] + (size_t)d * a->block_size), acc[c]);
            }
            for (int c = 0; c < 4; c++) _mm512_storeu_ps(p + j + 16 * c, _mm512_mul_ps(acc[c], sc));
        }
        for (; j < n_ctx; j += 16) {
            int left = n_ctx - j;
            __mmask16 m = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
            const float *K = key_block(u, j) + j % a->block_size;
            __m512 acc = _mm512_setzero_ps();
            for (int d = 0; d < a->hd; d++)
                acc = _mm512_fmadd_ps(_mm512_set1_ps(u->q[d]), _mm512_maskz_loadu_ps(m, K + (size_t)d * a->block_size), acc);
            _mm512_mask_storeu_ps(p + j, m, _mm512_mul_ps(acc, sc));
        }
    }
#endif
    for (; j < n_ctx; j++) p[j] = score_one(u, j);
}

#ifdef __AVX512F__
/* key j's term goes to accumulator j mod 4 */
static inline void add_key(__m512 *a0, __m512 *a1, __m512 *a2, __m512 *a3, int j, float p, __m512 v) {
    __m512 pv = _mm512_set1_ps(p);
    switch (j & 3) {
    case 0: *a0 = _mm512_fmadd_ps(pv, v, *a0); break;
    case 1: *a1 = _mm512_fmadd_ps(pv, v, *a1); break;
    case 2: *a2 = _mm512_fmadd_ps(pv, v, *a2); break;
    default: *a3 = _mm512_fmadd_ps(pv, v, *a3); break;
    }
}

/* out[hd] = Σ_j p[j] v_j, four partial sums by j mod 4; committed slots block by block */
static void weighted_sum(const Unit *u, float *out, const float *p, int n_ctx, const int *extra, int n_extra,
                         float scale) {
    const AttnArgs *a = u->a;
    int hd = a->hd, bs = a->block_size, row = a->n_kv * a->hd;
    for (int d = 0; d < hd; d += 16) {
        int left = hd - d;
        __mmask16 m = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int j = 0;
        for (int b0 = 0; b0 < n_ctx; b0 += bs) {
            const float *V = value_row(u, b0) + d;
            int end = b0 + bs < n_ctx ? b0 + bs : n_ctx;
            if (bs % 4 == 0)
                for (; j + 4 <= end; j += 4, V += 4 * row) {
                    a0 = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), _mm512_maskz_loadu_ps(m, V), a0);
                    a1 = _mm512_fmadd_ps(_mm512_set1_ps(p[j + 1]), _mm512_maskz_loadu_ps(m, V + row), a1);
                    a2 = _mm512_fmadd_ps(_mm512_set1_ps(p[j + 2]), _mm512_maskz_loadu_ps(m, V + 2 * row), a2);
                    a3 = _mm512_fmadd_ps(_mm512_set1_ps(p[j + 3]), _mm512_maskz_loadu_ps(m, V + 3 * row), a3);
                }
            for (; j < end; j++, V += row) add_key(&a0, &a1, &a2, &a3, j, p[j], _mm512_maskz_loadu_ps(m, V));
        }
        for (int x = 0; x < n_extra; x++, j++)
            add_key(&a0, &a1, &a2, &a3, j, p[j], _mm512_maskz_loadu_ps(m, value_row(u, extra[x]) + d));
        _mm512_mask_storeu_ps(out + d, m, _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                                        _mm512_set1_ps(scale)));
    }
}
#else
static void weighted_sum(const Unit *u, float *out, const float *p, int n_ctx, const int *extra, int n_extra,
                         float scale) {
    int nk = n_ctx + n_extra;
    for (int d = 0; d < u->a->hd; d++) {
        float acc[4] = {0, 0, 0, 0};
        for (int j = 0; j < nk; j++)
            acc[j & 3] = fmaf(p[j], value_row(u, j < n_ctx ? j : extra[j - n_ctx])[d], acc[j & 3]);
        out[d] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) * scale;
    }
}
#endif

static void attend(void *ctx, int b, int e) {
    const AttnArgs *a = ctx;
    int qdim = a->n_heads * a->hd, group = a->n_heads / a->n_kv, maxk = 0;
    for (int t = b / a->n_heads; t <= (e - 1) / a->n_heads; t++) {
        int nk = a->n_ctx[t] + a->extra_off[t + 1] - a->extra_off[t];
        maxk = nk > maxk ? nk : maxk;
    }
    float p[maxk + 64]; /* scores [n_keys] (+ room for a whole last chunk): 4 bytes a key */
    for (int i = b; i < e; i++) {
        int t = i / a->n_heads, h = i % a->n_heads;
        Unit u = {a, t, h / group, a->q + (size_t)t * qdim + (size_t)h * a->hd};
        const int *extra = a->extra + a->extra_off[t];
        int n_ctx = a->n_ctx[t], n_extra = a->extra_off[t + 1] - a->extra_off[t];
        score_context(&u, p, n_ctx);
        for (int x = 0; x < n_extra; x++) p[n_ctx + x] = score_one(&u, extra[x]);
        float mx, inv = 1.0f / k_exp_sum(p, n_ctx + n_extra, &mx); /* softmax's division comes last */
        weighted_sum(&u, a->out + (size_t)t * qdim + (size_t)h * a->hd, p, n_ctx, extra, n_extra, inv);
    }
}

void k_attention(const AttnArgs *a) {
    int keys = 0;
    for (int t = 0; t < a->n; t++) keys += a->n_ctx[t] + a->extra_off[t + 1] - a->extra_off[t];
    int min_units = 1 + 4096 / (1 + keys / (a->n ? a->n : 1));
    pool_run(attend, (void *)a, a->n * a->n_heads, 1, min_units);
}
