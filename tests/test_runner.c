/* test_runner — a loaded Model is const and shared: two runners on one Model, each in
   its own thread with its own KV cache, give the same bits as one runner doing both
   jobs in turn (a prompt, a token tree over it, greedy steps), with the kernels on one
   thread and on two (the second caller then runs its kernels alone). The Model's bytes
   are unchanged by the forward passes. Also: logits_argmax / _topk / _softmax /
   _softmax_temp and rows_argmax / rows_softmax (the device's row ops) against
   final_logits' rows read on the host and plain loops, and sampler_truncate of the
   device's probabilities against sampler_probs of the logits; the KV
   cache's device moves (keep a path, fork) against slot-by-slot reads; a captured
   forward graph replayed with each step's batch against forward_layers. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fixture.h"
#include "model/forward.h"
#include "model/linear.h"
#include "model/sampler.h"

static Model M;

enum { PROMPT = 37, TREE = 7, STEPS = 12 };

typedef struct {
    int job;    /* which prompt */
    Runner *r;  /* NULL: make one in the thread */
    float *out; /* [(TREE + STEPS) * vocab] every logits row the job produced */
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
    for (size_t i = 0; i < (size_t)M.c.seq_len * M.c.head_dim / 2 * sizeof(float); i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* the reference: the largest, lowest index among equals; softmax in double for a
   sanity bound, k_softmax for the bits */
static int ref_argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void row_ops(void) {
    enum { N = 5, K = 4 };
    Runner *r = runner_new(&M);
    KVCache kv;
    int V = M.c.vocab_size, D = M.c.dim;
    float *h = malloc(sizeof(float) * N * D), *lg = malloc(sizeof(float) * N * V), *sm = malloc(sizeof(float) * N * V);
    if (!r || !h || !lg || !sm || kv_init(&kv, &M.c, 1, 64, 16)) {
        CHECK(0, "setup: %s", pd_errmsg());
        return;
    }
    int seq = kv_seq_new(&kv);
    int32_t tok[N] = {1, 200, 33, 401, 5}, pos[N], sq[N], ids[N], tk[N][K];
    float pk[N][K];
    for (int i = 0; i < N; i++) pos[i] = i, sq[i] = seq;
    Batch b = {N, tok, sq, pos, NULL, NULL};
    CHECK(forward_layers(r, &kv, &b, 0, M.c.n_layers, h) == 0, "%s", pd_errmsg());
    CHECK(final_logits(r, h, N, lg) == 0, "%s", pd_errmsg());
    CHECK(logits_argmax(r, h, N, ids) == 0, "%s", pd_errmsg());
    int ok = 1;
    for (int i = 0; i < N; i++) ok &= ids[i] == ref_argmax(lg + (size_t)i * V, V);
    CHECK(ok, "logits_argmax differs from the argmax of final_logits' rows");
    CHECK(logits_softmax(r, h, N, sm) == 0, "%s", pd_errmsg());
    ok = 1;
    for (int i = 0; i < N; i++) {
        float row[V];
        memcpy(row, lg + (size_t)i * V, sizeof row);
        k_softmax(row, V);
        ok &= !memcmp(row, sm + (size_t)i * V, sizeof row);
    }
    CHECK(ok, "logits_softmax is not k_softmax of final_logits' rows");
    CHECK(logits_topk(r, h, N, K, &tk[0][0], &pk[0][0]) == 0, "%s", pd_errmsg());
    ok = 1;
    for (int i = 0; i < N; i++) {
        const float *p = sm + (size_t)i * V;
        char taken[V];
        memset(taken, 0, sizeof taken);
        for (int j = 0; j < K; j++) {
            int best = -1;
            for (int v = 0; v < V; v++)
                if (!taken[v] && (best < 0 || p[v] > p[best])) best = v;
            taken[best] = 1;
            ok &= tk[i][j] == best && pk[i][j] == p[best];
        }
        ok &= tk[i][0] == ids[i];
    }
    CHECK(ok, "logits_topk differs from repeated selection over the softmax");
    CHECK(logits_topk(r, h, N, V + 1, &tk[0][0], NULL) == -1, "top-k past the vocabulary accepted");
    /* a sampler's temperature: each logit divided, then k_softmax; then its truncation */
    CHECK(logits_softmax_temp(r, h, N, 0.8f, sm) == 0, "%s", pd_errmsg());
    Sampler smp;
    CHECK(sampler_init(&smp, V, 0.8f, 20, 0.9f, 1) == 0, "%s", pd_errmsg());
    int trunc_ok = 1;
    ok = 1;
    for (int i = 0; i < N; i++) {
        float row[V], probs[V];
        memcpy(row, lg + (size_t)i * V, sizeof row);
        for (int v = 0; v < V; v++) row[v] /= 0.8f;
        k_softmax(row, V);
        ok &= !memcmp(row, sm + (size_t)i * V, sizeof row);
        memcpy(row, lg + (size_t)i * V, sizeof row);
        sampler_probs(&smp, row);
        memcpy(probs, sm + (size_t)i * V, sizeof probs);
        sampler_truncate(&smp, probs);
        trunc_ok &= !memcmp(row, probs, sizeof row);
    }
    sampler_free(&smp);
    CHECK(ok, "logits_softmax_temp is not k_softmax of final_logits' rows / temp");
    CHECK(trunc_ok, "sampler_truncate of logits_softmax_temp differs from sampler_probs of the logits");
    CHECK(logits_softmax_temp(r, h, N, 0, sm) == -1, "a temperature of 0 accepted by logits_softmax_temp");
    /* the row ops over rows the caller holds, of the vocabulary's width and of others */
    int32_t rid[N * 7];
    CHECK(rows_argmax(r, lg, N, V, rid) == 0, "%s", pd_errmsg());
    ok = 1;
    for (int i = 0; i < N; i++) ok &= rid[i] == ref_argmax(lg + (size_t)i * V, V);
    CHECK(ok, "rows_argmax differs from the argmax of the rows");
    CHECK(rows_argmax(r, lg, N * 7, 11, rid) == 0, "%s", pd_errmsg());
    ok = 1;
    for (int i = 0; i < N * 7; i++) ok &= rid[i] == ref_argmax(lg + (size_t)i * 11, 11);
    CHECK(ok, "rows_argmax over rows of 11 differs from the argmax of the rows");
    CHECK(rows_argmax(r, lg, 1, N * V, rid) == 0 && rid[0] == ref_argmax(lg, N * V),
          "rows_argmax over one row wider than the vocabulary");
    ok = 1;
    for (int pass = 0; pass < 2; pass++) {
        float temp = pass ? 1.3f : 1;
        CHECK(rows_softmax(r, lg, N, V, temp, sm) == 0, "%s", pd_errmsg());
        for (int i = 0; i < N; i++) {
            float row[V];
            memcpy(row, lg + (size_t)i * V, sizeof row);
            if (pass)
                for (int v = 0; v < V; v++) row[v] /= temp;
            k_softmax(row, V);
            ok &= !memcmp(row, sm + (size_t)i * V, sizeof row);
        }
    }
    CHECK(ok, "rows_softmax is not k_softmax of the rows / temp");
    CHECK(rows_argmax(r, lg, 0, V, rid) == -1, "rows_argmax of no rows accepted");
    kv_free(&kv);
    runner_free(r);
    free(h), free(lg), free(sm);
}

/* keep a path and fork through the device moves, against values written and read slot
   by slot */
static void kv_moves(void) {
    KVCache kv;
    if (kv_init(&kv, &M.c, 3, 3 * 64, 8)) {
        CHECK(0, "kv: %s", pd_errmsg());
        return;
    }
    int s = kv_seq_new(&kv), L = kv.n_layers, kd = kv.kv_dim, n = 30;
    float k[kd], v[kd], gk[kd], gv[kd];
    kv_reserve(&kv, s, n);
    for (int l = 0; l < L; l++) {
        for (int i = 0; i < n; i++) {
            for (int d = 0; d < kd; d++) k[d] = (float)(l * 10000 + i * 100 + d), v[d] = -k[d];
            kv_write(&kv, s, l, i, k, v);
        }
        kv_set_len(&kv, s, l, n);
    }
    int f = kv_fork(&kv, s, 21), ok = f >= 0;
    for (int l = 0; l < L && ok; l++) {
        ok &= kv_len(&kv, f, l) == 21;
        for (int i = 0; i < 21; i++) {
            kv_read(&kv, f, l, i, gk, gv);
            for (int d = 0; d < kd; d++) ok &= gk[d] == (float)(l * 10000 + i * 100 + d) && gv[d] == -gk[d];
        }
    }
    CHECK(ok, "a forked sequence does not hold the first 21 slots");
    int bad[3] = {1, 0, 4}; /* not increasing: refused before anything moves */
    CHECK(kv_keep_path(&kv, s, 10, bad, 3) == -1, "a decreasing path accepted");
    int path[4] = {1, 4, 5, 9}; /* slots 11, 14, 15, 19 move to 10..13 */
    CHECK(kv_keep_path(&kv, s, 10, path, 4) == 0, "%s", pd_errmsg());
    ok = 1;
    for (int l = 0; l < L; l++) {
        ok &= kv_len(&kv, s, l) == 14;
        for (int i = 0; i < 14; i++) {
            int from = i < 10 ? i : 10 + path[i - 10];
            kv_read(&kv, s, l, i, gk, gv);
            for (int d = 0; d < kd; d++) ok &= gk[d] == (float)(l * 10000 + from * 100 + d) && gv[d] == -gk[d];
        }
        kv_read(&kv, f, l, 12, gk, gv); /* the fork keeps its own copy */
        ok &= gk[0] == (float)(l * 10000 + 1200);
    }
    CHECK(ok, "keep_path did not move the accepted slots (or touched the fork)");
    kv_free(&kv);
}

/* a captured forward step replayed with each step's batch gives forward_layers' bits:
   one graph for the whole model and one for a layer range, over steps of different
   sizes and shapes (a prompt, single tokens, a tree), on two caches kept in step; the
   replaying runner and its cache on device kind (cuemu: the hidden states copied in and
   out around each replay, as on a GPU) */
static void graphs(const char *kind) {
    KVCache a, b;
    Runner *r = runner_new(&M);
    int ka = kv_init(&a, &M.c, 1, 256, 16);
    model_device(kind);
    Runner *q = runner_new(&M);
    int kb = kv_init(&b, &M.c, 1, 256, 16);
    model_device("cpu");
    int D = M.c.dim, V = M.c.vocab_size, L = M.c.n_layers;
    enum { MAXN = 24 };
    float *h = malloc(sizeof(float) * MAXN * D), *g = malloc(sizeof(float) * MAXN * D);
    float *la = malloc(sizeof(float) * MAXN * V), *lb = malloc(sizeof(float) * MAXN * V);
    if (!r || !q || !h || !g || !la || !lb || ka || kb) {
        CHECK(0, "setup: %s", pd_errmsg());
        return;
    }
    int sa = kv_seq_new(&a), sb = kv_seq_new(&b);
    CHECK(runner_reserve(q, MAXN, MAXN * (MAXN + 1) / 2, L) == 0, "%s", pd_errmsg());
    ForwardGraph *full = forward_capture(q, &b, 0, L), *upper = forward_capture(q, &b, 1, L);
    CHECK(full && upper, "%s", pd_errmsg());
    CHECK(forward_capture(q, &b, 0, L + 1) == NULL, "a capture past the last layer accepted");
    int at = 0, same = 1, steps = 0;
    static const int sizes[] = {MAXN, 1, 1, 3, 7, 1, 2};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes && full && upper; s++) {
        int n = sizes[s], tree = n == 7;
        int32_t tok[MAXN], pos[MAXN], par[MAXN], sq[MAXN], sq2[MAXN];
        for (int i = 0; i < n; i++) {
            tok[i] = (int32_t)((at * 17 + i * 5 + 3) % V), sq[i] = sa, sq2[i] = sb;
            par[i] = tree ? (i ? (i - 1) / 2 : -1) : -1;
            int d = 0;
            for (int x = i; tree && x > 0; x = (x - 1) / 2) d++;
            pos[i] = at + (tree ? d : i);
        }
        Batch ba = {n, tok, sq, pos, tree ? par : NULL, NULL}, bb = {n, tok, sq2, pos, tree ? par : NULL, NULL};
        int split = s == 4; /* the tree runs layer 0 directly, the rest replayed from the range graph */
        int rc = forward_layers(r, &a, &ba, 0, L, h);
        if (split) rc |= forward_layers(q, &b, &bb, 0, 1, g) || forward_replay(q, upper, &bb, g);
        else rc |= forward_replay(q, full, &bb, g);
        rc |= final_logits(r, h, n, la) || final_logits(q, g, n, lb);
        CHECK(rc == 0, "step %zu: %s", s, pd_errmsg());
        same &= !memcmp(h, g, sizeof(float) * n * D) && !memcmp(la, lb, sizeof(float) * n * V);
        for (int l = 0; l < L; l++) same &= kv_len(&a, sa, l) == kv_len(&b, sb, l);
        if (tree) { /* keep the path 0 → 2 → 6 */
            int path[3] = {0, 2, 6};
            kv_keep_path(&a, sa, at, path, 3), kv_keep_path(&b, sb, at, path, 3);
            at += 3;
        } else at += n;
        steps++;
    }
    CHECK(steps == 7 && same, "%s: a replayed forward graph differs from forward_layers (%d steps)", kind, steps);
    int32_t tok[MAXN + 1] = {0}, pos[MAXN + 1];
    for (int i = 0; i <= MAXN; i++) pos[i] = at + i;
    Batch big = {MAXN + 1, tok, NULL, pos, NULL, NULL};
    CHECK(full && forward_replay(q, full, &big, g) == -2 && strstr(pd_errmsg(), "capture again"),
          "a replay past the captured workspace accepted");
    forward_graph_free(full), forward_graph_free(upper);
    kv_free(&a), kv_free(&b);
    runner_free(r), runner_free(q);
    free(h), free(g), free(la), free(lb);
}

/* forward_submit queues a call and forward_wait brings its result: on cuemu (whose
   memory the host cannot see) the caller's buffer is untouched until the wait, another
   runner's call in between does not disturb it, and the bits are forward_layers' */
static void submit_wait(void) {
    KVCache a, b, e; /* a on the CPU; b and e on cuemu */
    int ka = kv_init(&a, &M.c, 1, 64, 16);
    model_device("cuemu");
    Runner *r = runner_new(&M), *q = runner_new(&M);
    int kb = kv_init(&b, &M.c, 1, 64, 16) || kv_init(&e, &M.c, 1, 64, 16);
    model_device("cpu");
    Runner *c = runner_new(&M);
    int D = M.c.dim, L = M.c.n_layers;
    float ref[4 * 512], h[4 * 512], o[4 * 512];
    if (!r || !q || !c || ka || kb || D > 512) {
        CHECK(0, "setup: %s", pd_errmsg());
        return;
    }
    int32_t tok[4] = {1, 403, 9, 77}, pos[4] = {0, 1, 2, 3};
    Batch ba = {4, tok, NULL, pos, NULL, NULL};
    int rc = kv_seq_new(&a) || kv_seq_new(&b) || kv_seq_new(&e);
    rc |= forward_layers(c, &a, &ba, 0, L, ref); /* the CPU's, on a's cache */
    for (int i = 0; i < 4 * D; i++) h[i] = -1.5f;
    rc |= forward_submit(r, &b, &ba, 0, L, h);
    int untouched = 1;
    for (int i = 0; i < 4 * D; i++) untouched &= h[i] == -1.5f;
    rc |= forward_layers(q, &e, &ba, 0, 2, o); /* another stream's call in between */
    rc |= forward_wait(r, h, 4);
    CHECK(rc == 0, "%s", pd_errmsg());
    CHECK(untouched, "forward_submit on cuemu wrote the caller's hidden states before forward_wait");
    CHECK(!memcmp(h, ref, sizeof(float) * 4 * D), "forward_submit + forward_wait differ from forward_layers");
    for (int l = 0; l < L; l++)
        CHECK(kv_len(&b, 0, l) == 4, "layer %d holds %d slots after the call", l, kv_len(&b, 0, l));
    kv_free(&a), kv_free(&b), kv_free(&e);
    runner_free(r), runner_free(q), runner_free(c);
}

int main(void) {
    if (test_model_load(&M)) return check_done("runner");
    uint64_t before = model_sum();
    two_threads(1);
    two_threads(2);
    k_init(1);
    row_ops();
    kv_moves();
    graphs("cpu");
    graphs("cuemu");
    submit_wait();
    CHECK(model_sum() == before, "a forward pass wrote into the shared Model");
    Runner *r = runner_new(&M);
    CHECK(r && r->m == &M && dev_host(r->dev, r->w.packed) == (void *)M.packed.base &&
              r->w.layers[0].qkv == M.layers[0].qkv.p && r->w.embed == M.embed.w,
          "the runner's weights are not the model's packed bytes, wrapped without a copy");
    runner_free(r);
    /* on a copying device, one copy for all of a model's runners, alive while any is */
    model_device("cuemu");
    Runner *a = runner_new(&M), *b = runner_new(&M);
    CHECK(a && b && a->w.lm_head == b->w.lm_head && a->w.lm_head != M.lm_head.p,
          "two cuemu runners do not share one copy of the weights");
    runner_free(a);
    Runner *c = runner_new(&M);
    CHECK(b && c && c->w.lm_head == b->w.lm_head, "the copy went with its first runner");
    runner_free(b), runner_free(c);
    model_device("cpu");
    model_free(&M);
    return check_done("runner");
}
