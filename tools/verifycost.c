/* verifycost — what one verification of an n-node token tree costs relative to one
   standard decoding step, on this machine and model (a benchmark, never a test).
   bin/verifycost -m MODEL [--sizes 1,4,8,16,32,64] [--ctx P] [--reps R] [-t THREADS] [--kv-type T]
   After a prompt of P tokens, each size is timed R times (the least of 3 runs in a
   row each time), the sizes in turn within a rep and a one-token step last: the
   tree's nodes through every layer and the final logits (what drafter_generate's
   verify does), then the cache is cut back. The tree is binary (node i's parent is
   (i-1)/2), so attention sees the depths a real tree has. stdout: one JSON object a
   size: n, median seconds, ratio to n = 1. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>

#include "model/forward.h"
#include "tool.h"

#define MAX_N 256
#define RUNS 3 /* in a row, per size and rep: the least counts */
#define USAGE "-m MODEL [--sizes 1,4,8,...] [--ctx P] [--reps R] [-t THREADS] [--kv-type T]"
#define MEMORY                                                                                                         \
    "memory: about " MEMORY_MODEL "\n        + " MEMORY_KV(                                                            \
        "1") "\n"                                                                                                      \
             "        + the largest size's activations and logits (n × (vocab + a few × dim) × 4 bytes).\n"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* seconds of one verification of an n-node tree after ctx positions */
static double time_tree(Runner *r, KVCache *kv, int n, int ctx, float *hid, float *lg) {
    const Model *m = r->m;
    int32_t tok[MAX_N], pos[MAX_N], seq[MAX_N] = {0}, parent[MAX_N];
    for (int i = 0; i < n; i++) {
        tok[i] = (int32_t)((7 * i + 3) % m->c.vocab_size);
        parent[i] = i ? (i - 1) / 2 : -1;
        int depth = 0;
        for (int j = i; j > 0; j = (j - 1) / 2) depth++;
        pos[i] = ctx + depth;
    }
    Batch b = {n, tok, seq, pos, parent, NULL};
    double t0 = pd_now();
    if (forward_layers(r, kv, &b, 0, m->c.n_layers, hid) || final_logits(r, hid, n, lg)) die_lib();
    double t = pd_now() - t0;
    if (kv_truncate(kv, 0, ctx)) die_lib();
    return t;
}

static double median(double *t, int n) {
    qsort(t, n, sizeof *t, cmp_double);
    return t[n / 2];
}

int main(int argc, char **argv) {
    tool_name = "verifycost";
    const char *model = NULL, *sizes = "1,2,4,8,16,32,64", *kv_type = NULL;
    int ctx = 64, reps = 20, threads = 1;
    const char *device = NULL;
    Flag fl[] = {
        {"-m, --model", "FILE", "required", "the model", F_STR(&model)},
        MODEL_FLAGS{"--sizes", "1,4,8,...", "1,2,4,8,16,32,64", "tree sizes to time (nodes, 1..256)", F_STR(&sizes)},
        {"--ctx", "P", "64", "positions in the KV cache before the tree", F_INT(&ctx, 1, 1 << 20)},
        {"--reps", "R", "20", "repetitions (the median counts)", F_INT(&reps, 1, 100000)},
        {"-t, --threads", "N", "1", "threads", F_INT(&threads, 1, 64)},
        DEVICE_FLAG(&device),
        KV_TYPE_FLAG(&kv_type),
    };
    flags_parse(fl, N_FLAGS(fl), argc, argv, NULL, 0, USAGE, MEMORY);
    if (!model) usage("-m MODEL");
    KVType kvt = kv_type_arg(kv_type);
    int n[64], k = 0;
    for (const char *s = sizes; *s && k < 64;) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > MAX_N || (*end && *end != ','))
            die("--sizes: '%s' is not a list of 1..%d", sizes, MAX_N);
        n[k++] = (int)v;
        s = *end ? end + 1 : end;
    }
    Model m;
    KVCache kv;
    tool_model_load(&m, model);
    if (model_threads(threads)) die_lib();
    device_arg(device);
    int most = 0;
    for (int i = 0; i < k; i++) most = n[i] > most ? n[i] : most;
    if (ctx + most > m.c.seq_len)
        die("--ctx %d and a %d-node tree do not fit the context of %d", ctx, most, m.c.seq_len);
    if (kv_init_typed(&kv, &m.c, 1, m.c.seq_len, 16, kvt) || kv_seq_new(&kv) != 0) die_lib();
    float *hid = malloc(sizeof(float) * (size_t)(ctx > most ? ctx : most) * m.c.dim);
    float *lg = malloc(sizeof(float) * (size_t)most * m.c.vocab_size);
    int32_t *prompt = malloc(sizeof(int32_t) * ctx), *pos = malloc(sizeof(int32_t) * ctx);
    if (!hid || !lg || !prompt || !pos) die("out of memory");
    for (int i = 0; i < ctx; i++) prompt[i] = (int32_t)((13 * i + 1) % m.c.vocab_size), pos[i] = i;
    Batch b = {ctx, prompt, NULL, pos, NULL, NULL};
    Runner *run = runner_new(&m);
    if (!run || forward_layers(run, &kv, &b, 0, m.c.n_layers, hid)) die_lib();
    for (int r = 0; r < 3; r++) time_tree(run, &kv, most, ctx, hid, lg); /* warm the caches and the workspace */
    /* the sizes in turn within each rep, so that the machine's drift falls on them
       alike, from the last listed to the first and the one-token step at the end (the
       smallest trees just before it, not the biggest); each the least of RUNS in a
       row, as decoding runs its steps one after another (the first, after another
       size, runs colder). A listed size of 1 is that step itself */
    double *t = malloc(sizeof(double) * (size_t)(k + 1) * reps);
    if (!t) die("out of memory");
    for (int r = 0; r < reps; r++)
        for (int i = k; i >= 0; i--) {
            if (i && n[i - 1] == 1) continue; /* the base itself */
            double least = INFINITY;
            for (int j = 0; j < RUNS; j++) {
                double tj = time_tree(run, &kv, i ? n[i - 1] : 1, ctx, hid, lg);
                least = tj < least ? tj : least;
            }
            t[(size_t)i * reps + r] = least;
        }
    double base = median(t, reps);
    for (int i = 0; i < k; i++) {
        double ti = n[i] == 1 ? base : median(t + (size_t)(i + 1) * reps, reps);
        printf("{\"n\":%d,\"seconds\":%.9f,\"ratio\":%.4f}\n", n[i], ti, ti / base);
    }
    free(t);
    free(hid), free(lg), free(prompt), free(pos);
    runner_free(run);
    kv_free(&kv);
    model_free(&m);
    return 0;
}
