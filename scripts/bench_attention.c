/* bench_attention.c — the attention kernel alone at SmolLM2-135M's shapes (9 query heads,
   3 kv heads, head size 64, blocks of 16 slots): one token after P positions, each call
   on the next of 30 layers' caches (so the keys come from memory, as in a forward pass).
   Prints the median milliseconds per call over 30 layers × reps. bench_flashdecoding.sh
   builds it twice, split (ATT_SPLIT 256) and unsplit (-DATT_SPLIT=65536).
   usage: bench_attention POSITIONS THREADS [REPS] */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* clock_gettime */
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"

enum { NH = 9, NKV = 3, HD = 64, BS = 16, LAYERS = 30 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 3) return fprintf(stderr, "usage: bench_attention POSITIONS THREADS [REPS]\n"), 2;
    int P = atoi(argv[1]), reps = argc > 3 ? atoi(argv[3]) : 20;
    if (P < 1 || reps < 1 || k_init(atoi(argv[2]))) return fprintf(stderr, "bench_attention: bad arguments\n"), 2;
    int kvd = NKV * HD, nblk = (P + BS) / BS;
    size_t layer = (size_t)nblk * kvd * BS;
    float *K = malloc(sizeof(float) * layer * LAYERS), *V = malloc(sizeof(float) * layer * LAYERS);
    int *table = malloc(sizeof(int) * nblk);
    if (!K || !V || !table) return fprintf(stderr, "bench_attention: out of memory\n"), 1;
    unsigned r = 1;
    for (size_t i = 0; i < layer * LAYERS; i++) {
        r = r * 1103515245u + 12345u;
        K[i] = (float)(r >> 9) / (1 << 23) - 1, V[i] = (float)(r >> 10) / (1 << 22) - 1;
    }
    for (int b = 0; b < nblk; b++) table[b] = b;
    float q[NH * HD], out[NH * HD], *split = malloc(sizeof(float) * NH * attn_chunks(P + 1) * (HD + 2));
    for (int i = 0; i < NH * HD; i++) q[i] = (float)(i % 7) / 7 - 0.5f;
    const int *tables[1] = {table};
    int n_ctx[1] = {P}, off[2] = {0, 1}, extra[1] = {P}; /* P committed slots, then itself */
    double *t = malloc(sizeof(double) * reps * LAYERS);
    for (int i = -LAYERS; i < reps * LAYERS; i++) { /* a first pass over the layers unmeasured */
        int l = (i + LAYERS) % LAYERS;
        AttnArgs a = {.n = 1,
                      .n_heads = NH,
                      .n_kv = NKV,
                      .hd = HD,
                      .scale = 0.125f,
                      .q = q,
                      .q_stride = NH * HD,
                      .out = out,
                      .k = K + layer * l,
                      .v = V + layer * l,
                      .block_stride = (size_t)kvd * BS,
                      .block_size = BS,
                      .table = tables,
                      .n_ctx = n_ctx,
                      .extra_off = off,
                      .extra = extra,
                      .kv_type = KV_F32,
                      .split = split,
                      .max_chunks = attn_chunks(P + 1),
                      .split_tokens = 1};
        double t0 = now();
        k_attention(&a);
        if (i >= 0) t[i] = now() - t0;
    }
    qsort(t, (size_t)reps * LAYERS, sizeof *t, cmp);
    printf("%.4f\n", 1e3 * t[reps * LAYERS / 2]);
    return 0;
}
