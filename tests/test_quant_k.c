/* test_quant_k — the K block types (Q4_K, Q5_K, Q6_K) on random blocks and odd shapes:
   k_matmul against a double-precision product written here from ggml's block layouts
   (the weights decoded element by element, x quantized by quant.h's rule), within the
   float rounding the rule allows, and against the product with x unquantized within
   the activation quantization's error; batch invariance (a token alone vs in n = 1..13,
   1 vs 2 threads, rows from 3 sources vs one); k_row_to_f32 bit for bit against ggml's
   dequantization, written here again, and against gguf-py's on fixed blocks (the matmul too). */
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

/* gguf-py 0.19.0 (llama.cpp's Python package): one random block of each type (bytes from
   numpy's default_rng(23), then d and dmin set to halves in 0.001 .. 0.05, Q6_K's negative)
   and gguf.quants.dequantize of it, as float bits */
static const uint8_t PY_Q4_K[144] = {
    12,  40,  201, 40,  47,  153, 165, 177, 145, 200, 30,  108, 32,  155, 54,  164, 188, 17,  119, 67,  240,
    211, 238, 32,  233, 15,  34,  155, 132, 248, 27,  29,  178, 102, 192, 30,  239, 166, 65,  167, 234, 127,
    191, 168, 54,  42,  124, 218, 120, 182, 205, 111, 31,  204, 167, 51,  31,  132, 164, 51,  196, 17,  208,
    55,  69,  96,  156, 27,  56,  23,  114, 183, 62,  170, 51,  195, 11,  198, 127, 120, 43,  226, 15,  175,
    4,   252, 75,  106, 19,  161, 124, 187, 34,  192, 97,  89,  14,  179, 160, 122, 53,  184, 88,  16,  222,
    24,  23,  48,  121, 0,   101, 116, 110, 25,  14,  39,  201, 10,  44,  77,  192, 207, 89,  4,   187, 136,
    154, 99,  213, 247, 13,  35,  56,  245, 80,  138, 65,  9,   56,  85,  235, 187, 255, 174};
static const uint32_t PY_Q4_K_F32[256] = {
    0x41899170, 0x3f59b600, 0x411c4260, 0x4074a180, 0xbf22b200, 0x4074a180, 0x41a157f0, 0xbf22b200, 0x414bcf60,
    0x41ad3b30, 0x40158780, 0x417b5c60, 0x40a9ddc0, 0x413408e0, 0x417b5c60, 0x419574b0, 0x40158780, 0x41047be0,
    0xbf22b200, 0x41a157f0, 0x41ad3b30, 0x41047be0, 0x3f59b600, 0x411c4260, 0x416395e0, 0x41ad3b30, 0x41ad3b30,
    0x413408e0, 0x41047be0, 0x416395e0, 0x41899170, 0x416395e0, 0x41065380, 0x3efb9000, 0x40a77b00, 0x40373400,
    0x4138e980, 0x411f9e80, 0x412c4400, 0x3fa41000, 0x412c4400, 0xbe992000, 0x3fa41000, 0x40da1100, 0x40c0c600,
    0x4138e980, 0x3efb9000, 0x3efb9000, 0x41065380, 0x408e3000, 0x4112f900, 0x3efb9000, 0x412c4400, 0x40f35c00,
    0x40373400, 0x40f35c00, 0x412c4400, 0x40a77b00, 0x41065380, 0x40f35c00, 0x40049e00, 0x3fa41000, 0x40a77b00,
    0x411f9e80, 0x4103ca40, 0x40bcb680, 0x41615fc0, 0x41836760, 0x41836760, 0x414ea840, 0x40e22580, 0x4018d300,
    0x41836760, 0x4063b100, 0x4063b100, 0x4018d300, 0x4063b100, 0x3d45c000, 0xbf8f8e00, 0x40e22580, 0x40974780,
    0xbf8f8e00, 0x414ea840, 0x413bf0c0, 0x4103ca40, 0x40e22580, 0x3f9bea00, 0x40e22580, 0x41741740, 0x41293940,
    0x4018d300, 0x4018d300, 0x413bf0c0, 0x40bcb680, 0x41836760, 0x4103ca40, 0x41133100, 0x41765700, 0x41879040,
    0x40f4cf00, 0xbdc40000, 0x41879040, 0x415d8d80, 0x40402c00, 0xbdc40000, 0x412bfa80, 0x415d8d80, 0x40402c00,
    0x41879040, 0xbdc40000, 0x4193f500, 0x40402c00, 0x4091a900, 0x40f4cf00, 0x4144c400, 0xbdc40000, 0x40402c00,
    0xbdc40000, 0x41133100, 0x41765700, 0x40402c00, 0x415d8d80, 0x40402c00, 0x41879040, 0xbfd28c00, 0x41879040,
    0x41133100, 0x41133100, 0xbfa2b200, 0xbfa2b200, 0xbfa2b200, 0xbfa2b200, 0xbfa2b200, 0xbfa2b200, 0xbfa2b200,
    0xbfa2b200, 0xbfa2b200, 0xbfa2b200, 0xbfa2b200, 0xbfa2b200, 0xbfa2b200, 0xbfa2b200, 0xbfa2b200, 0xbfa2b200,
    0xbfa2b200, 0xbfa2b200, 0xbfa2b200, 0xbfa2b200, 0xbfa2b200, 0xbfa2b200, 0xbfa2b200, 0xbfa2b200, 0xbfa2b200,
    0xbfa2b200, 0xbfa2b200, 0xbfa2b200, 0xbfa2b200, 0xbfa2b200, 0xbfa2b200, 0xbfa2b200, 0x3f168e00, 0x41873770,
    0xc0086080, 0x41376ce0, 0xc0086080, 0x419217b0, 0x4053a780, 0x40c0d5c0, 0xbf457a00, 0x41376ce0, 0x40ec56c0,
    0x414d2d60, 0x3f168e00, 0x4162ede0, 0x40c0d5c0, 0x409554c0, 0xc0086080, 0x414d2d60, 0x41376ce0, 0x40ec56c0,
    0x3ff94b00, 0x414d2d60, 0x409554c0, 0xbf457a00, 0x4178ae60, 0xbf457a00, 0xbf457a00, 0x3ff94b00, 0x40ec56c0,
    0xc0086080, 0x40c0d5c0, 0x40ec56c0, 0x4185a950, 0x412b35a0, 0x4185a950, 0x4104c3a0, 0x412b35a0, 0x413e6ea0,
    0x4164e0a0, 0x417819a0, 0xbde5b000, 0x418f45d0, 0x412b35a0, 0x40963140, 0x4151a7a0, 0x4117fca0, 0x413e6ea0,
    0x405f7e80, 0x40bca340, 0x4104c3a0, 0x417819a0, 0x405f7e80, 0x4117fca0, 0x40bca340, 0xbde5b000, 0x413e6ea0,
    0x3f8b6d00, 0x412b35a0, 0x4117fca0, 0x40bca340, 0x4151a7a0, 0x4151a7a0, 0x418f45d0, 0x4185a950, 0x40bb6d80,
    0x3e2a3000, 0xbf78d400, 0x3fa6f600, 0x414afac0, 0xbf78d400, 0x3fa6f600, 0x40652b00, 0x414afac0, 0x414afac0,
    0x40970180, 0xbf78d400, 0x4138c4c0, 0x410222c0, 0x411458c0, 0x40bb6d80, 0x415d30c0, 0x4180ce60, 0xbf78d400,
    0x3fa6f600, 0x401c5300, 0x4180ce60, 0x40970180, 0x410222c0, 0x40652b00, 0xbf78d400, 0x401c5300, 0x40970180,
    0x416f66c0, 0x4138c4c0, 0x4180ce60, 0x41268ec0};
static const uint8_t PY_Q5_K[176] = {
    57,  42,  51,  38,  131, 228, 169, 4,   64,  198, 13,  70,  133, 101, 125, 167, 37,  111, 135, 74,  119, 156,
    196, 138, 6,   39,  221, 242, 16,  124, 241, 217, 79,  177, 102, 28,  125, 56,  100, 240, 37,  226, 9,   119,
    58,  96,  72,  3,   204, 57,  187, 55,  198, 82,  13,  212, 185, 130, 27,  199, 161, 213, 217, 64,  229, 229,
    118, 44,  225, 220, 236, 159, 48,  53,  201, 116, 241, 235, 176, 195, 150, 134, 216, 0,   154, 190, 212, 216,
    117, 255, 3,   149, 78,  90,  203, 240, 13,  239, 109, 10,  99,  14,  124, 162, 252, 216, 28,  24,  59,  23,
    245, 219, 53,  191, 66,  216, 49,  47,  105, 127, 174, 97,  54,  42,  97,  137, 189, 59,  126, 119, 245, 145,
    29,  141, 249, 40,  170, 90,  165, 142, 111, 229, 116, 127, 201, 236, 231, 201, 4,   123, 207, 190, 194, 207,
    7,   247, 80,  41,  8,   115, 88,  12,  176, 104, 8,   53,  104, 174, 164, 246, 41,  67,  109, 172, 20,  32};
static const uint32_t PY_Q5_K_F32[256] = {
    0x4082ad00, 0x40695980, 0x407c0480, 0x3f82ad00, 0x404d5900, 0x3e955800, 0x3ff2af00, 0x3f155800, 0x3fa80300,
    0x40280300, 0x407c0480, 0x3f82ad00, 0x3e155800, 0x3f3aae00, 0x40695980, 0x40155800, 0x40440380, 0x40440380,
    0x3f600400, 0x3fe00400, 0x401ead80, 0x3fe00400, 0x3fe00400, 0x400c0280, 0x40155800, 0x3f3aae00, 0x40695980,
    0x403aae00, 0x3e155800, 0x3fcd5900, 0x00000000, 0x40315880, 0x41a6d970, 0x42046d98, 0x423c6e98, 0x42046d98,
    0x42436eb8, 0x4109af60, 0xbe14c800, 0x424a6ed8, 0x423c6e98, 0x42276e38, 0x3fcd6b00, 0x42436eb8, 0x418ad8f0,
    0x41b4d9b0, 0x41b4d9b0, 0x40db5dc0, 0x42516ef8, 0x41c2d9f0, 0x42206e18, 0x4056b780, 0x41c2d9f0, 0x41b4d9b0,
    0x41c2d9f0, 0x4179b160, 0x40a35cc0, 0x42046d98, 0x41a6d970, 0x42206e18, 0x42586f18, 0x41c2d9f0, 0x4198d930,
    0x42436eb8, 0x422e2454, 0x422e2454, 0x423e1664, 0xbea12e00, 0x424e0874, 0x426dec94, 0x421e3244, 0x417a1790,
    0x42262b4c, 0x4275e59c, 0x4216393c, 0x411a6b30, 0x41dcb828, 0x424e0874, 0x41ace1f8, 0xbea12e00, 0x4265f38c,
    0x41ecaa38, 0x4265f38c, 0x424e0874, 0x4216393c, 0x41dcb828, 0x425dfa84, 0x406afb40, 0x425dfa84, 0x417a1790,
    0x41bcd408, 0x423e1664, 0x41ace1f8, 0x415a3370, 0x411a6b30, 0x41ace1f8, 0x3fcd6b00, 0x4090b1c0, 0x40187d80,
    0x403dd380, 0x3fcd6b00, 0x40a35cc0, 0x40187d80, 0x40afcec0, 0x3f9ba300, 0x40316180, 0x403dd380, 0x3fcd6b00,
    0x3f21ee00, 0x407c0d80, 0x400c0b80, 0x40bc40c0, 0x403dd380, 0x4024ef80, 0x3f82bf00, 0x403dd380, 0x40843fc0,
    0x403dd380, 0x3f9ba300, 0x3fe64f00, 0x40316180, 0x40187d80, 0x404a4580, 0x3d496000, 0x40632980, 0x3d496000,
    0x40bc40c0, 0x40187d80, 0x410699a0, 0x41d332f0, 0x40410b00, 0x415cf080, 0x41effa90, 0x425cb7f8, 0x4179b820,
    0x41d332f0, 0x41c4cf20, 0x3f9bd900, 0x421bf6d0, 0x4238be70, 0x41effa90, 0x42318c88, 0x424e5428, 0x423ff058,
    0x41c4cf20, 0x422328b8, 0x410699a0, 0x41effa90, 0x424e5428, 0x424e5428, 0x4179b820, 0x422a5aa0, 0x418b3fe0,
    0x418b3fe0, 0x410699a0, 0x42558610, 0x425cb7f8, 0x410699a0, 0x40d3a400, 0x41d332f0, 0x423e96b0, 0x428884f8,
    0x410ffa60, 0x4200c040, 0x423e96b0, 0x40761c80, 0x41626da0, 0x4185d3a0, 0x41c3aa10, 0x425d81e8, 0x40cd8180,
    0x42344848, 0x41626da0, 0x42721eb8, 0x428884f8, 0x40cd8180, 0x4185d3a0, 0x4267d050, 0x429d21c8, 0x41af0d40,
    0x4229f9e0, 0x42721eb8, 0x429d21c8, 0x42344848, 0x42835dc4, 0x42533380, 0x41c3aa10, 0x42721eb8, 0x425d81e8,
    0x4297fa94, 0x4185d3a0, 0x4185d3a0, 0x419c27a8, 0x427456cc, 0x41724e10, 0x425a1654, 0x422e558c, 0x41bf2848,
    0x42874ba2, 0x41f3a938, 0x408695e0, 0x420294c4, 0x42489604, 0x42489604, 0xbe2d9400, 0x425a1654, 0x4251562c,
    0x42259564, 0x4251562c, 0x41d0a898, 0x420b54ec, 0x418aa758, 0x4251562c, 0x412c4cd0, 0x4251562c, 0x4282eb8e,
    0x41094c30, 0x423fd5dc, 0x419c27a8, 0x42259564, 0x41e228e8, 0x427456cc, 0x422e558c, 0xbe2d9400, 0x405d0e80,
    0x40844ec0, 0x41194560, 0x405d0e80, 0xbf212e00, 0x40e65080, 0x410e61a0, 0x4108efc0, 0x405d0e80, 0x405d0e80,
    0x409a1640, 0x411eb740, 0x3f893400, 0x3d50e000, 0x409a1640, 0x40e65080, 0x3f893400, 0x409a1640, 0x40474700,
    0x3fb4c300, 0xbf212e00, 0x3ec85800, 0x3fb4c300, 0x41037de0, 0x40317f80, 0x411eb740, 0x3d50e000, 0x3f3b4a00,
    0x3fb4c300, 0x40317f80, 0xbe942000, 0x3d50e000};
static const uint8_t PY_Q6_K[210] = {
    147, 2,   246, 209, 113, 138, 171, 211, 56,  253, 105, 12,  177, 223, 154, 186, 81,  216, 102, 8,   225,
    220, 218, 199, 84,  48,  232, 24,  130, 130, 29,  98,  201, 234, 87,  247, 9,   63,  80,  28,  169, 198,
    251, 16,  144, 130, 143, 116, 162, 87,  253, 151, 106, 185, 207, 84,  106, 145, 133, 93,  12,  248, 12,
    102, 65,  212, 35,  48,  155, 231, 16,  254, 244, 115, 139, 70,  255, 105, 28,  79,  124, 167, 252, 60,
    40,  160, 82,  200, 20,  10,  55,  182, 124, 167, 150, 42,  205, 117, 136, 224, 4,   15,  252, 151, 137,
    133, 124, 140, 227, 237, 193, 88,  167, 187, 2,   22,  117, 155, 12,  62,  193, 160, 203, 8,   77,  48,
    131, 100, 76,  95,  187, 94,  66,  33,  48,  239, 120, 94,  228, 43,  79,  91,  15,  148, 28,  100, 173,
    156, 86,  35,  167, 132, 98,  30,  49,  130, 142, 117, 184, 205, 244, 169, 147, 229, 220, 211, 242, 128,
    33,  24,  70,  92,  94,  227, 212, 28,  200, 115, 205, 99,  162, 94,  146, 33,  95,  125, 226, 119, 64,
    249, 235, 183, 139, 158, 163, 220, 114, 128, 127, 119, 117, 22,  253, 207, 200, 249, 117, 53,  75,  163};
static const uint32_t PY_Q6_K_F32[256] = {
    0xc2415216, 0x41effbf8, 0x4212a834, 0x3fd551c0, 0x3fd551c0, 0xc11ffd50, 0xc20bfda6, 0x41fd5114, 0xc21ffd50,
    0x41ad526c, 0xc21952c2, 0x423aa788, 0x41e2a6dc, 0x424ea732, 0x422d526c, 0xc212a834, 0xc22d1814, 0xc2060220,
    0xc15f58e0, 0xc2060220, 0x3fb2ad80, 0x421c57d0, 0x42112cf8, 0xc20b978c, 0x40b2ad80, 0x00000000, 0xc132ad80,
    0x4132ad80, 0x4032ad80, 0xc19c57d0, 0xc1d42e08, 0xc19c57d0, 0x4204784e, 0x4209c4cc, 0x41145dc8, 0x41f3bea4,
    0xc1f3bea4, 0xc1b428bc, 0xc2298fc0, 0x42145dc8, 0x413ec1b8, 0x41e925a8, 0xc0d3f3b0, 0x00000000, 0x41a98fc0,
    0x40298fc0, 0x42244342, 0xc17e57a0, 0x4113aec0, 0xc093aec0, 0x416deee0, 0x413cb4a0, 0xc044e900, 0xc13cb4a0,
    0xbf034600, 0xc0c4e900, 0xc1348040, 0x410b7a60, 0xc15d8620, 0xc11be320, 0x4165ba80, 0xc0834600, 0x40c4e900,
    0x41348040, 0x42156454, 0x41cfd980, 0xc2495ab4, 0x409be320, 0x422261ec, 0xc14fd980, 0xc228e0b8, 0xc1a8e0b8,
    0xc1f6d248, 0x3fcfd980, 0xc11be320, 0x80000000, 0x420866bc, 0x409be320, 0x42156454, 0x4101e7f0, 0xc1a07200,
    0x41bd9e00, 0x412f0800, 0xc1e96000, 0xc0696000, 0x41bd9e00, 0x41bd9e00, 0xc211dc00, 0x4111dc00, 0xc1bd9e00,
    0x425aca00, 0xc2621500, 0xc22f0800, 0x422f0800, 0x41f7f600, 0xc23d9e00, 0x40e78d40, 0x40678d40, 0xc110b848,
    0x3fe78d40, 0x41e78d40, 0x4251d802, 0x42435f2e, 0xc1f60614, 0x412da9f0, 0x40e78d40, 0xc26050d6, 0x426050d6,
    0x414a9b98, 0x41678d40, 0x422da9f0, 0xc14a9b98, 0x421529fc, 0x419529fc, 0xc1cb67cc, 0xc1741628, 0x41879a88,
    0x420e6242, 0xc1a2b970, 0xc1079a88, 0x41879a88, 0x421bf1b6, 0x4222b970, 0xc1079a88, 0x80000000, 0x3fd8f740,
    0x80000000, 0xc21529fc, 0x424ea732, 0x419ffd50, 0xc1fd5114, 0x41d551c0, 0x420bfda6, 0xc21952c2, 0x80000000,
    0x41effbf8, 0x419ffd50, 0x42415216, 0xc192a834, 0x422d526c, 0xc1c7fca4, 0xc226a7de, 0x42055318, 0x41e2a6dc,
    0x40c88e80, 0xc0e6a3e0, 0x3fa07200, 0xc10c63c0, 0xc0207200, 0x80000000, 0xbf207200, 0x40207200, 0xc0c88e80,
    0x3ff0ab00, 0xc00c63c0, 0xc0dc9cc0, 0x40c88e80, 0x40348040, 0xc0dc9cc0, 0xc1025ca0, 0xbe034600, 0x3e5aca00,
    0xbf834600, 0xbf2f0800, 0x3f5aca00, 0xbf39f880, 0xbf5aca00, 0xbf88be40, 0xbf7b9b80, 0x3e5aca00, 0xbe2f0800,
    0x3f992700, 0x3f4fd980, 0xbf4fd980, 0xbf241780, 0x3f834600, 0x409c57d0, 0xc16a83b8, 0x41490330, 0xc1912cf8,
    0xc196c264, 0x4196c264, 0xc15f58e0, 0xc1490330, 0x413dd858, 0x4132ad80, 0xc16a83b8, 0xc0b2ad80, 0xc1542e08,
    0x00000000, 0x40060220, 0xc1060220, 0x417f4100, 0x4125ea40, 0xc132ad80, 0x40192700, 0xc0b2ad80, 0xbfcc3400,
    0x4158f740, 0xc158f740, 0x413f70c0, 0xc0e5ba80, 0xc1992700, 0xc1192700, 0xbf4c3400, 0x40992700, 0xc13f70c0,
    0xc1192700, 0xc01f88a0, 0x4025ea40, 0xbfd8f740, 0x3e992700, 0x3e4c3400, 0xbf192700, 0xbf8c63c0, 0x3f992700,
    0xbfbf70c0, 0x3fcc3400, 0x3e992700, 0x402c4be0, 0xc01f88a0, 0x4025ea40, 0x3f65ba80, 0x3fe5ba80, 0xc23aa788,
    0xc13aa788, 0xc15551c0, 0xc247fca4, 0xc1d551c0, 0xc1d551c0, 0xc24ea732, 0xc16ffbf8, 0x421ffd50, 0x421ffd50,
    0x416ffbf8, 0x415551c0, 0x405551c0, 0xc247fca4, 0xc23aa788, 0x4233fcfa, 0xc19d06d8, 0x40719460, 0xc1414380,
    0x41352f48, 0xc0a91b10, 0x40a91b10, 0x80000000, 0x41af252c, 0x40414380, 0x4090f2a0, 0xc1a91b10, 0x41414380,
    0x4110f2a0, 0xc1658028, 0xc190f2a0, 0xc090f2a0};

static void check_gguf_py(void) {
    static const uint8_t *const blk[3] = {PY_Q4_K, PY_Q5_K, PY_Q6_K};
    static const uint32_t *const want[3] = {PY_Q4_K_F32, PY_Q5_K_F32, PY_Q6_K_F32};
    for (WType wt = WT_Q4_K; wt <= WT_Q6_K; wt++) {
        const uint8_t *b = blk[wt - WT_Q4_K];
        const uint32_t *u = want[wt - WT_Q4_K];
        float y[QK_K], x[QK_K], dx, w[QK_K];
        int8_t q[QK_K];
        k_row_to_f32(y, b, wt, 0, QK_K);
        memcpy(w, u, sizeof w);
        CHECK(memcmp(y, w, sizeof y) == 0, "%s: k_row_to_f32 differs from gguf-py's dequantize", name(wt));
        /* and the matmul reads the block as gguf-py does */
        for (int i = 0; i < QK_K; i++) x[i] = frand();
        quantize(x, QK_K, q, &dx);
        double ref = 0, mag = 0;
        for (int i = 0; i < QK_K; i++) ref += (double)w[i] * q[i] * dx, mag += fabs((double)w[i] * q[i] * dx);
        void *P = malloc(k_packed_bytes(wt, 1, QK_K));
        const void *src = b;
        int one = 1;
        k_pack(P, wt, QK_K, 1, &src, &one);
        k_matmul(y, x, P, wt, 1, QK_K, 1);
        CHECK(fabs(y[0] - ref) <= 1e-4 * mag, "%s: k_matmul %.9g, gguf-py's weights give %.9g", name(wt), y[0], ref);
        free(P);
    }
}

int main(void) {
    static const int cols[] = {64, 172, 256, 320, 576, 1536}, rows[] = {1, 7, 8, 9, 17, 65, 960};
    for (WType wt = WT_Q4_K; wt <= WT_Q6_K; wt++)
        for (int c = 0; c < 6; c++)
            for (int r = 0; r < 7; r++)
                if (rows[r] < 960 || cols[c] >= 576) check_shape(wt, rows[r], cols[c]);
    check_gguf_py();
    return check_done("test_quant_k");
}
