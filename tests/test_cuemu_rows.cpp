/* test_cuemu_rows.cpp — kernels/cuda/rows.cu under cuemu against the CPU bit for bit:
   argmax vs k_argmax, softmax (with and without temperature) vs k_softmax, top-k vs
   k_softmax plus device_cpu.c's insertion list; odd widths, ties, -inf, huge values, a
   device row count below max_rows (rows past it untouched), both thread orders. */
#include <cmath>
#include <cstring>
#include <vector>

#include "check.h"
#include "cuda/cuda_kernels.h"
#include "cuda/cuemu.h"
#include "rand.h"

/* kind 0 random, 1 ties (few values), 2 with -inf, 3 huge (and inf) */
static void fill(std::vector<float> &x, int kind) {
    for (float &v : x) {
        v = kind == 1 ? (float)urand(4) : frand(-8.0f, 8.0f);
        if (kind == 2 && urand(3) == 0) v = -INFINITY;
        if (kind == 3 && urand(5) == 0) v = urand(4) == 0 ? INFINITY : 3e38f;
    }
}

static void topk_ref(int32_t *id, float *p, const float *x, int cols, int k) {
    std::vector<float> row(x, x + cols);
    k_softmax(row.data(), cols);
    int have = 0;
    for (int c = 0; c < cols; c++) {
        if (have == k && !(row[c] > row[id[have - 1]])) continue;
        int at = have < k ? have++ : have - 1;
        while (at > 0 && row[c] > row[id[at - 1]]) id[at] = id[at - 1], at--;
        id[at] = c;
    }
    for (int j = have; j < k; j++) id[j] = -1;
    for (int j = 0; j < k; j++) p[j] = id[j] >= 0 ? row[id[j]] : 0;
}

int main(void) {
    static const int colss[] = {1, 2, 15, 16, 17, 100, 512, 1000, 49152};
    static const int ks[] = {1, 2, 5, 10};
    for (int order = 0; order < 2; order++)
        for (int cols : colss)
            for (int kind = 0; kind < 4; kind++) {
                int max_rows = cols > 1000 ? 3 : 9, n = max_rows - (kind & 1);
                test_rng = 0x5eed0100 + cols * 8 + kind;
                std::vector<float> x((size_t)max_rows * cols);
                fill(x, kind);
                int32_t rows = n;
                cuemu_order = order;
                std::vector<int32_t> ids(max_rows, 77), want(max_rows, 77);
                for (int r = 0; r < n; r++) want[r] = k_argmax(&x[(size_t)r * cols], cols);
                cuda_argmax_rows(ids.data(), x.data(), &rows, max_rows, cols);
                CHECK(ids == want, "argmax cols %d kind %d order %d", cols, kind, order);
                for (float temp : {0.0f, 0.7f}) {
                    std::vector<float> y(x.size(), 5.0f), w(x.size(), 5.0f);
                    for (int r = 0; r < n; r++) {
                        float *wr = &w[(size_t)r * cols];
                        for (int c = 0; c < cols; c++)
                            wr[c] = temp != 0 ? x[(size_t)r * cols + c] / temp : x[(size_t)r * cols + c];
                        k_softmax(wr, cols);
                    }
                    cuda_softmax_rows(y.data(), x.data(), &rows, max_rows, cols, temp);
                    CHECK(!memcmp(y.data(), w.data(), y.size() * 4), "softmax cols %d kind %d temp %g order %d", cols,
                          kind, temp, order);
                }
                for (int k : ks) {
                    if (k > cols) continue;
                    std::vector<int32_t> gi((size_t)max_rows * k, 77), wi(gi);
                    std::vector<float> gp((size_t)max_rows * k, 5.0f), wp(gp);
                    for (int r = 0; r < n; r++)
                        topk_ref(&wi[(size_t)r * k], &wp[(size_t)r * k], &x[(size_t)r * cols], cols, k);
                    cuda_topk_rows(gi.data(), gp.data(), x.data(), &rows, max_rows, cols, k);
                    CHECK(gi == wi && !memcmp(gp.data(), wp.data(), gp.size() * 4),
                          "topk cols %d kind %d k %d order %d", cols, kind, k, order);
                }
            }
    return check_done("cuemu_rows");
}
