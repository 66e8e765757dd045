/* tool.h — what every tool's main shares: fail with one line, strict numbers. */
#ifndef PD_TOOL_H
#define PD_TOOL_H
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "import/model_open.h"
#include "model/kvcache.h"
#include "model/linear.h"
#include "model/model.h"

static const char *tool_name = "paradec";

/* "tool: message" and exit 1 */
__attribute__((noreturn, format(printf, 1, 2))) static inline void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", tool_name);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

/* libcore's last message */
__attribute__((noreturn)) static inline void die_lib(void) { die("%s", pd_errmsg()); }

/* a required argument is missing: one line naming it, exit 1 (the usage is --help's) */
__attribute__((noreturn)) static inline void usage(const char *missing) {
    die("%s is required (%s --help lists the flags)", missing, tool_name);
}

#ifndef PD_VERSION
#define PD_VERSION "unknown"
#endif
#ifndef PD_COMMIT
#define PD_COMMIT "unknown"
#endif
/* --version: the release, the commit it was built from, the backends compiled in and
   the CPU features the kernels were built for */
__attribute__((noreturn)) static inline void version_exit(void) {
    printf("%s (paradec) %s, commit %s\nbackends: %s\ncpu features: %s\n", tool_name, PD_VERSION, PD_COMMIT,
           model_backends(), model_cpu_features());
    exit(0);
}

static inline long arg_int(const char *flag, const char *s, long lo, long hi) {
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || errno || end == s || *end || v < lo || v > hi)
        die("%s: '%s' is not a whole number in [%ld, %ld]", flag, s ? s : "", lo, hi);
    return v;
}

static inline double arg_num(const char *flag, const char *s, double lo, double hi) {
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || errno || end == s || *end || !(v >= lo && v <= hi))
        die("%s: '%s' is not a number in [%g, %g]", flag, s ? s : "", lo, hi);
    return v;
}

/* training facts as key/value pairs for the head writers (heads_save, medusa_save) */
typedef struct {
    char key[256][48], val[256][160];
    const char *kv[512];
    int n;
} Meta;

__attribute__((format(printf, 3, 4))) static inline void meta_add(Meta *m, const char *key, const char *fmt, ...) {
    if (m->n == 256) return;
    va_list ap;
    va_start(ap, fmt);
    snprintf(m->key[m->n], sizeof m->key[0], "%s", key);
    vsnprintf(m->val[m->n], sizeof m->val[0], fmt, ap);
    va_end(ap);
    m->kv[2 * m->n] = m->key[m->n];
    m->kv[2 * m->n + 1] = m->val[m->n];
    m->n++;
}

/* a string that grows (tables, make rules) */
typedef struct {
    char *s;
    size_t n, cap;
} Str;

__attribute__((format(printf, 2, 3))) static inline void put(Str *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0) die("cannot format text");
    while (b->n + k + 1 > b->cap)
        if (!(b->s = realloc(b->s, b->cap = b->cap ? 2 * b->cap : 8192))) die("out of memory");
    va_start(ap, fmt);
    vsnprintf(b->s + b->n, k + 1, fmt, ap);
    va_end(ap);
    b->n += k;
}

/* what holding a model costs, said alike by every tool that decodes */
#define MEMORY_MODEL                                                                                                   \
    "the model's weights once: the packed copy the matrix products read (f32, bf16, and the\n"                         \
    "        block types in AVX2 builds; a mapped file's pages are given back once packed; a .zst\n"                   \
    "        or stdin is held decompressed beside it); a GGUF file or Hugging Face directory is\n"                     \
    "        imported into /dev/shm first (block types kept, floats as f32; what is packed cut out)\n"                 \
    "        + RoPE tables of ctx × head_dim × 4 bytes (ctx: the model's context)"
#define MEMORY_KV(n)                                                                                                   \
    n " × ctx × layers × kv_dim × 8 bytes of KV cache (K and V in f32; --kv-type bf16: kv_dim × 4,\n"             \
      "        q8_0: (kv_dim + 4 × kv heads) × 2; its pages are touched only as far as the sequences grow)"

/* --kv-type: the flag every tool that makes a KV cache takes, and its value checked
   before anything loads */
#define KV_TYPE_FLAG(p)                                                                                                \
    {                                                                                                                  \
        "--kv-type", "TYPE", "f32",                                                                                    \
            "the KV cache's elements: f32, bf16 (rounded to nearest even) or q8_0 (int8, a scale per token and kv "    \
            "head)",                                                                                                   \
            F_STR(p)                                                                                                   \
    }
static inline KVType kv_type_arg(const char *name) {
    int t = kv_type_parse(name ? name : "f32");
    if (t < 0) die("--kv-type: '%s' is not a KV cache type (f32, bf16 or q8_0)", name);
    return (KVType)t;
}

/* -d, --device: where the forward pass runs (model_device) */
#define DEVICE_FLAG(p)                                                                                                 \
    {                                                                                                                  \
        "-d, --device", "KIND", "cpu",                                                                                 \
            "where the forward pass runs: cpu, cuda (the GPU, in a build made with CUDA=1), or cuemu (the CUDA "       \
            "kernels emulated on the CPU, bit for bit the GPU's; slow: for tests)",                                    \
            F_STR(p)                                                                                                   \
    }
static inline void device_arg(const char *kind) {
    if (kind && model_device(kind)) die("--device: %s", pd_errmsg());
}

/* ---- flags: each tool lists its flags in one table, which flags_parse reads argv with
   and --help prints, one line a flag with its default, so every tool parses alike ---- */
typedef struct {
    const char *v[64];
    int n;
} StrList; /* a flag that may be given several times (--stop) */

typedef struct {
    const char *names; /* every spelling, comma-separated: "-m, --model" */
    const char *value; /* the value's name for --help ("FILE"); NULL: a switch */
    const char *dflt;  /* what holds without the flag, as --help says it; "required"; NULL:
                          "off" for a switch, "none" otherwise */
    const char *help;  /* one line */
    char type;         /* s text, l repeatable text, i int, L long, I long long, d double, f float, b switch */
    void *dst;
    double lo, hi; /* a number's range */
    int seen;      /* times given */
    char as[32];   /* the spelling last given, for messages */
} Flag;

#define F_STR(p)                                                                                                       \
    's', (p), 0, 0, 0, { 0 }
#define F_LIST(p)                                                                                                      \
    'l', (p), 0, 0, 0, { 0 }
#define F_INT(p, lo, hi)                                                                                               \
    'i', (p), (lo), (hi), 0, { 0 }
#define F_LONG(p, lo, hi)                                                                                              \
    'L', (p), (lo), (hi), 0, { 0 }
#define F_I64(p, lo, hi)                                                                                               \
    'I', (p), (lo), (hi), 0, { 0 }
#define F_NUM(p, lo, hi)                                                                                               \
    'd', (p), (lo), (hi), 0, { 0 }
#define F_FLOAT(p, lo, hi)                                                                                             \
    'f', (p), (lo), (hi), 0, { 0 }
#define F_SWITCH(p)                                                                                                    \
    'b', (p), 0, 0, 0, { 0 }
#define N_FLAGS(t) (int)(sizeof(t) / sizeof(t)[0])

/* flags every tool that loads a model takes beside -m: such a tool lists MODEL_FLAGS in
   its table, so a loading option added here (one table row ending in a comma) reaches
   all of them; tool_model_load is where such an option takes effect */
static int tool_no_verify;
#define MODEL_FLAGS                                                                                                    \
    {"--no-verify", NULL, NULL, "skip checking the weights against their recorded digests", F_SWITCH(&tool_no_verify)},

/* -m: a paradec model file, a GGUF file or a Hugging Face directory (imported in memory,
   with a note that converting once is faster) */
static inline void tool_model_load(Model *m, const char *path) {
    int kind = model_source(path);
    if (kind < 0) die_lib();
    if (kind == MODEL_SRC_FILE) {
        if (model_load(m, path)) die_lib();
        return;
    }
    Checkpoint ck;
    if (model_import(&ck, path, kind)) die_lib();
    {
        size_t n = strlen(path);
        while (n > 1 && path[n - 1] == '/') n--;
        if (kind == MODEL_SRC_GGUF && n > 5 && !strncmp(path + n - 5, ".gguf", 5)) n -= 5;
        fprintf(stderr, "%s: importing %s in memory (bin/convert %s -o %.*s.safetensors once loads faster)\n",
                tool_name, path, path, (int)n, path);
    }
    if (model_load_imported(m, &ck, path)) die_lib();
}

/* does `names` (comma-separated spellings) hold arg[0..len)? */
static inline int flag_named(const char *names, const char *arg, size_t len) {
    for (const char *s = names; *s;) {
        size_t k = strcspn(s, ",");
        if (k == len && !memcmp(s, arg, len)) return 1;
        s += k;
        while (*s == ',' || *s == ' ') s++;
    }
    return 0;
}

/* the table's flag with this spelling when it was given, else NULL */
static inline const Flag *flag_given(const Flag *t, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (t[i].seen && flag_named(t[i].names, name, strlen(name))) return &t[i];
    return NULL;
}

__attribute__((noreturn)) static inline void flags_help(const Flag *t, int n, const char *usage_text,
                                                        const char *notes) {
    printf("usage: %s %s\n\n", tool_name, usage_text);
    for (int i = 0; i < n; i++) {
        char left[96];
        snprintf(left, sizeof left, "%s%s%s", t[i].names, t[i].value ? " " : "", t[i].value ? t[i].value : "");
        const char *d = t[i].dflt ? t[i].dflt : t[i].type == 'b' ? "off" : "none";
        printf("  %-32s %s (%s%s)\n", left, t[i].help, strncmp(d, "required", 8) ? "default: " : "", d);
    }
    printf("  %-32s %s\n  %-32s %s\n", "-h, --help", "this list", "--version",
           "the version, the commit, the backends compiled in and the CPU features used");
    if (notes && *notes) printf("\n%s", notes);
    exit(0);
}

/* argv against the table: flags set their destinations, "--name=value" as "--name value";
   -h/--help and --version answer and exit; the other arguments ("-" too) go to pos, at
   most max_pos of them. Anything wrong ends the tool with one line naming the argument.
   Returns how many positional arguments there were. */
static inline int flags_parse(Flag *t, int n, int argc, char **argv, const char **pos, int max_pos,
                              const char *usage_text, const char *notes) {
    int np = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) flags_help(t, n, usage_text, notes);
        if (!strcmp(a, "--version")) version_exit();
        if (a[0] != '-' || !a[1]) {
            if (np == max_pos) die("%s: unexpected argument (%s --help lists the flags)", a, tool_name);
            pos[np++] = a;
            continue;
        }
        const char *eq = a[1] == '-' ? strchr(a, '=') : NULL;
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        Flag *f = NULL;
        for (int k = 0; k < n && !f; k++)
            if (flag_named(t[k].names, a, len)) f = &t[k];
        if (!f) die("%.*s: unknown flag (%s --help lists the flags)", (int)(len < 64 ? len : 64), a, tool_name);
        snprintf(f->as, sizeof f->as, "%.*s", (int)len, a);
        f->seen++;
        if (f->type == 'b') {
            if (eq) die("%s: takes no value", f->as);
            *(int *)f->dst = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!v) die("%s: needs a value (%s)", f->as, f->value ? f->value : "");
        double hi = f->hi > 9e18 ? 9e18 : f->hi; /* a long's range */
        switch (f->type) {
        case 's':
            *(const char **)f->dst = v;
            break;
        case 'l': {
            StrList *l = f->dst;
            if (l->n == (int)(sizeof l->v / sizeof l->v[0])) die("%s: given more than %d times", f->as, l->n);
            l->v[l->n++] = v;
            break;
        }
        case 'i':
            *(int *)f->dst = (int)arg_int(f->as, v, (long)f->lo, (long)hi);
            break;
        case 'L':
            *(long *)f->dst = arg_int(f->as, v, (long)f->lo, f->hi > 9e18 ? 0x7fffffffffffffffL : (long)hi);
            break;
        case 'I':
            *(long long *)f->dst = arg_int(f->as, v, (long)f->lo, f->hi > 9e18 ? 0x7fffffffffffffffL : (long)hi);
            break;
        case 'd':
            *(double *)f->dst = arg_num(f->as, v, f->lo, f->hi);
            break;
        case 'f':
            *(float *)f->dst = (float)arg_num(f->as, v, f->lo, f->hi);
            break;
        default:
            die("%s: flag of unknown type '%c'", f->as, f->type);
        }
    }
    pd_verify_weights = !tool_no_verify;
    return np;
}

/* a figure rounded to what it means: `digits` significant digits, or `decimals` places */
static inline double round_sig(double v, int digits) {
    char b[64];
    snprintf(b, sizeof b, "%.*e", digits - 1, v);
    return strtod(b, NULL);
}
static inline double round_dec(double v, int decimals) {
    char b[64];
    snprintf(b, sizeof b, "%.*f", decimals, v);
    return strtod(b, NULL);
}
#endif
