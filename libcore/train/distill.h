/* distill.h — training exit heads by distillation from the model's own last layer
   (AdaDecode, Wei et al. 2025). The model is frozen; for each chosen layer l only the
   d×d matrix T_l learns, from identity, to minimise at every position

       KL(p_L || p_l),  p_L = softmax(E norm(h_L)),  p_l = softmax(E T_l x_l),
       x_l = norm(h_l) (final RMSNorm with its gain) or h_l itself (norm off)

   where h_l is the residual stream after layers [0, l) and E the output embedding.
   Gradient, by hand (the test checks it against finite differences):
       dKL/dlogits_l = p_l - p_L          [vocab]
       dKL/dz        = E^T (p_l - p_L)    [dim]   (z = T_l x_l)
       dKL/dT_l      = dz ⊗ x_l           [dim][dim]
   averaged over the positions of a batch; Adam (Kingma & Ba) updates T_l.
   The big products run on the runner's device (model/product.h): E (the model's
   lm_head), E^T (packed once here) and x^T for the outer-product sum. */
#ifndef PD_DISTILL_H
#define PD_DISTILL_H
#include "heads/exit_heads.h"
#include "model/kvcache.h"
#include "model/product.h"
#include "model/runner.h"
#include "train/dataset.h"

/* a head against the final layer, over held-out positions */
typedef struct {
    double kl;                  /* mean KL(p_L || p_l), nats */
    double top1;                /* share of positions where argmax p_l = argmax p_L */
    double cover[EXIT_N_GAMMA]; /* share of positions with max p_l ≥ γ (would exit) */
    double prec[EXIT_N_GAMMA];  /* top-1 agreement among those (1 when none) */
} HeadStats;

/* AdaDecode's rule over all heads: a token exits at the first head whose max p_l ≥ γ */
typedef struct {
    double rate[EXIT_N_GAMMA];   /* share of positions that exit early */
    double prec[EXIT_N_GAMMA];   /* top-1 agreement of those exits (1 when none) */
    double layers[EXIT_N_GAMMA]; /* mean layers a position runs before its token is
                                       out (the exit layer, or all of them), rollbacks aside */
} ExitStats;

typedef struct {
    Model *m;
    ExitHeads *h; /* the heads trained: T in h's arena, repacked each step */
    Runner *run;  /* the model's forward workspace */
    KVCache kv;   /* one sequence, refilled for every training sequence */
    float lr;
    int t;   /* Adam steps taken */
    int cap; /* longest sequence the scratch holds */
    float *adam_m[MAX_EXIT_HEADS], *adam_v[MAX_EXIT_HEADS], *grad[MAX_EXIT_HEADS]; /* [dim][dim] */
    void *Et, *Et_packed;  /* E^T [dim][vocab], packed (aligned inside Et), in lm_head's weight type */
    DevMat Et_dev, xT_dev; /* E^T and xTp where the runner multiplies */
    /* a check vocabulary C (h->n_vocab): E_C (the heads' packed rows) and E_C^T, packed in
       EcT, where the runner multiplies; per head the gradient of (r, b) */
    void *EcT;
    DevMat Ec_dev, EcT_dev;
    float *grad_rest[MAX_EXIT_HEADS]; /* [dim + 1] */
    float *pC;                        /* [n_vocab + 1] p_L gathered over C, then the rest */
    float *grest;                     /* [cap] the rest logit's gradient */
    float *hid;            /* [cap][dim] the residual stream */
    float *hl;             /* [n_heads][cap][dim] it, after each head's layer */
    float *pL;             /* [cap][vocab] the final distribution */
    float *negH;           /* [cap] Σ p_L log p_L */
    int *argL;             /* [cap] its argmax */
    int32_t *pos;          /* [cap] 0, 1, 2, ... */
    float *x, *z, *dz;     /* [cap][dim] a head's input, T x, dKL/dz */
    float *logits;         /* [cap][vocab] a head's logits, then p_l - p_L */
    float *xT, *dzT;       /* [dim][cap] transposes for the outer-product sum */
    void *xTp, *xTp_buf;   /* xT packed (aligned inside xTp_buf) */
    float *dT;             /* [dim][dim] one sequence's gradient */
    signed char *exited;   /* [cap][N_GAMMA] eval: -1 not yet, else 0/1 = the exit agreed */
} Distill;

/* scratch for sequences of up to max_len tokens; E^T packed; Adam state zero */
int distill_init(Distill *d, Model *m, ExitHeads *h, int max_len, float lr);
void distill_free(Distill *d);

/* head k on n positions whose hidden states are h[n][dim] at the head's layer and
   hL[n][dim] after the last layer: *loss = Σ_t KL_t; when grad is not NULL,
   grad[dim][dim] += Σ_t dKL_t/dT and, with a check vocabulary, grad_rest[dim + 1] +=
   Σ_t dKL_t/d(r, b) (the tests' entry point) */
int distill_head_loss(Distill *d, int k, const float *h, const float *hL, int n, double *loss, float *grad,
                      float *grad_rest);

/* W^T packed for k_matmul: W is [rows][cols] of type wt; dst (k_packed_bytes(wt, cols,
   rows), 64-aligned) gets [cols][rows]; tmp: rows × cols elements of scratch. The
   trainers' backward passes multiply by E^T */
void pack_transposed(void *dst, const void *W, WType wt, int rows, int cols, void *tmp);

/* one Adam step (bias-corrected; β1 0.9, β2 0.999, ε 1e-8, as every head trainer
   here uses) on n parameters; t counts from 1 */
void adam_update(float *w, const float *g, float *m, float *v, size_t n, int t, float lr);

/* the learning rate of step s of n: cosine decay from base to 0 (the loss is convex
   in T: a decaying step settles into the optimum instead of circling it) */
float distill_lr(float base, long s, long n);

/* one training step on sequences idx[0..b) of s: the gradient averaged over all their
   positions, then Adam on every T. loss[k] (optional): head k's mean KL before the step */
int distill_step(Distill *d, const Sequences *s, const int *idx, int b, double *loss);
/* out[k] for every head, over all of s; first (optional): the first-exit rule */
int distill_eval(Distill *d, const Sequences *s, HeadStats *out, ExitStats *first);

/* --layers auto: every layer 1..L-1 when L ≤ 8, else round(L/4), round(L/2), round(3L/4)
   (the paper's 8, 16, 24 for 32 layers); returns how many (≤ 7) */
int distill_auto_layers(int n_layers, int *layers);

/* --norm auto: with the heads still at T = I, evaluate them on s without and with the
   final RMSNorm and keep the norm whose held-out Σ_l KL (the objective) is lower:
   the start T has less to undo (measured in docs/distill.md: on stories260K and on
   SmolLM2 the start's order is the trained heads' order). kl[0], kl[1]: the two sums;
   before: the chosen heads' statistics */
int distill_choose_norm(Distill *d, const Sequences *s, HeadStats *before, double kl[2]);

/* the order sequences are visited in: a fresh shuffle every epoch */
typedef struct {
    int n, at;
    int *perm;
    uint64_t rng;
} SeqOrder;
int order_init(SeqOrder *o, int n, uint64_t seed);
void order_next(SeqOrder *o, int *idx, int b);
void order_free(SeqOrder *o);

#endif
