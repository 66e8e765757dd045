/* eagle.c — EAGLE decoding (Li et al. 2024): a one-layer head (heads/eagle_head.h) runs
   autoregressively on the target's features and drafts a dynamic tree (EAGLE-2): from
   the root, expand the `width` nodes of the newest depth with the highest cumulative
   draft probability (the product of q along the path), each adding its `width` most
   likely tokens as children, for `depth` levels; then keep the draft-max nodes of the
   highest cumulative probability. A child's value never exceeds its parent's, so that
   order puts parents first and every prefix of it is a tree: the drafter loop's size
   controller verifies the prefix that pays, in one forward call with tree attention.
   Drafts are deterministic (the head's top tokens), so the loop's rejection rule for
   point masses keeps sampling lossless.

   The head keeps its own KV cache of entries (feature f_i, token t_{i+1}) at draft
   position i, true ones only: the target's features of the accepted tokens. A round
   runs the pending entries (those accepted since the last round, the newest ending at
   the root) in one call; its last output drafts depth 1. A node at depth j runs as the
   entry (its parent's output feature, its token) at position P + j - 1 and sees the
   cache plus its ancestors: each level's call holds every node expanded so far as a
   tree batch (a few dozen at most, which costs a one-layer call next to nothing more
   than one), and the cache is cut back to the true entries after it. */
#include <stdlib.h>
#include <string.h>

#include "decode/drafter.h"

#define CHUNK 64     /* entries one head call runs at most */
#define MAX_WIDTH 8  /* --width at most */
#define MAX_DEPTH 16 /* --depth at most */
#define MAX_NODES (1 + MAX_WIDTH * (1 + MAX_WIDTH * (MAX_DEPTH - 1)))
#define MAX_RUN (MAX_WIDTH * MAX_DEPTH) /* expanded nodes one level's call holds at most */

typedef struct {
    int32_t token; /* target id */
    int parent;    /* node index; -1 for depth-1 nodes (their parent is the root) */
    int depth;     /* 1.. */
    float value;   /* cumulative draft probability */
    int feat;      /* row of feats[] its entry reads: its parent's output feature */
    int expanded;  /* its entry ran; out: its output feature's row */
    int run_at;    /* its index in the last level's batch (expanded nodes) */
} Node;

typedef struct {
    const Model *m; /* the target */
    const EagleHead *h;
    Runner *run; /* the head's layer */
    KVCache kv;
    int kv_ok;
    int width, depth, draft_max;
    /* pending true entries: feature rows, the token after each, positions */
    float *pend_f; /* [CHUNK][dim] */
    int32_t pend_t[CHUNK], pend_p[CHUNK];
    int n_pend;
    Node node[MAX_NODES];
    int n_node;
    float *feats;       /* [MAX_NODES + 1][dim] output features: row 0 the root's draft, row 1 + i node i's */
    float *u, *x, *hid; /* [CHUNK][2 dim], [CHUNK][dim] ×2: one call's inputs and outputs */
    int32_t seqs[CHUNK], pos[CHUNK], parent[CHUNK], tok[CHUNK];
    int32_t ids[MAX_RUN * MAX_WIDTH];
    float probs[MAX_RUN * MAX_WIDTH];
} Eagle;

/* one head call: n entries with features f[n][dim], tokens tok, positions pos and
   batch parents (NULL: a chain); outputs (before the final norm) in e->hid */
static int head_run(Eagle *e, const float *f, const int32_t *tok, const int32_t *pos, const int32_t *parent, int n) {
    eagle_input(e->h, e->m, tok, f, n, e->u, e->x);
    Batch b = {n, NULL, e->seqs, pos, parent, NULL};
    memcpy(e->hid, e->x, sizeof(float) * (size_t)n * e->m->c.dim);
    return forward_layers(e->run, &e->kv, &b, 0, 1, e->hid);
}

/* the pending entries but the last into the cache (a backlog of plain steps) */
static int flush(Eagle *e) {
    int n = e->n_pend - 1, dim = e->m->c.dim;
    if (n < 1) return 0;
    if (head_run(e, e->pend_f, e->pend_t, e->pend_p, NULL, n)) return -1;
    memmove(e->pend_f, e->pend_f + (size_t)n * dim, sizeof(float) * dim);
    e->pend_t[0] = e->pend_t[n], e->pend_p[0] = e->pend_p[n];
    e->n_pend = 1;
    return 0;
}

/* a true entry: the target's state after the last layer at pos (normed here), the token after it */
static int pend_add(Eagle *e, const float *hidden, int32_t tok, int pos) {
    if (e->n_pend == CHUNK && flush(e)) return -1;
    model_final_norm(e->m, e->pend_f + (size_t)e->n_pend * e->m->c.dim, hidden, 1);
    e->pend_t[e->n_pend] = tok, e->pend_p[e->n_pend++] = pos;
    return 0;
}

/* the prompt's states, chunk by chunk: each position's entry waits for the next token */
static int eagle_prefill(void *ctx, const int32_t *tok, const int32_t *pos, int n, const float *hidden) {
    Eagle *e = ctx;
    if (e->n_pend) e->pend_t[e->n_pend - 1] = tok[0];
    for (int i = 0; i < n; i++)
        if (pend_add(e, hidden + (size_t)i * e->m->c.dim, i + 1 < n ? tok[i + 1] : -1, pos[i])) return -1;
    return 0;
}

/* node i's children: the head's `width` most likely tokens after its output */
static void add_children(Eagle *e, int parent, int depth, float value, int feat, const int32_t *ids, const float *p) {
    for (int c = 0; c < e->width && e->n_node < MAX_NODES; c++)
        e->node[e->n_node++] = (Node){e->h->vocab[ids[c]], parent, depth, value * p[c], feat, 0, -1};
}

/* the head's output rows → features (normed) into feats rows, and the top tokens */
static int outputs(Eagle *e, const float *hid, int n, float *feats_out) {
    model_final_norm(&e->h->layer, feats_out, hid, n);
    return logits_topk(e->run, hid, n, e->width, e->ids, e->probs);
}

static int by_value(const void *a, const void *b, void *ctx) {
    const Node *x = &((const Eagle *)ctx)->node[*(const int *)a], *y = &((const Eagle *)ctx)->node[*(const int *)b];
    if (x->value != y->value) return x->value > y->value ? -1 : 1;
    if (x->depth != y->depth) return x->depth - y->depth;
    return *(const int *)a - *(const int *)b;
}

/* insertion sort of idx[n] by by_value (a few hundred nodes at most) */
static void sort_nodes(Eagle *e, int *idx, int n) {
    for (int i = 1; i < n; i++) {
        int v = idx[i], j = i;
        for (; j > 0 && by_value(&v, &idx[j - 1], e) < 0; j--) idx[j] = idx[j - 1];
        idx[j] = v;
    }
}

static int eagle_propose(Drafter *dr, DecodeCtx *d, DraftTree *t, int max_nodes, int max_depth) {
    Eagle *e = dr->self;
    int dim = e->m->c.dim, P = t->root_pos;
    int depth = e->depth < max_depth ? e->depth : max_depth, want = max_nodes - 1;
    if (want > e->draft_max) want = e->draft_max;
    /* the best `want` nodes hold each one's ancestors, so none is deeper than want:
       the levels below cost head calls and change nothing verified */
    if (depth > want) depth = want;
    int base = kv_len(&e->kv, 0, 0);
    /* no feature before the root (a prompt whose prefill ran nowhere), or the head's context full: no drafts */
    if (!e->n_pend || base + e->n_pend + e->width * depth > e->h->layer.c.seq_len) return 0;
    e->pend_t[e->n_pend - 1] = t->token[0]; /* the newest entry's token is the root */
    if (head_run(e, e->pend_f, e->pend_t, e->pend_p, NULL, e->n_pend)) return -1;
    base += e->n_pend;
    if (outputs(e, e->hid + (size_t)(e->n_pend - 1) * dim, 1, e->feats)) return -1;
    e->n_pend = 0;
    e->n_node = 0;
    add_children(e, -1, 1, 1.0f, 0, e->ids, e->probs);
    int level_from = 0, n_run = 0, run[MAX_RUN];
    for (int j = 1; j < depth; j++) {
        /* the newest level's best `width` nodes join the expanded ones */
        int lv[MAX_NODES], n_lv = 0;
        for (int i = level_from; i < e->n_node; i++) lv[n_lv++] = i;
        sort_nodes(e, lv, n_lv);
        int add = n_lv < e->width ? n_lv : e->width, first_new = n_run;
        for (int a = 0; a < add && n_run < MAX_RUN; a++) run[n_run++] = lv[a];
        for (int r = 0; r < n_run; r++) {
            Node *nd = &e->node[run[r]];
            nd->run_at = r;
            memcpy(e->hid + (size_t)r * dim, e->feats + (size_t)nd->feat * dim, sizeof(float) * dim);
            e->tok[r] = nd->token;
            e->pos[r] = P + nd->depth - 1;
            e->parent[r] = nd->parent < 0 ? -1 : e->node[nd->parent].run_at;
        }
        if (head_run(e, e->hid, e->tok, e->pos, e->parent, n_run) || kv_truncate(&e->kv, 0, base)) return -1;
        level_from = e->n_node;
        int n_new = n_run - first_new;
        if (outputs(e, e->hid + (size_t)first_new * dim, n_new, e->feats + (size_t)(1 + first_new) * dim)) return -1;
        for (int r = first_new; r < n_run; r++) {
            Node *nd = &e->node[run[r]];
            nd->expanded = 1 + r; /* its output feature's row */
            add_children(e, run[r], nd->depth + 1, nd->value, 1 + r, e->ids + (size_t)(r - first_new) * e->width,
                         e->probs + (size_t)(r - first_new) * e->width);
        }
    }
    int idx[MAX_NODES], map[MAX_NODES];
    for (int i = 0; i < e->n_node; i++) idx[i] = i;
    sort_nodes(e, idx, e->n_node);
    if (want > e->n_node) want = e->n_node;
    for (int k = 0; k < want; k++) {
        const Node *nd = &e->node[idx[k]];
        map[idx[k]] = t->n;
        t->parent[t->n] = nd->parent < 0 ? 0 : map[nd->parent]; /* parents sort first */
        t->token[t->n] = nd->token;
        t->sampled[t->n++] = 0;
    }
    (void)d;
    return 0;
}

static int eagle_start(Drafter *dr, DecodeCtx *d, const int32_t *prompt, int n_prompt, const float *hidden) {
    (void)dr, (void)prompt, (void)n_prompt, (void)hidden;
    d->on_prefill = NULL; /* the prompt's entries are pending: its last waits for the first token */
    return 0;
}

static int eagle_accepted(Drafter *dr, DecodeCtx *d, const DraftTree *t, const int *path, int n_path, int next,
                          const float *hidden, const int32_t *ids) {
    (void)hidden, (void)ids;
    Eagle *e = dr->self;
    int dim = d->m->c.dim;
    if (e->n_pend) e->pend_t[e->n_pend - 1] = t->token[0]; /* a plain step's: the root follows the newest */
    for (int i = 0; i < n_path; i++)
        if (pend_add(e, t->hidden + (size_t)path[i] * dim, i + 1 < n_path ? t->token[path[i + 1]] : next,
                     t->root_pos + i))
            return -1;
    return 0;
}

static void eagle_drafter_free(Drafter *dr) {
    Eagle *e = dr->self;
    if (!e) return;
    if (e->kv_ok) kv_free(&e->kv);
    runner_free(e->run);
    free(e->pend_f), free(e->feats), free(e->u), free(e->x), free(e->hid);
    free(e);
}

typedef struct {
    int draft_max, depth, width;
} EagleOptions;

static const MethodOption eagle_options[] = {
    {"draft-max", OPT_INT, 1, MAX_TREE - 1, "K", "32", "tree nodes below the root", offsetof(EagleOptions, draft_max),
     0, NULL},
    {"depth", OPT_INT, 1, MAX_DEPTH, "D", "6", "levels the head drafts", offsetof(EagleOptions, depth), 0, NULL},
    {"width", OPT_INT, 1, MAX_WIDTH, "W", "4", "nodes expanded per level, and children each",
     offsetof(EagleOptions, width), 0, NULL},
    DRAFTER_OPTIONS,
};

static int eagle_begin(DecodeCtx *d, const int32_t *prompt, int n_prompt, void **state) {
    static const EagleOptions none;
    const EagleOptions *o = d->mopt ? d->mopt : &none;
    Eagle *e = pd_alloc(sizeof *e);
    if (!e) return -1;
    Drafter dr = {e, eagle_start, eagle_propose, eagle_accepted, eagle_drafter_free, 0, -1};
    e->m = d->m;
    e->h = d->opt.eagle;
    e->draft_max = o->draft_max ? o->draft_max : 32;
    e->depth = o->depth ? o->depth : 6;
    e->width = o->width ? o->width : 4;
    if (e->width > e->h->K) e->width = e->h->K;
    size_t D = (size_t)d->m->c.dim;
    e->pend_f = pd_alloc(sizeof(float) * CHUNK * D);
    e->feats = pd_alloc(sizeof(float) * (MAX_RUN + 1) * D);
    e->u = pd_alloc(sizeof(float) * CHUNK * 2 * D);
    e->x = pd_alloc(sizeof(float) * CHUNK * D);
    e->hid = pd_alloc(sizeof(float) * CHUNK * D);
    e->run = e->pend_f && e->feats && e->u && e->x && e->hid ? runner_new(&e->h->layer) : NULL;
    e->kv_ok = e->run && !kv_init(&e->kv, &e->h->layer.c, 1, e->h->layer.c.seq_len, 16);
    if (!e->kv_ok || kv_seq_new(&e->kv) != 0) {
        eagle_drafter_free(&dr);
        return -1;
    }
    e->run->given = 1;
    d->on_prefill = eagle_prefill;
    d->on_prefill_ctx = e;
    return drafter_begin(d, &dr, prompt, n_prompt, state);
}

const DecodeMethod method_eagle = {.name = "eagle",
                                   .summary = "a one-layer head on the model's features drafts a dynamic tree",
                                   .options = eagle_options,
                                   .n_options = sizeof eagle_options / sizeof eagle_options[0],
                                   .options_size = sizeof(EagleOptions),
                                   .needs = NEEDS_EAGLE,
                                   .samples = 1,
                                   .reads_prompt = 1,
                                   .begin = eagle_begin,
                                   .step = drafter_step,
                                   .finish = drafter_finish};
