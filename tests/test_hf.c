/* test_hf — Hugging Face directories: the test writes small random checkpoints in HF
   layout (config.json; one model.safetensors or shards with an index; F32, F16, BF16
   stored by the test's own conversions; GQA, tied and untied, an explicit head_dim,
   Qwen2's q/k/v biases, llama3 RoPE scaling, a Mistral sliding window, the real
   Llama 3 tokenizer.json with its 128256-token vocabulary and chat template) and
   checks that hf_read_dir gives back exactly the stored values and the config, that
   the models load and run, and that every kind of bad directory is refused with a
   message naming the problem.

   Also a fixture writer for tests/test_convert_hf.sh:
     test_hf --write-fixtures DIR     good and bad directories under DIR */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "fixture.h"
#include "import/hf.h"
#include "model/checkpoint.h"
#include "model/forward.h"

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) % 2000001) / 1e6f - 1.0f;
}

/* f32 → f16 (round to nearest even, normal range) and back, the test's own */

/* ---------------- writing an HF directory ---------------- */

typedef struct {
    const char *arch;                             /* architectures[0] */
    int dim, hidden, layers, heads, kv, head_dim; /* head_dim 0: left out of config.json */
    int vocab, ctx, tied, bias, shards;           /* shards 0: one model.safetensors */
    DType dt;
    const char *extra;     /* JSON object merged into config.json */
    const char *tokenizer; /* "bin": tok512.bin, "llama3": the Llama 3 tokenizer.json + config, NULL: none */
    float theta;           /* the rope_theta config.json gives (0: the default 10000) */
} Spec;

typedef struct {
    char name[96];
    int64_t rows, cols;
    float *want; /* what the reader must give: the stored values, decoded */
    void *stored;
    DType dt;
} WT;

static WT T[512];
static int NT;

static void wt_free(void) {
    for (int i = 0; i < NT; i++) free(T[i].want), free(T[i].stored);
    NT = 0;
}

static void add(const Spec *s, const char *name, int64_t rows, int64_t cols, float scale, float offset) {
    WT *t = &T[NT++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->rows = rows, t->cols = cols;
    size_t n = (size_t)cols * (rows ? rows : 1);
    t->dt = strstr(name, "norm") ? DT_F32 : s->dt; /* HF keeps one dtype; mixing is allowed too */
    t->want = malloc(sizeof(float) * n);
    t->stored = malloc(n * dtype_size(t->dt));
    for (size_t i = 0; i < n; i++) {
        float x = scale * frand() + offset;
        if (t->dt == DT_F16) ((uint16_t *)t->stored)[i] = to_half(x), t->want[i] = half_value(to_half(x));
        else if (t->dt == DT_BF16) ((uint16_t *)t->stored)[i] = to_bf16(x), t->want[i] = bf16_value(to_bf16(x));
        else ((float *)t->stored)[i] = x, t->want[i] = x;
    }
}

static void make_tensors(const Spec *s) {
    wt_free();
    int hd = s->head_dim ? s->head_dim : s->dim / s->heads, Q = s->heads * hd, KV = s->kv * hd;
    char name[96];
    add(s, NAME_EMBED, s->vocab, s->dim, 1, 0);
    for (int l = 0; l < s->layers; l++) {
#define L(what, r, c, sc, off) (layer_tensor_name(name, sizeof name, l, what), add(s, name, r, c, sc, off))
        L("input_layernorm.weight", 0, s->dim, 0.1f, 1);
        L("self_attn.q_proj.weight", Q, s->dim, 0.3f, 0);
        L("self_attn.k_proj.weight", KV, s->dim, 0.3f, 0);
        L("self_attn.v_proj.weight", KV, s->dim, 0.3f, 0);
        L("self_attn.o_proj.weight", s->dim, Q, 0.3f, 0);
        if (s->bias) {
            L("self_attn.q_proj.bias", 0, Q, 0.2f, 0);
            L("self_attn.k_proj.bias", 0, KV, 0.2f, 0);
            L("self_attn.v_proj.bias", 0, KV, 0.2f, 0);
        }
        L("post_attention_layernorm.weight", 0, s->dim, 0.1f, 1);
        L("mlp.gate_proj.weight", s->hidden, s->dim, 0.3f, 0);
        L("mlp.up_proj.weight", s->hidden, s->dim, 0.3f, 0);
        L("mlp.down_proj.weight", s->dim, s->hidden, 0.3f, 0);
#undef L
    }
    add(s, NAME_NORM, 0, s->dim, 0.1f, 1);
    if (!s->tied) add(s, NAME_LM_HEAD, s->vocab, s->dim, 1, 0);
}

static int copy_file(const char *from, const char *to, int gunzip) {
    char *b;
    size_t n;
    if ((gunzip ? pd_read_file_gz : pd_read_file)(from, &b, &n)) return -1;
    FILE *f = fopen(to, "wb");
    int rc = !f || fwrite(b, 1, n, f) != n;
    if (f) rc |= fclose(f) != 0;
    free(b);
    return rc ? -1 : 0;
}

static char *path_in(const char *dir, const char *file) {
    static char p[4][4096];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, file);
    return p[k];
}

static int write_config(const Spec *s, const char *dir) {
    json_t *c = json_pack("{s:[s], s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b, s:s, s:s}", "architectures",
                          s->arch, "hidden_size", s->dim, "intermediate_size", s->hidden, "num_hidden_layers",
                          s->layers, "num_attention_heads", s->heads, "num_key_value_heads", s->kv, "vocab_size",
                          s->vocab, "max_position_embeddings", s->ctx, "rms_norm_eps", 1e-5, "rope_theta", 10000.0,
                          "tie_word_embeddings", s->tied, "hidden_act", "silu", "torch_dtype",
                          s->dt == DT_F16    ? "float16"
                          : s->dt == DT_BF16 ? "bfloat16"
                                             : "float32");
    if (s->head_dim) json_object_set_new(c, "head_dim", json_integer(s->head_dim));
    json_t *x = s->extra ? json_loads(s->extra, 0, NULL) : NULL;
    if (x) json_object_update(c, x);
    int rc = json_dump_file(c, path_in(dir, "config.json"), JSON_INDENT(2));
    json_decref(x);
    json_decref(c);
    return rc;
}

/* the directory for spec s, with the tensors of make_tensors */
static int write_dir(const Spec *s, const char *dir) {
    mkdir(dir, 0755);
    if (write_config(s, dir)) return -1;
    int n_files = s->shards ? s->shards : 1;
    json_t *map = json_object();
    for (int f = 0; f < n_files; f++) {
        char file[64];
        if (s->shards) snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", f + 1, n_files);
        else snprintf(file, sizeof file, "model.safetensors");
        TfWriter *w = tfw_begin(path_in(dir, file), 0);
        if (!w) return -1;
        for (int i = f; i < NT; i += n_files) {
            int64_t shape[2] = {T[i].rows ? T[i].rows : T[i].cols, T[i].cols};
            if (tfw_add(w, T[i].name, T[i].dt, T[i].rows ? 2 : 1, shape, T[i].stored)) return -1;
            json_object_set_new(map, T[i].name, json_string(file));
        }
        if (tfw_meta(w, "format", "pt") || tfw_commit(w)) return -1;
    }
    if (s->shards) {
        json_t *idx = json_pack("{s:{s:i}, s:o}", "metadata", "total_size", 0, "weight_map", map);
        int rc = json_dump_file(idx, path_in(dir, "model.safetensors.index.json"), JSON_INDENT(2));
        json_decref(idx);
        if (rc) return -1;
    } else json_decref(map);
    char src[4096];
    if (s->tokenizer && !strcmp(s->tokenizer, "bin")) {
        if (pd_data_path("models/stories260K/tok512.bin", src, sizeof src) ||
            copy_file(src, path_in(dir, "tokenizer.bin"), 0))
            return -1;
    } else if (s->tokenizer && !strcmp(s->tokenizer, "llama3")) {
        if (pd_data_path("tokenizers/llama3/tokenizer.json.gz", src, sizeof src) ||
            copy_file(src, path_in(dir, "tokenizer.json"), 1) ||
            pd_data_path("tokenizers/llama3/tokenizer_config.json", src, sizeof src) ||
            copy_file(src, path_in(dir, "tokenizer_config.json"), 0))
            return -1;
    }
    return 0;
}

static void rm_dir(const char *dir) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) fprintf(stderr, "cannot remove %s\n", dir);
}

/* ---------------- checks ---------------- */

static char ROOT[256];

/* read back: config, every tensor as stored, the tokenizer; then load and run it */
static void check_good(const Spec *s, const char *what, int want_seq_len) {
    char dir[512];
    if (s->tokenizer && !strcmp(s->tokenizer, "llama3") &&
        (!test_data(what, "tokenizers/llama3/tokenizer.json.gz") ||
         !test_data(what, "tokenizers/llama3/tokenizer_config.json")))
        return;
    snprintf(dir, sizeof dir, "%s/%s", ROOT, what);
    make_tensors(s);
    CHECK(write_dir(s, dir) == 0, "%s: writing: %s", what, pd_errmsg());
    Checkpoint ck;
    int rc = hf_read_dir(&ck, dir);
    CHECK(rc == 0, "%s: %s", what, pd_errmsg());
    if (rc) return;
    const Config *c = &ck.c;
    int hd = s->head_dim ? s->head_dim : s->dim / s->heads;
    CHECK(c->dim == s->dim && c->hidden_dim == s->hidden && c->n_layers == s->layers && c->n_heads == s->heads &&
              c->n_kv_heads == s->kv && c->head_dim == hd && c->vocab_size == s->vocab &&
              c->seq_len == (want_seq_len ? want_seq_len : s->ctx) && c->tied == s->tied && c->qkv_bias == s->bias &&
              c->norm_eps == 1e-5f && c->rope_theta == (s->theta ? s->theta : 10000.0f),
          "%s: config (seq_len %d)", what, c->seq_len);
    if (s->extra && strstr(s->extra, "llama3"))
        CHECK(c->rope_factor == 8 && c->rope_low_freq == 1 && c->rope_high_freq == 4, "%s: llama3 RoPE scaling", what);
    else CHECK(c->rope_factor == 0, "%s: no RoPE scaling", what);
    CHECK(ck.n == NT, "%s: %d tensors, want %d", what, ck.n, NT);
    int bad = 0;
    for (int i = 0; i < NT; i++) {
        CkTensor *t = ck_get(&ck, T[i].name);
        size_t n = (size_t)T[i].cols * (T[i].rows ? T[i].rows : 1);
        if (!t || t->shape[0] * t->shape[1] != (int64_t)n) {
            bad++;
            continue;
        }
        for (size_t j = 0; j < n; j++) bad += t->data[j] != T[i].want[j]; /* bit-exact: f16/bf16 widen exactly */
    }
    CHECK(bad == 0, "%s: %d values differ from those stored", what, bad);
    if (s->tokenizer && !strcmp(s->tokenizer, "bin")) {
        CHECK(!strcmp(ck.tok_kind, "llama2c") && ck.tok_len > 0, "%s: tokenizer.bin taken", what);
        /* a model file that loads and runs */
        char out[600];
        snprintf(out, sizeof out, "%s/%s.safetensors", ROOT, what);
        CHECK(ck_write_model(&ck, out, DT_F32) == 0, "%s: write: %s", what, pd_errmsg());
        Model m;
        KVCache kv;
        if (model_load(&m, out) == 0) {
            CHECK(kv_init(&kv, &m.c, 1, 64, 16) == 0, "%s: kv", what);
            int seq = kv_seq_new(&kv), tok[8] = {1, 5, 9, 300, 7, 2, 100, 40}, pos[8], seqs[8];
            for (int i = 0; i < 8; i++) pos[i] = i, seqs[i] = seq;
            float *h = malloc(sizeof(float) * 8 * m.c.dim), *lg = malloc(sizeof(float) * 8 * m.c.vocab_size);
            Batch b = {8, tok, seqs, pos, NULL, NULL};
            Runner *r = runner_new(&m);
            int frc = !r || forward_layers(r, &kv, &b, 0, m.c.n_layers, h) || final_logits(r, h, 8, lg);
            runner_free(r);
            int finite = 1;
            for (int i = 0; i < 8 * m.c.vocab_size; i++) finite &= isfinite(lg[i]) != 0;
            CHECK(frc == 0 && finite, "%s: forward: %s", what, frc ? pd_errmsg() : "non-finite logits");
            free(h), free(lg);
            kv_free(&kv);
            model_free(&m);
        } else CHECK(0, "%s: model_load: %s", what, pd_errmsg());
    }
    if (s->tokenizer && !strcmp(s->tokenizer, "llama3")) {
        CHECK(!strcmp(ck.tok_kind, "hf-json") && ck.tok_len > 9000000, "%s: tokenizer.json taken (%s, %zu bytes)", what,
              ck.tok_kind, ck.tok_len);
        CHECK(ck.chat_template && strstr(ck.chat_template, "<|start_header_id|>"), "%s: the chat template", what);
        /* the template travels into the model file's metadata */
        char out[600];
        snprintf(out, sizeof out, "%s/%s.safetensors", ROOT, what);
        CHECK(ck_write_model(&ck, out, DT_BF16) == 0, "%s: write: %s", what, pd_errmsg());
        TensorFile tf;
        if (tf_open(&tf, out) == 0) {
            const char *t = tf_meta(&tf, "paradec.chat_template"), *k = tf_meta(&tf, "paradec.tokenizer");
            CHECK(t && !strcmp(t, ck.chat_template), "%s: paradec.chat_template", what);
            CHECK(k && !strcmp(k, "hf-json"), "%s: paradec.tokenizer", what);
            tf_close(&tf);
        } else CHECK(0, "%s: %s", what, pd_errmsg());
        /* it loads with its tokenizer, and greedy decoding runs over the 128256 logits */
        Model m;
        KVCache kv;
        if (model_load(&m, out) == 0) {
            int32_t *ids = NULL, n = 0;
            const char *text = "Hello, world! The quick brown fox";
            CHECK(tok_encode(m.tok, text, strlen(text), 1, &ids, &n) == 0 && n > 5 && ids[0] == 128000,
                  "%s: encode: %s", what, pd_errmsg());
            CHECK(kv_init(&kv, &m.c, 1, 64, 16) == 0, "%s: kv", what);
            int seq = kv_seq_new(&kv), pos = 0, ok = 1;
            float *h = malloc(sizeof(float) * m.c.dim), *lg = malloc(sizeof(float) * m.c.vocab_size);
            Runner *r = runner_new(&m);
            ok = r != NULL;
            for (int i = 0; i < n + 8 && ok && ids; i++) { /* the prompt, then 8 greedy tokens */
                int32_t tok = i < n ? ids[i] : 0;
                if (i >= n) {
                    for (int v = 1; v < m.c.vocab_size; v++) tok = lg[v] > lg[tok] ? v : tok;
                }
                Batch b = {1, &tok, &seq, &pos, NULL, NULL};
                ok = forward_layers(r, &kv, &b, 0, m.c.n_layers, h) == 0 && final_logits(r, h, 1, lg) == 0;
                for (int v = 0; v < m.c.vocab_size && ok; v++) ok = isfinite(lg[v]) != 0;
                pos++;
            }
            CHECK(ok, "%s: greedy decoding with the 128K vocabulary: %s", what, pd_errmsg());
            runner_free(r);
            free(ids), free(h), free(lg);
            kv_free(&kv);
            model_free(&m);
        } else CHECK(0, "%s: model_load: %s", what, pd_errmsg());
    }
    if (!s->tokenizer) CHECK(!ck.tok, "%s: no tokenizer", what);
    ck_free(&ck);
    rm_dir(dir);
}

static void expect_refusal(const char *dir, const char *want, const char *what) {
    Checkpoint ck;
    int rc = hf_read_dir(&ck, dir);
    CHECK(rc != 0 && strstr(pd_errmsg(), want) && !strchr(pd_errmsg(), '\n'), "%s: want '%s', got %s", what, want,
          rc ? pd_errmsg() : "success");
    if (!rc) ck_free(&ck);
}

static const Spec BASE = {"LlamaForCausalLM", 64, 96, 2, 4, 2, 0, 512, 128, 0, 0, 0, DT_F32, NULL, "bin", 0};

/* a bad directory: built from spec s, then damaged by `how` */
static int write_bad(const char *dir, const char *how) {
    Spec s = BASE;
    s.shards = !strcmp(how, "missing-shard") || !strcmp(how, "absent-tensor") ? 3 : 0;
    if (!strcmp(how, "bad-shape")) s.extra = "{\"intermediate_size\": 80}";
    if (!strcmp(how, "bad-arch")) s.arch = "GPT2LMHeadModel";
    if (!strcmp(how, "gelu")) s.extra = "{\"hidden_act\": \"gelu\"}";
    if (!strcmp(how, "mlp-bias")) s.extra = "{\"mlp_bias\": true}";
    if (!strcmp(how, "llama-attention-bias")) s.extra = "{\"attention_bias\": true}";
    if (!strcmp(how, "yarn")) s.extra = "{\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}}";
    make_tensors(&s);
    if (!strcmp(how, "bad-dtype")) T[0].dt = DT_I32; /* same bytes, another dtype */
    if (!strcmp(how, "extra-tensor")) {
        char name[96];
        layer_tensor_name(name, sizeof name, 0, "self_attn.o_proj.bias");
        add(&s, name, 0, s.dim, 0.1f, 0);
    }
    if (!strcmp(how, "missing-tensor")) { /* no lm_head */
        NT--;
        free(T[NT].want), free(T[NT].stored);
    }
    if (write_dir(&s, dir)) return -1;
    if (!strcmp(how, "missing-shard")) unlink(path_in(dir, "model-00002-of-00003.safetensors"));
    if (!strcmp(how, "no-config")) unlink(path_in(dir, "config.json"));
    if (!strcmp(how, "no-weights")) unlink(path_in(dir, "model.safetensors"));
    if (!strcmp(how, "absent-tensor")) {
        json_t *idx = json_load_file(path_in(dir, "model.safetensors.index.json"), 0, NULL);
        json_object_set_new(json_object_get(idx, "weight_map"), "model.layers.0.self_attn.q_norm.weight",
                            json_string("model-00003-of-00003.safetensors"));
        json_dump_file(idx, path_in(dir, "model.safetensors.index.json"), 0);
        json_decref(idx);
    }
    if (!strcmp(how, "unknown-dtype")) { /* "F32" → "F64" in the header: a dtype paradec does not know */
        char *b;
        size_t n;
        if (pd_read_file(path_in(dir, "model.safetensors"), &b, &n)) return -1;
        char *at = memmem(b, n, "\"F32\"", 5);
        if (at) memcpy(at, "\"F64\"", 5);
        FILE *f = fopen(path_in(dir, "model.safetensors"), "wb");
        fwrite(b, 1, n, f);
        fclose(f);
        free(b);
    }
    if (!strcmp(how, "big-tokenizer") || !strcmp(how, "wordpiece")) {
        FILE *f = fopen(path_in(dir, "tokenizer.json"), "w");
        fputs(how[0] == 'b' ? "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 700}, \"merges\": []}}"
                            : "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0, \"b\": 1}}}",
              f);
        fclose(f);
    }
    return 0;
}

static const struct {
    const char *how, *want;
} BAD[] = {
    {"missing-shard", "shard 'model-00002-of-00003.safetensors' named by the index is missing"},
    {"absent-tensor", "the index puts tensor 'model.layers.0.self_attn.q_norm.weight' in "
                      "model-00003-of-00003.safetensors, which lacks it"},
    {"bad-shape", "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [96, 64] but config.json needs [80, 64]"},
    {"bad-dtype", "tensor 'model.embed_tokens.weight' is I32; paradec reads F32, F16 and BF16"},
    {"unknown-dtype", "unsupported dtype 'F64'"},
    {"bad-arch", "architecture 'GPT2LMHeadModel' is not supported"},
    {"gelu", "hidden_act 'gelu' is not supported"},
    {"mlp-bias", "mlp_bias (MLP biases) is not supported"},
    {"llama-attention-bias", "attention_bias (biases on q/k/v and o_proj) is not supported"},
    {"yarn", "rope_scaling type 'yarn' is not supported"},
    {"extra-tensor", "tensor 'model.layers.0.self_attn.o_proj.bias' is not part of a model paradec knows"},
    {"missing-tensor", "tensor 'lm_head.weight' is missing"},
    {"no-config", "no config.json"},
    {"no-weights", "no model.safetensors or model.safetensors.index.json"},
    {"big-tokenizer", "tokenizer has 701 pieces but the model's vocabulary is 512"},
    {"wordpiece", "tokenizer model type 'WordPiece' is not supported"},
};

static void test_bad(void) {
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/bad-%s", ROOT, BAD[i].how);
        CHECK(write_bad(dir, BAD[i].how) == 0, "%s: writing", BAD[i].how);
        expect_refusal(dir, BAD[i].want, BAD[i].how);
        rm_dir(dir);
    }
    expect_refusal("/nonexistent/dir", "not a directory", "no dir");
}

/* good directories for the tool test */
static const struct {
    const char *name;
    Spec s;
} FIXTURES[] = {
    {"gqa-f16-shards", {"LlamaForCausalLM", 64, 96, 2, 4, 2, 0, 512, 128, 0, 0, 3, DT_F16, NULL, "bin", 0}},
    {"qwen2-bf16-tied",
     {"Qwen2ForCausalLM", 64, 96, 2, 4, 1, 32, 512, 128, 1, 1, 0, DT_BF16,
      "{\"use_sliding_window\": false, \"sliding_window\": 4096}", "bin", 0}},
    {"llama3-rope",
     {"LlamaForCausalLM", 64, 96, 2, 2, 2, 0, 512, 256, 0, 0, 0, DT_F32,
      "{\"rope_theta\": 500000.0, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, "
      "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 64}}",
      "bin", 500000}},
};

static int write_fixtures(const char *root) {
    mkdir(root, 0755);
    char dir[4096];
    for (size_t i = 0; i < sizeof FIXTURES / sizeof *FIXTURES; i++) {
        snprintf(dir, sizeof dir, "%s/%s", root, FIXTURES[i].name);
        make_tensors(&FIXTURES[i].s);
        if (write_dir(&FIXTURES[i].s, dir)) return fprintf(stderr, "%s\n", pd_errmsg()), 1;
    }
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        snprintf(dir, sizeof dir, "%s/bad-%s", root, BAD[i].how);
        if (write_bad(dir, BAD[i].how)) return fprintf(stderr, "%s\n", pd_errmsg()), 1;
    }
    wt_free();
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "--write-fixtures")) return write_fixtures(argv[2]);
    snprintf(ROOT, sizeof ROOT, "/tmp/test_hf.XXXXXX");
    if (!mkdtemp(ROOT)) return fprintf(stderr, "mkdtemp failed\n"), 1;

    check_good(&BASE, "llama-gqa-f32", 0);
    for (size_t i = 0; i < sizeof FIXTURES / sizeof *FIXTURES; i++) check_good(&FIXTURES[i].s, FIXTURES[i].name, 0);
    Spec s = BASE;
    s.arch = "MistralForCausalLM", s.extra = "{\"sliding_window\": 64}", s.dt = DT_BF16;
    check_good(&s, "mistral-window", 64); /* the context capped at the window */
    s = BASE;
    s.tied = 1, s.tokenizer = NULL, s.kv = 4, s.head_dim = 8, s.dt = DT_F16; /* head_dim × heads ≠ dim */
    check_good(&s, "tied-no-tokenizer", 0);
    /* transformers 5 spells the theta inside rope_parameters */
    s = BASE;
    s.extra = "{\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 250000.0}}", s.theta = 250000;
    check_good(&s, "rope-parameters", 0);
    /* the real Llama 3 vocabulary (128256) with its tokenizer.json and chat template */
    s = (Spec){"LlamaForCausalLM",
               32,
               64,
               1,
               2,
               1,
               0,
               128256,
               8192,
               1,
               0,
               0,
               DT_BF16,
               "{\"rope_theta\": 500000.0, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, "
               "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}}",
               "llama3",
               500000};
    check_good(&s, "llama3-vocab", 0);
    test_bad();
    wt_free();
    rm_dir(ROOT);
    return check_done("hf");
}
