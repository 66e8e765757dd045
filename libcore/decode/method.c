/* method.c — the method registry and the helpers every method shares. */
#include "decode/method.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* the built-in methods, in the order --help lists them (standard first: the reference).
   Adding a method: one file in libcore/decode/ defining `const DecodeMethod method_NAME`,
   and one line here. */
#define BUILT_IN(X)                                                                                                    \
    X(standard)                                                                                                        \
    X(prompt_lookup)                                                                                                   \
    X(lookahead)                                                                                                       \
    X(adadecode)                                                                                                       \
    X(selfspec)                                                                                                        \
    X(medusa)                                                                                                          \
    X(eagle)                                                                                                           \
    X(speculative)
#define DECLARE(name) extern const DecodeMethod method_##name;
#define ENTRY(name) &method_##name,
BUILT_IN(DECLARE)
static const DecodeMethod *const METHODS[] = {BUILT_IN(ENTRY)};
#define N_BUILT_IN (int)(sizeof METHODS / sizeof METHODS[0])

/* methods registered at run time (a test's own), after the built-in ones */
#define MAX_EXTRA 4
static const DecodeMethod *EXTRA[MAX_EXTRA];
static int n_extra;
#define N_METHODS (N_BUILT_IN + n_extra)
#define METHOD(i) ((i) < N_BUILT_IN ? METHODS[i] : EXTRA[(i)-N_BUILT_IN])

int decode_register(const DecodeMethod *dm) {
    for (int i = 0; i < N_METHODS; i++)
        if (!strcmp(METHOD(i)->name, dm->name)) return pd_error("method '%s' is registered already", dm->name);
    if (n_extra == MAX_EXTRA) return pd_error("more than %d methods registered at run time", MAX_EXTRA);
    EXTRA[n_extra++] = dm;
    return 0;
}

int decode_method_count(void) { return N_METHODS; }
const DecodeMethod *decode_reference(void) { return METHODS[0]; }
const DecodeMethod *decode_method_at(int i) { return i >= 0 && i < N_METHODS ? METHOD(i) : NULL; }

const DecodeMethod *decode_method(const char *name) {
    for (int i = 0; i < N_METHODS; i++)
        if (!strcmp(METHOD(i)->name, name)) return METHOD(i);
    pd_error("unknown method '%s' (known: %s)", name, decode_method_names());
    return NULL;
}

const char *decode_method_names(void) {
    static char buf[512];
    buf[0] = 0;
    for (int i = 0; i < N_METHODS; i++) {
        if (i) strncat(buf, ", ", sizeof buf - strlen(buf) - 1);
        strncat(buf, METHOD(i)->name, sizeof buf - strlen(buf) - 1);
    }
    return buf;
}

/* a and b name the same option, '_' matching '-' (a recipe's keys) */
static int same_name(const char *a, const char *b) {
    for (; *a && *b; a++, b++)
        if (*a != *b && !((*a == '-' || *a == '_') && (*b == '-' || *b == '_'))) return 0;
    return !*a && !*b;
}

const MethodOption *decode_option_find(const DecodeMethod *dm, const char *name) {
    for (int i = 0; i < dm->n_options; i++)
        if (same_name(dm->options[i].name, name)) return &dm->options[i];
    return NULL;
}

const char *decode_option_key(const MethodOption *o, char *buf, size_t n) {
    snprintf(buf, n, "%s", o->recipe ? o->recipe : o->name);
    for (char *c = buf; *c; c++) *c = *c == '-' ? '_' : *c;
    return buf;
}

const MethodOption *decode_option_by_key(const char *key, const DecodeMethod **dm) {
    char k[64];
    for (int i = 0; i < N_METHODS; i++)
        for (int j = 0; j < METHOD(i)->n_options; j++)
            if (!strcmp(decode_option_key(&METHOD(i)->options[j], k, sizeof k), key)) {
                if (dm) *dm = METHOD(i);
                return &METHOD(i)->options[j];
            }
    return NULL;
}

const char *decode_option_users(const char *name) {
    static char buf[512];
    buf[0] = 0;
    for (int i = 0; i < N_METHODS; i++)
        if (decode_option_find(METHOD(i), name)) {
            if (buf[0]) strncat(buf, " ", sizeof buf - strlen(buf) - 1);
            strncat(buf, METHOD(i)->name, sizeof buf - strlen(buf) - 1);
        }
    return buf;
}

void *decode_options_new(const DecodeMethod *dm) { return pd_alloc(dm->options_size ? dm->options_size : 1); }

static void *slot(const MethodOption *o, const void *opts, const MethodShared *sh) {
    return (char *)(o->shared ? (const void *)sh : opts) + o->offset;
}

/* "METHOD: --NAME V is outside [lo, hi]" for a set value out of range */
static int check_value(const DecodeMethod *dm, const MethodOption *o, const void *opts, const MethodShared *sh) {
    const void *at = slot(o, opts, sh);
    if (!opts && !o->shared) return 0;
    if (o->type == OPT_INT) {
        int v = *(const int *)at;
        if (v && (v < o->lo || v > o->hi))
            return pd_error("%s: --%s %d is outside [%.10g, %.10g]", dm->name, o->name, v, o->lo, o->hi);
    } else if (o->type == OPT_FLOAT) {
        float v = *(const float *)at;
        if (v != 0 && !(v >= (float)o->lo && v <= (float)o->hi))
            return pd_error("%s: --%s %g is outside [%.10g, %.10g]", dm->name, o->name, v, o->lo, o->hi);
    }
    return 0;
}

int decode_option_set(const DecodeMethod *dm, void *opts, MethodShared *sh, const char *name, const char *value) {
    const MethodOption *o = decode_option_find(dm, name);
    if (!o) {
        const char *users = decode_option_users(name);
        return *users ? pd_error("--%s: %s does not use it (%s do)", name, dm->name, users)
                      : pd_error("--%s: no method has this option", name);
    }
    void *at = slot(o, opts, sh);
    char *end;
    double v;
    switch (o->type) {
    case OPT_SWITCH: /* a flag alone, or a recipe's boolean */
        if (!value || !strcmp(value, "1") || !strcmp(value, "true") || !strcmp(value, "yes")) *(int *)at = 1;
        else if (!strcmp(value, "0") || !strcmp(value, "false") || !strcmp(value, "no")) *(int *)at = 0;
        else return pd_error("--%s: '%s' is not a boolean (true or false)", o->name, value);
        return 0;
    case OPT_STR:
        *(const char **)at = value;
        return 0;
    case OPT_INT:
        v = strtod(value, &end);
        if (!*value || *end || isnan(v))
            return pd_error("--%s: '%s' is not an integer in [%.10g, %.10g]", o->name, value, o->lo, o->hi);
        if (!(v >= o->lo && v <= o->hi))
            return pd_error("--%s %s is outside [%.10g, %.10g]", o->name, value, o->lo, o->hi);
        if (v != (int)v)
            return pd_error("--%s: '%s' is not an integer in [%.10g, %.10g]", o->name, value, o->lo, o->hi);
        *(int *)at = (int)v;
        return 0;
    case OPT_FLOAT:
        v = strtod(value, &end);
        /* compared as the float it is stored as: 1e-6f is in [1e-6, 1] */
        if (!*value || *end || !((float)v >= (float)o->lo && (float)v <= (float)o->hi))
            return pd_error("--%s: '%s' is not a number in [%.10g, %.10g]", o->name, value, o->lo, o->hi);
        *(float *)at = (float)v;
        return 0;
    }
    return 0;
}

int decode_method_ready(const DecodeMethod *dm, const MethodShared *sh) {
    if ((dm->needs & NEEDS_EXIT_HEADS) && !sh->heads) return pd_error("%s needs exit heads (--heads FILE)", dm->name);
    if ((dm->needs & NEEDS_MEDUSA) && !sh->medusa)
        return pd_error("%s needs Medusa heads (--heads FILE from train-medusa)", dm->name);
    if ((dm->needs & NEEDS_DRAFT) && !sh->draft) return pd_error("%s needs a draft model (--draft MODEL)", dm->name);
    if ((dm->needs & NEEDS_EAGLE) && !sh->eagle)
        return pd_error("%s needs an EAGLE head (--heads FILE from train-medusa --eagle)", dm->name);
    return 0;
}

int decode_options_check(const DecodeMethod *dm, const void *opts, const MethodShared *sh) {
    for (int i = 0; i < dm->n_options; i++)
        if (check_value(dm, &dm->options[i], opts, sh)) return -1;
    if (sh->oracle_rate != 0 && !dm->oracle)
        return pd_error("%s: the oracle has nothing to stand in for here", dm->name);
    if (sh->oracle_rate < 0 || sh->oracle_rate > 1 || (sh->oracle_rate > 0 && !sh->oracle))
        return pd_error("%s: oracle acceptance %g needs a rate in [0, 1] and the oracle's tokens", dm->name,
                        sh->oracle_rate);
    return decode_method_ready(dm, sh);
}

void decode_methods_help(FILE *f) {
    fprintf(f, "Methods (--method NAME) and their options:\n");
    for (int i = 0; i < N_METHODS; i++) {
        const DecodeMethod *dm = METHOD(i);
        fprintf(
            f, "  %-18s %s%s%s%s%s\n", dm->name, dm->summary, dm->needs & NEEDS_EXIT_HEADS ? " (needs exit heads)" : "",
            dm->needs & NEEDS_MEDUSA ? " (needs Medusa heads)" : "",
            dm->needs & NEEDS_EAGLE ? " (needs an EAGLE head)" : "", dm->needs & NEEDS_DRAFT ? " (needs --draft)" : "");
        for (int k = 0; k < dm->n_options; k++) {
            const MethodOption *o = &dm->options[k];
            char flag[64], range[64] = "";
            snprintf(flag, sizeof flag, "--%s%s%s", o->name, o->metavar ? " " : "", o->metavar ? o->metavar : "");
            if (o->type == OPT_INT || o->type == OPT_FLOAT)
                snprintf(range, sizeof range, ", in [%.10g, %.10g]", o->lo, o->hi);
            fprintf(f, "      %-22s %s (%s%s)\n", flag, o->help, o->def ? o->def : "off", range);
        }
    }
}

int decode_run_begin(DecodeRun *r, const DecodeMethod *dm, DecodeCtx *d, const int32_t *prompt, int n_prompt) {
    *r = (DecodeRun){dm, d, NULL};
    if (decode_options_check(dm, d->mopt, &d->opt)) return -1;
    return dm->begin(d, prompt, n_prompt, &r->state);
}

int decode_run_step(DecodeRun *r) {
    double t0 = pd_now();
    int rc = r->dm->step(r->d, r->state);
    r->d->t_decode += pd_now() - t0;
    return rc;
}

void decode_run_finish(DecodeRun *r) {
    if (r->dm) r->dm->finish(r->d, r->state);
    r->state = NULL;
}

int decode_generate(const DecodeMethod *dm, DecodeCtx *d, const int32_t *prompt, int n_prompt) {
    DecodeRun r;
    int rc = decode_run_begin(&r, dm, d, prompt, n_prompt);
    while (!rc) rc = decode_run_step(&r);
    decode_run_finish(&r);
    return rc < 0 ? -1 : 0;
}

#define PREFILL_CHUNK 64 /* tokens a prefill pass takes at once */

int decode_init(DecodeCtx *d, Model *m, KVCache *kv, Sampler *s, int max_new) {
    memset(d, 0, sizeof *d);
    d->m = m;
    d->kv = kv;
    d->sampler = s;
    d->max_new = max_new;
    d->cap = PREFILL_CHUNK;
    d->seq = kv_seq_new(kv);
    d->run = runner_new(m);
    d->out = pd_alloc(sizeof(int32_t) * (max_new > 0 ? max_new : 1));
    d->hidden = pd_alloc(sizeof(float) * d->cap * m->c.dim);
    d->logits = pd_alloc(sizeof(float) * d->cap * m->c.vocab_size);
    if (d->seq < 0 || !d->run || !d->out || !d->hidden || !d->logits) {
        decode_free(d);
        return -1;
    }
    return 0;
}

void decode_free(DecodeCtx *d) {
    if (d->kv && d->seq >= 0 && d->m) kv_seq_free(d->kv, d->seq);
    for (int i = 0; i < MAX_GRAPH_TOKENS; i++) forward_graph_free(d->graph[i]);
    runner_free(d->run);
    free(d->out);
    free(d->hidden);
    free(d->logits);
    for (int i = 0; i < d->kept_rows; i++) free(d->kept[i]);
    free(d->kept);
    memset(d, 0, sizeof *d);
}

int decode_continue(DecodeCtx *d, int max_new, int keep) {
    if (kv_truncate(d->kv, d->seq, keep)) return -1;
    int32_t *out = pd_realloc(d->out, sizeof(int32_t) * (max_new > 0 ? max_new : 1));
    if (!out) return -1;
    DecodeCtx was = *d; /* the model, cache, sequence, sampler, options, callback and scratch stay */
    memset(d, 0, sizeof *d);
    d->m = was.m, d->run = was.run, d->kv = was.kv, d->seq = was.seq, d->sampler = was.sampler, d->opt = was.opt,
    d->mopt = was.mopt;
    d->emit = was.emit, d->emit_ctx = was.emit_ctx, d->hidden = was.hidden, d->logits = was.logits, d->cap = was.cap;
    d->out = out, d->max_new = max_new, d->reuse = keep;
    return 0;
}

int decode_kept(const DecodeCtx *d, int n_prompt) {
    int k = n_prompt + d->n_out;
    for (int l = 0; l < d->m->c.n_layers; l++) {
        int len = kv_len(d->kv, d->seq, l);
        if (len < k) k = len;
    }
    return k;
}

/* opt.graphs: a full-model call replays its token count's graph; the first call of a
   count, or one the graph's workspace cannot take, runs eagerly and captures anew
   (right after it, as a GPU's graph needs) */
static int graph_forward(DecodeCtx *d, const Batch *b, float *hidden) {
    ForwardGraph **g = &d->graph[b->n - 1];
    int rc = *g ? forward_replay(d->run, *g, b, hidden) : -2;
    if (rc != -2) return rc;
    forward_graph_free(*g);
    *g = NULL;
    if (forward_layers(d->run, d->kv, b, 0, d->m->c.n_layers, hidden)) return -1;
    return (*g = forward_capture(d->run, d->kv, 0, d->m->c.n_layers)) ? 0 : -1;
}

int decode_forward(DecodeCtx *d, const Batch *b, int lb, int le, float *hidden) {
    int graph = d->opt.graphs && !d->run->fast && lb == 0 && le == d->m->c.n_layers && b->n <= MAX_GRAPH_TOKENS;
    if (graph ? graph_forward(d, b, hidden) : forward_layers(d->run, d->kv, b, lb, le, hidden)) return -1;
    decode_count_pass(d, b->n, lb, le);
    return 0;
}

void decode_count_pass(DecodeCtx *d, int n, int lb, int le) {
    d->layer_passes += le - lb;
    d->token_layers += (int64_t)n * (le - lb);
    d->target_passes += lb == 0 && le == d->m->c.n_layers;
}

int decode_step(DecodeCtx *d, int token, int pos, float *hidden, float *logits) {
    Batch b = {1, &token, &d->seq, &pos, NULL, NULL};
    if (decode_forward(d, &b, 0, d->m->c.n_layers, hidden)) return -1;
    return logits && final_logits(d->run, hidden, 1, logits) ? -1 : 0;
}

int decode_rows(DecodeCtx *d, const float *hidden, int n, float *lg, int32_t *ids, int need_ids) {
    int V = d->m->c.vocab_size;
    float temp = d->sampler->temp;
    if (!d->emit_logits && temp == 0) return logits_argmax(d->run, hidden, n, ids);
    if (!d->emit_logits && !need_ids) return logits_softmax_temp(d->run, hidden, n, temp, lg) ? -1 : 1;
    if (final_logits(d->run, hidden, n, lg)) return -1;
    return (temp == 0 || need_ids) && rows_argmax(d->run, lg, n, V, ids) ? -1 : 0;
}

int decode_rows_given(DecodeCtx *d, float *lg, int n, int32_t *ids, int need_ids) {
    int V = d->m->c.vocab_size;
    float temp = d->sampler->temp;
    if (!d->emit_logits && temp > 0 && !need_ids) return rows_softmax(d->run, lg, n, V, temp, lg) ? -1 : 1;
    return (temp == 0 || need_ids) && ids && rows_argmax(d->run, lg, n, V, ids) ? -1 : 0;
}

int decode_row_probs(DecodeCtx *d, float *row, int is_probs) {
    if (!is_probs && rows_softmax(d->run, row, 1, d->m->c.vocab_size, d->sampler->temp, row)) return -1;
    sampler_truncate(d->sampler, row);
    return 0;
}

int decode_choose(DecodeCtx *d, const float *hidden, const float **raw, int *tok) {
    int32_t id;
    int rc = decode_rows(d, hidden, 1, d->logits, &id, 0);
    if (rc < 0) return -1;
    *raw = decode_keep(d, 0, d->logits);
    if (d->sampler->temp == 0) *tok = id;
    else if (decode_row_probs(d, d->logits, rc)) return -1;
    else *tok = sampler_pick(d->sampler, d->logits, d->m->c.vocab_size, 1);
    return 0;
}

int decode_prefill(DecodeCtx *d, const int32_t *prompt, int n) {
    return decode_prefill_hidden(d, prompt, n) || final_logits(d->run, d->hidden, 1, d->logits) ? -1 : 0;
}

int decode_prefill_hidden(DecodeCtx *d, const int32_t *prompt, int n) {
    double t0 = pd_now();
    if (n < 1) return pd_error("empty prompt (it needs at least BOS)");
    if (n >= d->m->c.seq_len) return pd_error("prompt of %d tokens does not fit the context of %d", n, d->m->c.seq_len);
    /* the last token runs again for its logits; a method that reads the prompt's states
       (on_prefill) runs all of it */
    int from = d->on_prefill ? 0 : d->reuse < n ? d->reuse : n - 1;
    if (from < d->reuse && kv_truncate(d->kv, d->seq, from)) return -1;
    int32_t pos[PREFILL_CHUNK];
    int take = 0, rc = 0;
    d->run->fast = d->opt.fast_prefill;
    for (int at = from; at < n && !rc; at += take) {
        take = n - at < d->cap ? n - at : d->cap;
        for (int i = 0; i < take; i++) pos[i] = at + i;
        int32_t seq[PREFILL_CHUNK];
        for (int i = 0; i < take; i++) seq[i] = d->seq;
        Batch b = {take, prompt + at, seq, pos, NULL, NULL};
        rc = decode_forward(d, &b, 0, d->m->c.n_layers, d->hidden);
        if (!rc && d->on_prefill) rc = d->on_prefill(d->on_prefill_ctx, prompt + at, pos, take, d->hidden);
    }
    d->run->fast = 0;
    if (rc) return -1;
    size_t dim = d->m->c.dim;
    memmove(d->hidden, d->hidden + (take - 1) * dim, sizeof(float) * dim);
    d->n_prefilled = n - from;
    d->prefill_passes = d->target_passes;
    d->prefill_token_layers = d->token_layers;
    d->t_prefill += pd_now() - t0;
    return 0;
}

int decode_prefill_given(DecodeCtx *d, const int32_t *prompt, int n) {
    size_t dim = d->m->c.dim;
    int32_t pos[PREFILL_CHUNK];
    for (int at = 0, take; d->on_prefill && at < n; at += take) {
        take = n - at < d->cap ? n - at : d->cap;
        for (int i = 0; i < take; i++) pos[i] = at + i;
        if (d->on_prefill(d->on_prefill_ctx, prompt + at, pos, take, d->given_states + (size_t)at * dim)) return -1;
    }
    memcpy(d->hidden, d->given_hidden, sizeof(float) * dim);
    return 0;
}

int decode_is_end(const DecodeCtx *d, int token) { return token_ends_text(d->m, token); }

int token_ends_text(const Model *m, int token) {
    const Tokenizer *t = m->tok;
    /* llama2.c-style models end a story with BOS, as run.c stops there */
    return tok_is_eog(t, token) || (tok_kind(t) == TOK_SPM && token == tok_bos(t));
}

int decode_accept(DecodeCtx *d, int prev, int token, const float *logits) {
    if (decode_is_end(d, token)) return 1;
    d->out[d->n_out++] = token;
    if (d->emit_logits) d->emit_logits(d->emit_ctx, token, logits);
    if (d->emit && d->emit(d->emit_ctx, prev, token)) return 1;
    return d->n_out >= d->max_new;
}

const float *decode_keep(DecodeCtx *d, int i, const float *logits) {
    if (!d->emit_logits) return NULL;
    if (d->sampler->temp == 0) return logits;
    size_t V = d->m->c.vocab_size;
    if (i >= d->kept_rows) {
        float **k = realloc(d->kept, sizeof(float *) * (i + 1));
        if (!k) return NULL;
        d->kept = k;
        for (; d->kept_rows <= i; d->kept_rows++)
            if (!(d->kept[d->kept_rows] = malloc(sizeof(float) * V))) return NULL;
    }
    return memcpy(d->kept[i], logits, sizeof(float) * V);
}
