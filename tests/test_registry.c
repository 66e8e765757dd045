/* test_registry.c — the method registry (libcore/decode/method.h): a test-only method,
   registered here and nowhere in libcore, is listed, has its options parsed and
   refused by name, and runs through decode_generate and the serve engine. Its output
   is checked against standard decoding's, run independently. */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "decode/engine.h"
#include "fixture.h"

static Model M;

/* the test method: standard steps, at most stop-after tokens; what options it saw */
typedef struct {
    int stop_after, loud;
    float scale;
} EchoOptions;

static EchoOptions seen;
static int generations;
/* which generation each step belonged to, and on which thread it ran */
#define MAX_TRACE 256
static const DecodeCtx *trace[MAX_TRACE];
static pthread_t trace_thread[MAX_TRACE];
static int n_trace;

static const MethodOption echo_options[] = {
    {"stop-after", OPT_INT, 1, 100, "N", "no limit", "tokens at most", offsetof(EchoOptions, stop_after), 0, NULL},
    {"scale", OPT_FLOAT, 0.5, 2, "S", "1", "a number it only records", offsetof(EchoOptions, scale), 0, NULL},
    {"loud", OPT_SWITCH, 0, 0, NULL, NULL, "a switch it only records", offsetof(EchoOptions, loud), 0, NULL},
};

/* a state machine like every method's: begin prefills and takes the first token, a
   step one more */
typedef struct {
    const EchoOptions *o;
    int prev, pos, done;
} EchoState;

static int echo_next(DecodeCtx *d, EchoState *s) {
    int next = sampler_sample(d->sampler, d->logits);
    s->done = decode_accept(d, s->prev, next, NULL) || s->pos >= d->m->c.seq_len ||
              (s->o->stop_after && d->n_out >= s->o->stop_after);
    s->prev = next;
    return s->done;
}

static int echo_begin(DecodeCtx *d, const int32_t *prompt, int n_prompt, void **state) {
    static const EchoOptions none;
    EchoState *s = calloc(1, sizeof *s);
    if (!(*state = s)) return -1;
    s->o = d->mopt ? d->mopt : &none;
    seen = *s->o;
    generations++;
    if (decode_prefill(d, prompt, n_prompt)) return -1;
    s->prev = prompt[n_prompt - 1], s->pos = n_prompt;
    echo_next(d, s);
    return 0;
}

static int echo_step(DecodeCtx *d, void *state) {
    EchoState *s = state;
    if (n_trace < MAX_TRACE) trace[n_trace] = d, trace_thread[n_trace++] = pthread_self();
    if (s->done) return 1;
    if (decode_step(d, s->prev, s->pos++, d->hidden, d->logits)) return -1;
    return echo_next(d, s);
}

static void echo_finish(DecodeCtx *d, void *state) {
    (void)d;
    free(state);
}

static const DecodeMethod echo = {.name = "test-echo",
                                  .summary = "standard steps, for the registry's test",
                                  .options = echo_options,
                                  .n_options = 3,
                                  .options_size = sizeof(EchoOptions),
                                  .samples = 1,
                                  .begin = echo_begin,
                                  .step = echo_step,
                                  .finish = echo_finish};

/* greedy tokens of a method through decode_generate; n of them, -1 on error */
static int generate(const DecodeMethod *dm, const void *opts, const int32_t *p, int n, int max_new, int32_t *out) {
    KVCache kv;
    Sampler s;
    DecodeCtx d;
    if (kv_init(&kv, &M.c, 1, M.c.seq_len, 16)) return -1;
    if (sampler_init(&s, M.c.vocab_size, 0, 0, 1, 1) || decode_init(&d, &M, &kv, &s, max_new)) {
        kv_free(&kv);
        return -1;
    }
    d.mopt = opts;
    int rc = decode_generate(dm, &d, p, n) ? -1 : d.n_out;
    if (rc > 0) memcpy(out, d.out, sizeof(int32_t) * rc);
    decode_free(&d);
    sampler_free(&s);
    kv_free(&kv);
    return rc;
}

static void test_listing(void) {
    CHECK(decode_register(&echo) == 0, "register: %s", pd_errmsg());
    CHECK(decode_register(&echo) < 0 && strstr(pd_errmsg(), "test-echo"), "a name registered twice: %s", pd_errmsg());
    CHECK(decode_method("test-echo") == &echo, "found by name");
    CHECK(strstr(decode_method_names(), "test-echo") != NULL, "named in the list: %s", decode_method_names());
    CHECK(decode_method_at(decode_method_count() - 1) == &echo, "last in the registry");
    char *help = NULL;
    size_t len;
    FILE *f = open_memstream(&help, &len);
    decode_methods_help(f);
    fclose(f);
    CHECK(help && strstr(help, "test-echo") && strstr(help, "standard steps, for the registry's test") &&
              strstr(help, "--stop-after N") && strstr(help, "tokens at most (no limit, in [1, 100])") &&
              strstr(help, "--loud"),
          "--help lists the method and its options:\n%s", help ? help : "");
    free(help);
    CHECK(!strcmp(decode_option_users("stop-after"), "test-echo"), "users of --stop-after: %s",
          decode_option_users("stop-after"));
}

static void test_parser(void) {
    EchoOptions *o = decode_options_new(&echo);
    MethodShared sh = {0};
    CHECK(o && decode_option_set(&echo, o, &sh, "stop-after", "3") == 0 && o->stop_after == 3, "stop-after 3");
    CHECK(decode_option_set(&echo, o, &sh, "scale", "1.5") == 0 && o->scale == 1.5f, "scale 1.5");
    CHECK(decode_option_set(&echo, o, &sh, "loud", NULL) == 0 && o->loud == 1, "loud");
    CHECK(decode_option_set(&echo, o, &sh, "loud", "false") == 0 && o->loud == 0, "loud: false");
    static const struct {
        const char *name, *value, *says;
    } bad[] = {
        {"stop-after", "0", "--stop-after 0 is outside [1, 100]"},
        {"stop-after", "101", "--stop-after 101 is outside"},
        {"stop-after", "2.5", "--stop-after: '2.5' is not an integer"},
        {"stop-after", "x", "--stop-after: 'x' is not an integer"},
        {"stop-after", "", "--stop-after"},
        {"scale", "3", "--scale: '3' is not a number in [0.5, 2]"},
        {"scale", "nan", "--scale"},
        {"loud", "maybe", "--loud: 'maybe' is not a boolean"},
        {"gamma", "0.5", "--gamma: test-echo does not use it (adadecode self-speculative do)"},
        {"no-such", "1", "--no-such: no method has this option"},
    };
    for (int i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++)
        CHECK(decode_option_set(&echo, o, &sh, bad[i].name, bad[i].value) < 0 && strstr(pd_errmsg(), bad[i].says),
              "--%s %s refused: %s", bad[i].name, bad[i].value, pd_errmsg());
    CHECK(o->stop_after == 3 && o->scale == 1.5f, "refused values leave the options as they were");
    /* a struct filled in code is checked too, before the method runs */
    EchoOptions direct = {.stop_after = 500};
    CHECK(decode_options_check(&echo, &direct, &sh) < 0 &&
              strstr(pd_errmsg(), "test-echo: --stop-after 500 is outside"),
          "a value out of range set in code: %s", pd_errmsg());
    MethodShared oracle = {.oracle_rate = 0.5f};
    CHECK(decode_options_check(&echo, o, &oracle) < 0 && strstr(pd_errmsg(), "oracle"),
          "an oracle for a method that takes none: %s", pd_errmsg());
    free(o);
}

static void test_generation(const int32_t *p, int n) {
    int32_t ref[32], got[32];
    int n_ref = generate(decode_reference(), NULL, p, n, 24, ref);
    CHECK(n_ref > 3, "standard: %d tokens (%s)", n_ref, n_ref < 0 ? pd_errmsg() : "");
    EchoOptions *o = decode_options_new(&echo);
    MethodShared sh = {0};
    if (!o || decode_option_set(&echo, o, &sh, "stop-after", "3") ||
        decode_option_set(&echo, o, &sh, "scale", "0.75") || decode_option_set(&echo, o, &sh, "loud", NULL)) {
        CHECK(0, "options: %s", pd_errmsg());
        free(o);
        return;
    }
    int k = generate(&echo, o, p, n, 24, got);
    CHECK(k == 3 && !memcmp(got, ref, sizeof(int32_t) * 3), "stop-after 3: %d tokens, standard's first three", k);
    CHECK(seen.stop_after == 3 && seen.scale == 0.75f && seen.loud == 1, "the method saw its parsed options");
    k = generate(&echo, NULL, p, n, 24, got);
    CHECK(k == n_ref && !memcmp(got, ref, sizeof(int32_t) * k), "defaults: standard's %d tokens (got %d)", n_ref, k);
    free(o);
}

/* every token of a job, once it ended; n of them, -1 on error */
static int job_run(Engine *e, const char *method, const int32_t *p, int n, int max_new, int32_t *out) {
    JobOptions jo = {.max_new = max_new, .temp = 0, .top_p = 1, .method = method, .logprobs = -1};
    Job *j = engine_submit(e, p, n, &jo, NULL);
    if (!j) return -1;
    const char *finish = NULL;
    int got = 0;
    for (int tries = 0; !finish && tries < 600; tries++) got = job_wait(e, j, got, 0.1, &finish);
    if (finish) memcpy(out, job_tokens(j) + n, sizeof(int32_t) * got);
    job_release(e, j);
    return finish && strcmp(finish, "error") ? got : -1;
}

static void test_engine(const int32_t *p, int n) {
    EngineOptions eo = {.parallel = 2,
                        .ctx = 128,
                        .block_size = 16,
                        .prefill_chunk = 64,
                        .continuous = 1,
                        .spec_max_batch = 1,
                        .kv_blocks = 2 * (128 + 256) / 16};
    Engine *e = engine_new(&M, &eo);
    CHECK(e, "engine: %s", pd_errmsg());
    if (!e) return;
    CHECK(engine_method_ok(e, "test-echo") == 0, "the engine knows the test method: %s", pd_errmsg());
    CHECK(engine_method_ok(e, "medusa") < 0 && strstr(pd_errmsg(), "Medusa heads"), "medusa without heads: %s",
          pd_errmsg());
    int32_t ref[32], got[32];
    int n_ref = job_run(e, decode_reference()->name, p, n, 20, ref);
    int before = generations;
    int k = job_run(e, "test-echo", p, n, 20, got);
    CHECK(n_ref > 3 && k == n_ref && !memcmp(got, ref, sizeof(int32_t) * k),
          "through the engine: standard's %d tokens (got %d)", n_ref, k);
    CHECK(generations > before, "the engine ran the test method's generation");
    engine_free(e);

    /* two requests at once: one scheduler thread steps both generations, in turns */
    eo.spec_max_batch = 2;
    e = engine_new(&M, &eo);
    CHECK(e, "engine: %s", pd_errmsg());
    if (!e) return;
    JobOptions jo = {.max_new = 20, .temp = 0, .top_p = 1, .method = "test-echo", .logprobs = -1};
    n_trace = 0;
    Job *a = engine_submit(e, p, n, &jo, NULL), *b = engine_submit(e, p, n, &jo, NULL);
    const char *fa = NULL, *fb = NULL;
    int ga = 0, gb = 0;
    for (int tries = 0; a && b && (!fa || !fb) && tries < 600; tries++) {
        if (!fa) ga = job_wait(e, a, ga, 0.05, &fa);
        if (!fb) gb = job_wait(e, b, gb, 0.05, &fb);
    }
    CHECK(fa && fb && ga == n_ref && gb == n_ref && !memcmp(job_tokens(a) + n, ref, sizeof(int32_t) * ga) &&
              !memcmp(job_tokens(b) + n, ref, sizeof(int32_t) * gb),
          "two at once: standard's %d tokens each (got %d, %d)", n_ref, ga, gb);
    int same_thread = n_trace > 0, switches = 0, kinds = 0;
    for (int i = 0; i < n_trace; i++) {
        same_thread &=
            pthread_equal(trace_thread[i], trace_thread[0]) && !pthread_equal(trace_thread[i], pthread_self());
        if (i && trace[i] != trace[i - 1]) switches++;
    }
    for (int i = 0; i < n_trace; i++) kinds += trace[i] != trace[0];
    CHECK(same_thread, "every step ran on the one scheduler thread (%d steps)", n_trace);
    CHECK(kinds > 0 && switches >= 4, "the two generations' steps took turns (%d switches in %d steps)", switches,
          n_trace);
    if (a) job_release(e, a);
    if (b) job_release(e, b);
    engine_free(e);
}

int main(void) {
    if (test_model_load(&M)) return check_done("registry");
    k_init(1);
    int32_t *p;
    int n;
    if (tok_encode_flags(M.tok, "Once upon a time", 16, TOK_ADD_BOS, &p, &n)) {
        CHECK(0, "encode: %s", pd_errmsg());
        return check_done("registry");
    }
    test_listing();
    test_parser();
    test_generation(p, n);
    test_engine(p, n);
    free(p);
    model_free(&M);
    return check_done("registry");
}
