/* eagle_train.h — training an EAGLE draft head (heads/eagle_head.h) on a frozen model.
   For a sequence of T tokens t_0..t_{T-1} with the model's features f_i = norm(h_L,i)
   and greedy choices a_i (MedusaCache's x and arg), the draft runs at the T - 1
   positions i = 0..T-2 on u_i = [embed(t_{i+1}); f_i] (heads/eagle_head.h: x = W_fc u,
   one causal Llama layer with RoPE at i, f' = g ⊙ h / rms(h), logits = E_K f') and
   learns at each of them

       L_i = w_reg · mean_d smoothL1(f'_i - f_{i+1})  +  w_ce · CE(logits_i, k(a_{i+1}))

   smooth L1 with β = 1 (½e² for |e| < 1, else |e| - ½), k(a) the draft id of the
   model's own next token after t_{i+1}; the CE term is left out where a_{i+1} is not in
   the draft vocabulary. Only W_fc and the layer learn (fc, attn_norm, wq, wk, wv, wo,
   ffn_norm, w1, w3, w2); g and E_K are the model's, frozen. Gradients by hand
   (docs/eagle.md derives them; tests/test_eagle_train.c checks every tensor against
   central differences of a double-precision reference), Adam. The big products are
   k_matmul calls over all positions of a sequence on the runner's device
   (model/product.h); attention is plain host loops (a sequence is a few hundred
   positions).

   EAGLE-3's training-time test unrolls the draft on its own features for `steps` steps
   (1: the above alone). Step k runs at rows i = 0..T-2-k on
   u = [embed(t_{i+k+1}); k ? f'^{k-1}_i : f_i] at position i + k; it attends to step 0's
   entries 0..i and to its own chain (steps 1..k of row i), as a draft node of depth
   k + 1 sees the true entries and its ancestors; it learns L^k_i against f_{i+k+1} and
   a_{i+k+1}, weighted EAGLE_STEP_DECAY^k (EAGLE-3's 0.8). Gradients flow back through
   the fed-back f'. */
#ifndef PD_EAGLE_TRAIN_H
#define PD_EAGLE_TRAIN_H
#include "heads/eagle_head.h"
#include "model/kvcache.h"
#include "model/product.h"
#include "model/runner.h"
#include "train/dataset.h"
#include "train/medusa_train.h" /* MedusaCache */

/* the trainable tensors, in this order everywhere (gradients, Adam moments, tests) */
enum {
    EAGLE_FC,
    EAGLE_ATTN_NORM,
    EAGLE_WQ,
    EAGLE_WK,
    EAGLE_WV,
    EAGLE_WO,
    EAGLE_FFN_NORM,
    EAGLE_W1,
    EAGLE_W3,
    EAGLE_W2,
    EAGLE_TENSORS
};
extern const char *const eagle_tensor_name[EAGLE_TENSORS]; /* "fc", "attn_norm", ... */
/* elements of tensor k for the head's config */
size_t eagle_tensor_size(const Config *c, int k);
/* p's tensor k (its f32 array) */
float *eagle_tensor(EagleParams *p, int k);

/* one array per trainable tensor, shaped as EagleParams' */
typedef struct {
    float *t[EAGLE_TENSORS];
    size_t n[EAGLE_TENSORS];
    float *mem;
} EagleGrad;
int eagle_grad_init(EagleGrad *g, const Config *c); /* zeroed */
void eagle_grad_zero(EagleGrad *g);
void eagle_grad_free(EagleGrad *g);

#define EAGLE_EVAL_STEPS 3 /* evaluation reports top-1 at depths 1..3 at least */
#define EAGLE_STEP_DECAY 0.8f

/* what a pass over positions adds up (sums, not means); reg, ce and labelled count step 0
   (one step ahead) only */
typedef struct {
    double loss;                           /* Σ_k decay^k (w_reg · reg + w_ce · ce) over the steps trained */
    double reg, ce;                        /* Σ smooth-L1 (each a mean over dim), Σ CE over labelled positions */
    int64_t labelled;                      /* those whose target is in the draft vocabulary */
    int64_t positions_at[EAGLE_MAX_STEPS]; /* positions counted at step k */
    int64_t hits_at[EAGLE_MAX_STEPS];      /* those whose draft argmax is the target */
} EagleSums;

/* a head on held-out positions, against the model's own greedy next token */
typedef struct {
    double ce;       /* mean CE over labelled positions, nats */
    double reg;      /* mean smooth-L1 feature loss */
    double top1;     /* share of positions whose draft argmax (through vocab) is the model's
                        greedy token; positions whose token is not in the vocabulary miss */
    double coverage; /* share of positions whose target is in the draft vocabulary */
    int64_t positions;
    int depth;                       /* steps evaluated */
    double top1_at[EAGLE_MAX_STEPS]; /* top-1 of step k, on its own fed-back features */
} EagleStats;

/* the defaults (docs/eagle.md says why): the losses' weights, the clipping norm */
#define EAGLE_W_REG 1.0f
#define EAGLE_W_CE 1.0f
#define EAGLE_CLIP 0.5f

/* a packed matrix where the runner multiplies (f32) */
typedef struct {
    void *buf, *pk; /* pk: 64-aligned inside buf */
    DevMat dev;
} EaglePacked;

typedef struct {
    Model *m;       /* the target (frozen): embedding, RoPE tables, features */
    EagleParams *p; /* the head trained, in place */
    Runner *run;    /* m's runner: the products, and features not cached */
    KVCache kv;     /* one sequence, for features not cached */
    float lr;
    float w_reg, w_ce; /* the losses' weights (EAGLE_W_REG, EAGLE_W_CE) */
    float clip;        /* the averaged gradient's global norm is clipped to this (0: off; EAGLE_CLIP) */
    int eval_from;     /* evaluation skips draft positions before it (a generated text's prompt) */
    int t;             /* Adam steps taken */
    int cap;           /* longest sequence (tokens) the scratch holds */
    int steps;         /* steps trained (the training-time test's unroll) */
    int depth;         /* steps the scratch holds: max(steps, EAGLE_EVAL_STEPS) */
    int dim, hidden, n_heads, n_kv, hd, K, qd, kvd, qkvd;
    int32_t *draft_of;   /* [target vocab] draft id, -1 when not in the draft vocabulary */
    EagleGrad g, am, av; /* the step's gradient, Adam's moments */
    /* forward products (W), backward products (Wᵀ), the frozen E_K and E_Kᵀ, and a
       transient [in][n] activation transpose for the weight gradients */
    EaglePacked fc, qkv, wo, w13, w2, E, fcT, qkvT, woT, w13T, w2T, ET, act;
    float *wtmp; /* a transpose before packing: the largest weight's, or an [in][cap] activation */
    float *nsin; /* [seq_len][hd/2] the RoPE sines negated: the inverse rotation */
    /* each unrolled step's activations, [cap rows][...], and the gradients that cross steps */
    struct EagleStep {
        float *u, *x, *xa, *qkvb, *att, *r1, *xf, *g13, *hact, *h, *fp, *logits;
        float *rs_a, *rs_f, *rs_h; /* [cap] 1/rms of x, r1, h */
        float *P;                  /* [n_heads][cap (cap + 1) / 2 + cap k] attention weights, row i's i + 1 + k
                                      at i (i + 1) / 2 + i k */
        float *dfp, *dqkv;
    } st[EAGLE_MAX_STEPS];
    /* one step's gradients at a time */
    float *dh, *dhact, *dg13, *dxf, *dr1, *datt, *dxa, *dx, *du;
    float *dT;    /* [largest out][cap] a gradient transposed */
    float *dW;    /* [largest weight] one sequence's weight gradient */
    float *fx;    /* [cap][dim] features of a sequence not cached */
    float *dp;    /* [cap] attention backward's dL/dp of one row */
    int32_t *arg; /* [cap] */
    int32_t *pos; /* [cap + depth] 0, 1, 2, ... */
    float *hid;   /* [cap][dim] the model's last hidden states (features not cached) */
} EagleTrain;

/* scratch for sequences of up to max_len tokens (at most the model's context) training
   p for m unrolled `steps` steps (1..EAGLE_MAX_STEPS); the loss weights EAGLE_W_REG,
   EAGLE_W_CE, clipping at EAGLE_CLIP, Adam state zero */
int eagle_train_init(EagleTrain *t, Model *m, EagleParams *p, int max_len, int steps, float lr);
void eagle_train_free(EagleTrain *t);

/* the draft's forward on n given inputs: in_tok[n] (target ids: t_{i+1}), feat[n][dim]
   (f_i) at positions 0..n-1, one causal sequence, unrolled `steps` steps (1..t->depth):
   step k's n - k rows of f' at fprime[k][n][dim] and of logits at logits[k][n][K] (either
   may be NULL). Reads p as it is now. */
int eagle_seq_forward(EagleTrain *t, const int32_t *in_tok, const float *feat, int n, int steps, float *fprime,
                      float *logits);

/* one sequence tok[T] with features feat[T][dim] and the model's greedy choices arg[T]
   (a MedusaCache's rows): draft positions 0..T-2, those before `from` context only (at
   step k, row i counts when i + k ≥ from). Adds the sums of L^k_i (above) over the
   positions counted into *s (may be NULL) and, when g is not NULL, the exact gradients
   of Σ_k decay^k Σ_i L^k_i into g; the steps trained, or with g NULL all t->depth steps
   (the loss still over those trained). Reads p as it is now. */
int eagle_seq_loss(EagleTrain *t, const int32_t *tok, const float *feat, const int32_t *arg, int T, int from,
                   EagleSums *s, EagleGrad *g);

/* the model's features and greedy choices for s, as medusa_cache_build keeps them
   (x = norm(h_L), arg = argmax; fill: all now, else each sequence's when first drawn;
   medusa_cache_free frees it); pg may be NULL */
int eagle_cache_build(EagleTrain *t, const Sequences *s, MedusaCache *c, int fill, Progress *pg);

/* a new phase of training: `steps` unrolled steps (1..t->depth) and Adam's state afresh,
   as a run from the head so far (--init) would begin */
int eagle_train_phase(EagleTrain *t, int steps);

/* one step on sequences idx[0..b) of s (c: their cache, or NULL to run the model): the
   gradient of Σ L_i divided by the batch's positions, clipped (t->clip), Adam with t->lr.
   out (optional): the batch's sums before the step */
int eagle_train_step(EagleTrain *t, const Sequences *s, MedusaCache *c, const int *idx, int b, EagleSums *out);
/* the head over all of s (draft positions from t->eval_from on), t->depth steps */
int eagle_train_eval(EagleTrain *t, const Sequences *s, MedusaCache *c, EagleStats *out);

#endif
