/* hf.c — Hugging Face checkpoint directories: config.json, model.safetensors or shards
   named by model.safetensors.index.json, the tokenizer and the chat template.

   What paradec cannot run is refused by name, never approximated: another
   architecture, another activation, MLP or output-projection biases, partial RoPE,
   RoPE scaling other than llama3, tensors nobody asked for. One exception, which
   keeps results exact: a sliding attention window shorter than the context (Mistral
   v0.1) caps the context at the window, where full attention is the same thing.
   HF's q_proj/k_proj rows are already in rotate-half order: nothing is permuted. */
#include "import/hf.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "formats/gguf.h"
#include "model/checkpoint.h"

typedef struct {
    const char *dir;
    char cfg_path[4096];
    json_t *cfg;
    /* the weights: one file, or the shards an index names */
    json_t *weight_map; /* name → shard file, or NULL for a single file */
    char **shard_name;
    TensorFile *shard;
    int n_shards;
} Hf;

static int file_exists(const char *path) {
    struct stat st;
    return !stat(path, &st) && S_ISREG(st.st_mode);
}

/* ---------------- config.json ---------------- */

/* an integer key; absent or null takes dflt (dflt < 0: required) */
static int cfg_int(Hf *h, const char *key, int *out, int dflt) {
    json_t *v = json_object_get(h->cfg, key);
    if ((!v || json_is_null(v)) && dflt >= 0) {
        *out = dflt;
        return 0;
    }
    if (!json_is_integer(v)) return pd_error("%s: '%s' is missing or not an integer", h->cfg_path, key);
    json_int_t x = json_integer_value(v);
    if (x < 1 || x > (1 << 30)) return pd_error("%s: '%s' = %lld is out of range", h->cfg_path, key, (long long)x);
    *out = (int)x;
    return 0;
}

static int cfg_num(Hf *h, const char *key, float *out, int required) {
    json_t *v = json_object_get(h->cfg, key);
    if ((!v || json_is_null(v)) && !required) return 0;
    if (!json_is_number(v)) return pd_error("%s: '%s' is missing or not a number", h->cfg_path, key);
    *out = (float)json_number_value(v);
    return 0;
}

static int cfg_bool(Hf *h, const char *key, int dflt) {
    json_t *v = json_object_get(h->cfg, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static const char *const ARCHS[] = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"};

/* architectures[0] → 0 llama, 1 mistral, 2 qwen2; -1 refused */
static int architecture(Hf *h) {
    json_t *a = json_object_get(h->cfg, "architectures");
    const char *name = json_string_value(json_array_get(a, 0));
    if (!name) return pd_error("%s: 'architectures' is missing", h->cfg_path);
    for (int i = 0; i < 3; i++)
        if (!strcmp(name, ARCHS[i])) return i;
    return pd_error("%s: architecture '%s' is not supported (paradec reads LlamaForCausalLM, MistralForCausalLM, "
                    "Qwen2ForCausalLM)",
                    h->cfg_path, name);
}

/* features the forward pass does not have: refused by name */
static int unsupported(Hf *h, int arch) {
    json_t *act = json_object_get(h->cfg, "hidden_act");
    if (json_is_string(act) && strcmp(json_string_value(act), "silu"))
        return pd_error("%s: hidden_act '%s' is not supported (paradec runs silu)", h->cfg_path,
                        json_string_value(act));
    if (cfg_bool(h, "mlp_bias", 0)) return pd_error("%s: mlp_bias (MLP biases) is not supported", h->cfg_path);
    if (arch != 2 && cfg_bool(h, "attention_bias", 0))
        return pd_error("%s: attention_bias (biases on q/k/v and o_proj) is not supported; paradec has q/k/v biases "
                        "only (Qwen2)",
                        h->cfg_path);
    json_t *prf = json_object_get(h->cfg, "partial_rotary_factor");
    if (json_is_number(prf) && json_number_value(prf) != 1)
        return pd_error("%s: partial_rotary_factor %g (partial RoPE) is not supported", h->cfg_path,
                        json_number_value(prf));
    static const char *const moe[] = {"num_local_experts", "num_experts"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(h->cfg, moe[i]);
        if (json_is_integer(v) && json_integer_value(v) > 1)
            return pd_error("%s: a mixture of experts (%s) is not supported", h->cfg_path, moe[i]);
    }
    return 0;
}

/* rope_scaling (null, or llama3), or transformers 5's rope_parameters holding the theta too */
static int rope(Hf *h, Config *c) {
    json_t *rs = json_object_get(h->cfg, "rope_scaling"), *rp = json_object_get(h->cfg, "rope_parameters");
    if (json_is_object(rp)) {
        json_t *theta = json_object_get(rp, "rope_theta"), *type = json_object_get(rp, "rope_type");
        if (json_is_number(theta)) c->rope_theta = (float)json_number_value(theta);
        if (!json_is_string(type) || strcmp(json_string_value(type), "default")) rs = rp;
    }
    if (!rs || json_is_null(rs)) return 0;
    json_t *type = json_object_get(rs, "rope_type");
    if (!type) type = json_object_get(rs, "type");
    if (json_is_string(type) && !strcmp(json_string_value(type), "default")) return 0;
    return rope_scaling_from_json(c, rs, h->cfg_path);
}

static int read_config(Hf *h, Config *c) {
    memset(c, 0, sizeof *c);
    int arch = architecture(h);
    if (arch < 0 || unsupported(h, arch)) return -1;
    if (cfg_int(h, "hidden_size", &c->dim, -1) || cfg_int(h, "intermediate_size", &c->hidden_dim, -1) ||
        cfg_int(h, "num_hidden_layers", &c->n_layers, -1) || cfg_int(h, "num_attention_heads", &c->n_heads, -1) ||
        cfg_int(h, "num_key_value_heads", &c->n_kv_heads, c->n_heads) ||
        cfg_int(h, "head_dim", &c->head_dim, c->dim / c->n_heads) || cfg_int(h, "vocab_size", &c->vocab_size, -1) ||
        cfg_int(h, "max_position_embeddings", &c->seq_len, -1))
        return -1;
    c->norm_eps = 1e-6f; /* transformers' default for all three */
    c->rope_theta = 10000.0f;
    if (cfg_num(h, "rms_norm_eps", &c->norm_eps, 0) || cfg_num(h, "rope_theta", &c->rope_theta, 0) || rope(h, c))
        return -1;
    c->tied = cfg_bool(h, "tie_word_embeddings", 0);
    c->qkv_bias = arch == 2;
    /* a sliding window shorter than the context: cap the context (exact within it) */
    int window = 0;
    json_t *w = json_object_get(h->cfg, "sliding_window");
    if (json_is_integer(w) && (arch == 1 || cfg_bool(h, "use_sliding_window", 0)) &&
        cfg_int(h, "sliding_window", &window, 0) == 0 && window < c->seq_len)
        c->seq_len = window;
    return config_check(c, h->cfg_path);
}

/* ---------------- the weights ---------------- */

static int open_weights(Hf *h) {
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", h->dir);
    if (!file_exists(path)) {
        snprintf(path, sizeof path, "%s/model.safetensors", h->dir);
        if (!file_exists(path)) {
            char bin[4096];
            snprintf(bin, sizeof bin, "%s/pytorch_model.bin", h->dir);
            return pd_error("%s: no model.safetensors or model.safetensors.index.json%s", h->dir,
                            file_exists(bin) ? " (pytorch_model.bin is not read: save the model as safetensors)" : "");
        }
        h->shard_name = pd_alloc(sizeof(char *));
        h->shard = pd_alloc(sizeof(TensorFile));
        if (!h->shard_name || !h->shard || !(h->shard_name[0] = pd_strdup("model.safetensors"))) return -1;
        h->n_shards = 1;
        return tf_open(&h->shard[0], path);
    }
    json_error_t err;
    json_t *idx = json_load_file(path, 0, &err);
    json_t *map = json_object_get(idx, "weight_map");
    if (!json_is_object(map)) {
        json_decref(idx);
        return pd_error("%s: not an index with a weight_map (%s)", path, idx ? "no weight_map" : err.text);
    }
    h->weight_map = json_incref(map);
    json_decref(idx);
    /* the distinct shard files, opened once each */
    size_t n = json_object_size(map);
    h->shard_name = pd_alloc(sizeof(char *) * (n + 1));
    h->shard = pd_alloc(sizeof(TensorFile) * (n + 1));
    if (!h->shard_name || !h->shard) return -1;
    const char *name;
    json_t *v;
    json_object_foreach(map, name, v) {
        const char *f = json_string_value(v);
        if (!f || !*f || strchr(f, '/') || f[0] == '.')
            return pd_error("%s: weight_map gives tensor '%s' a bad file name", path, name);
        int k = 0;
        while (k < h->n_shards && strcmp(h->shard_name[k], f)) k++;
        if (k < h->n_shards) continue;
        char sp[4096];
        snprintf(sp, sizeof sp, "%s/%s", h->dir, f);
        if (!(h->shard_name[k] = pd_strdup(f))) return -1;
        h->n_shards++;
        if (!file_exists(sp)) return pd_error("%s: shard '%s' named by the index is missing", h->dir, f);
        if (tf_open(&h->shard[k], sp)) return -1;
    }
    /* every tensor the index names is in its shard */
    json_object_foreach(map, name, v) {
        int k = 0;
        while (strcmp(h->shard_name[k], json_string_value(v))) k++;
        if (!tf_get(&h->shard[k], name))
            return pd_error("%s: the index puts tensor '%s' in %s, which lacks it", h->dir, name, h->shard_name[k]);
    }
    return 0;
}

static const Tensor *find(const Hf *h, const char *name, const char **file) {
    const char *in = h->weight_map ? json_string_value(json_object_get(h->weight_map, name)) : NULL;
    if (h->weight_map && !in) return NULL;
    for (int k = 0; k < h->n_shards; k++) {
        if (in && strcmp(in, h->shard_name[k])) continue;
        const Tensor *t = tf_get(&h->shard[k], name);
        *file = h->shard_name[k];
        if (t) return t;
    }
    return NULL;
}

static float *import(Checkpoint *ck, const Hf *h, const char *name, int64_t rows, int64_t cols) {
    const char *file = "model.safetensors";
    const Tensor *t = find(h, name, &file);
    if (!t) {
        int unindexed = h->weight_map && !json_object_get(h->weight_map, name);
        pd_error("%s: tensor '%s' is missing%s", h->dir, name, unindexed ? " from the index" : "");
        return NULL;
    }
    if (t->dtype != DT_F32 && t->dtype != DT_F16 && t->dtype != DT_BF16) {
        pd_error("%s/%s: tensor '%s' is %s; paradec reads F32, F16 and BF16", h->dir, file, name, dtype_name(t->dtype));
        return NULL;
    }
    int nd = rows ? 2 : 1;
    if (t->ndim != nd || t->shape[0] != (rows ? rows : cols) || (rows && t->shape[1] != cols)) {
        char have[96] = "";
        for (int d = 0; d < t->ndim && d < 4; d++)
            snprintf(have + strlen(have), sizeof have - strlen(have), "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        if (rows)
            pd_error("%s/%s: tensor '%s' has shape [%s] but config.json needs [%lld, %lld]", h->dir, file, name, have,
                     (long long)rows, (long long)cols);
        else
            pd_error("%s/%s: tensor '%s' has shape [%s] but config.json needs [%lld]", h->dir, file, name, have,
                     (long long)cols);
        return NULL;
    }
    float *d = ck_add(ck, name, rows, cols);
    if (!d) return NULL;
    size_t n = (size_t)(rows ? rows : 1) * cols;
    const unsigned char *p = t->data;
    if (t->dtype == DT_F32) memcpy(d, p, n * 4);
    else
        for (size_t i = 0; i < n; i++) {
            uint16_t v = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
            if (t->dtype == DT_F16) d[i] = gguf_f16_to_f32(v);
            else {
                uint32_t u = (uint32_t)v << 16;
                memcpy(&d[i], &u, 4);
            }
        }
    return d;
}

static const struct {
    const char *name;
    char rows, cols; /* D dim, H hidden, Q q width, K kv width, 0 a vector */
} LAYER[] = {
    {"input_layernorm.weight", 0, 'D'},    {"self_attn.q_proj.weight", 'Q', 'D'},
    {"self_attn.k_proj.weight", 'K', 'D'}, {"self_attn.v_proj.weight", 'K', 'D'},
    {"self_attn.o_proj.weight", 'D', 'Q'}, {"post_attention_layernorm.weight", 0, 'D'},
    {"mlp.gate_proj.weight", 'H', 'D'},    {"mlp.up_proj.weight", 'H', 'D'},
    {"mlp.down_proj.weight", 'D', 'H'},    {"self_attn.q_proj.bias", 0, 'Q'},
    {"self_attn.k_proj.bias", 0, 'K'},     {"self_attn.v_proj.bias", 0, 'K'},
};

/* tensors the files may hold that paradec does not need */
static int ignorable(const Checkpoint *ck, const char *name) {
    size_t n = strlen(name), s = strlen(".rotary_emb.inv_freq");
    return (n > s && !strcmp(name + n - s, ".rotary_emb.inv_freq")) || (ck->c.tied && !strcmp(name, NAME_LM_HEAD));
}

static int read_weights(Checkpoint *ck, const Hf *h) {
    const Config *c = &ck->c;
    char name[160];
    int n_layer = c->qkv_bias ? 12 : 9;
    for (int l = 0; l < c->n_layers; l++)
        for (int k = 0; k < n_layer; k++) {
            layer_tensor_name(name, sizeof name, l, LAYER[k].name);
            if (!import(ck, h, name, config_size(c, LAYER[k].rows), config_size(c, LAYER[k].cols))) return -1;
        }
    if (!import(ck, h, NAME_EMBED, c->vocab_size, c->dim) || !import(ck, h, NAME_NORM, 0, c->dim) ||
        (!c->tied && !import(ck, h, NAME_LM_HEAD, c->vocab_size, c->dim)))
        return -1;
    /* anything else is a feature paradec would silently drop */
    for (int k = 0; k < h->n_shards; k++)
        for (int i = 0; i < h->shard[k].n; i++) {
            const char *t = h->shard[k].t[i].name;
            if (!ck_get(ck, t) && !ignorable(ck, t))
                return pd_error("%s/%s: tensor '%s' is not part of a model paradec knows (an unsupported feature?)",
                                h->dir, h->shard_name[k], t);
        }
    return 0;
}

/* ---------------- tokenizer and chat template ---------------- */

static int read_tokenizer(Checkpoint *ck, const Hf *h) {
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", h->dir);
    if (!file_exists(path)) snprintf(path, sizeof path, "%s/tokenizer.bin", h->dir);
    if (file_exists(path) && ck_set_tokenizer(ck, path)) return -1;
    /* tokenizer_config.json's chat_template: a string, or a list of {name, template} */
    snprintf(path, sizeof path, "%s/tokenizer_config.json", h->dir);
    json_error_t err;
    /* integers as reals: model_max_length is often 1e30, beyond what jansson holds */
    json_t *tc = file_exists(path) ? json_load_file(path, JSON_DECODE_INT_AS_REAL, &err) : NULL;
    json_t *t = json_object_get(tc, "chat_template");
    if (file_exists(path) && !tc) return pd_error("%s: %s (line %d)", path, err.text, err.line);
    if (json_is_array(t)) {
        size_t i;
        json_t *e, *pick = NULL;
        json_array_foreach(t, i, e) {
            const char *nm = json_string_value(json_object_get(e, "name"));
            if (!pick || (nm && !strcmp(nm, "default"))) pick = json_object_get(e, "template");
        }
        t = pick;
    }
    if (json_is_string(t) && !(ck->chat_template = pd_strdup(json_string_value(t)))) {
        json_decref(tc);
        return -1;
    }
    json_decref(tc);
    /* newer checkpoints keep it beside: chat_template.jinja */
    snprintf(path, sizeof path, "%s/chat_template.jinja", h->dir);
    if (!ck->chat_template && file_exists(path)) {
        char *s;
        size_t n;
        if (pd_read_file(path, &s, &n)) return -1;
        ck->chat_template = s;
    }
    return 0;
}

/* config.json's text into c; h->cfg_path names it in errors */
static int parse_config(Hf *h, Config *c, const void *json, size_t n) {
    json_error_t err;
    int rc = 0;
    if (!(h->cfg = json_loadb(json, n, 0, &err))) /* (json_is_* evaluate their argument twice) */
        rc = pd_error("%s: %s (line %d)", h->cfg_path, err.text, err.line);
    else if (!json_is_object(h->cfg)) rc = pd_error("%s: not a JSON object", h->cfg_path);
    return rc ? rc : read_config(h, c);
}

int hf_config_parse(Config *c, const void *json, size_t n, const char *what) {
    Hf h = {.dir = what};
    snprintf(h.cfg_path, sizeof h.cfg_path, "%s", what);
    int rc = parse_config(&h, c, json, n);
    json_decref(h.cfg);
    return rc;
}

int hf_read_dir(Checkpoint *ck, const char *dir) {
    memset(ck, 0, sizeof *ck);
    Hf h = {.dir = dir};
    struct stat st;
    if (stat(dir, &st) || !S_ISDIR(st.st_mode)) return pd_error("%s: not a directory", dir);
    snprintf(h.cfg_path, sizeof h.cfg_path, "%s/config.json", dir);
    char *json = NULL;
    size_t n = 0;
    int rc = 0;
    if (!file_exists(h.cfg_path)) rc = pd_error("%s: no config.json: not a Hugging Face checkpoint directory", dir);
    else rc = pd_read_file(h.cfg_path, &json, &n);
    rc = rc ? rc : parse_config(&h, &ck->c, json, n);
    free(json);
    rc = rc ? rc : open_weights(&h);
    rc = rc ? rc : read_weights(ck, &h);
    rc = rc ? rc : read_tokenizer(ck, &h);
    for (int k = 0; k < h.n_shards; k++) {
        tf_close(&h.shard[k]);
        free(h.shard_name[k]);
    }
    free(h.shard);
    free(h.shard_name);
    json_decref(h.weight_map);
    json_decref(h.cfg);
    if (rc) ck_free(ck);
    return rc;
}

int hf_write_dir(const Checkpoint *ck, const char *dir) {
    if (mkdir(dir, 0755) && errno != EEXIST) return pd_error("%s: cannot create: %s", dir, strerror(errno));
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    TfWriter *w = tfw_begin(path, 0);
    if (!w) return -1;
    for (int i = 0; i < ck->n; i++)
        if (tfw_add(w, ck->t[i].name, DT_F32, ck->t[i].ndim, ck->t[i].shape, ck->t[i].data)) {
            tfw_abort(w);
            return -1;
        }
    if (tfw_meta(w, "format", "pt") || tfw_commit(w)) return -1;
    const Config *c = &ck->c;
    snprintf(path, sizeof path, "%s/config.json", dir);
    AtomicFile af;
    if (atomic_open(&af, path)) return -1;
    fprintf(af.f,
            "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
            "  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n  \"num_hidden_layers\": %d,\n"
            "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n"
            "  \"vocab_size\": %d,\n  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": %.9g,\n"
            "  \"rope_theta\": %.9g,\n  \"tie_word_embeddings\": %s,\n  \"hidden_act\": \"silu\",\n"
            "  \"torch_dtype\": \"float32\",\n  \"bos_token_id\": 1,\n  \"eos_token_id\": 2\n}\n",
            c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, c->vocab_size, c->seq_len,
            c->norm_eps, c->rope_theta, c->tied ? "true" : "false");
    if (atomic_commit(&af)) return -1;
    if (ck->tok) { /* the tokenizer file beside it, as llama2.c ships it */
        snprintf(path, sizeof path, "%s/tokenizer.bin", dir);
        if (atomic_open(&af, path)) return -1;
        fwrite(ck->tok, 1, ck->tok_len, af.f);
        if (atomic_commit(&af)) return -1;
    }
    return 0;
}
