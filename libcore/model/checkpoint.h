/* checkpoint.h — a model held in memory as f32 tensors under Hugging Face names:
   what importers produce (import/: llama2.c .bin, Hugging Face directories, GGUF), what
   widen transforms, and what becomes a paradec model file. q_proj/k_proj rows are
   always in Hugging Face's rotate-half order; importers of other orders permute. */
#ifndef PD_CHECKPOINT_H
#define PD_CHECKPOINT_H
#include "model/model.h"

typedef struct {
    char *name;
    int ndim;
    int64_t shape[2];
    float *data; /* [shape[0]][shape[1]] */
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
   weights go out in dt (F32 or BF16; norm gains stay F32), each hashed into the
   digest (and into paradec.digests, one per tensor); a weight that is not finite is
   refused. F32 data is referenced until commit; BF16 copies are the writer's. */
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
} ModelWriter;
int mw_begin(ModelWriter *mw, const char *path, DType dt);
int mw_add(ModelWriter *mw, const char *name, int ndim, const int64_t shape[2], const float *data);
/* the tokenizer and the metadata, then the atomic rename; frees mw either way */
int mw_commit(ModelWriter *mw, const Config *c, const unsigned char *tok, size_t tok_len, const char *tok_kind);
void mw_abort(ModelWriter *mw);

/* write a model file: weights in dt (F32 or BF16; norm gains stay F32), metadata
   paradec.kind=model, paradec.config, paradec.digest (of the tensors as written,
   model_digest_update), paradec.digests (tfw_record_digests), paradec.chat_template
   when the checkpoint has one */
int ck_write_model(const Checkpoint *ck, const char *path, DType dt);
/* read a model file back into f32 tensors (for widen) */
int ck_read_model(Checkpoint *ck, const char *path);

/* permute q/k rows between Meta's interleaved pairs and HF's rotate-half halves
   (to_hf = 1: Meta → HF; 0: back) */
int rope_rows_permute(float *w, int n_heads, int head_dim, int cols, int to_hf);

#endif
