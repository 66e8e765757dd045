/* test_serve_request — the OpenAI request shapes: what is taken, the defaults OpenAI
   documents (max_tokens 16 for completions, temperature 1), what is accepted because it
   asks for nothing, what is refused (by name: unsupported and unknown fields); the error
   object; UTF-8 cut and cleaned as Unicode's table 3-7 of well-formed byte sequences
   says. (The answers are test_serve_gen's.) */
#include <jansson.h>
#include <string.h>

#include "check.h"
#include "base/util.h"
#include "serve/serve_request.h"

static int parse(ServeRequest *r, RequestKind k, const char *body) {
    return serve_request_parse(r, k, body, strlen(body));
}

static void test_completion(void) {
    ServeRequest r;
    CHECK(parse(&r, REQ_COMPLETION, "{\"model\":\"x\",\"prompt\":\"Once\",\"user\":\"u\"}") == 0, "%s", pd_errmsg());
    CHECK(r.n_prompts == 1 && !strcmp(r.prompt[0].text, "Once") && r.max_tokens == 16 && r.temperature == 1 &&
              r.top_p == 1 && !r.stream && !strcmp(r.method, "standard") && r.n_stop == 0 && r.n == 1 &&
              r.logprobs == -1 && !r.echo && !r.has_seed && !r.include_usage,
          "OpenAI's defaults");
    serve_request_free(&r);
    CHECK(parse(&r, REQ_COMPLETION,
                "{\"prompt\":[\"a\"],\"max_tokens\":5,\"temperature\":0,\"top_p\":0.5,\"top_k\":40,"
                "\"seed\":9,\"stream\":true,\"method\":\"medusa\",\"stop\":[\"x\",\"yz\"],\"n\":3,"
                "\"logprobs\":5,\"echo\":true,\"stream_options\":{\"include_usage\":true},"
                "\"best_of\":1,\"suffix\":null,\"presence_penalty\":0,\"frequency_penalty\":0,"
                "\"logit_bias\":{}}") == 0,
          "%s", pd_errmsg());
    CHECK(!strcmp(r.prompt[0].text, "a") && r.max_tokens == 5 && r.temperature == 0 && r.top_p == 0.5f &&
              r.top_k == 40 && r.seed == 9 && r.has_seed && r.stream && !strcmp(r.method, "medusa") && r.n_stop == 2 &&
              !strcmp(r.stop[1], "yz") && r.n == 3 && r.logprobs == 5 && r.echo && r.include_usage,
          "every field taken; those that ask for nothing accepted");
    serve_request_free(&r);
    CHECK(parse(&r, REQ_COMPLETION, "{\"prompt\":[\"a\",\"b\\u00e9c\"],\"n\":2,\"max_tokens\":0}") == 0 &&
              r.n_prompts == 2 && r.prompt[1].n_text == 4 &&
              !strcmp(r.prompt[1].text, "b\xc3\xa9"
                                        "c") &&
              r.max_tokens == 0,
          "prompts as an array of strings; max_tokens 0: %s", pd_errmsg());
    serve_request_free(&r);
    CHECK(parse(&r, REQ_COMPLETION, "{\"prompt\":[1,2,3]}") == 0 && r.n_prompts == 1 && !r.prompt[0].text &&
              r.prompt[0].n_ids == 3 && r.prompt[0].ids[2] == 3,
          "a prompt of token ids");
    serve_request_free(&r);
    CHECK(parse(&r, REQ_COMPLETION, "{\"prompt\":[[1,2],[3]],\"seed\":-5}") == 0 && r.n_prompts == 2 &&
              r.prompt[1].n_ids == 1 && r.seed == (uint64_t)-5,
          "prompts of token ids; a negative seed");
    serve_request_free(&r);
    CHECK(parse(&r, REQ_COMPLETION, "{\"prompt\":\"a\",\"seed\":9223372036854775807}") == 0 &&
              r.seed == 9223372036854775807ull,
          "a seed of 63 bits, exact: %s", pd_errmsg());
    serve_request_free(&r);
    const char *bad[][2] = {
        {"{\"prompt\":", "malformed JSON"},
        {"[1]", "JSON object"},
        {"{}", "'prompt' is missing"},
        {"{\"prompt\":3}", "'prompt' must be a string, an array of strings"},
        {"{\"prompt\":[]}", "'prompt' is an empty array"},
        {"{\"prompt\":[\"a\",1]}", "item 1 is neither"},
        {"{\"prompt\":[[1],\"a\"]}", "item 1 is neither"},
        {"{\"prompt\":[[]]}", "empty array of token ids"},
        {"{\"prompt\":[1,-2]}", "token ids must be whole numbers"},
        {"{\"prompt\":[1,2.5]}", "token ids must be whole numbers"},
        {"{\"prompt\":\"a\",\"max_tokens\":-1}", "'max_tokens' must be in"},
        {"{\"prompt\":\"a\",\"max_tokens\":1.5}", "whole number"},
        {"{\"prompt\":\"a\",\"temperature\":\"hot\"}", "'temperature' must be a number"},
        {"{\"prompt\":\"a\",\"top_p\":2}", "'top_p' must be in"},
        {"{\"prompt\":\"a\",\"stream\":1}", "'stream' must be true or false"},
        {"{\"prompt\":\"a\",\"method\":7}", "'method' must be"},
        {"{\"prompt\":\"a\",\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\"]}", "up to 4"},
        {"{\"prompt\":\"a\",\"stop\":[\"\"]}", "must not be empty"},
        {"{\"prompt\":\"a\",\"stop\":\"\"}", "must not be an empty string"},
        {"{\"prompt\":\"a\",\"prompt\":\"b\"}", "duplicate"},
        {"{\"prompt\":\"a\",\"n\":0}", "'n' must be in [1, 128]"},
        {"{\"prompt\":\"a\",\"n\":129}", "'n' must be in [1, 128]"},
        {"{\"prompt\":[\"a\",\"b\",\"c\"],\"n\":50}", "150 choices, 128 at most"},
        {"{\"prompt\":\"a\",\"logprobs\":6}", "'logprobs' must be in [0, 5]"},
        {"{\"prompt\":\"a\",\"logprobs\":true}", "'logprobs' must be a number"},
        {"{\"prompt\":\"a\",\"echo\":1}", "'echo' must be true or false"},
        {"{\"prompt\":\"a\",\"best_of\":2}", "'best_of' is not supported"},
        {"{\"prompt\":\"a\",\"suffix\":\"end\"}", "'suffix' is not supported"},
        {"{\"prompt\":\"a\",\"presence_penalty\":0.5}", "'presence_penalty' is not supported"},
        {"{\"prompt\":\"a\",\"frequency_penalty\":-1}", "'frequency_penalty' is not supported"},
        {"{\"prompt\":\"a\",\"logit_bias\":{\"50256\":-100}}", "'logit_bias' is not supported"},
        {"{\"prompt\":\"a\",\"stream_options\":{\"include_usage\":true}}", "only allowed with 'stream': true"},
        {"{\"prompt\":\"a\",\"stream\":true,\"stream_options\":{\"x\":1}}", "'x' is not supported"},
        {"{\"prompt\":\"a\",\"stream\":true,\"stream_options\":{\"include_usage\":1}}",
         "'include_usage' must be true or false"},
        {"{\"prompt\":\"a\",\"user\":5}", "'user' must be a string"},
        {"{\"prompt\":\"a\",\"top_logprobs\":2}", "unknown field 'top_logprobs'"},
        {"{\"prompt\":\"a\",\"max_completion_tokens\":2}", "unknown field 'max_completion_tokens'"},
        {"{\"prompt\":\"a\",\"cache_prompt\":true}", "unknown field 'cache_prompt'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(parse(&r, REQ_COMPLETION, bad[i][0]) == -1 && strstr(pd_errmsg(), bad[i][1]), "%s refused: %s", bad[i][0],
              pd_errmsg());
}

static void test_chat(void) {
    ServeRequest r;
    CHECK(parse(&r, REQ_CHAT,
                "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"U\"},"
                "{\"role\":\"assistant\",\"content\":\"A\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                "\"text\":\"V\"},{\"type\":\"text\",\"text\":\"W\"},{\"type\":\"text\",\"text\":\"\"}]}]}") == 0,
          "%s", pd_errmsg());
    CHECK(r.n_turns == 4 && !strcmp(r.turn[0].role, "system") && !strcmp(r.turn[3].content, "VW") && r.max_tokens == -1,
          "a conversation; text parts joined; no max_tokens means to the context's end");
    serve_request_free(&r);
    CHECK(
        parse(&r, REQ_CHAT,
              "{\"messages\":[{\"role\":\"developer\",\"content\":[]},{\"role\":\"user\",\"content\":\"U\","
              "\"tool_calls\":[]}],\"logprobs\":true,\"top_logprobs\":20,\"n\":2,\"tools\":[],\"tool_choice\":\"none\","
              "\"response_format\":{\"type\":\"text\"},\"store\":false,\"service_tier\":\"auto\","
              "\"modalities\":[\"text\"],\"parallel_tool_calls\":true,\"max_completion_tokens\":3,\"metadata\":{}}") ==
            0,
        "%s", pd_errmsg());
    CHECK(!strcmp(r.turn[0].role, "system") && !strcmp(r.turn[0].content, "") && r.logprobs == 20 && r.n == 2 &&
              r.max_tokens == 3,
          "developer is system; logprobs with 20 alternatives; fields that ask for nothing accepted");
    serve_request_free(&r);
    CHECK(parse(&r, REQ_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"U\"}],\"logprobs\":true}") == 0 &&
              r.logprobs == 0,
          "logprobs without alternatives");
    serve_request_free(&r);
    const char *bad[][2] = {
        {"{\"messages\":[]}", "non-empty array"},
        {"{\"messages\":[{\"role\":\"user\"}]}", "'content' must be a string or an array of text parts"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"system\",\"content\":\"b\"}]}",
         "comes first"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"developer\",\"content\":\"b\"}]}",
         "developer message comes first"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"b\"}]}",
         "end with a user"},
        {"{\"messages\":[{\"role\":\"tool\",\"content\":\"a\"}]}", "role 'tool'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}",
         "content part type 'image_url' is not supported"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"input_audio\"}]"
         "}]}",
         "content part type 'input_audio'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"a\"}]}]}", "with a 'type'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\",\"name\":\"bob\"}]}", "'name' is not supported"},
        {"{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"1\"}]},{\"role\":\"user\","
         "\"content\":\"a\"}]}",
         "'tool_calls' is not supported"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"max_tokens\":0}", "'max_tokens' must be in [1"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"top_logprobs\":3}", "needs 'logprobs': true"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"logprobs\":true,\"top_logprobs\":21}",
         "'top_logprobs' must be in [0, 20]"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"logprobs\":3}", "'logprobs' must be true or false"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tools\":[{\"type\":\"function\"}]}",
         "'tools' is not supported"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tool_choice\":\"auto\"}",
         "'tool_choice' is not supported"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"functions\":[{}]}", "'functions' is not supported"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"response_format\":{\"type\":\"json_object\"}}",
         "'response_format' is not supported"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"store\":true}", "'store' is not supported"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"reasoning_effort\":\"low\"}",
         "'reasoning_effort' is not supported"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"modalities\":[\"text\",\"audio\"]}",
         "'modalities' is not supported"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"echo\":true}", "unknown field 'echo'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"best_of\":1}", "unknown field 'best_of'"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"repeat_penalty\":1.1}",
         "unknown field 'repeat_penalty'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(parse(&r, REQ_CHAT, bad[i][0]) == -1 && strstr(pd_errmsg(), bad[i][1]), "%s refused: %s", bad[i][0],
              pd_errmsg());
}

static void test_error(void) {
    char *s = serve_error("bad \"quote\"", "invalid_request_error");
    json_t *o = json_loads(s, 0, NULL);
    CHECK(o && !strcmp(json_string_value(json_object_get(json_object_get(o, "error"), "message")), "bad \"quote\""),
          "error: %s", s);
    json_decref(o), free(s);
}

static void test_utf8(void) {
    /* whole: a sequence cut at the end waits; an invalid byte counts as whole */
    CHECK(utf8_whole("ab\xc3", 3) == 2 && utf8_whole("ab\xc3\xa9", 4) == 4, "a two-byte sequence");
    CHECK(utf8_whole("\xe2\x82", 2) == 0 && utf8_whole("\xe2\x82\xac", 3) == 3, "three bytes (euro sign)");
    CHECK(utf8_whole("\xf0\x9f\x98", 3) == 0 && utf8_whole("\xf0\x9f\x98\x80", 4) == 4, "four bytes (emoji)");
    CHECK(utf8_whole("\xff"
                     "a",
                     2) == 2,
          "an invalid byte is whole");
    /* clean: table 3-7's ill-formed cases each become U+FFFD per byte */
    struct {
        const char *in, *out;
    } cases[] = {
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},                                 /* overlong '/' */
        {"\xe0\x80\xaf", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},                 /* overlong, three bytes */
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},                 /* a surrogate */
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* past U+10FFFF */
        {"\xf4\x8f\xbf\xbf", "\xf4\x8f\xbf\xbf"},                                 /* U+10FFFF itself */
        {"\xed\x9f\xbf", "\xed\x9f\xbf"},                                         /* U+D7FF */
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
