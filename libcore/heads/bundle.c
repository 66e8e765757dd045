/* bundle.c — a model and its head sets in one file (bundle.h). */
#include "heads/bundle.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "model/model.h"

#define HEAD_KINDS "exit-heads, medusa-heads, eagle-head"

static int is_head_kind(const char *k) {
    return k && (!strcmp(k, "exit-heads") || !strcmp(k, "medusa-heads") || !strcmp(k, "eagle-head"));
}

/* paradec.bundle, parsed; NULL (and a message) when it is malformed */
static json_t *bundle_sets(const TensorFile *tf, const char *what) {
    const char *list = tf_meta(tf, "paradec.bundle");
    json_t *a = list ? json_loads(list, 0, NULL) : NULL;
    size_t i;
    json_t *e;
    if (!a || !json_is_array(a)) {
        json_decref(a);
        pd_error("%s: a bundle without a readable paradec.bundle list", what);
        return NULL;
    }
    json_array_foreach(a, i, e) {
        const char *p = json_string_value(json_object_get(e, "prefix"));
        if (!p || !is_head_kind(json_string_value(json_object_get(e, "kind")))) {
            json_decref(a);
            pd_error("%s: paradec.bundle entry %zu is not a {prefix, kind} of a head set", what, i + 1);
            return NULL;
        }
    }
    return a;
}

int bundle_has(const TensorFile *tf, const char *kind) {
    const char *k = tf_meta(tf, "paradec.kind");
    json_t *a = k && !strcmp(k, "bundle") ? bundle_sets(tf, "bundle") : NULL, *e;
    size_t i;
    int has = 0;
    json_array_foreach(a, i, e) has |= !strcmp(json_string_value(json_object_get(e, "kind")), kind);
    json_decref(a);
    return has;
}

int bundle_view(const TensorFile *tf, const char *kind, TensorFile *view, const char *what) {
    const char *k = tf_meta(tf, "paradec.kind");
    if (!k || strcmp(k, "bundle")) return tf_view(view, tf, "");
    json_t *a = bundle_sets(tf, what), *e;
    if (!a) return -1;
    size_t i;
    char kinds[256] = "";
    json_array_foreach(a, i, e) {
        const char *ek = json_string_value(json_object_get(e, "kind"));
        if (!strcmp(ek, kind)) {
            int rc = tf_view(view, tf, json_string_value(json_object_get(e, "prefix")));
            json_decref(a);
            return rc;
        }
        snprintf(kinds + strlen(kinds), sizeof kinds - strlen(kinds), "%s%s", i ? ", " : "", ek);
    }
    json_decref(a);
    return pd_error("%s: the bundle holds no %s (it holds: %s)", what, kind, kinds[0] ? kinds : "no head sets");
}

/* the model file's metadata, the kind made `bundle` and the list of sets added */
static int write_model_meta(TfWriter *w, const TensorFile *m, const char *list) {
    for (int i = 0; i < m->n_meta; i++) {
        const char *k = m->meta_key[i];
        if (!strcmp(k, "paradec.kind") || !strcmp(k, "paradec.bundle")) continue;
        if (tfw_meta(w, k, m->meta_val[i])) return -1;
    }
    return tfw_meta(w, "paradec.kind", "bundle") || tfw_meta(w, "paradec.bundle", list);
}

static int add_prefixed(TfWriter *w, const TensorFile *h, const char *prefix) {
    char name[512];
    for (int i = 0; i < h->n_meta; i++) {
        snprintf(name, sizeof name, "%s%s", prefix, h->meta_key[i]);
        if (tfw_meta(w, name, h->meta_val[i])) return -1;
    }
    for (int i = 0; i < h->n; i++) {
        const Tensor *t = &h->t[i];
        snprintf(name, sizeof name, "%s%s", prefix, t->name);
        if (tfw_add(w, name, t->dtype, t->ndim, t->shape, t->data)) return -1;
    }
    return 0;
}

/* the head files, opened and checked against the model's digest */
static int open_heads(TensorFile *hs, const char *const *heads, int n, const char *digest, const char *model) {
    for (int i = 0; i < n; i++) {
        if (tf_open(&hs[i], heads[i]) || tf_verify(&hs[i], NULL)) return -1;
        const char *kind = tf_meta(&hs[i], "paradec.kind"), *dig = tf_meta(&hs[i], "paradec.model_digest");
        if (!is_head_kind(kind))
            return pd_error("%s: not a head set (paradec.kind is '%s'; a bundle takes %s)", heads[i],
                            kind ? kind : "missing", HEAD_KINDS);
        if (!dig || strcmp(dig, digest))
            return pd_error("%s: heads trained for model %s, but %s is %s", heads[i], dig ? dig : "(none recorded)",
                            model, digest);
    }
    return 0;
}

int bundle_write(const char *out, const char *model, const char *const *heads, int n_heads) {
    TensorFile m = {0}, *hs = pd_alloc(sizeof(TensorFile) * (n_heads + 1));
    if (!hs || tf_open(&m, model)) {
        free(hs);
        return -1;
    }
    const char *kind = tf_meta(&m, "paradec.kind"), *digest = tf_meta(&m, "paradec.digest");
    int rc = 0;
    if (!kind || strcmp(kind, "model"))
        rc = pd_error("%s: not a paradec model (paradec.kind is '%s')", model, kind ? kind : "missing");
    else if (!digest) rc = pd_error("%s: the model records no digest (convert it again)", model);
    rc = rc ? rc : model_verify(&m); /* a damaged model would travel on with its digest */
    rc = rc ? rc : open_heads(hs, heads, n_heads, digest, model);
    json_t *list = json_array();
    char prefix[32];
    for (int i = 0; !rc && i < n_heads; i++) {
        snprintf(prefix, sizeof prefix, "heads.%d/", i);
        json_array_append_new(list, json_pack("{s:s, s:s}", "prefix", prefix, "kind", tf_meta(&hs[i], "paradec.kind")));
    }
    char *ls = rc ? NULL : json_dumps(list, JSON_COMPACT);
    TfWriter *w = rc ? NULL : tfw_begin(out, -1);
    if (!rc && (!ls || !w)) rc = -1;
    rc = rc ? rc : write_model_meta(w, &m, ls);
    for (int i = 0; !rc && i < m.n; i++)
        rc = tfw_add(w, m.t[i].name, m.t[i].dtype, m.t[i].ndim, m.t[i].shape, m.t[i].data);
    for (int i = 0; !rc && i < n_heads; i++) {
        snprintf(prefix, sizeof prefix, "heads.%d/", i);
        rc = add_prefixed(w, &hs[i], prefix);
    }
    if (rc) tfw_abort(w);
    else rc = tfw_commit(w);
    for (int i = 0; i < n_heads; i++) tf_close(&hs[i]);
    tf_close(&m);
    free(hs);
    free(ls);
    json_decref(list);
    return rc;
}

/* the facts worth printing of one set: its kind, sizes, and training metadata */
static void list_set(const TensorFile *tf, const char *title, FILE *f) {
    size_t bytes = 0;
    for (int i = 0; i < tf->n; i++) bytes += tf->t[i].nbytes;
    fprintf(f, "%s: kind %s, %d tensors, %.1f MB\n", title,
            tf_meta(tf, "paradec.kind") ? tf_meta(tf, "paradec.kind") : "?", tf->n, bytes / 1e6);
    for (int i = 0; i < tf->n; i++) {
        const Tensor *t = &tf->t[i];
        fprintf(f, "  %-40s %-4s [", t->name, dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++) fprintf(f, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        fprintf(f, "]\n");
    }
    for (int i = 0; i < tf->n_meta; i++) {
        const char *k = tf->meta_key[i], *v = tf->meta_val[i];
        if (!strcmp(k, "paradec.tokenizer") || !strncmp(k, "paradec.tokenizer.", 18) || strlen(v) > 160)
            fprintf(f, "  %s: (%zu bytes)\n", k, strlen(v));
        else fprintf(f, "  %s: %s\n", k, v);
    }
}

int bundle_list(const char *path, FILE *f) {
    TensorFile tf, model;
    if (tf_open(&tf, path)) return -1;
    const char *kind = tf_meta(&tf, "paradec.kind");
    if (!kind || strcmp(kind, "bundle")) {
        list_set(&tf, path, f);
        tf_close(&tf);
        return 0;
    }
    json_t *a = bundle_sets(&tf, path), *e;
    int rc = a ? 0 : -1;
    /* the model: every tensor and key that no set's prefix claims */
    if (!rc && !tf_view(&model, &tf, "")) {
        int w = 0;
        for (int i = 0; i < model.n; i++) {
            if (!strncmp(model.t[i].name, "heads.", 6)) free(model.t[i].name);
            else model.t[w++] = model.t[i];
        }
        model.n = w;
        w = 0;
        for (int i = 0; i < model.n_meta; i++) {
            if (!strncmp(model.meta_key[i], "heads.", 6)) {
                free(model.meta_key[i]);
                free(model.meta_val[i]);
            } else {
                model.meta_key[w] = model.meta_key[i];
                model.meta_val[w++] = model.meta_val[i];
            }
        }
        model.n_meta = w;
        list_set(&model, "model", f);
        tf_close(&model);
    }
    size_t i;
    json_array_foreach(a, i, e) {
        TensorFile v;
        if (tf_view(&v, &tf, json_string_value(json_object_get(e, "prefix")))) {
            rc = -1;
            break;
        }
        char title[64];
        snprintf(title, sizeof title, "head set %zu", i);
        list_set(&v, title, f);
        tf_close(&v);
    }
    json_decref(a);
    tf_close(&tf);
    return rc;
}
