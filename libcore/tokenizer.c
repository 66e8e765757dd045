/* tokenizer.c — text ↔ token ids; see tokenizer.h.
   One vocabulary representation for every kind: pieces (their bytes), a score per
   piece (SPM: merge priority, higher first; byte-level BPE later: minus the merge
   rank), a type per piece (normal / control / byte / unknown) and one hash map
   piece → id built once at load. Only the SPM kind (llama2.c tokenizer.bin) is
   implemented; a BPE kind adds its pre-tokenizer and merge loop beside spm_encode. */
#include "tokenizer.h"
#include "util.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

enum { PIECE_NORMAL, PIECE_CONTROL, PIECE_BYTE, PIECE_UNKNOWN };

/* the most entries a vocabulary may have: real ones stop near 256K, and a corrupt
   file must not make us build a table of hundreds of millions */
#define TOK_MAX_VOCAB (1 << 22)

struct Tokenizer {
    TokKind kind;
    int n_vocab;
    char *text;        /* every piece back to back, each NUL-terminated */
    uint32_t *off;     /* [n_vocab] where piece i starts in text */
    uint32_t *len;     /* [n_vocab] its length in bytes */
    float *score;      /* [n_vocab] merge priority, higher merges first */
    uint8_t *type;     /* [n_vocab] PIECE_* */
    int32_t *slot;     /* [slot_mask+1] open-addressing map piece -> id, -1 = empty; holds
                          only the pieces text may turn into (not control or byte pieces) */
    uint32_t slot_mask;
    uint32_t max_len;  /* longest piece in the map: longer lookups miss without hashing */
    int byte_id[256];  /* id of the piece "<0xXX>", -1 when absent */
    char bytes[256];   /* bytes[b] == b: what byte piece b decodes to */
    int unk, bos, eos; /* -1 when absent */
};

/* ---- the piece map ---- */

static uint32_t piece_hash(const char *s, size_t n) { return (uint32_t)XXH3_64bits(s, n); }

static int tok_lookup(const Tokenizer *t, const char *s, size_t n) {
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

/* ---- loading ---- */

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* "<0xXX>" -> XX, else -1 */
static int byte_piece_value(const char *s, uint32_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int hi = hexval(s[3]), lo = hexval(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

static int find_exact(const Tokenizer *t, const char *s) {
    size_t n = strlen(s);
    for (int id = 0; id < t->n_vocab; id++)
        if (t->len[id] == n && !memcmp(t->text + t->off[id], s, n)) return id;
    return -1;
}

/* types and special ids from the pieces' text: tokenizer.bin stores no types, but
   llama2.c's exporter writes BOS/EOS as "\n<s>\n" / "\n</s>\n" and SentencePiece's
   byte fallback pieces are "<0xXX>", so the text says which is which */
static void classify(Tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        t->byte_id[b] = -1;
        t->bytes[b] = (char)b;
    }
    for (int id = 0; id < t->n_vocab; id++) {
        int b = byte_piece_value(t->text + t->off[id], t->len[id]);
        if (b >= 0 && t->byte_id[b] < 0) {
            t->byte_id[b] = id;
            t->type[id] = PIECE_BYTE;
        }
    }
    t->bos = find_exact(t, "\n<s>\n");
    if (t->bos < 0) t->bos = find_exact(t, "<s>");
    t->eos = find_exact(t, "\n</s>\n");
    if (t->eos < 0) t->eos = find_exact(t, "</s>");
    t->unk = find_exact(t, "<unk>");
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
    if (mtl <= 0 || mtl > (1 << 20))
        return pd_error("%s: max_token_length %d is not plausible", what, (int)mtl);
    size_t at = 4;
    int k = 0;
    while (at < n) {
        if (k >= TOK_MAX_VOCAB)
            return pd_error("%s: more than %d entries: not a tokenizer", what, TOK_MAX_VOCAB);
        if (n - at < 8) return pd_error("%s: entry %d is truncated (header)", what, k);
        float score = rd_f32(p + at);
        int32_t len = rd_i32(p + at + 4);
        if (!isfinite(score)) return pd_error("%s: entry %d has a non-finite score", what, k);
        if (len < 0) return pd_error("%s: entry %d has negative length %d", what, k, (int)len);
        if ((size_t)len > n - at - 8)
            return pd_error("%s: entry %d is truncated (length %d, %zu bytes left)", what, k,
                            (int)len, n - at - 8);
        at += 8 + (size_t)len;
        k++;
    }
    if (k == 0) return pd_error("%s: empty vocabulary", what);
    *count = k;
    return 0;
}

static Tokenizer *tok_new(int n_vocab, size_t text_bytes) {
    Tokenizer *t = pd_alloc(sizeof *t);
    if (!t) return NULL;
    t->n_vocab = n_vocab;
    t->text = pd_alloc(text_bytes);
    t->off = pd_alloc(pd_mul(n_vocab, sizeof *t->off));
    t->len = pd_alloc(pd_mul(n_vocab, sizeof *t->len));
    t->score = pd_alloc(pd_mul(n_vocab, sizeof *t->score));
    t->type = pd_alloc(n_vocab);
    if (!t->text || !t->off || !t->len || !t->score || !t->type) {
        tok_free(t);
        return NULL;
    }
    return t;
}

int tok_load_llama2c(Tokenizer **out, const void *bytes, size_t n, const char *what) {
    *out = NULL;
    const unsigned char *p = bytes;
    int count = 0;
    if (llama2c_scan(p, n, what, &count)) return -1;
    /* the pieces plus one NUL each fit in n bytes: every entry spent 8 on its header */
    Tokenizer *t = tok_new(count, n);
    if (!t) return pd_error_prefix(what);
    t->kind = TOK_SPM;
    size_t at = 4, used = 0;
    for (int id = 0; id < count; id++) {
        uint32_t len = (uint32_t)rd_i32(p + at + 4);
        t->score[id] = rd_f32(p + at);
        t->off[id] = (uint32_t)used;
        t->len[id] = len;
        memcpy(t->text + used, p + at + 8, len);
        used += len + 1; /* the NUL is already there: pd_alloc zeroes */
        at += 8 + len;
    }
    classify(t);
    if (build_map(t)) {
        tok_free(t);
        return pd_error_prefix(what);
    }
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

int tok_load_file(Tokenizer **out, const char *path) {
    *out = NULL;
    char *data;
    size_t n;
    if (pd_read_file(path, &data, &n)) return -1;
    int rc;
    if (looks_llama2c((const unsigned char *)data, n))
        rc = tok_load_llama2c(out, data, n, path);
    else
        rc = pd_error("%s: not a tokenizer paradec knows", path);
    free(data);
    return rc;
}

void tok_free(Tokenizer *t) {
    if (!t) return;
    free(t->text);
    free(t->off);
    free(t->len);
    free(t->score);
    free(t->type);
    free(t->slot);
    free(t);
}

int tok_vocab_size(const Tokenizer *t) { return t->n_vocab; }
int tok_bos(const Tokenizer *t) { return t->bos; }
int tok_eos(const Tokenizer *t) { return t->eos; }
TokKind tok_kind(const Tokenizer *t) { return t->kind; }

/* ---- SPM encoding (as llama.cpp's llm_tokenizer_spm) ---- */

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
} Sym;

typedef struct {
    float score;
    int left, right; /* symbol indices */
    int size;        /* bytes of the pair when queued: stale when either side changed */
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

static void try_bigram(const Tokenizer *t, const char *text, const Sym *sym, Heap *h, int l,
                       int r) {
    if (l < 0 || r < 0) return;
    int size = sym[l].n + sym[r].n;
    int id = tok_lookup(t, text + sym[l].start, (size_t)size);
    if (id < 0) return;
    heap_push(h, (Bigram){t->score[id], l, r, size});
}

/* appends the ids of one final symbol: its piece, else one byte piece per byte */
static int emit_symbol(const Tokenizer *t, const char *s, int n, int32_t *ids, int *k) {
    int id = tok_lookup(t, s, (size_t)n);
    if (id >= 0) {
        ids[(*k)++] = id;
        return 0;
    }
    for (int i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        int bid = t->byte_id[b] >= 0 ? t->byte_id[b] : t->unk;
        if (bid < 0) return pd_error("tokenizer has no piece for byte 0x%02X and no <unk>", b);
        ids[(*k)++] = bid;
    }
    return 0;
}

/* text (n bytes, the dummy prefix already in front) -> ids appended at ids[*k];
   ids has room for n more */
static int spm_encode(const Tokenizer *t, const char *text, int n, int32_t *ids, int *k) {
    Sym *sym = pd_alloc(pd_mul((size_t)n, sizeof *sym));
    /* n-1 initial pairs, then at most two new pairs per merge, at most n-1 merges */
    Heap h = {pd_alloc(pd_mul(3 * (size_t)n, sizeof(Bigram))), 0};
    int rc = -1;
    if (!sym || !h.a) goto done;
    int ns = 0;
    for (int at = 0; at < n; ns++) {
        int len = utf8_len((const unsigned char *)text + at, (size_t)(n - at));
        sym[ns] = (Sym){ns - 1, at + len < n ? ns + 1 : -1, at, len};
        at += len;
    }
    for (int i = 1; i < ns; i++) try_bigram(t, text, sym, &h, i - 1, i);
    while (h.n > 0) {
        Bigram b = heap_pop(&h);
        Sym *l = &sym[b.left], *r = &sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = b.left;
        try_bigram(t, text, sym, &h, l->prev, b.left);
        try_bigram(t, text, sym, &h, b.left, l->next);
    }
    for (int i = ns > 0 ? 0 : -1; i >= 0; i = sym[i].next)
        if (emit_symbol(t, text + sym[i].start, sym[i].n, ids, k)) goto done;
    rc = 0;
done:
    free(sym);
    free(h.a);
    return rc;
}

int tok_encode(const Tokenizer *t, const char *text, size_t len, int add_bos, int32_t **ids,
               int *n) {
    *ids = NULL;
    *n = 0;
    if (len > (size_t)INT_MAX / 8) return pd_error("text of %zu bytes is too long to encode", len);
    if (add_bos && t->bos < 0) return pd_error("tokenizer has no BOS token");
    /* every byte gives at most one id (byte fallback), plus BOS and the dummy prefix */
    int32_t *out = pd_alloc((len + 2) * sizeof *out);
    char *buf = pd_alloc(len + 1);
    int k = 0, rc = -1;
    if (!out || !buf) goto done;
    if (add_bos) out[k++] = t->bos;
    if (len > 0) {
        /* SentencePiece's dummy prefix: "Hello" is encoded as " Hello", so a word
           at the start gets the same piece as in the middle of a sentence */
        buf[0] = ' ';
        memcpy(buf + 1, text, len);
        if (spm_encode(t, buf, (int)len + 1, out, &k)) goto done;
    }
    rc = 0;
done:
    free(buf);
    if (rc) {
        free(out);
        return rc;
    }
    *ids = out;
    *n = k;
    return 0;
}

/* ---- decoding ---- */

/* the bytes of one token on its own (no dummy-prefix handling) */
static const char *piece_bytes(const Tokenizer *t, int id, size_t *len) {
    switch (t->type[id]) {
    case PIECE_CONTROL:
        *len = 0;
        return "";
    case PIECE_BYTE: {
        int b = byte_piece_value(t->text + t->off[id], t->len[id]);
        *len = 1;
        return &t->bytes[b];
    }
    default:
        *len = t->len[id];
        return t->text + t->off[id];
    }
}

/* NULL (with a message) for an id outside the vocabulary */
const char *tok_piece(const Tokenizer *t, int prev, int id, size_t *len) {
    *len = 0;
    if (id < 0 || id >= t->n_vocab) {
        pd_error("token id %d out of range (vocabulary of %d)", id, t->n_vocab);
        return NULL;
    }
    const char *p = piece_bytes(t, id, len);
    /* after BOS the dummy-prefix space is dropped, as SentencePiece's decoder does */
    if (prev >= 0 && prev == t->bos && *len > 0 && p[0] == ' ') {
        p++;
        (*len)--;
    }
    return p;
}

int tok_decode(const Tokenizer *t, const int32_t *ids, int n, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    size_t total = 0, plen;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab)
            return pd_error("token id %d out of range (vocabulary of %d)", (int)ids[i],
                            t->n_vocab);
        piece_bytes(t, ids[i], &plen);
        total += plen;
    }
    char *out = pd_alloc(total + 1);
    if (!out) return -1;
    size_t k = 0;
    int at_start = 1; /* no byte of text written yet */
    for (int i = 0; i < n; i++) {
        const char *p = piece_bytes(t, ids[i], &plen);
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
