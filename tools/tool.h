/* tool.h — what every tool's main shares: fail with one line, strict numbers. */
#ifndef PD_TOOL_H
#define PD_TOOL_H
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

__attribute__((noreturn)) static inline void usage(const char *text) {
    fprintf(stderr, "usage: %s %s\n", tool_name, text);
    exit(2);
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

/* the value after a flag, or a usage error */
static inline const char *arg_next(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) die("%s needs a value", argv[*i]);
    return argv[++*i];
}
#endif
