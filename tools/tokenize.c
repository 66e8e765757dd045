/* tokenize — text on stdin to token ids on stdout, or back with --decode.
     bin/tokenize --tokenizer PATH [--bos] [--special] [--decode]
   PATH: llama2.c tokenizer.bin, Hugging Face tokenizer.json (or .json.gz), or a GGUF
   file (a model or a vocab-only one). Encoding prints the ids space-separated on one
   line (BOS only with --bos); --special recognises control tokens written in the text
   (<|begin_of_text|>, <|im_start|>, ...). Decoding reads whitespace-separated ids and
   prints exactly the text they make; with --special control tokens print their text. */
#include "tokenizer/tokenizer.h"
#include "tool.h"

static int fail(const char *msg) {
    fprintf(stderr, "tokenize: %s\n", msg);
    return 1;
}

static int encode(const Tokenizer *t, const char *text, size_t n, int flags) {
    int32_t *ids;
    int k;
    if (tok_encode_flags(t, text, n, flags, &ids, &k)) return fail(pd_errmsg());
    for (int i = 0; i < k; i++) printf(i ? " %d" : "%d", (int)ids[i]);
    printf("\n");
    free(ids);
    return 0;
}

/* ids: whitespace-separated decimal numbers */
static int decode(const Tokenizer *t, char *in, int flags) {
    size_t cap = 1024;
    int k = 0;
    int32_t *ids = pd_alloc(cap * sizeof *ids);
    if (!ids) return fail(pd_errmsg());
    for (char *s = in, *e;; s = e) {
        while (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r') s++;
        if (!*s) break;
        errno = 0;
        long v = strtol(s, &e, 10);
        if (e == s || (*e && !strchr(" \n\t\r", *e)) || errno || v < INT32_MIN || v > INT32_MAX) {
            free(ids);
            int w = (int)strcspn(s, " \n\t\r");
            pd_error("-: '%.*s' is not a token id", w > 40 ? 40 : w, s);
            return fail(pd_errmsg());
        }
        if ((size_t)k == cap) {
            int32_t *more = pd_realloc(ids, pd_mul(2 * cap, sizeof *ids));
            if (!more) {
                free(ids);
                return fail(pd_errmsg());
            }
            ids = more;
            cap *= 2;
        }
        ids[k++] = (int32_t)v;
    }
    char *text;
    size_t len;
    int rc = tok_decode_flags(t, ids, k, flags, &text, &len);
    free(ids);
    if (rc) {
        pd_error_prefix("-");
        return fail(pd_errmsg());
    }
    fwrite(text, 1, len, stdout);
    free(text);
    return 0;
}

int main(int argc, char **argv) {
    tool_name = "tokenize";
    const char *path = NULL;
    int bos = 0, dec = 0, special = 0;
    Flag fl[] = {
        {"--tokenizer", "PATH", "required", "a llama2.c tokenizer.bin, a tokenizer.json (.gz) or a GGUF file",
         F_STR(&path)},
        {"--bos", NULL, NULL, "encode: BOS first", F_SWITCH(&bos)},
        {"--special", NULL, NULL, "control tokens written in the text are tokens (and decode to their text)",
         F_SWITCH(&special)},
        {"--decode", NULL, NULL, "read whitespace-separated ids, print the text they make", F_SWITCH(&dec)},
    };
    flags_parse(fl, N_FLAGS(fl), argc, argv, NULL, 0, "--tokenizer PATH [--bos] [--special] [--decode] < input",
                "memory: about the tokenizer (a few times its file's size: pieces, their map, the merges; a GGUF\n"
                "        file is mapped) + the input twice and 4 bytes a token.\n");
    if (!path) usage("--tokenizer PATH");
    Tokenizer *t;
    if (tok_load_file(&t, path)) return fail(pd_errmsg());
    char *in;
    size_t n;
    if (pd_read_file("-", &in, &n)) {
        tok_free(t);
        return fail(pd_errmsg());
    }
    int flags = (bos ? TOK_ADD_BOS : 0) | (special ? TOK_SPECIAL : 0);
    int rc = dec ? decode(t, in, flags) : encode(t, in, n, flags);
    free(in);
    tok_free(t);
    if (fflush(stdout) || ferror(stdout)) rc = fail("-: write error on stdout");
    return rc;
}
