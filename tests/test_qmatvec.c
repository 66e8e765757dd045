/* test_qmatvec — the drafts' 8-bit matrix-vector product (kernels/cpu/qmatvec.c):
   against a slow reference written here from the formula (per-row weight scales, x
   quantized per call, round to nearest even, offset 128), bit for bit, since its sums
   are integers; and against the f32 product within what 8 bits allow. Shapes with
   ragged rows (not a multiple of 64) and columns (not a multiple of 4), a zero row
   and a zero x. Also k_silu against x / (1 + e^-x). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "check.h"

static float frand(void) { return (float)rand() / RAND_MAX * 2 - 1; }

static int q(float v, float mx) { /* v's 8-bit level at scale mx / 127 */
    return mx > 0 ? (int)nearbyintf(v * (127 / mx)) : 0;
}

/* the reference, straight from the formula */
static void ref_matvec(float *y, const float *x, const float *w, int rows, int cols) {
    float xm = 0;
    for (int c = 0; c < cols; c++) xm = fmaxf(xm, fabsf(x[c]));
    for (int r = 0; r < rows; r++) {
        const float *wr = w + (size_t)r * cols;
        float wm = 0;
        for (int c = 0; c < cols; c++) wm = fmaxf(wm, fabsf(wr[c]));
        int32_t dot = 0, sum = 0; /* Σ (qx + 128) qw and Σ qw */
        for (int c = 0; c < cols; c++) {
            int qw = q(wr[c], wm);
            dot += (q(x[c], xm) + 128) * qw;
            sum += qw;
        }
        y[r] = xm / 127 * (wm / 127) * (float)(dot - 128 * sum);
    }
}

static void check_shape(int rows, int cols, int zero_x) {
    float *w = malloc(sizeof(float) * rows * cols), *x = malloc(sizeof(float) * cols);
    float *y = malloc(sizeof(float) * rows), *ref = malloc(sizeof(float) * rows);
    void *p = aligned_alloc(64, (k_q8_bytes(rows, cols) + 63) / 64 * 64);
    for (int i = 0; i < rows * cols; i++) w[i] = frand();
    for (int c = 0; c < cols; c++) w[c] = 0; /* row 0 is zero */
    for (int c = 0; c < cols; c++) x[c] = zero_x ? 0 : frand() * 3;
    CHECK(k_q8_pack(p, w, rows, cols) == 0, "%d x %d: pack refused", rows, cols);
    k_q8_matvec(y, x, p, rows, cols);
    ref_matvec(ref, x, w, rows, cols);
    CHECK(!memcmp(y, ref, sizeof(float) * rows), "%d x %d%s: not the reference's bits", rows, cols,
          zero_x ? ", x = 0" : "");
    float worst = 0; /* each product is off by at most half a level of each factor */
    for (int r = 0; r < rows; r++) {
        double exact = 0, wm = 0, xm = 0, wa = 0, xa = 0;
        for (int c = 0; c < cols; c++) {
            exact += (double)x[c] * w[(size_t)r * cols + c];
            wm = fmax(wm, fabs(w[(size_t)r * cols + c])), xm = fmax(xm, fabs(x[c]));
            wa += fabs(w[(size_t)r * cols + c]), xa += fabs(x[c]);
        }
        float b =
            (float)(0.5 * wm / 127 * xa + 0.5 * xm / 127 * wa + cols * 0.25 * wm / 127 * xm / 127) * 1.001f + 1e-6f;
        worst = fmaxf(worst, fabsf(y[r] - (float)exact) / b);
    }
    CHECK(worst <= 1, "%d x %d: an error %.2f times the 8-bit bound", rows, cols, worst);
    CHECK(y[0] == 0, "%d x %d: a zero row gave %g", rows, cols, y[0]);
    free(w), free(x), free(y), free(ref), free(p);
}

static void check_silu(int n) {
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    for (int i = 0; i < n; i++) x[i] = frand() * 20;
    k_silu(y, x, n);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        double want = x[i] / (1 + exp(-(double)x[i]));
        bad += fabs(y[i] - want) > 1e-6 * fmax(1, fabs(want));
    }
    CHECK(bad == 0, "silu, %d floats: %d off x / (1 + e^-x) by more than 1e-6", n, bad);
    free(x), free(y);
}

int main(void) {
    static const int shapes[][2] = {{512, 64}, {64, 64}, {517, 70}, {1, 5}, {130, 3}, {49152, 576}, {100, 4096}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) check_shape(shapes[i][0], shapes[i][1], 0);
    check_shape(70, 33, 1);
    float w[8] = {0};
    CHECK(k_q8_pack(w, w, 1, 0) == -1 && k_q8_pack(w, w, 1, 4097) == -1, "columns outside [1, 4096] packed");
    static const int ns[] = {1, 15, 16, 17, 64, 1000};
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) check_silu(ns[i]);
    return check_done("qmatvec");
}
