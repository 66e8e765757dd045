/* test_quant_format — formats/quant.c and block tensors in safetensors files.
   Checks: f16 conversion both ways (every half round-trips; float → half against F16C
   when the CPU has it); every type quantizes zeros to zeros and a short row as the same
   row padded with zeros, and dequant_row writes only cols values; quantization error per
   type on Gaussian rows, against Q8_0's (and the K types below the 32-element types of
   the same width); block tensors written by tfw_add and read back (logical shape,
   bytes, stored as U8 [rows][row bytes] + paradec.quant, plain and zstd); bad
   paradec.quant refused in one line naming the tensor (unknown type, missing tensor,
   wrong block count, not U8, bad cols) and truncated data refused.
   The bit-for-bit checks against gguf-py are tests/ref/quant_ref.py, which drives:
     test_quant_format --quant TYPE COLS < rows.f32 > blocks     quant_row per row
     test_quant_format --dequant FILE NAME > values.f32          a GGUF's or paradec file's
                                                                  tensor, dequantized
     test_quant_format --to-safetensors IN.gguf OUT.safetensors  every block tensor of a
                                                                  GGUF as a block tensor */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

#include "base/util.h"
#include "check.h"
#include "formats/gguf.h"
#include "formats/quant.h"
#include "formats/tensorfile.h"
#include "model/checkpoint.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint32_t rnd32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static float gauss(void) { /* Box-Muller */
    double u = (rnd32() + 1.0) / 4294967297.0, v = (rnd32() + 1.0) / 4294967297.0;
    return (float)(sqrt(-2 * log(u)) * cos(2 * M_PI * v));
}

static const DType TYPES[] = {DT_Q8_0, DT_Q4_0, DT_Q4_1, DT_Q4_K, DT_Q5_K, DT_Q6_K, DT_Q5_0};
#define NT 7

static void test_f16(void) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fp16_to_f32((uint16_t)h);
        if (isnan(f)) bad += !isnan(fp16_to_f32(f32_to_fp16(f)));
        else bad += f32_to_fp16(f) != h;
    }
    CHECK(bad == 0, "%d halves do not round-trip", bad);
    CHECK(f32_to_fp16(65519.0f) == 0x7bff && f32_to_fp16(65520.0f) == 0x7c00 && f32_to_fp16(1e-8f) == 0 &&
              f32_to_fp16(-0.0f) == 0x8000 && f32_to_fp16(0x1p-24f) == 1 && f32_to_fp16(0x1.8p-24f) == 2,
          "f16 edge cases");
#ifdef __F16C__
    int bad_hw = 0;
    for (int i = 0; i < 1000000; i++) {
        uint32_t u = rnd32() << 1 ^ rnd32();
        float f;
        memcpy(&f, &u, 4);
        if (isnan(f)) continue;
        bad_hw += f32_to_fp16(f) != (uint16_t)_cvtss_sh(f, 0);
    }
    CHECK(bad_hw == 0, "%d of a million floats round differently from F16C's _cvtss_sh", bad_hw);
#endif
}

static void test_rows(void) {
    float x[600], y[600], p[1024];
    uint8_t a[2048], b[2048];
    for (int k = 0; k < NT; k++) {
        DType t = TYPES[k];
        const char *n = dtype_name(t);
        memset(x, 0, sizeof x);
        quant_row(t, a, x, 512);
        dequant_row(t, y, a, 512);
        int nz = 0;
        for (int j = 0; j < 512; j++) nz += y[j] != 0;
        CHECK(nz == 0, "%s: zeros give %d non-zeros", n, nz);
        /* a short row: the same bytes as the row padded with zeros */
        int cols = dtype_block(t) + 20;
        for (int j = 0; j < cols; j++) x[j] = gauss();
        memset(p, 0, sizeof p);
        memcpy(p, x, sizeof(float) * cols);
        size_t rb = dtype_row_bytes(t, cols);
        memset(a, 0xAA, sizeof a);
        quant_row(t, a, x, cols);
        quant_row(t, b, p, 2 * dtype_block(t));
        CHECK(rb == 2 * dtype_block_bytes(t) && !memcmp(a, b, rb) && a[rb] == 0xAA, "%s: short row", n);
        for (int j = 0; j < 600; j++) y[j] = 12345.0f;
        dequant_row(t, y, a, cols);
        float q[1024];
        dequant_row(t, q, b, 2 * dtype_block(t));
        CHECK(!memcmp(y, q, sizeof(float) * cols) && y[cols] == 12345.0f, "%s: short row dequantized", n);
        /* one element: a block of its own */
        x[0] = -3.0f;
        for (int j = 0; j < 600; j++) y[j] = 12345.0f;
        quant_row(t, a, x, 1);
        dequant_row(t, y, a, 1);
        CHECK(fabsf(y[0] + 3.0f) < 0.2f && y[1] == 12345.0f, "%s: one element %g", n, y[0]);
    }
}

/* relative RMS error on Gaussian rows of 4096; the K types (llama.cpp's searches) beat
   the 32-element types of their width, and all stay in their ranges */
static void test_error(void) {
    enum { R = 64, C = 4096 };
    float *x = malloc(sizeof(float) * R * C), *y = malloc(sizeof(float) * C);
    uint8_t *q = malloc(dtype_row_bytes(DT_Q8_0, C));
    for (int i = 0; i < R * C; i++) x[i] = gauss() * 0.02f;
    double rms[NT];
    for (int k = 0; k < NT; k++) {
        double e2 = 0, x2 = 0;
        for (int r = 0; r < R; r++) {
            quant_row(TYPES[k], q, x + (size_t)r * C, C);
            dequant_row(TYPES[k], y, q, C);
            for (int j = 0; j < C; j++) {
                double d = y[j] - x[(size_t)r * C + j];
                e2 += d * d;
                x2 += (double)x[(size_t)r * C + j] * x[(size_t)r * C + j];
            }
        }
        rms[k] = sqrt(e2 / x2);
    }
    printf("relative RMS error (Gaussian rows; × Q8_0's): Q8_0 %.5f, Q4_0 %.4f (%.1f), Q4_1 %.4f (%.1f), Q4_K %.4f "
           "(%.1f), Q5_K %.4f (%.1f), Q6_K %.4f (%.1f)\n",
           rms[0], rms[1], rms[1] / rms[0], rms[2], rms[2] / rms[0], rms[3], rms[3] / rms[0], rms[4], rms[4] / rms[0],
           rms[5], rms[5] / rms[0]);
    /* a uniform 8-bit step over ±amax of a Gaussian block: ~0.4 %; each bit less doubles it */
    CHECK(rms[0] < 0.006, "Q8_0 error %g", rms[0]);
    CHECK(rms[5] < 0.025 && rms[5] > rms[0], "Q6_K error %g", rms[5]);
    CHECK(rms[4] < 0.04 && rms[4] > rms[5], "Q5_K error %g", rms[4]);
    CHECK(rms[3] < 0.08 && rms[3] > rms[4], "Q4_K error %g", rms[3]);
    CHECK(rms[3] < rms[2] && rms[3] < rms[1], "Q4_K %g beats Q4_1 %g and Q4_0 %g", rms[3], rms[2], rms[1]);
    CHECK(rms[2] < 0.15 && rms[1] < 0.15, "Q4_1 %g, Q4_0 %g", rms[2], rms[1]);
    CHECK(rms[6] < rms[1] / 1.5 && rms[6] > rms[0], "Q5_0 %g between Q8_0 %g and Q4_0 %g", rms[6], rms[0], rms[1]);
    free(x);
    free(y);
    free(q);
}

/* ---- block tensors in safetensors files ---- */

static char tmpdir[256];
static const char *tmp(const char *name) {
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", tmpdir, name);
    return p[k];
}

static void test_file(int compress) {
    const char *path = tmp(compress ? "q.safetensors.zst" : "q.safetensors");
    uint8_t *blocks[NT];
    int64_t shapes[NT][2];
    float f32[7] = {1, 2, 3, 4, 5, 6, 7};
    int64_t fs = 7;
    TfWriter *w = tfw_begin(path, compress);
    CHECK(w != NULL, "%s", pd_errmsg());
    for (int k = 0; k < NT; k++) {
        int64_t rows = 3 + k, cols = k % 2 ? 64 : 300; /* short rows too */
        shapes[k][0] = rows;
        shapes[k][1] = cols;
        size_t n = (size_t)rows * dtype_row_bytes(TYPES[k], cols);
        blocks[k] = malloc(n);
        for (size_t j = 0; j < n; j++) blocks[k][j] = (uint8_t)rnd32();
        char name[32];
        snprintf(name, sizeof name, "w.%s", dtype_name(TYPES[k]));
        CHECK(tfw_add(w, name, TYPES[k], 2, shapes[k], blocks[k]) == 0, "add %s: %s", name, pd_errmsg());
    }
    CHECK(tfw_add(w, "f", DT_F32, 1, &fs, f32) == 0, "add f32");
    CHECK(tfw_add(w, "bad", DT_Q4_K, 1, &fs, f32) == -1 && strstr(pd_errmsg(), "matrix"), "1-d block tensor: %s",
          pd_errmsg());
    int64_t zero[2] = {2, 0};
    CHECK(tfw_add(w, "bad", DT_Q8_0, 2, zero, f32) == -1, "0 cols refused");
    tfw_record_digests(w);
    CHECK(tfw_commit(w) == 0, "commit: %s", pd_errmsg());
    TensorFile tf;
    int rc = tf_open(&tf, path);
    CHECK(rc == 0, "reopen: %s", pd_errmsg());
    if (rc) return;
    for (int k = 0; k < NT; k++) {
        char name[32];
        snprintf(name, sizeof name, "w.%s", dtype_name(TYPES[k]));
        const Tensor *t = tf_get(&tf, name);
        size_t n = (size_t)shapes[k][0] * dtype_row_bytes(TYPES[k], shapes[k][1]);
        CHECK(t && t->dtype == TYPES[k] && t->ndim == 2 && t->shape[0] == shapes[k][0] && t->shape[1] == shapes[k][1] &&
                  t->nbytes == n && !memcmp(t->data, blocks[k], n),
              "%s read back", name);
        CHECK(!t || tf_expect(&tf, name, TYPES[k], 2, shapes[k], NULL) == 0, "%s: tf_expect", name);
        free(blocks[k]);
    }
    const char *qm = tf_meta(&tf, TF_QUANT_KEY);
    CHECK(qm && strstr(qm, "\"w.Q5_K\":[\"Q5_K\",300]") && strstr(qm, "\"w.Q6_K\":[\"Q6_K\",64]"), "paradec.quant: %s",
          qm ? qm : "missing");
    CHECK(tf_verify(&tf, NULL) == 0, "digests: %s", pd_errmsg());
    const Tensor *f = tf_get(&tf, "f");
    CHECK(f && f->dtype == DT_F32 && !memcmp(f->data, f32, sizeof f32), "the f32 tensor");
    tf_close(&tf);
    if (!compress) { /* what any safetensors reader sees: U8 [rows, row bytes] */
        char *bytes;
        size_t n;
        if (pd_read_file(path, &bytes, &n) == 0) {
            char want[96];
            snprintf(want, sizeof want, "\"w.Q4_1\":{\"dtype\":\"U8\",\"shape\":[5,%zu]",
                     dtype_row_bytes(DT_Q4_1, 300));
            CHECK(memmem(bytes, n < 4096 ? n : 4096, want, strlen(want)) != NULL, "stored as U8: want %s", want);
            free(bytes);
        }
    }
}

/* a safetensors file by hand: one U8 tensor [rows][row_bytes] and __metadata__ quant */
static int hand_file(TensorFile *tf, const char *quant, int64_t rows, int64_t rb, const char *dtype, size_t cut) {
    char hdr[1024];
    int hl = snprintf(hdr, sizeof hdr,
                      "{\"__metadata__\":{\"paradec.quant\":\"%s\"},\"w\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],"
                      "\"data_offsets\":[0,%lld]}}",
                      quant, dtype, (long long)rows, (long long)rb, (long long)(rows * rb));
    size_t n = 8 + (size_t)hl + (size_t)(rows * rb);
    uint8_t *b = calloc(n, 1);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, hdr, (size_t)hl);
    int rc = tf_parse(tf, b, n - cut, "hand");
    if (rc == 0) {
        tf_close(tf);
        rc = 0;
    }
    free(b);
    return rc;
}

static void refused(const char *quant, int64_t rows, int64_t rb, const char *dtype, size_t cut, const char *want) {
    TensorFile tf;
    int rc = hand_file(&tf, quant, rows, rb, dtype, cut);
    CHECK(rc != 0 && strstr(pd_errmsg(), want) && !strchr(pd_errmsg(), '\n'), "%s: want '%s', got %s", quant, want,
          rc ? pd_errmsg() : "success");
}

static void test_bad(void) {
    TensorFile tf;
    CHECK(hand_file(&tf, "{\\\"w\\\":[\\\"Q8_0\\\",64]}", 3, 68, "U8", 0) == 0, "a good one: %s", pd_errmsg());
    CHECK(hand_file(&tf, "{\\\"w\\\":[\\\"q4_k\\\",300]}", 2, 288, "U8", 0) == 0, "lower case, short row: %s",
          pd_errmsg());
    refused("{\\\"w\\\":[\\\"Q5_1\\\",64]}", 3, 44, "U8", 0, "tensor 'w': unknown block type 'Q5_1'");
    refused("{\\\"w\\\":[\\\"IQ2_XXS\\\",256]}", 3, 66, "U8", 0, "tensor 'w': unknown block type 'IQ2_XXS'");
    refused("{\\\"v\\\":[\\\"Q8_0\\\",64]}", 3, 68, "U8", 0, "names tensor 'v', which the file lacks");
    refused("{\\\"w\\\":[\\\"Q8_0\\\",64]}", 3, 34, "U8", 0,
            "tensor 'w': rows of 34 bytes, but 64 Q8_0 elements are 2 blocks");
    refused("{\\\"w\\\":[\\\"Q8_0\\\",64]}", 3, 69, "U8", 0, "rows of 69 bytes");
    refused("{\\\"w\\\":[\\\"Q8_0\\\",64]}", 3, 34, "I8", 0, "must be stored U8");
    refused("{\\\"w\\\":[\\\"Q8_0\\\",0]}", 3, 0, "U8", 0, "row length 0");
    refused("{\\\"w\\\":[\\\"Q8_0\\\"]}", 3, 68, "U8", 0, "not a [type, cols] pair");
    refused("[1]", 3, 68, "U8", 0, "is not a JSON object");
    refused("{\\\"w\\\":[\\\"Q8_0\\\",64]}", 3, 68, "U8", 10, "exceed the data section"); /* truncated blocks */
}

/* ModelWriter: a NaN weight refused before quantizing, blocks whose scale is not
   finite refused, a good Q8_0 matrix written as given */
static void test_writer(void) {
    ModelWriter mw;
    int64_t shape[2] = {2, 64};
    float x[128];
    for (int j = 0; j < 128; j++) x[j] = gauss();
    x[70] = NAN;
    CHECK(mw_begin(&mw, tmp("w.safetensors"), DT_Q4_K) == 0, "%s", pd_errmsg());
    CHECK(mw_add(&mw, "model.layers.0.mlp.up_proj.weight", 2, shape, x) == -1 && strstr(pd_errmsg(), "element 70"),
          "NaN refused: %s", pd_errmsg());
    mw_abort(&mw);
    x[70] = 0;
    uint8_t q[2 * 68];
    for (int r = 0; r < 2; r++) quant_row(DT_Q8_0, q + 68 * r, x + 64 * r, 64);
    CHECK(mw_begin(&mw, tmp("w.safetensors"), DT_KEEP) == 0, "%s", pd_errmsg());
    CHECK(mw_add_raw(&mw, "a", DT_Q8_0, shape, q) == 0, "good blocks: %s", pd_errmsg());
    uint8_t bad[2 * 68];
    memcpy(bad, q, sizeof bad);
    bad[68 + 34] = 0x00, bad[68 + 35] = 0x7c; /* row 1, block 1: d = +inf */
    CHECK(mw_add_raw(&mw, "b", DT_Q8_0, shape, bad) == -1 && strstr(pd_errmsg(), "tensor 'b' row 1") &&
              strstr(pd_errmsg(), "not finite"),
          "inf scale refused: %s", pd_errmsg());
    CHECK(mw_add_raw(&mw, "c", DT_F32, shape, q) == -1, "raw F32 refused");
    mw_abort(&mw);
    CHECK(access(tmp("w.safetensors"), F_OK) != 0, "nothing left behind");
}

/* ---- helpers for tests/ref/quant_ref.py ---- */

static int dump(const float *v, size_t n) { return fwrite(v, sizeof(float), n, stdout) != n; }

static int mode_quant(const char *type, const char *cols_s) {
    int t = dtype_parse_quant(type);
    long cols = atol(cols_s);
    if (t < 0 || cols < 1) return fprintf(stderr, "bad type or cols\n"), 2;
    float *x = malloc(sizeof(float) * cols);
    uint8_t *q = malloc(dtype_row_bytes((DType)t, cols));
    while (fread(x, sizeof(float), (size_t)cols, stdin) == (size_t)cols) {
        quant_row((DType)t, q, x, cols);
        fwrite(q, 1, dtype_row_bytes((DType)t, cols), stdout);
    }
    free(x);
    free(q);
    return 0;
}

static int mode_dequant(const char *path, const char *name) {
    int rc = 1;
    Gguf g;
    FILE *f = fopen(path, "rb");
    char m[4] = {0};
    if (f) {
        if (fread(m, 1, 4, f) != 4) m[0] = 0;
        fclose(f);
    }
    if (!memcmp(m, "GGUF", 4)) {
        if (gguf_open(&g, path)) return fprintf(stderr, "%s\n", pd_errmsg()), 1;
        const GgufTensor *t = gguf_tensor(&g, name);
        if (t) {
            size_t n = (size_t)t->dims[0] * t->dims[1] * t->dims[2] * t->dims[3];
            float *v = malloc(sizeof(float) * (n + 1));
            rc = gguf_tensor_f32(&g, t, v) || dump(v, n);
            free(v);
        }
        gguf_close(&g);
        return rc;
    }
    TensorFile tf;
    if (tf_open(&tf, path)) return fprintf(stderr, "%s\n", pd_errmsg()), 1;
    const Tensor *t = tf_get(&tf, name);
    if (t && dtype_is_quant(t->dtype)) {
        size_t rb = dtype_row_bytes(t->dtype, t->shape[1]);
        float *v = malloc(sizeof(float) * (size_t)t->shape[1]);
        rc = 0;
        for (int64_t r = 0; r < t->shape[0] && !rc; r++) {
            dequant_row(t->dtype, v, (const uint8_t *)t->data + (size_t)r * rb, t->shape[1]);
            rc = dump(v, (size_t)t->shape[1]);
        }
        free(v);
    }
    tf_close(&tf);
    return rc;
}

static int mode_to_safetensors(const char *in, const char *out) {
    Gguf g;
    if (gguf_open(&g, in)) return fprintf(stderr, "%s\n", pd_errmsg()), 1;
    TfWriter *w = tfw_begin(out, 0);
    int rc = !w;
    for (int i = 0; i < g.n_tensors && !rc; i++) {
        const GgufTensor *t = &g.t[i];
        int bt = gguf_block_dtype(t->type);
        if (bt < 0) continue;
        int64_t shape[2] = {t->dims[1] * t->dims[2] * t->dims[3], t->dims[0]};
        rc = tfw_add(w, t->name, (DType)bt, 2, shape, t->data);
    }
    rc = rc ? (tfw_abort(w), 1) : tfw_commit(w) != 0;
    if (rc) fprintf(stderr, "%s\n", pd_errmsg());
    gguf_close(&g);
    return rc;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--quant")) return mode_quant(argv[2], argv[3]);
    if (argc == 4 && !strcmp(argv[1], "--dequant")) return mode_dequant(argv[2], argv[3]);
    if (argc == 4 && !strcmp(argv[1], "--to-safetensors")) return mode_to_safetensors(argv[2], argv[3]);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_quant_format.XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    test_f16();
    test_rows();
    test_error();
    test_file(0);
    test_file(1);
    test_bad();
    test_writer();
    remove(tmp("q.safetensors"));
    remove(tmp("q.safetensors.zst"));
    rmdir(tmpdir);
    return check_done("quant_format");
}
