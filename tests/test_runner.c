/* test_runner — a loaded Model is const and shared: two runners on one Model, each in
   its own thread with its own KV cache, give the same bits as one runner doing both
   jobs in turn (a prompt, a token tree over it, greedy steps), with the kernels on one
   thread and on two (the second caller then runs its kernels alone). The Model's bytes
   are unchanged by the forward passes. Also the logits rows through the device ops
   (argmax, top-k, softmax over rows) against final_logits read on the host. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fixture.h"
#include "model/forward.h"

static Model M;

enum { PROMPT = 37, TREE = 7, STEPS = 12 };

typedef struct {
    int job;         /* which prompt */
    Runner *r;       /* NULL: make one in the thread */
    float *out;      /* [(TREE + STEPS) * vocab] every logits row the job produced */
    int32_t toks[STEPS];
    int rc;
} Job;

static size_t job_floats(void) { return (size_t)(TREE + STEPS) * M.c.vocab_size; }

static void *run_job(void *arg) {
    Job *j = arg;
    const Model *m = &M;
    Runner *r = j->r ? j->r : runner_new(m);
    KVCache kv;
    int V = m->c.vocab_size, n = PROMPT + TREE;
    float *h = malloc(sizeof(float) * n * m->c.dim);
    j->rc = -1;
    if (!r || !h || kv_init(&kv, &m->c, 1, m->c.seq_len, 16)) goto out;
    int seq = kv_seq_new(&kv);
    int32_t tok[PROMPT + TREE], pos[PROMPT + TREE], par[PROMPT + TREE], sq[PROMPT + TREE];
    for (int i = 0; i < PROMPT; i++) tok[i] = (int32_t)((i * 31 + 7 * j->job + 1) % V), pos[i] = i, sq[i] = seq;
    Batch b = {PROMPT, tok, sq, pos, NULL, NULL};
    if (forward_layers(r, &kv, &b, 0, m->c.n_layers, h)) goto free_kv;
    /* a tree of TREE nodes below the prompt: node i's parent is (i-1)/2 */
    for (int i = 0; i < TREE; i++) {
        tok[i] = (int32_t)((i * 13 + j->job) % V), sq[i] = seq, par[i] = i ? (i - 1) / 2 : -1;
        int d = 0;
        for (int a = i; a > 0; a = (a - 1) / 2) d++;
        pos[i] = PROMPT + d;
    }
    Batch t = {TREE, tok, sq, pos, par, NULL};
    if (forward_layers(r, &kv, &t, 0, m->c.n_layers, h) || final_logits(r, h, TREE, j->out)) goto free_kv;
    if (kv_truncate(&kv, seq, PROMPT)) goto free_kv;
    int32_t next = tok[0];
    for (int s = 0; s < STEPS; s++) {
        int32_t p = PROMPT + s;
        Batch one = {1, &next, &seq, &p, NULL, NULL};
        float *lg = j->out + (size_t)(TREE + s) * V;
        if (forward_layers(r, &kv, &one, 0, m->c.n_layers, h) || final_logits(r, h, 1, lg)) goto free_kv;
        next = j->toks[s] = (int32_t)k_argmax(lg, V);
    }
    j->rc = 0;
free_kv:
    kv_free(&kv);
out:
    if (!j->r) runner_free(r);
    free(h);
    return NULL;
}

static void two_threads(int threads) {
    k_init(threads);
    Job one[2], two[2];
    Runner *r = runner_new(&M);
    for (int i = 0; i < 2; i++) {
        one[i] = (Job){i, r, malloc(sizeof(float) * job_floats()), {0}, -1};
        two[i] = (Job){i, NULL, malloc(sizeof(float) * job_floats()), {0}, -1};
        run_job(&one[i]); /* one runner, both jobs in turn */
    }
    pthread_t tid[2];
    for (int i = 0; i < 2; i++) pthread_create(&tid[i], NULL, run_job, &two[i]);
    for (int i = 0; i < 2; i++) pthread_join(tid[i], NULL);
    for (int i = 0; i < 2; i++) {
        CHECK(one[i].rc == 0 && two[i].rc == 0, "job %d failed: %s", i, pd_errmsg());
        CHECK(!memcmp(one[i].out, two[i].out, sizeof(float) * job_floats()),
              "job %d (%d kernel threads): two runners in two threads differ from one runner", i, threads);
        CHECK(!memcmp(one[i].toks, two[i].toks, sizeof one[i].toks), "job %d: greedy tokens differ", i);
    }
    CHECK(memcmp(one[0].out, one[1].out, sizeof(float) * job_floats()) != 0, "the two jobs are not different work");
    for (int i = 0; i < 2; i++) free(one[i].out), free(two[i].out);
    runner_free(r);
}

/* the model's weights and tables are not written by forward passes */
static uint64_t model_sum(void) {
    uint64_t h = 1469598103934665603ull;
    const unsigned char *p = (const unsigned char *)M.packed.base;
    for (size_t i = 0; i < M.packed.used; i++) h = (h ^ p[i]) * 1099511628211ull;
    p = (const unsigned char *)M.rope_cos;
    for (size_t i = 0; i < (size_t)M.c.seq_len * M.c.head_dim / 2 * sizeof(float); i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

int main(void) {
    if (test_model_load(&M)) return check_done("runner");
    uint64_t before = model_sum();
    two_threads(1);
    two_threads(2);
    CHECK(model_sum() == before, "a forward pass wrote into the shared Model");
    Runner *r = runner_new(&M);
    CHECK(r && r->m == &M && dev_host(r->dev, r->packed) == (void *)M.packed.base,
          "the runner's weights are not the model's packed bytes, wrapped without a copy");
    runner_free(r);
    model_free(&M);
    return check_done("runner");
}
