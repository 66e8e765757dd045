/* matmul.c — y[n][rows] = x[n][cols] · W[rows][cols]^T with f32 or bf16 weights.
   Decoding is memory-bound: a row of W is loaded once and used for a tile of up to
   four tokens. Each (token, row) element follows dot.h's order, whatever the tile,
   so the result for a token does not depend on n. Threads split the rows. */
#include "backend.h"
#include "dot.h"
#include "pool.h"

typedef struct {
    float *y;
    const float *x;
    const void *w;
    WType wt;
    int n, cols, rows;
} MatmulJob;

#ifdef __AVX512F__
/* T tokens (1..4) against one weight row; LOADW loads 16 weights at i */
#define TILE(T, LOADW)                                                                  \
    do {                                                                                \
        __m512 acc[T][4];                                                               \
        for (int t = 0; t < T; t++)                                                     \
            for (int k = 0; k < 4; k++) acc[t][k] = _mm512_setzero_ps();                \
        for (int i = 0, k = 0; i < cols; i += 16, k = (k + 1) & 3) {                    \
            __m512 wv = LOADW;                                                          \
            for (int t = 0; t < T; t++)                                                 \
                acc[t][k] = _mm512_fmadd_ps(wv, load_f32(x + (size_t)t * cols + i, cols - i), acc[t][k]); \
        }                                                                               \
        for (int t = 0; t < T; t++)                                                     \
            y[(size_t)t * rows] = _mm512_reduce_add_ps(_mm512_add_ps(                   \
                _mm512_add_ps(acc[t][0], acc[t][1]), _mm512_add_ps(acc[t][2], acc[t][3]))); \
    } while (0)

static void row_f32(float *y, const float *x, const float *w, int nt, int cols, int rows) {
    switch (nt) {
    case 4: TILE(4, load_f32(w + i, cols - i)); break;
    case 3: TILE(3, load_f32(w + i, cols - i)); break;
    case 2: TILE(2, load_f32(w + i, cols - i)); break;
    default: TILE(1, load_f32(w + i, cols - i)); break;
    }
}

static void row_bf16(float *y, const float *x, const uint16_t *w, int nt, int cols, int rows) {
    switch (nt) {
    case 4: TILE(4, load_bf16(w + i, cols - i)); break;
    case 3: TILE(3, load_bf16(w + i, cols - i)); break;
    case 2: TILE(2, load_bf16(w + i, cols - i)); break;
    default: TILE(1, load_bf16(w + i, cols - i)); break;
    }
}
#else
static void row_f32(float *y, const float *x, const float *w, int nt, int cols, int rows) {
    for (int t = 0; t < nt; t++) y[(size_t)t * rows] = dot_f32(w, x + (size_t)t * cols, cols);
}
static void row_bf16(float *y, const float *x, const uint16_t *w, int nt, int cols, int rows) {
    float wf[cols];
    for (int i = 0; i < cols; i++) {
        uint32_t u = (uint32_t)w[i] << 16;
        memcpy(&wf[i], &u, 4);
    }
    row_f32(y, x, wf, nt, cols, rows);
}
#endif

static void matmul_rows(void *ctx, int rb, int re) {
    const MatmulJob *j = ctx;
    /* rows outer: a weight row is read from memory once and reused from L1 */
    for (int r = rb; r < re; r++)
        for (int t0 = 0; t0 < j->n; t0 += 4) {
            int nt = j->n - t0 < 4 ? j->n - t0 : 4;
            const float *x = j->x + (size_t)t0 * j->cols;
            float *y = j->y + (size_t)t0 * j->rows + r;
            if (j->wt == WT_F32)
                row_f32(y, x, (const float *)j->w + (size_t)r * j->cols, nt, j->cols, j->rows);
            else
                row_bf16(y, x, (const uint16_t *)j->w + (size_t)r * j->cols, nt, j->cols, j->rows);
        }
}

void k_matmul(float *y, const float *x, const void *w, WType wt, int n, int cols, int rows) {
    MatmulJob j = {y, x, w, wt, n, cols, rows};
    /* below ~32K multiply-adds per thread the hand-off costs more than it saves */
    int min_rows = 1 + 32768 / ((size_t)cols * n);
    pool_run(matmul_rows, &j, rows, 16, min_rows);
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
