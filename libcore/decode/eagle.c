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

#define CHUNK 64     /* pending entries one head call runs at most */
#define KEEP 8       /* entries a head keeps of a backlog of plain rounds (forget) */
#define MAX_WIDTH 8  /* --width at most */
#define MAX_DEPTH 16 /* --depth at most */
#define MAX_NODES (1 + MAX_WIDTH * (1 + MAX_WIDTH * (MAX_DEPTH - 1)))
#define MAX_RUN (MAX_WIDTH * MAX_DEPTH) /* expanded nodes one level's call holds at most */

/* What head calls run on: a generation's own, or one that every EAGLE request of a serve
   engine shares (DecodeCtx.pool), a KV sequence each, so that one call holds every
   request's rows of a level. The buffers hold a call's rows, grown as needed. */
typedef struct {
    const Model *m; /* the target */
    const EagleHead *h;
    Runner *run; /* the head's layer */
    KVCache kv;
    int kv_ok, cap;
    float *f, *u, *x, *hid, *out; /* [cap][dim] the rows' features, [cap][2 dim], [cap][dim] ×3 */
    int32_t *seq, *pos, *parent, *tok;
    int32_t *ids; /* [cap][MAX_WIDTH] the LM head's top tokens of the rows in out */
    float *probs; /* [cap][MAX_WIDTH] */
} HeadPool;

typedef struct {
    int32_t token; /* target id */
    int parent;    /* node index; -1 for depth-1 nodes (their parent is the root) */
    int depth;     /* 1.. */
    float value;   /* cumulative draft probability */
    int feat;      /* row of feats[] its entry reads: its parent's output feature */
    int run_at;    /* its index in the last level's batch (expanded nodes) */
} Node;

typedef struct {
    HeadPool *hp;
    int own; /* hp was made for this generation alone */
    int seq; /* its sequence in hp->kv */
    int off; /* the pool had no room: no more drafts (plain rounds) */
    int width, depth, draft_max;
    /* pending true entries: feature rows, the token after each, positions */
    float *pend_f; /* [CHUNK][dim] */
    int32_t pend_t[CHUNK], pend_p[CHUNK];
    int n_pend;
    Node node[MAX_NODES];
    int n_node;
    float *feats; /* [MAX_RUN + 1][dim] output features: row 0 the root's draft, row 1 + r run[r]'s */
    /* the proposal in flight */
    DraftTree *t;
    int want, levels, base;         /* nodes it may keep, levels it drafts (0: none), true entries */
    int run[MAX_RUN], n_run, first; /* expanded nodes; first: the newest expanded */
    int level_from;                 /* the newest level's first node */
    int at;                         /* its first row in the call */
} Eagle;

static void pool_free(void *p) {
    HeadPool *hp = p;
    if (!hp) return;
    if (hp->kv_ok) kv_free(&hp->kv);
    runner_free(hp->run);
    free(hp->f), free(hp->u), free(hp->x), free(hp->hid), free(hp->out);
    free(hp->seq), free(hp->pos), free(hp->parent), free(hp->tok), free(hp->ids), free(hp->probs);
    free(hp);
}

/* room for n rows a call */
static int pool_grow(HeadPool *hp, int n) {
    if (n <= hp->cap) return 0;
    size_t D = (size_t)hp->m->c.dim, c = (size_t)(n > 2 * hp->cap ? n : 2 * hp->cap);
    float **fl[] = {&hp->f, &hp->u, &hp->x, &hp->hid, &hp->out, &hp->probs};
    size_t fn[] = {c * D, c * 2 * D, c * D, c * D, c * D, c * MAX_WIDTH};
    int32_t **in[] = {&hp->seq, &hp->pos, &hp->parent, &hp->tok, &hp->ids};
    for (int i = 0; i < 6; i++) {
        float *g = pd_realloc(*fl[i], sizeof(float) * fn[i]);
        if (!g) return -1;
        *fl[i] = g;
    }
    for (int i = 0; i < 5; i++) {
        int32_t *g = pd_realloc(*in[i], sizeof(int32_t) * c * (i == 4 ? MAX_WIDTH : 1));
        if (!g) return -1;
        *in[i] = g;
    }
    hp->cap = (int)c;
    return 0;
}

static HeadPool *pool_make(const Model *m, const EagleHead *h, int max_seqs, int max_tokens) {
    HeadPool *hp = pd_alloc(sizeof *hp);
    if (!hp) return NULL;
    hp->m = m, hp->h = h;
    hp->run = runner_new(&h->layer);
    hp->kv_ok = hp->run && !kv_init(&hp->kv, &h->layer.c, max_seqs, max_tokens, 16);
    if (!hp->kv_ok || pool_grow(hp, CHUNK)) return pool_free(hp), NULL;
    hp->run->given = 1;
    return hp;
}

/* an engine's: its requests' contexts, and a level's rows each on top */
static void *eagle_pool_new(const Model *m, const MethodShared *o, int max_seqs, int max_tokens) {
    return o->eagle ? pool_make(m, o->eagle, max_seqs, max_tokens + max_seqs * (MAX_RUN + 16)) : NULL;
}

/* one head call over the pool's first n rows (features f, tokens, positions, sequences,
   parents in the call): outputs (before the final norm) in hid */
static int head_call(HeadPool *hp, int n) {
    eagle_input(hp->h, hp->m, hp->tok, hp->f, n, hp->u, hp->x);
    Batch b = {n, NULL, hp->seq, hp->pos, hp->parent, NULL};
    memcpy(hp->hid, hp->x, sizeof(float) * (size_t)n * hp->m->c.dim);
    return forward_layers(hp->run, &hp->kv, &b, 0, 1, hp->hid);
}

/* row i of the next call: e's entry (feature f, token, position), its parent row */
static void put_row(HeadPool *hp, int i, const Eagle *e, const float *f, int32_t tok, int pos, int parent) {
    memcpy(hp->f + (size_t)i * hp->m->c.dim, f, sizeof(float) * hp->m->c.dim);
    hp->tok[i] = tok, hp->pos[i] = pos, hp->parent[i] = parent, hp->seq[i] = e->seq;
}

/* blocks for `slots` more entries in e's cache; where a shared pool is short, e stops
   drafting instead (its rounds plain from then on: nothing is lost) */
static int room(Eagle *e, int slots) {
    if (!kv_reserve(&e->hp->kv, e->seq, kv_len(&e->hp->kv, e->seq, 0) + slots)) return 0;
    e->off = 1, e->n_pend = 0;
    kv_truncate(&e->hp->kv, e->seq, 0);
    return 1;
}

/* e's pending entries rows at..: a chain, the first after its cache */
static void put_pending(HeadPool *hp, int at, const Eagle *e, int n) {
    for (int k = 0; k < n; k++)
        put_row(hp, at + k, e, e->pend_f + (size_t)k * hp->m->c.dim, e->pend_t[k], e->pend_p[k], k ? at + k - 1 : -1);
}

/* the pending entries but the last into the cache (a backlog of plain steps) */
static int flush(Eagle *e) {
    int n = e->n_pend - 1, dim = e->hp->m->c.dim;
    if (n < 1 || room(e, n)) return 0;
    put_pending(e->hp, 0, e, n);
    if (head_call(e->hp, n)) return -1;
    memmove(e->pend_f, e->pend_f + (size_t)n * dim, sizeof(float) * dim);
    e->pend_t[0] = e->pend_t[n], e->pend_p[0] = e->pend_p[n];
    e->n_pend = 1;
    return 0;
}

/* A full backlog of accepted tokens means the loop has taken plain rounds since the
   last proposal, CHUNK − 1 of them (a proposal runs the pending entries): drafting
   does not pay here. Running the backlog through the head would cost a layer a token
   for drafts nobody asks for (a server's batch rests its drafters for long), so the
   head forgets its cache and keeps the last KEEP entries: a head with a shorter memory
   when the loop probes again, never a wrong output. */
static int forget(Eagle *e) {
    int dim = e->hp->m->c.dim, from = e->n_pend - KEEP;
    if (kv_truncate(&e->hp->kv, e->seq, 0)) return -1;
    memmove(e->pend_f, e->pend_f + (size_t)from * dim, sizeof(float) * KEEP * dim);
    memmove(e->pend_t, e->pend_t + from, sizeof(int32_t) * KEEP);
    memmove(e->pend_p, e->pend_p + from, sizeof(int32_t) * KEEP);
    e->n_pend = KEEP;
    return 0;
}

/* a true entry: the target's state after the last layer at pos (normed here), the token
   after it; rest: it comes from a round (a full backlog is forgotten), not the prompt's
   prefill (flushed: the prompt is the context every draft needs) */
static int pend_add(Eagle *e, const float *hidden, int32_t tok, int pos, int rest) {
    if (e->off) return 0;
    if (e->n_pend == CHUNK && (rest ? forget(e) : flush(e))) return -1;
    if (e->off) return 0;
    model_final_norm(e->hp->m, e->pend_f + (size_t)e->n_pend * e->hp->m->c.dim, hidden, 1);
    e->pend_t[e->n_pend] = tok, e->pend_p[e->n_pend++] = pos;
    return 0;
}

/* the prompt's states, chunk by chunk: each position's entry waits for the next token */
static int eagle_prefill(void *ctx, const int32_t *tok, const int32_t *pos, int n, const float *hidden) {
    Eagle *e = ctx;
    if (e->n_pend) e->pend_t[e->n_pend - 1] = tok[0];
    for (int i = 0; i < n; i++)
        if (pend_add(e, hidden + (size_t)i * e->hp->m->c.dim, i + 1 < n ? tok[i + 1] : -1, pos[i], 0)) return -1;
    return 0;
}

/* node i's children: the head's `width` most likely tokens after its output */
static void add_children(Eagle *e, int parent, int depth, float value, int feat, const int32_t *ids, const float *p) {
    for (int c = 0; c < e->width && e->n_node < MAX_NODES; c++)
        e->node[e->n_node++] = (Node){e->hp->h->vocab[ids[c]], parent, depth, value * p[c], feat, -1};
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

/* what e may draft for p: levels (0: nothing), the nodes it may keep */
static void open_proposal(Eagle *e, const Proposal *p) {
    const EagleHead *h = e->hp->h;
    int depth = e->depth < p->max_depth ? e->depth : p->max_depth, want = p->max_nodes - 1;
    if (want > e->draft_max) want = e->draft_max;
    /* the best `want` nodes hold each one's ancestors, so none is deeper than want:
       the levels below cost head calls and change nothing verified */
    if (depth > want) depth = want;
    e->levels = 0, e->t = p->t, e->want = want;
    e->base = kv_len(&e->hp->kv, e->seq, 0);
    /* no feature before the root (a prompt whose prefill ran nowhere), or the head's context full: no drafts */
    if (e->off || !e->n_pend || e->base + e->n_pend + e->width * depth > h->layer.c.seq_len ||
        room(e, e->n_pend + e->width * depth))
        return;
    e->pend_t[e->n_pend - 1] = p->t->token[0]; /* the newest entry's token is the root */
    e->levels = depth;
}

/* the newest level's best `width` nodes join the expanded ones; e's rows of the level's
   call from row at: every expanded node, as a tree batch */
static int put_level(HeadPool *hp, Eagle *e, int at) {
    int lv[MAX_NODES], n_lv = 0, dim = hp->m->c.dim, P = e->t->root_pos;
    for (int i = e->level_from; i < e->n_node; i++) lv[n_lv++] = i;
    sort_nodes(e, lv, n_lv);
    int add = n_lv < e->width ? n_lv : e->width;
    e->first = e->n_run, e->at = at;
    for (int a = 0; a < add && e->n_run < MAX_RUN; a++) e->run[e->n_run++] = lv[a];
    for (int r = 0; r < e->n_run; r++) {
        Node *nd = &e->node[e->run[r]];
        nd->run_at = r;
        put_row(hp, at + r, e, e->feats + (size_t)nd->feat * dim, nd->token, P + nd->depth - 1,
                nd->parent < 0 ? -1 : at + e->node[nd->parent].run_at);
    }
    return e->n_run;
}

/* the tree: the `want` nodes of the highest value (parents sort first) */
static void close_proposal(Eagle *e) {
    DraftTree *t = e->t;
    int idx[MAX_NODES], map[MAX_NODES], want = e->want < e->n_node ? e->want : e->n_node;
    for (int i = 0; i < e->n_node; i++) idx[i] = i;
    sort_nodes(e, idx, e->n_node);
    for (int k = 0; k < want; k++) {
        const Node *nd = &e->node[idx[k]];
        map[idx[k]] = t->n;
        t->parent[t->n] = nd->parent < 0 ? 0 : map[nd->parent];
        t->token[t->n] = nd->token;
        t->sampled[t->n++] = 0;
    }
}

#define EAGLE(i) ((Eagle *)p[i].dr->self)

/* The proposals of n generations on one pool, level by level: each level is one head call
   holding every generation's rows (the head's forward pass gives a row the same bits in
   any batch, so each tree is what it would be alone), then one LM-head call over their
   new outputs (the top K of the widest; a narrower one reads the first of them). */
static int eagle_propose_group(DecodeCtx **d, const Proposal *p, int n) {
    (void)d;
    HeadPool *hp = EAGLE(0)->hp;
    int dim = hp->m->c.dim, rows = 0, K = 1, outs = 0;
    for (int i = 0; i < n; i++) {
        open_proposal(EAGLE(i), &p[i]);
        if (EAGLE(i)->levels) rows += EAGLE(i)->n_pend, K = EAGLE(i)->width > K ? EAGLE(i)->width : K;
    }
    /* the pending entries, each generation's a chain; its last output drafts depth 1 */
    if (!rows || pool_grow(hp, rows)) return rows ? -1 : 0;
    rows = 0;
    for (int i = 0; i < n; i++)
        if (EAGLE(i)->levels)
            put_pending(hp, EAGLE(i)->at = rows, EAGLE(i), EAGLE(i)->n_pend), rows += EAGLE(i)->n_pend;
    if (head_call(hp, rows)) return -1;
    for (int i = 0; i < n; i++) {
        Eagle *e = EAGLE(i);
        if (!e->levels) continue;
        memcpy(hp->out + (size_t)outs++ * dim, hp->hid + (size_t)(e->at + e->n_pend - 1) * dim, sizeof(float) * dim);
        e->base += e->n_pend;
    }
    if (logits_topk(hp->run, hp->out, outs, K, hp->ids, hp->probs)) return -1;
    outs = 0;
    for (int i = 0; i < n; i++) {
        Eagle *e = EAGLE(i);
        if (!e->levels) continue;
        model_final_norm(&hp->h->layer, e->feats, hp->out + (size_t)outs * dim, 1);
        e->n_pend = e->n_node = e->n_run = e->level_from = 0;
        add_children(e, -1, 1, 1.0f, 0, hp->ids + (size_t)outs * K, hp->probs + (size_t)outs * K);
        outs++;
    }
    /* the further levels: every expanded node runs again with its ancestors, so the cache
       is cut back to the true entries after each call */
    for (int j = 1;; j++) {
        rows = 0;
        for (int i = 0; i < n; i++)
            if (j < EAGLE(i)->levels) rows += EAGLE(i)->n_run + EAGLE(i)->width;
        if (!rows) break;
        if (pool_grow(hp, rows)) return -1;
        rows = 0;
        for (int i = 0; i < n; i++) {
            Eagle *e = EAGLE(i);
            if (j < e->levels) rows += put_level(hp, e, rows);
        }
        if (head_call(hp, rows)) return -1;
        outs = 0;
        for (int i = 0; i < n; i++) {
            Eagle *e = EAGLE(i);
            if (j >= e->levels) continue;
            if (kv_truncate(&hp->kv, e->seq, e->base)) return -1;
            for (int r = e->first; r < e->n_run; r++)
                memcpy(hp->out + (size_t)outs++ * dim, hp->hid + (size_t)(e->at + r) * dim, sizeof(float) * dim);
        }
        if (logits_topk(hp->run, hp->out, outs, K, hp->ids, hp->probs)) return -1;
        outs = 0;
        for (int i = 0; i < n; i++) {
            Eagle *e = EAGLE(i);
            if (j >= e->levels) continue;
            int first = e->first;
            e->level_from = e->n_node;
            model_final_norm(&hp->h->layer, e->feats + (size_t)(1 + first) * dim,
                             hp->hid + (size_t)(e->at + first) * dim, e->n_run - first);
            for (int r = first; r < e->n_run; r++, outs++) {
                const Node *nd = &e->node[e->run[r]];
                add_children(e, e->run[r], nd->depth + 1, nd->value, 1 + r, hp->ids + (size_t)outs * K,
                             hp->probs + (size_t)outs * K);
            }
        }
    }
    for (int i = 0; i < n; i++)
        if (EAGLE(i)->levels) close_proposal(EAGLE(i));
    return 0;
}

static int eagle_propose(Drafter *dr, DecodeCtx *d, DraftTree *t, int max_nodes, int max_depth) {
    Proposal p = {dr, t, max_nodes, max_depth};
    return eagle_propose_group(&d, &p, 1);
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
                     t->root_pos + i, 1))
            return -1;
    return 0;
}

static void eagle_drafter_free(Drafter *dr) {
    Eagle *e = dr->self;
    if (!e) return;
    if (e->own) pool_free(e->hp);
    else if (e->hp && e->seq >= 0) kv_seq_free(&e->hp->kv, e->seq);
    free(e->pend_f), free(e->feats);
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
    const EagleHead *h = d->opt.eagle;
    HeadPool *shared = d->pool && ((HeadPool *)d->pool)->h == h ? d->pool : NULL;
    Eagle *e = pd_alloc(sizeof *e);
    if (!e) return -1;
    e->seq = -1;
    e->draft_max = o->draft_max ? o->draft_max : 32;
    Drafter dr = {.self = e,
                  .start = eagle_start,
                  .propose = eagle_propose,
                  .accepted = eagle_accepted,
                  .free = eagle_drafter_free,
                  .exit_head = -1,
                  .propose_group = eagle_propose_group,
                  .most = e->draft_max + 1};
    e->depth = o->depth ? o->depth : 6;
    e->width = o->width ? o->width : 4;
    if (e->width > h->K) e->width = h->K;
    size_t D = (size_t)d->m->c.dim;
    e->pend_f = pd_alloc(sizeof(float) * CHUNK * D);
    e->feats = pd_alloc(sizeof(float) * (MAX_RUN + 1) * D);
    e->own = !shared;
    e->hp = shared ? shared : e->pend_f && e->feats ? pool_make(d->m, h, 1, h->layer.c.seq_len) : NULL;
    if (!e->pend_f || !e->feats || !e->hp || (e->seq = kv_seq_new(&e->hp->kv)) < 0) {
        eagle_drafter_free(&dr);
        return -1;
    }
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
                                   .pool_new = eagle_pool_new,
                                   .pool_free = pool_free,
                                   .begin = eagle_begin,
                                   .step = drafter_step,
                                   .finish = drafter_finish};
