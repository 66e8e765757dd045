/* test_tokenizer.c — the SPM tokenizer against llama.cpp's reference vectors for the
   Llama 2 vocabulary, against a slow reference (an O(n^2) merge loop written here from
   the file itself), round trips on random bytes, and malformed tokenizer.bin files. */
#include "check.h"
#include "fixture.h"
#include "vocab_vectors.h"
#include "base/util.h"
#include "tokenizer/tokenizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x2545F4914F6CDD1DULL;
static uint32_t rnd(void) { /* xorshift64*: fixed seed, same strings every run */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (uint32_t)((rng * 0x2545F4914F6CDD1DULL) >> 32);
}

static Tokenizer *load(const char *rel) {
    const char *path = test_data("this vocabulary's tests", rel);
    Tokenizer *t = NULL;
    if (!path) return NULL;
    if (tok_load_file(&t, path)) {
        CHECK(0, "%s", pd_errmsg());
        return NULL;
    }
    return t;
}

static void print_ids(const char *what, const int32_t *ids, int n) {
    fprintf(stderr, "  %s:", what);
    for (int i = 0; i < n; i++) fprintf(stderr, " %d", (int)ids[i]);
    fprintf(stderr, "\n");
}

static int roundtrips(const Tokenizer *t, const char *s, size_t n) {
    int32_t *ids;
    int k;
    char *back;
    size_t blen;
    if (tok_encode(t, s, n, 0, &ids, &k)) return 0;
    int ok = tok_decode(t, ids, k, &back, &blen) == 0 && blen == n && !memcmp(back, s, n);
    free(ids);
    if (ok) free(back);
    return ok;
}

/* ---- llama.cpp's vectors: .inp cases joined by "\n__ggml_vocab_test__\n" (the file
   ends with one, as the generator writes text + separator per case), .out one line of
   " id id ..." per case ---- */
static void check_case(void *ctx, const VocabCase *c, int i) {
    const Tokenizer *t = ctx;
    int32_t *got = NULL;
    int ng;
    int ok = tok_encode(t, c->text, c->len, 0, &got, &ng) == 0;
    ok = ok && ng == c->nw && !memcmp(got, c->want, (size_t)c->nw * sizeof *c->want);
    CHECK(ok, "case %d (\"%.*s\") differs", i, (int)c->len, c->text);
    if (!ok) {
        print_ids("want", c->want, c->nw);
        if (got) print_ids("got ", got, ng);
    }
    free(got);
    CHECK(roundtrips(t, c->text, c->len), "case %d does not round-trip", i);
}

static void test_reference_vectors(const Tokenizer *t) {
    const char *pi = test_data("llama.cpp's reference vectors", "tokenizers/ggml-vocab/ggml-vocab-llama-spm.gguf.inp"),
               *po = pi ? test_data("llama.cpp's reference vectors",
                                    "tokenizers/ggml-vocab/ggml-vocab-llama-spm.gguf.out")
                        : NULL;
    char *inp, *out;
    size_t ni, no;
    if (!po) return;
    if (pd_read_file(pi, &inp, &ni)) {
        CHECK(0, "%s", pd_errmsg());
        return;
    }
    if (pd_read_file(po, &out, &no)) {
        CHECK(0, "%s", pd_errmsg());
        free(inp);
        return;
    }
    int whole, cases = vocab_cases(inp, ni, out, check_case, (void *)t, &whole);
    CHECK(whole, "the .inp and .out files do not pair up case for case");
    CHECK(cases == 46, "%d cases, expected llama.cpp's 46", cases);
    printf("reference vectors: %d cases\n", cases);
    free(inp);
    free(out);
}

/* ---- the slow reference: pieces read straight from the file, each round scans every
   adjacent pair, merges the best (highest score, leftmost), until none is a piece ---- */
typedef struct {
    int n;
    char **piece;
    int *len;
    float *score;
    int *mergeable; /* not <unk>, not BOS/EOS, not a byte piece "<0xXX>" */
    int *sorted;    /* mergeable ids by (length, bytes), for bsearch */
    int n_sorted;
} RefVocab;

static const RefVocab *ref_sorting;
static int ref_cmp(const char *a, int na, const char *b, int nb) {
    return na != nb ? (na < nb ? -1 : 1) : memcmp(a, b, (size_t)na);
}
static int ref_cmp_ids(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    int c = ref_cmp(ref_sorting->piece[x], ref_sorting->len[x], ref_sorting->piece[y], ref_sorting->len[y]);
    return c ? c : (x < y ? -1 : 1); /* a repeated piece: the lowest id first */
}

static int ref_load(RefVocab *v, const char *rel) {
    char path[1024];
    char *d;
    size_t n;
    if (pd_data_path(rel, path, sizeof path) || pd_read_file(path, &d, &n)) return -1;
    memset(v, 0, sizeof *v);
    size_t cap = n / 8;
    v->piece = calloc(cap, sizeof *v->piece);
    v->len = calloc(cap, sizeof *v->len);
    v->score = calloc(cap, sizeof *v->score);
    v->mergeable = calloc(cap, sizeof *v->mergeable);
    for (size_t at = 4; at + 8 <= n; v->n++) {
        int32_t len;
        memcpy(&v->score[v->n], d + at, 4);
        memcpy(&len, d + at + 4, 4);
        v->piece[v->n] = malloc((size_t)len + 1);
        memcpy(v->piece[v->n], d + at + 8, (size_t)len);
        v->piece[v->n][len] = 0;
        v->len[v->n] = len;
        const char *p = v->piece[v->n];
        int byte = len == 6 && !strncmp(p, "<0x", 3) && p[5] == '>';
        v->mergeable[v->n] = len > 0 && !byte && strcmp(p, "<unk>") && strcmp(p, "\n<s>\n") && strcmp(p, "\n</s>\n");
        at += 8 + (size_t)len;
    }
    v->sorted = calloc((size_t)v->n + 1, sizeof *v->sorted);
    for (int i = 0; i < v->n; i++)
        if (v->mergeable[i]) v->sorted[v->n_sorted++] = i;
    ref_sorting = v;
    qsort(v->sorted, (size_t)v->n_sorted, sizeof *v->sorted, ref_cmp_ids);
    free(d);
    return 0;
}

static void ref_free(RefVocab *v) {
    for (int i = 0; i < v->n; i++) free(v->piece[i]);
    free(v->piece);
    free(v->len);
    free(v->score);
    free(v->mergeable);
    free(v->sorted);
}

static int ref_find(const RefVocab *v, const char *s, int n) {
    int lo = 0, hi = v->n_sorted; /* first entry not below s */
    while (lo < hi) {
        int mid = (lo + hi) / 2, id = v->sorted[mid];
        if (ref_cmp(v->piece[id], v->len[id], s, n) < 0) lo = mid + 1;
        else hi = mid;
    }
    if (lo < v->n_sorted && !ref_cmp(v->piece[v->sorted[lo]], v->len[v->sorted[lo]], s, n)) return v->sorted[lo];
    return -1;
}

/* a UTF-8 character: lead byte, the right number of continuation bytes, and a value
   that is neither overlong, a surrogate nor above U+10FFFF */
static int ref_charlen(const unsigned char *s, int n) {
    int k = s[0] < 0x80 ? 1 : (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3 : (s[0] & 0xF8) == 0xF0 ? 4 : 1;
    if (k == 1 || k > n) return 1;
    uint32_t cp = s[0] & (0xFF >> (k + 1));
    for (int i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 1;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    uint32_t min = k == 2 ? 0x80 : k == 3 ? 0x800 : 0x10000;
    if (cp < min || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return 1;
    return k;
}

static int ref_encode(const RefVocab *v, const char *text, int len, int32_t *ids) {
    if (len == 0) return 0;
    int n = len + 1, ns = 0;
    char *s = malloc((size_t)n);
    s[0] = ' ';
    memcpy(s + 1, text, (size_t)len);
    int *st = malloc(sizeof(int) * (size_t)(n + 1));
    for (int at = 0; at < n; at += ref_charlen((unsigned char *)s + at, n - at)) st[ns++] = at;
    st[ns] = n; /* symbol i is s[st[i], st[i+1]) */
    for (;;) {
        int best = -1;
        float bs = 0;
        for (int i = 0; i + 1 < ns; i++) {
            int id = ref_find(v, s + st[i], st[i + 2] - st[i]);
            if (id >= 0 && (best < 0 || v->score[id] > bs)) best = i, bs = v->score[id];
        }
        if (best < 0) break;
        memmove(st + best + 1, st + best + 2, sizeof(int) * (size_t)(ns - best - 1));
        ns--;
    }
    int k = 0;
    for (int i = 0; i < ns; i++) {
        int id = ref_find(v, s + st[i], st[i + 1] - st[i]);
        if (id >= 0) {
            ids[k++] = id;
            continue;
        }
        for (int j = st[i]; j < st[i + 1]; j++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", (unsigned char)s[j]);
            int b = -1;
            for (int q = 0; q < v->n && b < 0; q++)
                if (!strcmp(v->piece[q], name)) b = q;
            ids[k++] = b;
        }
    }
    free(s);
    free(st);
    return k;
}

/* random text that exercises merges: words, runs of spaces, newlines, multibyte
   characters, digits, and now and then a stray byte */
static size_t random_text(char *buf, size_t max) {
    static const char *parts[] = {"the",  " ", "  ",  "Hello",  "world",   "ing",   "\n", "\t",  "3",    "33",
                                  ".",    ",", "'s",  "Once",   "upon",    "time",  "é",  "ü",   "нещо", "我",
                                  "🦙", "▁", "<s>", "<0x41>", "\n<s>\n", "<unk>", "a",  "tion"};
    size_t n = 0, want = rnd() % max;
    while (n < want) {
        if (rnd() % 10 == 0) {
            buf[n++] = (char)(rnd() & 0xFF);
            continue;
        }
        const char *p = parts[rnd() % (sizeof parts / sizeof *parts)];
        size_t l = strlen(p);
        if (n + l > max) break;
        memcpy(buf + n, p, l);
        n += l;
    }
    return n;
}

static void test_against_reference(const Tokenizer *t, const char *rel, int count) {
    RefVocab v;
    if (ref_load(&v, rel)) {
        CHECK(0, "%s", pd_errmsg());
        return;
    }
    char buf[160];
    int32_t want[200];
    int bad = 0;
    for (int c = 0; c < count; c++) {
        size_t n = random_text(buf, sizeof buf);
        int nw = ref_encode(&v, buf, (int)n, want);
        int32_t *got;
        int ng;
        int ok = tok_encode(t, buf, n, 0, &got, &ng) == 0 && ng == nw && !memcmp(got, want, (size_t)nw * sizeof *want);
        if (!ok && bad++ < 3) {
            fprintf(stderr, "%s: slow reference differs on \"%.*s\"\n", rel, (int)n, buf);
            print_ids("want", want, nw);
            if (got) print_ids("got ", got, ng);
        }
        free(got);
    }
    CHECK(bad == 0, "%s: %d of %d random texts differ from the slow reference", rel, bad, count);
    ref_free(&v);
}

static void test_roundtrip_random(const Tokenizer *t, const char *what) {
    char buf[256];
    int bad = 0;
    for (int c = 0; c < 3000; c++) {
        size_t n = rnd() % sizeof buf;
        int mode = c % 3;
        for (size_t i = 0; i < n; i++) {
            uint32_t r = rnd();
            buf[i] = mode == 0   ? (char)r                             /* any byte */
                     : mode == 1 ? " a\n\xc3\xa9\x80\xff"[r % 8]       /* broken UTF-8 */
                                 : (char)(r % 2 ? ' ' : 'a' + r % 26); /* words, spaces */
        }
        if (!roundtrips(t, buf, n) && bad++ < 3) fprintf(stderr, "%s: no round trip\n", what);
    }
    CHECK(bad == 0, "%s: %d random strings do not round-trip", what, bad);
    const char *odd[] = {"",        " ",    "  a",  "\n",    " \n ",         "<0x41>",
                         "\n<s>\n", "<s>",  "</s>", "<unk>", "\xe2\x96\x81", "\xe2\x96\x81x",
                         "\xff",    "\xc3", "a\xc3"};
    for (size_t i = 0; i < sizeof odd / sizeof *odd; i++)
        CHECK(roundtrips(t, odd[i], strlen(odd[i])), "%s: \"%s\" does not round-trip", what, odd[i]);
}

static void test_llama2(void) {
    Tokenizer *t = load("tokenizers/llama2/tokenizer.bin");
    if (!t) return;
    CHECK(tok_vocab_size(t) == 32000, "vocab %d", tok_vocab_size(t));
    CHECK(tok_bos(t) == 1 && tok_eos(t) == 2, "bos %d eos %d", tok_bos(t), tok_eos(t));
    CHECK(tok_kind(t) == TOK_SPM, "kind %d", (int)tok_kind(t));
    test_reference_vectors(t);

    int32_t *ids;
    int n;
    CHECK(tok_encode(t, "Hello world", 11, 1, &ids, &n) == 0 && n == 3 && ids[0] == 1 && ids[1] == 15043 &&
              ids[2] == 3186,
          "add_bos");
    free(ids);
    CHECK(tok_encode(t, "", 0, 1, &ids, &n) == 0 && n == 1 && ids[0] == 1, "empty with BOS");
    free(ids);

    /* streaming pieces: run.c's rules */
    size_t len;
    const char *p = tok_piece(t, 1, 15043, &len);
    CHECK(p && len == 5 && !memcmp(p, "Hello", 5), "after BOS the space goes");
    p = tok_piece(t, 15043, 3186, &len);
    CHECK(p && len == 6 && !memcmp(p, " world", 6), "elsewhere it stays");
    p = tok_piece(t, 3186, 3 + 0x41, &len);
    CHECK(p && len == 1 && p[0] == 'A', "byte piece <0x41>");
    p = tok_piece(t, 3186, 1, &len);
    CHECK(p && len == 0, "BOS prints nothing");
    p = tok_piece(t, 3186, 2, &len);
    CHECK(p && len == 0, "EOS prints nothing");
    CHECK(tok_piece(t, 0, 32000, &len) == NULL && tok_piece(t, 0, -1, &len) == NULL, "out-of-range id");

    int32_t seq[] = {1, 29871, 15043, 3186, 2};
    char *text;
    CHECK(tok_decode(t, seq, 5, &text, &len) == 0 && len == 12 && !strcmp(text, " Hello world"),
          "decode drops the dummy prefix only");
    free(text);
    int32_t badseq[] = {15043, 32000};
    CHECK(tok_decode(t, badseq, 2, &text, &len) == -1 && strstr(pd_errmsg(), "32000"),
          "decode refuses an out-of-range id: %s", pd_errmsg());

    test_against_reference(t, "tokenizers/llama2/tokenizer.bin", 400);
    test_roundtrip_random(t, "llama2");

    /* speed, for information only (a test never asserts a time) */
    char *story;
    size_t sn;
    const char *sp =
        test_data("TinyStories' round trip (and its speed)", "datasets/tinystories/tinystories_val_sample.txt.gz");
    if (sp && pd_read_file_gz(sp, &story, &sn) == 0) {
        size_t n100k = sn < 100000 ? sn : 100000;
        double t0 = pd_now();
        CHECK(tok_encode(t, story, n100k, 1, &ids, &n) == 0, "%s", pd_errmsg());
        double dt = pd_now() - t0;
        printf("encoded %zu bytes of TinyStories into %d tokens in %.1f ms\n", n100k, n, dt * 1e3);
        free(ids);
        CHECK(roundtrips(t, story, sn), "TinyStories sample does not round-trip");
        free(story);
    }
    char *same = malloc(100000);
    memset(same, 'a', 100000);
    double t0 = pd_now();
    CHECK(tok_encode(t, same, 100000, 0, &ids, &n) == 0, "%s", pd_errmsg());
    printf("encoded 100000 x 'a' into %d tokens in %.1f ms\n", n, (pd_now() - t0) * 1e3);
    free(ids);
    free(same);
    tok_free(t);
}

static void test_tok512(void) {
    Tokenizer *t = load("models/stories260K/tok512.bin");
    if (!t) return;
    CHECK(tok_vocab_size(t) == 512, "vocab %d", tok_vocab_size(t));
    CHECK(tok_bos(t) == 1 && tok_eos(t) == 2, "bos %d eos %d", tok_bos(t), tok_eos(t));
    const char *s = "Once upon a time";
    CHECK(roundtrips(t, s, strlen(s)), "\"%s\"", s);
    int32_t *ids;
    int n;
    char *text;
    size_t len;
    CHECK(tok_encode(t, s, strlen(s), 1, &ids, &n) == 0 && n > 1 && ids[0] == 1, "encode with BOS");
    CHECK(tok_decode(t, ids, n, &text, &len) == 0 && !strcmp(text, s), "decode with BOS");
    free(text);
    /* streaming from BOS gives the same text */
    char stream[256];
    size_t k = 0;
    for (int i = 1; i < n; i++) {
        const char *p = tok_piece(t, ids[i - 1], ids[i], &len);
        memcpy(stream + k, p, len);
        k += len;
    }
    CHECK(k == strlen(s) && !memcmp(stream, s, k), "streamed pieces");
    free(ids);
    test_against_reference(t, "models/stories260K/tok512.bin", 400);
    test_roundtrip_random(t, "tok512");
    tok_free(t);
}

/* ---- malformed files ---- */
static size_t put_entry(unsigned char *b, size_t at, float score, int32_t len, const char *s) {
    memcpy(b + at, &score, 4);
    memcpy(b + at + 4, &len, 4);
    if (s) memcpy(b + at + 8, s, strlen(s));
    return at + 8 + (s ? strlen(s) : 0);
}

static void test_malformed(void) {
    /* a small valid file: specials, two byte pieces, a few merges */
    const char *pieces[] = {"<unk>", "\n<s>\n", "\n</s>\n", "<0x61>", "<0x62>", "a", "b", "ab"};
    float scores[] = {0, 0, 0, 0, 0, -1, -2, -0.5f};
    unsigned char b[256];
    size_t bound[16], n = 4, nb = 0;
    int32_t mtl = 6;
    memcpy(b, &mtl, 4);
    for (int i = 0; i < 8; i++) {
        n = put_entry(b, n, scores[i], (int32_t)strlen(pieces[i]), pieces[i]);
        bound[nb++] = n;
    }
    Tokenizer *t;
    CHECK(tok_load_llama2c(&t, b, n, "small") == 0, "%s", pd_errmsg());
    if (t) {
        int32_t *ids;
        int k;
        CHECK(tok_encode(t, "abc", 3, 0, &ids, &k) == 0 && k == 3,
              "' ' and 'c' have no piece and no byte piece: <unk>; 'ab' merges");
        if (k == 3) CHECK(ids[0] == 0 && ids[1] == 7 && ids[2] == 0, "%d %d %d", ids[0], ids[1], ids[2]);
        free(ids);
        tok_free(t);
    }

    /* truncated at every length: refused, except exactly at an entry boundary */
    int bad = 0;
    for (size_t len = 0; len < n; len++) {
        unsigned char *c = malloc(len ? len : 1); /* exact size, so ASan sees overreads */
        memcpy(c, b, len);
        int boundary = 0, entries = 0;
        for (size_t i = 0; i < nb; i++)
            if (bound[i] == len) boundary = 1, entries = (int)i + 1;
        int rc = tok_load_llama2c(&t, c, len, "cut");
        if (boundary) {
            if (rc != 0 || tok_vocab_size(t) != entries) bad++;
        } else if (rc == 0 || !strstr(pd_errmsg(), "cut: ")) {
            bad++;
        }
        tok_free(t);
        free(c);
    }
    CHECK(bad == 0, "%d truncations handled wrongly", bad);

    unsigned char m[64];
    memcpy(m, &mtl, 4);
    size_t e = put_entry(m, 4, 0, -1, NULL);
    CHECK(tok_load_llama2c(&t, m, e, "neg") == -1 && strstr(pd_errmsg(), "negative"), "%s", pd_errmsg());
    e = put_entry(m, 4, 0, 0x7fffffff, NULL);
    CHECK(tok_load_llama2c(&t, m, e, "huge") == -1 && strstr(pd_errmsg(), "truncated"), "%s", pd_errmsg());
    e = put_entry(m, 4, NAN, 1, "a");
    CHECK(tok_load_llama2c(&t, m, e, "nan") == -1 && strstr(pd_errmsg(), "score"), "%s", pd_errmsg());
    e = put_entry(m, 4, -INFINITY, 1, "a");
    CHECK(tok_load_llama2c(&t, m, e, "inf") == -1, "infinite score accepted");
    CHECK(tok_load_llama2c(&t, m, 4, "empty") == -1 && strstr(pd_errmsg(), "empty"), "%s", pd_errmsg());
    int32_t zero = 0, neg = -5;
    memcpy(m, &zero, 4);
    put_entry(m, 4, 0, 1, "a");
    CHECK(tok_load_llama2c(&t, m, 13, "mtl0") == -1, "max_token_length 0 accepted");
    memcpy(m, &neg, 4);
    CHECK(tok_load_llama2c(&t, m, 13, "mtlneg") == -1, "negative max_token_length accepted");

    /* absurd counts: all-zero entries are valid ones (score 0, length 0) */
    size_t many = ((size_t)1 << 22) + 1, sz = 4 + 8 * many;
    unsigned char *big = calloc(1, sz);
    int32_t one = 1;
    memcpy(big, &one, 4);
    CHECK(tok_load_llama2c(&t, big, sz, "many") == -1 && strstr(pd_errmsg(), "entries"), "%s", pd_errmsg());
    free(big);

    /* random damage to a real file: refused or loaded, never a crash */
    char path[1024];
    char *real;
    size_t rn;
    if (pd_data_path("models/stories260K/tok512.bin", path, sizeof path) == 0 && pd_read_file(path, &real, &rn) == 0) {
        int loaded = 0;
        for (int trial = 0; trial < 300; trial++) {
            unsigned char *c = malloc(rn);
            memcpy(c, real, rn);
            for (int k = 0, hits = 1 + rnd() % 4; k < hits; k++) c[rnd() % rn] = (unsigned char)rnd();
            size_t len = trial % 2 ? rn : rnd() % rn;
            if (tok_load_llama2c(&t, c, len, "fuzz") == 0) {
                loaded++;
                int32_t *ids;
                int k;
                char *text;
                size_t tl;
                if (tok_encode(t, "Once upon a time", 16, 1, &ids, &k) == 0) {
                    if (tok_decode(t, ids, k, &text, &tl) == 0) free(text);
                    free(ids);
                }
                tok_free(t);
            }
            free(c);
        }
        printf("fuzzed tok512.bin: %d of 300 damaged copies still loaded\n", loaded);
        free(real);
    }

    /* files */
    CHECK(tok_load_file(&t, "/nonexistent/tok.bin") == -1 && strstr(pd_errmsg(), "/nonexistent/tok.bin: "), "%s",
          pd_errmsg());
    const char *vp = test_data("a file that is no tokenizer", "tokenizers/ggml-vocab/ggml-vocab-llama-spm.gguf.inp");
    if (vp)
        CHECK(tok_load_file(&t, vp) == -1 && strstr(pd_errmsg(), "not a tokenizer paradec knows"), "%s", pd_errmsg());
    /* a GGUF vocabulary is a tokenizer file too (when the copy found is intact) */
    vp = test_data("a GGUF vocabulary as a tokenizer", "tokenizers/ggml-vocab/ggml-vocab-llama-spm.gguf");
    if (vp && tok_load_file(&t, vp) == 0) {
        CHECK(tok_vocab_size(t) == 32000, "llama-spm GGUF: %d pieces", tok_vocab_size(t));
        tok_free(t);
    }
}

int main(void) {
    test_llama2();
    test_tok512();
    test_malformed();
    return check_done("tokenizer");
}
