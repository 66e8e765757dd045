/* attention.cu — k_attention / k_attention_rel (kernels/cpu/attention.c) bit for bit, for
   every KVType: one block of ATT_THREADS threads per (token, query head, FlashDecoding
   chunk of ATT_SPLIT keys), then one per (token, query head) that recombines a split
   token's chunks (backend.h's spec).
   Token t's keys are j = 0 .. nk-1: slot j for j < n_ctx[t], then the visible slots
   extra[j - n_ctx[t]] (plus n_ctx[t] for _rel). The CPU reads the extras that continue
   the committed run (slot = j) from the blocks like committed keys, so its committed
   count nc is n_ctx[t] plus that run; the rest are "lone" keys, which matters only for
   the maximum's order. The spec, per head and chunk:
     score_j = (sequential FMA chain over d of q[d] * k_j[d]) * scale
     max     = halving max tree over 16 lanes (lane j % 16 of keys j < nc, in j order),
               then max1(score_j, max) for each lone key in j order
     e_j     = exp1(score_j - max), sum = halving tree of 16 lanes of Σ e_j (j % 16)
     out[d]  = halving tree of 16 partials fmaf(e_j, v_j[d], acc[j % 16]), times 1 / sum
               (a split token's chunk keeps the tree and the sum for the recombination).
   A chunk's scores sit in shared memory. Threads over keys for the scores (each its
   own chain); the 16 lanes of the maximum and the sum are threads 0-15 walking their
   lane in key order; the weighted sums are threads over (dimension, lane) pairs with
   their partials in dynamic shared memory. Build with nvcc -fmad=false: only
   __fmaf_rn fuses. */
#include "cuda_kernels.h"
#include "spec.cuh"

#define ATT_THREADS 64

/* one (token, kv head)'s view of the cache */
struct View {
    const AttnArgs *a;
    const int *row; /* the token's block table */
    int kvh;
    const int *extra; /* the token's visible slots (less base) */
    int n_ctx, base;
};

/* key j's slot */
static __device__ __forceinline__ int slot_of(const View &w, int j) {
    return j < w.n_ctx ? j : w.base + w.extra[j - w.n_ctx];
}

/* element d of slot's key (val 0) or value (val 1) as attention.c's elem() computes it */
static __device__ __forceinline__ float elem(const View &w, int val, int slot, int d) {
    const AttnArgs *a = w.a;
    int bs = a->block_size, blk = slot / bs, col = slot - blk * bs;
    size_t b = (size_t)w.row[blk];
    size_t at = b * a->block_stride + (size_t)w.kvh * a->hd * bs + col + (size_t)d * bs;
    switch (a->kv_type) {
    case KV_BF16:
        return bits_f32((uint32_t)((const uint16_t *)(val ? a->vq : a->kq))[at] << 16);
    case KV_Q8_0:
        return (val ? a->v_scale : a->k_scale)[b * a->scale_stride + (size_t)w.kvh * bs + col] *
               (float)((const int8_t *)(val ? a->vq : a->kq))[at];
    default:
        return (val ? a->v : a->k)[at];
    }
}

/* this thread's scores of chunk [j0, j1) into s[j - j0] */
static __device__ void chunk_scores(const View &w, const float *q, float *s, int j0, int j1) {
    for (int j = j0 + (int)threadIdx.x; j < j1; j += ATT_THREADS) {
        int slot = slot_of(w, j);
        float acc = 0.0f;
        for (int d = 0; d < w.a->hd; d++) acc = __fmaf_rn(q[d], elem(w, 0, slot, d), acc);
        s[j - j0] = acc * w.a->scale;
    }
}

static __device__ __forceinline__ int keys_of(const AttnArgs *a, int t) {
    return a->n_ctx[t] + a->extra_off[t + 1] - a->extra_off[t];
}

/* block (token, query head, chunk): the chunk's keys as a token with only those keys;
   a token of one chunk writes out, a split one its chunk's o, m and sum */
static __global__ void attention_kernel(AttnArgs A, int rel, int mc, int t0) {
    __shared__ float s[ATT_SPLIT]; /* the chunk's scores, then its exponents */
    __shared__ float lanes[16];
    __shared__ float mx_sh, sum_sh;
    __shared__ int nc_sh;
    CUEMU_DYN_SHARED(float, dyn);
    const AttnArgs *a = &A;
    int hd = a->hd, c = blockIdx.x % mc, t = t0 + blockIdx.x / mc / a->n_heads, h = blockIdx.x / mc % a->n_heads;
    int tid = threadIdx.x, n_ctx = a->n_ctx[t], nk = keys_of(a, t), nch = attn_chunks(nk);
    float *out = a->out + (size_t)t * a->n_heads * hd + (size_t)h * hd;
    if (nch > mc) { /* no room for its chunks: a visible failure, not other bits */
        for (int d = tid; d < hd && c == 0; d += ATT_THREADS) out[d] = NAN;
        return;
    }
    if (c >= nch) return;
    float *acc = dyn;         /* [hd][16]: the weighted sums' partials, pair p = d * 16 + lane */
    float *q = dyn + 16 * hd; /* [hd] */
    View w = {a, a->table[t], h / (a->n_heads / a->n_kv), a->extra + a->extra_off[t], n_ctx, rel ? n_ctx : 0};
    const float *qt = a->q + (size_t)t * a->q_stride + (size_t)h * hd;
    for (int d = tid; d < hd; d += ATT_THREADS) q[d] = qt[d];
    for (int p = tid; p < 16 * hd; p += ATT_THREADS) acc[p] = 0.0f;
    if (tid < 16) lanes[tid] = -INFINITY; /* what the tree reads when there are no committed keys */
    if (tid == 0) { /* the CPU's committed count: the extras that continue slots n_ctx, n_ctx + 1, ... */
        int run = 0, n_extra = nk - n_ctx;
        while (run < n_extra && w.extra[run] + w.base == n_ctx + run) run++;
        nc_sh = n_ctx + run;
    }
    __syncthreads();
    int nc = nc_sh, j0 = c * ATT_SPLIT, j1 = nk - j0 < ATT_SPLIT ? nk : j0 + ATT_SPLIT;

    /* the maximum: the committed keys' 16 lanes by the tree, then the lone keys' chain */
    chunk_scores(w, q, s, j0, j1);
    __syncthreads();
    if (tid < 16) {
        float lane = -INFINITY;
        for (int j = j0 + tid; j < j1 && j < nc; j += 16) lane = max1(lane, s[j - j0]);
        lanes[tid] = lane;
    }
    __syncthreads();
    if (tid == 0) {
        float m = tree_max16(lanes);
        for (int j = j0 > nc ? j0 : nc; j < j1; j++) m = max1(s[j - j0], m);
        mx_sh = m;
    }
    __syncthreads();
    float mx = mx_sh;

    /* exponents, their lane sums, the weighted sums' partials */
    for (int j = j0 + tid; j < j1; j += ATT_THREADS) s[j - j0] = exp1(s[j - j0] - mx); /* own keys only */
    __syncthreads();
    if (tid < 16) {
        float sum = 0.0f;
        for (int j = j0 + tid; j < j1; j += 16) sum += s[j - j0];
        lanes[tid] = sum;
    }
    for (int p = tid; p < 16 * hd; p += ATT_THREADS) { /* adjacent threads: adjacent lanes, adjacent slots */
        int d = p / 16, l = p % 16;
        float r = acc[p];
        for (int j = j0 + l; j < j1; j += 16) r = __fmaf_rn(s[j - j0], elem(w, 1, slot_of(w, j), d), r);
        acc[p] = r;
    }
    __syncthreads();
    if (tid == 0) sum_sh = tree_sum16(lanes);
    __syncthreads();
    if (nch == 1) {
        float inv = __fdiv_rn(1.0f, sum_sh); /* the division comes last, as the CPU */
        for (int d = tid; d < hd; d += ATT_THREADS) out[d] = tree_sum16(acc + 16 * d) * inv;
        return;
    }
    float *part = a->split + (((size_t)(t - t0) * a->n_heads + h) * a->max_chunks + c) * (hd + 2);
    for (int d = tid; d < hd; d += ATT_THREADS) part[d] = tree_sum16(acc + 16 * d);
    if (tid == 0) part[hd] = mx, part[hd + 1] = sum_sh;
}

/* block (token, query head): a split token's chunks in chunk order, backend.h's spec;
   each chunk's weight exp1(m_c - m) once, in dynamic shared memory [max_chunks] */
static __global__ void combine_kernel(AttnArgs A, int t0) {
    __shared__ float m_sh, inv_sh;
    CUEMU_DYN_SHARED(float, wt);
    const AttnArgs *a = &A;
    int hd = a->hd, t = t0 + blockIdx.x / a->n_heads, h = blockIdx.x % a->n_heads, nch = attn_chunks(keys_of(a, t));
    if (nch == 1 || nch > a->max_chunks) return;
    const float *part = a->split + ((size_t)(t - t0) * a->n_heads + h) * a->max_chunks * (hd + 2);
    if (threadIdx.x == 0) {
        float m = part[hd];
        for (int c = 1; c < nch; c++) m = max1(m, part[(size_t)c * (hd + 2) + hd]);
        m_sh = m;
    }
    __syncthreads();
    for (int c = threadIdx.x; c < nch; c += ATT_THREADS) wt[c] = exp1(part[(size_t)c * (hd + 2) + hd] - m_sh);
    __syncthreads();
    if (threadIdx.x == 0) {
        float sum = 0.0f;
        for (int c = 0; c < nch; c++) sum = __fmaf_rn(part[(size_t)c * (hd + 2) + hd + 1], wt[c], sum);
        inv_sh = __fdiv_rn(1.0f, sum);
    }
    __syncthreads();
    float *out = a->out + (size_t)t * a->n_heads * hd + (size_t)h * hd;
    for (int d = threadIdx.x; d < hd; d += ATT_THREADS) {
        float o = 0.0f;
        for (int c = 0; c < nch; c++) o = __fmaf_rn(part[(size_t)c * (hd + 2) + d], wt[c], o);
        out[d] = o * inv_sh;
    }
}

/* split_tokens tokens a pass when there is room for chunks, all at once otherwise */
static void launch(const AttnArgs *a, int rel) {
    if (a->n <= 0 || a->n_heads <= 0 || a->hd <= 0) return;
    int split = a->split && a->max_chunks > 1 && a->split_tokens > 0;
    int mc = split ? a->max_chunks : 1, per = split ? a->split_tokens : a->n;
    size_t shmem = (size_t)17 * a->hd * sizeof(float); /* partials [hd][16] and q [hd] */
    for (int t0 = 0; t0 < a->n; t0 += per) {
        unsigned nt = (unsigned)(a->n - t0 < per ? a->n - t0 : per);
        CUEMU_LAUNCH(attention_kernel, dim3(nt * a->n_heads * mc), dim3(ATT_THREADS), shmem, *a, rel, mc, t0);
        if (split)
            CUEMU_LAUNCH(combine_kernel, dim3(nt * a->n_heads), dim3(ATT_THREADS), sizeof(float) * (size_t)mc, *a, t0);
    }
}

void cuda_attention(const AttnArgs *a) { launch(a, 0); }
void cuda_attention_rel(const AttnArgs *a) { launch(a, 1); }
