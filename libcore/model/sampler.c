/* sampler.c — see sampler.h. The generator is xorshift64* as in llama2.c, so a seed
   means the same stream on every machine. */
#include "model/sampler.h"

#include <stdlib.h>

#include "backend.h"
#include "base/util.h"

typedef struct ProbIndex {
    float p;
    int i;
} ProbIndex;

int sampler_init(Sampler *s, int vocab, float temp, int top_k, float top_p, uint64_t seed) {
    /* splitmix64 of the seed: xorshift started from small consecutive seeds gives
       correlated first draws (seeds 1, 2, 3 → 0.28, 0.56, 0.84) */
    uint64_t z = seed + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    *s = (Sampler){temp, top_p, top_k, vocab, z ? z : 1, NULL};
    if (!(temp >= 0)) return pd_error("temperature %g must be ≥ 0", temp);
    if (!(top_p > 0 && top_p <= 1)) return pd_error("top-p %g must be in (0, 1]", top_p);
    if (top_k < 0) return pd_error("top-k %d must be ≥ 0", top_k);
    s->sorted = pd_alloc(sizeof(ProbIndex) * vocab);
    return s->sorted ? 0 : -1;
}

void sampler_free(Sampler *s) {
    free(s->sorted);
    s->sorted = NULL;
}

static uint32_t next_u32(Sampler *s) {
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    return (uint32_t)((s->rng * 0x2545F4914F6CDD1Dull) >> 32);
}

float sampler_uniform(Sampler *s) { return (next_u32(s) >> 8) / 16777216.0f; }

static int by_prob_desc(const void *a, const void *b) {
    const ProbIndex *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->i - y->i; /* a total order, so every libc sorts the same way */
}

void sampler_probs(Sampler *s, float *x) {
    if (s->temp == 0) return;
    for (int i = 0; i < s->vocab; i++) x[i] /= s->temp;
    k_softmax(x, s->vocab);
    sampler_truncate(s, x);
}

void sampler_truncate(Sampler *s, float *x) {
    if (s->temp == 0 || (s->top_k == 0 && s->top_p >= 1)) return;
    for (int i = 0; i < s->vocab; i++) s->sorted[i] = (ProbIndex){x[i], i};
    qsort(s->sorted, s->vocab, sizeof(ProbIndex), by_prob_desc);
    int keep = s->top_k > 0 && s->top_k < s->vocab ? s->top_k : s->vocab;
    float cum = 0;
    for (int i = 0; i < keep; i++) {
        cum += s->sorted[i].p;
        if (cum >= s->top_p) {
            keep = i + 1;
            break;
        }
    }
    float kept = 0;
    for (int i = 0; i < keep; i++) kept += s->sorted[i].p;
    for (int i = 0; i < s->vocab; i++) x[i] = 0;
    for (int i = 0; i < keep; i++) x[s->sorted[i].i] = s->sorted[i].p / kept;
}

int sampler_sample(Sampler *s, float *x) {
    if (s->temp == 0) return k_argmax(x, s->vocab);
    sampler_probs(s, x);
    return sampler_pick(s, x, s->vocab, 1);
}

int sampler_draw(Sampler *s, float *p) {
    sampler_truncate(s, p);
    return sampler_pick(s, p, s->vocab, 1);
}

int sampler_pick(Sampler *s, const float *p, int V, float total) {
    float coin = sampler_uniform(s) * total, cdf = 0;
    int last = 0;
    for (int i = 0; i < V; i++) {
        if (p[i] <= 0) continue;
        cdf += p[i];
        last = i;
        if (coin < cdf) return i;
    }
    return last;
}
