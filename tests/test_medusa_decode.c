/* test_medusa_decode — Medusa decoding is lossless (issue 5, point 3): greedy output
   token-identical to standard on 200 TinyStories prompts with the default tree (size
   controller on, and the whole tree every round), fixed trees of every shape, an
   oracle that ranks the right token first (long accepted paths), at the prompt's and
   the context's edges; heads: zero (every head repeats the model's next token: nearly
   every draft rejected), random, and trained ones when TEST_MEDUSA (default
   build/test-medusa.safetensors.zst) exists. Sampling at temperature 1 keeps the
   model's distribution (chi-square, as test_methods). Malformed trees are refused. */
#include "methods.h"

/* heads that guess: random W and b (zero heads all repeat the model's own next token) */
static int random_medusa(MedusaHeads *h, int K, uint64_t seed) {
    int d = M.c.dim;
    if (medusa_init(h, &M, K, 0)) return -1;
    float *W = malloc(sizeof(float) * d * d), *b = malloc(sizeof(float) * d);
    for (int k = 0; k < K; k++) {
        for (int i = 0; i < d * d; i++)
            W[i] = (float)((int)(seed_of(seed + 7919 * k + i) % 2001) - 1000) / (1000.0f * d);
        for (int i = 0; i < d; i++) b[i] = (float)((int)(seed_of(seed + 104729 * k + i) % 2001) - 1000) / 1000.0f;
        medusa_set(h, k, W, b, NULL);
    }
    free(W);
    free(b);
    return 0;
}

static const char *const TREES[] = {
    NULL, /* built from the heads' accuracies */
    "[[0]]",
    "[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]]",
    "[[0], [1], [2], [3], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 0, 0, 0]]",
};

static void parity_medusa(const MedusaHeads *h, const char *name, int n_small) {
    char what[128];
    TestOptions adaptive = {.medusa = h};
    snprintf(what, sizeof what, "%s default tree, size controller", name);
    parity("medusa", &adaptive, n_prompts, what);
    for (int t = 0; t < (int)(sizeof TREES / sizeof TREES[0]); t++) {
        TestOptions o = {.medusa = h, .tree = TREES[t], .fixed_tree = 1};
        snprintf(what, sizeof what, "%s tree %d fixed", name, t);
        parity("medusa", &o, t ? n_small : n_prompts, what);
    }
    for (int r = 0; r < 2; r++) {
        TestOptions o = {.medusa = h, .fixed_tree = 1, .oracle_rate = r ? 1.0f : 0.8f};
        snprintf(what, sizeof what, "%s default tree, oracle %.1f", name, o.oracle_rate);
        parity("medusa", &o, n_small, what);
    }
    TestOptions e = {.medusa = h, .fixed_tree = 1};
    parity_edges("medusa", &e);
}

static void sampling_medusa(const MedusaHeads *h, const char *name) {
    TestOptions a = {.medusa = h, .fixed_tree = 1}, b = {.medusa = h, .tree = TREES[3], .fixed_tree = 1},
                c = {.medusa = h, .fixed_tree = 1, .oracle_rate = 0.8f, .oracle = SGREEDY};
    char what[128];
    snprintf(what, sizeof what, "%s, default tree", name);
    chi2_method("medusa", &a, what);
    snprintf(what, sizeof what, "%s, 11-node tree", name);
    chi2_method("medusa", &b, what);
    snprintf(what, sizeof what, "%s, oracle 0.8", name);
    chi2_method("medusa", &c, what);
}

static void bad_medusa(const MedusaHeads *h) {
    static const char *const bad[][2] = {
        {"[[0], [0", "JSON"},
        {"{}", "list"},
        {"[]", "paths"},
        {"[[0, 0]]", "parent"},
        {"[[0], [0]]", "twice"},
        {"[[99]]", "rank"},
        {"[[-1]]", "rank"},
        {"[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0]]", "ranks"},
        {"[[0], [\"a\"]]", "rank"},
        {"[0]", "ranks"},
    };
    int32_t out[8];
    TestOptions none = {0};
    CHECK(run("medusa", &none, PROMPT[0], PROMPT_N[0], 8, 0, 1, out, NULL) < 0 && strstr(pd_errmsg(), "heads"),
          "medusa without heads: %s", pd_errmsg());
    for (int i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++) {
        TestOptions o = {.medusa = h, .tree = bad[i][0]};
        int rc = run("medusa", &o, PROMPT[0], PROMPT_N[0], 8, 0, 1, out, NULL);
        CHECK(rc < 0 && strstr(pd_errmsg(), bad[i][1]), "medusa --tree '%s': %s", bad[i][0],
              rc < 0 ? pd_errmsg() : "accepted");
    }
    char big[4096] = "[[0]";
    for (int i = 1; i < MAX_TREE; i++) snprintf(big + strlen(big), sizeof big - strlen(big), ", [0, %d]", i % 32);
    strcat(big, "]");
    TestOptions o = {.medusa = h, .tree = big};
    CHECK(run("medusa", &o, PROMPT[0], PROMPT_N[0], 8, 0, 1, out, NULL) < 0, "an oversized tree accepted");
}

int main(void) {
    double t0 = pd_now();
    if (methods_setup()) return check_done("medusa_decode");
    int n_small = n_prompts / 4;
    MedusaHeads zero, rnd, trained;
    if (medusa_init(&zero, &M, 4, 0) || random_medusa(&rnd, 4, 77)) {
        CHECK(0, "medusa heads: %s", pd_errmsg());
        return check_done("medusa_decode");
    }
    const char *tpath = getenv("TEST_MEDUSA");
    if (!tpath || !*tpath) tpath = "build/test-medusa.safetensors.zst";
    FILE *f = fopen(tpath, "rb");
    int have_trained = f && !medusa_load(&trained, tpath, &M);
    if (have_trained) medusa_use_int8(&trained); /* as decode reads them */
    if (f) fclose(f);
    if (f && !have_trained) CHECK(0, "%s: %s", tpath, pd_errmsg());
    if (!f) printf("medusa: no %s: trained heads skipped\n", tpath);

    printf("greedy parity with standard (%d new tokens):\n", N_NEW);
    parity_medusa(&zero, "zero heads", n_small / 2);
    parity_medusa(&rnd, "random heads", n_small);
    if (have_trained) parity_medusa(&trained, "trained heads", n_small);
    bad_medusa(&rnd);
    printf("greedy parity: %.1f s\n", pd_now() - t0);

    if (!parity_only()) {
        double t1 = pd_now();
        CHECK(!sampling_setup(NULL), "standard: %s", pd_errmsg());
        sampling_medusa(&rnd, "random heads");
        if (have_trained) sampling_medusa(&trained, "trained heads");
        printf("sampling: %.1f s; total %.1f s\n", pd_now() - t1, pd_now() - t0);
    }
    medusa_free(&zero);
    medusa_free(&rnd);
    if (have_trained) medusa_free(&trained);
    methods_teardown();
    return check_done("medusa_decode");
}
