/* test_recipe — recipe_parse: good recipes give the values they spell out (and the
   documented defaults); every kind of bad recipe gives exactly one line naming the file,
   the line and the key; truncations and mutations of a recipe never crash (run under
   ASan by make SAN=1); templates and prompts render as documented. Data files come from
   the data folders (pd_data_path), as the recipes find them. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "check.h"
#include "fixture.h"
#include "recipe/recipe.h"

static const char *GOOD = "# a comment\n"
                          "about: a test recipe\n"
                          "threads: 2\n"
                          "model:\n"
                          "  source: models/stories260K/stories260K.bin\n"
                          "  tokenizer: models/stories260K/tok512.bin\n"
                          "  dtype: bf16\n"
                          "answers:\n"
                          "  datasets: [spec_bench, {name: mt_bench, samples: 5}]\n"
                          "  samples: 7\n"
                          "  max_new: 50\n"
                          "exit_heads:\n"
                          "  layers: [1, 3, 4]\n"
                          "  data: datasets/tinystories/tinystories_val_sample.txt.gz\n"
                          "  steps: 120\n"
                          "  check_vocab: 64\n"
                          "  lr: 0.01\n"
                          "  seq_len: 64\n"
                          "  norm: 1\n"
                          "draft:\n"
                          "  layer: 3\n"
                          "medusa:\n"
                          "  heads: 2\n"
                          "  data: answers\n"
                          "  own_lm_head: yes\n"
                          "  loss_weights: 1, 0.5\n"
                          "  generate: 16\n"
                          "decoding:\n"
                          "  methods: [adadecode, medusa, speculative, prompt-lookup]\n"
                          "  gamma: 0.7\n"
                          "  oracle: [0, 0.5, 1]\n"
                          "  repeat: 3\n"
                          "datasets:\n"
                          "  - xsum\n"
                          "  - name: humaneval\n"
                          "    samples: 4\n"
                          "    chat: true\n"
                          "    gamma: 0.85\n"
                          "  - name: mine\n"
                          "    file: datasets/gsm8k/test.jsonl.gz\n"
                          "    template: 'Q: {question:20}'\n";

static int ends_with(const char *s, const char *suffix) {
    size_t n = s ? strlen(s) : 0, k = strlen(suffix);
    return s && n >= k && !strcmp(s + n - k, suffix);
}

static void good(void) {
    Recipe r;
    int rc = recipe_parse(&r, GOOD, strlen(GOOD), "recipes/good.yaml");
    CHECK(rc == 0, "the good recipe: %s", pd_errmsg());
    if (rc) return;
    CHECK(!strcmp(r.name, "good") && !strcmp(r.file, "recipes/good.yaml"), "name %s", r.name);
    CHECK(!strcmp(r.about, "a test recipe") && r.threads == 2, "about, threads");
    CHECK(ends_with(r.model.source, "models/stories260K/stories260K.bin"), "source %s", r.model.source);
    CHECK(ends_with(r.model.tokenizer, "models/stories260K/tok512.bin"), "tokenizer");
    CHECK(!strcmp(r.model.dtype, "bf16") && !r.model.random_config, "dtype");
    CHECK(r.answers.on && r.answers.n == 2, "answers");
    CHECK(!strcmp(r.answers.ds[0].name, "spec_bench") && r.answers.ds[0].samples == 7 &&
              r.answers.ds[0].max_new == 50 && r.answers.ds[0].chat == 1,
          "answers' defaults");
    CHECK(r.answers.ds[1].samples == 5 && ends_with(r.answers.ds[1].file, "datasets/mt_bench/question.jsonl"),
          "mt_bench");
    CHECK(r.exit.on && !strcmp(r.exit.layers, "1,3,4") && r.exit.steps == 120 && r.exit.lr == 0.01 &&
              r.exit.seq_len == 64 && r.exit.norm == 1 && r.exit.batch == 0 && !r.exit.from_answers &&
              !r.exit.special && r.exit.check_vocab == 64 && !r.draft.heads.check_vocab,
          "exit heads %s", r.exit.layers);
    CHECK(ends_with(r.exit.data, "datasets/tinystories/tinystories_val_sample.txt.gz"), "exit data");
    CHECK(r.draft.on && r.draft.layer == 3 && !r.draft.own_heads, "draft: exit_heads' head at 3 serves (norm 1)");
    CHECK(r.medusa.on && r.medusa.heads == 2 && r.medusa.from_answers && !r.medusa.data && r.medusa.own_lm_head &&
              r.medusa.special && r.medusa.generate == 16 && !strcmp(r.medusa.loss_weights, "1,0.5"),
          "medusa (special: chat answers)");
    CHECK(r.dec.n_methods == 5 && !strcmp(r.dec.methods[0], "standard") && !strcmp(r.dec.methods[1], "adadecode") &&
              !strcmp(r.dec.methods[4], "prompt-lookup"),
          "methods: standard first");
    CHECK(r.dec.n_oracle == 3 && r.dec.oracle[1] == 0.5f && r.dec.oracle[2] == 1 && r.dec.repeat == 3 &&
              r.dec.oracle_samples == 2,
          "oracle");
    CHECK(r.n_datasets == 3, "datasets");
    CHECK(!strcmp(r.ds[0].name, "xsum") && r.ds[0].samples == 10 && r.ds[0].max_new == 128 && !r.ds[0].chat &&
              r.ds[0].gamma == 0.7f && strstr(r.ds[0].tmpl, "{document:1200}"),
          "xsum: defaults, decoding.gamma over the guidance");
    CHECK(r.ds[1].samples == 4 && r.ds[1].chat && r.ds[1].gamma == 0.85f, "humaneval");
    CHECK(!strcmp(r.ds[2].name, "mine") && !strcmp(r.ds[2].tmpl, "Q: {question:20}"), "own dataset");
    recipe_free(&r);

    /* the seed guidance for γ when the recipe gives none; default methods */
    const char *g2 = "model: {source: models/stories260K/stories260K.bin}\n"
                     "exit_heads: {data: datasets/tinystories/tinystories_val_sample.txt.gz}\n"
                     "datasets: [xsum, humaneval, gsm8k, tinystories]\n";
    rc = recipe_parse(&r, g2, strlen(g2), "g2.yaml");
    CHECK(rc == 0, "g2: %s", pd_errmsg());
    if (!rc) {
        CHECK(r.ds[0].gamma == 0.65f && r.ds[1].gamma == 0.85f && r.ds[2].gamma == 0.9f && r.ds[3].gamma == 0.65f,
              "γ guidance");
        CHECK(!strcmp(r.exit.layers, "auto") && r.exit.norm == -1, "exit defaults");
        int ada = 0, med = 0;
        for (int i = 0; i < r.dec.n_methods; i++)
            ada |= !strcmp(r.dec.methods[i], "adadecode"), med |= !strcmp(r.dec.methods[i], "medusa");
        CHECK(ada && !med && !strcmp(r.dec.methods[0], "standard"),
              "default methods: what the recipe trains heads for");
        recipe_free(&r);
    }

    /* environment variables, with a default; a draft with a head of its own */
    setenv("PD_TEST_MODEL_DIR", "models/stories260K", 1);
    const char *g3 = "model:\n  source: $PD_TEST_MODEL_DIR/stories260K.bin\n  tokenizer: "
                     "${PD_TEST_UNSET_X:-models}/stories260K/tok512.bin\n"
                     "exit_heads: {data: datasets/tinystories/tinystories_val_sample.txt.gz, steps: 9, norm: auto}\n"
                     "draft: {layer: 2, steps: 5}\n"
                     "datasets: [{name: tinystories, template: '{{ {text:3w} }}'}]\n";
    unsetenv("PD_TEST_UNSET_X");
    rc = recipe_parse(&r, g3, strlen(g3), "g3.yaml");
    CHECK(rc == 0, "g3: %s", pd_errmsg());
    if (!rc) {
        CHECK(ends_with(r.model.source, "models/stories260K/stories260K.bin") &&
                  ends_with(r.model.tokenizer, "tok512.bin"),
              "env");
        CHECK(r.draft.own_heads && r.draft.heads.norm == 1 && !strcmp(r.draft.heads.layers, "2") &&
                  r.draft.heads.steps == 5 && ends_with(r.draft.heads.data, "tinystories_val_sample.txt.gz"),
              "draft head of its own, data from exit_heads");
        char **ps;
        int n;
        RecipeDataset d = r.ds[0];
        d.samples = 3;
        CHECK(recipe_prompts(&d, &ps, &n) == 0 && n == 3, "three prompts: %s", pd_errmsg());
        for (int i = 0; i < n; i++) {
            int words = 0;
            for (const char *s = ps[i]; *s; s++) words += *s == ' ';
            CHECK(!strncmp(ps[i], "{ ", 2) && ends_with(ps[i], " }") && words == 4, "prompt '%s': braces and 3 words",
                  ps[i]);
        }
        recipe_prompts_free(ps, n);
        /* the split: the datasets' prompts are its evaluation part, the training part
           holds the others; together every record, each once */
        CHECK(r.split == 20 && r.ds[0].part == RECIPE_EVAL && r.ds[0].eval_pct == 20, "split 20%% by default");
        char **all, **ev, **tr;
        int na, ne, nt;
        d.samples = 100000;
        d.part = RECIPE_ALL;
        int ok = !recipe_prompts(&d, &all, &na);
        d.part = RECIPE_EVAL;
        ok = ok && !recipe_prompts(&d, &ev, &ne);
        d.part = RECIPE_TRAIN;
        ok = ok && !recipe_prompts(&d, &tr, &nt);
        /* ⌈20 % of the records⌉ (more only for prompts that tie at the cut), those of the
           smallest hashes */
        CHECK(ok && ne + nt == na && ne >= (na * 20 + 99) / 100 && ne < na * 3 / 10, "split: %d + %d of %d records", ne,
              nt, na);
        uint64_t max_e = 0, min_t = UINT64_MAX;
        for (int i = 0, e = 0, t = 0; ok && i < na; i++) { /* both parts keep the file's order */
            int in_e = e < ne && !strcmp(all[i], ev[e]), in_t = t < nt && !strcmp(all[i], tr[t]);
            e += in_e, t += in_t;
            uint64_t h = XXH64(all[i], strlen(all[i]), 0);
            if (in_e && h > max_e) max_e = h;
            if (in_t && h < min_t) min_t = h;
            if (in_e + in_t != 1) {
                CHECK(0, "record %d ('%s') in %d parts", i, all[i], in_e + in_t);
                break;
            }
        }
        CHECK(max_e < min_t, "split: an evaluation prompt's hash %llx is not below every training prompt's %llx",
              (unsigned long long)max_e, (unsigned long long)min_t);
        if (ok) recipe_prompts_free(all, na), recipe_prompts_free(ev, ne), recipe_prompts_free(tr, nt);
        d.eval_pct = 0, d.part = RECIPE_EVAL;
        CHECK(recipe_prompts(&d, &ps, &n) == -1 && strstr(pd_errmsg(), "none of its records is in the evaluation part"),
              "split 0: no evaluation part (%s)", pd_errmsg());
        recipe_free(&r);
    }

    /* MT-Bench's 80 questions, 25 % held out: exactly 20 (a hash modulo 100 gave 18) */
    const char *g5 =
        "model:\n  source: $PD_TEST_MODEL_DIR/stories260K.bin\n  tokenizer: models/stories260K/tok512.bin\n"
        "split: 25\ndatasets: [mt_bench]\n";
    if (recipe_parse(&r, g5, strlen(g5), "g5.yaml") == 0) {
        char **ps;
        int n;
        RecipeDataset d = r.ds[0];
        d.samples = 1000;
        if (recipe_prompts(&d, &ps, &n) == 0) {
            CHECK(n == 20, "mt_bench, split 25: %d evaluation prompts", n);
            recipe_prompts_free(ps, n);
        } else printf("SKIP test_recipe: mt_bench: %s\n", pd_errmsg());
        recipe_free(&r);
    } else CHECK(0, "g5: %s", pd_errmsg());

    /* random weights: the config mapping becomes JSON */
    const char *g4 =
        "model:\n  tokenizer: models/stories260K/tok512.bin\n  random:\n    seed: 3\n    config:\n"
        "      hidden_size: 8\n      intermediate_size: 16\n      num_hidden_layers: 2\n      num_attention_heads: 2\n"
        "      num_key_value_heads: 1\n      head_dim: 4\n      vocab_size: 512\n      max_position_embeddings: 64\n"
        "      rms_norm_eps: 1.0e-5\n      rope_theta: 10000\n      tie_word_embeddings: true\n"
        "datasets: [tinystories]\n";
    rc = recipe_parse(&r, g4, strlen(g4), "g4.yaml");
    CHECK(rc == 0, "g4: %s", pd_errmsg());
    if (!rc) {
        CHECK(!r.model.source && r.model.random_seed == 3 && r.model.random_config &&
                  strstr(r.model.random_config, "\"architecture\":\"llama\"") &&
                  strstr(r.model.random_config, "\"hidden_size\":8") &&
                  strstr(r.model.random_config, "\"tie_word_embeddings\":true"),
              "random config %s", r.model.random_config);
        recipe_free(&r);
    }
}

/* a recipe made of BASE with one line replaced (or added at the end when line is 0) */
static const char *BASE = "model:\n"                                                     /* 1 */
                          "  source: models/stories260K/stories260K.bin\n"               /* 2 */
                          "  tokenizer: models/stories260K/tok512.bin\n"                 /* 3 */
                          "exit_heads:\n"                                                /* 4 */
                          "  layers: [1, 2]\n"                                           /* 5 */
                          "  data: datasets/tinystories/tinystories_val_sample.txt.gz\n" /* 6 */
                          "  steps: 10\n"                                                /* 7 */
                          "decoding:\n"                                                  /* 8 */
                          "  methods: [adadecode]\n"                                     /* 9 */
                          "datasets:\n"                                                  /* 10 */
                          "  - name: tinystories\n"                                      /* 11 */
                          "    samples: 2\n";                                            /* 12 */

static void expect(const char *text, const char *want, int line) {
    Recipe r;
    int rc = recipe_parse(&r, text, strlen(text), "bad.yaml");
    const char *msg = pd_errmsg();
    CHECK(rc == -1, "line %d: accepted (want '%s')", line, want);
    if (rc == 0) return recipe_free(&r);
    CHECK(!strncmp(msg, want, strlen(want)), "line %d:\n  got  '%s'\n  want '%s...'", line, msg, want);
    CHECK(!strchr(msg, '\n'), "one line: '%s'", msg);
}

static void bad_line(int line, const char *replace, const char *want) {
    char buf[4096] = "";
    const char *s = BASE;
    for (int l = 1; *s; l++) {
        const char *e = strchr(s, '\n') + 1;
        if (l == line) strcat(buf, replace);
        else strncat(buf, s, e - s);
        s = e;
    }
    if (!line) strcat(buf, replace);
    expect(buf, want, line);
}

static void bad_cases(void) {
    Recipe r;
    CHECK(recipe_parse(&r, BASE, strlen(BASE), "bad.yaml") == 0, "BASE parses: %s", pd_errmsg());
    recipe_free(&r);
    bad_line(7, "  stepz: 10\n", "bad.yaml:7: key 'stepz': unknown key in exit_heads (known: layers, data,");
    bad_line(7, "  steps: many\n", "bad.yaml:7: key 'steps': 'many' is not a whole number in [1, 10000000]");
    bad_line(7, "  steps: [1, 2]\n", "bad.yaml:7: key 'steps': must be a whole number, not a list");
    bad_line(7, "  steps: 0\n", "bad.yaml:7: key 'steps': '0' is not a whole number in [1, 10000000]");
    bad_line(7, "  steps: 10\n  steps: 11\n", "bad.yaml:8: key 'steps': given twice in exit_heads (first on line 7)");
    bad_line(6, "  data: datasets/nope.txt\n", "bad.yaml:6: key 'data': 'datasets/nope.txt' does not exist (nor under");
    bad_line(6, "  data: /nonexistent/x.txt\n", "bad.yaml:6: key 'data': '/nonexistent/x.txt' does not exist");
    bad_line(6, "  data: answers\n", "bad.yaml:6: key 'data': 'answers' needs an 'answers' section");
    bad_line(2, "  source: $PD_TEST_UNSET_VAR/model.bin\n", "bad.yaml:2: key 'source': $PD_TEST_UNSET_VAR is not set");
    bad_line(2, "  source: ${PD_TEST_UNSET_VAR\n", "bad.yaml:2: key 'source': a ${...} that does not close");
    bad_line(2, "  source: models/stories260K\n  hint: get it from X\n  dtype: f16\n",
             "bad.yaml:4: key 'dtype': 'f16' is not f32 or bf16");
    bad_line(2, "  hint: set PD_TEST_CKPT to your checkpoint\n  source: $PD_TEST_UNSET_VAR\n",
             "bad.yaml:3: key 'source': $PD_TEST_UNSET_VAR is not set: set PD_TEST_CKPT to your checkpoint");
    bad_line(5, "  layers: [2, 1]\n", "bad.yaml:5: key 'layers': must increase (1 after 2)");
    bad_line(5, "  layers: [1, two]\n", "bad.yaml:5: key 'layers': 'two' is not a whole number");
    bad_line(9, "  methods: [adadecode, medusa]\n", "bad.yaml:9: key 'methods': 'medusa' needs a 'medusa' section");
    bad_line(9, "  methods: [warp-drive]\n", "bad.yaml:9: key 'methods': unknown method 'warp-drive' (known: standard");
    bad_line(9, "  methods: [adadecode, adadecode]\n", "bad.yaml:9: key 'methods': 'adadecode' twice");
    bad_line(9, "  oracle: [0.5, 2]\n", "bad.yaml:9: key 'oracle': '2' is not a number in [0, 1]");
    bad_line(9, "  adaptive: maybe\n", "bad.yaml:9: key 'adaptive': 'maybe' is not true or false");
    bad_line(9, "  gamma: 1.5\n", "bad.yaml:9: key 'gamma': '1.5' is not a number in [1e-06, 1]");
    bad_line(11, "  - name: squad\n",
             "bad.yaml:11: key 'name': unknown dataset 'squad' (known: xsum, humaneval, gsm8k");
    bad_line(11, "  - name: mine\n    file: datasets/nope.jsonl\n",
             "bad.yaml:12: key 'file': 'datasets/nope.jsonl' does not exist");
    bad_line(12, "    template: '{document'\n", "bad.yaml:12: key 'template': a '{' without its '}'");
    bad_line(12, "    template: 'no field'\n", "bad.yaml:12: key 'template': names no field");
    bad_line(12, "    template: '{x:0}'\n", "bad.yaml:12: key 'template': a limit is between 1 and 1000000");
    bad_line(12, "    samples: 2\n  - tinystories\n",
             "bad.yaml:13: key 'datasets': dataset 'tinystories' twice (first on line 11)");
    bad_line(10, "datasets:\n  - [xsum]\n",
             "bad.yaml:11: key 'datasets': an item must be a dataset's name or a mapping");
    bad_line(12, "    samples: [2]\n", "bad.yaml:12: key 'samples': must be a whole number, not a list");
    bad_line(10, "datasets:\n  -\n", "bad.yaml:11: key 'name': is empty");
    bad_line(0, "medusa:\n  heads: 9\n", "bad.yaml:14: key 'heads': '9' is not a whole number in [1, 8]");
    bad_line(0, "medusa:\n  data: datasets/tinystories/tinystories_val_sample.txt.gz\n",
             "bad.yaml:13: key 'medusa': needs 'heads'");
    expect("model: {source: models/stories260K/stories260K.bin}\ndraft:\n  layer: 2\ndatasets: [xsum]\n",
           "bad.yaml:3: key 'layer': a draft from layer 2 needs its head's 'data'", 0);
    bad_line(7, "  check_vocab: 0\n", "bad.yaml:7: key 'check_vocab': '0' is not a whole number in [1, 1048576]");
    bad_line(0, "split: 95\n", "bad.yaml:13: key 'split': '95' is not a whole number in [0, 90]");
    bad_line(0, "answers: {datasets: [gsm8k], temp: 3}\n", "bad.yaml:13: key 'temp': '3' is not a number in [0, 2]");
    bad_line(0, "answers: {datasets: [gsm8k], parallel: 0}\n",
             "bad.yaml:13: key 'parallel': '0' is not a whole number in [1, 256]");
    bad_line(0, "extra: 1\n",
             "bad.yaml:13: key 'extra': unknown key in the recipe (known: about, threads, split, model,");
    bad_line(0, "draft: {layer: 1, source: models/stories260K/stories260K.bin}\n",
             "bad.yaml:13: key 'draft': needs either");
    expect("model: a string\ndatasets: [xsum]\n", "bad.yaml:1: key 'model': must be a mapping", 0);
    bad_line(3, "  random: {seed: 1}\n", "bad.yaml:3: key 'random': 'source' and 'random' exclude each other");
    bad_line(7, "  steps: 10\n  norm: 2\n", "bad.yaml:8: key 'norm': must be auto, 0 or 1");
    bad_line(7, "  steps: 10\n    oops: 1\n", "bad.yaml:8: key '(yaml)': mapping values are not allowed");
    bad_line(7, "  steps: \"10\n", "bad.yaml:");
    bad_line(0, "---\nmodel: {}\n", "bad.yaml:13: key '(yaml)': more than one YAML document");
    expect("", "bad.yaml:1: key '(top)': the recipe is empty", 0);
    expect("- a\n- b\n", "bad.yaml:1: key '(top)': a recipe is a mapping", 0);
    expect("datasets: [xsum]\n", "bad.yaml:1: key 'model': missing", 0);
    expect("model: {source: models/stories260K/stories260K.bin}\n", "bad.yaml:1: key 'datasets': missing", 0);
    expect("model: {tokenizer: models/stories260K/tok512.bin, random: {config: {hidden_size: 8}}}\ndatasets: [xsum]\n",
           "bad.yaml:1: key 'config': config: ", 0);
    /* a recipe's name names out/NAME/ */
    CHECK(recipe_parse(&r, BASE, strlen(BASE), "recipes/a b.yaml") == -1 &&
              strstr(pd_errmsg(), "a recipe's name is letters"),
          "a name with a space: %s", pd_errmsg());
}

/* truncations at every byte and random byte mutations: parse or refuse, never crash,
   and a refusal is one line naming the file */
static void fuzz(void) {
    size_t n = strlen(GOOD);
    char *buf = malloc(n + 64);
    int ok = 0, refused = 0, badmsg = 0;
    for (size_t cut = 0; cut <= n; cut++) {
        memcpy(buf, GOOD, cut);
        Recipe r;
        if (!recipe_parse(&r, buf, cut, "fuzz.yaml")) ok++, recipe_free(&r);
        else refused++, badmsg += strncmp(pd_errmsg(), "fuzz.yaml:", 10) != 0 || strchr(pd_errmsg(), '\n') != NULL;
    }
    uint64_t x = 88172645463325252ULL;
    static const char alphabet[] = "{}[]:,-#&*!|>'\"%@` \n\t\\0x9aZ$~?";
    for (int it = 0; it < 3000; it++) {
        memcpy(buf, GOOD, n);
        size_t len = n;
        for (int k = 0; k < 1 + it % 4; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            size_t at = x % len;
            int what = (x >> 32) % 3;
            char c = (x >> 40) % 4 ? alphabet[(x >> 44) % (sizeof alphabet - 1)] : (char)(x >> 48);
            if (what == 0) buf[at] = c;
            else if (what == 1 && len > 1) memmove(buf + at, buf + at + 1, len - at - 1), len--;
            else if (len < n + 60) memmove(buf + at + 1, buf + at, len - at), buf[at] = c, len++;
        }
        Recipe r;
        if (!recipe_parse(&r, buf, len, "fuzz.yaml")) ok++, recipe_free(&r);
        else refused++, badmsg += strncmp(pd_errmsg(), "fuzz.yaml:", 10) != 0 || strchr(pd_errmsg(), '\n') != NULL;
    }
    /* an alias cycle and a billion laughs in random.config stay bounded */
    const char *laughs =
        "model:\n  tokenizer: models/stories260K/tok512.bin\n  random:\n    config: &a\n      x: [*a, *a, *a]\n"
        "datasets: [xsum]\n";
    Recipe r;
    CHECK(recipe_parse(&r, laughs, strlen(laughs), "fuzz.yaml") == -1, "alias cycle refused");
    CHECK(ok > 0 && refused > 0, "fuzz: %d parsed, %d refused", ok, refused);
    CHECK(badmsg == 0, "fuzz: %d refusals without a 'fuzz.yaml:' one-line message", badmsg);
    free(buf);
}

static void templates(void) {
    json_t *o = json_pack("{s:s, s:[s,s], s:i}", "document", "héllo wörld", "turns", "first", "second", "n", 42);
    char *s = recipe_render("A: {document:2}|{document:3}|{turns}|{n}|{{x}}", o, NULL, "t");
    CHECK(s && !strcmp(s, "A: h|h\xc3\xa9|first|42|{x}"), "render: UTF-8 cuts, array, number, braces: '%s'",
          s ? s : pd_errmsg());
    free(s);
    s = recipe_render("{document:1w}", o, NULL, "t");
    CHECK(s && !strcmp(s, "héllo"), "one word: '%s'", s ? s : "");
    free(s);
    s = recipe_render("{missing}", o, NULL, "t");
    CHECK(!s && strstr(pd_errmsg(), "no text field 'missing'"), "missing field: %s", pd_errmsg());
    s = recipe_render("{text:2w} ...", NULL, "  once   upon\n a time", "t");
    CHECK(s && !strcmp(s, "once upon ..."), "plain text words: '%s'", s ? s : "");
    free(s);
    CHECK(!recipe_render("{text", NULL, "x", "t"), "a bad template is refused");
    json_decref(o);
}

int main(void) {
    /* the recipes here name these datasets, and a recipe's files must exist */
    static const char *const data[] = {"datasets/tinystories/tinystories_val_sample.txt.gz",
                                       "datasets/gsm8k/test.jsonl.gz",
                                       "datasets/spec_bench/question.jsonl.gz",
                                       "datasets/mt_bench/question.jsonl",
                                       "datasets/xsum/test_1000.jsonl.gz",
                                       "datasets/humaneval/HumanEval.jsonl.gz"};
    int have = 1;
    for (size_t i = 0; i < sizeof data / sizeof *data && have; i++)
        have = test_data("parsing recipes (good, bad and fuzzed; templates still run)", data[i]) != NULL;
    if (have) {
        good();
        bad_cases();
        fuzz();
    }
    templates();
    return check_done("recipe");
}
