/* test_quant — the 32-element block types (Q8_0, Q4_0, Q4_1, Q5_0) through k_pack / k_matmul /
   k_row_to_f32, on random blocks and odd shapes, against this file's own reading of
   ggml's block layout: the product in double on the dequantized weights (with x quantized
   by quant.h's rule: only float rounding may differ; with x as given: also the
   activation quantization error, bounded per block), batch invariance (a token alone or
   among n, 1 or 2 threads, one source or several: the same bits), and the dequantized
   rows bit for bit, and against gguf-py's own dequantization (tests/gguf_pyw.h). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "rand.h"
#include "check.h"
#include "formats/gguf.h"
#include "gguf_pyw.h"


/* ggml's blocks, as the GGUF spec lays them out */
static size_t block_bytes(WType wt) { return wt == WT_Q8_0 ? 34 : wt == WT_Q4_0 ? 18 : wt == WT_Q4_1 ? 20 : 22; }
static const char *type_name(WType wt) {
    return wt == WT_Q8_0 ? "q8_0" : wt == WT_Q4_0 ? "q4_0" : wt == WT_Q4_1 ? "q4_1" : "q5_0";
}

static double half(const uint8_t *p) {
    unsigned h = p[0] | (unsigned)p[1] << 8, e = (h >> 10) & 31, m = h & 1023;
    double v = e ? ldexp(1024.0 + m, (int)e - 25) : ldexp(m, -24);
    return h & 0x8000 ? -v : v;
}
/* an f16 scale from a sane range: 2^-8 .. 2^1 mostly, sometimes zero or subnormal */
static void put_half(uint8_t *p) {
    unsigned r = (unsigned)urand(32), h;
    if (r == 0) h = 0;
    else if (r == 1) h = (unsigned)urand(1024);
    else h = (unsigned)(7 + urand(10)) << 10 | (unsigned)urand(1024);
    h |= (unsigned)urand(2) << 15;
    p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8);
}
static void random_row(uint8_t *row, WType wt, int nb) {
    for (int b = 0; b < nb; b++) {
        uint8_t *blk = row + (size_t)b * block_bytes(wt);
        for (size_t i = 0; i < block_bytes(wt); i++) blk[i] = (uint8_t)next32();
        put_half(blk);
        if (wt == WT_Q4_1) put_half(blk + 2);
        if (wt == WT_Q8_0 && urand(4) == 0) blk[2 + urand(32)] = 0x80; /* −128 */
    }
}
/* element k of a block as an integer, and its weight exactly (double) */
static int elem(const uint8_t *blk, WType wt, int k) {
    if (wt == WT_Q8_0) return (int8_t)blk[2 + k];
    const uint8_t *qs = blk + (wt == WT_Q4_1 ? 4 : wt == WT_Q5_0 ? 6 : 2);
    int v = k < 16 ? qs[k] & 15 : qs[k - 16] >> 4;
    if (wt == WT_Q5_0) /* qh: 4 bytes after d, little-endian, bit k = element k's fifth bit */
        return (v | (blk[2 + k / 8] >> (k % 8) & 1) << 4) - 16;
    return wt == WT_Q4_0 ? v - 8 : v;
}
static double weight(const uint8_t *blk, WType wt, int k) {
    return half(blk) * elem(blk, wt, k) + (wt == WT_Q4_1 ? half(blk + 2) : 0);
}
/* ggml's dequantize_row_*: float products (and Q4_1's added minimum), one rounding each */
static void dequant_f32(float *y, const uint8_t *row, WType wt, int cols) {
    for (int c = 0; c < cols; c++) {
        const uint8_t *blk = row + (size_t)(c / 32) * block_bytes(wt);
        float d = (float)half(blk), p = (float)elem(blk, wt, c % 32) * d;
        y[c] = wt == WT_Q4_1 ? p + (float)half(blk + 2) : p;
    }
}

/* quant.h's rule for x, per 32 elements (zero past cols) */
static void quantize(int8_t *q, float *d, const float *x, int cols) {
    for (int b = 0; b * 32 < cols; b++) {
        float amax = 0;
        for (int c = b * 32; c < b * 32 + 32 && c < cols; c++) amax = fabsf(x[c]) > amax ? fabsf(x[c]) : amax;
        d[b] = amax / 127.0f;
        float id = d[b] != 0 ? 1.0f / d[b] : 0.0f;
        for (int k = 0; k < 32; k++) {
            int c = b * 32 + k;
            float v = nearbyintf((c < cols ? x[c] : 0.0f) * id);
            q[b * 32 + k] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
        }
    }
}

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

/* one shape: rows split over n_src sources of rows, x [n][cols] */
static void run_case(WType wt, int rows, int cols, int n, int n_src) {
    int nb = (cols + 31) / 32;
    size_t rb = (size_t)nb * block_bytes(wt);
    uint8_t *W = malloc(rb * rows);
    for (int r = 0; r < rows; r++) random_row(W + rb * r, wt, nb);
    if (wt == WT_Q8_0 && rows > 1) /* a saturation trap: all −128 against x at ±127 */
        for (int b = 0; b < nb; b++) memset(W + rb + (size_t)b * 34 + 2, 0x80, 32);
    float *x = malloc(sizeof(float) * n * cols);
    for (int t = 0; t < n; t++)
        for (int c = 0; c < cols; c++) {
            float *v = &x[(size_t)t * cols + c];
            *v = frand(-2, 2);
            if ((c / 32) % 7 == 3 && t % 2) *v = 0; /* a zero block: d = 0 */
            if (urand(97) == 0) *v *= 50;           /* an outlier */
            if (t == 0) *v = c % 2 ? 1.5f : -1.5f;  /* every element at ±127 */
        }

    /* the sources: separate buffers */
    int src_rows[3] = {rows, 0, 0};
    if (n_src == 3) src_rows[0] = rows - 2 * (rows / 5), src_rows[1] = src_rows[2] = rows / 5;
    if (n_src == 2) src_rows[0] = rows / 2, src_rows[1] = rows - rows / 2;
    const void *src[3];
    uint8_t *copies[3] = {0};
    for (int s = 0, r0 = 0; s < n_src; r0 += src_rows[s++]) {
        copies[s] = malloc(rb * (src_rows[s] ? src_rows[s] : 1));
        memcpy(copies[s], W + rb * r0, rb * src_rows[s]);
        src[s] = copies[s];
    }
    const void *one = W;
    size_t pb = (k_packed_bytes(wt, rows, cols) + 63) & ~(size_t)63;
    void *P1 = aligned_alloc(64, pb), *Ps = aligned_alloc(64, pb);
    k_pack(P1, wt, cols, 1, &one, &rows);
    k_pack(Ps, wt, cols, n_src, src, src_rows);
    /* a packed form that copies the blocks reads nothing else: the sources go */
    if (k_packed_copies(wt))
        for (int s = 0; s < n_src; s++) memset(copies[s], 0x7f, rb * src_rows[s]);

    float *y = malloc(sizeof(float) * n * rows), *y2 = malloc(sizeof(float) * n * rows);
    float *y1 = malloc(sizeof(float) * rows);
    k_init(1);
    k_matmul(y, x, P1, wt, n, cols, rows);

    /* against the double product */
    int8_t *q = malloc((size_t)nb * 32);
    float *dx = malloc(sizeof(float) * nb);
    int bad_q = 0, bad_x = 0;
    double worst_q = 0, worst_x = 0;
    for (int t = 0; t < n; t++) {
        quantize(q, dx, x + (size_t)t * cols, cols);
        for (int r = 0; r < rows; r++) {
            const uint8_t *row = W + rb * r;
            double yq = 0, mag = 0, yx = 0, qerr = 0;
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = row + (size_t)b * block_bytes(wt);
                double part = 0, wabs = 0;
                for (int k = 0; k < 32; k++) {
                    int c = b * 32 + k;
                    double wv = weight(blk, wt, k);
                    part += wv * q[b * 32 + k];
                    if (c < cols) yx += wv * x[(size_t)t * cols + c], wabs += fabs(wv);
                }
                yq += part * dx[b];
                /* the magnitudes the float steps round: scale products and the chain's terms */
                for (int k = 0; k < 32; k++) mag += fabs(weight(blk, wt, k) * q[b * 32 + k]) * dx[b];
                if (wt == WT_Q4_1) /* its two fmas per block round the two halves apart */
                    for (int k = 0; k < 32; k++)
                        mag += fabs(half(blk) * elem(blk, wt, k) * q[b * 32 + k] * dx[b]) +
                               fabs(half(blk + 2) * q[b * 32 + k] * dx[b]);
                qerr += wabs * dx[b] * (0.5 + 1e-4);
            }
            double got = y[(size_t)t * rows + r], tol = (2.0 * nb + 2) * 0x1p-24 * mag + 1e-37;
            double e = fabs(got - yq);
            if (e > tol) bad_q++;
            if (e / (tol + 1e-300) > worst_q) worst_q = e / (tol + 1e-300);
            double ex = fabs(got - yx);
            if (ex > qerr + tol) bad_x++;
            if (ex / (qerr + tol) > worst_x) worst_x = ex / (qerr + tol);
        }
    }
    CHECK(bad_q == 0, "%s %dx%d n=%d: %d outputs off the double product of quantized x (worst %.3g × tol)",
          type_name(wt), rows, cols, n, bad_q, worst_q);
    CHECK(bad_x == 0, "%s %dx%d n=%d: %d outputs off the double product of x beyond the quantization bound (%.3g)",
          type_name(wt), rows, cols, n, bad_x, worst_x);

    /* batch invariance: alone, 2 threads, several sources */
    int alone = 0;
    for (int t = 0; t < n; t++) {
        k_matmul(y1, x + (size_t)t * cols, P1, wt, 1, cols, rows);
        alone += same_bits(y1, y + (size_t)t * rows, rows);
    }
    CHECK(alone == n, "%s %dx%d n=%d: %d of %d tokens alone give their bits in the batch", type_name(wt), rows, cols, n,
          alone, n);
    k_matmul(y2, x, Ps, wt, n, cols, rows);
    CHECK(same_bits(y, y2, (size_t)n * rows), "%s %dx%d n=%d: %d sources == one", type_name(wt), rows, cols, n, n_src);
    k_init(2);
    k_matmul(y2, x, Ps, wt, n, cols, rows);
    CHECK(same_bits(y, y2, (size_t)n * rows), "%s %dx%d n=%d: 2 threads == 1", type_name(wt), rows, cols, n);
    alone = 0;
    for (int t = 0; t < n; t++) {
        k_matmul(y1, x + (size_t)t * cols, P1, wt, 1, cols, rows);
        alone += same_bits(y1, y + (size_t)t * rows, rows);
    }
    CHECK(alone == n, "%s %dx%d n=%d: 2 threads, %d of %d tokens alone give their bits", type_name(wt), rows, cols, n,
          alone, n);
    k_init(1);

    /* dequantized rows, bit for bit, and nothing written past cols */
    float *a = malloc(sizeof(float) * (cols + 1)), *b = malloc(sizeof(float) * cols);
    int rows_ok = 0;
    for (int r = 0; r < rows; r++) {
        a[cols] = 12345.0f;
        k_row_to_f32(a, W, wt, (size_t)r, cols);
        dequant_f32(b, W + rb * r, wt, cols);
        rows_ok += same_bits(a, b, cols) && a[cols] == 12345.0f;
    }
    CHECK(rows_ok == rows, "%s %dx%d: %d of %d rows dequantize as ggml does", type_name(wt), rows, cols, rows_ok, rows);

    free(a), free(b), free(q), free(dx), free(y), free(y1), free(y2), free(P1), free(Ps), free(x), free(W);
    for (int s = 0; s < 3; s++) free(copies[s]);
}

/* gguf-py's blocks (quantized by gguf.quants.quantize) dequantized as gguf.quants.dequantize does */
static void test_gguf_py(void) {
    Gguf g;
    if (gguf_parse(&g, PYW_GGUF, sizeof PYW_GGUF, "gguf-py") != 0) {
        CHECK(0, "gguf-py file does not parse");
        return;
    }
    static const char *const names[] = {"q8", "q40", "q41"};
    static const WType wts[] = {WT_Q8_0, WT_Q4_0, WT_Q4_1};
    for (int i = 0; i < 3; i++) {
        const GgufTensor *t = gguf_tensor(&g, names[i]);
        float y[32];
        CHECK(t && t->dims[0] == 32 && t->nbytes == block_bytes(wts[i]), "gguf-py %s", names[i]);
        if (!t) continue;
        k_row_to_f32(y, t->data, wts[i], 0, 32);
        CHECK(same_bits(y, PYW_WANT + 32 * (3 + i), 32), "gguf-py %s: k_row_to_f32 == gguf.quants.dequantize",
              names[i]);
    }
    gguf_close(&g);
}

/* gguf-py 0.19.0's Q5_0 (test_gguf_py's file predates it): x =
   np.random.default_rng(23).standard_normal((1, 32)).astype(np.float32), x[0, 5] = 3.5;
   the block is gguf.quants.quantize(x, Q5_0), the floats gguf.quants.dequantize of it
   (d is negative: zeros come out −0) */
static void test_gguf_py_q5_0(void) {
    static const uint8_t blk[22] = {0x00, 0xb3, 0x0c, 0xd8, 0xf7, 0xdb, 0x3d, 0x2f, 0x10, 0xfb, 0x1e,
                                    0x20, 0x3c, 0x0d, 0x6c, 0x0c, 0xaf, 0x42, 0x01, 0x39, 0x53, 0x71};
    static const float want[32] = {0x1.5p-1f,  0x1.cp-3f,  -0x0p+0f,    -0x1.34p+1f, 0x1.cp-2f,  0x1.cp+1f,  0x1.cp-1f,
                                   0x1.5p-1f,  0x1.cp-1f,  0x1.cp-1f,   0x1.cp-3f,   -0x1.cp-2f, -0x1.cp-3f, 0x1.88p+0f,
                                   -0x1.5p-1f, -0x1.cp-3f, -0x1.5p-1f,  -0x1.cp-2f,  -0x1.cp-3f, 0x1.cp-3f,  -0x1.cp-3f,
                                   -0x1.cp-2f, -0x1.5p-1f, -0x0p+0f,    -0x1.5p+0f,  -0x0p+0f,   0x1.5p+0f,  -0x1.cp-1f,
                                   -0x0p+0f,   0x1.6cp+1f, -0x1.18p+0f, -0x1.88p+0f};
    float y[32];
    k_row_to_f32(y, blk, WT_Q5_0, 0, 32);
    CHECK(same_bits(y, want, 32), "gguf-py q5_0: k_row_to_f32 == gguf.quants.dequantize");
    float e[32];
    dequant_f32(e, blk, WT_Q5_0, 32);
    CHECK(same_bits(e, want, 32), "gguf-py q5_0: this file's reading of the block == gguf.quants.dequantize");
}

int main(void) {
    test_rng = 0x5eed2301;
    static const int cols[] = {32, 64, 96, 172, 576, 1536}, rows[] = {1, 7, 8, 9, 17, 65, 960};
    const WType types[] = {WT_Q8_0, WT_Q4_0, WT_Q4_1, WT_Q5_0};
    for (int ti = 0; ti < 4; ti++)
        for (int c = 0; c < 6; c++)
            for (int r = 0; r < 7; r++) {
                int nr = rows[r], n = 1 + urand(13), n_src = nr == 960 ? 3 : nr > 1 ? 2 : 1;
                run_case(types[ti], nr, cols[c], n, n_src);
            }
    for (int n = 1; n <= 13; n++) run_case(types[n % 4], 17, 172, n, 3); /* every n */
    for (int ti = 0; ti < 4; ti++) run_case(types[ti], 9, 1600, 70, 2);  /* many tokens */
    test_gguf_py();
    test_gguf_py_q5_0();
    k_init(1);
    return check_done("quant");
}
