/* tokenizer_gguf.c — a GGUF file's tokenizer.* keys into a Tokenizer, read as llama.cpp
   reads them (llama-vocab.cpp):
   - tokenizer.ggml.model "llama": SentencePiece (TOK_SPM) from tokens, scores and
     token_type (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte);
     add_space_prefix (default on); BOS/EOS/UNK default 1/2/0.
   - "gpt2": byte-level BPE (TOK_BPE) from tokens, merges ("a b", rank = position) and
     token_type; tokenizer.ggml.pre names the pre-tokenizer regexes (below). Normal
     pieces are written in GPT-2's byte alphabet, control and user-defined ones as raw
     text.
   - BOS/EOS/UNK from tokenizer.ggml.{bos,eos,unknown}_token_id, end of generation
     also from eot/eom ids; add_bos from tokenizer.ggml.add_bos_token, else llama.cpp's
     default (SPM and the llama3 pre-tokenizer: on; other BPE: off).
   Other models (bert, t5, rwkv, ...) and unknown pre-tokenizer names are refused. */
#include "base/util.h"
#include "formats/gguf.h"
#include "tokenizer/tokenizer_impl.h"

#include <stdlib.h>
#include <string.h>

/* the regexes llama.cpp runs for each pre-tokenizer name; several regexes run in turn,
   each splitting the pieces the previous one made */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_LLAMA3                                                                                                      \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"                       \
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                                       \
    RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"                            \
                    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

typedef struct {
    const char *names; /* space-separated, as tokenizer.ggml.pre writes them */
    int ignore_merges, add_bos;
    const char *re[4];
} PreSpec;

static const PreSpec PRE[] = {
    {" llama3 llama-v3 llama-bpe falcon3 ", 1, 1, {RE_LLAMA3}},
    {" dbrx smaug-bpe ", 0, 0, {RE_LLAMA3}},
    {" gpt-2 phi-2 roberta-bpe mpt olmo jais ", 0, 0, {RE_GPT2}},
    {" smollm starcoder refact command-r codeshell exaone minerva-7b ", 0, 0, {"\\p{N}", RE_GPT2}},
    {" qwen2 stablelm2 megrez ", 0, 0, {RE_QWEN2}},
    {" default ", 0, 0, {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}},
};

static const PreSpec *pre_spec(const char *name, size_t n) {
    char key[80];
    if (n == 0 || n > sizeof key - 3 || memchr(name, ' ', n)) return NULL;
    snprintf(key, sizeof key, " %.*s ", (int)n, name);
    for (size_t i = 0; i < sizeof PRE / sizeof *PRE; i++)
        if (strstr(PRE[i].names, key)) return &PRE[i];
    return NULL;
}

/* an optional array of n elements of one of the given types; NULL when absent */
static const GgufKV *array_of(const Gguf *g, const char *key, int n, GgufType a, GgufType b, const char *what,
                              int *bad) {
    const GgufKV *kv = gguf_find(g, key);
    if (!kv) return NULL;
    if (kv->type != GGUF_ARRAY || (kv->elem != a && kv->elem != b)) {
        *bad = pd_error("%s: %s has the wrong type", what, key);
        return NULL;
    }
    if (n >= 0 && kv->n != (uint64_t)n) {
        *bad = pd_error("%s: %s has %llu entries for %d tokens", what, key, (unsigned long long)kv->n, n);
        return NULL;
    }
    return kv;
}

static int rd_i32_at(const GgufKV *kv, int i) {
    int32_t v;
    memcpy(&v, (const char *)kv->data + 4 * (size_t)i, 4);
    return v;
}

/* an optional token id: dflt when absent, -1 when out of range */
static int token_id(const Gguf *g, const char *key, int dflt, int n_vocab, const char *what, int *bad) {
    if (!gguf_find(g, key)) return dflt;
    int64_t v;
    if (gguf_get_int(g, key, &v)) {
        *bad = -1;
        return -1;
    }
    if (v < 0 || v >= n_vocab) {
        *bad = pd_error("%s: %s = %lld is outside the vocabulary of %d", what, key, (long long)v, n_vocab);
        return -1;
    }
    return (int)v;
}

static int opt_bool(const Gguf *g, const char *key, int dflt, int *bad) {
    int v = dflt;
    if (gguf_find(g, key) && gguf_get_bool(g, key, &v)) *bad = -1;
    return v;
}

static int piece_type(int gguf_type) {
    switch (gguf_type) {
    case 2:
        return PIECE_UNKNOWN;
    case 3:
        return PIECE_CONTROL;
    case 4:
        return PIECE_USER;
    case 5:
        return PIECE_UNUSED;
    case 6:
        return PIECE_BYTE;
    default:
        return PIECE_NORMAL; /* 1, and 0 "undefined", as llama.cpp treats it */
    }
}

static int put_merges(Tokenizer *t, const Gguf *g, const char *what) {
    int bad = 0;
    const GgufKV *m = array_of(g, "tokenizer.ggml.merges", -1, GGUF_STRING, GGUF_STRING, what, &bad);
    if (bad) return -1;
    if (!m) return pd_error("%s: tokenizer.ggml.merges is missing (a gpt2 vocabulary needs it)", what);
    if (m->n > (uint64_t)TOK_MAX_VOCAB * 4)
        return pd_error("%s: %llu merges is not plausible", what, (unsigned long long)m->n);
    if (tok_merges_init(t, (int)m->n)) return pd_error_prefix(what);
    for (int i = 0; i < (int)m->n; i++) {
        const GgufStr *s = &m->strs[i];
        /* "a b", split at the first space after the first byte, as llama.cpp does */
        const char *sp = s->len > 1 ? memchr(s->s + 1, ' ', s->len - 1) : NULL;
        if (!sp)
            return pd_error("%s: merge %d ('%.*s') is not two pieces", what, i, (int)(s->len > 60 ? 60 : s->len), s->s);
        size_t na = (size_t)(sp - s->s);
        if (tok_add_merge(t, s->s, na, sp + 1, s->len - na - 1, i, what)) return -1;
    }
    return 0;
}

int tok_load_gguf(Tokenizer **out, const Gguf *g, const char *what) {
    *out = NULL;
    GgufStr model;
    if (gguf_get_str(g, "tokenizer.ggml.model", &model))
        return pd_error("%s: no tokenizer in this GGUF file (tokenizer.ggml.model is missing)", what);
    int spm = model.len == 5 && !memcmp(model.s, "llama", 5);
    int bpe = model.len == 4 && !memcmp(model.s, "gpt2", 4);
    if (!spm && !bpe)
        return pd_error("%s: GGUF tokenizer model '%.*s' is not supported (llama, gpt2)", what,
                        (int)(model.len > 40 ? 40 : model.len), model.s);
    const PreSpec *pre = NULL;
    if (bpe) {
        GgufStr name = {"default", 7};
        if (gguf_find(g, "tokenizer.ggml.pre") && gguf_get_str(g, "tokenizer.ggml.pre", &name)) return -1;
        if (!(pre = pre_spec(name.s, name.len)))
            return pd_error("%s: GGUF pre-tokenizer '%.*s' is not supported", what,
                            (int)(name.len > 40 ? 40 : name.len), name.s);
    }
    int bad = 0;
    const GgufKV *tokens = array_of(g, "tokenizer.ggml.tokens", -1, GGUF_STRING, GGUF_STRING, what, &bad);
    if (bad) return -1;
    if (!tokens || tokens->n == 0) return pd_error("%s: tokenizer.ggml.tokens is missing", what);
    if (tokens->n > TOK_MAX_VOCAB)
        return pd_error("%s: %llu tokens is not plausible", what, (unsigned long long)tokens->n);
    int n = (int)tokens->n;
    const GgufKV *scores = array_of(g, "tokenizer.ggml.scores", n, GGUF_F32, GGUF_F32, what, &bad);
    const GgufKV *types = array_of(g, "tokenizer.ggml.token_type", n, GGUF_I32, GGUF_U32, what, &bad);
    if (bad) return -1;
    size_t bytes = 0;
    for (int i = 0; i < n; i++) bytes += tokens->strs[i].len;

    Tokenizer *t = tok_new(spm ? TOK_SPM : TOK_BPE, n, bytes);
    if (!t) return pd_error_prefix(what);
    t->form = spm ? FORM_SPACE : FORM_BYTELEVEL;
    t->byte_units = bpe;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        int type = types ? piece_type(rd_i32_at(types, i)) : PIECE_NORMAL;
        if (scores) memcpy(&t->score[i], (const char *)scores->data + 4 * (size_t)i, 4);
        /* only normal pieces are written in the vocabulary's form (llama.cpp decodes
           control and user-defined ones as they are) */
        rc = tok_put_piece(t, i, tokens->strs[i].s, tokens->strs[i].len, type, type == PIECE_NORMAL, what);
    }
    rc = rc ? rc : tok_index(t, what);
    if (!rc && bpe) {
        t->ignore_merges = pre->ignore_merges;
        t->unk_blocks = 1; /* llama.cpp drops a byte with no piece, keeping it as a wall */
        rc = put_merges(t, g, what);
        for (int i = 0; i < 4 && pre->re[i] && !rc; i++)
            rc = tok_add_regex(t, pre->re[i], strlen(pre->re[i]), 0, 0, what);
    }
    if (!rc && spm) {
        t->byte_fallback = 1;
        t->prefix = opt_bool(g, "tokenizer.ggml.add_space_prefix", 1, &bad) ? PREFIX_EVERY : PREFIX_NONE;
        t->strip_space = t->prefix != PREFIX_NONE;
    }
    if (!rc) {
        t->bos = token_id(g, "tokenizer.ggml.bos_token_id", spm ? 1 : -1, n, what, &bad);
        t->eos = token_id(g, "tokenizer.ggml.eos_token_id", spm ? 2 : -1, n, what, &bad);
        t->unk = token_id(g, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, n, what, &bad);
        int extra[2] = {token_id(g, "tokenizer.ggml.eot_token_id", -1, n, what, &bad),
                        token_id(g, "tokenizer.ggml.eom_token_id", -1, n, what, &bad)};
        t->add_bos = opt_bool(g, "tokenizer.ggml.add_bos_token", spm || pre->add_bos, &bad);
        if (t->unk >= 0 && t->type[t->unk] == PIECE_NORMAL) t->unk = -1; /* a default that misses */
        tok_set_eog(t, extra, 2);
        rc = bad;
    }
    if (rc) {
        tok_free(t);
        return -1;
    }
    *out = t;
    return 0;
}
