/* tensorfile.c — safetensors read/write, plain (mmap) or zstd (streamed). See tensorfile.h.

   Layout we write (readable by the reference safetensors reader, which demands that
   the tensors tile the data section with no gaps and end exactly at end of file):
     [u64 LE N][N bytes JSON header, space-padded so 8+N is a multiple of 64][data]
   Tensors are contiguous. To keep every tensor aligned without gaps, the tensors whose
   byte size is a multiple of 64 come first (in add order, so each starts 64-aligned),
   then the rest by decreasing element size (so each starts aligned to its element). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mremap */
#endif
#include "formats/tensorfile.h"

#include "base/util.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#define TF_MAX_HEADER 100000000ull       /* the reference reader's limit */
#define TF_MAX_LOADED ((size_t)64 << 30) /* refuse to decompress/read more than 64 GiB */
#define TF_HEADER_ALIGN 64
#define TF_IO_CHUNK ((size_t)1 << 26) /* 64 MB per write call: >2 GB tensors loop */
#define ZSTD_MAGIC 0xFD2FB528u

/* ---- dtypes ---- */

static const char *const dtype_names[DT_COUNT] = {"F32",  "F16",  "BF16", "U8",   "I8",   "I32",  "I64",
                                                  "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q5_K", "Q6_K"};
static const size_t dtype_sizes[DT_COUNT] = {4, 2, 2, 1, 1, 4, 8};
static const size_t block_bytes[DT_COUNT] = {4, 2, 2, 1, 1, 4, 8, 34, 18, 20, 22, 144, 176, 210};

const char *dtype_name(DType t) { return (unsigned)t < DT_COUNT ? dtype_names[t] : "?"; }

int dtype_parse(const char *s) {
    for (int i = 0; i < DT_Q8_0; i++)
        if (s && !strcmp(s, dtype_names[i])) return i;
    return -1;
}

int dtype_parse_quant(const char *s) {
    for (int i = DT_Q8_0; i < DT_COUNT; i++)
        if (s && !strcasecmp(s, dtype_names[i])) return i;
    return -1;
}

size_t dtype_size(DType t) { return (unsigned)t < DT_COUNT ? dtype_sizes[t] : 0; }
int dtype_is_quant(DType t) { return t >= DT_Q8_0 && t < DT_COUNT; }
int dtype_block(DType t) { return t >= DT_Q4_K && t < DT_COUNT ? 256 : dtype_is_quant(t) ? 32 : 1; }
size_t dtype_block_bytes(DType t) { return (unsigned)t < DT_COUNT ? block_bytes[t] : 0; }
size_t dtype_row_bytes(DType t, int64_t cols) {
    if (cols < 0) return SIZE_MAX;
    int64_t b = dtype_block(t); /* ceil without cols + b - 1, which could overflow */
    return pd_mul((size_t)(cols / b + (cols % b != 0)), dtype_block_bytes(t));
}

/* elements × element size (rows × row bytes for a block type); SIZE_MAX on overflow
   or a negative dimension */
static size_t tensor_bytes(DType dt, int ndim, const int64_t *shape) {
    if (dtype_is_quant(dt)) {
        if (ndim != 2 || shape[0] < 0 || shape[1] < 1) return SIZE_MAX;
        return pd_mul((size_t)shape[0], dtype_row_bytes(dt, shape[1]));
    }
    size_t n = dtype_size(dt);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || (uint64_t)shape[i] > SIZE_MAX) return SIZE_MAX;
        n = pd_mul(n, (size_t)shape[i]);
    }
    return n;
}

/* "[3, 4]" into buf */
static const char *shape_str(char *buf, size_t size, int ndim, const int64_t *shape) {
    size_t at = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && at < size; i++)
        at += (size_t)snprintf(buf + at, size - at, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (at < size) snprintf(buf + at, size - at, "]");
    return buf;
}

/* ---- reading: header validation ---- */

void tf_close(TensorFile *tf) {
    for (int i = 0; tf->t && i < tf->n; i++) free(tf->t[i].name);
    for (int i = 0; i < tf->n_meta; i++) {
        if (tf->meta_key) free(tf->meta_key[i]);
        if (tf->meta_val) free(tf->meta_val[i]);
    }
    free(tf->t);
    free(tf->meta_key);
    free(tf->meta_val);
    free(tf->path);
    free(tf->buf);
    if (tf->map) munmap(tf->map, tf->map_len);
    memset(tf, 0, sizeof *tf);
}

static int get_u64(json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* one tensor entry: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]} */
static int parse_tensor(const char *what, const char *name, json_t *e, size_t data_size, Tensor *t, uint64_t off[2]) {
    if (!*name) return pd_error("%s: a tensor has an empty name", what);
    if (!json_is_object(e)) return pd_error("%s: tensor '%s': entry is not a JSON object", what, name);
    const char *key;
    json_t *v;
    json_object_foreach(e, key, v) {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return pd_error("%s: tensor '%s': unknown key '%s'", what, name, key);
    }
    json_t *dt = json_object_get(e, "dtype"), *sh = json_object_get(e, "shape"),
           *of = json_object_get(e, "data_offsets");
    if (!dt || !sh || !of)
        return pd_error("%s: tensor '%s': missing \"%s\"", what, name, !dt ? "dtype" : !sh ? "shape" : "data_offsets");
    if (!json_is_string(dt)) return pd_error("%s: tensor '%s': dtype is not a string", what, name);
    int d = dtype_parse(json_string_value(dt));
    if (d < 0)
        return pd_error("%s: tensor '%s': unsupported dtype '%s' (known: F32 F16 BF16 U8 I8 I32 I64)", what, name,
                        json_string_value(dt));
    t->dtype = (DType)d;
    if (!json_is_array(sh) || json_array_size(sh) > TF_MAX_DIMS)
        return pd_error("%s: tensor '%s': shape must be an array of at most %d integers", what, name, TF_MAX_DIMS);
    t->ndim = (int)json_array_size(sh);
    for (int i = 0; i < t->ndim; i++) {
        json_t *x = json_array_get(sh, (size_t)i);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return pd_error("%s: tensor '%s': shape[%d] is not a non-negative integer", what, name, i);
        t->shape[i] = json_integer_value(x);
    }
    t->nbytes = tensor_bytes(t->dtype, t->ndim, t->shape);
    char sbuf[256];
    if (t->nbytes == SIZE_MAX)
        return pd_error("%s: tensor '%s': shape %s overflows", what, name,
                        shape_str(sbuf, sizeof sbuf, t->ndim, t->shape));
    if (!json_is_array(of) || json_array_size(of) != 2 || get_u64(json_array_get(of, 0), &off[0]) ||
        get_u64(json_array_get(of, 1), &off[1]))
        return pd_error("%s: tensor '%s': data_offsets must be two non-negative integers", what, name);
    if (off[0] > off[1] || off[1] > data_size)
        return pd_error("%s: tensor '%s': data_offsets [%llu, %llu) exceed the data section (%zu bytes)", what, name,
                        (unsigned long long)off[0], (unsigned long long)off[1], data_size);
    if (off[1] - off[0] != t->nbytes)
        return pd_error("%s: tensor '%s': data_offsets [%llu, %llu) hold %llu bytes, but %s %s needs %zu", what, name,
                        (unsigned long long)off[0], (unsigned long long)off[1], (unsigned long long)(off[1] - off[0]),
                        dtype_name(t->dtype), shape_str(sbuf, sizeof sbuf, t->ndim, t->shape), t->nbytes);
    return 0;
}

static int parse_meta(TensorFile *tf, const char *what, json_t *m) {
    if (!json_is_object(m)) return pd_error("%s: __metadata__ is not a JSON object", what);
    size_t n = json_object_size(m);
    tf->meta_key = pd_alloc(n * sizeof(char *));
    tf->meta_val = pd_alloc(n * sizeof(char *));
    if (!tf->meta_key || !tf->meta_val) return -1;
    const char *key;
    json_t *v;
    json_object_foreach(m, key, v) {
        if (!json_is_string(v))
            return pd_error("%s: __metadata__ '%s' is not a string (safetensors metadata is string to string)", what,
                            key);
        int i = tf->n_meta;
        tf->meta_key[i] = pd_strdup(key);
        tf->meta_val[i] = pd_strdup(json_string_value(v));
        if (!tf->meta_key[i] || !tf->meta_val[i]) {
            free(tf->meta_key[i]);
            free(tf->meta_val[i]);
            return -1;
        }
        tf->n_meta++;
    }
    return 0;
}

typedef struct {
    uint64_t begin, end;
    int idx; /* header order: ties keep it, so the order is deterministic */
} Span;

static int span_cmp(const void *a, const void *b) {
    const Span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->idx - y->idx;
}

/* tensors into tf->t, sorted by offset (file order); rejects overlaps */
static int parse_tensors(TensorFile *tf, const char *what, json_t *root, const char *data, size_t data_size) {
    size_t cap = json_object_size(root);
    Tensor *tmp = pd_alloc(cap * sizeof(Tensor)); /* [cap] header order; names borrowed from root */
    Span *sp = pd_alloc(cap * sizeof(Span));
    tf->t = pd_alloc(cap * sizeof(Tensor));
    int n = 0, rc = -1;
    if (!tmp || !sp || !tf->t) goto out;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "__metadata__")) continue;
        uint64_t off[2];
        if (parse_tensor(what, key, v, data_size, &tmp[n], off)) goto out;
        tmp[n].name = (char *)key;
        tmp[n].data = data + off[0];
        sp[n] = (Span){off[0], off[1], n};
        n++;
    }
    qsort(sp, (size_t)n, sizeof *sp, span_cmp);
    const Span *prev = NULL; /* empty tensors hold no bytes, so they overlap nothing */
    for (int i = 0; i < n; i++) {
        if (sp[i].begin == sp[i].end) continue;
        if (prev && sp[i].begin < prev->end) {
            pd_error("%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap", what, tmp[prev->idx].name,
                     (unsigned long long)prev->begin, (unsigned long long)prev->end, tmp[sp[i].idx].name,
                     (unsigned long long)sp[i].begin, (unsigned long long)sp[i].end);
            goto out;
        }
        prev = &sp[i];
    }
    for (int i = 0; i < n; i++) {
        Tensor *t = &tf->t[i];
        *t = tmp[sp[i].idx];
        if (!(t->name = pd_strdup(t->name))) goto out;
        tf->n = i + 1;
    }
    rc = 0;
out:
    free(tmp);
    free(sp);
    return rc;
}

/* "paradec.quant": {name: [type, cols]} turns U8 [rows][row bytes] tensors into block
   tensors of their logical shape [rows][cols] */
static int apply_quant(TensorFile *tf, const char *what) {
    const char *list = tf_meta(tf, TF_QUANT_KEY);
    if (!list) return 0;
    json_error_t err;
    json_t *o = json_loads(list, JSON_REJECT_DUPLICATES, &err), *v;
    if (!json_is_object(o)) {
        json_decref(o);
        return pd_error("%s: %s is not a JSON object of name: [type, cols]", what, TF_QUANT_KEY);
    }
    const char *name;
    int rc = 0;
    json_object_foreach(o, name, v) {
        Tensor *t = NULL;
        for (int i = 0; i < tf->n && !t; i++)
            if (!strcmp(tf->t[i].name, name)) t = &tf->t[i];
        const char *type = json_string_value(json_array_get(v, 0));
        json_t *c = json_array_get(v, 1);
        if (!json_is_array(v) || json_array_size(v) != 2 || !type || !json_is_integer(c)) {
            rc = pd_error("%s: %s: tensor '%s': not a [type, cols] pair", what, TF_QUANT_KEY, name);
            break;
        }
        int dt = dtype_parse_quant(type);
        json_int_t cols = json_integer_value(c);
        if (dt < 0) {
            rc = pd_error("%s: tensor '%s': unknown block type '%.40s' (known: Q8_0 Q4_0 Q4_1 Q5_0 Q4_K Q5_K Q6_K)",
                          what, name, type);
            break;
        }
        if (!t) {
            rc = pd_error("%s: %s names tensor '%s', which the file lacks", what, TF_QUANT_KEY, name);
            break;
        }
        if (t->dtype != DT_U8 || t->ndim != 2) {
            rc = pd_error("%s: tensor '%s': a %s block tensor must be stored U8 [rows, row bytes], not %s with %d "
                          "dimensions",
                          what, name, dtype_name((DType)dt), dtype_name(t->dtype), t->ndim);
            break;
        }
        if (cols <= 0 || cols > INT32_MAX) {
            rc = pd_error("%s: tensor '%s': %s row length %lld is not in [1, 2^31)", what, name, dtype_name((DType)dt),
                          (long long)cols);
            break;
        }
        size_t rb = dtype_row_bytes((DType)dt, cols);
        if ((uint64_t)t->shape[1] != rb) {
            rc = pd_error("%s: tensor '%s': rows of %lld bytes, but %lld %s elements are %lld blocks of %zu bytes "
                          "(%zu)",
                          what, name, (long long)t->shape[1], (long long)cols, dtype_name((DType)dt),
                          (long long)((cols + dtype_block((DType)dt) - 1) / dtype_block((DType)dt)),
                          dtype_block_bytes((DType)dt), rb);
            break;
        }
        t->dtype = (DType)dt;
        t->shape[1] = cols;
    }
    json_decref(o);
    return rc;
}

int tf_parse(TensorFile *tf, const void *bytes, size_t n, const char *what) {
    memset(tf, 0, sizeof *tf);
    if (!what) what = "<memory>";
    tf->path = pd_strdup(what);
    if (!tf->path) return -1;
    const unsigned char *p = bytes;
    if (n < 8) {
        pd_error("%s: %zu bytes is too short for a safetensors file (no 8-byte header length)", what, n);
        goto fail;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | p[i];
    if (hlen > n - 8) {
        pd_error("%s: header length %llu exceeds the file (%zu bytes): truncated or not safetensors", what,
                 (unsigned long long)hlen, n);
        goto fail;
    }
    if (hlen > TF_MAX_HEADER) {
        pd_error("%s: header length %llu is over the 100 MB limit", what, (unsigned long long)hlen);
        goto fail;
    }
    json_error_t err;
    json_t *root = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        pd_error("%s: header is not valid JSON: %s (at byte %d)", what, err.text, err.position);
        goto fail;
    }
    int rc = -1;
    if (!json_is_object(root)) {
        pd_error("%s: header is not a JSON object", what);
    } else {
        json_t *m = json_object_get(root, "__metadata__");
        const char *data = (const char *)p + 8 + hlen;
        if ((!m || !parse_meta(tf, what, m)) && !parse_tensors(tf, what, root, data, n - 8 - (size_t)hlen) &&
            !apply_quant(tf, what))
            rc = 0;
    }
    json_decref(root);
    if (rc == 0) return 0;
fail:
    tf_close(tf);
    return -1;
}

/* ---- reading: files, stdin, zstd ---- */

/* a growing anonymous mapping: page-aligned (so is the data in it) and it grows
   with mremap, without copying gigabytes */
typedef struct {
    char *p;
    size_t len, cap;
} Grow;

static int grow_reserve(Grow *g, size_t need, const char *path) {
    if (need <= g->cap) return 0;
    if (need > TF_MAX_LOADED)
        return pd_error("%s: contents exceed %zu GiB; refusing to load", path, TF_MAX_LOADED >> 30);
    size_t cap = g->cap ? g->cap : ((size_t)1 << 20);
    while (cap < need) cap = cap > TF_MAX_LOADED / 2 ? TF_MAX_LOADED : cap * 2;
    void *q = g->p ? mremap(g->p, g->cap, cap, MREMAP_MAYMOVE)
                   : mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (q == MAP_FAILED) return pd_error("%s: out of memory reserving %zu bytes", path, cap);
    g->p = q;
    g->cap = cap;
    return 0;
}

static void grow_free(Grow *g) {
    if (g->p) munmap(g->p, g->cap);
    memset(g, 0, sizeof *g);
}

/* the rest of a zstd stream; `in` holds what was read already */
static int load_zstd(FILE *f, const char *path, Grow *g, char *inbuf, size_t insz, size_t have) {
    ZSTD_DCtx *dz = ZSTD_createDCtx();
    if (!dz) return pd_error("%s: out of memory creating a zstd decoder", path);
    /* the writer records the content size: reserve it once (multi-frame files still grow) */
    unsigned long long cs = ZSTD_getFrameContentSize(inbuf, have);
    int rc = -1;
    if (cs != ZSTD_CONTENTSIZE_UNKNOWN && cs != ZSTD_CONTENTSIZE_ERROR) {
        if (cs > TF_MAX_LOADED) {
            pd_error("%s: decompressed size %llu exceeds %zu GiB; refusing to load", path, cs, TF_MAX_LOADED >> 30);
            goto out;
        }
        if (cs && grow_reserve(g, (size_t)cs, path)) goto out;
    }
    ZSTD_inBuffer in = {inbuf, have, 0};
    size_t last = 1; /* 0 once a frame is complete */
    for (;;) {
        if (in.pos == in.size) {
            in.size = fread(inbuf, 1, insz, f);
            in.pos = 0;
            if (in.size == 0) break;
        }
        /* go on while input is left, or while a frame is unfinished and the output is
           full (the decoder may hold more); never grow past a finished frame */
        while (in.pos < in.size || (g->len == g->cap && last != 0)) {
            if (g->len == g->cap && grow_reserve(g, g->cap + 1, path)) goto out;
            ZSTD_outBuffer out = {g->p, g->cap, g->len};
            last = ZSTD_decompressStream(dz, &out, &in);
            g->len = out.pos;
            if (ZSTD_isError(last)) {
                pd_error("%s: corrupt zstd data: %s", path, ZSTD_getErrorName(last));
                goto out;
            }
        }
    }
    if (ferror(f)) pd_error("%s: read error: %s", path, strerror(errno));
    else if (last != 0) pd_error("%s: truncated zstd stream (ends inside a frame)", path);
    else rc = 0;
out:
    ZSTD_freeDCtx(dz);
    return rc;
}

/* a whole stream into g, decompressing it when it starts with the zstd magic */
static int load_stream(FILE *f, const char *path, Grow *g) {
    size_t insz = ZSTD_DStreamInSize();
    char *inbuf = pd_alloc(insz);
    if (!inbuf) return -1;
    size_t have = fread(inbuf, 1, insz, f);
    int rc = -1;
    const unsigned char *m = (const unsigned char *)inbuf;
    if (have >= 4 && (m[0] | m[1] << 8 | m[2] << 16 | (uint32_t)m[3] << 24) == ZSTD_MAGIC) {
        rc = load_zstd(f, path, g, inbuf, insz, have);
    } else {
        size_t got = have;
        if (grow_reserve(g, have, path)) goto out;
        if (have) memcpy(g->p, inbuf, have);
        g->len = have;
        while (got > 0) {
            if (grow_reserve(g, g->len + insz, path)) goto out;
            got = fread(g->p + g->len, 1, insz, f);
            g->len += got;
        }
        if (ferror(f)) pd_error("%s: read error: %s", path, strerror(errno));
        else rc = 0;
    }
out:
    free(inbuf);
    return rc;
}

static int parse_grown(TensorFile *tf, Grow *g, const char *path) {
    if (g->len && g->len < g->cap) { /* give back the slack; shrinking never moves */
        void *q = mremap(g->p, g->cap, g->len, 0);
        if (q != MAP_FAILED) g->cap = g->len;
    }
    if (tf_parse(tf, g->p ? g->p : "", g->len, path)) {
        grow_free(g);
        return -1;
    }
    /* read-only like a mapped plain file, so a stray write fails the same way for both */
    if (g->p) mprotect(g->p, g->cap, PROT_READ);
    tf->map = g->p;
    tf->map_len = g->cap;
    return 0;
}

static int open_stream(TensorFile *tf, FILE *f, const char *path) {
    Grow g = {0};
    if (load_stream(f, path, &g)) {
        grow_free(&g);
        return -1;
    }
    return parse_grown(tf, &g, path);
}

int tf_load(TensorFile *tf, const void *bytes, size_t n, const char *what) {
    memset(tf, 0, sizeof *tf);
    if (!what) what = "<memory>";
    if (n == 0) return tf_parse(tf, "", 0, what); /* fmemopen refuses an empty buffer */
    FILE *f = fmemopen((void *)bytes, n, "rb");
    if (!f) return pd_error("%s: %s", what, strerror(errno));
    int rc = open_stream(tf, f, what);
    fclose(f);
    return rc;
}

int tf_open(TensorFile *tf, const char *path) {
    memset(tf, 0, sizeof *tf);
    if (!strcmp(path, "-")) return open_stream(tf, stdin, "-");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return pd_error("%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st)) {
        int e = errno;
        close(fd);
        return pd_error("%s: %s", path, strerror(e));
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return pd_error("%s: is a directory", path);
    }
    unsigned char m[4] = {0};
    int zst = pread(fd, m, 4, 0) == 4 && (m[0] | m[1] << 8 | m[2] << 16 | (uint32_t)m[3] << 24) == ZSTD_MAGIC;
    if (zst || !S_ISREG(st.st_mode)) { /* pipes and compressed files: into memory */
        FILE *f = fdopen(fd, "rb");
        if (!f) {
            int e = errno;
            close(fd);
            return pd_error("%s: %s", path, strerror(e));
        }
        int rc = open_stream(tf, f, path);
        fclose(f);
        return rc;
    }
    size_t size = (size_t)st.st_size;
    if (size < 8) {
        close(fd);
        return pd_error("%s: %zu bytes is too short for a safetensors file (no 8-byte header length)", path, size);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return pd_error("%s: cannot map: %s", path, strerror(e));
    if (tf_parse(tf, map, size, path)) {
        munmap(map, size);
        return -1;
    }
    tf->map = map;
    tf->map_len = size;
    tf->file_backed = 1;
    return 0;
}

int tf_view(TensorFile *dst, const TensorFile *src, const char *prefix) {
    memset(dst, 0, sizeof *dst);
    size_t pl = strlen(prefix);
    int nt = 0, nm = 0;
    for (int i = 0; i < src->n; i++) nt += !strncmp(src->t[i].name, prefix, pl);
    for (int i = 0; i < src->n_meta; i++) nm += !strncmp(src->meta_key[i], prefix, pl);
    dst->t = pd_alloc(sizeof(Tensor) * (nt + 1));
    dst->meta_key = pd_alloc(sizeof(char *) * (nm + 1));
    dst->meta_val = pd_alloc(sizeof(char *) * (nm + 1));
    dst->path = pd_strdup(src->path ? src->path : "?");
    if (!dst->t || !dst->meta_key || !dst->meta_val || !dst->path) goto fail;
    for (int i = 0; i < src->n; i++) {
        if (strncmp(src->t[i].name, prefix, pl)) continue;
        dst->t[dst->n] = src->t[i];
        if (!(dst->t[dst->n].name = pd_strdup(src->t[i].name + pl))) goto fail;
        dst->n++;
    }
    for (int i = 0; i < src->n_meta; i++) {
        if (strncmp(src->meta_key[i], prefix, pl)) continue;
        dst->meta_key[dst->n_meta] = pd_strdup(src->meta_key[i] + pl);
        dst->meta_val[dst->n_meta] = pd_strdup(src->meta_val[i]);
        if (!dst->meta_key[dst->n_meta] || !dst->meta_val[dst->n_meta]) goto fail;
        dst->n_meta++;
    }
    return 0;
fail:
    dst->n_meta += dst->n_meta < nm; /* a half-made pair: tf_close frees what is there */
    tf_close(dst);
    return -1;
}

const Tensor *tf_get(const TensorFile *tf, const char *name) {
    for (int i = 0; i < tf->n; i++)
        if (!strcmp(tf->t[i].name, name)) return &tf->t[i];
    return NULL;
}

const char *tf_meta(const TensorFile *tf, const char *key) {
    for (int i = 0; i < tf->n_meta; i++)
        if (!strcmp(tf->meta_key[i], key)) return tf->meta_val[i];
    return NULL;
}

int tf_expect(const TensorFile *tf, const char *name, DType dt, int ndim, const int64_t *shape, const Tensor **out) {
    const char *path = tf->path ? tf->path : "?";
    const Tensor *t = tf_get(tf, name);
    if (out) *out = NULL;
    if (!t) return pd_error("%s: tensor '%s' not found", path, name);
    if (t->dtype != dt)
        return pd_error("%s: tensor '%s': dtype %s, expected %s", path, name, dtype_name(t->dtype), dtype_name(dt));
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char a[256], b[256];
        return pd_error("%s: tensor '%s': shape %s, expected %s", path, name, shape_str(a, sizeof a, t->ndim, t->shape),
                        shape_str(b, sizeof b, ndim, shape));
    }
    if (out) *out = t;
    return 0;
}

/* ---- checked weights ---- */

int pd_verify_weights = 1;

uint64_t tf_tensor_digest(const Tensor *t) { return XXH3_64bits(t->nbytes ? t->data : "", t->nbytes); }

static int parse_hex64(const char *s, uint64_t *out) {
    uint64_t v = 0;
    int i = 0;
    for (; i < 16; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v << 4 | (uint64_t)d;
    }
    if (s[i]) return -1;
    *out = v;
    return 0;
}

int tf_digests(const TensorFile *tf, TfDigest **d, int *n) {
    const char *path = tf->path ? tf->path : "?", *list = tf_meta(tf, TF_DIGESTS_KEY);
    *d = NULL;
    *n = 0;
    if (!list) return 0;
    json_t *a = json_loads(list, 0, NULL), *e;
    if (!json_is_array(a)) {
        json_decref(a);
        return pd_error("%s: %s is not a JSON array of [name, digest] pairs", path, TF_DIGESTS_KEY);
    }
    TfDigest *out = pd_alloc(sizeof *out * (json_array_size(a) + 1));
    size_t i;
    int rc = out ? 0 : -1;
    json_array_foreach(a, i, e) {
        const char *name = json_string_value(json_array_get(e, 0)), *hex = json_string_value(json_array_get(e, 1));
        if (rc) break;
        if (!json_is_array(e) || json_array_size(e) != 2 || !name || !hex || parse_hex64(hex, &out[i].digest)) {
            rc = pd_error("%s: %s entry %zu is not a [name, 16 hex digits] pair", path, TF_DIGESTS_KEY, i + 1);
        } else if (!(out[i].t = tf_get(tf, name))) {
            rc = pd_error("%s: tensor '%s' is missing (%s lists it)", path, name, TF_DIGESTS_KEY);
        } else {
            for (size_t j = 0; j < i && !rc; j++)
                if (out[j].t == out[i].t) rc = pd_error("%s: %s lists tensor '%s' twice", path, TF_DIGESTS_KEY, name);
        }
    }
    if (!rc) {
        *d = out;
        *n = (int)json_array_size(a);
    } else free(out);
    json_decref(a);
    return rc;
}

int tf_check_digests(const TensorFile *tf, const TfDigest *d, int n) {
    for (int i = 0; i < n; i++) {
        uint64_t got = tf_tensor_digest(d[i].t);
        if (got != d[i].digest)
            return pd_error("%s: tensor '%s' is damaged: its bytes hash to %016llx, not the %016llx recorded when "
                            "it was written (--no-verify loads it anyway)",
                            tf->path ? tf->path : "?", d[i].t->name, (unsigned long long)got,
                            (unsigned long long)d[i].digest);
    }
    return 0;
}

int tf_verify(const TensorFile *tf, int *recorded) {
    TfDigest *d;
    int n;
    if (recorded) *recorded = 0;
    if (!pd_verify_weights) return 0;
    if (tf_digests(tf, &d, &n)) return -1;
    if (recorded) *recorded = d != NULL;
    int rc = d ? tf_check_digests(tf, d, n) : 0;
    for (int i = 0; d && !rc && i < tf->n; i++) { /* a tensor the writer never hashed */
        int listed = 0;
        for (int j = 0; j < n && !listed; j++) listed = d[j].t == &tf->t[i];
        if (!listed)
            rc = pd_error("%s: tensor '%s' has no digest in %s: not as written", tf->path ? tf->path : "?",
                          tf->t[i].name, TF_DIGESTS_KEY);
    }
    free(d);
    return rc;
}

/* ---- writing ---- */

typedef struct {
    char *name;
    DType dtype;
    int ndim;
    int64_t shape[TF_MAX_DIMS];
    size_t nbytes;
    const void *data;
} WEntry;

struct TfWriter {
    AtomicFile af;
    char *path;
    int compress;
    WEntry *e;
    int n, cap;
    char **mkey, **mval;
    int n_meta, cap_meta;
    int digests; /* record paradec.digests at commit */
};

static int is_utf8(const char *s) { /* jansson refuses invalid UTF-8; find out now, not at commit */
    json_t *j = json_string(s);
    json_decref(j);
    return j != NULL;
}

TfWriter *tfw_begin(const char *path, int compress) {
    TfWriter *w = pd_alloc(sizeof *w);
    if (!w) return NULL;
    if (compress < 0) {
        size_t l = strlen(path);
        compress = !strcmp(path, "-") || (l >= 4 && !strcmp(path + l - 4, ".zst"));
    }
    w->compress = compress;
    w->path = pd_strdup(path);
    /* open now: a bad output path should fail before hours of work, not after */
    if (!w->path || atomic_open(&w->af, path)) {
        free(w->path);
        free(w);
        return NULL;
    }
    return w;
}

int tfw_meta(TfWriter *w, const char *key, const char *value) {
    if (!is_utf8(key) || !is_utf8(value)) return pd_error("%s: metadata '%s' is not valid UTF-8", w->path, key);
    for (int i = 0; i < w->n_meta; i++) {
        if (strcmp(w->mkey[i], key)) continue;
        char *v = pd_strdup(value);
        if (!v) return -1;
        free(w->mval[i]);
        w->mval[i] = v;
        return 0;
    }
    if (w->n_meta == w->cap_meta) {
        int cap = w->cap_meta ? 2 * w->cap_meta : 16;
        char **k = pd_realloc(w->mkey, (size_t)cap * sizeof *k);
        if (!k) return -1;
        w->mkey = k;
        char **v = pd_realloc(w->mval, (size_t)cap * sizeof *v);
        if (!v) return -1;
        w->mval = v;
        w->cap_meta = cap;
    }
    char *k = pd_strdup(key), *v = pd_strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return -1;
    }
    w->mkey[w->n_meta] = k;
    w->mval[w->n_meta++] = v;
    return 0;
}

int tfw_add(TfWriter *w, const char *name, DType dt, int ndim, const int64_t *shape, const void *data) {
    if (!name || !*name || !strcmp(name, "__metadata__") || !is_utf8(name))
        return pd_error("%s: invalid tensor name '%s'", w->path, name ? name : "(null)");
    if ((unsigned)dt >= DT_COUNT) return pd_error("%s: tensor '%s': invalid dtype %d", w->path, name, dt);
    if (ndim < 0 || ndim > TF_MAX_DIMS)
        return pd_error("%s: tensor '%s': %d dimensions (at most %d)", w->path, name, ndim, TF_MAX_DIMS);
    if (dtype_is_quant(dt) && (ndim != 2 || shape[1] < 1 || shape[1] > INT32_MAX))
        return pd_error("%s: tensor '%s': a %s tensor is a matrix [rows, cols] with 1 ≤ cols < 2^31", w->path, name,
                        dtype_name(dt));
    size_t nbytes = tensor_bytes(dt, ndim, shape);
    if (nbytes == SIZE_MAX) return pd_error("%s: tensor '%s': negative or overflowing shape", w->path, name);
    if (nbytes && !data) return pd_error("%s: tensor '%s': no data", w->path, name);
    for (int i = 0; i < w->n; i++)
        if (!strcmp(w->e[i].name, name)) return pd_error("%s: tensor '%s' added twice", w->path, name);
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        WEntry *e = pd_realloc(w->e, (size_t)cap * sizeof *e);
        if (!e) return -1;
        w->e = e;
        w->cap = cap;
    }
    WEntry *e = &w->e[w->n];
    memset(e, 0, sizeof *e);
    e->name = pd_strdup(name);
    if (!e->name) return -1;
    e->dtype = dt;
    e->ndim = ndim;
    if (ndim) memcpy(e->shape, shape, (size_t)ndim * sizeof *shape);
    e->nbytes = nbytes;
    e->data = data;
    w->n++;
    return 0;
}

static void writer_free(TfWriter *w) {
    for (int i = 0; i < w->n; i++) free(w->e[i].name);
    for (int i = 0; i < w->n_meta; i++) {
        free(w->mkey[i]);
        free(w->mval[i]);
    }
    free(w->e);
    free(w->mkey);
    free(w->mval);
    free(w->path);
    free(w);
}

void tfw_record_digests(TfWriter *w) {
    if (w) w->digests = 1;
}

/* paradec.digests: [[name, xxh3-64 hex], ...] in add order */
static int put_digests(TfWriter *w) {
    json_t *a = json_array();
    int bad = !a;
    for (int i = 0; !bad && i < w->n; i++) {
        const WEntry *e = &w->e[i];
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH3_64bits(e->nbytes ? e->data : "", e->nbytes));
        bad |= json_array_append_new(a, json_pack("[s, s]", e->name, hex));
    }
    char *s = bad ? NULL : json_dumps(a, JSON_COMPACT);
    json_decref(a);
    if (!s) return pd_error("%s: out of memory writing %s", w->path, TF_DIGESTS_KEY);
    int rc = tfw_meta(w, TF_DIGESTS_KEY, s);
    free(s);
    return rc;
}

/* paradec.quant: {name: [type, cols]} for the block tensors, in add order; any set
   before by tfw_meta is replaced (the entries are the truth) */
static int put_quant(TfWriter *w) {
    json_t *o = json_object();
    int bad = !o, any = 0;
    for (int i = 0; !bad && i < w->n; i++) {
        const WEntry *e = &w->e[i];
        if (!dtype_is_quant(e->dtype)) continue;
        any = 1;
        bad |= json_object_set_new(o, e->name, json_pack("[s, I]", dtype_name(e->dtype), (json_int_t)e->shape[1]));
    }
    char *s = bad || !any ? NULL : json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!any && !bad) {
        for (int i = 0; i < w->n_meta; i++) /* a copied key would name tensors that are not blocks here */
            if (!strcmp(w->mkey[i], TF_QUANT_KEY)) {
                free(w->mkey[i]);
                free(w->mval[i]);
                memmove(w->mkey + i, w->mkey + i + 1, sizeof(char *) * (size_t)(w->n_meta - i - 1));
                memmove(w->mval + i, w->mval + i + 1, sizeof(char *) * (size_t)(w->n_meta - i - 1));
                w->n_meta--;
                break;
            }
        return 0;
    }
    if (!s) return pd_error("%s: out of memory writing %s", w->path, TF_QUANT_KEY);
    int rc = tfw_meta(w, TF_QUANT_KEY, s);
    free(s);
    return rc;
}

void tfw_abort(TfWriter *w) {
    if (!w) return;
    atomic_abort(&w->af);
    writer_free(w);
}

/* the write order (see the top of the file): 64-multiples first, then by element size;
   ties keep add order */
typedef struct {
    int key, idx;
} Order;

static int order_cmp(const void *a, const void *b) {
    const Order *x = a, *y = b;
    return x->key != y->key ? x->key - y->key : x->idx - y->idx;
}

static int *write_order(const TfWriter *w) {
    Order *o = pd_alloc((size_t)(w->n ? w->n : 1) * sizeof *o);
    int *order = pd_alloc((size_t)(w->n ? w->n : 1) * sizeof *order);
    if (o && order) {
        for (int i = 0; i < w->n; i++) {
            const WEntry *e = &w->e[i];
            o[i] = (Order){e->nbytes % 64 == 0 ? 0 : 16 - (int)dtype_size(e->dtype), i};
        }
        qsort(o, (size_t)w->n, sizeof *o, order_cmp);
        for (int i = 0; i < w->n; i++) order[i] = o[i].idx;
    } else {
        free(order);
        order = NULL;
    }
    free(o);
    return order;
}

/* the JSON header, space-padded so that 8 + *len is a multiple of 64 */
static char *build_header(TfWriter *w, const int *order, size_t *len) {
    json_t *root = json_object(), *meta = NULL;
    char *buf = NULL;
    int bad = !root;
    if (!bad && w->n_meta) { /* first, as the reference writer puts it */
        bad |= json_object_set_new(root, "__metadata__", meta = json_object());
        for (int i = 0; !bad && i < w->n_meta; i++)
            bad |= json_object_set_new(meta, w->mkey[i], json_string(w->mval[i]));
    }
    uint64_t off = 0;
    for (int k = 0; !bad && k < w->n; k++) {
        const WEntry *e = &w->e[order[k]];
        /* key order as the reference writer: dtype, shape, data_offsets */
        json_t *entry = json_object(), *shape = json_array(), *offs = json_array();
        if (!entry || !shape || !offs) {
            json_decref(entry);
            json_decref(shape);
            json_decref(offs);
            bad = 1;
            break;
        }
        /* a block tensor is stored as U8 [rows, row bytes] (paradec.quant says what it is) */
        int q = dtype_is_quant(e->dtype);
        for (int i = 0; i < e->ndim; i++)
            bad |= json_array_append_new(
                shape, json_integer(q && i == 1 ? (json_int_t)dtype_row_bytes(e->dtype, e->shape[1]) : e->shape[i]));
        bad |= json_array_append_new(offs, json_integer((json_int_t)off));
        off += e->nbytes;
        bad |= json_array_append_new(offs, json_integer((json_int_t)off));
        bad |= json_object_set_new(entry, "dtype", json_string(dtype_name(q ? DT_U8 : e->dtype)));
        bad |= json_object_set_new(entry, "shape", shape);
        bad |= json_object_set_new(entry, "data_offsets", offs);
        bad |= json_object_set_new(root, e->name, entry);
    }
    size_t n = bad ? 0 : json_dumpb(root, NULL, 0, JSON_COMPACT);
    if (!bad && n) {
        size_t padded = (8 + n + TF_HEADER_ALIGN - 1) / TF_HEADER_ALIGN * TF_HEADER_ALIGN - 8;
        buf = pd_alloc(padded);
        if (buf && json_dumpb(root, buf, n, JSON_COMPACT) == n) {
            memset(buf + n, ' ', padded - n);
            *len = padded;
        } else {
            free(buf);
            buf = NULL;
        }
    }
    json_decref(root);
    if (!buf) pd_error("%s: cannot build the safetensors header (out of memory?)", w->path);
    return buf;
}

/* where the bytes go: straight to the file, or through a zstd stream */
typedef struct {
    FILE *f;
    const char *path;
    ZSTD_CCtx *z;
    char *zbuf;
    size_t zcap;
} Sink;

static int sink_raw(Sink *s, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        size_t k = n < TF_IO_CHUNK ? n : TF_IO_CHUNK;
        if (fwrite(c, 1, k, s->f) != k) return pd_error("%s: write error: %s", s->path, strerror(errno));
        c += k;
        n -= k;
    }
    return 0;
}

static int sink_zstd(Sink *s, const void *p, size_t n, ZSTD_EndDirective mode) {
    ZSTD_inBuffer in = {p, n, 0};
    for (;;) {
        ZSTD_outBuffer out = {s->zbuf, s->zcap, 0};
        size_t left = ZSTD_compressStream2(s->z, &out, &in, mode);
        if (ZSTD_isError(left)) return pd_error("%s: zstd: %s", s->path, ZSTD_getErrorName(left));
        if (sink_raw(s, s->zbuf, out.pos)) return -1;
        if (mode == ZSTD_e_end ? left == 0 : in.pos == in.size) return 0;
    }
}

static int sink_write(Sink *s, const void *p, size_t n) {
    if (!s->z) return sink_raw(s, p, n);
    const char *c = p;
    while (n) { /* chunks keep each call's work (and its progress) bounded */
        size_t k = n < TF_IO_CHUNK ? n : TF_IO_CHUNK;
        if (sink_zstd(s, c, k, ZSTD_e_continue)) return -1;
        c += k;
        n -= k;
    }
    return 0;
}

static int sink_open(Sink *s, FILE *f, const char *path, int compress, uint64_t total) {
    memset(s, 0, sizeof *s);
    s->f = f;
    s->path = path;
    if (!compress) return 0;
    s->z = ZSTD_createCCtx();
    s->zcap = ZSTD_CStreamOutSize();
    s->zbuf = pd_alloc(s->zcap);
    if (!s->z || !s->zbuf) return pd_error("%s: out of memory creating a zstd encoder", path);
    size_t r = ZSTD_CCtx_setParameter(s->z, ZSTD_c_compressionLevel, 3);
    if (!ZSTD_isError(r)) r = ZSTD_CCtx_setParameter(s->z, ZSTD_c_checksumFlag, 1);
    if (!ZSTD_isError(r)) r = ZSTD_CCtx_setParameter(s->z, ZSTD_c_nbWorkers, 0);
    /* the frame records the size, so readers allocate once */
    if (!ZSTD_isError(r)) r = ZSTD_CCtx_setPledgedSrcSize(s->z, total);
    if (ZSTD_isError(r)) return pd_error("%s: zstd: %s", path, ZSTD_getErrorName(r));
    return 0;
}

static void sink_free(Sink *s) {
    ZSTD_freeCCtx(s->z);
    free(s->zbuf);
}

int tfw_commit(TfWriter *w) {
    if (!w) return -1; /* tfw_begin failed and said why */
    int *order = write_order(w);
    char *hdr = NULL;
    size_t hlen = 0;
    Sink s = {0};
    int rc = -1;
    if (!order || put_quant(w) || (w->digests && put_digests(w))) goto out;
    if (!(hdr = build_header(w, order, &hlen))) goto out;
    uint64_t total = 8 + hlen;
    for (int i = 0; i < w->n; i++) total += w->e[i].nbytes;
    if (sink_open(&s, w->af.f, w->path, w->compress, total)) goto out;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    if (sink_write(&s, len8, 8) || sink_write(&s, hdr, hlen)) goto out;
    for (int k = 0; k < w->n; k++) {
        const WEntry *e = &w->e[order[k]];
        if (sink_write(&s, e->data, e->nbytes)) goto out;
    }
    if (s.z && sink_zstd(&s, NULL, 0, ZSTD_e_end)) goto out;
    rc = atomic_commit(&w->af);
out:
    if (rc) atomic_abort(&w->af); /* after a failed atomic_commit this is a no-op */
    sink_free(&s);
    free(order);
    free(hdr);
    writer_free(w);
    return rc;
}
