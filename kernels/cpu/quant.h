/* quant.h — GGUF's block types as the matmul reads them, and the rule it computes
   (quant.c: Q8_0, Q4_0, Q4_1, Q5_0; quant_k.c: Q4_K, Q5_K, Q6_K). The scalar code is the spec;
   the vector paths compute the same bits.

   x is quantized per row first, a rule of that row alone (never of the batch):
     per block of B elements (B = 32, or 256 for the K types; elements past cols are 0)
       amax = max |x_i|;  d = amax / 127.0f;  id = d != 0 ? 1.0f / d : 0;
       q_i = nearbyintf(x_i * id), clamped to [-127, 127]   (ties to even)
   Integer block sums are then exact whatever the order, and each output y_r is one
   chain of fmaf over the row's blocks in order, from acc = 0 (dw, mw, dmin: the block's
   f16 scales as floats; dx: x's block scale):
     Q8_0   acc = fmaf(dw * dx, (float)Σ qw·qx, acc)
     Q4_0   the same, qw = nibble − 8
     Q5_0   the same, qw = (nibble | fifth bit << 4) − 16
     Q4_1   acc = fmaf(dw * dx, (float)Σ nibble·qx, acc);  acc = fmaf(mw * dx, (float)Σ qx, acc)
     Q4_K   per super-block, sc_j / m_j its 6-bit scales and minima (ggml's get_scale_min_k4):
            acc = fmaf(d * dx, (float)Σ_j sc_j Σ q·qx, acc);  acc = fmaf(-(dmin * dx), (float)Σ_j m_j Σ qx, acc)
     Q5_K   the same with 5-bit q
     Q6_K   acc = fmaf(d * dx, (float)Σ_j sc_j Σ q·qx, acc), q = 6 bits − 32, sc_j int8 per 16
   (float) of an int32 rounds to nearest even, as cvtdq2ps does. Inputs holding NaN or
   infinities give unspecified (but finite-time) results. */
#ifndef PD_QUANT_H
#define PD_QUANT_H
#include <stdint.h>
#include <string.h>

#include "backend.h"
#include "half.h"
#include "spec.h" /* QK, QK_K, the block sizes, q5_high, scale_min_k4 */

/* the packed form of a block-type matrix (k_pack): where its rows lie and, for the
   block types in AVX2 builds, the same blocks laid out as quant.c / quant_k.c read them */
typedef struct {
    int n_src;
    const uint8_t *src[3];
    int rows[3];
    WType wt[3];              /* each source's type (k_pack_blocks may mix block types) */
    const uint8_t *panels[3]; /* q32_pack's / qk_pack's layout: all rows in [0] if the types agree, else per source */
} QIndex;

/* a q32_pack / qk_pack job: the rows of w packed into dst, a group of rows a pool task */
typedef struct {
    uint8_t *dst;
    const QIndex *w;
    WType wt;
    int cols, rows;
} PackJob;

#if defined(__AVX2__)
#include <immintrin.h>
/* how far ahead the panels are prefetched into L2: the core's own prefetchers, and the
   loads the out-of-order window holds, ran at less than half the read bandwidth. The
   best distance is the kernel's: on Zen 3 the 32-element types' AVX2 stream read
   fastest 2 KiB ahead, the K types' 8 KiB ahead (docs/benchmarks.md) */
#define PREFETCH 8192
#define PREFETCH_Q32 2048
/* x's 4 bytes at p in every 32-bit lane, straight from memory (through a general
   register it took two more shuffle-port operations) */
static inline __attribute__((always_inline)) __m256i quad8(const int8_t *p) {
    return _mm256_broadcastd_epi32(_mm_loadu_si32(p));
}
/* v stays a chain of adds: the compiler may regroup exact integer adds into a tree,
   which holds every term live at once and spills them (and the tokens' chains) */
#define KEEP_CHAIN(v) __asm__("" : "+x"(v))
#define KEEP_CHAINS(a, b) __asm__("" : "+x"(a), "+x"(b))
/* every line up to end + ahead not yet asked for (*next) */
static inline __attribute__((always_inline)) void prefetch(const uint8_t **next, const uint8_t *end, size_t ahead) {
    for (; *next < end + ahead; *next += 64) _mm_prefetch((const char *)*next, _MM_HINT_T1);
}
#endif

/* bytes of one row of cols elements */
size_t q_row_bytes(WType wt, int cols);
/* row r of the matrix */
static inline const uint8_t *q_row(const QIndex *w, size_t row_bytes, int r) {
    int s = 0;
    while (s + 1 < w->n_src && r >= w->rows[s]) r -= w->rows[s++];
    return w->src[s] + (size_t)r * row_bytes;
}

/* the f16 at p as a float */
static inline float q_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return half_to_float(h);
}

/* quant.c: the 32-element types; quant_k.c: the K types. y[n][rows] = x[n][cols] · W^T
   by the rule above (x is quantized inside); row_to_f32 dequantizes row `row` of an
   unpacked matrix as ggml's dequantize_row_* does */
void q32_matmul(float *y, const float *x, const QIndex *w, WType wt, int n, int cols, int rows);
void q32_row_to_f32(float *y, const void *w, WType wt, size_t row, int cols);
/* the bytes q32_pack writes for a matrix (0: the build reads the blocks in place), and
   the packing of w's rows (dst 64-aligned) */
size_t q32_panel_bytes(WType wt, int rows, int cols);
void q32_pack(uint8_t *dst, const QIndex *w, WType wt, int cols, int rows);
/* qk_panel_bytes, qk_pack: the same for the K types (quant_k.c's layout) */
size_t qk_panel_bytes(WType wt, int rows, int cols);
void qk_pack(uint8_t *dst, const QIndex *w, WType wt, int cols, int rows);
void qk_matmul(float *y, const float *x, const QIndex *w, WType wt, int n, int cols, int rows);
void qk_row_to_f32(float *y, const void *w, WType wt, size_t row, int cols);

#endif
