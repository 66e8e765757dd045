/* test_ops — the per-row kernels' vector paths against the plain C they replace, bit
   for bit: RoPE (whole heads in a vector, halves a vector apart, and the scalar rest,
   with a row stride), rmsnorm's scaling (after dot.h's sum of squares) and the
   residual add. The build turns floating-point contraction off, so the references
   below round every product and sum on its own, as the kernels must. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "check.h"
#include "cpu/dot.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float frand(void) { /* uniform in [-2, 2) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) * (4.0 / 16777216.0) - 2.0);
}

static void check_rope(int n_heads, int hd) {
    enum { N = 3, POS = 40 };
    int half = hd / 2, width = n_heads * hd, stride = width + 5; /* rows with room after them */
    float *x = malloc(sizeof(float) * N * stride), *ref = malloc(sizeof(float) * N * stride);
    float *cs = malloc(sizeof(float) * POS * half), *sn = malloc(sizeof(float) * POS * half);
    for (int i = 0; i < POS * half; i++) cs[i] = cosf(0.37f * i), sn[i] = sinf(0.37f * i);
    for (int i = 0; i < N * stride; i++) x[i] = ref[i] = frand();
    int32_t pos[N] = {0, 17, POS - 1};
    k_rope(x, (size_t)stride, pos, N, n_heads, hd, cs, sn);
    for (int t = 0; t < N; t++)
        for (int h = 0; h < n_heads; h++) {
            float *v = ref + (size_t)t * stride + (size_t)h * hd;
            const float *c = cs + (size_t)pos[t] * half, *s = sn + (size_t)pos[t] * half;
            for (int i = 0; i < half; i++) {
                float a = v[i], b = v[i + half];
                v[i] = a * c[i] - b * s[i];
                v[i + half] = a * s[i] + b * c[i];
            }
        }
    CHECK(!memcmp(x, ref, sizeof(float) * N * stride), "rope, %d heads of %d: not the plain C's bits", n_heads, hd);
    free(x), free(ref), free(cs), free(sn);
}

static void check_rows(int dim) {
    enum { N = 3 };
    float *x = malloc(sizeof(float) * N * dim), *y = malloc(sizeof(float) * N * dim), *g = malloc(sizeof(float) * dim);
    float *ref = malloc(sizeof(float) * N * dim);
    for (int i = 0; i < N * dim; i++) x[i] = frand();
    for (int i = 0; i < dim; i++) g[i] = frand();
    k_rmsnorm(y, x, g, N, dim, 1e-5f);
    for (int t = 0; t < N; t++) { /* the sum of squares in dot.h's order, then the plain loop */
        const float *xt = x + (size_t)t * dim;
        float s = 1.0f / sqrtf(dot_f32(xt, xt, dim) / dim + 1e-5f);
        for (int j = 0; j < dim; j++) ref[(size_t)t * dim + j] = g[j] * (s * xt[j]);
    }
    CHECK(!memcmp(y, ref, sizeof(float) * N * dim), "rmsnorm, dim %d: not g (s x) in plain C's bits", dim);
    memcpy(ref, y, sizeof(float) * N * dim);
    k_add(y, x, (size_t)N * dim);
    int differ = 0;
    for (int i = 0; i < N * dim; i++) differ += y[i] != ref[i] + x[i];
    CHECK(differ == 0, "add, %d floats: %d differ from y + x", N * dim, differ);
    free(x), free(y), free(g), free(ref);
}

int main(void) {
    static const int heads[][2] = {{8, 8},  {12, 8},  {3, 2}, {5, 4},  {2, 16}, {4, 32},
                                   {2, 64}, {1, 128}, {3, 6}, {2, 12}, {2, 48}};
    for (size_t i = 0; i < sizeof heads / sizeof *heads; i++) check_rope(heads[i][0], heads[i][1]);
    static const int dims[] = {1, 15, 16, 17, 64, 100, 768};
    for (size_t i = 0; i < sizeof dims / sizeof *dims; i++) check_rows(dims[i]);
    return check_done("ops");
}
