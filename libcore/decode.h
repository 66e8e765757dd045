/* decode.h — the interface every decoding method implements, and what they share.
   A method is one file in libcore/decode/; it generates up to max_new tokens after
   the prompt, handing each accepted token to emit() as soon as it is final. */
#ifndef PD_DECODE_H
#define PD_DECODE_H
#include "exit_heads.h"
#include "forward.h"
#include "sampler.h"

/* what the methods beyond standard take (0 / NULL = the method's default) */
typedef struct {
    const ExitHeads *heads; /* adadecode, self-speculative */
    float gamma;            /* adadecode: exit when the head's max prob ≥ gamma (0.75) */
    int max_pending;        /* adadecode: unverified early tokens at most (5) */
    int exit_layer;         /* self-speculative: draft with layers [0, exit_layer) (a head layer) */
    int draft_max;          /* self-speculative: drafts per round at most */
    float oracle_rate;      /* benchmarks: an oracle that knows the standard continuation
                               (oracle[]) exits / drafts correctly with this probability */
    const int32_t *oracle;  /* [max_new] the standard continuation, for the oracle */
} MethodOptions;

typedef struct DecodeCtx {
    Model *m;
    KVCache *kv;
    int seq;                /* the KV sequence this generation owns */
    Sampler *sampler;
    MethodOptions opt;
    int max_new;            /* tokens to generate at most */
    int32_t *out;           /* [max_new] generated tokens */
    int n_out;
    /* statistics */
    int64_t target_passes;  /* forward calls through the full model */
    int64_t layer_passes;   /* sequential layer steps: each forward_layers call adds its range */
    int64_t token_layers;   /* token × layer computations, discarded ones included */
    int64_t early[MAX_EXIT_HEADS]; /* early exits (or accepted drafts) per head */
    int64_t drafted, rejected;     /* early or drafted tokens, and those verification threw out */
    int64_t pending_sum, pending_n; /* for the mean pending depth */
    int64_t prefill_passes, prefill_token_layers; /* what the prompt took, to leave out */
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
/* forward_layers with the statistics kept: layer_passes += e - b, token_layers +=
   n (e - b), and a target pass when the call covers the whole model */
int decode_forward(DecodeCtx *d, const Batch *b, int lb, int le, float *hidden);
/* runs the prompt through the model; leaves the last position's logits in d->logits */
int decode_prefill(DecodeCtx *d, const int32_t *prompt, int n_prompt);
/* does this token end the text? (EOS, and BOS for llama2.c-style models, as run.c) */
int decode_is_end(const DecodeCtx *d, int token);
/* records an accepted token; returns 1 when generation must stop (end token, budget,
   emit asked to stop) */
int decode_accept(DecodeCtx *d, int prev, int token);

#endif
