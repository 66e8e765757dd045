/* drafter.h — guess, then check. A drafter proposes a token tree rooted at the last
   accepted token; each drafter_step runs the whole tree through the model in one
   forward call with the tree's attention mask (each node sees its ancestors, not its
   siblings), keeps the longest path the model agrees with, and cuts the KV cache to
   that path. Medusa, prompt lookup, draft-model speculative decoding and the
   benchmarks' oracle are drafters; adding one touches no other file.

   Lossless: greedy keeps a child only when its token is the model's argmax at the
   parent; sampling walks the tree with rejection sampling — at a node with model
   distribution p, child c (token t, drawn from q_c, a point mass when the drafter
   chose it deterministically) is accepted with probability min(1, p(t)/q_c(t)); when
   rejected, p becomes norm(max(0, p − q_c)) and the next child is tried; when no child
   is left the token comes from what remains of p. Every emitted token is then
   distributed as the model's own (Leviathan et al. 2023; SpecInfer, Miao et al. 2024).

   How big a tree is verified changes the speed only: the round size controller keeps
   per-size measured throughput and hill-climbs over prefixes of the proposed tree
   (1 = a plain step, with no drafting at all), so a drafter that does not pay falls
   back to plain steps and probes again later (a cheap one is asked for its tree even
   then, and what it would have kept is read off the tokens that follow). */
#ifndef PD_DRAFTER_H
#define PD_DRAFTER_H
#include "decode/method.h"

#include <stddef.h>

/* the drafter loop's own option, listed by every drafter method */
#define DRAFTER_OPTIONS                                                                                                \
    {                                                                                                                  \
        "fixed-tree", OPT_SWITCH, 0, 0, NULL, NULL, "verify the whole proposal every round (no size controller)",      \
            offsetof(MethodShared, fixed_tree), 1, NULL                                                                \
    }

#define MAX_TREE 128 /* nodes a round verifies at most, the root included (side nodes apart) */
_Static_assert(2 * MAX_TREE <= MAX_ROUND_NODES, "a round's tree and side nodes are counted in rounds_by_nodes");

typedef struct {
    int n;                     /* nodes; node 0 is the root */
    int32_t token[MAX_TREE];   /* node 0: the last accepted token x, at position P, not yet run */
    int32_t parent[MAX_TREE];  /* parent[i] < i; parent[0] = -1 */
    int32_t depth[MAX_TREE];   /* filled by drafter_step: node i sits at P + depth[i] */
    float *q;                  /* [MAX_TREE][vocab] sampling: row i = the distribution node i's
                                 token was drawn from, when sampled[i] */
    uint8_t sampled[MAX_TREE]; /* 0: a deterministic draft (a point mass at token[i]) */
    /* side nodes (lookahead's Jacobi window): n_side more nodes after the tree, run in
       the same call but never kept; side node i is at position side_pos[i] and sees
       the committed context plus the batch nodes j < n + i with side_mask[i][j] set */
    int n_side;
    int32_t token_side[MAX_TREE], side_pos[MAX_TREE];
    uint8_t side_mask[MAX_TREE][2 * MAX_TREE];
    /* a drafter that ran the tree's first layers itself (self-speculative: its drafts
       came from them, and their KV entries are in the cache) sets run_to: the nodes'
       states after layer run_to are in hidden[n][dim] (the loop's buffer, set before
       propose), and verification runs the layers from there (also when n = 1) */
    int run_to;
    float *hidden;
    int32_t root_pos; /* P, the root's position (set by the loop) */
} DraftTree;

struct Drafter;
/* what a round's drafter may propose into t: at most max_nodes nodes in all, no deeper
   than max_depth (dr NULL: nothing, a plain round) */
typedef struct {
    struct Drafter *dr;
    DraftTree *t;
    int max_nodes, max_depth;
} Proposal;

typedef struct Drafter {
    void *self;
    /* after the prompt: hidden[dim] = its last token's state after the last layer */
    int (*start)(struct Drafter *, DecodeCtx *, const int32_t *prompt, int n_prompt, const float *hidden);
    /* adds nodes below the root (t->n = 1, token[0] set), at most max_nodes in all and
       no deeper than max_depth; nodes ordered so that every prefix is a good smaller
       tree (the controller may verify a prefix only). Returns 0, -1 on error */
    int (*propose)(struct Drafter *, DecodeCtx *, DraftTree *t, int max_nodes, int max_depth);
    /* the outcome: nodes path[0..n_path) were kept (path[0] = 0, the root; t->n = 1
       after a plain step, which asked for no drafts), `next` follows them;
       hidden[dim] = the last kept node's state after the last layer (the one `next`
       came from); ids[n + n_side]: every node's argmax of the target's logits (the
       device's row op), in greedy mode, and whenever the tree has side nodes */
    int (*accepted)(struct Drafter *, DecodeCtx *, const DraftTree *t, const int *path, int n_path, int next,
                    const float *hidden, const int32_t *ids);
    void (*free)(struct Drafter *);
    /* proposing costs next to nothing and drafts are deterministic (prompt lookup):
       where a step is slow enough, the loop then asks for the biggest tree each round,
       verifies the prefix it chose, and learns what the rest would have kept from the
       tokens that follow */
    int cheap;
    /* ≥ 0: kept drafts count as early exits at this exit head (d->early[exit_head]),
       not per depth */
    int exit_head;
    /* optional: the proposals p[0..n) of drafters of this kind sharing d[i]->pool, made
       together: what each would propose alone, their model calls shared (EAGLE's head
       levels, one call for every request) */
    int (*propose_group)(DecodeCtx **d, const Proposal *p, int n);
    int most; /* nodes its proposals hold at most, the root included (0: as many as allowed) */
} Drafter;

/* the verify loop every drafter runs in, as a method's begin / step / finish
   (DecodeMethod): begin prefills, takes a copy of dr (its self too: finish frees it
   through dr->free, also when begin fails) and leaves the state in *state; a step is
   one round (propose, verify, accept); 1 when the generation is over */
int drafter_begin(DecodeCtx *d, const Drafter *dr, const int32_t *prompt, int n_prompt, void **state);
int drafter_step(DecodeCtx *d, void *state);
void drafter_finish(DecodeCtx *d, void *state);

/* ---- rounds shared between requests (the serve engine) ----
   drafter_step is drafter_plan_open, the drafter's proposal, drafter_plan_close, one
   forward call over the planned nodes and their rows, then drafter_land. The engine
   makes the proposals of drafters with a propose_group together, and puts several
   requests' planned rounds, and standard requests' tokens, into one forward call and
   one LM-head call. */
typedef struct {
    int n;                      /* nodes: the tree's, then side nodes */
    const int32_t *token, *pos; /* [n] */
    const int32_t *parent;      /* [n] within the round, or NULL when mask is set */
    const uint8_t *mask;        /* [n][n] who sees whom, for a round with side nodes */
    int need_ids;               /* every node's argmax is wanted, whatever the mode */
    int alone;                  /* the drafter ran the first layers itself: the round
                                   cannot share a call (drafter_land with hid NULL runs it) */
} RoundNodes;
/* the bucket (a round of at most 2^b nodes) the controller would pick next, and for
   each bucket up to it the tokens its rounds keep beyond the bucket below and the nodes
   they run, on average (a bucket not seen yet: a guess) */
int drafter_wants(void *state, double *tok, double *nodes);
/* plans the next round within 2^cap nodes up to its proposal (*p): 1 when the
   generation is over, 0 */
int drafter_plan_open(DecodeCtx *d, void *state, int cap, Proposal *p);
/* once p is proposed: the round's nodes; -1 on error */
int drafter_plan_close(DecodeCtx *d, void *state, const Proposal *p, RoundNodes *rn);
/* the planned round's outcome from hid[n][dim], the nodes' states after the last layer,
   and their rows: ids[n] (their argmax) for a greedy generation without logprobs, else
   lg[n][vocab], their raw logits (ids too when at hand); sec: what the round cost, in
   seconds of a round run alone. 1 when the generation is over, 0, -1 on error */
int drafter_land(DecodeCtx *d, void *state, const float *hid, const float *lg, const int32_t *ids, double sec);

/* Medusa's --tree (decode/medusa.c): a JSON list of rank paths, as Medusa's mc_sim
   choices ("[[0], [1], [0, 0]]"), for n_heads heads, as nodes: node 0 is the root,
   node i (parent[i] < i) head depth[i]-1's rank-rank[i] candidate. Every path's
   parent path must be listed too. */
typedef struct {
    int n;
    int parent[MAX_TREE], rank[MAX_TREE], depth[MAX_TREE];
} MedusaTree;
int medusa_tree_parse(MedusaTree *tr, const char *spec, int n_heads);

#endif
