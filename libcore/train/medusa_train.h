/* medusa_train.h — training Medusa heads on a frozen model (Cai et al. 2024, Medusa-1).
   For each training sequence the model runs once (all layers, one KV sequence); its
   last hidden states h_t give x_t = norm(h_t) (final RMSNorm with its gain) and its
   greedy choices a_t = argmax E x_t. Head k (0-based; it predicts the token k + 2
   positions on, one past what the model's own head predicts) learns to minimise

       L = Σ_k w_k · mean_t CE(logits_k(x_t), y_{t,k})

   with y_{t,k} = a_{t+k+1} (targets self: what the model itself would say there,
   given the text up to t+k+1; on the model's own greedy text, its continuation) or
   the text's token at t+k+2 (targets data). Only W_k, b_k and an own lm_head E_k learn.
   Gradient, by hand (tests/test_medusa.c checks it against finite differences); with
   u = s x, z = W u + b, a = SiLU(z), r = (u + a) / s, l = E r (s: input_scale, 1 here):
       dCE/dl = softmax(l) - onehot(y)        [vocab]
       dE     = dl ⊗ r                         [vocab][dim]  (own lm_head only)
       dr     = Eᵀ dl                          [dim]
       dz     = dr / s ⊙ SiLU'(z),  SiLU'(z) = σ(z) (1 + z (1 - σ(z)))
       dW     = dz ⊗ u,   db = dz
   each head's sum averaged over its positions in the step and scaled by w_k; Adam.
   The big products are k_matmul calls over all positions of a sequence. */
#ifndef PD_MEDUSA_TRAIN_H
#define PD_MEDUSA_TRAIN_H
#include "heads/medusa_heads.h"
#include "model/product.h"
#include "model/kvcache.h"
#include "model/runner.h"
#include "train/dataset.h"

typedef enum { MEDUSA_TARGETS_SELF, MEDUSA_TARGETS_DATA } MedusaTargets;

/* a head on held-out positions, against the model's own greedy choice y = a_{t+k+1}
   whatever the training targets: what a lossless decoder accepts */
typedef struct {
    double loss;               /* mean CE, nats */
    double top1, top5;         /* share of positions whose target is among the head's 1 / 5 best */
    double rank[MEDUSA_RANKS]; /* share whose target is the head's rank-r candidate (ties: lower id first) */
    int64_t positions;
} MedusaStats;

/* the frozen model's outputs for every token of a set of sequences, each sequence's
   computed once (the model is frozen: every epoch would compute the same) */
typedef struct {
    const Sequences *s;
    float *x;      /* [tokens][dim] norm(h_L) */
    int32_t *arg;  /* [tokens] argmax of the model's logits */
    uint8_t *have; /* [sequences] computed yet */
} MedusaCache;

typedef struct {
    Model *m;
    MedusaHeads *h; /* the heads trained, repacked after each step */
    Runner *run;    /* the model's forward workspace */
    KVCache kv;     /* one sequence, refilled for every sequence not cached */
    MedusaTargets targets;
    float lr, lr_lm; /* W and b; an own lm_head */
    float weight[MAX_MEDUSA];
    int eval_from; /* evaluation skips positions before it (a generated text's prompt:
                            decoding runs the heads on the model's own tokens only) */
    int t;         /* Adam steps taken */
    int cap;       /* longest sequence the scratch holds */
    float *mW[MAX_MEDUSA], *vW[MAX_MEDUSA], *gW[MAX_MEDUSA]; /* [dim][dim] */
    float *mb[MAX_MEDUSA], *vb[MAX_MEDUSA], *gb[MAX_MEDUSA]; /* [dim] */
    float *mE[MAX_MEDUSA], *vE[MAX_MEDUSA], *gE[MAX_MEDUSA]; /* [vocab][dim], own lm_head only */
    void *Et_buf[MAX_MEDUSA + 1], *Et[MAX_MEDUSA + 1];       /* Eᵀ packed (aligned inside Et_buf): the
                                                          model's [MAX_MEDUSA], own heads' [k] */
    float *Et_tmp;                                           /* [dim][vocab] the transpose before packing (own heads) */
    float *hid, *x;                                          /* [cap][dim] the last hidden states, normed */
    int32_t *arg, *pos, *tgt;                                /* [cap] */
    float *logits;                                           /* [cap][vocab] a head's logits, then dCE/dl */
    float *z, *r, *dr;                                       /* [cap][dim] */
    float *gT;                                               /* [vocab][cap] dl transposed */
    float *aT;                                               /* [dim][cap] a transpose (r, dz) */
    float *bT;                                               /* [dim][cap] u transposed */
    void *pk_buf, *pk;                                       /* a [dim][cap] transpose packed (aligned inside pk_buf) */
    float *dW, *dE;                                          /* [dim][dim], [vocab][dim] one sequence's products */
    DevMat Et_dev[MAX_MEDUSA + 1], lm_dev[MAX_MEDUSA], pk_dev; /* Et, own lm_heads, pk where the runner multiplies */
} MedusaTrain;

/* scratch for sequences of up to max_len tokens; weights NULL: 0.8^k; Adam state zero */
int medusa_train_init(MedusaTrain *t, Model *m, MedusaHeads *h, int max_len, float lr, float lr_lm,
                      const float *weights, MedusaTargets targets);
void medusa_train_free(MedusaTrain *t);

/* 0.8^k, k = 0..K-1 */
void medusa_default_weights(int K, float *w);

/* head k on n positions with last hidden states hidden[n][dim] (before the final norm)
   and targets tgt[n]: *loss = Σ_t CE_t (unweighted); the gradients of that sum are
   added into gW[dim][dim], gb[dim] and gE[vocab][dim] (each may be NULL; gE only for
   an own lm_head). The tests' entry point. */
int medusa_head_loss(MedusaTrain *t, int k, const float *hidden, const int32_t *tgt, int n, double *loss, float *gW,
                     float *gb, float *gE);

/* the frozen model over one sequence of n tokens at positions pos[n] (0..n-1), in kv's
   sequence 0 (taken and given back): x[n][dim] = norm(h_L), arg[n] its argmax; hid[n][dim]
   scratch. What Medusa's and EAGLE's training read */
int model_seq_outputs(Runner *run, KVCache *kv, const int32_t *tok, const int32_t *pos, int n, float *hid, float *x,
                      int32_t *arg);
/* c for s (pos and hid for cap tokens; a longer sequence is refused): with fill, every sequence's outputs now
   (`what` names the progress; pg may be NULL); without, each when first asked for. Training
   that draws fewer sequences than s holds leaves the rest uncomputed */
int model_outputs_cache(Runner *run, KVCache *kv, const int32_t *pos, float *hid, int cap, const Sequences *s,
                        MedusaCache *c, int fill, const char *what, Progress *pg);
/* sequence i of s's outputs (pos and hid for cap tokens) into *x and *arg: c's rows,
   computed on first use, if c holds s; else computed into the scratch sx and sarg */
int model_outputs_of(Runner *run, KVCache *kv, const int32_t *pos, float *hid, int cap, const Sequences *s,
                     MedusaCache *c, int i, float *sx, int32_t *sarg, const float **x, const int32_t **arg);
/* the model's outputs for s (memory: tokens × (dim + 1) × 4 bytes, touched as computed) */
int medusa_cache_build(MedusaTrain *t, const Sequences *s, MedusaCache *c, int fill, Progress *pg);
void medusa_cache_free(MedusaCache *c);

/* one training step on sequences idx[0..b) of s (c: their cache, or NULL to run the
   model): every head's gradient, then Adam. loss[k] (optional): head k's mean CE
   before the step */
int medusa_train_step(MedusaTrain *t, const Sequences *s, MedusaCache *c, const int *idx, int b, double *loss);
/* out[k] for every head over all of s (positions from t->eval_from on) */
int medusa_train_eval(MedusaTrain *t, const Sequences *s, MedusaCache *c, MedusaStats *out);

/* the model's own text: each sequence of in cut to its first `prefix` tokens, then
   continued greedily until it is len tokens long or the model ends it (an
   end-of-generation token, left out). `group` sequences at a time share each forward
   call (one token each: the result does not depend on group). pg may be NULL. */
int medusa_generate(Model *m, const Sequences *in, int prefix, int len, int group, Sequences *out, Progress *pg);

#endif
