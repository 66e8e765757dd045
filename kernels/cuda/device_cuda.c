/* device_cuda.c — the "cuda" device over the CUDA runtime: one stream per Device,
   cudaMalloc'd memory (dev_wrap copies: a GPU cannot read the host's), events, and
   graphs captured from the stream (cudaStreamBeginCapture) and replayed as one launch.
   A call (device_cpu.c's submit) is a host function that launches kernels/cuda's
   kernels: it runs at once with pd_cuda_stream() naming this device's stream, so under
   capture its launches become the graph's nodes. Built only with nvcc (make CUDA=1). */
#define PD_CUDA_GPU_NAMES
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_kernels.h"
#include "device_impl.h"

typedef struct {
    cudaStream_t stream;
    char name[256]; /* its name, for the messages */
    void **staged;  /* pinned copies of the uploads of the graph being captured */
    int n_staged, cap_staged;
} Gpu;

typedef struct {
    cudaGraphExec_t exec;
    size_t nodes;
    void **staged; /* the uploads' sources, freed with the graph */
    int n_staged;
} GpuGraph;

static _Thread_local cudaStream_t cur_stream;
static _Thread_local char launch_err[192]; /* the first failed launch since the call began */

cudaStream_t pd_cuda_stream(void) { return cur_stream; }
void pd_cuda_launched(const char *kernel) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess && !launch_err[0])
        snprintf(launch_err, sizeof launch_err, "kernel %s: %s", kernel, cudaGetErrorString(e));
}

static int cuda_fail(const char *what, cudaError_t e) {
    return dev_fail("device cuda: %s: %s", what, cudaGetErrorString(e));
}
#define CK(what, call)                                                                                                 \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) return cuda_fail(what, e_);                                                             \
    } while (0)

static Gpu *gpu(const Device *d) { return d->native; }

/* --fast-prefill's product: cuBLAS's FP32 GEMM on k_pack's f32 layout, whose 64-row
   blocks are column-major [W][cols] matrices (W the block's padded width): the full
   blocks as one strided batch, the last block alone. bf16 weights are first widened to
   that layout, CHUNK rows at a time, in a scratch buffer of the thread's. Not the spec's
   bits: cuBLAS picks its own reduction order. */
#define FAST_BLOCK 64
#define FAST_CHUNK 8192
static _Thread_local cublasHandle_t blas;
static _Thread_local float *fast_scratch;
static _Thread_local size_t fast_cap; /* floats */

/* y[t][r] (row stride ldy) for the rows of w, f32 k_pack layout */
static void gemm_blocks(const float *w, float *y, int ldy, const float *x, int n, int cols, int rows) {
    const float one = 1, zero = 0;
    int full = rows / FAST_BLOCK, tail = rows % FAST_BLOCK, tw = (tail + 15) / 16 * 16;
    cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
    if (full)
        s = cublasSgemmStridedBatched(blas, CUBLAS_OP_N, CUBLAS_OP_N, FAST_BLOCK, n, cols, &one, w, FAST_BLOCK,
                                      (long long)FAST_BLOCK * cols, x, cols, 0, &zero, y, ldy, FAST_BLOCK, full);
    if (s == CUBLAS_STATUS_SUCCESS && tail)
        s = cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, tail, n, cols, &one, w + (size_t)full * FAST_BLOCK * cols, tw,
                        x, cols, &zero, y + (size_t)full * FAST_BLOCK, ldy);
    if (s != CUBLAS_STATUS_SUCCESS && !launch_err[0])
        snprintf(launch_err, sizeof launch_err, "cuBLAS GEMM: status %d", (int)s);
}

static void gpu_matmul_fast(float *y, const float *x, const void *packed, WType wt, int n, int cols, int rows) {
    if (n <= 0 || rows <= 0) return;
    if (wt != WT_F32 && wt != WT_BF16) { /* block types: the exact kernel */
        cuda_matmul(y, x, packed, wt, n, cols, rows);
        return;
    }
    if (!blas && cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
        blas = NULL;
        snprintf(launch_err, sizeof launch_err, "cuBLAS: cannot create a handle");
        return;
    }
    cublasSetStream(blas, cur_stream);
    if (wt == WT_F32) {
        gemm_blocks(packed, y, rows, x, n, cols, rows);
        return;
    }
    size_t need = (size_t)FAST_CHUNK * cols;
    if (need > fast_cap) {
        cudaFree(fast_scratch);
        fast_cap = 0;
        if (cudaMalloc((void **)&fast_scratch, sizeof(float) * need) != cudaSuccess) {
            fast_scratch = NULL;
            snprintf(launch_err, sizeof launch_err, "cuBLAS: no room for a %zu-float scratch", need);
            return;
        }
        fast_cap = need;
    }
    for (int r0 = 0; r0 < rows; r0 += FAST_CHUNK) {
        int m = rows - r0 < FAST_CHUNK ? rows - r0 : FAST_CHUNK;
        cuda_unpack_bf16(fast_scratch, packed, cols, rows, r0, m);
        gemm_blocks(fast_scratch, y + r0, rows, x, n, cols, m); /* the chunk's rows of y */
    }
}
static const KernelSet gpu_kernels = {.name = "cuda", .matmul_fast = gpu_matmul_fast, CUDA_KERNEL_SET};

int cudev_open(Device *d) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1)
        return dev_fail("device cuda: no CUDA GPU here (%s)",
                        e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found none");
    Gpu *g = calloc(1, sizeof *g);
    if (!g) return dev_fail("device cuda: out of memory");
    struct cudaDeviceProp p;
    if ((e = cudaSetDevice(0)) != cudaSuccess || (e = cudaGetDeviceProperties(&p, 0)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        free(g);
        return cuda_fail("opening GPU 0", e);
    }
    snprintf(g->name, sizeof g->name, "%s", p.name);
    d->k = &gpu_kernels, d->native = g;
    return 0;
}

void cudev_close(Device *d) {
    Gpu *g = gpu(d);
    cudaStreamSynchronize(g->stream);
    cudaStreamDestroy(g->stream);
    for (int i = 0; i < g->n_staged; i++) cudaFreeHost(g->staged[i]);
    free(g->staged);
    free(g);
    d->native = NULL;
}

/* what a failed allocation says: what it wanted and what the GPU has free */
static int oom(const Device *d, size_t bytes, cudaError_t e) {
    size_t free_b = 0, total = 0;
    cudaGetLastError(); /* the failure is reported here, not by the next launch */
    if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) free_b = total = 0;
    return dev_fail("device cuda (%s): cannot allocate %.1f MiB: %.1f MiB free of %.1f MiB (%s)", gpu(d)->name,
                    bytes / 1048576.0, free_b / 1048576.0, total / 1048576.0, cudaGetErrorString(e));
}

static int gpu_mem(Device *d, size_t bytes, DevBuf *out) {
    *out = (DevBuf){0};
    DevMem *m = calloc(1, sizeof *m);
    if (!m) return dev_fail("device cuda: out of memory");
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 64);
    if (e != cudaSuccess) {
        free(m);
        return oom(d, bytes, e);
    }
    m->p = p, m->size = bytes, m->owned = 1;
    out->mem = m;
    return 0;
}

/* zeroed before it returns: another Device's stream (the KV cache's, a runner's) may be
   the first to touch it */
int cudev_alloc(Device *d, size_t bytes, DevBuf *out) {
    if (gpu_mem(d, bytes, out)) return -1;
    cudaError_t e = cudaMemsetAsync(out->mem->p, 0, bytes ? bytes : 64, gpu(d)->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(gpu(d)->stream);
    if (e != cudaSuccess) {
        cudev_free(d, *out);
        return cuda_fail("zeroing an allocation", e);
    }
    return 0;
}

int cudev_wrap(Device *d, const void *host, size_t bytes, DevBuf *out) {
    if (gpu_mem(d, bytes, out)) return -1;
    cudaError_t e = cudaMemcpy(out->mem->p, host, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        cudev_free(d, *out);
        return cuda_fail("copying weights in", e);
    }
    return 0;
}

/* freed once the stream has finished with it: cudaFree waits for the device */
void cudev_free(Device *d, DevBuf b) {
    (void)d;
    cudaFree(b.mem->p);
    free(b.mem);
}

/* under capture the bytes are copied to pinned memory the graph keeps, so the replay
   uploads them as they were (device.h's rule); else cudaMemcpyAsync from pageable
   memory has taken the bytes when it returns */
int cudev_upload(Device *d, DevBuf dst, const void *src, size_t n) {
    Gpu *g = gpu(d);
    if (!n) return 0;
    if (d->capturing) {
        void *pin;
        if (g->n_staged == g->cap_staged) {
            int cap = g->cap_staged ? 2 * g->cap_staged : 16;
            void **s = realloc(g->staged, sizeof *s * cap);
            if (!s) return dev_fail("device cuda: out of memory capturing an upload");
            g->staged = s, g->cap_staged = cap;
        }
        CK("staging an upload", cudaMallocHost(&pin, n));
        memcpy(pin, src, n);
        g->staged[g->n_staged++] = pin;
        src = pin;
    }
    CK("upload", cudaMemcpyAsync(dst.mem->p + dst.off, src, n, cudaMemcpyHostToDevice, g->stream));
    return 0;
}

int cudev_download(Device *d, void *dst, DevBuf src, size_t n) {
    Gpu *g = gpu(d);
    if (!n) return 0;
    CK("download", cudaMemcpyAsync(dst, src.mem->p + src.off, n, cudaMemcpyDeviceToHost, g->stream));
    return cudev_sync(d);
}

int cudev_copy(Device *d, DevBuf dst, DevBuf src, size_t n) {
    if (!n) return 0;
    CK("copy",
       cudaMemcpyAsync(dst.mem->p + dst.off, src.mem->p + src.off, n, cudaMemcpyDeviceToDevice, gpu(d)->stream));
    return 0;
}

int cudev_submit(Device *d, void (*fn)(const void *), const void *args) {
    cudaStream_t was = cur_stream;
    cur_stream = gpu(d)->stream;
    launch_err[0] = 0;
    fn(args);
    cur_stream = was;
    return launch_err[0] ? dev_fail("device cuda: %s", launch_err) : 0;
}

/* a kernel's fault shows at the next sync: the message names the GPU's error */
int cudev_sync(Device *d) {
    CK("a kernel failed before this sync", cudaStreamSynchronize(gpu(d)->stream));
    return 0;
}

int cudev_event_new(DevEvent *e) {
    cudaEvent_t ev;
    CK("creating an event", cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    e->native = ev;
    return 0;
}
void cudev_event_free(DevEvent *e) { cudaEventDestroy((cudaEvent_t)e->native); }

int cudev_record(Device *d, DevEvent *e) {
    CK("recording an event", cudaEventRecord((cudaEvent_t)e->native, gpu(d)->stream));
    e->at = 1;
    return 0;
}
int cudev_wait(Device *d, DevEvent *e) {
    if (!e->at) return dev_fail("device: waiting on an event never recorded");
    CK("waiting on an event", cudaStreamWaitEvent(gpu(d)->stream, (cudaEvent_t)e->native, 0));
    return 0;
}
int cudev_event_done(DevEvent *e) {
    if (!e->at) return -1;
    cudaError_t r = cudaEventQuery((cudaEvent_t)e->native);
    return r == cudaSuccess ? 1 : r == cudaErrorNotReady ? 0 : cuda_fail("event", r);
}

int cudev_graph_begin(Device *d) {
    CK("beginning a capture", cudaStreamBeginCapture(gpu(d)->stream, cudaStreamCaptureModeRelaxed));
    return 0;
}

/* the captured graph instantiated; it keeps the capture's staged uploads */
int cudev_graph_end(Device *d, DevGraph *out) {
    Gpu *g = gpu(d);
    GpuGraph *gg = calloc(1, sizeof *gg);
    cudaGraph_t graph;
    cudaError_t e = cudaStreamEndCapture(g->stream, &graph);
    if (e == cudaSuccess) {
        if (gg && (e = cudaGraphGetNodes(graph, NULL, &gg->nodes)) == cudaSuccess)
            e = cudaGraphInstantiate(&gg->exec, graph, 0);
        cudaGraphDestroy(graph);
    }
    if (!gg) {
        for (int i = 0; i < g->n_staged; i++) cudaFreeHost(g->staged[i]);
        free(g->staged);
    } else {
        gg->staged = g->staged, gg->n_staged = g->n_staged;
        out->native = gg;
    }
    g->staged = NULL, g->n_staged = g->cap_staged = 0;
    if (!gg) return dev_fail("device cuda: out of memory ending a capture");
    return e == cudaSuccess ? 0 : cuda_fail("ending a capture", e);
}

int cudev_graph_replay(Device *d, const DevGraph *g) {
    CK("replaying a graph", cudaGraphLaunch(((GpuGraph *)g->native)->exec, gpu(d)->stream));
    return 0;
}

void cudev_graph_free(DevGraph *g) {
    GpuGraph *gg = g->native;
    if (gg->exec) cudaGraphExecDestroy(gg->exec);
    for (int i = 0; i < gg->n_staged; i++) cudaFreeHost(gg->staged[i]);
    free(gg->staged);
    free(gg);
    g->native = NULL;
}

int cudev_graph_calls(const DevGraph *g) { return (int)((GpuGraph *)g->native)->nodes; }
