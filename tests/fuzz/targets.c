/* targets.c — see targets.h. What a parser accepted is used the way its callers use
   it (every tensor's bytes read, a tokenizer encoding and decoding text), so that a
   promise it broke shows up under the sanitizers, not only a crash inside it. */
#include "targets.h"

#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "dataset.h"
#include "drafter.h"
#include "gguf.h"
#include "recipe.h"
#include "serve_request.h"
#include "tensorfile.h"
#include "tokenizer.h"

#define EXPECT(cond) \
    do {             \
        if (!(cond)) abort(); \
    } while (0)

/* a refusal must say something, on one line */
static int refused(void) {
    EXPECT(!strchr(pd_errmsg(), '\n'));
    return 0;
}

/* the input as a C string (the parsers of text that take one) */
static char *cstring(const uint8_t *data, size_t n) {
    char *s = malloc(n + 1);
    EXPECT(s);
    memcpy(s, data, n);
    s[n] = 0;
    return s;
}

static unsigned touch(const void *p, size_t n) { /* reads the first and last byte */
    const unsigned char *c = p;
    return n ? c[0] + c[n - 1] : 0;
}

/* every tensor lies inside the data and holds dtype × shape bytes */
static void use_tensors(const TensorFile *tf) {
    volatile unsigned sum = 0;
    for (int i = 0; i < tf->n; i++) {
        const Tensor *t = &tf->t[i];
        size_t want = dtype_size(t->dtype);
        for (int d = 0; d < t->ndim; d++) want *= (size_t)t->shape[d];
        EXPECT(t->nbytes == want && tf_get(tf, t->name) != NULL);
        sum += touch(t->data, t->nbytes);
    }
    for (int i = 0; i < tf->n_meta; i++) EXPECT(tf_meta(tf, tf->meta_key[i]) != NULL);
    const char *cfg = tf_meta(tf, "paradec.config");
    Config c;
    if (cfg && config_from_json(&c, cfg, "fuzz")) refused();
    /* the checked-weights readers: paradec.digests parsed, every tensor hashed */
    if (tf_verify(tf, NULL)) refused();
    if (tf_meta(tf, "paradec.digest") && model_verify(tf)) refused();
    (void)sum;
}

static int tensorfile(int (*open)(TensorFile *, const void *, size_t, const char *), const uint8_t *data,
                      size_t n) {
    TensorFile tf;
    if (open(&tf, data, n, "fuzz")) return refused();
    use_tensors(&tf);
    TensorFile view;
    if (tf_view(&view, &tf, "model.") == 0) {
        use_tensors(&view);
        tf_close(&view);
    }
    tf_close(&tf);
    return 1;
}

int fuzz_safetensors(const uint8_t *data, size_t n) { return tensorfile(tf_parse, data, n); }
int fuzz_safetensors_zst(const uint8_t *data, size_t n) { return tensorfile(tf_load, data, n); }

int fuzz_llama2c(const uint8_t *data, size_t n) {
    Checkpoint ck;
    if (llama2c_read_mem(&ck, data, n, "fuzz")) return refused();
    for (int i = 0; i < ck.n; i++) {
        volatile float x = ck.t[i].data[ck.t[i].shape[0] * ck.t[i].shape[1] - 1];
        (void)x;
    }
    ck_free(&ck);
    return 1;
}

/* a loaded tokenizer round-trips text and names only ids it has */
static void use_tokenizer(Tokenizer *t) {
    static const char text[] = "Once upon a time, <s> a cat\xe2\x96\x81sat \xff\xfe on 12345 mats!\n\n  </s>";
    int32_t *ids;
    int n;
    for (int flags = 0; flags < 4; flags++) {
        if (tok_encode_flags(t, text, sizeof text - 1, flags, &ids, &n)) {
            refused();
            continue;
        }
        int V = tok_vocab_size(t), prev = tok_bos(t);
        for (int i = 0; i < n; i++) {
            EXPECT(ids[i] >= 0 && ids[i] < V);
            size_t len;
            const char *p = tok_piece(t, prev, ids[i], &len);
            EXPECT(p || !len);
            prev = ids[i];
        }
        char *back;
        size_t len;
        if (tok_decode_flags(t, ids, n, flags, &back, &len) == 0) free(back);
        free(ids);
    }
}

/* a tokenizer from either loader, then used */
static int fuzz_tokenizer(int (*load)(Tokenizer **, const void *, size_t, const char *), const uint8_t *data, size_t n) {
    Tokenizer *t;
    if (load(&t, data, n, "fuzz")) return refused();
    use_tokenizer(t);
    tok_free(t);
    return 1;
}

int fuzz_tokenizer_bin(const uint8_t *data, size_t n) { return fuzz_tokenizer(tok_load_llama2c, data, n); }
int fuzz_tokenizer_json(const uint8_t *data, size_t n) { return fuzz_tokenizer(tok_load_hf_json, data, n); }

int fuzz_hf_config(const uint8_t *data, size_t n) {
    Config c;
    if (hf_config_parse(&c, data, n, "fuzz")) return refused();
    EXPECT(config_check(&c, "fuzz") == 0);
    return 1;
}

int fuzz_gguf(const uint8_t *data, size_t n) {
    Gguf g;
    if (gguf_parse(&g, data, n, "fuzz")) return refused();
    volatile unsigned sum = 0;
    for (int i = 0; i < g.n_tensors; i++) sum += touch(g.t[i].data, g.t[i].nbytes);
    (void)sum;
    unsigned char *vocab;
    size_t len;
    EXPECT(gguf_write_vocab(&g, &vocab, &len) == 0);
    Gguf v; /* what a model file stores as its tokenizer must load again */
    EXPECT(gguf_parse(&v, vocab, len, "fuzz vocab") == 0);
    gguf_close(&v);
    free(vocab);
    Tokenizer *t;
    if (tok_load_gguf(&t, &g, "fuzz") == 0) {
        use_tokenizer(t);
        tok_free(t);
    } else
        refused();
    gguf_close(&g);
    Checkpoint ck; /* a vocabulary-only file is no model: still accepted as a GGUF */
    if (gguf_read_model_mem(&ck, data, n, "fuzz")) return refused() + 1;
    EXPECT(config_check(&ck.c, "fuzz") == 0);
    ck_free(&ck);
    return 1;
}

int fuzz_dataset(const uint8_t *data, size_t n) {
    TextSet ds;
    if (dataset_parse(&ds, data, n, "text,document,question,prompt,turns", "fuzz")) return refused();
    EXPECT(ds.n > 0);
    for (int i = 0; i < ds.n; i++) EXPECT(strlen(ds.text[i]) <= ds.len[i]);
    dataset_free(&ds);
    return 1;
}

int fuzz_recipe(const uint8_t *data, size_t n) {
    Recipe r;
    if (recipe_parse(&r, (const char *)data, n, "fuzz.yaml")) return refused();
    recipe_free(&r);
    return 1;
}

int fuzz_medusa_tree(const uint8_t *data, size_t n) {
    char *spec = cstring(data, n);
    MedusaTree tr;
    int heads = n ? 1 + data[0] % MAX_MEDUSA : MAX_MEDUSA, ok = 0;
    if (medusa_tree_parse(&tr, spec, heads)) refused();
    else {
        ok = 1;
        EXPECT(tr.n >= 2 && tr.n <= MAX_TREE && tr.parent[0] == -1);
        for (int i = 1; i < tr.n; i++)
            EXPECT(tr.parent[i] >= 0 && tr.parent[i] < i && tr.depth[i] == tr.depth[tr.parent[i]] + 1 &&
                   tr.depth[i] <= heads);
    }
    free(spec);
    return ok;
}

/* what an accepted request becomes: its text rendered in every chat format, answers
   and stream chunks that must come out as JSON */
static void use_request(const ServeRequest *r) {
    const char *text = r->kind == REQ_COMPLETION ? r->prompt : r->turn[r->n_turns - 1].content;
    ReplyInfo in = {"id", "m", 0, 1, 2};
    char *a = serve_response(r, &in, text, strlen(text), "stop"), *b = serve_chunk(r, &in, text, strlen(text), NULL, 1);
    EXPECT(a && b);
    free(a), free(b);
    for (int f = 0; r->kind == REQ_CHAT && f < CHAT_COUNT; f++) {
        int bos;
        char *c = chat_apply_turns((ChatFormat)f, NULL, r->turn, r->n_turns, &bos);
        EXPECT(c);
        free(c);
    }
}

int fuzz_serve_request(const uint8_t *data, size_t n) {
    int ok = 0;
    for (int k = REQ_COMPLETION; k <= REQ_CHAT; k++) {
        ServeRequest r;
        if (serve_request_parse(&r, (RequestKind)k, (const char *)data, n)) {
            refused();
            continue;
        }
        use_request(&r);
        serve_request_free(&r);
        ok = 1;
    }
    size_t m; /* the UTF-8 guards see every byte string */
    char *c = utf8_clean((const char *)data, n, &m);
    EXPECT(c && utf8_whole(c, m) == m);
    free(c);
    return ok;
}
