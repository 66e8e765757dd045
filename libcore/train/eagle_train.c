/* eagle_train.c — see eagle_train.h. Per sequence: the draft's forward over all its
   positions (rows), the two losses, then the backward pass layer by layer in reverse.
   Every product over the rows is one mat_mul on the runner's device: W for the
   forward, Wᵀ (packed once a step) for the inputs' gradients, and for a weight's
   gradient dW = dYᵀ X the rows' activations transposed and packed as the matrix. */
#include "train/eagle_train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "train/distill.h" /* adam_update */

const char *const eagle_tensor_name[EAGLE_TENSORS] = {"fc", "attn_norm", "wq", "wk", "wv",
                                                      "wo", "ffn_norm",  "w1", "w3", "w2"};

size_t eagle_tensor_size(const Config *c, int k) {
    size_t D = c->dim, F = c->hidden_dim, Q = (size_t)c->n_heads * c->head_dim,
           KV = (size_t)c->n_kv_heads * c->head_dim;
    switch (k) {
    case EAGLE_FC:
        return D * 2 * D;
    case EAGLE_ATTN_NORM:
    case EAGLE_FFN_NORM:
        return D;
    case EAGLE_WQ:
        return Q * D;
    case EAGLE_WK:
    case EAGLE_WV:
        return KV * D;
    case EAGLE_WO:
        return D * Q;
    case EAGLE_W1:
    case EAGLE_W3:
    case EAGLE_W2:
        return F * D;
    }
    return 0;
}

float *eagle_tensor(EagleParams *p, int k) {
    float *const all[EAGLE_TENSORS] = {p->fc, p->attn_norm, p->wq, p->wk, p->wv,
                                       p->wo, p->ffn_norm,  p->w1, p->w3, p->w2};
    return k >= 0 && k < EAGLE_TENSORS ? all[k] : NULL;
}

int eagle_grad_init(EagleGrad *g, const Config *c) {
    memset(g, 0, sizeof *g);
    size_t total = 0;
    for (int k = 0; k < EAGLE_TENSORS; k++) total += (g->n[k] = eagle_tensor_size(c, k));
    if (!(g->mem = pd_alloc(pd_mul(total, sizeof(float))))) return -1;
    size_t at = 0;
    for (int k = 0; k < EAGLE_TENSORS; at += g->n[k], k++) g->t[k] = g->mem + at;
    return 0;
}

void eagle_grad_zero(EagleGrad *g) {
    for (int k = 0; k < EAGLE_TENSORS; k++) memset(g->t[k], 0, sizeof(float) * g->n[k]);
}

void eagle_grad_free(EagleGrad *g) {
    free(g->mem);
    memset(g, 0, sizeof *g);
}

static void *align64(void *p) { return (void *)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

/* [rows][cols] → [cols][rows] */
static void transpose(float *dst, const float *src, int rows, int cols) {
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) dst[(size_t)j * rows + i] = src[(size_t)i * cols + j];
}

/* a dot product in 16 partial sums (the compiler keeps them in one vector) */
static float dot(const float *restrict a, const float *restrict b, int n) {
    float acc[16] = {0}, s = 0;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += a[i + l] * b[i + l];
    for (; i < n; i++) s += a[i] * b[i];
    for (int l = 0; l < 16; l++) s += acc[l];
    return s;
}

/* y += a x, in blocks of 16 the compiler keeps in one vector */
static void axpy(float *restrict y, float a, const float *restrict x, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) y[i + l] += a * x[i + l];
    for (; i < n; i++) y[i] += a * x[i];
}

/* ---- packed matrices ---- */

static int packed_alloc(EaglePacked *P, int rows, int cols) {
    if (!(P->buf = pd_alloc(k_packed_bytes(WT_F32, rows, cols) + 64))) return -1;
    P->pk = align64(P->buf);
    return 0;
}

static void packed_free(Runner *r, EaglePacked *P) {
    if (r) mat_free(r, &P->dev);
    free(P->buf);
    memset(P, 0, sizeof *P);
}

/* P = the sources' rows stacked, [Σ rows][cols] */
static int packed_set(EagleTrain *t, EaglePacked *P, int n_src, const float *const *src, const int *rows, int cols) {
    const void *s[3];
    int total = 0;
    for (int i = 0; i < n_src; i++) s[i] = src[i], total += rows[i];
    k_pack(P->pk, WT_F32, cols, n_src, s, rows);
    return mat_load(t->run, &P->dev, P->pk, WT_F32, total, cols);
}

/* P = (the sources' rows stacked)ᵀ, [cols][Σ rows] */
static int packed_set_T(EagleTrain *t, EaglePacked *P, int n_src, const float *const *src, const int *rows, int cols) {
    int total = 0;
    for (int i = 0; i < n_src; i++) total += rows[i];
    for (int i = 0, r0 = 0; i < n_src; r0 += rows[i], i++)
        for (int r = 0; r < rows[i]; r++)
            for (int c = 0; c < cols; c++) t->wtmp[(size_t)c * total + r0 + r] = src[i][(size_t)r * cols + c];
    const float *one[1] = {t->wtmp};
    return packed_set(t, P, 1, one, &cols, total);
}

/* the trainable weights as they are now, both ways */
static int pack_weights(EagleTrain *t) {
    const EagleParams *p = t->p;
    int D = t->dim, F = t->hidden, Q = t->qd, KV = t->kvd;
    const float *qkv[3] = {p->wq, p->wk, p->wv}, *w13[2] = {p->w1, p->w3}, *fc[1] = {p->fc}, *wo[1] = {p->wo},
                *w2[1] = {p->w2};
    int rq[3] = {Q, KV, KV}, r13[2] = {F, F};
    if (packed_set(t, &t->fc, 1, fc, &D, 2 * D) || packed_set(t, &t->qkv, 3, qkv, rq, D) ||
        packed_set(t, &t->wo, 1, wo, &D, Q) || packed_set(t, &t->w13, 2, w13, r13, D) ||
        packed_set(t, &t->w2, 1, w2, &D, F))
        return -1;
    return packed_set_T(t, &t->fcT, 1, fc, &D, 2 * D) || packed_set_T(t, &t->qkvT, 3, qkv, rq, D) ||
                   packed_set_T(t, &t->woT, 1, wo, &D, Q) || packed_set_T(t, &t->w13T, 2, w13, r13, D) ||
                   packed_set_T(t, &t->w2T, 1, w2, &D, F)
               ? -1
               : 0;
}

/* g[out][in] += Σ_i dY[i][out] X[i][in] over n rows: dYᵀ [out][n] times the packed Xᵀ [in][n] */
static int weight_grad(EagleTrain *t, const float *dY, int out, const float *X, int in, int n, float *const *g,
                       const int *g_rows, int n_g) {
    transpose(t->wtmp, X, n, in);
    const float *one[1] = {t->wtmp};
    if (packed_set(t, &t->act, 1, one, &in, n)) return -1;
    transpose(t->dT, dY, n, out);
    if (mat_mul(t->run, &t->act.dev, t->dW, t->dT, out)) return -1;
    for (int i = 0, r0 = 0; i < n_g; r0 += g_rows[i], i++) k_add(g[i], t->dW + (size_t)r0 * in, (size_t)g_rows[i] * in);
    return 0;
}

/* ---- RMSNorm ---- */

/* y = g ⊙ x s row by row, s = 1 / sqrt(mean x² + eps) kept in rs[n] */
static void rms_forward(float *y, float *rs, const float *x, const float *g, int n, int D, float eps) {
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * D;
        double ss = 0;
        for (int d = 0; d < D; d++) ss += (double)xi[d] * xi[d];
        float s = (float)(1.0 / sqrt(ss / D + eps));
        rs[i] = s;
        for (int d = 0; d < D; d++) y[(size_t)i * D + d] = g[d] * (s * xi[d]);
    }
}

/* dx += s (g ⊙ dy) - (s³ / D) x Σ_d g_d dy_d x_d; dg (may be NULL) += Σ_rows dy ⊙ x s */
static void rms_backward(float *dx, float *dg, const float *dy, const float *x, const float *rs, const float *g, int n,
                         int D) {
    for (int i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * D, *dyi = dy + (size_t)i * D;
        float *dxi = dx + (size_t)i * D, s = rs[i];
        double c = 0;
        for (int d = 0; d < D; d++) c += (double)g[d] * dyi[d] * xi[d];
        float k = (float)(c * s * s * s / D);
        for (int d = 0; d < D; d++) dxi[d] += s * (g[d] * dyi[d]) - k * xi[d];
        if (dg)
            for (int d = 0; d < D; d++) dg[d] += dyi[d] * (xi[d] * s);
    }
}

static float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

/* ---- init ---- */

static size_t maxz(size_t a, size_t b) { return a > b ? a : b; }

static int alloc_all(EagleTrain *t) {
    size_t N = t->cap, D = t->dim, F = t->hidden, Q = t->qd, QKV = t->qkvd, K = t->K, H = t->n_heads;
    int rc = eagle_grad_init(&t->g, &t->p->c) || eagle_grad_init(&t->am, &t->p->c) || eagle_grad_init(&t->av, &t->p->c);
    size_t in = maxz(maxz(2 * D, Q), F), out = maxz(maxz(D, QKV), 2 * F);
    size_t wmax = 0;
    for (int k = 0; k < EAGLE_TENSORS; k++) wmax = maxz(wmax, eagle_tensor_size(&t->p->c, k));
    wmax = maxz(maxz(wmax, 2 * F * D), QKV * D); /* the stacked ones */
    rc = rc || packed_alloc(&t->fc, (int)D, (int)(2 * D)) || packed_alloc(&t->qkv, (int)QKV, (int)D) ||
         packed_alloc(&t->wo, (int)D, (int)Q) || packed_alloc(&t->w13, (int)(2 * F), (int)D) ||
         packed_alloc(&t->w2, (int)D, (int)F) || packed_alloc(&t->E, (int)K, (int)D) ||
         packed_alloc(&t->fcT, (int)(2 * D), (int)D) || packed_alloc(&t->qkvT, (int)D, (int)QKV) ||
         packed_alloc(&t->woT, (int)Q, (int)D) || packed_alloc(&t->w13T, (int)D, (int)(2 * F)) ||
         packed_alloc(&t->w2T, (int)F, (int)D) || packed_alloc(&t->ET, (int)D, (int)K) ||
         packed_alloc(&t->act, (int)in, (int)N);
    if (rc) return -1;
#define A(p, n) ((p) = pd_alloc(pd_mul((n), sizeof *(p))))
    for (int k = 0; k < t->depth; k++) {
        struct EagleStep *S = &t->st[k];
        if (!A(S->u, N * 2 * D) || !A(S->x, N * D) || !A(S->xa, N * D) || !A(S->qkvb, N * QKV) || !A(S->att, N * Q) ||
            !A(S->r1, N * D) || !A(S->xf, N * D) || !A(S->g13, N * 2 * F) || !A(S->hact, N * F) || !A(S->h, N * D) ||
            !A(S->fp, N * D) || !A(S->logits, N * K) || !A(S->rs_a, N) || !A(S->rs_f, N) || !A(S->rs_h, N) ||
            !A(S->P, H * (N * (N + 1) / 2 + N * k)) || !A(S->dfp, N * D) || !A(S->dqkv, N * QKV))
            return -1;
    }
    if (!A(t->wtmp, maxz(maxz(wmax, in * N), K * D)) || !A(t->dT, out * N) || !A(t->dW, wmax) ||
        !A(t->nsin, (size_t)t->m->c.seq_len * (t->hd / 2)) || !A(t->dh, N * D) || !A(t->dhact, N * F) ||
        !A(t->dg13, N * 2 * F) || !A(t->dxf, N * D) || !A(t->dr1, N * D) || !A(t->datt, N * Q) || !A(t->dxa, N * D) ||
        !A(t->dx, N * D) || !A(t->du, N * 2 * D) || !A(t->fx, N * D) || !A(t->hid, N * D) || !A(t->dp, N + t->depth) ||
        !A(t->arg, N) || !A(t->pos, N + t->depth) || !A(t->draft_of, (size_t)t->m->c.vocab_size))
        return -1;
#undef A
    return 0;
}

int eagle_train_init(EagleTrain *t, Model *m, EagleParams *p, int max_len, int steps, float lr) {
    memset(t, 0, sizeof *t);
    const Config *c = &m->c, *pc = &p->c;
    if (max_len < 2 || max_len > c->seq_len)
        return pd_error("eagle: sequences of %d tokens; 2 to the model's context (%d) fit", max_len, c->seq_len);
    if (steps < 1 || steps > EAGLE_MAX_STEPS)
        return pd_error("eagle: %d unrolled steps; 1 to %d are trained", steps, EAGLE_MAX_STEPS);
    if (pc->dim != c->dim || pc->hidden_dim != c->hidden_dim || pc->n_heads != c->n_heads ||
        pc->n_kv_heads != c->n_kv_heads || pc->head_dim != c->head_dim)
        return pd_error("eagle: a head of dim %d, hidden %d, heads %d/%d for a model of %d, %d, %d/%d", pc->dim,
                        pc->hidden_dim, pc->n_heads, pc->n_kv_heads, c->dim, c->hidden_dim, c->n_heads, c->n_kv_heads);
    if (pc->qkv_bias) return pd_error("eagle: training a layer with q/k/v biases is not supported");
    if (pc->vocab_size < 1 || pc->vocab_size > c->vocab_size)
        return pd_error("eagle: a draft vocabulary of %d for a model of %d tokens", pc->vocab_size, c->vocab_size);
    t->m = m, t->p = p, t->lr = lr, t->cap = max_len;
    t->steps = steps, t->depth = steps > EAGLE_EVAL_STEPS ? steps : EAGLE_EVAL_STEPS;
    t->w_reg = EAGLE_W_REG, t->w_ce = EAGLE_W_CE, t->clip = EAGLE_CLIP;
    t->dim = c->dim, t->hidden = c->hidden_dim, t->n_heads = c->n_heads, t->n_kv = c->n_kv_heads;
    t->hd = c->head_dim, t->K = pc->vocab_size;
    t->qd = t->n_heads * t->hd, t->kvd = t->n_kv * t->hd, t->qkvd = t->qd + 2 * t->kvd;
    if (!(t->run = runner_new(m)) || kv_init(&t->kv, c, 1, max_len, 16) || alloc_all(t)) {
        eagle_train_free(t);
        return -1;
    }
    for (int v = 0; v < c->vocab_size; v++) t->draft_of[v] = -1;
    for (int k = 0; k < t->K; k++) {
        int32_t v = p->vocab[k];
        if (v < 0 || v >= c->vocab_size || t->draft_of[v] >= 0) {
            eagle_train_free(t);
            return pd_error("eagle: draft token %d is target id %d: not a token, or twice", k, v);
        }
        t->draft_of[v] = k;
    }
    for (size_t i = 0; i < (size_t)c->seq_len * (t->hd / 2); i++) t->nsin[i] = -m->rope_sin[i];
    for (int i = 0; i < max_len + t->depth; i++) t->pos[i] = i;
    const float *E[1] = {p->emb};
    if (packed_set(t, &t->E, 1, E, &t->K, t->dim) || packed_set_T(t, &t->ET, 1, E, &t->K, t->dim)) {
        eagle_train_free(t);
        return -1;
    }
    return 0;
}

void eagle_train_free(EagleTrain *t) {
    Runner *r = t->run;
    EaglePacked *all[] = {&t->fc,   &t->qkv, &t->wo,   &t->w13, &t->w2, &t->E,  &t->fcT,
                          &t->qkvT, &t->woT, &t->w13T, &t->w2T, &t->ET, &t->act};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) packed_free(r, all[i]);
    eagle_grad_free(&t->g);
    eagle_grad_free(&t->am);
    eagle_grad_free(&t->av);
    for (int k = 0; k < EAGLE_MAX_STEPS; k++) {
        struct EagleStep *S = &t->st[k];
        float *f[] = {S->u, S->x,  S->xa,     S->qkvb, S->att,  S->r1,   S->xf, S->g13, S->hact,
                      S->h, S->fp, S->logits, S->rs_a, S->rs_f, S->rs_h, S->P,  S->dfp, S->dqkv};
        for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) free(f[i]);
    }
    float *f[] = {t->wtmp, t->nsin, t->dh, t->dhact, t->dg13, t->dxf, t->dr1, t->datt,
                  t->dxa,  t->dx,   t->du, t->dT,    t->dW,   t->fx,  t->hid, t->dp};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) free(f[i]);
    free(t->arg);
    free(t->pos);
    free(t->draft_of);
    if (t->kv.arena.base) kv_free(&t->kv);
    runner_free(r);
    memset(t, 0, sizeof *t);
}

/* ---- one sequence ---- */

/* row i of step k's attention weights (i + 1 + k of them) for head hh */
static float *att_row(const EagleTrain *t, int k, int hh, int i) {
    size_t per_head = (size_t)t->cap * (t->cap + 1) / 2 + (size_t)t->cap * k;
    return t->st[k].P + hh * per_head + (size_t)i * (i + 1) / 2 + (size_t)i * k;
}

/* the row of q/k/v entries key j of step k's row i reads: step 0's rows 0..i, then its
   chain, step j - i's row i */
static float *key_row(const EagleTrain *t, float *const *qkv, int i, int j) {
    return j <= i ? qkv[0] + (size_t)j * t->qkvd : qkv[j - i] + (size_t)i * t->qkvd;
}

/* step k's forward over n rows (inputs in_tok[n]; features feat[n][dim] at step 0, the
   step before's f' after) at positions k..k+n-1: every activation the backward pass
   reads, f' in st[k].fp and the logits in st[k].logits */
static int forward_step(EagleTrain *t, int k, const int32_t *in_tok, const float *feat, int n) {
    const Model *m = t->m;
    const EagleParams *p = t->p;
    struct EagleStep *S = &t->st[k];
    int D = t->dim, F = t->hidden, H = t->n_heads, hd = t->hd, Q = t->qd, KV = t->kvd;
    int per_kv = H / t->n_kv;
    float eps = m->c.norm_eps, scale = 1.0f / sqrtf((float)hd);
    if (k) feat = t->st[k - 1].fp;
    for (int i = 0; i < n; i++) {
        if (in_tok[i] < 0 || in_tok[i] >= m->c.vocab_size) return pd_error("eagle: token %d is not a token", in_tok[i]);
        k_row_to_f32(S->u + (size_t)i * 2 * D, m->embed.w, m->embed.t, in_tok[i], D);
        memcpy(S->u + (size_t)i * 2 * D + D, feat + (size_t)i * D, sizeof(float) * D);
    }
    if (mat_mul(t->run, &t->fc.dev, S->x, S->u, n)) return -1;
    rms_forward(S->xa, S->rs_a, S->x, p->attn_norm, n, D, eps);
    if (mat_mul(t->run, &t->qkv.dev, S->qkvb, S->xa, n)) return -1;
    k_rope(S->qkvb, t->qkvd, t->pos + k, n, H + t->n_kv, hd, m->rope_cos, m->rope_sin); /* q and k, as decoding */
    /* attention, head by head: P keeps the weights for the backward pass */
    float *qkv[EAGLE_MAX_STEPS];
    for (int s = 0; s <= k; s++) qkv[s] = t->st[s].qkvb;
    memset(S->att, 0, sizeof(float) * n * Q);
    for (int hh = 0; hh < H; hh++) {
        int g = hh / per_kv;
        for (int i = 0; i < n; i++) {
            const float *q = S->qkvb + (size_t)i * t->qkvd + hh * hd;
            float *pr = att_row(t, k, hh, i), mx = -INFINITY, sum = 0;
            for (int j = 0; j <= i + k; j++) {
                pr[j] = dot(q, key_row(t, qkv, i, j) + Q + g * hd, hd) * scale;
                mx = pr[j] > mx ? pr[j] : mx;
            }
            for (int j = 0; j <= i + k; j++) sum += (pr[j] = expf(pr[j] - mx));
            float inv = 1.0f / sum, *o = S->att + (size_t)i * Q + hh * hd;
            for (int j = 0; j <= i + k; j++) {
                pr[j] *= inv;
                axpy(o, pr[j], key_row(t, qkv, i, j) + Q + KV + g * hd, hd);
            }
        }
    }
    if (mat_mul(t->run, &t->wo.dev, S->r1, S->att, n)) return -1;
    k_add(S->r1, S->x, (size_t)n * D);
    rms_forward(S->xf, S->rs_f, S->r1, p->ffn_norm, n, D, eps);
    if (mat_mul(t->run, &t->w13.dev, S->g13, S->xf, n)) return -1;
    for (int i = 0; i < n; i++) {
        const float *g1 = S->g13 + (size_t)i * 2 * F, *g3 = g1 + F;
        float *a = S->hact + (size_t)i * F;
        for (int j = 0; j < F; j++) a[j] = g1[j] * sigmoid(g1[j]) * g3[j];
    }
    if (mat_mul(t->run, &t->w2.dev, S->h, S->hact, n)) return -1;
    k_add(S->h, S->r1, (size_t)n * D);
    rms_forward(S->fp, S->rs_h, S->h, p->norm, n, D, eps);
    return mat_mul(t->run, &t->E.dev, S->logits, S->fp, n);
}

/* step k's attention backward from datt: dq into its own dqkv, dk and dv into the dqkv
   of the rows read (step 0's and its chain's; a later step's share comes first) */
static void attention_backward(EagleTrain *t, int k, int n) {
    int H = t->n_heads, hd = t->hd, Q = t->qd, KV = t->kvd, R = t->qkvd, per_kv = H / t->n_kv;
    float scale = 1.0f / sqrtf((float)hd);
    float *qkv[EAGLE_MAX_STEPS], *dqkv[EAGLE_MAX_STEPS];
    for (int s = 0; s <= k; s++) qkv[s] = t->st[s].qkvb, dqkv[s] = t->st[s].dqkv;
    for (int hh = 0; hh < H; hh++) {
        int g = hh / per_kv;
        for (int i = 0; i < n; i++) {
            const float *pr = att_row(t, k, hh, i), *q = qkv[k] + (size_t)i * R + hh * hd;
            const float *dout = t->datt + (size_t)i * Q + hh * hd;
            float *dq = dqkv[k] + (size_t)i * R + hh * hd, sum = 0;
            for (int j = 0; j <= i + k; j++) { /* dL/dp_j = dout · v_j; v_j += p_j dout */
                t->dp[j] = dot(dout, key_row(t, qkv, i, j) + Q + KV + g * hd, hd);
                sum += pr[j] * t->dp[j];
                axpy(key_row(t, dqkv, i, j) + Q + KV + g * hd, pr[j], dout, hd);
            }
            for (int j = 0; j <= i + k; j++) { /* through the softmax: ds_j = p_j (dp_j - Σ p dp) */
                float ds = pr[j] * (t->dp[j] - sum) * scale;
                axpy(dq, ds, key_row(t, qkv, i, j) + Q + g * hd, hd);
                axpy(key_row(t, dqkv, i, j) + Q + g * hd, ds, q, hd);
            }
        }
    }
}

/* step k's backward pass from its dlogits (in st[k].logits) and df' (st[k].dfp: the
   losses', and the next step's through its input): every trainable tensor's gradient
   into g, and for k > 0 df' of the step before */
static int backward_step(EagleTrain *t, int k, int n, EagleGrad *g) {
    const EagleParams *p = t->p;
    struct EagleStep *S = &t->st[k];
    int D = t->dim, F = t->hidden, H = t->n_heads, hd = t->hd, Q = t->qd, KV = t->kvd, R = t->qkvd;
    /* f' = E_K… frozen: only df' = dlogits · E_K, then the final norm (frozen gain) */
    if (mat_mul(t->run, &t->ET.dev, t->dh, S->logits, n)) return -1;
    k_add(S->dfp, t->dh, (size_t)n * D);
    memset(t->dh, 0, sizeof(float) * n * D);
    rms_backward(t->dh, NULL, S->dfp, S->h, S->rs_h, p->norm, n, D);
    /* h = r1 + W2 (silu(W1 xf) ⊙ W3 xf) */
    memcpy(t->dr1, t->dh, sizeof(float) * n * D);
    float *g2[1] = {g->t[EAGLE_W2]};
    if (weight_grad(t, t->dh, D, S->hact, F, n, g2, &D, 1) || mat_mul(t->run, &t->w2T.dev, t->dhact, t->dh, n))
        return -1;
    for (int i = 0; i < n; i++) {
        const float *g1 = S->g13 + (size_t)i * 2 * F, *g3 = g1 + F, *da = t->dhact + (size_t)i * F;
        float *d1 = t->dg13 + (size_t)i * 2 * F, *d3 = d1 + F;
        for (int j = 0; j < F; j++) {
            float sg = sigmoid(g1[j]), silu = g1[j] * sg;
            d1[j] = da[j] * g3[j] * (sg * (1.0f + g1[j] * (1.0f - sg)));
            d3[j] = da[j] * silu;
        }
    }
    float *g13[2] = {g->t[EAGLE_W1], g->t[EAGLE_W3]};
    int r13[2] = {F, F};
    if (weight_grad(t, t->dg13, 2 * F, S->xf, D, n, g13, r13, 2) || mat_mul(t->run, &t->w13T.dev, t->dxf, t->dg13, n))
        return -1;
    rms_backward(t->dr1, g->t[EAGLE_FFN_NORM], t->dxf, S->r1, S->rs_f, p->ffn_norm, n, D);
    /* r1 = x + Wo attention(rope(Wq xa), rope(Wk xa), Wv xa) */
    memcpy(t->dx, t->dr1, sizeof(float) * n * D);
    float *go[1] = {g->t[EAGLE_WO]};
    if (weight_grad(t, t->dr1, D, S->att, Q, n, go, &D, 1) || mat_mul(t->run, &t->woT.dev, t->datt, t->dr1, n))
        return -1;
    attention_backward(t, k, n); /* this step's dqkv is whole now: no earlier step reads its rows */
    k_rope(S->dqkv, R, t->pos + k, n, H + t->n_kv, hd, t->m->rope_cos, t->nsin); /* Rᵀ: the inverse rotation */
    float *gqkv[3] = {g->t[EAGLE_WQ], g->t[EAGLE_WK], g->t[EAGLE_WV]};
    int rq[3] = {Q, KV, KV};
    if (weight_grad(t, S->dqkv, R, S->xa, D, n, gqkv, rq, 3) || mat_mul(t->run, &t->qkvT.dev, t->dxa, S->dqkv, n))
        return -1;
    rms_backward(t->dx, g->t[EAGLE_ATTN_NORM], t->dxa, S->x, S->rs_a, p->attn_norm, n, D);
    /* x = W_fc u, u = [embed; f'^{k-1}] */
    float *gf[1] = {g->t[EAGLE_FC]};
    if (weight_grad(t, t->dx, D, S->u, 2 * D, n, gf, &D, 1)) return -1;
    if (!k) return 0;
    if (mat_mul(t->run, &t->fcT.dev, t->du, t->dx, n)) return -1;
    for (int i = 0; i < n; i++) k_add(t->st[k - 1].dfp + (size_t)i * D, t->du + (size_t)i * 2 * D + D, D);
    return 0;
}

static float smooth_l1(float e) { return fabsf(e) < 1 ? 0.5f * e * e : fabsf(e) - 0.5f; }

/* step k's losses over its n rows into *add (weighted by w in add->loss), and with
   grad its dlogits (in place of the logits) and df' */
static void step_losses(EagleTrain *t, int k, int n, const float *feat, const int32_t *arg, int from, float w,
                        int trained, int grad, EagleSums *add) {
    struct EagleStep *S = &t->st[k];
    int D = t->dim, K = t->K;
    for (int i = 0; i < n; i++) {
        float *row = S->logits + (size_t)i * K, *df = S->dfp + (size_t)i * D;
        const float *fp = S->fp + (size_t)i * D, *next = feat + (size_t)(i + k + 1) * D;
        int32_t a = arg[i + k + 1];
        int y = a >= 0 && a < t->m->c.vocab_size ? t->draft_of[a] : -1;
        if (grad) memset(df, 0, sizeof(float) * D);
        if (i + k < from) {
            if (grad) memset(row, 0, sizeof(float) * K);
            continue;
        }
        int best = k_argmax(row, K);
        add->positions_at[k]++;
        add->hits_at[k] += y >= 0 && best == y;
        if (!trained) continue;
        double reg = 0;
        for (int d = 0; d < D; d++) {
            float e = fp[d] - next[d];
            reg += smooth_l1(e);
            if (grad) df[d] = w * t->w_reg * (e > 1 ? 1 : e < -1 ? -1 : e) / D;
        }
        add->loss += w * t->w_reg * reg / D;
        if (!k) add->reg += reg / D;
        if (y < 0) {
            if (grad) memset(row, 0, sizeof(float) * K);
            continue;
        }
        float ly = row[y], mx, se = k_exp_sum(row, K, &mx);
        double ce = mx + log((double)se) - ly; /* log Σ e^l - l_y */
        add->loss += w * t->w_ce * ce;
        if (!k) add->labelled++, add->ce += ce;
        if (!grad) continue;
        float c = w * t->w_ce, s = c / se; /* dCE/dl = softmax - onehot, weighted */
        for (int j = 0; j < K; j++) row[j] *= s;
        row[y] -= c;
    }
}

/* the losses and (g not NULL) the backward pass of one sequence; the weights packed */
static int seq_pass(EagleTrain *t, const int32_t *tok, const float *feat, const int32_t *arg, int T, int from,
                    EagleSums *s, EagleGrad *g) {
    int n = T - 1, steps = g ? t->steps : t->depth;
    if (T > t->cap) return pd_error("eagle: a sequence of %d tokens; %d fit", T, t->cap);
    if (n < 1) return 0;
    if (steps > n) steps = n;
    EagleSums add = {0};
    float w = 1;
    for (int k = 0; k < steps; k++, w *= EAGLE_STEP_DECAY) {
        if (forward_step(t, k, tok + 1 + k, feat, n - k)) return -1;
        step_losses(t, k, n - k, feat, arg, from, w, k < t->steps, g != NULL, &add);
    }
    if (s) {
        s->loss += add.loss, s->reg += add.reg, s->ce += add.ce;
        s->labelled += add.labelled;
        for (int k = 0; k < EAGLE_MAX_STEPS; k++)
            s->positions_at[k] += add.positions_at[k], s->hits_at[k] += add.hits_at[k];
    }
    if (!g) return 0;
    for (int k = 0; k < steps; k++) memset(t->st[k].dqkv, 0, sizeof(float) * (n - k) * t->qkvd);
    for (int k = steps - 1; k >= 0; k--)
        if (backward_step(t, k, n - k, g)) return -1;
    return 0;
}

int eagle_seq_forward(EagleTrain *t, const int32_t *in_tok, const float *feat, int n, int steps, float *fprime,
                      float *logits) {
    if (n < 1 || n > t->cap) return pd_error("eagle: %d positions; 1 to %d fit", n, t->cap);
    if (steps < 1 || steps > t->depth || steps > n) return pd_error("eagle: %d steps; 1 to %d run", steps, t->depth);
    if (pack_weights(t)) return -1;
    for (int k = 0; k < steps; k++) {
        if (forward_step(t, k, in_tok + k, feat, n - k)) return -1;
        if (fprime) memcpy(fprime + (size_t)k * n * t->dim, t->st[k].fp, sizeof(float) * (n - k) * t->dim);
        if (logits) memcpy(logits + (size_t)k * n * t->K, t->st[k].logits, sizeof(float) * (n - k) * t->K);
    }
    return 0;
}

int eagle_seq_loss(EagleTrain *t, const int32_t *tok, const float *feat, const int32_t *arg, int T, int from,
                   EagleSums *s, EagleGrad *g) {
    if (T < 2 || T > t->cap) return pd_error("eagle: a sequence of %d tokens; 2 to %d fit", T, t->cap);
    return pack_weights(t) || seq_pass(t, tok, feat, arg, T, from, s, g) ? -1 : 0;
}

/* ---- the frozen model's side ---- */

static int features(EagleTrain *t, const Sequences *s, MedusaCache *c, int i, const float **x, const int32_t **arg) {
    return model_outputs_of(t->run, &t->kv, t->pos, t->hid, t->cap, s, c, i, t->fx, t->arg, x, arg);
}

int eagle_cache_build(EagleTrain *t, const Sequences *s, MedusaCache *c, int fill, Progress *pg) {
    return model_outputs_cache(t->run, &t->kv, t->pos, t->hid, t->cap, s, c, fill, "eagle: the model's outputs", pg);
}

/* ---- steps and evaluation ---- */

int eagle_train_phase(EagleTrain *t, int steps) {
    if (steps < 1 || steps > t->depth) return pd_error("eagle: %d unrolled steps; 1 to %d fit", steps, t->depth);
    t->steps = steps, t->t = 0;
    eagle_grad_zero(&t->am), eagle_grad_zero(&t->av);
    return 0;
}

int eagle_train_step(EagleTrain *t, const Sequences *s, MedusaCache *c, const int *idx, int b, EagleSums *out) {
    EagleSums sum = {0};
    for (int i = 0; i < b; i++)
        if (idx[i] < 0 || idx[i] >= s->n) return pd_error("eagle: no sequence %d", idx[i]);
    if (pack_weights(t)) return -1;
    eagle_grad_zero(&t->g);
    for (int i = 0; i < b; i++) {
        const float *x;
        const int32_t *arg;
        if (features(t, s, c, idx[i], &x, &arg) ||
            seq_pass(t, s->tok + s->off[idx[i]], x, arg, seq_len_of(s, idx[i]), 0, &sum, &t->g))
            return -1;
    }
    int64_t positions = sum.positions_at[0];
    if (!positions) return pd_error("eagle: no position in the batch (every sequence is one token)");
    double norm2 = 0;
    for (int k = 0; k < EAGLE_TENSORS; k++)
        for (size_t j = 0; j < t->g.n[k]; j++) norm2 += (double)t->g.t[k][j] * t->g.t[k][j];
    double norm = sqrt(norm2) / positions, f = 1.0 / positions;
    if (t->clip > 0 && norm > t->clip) f *= t->clip / norm;
    t->t++;
    for (int k = 0; k < EAGLE_TENSORS; k++) {
        for (size_t j = 0; j < t->g.n[k]; j++) t->g.t[k][j] *= (float)f;
        adam_update(eagle_tensor(t->p, k), t->g.t[k], t->am.t[k], t->av.t[k], t->g.n[k], t->t, t->lr);
    }
    if (out) *out = sum;
    return 0;
}

int eagle_train_eval(EagleTrain *t, const Sequences *s, MedusaCache *c, EagleStats *out) {
    EagleSums sum = {0};
    memset(out, 0, sizeof *out);
    if (pack_weights(t)) return -1;
    for (int i = 0; i < s->n; i++) {
        const float *x;
        const int32_t *arg;
        if (seq_len_of(s, i) < 2) continue;
        if (features(t, s, c, i, &x, &arg) ||
            seq_pass(t, s->tok + s->off[i], x, arg, seq_len_of(s, i), t->eval_from, &sum, NULL))
            return -1;
    }
    int64_t positions = sum.positions_at[0];
    if (!positions) return pd_error("eagle: nothing to evaluate (every sequence is too short)");
    out->positions = positions;
    out->reg = sum.reg / positions;
    out->ce = sum.labelled ? sum.ce / sum.labelled : 0;
    out->coverage = (double)sum.labelled / positions;
    out->depth = t->depth;
    for (int k = 0; k < t->depth; k++)
        out->top1_at[k] = sum.positions_at[k] ? (double)sum.hits_at[k] / sum.positions_at[k] : 0;
    out->top1 = out->top1_at[0];
    return 0;
}
