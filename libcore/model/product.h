/* product.h — the training tools' matrix products on a runner's device:
   y[n][rows] = x[n][cols] · W^T, x and y in host memory, W packed as k_pack lays it out
   (f32 or bf16). The CPU multiplies in place with k_matmul (the bits the trainers had
   before); a GPU uploads x, multiplies by cuBLAS (its matmul_fast: not the exact
   kernels' reduction order, which training does not need) and downloads y; cuemu runs
   the CUDA sources' exact product, so a trainer's results there equal the CPU's bit for
   bit. */
#ifndef PD_PRODUCT_H
#define PD_PRODUCT_H
#include "model/runner.h"

typedef struct {
    WType t;
    int rows, cols;
    const void *host; /* the caller's packed bytes, read in place by a host device */
    DevBuf buf;       /* a device's copy */
    size_t cap;       /* bytes buf holds */
} DevMat;

/* W's k_packed_bytes(t, rows, cols) at packed (64-byte aligned) where r's kernels read
   them: a host device keeps the pointer (leave the bytes unchanged until the next load),
   another device copies them into its buffer, grown when needed. Loading again replaces
   W. -1 + message */
int mat_load(Runner *r, DevMat *M, const void *packed, WType t, int rows, int cols);
void mat_free(Runner *r, DevMat *M);
/* y[n][rows] = x[n][cols] · W^T; -1 + message */
int mat_mul(Runner *r, const DevMat *M, float *y, const float *x, int n);
/* the same by the model's own LM head (logits[n][vocab] of x[n][dim], no final norm) */
int mat_mul_lm_head(Runner *r, float *y, const float *x, int n);

#endif
