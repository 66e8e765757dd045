/* serve_request.h — the OpenAI-style requests `bin/serve` takes: POST /v1/completions
   and /v1/chat/completions bodies in, checked and typed; the error object and the UTF-8
   guards the answers (serve_gen.h) share. No sockets here: the parser takes bytes
   (fuzzable). */
#ifndef PD_SERVE_REQUEST_H
#define PD_SERVE_REQUEST_H
#include <stddef.h>
#include <stdint.h>

#include "chat.h"

typedef enum { REQ_COMPLETION, REQ_CHAT } RequestKind;

#define REQ_MAX_STOP 4    /* stop strings at most (OpenAI's limit) */
#define REQ_MAX_TURNS 256 /* chat messages at most */
#define REQ_MAX_CHOICES 128 /* choices an answer holds at most: prompts × n (OpenAI's n ≤ 128) */

typedef struct {
    RequestKind kind;
    char *prompt;             /* completion: the text */
    ChatTurn turn[REQ_MAX_TURNS]; /* chat: the messages (contents owned) */
    int n_turns;
    int max_tokens;           /* -1: until the context ends */
    float temperature, top_p; /* OpenAI's defaults: 1, 1 */
    int top_k;                /* 0 = off (an extension, as llama.cpp's) */
    uint64_t seed;            /* 0 when not given: the server picks one */
    int stream;
    char method[32];          /* "standard" unless given */
    char *stop[REQ_MAX_STOP];
    int n_stop;
} ServeRequest;

/* parses a request body; -1 + a message fit for a 400 answer when it is malformed */
int serve_request_parse(ServeRequest *r, RequestKind kind, const char *body, size_t n);
void serve_request_free(ServeRequest *r);

/* an error answer's JSON object (malloc'd); the others are serve_gen's */
char *serve_error(const char *message, const char *type);

/* streamed text is cut into UTF-8 a token at a time: how much of s[0..n) is whole
   characters (a sequence cut at the end waits for the next token) */
size_t utf8_whole(const char *s, size_t n);
/* s[0..n) with every byte that is not valid UTF-8 replaced by U+FFFD (malloc'd) */
char *utf8_clean(const char *s, size_t n, size_t *out_n);

#endif
