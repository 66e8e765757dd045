/* device.h — the device interface a backend implements (kernels/cpu with host memory;
   kernels/cuda with device memory and streams). A Device is one in-order stream: work
   submitted to it runs in submission order; several handles are several streams, ordered
   against each other with events. Memory is a DevBuf: an allocation and a byte offset into
   it. A graph is a captured sequence of device calls; a replay runs the same calls on
   the same buffers, so per-step data (the step descriptor) is whatever those buffers
   hold at replay time. Calls return 0, or -1 with dev_errmsg() saying why. */
#ifndef PD_DEVICE_H
#define PD_DEVICE_H
#include <stddef.h>
#include <stdint.h>

#include "backend.h"

typedef struct Device Device;
typedef struct DevMem DevMem;
typedef struct DevEvent DevEvent;
typedef struct DevGraph DevGraph;
typedef struct {
    DevMem *mem; /* NULL: no buffer */
    size_t off;  /* bytes from the allocation's start */
} DevBuf;

const char *dev_errmsg(void); /* the calling thread's last device error */

/* kind "cpu" (kernels/cpu on host memory), "cuemu" (kernels/cuda's sources built for
   the host under cuemu.h, on host memory: the CUDA kernels' bits, tested without a GPU)
   or, in a CUDA build, "cuda" (the first GPU); NULL + dev_errmsg when not compiled in or
   when there is no GPU */
Device *dev_open(const char *kind);
void dev_close(Device *d);
const char *dev_kind(const Device *d);

/* bytes zeroed, 64-byte aligned; freed with dev_free (a DevBuf with off 0) */
int dev_alloc(Device *d, size_t bytes, DevBuf *out);
/* bytes the caller owns and keeps alive (mmapped weights) as a device buffer: the CPU
   wraps them without a copy; a GPU copies them in once */
int dev_wrap(Device *d, const void *host, size_t bytes, DevBuf *out);
void dev_free(Device *d, DevBuf b);
static inline DevBuf dbuf_at(DevBuf b, size_t off) { return (DevBuf){b.mem, b.off + off}; }
size_t dbuf_bytes(DevBuf b); /* bytes from b.off to the allocation's end */
/* where the host may read and write b: the CPU's memory; NULL on a GPU and under cuemu */
void *dev_host(const Device *d, DevBuf b);
/* the address d's kernels are given for b: host memory on the CPU and under cuemu, device
   memory on a GPU; never for the host to read or write */
void *dev_ptr(const Device *d, DevBuf b);

/* in stream order; bounds checked against the allocation */
int dev_upload(Device *d, DevBuf dst, const void *src, size_t n);
int dev_download(Device *d, void *dst, DevBuf src, size_t n); /* waits for the stream */
int dev_copy(Device *d, DevBuf dst, DevBuf src, size_t n);
/* for each of the count pairs {src, dst} (int64 float indices in list), len floats
   strided stride floats apart from base+src to base+dst, pairs in order: the KV
   cache's slot moves (keep a path, fork). count is read from count_buf (int32) when
   the call runs, so a replay can move a different number */
int dev_move_cols(Device *d, DevBuf base, DevBuf list, DevBuf count_buf, int max_count, int len, size_t stride);
/* the same over elements of elem_bytes (1, 2 or 4: an 8-bit or bf16 KV cache, its
   scales): indices and strides count elements */
int dev_move_cols_elem(Device *d, DevBuf base, DevBuf list, DevBuf count_buf, int max_count, int len, size_t stride,
                       int elem_bytes);
int dev_sync(Device *d);

/* events: record marks the stream's position; wait makes this stream's later work wait
   for it; done says whether the work before it has finished */
DevEvent *dev_event_new(Device *d);
void dev_event_free(DevEvent *e);
int dev_record(Device *d, DevEvent *e);
int dev_wait(Device *d, DevEvent *e);
int dev_event_done(DevEvent *e); /* 1, 0, or -1 when never recorded */

/* capture: between begin and end the stream's calls are recorded, not run (uploads and
   copies included); replay runs them again in order. Downloads and syncs are refused
   while capturing. */
int dev_graph_begin(Device *d);
int dev_graph_end(Device *d, DevGraph **out);
int dev_graph_replay(Device *d, const DevGraph *g);
void dev_graph_free(DevGraph *g);
int dev_graph_calls(const DevGraph *g); /* calls it holds */

/* rows over [rows][cols] f32 (rows read from rows_buf, int32, at most max_rows), the
   same arithmetic as k_argmax and k_softmax row by row:
   argmax: ids[r] (int32), the lowest index among equal maxima;
   softmax: y[r] = softmax(x[r]) (y may be x);
   topk: ids[r][k] (int32) and p[r][k] (f32) the k largest of softmax(x[r]), largest
   first, lower index first among equals; p may be a NULL buffer (ids only) */
int dev_argmax_rows(Device *d, DevBuf ids, DevBuf x, DevBuf rows_buf, int max_rows, int cols);
int dev_softmax_rows(Device *d, DevBuf y, DevBuf x, DevBuf rows_buf, int max_rows, int cols);
/* y[r] = softmax(x[r] / temp), each x divided by temp (an IEEE division, as a sampler's
   temperature) before the softmax's own arithmetic; temp > 0 */
int dev_softmax_temp_rows(Device *d, DevBuf y, DevBuf x, DevBuf rows_buf, int max_rows, int cols, float temp);
int dev_topk_rows(Device *d, DevBuf ids, DevBuf p, DevBuf x, DevBuf rows_buf, int max_rows, int cols, int k);

/* the kernels model/ runs on a device's buffers (pointers where dev_host puts them),
   each with its backend.h namesake's arguments and bits */
typedef struct {
    const char *name;
    int (*has_wtype)(WType wt); /* the weight types its matmul multiplies */
    int file_blocks;            /* block-type weights as the file's rows of blocks, not k_pack's */
    void (*matmul)(float *y, const float *x, const void *packed, WType wt, int n, int cols, int rows);
    /* the same product by the vendor's library (cuBLAS on the GPU): fast for many rows of
       x, not the spec's bits; NULL where there is none */
    void (*matmul_fast)(float *y, const float *x, const void *packed, WType wt, int n, int cols, int rows);
    /* file_blocks: matmul's product into rows ldy floats apart (y[t][r] at y + t·ldy + r),
       for one source of a stacked matrix whose sources differ in type */
    void (*matmul_ld)(float *y, size_t ldy, const float *x, const void *w, WType wt, int n, int cols, int rows);
    void (*rmsnorm)(float *y, const float *x, const float *g, int n, int dim, float eps);
    void (*rope)(float *x, size_t stride, const int32_t *pos, int n, int n_heads, int head_dim, const float *cos_t,
                 const float *sin_t);
    void (*add)(float *y, const float *x, size_t n);
    void (*add_rows)(float *y, size_t stride, const float *x, int n, int cols);
    void (*silu_mul_rows)(float *y, const float *gu, int n, int cols);
    void (*kv_write)(KVType t, void *k, void *v, float *ks, float *vs, size_t block_stride, size_t scale_stride,
                     int block_size, int n_kv, int hd, const int *const *table, const int32_t *slot, const float *src,
                     size_t src_stride, size_t v_off, int n);
    void (*attention_rel)(const AttnArgs *a);
    /* k_row_to_f32 of rows[i] into y[i] for i < n: the embedding lookup */
    void (*rows_to_f32)(float *y, const void *w, WType wt, const int32_t *rows, int n, int cols);
    /* what dev_move_cols_elem runs (cuda_kernels.h's cuda_move_cols) */
    void (*move_cols)(void *base, const int64_t *list, const int32_t *count, int max_count, int len, size_t stride,
                      int elem_bytes);
    /* what dev_argmax_rows, dev_softmax(_temp)_rows (temp 0: none) and dev_topk_rows run,
       the row count read from rows when they run (cuda_kernels.h's row ops) */
    void (*argmax_rows)(int32_t *ids, const float *x, const int32_t *rows, int max_rows, int cols);
    void (*softmax_rows)(float *y, const float *x, const int32_t *rows, int max_rows, int cols, float temp);
    void (*topk_rows)(int32_t *ids, float *p, const float *x, const int32_t *rows, int max_rows, int cols, int k);
} KernelSet;
const KernelSet *dev_kernels(const Device *d);

/* a host function as a stream call (host-memory devices only: how model/ runs its CPU kernels in
   stream order and inside a graph); args (bytes copied) are handed to fn */
int dev_host_call(Device *d, void (*fn)(const void *args), const void *args, size_t bytes);

#endif
