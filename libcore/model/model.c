/* model.c — configuration JSON, loading a model file, the RoPE tables. */
#include "model/model.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxhash.h>

/* per-layer tensor suffixes, Hugging Face names */
static const char *const LAYER_NAMES[] = {
    "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight"};

void layer_tensor_name(char *out, size_t n, int layer, const char *what) {
    snprintf(out, n, "model.layers.%d.%s", layer, what);
}

char *config_to_json(const Config *c) {
    json_t *o = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b, s:b}", "architecture", "llama",
                          "hidden_size", c->dim, "intermediate_size", c->hidden_dim, "num_hidden_layers", c->n_layers,
                          "num_attention_heads", c->n_heads, "num_key_value_heads", c->n_kv_heads, "head_dim",
                          c->head_dim, "vocab_size", c->vocab_size, "max_position_embeddings", c->seq_len,
                          "rms_norm_eps", (double)c->norm_eps, "rope_theta", (double)c->rope_theta,
                          "tie_word_embeddings", c->tied, "attention_bias", c->qkv_bias);
    if (o && c->rope_factor > 0)
        json_object_set_new(o, "rope_scaling",
                            json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor",
                                      (double)c->rope_factor, "low_freq_factor", (double)c->rope_low_freq,
                                      "high_freq_factor", (double)c->rope_high_freq, "original_max_position_embeddings",
                                      c->rope_orig_ctx));
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(o);
    if (!s) pd_error("cannot encode the model config as JSON");
    return s;
}

static int get_int(json_t *o, const char *key, int *out, const char *what) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return pd_error("%s: config: '%s' missing or not an integer", what, key);
    json_int_t x = json_integer_value(v);
    if (x < 0 || x > (1 << 30)) return pd_error("%s: config: '%s' = %lld out of range", what, key, (long long)x);
    *out = (int)x;
    return 0;
}

static int get_num(json_t *o, const char *key, float *out, const char *what) {
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) return pd_error("%s: config: '%s' missing or not a number", what, key);
    *out = (float)json_number_value(v);
    return 0;
}

/* {"rope_type": "llama3", factor, low_freq_factor, high_freq_factor,
   original_max_position_embeddings}; any other type is refused by name */
int rope_scaling_from_json(Config *c, json_t *rs, const char *what) {
    json_t *type = json_object_get(rs, "rope_type");
    if (!type) type = json_object_get(rs, "type");
    if (!json_is_object(rs) || !json_is_string(type))
        return pd_error("%s: config: rope_scaling is not an object with a rope_type", what);
    if (strcmp(json_string_value(type), "llama3"))
        return pd_error("%s: config: rope_scaling type '%s' is not supported (paradec knows 'llama3')", what,
                        json_string_value(type));
    if (get_num(rs, "factor", &c->rope_factor, what) || get_num(rs, "low_freq_factor", &c->rope_low_freq, what) ||
        get_num(rs, "high_freq_factor", &c->rope_high_freq, what) ||
        get_int(rs, "original_max_position_embeddings", &c->rope_orig_ctx, what))
        return -1;
    if (!(c->rope_factor >= 1) || !(c->rope_high_freq > c->rope_low_freq) || c->rope_orig_ctx < 1)
        return pd_error("%s: config: rope_scaling values out of range", what);
    return 0;
}

int config_from_json(Config *c, const char *json, const char *what) {
    json_error_t err;
    json_t *o = json_loads(json, 0, &err);
    if (!json_is_object(o)) {
        json_decref(o);
        return pd_error("%s: config is not a JSON object (%s)", what, err.text);
    }
    memset(c, 0, sizeof *c);
    json_t *arch = json_object_get(o, "architecture");
    int rc = 0;
    if (!json_is_string(arch) || strcmp(json_string_value(arch), "llama"))
        rc = pd_error("%s: config: architecture '%s' is not supported (paradec runs 'llama')", what,
                      json_is_string(arch) ? json_string_value(arch) : "?");
    rc = rc ? rc : get_int(o, "hidden_size", &c->dim, what);
    rc = rc ? rc : get_int(o, "intermediate_size", &c->hidden_dim, what);
    rc = rc ? rc : get_int(o, "num_hidden_layers", &c->n_layers, what);
    rc = rc ? rc : get_int(o, "num_attention_heads", &c->n_heads, what);
    rc = rc ? rc : get_int(o, "num_key_value_heads", &c->n_kv_heads, what);
    rc = rc ? rc : get_int(o, "head_dim", &c->head_dim, what);
    rc = rc ? rc : get_int(o, "vocab_size", &c->vocab_size, what);
    rc = rc ? rc : get_int(o, "max_position_embeddings", &c->seq_len, what);
    rc = rc ? rc : get_num(o, "rms_norm_eps", &c->norm_eps, what);
    rc = rc ? rc : get_num(o, "rope_theta", &c->rope_theta, what);
    json_t *tied = json_object_get(o, "tie_word_embeddings");
    if (!rc && !json_is_boolean(tied))
        rc = pd_error("%s: config: 'tie_word_embeddings' missing or not a boolean", what);
    c->tied = json_is_true(tied);
    json_t *bias = json_object_get(o, "attention_bias");
    if (!rc && bias && !json_is_boolean(bias)) rc = pd_error("%s: config: 'attention_bias' is not a boolean", what);
    c->qkv_bias = json_is_true(bias);
    json_t *rs = json_object_get(o, "rope_scaling");
    if (!rc && rs && !json_is_null(rs)) rc = rope_scaling_from_json(c, rs, what);
    json_decref(o);
    return rc ? rc : config_check(c, what);
}

int64_t config_size(const Config *c, char k) {
    switch (k) {
    case 'D':
        return c->dim;
    case 'H':
        return c->hidden_dim;
    case 'Q':
        return (int64_t)c->n_heads * c->head_dim;
    case 'K':
        return (int64_t)c->n_kv_heads * c->head_dim;
    default:
        return 0;
    }
}

int config_check(const Config *c, const char *what) {
    if (c->dim < 1 || c->hidden_dim < 1 || c->n_layers < 1 || c->n_heads < 1 || c->n_kv_heads < 1 || c->head_dim < 2 ||
        c->vocab_size < 1 || c->seq_len < 1)
        return pd_error("%s: config: a size is zero or negative", what);
    if (c->n_heads % c->n_kv_heads)
        return pd_error("%s: config: %d heads are not a multiple of %d kv heads", what, c->n_heads, c->n_kv_heads);
    if (c->head_dim % 2) return pd_error("%s: config: head_dim %d is odd (RoPE needs pairs)", what, c->head_dim);
    if (!(c->norm_eps >= 0) || !(c->rope_theta > 0))
        return pd_error("%s: config: bad rms_norm_eps or rope_theta", what);
    if (c->seq_len > (1 << 22) || c->n_layers > 4096 || c->dim > (1 << 20) || c->n_heads > 4096 ||
        c->vocab_size > (1 << 24) || (int64_t)c->dim * c->hidden_dim > ((int64_t)1 << 34))
        return pd_error("%s: config: sizes beyond what paradec handles", what);
    if (c->head_dim > 4096 || (int64_t)c->n_heads * c->head_dim > (1 << 20))
        return pd_error("%s: config: %d heads of %d: sizes beyond what paradec handles", what, c->n_heads, c->head_dim);
    /* the RoPE tables (seq_len × head_dim floats) are built at load, before any weight
       is read: no file may make them huge */
    if ((int64_t)c->seq_len * c->head_dim > ((int64_t)1 << 28))
        return pd_error(
            "%s: config: a context of %d × head_dim %d would need %lld MiB of RoPE tables: beyond what paradec handles",
            what, c->seq_len, c->head_dim, (long long)c->seq_len * c->head_dim * 4 >> 20);
    return 0;
}

/* the matmul's name for a stored type; -1 for one it cannot read (F16, integers) */
static int wtype_of(DType d) {
    if (d == DT_F32) return WT_F32;
    if (d == DT_BF16) return WT_BF16;
    if (dtype_is_quant(d)) return WT_Q8_0 + (d - DT_Q8_0); /* the same order (tensorfile.h, backend.h) */
    return -1;
}

static DType dtype_of(WType t) { return t == WT_F32 ? DT_F32 : t == WT_BF16 ? DT_BF16 : DT_Q8_0 + (t - WT_Q8_0); }

/* a weight matrix: f32, bf16 or a GGUF block type, exactly [rows][cols] (a block type's
   logical shape); block types are multiplied where they lie in the file */
static int load_mat(Model *m, const char *name, int rows, int cols, Mat *out) {
    const Tensor *t = tf_get(&m->tf, name);
    if (!t) return pd_error("%s: tensor '%s' is missing", m->tf.path, name);
    int wt = wtype_of(t->dtype);
    if (wt < 0)
        return pd_error("%s: tensor '%s' is %s; paradec runs F32, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K or Q6_K",
                        m->tf.path, name, dtype_name(t->dtype));
    int64_t shape[2] = {rows, cols};
    if (tf_expect(&m->tf, name, t->dtype, 2, shape, &t)) return -1;
    /* the reader checks this; the kernels index rows by it, so make sure */
    size_t rb = dtype_row_bytes(t->dtype, cols);
    if (rb == SIZE_MAX || t->nbytes / (size_t)rows != rb || t->nbytes % (size_t)rows)
        return pd_error("%s: tensor '%s': %zu bytes for %d rows of %d %s elements", m->tf.path, name, t->nbytes, rows,
                        cols, dtype_name(t->dtype));
    *out = (Mat){(WType)wt, t->data, NULL, rows, cols};
    return 0;
}

/* a norm gain vector [n], converted to f32 in the arena whatever it is stored as */
static int load_vec(Model *m, const char *name, int n, const float **out) {
    const Tensor *t = tf_get(&m->tf, name);
    if (!t) return pd_error("%s: tensor '%s' is missing", m->tf.path, name);
    if (t->dtype != DT_F32 && t->dtype != DT_BF16)
        return pd_error("%s: tensor '%s' is %s; expected F32 or BF16", m->tf.path, name, dtype_name(t->dtype));
    int64_t shape[1] = {n};
    if (tf_expect(&m->tf, name, t->dtype, 1, shape, &t)) return -1;
    float *f = arena_push(&m->arena, sizeof(float) * n);
    if (!f) return -1;
    k_row_to_f32(f, t->data, t->dtype == DT_F32 ? WT_F32 : WT_BF16, 0, n);
    *out = f;
    return 0;
}

/* Llama 3.1's frequency scaling: long wavelengths slowed by factor, short ones kept,
   a smooth blend between (as Hugging Face's _compute_llama3_parameters) */
static float rope_scaled(const Config *c, float freq) {
    if (c->rope_factor <= 0) return freq;
    double low_wl = c->rope_orig_ctx / c->rope_low_freq, high_wl = c->rope_orig_ctx / c->rope_high_freq;
    double wl = 2 * M_PI / freq;
    if (wl < high_wl) return freq;
    if (wl > low_wl) return (float)(freq / c->rope_factor);
    double smooth = (c->rope_orig_ctx / wl - c->rope_low_freq) / (c->rope_high_freq - c->rope_low_freq);
    return (float)((1 - smooth) * freq / c->rope_factor + smooth * freq);
}

static int build_rope(Model *m) {
    const Config *c = &m->c;
    int half = c->head_dim / 2;
    size_t n = pd_mul((size_t)c->seq_len, half);
    m->rope_cos = arena_push(&m->arena, sizeof(float) * n);
    m->rope_sin = arena_push(&m->arena, sizeof(float) * n);
    if (!m->rope_cos || !m->rope_sin) return -1;
    for (int j = 0; j < half; j++) {
        /* llama2.c's formulation, so float rounding matches it */
        float freq = rope_scaled(c, 1.0f / powf(c->rope_theta, (2 * j) / (float)c->head_dim));
        for (int p = 0; p < c->seq_len; p++) {
            float a = p * freq;
            m->rope_cos[(size_t)p * half + j] = cosf(a);
            m->rope_sin[(size_t)p * half + j] = sinf(a);
        }
    }
    return 0;
}

static int load_biases(Model *m, int l, Layer *L) {
    const Config *c = &m->c;
    int q = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    char name[128];
    layer_tensor_name(name, sizeof name, l, "self_attn.q_proj.bias");
    if (load_vec(m, name, q, &L->bq)) return -1;
    layer_tensor_name(name, sizeof name, l, "self_attn.k_proj.bias");
    if (load_vec(m, name, kvd, &L->bk)) return -1;
    layer_tensor_name(name, sizeof name, l, "self_attn.v_proj.bias");
    return load_vec(m, name, kvd, &L->bv);
}

/* q|k|v and gate|up are each one matrix product (kernels/backend.h's k_pack): of one
   float type, or of block types that may differ (llama.cpp's Q4_K_M keeps v_proj in Q6_K
   in some layers: k_pack_blocks); a float mixed with another type is refused by name */
static int stackable(const Model *m, int l, const Mat *const *w, int n, const char *names) {
    int same = 1, blocks = 1, short_enough = 1;
    for (int i = 0; i < n; i++) {
        same &= w[i]->t == w[0]->t;
        blocks &= k_wtype_quant(w[i]->t);
        short_enough &= w[i]->rows <= K_MIXED_MAX_ROWS;
    }
    if (same || (blocks && short_enough)) return 0;
    char types[64] = "";
    for (int i = 0; i < n; i++)
        snprintf(types + strlen(types), sizeof types - strlen(types), "%s%s", i ? ", " : "", mat_type_name(w[i]));
    return pd_error("%s: layer %d: %s are %s: paradec multiplies them as one matrix, so they must share a type or all "
                    "be block types (of at most %d rows each); convert --dtype gives them one",
                    m->tf.path, l, names, types, K_MIXED_MAX_ROWS);
}

static int load_layers(Model *m) {
    const Config *c = &m->c;
    int q = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    char name[128];
    m->layers = arena_push(&m->arena, sizeof(Layer) * c->n_layers);
    if (!m->layers) return -1;
    for (int l = 0; l < c->n_layers; l++) {
        Layer *L = &m->layers[l];
        const char *const *N = LAYER_NAMES;
#define NM(i) (layer_tensor_name(name, sizeof name, l, N[i]), name)
        if (load_vec(m, NM(0), c->dim, &L->attn_norm) || load_mat(m, NM(1), q, c->dim, &L->wq) ||
            load_mat(m, NM(2), kvd, c->dim, &L->wk) || load_mat(m, NM(3), kvd, c->dim, &L->wv) ||
            load_mat(m, NM(4), c->dim, q, &L->wo) || load_vec(m, NM(5), c->dim, &L->ffn_norm) ||
            load_mat(m, NM(6), c->hidden_dim, c->dim, &L->w1) || load_mat(m, NM(7), c->hidden_dim, c->dim, &L->w3) ||
            load_mat(m, NM(8), c->dim, c->hidden_dim, &L->w2))
            return -1;
#undef NM
        const Mat *qkv[3] = {&L->wq, &L->wk, &L->wv}, *gu[2] = {&L->w1, &L->w3};
        if (stackable(m, l, qkv, 3, "q_proj, k_proj, v_proj") || stackable(m, l, gu, 2, "gate_proj, up_proj"))
            return -1;
        if (c->qkv_bias && load_biases(m, l, L)) return -1;
    }
    return 0;
}

static int load_tokenizer(Model *m) {
    const Tensor *t = tf_get(&m->tf, "tokenizer.bytes");
    const char *kind = tf_meta(&m->tf, "paradec.tokenizer");
    if (!t || !kind) return pd_error("%s: no tokenizer inside (convert with --tokenizer)", m->tf.path);
    if (t->dtype != DT_U8 || t->ndim != 1) return pd_error("%s: tensor 'tokenizer.bytes' must be 1-d U8", m->tf.path);
    if (strcmp(kind, "llama2c") && strcmp(kind, "hf-json") && strcmp(kind, "gguf"))
        return pd_error("%s: tokenizer kind '%s' is unknown", m->tf.path, kind);
    if (tok_load_bytes(&m->tok, t->data, t->nbytes, kind, m->tf.path)) return -1;
    /* a vocabulary may be padded past the tokenizer's pieces, never the other way */
    if (tok_vocab_size(m->tok) > m->c.vocab_size)
        return pd_error("%s: tokenizer has %d pieces but the model's vocabulary is %d", m->tf.path,
                        tok_vocab_size(m->tok), m->c.vocab_size);
    return 0;
}

static size_t page_size(void) {
    long pg = sysconf(_SC_PAGESIZE);
    return pg > 0 ? (size_t)pg : 4096;
}

/* the whole pages inside [p, p + n) go back to the kernel: in a private read-only file
   mapping they fault in again from the file if anything reads them, so nothing is lost */
static void drop_pages(const void *p, size_t n, size_t page) {
    uintptr_t a = ((uintptr_t)p + page - 1) & ~(uintptr_t)(page - 1), e = ((uintptr_t)p + n) & ~(uintptr_t)(page - 1);
    if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
}

static void drop_mat(const Mat *w, size_t page) {
    if (w->w && k_packed_copies(w->t)) drop_pages(w->w, (size_t)w->rows * mat_row_bytes(w), page);
}

/* what forward() multiplies, packed once into one arena: per layer q|k|v stacked,
   o, gate|up stacked, down; then the lm_head */
typedef struct {
    Mat *dst;
    const Mat *src[3];
} Pack;

static int pack_list(Model *m, Pack *out) {
    int n = 0;
    for (int l = 0; l < m->c.n_layers; l++) {
        Layer *L = &m->layers[l];
        out[n++] = (Pack){&L->qkv, {&L->wq, &L->wk, &L->wv}};
        out[n++] = (Pack){&L->wo, {&L->wo}};
        out[n++] = (Pack){&L->gate_up, {&L->w1, &L->w3}};
        out[n++] = (Pack){&L->w2, {&L->w2}};
    }
    out[n++] = (Pack){&m->lm_head, {&m->lm_head}};
    return n;
}

static int pack_shape(const Pack *p, Mat *shape, const void **src, int *rows, WType *types) {
    *shape = *p->src[0];
    shape->rows = 0;
    int n = 0;
    for (; n < 3 && p->src[n]; n++) {
        src[n] = p->src[n]->w;
        rows[n] = p->src[n]->rows;
        types[n] = p->src[n]->t;
        shape->rows += rows[n];
    }
    return n;
}

static size_t packed_bytes(const Pack *p) {
    Mat s;
    const void *src[3];
    int rows[3];
    WType types[3];
    int n = pack_shape(p, &s, src, rows, types);
    return k_wtype_quant(s.t) ? k_packed_bytes_blocks(s.cols, n, rows, types) : k_packed_bytes(s.t, s.rows, s.cols);
}

/* drop: the file's pages of each source the packed copy holds alone go back once packed (below) */
static int pack_weights(Model *m, int drop, size_t page) {
    Pack *list = pd_alloc(sizeof(Pack) * (4 * m->c.n_layers + 1));
    if (!list) return -1;
    int n = pack_list(m, list);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (packed_bytes(&list[i]) + 63) & ~(size_t)63;
    int rc = arena_init(&m->packed, total) ? pd_error_prefix(m->tf.path) : 0;
    for (int i = 0; i < n && !rc; i++) {
        Mat s;
        const void *src[3] = {0};
        int rows[3] = {0};
        WType types[3];
        int n_src = pack_shape(&list[i], &s, src, rows, types);
        void *dst = arena_push(&m->packed, packed_bytes(&list[i]));
        if (!dst) {
            rc = -1;
            break;
        }
        if (k_wtype_quant(s.t)) k_pack_blocks(dst, s.cols, n_src, src, rows, types);
        else k_pack(dst, s.t, s.cols, n_src, src, rows);
        for (int k = 0; k < n_src && drop; k++) drop_mat(list[i].src[k], page);
        *list[i].dst = (Mat){s.t, n_src == 1 ? s.w : NULL, dst, s.rows, s.cols};
    }
    free(list);
    return rc;
}

/* The model once in memory: the matmuls read the packed copy (k_packed_copies: f32,
   bf16, and the block types in the vector builds), so the file's pages of those
   matrices are needed no more (model_verify reads each tensor once, then drops it;
   pack_weights drops each source once packed). The embedding is read a row at a time,
   so its pages come back only for the tokens used (and the lm_head's for a head that
   reads a row). Block types a build reads in place stay. Only in a file
   mapping: there a dropped page faults in again from the file; dropped anonymous pages
   (a decompressed .zst, stdin) would read back as zeros. */
static void release_embedding(const Model *m, size_t page) {
    drop_mat(&m->embed, page);
    if (!m->c.tied) drop_mat(&m->lm_head, page);
}

/* ---- checked weights ---- */

static int order_key(const char *name, int *layer) {
    if (!strcmp(name, NAME_EMBED)) return 0;
    if (sscanf(name, "model.layers.%d.", layer) == 1) return 1;
    return 2;
}

int model_tensor_order(const char *a, const char *b) {
    int la = 0, lb = 0, ga = order_key(a, &la), gb = order_key(b, &lb);
    if (ga != gb) return ga - gb;
    if (la != lb) return la - lb;
    return strcmp(a, b);
}

static int by_tensor_order(const void *a, const void *b) {
    return model_tensor_order((*(const Tensor *const *)a)->name, (*(const Tensor *const *)b)->name);
}

void model_digest_update(XXH3_state_t *s, const char *name, DType dt, const int64_t shape[2], const void *bytes,
                         size_t n) {
    int32_t d = (int32_t)dt;
    XXH3_128bits_update(s, name, strlen(name) + 1);
    XXH3_128bits_update(s, &d, sizeof d);
    XXH3_128bits_update(s, shape, 2 * sizeof(int64_t));
    XXH3_128bits_update(s, bytes, n);
}

/* paradec.digest of these tensors in this order, as hex */
static int digest_of(const Tensor *const *t, int n, char hex[33], int drop, size_t page) {
    XXH3_state_t *s = XXH3_createState();
    if (!s) return pd_error("out of memory");
    XXH3_128bits_reset(s);
    for (int i = 0; i < n; i++) {
        /* a writer's [rows][cols] ([n, 1] for a vector); no writer makes another rank */
        int nd = t[i]->ndim;
        int64_t shape[2] = {nd >= 1 ? t[i]->shape[0] : -1, nd == 2 ? t[i]->shape[1] : nd == 1 ? 1 : -1};
        model_digest_update(s, t[i]->name, t[i]->dtype, shape, t[i]->data, t[i]->nbytes);
        /* read once, then packed from the page cache: RSS stays small (block types the
           kernels read where they lie are read at the first token) */
        if (drop && (!dtype_is_quant(t[i]->dtype) || k_packed_copies((WType)wtype_of(t[i]->dtype))))
            drop_pages(t[i]->data, t[i]->nbytes, page);
    }
    XXH128_hash_t d = XXH3_128bits_digest(s);
    XXH3_freeState(s);
    snprintf(hex, 33, "%016llx%016llx", (unsigned long long)d.high64, (unsigned long long)d.low64);
    return 0;
}

/* what paradec.digest covers: every tensor but the tokenizer and a bundle's head sets */
static int is_weight(const Tensor *t, int bundle) {
    return strcmp(t->name, "tokenizer.bytes") && !(bundle && !strncmp(t->name, "heads.", 6));
}

int model_verify(const TensorFile *tf) {
    if (!pd_verify_weights) return 0;
    const char *path = tf->path ? tf->path : "?", *want = tf_meta(tf, "paradec.digest");
    const char *kind = tf_meta(tf, "paradec.kind");
    if (!want)
        return pd_error("%s: records no paradec.digest, so its weights cannot be checked (convert it again, or "
                        "--no-verify loads it anyway)",
                        path);
    int bundle = kind && !strcmp(kind, "bundle"), nd = 0, n = 0, rc = 0;
    TfDigest *d = NULL;
    if (tf_digests(tf, &d, &nd)) return -1;
    const Tensor **w = pd_alloc(sizeof *w * (tf->n + 1)); /* the weights, in the order they were hashed */
    if (!w) {
        free(d);
        return -1;
    }
    if (d) { /* the writer's order; every weight must be in it */
        for (int i = 0; i < nd; i++)
            if (is_weight(d[i].t, bundle)) w[n++] = d[i].t;
        for (int i = 0; i < tf->n && !rc; i++) {
            int listed = !is_weight(&tf->t[i], bundle);
            for (int j = 0; j < n && !listed; j++) listed = w[j] == &tf->t[i];
            if (!listed)
                rc = pd_error("%s: tensor '%s' has no digest in %s: not as written", path, tf->t[i].name,
                              TF_DIGESTS_KEY);
        }
    } else { /* an older file: convert's and widen's order */
        for (int i = 0; i < tf->n; i++)
            if (is_weight(&tf->t[i], bundle)) w[n++] = &tf->t[i];
        qsort(w, (size_t)n, sizeof *w, by_tensor_order);
    }
    char got[33];
    size_t page = page_size();
    int drop = tf->file_backed;
    rc = rc ? rc : digest_of(w, n, got, drop, page);
    if (!rc && !d && strcmp(got, want)) { /* else the file's own (older drafts and random models) */
        n = 0;
        for (int i = 0; i < tf->n; i++)
            if (is_weight(&tf->t[i], bundle)) w[n++] = &tf->t[i];
        rc = digest_of(w, n, got, drop, page);
    }
    if (!rc && strcmp(got, want)) {
        if (!d)
            rc = pd_error("%s: the weights do not match paradec.digest: the file is damaged (it predates per-tensor "
                          "digests, so the damaged tensor cannot be named; --no-verify loads it anyway)",
                          path);
        else if (!(rc = tf_check_digests(tf, d, nd)))
            rc = pd_error("%s: the weights do not match paradec.digest though every tensor matches its own digest: "
                          "the header (a tensor's name, dtype or shape) was changed (--no-verify loads it anyway)",
                          path);
    }
    for (int i = 0; i < nd && !rc; i++) /* what the whole digest leaves out: the tokenizer */
        if (!is_weight(d[i].t, bundle)) rc = tf_check_digests(tf, &d[i], 1);
    free(w);
    free(d);
    return rc;
}

/* the weights of m->tf (its config read), packed; with_tok: the tokenizer too */
static int model_setup(Model *m, const char *cfg, int with_tok, int drop) {
    const char *dig = tf_meta(&m->tf, "paradec.digest");
    int rc = config_from_json(&m->c, cfg, m->tf.path);
    if (!rc) snprintf(m->digest, sizeof m->digest, "%s", dig ? dig : "");
    size_t rope = pd_mul(pd_mul((size_t)m->c.seq_len, m->c.head_dim), sizeof(float));
    rc = rc ? rc
            : arena_init(&m->arena, rope + 2 * sizeof(float) * m->c.dim * (2 * m->c.n_layers + 1) +
                                        sizeof(Layer) * m->c.n_layers + 64 * 64 * m->c.n_layers + 4096 +
                                        (m->c.qkv_bias ? sizeof(float) * (size_t)m->c.n_layers *
                                                             (m->c.n_heads + 2 * m->c.n_kv_heads) * m->c.head_dim
                                                       : 0));
    rc = rc ? rc : load_mat(m, NAME_EMBED, m->c.vocab_size, m->c.dim, &m->embed);
    rc = rc ? rc : load_layers(m);
    rc = rc ? rc : load_vec(m, NAME_NORM, m->c.dim, &m->final_norm);
    if (!rc) {
        if (m->c.tied) m->lm_head = m->embed;
        else rc = load_mat(m, NAME_LM_HEAD, m->c.vocab_size, m->c.dim, &m->lm_head);
    }
    rc = rc ? rc : build_rope(m);
    rc = rc || !with_tok ? rc : load_tokenizer(m);
    if (!rc) m->chat_template = tf_meta(&m->tf, "paradec.chat_template");
    size_t page = page_size();
    rc = rc ? rc : pack_weights(m, drop, page);
    if (!rc && drop) release_embedding(m, page);
    return rc;
}

int model_load(Model *m, const char *path) {
    memset(m, 0, sizeof *m);
    if (tf_open(&m->tf, path)) return -1;
    const char *kind = tf_meta(&m->tf, "paradec.kind"), *cfg = tf_meta(&m->tf, "paradec.config");
    int rc = 0;
    if (!kind || (strcmp(kind, "model") && strcmp(kind, "bundle")))
        rc = pd_error("%s: not a paradec model (paradec.kind is '%s')", path, kind ? kind : "missing");
    else if (!cfg) rc = pd_error("%s: paradec.config is missing", path);
    rc = rc ? rc : model_verify(&m->tf);
    rc = rc ? rc : model_setup(m, cfg, 1, m->tf.file_backed);
    if (rc) model_free(m);
    return rc;
}

int model_load_layers(Model *m, const TensorFile *tf) {
    memset(m, 0, sizeof *m);
    m->tf = *tf;
    const char *cfg = tf_meta(&m->tf, "paradec.config");
    int rc = cfg ? model_setup(m, cfg, 0, 0) : pd_error("%s: paradec.config is missing", tf->path);
    if (rc) model_free(m);
    return rc;
}

void model_free(Model *m) {
    tok_free(m->tok);
    tf_close(&m->tf);
    arena_free(&m->arena);
    arena_free(&m->packed);
    memset(m, 0, sizeof *m);
}

const char *mat_type_name(const Mat *w) { return dtype_name(dtype_of(w->t)); }
size_t mat_row_bytes(const Mat *w) { return dtype_row_bytes(dtype_of(w->t), w->cols); }
int mat_packed_alone(const Mat *w) { return k_packed_copies(w->t); }

/* as stored: a block type's rows are its blocks */
static double mat_bytes(const Mat *w) { return (double)w->rows * (double)mat_row_bytes(w); }

double model_weight_bytes(const Model *m) {
    double b = mat_bytes(&m->lm_head) + mat_bytes(&m->embed) / m->c.vocab_size;
    for (int l = 0; l < m->c.n_layers; l++) {
        const Layer *L = &m->layers[l];
        b += mat_bytes(&L->wq) + mat_bytes(&L->wk) + mat_bytes(&L->wv) + mat_bytes(&L->wo) + mat_bytes(&L->w1) +
             mat_bytes(&L->w2) + mat_bytes(&L->w3);
    }
    return b;
}
