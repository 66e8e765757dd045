/* test_forward — the forward pass: an independent slow reference (llama2.c's math on
   the raw .bin, Meta RoPE order, double accumulation), batch invariance for chains,
   trees, masks, several sequences and threads, layer-range composition, rollback. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fixture.h"
#include "model/checkpoint.h"
#include "model/forward.h"

static Model M;
static Runner *R; /* M's forward workspace */
static KVCache KV;
static uint64_t rng = 12345;
static int rnd(int n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (int)(rng % (uint64_t)n);
}

/* ---------- the slow reference, straight from llama2.c's file layout ---------- */
typedef struct {
    int dim, hidden, L, H, KVH, V, S;
    const float *emb, *att_n, *wq, *wk, *wv, *wo, *ffn_n, *w1, *w2, *w3, *fin;
} Ref;

static void ref_matvec(double *y, const double *x, const float *w, int n, int d) {
    for (int i = 0; i < d; i++) {
        double s = 0;
        for (int j = 0; j < n; j++) s += (double)w[(size_t)i * n + j] * x[j];
        y[i] = s;
    }
}
static void ref_rms(double *o, const double *x, const float *g, int n) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    ss = 1.0 / sqrt(ss / n + 1e-5);
    for (int i = 0; i < n; i++) o[i] = g[i] * x[i] * ss;
}
/* logits after feeding tokens[0..n) one by one; returns the last position's */
static void ref_logits(const Ref *r, const int *tokens, int n, double *logits) {
    int hd = r->dim / r->H, kvd = r->KVH * hd;
    double *x = calloc(r->dim, 8), *xb = calloc(r->dim, 8), *q = calloc(r->dim, 8), *o = calloc(r->dim, 8);
    double *h1 = calloc(r->hidden, 8), *h3 = calloc(r->hidden, 8),
           *tmp = calloc(r->hidden > r->dim ? r->hidden : r->dim, 8);
    double *kc = calloc((size_t)r->L * n * kvd, 8), *vc = calloc((size_t)r->L * n * kvd, 8), *att = calloc(n, 8);
    for (int p = 0; p < n; p++) {
        for (int i = 0; i < r->dim; i++) x[i] = r->emb[(size_t)tokens[p] * r->dim + i];
        for (int l = 0; l < r->L; l++) {
            double *k = kc + ((size_t)l * n + p) * kvd, *v = vc + ((size_t)l * n + p) * kvd;
            ref_rms(xb, x, r->att_n + l * r->dim, r->dim);
            ref_matvec(q, xb, r->wq + (size_t)l * r->dim * r->dim, r->dim, r->dim);
            ref_matvec(k, xb, r->wk + (size_t)l * kvd * r->dim, r->dim, kvd);
            ref_matvec(v, xb, r->wv + (size_t)l * kvd * r->dim, r->dim, kvd);
            for (int i = 0; i < r->dim; i += 2) { /* Meta's interleaved pairs */
                double f = 1.0 / pow(10000.0, (i % hd) / (double)hd), c = cos(p * f), s = sin(p * f);
                double a = q[i], b = q[i + 1];
                q[i] = a * c - b * s;
                q[i + 1] = a * s + b * c;
                if (i < kvd) {
                    a = k[i];
                    b = k[i + 1];
                    k[i] = a * c - b * s;
                    k[i + 1] = a * s + b * c;
                }
            }
            for (int h = 0; h < r->H; h++) {
                int g = h / (r->H / r->KVH);
                double mx = -1e300, sum = 0;
                for (int t = 0; t <= p; t++) {
                    double s = 0;
                    for (int i = 0; i < hd; i++) s += q[h * hd + i] * kc[((size_t)l * n + t) * kvd + g * hd + i];
                    att[t] = s / sqrt(hd);
                    mx = att[t] > mx ? att[t] : mx;
                }
                for (int t = 0; t <= p; t++) {
                    att[t] = exp(att[t] - mx);
                    sum += att[t];
                }
                for (int i = 0; i < hd; i++) {
                    double s = 0;
                    for (int t = 0; t <= p; t++) s += att[t] / sum * vc[((size_t)l * n + t) * kvd + g * hd + i];
                    o[h * hd + i] = s;
                }
            }
            ref_matvec(tmp, o, r->wo + (size_t)l * r->dim * r->dim, r->dim, r->dim);
            for (int i = 0; i < r->dim; i++) x[i] += tmp[i];
            ref_rms(xb, x, r->ffn_n + l * r->dim, r->dim);
            ref_matvec(h1, xb, r->w1 + (size_t)l * r->hidden * r->dim, r->dim, r->hidden);
            ref_matvec(h3, xb, r->w3 + (size_t)l * r->hidden * r->dim, r->dim, r->hidden);
            for (int i = 0; i < r->hidden; i++) h1[i] = h1[i] / (1 + exp(-h1[i])) * h3[i];
            ref_matvec(tmp, h1, r->w2 + (size_t)l * r->dim * r->hidden, r->hidden, r->dim);
            for (int i = 0; i < r->dim; i++) x[i] += tmp[i];
        }
    }
    ref_rms(xb, x, r->fin, r->dim);
    ref_matvec(logits, xb, r->emb, r->dim, r->V);
    free(x);
    free(xb);
    free(q);
    free(o);
    free(h1);
    free(h3);
    free(tmp);
    free(kc);
    free(vc);
    free(att);
}

static void test_reference(void) {
    char path[4096];
    char *raw;
    size_t n;
    if (pd_data_path("models/stories260K/stories260K.bin", path, sizeof path) || pd_read_file(path, &raw, &n)) {
        CHECK(0, "%s", pd_errmsg());
        return;
    }
    const int *h = (const int *)raw;
    Ref r = {.dim = h[0], .hidden = h[1], .L = h[2], .H = h[3], .KVH = h[4], .V = abs(h[5]), .S = h[6]};
    const float *p = (const float *)(raw + 28);
    int kvd = r.KVH * (r.dim / r.H);
    r.emb = p;
    p += (size_t)r.V * r.dim;
    r.att_n = p;
    p += r.L * r.dim;
    r.wq = p;
    p += (size_t)r.L * r.dim * r.dim;
    r.wk = p;
    p += (size_t)r.L * kvd * r.dim;
    r.wv = p;
    p += (size_t)r.L * kvd * r.dim;
    r.wo = p;
    p += (size_t)r.L * r.dim * r.dim;
    r.ffn_n = p;
    p += r.L * r.dim;
    r.w1 = p;
    p += (size_t)r.L * r.hidden * r.dim;
    r.w2 = p;
    p += (size_t)r.L * r.hidden * r.dim;
    r.w3 = p;
    p += (size_t)r.L * r.hidden * r.dim;
    r.fin = p;
    int toks[40];
    toks[0] = 1;
    for (int i = 1; i < 40; i++) toks[i] = 3 + rnd(509);
    double *want = malloc(sizeof(double) * r.V);
    float *got = malloc(sizeof(float) * r.V * 40), *hid = malloc(sizeof(float) * 40 * M.c.dim);
    int s = kv_seq_new(&KV), pos[40], seqs[40];
    for (int i = 0; i < 40; i++) pos[i] = i, seqs[i] = s;
    Batch b = {40, toks, seqs, pos, NULL, NULL};
    CHECK(forward_layers(R, &KV, &b, 0, M.c.n_layers, hid) == 0, "%s", pd_errmsg());
    final_logits(R, hid, 40, got);
    double worst = 0;
    for (int t = 1; t <= 40; t += 13) {
        ref_logits(&r, toks, t, want);
        for (int v = 0; v < r.V; v++) {
            double d = fabs(want[v] - got[(size_t)(t - 1) * r.V + v]) / (1 + fabs(want[v]));
            worst = d > worst ? d : worst;
        }
    }
    CHECK(worst < 1e-4, "forward vs slow reference: worst relative difference %g", worst);
    kv_seq_free(&KV, s);
    free(want);
    free(got);
    free(hid);
    free(raw);
}

/* ---------- batch invariance ---------- */
/* logits of feeding `path` one token per call after the context in seq `ctx` */
static void sequential(int ctx, int ctx_len, const int *tok, const int *path, int n, float *logits) {
    int s = kv_fork(&KV, ctx, ctx_len);
    float *h = malloc(sizeof(float) * M.c.dim);
    for (int i = 0; i < n; i++) {
        int p = ctx_len + i;
        Batch b = {1, &tok[path[i]], &s, &p, NULL, NULL};
        forward_layers(R, &KV, &b, 0, M.c.n_layers, h);
    }
    final_logits(R, h, 1, logits);
    kv_seq_free(&KV, s);
    free(h);
}

static int prefill_context(int len) {
    int s = kv_seq_new(&KV), *tok = malloc(sizeof(int) * (len + 1)), *pos = malloc(sizeof(int) * (len + 1));
    int *seqs = malloc(sizeof(int) * (len + 1));
    float *h = malloc(sizeof(float) * (len + 1) * M.c.dim);
    for (int i = 0; i < len; i++) tok[i] = i ? 3 + rnd(509) : 1, pos[i] = i, seqs[i] = s;
    Batch b = {len, tok, seqs, pos, NULL, NULL};
    if (len) forward_layers(R, &KV, &b, 0, M.c.n_layers, h);
    free(tok);
    free(pos);
    free(seqs);
    free(h);
    return s;
}

static void test_trees(int threads) {
    k_init(threads);
    int V = M.c.vocab_size, mism = 0, cases = 0;
    for (int n = 1; n <= 16; n++) {
        int clen = rnd(20), ctx = prefill_context(clen), s = kv_fork(&KV, ctx, clen);
        int tok[16], par[16], pos[16], seqs[16], depth[16];
        for (int i = 0; i < n; i++) {
            tok[i] = 3 + rnd(509);
            par[i] = i == 0 ? -1 : rnd(i + 1) - 1; /* -1 or an earlier token */
            depth[i] = par[i] < 0 ? 0 : depth[par[i]] + 1;
            pos[i] = clen + depth[i];
            seqs[i] = s;
        }
        float *h = malloc(sizeof(float) * n * M.c.dim), *lg = malloc(sizeof(float) * n * V),
              *one = malloc(sizeof(float) * V);
        Batch b = {n, tok, seqs, pos, par, NULL};
        CHECK(forward_layers(R, &KV, &b, 0, M.c.n_layers, h) == 0, "%s", pd_errmsg());
        final_logits(R, h, n, lg);
        for (int i = 0; i < n; i++) {
            int path[16], len = 0;
            for (int a = i; a >= 0; a = par[a]) path[len++] = a;
            for (int k = 0; k < len / 2; k++) {
                int t = path[k];
                path[k] = path[len - 1 - k];
                path[len - 1 - k] = t;
            }
            sequential(ctx, clen, tok, path, len, one);
            cases++;
            mism += memcmp(one, lg + (size_t)i * V, sizeof(float) * V) != 0;
        }
        kv_seq_free(&KV, s);
        kv_seq_free(&KV, ctx);
        free(h);
        free(lg);
        free(one);
    }
    CHECK(mism == 0, "trees with %d threads: %d of %d tokens' logits differ from sequential decoding", threads, mism,
          cases);
}

/* random explicit masks: token i's logits equal those of the batch cut after i */
static void test_masks(void) {
    int V = M.c.vocab_size, mism = 0, cases = 0;
    for (int n = 1; n <= 16; n++) {
        int clen = 1 + rnd(10), ctx = prefill_context(clen);
        int tok[16], pos[16], seqs[16];
        uint8_t mask[16 * 16], cut[16 * 16];
        for (int i = 0; i < n; i++) {
            tok[i] = 3 + rnd(509);
            pos[i] = clen + rnd(i + 1);
            for (int j = 0; j < n; j++) mask[i * n + j] = j < i && rnd(2);
        }
        float *h = malloc(sizeof(float) * n * M.c.dim), *lg = malloc(sizeof(float) * n * V),
              *lc = malloc(sizeof(float) * n * V);
        int s = kv_fork(&KV, ctx, clen);
        for (int i = 0; i < n; i++) seqs[i] = s;
        Batch b = {n, tok, seqs, pos, NULL, mask};
        forward_layers(R, &KV, &b, 0, M.c.n_layers, h);
        final_logits(R, h, n, lg);
        kv_seq_free(&KV, s);
        for (int m = 1; m <= n; m++) {
            s = kv_fork(&KV, ctx, clen);
            for (int i = 0; i < m; i++)
                for (int j = 0; j < m; j++) cut[i * m + j] = mask[i * n + j];
            Batch c = {m, tok, seqs, pos, NULL, cut};
            for (int i = 0; i < m; i++) seqs[i] = s;
            forward_layers(R, &KV, &c, 0, M.c.n_layers, h);
            final_logits(R, h + (size_t)(m - 1) * M.c.dim, 1, lc);
            kv_seq_free(&KV, s);
            cases++;
            mism += memcmp(lc, lg + (size_t)(m - 1) * V, sizeof(float) * V) != 0;
        }
        kv_seq_free(&KV, ctx);
        free(h);
        free(lg);
        free(lc);
    }
    CHECK(mism == 0, "masks: %d of %d tokens differ when the batch is cut after them", mism, cases);
}

/* two sequences interleaved in one batch give each sequence's own result */
static void test_multi_seq(void) {
    int V = M.c.vocab_size, n = 12, tok[12], pos[12], seqs[12], a = prefill_context(7), b2 = prefill_context(3);
    int next[2] = {7, 3}, which[2] = {a, b2};
    for (int i = 0; i < n; i++) {
        int w = rnd(2);
        tok[i] = 3 + rnd(509);
        seqs[i] = which[w];
        pos[i] = next[w]++;
    }
    float *h = malloc(sizeof(float) * n * M.c.dim), *lg = malloc(sizeof(float) * n * V),
          *one = malloc(sizeof(float) * V);
    int fa = kv_fork(&KV, a, 7), fb = kv_fork(&KV, b2, 3);
    int fseq[12];
    for (int i = 0; i < n; i++) fseq[i] = seqs[i] == a ? fa : fb;
    Batch b = {n, tok, fseq, pos, NULL, NULL};
    forward_layers(R, &KV, &b, 0, M.c.n_layers, h);
    final_logits(R, h, n, lg);
    int mism = 0;
    for (int i = 0; i < n; i++) {
        int path[12], len = 0;
        for (int j = 0; j <= i; j++)
            if (seqs[j] == seqs[i]) path[len++] = j;
        sequential(seqs[i], seqs[i] == a ? 7 : 3, tok, path, len, one);
        mism += memcmp(one, lg + (size_t)i * V, sizeof(float) * V) != 0;
    }
    CHECK(mism == 0, "two sequences in one batch: %d tokens differ", mism);
    kv_seq_free(&KV, fa);
    kv_seq_free(&KV, fb);
    kv_seq_free(&KV, a);
    kv_seq_free(&KV, b2);
    free(h);
    free(lg);
    free(one);
}

/* layers [0,l) then [l,L) equal [0,L), for every l; per-layer fill levels in between */
static void test_layer_ranges(void) {
    int L = M.c.n_layers, n = 5, tok[5], pos[5], seqs[5], clen = 6, ctx = prefill_context(clen);
    for (int i = 0; i < n; i++) tok[i] = 3 + rnd(509), pos[i] = clen + i;
    float *full = malloc(sizeof(float) * n * M.c.dim), *part = malloc(sizeof(float) * n * M.c.dim);
    int s = kv_fork(&KV, ctx, clen);
    for (int i = 0; i < n; i++) seqs[i] = s;
    Batch b = {n, tok, seqs, pos, NULL, NULL};
    forward_layers(R, &KV, &b, 0, L, full);
    kv_seq_free(&KV, s);
    for (int l = 1; l < L; l++) {
        s = kv_fork(&KV, ctx, clen);
        for (int i = 0; i < n; i++) seqs[i] = s;
        forward_layers(R, &KV, &b, 0, l, part);
        CHECK(kv_len(&KV, s, l - 1) == clen + n && kv_len(&KV, s, l) == clen, "fill levels after [0,%d)", l);
        forward_layers(R, &KV, &b, l, L, part);
        CHECK(memcmp(full, part, sizeof(float) * n * M.c.dim) == 0, "layers [0,%d)+[%d,%d) differ from [0,%d)", l, l, L,
              L);
        kv_seq_free(&KV, s);
    }
    kv_seq_free(&KV, ctx);
    free(full);
    free(part);
}

/* rollback: truncate, redo, same logits; keep_path compacts a tree branch */
static void test_rollback(void) {
    int V = M.c.vocab_size, s = prefill_context(10), tok[4] = {100, 200, 300, 400}, pos[4], seqs[4] = {s, s, s, s};
    float *h = malloc(sizeof(float) * 4 * M.c.dim), *a = malloc(sizeof(float) * V), *b2 = malloc(sizeof(float) * V);
    for (int i = 0; i < 4; i++) pos[i] = 10 + i;
    Batch b = {4, tok, seqs, pos, NULL, NULL};
    forward_layers(R, &KV, &b, 0, M.c.n_layers, h);
    final_logits(R, h + 3 * M.c.dim, 1, a);
    kv_truncate(&KV, s, 10);
    CHECK(kv_len(&KV, s, 0) == 10, "truncate");
    forward_layers(R, &KV, &b, 0, M.c.n_layers, h);
    final_logits(R, h + 3 * M.c.dim, 1, b2);
    CHECK(memcmp(a, b2, sizeof(float) * V) == 0, "decode after rollback differs");
    /* a tree: two siblings at position 10, the second has a child; keep that branch */
    kv_truncate(&KV, s, 10);
    int par[3] = {-1, -1, 1}, tt[3] = {55, 100, 200}, tp[3] = {10, 10, 11};
    Batch t = {3, tt, seqs, tp, par, NULL};
    forward_layers(R, &KV, &t, 0, M.c.n_layers, h);
    int path[2] = {1, 2};
    CHECK(kv_keep_path(&KV, s, 10, path, 2) == 0, "%s", pd_errmsg());
    Batch rest = {2, tok + 2, seqs, pos + 2, NULL, NULL};
    forward_layers(R, &KV, &rest, 0, M.c.n_layers, h);
    final_logits(R, h + M.c.dim, 1, b2);
    CHECK(memcmp(a, b2, sizeof(float) * V) == 0, "decode after keeping a tree branch differs");
    kv_seq_free(&KV, s);
    free(h);
    free(a);
    free(b2);
}

static void test_bad_batches(void) {
    int s = kv_seq_new(&KV), tok = 5, big = 100000, pos = 0, far = M.c.seq_len, par = 0;
    float h[512];
    Batch b = {1, &big, &s, &pos, NULL, NULL};
    CHECK(forward_layers(R, &KV, &b, 0, 1, h) == -1, "token outside the vocabulary accepted");
    Batch c = {1, &tok, &s, &far, NULL, NULL};
    CHECK(forward_layers(R, &KV, &c, 0, 1, h) == -1, "position past the context accepted");
    Batch d = {1, &tok, &s, &pos, &par, NULL};
    CHECK(forward_layers(R, &KV, &d, 0, 1, h) == -1, "a token that is its own parent accepted");
    CHECK(forward_layers(R, &KV, &c, 2, 1, h) == -1, "empty layer range accepted");
    kv_seq_free(&KV, s);
}

int main(void) {
    if (test_model_load(&M) || !(R = runner_new(&M))) return check_done("forward");
    kv_init(&KV, &M.c, 16, 16 * 128, 16);
    k_init(1);
    test_reference();
    test_trees(1);
    test_trees(2);
    k_init(1);
    test_masks();
    test_multi_seq();
    test_layer_ranges();
    test_rollback();
    test_bad_batches();
    kv_free(&KV);
    runner_free(R);
    model_free(&M);
    return check_done("forward");
}
