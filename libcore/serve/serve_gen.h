/* serve_gen.h — one completion request from its body to its answer, without sockets:
   the body parsed, the prompts encoded, one engine job per choice, each job's tokens
   turned into text that ends before a stop string, and the answer as one JSON object or
   as server-sent events, with the tokens' log-probabilities when asked. bin/serve wraps
   it in HTTP; the fuzzer drives it whole. */
#ifndef PD_SERVE_GEN_H
#define PD_SERVE_GEN_H
#include "decode/engine.h"
#include "serve/serve_request.h"

typedef struct {
    Model *m;
    Engine *e;
    int chat_format; /* -1: chat requests are refused with chat_why */
    const char *chat_why;
    const char *name; /* the model's name in answers */
} GenModel;

typedef struct { /* one choice: a job's tokens as text */
    Job *job;
    int prompt;                    /* the prompt it answers */
    int n_tok, n_gen;              /* tokens turned into text; those the answer counts */
    char *text;                    /* its bytes so far (the answer's, without the echo) */
    size_t text_n, text_cap, sent; /* sent: streamed so far */
    size_t *end, end_cap;          /* [n_tok] bytes of text up to each token's end */
    int lp_sent;                   /* stream: tokens whose logprobs are out */
    size_t at_byte, at_char;       /* stream: where the last text offset was counted */
    const char *finish;            /* NULL while it runs */
    int opened, closed;            /* stream: its first chunk (chat: the role; echo: the prompt) is out; its last */
} GenChoice;

typedef struct {
    int32_t *ids; /* the prompt's tokens */
    int n;
    char *text; /* echo: the tokens' text, and where each token ends in it */
    size_t text_n, *end;
} GenPrompt;

typedef struct {
    const GenModel *gm;
    ServeRequest req;
    GenPrompt *p;
    int n_p;
    GenChoice *c; /* choice i answers prompt i / n */
    int n_c;
    char id[48];
    long created;
    int (*gone)(void *); /* has the client left? asked while waiting (NULL: never) */
    void *gone_ctx;
    int next, usage_sent, done; /* stream: the choice looked at first next time; the usage
                                   chunk and [DONE] are out */
    double t_first;             /* when a choice's first text was made (pd_now), 0 before */
    int busy;                   /* gen_start failed because the engine's queue is full (a 503) */
} Gen;

/* parses the body and queues its jobs (seed: for a request that names none); 0, or -1
   + a message fit for a 400 answer (a 503 when g->busy). gen_free afterwards either way. */
int gen_start(Gen *g, const GenModel *gm, RequestKind kind, const char *body, size_t n, const char *id, uint64_t seed);
/* the whole answer, once every choice has ended (malloc'd JSON); NULL when the client
   left (*status 0), the model failed or memory ran out (*status 500, with a message), or
   a job ended "abort" (*status 503: the server stops) */
char *gen_answer(Gen *g, int *status);
/* the stream's next event, "data: ...\n\n" (malloc'd; *n bytes); NULL once the stream
   is over: after "data: [DONE]", or when the client left or memory ran out */
char *gen_event(Gen *g, size_t *n);
void gen_free(Gen *g);
/* OpenAI's usage so far: each prompt's tokens once, every choice's answer tokens (an
   access log's count) */
void gen_usage(const Gen *g, int *prompt, int *completion);

/* where the first stop string starts in text[0..n), or n; *hold = bytes at the end that
   may begin one and wait for more text. Only text after `from` (less a stop string's
   length) is new to the search. Empty stop strings match nothing. */
size_t gen_find_stop(char *const *stop, int n_stop, const char *text, size_t n, size_t from, size_t *hold);

#endif
