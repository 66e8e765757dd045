/* test_distill — exit-head training: the hand-written gradient of KL(p_L || p_l) with
   respect to T against central finite differences of a double-precision recomputation
   written out here (and a wrong gradient, T's transpose, fails that check: it can
   fail); Adam against steps worked out by hand; a few training steps lower the loss;
   the dataset reader (plain text, blank-line records, jsonl fields, gzip, refusals,
   packing, the held-out split, random bytes never crashing it). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "check.h"
#include "fixture.h"
#include "model/forward.h"
#include "train/distill.h"

static Model M;
static Runner *R; /* M's forward workspace */
static uint64_t rng = 7;

static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static double frand(void) { return (next() >> 11) * (1.0 / 9007199254740992.0) * 2 - 1; }

/* ---------------- the loss in double, from the definitions ---------------- */

typedef struct {
    int n, D, V, norm;
    double *E;  /* [V][D] */
    double *x;  /* [n][D] the head's input */
    double *pL; /* [n][V] */
} Ref;

static void softmax_d(double *y, int n) {
    double mx = y[0], s = 0;
    for (int i = 1; i < n; i++) mx = y[i] > mx ? y[i] : mx;
    for (int i = 0; i < n; i++) s += (y[i] = exp(y[i] - mx));
    for (int i = 0; i < n; i++) y[i] /= s;
}

static void rms_d(double *y, const float *h, int D, int gain) {
    double ss = 0;
    for (int i = 0; i < D; i++) ss += (double)h[i] * h[i];
    double r = 1 / sqrt(ss / D + M.c.norm_eps);
    for (int i = 0; i < D; i++) y[i] = (gain ? M.final_norm[i] : 1) * h[i] * r;
}

static void ref_init(Ref *r, const float *h, const float *hL, int n, int norm) {
    int D = M.c.dim, V = M.c.vocab_size;
    *r = (Ref){n, D, V, norm, calloc((size_t)V * D, 8), calloc((size_t)n * D, 8), calloc((size_t)n * V, 8)};
    float row[1024];
    for (int v = 0; v < V; v++) {
        k_row_to_f32(row, M.lm_head.w, M.lm_head.t, v, D);
        for (int i = 0; i < D; i++) r->E[(size_t)v * D + i] = row[i];
    }
    double *xl = calloc(D, 8);
    for (int t = 0; t < n; t++) {
        if (norm) rms_d(r->x + (size_t)t * D, h + (size_t)t * D, D, 1);
        else
            for (int i = 0; i < D; i++) r->x[(size_t)t * D + i] = h[(size_t)t * D + i];
        rms_d(xl, hL + (size_t)t * D, D, 1);
        double *p = r->pL + (size_t)t * V;
        for (int v = 0; v < V; v++) {
            p[v] = 0;
            for (int i = 0; i < D; i++) p[v] += r->E[(size_t)v * D + i] * xl[i];
        }
        softmax_d(p, V);
    }
    free(xl);
}

/* Σ_t Σ_v p_L log(p_L / p_l), p_l = softmax(E T x_t) */
static double ref_loss(const Ref *r, const double *T) {
    int D = r->D, V = r->V;
    double *z = calloc(D, 8), *q = calloc(V, 8), loss = 0;
    for (int t = 0; t < r->n; t++) {
        const double *x = r->x + (size_t)t * D, *p = r->pL + (size_t)t * V;
        for (int i = 0; i < D; i++) {
            z[i] = 0;
            for (int j = 0; j < D; j++) z[i] += T[(size_t)i * D + j] * x[j];
        }
        for (int v = 0; v < V; v++) {
            q[v] = 0;
            for (int i = 0; i < D; i++) q[v] += r->E[(size_t)v * D + i] * z[i];
        }
        softmax_d(q, V);
        for (int v = 0; v < V; v++)
            if (p[v] > 0) loss += p[v] * log(p[v] / q[v]);
    }
    free(z);
    free(q);
    return loss;
}

static void ref_free(Ref *r) {
    free(r->E);
    free(r->x);
    free(r->pL);
}

/* residual streams of a real sequence after `l` layers and after all of them */
static void hidden_states(const int32_t *tok, int n, int l, float *h, float *hL) {
    KVCache kv;
    int32_t pos[64];
    for (int i = 0; i < n; i++) pos[i] = i;
    kv_init(&kv, &M.c, 1, 64, 16);
    kv_seq_new(&kv);
    Batch b = {n, tok, NULL, pos, NULL, NULL};
    forward_layers(R, &kv, &b, 0, l, hL);
    memcpy(h, hL, sizeof(float) * n * M.c.dim);
    forward_layers(R, &kv, &b, l, M.c.n_layers, hL);
    kv_free(&kv);
}

/* the worst relative error of grad against central differences over `samples` entries */
static double fd_error(const Ref *r, const double *T0, const float *grad, int samples, int transpose) {
    int D = r->D;
    double *T = malloc(sizeof(double) * D * D), scale = 0, worst = 0, eps = 1e-4;
    memcpy(T, T0, sizeof(double) * D * D);
    for (int i = 0; i < D * D; i++) scale = fabs(grad[i]) > scale ? fabs(grad[i]) : scale;
    for (int s = 0; s < samples; s++) {
        int i = (int)(next() % D), j = (int)(next() % D);
        if (s == 0) i = j = 3; /* a diagonal entry */
        size_t e = (size_t)i * D + j;
        double keep = T[e];
        T[e] = keep + eps;
        double up = ref_loss(r, T);
        T[e] = keep - eps;
        double down = ref_loss(r, T);
        T[e] = keep;
        double fd = (up - down) / (2 * eps), an = grad[transpose ? (size_t)j * D + i : e];
        double err = fabs(an - fd) / fmax(fabs(fd), 1e-2 * scale);
        worst = err > worst ? err : worst;
    }
    free(T);
    return worst;
}

static void test_gradient(int norm, int layer) {
    int D = M.c.dim, n = 5;
    int32_t tok[5] = {1, 403, 407, 261, 378};
    float *h = calloc((size_t)n * D, 4), *hL = calloc((size_t)n * D, 4), *grad = calloc((size_t)D * D, 4);
    float *Tf = calloc((size_t)D * D, 4);
    double *T = calloc((size_t)D * D, 8);
    hidden_states(tok, n, layer, h, hL);
    /* away from identity, so every entry matters */
    for (int i = 0; i < D * D; i++) Tf[i] = (float)((i % (D + 1) == 0) + 0.3 * frand()), T[i] = Tf[i];
    ExitHeads eh;
    Distill d;
    int layers[1] = {layer};
    CHECK(heads_identity(&eh, &M, layers, 1, norm) == 0, "%s", pd_errmsg());
    heads_set_T(&eh, 0, Tf);
    CHECK(distill_init(&d, &M, &eh, 16, 1e-3f) == 0, "%s", pd_errmsg());
    double loss;
    CHECK(distill_head_loss(&d, 0, h, hL, n, &loss, grad, NULL) == 0, "%s", pd_errmsg());
    Ref r;
    ref_init(&r, h, hL, n, norm);
    double want = ref_loss(&r, T);
    CHECK(fabs(loss - want) < 1e-4 * fabs(want) + 1e-5, "norm=%d layer %d: loss %.7f, double reference %.7f", norm,
          layer, loss, want);
    double err = fd_error(&r, T, grad, 24, 0);
    CHECK(err < 1e-3, "norm=%d layer %d: gradient off central differences by %.2e (relative)", norm, layer, err);
    /* the check can fail: the transposed gradient is wrong, and must be caught */
    double terr = fd_error(&r, T, grad, 24, 1);
    CHECK(terr > 1e-2, "norm=%d: the transposed gradient passed (error %.2e)", norm, terr);
    /* the gradient adds to what grad held */
    float *g2 = malloc(sizeof(float) * D * D);
    memcpy(g2, grad, sizeof(float) * D * D);
    distill_head_loss(&d, 0, h, hL, n, &loss, g2, NULL);
    int twice = 1;
    for (int i = 0; i < D * D; i++) twice &= fabsf(g2[i] - 2 * grad[i]) <= 1e-6f * (1 + fabsf(grad[i]));
    CHECK(twice, "grad is not accumulated");
    CHECK(distill_head_loss(&d, 1, h, hL, n, &loss, NULL, NULL) == -1, "head 1 of 1 accepted");
    CHECK(distill_head_loss(&d, 0, h, hL, 17, &loss, NULL, NULL) == -1, "17 positions in a scratch of 16 accepted");
    ref_free(&r);
    distill_free(&d);
    heads_free(&eh);
    free(h);
    free(hL);
    free(grad);
    free(Tf);
    free(T);
    free(g2);
}

/* a check vocabulary C: Σ_t KL(P || Q) over C and the rest, P = (p_L on C, 1 − its sum),
   Q = softmax(E_C T x, r·T x + b) */
static double ref_loss_vocab(const Ref *r, const double *T, const double *rb, const int32_t *vocab, int K) {
    int D = r->D, V = r->V;
    double *z = calloc(D, 8), *q = calloc(K + 1, 8), loss = 0;
    for (int t = 0; t < r->n; t++) {
        const double *x = r->x + (size_t)t * D, *p = r->pL + (size_t)t * V;
        for (int i = 0; i < D; i++) {
            z[i] = 0;
            for (int j = 0; j < D; j++) z[i] += T[(size_t)i * D + j] * x[j];
        }
        for (int c = 0; c <= K; c++) {
            const double *e = c < K ? r->E + (size_t)vocab[c] * D : rb;
            q[c] = c < K ? 0 : rb[D];
            for (int i = 0; i < D; i++) q[c] += e[i] * z[i];
        }
        softmax_d(q, K + 1);
        double in = 0;
        for (int c = 0; c < K; c++) {
            in += p[vocab[c]];
            if (p[vocab[c]] > 0) loss += p[vocab[c]] * log(p[vocab[c]] / q[c]);
        }
        if (1 - in > 0) loss += (1 - in) * log((1 - in) / q[K]);
    }
    free(z);
    free(q);
    return loss;
}

/* ref_loss_vocab's central difference in the parameter at x (an entry of T or rb) */
static double central_vocab(const Ref *r, double *T, double *rb, const int32_t *vocab, int K, double *x, double eps) {
    double keep = *x;
    *x = keep + eps;
    double up = ref_loss_vocab(r, T, rb, vocab, K);
    *x = keep - eps;
    double down = ref_loss_vocab(r, T, rb, vocab, K);
    *x = keep;
    return (up - down) / (2 * eps);
}

/* the same gradient checks for a head with a check vocabulary: T's and (r, b)'s */
static void test_gradient_vocab(int norm, int layer) {
    int D = M.c.dim, V = M.c.vocab_size, n = 5, K = 0;
    int32_t tok[5] = {1, 403, 407, 261, 378}, vocab[512];
    for (int v = 0; v < V && K < 512; v += 3) vocab[K++] = v;
    float *h = calloc((size_t)n * D, 4), *hL = calloc((size_t)n * D, 4), *grad = calloc((size_t)D * D, 4);
    float *Tf = calloc((size_t)D * D, 4), *gr = calloc(D + 1, 4), rbf[1025];
    double *T = calloc((size_t)D * D, 8), rb[1025];
    hidden_states(tok, n, layer, h, hL);
    for (int i = 0; i < D * D; i++) Tf[i] = (float)((i % (D + 1) == 0) + 0.3 * frand()), T[i] = Tf[i];
    for (int i = 0; i <= D; i++) rbf[i] = (float)(0.5 * frand()), rb[i] = rbf[i];
    ExitHeads eh;
    Distill d;
    int layers[1] = {layer};
    CHECK(heads_identity(&eh, &M, layers, 1, norm) == 0 && heads_set_vocab(&eh, &M, vocab, K) == 0, "%s", pd_errmsg());
    heads_set_T(&eh, 0, Tf);
    heads_set_rest(&eh, 0, rbf);
    CHECK(distill_init(&d, &M, &eh, 16, 1e-3f) == 0, "%s", pd_errmsg());
    double loss;
    CHECK(distill_head_loss(&d, 0, h, hL, n, &loss, grad, NULL) == -1, "a check vocabulary without grad_rest");
    CHECK(distill_head_loss(&d, 0, h, hL, n, &loss, grad, gr) == 0, "%s", pd_errmsg());
    Ref r;
    ref_init(&r, h, hL, n, norm);
    double want = ref_loss_vocab(&r, T, rb, vocab, K), eps = 1e-4, worst = 0, worst_rb = 0, scale = 0, scale_rb = 0;
    CHECK(fabs(loss - want) < 1e-4 * fabs(want) + 1e-5, "vocab, norm=%d layer %d: loss %.7f, double reference %.7f",
          norm, layer, loss, want);
    for (int i = 0; i < D * D; i++) scale = fmax(scale, fabs(grad[i]));
    for (int i = 0; i <= D; i++) scale_rb = fmax(scale_rb, fabs(gr[i]));
    for (int s = 0; s < 24; s++) {
        size_t e = (size_t)(next() % D) * D + next() % D;
        double fd = central_vocab(&r, T, rb, vocab, K, &T[e], eps);
        worst = fmax(worst, fabs(grad[e] - fd) / fmax(fabs(fd), 1e-2 * scale));
    }
    for (int s = 0; s < 16; s++) {
        int j = s == 0 ? D : (int)(next() % D); /* b, then entries of r */
        double fd = central_vocab(&r, T, rb, vocab, K, &rb[j], eps);
        worst_rb = fmax(worst_rb, fabs(gr[j] - fd) / fmax(fabs(fd), 1e-2 * scale_rb));
    }
    CHECK(worst < 1e-3, "vocab, norm=%d layer %d: dT off central differences by %.2e", norm, layer, worst);
    CHECK(worst_rb < 1e-3, "vocab, norm=%d layer %d: d(r, b) off central differences by %.2e", norm, layer, worst_rb);
    CHECK(scale_rb > 0, "the rest's gradient is not zero");
    ref_free(&r);
    distill_free(&d);
    heads_free(&eh);
    free(h), free(hL), free(grad), free(Tf), free(gr), free(T);
}

/* two steps worked out by hand: step 1 moves every parameter with a nonzero
   gradient by lr against its sign (m̂ = g, v̂ = g²); step 2 from Kingma & Ba's formulas */
static void test_adam(void) {
    float w[4] = {0.5f, -1.0f, 2.0f, 0.0f}, m[4] = {0}, v[4] = {0};
    float g1[4] = {0.1f, -0.2f, 0.0f, 3.0f}, g2[4] = {-0.3f, 0.1f, 1e-3f, 2.0f};
    double s1[4] = {0.49, -0.99, 2.0, -0.01}, s2[4] = {0.494941899, -0.987336630, 1.992558737, -0.019703521};
    adam_update(w, g1, m, v, 4, 1, 0.01f); /* β1 0.9, β2 0.999, ε 1e-8 */
    for (int i = 0; i < 4; i++) CHECK(fabs(w[i] - s1[i]) < 1e-6, "adam step 1 [%d]: %.9f, want %.9f", i, w[i], s1[i]);
    adam_update(w, g2, m, v, 4, 2, 0.01f);
    for (int i = 0; i < 4; i++) CHECK(fabs(w[i] - s2[i]) < 1e-6, "adam step 2 [%d]: %.9f, want %.9f", i, w[i], s2[i]);
}

static const char *STORY =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.\n"
    "One day, she saw a big, red ball. She wanted to play with it, but it was too high.\n\n"
    "Tom had a dog named Max. Max liked to run and jump. One day Max ran into the woods.\n\n"
    "The sun was hot. The cat sat under the tree and slept all day long.\n\n"
    "Ben and Sue went to the beach. They made a big sand castle and swam in the sea.\n";

static void test_training(void) {
    TextSet ts;
    Sequences tr, ho;
    CHECK(dataset_parse(&ts, STORY, strlen(STORY), NULL, "story") == 0, "%s", pd_errmsg());
    CHECK(dataset_sequences(&ts, M.tok, 32, 0.2, 0, &tr, &ho, "story") == 0, "%s", pd_errmsg());
    ExitHeads eh;
    Distill d;
    int layers[2] = {2, 4};
    heads_identity(&eh, &M, layers, 2, 1);
    CHECK(distill_init(&d, &M, &eh, 32, 1e-2f) == 0, "%s", pd_errmsg());
    HeadStats a[2], b[2];
    ExitStats ea, eb;
    /* norm auto: both starts evaluated, the lower Σ KL kept, its statistics returned */
    double kl[2];
    HeadStats chosen[2], plain[2];
    CHECK(distill_choose_norm(&d, &tr, chosen, kl) == 0, "%s", pd_errmsg());
    int pick = eh.norm;
    CHECK(pick == (kl[1] < kl[0]), "norm auto kept %d with sums %.4f / %.4f", pick, kl[0], kl[1]);
    eh.norm = !pick;
    distill_eval(&d, &tr, plain, NULL);
    CHECK(fabs(plain[0].kl + plain[1].kl - kl[!pick]) < 1e-9 * kl[!pick], "the other norm's sum");
    eh.norm = 1; /* the rest of this test trains with the norm */
    CHECK(distill_eval(&d, &tr, a, &ea) == 0, "%s", pd_errmsg());
    if (pick == 1) CHECK(!memcmp(chosen, a, sizeof a), "norm auto's statistics are not the chosen heads'");
    int idx[64];
    for (int i = 0; i < tr.n; i++) idx[i] = i;
    double loss[2], first = 0;
    for (int s = 0; s < 30; s++) {
        CHECK(distill_step(&d, &tr, idx, tr.n, loss) == 0, "%s", pd_errmsg());
        if (s == 0) first = loss[0] + loss[1];
    }
    distill_eval(&d, &tr, b, &eb);
    CHECK(fabs(first - (a[0].kl + a[1].kl)) < 1e-3 * first, "the first step's loss %.5f is not the eval's %.5f", first,
          a[0].kl + a[1].kl);
    for (int k = 0; k < 2; k++) {
        CHECK(b[k].kl < 0.7 * a[k].kl, "layer %d: KL %.4f -> %.4f after 30 steps on the training text", layers[k],
              a[k].kl, b[k].kl);
        CHECK(b[k].top1 >= 0 && b[k].top1 <= 1 && b[k].cover[0] >= b[k].cover[1] && b[k].cover[1] >= b[k].cover[2],
              "statistics out of range");
    }
    CHECK(d.t == 30, "adam steps %d", d.t);
    /* the first-exit rule: no more exits than the most covering head allows and no
       fewer than the best single head; layers between the first head's and L */
    for (int g = 0; g < EXIT_N_GAMMA; g++) {
        double lo = fmax(b[0].cover[g], b[1].cover[g]), hi = fmin(1, b[0].cover[g] + b[1].cover[g]);
        CHECK(eb.rate[g] >= lo - 1e-9 && eb.rate[g] <= hi + 1e-9, "γ %.2f: exit rate %.4f outside [%.4f, %.4f]",
              exit_gamma[g], eb.rate[g], lo, hi);
        CHECK(eb.layers[g] >= 2 && eb.layers[g] <= M.c.n_layers, "mean layers %.3f", eb.layers[g]);
        double want = M.c.n_layers - eb.rate[g] * M.c.n_layers + (b[0].cover[g] * 2 + (eb.rate[g] - b[0].cover[g]) * 4);
        CHECK(fabs(eb.layers[g] - want) < 1e-9, "mean layers %.5f, want %.5f", eb.layers[g], want);
    }
    int bad = -1;
    CHECK(distill_step(&d, &tr, &bad, 1, NULL) == -1, "sequence -1 accepted");
    distill_free(&d);
    heads_free(&eh);
    seqs_free(&tr);
    seqs_free(&ho);
    dataset_free(&ts);
}

static void test_order(void) {
    SeqOrder o;
    int seen[10] = {0}, idx[10];
    order_init(&o, 10, 3);
    order_next(&o, idx, 4);
    order_next(&o, idx + 4, 6);
    for (int i = 0; i < 10; i++) seen[idx[i]]++;
    int perm = 1;
    for (int i = 0; i < 10; i++) perm &= seen[i] == 1;
    CHECK(perm, "an epoch does not visit every sequence once");
    order_free(&o);
    CHECK(order_init(&o, 0, 1) == -1, "no sequences accepted");
    int l[8];
    CHECK(distill_auto_layers(5, l) == 4 && l[0] == 1 && l[3] == 4, "auto, 5 layers");
    CHECK(distill_auto_layers(32, l) == 3 && l[0] == 8 && l[1] == 16 && l[2] == 24, "auto, 32 layers");
    CHECK(distill_auto_layers(30, l) == 3 && l[0] == 8 && l[1] == 15 && l[2] == 23, "auto, 30 layers");
    CHECK(distill_auto_layers(1, l) == 0, "auto, 1 layer");
}

/* ---------------- the dataset reader ---------------- */

static int parse(TextSet *ts, const char *s, const char *fields) {
    return dataset_parse(ts, s, strlen(s), fields, "t");
}

static void test_dataset(void) {
    TextSet ts;
    CHECK(parse(&ts, "\n\n  one\ntwo\n \n\t\nthree\n", NULL) == 0 && ts.n == 2 && !strcmp(ts.text[0], "  one\ntwo") &&
              !strcmp(ts.text[1], "three"),
          "plain records: %d", ts.n);
    char d1[40];
    snprintf(d1, sizeof d1, "%s", ts.digest);
    dataset_free(&ts);
    CHECK(parse(&ts, "{\"text\": \"a b\"}\n\n{\"text\": \"\"}\n{\"other\": 1}\n{\"text\": [\"x\", \"y\"]}\n", NULL) ==
                  0 &&
              ts.n == 2 && !strcmp(ts.text[0], "a b") && !strcmp(ts.text[1], "x\ny"),
          "jsonl text field: %d", ts.n);
    dataset_free(&ts);
    CHECK(parse(&ts, "{\"question\": \"q?\", \"answer\": \"a.\", \"text\": \"no\"}\n", "question,answer") == 0 &&
              ts.n == 1 && !strcmp(ts.text[0], "q?\na."),
          "jsonl named fields");
    dataset_free(&ts);
    /* gzip, two members (as `cat a.gz b.gz` makes): the same text, the same digest */
    const char *plain = "\n\n  one\ntwo\n \n\t\nthree\n";
    unsigned char gz[512];
    size_t at = 0;
    for (int part = 0; part < 2; part++) {
        const char *s = part ? plain + 10 : plain;
        size_t len = part ? strlen(plain) - 10 : 10;
        z_stream z = {0};
        deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
        z.next_in = (unsigned char *)s;
        z.avail_in = (unsigned)len;
        z.next_out = gz + at;
        z.avail_out = (unsigned)(sizeof gz - at);
        deflate(&z, Z_FINISH);
        at = sizeof gz - z.avail_out;
        deflateEnd(&z);
    }
    CHECK(dataset_parse(&ts, gz, at, NULL, "gz") == 0 && ts.n == 2 && !strcmp(ts.digest, d1), "gzip: %s", pd_errmsg());
    dataset_free(&ts);
    CHECK(dataset_parse(&ts, gz, at - 5, NULL, "gz") == -1 && strstr(pd_errmsg(), "gzip"), "truncated gzip accepted");

    const char *bad[][3] = {{"", NULL, "empty"},
                            {" \n\n \t\n", NULL, "no usable text"},
                            {"{\"text\": \"a\"}\n[1, 2]\n", NULL, "t:2: not a JSON object"},
                            {"{\"text\": \"a\"\n", NULL, "t:1: not a JSON object"},
                            {"{\"text\": 3}\n{\"text\": \" \"}\n", NULL, "no usable text"},
                            {"{\"text\": \"a\"}\n", "question", "field(s) 'question'"},
                            {"{\"text\": \"a\"}\n", "a,,b", "bad field list"}};
    for (int i = 0; i < 7; i++) {
        int rc = parse(&ts, bad[i][0], bad[i][1]);
        CHECK(rc == -1 && strstr(pd_errmsg(), bad[i][2]), "case %d: rc %d, '%s'", i, rc, pd_errmsg());
    }
    CHECK(dataset_parse(&ts, "ab\0cd", 5, NULL, "t") == -1 && strstr(pd_errmsg(), "NUL"), "NUL bytes accepted");
    CHECK(dataset_read(&ts, "/nonexistent/data.txt", NULL) == -1 && strstr(pd_errmsg(), "/nonexistent/data.txt"),
          "missing file");

    /* packing: sequences start at records, never exceed seq_len, cover every token */
    CHECK(parse(&ts, STORY, NULL) == 0 && ts.n == 4, "story records");
    Sequences tr, ho;
    int S = 24;
    CHECK(dataset_sequences(&ts, M.tok, S, 0.25, 0, &tr, &ho, "story") == 0, "%s", pd_errmsg());
    int64_t total = 0;
    for (int r = 0; r < ts.n; r++) {
        int32_t *ids;
        int k;
        tok_encode_flags(M.tok, ts.text[r], ts.len[r], TOK_ADD_BOS, &ids, &k);
        total += k;
        free(ids);
    }
    CHECK(seqs_tokens(&tr) + seqs_tokens(&ho) == total, "tokens lost: %lld + %lld of %lld", (long long)seqs_tokens(&tr),
          (long long)seqs_tokens(&ho), (long long)total);
    int ok = tr.n >= 1 && ho.n >= 1 && tr.max_len <= S && ho.max_len <= S && tr.tok[0] == tok_bos(M.tok);
    for (int i = 0; i < tr.n; i++) ok &= seq_len_of(&tr, i) >= 1;
    CHECK(ok, "packing: %d train, %d held out, longest %d", tr.n, ho.n, tr.max_len);
    CHECK(ho.n == (tr.n + ho.n) / 4, "every 4th sequence held out: %d of %d", ho.n, tr.n + ho.n);
    seqs_free(&tr);
    seqs_free(&ho);
    /* a record that fits whole is never split across sequences */
    CHECK(dataset_sequences(&ts, M.tok, 100, 0.1, 0, &tr, &ho, "story") == 0, "%s", pd_errmsg());
    int starts = 1;
    for (int i = 0; i < tr.n; i++) starts &= tr.tok[tr.off[i]] == tok_bos(M.tok);
    for (int i = 0; i < ho.n; i++) starts &= ho.tok[ho.off[i]] == tok_bos(M.tok);
    CHECK(starts, "a sequence starts inside a record");
    seqs_free(&tr);
    seqs_free(&ho);
    dataset_free(&ts);
    CHECK(parse(&ts, "Hi.", NULL) == 0 && dataset_sequences(&ts, M.tok, 64, 0.1, 0, &tr, &ho, "tiny") == -1 &&
              strstr(pd_errmsg(), "too little text"),
          "one sequence accepted");
    dataset_free(&ts);

    /* random and mutated bytes: an answer, never a crash */
    char buf[300];
    int broken = 0, silent = 0;
    for (int it = 0; it < 3000; it++) {
        size_t n = next() % sizeof buf;
        const char *seed = it % 3 == 0   ? "{\"text\": [\"a\", {\"b\": 1}], \"x\": \"y\"}\n"
                           : it % 3 == 1 ? (const char *)gz
                                         : STORY;
        size_t sl = it % 3 == 1 ? at : strlen(seed);
        for (size_t i = 0; i < n; i++) buf[i] = i < sl && next() % 8 ? seed[i] : (char)next();
        pd_error("%s", "");
        if (dataset_parse(&ts, buf, n, it % 2 ? "text,x" : NULL, "fuzz") == 0) {
            /* accepted: at least one record, each as long as it says */
            broken += ts.n < 1;
            for (int r = 0; r < ts.n; r++) broken += strlen(ts.text[r]) != ts.len[r];
            dataset_free(&ts);
        } else silent += !strstr(pd_errmsg(), "fuzz"); /* refused: one line naming the input */
    }
    CHECK(broken == 0, "fuzz: %d accepted inputs with inconsistent records", broken);
    CHECK(silent == 0, "fuzz: %d refusals without a message naming the input", silent);
}

int main(void) {
    if (test_model_load(&M) || !(R = runner_new(&M))) return check_done("distill");
    k_init(1);
    test_gradient(1, 2);
    test_gradient(0, 2);
    test_gradient(1, 4);
    test_gradient_vocab(1, 2);
    test_gradient_vocab(0, 3);
    test_adam();
    test_order();
    test_dataset();
    test_training();
    runner_free(R);
    model_free(&M);
    return check_done("distill");
}
