/* serve_request.c — see serve_request.h. Every field OpenAI documents for the endpoint
   is known: taken, accepted where its value asks for nothing (n = 1, "user", penalties of
   0...), or refused by name; a field that is not OpenAI's (nor one of paradec's own) is
   refused by name too. Known ones of the wrong type are refused. */
#include "serve/serve_request.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"
#include "decode/method.h"

/* the fields each endpoint knows: OpenAI's, then paradec's own (top_k, method) */
static const char *const COMPLETION_FIELDS[] = {"model",
                                                "prompt",
                                                "max_tokens",
                                                "temperature",
                                                "top_p",
                                                "n",
                                                "stream",
                                                "stream_options",
                                                "logprobs",
                                                "echo",
                                                "stop",
                                                "presence_penalty",
                                                "frequency_penalty",
                                                "best_of",
                                                "logit_bias",
                                                "user",
                                                "seed",
                                                "suffix",
                                                "top_k",
                                                "method",
                                                NULL};
static const char *const CHAT_FIELDS[] = {"model",
                                          "messages",
                                          "max_tokens",
                                          "max_completion_tokens",
                                          "temperature",
                                          "top_p",
                                          "n",
                                          "stream",
                                          "stream_options",
                                          "stop",
                                          "presence_penalty",
                                          "frequency_penalty",
                                          "logit_bias",
                                          "logprobs",
                                          "top_logprobs",
                                          "user",
                                          "seed",
                                          "tools",
                                          "tool_choice",
                                          "functions",
                                          "function_call",
                                          "parallel_tool_calls",
                                          "response_format",
                                          "store",
                                          "metadata",
                                          "service_tier",
                                          "modalities",
                                          "audio",
                                          "prediction",
                                          "reasoning_effort",
                                          "web_search_options",
                                          "verbosity",
                                          "top_k",
                                          "method",
                                          NULL};

static int listed(const char *const *list, const char *key) {
    for (; *list; list++)
        if (!strcmp(*list, key)) return 1;
    return 0;
}

static int absent(json_t *x) { return !x || json_is_null(x); }

/* a number field in [lo, hi], or the default when absent or null */
static int number(json_t *o, const char *key, double lo, double hi, double *v) {
    json_t *x = json_object_get(o, key);
    if (absent(x)) return 0;
    if (!json_is_number(x)) return pd_error("'%s' must be a number", key);
    double d = json_number_value(x);
    if (!(d >= lo && d <= hi)) return pd_error("'%s' must be in [%g, %g], not %g", key, lo, hi, d);
    *v = d;
    return 0;
}

/* the same for a whole number */
static int whole(json_t *o, const char *key, double lo, double hi, double *v) {
    if (number(o, key, lo, hi, v)) return -1;
    return *v == (double)(long long)*v ? 0 : pd_error("'%s' must be a whole number", key);
}

static int flag(json_t *o, const char *key, int *v) {
    json_t *x = json_object_get(o, key);
    if (absent(x)) return 0;
    if (!json_is_boolean(x)) return pd_error("'%s' must be true or false", key);
    *v = json_is_true(x);
    return 0;
}

static int text(json_t *x, const char *what, char **out) {
    if (!json_is_string(x)) return pd_error("'%s' must be a string", what);
    *out = pd_strdup(json_string_value(x));
    return *out ? 0 : -1;
}

/* ---- fields that are refused unless they ask for nothing ---- */

/* the field is absent, null, or holds what asks for nothing: a number equal to zero_num
   (when the field is a number), an empty array or object, or one of the strings in ok
   ("a|b"); else 400 naming it, and why */
static int nothing_asked(json_t *o, const char *key, const char *ok, const char *why) {
    json_t *x = json_object_get(o, key);
    if (absent(x)) return 0;
    if ((json_is_array(x) && !json_array_size(x)) || (json_is_object(x) && !json_object_size(x))) return 0;
    if (ok && json_is_string(x)) {
        const char *s = json_string_value(x);
        size_t n = strlen(s);
        for (const char *p = ok; *p;) {
            const char *bar = strchr(p, '|'), *end = bar ? bar : p + strlen(p);
            if ((size_t)(end - p) == n && !strncmp(p, s, n)) return 0;
            p = bar ? bar + 1 : end;
        }
    }
    return pd_error("'%s' is not supported: %s", key, why);
}

static int penalty(json_t *o, const char *key) {
    double v = 0;
    if (number(o, key, -2, 2, &v)) return -1;
    return v == 0 ? 0 : pd_error("'%s' is not supported: penalties change the model's distribution (only 0)", key);
}

static int unsupported(ServeRequest *r, json_t *o) {
    double best_of = 1;
    if (penalty(o, "presence_penalty") || penalty(o, "frequency_penalty") ||
        nothing_asked(o, "logit_bias", NULL, "biases change the model's distribution (only {})"))
        return -1;
    json_t *u = json_object_get(o, "user"), *m = json_object_get(o, "model");
    if (!absent(u) && !json_is_string(u)) return pd_error("'user' must be a string");
    if (!absent(m) && !json_is_string(m)) return pd_error("'model' must be a string");
    if (r->kind == REQ_COMPLETION) {
        if (whole(o, "best_of", 0, 1 << 20, &best_of)) return -1;
        if (best_of != 1) return pd_error("'best_of' is not supported (only 1; 'n' gives several choices)");
        return nothing_asked(o, "suffix", "", "this server does not fill in text before a suffix");
    }
    json_t *rf = json_object_get(o, "response_format"), *ptc = json_object_get(o, "parallel_tool_calls");
    if (!absent(rf) &&
        !(json_is_object(rf) && json_object_size(rf) == 1 && json_is_string(json_object_get(rf, "type")) &&
          !strcmp(json_string_value(json_object_get(rf, "type")), "text")))
        return pd_error("'response_format' is not supported: only {\"type\": \"text\"} (no JSON mode or schemas)");
    if (!absent(ptc) && !json_is_boolean(ptc)) return pd_error("'parallel_tool_calls' must be true or false");
    json_t *store = json_object_get(o, "store"), *mod = json_object_get(o, "modalities");
    if (!absent(store) && !json_is_false(store))
        return pd_error("'store' is not supported: this server keeps no completions");
    if (!absent(mod) && !(json_is_array(mod) && json_array_size(mod) == 1 && json_is_string(json_array_get(mod, 0)) &&
                          !strcmp(json_string_value(json_array_get(mod, 0)), "text")))
        return pd_error("'modalities' is not supported: only [\"text\"]");
    return nothing_asked(o, "tools", NULL, "this server calls no tools") ||
                   nothing_asked(o, "tool_choice", "none", "this server calls no tools") ||
                   nothing_asked(o, "functions", NULL, "this server calls no functions") ||
                   nothing_asked(o, "function_call", "none", "this server calls no functions") ||
                   nothing_asked(o, "metadata", NULL, "this server keeps no completions to tag") ||
                   nothing_asked(o, "service_tier", "auto|default", "this server has one tier") ||
                   nothing_asked(o, "audio", NULL, "text only") ||
                   nothing_asked(o, "prediction", NULL, "predicted outputs are not taken") ||
                   nothing_asked(o, "reasoning_effort", NULL, "not a reasoning model") ||
                   nothing_asked(o, "web_search_options", NULL, "this server does not search") ||
                   nothing_asked(o, "verbosity", NULL, "the model's answer is its own")
               ? -1
               : 0;
}

/* ---- the prompt, the messages, the stop strings ---- */

/* token ids: a non-empty array of integers ≥ 0 (the vocabulary checks them when encoded) */
static int token_ids(json_t *a, size_t at, ReqPrompt *p) {
    size_t n = json_array_size(a), i;
    json_t *x;
    if (!n) return pd_error("'prompt'[%zu] is an empty array of token ids", at);
    if (!(p->ids = pd_alloc(sizeof(int32_t) * n))) return -1;
    json_array_foreach(a, i, x) {
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX)
            return pd_error("'prompt': token ids must be whole numbers ≥ 0 (item %zu of prompt %zu is not)", i, at);
        p->ids[p->n_ids++] = (int32_t)json_integer_value(x);
    }
    return 0;
}

/* a prompt's text, with its length (it may hold U+0000) */
static int prompt_text(json_t *x, ReqPrompt *p) {
    p->n_text = json_string_length(x);
    if (!(p->text = pd_alloc(p->n_text + 1))) return -1;
    memcpy(p->text, json_string_value(x), p->n_text);
    return 0;
}

/* "prompt": a string, an array of strings (one answer each), an array of token ids, or
   an array of arrays of token ids */
static int parse_prompt(ServeRequest *r, json_t *o) {
    json_t *p = json_object_get(o, "prompt");
    if (!p) return pd_error("'prompt' is missing");
    const char *shapes =
        "'prompt' must be a string, an array of strings, an array of token ids or an array of arrays of token ids";
    if (!json_is_string(p) && !json_is_array(p)) return pd_error("%s", shapes);
    json_t *first = json_is_array(p) ? json_array_get(p, 0) : p, *x;
    size_t n = json_is_array(p) && !json_is_integer(first) ? json_array_size(p) : 1, i; /* token ids: one prompt */
    if (json_is_array(p) && !json_array_size(p)) return pd_error("'prompt' is an empty array");
    if (n > REQ_MAX_CHOICES) return pd_error("'prompt' holds %zu prompts, %d at most", n, REQ_MAX_CHOICES);
    if (!(r->prompt = pd_alloc(sizeof *r->prompt * n))) return -1;
    r->n_prompts = (int)n;
    if (json_is_string(p)) return prompt_text(p, &r->prompt[0]);
    if (json_is_integer(first)) return token_ids(p, 0, &r->prompt[0]);
    json_array_foreach(p, i, x) {
        ReqPrompt *q = &r->prompt[i];
        if (json_is_string(x) && json_is_string(first)) {
            if (prompt_text(x, q)) return -1;
        } else if (json_is_array(x) && json_is_array(first)) {
            if (token_ids(x, i, q)) return -1;
        } else return pd_error("%s (item %zu is neither, or differs from the first)", shapes, i);
    }
    return 0;
}

/* a message's content: a string, or an array of text parts, joined */
static int content(json_t *c, size_t i, char **out) {
    if (json_is_string(c)) return text(c, "content", out);
    if (!json_is_array(c)) return pd_error("messages[%zu]: 'content' must be a string or an array of text parts", i);
    size_t n = 0, k;
    json_t *part;
    json_array_foreach(c, k, part) {
        json_t *type = json_object_get(part, "type"), *t = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type))
            return pd_error("messages[%zu]: content part %zu must be an object with a 'type'", i, k);
        if (strcmp(json_string_value(type), "text"))
            return pd_error("messages[%zu]: content part type '%s' is not supported (text only)", i,
                            json_string_value(type));
        if (!json_is_string(t) || json_object_size(part) != 2)
            return pd_error("messages[%zu]: a text part is {\"type\": \"text\", \"text\": STRING}", i);
        n += strlen(json_string_value(t));
    }
    if (!(*out = pd_alloc(n + 1))) return -1;
    n = 0;
    json_array_foreach(c, k, part) {
        const char *t = json_string_value(json_object_get(part, "text"));
        memcpy(*out + n, t, strlen(t));
        n += strlen(t);
    }
    return 0;
}

/* "messages": [{"role", "content"}...]: system (or developer, the same) first, then user
   and assistant turns, ending with a user's */
static int parse_messages(ServeRequest *r, json_t *o) {
    json_t *ms = json_object_get(o, "messages");
    if (!json_is_array(ms) || !json_array_size(ms)) return pd_error("'messages' must be a non-empty array");
    if (json_array_size(ms) > REQ_MAX_TURNS) return pd_error("'messages' holds more than %d messages", REQ_MAX_TURNS);
    size_t i;
    json_t *m;
    json_array_foreach(ms, i, m) {
        if (!json_is_object(m)) return pd_error("messages[%zu] must be an object", i);
        json_t *role = json_object_get(m, "role");
        if (!json_is_string(role)) return pd_error("messages[%zu]: 'role' must be a string", i);
        const char *rs = json_string_value(role), *key;
        json_t *v;
        json_object_foreach(m, key, v) {
            if (!strcmp(key, "role") || !strcmp(key, "content") || absent(v) ||
                (!strcmp(key, "tool_calls") && json_is_array(v) && !json_array_size(v)))
                continue;
            return pd_error("messages[%zu]: '%s' is not supported (messages are a role and a content)", i, key);
        }
        int system = !strcmp(rs, "system") || !strcmp(rs, "developer");
        if (strcmp(rs, "user") && strcmp(rs, "assistant") && !system)
            return pd_error("messages[%zu]: role '%s' is not supported (system or developer, user, assistant)", i, rs);
        if (system && i) return pd_error("messages[%zu]: a %s message comes first, once", i, rs);
        r->turn[i].role = system ? "system" : !strcmp(rs, "user") ? "user" : "assistant";
        char *c = NULL;
        if (content(json_object_get(m, "content"), i, &c)) return pd_error_prefix("messages");
        r->turn[r->n_turns++].content = c;
    }
    if (strcmp(r->turn[r->n_turns - 1].role, "user")) return pd_error("'messages' must end with a user message");
    return 0;
}

/* "stop": a string or an array of up to four, none empty (an empty one would match
   everywhere: OpenAI refuses it too) */
static int parse_stop(ServeRequest *r, json_t *o) {
    json_t *s = json_object_get(o, "stop");
    if (!s || json_is_null(s)) return 0;
    if (json_is_string(s)) {
        if (text(s, "stop", &r->stop[r->n_stop++])) return -1;
        return r->stop[0][0] ? 0 : pd_error("'stop' must not be an empty string");
    }
    if (!json_is_array(s) || json_array_size(s) > REQ_MAX_STOP)
        return pd_error("'stop' must be a string or an array of up to %d strings", REQ_MAX_STOP);
    size_t i;
    json_t *x;
    json_array_foreach(s, i, x) {
        if (text(x, "stop", &r->stop[r->n_stop])) return -1;
        if (!r->stop[r->n_stop++][0]) return pd_error("'stop' strings must not be empty");
    }
    return 0;
}

/* ---- the whole body ---- */

/* logprobs: completions "logprobs": 0..5 alternatives; chat "logprobs": true, with
   "top_logprobs": 0..20 */
static int parse_logprobs(ServeRequest *r, json_t *o) {
    double n = -1;
    if (r->kind == REQ_COMPLETION) {
        if (whole(o, "logprobs", 0, REQ_MAX_LOGPROBS, &n)) return -1;
        r->logprobs = (int)n;
        return flag(o, "echo", &r->echo);
    }
    int on = 0;
    json_t *top = json_object_get(o, "top_logprobs");
    if (flag(o, "logprobs", &on) || whole(o, "top_logprobs", 0, REQ_MAX_TOP_LOGPROBS, &n)) return -1;
    if (!absent(top) && !on) return pd_error("'top_logprobs' needs 'logprobs': true");
    r->logprobs = on ? n > 0 ? (int)n : 0 : -1;
    return 0;
}

static int parse_stream(ServeRequest *r, json_t *o) {
    json_t *so = json_object_get(o, "stream_options");
    if (flag(o, "stream", &r->stream)) return -1;
    if (absent(so)) return 0;
    if (!r->stream) return pd_error("'stream_options' is only allowed with 'stream': true");
    if (!json_is_object(so)) return pd_error("'stream_options' must be an object");
    const char *key;
    json_t *v;
    int ignored;
    json_object_foreach(so, key, v) {
        /* include_obfuscation pads chunks against length side channels: nothing to pad here */
        if (strcmp(key, "include_usage") && strcmp(key, "include_obfuscation"))
            return pd_error("'stream_options': '%s' is not supported (include_usage only)", key);
        if (flag(so, key, !strcmp(key, "include_usage") ? &r->include_usage : &ignored))
            return pd_error_prefix("stream_options");
    }
    return 0;
}

static int parse_fields(ServeRequest *r, json_t *o) {
    const char *key;
    json_t *v;
    json_object_foreach(
        o, key,
        v) if (!listed(r->kind == REQ_COMPLETION ? COMPLETION_FIELDS : CHAT_FIELDS,
                       key)) return pd_error("unknown field '%s' (not one of OpenAI's for %s, nor top_k or method)",
                                             key,
                                             r->kind == REQ_COMPLETION ? "/v1/completions" : "/v1/chat/completions");
    if (r->kind == REQ_COMPLETION ? parse_prompt(r, o) : parse_messages(r, o)) return -1;
    double max_tokens = r->max_tokens, temp = 1, top_p = 1, top_k = 0, seed = 0, n = 1;
    json_t *mt = json_object_get(o, "max_completion_tokens");
    const char *mt_key = r->kind == REQ_CHAT && !absent(mt) ? "max_completion_tokens" : "max_tokens";
    /* zero tokens: the legacy completions answer with none ("length"), which with echo and
       logprobs scores a prompt; chat refuses it, as OpenAI does */
    if (whole(o, mt_key, r->kind == REQ_COMPLETION ? 0 : 1, 1 << 30, &max_tokens) ||
        number(o, "temperature", 0, 100, &temp) || number(o, "top_p", 0, 1, &top_p) ||
        whole(o, "top_k", 0, 1 << 30, &top_k) ||
        (!json_is_integer(json_object_get(o, "seed")) &&
         whole(o, "seed", -9007199254740992.0, 9007199254740992.0, &seed)) ||
        whole(o, "n", 1, REQ_MAX_CHOICES, &n) || parse_stop(r, o) || parse_logprobs(r, o) || parse_stream(r, o) ||
        unsupported(r, o))
        return -1;
    r->max_tokens = (int)max_tokens, r->temperature = (float)temp, r->top_p = (float)top_p;
    r->top_k = (int)top_k, r->n = (int)n;
    json_t *sd = json_object_get(o, "seed"); /* any 64-bit integer, as OpenAI's (written as a float: to 2^53) */
    r->has_seed = !absent(sd),
    r->seed = json_is_integer(sd) ? (uint64_t)json_integer_value(sd) : (uint64_t)(int64_t)seed;
    if (r->kind == REQ_COMPLETION && r->n_prompts * r->n > REQ_MAX_CHOICES)
        return pd_error("'n' × the prompts is %d choices, %d at most", r->n_prompts * r->n, REQ_MAX_CHOICES);
    json_t *me = json_object_get(o, "method");
    if (!absent(me)) {
        if (!json_is_string(me) || json_string_length(me) >= sizeof r->method)
            return pd_error("'method' must be a method's name");
        strcpy(r->method, json_string_value(me));
    }
    return 0;
}

int serve_request_parse(ServeRequest *r, RequestKind kind, const char *body, size_t n) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->max_tokens = kind == REQ_COMPLETION ? 16 : -1; /* OpenAI's defaults */
    r->logprobs = -1;
    snprintf(r->method, sizeof r->method, "%s", decode_reference()->name);
    json_error_t e;
    json_t *o = json_loadb(body, n, JSON_REJECT_DUPLICATES, &e);
    if (!o) return pd_error("malformed JSON at line %d, column %d: %s", e.line, e.column, e.text);
    int rc = json_is_object(o) ? parse_fields(r, o) : pd_error("the body must be a JSON object");
    json_decref(o);
    if (rc) serve_request_free(r);
    return rc;
}

void serve_request_free(ServeRequest *r) {
    for (int i = 0; i < r->n_prompts; i++) free(r->prompt[i].text), free(r->prompt[i].ids);
    free(r->prompt);
    for (int i = 0; i < r->n_turns; i++) free((char *)r->turn[i].content);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    memset(r, 0, sizeof *r);
}
/* ---- answers ---- */

static char *dump(json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) pd_error("serve: out of memory");
    return s;
}

char *serve_error(const char *message, const char *type) {
    size_t m;
    char *c = utf8_clean(message, strlen(message), &m);
    char *s = dump(json_pack("{s:{s:s%, s:s}}", "error", "message", c ? c : "", c ? m : 0, "type", type));
    free(c);
    return s;
}
