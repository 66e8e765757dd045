/* runner.h — what one thread needs to run a model: a device stream, the model's weights
   as device buffers, and the forward pass's workspace (grown on demand). The Model is
   const after loading, so any number of runners, in any threads, share one. */
#ifndef PD_RUNNER_H
#define PD_RUNNER_H
#include "device.h"
#include "model/model.h"

/* the per-call step descriptor (forward.c builds it once per forward_layers call in a host
   copy and uploads it in stream order, so a replayed graph reads this call's): per token
   its id, position, sequence, slot offset after the sequence's committed slots (its rank
   among the batch's tokens of that sequence), its block-table row, its visibility list
   (offsets like the rank, of the batch tokens it sees, itself last), and per layer of the
   call its sequence's committed length and its slot (a layer's length changes only in that
   layer, so all are known up front) */
typedef struct {
    int n, layers;                     /* tokens; layers of the call */
    int32_t *token, *pos, *seq, *rank; /* [n] */
    int32_t *vis_off;                  /* [n+1] */
    int32_t *vis;                      /* [vis_off[n]] */
    const int **table;                 /* [n] block-table rows (kv_table_dev) */
    int32_t *base;                     /* [layers][n] committed slots in each layer */
    int32_t *slot;                     /* [layers][n] base + rank */
} StepDesc;

typedef struct Workspace {
    int cap_n;       /* tokens the buffers hold */
    size_t cap_vis;  /* visibility entries the descriptor holds */
    int cap_layers;  /* layers it holds lengths for */
    float *xb;       /* [n][dim] normed input */
    float *att;      /* [n][n_heads*hd] attention output */
    float *qkv;      /* [n][(n_heads + 2 n_kv)*hd] the stacked projection: q | k | v */
    float *gu;       /* [n][2 hidden] gate | up */
    float *hb;       /* [n][hidden] */
    float *out;      /* [n][dim] a branch's output before the residual add */
    float *hid;      /* [n][dim] the hidden states where the host cannot see the device's memory */
    DevBuf acts;     /* the activations above, one device buffer, each 64-byte aligned */
    DevBuf desc_buf; /* the step descriptor's arrays, one device buffer */
    StepDesc ddesc;  /* its arrays where the kernels see them (dev_ptr) */
    StepDesc desc;   /* the host copy forward.c builds, laid out as desc_buf */
    void *desc_host; /* that copy's one allocation, desc_bytes long */
    size_t desc_bytes;
    /* logits rows and what the row ops give back (logits_argmax, _topk, _softmax) */
    DevBuf lg, ids, probs, rows; /* [cap_rows][vocab], [cap_out], [cap_out], the row count */
    int cap_rows;
    size_t cap_out;
    /* attention's FlashDecoding chunks (AttnArgs.split) for this call:
       [ATT_SPLIT_TOKENS][n_heads][split_chunks][hd + 2] */
    DevBuf split_buf;
    float *split;
    size_t cap_split; /* floats */
    int split_chunks;
    /* the trainers' products' x and y where the host cannot see the device's memory (product.c) */
    DevBuf mx, my;
    size_t cap_mx, cap_my; /* floats */
    unsigned gen;          /* counts the buffers' re-carvings: a GPU graph holds their addresses */
} Workspace;

/* the weights one layer's kernels read, at the device's addresses (types and shapes
   as the Model's Layer) */
typedef struct {
    const void *w; /* the source's rows of blocks */
    WType t;
    int rows;
} DevPart;
typedef struct {
    const float *attn_norm, *ffn_norm;   /* [dim] */
    const float *bq, *bk, *bv;           /* biases, or NULL */
    const void *qkv, *wo, *gate_up, *w2; /* packed */
    /* a file_blocks device's q | k | v or gate | up whose sources differ in block type:
       the sources one by one (matmul_ld each); 0 parts otherwise */
    DevPart qkv_part[3], gu_part[2];
    int qkv_parts, gu_parts;
} DevLayer;

/* the Model's memory the kernels read, on the runner's device: its packed matrices, its
   arena (norms, biases, RoPE tables) and the embedding as stored. The CPU wraps them in
   place; a GPU (and cuemu, as one) copies them in once, one copy per Model and device
   kind whatever the number of runners (runner.c). */
typedef struct {
    DevBuf packed, arena, embed_buf;
    DevLayer *layers;        /* [n_layers] */
    const void *embed;       /* [vocab][dim] as stored */
    const float *final_norm; /* [dim] */
    const void *lm_head;     /* packed */
    const float *cos, *sin;  /* [seq_len][hd/2] */
} DevWeights;

typedef struct Runner {
    const Model *m;
    Device *dev;
    const KernelSet *k;    /* the device's kernels */
    int fast;              /* the products by the device's matmul_fast (--fast-prefill) where it has one */
    int given;             /* layer 0's input is the hidden states given, never embedding rows (the
                              runner of an EAGLE head's layer, which runs on its own inputs) */
    DevWeights w;          /* the shared copy's addresses */
    struct Shared *shared; /* that copy (runner.c), counted */
    Workspace ws;
    DevEvent *ran; /* runner_after's mark on this stream (made when first needed) */
} Runner;

/* a runner on the device model_device named (the CPU's by default); NULL + message
   when out of memory or when the device has no kernel for the model's weights */
Runner *runner_new(const Model *m);
void runner_free(Runner *r); /* after what its stream still runs */
/* the device kind the runner runs on ("cpu", "cuemu", "cuda") */
const char *runner_kind(const Runner *r);
/* can the host read the runner's buffers (the CPU), so its kernels work on host memory in place? */
int runner_host_visible(const Runner *r);
/* a's later calls wait for the calls queued on b so far (two runners are two streams:
   an event on b's, waited for on a's); -1 + message */
int runner_after(Runner *a, Runner *b);
/* workspace for n tokens, vis visibility entries and a call over layers layers (grows,
   never shrinks) */
int runner_reserve(Runner *r, int n, size_t vis, int layers);
/* room for n tokens' attention chunks, chunks each (1: none needed), as the call's layout */
int runner_reserve_split(Runner *r, int n, int chunks);

#endif
