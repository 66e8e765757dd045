/* serve — an OpenAI-style HTTP server over the continuous-batching engine.
   bin/serve -m MODEL [--host 127.0.0.1] [--port 8080] [-np N] [-c CTX] ... (--help lists them)
   POST /v1/completions, POST /v1/chat/completions ("stream": true gives server-sent
   events), GET /v1/models, GET /health, GET /metrics (Prometheus text). A request may
   name its "method" among those the loaded bundle supports. libmicrohttpd runs a thread
   per connection (a handler may block on its request's tokens) and polls with poll(),
   so descriptors past FD_SETSIZE are fine; --max-connections bounds the threads. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "decode/engine.h"
#include "heads/bundle.h"
#include "serve/serve_gen.h"
#include "tool.h"

#define USAGE "-m MODEL [flags]"
#define MEMORY                                                                                                         \
    "memory: about " MEMORY_MODEL                                                                                      \
    "\n        + the KV pool: B × 16 positions × layers × kv_dim × 8 bytes (B: --kv-blocks,\n"                     \
    "        N × ctx / 16 by default; --kv-type bf16: kv_dim × 4, q8_0: (kv_dim + 4 × kv heads) × 2)\n"            \
    "        + per step (N + 448) × (dim + vocab) × 4 bytes (N + 64 without speculation) + a thread and\n"           \
    "        the answer's text per open connection; --draft adds the draft model's weights twice;\n"                   \
    "        with an EAGLE head, each request holds its prompt's states (prompt × dim × 4 bytes) until\n"            \
    "        its prompt is in (EAGLE's until its method starts), each cached block its positions'\n"                   \
    "        (16 × dim × 4 bytes), and the head's own cache one layer's of (B × 16 + (N + 1) × 144)\n"             \
    "        positions.\n"

/* Prometheus histograms: upper bounds in seconds, a count per bucket (not cumulative) */
#define HIST_MAX 20
typedef struct {
    const double *le;
    int n;
    int64_t in[HIST_MAX + 1], count;
    double sum;
} Hist;
static const double LATENCY_LE[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
static const double TTFT_LE[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};

/* one open connection (MHD's socket context): what the connection limit, the access
   log and the shutdown need */
typedef struct Link {
    int fd;
    int busy;          /* a request is being answered (its whole body has arrived) */
    int closing;       /* shut down to make room; no longer counted */
    double idle_since; /* opened, or its last request ended */
    double t_start;    /* the current request's headers arrived */
    int denied;        /* the current request lacks the API key */
    char method[12], path[96];
    struct Link *prev, *next;
} Link;

typedef struct {
    Model m;
    Engine *e;
    const char *name; /* the model's name in answers: --alias, or its file name */
    int chat_format;  /* -1: chat requests are refused with chat_why */
    char chat_why[256];
    size_t max_body;
    atomic_long next_id; /* starts at a random number: ids differ across restarts */
    /* operations */
    long created; /* the model file's time, for /v1/models */
    const char *api_key, *cors;
    int max_conn;
    unsigned timeout; /* seconds a connection may be idle */
    atomic_int stopping;
    pthread_mutex_t mu; /* the links, their counts and the histograms */
    Link *head, *tail;
    int n_open, n_busy;
    int64_t made_room, refused;
    Hist latency, ttft;
} Server;

typedef struct { /* one HTTP request */
    char *body;
    size_t n, cap;
    int too_big;
    GenModel gm; /* what its completion runs on */
    Gen g;       /* a completion in flight */
    int fd;      /* the client's socket, to notice it leaving */
    int left;    /* it was seen gone (the answer then ends as if complete) */
    char *sse;   /* the event being sent */
    size_t sse_n, sse_off;
    struct MHD_Connection *mc; /* to re-arm its idle timer while the answer is made */
} Conn;

static Server S;

/* ---- answers ---- */

static Link *link_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* every answer's own headers: CORS, and a close while the server stops */
static void answer_headers(struct MHD_Response *r, int close) {
    if (S.cors) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", S.cors);
        if (strcmp(S.cors, "*")) MHD_add_response_header(r, "Vary", "Origin");
    }
    if (close || atomic_load(&S.stopping)) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
}

/* the idle timer starts again: time spent making an answer is not the client's */
static void rearm(struct MHD_Connection *c) {
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u); /* from 0, setting it resets the timer */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, S.timeout);
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *type, char *body) {
    if (!body) body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}"), status = 500;
    if (!body) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) return free(body), MHD_NO;
    if (*type) MHD_add_response_header(r, "Content-Type", type);
    answer_headers(r, status == 503); /* busy or stopping: this connection goes */
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    if (status == 503) MHD_add_response_header(r, "Retry-After", "1");
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result fail(struct MHD_Connection *c, unsigned status, const char *message) {
    const char *type = status == 404   ? "not_found_error"
                       : status == 413 ? "request_too_large"
                       : status >= 500 ? "server_error"
                                       : "invalid_request_error";
    return reply(c, status, "application/json", serve_error(message, type));
}

/* an error in OpenAI's whole shape, with its code (model_not_found, invalid_api_key) */
static enum MHD_Result fail_code(struct MHD_Connection *c, unsigned status, const char *type, const char *code,
                                 const char *message) {
    size_t n;
    char *m = utf8_clean(message, strlen(message), &n);
    json_t *j = json_pack("{s:{s:s%, s:s, s:n, s:s?}}", "error", "message", m ? m : "", m ? n : 0, "type", type,
                          "param", "code", code);
    free(m);
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return reply(c, status, "application/json", body);
}

static void hist_add(Hist *h, double v) {
    int i = 0;
    while (i < h->n && v > h->le[i]) i++;
    h->in[i]++, h->count++, h->sum += v;
}

static void hist_put(Str *b, const char *name, const char *help, const Hist *h) {
    put(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    int64_t below = 0;
    for (int i = 0; i <= h->n; i++) {
        below += h->in[i];
        if (i < h->n) put(b, "%s_bucket{le=\"%g\"} %lld\n", name, h->le[i], (long long)below);
        else put(b, "%s_bucket{le=\"+Inf\"} %lld\n", name, (long long)below);
    }
    put(b, "%s_sum %.6f\n%s_count %lld\n", name, h->sum, name, (long long)h->count);
}

static char *metrics(void) {
    EngineStats s = engine_stats(S.e);
    Str b = {0};
    put(&b,
        "# HELP paradec_requests_total Requests accepted.\n# TYPE paradec_requests_total counter\n"
        "paradec_requests_total %lld\n",
        (long long)s.requests);
    put(&b,
        "# HELP paradec_requests_running Requests in the running batch.\n# TYPE paradec_requests_running gauge\n"
        "paradec_requests_running %d\n",
        s.running);
    put(&b,
        "# HELP paradec_requests_queued Requests waiting for KV blocks or a slot.\n# TYPE paradec_requests_queued "
        "gauge\n"
        "paradec_requests_queued %d\n",
        s.queued);
    put(&b,
        "# HELP paradec_requests_waited_total Requests that waited in the queue for room.\n"
        "# TYPE paradec_requests_waited_total counter\nparadec_requests_waited_total %lld\n",
        (long long)s.waited);
    put(&b,
        "# HELP paradec_prompt_tokens_total Prompt tokens accepted.\n# TYPE paradec_prompt_tokens_total counter\n"
        "paradec_prompt_tokens_total %lld\n",
        (long long)s.prompt_tokens);
    put(&b,
        "# HELP paradec_generated_tokens_total Tokens generated.\n# TYPE paradec_generated_tokens_total counter\n"
        "paradec_generated_tokens_total %lld\n",
        (long long)s.gen_tokens);
    put(&b,
        "# HELP paradec_method_tokens_total Tokens generated by a request's own method (speculation on).\n"
        "# TYPE paradec_method_tokens_total counter\nparadec_method_tokens_total %lld\n",
        (long long)s.method_tokens);
    put(&b,
        "# HELP paradec_steps_total Batched steps (one forward call each).\n# TYPE paradec_steps_total counter\n"
        "paradec_steps_total %lld\n",
        (long long)s.steps);
    put(&b,
        "# HELP paradec_spec_rounds_shared_total Drafted trees verified in a forward call with other requests' work.\n"
        "# TYPE paradec_spec_rounds_shared_total counter\nparadec_spec_rounds_shared_total %lld\n",
        (long long)s.rounds_shared);
    put(&b,
        "# HELP paradec_spec_draft_tokens_total Tokens methods drafted (AdaDecode: exited early), as methods stop.\n"
        "# TYPE paradec_spec_draft_tokens_total counter\nparadec_spec_draft_tokens_total %lld\n",
        (long long)s.drafted);
    put(&b,
        "# HELP paradec_spec_accepted_tokens_total Drafted tokens verification kept, as methods stop.\n"
        "# TYPE paradec_spec_accepted_tokens_total counter\nparadec_spec_accepted_tokens_total %lld\n",
        (long long)s.drafts_kept);
    put(&b,
        "# HELP paradec_spec_proposals_grouped_total Drafters' proposals made together with other requests' "
        "(their head calls shared).\n"
        "# TYPE paradec_spec_proposals_grouped_total counter\nparadec_spec_proposals_grouped_total %lld\n",
        (long long)s.proposals_grouped);
    put(&b,
        "# HELP paradec_method_prefill_tokens_total Context tokens methods' starts ran through the model again.\n"
        "# TYPE paradec_method_prefill_tokens_total counter\nparadec_method_prefill_tokens_total %lld\n",
        (long long)s.method_prefilled);
    put(&b,
        "# HELP paradec_tokens_per_second Tokens generated a second over the last ten seconds.\n"
        "# TYPE paradec_tokens_per_second gauge\nparadec_tokens_per_second %.2f\n",
        s.tok_per_s);
    put(&b,
        "# HELP paradec_kv_blocks_used KV cache blocks in use.\n# TYPE paradec_kv_blocks_used gauge\n"
        "paradec_kv_blocks_used %d\n",
        s.kv_used);
    put(&b,
        "# HELP paradec_kv_blocks_free KV cache blocks free, the idle cached ones included.\n"
        "# TYPE paradec_kv_blocks_free gauge\nparadec_kv_blocks_free %d\n",
        s.kv_free);
    put(&b,
        "# HELP paradec_kv_blocks_cached Free KV blocks that hold a cached prefix until the pool needs them.\n"
        "# TYPE paradec_kv_blocks_cached gauge\nparadec_kv_blocks_cached %d\n",
        s.kv_cached);
    put(&b,
        "# HELP paradec_prefix_cache_queries_total Full prompt blocks looked up in the prefix cache.\n"
        "# TYPE paradec_prefix_cache_queries_total counter\nparadec_prefix_cache_queries_total %lld\n",
        (long long)s.prefix_queried);
    put(&b,
        "# HELP paradec_prefix_cache_hits_total Prompt blocks found in the prefix cache (not computed again).\n"
        "# TYPE paradec_prefix_cache_hits_total counter\nparadec_prefix_cache_hits_total %lld\n",
        (long long)s.prefix_hits);
    put(&b,
        "# HELP paradec_requests_preempted_total Times a running request gave its KV blocks back to wait again.\n"
        "# TYPE paradec_requests_preempted_total counter\nparadec_requests_preempted_total %lld\n",
        (long long)s.preempted);
    put(&b,
        "# HELP paradec_requests_rejected_total Requests answered 503: the queue was full (--max-queue).\n"
        "# TYPE paradec_requests_rejected_total counter\nparadec_requests_rejected_total %lld\n",
        (long long)s.rejected);
    pthread_mutex_lock(&S.mu);
    put(&b,
        "# HELP paradec_connections_open Open client connections.\n# TYPE paradec_connections_open gauge\n"
        "paradec_connections_open %d\n",
        S.n_open);
    put(&b,
        "# HELP paradec_connections_closed_for_room_total Idle connections closed to make room for a new one "
        "(--max-connections).\n# TYPE paradec_connections_closed_for_room_total counter\n"
        "paradec_connections_closed_for_room_total %lld\n",
        (long long)S.made_room);
    put(&b,
        "# HELP paradec_requests_refused_total Requests answered 503: every connection was busy.\n"
        "# TYPE paradec_requests_refused_total counter\nparadec_requests_refused_total %lld\n",
        (long long)S.refused);
    hist_put(&b, "paradec_request_latency_seconds",
             "Completion requests, from their headers' arrival to their answer's last byte.", &S.latency);
    hist_put(&b, "paradec_time_to_first_token_seconds",
             "Completion requests, from their headers' arrival to their first token's text.", &S.ttft);
    pthread_mutex_unlock(&S.mu);
    return b.s;
}

/* ---- a completion: prompt in, tokens out as text (serve_gen.c) ---- */

static int client_gone(void *cls) {
    char ch;
    Conn *k = cls;
    struct pollfd p = {k->fd, POLLIN, 0};
    return k->left = k->fd >= 0 && poll(&p, 1, 0) == 1 &&
                     (p.revents & (POLLHUP | POLLERR) || recv(k->fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT) == 0);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    Conn *k = cls;
    if (k->sse_off == k->sse_n) {
        free(k->sse);
        k->sse_off = k->sse_n = 0;
        if (!(k->sse = gen_event(&k->g, &k->sse_n))) return MHD_CONTENT_READER_END_OF_STREAM;
    }
    rearm(k->mc); /* waiting for tokens is not the client's idle time */
    size_t n = k->sse_n - k->sse_off < max ? k->sse_n - k->sse_off : max;
    memcpy(buf, k->sse + k->sse_off, n);
    k->sse_off += n;
    return (ssize_t)n;
}

static enum MHD_Result complete(struct MHD_Connection *c, Conn *k, RequestKind kind) {
    if (k->too_big) return fail(c, 413, "the request body is too large");
    char id[40];
    snprintf(id, sizeof id, "%s-%ld", kind == REQ_CHAT ? "chatcmpl" : "cmpl", atomic_fetch_add(&S.next_id, 1));
    k->gm = (GenModel){&S.m, S.e, S.chat_format, S.chat_why, S.name};
    if (gen_start(&k->g, &k->gm, kind, k->body ? k->body : "", k->n, id,
                  (uint64_t)time(NULL) ^ (uint64_t)atomic_load(&S.next_id)))
        return fail(c, k->g.busy ? 503 : 400, pd_errmsg());
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    k->fd = ci ? ci->connect_fd : -1;
    k->g.gone = client_gone, k->g.gone_ctx = k;
    if (k->g.req.stream) {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_reader, k, NULL);
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        answer_headers(r, 0);
        enum MHD_Result rc = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return rc;
    }
    int status;
    char *answer = gen_answer(&k->g, &status);
    if (!answer) return status ? fail(c, status, pd_errmsg()) : MHD_NO; /* 0: nobody to answer */
    return reply(c, 200, "application/json", answer);
}

/* ---- routing ---- */

/* "Authorization: Bearer KEY", compared in constant time */
static int authorized(struct MHD_Connection *c) {
    if (!S.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7)) return 0;
    for (h += 7; *h == ' ';) h++;
    size_t n = strlen(h), m = strlen(S.api_key);
    unsigned char d = n != m;
    for (size_t i = 0; i < n; i++) d |= (unsigned char)(h[i] ^ S.api_key[i % m]);
    return !d;
}

static json_t *model_object(void) {
    return json_pack("{s:s, s:s, s:I, s:s}", "id", S.name, "object", "model", "created", (json_int_t)S.created,
                     "owned_by", "paradec");
}

/* GET /v1/models and /v1/models/{id}: the one model this server holds */
static enum MHD_Result models(struct MHD_Connection *c, const char *url) {
    json_t *j;
    if (!strcmp(url, "/v1/models")) j = json_pack("{s:s, s:[o]}", "object", "list", "data", model_object());
    else if (!strcmp(url + strlen("/v1/models/"), S.name)) j = model_object();
    else {
        char m[400];
        snprintf(m, sizeof m, "The model '%.200s' does not exist (this server serves '%.100s')",
                 url + strlen("/v1/models/"), S.name);
        return fail_code(c, 404, "invalid_request_error", "model_not_found", m);
    }
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return reply(c, 200, "application/json", body);
}

/* OPTIONS: a browser's CORS preflight. The headers it asks for are allowed, and always
   Authorization and Content-Type (a wildcard would not cover Authorization). */
static enum MHD_Result preflight(struct MHD_Connection *c) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Allow", "GET, POST, OPTIONS");
    if (S.cors) {
        char h[512] = "Authorization, Content-Type";
        const char *want = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
        if (want && strlen(want) < sizeof h - 40 &&
            strspn(want, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                         "0123456789-_, ") == strlen(want))
            snprintf(h + strlen(h), sizeof h - strlen(h), ", %s", want);
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        MHD_add_response_header(r, "Access-Control-Allow-Headers", h);
        MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
    }
    answer_headers(r, 0);
    enum MHD_Result rc = MHD_queue_response(c, 204, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *data, size_t *data_size, void **con_cls) {
    (void)cls, (void)version;
    int post = !strcmp(method, "POST");
    int kind = !strcmp(url, "/v1/completions") ? REQ_COMPLETION : !strcmp(url, "/v1/chat/completions") ? REQ_CHAT : -1;
    Link *l = link_of(c);
    if (!*con_cls) { /* the headers have arrived */
        Conn *k = calloc(1, sizeof *k);
        if (!k) return MHD_NO;
        k->fd = -1;
        k->mc = c;
        *con_cls = k;
        if (l) {
            l->t_start = pd_now();
            l->denied = strcmp(method, "OPTIONS") && !strncmp(url, "/v1/", 4) && !authorized(c);
            snprintf(l->method, sizeof l->method, "%s", method);
            size_t i = 0; /* the log gets printable ASCII only */
            for (; url[i] && i + 1 < sizeof l->path; i++) l->path[i] = url[i] > ' ' && url[i] < 127 ? url[i] : '?';
            l->path[i] = 0;
        }
        const char *len = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (post && kind >= 0 && len && strtoull(len, NULL, 10) > S.max_body) k->too_big = 1;
        return MHD_YES;
    }
    Conn *k = *con_cls;
    if (*data_size) {         /* a piece of the body */
        if (l && l->denied) { /* answered 401 at the end: the body is not kept */
        } else if (k->too_big || k->n + *data_size > S.max_body) k->too_big = 1;
        else {
            if (k->n + *data_size + 1 > k->cap) {
                k->cap = 2 * (k->n + *data_size + 1);
                char *b = realloc(k->body, k->cap);
                if (!b) return MHD_NO;
                k->body = b;
            }
            memcpy(k->body + k->n, data, *data_size);
            k->n += *data_size;
        }
        *data_size = 0;
        return MHD_YES;
    }
    /* the whole request has arrived */
    int over = 0, stopping = atomic_load(&S.stopping);
    if (l) {
        pthread_mutex_lock(&S.mu);
        l->busy = 1;
        over = ++S.n_busy > S.max_conn;
        pthread_mutex_unlock(&S.mu);
    }
    if (!strcmp(method, "OPTIONS")) return preflight(c);
    if (!strcmp(url, "/health"))
        return reply(c, stopping ? 503 : 200, "application/json",
                     strdup(stopping ? "{\"status\":\"stopping\"}" : "{\"status\":\"ok\"}"));
    if (!strcmp(url, "/metrics")) return reply(c, 200, "text/plain; version=0.0.4", metrics());
    if (l && l->denied)
        return fail_code(c, 401, "invalid_request_error", "invalid_api_key",
                         MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization")
                             ? "Incorrect API key provided"
                             : "You didn't provide an API key: send it as 'Authorization: Bearer KEY'");
    if (stopping) return fail(c, 503, "the server is shutting down");
    if (over) {
        pthread_mutex_lock(&S.mu);
        S.refused++;
        pthread_mutex_unlock(&S.mu);
        char m[160];
        snprintf(m, sizeof m,
                 "the server is busy: all %d connections (--max-connections) have a request running; try again",
                 S.max_conn);
        return fail(c, 503, m);
    }
    if (!strcmp(url, "/v1/models") || !strncmp(url, "/v1/models/", strlen("/v1/models/")))
        return strcmp(method, "GET") ? fail(c, 405, "use GET") : models(c, url);
    if (kind < 0)
        return fail(c, 404,
                    "no such path (paths: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics)");
    if (!post) return fail(c, 405, "use POST");
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u); /* making the answer is not idling */
    enum MHD_Result rc = complete(c, k, (RequestKind)kind);
    rearm(c);
    return rc;
}

/* one line per request on stderr: method, path, status, tokens, milliseconds */
static void access_log(const Link *l, struct MHD_Connection *c, int tokens, double now, int left,
                       enum MHD_RequestTerminationCode why) {
    const union MHD_ConnectionInfo *st = MHD_get_connection_info(c, MHD_CONNECTION_INFO_HTTP_STATUS);
    char status[12] = "-"; /* no answer was queued */
    if (st) snprintf(status, sizeof status, "%u", st->http_status);
    const char *end = left                                             ? ", client left"
                      : why == MHD_REQUEST_TERMINATED_COMPLETED_OK     ? ""
                      : why == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED  ? ", timed out"
                      : why == MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN  ? ", closed by the shutdown"
                      : why == MHD_REQUEST_TERMINATED_WITH_ERROR && st ? ", cut short"
                                                                       : ", client left";
    fprintf(stderr, "serve: %s %s %s %d tok %.0f ms%s\n", l->method, l->path, status, tokens, (now - l->t_start) * 1e3,
            end);
}

/* the request is over (answered, or the client left): its job goes */
static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why) {
    (void)cls;
    Conn *k = *con_cls;
    if (!k) return;
    Link *l = link_of(c);
    if (l) {
        double now = pd_now();
        int prompt = 0, tokens = 0;
        if (k->g.n_c) gen_usage(&k->g, &prompt, &tokens);
        access_log(l, c, tokens, now, k->left, why);
        pthread_mutex_lock(&S.mu);
        if (k->g.n_c) {
            hist_add(&S.latency, now - l->t_start);
            if (k->g.t_first) hist_add(&S.ttft, k->g.t_first - l->t_start);
        }
        if (l->busy) S.n_busy--;
        l->busy = 0, l->idle_since = now;
        pthread_mutex_unlock(&S.mu);
    }
    gen_free(&k->g);
    free(k->body), free(k->sse), free(k);
    *con_cls = NULL;
}

/* past --max-connections: the connection idle the longest (no request running: a slow
   or stalled client, or a kept-alive one) is shut down to make room; MHD then closes
   it. Under S.mu. */
static void make_room(const Link *newcomer) {
    Link *oldest = NULL;
    for (Link *l = S.head; l; l = l->next)
        if (l != newcomer && !l->busy && !l->closing && l->fd >= 0 && (!oldest || l->idle_since < oldest->idle_since))
            oldest = l;
    if (!oldest) return;             /* all busy: the newcomer gets 503 when its request is in */
    shutdown(oldest->fd, SHUT_RDWR); /* the descriptor stays MHD's until it reports the close */
    oldest->closing = 1;
    S.n_open--, S.made_room++;
}

static void notify(void *cls, struct MHD_Connection *c, void **socket_context,
                   enum MHD_ConnectionNotificationCode code) {
    (void)cls;
    Link *l = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        if (!(l = *socket_context = calloc(1, sizeof *l))) return; /* untracked, never refused */
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        l->fd = ci ? ci->connect_fd : -1;
        l->idle_since = pd_now();
        pthread_mutex_lock(&S.mu);
        l->prev = S.tail;
        *(S.tail ? &S.tail->next : &S.head) = l;
        S.tail = l;
        if (++S.n_open > S.max_conn) make_room(l);
        pthread_mutex_unlock(&S.mu);
    } else if (l) { /* closed: MHD closes the descriptor after this */
        pthread_mutex_lock(&S.mu);
        *(l->prev ? &l->prev->next : &S.head) = l->next;
        *(l->next ? &l->next->prev : &S.tail) = l->prev;
        if (!l->closing) S.n_open--;
        pthread_mutex_unlock(&S.mu);
        free(l);
        *socket_context = NULL;
    }
}

/* libmicrohttpd's own messages, in the same log */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char m[512];
    vsnprintf(m, sizeof m, fmt, ap);
    size_t n = strlen(m);
    while (n && (m[n - 1] == '\n' || m[n - 1] == '\r')) m[--n] = 0;
    fprintf(stderr, "serve: http: %s\n", m);
}

/* ---- the model ---- */

/* a bundle's heads, and a draft model, for the methods that take them */
static void load_methods(EngineOptions *o, const char *path, const char *draft) {
    static ExitHeads eh;
    static MedusaHeads mh;
    static Model dm;
    if (bundle_has(&S.m.tf, "exit-heads")) {
        if (heads_load_tf(&eh, &S.m.tf, &S.m, path)) die_lib();
        o->opt.heads = &eh;
    }
    if (bundle_has(&S.m.tf, "medusa-heads")) {
        if (medusa_load_tf(&mh, &S.m.tf, &S.m, path)) die_lib();
        medusa_use_int8(&mh);
        o->opt.medusa = &mh;
    }
    if (bundle_has(&S.m.tf, "eagle-head")) {
        static EagleHead ea;
        if (eagle_load_tf(&ea, &S.m.tf, &S.m, path)) die_lib();
        o->opt.eagle = &ea;
    }
    if (draft) {
        char why[160];
        tool_model_load(&dm, draft);
        if (!tok_same_vocab(S.m.tok, dm.tok, why, sizeof why)) die("--draft %s: %s", draft, why);
        o->opt.draft = &dm;
    }
}

/* the methods this server can run (their heads or draft are loaded), "standard, ..." */
static const char *ready_methods(const MethodShared *sh) {
    static char buf[512];
    buf[0] = 0;
    for (int i = 0; i < decode_method_count(); i++) {
        const DecodeMethod *dm = decode_method_at(i);
        int ok = !decode_method_ready(dm, sh);
        if (ok) snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", buf[0] ? ", " : "", dm->name);
    }
    return buf;
}

/* --help's notes after the flags: the memory, then the methods a request may name, with
   their options (a request runs a method with its defaults) */
static const char *help_notes(void) {
    static char *buf;
    size_t len;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return MEMORY;
    fputs(MEMORY "\n", f);
    decode_methods_help(f);
    fclose(f);
    return buf;
}

static void chat_setup(const char *format) {
    S.chat_format = format ? chat_format_parse(format) : chat_format_detect(S.m.chat_template);
    if (format && S.chat_format < 0) die_lib();
    if (S.chat_format < 0) snprintf(S.chat_why, sizeof S.chat_why, "chat: %s", pd_errmsg());
}

/* ---- the daemon ---- */

/* a listening socket on host:port (a name, an IPv4 or an IPv6 address, [brackets] or
   not); *shown: "addr:port" as bound. Names try their IPv4 addresses first. */
static int listen_on(const char *host, int port, char *shown, size_t shown_n) {
    char h[256], ps[16], at[INET6_ADDRSTRLEN + 16] = "";
    size_t hl = strlen(host);
    snprintf(h, sizeof h, "%.*s", host[0] == '[' && hl > 2 && host[hl - 1] == ']' ? (int)hl - 2 : (int)hl,
             host + (host[0] == '[' && hl > 2 && host[hl - 1] == ']'));
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *res;
    int rc = getaddrinfo(h, ps, &hints, &res), err = 0;
    if (rc) die("--host %s: %s", host, rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
    for (int pass = 0; pass < 2; pass++)
        for (struct addrinfo *a = res; a; a = a->ai_next) {
            if ((a->ai_family == AF_INET) != (pass == 0)) continue;
            char num[INET6_ADDRSTRLEN] = "?";
            void *ip = a->ai_family == AF_INET ? (void *)&((struct sockaddr_in *)a->ai_addr)->sin_addr
                                               : (void *)&((struct sockaddr_in6 *)a->ai_addr)->sin6_addr;
            inet_ntop(a->ai_family, ip, num, sizeof num);
            if (!*at) snprintf(at, sizeof at, a->ai_family == AF_INET6 ? "[%s]:%d" : "%s:%d", num, port);
            int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), on = 1;
            if (fd < 0) {
                err = errno;
                continue;
            }
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on); /* a restart need not wait out TIME_WAIT */
            if (a->ai_family == AF_INET6) {                           /* "::" takes IPv4 too */
                int only = !IN6_IS_ADDR_UNSPECIFIED(&((struct sockaddr_in6 *)a->ai_addr)->sin6_addr);
                setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &only, sizeof only);
            }
            if (bind(fd, a->ai_addr, a->ai_addrlen) || listen(fd, SOMAXCONN)) {
                err = errno;
                snprintf(at, sizeof at, a->ai_family == AF_INET6 ? "[%s]:%d" : "%s:%d", num, port);
                close(fd);
                continue;
            }
            struct sockaddr_storage got;
            socklen_t gl = sizeof got;
            int bound = port;
            if (!getsockname(fd, (struct sockaddr *)&got, &gl))
                bound = ntohs(got.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
                                                        : ((struct sockaddr_in *)&got)->sin_port);
            snprintf(shown, shown_n, a->ai_family == AF_INET6 ? "[%s]:%d" : "%s:%d", num, bound);
            freeaddrinfo(res);
            return fd;
        }
    freeaddrinfo(res);
    die("cannot listen on %s: %s", *at ? at : host, strerror(err ? err : EADDRNOTAVAIL));
}

/* room for every connection MHD may hold, and some for the model's files */
static void raise_open_files(unsigned hard_limit) {
    struct rlimit rl;
    rlim_t need = (rlim_t)hard_limit + 64;
    if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur >= need) return;
    rl.rlim_cur = rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need ? rl.rlim_max : need;
    setrlimit(RLIMIT_NOFILE, &rl);
    if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur < need)
        die("--max-connections %d: needs %llu open files, and this process may open %llu (ulimit -n)", S.max_conn,
            (unsigned long long)need, (unsigned long long)rl.rlim_cur);
}

static int busy(void) {
    pthread_mutex_lock(&S.mu);
    int n = S.n_busy;
    pthread_mutex_unlock(&S.mu);
    return n;
}

static atomic_int stopped;
static void *stop_daemon(void *d) {
    MHD_stop_daemon(d);
    atomic_store(&stopped, 1);
    return NULL;
}

/* SIGTERM or SIGINT: no new connections; open requests have the grace to finish; then
   the rest end (a stream with a last chunk, finish_reason "abort", and [DONE]; a plain
   answer with 503). A second signal ends them at once. 0, or 1 when a request's thread
   did not come back (the process exits anyway). */
static int stop(struct MHD_Daemon *d, double grace, const sigset_t *sigs, int sig) {
    atomic_store(&S.stopping, 1);
    MHD_socket ls = MHD_quiesce_daemon(d); /* shut down, not closed: its number stays taken while MHD may look at it */
    if (ls != MHD_INVALID_SOCKET) shutdown(ls, SHUT_RDWR); /* new clients are refused at once */
    fprintf(stderr, "serve: %s: stopping (open requests: %d; %g s to finish them)\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM", busy(), grace);
    struct timespec tick = {0, 20000000};
    for (double end = pd_now() + grace; busy() && pd_now() < end;) {
        int again = sigtimedwait(sigs, NULL, &tick);
        if (again == SIGINT || again == SIGTERM) break;
    }
    int n = busy();
    if (n) {
        fprintf(stderr, "serve: ending the open requests (%d)\n", n);
        engine_abort(S.e);
        /* the jobs end after the step under way (a big model's may take seconds); then
           their handlers have a second to send the last chunks */
        double idle = 0;
        for (double end = pd_now() + 60; busy() && pd_now() < end && (!idle || pd_now() < idle + 1);) {
            EngineStats es = engine_stats(S.e);
            if (!idle && !es.running && !es.queued) idle = pd_now();
            nanosleep(&tick, NULL);
        }
    }
    pthread_t t; /* a thread stuck in a request would hold MHD_stop_daemon forever */
    if (pthread_create(&t, NULL, stop_daemon, d)) return stop_daemon(d), close(ls), engine_free(S.e), 0;
    for (double end = pd_now() + 3; !atomic_load(&stopped) && pd_now() < end;) nanosleep(&tick, NULL);
    if (!atomic_load(&stopped)) {
        fprintf(stderr, "serve: requests that did not end (%d): exiting without them\n", busy());
        return 1;
    }
    pthread_join(t, NULL);
    if (ls != MHD_INVALID_SOCKET) close(ls);
    engine_free(S.e);
    return 0;
}

int main(int argc, char **argv) {
    tool_name = "serve";
    const char *model = NULL, *host = "127.0.0.1", *draft = NULL, *format = NULL, *alias = NULL;
    int port = 8080, threads = 0, kv_blocks = 0;
    const char *device = NULL;
    double grace = 5;
    EngineOptions o = {.parallel = 16,
                       .block_size = 16,
                       .prefill_chunk = 64,
                       .continuous = 1,
                       .spec_max_batch = 256,
                       .max_queue = 1024};
    const char *kv_type = "f32";
    int no_spec = 0, static_batch = 0, timeout = 30;
    long max_body = 1 << 20;
    S.max_conn = 256;
    Flag t[] = {
        {"-m, --model", "FILE", "required", "the model, bundle (bin/pack), GGUF file or Hugging Face directory",
         F_STR(&model)},
        MODEL_FLAGS{"--host", "ADDR", "127.0.0.1",
                    "address or host name to listen on; ::1 for IPv6, :: or 0.0.0.0 for all", F_STR(&host)},
        {"--port", "P", "8080", "port; 0 takes a free one, named in the first line on stderr", F_INT(&port, 0, 65535)},
        {"-a, --alias", "NAME", "the model's file name", "the model's name in answers and /v1/models", F_STR(&alias)},
        {"-np, --parallel", "N", "16", "requests in the running batch at most; the rest queue",
         F_INT(&o.parallel, 1, 256)},
        {"-c, --ctx-size", "C", "the model's context, also the most",
         "positions per request, prompt and answer together", F_INT(&o.ctx, 2, 1 << 24)},
        {"--kv-blocks", "B", "N x C / 16", "the paged KV pool in blocks of 16 positions",
         F_INT(&kv_blocks, 1, 1 << 24)},
        KV_TYPE_FLAG(&kv_type),
        {"-t, --threads", "T", "every core", "threads for the forward pass", F_INT(&threads, 1, 1024)},
        DEVICE_FLAG(&device),
        {"--draft", "MODEL", NULL, "a draft model for the speculative method", F_STR(&draft)},
        {"--chat-format", "F", "recognised from the model's template", "llama3, llama2 or chatml", F_STR(&format)},
        {"--spec-max-batch", "N", "256", "requests run their methods while the batch holds at most N requests",
         F_INT(&o.spec_max_batch, 0, 256)},
        {"--no-speculation", NULL, NULL, "standard steps only (same as --spec-max-batch 0)", F_SWITCH(&no_spec)},
        {"--no-continuous", NULL, NULL, "static batching: a batch forms when none runs (the load benchmark's baseline)",
         F_SWITCH(&static_batch)},
        {"--max-queue", "N", "1024", "requests waiting for room at most; past it 503 with Retry-After",
         F_INT(&o.max_queue, 1, 1 << 20)},
        {"--no-prefix-cache", NULL, NULL, "every request computes its whole prompt (no shared KV blocks)",
         F_SWITCH(&o.no_prefix_cache)},
        {"--max-body", "BYTES", "1048576", "larger request bodies get 413", F_LONG(&max_body, 1, 1L << 30)},
        {"--max-connections", "N", "256", "open connections at most; past it the longest-idle one is closed, or 503",
         F_INT(&S.max_conn, 1, 100000)},
        {"-to, --timeout", "S", "30", "a connection that sends or takes nothing for S seconds is closed",
         F_INT(&timeout, 1, 86400)},
        {"--shutdown-grace", "S", "5", "on SIGTERM or SIGINT, open requests have S seconds to finish",
         F_NUM(&grace, 0, 3600)},
        {"--api-key", "KEY", "none: open", "/v1/* needs \"Authorization: Bearer KEY\", else 401", F_STR(&S.api_key)},
        {"--cors", "ORIGIN", NULL, "answers allow that browser origin, or * for any", F_STR(&S.cors)},
    };
    flags_parse(t, N_FLAGS(t), argc, argv, NULL, 0, USAGE, help_notes());
    /* both at once contradict each other, and the table keeps no order to let the last win */
    if (no_spec && o.spec_max_batch) {
        const Flag *f = flag_given(t, N_FLAGS(t), "--spec-max-batch");
        if (f) die("--no-speculation: %s %d asks for speculation", f->as, o.spec_max_batch);
        o.spec_max_batch = 0;
    }
    o.continuous = !static_batch;
    o.kv_type = kv_type_arg(kv_type);
    S.max_body = (size_t)max_body, S.timeout = (unsigned)timeout;
    if (!model) usage("-m MODEL");
    if (S.api_key && (!*S.api_key || strpbrk(S.api_key, "\r\n"))) die("--api-key: must be a non-empty line");
    if (S.cors && (!*S.cors || strpbrk(S.cors, "\r\n")))
        die("--cors: must be an origin such as https://example.com, or *");
    /* signals are taken by sigwait at the end, in no other thread: blocked before any starts */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT), sigaddset(&sigs, SIGTERM), sigaddset(&sigs, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    unsigned hard_limit = (unsigned)S.max_conn + (unsigned)S.max_conn / 4 + 16; /* room to answer 503 past the limit */
    raise_open_files(hard_limit);
    char shown[INET6_ADDRSTRLEN + 16];
    int ls = listen_on(host, port, shown, sizeof shown); /* before the model: a port in use fails at once */
    tool_model_load(&S.m, model);
    if (o.ctx > S.m.c.seq_len)
        die("--ctx-size %d: the model's context is %d positions, the most a request can hold", o.ctx, S.m.c.seq_len);
    size_t e = strlen(model), b, nl; /* the name: --alias, or the file's (or directory's) own name */
    while (e > 1 && model[e - 1] == '/') e--;
    for (b = e; b && model[b - 1] != '/';) b--;
    char *name = alias ? utf8_clean(alias, strlen(alias), &nl) : utf8_clean(model + b, e - b, &nl);
    if (!name) die("out of memory");
    S.name = name;
    struct stat st;
    S.created = !stat(model, &st) ? (long)st.st_mtime : (long)time(NULL);
    uint64_t r;
    if (getrandom(&r, sizeof r, 0) != sizeof r) r = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)getpid();
    atomic_store(&S.next_id, (long)(r >> 2)); /* ids differ across restarts; the counter never overflows */
    load_methods(&o, model, draft);
    chat_setup(format);
    if (model_threads(threads)) die("cannot start %d threads", threads);
    device_arg(device);
    int ctx = o.ctx >= 2 ? o.ctx : S.m.c.seq_len;
    o.kv_blocks = kv_blocks ? kv_blocks : (o.parallel * ctx + o.block_size - 1) / o.block_size;
    pthread_mutex_init(&S.mu, NULL);
    S.latency = (Hist){.le = LATENCY_LE, .n = sizeof LATENCY_LE / sizeof *LATENCY_LE};
    S.ttft = (Hist){.le = TTFT_LE, .n = sizeof TTFT_LE / sizeof *TTFT_LE};
    if (!(S.e = engine_new(&S.m, &o))) die_lib();

    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG, 0, NULL, NULL,
        handle, NULL, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_LISTEN_SOCKET, (MHD_socket)ls,
        MHD_OPTION_NOTIFY_COMPLETED, completed, NULL, MHD_OPTION_NOTIFY_CONNECTION, notify, NULL,
        MHD_OPTION_CONNECTION_LIMIT, hard_limit, MHD_OPTION_CONNECTION_TIMEOUT, S.timeout, MHD_OPTION_END);
    if (!d) die("cannot start the HTTP server on %s", shown);
    fprintf(stderr,
            "serve: listening on http://%s (%s, %d parallel, context %d, %d KV blocks of %d in %s, methods: %s)\n",
            shown, S.name, o.parallel, ctx, o.kv_blocks, o.block_size, kv_type_name(o.kv_type), ready_methods(&o.opt));
    int sig;
    do sigwait(&sigs, &sig);
    while (sig == SIGPIPE);
    int rc = stop(d, grace, &sigs, sig);
    if (rc) _exit(rc); /* a stuck thread may hold what exit's handlers would take */
    return 0;
}
