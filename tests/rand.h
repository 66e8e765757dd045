/* rand.h — the tests' random numbers: splitmix64 from test_rng (a test sets its seed) */
#ifndef PD_TEST_RAND_H
#define PD_TEST_RAND_H
#include <stdint.h>

static uint64_t test_rng;
static inline uint32_t next32(void) {
    uint64_t z = (test_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull, z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (uint32_t)((z ^ (z >> 31)) >> 32);
}
static inline int urand(int n) { return (int)(next32() % (uint32_t)n); }
static inline float frand(float lo, float hi) { return lo + (hi - lo) * (float)(next32() >> 8) / (1 << 24); }

#endif
