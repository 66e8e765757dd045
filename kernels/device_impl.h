/* device_impl.h — the device objects as the backends share them (kernels/cpu/device_cpu.c
   runs the "cpu" and "cuemu" devices and hands a "cuda" device's calls to
   kernels/cuda/device_cuda.c). Not for model/: it sees device.h only. */
#ifndef PD_DEVICE_IMPL_H
#define PD_DEVICE_IMPL_H
#include "device.h"

struct DevMem {
    unsigned char *p; /* host memory, or device memory on a GPU */
    size_t size;
    int owned; /* 0: wrapped caller memory */
};

typedef struct {
    void (*fn)(const void *args);
    size_t bytes;
    _Alignas(16) unsigned char args[]; /* the call's arguments, copied */
} Call;

struct DevGraph {
    Call **calls; /* host devices: the captured calls */
    int n, cap;
    void *native; /* a GPU's: its state (device_cuda.c) */
};

struct Device {
    const KernelSet *k;  /* its kernels: the kind */
    DevGraph *capturing; /* non-NULL between graph_begin and graph_end */
    uint64_t done;       /* host devices: calls completed */
    void *native;        /* a GPU's stream and state; NULL on the host devices */
};

struct DevEvent {
    uint64_t at;  /* host devices: the stream's count when recorded; 0 = never */
    void *native; /* a GPU's event */
};

int dev_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2))); /* sets dev_errmsg; -1 */

#ifdef PD_CUDA
/* device_cuda.c: the "cuda" device. open fills d (k, native) or fails naming why */
int cudev_open(Device *d);
void cudev_close(Device *d);
int cudev_alloc(Device *d, size_t bytes, DevBuf *out);
int cudev_wrap(Device *d, const void *host, size_t bytes, DevBuf *out);
void cudev_free(Device *d, DevBuf b);
int cudev_upload(Device *d, DevBuf dst, const void *src, size_t n);
int cudev_download(Device *d, void *dst, DevBuf src, size_t n);
int cudev_copy(Device *d, DevBuf dst, DevBuf src, size_t n);
int cudev_submit(Device *d, void (*fn)(const void *), const void *args);
int cudev_sync(Device *d);
int cudev_event_new(DevEvent *e);
void cudev_event_free(DevEvent *e);
int cudev_record(Device *d, DevEvent *e);
int cudev_wait(Device *d, DevEvent *e);
int cudev_event_done(DevEvent *e);
int cudev_graph_begin(Device *d);
int cudev_graph_end(Device *d, DevGraph *g);
int cudev_graph_replay(Device *d, const DevGraph *g);
void cudev_graph_free(DevGraph *g);
int cudev_graph_calls(const DevGraph *g);
#endif

#endif
