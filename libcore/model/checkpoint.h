/* checkpoint.h — a model held in memory under Hugging Face names, each tensor as f32 or
   as raw blocks of a block type (a GGUF's Q4_1 matrices, kept as they are): what
   importers produce (import/: llama2.c .bin, Hugging Face directories, GGUF; paradec
   files), what widen transforms (f32 only), and what becomes a paradec model file.
   q_proj/k_proj rows are always in Hugging Face's rotate-half order; importers of other
   orders permute (whole rows, so blocks permute as they are). */
#ifndef PD_CHECKPOINT_H
#define PD_CHECKPOINT_H
#include "model/model.h"

typedef struct {
    char *name;
    int ndim;
    int64_t shape[2];
    float *data; /* [shape[0]][shape[1]]; NULL when the tensor is raw blocks */
    DType dtype; /* DT_F32 (data), or a block type: raw holds the matrix */
    void *raw;   /* [shape[0]][dtype_row_bytes(dtype, shape[1])] */
    size_t nraw; /* bytes of raw */
} CkTensor;

typedef struct {
    Config c;
    int n, cap;
    CkTensor *t;
    unsigned char *tok; /* tokenizer file bytes */
    size_t tok_len;
    char tok_kind[16];   /* "llama2c", "hf-json" (tokenizer.json), "gguf" (vocabulary-only GGUF) */
    char *chat_template; /* the source's Jinja chat template, or NULL */
} Checkpoint;

/* a new zeroed tensor (rows == 0 for a vector of cols); NULL + message on failure */
float *ck_add(Checkpoint *ck, const char *name, int64_t rows, int64_t cols);
/* a new matrix of raw blocks of block type dt, uninitialised; NULL + message on failure */
void *ck_add_raw(Checkpoint *ck, const char *name, DType dt, int64_t rows, int64_t cols);
/* a raw tensor dequantized into data (formats/quant.c), raw freed; a no-op for f32 */
int ck_dequant(CkTensor *t);
CkTensor *ck_get(const Checkpoint *ck, const char *name);
void ck_free(Checkpoint *ck);
/* a tokenizer file, its kind told by its content: a JSON object (tokenizer.json,
   .gz read inflated) is "hf-json", a GGUF file (vocabulary-only or a whole model)
   becomes a vocabulary-only GGUF of kind "gguf", anything else a llama2.c
   tokenizer.bin; checked by ck_check_tokenizer */
int ck_set_tokenizer(Checkpoint *ck, const char *path);
/* tokenizer bytes of a kind load, and their vocabulary is the model's (a tokenizer.json's
   may be smaller: Qwen2 pads its embedding) */
int ck_check_tokenizer(const Checkpoint *ck, const void *bytes, size_t n, const char *kind, const char *what);

/* a model file written one tensor at a time (what ck_write_model and widen share):
   weights go out in dt (F32, BF16, a block type, or DT_KEEP; norm gains and biases stay
   F32, and with a block type every vector too), each hashed into the digest (and into paradec.digests, one
   per tensor); a weight that is not finite is refused. With a block type, the 2-d
   weights are quantized by formats/quant.c; DT_KEEP writes f32 as F32 and raw blocks as
   they are. Raw blocks given to a writer of another dt are dequantized first (then
   quantized again for another block type). F32 data and raw blocks written as they are
   are referenced until commit; converted copies are the writer's. */
#define DT_KEEP DT_COUNT
typedef struct {
    TfWriter *w;
    char *path;
    struct XXH3_state_s *hash;
    DType dt;
    void **owned; /* converted copies */
    int n_owned, cap;
    const char *chat_template; /* set before commit to store it as paradec.chat_template */
    const char *const *meta;   /* set before commit: n_meta more key/value pairs
                                  (meta[2i], meta[2i+1]), e.g. paradec.draft_of */
    int n_meta;
    const char *kind; /* paradec.kind, NULL: model (a head made of layers: eagle-head) */
} ModelWriter;
int mw_begin(ModelWriter *mw, const char *path, DType dt);
int mw_add(ModelWriter *mw, const char *name, int ndim, const int64_t shape[2], const float *data);
/* a matrix of raw blocks of block type bt, shape [rows, cols] */
int mw_add_raw(ModelWriter *mw, const char *name, DType bt, const int64_t shape[2], const void *bytes);
/* the tokenizer (tok NULL: none) and the metadata, then the atomic rename; frees mw either way */
int mw_commit(ModelWriter *mw, const Config *c, const unsigned char *tok, size_t tok_len, const char *tok_kind);
void mw_abort(ModelWriter *mw);

/* write a model file: weights in dt (as mw_begin says; norm gains stay F32), metadata
   paradec.kind=model, paradec.config, paradec.digest (of the tensors as written,
   model_digest_update), paradec.digests (tfw_record_digests), paradec.chat_template
   when the checkpoint has one */
int ck_write_model(const Checkpoint *ck, const char *path, DType dt);
/* read a model file back into f32 tensors (for widen and draft models): a file of
   block types is refused ("widen needs f32 or bf16 weights: widen first, then convert
   --dtype") */
int ck_read_model(Checkpoint *ck, const char *path);
/* a model file as a convert source: f32/bf16/f16 tensors as f32, block tensors raw */
int ck_read_model_blocks(Checkpoint *ck, const char *path);

/* permute q/k rows between Meta's interleaved pairs and HF's rotate-half halves
   (to_hf = 1: Meta → HF; 0: back) */
int rope_rows_permute(float *w, int n_heads, int head_dim, int cols, int to_hf);
/* the same for rows of any row_bytes (raw blocks) */
int rope_rows_permute_bytes(void *w, int n_heads, int head_dim, size_t row_bytes, int to_hf);

#endif
