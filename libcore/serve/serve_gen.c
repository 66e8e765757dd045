/* serve_gen.c — see serve_gen.h. A reader thread per request: gen_answer and gen_event
   block on the engine's jobs (a second at a time, so a client that left is noticed). */
#include "serve/serve_gen.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer/chat.h"

/* ---- the request in ---- */

/* prompt i's tokens (ids checked against the vocabulary), and its text for echo; -1 +
   message */
static int encode(Gen *g, int i) {
    const Tokenizer *t = g->gm->m->tok;
    const ServeRequest *r = &g->req;
    GenPrompt *p = &g->p[i];
    if (r->kind == REQ_CHAT) {
        if (g->gm->chat_format < 0) return pd_error("%s", g->gm->chat_why);
        int bos;
        char *text =
            chat_apply_turns((ChatFormat)g->gm->chat_format, g->gm->m->chat_template, r->turn, r->n_turns, &bos);
        int rc =
            text ? tok_encode_flags(t, text, strlen(text), TOK_SPECIAL | (bos ? TOK_ADD_BOS : 0), &p->ids, &p->n) : -1;
        free(text);
        return rc;
    }
    const ReqPrompt *q = &r->prompt[i];
    if (q->text) {
        if (tok_encode_flags(t, q->text, q->n_text, tok_add_bos(t) ? TOK_ADD_BOS : 0, &p->ids, &p->n)) return -1;
    } else { /* token ids, as given (no BOS added: they are the model's input) */
        int V = tok_vocab_size(t);
        for (int k = 0; k < q->n_ids; k++)
            if (q->ids[k] >= V)
                return pd_error("'prompt': token id %d (item %d of prompt %d) is outside the vocabulary (%d tokens)",
                                (int)q->ids[k], k, i, V);
        if (!(p->ids = pd_alloc(sizeof(int32_t) * (q->n_ids ? q->n_ids : 1)))) return -1;
        memcpy(p->ids, q->ids, sizeof(int32_t) * q->n_ids);
        p->n = q->n_ids;
    }
    if (!r->echo) return 0;
    /* the echo is the prompt's tokens' own text: what the user sent, as the tokenizer
       round-trips it, and what the tokens' text offsets count in */
    size_t cap = 1, len;
    for (int k = 0; k < p->n; k++) tok_piece(t, k ? p->ids[k - 1] : -1, p->ids[k], &len), cap += len;
    p->text = pd_alloc(cap);
    p->end = pd_alloc(sizeof(size_t) * (p->n ? p->n : 1));
    if (!p->text || !p->end) return -1;
    for (int k = 0; k < p->n; k++) {
        const char *s = tok_piece(t, k ? p->ids[k - 1] : -1, p->ids[k], &len);
        if (len) memcpy(p->text + p->text_n, s, len);
        p->end[k] = p->text_n += len;
    }
    return 0;
}

int gen_start(Gen *g, const GenModel *gm, RequestKind kind, const char *body, size_t n, const char *id, uint64_t seed) {
    memset(g, 0, sizeof *g);
    g->gm = gm;
    snprintf(g->id, sizeof g->id, "%s", id);
    g->created = (long)time(NULL);
    if (serve_request_parse(&g->req, kind, body, n)) return -1;
    const ServeRequest *r = &g->req;
    int n_p = kind == REQ_CHAT ? 1 : r->n_prompts, n_c = n_p * r->n;
    g->p = pd_alloc(sizeof *g->p * n_p);
    g->c = pd_alloc(sizeof *g->c * n_c);
    if (!g->p || !g->c) return -1;
    for (int i = 0; i < n_p; i++) /* counted first: gen_free frees what a failed one holds */
        if (g->n_p = i + 1, encode(g, i)) return -1;
    if (r->has_seed) seed = r->seed;
    for (; g->n_c < n_c; g->n_c++) { /* choice i of a prompt: seed + i, so a choice is the one request with that seed */
        GenChoice *c = &g->c[g->n_c];
        c->prompt = g->n_c / r->n;
        JobOptions o = {r->max_tokens,
                        r->temperature,
                        r->top_p,
                        r->top_k,
                        seed + (uint64_t)(g->n_c % r->n),
                        r->method,
                        r->logprobs,
                        r->echo && r->logprobs >= 0};
        if (!(c->job = engine_submit(gm->e, g->p[c->prompt].ids, g->p[c->prompt].n, &o, &g->busy))) return -1;
    }
    return 0;
}

void gen_free(Gen *g) {
    for (int i = 0; i < g->n_c; i++) {
        if (g->c[i].job) {
            job_cancel(g->gm->e, g->c[i].job);
            job_release(g->gm->e, g->c[i].job);
        }
        free(g->c[i].text), free(g->c[i].end);
    }
    for (int i = 0; i < g->n_p; i++) free(g->p[i].ids), free(g->p[i].text), free(g->p[i].end);
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
static int tokens_to(const GenChoice *c, size_t at) {
    for (int i = 0; i < c->n_tok; i++)
        if (c->end[i] > at) return i + 1;
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

static int grow(void **p, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) return 0;
    void *x = realloc(*p, size * 2 * need);
    if (!x) return -1;
    *p = x, *cap = 2 * need;
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
        if (grow((void **)&c->text, &c->text_cap, c->text_n + len + 1, 1) ||
            grow((void **)&c->end, &c->end_cap, (size_t)c->n_tok + 1, sizeof *c->end)) {
            end_all(g, "error"); /* this request ends; the server goes on */
            return c->sent;
        }
        if (len) memcpy(c->text + c->text_n, p, len); /* (a padding id past the tokenizer's has no text) */
        c->end[c->n_tok] = c->text_n += len;
    }
    if (c->text_n && !g->t_first) g->t_first = pd_now(); /* time to first token (metrics) */
    c->n_gen = n;
    size_t hold, stop = gen_find_stop(g->req.stop, g->req.n_stop, c->text, c->text_n, from, &hold);
    if (stop < c->text_n) { /* a stop string: the text ends before it */
        c->text_n = stop, c->finish = "stop", hold = 0;
        c->n_gen = tokens_to(c, stop);
        job_cancel(g->gm->e, c->job);
    } else if (finish) c->finish = finish, hold = 0;
    else if (g->gone && g->gone(g->gone_ctx)) end_all(g, "cancelled");
    size_t whole = c->finish ? c->text_n : utf8_whole(c->text, c->text_n - hold);
    return whole > c->sent ? whole : c->sent;
}

/* ---- log-probabilities ---- */

/* a token's bytes as logprobs name it (malloc'd): its text after prev, or a control
   token's own name, which adds nothing to the text; "" for a padding id past the
   tokenizer's pieces */
static char *token_bytes(const Tokenizer *t, int prev, int id, size_t *n) {
    const char *p = tok_piece(t, prev, id, n);
    if (!p) return pd_strdup("");
    if (*n) {
        char *s = pd_alloc(*n + 1);
        return s ? memcpy(s, p, *n) : NULL;
    }
    char *s;
    return tok_decode_flags(t, (const int32_t *)&id, 1, TOK_SPECIAL, &s, n) ? NULL : s;
}

static json_t *jtext(const char *s, size_t n) {
    size_t m;
    char *c = utf8_clean(s, n, &m);
    json_t *j = c ? json_stringn(c, m) : NULL;
    free(c);
    return j;
}

/* completions name a token that is not whole UTF-8 by its bytes, as OpenAI does: "bytes:\xe2\x80" */
static json_t *completion_token(const char *s, size_t n) {
    size_t m;
    char *c = utf8_clean(s, n, &m);
    if (c && m == n && !memcmp(c, s, n)) {
        json_t *j = json_stringn(c, m);
        free(c);
        return j;
    }
    free(c);
    char *b = pd_alloc(6 + 4 * n + 1);
    if (!b) return NULL;
    size_t k = (size_t)sprintf(b, "bytes:");
    for (size_t i = 0; i < n; i++) k += (size_t)sprintf(b + k, "\\x%02x", (unsigned char)s[i]);
    json_t *j = json_stringn(b, k);
    free(b);
    return j;
}

static json_t *jlogprob(float lp) { return json_real(isfinite(lp) ? lp : -9999.0); } /* JSON has no -inf */

static json_t *jbytes(const char *s, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer((unsigned char)s[i]));
    return a;
}

/* a chat token: {"token", "logprob", "bytes"} */
static json_t *chat_token(const Tokenizer *t, int prev, int id, float lp) {
    size_t n;
    char *s = token_bytes(t, prev, id, &n);
    json_t *o =
        s ? json_pack("{s:o, s:o, s:o}", "token", jtext(s, n), "logprob", jlogprob(lp), "bytes", jbytes(s, n)) : NULL;
    free(s);
    return o;
}

/* appends a token to a logprobs object: completions' {"tokens", "token_logprobs",
   "top_logprobs", "text_offset"} (lp NULL: the first prompt token, which has none), or
   chat's {"content": [...]}. Returns -1 out of memory. */
static int add_logprob(json_t *o, const Gen *g, int prev, int id, const TokenLogprob *lp, size_t offset) {
    const Tokenizer *t = g->gm->m->tok;
    int k = g->req.logprobs;
    size_t n;
    if (g->req.kind == REQ_CHAT) {
        json_t *c = chat_token(t, prev, id, lp->logprob), *top = json_array();
        for (int i = 0; i < k; i++) json_array_append_new(top, chat_token(t, prev, lp->top[i], lp->top_logprob[i]));
        if (!c || json_object_set_new(c, "top_logprobs", top)) return json_decref(c), -1;
        return json_array_append_new(json_object_get(o, "content"), c);
    }
    char *s = token_bytes(t, prev, id, &n);
    json_t *name = s ? completion_token(s, n) : NULL, *top = json_null();
    if (lp) { /* the best k, and the chosen token too (OpenAI's "logprobs + 1") */
        top = json_object();
        for (int i = 0; i < k; i++) {
            size_t m;
            char *a = token_bytes(t, prev, lp->top[i], &m);
            json_t *an = a ? completion_token(a, m) : NULL;
            if (an && !json_object_get(top, json_string_value(an)))
                json_object_set_new(top, json_string_value(an), jlogprob(lp->top_logprob[i]));
            json_decref(an), free(a);
        }
        if (name && !json_object_get(top, json_string_value(name)))
            json_object_set_new(top, json_string_value(name), jlogprob(lp->logprob));
    }
    free(s);
    int rc = !name || json_array_append_new(json_object_get(o, "tokens"), name) ||
             json_array_append_new(json_object_get(o, "token_logprobs"), lp ? jlogprob(lp->logprob) : json_null()) ||
             json_array_append_new(json_object_get(o, "top_logprobs"), top) ||
             json_array_append_new(json_object_get(o, "text_offset"), json_integer((json_int_t)offset));
    return rc ? -1 : 0;
}

static json_t *logprobs_new(const Gen *g) {
    if (g->req.kind == REQ_CHAT) return json_pack("{s:[], s:n}", "content", "refusal");
    return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

/* the echoed prompt's tokens into o (its first has no logprob); the text offsets count
   characters from the start */
static int echo_logprobs(json_t *o, const Gen *g, const GenChoice *c) {
    const GenPrompt *p = &g->p[c->prompt];
    const TokenLogprob *lp = job_logprobs(c->job);
    size_t at = 0, chars = 0;
    for (int k = 0; k < p->n; k++) {
        size_t start = k ? p->end[k - 1] : 0;
        chars += utf8_count(p->text, p->text_n, &at, start);
        if (add_logprob(o, g, k ? p->ids[k - 1] : -1, p->ids[k], k ? &lp[k] : NULL, chars)) return -1;
    }
    return 0;
}

/* the answer's tokens [from, to) into o; their text offsets count on from the choice's
   cursor (at_byte, at_char: where the last one was counted), after `base` characters of
   echo */
static int answer_logprobs(json_t *o, const Gen *g, GenChoice *c, int from, int to, size_t base) {
    const TokenLogprob *lp = job_logprobs(c->job);
    const int32_t *t = job_tokens(c->job);
    int np = job_prompt_len(c->job);
    for (int i = from; i < to; i++) {
        size_t start = i ? c->end[i - 1] : 0;
        c->at_char += utf8_count(c->text, c->text_n, &c->at_byte, start);
        if (add_logprob(o, g, t[np + i - 1], t[np + i], &lp[np + i], base + c->at_char)) return -1;
    }
    return 0;
}

static size_t echo_chars(const Gen *g, const GenChoice *c) {
    const GenPrompt *p = &g->p[c->prompt];
    size_t at = 0;
    return g->req.echo ? utf8_count(p->text, p->text_n, &at, p->text_n) : 0;
}

/* ---- answers ---- */

static json_t *finish_of(const char *finish) { return finish ? json_string(finish) : json_null(); }

static json_t *envelope(const Gen *g, int chunk) {
    const char *object = g->req.kind == REQ_COMPLETION ? "text_completion"
                         : chunk                       ? "chat.completion.chunk"
                                                       : "chat.completion";
    return json_pack("{s:s, s:s, s:I, s:s}", "id", g->id, "object", object, "created", (json_int_t)g->created, "model",
                     g->gm->name);
}

void gen_usage(const Gen *g, int *prompt, int *completion) {
    *prompt = *completion = 0;
    for (int i = 0; i < g->n_p; i++) *prompt += g->p[i].n;
    for (int i = 0; i < g->n_c; i++) *completion += g->c[i].n_gen;
}

static json_t *usage(const Gen *g) {
    int prompt, gen;
    gen_usage(g, &prompt, &gen);
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", prompt, "completion_tokens", gen, "total_tokens",
                     prompt + gen);
}

static char *dump(json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) pd_error("serve: out of memory");
    return s;
}

/* a choice in the whole answer: its text after the echo, its logprobs */
static json_t *whole_choice(const Gen *g, int i) {
    GenChoice *c = &g->c[i];
    const GenPrompt *p = &g->p[c->prompt];
    json_t *lp = json_null();
    if (g->req.logprobs >= 0) {
        lp = logprobs_new(g);
        c->at_byte = c->at_char = 0;
        if ((g->req.echo && echo_logprobs(lp, g, c)) || answer_logprobs(lp, g, c, 0, c->n_gen, echo_chars(g, c)))
            return json_decref(lp), NULL;
    }
    if (g->req.kind == REQ_CHAT)
        return json_pack("{s:i, s:{s:s, s:o}, s:o, s:o}", "index", i, "message", "role", "assistant", "content",
                         jtext(c->text, c->text_n), "logprobs", lp, "finish_reason", finish_of(c->finish));
    size_t e = g->req.echo ? p->text_n : 0;
    char *all = pd_alloc(e + c->text_n + 1);
    if (all && e) memcpy(all, p->text, e);
    if (all && c->text_n) memcpy(all + e, c->text, c->text_n);
    json_t *o = all ? json_pack("{s:o, s:i, s:o, s:o}", "text", jtext(all, e + c->text_n), "index", i, "logprobs", lp,
                                "finish_reason", finish_of(c->finish))
                    : NULL;
    free(all);
    if (!o) json_decref(lp);
    return o;
}

char *gen_answer(Gen *g, int *status) {
    for (int i = 0; i < g->n_c; i++)
        while (!g->c[i].finish) advance(g, &g->c[i], 1.0);
    *status = 0;
    if (has_ended(g, "cancelled")) return pd_error("the client left"), NULL;
    *status = 500;
    if (has_ended(g, "error")) return pd_error("the model failed on this request (see the server's log)"), NULL;
    *status = 503; /* the server stops (a stream ends with finish_reason "abort" instead) */
    if (has_ended(g, "abort")) return pd_error("the server is shutting down; this request was ended"), NULL;
    json_t *o = envelope(g, 0), *choices = json_array();
    for (int i = 0; i < g->n_c; i++)
        if (json_array_append_new(choices, whole_choice(g, i)))
            return json_decref(choices), json_decref(o), pd_error("serve: out of memory"), NULL;
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", usage(g));
    char *s = dump(o);
    if (s) *status = 200;
    return s;
}

/* a stream chunk for choice i: text[0..n) (may be empty), finish NULL until its last;
   chat's first names the role. With include_usage every chunk says "usage": null. */
static json_t *chunk(const Gen *g, int i, const char *s, size_t n, const char *finish, int first, json_t *lp) {
    json_t *o = envelope(g, 1), *choice;
    if (!lp) lp = json_null();
    if (g->req.kind == REQ_COMPLETION)
        choice = json_pack("{s:o, s:i, s:o, s:o}", "text", jtext(s, n), "index", i, "logprobs", lp, "finish_reason",
                           finish_of(finish));
    else {
        json_t *delta = json_object();
        if (first) json_object_set_new(delta, "role", json_string("assistant"));
        if (n || !finish) json_object_set_new(delta, "content", jtext(s, n));
        choice = json_pack("{s:i, s:o, s:o, s:o}", "index", i, "delta", delta, "logprobs", lp, "finish_reason",
                           finish_of(finish));
    }
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    if (g->req.include_usage) json_object_set_new(o, "usage", json_null());
    return o;
}

/* the logprobs of choice i's tokens whose text ends by byte upto (all it counts, once it
   has ended), or NULL when none is due */
static json_t *due_logprobs(Gen *g, int i, size_t upto) {
    GenChoice *c = &g->c[i];
    int to = c->lp_sent;
    while (to < c->n_gen && (c->finish || c->end[to] <= upto)) to++;
    if (g->req.logprobs < 0 || to == c->lp_sent) return NULL;
    json_t *lp = logprobs_new(g);
    if (answer_logprobs(lp, g, c, c->lp_sent, to, echo_chars(g, c))) return json_decref(lp), NULL;
    c->lp_sent = to;
    return lp;
}

/* choice i's next chunk, NULL when it has nothing to send yet (*oom: out of memory) */
static json_t *choice_event(Gen *g, int i, double wait, int *oom) {
    GenChoice *c = &g->c[i];
    if (!c->opened && g->req.kind == REQ_CHAT) { /* chat streams open with the role alone */
        c->opened = 1;
        return chunk(g, i, "", 0, NULL, 1, NULL);
    }
    size_t upto = advance(g, c, wait);
    if (c->finish && !strcmp(c->finish, "cancelled")) return NULL;
    if (!c->opened && g->req.echo) { /* the prompt first, its logprobs once the engine has them */
        if (g->req.logprobs >= 0 && !c->n_tok && !c->finish) return NULL;
        const GenPrompt *p = &g->p[c->prompt];
        json_t *lp = g->req.logprobs >= 0 ? logprobs_new(g) : NULL;
        if (lp && echo_logprobs(lp, g, c)) return json_decref(lp), *oom = 1, NULL;
        c->opened = 1;
        return chunk(g, i, p->text, p->text_n, NULL, 0, lp);
    }
    json_t *o = NULL;
    if (upto > c->sent) o = chunk(g, i, c->text + c->sent, upto - c->sent, NULL, 0, due_logprobs(g, i, upto));
    else if (c->finish) o = chunk(g, i, "", 0, c->finish, 0, due_logprobs(g, i, upto)), c->closed = 1;
    c->sent = upto, c->opened = 1;
    return o;
}

static char *event(json_t *o, size_t *n) {
    char *json = dump(o), *e = json ? pd_alloc(strlen(json) + 9) : NULL;
    if (e) *n = (size_t)sprintf(e, "data: %s\n\n", json);
    free(json);
    return e;
}

char *gen_event(Gen *g, size_t *n) {
    for (;;) {
        if (g->done || has_ended(g, "cancelled")) return NULL;
        int open = -1, oom = 0;
        for (int k = 0; k < g->n_c; k++) { /* a choice with something to send, in turn */
            int i = (g->next + k) % g->n_c;
            if (g->c[i].closed) continue;
            if (open < 0) open = i;
            json_t *o = choice_event(g, i, 0, &oom);
            if (oom) return end_all(g, "error"), NULL;
            if (!o) continue;
            g->next = (i + 1) % g->n_c;
            return event(o, n);
        }
        if (open < 0 && g->req.include_usage && !g->usage_sent) { /* OpenAI's usage chunk: no choices */
            json_t *o = envelope(g, 1);
            json_object_set_new(o, "choices", json_array());
            json_object_set_new(o, "usage", usage(g));
            g->usage_sent = 1;
            return event(o, n);
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
