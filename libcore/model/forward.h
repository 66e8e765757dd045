/* forward.h — the central primitive every decoding method builds on. */
#ifndef PD_FORWARD_H
#define PD_FORWARD_H
#include "model/kvcache.h"
#include "model/model.h"
#include "model/runner.h"

/* one step of work: n tokens, each with its sequence, position and the tokens of the
   same step it may attend to. With parent and mask both NULL, each token sees the
   earlier tokens of its own sequence in the batch (a chain: prefill, drafts). */
typedef struct {
    int n;
    const int32_t *token;  /* [n] (read only when the call starts at layer 0 and the runner's given is 0) */
    const int32_t *seq;    /* [n] KV sequence each token extends; NULL = all 0 */
    const int32_t *pos;    /* [n] its position (RoPE) */
    const int32_t *parent; /* [n] index of its parent in this batch, -1 = none; parents
                              come first; ancestors are visible, siblings are not */
    const uint8_t *mask;   /* [n][n] or NULL: mask[i*n+j] = token i sees token j (j < i) */
} Batch;

/* runs layers [layer_begin, layer_end) for the batch. hidden[n][dim] is the input
   (ignored and filled from the embedding when layer_begin is 0, unless the runner's
   `given` is set) and the output.
   Each token's K/V goes to the slots after those already filled in each layer. */
int forward_layers(Runner *r, KVCache *kv, const Batch *b, int layer_begin, int layer_end, float *hidden);
/* forward_layers in two halves, so that the host can queue other work (another runner's
   stream) before it waits: submit queues the call on the runner's stream and returns;
   hidden holds the result once forward_wait(r, hidden, n) has returned. Until then the
   caller leaves hidden alone, and the runner's workspace holds the call's state, so the
   runner takes no other call in between. A device the host can read has run the call
   when submit returns. */
int forward_submit(Runner *r, KVCache *kv, const Batch *b, int layer_begin, int layer_end, float *hidden);
int forward_wait(Runner *r, float *hidden, int n);
/* a captured forward step: the embedding and layer calls of forward_layers over
   [layer_begin, layer_end) on one KV cache, recorded once on the runner's device, on the
   workspace's hidden states (a replay copies the given ones in and out); each replay
   reads the step (tokens, positions, slots, block-table rows, visibility lists) from the
   runner's descriptor, which forward_replay fills from the batch. Same bits as
   forward_layers. A GPU's graph also keeps the capture's token count and attention
   grids: capture right after a forward_layers call of the batches it will replay. */
typedef struct ForwardGraph ForwardGraph;
ForwardGraph *forward_capture(Runner *r, KVCache *kv, int layer_begin, int layer_end);
/* the graph over b, hidden as forward_layers' (the graph works on the workspace's copy);
   -2 (the error set) when b needs a workspace other than the capture's: capture again */
int forward_replay(Runner *r, const ForwardGraph *g, const Batch *b, float *hidden);
void forward_graph_free(ForwardGraph *g);
/* logits[n][vocab] from the last hidden states */
int final_logits(Runner *r, const float *hidden, int n, float *logits);
/* final_logits, then over each row on the device: its argmax (ids[n]); the k largest
   probabilities of its softmax, largest first, lower id first among equals (ids[n][k],
   probs[n][k]; probs may be NULL); its whole softmax (probs[n][vocab]). Only these come
   back, not the logits: what methods call where they read logits rows for a token id
   or probabilities. Bits: k_argmax and k_softmax of final_logits' rows. */
int logits_argmax(Runner *r, const float *hidden, int n, int32_t *ids);
int logits_topk(Runner *r, const float *hidden, int n, int k, int32_t *ids, float *probs);
int logits_softmax(Runner *r, const float *hidden, int n, float *probs);
/* logits_softmax of the logits divided by temp (> 0): a sampler's probabilities before
   truncation, the bits of x[i] /= temp then k_softmax */
int logits_softmax_temp(Runner *r, const float *hidden, int n, float temp, float *probs);
/* the same row ops over n rows of cols floats the caller already holds (an exit or a
   Medusa head's logits, or target logits kept for logprobs): argmax ids[n]; softmax of
   x / temp into probs[n][cols] (temp 1: of x itself) */
int rows_argmax(Runner *r, const float *x, int n, int cols, int32_t *ids);
int rows_softmax(Runner *r, const float *x, int n, int cols, float temp, float *probs);
/* embedding rows for n tokens into hidden[n][dim] */
void embed_tokens(const Model *m, const int32_t *tokens, int n, float *hidden);

#endif
