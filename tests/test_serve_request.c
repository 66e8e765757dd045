/* test_serve_request — the OpenAI request shapes: what is taken, the defaults OpenAI
   documents (max_tokens 16 for completions, temperature 1), what is refused; the error
   object; UTF-8 cut and cleaned as Unicode's table 3-7 of well-formed byte sequences
   says. (The answers are test_serve_gen's.) */
#include <jansson.h>
#include <string.h>

#include "check.h"
#include "serve_request.h"
#include "util.h"

static int parse(ServeRequest *r, RequestKind k, const char *body) { return serve_request_parse(r, k, body, strlen(body)); }

static void test_completion(void) {
    ServeRequest r;
    CHECK(parse(&r, REQ_COMPLETION, "{\"model\":\"x\",\"prompt\":\"Once\"}") == 0, "%s", pd_errmsg());
    CHECK(!strcmp(r.prompt, "Once") && r.max_tokens == 16 && r.temperature == 1 && r.top_p == 1 && !r.stream &&
              !strcmp(r.method, "standard") && r.n_stop == 0,
          "OpenAI's defaults");
    serve_request_free(&r);
    CHECK(parse(&r, REQ_COMPLETION, "{\"prompt\":[\"a\"],\"max_tokens\":5,\"temperature\":0,\"top_p\":0.5,\"top_k\":40,"
                                    "\"seed\":9,\"stream\":true,\"method\":\"medusa\",\"stop\":[\"x\",\"yz\"]}") == 0,
          "%s", pd_errmsg());
    CHECK(!strcmp(r.prompt, "a") && r.max_tokens == 5 && r.temperature == 0 && r.top_p == 0.5f && r.top_k == 40 &&
              r.seed == 9 && r.stream && !strcmp(r.method, "medusa") && r.n_stop == 2 && !strcmp(r.stop[1], "yz"),
          "every field taken");
    serve_request_free(&r);
    const char *bad[][2] = {
        {"{\"prompt\":", "malformed JSON"},
        {"[1]", "JSON object"},
        {"{}", "'prompt' is missing"},
        {"{\"prompt\":3}", "'prompt' must be a string"},
        {"{\"prompt\":[\"a\",\"b\"]}", "exactly one string"},
        {"{\"prompt\":\"a\",\"max_tokens\":-1}", "'max_tokens' must be in"},
        {"{\"prompt\":\"a\",\"max_tokens\":1.5}", "whole numbers"},
        {"{\"prompt\":\"a\",\"temperature\":\"hot\"}", "'temperature' must be a number"},
        {"{\"prompt\":\"a\",\"top_p\":2}", "'top_p' must be in"},
        {"{\"prompt\":\"a\",\"stream\":1}", "'stream' must be true or false"},
        {"{\"prompt\":\"a\",\"method\":7}", "'method' must be"},
        {"{\"prompt\":\"a\",\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\"]}", "up to 4"},
        {"{\"prompt\":\"a\",\"stop\":[\"\"]}", "must not be empty"},
        {"{\"prompt\":\"a\",\"stop\":\"\"}", "must not be an empty string"},
        {"{\"prompt\":\"a\",\"prompt\":\"b\"}", "duplicate"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(parse(&r, REQ_COMPLETION, bad[i][0]) == -1 && strstr(pd_errmsg(), bad[i][1]), "%s refused: %s", bad[i][0],
              pd_errmsg());
}

static void test_chat(void) {
    ServeRequest r;
    CHECK(parse(&r, REQ_CHAT, "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"U\"},"
                              "{\"role\":\"assistant\",\"content\":\"A\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                              "\"text\":\"V\"}]}]}") == 0,
          "%s", pd_errmsg());
    CHECK(r.n_turns == 4 && !strcmp(r.turn[0].role, "system") && !strcmp(r.turn[3].content, "V") && r.max_tokens == -1,
          "a conversation; no max_tokens means to the context's end");
    serve_request_free(&r);
    const char *bad[][2] = {
        {"{\"messages\":[]}", "non-empty array"},
        {"{\"messages\":[{\"role\":\"user\"}]}", "'content' must be a string"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"system\",\"content\":\"b\"}]}", "system comes first"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"b\"}]}", "end with a user"},
        {"{\"messages\":[{\"role\":\"tool\",\"content\":\"a\"}]}", "role 'tool'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(parse(&r, REQ_CHAT, bad[i][0]) == -1 && strstr(pd_errmsg(), bad[i][1]), "%s refused: %s", bad[i][0], pd_errmsg());
}

static void test_error(void) {
    char *s = serve_error("bad \"quote\"", "invalid_request_error");
    json_t *o = json_loads(s, 0, NULL);
    CHECK(o && !strcmp(json_string_value(json_object_get(json_object_get(o, "error"), "message")), "bad \"quote\""), "error: %s", s);
    json_decref(o), free(s);
}

static void test_utf8(void) {
    /* whole: a sequence cut at the end waits; an invalid byte counts as whole */
    CHECK(utf8_whole("ab\xc3", 3) == 2 && utf8_whole("ab\xc3\xa9", 4) == 4, "a two-byte sequence");
    CHECK(utf8_whole("\xe2\x82", 2) == 0 && utf8_whole("\xe2\x82\xac", 3) == 3, "three bytes (euro sign)");
    CHECK(utf8_whole("\xf0\x9f\x98", 3) == 0 && utf8_whole("\xf0\x9f\x98\x80", 4) == 4, "four bytes (emoji)");
    CHECK(utf8_whole("\xff" "a", 2) == 2, "an invalid byte is whole");
    /* clean: table 3-7's ill-formed cases each become U+FFFD per byte */
    struct {
        const char *in, *out;
    } cases[] = {
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},             /* overlong '/' */
        {"\xe0\x80\xaf", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* overlong, three bytes */
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* a surrogate */
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* past U+10FFFF */
        {"\xf4\x8f\xbf\xbf", "\xf4\x8f\xbf\xbf"},             /* U+10FFFF itself */
        {"\xed\x9f\xbf", "\xed\x9f\xbf"},                     /* U+D7FF */
        {"a\xc3\xa9z", "a\xc3\xa9z"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n;
        char *c = utf8_clean(cases[i].in, strlen(cases[i].in), &n);
        CHECK(c && n == strlen(cases[i].out) && !memcmp(c, cases[i].out, n), "clean case %zu", i);
        free(c);
    }
}

int main(void) {
    test_completion();
    test_chat();
    test_error();
    test_utf8();
    return check_done("serve_request");
}
