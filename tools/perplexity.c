/* perplexity — a model's perplexity on a text, by llama.cpp's llama-perplexity protocol,
   so the two can be compared on the same file (a measurement, never a test).
   bin/perplexity -m MODEL -f TEXT [-c CTX] [--chunks K] [--logits OUT] [-t THREADS]
   The text is tokenized whole (BOS in front when the vocabulary asks for one) and cut
   into chunks of CTX tokens; each chunk is one fresh sequence, its first token replaced
   by BOS when the vocabulary asks for one, and only its second half is scored: the
   negative log-likelihood of token j+1 from the logits at j, for j from CTX/2 to CTX-2.
   stdout: one JSON object (ppl, its standard error, mean NLL, tokens scored, chunks).
   --logits writes what was scored for an outside reference (scripts/quality_ref.py):
   "PDLOGITS", int32 ctx, vocab, chunks, first (CTX/2), the chunks' tokens
   (int32[chunks][ctx]), then per chunk the float32 logits of positions first..ctx-2. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "tool.h"

#define USAGE "-m MODEL -f TEXT [-c CTX] [--chunks K] [--logits OUT] [-t THREADS] [--kv-type T]"
#define MEMORY                                                                                                         \
    "memory: about " MEMORY_MODEL                                                                                      \
    "\n        + " MEMORY_KV("1") "\n"                                                                                 \
                                  "        + CTX × (vocab + a few × dim) × 4 bytes of activations and logits.\n"

/* −log softmax(row)[target], in double */
static double nll_of(const float *row, int vocab, int target) {
    double mx = row[0], s = 0;
    for (int i = 1; i < vocab; i++) mx = row[i] > mx ? row[i] : mx;
    for (int i = 0; i < vocab; i++) s += exp(row[i] - mx);
    return log(s) + mx - row[target];
}

static void put_bytes(AtomicFile *f, const void *p, size_t size, size_t n) {
    if (fwrite(p, size, n, f->f) != n) die("%s: write failed", f->path);
}

int main(int argc, char **argv) {
    tool_name = "perplexity";
    const char *model = NULL, *text = NULL, *logits_out = NULL, *kv_type = "f32";
    int ctx = 512, chunks = -1, threads = 1;
    Flag fl[] = {
        {"-m, --model", "FILE", "required", "the model", F_STR(&model)},
        MODEL_FLAGS{"-f, --file", "TEXT", "required", "the text (UTF-8)", F_STR(&text)},
        {"-c, --ctx", "CTX", "512", "tokens per chunk (the second half is scored)", F_INT(&ctx, 4, 1 << 20)},
        {"--chunks", "K", "all", "score only the first K chunks", F_INT(&chunks, 1, 1 << 30)},
        {"--logits", "OUT", "none", "also write the scored logits to OUT (see the header of tools/perplexity.c)",
         F_STR(&logits_out)},
        {"-t, --threads", "N", "1", "threads", F_INT(&threads, 1, 64)},
        KV_TYPE_FLAG(&kv_type),
    };
    flags_parse(fl, N_FLAGS(fl), argc, argv, NULL, 0, USAGE, MEMORY);
    if (!model) usage("-m MODEL");
    if (!text) usage("-f TEXT");
    KVType kvt = kv_type_arg(kv_type);
    Model m;
    tool_model_load(&m, model);
    if (model_threads(threads)) die_lib();
    if (ctx > m.c.seq_len) die("-c %d exceeds the model's context of %d", ctx, m.c.seq_len);
    char *buf;
    size_t len;
    if (pd_read_file(text, &buf, &len)) die_lib();
    int32_t *ids;
    int n_ids, bos = tok_add_bos(m.tok) ? tok_bos(m.tok) : -1;
    if (tok_encode_flags(m.tok, buf, len, bos >= 0 ? TOK_ADD_BOS : 0, &ids, &n_ids)) die_lib();
    free(buf);
    if (n_ids < 2 * ctx)
        die("%s: %d tokens; -c %d needs at least %d (two chunks, as llama-perplexity asks)", text, n_ids, ctx, 2 * ctx);
    int n_chunk = n_ids / ctx, first = ctx / 2, vocab = m.c.vocab_size;
    if (chunks > 0 && chunks < n_chunk) n_chunk = chunks;
    KVCache kv;
    if (kv_init_typed(&kv, &m.c, 1, ctx, 16, kvt) || kv_seq_new(&kv) != 0) die_lib();
    float *hid = malloc(sizeof(float) * (size_t)ctx * m.c.dim);
    float *lg = malloc(sizeof(float) * (size_t)(ctx - first) * vocab);
    int32_t *pos = malloc(sizeof(int32_t) * ctx);
    Runner *run = runner_new(&m);
    if (!hid || !lg || !pos || !run) die("out of memory");
    for (int i = 0; i < ctx; i++) pos[i] = i;
    for (int c = 0; c < n_chunk && bos >= 0; c++) ids[(size_t)c * ctx] = bos;
    AtomicFile lf = {0};
    if (logits_out) {
        if (atomic_open(&lf, logits_out)) die_lib();
        int32_t head[4] = {ctx, vocab, n_chunk, first};
        put_bytes(&lf, "PDLOGITS", 8, 1), put_bytes(&lf, head, 4, 4),
            put_bytes(&lf, ids, sizeof(int32_t), (size_t)n_chunk * ctx);
    }
    double nll = 0, nll2 = 0;
    long count = 0;
    Progress p;
    progress_begin(&p, "perplexity: chunks", n_chunk);
    for (int c = 0; c < n_chunk; c++) {
        const int32_t *tok = ids + (size_t)c * ctx;
        Batch b = {ctx, tok, NULL, pos, NULL, NULL};
        if (kv_truncate(&kv, 0, 0) || forward_layers(run, &kv, &b, 0, m.c.n_layers, hid) ||
            final_logits(run, hid + (size_t)first * m.c.dim, ctx - 1 - first, lg))
            die_lib();
        for (int j = first; j < ctx - 1; j++) {
            double v = nll_of(lg + (size_t)(j - first) * vocab, vocab, tok[j + 1]);
            nll += v, nll2 += v * v, count++;
        }
        if (logits_out) put_bytes(&lf, lg, sizeof(float) * vocab, (size_t)(ctx - 1 - first));
        progress_step(&p, c + 1);
    }
    progress_end(&p);
    if (logits_out && atomic_commit(&lf)) die_lib();
    double av = nll / count, var = nll2 / count - av * av;
    double se = var > 0 && count > 1 ? sqrt(var / (count - 1)) : 0;
    printf("{\"ppl\":%.6f,\"ppl_se\":%.6f,\"nll\":%.6f,\"tokens_scored\":%ld,\"chunks\":%d,\"ctx\":%d}\n", exp(av),
           exp(av) * se, av, count, n_chunk, ctx);
    free(ids), free(hid), free(lg), free(pos);
    runner_free(run);
    kv_free(&kv);
    model_free(&m);
    return 0;
}
