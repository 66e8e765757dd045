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
    int blocks;                 /* pool blocks held back for it from admission to its end */
    int state, cancelled, refs, waited;
    Engine *engine;
    DecodeCtx dc; /* method mode: its method's generation, stepped by the scheduler */
    DecodeRun gen;
    int gen_on;
    TokenLogprob *lp;                     /* [n_prompt + max_new] by position, or NULL */
    int n_top, prompt_lp, prompt_lp_done; /* logprobs: alternatives; the prompt's asked, computed */
    int lp_lost;                          /* a method could not keep a token's logits */
    const char *finish;
    Job *next; /* the queue's order */
};

#define MAX_PARALLEL 256
#define RATE_SECS 10

struct Engine {
    Model *m;
    Runner *fwd; /* the step thread's forward workspace */
    KVCache kv;
    EngineOptions o;
    pthread_mutex_t mu;
    pthread_cond_t work, out; /* the step thread waits on work, readers on out */
    pthread_t thread;
    int quit;
    int aborting;           /* engine_abort: every job ends, new ones end at once */
    Job *head, *tail;       /* the queue */
    Job *run[MAX_PARALLEL]; /* the running batch */
    int n_run, committed;   /* blocks held back for the running jobs */
    EngineStats st;
    int64_t rate[RATE_SECS], rate_sec[RATE_SECS]; /* generated tokens per second, a ring */
    /* step buffers: up to parallel + prefill_chunk tokens */
    int cap;
    int32_t *tok, *pos, *seq;  /* [cap] */
    float *hidden;             /* [cap][dim] */
    float *rows, *logits;      /* [cap][dim], [cap][vocab] */
    float *raw;                /* [vocab] a row's logits before sampling changes them */
    Job **row_job;             /* [cap] the job whose token at row_pos a row's logits give: */
    int32_t *row_at, *row_pos; /* its next (sampled), or a prompt token's (logprobs); the */
    int32_t *row_tok;          /* batch row they come from, the token sampled */
};

/* ---- bookkeeping (under the lock) ---- */

static int blocks_for(const Engine *e, const Job *j) {
    int slots = j->n_prompt + j->max_new;
    if (j->method) slots += 2 * MAX_TREE; /* a drafter's tree and side nodes sit past the context */
    int b = (slots + e->o.block_size - 1) / e->o.block_size;
    return b < e->kv.max_blocks ? b : e->kv.max_blocks;
}

/* the queue's first request has a place and the blocks it may need */
static int head_fits(const Engine *e) {
    const Job *j = e->head;
    return j && e->n_run < e->o.parallel && e->committed + j->blocks <= e->kv.n_blocks;
}

/* static batching opens the batch only when it is empty, and then fills it at once */
static int can_admit(const Engine *e) { return head_fits(e) && (e->o.continuous || e->n_run == 0); }

static void admit(Engine *e) {
    int open = e->o.continuous || e->n_run == 0;
    while (open && head_fits(e)) {
        Job *j = e->head;
        e->head = j->next;
        if (!e->head) e->tail = NULL;
        j->state = JOB_RUNNING;
        e->committed += j->blocks;
        e->run[e->n_run++] = j;
    }
    if (e->head && !e->head->waited) e->head->waited = 1, e->st.waited++; /* it did not fit */
}

static void job_unref(Job *j) {
    if (--j->refs) return;
    sampler_free(&j->sampler);
    free(j->ctx);
    free(j->lp);
    free(j);
}

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

/* ends a job: its blocks go back; readers are told */
static void retire(Engine *e, int i, const char *finish) {
    Job *j = e->run[i];
    if (j->seq >= 0) kv_seq_free(&e->kv, j->seq);
    j->seq = -1;
    e->committed -= j->blocks;
    j->finish = j->finish ? j->finish : finish;
    j->state = JOB_DONE;
    e->run[i] = e->run[--e->n_run];
    e->st.kv_free = e->kv.n_free;
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

/* ---- a step of standard decoding for the whole batch ---- */

static void add_row(Engine *e, int *n_rows, Job *j, int at, int pos) {
    e->row_job[*n_rows] = j, e->row_at[*n_rows] = at, e->row_pos[(*n_rows)++] = pos;
}

/* which tokens each running job feeds this step: its unprocessed context, the prompt
   in chunks from a shared budget; returns the batch size */
static int gather(Engine *e, int *take, int *n_rows) {
    int n = 0, budget = e->o.prefill_chunk;
    *n_rows = 0;
    for (int i = 0; i < e->n_run; i++) {
        Job *j = e->run[i];
        int left = j->n_ctx - j->n_kv;
        take[i] = left <= 1 ? left : left < budget ? left : budget;
        if (left > 1) budget -= take[i];
        for (int k = 0; k < take[i]; k++, n++) {
            int p = j->n_kv + k;
            e->tok[n] = j->ctx[p], e->pos[n] = p, e->seq[n] = j->seq;
            if (prompt_lp_due(j) && p + 1 < j->n_prompt)
                add_row(e, n_rows, j, n, p + 1); /* a prompt token's logprobs */
        }
        /* its next token is due, and allowed: its last row's logits */
        if (take[i] && j->n_kv + take[i] == j->n_ctx && j->n_ctx - j->n_prompt < j->max_new)
            add_row(e, n_rows, j, n - 1, j->n_ctx);
    }
    return n;
}

static int step(Engine *e) {
    int take[MAX_PARALLEL], n_rows, dim = e->m->c.dim;
    for (int i = 0; i < e->n_run; i++)
        if (e->run[i]->seq < 0 && (e->run[i]->seq = kv_seq_new(&e->kv)) < 0)
            return pd_error("serve: no free KV sequence");
    int n = gather(e, take, &n_rows);
    Batch b = {n, e->tok, e->seq, e->pos, NULL, NULL};
    if (n && forward_layers(e->fwd, &e->kv, &b, 0, e->m->c.n_layers, e->hidden)) return -1;
    for (int r = 0; r < n_rows; r++)
        memcpy(e->rows + (size_t)r * dim, e->hidden + (size_t)e->row_at[r] * dim, sizeof(float) * dim);
    /* rows that are greedy without logprobs need only the device's argmax; the rest
       bring their logits back (the prompt's logprobs, a sampler's row) */
    int ids_only = 1, V = e->m->c.vocab_size;
    for (int r = 0; r < n_rows; r++) {
        const Job *j = e->row_job[r];
        if (e->row_pos[r] < j->n_prompt || j->lp || j->sampler.temp > 0) ids_only = 0;
    }
    if (n_rows && (ids_only ? logits_argmax(e->fwd, e->rows, n_rows, e->row_tok)
                            : final_logits(e->fwd, e->rows, n_rows, e->logits) ||
                                  rows_argmax(e->fwd, e->logits, n_rows, V, e->row_tok)))
        return -1;
    for (int i = 0; i < e->n_run; i++) {
        Job *j = e->run[i];
        j->n_kv += take[i];
        /* once: a job that comes back from its method reads its context again */
        if (j->prompt_lp && j->n_kv >= j->n_prompt) j->prompt_lp_done = 1;
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
        if (e->row_pos[r] >= 0) append(e, e->row_job[r], e->row_tok[r]);
    e->st.steps++;
    e->st.kv_free = e->kv.n_free;
    pthread_mutex_unlock(&e->mu);
    return 0;
}

/* ---- methods, while the batch is small ----
   A job in method mode has its method's generation (DecodeRun): the scheduler thread
   takes the method jobs in turn, one step (a round) each, without the lock, as it runs
   standard steps for the whole batch otherwise. A later step can put several jobs'
   trees into one forward call; today each step is one job's. */

static int method_batch(const Engine *e) {
    if (!e->o.spec_max_batch || e->n_run > e->o.spec_max_batch || can_admit(e)) return 0;
    for (int i = 0; i < e->n_run; i++) /* a standard request, or a prompt's logprobs: everyone takes standard steps */
        if (!e->run[i]->method || prompt_lp_due(e->run[i])) return 0;
    return 1;
}

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
    e->st.kv_free = e->kv.n_free;
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

/* ends j's method (its generation and sequence go); the job goes on from its context
   with standard steps, or ends. Called under the lock. */
static void method_stop(Engine *e, Job *j) {
    (void)e;
    if (!j->gen_on) return;
    decode_run_finish(&j->gen);
    decode_free(&j->dc);
    j->gen_on = 0;
    j->seq = -1, j->n_kv = 0; /* standard steps prefill its context again */
}

/* one step of j's method, starting it first (the method builds its own sequence from
   the context); called under the lock, which it leaves while the model runs */
static void method_turn(Engine *e, Job *j) {
    int rc, started = j->gen_on;
    if (!started) {
        if (j->seq >= 0) kv_seq_free(&e->kv, j->seq);
        j->seq = -1, j->n_kv = 0;
        if (decode_init(&j->dc, e->m, &e->kv, &j->sampler, j->max_new - (j->n_ctx - j->n_prompt))) {
            fprintf(stderr, "serve: %s\n", pd_errmsg());
            j->finish = "error";
            return;
        }
        j->dc.opt = e->o.opt;
        j->dc.emit = method_emit;
        j->dc.emit_ctx = j;
        if (j->lp) j->dc.emit_logits = method_logits;
        j->gen_on = 1;
    }
    pthread_mutex_unlock(&e->mu);
    rc = started ? decode_run_step(&j->gen) : decode_run_begin(&j->gen, j->method, &j->dc, j->ctx, j->n_ctx);
    pthread_mutex_lock(&e->mu);
    if (rc == 0) return; /* begun, or a round done: its next step comes in a later turn */
    if (rc < 0) fprintf(stderr, "serve: %s\n", pd_errmsg()), j->finish = "error";
    /* a method that stopped by itself met an end token (which it does not emit), its
       budget (reap sees it) or the model's context */
    else if (!j->cancelled && !j->finish && j->n_ctx - j->n_prompt < j->max_new)
        j->finish = j->n_ctx >= e->m->c.seq_len ? "length" : "stop";
    method_stop(e, j);
}

static void stop_methods(Engine *e) {
    for (int i = 0; i < e->n_run; i++) method_stop(e, e->run[i]);
}

/* ---- the step thread ---- */

static void *loop(void *arg) {
    Engine *e = arg;
    int turn = 0;
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
        if (method_batch(e)) { /* a round of one method, in turn */
            method_turn(e, e->run[turn++ % e->n_run]);
            continue;
        }
        stop_methods(e);
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
    free(e->tok), free(e->pos), free(e->seq), free(e->hidden), free(e->rows), free(e->logits), free(e->raw);
    free(e->row_job), free(e->row_at), free(e->row_pos), free(e->row_tok);
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
    e->cap = o->parallel + e->o.prefill_chunk;
    size_t dim = m->c.dim, vocab = m->c.vocab_size;
    if (!(e->fwd = runner_new(m))) return free(e), NULL;
    if (kv_init_typed(&e->kv, &m->c, o->parallel, o->kv_blocks * o->block_size, o->block_size, o->kv_type))
        return runner_free(e->fwd), free(e), NULL;
    e->st.kv_free = e->kv.n_free;
    e->tok = pd_alloc(sizeof(int32_t) * e->cap), e->pos = pd_alloc(sizeof(int32_t) * e->cap);
    e->seq = pd_alloc(sizeof(int32_t) * e->cap);
    e->hidden = pd_alloc(pd_mul(sizeof(float) * dim, e->cap));
    e->rows = pd_alloc(pd_mul(sizeof(float) * dim, e->cap));
    e->logits = pd_alloc(pd_mul(sizeof(float) * vocab, e->cap));
    e->raw = pd_alloc(sizeof(float) * vocab);
    e->row_job = pd_alloc(sizeof(Job *) * e->cap);
    e->row_at = pd_alloc(sizeof(int32_t) * e->cap), e->row_pos = pd_alloc(sizeof(int32_t) * e->cap);
    e->row_tok = pd_alloc(sizeof(int32_t) * e->cap);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->work, NULL);
    pthread_cond_init(&e->out, NULL);
    if (!e->tok || !e->pos || !e->seq || !e->hidden || !e->rows || !e->logits || !e->raw || !e->row_job || !e->row_at ||
        !e->row_pos || !e->row_tok || pthread_create(&e->thread, NULL, loop, e)) {
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

Job *engine_submit(Engine *e, const int32_t *prompt, int n_prompt, const JobOptions *o) {
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
    if (!j->ctx || (o->logprobs >= 0 && !j->lp) ||
        sampler_init(&j->sampler, e->m->c.vocab_size, o->temp, o->top_k, o->top_p, o->seed)) {
        sampler_free(&j->sampler);
        return free(j->ctx), free(j->lp), free(j), NULL;
    }
    memcpy(j->ctx, prompt, sizeof(int32_t) * n_prompt);
    j->n_prompt = j->n_ctx = n_prompt, j->max_new = max_new;
    j->n_top = o->logprobs > 0 ? o->logprobs : 0, j->prompt_lp = o->logprobs >= 0 && o->prompt_logprobs;
    j->method = decode_method(o->method) == decode_reference() ? NULL : decode_method(o->method);
    j->seq = -1;
    j->engine = e;
    j->blocks = blocks_for(e, j);
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
    if (e->tail) e->tail->next = j;
    else e->head = j;
    e->tail = j;
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
    e->tail = NULL;
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
    s.running = e->n_run;
    for (const Job *j = e->head; j; j = j->next) s.queued++;
    s.kv_used = e->kv.n_blocks - s.kv_free;
    int64_t now = (int64_t)pd_now(), sum = 0;
    for (int b = 0; b < RATE_SECS; b++)
        if (e->rate_sec[b] > now - RATE_SECS && e->rate_sec[b] < now) sum += e->rate[b];
    s.tok_per_s = (double)sum / (RATE_SECS - 1);
    pthread_mutex_unlock(&e->mu);
    return s;
}
