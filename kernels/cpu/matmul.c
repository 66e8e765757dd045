/* matmul.c — y[n][rows] = x[n][cols] · W[rows][cols]^T with f32 or bf16 weights.

   Weights are repacked once (k_pack) into blocks of up to 128 rows, column-major
   inside a block: for each column, the block's rows lie side by side, 16 to a
   vector. A row's result is two FMA chains, one over the even columns and one over
   the odd ones, each in column order, added at the end — no horizontal sums. Every
   kernel here (one token, a tile of tokens, any thread split) computes exactly those
   chains, so a token's result never depends on n. Two chains per row keep the FMA
   units busy when a matrix has few rows. bf16 blocks hold a column pair per 32-bit
   lane (even column in the low half), widened by one shift or one mask. */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "pool.h"

#define PANEL 16 /* rows a vector holds */
#define BLOCK 8  /* panels a block holds (128 rows) */

static int block_panels(int rows, int b) {
    int left = (rows - b * PANEL * BLOCK + PANEL - 1) / PANEL;
    return left < BLOCK ? left : BLOCK;
}
static int n_blocks(int rows) { return (rows + PANEL * BLOCK - 1) / (PANEL * BLOCK); }
static int pairs(int cols) { return (cols + 1) / 2; }

/* 32-bit elements (floats, or bf16 pairs) before block b */
static size_t block_offset(WType wt, int b, int cols) {
    return (size_t)b * PANEL * BLOCK * (wt == WT_F32 ? cols : pairs(cols));
}

size_t k_packed_bytes(WType wt, int rows, int cols) {
    size_t padded = (size_t)(rows + PANEL - 1) / PANEL * PANEL;
    return padded * (wt == WT_F32 ? (size_t)cols : (size_t)pairs(cols)) * 4;
}

/* row r of the concatenation of the sources */
static const void *source_row(WType wt, int cols, int n_src, const void *const *src, const int *src_rows, int r) {
    for (int s = 0; s < n_src; r -= src_rows[s++])
        if (r < src_rows[s]) return (const char *)src[s] + (size_t)r * cols * (wt == WT_F32 ? 4 : 2);
    return NULL;
}

void k_pack(void *dst, WType wt, int cols, int n_src, const void *const *src, const int *src_rows) {
    int rows = 0;
    for (int s = 0; s < n_src; s++) rows += src_rows[s];
    memset(dst, 0, k_packed_bytes(wt, rows, cols));
    for (int b = 0; b < n_blocks(rows); b++) {
        int width = block_panels(rows, b) * PANEL, r0 = b * PANEL * BLOCK;
        int nr = rows - r0 < width ? rows - r0 : width;
        for (int q = 0; q < nr; q++) {
            const void *row = source_row(wt, cols, n_src, src, src_rows, r0 + q);
            if (wt == WT_F32) {
                float *P = (float *)dst + block_offset(wt, b, cols);
                for (int c = 0; c < cols; c++) P[(size_t)c * width + q] = ((const float *)row)[c];
            } else {
                uint16_t *P = (uint16_t *)((uint32_t *)dst + block_offset(wt, b, cols));
                for (int c = 0; c < cols; c++) P[((size_t)(c / 2) * width + q) * 2 + (c & 1)] = ((const uint16_t *)row)[c];
            }
        }
    }
}

typedef struct {
    float *y;
    const float *x;
    const void *w; /* packed */
    WType wt;
    int n, cols, rows;
} MatmulJob;

#ifdef __AVX512F__
static inline __m512 bf16_lo(__m512i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)); }
static inline __m512 bf16_hi(__m512i v) { return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000))); }

/* T tokens × G panels (of a block W panels wide): even chain a, odd chain b.
   P points at the first panel; the stride from one column (pair) to the next is W. */
#define KERNEL(T, G)                                                                               \
    static void f32_##T##_##G(float *y, int ystride, const float *x, int cols, const float *P, int W) { \
        __m512 a[T][G], b[T][G];                                                                   \
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)                                                                \
            _Pragma("GCC unroll 8") for (int k = 0; k < G; k++) a[t][k] = b[t][k] = _mm512_setzero_ps();                   \
        int c = 0;                                                                                 \
        for (; c + 1 < cols; c += 2, P += 2 * W)                                                   \
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {                                                          \
                __m512 x0 = _mm512_set1_ps(x[(size_t)t * cols + c]), x1 = _mm512_set1_ps(x[(size_t)t * cols + c + 1]); \
                _Pragma("GCC unroll 8") for (int k = 0; k < G; k++) {                                                      \
                    a[t][k] = _mm512_fmadd_ps(x0, _mm512_load_ps(P + PANEL * k), a[t][k]);         \
                    b[t][k] = _mm512_fmadd_ps(x1, _mm512_load_ps(P + W + PANEL * k), b[t][k]);     \
                }                                                                                  \
            }                                                                                      \
        if (c < cols)                                                                              \
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)                                                            \
                _Pragma("GCC unroll 8") for (int k = 0; k < G; k++)                                                        \
                    a[t][k] = _mm512_fmadd_ps(_mm512_set1_ps(x[(size_t)t * cols + c]), _mm512_load_ps(P + PANEL * k), a[t][k]); \
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)                                                                \
            _Pragma("GCC unroll 8") for (int k = 0; k < G; k++) _mm512_storeu_ps(y + (size_t)t * ystride + PANEL * k, _mm512_add_ps(a[t][k], b[t][k])); \
    }                                                                                              \
    static void bf16_##T##_##G(float *y, int ystride, const float *x, int cols, const uint32_t *P, int W) { \
        __m512 a[T][G], b[T][G];                                                                   \
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)                                                                \
            _Pragma("GCC unroll 8") for (int k = 0; k < G; k++) a[t][k] = b[t][k] = _mm512_setzero_ps();                   \
        int c = 0;                                                                                 \
        for (; c + 1 < cols; c += 2, P += W)                                                       \
            _Pragma("GCC unroll 8") for (int k = 0; k < G; k++) {                                                          \
                __m512i v = _mm512_load_si512((const void *)(P + PANEL * k));                      \
                __m512 lo = bf16_lo(v), hi = bf16_hi(v);                                           \
                _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {                                                      \
                    a[t][k] = _mm512_fmadd_ps(_mm512_set1_ps(x[(size_t)t * cols + c]), lo, a[t][k]); \
                    b[t][k] = _mm512_fmadd_ps(_mm512_set1_ps(x[(size_t)t * cols + c + 1]), hi, b[t][k]); \
                }                                                                                  \
            }                                                                                      \
        if (c < cols)                                                                              \
            _Pragma("GCC unroll 8") for (int k = 0; k < G; k++) {                                                          \
                __m512 lo = bf16_lo(_mm512_load_si512((const void *)(P + PANEL * k)));             \
                _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)                                                        \
                    a[t][k] = _mm512_fmadd_ps(_mm512_set1_ps(x[(size_t)t * cols + c]), lo, a[t][k]); \
            }                                                                                      \
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++)                                                                \
            _Pragma("GCC unroll 8") for (int k = 0; k < G; k++) _mm512_storeu_ps(y + (size_t)t * ystride + PANEL * k, _mm512_add_ps(a[t][k], b[t][k])); \
    }
/* one token takes a whole block (up to 8 panels, 16 chains); tiles of 2-3 tokens
   take it 4 panels at a time (24 chains at most) */
KERNEL(1, 1) KERNEL(1, 2) KERNEL(1, 3) KERNEL(1, 4) KERNEL(1, 5) KERNEL(1, 6) KERNEL(1, 7) KERNEL(1, 8)
KERNEL(2, 1) KERNEL(2, 2) KERNEL(2, 3) KERNEL(2, 4) KERNEL(3, 1) KERNEL(3, 2) KERNEL(3, 3) KERNEL(3, 4)

typedef void (*KF32)(float *, int, const float *, int, const float *, int);
typedef void (*KBF16)(float *, int, const float *, int, const uint32_t *, int);
static const KF32 K_F32[3][BLOCK + 1] = {
    {0, f32_1_1, f32_1_2, f32_1_3, f32_1_4, f32_1_5, f32_1_6, f32_1_7, f32_1_8},
    {0, f32_2_1, f32_2_2, f32_2_3, f32_2_4, 0, 0, 0, 0},
    {0, f32_3_1, f32_3_2, f32_3_3, f32_3_4, 0, 0, 0, 0}};
static const KBF16 K_BF16[3][BLOCK + 1] = {
    {0, bf16_1_1, bf16_1_2, bf16_1_3, bf16_1_4, bf16_1_5, bf16_1_6, bf16_1_7, bf16_1_8},
    {0, bf16_2_1, bf16_2_2, bf16_2_3, bf16_2_4, 0, 0, 0, 0},
    {0, bf16_3_1, bf16_3_2, bf16_3_3, bf16_3_4, 0, 0, 0, 0}};

static void matmul_blocks(void *ctx, int bb, int be) {
    const MatmulJob *j = ctx;
    float out[3 * PANEL * BLOCK]; /* a block's rows for up to 3 tokens, before the tail cut */
    for (int b = bb; b < be; b++) {
        int G = block_panels(j->rows, b), W = G * PANEL, r0 = b * PANEL * BLOCK;
        int nr = j->rows - r0 < W ? j->rows - r0 : W;
        const uint32_t *P = (const uint32_t *)j->w + block_offset(j->wt, b, j->cols);
        for (int t0 = 0; t0 < j->n;) {
            int left = j->n - t0, T = left >= 3 && left != 4 ? 3 : left >= 2 ? 2 : 1;
            const float *x = j->x + (size_t)t0 * j->cols;
            for (int k0 = 0; k0 < G; k0 += T == 1 ? G : 4) {
                int g = T == 1 ? G : G - k0 < 4 ? G - k0 : 4;
                if (j->wt == WT_F32) K_F32[T - 1][g](out + PANEL * k0, W, x, j->cols, (const float *)P + PANEL * k0, W);
                else K_BF16[T - 1][g](out + PANEL * k0, W, x, j->cols, P + PANEL * k0, W);
            }
            for (int t = 0; t < T; t++) memcpy(j->y + (size_t)(t0 + t) * j->rows + r0, out + (size_t)t * W, sizeof(float) * nr);
            t0 += T;
        }
    }
}
#else
/* the same two chains, one element at a time */
static float packed_weight(const MatmulJob *j, int b, int W, int q, int c) {
    if (j->wt == WT_F32) return ((const float *)j->w)[block_offset(j->wt, b, j->cols) + (size_t)c * W + q];
    const uint16_t *P = (const uint16_t *)((const uint32_t *)j->w + block_offset(j->wt, b, j->cols));
    uint32_t u = (uint32_t)P[((size_t)(c / 2) * W + q) * 2 + (c & 1)] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void matmul_blocks(void *ctx, int bb, int be) {
    const MatmulJob *j = ctx;
    for (int b = bb; b < be; b++) {
        int W = block_panels(j->rows, b) * PANEL, r0 = b * PANEL * BLOCK;
        int nr = j->rows - r0 < W ? j->rows - r0 : W;
        for (int t = 0; t < j->n; t++)
            for (int q = 0; q < nr; q++) {
                const float *x = j->x + (size_t)t * j->cols;
                float a = 0, bsum = 0;
                for (int c = 0; c < j->cols; c++) {
                    if (c & 1) bsum = fmaf(x[c], packed_weight(j, b, W, q, c), bsum);
                    else a = fmaf(x[c], packed_weight(j, b, W, q, c), a);
                }
                j->y[(size_t)t * j->rows + r0 + q] = a + bsum;
            }
    }
}
#endif

void k_matmul(float *y, const float *x, const void *w, WType wt, int n, int cols, int rows) {
    MatmulJob j = {y, x, w, wt, n, cols, rows};
    /* below ~64K multiply-adds per thread the hand-off costs more than it saves */
    int per_block = PANEL * BLOCK * cols * n;
    pool_run(matmul_blocks, &j, n_blocks(rows), 1, 1 + 65536 / (per_block ? per_block : 1));
}

void k_row_to_f32(float *y, const void *w, WType wt, size_t row, int cols) {
    if (wt == WT_F32) {
        memcpy(y, (const float *)w + row * cols, (size_t)cols * sizeof(float));
        return;
    }
    const uint16_t *h = (const uint16_t *)w + row * cols;
    for (int i = 0; i < cols; i++) {
        uint32_t u = (uint32_t)h[i] << 16;
        memcpy(&y[i], &u, 4);
    }
}
