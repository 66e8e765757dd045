/* fixture.h — what the model tests share: the test model ($MODEL, else the default
   model `make` converts), data files that may be absent (test_data), and half-precision
   conversions written the test's own way (independent of libcore's). Include after
   check.h. */
#ifndef PD_FIXTURE_H
#define PD_FIXTURE_H
#include <errno.h> /* program_invocation_short_name */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "model/model.h"

static inline const char *test_model_path(void) {
    const char *path = getenv("MODEL");
    return path && *path ? path : "build/stories260K.safetensors.zst";
}

/* loads the test model; on failure says why and counts one failed check */
static inline int test_model_load(Model *m) {
    if (model_load(m, test_model_path()) == 0) return 0;
    fprintf(stderr, "%s\n", pd_errmsg());
    CHECK(0, "model");
    return -1;
}

/* the path of data file `rel` (pd_data_path's order), or NULL after one line "SKIP
   test_x: what: needs rel ..." that run.sh passes on: in a clone without the shared
   data the parts that need it skip, and say so. A file found but unreadable is the
   caller's failure, not a skip. */
static inline const char *test_data(const char *what, const char *rel) {
    static char path[8][4096];
    static int k;
    char *p = path[k++ % 8];
    if (pd_data_path(rel, p, sizeof path[0]) == 0) return p;
    printf("SKIP %s: %s: needs %s (not under $PARADEC_DATA, data/ or ../shared/data)\n", program_invocation_short_name,
           what, rel);
    return NULL;
}

/* a half's value by the definition, with ldexp */
static inline float half_value(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (float)(s ? -v : v);
}

/* the nearest finite half (ties to even), by binary search over the halves' values */
static inline uint16_t to_half(float f) {
    uint16_t sign = f < 0 ? 0x8000 : 0, lo = 0, hi = 0x7bff;
    float a = fabsf(f);
    while (lo < hi) { /* smallest h with value >= a */
        uint16_t mid = (uint16_t)((lo + hi) / 2);
        if (half_value(mid) < a) lo = (uint16_t)(mid + 1);
        else hi = mid;
    }
    if (lo > 0) {
        float below = a - half_value((uint16_t)(lo - 1)), above = half_value(lo) - a;
        if (below < above || (below == above && !((lo - 1) & 1))) lo--;
    }
    return (uint16_t)(sign | lo);
}

static inline uint16_t to_bf16(float f) { /* round to nearest even (finite inputs) */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static inline float bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
#endif
