/* test_quant_k — the K block types (Q4_K, Q5_K, Q6_K) on random blocks and odd shapes:
   k_matmul against a double-precision product written here from ggml's block layouts
   (the weights decoded element by element, x quantized by quant.h's rule), within the
   float rounding the rule allows, and against the product with x unquantized within
   the activation quantization's error; batch invariance (a token alone vs in n = 1..13,
   1 vs 2 threads, rows from 3 sources vs one); k_row_to_f32 bit for bit against ggml's
   dequantization, written here again, and against gguf-py's on fixed blocks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "check.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint32_t r32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}
static float frand(void) { return (float)((r32() >> 8) * (2.0 / 16777216.0) - 1.0); } /* [-1, 1) */

enum { QK_K = 256 };
static int block_bytes(WType wt) { return wt == WT_Q4_K ? 144 : wt == WT_Q5_K ? 176 : 210; }
static const char *name(WType wt) { return wt == WT_Q4_K ? "q4_k" : wt == WT_Q5_K ? "q5_k" : "q6_k"; }

static double f16(const uint8_t *p) {
    int h = p[0] | p[1] << 8, e = (h >> 10) & 31, m = h & 1023;
    double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return h & 0x8000 ? -v : v;
}
static void put_f16(uint8_t *p, int e_lo, int e_hi, int negative) { /* a normal half, exponent field in [e_lo, e_hi] */
    int h = (e_lo + (int)(r32() % (uint32_t)(e_hi - e_lo + 1))) << 10 | (int)(r32() & 1023) | (negative ? 0x8000 : 0);
    p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8);
}
static void random_block(WType wt, uint8_t *b) {
    for (int i = 0; i < block_bytes(wt); i++) b[i] = (uint8_t)r32();
    if (wt == WT_Q6_K) put_f16(b + 208, 3, 12, r32() % 8 == 0); /* d ~ 2^-12 .. 2^-2 */
    else put_f16(b, 3, 12, r32() % 8 == 0), put_f16(b + 2, 3, 12, 0);
}

/* element i of a block as ggml lays it out: q · (d·sc) − (dmin·m) */
typedef struct {
    int q, sc, m;
} Elem;
static void scale_min(int j, const uint8_t *s, int *sc, int *m) { /* ggml's get_scale_min_k4 */
    if (j < 4) *sc = s[j] & 63, *m = s[j + 4] & 63;
    else *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
}
static Elem elem(WType wt, const uint8_t *b, int i) {
    Elem e = {0, 0, 0};
    if (wt == WT_Q6_K) { /* ql[128], qh[64], scales[16], d: 128-element halves of four 32-runs */
        int half = i / 128, run = i % 128 / 32, l = i % 32;
        int lo = b[64 * half + l + 32 * (run & 1)], hi = b[128 + 32 * half + l];
        e.q = ((run >= 2 ? lo >> 4 : lo & 15) | ((hi >> (2 * run)) & 3) << 4) - 32;
        e.sc = (int8_t)b[192 + i / 16];
        return e;
    }
    int sub = i / 32, l = i % 32; /* d, dmin, scales[12], (qh[32],) qs[128]: 64-element chunks */
    int byte = b[(wt == WT_Q4_K ? 16 : 48) + 32 * (sub / 2) + l];
    e.q = sub & 1 ? byte >> 4 : byte & 15;
    if (wt == WT_Q5_K) e.q += ((b[16 + l] >> sub) & 1) * 16;
    scale_min(sub, b + 4, &e.sc, &e.m);
    return e;
}
static double d_of(WType wt, const uint8_t *b) { return f16(wt == WT_Q6_K ? b + 208 : b); }
static double dmin_of(WType wt, const uint8_t *b) { return wt == WT_Q6_K ? 0 : f16(b + 2); }
/* ggml's dequantize_row_*: (d·sc)·q − dmin·m, each product rounded to float */
static float deq(WType wt, const uint8_t *b, int i) {
    Elem e = elem(wt, b, i);
    float d = (float)d_of(wt, b), dm = (float)dmin_of(wt, b);
    if (wt == WT_Q6_K) return d * (float)e.sc * (float)e.q;
    return d * (float)e.sc * (float)e.q - dm * (float)e.m;
}

/* x quantized per 256 by the rule: q[nb*256], dx[nb] */
static void quantize(const float *x, int cols, int8_t *q, float *dx) {
    for (int b = 0; b * QK_K < cols; b++) {
        float amax = 0;
        for (int i = b * QK_K; i < cols && i < (b + 1) * QK_K; i++) amax = fmaxf(amax, fabsf(x[i]));
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0;
        for (int i = b * QK_K; i < (b + 1) * QK_K; i++) {
            float v = i < cols ? nearbyintf(x[i] * id) : 0;
            q[i] = (int8_t)fmaxf(-127, fminf(127, v));
        }
        dx[b] = d;
    }
}

typedef struct {
    double exact, mag;  /* the rule's value in exact arithmetic; Σ |terms| */
    double plain, qerr; /* the product with x unquantized; the bound on the difference */
} Ref;
static Ref reference(WType wt, const uint8_t *row, const float *x, const int8_t *q, const float *dx, int cols) {
    Ref r = {0, 0, 0, 0};
    for (int b = 0; b * QK_K < cols; b++) {
        const uint8_t *blk = row + (size_t)b * block_bytes(wt);
        double d = d_of(wt, blk), dm = dmin_of(wt, blk), abs_w = 0;
        long long s = 0, ms = 0;
        for (int i = 0; i < QK_K; i++) {
            Elem e = elem(wt, blk, i);
            int qx = q[b * QK_K + i];
            s += (long long)e.sc * e.q * qx, ms += (long long)e.m * qx;
            if (b * QK_K + i < cols) {
                double w = d * e.sc * e.q - dm * e.m;
                r.plain += w * x[b * QK_K + i], abs_w += fabs(w);
            }
        }
        r.exact += d * dx[b] * (double)s - dm * dx[b] * (double)ms;
        r.mag += fabs(d * dx[b] * (double)s) + fabs(dm * dx[b] * (double)ms);
        r.qerr += abs_w * dx[b] * 0.5 * (1 + 1e-5) + abs_w * 1e-6 * dx[b] * 127;
    }
    return r;
}

static void make_x(float *x, int n, int cols) {
    for (int t = 0; t < n; t++) {
        float *v = x + (size_t)t * cols;
        for (int c = 0; c < cols; c++) v[c] = frand() * (c % 97 == 0 ? 8.0f : 1.0f);
        if (t == 1) memset(v, 0, sizeof(float) * (cols < QK_K ? cols : QK_K)); /* a block of zeros: dx = 0 */
        if (t == 2) v[cols / 2] = 1000.0f;                                     /* an outlier */
    }
}

#define MAXN 13
static void check_shape(WType wt, int rows, int cols) {
    int nb = (cols + QK_K - 1) / QK_K;
    size_t rb = (size_t)nb * block_bytes(wt);
    uint8_t *mem = malloc(rb * rows + 1), *w = mem + 1; /* blocks at odd addresses */
    for (int r = 0; r < rows; r++)
        for (int b = 0; b < nb; b++) random_block(wt, w + r * rb + (size_t)b * block_bytes(wt));
    /* the same rows in up to 3 separate sources */
    int ns = rows >= 3 ? 3 : 1, sr[3] = {rows, 0, 0};
    if (ns == 3) sr[0] = rows - 2 * (rows / 5), sr[1] = sr[2] = rows / 5;
    uint8_t *part[3];
    const void *src[3];
    for (int s = 0, r0 = 0; s < ns; r0 += sr[s++]) {
        part[s] = malloc(rb * sr[s] + 3);
        memcpy(part[s] + s + 1, w + r0 * rb, rb * sr[s]);
        src[s] = part[s] + s + 1;
    }
    void *one = malloc(k_packed_bytes(wt, rows, cols)), *split = malloc(k_packed_bytes(wt, rows, cols));
    const void *src1[1] = {w};
    k_pack(one, wt, cols, 1, src1, &rows);
    k_pack(split, wt, cols, ns, src, sr);

    float *x = malloc(sizeof(float) * MAXN * cols), *dx = malloc(sizeof(float) * MAXN * nb);
    int8_t *q = malloc((size_t)MAXN * nb * QK_K);
    make_x(x, MAXN, cols);
    for (int t = 0; t < MAXN; t++) quantize(x + (size_t)t * cols, cols, q + (size_t)t * nb * QK_K, dx + t * nb);
    float *alone = malloc(sizeof(float) * MAXN * rows), *y = malloc(sizeof(float) * MAXN * rows);

    k_init(1);
    for (int t = 0; t < MAXN; t++) k_matmul(alone + (size_t)t * rows, x + (size_t)t * cols, one, wt, 1, cols, rows);
    int bad = 0, bad_plain = 0, caught = 0, tried = 0;
    double worst = 0;
    for (int t = 0; t < MAXN; t++)
        for (int r = 0; r < rows; r++) {
            Ref f = reference(wt, w + r * rb, x + (size_t)t * cols, q + (size_t)t * nb * QK_K, dx + t * nb, cols);
            double tol = (2.0 * nb + 3) * 0x1p-24 * f.mag + 1e-30, got = alone[(size_t)t * rows + r];
            double err = fabs(got - f.exact);
            if (!(err <= tol)) bad++;
            if (f.mag > 0 && err / f.mag > worst) worst = err / f.mag;
            if (!(fabs(got - f.plain) <= f.qerr + tol)) bad_plain++;
            if (t == 0 && r < 4) { /* the tolerance is tight enough to see one scale step */
                uint8_t blk[210];
                memcpy(blk, w + r * rb, block_bytes(wt));
                uint8_t *sc = blk + (wt == WT_Q6_K ? 192 : 4);
                sc[0] ^= 1;
                const uint8_t *save = w + r * rb;
                uint8_t *tmp = malloc(rb);
                memcpy(tmp, save, rb), memcpy(tmp, blk, block_bytes(wt));
                Ref g = reference(wt, tmp, x, q, dx, cols);
                tried++, caught += fabs(got - g.exact) > tol;
                free(tmp);
            }
        }
    CHECK(bad == 0, "%s %dx%d: %d of %d outputs off the exact rule (worst %.3g of the magnitude)", name(wt), rows, cols,
          bad, MAXN * rows, worst);
    CHECK(bad_plain == 0, "%s %dx%d: %d outputs beyond the activation quantization bound", name(wt), rows, cols,
          bad_plain);
    CHECK(caught >= tried - 1, "%s %dx%d: a changed scale went unseen by the tolerance (%d of %d seen)", name(wt), rows,
          cols, caught, tried);

    int differ = 0;
    for (int threads = 1; threads <= 2; threads++) {
        k_init(threads);
        for (int n = 1; n <= MAXN; n++)
            for (int v = 0; v < 2; v++) {
                memset(y, 0xff, sizeof(float) * n * rows);
                k_matmul(y, x, v ? split : one, wt, n, cols, rows);
                differ += memcmp(y, alone, sizeof(float) * n * rows) != 0;
            }
    }
    CHECK(differ == 0, "%s %dx%d: %d calls (n = 1..13, 1-2 threads, 1 or %d sources) differ from tokens alone",
          name(wt), rows, cols, differ, ns);
    k_init(1);

    float *row = malloc(sizeof(float) * (cols + 1)), *want = malloc(sizeof(float) * cols);
    int deq_bad = 0;
    for (int r = 0; r < rows; r++) {
        row[cols] = 12345.0f;
        k_row_to_f32(row, w, wt, (size_t)r, cols);
        for (int c = 0; c < cols; c++) want[c] = deq(wt, w + r * rb + (size_t)(c / QK_K) * block_bytes(wt), c % QK_K);
        deq_bad += memcmp(row, want, sizeof(float) * cols) != 0 || row[cols] != 12345.0f;
    }
    CHECK(deq_bad == 0, "%s %dx%d: %d rows of k_row_to_f32 differ from ggml's dequantization", name(wt), rows, cols,
          deq_bad);
    for (int s = 0; s < ns; s++) free(part[s]);
    free(mem), free(one), free(split), free(x), free(dx), free(q), free(alone), free(y), free(row), free(want);
}

int main(void) {
    static const int cols[] = {64, 172, 256, 320, 576, 1536}, rows[] = {1, 7, 8, 9, 17, 65, 960};
    for (WType wt = WT_Q4_K; wt <= WT_Q6_K; wt++)
        for (int c = 0; c < 6; c++)
            for (int r = 0; r < 7; r++)
                if (rows[r] < 960 || cols[c] >= 576) check_shape(wt, rows[r], cols[c]);
    return check_done("test_quant_k");
}
