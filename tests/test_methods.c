/* test_methods — every method beyond standard is lossless (DESIGN.md §5, issue 4).
   Greedy: token-identical to standard on 200 prompts cut from TinyStories, at every
   setting (AdaDecode's γ, self-speculative's exit layer, draft length and threshold),
   with identity heads (T = I: they exit or draft often and wrongly, a hard test of
   rollback), with an oracle that drafts the right tokens (long accepted runs, bonus
   tokens), and with trained heads when build/test-heads.safetensors.zst exists.
   Sampling (temperature 1): the token at generated positions 2 and 5 has standard's
   distribution — a chi-square test of homogeneity over 4000 seeds each, p > 0.001 —
   and the same test rejects two deliberately biased samplers (p < 0.001). AdaDecode's
   heads with a check vocabulary (K + 1 logits) take both tests too. */
#include "methods.h"

#include "decode/drafter.h"

/* every method the drafter loop steps lists its --fixed-tree: tests and benchmarks that
   compare sampled outputs fix the draft sizes with it (a timed controller's are not
   reproducible) */
static void drafters_list_fixed_tree(void) {
    int drafters = 0;
    for (int i = 0; i < decode_method_count(); i++) {
        const DecodeMethod *dm = decode_method_at(i);
        if (dm->step != drafter_step) continue;
        drafters++;
        int listed = 0;
        for (int j = 0; j < dm->n_options; j++) {
            const MethodOption *o = &dm->options[j];
            listed |= !strcmp(o->name, "fixed-tree") && o->shared && o->offset == offsetof(MethodShared, fixed_tree);
        }
        CHECK(listed, "%s: a drafter without --fixed-tree (DRAFTER_OPTIONS)", dm->name);
    }
    CHECK(drafters >= 6, "%d methods run on the drafter loop (6 expected at least)", drafters);
}

static void parity_adadecode(const ExitHeads *h, const char *heads_name, int n_small) {
    static const float gammas[] = {0.3f, 0.5f, 0.75f, 0.9f};
    char what[128];
    for (int g = 0; g < 4; g++) {
        TestOptions o = {.heads = h, .gamma = gammas[g]};
        snprintf(what, sizeof what, "%s γ=%.2f", heads_name, gammas[g]);
        parity("adadecode", &o, n_prompts, what); /* 200 prompts at every γ */
    }
    TestOptions o = {.heads = h, .gamma = 0.75f, .oracle_rate = 0.8f};
    snprintf(what, sizeof what, "%s oracle 0.8", heads_name);
    parity("adadecode", &o, n_small, what);
    /* two streams: the deferred layers as separate calls on a second runner, verified
       when the first stream reaches them (the GPU's schedule) */
    for (int g = 0; g < 4; g += 3) {
        TestOptions t = {.heads = h, .gamma = gammas[g], .streams = 2};
        snprintf(what, sizeof what, "%s γ=%.2f two streams", heads_name, gammas[g]);
        parity("adadecode", &t, g ? n_small : n_prompts, what);
    }
    TestOptions t = {.heads = h, .gamma = 0.75f, .oracle_rate = 0.8f, .streams = 2, .max_pending = 1};
    snprintf(what, sizeof what, "%s oracle 0.8 two streams, max-pending 1", heads_name);
    parity("adadecode", &t, n_small, what);
}

/* the two-stream schedule on a device whose memory the host cannot see (cuemu, as a
   GPU): a deferred position's hidden state comes back only at forward_wait. Greedy: n
   prompts as standard's; sampled: the CPU's tokens seed for seed */
static void streams_cuemu(const ExitHeads *h, int n) {
    enum { NS = 8, NT = 24 };
    KVCache cpu = KV;
    TestOptions t = {.heads = h, .gamma = 0.3f, .streams = 2};
    int32_t got[NS][NT], want[NT];
    int len[NS], same = 0, ok = !model_device("cuemu") && !kv_init(&KV, &M.c, 2, 2 * M.c.seq_len, 16);
    CHECK(ok, "cuemu: %s", pd_errmsg());
    if (ok) {
        parity("adadecode", &t, n, "identity γ=0.30 two streams on cuemu");
        for (int i = 0; i < NS; i++)
            len[i] = run("adadecode", &t, PROMPT[i], PROMPT_N[i], NT, 1.0f, seed_of(i), got[i], NULL);
        kv_free(&KV);
    }
    KV = cpu;
    model_device("cpu");
    for (int i = 0; i < NS && ok; i++) {
        int k = run("adadecode", &t, PROMPT[i], PROMPT_N[i], NT, 1.0f, seed_of(i), want, NULL);
        same += k > 0 && k == len[i] && !memcmp(want, got[i], sizeof(int32_t) * k);
    }
    CHECK(same == NS, "adadecode two streams, sampled: %d of %d seeds on cuemu give the CPU's tokens", same, NS);
}

static void parity_selfspec(const ExitHeads *h, const char *heads_name, int n_small) {
    char what[128];
    TestOptions o = {.heads = h};
    snprintf(what, sizeof what, "%s default (exit %d, K=4, conf 0.5)", heads_name, h->layer[h->n / 2]);
    parity("self-speculative", &o, n_prompts, what);
    /* every exit layer and draft length, drafting whatever the head's confidence */
    for (int k = 0; k < h->n; k++)
        for (int K = 1; K <= 6; K++) {
            TestOptions a = {.heads = h, .exit_layer = h->layer[k], .draft_max = K, .gamma = 1e-6f, .fixed_tree = 1};
            snprintf(what, sizeof what, "%s exit %d K=%d always draft", heads_name, h->layer[k], K);
            parity("self-speculative", &a, n_small, what);
        }
    static const float gammas[] = {0.3f, 0.5f, 0.75f, 0.9f};
    for (int g = 0; g < 4; g++) {
        TestOptions a = {.heads = h, .gamma = gammas[g], .draft_max = 6, .fixed_tree = 1};
        snprintf(what, sizeof what, "%s K=6 conf %.2f", heads_name, gammas[g]);
        parity("self-speculative", &a, n_small, what);
    }
    TestOptions a = {.heads = h, .draft_max = 6, .oracle_rate = 0.8f, .fixed_tree = 1};
    snprintf(what, sizeof what, "%s K=6 oracle 0.8", heads_name);
    parity("self-speculative", &a, n_small, what);
    a.oracle_rate = 1;
    snprintf(what, sizeof what, "%s K=6 oracle 1", heads_name);
    parity("self-speculative", &a, n_small, what);
}

/* prompts at the edges: BOS alone, the context's end, budgets of a few tokens */

static int draw(Sampler *s, const float *p, int V) {
    float coin = sampler_uniform(s), cdf = 0;
    for (int j = 0; j < V; j++)
        if (coin < (cdf += p[j])) return j;
    return V - 1;
}

/* deliberately wrong samplers, to show the test has power: every token comes from a
   draft of head k (the deepest: its drafts are closest to the model, the bias smallest)
   and either (mode 0) is always the draft, or (mode 1) goes through speculative
   sampling whose rejections resample from p instead of norm(max(0, p − q)) — a
   classic mistake. Mode 2, the control, resamples from the right residual and must
   pass. Returns the token at POS_A, or vocab when the text ended before. */
static int biased_token(const ExitHeads *h, int k, int mode, uint64_t seed) {
    int V = M.c.vocab_size, L = M.c.n_layers, le = h->layer[k], dim = M.c.dim, result = -1, seq = kv_seq_new(&KV);
    Sampler s;
    float *hid = malloc(sizeof(float) * SPROMPT_N * dim), *q = malloc(sizeof(float) * V),
          *p = malloc(sizeof(float) * V);
    int32_t pos[64], tok[64];
    for (int i = 0; i < SPROMPT_N; i++) pos[i] = i, tok[i] = SPROMPT[i];
    if (seq < 0 || sampler_init(&s, V, 1.0f, 0, 1, seed)) goto out;
    Batch b = {SPROMPT_N, tok, NULL, pos, NULL, NULL};
    int32_t seqs[64];
    for (int i = 0; i < SPROMPT_N; i++) seqs[i] = seq;
    b.seq = seqs;
    for (int step = 0;; step++) {
        float *last = hid + (size_t)(b.n - 1) * dim;
        if (forward_layers(R, &KV, &b, 0, le, hid) || head_logits(&M, h, k, last, 1, q) ||
            forward_layers(R, &KV, &b, le, L, hid) || final_logits(R, last, 1, p))
            goto out;
        sampler_probs(&s, q);
        sampler_probs(&s, p);
        int t = draw(&s, q, V);
        if (mode > 0 && !(sampler_uniform(&s) * q[t] < p[t])) {
            if (mode == 2) { /* the control: the right residual */
                float total = 0;
                for (int j = 0; j < V; j++) total += p[j] = p[j] > q[j] ? p[j] - q[j] : 0;
                for (int j = 0; j < V; j++) p[j] /= total;
            }
            t = draw(&s, p, V);
        }
        if (tok_is_eog(M.tok, t) || t == tok_bos(M.tok)) { /* as decode_is_end for this model */
            result = V;
            break;
        }
        if (step == POS_A) {
            result = t;
            break;
        }
        pos[0] = pos[b.n - 1] + 1, tok[0] = t, b.n = 1;
    }
out:
    if (seq >= 0) kv_seq_free(&KV, seq);
    sampler_free(&s);
    free(hid), free(q), free(p);
    return result;
}

static void chi2_power(const ExitHeads *h) {
    static const char *what[] = {"always the draft", "rejections resample from p", "control: right residual"};
    int V = M.c.vocab_size, *hist = malloc(sizeof(int) * (V + 1)), df;
    for (int mode = 0; mode < 3; mode++) {
        memset(hist, 0, sizeof(int) * (V + 1));
        int errors = 0;
        for (int s = 0; s < n_seeds; s++) {
            int t = biased_token(h, h->n - 1, mode, seed_of(2000003 + s));
            if (t < 0) errors++;
            else hist[t]++;
        }
        double p = homogeneity(REF_A, hist, V + 1, &df);
        printf("  test sampler (%s, head at layer %d): p(token %d) = %.3g (df %d)\n", what[mode], h->layer[h->n - 1],
               POS_A, p, df);
        CHECK(errors == 0, "test sampler: %s", pd_errmsg());
        if (mode < 2) CHECK(p < P_MIN, "the chi-square test misses a biased sampler (%s, p = %g)", what[mode], p);
        else CHECK(p > P_MIN, "the test's own speculative sampler fails (p = %g)", p);
    }
    free(hist);
}

static void test_sampling(const ExitHeads *h, const char *heads_name, int have_ada, int have_ss) {
    char what[128];
    if (have_ss) {
        TestOptions a = {.heads = h};
        snprintf(what, sizeof what, "%s default", heads_name);
        chi2_method("self-speculative", &a, what);
        for (int k = 0; k < h->n; k += h->n - 1) { /* the shallowest and the deepest head */
            TestOptions b = {.heads = h, .exit_layer = h->layer[k], .draft_max = 4, .gamma = 1e-6f, .fixed_tree = 1};
            snprintf(what, sizeof what, "%s exit %d always draft", heads_name, h->layer[k]);
            chi2_method("self-speculative", &b, what);
        }
    }
    if (have_ss && h->norm == 1 && !strcmp(heads_name, "identity")) {
        /* drafts from an oracle that knows the greedy continuation: point-mass drafts,
           accepted with probability p(draft), long accepted runs and bonus tokens */
        TestOptions c = {.heads = h, .draft_max = 6, .oracle_rate = 0.8f, .oracle = SGREEDY, .fixed_tree = 1};
        chi2_method("self-speculative", &c, "oracle 0.8");
    }
    if (have_ada)
        for (int g = 0; g < 3; g++) {
            TestOptions b = {.heads = h, .gamma = g == 1 ? 0.75f : 0.3f, .streams = g == 2 ? 2 : 0};
            snprintf(what, sizeof what, "%s γ=%.2f%s", heads_name, b.gamma, g == 2 ? " two streams" : "");
            chi2_method("adadecode", &b, what);
        }
}

/* ---------- bad options ---------- */

static void test_bad_options(const ExitHeads *h) {
    int32_t out[8];
    TestOptions none = {0}, layer = {.heads = h, .exit_layer = M.c.n_layers + 2},
                drafts = {.heads = h, .draft_max = -1}, gamma = {.heads = h, .gamma = 1.5f};
    CHECK(run("self-speculative", &none, PROMPT[0], PROMPT_N[0], 8, 0, 1, out, NULL) < 0 &&
              strstr(pd_errmsg(), "heads"),
          "self-speculative without heads: %s", pd_errmsg());
    CHECK(run("self-speculative", &layer, PROMPT[0], PROMPT_N[0], 8, 0, 1, out, NULL) < 0 &&
              strstr(pd_errmsg(), "exit layer"),
          "self-speculative at a layer without a head: %s", pd_errmsg());
    CHECK(run("self-speculative", &drafts, PROMPT[0], PROMPT_N[0], 8, 0, 1, out, NULL) < 0 &&
              strstr(pd_errmsg(), "draft-max"),
          "self-speculative with draft-max -1: %s", pd_errmsg());
    CHECK(run("self-speculative", &gamma, PROMPT[0], PROMPT_N[0], 8, 0, 1, out, NULL) < 0 &&
              strstr(pd_errmsg(), "gamma"),
          "self-speculative with gamma 1.5: %s", pd_errmsg());
}

int main(void) {
    double t0 = pd_now();
    if (methods_setup()) return check_done("methods");
    test_chi2_p();
    drafters_list_fixed_tree();

    int have_ada = 0, have_ss = 0;
    {
        const DecodeMethod *a = decode_method("adadecode"), *s = decode_method("self-speculative");
        have_ada = a != NULL, have_ss = s != NULL;
        if (!have_ada) printf("methods: adadecode is not registered: skipped\n");
        if (!have_ss) printf("methods: self-speculative is not registered: skipped\n");
    }

    ExitHeads ident, trained;
    static const int layers[] = {1, 2, 3, 4};
    int nl = M.c.n_layers - 1 < 4 ? M.c.n_layers - 1 : 4;
    if (heads_identity(&ident, &M, layers, nl, 1)) {
        CHECK(0, "identity heads: %s", pd_errmsg());
        return check_done("methods");
    }
    const char *tpath = getenv("TEST_HEADS"); /* trained heads, where distill-heads left them */
    if (!tpath || !*tpath) tpath = "build/test-heads.safetensors.zst";
    FILE *f = fopen(tpath, "rb");
    int have_trained = f != NULL;
    if (f) fclose(f);
    if (have_trained && heads_load(&trained, tpath, &M)) {
        CHECK(0, "%s: %s", tpath, pd_errmsg());
        have_trained = 0;
    }
    if (!have_trained) printf("methods: no %s: trained heads skipped\n", tpath);
    /* a check vocabulary, the lowest ids (tok512's most frequent merges): the check's K + 1
       logits decide, and when sampling q is theirs spread over the vocabulary. The trained
       heads' T where there are some (the rest logit as it starts), else identity heads */
    ExitHeads vocab;
    int32_t ids[384];
    int K = have_trained ? 384 : 128, have_vocab;
    for (int i = 0; i < K; i++) ids[i] = i;
    if (have_trained) {
        have_vocab = !heads_identity(&vocab, &M, trained.layer, trained.n, trained.norm);
        for (int k = 0; k < vocab.n && have_vocab; k++) heads_set_T(&vocab, k, trained.T[k]);
    } else have_vocab = !heads_identity(&vocab, &M, layers, nl, 1);
    have_vocab = have_vocab && !heads_set_vocab(&vocab, &M, ids, K);
    CHECK(have_vocab, "heads with a check vocabulary: %s", pd_errmsg());

    /* the many settings take a quarter of the prompts (an eighth with trained heads);
       the defaults take all 200 */
    int n_small = n_prompts / 4;
    printf("greedy parity with standard (%d new tokens):\n", N_NEW);
    if (have_ada) {
        parity_adadecode(&ident, "identity", n_small);
        if (have_trained) parity_adadecode(&trained, "trained", n_small / 2);
        TestOptions o = {.heads = &ident, .gamma = 0.3f};
        parity_edges("adadecode", &o);
        o.streams = 2;
        parity_edges("adadecode", &o);
        streams_cuemu(&ident, san_share(20, 4));
        for (int g = 0; g < 2 && have_vocab; g++) {
            TestOptions o = {.heads = &vocab, .gamma = g ? 0.6f : 0.3f};
            const char *what = g ? "check vocabulary γ=0.60" : "check vocabulary γ=0.30";
            parity("adadecode", &o, g ? n_small : n_prompts, what);
            CHECK(last_parity.drafted > 0, "check vocabulary γ=%.2f: no early token at all", o.gamma);
        }
    }
    if (have_ss) {
        parity_selfspec(&ident, "identity", n_small);
        if (have_trained) parity_selfspec(&trained, "trained", n_small / 2);
        TestOptions o = {.heads = &ident, .gamma = 1e-6f, .draft_max = 5, .exit_layer = 1};
        parity_edges("self-speculative", &o);
        test_bad_options(&ident);
    }
    printf("greedy parity: %.1f s\n", pd_now() - t0);

    if (!parity_only()) {
        /* sampling: standard's histograms once, every method against them */
        double t1 = pd_now();
        CHECK(!sampling_setup(NULL), "standard: %s", pd_errmsg());
        chi2_power(&ident);
        test_sampling(&ident, "identity", have_ada, have_ss);
        if (have_trained) test_sampling(&trained, "trained", have_ada, have_ss);
        TestOptions v = {.heads = &vocab, .gamma = 1e-6f};
        if (have_ada && have_vocab) chi2_method("adadecode", &v, "check vocabulary, always exit");
        printf("sampling: %.1f s; total %.1f s\n", pd_now() - t1, pd_now() - t0);
    }

    heads_free(&ident);
    if (have_vocab) heads_free(&vocab);
    if (have_trained) heads_free(&trained);
    methods_teardown();
    return check_done("methods");
}
