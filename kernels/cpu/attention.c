/* attention.c — each (token, head) pair is one unit of work: scores over the visible
   keys in the order given, softmax, weighted sum of values. One pair never depends
   on another, so threads split the pairs and tokens stay batch-invariant. */
#include "backend.h"
#include "dot.h"
#include "pool.h"

static void attend(void *ctx, int b, int e) {
    const AttnArgs *a = ctx;
    int qdim = a->n_heads * a->hd, group = a->n_heads / a->n_kv;
    int maxk = 0;
    for (int t = b / a->n_heads; t <= (e - 1) / a->n_heads; t++) {
        int nk = a->key_off[t + 1] - a->key_off[t];
        maxk = nk > maxk ? nk : maxk;
    }
    float p[maxk ? maxk : 1]; /* scores [n_keys]: 4 bytes a key, well inside a thread's stack */
    for (int u = b; u < e; u++) {
        int t = u / a->n_heads, h = u % a->n_heads, kvh = h / group;
        const float *q = a->q + (size_t)t * qdim + (size_t)h * a->hd;
        float *out = a->out + (size_t)t * qdim + (size_t)h * a->hd;
        const float *const *K = a->k + a->key_off[t], *const *V = a->v + a->key_off[t];
        int nk = a->key_off[t + 1] - a->key_off[t];
        for (int j = 0; j < nk; j++) p[j] = dot_f32(q, K[j] + (size_t)kvh * a->hd, a->hd) * a->scale;
        k_softmax(p, nk);
        for (int d = 0; d < a->hd; d++) out[d] = 0;
        for (int j = 0; j < nk; j++) {
            const float *v = V[j] + (size_t)kvh * a->hd;
            for (int d = 0; d < a->hd; d++) out[d] += p[j] * v[d];
        }
    }
}

void k_attention(const AttnArgs *a) {
    int keys = a->key_off[a->n] - a->key_off[0];
    int min_units = 1 + 4096 / (1 + keys / (a->n ? a->n : 1));
    pool_run(attend, (void *)a, a->n * a->n_heads, 1, min_units);
}
