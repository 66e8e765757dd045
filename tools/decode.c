/* decode — generate text with any decoding method, once or as a conversation.
   bin/decode -m MODEL -p PROMPT [-n N] [--method NAME] [method options]   (--help: every flag)
   bin/decode -m MODEL -cnv [--chat-format F] [--system TEXT]             (a chat on the terminal)
   stdout: the prompt and the generated text (or one JSON object with --json);
   stderr: one summary line (a conversation: one a turn). */
#include <jansson.h>
#include <signal.h>
#include <sys/random.h>

#include "decode/method.h"
#include "serve/serve_gen.h" /* gen_find_stop: the stop strings serve ends answers on */
#include "tokenizer/chat.h"
#include "tool.h"

#define USAGE                                                                                                          \
    "-m MODEL (-p PROMPT | -f FILE) [-n N] [--method NAME] [method options] [--chat] [--json]\n"                       \
    "       decode -m MODEL -cnv [--chat-format NAME] [--system TEXT] [-n N]"

#define MEMORY                                                                                                         \
    "memory: about " MEMORY_MODEL "\n        + " MEMORY_KV(                                                            \
        "2") "\n"                                                                                                      \
             "        + vocabulary-sized buffers per drafted token; --heads adds the heads' weights twice, --draft "   \
             "the\n"                                                                                                   \
             "        draft model's weights twice and its own KV cache (1 × its ctx × layers × kv_dim × 8 bytes).\n"

#define NOTES                                                                                                          \
    "A method option another method does not read is refused. -cnv: a prompt \"> \" on the terminal, the\n"            \
    "chat format applied turn by turn and the KV cache kept between turns (only what the conversation adds\n"          \
    "is prefilled); Ctrl-C stops the answer, Ctrl-C at the prompt or Ctrl-D ends the conversation.\n" MEMORY

typedef struct {
    const char *model, *prompt, *file, *method, *chat_format, *system, *messages, *heads, *dump, *draft, *kv_type;
    int chat, json, conversation, n, ctx, top_k, threads;
    const char *device;
    double temp, top_p, oracle;
    long long seed;
    StrList stop;
    MethodShared opt;
    void *mopt; /* the method's own options */
} Args;

/* --heads, --draft and the oracles, which the methods read through MethodShared: the
   methods that do, for a refusal's message */
static const char *users_of(int needs, int oracle) {
    static char buf[256];
    buf[0] = 0;
    for (int i = 0; i < decode_method_count(); i++) {
        const DecodeMethod *dm = decode_method_at(i);
        if ((dm->needs & needs) || (oracle && dm->oracle))
            snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", buf[0] ? " " : "", dm->name);
    }
    return buf;
}

#define MAX_METHOD_FLAGS 48

/* the method options of every registered method, one flag each (a name two methods
   share is one flag); their text goes to decode_option_set once the method is known */
typedef struct {
    char names[MAX_METHOD_FLAGS][40], help[MAX_METHOD_FLAGS][200];
    const char *value[MAX_METHOD_FLAGS];
    int on[MAX_METHOD_FLAGS], n;
} MethodFlags;

static void method_flags(MethodFlags *mf, Flag *t, int *n) {
    mf->n = 0;
    for (int i = 0; i < decode_method_count(); i++) {
        const DecodeMethod *dm = decode_method_at(i);
        for (int k = 0; k < dm->n_options; k++) {
            const MethodOption *o = &dm->options[k];
            char name[40];
            snprintf(name, sizeof name, "--%s", o->name);
            int dup = 0;
            for (int j = 0; j < mf->n && !dup; j++) dup = !strcmp(mf->names[j], name);
            if (dup || mf->n == MAX_METHOD_FLAGS) continue;
            int j = mf->n++;
            strcpy(mf->names[j], name);
            snprintf(mf->help[j], sizeof mf->help[j], "%s (see the methods below)", decode_option_users(o->name));
            t[*n] = o->type == OPT_SWITCH
                        ? (Flag){mf->names[j], NULL, NULL, mf->help[j], F_SWITCH(&mf->on[j])}
                        : (Flag){mf->names[j], o->metavar, "the method's", mf->help[j], F_STR(&mf->value[j])};
            ++*n;
        }
    }
}

/* --help's notes: the methods and their options, from the registry */
static const char *notes_text(void) {
    static char *buf;
    size_t len;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NOTES;
    fputs(NOTES, f);
    fputc('\n', f);
    decode_methods_help(f);
    fclose(f);
    return buf;
}

static void parse(Args *a, int argc, char **argv) {
    *a = (Args){
        .method = decode_reference()->name, .n = -1, .threads = 1, .temp = 1.0, .top_p = 1.0, .oracle = -1, .seed = -1};
    double oracle_exit = -1, oracle_acc = -1;
    Flag fixed[] = {
        {"-m, --model", "FILE", "required",
         "the model: a paradec file or bundle, a GGUF file, a Hugging Face directory; - is stdin", F_STR(&a->model)},
        MODEL_FLAGS{"-p, --prompt", "TEXT", NULL,
                    "the prompt (a conversation's first turn with -cnv); - reads it from stdin", F_STR(&a->prompt)},
        {"-f, --file", "FILE", NULL, "the prompt from a file (one trailing newline dropped); - is stdin",
         F_STR(&a->file)},
        {"-n, --n-predict", "N", "-1",
         "tokens to generate at most (a turn's, with -cnv); -1: until the end token or the context",
         F_INT(&a->n, -1, 1 << 30)},
        {"-c, --ctx-size", "N", "the model's",
         "the context: prompt and output hold at most N tokens (at most the model's)", F_INT(&a->ctx, 2, 1 << 30)},
        {"-t, --threads", "N", "1", "threads", F_INT(&a->threads, 1, 64)},
        DEVICE_FLAG(&a->device),
        KV_TYPE_FLAG(&a->kv_type),
        {"--temp", "T", "1", "temperature; 0 is greedy", F_NUM(&a->temp, 0, 1e6)},
        {"--top-k", "K", "0: off", "sample among the K likeliest tokens", F_INT(&a->top_k, 0, 1 << 30)},
        {"--top-p", "P", "1: off", "sample within the likeliest tokens whose probabilities sum to P",
         F_NUM(&a->top_p, 1e-9, 1)},
        {"-s, --seed", "S", "random, printed", "the sampler's seed (the summary prints the one used)",
         F_I64(&a->seed, 0, 1e19)},
        {"--stop", "TEXT", NULL, "stop when the text contains TEXT, printed up to before it (repeatable)",
         F_LIST(&a->stop)},
        {"--method", "NAME", decode_reference()->name, "the decoding method (the list below)", F_STR(&a->method)},
        {"--json", NULL, NULL, "print one JSON object (tokens, text, stop reason, times, statistics) for the text",
         F_SWITCH(&a->json)},
        {"--chat", NULL, NULL, "the prompt is a user turn in the model's chat format; the answer alone is printed",
         F_SWITCH(&a->chat)},
        {"--chat-format", "NAME", "the model's template", "llama3, llama2 or chatml (implies --chat)",
         F_STR(&a->chat_format)},
        {"--system", "TEXT", "the template's own", "the system prompt of a chat", F_STR(&a->system)},
        {"--messages", "FILE", NULL,
         "the conversation so far, JSON [{\"role\": ..., \"content\": ...}, ...]; -p adds a user turn (implies --chat)",
         F_STR(&a->messages)},
        {"-cnv, --conversation, --interactive", NULL, NULL,
         "a conversation on the terminal, turn by turn, the KV cache kept (implies --chat)",
         F_SWITCH(&a->conversation)},
        {"--heads", "FILE", "the bundle's", "exit heads, Medusa heads or an EAGLE head, for the methods that take them",
         F_STR(&a->heads)},
        {"--draft", "FILE", NULL, "the draft model (the target's vocabulary), for the methods that take one",
         F_STR(&a->draft)},
        {"--oracle-exit", "RATE", NULL,
         "benchmarks: an oracle knowing the greedy continuation exits right at this rate", F_NUM(&oracle_exit, 0, 1)},
        {"--oracle-acceptance", "A", NULL, "benchmarks: an oracle drafter right at this rate",
         F_NUM(&oracle_acc, 0, 1)},
        {"--dump-logits", "FILE", NULL, "write the logits after the prompt (f32) and stop", F_STR(&a->dump)},
        {"--graphs", NULL, NULL, "replay a graph captured per token count for each full-model pass (the same bits)",
         F_SWITCH(&a->opt.graphs)},
        {"--fast-prefill", NULL, NULL,
         "the prompt's products by cuBLAS (--device cuda): faster on long prompts, not exact mode's bits",
         F_SWITCH(&a->opt.fast_prefill)},
    };
    Flag t[N_FLAGS(fixed) + MAX_METHOD_FLAGS];
    static MethodFlags mf;
    int n = N_FLAGS(fixed);
    memcpy(t, fixed, sizeof fixed);
    method_flags(&mf, t, &n);
    flags_parse(t, n, argc, argv, NULL, 0, USAGE, notes_text());
    a->oracle = oracle_exit >= 0 ? oracle_exit : oracle_acc;
    if (a->opt.fast_prefill && (!a->device || strcmp(a->device, "cuda")))
        die("--fast-prefill: the cuBLAS prefill runs on --device cuda only");
    if (a->chat_format || a->messages || a->conversation) a->chat = 1;
    if (!a->model) usage("-m/--model");
    if (!a->prompt && !a->file && !a->messages && !a->conversation) usage("-p/--prompt (or -f/--file)");
    if (a->prompt && a->file) die("-f: -p gives the prompt already");
    if (a->n == 0) die("-n: 0 tokens is nothing to generate (-1: until the end token or the context)");
    for (int i = 0; i < a->stop.n; i++)
        if (!*a->stop.v[i]) die("--stop: an empty stop string would stop before the first token");
    const DecodeMethod *dm = decode_method(a->method);
    if (!dm) die_lib();
    static const struct {
        const char *flag;
        int needs, oracle;
    } SHARED[] = {{"--heads", NEEDS_EXIT_HEADS | NEEDS_MEDUSA | NEEDS_EAGLE, 0},
                  {"--draft", NEEDS_DRAFT, 0},
                  {"--oracle-exit", 0, 1},
                  {"--oracle-acceptance", 0, 1}};
    for (size_t i = 0; i < sizeof SHARED / sizeof SHARED[0]; i++) {
        const Flag *f = flag_given(t, n, SHARED[i].flag);
        if (f && !(dm->needs & SHARED[i].needs) && !(SHARED[i].oracle && dm->oracle))
            die("%s: %s does not use it (%s do)", f->as, a->method, users_of(SHARED[i].needs, SHARED[i].oracle));
    }
    if (!(a->mopt = decode_options_new(dm))) die_lib();
    for (int j = 0; j < mf.n; j++) {
        const Flag *f = flag_given(t, n, mf.names[j]);
        if (f && decode_option_set(dm, a->mopt, &a->opt, mf.names[j] + 2, f->type == 'b' ? NULL : mf.value[j]))
            die_lib();
    }
    if (a->system && !a->chat)
        die("--system: only a chat has a system prompt (--chat, --chat-format, --messages or -cnv)");
    if (a->oracle >= 0 && a->temp != 0) die("--oracle-*: the oracle knows the greedy continuation; use --temp 0");
    if (a->dump && dm != decode_reference())
        die("--dump-logits: the logits after the prompt are the model's whatever the method");
    const char *in[] = {a->model, a->prompt, a->file, a->messages, a->heads, a->draft, a->conversation ? "-" : NULL};
    int stdin_uses = 0; /* stdin is read once */
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) stdin_uses += in[i] && !strcmp(in[i], "-");
    if (stdin_uses > 1) die("-: only one input can be stdin (a conversation reads its turns there)");
    if (a->conversation) {
        const char *no = a->json          ? "--json"
                         : a->dump        ? "--dump-logits"
                         : a->oracle >= 0 ? "--oracle-*"
                         : a->file        ? "-f"
                                          : NULL;
        if (no) die("%s: not with a conversation (-cnv)", no);
    }
}

/* all of a file ("-": stdin), one trailing newline dropped, as llama.cpp's -f */
static char *read_text(const char *flag, const char *path) {
    char *s;
    size_t n;
    if (pd_read_file(path, &s, &n)) die("%s: %s", flag, pd_errmsg());
    if (memchr(s, 0, n)) die("%s %s: the text holds a NUL byte", flag, path);
    if (n && s[n - 1] == '\n') s[--n] = 0;
    if (n && s[n - 1] == '\r') s[--n] = 0;
    return s;
}

static unsigned long long random_seed(void) {
    uint32_t s;
    if (getrandom(&s, sizeof s, 0) != (ssize_t)sizeof s)
        die("cannot draw a seed (getrandom: %s); give --seed", strerror(errno));
    return s;
}

/* ---- the conversation's turns ---- */
typedef struct {
    ChatTurn *t;
    int n, cap;
} Turns;

static void turn_add(Turns *c, const char *role, const char *content, size_t len) {
    if (c->n == c->cap && !(c->t = realloc(c->t, sizeof *c->t * (c->cap = c->cap ? 2 * c->cap : 8))))
        die("out of memory");
    char *s = strndup(content, len);
    if (!s) die("out of memory");
    c->t[c->n++] = (ChatTurn){role, s};
}

static void turns_free(Turns *c) {
    for (int i = 0; i < c->n; i++) free((char *)c->t[i].content);
    free(c->t);
}

/* --messages FILE: [{"role": "system"|"user"|"assistant", "content": "..."}, ...] */
static void read_messages(Turns *c, const char *path) {
    char *bytes;
    size_t n;
    json_error_t err;
    if (pd_read_file(path, &bytes, &n)) die("--messages: %s", pd_errmsg());
    json_t *j = json_loadb(bytes, n, 0, &err);
    free(bytes);
    if (!json_is_array(j)) die("--messages %s: not a JSON array (%s)", path, j ? "another value" : err.text);
    for (size_t i = 0; i < json_array_size(j); i++) {
        json_t *m = json_array_get(j, i), *r = json_object_get(m, "role"), *t = json_object_get(m, "content");
        if (!json_is_string(r) || !json_is_string(t))
            die("--messages %s: message %zu has no string role and content", path, i);
        const char *role = json_string_value(r);
        role = !strcmp(role, "system")      ? "system"
               : !strcmp(role, "user")      ? "user"
               : !strcmp(role, "assistant") ? "assistant"
                                            : NULL;
        if (!role)
            die("--messages %s: message %zu: role '%s' is not system, user or assistant", path, i,
                json_string_value(r));
        if (!strcmp(role, "system") && c->n)
            die("--messages %s: message %zu: a system turn comes first, and once (--system gives one too)", path, i);
        turn_add(c, role, json_string_value(t), json_string_length(t));
    }
    json_decref(j);
}

/* the chat format: named, or the model's template's */
static ChatFormat chat_format(const Args *a, const Model *m) {
    int f = a->chat_format ? chat_format_parse(a->chat_format) : chat_format_detect(m->chat_template);
    if (f < 0) die_lib();
    return (ChatFormat)f;
}

static int32_t *encode_turns(const Model *m, ChatFormat f, const Turns *c, int *n_ids) {
    int bos;
    int32_t *ids;
    char *text = chat_apply_turns(f, m->chat_template, c->t, c->n, &bos);
    if (!text || tok_encode_flags(m->tok, text, strlen(text), TOK_SPECIAL | (bos ? TOK_ADD_BOS : 0), &ids, n_ids))
        die_lib();
    free(text);
    return ids;
}

/* a chat's turns before the answer: --system, --messages, then -p as a user turn */
static void chat_turns(const Args *a, Turns *c) {
    *c = (Turns){0};
    if (a->system) turn_add(c, "system", a->system, strlen(a->system));
    if (a->messages) read_messages(c, a->messages);
    if (a->prompt) turn_add(c, "user", a->prompt, strlen(a->prompt));
}

/* the prompt's ids: plain (BOS when the vocabulary wants one) or a chat's turns */
static int32_t *encode_prompt(const Args *a, const Model *m, int *n_prompt) {
    int32_t *ids;
    const char *flag = a->file ? "-f" : "-p";
    if (a->chat) {
        Turns c;
        chat_turns(a, &c);
        if (!c.n || strcmp(c.t[c.n - 1].role, "user"))
            die("--messages: the conversation ends with no user turn to answer (-p adds one)");
        ids = encode_turns(m, chat_format(a, m), &c, n_prompt);
        turns_free(&c);
        flag = a->messages && !a->prompt ? "--messages" : flag;
    } else if (tok_encode_flags(m->tok, a->prompt, strlen(a->prompt), tok_add_bos(m->tok) ? TOK_ADD_BOS : 0, &ids,
                                n_prompt))
        die_lib();
    if (*n_prompt == 0) die("%s: the prompt is empty and the model takes no BOS", flag);
    if (*n_prompt >= m->c.seq_len)
        die("%s: the prompt is %d tokens, the context holds %d", flag, *n_prompt, m->c.seq_len);
    return ids;
}

/* ---- the output: streamed as accepted, held back where it may begin a stop string ---- */
static volatile sig_atomic_t interrupted; /* Ctrl-C in a conversation */

typedef struct {
    Model *m;
    int quiet;          /* --json: nothing printed */
    const char *prompt; /* printed before the first token, so a failing method prints nothing */
    const StrList *stop;
    char *text;             /* what was generated, cut before a stop string */
    size_t len, cap, shown; /* shown: bytes of text on stdout */
    int stopped, interrupted;
} Out;

static void show(Out *o, size_t upto) {
    if (!o->quiet && upto > o->shown) fwrite(o->text + o->shown, 1, upto - o->shown, stdout), fflush(stdout);
    if (upto > o->shown) o->shown = upto;
}

static int emit(void *ctx, int prev, int token) {
    Out *o = ctx;
    if (o->prompt && !o->quiet) fputs(o->prompt, stdout);
    o->prompt = NULL;
    size_t pl;
    const char *p = tok_piece(o->m->tok, prev, token, &pl);
    if (p && pl) {
        while (o->len + pl + 1 > o->cap)
            if (!(o->text = realloc(o->text, o->cap = o->cap ? 2 * o->cap : 256))) die("out of memory");
        memcpy(o->text + o->len, p, pl);
        o->text[o->len += pl] = 0;
    }
    /* a stop string begins at or after what is shown: what could begin one is held back */
    size_t hold, cut = gen_find_stop((char *const *)o->stop->v, o->stop->n, o->text, o->len, o->shown, &hold);
    size_t safe = o->len - hold;
    if (cut < o->len) {
        o->text[o->len = cut] = 0;
        show(o, cut);
        return o->stopped = 1;
    }
    show(o, safe);
    if (interrupted) return o->interrupted = 1;
    return 0;
}

/* why generation ended. A method stops at an end token, at max_new or when emit asks;
   max_new never exceeds the context left, so reaching it is "length" where -n asked
   for exactly that and "context" otherwise */
static const char *stop_reason(const DecodeCtx *d, const Out *o, int n_asked) {
    if (o->stopped) return "stop string";
    if (o->interrupted) return "interrupted";
    if (d->n_out < d->max_new) return "end token";
    return n_asked == d->n_out ? "length" : "context";
}

/* tokens per target pass after the prompt */
static double tau(const DecodeCtx *d) { return decode_tau(d->n_out - 1, d->target_passes - d->prefill_passes); }

static const char *fmt_time(double s, char *b, size_t n) {
    double ms = s * 1e3;
    if (ms >= 10000) snprintf(b, n, "%.1f s", s);
    else snprintf(b, n, ms >= 100 ? "%.0f ms" : ms >= 10 ? "%.1f ms" : ms >= 1 ? "%.2f ms" : "%.3f ms", ms);
    return b;
}

static json_t *j_rate(double v) { return json_real(round_dec(v, 3)); }

static void print_json(const Args *a, DecodeCtx *d, const Out *o, int n_prompt, const char *stop, double total,
                       double load) {
    json_t *ids = json_array();
    for (int i = 0; i < d->n_out; i++) json_array_append_new(ids, json_integer(d->out[i]));
    /* what is deterministic first (tests compare the objects up to tok_per_s) */
    json_t *j = json_pack("{s:o, s:s%, s:i, s:i, s:s, s:s, s:f, s:f, s:I, s:I, s:I, s:f, s:f, s:f, s:f}", "tokens", ids,
                          "text", o->text ? o->text : "", o->len, "n_prompt", n_prompt, "n_gen", d->n_out, "stop", stop,
                          "method", a->method, "tok_per_s", round_dec(d->n_out / (d->t_decode + 1e-12), 1),
                          "prefill_tok_per_s", round_dec(n_prompt / (d->t_prefill + 1e-12), 1), "target_passes",
                          (json_int_t)d->target_passes, "weight_bytes_per_token", (json_int_t)model_weight_bytes(d->m),
                          "seed", (json_int_t)a->seed, "prefill_s", round_dec(d->t_prefill, 6), "decode_s",
                          round_dec(d->t_decode, 6), "total_s", round_dec(total, 6), "load_s", round_dec(load, 6));
    if (j && !d->opt.heads && d->pending_n) { /* a drafter's: tokens per target pass, acceptance per depth */
        json_t *acc = json_array();
        for (int k = 0; k < MAX_EXIT_HEADS && d->reached[k]; k++)
            json_array_append_new(acc, j_rate(d->early[k] / (d->reached[k] + 1e-12)));
        json_object_set_new(j, "tau", j_rate(tau(d)));
        json_object_set_new(j, "acceptance_per_depth", acc);
        json_object_set_new(j, "mean_tree", j_rate(1 + d->pending_sum / (d->pending_n + 1e-12)));
        json_t *sizes = json_object(); /* what the rounds cost depends on their sizes, not on the mean */
        for (int n = 1; n <= MAX_ROUND_NODES; n++) {
            char key[16];
            snprintf(key, sizeof key, "%d", n);
            if (d->rounds_by_nodes[n]) json_object_set_new(sizes, key, json_integer(d->rounds_by_nodes[n]));
        }
        json_object_set_new(j, "rounds_by_nodes", sizes);
    }
    if (j && d->opt.heads) { /* the early-exit statistics of adadecode / self-speculative */
        int L = d->m->c.n_layers;
        json_t *rates = json_object();
        for (int k = 0; k < d->opt.heads->n; k++) {
            char key[16];
            snprintf(key, sizeof key, "%d", d->opt.heads->layer[k]);
            json_object_set_new(rates, key, j_rate(d->early[k] / (d->n_out + 1e-12)));
        }
        json_object_set_new(j, "layer_passes_per_token",
                            j_rate((d->layer_passes - d->prefill_passes * L) / (d->n_out + 1e-12)));
        json_object_set_new(j, "token_layers_per_token",
                            j_rate((d->token_layers - d->prefill_token_layers) / (d->n_out + 1e-12)));
        json_object_set_new(j, "early_rate_per_head_layer", rates);
        json_object_set_new(j, "drafted", json_integer(d->drafted));
        json_object_set_new(j, "rejection_rate", j_rate(d->rejected / (d->drafted + 1e-12)));
        json_object_set_new(j, "mean_pending", j_rate(d->pending_sum / (d->pending_n + 1e-12)));
    }
    if (!j) die("cannot encode the output as JSON (is the text valid UTF-8?)");
    char *s = json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII | JSON_REAL_PRECISION(15));
    puts(s);
    free(s);
    json_decref(j);
}

/* one line on stderr; turn > 0: a conversation's, with what the KV cache kept */
static void summary(const Args *a, const DecodeCtx *d, int n_prompt, const char *stop, double total, int turn) {
    char tp[32], td[32], tt[32];
    const Model *m = d->m;
    fflush(stdout); /* the text ends before the summary on a shared terminal */
    fprintf(stderr, "decode: ");
    if (turn) fprintf(stderr, "turn %d: ", turn);
    fprintf(stderr, "%s, %d prompt + %d generated tokens", a->method, n_prompt, d->n_out);
    if (turn) fprintf(stderr, " (%d prefilled, %d kept)", d->n_prefilled, n_prompt - d->n_prefilled);
    fprintf(stderr,
            ", stop: %s, seed %lld, prefill %s (%.1f tok/s), decode %s (%.1f tok/s), total %s, %lld target passes",
            stop, a->seed, fmt_time(d->t_prefill, tp, sizeof tp), d->n_prefilled / (d->t_prefill + 1e-12),
            fmt_time(d->t_decode, td, sizeof td), d->n_out / (d->t_decode + 1e-12), fmt_time(total, tt, sizeof tt),
            (long long)d->target_passes);
    if (!d->opt.heads && d->pending_n) {
        fprintf(stderr, ", tau %.2f, mean tree %.1f, acceptance per depth", tau(d),
                1 + d->pending_sum / (d->pending_n + 1e-12));
        for (int j = 0; j < MAX_EXIT_HEADS && d->reached[j]; j++)
            fprintf(stderr, " %.2f", d->early[j] / (d->reached[j] + 1e-12));
    } else if (d->opt.heads)
        fprintf(stderr, ", %.2f layer passes/token, %lld early, %.1f %% rejected",
                (d->layer_passes - d->prefill_passes * m->c.n_layers) / (d->n_out + 1e-12), (long long)d->drafted,
                100.0 * d->rejected / (d->drafted + 1e-12));
    fputc('\n', stderr);
}

/* --heads FILE (exit heads, Medusa heads, an EAGLE head, or a bundle's set for the
   method), or the model's own when it is a bundle and the method takes heads; what was
   loaded: 0 nothing, 1 exit heads, 2 Medusa, 3 EAGLE */
static int load_heads(Args *a, Model *m, ExitHeads *eh, MedusaHeads *mh, EagleHead *eg) {
    const DecodeMethod *dm = decode_method(a->method);
    int kind = dm->needs & NEEDS_MEDUSA ? 2 : dm->needs & NEEDS_EAGLE ? 3 : 1, rc;
    TensorFile tf, *from = &m->tf; /* --heads opened once: "-" is read once */
    const char *what = a->model;
    if (a->heads) {
        if (tf_open(&tf, a->heads)) die_lib();
        const char *k = tf_meta(&tf, "paradec.kind");
        if (k && strcmp(k, "bundle")) kind = !strcmp(k, "medusa-heads") ? 2 : !strcmp(k, "eagle-head") ? 3 : 1;
        from = &tf, what = a->heads;
    } else {
        const char *k = tf_meta(&m->tf, "paradec.kind");
        if (!k || strcmp(k, "bundle") || !(dm->needs & (NEEDS_EXIT_HEADS | NEEDS_MEDUSA | NEEDS_EAGLE))) return 0;
    }
    rc = kind == 2 ? medusa_load_tf(mh, from, m, what) : kind == 3 ? eagle_load_tf(eg, from, m, what)
                                                               : heads_load_tf(eh, from, m, what);
    if (a->heads) {
        if (kind == 3 && !rc) eg->file = tf, eg->own_file = 1; /* its layer's tensors lie in tf */
        else tf_close(&tf);
    }
    if (rc) die_lib();
    if (kind == 2) medusa_use_int8(mh), a->opt.medusa = mh;
    else if (kind == 3) a->opt.eagle = eg;
    else a->opt.heads = eh;
    return kind;
}

/* --oracle-exit: the standard continuation, which the oracle then knows */
static int32_t *standard_continuation(Model *m, KVCache *kv, const Args *a, const int32_t *ids, int n_prompt, int n) {
    Sampler s;
    DecodeCtx d;
    if (sampler_init(&s, m->c.vocab_size, (float)a->temp, a->top_k, (float)a->top_p, a->seed) ||
        decode_init(&d, m, kv, &s, n) || decode_generate(decode_reference(), &d, ids, n_prompt))
        die_lib();
    int32_t *out = malloc(sizeof(int32_t) * n);
    if (!out) die("out of memory");
    memset(out, 0xff, sizeof(int32_t) * n);
    memcpy(out, d.out, sizeof(int32_t) * d.n_out);
    decode_free(&d);
    sampler_free(&s);
    return out;
}

static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

/* Ctrl-C: while reading a turn it ends the read (no restart); while answering it only
   sets the flag the emit callback reads, and interrupted writes restart */
static void sigint_restarts(int restart) {
    struct sigaction sa = {.sa_handler = on_sigint, .sa_flags = restart ? SA_RESTART : 0};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

/* a turn typed after "> ", without its newline; NULL at Ctrl-D (*code 0) or Ctrl-C (*code 130) */
static char *read_turn(int *code) {
    static char *line;
    static size_t cap;
    for (;;) {
        fputs("> ", stdout);
        fflush(stdout);
        interrupted = 0;
        sigint_restarts(0);
        ssize_t n = getline(&line, &cap, stdin);
        sigint_restarts(1);
        if (n < 0) {
            *code = interrupted ? 130 : 0;
            fputc('\n', stdout);
            free(line), line = NULL;
            return NULL;
        }
        while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (n) return line;
    }
}

/* -cnv: each turn is the whole conversation in the chat format; the KV sequence keeps
   the longest prefix it shares with what the cache holds (the last prompt and answer),
   so only what the turn adds is prefilled, and the answer is the one a single run on
   the whole conversation gives */
static int converse(const Args *a, Model *m, const DecodeMethod *dm, KVCache *kv, Sampler *s) {
    ChatFormat f = chat_format(a, m);
    Args first_turn = *a;
    first_turn.prompt = NULL; /* -p is answered in the loop, as a typed turn */
    Turns c;
    chat_turns(&first_turn, &c);
    DecodeCtx d;
    if (decode_init(&d, m, kv, s, 1)) die_lib();
    d.opt = a->opt;
    d.mopt = a->mopt;
    d.emit = emit;
    int32_t *held = NULL; /* the tokens of the last prompt and answer, the first `kept` in the cache */
    int kept = 0, code = 0;
    const char *first = a->prompt;
    for (int turn = 1;; turn++) {
        const char *line = first ? first : read_turn(&code);
        first = NULL;
        if (!line) break;
        turn_add(&c, "user", line, strlen(line));
        int n_ids;
        int32_t *ids = encode_turns(m, f, &c, &n_ids);
        if (n_ids >= m->c.seq_len)
            die("turn %d: the conversation is %d tokens, the context holds %d", turn, n_ids, m->c.seq_len);
        int keep = 0;
        while (keep < kept && keep < n_ids - 1 && ids[keep] == held[keep]) keep++;
        int room = m->c.seq_len - n_ids, max_new = a->n < 0 || a->n > room ? room : a->n;
        if (decode_continue(&d, max_new, keep)) die_lib();
        Out o = {.m = m, .stop = &a->stop};
        d.emit_ctx = &o;
        interrupted = 0;
        double t0 = pd_now();
        if (decode_generate(dm, &d, ids, n_ids)) die_lib();
        double total = pd_now() - t0;
        if (!o.stopped) show(&o, o.len);
        fputc('\n', stdout);
        summary(a, &d, n_ids, stop_reason(&d, &o, a->n), total, turn);
        turn_add(&c, "assistant", o.text ? o.text : "", o.len);
        free(o.text);
        if (!(held = realloc(held, sizeof(int32_t) * (n_ids + d.n_out + 1)))) die("out of memory");
        memcpy(held, ids, sizeof(int32_t) * n_ids);
        memcpy(held + n_ids, d.out, sizeof(int32_t) * d.n_out);
        kept = decode_kept(&d, n_ids);
        free(ids);
    }
    free(held);
    turns_free(&c);
    decode_free(&d);
    return code;
}

int main(int argc, char **argv) {
    tool_name = "decode";
    Args a;
    parse(&a, argc, argv);
    const DecodeMethod *dm = decode_method(a.method);
    if (a.oracle >= 0 && !dm->oracle)
        die("--oracle-*: %s decoding has nothing for an oracle to stand in for", dm->name);
    if (a.file) a.prompt = read_text("-f", a.file);
    else if (a.prompt && !strcmp(a.prompt, "-")) a.prompt = read_text("-p", "-");
    if (a.seed < 0) a.seed = (long long)random_seed();

    KVType kvt = kv_type_arg(a.kv_type);
    double t_load = pd_now();
    Model m;
    ExitHeads heads;
    MedusaHeads medusa;
    EagleHead eagle;
    tool_model_load(&m, a.model);
    if (a.ctx > m.c.seq_len) die("-c: %d tokens is above the model's context of %d", a.ctx, m.c.seq_len);
    if (a.ctx) m.c.seq_len = a.ctx;
    int loaded = load_heads(&a, &m, &heads, &medusa, &eagle);
    Model draft;
    if (a.draft) { /* speculative: a smaller model with the target's vocabulary */
        char why[160];
        tool_model_load(&draft, a.draft);
        if (!tok_same_vocab(m.tok, draft.tok, why, sizeof why)) die("--draft %s: %s", a.draft, why);
        if (model_weight_bytes(&draft) > model_weight_bytes(&m))
            fprintf(stderr,
                    "decode: warning: the draft %s is larger than the model (%.0f vs %.0f MB of weights a step)\n",
                    a.draft, model_weight_bytes(&draft) / 1e6, model_weight_bytes(&m) / 1e6);
        a.opt.draft = &draft;
    }
    t_load = pd_now() - t_load;
    sigset_t mask, old; /* worker threads leave Ctrl-C to the thread reading the terminal */
    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);
    if (a.conversation) pthread_sigmask(SIG_BLOCK, &mask, &old);
    if (model_threads(a.threads)) die("cannot start %d threads", a.threads);
    device_arg(a.device);
    if (a.conversation) pthread_sigmask(SIG_SETMASK, &old, NULL);
    KVCache kv;
    Sampler s;
    if (kv_init_typed(&kv, &m.c, 2, 2 * m.c.seq_len, 16, kvt) ||
        sampler_init(&s, m.c.vocab_size, (float)a.temp, a.top_k, (float)a.top_p, (uint64_t)a.seed))
        die_lib();
    int rc = 0;
    if (a.conversation) {
        sigint_restarts(1);
        rc = converse(&a, &m, dm, &kv, &s);
    } else {
        int n_prompt;
        int32_t *ids = encode_prompt(&a, &m, &n_prompt);
        int room = m.c.seq_len - n_prompt, max_new = a.n < 0 || a.n > room ? room : a.n;
        if (a.n > room) fprintf(stderr, "decode: -n %d does not fit the context; generating at most %d\n", a.n, room);
        int32_t *oracle = a.oracle >= 0 ? standard_continuation(&m, &kv, &a, ids, n_prompt, max_new) : NULL;
        a.opt.oracle = oracle;
        a.opt.oracle_rate = a.oracle >= 0 ? (float)a.oracle : 0;
        DecodeCtx d;
        if (decode_init(&d, &m, &kv, &s, max_new)) die_lib();
        d.opt = a.opt;
        d.mopt = a.mopt;
        Out o = {.m = &m,
                 .quiet = a.json,
                 .prompt = a.json || a.chat ? NULL : a.prompt,
                 .stop = &a.stop}; /* a chat: the answer alone */
        d.emit = emit;
        d.emit_ctx = &o;
        if (a.dump) { /* the logits after the prompt, then stop */
            AtomicFile af;
            if (decode_prefill(&d, ids, n_prompt) || atomic_open(&af, a.dump)) die_lib();
            if (fwrite(d.logits, sizeof(float), m.c.vocab_size, af.f) != (size_t)m.c.vocab_size)
                die("%s: write error", a.dump);
            if (atomic_commit(&af)) die_lib();
            return 0;
        }
        double t0 = pd_now();
        if (decode_generate(dm, &d, ids, n_prompt)) die_lib();
        double total = pd_now() - t0;
        const char *stop = stop_reason(&d, &o, a.n);
        if (!o.stopped) show(&o, o.len);
        if (a.json) print_json(&a, &d, &o, n_prompt, stop, total, t_load);
        else printf("%s\n", o.prompt ? o.prompt : ""); /* the prompt alone when nothing was generated */
        summary(&a, &d, n_prompt, stop, total, 0);
        free(o.text);
        decode_free(&d);
        free(ids);
        free(oracle);
    }
    sampler_free(&s);
    kv_free(&kv);
    if (loaded == 2) medusa_free(&medusa);
    else if (loaded == 3) eagle_free(&eagle);
    else if (loaded == 1) heads_free(&heads);
    if (a.draft) model_free(&draft);
    model_free(&m);
    free(a.mopt);
    return rc;
}
