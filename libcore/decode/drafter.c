/* drafter.c — the verify loop every drafter runs in (see drafter.h): propose a tree,
   verify it in one forward call, keep the longest path the model agrees with, and
   let the round size controller choose how much of the tree is worth verifying. */
#include "decode/drafter.h"

#include "decode/accept.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the round size controller ----
   Bucket b verifies at most 2^b nodes; bucket 0 is a plain step that asks the drafter
   for nothing (a cheap drafter is asked all the same: shadows, below). Two things
   decide the best bucket, both measured as the text goes:
   - what a round of each bucket yields: because the drafter orders its nodes so that
     every prefix is a tree, a round that verified n nodes also tells what any smaller
     bucket would have kept (the accepted path cut at the first node past the prefix;
     exact for greedy). Acceptance comes in streaks, so averages of each bucket's own
     yield, taken over different rounds, compare badly; what is averaged instead is
     each bucket's gain over the next smaller one within the same round, and a
     bucket's yield is the sum of the gains up to it. A plain round yields one token.
     For a cheap drafter every round, plain ones too, counts for every bucket, through
     its shadow (below);
   - what a round costs, in plain steps: each drafting bucket's average, and for
     buckets not yet timed twice a straight line a + b·n in the nodes run, fitted to
     all drafting rounds (decaying least squares; through the one size seen and a
     plain step while there is only one). Drafting rounds pay what plain ones do not —
     heads, a draft model, the walk — which both carry. The unit is a plain step's
     seconds, a moving average of the rounds that ran one node (the least of the
     first PLAIN_FIRST, which run cold), never above what a drafting round took; so
     the costs stay right as the context grows and every step gets slower. No round
     counts as more than OUTLIER times what its kind is expected to take (a drafting
     round: what the line expects of its size), so one that another process delayed
     does not skew the costs for long.
   The loop starts with a 2-node look and a plain step, and looks at 4 nodes next
   when the 2-node round cost under CHEAP plain steps. Then it uses the bucket with
   the most tokens per plain step; once drafting pays, a cheap bigger bucket seen in
   few rounds is credited HOPE/√rounds tokens more than measured, so that a close call
   is looked at again (where verifying costs little more than a plain step, as on a
   model that streams its weights from memory, the bigger trees are where the gain
   is). Now and then it probes two buckets up (one where two would cost over twice
   the current; from plain steps, one: a cheap look). A probe that did not win sets
   the wait before the next one from what a round of its size costs beyond the
   tokens it kept: PROBE rounds when that is under CHEAP − 1 plain steps (a drafter
   whose guesses get better as the text goes on, as prompt lookup's do once the text
   repeats itself, is looked at again in time); PROBE_MAX when the round cost more
   than all its drafts could have kept (a draft model that costs most of a plain
   step cannot pay, whatever it guesses); else long enough that the probes lose at
   most BUDGET of the time. So a drafter that never pays costs little more than
   plain steps. */
#define N_BUCKETS 8 /* 1 .. 128 nodes */
#define PROBE 8
#define PROBE_MAX 256
#define EMA_TOK 0.1
#define EMA_COST 0.1
#define DECAY 0.97 /* of the cost line's sums, per round */
#define OUTLIER 1.25
#define HOPE 0.2
#define CHEAP 1.35    /* a round under this many plain steps is cheap to look at */
#define BUDGET 0.01   /* of the time, what the probes of a drafter that does not pay may lose */
#define PLAIN_FIRST 3 /* plain rounds whose least time is taken, before averaging */

typedef struct {
    double gain[N_BUCKETS]; /* tokens a round of bucket b keeps beyond what bucket b-1's
                              prefix of it keeps, on average */
    double size[N_BUCKETS]; /* nodes a round of bucket b runs, on average (drafters often
                              propose fewer than the bucket allows) */
    int seen[N_BUCKETS];
    double cost[N_BUCKETS];      /* plain steps a round of bucket b took, on average */
    int timed[N_BUCKETS];        /* rounds of bucket b timed */
    double sw, sn, snn, st, snt; /* decayed sums for the drafting rounds' cost line */
    double plain;                /* seconds of a plain step, on average: the unit of cost */
    int n_plain;                 /* plain rounds timed */
    int cur, top;                /* the bucket in use, the largest allowed */
    long round, next;            /* rounds so far, the next probe */
    double look;                 /* seconds of the first look, kept until a plain step gives the unit */
    int look_b, look_n, look_kept, look_best;
    int fixed; /* verify the whole proposal, always (benchmarks, tests) */
} Sizer;

static void sizer_init(Sizer *z, int fixed) {
    memset(z, 0, sizeof *z);
    z->fixed = fixed;
    z->top = N_BUCKETS - 1;
    z->gain[0] = z->size[0] = 1;
    z->seen[0] = 1;
    z->next = PROBE;
}

/* plain steps a drafting round of n nodes costs, from the drafting rounds' line
   (before they have two sizes, the line through their one size and a plain step);
   0 before any */
static double line_cost(const Sizer *z, double n) {
    if (z->sw <= 0) return 0;
    double det = z->sw * z->snn - z->sn * z->sn;
    if (det <= 1e-12 * z->sw * z->snn) {
        double n0 = z->sn / z->sw, c0 = z->st / z->sw, slope = n0 > 1 ? (c0 - 1) / (n0 - 1) : 0;
        return c0 + (slope > 0 ? slope : 0) * (n - n0);
    }
    double b = (z->sw * z->snt - z->sn * z->st) / det, a = (z->st - b * z->sn) / z->sw;
    if (b < 0) b = 0;
    if (a < 1e-3) a = 1e-3;
    return a + b * n;
}

/* plain steps a round of bucket b running n nodes costs: its own average once it has
   two rounds, else the line's */
static double sizer_cost(const Sizer *z, int bucket, double n) {
    if (bucket == 0) return 1;
    if (z->timed[bucket] >= 2) return z->cost[bucket];
    return z->sw > 0 ? line_cost(z, n) : n;
}

static int best_bucket(const Sizer *z) {
    int best = 0;
    double br = 0, tok = 0, below = 0;
    for (int b = 0; b <= z->top && z->seen[b]; b++) { /* a round of bucket b sees all below */
        tok += z->gain[b];
        double c = sizer_cost(z, b, z->size[b]), r = tok / c;
        /* once drafting pays, a cheap bigger tree seen in few rounds is given the benefit of the doubt */
        if (b >= 2 && below > 1 && c < CHEAP) r = (tok + HOPE / sqrt(z->seen[b])) / c;
        if (r > br) br = r, best = b;
        below = tok / c;
    }
    return best;
}

static int sizer_pick(const Sizer *z) {
    if (z->fixed) return z->top;
    if (z->round == 0) return 1;                                               /* 2 nodes: a cheap first look */
    if (z->round == 1) return 0;                                               /* a plain step: the unit of cost */
    if (z->round == 2 && z->top >= 2 && sizer_cost(z, 1, 2) < CHEAP) return 2; /* cheap: 4 nodes */
    if (z->round < z->next) return z->cur;
    int up = z->cur ? z->cur + 2 : 1; /* from plain steps, the cheapest drafting round */
    if (up > z->top) up = z->top;
    /* one bucket up only, where two would cost over twice the current (a model whose
       verification costs about what its nodes do: a 4 times bigger tree cannot pay) */
    if (up > z->cur + 1 && sizer_cost(z, up, 1 << up) > 2 * sizer_cost(z, z->cur, z->size[z->cur])) up--;
    return up;
}

/* rounds until the next probe (see above), after a drafting round that kept `kept`
   tokens, would have kept `best` had every draft held, and whose size costs `steps`
   plain steps (the line's figure: one round's own time is too noisy to judge by) */
static long probe_wait(double steps, int kept, int best, int won) {
    double lost = steps - kept;
    if (won || lost < CHEAP - 1) return PROBE;
    if (steps > best) return PROBE_MAX;
    return lost / BUDGET < PROBE ? PROBE : lost / BUDGET < PROBE_MAX ? (long)(lost / BUDGET) : PROBE_MAX;
}

/* a drafting round of bucket b ran n nodes and cost u plain steps. No round counts
   as more than OUTLIER times what the line expects of its size (a bucket's rounds
   differ in size: a drafter may propose less, or nothing); returns what it counted */
static double add_cost(Sizer *z, int b, int n, double u) {
    double expect = line_cost(z, n);
    if (expect > 0 && u > OUTLIER * expect) u = OUTLIER * expect;
    double w = 1.0 / ++z->timed[b], a = w > EMA_COST ? w : EMA_COST;
    z->cost[b] += a * (u - z->cost[b]);
    z->sw = z->sw * DECAY + 1;
    z->sn = z->sn * DECAY + n;
    z->snn = z->snn * DECAY + (double)n * n;
    z->st = z->st * DECAY + u;
    z->snt = z->snt * DECAY + n * u;
    return u;
}

/* what each bucket up to b would have kept of a tree of n nodes whose kept path is
   path[0..n_path): a prefix of 2^k nodes keeps the path up to its first node past it */
static void sizer_gains(Sizer *z, int b, const int *path, int n_path, int n) {
    if (z->fixed) return;
    for (int k = 1, below = 1, kept = 1; k <= b; k++, below = kept) {
        while (kept < n_path && path[kept] < (1 << k)) kept++;
        double w = 1.0 / ++z->seen[k], a = w > EMA_TOK ? w : EMA_TOK; /* the mean at first */
        z->gain[k] += a * (kept - below - z->gain[k]);
        z->size[k] += a * ((n < (1 << k) ? n : (1 << k)) - z->size[k]);
    }
}

/* a round of bucket b (0: plain) ran n nodes (side nodes included), kept n_path
   tokens, would have kept `best` with every draft right, and took sec seconds (what
   it tells of each bucket's yield went in first: sizer_gains, or its shadows); plain:
   it was standard's step (in a drafting bucket too, when the drafter had nothing and
   ran nothing: one that ran a head to find no draft, as self-speculative may, spent
   more than the unit of cost) */
static void sizer_update(Sizer *z, int b, int n_path, int best, int n, int plain, double sec) {
    if (z->fixed) return;
    double u = 0; /* the round's cost in plain steps */
    if (plain) {
        if (z->plain > 0 && sec > OUTLIER * z->plain) sec = OUTLIER * z->plain;
        /* the first rounds run cold: the least of them, then the moving average */
        if (z->n_plain++ < PLAIN_FIRST) z->plain = z->plain > 0 && z->plain < sec ? z->plain : sec;
        else z->plain += EMA_COST * (sec - z->plain);
        if (b > 0) add_cost(z, b, n, sec / z->plain);
        if (z->look > 0) { /* the first look, now that it can be costed */
            add_cost(z, z->look_b, z->look_n, z->look / z->plain);
            z->next = z->round + 1 + probe_wait(line_cost(z, z->look_n), z->look_kept, z->look_best, 0);
            z->look = 0;
        }
    } else if (z->plain <= 0) {
        z->look = sec, z->look_b = b, z->look_n = n, z->look_kept = n_path, z->look_best = best;
    } else {
        if (sec < z->plain) z->plain = sec; /* a tree costs at least a plain step: the unit was too high */
        u = add_cost(z, b, n, sec / z->plain);
    }
    z->round++;
    int was = z->cur;
    z->cur = best_bucket(z);
    if (z->round > 2 && b > was && u > 0) /* a probe */
        z->next = z->round + probe_wait(line_cost(z, n), n_path, best, z->cur > was);
}

/* ---- shadows: what a cheap drafter's whole tree would have kept ----
   A cheap drafter (drafter.h), where a step is slow enough (shadows_pay), proposes
   its biggest tree every round, plain rounds included, and the round verifies the
   prefix its bucket allows. The whole tree waits here until the tokens that follow
   decide its path: at each node, the child whose token is the next output token.
   Greedy, that is exactly the path verifying the whole tree would have kept (the
   output is standard's); sampling, with point-mass drafts, a child is the next token
   with the probability the walk keeps it. So the controller sees every bucket's yield
   in every round instead of probing for it, and catches a text that starts repeating
   itself at once; only what rounds cost still needs rounds of each size. */
#define SHADOW_BUCKET 6
#define SHADOW_NODES (1 << SHADOW_BUCKET)
#define SHADOWS                                                                                                        \
    SHADOW_NODES /* a round adds one and emits a token at least, so a tree is
                                decided within SHADOW_NODES - 1 rounds */

typedef struct {
    int start, n; /* out[start] is the token the root's children guess; nodes */
    int32_t token[SHADOW_NODES], parent[SHADOW_NODES];
} Shadow;

typedef struct {
    Shadow s[SHADOWS];
    int n;
} Shadows;

static void shadow_add(Shadows *sh, const DraftTree *t, int start) {
    if (sh->n == SHADOWS || t->n > SHADOW_NODES) return; /* neither can happen (above) */
    Shadow *s = &sh->s[sh->n++];
    s->start = start;
    s->n = t->n;
    memcpy(s->token, t->token, sizeof(int32_t) * t->n);
    memcpy(s->parent, t->parent, sizeof(int32_t) * t->n);
}

/* the path the output took through s, its length; 0 while the output is too short to tell */
static int shadow_path(const Shadow *s, const int32_t *out, int n_out, int *path) {
    int node = 0, n = 1;
    path[0] = 0;
    for (;;) {
        int at = s->start + n - 1, child = accept_child(s->parent, s->token, s->n, node, at < n_out ? out[at] : -1);
        if (child < 0) return n; /* a leaf, or no child is the output's token */
        if (at >= n_out) return 0;
        path[n++] = node = child;
    }
}

/* whether to keep shadows from now on, decided once a plain step has been timed: where
   that step takes over SHADOW_STEP seconds. A shadow's bookkeeping (the drafter's
   lookup, the walk, the gains) takes a few tenths of a µs a round, nothing beside a
   model that streams its weights from memory, where verifying a few nodes costs little
   more than a plain step and the choice to draft is close in every round; on a model
   whose step is a few µs it shows, and there verifying costs several plain steps, so
   drafting seldom pays and probes alone do better (stories260K, prompt lookup sampled:
   0.93x standard with shadows, 0.96x without) */
#define SHADOW_STEP 300e-6
static int shadows_pay(const Sizer *z) { return z->plain > SHADOW_STEP; }

/* the shadows the output has decided go into the controller's gains */
static void shadows_settle(Shadows *sh, Sizer *z, const DecodeCtx *d) {
    int path[SHADOW_NODES], left = 0;
    for (int i = 0; i < sh->n; i++) {
        int n_path = shadow_path(&sh->s[i], d->out, d->n_out, path);
        if (n_path) sizer_gains(z, z->top, path, n_path, sh->s[i].n);
        else sh->s[left++] = sh->s[i];
    }
    sh->n = left;
}

/* ---- one round ---- */

typedef struct {
    DraftTree t;
    float *hid;                /* [2*MAX_TREE][dim] tree nodes, then side nodes */
    float *lg;                 /* [2*MAX_TREE][vocab] logits or probabilities (sampling, logprobs: decode_rows) */
    int32_t ids[2 * MAX_TREE]; /* every node's argmax (greedy; sampling with side nodes) */
    int lg_probs;              /* lg holds softmax(logits / temp) already */
    float *res;                /* [vocab] the residual distribution */
    uint8_t *mask;             /* [2*MAX_TREE]^2 the explicit mask when there are side nodes */
    int32_t tok[2 * MAX_TREE], pos[2 * MAX_TREE], seq[2 * MAX_TREE];
    int path[MAX_TREE];
    const float *kept[MAX_TREE]; /* logprobs: the raw logits each path node's successor came from */
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
        if (t->parent[i] < 0 || t->parent[i] >= i)
            return pd_error("drafter: node %d's parent %d does not come before it", i, t->parent[i]);
        if (t->token[i] < 0 || t->token[i] >= V)
            return pd_error("drafter: node %d's token %d is outside the vocabulary", i, t->token[i]);
        t->depth[i] = t->depth[t->parent[i]] + 1;
        if (t->depth[i] > max_depth) return pd_error("drafter: node %d is deeper than the %d allowed", i, max_depth);
    }
    return 0;
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

/* runs the tree's nodes (and side nodes) through the whole model: decode_rows into
   r->ids and r->lg (side nodes' argmax whatever the mode: lookahead's Jacobi step) */
static int verify(DecodeCtx *d, Round *r) {
    DraftTree *t = &r->t;
    int N = t->n + t->n_side;
    Batch b = {N, r->tok, r->seq, r->pos, t->n_side ? NULL : t->parent, t->n_side ? r->mask : NULL};
    if (decode_forward(d, &b, t->run_to, d->m->c.n_layers, r->hid)) return -1;
    d->target_passes += t->run_to > 0; /* the drafter ran the first layers: this closes a pass */
    int rc = decode_rows(d, r->hid, N, r->lg, r->ids, t->n_side > 0);
    r->lg_probs = rc == 1;
    return rc < 0 ? -1 : 0;
}

static int deepest(const DraftTree *t) {
    int d = 0;
    for (int i = 1; i < t->n; i++) d = t->depth[i] > d ? t->depth[i] : d;
    return d;
}

/* per-depth statistics: drafts kept at depth j+1 (early[j]) out of the rounds that
   reached depth j with a draft below it (reached[j]) */
static void count(DecodeCtx *d, const Drafter *dr, const DraftTree *t, int deep, int n_path) {
    if (dr->exit_head >= 0) d->early[dr->exit_head] += n_path - 1; /* early exits, as adadecode counts them */
    else {
        for (int j = 0; j < deep && j < n_path && j < MAX_EXIT_HEADS; j++) d->reached[j]++;
        for (int j = 1; j < n_path && j <= MAX_EXIT_HEADS; j++) d->early[j - 1]++;
    }
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

/* ---- the generation, a round a step ---- */

typedef struct {
    Drafter dr;
    Round r;
    Sizer z;
    Shadows sh;
    int shadow, decided, x, P, stop;
    int bucket, max_depth, plain; /* the planned round's */
    double t0;
} DrafterRun;

int drafter_begin(DecodeCtx *d, const Drafter *dr, const int32_t *prompt, int n_prompt, void **state) {
    DrafterRun *u = pd_alloc(sizeof *u);
    if (!u) {
        if (dr->free) dr->free((Drafter *)dr);
        return -1;
    }
    u->dr = *dr;
    *state = u;
    if (round_init(&u->r, d)) return -1;
    /* a method that reads the prompt's states (on_prefill) runs it again unless they are
       given too */
    if (d->given_hidden && (!d->on_prefill || (d->given_states && d->n_given_states >= n_prompt))) {
        if (decode_prefill_given(d, prompt, n_prompt)) return -1;
    } else if (decode_prefill_hidden(d, prompt, n_prompt)) return -1;
    if (u->dr.start && u->dr.start(&u->dr, d, prompt, n_prompt, d->hidden)) return -1;
    sizer_init(&u->z, d->opt.fixed_tree);
    u->sh.n = 0;
    u->decided = u->z.fixed || !u->dr.cheap;
    u->P = n_prompt;
    if (d->given_hidden) {
        u->x = d->out[d->n_out++] = d->given_token;
        u->stop = d->n_out >= d->max_new;
        return 0;
    }
    const float *raw;
    if (decode_choose(d, d->hidden, &raw, &u->x)) return -1;
    u->stop = decode_accept(d, prompt[n_prompt - 1], u->x, raw);
    return 0;
}

static int over(const DecodeCtx *d, const DrafterRun *u) { return u->stop || u->P >= d->m->c.seq_len; }

int drafter_wants(void *state, double *tok, double *nodes) {
    DrafterRun *u = state;
    const Sizer *z = &u->z;
    int b = sizer_pick(z);
    for (int k = 0; k <= b; k++) /* a bucket not seen yet: half a token, as a guess worth a look */
        tok[k] = k == 0 ? 1 : z->seen[k] ? z->gain[k] : 0.5, nodes[k] = z->seen[k] ? z->size[k] : 1 << k;
    return b;
}

/* the round's tree, at most 2^cap nodes (the bucket the controller picks, or the
   engine's cap below it), up to the drafter's proposal: what it may propose in *p
   (p->dr NULL: nothing, a plain round) */
static void plan_open(DecodeCtx *d, DrafterRun *u, int cap, Proposal *p) {
    Round *r = &u->r;
    Sizer *z = &u->z;
    int P = u->P;
    u->t0 = pd_now();
    if (!u->decided && z->plain > 0) {
        u->decided = 1;
        if (d->opt.shadows || shadows_pay(z)) u->shadow = 1, z->top = SHADOW_BUCKET;
    }
    int bucket = sizer_pick(z), max_nodes;
    if (bucket > cap) bucket = cap;
    u->bucket = bucket;
    limits(d, P, u->shadow ? z->top : bucket, &max_nodes, &u->max_depth);
    DraftTree *t = &r->t;
    t->n = 1;
    t->n_side = 0;
    t->token[0] = u->x;
    t->parent[0] = -1;
    t->depth[0] = 0;
    t->run_to = 0;
    t->hidden = r->hid;
    t->root_pos = P;
    *p = (Proposal){max_nodes > 1 && u->max_depth > 0 ? &u->dr : NULL, t, max_nodes, u->max_depth};
}

/* after the proposal: the tree checked, its positions and tokens in r */
static int plan_close(DecodeCtx *d, DrafterRun *u, const Proposal *p) {
    Round *r = &u->r;
    DraftTree *t = &r->t;
    int P = u->P, bucket = u->bucket, max_nodes = p->max_nodes;
    if (t->n < 1 || t->n > max_nodes || t->n_side < 0 || t->n_side > MAX_TREE || P + t->n + t->n_side > d->m->c.seq_len)
        return pd_error("drafter: %d + %d nodes proposed, %d allowed", t->n, t->n_side, max_nodes);
    if (u->shadow) { /* the whole tree waits for the output; the bucket's prefix is verified */
        shadow_add(&u->sh, t, d->n_out);
        if (t->n > 1 << bucket) t->n = 1 << bucket;
    }
    u->plain = t->n == 1 && !t->n_side && !t->run_to;
    if (!u->plain && tree_check(t, u->max_depth, d->m->c.vocab_size)) return -1;
    for (int i = 0; i < t->n; i++) r->pos[i] = P + t->depth[i], r->tok[i] = t->token[i];
    for (int i = 0; i < t->n_side; i++) r->pos[t->n + i] = t->side_pos[i], r->tok[t->n + i] = t->token_side[i];
    if (t->n_side) side_mask(r);
    return 0;
}

/* the planned round's nodes through the model on d's own runner: hid, and the rows */
static int run_planned(DecodeCtx *d, DrafterRun *u) {
    Round *r = &u->r;
    if (u->plain) { /* nothing drafted: standard's step */
        int32_t id;
        if (decode_step(d, u->x, u->P, r->hid, NULL)) return -1;
        int rc = decode_rows(d, r->hid, 1, r->lg, &id, 0);
        r->ids[0] = id, r->lg_probs = rc == 1;
        return rc < 0 ? -1 : 0;
    }
    return verify(d, r);
}

/* the round's outcome from its nodes' rows (r->hid, r->ids, r->lg as decode_rows left
   them): the kept path, the emitted tokens, the controller's bookkeeping (sec: what the
   round cost) */
static int land(DecodeCtx *d, DrafterRun *u, double sec) {
    Drafter *dr = &u->dr;
    Round *r = &u->r;
    DraftTree *t = &r->t;
    int V = d->m->c.vocab_size, dim = d->m->c.dim, P = u->P, x = u->x, n_path = 1, next;
    if (u->plain) {
        r->path[0] = 0;
        r->kept[0] = decode_keep(d, 0, r->lg);
        if (d->sampler->temp == 0) next = r->ids[0];
        else if (decode_row_probs(d, r->lg, r->lg_probs)) return -1;
        else next = sampler_pick(d->sampler, r->lg, V, 1);
        r->ids[0] = next; /* greedy: the argmax */
    } else {
        n_path = d->sampler->temp == 0 ? accept_walk_greedy(t->parent, t->token, t->n, r->ids, r->path, &next)
                                       : accept_walk_sample(d, t->parent, t->token, t->sampled, t->q, t->n, r->lg,
                                                            r->lg_probs, r->res, r->path, r->kept, &next);
        if (n_path < 0) return -1;
        if (kv_keep_path(d->kv, d->seq, P, r->path, n_path)) return -1;
        if (d->sampler->temp == 0) /* greedy: lg holds the raw logits when logprobs are asked */
            for (int i = 0; i < n_path; i++) r->kept[i] = decode_keep(d, i, r->lg + (size_t)r->path[i] * V);
    }
    int deep = deepest(t);
    count(d, dr, t, deep, n_path);
    int prev = x, stop = 0;
    for (int i = 1; i < n_path && !stop; i++) {
        stop = decode_accept(d, prev, t->token[r->path[i]], r->kept[i - 1]);
        prev = t->token[r->path[i]];
    }
    if (!stop) stop = decode_accept(d, prev, next, r->kept[n_path - 1]);
    const float *h = r->hid + (size_t)r->path[n_path - 1] * dim;
    if (!stop && dr->accepted && dr->accepted(dr, d, t, r->path, n_path, next, h, r->ids)) return -1;
    u->x = next;
    u->P = P + n_path;
    u->stop = stop;
    if (u->shadow) shadows_settle(&u->sh, &u->z, d);
    else sizer_gains(&u->z, u->bucket, r->path, n_path, t->n + t->n_side);
    sizer_update(&u->z, u->bucket, n_path, 1 + deep, t->n + t->n_side, u->plain, sec);
    return over(d, u);
}

static int propose(DecodeCtx *d, const Proposal *p) {
    return p->dr ? p->dr->propose(p->dr, d, p->t, p->max_nodes, p->max_depth) : 0;
}

int drafter_step(DecodeCtx *d, void *state) {
    DrafterRun *u = state;
    Proposal p;
    if (over(d, u)) return 1;
    plan_open(d, u, N_BUCKETS, &p);
    if (propose(d, &p) || plan_close(d, u, &p) || run_planned(d, u)) return -1;
    return land(d, u, pd_now() - u->t0);
}

int drafter_plan_open(DecodeCtx *d, void *state, int cap, Proposal *p) {
    DrafterRun *u = state;
    if (over(d, u)) return 1;
    plan_open(d, u, cap, p);
    return 0;
}

int drafter_plan_close(DecodeCtx *d, void *state, const Proposal *p, RoundNodes *rn) {
    DrafterRun *u = state;
    if (plan_close(d, u, p)) return -1;
    const DraftTree *t = &u->r.t;
    *rn = (RoundNodes){.n = t->n + t->n_side,
                       .token = u->r.tok,
                       .pos = u->r.pos,
                       .parent = t->n_side ? NULL : t->parent,
                       .mask = t->n_side ? u->r.mask : NULL,
                       .need_ids = t->n_side > 0,
                       .alone = t->run_to > 0};
    return 0;
}

int drafter_land(DecodeCtx *d, void *state, const float *hid, const float *lg, const int32_t *ids, double sec) {
    DrafterRun *u = state;
    Round *r = &u->r;
    const DraftTree *t = &r->t;
    int N = t->n + t->n_side, V = d->m->c.vocab_size;
    if (!hid) { /* a round that cannot share a call: it runs alone */
        if (run_planned(d, u)) return -1;
        return land(d, u, pd_now() - u->t0);
    }
    memcpy(r->hid, hid, sizeof(float) * N * d->m->c.dim);
    decode_count_pass(d, N, 0, d->m->c.n_layers);
    if (ids) memcpy(r->ids, ids, sizeof(int32_t) * N);
    if (lg) memcpy(r->lg, lg, sizeof(float) * N * V);
    int rc = lg ? decode_rows_given(d, r->lg, N, ids ? NULL : r->ids, t->n_side > 0) : 0;
    if (rc < 0) return -1;
    r->lg_probs = rc == 1;
    return land(d, u, sec);
}

void drafter_finish(DecodeCtx *d, void *state) {
    (void)d;
    DrafterRun *u = state;
    if (!u) return;
    round_free(&u->r);
    if (u->dr.free) u->dr.free(&u->dr);
    free(u);
}
