/* test_eagle_decode — EAGLE decoding is lossless (issue 25, point 2): greedy output
   token-identical to standard on 200 TinyStories prompts with the size controller and
   with whole trees of several depths and widths, at the prompt's and the context's
   edges; heads: the untrained start (the model's last layer on its own features, the
   whole vocabulary), one over a 64-token draft vocabulary, and the trained one when
   TEST_EAGLE (default build/test-eagle.safetensors.zst) exists, which must also draft
   well (tokens per target pass). Sampling at temperature 1 keeps the model's
   distribution (chi-square, as test_methods). Heads of another model, or missing, are
   refused. */
#include <unistd.h>

#include "methods.h"

static char tmp_dir[] = "/tmp/pd_eagle_XXXXXX";

/* an untrained head over the K most frequent tokens of the prompts, saved (as dt) and loaded */
static int fresh_head(EagleHead *h, int K, DType dt, const char *name) {
    int64_t n = 0;
    for (int i = 0; i < n_prompts; i++) n += PROMPT_N[i];
    int32_t *all = malloc(sizeof(int32_t) * n), *vocab = malloc(sizeof(int32_t) * K);
    n = 0;
    for (int i = 0; i < n_prompts; i++)
        for (int j = 0; j < PROMPT_N[i]; j++) all[n++] = PROMPT[i][j];
    EagleParams p;
    char path[256];
    snprintf(path, sizeof path, "%s/%s.safetensors", tmp_dir, name);
    int rc = eagle_vocab_from_counts(&M, all, n, K, vocab) || eagle_params_init(&p, &M, vocab, K);
    if (!rc) {
        p.dt = dt;
        rc = eagle_params_save(&p, path, NULL, 0);
        EagleParams back; /* read back: every weight as stored (bf16: rounded to its 8 bits of mantissa) */
        if (!rc && !(rc = eagle_params_load(&back, path, &M))) {
            double worst = 0;
            for (int i = 0; i < M.c.dim * M.c.hidden_dim; i++)
                worst = fmax(worst, fabs(back.w1[i] - p.w1[i]) / (fabs(p.w1[i]) + 1e-30));
            CHECK(back.dt == dt && (dt == DT_F32 ? worst == 0 : worst > 0 && worst <= 1.0 / 256),
                  "%s read back: dt %d, worst relative change %g", name, back.dt, worst);
            CHECK(!memcmp(back.fc, p.fc, sizeof(float) * 2 * M.c.dim * M.c.dim), "%s: W_fc stays f32", name);
            eagle_params_free(&back);
        }
        eagle_params_free(&p);
    }
    rc = rc || eagle_load(h, path, &M);
    free(all);
    free(vocab);
    return rc;
}

static void parity_eagle(const EagleHead *h, const char *name, int n_small) {
    char what[128];
    TestOptions adaptive = {.eagle = h};
    snprintf(what, sizeof what, "%s, size controller", name);
    parity("eagle", &adaptive, n_prompts, what);
    static const int shapes[][3] = {{6, 4, 32}, {1, 1, 1}, {3, 2, 8}, {8, 8, 127}, {16, 1, 16}};
    for (int s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++) {
        TestOptions o = {
            .eagle = h, .fixed_tree = 1, .depth = shapes[s][0], .width = shapes[s][1], .draft_max = shapes[s][2]};
        snprintf(what, sizeof what, "%s, depth %d width %d nodes %d", name, shapes[s][0], shapes[s][1], shapes[s][2]);
        parity("eagle", &o, s ? n_small : n_prompts, what);
    }
    TestOptions e = {.eagle = h, .fixed_tree = 1};
    parity_edges("eagle", &e);
}

static void refusals(void) {
    int32_t out[8];
    TestOptions none = {0};
    CHECK(run("eagle", &none, PROMPT[0], PROMPT_N[0], 8, 0, 1, out, NULL) < 0 && strstr(pd_errmsg(), "EAGLE"),
          "eagle without a head: %s", pd_errmsg());
    /* a head of another model (its digest) and a file of another kind */
    EagleParams p;
    int32_t vocab[4] = {1, 2, 3, 4};
    char path[256];
    snprintf(path, sizeof path, "%s/other.safetensors", tmp_dir);
    CHECK(!eagle_params_init(&p, &M, vocab, 4), "init: %s", pd_errmsg());
    snprintf(p.model_digest, sizeof p.model_digest, "0123456789abcdef");
    CHECK(!eagle_params_save(&p, path, NULL, 0), "save: %s", pd_errmsg());
    eagle_params_free(&p);
    EagleHead h;
    CHECK(eagle_load(&h, path, &M) < 0 && strstr(pd_errmsg(), "trained for model"), "another model's head: %s",
          pd_errmsg());
    CHECK(eagle_load(&h, test_model_path(), &M) < 0 && strstr(pd_errmsg(), "EAGLE"), "a model as a head: %s",
          pd_errmsg());
    /* a vocabulary the loader must check itself: an id past the model's, then one twice */
    for (int bad = 0; bad < 2; bad++) {
        CHECK(!eagle_params_init(&p, &M, vocab, 4), "init: %s", pd_errmsg());
        p.vocab[3] = bad ? p.vocab[0] : M.c.vocab_size;
        CHECK(!eagle_params_save(&p, path, NULL, 0), "save: %s", pd_errmsg());
        eagle_params_free(&p);
        CHECK(eagle_load(&h, path, &M) < 0 && strstr(pd_errmsg(), "eagle.vocab[3]"), "a bad vocabulary loaded: %s",
              pd_errmsg());
    }
    /* a file cut short */
    FILE *f = fopen(path, "r+b");
    CHECK(f && !ftruncate(fileno(f), 200), "truncate");
    if (f) fclose(f);
    CHECK(eagle_load(&h, path, &M) < 0, "a truncated head loaded");
    int32_t twice[2] = {5, 5};
    CHECK(eagle_params_init(&p, &M, twice, 2) < 0 && strstr(pd_errmsg(), "twice"), "a vocabulary with a repeat: %s",
          pd_errmsg());
    unlink(path);
}

/* Long generations under the size controller: an untrained head rests its drafter for
   dozens of rounds, so the backlog of plain rounds fills and the head forgets its cache
   (eagle.c, forget) again and again; the output stays standard's. */
static void parity_long(const EagleHead *h) {
    enum { LONG = 400 };
    static int32_t ref[LONG], out[LONG];
    TestOptions adaptive = {.eagle = h};
    int bad = 0, n = 8;
    for (int i = 0; i < n; i++) {
        int a = run("standard", NULL, PROMPT[i], PROMPT_N[i], LONG, 0, 1, ref, NULL);
        int b = run("eagle", &adaptive, PROMPT[i], PROMPT_N[i], LONG, 0, 1, out, NULL);
        bad += a < 0 || a != b || memcmp(ref, out, sizeof(int32_t) * (a > 0 ? a : 0));
    }
    CHECK(!bad, "%d of %d long generations (%d tokens) differ from standard's", bad, n, LONG);
}

int main(void) {
    double t0 = pd_now();
    if (methods_setup()) return check_done("eagle_decode");
    if (!mkdtemp(tmp_dir)) {
        CHECK(0, "mkdtemp");
        return check_done("eagle_decode");
    }
    int n_small = n_prompts / 4;
    EagleHead start, small, trained;
    if (fresh_head(&start, M.c.vocab_size, DT_F32, "start") || fresh_head(&small, 64, DT_BF16, "small")) {
        CHECK(0, "eagle heads: %s", pd_errmsg());
        return check_done("eagle_decode");
    }
    const char *tpath = getenv("TEST_EAGLE");
    if (!tpath || !*tpath) tpath = "build/test-eagle.safetensors.zst";
    FILE *f = fopen(tpath, "rb");
    int have_trained = f && !eagle_load(&trained, tpath, &M);
    if (f) fclose(f);
    if (f && !have_trained) CHECK(0, "%s: %s", tpath, pd_errmsg());
    if (!f) printf("SKIP eagle: no %s: the trained head's checks\n", tpath);

    printf("greedy parity with standard (%d new tokens):\n", N_NEW);
    parity_eagle(&start, "untrained head", n_small / 2);
    parity_eagle(&small, "64-token vocabulary, bf16", n_small / 2);
    parity_long(&start);
    if (have_trained) {
        parity_eagle(&trained, "trained head", n_small);
        TestOptions o = {.eagle = &trained, .fixed_tree = 1};
        parity("eagle", &o, n_small, "trained head, tokens per pass");
        double tau = (double)last_parity.tokens / (last_parity.target_passes + 1e-9);
        CHECK(tau > 3.0, "the trained head gives %.2f tokens per target pass (> 3 expected)", tau);
    }
    refusals();
    printf("greedy parity: %.1f s\n", pd_now() - t0);

    if (!parity_only()) {
        double t1 = pd_now();
        CHECK(!sampling_setup(NULL), "standard: %s", pd_errmsg());
        TestOptions a = {.eagle = &start, .fixed_tree = 1}, b = {.eagle = &small, .fixed_tree = 1, .depth = 3};
        chi2_method("eagle", &a, "untrained head");
        chi2_method("eagle", &b, "64-token vocabulary, depth 3");
        if (have_trained) {
            TestOptions c = {.eagle = &trained, .fixed_tree = 1};
            chi2_method("eagle", &c, "trained head");
        }
        printf("sampling: %.1f s; total %.1f s\n", pd_now() - t1, pd_now() - t0);
    }
    eagle_free(&start);
    eagle_free(&small);
    if (have_trained) eagle_free(&trained);
    char path[256];
    snprintf(path, sizeof path, "%s/start.safetensors", tmp_dir), unlink(path);
    snprintf(path, sizeof path, "%s/small.safetensors", tmp_dir), unlink(path);
    rmdir(tmp_dir);
    methods_teardown();
    return check_done("eagle_decode");
}
