/* test_tokenizer_bpe.c — the BPE kinds: the Llama 3 tokenizer.json against llama.cpp's
   llama-bpe vectors, GGUF vocabularies (written here from the Llama 2 tokenizer.bin and
   the Llama 3 tokenizer.json, and llama.cpp's vocab-only files when intact) against
   their vectors, round trips, special tokens, a hand-made SentencePiece-style
   tokenizer.json whose ids are derived by hand in the comments, and bad inputs. */
#include "check.h"
#include "fixture.h"
#include "vocab_vectors.h"
#include "base/util.h"
#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t rng = 0x9E3779B97F4A7C15ULL;
static uint32_t rnd(void) { /* xorshift64*: fixed seed, same strings every run */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (uint32_t)((rng * 0x2545F4914F6CDD1DULL) >> 32);
}

static void print_ids(const char *what, const int32_t *ids, int n) {
    fprintf(stderr, "  %s:", what);
    for (int i = 0; i < n && i < 64; i++) fprintf(stderr, " %d", (int)ids[i]);
    fprintf(stderr, "%s\n", n > 64 ? " ..." : "");
}

static int roundtrips(const Tokenizer *t, const char *s, size_t n, int flags) {
    int32_t *ids;
    int k;
    char *back;
    size_t blen;
    if (tok_encode_flags(t, s, n, flags, &ids, &k)) return 0;
    int ok = tok_decode_flags(t, ids, k, flags & TOK_SPECIAL, &back, &blen) == 0 && blen == n && !memcmp(back, s, n);
    free(ids);
    if (ok) free(back);
    return ok;
}

/* encodes s and compares with the expected ids */
static int encodes_to(const Tokenizer *t, const char *s, int flags, const int32_t *want, int nw) {
    int32_t *got;
    int ng;
    if (tok_encode_flags(t, s, strlen(s), flags, &got, &ng)) {
        fprintf(stderr, "  \"%s\": %s\n", s, pd_errmsg());
        return 0;
    }
    int ok = ng == nw && (nw == 0 || !memcmp(got, want, (size_t)nw * sizeof *want));
    if (!ok) {
        fprintf(stderr, "  \"%s\"\n", s);
        print_ids("want", want, nw);
        print_ids("got ", got, ng);
    }
    free(got);
    return ok;
}

static char *read_data(const char *what, const char *rel, size_t *n) {
    const char *path = test_data(what, rel);
    char *d;
    if (!path) return NULL;
    if (pd_read_file_gz(path, &d, n)) {
        CHECK(0, "%s", pd_errmsg());
        return NULL;
    }
    return d;
}

/* ---- llama.cpp's vectors: .inp cases joined by "\n__ggml_vocab_test__\n", .out one
   line of " id id ..." per case (no BOS) ---- */
typedef struct {
    const Tokenizer *t;
    const char *name;
    int bad;
} VectorRun;

static void check_case(void *ctx, const VocabCase *c, int i) {
    VectorRun *r = ctx;
    int32_t *got = NULL;
    int ng;
    int ok = tok_encode(r->t, c->text, c->len, 0, &got, &ng) == 0;
    ok = ok && ng == c->nw && !memcmp(got, c->want, (size_t)c->nw * sizeof *c->want);
    if (!ok) {
        r->bad++;
        fprintf(stderr, "%s: case %d (\"%.*s\") differs\n", r->name, i, (int)c->len, c->text);
        print_ids("want", c->want, c->nw);
        if (got) print_ids("got ", got, ng);
    }
    free(got);
    CHECK(roundtrips(r->t, c->text, c->len, 0), "%s: case %d does not round-trip", r->name, i);
}

static void test_vectors(const Tokenizer *t, const char *name, const char *vocab) {
    char rel[256];
    size_t ni, no;
    snprintf(rel, sizeof rel, "tokenizers/ggml-vocab/ggml-vocab-%s.gguf.inp", vocab);
    char *inp = read_data("llama.cpp's reference vectors", rel, &ni);
    snprintf(rel, sizeof rel, "tokenizers/ggml-vocab/ggml-vocab-%s.gguf.out", vocab);
    char *out = inp ? read_data("llama.cpp's reference vectors", rel, &no) : NULL;
    if (!inp || !out) {
        free(inp);
        free(out);
        return;
    }
    VectorRun r = {t, name, 0};
    int whole, cases = vocab_cases(inp, ni, out, check_case, &r, &whole);
    int bad = r.bad;
    CHECK(whole, "%s: the .inp and .out files do not pair up case for case", name);
    CHECK(bad == 0, "%s: %d of %d llama.cpp vectors differ", name, bad, cases);
    CHECK(cases == 46, "%s: %d cases, expected llama.cpp's 46", name, cases);
    printf("%s: %d of %d llama.cpp vectors (%s) match\n", name, cases - bad, cases, vocab);
    free(inp);
    free(out);
}

/* ---- random text ---- */

static size_t put_utf8(char *p, uint32_t cp) {
    if (cp < 0x80) return p[0] = (char)cp, 1;
    if (cp < 0x800) return p[0] = (char)(0xC0 | cp >> 6), p[1] = (char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000) {
        p[0] = (char)(0xE0 | cp >> 12);
        p[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        p[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    p[0] = (char)(0xF0 | cp >> 18);
    p[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    p[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    p[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* valid UTF-8 from mixed ranges: ASCII words and punctuation, whitespace of every
   kind, digits, Latin-1, Cyrillic, CJK, emoji, combining marks, the odd rare plane */
static size_t random_utf8(char *buf, size_t max, uint32_t max_cp) {
    static const char *words[] = {"the",
                                  " ",
                                  "  ",
                                  "\n",
                                  "\n\n",
                                  "\t",
                                  " \n ",
                                  "'s",
                                  "'LL",
                                  "Hello",
                                  "world",
                                  "123",
                                  "4567",
                                  "3.14",
                                  "!!",
                                  "...",
                                  "<|",
                                  "|>",
                                  "<|begin_of_text|>",
                                  "\r\n",
                                  "\xc2\xa0",
                                  "don't"};
    size_t n = 0;
    size_t want = rnd() % max;
    while (n + 8 < want) {
        uint32_t r = rnd() % 12, cp;
        if (r < 4) {
            const char *w = words[rnd() % (sizeof words / sizeof *words)];
            size_t l = strlen(w);
            if (n + l > max) break;
            memcpy(buf + n, w, l);
            n += l;
            continue;
        }
        switch (r) {
        case 4:
            cp = 0x20 + rnd() % 0x5F;
            break;
        case 5:
            cp = 0xA0 + rnd() % 0x160;
            break;
        case 6:
            cp = 0x400 + rnd() % 0x100;
            break;
        case 7:
            cp = 0x4E00 + rnd() % 0x5000;
            break;
        case 8:
            cp = 0x1F300 + rnd() % 0x300;
            break;
        case 9:
            cp = 0x300 + rnd() % 0x70;
            break;
        case 10:
            cp = 0x2000 + rnd() % 0x70;
            break; /* general punctuation, odd spaces */
        default:
            cp = 0x20 + rnd() % (max_cp - 0x20);
            break;
        }
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
        n += put_utf8(buf + n, cp);
    }
    return n;
}

/* full: any bytes and code points; else UTF-8 below U+40000 without C0 controls (what
   a vocabulary with all 256 single-byte pieces is not promised to have) */
static void test_roundtrip_random(const Tokenizer *t, const char *what, int full) {
    char buf[400];
    int bad = 0;
    for (int c = 0; c < 1500; c++) {
        size_t n;
        if (full && c % 3 == 2) { /* any bytes at all: broken UTF-8 too */
            n = rnd() % 200;
            for (size_t i = 0; i < n; i++)
                buf[i] = (char)(c % 2 ? (int)(rnd() & 0xFF) : " a\n\xc3\xa9\x80\xff\xf0"[rnd() % 8]);
        } else n = random_utf8(buf, sizeof buf, full ? 0x110000 : 0x40000);
        int flags = c % 5 == 0 ? TOK_SPECIAL : 0;
        if (!roundtrips(t, buf, n, flags) && bad++ < 3)
            fprintf(stderr, "%s: no round trip for \"%.*s\"\n", what, (int)n, buf);
    }
    CHECK(bad == 0, "%s: %d random strings do not round-trip", what, bad);
}

/* ---- the Llama 3 tokenizer.json ---- */

static void test_llama3_json(void) {
    size_t n;
    char *json = read_data("the Llama 3 tokenizer.json", "tokenizers/llama3/tokenizer.json.gz", &n);
    if (!json) return;
    char path[1024];
    pd_data_path("tokenizers/llama3/tokenizer.json.gz", path, sizeof path);
    double t0 = pd_now();
    Tokenizer *t;
    int rc = tok_load_file(&t, path);
    double dt = pd_now() - t0;
    CHECK(rc == 0, "%s", pd_errmsg());
    if (rc) {
        free(json);
        return;
    }
    printf("llama3 tokenizer.json.gz (%zu bytes of JSON) loaded in %.0f ms (inflate + parse + maps)\n", n, dt * 1e3);
    t0 = pd_now();
    Tokenizer *t2;
    CHECK(tok_load_bytes(&t2, json, n, "hf-json", "llama3") == 0, "%s", pd_errmsg());
    printf("  from bytes already in memory: %.0f ms\n", (pd_now() - t0) * 1e3);
    tok_free(t2);

    CHECK(tok_kind(t) == TOK_BPE, "kind");
    CHECK(tok_vocab_size(t) == 128256, "vocab %d", tok_vocab_size(t));
    CHECK(tok_bos(t) == 128000 && tok_eos(t) == 128001, "bos %d eos %d", tok_bos(t), tok_eos(t));
    CHECK(tok_add_bos(t) == 1, "Llama 3 wants BOS");
    int eot = tok_find(t, "<|eot_id|>");
    CHECK(eot == 128009, "<|eot_id|> is %d", eot);
    CHECK(tok_is_eog(t, 128001) && tok_is_eog(t, eot) && !tok_is_eog(t, 128000) && !tok_is_eog(t, 9906),
          "end of generation set");
    test_vectors(t, "llama3 tokenizer.json", "llama-bpe");

    /* special tokens: one token only when asked */
    const char *s = "<|begin_of_text|>hi";
    int32_t *ids, *plain;
    int k, kp;
    CHECK(tok_encode(t, "hi", 2, 0, &plain, &kp) == 0 && kp == 1, "\"hi\" is one token");
    CHECK(tok_encode_flags(t, s, strlen(s), TOK_SPECIAL, &ids, &k) == 0, "%s", pd_errmsg());
    CHECK(k == 2 && ids[0] == 128000 && ids[1] == plain[0], "with TOK_SPECIAL: BOS + hi");
    free(ids);
    CHECK(tok_encode_flags(t, s, strlen(s), 0, &ids, &k) == 0, "%s", pd_errmsg());
    int has = 0;
    for (int i = 0; i < k; i++) has |= ids[i] >= 128000;
    CHECK(k > 2 && !has, "without TOK_SPECIAL the text is plain pieces (%d of them)", k);
    free(ids);
    free(plain);
    CHECK(roundtrips(t, s, strlen(s), 0) && roundtrips(t, s, strlen(s), TOK_SPECIAL),
          "special text round-trips either way");
    char *text;
    size_t len;
    int32_t seq[] = {128000, 6151, 128009};
    CHECK(tok_decode(t, seq, 3, &text, &len) == 0 && !strcmp(text, "hi"), "control tokens print nothing");
    free(text);
    CHECK(tok_decode_flags(t, seq, 3, TOK_SPECIAL, &text, &len) == 0 && !strcmp(text, "<|begin_of_text|>hi<|eot_id|>"),
          "with TOK_SPECIAL they print their text");
    free(text);
    CHECK(tok_encode_flags(t, "x", 1, TOK_ADD_BOS, &ids, &k) == 0 && k == 2 && ids[0] == 128000, "TOK_ADD_BOS");
    free(ids);
    /* streaming: a byte-level piece is its bytes, no space games after BOS */
    const char *p = tok_piece(t, 128000, 1917, &len);
    CHECK(p && len == 6 && !memcmp(p, " world", 6), "piece after BOS keeps its space");

    test_roundtrip_random(t, "llama3", 1);

    /* speed, for information only */
    char *story;
    size_t sn;
    const char *sp =
        test_data("TinyStories through the Llama 3 tokenizer", "datasets/tinystories/tinystories_val_sample.txt.gz");
    if (sp && pd_read_file_gz(sp, &story, &sn) == 0) {
        size_t n100k = sn < 100000 ? sn : 100000;
        t0 = pd_now();
        CHECK(tok_encode(t, story, n100k, 1, &ids, &k) == 0, "%s", pd_errmsg());
        printf("llama3: encoded %zu bytes of TinyStories into %d tokens in %.1f ms\n", n100k, k, (pd_now() - t0) * 1e3);
        free(ids);
        CHECK(roundtrips(t, story, sn, 0), "TinyStories sample does not round-trip");
        free(story);
    }
    char *same = malloc(100000);
    memset(same, ' ', 100000);
    t0 = pd_now();
    CHECK(tok_encode(t, same, 100000, 0, &ids, &k) == 0, "%s", pd_errmsg());
    printf("llama3: encoded 100000 spaces into %d tokens in %.1f ms\n", k, (pd_now() - t0) * 1e3);
    free(ids);
    free(same);
    tok_free(t);
    free(json);
}

/* ---- a hand-made SentencePiece-style tokenizer.json (Llama 2 HF layout) ----
   ids: 0 <unk>, 1 <s>, 2 </s>, 3..258 <0x00>..<0xFF>, then the pieces below;
   merges by rank: "▁ h" 0, "l l" 1, "▁h e" 2, "ll o" 3, "▁he llo" 4, "l o" 5, "e l" 6 */
enum { P_META = 259, P_H, P_E, P_L, P_O, P_MH, P_LL, P_MHE, P_LLO, P_MHELLO, P_LO, P_EL };
#define B(c) (3 + (c))

static char *spm_json(const char *normalizer, const char *pre, int bos_template) {
    static const char *pieces[] = {"▁", "h", "e", "l", "o", "▁h", "ll", "▁he", "llo", "▁hello", "lo", "el"};
    json_t *vocab = json_object();
    json_object_set_new(vocab, "<unk>", json_integer(0));
    json_object_set_new(vocab, "<s>", json_integer(1));
    json_object_set_new(vocab, "</s>", json_integer(2));
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        json_object_set_new(vocab, name, json_integer(B(b)));
    }
    for (int i = 0; i < 12; i++) json_object_set_new(vocab, pieces[i], json_integer(P_META + i));
    json_error_t err;
    json_t *root = json_pack_ex(
        &err, 0, "{s:s, s:o, s:o, s:o, s:o, s:{s:s, s:s, s:b, s:b, s:o, s:[s,s,s,s,s,[s,s],s]}}", "version", "1.0",
        "added_tokens",
        json_pack("[{s:i,s:s,s:b},{s:i,s:s,s:b},{s:i,s:s,s:b}]", "id", 0, "content", "<unk>", "special", 1, "id", 1,
                  "content", "<s>", "special", 1, "id", 2, "content", "</s>", "special", 1),
        "normalizer", normalizer ? json_loads(normalizer, 0, NULL) : json_null(), "pre_tokenizer",
        pre ? json_loads(pre, 0, NULL) : json_null(), "post_processor",
        bos_template ? json_loads("{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\","
                                  "\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],"
                                  "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1],\"tokens\":[\"<s>\"]}}}",
                                  0, NULL)
                     : json_null(),
        "model", "type", "BPE", "unk_token", "<unk>", "fuse_unk", 1, "byte_fallback", 1, "vocab", vocab, "merges",
        "▁ h", "l l", "▁h e", "ll o", "▁he llo", "l", "o", "e l");
    if (!root) {
        fprintf(stderr, "json_pack: %s\n", err.text);
        return NULL;
    }
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s;
}

static Tokenizer *load_json_text(const char *s, const char *what) {
    Tokenizer *t = NULL;
    if (!s || tok_load_hf_json(&t, s, strlen(s), what)) {
        CHECK(0, "%s: %s", what, pd_errmsg());
        return NULL;
    }
    return t;
}

static void test_spm_json(void) {
    static const char *norm = "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"▁\"},"
                              "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"▁\"}]}";
    static const char *meta =
        "{\"type\":\"Metaspace\",\"replacement\":\"▁\",\"prepend_scheme\":\"first\",\"split\":true}";
    char *a = spm_json(norm, NULL, 1), *b = spm_json(NULL, meta, 0);
    Tokenizer *ta = load_json_text(a, "spm-normalizer"), *tb = load_json_text(b, "spm-metaspace");
    free(a);
    free(b);
    for (int v = 0; v < 2; v++) {
        const Tokenizer *t = v ? tb : ta;
        const char *name = v ? "metaspace" : "normalizer";
        if (!t) continue;
        CHECK(tok_kind(t) == TOK_BPE && tok_vocab_size(t) == 271, "%s: kind, vocab", name);
        /* "▁hello": (▁,h) r0, (l,l) r1, (▁h,e) r2, (ll,o) r3, (▁he,llo) r4 -> one piece */
        CHECK(encodes_to(t, "hello", 0, (int32_t[]){P_MHELLO}, 1), "%s: hello", name);
        /* "▁elo": (l,o) r5 comes before (e,l) r6, which is then stale: ▁ e lo
           (merging by score, leftmost-first would have given ▁ el o) */
        CHECK(encodes_to(t, "elo", 0, (int32_t[]){P_META, P_E, P_LO}, 3), "%s: elo", name);
        /* "▁hi!": ▁h, then i and ! are not pieces: byte fallback */
        CHECK(encodes_to(t, "hi!", 0, (int32_t[]){P_MH, B('i'), B('!')}, 3), "%s: hi!", name);
        /* "▁h▁h": the leftmost of two equal ranks first, then the other */
        CHECK(encodes_to(t, "h h", 0, (int32_t[]){P_MH, P_MH}, 2), "%s: h h", name);
        /* "▁é": é is two bytes of fallback */
        CHECK(encodes_to(t, "\xc3\xa9", 0, (int32_t[]){P_META, B(0xC3), B(0xA9)}, 3), "%s: é", name);
        CHECK(encodes_to(t, "hello hello", 0, (int32_t[]){P_MHELLO, P_MHELLO}, 2), "%s: hello hello", name);
        CHECK(encodes_to(t, "", 0, NULL, 0), "%s: empty", name);
        /* (Metaspace does not put "▁" in front of a text that starts with a space, and
           its decoder drops the leading space all the same: " hello" comes back as
           "hello", in HF too) */
        const char *rt[] = {"hello", "hi!", "h h", "\xc3\xa9", "\xff", "▁", "a\n", " hello", "  h"};
        int nrt = v ? 7 : 9;
        for (int i = 0; i < nrt; i++)
            CHECK(roundtrips(t, rt[i], strlen(rt[i]), 0), "%s: \"%s\" does not round-trip", name, rt[i]);
        CHECK(tok_bos(t) == 1 && tok_eos(t) == 2, "%s: bos %d eos %d", name, tok_bos(t), tok_eos(t));
    }
    if (ta) {
        CHECK(tok_add_bos(ta) == 1, "TemplateProcessing puts <s> in front");
        CHECK(encodes_to(ta, "hello", TOK_ADD_BOS, (int32_t[]){1, P_MHELLO}, 2), "BOS + hello");
        /* Prepend works on every fragment: after <s> the text still gets its "▁" */
        CHECK(encodes_to(ta, "<s>hello", TOK_SPECIAL, (int32_t[]){1, P_MHELLO}, 2), "<s>hello, Prepend");
        size_t len;
        const char *p = tok_piece(ta, 1, P_MHELLO, &len);
        CHECK(p && len == 5 && !memcmp(p, "hello", 5), "after BOS the space goes");
    }
    /* " hello": Prepend gives "▁▁hello" (no merge for ▁▁), Metaspace "▁hello" */
    if (ta) CHECK(encodes_to(ta, " hello", 0, (int32_t[]){P_META, P_MHELLO}, 2), "Prepend: ' hello'");
    if (tb) CHECK(encodes_to(tb, " hello", 0, (int32_t[]){P_MHELLO}, 1), "Metaspace: ' hello'");
    if (tb) {
        /* prepend_scheme "first": the fragment after <s> starts at offset 3, no "▁":
           h e l l o: (l,l) r1, (ll,o) r3, then (e,llo) is no merge */
        CHECK(encodes_to(tb, "<s>hello", TOK_SPECIAL, (int32_t[]){1, P_H, P_E, P_LLO}, 4), "<s>hello, Metaspace first");
        CHECK(encodes_to(tb, "<s>", 0, (int32_t[]){P_META, B('<'), B('s'), B('>')}, 4),
              "<s> as text without TOK_SPECIAL");
    }
    tok_free(ta);
    tok_free(tb);
}

/* ---- bad tokenizer.json inputs: -1 and a message, never a crash ---- */

static void refused(const char *json, const char *needle, const char *what) {
    Tokenizer *t = NULL;
    int rc = tok_load_hf_json(&t, json, strlen(json), what);
    CHECK(rc == -1 && t == NULL, "%s: loaded", what);
    CHECK(rc == -1 && strstr(pd_errmsg(), needle), "%s: message '%s' lacks '%s'", what, pd_errmsg(), needle);
    tok_free(t);
}

#define MODEL(m) "{\"model\":" m "}"
#define VOCAB "{\"a\":0,\"b\":1,\"ab\":2}"

static void test_bad_json(void) {
    refused(MODEL("{\"type\":\"Unigram\",\"vocab\":[[\"a\",0.0]]}"), "'Unigram'", "unigram");
    refused(MODEL("{\"type\":\"WordPiece\",\"vocab\":" VOCAB "}"), "'WordPiece'", "wordpiece");
    refused(MODEL("{\"type\":\"BPE\",\"vocab\":" VOCAB ",\"merges\":[\"a c\"]}"), "not in the vocabulary",
            "merge names an unknown piece");
    refused(MODEL("{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]}"),
            "makes a piece not in the vocabulary", "merge makes an unknown piece");
    refused(MODEL("{\"type\":\"BPE\",\"vocab\":" VOCAB ",\"merges\":[\"ab\"]}"), "not two pieces",
            "merge without a space");
    refused(MODEL("{\"type\":\"BPE\",\"vocab\":" VOCAB ",\"merges\":[7]}"), "neither", "merge a number");
    refused(MODEL("{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}"), "valid id", "negative id");
    refused(MODEL("{\"type\":\"BPE\",\"vocab\":{\"a\":999999999},\"merges\":[]}"), "valid id", "huge id");
    refused(MODEL("{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0},\"merges\":[]}"), "two pieces", "duplicate id");
    refused(MODEL("{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}"), "empty vocabulary", "empty");
    refused(MODEL("{\"type\":\"BPE\",\"merges\":[]}"), "no vocab", "no vocab");
    refused(MODEL("{\"type\":\"BPE\",\"vocab\":" VOCAB ",\"merges\":[],\"dropout\":0.1}"), "dropout", "dropout");
    refused("{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\\\\p{L\"},"
            "\"behavior\":\"Isolated\",\"invert\":false},\"model\":{\"type\":\"BPE\",\"vocab\":" VOCAB
            ",\"merges\":[]}}",
            "does not compile", "bad regex");
    refused("{\"pre_tokenizer\":{\"type\":\"Whitespace\"},\"model\":{\"type\":\"BPE\",\"vocab\":" VOCAB
            ",\"merges\":[]}}",
            "'Whitespace'", "unknown pre-tokenizer");
    refused("{\"normalizer\":{\"type\":\"Lowercase\"},\"model\":{\"type\":\"BPE\",\"vocab\":" VOCAB ",\"merges\":[]}}",
            "'Lowercase'", "unknown normalizer");
    refused("{\"added_tokens\":[{\"id\":5}],\"model\":{\"type\":\"BPE\",\"vocab\":" VOCAB ",\"merges\":[]}}",
            "no content", "added token without content");
    refused("[1,2,3]", "not an object", "an array");
    refused("{\"version\":\"1.0\"}", "no model", "no model");
    refused("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":", "not valid JSON", "truncated");
    refused("", "not valid JSON", "empty input");

    /* every truncation of a valid file fails cleanly */
    char *good = spm_json(NULL, NULL, 1);
    if (!good) return;
    size_t n = strlen(good);
    int loaded = 0;
    for (size_t cut = 0; cut < n; cut += 1 + cut / 16) {
        Tokenizer *t = NULL;
        if (tok_load_hf_json(&t, good, cut, "cut") == 0) loaded++;
        tok_free(t);
    }
    CHECK(loaded == 0, "%d truncated copies loaded", loaded);
    Tokenizer *t = NULL;
    CHECK(tok_load_hf_json(&t, good, n, "whole") == 0, "%s", pd_errmsg());
    tok_free(t);
    /* damaged bytes anywhere: no crash, and whatever loads still encodes */
    int ok_loads = 0;
    for (int c = 0; c < 300; c++) {
        char *bad = strdup(good);
        for (int k = 0; k < 3; k++) bad[rnd() % n] = "{}[]\",:0a\\ "[rnd() % 12];
        if (tok_load_hf_json(&t, bad, n, "damaged") == 0) {
            int32_t *ids;
            int k;
            if (tok_encode(t, "hello there", 11, 0, &ids, &k) == 0) free(ids);
            tok_free(t);
            ok_loads++;
        }
        free(bad);
    }
    printf("damaged tokenizer.json: %d of 300 copies still loaded\n", ok_loads);
    free(good);
}

/* ---- GGUF vocabularies written here ---- */

typedef struct {
    unsigned char *p;
    size_t n, cap;
    int n_kv;
} Buf;

static void put(Buf *b, const void *s, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void put_u32(Buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(Buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(Buf *b, const char *s, size_t n) {
    put_u64(b, n);
    put(b, s, n);
}
static void key(Buf *b, const char *k, uint32_t type) {
    put_str(b, k, strlen(k));
    put_u32(b, type);
    b->n_kv++;
}
static void kv_str(Buf *b, const char *k, const char *v) {
    key(b, k, GGUF_STRING);
    put_str(b, v, strlen(v));
}
static void kv_u32(Buf *b, const char *k, uint32_t v) {
    key(b, k, GGUF_U32);
    put_u32(b, v);
}
static void kv_bool(Buf *b, const char *k, int v) {
    key(b, k, GGUF_BOOL);
    uint8_t x = (uint8_t)v;
    put(b, &x, 1);
}
static void kv_strs(Buf *b, const char *k, char **s, const size_t *len, int n) {
    key(b, k, GGUF_ARRAY);
    put_u32(b, GGUF_STRING);
    put_u64(b, (uint64_t)n);
    for (int i = 0; i < n; i++) put_str(b, s[i], len ? len[i] : strlen(s[i]));
}
static void kv_nums(Buf *b, const char *k, uint32_t type, const void *v, int n) {
    key(b, k, GGUF_ARRAY);
    put_u32(b, type);
    put_u64(b, (uint64_t)n);
    put(b, v, 4 * (size_t)n);
}
/* the header goes in front once the keys are known */
static unsigned char *gguf_finish(Buf *b, size_t *n) {
    Buf h = {0};
    put(&h, "GGUF", 4);
    put_u32(&h, 3);
    put_u64(&h, 0);
    put_u64(&h, (uint64_t)b->n_kv);
    put(&h, b->p, b->n);
    free(b->p);
    *n = h.n;
    return h.p;
}

static Tokenizer *load_gguf_bytes(const unsigned char *p, size_t n, const char *what) {
    Tokenizer *t = NULL;
    if (tok_load_bytes(&t, p, n, "gguf", what)) {
        CHECK(0, "%s", pd_errmsg());
        return NULL;
    }
    return t;
}

/* Llama 2's vocabulary as llama.cpp's convert writes it: pieces with "▁", types, scores */
static unsigned char *spm_gguf(size_t *out_n) {
    size_t n;
    unsigned char *d =
        (unsigned char *)read_data("Llama 2's vocabulary as a GGUF", "tokenizers/llama2/tokenizer.bin", &n);
    if (!d) return NULL;
    int cap = 40000, k = 0;
    char **tok = calloc((size_t)cap, sizeof *tok);
    float *score = calloc((size_t)cap, sizeof *score);
    int32_t *type = calloc((size_t)cap, sizeof *type);
    for (size_t at = 4; at + 8 <= n && k < cap; k++) {
        int32_t len;
        memcpy(&score[k], d + at, 4);
        memcpy(&len, d + at + 4, 4);
        const char *s = (const char *)d + at + 8;
        at += 8 + (size_t)len;
        char *o = malloc(3 * (size_t)len + 1), *q = o;
        for (int i = 0; i < len; i++) {
            if (s[i] == ' ') memcpy(q, "\xe2\x96\x81", 3), q += 3;
            else *q++ = s[i];
        }
        *q = 0;
        type[k] = 1;
        if (!strcmp(o, "<unk>")) type[k] = 2;
        if (!strcmp(o, "\n<s>\n") || !strcmp(o, "\n</s>\n")) {
            type[k] = 3;
            memmove(o, o + 1, strlen(o) - 1); /* "\n<s>\n" -> "<s>" */
            o[strlen(o) - 2] = 0;
        }
        if (strlen(o) == 6 && !strncmp(o, "<0x", 3) && o[5] == '>') type[k] = 6;
        tok[k] = o;
    }
    free(d);
    Buf b = {0};
    kv_str(&b, "general.architecture", "llama");
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_strs(&b, "tokenizer.ggml.tokens", tok, NULL, k);
    kv_nums(&b, "tokenizer.ggml.scores", GGUF_F32, score, k);
    kv_nums(&b, "tokenizer.ggml.token_type", GGUF_I32, type, k);
    kv_u32(&b, "tokenizer.ggml.bos_token_id", 1);
    kv_u32(&b, "tokenizer.ggml.eos_token_id", 2);
    kv_u32(&b, "tokenizer.ggml.unknown_token_id", 0);
    for (int i = 0; i < k; i++) free(tok[i]);
    free(tok);
    free(score);
    free(type);
    return gguf_finish(&b, out_n);
}

/* the Llama 3 vocabulary as a gpt2-model GGUF: pieces in the byte alphabet as the JSON
   writes them, the added tokens as control pieces, merges, pre "llama-bpe" */
static unsigned char *bpe_gguf(size_t *out_n, const char *pre, const char *model, int drop_types) {
    size_t n;
    char *d = read_data("the Llama 3 vocabulary as a GGUF", "tokenizers/llama3/tokenizer.json.gz", &n);
    if (!d) return NULL;
    json_t *root = json_loadb(d, n, 0, NULL);
    free(d);
    if (!root) return NULL;
    json_t *m = json_object_get(root, "model"), *added = json_object_get(root, "added_tokens");
    int nv = 128256;
    char **tok = calloc((size_t)nv, sizeof *tok);
    size_t *len = calloc((size_t)nv, sizeof *len);
    int32_t *type = calloc((size_t)nv, sizeof *type);
    const char *k;
    json_t *v;
    json_object_foreach(json_object_get(m, "vocab"), k, v) {
        int id = (int)json_integer_value(v);
        tok[id] = (char *)k;
        len[id] = strlen(k);
        type[id] = 1;
    }
    size_t i;
    json_array_foreach(added, i, v) {
        int id = (int)json_integer_value(json_object_get(v, "id"));
        tok[id] = (char *)json_string_value(json_object_get(v, "content"));
        len[id] = strlen(tok[id]);
        type[id] = 3;
    }
    json_t *merges = json_object_get(m, "merges");
    int nm = (int)json_array_size(merges);
    char **mer = calloc((size_t)nm, sizeof *mer);
    for (int j = 0; j < nm; j++) mer[j] = (char *)json_string_value(json_array_get(merges, j));
    Buf b = {0};
    kv_str(&b, "general.architecture", "llama");
    kv_str(&b, "tokenizer.ggml.model", model);
    if (pre) kv_str(&b, "tokenizer.ggml.pre", pre);
    kv_strs(&b, "tokenizer.ggml.tokens", tok, len, nv);
    if (!drop_types) kv_nums(&b, "tokenizer.ggml.token_type", GGUF_I32, type, nv);
    kv_strs(&b, "tokenizer.ggml.merges", mer, NULL, nm);
    kv_u32(&b, "tokenizer.ggml.bos_token_id", 128000);
    kv_u32(&b, "tokenizer.ggml.eos_token_id", 128001);
    free(tok);
    free(len);
    free(type);
    free(mer);
    json_decref(root);
    return gguf_finish(&b, out_n);
}

static void test_written_gguf(void) {
    size_t n;
    unsigned char *g = spm_gguf(&n);
    if (g) {
        Tokenizer *t = load_gguf_bytes(g, n, "llama2 vocab as GGUF");
        if (t) {
            CHECK(tok_kind(t) == TOK_SPM && tok_vocab_size(t) == 32000, "kind, vocab");
            CHECK(tok_bos(t) == 1 && tok_eos(t) == 2 && tok_add_bos(t), "specials");
            test_vectors(t, "llama2 GGUF (SPM)", "llama-spm");
            CHECK(encodes_to(t, "<s>Hello", TOK_SPECIAL, (int32_t[]){1, 15043}, 2),
                  "<s> as a control token, then the text gets its space again");
            CHECK(roundtrips(t, "Hello <s> world", 15, 0), "plain <s> round-trips");
            tok_free(t);
        }
        /* the same through a file: mapped, recognised by its magic */
        char path[] = "/tmp/paradec-tok-XXXXXX";
        int fd = mkstemp(path);
        if (fd >= 0 && write(fd, g, n) == (ssize_t)n) {
            close(fd);
            CHECK(tok_load_file(&t, path) == 0 && tok_vocab_size(t) == 32000, "%s", pd_errmsg());
            tok_free(t);
            unlink(path);
        }
        Tokenizer *t2 = NULL;
        CHECK(tok_load_bytes(&t2, g, n, NULL, "sniffed") == 0 && tok_kind(t2) == TOK_SPM,
              "kind sniffed from the magic: %s", pd_errmsg());
        tok_free(t2);
        free(g);
    }
    g = bpe_gguf(&n, "llama-bpe", "gpt2", 0);
    if (g) {
        Tokenizer *t = load_gguf_bytes(g, n, "llama3 vocab as GGUF");
        if (t) {
            CHECK(tok_kind(t) == TOK_BPE && tok_vocab_size(t) == 128256, "kind, vocab");
            CHECK(tok_bos(t) == 128000 && tok_eos(t) == 128001 && tok_add_bos(t), "specials, add_bos");
            test_vectors(t, "llama3 GGUF (llama-bpe)", "llama-bpe");
            CHECK(encodes_to(t, "<|begin_of_text|>Hello", TOK_SPECIAL, (int32_t[]){128000, 9906}, 2), "control token");
            tok_free(t);
        }
        free(g);
    }
    /* bad GGUF vocabularies */
    struct {
        const char *pre, *model, *needle;
        int drop_types;
    } bad[] = {
        {"frobnicate", "gpt2", "'frobnicate'", 0},
        {"llama-bpe", "bert", "'bert'", 0},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        g = bpe_gguf(&n, bad[i].pre, bad[i].model, bad[i].drop_types);
        if (!g) continue;
        Tokenizer *t = NULL;
        CHECK(tok_load_bytes(&t, g, n, "gguf", "bad") == -1 && strstr(pd_errmsg(), bad[i].needle),
              "refused naming %s: %s", bad[i].needle, pd_errmsg());
        tok_free(t);
        free(g);
    }
    /* small hand-made ones */
    char *toks[] = {"a", "b", "ab"};
    char *merges_bad[] = {"a c"};
    int32_t types2[] = {1, 1};
    struct {
        const char *what, *needle;
        int variant;
    } small[] = {{"merge names an unknown piece", "not in the vocabulary", 0},
                 {"token_type of the wrong length", "entries for 3 tokens", 1},
                 {"bos out of range", "outside the vocabulary", 2},
                 {"no tokens", "tokens is missing", 3},
                 {"no tokenizer at all", "tokenizer.ggml.model is missing", 4},
                 {"merges missing", "merges is missing", 5}};
    for (size_t i = 0; i < sizeof small / sizeof *small; i++) {
        Buf b = {0};
        int v = small[i].variant;
        if (v != 4) kv_str(&b, "tokenizer.ggml.model", "gpt2");
        kv_str(&b, "tokenizer.ggml.pre", "gpt-2");
        if (v != 3) kv_strs(&b, "tokenizer.ggml.tokens", toks, NULL, 3);
        if (v == 1) kv_nums(&b, "tokenizer.ggml.token_type", GGUF_I32, types2, 2);
        if (v == 0) kv_strs(&b, "tokenizer.ggml.merges", merges_bad, NULL, 1);
        else if (v != 5) kv_strs(&b, "tokenizer.ggml.merges", (char *[]){"a b"}, NULL, 1);
        if (v == 2) kv_u32(&b, "tokenizer.ggml.bos_token_id", 3);
        g = gguf_finish(&b, &n);
        Tokenizer *t = NULL;
        CHECK(tok_load_bytes(&t, g, n, "gguf", small[i].what) == -1 && strstr(pd_errmsg(), small[i].needle), "%s: %s",
              small[i].what, pd_errmsg());
        tok_free(t);
        /* and every truncation of it fails cleanly */
        for (size_t cut = 0; cut < n; cut++) {
            if (tok_load_bytes(&t, g, cut, "gguf", "cut") == 0) tok_free(t);
        }
        free(g);
    }
    /* a good small one: "ab" merges, add_bos read from its key */
    Buf b = {0};
    kv_str(&b, "tokenizer.ggml.model", "gpt2");
    kv_str(&b, "tokenizer.ggml.pre", "smollm");
    kv_strs(&b, "tokenizer.ggml.tokens", toks, NULL, 3);
    kv_strs(&b, "tokenizer.ggml.merges", (char *[]){"a b"}, NULL, 1);
    kv_u32(&b, "tokenizer.ggml.bos_token_id", 2);
    kv_bool(&b, "tokenizer.ggml.add_bos_token", 1);
    g = gguf_finish(&b, &n);
    Tokenizer *t = load_gguf_bytes(g, n, "small");
    if (t) {
        /* one pre-token "abba": a b b a, (a,b) merges once: ab b a */
        CHECK(encodes_to(t, "abba", 0, (int32_t[]){2, 1, 0}, 3), "abba");
        CHECK(tok_add_bos(t) == 1 && tok_bos(t) == 2, "add_bos key");
        int32_t *ids;
        int k;
        CHECK(tok_encode(t, "acb", 3, 0, &ids, &k) == 0 && k == 2 && ids[0] == 0 && ids[1] == 1,
              "a byte with no piece is dropped");
        free(ids);
        tok_free(t);
    }
    free(g);
}

/* llama.cpp's own vocab-only files, when the shared copies are intact */
static void test_shared_gguf(const char *vocab, TokKind kind) {
    char rel[256];
    snprintf(rel, sizeof rel, "tokenizers/ggml-vocab/ggml-vocab-%s.gguf", vocab);
    const char *path = test_data("llama.cpp's vocab-only file", rel);
    if (!path) return;
    char *d;
    size_t n;
    if (pd_read_file(path, &d, &n)) {
        CHECK(0, "%s", pd_errmsg());
        return;
    }
    /* U+FFFD where binary fields should be: the copy went through a text decoder */
    size_t damage = 0;
    for (char *p = d; (p = memmem(p, n - (size_t)(p - d), "\xef\xbf\xbd", 3)); p += 3) damage++;
    free(d);
    Tokenizer *t = NULL;
    int rc = tok_load_file(&t, path);
    if (rc && damage) {
        printf("SKIP %s: the shared copy is damaged (%zu U+FFFD sequences in binary fields: it "
               "went through a UTF-8 decoder); loading it says: %s\n",
               rel, damage, pd_errmsg());
        return;
    }
    CHECK(rc == 0, "%s", pd_errmsg());
    if (rc) return;
    CHECK(tok_kind(t) == kind, "%s: kind", vocab);
    test_vectors(t, rel, vocab);
    tok_free(t);
}

/* SmolLM2-135M-Instruct's GGUF from `make models`, when it is there */
static void test_smollm2(void) {
    char path[1024];
    const char *cache = getenv("PARADEC_CACHE");
    const char *home = getenv("HOME");
    if (cache) snprintf(path, sizeof path, "%s/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", cache);
    else snprintf(path, sizeof path, "%s/.cache/paradec/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", home ? home : ".");
    if (access(path, R_OK)) {
        printf("SKIP SmolLM2: %s is not there (make models fetches it)\n", path);
        return;
    }
    double t0 = pd_now();
    Tokenizer *t;
    CHECK(tok_load_file(&t, path) == 0, "%s", pd_errmsg());
    if (!t) return;
    printf("SmolLM2 GGUF vocabulary loaded in %.0f ms\n", (pd_now() - t0) * 1e3);
    CHECK(tok_kind(t) == TOK_BPE && tok_vocab_size(t) == 49152, "kind, vocab %d", tok_vocab_size(t));
    CHECK(tok_bos(t) == 1 && tok_eos(t) == 2 && tok_add_bos(t) == 0, "bos %d eos %d add_bos %d", tok_bos(t), tok_eos(t),
          tok_add_bos(t));
    int im_end = tok_find(t, "<|im_end|>");
    CHECK(im_end == 2 && tok_is_eog(t, im_end), "<|im_end|> ends a turn");
    /* the smollm pre-tokenizer splits every digit off first */
    int32_t *ids;
    int k;
    CHECK(tok_encode(t, "12345", 5, 0, &ids, &k) == 0 && k == 5, "one token per digit (%d)", k);
    free(ids);
    CHECK(tok_encode_flags(t, "<|im_start|>user", 16, TOK_SPECIAL, &ids, &k) == 0 && k == 2 && ids[0] == 1,
          "<|im_start|> is one control token");
    free(ids);
    test_roundtrip_random(t, "smollm2", 0);

    /* what a model file stores as its tokenizer of kind "gguf": the vocabulary keys
       alone (gguf_write_vocab), loaded from bytes, encodes the same */
    Gguf g;
    unsigned char *vb = NULL;
    size_t vn = 0;
    CHECK(gguf_open(&g, path) == 0 && gguf_write_vocab(&g, &vb, &vn) == 0, "%s", pd_errmsg());
    if (vb) {
        gguf_close(&g);
        Tokenizer *tv = load_gguf_bytes(vb, vn, "smollm2 vocab-only");
        const char *s = "The 2 cats' 1234 <|im_end|> naïve\n\n  x";
        int32_t *a, *b;
        int na, nb;
        CHECK(tv && tok_encode_flags(t, s, strlen(s), TOK_SPECIAL, &a, &na) == 0 &&
                  tok_encode_flags(tv, s, strlen(s), TOK_SPECIAL, &b, &nb) == 0 && na == nb &&
                  !memcmp(a, b, (size_t)na * sizeof *a),
              "vocab-only copy encodes the same");
        if (tv) {
            free(a);
            free(b);
            CHECK(tok_add_bos(tv) == 0 && tok_eos(tv) == 2, "vocab-only copy keeps the special ids");
        }
        printf("SmolLM2 vocab-only GGUF: %zu bytes\n", vn);
        tok_free(tv);
        free(vb);
    }
    /* a byte the vocabulary has no piece for is dropped, as HF and llama.cpp do */
    char *text = NULL;
    size_t len;
    CHECK(tok_encode(t,
                     "a\x04"
                     "b",
                     3, 0, &ids, &k) == 0 &&
              tok_decode(t, ids, k, &text, &len) == 0 && !strcmp(text, "ab"),
          "0x04 has no piece in SmolLM2's vocabulary");
    free(ids);
    free(text);
    tok_free(t);
}

static void test_kinds(void) {
    size_t n;
    char *d = read_data("tokenizer kinds told by their bytes", "tokenizers/llama2/tokenizer.bin", &n);
    if (!d) return;
    Tokenizer *t = NULL;
    CHECK(tok_load_bytes(&t, d, n, "llama2c", "tokenizer.bin") == 0 && tok_vocab_size(t) == 32000, "%s", pd_errmsg());
    tok_free(t);
    CHECK(tok_load_bytes(&t, d, n, "sentencepiece", "x") == -1 && strstr(pd_errmsg(), "'sentencepiece'"),
          "unknown kind: %s", pd_errmsg());
    CHECK(tok_load_bytes(&t, d, n, "hf-json", "x") == -1 && strstr(pd_errmsg(), "not valid JSON"),
          "kind hf-json on a tokenizer.bin: %s", pd_errmsg());
    CHECK(tok_load_bytes(&t, d, n, "gguf", "x") == -1 && strstr(pd_errmsg(), "GGUF"),
          "kind gguf on a tokenizer.bin: %s", pd_errmsg());
    CHECK(tok_load_bytes(&t, "\x1f\x8b\x08\x00", 4, NULL, "x.json") == -1 && strstr(pd_errmsg(), "gzip"),
          "gzip bytes: %s", pd_errmsg());
    free(d);
}

int main(void) {
    test_llama3_json();
    test_spm_json();
    test_bad_json();
    test_kinds();
    test_written_gguf();
    test_shared_gguf("llama-spm", TOK_SPM);
    test_shared_gguf("gpt-2", TOK_BPE);
    test_smollm2();
    return check_done("tokenizer_bpe");
}
