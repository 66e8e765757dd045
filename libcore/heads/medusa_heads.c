/* medusa_heads.c — see medusa_heads.h. Every W, b and own lm_head lives in the arena as an aligned
   f32 copy (a mapped file's data need not be aligned) with a packed copy (model/linear),
   so medusa_logits is batch-invariant steps only: final norm, product by W, bias and
   SiLU, product by the LM head. */
#include "heads/medusa_heads.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "heads/bundle.h"

/* the arena and the pointers into it; own[k]: head k has its own lm_head */
static int medusa_alloc(MedusaHeads *h, const Model *m, int K, const int *own, const char *what) {
    if (K < 1 || K > MAX_MEDUSA) return pd_error("%s: %d Medusa heads; 1 to %d are allowed", what, K, MAX_MEDUSA);
    size_t D = m->c.dim, V = m->c.vocab_size, total = 0;
    size_t head =
        pd_mul(pd_mul(D, D), sizeof(float)) + D * sizeof(float) + linear_bytes(LINEAR_F32, (int)D, (int)D) + 3 * 64;
    size_t lm = pd_mul(pd_mul(V, D), sizeof(float)) + linear_bytes(LINEAR_F32, (int)V, (int)D) + 2 * 64;
    for (int k = 0; k < K; k++) total += head + (own[k] ? lm : 0);
    if (arena_init(&h->arena, total)) return pd_error_prefix(what);
    h->n = K;
    h->dim = (int)D;
    h->vocab = (int)V;
    h->input_scale = 1;
    snprintf(h->model_digest, sizeof h->model_digest, "%s", m->digest);
    for (int k = 0; k < K; k++) {
        h->W[k] = arena_push(&h->arena, D * D * sizeof(float));
        h->b[k] = arena_push(&h->arena, D * sizeof(float));
        h->Wp[k].p = arena_push(&h->arena, linear_bytes(LINEAR_F32, (int)D, (int)D));
        if (!own[k]) continue;
        h->lm[k] = arena_push(&h->arena, V * D * sizeof(float));
        h->lmp[k].p = arena_push(&h->arena, linear_bytes(LINEAR_F32, (int)V, (int)D));
    }
    return 0;
}

/* head k's matrices packed in place: in f32, or in 8 bits after medusa_use_int8 (which
   checked that the 8-bit form fits in the f32 form's room) */
static void pack_head(MedusaHeads *h, int k) {
    LinearForm f = h->q8 ? LINEAR_Q8 : LINEAR_F32;
    linear_pack(&h->Wp[k], h->Wp[k].p, f, h->W[k], h->dim, h->dim);
    if (h->lm[k]) linear_pack(&h->lmp[k], h->lmp[k].p, f, h->lm[k], h->vocab, h->dim);
}

void medusa_use_int8(MedusaHeads *h) {
    size_t q_lm = linear_bytes(LINEAR_Q8, h->vocab, h->dim), q_w = linear_bytes(LINEAR_Q8, h->dim, h->dim);
    if (h->dim > 4096 || !q_lm || !q_w || q_lm > linear_bytes(LINEAR_F32, h->vocab, h->dim) ||
        q_w > linear_bytes(LINEAR_F32, h->dim, h->dim))
        return; /* tiny heads: 8 bits' padding would need more room than f32, and nothing is gained */
    h->q8 = 1;
    for (int k = 0; k < h->n; k++) pack_head(h, k);
}

int medusa_set(MedusaHeads *h, int k, const float *W, const float *b, const float *lm) {
    if (k < 0 || k >= h->n) return pd_error("medusa heads: no head %d", k);
    if (!lm != !h->lm[k])
        return pd_error("medusa heads: head %d %s its own lm_head", k, h->lm[k] ? "has" : "does not have");
    size_t D = h->dim, V = h->vocab;
    if (W != h->W[k]) memcpy(h->W[k], W, D * D * sizeof(float));
    if (b != h->b[k]) memcpy(h->b[k], b, D * sizeof(float));
    if (lm && lm != h->lm[k]) memcpy(h->lm[k], lm, V * D * sizeof(float));
    pack_head(h, k);
    return 0;
}

int medusa_init(MedusaHeads *h, const Model *m, int K, int own_lm) {
    memset(h, 0, sizeof *h);
    int own[MAX_MEDUSA];
    for (int k = 0; k < MAX_MEDUSA; k++) own[k] = own_lm;
    if (own_lm && !m->lm_head.w) return pd_error("medusa heads: the model's lm_head is not readable");
    if (medusa_alloc(h, m, K, own, "medusa heads")) return -1;
    for (int k = 0; k < K; k++) {
        /* the arena is zeroed: W = 0, b = 0, so every head starts as the model's own
           next-token prediction */
        for (int v = 0; own_lm && v < h->vocab; v++)
            model_lm_head_row(m, v, h->lm[k] + (size_t)v * h->dim);
        medusa_set(h, k, h->W[k], h->b[k], h->lm[k]);
    }
    return 0;
}

void medusa_free(MedusaHeads *h) {
    arena_free(&h->arena);
    memset(h, 0, sizeof *h);
}

/* ---- the forward ---- */

void medusa_resblock(const MedusaHeads *h, int k, const float *x, int n, float *z, float *r) {
    size_t D = h->dim, nd = (size_t)n * D;
    float s = h->input_scale, sz[256];               /* SiLU(z), a stretch at a time */
    for (size_t i = 0; i < nd; i++) r[i] = s * x[i]; /* u = s x (exact when s = 1) */
    linear_apply(&h->Wp[k], z, r, n);
    for (int t = 0; t < n; t++) vec_add(z + t * D, h->b[k], D);
    for (size_t i0 = 0; i0 < nd; i0 += 256) {
        size_t m = nd - i0 < 256 ? nd - i0 : 256;
        vec_silu(sz, z + i0, m);
        vec_add(r + i0, sz, m);
        for (size_t i = 0; s != 1 && i < m; i++) r[i0 + i] /= s;
    }
}

int medusa_logits(Model *m, const MedusaHeads *h, int k, const float *hidden, int n, float *logits) {
    if (k < 0 || k >= h->n) return pd_error("medusa heads: no head %d", k);
    if (h->dim != m->c.dim || h->vocab != m->c.vocab_size)
        return pd_error("medusa heads: heads of dim %d, vocabulary %d for a model of %d, %d", h->dim, h->vocab,
                        m->c.dim, m->c.vocab_size);
    if (n < 1) return 0;
    int D = h->dim;
    /* x | z | r, [n][dim] each: on the stack for the one-token calls decoding makes */
    float small[3 * 4096],
        *buf = 3 * (size_t)n * D <= 3 * 4096 ? small : pd_alloc(pd_mul(pd_mul(sizeof(float), 3 * (size_t)n), D));
    if (!buf) return -1;
    float *x = buf, *z = buf + (size_t)n * D, *r = z + (size_t)n * D;
    model_final_norm(m, x, hidden, n);
    medusa_resblock(h, k, x, n, z, r);
    if (h->lmp[k].p) linear_apply(&h->lmp[k], logits, r, n);
    else model_lm_head(m, logits, r, n);
    if (buf != small) free(buf);
    return 0;
}

/* ---- files ---- */

/* a metadata value that is a whole number in [lo, hi] */
static int meta_long(const char *s, long lo, long hi, long *out) {
    char *end;
    if (!s || !*s) return -1;
    long v = strtol(s, &end, 10);
    if (*end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* "[[r0, r1, ...], ...]": K arrays of MEDUSA_RANKS shares each, every share in [0, 1],
   a head's shares summing to at most 1 */
static int parse_rank_acc(MedusaHeads *h, const char *s, const char *path) {
    json_error_t err;
    json_t *root = json_loads(s, 0, &err);
    int ok = root && json_is_array(root) && (int)json_array_size(root) == h->n;
    for (int k = 0; ok && k < h->n; k++) {
        json_t *row = json_array_get(root, k);
        ok = json_is_array(row) && json_array_size(row) == MEDUSA_RANKS;
        double sum = 0;
        for (int r = 0; ok && r < MEDUSA_RANKS; r++) {
            json_t *v = json_array_get(row, r);
            double a = json_is_number(v) ? json_number_value(v) : -1;
            ok = a >= 0 && a <= 1;
            h->rank_acc[k][r] = (float)a;
            sum += a;
        }
        ok = ok && sum <= 1 + 1e-4;
    }
    json_decref(root);
    if (!ok)
        return pd_error("%s: paradec.medusa.rank_acc is not a JSON array of %d arrays of %d shares in [0, 1]", path,
                        h->n, MEDUSA_RANKS);
    h->has_acc = 1;
    return 0;
}

/* tensor `name` must be F32 of the given shape (cols 0: a vector of rows); copied to dst */
static int load_f32(const TensorFile *tf, const char *name, int64_t rows, int64_t cols, float *dst, const char *path) {
    const Tensor *t = tf_get(tf, name);
    if (!t) return pd_error("%s: tensor '%s' is missing", path, name);
    int nd = cols ? 2 : 1;
    if (t->dtype != DT_F32 || t->ndim != nd) return pd_error("%s: tensor '%s' must be %d-d F32", path, name, nd);
    if (t->shape[0] != rows || (cols && t->shape[1] != cols)) {
        if (cols)
            return pd_error("%s: tensor '%s' is %lldx%lld but the model needs %lldx%lld: heads for another model", path,
                            name, (long long)t->shape[0], (long long)t->shape[1], (long long)rows, (long long)cols);
        return pd_error("%s: tensor '%s' has %lld entries but the model's dim is %lld: heads for another model", path,
                        name, (long long)t->shape[0], (long long)rows);
    }
    memcpy(dst, t->data, t->nbytes);
    for (size_t i = 0; i < t->nbytes / sizeof(float); i++)
        if (!isfinite(dst[i])) return pd_error("%s: tensor '%s' holds a non-finite value", path, name);
    return 0;
}

static int load_tensors(MedusaHeads *h, const TensorFile *tf, const char *path) {
    char name[64];
    for (int k = 0; k < h->n; k++) {
        snprintf(name, sizeof name, "medusa.%d.w", k);
        if (load_f32(tf, name, h->dim, h->dim, h->W[k], path)) return -1;
        snprintf(name, sizeof name, "medusa.%d.b", k);
        if (load_f32(tf, name, h->dim, 0, h->b[k], path)) return -1;
        snprintf(name, sizeof name, "medusa.%d.lm_head", k);
        if (h->lm[k] && load_f32(tf, name, h->vocab, h->dim, h->lm[k], path)) return -1;
        medusa_set(h, k, h->W[k], h->b[k], h->lm[k]);
    }
    return 0;
}

/* the metadata's facts, checked; K from paradec.medusa.heads */
static int check_meta(const TensorFile *tf, const Model *m, long *K, float *scale, const char *path) {
    const char *kind = tf_meta(tf, "paradec.kind"), *dig = tf_meta(tf, "paradec.model_digest");
    const char *heads = tf_meta(tf, "paradec.medusa.heads"), *dim = tf_meta(tf, "paradec.medusa.dim");
    const char *sc = tf_meta(tf, "paradec.medusa.input_scale");
    long d;
    if (!kind || strcmp(kind, "medusa-heads"))
        return pd_error("%s: not a medusa-heads file (paradec.kind is '%s')", path, kind ? kind : "missing");
    if (!heads) return pd_error("%s: no Medusa heads inside (paradec.medusa.heads is missing)", path);
    if (meta_long(heads, 1, MAX_MEDUSA, K))
        return pd_error("%s: paradec.medusa.heads '%s' is not a number of heads in 1..%d", path, heads, MAX_MEDUSA);
    if (!dim || meta_long(dim, 1, 1 << 20, &d))
        return pd_error("%s: paradec.medusa.dim is missing or not a number", path);
    if (d != m->c.dim)
        return pd_error("%s: heads of dim %ld but the model's dim is %d: heads for another model", path, d, m->c.dim);
    if (!dig) return pd_error("%s: paradec.model_digest is missing: cannot tell which model the heads are for", path);
    *scale = 1;
    if (sc) {
        char *end;
        double v = strtod(sc, &end);
        if (end == sc || *end || !(v > 0 && v < 1e6))
            return pd_error("%s: paradec.medusa.input_scale '%s' is not a positive number", path, sc);
        *scale = (float)v;
    }
    char name[64];
    snprintf(name, sizeof name, "medusa.%ld.w", *K);
    if (tf_get(tf, name))
        return pd_error("%s: tensor '%s' is there but paradec.medusa.heads says %ld heads", path, name, *K);
    return 0;
}

int medusa_load_tf(MedusaHeads *h, const TensorFile *file, const Model *m, const char *what) {
    memset(h, 0, sizeof *h);
    TensorFile view, *tf = &view;
    if (bundle_view(file, "medusa-heads", &view, what)) return -1;
    if (tf_verify(&view, NULL)) {
        tf_close(&view);
        return -1;
    }
    long K = 0;
    float scale = 1;
    int own[MAX_MEDUSA] = {0}, rc = check_meta(tf, m, &K, &scale, what);
    for (int k = 0; !rc && k < K; k++) {
        char name[64];
        snprintf(name, sizeof name, "medusa.%d.lm_head", k);
        own[k] = tf_get(tf, name) != NULL;
    }
    rc = rc ? rc : medusa_alloc(h, m, (int)K, own, what);
    if (!rc) h->input_scale = scale;
    rc = rc ? rc : load_tensors(h, tf, what);
    const char *acc = tf_meta(tf, "paradec.medusa.rank_acc"), *dig = tf_meta(tf, "paradec.model_digest");
    if (!rc && acc) rc = parse_rank_acc(h, acc, what);
    /* the shapes fit; the weights must be the very ones the heads were trained on */
    if (!rc && strcmp(dig, m->digest))
        rc = pd_error("%s: heads trained for model %s, but this model is %s", what, dig,
                      m->digest[0] ? m->digest : "(no digest)");
    if (!rc) snprintf(h->model_digest, sizeof h->model_digest, "%s", dig);
    if (rc) medusa_free(h);
    tf_close(&view);
    return rc;
}

int medusa_load(MedusaHeads *h, const char *path, const Model *m) {
    memset(h, 0, sizeof *h);
    TensorFile tf;
    if (tf_open(&tf, path)) return -1;
    int rc = medusa_load_tf(h, &tf, m, path);
    tf_close(&tf);
    return rc;
}

int medusa_save(const MedusaHeads *h, const char *path, const char *const *meta, int n_meta) {
    TfWriter *w = tfw_begin(path, -1);
    if (!w) return -1;
    tfw_record_digests(w);
    char name[64], num[3][32], *acc = NULL;
    int64_t sq[2] = {h->dim, h->dim}, vec[1] = {h->dim}, lm[2] = {h->vocab, h->dim};
    int rc = 0;
    for (int k = 0; k < h->n && !rc; k++) {
        snprintf(name, sizeof name, "medusa.%d.w", k);
        rc = tfw_add(w, name, DT_F32, 2, sq, h->W[k]);
        snprintf(name, sizeof name, "medusa.%d.b", k);
        rc = rc || tfw_add(w, name, DT_F32, 1, vec, h->b[k]);
        snprintf(name, sizeof name, "medusa.%d.lm_head", k);
        rc = rc || (h->lm[k] && tfw_add(w, name, DT_F32, 2, lm, h->lm[k]));
    }
    snprintf(num[0], sizeof num[0], "%d", h->n);
    snprintf(num[1], sizeof num[1], "%d", h->dim);
    snprintf(num[2], sizeof num[2], "%.9g", h->input_scale); /* %.9g: a float's exact value back */
    if (h->has_acc) {                                        /* "[[a, b, ...], [...]]" */
        size_t cap = (size_t)h->n * MEDUSA_RANKS * 20 + 8, at = 0;
        if (!(acc = pd_alloc(cap))) rc = -1;
        for (int k = 0; acc && k < h->n; k++)
            for (int r = 0; r < MEDUSA_RANKS; r++)
                at += snprintf(acc + at, cap - at, "%s%.9g%s",
                               r   ? ","
                               : k ? ",["
                                   : "[[",
                               h->rank_acc[k][r],
                               r + 1 < MEDUSA_RANKS ? ""
                               : k + 1 < h->n       ? "]"
                                                    : "]]");
    }
    rc = rc || tfw_meta(w, "paradec.kind", "medusa-heads") || tfw_meta(w, "paradec.version", "1") ||
         tfw_meta(w, "paradec.model_digest", h->model_digest) || tfw_meta(w, "paradec.medusa.heads", num[0]) ||
         tfw_meta(w, "paradec.medusa.dim", num[1]) || tfw_meta(w, "paradec.medusa.input_scale", num[2]) ||
         (acc && tfw_meta(w, "paradec.medusa.rank_acc", acc));
    free(acc);
    for (int i = 0; i < n_meta && !rc; i++) rc = tfw_meta(w, meta[2 * i], meta[2 * i + 1]);
    if (rc) {
        tfw_abort(w);
        return -1;
    }
    return tfw_commit(w);
}
