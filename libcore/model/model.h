/* model.h — a Llama-family decoder: its configuration, its weights, loading. */
#ifndef PD_MODEL_H
#define PD_MODEL_H
#include <stdint.h>

#include "backend.h"
#include "base/util.h"
#include "formats/tensorfile.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    int dim;        /* residual stream width */
    int hidden_dim; /* SwiGLU width */
    int n_layers, n_heads, n_kv_heads, head_dim;
    int vocab_size;
    int seq_len; /* longest context (RoPE table size) */
    float norm_eps, rope_theta;
    int tied;     /* lm_head is the embedding */
    int qkv_bias; /* q/k/v projections carry biases (Qwen2) */
    /* Llama 3.1-style RoPE scaling ("rope_type": "llama3"); rope_factor 0 = none */
    float rope_factor, rope_low_freq, rope_high_freq;
    int rope_orig_ctx;
} Config;

/* config ↔ the JSON stored as paradec.config (Hugging Face key names) */
char *config_to_json(const Config *c); /* malloc'd */
int config_from_json(Config *c, const char *json, const char *what);
int config_check(const Config *c, const char *what); /* sane sizes */
/* a dimension by letter, for tables of tensor shapes: 'D' dim, 'H' hidden, 'Q' heads ×
   head_dim, 'K' kv heads × head_dim; 0 for anything else */
int64_t config_size(const Config *c, char k);
struct json_t;
int rope_scaling_from_json(Config *c, struct json_t *rope_scaling, const char *what);

typedef struct {
    WType t;
    const void *w; /* [rows][cols] as in the file */
    const void *p; /* the same, packed for k_matmul (in Model.packed) */
    int rows, cols;
} Mat;

typedef struct {
    const float *attn_norm;    /* [dim] */
    Mat wq;                    /* [n_heads*hd][dim] */
    Mat wk, wv;                /* [n_kv*hd][dim] */
    Mat wo;                    /* [dim][n_heads*hd] */
    const float *bq, *bk, *bv; /* [n_heads*hd], [n_kv*hd] ×2, or NULL */
    const float *ffn_norm;     /* [dim] */
    Mat w1, w3;                /* gate, up: [hidden][dim] */
    Mat w2;                    /* down: [dim][hidden] */
    Mat qkv;                   /* wq, wk, wv stacked: [(n_heads + 2 n_kv)*hd][dim], packed only */
    Mat gate_up;               /* w1, w3 stacked: [2 hidden][dim], packed only */
} Layer;

typedef struct {
    Config c;
    Mat embed;                  /* [vocab][dim] */
    Layer *layers;              /* [n_layers] */
    const float *final_norm;    /* [dim] */
    Mat lm_head;                /* [vocab][dim] (the embedding when tied) */
    float *rope_cos, *rope_sin; /* [seq_len][hd/2] */
    Tokenizer *tok;
    const char *chat_template; /* the model's Jinja chat template (metadata), or NULL */
    char digest[40];           /* paradec.digest of the tensors */
    TensorFile tf;             /* the weights point into it */
    Arena arena;               /* converted norms, rope tables, layer array */
    Arena packed;              /* every matrix in k_matmul's layout */
} Model;

/* load a model file written by convert/widen (validated: config, every tensor's
   dtype and shape, tokenizer vocabulary = model vocabulary; the weights checked
   against their digests, model_verify, unless pd_verify_weights is 0) */
int model_load(Model *m, const char *path);
/* a model without a tokenizer from a file already open (a draft head's layers:
   heads/eagle_head.h); m takes tf over (model_free closes it); not verified */
int model_load_layers(Model *m, const TensorFile *tf);
/* a model file's (or a bundle's) weights against paradec.digest, the whole-model
   digest, and the per-tensor paradec.digests when the file records them (those name a
   damaged tensor; an older file without them is refused naming only the file) */
int model_verify(const TensorFile *tf);

/* the order convert and widen write weights in: the embedding, the layers in order
   (by name within one), the rest by name (qsort-style) */
int model_tensor_order(const char *a, const char *b);
/* paradec.digest is XXH3-128 (hex: high 64 bits, then low) over the weights in the
   order they were written, every tensor but tokenizer.bytes: per tensor its name and
   its NUL, its dtype (DType as a little-endian int32), its shape as two int64 (a
   vector [n] as [n, 1]) and its bytes as stored; this feeds one weight in */
struct XXH3_state_s;
void model_digest_update(struct XXH3_state_s *s, const char *name, DType dt, const int64_t shape[2], const void *bytes,
                         size_t n);
void model_free(Model *m);
/* a matrix's stored type by its file name ("F32", "BF16", "Q4_K", ...) */
const char *mat_type_name(const Mat *w);
size_t mat_row_bytes(const Mat *w); /* bytes of one row as stored */
int mat_packed_alone(const Mat *w); /* the matmuls read only its packed copy, not w->w */
/* bytes of weights one decode step reads (every matrix once; one embedding row) */
double model_weight_bytes(const Model *m);

/* the names tensors carry (Hugging Face's) */
#define NAME_EMBED "model.embed_tokens.weight"
#define NAME_NORM "model.norm.weight"
#define NAME_LM_HEAD "lm_head.weight"
void layer_tensor_name(char *out, size_t n, int layer, const char *what);

#endif
