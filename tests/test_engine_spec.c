/* test_engine_spec — speculation shared between the serve engine's requests (issue 26):
   every method's requests, eight at once through one engine, each greedy answer equal
   to standard's continuation (decode's), and no drafter's start running anything again
   (EAGLE's head reads the prompt's states its standard steps kept, or the prefix cache
   kept with a block another request left); with fixed trees,
   the drafters' trees verified in forward calls shared with other requests (the budget
   cannot shrink them), and a seeded sampled request gives the same tokens alone as
   among three others (its rounds depend on nothing but its own history) and as decode
   draws it; in a pool too small for all of them, requests preempted while their
   methods run (EAGLE's too), and every answer still standard's. */
#include "decode/engine.h"
#include "methods.h"

#define BATCH 8

static MethodShared SH;

static Engine *engine(int fixed, int kv_blocks) {
    EngineOptions o = {.parallel = BATCH,
                       .ctx = M.c.seq_len,
                       .block_size = 16,
                       .prefill_chunk = 64,
                       .continuous = 1,
                       .spec_max_batch = BATCH,
                       .kv_blocks = kv_blocks,
                       .opt = SH};
    o.opt.fixed_tree = fixed;
    Engine *e = engine_new(&M, &o);
    CHECK(e, "engine: %s", pd_errmsg());
    return e;
}

/* prompts [first, first + n) submitted at once, n ≤ BATCH; their tokens in out, their
   counts in n_out (-1: the job failed); 0, or -1 when a job could not be submitted */
static int run_jobs(Engine *e, const char *method, int first, int n, float temp, uint64_t seed, int32_t out[][N_NEW],
                    int *n_out) {
    Job *j[BATCH];
    const char *fin[BATCH] = {0};
    for (int i = 0; i < n; i++) {
        JobOptions jo = {
            .max_new = N_NEW, .temp = temp, .top_p = 1, .seed = seed + (uint64_t)i, .method = method, .logprobs = -1};
        if (!(j[i] = engine_submit(e, PROMPT[first + i], PROMPT_N[first + i], &jo, NULL))) {
            CHECK(0, "%s: submit: %s", method, pd_errmsg());
            while (i--) job_cancel(e, j[i]), job_release(e, j[i]);
            return -1;
        }
    }
    int got[BATCH] = {0}, left = n;
    for (int tries = 0; left && tries < 6000; tries++)
        for (int i = 0; i < n; i++)
            if (!fin[i]) {
                got[i] = job_wait(e, j[i], got[i], 0.01, &fin[i]);
                left -= fin[i] != NULL;
            }
    for (int i = 0; i < n; i++) {
        n_out[i] = fin[i] && strcmp(fin[i], "error") ? got[i] : -1;
        if (n_out[i] > 0) memcpy(out[i], job_tokens(j[i]) + PROMPT_N[first + i], sizeof(int32_t) * got[i]);
        if (!fin[i]) job_cancel(e, j[i]);
        job_release(e, j[i]);
    }
    return 0;
}

/* greedy answers of n prompts, BATCH at a time: how many differ from standard's */
static int parity_engine(Engine *e, const char *method, int n) {
    int32_t out[BATCH][N_NEW];
    int n_out[BATCH], bad = 0;
    for (int first = 0; first + BATCH <= n; first += BATCH) {
        if (run_jobs(e, method, first, BATCH, 0, 1, out, n_out)) return n;
        for (int i = 0; i < BATCH; i++)
            bad += n_out[i] != REF_N[first + i] || memcmp(out[i], REF[first + i], sizeof(int32_t) * REF_N[first + i]);
    }
    return bad;
}

int main(void) {
    if (methods_setup()) return check_done("engine_spec");
    ExitHeads ident;
    MedusaHeads medusa;
    static const int layers[] = {1, 2, 3};
    int have_ident = !heads_identity(&ident, &M, layers, 3, 1);
    int have_medusa = !medusa_load(&medusa, "build/test-medusa.safetensors.zst", &M);
    CHECK(have_ident, "identity heads: %s", pd_errmsg());
    if (!have_medusa)
        printf("SKIP test_engine_spec: medusa: no build/test-medusa.safetensors.zst (make test trains it)\n");
    EagleHead eagle;
    int have_eagle = !eagle_load(&eagle, "build/test-eagle.safetensors.zst", &M);
    if (!have_eagle)
        printf("SKIP test_engine_spec: eagle: no build/test-eagle.safetensors.zst (make test trains it)\n");
    SH.heads = have_ident ? &ident : NULL, SH.medusa = have_medusa ? &medusa : NULL;
    SH.eagle = have_eagle ? &eagle : NULL;
    int n = san_share(32, 4) / BATCH * BATCH;

    /* every method, eight requests at a time, the budget deciding their trees */
    static const char *const methods[] = {"standard",         "prompt-lookup", "lookahead", "medusa",
                                          "self-speculative", "adadecode",     "eagle"};
    Engine *e = engine(0, BATCH * M.c.seq_len / 16);
    for (size_t k = 0; e && k < sizeof methods / sizeof *methods; k++) {
        if (engine_method_ok(e, methods[k])) continue;
        EngineStats before = engine_stats(e);
        int bad = parity_engine(e, methods[k], n);
        EngineStats after = engine_stats(e);
        long long again = (long long)(after.method_prefilled - before.method_prefilled);
        long long hits = (long long)(after.prefix_hits - before.prefix_hits);
        printf("  %-17s eight at once: %d/%d differ from standard, %lld tokens run again at the starts, %lld cached "
               "blocks attached\n",
               methods[k], bad, n, again, hits);
        CHECK(bad == 0, "%s, eight at once: %d of %d answers differ from standard's", methods[k], bad, n);
        if (strcmp(methods[k], "standard"))
            CHECK(after.method_tokens > before.method_tokens, "%s: no token came from the method", methods[k]);
        if (decode_method(methods[k])->step == drafter_step) /* AdaDecode's start runs the last token again */
            CHECK(again == 0, "%s: its starts ran %lld context tokens again", methods[k], again);
    }
    engine_free(e);

    /* the longest prompt, left in the prefix cache by a standard request: an EAGLE
       request on it takes every full block it may with the blocks' states (its head
       reads them), runs none of it again, and answers as standard */
    if (have_eagle && (e = engine(0, BATCH * M.c.seq_len / 16))) {
        int p = 0, n_out;
        for (int i = 1; i < n; i++) p = PROMPT_N[i] > PROMPT_N[p] ? i : p;
        int32_t out[1][N_NEW];
        run_jobs(e, "standard", p, 1, 0, 1, out, &n_out);
        EngineStats before = engine_stats(e);
        run_jobs(e, "eagle", p, 1, 0, 1, out, &n_out);
        EngineStats after = engine_stats(e);
        long long blocks = (PROMPT_N[p] - 1) / 16, hits = (long long)(after.prefix_hits - before.prefix_hits);
        printf("  eagle from the cache: %lld of %lld blocks attached\n", hits, blocks);
        CHECK(blocks > 0 && hits == blocks, "eagle from the cache: %lld of %lld blocks attached", hits, blocks);
        CHECK(after.method_prefilled == before.method_prefilled,
              "eagle from the cache: its start ran the prompt again");
        CHECK(n_out == REF_N[p] && !memcmp(out[0], REF[p], sizeof(int32_t) * n_out),
              "eagle from the cache: its answer differs from standard's");
        engine_free(e);
    }

    /* fixed trees: every round drafts, and the trees share the step's call */
    const char *drafter = have_medusa ? "medusa" : "prompt-lookup";
    if ((e = engine(1, BATCH * M.c.seq_len / 16))) {
        int bad = parity_engine(e, drafter, n);
        EngineStats st = engine_stats(e);
        printf("  %-17s fixed trees: %d/%d differ, %lld trees shared a call in %lld steps\n", drafter, bad, n,
               (long long)st.rounds_shared, (long long)st.steps);
        CHECK(bad == 0, "%s, fixed trees: %d of %d answers differ", drafter, bad, n);
        CHECK(st.rounds_shared > 4 * n, "%s, fixed trees: %lld trees shared a forward call", drafter,
              (long long)st.rounds_shared);

        /* sampled: each request alone, then four together, seeds alike (four: the step's
           room holds their whole trees, which the budget then leaves as they are) */
        int32_t alone[4][N_NEW], together[BATCH][N_NEW], one[1][N_NEW];
        int n_alone[4], n_together[BATCH], same = 0;
        for (int i = 0; i < 4; i++) {
            run_jobs(e, drafter, i, 1, 0.9f, 100 + (uint64_t)i, one, &n_alone[i]);
            memcpy(alone[i], one[0], sizeof one[0]);
        }
        run_jobs(e, drafter, 0, 4, 0.9f, 100, together, n_together);
        for (int i = 0; i < 4; i++)
            same += n_alone[i] > 0 && n_alone[i] == n_together[i] &&
                    !memcmp(alone[i], together[i], sizeof(int32_t) * n_alone[i]);
        CHECK(same == 4, "%s sampled with fixed trees: %d of 4 answers the same alone and among others", drafter, same);
        /* and alone as decode draws it: the engine starts a method from the state and
           token its standard step gave, where decode's own begin chooses that token */
        TestOptions to = {.medusa = SH.medusa, .fixed_tree = 1};
        int32_t dec[N_NEW];
        same = 0;
        for (int i = 0; i < 4; i++) {
            int nd = run(drafter, &to, PROMPT[i], PROMPT_N[i], N_NEW, 0.9f, 100 + (uint64_t)i, dec, NULL);
            same += nd > 0 && nd == n_alone[i] && !memcmp(dec, alone[i], sizeof(int32_t) * nd);
        }
        CHECK(same == 4, "%s sampled with fixed trees: %d of 4 answers the same in the engine as decode's", drafter,
              same);
        engine_free(e);
    }

    /* EAGLE with fixed trees: four requests' proposals made together (one head call a level
       for all four) draft what each drafts alone, token for token */
    if (have_eagle && (e = engine(1, BATCH * M.c.seq_len / 16))) {
        int32_t out[BATCH][N_NEW];
        int n_out[BATCH], bad = 0;
        EngineStats a0 = engine_stats(e);
        for (int i = 0; i < 4; i++) run_jobs(e, "eagle", i, 1, 0, 1, out, n_out);
        EngineStats a1 = engine_stats(e);
        run_jobs(e, "eagle", 0, 4, 0, 1, out, n_out);
        EngineStats a2 = engine_stats(e);
        for (int i = 0; i < 4; i++) bad += n_out[i] != REF_N[i] || memcmp(out[i], REF[i], sizeof(int32_t) * REF_N[i]);
        long long d1 = (long long)(a1.drafted - a0.drafted), k1 = (long long)(a1.drafts_kept - a0.drafts_kept),
                  d2 = (long long)(a2.drafted - a1.drafted), k2 = (long long)(a2.drafts_kept - a1.drafts_kept);
        printf(
            "  eagle fixed trees: alone %lld drafted, %lld kept; four together %lld, %lld (%lld proposals grouped)\n",
            d1, k1, d2, k2, (long long)(a2.proposals_grouped - a1.proposals_grouped));
        CHECK(bad == 0, "eagle, four together: %d of 4 answers differ from standard's", bad);
        CHECK(a1.proposals_grouped == a0.proposals_grouped && a2.proposals_grouped > a1.proposals_grouped + 16,
              "eagle: proposals grouped alone %lld, together %lld",
              (long long)(a1.proposals_grouped - a0.proposals_grouped),
              (long long)(a2.proposals_grouped - a1.proposals_grouped));
        CHECK(d1 > 0 && d1 == d2 && k1 == k2, "eagle: alone %lld drafted, %lld kept; together %lld, %lld", d1, k1, d2,
              k2);
        engine_free(e);
    }

    /* a pool for about three of the eight: requests wait, and running ones are preempted
       (their methods stop and start again from their context) */
    if ((e = engine(0, 3 * (PROMPT_N[0] + N_NEW + 2 * MAX_TREE) / 16 + 3))) {
        int bad = parity_engine(e, drafter, n) + parity_engine(e, "lookahead", n), runs = 2 * n;
        if (have_eagle) bad += parity_engine(e, "eagle", n), runs += n;
        EngineStats st = engine_stats(e);
        printf("  a small pool: %d/%d differ, %lld preemptions\n", bad, runs, (long long)st.preempted);
        CHECK(bad == 0, "a small pool: %d of %d answers differ", bad, runs);
        CHECK(st.preempted > 0, "a small pool: no request was preempted");
        CHECK(st.kv_used == 0, "a small pool: %d blocks still held after every request ended", st.kv_used);
        engine_free(e);
    }
    if (have_ident) heads_free(&ident);
    if (have_medusa) medusa_free(&medusa);
    if (have_eagle) eagle_free(&eagle);
    methods_teardown();
    return check_done("engine_spec");
}
