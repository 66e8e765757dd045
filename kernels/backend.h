/* backend.h — the compute kernels libcore calls; kernels/cpu implements them (and
   kernels/cuda, where nvcc exists). Every kernel is batch-invariant by construction:
   the value computed for one token never depends on how many other tokens share
   the call, because each output element has one fixed reduction order. */
#ifndef PD_BACKEND_H
#define PD_BACKEND_H
#include <stddef.h>
#include <stdint.h>

/* weight storage the matmul reads directly. The quantized types are GGUF's blocks
   (ggml's byte layouts) exactly as a GGUF file stores them, rows one after another, a
   row of cols elements in ceil(cols / block) blocks (a short row's last block padded
   with zero elements); blocks may lie at any byte address. */
typedef enum { WT_F32, WT_BF16, WT_Q8_0, WT_Q4_0, WT_Q4_1, WT_Q5_0, WT_Q4_K, WT_Q5_K, WT_Q6_K, WT_COUNT } WType;
int k_wtype_quant(WType wt); /* one of the block types */

/* thread pool; n_threads ≥ 1 (the caller's thread counts as one) */
int k_init(int n_threads);
int k_threads(void);
/* what --version says: the backends compiled in ("cpu"), the instruction sets the
   kernels were compiled for ("avx512f avx512bw ..." or "scalar") */
const char *k_backends(void);
const char *k_cpu_features(void);

/* weights repacked into the layout k_matmul reads (the backend's choice); W is
   row-major [rows][cols], as Hugging Face stores Linear. The packed form of a block
   type indexes its sources, which must outlive it, and may hold a copy laid out for
   the kernels (k_packed_copies: then the kernels read only the copy).

   With block-type weights k_matmul quantizes each row of x to 8 bits first, a rule of
   that row alone (so batch invariance holds): per 32 elements for Q8_0/Q4_0/Q4_1, per
   256 for the K types; the integer block sums are exact, and each output is one fixed
   sequence of float operations over the row's blocks (kernels/cpu/quant.h says which),
   the same in every path. */
size_t k_packed_bytes(WType wt, int rows, int cols);
/* packs the rows of n_src matrices, one after another, as one [Σ rows][cols] matrix
   (q, k and v share their input; so do gate and up). dst: k_packed_bytes, 64-aligned */
void k_pack(void *dst, WType wt, int cols, int n_src, const void *const *src, const int *src_rows);
/* k_pack of block-type sources whose types may differ (llama.cpp's Q4_K_M keeps v_proj
   in Q6_K where q and k are Q4_K): k_matmul, given any one of them as wt, multiplies
   each source by its own type, each output element's bits as in a one-type matrix.
   Each source of a mixed matrix has at most K_MIXED_MAX_ROWS rows */
#define K_MIXED_MAX_ROWS 16384
void k_pack_blocks(void *dst, int cols, int n_src, const void *const *src, const int *src_rows, const WType *types);
size_t k_packed_bytes_blocks(int cols, int n_src, const int *src_rows, const WType *types);
/* whether k_matmul reads the packed copy alone (the source's pages may go once packed) */
int k_packed_copies(WType wt);
/* y[n][rows] = x[n][cols] · W^T, W packed by k_pack */
void k_matmul(float *y, const float *x, const void *packed, WType wt, int n, int cols, int rows);
/* y[n][dim] = x / rms(x) * g   (per row; eps inside the root) */
void k_rmsnorm(float *y, const float *x, const float *g, int n, int dim, float eps);
/* rotate-half RoPE in place on the first n_heads*head_dim floats of each of n rows,
   stride floats apart; cos/sin tables [pos][head_dim/2] */
void k_rope(float *x, size_t stride, const int32_t *pos, int n, int n_heads, int head_dim, const float *cos_t,
            const float *sin_t);
/* y[i] = silu(a[i]) * b[i] */
void k_silu_mul(float *y, const float *a, const float *b, size_t n);
/* y[i] = silu(x[i]) = x[i] / (1 + e^-x[i]) */
void k_silu(float *y, const float *x, size_t n);
/* y[i] += x[i] */
void k_add(float *y, const float *x, size_t n);
/* the batch forms forward.c calls once per layer (each row the per-row kernel's bits):
   y[i*stride + c] += x[c] (a bias on every row); y[i][c] = silu(gu[i][c]) * gu[i][cols + c]
   (gate | up rows); K/V rows (keys at src + i*src_stride, values v_off floats after)
   into their slots of a layer's blocks, transposed as attention reads them */
void k_add_rows(float *y, size_t stride, const float *x, int n, int cols);
void k_silu_mul_rows(float *y, const float *gu, int n, int cols);
void k_kv_write(float *k, float *v, size_t block_stride, int block_size, int kv_dim, const int *const *table,
                const int32_t *slot, const float *src, size_t src_stride, size_t v_off, int n);
/* what a KV cache stores. KV_BF16: each element rounded to bf16 (nearest, ties to even;
   a NaN stays a quiet NaN). KV_Q8_0: per slot and kv head (the head_dim values one
   token writes for one kv head) one f32 scale d = amax / 127 (amax the largest |x|, an
   IEEE division) and int8 q = nearbyintf(x / d) (ties to even; 0 where d = 0 or x / d
   is NaN; clamped to ±127). Attention reads an element as the widened bf16 (exact) or
   as d * (float)q (one rounding), then runs exactly the f32 cache's arithmetic. */
typedef enum { KV_F32, KV_BF16, KV_Q8_0, KV_COUNT } KVType;
/* k_kv_write into a cache of type t: k, v the layer's block 0 of elements of t
   (float, uint16_t bf16 bits, int8_t); ks, vs (q8_0 only) the layer's block 0 of scales
   [n_kv][block_size], scale_stride floats from one block's scales to the next */
void k_kv_write_typed(KVType t, void *k, void *v, float *ks, float *vs, size_t block_stride, size_t scale_stride,
                      int block_size, int n_kv, int hd, const int *const *table, const int32_t *slot, const float *src,
                      size_t src_stride, size_t v_off, int n);
/* row of weights (any WType, unpacked: as in the file) → f32; a block type's element is
   its scale times its integer (plus its minimum), one rounding each, as ggml's
   dequantize_row_* computes it */
void k_row_to_f32(float *y, const void *w, WType wt, size_t row, int cols);

/* attention over a paged KV cache. Token t sees its sequence's committed slots
   0..n_ctx[t]-1, then the slots extra[extra_off[t] .. extra_off[t+1]-1] (the visible
   tokens of its batch, itself last), in that order:
     out[h] = Σ_j softmax_j(q_h·k_j * scale) v_j     for the kv head of h.
   A block holds block_size slots of one layer, keys and values each transposed:
   [kv_dim][block_size]. A score is the sequential FMA chain over the head's
   dimensions and the weighted sum keeps 16 partial sums by key index mod 16, in
   every path, so a token's result never depends on the batch.
   FlashDecoding: a token with more than ATT_SPLIT keys splits them by key index into
   chunks c of ATT_SPLIT (the last shorter), a function of its keys alone, never of
   the batch or the threads. Each chunk is computed as a token with only those keys
   would be (its maximum m_c, its sum s_c, its weighted sums o_c before the division),
   in parallel, and recombined in chunk order:
     m = max1(... max1(m_0, m_1) ..., m_last)
     w_c = exp1(m_c - m), sum = fmaf(s_c, w_c, sum), o[d] = fmaf(o_c[d], w_c, o[d])
     out[d] = o[d] * (1 / sum)
   which needs room for the chunks (split; a CPU caller may pass NULL: its own). */
#ifndef ATT_SPLIT /* a benchmark's build may set it (-DATT_SPLIT=65536: unsplit) */
#define ATT_SPLIT 256
#endif
typedef struct {
    int n;                 /* tokens in the call */
    int n_heads, n_kv, hd; /* q heads, kv heads, head size */
    float scale;
    const float *q; /* [n] rows of n_heads*hd, q_stride floats apart */
    size_t q_stride;
    float *out;          /* [n][n_heads*hd] */
    const float *k, *v;  /* this layer's block 0 (keys, values) */
    size_t block_stride; /* floats from one block of the layer to the next */
    int block_size;
    const int *const *table; /* [n] the block table of each token's sequence */
    const int *n_ctx;        /* [n] */
    const int *extra_off;    /* [n+1] */
    const int *extra;        /* slots */
    /* a bf16 or q8_0 cache (kv_type 0, f32, reads k and v): its elements kq, vq (this
       layer's block 0, block_stride elements apart) and, for q8_0, the scales (this
       layer's block 0, [n_kv][block_size], scale_stride floats apart) */
    KVType kv_type;
    const void *kq, *vq;
    const float *k_scale, *v_scale;
    size_t scale_stride;
    /* room for split tokens' chunks (o_c, m_c, s_c): [split_tokens][n_heads][max_chunks][hd + 2];
       the call goes split_tokens tokens at a time (ATT_SPLIT_TOKENS is plenty of work) */
    float *split;
    int max_chunks; /* ≥ any token's chunks */
    int split_tokens;
} AttnArgs;
#define ATT_SPLIT_TOKENS 16
#ifdef __CUDACC__ /* the CUDA kernels split the same way */
#define PD_HOST_DEVICE __host__ __device__
#else
#define PD_HOST_DEVICE
#endif
static inline PD_HOST_DEVICE int attn_chunks(int keys) {
    return keys <= ATT_SPLIT ? 1 : (keys + ATT_SPLIT - 1) / ATT_SPLIT;
}
void k_attention(const AttnArgs *a);
/* the same, with extra holding offsets from n_ctx[t] instead of slots: a list that holds
   in every layer, however full each is (the step descriptor's); same bits */
void k_attention_rel(const AttnArgs *a);

/* reads n floats with every thread and returns their sum: the read-bandwidth probe
   the benchmarks divide by */
double k_stream_sum(const float *x, size_t n);

/* an approximate y[rows] = x[cols] · W^T in 8-bit integers (W per-row scaled, x per
   call), for drafts only (kernels/cpu/qmatvec.c); cols ≤ 4096. W row-major; pack
   returns -1 for cols out of range */
size_t k_q8_bytes(int rows, int cols);
int k_q8_pack(void *dst, const float *w, int rows, int cols);
void k_q8_matvec(float *y, const float *x, const void *packed, int rows, int cols);

float k_softmax(float *x, int n); /* in place; returns the max logit */
/* x[i] = exp(x[i] - max) in place; returns their sum (softmax without the division) */
float k_exp_sum(float *x, int n, float *max_out);
int k_argmax(const float *x, int n); /* lowest index among equal maxima */

#endif
