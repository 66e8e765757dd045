/* llama2c.c — llama2.c checkpoints (export.py's legacy and version-1 layouts). */
#include "import/llama2c.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/checkpoint.h"

#define V1_MAGIC 0x616b3432u /* "ak42" */
#define V1_HEADER 256

typedef struct {
    const unsigned char *p;
    size_t left;
    const char *what;
} Reader;

/* copy count floats, refusing to read past the end */
static int take(Reader *r, float *dst, size_t count, const char *name) {
    if (!dst) return -1; /* the allocation failed and said why */
    size_t bytes = pd_mul(count, sizeof(float));
    if (bytes > r->left)
        return pd_error("%s: truncated: '%s' needs %zu bytes, %zu left", r->what, name, bytes, r->left);
    memcpy(dst, r->p, bytes);
    r->p += bytes;
    r->left -= bytes;
    return 0;
}

static float *add(Checkpoint *ck, int layer, const char *what, int64_t rows, int64_t cols) {
    char name[128];
    if (layer >= 0) layer_tensor_name(name, sizeof name, layer, what);
    else snprintf(name, sizeof name, "%s", what);
    return ck_add(ck, name, rows, cols);
}

/* the per-layer tensors of one kind, for all layers, in file order */
static int take_layers(Checkpoint *ck, Reader *r, const char *what, int64_t rows, int64_t cols) {
    for (int l = 0; l < ck->c.n_layers; l++) {
        float *d = add(ck, l, what, rows, cols);
        if (!d || take(r, d, (size_t)(rows ? rows : 1) * cols, what)) return -1;
    }
    return 0;
}

static int header(Checkpoint *ck, Reader *r, int *shared) {
    int32_t h[7];
    uint32_t magic;
    if (r->left < 4) return pd_error("%s: too short to be a llama2.c checkpoint", r->what);
    memcpy(&magic, r->p, 4);
    int v1 = magic == V1_MAGIC;
    if (v1) {
        int32_t version;
        if (r->left < V1_HEADER) return pd_error("%s: truncated header", r->what);
        memcpy(&version, r->p + 4, 4);
        if (version != 1)
            return pd_error("%s: llama2.c checkpoint version %d is not supported (only 0 and 1)", r->what, version);
        memcpy(h, r->p + 8, sizeof h);
        *shared = r->p[8 + sizeof h];
    } else {
        if (r->left < sizeof h) return pd_error("%s: truncated header", r->what);
        memcpy(h, r->p, sizeof h);
        *shared = h[5] > 0;
        h[5] = abs(h[5]);
    }
    Config *c = &ck->c;
    *c = (Config){.dim = h[0],
                  .hidden_dim = h[1],
                  .n_layers = h[2],
                  .n_heads = h[3],
                  .n_kv_heads = h[4],
                  .vocab_size = h[5],
                  .seq_len = h[6],
                  .norm_eps = 1e-5f,
                  .rope_theta = 10000.0f,
                  .tied = *shared};
    if (c->n_heads <= 0 || c->dim % c->n_heads)
        return pd_error("%s: not a llama2.c checkpoint (dim %d, %d heads)", r->what, c->dim, c->n_heads);
    c->head_dim = c->dim / c->n_heads;
    if (config_check(c, r->what)) return -1;
    size_t hs = v1 ? V1_HEADER : sizeof h;
    r->p += hs;
    r->left -= hs;
    return v1;
}

/* q and k rows from Meta's interleaved pairs to HF's halves */
static int permute_qk(Checkpoint *ck) {
    const Config *c = &ck->c;
    char q[128], k[128];
    for (int l = 0; l < c->n_layers; l++) {
        layer_tensor_name(q, sizeof q, l, "self_attn.q_proj.weight");
        layer_tensor_name(k, sizeof k, l, "self_attn.k_proj.weight");
        if (rope_rows_permute(ck_get(ck, q)->data, c->n_heads, c->head_dim, c->dim, 1) ||
            rope_rows_permute(ck_get(ck, k)->data, c->n_kv_heads, c->head_dim, c->dim, 1))
            return -1;
    }
    return 0;
}

int llama2c_read_mem(Checkpoint *ck, const void *bytes, size_t n, const char *what) {
    memset(ck, 0, sizeof *ck);
    Reader r = {bytes, n, what};
    int shared = 0, v1 = header(ck, &r, &shared);
    if (v1 < 0) return -1;
    const Config *c = &ck->c;
    int64_t D = c->dim, H = c->hidden_dim, V = c->vocab_size, Q = (int64_t)c->n_heads * c->head_dim,
            KV = (int64_t)c->n_kv_heads * c->head_dim;
    /* the whole payload is checked against the file size before anything is allocated */
    size_t need =
        (size_t)(V * D + c->n_layers * (2 * D + D * Q + 2 * D * KV + Q * D + 3 * D * H) + D + (shared ? 0 : V * D)) *
        sizeof(float);
    if (!v1) need += (size_t)c->seq_len * c->head_dim * sizeof(float); /* RoPE tables run.c skips */
    if (need > r.left)
        return pd_error("%s: truncated: the header's shapes need %zu bytes of weights, the file has %zu", what, need,
                        r.left);
    int rc;
    if (v1)
        rc = take_layers(ck, &r, "input_layernorm.weight", 0, D) ||
             take_layers(ck, &r, "post_attention_layernorm.weight", 0, D) ||
             take(&r, add(ck, -1, NAME_NORM, 0, D), D, NAME_NORM) ||
             take(&r, add(ck, -1, NAME_EMBED, V, D), V * D, NAME_EMBED);
    else
        rc = take(&r, add(ck, -1, NAME_EMBED, V, D), V * D, NAME_EMBED) ||
             take_layers(ck, &r, "input_layernorm.weight", 0, D);
    rc = rc || take_layers(ck, &r, "self_attn.q_proj.weight", Q, D) ||
         take_layers(ck, &r, "self_attn.k_proj.weight", KV, D) ||
         take_layers(ck, &r, "self_attn.v_proj.weight", KV, D) || take_layers(ck, &r, "self_attn.o_proj.weight", D, Q);
    if (!v1) rc = rc || take_layers(ck, &r, "post_attention_layernorm.weight", 0, D);
    rc = rc || take_layers(ck, &r, "mlp.gate_proj.weight", H, D) || take_layers(ck, &r, "mlp.down_proj.weight", D, H) ||
         take_layers(ck, &r, "mlp.up_proj.weight", H, D);
    if (!v1 && !rc) {
        rc = take(&r, add(ck, -1, NAME_NORM, 0, D), D, NAME_NORM);
        size_t skip = (size_t)c->seq_len * c->head_dim * sizeof(float);
        r.p += skip; /* freq_cis_real and _imag, already checked to be there */
        r.left -= skip;
    }
    if (!rc && !shared) rc = take(&r, add(ck, -1, NAME_LM_HEAD, V, D), V * D, NAME_LM_HEAD);
    if (!rc && r.left) rc = pd_error("%s: %zu unexpected bytes after the last tensor", what, r.left);
    if (rc) {
        if (!strstr(pd_errmsg(), what)) pd_error_prefix(what);
        ck_free(ck);
        return -1;
    }
    if (permute_qk(ck)) {
        ck_free(ck);
        return -1;
    }
    return 0;
}

int llama2c_read(Checkpoint *ck, const char *path) {
    char *bytes;
    size_t n;
    if (pd_read_file(path, &bytes, &n)) return -1;
    int rc = llama2c_read_mem(ck, bytes, n, path);
    free(bytes);
    return rc;
}

static int put(AtomicFile *af, const Checkpoint *ck, int layer, const char *what, int unpermute_heads) {
    char name[128];
    if (layer >= 0) layer_tensor_name(name, sizeof name, layer, what);
    else snprintf(name, sizeof name, "%s", what);
    const CkTensor *t = ck_get(ck, name);
    if (!t) return pd_error("llama2.c export: tensor '%s' missing", name);
    size_t count = (size_t)t->shape[0] * t->shape[1];
    float *d = t->data, *tmp = NULL;
    if (unpermute_heads) {
        if (!(tmp = pd_alloc(count * sizeof(float)))) return -1;
        memcpy(tmp, d, count * sizeof(float));
        if (rope_rows_permute(tmp, unpermute_heads, ck->c.head_dim, (int)t->shape[1], 0)) {
            free(tmp);
            return -1;
        }
        d = tmp;
    }
    size_t wrote = fwrite(d, sizeof(float), count, af->f);
    free(tmp);
    return wrote == count ? 0 : pd_error("llama2.c export: write error");
}

int llama2c_write(const Checkpoint *ck, const char *path) {
    const Config *c = &ck->c;
    if (c->head_dim * c->n_heads != c->dim)
        return pd_error("%s: llama2.c needs head_dim × heads = dim (%d × %d ≠ %d)", path, c->head_dim, c->n_heads,
                        c->dim);
    AtomicFile af;
    if (atomic_open(&af, path)) return -1;
    int32_t h[7] = {c->dim,     c->hidden_dim, c->n_layers,
                    c->n_heads, c->n_kv_heads, c->tied ? c->vocab_size : -c->vocab_size,
                    c->seq_len};
    int rc = fwrite(h, sizeof h, 1, af.f) == 1 ? 0 : pd_error("%s: write error", path);
    rc = rc || put(&af, ck, -1, NAME_EMBED, 0);
    static const char *const per_layer[] = {
        "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
        "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
        "mlp.gate_proj.weight",    "mlp.down_proj.weight",    "mlp.up_proj.weight"};
    for (int k = 0; k < 9 && !rc; k++)
        for (int l = 0; l < c->n_layers && !rc; l++)
            rc = put(&af, ck, l, per_layer[k], k == 1 ? c->n_heads : k == 2 ? c->n_kv_heads : 0);
    rc = rc || put(&af, ck, -1, NAME_NORM, 0);
    /* the RoPE tables legacy files carry (run.c skips them; written for the layout) */
    int half = c->head_dim / 2;
    for (int part = 0; part < 2 && !rc; part++)
        for (int p = 0; p < c->seq_len && !rc; p++)
            for (int j = 0; j < half && !rc; j++) {
                float freq = 1.0f / powf(c->rope_theta, (2 * j) / (float)c->head_dim), a = p * freq;
                float v = part ? sinf(a) : cosf(a);
                rc = fwrite(&v, 4, 1, af.f) == 1 ? 0 : pd_error("%s: write error", path);
            }
    if (!c->tied) rc = rc || put(&af, ck, -1, NAME_LM_HEAD, 0);
    if (rc) {
        atomic_abort(&af);
        return -1;
    }
    return atomic_commit(&af);
}
