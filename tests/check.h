/* check.h — the tiny test harness: CHECK counts, check_done prints "N passed, N failed". */
#ifndef PD_CHECK_H
#define PD_CHECK_H
#include <stdio.h>

static int check_passed, check_failed;

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        if (cond) {                                                                                                    \
            check_passed++;                                                                                            \
        } else {                                                                                                       \
            check_failed++;                                                                                            \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                                            \
            fprintf(stderr, " " __VA_ARGS__);                                                                          \
            fprintf(stderr, "\n");                                                                                     \
        }                                                                                                              \
    } while (0)

static inline int check_done(const char *name) {
    printf("%s: %d passed, %d failed\n", name, check_passed, check_failed);
    return check_failed != 0;
}
#endif
