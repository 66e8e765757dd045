/* rows.cu — argmax, softmax and top-k over rows, as device_cpu.c's row ops compute them
   with k_argmax and k_softmax (kernels/cpu/ops.c): one block of 16 threads per row,
   thread l the spec's lane l (the indices i = l mod 16, ascending), then the halving
   trees over the lanes in thread 0. The row count is read when the kernel runs. */
#include "cuda_kernels.h"
#include "spec.cuh"

#define LANES 16

static __device__ __forceinline__ int row_count(const int32_t *rows, int max_rows) {
    int n = *rows;
    return n < 0 ? 0 : n > max_rows ? max_rows : n;
}

/* the row's value at i: x, or x / temp (an IEEE division, before anything else) */
static __device__ __forceinline__ float at(const float *x, int i, float temp) {
    return temp != 0 ? __fdiv_rn(x[i], temp) : x[i];
}

/* max16 of the row into *m (every thread) */
static __device__ float row_max(const float *x, int cols, float temp, float *lanes, float *m) {
    int l = threadIdx.x;
    float v = -INFINITY;
    for (int i = l; i < cols; i += LANES) v = max1(v, at(x, i, temp));
    lanes[l] = v;
    __syncthreads();
    if (l == 0) *m = tree_max16(lanes);
    __syncthreads();
    return *m;
}

/* exp_sum's 16 lane sums of exp1(x - m), their tree, and 1 / that (every thread) */
static __device__ float row_inv_sum(const float *x, int cols, float temp, float m, float *lanes, float *inv) {
    int l = threadIdx.x;
    float s = 0.0f;
    for (int i = l; i < cols; i += LANES) s += exp1(at(x, i, temp) - m);
    lanes[l] = s;
    __syncthreads();
    if (l == 0) *inv = __fdiv_rn(1.0f, tree_sum16(lanes));
    __syncthreads();
    return *inv;
}

static __global__ void argmax_kernel(int32_t *ids, const float *x, const int32_t *rows, int max_rows, int cols) {
    __shared__ float lanes[LANES];
    __shared__ float m;
    __shared__ int first[LANES];
    int r = blockIdx.x, l = threadIdx.x;
    if (r >= row_count(rows, max_rows)) return; /* the whole block leaves: no barrier is left waiting */
    const float *xr = x + (size_t)r * cols;
    float mx = row_max(xr, cols, 0.0f, lanes, &m);
    int f = cols; /* the lowest index of this lane equal to the maximum (none when it is NaN) */
    for (int i = l; i < cols; i += LANES)
        if (xr[i] == mx) {
            f = i;
            break;
        }
    first[l] = f;
    __syncthreads();
    if (l == 0) {
        int best = cols;
        for (int k = 0; k < LANES; k++) best = first[k] < best ? first[k] : best;
        ids[r] = best < cols ? best : 0;
    }
}

static __global__ void softmax_kernel(float *y, const float *x, const int32_t *rows, int max_rows, int cols,
                                      float temp) {
    __shared__ float lanes[LANES];
    __shared__ float m, inv;
    int r = blockIdx.x, l = threadIdx.x;
    if (r >= row_count(rows, max_rows)) return;
    const float *xr = x + (size_t)r * cols;
    float *yr = y + (size_t)r * cols;
    float mx = row_max(xr, cols, temp, lanes, &m);
    float iv = row_inv_sum(xr, cols, temp, mx, lanes, &inv);
    /* each thread reads and writes only its own indices, so y may be x */
    for (int i = l; i < cols; i += LANES) yr[i] = exp1(at(xr, i, temp) - mx) * iv;
}

/* top-k: each lane keeps the k largest probabilities of its indices (an insertion list,
   larger first, the earlier index first among equals: its indices ascend), then thread
   0 merges the 16 lists, taking the largest head, the lower index among equals */
static __global__ void topk_kernel(int32_t *ids, float *p, const float *x, const int32_t *rows, int max_rows, int cols,
                                   int k) {
    __shared__ float lanes[LANES];
    __shared__ float m, inv;
    CUEMU_DYN_SHARED(float, dyn); /* [LANES][k] probabilities, then [LANES][k] ids */
    int r = blockIdx.x, l = threadIdx.x;
    if (r >= row_count(rows, max_rows)) return;
    const float *xr = x + (size_t)r * cols;
    float mx = row_max(xr, cols, 0.0f, lanes, &m);
    float iv = row_inv_sum(xr, cols, 0.0f, mx, lanes, &inv);
    float *pv = dyn + (size_t)l * k;
    int *id = (int *)(dyn + (size_t)LANES * k) + (size_t)l * k;
    int have = 0;
    for (int c = l; c < cols; c += LANES) {
        float v = exp1(xr[c] - mx) * iv;
        if (have == k && !(v > pv[have - 1])) continue;
        int a = have < k ? have++ : have - 1;
        for (; a > 0 && v > pv[a - 1]; a--) pv[a] = pv[a - 1], id[a] = id[a - 1];
        pv[a] = v, id[a] = c;
    }
    for (int j = have; j < k; j++) id[j] = -1;
    __syncthreads();
    if (l == 0) {
        int head[LANES] = {0};
        const int *ids0 = (const int *)(dyn + (size_t)LANES * k);
        int32_t *io = ids + (size_t)r * k;
        for (int j = 0; j < k; j++) {
            int b = -1;
            for (int q = 0; q < LANES; q++) {
                if (head[q] >= k || ids0[q * k + head[q]] < 0) continue;
                if (b < 0) {
                    b = q;
                    continue;
                }
                float vq = dyn[q * k + head[q]], vb = dyn[b * k + head[b]];
                if (vq > vb || (vq == vb && ids0[q * k + head[q]] < ids0[b * k + head[b]])) b = q;
            }
            io[j] = b < 0 ? -1 : ids0[b * k + head[b]];
            if (p) p[(size_t)r * k + j] = b < 0 ? 0.0f : dyn[b * k + head[b]];
            if (b >= 0) head[b]++;
        }
    }
}

void cuda_argmax_rows(int32_t *ids, const float *x, const int32_t *rows, int max_rows, int cols) {
    if (max_rows > 0 && cols > 0)
        CUEMU_LAUNCH(argmax_kernel, dim3(max_rows), dim3(LANES), 0, ids, x, rows, max_rows, cols);
}
void cuda_softmax_rows(float *y, const float *x, const int32_t *rows, int max_rows, int cols, float temp) {
    if (max_rows > 0 && cols > 0)
        CUEMU_LAUNCH(softmax_kernel, dim3(max_rows), dim3(LANES), 0, y, x, rows, max_rows, cols, temp);
}
void cuda_topk_rows(int32_t *ids, float *p, const float *x, const int32_t *rows, int max_rows, int cols, int k) {
    if (max_rows > 0 && cols > 0 && k > 0)
        CUEMU_LAUNCH(topk_kernel, dim3(max_rows), dim3(LANES), (size_t)LANES * k * 2 * sizeof(float), ids, p, x, rows,
                     max_rows, cols, k);
}
