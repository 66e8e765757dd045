/* engine.h — continuous batching: many requests share one model, one paged KV cache
   and one forward call per step. Requests join and leave the running batch between
   steps; KV blocks are taken as positions fill and returned when a request ends or is
   cancelled. A request is admitted when the pool has room for its context now (and the
   running requests' next steps); the others wait in a queue, in order, of at most
   max_queue requests. When a running request can no longer grow, the one admitted last
   is preempted: its blocks go back and it waits at the queue's head with everything it
   generated, to be resumed by computing its context again, so nothing is lost and its
   tokens are the same. A request that could not fit the pool even alone is refused.
   Prefix cache: the full KV blocks of a request's context are published (kvcache.h)
   once its prompt is in and when it ends or is preempted, and a new request attaches
   the blocks its prompt starts with instead of computing them.
   A request may name a decoding method. Its prompt comes in by standard steps, then
   its method runs on the same sequence: a drafter's planned tree goes into the step's
   one forward call beside every other request's work, the trees budgeted by what the
   step costs (engine.c, budget()), so speculation shrinks towards plain rounds as the
   batch grows; any other method runs a round a step on its own. Past spec_max_batch
   running requests the methods stop and standard steps go on from the same sequences.
   Every method is lossless and the forward pass batch-invariant, so a greedy request
   says the same whatever runs beside it. One thread runs the steps; the calls below
   are safe from any thread. */
#ifndef PD_ENGINE_H
#define PD_ENGINE_H
#include "decode/method.h"

typedef struct {
    int parallel;  /* requests in the running batch at most */
    int ctx;       /* positions per request (prompt + answer) at most */
    int kv_blocks; /* KV pool, in blocks of block_size positions */
    int block_size;
    KVType kv_type;     /* the KV cache's elements (0: f32) */
    int prefill_chunk;  /* prompt tokens a step takes at most, all requests together */
    int continuous;     /* 0: a batch is formed when none runs and runs to its end
                            (static batching, the load benchmark's baseline) */
    int spec_max_batch; /* methods run while the batch holds at most this many requests
                            (0: never) */
    int max_queue;      /* requests waiting at most (0: no bound); past it engine_submit says busy */
    int no_prefix_cache;
    MethodShared opt; /* what the methods take (heads, a draft model); each runs with its defaults */
} EngineOptions;

typedef struct Engine Engine;
typedef struct Job Job;

typedef struct {
    int running, queued;
    int kv_used, kv_free; /* blocks */
    int64_t requests, prompt_tokens, gen_tokens, method_tokens, steps;
    int64_t waited;                      /* requests that found no room and waited in the queue */
    int64_t preempted;                   /* times a running request gave its blocks back to wait again */
    int64_t rejected;                    /* requests refused busy: the queue was full */
    int64_t drafted, drafts_kept;        /* tokens methods drafted (AdaDecode: exited early), and kept, counted
                                            as each method stops */
    int64_t proposals_grouped;           /* drafters' proposals made together with others' (EAGLE's head
                                            calls shared) */
    int64_t rounds_shared;               /* drafted trees (2 nodes or more) that shared a forward call with
                              another request's work */
    int64_t method_prefilled;            /* context tokens methods' starts ran again (none for a drafter
                                            started from its standard step, EAGLE included) */
    int kv_cached;                       /* of kv_free: blocks that hold a published prefix, idle */
    int64_t prefix_queried, prefix_hits; /* full prompt blocks looked up, and found */
    double tok_per_s;                    /* generated tokens a second over the last ten seconds */
} EngineStats;

Engine *engine_new(Model *m, const EngineOptions *o); /* NULL + message */
void engine_free(Engine *e);                          /* cancels what still runs */
/* can this engine run the method? (its heads or draft model are loaded); -1 + message */
int engine_method_ok(const Engine *e, const char *method);
#define JOB_MAX_TOP 20 /* alternatives a token's logprobs name at most (OpenAI's chat limit) */

/* a token's log-probability under the target model: the log-softmax of its logits where
   the token was chosen, as the model gave them (temperature 1, before top-k or top-p),
   and the most likely tokens there, best first (ties: the lower id) */
typedef struct {
    float logprob;
    int32_t top[JOB_MAX_TOP];
    float top_logprob[JOB_MAX_TOP];
} TokenLogprob;

typedef struct {
    int max_new;       /* tokens generated at most (clamped to the context; < 0: to its end) */
    float temp, top_p; /* temp 0 = greedy */
    int top_k;
    uint64_t seed;
    const char *method;
    int logprobs;        /* -1: none; else each token's TokenLogprob with this many alternatives */
    int prompt_logprobs; /* the prompt's tokens' too, from the second on (echo) */
} JobOptions;

/* queues a request: the prompt's tokens, generated as o says. NULL + message when the
   prompt does not fit the context or can never fit the pool, or when max_queue
   requests wait already (then *busy = 1, when busy is given: try again later) */
Job *engine_submit(Engine *e, const int32_t *prompt, int n_prompt, const JobOptions *o, int *busy);
/* waits until the job has more than `have` generated tokens or has ended, or the
   timeout passes; returns how many it has. *finish: NULL while it runs, then "stop"
   (an end token), "length" (max_new or the context), "error", or "abort" (engine_abort) */
int job_wait(Engine *e, Job *j, int have, double timeout_s, const char **finish);
const int32_t *job_tokens(const Job *j); /* [n_prompt + generated]: stable once reported */
/* [n_prompt + generated] by position, NULL when not asked: a generated token's is stable
   once the token is reported, the prompt's once the first token or the end is. Every
   method gives the numbers standard decoding gives (the same logits, bit for bit) */
const TokenLogprob *job_logprobs(const Job *j);
int job_prompt_len(const Job *j);
void job_cancel(Engine *e, Job *j);  /* the client is gone: stop, free its blocks */
void job_release(Engine *e, Job *j); /* the caller is done with j (after the end or a cancel) */
/* the server is stopping: every job, queued, running or submitted later, ends with
   finish "abort" (what it generated so far stays readable) */
void engine_abort(Engine *e);
EngineStats engine_stats(Engine *e);

#endif
