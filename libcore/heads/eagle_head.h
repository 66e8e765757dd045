/* eagle_head.h — an EAGLE draft head (Li et al. 2024, EAGLE-1's feature-level draft):
   one decoder layer that runs autoregressively on the target's features. At position
   i it reads f_i = norm(h_L,i) (the target's last hidden state after its final RMSNorm,
   the state its LM head reads) and the embedding of the token t_{i+1} chosen there:

       u_i   = [embed(t_{i+1}) ; f_i]                 [2 dim]  the target's embedding row
       x_i   = W_fc u_i                               [dim]
       h_i   = layer(x_0..x_i)                        [dim]    a Llama decoder layer (the
                                                               target's shapes), causal, RoPE at i
       f'_i  = g ⊙ h_i / rms(h_i)                     [dim]    the target's final norm (frozen)
       q_i   = softmax(E_K f'_i)                      [K]      the target's LM head rows of the
                                                               draft vocabulary (frozen)

   f'_i guesses f_{i+1}, and q_i the token after t_{i+1}; deeper drafts feed f'_i back
   in place of f_{i+1}. The draft vocabulary is the K most frequent tokens of the
   training text (vocab[k] = the target's id of draft token k, most frequent first).

   So the head is a one-layer Llama model over K tokens whose tied embedding is E_K and
   whose final norm is g, run on given inputs x_i instead of embedding rows: a file of
   kind `eagle-head` holds that model's tensors under their usual names (a model file's
   model.embed_tokens.weight [K][dim], model.layers.0.*, model.norm.weight, its
   paradec.config with n_layers 1, vocab_size K, tie_word_embeddings) plus
   eagle.fc [dim][2 dim] (F32) and eagle.vocab [K] (I32); metadata paradec.model_digest
   (the target's), paradec.eagle.vocab (K) and, from training, paradec.eagle.acc: the
   held-out share of positions whose next token is q's argmax. */
#ifndef PD_EAGLE_HEAD_H
#define PD_EAGLE_HEAD_H
#include "formats/tensorfile.h"
#include "model/linear.h"
#include "model/model.h"

/* the most steps training unrolls the draft on its own features (train/eagle_train.h) */
#define EAGLE_MAX_STEPS 8

/* the head's parameters as f32 arrays, what training changes and saving writes
   (row-major, Hugging Face's [out][in]) */
typedef struct {
    Config c;            /* the layer's: the target's widths, n_layers 1, vocab_size K, tied */
    float *fc;           /* [dim][2 dim] */
    float *attn_norm;    /* [dim] */
    float *wq, *wk, *wv; /* [n_heads hd][dim], [n_kv hd][dim] ×2 (rotate-half order) */
    float *wo;           /* [dim][n_heads hd] */
    float *ffn_norm;     /* [dim] */
    float *w1, *w3;      /* gate, up [hidden][dim] */
    float *w2;           /* down [dim][hidden] */
    float *norm;         /* [dim] the target's final norm gain (frozen) */
    float *emb;          /* [K][dim] the target's LM head rows vocab[k] (frozen) */
    int32_t *vocab;      /* [K] */
    char model_digest[40];
    float acc; /* held-out top-1 (-1: unknown) */
    DType dt;  /* how saving stores the layer and E_K: DT_F32 (init's) or DT_BF16 (half the
                  bytes a draft step reads; drafts only, so the output never changes) */
    Arena arena;
} EagleParams;

/* fresh parameters for the target m over the draft vocabulary vocab[K] (target ids,
   distinct): the layer starts as a copy of the target's last layer (an f32 or bf16
   model; block types are refused) and W_fc = [0 | I], so x_i = f_i at the start */
int eagle_params_init(EagleParams *p, const Model *m, const int32_t *vocab, int K);
/* the K most frequent token ids among tokens[n] (ties: the lower id), into vocab[K]:
   K at most the vocabulary; ids that never occur fill the rest in id order */
int eagle_vocab_from_counts(const Model *m, const int32_t *tokens, int64_t n, int K, int32_t *vocab);
/* an `eagle-head` file (the layer and E_K in p->dt, W_fc, norms and the vocabulary as
   they are; plus n_meta more metadata pairs); atomic */
int eagle_params_save(const EagleParams *p, const char *path, const char *const *meta, int n_meta);
/* the parameters of a file (or a bundle's set) made for m, as f32 (dt: as stored) */
int eagle_params_load(EagleParams *p, const char *path, const Model *m);
void eagle_params_free(EagleParams *p);

/* the head ready to draft: the layer as a Model (its weights packed for the backend),
   W_fc packed, the vocabulary */
typedef struct {
    Model layer;    /* one layer over K tokens; its tf a view of the file's tensors */
    Linear fc;      /* [dim][2 dim] */
    int32_t *vocab; /* [K] */
    Arena arena;    /* fc's packed bytes, vocab */
    int K;
    float acc;       /* paradec.eagle.acc, -1 when unknown */
    TensorFile file; /* the file eagle_load opened (unused by eagle_load_tf) */
    int own_file;
} EagleHead;

/* load and check against the target m: kind, shapes, the digest it was trained for */
int eagle_load(EagleHead *h, const char *path, const Model *m);
/* the same from a file already open (a bundle, the model's own tf), which must stay
   open while h lives; `what` names it in errors */
int eagle_load_tf(EagleHead *h, const TensorFile *tf, const Model *m, const char *what);
void eagle_free(EagleHead *h);
/* x[n][dim] = W_fc [embed(tok[i]) ; feat[i]] for feat[n][dim] (the target's embedding
   rows); u[n][2 dim] scratch */
void eagle_input(const EagleHead *h, const Model *m, const int32_t *tok, const float *feat, int n, float *u, float *x);

#endif
