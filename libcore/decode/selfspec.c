/* selfspec.c — self-speculative decoding (Draft&Verify, Zhang et al. 2024; LayerSkip,
   Elhoushi et al. 2024): the target's own first Le layers plus the exit head at Le
   draft up to K tokens one at a time, a chain the drafter loop (decode/drafter.c)
   verifies. The loop's forward call runs only layers [Le, L): every drafted token's
   layers [0, Le) are already in the KV cache and its hidden state after layer Le is
   kept (DraftTree.run_to).

   A round starts from: the KV cache full for positions < P, and x = the last accepted
   token, at P, not yet run. Drafting runs x, d1, d2, ... through [0, Le) (each one a
   1-token call, bit-identical to any batch by the forward pass's batch invariance) and
   asks the head for the next draft. Lossless through the loop's acceptance
   (decode/accept.h): greedy keeps d_i only when it is the final argmax after d_{i-1};
   sampling, min(1, p/q), else a draw from norm(max(0, p − q)).

   How many drafts a round makes changes the speed only, never the output: drafting
   stops at draft_max, at the loop's size controller's budget, or when the head's max
   probability falls below gamma (a weak draft is likely rejected and costs Le layers
   for nothing). The controller is what makes a drafter that does not pay rest: with
   its budget at one node, a round is a plain step that never asks the head. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "decode/drafter.h"

#define SELFSPEC_DEFAULT_DRAFT_MAX 4
#define SELFSPEC_DEFAULT_CONFIDENCE 0.5f
#define SELFSPEC_MAX_DRAFT 64

typedef struct {
    int le, head, kmax; /* exit layer, its head index, drafts per round at most */
    float conf;         /* keep drafting while the head's max prob ≥ conf */
    int greedy;
    float *hl; /* [vocab] head logits */
    int32_t seq;
} SelfSpec;

/* the middle head by default: a deeper head drafts better but costs more per draft;
   with heads at 1..4 of 5 layers that is layer 3, with 8/16/24 of 30 it is 16 */
static int selfspec_pick_exit(const ExitHeads *h, int want) {
    if (!want) return h->n / 2;
    int k = heads_find(h, want);
    if (k < 0) {
        char list[256] = "";
        for (int i = 0; i < h->n; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", i ? ", " : "", h->layer[i]);
        pd_error("self-speculative: exit layer %d has no head (the heads are at layers %s)", want, list);
    }
    return k;
}

typedef struct {
    float gamma;
    int exit_layer, draft_max;
} SelfSpecOptions;

static const MethodOption selfspec_options[] = {
    {"gamma", OPT_FLOAT, 1e-6, 1, "G", "0.5", "draft while the head's top probability is ≥ G",
     offsetof(SelfSpecOptions, gamma), 0, "confidence"},
    {"exit-layer", OPT_INT, 1, 1 << 20, "L", "the middle head's", "draft with layers [0, L) and the head at L",
     offsetof(SelfSpecOptions, exit_layer), 0, NULL},
    {"draft-max", OPT_INT, 1, SELFSPEC_MAX_DRAFT, "K", "4", "drafts per round at most",
     offsetof(SelfSpecOptions, draft_max), 0, NULL},
    DRAFTER_OPTIONS,
};

static int selfspec_init(SelfSpec *s, DecodeCtx *d) {
    static const SelfSpecOptions selfspec_none;
    const SelfSpecOptions *o = d->mopt ? d->mopt : &selfspec_none;
    const ExitHeads *h = d->opt.heads;
    if (h->n < 1) return pd_error("self-speculative needs exit heads (--heads FILE)");
    if ((s->head = selfspec_pick_exit(h, o->exit_layer)) < 0) return -1;
    s->le = h->layer[s->head];
    if (s->le < 1 || s->le >= d->m->c.n_layers)
        return pd_error("self-speculative: exit layer %d is outside [1, %d)", s->le, d->m->c.n_layers);
    s->kmax = o->draft_max ? o->draft_max : SELFSPEC_DEFAULT_DRAFT_MAX;
    s->conf = o->gamma > 0 ? o->gamma : SELFSPEC_DEFAULT_CONFIDENCE;
    s->greedy = d->sampler->temp == 0;
    s->seq = d->seq;
    s->hl = pd_alloc(sizeof(float) * d->m->c.vocab_size);
    return s->hl ? 0 : -1;
}

static void selfspec_free(Drafter *dr) {
    SelfSpec *s = dr->self;
    if (!s) return;
    free(s->hl);
    free(s);
}

/* the draft after hidden state h (after layers [0, Le)) for output index `at`; q[V]
   gets the distribution it was drawn from (sampling only). Returns the token, -1 when
   the head is not confident enough to be worth a draft, -2 on error. */
static int selfspec_draft_one(DecodeCtx *d, SelfSpec *s, const float *h, int at, float *q) {
    int V = d->m->c.vocab_size;
    if (head_logits(d->m, d->opt.heads, s->head, h, 1, s->hl)) return -2;
    /* the oracle (benchmarks) knows the standard continuation; the head's cost stays */
    if (d->opt.oracle_rate > 0 && at < d->max_new && sampler_uniform(d->sampler) < d->opt.oracle_rate) {
        int t = d->opt.oracle[at];
        if (t < 0 || t >= V) return pd_error("self-speculative: oracle token %d outside the vocabulary", t), -2;
        if (!s->greedy) { /* drawn from a point mass: accepted with probability p(t) */
            memset(q, 0, sizeof(float) * V);
            q[t] = 1;
        }
        return t;
    }
    if (s->greedy) {
        int32_t t;
        if (rows_argmax(d->run, s->hl, 1, V, &t)) return -2;
        float mx = s->hl[t], sum = 0;
        for (int i = 0; i < V; i++) sum += expf(s->hl[i] - mx);
        return 1 / sum >= s->conf ? t : -1; /* the argmax's softmax probability */
    }
    if (rows_softmax(d->run, s->hl, 1, V, d->sampler->temp, q)) return -2;
    sampler_truncate(d->sampler, q);
    float mx = 0; /* the largest probability (its value: no tie can change it) */
    for (int i = 0; i < V; i++) mx = q[i] > mx ? q[i] : mx;
    return mx >= s->conf ? sampler_pick(d->sampler, q, V, 1) : -1;
}

/* runs the root x at P and the drafts after it through [0, Le) as a chain, keeping
   their states after layer Le in t->hidden; stops at a weak head or the budget */
static int selfspec_propose(Drafter *dr, DecodeCtx *d, DraftTree *t, int max_nodes, int max_depth) {
    SelfSpec *s = dr->self;
    int dim = d->m->c.dim, V = d->m->c.vocab_size, kcap = s->kmax;
    if (kcap > max_depth) kcap = max_depth;
    if (kcap > max_nodes - 1) kcap = max_nodes - 1;
    t->run_to = s->le;
    for (int i = 0;; i++) {
        int32_t pos = t->root_pos + i;
        Batch b = {1, &t->token[i], &s->seq, &pos, NULL, NULL};
        float *h = t->hidden + (size_t)i * dim;
        if (decode_forward(d, &b, 0, s->le, h)) return -1;
        if (i == kcap) return 0;
        int tok = selfspec_draft_one(d, s, h, d->n_out + i, t->q ? t->q + (size_t)(i + 1) * V : NULL);
        if (tok == -2) return -1;
        if (tok < 0) return 0;
        t->token[i + 1] = tok;
        t->parent[i + 1] = i;
        t->sampled[i + 1] = !s->greedy;
        t->n = i + 2;
    }
}

static int selfspec_begin(DecodeCtx *d, const int32_t *prompt, int n_prompt, void **state) {
    SelfSpec *s = pd_alloc(sizeof *s);
    if (!s) return -1;
    Drafter dr = {s, NULL, selfspec_propose, NULL, selfspec_free, 0, -1, NULL, 0};
    if (selfspec_init(s, d)) {
        selfspec_free(&dr);
        return -1;
    }
    dr.exit_head = s->head;
    return drafter_begin(d, &dr, prompt, n_prompt, state);
}

const DecodeMethod method_selfspec = {.name = "self-speculative",
                                      .summary = "the first layers and an exit head draft, the full model verifies",
                                      .options = selfspec_options,
                                      .n_options = sizeof selfspec_options / sizeof selfspec_options[0],
                                      .options_size = sizeof(SelfSpecOptions),
                                      .needs = NEEDS_EXIT_HEADS,
                                      .samples = 1,
                                      .oracle = 1,
                                      .begin = selfspec_begin,
                                      .step = drafter_step,
                                      .finish = drafter_finish};
