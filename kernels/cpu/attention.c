/* attention.c — each (token, head) pair is one unit of work: scores over the visible
   keys in the order given, softmax, weighted sum of values. One pair never depends
   on another, so threads split the pairs and tokens stay batch-invariant.
   The order of every sum depends only on the head size and the number of keys,
   never on the batch: scores use dot.h's order (or sequential FMAs for heads under
   16 dims), the weighted sum keeps four partial sums by key index mod 4. */
#include <math.h>

#include "backend.h"
#include "dot.h"
#include "pool.h"

static float score(const float *q, const float *k, int hd) {
    if (hd >= 16) return dot_f32(q, k, hd);
    float s = 0;
    for (int d = 0; d < hd; d++) s = fmaf(q[d], k[d], s);
    return s;
}

#ifdef __AVX512F__
/* out[hd] = Σ_j p[j] v_j, four partial sums by j mod 4 */
static void weighted_sum(float *out, const float *p, const float *const *V, int off, int nk, int hd) {
    for (int d = 0; d < hd; d += 16) {
        int left = hd - d;
        __mmask16 m = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
        __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        int j = 0;
        for (; j + 4 <= nk; j += 4)
            for (int u = 0; u < 4; u++)
                a[u] = _mm512_fmadd_ps(_mm512_set1_ps(p[j + u]), _mm512_maskz_loadu_ps(m, V[j + u] + off + d), a[u]);
        for (int u = 0; j < nk; j++, u++)
            a[u] = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), _mm512_maskz_loadu_ps(m, V[j] + off + d), a[u]);
        _mm512_mask_storeu_ps(out + d, m, _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
    }
}
#else
static void weighted_sum(float *out, const float *p, const float *const *V, int off, int nk, int hd) {
    for (int d = 0; d < hd; d++) {
        float a[4] = {0, 0, 0, 0};
        for (int j = 0; j < nk; j++) a[j % 4] = fmaf(p[j], V[j][off + d], a[j % 4]);
        out[d] = (a[0] + a[1]) + (a[2] + a[3]);
    }
}
#endif

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
        int t = u / a->n_heads, h = u % a->n_heads, off = (h / group) * a->hd;
        const float *q = a->q + (size_t)t * qdim + (size_t)h * a->hd;
        const float *const *K = a->k + a->key_off[t], *const *V = a->v + a->key_off[t];
        int nk = a->key_off[t + 1] - a->key_off[t];
        for (int j = 0; j < nk; j++) p[j] = score(q, K[j] + off, a->hd) * a->scale;
        k_softmax(p, nk);
        weighted_sum(a->out + (size_t)t * qdim + (size_t)h * a->hd, p, V, off, nk, a->hd);
    }
}

void k_attention(const AttnArgs *a) {
    int keys = a->key_off[a->n] - a->key_off[0];
    int min_units = 1 + 4096 / (1 + keys / (a->n ? a->n : 1));
    pool_run(attend, (void *)a, a->n * a->n_heads, 1, min_units);
}
