/* serve_request.c — see serve_request.h. Unknown fields are ignored (clients send
   many: "model", "user", "n" = 1 ...); known ones of the wrong type are refused. */
#include "serve_request.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* a number field in [lo, hi], or the default when absent or null */
static int number(json_t *o, const char *key, double lo, double hi, double *v) {
    json_t *x = json_object_get(o, key);
    if (!x || json_is_null(x)) return 0;
    if (!json_is_number(x)) return pd_error("'%s' must be a number", key);
    double d = json_number_value(x);
    if (!(d >= lo && d <= hi)) return pd_error("'%s' must be in [%g, %g], not %g", key, lo, hi, d);
    *v = d;
    return 0;
}

static int text(json_t *x, const char *what, char **out) {
    if (!json_is_string(x)) return pd_error("'%s' must be a string", what);
    *out = pd_strdup(json_string_value(x));
    return *out ? 0 : -1;
}

/* "prompt": a string, or an array holding one string */
static int parse_prompt(ServeRequest *r, json_t *o) {
    json_t *p = json_object_get(o, "prompt");
    if (!p) return pd_error("'prompt' is missing");
    if (json_is_array(p)) {
        if (json_array_size(p) != 1) return pd_error("'prompt' as an array must hold exactly one string (batches are sent as separate requests)");
        p = json_array_get(p, 0);
    }
    return text(p, "prompt", &r->prompt);
}

/* "messages": [{"role", "content"}...]; content a string or [{"type":"text","text"}...] */
static int parse_messages(ServeRequest *r, json_t *o) {
    json_t *ms = json_object_get(o, "messages");
    if (!json_is_array(ms) || !json_array_size(ms)) return pd_error("'messages' must be a non-empty array");
    if (json_array_size(ms) > REQ_MAX_TURNS) return pd_error("'messages' holds more than %d messages", REQ_MAX_TURNS);
    size_t i;
    json_t *m;
    json_array_foreach(ms, i, m) {
        json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        if (!json_is_string(role)) return pd_error("messages[%zu]: 'role' must be a string", i);
        const char *rs = json_string_value(role);
        if (strcmp(rs, "user") && strcmp(rs, "assistant") && !(strcmp(rs, "system") == 0 && i == 0))
            return pd_error("messages[%zu]: role '%s' is not user or assistant (system comes first, once)", i, rs);
        if (json_is_array(content) && json_array_size(content) == 1)
            content = json_object_get(json_array_get(content, 0), "text");
        r->turn[i].role = !strcmp(rs, "system") ? "system" : !strcmp(rs, "user") ? "user" : "assistant";
        char *c = NULL;
        if (text(content, "content", &c)) return pd_error_prefix("messages");
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

static int parse_fields(ServeRequest *r, json_t *o) {
    if (r->kind == REQ_COMPLETION ? parse_prompt(r, o) : parse_messages(r, o)) return -1;
    double max_tokens = r->max_tokens, temp = 1, top_p = 1, top_k = 0, seed = 0;
    json_t *mt = json_object_get(o, "max_completion_tokens");
    if (number(o, mt ? "max_completion_tokens" : "max_tokens", 0, 1 << 30, &max_tokens) ||
        number(o, "temperature", 0, 100, &temp) || number(o, "top_p", 0, 1, &top_p) ||
        number(o, "top_k", 0, 1 << 30, &top_k) || number(o, "seed", 0, 9007199254740992.0, &seed) || parse_stop(r, o))
        return -1;
    if (max_tokens != (int)max_tokens || top_k != (int)top_k) return pd_error("'max_tokens' and 'top_k' must be whole numbers");
    r->max_tokens = (int)max_tokens, r->temperature = (float)temp, r->top_p = (float)top_p;
    r->top_k = (int)top_k, r->seed = (uint64_t)seed;
    json_t *st = json_object_get(o, "stream"), *me = json_object_get(o, "method");
    if (st && !json_is_boolean(st) && !json_is_null(st)) return pd_error("'stream' must be true or false");
    r->stream = json_is_true(st);
    if (me && !json_is_null(me)) {
        if (!json_is_string(me) || json_string_length(me) >= sizeof r->method) return pd_error("'method' must be a method's name");
        strcpy(r->method, json_string_value(me));
    }
    return 0;
}

int serve_request_parse(ServeRequest *r, RequestKind kind, const char *body, size_t n) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->max_tokens = kind == REQ_COMPLETION ? 16 : -1; /* OpenAI's defaults */
    strcpy(r->method, "standard");
    json_error_t e;
    json_t *o = json_loadb(body, n, JSON_REJECT_DUPLICATES, &e);
    if (!o) return pd_error("malformed JSON at line %d, column %d: %s", e.line, e.column, e.text);
    int rc = json_is_object(o) ? parse_fields(r, o) : pd_error("the body must be a JSON object");
    json_decref(o);
    if (rc) serve_request_free(r);
    return rc;
}

void serve_request_free(ServeRequest *r) {
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

/* ---- UTF-8 ---- */

/* the length of the valid sequence starting at s (n bytes left), 0 when invalid,
   -1 when it is cut short by the end */
static int seq_len(const unsigned char *s, size_t n) {
    int len = s[0] < 0x80 ? 1 : s[0] >= 0xc2 && s[0] < 0xe0 ? 2 : s[0] >= 0xe0 && s[0] < 0xf0 ? 3 : s[0] >= 0xf0 && s[0] < 0xf5 ? 4 : 0;
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) return -1;
        if ((s[i] & 0xc0) != 0x80) return 0;
        /* overlong three- and four-byte forms, surrogates, and code points past U+10FFFF */
        if (i == 1 && ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] > 0x9f) ||
                       (s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] > 0x8f)))
            return 0;
    }
    return len;
}

size_t utf8_whole(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        int k = seq_len((const unsigned char *)s + i, n - i);
        if (k < 0) return i;
        i += k ? (size_t)k : 1; /* an invalid byte is whole: it becomes U+FFFD */
    }
    return n;
}

char *utf8_clean(const char *s, size_t n, size_t *out_n) {
    char *o = pd_alloc(pd_mul(n, 3) + 1), *p = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n;) {
        int k = seq_len((const unsigned char *)s + i, n - i);
        if (k > 0) memcpy(p, s + i, k), p += k, i += k;
        else memcpy(p, "\xef\xbf\xbd", 3), p += 3, i++;
    }
    *p = 0;
    *out_n = p - o;
    return o;
}
