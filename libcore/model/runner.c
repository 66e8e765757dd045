/* runner.c — see runner.h */
#include "model/runner.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "model/linear.h"

/* every matrix the forward pass multiplies has a kernel on the runner's device */
static int fits(const Runner *r, const Mat *w) {
    if (r->k->has_wtype(w->t)) return 0;
    return pd_error("device %s: no kernel for %s weights yet", r->k->name, mat_type_name(w));
}
static int weights_fit(const Runner *r) {
    const Model *m = r->m;
    if (fits(r, &m->embed) || fits(r, &m->lm_head)) return -1;
    for (int l = 0; l < m->c.n_layers; l++) { /* each source: a stacked matrix may mix types */
        const Layer *L = &m->layers[l];
        if (fits(r, &L->wq) || fits(r, &L->wk) || fits(r, &L->wv) || fits(r, &L->wo) || fits(r, &L->w1) ||
            fits(r, &L->w3) || fits(r, &L->w2))
            return -1;
    }
    return 0;
}

/* One copy of a Model's weights per device kind, shared by all its runners (a GPU holds
   one however many runners a server or a method makes), on a device handle of its own
   so that it outlives any one runner */
typedef struct Shared {
    const Model *m;
    const char *kind;
    Device *dev;
    DevWeights w;
    DevBuf blocks; /* file_blocks devices: the block-type matrices as the file's rows, stacked */
    int refs;
    struct Shared *next;
} Shared;
static Shared *shared;
static pthread_mutex_t shared_lock = PTHREAD_MUTEX_INITIALIZER;

/* where the kernels see host pointer p of the model's memory (NULL stays NULL) */
static const void *on_dev(const Shared *s, const void *p, int *missing) {
    const char *c = p, *base[3] = {s->m->packed.base, s->m->arena.base, s->m->embed.w};
    const DevBuf buf[3] = {s->w.packed, s->w.arena, s->w.embed_buf};
    if (!p) return NULL;
    for (int i = 0; i < 3; i++)
        if (base[i] && buf[i].mem && c >= base[i] && c < base[i] + dbuf_bytes(buf[i]))
            return (char *)dev_ptr(s->dev, buf[i]) + (c - base[i]);
    *missing = 1;
    return NULL;
}

static void shared_free(Shared *s) {
    if (s->dev) {
        dev_free(s->dev, s->w.packed), dev_free(s->dev, s->w.arena), dev_free(s->dev, s->w.embed_buf);
        dev_free(s->dev, s->blocks);
        dev_close(s->dev);
    }
    free(s->w.layers);
    free(s);
}

/* A device whose kernels read block-type weights as the file stores them (file_blocks)
   gets each such matrix as its sources' rows one after another (q | k | v, gate | up),
   copied in once, in place of the CPU's packing */
typedef struct {
    const Mat *src[3];
    const void **at; /* where the kernels' address goes */
    DevPart *part;   /* where the sources go one by one if their types differ (or NULL) */
    int *parts;
} BlockMat;
static size_t src_bytes(const Mat *w) { return w && k_wtype_quant(w->t) ? (size_t)w->rows * mat_row_bytes(w) : 0; }
static size_t file_bytes(const BlockMat *b) {
    return src_bytes(b->src[0]) + src_bytes(b->src[1]) + src_bytes(b->src[2]);
}
static int file_blocks(Shared *s) {
    const Model *m = s->m;
    int n = 4 * m->c.n_layers + 1, rc = 0;
    BlockMat *list = pd_alloc(sizeof *list * n);
    if (!list) return -1;
    for (int l = 0; l < m->c.n_layers; l++) {
        const Layer *L = &m->layers[l];
        DevLayer *D = &s->w.layers[l];
        list[4 * l] = (BlockMat){{&L->wq, &L->wk, &L->wv}, &D->qkv, D->qkv_part, &D->qkv_parts};
        list[4 * l + 1] = (BlockMat){{&L->wo}, &D->wo, NULL, NULL};
        list[4 * l + 2] = (BlockMat){{&L->w1, &L->w3}, &D->gate_up, D->gu_part, &D->gu_parts};
        list[4 * l + 3] = (BlockMat){{&L->w2}, &D->w2, NULL, NULL};
    }
    list[n - 1] = (BlockMat){{&m->lm_head}, &s->w.lm_head, NULL, NULL};
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        total += file_bytes(&list[i]);
        for (int k = 1; k < 3 && list[i].src[k]; k++)
            if (k_wtype_quant(list[i].src[k]->t) != k_wtype_quant(list[i].src[0]->t))
                rc = pd_error("runner: a stacked matrix of block-type and plain sources (%s, %s)",
                              mat_type_name(list[i].src[0]), mat_type_name(list[i].src[k]));
    }
    unsigned char *host = total && !rc ? pd_alloc(total) : NULL;
    if (total && !host) rc = -1;
    for (size_t i = 0, o = 0; host && i < (size_t)n; i++)
        for (int k = 0; k < 3; k++) {
            size_t b = src_bytes(list[i].src[k]);
            if (b) memcpy(host + o, list[i].src[k]->w, b), o += b;
        }
    if (host && dev_wrap(s->dev, host, total, &s->blocks)) rc = pd_error("runner: the weights: %s", dev_errmsg());
    for (size_t i = 0, o = 0; host && !rc && i < (size_t)n; o += file_bytes(&list[i]), i++) {
        const BlockMat *b = &list[i];
        char *at = (char *)dev_ptr(s->dev, s->blocks) + o;
        if (!file_bytes(b)) continue;
        *b->at = at;
        int mixed = 0;
        for (int k = 1; k < 3 && b->src[k]; k++) mixed |= b->src[k]->t != b->src[0]->t;
        for (int k = 0; mixed && k < 3 && b->src[k]; at += src_bytes(b->src[k]), k++) /* matmul_ld each */
            b->part[(*b->parts)++] = (DevPart){at, b->src[k]->t, b->src[k]->rows};
    }
    free(host), free(list);
    return rc;
}

/* a matrix's packed copy where the kernels see it; NULL for a block type on a device that
   reads the file's blocks instead (file_blocks sets those) */
static const void *mat_dev(const Shared *s, const Mat *w, int *missing) {
    return dev_kernels(s->dev)->file_blocks && k_wtype_quant(w->t) ? NULL : on_dev(s, w->p, missing);
}
/* does any product read the packed arena? (not where every matrix is read as file blocks) */
static int packed_used(const Model *m, const Device *d) {
    int floats = !k_wtype_quant(m->lm_head.t);
    for (int l = 0; l < m->c.n_layers; l++) {
        const Layer *L = &m->layers[l];
        floats |= !k_wtype_quant(L->qkv.t) || !k_wtype_quant(L->wo.t) || !k_wtype_quant(L->gate_up.t) ||
                  !k_wtype_quant(L->w2.t);
    }
    return floats || !dev_kernels(d)->file_blocks;
}

static Shared *weights_load(const Model *m, const char *kind) {
    Shared *s = pd_alloc(sizeof *s);
    if (!s) return NULL;
    *s = (Shared){.m = m, .kind = kind, .refs = 1};
    DevWeights *w = &s->w;
    size_t eb = (size_t)m->embed.rows * mat_row_bytes(&m->embed);
    if (!(s->dev = dev_open(kind)) ||
        (m->packed.base && packed_used(m, s->dev) && dev_wrap(s->dev, m->packed.base, m->packed.used, &w->packed)) ||
        (m->arena.base && dev_wrap(s->dev, m->arena.base, m->arena.used, &w->arena)) ||
        dev_wrap(s->dev, m->embed.w, eb, &w->embed_buf)) {
        pd_error("runner: the weights: %s", dev_errmsg());
        return shared_free(s), NULL;
    }
    if (!(w->layers = pd_alloc(sizeof *w->layers * m->c.n_layers))) return shared_free(s), NULL;
    int miss = 0;
    for (int l = 0; l < m->c.n_layers; l++) {
        const Layer *L = &m->layers[l];
        w->layers[l] = (DevLayer){.attn_norm = on_dev(s, L->attn_norm, &miss),
                                  .ffn_norm = on_dev(s, L->ffn_norm, &miss),
                                  .bq = on_dev(s, L->bq, &miss),
                                  .bk = on_dev(s, L->bk, &miss),
                                  .bv = on_dev(s, L->bv, &miss),
                                  .qkv = mat_dev(s, &L->qkv, &miss),
                                  .wo = mat_dev(s, &L->wo, &miss),
                                  .gate_up = mat_dev(s, &L->gate_up, &miss),
                                  .w2 = mat_dev(s, &L->w2, &miss)};
    }
    w->embed = on_dev(s, m->embed.w, &miss);
    w->final_norm = on_dev(s, m->final_norm, &miss);
    w->lm_head = mat_dev(s, &m->lm_head, &miss);
    if (dev_kernels(s->dev)->file_blocks && file_blocks(s)) return shared_free(s), NULL;
    w->cos = on_dev(s, m->rope_cos, &miss), w->sin = on_dev(s, m->rope_sin, &miss);
    if (miss) {
        pd_error("runner: a weight outside the model's packed matrices, arena and embedding");
        return shared_free(s), NULL;
    }
    return s;
}

/* the model's weights on its runners' device kind: the shared copy, or a new one */
static Shared *weights_get(const Model *m, const char *kind) {
    pthread_mutex_lock(&shared_lock);
    Shared *s = shared;
    while (s && (s->m != m || strcmp(s->kind, kind))) s = s->next;
    if (s) s->refs++;
    else if ((s = weights_load(m, kind))) s->next = shared, shared = s;
    pthread_mutex_unlock(&shared_lock);
    return s;
}

static void weights_put(Shared *s) {
    if (!s) return;
    pthread_mutex_lock(&shared_lock);
    if (--s->refs == 0) {
        Shared **p = &shared;
        while (*p != s) p = &(*p)->next;
        *p = s->next;
        shared_free(s);
    }
    pthread_mutex_unlock(&shared_lock);
}

Runner *runner_new(const Model *m) {
    Runner *r = pd_alloc(sizeof *r);
    if (!r) return NULL;
    memset(r, 0, sizeof *r);
    r->m = m;
    if (!(r->dev = dev_open(model_device_kind()))) {
        pd_error("runner: %s", dev_errmsg());
        return runner_free(r), NULL;
    }
    r->k = dev_kernels(r->dev);
    if (weights_fit(r) || !(r->shared = weights_get(m, dev_kind(r->dev)))) return runner_free(r), NULL;
    r->w = r->shared->w;
    return r;
}

const char *runner_kind(const Runner *r) { return dev_kind(r->dev); }

int runner_after(Runner *a, Runner *b) {
    if ((!b->ran && !(b->ran = dev_event_new(b->dev))) || dev_record(b->dev, b->ran) || dev_wait(a->dev, b->ran))
        return pd_error("runner: %s", dev_errmsg());
    return 0;
}

int runner_host_visible(const Runner *r) { return dev_host(r->dev, r->w.embed_buf) != NULL; } /* always allocated */

void runner_free(Runner *r) {
    if (!r) return;
    if (r->dev) {
        dev_sync(r->dev); /* a call still in flight after an error */
        dev_event_free(r->ran);
        dev_free(r->dev, r->ws.acts);
        dev_free(r->dev, r->ws.desc_buf);
        free(r->ws.desc_host);
        dev_free(r->dev, r->ws.lg), dev_free(r->dev, r->ws.ids), dev_free(r->dev, r->ws.probs);
        dev_free(r->dev, r->ws.rows);
        dev_free(r->dev, r->ws.split_buf);
        dev_free(r->dev, r->ws.mx), dev_free(r->dev, r->ws.my);
        weights_put(r->shared);
        dev_close(r->dev);
    }
    free(r);
}

static size_t up64(size_t x) { return (x + 63) / 64 * 64; }

static size_t carved(size_t n, const size_t *sizes) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += up64(sizes[i]);
    return total;
}
/* pieces of the given sizes from p on, each 64-byte aligned */
static void carve_at(char *p, size_t n, const size_t *sizes, void **const *dst) {
    for (size_t i = 0, at = 0; i < n; at += up64(sizes[i]), i++) *dst[i] = p + at;
}
/* carves a new device buffer into pieces where the kernels see them */
static int carve(Device *d, DevBuf *b, size_t n, const size_t *sizes, void **const *dst, unsigned *gen) {
    DevBuf nb;
    if (dev_alloc(d, carved(n, sizes), &nb)) return pd_error("runner: %s", dev_errmsg());
    dev_free(d, *b);
    *b = nb;
    carve_at(dev_ptr(d, nb), n, sizes, dst);
    ++*gen;
    return 0;
}

/* the descriptor's arrays in the order runner_reserve lays them out */
static void desc_arrays(StepDesc *s, void **a[9]) {
    void **v[] = {(void **)&s->token, (void **)&s->pos,   (void **)&s->seq,  (void **)&s->rank, (void **)&s->vis_off,
                  (void **)&s->vis,   (void **)&s->table, (void **)&s->base, (void **)&s->slot};
    memcpy(a, v, sizeof v);
}

int runner_reserve(Runner *r, int n, size_t vis, int layers) {
    Workspace *w = &r->ws;
    const Config *c = &r->m->c;
    if (w->cap_n >= n && w->cap_vis >= vis && w->cap_layers >= layers) return 0;
    size_t cn = (size_t)(w->cap_n > n ? w->cap_n : n), cv = w->cap_vis > vis ? w->cap_vis : vis;
    size_t cl = (size_t)(w->cap_layers > layers ? w->cap_layers : layers);
    if (cn > (size_t)w->cap_n) {
        size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim, f = sizeof(float);
        size_t sizes[] = {pd_mul(f * cn, c->dim),        pd_mul(f * cn, qd),
                          pd_mul(f * cn, qd + 2 * kvd),  pd_mul(f * cn, 2 * (size_t)c->hidden_dim),
                          pd_mul(f * cn, c->hidden_dim), pd_mul(f * cn, c->dim),
                          pd_mul(f * cn, c->dim)};
        void **dst[] = {(void **)&w->xb, (void **)&w->att, (void **)&w->qkv, (void **)&w->gu,
                        (void **)&w->hb, (void **)&w->out, (void **)&w->hid};
        if (carve(r->dev, &w->acts, 7, sizes, dst, &w->gen)) return -1;
    }
    size_t i4 = sizeof(int32_t), sizes[] = {i4 * cn,
                                            i4 * cn,
                                            i4 * cn,
                                            i4 * cn,
                                            i4 * (cn + 1),
                                            i4 * cv,
                                            sizeof(int *) * cn,
                                            pd_mul(i4 * cn, cl),
                                            pd_mul(i4 * cn, cl)};
    void **ddst[9], **hdst[9];
    desc_arrays(&w->ddesc, ddst), desc_arrays(&w->desc, hdst);
    size_t bytes = carved(9, sizes);
    void *host = aligned_alloc(64, bytes);
    if (!host) return pd_error("runner: out of memory (%zu bytes of step descriptor)", bytes);
    if (carve(r->dev, &w->desc_buf, 9, sizes, ddst, &w->gen)) return free(host), -1;
    free(w->desc_host);
    w->desc_host = host, w->desc_bytes = bytes;
    carve_at(host, 9, sizes, hdst);
    w->cap_n = (int)cn, w->cap_vis = cv, w->cap_layers = (int)cl;
    return 0;
}

int runner_reserve_split(Runner *r, int n, int chunks) {
    Workspace *w = &r->ws;
    const Config *c = &r->m->c;
    w->split_chunks = chunks;
    if (chunks <= 1) return 0;
    size_t need = pd_mul(pd_mul((size_t)n * c->n_heads, (size_t)chunks), (size_t)c->head_dim + 2);
    if (need <= w->cap_split) return 0;
    void **dst[] = {(void **)&w->split};
    size_t bytes = pd_mul(need, sizeof(float));
    if (carve(r->dev, &w->split_buf, 1, &bytes, dst, &w->gen)) return -1;
    w->cap_split = need;
    return 0;
}
