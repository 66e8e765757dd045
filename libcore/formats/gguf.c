/* gguf.c — llama.cpp's GGUF files (v2, v3), as its spec (docs/gguf.md) and gguf.cpp
   read them: header, key/values, tensor infos, padding to general.alignment, data.

   Parsing walks the metadata twice: the first walk only checks that every length and
   count is backed by bytes in the file (so a lying count cannot make us allocate),
   the second fills the arrays the first walk sized. */
#include "formats/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/util.h"
#include "formats/quant.h"

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_NAME 256

static const size_t TYPE_SIZE[GGUF_TYPE_COUNT] = {
    [GGUF_U8] = 1,  [GGUF_I8] = 1,   [GGUF_U16] = 2, [GGUF_I16] = 2, [GGUF_U32] = 4, [GGUF_I32] = 4,
    [GGUF_F32] = 4, [GGUF_BOOL] = 1, [GGUF_U64] = 8, [GGUF_I64] = 8, [GGUF_F64] = 8};

/* ---------------- ggml tensor types ---------------- */

typedef struct {
    int block;    /* elements per block */
    size_t bytes; /* bytes per block */
} GgmlTraits;

static int ggml_traits(uint32_t type, GgmlTraits *tr) {
    switch (type) {
    case GGML_F32:
        *tr = (GgmlTraits){1, 4};
        return 0;
    case GGML_F16:
    case GGML_BF16:
        *tr = (GgmlTraits){1, 2};
        return 0;
    case GGML_Q8_0:
        *tr = (GgmlTraits){32, 34};
        return 0; /* f16 d, int8 q[32] */
    case GGML_Q4_0:
        *tr = (GgmlTraits){32, 18};
        return 0; /* f16 d, 16 bytes of nibbles */
    case GGML_Q4_1:
        *tr = (GgmlTraits){32, 20};
        return 0; /* f16 d, f16 m, 16 bytes */
    case GGML_Q5_0:
        *tr = (GgmlTraits){32, 22};
        return 0; /* f16 d, 4 bytes of fifth bits, 16 bytes of nibbles */
    case GGML_Q4_K:
        *tr = (GgmlTraits){256, 144};
        return 0; /* f16 d, dmin; 12 bytes of 6-bit scales and minima; 128 bytes of nibbles */
    case GGML_Q5_K:
        *tr = (GgmlTraits){256, 176};
        return 0; /* as Q4_K, and 32 bytes of fifth bits */
    case GGML_Q6_K:
        *tr = (GgmlTraits){256, 210};
        return 0; /* 128 bytes low nibbles, 64 high bits, 16 int8 scales, f16 d */
    default:
        return -1;
    }
}

/* names of the types real files hold, for the refusal message */
static const char *ggml_type_name(uint32_t type) {
    static const char *const names[] = {"F32",     "F16",    "Q4_0",    "Q4_1",  "Q4_2",   "Q4_3",  "Q5_0",  "Q5_1",
                                        "Q8_0",    "Q8_1",   "Q2_K",    "Q3_K",  "Q4_K",   "Q5_K",  "Q6_K",  "Q8_K",
                                        "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS",
                                        "I8",      "I16",    "I32",     "I64",   "F64",    "IQ1_M", "BF16"};
    return type < sizeof names / sizeof *names ? names[type] : "unknown";
}

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* ---------------- the byte cursor ---------------- */

typedef struct {
    const uint8_t *p;
    size_t n, pos;
    const char *what;
} Cur;

static int need(Cur *c, size_t k, const char *for_what) {
    if (k > c->n - c->pos)
        return pd_error("%s: truncated: %s needs %zu bytes at offset %zu, the file has %zu", c->what, for_what, k,
                        c->pos, c->n);
    return 0;
}

static int rd_u32(Cur *c, uint32_t *v, const char *for_what) {
    if (need(c, 4, for_what)) return -1;
    memcpy(v, c->p + c->pos, 4);
    c->pos += 4;
    return 0;
}

static int rd_u64(Cur *c, uint64_t *v, const char *for_what) {
    if (need(c, 8, for_what)) return -1;
    memcpy(v, c->p + c->pos, 8);
    c->pos += 8;
    return 0;
}

static int rd_str(Cur *c, GgufStr *s, const char *for_what) {
    uint64_t len;
    if (rd_u64(c, &len, for_what)) return -1;
    if (len > c->n - c->pos)
        return pd_error("%s: %s: a string of %llu bytes at offset %zu runs past the end of the file", c->what, for_what,
                        (unsigned long long)len, c->pos);
    s->s = (const char *)c->p + c->pos;
    s->len = (size_t)len;
    c->pos += (size_t)len;
    return 0;
}

/* ---------------- parsing ---------------- */

/* one value of `type` (for arrays: the whole array). With kv == NULL only checks and
   counts the strings (*n_strs); else fills kv, taking string slots from *strs. */
static int walk_value(Cur *c, GgufType type, const GgufStr *key, GgufKV *kv, GgufStr **strs, size_t *n_strs) {
    char ctx[96];
    snprintf(ctx, sizeof ctx, "key '%.*s'", (int)(key->len > 60 ? 60 : key->len), key->s);
    GgufType elem = type;
    uint64_t n = 1;
    if (type == GGUF_ARRAY) {
        uint32_t e;
        if (rd_u32(c, &e, ctx) || rd_u64(c, &n, ctx)) return -1;
        if (e >= GGUF_TYPE_COUNT) return pd_error("%s: %s: array of unknown type %u", c->what, ctx, e);
        if (e == GGUF_ARRAY) return pd_error("%s: %s: arrays of arrays are not supported", c->what, ctx);
        elem = (GgufType)e;
    } else if (type >= GGUF_TYPE_COUNT) return pd_error("%s: %s: unknown value type %u", c->what, ctx, (unsigned)type);
    if (kv) *kv = (GgufKV){.key = *key, .type = type, .elem = elem, .n = n, .data = c->p + c->pos};
    if (elem == GGUF_STRING) {
        /* each string needs 8 bytes of length: a lying n ends at the file's end */
        if (n > (c->n - c->pos) / 8)
            return pd_error("%s: %s: %llu strings cannot fit in the %zu bytes left", c->what, ctx,
                            (unsigned long long)n, c->n - c->pos);
        if (kv) {
            kv->strs = *strs;
            *strs += n;
        }
        for (uint64_t i = 0; i < n; i++)
            if (rd_str(c, kv ? &kv->strs[i] : &(GgufStr){0}, ctx)) return -1;
        if (n_strs) *n_strs += (size_t)n;
        return 0;
    }
    size_t bytes = pd_mul(TYPE_SIZE[elem], n);
    if (need(c, bytes, ctx)) return -1;
    c->pos += bytes;
    return 0;
}

static int walk_kvs(Cur *c, uint64_t n_kv, GgufKV *kv, GgufStr *strs, size_t *n_strs) {
    for (uint64_t i = 0; i < n_kv; i++) {
        GgufStr key;
        uint32_t type;
        if (rd_str(c, &key, "a key") || rd_u32(c, &type, "a value type")) return -1;
        if (walk_value(c, (GgufType)type, &key, kv ? &kv[i] : NULL, &strs, n_strs)) return -1;
    }
    return 0;
}

/* tensor infos; names are copied (NUL-terminated) only when t != NULL */
static int walk_tensors(Cur *c, uint64_t n_t, GgufTensor *t, uint64_t *offsets) {
    for (uint64_t i = 0; i < n_t; i++) {
        GgufStr name;
        uint32_t n_dims, type;
        uint64_t dims[4], off;
        if (rd_str(c, &name, "a tensor name")) return -1;
        if (name.len == 0 || name.len > GGUF_MAX_NAME || memchr(name.s, 0, name.len))
            return pd_error("%s: tensor %llu has an empty, overlong or binary name", c->what, (unsigned long long)i);
        if (rd_u32(c, &n_dims, "a tensor's dims")) return -1;
        if (n_dims < 1 || n_dims > 4)
            return pd_error("%s: tensor '%.*s' has %u dimensions (1 to 4 allowed)", c->what, (int)name.len, name.s,
                            n_dims);
        for (uint32_t d = 0; d < n_dims; d++)
            if (rd_u64(c, &dims[d], "a tensor's dims")) return -1;
        if (rd_u32(c, &type, "a tensor's type") || rd_u64(c, &off, "a tensor's offset")) return -1;
        if (!t) continue;
        GgufTensor *x = &t[i];
        if (!(x->name = pd_alloc(name.len + 1))) return -1;
        memcpy(x->name, name.s, name.len);
        x->n_dims = (int)n_dims;
        for (int d = 0; d < 4; d++) x->dims[d] = d < (int)n_dims ? (int64_t)dims[d] : 1;
        for (uint32_t d = 0; d < n_dims; d++)
            if (dims[d] > INT64_MAX) return pd_error("%s: tensor '%s': dimension too large", c->what, x->name);
        x->type = type;
        offsets[i] = off;
    }
    return 0;
}

static int cmp_str(const GgufStr *a, const GgufStr *b) {
    size_t n = a->len < b->len ? a->len : b->len;
    int r = memcmp(a->s, b->s, n);
    return r ? r : (a->len > b->len) - (a->len < b->len);
}
static int by_key(const void *a, const void *b) {
    return cmp_str(*(const GgufStr *const *)a, *(const GgufStr *const *)b);
}

/* duplicate names are refused (llama.cpp does too): sort pointers, compare neighbours */
static int check_unique(const char *what, GgufStr *names, int n, const char *kind) {
    if (n < 2) return 0;
    const GgufStr **p = pd_alloc(sizeof(*p) * n);
    if (!p) return -1;
    for (int i = 0; i < n; i++) p[i] = &names[i];
    qsort(p, n, sizeof *p, by_key);
    int rc = 0;
    for (int i = 1; i < n && !rc; i++)
        if (!cmp_str(p[i - 1], p[i]))
            rc = pd_error("%s: %s '%.*s' appears twice", what, kind, (int)(p[i]->len > 80 ? 80 : p[i]->len), p[i]->s);
    free(p);
    return rc;
}

/* sizes, types, alignment and bounds of every tensor's data */
static int place_tensors(Gguf *g, const Cur *c, const uint64_t *offsets, size_t data_start, uint64_t align) {
    for (int i = 0; i < g->n_tensors; i++) {
        GgufTensor *t = &g->t[i];
        GgmlTraits tr;
        if (ggml_traits(t->type, &tr))
            return pd_error("%s: tensor '%s' has ggml type %u (%s); paradec reads F32, F16, BF16, Q8_0, Q4_0, Q4_1, "
                            "Q5_0, Q4_K, Q5_K and Q6_K",
                            c->what, t->name, t->type, ggml_type_name(t->type));
        size_t ne = 1;
        for (int d = 0; d < 4; d++) ne = pd_mul(ne, (size_t)t->dims[d]);
        if (ne == SIZE_MAX) return pd_error("%s: tensor '%s': element count overflows", c->what, t->name);
        if (t->dims[0] % tr.block)
            return pd_error("%s: tensor '%s': row length %lld is not a multiple of its type's block of %d", c->what,
                            t->name, (long long)t->dims[0], tr.block);
        t->nbytes = pd_mul(ne / tr.block, tr.bytes);
        if (t->nbytes == SIZE_MAX) return pd_error("%s: tensor '%s': size overflows", c->what, t->name);
        if (offsets[i] % align)
            return pd_error("%s: tensor '%s': offset %llu is not a multiple of the alignment %llu", c->what, t->name,
                            (unsigned long long)offsets[i], (unsigned long long)align);
        size_t room = c->n - data_start;
        if (offsets[i] > room || t->nbytes > room - offsets[i])
            return pd_error("%s: truncated: tensor '%s' (%zu bytes at data offset %llu) ends past the file's end "
                            "(%zu bytes of data)",
                            c->what, t->name, t->nbytes, (unsigned long long)offsets[i], room);
        t->data = c->p + data_start + offsets[i];
    }
    return 0;
}

static int parse(Gguf *g, Cur *c) {
    char magic[4];
    uint32_t version;
    uint64_t n_t, n_kv;
    if (need(c, 4, "the magic")) return -1;
    memcpy(magic, c->p, 4);
    c->pos = 4;
    if (memcmp(magic, GGUF_MAGIC, 4)) return pd_error("%s: not a GGUF file (no 'GGUF' magic)", c->what);
    if (rd_u32(c, &version, "the version")) return -1;
    if (version >= 0x10000 && (version & 0xffff) == 0)
        return pd_error("%s: a big-endian GGUF file; paradec reads little-endian ones", c->what);
    if (version != 2 && version != 3)
        return pd_error("%s: GGUF version %u is not supported (2 and 3 are)", c->what, version);
    g->version = version;
    if (rd_u64(c, &n_t, "the tensor count") || rd_u64(c, &n_kv, "the key count")) return -1;
    /* a key/value is at least 13 bytes, a tensor info 28: counts the file cannot hold
       are refused before the walk */
    if (n_kv > (c->n - c->pos) / 13 || n_t > (c->n - c->pos) / 28)
        return pd_error("%s: the header claims %llu keys and %llu tensors, more than the file can hold", c->what,
                        (unsigned long long)n_kv, (unsigned long long)n_t);
    size_t start = c->pos, n_strs = 0;
    if (walk_kvs(c, n_kv, NULL, NULL, &n_strs) || walk_tensors(c, n_t, NULL, NULL)) return -1;
    if (n_kv > INT32_MAX || n_t > INT32_MAX) return pd_error("%s: too many keys or tensors", c->what);
    /* everything the counts promise is there: allocate and walk again, filling */
    g->n_kv = (int)n_kv;
    g->n_tensors = (int)n_t;
    g->kv = pd_alloc(sizeof(GgufKV) * (n_kv + 1));
    GgufStr *strs = pd_alloc(sizeof(GgufStr) * (n_strs + 1));
    g->t = pd_alloc(sizeof(GgufTensor) * (n_t + 1));
    uint64_t *offsets = pd_alloc(sizeof(uint64_t) * (n_t + 1));
    if (!g->kv || !strs || !g->t || !offsets) {
        free(strs);
        free(offsets);
        return -1;
    }
    g->strs = strs;
    c->pos = start;
    int rc = walk_kvs(c, n_kv, g->kv, strs, NULL) || walk_tensors(c, n_t, g->t, offsets) ? -1 : 0;
    GgufStr *names = rc ? NULL : pd_alloc(sizeof(GgufStr) * (n_t + 1));
    if (!rc && !names) rc = -1;
    for (int i = 0; !rc && i < g->n_tensors; i++) names[i] = (GgufStr){g->t[i].name, strlen(g->t[i].name)};
    GgufStr *keys = rc ? NULL : pd_alloc(sizeof(GgufStr) * (n_kv + 1));
    if (!rc && !keys) rc = -1;
    for (int i = 0; !rc && i < g->n_kv; i++) keys[i] = g->kv[i].key;
    rc = rc ? rc : check_unique(c->what, keys, g->n_kv, "key");
    rc = rc ? rc : check_unique(c->what, names, g->n_tensors, "tensor");
    free(names);
    free(keys);
    uint64_t align = GGUF_DEFAULT_ALIGNMENT;
    const GgufKV *a = rc ? NULL : gguf_find(g, "general.alignment");
    if (a) {
        uint32_t v = 0;
        if (a->type != GGUF_U32) rc = pd_error("%s: general.alignment is not a u32", c->what);
        else memcpy(&v, a->data, 4);
        if (!rc && (v == 0 || (v & (v - 1))))
            rc = pd_error("%s: general.alignment %u is not a power of two", c->what, v);
        align = v;
    }
    if (!rc) {
        /* the data section starts at the next multiple of the alignment; a file with
           no tensors may end before it (llama.cpp's vocab-only files do) */
        size_t data_start = (c->pos + align - 1) / align * align;
        if (g->n_tensors && (data_start < c->pos || data_start > c->n))
            rc = pd_error("%s: truncated: the data section would start at %zu, the file has %zu bytes", c->what,
                          data_start, c->n);
        rc = rc ? rc : place_tensors(g, c, offsets, data_start, align);
    }
    free(offsets);
    return rc;
}

int gguf_parse(Gguf *g, const void *bytes, size_t n, const char *what) {
    memset(g, 0, sizeof *g);
    if (!(g->path = pd_strdup(what))) return -1;
    Cur c = {bytes, n, 0, g->path};
    if (parse(g, &c)) {
        gguf_close(g);
        return -1;
    }
    return 0;
}

int gguf_open(Gguf *g, const char *path) {
    void *map;
    size_t len;
    int mapped = 0;
    if (!strcmp(path, "-")) {
        char *buf;
        if (pd_read_file(path, &buf, &len)) return -1;
        map = buf;
    } else {
        int fd = open(path, O_RDONLY);
        if (fd < 0) return pd_error("%s: %s", path, strerror(errno));
        struct stat st;
        if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
            close(fd);
            return pd_error("%s: not a regular file", path);
        }
        len = (size_t)st.st_size;
        if (len == 0) {
            close(fd);
            return pd_error("%s: empty file", path);
        }
        map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        close(fd);
        if (map == MAP_FAILED) return pd_error("%s: cannot map: %s", path, strerror(errno));
        mapped = 1;
    }
    if (gguf_parse(g, map, len, path)) {
        if (mapped) munmap(map, len);
        else free(map);
        return -1;
    }
    g->map = map;
    g->map_len = len;
    g->mapped = mapped;
    return 0;
}

void gguf_close(Gguf *g) {
    for (int i = 0; g->t && i < g->n_tensors; i++) free(g->t[i].name);
    free(g->t);
    free(g->kv);
    free(g->strs);
    free(g->path);
    if (g->map) {
        if (g->mapped) munmap(g->map, g->map_len);
        else free(g->map);
    }
    memset(g, 0, sizeof *g);
}

/* ---------------- lookups ---------------- */

const GgufKV *gguf_find(const Gguf *g, const char *key) {
    size_t n = strlen(key);
    for (int i = 0; i < g->n_kv; i++)
        if (g->kv[i].key.len == n && !memcmp(g->kv[i].key.s, key, n)) return &g->kv[i];
    return NULL;
}

static const GgufKV *scalar(const Gguf *g, const char *key) {
    const GgufKV *kv = gguf_find(g, key);
    if (!kv) pd_error("%s: key '%s' is missing", g->path, key);
    else if (kv->type == GGUF_ARRAY) {
        pd_error("%s: key '%s' is an array, not a single value", g->path, key);
        kv = NULL;
    }
    return kv;
}

int gguf_get_int(const Gguf *g, const char *key, int64_t *out) {
    const GgufKV *kv = scalar(g, key);
    if (!kv) return -1;
    const void *p = kv->data;
    switch (kv->type) {
    case GGUF_U8:
        *out = *(const uint8_t *)p;
        return 0;
    case GGUF_I8:
        *out = *(const int8_t *)p;
        return 0;
    case GGUF_U16: {
        uint16_t v;
        memcpy(&v, p, 2);
        *out = v;
        return 0;
    }
    case GGUF_I16: {
        int16_t v;
        memcpy(&v, p, 2);
        *out = v;
        return 0;
    }
    case GGUF_U32: {
        uint32_t v;
        memcpy(&v, p, 4);
        *out = v;
        return 0;
    }
    case GGUF_I32: {
        int32_t v;
        memcpy(&v, p, 4);
        *out = v;
        return 0;
    }
    case GGUF_I64: {
        int64_t v;
        memcpy(&v, p, 8);
        *out = v;
        return 0;
    }
    case GGUF_U64: {
        uint64_t v;
        memcpy(&v, p, 8);
        if (v > INT64_MAX) return pd_error("%s: key '%s' = %llu is too large", g->path, key, (unsigned long long)v);
        *out = (int64_t)v;
        return 0;
    }
    default:
        return pd_error("%s: key '%s' is not an integer", g->path, key);
    }
}

int gguf_get_f32(const Gguf *g, const char *key, float *out) {
    const GgufKV *kv = scalar(g, key);
    if (!kv) return -1;
    if (kv->type == GGUF_F32) memcpy(out, kv->data, 4);
    else if (kv->type == GGUF_F64) {
        double d;
        memcpy(&d, kv->data, 8);
        *out = (float)d;
    } else return pd_error("%s: key '%s' is not a float", g->path, key);
    return 0;
}

int gguf_get_bool(const Gguf *g, const char *key, int *out) {
    const GgufKV *kv = scalar(g, key);
    if (!kv) return -1;
    if (kv->type != GGUF_BOOL) return pd_error("%s: key '%s' is not a bool", g->path, key);
    *out = *(const uint8_t *)kv->data != 0;
    return 0;
}

int gguf_get_str(const Gguf *g, const char *key, GgufStr *out) {
    const GgufKV *kv = scalar(g, key);
    if (!kv) return -1;
    if (kv->type != GGUF_STRING) return pd_error("%s: key '%s' is not a string", g->path, key);
    *out = kv->strs[0];
    return 0;
}

const GgufTensor *gguf_tensor(const Gguf *g, const char *name) {
    for (int i = 0; i < g->n_tensors; i++)
        if (!strcmp(g->t[i].name, name)) return &g->t[i];
    return NULL;
}

/* ---------------- tensor data ---------------- */

int gguf_block_dtype(uint32_t type) {
    switch (type) {
    case GGML_Q8_0:
        return DT_Q8_0;
    case GGML_Q4_0:
        return DT_Q4_0;
    case GGML_Q4_1:
        return DT_Q4_1;
    case GGML_Q5_0:
        return DT_Q5_0;
    case GGML_Q4_K:
        return DT_Q4_K;
    case GGML_Q5_K:
        return DT_Q5_K;
    case GGML_Q6_K:
        return DT_Q6_K;
    default:
        return -1;
    }
}

int gguf_tensor_f32(const Gguf *g, const GgufTensor *t, float *out) {
    GgmlTraits tr;
    if (ggml_traits(t->type, &tr))
        return pd_error("%s: tensor '%s': type %u cannot be read", g->path, t->name, t->type);
    size_t blocks = t->nbytes / tr.bytes;
    const uint8_t *p = t->data;
    switch (t->type) {
    case GGML_F32:
        memcpy(out, p, t->nbytes);
        break;
    case GGML_F16:
        for (size_t i = 0; i < blocks; i++) out[i] = fp16_to_f32(rd16(p + 2 * i));
        break;
    case GGML_BF16:
        for (size_t i = 0; i < blocks; i++) out[i] = bf16_to_f32(rd16(p + 2 * i));
        break;
    default: /* rows are whole blocks (place_tensors), so the tensor is one long row */
        dequant_row((DType)gguf_block_dtype(t->type), out, p, (int64_t)(blocks * (size_t)tr.block));
    }
    return 0;
}

float gguf_f16_to_f32(uint16_t h) { return fp16_to_f32(h); }

/* ---------------- a vocabulary-only GGUF ---------------- */

typedef struct {
    unsigned char *p;
    size_t n, cap;
} Buf;

static int put(Buf *b, const void *src, size_t n) {
    if (n > b->cap - b->n) {
        size_t cap = b->cap ? b->cap : 4096;
        while (n > cap - b->n) cap = pd_mul(cap, 2);
        unsigned char *p = pd_realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
    return 0;
}
static int put_u32(Buf *b, uint32_t v) { return put(b, &v, 4); }
static int put_u64(Buf *b, uint64_t v) { return put(b, &v, 8); }
static int put_str(Buf *b, const GgufStr *s) { return put_u64(b, s->len) || put(b, s->s, s->len); }

static int is_vocab_key(const GgufStr *k) {
    static const char arch[] = "general.architecture", tok[] = "tokenizer.";
    return (k->len == sizeof arch - 1 && !memcmp(k->s, arch, k->len)) ||
           (k->len >= sizeof tok - 1 && !memcmp(k->s, tok, sizeof tok - 1));
}

static int put_kv(Buf *b, const GgufKV *kv) {
    if (put_str(b, &kv->key) || put_u32(b, kv->type)) return -1;
    if (kv->type == GGUF_ARRAY && (put_u32(b, kv->elem) || put_u64(b, kv->n))) return -1;
    if (kv->elem == GGUF_STRING) {
        for (uint64_t i = 0; i < kv->n; i++)
            if (put_str(b, &kv->strs[i])) return -1;
        return 0;
    }
    return put(b, kv->data, TYPE_SIZE[kv->elem] * kv->n);
}

int gguf_write_vocab(const Gguf *g, unsigned char **out, size_t *n) {
    Buf b = {0};
    uint64_t n_kv = 0;
    for (int i = 0; i < g->n_kv; i++) n_kv += is_vocab_key(&g->kv[i].key);
    int rc = put(&b, GGUF_MAGIC, 4) || put_u32(&b, 3) || put_u64(&b, 0) || put_u64(&b, n_kv);
    for (int i = 0; i < g->n_kv && !rc; i++)
        if (is_vocab_key(&g->kv[i].key)) rc = put_kv(&b, &g->kv[i]);
    if (rc) {
        free(b.p);
        return -1;
    }
    *out = b.p;
    *n = b.n;
    return 0;
}
