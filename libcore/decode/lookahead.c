/* lookahead.c — lookahead decoding (Fu et al., ICML 2024, "Break the Sequential
   Dependency of LLM Inference Using Lookahead Decoding"): one forward call per round
   runs three things at once —
     - the root (the last accepted token), whose logits give the next token;
     - the verification branch: up to G n-grams from the pool that start with the root
       token, as a trie below it (tree nodes, verified by the drafter loop);
     - the lookahead branch: a Jacobi window of W columns × up to N-1 levels (side
       nodes, never kept). Column i's level j guesses the token at P + 1 + i + j (P =
       the root's position); it sees the root, level 0 of columns 0..i (level 0: of
       the columns before it) and its own column's lower levels, so every window token
       has a full guess of the text between the root and itself.
   After the call each column's top level predicts the token one place further (a
   greedy Jacobi step, even when sampling: the window only proposes, verification keeps
   the output lossless). A full column (N-1 levels) and its prediction form an N-gram,
   which goes into the pool under its first token; the column then drops its oldest
   level. The pool also takes the text's own N-grams (prompt and output, as the
   reference implementation's prompt pool does), most recent first.

   How much a round runs follows the drafter loop's size controller: with max_nodes
   nodes allowed, the trie comes first and the window takes what is left (the columns
   that fit; the others wait), so a round costs what its size says and a plain step
   runs neither: where extra tokens in a pass are not free (a CPU), the controller
   then keeps the window as small as pays.
   With --adaptive the window widens after rounds whose drafts held and narrows after
   rounds whose drafts all failed (the dynamic window of LoPA-style lookahead).
   The window is not moved when a round accepts several tokens: it is a guess of the
   text ahead, and stays one. */
#include <stdlib.h>
#include <string.h>

#include "decode/drafter.h"

#define LOOK_DEFAULT_WINDOW 3
#define LOOK_DEFAULT_NGRAM 3
#define LOOK_MAX_WINDOW 32
#define LOOK_MAX_NGRAM 8
#define LOOK_MAX_GUESS 64
#define POOL_PER_KEY 8 /* n-grams kept under one first token, most recent first */
#define WIDEN_AFTER 2  /* --adaptive: rounds in a row whose drafts held */
#define NARROW_AFTER 4 /* --adaptive: rounds in a row whose drafts failed */

typedef struct {
    int n;
    int32_t g[POOL_PER_KEY][LOOK_MAX_NGRAM - 1]; /* the N-1 tokens after the key */
} PoolKey;

typedef struct {
    int V, W, N, G, adaptive, wmax;
    int w;                                            /* columns in use (W unless adaptive) */
    int lv[LOOK_MAX_WINDOW];                          /* levels each column holds, 1..N-1 */
    int32_t win[LOOK_MAX_NGRAM - 1][LOOK_MAX_WINDOW]; /* win[j][i]: column i, level j (oldest first) */
    int top[LOOK_MAX_WINDOW];                         /* side index of each column's top level, when it ran */
    int ran;                                          /* columns the last proposal ran */
    PoolKey **pool;                                   /* [vocab] allocated on first use */
    int32_t *text;                                    /* [n_prompt + max_new] prompt, then output */
    int len, n_prompt;
    int streak;   /* --adaptive: > 0 rounds that held, < 0 that failed */
    uint64_t rng; /* the window's first guesses (not the sampler's) */
    float rate;   /* oracle: right at each depth with this probability */
    const int32_t *oracle;
} Look;

/* ---- the pool ---- */

/* g[N-1] under key, first; an n-gram already there moves to the front */
static int pool_add(Look *lk, int key, const int32_t *g) {
    int m = lk->N - 1;
    PoolKey *p = lk->pool[key];
    if (!p) {
        if (!(p = lk->pool[key] = pd_alloc(sizeof *p))) return -1;
        p->n = 0;
    }
    int at = 0;
    while (at < p->n && memcmp(p->g[at], g, sizeof(int32_t) * m)) at++;
    if (at == p->n && p->n < POOL_PER_KEY) p->n++;
    if (at == POOL_PER_KEY) at--; /* full: the oldest goes */
    memmove(p->g[1], p->g[0], sizeof p->g[0] * at);
    memcpy(p->g[0], g, sizeof(int32_t) * m);
    return 0;
}

/* the text catches up with the output; each new token ends an N-gram of the text */
static int look_sync(Look *lk, const DecodeCtx *d) {
    for (; lk->len < lk->n_prompt + d->n_out; lk->len++) {
        lk->text[lk->len] = d->out[lk->len - lk->n_prompt];
        int first = lk->len - lk->N + 1;
        if (first >= 0 && pool_add(lk, lk->text[first], lk->text + first + 1)) return -1;
    }
    return 0;
}

/* ---- the verification branch ---- */

/* adds chain g[0..m) below the root, sharing the nodes already there; stops at cap */
static void trie_add(DraftTree *t, const int32_t *g, int m, int cap) {
    int at = 0;
    for (int j = 0; j < m; j++) {
        int child = -1;
        for (int c = at + 1; c < t->n && child < 0; c++)
            if (t->parent[c] == at && t->token[c] == g[j]) child = c;
        if (child < 0) {
            if (t->n >= cap) return;
            child = t->n++;
            t->parent[child] = at;
            t->token[child] = g[j];
            t->sampled[child] = 0;
        }
        at = child;
    }
}

/* ---- the lookahead branch ---- */

static int32_t random_text_token(Look *lk) {
    lk->rng ^= lk->rng << 13, lk->rng ^= lk->rng >> 7, lk->rng ^= lk->rng << 17;
    return lk->text[lk->rng % (uint64_t)lk->n_prompt];
}

/* the window's columns as side nodes, level by level (every node's visible nodes come
   before it): as many columns as max_side nodes, the context and the positions allow */
static void window_nodes(Look *lk, const DecodeCtx *d, DraftTree *t, int P, int max_side) {
    int n = t->n, seq_len = d->m->c.seq_len, cols = 0, side = 0, idx[LOOK_MAX_NGRAM - 1][LOOK_MAX_WINDOW];
    for (int i = 0; i < lk->w; i++) {
        int need = side + lk->lv[i];
        if (need > max_side || P + n + need > seq_len || P + 1 + i + lk->lv[i] - 1 >= seq_len) break;
        side = need;
        cols++;
    }
    lk->ran = cols;
    t->n_side = side;
    int s = 0;
    for (int j = 0; j < lk->N - 1; j++)
        for (int i = 0; i < cols; i++) {
            if (j >= lk->lv[i]) continue;
            idx[j][i] = s;
            uint8_t *row = t->side_mask[s];
            memset(row, 0, (size_t)n + s);
            row[0] = 1; /* the root; the committed context is always seen */
            for (int c = 0; c < (j ? i + 1 : i); c++) row[n + idx[0][c]] = 1;
            for (int k = 1; k < j; k++) row[n + idx[k][i]] = 1;
            t->token_side[s] = lk->win[j][i];
            t->side_pos[s] = P + 1 + i + j;
            if (j == lk->lv[i] - 1) lk->top[i] = s;
            s++;
        }
}

/* one Jacobi step for the columns that ran: each top level's argmax becomes a new
   level; full columns give the pool an N-gram and drop their oldest level */
static int window_step(Look *lk, const DraftTree *t, const int32_t *ids) {
    for (int i = 0; i < lk->ran; i++) {
        int32_t next = ids[t->n + lk->top[i]];
        if (lk->lv[i] < lk->N - 1) {
            lk->win[lk->lv[i]++][i] = next;
            continue;
        }
        int32_t g[LOOK_MAX_NGRAM - 1];
        for (int j = 1; j < lk->N - 1; j++) g[j - 1] = lk->win[j][i];
        g[lk->N - 2] = next;
        if (pool_add(lk, lk->win[0][i], g)) return -1;
        for (int j = 0; j < lk->N - 2; j++) lk->win[j][i] = lk->win[j + 1][i];
        lk->win[lk->N - 2][i] = next;
    }
    return 0;
}

/* --adaptive: a wider window after drafts held, a narrower one after they failed */
static void look_adapt(Look *lk, int held) {
    lk->streak = held ? (lk->streak > 0 ? lk->streak + 1 : 1) : (lk->streak < 0 ? lk->streak - 1 : -1);
    if (lk->streak >= WIDEN_AFTER && lk->w < lk->wmax) {
        lk->lv[lk->w] = 1;
        lk->win[0][lk->w++] = random_text_token(lk);
        lk->streak = 0;
    } else if (lk->streak <= -NARROW_AFTER && lk->w > 1) {
        lk->w--;
        lk->streak = 0;
    }
}

/* ---- the drafter ---- */

static int look_propose(Drafter *dr, DecodeCtx *d, DraftTree *t, int max_nodes, int max_depth) {
    Look *lk = dr->self;
    int m = lk->N - 1 < max_depth ? lk->N - 1 : max_depth, P = lk->n_prompt + d->n_out - 1;
    if (look_sync(lk, d)) return -1;
    if (lk->oracle) { /* depth j+1's right token is oracle[n_out + j]; a wrong one is the next id */
        int32_t g[LOOK_MAX_NGRAM - 1];
        for (int j = 0; j < m; j++) {
            int right = lk->oracle[d->n_out + j] >= 0 ? lk->oracle[d->n_out + j] : 0;
            g[j] = sampler_uniform(d->sampler) < lk->rate ? right : (right + 1) % d->m->c.vocab_size;
        }
        trie_add(t, g, m, max_nodes);
    }
    const PoolKey *p = lk->pool[t->token[0]];
    for (int k = 0; p && k < p->n && k < lk->G; k++) trie_add(t, p->g[k], m, max_nodes);
    lk->ran = 0;
    if (max_depth > 1) window_nodes(lk, d, t, P, max_nodes - t->n);
    return 0;
}

static int look_accepted(Drafter *dr, DecodeCtx *d, const DraftTree *t, const int *path, int n_path, int next,
                         const float *hidden, const int32_t *ids) {
    (void)d, (void)path, (void)next, (void)hidden;
    Look *lk = dr->self;
    if (t->n_side && lk->ran && window_step(lk, t, ids)) return -1;
    if (lk->adaptive && t->n > 1) look_adapt(lk, n_path > 1);
    return 0;
}

static int look_start(Drafter *dr, DecodeCtx *d, const int32_t *prompt, int n_prompt, const float *hidden) {
    (void)hidden;
    Look *lk = dr->self;
    if (!(lk->pool = pd_alloc(sizeof(PoolKey *) * lk->V))) return -1;
    memset(lk->pool, 0, sizeof(PoolKey *) * lk->V);
    if (!(lk->text = pd_alloc(sizeof(int32_t) * ((size_t)n_prompt + d->max_new)))) return -1;
    memcpy(lk->text, prompt, sizeof(int32_t) * n_prompt);
    for (int first = 0; first + lk->N <= n_prompt; first++) /* the prompt's N-grams; sync adds the output's */
        if (pool_add(lk, prompt[first], prompt + first + 1)) return -1;
    lk->len = lk->n_prompt = n_prompt;
    for (int i = 0; i < lk->w; i++) {
        lk->lv[i] = 1;
        lk->win[0][i] = random_text_token(lk);
    }
    return 0;
}

static void look_free(Drafter *dr) {
    Look *lk = dr->self;
    if (!lk) return;
    for (int i = 0; lk->pool && i < lk->V; i++) free(lk->pool[i]);
    free(lk->pool);
    free(lk->text);
    free(lk);
}

typedef struct {
    int window, ngram, guess, adaptive;
} LookOptions;

static const MethodOption look_options[] = {
    {"window", OPT_INT, 1, LOOK_MAX_WINDOW, "W", "3", "the Jacobi window", offsetof(LookOptions, window), 0, NULL},
    {"ngram", OPT_INT, 2, LOOK_MAX_NGRAM, "N", "3", "the n-gram size", offsetof(LookOptions, ngram), 0, NULL},
    {"guess", OPT_INT, 1, LOOK_MAX_GUESS, "G", "the window", "candidate n-grams verified", offsetof(LookOptions, guess),
     0, NULL},
    {"adaptive", OPT_SWITCH, 0, 0, NULL, NULL, "the window widens and narrows with acceptance",
     offsetof(LookOptions, adaptive), 0, NULL},
    DRAFTER_OPTIONS,
};

static int look_begin(DecodeCtx *d, const int32_t *prompt, int n_prompt, void **state) {
    static const LookOptions look_none;
    const LookOptions *o = d->mopt ? d->mopt : &look_none;
    const MethodShared *sh = &d->opt;
    int W = o->window ? o->window : LOOK_DEFAULT_WINDOW, N = o->ngram ? o->ngram : LOOK_DEFAULT_NGRAM;
    if (W * (N - 1) > MAX_TREE)
        return pd_error("lookahead: --window %d × (--ngram %d - 1) is over the %d window nodes a round can run", W, N,
                        MAX_TREE);
    Look *lk = pd_alloc(sizeof *lk);
    if (!lk) return -1;
    memset(lk, 0, sizeof *lk);
    lk->W = lk->w = W;
    lk->N = N;
    lk->G = o->guess ? o->guess : W;
    lk->adaptive = o->adaptive;
    lk->wmax = lk->adaptive ? 2 * W : W;
    if (lk->wmax > LOOK_MAX_WINDOW) lk->wmax = LOOK_MAX_WINDOW;
    if (lk->wmax * (N - 1) > MAX_TREE) lk->wmax = MAX_TREE / (N - 1);
    lk->V = d->m->c.vocab_size;
    lk->rng = 0x9e3779b97f4a7c15ull;
    lk->rate = sh->oracle_rate;
    lk->oracle = sh->oracle_rate > 0 ? sh->oracle : NULL;
    Drafter dr = {lk, look_start, look_propose, look_accepted, look_free, 0, -1, NULL, 0};
    return drafter_begin(d, &dr, prompt, n_prompt, state);
}

const DecodeMethod method_lookahead = {
    .name = "lookahead",
    .summary = "a Jacobi window fills an n-gram pool; its n-grams are verified in the same pass",
    .options = look_options,
    .n_options = sizeof look_options / sizeof look_options[0],
    .options_size = sizeof(LookOptions),
    .samples = 1,
    .oracle = 1,
    .begin = look_begin,
    .step = drafter_step,
    .finish = drafter_finish};
