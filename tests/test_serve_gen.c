/* test_serve_gen — a request from its body to its answer on the test model, without
   HTTP: the answers' JSON shapes (OpenAI's), a stream that says what the whole answer
   says, stop strings found across tokens (and an empty one that matches nothing instead
   of spinning). */
#include <jansson.h>
#include <string.h>

#include "backend.h"
#include "check.h"
#include "fixture.h"
#include "serve_gen.h"

static Model M;
static Engine *E;
static GenModel GM;

static json_t *answer(RequestKind k, const char *body) {
    Gen g;
    int status = 0;
    char *s = NULL;
    if (gen_start(&g, &GM, k, body, strlen(body), "cmpl-1", 1) == 0) s = gen_answer(&g, &status);
    CHECK(s && status == 200, "%s: %s", body, pd_errmsg());
    gen_free(&g);
    json_t *o = s ? json_loads(s, 0, NULL) : NULL;
    free(s);
    return o;
}

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
    json_t *ev = stream(REQ_COMPLETION, "{\"prompt\": \"Once upon a time\", \"max_tokens\": 20, \"temperature\": 0, \"stream\": true}");
    char got[4096] = "";
    size_t i;
    json_t *e;
    json_array_foreach(ev, i, e) strncat(got, str(e, "choices.0.text") ? str(e, "choices.0.text") : "", sizeof got - strlen(got) - 1);
    CHECK(text && !strcmp(got, text), "the stream's text = the whole answer's: '%s' vs '%s'", got, text);
    CHECK(!strcmp(str(json_array_get(ev, json_array_size(ev) - 1), "choices.0.finish_reason"), "length"), "the last chunk ends it");
    json_decref(ev);

    /* a stop string in the middle: the answer ends before it, usage counts to it */
    char *cut = text ? strdup(text + 8) : NULL, req[512];
    if (cut) cut[3] = 0;
    snprintf(req, sizeof req, "{\"prompt\": \"Once upon a time\", \"max_tokens\": 20, \"temperature\": 0, \"stop\": [\"zzz\", \"%s\"]}",
             cut ? cut : "");
    json_t *s = answer(REQ_COMPLETION, req);
    const char *st = str(s, "choices.0.text");
    CHECK(st && strlen(st) <= 8 && !strncmp(st, text, strlen(st)) && !strcmp(str(s, "choices.0.finish_reason"), "stop") &&
              num(s, "usage.completion_tokens") < 20,
          "a stop string ('%s') cuts the answer: '%s'", cut, st);
    json_decref(s), free(cut), json_decref(o);

    o = answer(REQ_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 5, \"temperature\": 0}");
    CHECK(o && !strcmp(str(o, "object"), "chat.completion") && !strcmp(str(o, "choices.0.message.role"), "assistant") &&
              str(o, "choices.0.message.content"),
          "a chat answer");
    json_decref(o);
    ev = stream(REQ_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 5, \"stream\": true}");
    CHECK(!strcmp(str(json_array_get(ev, 0), "object"), "chat.completion.chunk") &&
              !strcmp(str(json_array_get(ev, 0), "choices.0.delta.role"), "assistant"),
          "a chat stream opens with the role");
    json_decref(ev);
}

int main(void) {
    if (test_model_load(&M)) return check_done("serve_gen");
    k_init(1);
    EngineOptions o = {.parallel = 4, .ctx = 256, .block_size = 16, .prefill_chunk = 64, .continuous = 1, .spec_max_batch = 1};
    o.kv_blocks = 4 * (256 + 256) / 16;
    E = engine_new(&M, &o);
    CHECK(E, "engine: %s", pd_errmsg());
    if (!E) return check_done("serve_gen");
    GM = (GenModel){&M, E, CHAT_CHATML, "", "test"};
    test_find_stop();
    test_answers();
    engine_free(E);
    return check_done("serve_gen");
}
