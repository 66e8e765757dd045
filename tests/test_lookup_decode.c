/* test_lookup_decode — prompt lookup and lookahead decoding are lossless (issue 6):
   greedy output token-identical to standard on 200 TinyStories prompts at the
   defaults (size controller on, with and without its shadows, and the whole proposal
   every round), and on a quarter
   of them for each setting (prompt lookup: n-gram sizes 1..4, draft lengths 1, 4, 16;
   lookahead: window, n-gram and guess sizes, --adaptive), with an oracle that drafts
   the standard continuation (long accepted paths), at the prompt's, the budget's and
   the context's edges. Both methods must actually draft and keep some drafts. Sampling
   at temperature 1, after a prompt that repeats itself (so that drafts come, and are
   kept and rejected), keeps the model's distribution (chi-square, as test_methods).
   Out-of-range options are refused with a message that names the option. */
#include "methods.h"

/* the share of drafted tokens kept over the first n prompts (greedy), -1 on error */
static double kept(const char *method, const TestOptions *o, int n, Stats *st) {
    for (int i = 0; i < n; i++)
        if (run(method, o, PROMPT[i], PROMPT_N[i], N_NEW, 0, 1, NULL, st) < 0) return -1;
    return st->drafted ? (double)(st->drafted - st->rejected) / st->drafted : 0;
}

/* oracle 0.8 and 1.0, with the size controller and with fixed trees */
static void oracles(const char *method, int n) {
    char what[128];
    for (int f = 0; f < 2; f++)
        for (int r = 0; r < 2; r++) {
            TestOptions o = {.fixed_tree = f, .oracle_rate = r ? 1.0f : 0.8f};
            snprintf(what, sizeof what, "oracle %.1f%s", o.oracle_rate, f ? ", fixed" : ", size controller");
            parity(method, &o, n, what);
        }
}

/* the method drafts, and keeps more than 0.1 drafts a token: parity is no accident of
   a drafter that never guesses */
static void drafts_kept(const char *method, const TestOptions *o, int n) {
    Stats st = {0};
    if (n < 50) n = 50; /* (the sanitizer run's n_small is 5: too few stories repeat themselves) */
    double k = kept(method, o, n, &st);
    printf("  %s drafts %.2f a token, keeps %.1f%% of them\n", method, (double)st.drafted / (st.tokens + 1e-9),
           100 * k);
    CHECK(k * st.drafted > 0.1 * st.tokens, "%s keeps few drafts (%lld for %lld tokens, %.1f%% kept)", method,
          (long long)st.drafted, (long long)st.tokens, 100 * k);
}

static void parity_lookup(int n_small) {
    char what[128];
    TestOptions ctl = {0}, fixed = {.fixed_tree = 1};
    parity("prompt-lookup", &ctl, n_prompts, "defaults, size controller");
    parity("prompt-lookup", &fixed, n_prompts, "defaults, fixed");
    for (int n = 1; n <= 4; n++)
        for (int k = 1; k <= 16; k *= 4) {
            TestOptions o = {.ngram_max = n, .draft_max = k, .fixed_tree = 1};
            snprintf(what, sizeof what, "ngram-max %d, draft-max %d, fixed", n, k);
            parity("prompt-lookup", &o, n_small, what);
        }
    TestOptions big = {.ngram_max = 8, .draft_max = 64}, shadow = {.shadows = 1},
                big_shadow = {.ngram_max = 8, .draft_max = 64, .shadows = 1};
    parity("prompt-lookup", &big, n_small, "ngram-max 8, draft-max 64, size controller");
    /* the controller's shadows run only where a step is slow (the 110m model): here on demand */
    parity("prompt-lookup", &shadow, n_prompts, "defaults, size controller with shadows");
    parity("prompt-lookup", &big_shadow, n_small, "ngram-max 8, draft-max 64, size controller with shadows");
    for (int r = 0; r < 2; r++) { /* long kept paths through the shadows' walk */
        TestOptions o = {.oracle_rate = r ? 1.0f : 0.8f, .shadows = 1};
        snprintf(what, sizeof what, "oracle %.1f, size controller with shadows", o.oracle_rate);
        parity("prompt-lookup", &o, n_small, what);
    }
    oracles("prompt-lookup", n_small);
    parity_edges("prompt-lookup", &fixed);
    TestOptions one = {.draft_max = 1, .ngram_max = 1, .fixed_tree = 1};
    parity_edges("prompt-lookup", &one);
    drafts_kept("prompt-lookup", &fixed, n_small);
}

static void parity_lookahead(int n_small) {
    char what[128];
    TestOptions ctl = {0}, fixed = {.fixed_tree = 1};
    parity("lookahead", &ctl, n_prompts, "defaults, size controller");
    parity("lookahead", &fixed, n_prompts, "defaults, fixed");
    static const int shapes[][3] = {/* window, ngram, guess */
                                    {1, 2, 1}, {1, 4, 0}, {2, 3, 1},  {4, 2, 8},  {5, 4, 0},
                                    {5, 4, 2}, {8, 5, 8}, {16, 8, 4}, {32, 5, 64}};
    for (int s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++)
        for (int a = 0; a < 2; a++) {
            TestOptions o = {
                .window = shapes[s][0], .ngram = shapes[s][1], .guess = shapes[s][2], .adaptive = a, .fixed_tree = 1};
            snprintf(what, sizeof what, "window %d, ngram %d, guess %d%s, fixed", o.window, o.ngram, o.guess,
                     a ? ", adaptive" : "");
            parity("lookahead", &o, s % 3 ? n_small / 2 : n_small, what);
        }
    TestOptions ad = {.adaptive = 1};
    parity("lookahead", &ad, n_small, "adaptive, size controller");
    oracles("lookahead", n_small);
    parity_edges("lookahead", &fixed);
    TestOptions wide = {.window = 16, .ngram = 8, .adaptive = 1, .fixed_tree = 1};
    parity_edges("lookahead", &wide);
    drafts_kept("lookahead", &fixed, n_small);
}

static void sampling(void) {
    TestOptions pl = {.fixed_tree = 1}, pl1 = {.ngram_max = 1, .draft_max = 1, .fixed_tree = 1},
                plo = {.fixed_tree = 1, .oracle_rate = 0.8f, .oracle = SGREEDY}, la = {.fixed_tree = 1},
                law = {.window = 8, .ngram = 5, .guess = 8, .adaptive = 1, .fixed_tree = 1},
                lao = {.fixed_tree = 1, .oracle_rate = 0.8f, .oracle = SGREEDY};
    chi2_method("prompt-lookup", &pl, "defaults");
    chi2_method("prompt-lookup", &pl1, "ngram-max 1, draft-max 1");
    chi2_method("prompt-lookup", &plo, "oracle 0.8");
    chi2_method("lookahead", &la, "defaults");
    chi2_method("lookahead", &law, "window 8, ngram 5, adaptive");
    chi2_method("lookahead", &lao, "oracle 0.8");
}

static void bad_options(void) {
    static const struct {
        const char *method;
        TestOptions o;
        const char *says;
    } bad[] = {
        {"prompt-lookup", {.ngram_max = 9}, "--ngram-max"},
        {"prompt-lookup", {.ngram_max = -1}, "--ngram-max"},
        {"prompt-lookup", {.draft_max = 65}, "--draft-max"},
        {"prompt-lookup", {.draft_max = -3}, "--draft-max"},
        {"prompt-lookup", {.oracle_rate = 0.5f}, "oracle"},
        {"prompt-lookup", {.oracle_rate = 1.5f, .oracle = REF[0]}, "oracle"},
        {"lookahead", {.window = 33}, "--window"},
        {"lookahead", {.window = -1}, "--window"},
        {"lookahead", {.ngram = 1}, "--ngram"},
        {"lookahead", {.ngram = 9}, "--ngram"},
        {"lookahead", {.guess = 65}, "--guess"},
        {"lookahead", {.guess = -2}, "--guess"},
        {"lookahead", {.window = 32, .ngram = 8}, "--window"},
        {"lookahead", {.oracle_rate = 0.5f}, "oracle"},
    };
    int32_t out[8];
    for (int i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++) {
        int rc = run(bad[i].method, &bad[i].o, PROMPT[0], PROMPT_N[0], 8, 0, 1, out, NULL);
        CHECK(rc < 0 && strstr(pd_errmsg(), bad[i].says), "%s bad option %d: %s", bad[i].method, i,
              rc < 0 ? pd_errmsg() : "accepted");
        if (rc < 0) printf("  refused: %s\n", pd_errmsg());
    }
}

int main(void) {
    double t0 = pd_now();
    if (methods_setup()) return check_done("lookup_decode");
    int n_small = n_prompts / 4;
    printf("greedy parity with standard (%d new tokens):\n", N_NEW);
    parity_lookup(n_small);
    parity_lookahead(n_small);
    bad_options();
    printf("greedy parity: %.1f s\n", pd_now() - t0);

    if (!parity_only()) {
        double t1 = pd_now();
        /* a prompt that repeats itself, so that both methods draft (and have drafts kept
           and rejected) within the few tokens the test samples */
        CHECK(!sampling_setup("Lily said, \"I am sorry.\" Tom said, \"I am"), "standard: %s", pd_errmsg());
        sampling();
        printf("sampling: %.1f s; total %.1f s\n", pd_now() - t1, pd_now() - t0);
    }
    methods_teardown();
    return check_done("lookup_decode");
}
