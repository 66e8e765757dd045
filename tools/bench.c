/* bench — a recipe's table: every method on every dataset's prompts, in one process.
   bin/bench --recipe FILE [--methods a,b] [--samples N] [--out DIR] [-t N]
             [--model M] [--exit-heads H] [--medusa H] [--eagle H] [--draft D] [--no-oracle]
   The model (and the heads or draft the methods need) is loaded once, from the recipe's
   out folder (out/NAME/, what `make recipe=NAME` builds) unless named. For each prompt
   every method runs once, greedy, in an order that turns with the prompt, so noise hits
   all alike; tok/s = generated tokens ÷ decode time summed over the prompts, the speedup
   is over standard in this same run, and every method's tokens are compared with
   standard's (greedy parity must be 100 %). With decoding.oracle rates, the methods
   that take an oracle run again with one that knows standard's continuation (headroom:
   what heads or a draft that good would give).
   stdout: table.md's text. In DIR (default out/NAME): table.md, table.csv, speed.png
   and oracle.png (gnuplot; left out with a note when it is missing) — written only
   when parity holds; a mismatch is reported loudly and nothing is written. */
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "decode/method.h"
#include "recipe/recipe.h"
#include "tool.h"

#define USAGE                                                                                                          \
    "--recipe FILE [--methods A,B] [--samples N] [--out DIR] [-t N] [-m MODEL] [--exit-heads H] "                      \
    "[--medusa H] [--eagle H] [--draft D] [--no-oracle]"

#define MEMORY                                                                                                            \
    "memory: about " MEMORY_MODEL                                                                                         \
    "\n        + " MEMORY_KV("2") "\n"                                                                                    \
                                  "        + the exit heads', Medusa heads' and draft model's weights twice each, "       \
                                  "when the methods need them\n"                                                          \
                                  "        (the draft also its KV cache, 1 × its ctx × layers × kv_dim × 8 bytes) + " \
                                  "the datasets' prompts.\n"

typedef struct {
    const char *recipe, *methods, *out, *model, *exit, *medusa, *eagle, *draft, *kv_type;
    int samples, threads, no_oracle;
    const char *device;
    KVType kvt;
} Args;

/* what one (dataset, method[, oracle rate]) cell sums over its prompts */
typedef struct {
    int prompts, mismatches, bad_prompt, bad_at;
    int64_t tokens, passes, layer_passes, drafted, rejected;
    int64_t steps_tokens; /* tokens after each prompt's first (which the prefill pass gives) */
    double t_decode;
} Stats;

typedef struct {
    const Recipe *r;
    Model m, draft;
    ExitHeads heads;
    MedusaHeads medusa;
    EagleHead eagle;
    int has_exit, has_medusa, has_eagle, has_draft;
    KVCache kv;
    int n_methods;
    const char *methods[RECIPE_MAX_METHODS];
    Progress pg;
    int64_t runs;
} Bench;

/* a generated sequence */
typedef struct {
    int32_t *tok;
    int n;
} Seq;

static Args parse(int argc, char **argv) {
    Args a = {0};
    Flag t[] = {
        {"--recipe", "FILE", "required", "the recipe (recipes/*.yaml): model, datasets, methods, options",
         F_STR(&a.recipe)},
        {"--methods", "A,B", "the recipe's", "the methods to run (standard always runs first)", F_STR(&a.methods)},
        {"--samples", "N", "the recipe's", "prompts per dataset at most", F_INT(&a.samples, 1, 100000)},
        {"--out", "DIR", "out/NAME", "where the tables (markdown, CSV) and plots go", F_STR(&a.out)},
        {"-t, --threads", "N", "the recipe's", "threads", F_INT(&a.threads, 1, 64)},
        DEVICE_FLAG(&a.device),
        KV_TYPE_FLAG(&a.kv_type),
        {"-m, --model", "FILE", "the recipe's", "the model", F_STR(&a.model)},
        MODEL_FLAGS{"--exit-heads", "FILE", "the recipe's", "exit heads (adadecode, self-speculative)", F_STR(&a.exit)},
        {"--medusa", "FILE", "the recipe's", "Medusa heads", F_STR(&a.medusa)},
        {"--eagle", "FILE", "the recipe's", "an EAGLE head", F_STR(&a.eagle)},
        {"--draft", "FILE", "the recipe's", "the draft model (speculative)", F_STR(&a.draft)},
        {"--no-oracle", NULL, NULL, "leave out the oracle table", F_SWITCH(&a.no_oracle)},
    };
    flags_parse(t, N_FLAGS(t), argc, argv, NULL, 0, USAGE, MEMORY);
    if (!a.recipe) usage("--recipe");
    a.kvt = kv_type_arg(a.kv_type);
    return a;
}

static const char *pretty(const char *ds) {
    static const char *const names[][2] = {{"xsum", "XSum"},
                                           {"humaneval", "HumanEval"},
                                           {"gsm8k", "GSM8K"},
                                           {"tinystories", "TinyStories"},
                                           {"spec_bench", "Spec-Bench"},
                                           {"mt_bench", "MT-Bench"}};
    for (int i = 0; i < 6; i++)
        if (!strcmp(ds, names[i][0])) return names[i][1];
    return ds;
}

/* a file the recipe's pipeline makes, or the one named on the command line */
static char *file_of(const Recipe *r, const char *given, const char *out, const char *name, const char *flag) {
    char path[4096];
    if (given) snprintf(path, sizeof path, "%s", given);
    else snprintf(path, sizeof path, "%s/%s", out, name);
    if (access(path, R_OK)) die("%s: not found (make recipe=%s builds it, or give %s)", path, r->name, flag);
    return strdup(path);
}

/* the methods to run: --methods (standard always first) or the recipe's */
static void pick_methods(Bench *b, const Args *a) {
    b->methods[b->n_methods++] = decode_reference()->name;
    if (!a->methods) {
        for (int i = 1; i < b->r->dec.n_methods; i++) b->methods[b->n_methods++] = b->r->dec.methods[i];
        return;
    }
    static char buf[1024];
    snprintf(buf, sizeof buf, "%s", a->methods);
    for (char *s = strtok(buf, ","); s; s = strtok(NULL, ",")) {
        if (!decode_method(s)) die("--methods: %s", pd_errmsg());
        int dup = 0;
        for (int i = 0; i < b->n_methods; i++) dup |= !strcmp(b->methods[i], s);
        if (dup) continue;
        int need = recipe_method_needs(s);
        if ((need & RECIPE_NEEDS_EXIT) && !b->r->exit.on && !a->exit)
            die("--methods: %s needs exit heads (the recipe trains none; give --exit-heads)", s);
        if ((need & RECIPE_NEEDS_MEDUSA) && !b->r->medusa.on && !a->medusa)
            die("--methods: %s needs Medusa heads (the recipe trains none; give --medusa)", s);
        if ((need & RECIPE_NEEDS_EAGLE) && !b->r->eagle.on && !a->eagle)
            die("--methods: %s needs an EAGLE head (the recipe trains none; give --eagle)", s);
        if ((need & RECIPE_NEEDS_DRAFT) && !b->r->draft.on && !a->draft)
            die("--methods: %s needs a draft model (the recipe makes none; give --draft)", s);
        if (b->n_methods == RECIPE_MAX_METHODS) die("--methods: more than %d methods", RECIPE_MAX_METHODS);
        b->methods[b->n_methods++] = s;
    }
}

static void load(Bench *b, const Args *a, const char *out) {
    int need = 0;
    for (int i = 0; i < b->n_methods; i++) need |= recipe_method_needs(b->methods[i]);
    char *path = file_of(b->r, a->model, out, RECIPE_MODEL, "--model");
    tool_model_load(&b->m, path);
    free(path);
    if (need & RECIPE_NEEDS_EXIT) {
        path = file_of(b->r, a->exit, out, RECIPE_EXIT, "--exit-heads");
        if (heads_load(&b->heads, path, &b->m)) die_lib();
        b->has_exit = 1, free(path);
    }
    if (need & RECIPE_NEEDS_MEDUSA) {
        path = file_of(b->r, a->medusa, out, RECIPE_MEDUSA, "--medusa");
        if (medusa_load(&b->medusa, path, &b->m)) die_lib();
        medusa_use_int8(&b->medusa);
        b->has_medusa = 1, free(path);
    }
    if (need & RECIPE_NEEDS_EAGLE) {
        path = file_of(b->r, a->eagle, out, RECIPE_EAGLE, "--eagle");
        if (eagle_load(&b->eagle, path, &b->m)) die_lib();
        b->has_eagle = 1, free(path);
    }
    if (need & RECIPE_NEEDS_DRAFT) {
        char why[160];
        path = file_of(b->r, a->draft, out, RECIPE_DRAFT, "--draft");
        tool_model_load(&b->draft, path);
        if (!tok_same_vocab(b->m.tok, b->draft.tok, why, sizeof why)) die("%s: %s", path, why);
        b->has_draft = 1, free(path);
    }
    if (kv_init_typed(&b->kv, &b->m.c, 2, 2 * b->m.c.seq_len, 16, a->kvt)) die_lib();
}

/* a method's option whose recipe key is "gamma" takes the dataset's γ (its guidance
   or decoding.gamma): the methods judged per dataset's γ */
static const MethodOption *dataset_gamma(const char *method) {
    const DecodeMethod *dm = decode_method(method);
    char key[64];
    for (int i = 0; dm && i < dm->n_options; i++)
        if (!strcmp(decode_option_key(&dm->options[i], key, sizeof key), "gamma")) return &dm->options[i];
    return NULL;
}

/* what a method runs with: the loaded heads or draft, and its options from the recipe */
typedef struct {
    MethodShared sh;
    void *opts;
} MethodRun;

static MethodRun options(Bench *b, const char *method, const RecipeDataset *ds) {
    const RecipeDecoding *d = &b->r->dec;
    const DecodeMethod *dm = decode_method(method);
    MethodRun o = {{0}, decode_options_new(dm)};
    if (!o.opts) die_lib();
    int need = recipe_method_needs(method);
    if (need & RECIPE_NEEDS_EXIT) o.sh.heads = &b->heads;
    if (need & RECIPE_NEEDS_MEDUSA) o.sh.medusa = &b->medusa;
    if (need & RECIPE_NEEDS_EAGLE) o.sh.eagle = &b->eagle;
    if (need & RECIPE_NEEDS_DRAFT) o.sh.draft = &b->draft;
    for (int i = 0; i < dm->n_options; i++) {
        char key[64], g[32];
        const char *v = recipe_option(d, decode_option_key(&dm->options[i], key, sizeof key));
        if (&dm->options[i] == dataset_gamma(method)) snprintf(g, sizeof g, "%.9g", ds->gamma), v = g;
        if (v && decode_option_set(dm, o.opts, &o.sh, dm->options[i].name, v)) die("%s: %s", method, pd_errmsg());
    }
    return o;
}

/* one generation (greedy, or sampled at temp with this seed): its tokens, decode time and counters */
typedef struct {
    Seq seq;
    double t;
    int64_t passes, layer_passes, drafted, rejected;
} Run;

static void run(Bench *b, const char *method, const MethodRun *o, const int32_t *ids, int n_ids, int max_new,
                float temp, uint64_t seed, Run *out) {
    Sampler s;
    DecodeCtx d;
    if (sampler_init(&s, b->m.c.vocab_size, temp, 0, 1, seed) || decode_init(&d, &b->m, &b->kv, &s, max_new)) die_lib();
    d.opt = o->sh;
    d.mopt = o->opts;
    if (decode_generate(decode_method(method), &d, ids, n_ids)) die("%s: %s", method, pd_errmsg());
    out->t = d.t_decode;
    out->passes = d.target_passes - d.prefill_passes;
    out->layer_passes = d.layer_passes - d.prefill_passes * b->m.c.n_layers;
    out->drafted = d.drafted, out->rejected = d.rejected;
    out->seq.n = d.n_out;
    if (!(out->seq.tok = malloc(sizeof(int32_t) * (d.n_out + 1)))) die("out of memory");
    memcpy(out->seq.tok, d.out, sizeof(int32_t) * d.n_out);
    decode_free(&d);
    sampler_free(&s);
    progress_step(&b->pg, ++b->runs);
}

/* repeats of a run keep the first's tokens and counters and the shortest time (noise
   only ever adds time) */
static void keep(Run *best, Run *x, int first) {
    if (first) *best = *x;
    else {
        if (x->t < best->t) best->t = x->t;
        free(x->seq.tok);
    }
}

static void add(Stats *st, const Run *r) {
    st->prompts++;
    st->tokens += r->seq.n;
    st->steps_tokens += r->seq.n > 1 ? r->seq.n - 1 : 0;
    st->t_decode += r->t;
    st->passes += r->passes, st->layer_passes += r->layer_passes;
    st->drafted += r->drafted, st->rejected += r->rejected;
}

/* compares with standard's tokens; a mismatch is said at once, loudly */
static void parity(const char *method, const char *ds, int prompt, const Seq *ref, const Seq *got, Stats *st) {
    int at = 0;
    while (at < ref->n && at < got->n && ref->tok[at] == got->tok[at]) at++;
    if (at == ref->n && at == got->n) return;
    if (!st->mismatches++) st->bad_prompt = prompt, st->bad_at = at;
    fprintf(stderr, "\nbench: PARITY FAILURE: %s on %s prompt %d: token %d is %d, standard's is %d (%d vs %d tokens)\n",
            method, ds, prompt + 1, at, at < got->n ? got->tok[at] : -1, at < ref->n ? ref->tok[at] : -1, got->n,
            ref->n);
}

/* ---- the figures ---- */

static double tok_s(const Stats *s) { return s->tokens / (s->t_decode + 1e-12); }
/* per token the decode steps made: each prompt's first token comes from the prefill
   pass, so standard is exactly τ 1 and n_layers passes */
static double tau(const Stats *s) { return decode_tau(s->steps_tokens, s->passes); }
static double passes_per_token(const Stats *s) {
    return s->steps_tokens ? (double)s->layer_passes / s->steps_tokens : 0;
}

/* exit-head methods are judged by sequential layer passes, drafters by τ */
static int by_layers(const char *method) { return recipe_method_needs(method) & RECIPE_NEEDS_EXIT; }

static void fmt_rate(char *buf, size_t n, double v) {
    snprintf(buf, n, v >= 1000 ? "%.0f" : v >= 10 ? "%.1f" : "%.2f", v);
}

static void fmt_effort(char *buf, size_t n, const char *method, const Stats *s) {
    if (!strcmp(method, decode_reference()->name))
        snprintf(buf, n, "τ %.2f · %.2f layers", tau(s), passes_per_token(s));
    else if (by_layers(method)) snprintf(buf, n, "%.2f layers/token", passes_per_token(s));
    else snprintf(buf, n, "τ %.2f", tau(s));
}

/* what the figures are: real, or from random weights (and, per row, an oracle) */
static const char *figures_kind(const Recipe *r) { return r->model.random_config ? "random-weights" : "real"; }

typedef struct {
    Bench *b;
    int n_ds;
    const RecipeDataset *ds[RECIPE_MAX_DATASETS];
    int prompts[RECIPE_MAX_DATASETS], skipped[RECIPE_MAX_DATASETS];
    Stats st[RECIPE_MAX_DATASETS][RECIPE_MAX_METHODS];
    Stats sst[RECIPE_MAX_DATASETS][RECIPE_MAX_METHODS]; /* sampled at decoding.temp (when > 0) */
    /* the oracle sweep: methods × rates on the first dataset, standard beside them */
    int n_om, n_rates, oracle_prompts;
    const char *om[RECIPE_MAX_METHODS];
    Stats ost[RECIPE_MAX_METHODS][RECIPE_MAX_ORACLE], ostd;
    double seconds;
    int threads, repeat;
    char command[2048]; /* how this table was made */
} Results;

/* a table's column heads (one per dataset) and its rule */
static void columns(Str *md, const Results *R) {
    for (int i = 0; i < R->n_ds; i++) put(md, " %s |", pretty(R->ds[i]->name));
    put(md, "\n|---|");
    for (int i = 0; i < R->n_ds; i++) put(md, "---|");
    put(md, "\n");
}

static void table_md(const Results *R, const char *model_path, Str *md) {
    const Bench *b = R->b;
    const Recipe *r = b->r;
    int L = b->m.c.n_layers;
    put(md, "# %s — bin/bench\n\n", r->name);
    if (r->about) put(md, "%s\n\n", r->about);
    put(md, "Model: `%s`%s%s — %d layers, dim %d, vocabulary %d.\n", model_path, r->model.about ? ", " : "",
        r->model.about ? r->model.about : "", L, b->m.c.dim, b->m.c.vocab_size);
    if (r->model.random_config)
        put(md, "\n**Random weights: every speed and acceptance figure below means nothing about the real model** — "
                "this recipe checks that the whole path runs (architecture, tokenizer, chat format), not how fast it "
                "is.\n");
    else
        put(md, "Every figure in the first three tables is **real**: measured on this model in this run; the oracle "
                "table's "
                "figures are not (an oracle stands in for the heads or the draft).\n");
    put(md, "\nGreedy (temperature 0), %d thread%s, prompts per dataset:", R->threads, R->threads > 1 ? "s" : "");
    for (int i = 0; i < R->n_ds; i++) {
        put(md, " %s %d × ≤%d tokens%s", pretty(R->ds[i]->name), R->prompts[i], R->ds[i]->max_new,
            R->ds[i]->chat ? " (chat)" : "");
        if (R->skipped[i]) put(md, " (%d too long for the context left out)", R->skipped[i]);
        put(md, "%s", i + 1 < R->n_ds ? "," : ".");
    }
    put(md, " Methods run one after another on each prompt, in an order that turns with the prompt");
    if (R->repeat > 1) put(md, ", %d times each (the shortest decode time kept)", R->repeat);
    put(md, "; %.0f s in all.\n", R->seconds);
    put(md, "Command: `%s`.\n\n", R->command);
    /* speed */
    put(md, "## Speed: tok/s (speedup over standard, same run)\n\n| method |");
    columns(md, R);
    for (int k = 0; k < b->n_methods; k++) {
        put(md, "| %s |", b->methods[k]);
        for (int i = 0; i < R->n_ds; i++) {
            char v[32];
            fmt_rate(v, sizeof v, tok_s(&R->st[i][k]));
            put(md, " %s (%.2f×) |", v, tok_s(&R->st[i][k]) / (tok_s(&R->st[i][0]) + 1e-12));
        }
        put(md, "\n");
    }
    int ada = 0;
    for (int k = 0; k < b->n_methods; k++) ada |= dataset_gamma(b->methods[k]) != NULL;
    if (ada) {
        put(md, "\nadadecode's γ:");
        for (int i = 0; i < R->n_ds; i++)
            put(md, " %s %.2f%s", pretty(R->ds[i]->name), R->ds[i]->gamma, i + 1 < R->n_ds ? "," : ".");
        put(md, "\n");
    }
    /* effort */
    put(md, "\n## Tokens per target pass (τ) or sequential layer passes per token (of %d)\n\n| method |", L);
    columns(md, R);
    for (int k = 0; k < b->n_methods; k++) {
        put(md, "| %s |", b->methods[k]);
        for (int i = 0; i < R->n_ds; i++) {
            char e[64];
            fmt_effort(e, sizeof e, b->methods[k], &R->st[i][k]);
            const Stats *s = &R->st[i][k];
            if (s->drafted) put(md, " %s, %.0f %% of drafts rejected |", e, 100.0 * s->rejected / s->drafted);
            else put(md, " %s |", e);
        }
        put(md, "\n");
    }
    if (r->dec.temp > 0) { /* sampled */
        put(md, "\n## Sampled at temperature %g: tok/s (speedup over standard sampled, same seeds), τ\n\n| method |",
            r->dec.temp);
        columns(md, R);
        for (int k = 0; k < b->n_methods; k++) {
            put(md, "| %s |", b->methods[k]);
            for (int i = 0; i < R->n_ds; i++) {
                char v[32], e[64];
                const Stats *s = &R->sst[i][k];
                fmt_rate(v, sizeof v, tok_s(s));
                fmt_effort(e, sizeof e, b->methods[k], s);
                put(md, " %s (%.2f×), %s |", v, tok_s(s) / (tok_s(&R->sst[i][0]) + 1e-12), e);
            }
            put(md, "\n");
        }
        put(md, "\nEvery method keeps the model's distribution when sampling (tests: a chi-square test per method); "
                "the outputs differ from standard's draw by draw, so no parity is asked of them.\n");
    }
    /* parity */
    put(md, "\n## Greedy parity with standard (the same tokens; must be 100 %%)\n\n| method |");
    columns(md, R);
    for (int k = 1; k < b->n_methods; k++) {
        put(md, "| %s |", b->methods[k]);
        for (int i = 0; i < R->n_ds; i++) {
            const Stats *s = &R->st[i][k];
            if (!s->mismatches) put(md, " 100 %% (%d/%d) |", s->prompts, s->prompts);
            else
                put(md, " **NO: %d/%d differ** (prompt %d, token %d) |", s->mismatches, s->prompts, s->bad_prompt + 1,
                    s->bad_at);
        }
        put(md, "\n");
    }
    if (b->n_methods == 1) put(md, "| (standard only) | — |\n");
    /* oracle */
    if (R->n_om) {
        put(md,
            "\n## Oracle headroom (**oracle figures, not real ones**)\n\n"
            "An oracle that knows standard's continuation stands in for the heads / draft and is right with the given "
            "probability (adadecode: exits at the middle head); the output is still verified. %s, %d prompt%s; "
            "standard ran %.1f tok/s on them.\n\n| method | oracle acceptance | tok/s | speedup | τ or layers | parity "
            "|\n"
            "|---|---|---|---|---|---|\n",
            pretty(R->ds[0]->name), R->oracle_prompts, R->oracle_prompts > 1 ? "s" : "", tok_s(&R->ostd));
        for (int k = 0; k < R->n_om; k++)
            for (int j = 0; j < R->n_rates; j++) {
                const Stats *s = &R->ost[k][j];
                char v[32], e[64];
                fmt_rate(v, sizeof v, tok_s(s));
                fmt_effort(e, sizeof e, R->om[k], s);
                put(md, "| %s (oracle) | %.2f | %s | %.2f× | %s | %s |\n", R->om[k], r->dec.oracle[j], v,
                    tok_s(s) / (tok_s(&R->ostd) + 1e-12), e, s->mismatches ? "**NO**" : "100 %");
            }
    }
}

static void csv_row(Str *c, const char *kind, const char *ds, const char *method, double gamma, double rate,
                    const Stats *s, const Stats *ref, const char *figures) {
    char r[16] = "";
    if (rate >= 0) snprintf(r, sizeof r, "%.2f", rate);
    put(c, "%s,%s,%s,%.2f,%s,%d,%lld,%.6f,%.1f,%.3f,%.3f,%.3f,%.3f,%d,%d,%s\n", kind, ds, method, gamma, r, s->prompts,
        (long long)s->tokens, s->t_decode, tok_s(s), tok_s(s) / (tok_s(ref) + 1e-12), by_layers(method) ? 0 : tau(s),
        passes_per_token(s), s->drafted ? (double)s->rejected / s->drafted : 0, s->prompts - s->mismatches, s->prompts,
        figures);
}

static void table_csv(const Results *R, Str *c) {
    const Bench *b = R->b;
    const char *fig = figures_kind(b->r);
    put(c,
        "table,dataset,method,gamma,oracle_rate,prompts,tokens,decode_s,tok_per_s,speedup,tau,layer_passes_per_token,"
        "rejection_rate,parity_ok,parity_of,figures\n");
    for (int i = 0; i < R->n_ds; i++)
        for (int k = 0; k < b->n_methods; k++)
            csv_row(c, "speed", R->ds[i]->name, b->methods[k], dataset_gamma(b->methods[k]) ? R->ds[i]->gamma : 0, -1,
                    &R->st[i][k], &R->st[i][0], fig);
    for (int i = 0; i < R->n_ds && b->r->dec.temp > 0; i++)
        for (int k = 0; k < b->n_methods; k++)
            csv_row(c, "sampled", R->ds[i]->name, b->methods[k], dataset_gamma(b->methods[k]) ? R->ds[i]->gamma : 0, -1,
                    &R->sst[i][k], &R->sst[i][0], fig);
    char ofig[64];
    snprintf(ofig, sizeof ofig, "oracle%s", strcmp(fig, "real") ? "+random-weights" : "");
    for (int k = 0; k < R->n_om; k++)
        for (int j = 0; j < R->n_rates; j++)
            csv_row(c, "oracle", R->ds[0]->name, R->om[k], dataset_gamma(R->om[k]) ? R->ds[0]->gamma : 0,
                    b->r->dec.oracle[j], &R->ost[k][j], &R->ostd, ofig);
}

/* ---- files ---- */

static void mkdirs(const char *dir) {
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    for (char *s = p + 1;; s++)
        if (*s == '/' || !*s) {
            char c = *s;
            *s = 0;
            if (mkdir(p, 0755) && errno != EEXIST) die("%s: cannot create: %s", p, strerror(errno));
            if (!(*s = c)) break;
        }
}

static void write_file(const char *dir, const char *name, const char *text) {
    char path[4096];
    AtomicFile af;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (atomic_open(&af, path)) die_lib();
    fputs(text, af.f);
    if (atomic_commit(&af)) die_lib();
}

/* a gnuplot script drawn into DIR/name: gnuplot writes the PNG to its stdout, which is
   our atomic temp file, so a killed bench (or gnuplot) never leaves half a picture */
static int plot(const char *dir, const char *name, const char *script) {
    char path[4096], cmd[64];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    AtomicFile af;
    if (atomic_open(&af, path)) return -1;
    int fd = fileno(af.f);
    snprintf(cmd, sizeof cmd, "gnuplot 2>/dev/null >&%d", fd);
    FILE *g = fcntl(fd, F_SETFD, 0) ? NULL : popen(cmd, "w"); /* (the child inherits it) */
    int rc = -1;
    if (g) {
        fprintf(g, "set terminal pngcairo size 900,500 noenhanced\n%s", script);
        rc = pclose(g);
    }
    struct stat st;
    if (rc || fstat(fd, &st) || st.st_size == 0) {
        atomic_abort(&af);
        return -1;
    }
    return atomic_commit(&af);
}

/* gnuplot strings go in single quotes: those inside are doubled */
static void quoted(Str *s, const char *t) {
    put(s, "'");
    for (; *t; t++) put(s, *t == '\'' ? "''" : "%c", *t);
    put(s, "'");
}

static void plots(const Results *R, const char *dir, Str *md) {
    const Bench *b = R->b;
    if (system("command -v gnuplot >/dev/null 2>&1")) {
        put(md, "\n(speed.png and oracle.png not drawn: gnuplot is not installed — scripts/setup.sh installs it.)\n");
        return;
    }
    Str s = {0};
    put(&s, "set style data histogram\nset style histogram cluster gap 1\nset style fill solid 0.8 border -1\n"
            "set ylabel 'speedup over standard (same run)'\nset yrange [0:*]\nset grid ytics\nset key outside right\n"
            "set xtics rotate by -20\nset title ");
    char t[512];
    snprintf(t, sizeof t, "%s: greedy speedup over standard%s", b->r->name,
             b->r->model.random_config ? " (RANDOM WEIGHTS: meaningless)" : "");
    quoted(&s, t);
    put(&s, "\n$d << EOD\nmethod");
    for (int i = 0; i < R->n_ds; i++) put(&s, " \"%s\"", pretty(R->ds[i]->name));
    put(&s, "\n");
    for (int k = 0; k < b->n_methods; k++) {
        put(&s, "\"%s\"", b->methods[k]);
        for (int i = 0; i < R->n_ds; i++) put(&s, " %.4f", tok_s(&R->st[i][k]) / (tok_s(&R->st[i][0]) + 1e-12));
        put(&s, "\n");
    }
    put(&s, "EOD\nplot for [i=2:%d] $d using i:xtic(1) title columnheader(i)\n", R->n_ds + 1);
    if (plot(dir, "speed.png", s.s))
        put(md, "\n(speed.png: gnuplot failed; the tables above hold the same figures.)\n");
    s.n = 0;
    if (R->n_om) {
        put(&s, "set xlabel 'oracle acceptance rate'\nset ylabel 'speedup over standard (same run)'\nset grid\nset key "
                "left top\n"
                "set xrange [0:1]\nset title ");
        snprintf(t, sizeof t, "%s: speedup against oracle acceptance (ORACLE figures, %s)%s", b->r->name,
                 pretty(R->ds[0]->name), b->r->model.random_config ? ", random weights" : "");
        quoted(&s, t);
        put(&s, "\n");
        for (int k = 0; k < R->n_om; k++) {
            put(&s, "$m%d << EOD\n", k);
            for (int j = 0; j < R->n_rates; j++)
                put(&s, "%.3f %.4f\n", b->r->dec.oracle[j], tok_s(&R->ost[k][j]) / (tok_s(&R->ostd) + 1e-12));
            put(&s, "EOD\n");
        }
        put(&s, "plot ");
        for (int k = 0; k < R->n_om; k++) put(&s, "$m%d with linespoints lw 2 title '%s', ", k, R->om[k]);
        put(&s, "1 with lines dt 2 lc rgb 'gray' title 'standard'\n");
        if (plot(dir, "oracle.png", s.s))
            put(md, "\n(oracle.png: gnuplot failed; the oracle table holds the same figures.)\n");
    }
    free(s.s);
}

/* ---- the runs ---- */

typedef struct {
    int32_t *ids;
    int n, max_new;
} Prompt;

static void bench_dataset(Bench *b, Results *R, int i, Prompt *ps, int n) {
    const RecipeDataset *ds = R->ds[i];
    int M = b->n_methods;
    Run best[RECIPE_MAX_METHODS], x;
    for (int p = 0; p < n; p++) {
        for (int rep = 0; rep < R->repeat; rep++)
            for (int j = 0; j < M; j++) { /* the order turns with the prompt and the repeat */
                int k = (j + p + rep) % M;
                MethodRun o = options(b, b->methods[k], ds);
                run(b, b->methods[k], &o, ps[p].ids, ps[p].n, ps[p].max_new, 0, p + 1, &x);
                free(o.opts);
                keep(&best[k], &x, rep == 0);
            }
        for (int k = 0; k < M; k++) add(&R->st[i][k], &best[k]);
        for (int k = 1; k < M; k++) parity(b->methods[k], ds->name, p, &best[0].seq, &best[k].seq, &R->st[i][k]);
        for (int k = 0; k < M; k++) free(best[k].seq.tok);
        if (b->r->dec.temp <= 0) continue;
        /* sampled: the same seed for every method (each keeps the model's distribution, so
           only the speed is compared; the tests check the distribution) */
        for (int rep = 0; rep < R->repeat; rep++)
            for (int j = 0; j < M; j++) {
                int k = (j + p + rep) % M;
                MethodRun o = options(b, b->methods[k], ds);
                run(b, b->methods[k], &o, ps[p].ids, ps[p].n, ps[p].max_new, b->r->dec.temp, p + 1, &x);
                free(o.opts);
                keep(&best[k], &x, rep == 0);
            }
        for (int k = 0; k < M; k++) add(&R->sst[i][k], &best[k]), free(best[k].seq.tok);
    }
}

static void bench_oracle(Bench *b, Results *R, Prompt *ps, int n) {
    const RecipeDataset *ds = R->ds[0];
    int cells = R->n_om * R->n_rates;
    Run ref, x, best[RECIPE_MAX_METHODS * RECIPE_MAX_ORACLE];
    for (int p = 0; p < n; p++) {
        MethodRun o0 = options(b, decode_reference()->name, ds);
        run(b, decode_reference()->name, &o0, ps[p].ids, ps[p].n, ps[p].max_new, 0, p + 1, &ref);
        int32_t *oracle = malloc(sizeof(int32_t) * (ps[p].max_new + 1));
        if (!oracle) die("out of memory");
        memset(oracle, 0xff, sizeof(int32_t) * (ps[p].max_new + 1));
        memcpy(oracle, ref.seq.tok, sizeof(int32_t) * ref.seq.n);
        for (int rep = 0; rep < R->repeat; rep++) {
            if (rep)
                run(b, decode_reference()->name, &o0, ps[p].ids, ps[p].n, ps[p].max_new, 0, p + 1, &x),
                    keep(&ref, &x, 0);
            for (int c = 0; c < cells; c++) {
                int cell = (c + p + rep) % cells, k = cell / R->n_rates, j = cell % R->n_rates;
                MethodRun o = options(b, R->om[k], ds);
                o.sh.oracle = oracle, o.sh.oracle_rate = b->r->dec.oracle[j];
                run(b, R->om[k], &o, ps[p].ids, ps[p].n, ps[p].max_new, 0, p + 1, &x);
                free(o.opts);
                keep(&best[cell], &x, rep == 0);
            }
        }
        add(&R->ostd, &ref);
        for (int cell = 0; cell < cells; cell++) {
            int k = cell / R->n_rates, j = cell % R->n_rates;
            char what[64];
            snprintf(what, sizeof what, "%s (oracle %.2f)", R->om[k], b->r->dec.oracle[j]);
            add(&R->ost[k][j], &best[cell]);
            parity(what, ds->name, p, &ref.seq, &best[cell].seq, &R->ost[k][j]);
            free(best[cell].seq.tok);
        }
        free(oracle), free(ref.seq.tok), free(o0.opts);
    }
}

/* a dataset's prompts, encoded; those the context cannot hold with room to generate are left out */
static Prompt *prompts_of(Bench *b, const RecipeDataset *ds, int samples, int *n, int *skipped) {
    RecipeDataset d = *ds;
    if (samples) d.samples = samples;
    char **text;
    int nt;
    if (recipe_prompts(&d, &text, &nt)) die_lib();
    Prompt *ps = calloc(nt ? nt : 1, sizeof(Prompt));
    if (!ps) die("out of memory");
    *n = *skipped = 0;
    for (int i = 0; i < nt; i++) {
        Prompt *p = &ps[*n];
        if (recipe_encode(&b->m, &d, text[i], &p->ids, &p->n)) die("%s: %s", ds->name, pd_errmsg());
        p->max_new = d.max_new < b->m.c.seq_len - p->n ? d.max_new : b->m.c.seq_len - p->n;
        if (p->max_new < 1 || p->n < 1) {
            free(p->ids), (*skipped)++;
            continue;
        }
        (*n)++;
    }
    recipe_prompts_free(text, nt);
    if (!*n) die("%s: no prompt fits the model's context of %d tokens", ds->name, b->m.c.seq_len);
    return ps;
}

int main(int argc, char **argv) {
    tool_name = "bench";
    Args a = parse(argc, argv);
    Recipe r;
    if (recipe_load(&r, a.recipe)) die_lib();
    char out[4096];
    snprintf(out, sizeof out, "%s", a.out ? a.out : "");
    if (!a.out) snprintf(out, sizeof out, "out/%s", r.name);
    static Bench b;
    static Results R;
    b.r = &r;
    pick_methods(&b, &a);
    load(&b, &a, out);
    R.b = &b;
    snprintf(R.command, sizeof R.command, "bin/bench");
    for (int i = 1; i < argc; i++)
        snprintf(R.command + strlen(R.command), sizeof R.command - strlen(R.command), " %s", argv[i]);
    R.threads = a.threads ? a.threads : r.threads;
    R.repeat = r.dec.repeat;
    if (model_threads(R.threads)) die("cannot start %d threads", R.threads);
    device_arg(a.device);
    Prompt *ps[RECIPE_MAX_DATASETS];
    R.n_ds = r.n_datasets;
    int64_t total = 0;
    for (int i = 0; i < R.n_ds; i++) {
        R.ds[i] = &r.ds[i];
        ps[i] = prompts_of(&b, &r.ds[i], a.samples, &R.prompts[i], &R.skipped[i]);
        total += (int64_t)R.prompts[i] * b.n_methods * R.repeat * (r.dec.temp > 0 ? 2 : 1);
    }
    if (!a.no_oracle)
        for (int k = 1; k < b.n_methods && r.dec.n_oracle; k++)
            if (recipe_method_has_oracle(b.methods[k])) R.om[R.n_om++] = b.methods[k];
    R.n_rates = r.dec.n_oracle;
    int oracle_samples = a.samples && a.samples < r.dec.oracle_samples ? a.samples : r.dec.oracle_samples;
    R.oracle_prompts = R.n_om ? (oracle_samples < R.prompts[0] ? oracle_samples : R.prompts[0]) : 0;
    total += (int64_t)R.oracle_prompts * (1 + R.n_om * R.n_rates) * R.repeat;
    progress_begin(&b.pg, "bench", total + 1);
    double t0 = pd_now();
    { /* a warm-up: the first run grows the workspaces and faults the weights in */
        Run w;
        MethodRun o = options(&b, decode_reference()->name, R.ds[0]);
        run(&b, decode_reference()->name, &o, ps[0][0].ids, ps[0][0].n, ps[0][0].max_new, 0, 1, &w);
        free(w.seq.tok), free(o.opts);
    }
    for (int i = 0; i < R.n_ds; i++) bench_dataset(&b, &R, i, ps[i], R.prompts[i]);
    if (R.n_om) bench_oracle(&b, &R, ps[0], R.oracle_prompts);
    progress_end(&b.pg);
    R.seconds = pd_now() - t0;
    int bad = 0;
    for (int i = 0; i < R.n_ds; i++)
        for (int k = 0; k < b.n_methods; k++) bad += R.st[i][k].mismatches;
    for (int k = 0; k < R.n_om; k++)
        for (int j = 0; j < R.n_rates; j++) bad += R.ost[k][j].mismatches;
    char model_path[4096];
    snprintf(model_path, sizeof model_path, a.model ? "%s" : "%s/" RECIPE_MODEL, a.model ? a.model : out);
    Str md = {0}, csv = {0};
    table_md(&R, model_path, &md);
    table_csv(&R, &csv);
    if (bad) {
        fputs(md.s, stdout);
        die("GREEDY PARITY FAILED: %d run%s differ from standard (above); nothing written to %s", bad,
            bad > 1 ? "s" : "", out);
    }
    mkdirs(out);
    plots(&R, out, &md);
    write_file(out, "table.csv", csv.s);
    write_file(out, "table.md", md.s);
    fputs(md.s, stdout);
    fprintf(stderr, "bench: %s/table.md, table.csv%s; greedy parity 100 %% on every run\n", out,
            system("command -v gnuplot >/dev/null 2>&1") ? ""
            : R.n_om                                     ? ", speed.png, oracle.png"
                                                         : ", speed.png");
    for (int i = 0; i < R.n_ds; i++) {
        for (int p = 0; p < R.prompts[i]; p++) free(ps[i][p].ids);
        free(ps[i]);
    }
    free(md.s), free(csv.s);
    kv_free(&b.kv);
    if (b.has_exit) heads_free(&b.heads);
    if (b.has_medusa) medusa_free(&b.medusa);
    if (b.has_eagle) eagle_free(&b.eagle);
    if (b.has_draft) model_free(&b.draft);
    model_free(&b.m);
    recipe_free(&r);
    return 0;
}
