/* matmul.cu — k_matmul (kernels/cpu/matmul.c) for f32 and bf16 weights, bit for bit, on
   k_pack's layout (and for the GGUF block types on the file's blocks: below): blocks of up to 64 rows (4
   panels of 16), column-major inside a block (for each column the block's W rows side by
   side; bf16 as column pairs, the even column in the low half of each 32-bit word). One
   thread per (token, row), one CUDA block per (64-row block, token): the row's two FMA
   chains, even and odd columns each in column order, added at the end, as the spec.
   Neighbouring threads read neighbouring rows of a column, one coalesced line. */
#include "cuda_kernels.h"
#include "spec.cuh"

#define PANEL 16
#define BLOCK_ROWS 64 /* PANEL * matmul.c's BLOCK */

static __global__ void matmul_kernel(float *y, const float *x, const void *w, WType wt, int cols, int rows) {
    int b = blockIdx.x, t = blockIdx.y, q = threadIdx.x, r0 = b * BLOCK_ROWS;
    int left = (rows - r0 + PANEL - 1) / PANEL, W = (left < 4 ? left : 4) * PANEL; /* the block's width */
    if (r0 + q >= rows) return;
    const float *xt = x + (size_t)t * cols;
    float a = 0.0f, o = 0.0f;
    if (wt == WT_F32) {
        const float *P = (const float *)w + (size_t)b * BLOCK_ROWS * cols + q;
        for (int c = 0; c < cols; c++) {
            float wc = P[(size_t)c * W];
            if (c & 1) o = __fmaf_rn(xt[c], wc, o);
            else a = __fmaf_rn(xt[c], wc, a);
        }
    } else {
        const uint32_t *P = (const uint32_t *)w + (size_t)b * BLOCK_ROWS * ((cols + 1) / 2) + q;
        for (int c = 0; c < cols; c += 2) {
            uint32_t pair = P[(size_t)(c / 2) * W];
            a = __fmaf_rn(xt[c], bits_f32(pair << 16), a);
            if (c + 1 < cols) o = __fmaf_rn(xt[c + 1], bits_f32(pair & 0xffff0000u), o);
        }
    }
    y[(size_t)t * rows + r0 + q] = a + o;
}

/* The 32-element block types (kernels/cpu/quant.h's rule) on the file's rows of blocks,
   the row's blocks in order: a CUDA block per (64 rows, token) quantizes the token's x
   into shared memory (a block of 32 per thread: amax, d = amax / 127, q = rint(x / d)
   clamped, and Σ q), then each thread its row's chain acc = fmaf(dw * dx, (float)Σ qw·qx,
   acc), Q4_1 then acc = fmaf(mw * dx, (float)Σ qx, acc). The integer sums are exact in
   any order. */
/* Σ qw·qx over one block: Q8_0's int8; Q4_0's nibble − 8, Q4_1's nibble (element j in
   the low nibble of byte j, j + 16 in its high); Q5_0's nibble | fifth bit << 4, − 16 */
static __device__ int32_t q32_dot(WType wt, const uint8_t *blk, const int8_t *qx) {
    int32_t s = 0;
    if (wt == WT_Q8_0) {
        for (int k = 0; k < QK; k++) s += (int32_t)(int8_t)blk[2 + k] * qx[k];
    } else if (wt == WT_Q5_0) {
        uint32_t qh = q5_high(blk);
        for (int k = 0; k < QK / 2; k++)
            s += (((blk[6 + k] & 15) | (int)(qh >> k & 1) << 4) - 16) * qx[k] +
                 (((blk[6 + k] >> 4) | (int)(qh >> (k + 16) & 1) << 4) - 16) * qx[k + QK / 2];
    } else {
        const uint8_t *qs = blk + (wt == WT_Q4_1 ? 4 : 2);
        int off = wt == WT_Q4_0 ? 8 : 0;
        for (int k = 0; k < QK / 2; k++) s += ((qs[k] & 15) - off) * qx[k] + ((qs[k] >> 4) - off) * qx[k + QK / 2];
    }
    return s;
}
static __global__ void matmul_q32_kernel(float *y, size_t ldy, const float *x, const uint8_t *w, WType wt, int cols,
                                         int rows) {
    int t = blockIdx.y, q = threadIdx.x, r = blockIdx.x * BLOCK_ROWS + q, nb = (cols + QK - 1) / QK;
    CUEMU_DYN_SHARED(float, dx);      /* [nb] */
    float *sx = dx + nb;              /* [nb] Σ q, as a float */
    int8_t *qx = (int8_t *)(sx + nb); /* [nb][32] */
    const float *xt = x + (size_t)t * cols;
    for (int b = q; b < nb; b += BLOCK_ROWS) {
        int32_t sum;
        dx[b] = q8_block(xt + b * QK, cols - b * QK, qx + b * QK, &sum);
        sx[b] = (float)sum;
    }
    __syncthreads();
    if (r >= rows) return;
    int bb = q_block_bytes(wt);
    const uint8_t *row = w + (size_t)r * nb * bb;
    float a = 0.0f;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = row + (size_t)b * bb;
        a = __fmaf_rn(f16_f32(blk) * dx[b], (float)q32_dot(wt, blk, qx + b * QK), a);
        if (wt == WT_Q4_1) a = __fmaf_rn(f16_f32(blk + 2) * dx[b], sx[b], a);
    }
    y[(size_t)t * ldy + r] = a;
}

/* The K types (quant.h's rule, quant_k.c's spec) on the file's rows of super-blocks: x
   quantized per 256 elements into shared memory (a super-block per thread), then each
   thread its row's chain over the super-blocks in order: acc = fmaf(d * dx, (float)Σ_j
   sc_j Σ q·qx, acc), and for Q4_K and Q5_K acc = fmaf(-(dmin * dx), (float)Σ_j m_j Σ qx,
   acc) after it */
/* x[0, n) (zeros past it) as 256 int8 by the rule; the scale returned */
static __device__ float qk_x(const float *x, int n, int8_t *q) {
    float amax = 0;
    for (int i = 0; i < n && i < QK_K; i++) amax = max1(fabsf(x[i]), amax);
    float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    for (int i = 0; i < QK_K; i++) {
        float r = i < n ? nearbyintf(x[i] * id) : 0.0f;
        q[i] = (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
    }
    return d;
}
/* one super-block: Σ_j sc_j Σ q·qx into *s, and Σ_j m_j Σ qx into *ms (Q4_K, Q5_K) */
static __device__ void qk_dot(WType wt, const uint8_t *w, const int8_t *qx, int32_t *s_out, int32_t *ms_out) {
    int32_t s = 0, ms = 0;
    if (wt == WT_Q6_K) { /* ql[128], qh[64], int8 sc[16], d: q = 4 low | 2 high bits − 32 */
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w + 64 * h, *qh = w + 128 + 32 * h;
            const int8_t *sc = (const int8_t *)(w + 192 + 8 * h), *x = qx + 128 * h;
            for (int j = 0; j < 8; j++) { /* 16 elements: quarter g, half j & 1 */
                int g = j >> 1, l0 = 16 * (j & 1);
                int32_t p = 0;
                for (int l = l0; l < l0 + 16; l++) {
                    int lo = g & 1 ? ql[l + 32] : ql[l];
                    int v = (g < 2 ? lo & 15 : lo >> 4) | ((qh[l] >> (2 * g)) & 3) << 4;
                    p += (v - 32) * x[l + 32 * g];
                }
                s += sc[j] * p;
            }
        }
    } else { /* d, dmin, scales[12], (Q5_K: qh[32]), qs[128]: 8 sub-blocks of 32 */
        const uint8_t *qh = w + 16, *qs = w + (wt == WT_Q4_K ? 16 : 48);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            int32_t p = 0, sx = 0;
            scale_min_k4(j, w + 4, &sc, &m);
            const uint8_t *q = qs + 32 * (j / 2);
            for (int l = 0; l < 32; l++) {
                int v = j & 1 ? q[l] >> 4 : q[l] & 0xF;
                if (wt == WT_Q5_K) v += (qh[l] >> j & 1) << 4;
                p += v * qx[32 * j + l];
                sx += qx[32 * j + l];
            }
            s += sc * p, ms += m * sx;
        }
    }
    *s_out = s, *ms_out = ms;
}
static __global__ void matmul_qk_kernel(float *y, size_t ldy, const float *x, const uint8_t *w, WType wt, int cols,
                                        int rows) {
    int t = blockIdx.y, q = threadIdx.x, r = blockIdx.x * BLOCK_ROWS + q, nb = (cols + QK_K - 1) / QK_K;
    CUEMU_DYN_SHARED(float, dx);      /* [nb] */
    int8_t *qx = (int8_t *)(dx + nb); /* [nb][256] */
    const float *xt = x + (size_t)t * cols;
    for (int b = q; b < nb; b += BLOCK_ROWS) dx[b] = qk_x(xt + b * QK_K, cols - b * QK_K, qx + b * QK_K);
    __syncthreads();
    if (r >= rows) return;
    int bb = q_block_bytes(wt);
    const uint8_t *row = w + (size_t)r * nb * bb;
    float a = 0.0f;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = row + (size_t)b * bb;
        int32_t s, ms;
        qk_dot(wt, blk, qx + b * QK_K, &s, &ms);
        if (wt == WT_Q6_K) a = __fmaf_rn(f16_f32(blk + 208) * dx[b], (float)s, a);
        else {
            a = __fmaf_rn(f16_f32(blk) * dx[b], (float)s, a);
            a = __fmaf_rn(-(f16_f32(blk + 2) * dx[b]), (float)ms, a);
        }
    }
    y[(size_t)t * ldy + r] = a;
}

void cuda_matmul_ld(float *y, size_t ldy, const float *x, const void *w, WType wt, int n, int cols, int rows) {
    if (n <= 0 || rows <= 0 || cols <= 0) return;
    dim3 grid((rows + BLOCK_ROWS - 1) / BLOCK_ROWS, n);
    if (wt == WT_Q8_0 || wt == WT_Q4_0 || wt == WT_Q4_1 || wt == WT_Q5_0)
        CUEMU_LAUNCH(matmul_q32_kernel, grid, dim3(BLOCK_ROWS), (size_t)(cols + QK - 1) / QK * (2 * sizeof(float) + QK),
                     y, ldy, x, (const uint8_t *)w, wt, cols, rows);
    else if (wt == WT_Q4_K || wt == WT_Q5_K || wt == WT_Q6_K)
        CUEMU_LAUNCH(matmul_qk_kernel, grid, dim3(BLOCK_ROWS),
                     (size_t)(cols + QK_K - 1) / QK_K * (sizeof(float) + QK_K), y, ldy, x, (const uint8_t *)w, wt, cols,
                     rows);
}

void cuda_matmul(float *y, const float *x, const void *packed, WType wt, int n, int cols, int rows) {
    if (wt != WT_F32 && wt != WT_BF16) return cuda_matmul_ld(y, (size_t)rows, x, packed, wt, n, cols, rows);
    if (n <= 0 || rows <= 0 || cols <= 0) return;
    CUEMU_LAUNCH(matmul_kernel, dim3((rows + BLOCK_ROWS - 1) / BLOCK_ROWS, n), dim3(BLOCK_ROWS), 0, y, x, packed, wt,
                 cols, rows);
}

/* one thread an element: block b's (row q, column c) from its column pair to f32's place */
static __global__ void unpack_bf16_kernel(float *dst, const uint32_t *w, int cols, int rows, int r0) {
    int b = r0 / BLOCK_ROWS + blockIdx.y, q = threadIdx.x, c = blockIdx.x, rb = b * BLOCK_ROWS;
    int left = (rows - rb + PANEL - 1) / PANEL, W = (left < 4 ? left : 4) * PANEL;
    if (q >= W) return;
    uint32_t pair = w[(size_t)b * BLOCK_ROWS * ((cols + 1) / 2) + (size_t)(c / 2) * W + q];
    dst[(size_t)(b - r0 / BLOCK_ROWS) * BLOCK_ROWS * cols + (size_t)c * W + q] =
        bits_f32(c & 1 ? pair & 0xffff0000u : pair << 16);
}

void cuda_unpack_bf16(float *dst, const void *packed, int cols, int rows, int r0, int n_rows) {
    if (cols <= 0 || n_rows <= 0) return;
    CUEMU_LAUNCH(unpack_bf16_kernel, dim3(cols, (n_rows + BLOCK_ROWS - 1) / BLOCK_ROWS), dim3(BLOCK_ROWS), 0, dst,
                 (const uint32_t *)packed, cols, rows, r0);
}
