/* bench_qmatmul — one block-type matrix multiplied by n tokens over and over (a benchmark,
   never a test). By default 1536 × 576, SmolLM2's gate shape, which stays in L2: the
   kernels' arithmetic alone. Given a shape past the caches (16384 × 2048 is 18–35 MB),
   the rate a kernel streams its weights from memory. Build and run:
     cc -std=c11 -O2 -march=native -Ilibcore -Ikernels -Ikernels/cpu scripts/bench_qmatmul.c build/libcore.a \
        -o /tmp/bench_qmatmul -lzstd -ljansson -lyaml -lxxhash -lpcre2-8 -lz -lpthread -lm -lstdc++
     /tmp/bench_qmatmul q4_1|q8_0|q5_0|q4_k|q5_k|q6_k [ROWS COLS [CALLS]]
   Prints, per n (1, 2, 4, 8), the least time of a call over 20 rounds of CALLS (200),
   the nanoseconds a 16-row × 32-column block costs per token and the weights' bytes a
   second. */
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
    const char *name = argc > 1 ? argv[1] : "q4_1";
    WType wt = !strcmp(name, "q8_0")   ? WT_Q8_0
               : !strcmp(name, "q5_0") ? WT_Q5_0
               : !strcmp(name, "q4_k") ? WT_Q4_K
               : !strcmp(name, "q5_k") ? WT_Q5_K
               : !strcmp(name, "q6_k") ? WT_Q6_K
                                       : WT_Q4_1;
    int kq = wt == WT_Q4_K || wt == WT_Q5_K || wt == WT_Q6_K;
    int rows = argc > 3 ? atoi(argv[2]) : 1536, cols = argc > 3 ? atoi(argv[3]) : kq ? 512 : 576;
    int calls = argc > 4 ? atoi(argv[4]) : 200;
    if (rows < 16 || cols < 1 || calls < 1 || cols % (kq ? QK_K : QK)) {
        fprintf(stderr, "bench_qmatmul: ROWS ≥ 16 and COLS a multiple of the block (%d)\n", kq ? QK_K : QK);
        return 1;
    }
    size_t rb = q_row_bytes(wt, cols), bb = q_row_bytes(wt, kq ? QK_K : QK); /* a block */
    uint8_t *W = malloc(rb * rows);
    srand(1);
    for (size_t i = 0; i < rb * rows; i++) W[i] = (uint8_t)rand();
    for (int r = 0; r < rows; r++) /* scales (and minima): small finite f16s */
        for (int b = 0; b < cols / (kq ? QK_K : QK); b++) {
            uint8_t *p = W + r * rb + b * bb;
            if (wt == WT_Q6_K) p += 208; /* its d comes last */
            p[0] = 0, p[1] = 0x20;
            if (wt == WT_Q4_1 || wt == WT_Q4_K || wt == WT_Q5_K) p[2] = 0, p[3] = 0xa0;
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
            for (int i = 0; i < calls; i++) k_matmul(y, x, P, wt, n, cols, rows);
            double t = (now() - t0) / calls;
            best = t < best ? t : best;
        }
        printf("%s %d×%d n=%d %.1f us, %.2f ns per 16x32 block and token, %.2f GB/s of weights\n", name, rows, cols, n,
               best * 1e6, best * 1e9 / (rows / 16.0 * cols / QK) / n, (double)rb * rows / best / 1e9);
    }
    return 0;
}
