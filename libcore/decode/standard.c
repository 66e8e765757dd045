/* standard.c — one token per pass through the whole model: the reference every
   other method must reproduce token for token. */
#include <stdlib.h>

#include "decode/method.h"

typedef struct {
    int prev, pos, done;
} StandardState;

/* the next token after d->hidden; done at an end token, the budget or the context */
static int standard_next(DecodeCtx *d, StandardState *s) {
    const float *raw;
    int next;
    if (decode_choose(d, d->hidden, &raw, &next)) return -1;
    s->done = decode_accept(d, s->prev, next, raw) || s->pos >= d->m->c.seq_len;
    s->prev = next;
    return s->done;
}

static int standard_begin(DecodeCtx *d, const int32_t *prompt, int n_prompt, void **state) {
    StandardState *s = pd_alloc(sizeof *s);
    if (!(*state = s) || decode_prefill_hidden(d, prompt, n_prompt)) return -1;
    s->prev = prompt[n_prompt - 1], s->pos = n_prompt;
    return standard_next(d, s) < 0 ? -1 : 0;
}

static int standard_step(DecodeCtx *d, void *state) {
    StandardState *s = state;
    if (s->done) return 1;
    if (decode_step(d, s->prev, s->pos, d->hidden, NULL)) return -1;
    s->pos++;
    return standard_next(d, s);
}

static void standard_finish(DecodeCtx *d, void *state) {
    (void)d;
    free(state);
}

const DecodeMethod method_standard = {.name = "standard",
                                      .summary = "one token per full forward pass",
                                      .samples = 1,
                                      .begin = standard_begin,
                                      .step = standard_step,
                                      .finish = standard_finish};
