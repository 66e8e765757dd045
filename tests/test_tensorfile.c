/* test_tensorfile.c — safetensors read/write: round trips (plain, zstd, stdin/stdout),
   interoperability with the zstd CLI, the reference implementation's published byte
   vectors, refusal of bad files, truncation/mutation fuzzing, and atomic writes. */
#include "check.h"
#include "base/util.h"
#include "formats/tensorfile.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64];

static char *tmp_path(const char *name) {
    static char buf[4][256];
    static int k;
    char *p = buf[k++ % 4];
    snprintf(p, 256, "%s/%s", dir, name);
    return p;
}

static int write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(p, 1, n, f);
    return fclose(f) == 0 && w == n ? 0 : -1;
}

static char *read_bytes(const char *path, size_t *n) {
    char *d = NULL;
    return pd_read_file(path, &d, n) ? NULL : d;
}

static int file_exists(const char *path) { return access(path, F_OK) == 0; }

/* entries in dir other than "." and ".." */
static int dir_count(const char *d) {
    DIR *dp = opendir(d);
    int n = 0;
    for (struct dirent *e; dp && (e = readdir(dp));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (dp) closedir(dp);
    return n;
}

/* ---- the content every round trip writes ---- */

static float w_f32[3 * 5];      /* 60 bytes: not a multiple of 64 */
static uint16_t w_bf16[4 * 32]; /* 256 bytes */
static uint8_t w_u8[13];
static int64_t w_i64[3];
static int32_t w_i32[16]; /* 64 bytes */
static int8_t w_i8[7];
static uint16_t w_f16[2 * 2 * 2];
static float w_scalar = 3.25f;

typedef struct {
    const char *name;
    DType dt;
    int ndim;
    int64_t shape[4];
    const void *data;
    size_t nbytes;
} Spec;

static Spec specs[] = {
    {"tokenizer.bytes", DT_U8, 1, {13}, w_u8, sizeof w_u8},
    {"model.layers.0.self_attn.q_proj.weight", DT_F32, 2, {3, 5}, w_f32, sizeof w_f32},
    {"lm_head.weight", DT_BF16, 2, {4, 32}, w_bf16, sizeof w_bf16},
    {"scalar", DT_F32, 0, {0}, &w_scalar, 4},
    {"empty", DT_F32, 2, {0, 7}, NULL, 0},
    {"ids", DT_I64, 1, {3}, w_i64, sizeof w_i64},
    {"i32", DT_I32, 2, {4, 4}, w_i32, sizeof w_i32},
    {"i8", DT_I8, 1, {7}, w_i8, sizeof w_i8},
    {"half", DT_F16, 3, {2, 2, 2}, w_f16, sizeof w_f16},
};
#define NSPEC ((int)(sizeof specs / sizeof specs[0]))

static void fill_data(void) {
    for (int i = 0; i < 15; i++) w_f32[i] = 0.5f * i - 3;
    for (int i = 0; i < 128; i++) w_bf16[i] = (uint16_t)(0x3f80 + i);
    for (int i = 0; i < 13; i++) w_u8[i] = (uint8_t)(200 + i);
    for (int i = 0; i < 3; i++) w_i64[i] = -((int64_t)1 << 40) + i;
    for (int i = 0; i < 16; i++) w_i32[i] = -7 * i;
    for (int i = 0; i < 7; i++) w_i8[i] = (int8_t)(-3 * i);
    for (int i = 0; i < 8; i++) w_f16[i] = (uint16_t)(0x3c00 + i);
}

static int write_specs(const char *path, int compress) {
    TfWriter *w = tfw_begin(path, compress);
    if (!w) return -1;
    int bad = tfw_meta(w, "paradec.kind", "model") || tfw_meta(w, "paradec.version", "1") ||
              tfw_meta(w, "paradec.config", "{\"dim\": 64, \"name\": \"caf\xc3\xa9\"}") ||
              tfw_meta(w, "paradec.version", "2"); /* a second set replaces */
    for (int i = 0; !bad && i < NSPEC; i++)
        bad = tfw_add(w, specs[i].name, specs[i].dt, specs[i].ndim, specs[i].shape, specs[i].data);
    if (bad) {
        tfw_abort(w);
        return -1;
    }
    return tfw_commit(w);
}

/* every spec present with its dtype, shape and bytes; every tensor aligned to its
   element, and to 64 bytes when its size is a multiple of 64 */
static void check_specs(const TensorFile *tf, const char *what, int check_align) {
    CHECK(tf->n == NSPEC, "%s: %d tensors", what, tf->n);
    for (int i = 0; i < NSPEC; i++) {
        const Tensor *t = NULL;
        int rc = tf_expect(tf, specs[i].name, specs[i].dt, specs[i].ndim, specs[i].shape, &t);
        CHECK(rc == 0 && t, "%s: %s: %s", what, specs[i].name, pd_errmsg());
        if (!t) continue;
        CHECK(t->nbytes == specs[i].nbytes, "%s: %s nbytes %zu", what, t->name, t->nbytes);
        CHECK(!t->nbytes || !memcmp(t->data, specs[i].data, t->nbytes), "%s: %s bytes differ", what, t->name);
        uintptr_t a = (uintptr_t)t->data;
        if (check_align && t->nbytes) {
            CHECK(a % dtype_size(t->dtype) == 0, "%s: %s misaligned for its dtype", what, t->name);
            if (t->nbytes % 64 == 0) CHECK(a % 64 == 0, "%s: %s not 64-byte aligned", what, t->name);
        }
    }
    CHECK(tf->n_meta == 3, "%s: %d metadata", what, tf->n_meta);
    const char *v = tf_meta(tf, "paradec.version");
    CHECK(v && !strcmp(v, "2"), "%s: version %s", what, v ? v : "(none)");
    v = tf_meta(tf, "paradec.config");
    CHECK(v && !strcmp(v, "{\"dim\": 64, \"name\": \"caf\xc3\xa9\"}"), "%s: config", what);
    CHECK(tf_meta(tf, "nope") == NULL, "%s: absent meta", what);
    CHECK(tf_get(tf, "nope") == NULL, "%s: absent tensor", what);
}

static void test_round_trip(void) {
    char *plain = tmp_path("m.safetensors"), *zst = tmp_path("m.safetensors.zst");
    CHECK(write_specs(plain, -1) == 0, "write plain: %s", pd_errmsg());
    CHECK(write_specs(zst, -1) == 0, "write zst: %s", pd_errmsg());

    size_t np = 0, nz = 0;
    char *bp = read_bytes(plain, &np), *bz = read_bytes(zst, &nz);
    CHECK(bp && np > 8 && memcmp(bp + 8, "{", 1) == 0, "plain file starts with a JSON header");
    CHECK(bz && nz >= 4 && !memcmp(bz, "\x28\xb5\x2f\xfd", 4), ".zst has the zstd magic");
    if (bp && np >= 8) {
        uint64_t h = 0;
        for (int i = 7; i >= 0; i--) h = h << 8 | (unsigned char)bp[i];
        CHECK((8 + h) % 64 == 0, "data section starts 64-aligned (header %llu)", (unsigned long long)h);
        /* the reference reader needs the tensors to tile the data section exactly */
        size_t total = 0;
        for (int i = 0; i < NSPEC; i++) total += specs[i].nbytes;
        CHECK(8 + h + total == np, "no gaps: %zu bytes, expected %llu", np, (unsigned long long)(8 + h + total));
    }
    CHECK(bz && nz < np, "compressed is smaller (%zu vs %zu)", nz, np);
    free(bz);

    TensorFile tf;
    CHECK(tf_open(&tf, plain) == 0, "open plain: %s", pd_errmsg());
    CHECK(tf.map && !tf.buf, "plain file is mapped");
    check_specs(&tf, "plain", 1);
    /* tensors come back in file order: offsets increase */
    for (int i = 1; i < tf.n; i++)
        CHECK((const char *)tf.t[i].data >= (const char *)tf.t[i - 1].data + tf.t[i - 1].nbytes, "file order at %d", i);
    /* the writer keeps add order among tensors that keep 64-alignment */
    CHECK(tf.n == NSPEC && !strcmp(tf.t[0].name, "lm_head.weight") && !strcmp(tf.t[1].name, "empty") &&
              !strcmp(tf.t[2].name, "i32"),
          "order: %s %s %s", tf.t[0].name, tf.t[1].name, tf.t[2].name);
    tf_close(&tf);
    tf_close(&tf); /* idempotent */

    CHECK(tf_open(&tf, zst) == 0, "open zst: %s", pd_errmsg());
    check_specs(&tf, "zst", 1);
    tf_close(&tf);

    /* the same bytes through tf_parse, in an exact-size buffer */
    CHECK(tf_parse(&tf, bp, np, "mem") == 0, "parse: %s", pd_errmsg());
    check_specs(&tf, "parse", 0);
    tf_close(&tf);

    /* stdin: plain and compressed */
    CHECK(freopen(zst, "rb", stdin) != NULL, "reopen stdin");
    CHECK(tf_open(&tf, "-") == 0, "open - (zst): %s", pd_errmsg());
    check_specs(&tf, "stdin zst", 1);
    tf_close(&tf);
    CHECK(freopen(plain, "rb", stdin) != NULL, "reopen stdin");
    CHECK(tf_open(&tf, "-") == 0, "open - (plain): %s", pd_errmsg());
    check_specs(&tf, "stdin plain", 1);
    tf_close(&tf);
    free(bp);

    /* explicit compress flags beat the name */
    char *forced = tmp_path("forced.safetensors");
    CHECK(write_specs(forced, 1) == 0, "write forced zstd: %s", pd_errmsg());
    bz = read_bytes(forced, &nz);
    CHECK(bz && nz >= 4 && !memcmp(bz, "\x28\xb5\x2f\xfd", 4), "compress=1 gives zstd");
    free(bz);
    char *forced2 = tmp_path("forced2.safetensors.zst");
    CHECK(write_specs(forced2, 0) == 0, "write forced plain: %s", pd_errmsg());
    bz = read_bytes(forced2, &nz);
    CHECK(bz && nz >= 4 && memcmp(bz, "\x28\xb5\x2f\xfd", 4), "compress=0 gives plain");
    free(bz);
    remove(forced);
    remove(forced2);
}

/* `zstd -d` of our .zst is byte-identical to the plain file: nothing home-made */
static void test_zstd_cli(void) {
    char cmd[1024];
    char *zst = tmp_path("m.safetensors.zst"), *out = tmp_path("cli.safetensors");
    snprintf(cmd, sizeof cmd, "zstd -q -d -f '%s' -o '%s'", zst, out);
    CHECK(system(cmd) == 0, "zstd -d failed (is the zstd CLI installed?)");
    size_t na = 0, nb = 0;
    char *a = read_bytes(out, &na), *b = read_bytes(tmp_path("m.safetensors"), &nb);
    CHECK(a && b && na == nb && !memcmp(a, b, na), "zstd -d output differs from the plain file");
    free(a);
    free(b);
    /* and the other way: a file the zstd CLI compressed (multi-threaded, no content size) */
    char *cz = tmp_path("cli.safetensors.zst");
    snprintf(cmd, sizeof cmd, "zstd -q -f -19 -T2 --no-content-size < '%s' > '%s'", out, cz);
    CHECK(system(cmd) == 0, "zstd compress failed");
    TensorFile tf;
    CHECK(tf_open(&tf, cz) == 0, "open CLI-compressed: %s", pd_errmsg());
    check_specs(&tf, "cli zst", 1);
    tf_close(&tf);
    /* two frames back to back are one stream (zstd -d concatenates them too) */
    char *two = tmp_path("two.zst");
    snprintf(cmd, sizeof cmd, "head -c 1000 '%s' | zstd -q -c > '%s' && tail -c +1001 '%s' | zstd -q -c >> '%s'", out,
             two, out, two);
    CHECK(system(cmd) == 0, "two-frame file");
    CHECK(tf_open(&tf, two) == 0, "open two-frame zst: %s", pd_errmsg());
    check_specs(&tf, "two frames", 1);
    tf_close(&tf);
    remove(out);
    remove(cz);
    remove(two);
}

/* the reference implementation's own test vectors (huggingface/safetensors,
   safetensors/src/tensor.rs: test_serialization, test_empty), and a header by the spec */
static void test_reference_bytes(void) {
    static const unsigned char ser[] = {
        64,  0,  0,   0,  0,   0,  0,   0,   123, 34,  97,  116, 116, 110, 46,  48, 34, 58, 123, 34, 100, 116, 121, 112,
        101, 34, 58,  34, 70,  51, 50,  34,  44,  34,  115, 104, 97,  112, 101, 34, 58, 91, 49,  44, 50,  44,  51,  93,
        44,  34, 100, 97, 116, 97, 95,  111, 102, 102, 115, 101, 116, 115, 34,  58, 91, 48, 44,  50, 52,  93,  125, 125,
        0,   0,  0,   0,  0,   0,  128, 63,  0,   0,   0,   64,  0,   0,   64,  64, 0,  0,  128, 64, 0,   0,   160, 64};
    TensorFile tf;
    const Tensor *t = NULL;
    int64_t shp[3] = {1, 2, 3};
    CHECK(tf_parse(&tf, ser, sizeof ser, "ref") == 0, "reference vector: %s", pd_errmsg());
    CHECK(tf_expect(&tf, "attn.0", DT_F32, 3, shp, &t) == 0, "%s", pd_errmsg());
    if (t) {
        float v[6];
        memcpy(v, t->data, sizeof v);
        for (int i = 0; i < 6; i++) CHECK(v[i] == (float)i, "attn.0[%d] = %g", i, v[i]);
    }
    tf_close(&tf);

    static const unsigned char empty[] = {8, 0, 0, 0, 0, 0, 0, 0, 123, 125, 32, 32, 32, 32, 32, 32};
    CHECK(tf_parse(&tf, empty, sizeof empty, "empty") == 0 && tf.n == 0 && tf.n_meta == 0, "reference empty file: %s",
          pd_errmsg());
    tf_close(&tf);
    static const unsigned char meta[] = {40,  0,   0,   0,  0,  0,  0,   0,   123, 34,  95,  95,  109, 101, 116, 97,
                                         100, 97,  116, 97, 95, 95, 34,  58,  123, 34,  102, 114, 97,  109, 101, 119,
                                         111, 114, 107, 34, 58, 34, 112, 116, 34,  125, 125, 32,  32,  32,  32,  32};
    CHECK(tf_parse(&tf, meta, sizeof meta, "meta") == 0 && tf.n == 0, "reference meta file: %s", pd_errmsg());
    const char *fw = tf_meta(&tf, "framework");
    CHECK(fw && !strcmp(fw, "pt"), "framework = %s", fw ? fw : "(none)");
    tf_close(&tf);

    /* by the spec: a header literal, little-endian length, two little-endian floats */
    const char *h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"__metadata__\":{\"k\":\"v\"}}";
    size_t hl = strlen(h);
    unsigned char buf[256] = {0};
    buf[0] = (unsigned char)hl;
    memcpy(buf + 8, h, hl);
    static const unsigned char data[8] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x20, 0xc0}; /* 1, -2.5 */
    memcpy(buf + 8 + hl, data, 8);
    int64_t two = 2;
    CHECK(tf_parse(&tf, buf, 8 + hl + 8, "spec") == 0, "spec file: %s", pd_errmsg());
    CHECK(tf_expect(&tf, "a", DT_F32, 1, &two, &t) == 0, "%s", pd_errmsg());
    if (t) {
        float v[2];
        memcpy(v, t->data, 8);
        CHECK(v[0] == 1.0f && v[1] == -2.5f, "a = [%g, %g]", v[0], v[1]);
    }
    fw = tf_meta(&tf, "k");
    CHECK(fw && !strcmp(fw, "v"), "k = %s", fw ? fw : "(none)");
    tf_close(&tf);

    /* our writer's header text matches the reference's serialisation of the same tensor */
    char *p = tmp_path("attn.safetensors");
    float f[6] = {0, 1, 2, 3, 4, 5};
    TfWriter *w = tfw_begin(p, 0);
    CHECK(w && tfw_add(w, "attn.0", DT_F32, 3, shp, f) == 0 && tfw_commit(w) == 0, "%s", pd_errmsg());
    size_t n = 0;
    char *b = read_bytes(p, &n);
    /* same JSON text; we pad it with spaces to 120 so the data starts at byte 128 */
    CHECK(b && n == 128 + 24 && b[0] == 120 && !b[1], "our file: %zu bytes, header %d", n, b ? b[0] : -1);
    if (b && n == 128 + 24) {
        CHECK(!memcmp(b + 8, ser + 8, 64), "header JSON differs from the reference's");
        int spaces = 1;
        for (int i = 72; i < 128; i++) spaces &= b[i] == ' ';
        CHECK(spaces, "header padding is not spaces");
        CHECK(!memcmp(b + 128, ser + 72, 24), "data differs from the reference's");
    }
    free(b);
    remove(p);
}

/* ---- bad input ---- */

/* a file from a header literal and n data bytes (zeros) */
static size_t make_file(unsigned char *out, size_t cap, const char *header, size_t ndata) {
    size_t hl = strlen(header);
    if (8 + hl + ndata > cap) return 0;
    memset(out, 0, 8 + hl + ndata);
    for (int i = 0; i < 8; i++) out[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(out + 8, header, hl);
    return 8 + hl + ndata;
}

static void expect_refused(const char *what, const void *bytes, size_t n, const char *word) {
    TensorFile tf;
    void *copy = malloc(n ? n : 1); /* exact size: ASan sees any read past the end */
    memcpy(copy, bytes, n);
    int rc = tf_parse(&tf, copy, n, "bad.safetensors");
    CHECK(rc == -1, "%s: accepted", what);
    const char *m = pd_errmsg();
    CHECK(strstr(m, "bad.safetensors: ") == m && strstr(m, word), "%s: message '%s' lacks '%s'", what, m, word);
    CHECK(tf.n == 0 && tf.t == NULL && tf.path == NULL, "%s: tf not cleared", what);
    tf_close(&tf);
    free(copy);
}

static void expect_header_refused(const char *what, const char *header, size_t ndata, const char *word) {
    unsigned char buf[1024];
    size_t n = make_file(buf, sizeof buf, header, ndata);
    CHECK(n > 0, "%s: test file too big", what);
    expect_refused(what, buf, n, word);
}

static void test_bad_inputs(void) {
    expect_refused("empty file", "", 0, "too short");
    expect_refused("7 bytes", "\x02\0\0\0\0\0\0", 7, "too short");
    unsigned char b[64] = {0};
    b[0] = 100;
    memcpy(b + 8, "{}", 2);
    expect_refused("header longer than file", b, 16, "exceeds the file");
    uint64_t big = 1000000000000000ull; /* 10^15 */
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(big >> (8 * i));
    expect_refused("header length 10^15", b, 16, "header length 1000000000000000");
    memset(b, 0, 8);
    b[0] = 0xff, b[1] = 0xff, b[2] = 0xff, b[3] = 0xff, b[4] = 0xff, b[5] = 0xff, b[6] = 0xff, b[7] = 0xff;
    expect_refused("header length 2^64-1", b, 16, "exceeds the file");

    expect_header_refused("non-JSON", "{\"a\": nope}", 0, "not valid JSON");
    expect_header_refused("binary junk", "\x01\x02\x03", 0, "not valid JSON");
    expect_header_refused("invalid UTF-8", "{\"\xff\":1}", 0, "not valid JSON");
    expect_header_refused("non-object", "[1, 2, 3]", 0, "not a JSON object");
    expect_header_refused("trailing junk", "{} x", 0, "not valid JSON");
    expect_header_refused("duplicate key",
                          "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                          "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                          2, "duplicate");
    expect_header_refused("unknown dtype", "{\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
                          "dtype 'F64'");
    expect_header_refused("dtype not a string", "{\"a\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                          "dtype");
    expect_header_refused("negative shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1,2],\"data_offsets\":[0,8]}}", 8,
                          "shape[0]");
    expect_header_refused("fractional shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8,
                          "shape[0]");
    expect_header_refused("9 dims", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
                          1, "at most 8");
    expect_header_refused("overflowing shape",
                          "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0,
                          "overflows");
    expect_header_refused("shape/size mismatch",
                          "{\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[3,4],\"data_offsets\":[0,40]}}", 48,
                          "needs 48");
    expect_header_refused("offsets out of range",
                          "{\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[10],\"data_offsets\":[0,40]}}", 32,
                          "data_offsets [0, 40) exceed the data section (32 bytes)");
    expect_header_refused("offsets reversed", "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,2]}}", 8,
                          "exceed");
    expect_header_refused("negative offset", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 8,
                          "data_offsets");
    expect_header_refused("huge offset",
                          "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[18446744073709551615,0]}}", 8,
                          "not valid JSON"); /* jansson: too big integer */
    expect_header_refused("three offsets", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 8,
                          "data_offsets");
    expect_header_refused("overlap",
                          "{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
                          "\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[4,12]}}",
                          16, "overlap");
    expect_header_refused("same range twice",
                          "{\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
                          "\"a\":{\"dtype\":\"I8\",\"shape\":[8],\"data_offsets\":[0,8]}}",
                          16, "overlap");
    expect_header_refused("metadata value not a string", "{\"__metadata__\":{\"k\":1}}", 0, "not a string");
    expect_header_refused("metadata not an object", "{\"__metadata__\":\"x\"}", 0, "__metadata__");
    expect_header_refused("unknown key", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}}", 1,
                          "unknown key 'x'");
    expect_header_refused("missing shape", "{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, "shape");
    expect_header_refused("empty name", "{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                          "empty name");
    expect_header_refused("entry not an object", "{\"a\":[1]}", 0, "not a JSON object");
    expect_header_refused("NUL in header", "{\"a\\u0000b\":{}}", 0, "not valid JSON");

    /* accepted on purpose: gaps and an empty tensor inside another's range hold no bytes twice */
    unsigned char ok[512];
    size_t n = make_file(ok, sizeof ok,
                         "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                         "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[2,2]},"
                         "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[8,12]}}",
                         16);
    TensorFile tf;
    CHECK(tf_parse(&tf, ok, n, "gaps") == 0 && tf.n == 3, "gaps refused: %s", pd_errmsg());
    tf_close(&tf);

    /* through tf_open: empty file, truncated data, truncated zstd, a directory, a missing file */
    char *p = tmp_path("empty.safetensors");
    CHECK(write_bytes(p, "", 0) == 0, "write empty");
    CHECK(tf_open(&tf, p) == -1 && strstr(pd_errmsg(), "too short"), "empty file: %s", pd_errmsg());
    tf_close(&tf);
    size_t np = 0, nz = 0;
    char *plain = read_bytes(tmp_path("m.safetensors"), &np), *zst = read_bytes(tmp_path("m.safetensors.zst"), &nz);
    CHECK(plain && zst, "read test files");
    if (plain && zst) {
        CHECK(write_bytes(p, plain, np - 1) == 0, "write truncated");
        CHECK(tf_open(&tf, p) == -1 && strstr(pd_errmsg(), "exceed the data section"), "truncated data: %s",
              pd_errmsg());
        tf_close(&tf);
        CHECK(write_bytes(p, zst, nz - 5) == 0, "write truncated zst");
        CHECK(tf_open(&tf, p) == -1 && strstr(pd_errmsg(), "truncated zstd"), "truncated zst: %s", pd_errmsg());
        tf_close(&tf);
        CHECK(write_bytes(p, zst, nz / 2) == 0, "write half zst");
        CHECK(tf_open(&tf, p) == -1 && strstr(pd_errmsg(), "truncated zstd"), "half zst: %s", pd_errmsg());
        tf_close(&tf);
        zst[nz / 2] ^= 0x55; /* corrupt: the checksum or the decoder notices */
        CHECK(write_bytes(p, zst, nz) == 0, "write corrupt zst");
        CHECK(tf_open(&tf, p) == -1 && strstr(pd_errmsg(), "zstd"), "corrupt zst: %s", pd_errmsg());
        tf_close(&tf);
        /* garbage after a complete frame */
        zst[nz / 2] ^= 0x55;
        char *junk = malloc(nz + 4);
        memcpy(junk, zst, nz);
        memcpy(junk + nz, "junk", 4);
        CHECK(write_bytes(p, junk, nz + 4) == 0, "write zst+junk");
        CHECK(tf_open(&tf, p) == -1 && strstr(pd_errmsg(), "zstd"), "zst + junk: %s", pd_errmsg());
        tf_close(&tf);
        free(junk);
    }
    free(plain);
    free(zst);
    remove(p);
    CHECK(freopen("/dev/null", "rb", stdin) != NULL, "reopen stdin");
    CHECK(tf_open(&tf, "-") == -1 && strstr(pd_errmsg(), "-: 0 bytes is too short"), "empty stdin: %s", pd_errmsg());
    CHECK(tf_open(&tf, dir) == -1 && strstr(pd_errmsg(), "directory"), "directory: %s", pd_errmsg());
    CHECK(tf_open(&tf, tmp_path("absent")) == -1 && strstr(pd_errmsg(), "No such file"), "absent: %s", pd_errmsg());
    tf_close(&tf);
}

/* every truncation and many header mutations of a valid file: 0 or -1, never a crash,
   and anything accepted stays inside the buffer */
static void test_fuzz(void) {
    size_t n = 0;
    char *good = read_bytes(tmp_path("m.safetensors"), &n);
    CHECK(good && n > 64, "read test file");
    if (!good) return;
    int refused = 0;
    for (size_t len = 0; len < n; len++) {
        char *cut = malloc(len ? len : 1);
        memcpy(cut, good, len);
        TensorFile tf;
        int rc = tf_parse(&tf, cut, len, "cut");
        refused += rc == -1;
        tf_close(&tf);
        free(cut);
    }
    CHECK(refused == (int)n, "only %d of %zu truncations refused", refused, n);

    uint64_t h = 0;
    for (int i = 7; i >= 0; i--) h = h << 8 | (unsigned char)good[i];
    size_t span = 8 + (size_t)h;
    uint64_t s = 0x9e3779b97f4a7c15ull; /* fixed seed: xorshift64 */
    int accepted = 0, odd = 0;
    for (int it = 0; it < 2000; it++) {
        char *m = malloc(n);
        memcpy(m, good, n);
        int flips = 1 + it % 4;
        for (int k = 0; k < flips; k++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            size_t at = (s >> 8) % span;
            /* half the time a digit or JSON punctuation, so offsets and shapes get hit */
            static const char pick[] = "0123456789[]{},:\"-.e ";
            m[at] = (s & 1) ? (char)(s >> 32) : pick[(s >> 32) % (sizeof pick - 1)];
        }
        TensorFile tf;
        int rc = tf_parse(&tf, m, n, "mut");
        odd += rc != 0 && rc != -1;
        if (rc == 0) { /* inside this file's data section (the length bytes may be hit too) */
            accepted++;
            uint64_t mh = 0;
            for (int i = 7; i >= 0; i--) mh = mh << 8 | (unsigned char)m[i];
            for (int i = 0; i < tf.n; i++) {
                const char *d = tf.t[i].data;
                odd += mh > n - 8 || d < m + 8 + mh || d + tf.t[i].nbytes > m + n;
            }
        }
        tf_close(&tf);
        free(m);
    }
    CHECK(odd == 0, "%d mutations gave a bad result", odd);
    printf("fuzz: %zu truncations refused, %d of 2000 header mutations accepted\n", n, accepted);
    free(good);
}

/* ---- writer ---- */

static void test_writer(void) {
    /* abort leaves nothing, not even the temp file */
    char sub[128];
    snprintf(sub, sizeof sub, "%s/w", dir);
    CHECK(mkdir(sub, 0700) == 0, "mkdir");
    char out[192];
    snprintf(out, sizeof out, "%s/x.safetensors.zst", sub);
    TfWriter *w = tfw_begin(out, -1);
    CHECK(w != NULL, "begin: %s", pd_errmsg());
    CHECK(w && tfw_add(w, "a", DT_F32, 0, NULL, &w_scalar) == 0, "add: %s", pd_errmsg());
    /* while writing: an unnamed file (O_TMPFILE) or a temp name beside it, never the output */
    CHECK(!file_exists(out) && dir_count(sub) <= 1, "%d files while writing", dir_count(sub));
    tfw_abort(w);
    CHECK(dir_count(sub) == 0, "abort left %d files", dir_count(sub));
    tfw_abort(NULL);

    /* misuse is refused at add time, and the writer goes on */
    w = tfw_begin(out, 0);
    int64_t shp[2] = {2, -1}, sh9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    CHECK(w && tfw_add(w, "neg", DT_F32, 2, shp, w_f32) == -1 && strstr(pd_errmsg(), "neg"), "negative shape: %s",
          pd_errmsg());
    CHECK(w && tfw_add(w, "nine", DT_U8, 9, sh9, w_u8) == -1, "9 dims accepted");
    CHECK(w && tfw_add(w, "", DT_U8, 0, NULL, w_u8) == -1, "empty name accepted");
    CHECK(w && tfw_add(w, "__metadata__", DT_U8, 0, NULL, w_u8) == -1, "__metadata__ name accepted");
    CHECK(w && tfw_add(w, "bad\xff", DT_U8, 0, NULL, w_u8) == -1, "invalid UTF-8 accepted");
    CHECK(w && tfw_add(w, "nodata", DT_U8, 0, NULL, NULL) == -1, "NULL data accepted");
    CHECK(w && tfw_add(w, "baddt", (DType)99, 0, NULL, w_u8) == -1, "dtype 99 accepted");
    CHECK(w && tfw_meta(w, "k", "\xc3") == -1, "invalid UTF-8 metadata accepted");
    CHECK(w && tfw_add(w, "x", DT_U8, 0, NULL, w_u8) == 0, "add: %s", pd_errmsg());
    CHECK(w && tfw_add(w, "x", DT_U8, 0, NULL, w_u8) == -1 && strstr(pd_errmsg(), "twice"), "duplicate");
    CHECK(w && tfw_commit(w) == 0, "commit: %s", pd_errmsg());
    TensorFile tf;
    CHECK(tf_open(&tf, out) == 0 && tf.n == 1 && tf.n_meta == 0, "reopen: %s", pd_errmsg());
    tf_close(&tf);
    CHECK(dir_count(sub) == 1, "commit left %d files", dir_count(sub));
    remove(out);

    /* an empty file is a valid file */
    w = tfw_begin(out, -1);
    CHECK(w && tfw_commit(w) == 0, "empty commit: %s", pd_errmsg());
    CHECK(tf_open(&tf, out) == 0 && tf.n == 0, "empty reopen: %s", pd_errmsg());
    tf_close(&tf);
    remove(out);
    rmdir(sub);

    /* a path in a directory that does not exist fails (at begin: before the work) */
    char bad[256];
    snprintf(bad, sizeof bad, "%s/no/such/dir/m.safetensors", dir);
    w = tfw_begin(bad, -1);
    const char *m = pd_errmsg();
    CHECK(w == NULL && strstr(m, bad) && strstr(m, "No such file"), "bad dir: %s", m);
    CHECK(tfw_commit(NULL) == -1, "commit(NULL)");
    CHECK(!file_exists(bad), "bad path exists");

    /* "-" writes zstd to stdout */
    char *so = tmp_path("stdout.zst");
    fflush(stdout);
    int saved = dup(1), fd = open(so, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(saved >= 0 && fd >= 0 && dup2(fd, 1) == 1, "redirect stdout");
    close(fd);
    int rc = write_specs("-", -1);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    CHECK(rc == 0, "write -: %s", pd_errmsg());
    size_t n = 0;
    char *b = read_bytes(so, &n);
    CHECK(b && n >= 4 && !memcmp(b, "\x28\xb5\x2f\xfd", 4), "stdout got zstd");
    free(b);
    CHECK(tf_open(&tf, so) == 0, "open stdout file: %s", pd_errmsg());
    check_specs(&tf, "stdout", 1);
    tf_close(&tf);
    remove(so);
}

/* tf_expect's messages */
static void test_expect(void) {
    TensorFile tf;
    CHECK(tf_open(&tf, tmp_path("m.safetensors")) == 0, "open: %s", pd_errmsg());
    int64_t s44[2] = {4, 4}, s35[2] = {3, 5};
    const Tensor *t = (const Tensor *)1;
    CHECK(tf_expect(&tf, "model.layers.0.self_attn.q_proj.weight", DT_F32, 2, s44, &t) == -1 && t == NULL,
          "wrong shape accepted");
    CHECK(strstr(pd_errmsg(),
                 "m.safetensors: tensor 'model.layers.0.self_attn.q_proj.weight': shape [3, 5], expected [4, 4]"),
          "message: %s", pd_errmsg());
    CHECK(tf_expect(&tf, "model.layers.0.self_attn.q_proj.weight", DT_BF16, 2, s35, NULL) == -1 &&
              strstr(pd_errmsg(), "dtype F32, expected BF16"),
          "message: %s", pd_errmsg());
    CHECK(tf_expect(&tf, "missing", DT_F32, 2, s35, NULL) == -1 && strstr(pd_errmsg(), "tensor 'missing' not found"),
          "message: %s", pd_errmsg());
    CHECK(tf_expect(&tf, "scalar", DT_F32, 1, s35, NULL) == -1 && strstr(pd_errmsg(), "shape [], expected [3]"),
          "message: %s", pd_errmsg());
    tf_close(&tf);
}

static void test_dtypes(void) {
    static const char *names[] = {"F32", "F16", "BF16", "U8", "I8", "I32", "I64"};
    static const size_t sizes[] = {4, 2, 2, 1, 1, 4, 8};
    for (int i = 0; i < DT_Q8_0; i++) {
        CHECK(!strcmp(dtype_name((DType)i), names[i]), "name %d", i);
        CHECK(dtype_parse(names[i]) == i, "parse %s", names[i]);
        CHECK(dtype_size((DType)i) == sizes[i], "size %s", names[i]);
        CHECK(!dtype_is_quant((DType)i) && dtype_block((DType)i) == 1 && dtype_block_bytes((DType)i) == sizes[i] &&
                  dtype_row_bytes((DType)i, 7) == 7 * sizes[i],
              "%s is not a block type", names[i]);
    }
    CHECK(dtype_parse("f32") == -1 && dtype_parse("F64") == -1 && dtype_parse("") == -1, "unknown dtypes");
    /* ggml's block structs (ggml-common.h): block_q8_0 {half d; int8 qs[32]}, block_q4_0
       {half d; u8 qs[16]}, block_q4_1 {half d, m; u8 qs[16]}, block_q4_K {half d, dmin; u8
       scales[12], qs[128]}, block_q5_0 {half d; u8 qh[4], qs[16]}, block_q5_K {… qh[32] …},
       block_q6_K {u8 ql[128], qh[64]; i8
       scales[16]; half d} */
    static const struct {
        const char *name, *lower;
        int block;
        size_t bytes;
    } q[] = {{"Q8_0", "q8_0", 32, 34},  {"Q4_0", "q4_0", 32, 18},   {"Q4_1", "q4_1", 32, 20},
             {"Q5_0", "q5_0", 32, 22},  {"Q4_K", "q4_k", 256, 144}, {"Q5_K", "q5_k", 256, 176},
             {"Q6_K", "q6_k", 256, 210}};
    for (int i = 0; i < DT_COUNT - DT_Q8_0; i++) {
        DType t = (DType)(DT_Q8_0 + i);
        CHECK(!strcmp(dtype_name(t), q[i].name) && dtype_parse_quant(q[i].name) == (int)t &&
                  dtype_parse_quant(q[i].lower) == (int)t && dtype_parse(q[i].name) == -1,
              "names of %s", q[i].name);
        CHECK(dtype_is_quant(t) && dtype_size(t) == 0 && dtype_block(t) == q[i].block &&
                  dtype_block_bytes(t) == q[i].bytes,
              "traits of %s", q[i].name);
        /* a short row is still whole blocks */
        CHECK(dtype_row_bytes(t, 1) == q[i].bytes && dtype_row_bytes(t, q[i].block) == q[i].bytes &&
                  dtype_row_bytes(t, q[i].block + 1) == 2 * q[i].bytes && dtype_row_bytes(t, 0) == 0 &&
                  dtype_row_bytes(t, -1) == SIZE_MAX &&
                  dtype_row_bytes(t, INT64_MAX) == ((size_t)INT64_MAX / q[i].block + 1) * q[i].bytes,
              "row bytes of %s", q[i].name);
    }
    CHECK(dtype_parse_quant("F32") == -1 && dtype_parse_quant("Q5_1") == -1 && dtype_parse_quant("") == -1,
          "not block types");
}

/* opt-in (PD_TEST_BIG=1): a 2.5 GB tensor through both paths; needs ~3 GB RAM */
static void test_big(void) {
    if (!getenv("PD_TEST_BIG")) return;
    size_t nb = (size_t)5 << 29; /* 2.5 GiB of U8 */
    uint8_t *d = calloc(nb, 1);
    CHECK(d != NULL, "alloc");
    if (!d) return;
    for (size_t i = 0; i < nb; i += 4093) d[i] = (uint8_t)(i >> 12);
    int64_t shp = (int64_t)nb;
    for (int z = 0; z < 2; z++) {
        char *p = tmp_path(z ? "big.safetensors.zst" : "big.safetensors");
        TfWriter *w = tfw_begin(p, -1);
        CHECK(w && tfw_add(w, "big", DT_U8, 1, &shp, d) == 0 && tfw_commit(w) == 0, "big write: %s", pd_errmsg());
        TensorFile tf;
        const Tensor *t = NULL;
        CHECK(tf_open(&tf, p) == 0 && tf_expect(&tf, "big", DT_U8, 1, &shp, &t) == 0, "big read: %s", pd_errmsg());
        CHECK(t && !memcmp(t->data, d, nb), "big data differs");
        tf_close(&tf);
        remove(p);
    }
    free(d);
}

/* ---- checked weights: paradec.digests (golden values from Python's xxhash and xxhsum,
   XXH3-64 of the bytes) ---- */

static int write_digested(const char *path, const char *list) {
    static const char abc[3] = {'a', 'b', 'c'};
    int64_t s15[1] = {15}, s3[1] = {3}, s0[2] = {0, 7};
    TfWriter *w = tfw_begin(path, -1);
    if (!w) return -1;
    if (list) tfw_meta(w, TF_DIGESTS_KEY, list); /* a hand-made list */
    else tfw_record_digests(w);
    if (tfw_add(w, "w", DT_F32, 1, s15, w_f32) || tfw_add(w, "abc", DT_U8, 1, s3, abc) ||
        tfw_add(w, "empty", DT_F32, 2, s0, NULL)) {
        tfw_abort(w);
        return -1;
    }
    return tfw_commit(w);
}

static void verify_refuses(const char *what, const char *list, const char *msg) {
    char *p = tmp_path("dl.safetensors");
    TensorFile tf;
    int ok = write_digested(p, list) == 0 && tf_open(&tf, p) == 0;
    CHECK(ok, "%s: write/open: %s", what, pd_errmsg());
    if (!ok) return;
    int rec = -1, rc = tf_verify(&tf, &rec);
    CHECK(rc == -1 && strstr(pd_errmsg(), msg) && strstr(pd_errmsg(), p), "%s: rc %d: %s", what, rc, pd_errmsg());
    tf_close(&tf);
    remove(p);
}

static void test_digests(void) {
    /* the writer's order, not the file's ("empty" is stored first, "abc" last) */
    const char *want = "[[\"w\",\"6e4c91b5c404ca96\"],[\"abc\",\"78af5f94892f3950\"],[\"empty\",\"2d06800538d394c2\"]]";
    for (int z = 0; z < 2; z++) {
        char *p = tmp_path(z ? "d.safetensors.zst" : "d.safetensors");
        TensorFile tf;
        CHECK(write_digested(p, NULL) == 0 && tf_open(&tf, p) == 0, "digests %d: %s", z, pd_errmsg());
        const char *got = tf_meta(&tf, TF_DIGESTS_KEY);
        CHECK(got && !strcmp(got, want), "digests %d: recorded %s", z, got ? got : "(none)");
        CHECK(tf.n == 3 && !strcmp(tf.t[0].name, "empty") && !strcmp(tf.t[2].name, "abc"), "digests %d: file order", z);
        int rec = -1;
        CHECK(tf_verify(&tf, &rec) == 0 && rec == 1, "digests %d: verify: %s", z, pd_errmsg());
        tf_close(&tf);
        /* one byte of "abc" changed, in memory: refused naming it, unless verification is off */
        size_t n = 0;
        char *bytes = read_bytes(tmp_path("d.safetensors"), &n);
        if (z && bytes) {
            char *c = memmem(bytes, n, "abc", 3); /* its data: the header holds "abc" only quoted */
            while (c && c > bytes && c[-1] == '"') c = memmem(c + 1, n - (size_t)(c + 1 - bytes), "abc", 3);
            CHECK(c != NULL, "abc's bytes not found");
            if (c) c[1] = 'B';
            CHECK(tf_parse(&tf, bytes, n, "mem") == 0, "parse: %s", pd_errmsg());
            int rc = tf_verify(&tf, NULL);
            CHECK(rc == -1 && strstr(pd_errmsg(), "mem: tensor 'abc' is damaged"), "damage: %d %s", rc, pd_errmsg());
            pd_verify_weights = 0;
            CHECK(tf_verify(&tf, &rec) == 0 && rec == 0, "--no-verify: %s", pd_errmsg());
            pd_verify_weights = 1;
            tf_close(&tf);
        }
        free(bytes);
        if (z) {
            remove(p);
            remove(tmp_path("d.safetensors"));
        }
    }
    TensorFile tf;
    CHECK(write_specs(tmp_path("n.safetensors"), 0) == 0 && tf_open(&tf, tmp_path("n.safetensors")) == 0, "%s",
          pd_errmsg());
    int rec = -1;
    CHECK(tf_verify(&tf, &rec) == 0 && rec == 0, "no digests recorded: %s", pd_errmsg());
    tf_close(&tf);
    remove(tmp_path("n.safetensors"));
    verify_refuses("not JSON", "[[", "is not a JSON array");
    verify_refuses("not hex", "[[\"w\",\"6e4c91b5c404ca9g\"]]", "entry 1 is not a [name, 16 hex digits] pair");
    verify_refuses("short hex", "[[\"w\",\"6e4c91b5c404ca9\"]]", "entry 1 is not");
    verify_refuses("a tensor the file lacks", "[[\"nope\",\"0000000000000000\"]]", "tensor 'nope' is missing");
    verify_refuses("twice", "[[\"w\",\"6e4c91b5c404ca96\"],[\"w\",\"6e4c91b5c404ca96\"]]", "lists tensor 'w' twice");
    verify_refuses("a wrong digest", "[[\"w\",\"6e4c91b5c404ca97\"]]", "tensor 'w' is damaged");
    verify_refuses("a tensor left out", "[[\"w\",\"6e4c91b5c404ca96\"],[\"abc\",\"78af5f94892f3950\"]]",
                   "tensor 'empty' has no digest");
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/test_tensorfile.XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    fill_data();
    test_dtypes();
    test_round_trip();
    test_zstd_cli();
    test_reference_bytes();
    test_bad_inputs();
    test_fuzz();
    test_writer();
    test_expect();
    test_big();
    test_digests();
    remove(tmp_path("m.safetensors"));
    remove(tmp_path("m.safetensors.zst"));
    CHECK(dir_count(dir) == 0, "files left in %s", dir);
    rmdir(dir);
    return check_done("test_tensorfile");
}
