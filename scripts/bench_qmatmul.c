/* bench_qmatmul — one block-type matrix (1536 × 576, SmolLM2's gate shape) multiplied by n
   tokens over and over from L2: the kernels' arithmetic alone, no memory time (a
   benchmark, never a test). Build and run:
     cc -std=c11 -O2 -march=native -Ilibcore -Ikernels -Ikernels/cpu scripts/bench_qmatmul.c build/libcore.a \
        -o /tmp/bench_qmatmul -lzstd -ljansson -lyaml -lxxhash -lpcre2-8 -lz -lpthread -lm -lstdc++
     /tmp/bench_qmatmul q4_1|q8_0
   Prints, per n, the least time of a call over 20 rounds of 200 and the nanoseconds a
   16-row × 32-column block costs per token. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "quant.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    WType wt = argc > 1 && !strcmp(argv[1], "q8_0") ? WT_Q8_0 : WT_Q4_1;
    int rows = 1536, cols = 576;
    size_t rb = q_row_bytes(wt, cols), bb = wt == WT_Q8_0 ? Q8_0_BYTES : Q4_1_BYTES;
    uint8_t *W = malloc(rb * rows);
    srand(1);
    for (size_t i = 0; i < rb * rows; i++) W[i] = (uint8_t)rand();
    for (int r = 0; r < rows; r++) /* scales: small finite f16s */
        for (int b = 0; b < cols / QK; b++) {
            uint8_t *p = W + r * rb + b * bb;
            p[0] = 0, p[1] = 0x20;
            if (wt == WT_Q4_1) p[2] = 0, p[3] = 0xa0;
        }
    void *P = aligned_alloc(64, (k_packed_bytes(wt, rows, cols) + 63) & ~(size_t)63);
    const void *one = W;
    k_pack(P, wt, cols, 1, &one, &rows);
    k_init(1);
    float *x = malloc(sizeof(float) * 8 * cols), *y = malloc(sizeof(float) * 8 * rows);
    for (int i = 0; i < 8 * cols; i++) x[i] = (float)(rand() % 2001 - 1000) / 1000;
    for (int n = 1; n <= 8; n *= 2) {
        double best = 1e9;
        for (int round = 0; round < 20; round++) {
            double t0 = now();
            for (int i = 0; i < 200; i++) k_matmul(y, x, P, wt, n, cols, rows);
            double t = (now() - t0) / 200;
            best = t < best ? t : best;
        }
        printf("%s n=%d %.1f us, %.2f ns per 16x32 block and token\n", argv[1] ? argv[1] : "q4_1", n, best * 1e6,
               best * 1e9 / (rows / 16.0 * cols / QK) / n);
    }
    return 0;
}
