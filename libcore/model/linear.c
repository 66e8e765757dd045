/* linear.c — see linear.h. Each call is the kernel the heads called before, so their
   outputs keep their bits. */
#include "model/linear.h"

#include <stdio.h>

#include "backend.h"
#include "device.h"

size_t linear_bytes(LinearForm f, int rows, int cols) {
    if (f == LINEAR_F32) return k_packed_bytes(WT_F32, rows, cols);
    return cols <= 4096 ? k_q8_bytes(rows, cols) : 0;
}

int linear_pack(Linear *L, void *mem, LinearForm f, const float *w, int rows, int cols) {
    if (!linear_bytes(f, rows, cols)) return pd_error("linear: %dx%d does not fit the 8-bit form", rows, cols);
    if (f == LINEAR_F32) {
        const void *src[1] = {w};
        int r[1] = {rows};
        k_pack(mem, WT_F32, cols, 1, src, r);
    } else if (k_q8_pack(mem, w, rows, cols)) {
        return pd_error("linear: %dx%d does not fit the 8-bit form", rows, cols);
    }
    *L = (Linear){f, rows, cols, mem};
    return 0;
}

void linear_apply(const Linear *L, float *y, const float *x, int n) {
    if (L->form == LINEAR_F32) {
        k_matmul(y, x, L->p, WT_F32, n, L->cols, L->rows);
        return;
    }
    /* a row at a time: the 8-bit path scales x per call */
    for (int t = 0; t < n; t++) k_q8_matvec(y + (size_t)t * L->rows, x + (size_t)t * L->cols, L->p, L->rows, L->cols);
}

void model_final_norm(const Model *m, float *y, const float *x, int n) {
    k_rmsnorm(y, x, m->final_norm, n, m->c.dim, m->c.norm_eps);
}

void model_lm_head(const Model *m, float *logits, const float *x, int n) {
    k_matmul(logits, x, m->lm_head.p, m->lm_head.t, n, m->c.dim, m->c.vocab_size);
}

void model_lm_head_row(const Model *m, int v, float *out) {
    k_row_to_f32(out, m->lm_head.w, m->lm_head.t, (size_t)v, m->c.dim);
}

void mat_row_f32(const Mat *w, int r, float *out) { k_row_to_f32(out, w->w, w->t, (size_t)r, w->cols); }

void vec_add(float *y, const float *x, size_t n) { k_add(y, x, n); }
void vec_silu(float *y, const float *x, size_t n) { k_silu(y, x, n); }

int model_threads(int n) { return k_init(n); }

static char device_kind[16] = "cpu";
int model_device(const char *kind) {
    Device *d = dev_open(kind);
    if (!d) return pd_error("%s", dev_errmsg());
    snprintf(device_kind, sizeof device_kind, "%s", dev_kind(d));
    dev_close(d);
    return 0;
}
const char *model_device_kind(void) { return device_kind; }
const char *model_backends(void) { return k_backends(); }
const char *model_cpu_features(void) { return k_cpu_features(); }
double model_stream_sum(const float *x, size_t n) { return k_stream_sum(x, n); }

double model_device_copy_gbs(size_t bytes, int passes) {
    Device *d = dev_open(device_kind);
    DevBuf a = {0}, b = {0};
    double best = 1e30;
    int rc = !d || dev_alloc(d, bytes, &a) || dev_alloc(d, bytes, &b) || dev_sync(d);
    for (int p = 0; p < passes && !rc; p++) {
        double t0 = pd_now();
        rc = dev_copy(d, b, a, bytes) || dev_sync(d);
        double dt = pd_now() - t0;
        best = dt < best ? dt : best;
    }
    if (rc) pd_error("device copy: %s", dev_errmsg());
    if (d) dev_free(d, a), dev_free(d, b), dev_close(d);
    return rc ? -1 : 2.0 * (double)bytes / best / 1e9;
}
