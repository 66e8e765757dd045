/* train-medusa — train Medusa heads (Cai et al. 2024) on a frozen model: K ResBlocks
   on the last hidden state, head k predicting the token k + 2 positions on; or, with
   --eagle, an EAGLE draft head (Li et al. 2024): one decoder layer on the model's
   features and the next token's embedding (heads/eagle_head.h, docs/eagle.md).
   bin/train-medusa -m MODEL --data FILE --heads K [--loss-weights W1,W2,...] [--own-lm-head]
                    [--targets self|data] [--generate N] [--init HEADS] [--steps N] [--lr X] [--lm-lr X]
                    [--batch B] [--seq-len S] [--seed S] [--heldout F] [--cache-mb M] [-t N]
                    [--fields F] [--special] -o HEADS
   bin/train-medusa -m MODEL --data FILE --eagle [--draft-vocab K] [--reg-weight X] [--ce-weight X]
                    [--clip X] [--unroll N [--unroll-from S]] [--init HEAD] [--generate N] [--steps N] [--lr X]
                    [--batch B] [--seq-len S] [--seed S] [--heldout F] [--cache-mb M] [-t N] [--fields F] [--special]
                    -o HEAD
   FILE: plain text (.gz or not) or jsonl (its `text` field, or --fields), "-" = stdin;
   --special: control tokens written in the text are tokens. --generate N: every
   sequence is cut to its first N tokens and the model continues it greedily, so the
   heads learn (and are judged) on the model's own text. docs/medusa.md says why the
   defaults are what they are.
   stderr: a progress bar on a terminal (one summary line otherwise), then per head the
   held-out cross-entropy, top-1 and top-5 accuracy against the model's own greedy
   token before (W = 0, b = 0: the model's next-token logits) and after training; with
   --eagle the head's held-out CE, feature loss and top-1 before and after (its draft
   vocabulary: the K most frequent tokens of the training text, K = min(vocab, 4096)
   unless --draft-vocab says). */
#include <math.h>
#include <unistd.h>

#include "train/distill.h" /* SeqOrder, distill_lr */
#include "train/eagle_train.h"
#include "train/medusa_train.h"
#include "tool.h"

#define USAGE                                                                                                          \
    "-m MODEL --data FILE --heads K [--own-lm-head] [--generate N] [--steps N] ... -o HEADS\n"                         \
    "       train-medusa -m MODEL --data FILE --eagle [--draft-vocab K] [--steps N] ... -o HEAD"

#define MEMORY                                                                                                         \
    "memory: about " MEMORY_MODEL "\n"                                                                                 \
    "        + the lm_head twice more as f32 (transposed, for the gradient) + 20 × dim² bytes a head (the\n"         \
    "        head, its packed copy, Adam's two moments, the gradient), and 24 × vocab × dim bytes more a head\n"     \
    "        with --own-lm-head + seq-len × (2 × vocab + 7 × dim) × 4 bytes of activations + a KV cache of\n"      \
    "        seq-len × layers × kv_dim × 8 bytes (with --generate: 32 sequences' worth) + the model's outputs\n"    \
    "        kept for reuse, at most --cache-mb MiB (default 4096) + the data: its text twice and 4 bytes a token.\n"  \
    "        --eagle: instead of the lm_head's copies and the heads, 24 bytes a weight of the layer and W_fc\n"        \
    "        (dim × (6 dim + 3 hidden) weights with full attention: the head, its gradient, Adam's moments, each\n"   \
    "        packed both ways) + 12 × K × dim bytes (E_K, packed both ways) + seq-len × (24 × dim\n"               \
    "        + 10 × hidden + K) × 4 bytes of activations and their gradients + heads × seq-len² × 2 bytes of\n"   \
    "        attention weights, both once per unrolled step (max(--unroll, 3) steps).\n"

/* "1,0.8,0.5": exactly K positive numbers */
static void parse_weights(const char *s, int K, float *w) {
    int n = 0;
    for (const char *p = s;;) {
        char *end;
        errno = 0;
        double v = strtod(p, &end);
        if (end == p || errno || (*end && *end != ',') || !(v > 0 && v < 1e6))
            die("--loss-weights: '%s' is not a list of positive numbers", s);
        if (n == MAX_MEDUSA) die("--loss-weights: more than %d weights", MAX_MEDUSA);
        w[n++] = (float)v;
        if (!*end) break;
        p = end + 1;
    }
    if (n != K) die("--loss-weights: %d weights for %d heads", n, K);
}

static void bar(long step, long steps, double loss, double pos_rate, double eta) {
    char b[31];
    int fill = steps ? (int)(30 * step / steps) : 30;
    for (int i = 0; i < 30; i++) b[i] = i < fill ? '#' : '.';
    b[30] = 0;
    fprintf(stderr, "\rtrain-medusa [%s] step %ld/%ld loss %.4f %.1fk pos/s ETA %.0fs \033[K", b, step, steps, loss,
            pos_rate / 1e3, eta);
}

static void print_table(int K, const MedusaStats *before, const MedusaStats *after, int from) {
    fprintf(stderr,
            "train-medusa: held-out%s, target = the model's own greedy token (before: the heads as they started; "
            "untrained, W = 0 and b = 0: the model's next-token logits):\n",
            from ? ", the generated text" : "");
    fprintf(stderr,
            "  head  token  positions  CE before  CE after  top-1 before  top-1 after  top-5 before  top-5 after\n");
    for (int k = 0; k < K; k++)
        fprintf(stderr, "  %4d  t+%-3d  %9lld  %9.4f  %8.4f  %12.4f  %11.4f  %12.4f  %11.4f\n", k, k + 2,
                (long long)after[k].positions, before[k].loss, after[k].loss, before[k].top1, after[k].top1,
                before[k].top5, after[k].top5);
}

typedef struct {
    const char *model, *data, *out, *fields, *weights, *init;
    long K, generate, steps, batch, seq_len, seed, threads, cache_mb, draft_vocab, unroll, unroll_from;
    const char *device;
    int special, own_lm, eagle;
    double lr, lm_lr, heldout, reg_weight, ce_weight, clip;
    int seq_len_given;
    MedusaTargets targets;
} Args;

static Args parse(int argc, char **argv) {
    Args a = {.steps = 2000,
              .batch = 8,
              .seq_len = 256,
              .seed = 1,
              .threads = 1,
              .cache_mb = 4096,
              .heldout = 0.1,
              .reg_weight = EAGLE_W_REG,
              .ce_weight = EAGLE_W_CE,
              .clip = EAGLE_CLIP,
              .unroll = 1,
              .targets = MEDUSA_TARGETS_SELF};
    const char *targets = NULL;
    Flag t[] = {
        {"-m, --model", "FILE", "required", "the model (frozen)", F_STR(&a.model)},
        MODEL_FLAGS{"--data", "FILE", "required", "the training text: plain (.gz or not) or jsonl; - is stdin",
                    F_STR(&a.data)},
        {"--fields", "F1,F2", "text", "jsonl: the fields whose text is joined into a record", F_STR(&a.fields)},
        {"--special", NULL, NULL, "control tokens written in the text are tokens", F_SWITCH(&a.special)},
        {"-o, --output", "HEADS", "required", "the heads file to write; - is stdout", F_STR(&a.out)},
        {"--heads", "K", "required without --init", "Medusa heads to train", F_LONG(&a.K, 1, MAX_MEDUSA)},
        {"--loss-weights", "W1,W2,...", "1, 0.8, 0.6, ...", "each head's weight in the loss", F_STR(&a.weights)},
        {"--own-lm-head", NULL, NULL, "each head trains its own LM head (from the model's)", F_SWITCH(&a.own_lm)},
        {"--init", "HEADS", NULL, "go on from trained heads (with --eagle: a trained EAGLE head)", F_STR(&a.init)},
        {"--eagle", NULL, NULL, "train an EAGLE draft head instead of Medusa heads", F_SWITCH(&a.eagle)},
        {"--draft-vocab", "K", "min(vocab, 4096)", "--eagle: the draft vocabulary, the text's K most frequent tokens",
         F_LONG(&a.draft_vocab, 1, 1 << 24)},
        {"--reg-weight", "X", "1", "--eagle: the feature regression's (smooth L1) weight in the loss",
         F_NUM(&a.reg_weight, 0, 1e6)},
        {"--ce-weight", "X", "1", "--eagle: the cross-entropy's weight in the loss", F_NUM(&a.ce_weight, 0, 1e6)},
        {"--clip", "X", "0.5", "--eagle: clip the gradient's global norm to X (0: off)", F_NUM(&a.clip, 0, 1e9)},
        {"--unroll", "N", "1", "--eagle: EAGLE-3's training-time test, the draft run N steps on its own features",
         F_LONG(&a.unroll, 1, EAGLE_MAX_STEPS)},
        {"--unroll-from", "S", "0",
         "--eagle: steps before S train one step deep; from S on, --unroll deep, as a second run "
         "from the head at S would (--init: Adam, the cosine decay and the order afresh)",
         F_LONG(&a.unroll_from, 0, 100000000)},
        {"--targets", "self|data", "self", "what the heads learn: the model's greedy tokens or the data's",
         F_STR(&targets)},
        {"--generate", "N", "0: off", "cut each sequence to N tokens and let the model continue it greedily",
         F_LONG(&a.generate, 0, 1 << 20)},
        {"--steps", "N", "2000", "training steps", F_LONG(&a.steps, 0, 100000000)},
        {"--lr", "X", "1/dim", "Adam's learning rate (cosine decay)", F_NUM(&a.lr, 1e-9, 10)},
        {"--lm-lr", "X", "--lr", "the own LM heads' learning rate", F_NUM(&a.lm_lr, 1e-9, 10)},
        {"--batch", "B", "8", "sequences a step", F_LONG(&a.batch, 1, 1 << 16)},
        {"--seq-len", "S", "256", "tokens a sequence (at most the model's context)", F_LONG(&a.seq_len, 2, 1 << 20)},
        {"-s, --seed", "S", "1", "the order of the sequences", F_LONG(&a.seed, 0, 1e19)},
        {"--heldout", "F", "0.1", "the share of sequences held out for the report", F_NUM(&a.heldout, 1e-6, 0.5)},
        {"--cache-mb", "M", "4096", "keep the model's outputs in memory when they fit in M MiB",
         F_LONG(&a.cache_mb, 0, 1 << 30)},
        {"-t, --threads", "N", "1", "threads", F_LONG(&a.threads, 1, 64)},
        DEVICE_FLAG(&a.device),
    };
    int n_t = N_FLAGS(t);
    flags_parse(t, n_t, argc, argv, NULL, 0, USAGE, MEMORY);
    a.seq_len_given = flag_given(t, n_t, "--seq-len") != NULL;
    if (targets && !strcmp(targets, "self")) a.targets = MEDUSA_TARGETS_SELF;
    else if (targets && !strcmp(targets, "data")) a.targets = MEDUSA_TARGETS_DATA;
    else if (targets) die("--targets: '%s' is not self or data", targets);
    if (!a.model) usage("-m MODEL");
    if (!a.data) usage("--data FILE");
    if (!a.out) usage("-o HEADS");
    const char *medusa_only[] = {"--heads", "--loss-weights", "--own-lm-head", "--targets", "--lm-lr"};
    const char *eagle_only[] = {"--draft-vocab", "--reg-weight", "--ce-weight", "--clip", "--unroll", "--unroll-from"};
    for (int i = 0; i < 5 && a.eagle; i++)
        if (flag_given(t, n_t, medusa_only[i]))
            die("%s: Medusa heads only; --eagle trains one EAGLE head", medusa_only[i]);
    for (int i = 0; i < 6 && !a.eagle; i++)
        if (flag_given(t, n_t, eagle_only[i])) die("%s: only with --eagle", eagle_only[i]);
    if (a.eagle) {
        if (a.init && a.draft_vocab) die("--init: the head sets its draft vocabulary; drop --draft-vocab");
        if (a.reg_weight == 0 && a.ce_weight == 0) die("--reg-weight and --ce-weight: both 0 leaves nothing to learn");
        if (a.unroll_from && a.unroll < 2) die("--unroll-from: needs --unroll 2 or more");
        if (a.unroll_from && a.unroll_from >= a.steps)
            die("--unroll-from %ld: the training has %ld steps; the unrolled phase would have none", a.unroll_from,
                a.steps);
        if (!strcmp(a.model, "-") && !strcmp(a.data, "-")) die("-m and --data cannot both be stdin");
        return a;
    }
    if (a.init && (a.K || a.own_lm))
        die("--init: the heads file sets the heads and their LM heads; drop --heads and --own-lm-head");
    if (!a.K && !a.init) die("--heads K is needed (1..%d)", MAX_MEDUSA);
    if (!strcmp(a.model, "-") && !strcmp(a.data, "-")) die("-m and --data cannot both be stdin");
    return a;
}

/* the model's outputs kept for s when they fit in the budget: all computed up front when
   `draws` sequences will visit each of them, else each when first drawn (100 steps of 4
   draw a tenth of SmolLM2's answers) */
static int maybe_cache(MedusaTrain *t, const Sequences *s, long mb, double draws, MedusaCache *c) {
    double bytes = (double)seqs_tokens(s) * (t->h->dim + 1) * 4;
    memset(c, 0, sizeof *c);
    if (bytes > (double)mb * (1 << 20)) return 0;
    Progress pg;
    return medusa_cache_build(t, s, c, draws >= s->n, &pg);
}

static void rank_acc_into(MedusaHeads *h, const MedusaStats *st) {
    for (int k = 0; k < h->n; k++)
        for (int r = 0; r < MEDUSA_RANKS; r++) h->rank_acc[k][r] = (float)st[k].rank[r];
    h->has_acc = 1;
}

/* ---- --eagle ---- */

/* as maybe_cache */
static int eagle_maybe_cache(EagleTrain *t, const Sequences *s, long mb, double draws, MedusaCache *c) {
    double bytes = (double)seqs_tokens(s) * (t->dim + 1) * 4;
    memset(c, 0, sizeof *c);
    if (bytes > (double)mb * (1 << 20)) return 0;
    Progress pg;
    return eagle_cache_build(t, s, c, draws >= s->n, &pg);
}

static void eagle_table(const EagleStats *before, const EagleStats *after, int K, int from) {
    fprintf(stderr,
            "train-medusa: EAGLE head, held-out%s, target = the model's own greedy token (%lld positions, %.1f%% of "
            "them in the draft vocabulary of %d tokens; CE over those, top-1 over all):\n",
            from ? ", the generated text" : "", (long long)after->positions, 100 * after->coverage, K);
    fprintf(stderr, "  CE before  CE after  feature loss before  feature loss after  top-1 before  top-1 after\n");
    fprintf(stderr, "  %9.4f  %8.4f  %19.4f  %18.4f  %12.4f  %11.4f\n", before->ce, after->ce, before->reg, after->reg,
            before->top1, after->top1);
    fprintf(stderr, "  top-1 after, the draft run on its own features, depth 1..%d:", after->depth);
    for (int k = 0; k < after->depth; k++) fprintf(stderr, " %.4f", after->top1_at[k]);
    fprintf(stderr, "\n");
}

/* steps 0..s-1's work for the ETA: an unrolled step runs the draft `unroll` times */
static double eagle_work(const Args *a, long s) {
    long S = a->unroll_from, one = s < S ? s : S;
    return (double)one + (double)(s - one) * (double)a->unroll;
}

/* trains an EAGLE head (from init, or fresh over the training text's most frequent
   tokens) and writes it to a->out */
static void train_eagle(const Args *a, Model *m, EagleParams *init, const TextSet *text, const Sequences *train,
                        const Sequences *held) {
    EagleParams p;
    if (init) p = *init;
    else {
        int V = m->c.vocab_size, K = a->draft_vocab ? (int)a->draft_vocab : V < 4096 ? V : 4096;
        int32_t *vocab = malloc(sizeof(int32_t) * K);
        if (!vocab) die("out of memory");
        if (eagle_vocab_from_counts(m, train->tok, seqs_tokens(train), K, vocab) || eagle_params_init(&p, m, vocab, K))
            die_lib();
        free(vocab);
    }
    EagleTrain t;
    SeqOrder order;
    MedusaCache ctrain, cheld;
    if (eagle_train_init(&t, m, &p, (int)a->seq_len, (int)a->unroll, (float)a->lr) ||
        order_init(&order, train->n, (uint64_t)a->seed) ||
        eagle_maybe_cache(&t, train, a->cache_mb, (double)a->steps * a->batch, &ctrain) ||
        eagle_maybe_cache(&t, held, a->cache_mb, held->n, &cheld))
        die_lib();
    t.w_reg = (float)a->reg_weight, t.w_ce = (float)a->ce_weight, t.clip = (float)a->clip;
    /* generated text: judge the head where decoding uses it, from the first generated token on */
    t.eval_from = a->generate ? (int)a->generate - 1 : 0;
    EagleStats before, after;
    if (eagle_train_eval(&t, held, &cheld, &before)) die_lib();
    int *idx = malloc(sizeof(int) * a->batch), tty = isatty(2);
    if (!idx) die("out of memory");
    double t0 = pd_now(), last = 0, ema = NAN, first = NAN;
    int64_t positions = 0;
    const long S = a->unroll_from; /* the unrolled phase's first step (0: unrolled throughout) */
    if (S && eagle_train_phase(&t, 1)) die_lib();
    for (long s = 0; s < a->steps; s++) {
        EagleSums sum;
        if (S && s == S) { /* as a second run from this head: the sequences' order begins again too */
            order_free(&order);
            if (eagle_train_phase(&t, (int)a->unroll) || order_init(&order, train->n, (uint64_t)a->seed)) die_lib();
        }
        order_next(&order, idx, (int)a->batch);
        t.lr = (float)a->lr * (s < S ? distill_lr(1, s, S) : distill_lr(1, s - S, a->steps - S)); /* cosine decay */
        if (eagle_train_step(&t, train, &ctrain, idx, (int)a->batch, &sum)) die_lib();
        positions += sum.positions_at[0];
        double loss = sum.loss / sum.positions_at[0];
        if (isnan(first)) first = loss;
        ema = isnan(ema) ? loss : 0.95 * ema + 0.05 * loss;
        double now = pd_now();
        if (tty && (now - last > 0.1 || s + 1 == a->steps)) {
            last = now;
            double done = eagle_work(a, s + 1), eta = (eagle_work(a, a->steps) - done) * (now - t0) / done;
            bar(s + 1, a->steps, ema, positions / (now - t0 + 1e-9), eta);
        }
    }
    double dt = pd_now() - t0;
    if (tty) fprintf(stderr, "\r\033[K");
    if (a->steps)
        fprintf(stderr,
                "train-medusa: %ld steps of %ld sequences, %lld positions in %.1fs (%.1fk positions/s, an EAGLE "
                "head), loss %.4f -> %.4f\n",
                a->steps, a->batch, (long long)positions, dt, positions / (dt + 1e-9) / 1e3, first, ema);
    else fprintf(stderr, "train-medusa: no training steps: the head as it starts\n");
    if (eagle_train_eval(&t, held, &cheld, &after)) die_lib();
    eagle_table(&before, &after, p.c.vocab_size, t.eval_from);
    p.acc = (float)after.top1;

    Meta meta = {0};
    meta_add(&meta, "paradec.eagle.steps", "%ld", a->steps);
    meta_add(&meta, "paradec.eagle.lr", "%g", a->lr);
    meta_add(&meta, "paradec.eagle.batch", "%ld", a->batch);
    meta_add(&meta, "paradec.eagle.seq_len", "%ld", a->seq_len);
    meta_add(&meta, "paradec.eagle.seed", "%ld", a->seed);
    meta_add(&meta, "paradec.eagle.reg_weight", "%g", a->reg_weight);
    meta_add(&meta, "paradec.eagle.ce_weight", "%g", a->ce_weight);
    meta_add(&meta, "paradec.eagle.clip", "%g", a->clip);
    meta_add(&meta, "paradec.eagle.unroll", "%ld", a->unroll);
    meta_add(&meta, "paradec.eagle.unroll_from", "%ld", a->unroll_from);
    meta_add(&meta, "paradec.eagle.generate", "%ld", a->generate);
    meta_add(&meta, "paradec.eagle.positions", "%lld", (long long)positions);
    meta_add(&meta, "paradec.eagle.data_digest", "%s", text->digest);
    meta_add(&meta, "paradec.eagle.data_bytes", "%zu", text->bytes);
    meta_add(&meta, "paradec.eagle.heldout_positions", "%lld", (long long)after.positions);
    meta_add(&meta, "paradec.eagle.coverage", "%.6f", after.coverage);
    meta_add(&meta, "paradec.eagle.ce_before", "%.6f", before.ce);
    meta_add(&meta, "paradec.eagle.top1_before", "%.6f", before.top1);
    meta_add(&meta, "paradec.eagle.ce", "%.6f", after.ce);
    meta_add(&meta, "paradec.eagle.reg", "%.6f", after.reg);
    /* stored as the model's layers are (bf16 halves what a draft step reads; f32 otherwise) */
    p.dt = m->layers[0].wq.t == WT_BF16 ? DT_BF16 : DT_F32;
    if (eagle_params_save(&p, a->out, meta.kv, meta.n)) die_lib();

    free(idx);
    medusa_cache_free(&ctrain);
    medusa_cache_free(&cheld);
    order_free(&order);
    eagle_train_free(&t);
    eagle_params_free(&p);
}

int main(int argc, char **argv) {
    tool_name = "train-medusa";
    Args a = parse(argc, argv);
    if (strcmp(a.out, "-")) { /* a bad output path fails now, not after the training */
        AtomicFile af;
        if (atomic_open(&af, a.out)) die_lib();
        atomic_abort(&af);
    }

    Model m;
    tool_model_load(&m, a.model);
    if (!a.eagle && m.lm_head.t != WT_F32 && m.lm_head.t != WT_BF16) /* the trainers transpose it as floats */
        die("%s: the lm_head is %s: training heads needs an F32 or BF16 one (convert --dtype f32)", a.model,
            mat_type_name(&m.lm_head));
    if (model_threads((int)a.threads)) die("cannot start %ld threads", a.threads);
    device_arg(a.device);
    if (!a.seq_len_given && a.seq_len > m.c.seq_len) a.seq_len = m.c.seq_len;
    if (a.seq_len > m.c.seq_len) die("--seq-len: %ld is longer than the model's context (%d)", a.seq_len, m.c.seq_len);
    if (a.generate >= a.seq_len)
        die("--generate: a prefix of %ld tokens leaves nothing to generate in --seq-len %ld", a.generate, a.seq_len);
    if (a.draft_vocab > m.c.vocab_size)
        die("--draft-vocab: %ld tokens; the model has %d", a.draft_vocab, m.c.vocab_size);
    EagleParams ep;
    if (a.eagle && a.init && eagle_params_load(&ep, a.init, &m)) die_lib();
    MedusaHeads h;
    if (!a.eagle && a.init) { /* go on from trained heads (with --steps 0: evaluate them) */
        if (medusa_load(&h, a.init, &m)) die_lib();
        a.K = h.n;
        for (int k = 0; k < h.n; k++) a.own_lm |= h.lm[k] != NULL;
    }
    float weights[MAX_MEDUSA];
    if (a.weights) parse_weights(a.weights, (int)a.K, weights);
    else medusa_default_weights((int)a.K, weights);
    if (a.lr == 0) a.lr = 1.0 / m.c.dim; /* docs/medusa.md, docs/eagle.md */
    if (a.lm_lr == 0) a.lm_lr = a.lr;

    TextSet text;
    Sequences train, held;
    if (dataset_read(&text, a.data, a.fields) ||
        dataset_sequences(&text, m.tok, (int)a.seq_len, a.heldout, (int)a.special, &train, &held, a.data))
        die_lib();
    if (a.generate) { /* the model's own continuations replace the text */
        Sequences gt, gh;
        Progress pg;
        if (medusa_generate(&m, &train, (int)a.generate, (int)a.seq_len, 64, &gt, &pg) ||
            medusa_generate(&m, &held, (int)a.generate, (int)a.seq_len, 64, &gh, NULL))
            die_lib();
        seqs_free(&train);
        seqs_free(&held);
        train = gt, held = gh;
    }
    if (a.eagle) {
        train_eagle(&a, &m, a.init ? &ep : NULL, &text, &train, &held);
        seqs_free(&train);
        seqs_free(&held);
        dataset_free(&text);
        model_free(&m);
        return 0;
    }
    MedusaTrain t;
    SeqOrder order;
    MedusaCache ctrain, cheld;
    if ((!a.init && medusa_init(&h, &m, (int)a.K, (int)a.own_lm)) ||
        medusa_train_init(&t, &m, &h, (int)a.seq_len, (float)a.lr, (float)a.lm_lr, weights, a.targets) ||
        order_init(&order, train.n, (uint64_t)a.seed) ||
        maybe_cache(&t, &train, a.cache_mb, (double)a.steps * a.batch, &ctrain) ||
        maybe_cache(&t, &held, a.cache_mb, held.n, &cheld))
        die_lib();

    /* generated text: judge the heads where decoding uses them, on the model's own
       tokens (from the prompt's last one on) */
    t.eval_from = a.generate ? (int)a.generate - 1 : 0;
    MedusaStats before[MAX_MEDUSA], after[MAX_MEDUSA];
    if (medusa_train_eval(&t, &held, &cheld, before)) die_lib();
    int *idx = malloc(sizeof(int) * a.batch), tty = isatty(2), K = (int)a.K;
    if (!idx) die("out of memory");
    double t0 = pd_now(), last = 0, ema = NAN, first = NAN;
    int64_t positions = 0;
    for (long s = 0; s < a.steps; s++) {
        double loss[MAX_MEDUSA], sum = 0;
        order_next(&order, idx, (int)a.batch);
        float f = distill_lr(1, s, a.steps); /* cosine decay */
        t.lr = (float)a.lr * f, t.lr_lm = (float)a.lm_lr * f;
        if (medusa_train_step(&t, &train, &ctrain, idx, (int)a.batch, loss)) die_lib();
        for (int b = 0; b < a.batch; b++) positions += seq_len_of(&train, idx[b]);
        for (int k = 0; k < K; k++) sum += weights[k] * loss[k];
        if (isnan(first)) first = sum;
        ema = isnan(ema) ? sum : 0.95 * ema + 0.05 * sum;
        double now = pd_now();
        if (tty && (now - last > 0.1 || s + 1 == a.steps)) {
            last = now;
            bar(s + 1, a.steps, ema, positions / (now - t0 + 1e-9), (a.steps - s - 1) * (now - t0) / (s + 1));
        }
    }
    double dt = pd_now() - t0;
    if (tty) fprintf(stderr, "\r\033[K");
    if (a.steps)
        fprintf(stderr,
                "train-medusa: %ld steps of %ld sequences, %lld positions in %.1fs (%.1fk positions/s, %d heads), "
                "weighted loss %.4f -> %.4f\n",
                a.steps, a.batch, (long long)positions, dt, positions / (dt + 1e-9) / 1e3, K, first, ema);
    else fprintf(stderr, "train-medusa: no training steps: the heads as they start\n");
    if (medusa_train_eval(&t, &held, &cheld, after)) die_lib();
    print_table(K, before, after, t.eval_from);
    rank_acc_into(&h, after);

    Meta meta = {0};
    char w[16 * MAX_MEDUSA] = "";
    for (int k = 0; k < K; k++) snprintf(w + strlen(w), sizeof w - strlen(w), "%s%g", k ? "," : "", weights[k]);
    meta_add(&meta, "paradec.medusa.steps", "%ld", a.steps);
    meta_add(&meta, "paradec.medusa.lr", "%g", a.lr);
    meta_add(&meta, "paradec.medusa.lm_lr", "%g", a.lm_lr);
    meta_add(&meta, "paradec.medusa.batch", "%ld", a.batch);
    meta_add(&meta, "paradec.medusa.seq_len", "%ld", a.seq_len);
    meta_add(&meta, "paradec.medusa.seed", "%ld", a.seed);
    meta_add(&meta, "paradec.medusa.loss_weights", "%s", w);
    meta_add(&meta, "paradec.medusa.own_lm_head", "%d", a.own_lm);
    meta_add(&meta, "paradec.medusa.targets", "%s", a.targets == MEDUSA_TARGETS_SELF ? "self" : "data");
    meta_add(&meta, "paradec.medusa.generate", "%ld", a.generate);
    meta_add(&meta, "paradec.medusa.positions", "%lld", (long long)positions);
    meta_add(&meta, "paradec.medusa.data_digest", "%s", text.digest);
    meta_add(&meta, "paradec.medusa.data_bytes", "%zu", text.bytes);
    meta_add(&meta, "paradec.medusa.heldout_positions", "%lld", (long long)seqs_tokens(&held));
    for (int k = 0; k < K; k++) {
        char key[48];
#define FACT(what, v) (snprintf(key, sizeof key, "paradec.medusa.%d." what, k), meta_add(&meta, key, "%.6f", v))
        FACT("loss_before", before[k].loss);
        FACT("top1_before", before[k].top1);
        FACT("top5_before", before[k].top5);
        FACT("loss", after[k].loss);
        FACT("top1", after[k].top1);
        FACT("top5", after[k].top5);
#undef FACT
    }
    if (medusa_save(&h, a.out, meta.kv, meta.n)) die_lib();

    free(idx);
    medusa_cache_free(&ctrain);
    medusa_cache_free(&cheld);
    order_free(&order);
    medusa_train_free(&t);
    medusa_free(&h);
    seqs_free(&train);
    seqs_free(&held);
    dataset_free(&text);
    model_free(&m);
    return 0;
}
