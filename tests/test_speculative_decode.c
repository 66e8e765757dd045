/* test_speculative_decode — draft-model speculative decoding is lossless (issue 6,
   point 1), and the drafts it runs are the ones it should run.
   Drafts: stories260K's first 2 layers with an identity head (the logit lens), the
   model itself (every draft must be accepted, greedy and sampled: p = q), and trained
   heads folded at layers 2 and 3 when TEST_DRAFT_HEADS (default
   build/bench/heads-260k-norm.safetensors.zst, distill-heads --norm 1) exists.
   Checks: the folded draft's logits are head_logits' of the source model;
   draft_from_head refuses bad input; greedy output token-identical to standard on 200
   TinyStories prompts (defaults), and on a quarter at several draft lengths, fixed and
   adaptive, oracles 0.8 and 1.0, at the prompt's and the context's edges, with a draft
   whose context is shorter than the target's; the accept/reject counts of fixed-length
   rounds equal a simulation that reruns the draft from scratch every round (the draft's
   cache rolls back right); sampling at temperature 1 keeps the model's distribution
   (chi-square); bad options and a draft with another vocabulary are refused, the first
   differing token named. */
#include <unistd.h>

#include "heads/draftmodel.h"
#include "methods.h"

static char DIR_[64];

static void path_in(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", DIR_, name); }

/* heads made in memory and saved: identity at the given layers, with or without the
   norm, and a digest of another model when `foreign` */
static int save_heads(const char *name, const int *layers, int n, int norm, int foreign, char *path, size_t pn) {
    ExitHeads h;
    path_in(path, pn, name);
    if (heads_identity(&h, &M, layers, n, norm)) return -1;
    if (foreign) snprintf(h.model_digest, sizeof h.model_digest, "0123456789abcdef0123456789abcdef");
    int rc = heads_save(&h, path, NULL, 0);
    heads_free(&h);
    return rc;
}

/* ---------- the folded draft ---------- */

/* the draft's logits on the first prompts' tokens against head_logits(E·T·norm(h_L)) of
   the source model; returns the largest difference relative to the logits' scale */
static double fold_error(Model *draft, const ExitHeads *h, int k) {
    int L = h->layer[k], V = M.c.vocab_size, d = M.c.dim, n = PROMPT_N[1];
    KVCache kv;
    float *hs = malloc(sizeof(float) * n * d), *hd = malloc(sizeof(float) * n * d);
    float *ref = malloc(sizeof(float) * n * V), *got = malloc(sizeof(float) * n * V);
    double worst = 1e9;
    int32_t pos[256], seqs[256], seq = kv_seq_new(&KV);
    for (int i = 0; i < n; i++) pos[i] = i, seqs[i] = seq;
    Batch b = {n, PROMPT[1], seqs, pos, NULL, NULL};
    if (!kv_init(&kv, &draft->c, 1, draft->c.seq_len, 16) && !forward_layers(R, &KV, &b, 0, L, hs) &&
        !head_logits(&M, h, k, hs, n, ref)) {
        int32_t zero[256] = {0};
        Batch bd = {n, PROMPT[1], zero, pos, NULL, NULL};
        kv_seq_new(&kv);
        Runner *dr = runner_new(draft);
        if (dr && !forward_layers(dr, &kv, &bd, 0, draft->c.n_layers, hd) && !final_logits(dr, hd, n, got)) {
            double diff = 0, scale = 0;
            for (size_t i = 0; i < (size_t)n * V; i++) {
                diff = fmax(diff, fabs(ref[i] - got[i]));
                scale = fmax(scale, fabs(ref[i]));
            }
            worst = diff / scale;
        }
        runner_free(dr);
        kv_free(&kv);
    }
    kv_seq_free(&KV, seq);
    free(hs), free(hd), free(ref), free(got);
    return worst;
}

/* builds the draft at layer L from heads_path and checks it against the heads */
static int make_draft(Model *draft, const char *heads_path, int L, const char *name) {
    char out[128];
    path_in(out, sizeof out, name);
    ExitHeads h;
    if (draft_from_head(test_model_path(), heads_path, L, out, DT_F32) || model_load(draft, out)) {
        CHECK(0, "draft %s: %s", name, pd_errmsg());
        return -1;
    }
    CHECK(draft->c.n_layers == L && !draft->c.tied && strcmp(draft->digest, M.digest),
          "draft %s: %d layers, tied %d, digest %s", name, draft->c.n_layers, draft->c.tied, draft->digest);
    const char *of = tf_meta(&draft->tf, "paradec.draft_of"), *kind = tf_meta(&draft->tf, "paradec.kind");
    CHECK(of && !strcmp(of, M.digest) && kind && !strcmp(kind, "model"), "draft %s: draft_of %s, kind %s", name,
          of ? of : "-", kind ? kind : "-");
    if (!heads_load(&h, heads_path, &M)) {
        double e = fold_error(draft, &h, heads_find(&h, L));
        printf("  draft %-22s layer %d: logits vs the source's head_logits, max error %.2e of their scale\n", name, L,
               e);
        /* a block-type LM head multiplies x quantized to 8 bits; the folded head is floats */
        double tol = k_wtype_quant(M.lm_head.t) ? 0.02 : 1e-5;
        CHECK(e < tol, "draft %s: its logits differ from the head's by %g of their scale (at most %g)", name, e, tol);
        heads_free(&h);
    } else CHECK(0, "%s: %s", heads_path, pd_errmsg());
    return 0;
}

static void fold_refusals(void) {
    char id2[128], nonorm[128], foreign[128], out[128];
    int two = 2;
    path_in(out, sizeof out, "refused.safetensors");
    CHECK(!save_heads("id2.safetensors", &two, 1, 1, 0, id2, sizeof id2) &&
              !save_heads("nonorm.safetensors", &two, 1, 0, 0, nonorm, sizeof nonorm) &&
              !save_heads("foreign.safetensors", &two, 1, 1, 1, foreign, sizeof foreign),
          "heads: %s", pd_errmsg());
    static const struct {
        int layer;
        int heads;
        const char *says;
    } bad[] = {
        {0, 0, "outside 1..4"},
        {5, 0, "outside 1..4"},
        {-1, 0, "outside"},
        {3, 0, "no exit head at layer 3"},
        {2, 1, "without the final norm"},
        {2, 2, "heads trained for model"},
    };
    const char *hp[] = {id2, nonorm, foreign};
    for (int i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++) {
        int rc = draft_from_head(test_model_path(), hp[bad[i].heads], bad[i].layer, out, DT_F32);
        CHECK(rc < 0 && strstr(pd_errmsg(), bad[i].says), "draft at layer %d from %s: %s", bad[i].layer,
              hp[bad[i].heads], rc < 0 ? pd_errmsg() : "accepted");
        CHECK(access(out, F_OK) != 0, "a refused draft left %s", out);
    }
    unlink(id2), unlink(nonorm), unlink(foreign);
}

/* ---------- what the rounds must do ---------- */

/* the draft's greedy continuation of k tokens after ids[n], from a fresh cache */
static int draft_greedy(Model *draft, KVCache *kv, const int32_t *ids, int n, int k, int32_t *out) {
    Sampler s;
    DecodeCtx d;
    if (sampler_init(&s, draft->c.vocab_size, 0, 0, 1, 1)) return -1;
    if (decode_init(&d, draft, kv, &s, k)) return sampler_free(&s), -1;
    int rc = decode_generate(decode_method("standard"), &d, ids, n) ? -1 : d.n_out;
    if (rc > 0) memcpy(out, d.out, sizeof(int32_t) * rc);
    decode_free(&d);
    sampler_free(&s);
    return rc;
}

/* fixed rounds of k drafts, greedy, replayed: each round's chain is the draft's own
   greedy continuation of the accepted text (recomputed from scratch), kept as far as it
   agrees with standard's. The method's drafted/rejected counts must be these. */
static void rounds_replayed(Model *draft, int k, int n) {
    KVCache kv;
    if (kv_init(&kv, &draft->c, 1, draft->c.seq_len, 16)) {
        CHECK(0, "kv: %s", pd_errmsg());
        return;
    }
    int64_t want_drafted = 0, want_rejected = 0, got_drafted = 0, got_rejected = 0, runs = 0;
    for (int i = 0; i < n; i++) {
        if (REF_N[i] < N_NEW) continue; /* an end token inside a chain stops early: leave those out */
        int32_t ctx[512], chain[32], out[N_NEW];
        int np = PROMPT_N[i];
        memcpy(ctx, PROMPT[i], sizeof(int32_t) * np);
        memcpy(ctx + np, REF[i], sizeof(int32_t) * N_NEW);
        for (int at = 0; at < N_NEW - 1;) { /* REF[at] is the root */
            /* the loop drafts no deeper than the budget leaves: N_NEW - (at + 1) - 1 */
            int kk = k < N_NEW - at - 2 ? k : N_NEW - at - 2, a = 0,
                g = kk ? draft_greedy(draft, &kv, ctx, np + at + 1, kk, chain) : 0;
            if (g < 0) break;
            for (int j = g; j < kk; j++) chain[j] = -1; /* after an end token: standard has none here */
            while (a < kk && chain[a] == REF[i][at + 1 + a]) a++;
            want_drafted += kk;
            want_rejected += kk - a;
            at += a + 1;
        }
        TestOptions o = {.draft = draft, .draft_max = k, .draft_fixed = 1, .fixed_tree = 1};
        Stats st = {0};
        int got = run("speculative", &o, PROMPT[i], np, N_NEW, 0, 1, out, &st);
        CHECK(got == N_NEW && !memcmp(out, REF[i], sizeof out), "replay prompt %d: output differs", i);
        got_drafted += st.drafted;
        got_rejected += st.rejected;
        runs++;
    }
    printf("  rounds of %d drafts replayed on %lld prompts: drafted %lld (replay %lld), rejected %lld (replay %lld)\n",
           k, (long long)runs, (long long)got_drafted, (long long)want_drafted, (long long)got_rejected,
           (long long)want_rejected);
    CHECK(runs > 0 && got_drafted == want_drafted && got_rejected == want_rejected,
          "k %d: drafted %lld rejected %lld, the replay says %lld and %lld", k, (long long)got_drafted,
          (long long)got_rejected, (long long)want_drafted, (long long)want_rejected);
    kv_free(&kv);
}

/* a draft that is the model itself: every draft accepted, greedy or sampled (p = q),
   when every round drafts (fixed trees: the draft's cache must stay in step). With the
   size controller on, plain steps may make the draft forget its backlog (a shorter
   memory, so some drafts differ): there the output must still be standard's */
static void self_draft(void) {
    Stats st = {0};
    int32_t out[N_NEW];
    for (int c = 0; c < 3; c++) {
        TestOptions o = {.draft = &M};
        if (c == 1) o.fixed_tree = 1, o.draft_fixed = 1, o.draft_max = 5;
        if (c == 2) o.fixed_tree = 1;
        for (int i = 0; i < 20; i++) {
            memset(&st, 0, sizeof st);
            float temp = c == 2 ? 1.0f : 0;
            int got = run("speculative", &o, PROMPT[i], PROMPT_N[i], N_NEW, temp, seed_of(i), out, &st);
            CHECK(got > 0 && (c == 0 || (st.rejected == 0 && st.drafted > 0)),
                  "self-draft %d, prompt %d: %lld of %lld drafts rejected (%s)", c, i, (long long)st.rejected,
                  (long long)st.drafted, got < 0 ? pd_errmsg() : "ran");
            if (temp == 0)
                CHECK(got == REF_N[i] && !memcmp(out, REF[i], sizeof(int32_t) * got), "self-draft: prompt %d differs",
                      i);
        }
    }
    printf(
        "  the model as its own draft: no draft rejected (fixed 5, sampling); standard's output with the controller\n");
}

/* ---------- greedy parity ---------- */

static void parity_draft(Model *draft, const char *name, int n_small) {
    char what[128];
    TestOptions def = {.draft = draft};
    snprintf(what, sizeof what, "%s defaults", name);
    parity("speculative", &def, n_prompts, what);
    static const struct {
        int min, max, fixed;
    } K[] = {{0, 1, 1}, {0, 4, 1}, {0, 8, 1}, {0, 32, 1}, {2, 5, 0}, {1, 8, 0}, {6, 0, 0}};
    for (int i = 0; i < (int)(sizeof K / sizeof K[0]); i++) {
        TestOptions o = {
            .draft = draft, .draft_min = K[i].min, .draft_max = K[i].max, .draft_fixed = K[i].fixed, .fixed_tree = 1};
        snprintf(what, sizeof what, "%s k %d..%d%s", name, K[i].min, K[i].max, K[i].fixed ? " fixed" : "");
        parity("speculative", &o, n_small, what);
    }
    TestOptions c = {.draft = draft, .draft_max = 3};
    snprintf(what, sizeof what, "%s k ..3, size controller", name);
    parity("speculative", &c, n_small, what);
    for (int r = 0; r < 2; r++) {
        TestOptions o = {.draft = draft,
                         .draft_max = 4,
                         .draft_min = 4,
                         .draft_fixed = 1,
                         .fixed_tree = 1,
                         .oracle_rate = r ? 1.0f : 0.8f};
        snprintf(what, sizeof what, "%s k 4, oracle %.1f", name, o.oracle_rate);
        parity("speculative", &o, n_small, what);
    }
    TestOptions e = {.draft = draft, .fixed_tree = 1}, f = {.draft = draft};
    parity_edges("speculative", &e);
    parity_edges("speculative", &f);
}

/* a draft whose context ends before the target's: drafting stops there, the output not */
static void short_context(const char *path) {
    Model d;
    if (model_load(&d, path)) {
        CHECK(0, "%s: %s", path, pd_errmsg());
        return;
    }
    d.c.seq_len = 60; /* the rope tables are longer: a shorter window is safe */
    TestOptions o = {.draft = &d, .fixed_tree = 1};
    parity("speculative", &o, 20, "a draft with a 60-token context");
    parity_edges("speculative", &o);
    model_free(&d);
}

/* ---------- refusals ---------- */

/* tok512.bin with one piece changed (same length), or the last one dropped */
static Tokenizer *altered_vocab(int drop_last, int *changed) {
    char path[4096], *bytes;
    size_t n;
    Tokenizer *t = NULL;
    if (pd_data_path("models/stories260K/tok512.bin", path, sizeof path) || pd_read_file(path, &bytes, &n)) return NULL;
    size_t at = 4, last = 4;
    int id = 0;
    *changed = -1;
    while (at + 8 <= n) { /* entries: f32 score, i32 length, the bytes */
        int32_t len;
        memcpy(&len, bytes + at + 4, 4);
        if (len < 0 || at + 8 + (size_t)len > n) break;
        if (*changed < 0 && id >= 300 && len >= 3) { /* a normal piece well past the byte pieces */
            bytes[at + 8 + len - 1] ^= 0x20;
            *changed = id;
        }
        last = at;
        at += 8 + (size_t)len;
        id++;
    }
    if (drop_last) { /* undo the change, drop the last entry */
        *changed = -1;
        free(bytes);
        if (pd_read_file(path, &bytes, &n)) return NULL;
        n = last;
    }
    if (tok_load_llama2c(&t, bytes, n, "altered tok512")) t = NULL;
    free(bytes);
    return t;
}

static void refusals(const char *draft_path) {
    int32_t out[8];
    TestOptions none = {0};
    CHECK(run("speculative", &none, PROMPT[0], PROMPT_N[0], 8, 0, 1, out, NULL) < 0 && strstr(pd_errmsg(), "--draft"),
          "speculative without a draft: %s", pd_errmsg());
    Model d;
    if (model_load(&d, draft_path)) {
        CHECK(0, "%s", pd_errmsg());
        return;
    }
    static const struct {
        int min, max;
        const char *says;
    } bad[] = {
        {5, 3, "--draft-min 5 is above --draft-max 3"},
        {33, 0, "--draft-min 33"},
        {0, 40, "--draft-max 40"},
        {-1, 0, "--draft-min -1"},
        {0, -2, "--draft-max -2"},
        {9, 8, "above"},
    };
    for (int i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++) {
        TestOptions o = {.draft = &d, .draft_min = bad[i].min, .draft_max = bad[i].max};
        int rc = run("speculative", &o, PROMPT[0], PROMPT_N[0], 8, 0, 1, out, NULL);
        CHECK(rc < 0 && strstr(pd_errmsg(), bad[i].says), "draft-min %d draft-max %d: %s", bad[i].min, bad[i].max,
              rc < 0 ? pd_errmsg() : "accepted");
    }
    TestOptions big = {.draft = &d, .draft_min = 12}; /* draft-max follows a larger min */
    CHECK(run("speculative", &big, PROMPT[0], PROMPT_N[0], 8, 0, 1, out, NULL) == 8, "draft-min 12 alone: %s",
          pd_errmsg());
    TestOptions orc = {.draft = &d, .oracle_rate = 0.5f};
    CHECK(run("speculative", &orc, PROMPT[0], PROMPT_N[0], 8, 0, 1, out, NULL) < 0 && strstr(pd_errmsg(), "oracle"),
          "an oracle without its tokens: %s", pd_errmsg());
    for (int drop = 0; drop < 2; drop++) {
        int changed;
        Tokenizer *alt = altered_vocab(drop, &changed), *own = d.tok;
        if (!alt) {
            CHECK(0, "altered vocabulary: %s", pd_errmsg());
            continue;
        }
        char want[64], why[160];
        snprintf(want, sizeof want, drop ? "512 and 511 tokens" : "first at token %d ", changed);
        d.tok = alt;
        TestOptions o = {.draft = &d};
        int rc = run("speculative", &o, PROMPT[0], PROMPT_N[0], 8, 0, 1, out, NULL);
        CHECK(rc < 0 && strstr(pd_errmsg(), want), "a draft with another vocabulary (%s): %s", want,
              rc < 0 ? pd_errmsg() : "accepted");
        if (rc < 0) printf("  refused: %s\n", pd_errmsg());
        CHECK(!tok_same_vocab(M.tok, alt, why, sizeof why) && strstr(why, want), "tok_same_vocab: %s", why);
        CHECK(tok_same_vocab(M.tok, own, why, sizeof why) && tok_same_vocab(alt, alt, why, sizeof why), "same vocab");
        d.tok = own;
        tok_free(alt);
    }
    model_free(&d);
}

/* ---------- sampling ---------- */

static void sampling_draft(Model *draft, const char *name) {
    TestOptions a = {.draft = draft},
                b = {.draft = draft, .draft_max = 4, .draft_min = 4, .draft_fixed = 1, .fixed_tree = 1},
                c = {.draft = draft,
                     .draft_max = 4,
                     .draft_fixed = 1,
                     .fixed_tree = 1,
                     .oracle_rate = 0.8f,
                     .oracle = SGREEDY};
    char what[128];
    snprintf(what, sizeof what, "%s, adaptive", name);
    chi2_method("speculative", &a, what);
    snprintf(what, sizeof what, "%s, fixed 4", name);
    chi2_method("speculative", &b, what);
    snprintf(what, sizeof what, "%s, fixed 4, oracle 0.8", name);
    chi2_method("speculative", &c, what);
}

int main(void) {
    double t0 = pd_now();
    snprintf(DIR_, sizeof DIR_, "/tmp/pd-spec-XXXXXX");
    if (!mkdtemp(DIR_)) {
        CHECK(0, "mkdtemp");
        return check_done("speculative_decode");
    }
    if (methods_setup()) return check_done("speculative_decode");
    int n_small = n_prompts / 4, two = 2, have_trained = 0;
    char idh[128], tpath_id[128];
    Model id, tr2, tr3;
    printf("drafts folded from exit heads:\n");
    if (save_heads("identity.safetensors", &two, 1, 1, 0, idh, sizeof idh) ||
        make_draft(&id, idh, 2, "identity-L2.safetensors"))
        return check_done("speculative_decode");
    path_in(tpath_id, sizeof tpath_id, "identity-L2.safetensors");
    const char *hp = getenv("TEST_DRAFT_HEADS");
    if (!hp || !*hp) hp = "build/bench/heads-260k-norm.safetensors.zst";
    if (access(hp, R_OK) == 0) {
        have_trained = !make_draft(&tr2, hp, 2, "trained-L2.safetensors");
        if (have_trained && make_draft(&tr3, hp, 3, "trained-L3.safetensors")) model_free(&tr2), have_trained = 0;
    } else printf("speculative: no %s: trained drafts skipped\n", hp);
    fold_refusals();

    printf("greedy parity with standard (%d new tokens):\n", N_NEW);
    self_draft();
    parity_draft(&id, "identity L2", n_small);
    if (have_trained) {
        parity_draft(&tr2, "trained L2", n_small);
        TestOptions o = {.draft = &tr3};
        parity("speculative", &o, n_prompts, "trained L3 defaults");
    }
    rounds_replayed(&id, 1, 16);
    rounds_replayed(have_trained ? &tr3 : &id, 3, 16);
    short_context(tpath_id);
    refusals(tpath_id);
    printf("greedy: %.1f s\n", pd_now() - t0);

    if (!parity_only()) {
        double t1 = pd_now();
        CHECK(!sampling_setup(NULL), "standard: %s", pd_errmsg());
        sampling_draft(have_trained ? &tr2 : &id, have_trained ? "trained L2" : "identity L2");
        printf("sampling: %.1f s; total %.1f s\n", pd_now() - t1, pd_now() - t0);
    }

    model_free(&id);
    if (have_trained) model_free(&tr2), model_free(&tr3);
    char p[128];
    const char *files[] = {"identity.safetensors", "identity-L2.safetensors", "trained-L2.safetensors",
                           "trained-L3.safetensors"};
    for (int i = 0; i < 4; i++) path_in(p, sizeof p, files[i]), unlink(p);
    rmdir(DIR_);
    methods_teardown();
    return check_done("speculative_decode");
}
