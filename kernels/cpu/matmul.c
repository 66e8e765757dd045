/* matmul.c — y[n][rows] = x[n][cols] · W[rows][cols]^T with f32 or bf16 weights.

   Weights are repacked once (k_pack) into blocks of up to 64 rows, column-major
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
#include "dot.h"
#include "pool.h"
#include "quant.h"

#define PANEL 16      /* rows a vector holds */
#define INTERLEAVED 3 /* AVX2: bf16 tiles of this many tokens or more read x interleaved */
#define TILE_MAX 6    /* AVX2: tokens a bf16 tile takes at most (f32: 3) */
/* Panels a block holds (64 rows). A tile of 2 tokens then reads a block's columns
   whole, one after another, as a stream: with 8 (two tiles' worth of registers) it
   took each column chunk in two halves, and verifying 2 tokens on the widened 110m
   cost 1.11 plain steps instead of 1.07. */
#define BLOCK 4

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

int k_wtype_quant(WType wt) { return wt >= WT_Q8_0 && wt < WT_COUNT; }

size_t q_row_bytes(WType wt, int cols) {
    static const size_t bytes[WT_COUNT] = {
        [WT_Q8_0] = Q8_0_BYTES, [WT_Q4_0] = Q4_0_BYTES, [WT_Q4_1] = Q4_1_BYTES, [WT_Q5_0] = Q5_0_BYTES,
        [WT_Q4_K] = Q4_K_BYTES, [WT_Q5_K] = Q5_K_BYTES, [WT_Q6_K] = Q6_K_BYTES};
    int block = wt >= WT_Q4_K ? QK_K : QK;
    return (size_t)(cols + block - 1) / block * bytes[wt];
}

/* a block-type matrix: its index, then (q32 types) its panels: of all its rows when the
   sources share a type, else of each source */
#define INDEX_BYTES ((sizeof(QIndex) + 63) & ~(size_t)63)
static int one_type(int n_src, const WType *types) {
    int same = 1;
    for (int s = 1; s < n_src; s++) same &= types[s] == types[0];
    return same;
}
static size_t panel_bytes(WType wt, int rows, int cols) {
    return ((wt < WT_Q4_K ? q32_panel_bytes(wt, rows, cols) : qk_panel_bytes(wt, rows, cols)) + 63) & ~(size_t)63;
}

size_t k_packed_bytes_blocks(int cols, int n_src, const int *src_rows, const WType *types) {
    size_t bytes = INDEX_BYTES;
    int rows = 0;
    for (int s = 0; s < n_src; s++) rows += src_rows[s];
    if (one_type(n_src, types)) return bytes + panel_bytes(types[0], rows, cols);
    for (int s = 0; s < n_src; s++) bytes += panel_bytes(types[s], src_rows[s], cols);
    return bytes;
}

int k_packed_copies(WType wt) { return !k_wtype_quant(wt) || panel_bytes(wt, 1, QK) > 0; }

size_t k_packed_bytes(WType wt, int rows, int cols) {
    if (k_wtype_quant(wt)) return k_packed_bytes_blocks(cols, 1, &rows, &wt);
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
    if (k_wtype_quant(wt)) {
        const WType types[3] = {wt, wt, wt};
        k_pack_blocks(dst, cols, n_src, src, src_rows, types);
        return;
    }
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
                for (int c = 0; c < cols; c++)
                    P[((size_t)(c / 2) * width + q) * 2 + (c & 1)] = ((const uint16_t *)row)[c];
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
    const float *xi; /* x as the tiles read it: AVX2 bf16 tiles interleaved (interleave), else x */
} MatmulJob;

#ifdef __AVX512F__
static inline __m512 bf16_lo(__m512i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)); }
static inline __m512 bf16_hi(__m512i v) {
    return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xffff0000)));
}

/* the line AHEAD bytes past p, into L2: one token's stream, left to the core's own
   prefetchers, read at about two thirds of the bandwidth (bf16 on an Intel core) */
#define AHEAD 8192
static inline void ahead(const void *p) { _mm_prefetch((const char *)((uintptr_t)p + AHEAD), _MM_HINT_T1); }

/* One token × G panels of a block (W floats, or W bf16 pairs, from one column to the
   next): its even chain a and odd chain b, all columns in order, kept in registers. */
#define KERNEL(G)                                                                                                      \
    static void f32_##G(float *y, const float *x, int cols, const float *P, int W) {                                   \
        __m512 a[G], b[G];                                                                                             \
        _Pragma("GCC unroll 8") for (int k = 0; k < G; k++) a[k] = b[k] = _mm512_setzero_ps();                         \
        int c = 0;                                                                                                     \
        for (; c + 1 < cols; c += 2, P += 2 * W) {                                                                     \
            __m512 x0 = _mm512_set1_ps(x[c]), x1 = _mm512_set1_ps(x[c + 1]);                                           \
            _Pragma("GCC unroll 8") for (int k = 0; k < 2 * G; k++) ahead(P + PANEL * k);                              \
            _Pragma("GCC unroll 8") for (int k = 0; k < G; k++) {                                                      \
                a[k] = _mm512_fmadd_ps(x0, _mm512_load_ps(P + PANEL * k), a[k]);                                       \
                b[k] = _mm512_fmadd_ps(x1, _mm512_load_ps(P + W + PANEL * k), b[k]);                                   \
            }                                                                                                          \
        }                                                                                                              \
        if (c < cols)                                                                                                  \
            _Pragma("GCC unroll 8") for (int k = 0; k < G; k++) a[k] =                                                 \
                _mm512_fmadd_ps(_mm512_set1_ps(x[c]), _mm512_load_ps(P + PANEL * k), a[k]);                            \
        _Pragma("GCC unroll 8") for (int k = 0; k < G; k++)                                                            \
            _mm512_storeu_ps(y + PANEL * k, _mm512_add_ps(a[k], b[k]));                                                \
    }                                                                                                                  \
    static void bf16_##G(float *y, const float *x, int cols, const uint32_t *P, int W) {                               \
        __m512 a[G], b[G];                                                                                             \
        _Pragma("GCC unroll 8") for (int k = 0; k < G; k++) a[k] = b[k] = _mm512_setzero_ps();                         \
        int c = 0;                                                                                                     \
        for (; c + 1 < cols; c += 2, P += W) {                                                                         \
            __m512 x0 = _mm512_set1_ps(x[c]), x1 = _mm512_set1_ps(x[c + 1]);                                           \
            _Pragma("GCC unroll 8") for (int k = 0; k < G; k++) ahead(P + PANEL * k);                                  \
            _Pragma("GCC unroll 8") for (int k = 0; k < G; k++) {                                                      \
                __m512i v = _mm512_load_si512((const void *)(P + PANEL * k));                                          \
                a[k] = _mm512_fmadd_ps(x0, bf16_lo(v), a[k]);                                                          \
                b[k] = _mm512_fmadd_ps(x1, bf16_hi(v), b[k]);                                                          \
            }                                                                                                          \
        }                                                                                                              \
        if (c < cols)                                                                                                  \
            _Pragma("GCC unroll 8") for (int k = 0; k < G; k++) a[k] = _mm512_fmadd_ps(                                \
                _mm512_set1_ps(x[c]), bf16_lo(_mm512_load_si512((const void *)(P + PANEL * k))), a[k]);                \
        _Pragma("GCC unroll 8") for (int k = 0; k < G; k++)                                                            \
            _mm512_storeu_ps(y + PANEL * k, _mm512_add_ps(a[k], b[k]));                                                \
    }
KERNEL(1)
KERNEL(2)
KERNEL(3)
KERNEL(4)

/* A tile of T tokens × G panels over columns [c0, c1) (c0 even): the same chains as
   above, carried between calls in A (even) and B (odd), [T][ACC] each, so that several
   tiles can take turns on a chunk of columns while it sits in L1. The first chunk
   starts the chains at zero; the last leaves their sum in A. Meanwhile pfl cache
   lines from pf on are prefetched a column pair. */
#define ACC (PANEL * BLOCK)
#define TILE_CHAINS_IN(T, G)                                                                                           \
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) _Pragma("GCC unroll 8") for (int k = 0; k < G; k++) {          \
        a[t][k] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(A + t * ACC + PANEL * k);                              \
        b[t][k] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(B + t * ACC + PANEL * k);                              \
    }
#define TILE_CHAINS_OUT(T, G)                                                                                          \
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) _Pragma("GCC unroll 8") for (int k = 0; k < G; k++) {          \
        if (last) {                                                                                                    \
            _mm512_storeu_ps(A + t * ACC + PANEL * k, _mm512_add_ps(a[t][k], b[t][k]));                                \
        } else {                                                                                                       \
            _mm512_storeu_ps(A + t * ACC + PANEL * k, a[t][k]);                                                        \
            _mm512_storeu_ps(B + t * ACC + PANEL * k, b[t][k]);                                                        \
        }                                                                                                              \
    }
#define TILE(T, G)                                                                                                     \
    static void f32t_##T##_##G(float *A, float *B, int first, int last, const float *x, int cols, int c0, int c1,      \
                               const float *P, int W, uintptr_t pf, int pfl) {                                         \
        __m512 a[T][G], b[T][G];                                                                                       \
        TILE_CHAINS_IN(T, G)                                                                                           \
        int c = c0;                                                                                                    \
        P += (size_t)c0 * W;                                                                                           \
        for (; c + 1 < c1; c += 2, P += 2 * W, pf += 64 * pfl) {                                                       \
            for (int l = 0; l < pfl; l++) _mm_prefetch((const char *)(pf + 64 * l), _MM_HINT_T0);                      \
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {                                                      \
                __m512 x0 = _mm512_set1_ps(x[(size_t)t * cols + c]), x1 = _mm512_set1_ps(x[(size_t)t * cols + c + 1]); \
                _Pragma("GCC unroll 8") for (int k = 0; k < G; k++) {                                                  \
                    a[t][k] = _mm512_fmadd_ps(x0, _mm512_load_ps(P + PANEL * k), a[t][k]);                             \
                    b[t][k] = _mm512_fmadd_ps(x1, _mm512_load_ps(P + W + PANEL * k), b[t][k]);                         \
                }                                                                                                      \
            }                                                                                                          \
        }                                                                                                              \
        if (c < c1)                                                                                                    \
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) _Pragma("GCC unroll 8") for (int k = 0; k < G; k++)    \
                a[t][k] =                                                                                              \
                    _mm512_fmadd_ps(_mm512_set1_ps(x[(size_t)t * cols + c]), _mm512_load_ps(P + PANEL * k), a[t][k]);  \
        TILE_CHAINS_OUT(T, G)                                                                                          \
    }                                                                                                                  \
    static void bf16t_##T##_##G(float *A, float *B, int first, int last, const float *x, int cols, int c0, int c1,     \
                                const uint32_t *P, int W, uintptr_t pf, int pfl) {                                     \
        __m512 a[T][G], b[T][G];                                                                                       \
        TILE_CHAINS_IN(T, G)                                                                                           \
        int c = c0;                                                                                                    \
        P += (size_t)(c0 / 2) * W;                                                                                     \
        for (; c + 1 < c1; c += 2, P += W, pf += 64 * pfl) {                                                           \
            for (int l = 0; l < pfl; l++) _mm_prefetch((const char *)(pf + 64 * l), _MM_HINT_T0);                      \
            _Pragma("GCC unroll 8") for (int k = 0; k < G; k++) {                                                      \
                __m512i v = _mm512_load_si512((const void *)(P + PANEL * k));                                          \
                __m512 lo = bf16_lo(v), hi = bf16_hi(v);                                                               \
                _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {                                                  \
                    a[t][k] = _mm512_fmadd_ps(_mm512_set1_ps(x[(size_t)t * cols + c]), lo, a[t][k]);                   \
                    b[t][k] = _mm512_fmadd_ps(_mm512_set1_ps(x[(size_t)t * cols + c + 1]), hi, b[t][k]);               \
                }                                                                                                      \
            }                                                                                                          \
        }                                                                                                              \
        if (c < c1) _Pragma("GCC unroll 8") for (int k = 0; k < G; k++) {                                              \
                __m512 lo = bf16_lo(_mm512_load_si512((const void *)(P + PANEL * k)));                                 \
                _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) a[t][k] =                                          \
                    _mm512_fmadd_ps(_mm512_set1_ps(x[(size_t)t * cols + c]), lo, a[t][k]);                             \
            }                                                                                                          \
        TILE_CHAINS_OUT(T, G)                                                                                          \
    }
/* tiles of 1-3 tokens × a whole block (24 chains at most) */
TILE(1, 1)
TILE(1, 2) TILE(1, 3) TILE(1, 4) TILE(2, 1) TILE(2, 2) TILE(2, 3) TILE(2, 4) TILE(3, 1) TILE(3, 2) TILE(3, 3) TILE(3, 4)

    typedef void (*KF32)(float *, const float *, int, const float *, int);
typedef void (*KBF16)(float *, const float *, int, const uint32_t *, int);
static const KF32 K_F32[BLOCK + 1] = {0, f32_1, f32_2, f32_3, f32_4};
static const KBF16 K_BF16[BLOCK + 1] = {0, bf16_1, bf16_2, bf16_3, bf16_4};
typedef void (*TF32)(float *, float *, int, int, const float *, int, int, int, const float *, int, uintptr_t, int);
typedef void (*TBF16)(float *, float *, int, int, const float *, int, int, int, const uint32_t *, int, uintptr_t, int);
static const TF32 T_F32[3][5] = {{0, f32t_1_1, f32t_1_2, f32t_1_3, f32t_1_4},
                                 {0, f32t_2_1, f32t_2_2, f32t_2_3, f32t_2_4},
                                 {0, f32t_3_1, f32t_3_2, f32t_3_3, f32t_3_4}};
static const TBF16 T_BF16[3][5] = {{0, bf16t_1_1, bf16t_1_2, bf16t_1_3, bf16t_1_4},
                                   {0, bf16t_2_1, bf16t_2_2, bf16t_2_3, bf16t_2_4},
                                   {0, bf16t_3_1, bf16t_3_2, bf16t_3_3, bf16t_3_4}};

#define GROUP 12               /* tokens that share one pass over a block */
#define CHUNK_BYTES 8192       /* a block's columns are taken a chunk at a time, well inside L1 */
#define CACHED_BYTES (1 << 20) /* matrices up to this size are left to the caches, unchunked */

/* tokens [t0, t0+nt) of block b. Tiles of up to 3 tokens take turns on a chunk of
   columns while it sits in L1. Left to the hardware, the next chunk's memory reads
   would wait for the FMAs on this one to finish, so a few tokens would cost about
   one token's memory time plus their FMA time; the tiles therefore prefetch the next
   chunk (or the next block's first: blocks lie one after another) as they go, each
   its share, which lets the two overlap. Were the first tile to fetch it all, memory
   would idle while the others compute (4 tokens then cost 1.3 plain steps on the
   widened 110m instead of 1.1). Prefetches never fault, even past the end (the
   addresses are integers until then, so no pointer points past the weights). A
   small matrix stays in cache from one call to the next: there chunks and prefetches
   would cost more than they save, so it is one chunk. */
static int tile_size(int left) { return left >= 3 && left != 4 ? 3 : left >= 2 ? 2 : 1; }

static void block_tokens(const MatmulJob *j, int b, int t0, int nt) {
    _Alignas(64) float A[GROUP * ACC], B[GROUP * ACC]; /* even and odd chains, [token][row] */
    int G = block_panels(j->rows, b), W = G * PANEL, r0 = b * PANEL * BLOCK;
    int nr = j->rows - r0 < W ? j->rows - r0 : W, esize = j->wt == WT_F32 ? 4 : 2;
    int cached = (size_t)j->rows * j->cols * esize <= CACHED_BYTES;
    int chunk = cached ? j->cols : CHUNK_BYTES / (W * esize) / 2 * 2;
    int tiles = 0;
    for (int t = 0; t < nt; t += tile_size(nt - t)) tiles++;
    int steps = tiles * (chunk / 2); /* column pairs the tiles take over a chunk */
    int pfl = cached ? 0 : (chunk * W * esize / 64 + steps - 1) / steps;
    const char *P = (const char *)j->w + block_offset(j->wt, b, j->cols) * 4;
    for (int c0 = 0; c0 < j->cols; c0 += chunk) {
        int c1 = j->cols - c0 < chunk ? j->cols : c0 + chunk;
        uintptr_t pf = (uintptr_t)P + (size_t)(c0 + chunk) * W * esize; /* may lie past the end */
        int first = c0 == 0, last = c1 == j->cols;
        for (int t = 0, T; t < nt; t += T, pf += (size_t)(chunk / 2) * pfl * 64) {
            const float *x = j->x + (size_t)(t0 + t) * j->cols;
            T = tile_size(nt - t);
            if (j->wt == WT_F32)
                T_F32[T - 1][G](A + t * ACC, B + t * ACC, first, last, x, j->cols, c0, c1, (const float *)P, W, pf,
                                pfl);
            else
                T_BF16[T - 1][G](A + t * ACC, B + t * ACC, first, last, x, j->cols, c0, c1, (const uint32_t *)P, W, pf,
                                 pfl);
        }
    }
    for (int t = 0; t < nt; t++) memcpy(j->y + (size_t)(t0 + t) * j->rows + r0, A + t * ACC, sizeof(float) * nr);
}

static void matmul_blocks(void *ctx, int bb, int be) {
    const MatmulJob *j = ctx;
    _Alignas(64) float out[PANEL * BLOCK]; /* a block's rows for one token, before the tail cut */
    for (int b = bb; b < be; b++) {
        if (j->n > 1) {
            for (int t0 = 0; t0 < j->n; t0 += GROUP) block_tokens(j, b, t0, j->n - t0 < GROUP ? j->n - t0 : GROUP);
            continue;
        }
        int G = block_panels(j->rows, b), W = G * PANEL, r0 = b * PANEL * BLOCK;
        int nr = j->rows - r0 < W ? j->rows - r0 : W;
        const uint32_t *P = (const uint32_t *)j->w + block_offset(j->wt, b, j->cols);
        if (j->wt == WT_F32) K_F32[G](out, j->x, j->cols, (const float *)P, W);
        else K_BF16[G](out, j->x, j->cols, P, W);
        memcpy(j->y + r0, out, sizeof(float) * nr);
    }
}
#elif defined(PD_AVX2)
/* The same chains with a 16-row panel as two 8-lane halves: T tokens × NP panels × NH
   halves (NH = 1: the 8 rows at P). At most 12 chains, so that they stay in registers
   beside a column's weights and x. y and x are T rows, ys and xs apart. Every `every`
   column pairs, pfl lines from pf on are prefetched. The chains start from `from`
   (else 0) and end in `keep` (else their sums in y): a block taken a chunk of columns
   at a time. A broadcast of x that serves one vector of weights only (NP · NH = 1) keeps
   GCC from hoisting broadcasts into the registers the chains need. */
static inline __attribute__((always_inline)) void chains(float *y, size_t ys, const float *x, size_t xs, int cols,
                                                         const void *P, int W, uintptr_t pf, int pfl, int every,
                                                         const float *from, float *keep, const int BF16, const int T,
                                                         const int NP, const int NH) {
    __m256 a[TILE_MAX][2][2], b[TILE_MAX][2][2]; /* [token][panel][half] */
    for (int t = 0; t < T; t++)
        for (int k = 0; k < NP; k++)
            for (int h = 0; h < NH; h++) {
                int i = 16 * ((t * NP + k) * NH + h);
                a[t][k][h] = from ? _mm256_load_ps(from + i) : _mm256_setzero_ps();
                b[t][k][h] = from ? _mm256_load_ps(from + i + 8) : _mm256_setzero_ps();
            }
    const __m256i hi_half = _mm256_set1_epi32((int)0xffff0000);
    /* IL: a bf16 tile of INTERLEAVED tokens or more, whose x comes interleaved (interleave)
       and whose column pairs are walked by pointer (with a pointer a token, the loop
       spilled); else indices (for fewer tokens, and for f32, the faster) */
    const int IL = BF16 && T >= INTERLEAVED;
    const uint32_t *qw = P;
    const float *xw = x;
    int c = 0;
    for (int due = 0; c + 1 < cols; c += 2, qw += W, xw += 2 * T) {
        if (pfl && --due <= 0) {
            for (int l = 0; l < pfl; l++) _mm_prefetch((const char *)(pf + 64 * l), _MM_HINT_T1);
            pf += 64 * (size_t)pfl, due = every;
        }
        const uint32_t *qc = IL ? qw : (const uint32_t *)P + (size_t)(BF16 ? c / 2 : c) * W;
        __m256 w[2][2];
#pragma GCC unroll 2
        for (int k = 0; k < NP; k++)
#pragma GCC unroll 2
            for (int h = 0; h < NH; h++) {
                const void *q = qc + PANEL * k + 8 * h;
                w[k][h] = BF16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(q), 16)) : _mm256_loadu_ps(q);
            }
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            __m256 x0 = _mm256_set1_ps(IL ? xw[t] : x[t * xs + c]);
#pragma GCC unroll 2
            for (int k = 0; k < NP; k++)
#pragma GCC unroll 2
                for (int h = 0; h < NH; h++) a[t][k][h] = _mm256_fmadd_ps(x0, w[k][h], a[t][k][h]);
        }
#pragma GCC unroll 2
        for (int k = 0; k < NP; k++)
#pragma GCC unroll 2
            for (int h = 0; h < NH; h++) {
                const void *q = qc + (BF16 ? 0 : W) + PANEL * k + 8 * h;
                w[k][h] =
                    BF16 ? _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256(q), hi_half)) : _mm256_loadu_ps(q);
            }
#pragma GCC unroll 6
        for (int t = 0; t < T; t++) {
            __m256 x1 = _mm256_set1_ps(IL ? xw[T + t] : x[t * xs + c + 1]);
#pragma GCC unroll 2
            for (int k = 0; k < NP; k++)
#pragma GCC unroll 2
                for (int h = 0; h < NH; h++) b[t][k][h] = _mm256_fmadd_ps(x1, w[k][h], b[t][k][h]);
        }
    }
    if (c < cols) /* an odd count's last column: the even chain's */
#pragma GCC unroll 2
        for (int k = 0; k < NP; k++)
#pragma GCC unroll 2
            for (int h = 0; h < NH; h++) {
                const void *q = (const uint32_t *)P + (size_t)(BF16 ? c / 2 : c) * W + PANEL * k + 8 * h;
                __m256 w0 =
                    BF16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256(q), 16)) : _mm256_loadu_ps(q);
#pragma GCC unroll 6
                for (int t = 0; t < T; t++)
                    a[t][k][h] = _mm256_fmadd_ps(_mm256_set1_ps(IL ? xw[t] : x[t * xs + c]), w0, a[t][k][h]);
            }
    for (int t = 0; t < T; t++)
        for (int k = 0; k < NP; k++)
            for (int h = 0; h < NH; h++) {
                int i = 16 * ((t * NP + k) * NH + h);
                if (keep) _mm256_store_ps(keep + i, a[t][k][h]), _mm256_store_ps(keep + i + 8, b[t][k][h]);
                else _mm256_storeu_ps(y + t * ys + PANEL * k + 8 * h, _mm256_add_ps(a[t][k][h], b[t][k][h]));
            }
}
typedef void (*ChainFn)(float *, size_t, const float *, size_t, int, const void *, int, uintptr_t, int, int,
                        const float *, float *);
#define CHAINS(NAME, BF16, T, NP, NH)                                                                                  \
    static void NAME(float *y, size_t ys, const float *x, size_t xs, int cols, const void *P, int W, uintptr_t pf,     \
                     int pfl, int every, const float *from, float *keep) {                                             \
        chains(y, ys, x, xs, cols, P, W, pf, pfl, every, from, keep, BF16, T, NP, NH);                                 \
    }
/* [T]: a T-token tile's pass; [0]: one token over one panel (a block's odd last one) */
CHAINS(f32_1, 0, 1, 2, 2)
CHAINS(f32_1p, 0, 1, 1, 2)
CHAINS(f32_2, 0, 2, 1, 2)
CHAINS(f32_3, 0, 3, 1, 2)
CHAINS(bf16_1p, 1, 1, 1, 2)
CHAINS(bf16_2, 1, 2, 1, 2)
CHAINS(bf16_3, 1, 3, 1, 1)
CHAINS(bf16_4, 1, 4, 1, 1)
CHAINS(bf16_5, 1, 5, 1, 1)
CHAINS(bf16_6, 1, 6, 1, 1)
static const ChainFn C_F32[4] = {f32_1p, f32_1, f32_2, f32_3};
static const ChainFn C_BF16[7] = {bf16_1p, bf16_1p, bf16_2, bf16_3, bf16_4, bf16_5, bf16_6};

/* tokens a tile takes: f32 up to 3, the tiles as even as can be; bf16 up to 6, as many as
   are left (evened out, 8 tokens were two tiles of 4, whose 8 chains wait on the FMAs'
   latency: 8 % slower) */
static int avx2_tile(int left, int bf) {
    if (bf) return left < TILE_MAX ? left : TILE_MAX;
    int tiles = (left + 2) / 3;
    return (left + tiles - 1) / tiles;
}
/* x as bf16 tiles read it: a tile of INTERLEAVED tokens or more side by side, column by
   column ([c][T]); a smaller one as it is */
static void interleave(float *xi, const float *x, int n, int cols) {
    for (int t = 0, T; t < n; t += T) {
        T = avx2_tile(n - t, 1);
        for (int c = 0; c < cols; c++)
            for (int i = 0; i < T; i++)
                xi[(size_t)t * cols + (T >= INTERLEAVED ? (size_t)c * T + i : (size_t)i * cols + c)] =
                    x[(size_t)(t + i) * cols + c];
    }
}
/* rows a pass of a T-token tile takes (what measured fastest streamed from memory) */
static int pass_rows(int T, int bf) {
    if (bf) return T <= 2 ? PANEL : PANEL / 2;
    return T == 1 ? 2 * PANEL : PANEL;
}

/* Below this size a matrix is left to the hardware prefetchers. Above it, even one that
   fits the caches comes from memory in a decode step: the other layers' weights have
   pushed it out since the last. */
#define SMALL_BYTES 65536
#define CHUNKED_ABOVE (128 << 10) /* a block's bytes (with the next one's, half of Zen 3's L2) */
#define CHUNK_BYTES 8192          /* of a block's columns: in L1 while the passes take it */
#define XI_FLOATS 16384           /* interleaved tokens on the stack; more from the heap */

/* block b for a bf16 tile of all n tokens (n ≤ TILE_MAX), a chunk of its columns at a time
   (each pass's chains kept in st between chunks), each pass over a chunk prefetching its
   share of the next chunk (after the last, the next block's first) */
static void tile_chunked(const MatmulJob *j, int b, int pfl, int every) {
    _Alignas(32) float out[TILE_MAX][PANEL * BLOCK], st[TILE_MAX * 2 * PANEL * BLOCK];
    const int T = j->n, rows = pass_rows(T, 1), G = block_panels(j->rows, b), W = G * PANEL, r0 = b * PANEL * BLOCK;
    int nr = j->rows - r0 < W ? j->rows - r0 : W, chunk = CHUNK_BYTES / (W * 2) / 2 * 2;
    const uint32_t *P = (const uint32_t *)j->w + block_offset(j->wt, b, j->cols);
    for (int c0 = 0; c0 < j->cols; c0 += chunk) {
        int c1 = j->cols - c0 < chunk ? j->cols : c0 + chunk;
        const uint32_t *Q = P + (size_t)(c0 / 2) * W;
        const float *x = j->xi + (size_t)c0 * (T >= INTERLEAVED ? T : 1); /* interleaved: [c][T] */
        uintptr_t pf = (uintptr_t)(P + (size_t)pairs(c1) * W);
        size_t pass_bytes = (size_t)64 * pfl * ((pairs(c1 - c0) + every - 1) / every);
        for (int r = 0; r < W; r += rows, pf += pass_bytes)
            C_BF16[T](out[0] + r, PANEL * BLOCK, x, j->cols, c1 - c0, Q + r, W, pf, pfl, every,
                      c0 ? st + 2 * T * r : NULL, c1 < j->cols ? st + 2 * T * r : NULL);
    }
    for (int i = 0; i < T; i++) memcpy(j->y + (size_t)i * j->rows + r0, out[i], sizeof(float) * nr);
}

/* A block at a time, each tile of tokens one pass over the block's columns for each of
   its row groups. f32 takes up to 3 tokens a pass, bf16 up to 6: a pair of its columns
   is one load, and its two widening operations then serve more tokens. Left to the
   hardware, the next block's reads would wait for the passes over this one (from L2) to
   finish, so the passes prefetch the next block, each its share. One f32 token is left
   to the hardware prefetchers, which stream it faster. */
static void matmul_blocks(void *ctx, int bb, int be) {
    const MatmulJob *j = ctx;
    _Alignas(64) float out[TILE_MAX][PANEL * BLOCK]; /* a block's rows for a tile, before the tail cut */
    int bf = j->wt == WT_BF16, esize = bf ? 2 : 4;
    const ChainFn *fn = bf ? C_BF16 : C_F32;
    int passes = 0, small = (size_t)j->rows * j->cols * esize <= SMALL_BYTES, pfl = 0, every = 1;
    for (int t = 0, T; t < j->n; t += T) T = avx2_tile(j->n - t, bf), passes += PANEL * BLOCK / pass_rows(T, bf);
    if (!small && (j->n > 1 || bf)) {
        long lines = (long)PANEL * BLOCK * j->cols * esize / 64, steps = (long)passes * pairs(j->cols);
        if (lines >= steps) pfl = (int)((lines + steps - 1) / steps);
        else pfl = 1, every = (int)(steps / lines);
    }
    /* A bf16 tile of every token over a wide block (which, with the next one prefetched
       beside it, crowds L2) takes it a chunk of columns at a time instead, every pass over
       each chunk, prefetching the next chunk: whole, blocks of 192 KB and more streamed
       at 15–17 GB/s for one token where SmolLM2's 72 KB ones read 18–20 (docs/benchmarks.md) */
    if (bf && j->n <= TILE_MAX && (size_t)PANEL * BLOCK * pairs(j->cols) * 4 > CHUNKED_ABOVE) {
        for (int b = bb; b < be; b++) tile_chunked(j, b, pfl, every);
        return;
    }
    size_t pass_bytes = (size_t)64 * pfl * ((pairs(j->cols) + every - 1) / every);
    for (int b = bb; b < be; b++) {
        int G = block_panels(j->rows, b), W = G * PANEL, r0 = b * PANEL * BLOCK;
        int nr = j->rows - r0 < W ? j->rows - r0 : W;
        const uint32_t *P = (const uint32_t *)j->w + block_offset(j->wt, b, j->cols);
        uintptr_t pf = (uintptr_t)((const uint32_t *)j->w + block_offset(j->wt, b + 1, j->cols));
        for (int t = 0, T; t < j->n; t += T) {
            const float *x = j->xi + (size_t)t * j->cols;
            T = avx2_tile(j->n - t, bf);
            int rows = pass_rows(T, bf);
            for (int r = 0; r < W; r += rows, pf += pass_bytes) {
                ChainFn f = rows > W - r ? fn[0] : fn[T];
                f(out[0] + r, PANEL * BLOCK, x, j->cols, j->cols, P + r, W, pf, pfl, every, NULL, NULL);
            }
            for (int i = 0; i < T; i++) memcpy(j->y + (size_t)(t + i) * j->rows + r0, out[i], sizeof(float) * nr);
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

void k_pack_blocks(void *dst, int cols, int n_src, const void *const *src, const int *src_rows, const WType *types) {
    QIndex *q = dst;
    memset(q, 0, sizeof *q);
    q->n_src = n_src;
    int rows = 0;
    for (int s = 0; s < n_src && s < 3; s++)
        q->src[s] = src[s], q->rows[s] = src_rows[s], q->wt[s] = types[s], rows += src_rows[s];
    uint8_t *at = (uint8_t *)dst + INDEX_BYTES;
    if (one_type(n_src, types)) {
        if (panel_bytes(types[0], rows, cols))
            (types[0] < WT_Q4_K ? q32_pack : qk_pack)(at, q, types[0], cols, rows), q->panels[0] = at;
        return;
    }
    for (int s = 0; s < n_src; at += panel_bytes(types[s], src_rows[s], cols), s++) {
        if (!panel_bytes(types[s], src_rows[s], cols)) continue;
        QIndex one = {1, {src[s]}, {src_rows[s]}, {types[s]}, {0}};
        (types[s] < WT_Q4_K ? q32_pack : qk_pack)(at, &one, types[s], cols, src_rows[s]);
        q->panels[s] = at;
    }
}

static void block_matmul(float *y, const float *x, const QIndex *w, int n, int cols, int rows) {
    if (w->wt[0] >= WT_Q4_K) qk_matmul(y, x, w, w->wt[0], n, cols, rows);
    else q32_matmul(y, x, w, w->wt[0], n, cols, rows);
}

/* sources of different types: each its own product (one row's bits never depend on the
   others), gathered into y's columns, a few tokens at a time through a stack buffer */
static void mixed_matmul(float *y, const float *x, const QIndex *w, int n, int cols, int rows) {
    float part[K_MIXED_MAX_ROWS];
    for (int s = 0, r0 = 0; s < w->n_src; r0 += w->rows[s++]) {
        QIndex one = {1, {w->src[s]}, {w->rows[s]}, {w->wt[s]}, {w->panels[s]}};
        int rs = w->rows[s], step = K_MIXED_MAX_ROWS / rs;
        for (int t0 = 0; t0 < n; t0 += step) {
            int nt = n - t0 < step ? n - t0 : step;
            block_matmul(part, x + (size_t)t0 * cols, &one, nt, cols, rs);
            for (int t = 0; t < nt; t++)
                memcpy(y + (size_t)(t0 + t) * rows + r0, part + (size_t)t * rs, sizeof(float) * rs);
        }
    }
}

void k_matmul(float *y, const float *x, const void *w, WType wt, int n, int cols, int rows) {
    if (k_wtype_quant(wt)) {
        const QIndex *q = w;
        int mixed = 0;
        for (int s = 1; s < q->n_src; s++) mixed |= q->wt[s] != q->wt[0];
        return mixed ? mixed_matmul(y, x, q, n, cols, rows) : block_matmul(y, x, q, n, cols, rows);
    }
    /* below ~64K multiply-adds per thread the hand-off costs more than it saves */
    int per_block = PANEL * BLOCK * cols * n, least = 1 + 65536 / (per_block ? per_block : 1);
    MatmulJob j = {y, x, w, wt, n, cols, rows, x};
#ifdef PD_AVX2
    if (wt == WT_BF16 && n >= INTERLEAVED) {
        _Alignas(64) float stack[XI_FLOATS];
        size_t need = (size_t)n * cols;
        float *xi = need <= XI_FLOATS ? stack : aligned_alloc(64, (need * sizeof(float) + 63) & ~(size_t)63);
        if (!xi) { /* out of memory: as many tokens at a time as the stack holds (the same bits) */
            int fit = XI_FLOATS / cols > 1 ? XI_FLOATS / cols : 1;
            for (int t0 = 0; t0 < n; t0 += fit)
                k_matmul(y + (size_t)t0 * rows, x + (size_t)t0 * cols, w, wt, n - t0 < fit ? n - t0 : fit, cols, rows);
            return;
        }
        interleave(xi, x, n, cols);
        j.xi = xi;
        pool_run(matmul_blocks, &j, n_blocks(rows), 1, least);
        if (xi != stack) free(xi);
        return;
    }
#endif
    pool_run(matmul_blocks, &j, n_blocks(rows), 1, least);
}

void k_row_to_f32(float *y, const void *w, WType wt, size_t row, int cols) {
    if (wt >= WT_Q4_K) return qk_row_to_f32(y, w, wt, row, cols);
    if (wt >= WT_Q8_0) return q32_row_to_f32(y, w, wt, row, cols);
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
