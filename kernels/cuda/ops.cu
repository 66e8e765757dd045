/* ops.cu — the element-wise kernels of kernels/cpu/ops.c and the KV write of
   attention.c, bit for bit: each output element is computed as the scalar spec does,
   one thread an element (or a kv head's q8_0 block, which shares one scale). */
#include "cuda_kernels.h"
#include "spec.cuh"

#define THREADS 256

static unsigned blocks_for(size_t n) { return (unsigned)((n + THREADS - 1) / THREADS); }

/* rope_row: a = x[k], b = x[k + half] → a c - b s, a s + b c; one thread a pair */
static __global__ void rope_kernel(float *x, size_t stride, const int32_t *pos, int n_heads, int hd, const float *cos_t,
                                   const float *sin_t) {
    int half = hd / 2, t = blockIdx.y;
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= n_heads * half) return;
    int h = p / half, k = p % half;
    float *v = x + (size_t)t * stride + (size_t)h * hd;
    const float *c = cos_t + (size_t)pos[t] * half, *s = sin_t + (size_t)pos[t] * half;
    float a = v[k], b = v[k + half];
    v[k] = a * c[k] - b * s[k];
    v[k + half] = a * s[k] + b * c[k];
}

static __global__ void add_kernel(float *y, const float *x, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}

static __device__ __forceinline__ float silu1(float a) { return __fdiv_rn(a, 1.0f + exp1(0.0f - a)); }

static __global__ void silu_kernel(float *y, const float *x, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = silu1(x[i]);
}

/* y[t*stride + c] += x[c] */
static __global__ void add_rows_kernel(float *y, size_t stride, const float *x, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < cols) y[(size_t)blockIdx.y * stride + c] += x[c];
}

/* y[t][c] = silu(gu[t][c]) * gu[t][cols + c] */
static __global__ void silu_mul_rows_kernel(float *y, const float *gu, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (c >= cols) return;
    const float *g = gu + (size_t)t * 2 * cols;
    y[(size_t)t * cols + c] = silu1(g[c]) * g[cols + c];
}

/* attention.c's f32_bf16: nearest, ties to even; a NaN stays a quiet NaN, sign kept */
static __device__ __forceinline__ uint16_t to_bf16(float f) {
    uint32_t w = f32_bits(f);
    if ((w & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((w >> 16) | 0x40);
    return (uint16_t)((w + 0x7fffu + ((w >> 16) & 1)) >> 16);
}

/* f32 and bf16: one thread per (token, element of the kv row) */
static __global__ void kv_write_kernel(KVType type, void *k, void *v, size_t block_stride, int block_size, int kv_dim,
                                       const int *const *table, const int32_t *slot, const float *src,
                                       size_t src_stride, size_t v_off) {
    int d = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
    if (d >= kv_dim) return;
    const float *sk = src + (size_t)i * src_stride, *sv = sk + v_off;
    size_t at =
        (size_t)table[i][slot[i] / block_size] * block_stride + (size_t)(slot[i] % block_size) + (size_t)d * block_size;
    if (type == KV_F32) {
        ((float *)k)[at] = sk[d];
        ((float *)v)[at] = sv[d];
    } else {
        ((uint16_t *)k)[at] = to_bf16(sk[d]);
        ((uint16_t *)v)[at] = to_bf16(sv[d]);
    }
}

/* q8_head: amax over the head (sequential), d = amax / 127, q = rint(x / d) clamped */
static __device__ float q8_head(const float *x, int hd, int8_t *q, size_t stride) {
    float amax = 0;
    for (int i = 0; i < hd; i++) {
        float m = fabsf(x[i]);
        amax = m > amax ? m : amax;
    }
    float d = __fdiv_rn(amax, 127.0f);
    for (int i = 0; i < hd; i++) {
        float r = d != 0 ? rintf(__fdiv_rn(x[i], d)) : 0;
        q[(size_t)i * stride] = (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r == r ? r : 0);
    }
    return d;
}

/* q8_0: one thread per (token, kv head, key or value) */
static __global__ void kv_write_q8_kernel(int8_t *k, int8_t *v, float *ks, float *vs, size_t block_stride,
                                          size_t scale_stride, int block_size, int n_kv, int hd,
                                          const int *const *table, const int32_t *slot, const float *src,
                                          size_t src_stride, size_t v_off) {
    int j = blockIdx.x * blockDim.x + threadIdx.x, i = blockIdx.y;
    if (j >= 2 * n_kv) return;
    int h = j / 2, val = j % 2;
    const float *s = src + (size_t)i * src_stride + (val ? v_off : 0) + (size_t)h * hd;
    size_t blk = (size_t)table[i][slot[i] / block_size], col = (size_t)(slot[i] % block_size);
    size_t at = blk * block_stride + col + (size_t)h * hd * block_size;
    float d = q8_head(s, hd, (val ? v : k) + at, (size_t)block_size);
    (val ? vs : ks)[blk * scale_stride + col + (size_t)h * block_size] = d;
}

/* element c of row `row` of a K-type matrix as qk_row_to_f32 (ggml's dequantize_row_q4_K,
   _q5_K, _q6_K) computes it: Q4_K, Q5_K (d·sc)·q − dmin·m; Q6_K (d·sc)·q */
static __device__ float qk_elem(WType wt, const void *w, int32_t row, int cols, int c) {
    int nb = (cols + QK_K - 1) / QK_K, i = c % QK_K;
    const uint8_t *b = (const uint8_t *)w + ((size_t)row * nb + c / QK_K) * q_block_bytes(wt);
    if (wt == WT_Q6_K) {
        int h = i / 128, g = i % 128 / 32, l = i % 32, is = l / 16;
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        const int8_t *sc = (const int8_t *)(b + 192 + 8 * h);
        int lo = g & 1 ? ql[l + 32] : ql[l];
        int q = ((g < 2 ? lo & 15 : lo >> 4) | ((qh[l] >> (2 * g)) & 3) << 4) - 32;
        return f16_f32(b + 208) * (float)sc[is + 2 * g] * (float)q;
    }
    int j = i / 64, hi = i % 64 >= 32, l = i % 32, is = 2 * j + hi, sc, m;
    const uint8_t *s = b + 4, *qh = b + 16, *ql = b + (wt == WT_Q4_K ? 16 : 48) + 32 * j;
    scale_min_k4(is, s, &sc, &m);
    int q = hi ? ql[l] >> 4 : ql[l] & 0xF;
    if (wt == WT_Q5_K && qh[l] >> is & 1) q += 16;
    float d1 = f16_f32(b) * (float)sc, m1 = f16_f32(b + 2) * (float)m;
    return d1 * (float)q - m1;
}

/* k_row_to_f32 of rows[t]: a copy (f32), a widening (bf16), or q32_row_to_f32 (ggml's
   dequantization): Q8_0 q·d, Q4_0 (q − 8)·d, Q4_1 q·d + m (two roundings), Q5_0 (q − 16)·d */
static __global__ void rows_to_f32_kernel(float *y, const void *w, WType wt, const int32_t *rows, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (c >= cols) return;
    if (wt == WT_Q8_0 || wt == WT_Q4_0 || wt == WT_Q4_1 || wt == WT_Q5_0) {
        int k = c % QK, j = k % 16;
        const uint8_t *blk =
            (const uint8_t *)w + ((size_t)rows[t] * ((cols + QK - 1) / QK) + c / QK) * q_block_bytes(wt);
        float d = f16_f32(blk), v;
        if (wt == WT_Q8_0) v = (float)(int8_t)blk[2 + k] * d;
        else {
            const uint8_t *qs = blk + (wt == WT_Q4_0 ? 2 : wt == WT_Q4_1 ? 4 : 6);
            int q = k < 16 ? qs[j] & 15 : qs[j] >> 4;
            if (wt == WT_Q5_0) q |= (int)(q5_high(blk) >> k & 1) << 4;
            v = wt == WT_Q4_1 ? (float)q * d + f16_f32(blk + 2) : (float)(q - (wt == WT_Q4_0 ? 8 : 16)) * d;
        }
        y[(size_t)t * cols + c] = v;
        return;
    }
    if (wt == WT_Q4_K || wt == WT_Q5_K || wt == WT_Q6_K) {
        y[(size_t)t * cols + c] = qk_elem(wt, w, rows[t], cols, c);
        return;
    }
    size_t at = (size_t)rows[t] * cols + c;
    y[(size_t)t * cols + c] =
        wt == WT_F32 ? ((const float *)w)[at] : bits_f32((uint32_t)((const uint16_t *)w)[at] << 16);
}

/* dev_move_cols_elem's moves, pairs in order (a kept path's later source may be an
   earlier destination): one thread a row j of the columns, every pair in turn; distinct
   slots' columns never share an element, so the rows are independent */
static __global__ void move_cols_kernel(unsigned char *base, const int64_t *list, const int32_t *count, int max_count,
                                        int len, size_t stride, int elem) {
    int j = blockIdx.x * blockDim.x + threadIdx.x, n = *count;
    n = n < 0 ? 0 : n > max_count ? max_count : n;
    if (j >= len) return;
    size_t e = (size_t)elem, at = (size_t)j * stride * e;
    for (int i = 0; i < n; i++) {
        const unsigned char *s = base + (size_t)list[2 * i] * e + at;
        unsigned char *t = base + (size_t)list[2 * i + 1] * e + at;
        for (size_t b = 0; b < e; b++) t[b] = s[b];
    }
}

void cuda_rope(float *x, size_t stride, const int32_t *pos, int n, int n_heads, int head_dim, const float *cos_t,
               const float *sin_t) {
    size_t pairs = (size_t)n_heads * (head_dim / 2);
    if (n > 0 && pairs)
        CUEMU_LAUNCH(rope_kernel, dim3(blocks_for(pairs), n), dim3(THREADS), 0, x, stride, pos, n_heads, head_dim,
                     cos_t, sin_t);
}
void cuda_add(float *y, const float *x, size_t n) {
    if (n) CUEMU_LAUNCH(add_kernel, dim3(blocks_for(n)), dim3(THREADS), 0, y, x, n);
}
void cuda_silu(float *y, const float *x, size_t n) {
    if (n) CUEMU_LAUNCH(silu_kernel, dim3(blocks_for(n)), dim3(THREADS), 0, y, x, n);
}
void cuda_add_rows(float *y, size_t stride, const float *x, int n, int cols) {
    if (n > 0 && cols > 0)
        CUEMU_LAUNCH(add_rows_kernel, dim3(blocks_for(cols), n), dim3(THREADS), 0, y, stride, x, cols);
}
void cuda_silu_mul_rows(float *y, const float *gu, int n, int cols) {
    if (n > 0 && cols > 0) CUEMU_LAUNCH(silu_mul_rows_kernel, dim3(blocks_for(cols), n), dim3(THREADS), 0, y, gu, cols);
}
void cuda_kv_write_typed(KVType t, void *k, void *v, float *ks, float *vs, size_t block_stride, size_t scale_stride,
                         int block_size, int n_kv, int hd, const int *const *table, const int32_t *slot,
                         const float *src, size_t src_stride, size_t v_off, int n) {
    if (n <= 0 || n_kv <= 0 || hd <= 0) return;
    if (t == KV_Q8_0)
        CUEMU_LAUNCH(kv_write_q8_kernel, dim3(blocks_for(2 * (size_t)n_kv), n), dim3(THREADS), 0, (int8_t *)k,
                     (int8_t *)v, ks, vs, block_stride, scale_stride, block_size, n_kv, hd, table, slot, src,
                     src_stride, v_off);
    else
        CUEMU_LAUNCH(kv_write_kernel, dim3(blocks_for((size_t)n_kv * hd), n), dim3(THREADS), 0, t, k, v, block_stride,
                     block_size, n_kv * hd, table, slot, src, src_stride, v_off);
}
void cuda_rows_to_f32(float *y, const void *w, WType wt, const int32_t *rows, int n, int cols) {
    if (n > 0 && cols > 0)
        CUEMU_LAUNCH(rows_to_f32_kernel, dim3(blocks_for(cols), n), dim3(THREADS), 0, y, w, wt, rows, cols);
}
void cuda_move_cols(void *base, const int64_t *list, const int32_t *count, int max_count, int len, size_t stride,
                    int elem_bytes) {
    if (max_count > 0 && len > 0)
        CUEMU_LAUNCH(move_cols_kernel, dim3(blocks_for((size_t)len)), dim3(THREADS), 0, (unsigned char *)base, list,
                     count, max_count, len, stride, elem_bytes);
}
