/* product.c — see product.h */
#include "model/product.h"

#include <string.h>

#include "backend.h"

int mat_load(Runner *r, DevMat *M, const void *packed, WType t, int rows, int cols) {
    if (t != WT_F32 && t != WT_BF16) return pd_error("product: only f32 and bf16 matrices are trained through");
    size_t bytes = k_packed_bytes(t, rows, cols);
    M->t = t, M->rows = rows, M->cols = cols, M->host = packed;
    if (runner_host_visible(r)) return 0;
    if (bytes > M->cap) {
        DevBuf b;
        if (dev_alloc(r->dev, bytes, &b)) return pd_error("product: %s", dev_errmsg());
        dev_free(r->dev, M->buf);
        M->buf = b, M->cap = bytes;
    }
    return dev_upload(r->dev, M->buf, packed, bytes) ? pd_error("product: %s", dev_errmsg()) : 0;
}

void mat_free(Runner *r, DevMat *M) {
    if (M->buf.mem) dev_free(r->dev, M->buf);
    memset(M, 0, sizeof *M);
}

typedef struct {
    const KernelSet *k;
    float *y;
    const float *x;
    const void *w;
    WType t;
    int n, cols, rows;
} MulCall;
static void run_mul(const void *a) {
    const MulCall *c = a;
    (c->k->matmul_fast ? c->k->matmul_fast : c->k->matmul)(c->y, c->x, c->w, c->t, c->n, c->cols, c->rows);
}

/* room in the workspace's product buffers (device memory) for floats */
static int room(Runner *r, DevBuf *b, size_t *cap, size_t floats) {
    if (floats <= *cap) return 0;
    DevBuf nb;
    if (dev_alloc(r->dev, pd_mul(floats, sizeof(float)), &nb)) return pd_error("product: %s", dev_errmsg());
    dev_free(r->dev, *b);
    *b = nb, *cap = floats;
    return 0;
}

static int mul(Runner *r, const void *w, WType t, int rows, int cols, float *y, const float *x, int n) {
    if (n < 1) return pd_error("product: no rows");
    MulCall c = {r->k, y, x, w, t, n, cols, rows};
    if (runner_host_visible(r))
        return dev_host_call(r->dev, run_mul, &c, sizeof c) ? pd_error("product: %s", dev_errmsg()) : 0;
    Workspace *ws = &r->ws;
    size_t nx = pd_mul((size_t)n, (size_t)cols), ny = pd_mul((size_t)n, (size_t)rows);
    if (room(r, &ws->mx, &ws->cap_mx, nx) || room(r, &ws->my, &ws->cap_my, ny)) return -1;
    c.x = dev_ptr(r->dev, ws->mx), c.y = dev_ptr(r->dev, ws->my);
    if (dev_upload(r->dev, ws->mx, x, sizeof(float) * nx) || dev_host_call(r->dev, run_mul, &c, sizeof c) ||
        dev_download(r->dev, y, ws->my, sizeof(float) * ny))
        return pd_error("product: %s", dev_errmsg());
    return 0;
}

int mat_mul(Runner *r, const DevMat *M, float *y, const float *x, int n) {
    return mul(r, runner_host_visible(r) ? M->host : dev_ptr(r->dev, M->buf), M->t, M->rows, M->cols, y, x, n);
}

int mat_mul_lm_head(Runner *r, float *y, const float *x, int n) {
    const Model *m = r->m;
    return mul(r, r->w.lm_head, m->lm_head.t, m->c.vocab_size, m->c.dim, y, x, n);
}
