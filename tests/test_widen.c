/* test_widen.c — stories260K widened to the test presets must give stories260K's own
   logits (the reference is the original model, run by the same forward pass) and the
   same 100 greedy tokens; a perturbed real weight must show (the comparison can fail),
   a perturbed unreachable weight must not; presets too small are refused; the streamed
   writer must write the very bytes ck_write_model writes. */
#include "check.h"
#include "import/llama2c.h"
#include "model/forward.h"
#include "train/widen.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N_GEN 100
#define PROMPT "Once upon a time"

static char tmpdir[64];

static const char *tmp(const char *name) {
    static char path[8][256];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, 256, "%s/%s", tmpdir, name);
    return p;
}

/* the original model: $MODEL (make test), else stories260K.bin converted here */
static int load_source(Checkpoint *ck, char *path, size_t n) {
    const char *env = getenv("MODEL");
    if (env && *env) {
        snprintf(path, n, "%s", env);
        return ck_read_model(ck, path);
    }
    char bin[1024], tok[1024];
    snprintf(path, n, "%s", tmp("src.safetensors"));
    if (pd_data_path("models/stories260K/stories260K.bin", bin, sizeof bin) ||
        pd_data_path("models/stories260K/tok512.bin", tok, sizeof tok) || llama2c_read(ck, bin))
        return -1;
    return ck_set_tokenizer(ck, tok) || ck_write_model(ck, path, DT_F32) ? -1 : 0;
}

/* ---- one model stepping through a token sequence ---- */

typedef struct {
    Model m;
    Runner *run;
    KVCache kv;
    int seq;
    float *hidden, *logits; /* [dim], [vocab] */
} Side;

static int runner_open(Side *r, const char *path) {
    memset(r, 0, sizeof *r);
    if (model_load(&r->m, path) || !(r->run = runner_new(&r->m))) return -1;
    if (kv_init(&r->kv, &r->m.c, 1, r->m.c.seq_len, 16) || (r->seq = kv_seq_new(&r->kv)) < 0) return -1;
    r->hidden = calloc(r->m.c.dim, sizeof(float));
    r->logits = calloc(r->m.c.vocab_size, sizeof(float));
    return r->hidden && r->logits ? 0 : -1;
}

static const float *runner_step(Side *r, int32_t token, int32_t pos) {
    Batch b = {1, &token, &r->seq, &pos, NULL, NULL};
    if (forward_layers(r->run, &r->kv, &b, 0, r->m.c.n_layers, r->hidden) ||
        final_logits(r->run, r->hidden, 1, r->logits))
        return NULL;
    return r->logits;
}

static void runner_close(Side *r) {
    free(r->hidden);
    free(r->logits);
    kv_free(&r->kv);
    runner_free(r->run);
    model_free(&r->m);
}

typedef struct {
    float max_diff;  /* over every position's logits */
    int same_tokens; /* the greedy continuations agree */
    int ok;          /* both models ran */
} Compare;

/* both models fed the original's greedy sequence; each step's argmax and logits compared */
static Compare compare(const char *orig, const char *wide) {
    Compare c = {0, 1, 0};
    Side a, b;
    int32_t *ids = NULL;
    int n_prompt = 0;
    if (runner_open(&a, orig) || runner_open(&b, wide) ||
        tok_encode(a.m.tok, PROMPT, strlen(PROMPT), 1, &ids, &n_prompt)) {
        CHECK(0, "%s", pd_errmsg());
        return c;
    }
    int32_t next = 0;
    for (int pos = 0; pos < n_prompt + N_GEN - 1; pos++) {
        int32_t token = pos < n_prompt ? ids[pos] : next;
        const float *la = runner_step(&a, token, pos), *lb = runner_step(&b, token, pos);
        if (!la || !lb) {
            CHECK(0, "%s", pd_errmsg());
            break;
        }
        for (int v = 0; v < a.m.c.vocab_size; v++) c.max_diff = fmaxf(c.max_diff, fabsf(la[v] - lb[v]));
        next = k_argmax(la, a.m.c.vocab_size);
        if (pos >= n_prompt - 1) c.same_tokens &= next == k_argmax(lb, b.m.c.vocab_size);
        c.ok = pos == n_prompt + N_GEN - 2;
    }
    free(ids);
    runner_close(&a);
    runner_close(&b);
    return c;
}

/* ---- the checks ---- */

static const float *tensor(const Checkpoint *ck, int layer, const char *what) {
    char name[128];
    if (layer >= 0) layer_tensor_name(name, sizeof name, layer, what);
    else snprintf(name, sizeof name, "%s", what);
    const CkTensor *t = ck_get(ck, name);
    return t ? t->data : NULL;
}

static int all_zero(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (x[i] != 0.0f) return 0;
    return 1;
}

/* what must be zero for extra dims, heads and layers to stay out of the stream */
static void check_structure(const Checkpoint *src, const Checkpoint *w, const char *preset) {
    const Config *a = &src->c, *b = &w->c;
    const float *e = tensor(w, -1, NAME_EMBED);
    int zero_extra = 1;
    for (int v = 0; e && v < b->vocab_size; v++)
        zero_extra &= all_zero(e + (size_t)v * b->dim + a->dim, b->dim - a->dim);
    CHECK(e && zero_extra, "%s: embedding's extra dims are not zero", preset);
    int identities = 0;
    for (int l = 0; l < b->n_layers; l++) {
        const float *o = tensor(w, l, "self_attn.o_proj.weight"), *d = tensor(w, l, "mlp.down_proj.weight");
        int o_zero = o && all_zero(o, (size_t)b->dim * b->n_heads * b->head_dim);
        int d_zero = d && all_zero(d, (size_t)b->dim * b->hidden_dim);
        CHECK(o && d && o_zero == d_zero, "%s: layer %d: o_proj and down_proj disagree on identity", preset, l);
        identities += o_zero;
        /* whatever the layer, rows past the real dims write nothing */
        CHECK(o && all_zero(o + (size_t)a->dim * b->n_heads * b->head_dim,
                            (size_t)(b->dim - a->dim) * b->n_heads * b->head_dim),
              "%s: layer %d: o_proj writes extra dims", preset, l);
    }
    CHECK(identities == b->n_layers - a->n_layers, "%s: %d identity layers, expected %d", preset, identities,
          b->n_layers - a->n_layers);
}

static int same_file(const char *p, const char *q) {
    char *a, *b;
    size_t na, nb;
    if (pd_read_file(p, &a, &na)) return 0;
    if (pd_read_file(q, &b, &nb)) return free(a), 0;
    int same = na == nb && !memcmp(a, b, na);
    free(a);
    free(b);
    return same;
}

/* widen to a preset; the f32 model file, checked against the original */
static void check_preset(const Checkpoint *src, const char *orig, const char *preset, const char *name,
                         Checkpoint *out) {
    const WidenPreset *p = widen_preset(preset);
    Config dst = widen_shape(&src->c, p);
    char file[64], streamed[64];
    snprintf(file, sizeof file, "%s.safetensors", name);
    snprintf(streamed, sizeof streamed, "%s-streamed.safetensors", name);
    if (widen_checkpoint(src, &dst, 1, out, NULL) || ck_write_model(out, tmp(file), DT_F32)) {
        CHECK(0, "%s: %s", name, pd_errmsg());
        return;
    }
    CHECK(out->c.dim == p->dim && out->c.n_kv_heads == p->n_kv_heads && out->c.n_layers == p->n_layers,
          "%s: wrong shape", name);
    check_structure(src, out, name);
    Compare c = compare(orig, tmp(file));
    CHECK(c.ok && c.same_tokens, "%s: greedy tokens differ from the original's", name);
    CHECK(c.ok && c.max_diff < 1e-3f, "%s: logits differ by %g", name, c.max_diff);
    printf("%s: %d greedy tokens %s, max |logit diff| %.3g\n", name, N_GEN, c.same_tokens ? "equal" : "DIFFER",
           c.max_diff);
    for (int dt = 0; dt < 2; dt++) { /* streamed writer = ck_write_model, byte for byte */
        DType t = dt ? DT_BF16 : DT_F32;
        int ok = !widen_write_model(src, &dst, 1, tmp(streamed), t, NULL) && !ck_write_model(out, tmp(file), t) &&
                 same_file(tmp(file), tmp(streamed));
        CHECK(ok, "%s: streamed %s file differs from ck_write_model's (%s)", name, dt ? "bf16" : "f32", pd_errmsg());
    }
}

/* a big change to one real weight must show; to weights that cannot reach the
   residual stream (an extra unit's gate/up rows, an extra head's q rows) must not */
static void check_controls(Checkpoint *w, const char *orig) {
    const Config *b = &w->c;
    int unit = b->hidden_dim - 1, extra_head = b->n_heads - 1; /* unused in the tiny mapping */
    float *gate = (float *)tensor(w, 0, "mlp.gate_proj.weight"), *up = (float *)tensor(w, 0, "mlp.up_proj.weight");
    float *q = (float *)tensor(w, 0, "self_attn.q_proj.weight");
    for (int i = 0; i < b->dim; i++) {
        gate[(size_t)unit * b->dim + i] = up[(size_t)unit * b->dim + i] = 1.0f;
        q[((size_t)extra_head * b->head_dim) * b->dim + i] = 50.0f;
    }
    Compare c =
        ck_write_model(w, tmp("extra.safetensors"), DT_F32) ? (Compare){0} : compare(orig, tmp("extra.safetensors"));
    CHECK(c.ok && c.same_tokens && c.max_diff < 1e-3f, "extra weights reach the output (diff %g)", c.max_diff);
    float *down = (float *)tensor(w, 0, "mlp.down_proj.weight");
    down[0] += 5.0f; /* real output dim 0, real unit 0 of real layer 0 */
    c = ck_write_model(w, tmp("perturbed.safetensors"), DT_F32) ? (Compare){0}
                                                                : compare(orig, tmp("perturbed.safetensors"));
    CHECK(c.ok && c.max_diff > 1e-2f, "a perturbed real weight went unnoticed (diff %g)", c.max_diff);
    printf("controls: extra weights changed nothing; a real one changed the logits by %.3g\n", c.max_diff);
}

static void check_refused(const Checkpoint *src) {
    const WidenPreset *tiny = widen_preset("tiny");
    CHECK(!widen_preset("huge") && strstr(pd_errmsg(), "huge"), "an unknown preset is accepted");
    struct {
        const char *why;
        int heads, kv, head_dim, dim;
    } bad[] = {{"heads", 4, 4, 16, 64},      /* fewer q heads than the model's 8 */
               {"kv heads", 16, 2, 16, 256}, /* 2 kv heads cannot hold 4 distinct ones */
               {"head_dim", 16, 16, 4, 64},
               {"multiple", 16, 16, 12, 192}, /* head_dim 12: RoPE pairs do not map */
               {"dim", 16, 16, 16, 32}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        Config dst = widen_shape(&src->c, tiny);
        dst.n_heads = bad[i].heads;
        dst.n_kv_heads = bad[i].kv;
        dst.head_dim = bad[i].head_dim;
        dst.dim = bad[i].dim;
        Checkpoint out;
        CHECK(widen_check(&src->c, &dst, "bad") && strstr(pd_errmsg(), bad[i].why), "'%s' not refused: %s", bad[i].why,
              pd_errmsg());
        CHECK(widen_checkpoint(src, &dst, 1, &out, NULL) && out.n == 0, "'%s': widened anyway", bad[i].why);
        CHECK(widen_write_model(src, &dst, 1, tmp("bad.safetensors"), DT_F32, NULL) &&
                  access(tmp("bad.safetensors"), F_OK),
              "'%s': a file was written", bad[i].why);
    }
}

static void cleanup(void) {
    const char *names[] = {"src.safetensors",
                           "tiny.safetensors",
                           "tiny-streamed.safetensors",
                           "tiny-gqa.safetensors",
                           "tiny-gqa-streamed.safetensors",
                           "extra.safetensors",
                           "perturbed.safetensors",
                           "untied.safetensors",
                           "untied-streamed.safetensors",
                           "bad.safetensors"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) unlink(tmp(names[i]));
    rmdir(tmpdir);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_widen_XXXXXX");
    if (!mkdtemp(tmpdir) || k_init(1)) return fprintf(stderr, "cannot set up\n"), 1;
    Checkpoint src, tiny, gqa, untied = {0};
    char orig[1024];
    if (load_source(&src, orig, sizeof orig)) {
        CHECK(0, "stories260K: %s", pd_errmsg());
        cleanup();
        return check_done("widen");
    }
    check_preset(&src, orig, "tiny", "tiny", &tiny);
    check_preset(&src, orig, "tiny-gqa", "tiny-gqa", &gqa);
    if (tiny.n) check_controls(&tiny, orig);
    check_refused(&src);
    /* untied: an lm_head equal to the embedding gives the original's logits */
    const CkTensor *e = ck_get(&src, NAME_EMBED);
    float *lm = ck_add(&src, NAME_LM_HEAD, e->shape[0], e->shape[1]);
    e = ck_get(&src, NAME_EMBED); /* ck_add may have moved the table */
    if (lm) memcpy(lm, e->data, sizeof(float) * e->shape[0] * e->shape[1]);
    src.c.tied = 0;
    if (lm) check_preset(&src, orig, "tiny-gqa", "untied", &untied);
    CHECK(lm && ck_get(&untied, NAME_LM_HEAD), "untied: no lm_head in the wide model");
    ck_free(&src);
    ck_free(&tiny);
    ck_free(&gqa);
    ck_free(&untied);
    cleanup();
    return check_done("widen");
}
