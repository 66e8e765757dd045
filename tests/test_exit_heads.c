/* test_exit_heads — the exit-heads module on stories260K: identity heads at the last
   layer give the model's own logits, head_logits against a double-precision reference
   (E · T · norm(h), written out here), batch invariance, a save/load round trip, and
   every kind of wrong heads file refused with one line: another model's digest, a
   layer out of range, another dimension, not a heads file, bad metadata, missing or
   non-finite tensors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "fixture.h"
#include "heads/exit_heads.h"
#include "model/forward.h"

static Model M;
static Runner *R; /* M's forward workspace */
static char dir[64];
static uint64_t rng = 99;

static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0) * 2 - 1);
}

static const char *tmp(const char *name) {
    static char p[4][256];
    static int i;
    char *s = p[i++ % 4];
    snprintf(s, 256, "%s/%s", dir, name);
    return s;
}

/* the residual stream after `layers` layers for a few tokens */
static void hidden_after(int layers, const int32_t *tok, int n, float *h) {
    KVCache kv;
    int32_t pos[64];
    for (int i = 0; i < n; i++) pos[i] = i;
    kv_init(&kv, &M.c, 1, 64, 16);
    kv_seq_new(&kv);
    Batch b = {n, tok, NULL, pos, NULL, NULL};
    forward_layers(R, &kv, &b, 0, layers, h);
    kv_free(&kv);
}

static float E_at(int v, int i) {
    float row[4096];
    k_row_to_f32(row, M.lm_head.w, M.lm_head.t, v, M.c.dim);
    return row[i];
}

static void test_identity_is_the_model(void) {
    int D = M.c.dim, V = M.c.vocab_size, L = M.c.n_layers, n = 6;
    int32_t tok[6] = {1, 403, 407, 261, 378, 13};
    float *h = calloc((size_t)n * D, 4), *a = calloc((size_t)n * V, 4), *b = calloc((size_t)n * V, 4);
    hidden_after(L, tok, n, h);
    ExitHeads eh;
    int layers[2] = {1, L - 1};
    CHECK(heads_identity(&eh, &M, layers, 2, 1) == 0, "%s", pd_errmsg());
    CHECK(eh.n == 2 && eh.layer[1] == L - 1 && eh.dim == D && !strcmp(eh.model_digest, M.digest), "fields");
    CHECK(heads_find(&eh, L - 1) == 1 && heads_find(&eh, 2) == -1, "heads_find");
    /* E · I · norm(h_L) is the model's own final logits, to the bit */
    head_logits(&M, &eh, 1, h, n, a);
    final_logits(R, h, n, b);
    CHECK(!memcmp(a, b, sizeof(float) * n * V), "identity head at the last hidden state differs from final_logits");
    heads_free(&eh);
    free(h);
    free(a);
    free(b);
}

/* head_logits of a random T against E·T·x in double, x = norm(h) or h */
static void test_against_reference(int norm) {
    int D = M.c.dim, V = M.c.vocab_size, n = 5;
    int32_t tok[5] = {1, 403, 407, 261, 378};
    float *h = calloc((size_t)n * D, 4), *got = calloc((size_t)n * V, 4), *one = calloc(V, 4);
    float *T = calloc((size_t)D * D, 4);
    hidden_after(2, tok, n, h);
    for (int i = 0; i < D * D; i++) T[i] = (i % (D + 1) == 0) + 0.2f * frand();
    ExitHeads eh;
    int layers[1] = {2};
    heads_identity(&eh, &M, layers, 1, norm);
    heads_set_T(&eh, 0, T);
    CHECK(head_logits(&M, &eh, 0, h, n, got) == 0, "%s", pd_errmsg());
    double worst = 0, *x = calloc(D, 8), *z = calloc(D, 8);
    for (int t = 0; t < n; t++) {
        const float *ht = h + (size_t)t * D;
        double ss = 0;
        for (int i = 0; i < D; i++) ss += (double)ht[i] * ht[i];
        double r = 1 / sqrt(ss / D + M.c.norm_eps);
        for (int i = 0; i < D; i++) x[i] = norm ? M.final_norm[i] * ht[i] * r : ht[i];
        for (int i = 0; i < D; i++) {
            z[i] = 0;
            for (int j = 0; j < D; j++) z[i] += (double)T[(size_t)i * D + j] * x[j];
        }
        for (int v = 0; v < V; v++) {
            double y = 0;
            for (int i = 0; i < D; i++) y += (double)E_at(v, i) * z[i];
            double e = fabs(y - got[(size_t)t * V + v]) / (1 + fabs(y));
            worst = e > worst ? e : worst;
        }
    }
    CHECK(worst < 1e-4, "norm=%d: head logits off the double reference by %g", norm, worst);
    /* batch invariance: the third row alone is the third row of the batch */
    head_logits(&M, &eh, 0, h + 2 * D, 1, one);
    CHECK(!memcmp(one, got + 2 * V, sizeof(float) * V), "norm=%d: a row depends on the batch", norm);
    /* a batch too big for head_logits' stack buffer: the same rows */
    int big = 200;
    float *hb = malloc(sizeof(float) * big * D), *lb = malloc(sizeof(float) * big * V);
    for (int t = 0; t < big; t++) memcpy(hb + (size_t)t * D, h + (size_t)(t % n) * D, sizeof(float) * D);
    CHECK(head_logits(&M, &eh, 0, hb, big, lb) == 0, "%s", pd_errmsg());
    CHECK(!memcmp(lb + (size_t)(big - 3) * V, got + (size_t)((big - 3) % n) * V, sizeof(float) * V),
          "norm=%d: a row of a 200-row batch differs", norm);
    free(hb);
    free(lb);
    CHECK(head_logits(&M, &eh, 1, h, n, got) == -1, "head 1 of 1 accepted");
    heads_free(&eh);
    free(h);
    free(got);
    free(one);
    free(T);
    free(x);
    free(z);
}

static void test_round_trip(void) {
    int D = M.c.dim, layers[3] = {1, 3, 4};
    ExitHeads a, b;
    heads_identity(&a, &M, layers, 3, 0);
    float *T = calloc((size_t)D * D, 4);
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < D * D; i++) T[i] = frand();
        heads_set_T(&a, k, T);
    }
    const char *meta[] = {"paradec.exit.steps", "12"};
    CHECK(heads_save(&a, tmp("h.safetensors.zst"), meta, 1) == 0, "%s", pd_errmsg());
    CHECK(heads_load(&b, tmp("h.safetensors.zst"), &M) == 0, "%s", pd_errmsg());
    CHECK(b.n == 3 && b.layer[0] == 1 && b.layer[2] == 4 && b.norm == 0 && b.dim == D, "layers/norm/dim");
    int same = 1;
    for (int k = 0; k < 3 && b.n == 3; k++) same &= !memcmp(a.T[k], b.T[k], sizeof(float) * D * D);
    CHECK(same, "T changed on the way through the file");
    const char *steps = tf_meta(&b.tf, "paradec.exit.steps"), *kind = tf_meta(&b.tf, "paradec.kind");
    CHECK(steps && !strcmp(steps, "12") && kind && !strcmp(kind, "exit-heads"), "metadata");
    /* plain (uncompressed) files load too */
    CHECK(heads_save(&a, tmp("h.safetensors"), NULL, 0) == 0 &&
              (heads_free(&b), heads_load(&b, tmp("h.safetensors"), &M)) == 0,
          "%s", pd_errmsg());
    heads_free(&b);
    heads_free(&a);
    free(T);
}

/* a heads file with whatever metadata and tensors a case needs */
static void write_file(const char *path, const char *kind, const char *layers, const char *norm, const char *digest,
                       const char *tname, int d, float fill) {
    TfWriter *w = tfw_begin(path, 0);
    static float data[128 * 128];
    for (int i = 0; i < d * d; i++) data[i] = fill;
    int64_t shape[2] = {d, d};
    if (kind) tfw_meta(w, "paradec.kind", kind);
    if (layers) tfw_meta(w, "paradec.exit.layers", layers);
    if (norm) tfw_meta(w, "paradec.exit.norm", norm);
    if (digest) tfw_meta(w, "paradec.model_digest", digest);
    if (tname) tfw_add(w, tname, DT_F32, 2, shape, data);
    tfw_commit(w);
}

static void refused(const char *what, const char *path, const char *expect) {
    ExitHeads h;
    int rc = heads_load(&h, path, &M);
    const char *msg = pd_errmsg();
    CHECK(rc == -1, "%s: accepted", what);
    CHECK(rc == -1 && strstr(msg, expect) && !strchr(msg, '\n'), "%s: message '%s' lacks '%s'", what, msg, expect);
    if (rc == 0) heads_free(&h);
}

static void test_refusals(void) {
    int D = M.c.dim;
    const char *p = tmp("bad.safetensors"), *dg = M.digest;
    write_file(p, "exit-heads", "2", "1", "0123456789abcdef0123456789abcdef", "exit.2.T", D, 0.5f);
    refused("another model's digest", p, "0123456789abcdef0123456789abcdef"); /* names both digests */
    refused("another model's digest (ours named)", p, dg);
    write_file(p, "exit-heads", "5", "1", dg, "exit.5.T", D, 0.5f);
    refused("layer = n_layers", p, "layer 5");
    write_file(p, "exit-heads", "0", "1", dg, "exit.0.T", D, 0.5f);
    refused("layer 0", p, "layer 0");
    write_file(p, "exit-heads", "2", "1", dg, "exit.2.T", D / 2, 0.5f);
    refused("another dimension", p, "dim");
    write_file(p, "exit-heads", "2", "1", dg, "exit.3.T", D, 0.5f);
    refused("tensor missing", p, "exit.2.T");
    write_file(p, "exit-heads", "2", "1", dg, "exit.2.T", D, NAN);
    refused("NaN in T", p, "non-finite");
    write_file(p, "model", "2", "1", dg, "exit.2.T", D, 0.5f);
    refused("kind model", p, "not an exit-heads file");
    write_file(p, NULL, "2", "1", dg, "exit.2.T", D, 0.5f);
    refused("no kind", p, "not an exit-heads file");
    write_file(p, "exit-heads", NULL, "1", dg, "exit.2.T", D, 0.5f);
    refused("no layers", p, "paradec.exit.layers");
    write_file(p, "exit-heads", "2,x", "1", dg, "exit.2.T", D, 0.5f);
    refused("bad layer list", p, "paradec.exit.layers");
    write_file(p, "exit-heads", "2,2", "1", dg, "exit.2.T", D, 0.5f);
    refused("a layer twice", p, "twice");
    write_file(p, "exit-heads", "2", "yes", dg, "exit.2.T", D, 0.5f);
    refused("bad norm", p, "paradec.exit.norm");
    write_file(p, "exit-heads", "2", "1", NULL, "exit.2.T", D, 0.5f);
    refused("no digest", p, "paradec.model_digest");
    refused("no such file", tmp("nope.safetensors"), "nope.safetensors");
    refused("a model file", test_model_path(), "not an exit-heads file");
    /* a truncated good file */
    ExitHeads a;
    int layers[1] = {3};
    heads_identity(&a, &M, layers, 1, 1);
    heads_save(&a, tmp("good.safetensors"), NULL, 0);
    heads_free(&a);
    FILE *f = fopen(tmp("good.safetensors"), "rb"), *g = fopen(p, "wb");
    char buf[4096];
    size_t got = fread(buf, 1, sizeof buf, f);
    fwrite(buf, 1, got / 2, g);
    fclose(f);
    fclose(g);
    refused("truncated", p, "bad.safetensors");
    /* heads_identity's own checks */
    int bad[3][2] = {{0, 2}, {2, 5}, {3, 3}};
    for (int i = 0; i < 3; i++) {
        CHECK(heads_identity(&a, &M, bad[i], 2, 1) == -1, "layers %d,%d accepted", bad[i][0], bad[i][1]);
    }
    CHECK(heads_identity(&a, &M, layers, 0, 1) == -1, "no layers accepted");
}

/* test_exit_heads FILE...: heads_load each file against $MODEL (the tool test's check) */
static int check_files(int n, char **files) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        ExitHeads h;
        if (heads_load(&h, files[i], &M)) {
            fprintf(stderr, "%s\n", pd_errmsg());
            bad = 1;
            continue;
        }
        printf("%s: %d heads, norm %d\n", files[i], h.n, h.norm);
        heads_free(&h);
    }
    runner_free(R);
    model_free(&M);
    return bad;
}

int main(int argc, char **argv) {
    if (test_model_load(&M) || !(R = runner_new(&M))) return check_done("exit_heads");
    k_init(1);
    if (argc > 1) return check_files(argc - 1, argv + 1);
    snprintf(dir, sizeof dir, "/tmp/test_exit_heads.XXXXXX");
    if (!mkdtemp(dir)) return 1;
    test_identity_is_the_model();
    test_against_reference(1);
    test_against_reference(0);
    test_round_trip();
    test_refusals();
    const char *names[] = {"h.safetensors.zst", "h.safetensors", "bad.safetensors", "good.safetensors"};
    for (int i = 0; i < 4; i++) unlink(tmp(names[i]));
    rmdir(dir);
    runner_free(R);
    model_free(&M);
    return check_done("exit_heads");
}
