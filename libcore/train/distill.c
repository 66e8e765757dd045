/* distill.c — see distill.h. Per training sequence: one forward pass of the frozen
   model, stopping at each head's layer to keep the residual stream; the final
   distribution; then for every head its logits, KL and gradient. Rows are the
   positions of the sequence, so every product is one call over all of them, on the
   runner's device. */
#include "train/distill.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"

/* sixteen partial sums: the compiler turns the inner loop into one vector FMA */
static float dot(const float *a, const float *b, int n) {
    float acc[16] = {0}, s = 0;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) acc[j] += a[i + j] * b[i + j];
    for (; i < n; i++) s += a[i] * b[i];
    for (int j = 0; j < 16; j++) s += acc[j];
    return s;
}

/* E^T [dim][vocab] in lm_head's own weight type, packed for k_matmul */
void pack_transposed(void *dst, const void *W, WType wt, int rows, int cols, void *tmp) {
    size_t es = wt == WT_F32 ? 4 : 2;
    char *tr = tmp;
    const char *w = W;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) memcpy(tr + ((size_t)c * rows + r) * es, w + ((size_t)r * cols + c) * es, es);
    const void *src[1] = {tr};
    int n[1] = {cols};
    k_pack(dst, wt, rows, 1, src, n);
}

static int pack_Et(Distill *d) {
    const Model *m = d->m;
    int D = m->c.dim, V = m->c.vocab_size;
    WType wt = m->lm_head.t;
    if (!m->lm_head.w) return pd_error("distill: the model's output embedding is not readable");
    char *tr = pd_alloc(pd_mul(pd_mul((size_t)D, V), wt == WT_F32 ? 4 : 2));
    d->Et = pd_alloc(k_packed_bytes(wt, D, V) + 64);
    if (!tr || !d->Et) {
        free(tr);
        return -1;
    }
    /* k_pack wants 64-byte alignment: place it inside the over-allocation */
    d->Et_packed = (void *)(((uintptr_t)d->Et + 63) & ~(uintptr_t)63);
    pack_transposed(d->Et_packed, m->lm_head.w, wt, V, D, tr);
    free(tr);
    return mat_load(d->run, &d->Et_dev, d->Et_packed, wt, D, V);
}

/* a check vocabulary's rows of E (the heads' packed copy) and their transpose, where the
   runner multiplies */
static int pack_Ec(Distill *d) {
    const ExitHeads *h = d->h;
    int D = d->m->c.dim, K = h->n_vocab;
    if (!K) return 0;
    float *rows = pd_alloc(pd_mul(pd_mul(sizeof(float), K), D)), *tr = pd_alloc(pd_mul(pd_mul(sizeof(float), K), D));
    d->EcT = pd_alloc(k_packed_bytes(WT_F32, D, K) + 64);
    int rc = !rows || !tr || !d->EcT;
    for (int i = 0; i < K && !rc; i++) model_lm_head_row(d->m, h->vocab[i], rows + (size_t)i * D);
    void *packed = d->EcT ? (void *)(((uintptr_t)d->EcT + 63) & ~(uintptr_t)63) : NULL;
    if (!rc) pack_transposed(packed, rows, WT_F32, K, D, tr);
    free(rows), free(tr);
    if (rc) return -1;
    return mat_load(d->run, &d->Ec_dev, h->Ep.p, WT_F32, K, D) || mat_load(d->run, &d->EcT_dev, packed, WT_F32, D, K);
}

int distill_init(Distill *d, Model *m, ExitHeads *h, int max_len, float lr) {
    memset(d, 0, sizeof *d);
    const Config *c = &m->c;
    if (max_len < 1 || max_len > c->seq_len)
        return pd_error("distill: sequences of %d tokens; the model's context holds %d", max_len, c->seq_len);
    if (h->dim != c->dim) return pd_error("distill: heads of dim %d for a model of dim %d", h->dim, c->dim);
    d->m = m;
    d->h = h;
    d->lr = lr;
    d->cap = max_len;
    size_t D = c->dim, V = c->vocab_size, N = max_len, dd = pd_mul(D, D) * sizeof(float);
    size_t ad = dd + (D + 1) * sizeof(float); /* Adam's state: T's, then a check vocabulary's (r, b) */
    int rc = !(d->run = runner_new(m)) || kv_init(&d->kv, c, 1, max_len, 16) || pack_Et(d) || pack_Ec(d);
    for (int k = 0; k < h->n && !rc; k++)
        rc = !(d->adam_m[k] = pd_alloc(ad)) || !(d->adam_v[k] = pd_alloc(ad)) || !(d->grad[k] = pd_alloc(dd)) ||
             !(d->grad_rest[k] = pd_alloc((D + 1) * sizeof(float)));
    if (!rc) {
        d->hid = pd_alloc(pd_mul(N * D, sizeof(float)));
        d->hl = pd_alloc(pd_mul(pd_mul(N * D, sizeof(float)), h->n));
        d->pL = pd_alloc(pd_mul(pd_mul(N, V), sizeof(float)));
        d->logits = pd_alloc(pd_mul(pd_mul(N, V), sizeof(float)));
        d->negH = pd_alloc(N * sizeof(float));
        d->argL = pd_alloc(N * sizeof(int));
        d->pos = pd_alloc(N * sizeof(int32_t));
        d->x = pd_alloc(pd_mul(N * D, sizeof(float)));
        d->z = pd_alloc(pd_mul(N * D, sizeof(float)));
        d->dz = pd_alloc(pd_mul(N * D, sizeof(float)));
        d->xT = pd_alloc(pd_mul(N * D, sizeof(float)));
        d->dzT = pd_alloc(pd_mul(N * D, sizeof(float)));
        d->xTp_buf = pd_alloc(k_packed_bytes(WT_F32, (int)D, (int)N) + 64);
        d->dT = pd_alloc(dd);
        d->exited = pd_alloc(N * EXIT_N_GAMMA);
        d->pC = pd_alloc((h->n_vocab + 1) * sizeof(float));
        d->grest = pd_alloc(N * sizeof(float));
        rc = !d->exited || !d->pC || !d->grest || !d->hid || !d->hl || !d->pL || !d->logits || !d->negH || !d->argL ||
             !d->pos || !d->x || !d->z || !d->dz || !d->xT || !d->dzT || !d->xTp_buf || !d->dT;
    }
    if (rc) {
        distill_free(d);
        return -1;
    }
    d->xTp = (void *)(((uintptr_t)d->xTp_buf + 63) & ~(uintptr_t)63);
    for (int i = 0; i < max_len; i++) d->pos[i] = i;
    return 0;
}

void distill_free(Distill *d) {
    for (int k = 0; k < MAX_EXIT_HEADS; k++) {
        free(d->grad_rest[k]);
        free(d->adam_m[k]);
        free(d->adam_v[k]);
        free(d->grad[k]);
    }
    free(d->Et), free(d->EcT), free(d->pC), free(d->grest);
    free(d->hid);
    free(d->hl);
    free(d->pL);
    free(d->logits);
    free(d->negH);
    free(d->argL);
    free(d->pos);
    free(d->x);
    free(d->z);
    free(d->dz);
    free(d->xT);
    free(d->dzT);
    free(d->xTp_buf);
    free(d->dT);
    free(d->exited);
    if (d->kv.arena.base) kv_free(&d->kv);
    if (d->run) mat_free(d->run, &d->Et_dev), mat_free(d->run, &d->xT_dev);
    if (d->run) mat_free(d->run, &d->Ec_dev), mat_free(d->run, &d->EcT_dev);
    runner_free(d->run);
    memset(d, 0, sizeof *d);
}

/* p_L, Σ p_L log p_L and argmax p_L of n final hidden states */
static int targets(Distill *d, const float *hL, int n) {
    int V = d->m->c.vocab_size;
    if (final_logits(d->run, hL, n, d->pL)) return -1;
    for (int t = 0; t < n; t++) {
        float *p = d->pL + (size_t)t * V, *raw = d->logits + (size_t)t * V, mx;
        memcpy(raw, p, sizeof(float) * V);
        d->argL[t] = k_argmax(raw, V);
        float s = k_exp_sum(p, V, &mx), inv = 1.0f / s;
        d->negH[t] = dot(p, raw, V) * inv - mx - logf(s);
        for (int i = 0; i < V; i++) p[i] *= inv;
    }
    return 0;
}

typedef struct {
    double kl, top1, cover[EXIT_N_GAMMA], hit[EXIT_N_GAMMA];
    /* the first-exit rule: exits that happen at this head, and how many agree */
    double first[EXIT_N_GAMMA], first_hit[EXIT_N_GAMMA];
} Tally;

static int outer_grad(Distill *d, int n, float *grad);

/* head k's input x (normed or not) and z = T x, for n hidden states h */
static void head_input(Distill *d, int k, const float *h, int n) {
    const Model *m = d->m;
    if (d->h->norm) k_rmsnorm(d->x, h, m->final_norm, n, m->c.dim, m->c.norm_eps);
    else memcpy(d->x, h, sizeof(float) * n * m->c.dim);
    linear_apply(&d->h->Tp[k], d->z, d->x, n);
}

/* head k on n positions (targets already set): Σ KL into *loss; statistics into
   tally; Σ dKL/dT added into grad */
static int head_pass(Distill *d, int k, const float *h, int n, double *loss, Tally *tally, float *grad) {
    int V = d->m->c.vocab_size;
    head_input(d, k, h, n);
    if (mat_mul_lm_head(d->run, d->logits, d->z, n)) return -1;
    double sum = 0;
    for (int t = 0; t < n; t++) {
        float *row = d->logits + (size_t)t * V, mx;
        const float *p = d->pL + (size_t)t * V;
        float cross = dot(p, row, V);
        int arg = tally ? k_argmax(row, V) : 0;
        float s = k_exp_sum(row, V, &mx), inv = 1.0f / s;
        sum += d->negH[t] - cross + mx + logf(s); /* Σ p_L log p_L - Σ p_L log p_l */
        if (tally) {
            int agree = arg == d->argL[t];
            tally->top1 += agree;
            for (int g = 0; g < EXIT_N_GAMMA; g++) {
                if (inv < exit_gamma[g]) continue; /* max p_l = e^0 / s */
                tally->cover[g]++, tally->hit[g] += agree;
                signed char *e = &d->exited[t * EXIT_N_GAMMA + g];
                if (*e < 0) *e = (signed char)agree, tally->first[g]++, tally->first_hit[g] += agree;
            }
        }
        if (grad)
            for (int i = 0; i < V; i++) row[i] = row[i] * inv - p[i]; /* dKL/dlogits = p_l - p_L */
    }
    *loss += sum;
    if (tally) tally->kl += sum;
    if (!grad) return 0;
    /* dz[n][D] = g[n][V] · E ; then grad[i][j] += Σ_t dz[t][i] x[t][j] as dzT · xT^T */
    if (mat_mul(d->run, &d->Et_dev, d->dz, d->logits, n)) return -1;
    return outer_grad(d, n, grad);
}

/* grad[i][j] += Σ_t dz[t][i] x[t][j], as dzT · xT^T */
static int outer_grad(Distill *d, int n, float *grad) {
    int D = d->m->c.dim;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < D; i++) {
            d->dzT[(size_t)i * n + t] = d->dz[(size_t)t * D + i];
            d->xT[(size_t)i * n + t] = d->x[(size_t)t * D + i];
        }
    const void *src[1] = {d->xT};
    int rows[1] = {D};
    k_pack(d->xTp, WT_F32, n, 1, src, rows);
    if (mat_load(d->run, &d->xT_dev, d->xTp, WT_F32, D, n) || mat_mul(d->run, &d->xT_dev, d->dT, d->dzT, D)) return -1;
    k_add(grad, d->dT, (size_t)D * D);
    return 0;
}

/* the same for a head with a check vocabulary C: its K + 1 logits (E_C z, then the rest's
   r·z + b) against p_L gathered the same way (C's, then 1 − their sum); Σ dKL/d(r, b) added
   into grad_rest */
static int head_pass_vocab(Distill *d, int k, const float *h, int n, double *loss, Tally *tally, float *grad,
                           float *grad_rest) {
    const Model *m = d->m;
    const ExitHeads *H = d->h;
    int D = m->c.dim, V = m->c.vocab_size, K = H->n_vocab, W = K + 1;
    const float *r = H->rest[k];
    head_input(d, k, h, n);
    if (mat_mul(d->run, &d->Ec_dev, d->logits, d->z, n)) return -1;
    for (int t = n - 1; t >= 0; t--) { /* rows K + 1 apart, the rest's logit last */
        float *row = d->logits + (size_t)t * W;
        memmove(row, d->logits + (size_t)t * K, sizeof(float) * K);
        row[K] = dot(r, d->z + (size_t)t * D, D) + r[D];
    }
    double sum = 0;
    for (int t = 0; t < n; t++) {
        float *row = d->logits + (size_t)t * W, *P = d->pC, mx;
        const float *p = d->pL + (size_t)t * V;
        double in = 0, negH = 0;
        for (int i = 0; i < K; i++) in += P[i] = p[H->vocab[i]];
        P[K] = in < 1 ? (float)(1 - in) : 0.0f;
        for (int i = 0; i < W; i++) negH += P[i] > 0 ? P[i] * log(P[i]) : 0;
        float cross = dot(P, row, W);
        int arg = tally ? k_argmax(row, W) : 0;
        float s = k_exp_sum(row, W, &mx), inv = 1.0f / s;
        sum += negH - cross + mx + logf(s);
        if (tally) { /* the rest as the most likely never exits, nor agrees */
            int agree = arg < K && H->vocab[arg] == d->argL[t];
            tally->top1 += agree;
            for (int g = 0; g < EXIT_N_GAMMA && arg < K; g++) {
                if (inv < exit_gamma[g]) continue;
                tally->cover[g]++, tally->hit[g] += agree;
                signed char *e = &d->exited[t * EXIT_N_GAMMA + g];
                if (*e < 0) *e = (signed char)agree, tally->first[g]++, tally->first_hit[g] += agree;
            }
        }
        if (grad)
            for (int i = 0; i < W; i++) row[i] = row[i] * inv - P[i];
    }
    *loss += sum;
    if (tally) tally->kl += sum;
    if (!grad) return 0;
    /* dz = E_C^T g_C + g_rest r; d(r, b) += g_rest (z, 1) */
    for (int t = 0; t < n; t++) {
        float g = d->logits[(size_t)t * W + K];
        const float *z = d->z + (size_t)t * D;
        d->grest[t] = g;
        memmove(d->logits + (size_t)t * K, d->logits + (size_t)t * W, sizeof(float) * K);
        for (int j = 0; j < D; j++) grad_rest[j] += g * z[j];
        grad_rest[D] += g;
    }
    if (mat_mul(d->run, &d->EcT_dev, d->dz, d->logits, n)) return -1;
    for (int t = 0; t < n; t++)
        for (int j = 0; j < D; j++) d->dz[(size_t)t * D + j] += d->grest[t] * r[j];
    return outer_grad(d, n, grad);
}

static int pass(Distill *d, int k, const float *h, int n, double *loss, Tally *tally, int train) {
    float *g = train ? d->grad[k] : NULL;
    if (d->h->n_vocab) return head_pass_vocab(d, k, h, n, loss, tally, g, train ? d->grad_rest[k] : NULL);
    return head_pass(d, k, h, n, loss, tally, g);
}

int distill_head_loss(Distill *d, int k, const float *h, const float *hL, int n, double *loss, float *grad,
                      float *grad_rest) {
    if (k < 0 || k >= d->h->n) return pd_error("distill: no head %d", k);
    if (n < 1 || n > d->cap) return pd_error("distill: %d positions; 1 to %d fit", n, d->cap);
    if (grad && d->h->n_vocab && !grad_rest) return pd_error("distill: a head with a check vocabulary needs grad_rest");
    if (targets(d, hL, n)) return -1;
    *loss = 0;
    if (d->h->n_vocab) return head_pass_vocab(d, k, h, n, loss, NULL, grad, grad_rest);
    return head_pass(d, k, h, n, loss, NULL, grad);
}

/* the frozen model over one sequence: the residual stream after each head's layer
   into hl, after the last layer into hid */
static int forward_seq(Distill *d, const int32_t *tok, int n) {
    const Config *c = &d->m->c;
    int s = kv_seq_new(&d->kv), at = 0, rc = 0;
    if (s < 0) return -1;
    Batch b = {n, tok, NULL, d->pos, NULL, NULL};
    for (int k = 0; k < d->h->n && !rc; k++) {
        rc = forward_layers(d->run, &d->kv, &b, at, d->h->layer[k], d->hid);
        memcpy(d->hl + (size_t)k * d->cap * c->dim, d->hid, sizeof(float) * n * c->dim);
        at = d->h->layer[k];
    }
    rc = rc ? rc : forward_layers(d->run, &d->kv, &b, at, c->n_layers, d->hid);
    kv_seq_free(&d->kv, s);
    return rc;
}

/* forward, targets, then every head (statistics into tally[k] when given) */
static int run_seq(Distill *d, const int32_t *tok, int n, double *loss, Tally *tally, int train) {
    if (n > d->cap) return pd_error("distill: a sequence of %d tokens; %d fit", n, d->cap);
    if (forward_seq(d, tok, n) || targets(d, d->hid, n)) return -1;
    memset(d->exited, -1, (size_t)n * EXIT_N_GAMMA);
    for (int k = 0; k < d->h->n; k++)
        if (pass(d, k, d->hl + (size_t)k * d->cap * d->m->c.dim, n, &loss[k], tally ? &tally[k] : NULL, train))
            return -1;
    return 0;
}

void adam_update(float *w, const float *g, float *m, float *v, size_t n, int t, float lr) {
    const float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
    float c1 = (float)(1 - pow(beta1, t)), c2 = (float)(1 - pow(beta2, t));
    for (size_t i = 0; i < n; i++) {
        m[i] = beta1 * m[i] + (1 - beta1) * g[i];
        v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
        w[i] -= lr * (m[i] / c1) / (sqrtf(v[i] / c2) + eps);
    }
}

float distill_lr(float base, long s, long n) {
    return n > 0 ? (float)(base * 0.5 * (1 + cos(M_PI * (double)s / (double)n))) : base;
}

int distill_step(Distill *d, const Sequences *s, const int *idx, int b, double *loss) {
    int H = d->h->n;
    size_t DD = (size_t)d->h->dim * d->h->dim;
    double sum[MAX_EXIT_HEADS] = {0};
    int64_t positions = 0;
    for (int k = 0; k < H; k++) memset(d->grad[k], 0, sizeof(float) * DD);
    for (int k = 0; k < H && d->h->n_vocab; k++) memset(d->grad_rest[k], 0, sizeof(float) * (d->h->dim + 1));
    for (int i = 0; i < b; i++) {
        if (idx[i] < 0 || idx[i] >= s->n) return pd_error("distill: no sequence %d", idx[i]);
        int n = seq_len_of(s, idx[i]);
        if (run_seq(d, s->tok + s->off[idx[i]], n, sum, NULL, 1)) return -1;
        positions += n;
    }
    if (!positions) return pd_error("distill: an empty batch");
    d->t++;
    for (int k = 0; k < H; k++) {
        float *T = (float *)d->h->T[k], inv = 1.0f / (float)positions;
        for (size_t i = 0; i < DD; i++) d->grad[k][i] *= inv;
        adam_update(T, d->grad[k], d->adam_m[k], d->adam_v[k], DD, d->t, d->lr);
        heads_set_T(d->h, k, T);
        if (d->h->n_vocab) {
            int R = d->h->dim + 1;
            for (int i = 0; i < R; i++) d->grad_rest[k][i] *= inv;
            adam_update(d->h->rest[k], d->grad_rest[k], d->adam_m[k] + DD, d->adam_v[k] + DD, R, d->t, d->lr);
            heads_set_rest(d->h, k, d->h->rest[k]);
        }
        if (loss) loss[k] = sum[k] / positions;
    }
    return 0;
}

int distill_eval(Distill *d, const Sequences *s, HeadStats *out, ExitStats *first) {
    int H = d->h->n;
    Tally tally[MAX_EXIT_HEADS];
    double sum[MAX_EXIT_HEADS] = {0};
    memset(tally, 0, sizeof tally);
    int64_t positions = 0;
    for (int i = 0; i < s->n; i++) {
        int n = seq_len_of(s, i);
        if (run_seq(d, s->tok + s->off[i], n, sum, tally, 0)) return -1;
        positions += n;
    }
    if (!positions) return pd_error("distill: nothing to evaluate");
    for (int k = 0; k < H; k++) {
        HeadStats *o = &out[k];
        o->kl = tally[k].kl / positions;
        o->top1 = tally[k].top1 / positions;
        for (int g = 0; g < EXIT_N_GAMMA; g++) {
            o->cover[g] = tally[k].cover[g] / positions;
            o->prec[g] = tally[k].cover[g] ? tally[k].hit[g] / tally[k].cover[g] : 1;
        }
    }
    for (int g = 0; first && g < EXIT_N_GAMMA; g++) {
        double exits = 0, hits = 0, layers = 0;
        for (int k = 0; k < H; k++) {
            exits += tally[k].first[g];
            hits += tally[k].first_hit[g];
            layers += tally[k].first[g] * d->h->layer[k];
        }
        first->rate[g] = exits / positions;
        first->prec[g] = exits ? hits / exits : 1;
        first->layers[g] = (layers + (positions - exits) * d->m->c.n_layers) / positions;
    }
    return 0;
}

int distill_choose_norm(Distill *d, const Sequences *s, HeadStats *before, double kl[2]) {
    HeadStats st[2][MAX_EXIT_HEADS];
    int H = d->h->n;
    for (int norm = 0; norm < 2; norm++) {
        d->h->norm = norm; /* T = I either way: only the input changes */
        if (distill_eval(d, s, st[norm], NULL)) return -1;
        kl[norm] = 0;
        for (int k = 0; k < H; k++) kl[norm] += st[norm][k].kl;
    }
    d->h->norm = kl[1] < kl[0];
    memcpy(before, st[d->h->norm], sizeof(HeadStats) * H);
    return 0;
}

/* ---- visiting order ---- */

static uint64_t next_rand(uint64_t *s) { /* xorshift64* */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1DULL;
}

static void shuffle(SeqOrder *o) {
    for (int i = o->n - 1; i > 0; i--) {
        int j = (int)(next_rand(&o->rng) % (uint64_t)(i + 1)), t = o->perm[i];
        o->perm[i] = o->perm[j];
        o->perm[j] = t;
    }
    o->at = 0;
}

int order_init(SeqOrder *o, int n, uint64_t seed) {
    memset(o, 0, sizeof *o);
    if (n < 1) return pd_error("distill: no training sequences");
    if (!(o->perm = pd_alloc(sizeof(int) * n))) return -1;
    o->n = n;
    o->rng = (seed * 0x9E3779B97F4A7C15ULL) | 1; /* never the all-zero state */
    for (int i = 0; i < n; i++) o->perm[i] = i;
    shuffle(o);
    return 0;
}

void order_next(SeqOrder *o, int *idx, int b) {
    for (int i = 0; i < b; i++) {
        if (o->at == o->n) shuffle(o);
        idx[i] = o->perm[o->at++];
    }
}

void order_free(SeqOrder *o) {
    free(o->perm);
    memset(o, 0, sizeof *o);
}

int distill_auto_layers(int n_layers, int *layers) {
    int n = 0;
    if (n_layers <= 8) /* small models: a head after every layer but the last */
        for (int l = 1; l < n_layers; l++) layers[n++] = l;
    else /* the paper's placement: a quarter, half and three quarters deep (8, 16, 24 of 32) */
        for (int q = 1; q <= 3; q++) {
            int l = (n_layers * q + 2) / 4; /* rounded half up */
            if (!n || l > layers[n - 1]) layers[n++] = l;
        }
    return n;
}
