/* runner.h — what one thread needs to run a model: a device stream, the model's weights
   as device buffers, and the forward pass's workspace (grown on demand). The Model is
   const after loading, so any number of runners, in any threads, share one. */
#ifndef PD_RUNNER_H
#define PD_RUNNER_H
#include "device.h"
#include "model/model.h"

/* the per-call step descriptor (forward.c builds it once per forward_layers call, in
   one device buffer): per token its id, position, sequence, slot offset after the
   sequence's committed slots (its rank among the batch's tokens of that sequence), its
   block-table row, and its visibility list (offsets like the rank, of the batch tokens
   it sees, itself last) */
typedef struct {
    int n;
    int32_t *token, *pos, *seq, *rank; /* [n] */
    int32_t *vis_off;                  /* [n+1] */
    int32_t *vis;                      /* [vis_off[n]] */
    const int **table;                 /* [n] block-table rows (host pointers on the CPU) */
    int32_t *base;                     /* [n] committed slots in the current layer */
    int32_t *slot;                     /* [n] base + rank */
} StepDesc;

typedef struct Workspace {
    int cap_n;        /* tokens the buffers hold */
    size_t cap_vis;   /* visibility entries the descriptor holds */
    float *xb;        /* [n][dim] normed input */
    float *att;       /* [n][n_heads*hd] attention output */
    float *qkv;       /* [n][(n_heads + 2 n_kv)*hd] the stacked projection: q | k | v */
    float *gu;        /* [n][2 hidden] gate | up */
    float *hb;        /* [n][hidden] */
    float *out;       /* [n][dim] a branch's output before the residual add */
    DevBuf acts;         /* the activations above, one device buffer, each 64-byte aligned */
    DevBuf desc_buf;     /* the step descriptor's arrays, one device buffer */
    StepDesc desc;    /* its arrays, where the CPU sees them */
} Workspace;

typedef struct Runner {
    const Model *m;
    Device *dev;
    DevBuf packed;   /* the model's packed matrices, wrapped (the CPU makes no copy) */
    Workspace ws;
} Runner;

/* a runner on the CPU device; NULL + message when out of memory */
Runner *runner_new(const Model *m);
void runner_free(Runner *r);
/* workspace for n tokens and vis visibility entries (grows, never shrinks) */
int runner_reserve(Runner *r, int n, size_t vis);

#endif
