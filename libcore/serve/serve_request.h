/* serve_request.h — the OpenAI-style requests `bin/serve` takes: POST /v1/completions
   and /v1/chat/completions bodies in, checked and typed; the error object and the UTF-8
   guards the answers (serve_gen.h) share. No sockets here: the parser takes bytes
   (fuzzable). */
#ifndef PD_SERVE_REQUEST_H
#define PD_SERVE_REQUEST_H
#include <stddef.h>
#include <stdint.h>

#include "base/utf8.h"
#include "tokenizer/chat.h"

typedef enum { REQ_COMPLETION, REQ_CHAT } RequestKind;

#define REQ_MAX_STOP 4      /* stop strings at most (OpenAI's limit) */
#define REQ_MAX_TURNS 256   /* chat messages at most */
#define REQ_MAX_CHOICES 128 /* choices an answer holds at most: prompts × n (OpenAI's n ≤ 128) */

#define REQ_MAX_LOGPROBS 5      /* completions' "logprobs" at most (OpenAI's limit) */
#define REQ_MAX_TOP_LOGPROBS 20 /* chat's "top_logprobs" at most */

typedef struct { /* a completion's prompt: */
    char *text;  /* its text (n_text bytes), or NULL when */
    size_t n_text;
    int32_t *ids; /* it came as token ids (checked against the vocabulary when encoded) */
    int n_ids;
} ReqPrompt;

typedef struct {
    RequestKind kind;
    ReqPrompt *prompt; /* completion: the prompts, an answer each (n choices) */
    int n_prompts;
    ChatTurn turn[REQ_MAX_TURNS]; /* chat: the messages (contents owned; developer is system) */
    int n_turns;
    int max_tokens;           /* -1: until the context ends; completions may ask for 0 */
    float temperature, top_p; /* OpenAI's defaults: 1, 1 */
    int top_k;                /* 0 = off (an extension, as llama.cpp's) */
    uint64_t seed;            /* when has_seed; else the server picks one */
    int has_seed;
    int n;                     /* choices per prompt; choice i is sampled with seed + i */
    int logprobs;              /* -1: none; else the alternatives each token lists (completions'
                                 "logprobs" 0..5, chat's "top_logprobs" 0..20 with "logprobs": true) */
    int echo;                  /* completions: the prompt before the answer */
    int stream, include_usage; /* stream_options.include_usage: a last chunk with the usage */
    char method[32];           /* "standard" unless given */
    char *stop[REQ_MAX_STOP];
    int n_stop;
} ServeRequest;

/* parses a request body; -1 + a message fit for a 400 answer when it is malformed */
int serve_request_parse(ServeRequest *r, RequestKind kind, const char *body, size_t n);
void serve_request_free(ServeRequest *r);

/* an error answer's JSON object (malloc'd); the others are serve_gen's */
char *serve_error(const char *message, const char *type);

#endif
