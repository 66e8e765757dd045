/* eagle_head.c — the EAGLE head's parameters, its file, and the head ready to draft. */
#include "heads/eagle_head.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "heads/bundle.h"
#include "model/checkpoint.h"
#include "model/forward.h"

#define KIND "eagle-head"

/* the layer's tensors: name, its row letter and column letter (config_size) */
static const struct {
    const char *name;
    char rows, cols;
    size_t off; /* of the pointer in EagleParams */
} LAYER[] = {
    {"input_layernorm.weight", 0, 'D', offsetof(EagleParams, attn_norm)},
    {"mlp.down_proj.weight", 'D', 'H', offsetof(EagleParams, w2)},
    {"mlp.gate_proj.weight", 'H', 'D', offsetof(EagleParams, w1)},
    {"mlp.up_proj.weight", 'H', 'D', offsetof(EagleParams, w3)},
    {"post_attention_layernorm.weight", 0, 'D', offsetof(EagleParams, ffn_norm)},
    {"self_attn.k_proj.weight", 'K', 'D', offsetof(EagleParams, wk)},
    {"self_attn.o_proj.weight", 'D', 'Q', offsetof(EagleParams, wo)},
    {"self_attn.q_proj.weight", 'Q', 'D', offsetof(EagleParams, wq)},
    {"self_attn.v_proj.weight", 'K', 'D', offsetof(EagleParams, wv)},
};
#define N_LAYER (int)(sizeof LAYER / sizeof LAYER[0])

static float **field(EagleParams *p, int i) { return (float **)((char *)p + LAYER[i].off); }
static int64_t rows_of(const Config *c, int i) { return LAYER[i].rows ? config_size(c, LAYER[i].rows) : 0; }
static int64_t cols_of(const Config *c, int i) { return config_size(c, LAYER[i].cols); }

/* the arena and every array of p for config c (K = c->vocab_size) */
static int params_alloc(EagleParams *p, const Config *c) {
    int64_t D = c->dim, K = c->vocab_size;
    size_t n = (size_t)(2 * D * D + 2 * D + K * D) * sizeof(float) + K * sizeof(int32_t) + 64 * (N_LAYER + 8);
    for (int i = 0; i < N_LAYER; i++) n += (size_t)((rows_of(c, i) ? rows_of(c, i) : 1) * cols_of(c, i)) * 4;
    if (arena_init(&p->arena, n)) return -1;
    p->c = *c;
    p->acc = -1;
    p->fc = arena_push(&p->arena, sizeof(float) * 2 * D * D);
    p->norm = arena_push(&p->arena, sizeof(float) * D);
    p->emb = arena_push(&p->arena, sizeof(float) * K * D);
    p->vocab = arena_push(&p->arena, sizeof(int32_t) * K);
    int ok = p->fc && p->norm && p->emb && p->vocab;
    for (int i = 0; i < N_LAYER && ok; i++)
        ok = (*field(p, i) =
                  arena_push(&p->arena, sizeof(float) * (rows_of(c, i) ? rows_of(c, i) : 1) * cols_of(c, i))) != NULL;
    return ok ? 0 : -1;
}

/* the draft layer's config: the target's widths, one layer, K tokens, tied, no biases */
static Config layer_config(const Model *m, int K) {
    Config c = m->c;
    c.n_layers = 1;
    c.vocab_size = K;
    c.tied = 1;
    c.qkv_bias = 0;
    return c;
}

static void mat_rows_f32(const Mat *w, float *out) {
    for (int r = 0; r < w->rows; r++) mat_row_f32(w, r, out + (size_t)r * w->cols);
}

int eagle_params_init(EagleParams *p, const Model *m, const int32_t *vocab, int K) {
    memset(p, 0, sizeof *p);
    int V = m->c.vocab_size, D = m->c.dim;
    if (K < 1 || K > V) return pd_error("eagle: a draft vocabulary of %d tokens (1 to %d)", K, V);
    Config c = layer_config(m, K);
    if (params_alloc(p, &c)) return -1;
    const Layer *L = &m->layers[m->c.n_layers - 1];
    const Mat *src[N_LAYER] = {NULL, &L->w2, &L->w1, &L->w3, NULL, &L->wk, &L->wo, &L->wq, &L->wv};
    for (int i = 0; i < N_LAYER; i++)
        if (src[i]) mat_rows_f32(src[i], *field(p, i));
    memcpy(p->attn_norm, L->attn_norm, sizeof(float) * D);
    memcpy(p->ffn_norm, L->ffn_norm, sizeof(float) * D);
    memcpy(p->norm, m->final_norm, sizeof(float) * D);
    memset(p->fc, 0, sizeof(float) * 2 * D * D);
    for (int i = 0; i < D; i++) p->fc[(size_t)i * 2 * D + D + i] = 1; /* x = f at the start */
    uint8_t *seen = calloc((size_t)V, 1);
    if (!seen) return eagle_params_free(p), pd_error("eagle: out of memory");
    int rc = 0;
    for (int k = 0; k < K && !rc; k++) {
        if (vocab[k] < 0 || vocab[k] >= V || seen[vocab[k]])
            rc = pd_error("eagle: draft token %d is target id %d: out of range or twice", k, vocab[k]);
        else {
            seen[vocab[k]] = 1;
            p->vocab[k] = vocab[k];
            model_lm_head_row(m, vocab[k], p->emb + (size_t)k * D);
        }
    }
    free(seen);
    snprintf(p->model_digest, sizeof p->model_digest, "%s", m->digest);
    if (rc) eagle_params_free(p);
    return rc;
}

static const int64_t *count_of;
static int by_count(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (count_of[x] != count_of[y]) return count_of[x] > count_of[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

int eagle_vocab_from_counts(const Model *m, const int32_t *tokens, int64_t n, int K, int32_t *vocab) {
    int V = m->c.vocab_size;
    if (K < 1 || K > V) return pd_error("eagle: a draft vocabulary of %d tokens (1 to %d)", K, V);
    int64_t *count = calloc((size_t)V, sizeof *count);
    int32_t *ids = malloc(sizeof *ids * (size_t)V);
    if (!count || !ids) return free(count), free(ids), pd_error("eagle: out of memory");
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] >= 0 && tokens[i] < V) count[tokens[i]]++;
    for (int v = 0; v < V; v++) ids[v] = v;
    count_of = count;
    qsort(ids, (size_t)V, sizeof *ids, by_count);
    memcpy(vocab, ids, sizeof *ids * (size_t)K);
    free(count);
    free(ids);
    return 0;
}

int eagle_params_save(const EagleParams *p, const char *path, const char *const *meta, int n_meta) {
    const Config *c = &p->c;
    int64_t D = c->dim, K = c->vocab_size;
    ModelWriter mw;
    if (p->dt != DT_F32 && p->dt != DT_BF16) return pd_error("%s: an EAGLE head is stored F32 or BF16", path);
    if (mw_begin(&mw, path, p->dt)) return -1;
    char name[128], k_str[32], acc[32];
    int64_t emb[2] = {K, D}, fc[2] = {D, 2 * D}, vec[2] = {D, 1}, voc[1] = {K};
    int rc = mw_add(&mw, NAME_EMBED, 2, emb, p->emb);
    for (int i = 0; i < N_LAYER && !rc; i++) {
        layer_tensor_name(name, sizeof name, 0, LAYER[i].name);
        int64_t shape[2] = {rows_of(c, i) ? rows_of(c, i) : cols_of(c, i), cols_of(c, i)};
        rc = mw_add(&mw, name, rows_of(c, i) ? 2 : 1, shape, *field((EagleParams *)p, i));
    }
    if (!rc) { /* W_fc stays F32 whatever dt, the vocabulary is I32: written and hashed as mw_add would */
        model_digest_update(mw.hash, "eagle.fc", DT_F32, fc, p->fc, sizeof(float) * 2 * D * D);
        model_digest_update(mw.hash, "eagle.vocab", DT_I32, (int64_t[2]){K, 1}, p->vocab, sizeof(int32_t) * K);
        rc = tfw_add(mw.w, "eagle.fc", DT_F32, 2, fc, p->fc) || tfw_add(mw.w, "eagle.vocab", DT_I32, 1, voc, p->vocab);
    }
    rc = rc || mw_add(&mw, NAME_NORM, 1, vec, p->norm);
    if (rc) return mw_abort(&mw), -1;
    snprintf(k_str, sizeof k_str, "%lld", (long long)K);
    snprintf(acc, sizeof acc, "%.6f", p->acc);
    const char **all = malloc(sizeof(char *) * (size_t)(2 * n_meta + 6));
    if (!all) return mw_abort(&mw), pd_error("eagle: out of memory");
    all[0] = "paradec.model_digest", all[1] = p->model_digest;
    all[2] = "paradec.eagle.vocab", all[3] = k_str;
    int n = 2;
    if (p->acc >= 0) all[4] = "paradec.eagle.acc", all[5] = acc, n++;
    if (n_meta) memcpy(all + 2 * n, meta, sizeof(char *) * 2 * (size_t)n_meta);
    mw.meta = all;
    mw.n_meta = n + n_meta;
    mw.kind = KIND;
    rc = mw_commit(&mw, c, NULL, 0, NULL);
    free(all);
    return rc;
}

/* the view of tf's eagle head, its kind and its target checked; *c its layer config */
static int open_view(const TensorFile *tf, const Model *m, TensorFile *view, Config *c, const char *what) {
    if (bundle_view(tf, KIND, view, what)) return -1;
    const char *kind = tf_meta(view, "paradec.kind"), *cfg = tf_meta(view, "paradec.config");
    const char *dig = tf_meta(view, "paradec.model_digest");
    int rc = 0;
    if (!kind || strcmp(kind, KIND))
        rc = pd_error("%s: not an EAGLE head (paradec.kind is '%s')", what, kind ? kind : "missing");
    else if (!cfg || !dig) rc = pd_error("%s: paradec.config or paradec.model_digest is missing", what);
    rc = rc ? rc : tf_verify(view, NULL);
    rc = rc ? rc : config_from_json(c, cfg, what);
    if (!rc) {
        const Config *t = &m->c;
        if (c->vocab_size < 1 || c->vocab_size > t->vocab_size || c->n_layers != 1 || !c->tied || c->qkv_bias ||
            c->dim != t->dim || c->hidden_dim != t->hidden_dim || c->n_heads != t->n_heads ||
            c->n_kv_heads != t->n_kv_heads || c->head_dim != t->head_dim)
            rc = pd_error("%s: an EAGLE head of other shapes than this model's (%d layers, dim %d, vocabulary %d)",
                          what, c->n_layers, c->dim, c->vocab_size);
        else if (strcmp(dig, m->digest))
            rc = pd_error("%s: head trained for model %s, but this model is %s", what, dig,
                          m->digest[0] ? m->digest : "(no digest)");
    }
    if (rc) tf_close(view);
    return rc;
}

/* the vocabulary tensor: [K] I32, every id in the target's range, none twice */
static int read_vocab(const TensorFile *tf, const Model *m, int K, int32_t *out, const char *what) {
    const Tensor *t;
    if (tf_expect(tf, "eagle.vocab", DT_I32, 1, (int64_t[]){K}, &t)) return -1;
    uint8_t *seen = calloc((size_t)m->c.vocab_size, 1);
    if (!seen) return pd_error("eagle: out of memory");
    memcpy(out, t->data, sizeof(int32_t) * (size_t)K);
    int rc = 0;
    for (int k = 0; k < K && !rc; k++)
        if (out[k] < 0 || out[k] >= m->c.vocab_size || seen[out[k]]++)
            rc = pd_error("%s: eagle.vocab[%d] = %d: out of range or twice", what, k, out[k]);
    free(seen);
    return rc;
}

static float acc_of(const TensorFile *tf) {
    const char *a = tf_meta(tf, "paradec.eagle.acc");
    return a ? strtof(a, NULL) : -1;
}

int eagle_params_load(EagleParams *p, const char *path, const Model *m) {
    memset(p, 0, sizeof *p);
    TensorFile tf, view;
    Config c;
    if (tf_open(&tf, path)) return -1;
    int rc = open_view(&tf, m, &view, &c, path);
    if (rc) return tf_close(&tf), -1;
    rc = params_alloc(p, &c);
    int64_t D = c.dim, K = c.vocab_size;
    const Tensor *t;
    char name[128];
    for (int i = 0; i < N_LAYER + 3 && !rc; i++) {
        int64_t shape[2];
        const char *nm = NULL;
        float *dst = NULL;
        int nd = 2;
        if (i < N_LAYER) {
            layer_tensor_name(name, sizeof name, 0, LAYER[i].name);
            nm = name, dst = *field(p, i), nd = rows_of(&c, i) ? 2 : 1;
            shape[0] = nd == 2 ? rows_of(&c, i) : cols_of(&c, i), shape[1] = cols_of(&c, i);
        } else if (i == N_LAYER) nm = NAME_EMBED, dst = p->emb, shape[0] = K, shape[1] = D;
        else if (i == N_LAYER + 1) nm = "eagle.fc", dst = p->fc, shape[0] = D, shape[1] = 2 * D;
        else nm = NAME_NORM, dst = p->norm, nd = 1, shape[0] = D;
        t = tf_get(&view, nm);
        DType dt = t && t->dtype == DT_BF16 && i != N_LAYER + 1 ? DT_BF16 : DT_F32;
        rc = tf_expect(&view, nm, dt, nd, shape, &t);
        if (rc) break;
        if (dt == DT_F32) memcpy(dst, t->data, t->nbytes);
        else { /* bf16: the high half of an f32 */
            const uint16_t *b = t->data;
            for (size_t e = 0; e < t->nbytes / 2; e++) {
                uint32_t u = (uint32_t)b[e] << 16;
                memcpy(dst + e, &u, sizeof u);
            }
            p->dt = DT_BF16;
        }
    }
    rc = rc ? rc : read_vocab(&view, m, (int)K, p->vocab, path);
    if (!rc) {
        p->acc = acc_of(&view);
        snprintf(p->model_digest, sizeof p->model_digest, "%s", m->digest);
    }
    tf_close(&view);
    tf_close(&tf);
    if (rc) eagle_params_free(p);
    return rc;
}

void eagle_params_free(EagleParams *p) {
    arena_free(&p->arena);
    memset(p, 0, sizeof *p);
}

int eagle_load_tf(EagleHead *h, const TensorFile *tf, const Model *m, const char *what) {
    memset(h, 0, sizeof *h);
    TensorFile view;
    Config c;
    if (open_view(tf, m, &view, &c, what)) return -1;
    const Tensor *fc;
    int D = c.dim, K = c.vocab_size, rc = tf_expect(&view, "eagle.fc", DT_F32, 2, (int64_t[]){D, 2 * D}, &fc);
    h->K = K;
    h->acc = acc_of(&view);
    size_t fb = linear_bytes(LINEAR_F32, D, 2 * D);
    rc = rc ? rc : arena_init(&h->arena, fb + sizeof(int32_t) * (size_t)K + 128);
    void *mem = rc ? NULL : arena_push(&h->arena, fb);
    h->vocab = mem ? arena_push(&h->arena, sizeof(int32_t) * (size_t)K) : NULL;
    rc = rc ? rc : !h->vocab ? -1 : read_vocab(&view, m, K, h->vocab, what);
    rc = rc ? rc : linear_pack(&h->fc, mem, LINEAR_F32, fc->data, D, 2 * D);
    if (rc) {
        tf_close(&view);
        eagle_free(h);
        return -1;
    }
    if (model_load_layers(&h->layer, &view)) { /* it took the view over */
        eagle_free(h);
        return -1;
    }
    return 0;
}

int eagle_load(EagleHead *h, const char *path, const Model *m) {
    TensorFile tf;
    if (tf_open(&tf, path)) return -1;
    if (eagle_load_tf(h, &tf, m, path)) return tf_close(&tf), -1;
    h->file = tf, h->own_file = 1;
    return 0;
}

void eagle_free(EagleHead *h) {
    if (h->layer.layers) model_free(&h->layer);
    arena_free(&h->arena);
    if (h->own_file) tf_close(&h->file);
    memset(h, 0, sizeof *h);
}

void eagle_input(const EagleHead *h, const Model *m, const int32_t *tok, const float *feat, int n, float *u, float *x) {
    size_t D = (size_t)m->c.dim;
    for (int i = 0; i < n; i++) {
        embed_tokens(m, tok + i, 1, u + i * 2 * D);
        memcpy(u + i * 2 * D + D, feat + i * D, sizeof(float) * D);
    }
    linear_apply(&h->fc, x, u, n);
}
