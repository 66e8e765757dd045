/* tensorfile.h — safetensors files, plain (memory-mapped) or zstd-compressed (.zst,
   streamed, so "-" works as stdin/stdout). The standard format, nothing home-made:
   `zstd -d x.safetensors.zst` gives a file any safetensors reader opens.

   Reading validates everything before any tensor is touched: header length and
   JSON, dtype names, shapes (non-negative, product fits), data offsets (in range,
   matching dtype×shape, not overlapping) and the file size. A bad file is refused
   with a one-line message "path: what is wrong". */
#ifndef PD_TENSORFILE_H
#define PD_TENSORFILE_H
#include <stddef.h>
#include <stdint.h>

/* The quantized types are GGUF's blocks (ggml's layouts, byte for byte), a row of cols
   elements held as ceil(cols / block) blocks one after another; a short row's last block
   is padded with zero elements (GGUF itself allows only whole blocks, so only such rows
   cannot be written back as GGUF). In a file a quantized tensor is stored as safetensors
   "U8" [rows][row bytes], and metadata "paradec.quant" (a JSON object: tensor name →
   [type name, cols]) says what it holds, so any safetensors reader still opens the file;
   in memory the Tensor has the quantized dtype and its logical shape [rows][cols]. */
typedef enum {
    DT_F32,
    DT_F16,
    DT_BF16,
    DT_U8,
    DT_I8,
    DT_I32,
    DT_I64, /* safetensors' own */
    DT_Q8_0,
    DT_Q4_0,
    DT_Q4_1,
    DT_Q5_0,
    DT_Q4_K,
    DT_Q5_K,
    DT_Q6_K, /* GGUF blocks */
    DT_COUNT
} DType;
#define TF_QUANT_KEY "paradec.quant"
const char *dtype_name(DType t);      /* safetensors spelling ("F32", "BF16", ...), GGUF's for blocks ("Q4_K") */
int dtype_parse(const char *s);       /* a safetensors dtype: -1 when unknown (and for the block types) */
int dtype_parse_quant(const char *s); /* "Q4_K" or "q4_k" → DT_Q4_K; -1 when not a block type */
size_t dtype_size(DType t);           /* bytes per element; 0 for the block types */
int dtype_is_quant(DType t);
int dtype_block(DType t);                      /* elements per block (32 or 256); 1 for the others */
size_t dtype_block_bytes(DType t);             /* bytes per block (Q4_1: 20); dtype_size for the others */
size_t dtype_row_bytes(DType t, int64_t cols); /* ceil(cols / block) blocks; SIZE_MAX on overflow */

#define TF_MAX_DIMS 8
typedef struct {
    char *name;
    DType dtype;
    int ndim;
    int64_t shape[TF_MAX_DIMS];
    size_t nbytes;
    const void *data; /* points into the mapping or the decompressed buffer */
} Tensor;

typedef struct {
    char *path;
    int n;
    Tensor *t;       /* [n], in file order */
    char **meta_key; /* [n_meta] __metadata__ (string → string, as safetensors says) */
    char **meta_val;
    int n_meta;
    /* storage: either a read-only mapping or a malloc'd buffer */
    void *map;
    size_t map_len;
    int file_backed; /* map is the file's own pages (a dropped page reads back from it), not anonymous */
    char *buf;
} TensorFile;

/* open `path` ("-" = stdin); zstd is recognised by its magic number, not the name.
   Plain files are mmap'ed; compressed ones are decompressed into memory. */
int tf_open(TensorFile *tf, const char *path);
/* the same from bytes already in memory (takes nothing; `what` names it in errors).
   The tensors point into `bytes`, which must outlive tf. For fuzzing and tests. */
int tf_parse(TensorFile *tf, const void *bytes, size_t n, const char *what);
/* what tf_open does with a file's bytes, from memory: plain or zstd (by the magic),
   loaded into memory tf owns (nothing of `bytes` is kept). For fuzzing and tests. */
int tf_load(TensorFile *tf, const void *bytes, size_t n, const char *what);
void tf_close(TensorFile *tf);
/* the tensors and metadata whose names start with prefix, the prefix cut off: a view
   that owns its names and metadata but shares src's tensor data (valid while src is
   open); tf_close frees what the view owns. For the head sets inside a bundle. */
int tf_view(TensorFile *dst, const TensorFile *src, const char *prefix);
const Tensor *tf_get(const TensorFile *tf, const char *name); /* NULL when absent */
const char *tf_meta(const TensorFile *tf, const char *key);   /* NULL when absent */
/* the tensor, checked: must exist with this dtype and shape, else -1 + message */
int tf_expect(const TensorFile *tf, const char *name, DType dt, int ndim, const int64_t *shape, const Tensor **out);

/* ---- checked weights: per-tensor digests ----
   A writer asked to (tfw_record_digests) stores metadata "paradec.digests": a JSON
   array of [name, XXH3-64 of the tensor's bytes as stored, 16 hex digits], one pair per
   tensor in the order they were added. Loaders check them (model_load also checks the
   whole-model paradec.digest) unless pd_verify_weights is 0 (the tools' --no-verify);
   a tool sets it once, before loading anything. */
extern int pd_verify_weights;
#define TF_DIGESTS_KEY "paradec.digests"
typedef struct {
    const Tensor *t;
    uint64_t digest; /* as recorded */
} TfDigest;
uint64_t tf_tensor_digest(const Tensor *t);
/* the recorded list, its tensors looked up: *d = NULL, *n = 0 when the file records
   none; -1 + message when it is malformed or names a tensor the file lacks. free(*d) */
int tf_digests(const TensorFile *tf, TfDigest **d, int *n);
/* -1 + "path: tensor 'x' is damaged ..." for the first whose bytes do not match */
int tf_check_digests(const TensorFile *tf, const TfDigest *d, int n);
/* all of it for a file that is just its tensors (a head set, or a view of one):
   0 when nothing is recorded (*recorded = 0) or everything matches and every tensor
   is listed; a no-op when pd_verify_weights is 0. recorded may be NULL */
int tf_verify(const TensorFile *tf, int *recorded);

/* ---- writing: atomic (temp file, rename on commit); "-" streams to stdout ---- */
typedef struct TfWriter TfWriter;
/* compress: 1 = zstd, 0 = plain, -1 = decide by name (".zst" suffix or "-" → zstd) */
TfWriter *tfw_begin(const char *path, int compress);
int tfw_meta(TfWriter *w, const char *key, const char *value);
/* data is referenced, not copied: it must stay valid until tfw_commit */
int tfw_add(TfWriter *w, const char *name, DType dt, int ndim, const int64_t *shape, const void *data);
/* at commit, hash every tensor into paradec.digests (above), replacing any set before */
void tfw_record_digests(TfWriter *w);
int tfw_commit(TfWriter *w); /* writes everything, renames; frees w */
void tfw_abort(TfWriter *w); /* leaves no output; frees w */

#endif
