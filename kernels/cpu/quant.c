/* quant.c — y[n][rows] = x[n][cols] · W^T for Q8_0, Q4_0 and Q4_1 weights, by quant.h's rule.

   x is quantized once per call (the caller's thread), then the threads take groups of 8
   rows. A group's blocks are read from memory once, unpacked into a small buffer that
   stays in L1 (nibbles as bytes, f16 scales as floats), and every token of the call runs
   over that buffer: verifying n tokens reads the weights as often as one token does.
   The AVX2 path keeps the group's 8 rows in the 8 lanes of one vector: each row's block
   sum comes from maddubs/madd (exact: |Σ of a pair| ≤ 2·128·127 for Q8_0 with the sign
   moved onto x, 2·15·127 for the nibbles), the 8 rows' sums are reduced into one vector
   by a hadd tree, and one fmadd per block advances the 8 rows' chains at once — the
   scalar chain's operations lane by lane, so the bits are the spec's. */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"
#include "quant.h"

#define GROUP 8  /* rows a group (and a vector) holds */
#define CHUNK 64 /* blocks unpacked at a time: 8 rows × 64 blocks × 32 bytes = 16 KiB */
#define STACK_BYTES 32768

static size_t block_bytes(WType wt) { return wt == WT_Q8_0 ? Q8_0_BYTES : wt == WT_Q4_0 ? Q4_0_BYTES : Q4_1_BYTES; }

/* x's rows quantized: per block 32 int8, the scale, and Σ q (exact in an int and a float) */
typedef struct {
    int8_t *q;   /* [n][nb * QK] */
    float *d;    /* [n][nb] */
    int32_t *si; /* [n][nb] */
    float *sf;   /* [n][nb] */
} QX;

static void quantize_row(int8_t *q, float *d, int32_t *si, float *sf, const float *x, int cols) {
    int nb = (cols + QK - 1) / QK;
    for (int b = 0; b < nb; b++) {
        float v[QK], amax = 0;
        for (int i = 0; i < QK; i++) {
            int c = b * QK + i;
            v[i] = c < cols ? x[c] : 0.0f;
            float a = fabsf(v[i]);
            amax = a > amax ? a : amax;
        }
        float dd = amax / 127.0f, id = dd != 0 ? 1.0f / dd : 0.0f;
        int32_t s = 0;
        for (int i = 0; i < QK; i++) {
            float r = nearbyintf(v[i] * id);
            r = r > 127 ? 127 : r < -127 ? -127 : r;
            q[b * QK + i] = (int8_t)r;
            s += (int32_t)r;
        }
        d[b] = dd, si[b] = s, sf[b] = (float)s;
    }
}

typedef struct {
    float *y;
    const QIndex *w;
    WType wt;
    int n, cols, rows, nb;
    size_t row_bytes;
    QX x;
} Job;

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
/* 8 rows' int32 vectors → one vector whose lane i is the sum of s[i]'s lanes */
static inline __m256i reduce8(const __m256i s[GROUP]) {
    __m256i a = _mm256_hadd_epi32(s[0], s[1]), b = _mm256_hadd_epi32(s[2], s[3]);
    __m256i c = _mm256_hadd_epi32(s[4], s[5]), d = _mm256_hadd_epi32(s[6], s[7]);
    a = _mm256_hadd_epi32(a, b), c = _mm256_hadd_epi32(c, d); /* [r0..r3 | r0..r3] halves, [r4..r7 | ...] */
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, c, 0x20), _mm256_permute2x128_si256(a, c, 0x31));
}

/* one group of 8 rows (pointers p; a short group repeats its last row) for every token */
static void group_avx2(const Job *j, const uint8_t *const p[GROUP], float *acc /* [n][GROUP] */) {
    _Alignas(32) uint8_t U[CHUNK][GROUP][QK];
    _Alignas(32) float D[CHUNK][GROUP], M[CHUNK][GROUP];
    const size_t bb = block_bytes(j->wt);
    const __m256i ones = _mm256_set1_epi16(1), low = _mm256_set1_epi8(0x0f);
    for (int t = 0; t < j->n; t++) _mm256_storeu_ps(acc + (size_t)t * GROUP, _mm256_setzero_ps());
    for (int c0 = 0; c0 < j->nb; c0 += CHUNK) {
        int nc = j->nb - c0 < CHUNK ? j->nb - c0 : CHUNK;
        for (int b = 0; b < nc; b++) {
            _Alignas(16) uint16_t hd[GROUP], hm[GROUP];
            for (int i = 0; i < GROUP; i++) {
                const uint8_t *blk = p[i] + (size_t)(c0 + b) * bb;
                memcpy(&hd[i], blk, 2);
                if (j->wt == WT_Q8_0) {
                    _mm256_store_si256((__m256i *)U[b][i], _mm256_loadu_si256((const __m256i *)(blk + 2)));
                } else {
                    const uint8_t *qs = blk + (j->wt == WT_Q4_1 ? 4 : 2);
                    if (j->wt == WT_Q4_1) memcpy(&hm[i], blk + 2, 2);
                    __m128i q = _mm_loadu_si128((const __m128i *)qs);
                    __m256i v = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
                    _mm256_store_si256((__m256i *)U[b][i], _mm256_and_si256(v, low));
                }
            }
            _mm256_store_ps(D[b], _mm256_cvtph_ps(_mm_load_si128((const __m128i *)hd)));
            if (j->wt == WT_Q4_1) _mm256_store_ps(M[b], _mm256_cvtph_ps(_mm_load_si128((const __m128i *)hm)));
        }
        for (int t = 0; t < j->n; t++) {
            size_t xo = (size_t)t * j->nb + c0;
            const int8_t *xq = j->x.q + xo * QK;
            const float *dx = j->x.d + xo, *sf = j->x.sf + xo;
            const int32_t *si = j->x.si + xo;
            __m256 a = _mm256_loadu_ps(acc + (size_t)t * GROUP);
            for (int b = 0; b < nc; b++) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + (size_t)b * QK)), s[GROUP];
                if (j->wt == WT_Q8_0)
                    for (int i = 0; i < GROUP; i++) {
                        __m256i w = _mm256_load_si256((const __m256i *)U[b][i]);
                        s[i] =
                            _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xv, w)), ones);
                    }
                else
                    for (int i = 0; i < GROUP; i++)
                        s[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_load_si256((const __m256i *)U[b][i]), xv),
                                                 ones);
                __m256i sum = reduce8(s);
                if (j->wt == WT_Q4_0) sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(8 * si[b]));
                __m256 d = _mm256_set1_ps(dx[b]);
                a = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_load_ps(D[b]), d), _mm256_cvtepi32_ps(sum), a);
                if (j->wt == WT_Q4_1)
                    a = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_load_ps(M[b]), d), _mm256_set1_ps(sf[b]), a);
            }
            _mm256_storeu_ps(acc + (size_t)t * GROUP, a);
        }
    }
}
#else
/* the spec: each output one fmaf chain over its row's blocks in order */
static void group_scalar(const Job *j, const uint8_t *const p[GROUP], float *acc /* [n][GROUP] */) {
    const size_t bb = block_bytes(j->wt);
    for (int i = 0; i < GROUP; i++)
        for (int t = 0; t < j->n; t++) {
            float a = 0;
            for (int b = 0; b < j->nb; b++) {
                const uint8_t *blk = p[i] + (size_t)b * bb;
                size_t xo = (size_t)t * j->nb + b;
                const int8_t *xq = j->x.q + xo * QK;
                float dx = j->x.d[xo], dw = q_f16(blk);
                int32_t s = 0;
                if (j->wt == WT_Q8_0) {
                    for (int k = 0; k < QK; k++) s += (int8_t)blk[2 + k] * xq[k];
                } else {
                    const uint8_t *qs = blk + (j->wt == WT_Q4_1 ? 4 : 2);
                    int off = j->wt == WT_Q4_0 ? 8 : 0;
                    for (int k = 0; k < QK / 2; k++)
                        s += ((qs[k] & 15) - off) * xq[k] + ((qs[k] >> 4) - off) * xq[k + QK / 2];
                }
                a = fmaf(dw * dx, (float)s, a);
                if (j->wt == WT_Q4_1) a = fmaf(q_f16(blk + 2) * dx, j->x.sf[xo], a);
            }
            acc[(size_t)t * GROUP + i] = a;
        }
}
#endif

static void matmul_rows(void *ctx, int begin, int end) {
    const Job *j = ctx;
    size_t acc_bytes = sizeof(float) * GROUP * (size_t)j->n;
    _Alignas(32) float stack_acc[GROUP * 64];
    float *acc = acc_bytes <= sizeof stack_acc ? stack_acc : malloc(acc_bytes);
    if (!acc) return; /* out of memory: y keeps what it held */
    for (int r0 = begin; r0 < end; r0 += GROUP) {
        int nr = end - r0 < GROUP ? end - r0 : GROUP;
        const uint8_t *p[GROUP];
        for (int i = 0; i < GROUP; i++) p[i] = q_row(j->w, j->row_bytes, r0 + (i < nr ? i : nr - 1));
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
        group_avx2(j, p, acc);
#else
        group_scalar(j, p, acc);
#endif
        for (int t = 0; t < j->n; t++)
            memcpy(j->y + (size_t)t * j->rows + r0, acc + (size_t)t * GROUP, sizeof(float) * nr);
    }
    if (acc != stack_acc) free(acc);
}

void q32_matmul(float *y, const float *x, const QIndex *w, WType wt, int n, int cols, int rows) {
    if (n < 1 || rows < 1 || cols < 1) return;
    int nb = (cols + QK - 1) / QK;
    size_t per_token = (size_t)nb * (QK + 3 * sizeof(float)), bytes = per_token * (size_t)n;
    _Alignas(32) unsigned char stack[STACK_BYTES];
    unsigned char *buf = bytes <= sizeof stack ? stack : malloc(bytes);
    if (!buf) return;
    Job j = {y, w, wt, n, cols, rows, nb, q_row_bytes(wt, cols), {0}};
    j.x.q = (int8_t *)buf;
    j.x.d = (float *)(buf + (size_t)n * nb * QK);
    j.x.si = (int32_t *)(j.x.d + (size_t)n * nb);
    j.x.sf = (float *)(j.x.si + (size_t)n * nb);
    for (int t = 0; t < n; t++) {
        size_t o = (size_t)t * nb;
        quantize_row(j.x.q + o * QK, j.x.d + o, j.x.si + o, j.x.sf + o, x + (size_t)t * cols, cols);
    }
    /* below ~64K multiply-adds per thread the hand-off costs more than it saves */
    long per_row = (long)cols * n;
    pool_run(matmul_rows, &j, rows, GROUP, 1 + (int)(65536 / per_row));
    if (buf != stack) free(buf);
}

/* as ggml's dequantize_row_q8_0 / q4_0 / q4_1: d·q, (q − 8)·d, d·q + m (two roundings) */
void q32_row_to_f32(float *y, const void *w, WType wt, size_t row, int cols) {
    const uint8_t *r = (const uint8_t *)w + row * q_row_bytes(wt, cols);
    const size_t bb = block_bytes(wt);
    for (int c0 = 0, b = 0; c0 < cols; c0 += QK, b++) {
        const uint8_t *blk = r + (size_t)b * bb;
        float d = q_f16(blk), v[QK];
        if (wt == WT_Q8_0) {
            for (int k = 0; k < QK; k++) v[k] = (float)(int8_t)blk[2 + k] * d;
        } else if (wt == WT_Q4_0) {
            for (int k = 0; k < QK / 2; k++)
                v[k] = (float)((blk[2 + k] & 15) - 8) * d, v[k + QK / 2] = (float)((blk[2 + k] >> 4) - 8) * d;
        } else {
            float m = q_f16(blk + 2);
            for (int k = 0; k < QK / 2; k++) {
                float p0 = (float)(blk[4 + k] & 15) * d, p1 = (float)(blk[4 + k] >> 4) * d;
                v[k] = p0 + m, v[k + QK / 2] = p1 + m;
            }
        }
        memcpy(y + c0, v, sizeof(float) * (size_t)(cols - c0 < QK ? cols - c0 : QK));
    }
}
