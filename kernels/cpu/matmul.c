/* matmul.c — y[n][rows] = x[n][cols] · W[rows][cols]^T with f32 or bf16 weights.

   Weights are repacked once (k_pack) into blocks of up to 128 rows, column-major
   inside a block: for each column, the block's rows lie side by side, 16 to a
   vector. A row's result is then one FMA chain over the columns, in column order —
   no horizontal sums — and that chain is the same whichever kernel computes it
   (one token, a tile of tokens, any thread split), so the result for a token never
   depends on n. bf16 blocks hold two columns per 32-bit lane (the even column in
   the low half), widened by one shift or one mask. */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "dot.h"
#include "pool.h"

#define PANEL 16 /* rows a vector holds */
#define BLOCK 8  /* panels a block holds (128 rows) */

static int block_panels(int rows, int b) {
    int left = (rows - b * PANEL * BLOCK + PANEL - 1) / PANEL;
    return left < BLOCK ? left : BLOCK;
}
static int n_blocks(int rows) { return (rows + PANEL * BLOCK - 1) / (PANEL * BLOCK); }
static int pairs(int cols) { return (cols + 1) / 2; }

/* elements (floats, or 32-bit bf16 pairs) before block b */
static size_t block_offset(WType wt, int b, int cols) {
    return (size_t)b * PANEL * BLOCK * (wt == WT_F32 ? cols : pairs(cols));
}

size_t k_packed_bytes(WType wt, int rows, int cols) {
    size_t padded = (size_t)(rows + PANEL - 1) / PANEL * PANEL;
    return padded * (wt == WT_F32 ? (size_t)cols : (size_t)pairs(cols)) * 4;
}

void k_pack(void *dst, const void *w, WType wt, int rows, int cols) {
    memset(dst, 0, k_packed_bytes(wt, rows, cols));
    for (int b = 0; b < n_blocks(rows); b++) {
        int width = block_panels(rows, b) * PANEL, r0 = b * PANEL * BLOCK;
        int nr = rows - r0 < width ? rows - r0 : width;
        if (wt == WT_F32) {
            float *P = (float *)dst + block_offset(wt, b, cols);
            for (int q = 0; q < nr; q++)
                for (int c = 0; c < cols; c++) P[(size_t)c * width + q] = ((const float *)w)[(size_t)(r0 + q) * cols + c];
        } else {
            uint16_t *P = (uint16_t *)((uint32_t *)dst + block_offset(wt, b, cols));
            for (int q = 0; q < nr; q++)
                for (int c = 0; c < cols; c++)
                    P[((size_t)(c / 2) * width + q) * 2 + (c & 1)] = ((const uint16_t *)w)[(size_t)(r0 + q) * cols + c];
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

/* y[rows of block] for one token: G panels side by side, one chain each */
#define MATVEC(G)                                                                                  \
    static void matvec_f32_##G(float *y, const float *x, const float *P, int cols) {               \
        __m512 acc[G];                                                                             \
        for (int k = 0; k < G; k++) acc[k] = _mm512_setzero_ps();                                  \
        for (int c = 0; c < cols; c++, P += G * PANEL) {                                           \
            __m512 xc = _mm512_set1_ps(x[c]);                                                      \
            for (int k = 0; k < G; k++) acc[k] = _mm512_fmadd_ps(xc, _mm512_load_ps(P + PANEL * k), acc[k]); \
        }                                                                                          \
        for (int k = 0; k < G; k++) _mm512_storeu_ps(y + PANEL * k, acc[k]);                       \
    }                                                                                              \
    static void matvec_bf16_##G(float *y, const float *x, const uint32_t *P, int cols) {           \
        __m512 acc[G];                                                                             \
        for (int k = 0; k < G; k++) acc[k] = _mm512_setzero_ps();                                  \
        int c = 0;                                                                                 \
        for (; c + 1 < cols; c += 2, P += G * PANEL) {                                             \
            __m512 x0 = _mm512_set1_ps(x[c]), x1 = _mm512_set1_ps(x[c + 1]);                       \
            for (int k = 0; k < G; k++) {                                                          \
                __m512i v = _mm512_load_si512((const void *)(P + PANEL * k));                      \
                acc[k] = _mm512_fmadd_ps(x1, bf16_hi(v), _mm512_fmadd_ps(x0, bf16_lo(v), acc[k])); \
            }                                                                                      \
        }                                                                                          \
        if (c < cols)                                                                              \
            for (int k = 0; k < G; k++)                                                            \
                acc[k] = _mm512_fmadd_ps(_mm512_set1_ps(x[c]),                                     \
                                         bf16_lo(_mm512_load_si512((const void *)(P + PANEL * k))), acc[k]); \
        for (int k = 0; k < G; k++) _mm512_storeu_ps(y + PANEL * k, acc[k]);                       \
    }
MATVEC(1) MATVEC(2) MATVEC(3) MATVEC(4) MATVEC(5) MATVEC(6) MATVEC(7) MATVEC(8)

typedef void (*MatvecF32)(float *, const float *, const float *, int);
typedef void (*MatvecBf16)(float *, const float *, const uint32_t *, int);
static const MatvecF32 MV_F32[BLOCK + 1] = {0, matvec_f32_1, matvec_f32_2, matvec_f32_3, matvec_f32_4,
                                            matvec_f32_5, matvec_f32_6, matvec_f32_7, matvec_f32_8};
static const MatvecBf16 MV_BF16[BLOCK + 1] = {0, matvec_bf16_1, matvec_bf16_2, matvec_bf16_3, matvec_bf16_4,
                                              matvec_bf16_5, matvec_bf16_6, matvec_bf16_7, matvec_bf16_8};

/* T tokens (≤ 3) against a whole block: every column row is read once per tile, and
   each element is the same chain as in matvec */
#define TILE(T, G)                                                                                 \
    static void tile_f32_##T##_##G(float *y, const float *x, int cols, const float *P) {           \
        __m512 acc[T][G];                                                                          \
        for (int t = 0; t < T; t++)                                                                \
            for (int k = 0; k < G; k++) acc[t][k] = _mm512_setzero_ps();                           \
        for (int c = 0; c < cols; c++, P += G * PANEL)                                             \
            for (int t = 0; t < T; t++) {                                                          \
                __m512 xc = _mm512_set1_ps(x[(size_t)t * cols + c]);                               \
                for (int k = 0; k < G; k++) acc[t][k] = _mm512_fmadd_ps(xc, _mm512_load_ps(P + PANEL * k), acc[t][k]); \
            }                                                                                      \
        for (int t = 0; t < T; t++)                                                                \
            for (int k = 0; k < G; k++) _mm512_storeu_ps(y + (size_t)t * G * PANEL + PANEL * k, acc[t][k]); \
    }                                                                                              \
    static void tile_bf16_##T##_##G(float *y, const float *x, int cols, const uint32_t *P) {       \
        __m512 acc[T][G];                                                                          \
        for (int t = 0; t < T; t++)                                                                \
            for (int k = 0; k < G; k++) acc[t][k] = _mm512_setzero_ps();                           \
        int c = 0;                                                                                 \
        for (; c + 1 < cols; c += 2, P += G * PANEL)                                               \
            for (int k = 0; k < G; k++) {                                                          \
                __m512i v = _mm512_load_si512((const void *)(P + PANEL * k));                      \
                __m512 lo = bf16_lo(v), hi = bf16_hi(v);                                           \
                for (int t = 0; t < T; t++)                                                        \
                    acc[t][k] = _mm512_fmadd_ps(_mm512_set1_ps(x[(size_t)t * cols + c + 1]), hi,   \
                                _mm512_fmadd_ps(_mm512_set1_ps(x[(size_t)t * cols + c]), lo, acc[t][k])); \
            }                                                                                      \
        if (c < cols)                                                                              \
            for (int k = 0; k < G; k++) {                                                          \
                __m512 lo = bf16_lo(_mm512_load_si512((const void *)(P + PANEL * k)));             \
                for (int t = 0; t < T; t++)                                                        \
                    acc[t][k] = _mm512_fmadd_ps(_mm512_set1_ps(x[(size_t)t * cols + c]), lo, acc[t][k]); \
            }                                                                                      \
        for (int t = 0; t < T; t++)                                                                \
            for (int k = 0; k < G; k++) _mm512_storeu_ps(y + (size_t)t * G * PANEL + PANEL * k, acc[t][k]); \
    }
#define TILES(G) TILE(2, G) TILE(3, G)
TILES(1) TILES(2) TILES(3) TILES(4) TILES(5) TILES(6) TILES(7) TILES(8)
typedef void (*TileF32)(float *, const float *, int, const float *);
typedef void (*TileBf16)(float *, const float *, int, const uint32_t *);
#define ROW_OF(T) {0, tile_f32_##T##_1, tile_f32_##T##_2, tile_f32_##T##_3, tile_f32_##T##_4, \
                   tile_f32_##T##_5, tile_f32_##T##_6, tile_f32_##T##_7, tile_f32_##T##_8}
#define ROWB_OF(T) {0, tile_bf16_##T##_1, tile_bf16_##T##_2, tile_bf16_##T##_3, tile_bf16_##T##_4, \
                    tile_bf16_##T##_5, tile_bf16_##T##_6, tile_bf16_##T##_7, tile_bf16_##T##_8}
static const TileF32 TL_F32[2][BLOCK + 1] = {ROW_OF(2), ROW_OF(3)};
static const TileBf16 TL_BF16[2][BLOCK + 1] = {ROWB_OF(2), ROWB_OF(3)};

static void matmul_blocks(void *ctx, int bb, int be) {
    const MatmulJob *j = ctx;
    float out[3 * PANEL * BLOCK]; /* a block's rows for up to 3 tokens, before the tail cut */
    for (int b = bb; b < be; b++) {
        int G = block_panels(j->rows, b), width = G * PANEL, r0 = b * PANEL * BLOCK;
        int nr = j->rows - r0 < width ? j->rows - r0 : width;
        const void *P = (const char *)j->w + block_offset(j->wt, b, j->cols) * 4;
        for (int t0 = 0; t0 < j->n;) {
            int left = j->n - t0, T = left >= 3 && left != 4 ? 3 : left >= 2 ? 2 : 1;
            const float *x = j->x + (size_t)t0 * j->cols;
            if (T == 1 && j->wt == WT_F32) MV_F32[G](out, x, P, j->cols);
            else if (T == 1) MV_BF16[G](out, x, P, j->cols);
            else if (j->wt == WT_F32) TL_F32[T - 2][G](out, x, j->cols, P);
            else TL_BF16[T - 2][G](out, x, j->cols, P);
            for (int t = 0; t < T; t++) memcpy(j->y + (size_t)(t0 + t) * j->rows + r0, out + (size_t)t * width, sizeof(float) * nr);
            t0 += T;
        }
    }
}
#else
/* the same chains, one element at a time */
static void matmul_blocks(void *ctx, int bb, int be) {
    const MatmulJob *j = ctx;
    for (int b = bb; b < be; b++) {
        int width = block_panels(j->rows, b) * PANEL, r0 = b * PANEL * BLOCK;
        int nr = j->rows - r0 < width ? j->rows - r0 : width;
        for (int t = 0; t < j->n; t++)
            for (int q = 0; q < nr; q++) {
                const float *x = j->x + (size_t)t * j->cols;
                float acc = 0;
                for (int c = 0; c < j->cols; c++) {
                    float w;
                    if (j->wt == WT_F32) {
                        w = ((const float *)j->w)[block_offset(j->wt, b, j->cols) + (size_t)c * width + q];
                    } else {
                        const uint16_t *P = (const uint16_t *)((const uint32_t *)j->w + block_offset(j->wt, b, j->cols));
                        uint32_t u = (uint32_t)P[((size_t)(c / 2) * width + q) * 2 + (c & 1)] << 16;
                        memcpy(&w, &u, 4);
                    }
                    acc = fmaf(x[c], w, acc);
                }
                j->y[(size_t)t * j->rows + r0 + q] = acc;
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
