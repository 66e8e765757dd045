/* device_cpu.c — the device interface on host memory, for two devices: "cpu", whose
   kernels are kernels/cpu's, and "cuemu", whose kernels are kernels/cuda's sources built
   for the host (cuemu.h), so the CUDA kernels run under every test. Calls run on the caller's
   thread as they are submitted, so the stream is in order by construction and an event
   is done once recorded; a graph is the list of calls (function and a copy of its
   arguments) captured between begin and end, replayed in order. Arguments hold Bufs,
   never host pointers, so a replay reads whatever the buffers hold then.
   In a build with PD_CUDA a "cuda" device's memory, streams, events and graphs are
   kernels/cuda/device_cuda.c's (ON_GPU below); its calls are the same host functions,
   which launch its kernels on its stream. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cuda/cuda_kernels.h"
#include "device_impl.h"

/* a cuda Device's, event's or graph's call goes to device_cuda.c (cond: it is one) */
#ifdef PD_CUDA
#define ON_GPU(cond, stmt)                                                                                             \
    do {                                                                                                               \
        if (cond) {                                                                                                    \
            stmt;                                                                                                      \
        }                                                                                                              \
    } while (0)
#else
#define ON_GPU(cond, stmt) (void)(cond)
#endif

static _Thread_local char err[256];
const char *dev_errmsg(void) { return err; }
int dev_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, sizeof err, fmt, ap);
    va_end(ap);
    return -1;
}

static int cpu_wtype(WType wt) { return wt >= 0 && wt < WT_COUNT; }
static void cpu_move_cols(void *base, const int64_t *list, const int32_t *count, int max_count, int len, size_t stride,
                          int elem) {
    int n = *count < 0 ? 0 : *count > max_count ? max_count : *count;
    size_t e = (size_t)elem, step = stride * e;
    for (int i = 0; i < n; i++) {
        const unsigned char *s = (const unsigned char *)base + (size_t)list[2 * i] * e;
        unsigned char *t = (unsigned char *)base + (size_t)list[2 * i + 1] * e;
        for (int j = 0; j < len; j++) memcpy(t + (size_t)j * step, s + (size_t)j * step, e);
    }
}
static void cpu_rows_to_f32(float *y, const void *w, WType wt, const int32_t *rows, int n, int cols) {
    for (int i = 0; i < n; i++) k_row_to_f32(y + (size_t)i * cols, w, wt, (size_t)rows[i], cols);
}

/* the row operations of device.h over host pointers, as kernels/cuda/rows.cu's launchers */
static int row_count(const int32_t *rows, int max_rows) { return *rows < 0 ? 0 : *rows > max_rows ? max_rows : *rows; }
static void cpu_argmax_rows(int32_t *ids, const float *x, const int32_t *rows, int max_rows, int cols) {
    for (int r = 0, n = row_count(rows, max_rows); r < n; r++) ids[r] = k_argmax(x + (size_t)r * cols, cols);
}
static void cpu_softmax_rows(float *y, const float *x, const int32_t *rows, int max_rows, int cols, float temp) {
    for (int r = 0, n = row_count(rows, max_rows); r < n; r++) {
        float *yr = y + (size_t)r * cols;
        memmove(yr, x + (size_t)r * cols, sizeof(float) * cols);
        if (temp != 0)
            for (int c = 0; c < cols; c++) yr[c] /= temp;
        k_softmax(yr, cols);
    }
}
/* a k-slot insertion list: k is small (a tree's branching, a sampler's top-k) */
static void cpu_topk_rows(int32_t *ids, float *p, const float *x, const int32_t *rows, int max_rows, int cols, int k) {
    int n = row_count(rows, max_rows);
    float *row = malloc(sizeof(float) * cols);
    if (!row) { /* no scratch: the ids say so rather than holding stale ones */
        for (int r = 0; r < n; r++)
            for (int j = 0; j < k; j++) ids[(size_t)r * k + j] = -1;
        return;
    }
    for (int r = 0; r < n; r++) {
        memcpy(row, x + (size_t)r * cols, sizeof(float) * cols);
        k_softmax(row, cols);
        int32_t *id = ids + (size_t)r * k;
        int have = 0;
        for (int c = 0; c < cols; c++) {
            if (have == k && !(row[c] > row[id[have - 1]])) continue;
            int at = have < k ? have++ : have - 1;
            while (at > 0 && row[c] > row[id[at - 1]]) { /* strictly larger moves up: lower index wins ties */
                id[at] = id[at - 1];
                at--;
            }
            id[at] = c;
        }
        for (int j = have; j < k; j++) id[j] = -1;
        if (p)
            for (int j = 0; j < k; j++) p[(size_t)r * k + j] = id[j] >= 0 ? row[id[j]] : 0;
    }
    free(row);
}

static const KernelSet cpu_kernels = {.name = "cpu",
                                      .has_wtype = cpu_wtype,
                                      .matmul = k_matmul,
                                      .rmsnorm = k_rmsnorm,
                                      .rope = k_rope,
                                      .add = k_add,
                                      .add_rows = k_add_rows,
                                      .silu_mul_rows = k_silu_mul_rows,
                                      .kv_write = k_kv_write_typed,
                                      .attention_rel = k_attention_rel,
                                      .rows_to_f32 = cpu_rows_to_f32,
                                      .move_cols = cpu_move_cols,
                                      .argmax_rows = cpu_argmax_rows,
                                      .softmax_rows = cpu_softmax_rows,
                                      .topk_rows = cpu_topk_rows};
static const KernelSet emu_kernels = {.name = "cuemu", CUDA_KERNEL_SET};

Device *dev_open(const char *kind) {
    const KernelSet *k = !kind                    ? NULL
                         : !strcmp(kind, "cpu")   ? &cpu_kernels
                         : !strcmp(kind, "cuemu") ? &emu_kernels
                                                  : NULL;
    int gpu = 0;
#ifdef PD_CUDA
    gpu = kind && !strcmp(kind, "cuda");
#endif
    if (!k && !gpu) {
        dev_fail("device '%s' is not compiled in (this build has: %s)", kind ? kind : "(null)", k_backends());
        return NULL;
    }
    Device *d = calloc(1, sizeof *d);
    if (!d) {
        dev_fail("device: out of memory");
        return NULL;
    }
    d->k = k;
#ifdef PD_CUDA
    if (gpu && cudev_open(d)) return free(d), NULL;
#endif
    return d;
}
const KernelSet *dev_kernels(const Device *d) { return d->k; }

void dev_close(Device *d) {
    if (!d) return;
    if (d->capturing) dev_graph_free(d->capturing);
    ON_GPU(d->native, cudev_close(d));
    free(d);
}

const char *dev_kind(const Device *d) { return d ? d->k->name : "none"; }

int dev_alloc(Device *d, size_t bytes, DevBuf *out) {
    ON_GPU(d->native, return cudev_alloc(d, bytes, out));
    *out = (DevBuf){0};
    DevMem *m = calloc(1, sizeof *m);
    size_t sz = (bytes + 63) / 64 * 64;
    if (!m || sz < bytes || !(m->p = aligned_alloc(64, sz ? sz : 64))) {
        free(m);
        return dev_fail("device: cannot allocate %zu bytes", bytes);
    }
    memset(m->p, 0, sz ? sz : 64);
    m->size = bytes;
    m->owned = 1;
    out->mem = m;
    return 0;
}

/* cuemu copies, as a GPU must: what its kernels read is then only what was copied in */
int dev_wrap(Device *d, const void *host, size_t bytes, DevBuf *out) {
    ON_GPU(d->native, return cudev_wrap(d, host, bytes, out));
    if (d->k == &emu_kernels) {
        if (dev_alloc(d, bytes, out)) return -1;
        memcpy(out->mem->p, host, bytes);
        return 0;
    }
    *out = (DevBuf){0};
    DevMem *m = calloc(1, sizeof *m);
    if (!m) return dev_fail("device: out of memory");
    m->p = (unsigned char *)host;
    m->size = bytes;
    out->mem = m;
    return 0;
}

void dev_free(Device *d, DevBuf b) {
    if (!b.mem) return;
    ON_GPU(d->native, cudev_free(d, b); return );
    if (b.mem->owned) free(b.mem->p);
    free(b.mem);
}

size_t dbuf_bytes(DevBuf b) { return b.mem && b.off <= b.mem->size ? b.mem->size - b.off : 0; }

/* cuemu's memory is host memory, but the host is not shown it: a GPU's is not, and what
   would read it directly must fail under cuemu's tests rather than pass */
void *dev_host(const Device *d, DevBuf b) { return d->k == &cpu_kernels ? dev_ptr(d, b) : NULL; }

void *dev_ptr(const Device *d, DevBuf b) {
    (void)d;
    return b.mem ? b.mem->p + b.off : NULL;
}

static int in_bounds(DevBuf b, size_t n, const char *what) {
    if (!b.mem) return dev_fail("device: %s: no buffer", what);
    if (b.off > b.mem->size || n > b.mem->size - b.off)
        return dev_fail("device: %s: %zu bytes at offset %zu overrun a %zu-byte buffer", what, n, b.off, b.mem->size);
    return 0;
}

/* runs a call now, or appends it to the graph being captured */
static int submit(Device *d, void (*fn)(const void *), const void *args, size_t bytes) {
    ON_GPU(d->native, return cudev_submit(d, fn, args));
    if (!d->capturing) {
        fn(args);
        d->done++;
        return 0;
    }
    DevGraph *g = d->capturing;
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 16;
        Call **c = realloc(g->calls, sizeof *c * cap);
        if (!c) return dev_fail("device: out of memory capturing a graph");
        g->calls = c, g->cap = cap;
    }
    Call *c = malloc(sizeof *c + bytes);
    if (!c) return dev_fail("device: out of memory capturing a graph");
    c->fn = fn, c->bytes = bytes;
    memcpy(c->args, args, bytes);
    g->calls[g->n++] = c;
    return 0;
}

int dev_host_call(Device *d, void (*fn)(const void *), const void *args, size_t bytes) {
    return submit(d, fn, args, bytes);
}

/* an upload captured in a graph uploads the bytes as they were at capture (a CUDA
   graph's memcpy node reads its source at replay; the CPU keeps a copy, which is what
   a caller may rely on either way: the source need not outlive the call) */
typedef struct {
    DevBuf dst;
    size_t n;
    unsigned char src[];
} Upload;
static void run_upload(const void *a) {
    const Upload *u = a;
    memcpy(u->dst.mem->p + u->dst.off, u->src, u->n);
}
int dev_upload(Device *d, DevBuf dst, const void *src, size_t n) {
    if (in_bounds(dst, n, "upload")) return -1;
    ON_GPU(d->native, return cudev_upload(d, dst, src, n));
    if (!d->capturing) {
        memcpy(dst.mem->p + dst.off, src, n);
        d->done++;
        return 0;
    }
    Upload *u = malloc(sizeof *u + n);
    if (!u) return dev_fail("device: out of memory capturing an upload");
    u->dst = dst, u->n = n;
    memcpy(u->src, src, n);
    int rc = submit(d, run_upload, u, sizeof *u + n);
    free(u);
    return rc;
}

int dev_download(Device *d, void *dst, DevBuf src, size_t n) {
    if (d->capturing) return dev_fail("device: download while capturing a graph");
    if (in_bounds(src, n, "download")) return -1;
    ON_GPU(d->native, return cudev_download(d, dst, src, n));
    memcpy(dst, src.mem->p + src.off, n);
    return 0;
}

typedef struct {
    DevBuf dst, src;
    size_t n;
} CopyArgs;
static void run_copy(const void *a) {
    const CopyArgs *c = a;
    memmove(c->dst.mem->p + c->dst.off, c->src.mem->p + c->src.off, c->n);
}
int dev_copy(Device *d, DevBuf dst, DevBuf src, size_t n) {
    if (in_bounds(dst, n, "copy destination") || in_bounds(src, n, "copy source")) return -1;
    ON_GPU(d->native, return cudev_copy(d, dst, src, n));
    CopyArgs c = {dst, src, n};
    return submit(d, run_copy, &c, sizeof c);
}

#define AT(b, type) ((type)((b).mem ? (b).mem->p + (b).off : NULL))
typedef struct {
    const KernelSet *k;
    DevBuf base, list, count;
    int max_count, len, elem;
    size_t stride;
} MoveArgs;
static void run_move(const void *a) {
    const MoveArgs *m = a;
    m->k->move_cols(AT(m->base, void *), AT(m->list, const int64_t *), AT(m->count, const int32_t *), m->max_count,
                    m->len, m->stride, m->elem);
}
int dev_move_cols_elem(Device *d, DevBuf base, DevBuf list, DevBuf count_buf, int max_count, int len, size_t stride,
                       int elem_bytes) {
    if (max_count < 0 || len < 0) return dev_fail("device: move_cols: negative sizes");
    if (elem_bytes != 1 && elem_bytes != 2 && elem_bytes != 4)
        return dev_fail("device: move_cols: %d-byte elements", elem_bytes);
    if (in_bounds(list, sizeof(int64_t) * 2 * (size_t)max_count, "move_cols list") ||
        in_bounds(count_buf, sizeof(int32_t), "move_cols count") || in_bounds(base, 0, "move_cols base"))
        return -1;
    MoveArgs m = {d->k, base, list, count_buf, max_count, len, elem_bytes, stride};
    return submit(d, run_move, &m, sizeof m);
}
int dev_move_cols(Device *d, DevBuf base, DevBuf list, DevBuf count_buf, int max_count, int len, size_t stride) {
    return dev_move_cols_elem(d, base, list, count_buf, max_count, len, stride, 4);
}

int dev_sync(Device *d) {
    if (d->capturing) return dev_fail("device: sync while capturing a graph");
    ON_GPU(d->native, return cudev_sync(d));
    return 0;
}

DevEvent *dev_event_new(Device *d) {
    DevEvent *e = calloc(1, sizeof *e);
    if (!e) dev_fail("device: out of memory");
    ON_GPU(e && d->native, if (cudev_event_new(e)) e = (free(e), NULL));
    return e;
}
void dev_event_free(DevEvent *e) {
    ON_GPU(e && e->native, cudev_event_free(e));
    free(e);
}

int dev_record(Device *d, DevEvent *e) {
    if (d->capturing) return dev_fail("device: events inside a captured graph are not supported");
    if (!!d->native != !!e->native) return dev_fail("device: an event of another kind of device");
    ON_GPU(d->native, return cudev_record(d, e));
    e->at = d->done + 1;
    return 0;
}
/* the recording stream ran everything before the record already: nothing to wait for */
int dev_wait(Device *d, DevEvent *e) {
    if (!!d->native != !!e->native) return dev_fail("device: an event of another kind of device");
    ON_GPU(d->native, return cudev_wait(d, e));
    return e->at ? 0 : dev_fail("device: waiting on an event never recorded");
}
int dev_event_done(DevEvent *e) {
    ON_GPU(e->native, return cudev_event_done(e));
    return e->at ? 1 : -1;
}

int dev_graph_begin(Device *d) {
    if (d->capturing) return dev_fail("device: a graph is already being captured");
    d->capturing = calloc(1, sizeof *d->capturing);
    if (!d->capturing) return dev_fail("device: out of memory");
    ON_GPU(d->native, if (cudev_graph_begin(d)) return (free(d->capturing), d->capturing = NULL, -1));
    return 0;
}

int dev_graph_end(Device *d, DevGraph **out) {
    *out = NULL;
    if (!d->capturing) return dev_fail("device: graph_end without graph_begin");
    DevGraph *g = d->capturing;
    d->capturing = NULL;
    ON_GPU(d->native, if (cudev_graph_end(d, g)) return (dev_graph_free(g), -1));
    *out = g;
    return 0;
}

int dev_graph_replay(Device *d, const DevGraph *g) {
    if (d->capturing) return dev_fail("device: replay while capturing a graph");
    if (!!d->native != !!g->native) return dev_fail("device: a graph of another kind of device");
    ON_GPU(d->native, return cudev_graph_replay(d, g));
    for (int i = 0; i < g->n; i++) {
        g->calls[i]->fn(g->calls[i]->args);
        d->done++;
    }
    return 0;
}

void dev_graph_free(DevGraph *g) {
    if (!g) return;
    ON_GPU(g->native, cudev_graph_free(g));
    for (int i = 0; i < g->n; i++) free(g->calls[i]);
    free(g->calls);
    free(g);
}

int dev_graph_calls(const DevGraph *g) {
    ON_GPU(g && g->native, return cudev_graph_calls(g));
    return g ? g->n : 0;
}

/* ---- rows ---- */

typedef struct {
    const KernelSet *k;
    DevBuf ids, p, x, rows;
    int max_rows, cols, n_out;
    float temp; /* softmax of x / temp; 0 = of x itself */
} RowArgs;

static void run_argmax(const void *v) {
    const RowArgs *a = v;
    a->k->argmax_rows(AT(a->ids, int32_t *), AT(a->x, const float *), AT(a->rows, const int32_t *), a->max_rows,
                      a->cols);
}
static void run_softmax(const void *v) {
    const RowArgs *a = v;
    a->k->softmax_rows(AT(a->p, float *), AT(a->x, const float *), AT(a->rows, const int32_t *), a->max_rows, a->cols,
                       a->temp);
}
static void run_topk(const void *v) {
    const RowArgs *a = v;
    a->k->topk_rows(AT(a->ids, int32_t *), AT(a->p, float *), AT(a->x, const float *), AT(a->rows, const int32_t *),
                    a->max_rows, a->cols, a->n_out);
}

static int rows_check(DevBuf x, DevBuf rows_buf, int max_rows, int cols) {
    if (max_rows < 0 || cols < 1) return dev_fail("device: rows: bad sizes (%d rows of %d)", max_rows, cols);
    return in_bounds(x, sizeof(float) * (size_t)max_rows * cols, "rows input") ||
                   in_bounds(rows_buf, sizeof(int32_t), "row count")
               ? -1
               : 0;
}

int dev_argmax_rows(Device *d, DevBuf ids, DevBuf x, DevBuf rows_buf, int max_rows, int cols) {
    if (rows_check(x, rows_buf, max_rows, cols) || in_bounds(ids, sizeof(int32_t) * (size_t)max_rows, "argmax ids"))
        return -1;
    RowArgs a = {d->k, ids, {0}, x, rows_buf, max_rows, cols, 1, 0};
    return submit(d, run_argmax, &a, sizeof a);
}

int dev_softmax_rows(Device *d, DevBuf y, DevBuf x, DevBuf rows_buf, int max_rows, int cols) {
    if (rows_check(x, rows_buf, max_rows, cols) ||
        in_bounds(y, sizeof(float) * (size_t)max_rows * cols, "softmax output"))
        return -1;
    RowArgs a = {d->k, {0}, y, x, rows_buf, max_rows, cols, 0, 0};
    return submit(d, run_softmax, &a, sizeof a);
}

int dev_softmax_temp_rows(Device *d, DevBuf y, DevBuf x, DevBuf rows_buf, int max_rows, int cols, float temp) {
    if (!(temp > 0)) return dev_fail("device: softmax: temperature %g", temp);
    if (rows_check(x, rows_buf, max_rows, cols) ||
        in_bounds(y, sizeof(float) * (size_t)max_rows * cols, "softmax output"))
        return -1;
    RowArgs a = {d->k, {0}, y, x, rows_buf, max_rows, cols, 0, temp};
    return submit(d, run_softmax, &a, sizeof a);
}

int dev_topk_rows(Device *d, DevBuf ids, DevBuf p, DevBuf x, DevBuf rows_buf, int max_rows, int cols, int k) {
    if (k < 1 || k > cols) return dev_fail("device: top-k: k = %d for rows of %d", k, cols);
    size_t out = (size_t)max_rows * k;
    if (rows_check(x, rows_buf, max_rows, cols) || in_bounds(ids, sizeof(int32_t) * out, "top-k ids") ||
        (p.mem && in_bounds(p, sizeof(float) * out, "top-k probabilities")))
        return -1;
    RowArgs a = {d->k, ids, p, x, rows_buf, max_rows, cols, k, 0};
    return submit(d, run_topk, &a, sizeof a);
}
