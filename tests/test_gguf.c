/* test_gguf — the GGUF reader and model importer. GGUF files are written here by a
   little writer of the test's own (the spec's layout), with blocks quantised and
   dequantised by the test's own formulas (ggml's reference: per block of 32, Q8_0
   x = d·q; Q4_0 x = d·(q-8); Q4_1 x = d·q + m; low nibbles are elements 0..15, high
   nibbles 16..31), q/k rows permuted as llama.cpp's LlamaModel.permute does.
   Checks: f16 conversion (every value, against F16C when the CPU has it), hand-made
   blocks, a file written by another writer (gguf-py, with its own dequantisation as the
   expected values: tests/gguf_pyw.h), a tiny quantised llama and qwen2 read back (exact for F32, the test's own
   dequantisation for the rest), Llama 3 RoPE factors recovered, the vocabulary-only
   GGUF, bad files refused by name, every truncation and random mutations (no crash
   under ASan), and llama.cpp's own vocab-only files.

   Also a fixture writer for tests/test_convert_hf.sh:
     test_gguf --write-gguf MODEL OUT.gguf [f32|f16]   a paradec model as a llama GGUF
     test_gguf --write-tiny OUT.gguf                   the tiny quantised llama */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

#include "check.h"
#include "fixture.h"
#include "formats/gguf.h"
#include "import/gguf_model.h"
#include "model/checkpoint.h"
#include "gguf_pyw.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static float frand(void) { return (float)(rnd32() % 2000001) / 1e6f - 1.0f; }

/* ---------------- quantisers and dequantisers (ggml's reference formulas) ---------------- */

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static void quant_q8_0(const float *x, uint8_t *b) {
    float amax = 0;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127, id = d ? 1 / d : 0;
    put16(b, to_half(d));
    for (int j = 0; j < 32; j++) b[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
}
static void quant_q4_0(const float *x, uint8_t *b) {
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) amax = fabsf(x[j]), max = x[j];
    float d = max / -8, id = d ? 1 / d : 0;
    put16(b, to_half(d));
    for (int j = 0; j < 16; j++) {
        int q0 = (int)fminf(15, x[j] * id + 8.5f), q1 = (int)fminf(15, x[j + 16] * id + 8.5f);
        b[2 + j] = (uint8_t)(q0 | q1 << 4);
    }
}
static void quant_q4_1(const float *x, uint8_t *b) {
    float mn = x[0], mx = x[0];
    for (int j = 1; j < 32; j++) mn = fminf(mn, x[j]), mx = fmaxf(mx, x[j]);
    float d = (mx - mn) / 15, id = d ? 1 / d : 0;
    put16(b, to_half(d));
    put16(b + 2, to_half(mn));
    for (int j = 0; j < 16; j++) {
        int q0 = (int)fminf(15, (x[j] - mn) * id + 0.5f), q1 = (int)fminf(15, (x[j + 16] - mn) * id + 0.5f);
        b[4 + j] = (uint8_t)(q0 | q1 << 4);
    }
}
/* element j of a block */
static float deq(uint32_t type, const uint8_t *b, int j) {
    float d = half_value(get16(b));
    int lo = j < 16, k = j % 16;
    switch (type) {
    case GGML_Q8_0:
        return d * (float)(int8_t)b[2 + j];
    case GGML_Q4_0:
        return d * (float)((lo ? b[2 + k] & 15 : b[2 + k] >> 4) - 8);
    default:
        return d * (float)(lo ? b[4 + k] & 15 : b[4 + k] >> 4) + half_value(get16(b + 2));
    }
}

/* ---------------- a GGUF writer ---------------- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} Buf;
static void put(Buf *b, const void *s, size_t n) {
    if (!n) return;
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void put_u32(Buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(Buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(Buf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

typedef struct {
    char name[64];
    int n_dims;
    uint64_t dims[4];
    uint32_t type;
    Buf data;
} WTensor;

typedef struct {
    Buf kv;
    uint64_t n_kv;
    WTensor t[256];
    int n_t;
    uint32_t version;
} Writer;

static void kv_str(Writer *w, const char *k, const char *v) {
    put_str(&w->kv, k);
    put_u32(&w->kv, GGUF_STRING);
    put_str(&w->kv, v);
    w->n_kv++;
}
static void kv_u32(Writer *w, const char *k, uint32_t v) {
    put_str(&w->kv, k);
    put_u32(&w->kv, GGUF_U32);
    put_u32(&w->kv, v);
    w->n_kv++;
}
static void kv_f32(Writer *w, const char *k, float v) {
    put_str(&w->kv, k);
    put_u32(&w->kv, GGUF_F32);
    put(&w->kv, &v, 4);
    w->n_kv++;
}
static void kv_bool(Writer *w, const char *k, int v) {
    uint8_t b = (uint8_t)v;
    put_str(&w->kv, k);
    put_u32(&w->kv, GGUF_BOOL);
    put(&w->kv, &b, 1);
    w->n_kv++;
}
static void kv_arr(Writer *w, const char *k, GgufType elem, uint64_t n, const void *data, size_t size) {
    put_str(&w->kv, k);
    put_u32(&w->kv, GGUF_ARRAY);
    put_u32(&w->kv, elem);
    put_u64(&w->kv, n);
    put(&w->kv, data, size);
    w->n_kv++;
}
static void kv_strs(Writer *w, const char *k, int n, char **s) {
    put_str(&w->kv, k);
    put_u32(&w->kv, GGUF_ARRAY);
    put_u32(&w->kv, GGUF_STRING);
    put_u64(&w->kv, n);
    for (int i = 0; i < n; i++) put_str(&w->kv, s[i]);
    w->n_kv++;
}

/* a tensor from f32 rows [rows][cols] (rows 0: a vector), stored as `type` */
static void add_tensor(Writer *w, const char *name, uint32_t type, int64_t rows, int64_t cols, const float *x) {
    WTensor *t = &w->t[w->n_t++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = rows ? 2 : 1;
    t->dims[0] = (uint64_t)cols;
    t->dims[1] = (uint64_t)(rows ? rows : 1);
    t->type = type;
    size_t n = (size_t)cols * (rows ? rows : 1);
    uint8_t blk[34];
    for (size_t i = 0; i < n; i++) {
        if (type == GGML_F32) put(&t->data, &x[i], 4);
        else if (type == GGML_F16) {
            uint16_t h = to_half(x[i]);
            put(&t->data, &h, 2);
        } else if (type == GGML_BF16) {
            uint16_t h = to_bf16(x[i]);
            put(&t->data, &h, 2);
        } else if (i % 32 == 0) {
            if (type == GGML_Q8_0) quant_q8_0(x + i, blk), put(&t->data, blk, 34);
            else if (type == GGML_Q4_0) quant_q4_0(x + i, blk), put(&t->data, blk, 18);
            else quant_q4_1(x + i, blk), put(&t->data, blk, 20);
        }
    }
}

/* what the reader should give back for tensor t: the test's own decoding */
static void decode_tensor(const WTensor *t, float *out) {
    size_t n = t->dims[0] * t->dims[1];
    for (size_t i = 0; i < n; i++) {
        const uint8_t *p = t->data.p;
        switch (t->type) {
        case GGML_F32:
            memcpy(&out[i], p + 4 * i, 4);
            break;
        case GGML_F16:
            out[i] = half_value(get16(p + 2 * i));
            break;
        case GGML_BF16:
            out[i] = bf16_value(get16(p + 2 * i));
            break;
        case GGML_Q8_0:
            out[i] = deq(t->type, p + i / 32 * 34, (int)(i % 32));
            break;
        case GGML_Q4_0:
            out[i] = deq(t->type, p + i / 32 * 18, (int)(i % 32));
            break;
        default:
            out[i] = deq(t->type, p + i / 32 * 20, (int)(i % 32));
        }
    }
}

static Buf finish(Writer *w) {
    Buf b = {0};
    put(&b, "GGUF", 4);
    put_u32(&b, w->version ? w->version : 3);
    put_u64(&b, (uint64_t)w->n_t);
    put_u64(&b, w->n_kv);
    put(&b, w->kv.p, w->kv.n);
    uint64_t off = 0;
    for (int i = 0; i < w->n_t; i++) {
        WTensor *t = &w->t[i];
        put_str(&b, t->name);
        put_u32(&b, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) put_u64(&b, t->dims[d]);
        put_u32(&b, t->type);
        put_u64(&b, off);
        off += (t->data.n + 31) / 32 * 32;
    }
    static const uint8_t zero[32];
    put(&b, zero, (32 - b.n % 32) % 32);
    for (int i = 0; i < w->n_t; i++) {
        put(&b, w->t[i].data.p, w->t[i].data.n);
        put(&b, zero, (32 - w->t[i].data.n % 32) % 32);
    }
    return b;
}

static void writer_free(Writer *w) {
    free(w->kv.p);
    for (int i = 0; i < w->n_t; i++) free(w->t[i].data.p);
    memset(w, 0, sizeof *w);
}

/* llama.cpp's LlamaModel.permute: HF rows [head][half c][i] → Meta rows [head][i][c] */
static void meta_permute(float *w, int heads, int hd, int cols) {
    float *tmp = malloc(sizeof(float) * (size_t)heads * hd * cols);
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < hd / 2; i++)
            for (int c = 0; c < 2; c++)
                memcpy(tmp + ((size_t)h * hd + 2 * i + c) * cols, w + ((size_t)h * hd + c * hd / 2 + i) * cols,
                       sizeof(float) * cols);
    memcpy(w, tmp, sizeof(float) * (size_t)heads * hd * cols);
    free(tmp);
}

/* ---------------- a tiny random model ---------------- */

typedef struct {
    const char *arch;
    int dim, hidden, layers, heads, kv, hd, vocab, ctx, tied, bias;
    float theta;
    int rope_llama3; /* write rope_freqs.weight for factor 8, low 1, high 4, orig 8192 */
} Tiny;

typedef struct { /* one HF tensor: its original values and where it went in the GGUF */
    char hf[96];
    int64_t rows, cols;
    float *orig;
    int wt;    /* index into the writer's tensors */
    int heads; /* q/k rows: Meta-permuted in the file */
} Expect;

static Expect EXP[256];
static int N_EXP;
static void exp_free(void) {
    for (int i = 0; i < N_EXP; i++) free(EXP[i].orig);
    N_EXP = 0;
}

static void tiny_tensor(Writer *w, const char *gg, const char *hf, uint32_t type, int64_t rows, int64_t cols, int heads,
                        int hd, float scale, int permute) {
    size_t n = (size_t)cols * (rows ? rows : 1);
    float *x = malloc(sizeof(float) * n), *file = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) x[i] = scale * frand() + (rows ? 0 : 1);
    memcpy(file, x, sizeof(float) * n);
    if (heads && permute) meta_permute(file, heads, hd, rows ? (int)cols : 1);
    add_tensor(w, gg, type, rows, cols, file);
    free(file);
    Expect *e = &EXP[N_EXP++];
    snprintf(e->hf, sizeof e->hf, "%s", hf);
    e->rows = rows, e->cols = cols, e->orig = x, e->wt = w->n_t - 1, e->heads = permute ? heads : 0;
}

static double llama3_divisor(double theta, int hd, int j, double factor, double low, double high, double orig) {
    double freq = 1 / pow(theta, 2.0 * j / hd), wl = 2 * M_PI / freq;
    if (wl < orig / high) return 1;
    if (wl > orig / low) return factor;
    double s = (orig / wl - low) / (high - low);
    return 1 / ((1 - s) / factor + s);
}

static Buf tiny_model(const Tiny *m, Writer *w) {
    memset(w, 0, sizeof *w);
    exp_free();
    char key[96], gg[96], hf[96];
#define K(s) (snprintf(key, sizeof key, "%s.%s", m->arch, s), key)
    kv_str(w, "general.architecture", m->arch);
    kv_str(w, "general.name", "tiny");
    kv_u32(w, K("block_count"), (uint32_t)m->layers);
    kv_u32(w, K("context_length"), (uint32_t)m->ctx);
    kv_u32(w, K("embedding_length"), (uint32_t)m->dim);
    kv_u32(w, K("feed_forward_length"), (uint32_t)m->hidden);
    kv_u32(w, K("attention.head_count"), (uint32_t)m->heads);
    kv_u32(w, K("attention.head_count_kv"), (uint32_t)m->kv);
    kv_f32(w, K("rope.freq_base"), m->theta);
    kv_f32(w, K("attention.layer_norm_rms_epsilon"), 1e-5f);
    kv_u32(w, K("rope.dimension_count"), (uint32_t)m->hd);
    kv_u32(w, "general.alignment", 32);
    /* a vocabulary as llama.cpp writes one */
    char **toks = malloc(sizeof(char *) * m->vocab);
    float *scores = malloc(sizeof(float) * m->vocab);
    int32_t *types = malloc(sizeof(int32_t) * m->vocab);
    for (int i = 0; i < m->vocab; i++) {
        toks[i] = malloc(16);
        snprintf(toks[i], 16, "tok%d", i);
        scores[i] = -(float)i;
        types[i] = 1;
    }
    kv_str(w, "tokenizer.ggml.model", "llama");
    kv_strs(w, "tokenizer.ggml.tokens", m->vocab, toks);
    kv_arr(w, "tokenizer.ggml.scores", GGUF_F32, (uint64_t)m->vocab, scores, sizeof(float) * m->vocab);
    kv_arr(w, "tokenizer.ggml.token_type", GGUF_I32, (uint64_t)m->vocab, types, sizeof(int32_t) * m->vocab);
    kv_u32(w, "tokenizer.ggml.bos_token_id", 1);
    kv_bool(w, "tokenizer.ggml.add_bos_token", 1);
    kv_str(w, "tokenizer.chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}");
    for (int i = 0; i < m->vocab; i++) free(toks[i]);
    free(toks), free(scores), free(types);
    int Q = m->heads * m->hd, KV = m->kv * m->hd, perm = !strcmp(m->arch, "llama");
    /* every stored type, spread over the tensors */
    static const uint32_t mats[] = {GGML_Q4_1, GGML_Q4_0, GGML_F16, GGML_BF16, GGML_Q4_1, GGML_Q8_0, GGML_F32};
    tiny_tensor(w, "token_embd.weight", NAME_EMBED, GGML_Q8_0, m->vocab, m->dim, 0, 0, 1, 0);
    for (int l = 0; l < m->layers; l++) {
        static const struct {
            const char *gg, *hf;
            char r, c;
        } L[] = {{"attn_q.weight", "self_attn.q_proj.weight", 'Q', 'D'},
                 {"attn_k.weight", "self_attn.k_proj.weight", 'K', 'D'},
                 {"attn_v.weight", "self_attn.v_proj.weight", 'K', 'D'},
                 {"attn_output.weight", "self_attn.o_proj.weight", 'D', 'Q'},
                 {"ffn_gate.weight", "mlp.gate_proj.weight", 'H', 'D'},
                 {"ffn_up.weight", "mlp.up_proj.weight", 'H', 'D'},
                 {"ffn_down.weight", "mlp.down_proj.weight", 'D', 'H'}};
        for (int k = 0; k < 7; k++) {
            int64_t r = L[k].r == 'Q' ? Q : L[k].r == 'K' ? KV : L[k].r == 'H' ? m->hidden : m->dim;
            int64_t c = L[k].c == 'Q' ? Q : L[k].c == 'H' ? m->hidden : m->dim;
            snprintf(gg, sizeof gg, "blk.%d.%s", l, L[k].gg);
            layer_tensor_name(hf, sizeof hf, l, L[k].hf);
            int heads = k == 0 ? m->heads : k == 1 ? m->kv : 0;
            tiny_tensor(w, gg, hf, mats[(k + l) % 7], r, c, heads, m->hd, 0.5f, perm);
        }
        snprintf(gg, sizeof gg, "blk.%d.attn_norm.weight", l);
        layer_tensor_name(hf, sizeof hf, l, "input_layernorm.weight");
        tiny_tensor(w, gg, hf, GGML_F32, 0, m->dim, 0, 0, 0.1f, 0);
        snprintf(gg, sizeof gg, "blk.%d.ffn_norm.weight", l);
        layer_tensor_name(hf, sizeof hf, l, "post_attention_layernorm.weight");
        tiny_tensor(w, gg, hf, GGML_F32, 0, m->dim, 0, 0, 0.1f, 0);
        if (m->bias) {
            static const char *const bn[3][2] = {{"attn_q.bias", "self_attn.q_proj.bias"},
                                                 {"attn_k.bias", "self_attn.k_proj.bias"},
                                                 {"attn_v.bias", "self_attn.v_proj.bias"}};
            for (int k = 0; k < 3; k++) {
                snprintf(gg, sizeof gg, "blk.%d.%s", l, bn[k][0]);
                layer_tensor_name(hf, sizeof hf, l, bn[k][1]);
                tiny_tensor(w, gg, hf, GGML_F32, 0, k ? KV : Q,
                            k == 0   ? m->heads
                            : k == 1 ? m->kv
                                     : 0,
                            m->hd, 0.3f, perm);
            }
        }
    }
    tiny_tensor(w, "output_norm.weight", NAME_NORM, GGML_F32, 0, m->dim, 0, 0, 0.1f, 0);
    if (!m->tied) tiny_tensor(w, "output.weight", NAME_LM_HEAD, GGML_Q4_1, m->vocab, m->dim, 0, 0, 1, 0);
    if (m->rope_llama3) {
        float *f = malloc(sizeof(float) * m->hd / 2);
        for (int j = 0; j < m->hd / 2; j++) f[j] = (float)llama3_divisor(m->theta, m->hd, j, 8, 1, 4, 8192);
        add_tensor(w, "rope_freqs.weight", GGML_F32, 0, m->hd / 2, f);
        free(f);
    }
#undef K
    return finish(w);
}

/* ---------------- checks ---------------- */

static void test_f16(void) {
    static const struct {
        uint16_t h;
        float v;
    } known[] = {{0x3c00, 1.0f},          {0xc000, -2.0f},         {0x7bff, 65504.0f},    {0x0001, 5.9604645e-8f},
                 {0x03ff, 6.0975552e-5f}, {0x0400, 6.1035156e-5f}, {0x3555, 0.33325195f}, {0x0000, 0.0f}};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        CHECK(gguf_f16_to_f32(known[i].h) == known[i].v, "f16 %04x → %g, want %g", known[i].h,
              gguf_f16_to_f32(known[i].h), known[i].v);
    CHECK(isinf(gguf_f16_to_f32(0x7c00)) && gguf_f16_to_f32(0x7c00) > 0, "f16 +inf");
    CHECK(isinf(gguf_f16_to_f32(0xfc00)) && gguf_f16_to_f32(0xfc00) < 0, "f16 -inf");
    CHECK(isnan(gguf_f16_to_f32(0x7e00)) && isnan(gguf_f16_to_f32(0xfc01)), "f16 NaN");
    CHECK(signbit(gguf_f16_to_f32(0x8000)) && gguf_f16_to_f32(0x8000) == 0, "f16 -0");
    int bad = 0, bad_hw = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float a = gguf_f16_to_f32((uint16_t)h), b = half_value((uint16_t)h);
        if (!(a == b || (isnan(a) && isnan(b))) || signbit(a) != signbit(b)) bad++;
#ifdef __F16C__
        float c = _cvtsh_ss((unsigned short)h);
        uint32_t ua, uc;
        memcpy(&ua, &a, 4), memcpy(&uc, &c, 4);
        if (ua != uc) bad_hw++; /* bit for bit, NaN payloads included */
#endif
    }
    CHECK(bad == 0, "%d halves differ from the definition", bad);
    CHECK(bad_hw == 0, "%d halves differ from F16C's _cvtsh_ss", bad_hw);
}

/* blocks with hand-chosen scales and nibbles, values by the formula */
static void test_blocks(void) {
    Writer w = {0};
    uint8_t q8[34], q40[18], q41[20];
    put16(q8, 0x3800); /* d = 0.5 */
    for (int j = 0; j < 32; j++) q8[2 + j] = (uint8_t)(int8_t)(j * 8 - 128);
    put16(q40, 0xb400); /* d = -0.25 */
    for (int j = 0; j < 16; j++) q40[2 + j] = (uint8_t)(j | (15 - j) << 4);
    put16(q41, 0x4000);     /* d = 2 */
    put16(q41 + 2, 0xbc00); /* m = -1 */
    for (int j = 0; j < 16; j++) q41[4 + j] = (uint8_t)((j * 7) % 16 | ((j * 3) % 16) << 4);
    WTensor *t = &w.t[w.n_t++];
    *t = (WTensor){"q8", 1, {32, 1}, GGML_Q8_0, {0}};
    put(&t->data, q8, 34);
    t = &w.t[w.n_t++];
    *t = (WTensor){"q40", 1, {32, 1}, GGML_Q4_0, {0}};
    put(&t->data, q40, 18);
    t = &w.t[w.n_t++];
    *t = (WTensor){"q41", 2, {32, 2}, GGML_Q4_1, {0}};
    put(&t->data, q41, 20);
    q41[1] ^= 0x80; /* second row: d = -2 */
    put(&t->data, q41, 20);
    Buf b = finish(&w);
    Gguf g;
    CHECK(gguf_parse(&g, b.p, b.n, "blocks") == 0, "%s", pd_errmsg());
    float y[64];
    int bad = 0;
    gguf_tensor_f32(&g, gguf_tensor(&g, "q8"), y);
    for (int j = 0; j < 32; j++) bad += y[j] != 0.5f * (j * 8 - 128);
    gguf_tensor_f32(&g, gguf_tensor(&g, "q40"), y);
    for (int j = 0; j < 16; j++) bad += y[j] != -0.25f * (j - 8) || y[16 + j] != -0.25f * (15 - j - 8);
    gguf_tensor_f32(&g, gguf_tensor(&g, "q41"), y);
    for (int j = 0; j < 16; j++)
        bad += y[j] != 2.0f * ((j * 7) % 16) - 1 || y[16 + j] != 2.0f * ((j * 3) % 16) - 1 ||
               y[32 + j] != -2.0f * ((j * 7) % 16) - 1 || y[48 + j] != -2.0f * ((j * 3) % 16) - 1;
    CHECK(bad == 0, "%d hand-made block values wrong", bad);
    gguf_close(&g);
    free(b.p);
    writer_free(&w);
}

static const char *check_tiny(const Tiny *m, const char *what) {
    Writer w;
    Buf b = tiny_model(m, &w);
    Checkpoint ck;
    int rc = gguf_read_model_mem(&ck, b.p, b.n, what);
    CHECK(rc == 0, "%s: %s", what, pd_errmsg());
    if (rc) return NULL;
    const Config *c = &ck.c;
    CHECK(c->dim == m->dim && c->hidden_dim == m->hidden && c->n_layers == m->layers && c->n_heads == m->heads &&
              c->n_kv_heads == m->kv && c->head_dim == m->hd && c->vocab_size == m->vocab && c->seq_len == m->ctx &&
              c->tied == m->tied && c->qkv_bias == m->bias && c->rope_theta == m->theta && c->norm_eps == 1e-5f,
          "%s: config", what);
    CHECK(ck.n == N_EXP, "%s: %d tensors, want %d", what, ck.n, N_EXP);
    double worst_step = 0;
    int bad = 0;
    for (int i = 0; i < N_EXP; i++) {
        Expect *e = &EXP[i];
        CkTensor *t = ck_get(&ck, e->hf);
        if (!t) {
            CHECK(0, "%s: %s missing", what, e->hf);
            continue;
        }
        const WTensor *wt = &w.t[e->wt];
        size_t n = (size_t)e->cols * (e->rows ? e->rows : 1);
        /* block matrices stay raw (their values checked below, dequantized); the rest f32 */
        int block = wt->type == GGML_Q8_0 || wt->type == GGML_Q4_0 || wt->type == GGML_Q4_1;
        CHECK((t->raw != NULL) == (block && e->rows) && (!t->raw || t->nraw == wt->data.n), "%s: %s kept %s", what,
              e->hf, t->raw ? "raw" : "f32");
        CHECK(ck_dequant(t) == 0 && t->data, "%s: %s dequantized", what, e->hf);
        CHECK(t->shape[0] == (e->rows ? e->rows : e->cols) && t->shape[1] == (e->rows ? e->cols : 1), "%s: %s shape",
              what, e->hf);
        float *want = malloc(sizeof(float) * n);
        decode_tensor(wt, want);
        /* the file holds Meta rows: the reader must give HF's back, i.e. our permute undone */
        if (e->heads) {
            float *hf = malloc(sizeof(float) * n);
            int hd = m->hd, cols = e->rows ? (int)e->cols : 1;
            for (int h = 0; h < e->heads; h++)
                for (int r = 0; r < hd; r++) /* HF row r = c*hd/2+i came from Meta row 2i+c */
                    memcpy(hf + ((size_t)h * hd + r) * cols,
                           want + ((size_t)h * hd + 2 * (r % (hd / 2)) + r / (hd / 2)) * cols, sizeof(float) * cols);
            memcpy(want, hf, sizeof(float) * n);
            free(hf);
        }
        float lo = e->orig[0], hi = e->orig[0];
        for (size_t j = 0; j < n; j++) lo = fminf(lo, e->orig[j]), hi = fmaxf(hi, e->orig[j]);
        for (size_t j = 0; j < n; j++) {
            if (fabsf(t->data[j] - want[j]) > 1e-6f * (1 + fabsf(want[j]))) bad++;
            if (wt->type == GGML_F32 && t->data[j] != e->orig[j]) bad++;
            /* and close to the original: half a step of the type (a whole one where Q4_0's
               -8..7 clips), a little slack for the f16 scales */
            double x = fabs(e->orig[j]), allowed = wt->type == GGML_F16    ? x / 2048 + 1e-7
                                                   : wt->type == GGML_BF16 ? x / 256
                                                   : wt->type == GGML_Q8_0 ? (hi - lo) / 254
                                                   : wt->type == GGML_F32  ? 1
                                                   : wt->type == GGML_Q4_0
                                                       ? (hi - lo) / 16 /* -8..7: the far end clips a step */
                                                       : (hi - lo) / 30;
            double step = fabs(t->data[j] - e->orig[j]) / allowed;
            if (step > worst_step) worst_step = step;
        }
        free(want);
    }
    CHECK(bad == 0, "%s: %d values differ from the test's own decoding", what, bad);
    CHECK(worst_step <= 1.05, "%s: worst error %.3g half-steps of quantisation", what, worst_step);
    CHECK(!strcmp(ck.tok_kind, "gguf") && ck.tok, "%s: tokenizer kind '%s'", what, ck.tok_kind);
    CHECK(ck.chat_template && !strcmp(ck.chat_template, "{% for m in messages %}{{ m.content }}{% endfor %}"),
          "%s: chat template", what);
    /* the vocabulary-only GGUF: the tokenizer keys and the architecture, nothing else */
    Gguf v;
    CHECK(gguf_parse(&v, ck.tok, ck.tok_len, "vocab") == 0, "%s: vocab GGUF: %s", what, pd_errmsg());
    GgufStr s;
    int64_t bos;
    int add_bos = 0;
    CHECK(v.n_tensors == 0 && v.n_kv == 8, "%s: vocab GGUF has %d tensors, %d keys", what, v.n_tensors, v.n_kv);
    CHECK(gguf_get_str(&v, "general.architecture", &s) == 0 && s.len == strlen(m->arch), "%s: vocab arch", what);
    CHECK(gguf_get_str(&v, "tokenizer.ggml.model", &s) == 0 && s.len == 5 && !memcmp(s.s, "llama", 5), "vocab model");
    const GgufKV *tk = gguf_find(&v, "tokenizer.ggml.tokens"), *sc = gguf_find(&v, "tokenizer.ggml.scores");
    CHECK(tk && tk->n == (uint64_t)m->vocab && tk->strs[7].len == 4 && !memcmp(tk->strs[7].s, "tok7", 4),
          "vocab tokens");
    float s9 = 0;
    if (sc) memcpy(&s9, (const char *)sc->data + 36, 4);
    CHECK(sc && sc->elem == GGUF_F32 && s9 == -9.0f, "vocab scores");
    CHECK(gguf_get_int(&v, "tokenizer.ggml.bos_token_id", &bos) == 0 && bos == 1, "vocab bos");
    CHECK(gguf_get_bool(&v, "tokenizer.ggml.add_bos_token", &add_bos) == 0 && add_bos == 1, "vocab add_bos");
    CHECK(!gguf_find(&v, "general.name") && !gguf_find(&v, "llama.block_count"), "vocab: other keys left out");
    gguf_close(&v);
    static char cfg[512];
    snprintf(cfg, sizeof cfg, "%g %g %g %d", c->rope_factor, c->rope_low_freq, c->rope_high_freq, c->rope_orig_ctx);
    if (m->rope_llama3) { /* the frequencies model.c will compute are llama.cpp's */
        double worst = 0;
        for (int j = 0; j < m->hd / 2; j++) {
            double want = llama3_divisor(m->theta, m->hd, j, 8, 1, 4, 8192);
            double got = llama3_divisor(m->theta, m->hd, j, c->rope_factor, c->rope_low_freq, c->rope_high_freq,
                                        c->rope_orig_ctx);
            worst = fmax(worst, fabs(got - want) / want);
        }
        CHECK(c->rope_factor == 8 && worst < 1e-5, "%s: RoPE divisors off by %g (%s)", what, worst, cfg);
    } else CHECK(c->rope_factor == 0, "%s: no RoPE scaling", what);
    ck_free(&ck);
    free(b.p);
    exp_free();
    writer_free(&w);
    return cfg;
}

static const Tiny LLAMA = {"llama", 64, 128, 2, 4, 2, 16, 96, 128, 0, 0, 10000, 0};

/* every truncation and random byte mutations: a clean refusal or a clean parse */
static void test_fuzz(void) {
    Tiny m = LLAMA;
    m.layers = 1;
    Writer w;
    Buf b = tiny_model(&m, &w);
    for (size_t n = 0; n < b.n; n++) { /* cuts in the data: must not crash */
        Gguf g;
        if (gguf_parse(&g, b.p, n, "cut") == 0) gguf_close(&g);
    }
    Gguf g;
    CHECK(gguf_parse(&g, b.p, b.n, "whole") == 0, "%s", pd_errmsg());
    size_t data_end = g.n_tensors ? (size_t)((const uint8_t *)g.t[0].data - b.p) : b.n;
    gguf_close(&g);
    /* cut before the data starts: never a parse */
    int early = 0;
    for (size_t n = 0; n < data_end; n++)
        if (gguf_parse(&g, b.p, n, "cut") == 0) early++, gguf_close(&g);
    CHECK(early == 0, "%d cuts inside the metadata parsed", early);
    uint8_t *x = malloc(b.n);
    int ok = 0;
    for (int round = 0; round < 3000; round++) {
        memcpy(x, b.p, b.n);
        int flips = 1 + (int)(rnd32() % 4);
        for (int k = 0; k < flips; k++) {
            size_t at = rnd32() % (round % 2 ? data_end : b.n);
            x[at] = rnd32() % 3 == 0 ? 0xff : (uint8_t)rnd32();
        }
        if (gguf_parse(&g, x, b.n, "mutant") == 0) {
            ok++;
            float *buf = NULL;
            for (int i = 0; i < g.n_tensors; i++) {
                size_t ne = (size_t)g.t[i].dims[0] * g.t[i].dims[1] * g.t[i].dims[2] * g.t[i].dims[3];
                if (ne > (1 << 22)) continue;
                buf = realloc(buf, sizeof(float) * (ne + 1));
                gguf_tensor_f32(&g, &g.t[i], buf);
            }
            free(buf);
            gguf_close(&g);
            Checkpoint ck;
            if (gguf_read_model_mem(&ck, x, b.n, "mutant") == 0) ck_free(&ck);
        }
    }
    printf("fuzz: %zu truncations, 3000 mutants (%d still parse)\n", b.n, ok);
    free(x);
    free(b.p);
    exp_free();
    writer_free(&w);
}

/* a GGUF that must be refused with a message containing `want` */
static void refused(Buf b, const char *want, const char *what) {
    Checkpoint ck;
    int rc = gguf_read_model_mem(&ck, b.p, b.n, what);
    CHECK(rc != 0 && strstr(pd_errmsg(), want) && strstr(pd_errmsg(), what) && !strchr(pd_errmsg(), '\n'),
          "%s: want an error with '%s', got %s", what, want, rc ? pd_errmsg() : "success");
    if (!rc) ck_free(&ck);
    free(b.p);
}

static void test_bad(void) {
    Writer w;
    Buf b = tiny_model(&LLAMA, &w);
    Buf c = {malloc(b.n), b.n, b.n};
    memcpy(c.p, b.p, b.n);
    c.p[0] = 'X';
    refused(c, "not a GGUF file", "bad magic");
    c = (Buf){malloc(b.n), b.n, b.n}, memcpy(c.p, b.p, b.n), c.p[4] = 1;
    refused(c, "version 1", "version 1");
    c = (Buf){malloc(b.n), b.n, b.n}, memcpy(c.p, b.p, b.n), memcpy(c.p + 4, "\0\0\0\3", 4);
    refused(c, "big-endian", "big endian");
    c = (Buf){malloc(b.n), b.n, b.n}, memcpy(c.p, b.p, b.n), memset(c.p + 16, 0x7f, 8);
    refused(c, "more than the file can hold", "huge key count");
    c = (Buf){malloc(b.n - 100), b.n - 100, b.n - 100}, memcpy(c.p, b.p, b.n - 100);
    refused(c, "truncated: tensor", "truncated data");
    free(b.p);
    writer_free(&w);

    /* a type paradec does not read (Q5_1, IQ2_XXS): named, with the tensor */
    memset(&w, 0, sizeof w);
    kv_str(&w, "general.architecture", "llama");
    WTensor *t = &w.t[w.n_t++];
    *t = (WTensor){"blk.0.ffn_down.weight", 2, {32, 2}, 7, {0}};
    put(&t->data, "x", 1);
    refused(finish(&w), "tensor 'blk.0.ffn_down.weight' has ggml type 7 (Q5_1)", "q5_1");
    writer_free(&w);
    kv_str(&w, "general.architecture", "llama");
    t = &w.t[w.n_t++];
    *t = (WTensor){"blk.3.attn_q.weight", 2, {256, 2}, 16, {0}};
    put(&t->data, "x", 1);
    refused(finish(&w), "tensor 'blk.3.attn_q.weight' has ggml type 16 (IQ2_XXS)", "iq2_xxs");
    writer_free(&w);
    /* a K type whose rows are not whole super-blocks, and one short of its blocks */
    kv_str(&w, "general.architecture", "llama");
    t = &w.t[w.n_t++];
    *t = (WTensor){"x", 2, {128, 2}, GGML_Q4_K, {0}};
    put(&t->data, "abcd", 4);
    refused(finish(&w), "row length 128 is not a multiple of its type's block of 256", "q4_k partial block");
    writer_free(&w);
    kv_str(&w, "general.architecture", "llama");
    t = &w.t[w.n_t++];
    *t = (WTensor){"x", 2, {256, 2}, GGML_Q6_K, {0}};
    put(&t->data, "abcd", 4); /* 420 bytes needed */
    refused(finish(&w), "truncated: tensor 'x' (420 bytes", "q6_k truncated");
    writer_free(&w);
    /* a tensor whose data runs past the end */
    kv_str(&w, "general.architecture", "llama");
    t = &w.t[w.n_t++];
    *t = (WTensor){"x", 1, {64, 1}, GGML_F32, {0}};
    put(&t->data, "abcd", 4);
    refused(finish(&w), "ends past the file's end", "short tensor");
    writer_free(&w);
    /* duplicate keys; a string running past the end */
    kv_u32(&w, "a.b", 1), kv_u32(&w, "a.b", 2);
    refused(finish(&w), "key 'a.b' appears twice", "dup key");
    writer_free(&w);
    kv_str(&w, "general.architecture", "llama");
    Buf d = finish(&w);
    memset(d.p + 24, 0x7f, 6); /* the key's length */
    refused(d, "runs past the end", "long string");
    writer_free(&w);
    /* a row length that is not a whole number of blocks */
    kv_str(&w, "general.architecture", "llama");
    t = &w.t[w.n_t++];
    *t = (WTensor){"x", 1, {48, 1}, GGML_Q8_0, {0}};
    put(&t->data, "abcd", 4);
    refused(finish(&w), "not a multiple of its type's block of 32", "partial block");
    writer_free(&w);
    /* misaligned data: an alignment of 64 the offsets (multiples of 32) do not keep */
    kv_str(&w, "general.architecture", "llama");
    kv_u32(&w, "general.alignment", 64);
    for (int i = 0; i < 2; i++) {
        t = &w.t[w.n_t++];
        *t = (WTensor){"", 1, {8, 1}, GGML_F32, {0}};
        snprintf(t->name, sizeof t->name, "t%d", i);
        put(&t->data, "0123456789abcdef0123456789abcdef", 32);
    }
    refused(finish(&w), "not a multiple of the alignment 64", "misaligned");
    writer_free(&w);

    /* model-level refusals: architecture, unknown tensor, experts, shapes, RoPE scaling */
    Tiny m = LLAMA;
    m.arch = "gpt2";
    refused(tiny_model(&m, &w), "architecture 'gpt2' is not supported", "arch");
    writer_free(&w);
    b = tiny_model(&LLAMA, &w);
    free(b.p);
    float z[64] = {0};
    add_tensor(&w, "blk.0.attn_q_norm.weight", GGML_F32, 0, 64, z);
    refused(finish(&w), "tensor 'blk.0.attn_q_norm.weight' is not part of a model", "extra tensor");
    writer_free(&w);
    b = tiny_model(&LLAMA, &w);
    free(b.p);
    kv_u32(&w, "llama.expert_count", 8);
    refused(finish(&w), "mixture of experts", "moe");
    writer_free(&w);
    b = tiny_model(&LLAMA, &w);
    free(b.p);
    kv_str(&w, "llama.rope.scaling.type", "yarn");
    kv_f32(&w, "llama.rope.scaling.factor", 4);
    refused(finish(&w), "RoPE scaling 'yarn' is not supported", "yarn");
    writer_free(&w);
    m = LLAMA;
    m.theta = 500000, m.rope_llama3 = 1;
    b = tiny_model(&m, &w);
    free(b.p);
    float *rf = (float *)w.t[w.n_t - 1].data.p; /* rope_freqs.weight */
    rf[1] = 3;                                  /* a bump no llama3 parameters give */
    refused(finish(&w), "not Llama 3 RoPE scaling", "rope_freqs bump");
    rf[1] = 1, rf[0] = 0.5f;
    refused(finish(&w), "speeds up some frequencies", "rope_freqs below 1");
    writer_free(&w);
    b = tiny_model(&LLAMA, &w);
    free(b.p);
    w.t[3].dims[1] = 16; /* blk.0.attn_v: 32 rows → 16 */
    w.t[3].data.n /= 2;
    refused(finish(&w), "tensor 'blk.0.attn_v.weight' has shape [16, 64] (rows first) but the config needs [32, 64]",
            "shape");
    writer_free(&w);
    exp_free();
}

/* a file from another writer (gguf-py): every key type, every tensor type, its own
   dequantisation as the expected values */
static void test_pyw(void) {
    Gguf g;
    if (gguf_parse(&g, PYW_GGUF, sizeof PYW_GGUF, "gguf-py") != 0) {
        CHECK(0, "gguf-py file: %s", pd_errmsg());
        return;
    }
    static const struct {
        const char *k;
        int64_t v;
    } ints[] = {{"k.u8", 200},         {"k.i8", -100},         {"k.u16", 60000},     {"k.i16", -30000},
                {"k.u32", 4000000000}, {"k.i32", -2000000000}, {"k.u64", 1ll << 40}, {"k.i64", -(1ll << 40)}};
    for (int i = 0; i < 8; i++) {
        int64_t v = 0;
        CHECK(gguf_get_int(&g, ints[i].k, &v) == 0 && v == ints[i].v, "gguf-py %s = %lld", ints[i].k, (long long)v);
    }
    float f = 0, d = 0;
    int b = 0;
    GgufStr s = {0};
    CHECK(gguf_get_f32(&g, "k.f32", &f) == 0 && f == 1.5f, "gguf-py k.f32");
    CHECK(gguf_get_f32(&g, "k.f64", &d) == 0 && d == 2.25f, "gguf-py k.f64");
    CHECK(gguf_get_bool(&g, "k.bool", &b) == 0 && b == 1, "gguf-py k.bool");
    CHECK(gguf_get_str(&g, "k.str", &s) == 0 && s.len == 6 && !memcmp(s.s, "h\xc3\xa9llo", 6), "gguf-py k.str");
    CHECK(gguf_get_int(&g, "k.str", &(int64_t){0}) != 0 && gguf_get_str(&g, "k.u8", &s) != 0, "gguf-py: types checked");
    const GgufKV *a = gguf_find(&g, "k.arr"), *sa = gguf_find(&g, "k.sarr");
    int32_t third = 0;
    if (a && a->n == 3) memcpy(&third, (const char *)a->data + 8, 4); /* values are unaligned in the file */
    CHECK(a && a->type == GGUF_ARRAY && a->elem == GGUF_I32 && a->n == 3 && third == 3, "gguf-py k.arr");
    CHECK(sa && sa->elem == GGUF_STRING && sa->n == 3 && sa->strs[1].len == 2 && !memcmp(sa->strs[1].s, "bc", 2) &&
              sa->strs[2].len == 0,
          "gguf-py k.sarr");
    static const char *const names[] = {"f32", "f16", "bf16", "q8", "q40", "q41"};
    static const uint32_t types[] = {GGML_F32, GGML_F16, GGML_BF16, GGML_Q8_0, GGML_Q4_0, GGML_Q4_1};
    int bad = 0;
    for (int i = 0; i < 6; i++) {
        const GgufTensor *t = gguf_tensor(&g, names[i]);
        float y[32];
        CHECK(t && t->type == types[i] && t->n_dims == 2 && t->dims[0] == 32 && t->dims[1] == 1, "gguf-py %s",
              names[i]);
        if (!t || gguf_tensor_f32(&g, t, y)) continue;
        for (int j = 0; j < 32; j++) bad += y[j] != PYW_WANT[32 * i + j];
    }
    CHECK(bad == 0, "gguf-py: %d values differ from gguf.quants.dequantize", bad);
    gguf_close(&g);
}

/* llama.cpp's own vocab-only files (tests/ of llama.cpp; tokens 32000 and 50257) */
static void test_vocab_files(void) {
    static const struct {
        const char *file, *model;
        uint64_t n_tokens;
    } F[] = {{"tokenizers/ggml-vocab/ggml-vocab-llama-spm.gguf", "llama", 32000},
             {"tokenizers/ggml-vocab/ggml-vocab-gpt-2.gguf", "gpt2", 50257}};
    for (int i = 0; i < 2; i++) {
        const char *path = test_data("llama.cpp's vocab-only file", F[i].file);
        if (!path) continue;
        Gguf g;
        if (gguf_open(&g, path)) {
            /* the shared copies went through a text conversion that replaced bytes
               that are not UTF-8 by U+FFFD: then a clean, one-line refusal */
            char *bytes;
            size_t n, damaged = 0;
            if (pd_read_file(path, &bytes, &n) == 0) {
                for (size_t k = 0; k + 2 < n; k++) damaged += !memcmp(bytes + k, "\xef\xbf\xbd", 3);
                free(bytes);
            }
            CHECK(damaged > 0, "%s does not parse: %s", path, pd_errmsg());
            CHECK(strstr(pd_errmsg(), path) && !strchr(pd_errmsg(), '\n'), "one line naming the file: %s", pd_errmsg());
            printf("NOTE: %s is damaged (%zu U+FFFD replacement sequences): refused: %s\n", path, damaged, pd_errmsg());
            continue;
        }
        GgufStr s;
        const GgufKV *t = gguf_find(&g, "tokenizer.ggml.tokens");
        CHECK(gguf_get_str(&g, "tokenizer.ggml.model", &s) == 0 && s.len == strlen(F[i].model) &&
                  !memcmp(s.s, F[i].model, s.len),
              "%s: tokenizer.ggml.model", path);
        CHECK(t && t->elem == GGUF_STRING && t->n == F[i].n_tokens, "%s: %llu tokens", path,
              t ? (unsigned long long)t->n : 0ull);
        CHECK(g.n_tensors == 0 && g.n_kv > 10, "%s: %d tensors, %d keys", path, g.n_tensors, g.n_kv);
        unsigned char *v;
        size_t vn;
        Gguf g2;
        CHECK(gguf_write_vocab(&g, &v, &vn) == 0 && gguf_parse(&g2, v, vn, "vocab") == 0, "%s: vocab copy", path);
        const GgufKV *t2 = gguf_find(&g2, "tokenizer.ggml.tokens");
        CHECK(t2 && t2->n == t->n && t2->strs[100].len == t->strs[100].len, "%s: vocab copy tokens", path);
        gguf_close(&g2);
        free(v);
        gguf_close(&g);
    }
}

/* ---------------- fixtures for the tool test ---------------- */

static int write_file(const char *path, const Buf *b) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b->p, 1, b->n, f) != b->n) return 1;
    return fclose(f) != 0;
}

/* a paradec model as llama.cpp would write it: llama keys, Meta q/k rows, F32 or F16 */
static int write_gguf_of(const char *model, const char *out, const char *type) {
    Checkpoint ck;
    if (ck_read_model(&ck, model)) {
        fprintf(stderr, "%s\n", pd_errmsg());
        return 1;
    }
    const Config *c = &ck.c;
    Writer w = {0};
    uint32_t mt = type && !strcmp(type, "f16") ? GGML_F16 : GGML_F32;
    kv_str(&w, "general.architecture", "llama");
    kv_u32(&w, "llama.block_count", (uint32_t)c->n_layers);
    kv_u32(&w, "llama.context_length", (uint32_t)c->seq_len);
    kv_u32(&w, "llama.embedding_length", (uint32_t)c->dim);
    kv_u32(&w, "llama.feed_forward_length", (uint32_t)c->hidden_dim);
    kv_u32(&w, "llama.attention.head_count", (uint32_t)c->n_heads);
    kv_u32(&w, "llama.attention.head_count_kv", (uint32_t)c->n_kv_heads);
    kv_f32(&w, "llama.rope.freq_base", c->rope_theta);
    kv_f32(&w, "llama.attention.layer_norm_rms_epsilon", c->norm_eps);
    static const char *const L[][2] = {
        {"attn_norm.weight", "input_layernorm.weight"},    {"attn_q.weight", "self_attn.q_proj.weight"},
        {"attn_k.weight", "self_attn.k_proj.weight"},      {"attn_v.weight", "self_attn.v_proj.weight"},
        {"attn_output.weight", "self_attn.o_proj.weight"}, {"ffn_norm.weight", "post_attention_layernorm.weight"},
        {"ffn_gate.weight", "mlp.gate_proj.weight"},       {"ffn_up.weight", "mlp.up_proj.weight"},
        {"ffn_down.weight", "mlp.down_proj.weight"}};
    char gg[96], hf[96];
    for (int l = 0; l < c->n_layers; l++)
        for (int k = 0; k < 9; k++) {
            snprintf(gg, sizeof gg, "blk.%d.%s", l, L[k][0]);
            layer_tensor_name(hf, sizeof hf, l, L[k][1]);
            CkTensor *t = ck_get(&ck, hf);
            int vec = t->ndim == 1;
            if (k == 1 || k == 2)
                meta_permute(t->data, k == 1 ? c->n_heads : c->n_kv_heads, c->head_dim, (int)t->shape[1]);
            add_tensor(&w, gg, vec ? GGML_F32 : mt, vec ? 0 : t->shape[0], vec ? t->shape[0] : t->shape[1], t->data);
        }
    CkTensor *e = ck_get(&ck, NAME_EMBED), *n = ck_get(&ck, NAME_NORM), *o = ck_get(&ck, NAME_LM_HEAD);
    add_tensor(&w, "token_embd.weight", mt, e->shape[0], e->shape[1], e->data);
    add_tensor(&w, "output_norm.weight", GGML_F32, 0, n->shape[0], n->data);
    if (o && !c->tied) add_tensor(&w, "output.weight", mt, o->shape[0], o->shape[1], o->data);
    Buf b = finish(&w);
    int rc = write_file(out, &b);
    free(b.p);
    writer_free(&w);
    ck_free(&ck);
    return rc;
}

int main(int argc, char **argv) {
    if (argc >= 4 && !strcmp(argv[1], "--write-gguf"))
        return write_gguf_of(argv[2], argv[3], argc > 4 ? argv[4] : NULL);
    if (argc == 3 && !strcmp(argv[1], "--write-tiny")) {
        Writer w;
        Buf b = tiny_model(&LLAMA, &w);
        int rc = write_file(argv[2], &b);
        free(b.p);
        writer_free(&w);
        return rc;
    }
    test_f16();
    test_blocks();
    test_pyw();
    check_tiny(&LLAMA, "tiny llama");
    Tiny m = LLAMA;
    m.tied = 1, m.kv = 4;
    check_tiny(&m, "tiny llama tied, no GQA");
    m = LLAMA;
    m.arch = "qwen2", m.bias = 1;
    check_tiny(&m, "tiny qwen2 with biases");
    m = LLAMA;
    m.theta = 500000, m.rope_llama3 = 1;
    printf("llama3 RoPE, head_dim 16: factor, low, high, orig = %s\n", check_tiny(&m, "llama3 rope hd16"));
    m.dim = 128, m.heads = 1, m.kv = 1, m.hd = 128;
    printf("llama3 RoPE, head_dim 128: factor, low, high, orig = %s\n", check_tiny(&m, "llama3 rope hd128"));
    m.hd = 64, m.heads = 2, m.kv = 1;
    printf("llama3 RoPE, head_dim 64: factor, low, high, orig = %s\n", check_tiny(&m, "llama3 rope hd64"));
    test_bad();
    test_fuzz();
    test_vocab_files();
    return check_done("gguf");
}
