/* forward.c — a Llama layer for n tokens at once, over the paged KV cache.
   Batch invariance comes from the kernels (fixed reduction order per element) and
   from attention visiting keys in position order: committed slots first, then the
   visible tokens of this batch in batch order. */
#include "model/forward.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int seq_of(const Batch *b, int i) { return b->seq ? b->seq[i] : 0; }

/* does token i see batch token j (j < i)? */
static int visible(const Batch *b, int i, int j) {
    if (seq_of(b, i) != seq_of(b, j)) return 0;
    if (b->mask) return b->mask[(size_t)i * b->n + j];
    if (!b->parent) return 1;
    for (int a = b->parent[i]; a >= 0; a = b->parent[a])
        if (a == j) return 1;
    return 0;
}

static int check_batch(const Runner *r, KVCache *kv, const Batch *b, int lb, int le) {
    const Config *c = &r->m->c;
    int given = r->given;
    if (b->n < 1) return pd_error("forward: empty batch");
    if (lb < 0 || le > c->n_layers || lb >= le) return pd_error("forward: bad layer range [%d, %d)", lb, le);
    for (int i = 0; i < b->n; i++) {
        int s = seq_of(b, i);
        if (s < 0 || s >= kv->max_seqs || !kv->live[s]) return pd_error("forward: sequence %d is not live", s);
        if (b->pos[i] < 0 || b->pos[i] >= c->seq_len)
            return pd_error("context full: position %d is past the model's %d", b->pos[i], c->seq_len);
        if (lb == 0 && !given && (b->token[i] < 0 || b->token[i] >= c->vocab_size))
            return pd_error("forward: token %d outside the vocabulary (%d)", b->token[i], c->vocab_size);
        if (b->parent && (b->parent[i] >= i || b->parent[i] < -1))
            return pd_error("forward: token %d's parent %d does not come before it", i, b->parent[i]);
    }
    return 0;
}

/* the step descriptor, once per call: per token its rank among the batch's tokens of
   its sequence (its slot is the sequence's committed length in a layer plus the rank),
   its block-table row, and the ranks of the batch tokens it sees, itself last. Ranks,
   not slots, so the lists hold in every layer, however full each layer is. */
/* the host copy's used part onto the device, array by array, in stream order */
static int upload_desc(Runner *r) {
    Workspace *w = &r->ws;
    const StepDesc *d = &w->desc;
    size_t n = (size_t)d->n, nl = n * (size_t)d->layers, i4 = sizeof(int32_t);
    const void *at[] = {d->token, d->pos, d->seq, d->rank, d->vis_off, d->vis, d->table, d->base, d->slot};
    size_t len[] = {i4 * n,  i4 * n, i4 * n, i4 * n, i4 * (n + 1), i4 * (size_t)d->vis_off[n], sizeof *d->table * n,
                    i4 * nl, i4 * nl};
    for (int i = 0; i < 9; i++) {
        size_t off = (size_t)((const char *)at[i] - (const char *)w->desc_host);
        if (dev_upload(r->dev, dbuf_at(w->desc_buf, off), at[i], len[i])) return pd_error("forward: %s", dev_errmsg());
    }
    w->ddesc.n = d->n, w->ddesc.layers = d->layers;
    return 0;
}

static int build_desc(Runner *r, KVCache *kv, const Batch *b, int lb, int le) {
    int n = b->n;
    if (runner_reserve(r, n, (size_t)n * (n + 1) / 2, le - lb)) return -1;
    StepDesc *d = &r->ws.desc;
    d->n = n, d->layers = le - lb;
    for (int i = 0; i < n; i++) {
        int s = seq_of(b, i), rank = 0;
        for (int j = 0; j < i; j++) rank += seq_of(b, j) == s;
        d->token[i] = b->token && !r->given ? b->token[i] : 0;
        d->pos[i] = b->pos[i];
        d->seq[i] = s;
        d->rank[i] = rank;
        d->table[i] = kv_table_dev(kv, s);
    }
    int at = 0;
    for (int i = 0; i < n; i++) {
        d->vis_off[i] = at;
        for (int j = 0; j <= i; j++)
            if (j == i || visible(b, i, j)) d->vis[at++] = d->rank[j];
    }
    d->vis_off[n] = at;
    int chunks = 1;               /* FlashDecoding's, of the longest token in any layer */
    for (int l = lb; l < le; l++) /* AdaDecode fills layers unevenly */
        for (int i = 0; i < n; i++) {
            size_t x = (size_t)(l - lb) * n + i;
            d->base[x] = kv_len(kv, d->seq[i], l);
            d->slot[x] = d->base[x] + d->rank[i];
            int c = attn_chunks(d->base[x] + d->vis_off[i + 1] - d->vis_off[i]);
            chunks = c > chunks ? c : chunks;
        }
    return runner_reserve_split(r, n < ATT_SPLIT_TOKENS ? n : ATT_SPLIT_TOKENS, chunks) || upload_desc(r);
}

typedef void (*MatmulFn)(float *, const float *, const void *, WType, int, int, int);
/* a stacked product (q | k | v, gate | up): one matmul, or where its sources' block types
   differ on a device reading the file's blocks, one matmul_ld a source */
static void stacked(const Runner *r, MatmulFn matmul, float *y, const float *x, const void *w, WType t, int n, int cols,
                    int rows, const DevPart *part, int parts) {
    if (!parts) return matmul(y, x, w, t, n, cols, rows);
    for (int i = 0, r0 = 0; i < parts; r0 += part[i].rows, i++)
        r->k->matmul_ld(y + r0, (size_t)rows, x, part[i].w, part[i].t, n, cols, part[i].rows);
}

static void layer_forward(Runner *r, KVCache *kv, int l, int li, float *x) {
    const Model *m = r->m;
    const Config *c = &m->c;
    const Layer *L = &m->layers[l]; /* types and shapes; the kernels read W's addresses */
    const DevLayer *W = &r->w.layers[l];
    Workspace *w = &r->ws;
    const StepDesc *d = &w->ddesc; /* the kernels read the device's copy */
    MatmulFn matmul = r->fast && r->k->matmul_fast ? r->k->matmul_fast : r->k->matmul;
    int n = d->n, hd = c->head_dim, qd = c->n_heads * hd, kvd = c->n_kv_heads * hd, row = qd + 2 * kvd;
    const int32_t *base = d->base + (size_t)li * n, *slot = d->slot + (size_t)li * n;

    /* attention: x += wo · attn(rope(wq·xb), rope(wk·xb), wv·xb) */
    r->k->rmsnorm(w->xb, x, W->attn_norm, n, c->dim, c->norm_eps);
    stacked(r, matmul, w->qkv, w->xb, W->qkv, L->qkv.t, n, c->dim, row, W->qkv_part, W->qkv_parts);
    if (W->bq) {
        r->k->add_rows(w->qkv, row, W->bq, n, qd);
        r->k->add_rows(w->qkv + qd, row, W->bk, n, kvd);
        r->k->add_rows(w->qkv + qd + kvd, row, W->bv, n, kvd);
    }
    r->k->rope(w->qkv, row, d->pos, n, c->n_heads + c->n_kv_heads, hd, r->w.cos, r->w.sin); /* q and k heads */
    r->k->kv_write(kv->type, kv_layer_k(kv, l), kv_layer_v(kv, l), kv_layer_ks(kv, l), kv_layer_vs(kv, l),
                   kv_block_stride(kv), kv_scale_stride(kv), kv->block_size, c->n_kv_heads, hd, d->table, slot,
                   w->qkv + qd, row, kvd, n);
    int f32 = kv->type == KV_F32;
    AttnArgs a = {n,
                  c->n_heads,
                  c->n_kv_heads,
                  hd,
                  1.0f / sqrtf((float)hd),
                  w->qkv,
                  row,
                  w->att,
                  f32 ? kv_layer_k(kv, l) : NULL,
                  f32 ? kv_layer_v(kv, l) : NULL,
                  kv_block_stride(kv),
                  kv->block_size,
                  d->table,
                  base,
                  d->vis_off,
                  d->vis,
                  kv->type,
                  kv_layer_k(kv, l),
                  kv_layer_v(kv, l),
                  kv_layer_ks(kv, l),
                  kv_layer_vs(kv, l),
                  kv_scale_stride(kv),
                  w->split,
                  w->split_chunks,
                  ATT_SPLIT_TOKENS};
    r->k->attention_rel(&a);
    matmul(w->out, w->att, W->wo, L->wo.t, n, qd, c->dim);
    r->k->add(x, w->out, (size_t)n * c->dim);

    /* feed-forward: x += w2 · (silu(w1·xb) * (w3·xb)) */
    r->k->rmsnorm(w->xb, x, W->ffn_norm, n, c->dim, c->norm_eps);
    stacked(r, matmul, w->gu, w->xb, W->gate_up, L->gate_up.t, n, c->dim, 2 * c->hidden_dim, W->gu_part, W->gu_parts);
    r->k->silu_mul_rows(w->hb, w->gu, n, c->hidden_dim);
    matmul(w->out, w->hb, W->w2, L->w2.t, n, c->hidden_dim, c->dim);
    r->k->add(x, w->out, (size_t)n * c->dim);
}

void embed_tokens(const Model *m, const int32_t *tokens, int n, float *hidden) {
    for (int i = 0; i < n; i++)
        k_row_to_f32(hidden + (size_t)i * m->c.dim, m->embed.w, m->embed.t, tokens[i], m->c.dim);
}

/* the descriptor's tokens' embedding rows, on the runner's device */
static void embed(Runner *r, float *hidden) {
    const Model *m = r->m;
    r->k->rows_to_f32(hidden, r->w.embed, m->embed.t, r->ws.ddesc.token, r->ws.ddesc.n, m->c.dim);
}

/* blocks for every slot the call will fill, before anything changes */
static int reserve_slots(KVCache *kv, const Batch *b, int lb, int le) {
    for (int i = 0; i < b->n; i++) {
        int s = seq_of(b, i), rank = 0;
        for (int j = 0; j < i; j++) rank += seq_of(b, j) == s;
        for (int l = lb; l < le; l++)
            if (kv_reserve(kv, s, kv_len(kv, s, l) + rank + 1)) return -1;
    }
    return 0;
}

/* the last token of each sequence sets its new length, in every layer of the call */
static void set_lengths(KVCache *kv, const StepDesc *d, int lb, int le) {
    for (int l = lb; l < le; l++)
        for (int i = 0; i < d->n; i++) kv_set_len(kv, d->seq[i], l, d->slot[(size_t)(l - lb) * d->n + i] + 1);
}

typedef struct {
    Runner *r;
    KVCache *kv;
    int l, li;
    float *x; /* NULL: the workspace's copy */
} LayerCall;

/* The layers run as stream calls, eagerly or captured in a graph: on a GPU their
   kernels then launch on the runner's stream. They read the descriptor (and the
   workspace) when they run, not when they were captured. */
static void run_embed(const void *a) {
    const LayerCall *c = a;
    embed(c->r, c->x ? c->x : c->r->ws.hid);
}
static void run_layer(const void *a) {
    const LayerCall *c = a;
    layer_forward(c->r, c->kv, c->l, c->li, c->x ? c->x : c->r->ws.hid);
}

static int call(Runner *r, void (*fn)(const void *), const LayerCall *c) {
    return dev_host_call(r->dev, fn, c, sizeof *c) ? pd_error("forward: %s", dev_errmsg()) : 0;
}

/* The callers' hidden states are host memory. A device the host can read (the CPU)
   works on them in place; elsewhere they go to the workspace's copy (ws.hid, reserved for
   n rows) and back around the call: up (when the call reads them) and down. */
static DevBuf hid_buf(const Runner *r) {
    return dbuf_at(r->ws.acts, (size_t)((char *)r->ws.hid - (char *)dev_ptr(r->dev, r->ws.acts)));
}
static float *hid_up(Runner *r, const float *hidden, int n, int up) {
    if (runner_host_visible(r)) return (float *)hidden;
    if (up && dev_upload(r->dev, hid_buf(r), hidden, sizeof(float) * (size_t)n * r->m->c.dim))
        return pd_error("forward: %s", dev_errmsg()), NULL;
    return r->ws.hid;
}
static int hid_down(Runner *r, float *hidden, int n) {
    if (runner_host_visible(r) || !dev_download(r->dev, hidden, hid_buf(r), sizeof(float) * (size_t)n * r->m->c.dim))
        return 0;
    return pd_error("forward: %s", dev_errmsg());
}

int forward_submit(Runner *r, KVCache *kv, const Batch *b, int lb, int le, float *hidden) {
    if (check_batch(r, kv, b, lb, le) || reserve_slots(kv, b, lb, le) || build_desc(r, kv, b, lb, le)) return -1;
    float *x = hid_up(r, hidden, b->n, lb > 0 || r->given);
    if (!x || (lb == 0 && !r->given && call(r, run_embed, &(LayerCall){r, kv, 0, 0, x}))) return -1;
    for (int l = lb; l < le; l++)
        if (call(r, run_layer, &(LayerCall){r, kv, l, l - lb, x})) return -1;
    set_lengths(kv, &r->ws.desc, lb, le);
    return 0;
}

int forward_wait(Runner *r, float *hidden, int n) { return hid_down(r, hidden, n); }

int forward_layers(Runner *r, KVCache *kv, const Batch *b, int lb, int le, float *hidden) {
    return forward_submit(r, kv, b, lb, le, hidden) || forward_wait(r, hidden, b->n) ? -1 : 0;
}

/* A captured graph is replayed as it was captured: on a GPU its launches hold the
   workspace's addresses and grids, so a replay that would need the workspace re-carved,
   or another FlashDecoding chunk count, is refused (capture after runner_reserve for
   the largest batch) */
struct ForwardGraph {
    DevGraph *g;
    KVCache *kv;
    int lb, le;
    unsigned gen;
    int chunks;
};

ForwardGraph *forward_capture(Runner *r, KVCache *kv, int lb, int le) {
    if (lb < 0 || le > r->m->c.n_layers || lb >= le) return pd_error("forward: bad layer range [%d, %d)", lb, le), NULL;
    ForwardGraph *g = pd_alloc(sizeof *g);
    if (!g) return NULL;
    *g = (ForwardGraph){NULL, kv, lb, le, r->ws.gen, r->ws.split_chunks > 1 ? r->ws.split_chunks : 1};
    if (dev_graph_begin(r->dev)) return free(g), pd_error("forward: %s", dev_errmsg()), NULL;
    int rc = 0; /* on the workspace's hidden states (x NULL), whichever buffer a replay is given */
    if (lb == 0 && !r->given) rc = call(r, run_embed, &(LayerCall){r, kv, 0, 0, NULL});
    for (int l = lb; l < le && !rc; l++) rc = call(r, run_layer, &(LayerCall){r, kv, l, l - lb, NULL});
    if (dev_graph_end(r->dev, &g->g) || rc) {
        if (!rc) pd_error("forward: %s", dev_errmsg());
        forward_graph_free(g);
        return NULL;
    }
    return g;
}

int forward_replay(Runner *r, const ForwardGraph *g, const Batch *b, float *hidden) {
    if (check_batch(r, g->kv, b, g->lb, g->le) || reserve_slots(g->kv, b, g->lb, g->le) ||
        build_desc(r, g->kv, b, g->lb, g->le))
        return -1;
    if (r->ws.gen != g->gen || (r->ws.split_chunks > 1 ? r->ws.split_chunks : 1) != g->chunks) {
        pd_error("forward: this batch needs a workspace other than the graph's (%d tokens%s): capture again", b->n,
                 r->ws.gen == g->gen ? ", another attention split" : "");
        return -2;
    }
    size_t bytes = sizeof(float) * (size_t)b->n * r->m->c.dim;
    if (((g->lb > 0 || r->given) && dev_upload(r->dev, hid_buf(r), hidden, bytes)) || dev_graph_replay(r->dev, g->g) ||
        dev_download(r->dev, hidden, hid_buf(r), bytes))
        return pd_error("forward: %s", dev_errmsg());
    set_lengths(g->kv, &r->ws.desc, g->lb, g->le);
    return 0;
}

void forward_graph_free(ForwardGraph *g) {
    if (!g) return;
    dev_graph_free(g->g);
    free(g);
}

typedef struct {
    Runner *r;
    const float *x;
    float *logits;
    int n;
} LogitsCall;
static void run_logits(const void *a) {
    const LogitsCall *c = a;
    const Model *m = c->r->m;
    const KernelSet *k = c->r->k;
    k->rmsnorm(c->r->ws.xb, c->x, c->r->w.final_norm, c->n, m->c.dim, m->c.norm_eps);
    k->matmul(c->logits, c->r->ws.xb, c->r->w.lm_head, m->lm_head.t, c->n, m->c.dim, m->c.vocab_size);
}

/* the logits of n host rows of hidden states into logits, where the kernels write */
static int logits_of(Runner *r, const float *hidden, int n, float *logits) {
    LogitsCall c = {r, NULL, logits, n};
    if (runner_reserve(r, n, 0, 0) || !(c.x = hid_up(r, hidden, n, 1))) return -1;
    return dev_host_call(r->dev, run_logits, &c, sizeof c) ? pd_error("logits: %s", dev_errmsg()) : 0;
}

static int rows_room(Runner *r, int n, int cols, size_t out);
int final_logits(Runner *r, const float *hidden, int n, float *logits) {
    if (runner_host_visible(r)) return logits_of(r, hidden, n, logits);
    size_t V = (size_t)r->m->c.vocab_size;
    if (rows_room(r, n, (int)V, 0) || logits_of(r, hidden, n, dev_ptr(r->dev, r->ws.lg))) return -1;
    return dev_download(r->dev, logits, r->ws.lg, sizeof(float) * V * n) ? pd_error("logits: %s", dev_errmsg()) : 0;
}

/* room for n rows of cols floats and out results, and the row count uploaded */
static int rows_room(Runner *r, int n, int cols, size_t out) {
    Workspace *w = &r->ws;
    size_t V = (size_t)r->m->c.vocab_size;
    if (n < 1) return pd_error("logits: no rows");
    if (cols < 1) return pd_error("logits: rows of %d", cols);
    size_t need = (pd_mul((size_t)n, (size_t)cols) + V - 1) / V; /* in rows of the vocabulary */
    if (need > (size_t)w->cap_rows) {
        DevBuf b;
        if (need > INT32_MAX || dev_alloc(r->dev, pd_mul(sizeof(float) * V, need), &b))
            return pd_error("runner: %s", dev_errmsg());
        dev_free(r->dev, w->lg);
        w->lg = b, w->cap_rows = (int)need;
    }
    if (out > w->cap_out) {
        DevBuf a, b;
        if (dev_alloc(r->dev, pd_mul(sizeof(int32_t), out), &a)) return pd_error("runner: %s", dev_errmsg());
        if (dev_alloc(r->dev, pd_mul(sizeof(float), out), &b)) {
            dev_free(r->dev, a);
            return pd_error("runner: %s", dev_errmsg());
        }
        dev_free(r->dev, w->ids), dev_free(r->dev, w->probs);
        w->ids = a, w->probs = b, w->cap_out = out;
    }
    if (!w->rows.mem && dev_alloc(r->dev, sizeof(int32_t), &w->rows)) return pd_error("runner: %s", dev_errmsg());
    int32_t rows = n;
    return dev_upload(r->dev, w->rows, &rows, sizeof rows) ? pd_error("runner: %s", dev_errmsg()) : 0;
}

/* the logits of n hidden rows on the device, with room for out results */
static int rows_begin(Runner *r, const float *hidden, int n, size_t out) {
    if (rows_room(r, n, r->m->c.vocab_size, out)) return -1;
    return logits_of(r, hidden, n, dev_ptr(r->dev, r->ws.lg));
}

/* n given rows of cols floats onto the device, with room for out results */
static int rows_put(Runner *r, const float *x, int n, int cols, size_t out) {
    if (rows_room(r, n, cols, out)) return -1;
    if (dev_upload(r->dev, r->ws.lg, x, sizeof(float) * (size_t)n * cols)) return pd_error("runner: %s", dev_errmsg());
    return 0;
}

int logits_argmax(Runner *r, const float *hidden, int n, int32_t *ids) {
    Workspace *w = &r->ws;
    int V = r->m->c.vocab_size;
    if (rows_begin(r, hidden, n, (size_t)n)) return -1;
    if (dev_argmax_rows(r->dev, w->ids, w->lg, w->rows, n, V) || dev_download(r->dev, ids, w->ids, sizeof(int32_t) * n))
        return pd_error("logits: %s", dev_errmsg());
    return 0;
}

int logits_topk(Runner *r, const float *hidden, int n, int k, int32_t *ids, float *probs) {
    Workspace *w = &r->ws;
    int V = r->m->c.vocab_size;
    if (k < 1 || k > V) return pd_error("logits: top-%d of a vocabulary of %d", k, V);
    size_t out = (size_t)n * k;
    if (rows_begin(r, hidden, n, out)) return -1;
    if (dev_topk_rows(r->dev, w->ids, probs ? w->probs : (DevBuf){0}, w->lg, w->rows, n, V, k) ||
        dev_download(r->dev, ids, w->ids, sizeof(int32_t) * out) ||
        (probs && dev_download(r->dev, probs, w->probs, sizeof(float) * out)))
        return pd_error("logits: %s", dev_errmsg());
    return 0;
}

int logits_softmax(Runner *r, const float *hidden, int n, float *probs) {
    Workspace *w = &r->ws;
    int V = r->m->c.vocab_size;
    if (rows_begin(r, hidden, n, 0)) return -1;
    if (dev_softmax_rows(r->dev, w->lg, w->lg, w->rows, n, V) ||
        dev_download(r->dev, probs, w->lg, sizeof(float) * (size_t)n * V))
        return pd_error("logits: %s", dev_errmsg());
    return 0;
}

int logits_softmax_temp(Runner *r, const float *hidden, int n, float temp, float *probs) {
    Workspace *w = &r->ws;
    int V = r->m->c.vocab_size;
    if (!(temp > 0)) return pd_error("logits: temperature %g", temp);
    if (rows_begin(r, hidden, n, 0)) return -1;
    if (dev_softmax_temp_rows(r->dev, w->lg, w->lg, w->rows, n, V, temp) ||
        dev_download(r->dev, probs, w->lg, sizeof(float) * (size_t)n * V))
        return pd_error("logits: %s", dev_errmsg());
    return 0;
}

int rows_argmax(Runner *r, const float *x, int n, int cols, int32_t *ids) {
    Workspace *w = &r->ws;
    if (rows_put(r, x, n, cols, (size_t)n)) return -1;
    if (dev_argmax_rows(r->dev, w->ids, w->lg, w->rows, n, cols) ||
        dev_download(r->dev, ids, w->ids, sizeof(int32_t) * n))
        return pd_error("rows: %s", dev_errmsg());
    return 0;
}

int rows_softmax(Runner *r, const float *x, int n, int cols, float temp, float *probs) {
    Workspace *w = &r->ws;
    if (rows_put(r, x, n, cols, 0)) return -1;
    int rc = temp == 1 ? dev_softmax_rows(r->dev, w->lg, w->lg, w->rows, n, cols)
                       : dev_softmax_temp_rows(r->dev, w->lg, w->lg, w->rows, n, cols, temp);
    if (rc || dev_download(r->dev, probs, w->lg, sizeof(float) * (size_t)n * cols))
        return pd_error("rows: %s", dev_errmsg());
    return 0;
}
