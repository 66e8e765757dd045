/* serve_gen.c — see serve_gen.h. A reader thread per request: gen_answer and gen_event
   block on the engine's jobs (a second at a time, so a client that left is noticed). */
#include "serve_gen.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat.h"

/* ---- the request in ---- */

/* the prompt's tokens; -1 + message */
static int encode(const GenModel *gm, const ServeRequest *r, GenPrompt *p) {
    const Tokenizer *t = gm->m->tok;
    if (r->kind == REQ_COMPLETION)
        return tok_encode_flags(t, r->prompt, strlen(r->prompt), tok_add_bos(t) ? TOK_ADD_BOS : 0, &p->ids, &p->n);
    if (gm->chat_format < 0) return pd_error("%s", gm->chat_why);
    int bos;
    char *text = chat_apply_turns((ChatFormat)gm->chat_format, gm->m->chat_template, r->turn, r->n_turns, &bos);
    int rc = text ? tok_encode_flags(t, text, strlen(text), TOK_SPECIAL | (bos ? TOK_ADD_BOS : 0), &p->ids, &p->n) : -1;
    free(text);
    return rc;
}

int gen_start(Gen *g, const GenModel *gm, RequestKind kind, const char *body, size_t n, const char *id, uint64_t seed) {
    memset(g, 0, sizeof *g);
    g->gm = gm;
    snprintf(g->id, sizeof g->id, "%s", id);
    g->created = (long)time(NULL);
    if (serve_request_parse(&g->req, kind, body, n)) return -1;
    const ServeRequest *r = &g->req;
    g->p = pd_alloc(sizeof *g->p);
    g->c = pd_alloc(sizeof *g->c);
    if (!g->p || !g->c) return -1;
    g->n_p = 1;
    if (encode(gm, r, &g->p[0])) return -1;
    GenChoice *c = &g->c[0];
    JobOptions o = {r->max_tokens, r->temperature, r->top_p, r->top_k, r->seed ? r->seed : seed, r->method, -1, 0};
    if (!(c->job = engine_submit(gm->e, g->p[0].ids, g->p[0].n, &o))) return -1;
    g->n_c = 1;
    return 0;
}

void gen_free(Gen *g) {
    for (int i = 0; i < g->n_c; i++) {
        if (g->c[i].job) {
            job_cancel(g->gm->e, g->c[i].job);
            job_release(g->gm->e, g->c[i].job);
        }
        free(g->c[i].text);
    }
    for (int i = 0; i < g->n_p; i++) free(g->p[i].ids);
    free(g->c), free(g->p);
    serve_request_free(&g->req);
    memset(g, 0, sizeof *g);
}

/* ---- tokens to text ---- */

size_t gen_find_stop(char *const *stop, int n_stop, const char *text, size_t n, size_t from, size_t *hold) {
    size_t best = n;
    *hold = 0;
    for (int i = 0; i < n_stop; i++) {
        const char *s = stop[i];
        size_t sl = strlen(s), a = from >= sl ? from - sl + 1 : 0;
        if (!sl || a >= n) continue;
        const char *at = memmem(text + a, n - a, s, sl);
        if (at && (size_t)(at - text) < best) best = at - text;
        for (size_t h = sl - 1 < n ? sl - 1 : n; h > *hold; h--)
            if (!memcmp(text + n - h, s, h)) *hold = h;
    }
    return best;
}

/* how many of the choice's tokens reach byte `at` of its text (the one holding that
   byte included): what usage counts when a stop string cuts the answer there */
static int tokens_to(const Gen *g, const GenChoice *c, size_t at) {
    const int32_t *t = job_tokens(c->job);
    int np = job_prompt_len(c->job);
    size_t len, sum = 0;
    for (int i = 0; i < c->n_tok; i++) {
        tok_piece(g->gm->m->tok, t[np + i - 1], t[np + i], &len);
        if ((sum += len) > at) return i + 1;
    }
    return c->n_tok;
}

/* every choice's job stops (the client left, or memory ran out) */
static void end_all(Gen *g, const char *finish) {
    for (int i = 0; i < g->n_c; i++) {
        job_cancel(g->gm->e, g->c[i].job);
        if (!g->c[i].finish) g->c[i].finish = finish;
    }
}

static int has_ended(const Gen *g, const char *finish) {
    for (int i = 0; i < g->n_c; i++)
        if (g->c[i].finish && !strcmp(g->c[i].finish, finish)) return 1;
    return 0;
}

/* waits up to `wait` seconds for the choice's new tokens, turns them into text, ends on
   a stop string; returns how many bytes of its text can be sent */
static size_t advance(Gen *g, GenChoice *c, double wait) {
    if (c->finish) return c->text_n; /* ended: tokens made after a stop string stay out */
    const char *finish;
    int n = job_wait(g->gm->e, c->job, c->n_tok, wait, &finish);
    const int32_t *t = job_tokens(c->job);
    int np = job_prompt_len(c->job);
    size_t from = c->text_n;
    for (; c->n_tok < n; c->n_tok++) {
        size_t len;
        const char *p = tok_piece(g->gm->m->tok, t[np + c->n_tok - 1], t[np + c->n_tok], &len);
        if (c->text_n + len + 1 > c->text_cap) {
            char *x = realloc(c->text, 2 * (c->text_n + len + 1));
            if (!x) { /* this request ends; the server goes on */
                end_all(g, "error");
                return c->sent;
            }
            c->text = x, c->text_cap = 2 * (c->text_n + len + 1);
        }
        memcpy(c->text + c->text_n, p, len);
        c->text_n += len;
    }
    c->n_gen = n;
    size_t hold, stop = gen_find_stop(g->req.stop, g->req.n_stop, c->text, c->text_n, from, &hold);
    if (stop < c->text_n) { /* a stop string: the text ends before it */
        c->text_n = stop, c->finish = "stop", hold = 0;
        c->n_gen = tokens_to(g, c, stop);
        job_cancel(g->gm->e, c->job);
    } else if (finish)
        c->finish = finish, hold = 0;
    else if (g->gone && g->gone(g->gone_ctx))
        end_all(g, "cancelled");
    size_t whole = c->finish ? c->text_n : utf8_whole(c->text, c->text_n - hold);
    return whole > c->sent ? whole : c->sent;
}

/* ---- answers ---- */

static json_t *jtext(const char *s, size_t n) {
    size_t m;
    char *c = utf8_clean(s, n, &m);
    json_t *j = c ? json_stringn(c, m) : NULL;
    free(c);
    return j;
}

static json_t *finish_of(const char *finish) { return finish ? json_string(finish) : json_null(); }

static json_t *envelope(const Gen *g, int chunk) {
    const char *object = g->req.kind == REQ_COMPLETION ? "text_completion" : chunk ? "chat.completion.chunk" : "chat.completion";
    return json_pack("{s:s, s:s, s:I, s:s}", "id", g->id, "object", object, "created", (json_int_t)g->created, "model",
                     g->gm->name);
}

static json_t *usage(const Gen *g) {
    int prompt = 0, gen = 0;
    for (int i = 0; i < g->n_p; i++) prompt += g->p[i].n;
    for (int i = 0; i < g->n_c; i++) gen += g->c[i].n_gen;
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", prompt, "completion_tokens", gen, "total_tokens", prompt + gen);
}

static char *dump(json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) pd_error("serve: out of memory");
    return s;
}

/* a completion's choice: the same in the whole answer and in a stream's chunks */
static json_t *completion_choice(int index, const char *s, size_t n, const char *finish) {
    return json_pack("{s:o, s:i, s:n, s:o}", "text", jtext(s, n), "index", index, "logprobs", "finish_reason", finish_of(finish));
}

char *gen_answer(Gen *g, int *status) {
    for (int i = 0; i < g->n_c; i++)
        while (!g->c[i].finish) advance(g, &g->c[i], 1.0);
    *status = 0;
    if (has_ended(g, "cancelled")) return pd_error("the client left"), NULL;
    *status = 500;
    if (has_ended(g, "error")) return pd_error("the model failed on this request (see the server's log)"), NULL;
    json_t *o = envelope(g, 0), *choices = json_array();
    for (int i = 0; i < g->n_c; i++) {
        const GenChoice *c = &g->c[i];
        json_t *choice = g->req.kind == REQ_COMPLETION
                             ? completion_choice(i, c->text, c->text_n, c->finish)
                             : json_pack("{s:i, s:{s:s, s:o}, s:o}", "index", i, "message", "role", "assistant", "content",
                                         jtext(c->text, c->text_n), "finish_reason", finish_of(c->finish));
        json_array_append_new(choices, choice);
    }
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", usage(g));
    char *s = dump(o);
    if (s) *status = 200;
    return s;
}

/* a stream chunk for choice i: text[0..n) (may be empty), finish NULL until its last */
static json_t *chunk(const Gen *g, int i, const char *s, size_t n, const char *finish, int first) {
    json_t *o = envelope(g, 1), *choice;
    if (g->req.kind == REQ_COMPLETION)
        choice = completion_choice(i, s, n, finish);
    else {
        json_t *delta = json_object();
        if (first) json_object_set_new(delta, "role", json_string("assistant"));
        if (n || !finish) json_object_set_new(delta, "content", jtext(s, n));
        choice = json_pack("{s:i, s:o, s:o}", "index", i, "delta", delta, "finish_reason", finish_of(finish));
    }
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    if (finish) json_object_set_new(o, "usage", usage(g));
    return o;
}

/* choice i's next chunk, NULL when it has nothing to send yet */
static json_t *choice_event(Gen *g, int i, double wait) {
    GenChoice *c = &g->c[i];
    if (!c->opened && g->req.kind == REQ_CHAT) { /* chat streams open with the role alone */
        c->opened = 1;
        return chunk(g, i, "", 0, NULL, 1);
    }
    size_t upto = advance(g, c, wait);
    if (c->finish && !strcmp(c->finish, "cancelled")) return NULL;
    json_t *o = NULL;
    if (upto > c->sent) o = chunk(g, i, c->text + c->sent, upto - c->sent, NULL, 0);
    else if (c->finish) o = chunk(g, i, "", 0, c->finish, 0), c->closed = 1;
    c->sent = upto, c->opened = 1;
    return o;
}

static char *event(const char *json, size_t *n) {
    size_t jn = strlen(json);
    char *e = pd_alloc(jn + 9);
    if (e) *n = (size_t)sprintf(e, "data: %s\n\n", json);
    return e;
}

char *gen_event(Gen *g, size_t *n) {
    for (;;) {
        if (g->done || has_ended(g, "cancelled")) return NULL;
        int open = -1;
        for (int k = 0; k < g->n_c; k++) { /* a choice with something to send, in turn */
            int i = (g->next + k) % g->n_c;
            if (g->c[i].closed) continue;
            if (open < 0) open = i;
            json_t *o = choice_event(g, i, 0);
            if (!o) continue;
            g->next = (i + 1) % g->n_c;
            char *s = dump(o), *e = s ? event(s, n) : NULL;
            free(s);
            return e;
        }
        if (open < 0) { /* every choice has ended */
            g->done = 1;
            char *e = pd_strdup("data: [DONE]\n\n");
            if (e) *n = strlen(e);
            return e;
        }
        advance(g, &g->c[open], 1.0); /* nothing to send yet: wait for the first open choice */
    }
}
