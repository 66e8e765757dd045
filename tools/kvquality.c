/* kvquality — what a bf16 or q8_0 KV cache changes in the model's next-token
   distributions, against the f32 cache, on text (a measurement; tests/test_kv_type.sh checks only
   that f32 against itself is exact).
   bin/kvquality -m MODEL --data FILE [--fields A,B] --kv-type q8_0 [--positions N] [--seq-len L] [-t T]
   The text is packed into sequences of at most L tokens as the head trainers pack it
   (train/dataset.h); each sequence runs through the model once per cache (all its
   tokens in one call: a token's logits are those decoding would give it) and every
   position's distributions are compared in double: top-1 agreement, KL(p_f32 ‖ p_type),
   and each cache's perplexity of the next token. Stops after N positions. stdout: one
   line. */
#include <math.h>
#include <stdlib.h>

#include "model/forward.h"
#include "tool.h"
#include "train/dataset.h"

#define USAGE "-m MODEL --data FILE [--fields A,B] --kv-type TYPE [--positions N] [--seq-len L] [-t THREADS]"
#define MEMORY                                                                                                         \
    "memory: about " MEMORY_MODEL                                                                                      \
    "\n        + two KV caches of L positions + 2 × L × vocab × 4 bytes of logits + the "                           \
    "text.\n"

/* log-softmax of a row in double */
static void log_softmax(double *y, const float *x, int n) {
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < n; i++) s += exp((double)x[i] - mx);
    double ls = mx + log(s);
    for (int i = 0; i < n; i++) y[i] = (double)x[i] - ls;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

int main(int argc, char **argv) {
    tool_name = "kvquality";
    const char *model = NULL, *data = NULL, *kv_type = NULL, *fields = NULL;
    int positions = 2048, seq_len = 256, threads = 1;
    Flag fl[] = {
        {"-m, --model", "FILE", "required", "the model", F_STR(&model)},
        MODEL_FLAGS{"--data", "FILE", "required", "the text: plain (.gz or not) or jsonl", F_STR(&data)},
        {"--fields", "A,B", "text", "the jsonl fields that hold the text", F_STR(&fields)},
        {"--kv-type", "TYPE", "required", "the cache compared with f32: bf16 or q8_0", F_STR(&kv_type)},
        {"--positions", "N", "2048", "positions compared at most", F_INT(&positions, 1, 1 << 24)},
        {"--seq-len", "L", "256", "tokens a sequence at most", F_INT(&seq_len, 2, 1 << 16)},
        {"-t, --threads", "N", "1", "threads", F_INT(&threads, 1, 64)},
    };
    flags_parse(fl, N_FLAGS(fl), argc, argv, NULL, 0, USAGE, MEMORY);
    if (!model) usage("-m MODEL");
    if (!data) usage("--data");
    if (!kv_type) usage("--kv-type");
    KVType kvt = kv_type_arg(kv_type);
    Model m;
    tool_model_load(&m, model);
    if (model_threads(threads)) die_lib();
    if (seq_len > m.c.seq_len) seq_len = m.c.seq_len;
    TextSet text;
    Sequences seqs[2];
    if (dataset_read(&text, data, fields) || dataset_sequences(&text, m.tok, seq_len, 0.5, 0, &seqs[0], &seqs[1], data))
        die_lib();
    KVCache ref, kv;
    Runner *run = runner_new(&m);
    int V = m.c.vocab_size, L = m.c.n_layers;
    if (!run || kv_init(&ref, &m.c, 1, seq_len, 16) || kv_init_typed(&kv, &m.c, 1, seq_len, 16, kvt) ||
        kv_seq_new(&ref) != 0 || kv_seq_new(&kv) != 0)
        die_lib();
    float *hid = malloc(sizeof(float) * (size_t)seq_len * m.c.dim);
    float *lr = malloc(sizeof(float) * (size_t)seq_len * V), *lq = malloc(sizeof(float) * (size_t)seq_len * V);
    double *pr = malloc(sizeof(double) * V), *pq = malloc(sizeof(double) * V);
    int32_t *pos = malloc(sizeof(int32_t) * seq_len);
    if (!hid || !lr || !lq || !pr || !pq || !pos) die("out of memory");
    for (int i = 0; i < seq_len; i++) pos[i] = i;
    long n = 0, agree = 0, n_next = 0;
    double kl_sum = 0, kl_max = 0, nll_r = 0, nll_q = 0;
    for (int set = 0; set < 2 && n < positions; set++)
        for (int s = 0; s < seqs[set].n && n < positions; s++) {
            const int32_t *tok = seqs[set].tok + seqs[set].off[s];
            int len = seq_len_of(&seqs[set], s);
            if (len > positions - n) len = (int)(positions - n);
            Batch b = {len, tok, NULL, pos, NULL, NULL};
            if (kv_truncate(&ref, 0, 0) || kv_truncate(&kv, 0, 0) || forward_layers(run, &ref, &b, 0, L, hid) ||
                final_logits(run, hid, len, lr) || forward_layers(run, &kv, &b, 0, L, hid) ||
                final_logits(run, hid, len, lq))
                die_lib();
            for (int i = 0; i < len; i++, n++) {
                const float *a = lr + (size_t)i * V, *q = lq + (size_t)i * V;
                log_softmax(pr, a, V), log_softmax(pq, q, V);
                double kl = 0;
                for (int v = 0; v < V; v++) kl += exp(pr[v]) * (pr[v] - pq[v]);
                kl_sum += kl, kl_max = kl > kl_max ? kl : kl_max;
                agree += argmax(a, V) == argmax(q, V);
                if (i + 1 < len) nll_r -= pr[tok[i + 1]], nll_q -= pq[tok[i + 1]], n_next++;
            }
        }
    double ppl_r = exp(nll_r / (n_next ? n_next : 1)), ppl_q = exp(nll_q / (n_next ? n_next : 1));
    printf("kvquality: %s vs f32 KV over %ld positions of %s (%zu vs %zu bytes a position and layer): top-1 agreement "
           "%.2f%% (%ld), mean KL %.3g nats (max %.3g), perplexity %.4f vs %.4f (%+.3f%%)\n",
           kv_type_name(kvt), n, data, kv_bytes_per_token_layer(kvt, kv.kv_dim, kv.n_kv_heads),
           kv_bytes_per_token_layer(KV_F32, kv.kv_dim, kv.n_kv_heads), 100.0 * agree / (n ? n : 1), agree,
           kl_sum / (n ? n : 1), kl_max, ppl_r, ppl_q, 100.0 * (ppl_q / ppl_r - 1));
    free(hid), free(lr), free(lq), free(pr), free(pq), free(pos);
    kv_free(&ref), kv_free(&kv), runner_free(run);
    seqs_free(&seqs[0]), seqs_free(&seqs[1]), dataset_free(&text), model_free(&m);
    return 0;
}
