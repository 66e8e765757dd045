/* medusa.c — Medusa decoding (Cai et al. 2024): K heads on the last hidden state guess
   the tokens 1..K places after the next one; their top candidates, arranged in a
   sparse tree of rank paths, are verified by the drafter loop in one forward call.

   The tree is a list of paths of ranks: path (r1, .., rj) is the node at depth j whose
   token is head j's rank-rj candidate, below the node (r1, .., r(j-1)); the root is
   the token the model itself chose. --tree takes such a list, as Medusa's mc_sim
   choices ("[[0], [1], [0, 0], ...]"); without one the tree is grown from the heads'
   measured rank accuracies, best expected node first (a path's value is the product of
   its ranks' accuracies, as Medusa builds its trees), so every prefix of it is a good
   smaller tree for the size controller to choose. With the benchmarks' oracle the
   tree is grown from the oracle's accuracies instead. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "decode/drafter.h"

#define DEFAULT_NODES 64 /* the built tree; the controller verifies a prefix */
#define MAX_RANK 32      /* candidates a head offers at most */
#define FEW_RANKS 8      /* top_ranks takes up to this many by repeated argmax */

typedef struct {
    Model *m;
    const MedusaHeads *h;
    MedusaTree tr;                          /* the candidate tree */
    int32_t cand[MAX_MEDUSA][MAX_RANK + 1]; /* this round's candidates, best first */
    float *hl;                              /* [vocab] head logits */
    float *hidden;                          /* [dim] the last kept node's state */
    float rate;                             /* oracle: right token first with this probability */
    const int32_t *oracle;
} Medusa;

/* ---- the tree ---- */

/* a tree of the root alone: node 0, the token the model itself chose */
static void tree_root(MedusaTree *tr) {
    tr->n = 1;
    tr->parent[0] = -1;
    tr->rank[0] = tr->depth[0] = 0;
}

static int add_node(MedusaTree *tr, int parent, int rank) {
    int i = tr->n++;
    tr->parent[i] = parent;
    tr->rank[i] = rank;
    tr->depth[i] = tr->depth[parent] + 1;
    return i;
}

/* grown best-first from acc[k][r] (the share of positions where head k's rank r is
   right): each step adds, among the next unused rank below every node, the node with
   the highest product of accuracies along its path */
static void tree_build(Medusa *md, int nodes) {
    const MedusaHeads *h = md->h;
    float value[MAX_TREE];
    int kids[MAX_TREE] = {0};
    value[0] = 1;
    while (md->tr.n < nodes) {
        int best = -1;
        float bv = -1;
        for (int e = 0; e < md->tr.n; e++) {
            int k = md->tr.depth[e], r = kids[e];
            if (k >= h->n || r >= MEDUSA_RANKS) continue;
            /* without measured accuracies, a generic shape: deeper and lower ranks worse */
            float acc = h->has_acc ? h->rank_acc[k][r] : 0.6f / (1 + k) / (1 + 2 * r);
            if (md->oracle) acc = r ? (1 - md->rate) * acc : md->rate; /* the oracle's own accuracies */
            if (value[e] * acc > bv) bv = value[e] * acc, best = e;
        }
        if (best < 0 || bv <= 0) break;
        int i = add_node(&md->tr, best, kids[best]++);
        value[i] = bv;
    }
}

static int cmp_path(const void *a, const void *b) {
    const int *x = a, *y = b; /* [0] = length, then ranks */
    if (x[0] != y[0]) return x[0] - y[0];
    for (int i = 1; i <= x[0]; i++)
        if (x[i] != y[i]) return x[i] - y[i];
    return 0;
}

int medusa_tree_parse(MedusaTree *tr, const char *spec, int n_heads) {
    json_error_t err;
    tree_root(tr);
    json_t *a = json_loads(spec, 0, &err);
    int rc = -1, n = a && json_is_array(a) ? (int)json_array_size(a) : -1;
    int paths[MAX_TREE][MAX_MEDUSA + 1];
    if (n < 0) pd_error("medusa: --tree is not a JSON list of paths (%s)", a ? "not a list" : err.text);
    else if (n < 1 || n > MAX_TREE - 1) pd_error("medusa: --tree has %d paths; 1 to %d are allowed", n, MAX_TREE - 1);
    else rc = 0;
    for (int i = 0; !rc && i < n; i++) {
        json_t *p = json_array_get(a, i);
        int len = json_is_array(p) ? (int)json_array_size(p) : -1;
        if (len < 1 || len > n_heads) {
            rc = pd_error("medusa: --tree path %d is not a list of 1 to %d ranks (one per head)", i + 1, n_heads);
            break;
        }
        paths[i][0] = len;
        for (int j = 0; j < len; j++) {
            json_t *v = json_array_get(p, j);
            json_int_t r = json_is_integer(v) ? json_integer_value(v) : -1;
            if (r < 0 || r >= MAX_RANK) {
                rc = pd_error("medusa: --tree path %d: rank %d is not an integer in [0, %d)", i + 1, j + 1, MAX_RANK);
                break;
            }
            paths[i][j + 1] = (int)r;
        }
    }
    json_decref(a);
    if (rc) return -1;
    qsort(paths, n, sizeof paths[0], cmp_path); /* parents before children */
    for (int i = 0; i < n; i++) {
        if (i && !cmp_path(paths[i], paths[i - 1])) return pd_error("medusa: --tree lists a path twice");
        int parent = 0, len = paths[i][0];
        if (len > 1) { /* the node whose path is this one's without its last rank */
            parent = -1;
            for (int e = 1; e < tr->n && parent < 0; e++) {
                int ok = tr->depth[e] == len - 1;
                for (int j = e, d = len - 1; ok && j > 0; j = tr->parent[j], d--) ok = tr->rank[j] == paths[i][d];
                if (ok) parent = e;
            }
            if (parent < 0) return pd_error("medusa: --tree path %d has no parent path listed", i + 1);
        }
        add_node(tr, parent, paths[i][len]);
    }
    return 0;
}

/* ---- a round ---- */

/* the indices of the `need` largest logits, best first (ties: the lower id). Few: one
   vector argmax each, the ones taken set to -inf (x is scratch); more: one pass with
   an insertion into the short sorted list when a logit beats its last */
static int top_ranks(Runner *run, float *x, int V, int need, int32_t *out) {
    if (need <= FEW_RANKS) {
        for (int r = 0; r < need; r++) {
            if (rows_argmax(run, x, 1, V, &out[r])) return -1;
            x[out[r]] = -INFINITY;
        }
        return 0;
    }
    int n = 0;
    for (int i = 0; i < V; i++) {
        if (n == need && x[i] <= x[out[n - 1]]) continue;
        int j = n < need ? n++ : n - 1;
        for (; j > 0 && x[i] > x[out[j - 1]]; j--) out[j] = out[j - 1];
        out[j] = i;
    }
    return 0;
}

/* the oracle (benchmarks) knows the standard continuation: head k ranks the right
   token first with probability `rate`, else offers its own candidates without it.
   cand[k] holds need+1 of the head's own on entry */
static void oracle_ranks(Medusa *md, DecodeCtx *d, int k, int need) {
    int at = d->n_out + k; /* head k guesses the token k+1 places after the root */
    if (at >= d->max_new) return;
    int32_t right = md->oracle[at], own[MAX_RANK + 1];
    memcpy(own, md->cand[k], sizeof(int32_t) * (need + 1));
    int w = 0;
    if (sampler_uniform(d->sampler) < md->rate) md->cand[k][w++] = right;
    for (int r = 0; w < need && r <= need; r++)
        if (own[r] != right) md->cand[k][w++] = own[r];
}

static int medusa_propose(Drafter *dr, DecodeCtx *d, DraftTree *t, int max_nodes, int max_depth) {
    Medusa *md = dr->self;
    int V = d->m->c.vocab_size, n = md->tr.n < max_nodes ? md->tr.n : max_nodes;
    int deepest = 0, map[MAX_TREE];
    for (int i = 1; i < n; i++)
        if (md->tr.depth[i] <= max_depth && md->tr.depth[i] > deepest) deepest = md->tr.depth[i];
    for (int k = 0; k < deepest; k++) {
        int need = 0; /* the ranks the verified prefix uses */
        for (int i = 1; i < n; i++)
            if (md->tr.depth[i] == k + 1 && md->tr.rank[i] + 1 > need) need = md->tr.rank[i] + 1;
        if (!need) continue;
        if (medusa_logits(md->m, md->h, k, md->hidden, 1, md->hl)) return -1;
        if (top_ranks(d->run, md->hl, V, need + (md->oracle != NULL), md->cand[k])) return -1;
        if (md->oracle) oracle_ranks(md, d, k, need);
    }
    map[0] = 0;
    for (int i = 1; i < n; i++) {
        if (md->tr.depth[i] > max_depth) continue; /* parents come first, so none is cut below a kept node */
        map[i] = t->n;
        t->parent[t->n] = map[md->tr.parent[i]];
        t->token[t->n] = md->cand[md->tr.depth[i] - 1][md->tr.rank[i]];
        t->sampled[t->n++] = 0;
    }
    return 0;
}

static int medusa_keep_hidden(Drafter *dr, DecodeCtx *d, const float *hidden) {
    Medusa *md = dr->self;
    memcpy(md->hidden, hidden, sizeof(float) * d->m->c.dim);
    return 0;
}

static int medusa_start(Drafter *dr, DecodeCtx *d, const int32_t *prompt, int n_prompt, const float *hidden) {
    (void)prompt, (void)n_prompt;
    return medusa_keep_hidden(dr, d, hidden);
}

static int medusa_accepted(Drafter *dr, DecodeCtx *d, const DraftTree *t, const int *path, int n_path, int next,
                           const float *hidden, const int32_t *ids) {
    (void)t, (void)path, (void)n_path, (void)next, (void)ids;
    return medusa_keep_hidden(dr, d, hidden);
}

static void medusa_drafter_free(Drafter *dr) {
    Medusa *md = dr->self;
    if (!md) return;
    free(md->hl);
    free(md->hidden);
    free(md);
}

typedef struct {
    int draft_max;
    const char *tree;
} MedusaOptions;

static const MethodOption medusa_options[] = {
    {"draft-max", OPT_INT, 1, MAX_TREE - 1, "K", "64", "tree nodes below the root", offsetof(MedusaOptions, draft_max),
     0, NULL},
    {"tree", OPT_STR, 0, 0, "PATHS", "built from the heads' accuracies", "the candidate tree as paths of ranks",
     offsetof(MedusaOptions, tree), 0, NULL},
    DRAFTER_OPTIONS,
};

static int medusa_begin(DecodeCtx *d, const int32_t *prompt, int n_prompt, void **state) {
    static const MedusaOptions medusa_none;
    const MedusaOptions *o = d->mopt ? d->mopt : &medusa_none;
    const MethodShared *sh = &d->opt;
    Medusa *md = pd_alloc(sizeof *md);
    if (!md) return -1;
    Drafter dr = {md, medusa_start, medusa_propose, medusa_accepted, medusa_drafter_free, 0, -1, NULL, 0};
    md->m = d->m;
    md->h = sh->medusa;
    tree_root(&md->tr);
    md->rate = sh->oracle_rate;
    md->oracle = sh->oracle_rate > 0 ? sh->oracle : NULL;
    md->hl = pd_alloc(sizeof(float) * d->m->c.vocab_size);
    md->hidden = pd_alloc(sizeof(float) * d->m->c.dim);
    if (!md->hl || !md->hidden ||
        (o->tree ? medusa_tree_parse(&md->tr, o->tree, md->h->n)
                 : (tree_build(md, o->draft_max ? o->draft_max + 1 : DEFAULT_NODES), 0))) {
        medusa_drafter_free(&dr);
        return -1;
    }
    if (o->draft_max && md->tr.n > o->draft_max + 1) md->tr.n = o->draft_max + 1; /* a prefix is a tree */
    return drafter_begin(d, &dr, prompt, n_prompt, state);
}

const DecodeMethod method_medusa = {.name = "medusa",
                                    .summary = "K heads guess a tree of next tokens, verified in one pass",
                                    .options = medusa_options,
                                    .n_options = sizeof medusa_options / sizeof medusa_options[0],
                                    .options_size = sizeof(MedusaOptions),
                                    .needs = NEEDS_MEDUSA,
                                    .samples = 1,
                                    .oracle = 1,
                                    .begin = medusa_begin,
                                    .step = drafter_step,
                                    .finish = drafter_finish};
