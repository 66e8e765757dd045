/* sampler.h — turning logits into the next token: greedy, or temperature with
   optional top-k and top-p (nucleus) truncation, from a seeded generator. */
#ifndef PD_SAMPLER_H
#define PD_SAMPLER_H
#include <stdint.h>

typedef struct {
    float temp, top_p; /* temp 0 = greedy; top_p 1 = off */
    int top_k;         /* 0 = off */
    int vocab;
    uint64_t rng;
    struct ProbIndex *sorted; /* [vocab] scratch for top-k/top-p */
} Sampler;

int sampler_init(Sampler *s, int vocab, float temp, int top_k, float top_p, uint64_t seed);
void sampler_free(Sampler *s);
/* the model's distribution after temperature and truncation: probs[vocab] (in place
   over logits); returns 0. Greedy samplers leave logits alone. */
void sampler_probs(Sampler *s, float *logits);
/* sampler_probs' second half: top-k / top-p over probs[vocab] that are already
   softmax(logits / temp) (the device's row op, logits_softmax_temp / rows_softmax) */
void sampler_truncate(Sampler *s, float *probs);
/* the next token from such probabilities (truncated in place): sampler_sample's draw */
int sampler_draw(Sampler *s, float *probs);
/* the next token; logits[vocab] are overwritten */
int sampler_sample(Sampler *s, float *logits);
float sampler_uniform(Sampler *s); /* [0, 1) */
/* a token from probabilities p[V] summing to total (zeros skipped; rounding that leaves
   the cdf a hair below the coin falls back on the last non-zero entry) */
int sampler_pick(Sampler *s, const float *p, int V, float total);

#endif
