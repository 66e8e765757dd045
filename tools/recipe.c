/* recipe — what `make recipe=NAME` runs before the stages themselves.
   bin/recipe check RECIPE                  parse and check it; one line saying what it makes
   bin/recipe rules RECIPE [--out DIR] [--stamps DIR] -o FILE
        the make rules of its pipeline (convert or randmodel → answers → distill-heads →
        draft → train-medusa → pack → bench) into FILE, for the Makefile to include.
        Each stage's settings go into a stamp file in --stamps (build/recipe/NAME/) that
        is rewritten only when they change, and the stage depends on it: a second run
        redoes only what a changed setting or input touches. FILE, too, is rewritten
        only when its text changes (make restarts after an included file changes).
   bin/recipe answers RECIPE -m MODEL [-t N] -o FILE
        the model's own answers (greedy, or sampled at `temp`) to the `answers:` prompts'
        training part, as jsonl {"text": the formatted prompt + the answer}, through the
        serving engine's continuous batching: self-distillation text for the heads.
        Resumable (FILE.partial; docs/recipes.md). */
#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "base/utf8.h"
#include "decode/engine.h"
#include "decode/method.h"
#include "recipe/recipe.h"
#include "tool.h"

#define MEMORY                                                                                                         \
    "memory: check and rules, a few MiB (the recipe); answers, about\n        " MEMORY_MODEL "\n"                      \
    "        + " MEMORY_KV(                                                                                            \
        "answers.parallel") "\n        (ctx: the longest prompt + its max_new) + the datasets' prompts and answers.\n"
#define USAGE "check RECIPE | rules RECIPE [--out DIR] [--stamps DIR] -o FILE | answers RECIPE -m MODEL [-t N] -o FILE"

/* writes text to path unless the file already holds exactly that (its time then stays,
   which is what make's dependency tracking reads) */
static void write_if_changed(const char *path, const char *text) {
    char *old;
    size_t n;
    FILE *f = fopen(path, "rb");
    if (f) {
        fclose(f);
        if (!pd_read_file(path, &old, &n)) {
            int same = n == strlen(text) && !memcmp(old, text, n);
            free(old);
            if (same) return;
        }
    }
    AtomicFile af;
    if (atomic_open(&af, path)) die_lib();
    fputs(text, af.f);
    if (atomic_commit(&af)) die_lib();
}

static void mkdirs(const char *dir) {
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    for (char *s = p + 1;; s++) {
        if (*s == '/' || !*s) {
            char c = *s;
            *s = 0;
            if (mkdir(p, 0755) && errno != EEXIST) die("%s: cannot create: %s", p, strerror(errno));
            if (!(*s = c)) break;
        }
    }
}

/* ---- rules ---- */

typedef struct {
    const Recipe *r;
    const char *out, *stamps;
    Str mk;
} Gen;

/* one stage: target, its prerequisites, the tool (order-only: a rebuilt tool does not
   redo finished stages; `rm -r out/NAME` does), the command; its stamp holds the
   command plus any settings the command does not show */
static void stage(Gen *g, const char *target, const char *deps, const char *tool, const char *cmd, const char *extra) {
    char stamp[4200];
    snprintf(stamp, sizeof stamp, "%s/%s.cmd", g->stamps, target);
    Str s = {0};
    put(&s, "%s\n%s", cmd, extra ? extra : "");
    write_if_changed(stamp, s.s);
    free(s.s);
    put(&g->mk, "%s/%s: %s %s | $(BIN)/%s\n", g->out, target, stamp, deps, tool);
    if (strcmp(target, RECIPE_MODEL)) put(&g->mk, "\t%s\n\n", cmd);
    else /* the first stage makes the folder, and takes it away again when it fails */
        put(&g->mk, "\t@mkdir -p %s\n\t%s || { rmdir %s 2>/dev/null; exit 1; }\n\n", g->out, cmd, g->out);
}

/* prerequisites of a source: a directory's files, or the file */
static void source_deps(Str *d, const char *path) {
    struct stat st;
    if (!stat(path, &st) && S_ISDIR(st.st_mode)) put(d, "%s$(wildcard %s/*)", d->n ? " " : "", path);
    else put(d, "%s%s", d->n ? " " : "", path);
}

static void dataset_settings(Str *s, const RecipeDataset *ds) {
    put(s, "dataset %s file %s samples %d max_new %d chat %d gamma %g system %s part %d split %d ranked\ntemplate %s\n",
        ds->name, ds->file, ds->samples, ds->max_new, ds->chat, ds->gamma, ds->system ? ds->system : "-", ds->part,
        ds->eval_pct, ds->tmpl);
}

/* distill-heads for a head set (the exit heads, or the draft's own head) */
static void heads_stage(Gen *g, const RecipeExitHeads *h, const char *target) {
    const Recipe *r = g->r;
    Str cmd = {0}, deps = {0};
    put(&deps, "%s/%s", g->out, RECIPE_MODEL);
    put(&cmd, "$(BIN)/distill-heads -m %s/%s --data ", g->out, RECIPE_MODEL);
    if (h->from_answers) put(&cmd, "%s/%s", g->out, RECIPE_ANSWERS), put(&deps, " %s/%s", g->out, RECIPE_ANSWERS);
    else put(&cmd, "%s", h->data), put(&deps, " %s", h->data);
    if (h->fields) put(&cmd, " --fields %s", h->fields);
    if (h->special) put(&cmd, " --special");
    put(&cmd, " --layers %s", h->layers);
    if (h->steps) put(&cmd, " --steps %d", h->steps);
    if (h->lr) put(&cmd, " --lr %g", h->lr);
    if (h->batch) put(&cmd, " --batch %d", h->batch);
    if (h->seq_len) put(&cmd, " --seq-len %d", h->seq_len);
    if (h->seed) put(&cmd, " --seed %d", h->seed);
    put(&cmd, " --norm %s", h->norm < 0 ? "auto" : h->norm ? "1" : "0");
    if (h->check_vocab) put(&cmd, " --check-vocab %d", h->check_vocab);
    put(&cmd, " -t %d -o $@", r->threads);
    stage(g, target, deps.s, "distill-heads", cmd.s, NULL);
    free(cmd.s), free(deps.s);
}

static void rules(const Recipe *r, const char *out, const char *stamps, const char *path) {
    Gen g = {r, out, stamps, {0}};
    mkdirs(stamps);
    put(&g.mk, "# generated by bin/recipe from %s; make recipe=%s runs it (docs/recipes.md)\n\n", r->file, r->name);
    /* 1. the model */
    Str cmd = {0}, deps = {0}, extra = {0};
    if (r->model.random_config) {
        char cfg[4200];
        snprintf(cfg, sizeof cfg, "%s/model-config.json", stamps);
        write_if_changed(cfg, r->model.random_config);
        put(&cmd, "$(BIN)/randmodel --config %s --tokenizer %s", cfg, r->model.tokenizer);
        put(&deps, "%s %s", cfg, r->model.tokenizer);
        if (r->model.chat_template)
            put(&cmd, " --chat-template %s", r->model.chat_template), put(&deps, " %s", r->model.chat_template);
        put(&cmd, " --seed %d --dtype %s -o $@", r->model.random_seed, r->model.dtype);
        stage(&g, RECIPE_MODEL, deps.s, "randmodel", cmd.s, r->model.random_config);
    } else {
        put(&cmd, "$(BIN)/convert %s", r->model.source);
        source_deps(&deps, r->model.source);
        if (r->model.tokenizer) put(&cmd, " --tokenizer %s", r->model.tokenizer), put(&deps, " %s", r->model.tokenizer);
        put(&cmd, " --dtype %s -o $@", r->model.dtype);
        stage(&g, RECIPE_MODEL, deps.s, "convert", cmd.s, NULL);
    }
    cmd.n = deps.n = 0;
    /* 2. the model's own answers */
    if (r->answers.on) {
        put(&cmd, "$(BIN)/recipe answers %s -m %s/%s -t %d -o $@", r->file, out, RECIPE_MODEL,
            r->answers.threads ? r->answers.threads : r->threads);
        put(&deps, "%s/%s", out, RECIPE_MODEL);
        put(&extra, "parallel %d temp %g seed %d\n", r->answers.parallel, r->answers.temp, r->answers.seed);
        for (int i = 0; i < r->answers.n; i++)
            dataset_settings(&extra, &r->answers.ds[i]), put(&deps, " %s", r->answers.ds[i].file);
        stage(&g, RECIPE_ANSWERS, deps.s, "recipe", cmd.s, extra.s);
    }
    cmd.n = deps.n = extra.n = 0;
    /* 3. exit heads, 4. the draft */
    if (r->exit.on) heads_stage(&g, &r->exit, RECIPE_EXIT);
    if (r->draft.on && r->draft.source) {
        put(&cmd, "$(BIN)/convert %s", r->draft.source);
        source_deps(&deps, r->draft.source);
        if (r->draft.tokenizer) put(&cmd, " --tokenizer %s", r->draft.tokenizer), put(&deps, " %s", r->draft.tokenizer);
        put(&cmd, " --dtype %s -o $@", r->model.dtype);
        stage(&g, RECIPE_DRAFT, deps.s, "convert", cmd.s, NULL);
    } else if (r->draft.on) {
        const char *heads = r->draft.own_heads ? RECIPE_DRAFT_HEADS : RECIPE_EXIT;
        if (r->draft.own_heads) heads_stage(&g, &r->draft.heads, RECIPE_DRAFT_HEADS);
        put(&cmd, "$(BIN)/convert %s/%s --layers %d --heads %s/%s --dtype %s -o $@", out, RECIPE_MODEL, r->draft.layer,
            out, heads, r->model.dtype);
        put(&deps, "%s/%s %s/%s", out, RECIPE_MODEL, out, heads);
        stage(&g, RECIPE_DRAFT, deps.s, "convert", cmd.s, NULL);
    }
    cmd.n = deps.n = 0;
    /* 5. Medusa heads */
    if (r->medusa.on) {
        const RecipeMedusa *m = &r->medusa;
        put(&deps, "%s/%s", out, RECIPE_MODEL);
        put(&cmd, "$(BIN)/train-medusa -m %s/%s --data ", out, RECIPE_MODEL);
        if (m->from_answers) put(&cmd, "%s/%s", out, RECIPE_ANSWERS), put(&deps, " %s/%s", out, RECIPE_ANSWERS);
        else put(&cmd, "%s", m->data), put(&deps, " %s", m->data);
        put(&cmd, " --heads %d", m->heads);
        if (m->fields) put(&cmd, " --fields %s", m->fields);
        if (m->special) put(&cmd, " --special");
        if (m->own_lm_head) put(&cmd, " --own-lm-head");
        if (m->generate) put(&cmd, " --generate %d", m->generate);
        if (m->targets) put(&cmd, " --targets %s", m->targets);
        if (m->loss_weights) put(&cmd, " --loss-weights %s", m->loss_weights);
        if (m->steps) put(&cmd, " --steps %d", m->steps);
        if (m->lr) put(&cmd, " --lr %g", m->lr);
        if (m->lm_lr) put(&cmd, " --lm-lr %g", m->lm_lr);
        if (m->batch) put(&cmd, " --batch %d", m->batch);
        if (m->seq_len) put(&cmd, " --seq-len %d", m->seq_len);
        if (m->seed) put(&cmd, " --seed %d", m->seed);
        put(&cmd, " -t %d -o $@", r->threads);
        stage(&g, RECIPE_MEDUSA, deps.s, "train-medusa", cmd.s, NULL);
    }
    cmd.n = deps.n = 0;
    /* 5b. the EAGLE head */
    if (r->eagle.on) {
        const RecipeEagle *e = &r->eagle;
        put(&deps, "%s/%s", out, RECIPE_MODEL);
        put(&cmd, "$(BIN)/train-medusa -m %s/%s --eagle --data ", out, RECIPE_MODEL);
        if (e->from_answers) put(&cmd, "%s/%s", out, RECIPE_ANSWERS), put(&deps, " %s/%s", out, RECIPE_ANSWERS);
        else put(&cmd, "%s", e->data), put(&deps, " %s", e->data);
        if (e->fields) put(&cmd, " --fields %s", e->fields);
        if (e->special) put(&cmd, " --special");
        if (e->draft_vocab) put(&cmd, " --draft-vocab %d", e->draft_vocab);
        if (e->steps) put(&cmd, " --steps %d", e->steps);
        if (e->unroll) put(&cmd, " --unroll %d", e->unroll);
        if (e->unroll_from) put(&cmd, " --unroll-from %d", e->unroll_from);
        if (e->lr) put(&cmd, " --lr %g", e->lr);
        if (e->batch) put(&cmd, " --batch %d", e->batch);
        if (e->seq_len) put(&cmd, " --seq-len %d", e->seq_len);
        if (e->seed) put(&cmd, " --seed %d", e->seed);
        put(&cmd, " -t %d -o $@", r->threads);
        stage(&g, RECIPE_EAGLE, deps.s, "train-medusa", cmd.s, NULL);
    }
    cmd.n = deps.n = 0;
    /* the files the bench reads, which the bundle packs; as prerequisites the EAGLE head
       first, so that make -j starts the longest stage first (on SmolLM2 it trains on every
       answer, the other heads on a part) and the others take turns beside it */
    Str files = {0}, heads = {0};
    put(&files, "%s/%s", out, RECIPE_MODEL);
    if (r->eagle.on) put(&files, " %s/%s", out, RECIPE_EAGLE);
    if (r->exit.on) put(&heads, " %s/%s", out, RECIPE_EXIT), put(&files, " %s/%s", out, RECIPE_EXIT);
    if (r->medusa.on) put(&heads, " %s/%s", out, RECIPE_MEDUSA), put(&files, " %s/%s", out, RECIPE_MEDUSA);
    if (r->eagle.on) put(&heads, " %s/%s", out, RECIPE_EAGLE);
    /* 6. the bundle: only once bin/pack exists (the bench takes the files themselves) */
    put(&g.mk, "ifneq ($(wildcard tools/pack.c),)\n");
    put(&cmd, "$(BIN)/pack -m %s/%s%s -o $@", out, RECIPE_MODEL, heads.s ? heads.s : "");
    stage(&g, RECIPE_BUNDLE, files.s, "pack", cmd.s, NULL);
    put(&g.mk, "recipe: %s/%s\nendif\n\n", out, RECIPE_BUNDLE);
    cmd.n = 0;
    /* 7. the bench */
    if (r->draft.on) put(&files, " %s/%s", out, RECIPE_DRAFT);
    put(&cmd, "$(BIN)/bench --recipe %s --out %s", r->file, out);
    put(&extra, "threads %d methods", r->threads);
    const RecipeDecoding *d = &r->dec;
    for (int i = 0; i < d->n_methods; i++) put(&extra, " %s", d->methods[i]);
    put(&extra, "\ngamma %g", d->gamma);
    for (int i = 0; i < d->n_opts; i++) put(&extra, " %s %s", d->opt_key[i], d->opt_val[i]); /* the methods' options */
    put(&extra, "\nrepeat %d temp %g oracle_samples %d oracle", d->repeat, d->temp, d->oracle_samples);
    for (int i = 0; i < d->n_oracle; i++) put(&extra, " %g", d->oracle[i]);
    put(&extra, "\nabout %s\nmodel %s\n", r->about ? r->about : "-", r->model.about ? r->model.about : "-");
    for (int i = 0; i < r->n_datasets; i++) dataset_settings(&extra, &r->ds[i]), put(&files, " %s", r->ds[i].file);
    stage(&g, "table.md", files.s, "bench", cmd.s, extra.s);
    put(&g.mk, "recipe: %s/table.md\n", out);
    write_if_changed(path, g.mk.s);
    free(g.mk.s), free(cmd.s), free(deps.s), free(extra.s), free(files.s), free(heads.s);
}

/* ---- answers ---- */

/* A run keeps each finished answer in FILE.partial, one line {"i": prompt index, "text"},
   after a first line naming the settings; a run with the same settings takes up what
   one before it finished (a torn last line is dropped), and the last one writes FILE in
   prompt order and removes the partial file. */
typedef struct {
    char **text; /* [total] what each prompt's answer line holds, NULL: not yet */
    int total, done;
} Answers;

static char *answer_settings(const Recipe *r, const char *model) {
    Str s = {0};
    put(&s, "model %s temp %g seed %d split %d\n", model, r->answers.temp, r->answers.seed, r->split);
    for (int i = 0; i < r->answers.n; i++) dataset_settings(&s, &r->answers.ds[i]);
    return s.s;
}

/* one line of the partial file, flushed at once; 0 when JSON cannot hold the text */
static int partial_line(FILE *w, const char *partial, json_t *o) {
    char *line = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    json_decref(o);
    if (!line) return 0;
    fprintf(w, "%s\n", line);
    free(line);
    if (fflush(w)) die("%s: cannot write: %s", partial, strerror(errno));
    return 1;
}

/* the answers an earlier run with these settings left in the partial file, into a; the
   file then written afresh with them alone (a torn last line would run into the next) */
static FILE *resume(Answers *a, const char *partial, const char *settings) {
    char *old;
    size_t n;
    FILE *f = fopen(partial, "rb");
    if (f && (fclose(f), !pd_read_file(partial, &old, &n))) {
        char *nl = memchr(old, '\n', n);
        json_t *head = nl ? (*nl = 0, json_loads(old, 0, NULL)) : NULL;
        const char *was = json_string_value(json_object_get(head, "settings"));
        for (char *line = nl ? nl + 1 : old + n;
             was && !strcmp(was, settings) && line < old + n && (nl = memchr(line, '\n', old + n - line));
             line = nl + 1) {
            *nl = 0;
            json_t *o = json_loads(line, 0, NULL);
            json_int_t i = json_integer_value(json_object_get(o, "i"));
            const char *t = json_string_value(json_object_get(o, "text"));
            if (t && i >= 0 && i < a->total && !a->text[i]) a->text[i] = pd_strdup(t), a->done++;
            json_decref(o);
        }
        json_decref(head), free(old);
    }
    FILE *w = fopen(partial, "wb");
    if (!w) die("%s: cannot write: %s", partial, strerror(errno));
    partial_line(w, partial, json_pack("{s:s}", "settings", settings));
    for (int i = 0; i < a->total; i++)
        if (a->text[i]) partial_line(w, partial, json_pack("{s:i,s:s}", "i", i, "text", a->text[i]));
    if (a->done) fprintf(stderr, "recipe: %s: %d answers from an earlier run kept\n", partial, a->done);
    return w;
}

/* the prompt's text and the answer's pieces, as one clean UTF-8 string (NULL: none) */
static char *answer_text(const Model *m, const char *prompt_text, const int32_t *tok, int n_prompt, int n) {
    Str t = {0};
    put(&t, "%s", prompt_text);
    for (int k = n_prompt; k < n; k++) {
        size_t len;
        const char *piece = tok_piece(m->tok, tok[k - 1], tok[k], &len);
        if (piece) put(&t, "%.*s", (int)len, piece);
    }
    size_t cn; /* a byte-level token can end inside a character */
    char *clean = utf8_clean(t.s, strlen(t.s), &cn);
    free(t.s);
    return clean;
}

static void answers(const Recipe *r, const char *model, int threads, const char *path) {
    const RecipeAnswers *ra = &r->answers;
    if (!ra->on) die("%s: the recipe has no 'answers' section", r->file);
    Model m;
    tool_model_load(&m, model);
    if (model_threads(threads)) die("cannot start %d threads", threads);
    /* every prompt, encoded; those the context cannot hold with one token of answer are left out */
    char **prompts[RECIPE_MAX_DATASETS];
    int n[RECIPE_MAX_DATASETS], total = 0, ctx = 1;
    for (int i = 0; i < ra->n; i++) {
        if (recipe_prompts(&ra->ds[i], &prompts[i], &n[i])) die_lib();
        total += n[i];
    }
    int32_t **ids = pd_alloc(sizeof *ids * total);
    int *n_ids = pd_alloc(sizeof(int) * total), *max_new = pd_alloc(sizeof(int) * total);
    char **ptext = pd_alloc(sizeof(char *) * total);
    if (!ids || !n_ids || !max_new || !ptext) die_lib();
    for (int i = 0, at = 0; i < ra->n; i++)
        for (int j = 0; j < n[i]; j++, at++) {
            const RecipeDataset *ds = &ra->ds[i];
            int bos;
            if (!(ptext[at] = recipe_prompt_text(&m, ds, prompts[i][j], &bos)) ||
                recipe_encode(&m, ds, prompts[i][j], &ids[at], &n_ids[at]))
                die_lib();
            max_new[at] = ds->max_new < m.c.seq_len - n_ids[at] ? ds->max_new : m.c.seq_len - n_ids[at];
            if (max_new[at] >= 1 && n_ids[at] + max_new[at] > ctx) ctx = n_ids[at] + max_new[at];
        }
    Answers a = {pd_alloc(sizeof(char *) * total), total, 0};
    char partial[4200], *settings = answer_settings(r, model);
    snprintf(partial, sizeof partial, "%s.partial", path);
    if (!a.text || !settings) die_lib();
    FILE *pf = resume(&a, partial, settings);

    EngineOptions eo = {.parallel = ra->parallel, .ctx = ctx, .block_size = 16, .prefill_chunk = 512, .continuous = 1};
    eo.kv_blocks = ra->parallel * ((ctx + 15) / 16);
    Engine *e = engine_new(&m, &eo);
    if (!e) die_lib();
    Job **jobs = pd_alloc(sizeof(Job *) * total);
    if (!jobs) die_lib();
    int skipped = 0;
    for (int i = 0; i < total; i++) {
        JobOptions jo = {.max_new = max_new[i],
                         .temp = ra->temp,
                         .top_p = 1,
                         .seed = (uint64_t)ra->seed + i,
                         .method = "standard",
                         .logprobs = -1};
        jobs[i] = a.text[i] || max_new[i] < 1 ? NULL : engine_submit(e, ids[i], n_ids[i], &jo, NULL);
        if (!a.text[i] && !jobs[i]) skipped++; /* too long for the context: left out */
    }
    Progress pg;
    int kept = a.done;
    progress_begin(&pg, "recipe: answers", total - kept - skipped);
    int64_t base = engine_stats(e).gen_tokens, tokens = 0;
    for (int i = 0; i < total; i++) {
        if (!jobs[i]) continue;
        const char *finish = NULL;
        while (!finish) {
            job_wait(e, jobs[i], INT32_MAX, 0.25, &finish);
            EngineStats st = engine_stats(e);
            progress_rate(&pg, st.gen_tokens - base, "tok");
            progress_step(&pg, a.done - kept);
        }
        if (strcmp(finish, "stop") && strcmp(finish, "length"))
            die("answers: prompt %d: the engine says %s", i, finish);
        int nt = job_prompt_len(jobs[i]) + job_wait(e, jobs[i], INT32_MAX, 0, &finish);
        tokens += nt - job_prompt_len(jobs[i]);
        char *clean = answer_text(&m, ptext[i], job_tokens(jobs[i]), job_prompt_len(jobs[i]), nt);
        job_release(e, jobs[i]);
        /* text JSON cannot hold: left out */
        if (clean && partial_line(pf, partial, json_pack("{s:i,s:s}", "i", i, "text", clean)))
            a.text[i] = clean, clean = NULL, a.done++;
        free(clean);
        progress_step(&pg, a.done - kept);
    }
    progress_end(&pg);
    int64_t prompt_tokens = engine_stats(e).prompt_tokens;
    engine_free(e);
    fclose(pf);
    Str out = {0};
    int written = 0;
    for (int i = 0; i < total; i++) {
        if (!a.text[i]) continue;
        json_t *o = json_pack("{s:s}", "text", a.text[i]);
        char *line = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
        if (line) put(&out, "%s\n", line), written++;
        free(line), json_decref(o);
    }
    if (!written) die("%s: no prompt fits the model's context of %d tokens", r->file, m.c.seq_len);
    size_t pl = strlen(path), bytes = out.n;
    char *data = out.s;
    if (pl >= 4 && !strcmp(path + pl - 4, ".zst")) { /* FILE.jsonl.zst: zstd-compressed */
        size_t cap = ZSTD_compressBound(out.n);
        if (!(data = pd_alloc(cap))) die_lib();
        bytes = ZSTD_compress(data, cap, out.s, out.n, 9);
        if (ZSTD_isError(bytes)) die("%s: zstd: %s", path, ZSTD_getErrorName(bytes));
    }
    AtomicFile af;
    if (atomic_open(&af, path)) die_lib();
    if (fwrite(data, 1, bytes, af.f) != bytes) {
        atomic_abort(&af);
        die("%s: cannot write: %s", path, strerror(errno));
    }
    if (atomic_commit(&af)) die_lib();
    if (data != out.s) free(data);
    free(out.s);
    unlink(partial);
    fprintf(stderr,
            "recipe: %s: %d answers (%d left out: too long), %lld tokens generated this run (%lld prompt tokens, %s)\n",
            path, written, skipped, (long long)tokens, (long long)prompt_tokens, ra->temp > 0 ? "sampled" : "greedy");
    for (int i = 0; i < total; i++) free(ids[i]), free(ptext[i]), free(a.text[i]);
    free(ids), free(n_ids), free(max_new), free(ptext), free(a.text), free(jobs), free(settings);
    for (int i = 0; i < ra->n; i++) recipe_prompts_free(prompts[i], n[i]);
    model_free(&m);
}

/* ---- main ---- */

int main(int argc, char **argv) {
    tool_name = "recipe";
    const char *o = NULL, *out = NULL, *stamps = NULL, *model = NULL, *pos[2];
    int threads = 0;
    Flag t[] = {
        {"-o, --output", "FILE", "required by rules and answers", "rules: the make rules; answers: the jsonl",
         F_STR(&o)},
        {"--out", "DIR", "out/NAME", "rules: where the pipeline's outputs go", F_STR(&out)},
        {"--stamps", "DIR", "build/recipe/NAME", "rules: the stages' settings stamps", F_STR(&stamps)},
        {"-m, --model", "MODEL", "required by answers", "answers: the model that answers", F_STR(&model)},
        MODEL_FLAGS{"-t, --threads", "N", "the recipe's", "answers: threads", F_INT(&threads, 1, 64)},
    };
    int n_pos = flags_parse(t, N_FLAGS(t), argc, argv, pos, 2, USAGE, MEMORY);
    if (n_pos < 1) usage("a command (check, rules or answers)");
    if (strcmp(pos[0], "check") && strcmp(pos[0], "rules") && strcmp(pos[0], "answers"))
        die("%s: unknown command (check, rules or answers)", pos[0]);
    if (n_pos < 2) usage("RECIPE");
    const char *cmd = pos[0], *file = pos[1];
    if (strcmp(cmd, "answers") && (model || threads)) die("%s: only answers takes a model", model ? "-m" : "-t");
    if (!strcmp(cmd, "check") && (o || out || stamps)) die("check: it writes nothing (no -o, --out or --stamps)");
    if (!strcmp(cmd, "answers") && (out || stamps)) die("answers: --out and --stamps are for rules");
    Recipe r;
    if (recipe_load(&r, file)) die_lib();
    char dflt_out[512], dflt_stamps[512];
    snprintf(dflt_out, sizeof dflt_out, "out/%s", r.name);
    snprintf(dflt_stamps, sizeof dflt_stamps, "build/recipe/%s", r.name);
    if (!strcmp(cmd, "check")) {
        printf("%s: model %s, %s%s%s%s%s%d methods on %d datasets\n", file,
               r.model.source ? r.model.source : "(random weights)", r.answers.on ? "answers, " : "",
               r.exit.on ? "exit heads, " : "", r.draft.on ? "draft, " : "", r.medusa.on ? "medusa heads, " : "",
               r.eagle.on ? "eagle head, " : "", r.dec.n_methods, r.n_datasets);
    } else if (!strcmp(cmd, "rules")) {
        if (!o) usage("-o FILE");
        rules(&r, out ? out : dflt_out, stamps ? stamps : dflt_stamps, o);
    } else if (!strcmp(cmd, "answers")) {
        if (!o) usage("-o FILE");
        if (!model) usage("-m MODEL");
        answers(&r, model, threads ? threads : r.threads, o);
    } else die("unknown command '%s' (usage: recipe %s)", cmd, USAGE);
    recipe_free(&r);
    return 0;
}
