/* tokenizer.c — text ↔ token ids; see tokenizer.h. The loaders of tokenizer.json and
   GGUF vocabularies live in tokenizer_json.c and tokenizer_gguf.c; this file holds what
   every kind shares: the piece map, special-token matching, the two merge loops (SPM:
   by piece score, as llama.cpp's llm_tokenizer_spm; BPE: by pair rank, as HF's
   tokenizers and llama.cpp's llm_tokenizer_bpe), the pre-tokenizer, decoding, and
   llama2.c's tokenizer.bin. */
#include "base/util.h"
#include "formats/gguf.h"
#include "tokenizer/tokenizer_impl.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* ---- construction ---- */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68
   bytes become U+0100.. in byte order. Kept backwards: code point -> byte. */
static void bytelevel_alphabet(int16_t *cp_byte) {
    for (int c = 0; c < 324; c++) cp_byte[c] = -1;
    int k = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        cp_byte[printable ? b : 256 + k++] = (int16_t)b;
    }
}

Tokenizer *tok_new(TokKind kind, int n_vocab, size_t text_budget) {
    if (n_vocab <= 0 || n_vocab > TOK_MAX_VOCAB) {
        pd_error("a vocabulary of %d pieces is not plausible", n_vocab);
        return NULL;
    }
    if (text_budget > UINT32_MAX - (size_t)n_vocab - 1) { /* piece offsets are 32-bit */
        pd_error("%zu bytes of piece text is too large for a tokenizer", text_budget);
        return NULL;
    }
    Tokenizer *t = pd_alloc(sizeof *t);
    if (!t) return NULL;
    t->kind = kind;
    t->n_vocab = n_vocab;
    t->text_cap = text_budget + (size_t)n_vocab + 1; /* + one NUL per piece */
    t->text = pd_alloc(t->text_cap);
    t->off = pd_alloc(pd_mul(n_vocab, sizeof *t->off));
    t->len = pd_alloc(pd_mul(n_vocab, sizeof *t->len));
    t->score = pd_alloc(pd_mul(n_vocab, sizeof *t->score));
    t->type = pd_alloc(n_vocab);
    if (!t->text || !t->off || !t->len || !t->score || !t->type) {
        tok_free(t);
        return NULL;
    }
    memset(t->type, PIECE_UNUSED, (size_t)n_vocab); /* ids no source names stay unused */
    t->text_used = 1;                               /* offset 0 is the empty piece every unused id points at */
    t->unk = t->bos = t->eos = t->unk_sym = -1;
    for (int b = 0; b < 256; b++) {
        t->byte_id[b] = t->unit_id[b] = -1;
        t->bytes[b] = (char)b;
    }
    bytelevel_alphabet(t->bl_byte);
    return t;
}

int tok_convert(const Tokenizer *t, const char *s, size_t n, char *out) {
    size_t k = 0;
    if (t->form == FORM_BYTELEVEL) {
        const unsigned char *p = (const unsigned char *)s;
        for (size_t i = 0; i < n;) {
            unsigned cp;
            if (p[i] < 0x80) cp = p[i++];
            else if ((p[i] & 0xE0) == 0xC0 && i + 1 < n && (p[i + 1] & 0xC0) == 0x80) {
                cp = (p[i] & 0x1Fu) << 6 | (p[i + 1] & 0x3Fu);
                i += 2;
            } else return -1; /* three bytes and more are beyond the alphabet's U+0143 */
            if (cp >= 324 || t->bl_byte[cp] < 0) return -1;
            out[k++] = (char)t->bl_byte[cp];
        }
        return (int)k;
    }
    for (size_t i = 0; i < n;) {
        if (t->form == FORM_SPACE && n - i >= 3 && !memcmp(s + i, "\xe2\x96\x81", 3)) {
            out[k++] = ' ';
            i += 3;
        } else out[k++] = s[i++];
    }
    return (int)k;
}

int tok_put_piece(Tokenizer *t, int id, const char *s, size_t n, int type, int convert, const char *what) {
    if (id < 0 || id >= t->n_vocab)
        return pd_error("%s: piece id %d outside the vocabulary of %d", what, id, t->n_vocab);
    if (n > t->text_cap - t->text_used - 1) return pd_error("%s: piece %d does not fit the text budget", what, id);
    char *dst = t->text + t->text_used;
    int k = convert ? tok_convert(t, s, n, dst) : -1;
    if (k < 0) { /* raw, or outside the byte-level alphabet: kept as written */
        memcpy(dst, s, n);
        k = (int)n;
    }
    dst[k] = 0;
    t->off[id] = (uint32_t)t->text_used;
    t->len[id] = (uint32_t)k;
    t->type[id] = (uint8_t)type;
    t->text_used += (size_t)k + 1;
    return 0;
}

/* ---- the piece map ---- */

static uint32_t piece_hash(const char *s, size_t n) { return (uint32_t)XXH3_64bits(s, n); }

int tok_lookup(const Tokenizer *t, const char *s, size_t n) {
    if (n == 0 || n > t->max_len) return -1;
    for (uint32_t h = piece_hash(s, n) & t->slot_mask;; h = (h + 1) & t->slot_mask) {
        int id = t->slot[h];
        if (id < 0) return -1;
        if (t->len[id] == n && !memcmp(t->text + t->off[id], s, n)) return id;
    }
}

static int build_map(Tokenizer *t) {
    size_t cap = 16;
    while (cap < 2 * (size_t)t->n_vocab) cap *= 2; /* load ≤ 1/2 keeps probes short */
    t->slot = pd_alloc(pd_mul(cap, sizeof *t->slot));
    if (!t->slot) return -1;
    memset(t->slot, 0xff, cap * sizeof *t->slot);
    t->slot_mask = (uint32_t)(cap - 1);
    for (int id = 0; id < t->n_vocab; id++) {
        if (t->type[id] != PIECE_NORMAL || t->len[id] == 0) continue;
        const char *s = t->text + t->off[id];
        uint32_t h = piece_hash(s, t->len[id]) & t->slot_mask;
        int dup = 0;
        for (; t->slot[h] >= 0; h = (h + 1) & t->slot_mask) {
            int o = t->slot[h];
            if (t->len[o] == t->len[id] && !memcmp(t->text + t->off[o], s, t->len[id])) dup = 1;
        }
        if (dup) continue; /* the first (lowest) id of a repeated piece wins */
        t->slot[h] = id;
        if (t->len[id] > t->max_len) t->max_len = t->len[id];
    }
    return 0;
}

typedef struct {
    unsigned char first;
    uint32_t len;
    int32_t id;
} SpecialKey;

/* by first byte, then longest first (leftmost-longest matching tries them in order) */
static int special_order(const void *pa, const void *pb) {
    const SpecialKey *a = pa, *b = pb;
    if (a->first != b->first) return a->first < b->first ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

static int is_special(const Tokenizer *t, int id) {
    int ty = t->type[id];
    return t->len[id] > 0 && (ty == PIECE_CONTROL || ty == PIECE_UNKNOWN || ty == PIECE_USER);
}

static int build_specials(Tokenizer *t) {
    int n = 0;
    for (int id = 0; id < t->n_vocab; id++) n += is_special(t, id);
    SpecialKey *keys = pd_alloc(sizeof *keys * ((size_t)n + 1));
    t->special = pd_alloc(sizeof *t->special * ((size_t)n + 1));
    if (!keys || !t->special) {
        free(keys);
        return -1;
    }
    for (int id = 0; id < t->n_vocab; id++)
        if (is_special(t, id)) {
            keys[t->n_special++] = (SpecialKey){(unsigned char)t->text[t->off[id]], t->len[id], id};
            t->n_user += t->type[id] == PIECE_USER;
        }
    qsort(keys, (size_t)n, sizeof *keys, special_order);
    int k = 0;
    for (int c = 0; c <= 256; c++) {
        while (k < n && keys[k].first < c) k++;
        t->special_from[c] = k;
    }
    for (int i = 0; i < n; i++) t->special[i] = keys[i].id;
    free(keys);
    return 0;
}

int tok_byte_piece_value(const char *s, uint32_t n) {
    static const char hex[] = "0123456789ABCDEF0123456789abcdef";
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    const char *hi = memchr(hex, s[3], 32), *lo = memchr(hex, s[4], 32);
    if (!hi || !lo || !s[3] || !s[4]) return -1;
    return (int)((hi - hex) % 16) * 16 + (int)((lo - hex) % 16);
}

int tok_index(Tokenizer *t, const char *what) {
    for (int id = 0; id < t->n_vocab; id++) {
        if (t->type[id] != PIECE_BYTE) continue;
        int b = tok_byte_piece_value(t->text + t->off[id], t->len[id]);
        if (b < 0)
            return pd_error("%s: piece %d ('%.*s') is typed as a byte but is not <0xXX>", what, id,
                            (int)(t->len[id] > 40 ? 40 : t->len[id]), t->text + t->off[id]);
        if (t->byte_id[b] < 0) t->byte_id[b] = id;
    }
    if (build_map(t) || build_specials(t)) return pd_error_prefix(what);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->unit_id[b] = tok_lookup(t, &c, 1);
    }
    return 0;
}

/* ---- merges (TOK_BPE): (left id, right id) -> (rank, merged id) ---- */

static uint32_t pair_hash(int32_t l, int32_t r) {
    uint64_t x = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (uint32_t)x;
}

int tok_merges_init(Tokenizer *t, int n_merges) {
    size_t cap = 16;
    while (cap < 2 * (size_t)n_merges) cap *= 2;
    t->merge = pd_alloc(pd_mul(cap, sizeof *t->merge));
    if (!t->merge) return -1;
    for (size_t i = 0; i < cap; i++) t->merge[i].left = -1;
    t->merge_mask = (uint32_t)(cap - 1);
    return 0;
}

static const MergeSlot *merge_find(const Tokenizer *t, int32_t l, int32_t r) {
    if (!t->merge) return NULL;
    for (uint32_t h = pair_hash(l, r) & t->merge_mask;; h = (h + 1) & t->merge_mask) {
        const MergeSlot *m = &t->merge[h];
        if (m->left < 0) return NULL;
        if (m->left == l && m->right == r) return m;
    }
}

/* a piece named by a merge: converted like the vocabulary, looked up */
static int merge_piece(const Tokenizer *t, const char *s, size_t n, char *buf) {
    int k = tok_convert(t, s, n, buf);
    return k < 0 ? tok_lookup(t, s, n) : tok_lookup(t, buf, (size_t)k);
}

int tok_add_merge(Tokenizer *t, const char *a, size_t na, const char *b, size_t nb, int rank, const char *what) {
    char stack[256];
    char *buf = na + nb <= sizeof stack ? stack : pd_alloc(na + nb);
    if (!buf) return -1;
    int l = merge_piece(t, a, na, buf), r = merge_piece(t, b, nb, buf);
    int rc = 0, id = -1;
    if (l < 0 || r < 0) {
        rc = pd_error("%s: merge %d ('%.*s %.*s') names a piece not in the vocabulary", what, rank,
                      (int)(na > 40 ? 40 : na), a, (int)(nb > 40 ? 40 : nb), b);
    } else {
        size_t ll = t->len[l], rl = t->len[r];
        memcpy(buf, t->text + t->off[l], ll);
        memcpy(buf + ll, t->text + t->off[r], rl);
        id = tok_lookup(t, buf, ll + rl);
        if (id < 0)
            rc = pd_error("%s: merge %d ('%.*s %.*s') makes a piece not in the vocabulary", what, rank,
                          (int)(na > 40 ? 40 : na), a, (int)(nb > 40 ? 40 : nb), b);
    }
    if (buf != stack) free(buf);
    if (rc) return rc;
    if ((size_t)t->n_merges * 2 >= (size_t)t->merge_mask + 1) return pd_error("%s: more merges than announced", what);
    uint32_t h = pair_hash(l, r) & t->merge_mask;
    for (; t->merge[h].left >= 0; h = (h + 1) & t->merge_mask)
        if (t->merge[h].left == l && t->merge[h].right == r) return 0; /* the first rank wins */
    t->merge[h] = (MergeSlot){l, r, rank, id};
    t->n_merges++;
    return 0;
}

/* ---- pre-tokenizer steps ---- */

int tok_add_regex(Tokenizer *t, const char *pattern, size_t n, int literal, int removed, const char *what) {
    if (t->n_pre == TOK_MAX_PRE) return pd_error("%s: more than %d pre-tokenizer steps", what, TOK_MAX_PRE);
    /* MATCH_INVALID_UTF: text that is not UTF-8 is matched (invalid bytes never match,
       so they end up between matches, pieces of their own) without a whole-subject
       validity check on every call; UCP: \s, \d, \w follow Unicode as HF's onig does */
    uint32_t opts = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    int err;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, n, opts, &err, &at, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return pd_error("%s: the pre-tokenizer regex '%.*s' does not compile (at offset %zu): %s", what,
                        (int)(n > 60 ? 60 : n), pattern, (size_t)at, (char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* when JIT is missing the interpreter runs */
    t->pre[t->n_pre++] = (PreStep){PRE_REGEX, removed, re};
    return 0;
}

int tok_add_step(Tokenizer *t, int kind, const char *what) {
    if (t->n_pre == TOK_MAX_PRE) return pd_error("%s: more than %d pre-tokenizer steps", what, TOK_MAX_PRE);
    t->pre[t->n_pre++] = (PreStep){kind, 0, NULL};
    return 0;
}

static int find_exact(const Tokenizer *t, const char *s, size_t n) {
    for (int id = 0; id < t->n_vocab; id++)
        if (t->len[id] == n && t->type[id] != PIECE_UNUSED && !memcmp(t->text + t->off[id], s, n)) return id;
    return -1;
}

void tok_set_eog(Tokenizer *t, const int *extra, int n_extra) {
    /* the turn and text ends of the chat formats paradec knows (Llama 3, ChatML, Gemma,
       Phi-3, SentencePiece, GPT-2) */
    static const char *names[] = {"<|eot_id|>",    "<|eom_id|>",    "<|end_of_text|>", "<|im_end|>",
                                  "<|endoftext|>", "<end_of_turn>", "<|end|>",         "</s>"};
    t->n_eog = 0;
    int cand[TOK_MAX_EOG];
    int nc = 0;
    cand[nc++] = t->eos;
    for (int i = 0; i < n_extra && nc < TOK_MAX_EOG; i++) cand[nc++] = extra[i];
    for (size_t i = 0; i < sizeof names / sizeof *names && nc < TOK_MAX_EOG; i++) {
        int id = find_exact(t, names[i], strlen(names[i]));
        cand[nc++] = id >= 0 && t->type[id] == PIECE_CONTROL ? id : -1;
    }
    for (int i = 0; i < nc; i++) {
        int dup = cand[i] < 0 || cand[i] >= t->n_vocab;
        for (int j = 0; j < t->n_eog && !dup; j++) dup = t->eog[j] == cand[i];
        if (!dup) t->eog[t->n_eog++] = cand[i];
    }
}

/* ---- llama2.c tokenizer.bin ---- */

/* types and special ids from the pieces' text: tokenizer.bin stores no types, but
   llama2.c's exporter writes BOS/EOS as "\n<s>\n" / "\n</s>\n" and SentencePiece's
   byte fallback pieces are "<0xXX>", so the text says which is which */
static void classify(Tokenizer *t) {
    for (int id = 0; id < t->n_vocab; id++) {
        t->type[id] = PIECE_NORMAL;
        if (tok_byte_piece_value(t->text + t->off[id], t->len[id]) >= 0) t->type[id] = PIECE_BYTE;
    }
    t->bos = find_exact(t, "\n<s>\n", 5);
    if (t->bos < 0) t->bos = find_exact(t, "<s>", 3);
    t->eos = find_exact(t, "\n</s>\n", 6);
    if (t->eos < 0) t->eos = find_exact(t, "</s>", 4);
    t->unk = find_exact(t, "<unk>", 5);
    if (t->bos >= 0) t->type[t->bos] = PIECE_CONTROL;
    if (t->eos >= 0) t->type[t->eos] = PIECE_CONTROL;
    if (t->unk >= 0) t->type[t->unk] = PIECE_UNKNOWN;
}

static int32_t rd_i32(const unsigned char *p) {
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    int32_t v;
    memcpy(&v, &u, 4);
    return v;
}

static float rd_f32(const unsigned char *p) {
    uint32_t u = (uint32_t)rd_i32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* walks the entries once: counts them and checks every one, so the second pass that
   copies them cannot fail. Layout: int32 max_token_length, then until the end of the
   data {float32 score, int32 len, len bytes}. max_token_length is not enforced on the
   pieces (nothing here depends on it; exporters differ on bytes vs characters). */
static int llama2c_scan(const unsigned char *p, size_t n, const char *what, int *count) {
    if (n < 4) return pd_error("%s: too short for a llama2.c tokenizer (%zu bytes)", what, n);
    if (n > (size_t)INT32_MAX) /* piece offsets are 32-bit */
        return pd_error("%s: %zu bytes is too large for a tokenizer", what, n);
    int32_t mtl = rd_i32(p);
    if (mtl <= 0 || mtl > (1 << 20)) return pd_error("%s: max_token_length %d is not plausible", what, (int)mtl);
    size_t at = 4;
    int k = 0;
    while (at < n) {
        if (k >= TOK_MAX_VOCAB) return pd_error("%s: more than %d entries: not a tokenizer", what, TOK_MAX_VOCAB);
        if (n - at < 8) return pd_error("%s: entry %d is truncated (header)", what, k);
        float score = rd_f32(p + at);
        int32_t len = rd_i32(p + at + 4);
        if (!isfinite(score)) return pd_error("%s: entry %d has a non-finite score", what, k);
        if (len < 0) return pd_error("%s: entry %d has negative length %d", what, k, (int)len);
        if ((size_t)len > n - at - 8)
            return pd_error("%s: entry %d is truncated (length %d, %zu bytes left)", what, k, (int)len, n - at - 8);
        at += 8 + (size_t)len;
        k++;
    }
    if (k == 0) return pd_error("%s: empty vocabulary", what);
    *count = k;
    return 0;
}

int tok_load_llama2c(Tokenizer **out, const void *bytes, size_t n, const char *what) {
    *out = NULL;
    const unsigned char *p = bytes;
    int count = 0;
    if (llama2c_scan(p, n, what, &count)) return -1;
    Tokenizer *t = tok_new(TOK_SPM, count, n); /* the pieces fit in the file's bytes */
    if (!t) return pd_error_prefix(what);
    size_t at = 4;
    for (int id = 0; id < count; id++) {
        uint32_t len = (uint32_t)rd_i32(p + at + 4);
        t->score[id] = rd_f32(p + at);
        tok_put_piece(t, id, (const char *)p + at + 8, len, PIECE_NORMAL, 0, what);
        at += 8 + len;
    }
    classify(t);
    /* SentencePiece: a space in front of the text, taken back when decoding */
    t->prefix = PREFIX_EVERY;
    t->strip_space = 1;
    t->add_bos = t->bos >= 0;
    if (tok_index(t, what)) {
        tok_free(t);
        return -1;
    }
    tok_set_eog(t, NULL, 0);
    *out = t;
    return 0;
}

/* the llama2.c layout has no magic: it is recognised by a plausible header and a
   plausible first entry, so a damaged one still gets its precise error */
static int looks_llama2c(const unsigned char *p, size_t n) {
    if (n < 12) return 0;
    int32_t mtl = rd_i32(p), len = rd_i32(p + 8);
    return mtl > 0 && mtl <= 4096 && isfinite(rd_f32(p + 4)) && len >= 0 && len <= 4096;
}

static int looks_json(const unsigned char *p, size_t n) {
    size_t i = 0;
    if (n >= 3 && !memcmp(p, "\xef\xbb\xbf", 3)) i = 3; /* a UTF-8 byte order mark */
    while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r')) i++;
    return i < n && p[i] == '{';
}

static int load_gguf_bytes(Tokenizer **out, const void *bytes, size_t n, const char *what) {
    Gguf g;
    if (gguf_parse(&g, bytes, n, what)) return -1;
    int rc = tok_load_gguf(out, &g, what);
    gguf_close(&g);
    return rc;
}

int tok_load_bytes(Tokenizer **out, const void *bytes, size_t n, const char *kind, const char *what) {
    *out = NULL;
    const unsigned char *p = bytes;
    if (kind) {
        if (!strcmp(kind, "llama2c")) return tok_load_llama2c(out, bytes, n, what);
        if (!strcmp(kind, "hf-json")) return tok_load_hf_json(out, bytes, n, what);
        if (!strcmp(kind, "gguf")) return load_gguf_bytes(out, bytes, n, what);
        return pd_error("%s: tokenizer kind '%s' is unknown (llama2c, hf-json, gguf)", what, kind);
    }
    if (n >= 4 && !memcmp(p, "GGUF", 4)) return load_gguf_bytes(out, bytes, n, what);
    if (n >= 2 && p[0] == 0x1f && p[1] == 0x8b)
        return pd_error("%s: gzip-compressed; name it *.gz or decompress it first", what);
    if (looks_json(p, n)) return tok_load_hf_json(out, bytes, n, what);
    if (looks_llama2c(p, n)) return tok_load_llama2c(out, bytes, n, what);
    return pd_error("%s: not a tokenizer paradec knows", what);
}

int tok_load_file(Tokenizer **out, const char *path) {
    *out = NULL;
    /* a GGUF file is mapped, not read: a whole model may hold the vocabulary */
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : NULL;
    char magic[4] = {0};
    int is_gguf = f && fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
    if (f) fclose(f);
    if (is_gguf) {
        Gguf g;
        if (gguf_open(&g, path)) return -1;
        int rc = tok_load_gguf(out, &g, path);
        gguf_close(&g);
        return rc;
    }
    char *data;
    size_t n;
    if (pd_read_file_gz(path, &data, &n)) return -1;
    int rc = tok_load_bytes(out, data, n, NULL, path);
    free(data);
    return rc;
}

void tok_free(Tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_pre; i++) pcre2_code_free(t->pre[i].re);
    free(t->text);
    free(t->off);
    free(t->len);
    free(t->score);
    free(t->type);
    free(t->slot);
    free(t->merge);
    free(t->special);
    free(t);
}

int tok_vocab_size(const Tokenizer *t) { return t->n_vocab; }
int tok_bos(const Tokenizer *t) { return t->bos; }
int tok_eos(const Tokenizer *t) { return t->eos; }
int tok_add_bos(const Tokenizer *t) { return t->add_bos && t->bos >= 0; }
TokKind tok_kind(const Tokenizer *t) { return t->kind; }

int tok_is_eog(const Tokenizer *t, int id) {
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return 1;
    return 0;
}

int tok_find(const Tokenizer *t, const char *piece) {
    size_t n = strlen(piece);
    int id = tok_lookup(t, piece, n);
    return id >= 0 ? id : find_exact(t, piece, n);
}

/* ---- encoding: the shared machinery ---- */

/* length of the UTF-8 character at s (n bytes left); an invalid or truncated
   sequence is one byte long, so it becomes a byte-fallback symbol of its own */
static int utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    int k = c < 0x80 ? 1 : c < 0xC2 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF5 ? 4 : 0;
    if (k <= 1 || (size_t)k > n) return 1;
    for (int i = 1; i < k; i++)
        if ((s[i] & 0xC0) != 0x80) return 1;
    if ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] > 0x9F) || /* overlong, surrogate */
        (c == 0xF0 && s[1] < 0x90) || (c == 0xF4 && s[1] > 0x8F))   /* overlong, > U+10FFFF */
        return 1;
    return k;
}

typedef struct {
    int prev, next; /* neighbours in the live list, -1 at the ends */
    int start, n;   /* bytes [start, start+n) of the text; n == 0: merged away */
    int32_t id;     /* BPE: the symbol's piece */
} Sym;

typedef struct {
    float score;      /* higher first: SPM the piece's score, BPE minus the merge rank */
    int left, right;  /* symbol indices */
    int size;         /* SPM: bytes of the pair when queued: stale when either side changed */
    int32_t lid, rid; /* BPE: the pair's ids when queued, likewise */
    int32_t id;       /* BPE: the merged piece */
} Bigram;

/* max-heap order: higher score first, ties to the leftmost pair */
static int bigram_before(const Bigram *a, const Bigram *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

typedef struct {
    Bigram *a;
    int n;
} Heap;

static void heap_push(Heap *h, Bigram b) {
    int i = h->n++;
    while (i > 0) {
        int up = (i - 1) / 2;
        if (!bigram_before(&b, &h->a[up])) break;
        h->a[i] = h->a[up];
        i = up;
    }
    h->a[i] = b;
}

static Bigram heap_pop(Heap *h) {
    Bigram top = h->a[0], last = h->a[--h->n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && bigram_before(&h->a[c + 1], &h->a[c])) c++;
        if (!bigram_before(&h->a[c], &last)) break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n > 0) h->a[i] = last;
    return top;
}

/* one encode call's scratch, sized for its longest fragment (n bytes + the prefix) */
typedef struct {
    const Tokenizer *t;
    char *buf; /* [n+1] the fragment with its prefix space */
    Sym *sym;  /* [n+1] */
    Heap heap; /* room for 3(n+1): n-1 pairs, then two per merge */
    pcre2_match_data *md[TOK_MAX_PRE];
    int32_t *out; /* the ids so far */
    int k;
} Work;

/* ---- SPM: merges by piece score (llama.cpp's llm_tokenizer_spm) ---- */

static void spm_bigram(Work *w, const char *text, int l, int r) {
    if (l < 0 || r < 0) return;
    const Tokenizer *t = w->t;
    int size = w->sym[l].n + w->sym[r].n;
    int id = tok_lookup(t, text + w->sym[l].start, (size_t)size);
    if (id < 0) return;
    heap_push(&w->heap, (Bigram){t->score[id], l, r, size, 0, 0, id});
}

/* appends the ids of one final symbol: its piece, else one byte piece per byte */
static int emit_symbol(Work *w, const char *s, int n) {
    const Tokenizer *t = w->t;
    int id = tok_lookup(t, s, (size_t)n);
    if (id >= 0) {
        w->out[w->k++] = id;
        return 0;
    }
    for (int i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        int bid = t->byte_id[b] >= 0 ? t->byte_id[b] : t->unk;
        if (bid < 0) return pd_error("tokenizer has no piece for byte 0x%02X and no <unk>", b);
        w->out[w->k++] = bid;
    }
    return 0;
}

static int spm_encode(Work *w, const char *text, int n) {
    Sym *sym = w->sym;
    int ns = 0;
    w->heap.n = 0;
    for (int at = 0; at < n; ns++) {
        int len = utf8_len((const unsigned char *)text + at, (size_t)(n - at));
        sym[ns] = (Sym){ns - 1, at + len < n ? ns + 1 : -1, at, len, -1};
        at += len;
    }
    for (int i = 1; i < ns; i++) spm_bigram(w, text, i - 1, i);
    while (w->heap.n > 0) {
        Bigram b = heap_pop(&w->heap);
        Sym *l = &sym[b.left], *r = &sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = b.left;
        spm_bigram(w, text, l->prev, b.left);
        spm_bigram(w, text, b.left, l->next);
    }
    for (int i = ns > 0 ? 0 : -1; i >= 0; i = sym[i].next)
        if (emit_symbol(w, text + sym[i].start, sym[i].n)) return -1;
    return 0;
}

/* ---- BPE: merges by pair rank (HF tokenizers' BPE, llama.cpp's llm_tokenizer_bpe) ---- */

static void bpe_bigram(Work *w, int l, int r) {
    if (l < 0 || r < 0 || w->sym[l].id < 0 || w->sym[r].id < 0) return;
    const MergeSlot *m = merge_find(w->t, w->sym[l].id, w->sym[r].id);
    if (!m) return;
    heap_push(&w->heap, (Bigram){-(float)m->rank, l, r, 0, w->sym[l].id, w->sym[r].id, m->id});
}

static int push_sym(Work *w, int *ns, int start, int n, int32_t id) {
    Sym *s = w->sym;
    s[*ns] = (Sym){*ns - 1, -1, start, n, id};
    if (*ns > 0) s[*ns - 1].next = *ns;
    (*ns)++;
    return 0;
}

/* the initial symbols of a word: one per byte (byte-level) or per character; a
   character the vocabulary lacks becomes its byte pieces (byte fallback), <unk>, or
   nothing (SmolLM2's vocabulary has no piece for some control and non-UTF-8 bytes) */
static int bpe_symbols(Work *w, const char *s, int n, int *ns) {
    const Tokenizer *t = w->t;
    *ns = 0;
    for (int at = 0; at < n;) {
        int u = t->byte_units ? 1 : utf8_len((const unsigned char *)s + at, (size_t)(n - at));
        int id = t->byte_units ? t->unit_id[(unsigned char)s[at]] : tok_lookup(t, s + at, (size_t)u);
        if (id >= 0) {
            push_sym(w, ns, at, u, id);
        } else {
            int ok = t->byte_fallback;
            for (int i = 0; i < u && ok; i++) ok = t->byte_id[(unsigned char)s[at + i]] >= 0;
            if (ok) {
                for (int i = 0; i < u; i++) push_sym(w, ns, at + i, 1, t->byte_id[(unsigned char)s[at + i]]);
            } else if (t->unk_sym >= 0) {
                Sym *last = *ns > 0 ? &w->sym[*ns - 1] : NULL;
                if (t->fuse_unk && last && last->id == t->unk_sym) last->n += u;
                else push_sym(w, ns, at, u, t->unk_sym);
            } else if (t->unk_blocks) { /* dropped, but merges do not reach across it */
                push_sym(w, ns, at, u, -1);
            } /* else dropped, as HF does: such a vocabulary cannot say it */
        }
        at += u;
    }
    return 0;
}

static int bpe_word(Work *w, const char *s, int n) {
    const Tokenizer *t = w->t;
    if (n <= 0) return 0;
    if (t->ignore_merges) {
        int id = tok_lookup(t, s, (size_t)n);
        if (id >= 0) {
            w->out[w->k++] = id;
            return 0;
        }
    }
    int ns;
    if (bpe_symbols(w, s, n, &ns)) return -1;
    Sym *sym = w->sym;
    w->heap.n = 0;
    for (int i = 1; i < ns; i++) bpe_bigram(w, i - 1, i);
    while (w->heap.n > 0) {
        Bigram b = heap_pop(&w->heap);
        Sym *l = &sym[b.left], *r = &sym[b.right];
        if (l->n == 0 || r->n == 0 || l->next != b.right || l->id != b.lid || r->id != b.rid)
            continue; /* stale: a side has merged since */
        l->n += r->n;
        l->id = b.id;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = b.left;
        bpe_bigram(w, l->prev, b.left);
        bpe_bigram(w, b.left, l->next);
    }
    for (int i = ns > 0 ? 0 : -1; i >= 0; i = sym[i].next)
        if (sym[i].id >= 0) w->out[w->k++] = sym[i].id;
    return 0;
}

/* step `step` of the pre-tokenizer on piece s; the last step hands words to BPE */
static int pretokenize(Work *w, int step, const char *s, int n) {
    const Tokenizer *t = w->t;
    if (n <= 0) return 0;
    if (step == t->n_pre) return bpe_word(w, s, n);
    const PreStep *p = &t->pre[step];
    if (p->kind == PRE_SPACE_SPLIT) { /* Metaspace: a new piece at every space */
        int from = 0;
        for (int i = 1; i <= n; i++)
            if (i == n || s[i] == ' ') {
                if (pretokenize(w, step + 1, s + from, i - from)) return -1;
                from = i;
            }
        return 0;
    }
    /* a regex split: matches and the gaps between them are pieces (HF "Isolated",
       llama.cpp's unicode_regex_split); "Removed" drops the matches */
    pcre2_match_data *md = w->md[step];
    PCRE2_SPTR subj = (PCRE2_SPTR)s;
    size_t at = 0, gap = 0, len = (size_t)n;
    while (at < len) {
        int rc = pcre2_match(p->re, subj, len, at, 0, md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* JIT's 32K stack: the interpreter's is the heap */
            rc = pcre2_match(p->re, subj, len, at, PCRE2_NO_JIT, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[120];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return pd_error("pre-tokenizer regex failed: %s", (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) { /* an empty match splits nothing: search on from the next character */
            if (ms >= len) break;
            at = ms + (size_t)utf8_len((const unsigned char *)s + ms, len - ms);
            continue;
        }
        if (ms > gap && pretokenize(w, step + 1, s + gap, (int)(ms - gap))) return -1;
        if (!p->removed && pretokenize(w, step + 1, s + ms, (int)(me - ms))) return -1;
        at = gap = me;
    }
    return gap < len ? pretokenize(w, step + 1, s + gap, (int)(len - gap)) : 0;
}

/* text[start, end): the text between two special tokens */
static int encode_fragment(Work *w, const char *text, size_t start, size_t end) {
    const Tokenizer *t = w->t;
    if (end <= start) return 0;
    int pre = t->prefix == PREFIX_EVERY || (t->prefix == PREFIX_FIRST && start == 0);
    if (pre && t->prefix_unless_space && text[start] == ' ') pre = 0;
    char *s = w->buf;
    int n = 0;
    if (pre) s[n++] = ' ';
    memcpy(s + n, text + start, end - start);
    n += (int)(end - start);
    return t->kind == TOK_SPM ? spm_encode(w, s, n) : pretokenize(w, 0, s, n);
}

/* the special token at text (n bytes left), -1 when none: leftmost-longest, as HF's
   added-vocabulary matcher */
static int special_at(const Tokenizer *t, const char *text, size_t n, int flags) {
    unsigned char c = (unsigned char)text[0];
    for (int i = t->special_from[c]; i < t->special_from[c + 1]; i++) {
        int id = t->special[i];
        if (t->type[id] != PIECE_USER && !(flags & TOK_SPECIAL)) continue;
        if (t->len[id] <= n && !memcmp(text, t->text + t->off[id], t->len[id])) return id;
    }
    return -1;
}

int tok_encode_flags(const Tokenizer *t, const char *text, size_t len, int flags, int32_t **ids, int *n) {
    *ids = NULL;
    *n = 0;
    if (len > (size_t)INT_MAX / 8) return pd_error("text of %zu bytes is too long to encode", len);
    if ((flags & TOK_ADD_BOS) && t->bos < 0) return pd_error("tokenizer has no BOS token");
    Work w = {.t = t};
    /* every byte gives at most one id (byte fallback), every fragment one prefix space
       (fragments ≤ bytes), plus BOS */
    w.out = pd_alloc((2 * len + 3) * sizeof *w.out);
    w.buf = pd_alloc(len + 2);
    w.sym = pd_alloc((len + 2) * sizeof *w.sym);
    w.heap.a = pd_alloc(3 * (len + 2) * sizeof *w.heap.a);
    int rc = -1;
    if (!w.out || !w.buf || !w.sym || !w.heap.a) goto done;
    for (int i = 0; i < t->n_pre; i++)
        if (t->pre[i].re && !(w.md[i] = pcre2_match_data_create_from_pattern(t->pre[i].re, NULL))) {
            pd_error("out of memory for the pre-tokenizer");
            goto done;
        }
    if (flags & TOK_ADD_BOS) w.out[w.k++] = t->bos;
    size_t start = 0;
    if (t->n_special > 0 && ((flags & TOK_SPECIAL) || t->n_user > 0)) {
        for (size_t i = 0; i < len;) {
            int id = special_at(t, text + i, len - i, flags);
            if (id < 0) {
                i++;
                continue;
            }
            if (encode_fragment(&w, text, start, i)) goto done;
            w.out[w.k++] = id;
            i += t->len[id];
            start = i;
        }
    }
    if (encode_fragment(&w, text, start, len)) goto done;
    rc = 0;
done:
    for (int i = 0; i < t->n_pre; i++) pcre2_match_data_free(w.md[i]);
    free(w.buf);
    free(w.sym);
    free(w.heap.a);
    if (rc) {
        free(w.out);
        return rc;
    }
    *ids = w.out;
    *n = w.k;
    return 0;
}

int tok_encode(const Tokenizer *t, const char *text, size_t len, int add_bos, int32_t **ids, int *n) {
    return tok_encode_flags(t, text, len, add_bos ? TOK_ADD_BOS : 0, ids, n);
}

/* ---- decoding ---- */

/* the bytes of one token on its own (no dummy-prefix handling) */
static const char *piece_bytes(const Tokenizer *t, int id, int flags, size_t *len) {
    switch (t->type[id]) {
    case PIECE_CONTROL:
        if (flags & TOK_SPECIAL) break;
        /* fall through */
    case PIECE_UNUSED:
        *len = 0;
        return "";
    case PIECE_BYTE: {
        int b = tok_byte_piece_value(t->text + t->off[id], t->len[id]);
        *len = 1;
        return &t->bytes[b];
    }
    default:
        break;
    }
    *len = t->len[id];
    return t->text + t->off[id];
}

/* NULL (with a message) for an id outside the vocabulary */
const char *tok_piece(const Tokenizer *t, int prev, int id, size_t *len) {
    *len = 0;
    if (id < 0 || id >= t->n_vocab) {
        pd_error("token id %d out of range (vocabulary of %d)", id, t->n_vocab);
        return NULL;
    }
    const char *p = piece_bytes(t, id, 0, len);
    /* after BOS the dummy-prefix space is dropped, as SentencePiece's decoder does */
    if (t->strip_space && prev >= 0 && prev == t->bos && *len > 0 && p[0] == ' ') {
        p++;
        (*len)--;
    }
    return p;
}

int tok_decode_flags(const Tokenizer *t, const int32_t *ids, int n, int flags, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    size_t total = 0, plen;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return pd_error("token id %d out of range (vocabulary of %d)", (int)ids[i], t->n_vocab);
        piece_bytes(t, ids[i], flags, &plen);
        total += plen;
    }
    char *out = pd_alloc(total + 1);
    if (!out) return -1;
    size_t k = 0;
    int at_start = t->strip_space; /* no byte of text written yet */
    for (int i = 0; i < n; i++) {
        const char *p = piece_bytes(t, ids[i], flags, &plen);
        if (plen == 0) continue;
        /* encode put exactly one space in front of the text; take exactly that one back */
        if (at_start && p[0] == ' ') {
            p++;
            plen--;
        }
        at_start = 0;
        memcpy(out + k, p, plen);
        k += plen;
    }
    out[k] = 0;
    *text = out;
    *len = k;
    return 0;
}

int tok_decode(const Tokenizer *t, const int32_t *ids, int n, char **text, size_t *len) {
    return tok_decode_flags(t, ids, n, 0, text, len);
}

/* a piece for a one-line message: printable ASCII as is, anything else \xNN, cut at 24 */
static void piece_quote(const Tokenizer *t, int id, char *out, size_t n) {
    const unsigned char *p = (const unsigned char *)t->text + t->off[id];
    size_t k = 0;
    uint32_t i = 0;
    out[0] = 0;
    for (; i < t->len[id] && k + 8 < n; i++) /* room left for one \xNN and "..." */
        k += (size_t)snprintf(out + k, n - k, p[i] >= 32 && p[i] < 127 && p[i] != '\'' ? "%c" : "\\x%02x", p[i]);
    if (i < t->len[id]) snprintf(out + k, n - k, "...");
}

int tok_same_vocab(const Tokenizer *a, const Tokenizer *b, char *why, size_t n) {
    if (a->n_vocab != b->n_vocab) {
        snprintf(why, n, "the vocabularies have %d and %d tokens", a->n_vocab, b->n_vocab);
        return 0;
    }
    for (int id = 0; id < a->n_vocab; id++) {
        if (a->len[id] == b->len[id] && !memcmp(a->text + a->off[id], b->text + b->off[id], a->len[id])) continue;
        char x[32], y[32];
        piece_quote(a, id, x, sizeof x);
        piece_quote(b, id, y, sizeof y);
        snprintf(why, n, "the vocabularies differ first at token %d ('%s' vs '%s')", id, x, y);
        return 0;
    }
    return 1;
}
