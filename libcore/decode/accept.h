/* accept.h — the lossless acceptance step, written once: every drafter's tree walk
   (decode/drafter.c) and AdaDecode's verification (decode/adadecode.c) use it.

   Greedy: a draft is kept when it is the model's argmax where it was drafted.
   Sampling: a draft t drawn from q (a point mass when the drafter chose it
   deterministically) is kept with probability min(1, p(t)/q(t)); when rejected, p
   becomes norm(max(0, p − q)) and the next candidate is tried, or the token is drawn
   from it (Leviathan et al. 2023; Chen et al. 2023; SpecInfer for trees). Each kept
   or drawn token is then distributed as the model's own. The RNG draws are one
   uniform per candidate tried, then one for the token drawn. */
#ifndef PD_ACCEPT_H
#define PD_ACCEPT_H
#include "decode/method.h"

/* the first child of node among n nodes (parents before children) whose token is tok
   (tok < 0: any child); -1 if none */
int accept_child(const int32_t *parent, const int32_t *token, int n, int node, int tok);

/* u < res(t)/total ÷ q(t): keep draft tok? res[V] sums to total (p itself: total 1);
   q NULL: a point mass at tok */
int accept_draft(Sampler *s, const float *res, float total, const float *q, int tok);

/* after a rejected draft tok drawn from q (NULL: a point mass): res[V] (summing to
   *total) becomes max(0, res/total − q), *total its sum; rounding that leaves nothing
   falls back on p itself (total 1) */
void accept_residual(float *res, float *total, const float *q, int tok, const float *p, int V);

/* a tree of n nodes (parent[], token[]), ids[n] the model's argmax at every node (the
   row op's). Greedy: follows the argmax child from the root; path[0..ret) the kept
   nodes (path[0] = 0), *next the argmax after the last. */
int accept_walk_greedy(const int32_t *parent, const int32_t *token, int n, const int32_t *ids, int *path, int *next);

/* sampling: rejection sampling down the tree. Node c's draft came from q + c·V when
   sampled[c], else a point mass. logits[n][V] (decode_rows': softmax(logits / temp)
   when is_probs, else raw logits) become the sampler's probabilities along the path;
   res[V] is scratch. kept[i] (logprobs, decode_keep) gets the raw logits the path's
   (i+1)-th token came from. -1 on error. */
int accept_walk_sample(DecodeCtx *d, const int32_t *parent, const int32_t *token, const uint8_t *sampled,
                       const float *q, int n, float *logits, int is_probs, float *res, int *path, const float **kept,
                       int *next);

/* one draft tok (drawn from q[V], NULL: a point mass) against the model's p[V]
   (probabilities): returns tok when kept, else the token drawn from the residual;
   res[V] scratch, *kept whether tok was kept */
int accept_one(Sampler *s, const float *p, const float *q, int tok, float *res, int V, int *kept);

#endif
