/* randmodel — a Llama model with small random weights and a real tokenizer, so the
   whole path of an architecture (its vocabulary, chat format, RoPE scaling) runs end to
   end where the real checkpoint cannot be had (recipes/llama3-tiny.yaml).
   bin/randmodel --config CONFIG.json --tokenizer TOK [--chat-template TOKENIZER_CONFIG.json]
                 [--seed S] [--dtype f32|bf16] -o OUT
   CONFIG.json: paradec's config (Hugging Face key names: hidden_size, intermediate_size,
   num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, vocab_size,
   max_position_embeddings, rms_norm_eps, rope_theta, tie_word_embeddings, rope_scaling);
   TOK: a tokenizer.json (.gz), tokenizer.bin or GGUF whose vocabulary is vocab_size.
   Weights ~ N(0, 0.02²), norm gains 1, biases 0, from --seed (default 1): the output is
   deterministic but means nothing, and the file says so (paradec.random_weights): speed
   and acceptance figures measured on it say nothing about the real model. */
#include <jansson.h>
#include <math.h>

#include "model/checkpoint.h"
#include "tool.h"

#define MEMORY                                                                                                         \
    "memory: about the model as f32 (4 bytes a parameter of the config's shape) + 2 bytes a parameter more\n"          \
    "        with --dtype bf16 + the tokenizer file.\n"
#define USAGE                                                                                                          \
    "--config CONFIG.json --tokenizer TOK [--chat-template TOKENIZER_CONFIG.json] [--seed S] [--dtype f32|bf16] -o "   \
    "OUT"
#define INIT_STD 0.02f

static uint64_t rng_state;

static uint64_t next_u64(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}

static float normal(void) { /* Box-Muller */
    double u = ((next_u64() >> 11) + 0.5) / 9007199254740992.0, v = (next_u64() >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2 * log(u)) * cos(2 * M_PI * v));
}

typedef struct {
    float *data[4096];
    int n;
} Owned;

/* one tensor: fill 'n' normal, '1' ones, '0' zeros; the writer references f32 data
   until commit, so it stays in o */
static void add(ModelWriter *mw, Owned *o, const char *name, int64_t rows, int64_t cols, char fill) {
    size_t n = pd_mul((size_t)(rows ? rows : 1), (size_t)cols);
    float *d = pd_alloc(pd_mul(n, sizeof(float)));
    if (!d || o->n == 4096) die_lib();
    for (size_t i = 0; i < n; i++) d[i] = fill == 'n' ? INIT_STD * normal() : fill == '1' ? 1.0f : 0.0f;
    o->data[o->n++] = d;
    int64_t shape[2] = {rows ? rows : cols, rows ? cols : 1}; /* a vector is [cols][1], as ck_add has it */
    if (mw_add(mw, name, rows ? 2 : 1, shape, d)) die_lib();
}

/* tokenizer_config.json's chat_template, or NULL */
static char *chat_template(const char *path) {
    char *bytes;
    size_t n;
    json_error_t err;
    if (pd_read_file_gz(path, &bytes, &n)) die_lib();
    json_t *o = json_loadb(bytes, n, JSON_DECODE_INT_AS_REAL, &err); /* model_max_length: 1e30 */
    free(bytes);
    if (!json_is_object(o)) die("%s: not a JSON object (%s)", path, err.text);
    json_t *t = json_object_get(o, "chat_template");
    if (!json_is_string(t)) die("%s: no chat_template string", path);
    char *s = strdup(json_string_value(t));
    json_decref(o);
    return s;
}

int main(int argc, char **argv) {
    tool_name = "randmodel";
    const char *cfg_path = NULL, *tok = NULL, *tmpl_path = NULL, *out = NULL, *dtype = "f32";
    long seed = 1;
    Flag t[] = {
        {"--config", "CONFIG.json", "required", "the shape (Hugging Face config key names)", F_STR(&cfg_path)},
        {"--tokenizer", "TOK", "required", "a tokenizer.json (.gz), tokenizer.bin or GGUF of vocab_size tokens",
         F_STR(&tok)},
        {"--chat-template", "TOKENIZER_CONFIG.json", NULL, "the chat template to carry", F_STR(&tmpl_path)},
        {"-s, --seed", "S", "1", "the weights' seed", F_LONG(&seed, 0, 0x7fffffffL)},
        {"--dtype", "TYPE", "f32", "the weights' type: f32 or bf16", F_STR(&dtype)},
        {"-o, --output", "OUT", "required", "the model file to write; - is stdout", F_STR(&out)},
    };
    flags_parse(t, N_FLAGS(t), argc, argv, NULL, 0, USAGE, MEMORY);
    if (!cfg_path) usage("--config CONFIG.json");
    if (!tok) usage("--tokenizer TOK");
    if (!out) usage("-o OUT");
    DType dt = !strcmp(dtype, "f32") ? DT_F32 : !strcmp(dtype, "bf16") ? DT_BF16 : (DType)-1;
    if ((int)dt < 0) die("--dtype: '%s' is not f32 or bf16", dtype);
    char *json;
    size_t n;
    Checkpoint ck = {0};
    if (pd_read_file(cfg_path, &json, &n) || config_from_json(&ck.c, json, cfg_path)) die_lib();
    free(json);
    if (ck_set_tokenizer(&ck, tok)) die_lib(); /* checks its vocabulary against vocab_size */
    char *tmpl = tmpl_path ? chat_template(tmpl_path) : NULL;
    rng_state = 0x9E3779B97F4A7C15ULL ^ (uint64_t)(seed + 1) * 0xBF58476D1CE4E5B9ULL;

    const Config *c = &ck.c;
    static Owned o;
    ModelWriter mw;
    char name[256];
    char note[160];
    snprintf(note, sizeof note,
             "seed %ld: random weights; speed and acceptance figures mean nothing about a real model", seed);
    const char *meta[] = {"paradec.random_weights", note};
    if (mw_begin(&mw, out, dt)) die_lib();
    int64_t D = c->dim, Q = config_size(c, 'Q'), K = config_size(c, 'K');
    add(&mw, &o, NAME_EMBED, c->vocab_size, D, 'n');
    for (int l = 0; l < c->n_layers; l++) {
        static const struct {
            const char *what;
            char rows, cols, fill;
        } T[] = {{"input_layernorm.weight", 0, 'D', '1'},    {"self_attn.q_proj.weight", 'Q', 'D', 'n'},
                 {"self_attn.k_proj.weight", 'K', 'D', 'n'}, {"self_attn.v_proj.weight", 'K', 'D', 'n'},
                 {"self_attn.o_proj.weight", 'D', 'Q', 'n'}, {"post_attention_layernorm.weight", 0, 'D', '1'},
                 {"mlp.gate_proj.weight", 'H', 'D', 'n'},    {"mlp.up_proj.weight", 'H', 'D', 'n'},
                 {"mlp.down_proj.weight", 'D', 'H', 'n'}};
        for (int k = 0; k < 9; k++) {
            layer_tensor_name(name, sizeof name, l, T[k].what);
            add(&mw, &o, name, config_size(c, T[k].rows), config_size(c, T[k].cols), T[k].fill);
        }
        if (c->qkv_bias) {
            static const char *const bias[] = {"self_attn.q_proj.bias", "self_attn.k_proj.bias",
                                               "self_attn.v_proj.bias"};
            for (int k = 0; k < 3; k++) {
                layer_tensor_name(name, sizeof name, l, bias[k]);
                add(&mw, &o, name, 0, k ? K : Q, '0');
            }
        }
    }
    add(&mw, &o, NAME_NORM, 0, D, '1');
    if (!c->tied) add(&mw, &o, NAME_LM_HEAD, c->vocab_size, D, 'n');
    mw.chat_template = tmpl;
    mw.meta = meta, mw.n_meta = 1;
    if (mw_commit(&mw, c, ck.tok, ck.tok_len, ck.tok_kind)) die_lib();
    fprintf(
        stderr,
        "randmodel: %s (%d layers, dim %d, vocab %d, tokenizer %s%s, %s) — RANDOM weights: its speed and acceptance "
        "figures mean nothing about the real model\n",
        out, c->n_layers, c->dim, c->vocab_size, ck.tok_kind, tmpl ? ", chat template" : "", dtype);
    for (int i = 0; i < o.n; i++) free(o.data[i]);
    free(tmpl);
    ck_free(&ck);
    return 0;
}
