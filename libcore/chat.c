/* chat.c — see chat.h. Each format is the text its reference template renders for
   [system?, user] with add_generation_prompt. */
#include "chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

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

static char *join(const char *fmt, const char *system, const char *user) {
    size_t n = strlen(fmt) + (system ? strlen(system) : 0) + strlen(user) + 1;
    char *s = pd_alloc(n);
    if (s) snprintf(s, n, fmt, system ? system : "", user);
    return s;
}

/* Jinja's trim: leading and trailing whitespace off (Llama 3's template trims content) */
static char *trimmed(const char *s) {
    if (!s) return NULL;
    while (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\t' || s[n - 1] == '\r')) n--;
    return strndup(s, n);
}

char *chat_apply(ChatFormat f, const char *tmpl, const char *system, const char *user, int *add_bos) {
    *add_bos = 0;
    char *dflt = NULL, *out = NULL, *tu = NULL, *ts = NULL;
    switch (f) {
    case CHAT_LLAMA3: /* BOS written as text, recognised as the special token */
        user = tu = trimmed(user);
        system = ts = trimmed(system);
        out = system ? join("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n%s<|eot_id|>"
                            "<|start_header_id|>user<|end_header_id|>\n\n%s<|eot_id|>"
                            "<|start_header_id|>assistant<|end_header_id|>\n\n", system, user)
                     : join("<|begin_of_text|>%s<|start_header_id|>user<|end_header_id|>\n\n%s<|eot_id|>"
                            "<|start_header_id|>assistant<|end_header_id|>\n\n", NULL, user);
        break;
    case CHAT_LLAMA2: /* Meta's format: BOS as a token, the system prompt inside the first [INST] */
        *add_bos = 1;
        out = system ? join("[INST] <<SYS>>\n%s\n<</SYS>>\n\n%s [/INST]", system, user)
                     : join("[INST] %s%s [/INST]", NULL, user);
        break;
    case CHAT_CHATML:
        if (!system) system = dflt = default_system(tmpl);
        out = system ? join("<|im_start|>system\n%s<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n", system, user)
                     : join("%s<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n", NULL, user);
        break;
    default:
        pd_error("chat format %d is unknown", (int)f);
    }
    free(dflt);
    free(tu);
    free(ts);
    return out;
}
