/* checkpoint.c — in-memory checkpoints and paradec model files. */
#include "model/checkpoint.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "formats/gguf.h"
#include "formats/quant.h"

/* the next tensor's slot, zeroed (ck->n not yet counting it) */
static CkTensor *ck_slot(Checkpoint *ck) {
    if (ck->n == ck->cap) {
        int cap = ck->cap ? 2 * ck->cap : 64;
        CkTensor *t = pd_realloc(ck->t, sizeof(CkTensor) * cap);
        if (!t) return NULL;
        ck->t = t;
        ck->cap = cap;
    }
    return memset(&ck->t[ck->n], 0, sizeof(CkTensor));
}

float *ck_add(Checkpoint *ck, const char *name, int64_t rows, int64_t cols) {
    CkTensor *t = ck_slot(ck);
    if (!t) return NULL;
    t->ndim = rows ? 2 : 1;
    t->shape[0] = rows ? rows : cols;
    t->shape[1] = rows ? cols : 1;
    size_t count = pd_mul((size_t)t->shape[0], (size_t)t->shape[1]);
    t->name = pd_strdup(name);
    t->data = pd_alloc(pd_mul(count, sizeof(float)));
    if (!t->name || !t->data) {
        free(t->name);
        free(t->data);
        return NULL;
    }
    ck->n++;
    return t->data;
}

void *ck_add_raw(Checkpoint *ck, const char *name, DType dt, int64_t rows, int64_t cols) {
    if (!dtype_is_quant(dt) || rows < 1 || cols < 1) {
        pd_error("tensor '%s': raw blocks need a block type and a matrix shape", name);
        return NULL;
    }
    CkTensor *t = ck_slot(ck);
    if (!t) return NULL;
    t->ndim = 2;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->dtype = dt;
    t->nraw = pd_mul((size_t)rows, dtype_row_bytes(dt, cols));
    t->name = pd_strdup(name);
    t->raw = t->nraw == SIZE_MAX ? NULL : pd_alloc(t->nraw ? t->nraw : 1);
    if (!t->name || !t->raw) {
        free(t->name);
        free(t->raw);
        if (t->nraw == SIZE_MAX) pd_error("tensor '%s': size overflows", name);
        return NULL;
    }
    ck->n++;
    return t->raw;
}

int ck_dequant(CkTensor *t) {
    if (!t->raw) return 0;
    int64_t rows = t->shape[0], cols = t->shape[1];
    size_t rb = dtype_row_bytes(t->dtype, cols);
    float *d = pd_alloc(pd_mul(pd_mul((size_t)rows, (size_t)cols), sizeof(float)));
    if (!d) return -1;
    for (int64_t r = 0; r < rows; r++)
        dequant_row(t->dtype, d + (size_t)r * cols, (const uint8_t *)t->raw + (size_t)r * rb, cols);
    free(t->raw);
    t->raw = NULL;
    t->nraw = 0;
    t->dtype = DT_F32;
    t->data = d;
    return 0;
}

CkTensor *ck_get(const Checkpoint *ck, const char *name) {
    for (int i = 0; i < ck->n; i++)
        if (!strcmp(ck->t[i].name, name)) return &ck->t[i];
    return NULL;
}

void ck_free(Checkpoint *ck) {
    for (int i = 0; i < ck->n; i++) {
        free(ck->t[i].name);
        free(ck->t[i].data);
        free(ck->t[i].raw);
    }
    free(ck->t);
    free(ck->tok);
    free(ck->chat_template);
    memset(ck, 0, sizeof *ck);
}

/* a GGUF's tokenizer metadata (a vocabulary-only file or a whole model) as a
   vocabulary-only GGUF; its chat template too */
static int take_gguf_vocab(Checkpoint *ck, char **bytes, size_t *n, const char *path) {
    Gguf g;
    if (gguf_parse(&g, *bytes, *n, path)) return -1;
    const GgufKV *toks = gguf_find(&g, "tokenizer.ggml.tokens");
    GgufStr tmpl;
    unsigned char *out = NULL;
    size_t len = 0;
    int rc = 0;
    if (!toks || toks->type != GGUF_ARRAY || toks->elem != GGUF_STRING)
        rc = pd_error("%s: no tokenizer.ggml.tokens: not a GGUF with a vocabulary", path);
    else if (toks->n != (uint64_t)ck->c.vocab_size)
        rc = pd_error("%s: tokenizer has %llu tokens but the model's vocabulary is %d", path,
                      (unsigned long long)toks->n, ck->c.vocab_size);
    rc = rc ? rc : gguf_write_vocab(&g, &out, &len);
    if (!rc && gguf_find(&g, "tokenizer.chat_template") && !gguf_get_str(&g, "tokenizer.chat_template", &tmpl)) {
        free(ck->chat_template);
        if (!(ck->chat_template = strndup(tmpl.s, tmpl.len))) rc = pd_error("%s: out of memory", path);
    }
    gguf_close(&g);
    if (rc) {
        free(out);
        return -1;
    }
    free(*bytes);
    *bytes = (char *)out;
    *n = len;
    return 0;
}

/* the tokenizer module's loader for the kind must take it, and its vocabulary must be
   the model's (a tokenizer.json may be smaller: Qwen2 pads its embedding) */
int ck_check_tokenizer(const Checkpoint *ck, const void *bytes, size_t n, const char *kind, const char *what) {
    Tokenizer *t;
    if (tok_load_bytes(&t, bytes, n, kind, what)) return -1;
    int v = tok_vocab_size(t);
    tok_free(t);
    if (v > ck->c.vocab_size || (v < ck->c.vocab_size && strcmp(kind, "hf-json")))
        return pd_error("%s: tokenizer has %d pieces but the model's vocabulary is %d", what, v, ck->c.vocab_size);
    return 0;
}

int ck_set_tokenizer(Checkpoint *ck, const char *path) {
    char *bytes;
    size_t n, i = 0;
    if (pd_read_file_gz(path, &bytes, &n)) return -1;
    while (i < n && (bytes[i] == ' ' || bytes[i] == '\n' || bytes[i] == '\t' || bytes[i] == '\r')) i++;
    const char *kind = n >= 4 && !memcmp(bytes, "GGUF", 4) ? "gguf" : i < n && bytes[i] == '{' ? "hf-json" : "llama2c";
    if ((!strcmp(kind, "gguf") && take_gguf_vocab(ck, &bytes, &n, path)) ||
        ck_check_tokenizer(ck, bytes, n, kind, path)) {
        free(bytes);
        return -1;
    }
    free(ck->tok);
    ck->tok = (unsigned char *)bytes;
    ck->tok_len = n;
    snprintf(ck->tok_kind, sizeof ck->tok_kind, "%s", kind);
    return 0;
}

static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);                /* round to nearest even */
}

/* canonical tensor order (model_tensor_order): the same weights give the same file
   and digest whatever order an importer used */
static int by_canonical_order(const void *a, const void *b) {
    return model_tensor_order(((const CkTensor *)a)->name, ((const CkTensor *)b)->name);
}

/* small vectors stay F32 whatever the weights are stored as */
static int is_norm(const char *name) { return strstr(name, "norm") || strstr(name, ".bias"); }

int mw_begin(ModelWriter *mw, const char *path, DType dt) {
    memset(mw, 0, sizeof *mw);
    if (dt != DT_F32 && dt != DT_BF16 && dt != DT_KEEP && !dtype_is_quant(dt))
        return pd_error("%s: weights can be stored F32, BF16 or a block type "
                        "(Q8_0 Q4_0 Q4_1 Q5_0 Q4_K Q5_K Q6_K)",
                        path);
    mw->dt = dt;
    mw->hash = XXH3_createState();
    if (!mw->hash) return pd_error("%s: out of memory", path);
    XXH3_128bits_reset(mw->hash);
    if (!(mw->path = pd_strdup(path)) || !(mw->w = tfw_begin(path, -1))) {
        XXH3_freeState(mw->hash);
        free(mw->path);
        return -1;
    }
    tfw_record_digests(mw->w);
    return 0;
}

static void mw_free(ModelWriter *mw) {
    for (int i = 0; i < mw->n_owned; i++) free(mw->owned[i]);
    free(mw->owned);
    XXH3_freeState(mw->hash);
    free(mw->path);
    memset(mw, 0, sizeof *mw);
}

/* a NaN or infinity in a weight is refused when the file is written: the digest then
   vouches for finite weights, and loading need not scan them */
static int check_finite(const ModelWriter *mw, const char *name, const void *bytes, DType dt, size_t count) {
    int bad = 0;
    if (dt == DT_F32) {
        const uint32_t *u = bytes;
        for (size_t j = 0; j < count; j++) bad |= (u[j] & 0x7f800000u) == 0x7f800000u;
    } else {
        const uint16_t *u = bytes;
        for (size_t j = 0; j < count; j++) bad |= (u[j] & 0x7f80u) == 0x7f80u;
    }
    if (!bad) return 0;
    size_t j = 0;
    while (dt == DT_F32 ? (((const uint32_t *)bytes)[j] & 0x7f800000u) != 0x7f800000u
                        : (((const uint16_t *)bytes)[j] & 0x7f80u) != 0x7f80u)
        j++;
    return pd_error("%s: tensor '%s' element %zu is not finite%s: refusing to write it", mw->path, name, j,
                    dt == DT_BF16 ? " in bf16" : "");
}

static void *mw_own(ModelWriter *mw, size_t n) {
    if (mw->n_owned == mw->cap) {
        int cap = mw->cap ? 2 * mw->cap : 64;
        void **o = pd_realloc(mw->owned, sizeof(void *) * cap);
        if (!o) return NULL;
        mw->owned = o;
        mw->cap = cap;
    }
    void *p = pd_alloc(n ? n : 1);
    if (p) mw->owned[mw->n_owned++] = p;
    return p;
}

/* raw blocks written as they are: every block's dequantized values must be finite, as
   a float weight must */
static int put_blocks(ModelWriter *mw, const char *name, DType bt, const int64_t shape[2], const void *bytes) {
    size_t rb = dtype_row_bytes(bt, shape[1]), nbytes = pd_mul((size_t)shape[0], rb);
    float *row = pd_alloc(sizeof(float) * (size_t)shape[1]);
    if (!row) return -1;
    for (int64_t r = 0; r < shape[0]; r++) {
        dequant_row(bt, row, (const uint8_t *)bytes + (size_t)r * rb, shape[1]);
        for (int64_t j = 0; j < shape[1]; j++)
            if (!isfinite(row[j])) {
                free(row);
                return pd_error("%s: tensor '%s' row %lld element %lld is not finite in its %s blocks: refusing to "
                                "write it",
                                mw->path, name, (long long)r, (long long)j, dtype_name(bt));
            }
    }
    free(row);
    model_digest_update(mw->hash, name, bt, shape, bytes, nbytes);
    return tfw_add(mw->w, name, bt, 2, shape, bytes);
}

int mw_add(ModelWriter *mw, const char *name, int ndim, const int64_t shape[2], const float *data) {
    DType dt = is_norm(name) || mw->dt == DT_KEEP || (dtype_is_quant(mw->dt) && ndim != 2) ? DT_F32 : mw->dt;
    size_t count = (size_t)shape[0] * shape[1];
    const void *bytes = data;
    if (dt == DT_BF16) {
        uint16_t *b = mw_own(mw, pd_mul(count, 2));
        if (!b) return -1;
        for (size_t j = 0; j < count; j++) b[j] = f32_to_bf16(data[j]);
        bytes = b;
    } else if (dtype_is_quant(dt)) {
        /* the floats first: a NaN quantizes to garbage, not to a NaN */
        if (check_finite(mw, name, data, DT_F32, count)) return -1;
        size_t rb = dtype_row_bytes(dt, shape[1]);
        uint8_t *q = mw_own(mw, pd_mul((size_t)shape[0], rb));
        if (!q) return -1;
        for (int64_t r = 0; r < shape[0]; r++) quant_row(dt, q + (size_t)r * rb, data + (size_t)r * shape[1], shape[1]);
        return put_blocks(mw, name, dt, shape, q);
    }
    if (check_finite(mw, name, bytes, dt, count)) return -1;
    model_digest_update(mw->hash, name, dt, shape, bytes, count * dtype_size(dt));
    return tfw_add(mw->w, name, dt, ndim, shape, bytes);
}

int mw_add_raw(ModelWriter *mw, const char *name, DType bt, const int64_t shape[2], const void *bytes) {
    if (!dtype_is_quant(bt)) return pd_error("%s: tensor '%s': %s is not a block type", mw->path, name, dtype_name(bt));
    if (mw->dt == DT_KEEP || mw->dt == bt) return put_blocks(mw, name, bt, shape, bytes);
    /* another type: dequantize, then as floats (bf16, f32, or quantized again) */
    size_t rb = dtype_row_bytes(bt, shape[1]);
    float *f = mw_own(mw, pd_mul(pd_mul((size_t)shape[0], (size_t)shape[1]), sizeof(float)));
    if (!f) return -1;
    for (int64_t r = 0; r < shape[0]; r++)
        dequant_row(bt, f + (size_t)r * shape[1], (const uint8_t *)bytes + (size_t)r * rb, shape[1]);
    return mw_add(mw, name, 2, shape, f);
}

int mw_commit(ModelWriter *mw, const Config *c, const unsigned char *tok, size_t tok_len, const char *tok_kind) {
    int64_t tn = (int64_t)tok_len;
    XXH128_hash_t d = XXH3_128bits_digest(mw->hash);
    char digest[40], *cfg = config_to_json(c);
    snprintf(digest, sizeof digest, "%016llx%016llx", (unsigned long long)d.high64, (unsigned long long)d.low64);
    int rc = !cfg || (tok && tfw_add(mw->w, "tokenizer.bytes", DT_U8, 1, &tn, tok)) ||
             tfw_meta(mw->w, "paradec.kind", mw->kind ? mw->kind : "model") ||
             tfw_meta(mw->w, "paradec.version", "1") || tfw_meta(mw->w, "paradec.config", cfg) ||
             tfw_meta(mw->w, "paradec.digest", digest) || (tok && tfw_meta(mw->w, "paradec.tokenizer", tok_kind)) ||
             (mw->chat_template && tfw_meta(mw->w, "paradec.chat_template", mw->chat_template));
    for (int i = 0; i < mw->n_meta && !rc; i++) rc = tfw_meta(mw->w, mw->meta[2 * i], mw->meta[2 * i + 1]);
    free(cfg);
    rc = rc ? (tfw_abort(mw->w), -1) : tfw_commit(mw->w);
    mw_free(mw);
    return rc;
}

void mw_abort(ModelWriter *mw) {
    if (mw->w) tfw_abort(mw->w);
    mw_free(mw);
}

int ck_write_model(const Checkpoint *ck, const char *path, DType dt) {
    if (!ck->tok) return pd_error("%s: no tokenizer given (--tokenizer)", path);
    qsort(ck->t, ck->n, sizeof(CkTensor), by_canonical_order);
    ModelWriter mw;
    if (mw_begin(&mw, path, dt)) return -1;
    for (int i = 0; i < ck->n; i++)
        if (ck->t[i].raw ? mw_add_raw(&mw, ck->t[i].name, ck->t[i].dtype, ck->t[i].shape, ck->t[i].raw)
                         : mw_add(&mw, ck->t[i].name, ck->t[i].ndim, ck->t[i].shape, ck->t[i].data)) {
            mw_abort(&mw);
            return -1;
        }
    mw.chat_template = ck->chat_template;
    return mw_commit(&mw, &ck->c, ck->tok, ck->tok_len, ck->tok_kind);
}

/* a model file holding block tensors, read without model_load: f32/bf16/f16 as f32,
   blocks raw; checked by its digests, config and tokenizer */
static int read_blocks_file(Checkpoint *ck, TensorFile *tf, const char *path) {
    const char *kind = tf_meta(tf, "paradec.kind"), *cfg = tf_meta(tf, "paradec.config");
    const char *tk = tf_meta(tf, "paradec.tokenizer"), *tmpl = tf_meta(tf, "paradec.chat_template");
    const Tensor *tok = tf_get(tf, "tokenizer.bytes");
    if (!kind || strcmp(kind, "model"))
        return pd_error("%s: not a paradec model (paradec.kind is '%s')", path, kind ? kind : "missing");
    if (!cfg) return pd_error("%s: paradec.config is missing", path);
    if (!tok || tok->dtype != DT_U8 || !tk) return pd_error("%s: no tokenizer.bytes and paradec.tokenizer", path);
    if (model_verify(tf) || config_from_json(&ck->c, cfg, path)) return -1;
    for (int i = 0; i < tf->n; i++) {
        const Tensor *t = &tf->t[i];
        if (t == tok) continue;
        int64_t rows = t->ndim == 2 ? t->shape[0] : 0, cols = t->ndim ? t->shape[t->ndim - 1] : 0;
        if (t->ndim < 1 || t->ndim > 2 || cols < 1 || (t->ndim == 2 && rows < 1))
            return pd_error("%s: tensor '%s' is not a vector or a matrix", path, t->name);
        if (dtype_is_quant(t->dtype)) {
            void *r = ck_add_raw(ck, t->name, t->dtype, rows, cols);
            if (!r) return -1;
            memcpy(r, t->data, t->nbytes);
            continue;
        }
        if (t->dtype != DT_F32 && t->dtype != DT_BF16 && t->dtype != DT_F16)
            return pd_error("%s: tensor '%s' is %s, not a weight type", path, t->name, dtype_name(t->dtype));
        float *d = ck_add(ck, t->name, rows, cols);
        if (!d) return -1;
        size_t n = (size_t)(rows ? rows : 1) * (size_t)cols;
        const uint8_t *p = t->data;
        for (size_t j = 0; j < n; j++) {
            if (t->dtype == DT_F32) memcpy(&d[j], p + 4 * j, 4);
            else {
                uint16_t h = (uint16_t)(p[2 * j] | p[2 * j + 1] << 8);
                if (t->dtype == DT_F16) d[j] = fp16_to_f32(h);
                else {
                    uint32_t u = (uint32_t)h << 16;
                    memcpy(&d[j], &u, 4);
                }
            }
        }
    }
    if (!(ck->tok = pd_alloc(tok->nbytes + 1))) return -1;
    memcpy(ck->tok, tok->data, tok->nbytes);
    ck->tok_len = tok->nbytes;
    snprintf(ck->tok_kind, sizeof ck->tok_kind, "%s", tk);
    if (tmpl && !(ck->chat_template = pd_strdup(tmpl))) return -1;
    return ck_check_tokenizer(ck, ck->tok, ck->tok_len, ck->tok_kind, path);
}

static int read_f32_model(Checkpoint *ck, const char *path);

/* a file with block tensors: refused, or read raw; any other: read_f32_model */
static int read_model_file(Checkpoint *ck, const char *path, int keep_blocks) {
    TensorFile tf;
    memset(ck, 0, sizeof *ck);
    if (tf_open(&tf, path)) return -1;
    const Tensor *q = NULL;
    for (int i = 0; i < tf.n && !q; i++)
        if (dtype_is_quant(tf.t[i].dtype)) q = &tf.t[i];
    if (!q) { /* the f32/bf16 path stays model_load's (its checks, its conversion) */
        tf_close(&tf);
        return read_f32_model(ck, path);
    }
    int rc = keep_blocks ? read_blocks_file(ck, &tf, path)
                         : pd_error("%s: tensor '%s' is %s blocks: widen needs f32 or bf16 weights: widen first, then "
                                    "convert --dtype",
                                    path, q->name, dtype_name(q->dtype));
    tf_close(&tf);
    if (rc) ck_free(ck);
    return rc;
}

int ck_read_model(Checkpoint *ck, const char *path) { return read_model_file(ck, path, 0); }
int ck_read_model_blocks(Checkpoint *ck, const char *path) { return read_model_file(ck, path, 1); }

static int read_f32_model(Checkpoint *ck, const char *path) {
    Model m;
    memset(ck, 0, sizeof *ck);
    if (model_load(&m, path)) return -1;
    ck->c = m.c;
    int rc = 0;
    for (int i = 0; i < m.tf.n && !rc; i++) {
        const Tensor *t = &m.tf.t[i];
        if (!strcmp(t->name, "tokenizer.bytes")) continue;
        int64_t rows = t->ndim == 2 ? t->shape[0] : 0, cols = t->shape[t->ndim - 1];
        float *d = ck_add(ck, t->name, rows, cols);
        if (!d) {
            rc = -1;
            break;
        }
        for (int64_t r = 0; r < (rows ? rows : 1); r++)
            k_row_to_f32(d + r * cols, t->data, t->dtype == DT_F32 ? WT_F32 : WT_BF16, r, (int)cols);
    }
    const Tensor *tok = tf_get(&m.tf, "tokenizer.bytes");
    if (!rc && (ck->tok = pd_alloc(tok->nbytes))) {
        memcpy(ck->tok, tok->data, tok->nbytes);
        ck->tok_len = tok->nbytes;
        snprintf(ck->tok_kind, sizeof ck->tok_kind, "%s", tf_meta(&m.tf, "paradec.tokenizer"));
        const char *tmpl = tf_meta(&m.tf, "paradec.chat_template");
        if (tmpl && !(ck->chat_template = pd_strdup(tmpl))) rc = -1;
    } else rc = -1;
    model_free(&m);
    if (rc) ck_free(ck);
    return rc;
}

int rope_rows_permute(float *w, int n_heads, int hd, int cols, int to_hf) {
    return rope_rows_permute_bytes(w, n_heads, hd, sizeof(float) * (size_t)cols, to_hf);
}

int rope_rows_permute_bytes(void *w, int n_heads, int hd, size_t row, int to_hf) {
    unsigned char *tmp = pd_alloc(pd_mul((size_t)hd, row));
    if (!tmp) return -1;
    for (int h = 0; h < n_heads; h++) {
        unsigned char *W = (unsigned char *)w + (size_t)h * hd * row;
        memcpy(tmp, W, row * hd);
        /* Meta row 2i+c (pair i, component c) is HF row c*hd/2 + i */
        for (int i = 0; i < hd / 2; i++)
            for (int c = 0; c < 2; c++) {
                size_t meta = 2 * i + c, hf = (size_t)c * hd / 2 + i;
                memcpy(W + (to_hf ? hf : meta) * row, tmp + (to_hf ? meta : hf) * row, row);
            }
    }
    free(tmp);
    return 0;
}
