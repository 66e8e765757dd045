/* decode.h — the interface every decoding method implements, and what they share.
   A method is one file in libcore/decode/; it generates up to max_new tokens after
   the prompt, handing each accepted token to emit() as soon as it is final. */
#ifndef PD_DECODE_H
#define PD_DECODE_H
#include "forward.h"
#include "sampler.h"

typedef struct DecodeCtx {
    Model *m;
    KVCache *kv;
    int seq;                /* the KV sequence this generation owns */
    Sampler *sampler;
    int max_new;            /* tokens to generate at most */
    int32_t *out;           /* [max_new] generated tokens */
    int n_out;
    /* statistics */
    int64_t target_passes;  /* forward calls through the full model */
    double t_prefill, t_decode;
    /* streaming: called for every accepted token in order; non-zero stops */
    int (*emit)(void *ctx, int prev, int token);
    void *emit_ctx;
    /* scratch the shared helpers use */
    float *hidden, *logits; /* [chunk][dim], [chunk][vocab] */
    int cap;
} DecodeCtx;

typedef struct {
    const char *name;
    const char *summary;
    int (*generate)(DecodeCtx *d, const int32_t *prompt, int n_prompt);
} DecodeMethod;

const DecodeMethod *decode_method(const char *name); /* NULL + message when unknown */
const char *decode_method_names(void);              /* "standard, ..." */

int decode_init(DecodeCtx *d, Model *m, KVCache *kv, Sampler *s, int max_new);
void decode_free(DecodeCtx *d);
/* runs the prompt through the model; leaves the last position's logits in d->logits */
int decode_prefill(DecodeCtx *d, const int32_t *prompt, int n_prompt);
/* does this token end the text? (EOS, and BOS for llama2.c-style models, as run.c) */
int decode_is_end(const DecodeCtx *d, int token);
/* records an accepted token; returns 1 when generation must stop (end token, budget,
   emit asked to stop) */
int decode_accept(DecodeCtx *d, int prev, int token);

#endif
