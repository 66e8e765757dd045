/* draftmodel.c — see draftmodel.h: the source's tensors of layers [0, L), its
   embedding and final norm, and lm_head = E·T_L. */
#include "heads/draftmodel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/checkpoint.h"

/* W[vocab][d] = E[vocab][d] · T[d][d], accumulated in double (T is the head's z = T x,
   so E·(T x) = (E·T) x) */
static void fold(float *W, const float *E, const float *T, int vocab, int d, double *acc) {
    for (int v = 0; v < vocab; v++) {
        const float *e = E + (size_t)v * d;
        memset(acc, 0, sizeof(double) * d);
        for (int i = 0; i < d; i++) {
            const float *t = T + (size_t)i * d;
            for (int j = 0; j < d; j++) acc[j] += (double)e[i] * t[j];
        }
        for (int j = 0; j < d; j++) W[(size_t)v * d + j] = (float)acc[j];
    }
}

/* the head at `layer`, checked: in range, present, with the norm */
static int pick_head(const Model *m, const ExitHeads *h, int layer, const char *heads_path) {
    int k = heads_find(h, layer);
    if (k < 0) {
        char list[256] = "";
        for (int i = 0; i < h->n; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", i ? ", " : "", h->layer[i]);
        return pd_error("%s: no exit head at layer %d (its heads are at layers %s)", heads_path, layer, list);
    }
    if (!h->norm)
        return pd_error("%s: the heads read h_%d without the final norm, which no lm_head can fold "
                        "(train heads with distill-heads --norm 1)",
                        heads_path, layer);
    if (h->dim != m->c.dim) return pd_error("%s: heads of dim %d for a model of dim %d", heads_path, h->dim, m->c.dim);
    return k;
}

/* the draft's tensors into the writer: embedding, layers < L, final norm, lm_head */
static int write_tensors(ModelWriter *mw, const Checkpoint *ck, int layer, const float *W) {
    for (int i = 0; i < ck->n; i++) {
        const CkTensor *t = &ck->t[i];
        int l;
        if (!strcmp(t->name, NAME_LM_HEAD)) continue;
        if (sscanf(t->name, "model.layers.%d.", &l) == 1 && l >= layer) continue;
        if (t->raw ? mw_add_raw(mw, t->name, t->dtype, t->shape, t->raw)
                   : mw_add(mw, t->name, t->ndim, t->shape, t->data))
            return -1;
    }
    int64_t shape[2] = {ck->c.vocab_size, ck->c.dim};
    return mw_add(mw, NAME_LM_HEAD, 2, shape, W);
}

int draft_from_head(const char *model_path, const char *heads_path, int layer, const char *out, DType dt) {
    Model m;
    ExitHeads h;
    Checkpoint ck = {0};
    if (model_load(&m, model_path)) return -1;
    int L = m.c.n_layers, rc = -1, k = -1;
    if (layer < 1 || layer >= L) {
        pd_error("%s: draft layer %d is outside 1..%d (the model has %d layers)", model_path, layer, L - 1, L);
        model_free(&m);
        return -1;
    }
    if (heads_load(&h, heads_path, &m)) {
        model_free(&m);
        return -1;
    }
    char from[40];
    snprintf(from, sizeof from, "%s", m.digest);
    /* a block-type model's layers go into the draft as they are (DT_KEEP); the folded
       LM head is floats, from the output embedding dequantized */
    if ((k = pick_head(&m, &h, layer, heads_path)) >= 0 && !ck_read_model_blocks(&ck, model_path)) {
        int blocks = 0;
        for (int i = 0; i < ck.n; i++) blocks |= ck.t[i].raw != NULL;
        if (blocks) dt = DT_KEEP;
        CkTensor *E = ck_get(&ck, ck.c.tied ? NAME_EMBED : NAME_LM_HEAD);
        if (E && E->raw && ck_dequant(E)) E = NULL;
        int V = ck.c.vocab_size, d = ck.c.dim;
        float *W = E ? pd_alloc(pd_mul(pd_mul(sizeof(float), V), d)) : NULL;
        double *acc = pd_alloc(sizeof(double) * d);
        if (!E) pd_error("%s: no output embedding", model_path);
        if (W && acc) {
            fold(W, E->data, h.T[k], V, d, acc);
            char lay[16];
            snprintf(lay, sizeof lay, "%d", layer);
            const char *meta[] = {"paradec.draft_of", from, "paradec.draft.layer", lay};
            ModelWriter mw;
            Config c = ck.c;
            c.n_layers = layer;
            c.tied = 0;
            if (!mw_begin(&mw, out, dt)) {
                mw.chat_template = ck.chat_template;
                mw.meta = meta;
                mw.n_meta = 2;
                rc = write_tensors(&mw, &ck, layer, W) ? (mw_abort(&mw), -1)
                                                       : mw_commit(&mw, &c, ck.tok, ck.tok_len, ck.tok_kind);
            }
        }
        free(W);
        free(acc);
        ck_free(&ck);
    }
    heads_free(&h);
    model_free(&m);
    return rc;
}
