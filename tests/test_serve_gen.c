/* test_serve_gen — a request from its body to its answer on the test model, without
   HTTP: the answers' JSON shapes (OpenAI's), a stream that says what the whole answer
   says, stop strings found across tokens (and an empty one that matches nothing instead
   of spinning); n choices seeded seed + i, prompt arrays and token ids, echo, max_tokens
   0, include_usage; logprobs against an independent pass of the model over the whole
   sequence (log-softmax in the test's own code), the same numbers from every method. */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "backend.h"
#include "check.h"
#include "fixture.h"
#include "serve/serve_gen.h"

static Model M;
static Runner *R; /* M's forward workspace */
static Engine *E;
static GenModel GM;

/* the whole answer; with g, the request stays open for its jobs' tokens (gen_free it) */
static json_t *answer_of(RequestKind k, const char *body, Gen *keep) {
    Gen g;
    int status = 0;
    char *s = NULL;
    if (gen_start(&g, &GM, k, body, strlen(body), "cmpl-1", 1) == 0) s = gen_answer(&g, &status);
    CHECK(s && status == 200, "%s: %s", body, pd_errmsg());
    if (keep) *keep = g;
    else gen_free(&g);
    json_t *o = s ? json_loads(s, 0, NULL) : NULL;
    free(s);
    return o;
}

static json_t *answer(RequestKind k, const char *body) { return answer_of(k, body, NULL); }

/* the stream's events, parsed; the last must be [DONE] */
static json_t *stream(RequestKind k, const char *body) {
    Gen g;
    json_t *events = json_array();
    int done = 0;
    CHECK(gen_start(&g, &GM, k, body, strlen(body), "cmpl-2", 1) == 0, "%s: %s", body, pd_errmsg());
    size_t n;
    for (char *e; (e = gen_event(&g, &n)); free(e)) {
        CHECK(!done && !strncmp(e, "data: ", 6) && n > 8 && !strcmp(e + n - 2, "\n\n"), "an event: %s", e);
        e[n - 2] = 0;
        if (!strcmp(e + 6, "[DONE]")) done = 1;
        else json_array_append_new(events, json_loads(e + 6, 0, NULL));
    }
    CHECK(done, "the stream ends with [DONE]");
    gen_free(&g);
    return events;
}

static int np_of(const Gen *g) { return job_prompt_len(g->c[0].job); }

static const char *str(json_t *o, const char *path) { /* "a.b.0.c" */
    char buf[256], *save;
    snprintf(buf, sizeof buf, "%s", path);
    for (char *k = strtok_r(buf, ".", &save); k && o; k = strtok_r(NULL, ".", &save))
        o = json_is_array(o) ? json_array_get(o, atoi(k)) : json_object_get(o, k);
    return json_is_string(o) ? json_string_value(o) : NULL;
}

static json_t *at(json_t *o, const char *path) {
    char buf[256], *save;
    snprintf(buf, sizeof buf, "%s", path);
    for (char *k = strtok_r(buf, ".", &save); k && o; k = strtok_r(NULL, ".", &save))
        o = json_is_array(o) ? json_array_get(o, atoi(k)) : json_object_get(o, k);
    return o;
}

static long num(json_t *o, const char *path) { return (long)json_integer_value(at(o, path)); }

static void test_find_stop(void) {
    char *stop[] = {"lo", "", "abcdef"};
    size_t hold;
    CHECK(gen_find_stop(stop, 1, "hello", 5, 0, &hold) == 3 && hold == 0, "a stop string inside the text");
    CHECK(gen_find_stop(stop, 1, "hel", 3, 0, &hold) == 3 && hold == 1, "a text that may go on into one is held");
    CHECK(gen_find_stop(stop, 1, "hello", 5, 4, &hold) == 3, "one that began before `from` is found");
    CHECK(gen_find_stop(stop + 1, 1, "hello", 5, 0, &hold) == 5 && hold == 0, "an empty stop string matches nothing");
    CHECK(gen_find_stop(stop + 2, 1, "abc", 3, 0, &hold) == 3 && hold == 3, "one longer than the text: all of it held");
    CHECK(gen_find_stop(stop, 3, NULL, 0, 0, &hold) == 0 && hold == 0, "no text yet");
    CHECK(gen_find_stop(stop, 3, "abc", 3, 9, &hold) == 3, "from past the end finds nothing");
}

static void test_answers(void) {
    const char *body = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 20, \"temperature\": 0}";
    json_t *o = answer(REQ_COMPLETION, body);
    CHECK(o && !strcmp(str(o, "object"), "text_completion") && !strcmp(str(o, "id"), "cmpl-1") &&
              !strcmp(str(o, "model"), "test") && json_is_integer(at(o, "created")),
          "a completion's envelope");
    CHECK(json_array_size(at(o, "choices")) == 1 && num(o, "choices.0.index") == 0 &&
              json_is_null(at(o, "choices.0.logprobs")) && !strcmp(str(o, "choices.0.finish_reason"), "length"),
          "its one choice");
    CHECK(num(o, "usage.completion_tokens") == 20 && num(o, "usage.total_tokens") == 20 + num(o, "usage.prompt_tokens"),
          "usage counts the tokens");
    const char *text = str(o, "choices.0.text");
    json_t *ev = stream(REQ_COMPLETION,
                        "{\"prompt\": \"Once upon a time\", \"max_tokens\": 20, \"temperature\": 0, \"stream\": true}");
    char got[4096] = "";
    size_t i;
    json_t *e;
    json_array_foreach(ev, i, e)
        strncat(got, str(e, "choices.0.text") ? str(e, "choices.0.text") : "", sizeof got - strlen(got) - 1);
    CHECK(text && !strcmp(got, text), "the stream's text = the whole answer's: '%s' vs '%s'", got, text);
    CHECK(!strcmp(str(json_array_get(ev, json_array_size(ev) - 1), "choices.0.finish_reason"), "length"),
          "the last chunk ends it");
    json_decref(ev);

    /* a stop string in the middle: the answer ends before it, usage counts to it */
    char *cut = text ? strdup(text + 8) : NULL, req[512];
    if (cut) cut[3] = 0;
    snprintf(req, sizeof req,
             "{\"prompt\": \"Once upon a time\", \"max_tokens\": 20, \"temperature\": 0, \"stop\": [\"zzz\", \"%s\"]}",
             cut ? cut : "");
    json_t *s = answer(REQ_COMPLETION, req);
    const char *st = str(s, "choices.0.text");
    CHECK(st && strlen(st) <= 8 && !strncmp(st, text, strlen(st)) &&
              !strcmp(str(s, "choices.0.finish_reason"), "stop") && num(s, "usage.completion_tokens") < 20,
          "a stop string ('%s') cuts the answer: '%s'", cut, st);
    json_decref(s), free(cut), json_decref(o);

    o = answer(REQ_CHAT,
               "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 5, \"temperature\": 0}");
    CHECK(o && !strcmp(str(o, "object"), "chat.completion") && !strcmp(str(o, "choices.0.message.role"), "assistant") &&
              str(o, "choices.0.message.content"),
          "a chat answer");
    json_decref(o);
    ev = stream(REQ_CHAT,
                "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 5, \"stream\": true}");
    CHECK(!strcmp(str(json_array_get(ev, 0), "object"), "chat.completion.chunk") &&
              !strcmp(str(json_array_get(ev, 0), "choices.0.delta.role"), "assistant"),
          "a chat stream opens with the role");
    json_decref(ev);
}

/* refused at the start, with a message holding `says` */
static void refused(RequestKind k, const char *body, const char *says) {
    Gen g;
    int rc = gen_start(&g, &GM, k, body, strlen(body), "x", 1);
    CHECK(rc == -1 && strstr(pd_errmsg(), says), "%s refused naming '%s': %s", body, says,
          rc ? pd_errmsg() : "accepted");
    gen_free(&g);
}

static void test_choices(void) {
    /* n: choice i is the one request with seed + i; greedy choices are all the same */
    json_t *o =
        answer(REQ_COMPLETION, "{\"prompt\": \"Tom\", \"max_tokens\": 12, \"temperature\": 1, \"seed\": 7, \"n\": 3}");
    CHECK(json_array_size(at(o, "choices")) == 3 && num(o, "choices.2.index") == 2, "n = 3 gives three choices");
    int differ = 0, tokens = 0;
    for (int i = 0; i < 3; i++) {
        char req[256];
        snprintf(req, sizeof req, "{\"prompt\": \"Tom\", \"max_tokens\": 12, \"temperature\": 1, \"seed\": %d}", 7 + i);
        json_t *one = answer(REQ_COMPLETION, req);
        char path[32];
        snprintf(path, sizeof path, "choices.%d.text", i);
        CHECK(str(one, "choices.0.text") && str(o, path) && !strcmp(str(one, "choices.0.text"), str(o, path)),
              "choice %d = the request with seed %d", i, 7 + i);
        differ += i && strcmp(str(o, path), str(o, "choices.0.text"));
        tokens += (int)num(one, "usage.completion_tokens");
        json_decref(one);
    }
    CHECK(differ > 0, "sampled choices differ");
    CHECK(num(o, "usage.completion_tokens") == tokens &&
              num(o, "usage.prompt_tokens") * 3 != num(o, "usage.total_tokens") - tokens,
          "usage: every choice's tokens, the prompt once");
    json_decref(o);
    o = answer(
        REQ_CHAT,
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 8, \"temperature\": 0, \"n\": 2}");
    CHECK(json_array_size(at(o, "choices")) == 2 &&
              !strcmp(str(o, "choices.0.message.content"), str(o, "choices.1.message.content")),
          "greedy n = 2 gives two equal choices");
    json_decref(o);

    /* prompt arrays: one answer per prompt, index = prompt × n + i */
    o = answer(
        REQ_COMPLETION,
        "{\"prompt\": [\"Once\", \"Tom went\"], \"max_tokens\": 8, \"temperature\": 0.8, \"seed\": 3, \"n\": 2}");
    json_t *a =
        answer(REQ_COMPLETION, "{\"prompt\": \"Tom went\", \"max_tokens\": 8, \"temperature\": 0.8, \"seed\": 4}");
    CHECK(json_array_size(at(o, "choices")) == 4 && num(o, "choices.3.index") == 3 &&
              !strcmp(str(o, "choices.3.text"), str(a, "choices.0.text")),
          "prompt 1's choice 1 is index 3, the request with that prompt and seed + 1");
    json_decref(a), json_decref(o);

    /* token ids, one prompt or several; ids outside the vocabulary are named */
    int32_t *ids;
    int n;
    CHECK(tok_encode_flags(M.tok, "Once upon a time", 16, tok_add_bos(M.tok) ? TOK_ADD_BOS : 0, &ids, &n) == 0,
          "encode");
    char req[2048] = "{\"prompt\": [", list[512] = "";
    for (int i = 0; i < n; i++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", i ? ", " : "", ids[i]);
    free(ids);
    snprintf(req + strlen(req), sizeof req - strlen(req), "%s], \"max_tokens\": 10, \"temperature\": 0}", list);
    o = answer(REQ_COMPLETION, req);
    a = answer(REQ_COMPLETION, "{\"prompt\": \"Once upon a time\", \"max_tokens\": 10, \"temperature\": 0}");
    CHECK(str(o, "choices.0.text") && !strcmp(str(o, "choices.0.text"), str(a, "choices.0.text")) &&
              num(o, "usage.prompt_tokens") == num(a, "usage.prompt_tokens"),
          "token ids say what their text says");
    json_decref(o);
    snprintf(req, sizeof req, "{\"prompt\": [[%s], [%s]], \"max_tokens\": 10, \"temperature\": 0}", list, list);
    o = answer(REQ_COMPLETION, req);
    CHECK(json_array_size(at(o, "choices")) == 2 && !strcmp(str(o, "choices.1.text"), str(a, "choices.0.text")),
          "arrays of token ids");
    json_decref(o), json_decref(a);
    refused(REQ_COMPLETION, "{\"prompt\": [1, 600, 3]}", "token id 600");
    refused(REQ_COMPLETION, "{\"prompt\": [[1, 2], [3, 512]]}", "token id 512");

    /* the developer role is the system's; text parts are joined */
    o = answer(REQ_CHAT, "{\"messages\": [{\"role\": \"system\", \"content\": \"Be kind.\"}, {\"role\": \"user\", "
                         "\"content\": \"Hi you\"}], "
                         "\"max_tokens\": 8, \"temperature\": 0}");
    a = answer(
        REQ_CHAT,
        "{\"messages\": [{\"role\": \"developer\", \"content\": [{\"type\": \"text\", \"text\": \"Be \"}, "
        "{\"type\": \"text\", \"text\": \"kind.\"}]}, {\"role\": \"user\", \"content\": [{\"type\": \"text\", "
        "\"text\": \"Hi\"}, {\"type\": \"text\", \"text\": \" you\"}]}], \"max_tokens\": 8, \"temperature\": 0}");
    CHECK(str(o, "choices.0.message.content") &&
              !strcmp(str(o, "choices.0.message.content"), str(a, "choices.0.message.content")) &&
              num(o, "usage.prompt_tokens") == num(a, "usage.prompt_tokens"),
          "developer = system, and text parts joined = the string");
    json_decref(o), json_decref(a);

    /* echo; max_tokens 0 answers no tokens, "length" */
    o = answer(REQ_COMPLETION, "{\"prompt\": \"Once upon\", \"max_tokens\": 6, \"temperature\": 0, \"echo\": true}");
    a = answer(REQ_COMPLETION, "{\"prompt\": \"Once upon\", \"max_tokens\": 6, \"temperature\": 0}");
    char both[512];
    snprintf(both, sizeof both, "Once upon%s", str(a, "choices.0.text"));
    CHECK(!strcmp(str(o, "choices.0.text"), both), "echo: the prompt, then the answer: '%s'", str(o, "choices.0.text"));
    json_decref(o), json_decref(a);
    o = answer(REQ_COMPLETION, "{\"prompt\": \"Once upon\", \"max_tokens\": 0}");
    CHECK(!strcmp(str(o, "choices.0.text"), "") && !strcmp(str(o, "choices.0.finish_reason"), "length") &&
              num(o, "usage.completion_tokens") == 0,
          "max_tokens 0: no tokens, finish_reason length");
    json_decref(o);
    refused(REQ_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 0}",
            "'max_tokens' must be in [1");
}

/* include_usage: its own last chunk, no choices; every other chunk "usage": null. Without
   it, no usage anywhere. */
static void test_usage_chunk(void) {
    json_t *ev = stream(REQ_COMPLETION, "{\"prompt\": \"Once\", \"max_tokens\": 6, \"stream\": true, \"n\": 2, "
                                        "\"stream_options\": {\"include_usage\": true}}");
    size_t n = json_array_size(ev), i, nulls = 0;
    json_t *last = json_array_get(ev, n - 1), *e;
    CHECK(n > 2 && json_array_size(at(last, "choices")) == 0 && num(last, "usage.completion_tokens") == 12,
          "the usage chunk");
    json_array_foreach(ev, i, e) nulls += i < n - 1 && json_is_null(json_object_get(e, "usage"));
    CHECK(nulls == n - 1, "the other chunks say usage: null (%zu of %zu)", nulls, n - 1);
    json_decref(ev);
    ev = stream(REQ_CHAT,
                "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 4, \"stream\": true}");
    int any = 0;
    json_array_foreach(ev, i, e) any |= json_object_get(e, "usage") != NULL;
    CHECK(!any && json_array_size(ev) > 2, "without include_usage no chunk has a usage");
    json_decref(ev);
    refused(REQ_COMPLETION, "{\"prompt\": \"a\", \"stream_options\": {\"include_usage\": true}}",
            "only allowed with 'stream': true");
}

/* ---- logprobs ---- */

/* the log-softmax after each of tok[0..n) by a pass of its own: one sequence through
   the whole model in a fresh cache, 32 positions a call, in double (lp[n][V]) */
static double *reference(const int32_t *tok, int n) {
    int V = M.c.vocab_size, dim = M.c.dim;
    KVCache kv;
    double *lp = malloc(sizeof(double) * n * V);
    float *h = malloc(sizeof(float) * 32 * dim), *x = malloc(sizeof(float) * 32 * V);
    if (kv_init(&kv, &M.c, 1, n + 16, 16) || !lp || !h || !x) return free(h), free(x), free(lp), NULL;
    int seq = kv_seq_new(&kv), pos[32], sq[32];
    for (int a = 0; a < n; a += 32) {
        int k = n - a < 32 ? n - a : 32;
        for (int i = 0; i < k; i++) pos[i] = a + i, sq[i] = seq;
        Batch b = {k, tok + a, sq, pos, NULL, NULL};
        if (forward_layers(R, &kv, &b, 0, M.c.n_layers, h) || final_logits(R, h, k, x)) break;
        for (int i = 0; i < k; i++) {
            const float *r = x + (size_t)i * V;
            double mx = r[0], sum = 0;
            for (int v = 1; v < V; v++) mx = r[v] > mx ? r[v] : mx;
            for (int v = 0; v < V; v++) sum += exp(r[v] - mx);
            for (int v = 0; v < V; v++) lp[(size_t)(a + i) * V + v] = r[v] - mx - log(sum);
        }
    }
    kv_free(&kv);
    free(h), free(x);
    return lp;
}

/* the choice's reported logprobs (the job's, and the answer's JSON: token_logprobs or
   content[].logprob, with the top alternatives) against the reference, from position
   `first` (1 with echo: the prompt's too) */
static void check_logprobs(const Gen *g, int ci, json_t *answer, int first, int top, const char *what) {
    const GenChoice *c = &g->c[ci];
    const int32_t *t = job_tokens(c->job);
    const TokenLogprob *lp = job_logprobs(c->job);
    int np = job_prompt_len(c->job), n = np + c->n_gen, V = M.c.vocab_size, bad = 0, badj = 0, badtop = 0;
    double *ref = reference(t, n), worst = 0;
    CHECK(ref && lp, "%s: a reference pass and logprobs", what);
    if (!ref || !lp) return free(ref);
    char path[64];
    snprintf(path, sizeof path, "choices.%d.logprobs", ci);
    json_t *o = at(answer, path),
           *list = g->req.kind == REQ_CHAT ? json_object_get(o, "content") : json_object_get(o, "token_logprobs");
    CHECK(json_array_size(list) == (size_t)(n - first + (first == 1)), "%s: %zu tokens listed, %d generated", what,
          json_array_size(list), n - first);
    for (int k = first; k < n; k++) {
        const double *r = ref + (size_t)(k - 1) * V;
        double d = fabs(lp[k].logprob - r[t[k]]);
        worst = d > worst ? d : worst;
        bad += d > 1e-5;
        json_t *j = json_array_get(list, k - first + (first == 1));
        double jv = json_real_value(g->req.kind == REQ_CHAT ? json_object_get(j, "logprob") : j);
        badj += jv != (double)lp[k].logprob;
        for (int i = 0; i < top; i++) { /* alternative i ranks i-th: best first, ties by the lower id */
            int id = lp[k].top[i], rank = 0;
            for (int v = 0; v < V; v++) rank += r[v] > r[id] || (r[v] == r[id] && v < id);
            badtop += rank != i || fabs(lp[k].top_logprob[i] - r[id]) > 1e-5;
        }
    }
    CHECK(!bad && !badj && !badtop,
          "%s: %d of %d logprobs off the reference (worst %.2g), %d in the JSON, %d top entries", what, bad, n - first,
          worst, badj, badtop);
    free(ref);
}

/* the JSON logprobs of a request are the same, to the bit, for every method */
static char *logprobs_json(RequestKind k, const char *body) {
    json_t *o = answer(k, body);
    char *s = json_dumps(at(o, "choices.0.logprobs"), JSON_COMPACT);
    json_decref(o);
    return s;
}

static void test_logprobs(void) {
    Gen g;
    json_t *o = answer_of(REQ_COMPLETION,
                          "{\"prompt\": \"Once upon a time\", \"max_tokens\": 30, \"temperature\": 0, \"logprobs\": 5, "
                          "\"echo\": true}",
                          &g);
    check_logprobs(&g, 0, o, 1, 5, "completion, greedy, echo");
    CHECK(json_is_null(at(o, "choices.0.logprobs.token_logprobs.0")) &&
              json_is_null(at(o, "choices.0.logprobs.top_logprobs.0")),
          "echo: the first token has no logprob");
    json_t *tokens = at(o, "choices.0.logprobs.tokens"), *off = at(o, "choices.0.logprobs.text_offset");
    const char *text = str(o, "choices.0.text");
    int misplaced = 0;
    for (size_t i = 1; i < json_array_size(tokens); i++) { /* the text is ASCII: characters are bytes */
        const char *tk = json_string_value(json_array_get(tokens, i));
        misplaced += strncmp(text + json_integer_value(json_array_get(off, i)), tk, strlen(tk)) != 0;
    }
    CHECK(!misplaced && json_object_size(at(o, "choices.0.logprobs.top_logprobs.3")) >= 5,
          "text_offset: each token at its place (%d not)", misplaced);
    gen_free(&g), json_decref(o);
    o = answer_of(
        REQ_COMPLETION,
        "{\"prompt\": \"Tom and Lily\", \"max_tokens\": 30, \"temperature\": 0.9, \"seed\": 4, \"logprobs\": 2, "
        "\"method\": \"prompt-lookup\"}",
        &g);
    check_logprobs(&g, 0, o, np_of(&g), 2, "completion, sampled, prompt lookup");
    gen_free(&g), json_decref(o);
    o = answer_of(
        REQ_CHAT,
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Tell a story.\"}], \"max_tokens\": 20, "
        "\"temperature\": 0.7, \"seed\": 2, \"logprobs\": true, \"top_logprobs\": 20, \"method\": \"lookahead\"}",
        &g);
    check_logprobs(&g, 0, o, np_of(&g), 20, "chat, sampled, lookahead, 20 alternatives");
    CHECK(json_array_size(at(o, "choices.0.logprobs.content.0.top_logprobs")) == 20 &&
              json_is_array(at(o, "choices.0.logprobs.content.0.bytes")),
          "chat's shape: token, logprob, bytes, top_logprobs");
    gen_free(&g), json_decref(o);
    o = answer_of(REQ_COMPLETION, "{\"prompt\": \"Once upon\", \"max_tokens\": 0, \"echo\": true, \"logprobs\": 1}",
                  &g);
    check_logprobs(&g, 0, o, 1, 1, "max_tokens 0 with echo: the prompt's logprobs");
    gen_free(&g), json_decref(o);

    /* every method: the same numbers as standard, bit for bit */
    const char *methods[] = {"prompt-lookup", "lookahead"};
    const char *body =
        "{\"prompt\": \"Once upon a time, there was a little girl\", \"max_tokens\": 60, \"temperature\": 0, "
        "\"logprobs\": 5, \"method\": \"%s\"}";
    char req[512];
    snprintf(req, sizeof req, body, "standard");
    char *want = logprobs_json(REQ_COMPLETION, req);
    for (int m = 0; m < 2; m++) {
        snprintf(req, sizeof req, body, methods[m]);
        char *got = logprobs_json(REQ_COMPLETION, req);
        CHECK(want && got && !strcmp(want, got), "%s: the logprobs standard gives, bit for bit", methods[m]);
        free(got);
    }
    /* a stream lists the whole answer's logprobs, chunk by chunk */
    json_t *whole = json_loads(want, 0, NULL),
           *ev = stream(REQ_COMPLETION, "{\"prompt\": \"Once upon a time, there was a little girl\", "
                                        "\"max_tokens\": 60, \"temperature\": 0, \"logprobs\": 5, \"stream\": true}");
    json_t *joined = json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset"),
           *e;
    size_t i;
    json_array_foreach(ev, i, e) {
        json_t *lp = at(e, "choices.0.logprobs");
        const char *key;
        json_t *v;
        if (json_is_object(lp)) json_object_foreach(lp, key, v) json_array_extend(json_object_get(joined, key), v);
    }
    CHECK(json_equal(joined, whole), "streamed logprobs = the whole answer's");
    json_decref(joined), json_decref(whole), json_decref(ev), free(want);

    /* the methods that need heads or a draft, sampled: each token's logprobs are the
       target's (decode_keep's copies, where sampling changes the rows in place) */
    const char *more[] = {"adadecode", "self-speculative", "medusa", "speculative"};
    for (int m = 0; m < 4; m++) {
        if (engine_method_ok(E, more[m])) {
            printf("serve_gen: %s: %s: not checked\n", more[m], pd_errmsg());
            continue;
        }
        snprintf(req, sizeof req,
                 "{\"prompt\": \"Once upon a time\", \"max_tokens\": 40, \"temperature\": 0.8, \"seed\": 9, "
                 "\"logprobs\": 3, \"method\": \"%s\"}",
                 more[m]);
        o = answer_of(REQ_COMPLETION, req, &g);
        char what[64];
        snprintf(what, sizeof what, "completion, sampled, %s", more[m]);
        check_logprobs(&g, 0, o, np_of(&g), 3, what);
        gen_free(&g), json_decref(o);
        snprintf(req, sizeof req, body, more[m]);
        char *got = logprobs_json(REQ_COMPLETION, req);
        snprintf(req, sizeof req, body, "standard");
        want = logprobs_json(REQ_COMPLETION, req);
        CHECK(want && got && !strcmp(want, got), "%s: the logprobs standard gives, bit for bit", more[m]);
        free(got), free(want);
    }
}

int main(void) {
    if (test_model_load(&M) || !(R = runner_new(&M))) return check_done("serve_gen");
    k_init(1);
    EngineOptions o = {
        .parallel = 4, .ctx = 256, .block_size = 16, .prefill_chunk = 64, .continuous = 1, .spec_max_batch = 1};
    static ExitHeads eh; /* the trained test heads, when make has built them; the test model as its own draft */
    static MedusaHeads mh;
    static Model draft;
    char path[512];
    const char *build = getenv("BUILD") && *getenv("BUILD") ? getenv("BUILD") : "build";
    snprintf(path, sizeof path, "%s/test-heads.safetensors.zst", build);
    if (heads_load(&eh, path, &M) == 0) o.opt.heads = &eh;
    snprintf(path, sizeof path, "%s/test-medusa.safetensors.zst", build);
    if (medusa_load(&mh, path, &M) == 0) o.opt.medusa = &mh;
    if (model_load(&draft, test_model_path()) == 0) o.opt.draft = &draft;
    o.kv_blocks = 4 * (256 + 256) / 16;
    E = engine_new(&M, &o);
    CHECK(E, "engine: %s", pd_errmsg());
    if (!E) return check_done("serve_gen");
    GM = (GenModel){&M, E, CHAT_CHATML, "", "test"};
    test_find_stop();
    test_answers();
    test_choices();
    test_usage_chunk();
    test_logprobs();
    engine_free(E);
    return check_done("serve_gen");
}
