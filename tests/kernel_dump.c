/* kernel_dump SEED DIR — runs every CPU kernel on random inputs drawn from SEED (odd
   sizes, every path's shapes, exp's clamps and subnormal results, ties for argmax) and
   writes each kernel's outputs to DIR/NAME.bin. The Makefile builds it twice, on the
   kernels as this machine runs them and on the scalar spec (-march=x86-64-v2: no AVX,
   no FMA instructions); tests/test_kernel_spec.sh compares the two bit for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "rand.h"
#include "device.h"

static void fill(float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = frand(lo, hi);
}

static const char *dir;
static FILE *out(const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.bin", dir, name);
    FILE *f = fopen(path, "ab");
    if (!f) perror(path), exit(1);
    return f;
}
static void put(const char *name, const void *p, size_t bytes) {
    FILE *f = out(name);
    fwrite(p, 1, bytes, f);
    fclose(f);
}

static void matmul(void) {
    static const int shape[][2] = {{1, 1},    {7, 3},     {16, 16},  {17, 33},  {64, 64},
                                   {65, 127}, {130, 257}, {200, 64}, {513, 96}, {80, 1101}};
    static const int ns[] = {1, 2, 3, 4, 5, 6, 7, 8, 13}; /* every tile size of every build */
    enum { NS = sizeof ns / sizeof *ns };
    for (int wt = 0; wt < 2; wt++)
        for (size_t s = 0; s < sizeof shape / sizeof *shape * NS; s++) {
            int rows = shape[s / NS][0], cols = shape[s / NS][1], n = ns[s % NS];
            float *w = malloc(sizeof(float) * rows * cols), *x = malloc(sizeof(float) * n * cols);
            float *y = malloc(sizeof(float) * n * rows);
            uint16_t *h = malloc(2 * (size_t)rows * cols);
            fill(w, (size_t)rows * cols, -1, 1), fill(x, (size_t)n * cols, -2, 2);
            for (size_t i = 0; i < (size_t)rows * cols; i++) h[i] = (uint16_t)(next32() >> 16) & 0xbfff; /* |w| < 2 */
            const void *src = wt == WT_F32 ? (const void *)w : (const void *)h;
            void *P = aligned_alloc(64, (k_packed_bytes(wt, rows, cols) + 63) / 64 * 64);
            k_pack(P, wt, cols, 1, &src, &rows);
            k_matmul(y, x, P, wt, n, cols, rows);
            put(wt == WT_F32 ? "matmul_f32" : "matmul_bf16", y, sizeof(float) * n * rows);
            free(w), free(x), free(y), free(h), free(P);
        }
}

static void rows(void) {
    static const int dims[] = {1, 7, 16, 63, 64, 65, 100, 257, 576};
    for (size_t d = 0; d < sizeof dims / sizeof *dims; d++) {
        int dim = dims[d], n = 1 + urand(3);
        float *x = malloc(sizeof(float) * n * dim), *g = malloc(sizeof(float) * dim),
              *y = malloc(sizeof(float) * n * dim);
        fill(x, (size_t)n * dim, -3, 3), fill(g, dim, -2, 2);
        k_rmsnorm(y, x, g, n, dim, 1e-5f);
        put("rmsnorm", y, sizeof(float) * n * dim);
        free(x), free(g), free(y);
    }
    static const int hds[] = {2, 4, 6, 8, 16, 32, 64, 128}, heads[] = {1, 3, 9};
    for (size_t i = 0; i < sizeof hds / sizeof *hds; i++)
        for (int j = 0; j < 3; j++) {
            int hd = hds[i], nh = heads[j], n = 1 + urand(3), stride = nh * hd + 5, npos = 64;
            float *x = malloc(sizeof(float) * n * stride), *c = malloc(sizeof(float) * npos * hd / 2);
            float *s = malloc(sizeof(float) * npos * hd / 2);
            int32_t pos[3];
            fill(x, (size_t)n * stride, -4, 4), fill(c, (size_t)npos * hd / 2, -1, 1),
                fill(s, (size_t)npos * hd / 2, -1, 1);
            for (int t = 0; t < n; t++) pos[t] = urand(npos);
            k_rope(x, stride, pos, n, nh, hd, c, s);
            put("rope", x, sizeof(float) * n * stride);
            free(x), free(c), free(s);
        }
}

static void elementwise(void) {
    static const int ns[] = {1, 7, 8, 15, 16, 17, 31, 100, 1000, 32000, 49152};
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
        int n = ns[i];
        float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
        float lo = i % 2 ? -20 : -120, hi = i % 2 ? 20 : 100; /* every other size reaches exp's clamps */
        fill(a, n, lo, hi), fill(b, n, -3, 3);
        if (n > 4) a[0] = 0.0f, a[1] = -0.0f, a[2] = 88.7f, a[3] = -103.0f;
        k_silu_mul(y, a, b, n);
        put("silu_mul", y, sizeof(float) * n);
        k_silu(y, a, n);
        put("silu", y, sizeof(float) * n);
        memcpy(y, b, sizeof(float) * n);
        k_add(y, a, n);
        put("add", y, sizeof(float) * n);

        float m, sum;
        fill(a, n, i % 2 ? -110 : -30, i % 2 ? 5 : 30); /* wide logits: e^(x-max) down to subnormals */
        memcpy(y, a, sizeof(float) * n);
        sum = k_exp_sum(y, n, &m);
        put("exp_sum", y, sizeof(float) * n), put("exp_sum", &sum, 4), put("exp_sum", &m, 4);
        memcpy(y, a, sizeof(float) * n);
        m = k_softmax(y, n);
        put("softmax", y, sizeof(float) * n), put("softmax", &m, 4);

        for (int k = 0; k < n; k++) a[k] = (float)urand(50) - 25; /* ties */
        int32_t am = k_argmax(a, n);
        put("argmax", &am, 4);
        free(a), free(b), free(y);
    }
}

/* attention over a shuffled block table: each token sees a committed run, a few of
   this call's slots continuing it, then lone slots further on (a tree's ancestors);
   the first up to 600 keys (FlashDecoding's chunks) */
static void attention(void) {
    static const int cfg[][3] = {{1, 1, 8}, {2, 1, 16}, {4, 2, 8}, {8, 4, 8}, {9, 3, 64}, {16, 2, 6}, {12, 1, 32}};
    static const int bss[] = {16, 32, 7};
    for (size_t c = 0; c < sizeof cfg / sizeof *cfg; c++)
        for (int b = 0; b < 3; b++) {
            int nh = cfg[c][0], nkv = cfg[c][1], hd = cfg[c][2], bs = bss[b], kvd = nkv * hd, qd = nh * hd;
            int slots = 700, nblk = slots / bs + 1, n = 1 + urand(4);
            int *table = malloc(sizeof(int) * nblk);
            for (int i = 0; i < nblk; i++) table[i] = i;
            for (int i = nblk - 1; i > 0; i--) {
                int o = urand(i + 1), x = table[i];
                table[i] = table[o], table[o] = x;
            }
            float *K = malloc(sizeof(float) * nblk * kvd * bs), *V = malloc(sizeof(float) * nblk * kvd * bs);
            fill(K, (size_t)nblk * kvd * bs, -1, 1), fill(V, (size_t)nblk * kvd * bs, -1, 1);
            float *q = malloc(sizeof(float) * n * qd), *o = malloc(sizeof(float) * n * qd);
            fill(q, (size_t)n * qd, -3, 3);
            int n_ctx[4], off[5] = {0}, extra[4 * 16];
            const int *tables[4];
            for (int t = 0; t < n; t++) {
                n_ctx[t] = urand(t ? 70 : 600), tables[t] = table; /* past ATT_SPLIT: split */
                int run = urand(4), lone = urand(5), e = off[t];
                for (int i = 0; i < run; i++) extra[e++] = n_ctx[t] + i;
                for (int i = 0, s = n_ctx[t] + run + 2; i < lone; i++, s += 1 + urand(5)) extra[e++] = s;
                if (e == off[t]) extra[e++] = n_ctx[t]; /* itself */
                off[t + 1] = e;
            }
            AttnArgs a = {n,
                          nh,
                          nkv,
                          hd,
                          1.0f / sqrtf((float)hd),
                          q,
                          (size_t)qd,
                          o,
                          K,
                          V,
                          (size_t)kvd * bs,
                          bs,
                          tables,
                          n_ctx,
                          off,
                          extra,
                          KV_F32,
                          NULL,
                          NULL,
                          NULL,
                          NULL,
                          0,
                          NULL,
                          0,
                          0};
            k_attention(&a);
            put("attention", o, sizeof(float) * n * qd);
            for (int i = 0; i < off[n]; i++) /* the step descriptor's form: offsets from n_ctx */
                for (int t = 0; t < n; t++)
                    if (i >= off[t] && i < off[t + 1]) extra[i] -= n_ctx[t];
            k_attention_rel(&a);
            put("attention", o, sizeof(float) * n * qd);
            free(table), free(K), free(V), free(q), free(o);
        }
}

/* the same over bf16 and q8_0 caches (kv8_*): the typed write's stored bytes and
   attention reading them, through k_kv_write_typed as forward.c writes */
static void kv8_attention(void) {
    static const int cfg[][3] = {{1, 1, 8}, {2, 1, 16}, {4, 2, 8}, {8, 4, 8}, {9, 3, 64}, {16, 2, 6}, {12, 1, 32}};
    static const int bss[] = {16, 32, 7};
    for (int type = KV_BF16; type <= KV_Q8_0; type++)
        for (size_t c = 0; c < sizeof cfg / sizeof *cfg; c++)
            for (int b = 0; b < 3; b++) {
                int nh = cfg[c][0], nkv = cfg[c][1], hd = cfg[c][2], bs = bss[b], kvd = nkv * hd, qd = nh * hd;
                int slots = 700, nblk = slots / bs + 1, n = 1 + urand(4), el = type == KV_BF16 ? 2 : 1;
                int *table = malloc(sizeof(int) * nblk);
                for (int i = 0; i < nblk; i++) table[i] = i;
                for (int i = nblk - 1; i > 0; i--) {
                    int o = urand(i + 1), x = table[i];
                    table[i] = table[o], table[o] = x;
                }
                size_t elems = (size_t)nblk * kvd * bs, nsc = (size_t)nblk * nkv * bs;
                void *K = calloc(elems, el), *V = calloc(elems, el);
                float *KS = calloc(nsc, sizeof(float)), *VS = calloc(nsc, sizeof(float));
                float *src = malloc(sizeof(float) * slots * 2 * kvd);
                int32_t *slot = malloc(sizeof(int32_t) * slots);
                const int **tabs = malloc(sizeof(int *) * slots);
                fill(src, (size_t)slots * 2 * kvd, -2, 2);
                for (int i = 0; i < slots; i++) slot[i] = i, tabs[i] = table;
                for (int i = 0; i < slots; i += 7) src[(size_t)i * 2 * kvd] = 0; /* zeros and an all-zero head */
                for (int d = 0; d < hd; d++) src[(size_t)3 * 2 * kvd + d] = 0;
                k_kv_write_typed((KVType)type, K, V, KS, VS, (size_t)kvd * bs, (size_t)nkv * bs, bs, nkv, hd, tabs,
                                 slot, src, (size_t)2 * kvd, (size_t)kvd, slots);
                put("kv8_write", K, elems * el), put("kv8_write", V, elems * el);
                put("kv8_write", KS, sizeof(float) * nsc), put("kv8_write", VS, sizeof(float) * nsc);
                float *q = malloc(sizeof(float) * n * qd), *o = malloc(sizeof(float) * n * qd);
                fill(q, (size_t)n * qd, -3, 3);
                int n_ctx[4], off[5] = {0}, extra[4 * 16];
                const int *tables[4];
                for (int t = 0; t < n; t++) {
                    n_ctx[t] = urand(t ? 70 : 600), tables[t] = table; /* past ATT_SPLIT: split */
                    int run = urand(4), lone = urand(5), e = off[t];
                    for (int i = 0; i < run; i++) extra[e++] = n_ctx[t] + i;
                    for (int i = 0, s = n_ctx[t] + run + 2; i < lone; i++, s += 1 + urand(5)) extra[e++] = s;
                    if (e == off[t]) extra[e++] = n_ctx[t];
                    off[t + 1] = e;
                }
                AttnArgs a = {n,
                              nh,
                              nkv,
                              hd,
                              1.0f / sqrtf((float)hd),
                              q,
                              (size_t)qd,
                              o,
                              NULL,
                              NULL,
                              (size_t)kvd * bs,
                              bs,
                              tables,
                              n_ctx,
                              off,
                              extra,
                              (KVType)type,
                              K,
                              V,
                              KS,
                              VS,
                              (size_t)nkv * bs,
                              NULL,
                              0,
                              0};
                k_attention(&a);
                put(type == KV_BF16 ? "kv8_attention_bf16" : "kv8_attention_q8_0", o, sizeof(float) * n * qd);
                for (int i = 0; i < off[n]; i++)
                    for (int t = 0; t < n; t++)
                        if (i >= off[t] && i < off[t + 1]) extra[i] -= n_ctx[t];
                k_attention_rel(&a);
                put(type == KV_BF16 ? "kv8_attention_bf16" : "kv8_attention_q8_0", o, sizeof(float) * n * qd);
                free(table), free(K), free(V), free(KS), free(VS), free(src), free(slot), free(tabs), free(q), free(o);
            }
}

/* the whole-batch forms forward.c calls and the device's row ops, appended to the
   files of the kernels they are made of */
static void batch_forms(void) {
    static const int shape[][2] = {{1, 1}, {3, 17}, {5, 64}, {2, 1000}, {4, 4099}};
    Device *d = dev_open("cpu");
    if (!d) fprintf(stderr, "%s\n", dev_errmsg()), exit(1);
    for (size_t s = 0; s < sizeof shape / sizeof *shape; s++) {
        int n = shape[s][0], cols = shape[s][1], stride = cols + 3;
        float *y = malloc(sizeof(float) * n * stride), *x = malloc(sizeof(float) * cols);
        float *gu = malloc(sizeof(float) * n * 2 * cols), *h = malloc(sizeof(float) * n * cols);
        fill(y, (size_t)n * stride, -4, 4), fill(x, cols, -4, 4), fill(gu, (size_t)n * 2 * cols, -30, 30);
        k_add_rows(y, stride, x, n, cols);
        put("add", y, sizeof(float) * n * stride);
        k_silu_mul_rows(h, gu, n, cols);
        put("silu_mul", h, sizeof(float) * n * cols);
        int k = cols < 5 ? cols : 5;
        int32_t ids[5 * 5], rows = n;
        float p[5 * 5];
        DevBuf X, Y, I, P, R;
        if (dev_wrap(d, gu, sizeof(float) * n * cols, &X) || dev_wrap(d, h, sizeof(float) * n * cols, &Y) ||
            dev_wrap(d, ids, sizeof ids, &I) || dev_wrap(d, p, sizeof p, &P) || dev_wrap(d, &rows, sizeof rows, &R) ||
            dev_argmax_rows(d, I, X, R, n, cols))
            fprintf(stderr, "%s\n", dev_errmsg()), exit(1);
        put("argmax", ids, sizeof(int32_t) * n);
        if (dev_topk_rows(d, I, P, X, R, n, cols, k)) fprintf(stderr, "%s\n", dev_errmsg()), exit(1);
        put("argmax", ids, sizeof(int32_t) * n * k), put("softmax", p, sizeof(float) * n * k);
        if (dev_softmax_rows(d, Y, X, R, n, cols)) fprintf(stderr, "%s\n", dev_errmsg()), exit(1);
        put("softmax", h, sizeof(float) * n * cols);
        if (dev_softmax_temp_rows(d, Y, X, R, n, cols, 0.7f)) fprintf(stderr, "%s\n", dev_errmsg()), exit(1);
        put("softmax", h, sizeof(float) * n * cols); /* a sampler's temperature divides first */
        dev_free(d, X), dev_free(d, Y), dev_free(d, I), dev_free(d, P), dev_free(d, R);
        free(y), free(x), free(gu), free(h);
    }
    dev_close(d);
}

static void q8(void) {
    static const int shape[][2] = {{1, 1}, {16, 3}, {17, 4}, {64, 64}, {100, 97}, {130, 576}};
    for (size_t s = 0; s < sizeof shape / sizeof *shape; s++) {
        int rows = shape[s][0], cols = shape[s][1];
        float *w = malloc(sizeof(float) * rows * cols), *x = malloc(sizeof(float) * cols),
              *y = malloc(sizeof(float) * rows);
        fill(w, (size_t)rows * cols, -1, 1), fill(x, cols, -2, 2);
        void *P = aligned_alloc(64, (k_q8_bytes(rows, cols) + 63) / 64 * 64);
        k_q8_pack(P, w, rows, cols);
        k_q8_matvec(y, x, P, rows, cols);
        put("q8_pack", P, k_q8_bytes(rows, cols));
        put("q8_matvec", y, sizeof(float) * rows);
        free(w), free(x), free(y), free(P);
    }
}

/* the 32-element block types: random blocks (f16 scales 2^-8 .. 2, Q8_0's −128 among
   the bytes), short rows, several sources; then the rows dequantized */
static void q32(void) {
    static const int shape[][2] = {{1, 32}, {7, 172}, {9, 64}, {17, 96}, {65, 576}, {130, 1536}, {9, 1600}};
    static const int ns[] = {1, 2, 3, 4, 5, 13};
    static const char *names[] = {"q32_q8_0", "q32_q4_0", "q32_q4_1", "q32_q5_0"};
    for (int wt = WT_Q8_0; wt <= WT_Q5_0; wt++)
        for (size_t s = 0; s < sizeof shape / sizeof *shape; s++) {
            int rows = shape[s][0], cols = shape[s][1], nb = (cols + 31) / 32;
            int n = cols == 1600 ? 70 : ns[urand(6)]; /* 70: past a tile of 64 tokens */
            size_t bb = wt == WT_Q8_0 ? 34 : wt == WT_Q4_0 ? 18 : wt == WT_Q4_1 ? 20 : 22, rb = bb * nb;
            uint8_t *W = malloc(rb * rows);
            for (size_t i = 0; i < rb * rows; i++) W[i] = (uint8_t)next32();
            for (int r = 0; r < rows * nb; r++)
                for (int k = 0; k < (wt == WT_Q4_1 ? 2 : 1); k++) {
                    uint16_t h = (uint16_t)((7 + urand(10)) << 10 | urand(1024) | urand(2) << 15);
                    memcpy(W + (size_t)r * bb + 2 * k, &h, 2);
                }
            float *x = malloc(sizeof(float) * n * cols), *y = malloc(sizeof(float) * n * (rows > cols ? rows : cols));
            fill(x, (size_t)n * cols, -2, 2);
            int src_rows[3] = {rows - 2 * (rows / 3), rows / 3, rows / 3};
            const void *src[3] = {W, W + rb * src_rows[0], W + rb * (src_rows[0] + src_rows[1])};
            void *P = aligned_alloc(64, (k_packed_bytes(wt, rows, cols) + 63) / 64 * 64);
            k_pack(P, wt, cols, rows >= 3 ? 3 : 1, src, rows >= 3 ? src_rows : &rows);
            k_matmul(y, x, P, wt, n, cols, rows);
            put(names[wt - WT_Q8_0], y, sizeof(float) * n * rows);
            for (int r = 0; r < rows; r += 1 + rows / 8) {
                k_row_to_f32(y, W, wt, (size_t)r, cols);
                put(names[wt - WT_Q8_0], y, sizeof(float) * cols);
            }
            free(W), free(x), free(y), free(P);
        }
}

/* the K block types (quant_k.c): random blocks with sane f16 scales, odd shapes (short
   and padded last super-blocks), x with a zero block and an outlier */
static void qk(void) {
    static const int shape[][2] = {{1, 64}, {7, 172}, {9, 320}, {17, 576}, {65, 1536}, {130, 256}, {8, 2048}};
    static const int ns[] = {1, 2, 3, 4, 5, 13};
    static const char *files[] = {"qk_matmul_q4_k", "qk_matmul_q5_k", "qk_matmul_q6_k"};
    for (int wt = WT_Q4_K; wt <= WT_Q6_K; wt++)
        for (size_t s = 0; s < sizeof shape / sizeof *shape; s++) {
            int rows = shape[s][0], cols = shape[s][1], n = ns[urand(6)], nb = (cols + 255) / 256;
            int bb = wt == WT_Q4_K ? 144 : wt == WT_Q5_K ? 176 : 210;
            size_t rb = (size_t)nb * bb;
            uint8_t *w = malloc(rb * rows);
            for (size_t i = 0; i < rb * rows; i++) w[i] = (uint8_t)next32();
            for (size_t b = 0; b < (size_t)nb * rows; b++) /* d (and dmin): halves in 2^-12 .. 2^-2 */
                for (int k = 0; k < (wt == WT_Q6_K ? 1 : 2); k++) {
                    uint8_t *h = w + b * bb + (wt == WT_Q6_K ? 208 : 2 * k);
                    int v = (3 + urand(10)) << 10 | urand(1024) | (urand(8) == 0 ? 0x8000 : 0);
                    h[0] = (uint8_t)v, h[1] = (uint8_t)(v >> 8);
                }
            float *x = malloc(sizeof(float) * n * cols), *y = malloc(sizeof(float) * n * rows);
            fill(x, (size_t)n * cols, -2, 2);
            x[urand(n * cols)] = 300.0f;
            if (n > 1) memset(x + cols, 0, sizeof(float) * (cols < 256 ? cols : 256));
            void *P = aligned_alloc(64, (k_packed_bytes(wt, rows, cols) + 63) / 64 * 64);
            const void *src = w;
            k_pack(P, wt, cols, 1, &src, &rows);
            k_matmul(y, x, P, wt, n, cols, rows);
            put(files[wt - WT_Q4_K], y, sizeof(float) * n * rows);
            for (int r = 0; r < rows; r += 1 + urand(8)) {
                k_row_to_f32(x, w, wt, (size_t)r, cols);
                put("qk_row_to_f32", x, sizeof(float) * cols);
            }
            free(w), free(x), free(y), free(P);
        }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: kernel_dump SEED DIR\n");
        return 1;
    }
    test_rng = strtoull(argv[1], NULL, 10), dir = argv[2];
    k_init(2);
    matmul(), rows(), elementwise(), batch_forms(), attention(), q8();
    kv8_attention();
    q32();
    qk();
    return 0;
}
