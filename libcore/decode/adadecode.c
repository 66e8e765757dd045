/* adadecode.c — AdaDecode (Wei et al., ICML 2025): adaptive layer parallelism.

   The youngest position runs layer by layer; at each head layer its exit head may
   be confident enough (max prob ≥ γ) to emit the next token early. The next position
   then starts at once, while the early one waits at its exit layer with its hidden
   state; when the new position reaches that layer they go on together, one batched
   forward_layers call per layer range. A position that reaches the last layer is
   verified: its final distribution must give the token emitted early from it (greedy:
   the same argmax; sampling: accept with min(1, p/q), else resample from
   norm(max(0, p − q))); on a mismatch every later position and its KV entries go,
   and decoding goes on from the corrected token. Only verified tokens are streamed.

   Active positions are kept oldest first; their next layers never increase from old
   to young (a position cannot pass an older one: it needs the older one's KV).

   With two streams (the paper's schedule on a GPU), an early position does not wait:
   its remaining layers go at once to a second runner's stream, overlapping the next
   position's first layers on the first stream; the first stream waits for them (an
   event) before it runs any of those layers itself, and the host verifies the early
   token then. One such position is in flight at a time, always the oldest (index 0). On
   the CPU the same calls run one after another; a token's bits do not depend on which
   stream or batch computed it. */
#include <stddef.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "decode/accept.h"

#define MAX_ACTIVE 34 /* max_pending (≤ 32) + the youngest + one spare */

typedef struct {
    int32_t token; /* the position's input token */
    int pos;
    int layer; /* next layer to run */
    int head;  /* head that emitted the next token early, -1 when none */
} AdaSlot;

/* per-head bookkeeping for the controller that stops exits that do not pay */
typedef struct {
    int checks, exits, rejects; /* in the current window */
    int off_until;              /* no checks before this many emitted tokens */
    int backoff;
} HeadStat;

typedef struct {
    DecodeCtx *d;
    const ExitHeads *heads;
    int L, dim, vocab, n_prompt;
    float gamma;
    int max_pending;
    AdaSlot a[MAX_ACTIVE];
    int n;     /* active positions */
    float *h;  /* [MAX_ACTIVE][dim] hidden states, in active order */
    float *q;  /* [MAX_ACTIVE][vocab] head distributions (sampling) */
    float *hl; /* [vocab] head logits scratch */
    HeadStat stat[MAX_EXIT_HEADS];
    double head_cost; /* a head check in layer-equivalents of work */
    uint64_t rng;     /* the oracle's coin */
    int done;
    Runner *run2; /* two streams: the second, for the deferred layers */
    int deferred; /* position 0's layers from defer_from on are in flight on run2 */
    int defer_from;
} Ada;

static float *ada_slot_h(Ada *s, int i) { return s->h + (size_t)i * s->dim; }
static float *ada_slot_q(Ada *s, int i) { return s->q + (size_t)i * s->vocab; }

/* removes active positions [i, i+k) */
static void ada_drop(Ada *s, int i, int k) {
    memmove(&s->a[i], &s->a[i + k], sizeof(AdaSlot) * (s->n - i - k));
    memmove(ada_slot_h(s, i), ada_slot_h(s, i + k), sizeof(float) * s->dim * (s->n - i - k));
    memmove(ada_slot_q(s, i), ada_slot_q(s, i + k), sizeof(float) * s->vocab * (s->n - i - k));
    s->n -= k;
}

static void ada_push(Ada *s, int32_t token, int pos) {
    s->a[s->n] = (AdaSlot){token, pos, 0, -1};
    s->n++;
}

static int ada_pending(const Ada *s) {
    int k = 0;
    for (int i = 0; i < s->n; i++) k += s->a[i].head >= 0;
    return k;
}

static uint32_t ada_coin(Ada *s) {
    s->rng ^= s->rng << 13;
    s->rng ^= s->rng >> 7;
    s->rng ^= s->rng << 17;
    return (uint32_t)(s->rng >> 32);
}

/* accepts a verified token chosen from the final logits raw (decode_keep); 1 when
   generation must stop */
static int ada_commit(Ada *s, int prev, int token, const float *raw) {
    if (decode_accept(s->d, prev, token, raw)) s->done = 1;
    return s->done;
}

/* what the heads file says head k does on held-out text at γ (distill-heads records
   coverage and precision at 0.5, 0.75 and 0.9; in between, linear): the expected
   layer passes a check saves, net of the check and of the rejections. Without the
   records: optimistic, so the head gets probed. */
static double ada_prior_gain(const Ada *s, int k) {
    const float *G = exit_gamma;
    double c[EXIT_N_GAMMA], p[EXIT_N_GAMMA];
    char key[EXIT_KEY_MAX];
    for (int i = 0; i < EXIT_N_GAMMA; i++) {
        const char *cv = tf_meta(&s->heads->tf, exit_record_key(key, s->heads->layer[k], "cover", i));
        const char *pv = tf_meta(&s->heads->tf, exit_record_key(key, s->heads->layer[k], "precision", i));
        if (!cv || !pv) return 1;
        c[i] = atof(cv);
        p[i] = atof(pv);
    }
    int i = s->gamma <= G[1] ? 0 : 1;
    double t = (s->gamma - G[i]) / (G[i + 1] - G[i]);
    t = t < 0 ? 0 : t > 1 ? 1 : t;
    double cover = c[i] + t * (c[i + 1] - c[i]), prec = p[i] + t * (p[i + 1] - p[i]);
    int skip = s->L - s->heads->layer[k];
    return cover * prec * skip - cover * (1 - prec) * s->L - s->head_cost;
}

/* the window of a head's checks is judged: exits must save more layer work than the
   checks and the rejections cost, or the head rests (longer each time) */
static void ada_judge(Ada *s, int k) {
    HeadStat *st = &s->stat[k];
    if (st->checks < 16) return;
    double saved = (double)(st->exits - st->rejects) * (s->L - s->heads->layer[k]);
    double cost = st->checks * s->head_cost + (double)st->rejects * s->L;
    if (saved > cost) st->backoff = 0;
    else {
        st->backoff = st->backoff ? 2 * st->backoff : 64;
        st->off_until = s->d->n_out + st->backoff;
    }
    st->checks = st->exits = st->rejects = 0;
}

/* may the youngest position exit at head k now? (a resting head is not even run, and
   then its layer does not split the forward call) */
static int ada_may_exit(const Ada *s, int k) {
    const DecodeCtx *d = s->d;
    const AdaSlot *y = &s->a[s->n - 1];
    if (y->head >= 0 || ada_pending(s) >= s->max_pending || d->n_out + ada_pending(s) + 1 >= d->max_new) return 0;
    if (y->pos + 1 >= d->m->c.seq_len) return 0;
    if (d->opt.oracle) return k == s->heads->n / 2; /* the oracle exits at the middle head */
    return d->n_out >= s->stat[k].off_until;
}

/* head k's check of position y over the whole vocabulary: the token to emit, -1 none, -2
   an error; q, the slot's distribution, is the head's as sampled */
static int32_t ada_check(Ada *s, int k, int y) {
    DecodeCtx *d = s->d;
    if (head_logits(d->m, s->heads, k, ada_slot_h(s, y), 1, s->hl)) return -2;
    float *q = ada_slot_q(s, y);
    int32_t tok; /* confidence: the head's own distribution */
    if (rows_softmax(d->run, s->hl, 1, s->vocab, 1, q) || rows_argmax(d->run, q, 1, s->vocab, &tok)) return -2;
    if (q[tok] < s->gamma || decode_is_end(d, tok)) return -1;
    if (d->sampler->temp > 0) { /* sampling: draw from q = the head's distribution as sampled */
        if (rows_softmax(d->run, s->hl, 1, s->vocab, d->sampler->temp, q)) return -2;
        tok = sampler_draw(d->sampler, q);
        if (rows_softmax(d->run, s->hl, 1, s->vocab, d->sampler->temp, q)) return -2;
        sampler_truncate(d->sampler, q);
    }
    return tok;
}

/* q over the vocabulary from p over the check vocabulary and the rest: the rest's share
   spread evenly over the tokens outside it (a distribution, as the rejection rule needs) */
static void ada_spread(const Ada *s, const float *p, float *q) {
    int K = s->heads->n_vocab;
    float other = p[K] / (float)(s->vocab - K);
    for (int v = 0; v < s->vocab; v++) q[v] = other;
    for (int i = 0; i < K; i++) q[s->heads->vocab[i]] = p[i];
}

/* the same check over the heads' check vocabulary: its K + 1 logits, not the vocabulary's;
   "the rest" as the most likely never exits */
static int32_t ada_check_vocab(Ada *s, int k, int y) {
    DecodeCtx *d = s->d;
    int K = s->heads->n_vocab;
    float *lg = s->hl, *p = s->hl + K + 1, *q = ada_slot_q(s, y);
    int32_t arg, tok;
    if (head_check(d->m, s->heads, k, ada_slot_h(s, y), 1, lg) || rows_softmax(d->run, lg, 1, K + 1, 1, p) ||
        rows_argmax(d->run, p, 1, K + 1, &arg))
        return -2;
    if (arg == K || p[arg] < s->gamma || decode_is_end(d, tok = s->heads->vocab[arg])) return -1;
    if (d->sampler->temp > 0) {
        if (rows_softmax(d->run, lg, 1, K + 1, d->sampler->temp, p)) return -2;
        ada_spread(s, p, q);
        tok = sampler_draw(d->sampler, q);
        ada_spread(s, p, q);
        sampler_truncate(d->sampler, q);
    }
    return tok;
}

/* the youngest position is at head layer `layer`: exit early? returns the token, or -1 */
static int ada_try_exit(Ada *s, int layer) {
    DecodeCtx *d = s->d;
    int k = heads_find(s->heads, layer), y = s->n - 1;
    if (k < 0 || !ada_may_exit(s, k)) return -1;
    if (d->opt.oracle) { /* benchmarks: an oracle right with probability rate */
        int idx = s->a[y].pos + 1 - s->n_prompt;
        if (idx >= d->max_new || ada_coin(s) >= d->opt.oracle_rate * 4294967296.0) return -1;
        s->a[y].head = k;
        s->stat[k].exits++;
        return d->opt.oracle[idx];
    }
    s->stat[k].checks++;
    int32_t tok = s->heads->n_vocab ? ada_check_vocab(s, k, y) : ada_check(s, k, y);
    if (tok < 0) return tok;
    s->a[y].head = k;
    s->stat[k].exits++;
    return tok;
}

/* position i reached the last layer: id its argmax (greedy), lg its decode_rows row
   (probabilities when is_probs): verify the token emitted early from it (if any) or
   sample its successor. 1: a rejection rolled back, -1 an error */
static int ada_settle(Ada *s, int i, float *lg, int is_probs, int id) {
    DecodeCtx *d = s->d;
    AdaSlot *sl = &s->a[i];
    int greedy = d->sampler->temp == 0, next;
    const float *raw = decode_keep(d, 0, lg);
    if (!greedy && decode_row_probs(d, lg, is_probs)) return -1;
    if (sl->head < 0) { /* no early token: the successor comes from the final distribution */
        next = greedy ? id : sampler_pick(d->sampler, lg, s->vocab, 1);
        if (!ada_commit(s, sl->token, next, raw)) ada_push(s, next, sl->pos + 1);
        return 0;
    }
    int early = s->a[i + 1].token, ok;
    d->drafted++;
    if (greedy) {
        next = id;
        ok = next == early;
    } else {
        /* a rejection draws from norm(max(0, p − q)), or from p should rounding leave nothing */
        next = accept_one(d->sampler, lg, ada_slot_q(s, i), early, s->hl, s->vocab, &ok);
    }
    if (ok) {
        d->early[sl->head]++;
        ada_commit(s, sl->token, early, raw);
        return 0;
    }
    d->rejected++;
    s->stat[sl->head].rejects++;
    int pos = sl->pos;
    ada_drop(s, i + 1, s->n - i - 1); /* every later position and its KV entries go */
    kv_truncate(d->kv, d->seq, pos + 1);
    if (!ada_commit(s, sl->token, next, raw)) ada_push(s, next, pos + 1);
    return 1;
}

/* two streams: position 0's deferred layers have been waited for (or are waited for
   now): its final rows, and its early token verified. 1: a rejection rolled back */
static int ada_collect(Ada *s) {
    DecodeCtx *d = s->d;
    int32_t id;
    s->deferred = 0;
    if (forward_wait(s->run2, ada_slot_h(s, 0), 1)) return -1;
    int probs = decode_rows(d, ada_slot_h(s, 0), 1, d->logits, &id, 0);
    int rolled = probs < 0 ? -1 : ada_settle(s, 0, d->logits, probs, id);
    if (rolled >= 0) ada_drop(s, 0, 1);
    return rolled;
}

/* two streams: the youngest exited early at layer e; its last layers go to run2, after
   the one position in flight there has been verified. 1: that one was rejected, and the
   youngest went with it */
static int ada_defer(Ada *s, int e) {
    DecodeCtx *d = s->d;
    int rolled = s->deferred ? ada_collect(s) : 0;
    if (rolled || s->done) return rolled;
    AdaSlot *a = &s->a[s->n - 1];
    Batch b = {1, &a->token, &d->seq, &a->pos, NULL, NULL};
    if (forward_submit(s->run2, d->kv, &b, e, s->L, ada_slot_h(s, s->n - 1))) return -1;
    d->layer_passes += s->L - e;
    d->token_layers += s->L - e;
    a->layer = s->L;
    s->deferred = 1, s->defer_from = e;
    return 0;
}

/* one batched call: the trailing group of positions at the same layer runs to the
   next boundary (a head layer, the last layer, or the next older position's layer) */
static int ada_step(Ada *s) {
    DecodeCtx *d = s->d;
    int y = s->n - 1, m = s->a[y].layer, g0 = y;
    while (g0 > 0 && s->a[g0 - 1].layer == m) g0--;
    int e = s->L;
    for (int k = 0; k < s->heads->n; k++)
        if (s->heads->layer[k] > m && s->heads->layer[k] < e && ada_may_exit(s, k)) e = s->heads->layer[k];
    if (g0 > 0 && s->a[g0 - 1].layer < e) e = s->a[g0 - 1].layer;
    int g = s->n - g0, tok[MAX_ACTIVE], pos[MAX_ACTIVE], seq[MAX_ACTIVE];
    for (int i = 0; i < g; i++) tok[i] = s->a[g0 + i].token, pos[i] = s->a[g0 + i].pos, seq[i] = d->seq;
    Batch b = {g, tok, seq, pos, NULL, NULL};
    /* two streams: layers past the deferred position's exit need its KV from run2 */
    int wait = s->deferred && e > s->defer_from;
    if (wait && runner_after(d->run, s->run2)) return -1;
    if (decode_forward(d, &b, m, e, ada_slot_h(s, g0))) return -1;
    for (int i = g0; i < s->n; i++) s->a[i].layer = e;
    d->pending_sum += ada_pending(s);
    d->pending_n++;
    if (wait) { /* run2 has finished: verify now, before the group goes on */
        int rolled = ada_collect(s);
        if (rolled || s->done) return rolled < 0 ? -1 : 0;
        g0--;
    }
    if (e == s->L) {
        int32_t ids[MAX_ACTIVE];
        int probs = decode_rows(d, ada_slot_h(s, g0), g, d->logits, ids, 0);
        if (probs < 0) return -1;
        for (int i = 0; i < g && !s->done; i++) {
            int rolled = ada_settle(s, g0, d->logits + (size_t)i * s->vocab, probs, ids[i]);
            if (rolled < 0) return -1;
            ada_drop(s, g0, 1); /* position done: its KV is complete */
            if (rolled) break;
        }
        return 0;
    }
    int tok_early = s->a[s->n - 1].head < 0 ? ada_try_exit(s, e) : -1;
    if (tok_early == -2) return -1;
    if (tok_early >= 0 && s->run2) {
        int k = s->a[s->n - 1].head, rolled = ada_defer(s, e);
        if (rolled < 0) return -1;
        if (rolled || s->done) { /* the exit went with its position: it never counted */
            s->stat[k].exits--;
            return 0;
        }
    }
    if (tok_early >= 0) ada_push(s, tok_early, s->a[s->n - 1].pos + 1);
    for (int k = 0; k < s->heads->n; k++) ada_judge(s, k);
    return 0;
}

typedef struct {
    float gamma;
    int max_pending;
    int streams;
} AdaOptions;

static const MethodOption ada_options[] = {
    {"gamma", OPT_FLOAT, 1e-6, 1, "G", "0.75", "exit at a head whose top probability is ≥ G",
     offsetof(AdaOptions, gamma), 0, NULL},
    {"max-pending", OPT_INT, 1, MAX_ACTIVE - 2, "K", "5", "unverified early tokens at most",
     offsetof(AdaOptions, max_pending), 0, NULL},
    {"streams", OPT_INT, 1, 2, "S", "2 on a GPU, 1 elsewhere",
     "2: an early token's last layers run on a second stream at once; 1: batched with the next token's",
     offsetof(AdaOptions, streams), 0, NULL},
};

static int ada_begin(DecodeCtx *d, const int32_t *prompt, int n_prompt, void **state) {
    static const AdaOptions ada_none;
    const AdaOptions *o = d->mopt ? d->mopt : &ada_none;
    Ada *s = pd_alloc(sizeof *s);
    if (!(*state = s)) return -1;
    *s = (Ada){.d = d,
               .heads = d->opt.heads,
               .L = d->m->c.n_layers,
               .dim = d->m->c.dim,
               .vocab = d->m->c.vocab_size,
               .n_prompt = n_prompt,
               .gamma = o->gamma > 0 ? o->gamma : 0.75f,
               .max_pending = o->max_pending > 0 ? o->max_pending : 5,
               .rng = 0x2545F4914F6CDD1Dull};
    if (s->max_pending > MAX_ACTIVE - 2) s->max_pending = MAX_ACTIVE - 2;
    int streams = o->streams ? o->streams : strcmp(runner_kind(d->run), "cuda") ? 1 : 2;
    if (streams == 2 && !(s->run2 = runner_new(d->m))) return pd_error_prefix("adadecode: a second stream");
    const Config *c = &d->m->c;
    double layer = 2.0 * c->dim * (c->n_heads + c->n_kv_heads) * c->head_dim + 3.0 * c->dim * c->hidden_dim;
    /* a check: the head's two products, and one more forward call split off (about a
       tenth of a layer in fixed costs, measured on stories260K) */
    int rows = s->heads->n_vocab ? s->heads->n_vocab + 1 : c->vocab_size; /* the check's logits */
    s->head_cost = ((double)c->dim * c->dim + (double)rows * c->dim) / layer + 0.1;
    for (int k = 0; k < s->heads->n; k++) /* heads that cannot pay rest from the start */
        if (!d->opt.oracle && ada_prior_gain(s, k) <= 0) s->stat[k].off_until = s->stat[k].backoff = 256;
    s->h = pd_alloc(sizeof(float) * MAX_ACTIVE * s->dim);
    s->q = pd_alloc(sizeof(float) * MAX_ACTIVE * s->vocab);
    s->hl = pd_alloc(sizeof(float) * (s->vocab > 2 * rows ? s->vocab : 2 * rows)); /* check vocabulary: p after lg */
    const float *raw;
    int next;
    if (!s->h || !s->q || !s->hl || decode_prefill_hidden(d, prompt, n_prompt) ||
        decode_choose(d, d->hidden, &raw, &next))
        return -1;
    if (!ada_commit(s, prompt[n_prompt - 1], next, raw)) ada_push(s, next, n_prompt);
    return 0;
}

/* one batched forward call (ada_step); over at the end, the budget or a full context */
static int ada_run_step(DecodeCtx *d, void *state) {
    Ada *s = state;
    if (s->done || s->n <= 0 || s->a[s->n - 1].pos >= d->m->c.seq_len) return 1;
    if (ada_step(s)) return -1;
    return s->done || s->n <= 0 || s->a[s->n - 1].pos >= d->m->c.seq_len;
}

static void ada_finish(DecodeCtx *d, void *state) {
    (void)d;
    Ada *s = state;
    if (!s) return;
    runner_free(s->run2);
    free(s->h);
    free(s->q);
    free(s->hl);
    free(s);
}

const DecodeMethod method_adadecode = {
    .name = "adadecode",
    .summary = "early exits at confident heads, deferred layers batched or on a second stream, verified",
    .options = ada_options,
    .n_options = sizeof ada_options / sizeof ada_options[0],
    .options_size = sizeof(AdaOptions),
    .needs = NEEDS_EXIT_HEADS,
    .samples = 1,
    .oracle = 1,
    .begin = ada_begin,
    .step = ada_run_step,
    .finish = ada_finish};
