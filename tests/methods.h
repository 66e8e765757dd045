/* methods.h — what the lossless tests of every decoding method share: the model
   (stories260K), 200 prompts cut from TinyStories, standard's greedy continuations,
   greedy parity against them, and the chi-square test of the sampled distribution.
   A header of static functions: each test_*.c that includes it is one program. */
#ifndef PD_TEST_METHODS_H
#define PD_TEST_METHODS_H
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "decode/drafter.h"
#include "fixture.h"

/* every test uses some of what follows */
#pragma GCC diagnostic ignored "-Wunused-function"

#define N_PROMPTS 200
#define N_NEW 64
#define PROMPT_WORDS 8
#define N_SEEDS 6000 /* samples of each method, and of the biased samplers */
#define N_REF 16000  /* samples of standard */
#define P_MIN 0.001

/* make test's second run is the sanitizer build (PARADEC_SAN=1), whose forward pass is
   ~15× slower: there the checks run on n / div of their cases (the plain run has them
   all), so that the whole suite stays within CI's time */
static int san_share(int n, int div) {
    const char *s = getenv("PARADEC_SAN");
    return s && *s && strcmp(s, "0") ? (n + div - 1) / div : n;
}

/* PARADEC_PARITY_ONLY=1 (tests/test_quant_methods.sh, on quantized copies of the model):
   greedy parity alone, the sampling checks skipped and said so */
static int parity_only(void) {
    const char *s = getenv("PARADEC_PARITY_ONLY");
    if (!s || !*s || !strcmp(s, "0")) return 0;
    printf("SKIP %s: sampling: PARADEC_PARITY_ONLY is set (greedy parity only)\n", program_invocation_short_name);
    return 1;
}

static Model M;
static Runner *R; /* M's forward workspace */
static KVCache KV;
static int32_t *PROMPT[N_PROMPTS];
static int PROMPT_N[N_PROMPTS], n_prompts, n_loaded; /* the checks use n_prompts of n_loaded */
static int32_t REF[N_PROMPTS][N_NEW];                /* standard's greedy continuation */
static int REF_N[N_PROMPTS];

typedef struct {
    int64_t runs, tokens, drafted, rejected, target_passes, layer_passes, kv_bad;
} Stats;

/* seeds for the sampling runs: xorshift64* from small consecutive seeds gives
   correlated first draws (its state barely mixes in a few steps), which makes two runs
   over disjoint seed ranges differ by more than chance; splitmix64 spreads them */
static uint64_t seed_of(uint64_t i) {
    uint64_t z = i + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* every method's knobs in one struct, for the tests' tables only: run() hands the
   ones a method has to it through the registry's option parser (0 = not given) */
typedef struct {
    const ExitHeads *heads;
    const MedusaHeads *medusa;
    const EagleHead *eagle;
    Model *draft;
    float oracle_rate;
    const int32_t *oracle;
    int fixed_tree, shadows, graphs, fast_prefill;
    float gamma;
    int max_pending, streams, exit_layer, draft_min, draft_max, draft_fixed;
    const char *tree;
    int ngram_max, window, ngram, guess, adaptive, depth, width;
} TestOptions;

/* o's knobs that the method has, set by name as decode and bench set them; -1 + the
   parser's message */
static int test_options(const DecodeMethod *dm, const TestOptions *o, MethodShared *sh, void *opts) {
    *sh = (MethodShared){.heads = o->heads,
                         .medusa = o->medusa,
                         .eagle = o->eagle,
                         .draft = o->draft,
                         .oracle_rate = o->oracle_rate,
                         .oracle = o->oracle,
                         .fixed_tree = o->fixed_tree,
                         .shadows = o->shadows,
                         .graphs = o->graphs,
                         .fast_prefill = o->fast_prefill};
    char v[64];
    struct {
        const char *name;
        int set;
        const char *text;
    } k[] = {
        {"gamma", o->gamma != 0, (snprintf(v, sizeof v, "%.9g", o->gamma), v)},
        {"max-pending", o->max_pending != 0, NULL},
        {"streams", o->streams != 0, NULL},
        {"exit-layer", o->exit_layer != 0, NULL},
        {"draft-min", o->draft_min != 0, NULL},
        {"draft-max", o->draft_max != 0, NULL},
        {"draft-fixed", o->draft_fixed != 0, NULL},
        {"tree", o->tree != NULL, o->tree},
        {"ngram-max", o->ngram_max != 0, NULL},
        {"window", o->window != 0, NULL},
        {"ngram", o->ngram != 0, NULL},
        {"guess", o->guess != 0, NULL},
        {"adaptive", o->adaptive != 0, NULL},
        {"depth", o->depth != 0, NULL},
        {"width", o->width != 0, NULL},
    };
    const int ints[] = {0, o->max_pending, o->streams, o->exit_layer, o->draft_min, o->draft_max, o->draft_fixed,
                        0, o->ngram_max,   o->window,  o->ngram,      o->guess,     o->adaptive, o->depth, o->width};
    for (int i = 0; i < (int)(sizeof k / sizeof k[0]); i++) {
        if (!k[i].set || !decode_option_find(dm, k[i].name)) continue; /* a knob the method lacks is not its */
        char num[32];
        const char *text = k[i].text;
        if (!text) snprintf(num, sizeof num, "%d", ints[i]), text = num;
        if (decode_option_set(dm, opts, sh, k[i].name, text)) return -1;
    }
    return 0;
}

/* one generation through the library; returns tokens generated, -1 on error */
static int run(const char *method, const TestOptions *o, const int32_t *p, int n, int max_new, float temp,
               uint64_t seed, int32_t *out, Stats *st) {
    const DecodeMethod *dm = decode_method(method);
    Sampler s;
    DecodeCtx d;
    if (!dm || sampler_init(&s, M.c.vocab_size, temp, 0, 1, seed)) return -1;
    void *opts = decode_options_new(dm);
    if (!opts || decode_init(&d, &M, &KV, &s, max_new)) {
        free(opts);
        sampler_free(&s);
        return -1;
    }
    static const TestOptions none;
    if (test_options(dm, o ? o : &none, &d.opt, opts)) {
        decode_free(&d);
        free(opts);
        sampler_free(&s);
        return -1;
    }
    d.mopt = opts;
    int rc = decode_generate(dm, &d, p, n) ? -1 : d.n_out;
    if (rc >= 0 && out) memcpy(out, d.out, sizeof(int32_t) * d.n_out);
    if (st) {
        st->runs++;
        st->tokens += d.n_out;
        st->drafted += d.drafted;
        st->rejected += d.rejected;
        st->target_passes += d.target_passes - d.prefill_passes;
        st->layer_passes += d.layer_passes - d.prefill_passes * M.c.n_layers;
        /* a run that used its whole budget has run every token but the last, in every
           layer: nothing rejected may stay in the cache */
        if (rc == max_new && n + rc - 1 < M.c.seq_len)
            for (int l = 0; l < M.c.n_layers; l++) st->kv_bad += kv_len(&KV, d.seq, l) != n + rc - 1;
    }
    decode_free(&d);
    free(opts);
    sampler_free(&s);
    return rc;
}

/* ---------- prompts: the first words of 200 different stories ---------- */

static int load_prompts(void) {
    char path[4096], *text;
    size_t len;
    if (pd_data_path("datasets/tinystories/tinystories_val_sample.txt.gz", path, sizeof path) ||
        pd_read_file_gz(path, &text, &len))
        return -1;
    static char seen[N_PROMPTS][256];
    /* stories are paragraphs that start with "Once" (the rest continue a story) */
    for (char *at = text; at && at < text + len && n_prompts < N_PROMPTS;) {
        char *next = strstr(at, "\n\n");
        if (!strncmp(at, "Once", 4)) {
            char buf[256];
            int w = 0, i = 0;
            while (at + i < text + len && i < 255 && at[i] != '\n' && !(at[i] == ' ' && ++w == PROMPT_WORDS)) {
                buf[i] = at[i];
                i++;
            }
            buf[i] = 0;
            int dup = 0;
            for (int j = 0; j < n_prompts && !dup; j++) dup = !strcmp(seen[j], buf);
            if (!dup) {
                strcpy(seen[n_prompts], buf);
                if (tok_encode_flags(M.tok, buf, strlen(buf), TOK_ADD_BOS, &PROMPT[n_prompts], &PROMPT_N[n_prompts]))
                    return -1;
                n_prompts++;
            }
        }
        at = next ? next + 2 : NULL;
    }
    free(text);
    return 0;
}

/* ---------- greedy parity ---------- */

static void print_stats(const char *what, const Stats *s, int bad) {
    printf("  %-46s %3d/%d differ  drafted/token %.2f  accepted %5.1f%%  passes/token %.2f  layers/token %.2f\n", what,
           bad, (int)s->runs, (double)s->drafted / (s->tokens + 1e-9),
           100.0 * (s->drafted - s->rejected) / (s->drafted + 1e-9), (double)s->target_passes / (s->tokens + 1e-9),
           (double)s->layer_passes / (s->tokens + 1e-9));
}

static Stats last_parity; /* the last parity call's counts */

/* mismatching prompts among the first n, for one method and setting */
static int parity(const char *method, const TestOptions *o, int n, const char *what) {
    Stats st = {0};
    int bad = 0, errors = 0;
    int32_t out[N_NEW];
    TestOptions opt = *o;
    for (int i = 0; i < n; i++) {
        if (o->oracle_rate > 0) opt.oracle = REF[i]; /* standard's continuation */
        int got = run(method, &opt, PROMPT[i], PROMPT_N[i], N_NEW, 0, 1, out, &st);
        if (got < 0) {
            if (!errors++) fprintf(stderr, "%s %s: %s\n", method, what, pd_errmsg());
            bad++;
            continue;
        }
        bad += got != REF_N[i] || memcmp(out, REF[i], sizeof(int32_t) * got);
    }
    print_stats(what, &st, bad);
    last_parity = st;
    CHECK(bad == 0, "%s %s: %d of %d prompts differ from standard", method, what, bad, n);
    CHECK(errors == 0, "%s %s: %d runs failed", method, what, errors);
    if (strcmp(method, "adadecode"))
        CHECK(st.kv_bad == 0, "%s %s: %lld layers kept the wrong number of positions", method, what,
              (long long)st.kv_bad);
    return bad;
}

static void parity_edges(const char *method, const TestOptions *o) {
    int32_t ref[N_NEW], out[N_NEW], bos = tok_bos(M.tok);
    int a = run("standard", NULL, &bos, 1, N_NEW, 0, 1, ref, NULL), b = run(method, o, &bos, 1, N_NEW, 0, 1, out, NULL);
    CHECK(a > 0 && a == b && !memcmp(ref, out, sizeof(int32_t) * a), "%s: BOS-only prompt differs", method);
    /* a prompt that leaves 20 positions: generation stops at the context's end */
    int n = M.c.seq_len - 20;
    int32_t *long_p = malloc(sizeof(int32_t) * n);
    long_p[0] = bos;
    for (int i = 1, j = 0, at = 1; i < n; i++, at++) { /* the stories' words one after another */
        if (at >= PROMPT_N[j]) j = (j + 1) % n_prompts, at = 1;
        long_p[i] = PROMPT[j][at];
    }
    a = run("standard", NULL, long_p, n, N_NEW, 0, 1, ref, NULL);
    b = run(method, o, long_p, n, N_NEW, 0, 1, out, NULL);
    CHECK(a > 0 && a <= 21 && a == b && !memcmp(ref, out, sizeof(int32_t) * a),
          "%s: at the context's end: %d vs %d tokens", method, a, b);
    free(long_p);
    for (int budget = 1; budget <= 5; budget++) {
        a = run("standard", NULL, PROMPT[3], PROMPT_N[3], budget, 0, 1, ref, NULL);
        b = run(method, o, PROMPT[3], PROMPT_N[3], budget, 0, 1, out, NULL);
        CHECK(a == budget && a == b && !memcmp(ref, out, sizeof(int32_t) * a), "%s: budget %d: %d vs %d tokens", method,
              budget, a, b);
    }
}

/* ---------- the chi-square test ---------- */

/* Q(a, x) = Γ(a, x) / Γ(a), the regularized upper incomplete gamma function: the
   series P(a, x) = e^-x x^a / Γ(a) · Σ_n x^n / (a (a+1) ... (a+n)) for x < a + 1, else
   the continued fraction Q = e^-x x^a / Γ(a) · 1/(x+1-a- 1·(1-a)/(x+3-a- 2·(2-a)/(x+5-a- ...)))
   evaluated by the modified Lentz method (Numerical Recipes in C, 2nd ed., §6.2,
   eqs. 6.2.5 and 6.2.7; DLMF 8.7.1 and 8.9.2). */
static double gamma_q(double a, double x) {
    if (x <= 0) return 1;
    double front = exp(-x + a * log(x) - lgamma(a));
    if (x < a + 1) {
        double ap = a, del = 1 / a, sum = del;
        for (int n = 0; n < 10000 && fabs(del) > fabs(sum) * 1e-15; n++) {
            ap += 1;
            del *= x / ap;
            sum += del;
        }
        return 1 - sum * front;
    }
    const double tiny = 1e-300;
    double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
    for (int i = 1; i < 10000; i++) {
        double an = -i * (i - a);
        b += 2;
        d = an * d + b;
        if (fabs(d) < tiny) d = tiny;
        c = b + an / c;
        if (fabs(c) < tiny) c = tiny;
        d = 1 / d;
        double del = d * c;
        h *= del;
        if (fabs(del - 1) < 1e-15) break;
    }
    return front * h;
}

/* p-value of a chi-square statistic with df degrees of freedom */
static double chi2_p(double chi2, int df) { return gamma_q(df / 2.0, chi2 / 2.0); }

static void test_chi2_p(void) {
    /* upper critical values of the chi-square distribution (NIST/SEMATECH e-Handbook of
       Statistical Methods, table 1.3.6.7.4) */
    static const struct {
        int df;
        double x, p;
    } T[] = {
        {1, 3.841, 0.05},    {1, 10.828, 0.001},   {5, 11.070, 0.05},     {10, 23.209, 0.01},
        {30, 59.703, 0.001}, {100, 124.342, 0.05}, {100, 149.449, 0.001}, {100, 82.358, 0.90},
    };
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
        double p = chi2_p(T[i].x, T[i].df);
        CHECK(fabs(p - T[i].p) < 2e-3 * T[i].p + 1e-5, "chi2 p(%g, df %d) = %g, table %g", T[i].x, T[i].df, p, T[i].p);
    }
    /* with 2 degrees of freedom the tail is exactly e^(-x/2) */
    for (double x = 0.5; x < 60; x *= 1.7)
        CHECK(fabs(chi2_p(x, 2) - exp(-x / 2)) < 1e-12 * exp(-x / 2) + 1e-300, "chi2 p(%g, df 2)", x);
}

/* homogeneity of two samples of counts over k categories; categories whose expected
   count is under 5 are pooled into one bin. Returns the p-value. */
static double homogeneity(const int *a, const int *b, int k, int *df_out) {
    double na = 0, nb = 0;
    for (int i = 0; i < k; i++) na += a[i], nb += b[i];
    double n = na + nb, chi2 = 0, pa = 0, pb = 0;
    int bins = 0;
    for (int i = 0; i < k; i++) {
        double col = a[i] + b[i], ea = col * na / n, eb = col * nb / n;
        if (ea < 5 || eb < 5) { /* pooled */
            pa += a[i], pb += b[i];
            continue;
        }
        chi2 += (a[i] - ea) * (a[i] - ea) / ea + (b[i] - eb) * (b[i] - eb) / eb;
        bins++;
    }
    if (pa + pb > 0) {
        double ea = (pa + pb) * na / n, eb = (pa + pb) * nb / n;
        chi2 += (pa - ea) * (pa - ea) / ea + (pb - eb) * (pb - eb) / eb;
        bins++;
    }
    *df_out = bins - 1;
    return bins > 1 ? chi2_p(chi2, bins - 1) : 1;
}

#define POS_A 2
#define POS_B 5
static int32_t SPROMPT[64], SGREEDY[POS_B + 1]; /* the sampling prompt, its greedy continuation */
static int SPROMPT_N;

/* histograms of the tokens at POS_A and POS_B over N_SEEDS seeds; slot vocab = the text
   ended before that position */
static int sample_hist(const char *method, const TestOptions *o, uint64_t seed0, int seeds, int *ha, int *hb,
                       Stats *st) {
    int V = M.c.vocab_size;
    memset(ha, 0, sizeof(int) * (V + 1));
    memset(hb, 0, sizeof(int) * (V + 1));
    int32_t out[POS_B + 1];
    for (int s = 0; s < seeds; s++) {
        int n = run(method, o, SPROMPT, SPROMPT_N, POS_B + 1, 1.0f, seed_of(seed0 + s), out, st);
        if (n < 0) return -1;
        ha[n > POS_A ? out[POS_A] : V]++;
        hb[n > POS_B ? out[POS_B] : V]++;
    }
    return 0;
}

static int *REF_A, *REF_B;
static int n_seeds = N_SEEDS, n_ref = N_REF; /* (fewer under the sanitizers: san_share) */

static void chi2_method(const char *method, const TestOptions *o, const char *what) {
    int V = M.c.vocab_size, *ha = malloc(sizeof(int) * (V + 1)), *hb = malloc(sizeof(int) * (V + 1)), dfa, dfb;
    Stats st = {0};
    if (sample_hist(method, o, 1000003, n_seeds, ha, hb, &st)) {
        CHECK(0, "%s %s: %s", method, what, pd_errmsg());
    } else {
        double pa = homogeneity(REF_A, ha, V + 1, &dfa), pb = homogeneity(REF_B, hb, V + 1, &dfb);
        printf("  %-34s %-30s p(token %d) = %.3f (df %d)  p(token %d) = %.3f (df %d)  accepted %.1f%% of %.2f "
               "drafts/token\n",
               method, what, POS_A, pa, dfa, POS_B, pb, dfb, 100.0 * (st.drafted - st.rejected) / (st.drafted + 1e-9),
               (double)st.drafted / (st.tokens + 1e-9));
        CHECK(pa > P_MIN, "%s %s: token %d's distribution differs from standard's (p = %g)", method, what, POS_A, pa);
        CHECK(pb > P_MIN, "%s %s: token %d's distribution differs from standard's (p = %g)", method, what, POS_B, pb);
    }
    free(ha);
    free(hb);
}

/* a token from probabilities p[V] */

/* ---------- set-up ---------- */

/* the model, the prompts and standard's greedy continuations; 0 when all is there */
static int methods_setup(void) {
    k_init(1);
    if (!test_data("every check (its 200 prompts are TinyStories openings)",
                   "datasets/tinystories/tinystories_val_sample.txt.gz"))
        return -1;
    if (model_load(&M, test_model_path()) || !(R = runner_new(&M)) || kv_init(&KV, &M.c, 2, 2 * M.c.seq_len, 16) ||
        load_prompts()) {
        fprintf(stderr, "%s\n", pd_errmsg());
        CHECK(0, "setup");
        return -1;
    }
    CHECK(n_prompts == N_PROMPTS, "only %d distinct prompts", n_prompts);
    n_loaded = n_prompts;
    n_prompts = san_share(n_prompts, 10);
    for (int i = 0; i < n_prompts; i++) {
        REF_N[i] = run("standard", NULL, PROMPT[i], PROMPT_N[i], N_NEW, 0, 1, REF[i], NULL);
        CHECK(REF_N[i] > 0, "standard on prompt %d: %s", i, pd_errmsg());
    }
    return 0;
}

/* the sampling prompt (NULL = a story's opening), its greedy continuation and
   standard's histograms */
static int sampling_setup(const char *sp) {
    if (!sp) sp = "Once upon a time, there was a";
    int32_t *ids;
    if (tok_encode_flags(M.tok, sp, strlen(sp), TOK_ADD_BOS, &ids, &SPROMPT_N) || SPROMPT_N > 64) {
        CHECK(0, "sampling prompt: %s", pd_errmsg());
        return -1;
    }
    memcpy(SPROMPT, ids, sizeof(int32_t) * SPROMPT_N);
    free(ids);
    CHECK(run("standard", NULL, SPROMPT, SPROMPT_N, POS_B + 1, 0, 1, SGREEDY, NULL) == POS_B + 1, "greedy: %s",
          pd_errmsg());
    REF_A = malloc(sizeof(int) * (M.c.vocab_size + 1));
    REF_B = malloc(sizeof(int) * (M.c.vocab_size + 1));
    n_seeds = san_share(N_SEEDS, 10), n_ref = san_share(N_REF, 10);
    printf("sampling at temperature 1 after \"%s\": %d seeds of each method against %d of standard "
           "(chi-square homogeneity):\n",
           sp, n_seeds, n_ref);
    return sample_hist("standard", NULL, 1, n_ref, REF_A, REF_B, NULL);
}

static void methods_teardown(void) {
    free(REF_A);
    free(REF_B);
    for (int i = 0; i < n_loaded; i++) free(PROMPT[i]);
    kv_free(&KV);
    runner_free(R);
    model_free(&M);
}

#endif
