/* distill-heads — train AdaDecode's exit heads: one d×d matrix T_l per chosen layer,
   from identity, by KL distillation from the frozen model's own last layer.
   bin/distill-heads -m MODEL --data FILE [--fields F1,F2] [--special] [--layers L1,L2,...|auto]
                     [--steps N] [--lr X] [--batch B] [--seq-len S] [--seed S]
                     [--norm 0|1|auto] [--init HEADS] [--heldout F] [-t N] -o HEADS
   FILE: plain text (.gz or not) or jsonl (its `text` field, or --fields), "-" = stdin;
   --special: control tokens written in the text (chat-formatted data) are tokens.
   Defaults: layers auto, 600 steps of 8 sequences of 256 tokens, lr 2/dim with cosine
   decay, norm auto (the untrained heads evaluated with and without the final RMSNorm,
   the lower held-out KL kept), every 10th sequence held out. docs/distill.md says why.
   stderr: a progress bar on a terminal (one summary line otherwise), then per layer the
   held-out KL and top-1 agreement before (T = I, or the --init heads) and after, how
   many positions would exit at γ = 0.5 / 0.75 / 0.9 with what precision, and
   AdaDecode's first-exit rule over all heads. */
#include <math.h>
#include <unistd.h>

#include "train/distill.h"
#include "tool.h"

#define USAGE "-m MODEL --data FILE [--layers L1,L2,...|auto] [--steps N] ... -o HEADS"

#define MEMORY                                                                                                         \
    "memory: about " MEMORY_MODEL "\n"                                                                                 \
    "        + the lm_head once more (transposed, for the gradient) + 20 × dim² bytes a head (the head, its\n"       \
    "        packed copy, Adam's two moments, the gradient) + seq-len × (2 × vocab + (7 + heads) × dim) × 4\n"     \
    "        bytes of activations + a KV cache of seq-len × layers × kv_dim × 8 bytes + the data: its text\n"       \
    "        twice (read, then split into records) and 4 bytes a token.\n"

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* the k tokens the training sequences hold most often (ties: the lower id), a head's check
   vocabulary */
static int32_t *frequent(const Sequences *s, int V, int k) {
    int64_t *count = calloc(V, sizeof(int64_t));
    int32_t *ids = malloc(sizeof(int32_t) * V);
    if (!count || !ids) die("out of memory");
    for (int64_t i = 0; i < seqs_tokens(s); i++) count[s->tok[i]]++;
    for (int v = 0; v < V; v++) ids[v] = v;
    for (int i = 0; i < k; i++) { /* a partial selection: k ≤ a few thousand passes over V */
        int best = i;
        for (int j = i + 1; j < V; j++)
            if (count[ids[j]] > count[ids[best]] || (count[ids[j]] == count[ids[best]] && ids[j] < ids[best])) best = j;
        int32_t x = ids[i];
        ids[i] = ids[best], ids[best] = x;
    }
    free(count);
    return ids;
}

static int parse_layers(const char *s, int L, int *layers) {
    if (!strcmp(s, "auto")) return distill_auto_layers(L, layers);
    int n = 0;
    for (const char *p = s;;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || (*end && *end != ',')) die("--layers: '%s' is not a list of layers or 'auto'", s);
        if (n == MAX_EXIT_HEADS) die("--layers: at most %d heads", MAX_EXIT_HEADS);
        if (v < 1 || v >= L)
            die("--layers: layer %ld is out of range: the model has %d layers, heads go at 1..%d", v, L, L - 1);
        layers[n++] = (int)v;
        if (!*end) break;
        p = end + 1;
    }
    qsort(layers, n, sizeof(int), cmp_int);
    for (int i = 1; i < n; i++)
        if (layers[i] == layers[i - 1]) die("--layers: layer %d given twice", layers[i]);
    return n;
}

static void bar(int step, int steps, double loss, double pos_rate, double eta) {
    char b[31];
    int fill = steps ? 30 * step / steps : 30;
    for (int i = 0; i < 30; i++) b[i] = i < fill ? '#' : '.';
    b[30] = 0;
    fprintf(stderr, "\rdistill-heads [%s] step %d/%d loss %.4f %.1fk pos/s ETA %.0fs \033[K", b, step, steps, loss,
            pos_rate / 1e3, eta);
}

static void print_table(const ExitHeads *h, const HeadStats *before, const HeadStats *after, const ExitStats *first,
                        int n_layers, int64_t positions) {
    fprintf(stderr, "distill-heads: held-out, %lld positions (before: the heads as they started):\n",
            (long long)positions);
    fprintf(stderr,
            "  layer   KL before  KL after  top-1 before  top-1 after   cover/prec @0.5    @0.75          @0.9\n");
    for (int k = 0; k < h->n; k++) {
        const HeadStats *a = &after[k];
        fprintf(stderr, "  %5d   %9.4f  %8.4f  %12.4f  %11.4f  ", h->layer[k], before[k].kl, a->kl, before[k].top1,
                a->top1);
        for (int g = 0; g < EXIT_N_GAMMA; g++) fprintf(stderr, "  %.3f/%.3f", a->cover[g], a->prec[g]);
        fprintf(stderr, "\n");
    }
    for (int g = 0; g < EXIT_N_GAMMA; g++)
        fprintf(stderr, "  first exit at gamma %.2f: %.3f of positions, precision %.3f, %.3f of %d layers per token\n",
                exit_gamma[g], first->rate[g], first->prec[g], first->layers[g], n_layers);
}

int main(int argc, char **argv) {
    tool_name = "distill-heads";
    const char *model = NULL, *data = NULL, *out = NULL, *layer_arg = NULL, *fields = NULL, *init = NULL;
    int special = 0;
    long steps = 600, batch = 8, seq_len = 256, seed = 1, norm = -1, threads = 1, check_vocab = 0;
    const char *device = NULL;
    double lr = 0, heldout = 0.1; /* lr 0: 2/dim (docs/distill.md) */
    const char *norm_arg = NULL;
    Flag t[] = {
        {"-m, --model", "FILE", "required", "the model (frozen)", F_STR(&model)},
        MODEL_FLAGS{"--data", "FILE", "required", "the training text: plain (.gz or not) or jsonl; - is stdin",
                    F_STR(&data)},
        {"--fields", "F1,F2", "text", "jsonl: the fields whose text is joined into a record", F_STR(&fields)},
        {"--special", NULL, NULL, "control tokens written in the text (chat-formatted data) are tokens",
         F_SWITCH(&special)},
        {"-o, --output", "HEADS", "required", "the heads file to write; - is stdout", F_STR(&out)},
        {"--layers", "L1,L2,...", "auto", "the layers that get a head, or auto", F_STR(&layer_arg)},
        {"--steps", "N", "600", "training steps", F_LONG(&steps, 0, 100000000)},
        {"--lr", "X", "2/dim", "Adam's learning rate (cosine decay)", F_NUM(&lr, 1e-9, 10)},
        {"--batch", "B", "8", "sequences a step", F_LONG(&batch, 1, 1 << 16)},
        {"--seq-len", "S", "256", "tokens a sequence (at most the model's context)", F_LONG(&seq_len, 1, 1 << 20)},
        {"-s, --seed", "S", "1", "the order of the sequences", F_LONG(&seed, 0, 1e19)},
        {"--norm", "0|1|auto", "auto", "the final RMSNorm before the head: off, on, or the lower held-out KL",
         F_STR(&norm_arg)},
        {"--init", "HEADS", NULL, "go on from trained heads (their layers, norm and check vocabulary)", F_STR(&init)},
        {"--check-vocab", "K", "0: all",
         "heads whose check reads the K most frequent tokens of the text and one logit "
         "for the rest",
         F_LONG(&check_vocab, 0, 1 << 20)},
        {"--heldout", "F", "0.1", "the share of sequences held out for the report", F_NUM(&heldout, 1e-6, 0.9)},
        {"-t, --threads", "N", "1", "threads", F_LONG(&threads, 1, 64)},
        DEVICE_FLAG(&device),
    };
    int n_t = N_FLAGS(t);
    flags_parse(t, n_t, argc, argv, NULL, 0, USAGE, MEMORY);
    int seq_len_given = flag_given(t, n_t, "--seq-len") != NULL, norm_given = norm_arg != NULL;
    if (norm_arg) norm = !strcmp(norm_arg, "auto") ? -1 : arg_int("--norm", norm_arg, 0, 1);
    if (!model) usage("-m MODEL");
    if (!data) usage("--data FILE");
    if (!out) usage("-o HEADS");
    if (!strcmp(model, "-") && !strcmp(data, "-")) die("-m and --data cannot both be stdin");
    if (strcmp(out, "-")) { /* a bad output path fails now, not after the training */
        AtomicFile af;
        if (atomic_open(&af, out)) die_lib();
        atomic_abort(&af);
    }

    Model m;
    tool_model_load(&m, model);
    if (m.lm_head.t != WT_F32 && m.lm_head.t != WT_BF16) /* the trainers transpose it as floats */
        die("%s: the lm_head is %s: training heads needs an F32 or BF16 one (convert --dtype f32)", model,
            mat_type_name(&m.lm_head));
    if (model_threads((int)threads)) die("cannot start %ld threads", threads);
    device_arg(device);
    ExitHeads h;
    if (init) { /* go on from trained heads: their layers and norm */
        if (layer_arg || norm_given || check_vocab)
            die("--init: the heads file sets the layers, the norm and the check vocabulary; drop --layers, --norm and "
                "--check-vocab");
        if (heads_load(&h, init, &m)) die_lib();
    } else {
        int layers[MAX_EXIT_HEADS], n_heads = parse_layers(layer_arg ? layer_arg : "auto", m.c.n_layers, layers);
        if (n_heads < 1) die("--layers: the model has %d layer(s): no layer for a head", m.c.n_layers);
        if (heads_identity(&h, &m, layers, n_heads, norm < 0 ? 0 : (int)norm)) die_lib();
    }
    int n_heads = h.n;
    if (!seq_len_given && seq_len > m.c.seq_len) seq_len = m.c.seq_len;
    if (lr == 0)
        lr = 2.0 / m.c.dim; /* Adam moves every entry of T by about lr at first, all
                                        in step: z = T x moves by about lr·dim·|x| */
    if (seq_len > m.c.seq_len) die("--seq-len: %ld is longer than the model's context (%d)", seq_len, m.c.seq_len);

    TextSet text;
    Sequences train, held;
    if (dataset_read(&text, data, fields) ||
        dataset_sequences(&text, m.tok, (int)seq_len, heldout, (int)special, &train, &held, data))
        die_lib();
    if (check_vocab) {
        if (check_vocab >= m.c.vocab_size)
            die("--check-vocab: %ld tokens; the vocabulary has %d (a check vocabulary is smaller)", check_vocab,
                m.c.vocab_size);
        int32_t *ids = frequent(&train, m.c.vocab_size, (int)check_vocab);
        if (heads_set_vocab(&h, &m, ids, (int)check_vocab)) die_lib();
        free(ids);
    }
    Distill d;
    SeqOrder order;
    if (distill_init(&d, &m, &h, (int)seq_len, (float)lr) || order_init(&order, train.n, (uint64_t)seed)) die_lib();

    HeadStats before[MAX_EXIT_HEADS], after[MAX_EXIT_HEADS];
    double auto_kl[2] = {0, 0};
    if (!init && norm < 0) { /* --norm auto */
        if (distill_choose_norm(&d, &held, before, auto_kl)) die_lib();
        fprintf(stderr,
                "distill-heads: norm auto: untrained heads' held-out KL (sum over heads) %.4f without the final norm, "
                "%.4f with it: training %s\n",
                auto_kl[0], auto_kl[1], h.norm ? "with it" : "without");
    } else if (distill_eval(&d, &held, before, NULL)) die_lib();
    int *idx = malloc(sizeof(int) * batch), tty = isatty(2);
    if (!idx) die("out of memory");
    double t0 = pd_now(), last = 0, ema = NAN, first = NAN;
    int64_t positions = 0;
    for (long s = 0; s < steps; s++) {
        double loss[MAX_EXIT_HEADS], sum = 0;
        order_next(&order, idx, (int)batch);
        d.lr = distill_lr((float)lr, s, steps);
        if (distill_step(&d, &train, idx, (int)batch, loss)) die_lib();
        for (int b = 0; b < batch; b++) positions += seq_len_of(&train, idx[b]);
        for (int k = 0; k < n_heads; k++) sum += loss[k];
        if (isnan(first)) first = sum;
        ema = isnan(ema) ? sum : 0.95 * ema + 0.05 * sum;
        double now = pd_now();
        if (tty && (now - last > 0.1 || s + 1 == steps)) {
            last = now;
            double rate = positions / (now - t0 + 1e-9);
            bar((int)s + 1, (int)steps, ema, rate, (steps - s - 1) * (now - t0) / (s + 1));
        }
    }
    double dt = pd_now() - t0;
    if (tty) fprintf(stderr, "\r\033[K");
    if (steps)
        fprintf(stderr,
                "distill-heads: %ld steps of %ld sequences, %lld positions in %.1fs (%.1fk positions/s, %d heads), "
                "loss %.4f -> %.4f\n",
                steps, batch, (long long)positions, dt, positions / (dt + 1e-9) / 1e3, n_heads, first, ema);
    else fprintf(stderr, "distill-heads: no training steps: the heads as they start\n");
    ExitStats exits;
    if (distill_eval(&d, &held, after, &exits)) die_lib();
    print_table(&h, before, after, &exits, m.c.n_layers, seqs_tokens(&held));

    Meta meta = {0};
    meta_add(&meta, "paradec.exit.steps", "%ld", steps);
    if (h.n_vocab) meta_add(&meta, "paradec.exit.check_vocab", "%d", h.n_vocab);
    if (auto_kl[0] > 0) meta_add(&meta, "paradec.exit.norm_auto_kl", "%.6f,%.6f", auto_kl[0], auto_kl[1]);
    meta_add(&meta, "paradec.exit.lr", "%g", lr);
    meta_add(&meta, "paradec.exit.batch", "%ld", batch);
    meta_add(&meta, "paradec.exit.seq_len", "%ld", seq_len);
    meta_add(&meta, "paradec.exit.seed", "%ld", seed);
    meta_add(&meta, "paradec.exit.positions", "%lld", (long long)positions);
    meta_add(&meta, "paradec.exit.data_digest", "%s", text.digest);
    meta_add(&meta, "paradec.exit.data_bytes", "%zu", text.bytes);
    meta_add(&meta, "paradec.exit.heldout_positions", "%lld", (long long)seqs_tokens(&held));
    for (int k = 0; k < n_heads; k++) {
        char key[EXIT_KEY_MAX];
        int l = h.layer[k];
        meta_add(&meta, exit_record_key(key, l, "kl_before", -1), "%.6f", before[k].kl);
        meta_add(&meta, exit_record_key(key, l, "top1_before", -1), "%.6f", before[k].top1);
        meta_add(&meta, exit_record_key(key, l, "kl", -1), "%.6f", after[k].kl);
        meta_add(&meta, exit_record_key(key, l, "top1", -1), "%.6f", after[k].top1);
        for (int g = 0; g < EXIT_N_GAMMA; g++) {
            meta_add(&meta, exit_record_key(key, l, "cover", g), "%.6f", after[k].cover[g]);
            meta_add(&meta, exit_record_key(key, l, "precision", g), "%.6f", after[k].prec[g]);
        }
    }
    if (heads_save(&h, out, meta.kv, meta.n)) die_lib();

    free(idx);
    order_free(&order);
    distill_free(&d);
    heads_free(&h);
    seqs_free(&train);
    seqs_free(&held);
    dataset_free(&text);
    model_free(&m);
    return 0;
}
