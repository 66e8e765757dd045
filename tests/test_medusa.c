/* test_medusa — Medusa heads on stories260K: medusa_logits against a double-precision
   reference written out here (ResBlock, input_scale, own or shared LM head), batch
   invariance, untrained heads = the model's own logits; the hand-written gradients of
   W, b and an own lm_head against central finite differences of that reference (and a
   transposed gradient fails the check: it can fail); the training step's targets
   against ones recomputed here through medusa_logits (self: the model's argmax one
   position on; data: the text's token); the feature cache changes nothing; a short
   training run raises held-out head-0 top-1; greedy generation equals one-token-at-a-
   time decoding, for any group size; save/load bit for bit with metadata, and every
   kind of bad heads file refused with one line, mutated files never crashing the
   loader; widen_medusa's heads on the widened model give the small heads' logits and
   candidates.
   test_medusa FILE...: medusa_load each file against $MODEL (the tool test's check). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "fixture.h"
#include "stories.h"
#include "model/forward.h"
#include "train/distill.h" /* SeqOrder, distill_lr */
#include "train/medusa_train.h"
#include "train/widen.h"

static Model M;
static Runner *R; /* M's forward workspace */
static char dir[64];
static uint64_t rng = 11;

static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static double frand(void) { return (next() >> 11) * (1.0 / 9007199254740992.0) * 2 - 1; }

static const char *tmp(const char *name) {
    static char p[8][256];
    static int i;
    char *s = p[i++ % 8];
    snprintf(s, 256, "%s/%s", dir, name);
    return s;
}

/* the last hidden states (before the final norm) of a token sequence */
static void hidden_states(Model *m, const int32_t *tok, int n, float *h) {
    KVCache kv;
    int32_t *pos = malloc(sizeof(int32_t) * n);
    for (int i = 0; i < n; i++) pos[i] = i;
    kv_init(&kv, &m->c, 1, n, 16);
    kv_seq_new(&kv);
    Batch b = {n, tok, NULL, pos, NULL, NULL};
    Runner *r = runner_new(m);
    if (r) forward_layers(r, &kv, &b, 0, m->c.n_layers, h);
    runner_free(r);
    kv_free(&kv);
    free(pos);
}

/* ---------------- the head in double, from the definitions ---------------- */

typedef struct {
    int n, D, V;
    double s;
    double *x;         /* [n][D] norm(h) */
    double *W, *b, *E; /* [D][D], [D], [V][D] */
} Ref;

static void ref_init(Ref *r, const MedusaHeads *h, int k, const float *hidden, int n) {
    int D = M.c.dim, V = M.c.vocab_size;
    *r = (Ref){n,
               D,
               V,
               h->input_scale,
               calloc((size_t)n * D, 8),
               calloc((size_t)D * D, 8),
               calloc(D, 8),
               calloc((size_t)V * D, 8)};
    for (int t = 0; t < n; t++) {
        const float *ht = hidden + (size_t)t * D;
        double ss = 0;
        for (int i = 0; i < D; i++) ss += (double)ht[i] * ht[i];
        double q = 1 / sqrt(ss / D + M.c.norm_eps);
        for (int i = 0; i < D; i++) r->x[(size_t)t * D + i] = M.final_norm[i] * ht[i] * q;
    }
    for (int i = 0; i < D * D; i++) r->W[i] = h->W[k][i];
    for (int i = 0; i < D; i++) r->b[i] = h->b[k][i];
    float row[1024];
    for (int v = 0; v < V; v++) {
        if (h->lm[k]) memcpy(row, h->lm[k] + (size_t)v * D, sizeof(float) * D);
        else k_row_to_f32(row, M.lm_head.w, M.lm_head.t, v, D);
        for (int i = 0; i < D; i++) r->E[(size_t)v * D + i] = row[i];
    }
}

static void ref_free(Ref *r) {
    free(r->x);
    free(r->W);
    free(r->b);
    free(r->E);
}

/* logits [V] of position t */
static void ref_logits(const Ref *r, int t, double *out) {
    int D = r->D;
    double *u = calloc(D, 8), *res = calloc(D, 8);
    for (int i = 0; i < D; i++) u[i] = r->s * r->x[(size_t)t * D + i];
    for (int i = 0; i < D; i++) {
        double z = r->b[i];
        for (int j = 0; j < D; j++) z += r->W[(size_t)i * D + j] * u[j];
        res[i] = (u[i] + z / (1 + exp(-z))) / r->s;
    }
    for (int v = 0; v < r->V; v++) {
        out[v] = 0;
        for (int i = 0; i < D; i++) out[v] += r->E[(size_t)v * D + i] * res[i];
    }
    free(u);
    free(res);
}

/* Σ_t CE(logits_t, y_t) */
static double ref_loss(const Ref *r, const int32_t *y) {
    double *l = calloc(r->V, 8), loss = 0;
    for (int t = 0; t < r->n; t++) {
        ref_logits(r, t, l);
        double mx = l[0], s = 0;
        for (int v = 1; v < r->V; v++) mx = l[v] > mx ? l[v] : mx;
        for (int v = 0; v < r->V; v++) s += exp(l[v] - mx);
        loss += mx + log(s) - l[y[t]];
    }
    free(l);
    return loss;
}

static const int32_t TOK[8] = {1, 403, 407, 261, 378, 13, 290, 400};

/* random heads, away from zero so every parameter matters */
static void randomise(MedusaHeads *h, double scale) {
    int D = h->dim, V = h->vocab;
    float *W = malloc(sizeof(float) * D * D), *b = malloc(sizeof(float) * D);
    float *lm = malloc(sizeof(float) * V * D);
    for (int k = 0; k < h->n; k++) {
        for (int i = 0; i < D * D; i++) W[i] = (float)(scale * frand() / sqrt(D));
        for (int i = 0; i < D; i++) b[i] = (float)(0.3 * frand());
        if (h->lm[k])
            for (int i = 0; i < V * D; i++) lm[i] = h->lm[k][i] + (float)(0.1 * frand());
        medusa_set(h, k, W, b, h->lm[k] ? lm : NULL);
    }
    free(W);
    free(b);
    free(lm);
}

static void test_logits(int own, float scale) {
    int D = M.c.dim, V = M.c.vocab_size, n = 8;
    float *h = malloc(sizeof(float) * n * D), *got = malloc(sizeof(float) * n * V),
          *fin = malloc(sizeof(float) * n * V);
    hidden_states(&M, TOK, n, h);
    MedusaHeads mh;
    CHECK(medusa_init(&mh, &M, 3, own) == 0, "%s", pd_errmsg());
    CHECK(mh.n == 3 && mh.dim == D && mh.vocab == V && mh.input_scale == 1 && !strcmp(mh.model_digest, M.digest) &&
              !mh.has_acc && (mh.lm[2] != NULL) == own,
          "fields");
    /* untrained (W = 0, b = 0): the model's own logits, to the bit */
    final_logits(R, h, n, fin);
    CHECK(medusa_logits(&M, &mh, 2, h, n, got) == 0, "%s", pd_errmsg());
    CHECK(!memcmp(got, fin, sizeof(float) * n * V), "own=%d: untrained head differs from final_logits", own);
    randomise(&mh, 2.0);
    mh.input_scale = scale;
    CHECK(medusa_logits(&M, &mh, 1, h, n, got) == 0, "%s", pd_errmsg());
    Ref r;
    ref_init(&r, &mh, 1, h, n);
    double worst = 0, *l = calloc(V, 8);
    for (int t = 0; t < n; t++) {
        ref_logits(&r, t, l);
        for (int v = 0; v < V; v++) worst = fmax(worst, fabs(l[v] - got[(size_t)t * V + v]) / (1 + fabs(l[v])));
    }
    CHECK(worst < 1e-5, "own=%d scale %g: logits off the double reference by %g", own, scale, worst);
    /* batch invariance: a row alone, and inside a batch past the stack buffer */
    float *one = malloc(sizeof(float) * V);
    medusa_logits(&M, &mh, 1, h + 5 * D, 1, one);
    CHECK(!memcmp(one, got + 5 * V, sizeof(float) * V), "own=%d: a row depends on the batch", own);
    int big = 300;
    float *hb = malloc(sizeof(float) * big * D), *lb = malloc(sizeof(float) * big * V);
    for (int t = 0; t < big; t++) memcpy(hb + (size_t)t * D, h + (size_t)(t % n) * D, sizeof(float) * D);
    CHECK(medusa_logits(&M, &mh, 1, hb, big, lb) == 0, "%s", pd_errmsg());
    int same = 1;
    for (int t = 0; t < big; t++) same &= !memcmp(lb + (size_t)t * V, got + (size_t)(t % n) * V, sizeof(float) * V);
    CHECK(same, "own=%d: a row of a %d-row batch differs", own, big);
    CHECK(medusa_logits(&M, &mh, 3, h, n, got) == -1, "head 3 of 3 accepted");
    CHECK(medusa_logits(&M, &mh, -1, h, n, got) == -1, "head -1 accepted");
    /* drafting in 8 bits (the ResBlock, and the own LM head): near the reference, and
       the top token the reference's best or within twice the error of it (a near tie) */
    medusa_use_int8(&mh);
    CHECK(mh.q8, "own=%d: not read in 8 bits", own);
    CHECK(medusa_logits(&M, &mh, 1, h, n, got) == 0, "%s", pd_errmsg());
    double off = 0, top = 0, *lt = malloc(sizeof(double) * n * V);
    for (int t = 0; t < n; t++) {
        ref_logits(&r, t, lt + (size_t)t * V);
        for (int v = 0; v < V; v++) {
            off = fmax(off, fabs(lt[(size_t)t * V + v] - got[(size_t)t * V + v]));
            top = fmax(top, fabs(lt[(size_t)t * V + v]));
        }
    }
    int agree = 0, close = 0;
    for (int t = 0; t < n; t++) {
        const double *lr = lt + (size_t)t * V;
        int best = 0, pick = k_argmax(got + (size_t)t * V, V);
        for (int v = 0; v < V; v++) best = lr[v] > lr[best] ? v : best;
        agree += pick == best;
        close += lr[best] - lr[pick] <= 2 * off;
    }
    free(lt);
    printf("  own=%d: 8-bit logits off by %.3g of %.3g; argmax the reference's in %d of %d, a near tie in the rest\n",
           own, off, top, agree, n);
    CHECK(off < 0.02 * top && close == n && agree >= n / 2,
          "own=%d: 8-bit logits off by %g of %g, argmax right in %d of %d, within the error in %d", own, off, top,
          agree, n, close);
    medusa_logits(&M, &mh, 1, h + 5 * D, 1, one);
    CHECK(!memcmp(one, got + 5 * V, sizeof(float) * V), "own=%d: an 8-bit row depends on the batch", own);
    ref_free(&r);
    medusa_free(&mh);
    free(h);
    free(got);
    free(fin);
    free(one);
    free(hb);
    free(lb);
    free(l);
}

/* ---------------- gradients ---------------- */

enum { P_W, P_B, P_E };

/* the worst relative error of an analytic gradient against central differences of the
   double reference over `samples` entries of one parameter; transpose: read the
   gradient of W[j][i] for W[i][j] (a wrong gradient the check must catch) */
static double fd_error(Ref *r, const int32_t *y, int which, const float *grad, int samples, int transpose) {
    int D = r->D;
    size_t count = which == P_W ? (size_t)D * D : which == P_B ? (size_t)D : (size_t)r->V * D;
    double *p = which == P_W ? r->W : which == P_B ? r->b : r->E, scale = 0, worst = 0, eps = 1e-4;
    for (size_t i = 0; i < count; i++) scale = fmax(scale, fabs(grad[i]));
    for (int s = 0; s < samples; s++) {
        size_t e = next() % count;
        if (which == P_E && s % 2 == 0) e = (size_t)y[s % r->n] * D + next() % D; /* a target's row: the big ones */
        double keep = p[e];
        p[e] = keep + eps;
        double up = ref_loss(r, y);
        p[e] = keep - eps;
        double down = ref_loss(r, y);
        p[e] = keep;
        size_t at = e;
        if (transpose && which == P_W) at = (e % D) * D + e / D;
        double fd = (up - down) / (2 * eps), err = fabs(grad[at] - fd) / fmax(fabs(fd), 1e-2 * scale);
        worst = fmax(worst, err);
    }
    return worst;
}

static void test_gradient(int own) {
    int D = M.c.dim, V = M.c.vocab_size, n = 6;
    float *h = malloc(sizeof(float) * 8 * D);
    hidden_states(&M, TOK, 8, h);
    int32_t y[6] = {407, 261, 378, 13, 290, 400};
    MedusaHeads mh;
    MedusaTrain t;
    medusa_init(&mh, &M, 2, own);
    randomise(&mh, 2.0);
    CHECK(medusa_train_init(&t, &M, &mh, 16, 1e-3f, 1e-4f, NULL, MEDUSA_TARGETS_SELF) == 0, "%s", pd_errmsg());
    float *gW = calloc((size_t)D * D, 4), *gb = calloc(D, 4), *gE = own ? calloc((size_t)V * D, 4) : NULL;
    double loss;
    CHECK(medusa_head_loss(&t, 1, h, y, n, &loss, gW, gb, gE) == 0, "%s", pd_errmsg());
    Ref r;
    ref_init(&r, &mh, 1, h, n);
    double want = ref_loss(&r, y);
    CHECK(fabs(loss - want) < 1e-5 * fabs(want) + 1e-5, "own=%d: loss %.7f, double reference %.7f", own, loss, want);
    double eW = fd_error(&r, y, P_W, gW, 30, 0), eb = fd_error(&r, y, P_B, gb, 20, 0);
    CHECK(eW < 2e-3, "own=%d: dW off central differences by %.2e (relative)", own, eW);
    CHECK(eb < 2e-3, "own=%d: db off central differences by %.2e (relative)", own, eb);
    if (own) {
        double eE = fd_error(&r, y, P_E, gE, 30, 0);
        CHECK(eE < 2e-3, "dE off central differences by %.2e (relative)", eE);
    }
    double tW = fd_error(&r, y, P_W, gW, 30, 1);
    CHECK(tW > 1e-2, "own=%d: the transposed dW passed (error %.2e)", own, tW);
    printf("gradient, own lm_head %d: loss %.6f (reference %.6f), dW %.1e, db %.1e relative off central differences\n",
           own, loss, want, eW, eb);
    /* gradients add to what the buffers held */
    float *g2 = malloc(sizeof(float) * D * D);
    memcpy(g2, gW, sizeof(float) * D * D);
    medusa_head_loss(&t, 1, h, y, n, &loss, g2, NULL, NULL);
    int twice = 1;
    for (int i = 0; i < D * D; i++) twice &= fabsf(g2[i] - 2 * gW[i]) <= 1e-6f * (1 + fabsf(gW[i]));
    CHECK(twice, "dW is not accumulated");
    CHECK(medusa_head_loss(&t, 2, h, y, n, &loss, NULL, NULL, NULL) == -1, "head 2 of 2 accepted");
    CHECK(medusa_head_loss(&t, 0, h, y, 17, &loss, NULL, NULL, NULL) == -1, "17 positions in a scratch of 16");
    int32_t bad[1] = {V};
    CHECK(medusa_head_loss(&t, 0, h, bad, 1, &loss, NULL, NULL, NULL) == -1, "target = vocab accepted");
    if (!own) CHECK(medusa_head_loss(&t, 0, h, y, n, &loss, NULL, NULL, gW) == -1, "dE of a shared lm_head");
    ref_free(&r);
    medusa_train_free(&t);
    medusa_free(&mh);
    free(h);
    free(gW);
    free(gb);
    free(gE);
    free(g2);
}

/* ---------------- training ---------------- */

static const char *STORY =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.\n"
    "One day, she saw a big, red ball. She wanted to play with it, but it was too high.\n\n"
    "Tom had a dog named Max. Max liked to run and jump. One day Max ran into the woods.\n\n"
    "The sun was hot. The cat sat under the tree and slept all day long.\n\n"
    "Ben and Sue went to the beach. They made a big sand castle and swam in the sea.\n";

/* head k's mean CE over s, recomputed through medusa_logits: targets self (the
   model's argmax at t+k+1) or data (the token at t+k+2) */
static double mean_ce(MedusaHeads *mh, const Sequences *s, int k, MedusaTargets which) {
    int D = M.c.dim, V = M.c.vocab_size;
    double sum = 0;
    int64_t count = 0;
    for (int i = 0; i < s->n; i++) {
        int n = seq_len_of(s, i);
        const int32_t *tok = s->tok + s->off[i];
        float *h = malloc(sizeof(float) * n * D), *l = malloc(sizeof(float) * n * V),
              *f = malloc(sizeof(float) * n * V);
        hidden_states(&M, tok, n, h);
        medusa_logits(&M, mh, k, h, n, l);
        final_logits(R, h, n, f);
        for (int t = 0; t < n; t++) {
            int y = which == MEDUSA_TARGETS_SELF ? (t + k + 1 < n ? k_argmax(f + (size_t)(t + k + 1) * V, V) : -1)
                                                 : (t + k + 2 < n ? tok[t + k + 2] : -1);
            if (y < 0) continue;
            const float *row = l + (size_t)t * V;
            double mx = row[0], e = 0;
            for (int v = 1; v < V; v++) mx = fmax(mx, row[v]);
            for (int v = 0; v < V; v++) e += exp(row[v] - mx);
            sum += mx + log(e) - row[y];
            count++;
        }
        free(h);
        free(l);
        free(f);
    }
    return sum / count;
}

static void test_targets(void) {
    TextSet ts;
    Sequences tr, ho;
    dataset_parse(&ts, STORY, strlen(STORY), NULL, "story");
    CHECK(dataset_sequences(&ts, M.tok, 32, 0.2, 0, &tr, &ho, "story") == 0, "%s", pd_errmsg());
    int idx[64];
    for (int i = 0; i < tr.n; i++) idx[i] = i;
    for (int which = 0; which < 2; which++) {
        MedusaHeads mh;
        MedusaTrain t;
        medusa_init(&mh, &M, 3, which);
        randomise(&mh, 1.0);
        double want[3], loss[3];
        for (int k = 0; k < 3; k++) want[k] = mean_ce(&mh, &tr, k, (MedusaTargets)which);
        CHECK(medusa_train_init(&t, &M, &mh, 32, 1e-3f, 1e-4f, NULL, (MedusaTargets)which) == 0, "%s", pd_errmsg());
        /* evaluation's targets are always the model's own (self) */
        MedusaStats st[3];
        CHECK(medusa_train_eval(&t, &tr, NULL, st) == 0, "%s", pd_errmsg());
        double self0 = which ? mean_ce(&mh, &tr, 0, MEDUSA_TARGETS_SELF) : want[0];
        CHECK(fabs(st[0].loss - self0) < 1e-4 * self0, "eval's loss %.6f, recomputed %.6f", st[0].loss, self0);
        int64_t rows = 0;
        for (int i = 0; i < tr.n; i++) rows += seq_len_of(&tr, i) > 3 ? seq_len_of(&tr, i) - 3 : 0;
        CHECK(st[2].positions == rows, "eval positions %lld, want %lld", (long long)st[2].positions, (long long)rows);
        t.eval_from = 5; /* the prompt of a generated text left out */
        MedusaStats late[3];
        medusa_train_eval(&t, &tr, NULL, late);
        rows = 0;
        for (int i = 0; i < tr.n; i++) rows += seq_len_of(&tr, i) > 8 ? seq_len_of(&tr, i) - 8 : 0;
        CHECK(late[2].positions == rows, "eval from 5: positions %lld, want %lld", (long long)late[2].positions,
              (long long)rows);
        t.eval_from = 0;
        double sum = 0;
        for (int r = 0; r < MEDUSA_RANKS; r++) sum += st[1].rank[r];
        CHECK(st[1].top1 == st[1].rank[0] && st[1].top5 >= st[1].top1 && sum <= 1 + 1e-9 && sum >= st[1].top5,
              "eval's ranks: top1 %.4f top5 %.4f sum %.4f", st[1].top1, st[1].top5, sum);
        CHECK(medusa_train_step(&t, &tr, NULL, idx, tr.n, loss) == 0, "%s", pd_errmsg());
        for (int k = 0; k < 3; k++)
            CHECK(fabs(loss[k] - want[k]) < 1e-4 * want[k], "targets %s, head %d: step's loss %.6f, recomputed %.6f",
                  which ? "data" : "self", k, loss[k], want[k]);
        CHECK(t.t == 1, "adam steps %d", t.t);
        medusa_train_free(&t);
        medusa_free(&mh);
    }
    int bad = tr.n;
    MedusaHeads mh;
    MedusaTrain t;
    medusa_init(&mh, &M, 1, 0);
    medusa_train_init(&t, &M, &mh, 32, 1e-3f, 1e-4f, NULL, MEDUSA_TARGETS_SELF);
    CHECK(medusa_train_step(&t, &tr, NULL, &bad, 1, NULL) == -1, "sequence %d of %d accepted", bad, tr.n);
    medusa_train_free(&t);
    CHECK(medusa_train_init(&t, &M, &mh, M.c.seq_len + 1, 1e-3f, 1e-4f, NULL, MEDUSA_TARGETS_SELF) == -1,
          "a scratch past the context accepted");
    medusa_free(&mh);
    seqs_free(&tr);
    seqs_free(&ho);
    dataset_free(&ts);
}

static void test_training(void) {
    TextSet ts;
    Sequences tr, ho;
    if (story_text(&ts, "training (test_training)")) return;
    CHECK(dataset_sequences(&ts, M.tok, 64, 0.1, 0, &tr, &ho, "tinystories") == 0, "%s", pd_errmsg());
    MedusaHeads mh, plain;
    MedusaTrain t, u;
    MedusaCache ct, ch;
    SeqOrder o;
    medusa_init(&mh, &M, 2, 1);
    medusa_init(&plain, &M, 2, 1);
    CHECK(medusa_train_init(&t, &M, &mh, 64, 1.0f / 64, 1.0f / 640, NULL, MEDUSA_TARGETS_SELF) == 0, "%s", pd_errmsg());
    medusa_train_init(&u, &M, &plain, 64, 1.0f / 64, 1.0f / 640, NULL, MEDUSA_TARGETS_SELF);
    /* the training set's outputs computed as drawn, the held-out set's up front */
    CHECK(medusa_cache_build(&t, &tr, &ct, 0, NULL) == 0 && medusa_cache_build(&t, &ho, &ch, 1, NULL) == 0, "%s",
          pd_errmsg());
    MedusaStats before[2], after[2], nocache[2];
    CHECK(medusa_train_eval(&t, &ho, &ch, before) == 0 && medusa_train_eval(&t, &ho, NULL, nocache) == 0, "%s",
          pd_errmsg());
    CHECK(!memcmp(before, nocache, sizeof before), "the cache changes the evaluation");
    order_init(&o, tr.n, 1);
    int idx[8];
    for (int s = 0; s < 150; s++) {
        order_next(&o, idx, 8);
        t.lr = distill_lr(1.0f / 64, s, 150), t.lr_lm = t.lr / 10;
        CHECK(medusa_train_step(&t, &tr, &ct, idx, 8, NULL) == 0, "%s", pd_errmsg());
        if (s < 3) { /* without the cache: the very same heads */
            u.lr = t.lr, u.lr_lm = t.lr_lm;
            medusa_train_step(&u, &tr, NULL, idx, 8, NULL);
            int same = 1;
            for (int k = 0; k < 2; k++)
                same &= !memcmp(mh.W[k], plain.W[k], sizeof(float) * 64 * 64) && !memcmp(mh.b[k], plain.b[k], 64 * 4) &&
                        !memcmp(mh.lm[k], plain.lm[k], sizeof(float) * 64 * M.c.vocab_size);
            CHECK(same, "step %d: the cache changes the heads", s);
        }
        if (s == 2) { /* the training set through its cache, which the steps filled in part:
                         rows computed then and rows computed now both equal the model's */
            int drawn = 0;
            for (int i = 0; i < tr.n; i++) drawn += ct.have[i];
            CHECK(drawn > 0 && drawn <= 3 * 8 && drawn < tr.n, "%d of %d sequences computed in 3 steps of 8", drawn,
                  tr.n);
            MedusaStats viacache[2], direct[2];
            CHECK(medusa_train_eval(&t, &tr, &ct, viacache) == 0 && medusa_train_eval(&t, &tr, NULL, direct) == 0, "%s",
                  pd_errmsg());
            CHECK(!memcmp(viacache, direct, sizeof direct), "a cache filled as drawn changes the evaluation");
        }
    }
    CHECK(medusa_train_eval(&t, &ho, &ch, after) == 0, "%s", pd_errmsg());
    printf(
        "training: %lld held-out positions; head 0 top-1 %.4f -> %.4f, top-5 %.4f -> %.4f; head 1 top-1 %.4f -> %.4f\n",
        (long long)after[0].positions, before[0].top1, after[0].top1, before[0].top5, after[0].top5, before[1].top1,
        after[1].top1);
    CHECK(after[0].top1 > before[0].top1 + 0.03, "head 0 top-1 %.4f -> %.4f", before[0].top1, after[0].top1);
    CHECK(after[0].loss < before[0].loss && after[1].loss < before[1].loss, "held-out CE did not fall");
    order_free(&o);
    medusa_cache_free(&ct);
    medusa_cache_free(&ch);
    medusa_train_free(&t);
    medusa_train_free(&u);
    medusa_free(&mh);
    medusa_free(&plain);
    seqs_free(&tr);
    seqs_free(&ho);
    dataset_free(&ts);
}

/* one sequence, one token at a time: the prefix, then argmax until len or end-of-generation */
static int greedy(const int32_t *prefix, int p, int len, int32_t *out) {
    KVCache kv;
    kv_init(&kv, &M.c, 1, len, 16);
    int s = kv_seq_new(&kv), n = 0, V = M.c.vocab_size;
    float *h = malloc(sizeof(float) * M.c.dim), *l = malloc(sizeof(float) * V);
    for (int i = 0; i < p; i++) out[n++] = prefix[i];
    for (int pos = 0; pos < len - 1; pos++) {
        Batch b = {1, &out[pos], &s, &pos, NULL, NULL};
        forward_layers(R, &kv, &b, 0, M.c.n_layers, h);
        if (pos < n - 1) continue;
        final_logits(R, h, 1, l);
        int32_t next = k_argmax(l, V);
        if (tok_is_eog(M.tok, next)) break;
        out[n++] = next;
    }
    kv_free(&kv);
    free(h);
    free(l);
    return n;
}

static void test_generate(void) {
    TextSet ts;
    Sequences tr, ho, g1, g5;
    if (story_text(&ts, "self-generated targets (test_generate)")) return;
    dataset_sequences(&ts, M.tok, 40, 0.5, 0, &tr, &ho, "tinystories"); /* 40: not whole KV blocks */
    int n = ho.n < 11 ? ho.n : 11;
    ho.n = n; /* the first 11 held-out sequences are enough */
    CHECK(medusa_generate(&M, &ho, 6, 40, 1, &g1, NULL) == 0, "%s", pd_errmsg());
    CHECK(medusa_generate(&M, &ho, 6, 40, 5, &g5, NULL) == 0, "%s", pd_errmsg());
    CHECK(g1.n == n && g5.n == n && seqs_tokens(&g1) == seqs_tokens(&g5) &&
              !memcmp(g1.tok, g5.tok, sizeof(int32_t) * seqs_tokens(&g1)) && !memcmp(g1.off, g5.off, 8 * (n + 1)),
          "generation depends on the group size");
    int ok = 1, ended = 0;
    int32_t want[48];
    for (int i = 0; i < n; i++) {
        int p = seq_len_of(&ho, i) < 6 ? seq_len_of(&ho, i) : 6;
        int m = greedy(ho.tok + ho.off[i], p, 40, want);
        ok &= m == seq_len_of(&g5, i) && !memcmp(want, g5.tok + g5.off[i], sizeof(int32_t) * m);
        ended += m < 40;
    }
    CHECK(ok, "generation differs from one-token-at-a-time greedy decoding");
    CHECK(g5.max_len <= 40, "a generated sequence of %d tokens", g5.max_len);
    printf("generate: %d sequences, %lld tokens, %d ended by the model\n", n, (long long)seqs_tokens(&g5), ended);
    seqs_free(&g1);
    CHECK(medusa_generate(&M, &ho, 40, 40, 4, &g1, NULL) == -1, "a prefix as long as the sequences accepted");
    CHECK(medusa_generate(&M, &ho, 4, M.c.seq_len + 1, 4, &g1, NULL) == -1, "a length past the context accepted");
    seqs_free(&g5);
    seqs_free(&tr);
    seqs_free(&ho);
    dataset_free(&ts);
}

/* ---------------- files ---------------- */

static void set_acc(MedusaHeads *h) {
    for (int k = 0; k < h->n; k++)
        for (int r = 0; r < MEDUSA_RANKS; r++)
            h->rank_acc[k][r] = (float)((0.4 / (1 + k)) / (2 + r) * (1 + 0.1 * frand()));
    h->has_acc = 1;
}

static void test_round_trip(void) {
    int D = M.c.dim, V = M.c.vocab_size;
    for (int own = 0; own < 2; own++) {
        MedusaHeads a, b;
        medusa_init(&a, &M, 3, own);
        randomise(&a, 1.0);
        a.input_scale = 1.7320508f;
        set_acc(&a);
        const char *meta[] = {"paradec.medusa.steps", "12", "paradec.medusa.0.top1", "0.25"};
        const char *path = tmp(own ? "own.safetensors.zst" : "shared.safetensors");
        CHECK(medusa_save(&a, path, meta, 2) == 0, "%s", pd_errmsg());
        CHECK(medusa_load(&b, path, &M) == 0, "%s", pd_errmsg());
        int same = b.n == 3 && b.dim == D && b.vocab == V && b.input_scale == a.input_scale && b.has_acc &&
                   !memcmp(a.rank_acc, b.rank_acc, sizeof a.rank_acc) && !strcmp(a.model_digest, b.model_digest);
        for (int k = 0; same && k < 3; k++) {
            same &= !memcmp(a.W[k], b.W[k], sizeof(float) * D * D) && !memcmp(a.b[k], b.b[k], sizeof(float) * D);
            same &= (b.lm[k] != NULL) == own && (!own || !memcmp(a.lm[k], b.lm[k], sizeof(float) * V * D));
        }
        CHECK(same, "own=%d: the heads changed on the way through the file", own);
        TensorFile tf;
        CHECK(tf_open(&tf, path) == 0, "%s", pd_errmsg());
        const char *steps = tf_meta(&tf, "paradec.medusa.steps"), *kind = tf_meta(&tf, "paradec.kind");
        const char *heads = tf_meta(&tf, "paradec.medusa.heads");
        CHECK(steps && !strcmp(steps, "12") && kind && !strcmp(kind, "medusa-heads") && heads && !strcmp(heads, "3") &&
                  tf_get(&tf, "medusa.2.b") && (tf_get(&tf, "medusa.0.lm_head") != NULL) == own,
              "own=%d: metadata or tensors", own);
        tf_close(&tf);
        /* the loaded heads compute what the saved ones did */
        float *h = malloc(sizeof(float) * 8 * D), *la = malloc(sizeof(float) * 8 * V),
              *lb = malloc(sizeof(float) * 8 * V);
        hidden_states(&M, TOK, 8, h);
        medusa_logits(&M, &a, 2, h, 8, la);
        medusa_logits(&M, &b, 2, h, 8, lb);
        CHECK(!memcmp(la, lb, sizeof(float) * 8 * V), "own=%d: loaded heads compute other logits", own);
        /* saved again: the same bytes */
        const char *again = tmp("again.safetensors");
        if (!own) {
            medusa_save(&b, again, meta, 2);
            char *x = NULL, *y = NULL;
            size_t nx, ny;
            CHECK(pd_read_file(path, &x, &nx) == 0 && pd_read_file(again, &y, &ny) == 0 && nx == ny &&
                      !memcmp(x, y, nx),
                  "saved twice: other bytes");
            free(x);
            free(y);
        }
        free(h);
        free(la);
        free(lb);
        medusa_free(&a);
        medusa_free(&b);
    }
    MedusaHeads a;
    CHECK(medusa_init(&a, &M, 0, 0) == -1 && medusa_init(&a, &M, MAX_MEDUSA + 1, 0) == -1, "K out of range accepted");
    CHECK(medusa_init(&a, &M, MAX_MEDUSA, 0) == 0, "%s", pd_errmsg());
    float *lm = calloc((size_t)V * D, 4);
    CHECK(medusa_set(&a, 0, a.W[0], a.b[0], lm) == -1, "an lm_head for a head without one");
    CHECK(medusa_set(&a, MAX_MEDUSA, a.W[0], a.b[0], NULL) == -1, "head K accepted");
    medusa_free(&a);
    medusa_init(&a, &M, 1, 1);
    CHECK(medusa_set(&a, 0, a.W[0], a.b[0], NULL) == -1, "a head's own lm_head dropped");
    medusa_free(&a);
    free(lm);
}

/* a heads file as a case needs it: metadata pairs (NULL value: left out), then
   tensors for heads 0..K-1 with these shapes (lm rows 0: none) */
typedef struct {
    const char *kind, *heads, *dim, *digest, *scale, *acc;
    int K, wrows, wcols, blen, lmrows;
    float fill;
} Spec;

static Spec good(void) {
    int D = M.c.dim;
    static char dim[16];
    snprintf(dim, sizeof dim, "%d", D);
    return (Spec){"medusa-heads", "2", dim, M.digest, NULL, NULL, 2, D, D, D, 0, 0.01f};
}

static void write_spec(const char *path, const Spec *s) {
    TfWriter *w = tfw_begin(path, 0);
    static float data[600 * 64 * 4];
    for (size_t i = 0; i < sizeof data / sizeof data[0]; i++) data[i] = s->fill;
    const char *keys[] = {"paradec.kind",         "paradec.medusa.heads",       "paradec.medusa.dim",
                          "paradec.model_digest", "paradec.medusa.input_scale", "paradec.medusa.rank_acc"};
    const char *vals[] = {s->kind, s->heads, s->dim, s->digest, s->scale, s->acc};
    for (int i = 0; i < 6; i++)
        if (vals[i]) tfw_meta(w, keys[i], vals[i]);
    for (int k = 0; k < s->K; k++) {
        char name[64];
        int64_t ws[2] = {s->wrows, s->wcols}, bs[1] = {s->blen}, ls[2] = {s->lmrows, M.c.dim};
        snprintf(name, sizeof name, "medusa.%d.w", k);
        tfw_add(w, name, DT_F32, 2, ws, data);
        snprintf(name, sizeof name, "medusa.%d.b", k);
        tfw_add(w, name, DT_F32, 1, bs, data);
        snprintf(name, sizeof name, "medusa.%d.lm_head", k);
        if (s->lmrows) tfw_add(w, name, DT_F32, 2, ls, data);
    }
    tfw_commit(w);
}

static void refused(const char *what, const char *path, const char *expect) {
    MedusaHeads h;
    int rc = medusa_load(&h, path, &M);
    const char *msg = pd_errmsg();
    CHECK(rc == -1, "%s: accepted", what);
    CHECK(rc == -1 && strstr(msg, expect) && !strchr(msg, '\n'), "%s: message '%s' lacks '%s'", what, msg, expect);
    if (rc == 0) medusa_free(&h);
}

static void refuses_spec(const char *what, Spec s, const char *expect) {
    const char *p = tmp("bad.safetensors");
    write_spec(p, &s);
    refused(what, p, expect);
}

static void test_refusals(void) {
    int D = M.c.dim, V = M.c.vocab_size;
    Spec s = good();
    const char *p = tmp("ok.safetensors");
    write_spec(p, &s);
    MedusaHeads h;
    CHECK(medusa_load(&h, p, &M) == 0 && h.n == 2 && !h.lm[0] && !h.has_acc && h.input_scale == 1, "the good case: %s",
          pd_errmsg());
    if (h.n) medusa_free(&h);
    s.lmrows = V, s.scale = "2.5";
    s.acc = "[[0.3,0.1,0.05,0,0,0,0,0,0,0.01],[0.1,0.1,0.1,0.1,0.1,0.1,0.1,0.1,0.1,0.1]]";
    write_spec(p, &s);
    CHECK(medusa_load(&h, p, &M) == 0 && h.lm[1] && h.has_acc && h.input_scale == 2.5f &&
              fabsf(h.rank_acc[0][1] - 0.1f) < 1e-7f && h.rank_acc[1][9] == 0.1f,
          "the good case with lm_head, scale, rank_acc: %s", pd_errmsg());
    if (h.n) medusa_free(&h);

    s = good(), s.digest = "0123456789abcdef0123456789abcdef";
    refuses_spec("another model's digest", s, "0123456789abcdef0123456789abcdef");
    refuses_spec("another model's digest (ours named)", s, M.digest);
    s = good(), s.kind = "exit-heads";
    refuses_spec("kind exit-heads", s, "not a medusa-heads file");
    s = good(), s.kind = NULL;
    refuses_spec("no kind", s, "not a medusa-heads file");
    const char *bad_heads[] = {"0", "9", "x", "2x", "", NULL};
    for (int i = 0; i < 6; i++) {
        s = good(), s.heads = bad_heads[i];
        refuses_spec(bad_heads[i] ? bad_heads[i] : "(no heads)", s, "paradec.medusa.heads");
    }
    s = good(), s.dim = "32";
    refuses_spec("another dim", s, "dim");
    s = good(), s.dim = NULL;
    refuses_spec("no dim", s, "paradec.medusa.dim");
    s = good(), s.digest = NULL;
    refuses_spec("no digest", s, "paradec.model_digest");
    s = good(), s.wrows = D / 2;
    refuses_spec("W rows", s, "medusa.0.w");
    s = good(), s.wcols = D + 1;
    refuses_spec("W cols", s, "another model");
    s = good(), s.blen = D - 1;
    refuses_spec("b length", s, "medusa.0.b");
    s = good(), s.lmrows = V - 1;
    refuses_spec("lm_head rows", s, "medusa.0.lm_head");
    s = good(), s.K = 1;
    refuses_spec("a head's tensors missing", s, "medusa.1.w");
    s = good(), s.K = 3;
    refuses_spec("more heads than it says", s, "medusa.2.w");
    s = good(), s.fill = NAN;
    refuses_spec("NaN", s, "non-finite");
    s = good(), s.fill = INFINITY;
    refuses_spec("inf", s, "non-finite");
    const char *bad_scale[] = {"0", "-1", "abc", "1e9", "nan"};
    for (int i = 0; i < 5; i++) {
        s = good(), s.scale = bad_scale[i];
        refuses_spec(bad_scale[i], s, "input_scale");
    }
    const char *bad_acc[] = {"[[0.5]]",
                             "not json",
                             "[[0.1,0.1,0.1,0.1,0.1,0.1,0.1,0.1,0.1,0.1]]",
                             "[[2,0,0,0,0,0,0,0,0,0],[0,0,0,0,0,0,0,0,0,0]]",
                             "[[0.5,0.5,0.5,0,0,0,0,0,0,0],[0,0,0,0,0,0,0,0,0,0]]",
                             "[[-0.1,0,0,0,0,0,0,0,0,0],[0,0,0,0,0,0,0,0,0,0]]",
                             "[[\"a\",0,0,0,0,0,0,0,0,0],[0,0,0,0,0,0,0,0,0,0]]",
                             "{}"};
    for (int i = 0; i < 8; i++) {
        s = good(), s.acc = bad_acc[i];
        refuses_spec(bad_acc[i], s, "paradec.medusa.rank_acc");
    }
    refused("no such file", tmp("nope.safetensors"), "nope.safetensors");
    refused("a model file", test_model_path(), "not a medusa-heads file");
    /* a good file cut short, and one with a byte of its header changed */
    char *bytes;
    size_t n;
    s = good();
    write_spec(p, &s);
    pd_read_file(p, &bytes, &n);
    const char *q = tmp("cut.safetensors");
    for (int cut = 0; cut < 3; cut++) {
        FILE *f = fopen(q, "wb");
        size_t keep = cut == 0 ? 5 : cut == 1 ? n / 2 : n - 1;
        fwrite(bytes, 1, keep, f);
        fclose(f);
        refused("truncated", q, "cut.safetensors");
    }
    bytes[12] = '!';
    FILE *f = fopen(q, "wb");
    fwrite(bytes, 1, n, f);
    fclose(f);
    refused("corrupt header", q, "cut.safetensors");
    free(bytes);
}

/* random and mutated bytes of a good file (header bytes mostly): an answer, never a
   crash; accepted heads are whole, refusals name the input */
static void test_fuzz(void) {
    MedusaHeads a;
    medusa_init(&a, &M, 2, 0);
    randomise(&a, 1.0);
    set_acc(&a);
    a.input_scale = 1.5f;
    const char *p = tmp("fuzz.safetensors");
    medusa_save(&a, p, NULL, 0);
    medusa_free(&a);
    char *good;
    size_t n;
    if (pd_read_file(p, &good, &n)) {
        CHECK(0, "%s", pd_errmsg());
        return;
    }
    char *buf = malloc(n);
    int accepted = 0, broken = 0, silent = 0;
    for (int it = 0; it < 2000; it++) {
        memcpy(buf, good, n);
        size_t len = it % 5 == 0 ? next() % n : n;
        int edits = 1 + (int)(next() % 4);
        for (int e = 0; e < edits; e++) {
            size_t at = next() % 4 ? next() % (len < 900 ? len + 1 : 900) : next() % (len + 1); /* the header */
            if (at < len) buf[at] = it % 3 ? (char)next() : "0123456789[],.\"e-"[next() % 17];
        }
        TensorFile tf;
        MedusaHeads h;
        pd_error("%s", "");
        if (tf_parse(&tf, buf, len, "fuzz")) {
            silent += !strstr(pd_errmsg(), "fuzz");
            continue;
        }
        if (medusa_load_tf(&h, &tf, &M, "fuzz") == 0) {
            accepted++;
            broken += h.n < 1 || h.n > MAX_MEDUSA || h.dim != M.c.dim || !(h.input_scale > 0);
            for (int k = 0; k < h.n; k++)
                for (int i = 0; i < h.dim; i++) broken += !isfinite(h.b[k][i]);
            medusa_free(&h);
        } else silent += !strstr(pd_errmsg(), "fuzz") || strchr(pd_errmsg(), '\n') != NULL;
        tf_close(&tf);
    }
    printf("fuzz: 2000 mutated heads files, %d accepted\n", accepted);
    CHECK(broken == 0, "fuzz: %d accepted files with broken heads", broken);
    CHECK(silent == 0, "fuzz: %d refusals without a one-line message naming the input", silent);
    free(buf);
    free(good);
}

/* ---------------- widening ---------------- */

static void test_widen(void) {
    Checkpoint src, wide;
    const char *wpath = tmp("wide.safetensors");
    CHECK(ck_read_model(&src, test_model_path()) == 0, "%s", pd_errmsg());
    const WidenPreset *p = widen_preset("tiny");
    Config dst = widen_shape(&src.c, p);
    if (widen_checkpoint(&src, &dst, 1, &wide, NULL) || ck_write_model(&wide, wpath, DT_F32)) {
        CHECK(0, "%s", pd_errmsg());
        ck_free(&src);
        return;
    }
    ck_free(&src);
    ck_free(&wide);
    Model W;
    CHECK(model_load(&W, wpath) == 0, "%s", pd_errmsg());
    int d = M.c.dim, D = W.c.dim, V = M.c.vocab_size, n = 8;
    float *hs = malloc(sizeof(float) * n * d), *hw = malloc(sizeof(float) * n * D);
    float *ls = malloc(sizeof(float) * n * V), *lw = malloc(sizeof(float) * n * V);
    hidden_states(&M, TOK, n, hs);
    hidden_states(&W, TOK, n, hw);
    for (int own = 0; own < 2; own++) {
        MedusaHeads a, b;
        medusa_init(&a, &M, 3, own);
        randomise(&a, 3.0);
        set_acc(&a);
        const char *meta[] = {"paradec.medusa.0.top1", "0.375", "paradec.medusa.steps", "99"};
        const char *hin = tmp("small-heads.safetensors"), *hout = tmp("wide-heads.safetensors.zst");
        medusa_save(&a, hin, meta, 2);
        CHECK(widen_medusa(hin, test_model_path(), wpath, hout) == 0, "own=%d: %s", own, pd_errmsg());
        CHECK(medusa_load(&b, hout, &W) == 0, "own=%d: %s", own, pd_errmsg());
        if (!b.n) break;
        CHECK(fabsf(b.input_scale - sqrtf((float)D / d)) < 1e-6f && b.has_acc &&
                  !memcmp(a.rank_acc, b.rank_acc, sizeof a.rank_acc) && (b.lm[0] != NULL) == own,
              "own=%d: scale %g, rank_acc, lm_head", own, b.input_scale);
        float worst = 0;
        int same = 1;
        for (int k = 0; k < 3; k++) {
            medusa_logits(&M, &a, k, hs, n, ls);
            medusa_logits(&W, &b, k, hw, n, lw);
            for (int t = 0; t < n; t++) {
                const float *x = ls + (size_t)t * V, *y = lw + (size_t)t * V;
                same &= k_argmax(x, V) == k_argmax(y, V);
                for (int v = 0; v < V; v++) worst = fmaxf(worst, fabsf(x[v] - y[v]));
            }
        }
        CHECK(same, "own=%d: widened heads pick other candidates", own);
        CHECK(worst < 1e-3f, "own=%d: widened heads' logits differ by %g", own, worst);
        printf("widen_medusa (tiny, own lm_head %d): same argmax at %d positions x 3 heads, max |logit diff| %.3g\n",
               own, n, worst);
        TensorFile tf;
        tf_open(&tf, hout);
        const char *top1 = tf_meta(&tf, "paradec.medusa.0.top1"), *from = tf_meta(&tf, "paradec.widened_from");
        CHECK(top1 && !strcmp(top1, "0.375") && from && !strcmp(from, M.digest), "own=%d: metadata not carried", own);
        tf_close(&tf);
        /* the wide heads are the wide model's, not the small one's */
        refused("wide heads for the small model", hout, "dim");
        medusa_free(&a);
        medusa_free(&b);
    }
    CHECK(widen_medusa(test_model_path(), test_model_path(), wpath, tmp("x.safetensors")) == -1 &&
              strstr(pd_errmsg(), "not a medusa-heads file") && access(tmp("x.safetensors"), F_OK),
          "a model file widened as heads");
    model_free(&W);
    free(hs);
    free(hw);
    free(ls);
    free(lw);
}

/* test_medusa FILE...: medusa_load each file against $MODEL (the tool test's check) */
static int check_files(int n, char **files) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        MedusaHeads h;
        if (medusa_load(&h, files[i], &M)) {
            fprintf(stderr, "%s\n", pd_errmsg());
            bad = 1;
            continue;
        }
        printf("%s: %d heads, own lm_head %d, rank_acc %d\n", files[i], h.n, h.lm[0] != NULL, h.has_acc);
        medusa_free(&h);
    }
    runner_free(R);
    model_free(&M);
    return bad;
}

int main(int argc, char **argv) {
    if (test_model_load(&M) || !(R = runner_new(&M))) return check_done("medusa");
    k_init(1);
    if (argc > 1) return check_files(argc - 1, argv + 1);
    snprintf(dir, sizeof dir, "/tmp/test_medusa.XXXXXX");
    if (!mkdtemp(dir)) return 1;
    test_logits(0, 1.0f);
    test_logits(1, 1.0f);
    test_logits(0, 2.5f);
    test_logits(1, 0.75f);
    test_gradient(0);
    test_gradient(1);
    test_targets();
    test_training();
    test_generate();
    test_round_trip();
    test_refusals();
    test_fuzz();
    test_widen();
    const char *names[] = {"own.safetensors.zst", "shared.safetensors",      "again.safetensors",
                           "ok.safetensors",      "bad.safetensors",         "cut.safetensors",
                           "wide.safetensors",    "small-heads.safetensors", "wide-heads.safetensors.zst",
                           "x.safetensors",       "fuzz.safetensors"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) unlink(tmp(names[i]));
    rmdir(dir);
    runner_free(R);
    model_free(&M);
    return check_done("medusa");
}
