/* standard.c — one token per pass through the whole model: the reference every
   other method must reproduce token for token. */
#include "decode/method.h"

static int standard_generate(DecodeCtx *d, const int32_t *prompt, int n_prompt) {
    if (decode_prefill(d, prompt, n_prompt)) return -1;
    double t0 = pd_now();
    const Config *c = &d->m->c;
    int prev = prompt[n_prompt - 1], pos = n_prompt;
    for (;;) {
        const float *raw = decode_keep(d, 0, d->logits);
        int next = sampler_sample(d->sampler, d->logits);
        if (decode_accept(d, prev, next, raw) || pos >= c->seq_len) break;
        if (decode_step(d, next, pos, d->hidden, d->logits)) return -1;
        prev = next;
        pos++;
    }
    d->t_decode += pd_now() - t0;
    return 0;
}

const DecodeMethod method_standard = {
    .name = "standard", .summary = "one token per full forward pass", .samples = 1, .generate = standard_generate};
