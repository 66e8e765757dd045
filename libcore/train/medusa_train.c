/* medusa_train.c — see medusa_train.h. Per sequence: the frozen model's normed last
   hidden states and greedy choices (from the cache, or one forward pass), then for
   every head its ResBlock, logits, cross-entropy and gradient. Rows are the positions
   of the sequence, so every product is one call over all of them, on the runner's
   device. */
#include "train/medusa_train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "train/distill.h" /* adam_update */

#define MODEL_ET MAX_MEDUSA /* Et[MODEL_ET]: the model's lm_head, transposed and packed */

static void *align64(void *p) { return (void *)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

/* [rows][cols] → [cols][rows] */
static void transpose(float *dst, const float *src, int rows, int cols) {
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) dst[(size_t)j * rows + i] = src[(size_t)i * cols + j];
}

void medusa_default_weights(int K, float *w) {
    for (int k = 0; k < K; k++) w[k] = k ? w[k - 1] * 0.8f : 1.0f;
}

static int alloc_all(MedusaTrain *t) {
    const MedusaHeads *h = t->h;
    size_t D = h->dim, V = h->vocab, N = t->cap, dd = pd_mul(D * D, sizeof(float)), vd = pd_mul(V * D, sizeof(float));
    int own = 0, rc = 0;
    for (int k = 0; k < h->n && !rc; k++) {
        rc = !(t->mW[k] = pd_alloc(dd)) || !(t->vW[k] = pd_alloc(dd)) || !(t->gW[k] = pd_alloc(dd)) ||
             !(t->mb[k] = pd_alloc(D * sizeof(float))) || !(t->vb[k] = pd_alloc(D * sizeof(float))) ||
             !(t->gb[k] = pd_alloc(D * sizeof(float)));
        if (rc || !h->lm[k]) continue;
        own = 1;
        rc = !(t->mE[k] = pd_alloc(vd)) || !(t->vE[k] = pd_alloc(vd)) || !(t->gE[k] = pd_alloc(vd)) ||
             !(t->Et_buf[k] = pd_alloc(k_packed_bytes(WT_F32, (int)D, (int)V) + 64));
    }
    if (rc) return -1;
    t->Et_buf[MODEL_ET] = pd_alloc(k_packed_bytes(t->m->lm_head.t, (int)D, (int)V) + 64);
    t->Et_tmp = pd_alloc(vd);
    t->dE = own ? pd_alloc(vd) : NULL;
    t->dW = pd_alloc(dd);
    t->hid = pd_alloc(pd_mul(N * D, sizeof(float)));
    t->x = pd_alloc(pd_mul(N * D, sizeof(float)));
    t->z = pd_alloc(pd_mul(N * D, sizeof(float)));
    t->r = pd_alloc(pd_mul(N * D, sizeof(float)));
    t->dr = pd_alloc(pd_mul(N * D, sizeof(float)));
    t->aT = pd_alloc(pd_mul(N * D, sizeof(float)));
    t->bT = pd_alloc(pd_mul(N * D, sizeof(float)));
    t->logits = pd_alloc(pd_mul(N * V, sizeof(float)));
    t->gT = pd_alloc(pd_mul(N * V, sizeof(float)));
    t->arg = pd_alloc(N * sizeof(int32_t));
    t->pos = pd_alloc(N * sizeof(int32_t));
    t->tgt = pd_alloc(N * sizeof(int32_t));
    t->pk_buf = pd_alloc(k_packed_bytes(WT_F32, (int)D, (int)N) + 64);
    if (!t->Et_buf[MODEL_ET] || !t->Et_tmp || (own && !t->dE) || !t->dW || !t->hid || !t->x || !t->z || !t->r ||
        !t->dr || !t->aT || !t->bT || !t->logits || !t->gT || !t->arg || !t->pos || !t->tgt || !t->pk_buf)
        return -1;
    for (int k = 0; k <= MAX_MEDUSA; k++) t->Et[k] = t->Et_buf[k] ? align64(t->Et_buf[k]) : NULL;
    t->pk = align64(t->pk_buf);
    return 0;
}

int medusa_train_init(MedusaTrain *t, Model *m, MedusaHeads *h, int max_len, float lr, float lr_lm,
                      const float *weights, MedusaTargets targets) {
    memset(t, 0, sizeof *t);
    const Config *c = &m->c;
    if (max_len < 1 || max_len > c->seq_len)
        return pd_error("medusa: sequences of %d tokens; the model's context holds %d", max_len, c->seq_len);
    if (h->dim != c->dim || h->vocab != c->vocab_size)
        return pd_error("medusa: heads of dim %d, vocabulary %d for a model of %d, %d", h->dim, h->vocab, c->dim,
                        c->vocab_size);
    if (!m->lm_head.w) return pd_error("medusa: the model's output embedding is not readable");
    t->m = m;
    t->h = h;
    t->lr = lr;
    t->lr_lm = lr_lm;
    t->targets = targets;
    t->cap = max_len;
    if (weights) memcpy(t->weight, weights, sizeof(float) * h->n);
    else medusa_default_weights(h->n, t->weight);
    if (!(t->run = runner_new(m)) || kv_init(&t->kv, c, 1, max_len, 16) || alloc_all(t)) {
        medusa_train_free(t);
        return -1;
    }
    pack_transposed(t->Et[MODEL_ET], m->lm_head.w, m->lm_head.t, c->vocab_size, c->dim, t->Et_tmp);
    if (mat_load(t->run, &t->Et_dev[MODEL_ET], t->Et[MODEL_ET], m->lm_head.t, c->dim, c->vocab_size)) {
        medusa_train_free(t);
        return -1;
    }
    for (int i = 0; i < max_len; i++) t->pos[i] = i;
    return 0;
}

void medusa_train_free(MedusaTrain *t) {
    for (int k = 0; k < MAX_MEDUSA; k++) {
        free(t->mW[k]);
        free(t->vW[k]);
        free(t->gW[k]);
        free(t->mb[k]);
        free(t->vb[k]);
        free(t->gb[k]);
        free(t->mE[k]);
        free(t->vE[k]);
        free(t->gE[k]);
    }
    for (int k = 0; k <= MAX_MEDUSA; k++) free(t->Et_buf[k]);
    free(t->Et_tmp);
    free(t->dE);
    free(t->dW);
    free(t->hid);
    free(t->x);
    free(t->z);
    free(t->r);
    free(t->dr);
    free(t->aT);
    free(t->bT);
    free(t->logits);
    free(t->gT);
    free(t->arg);
    free(t->pos);
    free(t->tgt);
    free(t->pk_buf);
    if (t->kv.arena.base) kv_free(&t->kv);
    for (int k = 0; k <= MAX_MEDUSA && t->run; k++) {
        mat_free(t->run, &t->Et_dev[k]);
        if (k < MAX_MEDUSA) mat_free(t->run, &t->lm_dev[k]);
    }
    if (t->run) mat_free(t->run, &t->pk_dev);
    runner_free(t->run);
    memset(t, 0, sizeof *t);
}

/* an own lm_head changed (a step, or medusa_set): its packed transpose follows, and
   both go where the runner multiplies */
static int refresh_Et(MedusaTrain *t) {
    const MedusaHeads *h = t->h;
    for (int k = 0; k < h->n; k++) {
        if (!h->lm[k]) continue;
        pack_transposed(t->Et[k], h->lm[k], WT_F32, h->vocab, h->dim, t->Et_tmp);
        if (mat_load(t->run, &t->Et_dev[k], t->Et[k], WT_F32, h->dim, h->vocab) ||
            mat_load(t->run, &t->lm_dev[k], h->lmp[k].p, WT_F32, h->vocab, h->dim))
            return -1;
    }
    return 0;
}

/* ---- one head on the positions of one sequence ---- */

typedef struct {
    double loss, rank[MEDUSA_RANKS];
    int64_t n;
} Tally;

/* place of y among row's entries: how many beat it (ties: the lower id wins, as
   k_argmax breaks them); counting stops at MEDUSA_RANKS */
static int rank_of(const float *row, int V, int y) {
    float ly = row[y];
    int r = 0;
    for (int v = 0; v < V && r < MEDUSA_RANKS; v++) r += row[v] > ly || (row[v] == ly && v < y);
    return r;
}

/* pk_dev = src[rows][cols] transposed (via tmp) and packed, [cols][rows] */
static int pack_rows_T(MedusaTrain *t, float *tmp, const float *src, int rows, int cols) {
    transpose(tmp, src, rows, cols);
    const void *s[1] = {tmp};
    int r[1] = {cols};
    k_pack(t->pk, WT_F32, rows, 1, s, r);
    return mat_load(t->run, &t->pk_dev, t->pk, WT_F32, cols, rows);
}

/* head k on n positions with normed states x[n][dim] and targets tgt[n]: Σ CE into
   *loss; ranks into tally; when gradients are asked for, scale × d(Σ CE) added */
static int head_pass(MedusaTrain *t, int k, const float *x, const int32_t *tgt, int n, float scale, double *loss,
                     Tally *tally, float *gW, float *gb, float *gE) {
    const MedusaHeads *h = t->h;
    int D = h->dim, V = h->vocab;
    float s = h->input_scale;
    medusa_resblock(h, k, x, n, t->z, t->r);
    if (h->lmp[k].p ? mat_mul(t->run, &t->lm_dev[k], t->logits, t->r, n) : mat_mul_lm_head(t->run, t->logits, t->r, n))
        return -1;
    int grad = gW || gb || gE;
    double sum = 0;
    for (int i = 0; i < n; i++) {
        float *row = t->logits + (size_t)i * V, ly = row[tgt[i]], mx;
        if (tally) {
            tally->n++;
            int r = rank_of(row, V, tgt[i]);
            if (r < MEDUSA_RANKS) tally->rank[r]++;
        }
        float se = k_exp_sum(row, V, &mx), inv = 1.0f / se;
        sum += mx + logf(se) - ly; /* log Σ e^l - l_y */
        if (!grad) continue;
        for (int v = 0; v < V; v++) row[v] *= inv * scale; /* scale (softmax - onehot) */
        row[tgt[i]] -= scale;
    }
    *loss += sum;
    if (tally) tally->loss += sum;
    if (!grad) return 0;
    float *g = t->logits;
    if (gE) { /* dE[V][D] += gᵀ r: gT [V][n] · (rᵀ [D][n])ᵀ */
        transpose(t->gT, g, n, V);
        if (pack_rows_T(t, t->aT, t->r, n, D) || mat_mul(t->run, &t->pk_dev, t->dE, t->gT, V)) return -1;
        k_add(gE, t->dE, (size_t)V * D);
    }
    /* dr[n][D] = g · E, then dz = dr / s ⊙ SiLU'(z), in place */
    if (mat_mul(t->run, &t->Et_dev[h->lm[k] ? k : MODEL_ET], t->dr, g, n)) return -1;
    for (size_t i = 0; i < (size_t)n * D; i++) {
        float zz = t->z[i], sg = 1.0f / (1.0f + expf(-zz));
        t->dr[i] = t->dr[i] / s * (sg * (1.0f + zz * (1.0f - sg)));
    }
    for (int i = 0; gb && i < n; i++) k_add(gb, t->dr + (size_t)i * D, D);
    if (!gW) return 0;
    /* dW[D][D] += dzᵀ u: dzT [D][n] · (uᵀ [D][n])ᵀ, u = s x */
    transpose(t->aT, t->dr, n, D);
    for (size_t i = 0; i < (size_t)n * D; i++) t->r[i] = s * x[i]; /* r is free now: u */
    if (pack_rows_T(t, t->bT, t->r, n, D) || mat_mul(t->run, &t->pk_dev, t->dW, t->aT, D)) return -1;
    k_add(gW, t->dW, (size_t)D * D);
    return 0;
}

int medusa_head_loss(MedusaTrain *t, int k, const float *hidden, const int32_t *tgt, int n, double *loss, float *gW,
                     float *gb, float *gE) {
    if (k < 0 || k >= t->h->n) return pd_error("medusa: no head %d", k);
    if (n < 1 || n > t->cap) return pd_error("medusa: %d positions; 1 to %d fit", n, t->cap);
    if (gE && !t->h->lm[k]) return pd_error("medusa: head %d has no own lm_head to train", k);
    for (int i = 0; i < n; i++)
        if (tgt[i] < 0 || tgt[i] >= t->h->vocab) return pd_error("medusa: target %d is not a token", tgt[i]);
    if (refresh_Et(t)) return -1;
    k_rmsnorm(t->x, hidden, t->m->final_norm, n, t->h->dim, t->m->c.norm_eps);
    *loss = 0;
    return head_pass(t, k, t->x, tgt, n, 1.0f, loss, NULL, gW, gb, gE);
}

/* ---- the frozen model's side ---- */

int model_seq_outputs(Runner *run, KVCache *kv, const int32_t *tok, const int32_t *pos, int n, float *hid, float *x,
                      int32_t *arg) {
    const Model *m = run->m;
    int s = kv_seq_new(kv);
    if (s < 0) return -1;
    Batch b = {n, tok, NULL, pos, NULL, NULL}; /* seq NULL: 0, the cache's only one */
    int rc = forward_layers(run, kv, &b, 0, m->c.n_layers, hid);
    kv_seq_free(kv, s);
    if (rc) return -1;
    /* decoding's own argmax (exact on every device); x by the same norm it applies */
    k_rmsnorm(x, hid, m->final_norm, n, m->c.dim, m->c.norm_eps);
    return logits_argmax(run, hid, n, arg);
}

/* sequence i's x and arg: the cache's, or computed into t->x and t->arg */
static int features(MedusaTrain *t, const Sequences *s, MedusaCache *c, int i, const float **x, const int32_t **arg) {
    return model_outputs_of(t->run, &t->kv, t->pos, t->hid, t->cap, s, c, i, t->x, t->arg, x, arg);
}

/* head k's targets for a sequence of n tokens into t->tgt; returns how many rows
   (positions 0.. that have one) */
static int targets(MedusaTrain *t, int k, MedusaTargets which, const int32_t *tok, const int32_t *arg, int n) {
    int ahead = which == MEDUSA_TARGETS_SELF ? k + 1 : k + 2, rows = n - ahead;
    const int32_t *src = which == MEDUSA_TARGETS_SELF ? arg : tok;
    for (int i = 0; i < rows; i++) t->tgt[i] = src[i + ahead];
    return rows > 0 ? rows : 0;
}

int model_outputs_of(Runner *run, KVCache *kv, const int32_t *pos, float *hid, int cap, const Sequences *s,
                     MedusaCache *c, int i, float *sx, int32_t *sarg, const float **x, const int32_t **arg) {
    int n = seq_len_of(s, i), cached = c && c->s == s;
    if (n > cap) return pd_error("a sequence of %d tokens; %d fit", n, cap);
    if (cached) sx = c->x + (size_t)s->off[i] * run->m->c.dim, sarg = c->arg + s->off[i];
    *x = sx, *arg = sarg;
    if (cached && c->have[i]) return 0;
    if (model_seq_outputs(run, kv, s->tok + s->off[i], pos, n, hid, sx, sarg)) return -1;
    if (cached) c->have[i] = 1;
    return 0;
}

int model_outputs_cache(Runner *run, KVCache *kv, const int32_t *pos, float *hid, int cap, const Sequences *s,
                        MedusaCache *c, int fill, const char *what, Progress *pg) {
    memset(c, 0, sizeof *c);
    if (s->max_len > cap) return pd_error("%s: a sequence of %d tokens; %d fit", what, s->max_len, cap);
    size_t tokens = (size_t)seqs_tokens(s), dim = (size_t)run->m->c.dim;
    c->x = pd_alloc(pd_mul(pd_mul(tokens, dim), sizeof(float)));
    c->arg = pd_alloc(pd_mul(tokens, sizeof(int32_t)));
    c->have = pd_alloc((size_t)s->n);
    if (!c->x || !c->arg || !c->have) {
        medusa_cache_free(c);
        return -1;
    }
    c->s = s;
    if (!fill) return 0;
    if (pg) progress_begin(pg, what, (int64_t)tokens);
    for (int i = 0; i < s->n; i++) {
        const float *x;
        const int32_t *arg;
        if (model_outputs_of(run, kv, pos, hid, cap, s, c, i, NULL, NULL, &x, &arg)) {
            medusa_cache_free(c);
            return -1;
        }
        if (pg) progress_step(pg, s->off[i + 1]);
    }
    if (pg) progress_end(pg);
    return 0;
}

int medusa_cache_build(MedusaTrain *t, const Sequences *s, MedusaCache *c, int fill, Progress *pg) {
    return model_outputs_cache(t->run, &t->kv, t->pos, t->hid, t->cap, s, c, fill, "medusa: the model's outputs", pg);
}

void medusa_cache_free(MedusaCache *c) {
    free(c->x);
    free(c->arg);
    free(c->have);
    memset(c, 0, sizeof *c);
}

/* ---- steps and evaluation ---- */

int medusa_train_step(MedusaTrain *t, const Sequences *s, MedusaCache *c, const int *idx, int b, double *loss) {
    MedusaHeads *h = t->h;
    int H = h->n;
    size_t DD = (size_t)h->dim * h->dim, VD = (size_t)h->vocab * h->dim;
    int64_t count[MAX_MEDUSA] = {0}, any = 0;
    double sum[MAX_MEDUSA] = {0};
    for (int i = 0; i < b; i++) {
        if (idx[i] < 0 || idx[i] >= s->n) return pd_error("medusa: no sequence %d", idx[i]);
        int ahead = t->targets == MEDUSA_TARGETS_SELF ? 1 : 2, n = seq_len_of(s, idx[i]);
        for (int k = 0; k < H; k++) count[k] += n - ahead - k > 0 ? n - ahead - k : 0;
    }
    for (int k = 0; k < H; k++) {
        any += count[k];
        memset(t->gW[k], 0, DD * sizeof(float));
        memset(t->gb[k], 0, h->dim * sizeof(float));
        if (h->lm[k]) memset(t->gE[k], 0, VD * sizeof(float));
    }
    if (!any) return pd_error("medusa: no position in the batch has a target");
    if (refresh_Et(t)) return -1;
    for (int i = 0; i < b; i++) {
        const float *x;
        const int32_t *arg, *tok = s->tok + s->off[idx[i]];
        int n = seq_len_of(s, idx[i]);
        if (features(t, s, c, idx[i], &x, &arg)) return -1;
        for (int k = 0; k < H; k++) {
            int rows = targets(t, k, t->targets, tok, arg, n);
            if (rows && head_pass(t, k, x, t->tgt, rows, t->weight[k] / (float)count[k], &sum[k], NULL, t->gW[k],
                                  t->gb[k], h->lm[k] ? t->gE[k] : NULL))
                return -1;
        }
    }
    t->t++;
    for (int k = 0; k < H; k++) {
        if (loss) loss[k] = count[k] ? sum[k] / count[k] : 0;
        if (!count[k]) continue;
        adam_update(h->W[k], t->gW[k], t->mW[k], t->vW[k], DD, t->t, t->lr);
        adam_update(h->b[k], t->gb[k], t->mb[k], t->vb[k], h->dim, t->t, t->lr);
        if (h->lm[k]) adam_update(h->lm[k], t->gE[k], t->mE[k], t->vE[k], VD, t->t, t->lr_lm);
        medusa_set(h, k, h->W[k], h->b[k], h->lm[k]);
    }
    return 0;
}

int medusa_train_eval(MedusaTrain *t, const Sequences *s, MedusaCache *c, MedusaStats *out) {
    int H = t->h->n;
    Tally tally[MAX_MEDUSA];
    memset(tally, 0, sizeof tally);
    double sum[MAX_MEDUSA] = {0};
    int64_t any = 0;
    if (refresh_Et(t)) return -1;
    for (int i = 0; i < s->n; i++) {
        const float *x;
        const int32_t *arg, *tok = s->tok + s->off[i];
        int n = seq_len_of(s, i);
        if (features(t, s, c, i, &x, &arg)) return -1;
        int from = t->eval_from;
        for (int k = 0; k < H; k++) {
            int rows = targets(t, k, MEDUSA_TARGETS_SELF, tok, arg, n) - from;
            if (rows > 0 && head_pass(t, k, x + (size_t)from * t->h->dim, t->tgt + from, rows, 0, &sum[k], &tally[k],
                                      NULL, NULL, NULL))
                return -1;
        }
    }
    for (int k = 0; k < H; k++) {
        MedusaStats *o = &out[k];
        memset(o, 0, sizeof *o);
        int64_t n = tally[k].n;
        any += n;
        o->positions = n;
        if (!n) continue;
        o->loss = tally[k].loss / n;
        for (int r = 0; r < MEDUSA_RANKS; r++) {
            o->rank[r] = tally[k].rank[r] / n;
            o->top5 += r < 5 ? o->rank[r] : 0;
        }
        o->top1 = o->rank[0];
    }
    return any ? 0 : pd_error("medusa: nothing to evaluate (every sequence is too short)");
}

/* ---- the model's own text ---- */

typedef struct {
    Model *m;
    Runner *run;
    KVCache kv;
    int len;                    /* the length outputs grow to */
    int32_t *tok, *seq, *pos;   /* [group × prefix] the prefill batch, then a token per live row */
    int *out, *n, *kvid, *last; /* [group] each row's output sequence, its length so far, its
                                  KV sequence, its last prefill row */
    float *hid, *logits;        /* [group × prefix][dim], [group][vocab] */
} Gen;

/* rows 0..g-1 hold their prefixes (o's tokens at out[j], n[j] of them): each grows
   greedily to gen->len tokens or to an end-of-generation token (left out); its final
   length goes to final[out[j]] */
static int gen_group(Gen *gn, Sequences *o, int g, int *final, Progress *pg, int64_t *done) {
    Model *m = gn->m;
    int D = m->c.dim, V = m->c.vocab_size, at = 0, rc = 0;
    for (int j = 0; j < g; j++) {
        if ((gn->kvid[j] = kv_seq_new(&gn->kv)) < 0) return pd_error("medusa: generate: no free KV sequence");
        for (int i = 0; i < gn->n[j]; i++, at++)
            gn->tok[at] = o->tok[o->off[gn->out[j]] + i], gn->seq[at] = gn->kvid[j], gn->pos[at] = i;
        gn->last[j] = at - 1;
    }
    /* every prefix in one call, each row in its own sequence */
    Batch b = {at, gn->tok, gn->seq, gn->pos, NULL, NULL};
    rc = forward_layers(gn->run, &gn->kv, &b, 0, m->c.n_layers, gn->hid);
    for (int j = 0; j < g; j++) /* last[j] ≥ j: a row never overwrites one still to move */
        memmove(gn->hid + (size_t)j * D, gn->hid + (size_t)gn->last[j] * D, sizeof(float) * D);
    int live = g;
    while (!rc && live) {
        if ((rc = final_logits(gn->run, gn->hid, live, gn->logits))) break;
        int keep = 0;
        for (int j = 0; j < live; j++) {
            int32_t next = k_argmax(gn->logits + (size_t)j * V, V);
            int done_now = tok_is_eog(m->tok, next);
            if (!done_now) {
                o->tok[o->off[gn->out[j]] + gn->n[j]++] = next;
                ++*done;
                done_now = gn->n[j] == gn->len;
            }
            if (done_now) {
                final[gn->out[j]] = gn->n[j];
                kv_seq_free(&gn->kv, gn->kvid[j]);
                continue;
            }
            /* still going: it moves to row keep (keep ≤ j) */
            gn->tok[keep] = next, gn->seq[keep] = gn->kvid[j], gn->pos[keep] = gn->n[j] - 1;
            gn->out[keep] = gn->out[j], gn->n[keep] = gn->n[j], gn->kvid[keep] = gn->kvid[j];
            keep++;
        }
        if (pg) progress_step(pg, *done);
        if (!(live = keep)) break;
        Batch step = {live, gn->tok, gn->seq, gn->pos, NULL, NULL};
        rc = forward_layers(gn->run, &gn->kv, &step, 0, m->c.n_layers, gn->hid);
    }
    for (int j = 0; rc && j < live; j++) kv_seq_free(&gn->kv, gn->kvid[j]);
    return rc;
}

int medusa_generate(Model *m, const Sequences *in, int prefix, int len, int group, Sequences *out, Progress *pg) {
    memset(out, 0, sizeof *out);
    if (prefix < 1 || len > m->c.seq_len || group < 1)
        return pd_error("medusa: generate: prefix %d, length %d (context %d), group %d", prefix, len, m->c.seq_len,
                        group);
    if (prefix >= len)
        return pd_error("medusa: generate: a prefix of %d tokens leaves nothing to generate in sequences of %d", prefix,
                        len);
    Gen g = {.m = m, .len = len};
    int D = m->c.dim, rc = 0, *final = pd_alloc(sizeof(int) * (in->n + 1));
    size_t rows = (size_t)group * prefix;
    out->tok = pd_alloc(pd_mul(pd_mul((size_t)in->n, len), sizeof(int32_t)));
    out->off = pd_alloc(sizeof(int64_t) * (in->n + 1));
    g.tok = pd_alloc(pd_mul(rows * 3, sizeof(int32_t)));
    g.out = pd_alloc(sizeof(int) * group * 4);
    g.hid = pd_alloc(pd_mul(pd_mul(rows, D), sizeof(float)));
    g.logits = pd_alloc(pd_mul(pd_mul((size_t)group, m->c.vocab_size), sizeof(float)));
    g.run = runner_new(m);
    if (!final || !g.run || !out->tok || !out->off || !g.tok || !g.out || !g.hid || !g.logits ||
        kv_init(&g.kv, &m->c, group, group * ((len + 15) / 16 * 16), 16)) /* whole blocks per sequence */
        rc = -1;
    if (!rc) {
        g.seq = g.tok + rows, g.pos = g.seq + rows;
        g.n = g.out + group, g.kvid = g.n + group, g.last = g.kvid + group;
        for (int i = 0; i < in->n; i++) out->off[i] = (int64_t)i * len; /* len slots each, for now */
    }
    int64_t done = 0;
    if (pg && !rc) progress_begin(pg, "medusa: generating", (int64_t)in->n * len);
    for (int i0 = 0; i0 < in->n && !rc; i0 += group) {
        int n = in->n - i0 < group ? in->n - i0 : group;
        for (int j = 0; j < n; j++) {
            int p = seq_len_of(in, i0 + j) < prefix ? seq_len_of(in, i0 + j) : prefix;
            memcpy(out->tok + out->off[i0 + j], in->tok + in->off[i0 + j], sizeof(int32_t) * p);
            g.out[j] = i0 + j, g.n[j] = p;
            done += p;
        }
        rc = gen_group(&g, out, n, final, pg, &done);
    }
    if (pg && !rc) progress_end(pg);
    if (!rc) { /* close the gaps */
        int64_t at = 0;
        for (int i = 0; i < in->n; i++) {
            memmove(out->tok + at, out->tok + out->off[i], sizeof(int32_t) * final[i]);
            out->off[i] = at;
            at += final[i];
            out->max_len = final[i] > out->max_len ? final[i] : out->max_len;
        }
        out->off[in->n] = at;
        out->n = in->n;
    }
    free(final);
    free(g.tok);
    free(g.out);
    free(g.hid);
    free(g.logits);
    if (g.kv.arena.base) kv_free(&g.kv);
    runner_free(g.run);
    if (rc) seqs_free(out);
    return rc;
}
