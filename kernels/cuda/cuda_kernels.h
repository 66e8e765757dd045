/* cuda_kernels.h — the launchers of kernels/cuda, callable from C. Each takes the
   arguments of the backend.h kernel it reproduces bit for bit (pointers are device
   pointers: host memory under cuemu) and launches on the current stream. The row ops
   read their row count from device memory (rows, int32) when they run, so a captured
   graph can replay them for another count; blocks past it do nothing. */
#ifndef PD_CUDA_KERNELS_H
#define PD_CUDA_KERNELS_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
#include "backend.h"

/* One binary links both builds of these sources: nvcc's (the GPU device) keeps the
   cuda_ names, the host compiler's (cuemu) takes cuemu_ ones. device_cuda.c, a host C
   file calling the GPU's, defines PD_CUDA_GPU_NAMES first. */
#if !defined(__CUDACC__) && !defined(PD_CUDA_GPU_NAMES)
#define cuda_matmul cuemu_matmul
#define cuda_matmul_ld cuemu_matmul_ld
#define cuda_unpack_bf16 cuemu_unpack_bf16
#define cuda_rmsnorm cuemu_rmsnorm
#define cuda_rope cuemu_rope
#define cuda_add cuemu_add
#define cuda_silu cuemu_silu
#define cuda_add_rows cuemu_add_rows
#define cuda_silu_mul_rows cuemu_silu_mul_rows
#define cuda_kv_write_typed cuemu_kv_write_typed
#define cuda_rows_to_f32 cuemu_rows_to_f32
#define cuda_move_cols cuemu_move_cols
#define cuda_attention cuemu_attention
#define cuda_attention_rel cuemu_attention_rel
#define cuda_argmax_rows cuemu_argmax_rows
#define cuda_softmax_rows cuemu_softmax_rows
#define cuda_topk_rows cuemu_topk_rows
#endif

/* k_matmul for WT_F32 and WT_BF16 on k_pack's layout, and for the block types on the
   file's rows of blocks, [rows][ceil(cols / 32 or 256)] blocks (matmul.cu) */
void cuda_matmul(float *y, const float *x, const void *packed, WType wt, int n, int cols, int rows);
/* the block types' product into rows ldy floats apart */
void cuda_matmul_ld(float *y, size_t ldy, const float *x, const void *w, WType wt, int n, int cols, int rows);
/* rows [r0, r0 + n_rows) (r0 a multiple of 64) of a bf16 matrix on k_pack's layout as
   the f32 one's layout would hold them, widened exactly (the cuBLAS path's input) */
void cuda_unpack_bf16(float *dst, const void *packed, int cols, int rows, int r0, int n_rows);
/* ops.cu / rmsnorm.cu: the element-wise and per-row kernels of backend.h */
void cuda_rmsnorm(float *y, const float *x, const float *g, int n, int dim, float eps);
void cuda_rope(float *x, size_t stride, const int32_t *pos, int n, int n_heads, int head_dim, const float *cos_t,
               const float *sin_t);
void cuda_add(float *y, const float *x, size_t n);
void cuda_silu(float *y, const float *x, size_t n);
void cuda_add_rows(float *y, size_t stride, const float *x, int n, int cols);
void cuda_silu_mul_rows(float *y, const float *gu, int n, int cols);
void cuda_kv_write_typed(KVType t, void *k, void *v, float *ks, float *vs, size_t block_stride, size_t scale_stride,
                         int block_size, int n_kv, int hd, const int *const *table, const int32_t *slot,
                         const float *src, size_t src_stride, size_t v_off, int n);
/* k_row_to_f32 of rows[i] for i < n into y[n][cols] (an embedding lookup), every type */
void cuda_rows_to_f32(float *y, const void *w, WType wt, const int32_t *rows, int n, int cols);
/* dev_move_cols_elem over device memory: for the count (read from count) pairs
   {src, dst} of list, in order, len elements of elem_bytes strided stride apart */
void cuda_move_cols(void *base, const int64_t *list, const int32_t *count, int max_count, int len, size_t stride,
                    int elem_bytes);
/* attention.cu: k_attention, k_attention_rel (every KVType) */
void cuda_attention(const AttnArgs *a);
void cuda_attention_rel(const AttnArgs *a);
/* rows.cu, over [*rows ≤ max_rows][cols]: ids[r] = k_argmax(x[r]);
   y[r] = k_softmax of x[r] (each element first divided by temp when temp != 0; y may be x);
   ids[r][k], p[r][k] (p may be NULL) the k largest of softmax(x[r]), as device_cpu.c's
   dev_topk_rows: largest first, lower index first among equals, -1 / 0 past the row */
void cuda_argmax_rows(int32_t *ids, const float *x, const int32_t *rows, int max_rows, int cols);
void cuda_softmax_rows(float *y, const float *x, const int32_t *rows, int max_rows, int cols, float temp);
void cuda_topk_rows(int32_t *ids, float *p, const float *x, const int32_t *rows, int max_rows, int cols, int k);

/* the weight types cuda_matmul multiplies */
static inline int cuda_has_wtype(WType wt) { return wt >= WT_F32 && wt < WT_COUNT; } /* all of them */
/* device.h's KernelSet over these launchers, as cuemu's (device_cpu.c) and the GPU's
   (device_cuda.c) share it, each naming its own build of them */
#define CUDA_KERNEL_SET                                                                                                \
    .has_wtype = cuda_has_wtype, .file_blocks = 1, .matmul = cuda_matmul, .matmul_ld = cuda_matmul_ld,                 \
    .rmsnorm = cuda_rmsnorm, .rope = cuda_rope, .add = cuda_add, .add_rows = cuda_add_rows,                            \
    .silu_mul_rows = cuda_silu_mul_rows, .kv_write = cuda_kv_write_typed, .attention_rel = cuda_attention_rel,         \
    .rows_to_f32 = cuda_rows_to_f32, .move_cols = cuda_move_cols, .argmax_rows = cuda_argmax_rows,                     \
    .softmax_rows = cuda_softmax_rows, .topk_rows = cuda_topk_rows

#ifdef __cplusplus
}
#endif
#endif
