/* drafter.c — the verify loop every drafter runs in (see drafter.h): propose a tree,
   verify it in one forward call, keep the longest path the model agrees with, and
   let the round size controller choose how much of the tree is worth verifying. */
#include "drafter.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the round size controller ----
   Bucket b verifies at most 2^b nodes; bucket 0 is a plain step that asks the drafter
   for nothing. Two things decide the best bucket, both measured as the text goes:
   - what a round of each bucket yields: because the drafter orders its nodes so that
     every prefix is a tree, a round that verified n nodes also tells what any smaller
     bucket would have kept (the accepted path cut at the first node past the prefix;
     exact for greedy). Acceptance comes in streaks, so averages of each bucket's own
     yield, taken over different rounds, compare badly; what is averaged instead is
     each bucket's gain over the next smaller one within the same round, and a
     bucket's yield is the sum of the gains up to it. A plain round yields one token;
   - what a round costs: a plain step's seconds and each drafting bucket's seconds
     (moving averages), and for buckets not yet timed twice a straight line a + b·n in
     the nodes run, fitted to all drafting rounds (decaying least squares). Drafting
     rounds pay what plain ones do not — heads, a draft model, the walk — which both
     carry. No round counts as more than OUTLIER times what its kind was expected to
     take, so one that another process delayed does not skew the costs for long.
   The loop starts with a 2-node look and a plain step, and looks at 4 nodes next
   when the 2-node round cost under CHEAP plain steps. Then it uses the bucket with
   the most tokens per second; once drafting pays, a cheap bigger bucket seen in few
   rounds is credited HOPE/√rounds tokens more than measured, so that a close call
   is looked at again (where verifying costs little more than a plain step, as on a
   model that streams its weights from memory, the bigger trees are where the gain
   is). Now and then it probes two buckets up (one, from plain steps: a cheap look); a
   probe that does not win makes the wait before the next one four times longer (up
   to PROBE_MAX rounds), so a drafter that never pays costs little more than plain
   steps. A probe that cost under CHEAP plain steps lost little, so the wait after it
   stays PROBE: a drafter whose guesses get better as the text goes on (prompt lookup,
   once the text starts repeating itself) is looked at again in time. */
#define N_BUCKETS 8 /* 1 .. 128 nodes */
#define PROBE 8
#define PROBE_MAX 256
#define EMA_TOK 0.1
#define EMA_SEC 0.1
#define DECAY 0.97   /* of the cost fit's sums, per round */
#define OUTLIER 1.25
#define HOPE 0.2
#define CHEAP 1.35   /* a round under this many plain steps is cheap to look at */

typedef struct {
    double gain[N_BUCKETS];/* tokens a round of bucket b keeps beyond what bucket b-1's
                              prefix of it keeps, on average */
    double size[N_BUCKETS];/* nodes a round of bucket b runs, on average (drafters often
                              propose fewer than the bucket allows) */
    int seen[N_BUCKETS];
    double sec[N_BUCKETS];       /* seconds a round of bucket b took, on average */
    int timed[N_BUCKETS];        /* rounds of bucket b timed */
    double sw, sn, snn, st, snt; /* decayed sums for the drafting rounds' cost line */
    double plain;                /* seconds of a plain round, on average */
    int cur, top;   /* the bucket in use, the largest allowed */
    long round, wait, next; /* rounds so far, between probes, the next probe */
    int fixed;      /* verify the whole proposal, always (benchmarks, tests) */
} Sizer;

static void sizer_init(Sizer *z, int fixed) {
    memset(z, 0, sizeof *z);
    z->fixed = fixed;
    z->top = N_BUCKETS - 1;
    z->gain[0] = z->size[0] = 1;
    z->seen[0] = 1;
    z->wait = z->next = PROBE;
}

/* seconds of a round of bucket b running n nodes: a plain step's, the bucket's own
   average once it has two rounds, else the drafting rounds' line (their mean before
   two sizes are seen) */
static double sizer_cost(const Sizer *z, int bucket, double n) {
    if (bucket > 0 && z->timed[bucket] >= 2) return z->sec[bucket];
    if (bucket == 0 || z->sw <= 0) return z->plain > 0 ? z->plain * n : 1;
    double det = z->sw * z->snn - z->sn * z->sn;
    if (det <= 1e-12 * z->sw * z->snn) return z->st / z->sw;
    double b = (z->sw * z->snt - z->sn * z->st) / det, a = (z->st - b * z->sn) / z->sw;
    if (b < 0) b = 0;
    if (a < 1e-9) a = 1e-9;
    return a + b * n;
}

static int best_bucket(const Sizer *z) {
    int best = 0;
    double br = 0, tok = 0, below = 0;
    for (int b = 0; b <= z->top && z->seen[b]; b++) { /* a round of bucket b sees all below */
        tok += z->gain[b];
        double c = sizer_cost(z, b, z->size[b]), r = tok / c;
        /* once drafting pays, a cheap bigger tree seen in few rounds is given the benefit of the doubt */
        if (b >= 2 && below * z->plain > 1 && c < CHEAP * z->plain) r = (tok + HOPE / sqrt(z->seen[b])) / c;
        if (r > br) br = r, best = b;
        below = tok / c;
    }
    return best;
}

static int sizer_pick(Sizer *z) {
    if (z->fixed) return z->top;
    if (z->round == 0) return 1;                        /* 2 nodes: a cheap first look */
    if (z->round == 1) return 0;                        /* a plain step: the cost line */
    if (z->round == 2 && z->top >= 2 && sizer_cost(z, 1, 2) < CHEAP * z->plain) return 2; /* cheap: 4 nodes */
    if (z->round < z->next) return z->cur;
    int up = z->cur ? z->cur + 2 : 1; /* from plain steps, the cheapest drafting round */
    return up <= z->top ? up : z->top;
}

/* a round of bucket b ran n nodes (side nodes included), kept the path, took sec
   seconds; a round whose drafter proposed nothing was a plain step */
static void sizer_update(Sizer *z, int b, const int *path, int n_path, int n, double sec) {
    if (z->fixed) return;
    double expect = b == 0 ? z->plain : z->sw > 0 || z->timed[b] >= 2 ? sizer_cost(z, b, n) : 0;
    if (expect > 0 && sec > OUTLIER * expect) sec = OUTLIER * expect;
    if (b == 0) {
        z->plain = z->plain > 0 ? z->plain + EMA_SEC * (sec - z->plain) : sec;
    } else {
        double w = 1.0 / ++z->timed[b], a = w > EMA_SEC ? w : EMA_SEC;
        z->sec[b] += a * (sec - z->sec[b]);
        z->sw = z->sw * DECAY + 1;
        z->sn = z->sn * DECAY + n;
        z->snn = z->snn * DECAY + (double)n * n;
        z->st = z->st * DECAY + sec;
        z->snt = z->snt * DECAY + n * sec;
    }
    for (int k = 1, below = 1, kept = 1; k <= b; k++, below = kept) { /* a prefix of 2^k nodes */
        while (kept < n_path && path[kept] < (1 << k)) kept++;
        double w = 1.0 / ++z->seen[k], a = w > EMA_TOK ? w : EMA_TOK; /* the mean at first */
        z->gain[k] += a * (kept - below - z->gain[k]);
        z->size[k] += a * ((n < (1 << k) ? n : (1 << k)) - z->size[k]);
    }
    z->round++;
    int was = z->cur;
    z->cur = best_bucket(z);
    if (z->round > 2 && b > was && n > 1) { /* a probe: wait less when it moved us up */
        int lost = z->cur <= was && sec >= CHEAP * z->plain; /* did not win, and was not cheap */
        z->wait = !lost ? PROBE : 4 * z->wait < PROBE_MAX ? 4 * z->wait : PROBE_MAX;
        z->next = z->round + z->wait;
    }
}

/* ---- one round ---- */

typedef struct {
    DraftTree t;
    float *hid;   /* [2*MAX_TREE][dim] tree nodes, then side nodes */
    float *lg;    /* [2*MAX_TREE][vocab] logits, then probabilities (sampling) */
    float *res;   /* [vocab] the residual distribution */
    uint8_t *mask;/* [2*MAX_TREE]^2 the explicit mask when there are side nodes */
    int32_t tok[2 * MAX_TREE], pos[2 * MAX_TREE], seq[2 * MAX_TREE];
    int path[MAX_TREE];
} Round;

static int round_init(Round *r, DecodeCtx *d) {
    memset(r, 0, sizeof *r);
    size_t dim = d->m->c.dim, V = d->m->c.vocab_size;
    r->hid = pd_alloc(sizeof(float) * 2 * MAX_TREE * dim);
    r->lg = pd_alloc(sizeof(float) * 2 * MAX_TREE * V);
    r->mask = pd_alloc(4 * MAX_TREE * MAX_TREE);
    r->res = pd_alloc(sizeof(float) * V);
    r->t.q = d->sampler->temp > 0 ? pd_alloc(sizeof(float) * MAX_TREE * V) : NULL;
    for (int i = 0; i < 2 * MAX_TREE; i++) r->seq[i] = d->seq;
    return r->hid && r->lg && r->res && r->mask && (r->t.q || d->sampler->temp == 0) ? 0 : -1;
}

static void round_free(Round *r) {
    free(r->hid);
    free(r->lg);
    free(r->res);
    free(r->mask);
    free(r->t.q);
}

/* depths from parents; refuses a malformed tree (a drafter's bug, not the user's) */
static int tree_check(DraftTree *t, int max_depth, int V) {
    t->depth[0] = 0;
    for (int i = 1; i < t->n; i++) {
        if (t->parent[i] < 0 || t->parent[i] >= i) return pd_error("drafter: node %d's parent %d does not come before it", i, t->parent[i]);
        if (t->token[i] < 0 || t->token[i] >= V) return pd_error("drafter: node %d's token %d is outside the vocabulary", i, t->token[i]);
        t->depth[i] = t->depth[t->parent[i]] + 1;
        if (t->depth[i] > max_depth) return pd_error("drafter: node %d is deeper than the %d allowed", i, max_depth);
    }
    return 0;
}

/* greedy: follow the child that is the argmax; returns the path length */
static int walk_greedy(Round *r, int V, int *next) {
    const DraftTree *t = &r->t;
    int node = 0, n = 1;
    r->path[0] = 0;
    for (;;) {
        int want = k_argmax(r->lg + (size_t)node * V, V), child = -1;
        for (int c = node + 1; c < t->n && child < 0; c++)
            if (t->parent[c] == node && t->token[c] == want) child = c;
        if (child < 0) {
            *next = want;
            return n;
        }
        r->path[n++] = node = child;
    }
}

/* res[V] (summing to *total) becomes norm(max(0, res/total − q)), q a point mass at
   tok when NULL; rounding that leaves nothing falls back on p itself */
static void residual(float *res, float *total, const float *q, int tok, const float *p, int V) {
    float sum = 0, t = *total;
    for (int i = 0; i < V; i++) {
        float v = res[i] / t - (q ? q[i] : (float)(i == tok));
        sum += res[i] = v > 0 ? v : 0;
    }
    if (!(sum > 0)) {
        memcpy(res, p, sizeof(float) * V);
        sum = 1;
    }
    *total = sum;
}

/* sampling: rejection sampling down the tree (drafter.h); returns the path length */
static int walk_sample(Round *r, Sampler *s, int V, int *next) {
    const DraftTree *t = &r->t;
    int node = 0, n = 1;
    r->path[0] = 0;
    for (;;) {
        float *p = r->lg + (size_t)node * V, total = 1;
        sampler_probs(s, p);
        memcpy(r->res, p, sizeof(float) * V);
        int child = -1;
        for (int c = node + 1; c < t->n && child < 0; c++) {
            if (t->parent[c] != node) continue;
            int tok = t->token[c];
            const float *q = t->sampled[c] ? t->q + (size_t)c * V : NULL;
            if (sampler_uniform(s) * (q ? q[tok] : 1) < r->res[tok] / total) child = c; /* u < p/q */
            else residual(r->res, &total, q, tok, p, V);
        }
        if (child < 0) {
            *next = sampler_pick(s, r->res, V, total);
            return n;
        }
        r->path[n++] = node = child;
    }
}

/* the mask of a tree with side nodes: tree rows from the parents, side rows as given */
static void side_mask(Round *r) {
    const DraftTree *t = &r->t;
    int N = t->n + t->n_side;
    memset(r->mask, 0, (size_t)N * N);
    for (int i = 1; i < t->n; i++)
        for (int a = t->parent[i]; a >= 0; a = t->parent[a]) r->mask[(size_t)i * N + a] = 1;
    for (int i = 0; i < t->n_side; i++)
        for (int j = 0; j < t->n + i; j++) r->mask[(size_t)(t->n + i) * N + j] = t->side_mask[i][j];
}

/* runs the tree's nodes (and side nodes) through the whole model: logits into r->lg */
static int verify(DecodeCtx *d, Round *r, int P) {
    DraftTree *t = &r->t;
    int N = t->n + t->n_side;
    for (int i = 0; i < t->n; i++) r->pos[i] = P + t->depth[i], r->tok[i] = t->token[i];
    for (int i = 0; i < t->n_side; i++) r->pos[t->n + i] = t->side_pos[i], r->tok[t->n + i] = t->token_side[i];
    if (t->n_side) side_mask(r);
    Batch b = {N, r->tok, r->seq, r->pos, t->n_side ? NULL : t->parent, t->n_side ? r->mask : NULL};
    if (decode_forward(d, &b, 0, d->m->c.n_layers, r->hid)) return -1;
    return final_logits(d->m, r->hid, N, r->lg);
}

/* per-depth statistics: drafts kept at depth j+1 (early[j]) out of the rounds that
   reached depth j with a draft below it (reached[j]) */
static void count(DecodeCtx *d, const DraftTree *t, int n_path) {
    int deepest = 0;
    for (int i = 1; i < t->n; i++) deepest = t->depth[i] > deepest ? t->depth[i] : deepest;
    for (int j = 0; j < deepest && j < n_path && j < MAX_EXIT_HEADS; j++) d->reached[j]++;
    for (int j = 1; j < n_path && j <= MAX_EXIT_HEADS; j++) d->early[j - 1]++;
    d->drafted += t->n - 1;
    d->rejected += t->n - n_path;
    d->pending_sum += t->n - 1;
    d->pending_n++;
    d->rounds_by_nodes[t->n + t->n_side]++;
}

/* how many nodes this round may propose, and how deep: drafts past the budget or the
   context would be thrown away, and the tree's slots must fit the sequence */
static void limits(const DecodeCtx *d, int P, int bucket, int *max_nodes, int *max_depth) {
    int seq_len = d->m->c.seq_len;
    int n = 1 << bucket, depth = d->max_new - d->n_out - 1;
    if (n > MAX_TREE) n = MAX_TREE;
    if (n > seq_len - P) n = seq_len - P;
    if (depth > seq_len - 1 - P) depth = seq_len - 1 - P;
    *max_nodes = n;
    *max_depth = depth > 0 ? depth : 0;
}

int drafter_generate(DecodeCtx *d, Drafter *dr, const int32_t *prompt, int n_prompt) {
    Round r;
    Sizer z;
    int rc = -1, V = d->m->c.vocab_size, dim = d->m->c.dim;
    if (round_init(&r, d) || decode_prefill(d, prompt, n_prompt)) goto done;
    if (dr->start && dr->start(dr, d, prompt, n_prompt, d->hidden)) goto done;
    sizer_init(&z, d->opt.fixed_tree);
    double t_start = pd_now();
    int x = sampler_sample(d->sampler, d->logits), P = n_prompt;
    int stop = decode_accept(d, prompt[n_prompt - 1], x);
    while (!stop && P < d->m->c.seq_len) {
        double t0 = pd_now();
        int bucket = sizer_pick(&z), max_nodes, max_depth, next;
        limits(d, P, bucket, &max_nodes, &max_depth);
        DraftTree *t = &r.t;
        t->n = 1;
        t->n_side = 0;
        t->token[0] = x;
        t->parent[0] = -1;
        if (max_nodes > 1 && max_depth > 0 && dr->propose(dr, d, t, max_nodes, max_depth)) goto done;
        if (t->n < 1 || t->n > max_nodes || t->n_side < 0 || t->n_side > MAX_TREE ||
            P + t->n + t->n_side > d->m->c.seq_len) {
            pd_error("drafter: %d + %d nodes proposed, %d allowed", t->n, t->n_side, max_nodes);
            goto done;
        }
        if (tree_check(t, max_depth, V) || verify(d, &r, P)) goto done;
        int n_path = d->sampler->temp == 0 ? walk_greedy(&r, V, &next) : walk_sample(&r, d->sampler, V, &next);
        if (kv_keep_path(d->kv, d->seq, P, r.path, n_path)) goto done;
        count(d, t, n_path);
        int prev = x;
        for (int i = 1; i < n_path && !stop; i++) {
            stop = decode_accept(d, prev, t->token[r.path[i]]);
            prev = t->token[r.path[i]];
        }
        if (!stop) stop = decode_accept(d, prev, next);
        const float *h = r.hid + (size_t)r.path[n_path - 1] * dim;
        if (!stop && dr->accepted && dr->accepted(dr, d, t, r.path, n_path, next, h, r.lg)) goto done;
        x = next;
        P += n_path;
        sizer_update(&z, bucket, r.path, n_path, t->n + t->n_side, pd_now() - t0);
    }
    rc = 0;
    d->t_decode += pd_now() - t_start;
done:
    round_free(&r);
    if (dr->free) dr->free(dr);
    return rc;
}
