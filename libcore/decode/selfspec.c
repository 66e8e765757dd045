/* selfspec.c — self-speculative decoding (Draft&Verify, Zhang et al. 2024; LayerSkip,
   Elhoushi et al. 2024): the target's own first Le layers plus the exit head at Le
   draft up to K tokens one at a time; one forward call over layers [Le, L) then
   verifies the whole chain, because every drafted token's layers [0, Le) are already
   in the KV cache and its hidden state after layer Le is kept.

   A round starts from: the KV cache full for positions < P, and x = the last accepted
   token, at P, not yet run. Drafting runs x, d1, d2, ... through [0, Le) (each one a
   1-token call, bit-identical to any batch by the forward pass's batch invariance) and
   asks the head for the next draft; verification runs [x, d1..dk] through [Le, L) and
   gives the final logits after each. Lossless: greedy accepts d_i only when it is the
   final argmax after d_{i-1}; sampling uses speculative sampling (accept with
   min(1, p/q), else resample from norm(max(0, p − q))). The round emits the accepted
   drafts plus one corrected (or bonus) token and cuts every layer of the KV cache to
   the accepted positions.

   How many drafts a round makes changes the speed only, never the output: drafting
   stops at draft_max, or when the head's max probability falls below gamma (a weak
   draft is likely rejected and costs Le layers for nothing). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "decode/method.h"

#define DEFAULT_DRAFT_MAX 4
#define DEFAULT_CONFIDENCE 0.5f
#define MAX_DRAFT 64

typedef struct {
    int le, head, kmax; /* exit layer, its head index, drafts per round at most */
    float conf;         /* keep drafting while the head's max prob ≥ conf */
    int greedy;
    float *hid;         /* [kmax+1][dim] hidden states of x, d1..dk after layer Le (then L) */
    float *lg;          /* [kmax+1][vocab] final logits (probabilities when sampling) */
    float *q;           /* [kmax][vocab] the distribution each draft was drawn from */
    float *hl;          /* [vocab] head logits, then the residual norm(max(0, p − q)) */
    int32_t tok[MAX_DRAFT + 1], pos[MAX_DRAFT + 1], seq[MAX_DRAFT + 1];
} Spec;

/* the middle head by default: a deeper head drafts better but costs more per draft;
   with heads at 1..4 of 5 layers that is layer 3, with 8/16/24 of 30 it is 16 */
static int pick_exit(const ExitHeads *h, int want) {
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

static int spec_init(Spec *s, DecodeCtx *d) {
    const MethodOptions *o = &d->opt;
    memset(s, 0, sizeof *s);
    if (!o->heads || o->heads->n < 1) return pd_error("self-speculative needs exit heads (--heads FILE)");
    if (o->draft_max < 0 || o->draft_max > MAX_DRAFT)
        return pd_error("self-speculative: draft-max %d is outside [0, %d]", o->draft_max, MAX_DRAFT);
    if (!(o->gamma >= 0 && o->gamma <= 1)) return pd_error("self-speculative: gamma %g is outside (0, 1]", o->gamma);
    if (o->oracle_rate < 0 || o->oracle_rate > 1 || (o->oracle_rate > 0 && !o->oracle))
        return pd_error("self-speculative: oracle rate %g needs a rate in [0, 1] and the oracle's tokens", o->oracle_rate);
    if ((s->head = pick_exit(o->heads, o->exit_layer)) < 0) return -1;
    s->le = o->heads->layer[s->head];
    if (s->le < 1 || s->le >= d->m->c.n_layers)
        return pd_error("self-speculative: exit layer %d is outside [1, %d)", s->le, d->m->c.n_layers);
    s->kmax = o->draft_max ? o->draft_max : DEFAULT_DRAFT_MAX;
    s->conf = o->gamma > 0 ? o->gamma : DEFAULT_CONFIDENCE;
    s->greedy = d->sampler->temp == 0;
    size_t dim = d->m->c.dim, V = d->m->c.vocab_size, n = s->kmax + 1;
    s->hid = pd_alloc(sizeof(float) * n * dim);
    s->lg = pd_alloc(sizeof(float) * n * V);
    s->q = pd_alloc(sizeof(float) * s->kmax * V);
    s->hl = pd_alloc(sizeof(float) * V);
    for (int i = 0; i <= s->kmax; i++) s->seq[i] = d->seq;
    return s->hid && s->lg && s->q && s->hl ? 0 : -1;
}

static void spec_free(Spec *s) {
    free(s->hid);
    free(s->lg);
    free(s->q);
    free(s->hl);
}

/* the draft after hidden state h (after layers [0, Le)) for output index `at`; q[V]
   gets the distribution it was drawn from (sampling only). Returns the token, -1 when
   the head is not confident enough to be worth a draft, -2 on error. */
static int draft_one(DecodeCtx *d, Spec *s, const float *h, int at, float *q) {
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
        int t = k_argmax(s->hl, V);
        float mx = s->hl[t], sum = 0;
        for (int i = 0; i < V; i++) sum += expf(s->hl[i] - mx);
        return 1 / sum >= s->conf ? t : -1; /* the argmax's softmax probability */
    }
    memcpy(q, s->hl, sizeof(float) * V);
    sampler_probs(d->sampler, q);
    float mx = q[k_argmax(q, V)];
    return mx >= s->conf ? sampler_pick(d->sampler, q, V, 1) : -1;
}

/* runs tok[0] = x at P and the drafts after it through [0, Le), keeping their hidden
   states; returns the number of drafts k (tok[1..k]), -1 on error */
static int draft(DecodeCtx *d, Spec *s, int P, int kcap) {
    int dim = d->m->c.dim, V = d->m->c.vocab_size;
    for (int i = 0;; i++) {
        s->pos[i] = P + i;
        Batch b = {1, &s->tok[i], &s->seq[i], &s->pos[i], NULL, NULL};
        float *h = s->hid + (size_t)i * dim;
        if (decode_forward(d, &b, 0, s->le, h)) return -1;
        if (i == kcap) return i;
        int t = draft_one(d, s, h, d->n_out + i, s->q + (size_t)i * V);
        if (t == -2) return -1;
        if (t < 0) return i;
        s->tok[i + 1] = t;
    }
}

/* how many of the k drafts verification keeps, and the token after them */
static int verify_greedy(const Spec *s, int k, int V, int *next) {
    int a = 0;
    while (a < k && k_argmax(s->lg + (size_t)a * V, V) == s->tok[a + 1]) a++;
    *next = k_argmax(s->lg + (size_t)a * V, V);
    return a;
}

static int verify_sample(DecodeCtx *d, Spec *s, int k, int V, int *next) {
    for (int a = 0; a <= k; a++) {
        float *p = s->lg + (size_t)a * V;
        sampler_probs(d->sampler, p);
        if (a == k) { /* every draft kept: the bonus token comes from p */
            *next = sampler_pick(d->sampler, p, V, 1);
            return a;
        }
        const float *q = s->q + (size_t)a * V;
        int t = s->tok[a + 1];
        if (sampler_uniform(d->sampler) * q[t] < p[t]) continue; /* u < min(1, p/q) */
        float *r = s->hl, total = 0; /* rejected: resample from norm(max(0, p − q)) */
        for (int i = 0; i < V; i++) total += r[i] = p[i] > q[i] ? p[i] - q[i] : 0;
        /* total ≥ q(t) − p(t) > 0 in exact arithmetic; should rounding leave nothing, p */
        *next = total > 0 ? sampler_pick(d->sampler, r, V, total) : sampler_pick(d->sampler, p, V, 1);
        return a;
    }
    *next = 0; /* not reached */
    return k;
}

static int generate(DecodeCtx *d, const int32_t *prompt, int n_prompt) {
    Spec s;
    if (spec_init(&s, d) || decode_prefill(d, prompt, n_prompt)) {
        spec_free(&s);
        return -1;
    }
    double t0 = pd_now();
    const Config *c = &d->m->c;
    int V = c->vocab_size, L = c->n_layers, rc = 0;
    const float *raw = decode_keep(d, 0, d->logits), *kept[MAX_DRAFT + 1];
    int x = sampler_sample(d->sampler, d->logits), P = n_prompt;
    int stop = decode_accept(d, prompt[n_prompt - 1], x, raw);
    while (!stop && P < c->seq_len) {
        /* drafts past the budget or the context would be thrown away */
        int kcap = s.kmax, room = d->max_new - d->n_out - 1;
        if (kcap > room) kcap = room;
        if (kcap > c->seq_len - 1 - P) kcap = c->seq_len - 1 - P;
        s.tok[0] = x;
        int k = draft(d, &s, P, kcap > 0 ? kcap : 0), next = 0, a;
        if (k < 0) goto fail;
        Batch b = {k + 1, s.tok, s.seq, s.pos, NULL, NULL};
        if (decode_forward(d, &b, s.le, L, s.hid) || final_logits(d->run, s.hid, k + 1, s.lg)) goto fail;
        d->target_passes++; /* the verification closes a pass through the whole model */
        for (int i = 0; i <= k; i++) kept[i] = decode_keep(d, i, s.lg + (size_t)i * V); /* logprobs */
        a = s.greedy ? verify_greedy(&s, k, V, &next) : verify_sample(d, &s, k, V, &next);
        d->drafted += k;
        d->rejected += k - a;
        d->early[s.head] += a;
        d->pending_sum += k;
        d->pending_n++;
        /* layers [0, Le) hold P+k+1 slots, [Le, L) too after verification; keep x, d1..da */
        if (kv_truncate(d->kv, d->seq, P + a + 1)) goto fail;
        int prev = x;
        for (int i = 1; i <= a && !stop; i++) {
            stop = decode_accept(d, prev, s.tok[i], kept[i - 1]);
            prev = s.tok[i];
        }
        if (!stop) stop = decode_accept(d, prev, next, kept[a]);
        x = next;
        P += a + 1;
    }
    goto done;
fail:
    rc = -1;
done:
    d->t_decode += pd_now() - t0;
    spec_free(&s);
    return rc;
}

const DecodeMethod method_selfspec = {"self-speculative",
                                      "the first layers and an exit head draft, the full model verifies", generate};
