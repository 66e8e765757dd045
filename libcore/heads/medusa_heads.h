/* medusa_heads.h — Medusa heads (Cai et al. 2024). Head k (k = 1..K, stored 0-based) reads
   the model's last hidden state after the final RMSNorm, x = norm(h_L) [dim], and
   predicts the token k positions after the one the model's own LM head predicts:

       r_k      = x + SiLU(W_k x + b_k)       [dim]    ResBlock, W_k zero at the start
       logits_k = E_k r_k                     [vocab]  E_k: the model's frozen lm_head,
                                                       or the head's own copy
   A widened model (bin/widen) scales its normed state by 1/s and its output embedding
   by s; its heads record that s as input_scale and compute
       r_k = (s x + SiLU(W_k s x + b_k)) / s
   so they see the real model's x and give its logits.

   Files of kind `medusa-heads` hold medusa.{k}.w [dim][dim], medusa.{k}.b [dim] and,
   when owned, medusa.{k}.lm_head [vocab][dim], k = 0..K-1, all f32; metadata:
   paradec.model_digest, paradec.medusa.heads (K), paradec.medusa.dim,
   paradec.medusa.input_scale (absent = 1), and the held-out accuracy training
   measured: paradec.medusa.rank_acc, a JSON array of K arrays of MEDUSA_RANKS numbers,
   [k][r] = the share of held-out positions whose target is head k's rank-r candidate
   (r = 0 is its argmax); the default tree is built from it. */
#ifndef PD_MEDUSA_H
#define PD_MEDUSA_H
#include "formats/tensorfile.h"
#include "model/linear.h"
#include "model/model.h"

#define MAX_MEDUSA 8    /* heads at most */
#define MEDUSA_RANKS 10 /* candidate ranks whose accuracy a file records */

typedef struct {
    int n; /* K heads */
    int dim, vocab;
    float input_scale;     /* 1, or the widening's s */
    float *W[MAX_MEDUSA];  /* [dim][dim] row-major (owned, in the arena) */
    float *b[MAX_MEDUSA];  /* [dim] */
    float *lm[MAX_MEDUSA]; /* [vocab][dim] own LM head, or NULL = the model's */
    Linear Wp[MAX_MEDUSA];  /* W packed (f32, or in 8 bits: q8) */
    Linear lmp[MAX_MEDUSA]; /* lm packed; .p NULL when the head reads the model's */
    int q8;                 /* 1: Wp and lmp hold W and lm in 8 bits (LINEAR_Q8), for drafting */
    int has_acc;           /* rank_acc known (from the file or training) */
    float rank_acc[MAX_MEDUSA][MEDUSA_RANKS];
    char model_digest[40];
    Arena arena;
} MedusaHeads;

/* fresh heads for training: W = 0, b = 0, and with own_lm a copy of the model's lm_head */
int medusa_init(MedusaHeads *h, const Model *m, int K, int own_lm);
/* load and check against the model: kind, dimension, vocabulary, K, shapes, the model
   digest the heads were trained for (refused with both digests named) */
int medusa_load(MedusaHeads *h, const char *path, const Model *m);
/* the same from a tensor file already open (or parsed from bytes: what fuzzing calls);
   `what` names it in errors; nothing of tf is kept */
int medusa_load_tf(MedusaHeads *h, const TensorFile *tf, const Model *m, const char *what);
void medusa_free(MedusaHeads *h);
/* logits[n][vocab] of head k for n hidden states hidden[n][dim] taken after the last
   layer, before the final norm (batch-invariant: rmsnorm, matmuls, silu) */
int medusa_logits(Model *m, const MedusaHeads *h, int k, const float *hidden, int n, float *logits);
/* head k's ResBlock on n normed states x[n][dim] (what medusa_logits and training
   share): z = W_k (s x) + b_k and r = (s x + SiLU(z)) / s, both [n][dim] */
void medusa_resblock(const MedusaHeads *h, int k, const float *x, int n, float *z, float *r);
/* from now on the ResBlocks' W and the own LM heads are read in 8 bits (per-row
   scaled; W and lm keep the f32 values, so saving and training are unchanged): a
   quarter of the bytes, which matters where the heads and the model do not fit in
   cache together (stories260K's five heads are 0.7 MiB in f32 beside a 1 MiB model and
   a 1 MiB L2; the widened 110m's ResBlocks 2.4 MB each). Heads only draft, so their
   precision changes which tokens are proposed, never what is output. Heads too small
   to gain keep f32 */
void medusa_use_int8(MedusaHeads *h);
/* replace head k's parameters (copied and repacked); lm may be NULL when not owned */
int medusa_set(MedusaHeads *h, int k, const float *W, const float *b, const float *lm);
/* a `medusa-heads` file with the metadata above plus n_meta more pairs; atomic */
int medusa_save(const MedusaHeads *h, const char *path, const char *const *meta, int n_meta);

#endif
