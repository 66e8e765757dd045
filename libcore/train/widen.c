/* widen.c — a small Llama embedded function-preservingly in a big Llama shape.
   The plan (which wide layer/head/pair holds which real one) is made once; then each
   wide tensor is built on its own from the plan and the source, with its own random
   stream, so tensors can be built (and freed) one at a time in any order. */
#include "train/widen.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "heads/medusa_heads.h"

const WidenPreset widen_presets[] = {
    {"110m", 768, 2048, 12, 12, 12, 64, "Llama-2-style 110M shape (llama2.c stories110M)"},
    {"1b", 2048, 5632, 22, 32, 4, 64, "TinyLlama-1.1B shape"},
    {"8b", 4096, 14336, 32, 32, 8, 128, "Llama-3-8B shape (for the GPU; write it as bf16)"},
    {"tiny", 256, 512, 7, 16, 16, 16, "test: a kv head per head, real kv heads copied (as 110m)"},
    {"tiny-gqa", 192, 400, 6, 12, 4, 16, "test: kv groups of 3 hold real ones of 2 (as 1b, 8b)"},
};
const int widen_n_presets = sizeof widen_presets / sizeof widen_presets[0];

const WidenPreset *widen_preset(const char *name) {
    for (int i = 0; i < widen_n_presets; i++)
        if (!strcmp(widen_presets[i].name, name)) return &widen_presets[i];
    char known[256] = "";
    for (int i = 0; i < widen_n_presets; i++)
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", widen_presets[i].name);
    return pd_error("--preset: '%s' is unknown (known: %s)", name, known), NULL;
}

Config widen_shape(const Config *src, const WidenPreset *p) {
    Config c = *src;
    c.dim = p->dim;
    c.hidden_dim = p->hidden_dim;
    c.n_layers = p->n_layers;
    c.n_heads = p->n_heads;
    c.n_kv_heads = p->n_kv_heads;
    c.head_dim = p->head_dim;
    return c;
}

/* ---- the plan ---- */

typedef struct {
    const Checkpoint *src;
    Config a, b;     /* the real shape and the wide one */
    double s;        /* sqrt(b.dim / a.dim): the residual stream's scale */
    double qs;       /* sqrt(b.head_dim / a.head_dim): turns 1/sqrt(HD) into 1/sqrt(hd) */
    int step;        /* real RoPE pair i sits at wide pair i*step */
    int *real_layer; /* [b.n_layers] real layer each wide layer runs, -1 = identity */
    int *qhead;      /* [a.n_heads] wide q head holding each real one */
    int *kv_of;      /* [b.n_kv_heads] real kv head each wide one holds, -1 = none */
    uint64_t seed;
} Plan;

/* wide q head of real head h: keep the real group together inside a wide group when
   wide groups are at least as big, else one-to-one (then wide groups split real ones) */
static int map_heads(Plan *p, const char *what) {
    int G = p->a.n_heads / p->a.n_kv_heads, G2 = p->b.n_heads / p->b.n_kv_heads; /* widen_check: G2 ≥ G or G2 | G */
    for (int k = 0; k < p->b.n_kv_heads; k++) p->kv_of[k] = -1;
    for (int h = 0; h < p->a.n_heads; h++) {
        int g = h / G, w = G2 >= G ? g * G2 + h % G : h;
        if (w >= p->b.n_heads)
            return pd_error("%s: its %d kv heads cannot hold the model's %d", what, p->b.n_kv_heads, p->a.n_kv_heads);
        if (p->kv_of[w / G2] >= 0 && p->kv_of[w / G2] != g) /* never: the mapping above avoids it */
            return pd_error("%s: wide kv head %d would hold real kv heads %d and %d", what, w / G2, p->kv_of[w / G2],
                            g);
        p->kv_of[w / G2] = g;
        p->qhead[h] = w;
    }
    return 0;
}

/* real pair i at wide pair i*step must see the same RoPE frequency as model.c
   computes it: 1/powf(theta, (2j)/(float)head_dim) */
static int check_rope(const Config *a, const Config *b, const char *what) {
    int step = b->head_dim / a->head_dim;
    for (int i = 0; i < a->head_dim / 2; i++)
        if ((2 * i) / (float)a->head_dim != (2 * i * step) / (float)b->head_dim)
            return pd_error("%s: RoPE pair %d's frequency changes in float", what, i);
    return 0;
}

int widen_check(const Config *a, const Config *b, const char *what) {
    if (config_check(a, "widen: the model") || config_check(b, what)) return -1;
    struct {
        const char *name;
        int wide, real;
    } need[] = {{"dim", b->dim, a->dim},
                {"hidden_dim", b->hidden_dim, a->hidden_dim},
                {"layers", b->n_layers, a->n_layers},
                {"heads", b->n_heads, a->n_heads},
                {"kv heads", b->n_kv_heads, a->n_kv_heads},
                {"head_dim", b->head_dim, a->head_dim}};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (need[i].wide < need[i].real)
            return pd_error("%s: cannot hold the model: %s %d < the model's %d", what, need[i].name, need[i].wide,
                            need[i].real);
    if (b->head_dim % a->head_dim)
        return pd_error("%s: head_dim %d is not a multiple of the model's %d (RoPE pairs)", what, b->head_dim,
                        a->head_dim);
    /* map_heads: wide groups hold whole real groups, or split them evenly */
    int G = a->n_heads / a->n_kv_heads, G2 = b->n_heads / b->n_kv_heads;
    if (G2 < G && G % G2)
        return pd_error("%s: its kv groups of %d heads cannot hold the model's groups of %d", what, G2, G);
    if (b->vocab_size != a->vocab_size || b->seq_len != a->seq_len || b->tied != a->tied ||
        b->norm_eps != a->norm_eps || b->rope_theta != a->rope_theta)
        return pd_error("%s: vocabulary, context, eps, theta and tying must stay the model's", what);
    return check_rope(a, b, what);
}

static void plan_free(Plan *p) {
    free(p->real_layer);
    free(p->qhead);
    free(p->kv_of);
}

/* by name: ck_write_model's canonical order within a layer, which the streamed
   writer must follow to write the same bytes */
static const char *const LAYER_PART[] = {
    "input_layernorm.weight",          "mlp.down_proj.weight",    "mlp.gate_proj.weight",    "mlp.up_proj.weight",
    "post_attention_layernorm.weight", "self_attn.k_proj.weight", "self_attn.o_proj.weight", "self_attn.q_proj.weight",
    "self_attn.v_proj.weight"};
enum { P_NORM_IN, P_DOWN, P_GATE, P_UP, P_NORM_POST, P_K, P_O, P_Q, P_V, N_PART };

/* shape[2] = [rows][cols] of a layer part in shape c (rows 0: a vector of cols) */
static void part_shape(const Config *c, int part, int64_t *shape) {
    int64_t D = c->dim, F = c->hidden_dim, Q = (int64_t)c->n_heads * c->head_dim,
            KV = (int64_t)c->n_kv_heads * c->head_dim;
    const int64_t t[N_PART][2] = {{0, D}, {D, F}, {F, D}, {F, D}, {0, D}, {KV, D}, {D, Q}, {Q, D}, {KV, D}};
    shape[0] = t[part][0];
    shape[1] = t[part][1];
}

/* the source tensor's data, which must be [rows][cols] (rows 0: a vector) */
static const float *src_tensor(const Plan *p, int layer, const char *what, int64_t rows, int64_t cols) {
    char name[128];
    if (layer >= 0) layer_tensor_name(name, sizeof name, layer, what);
    else snprintf(name, sizeof name, "%s", what);
    const CkTensor *t = ck_get(p->src, name);
    if (!t) return pd_error("widen: the model has no tensor '%s'", name), NULL;
    if (t->shape[0] != (rows ? rows : cols) || t->shape[1] != (rows ? cols : 1))
        return pd_error("widen: tensor '%s' is not [%lld][%lld]", name, (long long)rows, (long long)cols), NULL;
    return t->data;
}

/* every source tensor there with its shape, before anything is built */
static int check_source(const Plan *p) {
    const Config *a = &p->a;
    int64_t shape[2];
    for (int l = 0; l < a->n_layers; l++)
        for (int k = 0; k < N_PART; k++) {
            part_shape(a, k, shape);
            if (!src_tensor(p, l, LAYER_PART[k], shape[0], shape[1])) return -1;
        }
    if (!src_tensor(p, -1, NAME_EMBED, a->vocab_size, a->dim) || !src_tensor(p, -1, NAME_NORM, 0, a->dim)) return -1;
    if (!a->tied && !src_tensor(p, -1, NAME_LM_HEAD, a->vocab_size, a->dim)) return -1;
    return 0;
}

static int plan_init(Plan *p, const Checkpoint *src, const Config *dst, uint64_t seed) {
    *p = (Plan){.src = src, .a = src->c, .b = *dst, .seed = seed};
    if (widen_check(&p->a, &p->b, "widen") || check_source(p)) return -1;
    p->s = sqrt((double)p->b.dim / p->a.dim);
    p->qs = sqrt((double)p->b.head_dim / p->a.head_dim);
    p->step = p->b.head_dim / p->a.head_dim;
    p->real_layer = pd_alloc(sizeof(int) * p->b.n_layers);
    p->qhead = pd_alloc(sizeof(int) * p->a.n_heads);
    p->kv_of = pd_alloc(sizeof(int) * p->b.n_kv_heads);
    if (!p->real_layer || !p->qhead || !p->kv_of || map_heads(p, "widen")) {
        plan_free(p);
        return -1;
    }
    /* real layer r at floor(r·L'/L): strictly increasing since L' ≥ L */
    for (int l = 0; l < p->b.n_layers; l++) p->real_layer[l] = -1;
    for (int r = 0; r < p->a.n_layers; r++) p->real_layer[(int)((int64_t)r * p->b.n_layers / p->a.n_layers)] = r;
    return 0;
}

/* ---- the wide tensors in ck_write_model's canonical order: embedding, layers,
   then the rest by name (lm_head, final norm) ---- */

typedef struct {
    char name[128];
    int layer, part;    /* wide layer and LAYER_PART index; layer -1 for the global ones */
    int64_t rows, cols; /* rows 0: a vector of cols */
} Slot;

static int n_slots(const Plan *p) { return 2 + N_PART * p->b.n_layers + !p->b.tied; }

static Slot slot_at(const Plan *p, int i) {
    const Config *b = &p->b;
    Slot s = {.layer = -1, .part = -1};
    if (i == 0 || i >= 1 + N_PART * b->n_layers) {
        int k = i ? i - N_PART * b->n_layers + b->tied : 0; /* 0 embed, 1 lm_head, 2 norm */
        snprintf(s.name, sizeof s.name, "%s", k == 0 ? NAME_EMBED : k == 1 ? NAME_LM_HEAD : NAME_NORM);
        s.rows = k == 2 ? 0 : b->vocab_size;
        s.cols = b->dim;
        return s;
    }
    int64_t shape[2];
    s.layer = (i - 1) / N_PART;
    s.part = (i - 1) % N_PART;
    layer_tensor_name(s.name, sizeof s.name, s.layer, LAYER_PART[s.part]);
    part_shape(b, s.part, shape);
    s.rows = shape[0];
    s.cols = shape[1];
    return s;
}

static size_t slot_count(const Slot *s) { return (size_t)(s->rows ? s->rows : 1) * s->cols; }

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in ±0.02: small, so random heads and units never overflow */
static void fill_random(float *w, size_t n, uint64_t *rng) {
    for (size_t i = 0; i < n; i++) w[i] = 0.02f * ((float)(splitmix(rng) >> 40) * 0x1p-23f - 1.0f);
}

static void copy_scaled(float *dst, const float *src, int n, double scale) {
    for (int i = 0; i < n; i++) dst[i] = (float)(src[i] * scale);
}

/* embedding or lm_head [V][D]: real rows × s in dims [0, d) */
static void build_vocab_rows(const Plan *p, const float *src /*[V][d]*/, float *w /*[V][D]*/) {
    for (int v = 0; v < p->a.vocab_size; v++)
        copy_scaled(w + (size_t)v * p->b.dim, src + (size_t)v * p->a.dim, p->a.dim, p->s);
}

/* a norm gain [D]: real gains × scale, 1 on dims that only ever see zeros */
static void build_norm(const Plan *p, const float *g /*[d] or NULL*/, double scale, float *w /*[D]*/) {
    for (int i = 0; i < p->b.dim; i++) w[i] = g && i < p->a.dim ? (float)(g[i] * scale) : 1.0f;
}

/* q or k [heads'*HD][D]: real head `real` into wide head `wide`, pair i to pair i*step.
   zero_rest zeroes the wide head's other rows (q: they must add nothing to scores) */
static void build_rope_head(const Plan *p, const float *src /*[heads*hd][d]*/, int real, int wide, double scale,
                            int zero_rest, float *w /*[heads'*HD][D]*/) {
    int hd = p->a.head_dim, HD = p->b.head_dim, d = p->a.dim, D = p->b.dim;
    float *head = w + (size_t)wide * HD * D;
    if (zero_rest) memset(head, 0, sizeof(float) * HD * D);
    for (int c = 0; c < 2; c++)          /* the pair's first and second half */
        for (int i = 0; i < hd / 2; i++) /* (j, j+HD/2) ← (i, i+hd/2) */
            copy_scaled(head + (size_t)(c * HD / 2 + i * p->step) * D, src + ((size_t)real * hd + c * hd / 2 + i) * d,
                        d, scale);
}

/* v [kv'*HD][D]: real kv head's rows into the first hd rows of the wide one */
static void build_v_head(const Plan *p, const float *src /*[kv*hd][d]*/, int real, int wide, float *w /*[kv'*HD][D]*/) {
    int hd = p->a.head_dim;
    for (int t = 0; t < hd; t++)
        copy_scaled(w + ((size_t)wide * p->b.head_dim + t) * p->b.dim, src + ((size_t)real * hd + t) * p->a.dim,
                    p->a.dim, 1.0);
}

/* o_proj [D][H'*HD], zero but for the real heads' real v dims, × s */
static void build_o(const Plan *p, const float *src /*[d][H*hd]*/, float *w /*[D][H'*HD]*/) {
    int hd = p->a.head_dim, q = p->a.n_heads * hd, Q = p->b.n_heads * p->b.head_dim;
    memset(w, 0, sizeof(float) * p->b.dim * Q);
    for (int r = 0; r < p->a.dim; r++)
        for (int h = 0; h < p->a.n_heads; h++)
            copy_scaled(w + (size_t)r * Q + (size_t)p->qhead[h] * p->b.head_dim, src + (size_t)r * q + h * hd, hd,
                        p->s);
}

/* [rows'][cols'] ← real [rows][cols] in the top-left corner, × scale */
static void build_corner(const float *src, int rows, int cols, double scale, float *w, int cols2) {
    for (int r = 0; r < rows; r++) copy_scaled(w + (size_t)r * cols2, src + (size_t)r * cols, cols, scale);
}

static int build_layer_part(const Plan *p, const Slot *s, float *w) {
    const Config *a = &p->a, *b = &p->b;
    int r = p->real_layer[s->layer], k = s->part;
    int64_t shape[2];
    part_shape(a, k, shape);
    const float *src = r < 0 ? NULL : src_tensor(p, r, LAYER_PART[k], shape[0], shape[1]);
    if (r >= 0 && !src) return -1;
    if (k == P_NORM_IN || k == P_NORM_POST) build_norm(p, src, 1.0 / p->s, w);
    else if (k == P_O) {
        if (src) build_o(p, src, w);
        else memset(w, 0, sizeof(float) * slot_count(s));
    } else if (k == P_DOWN) {
        memset(w, 0, sizeof(float) * slot_count(s));
        if (src) build_corner(src, a->dim, a->hidden_dim, p->s, w, b->hidden_dim);
    } else if (!src) {
        /* identity layer: random, already filled */
    } else if (k == P_Q) {
        for (int h = 0; h < a->n_heads; h++) build_rope_head(p, src, h, p->qhead[h], p->qs, 1, w);
    } else if (k == P_K || k == P_V) {
        for (int kv = 0; kv < b->n_kv_heads; kv++)
            if (p->kv_of[kv] >= 0) {
                if (k == P_K) build_rope_head(p, src, p->kv_of[kv], kv, 1.0, 0, w);
                else build_v_head(p, src, p->kv_of[kv], kv, w);
            }
    } else /* gate, up */
        build_corner(src, a->hidden_dim, a->dim, 1.0, w, b->dim);
    return 0;
}

/* wide tensor i into w (sized slot_count), from the plan alone */
static int build_slot(const Plan *p, int i, const Slot *s, float *w) {
    uint64_t rng = p->seed ^ (0x632be59bd9b4e019ull * (uint64_t)(i + 1));
    fill_random(w, slot_count(s), &rng); /* what nothing below overwrites */
    if (s->layer >= 0) return build_layer_part(p, s, w);
    if (!strcmp(s->name, NAME_NORM)) {
        /* the final norm feeds only lm_head (E·s when tied): divide by s twice */
        const float *g = src_tensor(p, -1, NAME_NORM, 0, p->a.dim);
        if (g) build_norm(p, g, 1.0 / ((double)p->b.dim / p->a.dim), w);
        return g ? 0 : -1;
    }
    const float *e = src_tensor(p, -1, s->name, p->a.vocab_size, p->a.dim);
    if (!e) return -1;
    if (!strcmp(s->name, NAME_EMBED)) memset(w, 0, sizeof(float) * slot_count(s)); /* extra dims stay 0 */
    build_vocab_rows(p, e, w); /* lm_head's extra columns read zeros: random is fine */
    return 0;
}

static int64_t total_params(const Plan *p) {
    int64_t n = 0;
    for (int i = 0; i < n_slots(p); i++) {
        Slot s = slot_at(p, i);
        n += (int64_t)slot_count(&s);
    }
    return n;
}

/* ---- outputs ---- */

static int copy_tokenizer(const Checkpoint *src, Checkpoint *out) {
    if (!src->tok) return 0;
    if (!(out->tok = pd_alloc(src->tok_len))) return -1;
    memcpy(out->tok, src->tok, src->tok_len);
    out->tok_len = src->tok_len;
    memcpy(out->tok_kind, src->tok_kind, sizeof out->tok_kind);
    if (src->chat_template && !(out->chat_template = pd_strdup(src->chat_template))) return -1;
    return 0;
}

int widen_checkpoint(const Checkpoint *src, const Config *dst, uint64_t seed, Checkpoint *out, Progress *pg) {
    Plan p;
    memset(out, 0, sizeof *out);
    if (plan_init(&p, src, dst, seed)) return -1;
    out->c = p.b;
    int rc = copy_tokenizer(src, out);
    int64_t done = 0;
    if (pg) progress_begin(pg, "widen: weights", total_params(&p));
    for (int i = 0; i < n_slots(&p) && !rc; i++) {
        Slot s = slot_at(&p, i);
        float *w = ck_add(out, s.name, s.rows, s.cols);
        rc = w ? build_slot(&p, i, &s, w) : -1;
        done += (int64_t)slot_count(&s);
        if (pg) progress_step(pg, done);
    }
    if (pg) progress_end(pg);
    plan_free(&p);
    if (rc) ck_free(out);
    return rc;
}

/* ---- straight to a model file: the same bytes ck_write_model writes ---- */

/* one wide tensor built and handed to the writer; f32 buffers live until commit */
static int stream_slot(const Plan *p, int i, DType dt, ModelWriter *mw, void **keep, float *scratch) {
    Slot s = slot_at(p, i);
    size_t count = slot_count(&s);
    int f32 = strstr(s.name, "norm") || dt == DT_F32; /* the writer references f32 data */
    float *f = f32 ? pd_alloc(pd_mul(count, sizeof(float))) : scratch;
    if (!f) return -1;
    if (f32) keep[i] = f;
    int64_t shape[2] = {s.rows ? s.rows : s.cols, s.rows ? s.cols : 1}; /* as CkTensor holds it */
    return build_slot(p, i, &s, f) || mw_add(mw, s.name, s.rows ? 2 : 1, shape, f) ? -1 : 0;
}

static size_t largest_slot(const Plan *p) {
    size_t m = 0;
    for (int i = 0; i < n_slots(p); i++) {
        Slot s = slot_at(p, i);
        m = slot_count(&s) > m ? slot_count(&s) : m;
    }
    return m;
}

int widen_write_model(const Checkpoint *src, const Config *dst, uint64_t seed, const char *path, DType dt,
                      Progress *pg) {
    if (!src->tok) return pd_error("%s: the model has no tokenizer", path);
    Plan p;
    if (plan_init(&p, src, dst, seed)) return -1;
    int n = n_slots(&p);
    void **keep = pd_alloc(sizeof(void *) * n);
    float *scratch = dt == DT_BF16 ? pd_alloc(pd_mul(largest_slot(&p), sizeof(float))) : NULL;
    ModelWriter mw;
    int rc = keep && (dt != DT_BF16 || scratch) ? mw_begin(&mw, path, dt) : -1;
    if (!rc) mw.chat_template = src->chat_template;
    int64_t done = 0;
    if (pg && !rc) progress_begin(pg, "widen: weights", total_params(&p));
    for (int i = 0; i < n && !rc; i++) {
        Slot s = slot_at(&p, i);
        rc = stream_slot(&p, i, dt, &mw, keep, scratch);
        done += (int64_t)slot_count(&s);
        if (pg) progress_step(pg, done);
    }
    if (pg && !rc) progress_end(pg);
    if (keep && (dt != DT_BF16 || scratch)) /* mw was begun */
        rc = rc ? (mw_abort(&mw), -1) : mw_commit(&mw, &p.b, src->tok, src->tok_len, src->tok_kind);
    for (int i = 0; keep && i < n; i++) free(keep[i]);
    free(keep);
    free(scratch);
    plan_free(&p);
    return rc;
}

/* ---- exit heads, widened along with their model ---- */

int widen_heads(const char *heads_in, const char *small_model, const char *wide_model, const char *heads_out) {
    Model a, b;
    ExitHeads src = {0}, dst = {0};
    if (model_load(&a, small_model)) return -1;
    if (model_load(&b, wide_model)) {
        model_free(&a);
        return -1;
    }
    int rc = heads_load(&src, heads_in, &a);
    if (!rc && src.n_vocab) rc = pd_error("%s: heads with a check vocabulary are not widened yet", heads_in);
    int layers[MAX_EXIT_HEADS], La = a.c.n_layers, Lb = b.c.n_layers, d = a.c.dim, D = b.c.dim;
    /* real layer r runs at wide floor(r·L'/L) (plan_init); a head after real layers
       [0, l) sits right after the wide layer that runs real layer l-1 */
    for (int k = 0; !rc && k < src.n; k++) layers[k] = (src.layer[k] - 1) * Lb / La + 1;
    rc = rc ? rc : heads_identity(&dst, &b, layers, src.n, src.norm);
    /* with the final norm, the wide normed state is the real one / s and the wide
       output embedding the real one × s: T carries over; without it, the stream is the
       real one × s, so T / s² */
    double s2 = (double)D / d, scale = src.norm ? 1 : 1 / s2;
    float *T = rc ? NULL : pd_alloc(sizeof(float) * D * D);
    if (!rc && !T) rc = -1;
    for (int k = 0; !rc && k < src.n; k++) {
        memset(T, 0, sizeof(float) * D * D);
        for (int i = 0; i < d; i++)
            for (int j = 0; j < d; j++) T[(size_t)i * D + j] = (float)(src.T[k][(size_t)i * d + j] * scale);
        rc = heads_set_T(&dst, k, T);
    }
    /* the held-out records travel with each head, under its wide layer */
    enum { N_STATS = 2 + 2 * EXIT_N_GAMMA };
    const char *meta[2 * (1 + MAX_EXIT_HEADS * N_STATS)];
    char keys[MAX_EXIT_HEADS * N_STATS][EXIT_KEY_MAX];
    int n_meta = 0;
    meta[2 * n_meta] = "paradec.widened_from", meta[2 * n_meta++ + 1] = src.model_digest;
    for (int k = 0; !rc && k < src.n; k++)
        for (int i = 0; i < N_STATS; i++) {
            int g = i < 2 * EXIT_N_GAMMA ? i / 2 : -1; /* cover@γ, precision@γ, ..., kl, top1 */
            const char *what = g >= 0 ? (i % 2 ? "precision" : "cover") : i == 2 * EXIT_N_GAMMA ? "kl" : "top1";
            char from[EXIT_KEY_MAX];
            const char *v = tf_meta(&src.tf, exit_record_key(from, src.layer[k], what, g));
            if (!v) continue;
            meta[2 * n_meta] = exit_record_key(keys[k * N_STATS + i], layers[k], what, g);
            meta[2 * n_meta++ + 1] = v;
        }
    rc = rc ? rc : heads_save(&dst, heads_out, meta, n_meta);
    free(T);
    if (src.n) heads_free(&src);
    if (dst.n) heads_free(&dst);
    model_free(&a);
    model_free(&b);
    return rc;
}

/* ---- Medusa heads, widened along with their model ---- */

/* the held-out records and training facts travel along; what medusa_save writes
   itself (heads, dim, input_scale, rank_acc) does not */
static int carry_medusa_meta(const char *heads_in, const char *from_digest, const MedusaHeads *dst, const char *out) {
    TensorFile tf = {0};
    int n = 0;
    if (strcmp(heads_in, "-") && tf_open(&tf, heads_in)) return -1; /* stdin was read once: no facts */
    const char **meta = pd_alloc(sizeof(char *) * 2 * ((size_t)tf.n_meta + 1));
    if (!meta) {
        tf_close(&tf);
        return -1;
    }
    static const char *const own[] = {"paradec.medusa.heads", "paradec.medusa.dim", "paradec.medusa.input_scale",
                                      "paradec.medusa.rank_acc"};
    meta[2 * n] = "paradec.widened_from", meta[2 * n++ + 1] = from_digest;
    for (int i = 0; i < tf.n_meta; i++) {
        const char *key = tf.meta_key[i];
        int skip = strncmp(key, "paradec.medusa.", 15) != 0;
        for (int j = 0; j < 4 && !skip; j++) skip = !strcmp(key, own[j]);
        if (!skip) meta[2 * n] = key, meta[2 * n++ + 1] = tf.meta_val[i];
    }
    int rc = medusa_save(dst, out, meta, n);
    free(meta);
    tf_close(&tf);
    return rc;
}

int widen_medusa(const char *heads_in, const char *small_model, const char *wide_model, const char *heads_out) {
    Model a, b;
    MedusaHeads src = {0}, dst = {0};
    if (model_load(&a, small_model)) return -1;
    if (model_load(&b, wide_model)) {
        model_free(&a);
        return -1;
    }
    int rc = medusa_load(&src, heads_in, &a), own = 0;
    int d = a.c.dim, D = b.c.dim, V = a.c.vocab_size;
    if (!rc && (b.c.vocab_size != V || D < d))
        rc = pd_error("%s: dim %d, vocabulary %d: not a widened copy of %s (dim %d, vocabulary %d)", wide_model, D,
                      b.c.vocab_size, small_model, d, V);
    for (int k = 0; !rc && k < src.n; k++) own |= src.lm[k] != NULL;
    rc = rc ? rc : medusa_init(&dst, &b, src.n, own);
    /* the wide normed state is the real one / s and the wide output embedding the real
       one × s: with input_scale × s the block sees the real state, and its output / s
       meets an embedding × s. W into the top-left corner, b into the first d entries,
       an own lm_head widened as the model's (real rows × s, zeros beyond d) */
    double s = sqrt((double)D / d);
    float *W = NULL, *bias = NULL, *lm = NULL;
    if (!rc) {
        dst.input_scale = (float)(s * src.input_scale);
        W = pd_alloc(pd_mul(pd_mul((size_t)D, D), sizeof(float)));
        bias = pd_alloc(sizeof(float) * D);
        lm = own ? pd_alloc(pd_mul(pd_mul((size_t)V, D), sizeof(float))) : NULL;
        if (!W || !bias || (own && !lm)) rc = -1;
    }
    for (int k = 0; !rc && k < src.n; k++) {
        memset(W, 0, sizeof(float) * D * D);
        memset(bias, 0, sizeof(float) * D);
        for (int i = 0; i < d; i++) {
            memcpy(W + (size_t)i * D, src.W[k] + (size_t)i * d, sizeof(float) * d);
            bias[i] = src.b[k][i];
        }
        if (!src.lm[k]) dst.lm[k] = NULL, dst.lmp[k].p = NULL; /* this head reads the model's */
        else {
            memset(lm, 0, sizeof(float) * V * D);
            for (int v = 0; v < V; v++) copy_scaled(lm + (size_t)v * D, src.lm[k] + (size_t)v * d, d, s);
        }
        rc = medusa_set(&dst, k, W, bias, src.lm[k] ? lm : NULL);
    }
    if (!rc) {
        memcpy(dst.rank_acc, src.rank_acc, sizeof dst.rank_acc);
        dst.has_acc = src.has_acc;
        rc = carry_medusa_meta(heads_in, src.model_digest, &dst, heads_out);
    }
    free(W);
    free(bias);
    free(lm);
    if (src.n) medusa_free(&src);
    if (dst.n) medusa_free(&dst);
    model_free(&a);
    model_free(&b);
    return rc;
}
