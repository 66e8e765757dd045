/* tool.h — what every tool's main shares: fail with one line, strict numbers. */
#ifndef PD_TOOL_H
#define PD_TOOL_H
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "util.h"

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
           k_backends(), k_cpu_features());
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

/* --help: the usage, then the tool's own notes (its memory footprint at least), on stdout */
__attribute__((noreturn)) static inline void help_exit(const char *usage_text, const char *notes) {
    printf("usage: %s %s\n\n%s", tool_name, usage_text, notes);
    exit(0);
}

/* what holding a model costs, said alike by every tool that decodes */
#define MEMORY_MODEL "the model's weights twice (its file, mapped, or decompressed when it is .zst,\n" \
                     "        and the packed copy the matrix products read) + RoPE tables of ctx × head_dim × 4\n" \
                     "        bytes (ctx: the model's context)"
#define MEMORY_KV(n) n " × ctx × layers × kv_dim × 8 bytes of KV cache (K and V in f32; its pages are\n" \
                     "        touched only as far as the sequences grow)"

/* the value after a flag, or a usage error */
static inline const char *arg_next(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) die("%s needs a value", argv[*i]);
    return argv[++*i];
}
#endif
