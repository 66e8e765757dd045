/* decode — generate text with any decoding method.
   bin/decode -m MODEL -p PROMPT -n N [--temp T] [--top-k K] [--top-p P] [--seed S]
              [-t THREADS] [--method NAME] [--json]
   stdout: the prompt and the generated text (or one JSON object with --json);
   stderr: one summary line. */
#include <jansson.h>
#include <time.h>

#include "chat.h"
#include "decode.h"
#include "tool.h"

#define USAGE "-m MODEL -p PROMPT -n N [--temp T] [--top-k K] [--top-p P] [--seed S] [-t THREADS] " \
              "[--method NAME] [--json] [--chat [--chat-format llama3|llama2|chatml] [--system TEXT]] [--dump-logits FILE]"

typedef struct {
    Model *m;
    int json;
} Out;

static int print_piece(void *ctx, int prev, int token) {
    Out *o = ctx;
    if (o->json) return 0;
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
    if (!o) die("cannot encode the output as JSON (is the text valid UTF-8?)");
    char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    puts(s);
    free(s);
    free(text);
    json_decref(o);
}

int main(int argc, char **argv) {
    tool_name = "decode";
    const char *model = NULL, *prompt = NULL, *method = "standard", *chat_format = NULL, *system = NULL;
    const char *dump = NULL; /* the prompt's last logits, raw f32, for reference checks */
    int chat = 0;
    long n = -1, top_k = 0, threads = 1, json = 0;
    double temp = 1.0, top_p = 1.0;
    unsigned long long seed = (unsigned long long)time(NULL);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-m")) model = arg_next(argc, argv, &i);
        else if (!strcmp(a, "-p")) prompt = arg_next(argc, argv, &i);
        else if (!strcmp(a, "-n")) n = arg_int(a, arg_next(argc, argv, &i), 1, 1 << 30);
        else if (!strcmp(a, "--temp")) temp = arg_num(a, arg_next(argc, argv, &i), 0, 1e6);
        else if (!strcmp(a, "--top-k")) top_k = arg_int(a, arg_next(argc, argv, &i), 0, 1 << 30);
        else if (!strcmp(a, "--top-p")) top_p = arg_num(a, arg_next(argc, argv, &i), 1e-9, 1);
        else if (!strcmp(a, "--seed")) seed = (unsigned long long)arg_int(a, arg_next(argc, argv, &i), 0, 0x7fffffffffffffffL);
        else if (!strcmp(a, "-t")) threads = arg_int(a, arg_next(argc, argv, &i), 1, 64);
        else if (!strcmp(a, "--method")) method = arg_next(argc, argv, &i);
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--chat")) chat = 1;
        else if (!strcmp(a, "--chat-format")) chat_format = arg_next(argc, argv, &i), chat = 1;
        else if (!strcmp(a, "--system")) system = arg_next(argc, argv, &i);
        else if (!strcmp(a, "--dump-logits")) dump = arg_next(argc, argv, &i);
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) usage(USAGE);
        else die("unknown flag %s (usage: decode %s)", a, USAGE);
    }
    if (!model || !prompt || n < 0) usage(USAGE);
    const DecodeMethod *dm = decode_method(method);
    if (!dm) die_lib();

    Model m;
    if (model_load(&m, model)) die_lib();
    if (k_init((int)threads)) die("cannot start %ld threads", threads);
    int32_t *ids;
    int n_prompt;
    if (chat) {
        int f = chat_format ? chat_format_parse(chat_format) : chat_format_detect(m.chat_template), bos;
        char *text = f < 0 ? NULL : chat_apply((ChatFormat)f, m.chat_template, system, prompt, &bos);
        if (!text || tok_encode_flags(m.tok, text, strlen(text), TOK_SPECIAL | (bos ? TOK_ADD_BOS : 0), &ids, &n_prompt))
            die_lib();
        free(text);
    } else if (tok_encode_flags(m.tok, prompt, strlen(prompt), tok_add_bos(m.tok) ? TOK_ADD_BOS : 0, &ids, &n_prompt))
        die_lib();
    if (n_prompt == 0) die("-p: the prompt is empty and the model takes no BOS");
    if (n_prompt >= m.c.seq_len)
        die("-p: the prompt is %d tokens, the model's context holds %d", n_prompt, m.c.seq_len);
    if (n > m.c.seq_len - n_prompt) {
        fprintf(stderr, "decode: -n %ld does not fit the context; generating at most %d\n", n, m.c.seq_len - n_prompt);
        n = m.c.seq_len - n_prompt;
    }
    KVCache kv;
    Sampler s;
    DecodeCtx d;
    if (kv_init(&kv, &m.c, 1, m.c.seq_len, 16) || sampler_init(&s, m.c.vocab_size, (float)temp, (int)top_k, (float)top_p, seed) ||
        decode_init(&d, &m, &kv, &s, (int)n))
        die_lib();
    Out o = {&m, (int)json};
    d.emit = print_piece;
    d.emit_ctx = &o;
    if (dump) { /* the logits after the prompt, then stop */
        AtomicFile af;
        if (decode_prefill(&d, ids, n_prompt) || atomic_open(&af, dump)) die_lib();
        if (fwrite(d.logits, sizeof(float), m.c.vocab_size, af.f) != (size_t)m.c.vocab_size) die("%s: write error", dump);
        if (atomic_commit(&af)) die_lib();
        return 0;
    }
    if (!json && !chat) { /* a chat prints the answer alone */
        fputs(prompt, stdout);
        fflush(stdout);
    }
    if (dm->generate(&d, ids, n_prompt)) die_lib();
    if (json) print_json(&d, ids, n_prompt);
    else putchar('\n');
    fflush(stdout); /* the text ends before the summary line on a shared terminal */
    fprintf(stderr, "decode: %s, %d prompt + %d generated tokens, prefill %.1f tok/s, decode %.1f tok/s, %lld target passes\n",
            method, n_prompt, d.n_out, n_prompt / (d.t_prefill + 1e-12), d.n_out / (d.t_decode + 1e-12),
            (long long)d.target_passes);
    decode_free(&d);
    sampler_free(&s);
    kv_free(&kv);
    free(ids);
    model_free(&m);
    return 0;
}
