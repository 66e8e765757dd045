/* accept.c — see accept.h. */
#include "decode/accept.h"

#include <string.h>

int accept_child(const int32_t *parent, const int32_t *token, int n, int node, int tok) {
    for (int c = node + 1; c < n; c++)
        if (parent[c] == node && (tok < 0 || token[c] == tok)) return c;
    return -1;
}

int accept_draft(Sampler *s, const float *res, float total, const float *q, int tok) {
    return sampler_uniform(s) * (q ? q[tok] : 1) < res[tok] / total; /* u < p/q */
}

void accept_residual(float *res, float *total, const float *q, int tok, const float *p, int V) {
    float sum = 0, t = *total;
    for (int i = 0; i < V; i++) {
        float v = res[i] / t - (q ? q[i] : (float)(i == tok));
        sum += res[i] = v > 0 ? v : 0;
    }
    if (!(sum > 0)) { /* p − q ≥ 0 sums to at least q(t) − p(t) > 0 in exact arithmetic */
        memcpy(res, p, sizeof(float) * V);
        sum = 1;
    }
    *total = sum;
}

int accept_walk_greedy(const int32_t *parent, const int32_t *token, int n, const int32_t *ids, int *path, int *next) {
    int node = 0, k = 1;
    path[0] = 0;
    for (;;) {
        int want = ids[node], child = accept_child(parent, token, n, node, want);
        if (child < 0) {
            *next = want;
            return k;
        }
        path[k++] = node = child;
    }
}

int accept_walk_sample(DecodeCtx *d, const int32_t *parent, const int32_t *token, const uint8_t *sampled,
                       const float *q, int n, float *logits, int is_probs, float *res, int *path, const float **kept,
                       int *next) {
    Sampler *s = d->sampler;
    int V = d->m->c.vocab_size, node = 0, k = 1;
    path[0] = 0;
    for (;;) {
        float *p = logits + (size_t)node * V, total = 1;
        kept[k - 1] = decode_keep(d, k - 1, p);
        if (decode_row_probs(d, p, is_probs)) return -1;
        memcpy(res, p, sizeof(float) * V);
        int child = -1;
        for (int c = node + 1; c < n && child < 0; c++) {
            if (parent[c] != node) continue;
            const float *qc = sampled[c] ? q + (size_t)c * V : NULL;
            if (accept_draft(s, res, total, qc, token[c])) child = c;
            else accept_residual(res, &total, qc, token[c], p, V);
        }
        if (child < 0) {
            *next = sampler_pick(s, res, V, total);
            return k;
        }
        path[k++] = node = child;
    }
}

int accept_one(Sampler *s, const float *p, const float *q, int tok, float *res, int V, int *kept) {
    if ((*kept = accept_draft(s, p, 1, q, tok))) return tok;
    float total = 1;
    memcpy(res, p, sizeof(float) * V);
    accept_residual(res, &total, q, tok, p, V);
    return sampler_pick(s, res, V, total);
}
