/* exit_heads.c — see exit_heads.h. Every T lives in the arena as an aligned f32 copy
   (a mapped file's data need not be aligned) and packed (model/linear), so
   head_logits is three batch-invariant steps: final norm, product by T, LM head. */
#include "heads/exit_heads.h"

#include "heads/bundle.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const float exit_gamma[EXIT_N_GAMMA] = {0.5f, 0.75f, 0.9f};

const char *exit_record_key(char key[EXIT_KEY_MAX], int layer, const char *what, int g) {
    if (g < 0) snprintf(key, EXIT_KEY_MAX, "paradec.exit.%d.%s", layer, what);
    else snprintf(key, EXIT_KEY_MAX, "paradec.exit.%d.%s@%g", layer, what, exit_gamma[g]);
    return key;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

static int check_layers(const Model *m, const int *layers, int n, const char *what) {
    int L = m->c.n_layers;
    if (n < 1 || n > MAX_EXIT_HEADS) return pd_error("%s: %d exit heads; 1 to %d are allowed", what, n, MAX_EXIT_HEADS);
    for (int k = 0; k < n; k++) {
        if (layers[k] < 1 || layers[k] >= L)
            return pd_error("%s: a head at layer %d, but the model has %d layers (heads go at layers 1..%d)", what,
                            layers[k], L, L - 1);
        if (k && layers[k] <= layers[k - 1])
            return pd_error("%s: layer %d given twice or out of order", what, layers[k]);
    }
    return 0;
}

/* the arena and the layer list; T and Tp point into the arena, T zeroed */
static int heads_alloc(ExitHeads *h, const Model *m, const int *layers, int n, int norm, const char *what) {
    if (check_layers(m, layers, n, what)) return -1;
    int d = m->c.dim;
    size_t per = pd_mul(pd_mul(sizeof(float), d), d) + linear_bytes(LINEAR_F32, d, d) + 128;
    if (arena_init(&h->arena, pd_mul(per, n))) return pd_error_prefix(what);
    h->n = n;
    h->dim = d;
    h->norm = norm;
    snprintf(h->model_digest, sizeof h->model_digest, "%s", m->digest);
    for (int k = 0; k < n; k++) {
        h->layer[k] = layers[k];
        h->T[k] = arena_push(&h->arena, sizeof(float) * d * d);
        h->Tp[k].p = arena_push(&h->arena, linear_bytes(LINEAR_F32, d, d));
    }
    return 0;
}

int heads_set_T(ExitHeads *h, int k, const float *T) {
    if (k < 0 || k >= h->n) return pd_error("exit heads: no head %d", k);
    int d = h->dim;
    float *own = (float *)h->T[k]; /* the arena's copy: ours to write */
    if (own != T) memcpy(own, T, sizeof(float) * d * d);
    return linear_pack(&h->Tp[k], h->Tp[k].p, LINEAR_F32, own, d, d);
}

int heads_identity(ExitHeads *h, const Model *m, const int *layers, int n, int norm) {
    memset(h, 0, sizeof *h);
    if (heads_alloc(h, m, layers, n, norm, "exit heads")) return -1;
    for (int k = 0; k < n; k++) {
        float *T = (float *)h->T[k];
        for (int i = 0; i < h->dim; i++) T[(size_t)i * h->dim + i] = 1;
        heads_set_T(h, k, T);
    }
    return 0;
}

static void vocab_free(ExitHeads *h) {
    free(h->vocab), free(h->rest[0]), free(h->Ep.p);
    for (int k = 0; k < MAX_EXIT_HEADS; k++) free(h->Rp[k].p), h->Rp[k].p = NULL, h->rest[k] = NULL;
    h->vocab = NULL, h->Ep.p = NULL, h->n_vocab = 0;
}

static void *alloc64(size_t n) { return aligned_alloc(64, (n + 63) / 64 * 64); }

int heads_set_rest(ExitHeads *h, int k, const float *rb) {
    if (k < 0 || k >= h->n || !h->n_vocab) return pd_error("exit heads: no head %d with a check vocabulary", k);
    if (h->rest[k] != rb) memcpy(h->rest[k], rb, sizeof(float) * (h->dim + 1));
    return linear_pack(&h->Rp[k], h->Rp[k].p, LINEAR_F32, h->rest[k], 1, h->dim);
}

/* start: the rest logits at their lower bound (reads every other row of E); else left for
   the caller to set */
static int set_vocab(ExitHeads *h, const Model *m, const int32_t *ids, int n, int start) {
    int V = m->c.vocab_size, d = h->dim, rc = 0;
    if (n < 1 || n >= V) return pd_error("exit heads: a check vocabulary of %d tokens (1 to %d)", n, V - 1);
    ExitHeads t = {.n_vocab = n, .vocab = pd_alloc(sizeof(int32_t) * n)};
    t.rest[0] = pd_alloc(pd_mul(sizeof(float) * (d + 1), h->n));
    t.Ep.p = alloc64(linear_bytes(LINEAR_F32, n, d));
    float *rows = pd_alloc(pd_mul(pd_mul(sizeof(float), n), d)), *row = pd_alloc(sizeof(float) * d);
    double *mean = calloc(d, sizeof(double));
    char *in = calloc(V, 1);
    rc = !t.vocab || !t.rest[0] || !t.Ep.p || !rows || !row || !mean || !in ? pd_error("out of memory") : 0;
    for (int k = 0; k < h->n && !rc; k++) {
        t.rest[k] = t.rest[0] + (size_t)k * (d + 1);
        if (!(t.Rp[k].p = alloc64(linear_bytes(LINEAR_F32, 1, d)))) rc = pd_error("out of memory");
    }
    for (int i = 0; i < n && !rc; i++) {
        if (ids[i] < 0 || ids[i] >= V) rc = pd_error("exit heads: check vocabulary id %d is not a token", ids[i]);
        else if (in[ids[i]]++) rc = pd_error("exit heads: check vocabulary id %d given twice", ids[i]);
    }
    for (int v = 0, i = 0; v < V && !rc; v++) { /* the ids in order, and the mean of the others */
        if (in[v]) model_lm_head_row(m, v, rows + (size_t)i * d), t.vocab[i++] = v;
        else if (start) {
            model_lm_head_row(m, v, row);
            for (int j = 0; j < d; j++) mean[j] += row[j];
        }
    }
    if (!rc) rc = linear_pack(&t.Ep, t.Ep.p, LINEAR_F32, rows, n, d);
    for (int k = 0; k < h->n && !rc; k++) {
        for (int j = 0; j < d; j++) t.rest[k][j] = (float)(mean[j] / (V - n));
        t.rest[k][d] = (float)log((double)(V - n));
    }
    free(rows), free(row), free(mean), free(in);
    if (rc) return vocab_free(&t), -1;
    vocab_free(h);
    h->n_vocab = n, h->vocab = t.vocab, h->Ep = t.Ep;
    for (int k = 0; k < h->n; k++) {
        h->rest[k] = t.rest[k], h->Rp[k].p = t.Rp[k].p;
        heads_set_rest(h, k, h->rest[k]);
    }
    return 0;
}

int heads_set_vocab(ExitHeads *h, const Model *m, const int32_t *ids, int n) { return set_vocab(h, m, ids, n, 1); }

/* the file's check vocabulary and rest logits, when it has them */
static int load_vocab(ExitHeads *h, const Model *m, const char *path) {
    const Tensor *v = tf_get(&h->tf, "exit.vocab");
    if (!v) return 0;
    if (v->dtype != DT_I32 || v->ndim != 1 || v->shape[0] < 1)
        return pd_error("%s: tensor 'exit.vocab' must be a 1-d I32 list of token ids", path);
    int n = (int)v->shape[0];
    int32_t *ids = pd_alloc(sizeof(int32_t) * n);
    if (!ids) return -1;
    memcpy(ids, v->data, sizeof(int32_t) * n);
    int rc = 0;
    for (int i = 1; i < n && !rc; i++)
        if (ids[i] <= ids[i - 1]) rc = pd_error("%s: tensor 'exit.vocab' must hold increasing ids", path);
    rc = rc ? rc : set_vocab(h, m, ids, n, 0);
    free(ids);
    if (rc) return pd_error_prefix(path), -1;
    for (int k = 0; k < h->n; k++) {
        char name[64];
        snprintf(name, sizeof name, "exit.%d.rest", h->layer[k]);
        const Tensor *t = tf_get(&h->tf, name);
        if (!t) return pd_error("%s: tensor '%s' is missing (the heads have a check vocabulary)", path, name);
        if (t->dtype != DT_F32 || t->ndim != 1 || t->shape[0] != h->dim + 1)
            return pd_error("%s: tensor '%s' must be 1-d F32 of dim + 1 = %d", path, name, h->dim + 1);
        const float *rb = t->data;
        for (int j = 0; j <= h->dim; j++)
            if (!isfinite(rb[j])) return pd_error("%s: tensor '%s' holds a non-finite value", path, name);
        if (heads_set_rest(h, k, rb)) return -1;
    }
    return 0;
}

/* "4,1,3" → sorted layers; -1 on anything else */
static int parse_layers(const char *s, int *layers, int *n, const char *what) {
    *n = 0;
    for (const char *p = s;;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 1 << 20 || (*end && *end != ',') || *n == MAX_EXIT_HEADS)
            return pd_error("%s: " EXIT_KEY_LAYERS " '%s' is not a list of up to %d layers", what, s, MAX_EXIT_HEADS);
        layers[(*n)++] = (int)v;
        if (!*end) break;
        p = end + 1;
    }
    qsort(layers, *n, sizeof(int), cmp_int);
    return 0;
}

static int load_T(ExitHeads *h, const Model *m, int k, const char *path) {
    char name[64];
    snprintf(name, sizeof name, "exit.%d.T", h->layer[k]);
    const Tensor *t = tf_get(&h->tf, name);
    if (!t) return pd_error("%s: tensor '%s' is missing", path, name);
    if (t->dtype != DT_F32 || t->ndim != 2) return pd_error("%s: tensor '%s' must be 2-d F32", path, name);
    if (t->shape[0] != t->shape[1] || t->shape[0] != m->c.dim)
        return pd_error("%s: tensor '%s' is %lldx%lld but the model's dim is %d: heads for another model", path, name,
                        (long long)t->shape[0], (long long)t->shape[1], m->c.dim);
    float *T = (float *)h->T[k];
    memcpy(T, t->data, t->nbytes);
    for (size_t i = 0; i < (size_t)h->dim * h->dim; i++)
        if (!isfinite(T[i])) return pd_error("%s: tensor '%s' holds a non-finite value", path, name);
    return heads_set_T(h, k, T);
}

int heads_load(ExitHeads *h, const char *path, const Model *m) {
    TensorFile tf;
    memset(h, 0, sizeof *h);
    if (tf_open(&tf, path)) return -1;
    int rc = heads_load_tf(h, &tf, m, path);
    tf_close(&tf);
    return rc;
}

int heads_load_tf(ExitHeads *h, const TensorFile *file, const Model *m, const char *path) {
    memset(h, 0, sizeof *h);
    if (bundle_view(file, "exit-heads", &h->tf, path)) return -1;
    if (tf_verify(&h->tf, NULL)) {
        tf_close(&h->tf);
        return -1;
    }
    const char *kind = tf_meta(&h->tf, "paradec.kind"), *ls = tf_meta(&h->tf, EXIT_KEY_LAYERS);
    const char *norm = tf_meta(&h->tf, EXIT_KEY_NORM), *dig = tf_meta(&h->tf, "paradec.model_digest");
    int layers[MAX_EXIT_HEADS], n = 0, rc = 0;
    if (!kind || strcmp(kind, "exit-heads"))
        rc = pd_error("%s: not an exit-heads file (paradec.kind is '%s')", path, kind ? kind : "missing");
    else if (!ls) rc = pd_error("%s: no exit heads inside (" EXIT_KEY_LAYERS " is missing)", path);
    else if (!norm || (strcmp(norm, "0") && strcmp(norm, "1")))
        rc = pd_error("%s: " EXIT_KEY_NORM " must be 0 or 1", path);
    else if (!dig)
        rc = pd_error("%s: paradec.model_digest is missing: cannot tell which model the heads are for", path);
    rc = rc ? rc : parse_layers(ls, layers, &n, path);
    rc = rc ? rc : heads_alloc(h, m, layers, n, norm[0] == '1', path); /* leaves h->tf */
    for (int k = 0; k < h->n && !rc; k++) rc = load_T(h, m, k, path);
    rc = rc ? rc : load_vocab(h, m, path);
    /* the shapes fit; the weights must be the very ones the heads were trained on */
    if (!rc && strcmp(dig, m->digest))
        rc = pd_error("%s: heads trained for model %s, but this model is %s", path, dig,
                      m->digest[0] ? m->digest : "(no digest)");
    if (rc) heads_free(h);
    return rc;
}

void heads_free(ExitHeads *h) {
    vocab_free(h);
    tf_close(&h->tf);
    arena_free(&h->arena);
    memset(h, 0, sizeof *h);
}

int heads_find(const ExitHeads *h, int layer) {
    for (int k = 0; k < h->n; k++)
        if (h->layer[k] == layer) return k;
    return -1;
}

int head_z(Model *m, const ExitHeads *h, int k, const float *hidden, int n, float *z) {
    if (k < 0 || k >= h->n) return pd_error("exit heads: no head %d", k);
    if (n < 1) return 0;
    int d = h->dim;
    /* x, [n][dim]: on the stack for the one-token calls decoding makes */
    float small[4096], *x = (size_t)n * d <= 4096 ? small : pd_alloc(pd_mul(pd_mul(sizeof(float), n), d));
    if (!x) return -1;
    if (h->norm) model_final_norm(m, x, hidden, n);
    else memcpy(x, hidden, sizeof(float) * n * d);
    linear_apply(&h->Tp[k], z, x, n);
    if (x != small) free(x);
    return 0;
}

/* z for n hidden states, on the stack when small; NULL + message */
static float *z_of(Model *m, const ExitHeads *h, int k, const float *hidden, int n, float *small, size_t cap) {
    size_t need = (size_t)n * h->dim;
    float *z = need <= cap ? small : pd_alloc(pd_mul(sizeof(float), need));
    if (z && head_z(m, h, k, hidden, n, z)) {
        if (z != small) free(z);
        return NULL;
    }
    return z;
}

int head_logits(Model *m, const ExitHeads *h, int k, const float *hidden, int n, float *logits) {
    if (k < 0 || k >= h->n) return pd_error("exit heads: no head %d", k);
    if (n < 1) return 0;
    float small[4096], *z = z_of(m, h, k, hidden, n, small, 4096);
    if (!z) return -1;
    model_lm_head(m, logits, z, n);
    if (z != small) free(z);
    return 0;
}

int head_check(Model *m, const ExitHeads *h, int k, const float *hidden, int n, float *out) {
    if (!h->n_vocab) return pd_error("exit heads: no check vocabulary");
    if (k < 0 || k >= h->n) return pd_error("exit heads: no head %d", k);
    if (n < 1) return 0;
    float small[4096], *z = z_of(m, h, k, hidden, n, small, 4096);
    if (!z) return -1;
    int K = h->n_vocab;
    for (int t = 0; t < n; t++) { /* a token at a time: out's rows are K + 1 apart */
        float *o = out + (size_t)t * (K + 1);
        linear_apply(&h->Ep, o, z + (size_t)t * h->dim, 1);
        linear_apply(&h->Rp[k], o + K, z + (size_t)t * h->dim, 1);
        o[K] += h->rest[k][h->dim];
    }
    if (z != small) free(z);
    return 0;
}

int heads_save(const ExitHeads *h, const char *path, const char *const *meta, int n_meta) {
    TfWriter *w = tfw_begin(path, -1);
    if (!w) return -1;
    tfw_record_digests(w);
    char layers[16 * MAX_EXIT_HEADS] = "", name[MAX_EXIT_HEADS][32], dim[16];
    int64_t shape[2] = {h->dim, h->dim};
    int rc = 0;
    for (int k = 0; k < h->n && !rc; k++) {
        size_t l = strlen(layers);
        snprintf(layers + l, sizeof layers - l, "%s%d", k ? "," : "", h->layer[k]);
        snprintf(name[k], sizeof name[k], "exit.%d.T", h->layer[k]);
        rc = tfw_add(w, name[k], DT_F32, 2, shape, h->T[k]);
    }
    char rname[MAX_EXIT_HEADS][32];
    int64_t vshape[1] = {h->n_vocab}, rshape[1] = {h->dim + 1};
    if (h->n_vocab && !rc) rc = tfw_add(w, "exit.vocab", DT_I32, 1, vshape, h->vocab);
    for (int k = 0; k < h->n && h->n_vocab && !rc; k++) {
        snprintf(rname[k], sizeof rname[k], "exit.%d.rest", h->layer[k]);
        rc = tfw_add(w, rname[k], DT_F32, 1, rshape, h->rest[k]);
    }
    snprintf(dim, sizeof dim, "%d", h->dim);
    rc = rc || tfw_meta(w, "paradec.kind", "exit-heads") || tfw_meta(w, "paradec.version", "1") ||
         tfw_meta(w, EXIT_KEY_LAYERS, layers) || tfw_meta(w, EXIT_KEY_NORM, h->norm ? "1" : "0") ||
         tfw_meta(w, EXIT_KEY_DIM, dim) || tfw_meta(w, "paradec.model_digest", h->model_digest);
    for (int i = 0; i < n_meta && !rc; i++) rc = tfw_meta(w, meta[2 * i], meta[2 * i + 1]);
    if (rc) {
        tfw_abort(w);
        return -1;
    }
    return tfw_commit(w);
}
