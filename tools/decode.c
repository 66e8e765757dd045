/* decode — generate text with any decoding method.
   bin/decode -m MODEL -p PROMPT -n N [--temp T] [--top-k K] [--top-p P] [--seed S]
              [-t THREADS] [--method NAME] [--json] [--chat ...] [method options]
   stdout: the prompt and the generated text (or one JSON object with --json);
   stderr: one summary line. */
#include <jansson.h>
#include <time.h>

#include "chat.h"
#include "decode.h"
#include "tool.h"

#define USAGE "-m MODEL -p PROMPT -n N [--temp T] [--top-k K] [--top-p P] [--seed S] [-t THREADS] " \
              "[--method NAME] [--json] [--chat [--chat-format llama3|llama2|chatml] [--system TEXT]] " \
              "[--heads FILE] [--gamma G] [--max-pending K] [--exit-layer L] [--draft MODEL] [--draft-min K] " \
              "[--draft-max K] [--draft-fixed] [--tree PATHS] " \
              "[--fixed-tree] [--ngram-max N] [--window W] [--ngram N] [--guess G] [--adaptive] " \
              "[--oracle-exit RATE | --oracle-acceptance A] [--dump-logits FILE]"

#define MEMORY "memory: about " MEMORY_MODEL "\n        + " MEMORY_KV("2") "\n" \
               "        + vocabulary-sized buffers per drafted token; --heads adds the heads' weights twice, --draft the\n" \
               "        draft model's weights twice and its own KV cache (1 × its ctx × layers × kv_dim × 8 bytes).\n"

typedef struct {
    const char *model, *prompt, *method, *chat_format, *system, *heads, *dump;
    int chat, json, n, top_k, threads;
    double temp, top_p, oracle;
    unsigned long long seed;
    MethodOptions opt;
    const char *draft; /* speculative: the draft model */
} Args;

typedef struct {
    Model *m;
    int json;
    const char *prompt; /* printed before the first token, so a failing method prints nothing */
} Out;

static int print_piece(void *ctx, int prev, int token) {
    Out *o = ctx;
    if (o->json) return 0;
    if (o->prompt) fputs(o->prompt, stdout), o->prompt = NULL;
    size_t len;
    const char *p = tok_piece(o->m->tok, prev, token, &len);
    if (p) fwrite(p, 1, len, stdout);
    fflush(stdout);
    return 0;
}

/* the generated text exactly as streaming prints it after the prompt */
static char *generated_text(DecodeCtx *d, int prev, size_t *len) {
    size_t cap = 64, n = 0;
    char *s = malloc(cap);
    for (int i = 0; s && i < d->n_out; prev = d->out[i++]) {
        size_t pl;
        const char *p = tok_piece(d->m->tok, prev, d->out[i], &pl);
        if (!p) continue;
        while (n + pl + 1 > cap) s = realloc(s, cap *= 2);
        if (s) memcpy(s + n, p, pl), n += pl;
    }
    if (!s) die("out of memory");
    s[n] = 0;
    *len = n;
    return s;
}

/* tokens per target pass after the prompt */
static double tau(const DecodeCtx *d) { return d->n_out / (d->target_passes - d->prefill_passes + 1e-12); }

static void print_json(DecodeCtx *d, const int32_t *prompt, int n_prompt) {
    size_t len;
    char *text = generated_text(d, prompt[n_prompt - 1], &len);
    json_t *ids = json_array();
    for (int i = 0; i < d->n_out; i++) json_array_append_new(ids, json_integer(d->out[i]));
    json_t *o = json_pack("{s:o, s:s%, s:i, s:i, s:f, s:f, s:I, s:f}", "tokens", ids, "text", text, len,
                          "n_prompt", n_prompt, "n_gen", d->n_out, "tok_per_s",
                          d->n_out / (d->t_decode + 1e-12), "prefill_tok_per_s",
                          n_prompt / (d->t_prefill + 1e-12), "target_passes", (json_int_t)d->target_passes,
                          "weight_bytes_per_token", model_weight_bytes(d->m));
    if (o && !d->opt.heads && d->pending_n) { /* a drafter's: tokens per target pass, acceptance per depth */
        json_t *acc = json_array();
        for (int j = 0; j < MAX_EXIT_HEADS && d->reached[j]; j++)
            json_array_append_new(acc, json_real(d->early[j] / (d->reached[j] + 1e-12)));
        json_object_set_new(o, "tau", json_real(tau(d)));
        json_object_set_new(o, "acceptance_per_depth", acc);
        json_object_set_new(o, "mean_tree", json_real(1 + d->pending_sum / (d->pending_n + 1e-12)));
        json_t *sizes = json_object(); /* what the rounds cost depends on their sizes, not on the mean */
        for (int n = 1; n <= MAX_ROUND_NODES; n++) {
            char key[16];
            snprintf(key, sizeof key, "%d", n);
            if (d->rounds_by_nodes[n]) json_object_set_new(sizes, key, json_integer(d->rounds_by_nodes[n]));
        }
        json_object_set_new(o, "rounds_by_nodes", sizes);
    }
    if (o && d->opt.heads) { /* the early-exit statistics of adadecode / self-speculative */
        int L = d->m->c.n_layers;
        json_t *rates = json_object();
        for (int k = 0; k < d->opt.heads->n; k++) {
            char key[16];
            snprintf(key, sizeof key, "%d", d->opt.heads->layer[k]);
            json_object_set_new(rates, key, json_real(d->early[k] / (d->n_out + 1e-12)));
        }
        json_object_set_new(o, "layer_passes_per_token", json_real((d->layer_passes - d->prefill_passes * L) / (d->n_out + 1e-12)));
        json_object_set_new(o, "token_layers_per_token", json_real((d->token_layers - d->prefill_token_layers) / (d->n_out + 1e-12)));
        json_object_set_new(o, "early_rate_per_head_layer", rates);
        json_object_set_new(o, "drafted", json_integer(d->drafted));
        json_object_set_new(o, "rejection_rate", json_real(d->rejected / (d->drafted + 1e-12)));
        json_object_set_new(o, "mean_pending", json_real(d->pending_sum / (d->pending_n + 1e-12)));
    }
    if (!o) die("cannot encode the output as JSON (is the text valid UTF-8?)");
    char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    puts(s);
    free(s);
    free(text);
    json_decref(o);
}

static Args parse(int argc, char **argv) {
    Args a = {.method = "standard", .n = -1, .threads = 1, .temp = 1.0, .top_p = 1.0, .oracle = -1,
              .seed = (unsigned long long)time(NULL)};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "-m")) a.model = arg_next(argc, argv, &i);
        else if (!strcmp(f, "--no-verify")) pd_verify_weights = 0;
        else if (!strcmp(f, "-p")) a.prompt = arg_next(argc, argv, &i);
        else if (!strcmp(f, "-n")) a.n = (int)arg_int(f, arg_next(argc, argv, &i), 1, 1 << 30);
        else if (!strcmp(f, "--temp")) a.temp = arg_num(f, arg_next(argc, argv, &i), 0, 1e6);
        else if (!strcmp(f, "--top-k")) a.top_k = (int)arg_int(f, arg_next(argc, argv, &i), 0, 1 << 30);
        else if (!strcmp(f, "--top-p")) a.top_p = arg_num(f, arg_next(argc, argv, &i), 1e-9, 1);
        else if (!strcmp(f, "--seed")) a.seed = (unsigned long long)arg_int(f, arg_next(argc, argv, &i), 0, 0x7fffffffffffffffL);
        else if (!strcmp(f, "-t")) a.threads = (int)arg_int(f, arg_next(argc, argv, &i), 1, 64);
        else if (!strcmp(f, "--method")) a.method = arg_next(argc, argv, &i);
        else if (!strcmp(f, "--json")) a.json = 1;
        else if (!strcmp(f, "--chat")) a.chat = 1;
        else if (!strcmp(f, "--chat-format")) a.chat_format = arg_next(argc, argv, &i), a.chat = 1;
        else if (!strcmp(f, "--system")) a.system = arg_next(argc, argv, &i);
        else if (!strcmp(f, "--heads")) a.heads = arg_next(argc, argv, &i);
        else if (!strcmp(f, "--gamma")) a.opt.gamma = (float)arg_num(f, arg_next(argc, argv, &i), 1e-6, 1);
        else if (!strcmp(f, "--max-pending")) a.opt.max_pending = (int)arg_int(f, arg_next(argc, argv, &i), 1, 32);
        else if (!strcmp(f, "--exit-layer")) a.opt.exit_layer = (int)arg_int(f, arg_next(argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(f, "--draft-max")) a.opt.draft_max = (int)arg_int(f, arg_next(argc, argv, &i), 1, 127);
        else if (!strcmp(f, "--draft")) a.draft = arg_next(argc, argv, &i);
        else if (!strcmp(f, "--draft-min")) a.opt.draft_min = (int)arg_int(f, arg_next(argc, argv, &i), 1, 127);
        else if (!strcmp(f, "--draft-fixed")) a.opt.draft_fixed = 1;
        else if (!strcmp(f, "--tree")) a.opt.tree = arg_next(argc, argv, &i);
        else if (!strcmp(f, "--fixed-tree")) a.opt.fixed_tree = 1;
        else if (!strcmp(f, "--ngram-max")) a.opt.ngram_max = (int)arg_int(f, arg_next(argc, argv, &i), 1, 8);
        else if (!strcmp(f, "--window")) a.opt.window = (int)arg_int(f, arg_next(argc, argv, &i), 1, 32);
        else if (!strcmp(f, "--ngram")) a.opt.ngram = (int)arg_int(f, arg_next(argc, argv, &i), 2, 8);
        else if (!strcmp(f, "--guess")) a.opt.guess = (int)arg_int(f, arg_next(argc, argv, &i), 1, 64);
        else if (!strcmp(f, "--adaptive")) a.opt.adaptive = 1;
        else if (!strcmp(f, "--oracle-exit") || !strcmp(f, "--oracle-acceptance"))
            a.oracle = arg_num(f, arg_next(argc, argv, &i), 0, 1);
        else if (!strcmp(f, "--dump-logits")) a.dump = arg_next(argc, argv, &i);
        else if (!strcmp(f, "-h") || !strcmp(f, "--help")) help_exit(USAGE, MEMORY);
        else die("unknown flag %s (usage: decode %s)", f, USAGE);
    }
    if (!a.model) usage("-m MODEL");
    if (!a.prompt) usage("-p PROMPT");
    if (a.n < 0) usage("-n N");
    return a;
}

/* --heads FILE (exit heads, Medusa heads, or a bundle's set for the method), or the
   model's own when it is a bundle and the method takes heads; 2 = Medusa, 1 = exit, 0 */
static int load_heads(Args *a, Model *m, ExitHeads *eh, MedusaHeads *mh) {
    int medusa = !strcmp(a->method, "medusa"), rc;
    if (a->heads) {
        TensorFile tf; /* opened once: "-" is read once */
        if (tf_open(&tf, a->heads)) die_lib();
        const char *kind = tf_meta(&tf, "paradec.kind");
        if (kind && strcmp(kind, "bundle")) medusa = !strcmp(kind, "medusa-heads");
        rc = medusa ? medusa_load_tf(mh, &tf, m, a->heads) : heads_load_tf(eh, &tf, m, a->heads);
        tf_close(&tf);
    } else {
        const char *kind = tf_meta(&m->tf, "paradec.kind");
        if (!kind || strcmp(kind, "bundle") || (!medusa && strcmp(a->method, "adadecode") && strcmp(a->method, "self-speculative")))
            return 0;
        rc = medusa ? medusa_load_tf(mh, &m->tf, m, a->model) : heads_load_tf(eh, &m->tf, m, a->model);
    }
    if (rc) die_lib();
    if (medusa) medusa_use_int8(mh), a->opt.medusa = mh;
    else a->opt.heads = eh;
    return medusa ? 2 : 1;
}

/* the prompt's ids: plain (BOS when the vocabulary wants one) or in a chat format */
static int32_t *encode_prompt(const Args *a, const Model *m, int *n_prompt) {
    int32_t *ids;
    if (a->chat) {
        int f = a->chat_format ? chat_format_parse(a->chat_format) : chat_format_detect(m->chat_template), bos;
        char *text = f < 0 ? NULL : chat_apply((ChatFormat)f, m->chat_template, a->system, a->prompt, &bos);
        if (!text || tok_encode_flags(m->tok, text, strlen(text), TOK_SPECIAL | (bos ? TOK_ADD_BOS : 0), &ids, n_prompt))
            die_lib();
        free(text);
    } else if (tok_encode_flags(m->tok, a->prompt, strlen(a->prompt), tok_add_bos(m->tok) ? TOK_ADD_BOS : 0, &ids, n_prompt))
        die_lib();
    if (*n_prompt == 0) die("-p: the prompt is empty and the model takes no BOS");
    if (*n_prompt >= m->c.seq_len) die("-p: the prompt is %d tokens, the model's context holds %d", *n_prompt, m->c.seq_len);
    return ids;
}

/* --oracle-exit: the standard continuation, which the oracle then knows */
static int32_t *standard_continuation(Model *m, KVCache *kv, const Args *a, const int32_t *ids, int n_prompt) {
    Sampler s;
    DecodeCtx d;
    if (sampler_init(&s, m->c.vocab_size, (float)a->temp, a->top_k, (float)a->top_p, a->seed) ||
        decode_init(&d, m, kv, &s, a->n) || decode_method("standard")->generate(&d, ids, n_prompt))
        die_lib();
    int32_t *out = malloc(sizeof(int32_t) * a->n);
    if (!out) die("out of memory");
    memset(out, 0xff, sizeof(int32_t) * a->n);
    memcpy(out, d.out, sizeof(int32_t) * d.n_out);
    decode_free(&d);
    sampler_free(&s);
    return out;
}

int main(int argc, char **argv) {
    tool_name = "decode";
    Args a = parse(argc, argv);
    const DecodeMethod *dm = decode_method(a.method);
    if (!dm) die_lib();
    if (a.oracle >= 0 && a.temp != 0) die("--oracle-*: the oracle knows the greedy continuation; use --temp 0");
    if (a.oracle >= 0 && !strcmp(a.method, "standard")) die("--oracle-*: standard decoding has nothing for an oracle to stand in for");

    Model m;
    ExitHeads heads;
    MedusaHeads medusa;
    if (model_load(&m, a.model)) die_lib();
    int loaded = load_heads(&a, &m, &heads, &medusa);
    Model draft;
    if (a.draft) { /* speculative: a smaller model with the target's vocabulary */
        char why[160];
        if (model_load(&draft, a.draft)) die_lib();
        if (!tok_same_vocab(m.tok, draft.tok, why, sizeof why)) die("--draft %s: %s", a.draft, why);
        if (model_weight_bytes(&draft) > model_weight_bytes(&m))
            fprintf(stderr, "decode: warning: the draft %s is larger than the model (%.0f vs %.0f MB of weights a step)\n",
                    a.draft, model_weight_bytes(&draft) / 1e6, model_weight_bytes(&m) / 1e6);
        a.opt.draft = &draft;
    }
    if (k_init(a.threads)) die("cannot start %d threads", a.threads);
    int n_prompt;
    int32_t *ids = encode_prompt(&a, &m, &n_prompt);
    if (a.n > m.c.seq_len - n_prompt) {
        fprintf(stderr, "decode: -n %d does not fit the context; generating at most %d\n", a.n, m.c.seq_len - n_prompt);
        a.n = m.c.seq_len - n_prompt;
    }
    KVCache kv;
    Sampler s;
    DecodeCtx d;
    if (kv_init(&kv, &m.c, 2, 2 * m.c.seq_len, 16)) die_lib();
    int32_t *oracle = a.oracle >= 0 ? standard_continuation(&m, &kv, &a, ids, n_prompt) : NULL;
    a.opt.oracle = oracle;
    a.opt.oracle_rate = a.oracle >= 0 ? (float)a.oracle : 0;
    if (sampler_init(&s, m.c.vocab_size, (float)a.temp, a.top_k, (float)a.top_p, a.seed) ||
        decode_init(&d, &m, &kv, &s, a.n))
        die_lib();
    d.opt = a.opt;
    Out o = {&m, a.json, a.json || a.chat ? NULL : a.prompt}; /* a chat prints the answer alone */
    d.emit = print_piece;
    d.emit_ctx = &o;
    if (a.dump) { /* the logits after the prompt, then stop */
        AtomicFile af;
        if (decode_prefill(&d, ids, n_prompt) || atomic_open(&af, a.dump)) die_lib();
        if (fwrite(d.logits, sizeof(float), m.c.vocab_size, af.f) != (size_t)m.c.vocab_size) die("%s: write error", a.dump);
        if (atomic_commit(&af)) die_lib();
        return 0;
    }
    if (dm->generate(&d, ids, n_prompt)) die_lib();
    if (a.json) print_json(&d, ids, n_prompt);
    else printf("%s\n", o.prompt ? o.prompt : ""); /* the prompt alone when nothing was generated */
    fflush(stdout); /* the text ends before the summary line on a shared terminal */
    fprintf(stderr, "decode: %s, %d prompt + %d generated tokens, prefill %.1f tok/s, decode %.1f tok/s, %lld target passes",
            a.method, n_prompt, d.n_out, n_prompt / (d.t_prefill + 1e-12), d.n_out / (d.t_decode + 1e-12),
            (long long)d.target_passes);
    if (!a.opt.heads && d.pending_n) {
        fprintf(stderr, ", tau %.2f, mean tree %.1f, acceptance per depth", tau(&d), 1 + d.pending_sum / (d.pending_n + 1e-12));
        for (int j = 0; j < MAX_EXIT_HEADS && d.reached[j]; j++) fprintf(stderr, " %.2f", d.early[j] / (d.reached[j] + 1e-12));
    } else if (a.opt.heads)
        fprintf(stderr, ", %.2f layer passes/token, %lld early, %.1f %% rejected",
                (d.layer_passes - d.prefill_passes * m.c.n_layers) / (d.n_out + 1e-12), (long long)d.drafted,
                100.0 * d.rejected / (d.drafted + 1e-12));
    fputc('\n', stderr);
    decode_free(&d);
    sampler_free(&s);
    kv_free(&kv);
    free(ids);
    free(oracle);
    if (loaded == 2) medusa_free(&medusa);
    else if (loaded == 1) heads_free(&heads);
    if (a.draft) model_free(&draft);
    model_free(&m);
    return 0;
}
