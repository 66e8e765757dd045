/* engine.c — see engine.h. One mutex guards the queue, the running set and what
   readers see of a job (its tokens, its end). The KV cache, the model's workspace and
   every job's sequence belong to the one scheduler thread, which runs standard steps
   and the methods' steps alike, so forward calls run without the lock. */
#include "decode/engine.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "decode/drafter.h"

enum { JOB_QUEUED, JOB_RUNNING, JOB_DONE };

struct Job {
    int32_t *ctx; /* [n_prompt + max_new] the prompt, then the generated tokens */
    int n_prompt, n_ctx, max_new;
    Sampler sampler;
    const DecodeMethod *method; /* NULL: standard steps only */
    int seq, n_kv;              /* its KV sequence (-1: none yet) and the positions it holds */
    int blocks;                 /* pool blocks it needs alone at most */
    int64_t admitted;           /* the admission's number: the last admitted is preempted first */
    int published;              /* its prompt's blocks are in the prefix cache */
    int state, cancelled, refs, waited;
    Engine *engine;
    DecodeCtx dc; /* method mode: its method's generation, stepped by the scheduler */
    DecodeRun gen;
    int gen_on;
    float *start_h;                       /* [dim] a drafter's: the state its last standard step chose from */
    int start_at;                         /* the context's length then (0: none) */
    float *states;                        /* [n_prompt][dim] the prompt's states (a reads_prompt method's, or
                                             for the prefix cache), from its steps or the cache */
    int n_states;                         /* positions 0 .. n_states - 1 kept */
    const uint8_t *mask;                  /* the step's planned round's own mask (side nodes), or NULL */
    double draft_cost;                    /* seconds a drafting round spends outside the forward call
                                             (proposing, accepting), on average (budget()) */
    TokenLogprob *lp;                     /* [n_prompt + max_new] by position, or NULL */
    int n_top, prompt_lp, prompt_lp_done; /* logprobs: alternatives; the prompt's asked, computed */
    int lp_lost;                          /* a method could not keep a token's logits */
    const char *finish;
    Job *next; /* the queue's order */
};

#define MAX_PARALLEL 256
#define MAX_POOLS 8
#define RATE_SECS 10

typedef struct {
    double sw, sn, snn, st, snt; /* decayed sums: weight, nodes, nodes², seconds, nodes·seconds */
} CostLine;

struct Engine {
    Model *m;
    Runner *fwd; /* the step thread's forward workspace */
    KVCache kv;
    EngineOptions o;
    pthread_mutex_t mu;
    pthread_cond_t work, out; /* the step thread waits on work, readers on out */
    pthread_t thread;
    int quit;
    struct {
        const DecodeMethod *method;
        void *pool;
    } pools[MAX_POOLS]; /* what a method's requests share (DecodeMethod.pool_new), made on first use */
    int n_pools;
    int aborting;     /* engine_abort: every job ends, new ones end at once */
    Job *head, *tail; /* the queue */
    int n_queued;
    Job *run[MAX_PARALLEL]; /* the running batch */
    int n_run;
    int64_t admissions;
    EngineStats st;
    int64_t rate[RATE_SECS], rate_sec[RATE_SECS]; /* generated tokens per second, a ring */
    /* step buffers: up to parallel + prefill_chunk tokens, and the drafters' rounds */
    int cap;
    int32_t *tok, *pos, *seq;  /* [cap] */
    int32_t *parent;           /* [cap] within the step's batch (-2: a round's mask says) */
    uint8_t *mask;             /* [cap][cap] when a round has side nodes */
    CostLine line;             /* what a step of n nodes costs (budget()) */
    double *tab;               /* [cap + 1] the same per node count: a running mean */
    int *tab_n;                /* [cap + 1] the steps each mean has seen */
    double *curve;             /* [cap + 1] what budget() prices n nodes at (curve_fill) */
    float *hidden;             /* [cap][dim] */
    float *rows, *logits;      /* [cap][dim], [cap][vocab] */
    float *raw;                /* [vocab] a row's logits before sampling changes them */
    Job **row_job;             /* [cap] the job whose token at row_pos a row's logits give: */
    int32_t *row_at, *row_pos; /* its next (sampled), or a prompt token's (logprobs); the */
    int32_t *row_tok;          /* batch row they come from, the token sampled */
};

/* ---- bookkeeping (under the lock) ---- */

/* blocks for n positions */
static int blocks_for(const Engine *e, int n) {
    int b = (n + e->o.block_size - 1) / e->o.block_size;
    return b < e->kv.max_blocks ? b : e->kv.max_blocks;
}

/* positions j's next step takes: its context and next token, and while its method runs,
   the tree and side nodes past them */
static int room_for(const Job *j) { return j->n_ctx + 1 + (j->gen_on ? 2 * MAX_TREE : 0); }

/* the blocks j's KV sequence holds (its method's, while the method runs) */
static int held(const Engine *e, const Job *j) {
    int s = j->gen_on ? j->dc.seq : j->seq;
    return s >= 0 ? e->kv.n_table[s] : 0;
}

/* the blocks j still needs for its context and its next token (or tree) */
static int due(const Engine *e, const Job *j) {
    int d = blocks_for(e, room_for(j)) - held(e, j);
    return d > 0 ? d : 0;
}

/* the queue's first request has a place, and the pool room for its context once the
   running requests have what their next steps take */
static int head_fits(const Engine *e) {
    const Job *j = e->head;
    if (!j || e->n_run >= e->o.parallel) return 0;
    int room = kv_blocks_available(&e->kv);
    for (int i = 0; i < e->n_run; i++) room -= due(e, e->run[i]);
    return blocks_for(e, room_for(j)) <= room;
}

static void admit(Engine *e) {
    int open = e->o.continuous || e->n_run == 0;
    while (open && head_fits(e)) {
        Job *j = e->head;
        e->head = j->next;
        if (!e->head) e->tail = NULL;
        e->n_queued--;
        j->state = JOB_RUNNING;
        j->admitted = e->admissions++;
        e->run[e->n_run++] = j;
    }
    if (e->head && !e->head->waited) e->head->waited = 1, e->st.waited++; /* it did not fit */
}

static void job_unref(Job *j) {
    if (--j->refs) return;
    sampler_free(&j->sampler);
    free(j->ctx);
    free(j->lp);
    free(j->start_h);
    free(j->states);
    free(j);
}

/* is j's method a drafter? its rounds run inside the shared step */
static int drafts(const Job *j) { return j->method && j->method->step == drafter_step; }
static int shares(const Job *j) { return j->gen_on && drafts(j); }
/* does its method start from the prompt's states (Job.states)? */
static int reads_prompt(const Job *j) { return drafts(j) && j->method->reads_prompt; }

/* logprobs wanted for the prompt, and not all computed yet: until then the job takes
   standard steps, which compute them, and is not over */
static int prompt_lp_due(const Job *j) { return j->prompt_lp && !j->prompt_lp_done; }

/* a token's TokenLogprob from the logits x[V] it was chosen from (in double: the
   numbers are reported, not sampled from) */
static void logprob_fill(TokenLogprob *lp, const float *x, int V, int token, int n_top) {
    float mx = x[0];
    for (int i = 1; i < V; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)x[i] - mx);
    double lse = mx + log(sum);
    lp->logprob = (float)(x[token] - lse);
    for (int i = 0, n = 0; n_top > 0 && i < V; i++) { /* insertion into the best n_top */
        if (n == n_top && !(x[i] > x[lp->top[n - 1]])) continue;
        int k = n < n_top ? n++ : n - 1;
        for (; k > 0 && x[i] > x[lp->top[k - 1]]; k--) lp->top[k] = lp->top[k - 1];
        lp->top[k] = i;
    }
    for (int k = 0; k < n_top; k++) lp->top_logprob[k] = (float)(x[lp->top[k]] - lse);
}

static void kv_stats(Engine *e) {
    e->st.kv_free = kv_blocks_available(&e->kv), e->st.kv_cached = e->kv.n_idle;
    e->st.prefix_queried = e->kv.prefix_queried, e->st.prefix_hits = e->kv.prefix_hits;
}

/* j's standard-step sequence goes: its full blocks stay in the prefix cache */
static void drop_seq(Engine *e, Job *j) {
    if (j->seq < 0) return;
    if (!e->o.no_prefix_cache) kv_prefix_publish(&e->kv, j->seq, j->ctx, j->n_kv, j->states, j->n_states);
    kv_seq_free(&e->kv, j->seq);
    j->seq = -1, j->n_kv = 0, j->start_at = 0;
}

/* ends a job: its blocks go back; readers are told */
static void retire(Engine *e, int i, const char *finish) {
    Job *j = e->run[i];
    drop_seq(e, j);
    j->finish = j->finish ? j->finish : finish;
    j->state = JOB_DONE;
    e->run[i] = e->run[--e->n_run];
    kv_stats(e);
    job_unref(j);
    pthread_cond_broadcast(&e->out);
}

static int job_full(const Job *j) { return j->n_ctx - j->n_prompt >= j->max_new && !prompt_lp_due(j); }
static int job_over(const Job *j) { return j->cancelled || j->finish || job_full(j); }

static void reap(Engine *e) {
    for (int i = e->n_run - 1; i >= 0; i--) {
        Job *j = e->run[i];
        if (j->cancelled) retire(e, i, e->aborting ? "abort" : "cancelled");
        else if (j->finish) retire(e, i, j->finish);
        else if (job_full(j)) retire(e, i, "length");
    }
}

static void count_tokens(Engine *e, int n) {
    int64_t sec = (int64_t)pd_now();
    int b = (int)(sec % RATE_SECS);
    if (e->rate_sec[b] != sec) e->rate_sec[b] = sec, e->rate[b] = 0;
    e->rate[b] += n;
    e->st.gen_tokens += n;
}

/* a new token for j; ends it on an end token */
static void append(Engine *e, Job *j, int token) {
    if (token_ends_text(e->m, token)) j->finish = "stop";
    else j->ctx[j->n_ctx++] = token, count_tokens(e, 1);
    pthread_cond_broadcast(&e->out);
}

/* ---- a step: every running request's work in one forward call ----
   Requests taking standard steps feed their unprocessed context (the prompt in chunks
   from a shared budget, then a token a step). Requests running a drafter (their
   method's step is drafter_step) feed the round their drafter plans, within the nodes
   budget() gives them. One forward call, one LM-head call over every row that needs
   one, then each request takes its rows: the standard ones a token, the drafters their
   round's outcome (drafter_land), by the same lossless rules as alone. */

static void add_row(Engine *e, int *n_rows, Job *j, int at, int pos) {
    e->row_job[*n_rows] = j, e->row_at[*n_rows] = at, e->row_pos[(*n_rows)++] = pos;
}

/* which tokens each job taking standard steps feeds this step: its unprocessed context,
   the prompt in chunks from a shared budget (a chain: each sees those before it);
   returns the batch size */
static int gather(Engine *e, int *take, int *n_rows) {
    int n = 0, budget = e->o.prefill_chunk;
    *n_rows = 0;
    for (int i = 0; i < e->n_run; i++) {
        Job *j = e->run[i];
        int left = j->gen_on ? 0 : j->n_ctx - j->n_kv;
        take[i] = left <= 1 ? left : left < budget ? left : budget;
        if (left > 1) budget -= take[i];
        for (int k = 0; k < take[i]; k++, n++) {
            int p = j->n_kv + k;
            e->tok[n] = j->ctx[p], e->pos[n] = p, e->seq[n] = j->seq, e->parent[n] = k ? n - 1 : -1;
            if (prompt_lp_due(j) && p + 1 < j->n_prompt)
                add_row(e, n_rows, j, n, p + 1); /* a prompt token's logprobs */
        }
        /* its next token is due, and allowed: its last row's logits */
        if (take[i] && j->n_kv + take[i] == j->n_ctx && j->n_ctx - j->n_prompt < j->max_new)
            add_row(e, n_rows, j, n - 1, j->n_ctx);
    }
    return n;
}

static void preempt_last(Engine *e);

/* blocks for what each job feeds this step, where the pool is short the last admitted
   job waiting again: first a method's whole round (so its plan never fails for room),
   then, with a sequence for every job taking standard steps (from the prefix cache, but
   for a prompt whose logprobs are due: they come from running it), their tokens.
   Returns the standard tokens' count, -1 on error */
static int gather_room(Engine *e, int *take, int *n_rows) {
    pthread_mutex_lock(&e->mu);
    for (int i = 0; i < e->n_run; i++) {
        Job *j = e->run[i];
        int room = blocks_for(e, room_for(j)) * e->o.block_size;
        if (j->gen_on && kv_reserve(&e->kv, j->dc.seq, room)) preempt_last(e), i = -1; /* the set changed: again */
    }
    pthread_mutex_unlock(&e->mu);
    for (;;) {
        for (int i = 0; i < e->n_run; i++) {
            Job *j = e->run[i];
            if (j->seq >= 0 || j->gen_on) continue;
            if ((j->seq = kv_seq_new(&e->kv)) < 0) return pd_error("serve: no free KV sequence");
            /* a job keeping its prompt's states takes only blocks that keep theirs (a
               resumed one's context is past its prompt: its method runs it again anyway) */
            if (!e->o.no_prefix_cache && !prompt_lp_due(j)) {
                float *st = j->states && j->n_ctx == j->n_prompt ? j->states : NULL;
                j->n_kv = kv_prefix_attach(&e->kv, j->seq, j->ctx, j->n_ctx - 1, st);
                if (st && j->n_kv > j->n_states) j->n_states = j->n_kv;
            }
        }
        int n = gather(e, take, n_rows), i = 0;
        while (i < e->n_run && (!take[i] || kv_reserve(&e->kv, e->run[i]->seq, e->run[i]->n_kv + take[i]) == 0)) i++;
        if (i == e->n_run) return n;
        pthread_mutex_lock(&e->mu);
        preempt_last(e);
        pthread_mutex_unlock(&e->mu);
    }
}

/* ---- the node budget ----
   A step's forward call and LM-head call cost what the steps of as many nodes n cost
   (a running mean per n; between the sizes seen, interpolated, as the matmul's cost
   jumps at some sizes, 13 tokens on the 110m), and past them a line a + b·n (decaying least
   squares, as a drafter's own controller fits its rounds); a request whose round
   drafts adds what its drafter spends outside the call (its heads or draft model, the
   walk), measured per request. Every drafter starts the step at one node (a plain
   round: a token); then, best tokens a second first, a drafter's
   round grows by a bucket (drafter_wants: the tokens and nodes its controller expects
   of it) while that raises the step's tokens a second: so as the batch grows and a
   node costs more of the whole, the trees shrink towards plain rounds, and the step
   never runs what its own numbers say slows it. A request alone is left to its
   controller, as decode's; a fixed tree (--fixed-tree) to itself. */
#define DECAY 0.97
#define STEP_NODES MAX_ROUND_NODES /* nodes of planned rounds a step runs at most */

static void line_add(Engine *e, double n, double t) {
    CostLine *l = &e->line;
    l->sw = l->sw * DECAY + 1, l->sn = l->sn * DECAY + n, l->snn = l->snn * DECAY + n * n;
    l->st = l->st * DECAY + t, l->snt = l->snt * DECAY + n * t;
}

/* a and b; until two sizes have been seen, a node is guessed at an eighth of the mean
   call (a guess that only lets the first trees be tried) */
static void line_get(const Engine *e, double *a, double *b) {
    const CostLine *l = &e->line;
    double det = l->sw * l->snn - l->sn * l->sn;
    if (l->sw <= 0) {
        *a = 1, *b = 0.125;
        return;
    }
    double mn = l->sn / l->sw, mt = l->st / l->sw;
    if (det > 1e-9 * l->sw * l->snn) *b = (l->sw * l->snt - l->sn * l->st) / det;
    else *b = mt / (mn + 8);
    if (*b < 1e-3 * mt) *b = 1e-3 * mt;
    *a = mt - *b * mn;
    if (*a < 1e-3 * mt) *a = 1e-3 * mt;
}

#define TAB_MIN 3 /* steps of a size before its own mean counts */

static void tab_add(Engine *e, int n, double t) {
    if (n < 1 || n > e->cap) return;
    int k = ++e->tab_n[n];
    e->tab[n] += (k < 10 ? 1.0 / k : 0.1) * (t - e->tab[n]);
}

/* curve[n], what a step of n nodes costs: its own mean once seen enough, else between
   the nearest sizes seen (the matmul's cost is not a line: it jumps at some sizes), else
   the line. Once a step, so that pricing a size is a lookup */
static void curve_fill(Engine *e, double a, double b) {
    int lo = -1; /* the last size seen enough (-1: none yet) */
    for (int n = 1; n <= e->cap; n++) {
        if (e->tab_n[n] < TAB_MIN) continue;
        for (int k = lo + 1; k < n; k++) { /* the gap below n */
            double t = e->tab[n] - b * (n - k);
            e->curve[k] = lo > 0  ? e->tab[lo] + (e->tab[n] - e->tab[lo]) * (k - lo) / (n - lo)
                          : t > 0 ? t
                                  : e->tab[n] * k / n;
        }
        e->curve[n] = e->tab[n], lo = n;
    }
    for (int k = lo + 1; k <= e->cap; k++) e->curve[k] = lo > 0 ? e->tab[lo] + b * (k - lo) : a + b * k;
}

static double step_cost(const Engine *e, int n, double a, double b) { return n > e->cap ? a + b * n : e->curve[n]; }

/* cap[i]: the bucket run[i]'s drafter may plan (its round: at most 2^cap nodes) */
static void budget(Engine *e, int n_std, int n_gen, int *cap) {
    double tok[MAX_PARALLEL][10], nodes[MAX_PARALLEL][10], a, b, N = n_std, T = n_gen, C, D = 0;
    int want[MAX_PARALLEL], cur[MAX_PARALLEL];
    line_get(e, &a, &b);
    for (int i = 0; i < e->n_run; i++) {
        cap[i] = cur[i] = 0, want[i] = -1;
        if (!shares(e->run[i])) continue;
        want[i] = drafter_wants(e->run[i]->gen.state, tok[i], nodes[i]);
        if (want[i] > 9) want[i] = 9;
        N += 1, T += 1;
        if (e->run[i]->dc.opt.fixed_tree) cur[i] = want[i], N += nodes[i][want[i]] - 1; /* tests: no budget */
    }
    if (e->n_run == 1) { /* alone: its own controller decides */
        cap[0] = want[0] >= 0 ? want[0] : 0;
        return;
    }
    curve_fill(e, a, b);
    C = step_cost(e, (int)(N + 0.5), a, b);
    for (;;) {
        int best = -1;
        double br = 0, dn = 0, dt = 0, dc = 0;
        for (int i = 0; i < e->n_run; i++) {
            if (cur[i] >= want[i]) continue;
            double n1 = nodes[i][cur[i] + 1] - nodes[i][cur[i]];
            n1 = n1 < 1 ? 1 : n1;
            double m = step_cost(e, (int)(N + n1 + 0.5), a, b) - (C - D);
            m = m > 0.1 * b * n1 ? m : 0.1 * b * n1; /* a mean's noise never makes nodes free */
            double c1 = m + (cur[i] ? 0 : e->run[i]->draft_cost), r = tok[i][cur[i] + 1] / c1;
            if (r > br) br = r, best = i, dn = n1, dt = tok[i][cur[i] + 1], dc = c1;
        }
        /* more tokens a second: dt/dc beats what the step gives now */
        if (best < 0 || N + dn > STEP_NODES + n_std || dt * C <= T * dc) break;
        cur[best]++, N += dn, T += dt;
        D += e->run[best]->draft_cost * (cur[best] == 1);
        C = step_cost(e, (int)(N + 0.5), a, b) + D;
    }
    for (int i = 0; i < e->n_run; i++) cap[i] = cur[i];
}

/* ---- methods ----
   A job with a method takes standard steps until its context is in (its prompt comes
   in batched with the others'), then its method starts on that sequence: a drafter's
   rounds run in the shared step, any other method (AdaDecode's layer schedule) runs a
   round a step on its own. When speculation is off (more than spec_max_batch requests)
   the methods stop between rounds and standard steps go on from the same sequence. */

/* each accepted token, to the job's readers; returns 1 (the method stops) when the job
   is cancelled or over */
static int method_emit(void *ctx, int prev, int token) {
    (void)prev;
    Job *j = ctx;
    Engine *e = j->engine;
    pthread_mutex_lock(&e->mu);
    if (j->lp_lost) { /* its logprobs are gone: the request fails rather than answer without */
        fprintf(stderr, "serve: out of memory keeping a token's logits for its logprobs\n");
        j->finish = "error";
    } else append(e, j, token);
    e->st.method_tokens++;
    kv_stats(e);
    int stop = j->cancelled || j->finish;
    pthread_mutex_unlock(&e->mu);
    return stop;
}

/* the logits each accepted token came from, before method_emit appends it; only the
   scheduler thread appends, so n_ctx stays as it is meanwhile */
static void method_logits(void *ctx, int token, const float *logits) {
    Job *j = ctx;
    if (logits) logprob_fill(&j->lp[j->n_ctx], logits, j->engine->m->c.vocab_size, token, j->n_top);
    else j->lp_lost = 1;
}

/* ends j's method (its generation goes); the job goes on with standard steps from the
   method's sequence, cut to what it holds of the context in every layer, or ends.
   Under the lock. */
static void method_stop(Engine *e, Job *j) {
    if (!j->gen_on) return;
    int kept = decode_kept(&j->dc, j->n_ctx - j->dc.n_out); /* the method's prompt and what it emitted */
    e->st.drafted += j->dc.drafted, e->st.drafts_kept += j->dc.drafted - j->dc.rejected;
    decode_run_finish(&j->gen);
    j->seq = j->dc.seq, j->dc.seq = -1;
    decode_free(&j->dc);
    j->gen_on = 0;
    j->n_kv = j->seq >= 0 && kv_truncate(&e->kv, j->seq, kept) == 0 ? kept : 0;
    if (!j->n_kv && j->seq >= 0) kv_seq_free(&e->kv, j->seq), j->seq = -1;
}

static void stop_methods(Engine *e) {
    for (int i = 0; i < e->n_run; i++) method_stop(e, e->run[i]);
}

/* the running job admitted last gives its blocks back and waits at the queue's head,
   its context (prompt and tokens so far) kept: it resumes from there. Under the lock. */
static void preempt_last(Engine *e) {
    int last = 0;
    for (int i = 1; i < e->n_run; i++)
        if (e->run[i]->admitted > e->run[last]->admitted) last = i;
    Job *j = e->run[last];
    method_stop(e, j);
    drop_seq(e, j);
    e->run[last] = e->run[--e->n_run];
    j->state = JOB_QUEUED;
    j->next = e->head, e->head = j;
    if (!e->tail) e->tail = j;
    e->n_queued++;
    e->st.preempted++;
    kv_stats(e);
}

/* a method that returned rc (1: its generation is over; -1: failed) stops; the job
   ends unless it has room to go on. Under the lock. */
static void method_over(Engine *e, Job *j, int rc) {
    if (rc < 0) fprintf(stderr, "serve: %s\n", pd_errmsg()), j->finish = "error";
    /* a method that stopped by itself met an end token (which it does not emit), its
       budget (reap sees it) or the model's context */
    else if (!j->cancelled && !j->finish && j->n_ctx - j->n_prompt < j->max_new)
        j->finish = j->n_ctx >= e->m->c.seq_len ? "length" : "stop";
    method_stop(e, j);
}

/* methods run while the batch holds at most spec_max_batch requests */
static int speculating(const Engine *e) { return e->o.spec_max_batch && e->n_run <= e->o.spec_max_batch; }

/* may j start its method now? a method, speculation on, its context in but the last
   token, no prompt logprobs still due; a drafter once a standard step has given it that
   token and the state it came from (start_from), any other method running the token in
   its start */
static int method_due(const Engine *e, const Job *j) {
    return j->method && !j->gen_on && speculating(e) && j->seq >= 0 && j->n_kv == j->n_ctx - 1 && !prompt_lp_due(j) &&
           !job_over(j) && (!drafts(j) || j->start_at == j->n_ctx);
}

/* after a step that gave j a token from the state in row h: a drafter about to start
   starts from them, so its start runs nothing alone (the token's own row comes in its
   first round) */
static void start_from(const Engine *e, Job *j, const float *h) {
    if (drafts(j) && !j->gen_on && speculating(e) && j->n_kv == j->n_ctx - 1) {
        memcpy(j->start_h, h, sizeof(float) * e->m->c.dim);
        j->start_at = j->n_ctx;
    }
}

/* what the requests of method m share in this engine, made on first use (NULL: each
   its own) */
static void *method_pool(Engine *e, const DecodeMethod *m) {
    if (!m->pool_new) return NULL;
    for (int i = 0; i < e->n_pools; i++)
        if (e->pools[i].method == m) return e->pools[i].pool;
    void *p =
        e->n_pools < MAX_POOLS ? m->pool_new(e->m, &e->o.opt, e->kv.max_seqs, e->kv.n_blocks * e->kv.block_size) : NULL;
    if (p) e->pools[e->n_pools].method = m, e->pools[e->n_pools++].pool = p;
    return p;
}

/* starts j's method on j's sequence (then its first round, for a method that does not
   share the step), or runs one round of a method that does not share it; under the
   lock, which it leaves while the model runs */
static void method_turn(Engine *e, Job *j) {
    int rc, started = j->gen_on, n0 = j->n_ctx, given = drafts(j);
    if (!started) {
        /* given: the context's last token is the method's first, chosen already */
        if (decode_init(&j->dc, e->m, &e->kv, &j->sampler, j->max_new - (j->n_ctx - j->n_prompt) + given)) {
            fprintf(stderr, "serve: %s\n", pd_errmsg());
            j->finish = "error";
            return;
        }
        kv_seq_free(&e->kv, j->dc.seq);
        j->dc.seq = j->seq, j->dc.reuse = j->n_kv; /* the method goes on from the job's sequence */
        j->seq = -1, j->n_kv = 0;
        j->dc.opt = e->o.opt;
        j->dc.pool = method_pool(e, j->method);
        if (given) j->dc.given_hidden = j->start_h, j->dc.given_token = j->ctx[--n0];
        if (given && j->states) j->dc.given_states = j->states, j->dc.n_given_states = j->n_states;
        j->dc.emit = method_emit;
        j->dc.emit_ctx = j;
        if (j->lp) j->dc.emit_logits = method_logits;
        j->gen_on = 1;
    }
    while (kv_reserve(&e->kv, j->dc.seq, blocks_for(e, room_for(j)) * e->o.block_size)) {
        preempt_last(e);
        if (j->state != JOB_RUNNING) return;
    }
    pthread_mutex_unlock(&e->mu);
    rc = started ? decode_run_step(&j->gen) : decode_run_begin(&j->gen, j->method, &j->dc, j->ctx, n0);
    pthread_mutex_lock(&e->mu);
    if (!started) { /* the kept states are read: a later start runs its context again */
        e->st.method_prefilled += j->dc.n_prefilled;
        free(j->states), j->states = NULL;
    }
    j->dc.given_hidden = j->dc.given_states = NULL, j->start_at = 0;
    if (rc) method_over(e, j, rc);
}

/* run[i]'s proposed round into the batch from row *n (at[i], got[i] its rows); a round
   that cannot share the call runs alone now. got[i] < 0: over (-2) or failed (-1), its
   method stops after the step */
static void add_round(Engine *e, int i, const Proposal *p, int *n, int *at, int *got, int *masked) {
    Job *j = e->run[i];
    RoundNodes rn;
    int rc = drafter_plan_close(&j->dc, j->gen.state, p, &rn);
    if (rc == 0 && rn.alone) rc = drafter_land(&j->dc, j->gen.state, NULL, NULL, NULL, 0);
    else if (rc == 0) {
        at[i] = *n, got[i] = rn.n;
        for (int k = 0, b = *n; k < rn.n; k++) {
            e->tok[b + k] = rn.token[k], e->pos[b + k] = rn.pos[k], e->seq[b + k] = j->dc.seq;
            e->parent[b + k] = rn.parent ? (rn.parent[k] >= 0 ? b + rn.parent[k] : -1) : -2;
        }
        j->mask = rn.mask; /* a round with side nodes: its own mask, for the batch's */
        *masked |= rn.mask != NULL;
        *n += rn.n;
    }
    if (rc) got[i] = rc < 0 ? -1 : -2;
}

/* the proposals left in prop[] (drafters with a propose_group), made together by kind
   and pool (DecodeCtx.pool; none: alone), each request charged its share of the time;
   returns how many were made in a group of two or more */
static int group_proposals(Engine *e, Proposal *prop, double *spent, int *got) {
    DecodeCtx *gd[MAX_PARALLEL];
    Proposal gp[MAX_PARALLEL];
    int gi[MAX_PARALLEL], grouped = 0;
    uint8_t done[MAX_PARALLEL] = {0};
    for (int i = 0; i < e->n_run; i++) {
        if (!prop[i].dr || done[i]) continue;
        void *pool = e->run[i]->dc.pool;
        int k = 0;
        for (int x = i; x < e->n_run; x++)
            if (x == i || (pool && prop[x].dr && !done[x] && prop[x].dr->propose_group == prop[i].dr->propose_group &&
                           e->run[x]->dc.pool == pool))
                gd[k] = &e->run[x]->dc, gp[k] = prop[x], gi[k++] = x, done[x] = 1;
        double t = pd_now();
        int rc = prop[i].dr->propose_group(gd, gp, k);
        t = (pd_now() - t) / k;
        for (int g = 0; g < k; g++) {
            spent[gi[g]] += t;
            if (rc) got[gi[g]] = -1, prop[gi[g]].dr = NULL;
        }
        grouped += k > 1 ? k : 0;
    }
    return grouped;
}

/* the step: standard tokens and planned rounds in one forward call, then their rows */
static int step(Engine *e) {
    int take[MAX_PARALLEL], cap[MAX_PARALLEL], at[MAX_PARALLEL], got[MAX_PARALLEL], n_rows = 0, dim = e->m->c.dim;
    double spent[MAX_PARALLEL]; /* each drafter's seconds outside the call */
    int V = e->m->c.vocab_size;
    double t0 = pd_now();
    int n = gather_room(e, take, &n_rows);
    if (n < 0) return -1;
    int n_gen = 0, masked = 0, n_std = n;
    for (int r = 0; r < n_rows; r++) n_gen += e->row_pos[r] >= e->row_job[r]->n_prompt;
    budget(e, n, n_gen, cap);
    /* each drafter's round, in the room left: planned, proposed (a proposal made in a
       group after the others, with the room its nodes may take held), its nodes added */
    Proposal prop[MAX_PARALLEL];
    int pending = 0, deferred = 0; /* drafters still to plan (a node each at least); rows the later proposals hold */
    for (int i = 0; i < e->n_run; i++) pending += shares(e->run[i]);
    for (int i = 0; i < e->n_run; i++) {
        Job *j = e->run[i];
        at[i] = got[i] = 0, prop[i].dr = NULL;
        if (!shares(j)) continue;
        int left = e->cap - n - deferred - (pending-- - 1), c = cap[i];
        while (c > 0 && (1 << c) + MAX_TREE > left) c--; /* side nodes may come on top */
        double tp = pd_now();
        if (drafter_plan_open(&j->dc, j->gen.state, c, &prop[i])) got[i] = -2, prop[i].dr = NULL;
        else if (prop[i].dr && prop[i].dr->propose_group) {
            int most = prop[i].dr->most;
            deferred += most > 0 && most < prop[i].max_nodes ? most : prop[i].max_nodes;
        } else {
            if (prop[i].dr && prop[i].dr->propose(prop[i].dr, &j->dc, prop[i].t, prop[i].max_nodes, prop[i].max_depth))
                got[i] = -1;
            else add_round(e, i, &prop[i], &n, at, got, &masked);
            prop[i].dr = NULL;
        }
        spent[i] = pd_now() - tp;
    }
    int grouped = group_proposals(e, prop, spent, got);
    for (int i = 0; i < e->n_run; i++)
        if (prop[i].dr) add_round(e, i, &prop[i], &n, at, got, &masked);
    if (masked) { /* a round with side nodes: the whole batch by an explicit mask */
        memset(e->mask, 0, (size_t)n * n);
        for (int i = 0; i < n; i++)
            for (int a = e->parent[i]; a >= 0; a = e->parent[a]) e->mask[(size_t)i * n + a] = 1;
        for (int i = 0; i < e->n_run; i++)
            if (got[i] > 0 && e->run[i]->mask)
                for (int r = 0; r < got[i]; r++)
                    for (int c = 0; c < got[i]; c++)
                        e->mask[(size_t)(at[i] + r) * n + at[i] + c] = e->run[i]->mask[(size_t)r * got[i] + c];
    }
    int planned = n - n_std, trees = 0, others = n_std > 0;
    for (int i = 0; i < e->n_run; i++) trees += got[i] > 1, others += got[i] > 0;
    Batch b = {n, e->tok, e->seq, e->pos, planned && !masked ? e->parent : NULL, masked ? e->mask : NULL};
    double t_call = pd_now();
    if (n && forward_layers(e->fwd, &e->kv, &b, 0, e->m->c.n_layers, e->hidden)) return -1;
    for (int r = 0; r < n_rows; r++)
        memcpy(e->rows + (size_t)r * dim, e->hidden + (size_t)e->row_at[r] * dim, sizeof(float) * dim);
    memcpy(e->rows + (size_t)n_rows * dim, e->hidden + (size_t)n_std * dim, sizeof(float) * dim * planned);
    /* rows that are greedy without logprobs need only the device's argmax; the rest
       bring their logits back (the prompt's logprobs, a sampler's row) */
    int ids_only = 1, all = n_rows + planned;
    for (int r = 0; r < n_rows; r++) {
        const Job *j = e->row_job[r];
        if (e->row_pos[r] < j->n_prompt || j->lp || j->sampler.temp > 0) ids_only = 0;
    }
    for (int i = 0; i < e->n_run; i++)
        if (got[i] > 0 && (e->run[i]->lp || e->run[i]->sampler.temp > 0)) ids_only = 0;
    if (all && (ids_only ? logits_argmax(e->fwd, e->rows, all, e->row_tok)
                         : final_logits(e->fwd, e->rows, all, e->logits) ||
                               rows_argmax(e->fwd, e->logits, all, V, e->row_tok)))
        return -1;
    t_call = pd_now() - t_call;
    for (int i = 0, o = 0; i < e->n_run; o += take[i++]) {
        Job *j = e->run[i];
        for (int k = 0, p = j->n_kv; j->states && k < take[i]; k++, p++)
            if (p == j->n_states && p < j->n_prompt)
                memcpy(j->states + (size_t)j->n_states++ * dim, e->hidden + (size_t)(o + k) * dim, sizeof(float) * dim);
        j->n_kv += take[i];
        /* once: a job that comes back from its method reads its context again */
        if (j->prompt_lp && j->n_kv >= j->n_prompt) j->prompt_lp_done = 1;
        if (!j->published && j->seq >= 0 && j->n_kv >= j->n_prompt && !e->o.no_prefix_cache) {
            kv_prefix_publish(&e->kv, j->seq, j->ctx, j->n_prompt, j->states, j->n_states);
            j->published = 1;
            if (!reads_prompt(j)) free(j->states), j->states = NULL; /* kept for the cache only */
        }
    }
    for (int r = 0; r < n_rows && !ids_only; r++) {
        Job *j = e->row_job[r];
        float *x = e->logits + (size_t)r * V;
        if (e->row_pos[r] < j->n_prompt) { /* the prompt's: its logprobs alone */
            logprob_fill(&j->lp[e->row_pos[r]], x, V, j->ctx[e->row_pos[r]], j->n_top);
            e->row_pos[r] = -1;
            continue;
        }
        const float *raw = x;
        if (j->sampler.temp > 0) {                                 /* the argmax row op gave greedy rows their token */
            if (j->lp) raw = memcpy(e->raw, x, sizeof(float) * V); /* sampling changes x */
            if (rows_softmax(e->fwd, x, 1, V, j->sampler.temp, x)) return -1;
            e->row_tok[r] = sampler_draw(&j->sampler, x);
        }
        if (j->lp) logprob_fill(&j->lp[j->n_ctx], raw, V, e->row_tok[r], j->n_top);
    }
    pthread_mutex_lock(&e->mu);
    for (int r = 0; r < n_rows; r++)
        if (e->row_pos[r] >= 0) {
            Job *j = e->row_job[r];
            append(e, j, e->row_tok[r]);
            start_from(e, j, e->rows + (size_t)r * dim);
        }
    e->st.steps++;
    e->st.proposals_grouped += grouped;
    if (others > 1) e->st.rounds_shared += trees;
    kv_stats(e);
    pthread_mutex_unlock(&e->mu);
    /* the drafters' rounds: each costs, for its controller, what its nodes would in a
       call alone, and what it spent outside the call (alone: what the step took) */
    double a, bb, sec = pd_now() - t0;
    if (planned && e->n_run > 1) line_add(e, n, t_call), tab_add(e, n, t_call);
    line_get(e, &a, &bb);
    for (int i = 0; i < e->n_run; i++) {
        Job *j = e->run[i];
        if (got[i] <= 0) continue;
        int off = n_rows + at[i] - n_std; /* its rows */
        double tl = pd_now();
        int rc = drafter_land(&j->dc, j->gen.state, e->rows + (size_t)off * dim,
                              ids_only ? NULL : e->logits + (size_t)off * V, e->row_tok + off,
                              e->n_run == 1 ? sec : a + bb * got[i] + spent[i]);
        spent[i] += pd_now() - tl;
        if (got[i] > 1) j->draft_cost += (j->draft_cost > 0 ? 0.1 : 1) * (spent[i] - j->draft_cost);
        if (rc) got[i] = rc < 0 ? -1 : -2;
    }
    pthread_mutex_lock(&e->mu);
    for (int i = e->n_run - 1; i >= 0; i--)
        if (got[i] < 0) method_over(e, e->run[i], got[i] == -1 ? -1 : 1);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

/* ---- the step thread ---- */

static void *loop(void *arg) {
    Engine *e = arg;
    pthread_mutex_lock(&e->mu);
    while (!e->quit) {
        for (int i = 0; i < e->n_run; i++) /* a job that is over: its method stops first */
            if (e->run[i]->gen_on && job_over(e->run[i])) method_stop(e, e->run[i]);
        reap(e);
        admit(e);
        if (!e->n_run) {
            pthread_cond_wait(&e->work, &e->mu);
            continue;
        }
        if (!speculating(e)) stop_methods(e);
        /* methods that start now, and rounds of those that do not share the step; each
           held meanwhile: a turn may preempt another job into the queue, and a queued job
           cancelled while a turn has the lock out would otherwise be freed under us */
        Job *turn[MAX_PARALLEL];
        int n_turn = 0;
        for (int i = 0; i < e->n_run; i++)
            if (method_due(e, e->run[i]) || (e->run[i]->gen_on && !shares(e->run[i])))
                turn[n_turn++] = e->run[i], e->run[i]->refs++;
        for (int i = 0; i < n_turn; i++)
            if (turn[i]->state == JOB_RUNNING && !job_over(turn[i])) method_turn(e, turn[i]);
        for (int i = 0; i < n_turn; i++) job_unref(turn[i]);
        int any = 0;
        for (int i = 0; i < e->n_run; i++) any |= !e->run[i]->gen_on || shares(e->run[i]);
        if (!any) continue;
        pthread_mutex_unlock(&e->mu);
        int rc = step(e);
        pthread_mutex_lock(&e->mu);
        if (rc) { /* a failed step fails the batch it ran, never the server */
            fprintf(stderr, "serve: %s\n", pd_errmsg());
            for (int i = 0; i < e->n_run; i++) e->run[i]->finish = "error";
        }
    }
    stop_methods(e);
    while (e->n_run) retire(e, 0, "cancelled");
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* ---- the interface ---- */

static void free_buffers(Engine *e) {
    free(e->tok), free(e->pos), free(e->seq), free(e->parent), free(e->mask), free(e->hidden), free(e->rows),
        free(e->logits), free(e->raw);
    free(e->row_job), free(e->row_at), free(e->row_pos), free(e->row_tok);
    free(e->tab), free(e->tab_n), free(e->curve);
}

Engine *engine_new(Model *m, const EngineOptions *o) {
    if (o->parallel < 1 || o->parallel > MAX_PARALLEL)
        return pd_error("--parallel must be in [1, %d]", MAX_PARALLEL), NULL;
    Engine *e = pd_alloc(sizeof *e);
    if (!e) return NULL;
    e->m = m;
    e->o = *o;
    if (e->o.ctx < 2 || e->o.ctx > m->c.seq_len) e->o.ctx = m->c.seq_len;
    if (e->o.prefill_chunk < 1) e->o.prefill_chunk = 64;
    e->cap = o->parallel + e->o.prefill_chunk + (o->spec_max_batch ? STEP_NODES + MAX_TREE : 0);
    size_t dim = m->c.dim, vocab = m->c.vocab_size;
    if (!(e->fwd = runner_new(m))) return free(e), NULL;
    /* a sequence a request, and one more: a method's start takes one before it goes on
       from the request's own (method_turn) */
    if (kv_init_typed(&e->kv, &m->c, o->parallel + 1, o->kv_blocks * o->block_size, o->block_size, o->kv_type))
        return runner_free(e->fwd), free(e), NULL;
    /* an EAGLE head reads the prompt's states: cached prefixes keep theirs */
    if (o->opt.eagle && !o->no_prefix_cache && kv_prefix_states(&e->kv, (int)dim))
        return kv_free(&e->kv), runner_free(e->fwd), free(e), NULL;
    kv_stats(e);
    e->tok = pd_alloc(sizeof(int32_t) * e->cap), e->pos = pd_alloc(sizeof(int32_t) * e->cap);
    e->seq = pd_alloc(sizeof(int32_t) * e->cap), e->parent = pd_alloc(sizeof(int32_t) * e->cap);
    e->mask = pd_alloc(pd_mul(e->cap, e->cap));
    e->hidden = pd_alloc(pd_mul(sizeof(float) * dim, e->cap));
    e->rows = pd_alloc(pd_mul(sizeof(float) * dim, e->cap));
    e->logits = pd_alloc(pd_mul(sizeof(float) * vocab, e->cap));
    e->raw = pd_alloc(sizeof(float) * vocab);
    e->row_job = pd_alloc(sizeof(Job *) * e->cap);
    e->row_at = pd_alloc(sizeof(int32_t) * e->cap), e->row_pos = pd_alloc(sizeof(int32_t) * e->cap);
    e->row_tok = pd_alloc(sizeof(int32_t) * e->cap);
    e->tab = pd_alloc(sizeof(double) * (e->cap + 1)), e->tab_n = pd_alloc(sizeof(int) * (e->cap + 1));
    e->curve = pd_alloc(sizeof(double) * (e->cap + 1));
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->work, NULL);
    pthread_cond_init(&e->out, NULL);
    if (!e->tab || !e->tab_n || !e->curve || !e->tok || !e->pos || !e->seq || !e->parent || !e->mask || !e->hidden ||
        !e->rows || !e->logits || !e->raw || !e->row_job || !e->row_at || !e->row_pos || !e->row_tok ||
        pthread_create(&e->thread, NULL, loop, e)) {
        pd_error("serve: cannot start the engine");
        runner_free(e->fwd);
        kv_free(&e->kv);
        free_buffers(e);
        free(e);
        return NULL;
    }
    return e;
}

void engine_free(Engine *e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->quit = 1;
    pthread_cond_broadcast(&e->work);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    while (e->head) {
        Job *j = e->head;
        e->head = j->next;
        j->finish = "cancelled", j->state = JOB_DONE;
        job_unref(j);
    }
    for (int i = 0; i < e->n_pools; i++) e->pools[i].method->pool_free(e->pools[i].pool);
    kv_free(&e->kv);
    runner_free(e->fwd);
    free_buffers(e);
    free(e);
}

int engine_method_ok(const Engine *e, const char *name) {
    const DecodeMethod *dm = decode_method(name);
    if (!dm) return -1;
    const MethodShared *o = &e->o.opt;
    if ((dm->needs & NEEDS_EXIT_HEADS) && !o->heads)
        return pd_error("method '%s' needs exit heads, and the loaded model has none (serve a bundle with them)", name);
    if ((dm->needs & NEEDS_MEDUSA) && !o->medusa)
        return pd_error("method '%s' needs Medusa heads, and the loaded model has none (serve a bundle with them)",
                        name);
    if ((dm->needs & NEEDS_DRAFT) && !o->draft)
        return pd_error("method '%s' needs a draft model (serve --draft MODEL)", name);
    if ((dm->needs & NEEDS_EAGLE) && !o->eagle)
        return pd_error("method '%s' needs an EAGLE head, and the loaded model has none (serve a bundle with one)",
                        name);
    return 0;
}

Job *engine_submit(Engine *e, const int32_t *prompt, int n_prompt, const JobOptions *o, int *busy) {
    if (busy) *busy = 0;
    if (n_prompt < 1) return pd_error("the prompt is empty"), NULL;
    if (n_prompt >= e->o.ctx)
        return pd_error("the prompt is %d tokens; the context holds %d (prompt and answer together)", n_prompt,
                        e->o.ctx),
               NULL;
    if (engine_method_ok(e, o->method)) return NULL;
    if (o->logprobs > JOB_MAX_TOP)
        return pd_error("logprobs: %d alternatives asked, %d at most", o->logprobs, JOB_MAX_TOP), NULL;
    int max_new = o->max_new < 0 || o->max_new > e->o.ctx - n_prompt ? e->o.ctx - n_prompt : o->max_new;
    Job *j = pd_alloc(sizeof *j);
    if (!j) return NULL;
    j->ctx = pd_alloc(sizeof(int32_t) * (n_prompt + max_new));
    if (o->logprobs >= 0) j->lp = pd_alloc(pd_mul(sizeof(TokenLogprob), n_prompt + max_new));
    j->method = decode_method(o->method) == decode_reference() ? NULL : decode_method(o->method);
    int keeps = reads_prompt(j) || e->kv.states; /* its prompt's states (Job.states) */
    if (drafts(j)) j->start_h = pd_alloc(sizeof(float) * e->m->c.dim);
    if (keeps) j->states = pd_alloc(pd_mul(sizeof(float) * e->m->c.dim, n_prompt));
    if (!j->ctx || (o->logprobs >= 0 && !j->lp) || (drafts(j) && !j->start_h) || (keeps && !j->states) ||
        sampler_init(&j->sampler, e->m->c.vocab_size, o->temp, o->top_k, o->top_p, o->seed)) {
        sampler_free(&j->sampler);
        return free(j->ctx), free(j->lp), free(j->start_h), free(j->states), free(j), NULL;
    }
    memcpy(j->ctx, prompt, sizeof(int32_t) * n_prompt);
    j->n_prompt = j->n_ctx = n_prompt, j->max_new = max_new;
    j->n_top = o->logprobs > 0 ? o->logprobs : 0, j->prompt_lp = o->logprobs >= 0 && o->prompt_logprobs;
    j->seq = -1;
    j->engine = e;
    j->blocks = blocks_for(e, n_prompt + max_new + (j->method ? 2 * MAX_TREE : 0));
    j->refs = 2; /* the engine's and the caller's */
    if (j->blocks > e->kv.n_blocks) {
        int b = j->blocks;
        job_unref(j), job_unref(j);
        return pd_error("the request needs %d KV blocks; the pool has %d (start serve with more --kv-blocks)", b,
                        e->kv.n_blocks),
               NULL;
    }
    pthread_mutex_lock(&e->mu);
    if (e->aborting) { /* the server is stopping: the job is over before it starts */
        j->state = JOB_DONE, j->finish = "abort";
        job_unref(j);
        pthread_mutex_unlock(&e->mu);
        return j;
    }
    if (e->o.max_queue && e->n_queued >= e->o.max_queue) {
        e->st.rejected++;
        pthread_mutex_unlock(&e->mu);
        j->refs = 1, job_unref(j);
        if (busy) *busy = 1;
        return pd_error("%d requests wait already: try again later", e->o.max_queue), NULL;
    }
    if (e->tail) e->tail->next = j;
    else e->head = j;
    e->tail = j;
    e->n_queued++;
    e->st.requests++, e->st.prompt_tokens += n_prompt;
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
    return j;
}

int job_wait(Engine *e, Job *j, int have, double timeout_s, const char **finish) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    long ns = until.tv_nsec + (long)((timeout_s - (long)timeout_s) * 1e9);
    until.tv_sec += (long)timeout_s + ns / 1000000000L, until.tv_nsec = ns % 1000000000L;
    pthread_mutex_lock(&e->mu);
    while (j->state != JOB_DONE && j->n_ctx - j->n_prompt <= have)
        if (pthread_cond_timedwait(&e->out, &e->mu, &until)) break;
    int n = j->n_ctx - j->n_prompt;
    *finish = j->state == JOB_DONE ? j->finish : NULL;
    pthread_mutex_unlock(&e->mu);
    return n;
}

const int32_t *job_tokens(const Job *j) { return j->ctx; }
const TokenLogprob *job_logprobs(const Job *j) { return j->lp; }
int job_prompt_len(const Job *j) { return j->n_prompt; }

void job_cancel(Engine *e, Job *j) {
    pthread_mutex_lock(&e->mu);
    if (j->state == JOB_QUEUED) { /* never ran: out of the queue at once */
        Job **p = &e->head, *prev = NULL;
        while (*p != j) prev = *p, p = &(*p)->next;
        *p = j->next;
        if (e->tail == j) e->tail = prev;
        e->n_queued--;
        j->state = JOB_DONE, j->finish = "cancelled";
        job_unref(j);
    } else j->cancelled = 1;
    pthread_cond_signal(&e->work);
    pthread_mutex_unlock(&e->mu);
}

void engine_abort(Engine *e) {
    pthread_mutex_lock(&e->mu);
    e->aborting = 1;
    while (e->head) { /* queued: out at once, as job_cancel does */
        Job *j = e->head;
        e->head = j->next;
        j->state = JOB_DONE, j->finish = "abort";
        job_unref(j);
    }
    e->tail = NULL, e->n_queued = 0;
    for (int i = 0; i < e->n_run; i++) e->run[i]->cancelled = 1; /* reap retires them as "abort" */
    pthread_cond_signal(&e->work);
    pthread_cond_broadcast(&e->out);
    pthread_mutex_unlock(&e->mu);
}

void job_release(Engine *e, Job *j) {
    pthread_mutex_lock(&e->mu);
    job_unref(j);
    pthread_mutex_unlock(&e->mu);
}

EngineStats engine_stats(Engine *e) {
    pthread_mutex_lock(&e->mu);
    EngineStats s = e->st; /* kv_free as the step thread last left it: the pool is its own */
    s.running = e->n_run, s.queued = e->n_queued;
    s.kv_used = e->kv.n_blocks - s.kv_free;
    int64_t now = (int64_t)pd_now(), sum = 0;
    for (int b = 0; b < RATE_SECS; b++)
        if (e->rate_sec[b] > now - RATE_SECS && e->rate_sec[b] < now) sum += e->rate[b];
    s.tok_per_s = (double)sum / (RATE_SECS - 1);
    pthread_mutex_unlock(&e->mu);
    return s;
}
