/* kvcache.c — see kvcache.h */
#include "model/kvcache.h"

#include <stdlib.h>
#include <string.h>

int kv_init(KVCache *kv, const Config *c, int max_seqs, int max_tokens, int block_size) {
    memset(kv, 0, sizeof *kv);
    if (max_seqs < 1 || max_tokens < 1 || block_size < 1) return pd_error("kv cache: bad sizes");
    kv->n_layers = c->n_layers;
    kv->kv_dim = c->n_kv_heads * c->head_dim;
    kv->block_size = block_size;
    kv->max_seqs = max_seqs;
    kv->max_blocks = (c->seq_len + block_size - 1) / block_size;
    kv->n_blocks = (max_tokens + block_size - 1) / block_size;
    size_t block = pd_mul(pd_mul((size_t)kv->n_layers, block_size), pd_mul(kv->kv_dim, sizeof(float)));
    size_t data = pd_mul(block, kv->n_blocks);
    size_t ints = sizeof(int) * ((size_t)kv->n_blocks + (size_t)max_seqs * (kv->max_blocks + 1 + kv->n_layers));
    if (data >= SIZE_MAX / 4 || arena_init(&kv->arena, 2 * data + ints + max_seqs + 5 * 64))
        return pd_error_prefix("kv cache");
    kv->k = arena_push(&kv->arena, data);
    kv->v = arena_push(&kv->arena, data);
    kv->free_blocks = arena_push(&kv->arena, sizeof(int) * kv->n_blocks);
    kv->table = arena_push(&kv->arena, sizeof(int) * (size_t)max_seqs * kv->max_blocks);
    kv->n_table = arena_push(&kv->arena, sizeof(int) * max_seqs);
    kv->len = arena_push(&kv->arena, sizeof(int) * (size_t)max_seqs * kv->n_layers);
    kv->live = arena_push(&kv->arena, max_seqs);
    for (int i = 0; i < kv->n_blocks; i++) kv->free_blocks[i] = kv->n_blocks - 1 - i;
    kv->n_free = kv->n_blocks;
    /* wrapped, not allocated: the arena maps its pages lazily, as a big pool needs */
    if (!(kv->dev = dev_open("cpu")) || dev_wrap(kv->dev, kv->k, data, &kv->kbuf) ||
        dev_wrap(kv->dev, kv->v, data, &kv->vbuf)) {
        pd_error("kv cache: %s", dev_errmsg());
        kv_free(kv);
        return -1;
    }
    return 0;
}

void kv_free(KVCache *kv) {
    if (kv->dev) {
        dev_free(kv->dev, kv->kbuf);
        dev_free(kv->dev, kv->vbuf);
        dev_free(kv->dev, kv->moves);
        dev_close(kv->dev);
    }
    arena_free(&kv->arena);
    memset(kv, 0, sizeof *kv);
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

int kv_reserve(KVCache *kv, int seq, int slots) {
    int need = (slots + kv->block_size - 1) / kv->block_size;
    if (need > kv->max_blocks)
        return pd_error("context full: %d positions asked, the model holds %d", slots, kv->max_blocks * kv->block_size);
    int *tab = kv->table + (size_t)seq * kv->max_blocks;
    while (kv->n_table[seq] < need) {
        if (!kv->n_free) return pd_error("kv cache: out of blocks (%d in the pool)", kv->n_blocks);
        tab[kv->n_table[seq]++] = kv->free_blocks[--kv->n_free];
    }
    return 0;
}

size_t kv_block_stride(const KVCache *kv) { return (size_t)kv->n_layers * kv->block_size * kv->kv_dim; }
const float *kv_layer_k(const KVCache *kv, int layer) { return kv->k + (size_t)layer * kv->block_size * kv->kv_dim; }
const float *kv_layer_v(const KVCache *kv, int layer) { return kv->v + (size_t)layer * kv->block_size * kv->kv_dim; }
const int *kv_table(const KVCache *kv, int seq) { return kv->table + (size_t)seq * kv->max_blocks; }

/* the slot's block for this layer: its offset in k (or v) */
static size_t block_at(const KVCache *kv, int seq, int layer, int slot) {
    int blk = kv_table(kv, seq)[slot / kv->block_size];
    return (size_t)blk * kv_block_stride(kv) + (size_t)layer * kv->block_size * kv->kv_dim;
}

void kv_write(KVCache *kv, int seq, int layer, int slot, const float *k, const float *v) {
    size_t b = block_at(kv, seq, layer, slot);
    int i = slot % kv->block_size;
    for (int d = 0; d < kv->kv_dim; d++) {
        kv->k[b + (size_t)d * kv->block_size + i] = k[d];
        kv->v[b + (size_t)d * kv->block_size + i] = v[d];
    }
}

void kv_read(const KVCache *kv, int seq, int layer, int slot, float *k, float *v) {
    size_t b = block_at(kv, seq, layer, slot);
    int i = slot % kv->block_size;
    for (int d = 0; d < kv->kv_dim; d++) {
        k[d] = kv->k[b + (size_t)d * kv->block_size + i];
        v[d] = kv->v[b + (size_t)d * kv->block_size + i];
    }
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
    while (kv->n_table[seq] > keep) kv->free_blocks[kv->n_free++] = tab[--kv->n_table[seq]];
    return 0;
}

/* the list's room: a count (8 bytes, for alignment) then n {src, dst} pairs */
static int moves_reserve(KVCache *kv, size_t n) {
    if (n <= kv->cap_moves) return 0;
    DevBuf b;
    if (dev_alloc(kv->dev, 8 + sizeof(int64_t) * 2 * n, &b)) return pd_error("kv cache: %s", dev_errmsg());
    dev_free(kv->dev, kv->moves);
    kv->moves = b, kv->cap_moves = n;
    return 0;
}

/* where a slot's column (kv_dim floats, block_size apart) starts in k or v */
static size_t col(const KVCache *kv, int seq, int layer, int slot) {
    int blk = kv_table(kv, seq)[slot / kv->block_size];
    return (size_t)blk * kv_block_stride(kv) + (size_t)layer * kv->block_size * kv->kv_dim + slot % kv->block_size;
}

static int run_moves(KVCache *kv, const int64_t *list, int n) {
    int32_t count = n;
    if (!n) return 0;
    if (dev_upload(kv->dev, kv->moves, &count, sizeof count) ||
        dev_upload(kv->dev, dbuf_at(kv->moves, 8), list, sizeof(int64_t) * 2 * n) ||
        dev_move_cols(kv->dev, kv->kbuf, dbuf_at(kv->moves, 8), kv->moves, n, kv->kv_dim, kv->block_size) ||
        dev_move_cols(kv->dev, kv->vbuf, dbuf_at(kv->moves, 8), kv->moves, n, kv->kv_dim, kv->block_size))
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
