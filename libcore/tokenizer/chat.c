/* chat.c — see chat.h. Each format is the text its reference template renders for
   [system?, user] with add_generation_prompt. */
#include "tokenizer/chat.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

static const char *const NAMES[CHAT_COUNT] = {"llama3", "llama2", "chatml"};
/* a marker only that format's templates contain */
static const char *const MARKERS[CHAT_COUNT] = {"<|start_header_id|>", "[INST]", "<|im_start|>"};

const char *chat_format_name(ChatFormat f) { return f < CHAT_COUNT ? NAMES[f] : "?"; }

const char *chat_format_names(void) { return "llama3, llama2, chatml"; }

int chat_format_parse(const char *name) {
    for (int f = 0; f < CHAT_COUNT; f++)
        if (!strcmp(name, NAMES[f])) return f;
    return pd_error("chat format '%s' is unknown (known: %s)", name, chat_format_names());
}

int chat_format_detect(const char *tmpl) {
    if (!tmpl) return pd_error("the model has no chat template; name one with --chat-format (%s)", chat_format_names());
    for (int f = 0; f < CHAT_COUNT; f++)
        if (strstr(tmpl, MARKERS[f])) return f;
    return pd_error("the model's chat template is not one paradec knows (it has none of the markers of %s); "
                    "name a format with --chat-format",
                    chat_format_names());
}

/* SmolLM2's ChatML template inserts a system prompt of its own when none is given:
   {{ '<|im_start|>system\nYOU ARE ...<|im_end|>\n' }} — take it from the template */
static char *default_system(const char *tmpl) {
    const char *key = "<|im_start|>system\\n";
    const char *a = tmpl ? strstr(tmpl, key) : NULL;
    if (!a) return NULL;
    a += strlen(key);
    const char *b = strstr(a, "<|im_end|>");
    if (!b || memchr(a, '{', b - a)) return NULL; /* a variable, not a fixed text */
    return strndup(a, b - a);
}

/* Jinja's trim: leading and trailing whitespace off (Llama 3's template trims content) */
static char *trimmed(const char *s) {
    if (!s) return NULL;
    while (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\t' || s[n - 1] == '\r')) n--;
    return strndup(s, n);
}

/* appends printf-style text to a malloc'd string; on failure frees it and returns NULL */
__attribute__((format(printf, 2, 3))) static char *add(char *s, const char *fmt, ...) {
    if (!s) return NULL;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    size_t n = strlen(s);
    char *t = pd_realloc(s, n + k + 1);
    if (!t) return free(s), NULL;
    va_start(ap, fmt);
    vsnprintf(t + n, k + 1, fmt, ap);
    va_end(ap);
    return t;
}

static int is_role(const ChatTurn *t, const char *role) { return !strcmp(t->role, role); }

/* Meta's Llama 2 format: the system prompt inside the first [INST], each answer closed
   by EOS and the next turn opened by BOS (both written as text); every content trimmed
   as the reference strips it (the system prompt and the first user turn as one), so an
   answer that began with a space renders as the tokens that were generated */
static char *llama2(const ChatTurn *t, int n) {
    char *out = pd_strdup("");
    const char *system = n && is_role(&t[0], "system") ? t[0].content : NULL;
    for (int i = system ? 1 : 0; out && i < n; i++) {
        char *c = NULL;
        if (system && !is_role(&t[i], "assistant")) {
            char *m = add(pd_strdup(""), "<<SYS>>\n%s\n<</SYS>>\n\n%s", system, t[i].content);
            c = trimmed(m), system = NULL;
            free(m);
        } else c = trimmed(t[i].content);
        if (!c) return free(out), NULL;
        out = is_role(&t[i], "assistant") ? add(out, " %s </s><s>", c) : add(out, "[INST] %s [/INST]", c);
        free(c);
    }
    return out;
}

char *chat_apply_turns(ChatFormat f, const char *tmpl, const ChatTurn *t, int n, int *add_bos) {
    *add_bos = 0;
    for (int i = 0; i < n; i++)
        if (!is_role(&t[i], "system") && !is_role(&t[i], "user") && !is_role(&t[i], "assistant"))
            return pd_error("chat: role '%s' is not system, user or assistant", t[i].role), NULL;
    char *out = NULL, *dflt = NULL;
    switch (f) {
    case CHAT_LLAMA3: /* BOS written as text, recognised as the special token; contents trimmed */
        out = pd_strdup("<|begin_of_text|>");
        for (int i = 0; out && i < n; i++) {
            char *c = trimmed(t[i].content);
            out = c ? add(out, "<|start_header_id|>%s<|end_header_id|>\n\n%s<|eot_id|>", t[i].role, c)
                    : (free(out), NULL);
            free(c);
        }
        out = add(out, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        break;
    case CHAT_LLAMA2:
        *add_bos = 1;
        out = llama2(t, n);
        break;
    case CHAT_CHATML:
        out = pd_strdup("");
        if (!(n && is_role(&t[0], "system")) && (dflt = default_system(tmpl)))
            out = add(out, "<|im_start|>system\n%s<|im_end|>\n", dflt);
        for (int i = 0; out && i < n; i++) out = add(out, "<|im_start|>%s\n%s<|im_end|>\n", t[i].role, t[i].content);
        out = add(out, "<|im_start|>assistant\n");
        break;
    default:
        pd_error("chat format %d is unknown", (int)f);
    }
    free(dflt);
    return out; /* NULL: the allocation's message */
}

char *chat_apply(ChatFormat f, const char *tmpl, const char *system, const char *user, int *add_bos) {
    ChatTurn t[2] = {{"system", system}, {"user", user}};
    return system ? chat_apply_turns(f, tmpl, t, 2, add_bos) : chat_apply_turns(f, tmpl, t + 1, 1, add_bos);
}
