/* matmul.c — y[n][rows] = x[n][cols] · W[rows][cols]^T with f32 or bf16 weights.
   Decoding is memory-bound: a row of W is loaded once and used for a tile of up to
   four tokens. Every (token, row) element follows dot.h's order whatever the tile:
   each row leaves one 16-lane partial vector per token, and 16 rows' vectors are
   reduced together by a transpose that adds lanes in hsum's tree. So the result for
   a token never depends on n, and small rows (a 64-wide model) cost little. */
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

#define GROUP 16 /* rows reduced together */

#ifdef __AVX512F__
/* partial[t] = (a0 + a1) + (a2 + a3) for T tokens against one weight row; element i
   goes to accumulator (i / 16) % 4. The column loop is unrolled by 64 so the four
   accumulators stay in registers; a ragged tail uses masked loads in place. */
#define STEP(T, LOADW, k, off)                                                                     \
    if (i + off < cols) {                                                                          \
        int left = cols - i - off;                                                                 \
        __m512 wv = LOADW(w + i + off, left);                                                      \
        for (int t = 0; t < T; t++)                                                                \
            acc[t][k] = _mm512_fmadd_ps(wv, load_f32(x + (size_t)t * cols + i + off, left), acc[t][k]); \
    }
#define ROW(T, LOADW)                                                                              \
    do {                                                                                           \
        __m512 acc[T][4];                                                                          \
        for (int t = 0; t < T; t++)                                                                \
            for (int k = 0; k < 4; k++) acc[t][k] = _mm512_setzero_ps();                           \
        for (int i = 0; i < cols; i += 64) {                                                       \
            STEP(T, LOADW, 0, 0) STEP(T, LOADW, 1, 16) STEP(T, LOADW, 2, 32) STEP(T, LOADW, 3, 48) \
        }                                                                                          \
        for (int t = 0; t < T; t++)                                                                \
            part[t * GROUP] = _mm512_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]), _mm512_add_ps(acc[t][2], acc[t][3])); \
    } while (0)

/* the common decode case without tail checks: one token, cols a multiple of 64 */
static inline __m512 row1_f32_64(const float *x, const float *w, int cols) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int i = 0; i < cols; i += 64) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 32), _mm512_loadu_ps(x + i + 32), a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 48), _mm512_loadu_ps(x + i + 48), a3);
    }
    return _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
}

/* any cols: full 64-blocks, then the ragged tail with masked loads in place */
static inline __m512 row1_f32_any(const float *x, const float *w, int cols) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int i = 0;
    for (; i + 64 <= cols; i += 64) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 32), _mm512_loadu_ps(x + i + 32), a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 48), _mm512_loadu_ps(x + i + 48), a3);
    }
    if (i < cols) a0 = _mm512_fmadd_ps(load_f32(w + i, cols - i), load_f32(x + i, cols - i), a0);
    if (i + 16 < cols) a1 = _mm512_fmadd_ps(load_f32(w + i + 16, cols - i - 16), load_f32(x + i + 16, cols - i - 16), a1);
    if (i + 32 < cols) a2 = _mm512_fmadd_ps(load_f32(w + i + 32, cols - i - 32), load_f32(x + i + 32, cols - i - 32), a2);
    if (i + 48 < cols) a3 = _mm512_fmadd_ps(load_f32(w + i + 48, cols - i - 48), load_f32(x + i + 48, cols - i - 48), a3);
    return _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
}

static inline __m512 row1_bf16_64(const float *x, const uint16_t *w, int cols) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int i = 0; i < cols; i += 64) {
        a0 = _mm512_fmadd_ps(load_bf16(w + i, 16), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(load_bf16(w + i + 16, 16), _mm512_loadu_ps(x + i + 16), a1);
        a2 = _mm512_fmadd_ps(load_bf16(w + i + 32, 16), _mm512_loadu_ps(x + i + 32), a2);
        a3 = _mm512_fmadd_ps(load_bf16(w + i + 48, 16), _mm512_loadu_ps(x + i + 48), a3);
    }
    return _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
}

static void row_f32(__m512 *part, const float *x, const float *w, int nt, int cols) {
    if (nt == 1 && cols % 64 == 0) {
        part[0] = row1_f32_64(x, w, cols);
        return;
    }
    switch (nt) {
    case 4: ROW(4, load_f32); break;
    case 3: ROW(3, load_f32); break;
    case 2: ROW(2, load_f32); break;
    default: ROW(1, load_f32); break;
    }
}

static void row_bf16(__m512 *part, const float *x, const uint16_t *w, int nt, int cols) {
    if (nt == 1 && cols % 64 == 0) {
        part[0] = row1_bf16_64(x, w, cols);
        return;
    }
    switch (nt) {
    case 4: ROW(4, load_bf16); break;
    case 3: ROW(3, load_bf16); break;
    case 2: ROW(2, load_bf16); break;
    default: ROW(1, load_bf16); break;
    }
}

/* lanes i and i+8 of a, then of b: [a.lo+a.hi | b.lo+b.hi] */
static inline __m512 fold8(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
}
/* 16 vectors → one: lane r = hsum(v[r]), the same additions in the same tree */
static inline __attribute__((always_inline)) __m512 reduce16(const __m512 *v) {
    __m512 w[8], z[4], u[2];
    for (int k = 0; k < 8; k++) w[k] = fold8(v[2 * k], v[2 * k + 1]);          /* +8 apart */
    for (int m = 0; m < 4; m++)                                                 /* +4 apart */
        z[m] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * m], w[2 * m + 1], 0x88),
                             _mm512_shuffle_f32x4(w[2 * m], w[2 * m + 1], 0xDD));
    for (int m = 0; m < 2; m++)                                                 /* +2 apart */
        u[m] = _mm512_add_ps(_mm512_shuffle_ps(z[2 * m], z[2 * m + 1], 0x44),
                             _mm512_shuffle_ps(z[2 * m], z[2 * m + 1], 0xEE));
    __m512 s = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], 0x88),               /* +1 apart */
                             _mm512_shuffle_ps(u[0], u[1], 0xDD));
    /* lane 4k+j now holds row 4j+k */
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(idx, s);
}

/* one token (the decode step): no token tiles, the row's partial straight to part */
static void matvec_rows(const MatmulJob *j, int rb, int re) {
    __m512 part[GROUP];
    int cols = j->cols, fast = cols % 64 == 0;
    for (int g = rb; g < re; g += GROUP) {
        int nr = re - g < GROUP ? re - g : GROUP;
        if (nr == GROUP && fast && j->wt == WT_F32) { /* the common case, unrolled into registers */
            const float *w = (const float *)j->w + (size_t)g * cols;
#pragma GCC unroll 16
            for (int r = 0; r < GROUP; r++) part[r] = row1_f32_64(j->x, w + (size_t)r * cols, cols);
            _mm512_storeu_ps(j->y + g, reduce16(part));
            continue;
        }
        for (int r = 0; r < nr; r++) {
            size_t at = (size_t)(g + r) * cols;
            if (j->wt == WT_F32) {
                const float *w = (const float *)j->w + at;
                part[r] = fast ? row1_f32_64(j->x, w, cols) : row1_f32_any(j->x, w, cols);
            } else {
                const uint16_t *w = (const uint16_t *)j->w + at;
                if (fast) part[r] = row1_bf16_64(j->x, w, cols);
                else row_bf16(part + r, j->x, w, 1, cols);
            }
        }
        for (int r = nr; r < GROUP; r++) part[r] = _mm512_setzero_ps();
        _mm512_mask_storeu_ps(j->y + g, (__mmask16)((1u << nr) - 1), reduce16(part));
    }
}

static void matmul_rows(void *ctx, int rb, int re) {
    const MatmulJob *j = ctx;
    if (j->n == 1) {
        matvec_rows(j, rb, re);
        return;
    }
    __m512 part[4 * GROUP]; /* [token][row in group] partial vectors */
    for (int g = rb; g < re; g += GROUP) {
        int nr = re - g < GROUP ? re - g : GROUP;
        for (int t0 = 0; t0 < j->n; t0 += 4) {
            int nt = j->n - t0 < 4 ? j->n - t0 : 4;
            const float *x = j->x + (size_t)t0 * j->cols;
            for (int r = 0; r < GROUP; r++) {
                if (r >= nr) {
                    for (int t = 0; t < nt; t++) part[t * GROUP + r] = _mm512_setzero_ps();
                } else if (j->wt == WT_F32) {
                    row_f32(part + r, x, (const float *)j->w + (size_t)(g + r) * j->cols, nt, j->cols);
                } else {
                    row_bf16(part + r, x, (const uint16_t *)j->w + (size_t)(g + r) * j->cols, nt, j->cols);
                }
            }
            for (int t = 0; t < nt; t++)
                _mm512_mask_storeu_ps(j->y + (size_t)(t0 + t) * j->rows + g, (__mmask16)((1u << nr) - 1),
                                      reduce16(part + t * GROUP));
        }
    }
}
#else
static void matmul_rows(void *ctx, int rb, int re) {
    const MatmulJob *j = ctx;
    for (int r = rb; r < re; r++)
        for (int t = 0; t < j->n; t++) {
            const float *w = (const float *)j->w + (size_t)r * j->cols;
            if (j->wt == WT_BF16) {
                static _Thread_local float row[1 << 16];
                k_row_to_f32(row, j->w, j->wt, r, j->cols);
                w = row;
            }
            j->y[(size_t)t * j->rows + r] = dot_f32(w, j->x + (size_t)t * j->cols, j->cols);
        }
}
#endif

void k_matmul(float *y, const float *x, const void *w, WType wt, int n, int cols, int rows) {
    MatmulJob j = {y, x, w, wt, n, cols, rows};
    /* below ~32K multiply-adds per thread the hand-off costs more than it saves */
    int min_rows = 1 + 32768 / ((size_t)cols * n);
    pool_run(matmul_rows, &j, rows, GROUP, min_rows);
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
