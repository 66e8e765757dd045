/* speculative.c — draft-model speculative decoding (Leviathan et al. 2023; Chen et al.
   2023): a smaller model with the same vocabulary drafts a chain of k tokens, one
   1-token forward call each, and the drafter loop verifies the chain in one forward
   call of the target. Greedy drafts are the draft's argmax; sampled ones are drawn from
   the draft's distribution q (the target's temperature, top-k and top-p applied to the
   draft's logits), which the loop's rejection sampling (accept with min(1, p/q), else
   resample from norm(max(0, p − q))) needs to stay lossless.

   The draft keeps its own KV cache (one sequence). A round starts with the cache full
   for the positions before the root x (the last accepted token, at P) except for
   `pend`, the accepted tokens it has not run yet; drafting runs pend + x in one call,
   then each draft but the last. After verification the cache is cut to the accepted
   path, and an accepted last draft (never run) becomes pending.

   Draft length k adapts (unless fixed): start at 3, +1 after 5 rounds in a row with
   more than 80 % of the drafts accepted, −1 after 3 rounds in a row under 50 %, within
   [draft_min, draft_max]. The loop's size controller may still verify fewer nodes. */
#include <stdlib.h>
#include <string.h>

#include "decode/drafter.h"

#define START_K 3
#define DEFAULT_MAX 8
#define MAX_K 32    /* --draft-max at most */
#define UP_ROUNDS 5 /* rounds in a row with acceptance > UP_RATE before k grows */
#define UP_RATE 0.8
#define DOWN_ROUNDS 3 /* rounds in a row with acceptance < DOWN_RATE before k shrinks */
#define DOWN_RATE 0.5
#define CHUNK 64      /* tokens one draft forward call takes at most */
#define KEEP 8        /* tokens the draft keeps when it forgets a backlog */
#define KEEP_COSTLY 2 /* ... when it reads over a tenth of the target's weights a token */

typedef struct {
    Model *m;    /* the draft */
    Runner *run; /* its forward workspace */
    KVCache kv;
    int seq, kv_ok;
    int len;   /* the draft's cache holds slots [0, len), positions shift.. */
    int shift; /* the position of slot 0: after a long run of plain steps the
                            draft forgets all but the last `keep` tokens (see forget) */
    int keep;
    int32_t pend[CHUNK]; /* accepted tokens at len.. it has not run yet */
    int n_pend;
    int off;      /* past the draft's context: no more drafts */
    int proposed; /* drafts this round (0: a plain step, or none made) */
    int k, kmin, kmax, fixed, up, down;
    float rate; /* oracle (benchmarks) */
    const int32_t *oracle;
    float *hid;        /* [CHUNK][draft dim] */
    const float *last; /* [dim] in hid: the last token run's state, where the next draft comes from */
    int32_t pos[CHUNK], seqs[CHUNK];
} Spec;

/* runs n tokens at positions len.. through the draft; the last one's state is kept
   (s->last) when want_logits */
static int draft_run(Spec *s, const int32_t *tok, int n, int want_logits) {
    int dim = s->m->c.dim;
    for (int at = 0, take; at < n; at += take) {
        take = n - at < CHUNK ? n - at : CHUNK;
        for (int i = 0; i < take; i++) s->pos[i] = s->shift + s->len + i;
        Batch b = {take, tok + at, s->seqs, s->pos, NULL, NULL};
        if (forward_layers(s->run, &s->kv, &b, 0, s->m->c.n_layers, s->hid)) return -1;
        s->len += take;
        if (want_logits && at + take == n) s->last = s->hid + (size_t)(take - 1) * dim;
    }
    return 0;
}

/* an accepted token the draft has not run (one slot stays free for the root, which
   propose runs along). A full backlog means the loop has been taking plain steps for a
   while (drafting does not pay): catching the draft up on all of it would cost what the
   plain steps save, so the draft forgets its cache and keeps the last `keep` tokens at
   their positions — a draft with a shorter memory, never a wrong output. A probe
   after plain steps (propose with a backlog over `keep`) forgets the same way. A draft
   whose step costs a good part of the target's keeps only KEEP_COSTLY: there the
   probe's catch-up would cost more than the plain steps around it save */
static int forget(Spec *s) {
    s->shift += s->len + s->n_pend - s->keep;
    s->len = 0;
    memmove(s->pend, s->pend + s->n_pend - s->keep, sizeof(int32_t) * s->keep);
    s->n_pend = s->keep;
    return kv_truncate(&s->kv, s->seq, 0);
}

static int push_pending(Spec *s, int32_t tok) {
    if (s->n_pend == CHUNK - 1 && forget(s)) return -1;
    s->pend[s->n_pend++] = tok;
    if (s->shift + s->len + s->n_pend >= s->m->c.seq_len) s->off = 1; /* the next draft would not fit */
    return 0;
}

/* the draft at depth j+1 from the draft's last state through its row ops: the oracle's
   token (a point mass), the argmax, or a sample from q (row node of t->q); -1 on error */
static int pick(Spec *s, DecodeCtx *d, DraftTree *t, int node, int j) {
    int V = d->m->c.vocab_size, at = d->n_out + j;
    t->sampled[node] = 0;
    if (s->oracle && at < d->max_new && sampler_uniform(d->sampler) < s->rate) {
        int tok = s->oracle[at];
        if (tok >= 0 && tok < V) return tok; /* past the standard text's end: the draft's own */
    }
    if (d->sampler->temp == 0) {
        int32_t id;
        return logits_argmax(s->run, s->last, 1, &id) ? -1 : id;
    }
    float *q = t->q + (size_t)node * V;
    if (logits_softmax_temp(s->run, s->last, 1, d->sampler->temp, q)) return -1;
    sampler_truncate(d->sampler, q);
    t->sampled[node] = 1;
    return sampler_pick(d->sampler, q, V, 1);
}

static int spec_propose(Drafter *dr, DecodeCtx *d, DraftTree *t, int max_nodes, int max_depth) {
    Spec *s = dr->self;
    int P = s->shift + s->len + s->n_pend; /* the root's position */
    int k = s->k < max_nodes - 1 ? s->k : max_nodes - 1;
    if (k > max_depth) k = max_depth;
    if (k > s->m->c.seq_len - P) k = s->m->c.seq_len - P; /* the draft runs positions P .. P+k-1 */
    s->proposed = 0;
    if (s->off || k < 1) return 0;
    if (s->n_pend > s->keep && forget(s)) return -1; /* a probe after plain steps: catch up cheaply */
    s->pend[s->n_pend++] = t->token[0];              /* push_pending left room for it */
    int rc = draft_run(s, s->pend, s->n_pend, 1);
    s->n_pend = 0;
    for (int j = 0; !rc && j < k; j++) {
        int node = j + 1;
        if ((t->token[node] = pick(s, d, t, node, j)) < 0) return -1;
        t->parent[node] = j;
        if (j + 1 < k) rc = draft_run(s, &t->token[node], 1, 1); /* the last draft is not run */
    }
    if (rc) return -1;
    t->n = k + 1;
    s->proposed = k;
    return 0;
}

/* the length rule: k from the share of this round's drafts that were accepted */
static void spec_adapt(Spec *s, int kept, int drafted) {
    if (s->fixed || drafted < 1) return;
    double r = (double)kept / drafted;
    s->up = r > UP_RATE ? s->up + 1 : 0;
    s->down = r < DOWN_RATE ? s->down + 1 : 0;
    if (s->up == UP_ROUNDS) {
        if (s->k < s->kmax) s->k++;
        s->up = 0;
    }
    if (s->down == DOWN_ROUNDS) {
        if (s->k > s->kmin) s->k--;
        s->down = 0;
    }
}

static int spec_start(Drafter *dr, DecodeCtx *d, const int32_t *prompt, int n_prompt, const float *hidden) {
    (void)d, (void)hidden;
    Spec *s = dr->self;
    if (n_prompt >= s->m->c.seq_len) { /* the target's context may be the longer one */
        s->off = 1;
        return 0;
    }
    return draft_run(s, prompt, n_prompt, 0);
}

static int spec_accepted(Drafter *dr, DecodeCtx *d, const DraftTree *t, const int *path, int n_path, int next,
                         const float *hidden, const int32_t *ids) {
    (void)d, (void)path, (void)next, (void)hidden, (void)ids;
    Spec *s = dr->self;
    if (s->off) return 0;
    int k = s->proposed, kept = n_path - 1;
    s->proposed = 0;
    if (!k) return push_pending(s, t->token[0]); /* a plain step: the root was never run */
    /* the cache holds x, d1 .. d(k-1) at P .. P+k-1 (P = len - k); x, d1 .. d(kept) stay */
    int P = s->len - k;
    if (kept < k) {
        s->len = P + kept + 1;
        if (kv_truncate(&s->kv, s->seq, s->len)) return -1;
    }
    spec_adapt(s, kept, k);
    return kept == k ? push_pending(s, t->token[k]) : 0;
}

static void spec_free(Drafter *dr) {
    Spec *s = dr->self;
    if (!s) return;
    if (s->kv_ok) kv_free(&s->kv);
    runner_free(s->run);
    free(s->hid);
    free(s);
}

typedef struct {
    int draft_min, draft_max, draft_fixed;
} SpecOptions;

static const MethodOption spec_options[] = {
    {"draft-min", OPT_INT, 1, MAX_K, "K", "1", "drafts per round at least", offsetof(SpecOptions, draft_min), 0, NULL},
    {"draft-max", OPT_INT, 1, MAX_K, "K", "8", "drafts per round at most", offsetof(SpecOptions, draft_max), 0, NULL},
    {"draft-fixed", OPT_SWITCH, 0, 0, NULL, NULL, "always --draft-max drafts (no adaptation)",
     offsetof(SpecOptions, draft_fixed), 0, NULL},
    DRAFTER_OPTIONS,
};

/* the options, checked; k's range and start */
static int spec_check_options(Spec *s, const DecodeCtx *d) {
    static const SpecOptions spec_none;
    const SpecOptions *o = d->mopt ? d->mopt : &spec_none;
    const MethodShared *sh = &d->opt;
    char why[160];
    if (sh->draft->c.vocab_size != d->m->c.vocab_size || !tok_same_vocab(d->m->tok, sh->draft->tok, why, sizeof why))
        return pd_error("speculative: the draft's vocabulary is not the target's: %s",
                        sh->draft->c.vocab_size != d->m->c.vocab_size ? "their sizes differ" : why);
    s->kmin = o->draft_min ? o->draft_min : 1;
    s->kmax = o->draft_max ? o->draft_max : s->kmin > DEFAULT_MAX ? s->kmin : DEFAULT_MAX;
    if (s->kmin > s->kmax) return pd_error("speculative: --draft-min %d is above --draft-max %d", s->kmin, s->kmax);
    s->fixed = o->draft_fixed;
    s->k = s->fixed ? s->kmax : START_K < s->kmin ? s->kmin : START_K > s->kmax ? s->kmax : START_K;
    s->rate = sh->oracle_rate;
    s->oracle = sh->oracle_rate > 0 ? sh->oracle : NULL;
    return 0;
}

static int spec_begin(DecodeCtx *d, const int32_t *prompt, int n_prompt, void **state) {
    Spec *s = pd_alloc(sizeof *s);
    if (!s) return -1;
    Drafter dr = {s, spec_start, spec_propose, spec_accepted, spec_free, 0, -1, NULL, 0};
    if (spec_check_options(s, d)) {
        spec_free(&dr);
        return -1;
    }
    s->m = d->opt.draft;
    s->keep = model_weight_bytes(s->m) * 10 > model_weight_bytes(d->m) ? KEEP_COSTLY : KEEP;
    const Config *c = &s->m->c;
    s->hid = pd_alloc(pd_mul(pd_mul(sizeof(float), CHUNK), c->dim));
    s->run = runner_new(s->m);
    s->kv_ok = s->hid && s->run && !kv_init(&s->kv, c, 1, c->seq_len, 16);
    if (!s->kv_ok || (s->seq = kv_seq_new(&s->kv)) < 0) {
        spec_free(&dr);
        return -1;
    }
    for (int i = 0; i < CHUNK; i++) s->seqs[i] = s->seq;
    return drafter_begin(d, &dr, prompt, n_prompt, state);
}

const DecodeMethod method_speculative = {.name = "speculative",
                                         .summary =
                                             "a smaller model with the same vocabulary drafts, the model verifies",
                                         .options = spec_options,
                                         .n_options = sizeof spec_options / sizeof spec_options[0],
                                         .options_size = sizeof(SpecOptions),
                                         .needs = NEEDS_DRAFT,
                                         .samples = 1,
                                         .oracle = 1,
                                         .begin = spec_begin,
                                         .step = drafter_step,
                                         .finish = drafter_finish};
