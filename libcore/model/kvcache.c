/* kvcache.c — see kvcache.h */
#include "model/kvcache.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "model/linear.h"

static const char *const TYPE_NAMES[KV_COUNT] = {"f32", "bf16", "q8_0"};

int kv_type_parse(const char *name) {
    for (int t = 0; t < KV_COUNT; t++)
        if (name && !strcmp(name, TYPE_NAMES[t])) return t;
    return pd_error("unknown KV cache type '%s' (f32, bf16 or q8_0)", name ? name : "");
}

const char *kv_type_name(KVType t) { return t >= 0 && t < KV_COUNT ? TYPE_NAMES[t] : "?"; }

static int elem_bytes(KVType t) { return t == KV_F32 ? 4 : t == KV_BF16 ? 2 : 1; }

size_t kv_bytes_per_token_layer(KVType t, int kv_dim, int n_kv_heads) {
    return 2 * ((size_t)kv_dim * elem_bytes(t) + (t == KV_Q8_0 ? 4 * (size_t)n_kv_heads : 0));
}

int kv_init(KVCache *kv, const Config *c, int max_seqs, int max_tokens, int block_size) {
    return kv_init_typed(kv, c, max_seqs, max_tokens, block_size, KV_F32);
}

int kv_init_typed(KVCache *kv, const Config *c, int max_seqs, int max_tokens, int block_size, KVType t) {
    memset(kv, 0, sizeof *kv);
    if (max_seqs < 1 || max_tokens < 1 || block_size < 1) return pd_error("kv cache: bad sizes");
    if (t < 0 || t >= KV_COUNT) return pd_error("kv cache: unknown type %d", (int)t);
    kv->n_layers = c->n_layers;
    kv->n_kv_heads = c->n_kv_heads;
    kv->kv_dim = c->n_kv_heads * c->head_dim;
    kv->block_size = block_size;
    kv->type = t;
    kv->elem = elem_bytes(t);
    kv->max_seqs = max_seqs;
    kv->max_blocks = (c->seq_len + block_size - 1) / block_size;
    kv->n_blocks = (max_tokens + block_size - 1) / block_size;
    size_t block = pd_mul(pd_mul((size_t)kv->n_layers, block_size), pd_mul(kv->kv_dim, kv->elem));
    size_t data = pd_mul(block, kv->n_blocks);
    size_t scales = t == KV_Q8_0 ? pd_mul(pd_mul(kv_scale_stride(kv), sizeof(float)), kv->n_blocks) : 0;
    for (kv->map_cap = 2; kv->map_cap < 2 * kv->n_blocks; kv->map_cap *= 2) {}
    size_t ints = sizeof(int) * ((size_t)7 * kv->n_blocks + kv->map_cap +
                                 (size_t)max_seqs * (kv->max_blocks + 1 + kv->n_layers)) +
                  sizeof(uint64_t) * kv->n_blocks + pd_mul(sizeof(int32_t) * kv->n_blocks, block_size);
    if (!(kv->dev = dev_open(model_device_kind()))) return pd_error("kv cache: %s", dev_errmsg());
    int host = !strcmp(dev_kind(kv->dev), "cpu"); /* the storage in the arena, wrapped */
    size_t store = host ? 2 * data + 2 * scales : 0;
    if (data >= SIZE_MAX / 8 || scales >= SIZE_MAX / 8 || arena_init(&kv->arena, store + ints + max_seqs + 18 * 64)) {
        kv_free(kv);
        return pd_error_prefix("kv cache");
    }
    if (host) {
        kv->k = arena_push(&kv->arena, data);
        kv->v = arena_push(&kv->arena, data);
        if (scales) {
            kv->ks = arena_push(&kv->arena, scales);
            kv->vs = arena_push(&kv->arena, scales);
        }
    }
    kv->free_blocks = arena_push(&kv->arena, sizeof(int) * kv->n_blocks);
    kv->table = arena_push(&kv->arena, sizeof(int) * (size_t)max_seqs * kv->max_blocks);
    kv->n_table = arena_push(&kv->arena, sizeof(int) * max_seqs);
    kv->len = arena_push(&kv->arena, sizeof(int) * (size_t)max_seqs * kv->n_layers);
    kv->live = arena_push(&kv->arena, max_seqs);
    size_t nb = sizeof(int) * kv->n_blocks;
    kv->ref = arena_push(&kv->arena, nb), kv->prev = arena_push(&kv->arena, nb);
    kv->prev_gen = arena_push(&kv->arena, nb), kv->gen = arena_push(&kv->arena, nb);
    kv->lru_prev = arena_push(&kv->arena, nb), kv->lru_next = arena_push(&kv->arena, nb);
    kv->hash = arena_push(&kv->arena, sizeof(uint64_t) * kv->n_blocks);
    kv->btok = arena_push(&kv->arena, nb * block_size);
    kv->map = arena_push(&kv->arena, sizeof(int) * kv->map_cap);
    for (int i = 0; i < kv->n_blocks; i++) kv->free_blocks[i] = kv->n_blocks - 1 - i;
    for (int i = 0; i < kv->map_cap; i++) kv->map[i] = -1;
    kv->n_free = kv->n_blocks;
    kv->lru_head = kv->lru_tail = -1;
    /* on the CPU wrapped, not allocated: the arena maps its pages lazily, as a big pool
       needs; elsewhere device memory, and the block tables a copy kv_reserve keeps up */
    size_t tb = sizeof(int) * (size_t)max_seqs * kv->max_blocks;
    int rc;
    if (host)
        rc = dev_wrap(kv->dev, kv->k, data, &kv->kbuf) || dev_wrap(kv->dev, kv->v, data, &kv->vbuf) ||
             (scales &&
              (dev_wrap(kv->dev, kv->ks, scales, &kv->ksbuf) || dev_wrap(kv->dev, kv->vs, scales, &kv->vsbuf))) ||
             dev_wrap(kv->dev, kv->table, tb, &kv->tbuf);
    else
        rc = dev_alloc(kv->dev, data, &kv->kbuf) || dev_alloc(kv->dev, data, &kv->vbuf) ||
             (scales && (dev_alloc(kv->dev, scales, &kv->ksbuf) || dev_alloc(kv->dev, scales, &kv->vsbuf))) ||
             dev_alloc(kv->dev, tb, &kv->tbuf);
    if (rc) {
        pd_error("kv cache: %s", dev_errmsg());
        kv_free(kv);
        return -1;
    }
    kv->k = dev_ptr(kv->dev, kv->kbuf), kv->v = dev_ptr(kv->dev, kv->vbuf);
    kv->ks = dev_ptr(kv->dev, kv->ksbuf), kv->vs = dev_ptr(kv->dev, kv->vsbuf);
    return 0;
}

void kv_free(KVCache *kv) {
    if (kv->dev) {
        dev_free(kv->dev, kv->kbuf);
        dev_free(kv->dev, kv->vbuf);
        dev_free(kv->dev, kv->moves);
        dev_free(kv->dev, kv->ksbuf);
        dev_free(kv->dev, kv->vsbuf);
        dev_free(kv->dev, kv->smoves);
        dev_free(kv->dev, kv->tbuf);
        dev_close(kv->dev);
    }
    arena_free(&kv->arena);
    free(kv->states), free(kv->stated);
    memset(kv, 0, sizeof *kv);
}

/* ---- blocks: taken, dropped, published ---- */

static void lru_unlink(KVCache *kv, int b) {
    int p = kv->lru_prev[b], n = kv->lru_next[b];
    if (p >= 0) kv->lru_next[p] = n;
    else kv->lru_head = n;
    if (n >= 0) kv->lru_prev[n] = p;
    else kv->lru_tail = p;
    kv->n_idle--;
}

static void lru_append(KVCache *kv, int b) {
    kv->lru_prev[b] = kv->lru_tail, kv->lru_next[b] = -1;
    if (kv->lru_tail >= 0) kv->lru_next[kv->lru_tail] = b;
    else kv->lru_head = b;
    kv->lru_tail = b;
    kv->n_idle++;
}

static int map_slot(const KVCache *kv, uint64_t h) { return (int)(h & (uint64_t)(kv->map_cap - 1)); }

static void map_insert(KVCache *kv, int b) {
    int i = map_slot(kv, kv->hash[b]);
    while (kv->map[i] >= 0) i = (i + 1) & (kv->map_cap - 1);
    kv->map[i] = b;
}

/* linear probing's deletion: later entries of the run move back into the hole */
static void map_remove(KVCache *kv, int b) {
    int m = kv->map_cap - 1, i = map_slot(kv, kv->hash[b]);
    while (kv->map[i] != b) i = (i + 1) & m;
    for (int j = (i + 1) & m; kv->map[j] >= 0; j = (j + 1) & m) {
        int home = map_slot(kv, kv->hash[kv->map[j]]);
        if (((j - home) & m) >= ((j - i) & m)) kv->map[i] = kv->map[j], i = j; /* home at or before the hole */
    }
    kv->map[i] = -1;
}

/* the block's contents may change: it leaves the cache, and blocks published after it
   no longer match its successors' predecessor */
static void unpublish(KVCache *kv, int b) {
    if (!kv->hash[b]) return;
    map_remove(kv, b);
    kv->hash[b] = 0;
    kv->gen[b]++;
}

/* a block for a sequence: a free one, else the least recently used idle one */
static int block_take(KVCache *kv) {
    int b;
    if (kv->n_free) b = kv->free_blocks[--kv->n_free];
    else if ((b = kv->lru_head) >= 0) lru_unlink(kv, b), unpublish(kv, b);
    else return -1;
    kv->ref[b] = 1;
    return b;
}

static void block_drop(KVCache *kv, int b) {
    if (--kv->ref[b] > 0) return;
    if (kv->hash[b]) lru_append(kv, b);
    else kv->free_blocks[kv->n_free++] = b;
}

int kv_blocks_available(const KVCache *kv) { return kv->n_free + kv->n_idle; }

/* block i's hash: its tokens after its predecessor's hash (never 0: 0 means none) */
static uint64_t chain_hash(const KVCache *kv, uint64_t before, const int32_t *tok) {
    uint64_t h = XXH64(tok, sizeof(int32_t) * kv->block_size, before);
    return h ? h : 1;
}

/* the published block holding tok after block prev (generation prev_gen), or -1 */
static int map_find(const KVCache *kv, uint64_t h, const int32_t *tok, int prev, int prev_gen) {
    for (int i = map_slot(kv, h); kv->map[i] >= 0; i = (i + 1) & (kv->map_cap - 1)) {
        int b = kv->map[i];
        if (kv->hash[b] == h && kv->prev[b] == prev && (prev < 0 || kv->prev_gen[b] == prev_gen) &&
            !memcmp(kv->btok + (size_t)b * kv->block_size, tok, sizeof(int32_t) * kv->block_size))
            return b;
    }
    return -1;
}

int kv_seq_new(KVCache *kv) {
    for (int s = 0; s < kv->max_seqs; s++)
        if (!kv->live[s]) {
            kv->live[s] = 1;
            kv->n_table[s] = 0;
            memset(kv->len + (size_t)s * kv->n_layers, 0, sizeof(int) * kv->n_layers);
            return s;
        }
    pd_error("kv cache: all %d sequences are in use", kv->max_seqs);
    return -1;
}

void kv_seq_free(KVCache *kv, int seq) {
    kv_truncate(kv, seq, 0);
    kv->live[seq] = 0;
}

int kv_len(const KVCache *kv, int seq, int layer) { return kv->len[(size_t)seq * kv->n_layers + layer]; }

void kv_set_len(KVCache *kv, int seq, int layer, int len) { kv->len[(size_t)seq * kv->n_layers + layer] = len; }

/* entries [from, to) of seq's block table, to where the kernels read them */
static int table_upload(KVCache *kv, int seq, int from, int to) {
    if (to <= from || dev_host(kv->dev, kv->tbuf)) return 0; /* the CPU's is the table itself */
    size_t at = sizeof(int) * ((size_t)seq * kv->max_blocks + from);
    if (dev_upload(kv->dev, dbuf_at(kv->tbuf, at), kv->table + (size_t)seq * kv->max_blocks + from,
                   sizeof(int) * (to - from)) ||
        dev_sync(kv->dev))
        return pd_error("kv cache: %s", dev_errmsg());
    return 0;
}

int kv_reserve(KVCache *kv, int seq, int slots) {
    int need = (slots + kv->block_size - 1) / kv->block_size;
    if (need > kv->max_blocks)
        return pd_error("context full: %d positions asked, the model holds %d", slots, kv->max_blocks * kv->block_size);
    int *tab = kv->table + (size_t)seq * kv->max_blocks, had = kv->n_table[seq];
    while (kv->n_table[seq] < need) {
        int b = block_take(kv);
        if (b < 0) {
            table_upload(kv, seq, had, kv->n_table[seq]);
            return pd_error("kv cache: out of blocks (%d in the pool)", kv->n_blocks);
        }
        tab[kv->n_table[seq]++] = b;
    }
    return table_upload(kv, seq, had, kv->n_table[seq]);
}

size_t kv_block_stride(const KVCache *kv) { return (size_t)kv->n_layers * kv->block_size * kv->kv_dim; }
/* where a layer starts inside a block: elements (k, v), floats (the scales) */
static size_t layer_off(const KVCache *kv, int layer) { return (size_t)layer * kv->block_size * kv->kv_dim; }
static size_t scale_off(const KVCache *kv, int layer) { return (size_t)layer * kv->block_size * kv->n_kv_heads; }
void *kv_layer_k(const KVCache *kv, int layer) { return (char *)kv->k + layer_off(kv, layer) * kv->elem; }
void *kv_layer_v(const KVCache *kv, int layer) { return (char *)kv->v + layer_off(kv, layer) * kv->elem; }
size_t kv_scale_stride(const KVCache *kv) { return (size_t)kv->n_layers * kv->block_size * kv->n_kv_heads; }
float *kv_layer_ks(const KVCache *kv, int layer) { return kv->ks ? kv->ks + scale_off(kv, layer) : NULL; }
float *kv_layer_vs(const KVCache *kv, int layer) { return kv->vs ? kv->vs + scale_off(kv, layer) : NULL; }
const int *kv_table(const KVCache *kv, int seq) { return kv->table + (size_t)seq * kv->max_blocks; }
const int *kv_table_dev(const KVCache *kv, int seq) {
    return (const int *)dev_ptr(kv->dev, kv->tbuf) + (size_t)seq * kv->max_blocks;
}

/* the storage as the host may touch it: the CPU's own, else a copy (a test's write goes
   back with put_host) */
typedef struct {
    void *k, *v;
    float *ks, *vs;
    int copy;
} HostView;
static void drop_host(HostView *h) {
    if (h->copy) free(h->k), free(h->v), free(h->ks), free(h->vs);
}
static int get_host(const KVCache *kv, HostView *h) {
    *h = (HostView){dev_host(kv->dev, kv->kbuf), dev_host(kv->dev, kv->vbuf), NULL, NULL, 0};
    if (h->k) {
        h->ks = kv->ks ? dev_host(kv->dev, kv->ksbuf) : NULL, h->vs = kv->vs ? dev_host(kv->dev, kv->vsbuf) : NULL;
        return 0;
    }
    size_t d = dbuf_bytes(kv->kbuf), s = kv->ks ? dbuf_bytes(kv->ksbuf) : 0;
    *h = (HostView){malloc(d), malloc(d), s ? malloc(s) : NULL, s ? malloc(s) : NULL, 1};
    int rc = !h->k || !h->v || (s && (!h->ks || !h->vs)) || dev_download(kv->dev, h->k, kv->kbuf, d) ||
             dev_download(kv->dev, h->v, kv->vbuf, d) ||
             (s && (dev_download(kv->dev, h->ks, kv->ksbuf, s) || dev_download(kv->dev, h->vs, kv->vsbuf, s)));
    if (rc) drop_host(h);
    return rc ? -1 : 0;
}
static void put_host(KVCache *kv, HostView *h) {
    if (h->copy) {
        size_t d = dbuf_bytes(kv->kbuf), s = kv->ks ? dbuf_bytes(kv->ksbuf) : 0;
        dev_upload(kv->dev, kv->kbuf, h->k, d), dev_upload(kv->dev, kv->vbuf, h->v, d);
        if (s) dev_upload(kv->dev, kv->ksbuf, h->ks, s), dev_upload(kv->dev, kv->vsbuf, h->vs, s);
    }
    drop_host(h);
}

/* the same call forward.c makes, so a test's cache holds what a forward pass writes */
void kv_write(KVCache *kv, int seq, int layer, int slot, const float *k, const float *v) {
    const int *table = kv_table(kv, seq);
    int32_t s = slot;
    float *row = malloc(sizeof(float) * 2 * kv->kv_dim); /* k | v, as the projection's row holds them */
    HostView h;
    if (!row || get_host(kv, &h)) return free(row);
    memcpy(row, k, sizeof(float) * kv->kv_dim);
    memcpy(row + kv->kv_dim, v, sizeof(float) * kv->kv_dim);
    size_t lo = layer_off(kv, layer) * kv->elem, so = scale_off(kv, layer);
    k_kv_write_typed(kv->type, (char *)h.k + lo, (char *)h.v + lo, h.ks ? h.ks + so : NULL, h.vs ? h.vs + so : NULL,
                     kv_block_stride(kv), kv_scale_stride(kv), kv->block_size, kv->n_kv_heads,
                     kv->kv_dim / kv->n_kv_heads, &table, &s, row, 0, (size_t)kv->kv_dim, 1);
    put_host(kv, &h);
    free(row);
}

static float elem_at(const KVCache *kv, const void *base, const float *scale, size_t at, size_t sat) {
    if (kv->type == KV_F32) return ((const float *)base)[at];
    if (kv->type == KV_Q8_0) return scale[sat] * (float)((const int8_t *)base)[at];
    uint32_t w = (uint32_t)((const uint16_t *)base)[at] << 16;
    float f;
    memcpy(&f, &w, sizeof f);
    return f;
}

void kv_read(const KVCache *kv, int seq, int layer, int slot, float *k, float *v) {
    int blk = kv_table(kv, seq)[slot / kv->block_size], i = slot % kv->block_size, hd = kv->kv_dim / kv->n_kv_heads;
    size_t b = (size_t)blk * kv_block_stride(kv), sb = (size_t)blk * kv_scale_stride(kv);
    HostView h;
    if (get_host(kv, &h)) {
        for (int d = 0; d < kv->kv_dim; d++) k[d] = v[d] = NAN;
        return;
    }
    size_t lo = layer_off(kv, layer) * kv->elem, so = scale_off(kv, layer);
    const void *K = (char *)h.k + lo, *V = (char *)h.v + lo;
    const float *KS = h.ks ? h.ks + so : NULL, *VS = h.vs ? h.vs + so : NULL;
    for (int d = 0; d < kv->kv_dim; d++) {
        size_t at = b + (size_t)d * kv->block_size + i, sat = sb + (size_t)(d / hd) * kv->block_size + i;
        k[d] = elem_at(kv, K, KS, at, sat);
        v[d] = elem_at(kv, V, VS, at, sat);
    }
    drop_host(&h);
}

static int run_moves(KVCache *kv, const int64_t *list, int n);
static int moves_reserve(KVCache *kv, size_t n);

/* where slot i of block blk's column starts in k or v (col() for a sequence's slot) */
static size_t block_col(const KVCache *kv, int blk, int layer, int i) {
    return (size_t)blk * kv_block_stride(kv) + layer_off(kv, layer) + i;
}

/* seq goes on writing into its block i after its first `used` slots: a block another
   sequence holds is copied first, and a published one leaves the cache */
static int own_block(KVCache *kv, int seq, int i, int used) {
    int *tab = kv->table + (size_t)seq * kv->max_blocks, old = tab[i];
    if (kv->ref[old] == 1) return unpublish(kv, old), 0;
    size_t most = (size_t)used * kv->n_layers;
    int b = moves_reserve(kv, most) ? -1 : block_take(kv);
    int64_t *list = b >= 0 ? malloc(sizeof(int64_t) * 2 * most) : NULL, *w = list;
    if (!list) {
        if (b >= 0) block_drop(kv, b);
        return pd_error("kv cache: no block to copy a shared block into");
    }
    for (int l = 0; l < kv->n_layers; l++)
        for (int s = 0; s < used; s++) *w++ = (int64_t)block_col(kv, old, l, s), *w++ = (int64_t)block_col(kv, b, l, s);
    int rc = run_moves(kv, list, (int)most);
    free(list);
    if (rc) return block_drop(kv, b), -1;
    tab[i] = b;
    block_drop(kv, old);
    return table_upload(kv, seq, i, i + 1);
}

int kv_truncate(KVCache *kv, int seq, int len) {
    if (len < 0) return pd_error("kv cache: cannot truncate to %d", len);
    int *l = kv->len + (size_t)seq * kv->n_layers, hi = 0;
    for (int i = 0; i < kv->n_layers; i++) {
        if (l[i] > len) l[i] = len;
        hi = l[i] > hi ? l[i] : hi;
    }
    int keep = (hi + kv->block_size - 1) / kv->block_size;
    int *tab = kv->table + (size_t)seq * kv->max_blocks;
    while (kv->n_table[seq] > keep) block_drop(kv, tab[--kv->n_table[seq]]);
    return hi % kv->block_size ? own_block(kv, seq, keep - 1, hi % kv->block_size) : 0;
}

/* the list's room: a count (8 bytes, for alignment) then n {src, dst} pairs */
static int moves_reserve(KVCache *kv, size_t n) {
    if (n <= kv->cap_moves) return 0;
    DevBuf b, s = {0};
    if (dev_alloc(kv->dev, 8 + sizeof(int64_t) * 2 * n, &b)) return pd_error("kv cache: %s", dev_errmsg());
    if (kv->ks && dev_alloc(kv->dev, sizeof(int64_t) * 2 * n, &s)) {
        dev_free(kv->dev, b);
        return pd_error("kv cache: %s", dev_errmsg());
    }
    dev_free(kv->dev, kv->moves);
    dev_free(kv->dev, kv->smoves);
    kv->moves = b, kv->smoves = s, kv->cap_moves = n;
    return 0;
}

/* where a slot's column (kv_dim elements, block_size apart) starts in k or v */
static size_t col(const KVCache *kv, int seq, int layer, int slot) {
    return block_col(kv, kv_table(kv, seq)[slot / kv->block_size], layer, slot % kv->block_size);
}

/* list: the values' {src, dst} pairs as col() gives them; the scales' pairs follow
   from them */
static int run_moves(KVCache *kv, const int64_t *list, int n) {
    int32_t count = n;
    if (!n) return 0;
    size_t per_layer = (size_t)kv->block_size * kv->kv_dim, stride = kv_block_stride(kv);
    if (kv->ks) { /* col() → scale_col(): block, layer and slot in the block */
        int64_t *sl = malloc(sizeof(int64_t) * 2 * n);
        if (!sl) return pd_error("kv cache: out of memory moving slots");
        for (int i = 0; i < 2 * n; i++) {
            size_t c = (size_t)list[i], blk = c / stride, in = c % stride, layer = in / per_layer,
                   slot = in % per_layer;
            sl[i] = (int64_t)(blk * kv_scale_stride(kv) + layer * kv->block_size * kv->n_kv_heads + slot);
        }
        int rc = dev_upload(kv->dev, kv->smoves, sl, sizeof(int64_t) * 2 * n);
        free(sl);
        if (rc) return pd_error("kv cache: %s", dev_errmsg());
    }
    if (dev_upload(kv->dev, kv->moves, &count, sizeof count) ||
        dev_upload(kv->dev, dbuf_at(kv->moves, 8), list, sizeof(int64_t) * 2 * n) ||
        dev_move_cols_elem(kv->dev, kv->kbuf, dbuf_at(kv->moves, 8), kv->moves, n, kv->kv_dim, kv->block_size,
                           kv->elem) ||
        dev_move_cols_elem(kv->dev, kv->vbuf, dbuf_at(kv->moves, 8), kv->moves, n, kv->kv_dim, kv->block_size,
                           kv->elem) ||
        (kv->ks && (dev_move_cols(kv->dev, kv->ksbuf, kv->smoves, kv->moves, n, kv->n_kv_heads, kv->block_size) ||
                    dev_move_cols(kv->dev, kv->vsbuf, kv->smoves, kv->moves, n, kv->n_kv_heads, kv->block_size))) ||
        dev_sync(kv->dev))
        return pd_error("kv cache: %s", dev_errmsg());
    return 0;
}

int kv_keep_path(KVCache *kv, int seq, int base, const int *path, int n) {
    for (int l = 0; l < kv->n_layers; l++) /* all checked before anything moves */
        for (int i = 0; i < n; i++) {
            int from = base + path[i];
            if (from != base + i && (from < base + i || from >= kv_len(kv, seq, l)))
                return pd_error("kv cache: path entry %d is not an increasing filled slot", path[i]);
        }
    size_t most = (size_t)(n > 0 ? n : 0) * kv->n_layers;
    if (most && moves_reserve(kv, most)) return -1;
    int64_t *list = malloc(sizeof(int64_t) * 2 * (most ? most : 1)), *w = list;
    if (!list) return pd_error("kv cache: out of memory keeping a path");
    for (int l = 0; l < kv->n_layers; l++)
        for (int i = 0; i < n; i++)
            if (path[i] != i)
                *w++ = (int64_t)col(kv, seq, l, base + path[i]), *w++ = (int64_t)col(kv, seq, l, base + i);
    int rc = run_moves(kv, list, (int)((w - list) / 2));
    free(list);
    if (rc) return -1;
    return kv_truncate(kv, seq, base + n);
}

int kv_fork(KVCache *kv, int seq, int len) {
    int s = kv_seq_new(kv);
    if (s < 0) return -1;
    size_t most = (size_t)(len > 0 ? len : 0) * kv->n_layers;
    if (kv_reserve(kv, s, len) || (most && moves_reserve(kv, most))) {
        kv_seq_free(kv, s);
        return -1;
    }
    int64_t *list = malloc(sizeof(int64_t) * 2 * (most ? most : 1)), *w = list;
    if (!list) {
        kv_seq_free(kv, s);
        return pd_error("kv cache: out of memory forking a sequence");
    }
    for (int l = 0; l < kv->n_layers; l++) {
        int n = kv_len(kv, seq, l) < len ? kv_len(kv, seq, l) : len;
        for (int i = 0; i < n; i++) *w++ = (int64_t)col(kv, seq, l, i), *w++ = (int64_t)col(kv, s, l, i);
        kv_set_len(kv, s, l, n);
    }
    int rc = run_moves(kv, list, (int)((w - list) / 2));
    free(list);
    if (rc) {
        kv_seq_free(kv, s);
        return -1;
    }
    return s;
}

/* ---- the prefix cache ---- */

/* block b's states, slot 0's first */
static float *block_states(const KVCache *kv, int b) { return kv->states + (size_t)b * kv->block_size * kv->state_dim; }

int kv_prefix_states(KVCache *kv, int dim) {
    size_t n = pd_mul(pd_mul((size_t)kv->n_blocks, kv->block_size), dim);
    if (n >= SIZE_MAX / sizeof(float) || !(kv->states = calloc(n, sizeof(float))) ||
        !(kv->stated = calloc(kv->n_blocks, 1))) {
        free(kv->states), kv->states = NULL;
        return pd_error("kv cache: out of memory for the prefix cache's states");
    }
    kv->state_dim = dim;
    return 0;
}

int kv_prefix_attach(KVCache *kv, int seq, const int32_t *tok, int n, float *states) {
    if (kv->n_table[seq] || (states && !kv->states)) return 0; /* only an empty sequence starts from a prefix */
    int bs = kv->block_size, *tab = kv->table + (size_t)seq * kv->max_blocks, prev = -1;
    uint64_t h = 0;
    size_t per = (size_t)bs * kv->state_dim;
    for (int i = 0; i < n / bs && i < kv->max_blocks; i++) {
        kv->prefix_queried++;
        h = chain_hash(kv, h, tok + (size_t)i * bs);
        int b = map_find(kv, h, tok + (size_t)i * bs, prev, prev >= 0 ? kv->gen[prev] : 0);
        if (b < 0 || (states && !kv->stated[b])) break;
        if (states) memcpy(states + i * per, block_states(kv, b), sizeof(float) * per);
        if (!kv->ref[b]++) lru_unlink(kv, b);
        tab[kv->n_table[seq]++] = b;
        kv->prefix_hits++;
        prev = b;
    }
    int got = kv->n_table[seq] * bs;
    for (int l = 0; l < kv->n_layers; l++) kv_set_len(kv, seq, l, got);
    if (table_upload(kv, seq, 0, kv->n_table[seq])) {
        kv_truncate(kv, seq, 0);
        return 0; /* a failed upload: the sequence computes everything itself */
    }
    return got;
}

/* the published blocks that hold tok's first full blocks take their states, where they
   lack them: whoever published them, the contents are the same */
static void fill_states(KVCache *kv, const int32_t *tok, int n, const float *states) {
    int bs = kv->block_size, prev = -1;
    size_t per = (size_t)bs * kv->state_dim;
    uint64_t h = 0;
    for (int i = 0; i < n / bs; i++) {
        h = chain_hash(kv, h, tok + (size_t)i * bs);
        int b = map_find(kv, h, tok + (size_t)i * bs, prev, prev >= 0 ? kv->gen[prev] : 0);
        if (b < 0) return;
        if (!kv->stated[b]) memcpy(block_states(kv, b), states + i * per, sizeof(float) * per), kv->stated[b] = 1;
        prev = b;
    }
}

void kv_prefix_publish(KVCache *kv, int seq, const int32_t *tok, int n, const float *states, int n_states) {
    int bs = kv->block_size, prev = -1;
    for (int l = 0; l < kv->n_layers; l++) n = kv_len(kv, seq, l) < n ? kv_len(kv, seq, l) : n;
    const int *tab = kv_table(kv, seq);
    uint64_t h = 0;
    for (int i = 0; i < n / bs; i++) {
        int b = tab[i];
        const int32_t *t = tok + (size_t)i * bs;
        h = chain_hash(kv, h, t);
        if (!kv->hash[b]) {
            if (map_find(kv, h, t, prev, prev >= 0 ? kv->gen[prev] : 0) >= 0) break; /* another block holds it */
            kv->hash[b] = h, kv->prev[b] = prev, kv->prev_gen[b] = prev >= 0 ? kv->gen[prev] : 0;
            memcpy(kv->btok + (size_t)b * bs, t, sizeof(int32_t) * bs);
            map_insert(kv, b);
            if (kv->states) kv->stated[b] = 0;
        } else if (kv->hash[b] != h) break; /* published under other tokens (cannot be: its contents are these) */
        prev = b;
    }
    if (kv->states && states) fill_states(kv, tok, n < n_states ? n : n_states, states);
}
