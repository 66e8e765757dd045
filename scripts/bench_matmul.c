/* bench_matmul — f32, bf16, Q8_0 or Q4_1 weights streamed from memory: 100 matrices of
   SmolLM2's gate shape (1536 × 576; 354 MB in f32, 177 MB in bf16, 55 MB in Q4_1), each
   multiplied by n tokens once a round, so that every call reads its weights from DRAM as
   a decode step does (a benchmark, never a test). Build and run:
     cc -std=c11 -O2 -march=native -Ilibcore -Ikernels scripts/bench_matmul.c build/libcore.a \
        -o /tmp/bench_matmul -lzstd -ljansson -lyaml -lxxhash -lpcre2-8 -lz -lpthread -lm -lstdc++
     /tmp/bench_matmul f32|bf16|q8_0|q4_1 [threads]
   Prints, per n, the least time of a round over 7 rounds (the n interleaved), its ratio to
   one token's and the weight bytes read per second. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "quant.h"

#define MATRICES 100
#define ROUNDS 7

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const char *name = argc > 1 ? argv[1] : "f32";
    WType wt = !strcmp(name, "bf16")   ? WT_BF16
               : !strcmp(name, "q8_0") ? WT_Q8_0
               : !strcmp(name, "q4_1") ? WT_Q4_1
                                       : WT_F32;
    if (wt == WT_F32 && strcmp(name, "f32"))
        return fprintf(stderr, "usage: bench_matmul f32|bf16|q8_0|q4_1 [threads]\n"), 2;
    static const int ns[] = {1, 2, 3, 4, 8};
    enum { N = sizeof ns / sizeof *ns };
    int rows = 1536, cols = 576;
    size_t bytes = k_packed_bytes(wt, rows, cols);
    float *w = malloc(sizeof(float) * rows * cols), *x = malloc(sizeof(float) * 8 * cols);
    float *y = malloc(sizeof(float) * 8 * rows);
    uint16_t *h = malloc(2 * (size_t)rows * cols);
    void **P = malloc(MATRICES * sizeof *P);
    if (!w || !x || !y || !h || !P || k_init(argc > 2 ? atoi(argv[2]) : 1))
        return fprintf(stderr, "bench_matmul: out of memory\n"), 1;
    srand(1);
    for (int i = 0; i < rows * cols; i++) {
        w[i] = (rand() / (float)RAND_MAX - 0.5f) * 0.1f;
        uint32_t u;
        memcpy(&u, &w[i], 4);
        h[i] = (uint16_t)(u >> 16);
    }
    for (int i = 0; i < 8 * cols; i++) x[i] = rand() / (float)RAND_MAX - 0.5f;
    const void *src = wt == WT_F32 ? (const void *)w : (const void *)h;
    if (wt == WT_Q8_0 || wt == WT_Q4_1) { /* random blocks with small finite f16 scales */
        size_t rb = q_row_bytes(wt, cols), bb = wt == WT_Q8_0 ? Q8_0_BYTES : Q4_1_BYTES;
        uint8_t *q = malloc(rb * rows);
        if (!q) return fprintf(stderr, "bench_matmul: out of memory\n"), 1;
        for (size_t i = 0; i < rb * rows; i++) q[i] = (uint8_t)rand();
        for (int r = 0; r < rows; r++)
            for (int b = 0; b < cols / QK; b++) {
                uint8_t *p = q + r * rb + b * bb;
                p[0] = 0, p[1] = 0x20;
                if (wt == WT_Q4_1) p[2] = 0, p[3] = 0xa0;
            }
        src = q;
    }
    for (int m = 0; m < MATRICES; m++) {
        if (!(P[m] = aligned_alloc(64, (bytes + 63) & ~(size_t)63)))
            return fprintf(stderr, "bench_matmul: out of memory\n"), 1;
        k_pack(P[m], wt, cols, 1, &src, &rows);
    }
    double best[N];
    for (int i = 0; i < N; i++) best[i] = 1e30;
    for (int r = 0; r < ROUNDS; r++)
        for (int i = 0; i < N; i++) {
            double t0 = now();
            for (int m = 0; m < MATRICES; m++) k_matmul(y, x, P[m], wt, ns[i], cols, rows);
            double t = now() - t0;
            if (t < best[i]) best[i] = t;
        }
    for (int i = 0; i < N; i++)
        printf("%s n=%d %.2f ms (%.2f× one token) %.2f GB/s\n", name, ns[i], best[i] * 1e3, best[i] / best[0],
               (double)bytes * MATRICES / best[i] / 1e9);
    return 0;
}
