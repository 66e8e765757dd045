/* forward.c — a Llama layer for n tokens at once, over the paged KV cache.
   Batch invariance comes from the kernels (fixed reduction order per element) and
   from attention visiting keys in position order: committed slots first, then the
   visible tokens of this batch in batch order. */
#include "model/forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct Workspace {
    int cap_n;               /* tokens the buffers hold */
    size_t cap_keys;         /* key pointers the lists hold */
    float *xb;               /* [n][dim] normed input */
    float *att;              /* [n][n_heads*hd] attention output */
    float *qkv;              /* [n][(n_heads + 2 n_kv)*hd] the stacked projection: q | k | v */
    float *gu;               /* [n][2 hidden] gate | up */
    float *hb;               /* [n][hidden] */
    float *out;              /* [n][dim] a branch's output before the residual add */
    int *slot, *base;        /* [n] slot of each token; committed length of its sequence */
    int *extra_off;          /* [n+1] each token's visible batch slots in extra */
    int *extra;              /* [cap_keys] */
    const int **table;       /* [n] block table of each token's sequence */
    Arena arena;             /* all of the above, each 64-byte aligned (the kernels' vectors
                                never straddle cache lines) */
} Workspace;

static void ws_free(Workspace *w) {
    if (!w) return;
    arena_free(&w->arena);
    free(w);
}

static int ws_reserve(Model *m, int n, size_t keys) {
    Workspace *w = m->ws;
    if (w && w->cap_n >= n && w->cap_keys >= keys) return 0;
    const Config *c = &m->c;
    size_t cn = w && w->cap_n > n ? (size_t)w->cap_n : (size_t)n;
    size_t ck = w && w->cap_keys > keys ? w->cap_keys : keys;
    ws_free(w);
    m->ws = w = pd_alloc(sizeof *w);
    m->ws_free = ws_free;
    if (!w) return -1;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    size_t f = sizeof(float), sizes[] = {f * cn * c->dim, f * cn * qd, f * cn * (qd + 2 * kvd), f * cn * 2 * c->hidden_dim,
                                         f * cn * c->hidden_dim, f * cn * c->dim, sizeof(int) * cn, sizeof(int) * cn,
                                         sizeof(int) * (cn + 1), sizeof(int) * ck, sizeof(int *) * cn};
    void **bufs[] = {(void **)&w->xb, (void **)&w->att, (void **)&w->qkv, (void **)&w->gu, (void **)&w->hb,
                     (void **)&w->out, (void **)&w->slot, (void **)&w->base, (void **)&w->extra_off,
                     (void **)&w->extra, (void **)&w->table};
    size_t total = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) total += (sizes[i] + 63) / 64 * 64;
    w->cap_n = (int)cn;
    w->cap_keys = ck;
    if (arena_init(&w->arena, total)) {
        free(w);
        m->ws = NULL;
        return -1;
    }
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) *bufs[i] = arena_push(&w->arena, sizes[i]);
    return 0;
}

void forward_free_workspace(Model *m) {
    ws_free(m->ws);
    m->ws = NULL;
}

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

static int check_batch(Model *m, KVCache *kv, const Batch *b, int lb, int le) {
    const Config *c = &m->c;
    if (b->n < 1) return pd_error("forward: empty batch");
    if (lb < 0 || le > c->n_layers || lb >= le) return pd_error("forward: bad layer range [%d, %d)", lb, le);
    for (int i = 0; i < b->n; i++) {
        int s = seq_of(b, i);
        if (s < 0 || s >= kv->max_seqs || !kv->live[s]) return pd_error("forward: sequence %d is not live", s);
        if (b->pos[i] < 0 || b->pos[i] >= c->seq_len)
            return pd_error("context full: position %d is past the model's %d", b->pos[i], c->seq_len);
        if (lb == 0 && (b->token[i] < 0 || b->token[i] >= c->vocab_size))
            return pd_error("forward: token %d outside the vocabulary (%d)", b->token[i], c->vocab_size);
        if (b->parent && (b->parent[i] >= i || b->parent[i] < -1))
            return pd_error("forward: token %d's parent %d does not come before it", i, b->parent[i]);
    }
    return 0;
}

/* slots of this layer's new K/V, and what each token sees: its sequence's committed
   slots, then the visible tokens of this batch (itself last) */
static int place_keys(Model *m, KVCache *kv, const Batch *b, int l) {
    int n = b->n;
    if (ws_reserve(m, n, (size_t)n * (n + 1) / 2)) return -1;
    Workspace *w = m->ws;
    for (int i = 0; i < n; i++) {
        int s = seq_of(b, i), rank = 0;
        for (int j = 0; j < i; j++) rank += seq_of(b, j) == s;
        w->base[i] = kv_len(kv, s, l);
        w->slot[i] = w->base[i] + rank;
        w->table[i] = kv_table(kv, s);
    }
    int at = 0;
    for (int i = 0; i < n; i++) {
        w->extra_off[i] = at;
        for (int j = 0; j <= i; j++)
            if (j == i || visible(b, i, j)) w->extra[at++] = w->slot[j];
    }
    w->extra_off[n] = at;
    return 0;
}

static int layer_forward(Model *m, KVCache *kv, const Batch *b, int l, float *x) {
    const Config *c = &m->c;
    const Layer *L = &m->layers[l];
    int n = b->n, hd = c->head_dim, qd = c->n_heads * hd, kvd = c->n_kv_heads * hd, row = qd + 2 * kvd;
    if (place_keys(m, kv, b, l)) return -1;
    Workspace *w = m->ws;

    /* attention: x += wo · attn(rope(wq·xb), rope(wk·xb), wv·xb) */
    k_rmsnorm(w->xb, x, L->attn_norm, n, c->dim, c->norm_eps);
    k_matmul(w->qkv, w->xb, L->qkv.p, L->qkv.t, n, c->dim, row);
    if (L->bq)
        for (int i = 0; i < n; i++) {
            float *r = w->qkv + (size_t)i * row;
            k_add(r, L->bq, qd);
            k_add(r + qd, L->bk, kvd);
            k_add(r + qd + kvd, L->bv, kvd);
        }
    k_rope(w->qkv, row, b->pos, n, c->n_heads + c->n_kv_heads, hd, m->rope_cos, m->rope_sin); /* q and k heads */
    for (int i = 0; i < n; i++) {
        const float *r = w->qkv + (size_t)i * row;
        kv_write(kv, seq_of(b, i), l, w->slot[i], r + qd, r + qd + kvd);
    }
    AttnArgs a = {n, c->n_heads, c->n_kv_heads, hd, 1.0f / sqrtf((float)hd), w->qkv, row, w->att,
                  kv_layer_k(kv, l), kv_layer_v(kv, l), kv_block_stride(kv), kv->block_size,
                  w->table, w->base, w->extra_off, w->extra};
    k_attention(&a);
    k_matmul(w->out, w->att, L->wo.p, L->wo.t, n, qd, c->dim);
    k_add(x, w->out, (size_t)n * c->dim);

    /* feed-forward: x += w2 · (silu(w1·xb) * (w3·xb)) */
    k_rmsnorm(w->xb, x, L->ffn_norm, n, c->dim, c->norm_eps);
    k_matmul(w->gu, w->xb, L->gate_up.p, L->gate_up.t, n, c->dim, 2 * c->hidden_dim);
    for (int i = 0; i < n; i++) {
        const float *g = w->gu + (size_t)i * 2 * c->hidden_dim;
        k_silu_mul(w->hb + (size_t)i * c->hidden_dim, g, g + c->hidden_dim, c->hidden_dim);
    }
    k_matmul(w->out, w->hb, L->w2.p, L->w2.t, n, c->hidden_dim, c->dim);
    k_add(x, w->out, (size_t)n * c->dim);

    for (int i = 0; i < n; i++) /* the last token of each sequence sets its new length */
        kv_set_len(kv, seq_of(b, i), l, w->slot[i] + 1);
    return 0;
}

void embed_tokens(Model *m, const int32_t *tokens, int n, float *hidden) {
    for (int i = 0; i < n; i++)
        k_row_to_f32(hidden + (size_t)i * m->c.dim, m->embed.w, m->embed.t, tokens[i], m->c.dim);
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

int forward_layers(Model *m, KVCache *kv, const Batch *b, int lb, int le, float *hidden) {
    if (check_batch(m, kv, b, lb, le) || reserve_slots(kv, b, lb, le) || ws_reserve(m, b->n, 1)) return -1;
    if (lb == 0) embed_tokens(m, b->token, b->n, hidden);
    for (int l = lb; l < le; l++)
        if (layer_forward(m, kv, b, l, hidden)) return -1;
    return 0;
}

int final_logits(Model *m, const float *hidden, int n, float *logits) {
    if (ws_reserve(m, n, 1)) return -1;
    k_rmsnorm(m->ws->xb, hidden, m->final_norm, n, m->c.dim, m->c.norm_eps);
    k_matmul(logits, m->ws->xb, m->lm_head.p, m->lm_head.t, n, m->c.dim, m->c.vocab_size);
    return 0;
}
