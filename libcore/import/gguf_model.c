/* gguf_model.c — a llama.cpp GGUF model file into a Checkpoint: the {arch}.* keys
   as the config, the blk.* tensors under Hugging Face names (q/k rows back to
   rotate-half order for 'llama'), the tokenizer.* keys as a vocabulary-only GGUF.
   Matrices of block types (Q8_0 … Q6_K) stay raw blocks, their rows permuted whole;
   F32/F16/BF16 and any block-typed vector become f32. The file itself is read by
   formats/gguf.c. */
#include "import/gguf_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "formats/gguf.h"

typedef struct {
    const Gguf *g;
    const char *arch;
    uint8_t *used; /* [n_tensors] taken by the importer */
} Src;

static const char *arch_key(const Src *s, const char *suffix) {
    static _Thread_local char key[160];
    snprintf(key, sizeof key, "%s.%s", s->arch, suffix);
    return key;
}

/* {arch}.suffix as an int in [1, 2^30]; dflt < 0: required */
static int key_int(const Src *s, const char *suffix, int *out, int dflt) {
    const char *key = arch_key(s, suffix);
    int64_t v;
    if (!gguf_find(s->g, key) && dflt >= 0) {
        *out = dflt;
        return 0;
    }
    if (gguf_get_int(s->g, key, &v)) return -1;
    if (v < 1 || v > (1 << 30)) return pd_error("%s: %s = %lld is out of range", s->g->path, key, (long long)v);
    *out = (int)v;
    return 0;
}

static int key_f32(const Src *s, const char *suffix, float *out, int required) {
    const char *key = arch_key(s, suffix);
    if (!gguf_find(s->g, key) && !required) return 0;
    return gguf_get_f32(s->g, key, out);
}

static const GgufTensor *take_tensor(Src *s, const char *name) {
    const GgufTensor *t = gguf_tensor(s->g, name);
    if (t) s->used[t - s->g->t] = 1;
    return t;
}

/* the GGUF tensor `src` (ggml dims reversed: [cols, rows]) as the checkpoint's `dst`
   [rows][cols] (rows 0: a vector of cols), f32 or raw blocks; the CkTensor */
static CkTensor *import(Checkpoint *ck, Src *s, const char *src, const char *dst, int64_t rows, int64_t cols) {
    const GgufTensor *t = take_tensor(s, src);
    if (!t) {
        pd_error("%s: tensor '%s' is missing", s->g->path, src);
        return NULL;
    }
    int nd = rows ? 2 : 1;
    int64_t want0 = cols, want1 = rows ? rows : 1;
    if (t->n_dims != nd || t->dims[0] != want0 || t->dims[1] != want1) {
        char have[96] = "", want[48];
        for (int d = t->n_dims - 1; d >= 0; d--)
            snprintf(have + strlen(have), sizeof have - strlen(have), "%s%lld", d == t->n_dims - 1 ? "" : ", ",
                     (long long)t->dims[d]);
        if (rows) snprintf(want, sizeof want, "%lld, %lld", (long long)rows, (long long)cols);
        else snprintf(want, sizeof want, "%lld", (long long)cols);
        pd_error("%s: tensor '%s' has shape [%s] (rows first) but the config needs [%s]", s->g->path, src, have, want);
        return NULL;
    }
    int bt = gguf_block_dtype(t->type);
    if (rows && bt >= 0) {
        void *r = ck_add_raw(ck, dst, (DType)bt, rows, cols);
        if (!r) return NULL;
        memcpy(r, t->data, t->nbytes); /* gguf.c checked nbytes = rows whole blocks */
        return &ck->t[ck->n - 1];
    }
    float *d = ck_add(ck, dst, rows, cols);
    if (!d || gguf_tensor_f32(s->g, t, d)) return NULL;
    return &ck->t[ck->n - 1];
}

/* Llama 3.1 RoPE scaling: llama.cpp stores no parameters, only the per-frequency
   divisors it computed from them (rope_freqs.weight, [head_dim/2]). Recover factor,
   low/high_freq_factor (for an original context of 8192 unless the file says: any
   choice gives the same frequencies) and check they reproduce every divisor. */
static int rope_from_freqs(Config *c, Src *s, const char *what) {
    const GgufTensor *t = take_tensor(s, "rope_freqs.weight");
    if (!t) return 0;
    int half = c->head_dim / 2;
    if (t->n_dims != 1 || t->dims[0] != half)
        return pd_error("%s: rope_freqs.weight has %lld entries, head_dim/2 is %d", what, (long long)t->dims[0], half);
    float *f = pd_alloc(sizeof(float) * half);
    double *x = pd_alloc(sizeof(double) * half); /* 1/wavelength */
    if (!f || !x || gguf_tensor_f32(s->g, t, f)) {
        free(f);
        free(x);
        return -1;
    }
    double F = 1, mn = 1;
    for (int j = 0; j < half; j++) {
        x[j] = 1.0 / pow(c->rope_theta, 2.0 * j / c->head_dim) / (2 * M_PI);
        F = fmax(F, f[j]), mn = fmin(mn, f[j]);
    }
    int rc = 0, orig = 8192;
    if (!(mn > 1 - 1e-6) || !isfinite(F))
        rc = pd_error("%s: rope_freqs.weight speeds up some frequencies: not Llama 3 RoPE scaling", what);
    else if (F > 1 && key_int(s, "rope.scaling.original_context_length", &orig, 8192)) rc = -1;
    else if (F > 1) {
        /* s = (1/f - 1/F) / (1 - 1/F) runs from 1 (kept) to 0 (slowed by F) and is linear in
           x = 1/wavelength between: s = a·x - b. x falls with j: kept, blended, slowed. */
        int first = -1, last = -1, n_blend = 0;
        double xk = 0, xs = 0; /* the smallest kept x, the largest slowed x (0: none) */
        for (int j = 0; j < half; j++) {
            if (fabsf(f[j] - 1) < 1e-6f) xk = x[j];
            else if (fabsf(f[j] - (float)F) < 1e-6f * (float)F) {
                if (!xs) xs = x[j];
            } else {
                if (first < 0) first = j;
                last = j;
                n_blend++;
            }
        }
        double a, b;
        if (n_blend >= 2) {
            double s1 = (1 / f[first] - 1 / F) / (1 - 1 / F), s2 = (1 / f[last] - 1 / F) / (1 - 1 / F);
            a = (s1 - s2) / (x[first] - x[last]);
            b = a * x[first] - s1;
        } else if (n_blend == 1) {
            /* one point: the steepest line through it that keeps its neighbours outside */
            double sb = (1 / f[first] - 1 / F) / (1 - 1 / F), xb = x[first];
            a = 0;
            if (xk) a = fmax(a, (1 - sb) / (xk - xb));
            if (xs) a = fmax(a, sb / (xb - xs));
            if (a == 0) a = 1 / xb;
            b = a * xb - sb;
        } else {
            /* a step: s = 1 at the last kept frequency, 0 at the first slowed one */
            double x1 = xk ? xk : 2 * x[0], x0 = xs ? xs : x[half - 1] / 2;
            a = 1 / (x1 - x0);
            b = a * x1 - 1;
        }
        if (!(a > 0) || !(b > 0) || !isfinite(a))
            rc = pd_error("%s: rope_freqs.weight is not Llama 3 RoPE scaling (no line fits its blend)", what);
        else {
            c->rope_factor = (float)F;
            c->rope_orig_ctx = orig;
            c->rope_low_freq = (float)(b * orig / a);
            c->rope_high_freq = (float)((b + 1) * orig / a);
        }
        /* what model.c will compute must be what llama.cpp computes */
        for (int j = 0; j < half && !rc; j++) {
            double low_wl = c->rope_orig_ctx / c->rope_low_freq, high_wl = c->rope_orig_ctx / c->rope_high_freq;
            double wl = 1 / x[j], div;
            if (wl < high_wl) div = 1;
            else if (wl > low_wl) div = c->rope_factor;
            else {
                double sm = (c->rope_orig_ctx / wl - c->rope_low_freq) / (c->rope_high_freq - c->rope_low_freq);
                div = 1 / ((1 - sm) / c->rope_factor + sm);
            }
            if (fabs(div - f[j]) > 1e-4 * f[j])
                rc = pd_error("%s: rope_freqs.weight[%d] = %g is not Llama 3 RoPE scaling (which gives %g)", what, j,
                              f[j], div);
        }
    }
    free(f);
    free(x);
    return rc;
}

static int read_config(Config *c, Src *s) {
    const Gguf *g = s->g;
    memset(c, 0, sizeof *c);
    if (key_int(s, "embedding_length", &c->dim, -1) || key_int(s, "feed_forward_length", &c->hidden_dim, -1) ||
        key_int(s, "block_count", &c->n_layers, -1) || key_int(s, "attention.head_count", &c->n_heads, -1) ||
        key_int(s, "attention.head_count_kv", &c->n_kv_heads, c->n_heads) ||
        key_int(s, "context_length", &c->seq_len, -1))
        return -1;
    c->rope_theta = 10000.0f;
    if (key_f32(s, "rope.freq_base", &c->rope_theta, 0) ||
        key_f32(s, "attention.layer_norm_rms_epsilon", &c->norm_eps, 1))
        return -1;
    int hk, hv, rot, experts;
    if (key_int(s, "attention.key_length", &hk, c->dim / c->n_heads) || key_int(s, "attention.value_length", &hv, hk) ||
        key_int(s, "rope.dimension_count", &rot, hk) || key_int(s, "expert_count", &experts, 1))
        return -1;
    if (hk != hv) return pd_error("%s: key length %d ≠ value length %d: not supported", g->path, hk, hv);
    if (rot != hk)
        return pd_error("%s: %s.rope.dimension_count %d ≠ head size %d (partial RoPE) is not supported", g->path,
                        s->arch, rot, hk);
    if (experts > 1)
        return pd_error("%s: a mixture of experts (%s.expert_count %d) is not supported", g->path, s->arch, experts);
    c->head_dim = hk;
    GgufStr st;
    if (gguf_find(g, arch_key(s, "rope.scaling.type"))) {
        if (gguf_get_str(g, arch_key(s, "rope.scaling.type"), &st)) return -1;
        float factor = 1;
        key_f32(s, "rope.scaling.factor", &factor, 0);
        if (!(st.len == 4 && !memcmp(st.s, "none", 4)) && !(factor == 1))
            return pd_error("%s: RoPE scaling '%.*s' is not supported", g->path, (int)(st.len > 40 ? 40 : st.len),
                            st.s);
    }
    float lin = 1;
    if (key_f32(s, "rope.scale_linear", &lin, 0)) return -1;
    if (lin != 1)
        return pd_error("%s: linear RoPE scaling (%s.rope.scale_linear %g) is not supported", g->path, s->arch, lin);
    /* the vocabulary is the embedding's rows */
    const GgufTensor *e = gguf_tensor(g, "token_embd.weight");
    if (!e) return pd_error("%s: tensor 'token_embd.weight' is missing", g->path);
    if (e->n_dims != 2 || e->dims[1] < 1 || e->dims[1] > (1 << 30))
        return pd_error("%s: token_embd.weight is not a [vocab, dim] matrix", g->path);
    c->vocab_size = (int)e->dims[1];
    int v;
    if (key_int(s, "vocab_size", &v, c->vocab_size)) return -1;
    if (v != c->vocab_size)
        return pd_error("%s: %s.vocab_size %d but token_embd.weight has %d rows", g->path, s->arch, v, c->vocab_size);
    c->tied = !gguf_tensor(g, "output.weight");
    c->qkv_bias = gguf_tensor(g, "blk.0.attn_q.bias") != NULL;
    if (config_check(c, g->path) || rope_from_freqs(c, s, g->path)) return -1;
    return 0;
}

/* GGUF's per-layer names and Hugging Face's */
static const struct {
    const char *gguf, *hf;
    char rows, cols; /* D dim, H hidden, Q q width, K kv width, 0 a vector */
} LAYER_MAP[] = {
    {"attn_norm.weight", "input_layernorm.weight", 0, 'D'},
    {"attn_q.weight", "self_attn.q_proj.weight", 'Q', 'D'},
    {"attn_k.weight", "self_attn.k_proj.weight", 'K', 'D'},
    {"attn_v.weight", "self_attn.v_proj.weight", 'K', 'D'},
    {"attn_output.weight", "self_attn.o_proj.weight", 'D', 'Q'},
    {"ffn_norm.weight", "post_attention_layernorm.weight", 0, 'D'},
    {"ffn_gate.weight", "mlp.gate_proj.weight", 'H', 'D'},
    {"ffn_up.weight", "mlp.up_proj.weight", 'H', 'D'},
    {"ffn_down.weight", "mlp.down_proj.weight", 'D', 'H'},
    {"attn_q.bias", "self_attn.q_proj.bias", 0, 'Q'},
    {"attn_k.bias", "self_attn.k_proj.bias", 0, 'K'},
    {"attn_v.bias", "self_attn.v_proj.bias", 0, 'K'},
};

static int read_tensors(Checkpoint *ck, Src *s, int permute) {
    const Config *c = &ck->c;
    char src[96], dst[128];
    int n_map = c->qkv_bias ? 12 : 9;
    for (int l = 0; l < c->n_layers; l++)
        for (int k = 0; k < n_map; k++) {
            snprintf(src, sizeof src, "blk.%d.%s", l, LAYER_MAP[k].gguf);
            layer_tensor_name(dst, sizeof dst, l, LAYER_MAP[k].hf);
            int64_t rows = config_size(c, LAYER_MAP[k].rows), cols = config_size(c, LAYER_MAP[k].cols);
            CkTensor *d = import(ck, s, src, dst, rows, cols);
            if (!d) return -1;
            /* llama.cpp's convert_hf_to_gguf permutes a llama's q/k rows (and q/k biases
               alike) into Meta's interleaved order (LlamaModel.permute); back to HF's */
            int heads = k == 1 || k == 9 ? c->n_heads : k == 2 || k == 10 ? c->n_kv_heads : 0;
            if (permute && heads &&
                (d->raw ? rope_rows_permute_bytes(d->raw, heads, c->head_dim, dtype_row_bytes(d->dtype, cols), 1)
                        : rope_rows_permute(d->data, heads, c->head_dim, rows ? (int)cols : 1, 1)))
                return -1;
        }
    if (!import(ck, s, "token_embd.weight", NAME_EMBED, c->vocab_size, c->dim) ||
        !import(ck, s, "output_norm.weight", NAME_NORM, 0, c->dim) ||
        (!c->tied && !import(ck, s, "output.weight", NAME_LM_HEAD, c->vocab_size, c->dim)))
        return -1;
    for (int i = 0; i < s->g->n_tensors; i++)
        if (!s->used[i])
            return pd_error("%s: tensor '%s' is not part of a model paradec knows (an unsupported feature?)",
                            s->g->path, s->g->t[i].name);
    return 0;
}

/* the tokenizer metadata, as a vocabulary-only GGUF (kind "gguf"), and the chat template */
static int read_vocab(Checkpoint *ck, const Gguf *g) {
    const GgufKV *toks = gguf_find(g, "tokenizer.ggml.tokens");
    if (!toks) return 0; /* convert then asks for --tokenizer */
    if (toks->type != GGUF_ARRAY || toks->elem != GGUF_STRING)
        return pd_error("%s: tokenizer.ggml.tokens is not an array of strings", g->path);
    if (toks->n != (uint64_t)ck->c.vocab_size)
        return pd_error("%s: the tokenizer has %llu tokens but token_embd.weight has %d rows", g->path,
                        (unsigned long long)toks->n, ck->c.vocab_size);
    if (gguf_write_vocab(g, &ck->tok, &ck->tok_len) || ck_check_tokenizer(ck, ck->tok, ck->tok_len, "gguf", g->path))
        return -1;
    snprintf(ck->tok_kind, sizeof ck->tok_kind, "gguf");
    GgufStr t;
    const GgufKV *tmpl = gguf_find(g, "tokenizer.chat_template");
    if (tmpl) {
        if (gguf_get_str(g, "tokenizer.chat_template", &t)) return -1;
        if (!(ck->chat_template = strndup(t.s, t.len))) return pd_error("%s: out of memory", g->path);
    }
    return 0;
}

static int gguf_model_from(Checkpoint *ck, const Gguf *g) {
    memset(ck, 0, sizeof *ck);
    GgufStr a;
    if (gguf_get_str(g, "general.architecture", &a)) return -1;
    char arch[32];
    snprintf(arch, sizeof arch, "%.*s", (int)(a.len < 31 ? a.len : 31), a.s);
    if (strlen(arch) != a.len || (strcmp(arch, "llama") && strcmp(arch, "qwen2")))
        return pd_error("%s: GGUF architecture '%.*s' is not supported (paradec reads 'llama' and 'qwen2')", g->path,
                        (int)(a.len > 40 ? 40 : a.len), a.s);
    Src s = {g, arch, pd_alloc(g->n_tensors + 1)};
    if (!s.used) return -1;
    /* llama.cpp permutes q/k for 'llama' only; qwen2 keeps HF's rotate-half rows */
    int rc = read_config(&ck->c, &s) || read_tensors(ck, &s, !strcmp(arch, "llama")) || read_vocab(ck, g) ? -1 : 0;
    free(s.used);
    if (rc) ck_free(ck);
    return rc;
}

int gguf_read_model(Checkpoint *ck, const char *path) {
    Gguf g;
    memset(ck, 0, sizeof *ck);
    if (gguf_open(&g, path)) return -1;
    int rc = gguf_model_from(ck, &g);
    gguf_close(&g);
    return rc;
}

int gguf_read_model_mem(Checkpoint *ck, const void *bytes, size_t n, const char *what) {
    Gguf g;
    memset(ck, 0, sizeof *ck);
    if (gguf_parse(&g, bytes, n, what)) return -1;
    int rc = gguf_model_from(ck, &g);
    gguf_close(&g);
    return rc;
}
