/* test_eagle_train — training an EAGLE head on stories260K: the training forward's loss
   against a double-precision reference of the head written out here from the
   definitions (W_fc, RMSNorm, RoPE rotate-half, causal GQA attention, SwiGLU, the final
   norm, E_K; smooth-L1 and cross-entropy, positions before `from` context only, targets
   outside the draft vocabulary without CE); every trainable tensor's hand-written
   gradient against central differences of that reference (and deliberately wrong
   gradients fail the check: it can fail); the cache changes nothing; a few hundred
   Adam steps lower the training loss and raise held-out top-1 and lower its CE; the
   training forward equals the decoding head's (eagle_params_save, eagle_load, the
   layer through forward_layers with given inputs).
   test_eagle_train FILE...: eagle_load each file against $MODEL (the tool test's check). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "fixture.h"
#include "stories.h"
#include "model/forward.h"
#include "model/linear.h"
#include "train/distill.h" /* SeqOrder, distill_lr */
#include "train/eagle_train.h"

static Model M;
static uint64_t rng = 7;

static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static double frand(void) { return (next() >> 11) * (1.0 / 9007199254740992.0) * 2 - 1; }

/* ---------------- the head in double, from the definitions ---------------- */

typedef struct {
    int D, F, H, G, hd, K, V, steps;
    double eps, w_reg, w_ce;
    double *w[EAGLE_TENSORS]; /* the trainable tensors, EagleParams' shapes */
    double *g, *E;            /* final norm [D], E_K [K][D] */
    const int32_t *vocab;
} Ref;

static void ref_init(Ref *r, EagleParams *p, const EagleTrain *t) {
    const Config *c = &p->c;
    *r = (Ref){.D = c->dim,
               .F = c->hidden_dim,
               .H = c->n_heads,
               .G = c->n_kv_heads,
               .hd = c->head_dim,
               .K = c->vocab_size,
               .V = M.c.vocab_size,
               .steps = t->steps,
               .eps = c->norm_eps,
               .w_reg = t->w_reg,
               .w_ce = t->w_ce};
    for (int k = 0; k < EAGLE_TENSORS; k++) {
        size_t n = eagle_tensor_size(c, k);
        r->w[k] = malloc(sizeof(double) * n);
        for (size_t i = 0; i < n; i++) r->w[k][i] = eagle_tensor(p, k)[i];
    }
    r->g = malloc(sizeof(double) * r->D);
    r->E = malloc(sizeof(double) * r->K * r->D);
    for (int i = 0; i < r->D; i++) r->g[i] = p->norm[i];
    for (int i = 0; i < r->K * r->D; i++) r->E[i] = p->emb[i];
    r->vocab = p->vocab;
}

static void ref_free(Ref *r) {
    for (int k = 0; k < EAGLE_TENSORS; k++) free(r->w[k]);
    free(r->g);
    free(r->E);
}

/* y[rows] = W[rows][cols] x */
static void mv(double *y, const double *W, const double *x, int rows, int cols) {
    for (int i = 0; i < rows; i++) {
        double s = 0;
        for (int j = 0; j < cols; j++) s += W[(size_t)i * cols + j] * x[j];
        y[i] = s;
    }
}

static void rmsnorm(double *y, const double *x, const double *g, int D, double eps) {
    double ss = 0;
    for (int d = 0; d < D; d++) ss += x[d] * x[d];
    double s = 1 / sqrt(ss / D + eps);
    for (int d = 0; d < D; d++) y[d] = g[d] * x[d] * s;
}

/* Hugging Face's rotate-half at position pos: pairs (j, j + hd/2) of every head */
static void rope(double *v, int heads, int hd, int pos) {
    int half = hd / 2;
    for (int h = 0; h < heads; h++)
        for (int j = 0; j < half; j++) {
            double c = M.rope_cos[(size_t)pos * half + j], s = M.rope_sin[(size_t)pos * half + j];
            double a = v[h * hd + j], b = v[h * hd + j + half];
            v[h * hd + j] = a * c - b * s;
            v[h * hd + j + half] = a * s + b * c;
        }
}

static int draft_id(const Ref *r, int32_t target) {
    for (int k = 0; k < r->K; k++)
        if (r->vocab[k] == target) return k;
    return -1;
}

/* the loss Σ_k 0.8^k Σ_{i + k ≥ from} L^k_i of a sequence tok[T] with features feat[T][D]
   and greedy choices arg[T], the draft unrolled r->steps steps on its own f' (step k's
   row i at position i + k sees step 0's rows 0..i and its chain, steps 1..k of row i);
   kinks: how many feature errors fell on each side of |e| = 1 */
static double ref_loss(const Ref *r, const int32_t *tok, const float *feat, const int32_t *arg, int T, int from,
                       long kinks[2]) {
    int D = r->D, F = r->F, H = r->H, G = r->G, hd = r->hd, Q = H * hd, KV = G * hd, n = T - 1, S = r->steps;
    double *x = calloc((size_t)S * n * D, 8), *q = calloc((size_t)S * n * Q, 8), *k = calloc((size_t)S * n * KV, 8);
    double *v = calloc((size_t)S * n * KV, 8), *fp = calloc((size_t)S * n * D, 8), *u = calloc(2 * D, 8);
    double *a = calloc(D, 8), *att = calloc(Q, 8), *r1 = calloc(D, 8), *y = calloc(D, 8), *g1 = calloc(F, 8);
    double *g3 = calloc(F, 8), *hh = calloc(D, 8), *lg = calloc(r->K, 8), *sc = calloc(n + S, 8);
    float *row = malloc(sizeof(float) * D);
#define AT(arr, width, s, i) ((arr) + ((size_t)(s)*n + (i)) * (width))
    double loss = 0, w = 1;
    float wf = 1;
    for (int st = 0; st < S; st++, wf *= EAGLE_STEP_DECAY) {
        w = wf;
        for (int i = 0; i < n - st; i++) { /* x = W_fc [embed(t_{i+st+1}); f], then q, k, v with RoPE at i + st */
            k_row_to_f32(row, M.embed.w, M.embed.t, tok[i + st + 1], D);
            for (int d = 0; d < D; d++)
                u[d] = row[d], u[D + d] = st ? AT(fp, D, st - 1, i)[d] : feat[(size_t)i * D + d];
            mv(AT(x, D, st, i), r->w[EAGLE_FC], u, D, 2 * D);
            rmsnorm(a, AT(x, D, st, i), r->w[EAGLE_ATTN_NORM], D, r->eps);
            mv(AT(q, Q, st, i), r->w[EAGLE_WQ], a, Q, D);
            mv(AT(k, KV, st, i), r->w[EAGLE_WK], a, KV, D);
            mv(AT(v, KV, st, i), r->w[EAGLE_WV], a, KV, D);
            rope(AT(q, Q, st, i), H, hd, i + st);
            rope(AT(k, KV, st, i), G, hd, i + st);
        }
        for (int i = 0; i < n - st; i++) {
            for (int h = 0; h < H; h++) { /* head h reads kv head h / (H / G); key j: step 0's row j, then the chain */
                int g = h / (H / G);
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= i + st; j++) {
                    const double *kj = j <= i ? AT(k, KV, 0, j) : AT(k, KV, j - i, i);
                    double s = 0;
                    for (int e = 0; e < hd; e++) s += AT(q, Q, st, i)[h * hd + e] * kj[g * hd + e];
                    sc[j] = s / sqrt((double)hd);
                    mx = fmax(mx, sc[j]);
                }
                for (int j = 0; j <= i + st; j++) sum += sc[j] = exp(sc[j] - mx);
                for (int e = 0; e < hd; e++) {
                    double o = 0;
                    for (int j = 0; j <= i + st; j++)
                        o += sc[j] / sum * (j <= i ? AT(v, KV, 0, j) : AT(v, KV, j - i, i))[g * hd + e];
                    att[h * hd + e] = o;
                }
            }
            mv(y, r->w[EAGLE_WO], att, D, Q);
            for (int d = 0; d < D; d++) r1[d] = AT(x, D, st, i)[d] + y[d];
            rmsnorm(a, r1, r->w[EAGLE_FFN_NORM], D, r->eps);
            mv(g1, r->w[EAGLE_W1], a, F, D);
            mv(g3, r->w[EAGLE_W3], a, F, D);
            for (int j = 0; j < F; j++) g1[j] = g1[j] / (1 + exp(-g1[j])) * g3[j];
            mv(y, r->w[EAGLE_W2], g1, D, F);
            for (int d = 0; d < D; d++) hh[d] = r1[d] + y[d];
            double *f = AT(fp, D, st, i);
            rmsnorm(f, hh, r->g, D, r->eps);
            if (i + st < from) continue;
            double reg = 0;
            for (int d = 0; d < D; d++) {
                double e = f[d] - feat[(size_t)(i + st + 1) * D + d];
                reg += fabs(e) < 1 ? 0.5 * e * e : fabs(e) - 0.5;
                if (kinks) kinks[fabs(e) >= 1]++;
            }
            loss += w * r->w_reg * reg / D;
            int yk = draft_id(r, arg[i + st + 1]);
            if (yk < 0) continue;
            mv(lg, r->E, f, r->K, D);
            double mx = -INFINITY, s = 0;
            for (int c = 0; c < r->K; c++) mx = fmax(mx, lg[c]);
            for (int c = 0; c < r->K; c++) s += exp(lg[c] - mx);
            loss += w * r->w_ce * (mx + log(s) - lg[yk]);
        }
    }
#undef AT
    free(x), free(q), free(k), free(v), free(fp), free(u), free(a), free(att), free(r1), free(y), free(g1), free(g3);
    free(hh), free(lg), free(sc), free(row);
    return loss;
}

/* ---------------- fixtures ---------------- */

static const int32_t TOK[12] = {1, 403, 407, 261, 378, 13, 290, 400, 261, 351, 13, 290};
#define T_LEN 12

/* the model's features and greedy choices of tok[n] (a one-sequence set, through the cache) */
static void model_outputs(EagleTrain *t, const int32_t *tok, int n, float *feat, int32_t *arg) {
    int64_t off[2] = {0, n};
    Sequences s = {1, (int32_t *)tok, off, n};
    MedusaCache c;
    CHECK(eagle_cache_build(t, &s, &c, 1, NULL) == 0, "%s", pd_errmsg());
    memcpy(feat, c.x, sizeof(float) * n * M.c.dim);
    memcpy(arg, c.arg, sizeof(int32_t) * n);
    medusa_cache_free(&c);
}

/* a draft vocabulary of K ids holding the sequence's greedy choices but those in
   leave_out (so their positions have no CE), the rest in id order */
static void make_vocab(const int32_t *arg, int n, const int32_t *leave_out, int n_out, int K, int32_t *vocab) {
    int V = M.c.vocab_size, at = 0;
    char *used = calloc(V, 1);
    for (int i = 0; i < n_out; i++) used[leave_out[i]] = 2;
    for (int i = 0; i < n && at < K; i++)
        if (!used[arg[i]]) used[arg[i]] = 1, vocab[at++] = arg[i];
    for (int v = 0; v < V && at < K; v++)
        if (!used[v]) used[v] = 1, vocab[at++] = v;
    free(used);
}

/* random weights around the start's, so that every path carries gradient */
static void randomise(EagleParams *p, double scale) {
    for (int k = 0; k < EAGLE_TENSORS; k++) {
        float *w = eagle_tensor(p, k);
        size_t n = eagle_tensor_size(&p->c, k);
        int norm = k == EAGLE_ATTN_NORM || k == EAGLE_FFN_NORM;
        for (size_t i = 0; i < n; i++) w[i] = norm ? (float)(1 + 0.5 * frand()) : w[i] + (float)(scale * frand());
    }
}

/* the worst relative error of tensor k's analytic gradient grad against central
   differences of the reference over `samples` random entries and its largest one */
static double fd_error(Ref *r, int k, const float *grad, size_t count, const int32_t *tok, const float *feat,
                       const int32_t *arg, int T, int from, int samples) {
    double scale = 0, worst = 0;
    size_t big = 0;
    for (size_t i = 0; i < count; i++)
        if (fabs(grad[i]) > scale) scale = fabs(grad[i]), big = i;
    for (int s = 0; s <= samples; s++) {
        size_t e = s == samples ? big : next() % count;
        double keep = r->w[k][e], h = 1e-5 * fmax(1, fabs(keep));
        r->w[k][e] = keep + h;
        double up = ref_loss(r, tok, feat, arg, T, from, NULL);
        r->w[k][e] = keep - h;
        double down = ref_loss(r, tok, feat, arg, T, from, NULL);
        r->w[k][e] = keep;
        double fd = (up - down) / (2 * h), err = fabs(grad[e] - fd) / fmax(fabs(fd), 1e-2 * scale);
        worst = fmax(worst, err);
    }
    return worst;
}

/* ---------------- gradients ---------------- */

static void test_gradient(int from, float w_reg, float w_ce, int steps) {
    int D = M.c.dim, K = 300;
    EagleParams p;
    EagleTrain t;
    float *feat = malloc(sizeof(float) * T_LEN * D);
    int32_t arg[T_LEN], vocab[512];
    /* the model's outputs first, through a head of any vocabulary */
    for (int v = 0; v < K; v++) vocab[v] = v;
    CHECK(eagle_params_init(&p, &M, vocab, K) == 0, "%s", pd_errmsg());
    CHECK(eagle_train_init(&t, &M, &p, 32, 1, 1e-3f) == 0, "%s", pd_errmsg());
    model_outputs(&t, TOK, T_LEN, feat, arg);
    eagle_train_free(&t);
    eagle_params_free(&p);
    /* two positions' targets outside the draft vocabulary */
    int32_t out[2] = {arg[4], arg[9]};
    make_vocab(arg, T_LEN, out, 2, K, vocab);
    CHECK(eagle_params_init(&p, &M, vocab, K) == 0, "%s", pd_errmsg());
    randomise(&p, 0.3);
    CHECK(eagle_train_init(&t, &M, &p, 32, steps, 1e-3f) == 0, "%s", pd_errmsg());
    t.w_reg = w_reg, t.w_ce = w_ce;
    EagleGrad g;
    eagle_grad_init(&g, &p.c);
    EagleSums s = {0};
    CHECK(eagle_seq_loss(&t, TOK, feat, arg, T_LEN, from, &s, &g) == 0, "%s", pd_errmsg());
    /* gradients add up: a second call doubles them */
    EagleGrad g2;
    eagle_grad_init(&g2, &p.c);
    eagle_seq_loss(&t, TOK, feat, arg, T_LEN, from, NULL, &g2);
    eagle_seq_loss(&t, TOK, feat, arg, T_LEN, from, NULL, &g2);
    for (int k = 0; k < EAGLE_TENSORS; k++) {
        double off = 0, big = 0;
        for (size_t i = 0; i < g.n[k]; i++)
            off = fmax(off, fabs(g2.t[k][i] - 2 * g.t[k][i])), big = fmax(big, fabs(g.t[k][i]));
        CHECK(off <= 1e-5 * big && big > 0, "d%s: two calls' gradients are not twice one's (%.3g off, of %.3g)",
              eagle_tensor_name[k], off, big);
    }

    Ref r;
    ref_init(&r, &p, &t);
    long kinks[2] = {0, 0};
    double want = ref_loss(&r, TOK, feat, arg, T_LEN, from, kinks);
    int n_out = 0;
    for (int i = from; i < T_LEN - 1; i++) n_out += draft_id(&r, arg[i + 1]) < 0;
    CHECK(fabs(s.loss - want) < 1e-4 * want, "loss %.6f, reference %.6f", s.loss, want);
    for (int k = 0; k < steps; k++)
        CHECK(s.positions_at[k] == T_LEN - 1 - (k > from ? k : from), "step %d: %lld positions", k,
              (long long)s.positions_at[k]);
    CHECK(s.labelled == s.positions_at[0] - n_out && n_out > 0, "labelled %lld of %lld, %d out of the vocabulary",
          (long long)s.labelled, (long long)s.positions_at[0], n_out);
    CHECK(kinks[0] > 0 && kinks[1] > 0, "smooth L1 on one side only: %ld below 1, %ld above", kinks[0], kinks[1]);
    double worst = 0;
    for (int k = 0; k < EAGLE_TENSORS; k++) {
        double e = fd_error(&r, k, g.t[k], g.n[k], TOK, feat, arg, T_LEN, from, 8);
        CHECK(e < 2e-3, "from %d, %d steps: d%s off central differences by %.2e (relative)", from, steps,
              eagle_tensor_name[k], e);
        printf("  d%-9s %.1e", eagle_tensor_name[k], e);
        if (k % 5 == 4) printf("\n");
        worst = fmax(worst, e);
    }
    printf("gradient (from %d, w_reg %g, w_ce %g, %d steps): loss %.6f (reference %.6f), %lld positions, %d without "
           "CE; worst %.1e relative off central differences\n",
           from, w_reg, w_ce, steps, s.loss, want, (long long)s.positions_at[0], n_out, worst);
    /* the check can fail: fc's gradient with its halves [embed | f] swapped, wq's with each
       head's rotation pairs (j, j + hd/2) swapped */
    if (from == 0 && steps == 1) {
        float *sw = malloc(sizeof(float) * g.n[EAGLE_FC]);
        for (int i = 0; i < D; i++)
            for (int j = 0; j < 2 * D; j++)
                sw[(size_t)i * 2 * D + j] = g.t[EAGLE_FC][(size_t)i * 2 * D + (j + D) % (2 * D)];
        double e = fd_error(&r, EAGLE_FC, sw, g.n[EAGLE_FC], TOK, feat, arg, T_LEN, from, 8);
        CHECK(e > 0.1, "a wrong fc gradient passes (%.2e)", e);
        free(sw);
        int hd = M.c.head_dim, Q = M.c.n_heads * hd;
        sw = malloc(sizeof(float) * g.n[EAGLE_WQ]);
        for (int row = 0; row < Q; row++)
            memcpy(sw + (size_t)row * D, g.t[EAGLE_WQ] + (size_t)(row / hd * hd + (row % hd + hd / 2) % hd) * D,
                   sizeof(float) * D);
        e = fd_error(&r, EAGLE_WQ, sw, g.n[EAGLE_WQ], TOK, feat, arg, T_LEN, from, 8);
        CHECK(e > 0.1, "a wrong wq gradient passes (%.2e)", e);
        free(sw);
    }
    /* refusals */
    CHECK(eagle_seq_loss(&t, TOK, feat, arg, 1, 0, &s, &g) == -1, "a one-token sequence accepted");
    CHECK(eagle_seq_loss(&t, TOK, feat, arg, 33, 0, &s, &g) == -1, "a sequence past the scratch accepted");
    ref_free(&r);
    eagle_grad_free(&g);
    eagle_grad_free(&g2);
    eagle_train_free(&t);
    eagle_params_free(&p);
    free(feat);
}

/* ---------------- training ---------------- */

static void test_training(void) {
    TextSet ts;
    Sequences tr, ho;
    if (story_text(&ts, "training (test_training)")) return;
    CHECK(dataset_sequences(&ts, M.tok, 64, 0.1, 0, &tr, &ho, "tinystories") == 0, "%s", pd_errmsg());
    int K = 256, steps = 300, B = 8;
    int32_t vocab[512];
    CHECK(eagle_vocab_from_counts(&M, tr.tok, seqs_tokens(&tr), K, vocab) == 0, "%s", pd_errmsg());
    EagleParams p, q, p3;
    EagleTrain t, u, t3; /* t3: the training-time test, 3 steps */
    MedusaCache ct, ch;
    SeqOrder o;
    float lr = 1.0f / M.c.dim; /* the tool's default */
    CHECK(eagle_params_init(&p, &M, vocab, K) == 0 && eagle_params_init(&q, &M, vocab, K) == 0 &&
              eagle_params_init(&p3, &M, vocab, K) == 0,
          "%s", pd_errmsg());
    CHECK(eagle_train_init(&t, &M, &p, 64, 1, lr) == 0 && eagle_train_init(&u, &M, &q, 64, 1, lr) == 0 &&
              eagle_train_init(&t3, &M, &p3, 64, 3, lr) == 0,
          "%s", pd_errmsg());
    CHECK(eagle_cache_build(&t, &tr, &ct, 0, NULL) == 0 && eagle_cache_build(&t, &ho, &ch, 1, NULL) == 0, "%s",
          pd_errmsg());
    EagleStats before, after, nocache;
    CHECK(eagle_train_eval(&t, &ho, &ch, &before) == 0 && eagle_train_eval(&t, &ho, NULL, &nocache) == 0, "%s",
          pd_errmsg());
    CHECK(!memcmp(&before, &nocache, sizeof before), "the cache changes the evaluation");
    order_init(&o, tr.n, 1);
    int idx[8];
    double first = 0, last = 0;
    int64_t positions = 0;
    double t0 = pd_now();
    for (int s = 0; s < steps; s++) {
        order_next(&o, idx, B);
        t.lr = distill_lr(lr, s, steps);
        EagleSums sum;
        CHECK(eagle_train_step(&t, &tr, &ct, idx, B, &sum) == 0, "%s", pd_errmsg());
        t3.lr = t.lr;
        CHECK(eagle_train_step(&t3, &tr, &ct, idx, B, NULL) == 0, "%s", pd_errmsg());
        positions += sum.positions_at[0];
        if (s < 20) first += sum.loss / sum.positions_at[0] / 20;
        if (s >= steps - 20) last += sum.loss / sum.positions_at[0] / 20;
        if (s < 2) { /* without the cache: the very same head */
            u.lr = t.lr;
            eagle_train_step(&u, &tr, NULL, idx, B, NULL);
            int same = 1;
            for (int k = 0; k < EAGLE_TENSORS; k++)
                same &= !memcmp(eagle_tensor(&p, k), eagle_tensor(&q, k), sizeof(float) * eagle_tensor_size(&p.c, k));
            CHECK(same, "step %d: the cache changes the head", s);
        }
    }
    double dt = pd_now() - t0;
    CHECK(eagle_train_eval(&t, &ho, &ch, &after) == 0, "%s", pd_errmsg());
    printf("training: %d steps, %.0f positions/s (with the three-step head's steps); loss %.4f -> %.4f; %lld held-out "
           "positions (%.1f%% in the draft "
           "vocabulary): CE %.4f -> %.4f, reg %.4f -> %.4f, top-1 %.4f -> %.4f\n",
           steps, positions / dt, first, last, (long long)after.positions, 100 * after.coverage, before.ce, after.ce,
           before.reg, after.reg, before.top1, after.top1);
    CHECK(last < 0.8 * first, "training loss %.4f -> %.4f", first, last);
    CHECK(after.top1 > before.top1 + 0.05, "held-out top-1 %.4f -> %.4f", before.top1, after.top1);
    CHECK(after.ce < before.ce && after.reg < before.reg, "held-out CE %.4f -> %.4f, reg %.4f -> %.4f", before.ce,
          after.ce, before.reg, after.reg);
    CHECK(t.t == steps, "adam steps %d", t.t);
    /* the training-time test: the draft fed its own f' guesses deeper tokens better */
    EagleStats deep;
    CHECK(eagle_train_eval(&t3, &ho, &ch, &deep) == 0 && deep.depth == 3 && after.depth == 3, "%s", pd_errmsg());
    printf("held-out top-1 at depths 1 / 2 / 3: one step trained %.4f / %.4f / %.4f, three steps %.4f / %.4f / %.4f\n",
           after.top1_at[0], after.top1_at[1], after.top1_at[2], deep.top1_at[0], deep.top1_at[1], deep.top1_at[2]);
    CHECK(deep.top1_at[1] > after.top1_at[1] + 0.05 && deep.top1_at[2] > after.top1_at[2] + 0.05,
          "three steps trained: depth 2 %.4f (one step %.4f), depth 3 %.4f (%.4f)", deep.top1_at[1], after.top1_at[1],
          deep.top1_at[2], after.top1_at[2]);
    int bad = tr.n;
    CHECK(eagle_train_step(&t, &tr, &ct, &bad, 1, NULL) == -1, "sequence %d of %d accepted", bad, tr.n);
    order_free(&o);
    medusa_cache_free(&ct);
    medusa_cache_free(&ch);
    eagle_train_free(&t);
    eagle_train_free(&u);
    eagle_train_free(&t3);
    eagle_params_free(&p);
    eagle_params_free(&q);
    eagle_params_free(&p3);
    seqs_free(&tr);
    seqs_free(&ho);
    dataset_free(&ts);
}

/* ---------------- the decoding head's forward ---------------- */

/* the worst |a - b| over the largest |b| */
static double rel_off(const float *a, const float *b, size_t n) {
    double off = 0, big = 0;
    for (size_t i = 0; i < n; i++) off = fmax(off, fabs(a[i] - b[i])), big = fmax(big, fabs(b[i]));
    return off / fmax(big, 1e-30);
}

/* the head saved, loaded by eagle_load and run as decoding runs it (W_fc by eagle_input,
   the layer through forward_layers on given inputs, its final norm and tied E_K) gives
   the training forward's f' and logits; and unrolled: a chain of drafts after the true
   entries 0..i, each node fed its parent's f' at the next position (as a draft tree's
   path), gives the training-time test's steps 1 and 2 at row i */
#define CHAIN 3
static void test_decode_forward(double scale) {
    int D = M.c.dim, K = 300, n = T_LEN - 1;
    EagleParams p;
    EagleTrain t;
    EagleHead h;
    float *feat = malloc(sizeof(float) * T_LEN * D), *fp = malloc(sizeof(float) * CHAIN * n * D);
    float *lg = malloc(sizeof(float) * CHAIN * n * K), *u = malloc(sizeof(float) * n * 2 * D);
    float *x = malloc(sizeof(float) * n * D), *fp2 = malloc(sizeof(float) * n * D),
          *lg2 = malloc(sizeof(float) * n * K);
    int32_t arg[T_LEN], vocab[512], pos[T_LEN];
    for (int v = 0; v < K; v++) vocab[v] = (v * 7 + 3) % M.c.vocab_size; /* not in id order */
    for (int i = 0; i < T_LEN; i++) pos[i] = i;
    CHECK(eagle_params_init(&p, &M, vocab, K) == 0, "%s", pd_errmsg());
    randomise(&p, scale);
    CHECK(eagle_train_init(&t, &M, &p, 32, 1, 1e-3f) == 0, "%s", pd_errmsg());
    model_outputs(&t, TOK, T_LEN, feat, arg);
    CHECK(eagle_seq_forward(&t, TOK + 1, feat, n, CHAIN, fp, lg) == 0, "%s", pd_errmsg());
    char dir[] = "/tmp/test_eagle_train.XXXXXX", path[64];
    if (!mkdtemp(dir)) return;
    snprintf(path, sizeof path, "%s/head.safetensors", dir);
    const char *meta[2] = {"paradec.eagle.steps", "0"};
    CHECK(eagle_params_save(&p, path, meta, 1) == 0, "%s", pd_errmsg());
    if (eagle_load(&h, path, &M)) {
        CHECK(0, "eagle_load: %s", pd_errmsg());
    } else {
        eagle_input(&h, &M, TOK + 1, feat, n, u, x);
        Runner *r = runner_new(&h.layer);
        KVCache kv;
        CHECK(r && kv_init(&kv, &h.layer.c, 1, 32, 16) == 0 && kv_seq_new(&kv) >= 0, "%s", pd_errmsg());
        r->given = 1;
        Batch b = {n, NULL, NULL, pos, NULL, NULL};
        CHECK(forward_layers(r, &kv, &b, 0, 1, x) == 0, "%s", pd_errmsg());
        model_final_norm(&h.layer, fp2, x, n);
        CHECK(final_logits(r, x, n, lg2) == 0, "%s", pd_errmsg());
        double ef = rel_off(fp, fp2, (size_t)n * D), el = rel_off(lg, lg2, (size_t)n * K);
        /* the chains, from the last row down: truncating to i + 1 keeps the true entries 0..i */
        double cf = 0, cl = 0;
        for (int i = n - CHAIN; i >= 0; i--) {
            float *prev = fp2, *out = fp2 + D, *lrow = lg2; /* free scratch by now */
            memcpy(prev, fp + (size_t)i * D, sizeof(float) * D);
            for (int k = 1; k < CHAIN; k++) {
                CHECK(kv_truncate(&kv, 0, i + k) == 0, "%s", pd_errmsg());
                int32_t p1 = i + k;
                Batch one = {1, NULL, NULL, &p1, NULL, NULL};
                eagle_input(&h, &M, TOK + 1 + i + k, prev, 1, u, x);
                CHECK(forward_layers(r, &kv, &one, 0, 1, x) == 0, "%s", pd_errmsg());
                model_final_norm(&h.layer, out, x, 1);
                CHECK(final_logits(r, x, 1, lrow) == 0, "%s", pd_errmsg());
                cf = fmax(cf, rel_off(fp + ((size_t)k * n + i) * D, out, D));
                cl = fmax(cl, rel_off(lg + ((size_t)k * n + i) * K, lrow, K));
                memcpy(prev, out, sizeof(float) * D);
            }
        }
        printf("decoding's forward (weights %g off the start's, norms random): f' %.1e, logits %.1e relative off "
               "training's; chains of %d: f' %.1e, logits %.1e\n",
               scale, ef, el, CHAIN, cf, cl);
        CHECK(ef < 1e-4 && el < 1e-4, "f' %.2e, logits %.2e relative off", ef, el);
        CHECK(cf < 1e-4 && cl < 1e-4, "chains: f' %.2e, logits %.2e relative off", cf, cl);
        kv_free(&kv);
        runner_free(r);
        eagle_free(&h);
    }
    unlink(path);
    rmdir(dir);
    eagle_train_free(&t);
    eagle_params_free(&p);
    free(feat), free(fp), free(lg), free(u), free(x), free(fp2), free(lg2);
}

static void test_refusals(void) {
    EagleParams p;
    EagleTrain t;
    int32_t vocab[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    eagle_params_init(&p, &M, vocab, 8);
    CHECK(eagle_train_init(&t, &M, &p, M.c.seq_len + 1, 1, 1e-3f) == -1, "a scratch past the context accepted");
    CHECK(eagle_train_init(&t, &M, &p, 1, 1, 1e-3f) == -1, "a scratch of one token accepted");
    p.vocab[3] = 1;
    CHECK(eagle_train_init(&t, &M, &p, 16, 1, 1e-3f) == -1, "a vocabulary with a token twice accepted");
    p.vocab[3] = M.c.vocab_size;
    CHECK(eagle_train_init(&t, &M, &p, 16, 1, 1e-3f) == -1, "a vocabulary with a non-token accepted");
    p.vocab[3] = 3;
    p.c.dim++;
    CHECK(eagle_train_init(&t, &M, &p, 16, 1, 1e-3f) == -1, "a head of another width accepted");
    p.c.dim--;
    eagle_params_free(&p);
}

/* eagle_load each file against M: one line each, non-zero when any is refused */
static int check_files(int n, char **files) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        EagleHead h;
        if (eagle_load(&h, files[i], &M)) {
            fprintf(stderr, "%s\n", pd_errmsg());
            bad = 1;
            continue;
        }
        printf("%s: an EAGLE head, draft vocabulary %d, acc %.4f\n", files[i], h.K, h.acc);
        eagle_free(&h);
    }
    model_free(&M);
    return bad;
}

int main(int argc, char **argv) {
    if (test_model_load(&M)) return check_done("eagle_train");
    k_init(1);
    if (argc > 1) return check_files(argc - 1, argv + 1);
    test_gradient(0, 1.0f, 1.0f, 1);
    test_gradient(4, 0.5f, 2.0f, 1);
    test_gradient(0, 1.0f, 1.0f, 3); /* the training-time test: gradients through the fed-back f' */
    test_gradient(4, 0.5f, 2.0f, 4);
    test_training();
    test_decode_forward(0);
    test_decode_forward(0.05);
    test_refusals();
    model_free(&M);
    return check_done("eagle_train");
}
