/* method.h — the interface every decoding method implements, and what they share.
   A method is one file in libcore/decode/; it generates up to max_new tokens after
   the prompt, handing each accepted token to emit() as soon as it is final. */
#ifndef PD_DECODE_H
#define PD_DECODE_H
#include <stdio.h>

#include "heads/eagle_head.h"
#include "heads/exit_heads.h"
#include "heads/medusa_heads.h"
#include "model/forward.h"
#include "model/sampler.h"

#define MAX_ROUND_NODES 256 /* nodes a drafter's round runs at most: its tree and side nodes */

/* what any method may be given besides its own options: the loaded heads and draft
   model, the benchmarks' oracle, and the drafter loop's knobs. A method's own knobs live
   in its own struct, described by its option table (DecodeMethod.options). */
typedef struct {
    const ExitHeads *heads;    /* adadecode, self-speculative */
    const MedusaHeads *medusa; /* medusa */
    const EagleHead *eagle;    /* eagle */
    Model *draft;              /* speculative: the draft model (same vocabulary) */
    float oracle_rate;         /* benchmarks: an oracle that knows the standard continuation
                                  (oracle[]) exits / drafts correctly with this probability */
    const int32_t *oracle;     /* [max_new] the standard continuation, for the oracle */
    int fixed_tree;            /* drafters: verify the whole proposal every round (no size
                                  controller; benchmarks and tests) */
    int shadows;               /* the size controller's shadows (drafter.c), for a cheap
                                  drafter: 0 where a step is slow enough, 1 always (tests) */
    int graphs;                /* full-model calls of up to MAX_GRAPH_TOKENS tokens replay a
                                  graph captured per token count (decode_forward) */
    int fast_prefill;          /* the prompt's layers by the device's fast products (cuBLAS):
                                  not exact mode's bits; the whole prompt, never a part */
} MethodShared;

#define MAX_GRAPH_TOKENS 64

typedef struct DecodeCtx {
    Model *m;
    Runner *run; /* this generation's forward workspace (decode_init makes it) */
    KVCache *kv;
    int seq; /* the KV sequence this generation owns */
    Sampler *sampler;
    MethodShared opt;
    const void *mopt; /* the method's own options (its struct; NULL: every default) */
    int max_new;      /* tokens to generate at most */
    int32_t *out;     /* [max_new] generated tokens */
    int n_out;
    /* statistics */
    int64_t target_passes;                        /* forward calls through the full model */
    int64_t layer_passes;                         /* sequential layer steps: each forward_layers call adds its range */
    int64_t token_layers;                         /* token × layer computations, discarded ones included */
    int64_t early[MAX_EXIT_HEADS];                /* early exits per head, or drafts kept at depth j+1 */
    int64_t reached[MAX_EXIT_HEADS];              /* drafters: rounds that reached depth j with a draft below */
    int64_t drafted, rejected;                    /* early or drafted tokens, and those verification threw out */
    int64_t pending_sum, pending_n;               /* for the mean pending depth */
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
    /* a method that reads the prompt's states (EAGLE's head runs over them) sets this
       before its prefill: called after each chunk of it with its tokens, positions and
       states after the last layer; non-zero fails the prefill */
    int (*on_prefill)(void *ctx, const int32_t *tok, const int32_t *pos, int n, const float *hidden);
    void *on_prefill_ctx;
    /* a caller that ran the prompt itself (serve's shared step) gives its last state
       after the last layer [dim] and the first token, chosen and already handed out: a
       drafter's begin neither runs the last prompt token again nor chooses (NULL: none) */
    const float *given_hidden;
    int given_token;
    /* and, for a method that reads the prompt's states (DecodeMethod.reads_prompt), those
       states for the prompt's positions 0 .. n_given_states - 1 ([n][dim], after the last
       layer): given for the whole prompt, its begin runs none of it again */
    const float *given_states;
    int n_given_states;
    /* what the method's requests in one engine share (DecodeMethod.pool_new), or NULL */
    void *pool;
    /* scratch the shared helpers use */
    float *hidden, *logits; /* [chunk][dim], [chunk][vocab] */
    int cap;
    ForwardGraph *graph[MAX_GRAPH_TOKENS]; /* opt.graphs: [n - 1] the graph for n tokens */
} DecodeCtx;

/* ---- the registry: a method describes itself ----
   An option is a flag of decode and bench (--NAME) and a key of a recipe's decoding
   section (NAME with '_' for '-'). Its value lives at `offset` in the method's own
   options struct (or in MethodShared when shared); 0 there means the default, which
   `def` says in words. Ranges are checked here, once, for every caller. */
typedef enum { OPT_INT, OPT_FLOAT, OPT_SWITCH, OPT_STR } OptType;

typedef struct {
    const char *name; /* "max-pending" */
    OptType type;
    double lo, hi;       /* the range of OPT_INT and OPT_FLOAT values */
    const char *metavar; /* "K" */
    const char *def;     /* the default, in words ("5", "the middle head's") */
    const char *help;    /* one line */
    size_t offset;       /* of the value (int, float, const char *) */
    int shared;          /* the value is in MethodShared, not the method's struct */
    const char *recipe;  /* the recipe's key where it is not the name ("confidence"), or NULL */
} MethodOption;

enum { NEEDS_EXIT_HEADS = 1, NEEDS_MEDUSA = 2, NEEDS_DRAFT = 4, NEEDS_EAGLE = 8 };

typedef struct {
    const char *name;
    const char *summary;
    const MethodOption *options;
    int n_options;
    size_t options_size; /* the method's own options struct (0: none) */
    int needs;           /* NEEDS_* */
    int samples;         /* lossless when sampling too (every method here) */
    int oracle;          /* takes the benchmarks' oracle (MethodShared.oracle) */
    int reads_prompt;    /* begin reads every prompt position's state (on_prefill) */
    /* optional: state the method's requests in one engine share (EAGLE's head runner and
       cache, so that the requests' head calls can be one call), for up to max_seqs
       requests whose contexts hold max_tokens positions in all; the engine makes it once
       and hands it to every generation's begin as DecodeCtx.pool (NULL: each its own) */
    void *(*pool_new)(const Model *m, const MethodShared *o, int max_seqs, int max_tokens);
    void (*pool_free)(void *pool);
    /* generation as a state machine over the method's own state: no method owns a loop
       or a thread. begin prefills the prompt (from d->reuse on) and accepts the first
       token, leaving its state in *state (NULL or partial on failure: finish frees it
       whatever begin returned); step runs one round (a token, a verified tree, a layer
       range) and returns 1 when the generation is over, 0 when there is more, -1 on
       error; finish frees the state. decode_generate steps one generation to its end;
       the serve engine steps many from its one scheduler thread. */
    int (*begin)(DecodeCtx *d, const int32_t *prompt, int n_prompt, void **state);
    int (*step)(DecodeCtx *d, void *state);
    void (*finish)(DecodeCtx *d, void *state);
} DecodeMethod;

const DecodeMethod *decode_method(const char *name); /* NULL + message when unknown */
const char *decode_method_names(void);               /* "standard, ..." */
/* adds a method to the registry at run time (tests: a test-only method; a built-in
   method is a line of method.c's table instead); -1 + message on a name taken */
int decode_register(const DecodeMethod *dm);
/* standard decoding: the reference every method must reproduce (the registry's first) */
const DecodeMethod *decode_reference(void);
int decode_method_count(void);
const DecodeMethod *decode_method_at(int i);
/* the method's option called name ("gamma"; a recipe's "max_pending" too), or NULL */
const MethodOption *decode_option_find(const DecodeMethod *dm, const char *name);
/* the option's key in a recipe's decoding section: its name with '_' for '-', or
   MethodOption.recipe; into buf[n] */
const char *decode_option_key(const MethodOption *o, char *buf, size_t n);
/* the first method's option whose recipe key is key, and that method; NULL if none */
const MethodOption *decode_option_by_key(const char *key, const DecodeMethod **dm);
/* "adadecode self-speculative": the methods that have the option (for messages) */
const char *decode_option_users(const char *name);
/* a fresh options struct for the method, all defaults (free() it); NULL + message */
void *decode_options_new(const DecodeMethod *dm);
/* sets option name from its text: refused with "--NAME: ..." (not a number, out of
   range, or a method that does not read it) */
int decode_option_set(const DecodeMethod *dm, void *opts, MethodShared *sh, const char *name, const char *value);
/* every set value within its range (what decode_option_set checks, for options
   built in code), the oracle with its tokens, and what the method needs is given */
int decode_options_check(const DecodeMethod *dm, const void *opts, const MethodShared *sh);
/* can the method run with what sh holds? (heads, Medusa heads, a draft); -1 + message */
int decode_method_ready(const DecodeMethod *dm, const MethodShared *sh);
/* the method list with each option's help, for --help */
void decode_methods_help(FILE *f);
/* one generation as a state machine: begin (decode_options_check, then the method's
   begin), steps, finish; decode_run_step returns 1 when it is over, 0 for more, -1 */
typedef struct {
    const DecodeMethod *dm;
    DecodeCtx *d;
    void *state;
} DecodeRun;
int decode_run_begin(DecodeRun *r, const DecodeMethod *dm, DecodeCtx *d, const int32_t *prompt, int n_prompt);
int decode_run_step(DecodeRun *r);
void decode_run_finish(DecodeRun *r);
/* begin, every step, finish: the whole generation */
int decode_generate(const DecodeMethod *dm, DecodeCtx *d, const int32_t *prompt, int n_prompt);

/* τ, tokens per target pass: the tokens after the first (the prefill's pass gives that
   one) over the target passes after the prefill, so standard decoding is exactly 1 */
static inline double decode_tau(int64_t tokens_after_first, int64_t passes) {
    return passes > 0 ? (double)tokens_after_first / (double)passes : 0;
}

int decode_init(DecodeCtx *d, Model *m, KVCache *kv, Sampler *s, int max_new);
void decode_free(DecodeCtx *d);
/* forward_layers with the statistics kept: layer_passes += e - b, token_layers +=
   n (e - b), and a target pass when the call covers the whole model */
int decode_forward(DecodeCtx *d, const Batch *b, int lb, int le, float *hidden);
/* decode_forward's statistics for n tokens through layers [lb, le) that another call ran
   (the serve engine's shared step) */
void decode_count_pass(DecodeCtx *d, int n, int lb, int le);
/* one token at pos through the whole model: hidden[dim] after the last layer, and
   logits[vocab] unless logits is NULL (then decode_choose reads hidden) */
int decode_step(DecodeCtx *d, int token, int pos, float *hidden, float *logits);
/* what the target's last hidden rows (hidden[n][dim]) give a method, from the runner's
   row ops: greedy: ids[n], the argmax. Sampling: lg[n][vocab] = softmax(logits / temp)
   (returns 1), or the raw logits (returns 0) when logprobs are asked (emit_logits) or
   need_ids (then ids[n] too: the argmax of the raw logits). Logprobs: lg holds the raw
   logits in either mode. -1 on error. */
int decode_rows(DecodeCtx *d, const float *hidden, int n, float *lg, int32_t *ids, int need_ids);
/* decode_rows for rows whose raw logits lg[n][vocab] are at hand (a forward call shared
   with other generations): the same results, in lg and ids (ids NULL: the argmax is not
   wanted, or given already) */
int decode_rows_given(DecodeCtx *d, float *lg, int n, int32_t *ids, int need_ids);
/* sampler_probs over one row of decode_rows (is_probs: its return): the device's
   softmax when the row is still logits, then top-k / top-p on the host */
int decode_row_probs(DecodeCtx *d, float *row, int is_probs);
/* the next token after hidden[dim] (one row after the last layer): sampler_sample's
   bits; *raw decode_keep's logits (NULL unless logprobs are asked); d->logits scratch */
int decode_choose(DecodeCtx *d, const float *hidden, const float **raw, int *tok);
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
/* decode_prefill without the logits: the hidden state alone (methods then decode_choose) */
int decode_prefill_hidden(DecodeCtx *d, const int32_t *prompt, int n_prompt);
/* the same from what the caller gave (given_hidden, and given_states for on_prefill):
   nothing runs */
int decode_prefill_given(DecodeCtx *d, const int32_t *prompt, int n_prompt);
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
