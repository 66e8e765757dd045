/* exit_heads.h — AdaDecode's intermediate-layer heads: for a head at layer l, the
   hidden state after layers [0, l) goes through the model's final RMSNorm (when
   `norm` is set), then a d×d matrix T_l, then the model's own output embedding E:
       logits_l = E · T_l · norm(h_l)
   A head set may have a check vocabulary C (the training text's most frequent tokens):
   then the check AdaDecode pays for reads only C's rows of E and one more logit for every
   other token, r_l · z + b_l (z = T_l norm(h_l)): a distribution over C and "the rest",
   |C| + 1 logits instead of the vocabulary's. Files of kind `exit-heads` hold tensors
   `exit.{l}.T` [d][d], with a check vocabulary `exit.vocab` (I32, increasing ids) and
   `exit.{l}.rest` [d + 1] (r, then b), and metadata naming the model they were trained
   for. */
#ifndef PD_EXIT_HEADS_H
#define PD_EXIT_HEADS_H
#include "model/linear.h"
#include "model/model.h"

#define MAX_EXIT_HEADS 16

typedef struct {
    int n;                          /* heads, by increasing layer */
    int layer[MAX_EXIT_HEADS];      /* 1 .. n_layers-1 */
    const float *T[MAX_EXIT_HEADS]; /* [dim][dim] row-major, f32 (in tf or owned) */
    Linear Tp[MAX_EXIT_HEADS];      /* the same, packed (f32) */
    int norm;                       /* apply the final RMSNorm (with its gain) before T */
    int dim;
    int n_vocab;                    /* the check vocabulary's size; 0: the whole vocabulary */
    int32_t *vocab;                 /* [n_vocab] its ids, increasing */
    float *rest[MAX_EXIT_HEADS];    /* [dim + 1] each head's r, then b */
    Linear Ep;                      /* E's rows at vocab, [n_vocab][dim] packed (f32) */
    Linear Rp[MAX_EXIT_HEADS];      /* r as a [1][dim] matrix, packed */
    char model_digest[40];
    TensorFile tf; /* the file's metadata (a view: its tensors are gone after load) */
    Arena arena;   /* packed copies, owned T when built in memory */
} ExitHeads;

/* load and check against the model: dimension, layer range, the model digest the
   heads were trained for (refused with both digests named) */
int heads_load(ExitHeads *h, const char *path, const Model *m);
/* the same from a file already open: an exit-heads file, or a bundle (its first exit
   head set). h keeps the metadata (h->tf, a view), not the tensors */
int heads_load_tf(ExitHeads *h, const TensorFile *tf, const Model *m, const char *what);
/* identity heads (T = I) at the given layers: the "logit lens", and the untrained
   start of distill-heads */
int heads_identity(ExitHeads *h, const Model *m, const int *layers, int n, int norm);
void heads_free(ExitHeads *h);
/* index of the head at this layer, -1 when none */
int heads_find(const ExitHeads *h, int layer);
/* logits[n][vocab] of head k for n hidden states hidden[n][dim] (batch-invariant) */
int head_logits(Model *m, const ExitHeads *h, int k, const float *hidden, int n, float *logits);
/* a check vocabulary of n ids (any order; each once, each a token) for every head, its
   rest logits started at their lower bound: r = the mean of E's other rows, b = log of
   their count (Jensen: log Σ e^(E_v·z) ≥ log N + mean(E_v)·z) */
int heads_set_vocab(ExitHeads *h, const Model *m, const int32_t *ids, int n);
/* replace head k's rest logit (r[dim], then b; copied, repacked): what training writes back */
int heads_set_rest(ExitHeads *h, int k, const float *rb);
/* with a check vocabulary: out[n][n_vocab + 1] = head k's logits over it, then the rest's */
int head_check(Model *m, const ExitHeads *h, int k, const float *hidden, int n, float *out);
/* z[n][dim] = T_k · norm(h) (or h): the head's input to E, what the trainers differentiate */
int head_z(Model *m, const ExitHeads *h, int k, const float *hidden, int n, float *z);
/* replace head k's matrix (copied, repacked): what training writes back */
int heads_set_T(ExitHeads *h, int k, const float *T);
/* an exit-heads file's metadata keys, and a head's held-out records: distill-heads writes
   them (at EXIT_GAMMA's thresholds), AdaDecode's prior reads them, widen copies them */
#define EXIT_KEY_LAYERS "paradec.exit.layers"
#define EXIT_KEY_NORM "paradec.exit.norm"
#define EXIT_KEY_DIM "paradec.exit.dim"
#define EXIT_N_GAMMA 3
extern const float exit_gamma[EXIT_N_GAMMA]; /* 0.5, 0.75, 0.9: AdaDecode's thresholds */
#define EXIT_KEY_MAX 64
/* "paradec.exit.{layer}.{what}", with "@{γ}" for g ≥ 0 (what: "cover", "precision"), into key */
const char *exit_record_key(char key[EXIT_KEY_MAX], int layer, const char *what, int g);

/* an `exit-heads` file: exit.{l}.T, paradec.exit.layers/.norm/.dim, paradec.model_digest,
   and n_meta more key/value pairs (meta[2i], meta[2i+1]: training facts); atomic */
int heads_save(const ExitHeads *h, const char *path, const char *const *meta, int n_meta);

#endif
