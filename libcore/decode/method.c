/* method.c — the method registry and the helpers every method shares. */
#include "decode/method.h"

#include <stdlib.h>
#include <string.h>

extern const DecodeMethod method_standard, method_adadecode, method_selfspec, method_medusa;
extern const DecodeMethod method_prompt_lookup;
extern const DecodeMethod method_lookahead;
extern const DecodeMethod method_speculative;

/* adding a method: one file in libcore/decode/ and one line here */
static const DecodeMethod *const METHODS[] = {&method_standard, &method_adadecode, &method_selfspec,
                                            &method_medusa,
                                            &method_prompt_lookup,
                                            &method_lookahead,
                                            &method_speculative};
#define N_METHODS (int)(sizeof METHODS / sizeof METHODS[0])

const DecodeMethod *decode_method(const char *name) {
    for (int i = 0; i < N_METHODS; i++)
        if (!strcmp(METHODS[i]->name, name)) return METHODS[i];
    pd_error("unknown method '%s' (known: %s)", name, decode_method_names());
    return NULL;
}

const char *decode_method_names(void) {
    static char buf[512];
    buf[0] = 0;
    for (int i = 0; i < N_METHODS; i++) {
        if (i) strncat(buf, ", ", sizeof buf - strlen(buf) - 1);
        strncat(buf, METHODS[i]->name, sizeof buf - strlen(buf) - 1);
    }
    return buf;
}

#define PREFILL_CHUNK 64 /* tokens a prefill pass takes at once */

int decode_init(DecodeCtx *d, Model *m, KVCache *kv, Sampler *s, int max_new) {
    memset(d, 0, sizeof *d);
    d->m = m;
    d->kv = kv;
    d->sampler = s;
    d->max_new = max_new;
    d->cap = PREFILL_CHUNK;
    d->seq = kv_seq_new(kv);
    d->run = runner_new(m);
    d->out = pd_alloc(sizeof(int32_t) * (max_new > 0 ? max_new : 1));
    d->hidden = pd_alloc(sizeof(float) * d->cap * m->c.dim);
    d->logits = pd_alloc(sizeof(float) * d->cap * m->c.vocab_size);
    if (d->seq < 0 || !d->run || !d->out || !d->hidden || !d->logits) {
        decode_free(d);
        return -1;
    }
    return 0;
}

void decode_free(DecodeCtx *d) {
    if (d->kv && d->seq >= 0 && d->m) kv_seq_free(d->kv, d->seq);
    runner_free(d->run);
    free(d->out);
    free(d->hidden);
    free(d->logits);
    for (int i = 0; i < d->kept_rows; i++) free(d->kept[i]);
    free(d->kept);
    memset(d, 0, sizeof *d);
}

int decode_continue(DecodeCtx *d, int max_new, int keep) {
    if (kv_truncate(d->kv, d->seq, keep)) return -1;
    int32_t *out = pd_realloc(d->out, sizeof(int32_t) * (max_new > 0 ? max_new : 1));
    if (!out) return -1;
    DecodeCtx was = *d; /* the model, cache, sequence, sampler, options, callback and scratch stay */
    memset(d, 0, sizeof *d);
    d->m = was.m, d->run = was.run, d->kv = was.kv, d->seq = was.seq, d->sampler = was.sampler, d->opt = was.opt;
    d->emit = was.emit, d->emit_ctx = was.emit_ctx, d->hidden = was.hidden, d->logits = was.logits, d->cap = was.cap;
    d->out = out, d->max_new = max_new, d->reuse = keep;
    return 0;
}

int decode_kept(const DecodeCtx *d, int n_prompt) {
    int k = n_prompt + d->n_out;
    for (int l = 0; l < d->m->c.n_layers; l++) {
        int len = kv_len(d->kv, d->seq, l);
        if (len < k) k = len;
    }
    return k;
}

int decode_forward(DecodeCtx *d, const Batch *b, int lb, int le, float *hidden) {
    if (forward_layers(d->run, d->kv, b, lb, le, hidden)) return -1;
    d->layer_passes += le - lb;
    d->token_layers += (int64_t)b->n * (le - lb);
    d->target_passes += lb == 0 && le == d->m->c.n_layers;
    return 0;
}

int decode_step(DecodeCtx *d, int token, int pos, float *hidden, float *logits) {
    Batch b = {1, &token, &d->seq, &pos, NULL, NULL};
    return decode_forward(d, &b, 0, d->m->c.n_layers, hidden) || final_logits(d->run, hidden, 1, logits) ? -1 : 0;
}

int decode_prefill(DecodeCtx *d, const int32_t *prompt, int n) {
    double t0 = pd_now();
    if (n < 1) return pd_error("empty prompt (it needs at least BOS)");
    if (n >= d->m->c.seq_len)
        return pd_error("prompt of %d tokens does not fit the context of %d", n, d->m->c.seq_len);
    int from = d->reuse < n ? d->reuse : n - 1; /* the last token runs again for its logits */
    if (from < d->reuse && kv_truncate(d->kv, d->seq, from)) return -1;
    int32_t pos[PREFILL_CHUNK];
    int take = 0;
    for (int at = from; at < n; at += take) {
        take = n - at < d->cap ? n - at : d->cap;
        for (int i = 0; i < take; i++) pos[i] = at + i;
        int32_t seq[PREFILL_CHUNK];
        for (int i = 0; i < take; i++) seq[i] = d->seq;
        Batch b = {take, prompt + at, seq, pos, NULL, NULL};
        if (decode_forward(d, &b, 0, d->m->c.n_layers, d->hidden)) return -1;
    }
    size_t dim = d->m->c.dim;
    memmove(d->hidden, d->hidden + (take - 1) * dim, sizeof(float) * dim);
    if (final_logits(d->run, d->hidden, 1, d->logits)) return -1;
    d->n_prefilled = n - from;
    d->prefill_passes = d->target_passes;
    d->prefill_token_layers = d->token_layers;
    d->t_prefill += pd_now() - t0;
    return 0;
}

int decode_is_end(const DecodeCtx *d, int token) { return token_ends_text(d->m, token); }

int token_ends_text(const Model *m, int token) {
    const Tokenizer *t = m->tok;
    /* llama2.c-style models end a story with BOS, as run.c stops there */
    return tok_is_eog(t, token) || (tok_kind(t) == TOK_SPM && token == tok_bos(t));
}

int decode_accept(DecodeCtx *d, int prev, int token, const float *logits) {
    if (decode_is_end(d, token)) return 1;
    d->out[d->n_out++] = token;
    if (d->emit_logits) d->emit_logits(d->emit_ctx, token, logits);
    if (d->emit && d->emit(d->emit_ctx, prev, token)) return 1;
    return d->n_out >= d->max_new;
}

const float *decode_keep(DecodeCtx *d, int i, const float *logits) {
    if (!d->emit_logits) return NULL;
    if (d->sampler->temp == 0) return logits;
    size_t V = d->m->c.vocab_size;
    if (i >= d->kept_rows) {
        float **k = realloc(d->kept, sizeof(float *) * (i + 1));
        if (!k) return NULL;
        d->kept = k;
        for (; d->kept_rows <= i; d->kept_rows++)
            if (!(d->kept[d->kept_rows] = malloc(sizeof(float) * V))) return NULL;
    }
    return memcpy(d->kept[i], logits, sizeof(float) * V);
}
