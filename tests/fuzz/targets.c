/* targets.c — see targets.h. What a parser accepted is used the way its callers use
   it (every tensor's bytes read, a tokenizer encoding and decoding text), so that a
   promise it broke shows up under the sanitizers, not only a crash inside it. */
#include "targets.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "decode/drafter.h"
#include "formats/gguf.h"
#include "formats/quant.h"
#include "formats/tensorfile.h"
#include "import/gguf_model.h"
#include "import/hf.h"
#include "import/llama2c.h"
#include "model/checkpoint.h"
#include "recipe/recipe.h"
#include "serve/serve_gen.h"
#include "tokenizer/tokenizer.h"
#include "train/dataset.h"

#define EXPECT(cond)                                                                                                   \
    do {                                                                                                               \
        if (!(cond)) abort();                                                                                          \
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

/* a block matrix: rows of whole blocks, each dequantized (the bytes it reads are its own) */
static void use_blocks(DType dt, const void *data, int64_t rows, int64_t cols) {
    if (cols > (1 << 16) || rows * cols > (1 << 20)) return;
    float *row = malloc(sizeof(float) * (size_t)cols + 1);
    EXPECT(row);
    size_t rb = dtype_row_bytes(dt, cols);
    volatile float sum = 0;
    for (int64_t r = 0; r < rows; r++) {
        dequant_row(dt, row, (const uint8_t *)data + (size_t)r * rb, cols);
        sum += row[cols - 1];
    }
    (void)sum;
    free(row);
}

/* every tensor lies inside the data and holds dtype × shape bytes (rows × row bytes for
   a block type) */
static void use_tensors(const TensorFile *tf) {
    volatile unsigned sum = 0;
    for (int i = 0; i < tf->n; i++) {
        const Tensor *t = &tf->t[i];
        size_t want = dtype_size(t->dtype);
        for (int d = 0; d < t->ndim; d++) want *= (size_t)t->shape[d];
        if (dtype_is_quant(t->dtype)) {
            EXPECT(t->ndim == 2 && t->shape[1] > 0);
            want = (size_t)t->shape[0] * dtype_row_bytes(t->dtype, t->shape[1]);
            use_blocks(t->dtype, t->data, t->shape[0], t->shape[1]);
        }
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

static int tensorfile(int (*open)(TensorFile *, const void *, size_t, const char *), const uint8_t *data, size_t n) {
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
static int fuzz_tokenizer(int (*load)(Tokenizer **, const void *, size_t, const char *), const uint8_t *data,
                          size_t n) {
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
    for (int i = 0; i < g.n_tensors; i++) {
        const GgufTensor *t = &g.t[i];
        sum += touch(t->data, t->nbytes);
        size_t ne = (size_t)t->dims[0] * t->dims[1] * t->dims[2] * t->dims[3];
        if (ne <= (1 << 20) && t->dims[0] && t->dims[1] && t->dims[2] && t->dims[3]) {
            float *f = malloc(sizeof(float) * ne);
            EXPECT(f && gguf_tensor_f32(&g, t, f) == 0);
            free(f);
        }
    }
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
    } else refused();
    gguf_close(&g);
    Checkpoint ck; /* a vocabulary-only file is no model: still accepted as a GGUF */
    if (gguf_read_model_mem(&ck, data, n, "fuzz")) return refused() + 1;
    EXPECT(config_check(&ck.c, "fuzz") == 0);
    for (int i = 0; i < ck.n; i++) { /* block matrices kept raw: whole rows of blocks */
        CkTensor *t = &ck.t[i];
        if (!t->raw) continue;
        EXPECT(dtype_is_quant(t->dtype) && t->nraw == (size_t)t->shape[0] * dtype_row_bytes(t->dtype, t->shape[1]));
        use_blocks(t->dtype, t->raw, t->shape[0], t->shape[1]);
    }
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

/* what an accepted request becomes: its text rendered in every chat format (the
   answers are fuzz_serve_generate's) */
static void use_request(const ServeRequest *r) {
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

/* ---- whole requests through the generation path ----
   The body is parsed, encoded and run on a small model (PARADEC_FUZZ_MODEL: run.sh makes
   a one-layer random one with stories260K's vocabulary, as the fuzz build's coverage
   counters make every multiply-add slow; else $MODEL, else the default stories260K;
   loaded once) by an engine with a short context, several requests at a time and
   speculation on; the answer is read as a stream and again whole. Promises: every event
   and answer is JSON, every choice ends once, within its token limit, without its stop
   strings and with logprobs for each of its tokens when asked, a greedy or seeded
   request streams what it answers whole, and afterwards the engine holds no request and
   no KV block. A watchdog aborts an input that takes over GEN_LIMIT seconds (a spin, a
   hang); requests that would run more than GEN_WORK positions in all are only started
   and dropped, so that honest work stays far below it. */
#define GEN_LIMIT 5.0
#define GEN_CTX 128
#define GEN_WORK 1536

static struct {
    Model m;
    Engine *e;
    GenModel gm;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    double deadline; /* 0: disarmed */
} FG = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void *watchdog(void *arg) {
    (void)arg;
    pthread_mutex_lock(&FG.mu);
    for (;;) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_sec += 1;
        pthread_cond_timedwait(&FG.cv, &FG.mu, &t);
        if (FG.deadline > 0 && pd_now() > FG.deadline) {
            fprintf(stderr, "fuzz_serve_generate: an input ran over %g s (a spin or a hang)\n", GEN_LIMIT);
            abort();
        }
    }
    return NULL;
}

static void watch(double limit) {
    pthread_mutex_lock(&FG.mu);
    FG.deadline = limit > 0 ? pd_now() + limit : 0;
    pthread_mutex_unlock(&FG.mu);
}

static void gen_fixture(void) {
    if (FG.e) return;
    const char *path = getenv("PARADEC_FUZZ_MODEL");
    if (!path || !*path) path = getenv("MODEL");
    if (!path || !*path) path = "build/stories260K.safetensors.zst";
    if (model_load(&FG.m, path)) {
        fprintf(stderr, "fuzz_serve_generate: %s (set PARADEC_FUZZ_MODEL to a small model)\n", pd_errmsg());
        abort();
    }
    EngineOptions o = {
        .parallel = 4, .ctx = GEN_CTX, .block_size = 16, .prefill_chunk = 16, .continuous = 1, .spec_max_batch = 2};
    o.kv_blocks = 8 * (GEN_CTX + 2 * MAX_TREE) / 16;
    EXPECT(k_init(1) == 0 && (FG.e = engine_new(&FG.m, &o)));
    FG.gm = (GenModel){&FG.m, FG.e, CHAT_CHATML, "", "fuzz"};
    pthread_t t;
    EXPECT(pthread_create(&t, NULL, watchdog, NULL) == 0);
}

typedef struct {
    int n;                       /* choices */
    char *text[REQ_MAX_CHOICES]; /* (a model may say U+0000) */
    size_t len[REQ_MAX_CHOICES];
    int n_lp[REQ_MAX_CHOICES]; /* tokens the logprobs list */
    char finish[REQ_MAX_CHOICES][16];
    int cancelled, failed;
} GenSeen;

static void append_text(GenSeen *s, int i, json_t *t) {
    size_t b = json_string_length(t);
    EXPECT(s->text[i] = realloc(s->text[i], s->len[i] + b + 1));
    memcpy(s->text[i] + s->len[i], json_string_value(t), b + 1);
    s->len[i] += b;
}

static int gone_after; /* the client leaves after this many questions (-1: never) */
static int gone(void *ctx) {
    (void)ctx;
    return gone_after >= 0 && gone_after-- == 0;
}

/* one choice of an answer or a chunk: its text and finish_reason into seen */
static void seen_choice(GenSeen *s, const Gen *g, json_t *c, int chunk) {
    json_t *ix = json_object_get(c, "index"), *fin = json_object_get(c, "finish_reason");
    EXPECT(json_is_integer(ix) && json_integer_value(ix) >= 0 && json_integer_value(ix) < g->n_c);
    int i = (int)json_integer_value(ix);
    json_t *t = g->req.kind == REQ_COMPLETION
                    ? json_object_get(c, "text")
                    : json_object_get(json_object_get(c, chunk ? "delta" : "message"), "content");
    EXPECT(t ? json_is_string(t) : chunk);
    if (t) append_text(s, i, t);
    json_t *lp = json_object_get(c, "logprobs");
    EXPECT(lp && (g->req.logprobs >= 0 || json_is_null(lp)));
    if (!json_is_null(lp)) {
        json_t *list = json_object_get(lp, g->req.kind == REQ_CHAT ? "content" : "tokens");
        EXPECT(json_is_array(list));
        s->n_lp[i] += (int)json_array_size(list);
    }
    if (json_is_string(fin)) {
        EXPECT(!s->finish[i][0]); /* a choice ends once */
        snprintf(s->finish[i], sizeof s->finish[i], "%s", json_string_value(fin));
    } else EXPECT(json_is_null(fin));
}

static void seen_answer(GenSeen *s, const Gen *g, const char *text, int chunk) {
    json_t *o = json_loads(text, JSON_ALLOW_NUL, NULL), *cs = json_object_get(o, "choices");
    EXPECT(o && json_is_array(cs) && json_is_string(json_object_get(o, "id")));
    size_t i;
    json_t *c;
    json_array_foreach(cs, i, c) seen_choice(s, g, c, chunk);
    EXPECT(chunk || json_array_size(cs) == (size_t)g->n_c);
    json_t *u = json_object_get(o, "usage");
    if (u && !json_is_null(u)) {
        int gen = 0;
        for (int k = 0; k < g->n_c; k++) gen += g->c[k].n_gen;
        EXPECT(json_integer_value(json_object_get(u, "completion_tokens")) == gen);
    }
    json_decref(o);
}

static void gen_run(Gen *g, int stream, GenSeen *s) {
    s->n = g->n_c;
    if (!stream) {
        int status;
        char *a = gen_answer(g, &status);
        if (a) seen_answer(s, g, a, 0);
        else if (status) {
            EXPECT(status == 500);
            s->failed = 1;
        } else s->cancelled = 1;
        free(a);
    } else {
        size_t n;
        int done = 0;
        for (char *e; (e = gen_event(g, &n)); free(e)) {
            EXPECT(!done && n == strlen(e) && n > 8 && !strncmp(e, "data: ", 6) && !strcmp(e + n - 2, "\n\n"));
            e[n - 2] = 0;
            if (!strcmp(e + 6, "[DONE]")) done = 1;
            else seen_answer(s, g, e + 6, 1);
        }
        for (int i = 0; i < g->n_c; i++) s->failed |= g->c[i].finish && !strcmp(g->c[i].finish, "error");
        if (!done) { /* the client left, or memory ran out */
            EXPECT(g->c[0].finish);
            s->cancelled = 1;
        }
    }
    if (s->cancelled || s->failed) return;
    for (int i = 0; i < g->n_c; i++) {
        const GenChoice *c = &g->c[i];
        EXPECT(!strcmp(s->finish[i], "stop") || !strcmp(s->finish[i], "length"));
        EXPECT(g->req.max_tokens < 0 || c->n_gen <= g->req.max_tokens);
        EXPECT(g->req.logprobs < 0 || s->n_lp[i] == c->n_gen + (g->req.echo ? g->p[c->prompt].n : 0));
        for (int k = 0; k < g->req.n_stop; k++)
            EXPECT(!s->len[i] || !memmem(s->text[i], s->len[i], g->req.stop[k], strlen(g->req.stop[k])));
    }
}

static void seen_free(GenSeen *s) {
    for (int i = 0; i < s->n; i++) free(s->text[i]);
}

/* the engine is idle again: nothing running or queued, every KV block free */
static void engine_idle(void) {
    for (double t0 = pd_now(); pd_now() - t0 < GEN_LIMIT;) {
        EngineStats st = engine_stats(FG.e);
        if (!st.running && !st.queued && !st.kv_used) return;
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    fprintf(stderr, "fuzz_serve_generate: the engine still holds requests or KV blocks after the input\n");
    abort();
}

int fuzz_serve_generate(const uint8_t *data, size_t n) {
    gen_fixture();

    uint32_t h = 2166136261u; /* which inputs also play a client that leaves */
    for (size_t i = 0; i < n; i++) h = (h ^ data[i]) * 16777619u;
    int ok = 0;
    watch(GEN_LIMIT);
    for (int k = REQ_COMPLETION; k <= REQ_CHAT; k++) {
        GenSeen a = {0}, b = {0};
        Gen g;
        gone_after = h % 4 == 0 ? (int)(h >> 8) % 16 : -1;
        if (gen_start(&g, &FG.gm, (RequestKind)k, (const char *)data, n, "fuzz-1", 1)) {
            refused();
            gen_free(&g);
            continue;
        }
        ok = 1;
        int work = 0;
        for (int i = 0; i < g.n_c; i++) {
            int np = g.p[g.c[i].prompt].n, room = GEN_CTX - np;
            work += np + (g.req.max_tokens < 0 || g.req.max_tokens > room ? room : g.req.max_tokens);
        }
        if (work > GEN_WORK) {
            gen_free(&g);
            continue;
        }
        g.gone = gone;
        int stream = g.req.stream;
        gen_run(&g, stream, &a);
        int same = !strcmp(g.req.method, "standard") || g.req.temperature == 0;
        gen_free(&g);
        if (!a.cancelled && !a.failed && same) { /* again the other way: the same text */
            gone_after = -1;
            EXPECT(gen_start(&g, &FG.gm, (RequestKind)k, (const char *)data, n, "fuzz-2", 1) == 0);
            gen_run(&g, !stream, &b);
            for (int i = 0; !b.failed && i < g.n_c; i++)
                EXPECT(a.len[i] == b.len[i] && (!a.len[i] || !memcmp(a.text[i], b.text[i], a.len[i])) &&
                       !strcmp(a.finish[i], b.finish[i]));
            gen_free(&g);
        }
        seen_free(&a), seen_free(&b);
    }
    engine_idle();
    watch(0);
    return ok;
}
