/* method.h — the interface every decoding method implements, and what they share.
   A method is one file in libcore/decode/; it generates up to max_new tokens after
   the prompt, handing each accepted token to emit() as soon as it is final. */
#ifndef PD_DECODE_H
#define PD_DECODE_H
#include "heads/exit_heads.h"
#include "heads/medusa_heads.h"
#include "model/forward.h"
#include "model/sampler.h"

#define MAX_ROUND_NODES 256 /* nodes a drafter's round runs at most: its tree and side nodes */

/* what the methods beyond standard take (0 / NULL = the method's default) */
typedef struct {
    const ExitHeads *heads; /* adadecode, self-speculative */
    float gamma;            /* adadecode: exit when the head's max prob ≥ gamma (0.75) */
    int max_pending;        /* adadecode: unverified early tokens at most (5) */
    int exit_layer;         /* self-speculative: draft with layers [0, exit_layer) (a head layer) */
    int draft_max;          /* self-speculative, speculative, prompt-lookup: drafts per round at
                               most; medusa: tree nodes below the root */
    float oracle_rate;      /* benchmarks: an oracle that knows the standard continuation
                               (oracle[]) exits / drafts correctly with this probability */
    const int32_t *oracle;  /* [max_new] the standard continuation, for the oracle */
    const MedusaHeads *medusa; /* medusa */
    const char *tree;       /* medusa: the candidate tree, as paths of ranks (NULL = built
                               from the heads' measured accuracies) */
    int fixed_tree;         /* drafters: verify the whole proposal every round (no size
                               controller; benchmarks and tests) */
    int shadows;            /* the size controller's shadows (drafter.c), for a cheap
                               drafter: 0 where a step is slow enough, 1 always (tests) */
    int ngram_max;          /* prompt-lookup: the longest tail n-gram looked up (3) */
    int window, ngram, guess; /* lookahead: Jacobi window W (3), n-gram size N (3),
                               candidate n-grams verified G (W) */
    int adaptive;           /* lookahead: the window widens and narrows with acceptance */
    Model *draft;           /* speculative: the draft model (same vocabulary; not const:
                               its forward pass grows its workspace) */
    int draft_min;          /* speculative: draft length at least (1); draft_max: at most (8) */
    int draft_fixed;        /* speculative: always draft_max drafts (no adaptation) */
} MethodOptions;

typedef struct DecodeCtx {
    Model *m;
    Runner *run;            /* this generation's forward workspace (decode_init makes it) */
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
    int64_t early[MAX_EXIT_HEADS]; /* early exits per head, or drafts kept at depth j+1 */
    int64_t reached[MAX_EXIT_HEADS]; /* drafters: rounds that reached depth j with a draft below */
    int64_t drafted, rejected;     /* early or drafted tokens, and those verification threw out */
    int64_t pending_sum, pending_n; /* for the mean pending depth */
    int64_t rounds_by_nodes[MAX_ROUND_NODES + 1]; /* drafters: rounds that ran n nodes */
    int64_t prefill_passes, prefill_token_layers; /* what the prompt took, to leave out */
    int reuse;                                    /* leading prompt tokens the KV sequence already holds (a
                               conversation's earlier turns): prefill starts after them */
    int n_prefilled;                              /* prompt tokens the prefill ran */
    double t_prefill, t_decode;
    /* streaming: called for every accepted token in order; non-zero stops */
    int (*emit)(void *ctx, int prev, int token);
    void *emit_ctx;
    /* logprobs: when set, called just before emit with the target's logits[vocab] at the
       position the token was chosen from, as the model gave them (before temperature or
       truncation); NULL logits when they could not be kept (out of memory) */
    void (*emit_logits)(void *ctx, int token, const float *logits);
    float **kept; /* [kept_rows] decode_keep's copies, a [vocab] row each */
    int kept_rows;
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
/* one token at pos through the whole model: hidden[dim] after the last layer, logits[vocab] */
int decode_step(DecodeCtx *d, int token, int pos, float *hidden, float *logits);
/* the next turn of a conversation on the same sequence: output and statistics start
   afresh, the KV sequence is cut to its first `keep` slots (a prefix the next prompt
   shares with the last prompt and its output), and the next prefill starts there */
int decode_continue(DecodeCtx *d, int max_new, int keep);
/* how many leading tokens of the last prompt and its output the KV sequence holds,
   complete in every layer (what decode_continue may keep) */
int decode_kept(const DecodeCtx *d, int n_prompt);
/* runs the prompt through the model (from d->reuse on); leaves the last position's
   logits in d->logits and its hidden state after the last layer in d->hidden[0..dim) */
int decode_prefill(DecodeCtx *d, const int32_t *prompt, int n_prompt);
/* does this token end the text? (EOS, and BOS for llama2.c-style models, as run.c) */
int token_ends_text(const Model *m, int token);
int decode_is_end(const DecodeCtx *d, int token);
/* records an accepted token chosen from the target's logits (what decode_keep gave
   for them; NULL when nobody asked); returns 1 when generation must stop (end token,
   budget, emit asked to stop) */
int decode_accept(DecodeCtx *d, int prev, int token, const float *logits);
/* logprobs (emit_logits set) need the target's logits as they came, where sampling turns
   them into probabilities in place: row i of a round's rows is copied aside, and where it
   lies returned. Greedy decoding only reads logits, so they are returned as they are;
   NULL when nobody asked, or out of memory (emit_logits is told). Call it before the
   logits change; a row stays where it is until row i is kept again. */
const float *decode_keep(DecodeCtx *d, int i, const float *logits);

#endif
