/* gguf.h — llama.cpp's GGUF files (version 2 and 3): metadata key/values and tensor
   infos, validated on open; tensor data stays in the mapping. Readers of metadata
   (the tokenizer, import/gguf_model.c) use the typed getters. */
#ifndef PD_GGUF_H
#define PD_GGUF_H
#include <stddef.h>
#include <stdint.h>

typedef enum {
    GGUF_U8 = 0,
    GGUF_I8,
    GGUF_U16,
    GGUF_I16,
    GGUF_U32,
    GGUF_I32,
    GGUF_F32,
    GGUF_BOOL,
    GGUF_STRING,
    GGUF_ARRAY,
    GGUF_U64,
    GGUF_I64,
    GGUF_F64,
    GGUF_TYPE_COUNT
} GgufType;

typedef struct {
    const char *s; /* not NUL-terminated */
    size_t len;
} GgufStr;

typedef struct {
    GgufStr key;
    GgufType type; /* for arrays: GGUF_ARRAY, and elem the element type */
    GgufType elem;
    uint64_t n;       /* array length (1 for scalars) */
    const void *data; /* scalars and numeric arrays: the raw little-endian values, in the
                           file and unaligned (read them with memcpy) */
    GgufStr *strs;    /* string scalars and string arrays: [n] */
} GgufKV;

/* ggml tensor types paradec reads (others are refused by name) */
enum {
    GGML_F32 = 0,
    GGML_F16 = 1,
    GGML_Q4_0 = 2,
    GGML_Q4_1 = 3,
    GGML_Q5_0 = 6,
    GGML_Q8_0 = 8,
    GGML_Q4_K = 12,
    GGML_Q5_K = 13,
    GGML_Q6_K = 14,
    GGML_BF16 = 30
};

typedef struct {
    char *name;
    int n_dims;
    int64_t dims[4]; /* ggml order: dims[0] is the fastest-varying (a row's length) */
    uint32_t type;
    size_t nbytes;
    const void *data; /* inside the file, checked to lie within it */
} GgufTensor;

typedef struct Gguf {
    char *path;
    uint32_t version;
    int n_kv, n_tensors;
    GgufKV *kv;
    GgufTensor *t;
    GgufStr *strs; /* the pool the keys' strs point into */
    void *map;     /* the file, mapped (or a copy of stdin) */
    size_t map_len;
    int mapped;
} Gguf;

int gguf_open(Gguf *g, const char *path);
/* from bytes already in memory (tests, fuzzing): pointers go into `bytes` */
int gguf_parse(Gguf *g, const void *bytes, size_t n, const char *what);
void gguf_close(Gguf *g);

const GgufKV *gguf_find(const Gguf *g, const char *key); /* NULL when absent */
/* typed scalar getters: -1 + message when absent or of another type (integers of any
   width convert when the value fits) */
int gguf_get_int(const Gguf *g, const char *key, int64_t *out);
int gguf_get_f32(const Gguf *g, const char *key, float *out);
int gguf_get_str(const Gguf *g, const char *key, GgufStr *out);
int gguf_get_bool(const Gguf *g, const char *key, int *out);
const GgufTensor *gguf_tensor(const Gguf *g, const char *name);
/* a tensor's elements as f32 (dequantising the block types by formats/quant.c;
   converting F16, BF16); out holds dims product floats */
int gguf_tensor_f32(const Gguf *g, const GgufTensor *t, float *out);
float gguf_f16_to_f32(uint16_t h); /* IEEE half, every case (subnormals, inf, NaN) */
/* the paradec block type of a ggml type (DT_Q8_0 … DT_Q6_K), -1 for the others */
int gguf_block_dtype(uint32_t type);

/* a vocabulary-only GGUF (version 3, no tensors) holding general.architecture and
   every tokenizer.* key (tokens, scores, types, merges, special ids, pre-tokenizer,
   chat template) — what a model file stores as its tokenizer of kind "gguf".
   *out is malloc'd. */
int gguf_write_vocab(const Gguf *g, unsigned char **out, size_t *n);

#endif
