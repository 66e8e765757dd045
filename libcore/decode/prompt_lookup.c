/* prompt_lookup.c — prompt lookup decoding (Saxena 2023; llama.cpp's and Hugging Face's
   prompt lookup): the text so far often repeats itself (names, phrases, code), so the
   tokens that followed the last earlier occurrence of the text's tail are a good guess
   of what comes next. Each round looks up the longest tail n-gram (n = ngram_max down
   to 1) in the prompt and the output so far and drafts the chain that followed it, at
   most draft_max tokens (fewer after short matches whose drafts seldom held); the
   drafter loop verifies it in one forward call.

   The index maps every n-gram (n ≤ ngram_max) of the text to the position of its last
   occurrence; an n-gram ending at position e enters only once e + 1 exists, so the
   tail never finds itself and every match has a continuation. When the continuation
   reaches the end of the text it repeats with the match's period (the text after the
   match is, so far, a copy of what follows it).

   Drafts are deterministic (point masses), so the loop's rejection sampling keeps the
   output lossless when sampling too. With oracle_rate > 0 (benchmarks) an oracle that
   knows the standard continuation drafts instead, right at each depth with that
   probability. */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "decode/drafter.h"

#define LOOKUP_DEFAULT_NGRAM_MAX 3
#define LOOKUP_MAX_NGRAM 8
#define LOOKUP_DEFAULT_DRAFT_MAX 10
#define LOOKUP_MAX_DRAFT 64

typedef struct {
    uint32_t hash;
    int32_t n, end; /* the n-gram text[end-n+1 .. end]; n = 0: an empty slot */
} LookupSlot;

typedef struct {
    int ngram_max, draft_max;
    /* drafts kept after matches of each length (sums and rounds, from a prior of one
       kept in one round): a chain is a little longer than what usually holds */
    float kept[LOOKUP_MAX_NGRAM + 1];
    int rounds[LOOKUP_MAX_NGRAM + 1];
    int last_n;                 /* the match length the last proposal used, 0 = none */
    int32_t *text;              /* [n_prompt + max_new] the prompt, then the output as accepted */
    int len, n_prompt, indexed; /* n-grams ending before `indexed` are in the table */
    LookupSlot *slot;           /* [mask + 1] open addressing, linear probing */
    uint32_t mask;
    float rate; /* oracle: right at each depth with this probability */
    const int32_t *oracle;
} Lookup;

static uint32_t ngram_hash(const int32_t *g, int n) {
    return (uint32_t)XXH3_64bits_withSeed(g, sizeof(int32_t) * n, n);
}

/* the slot holding text[end-n+1 .. end]'s n-gram, or the empty one where it would go */
static LookupSlot *find(Lookup *lk, int end, int n, uint32_t h) {
    const int32_t *g = lk->text + end - n + 1;
    for (uint32_t i = h & lk->mask;; i = (i + 1) & lk->mask) {
        LookupSlot *s = &lk->slot[i];
        if (!s->n || (s->hash == h && s->n == n && !memcmp(lk->text + s->end - n + 1, g, sizeof(int32_t) * n)))
            return s;
    }
}

/* the n-grams ending at e, each now last seen there */
static void index_end(Lookup *lk, int e) {
    for (int n = 1; n <= lk->ngram_max && n <= e + 1; n++) {
        uint32_t h = ngram_hash(lk->text + e - n + 1, n);
        LookupSlot *s = find(lk, e, n, h);
        *s = (LookupSlot){h, n, e};
    }
}

/* the text catches up with the output: new tokens, and the n-grams that now have a
   continuation */
static void lookup_sync(Lookup *lk, const DecodeCtx *d) {
    for (; lk->len < lk->n_prompt + d->n_out; lk->len++) lk->text[lk->len] = d->out[lk->len - lk->n_prompt];
    for (; lk->indexed < lk->len - 1; lk->indexed++) index_end(lk, lk->indexed);
}

/* the chain after the longest earlier occurrence of the tail, up to k tokens into
   out[]: as long as 1 + 1.5 × the drafts that matches of its length kept on average
   (longer matches are surer); returns how many, 0 = no match */
static int lookup(Lookup *lk, int k, int32_t *out) {
    int last = lk->len - 1;
    lk->last_n = 0;
    for (int n = lk->ngram_max < lk->len ? lk->ngram_max : lk->len; n >= 1; n--) {
        LookupSlot *s = find(lk, last, n, ngram_hash(lk->text + last - n + 1, n));
        if (!s->n) continue;
        int e = s->end, period = last - e, want = 1 + (int)(1.5f * lk->kept[n] / lk->rounds[n] + 0.5f);
        if (k > want) k = want;
        for (int j = 0; j < k; j++) out[j] = e + 1 + j <= last ? lk->text[e + 1 + j] : out[j - period];
        lk->last_n = n;
        return k;
    }
    return 0;
}

static int lookup_propose(Drafter *dr, DecodeCtx *d, DraftTree *t, int max_nodes, int max_depth) {
    Lookup *lk = dr->self;
    int32_t chain[LOOKUP_MAX_DRAFT];
    int k = lk->draft_max;
    if (k > max_nodes - 1) k = max_nodes - 1;
    if (k > max_depth) k = max_depth;
    if (lk->oracle) { /* depth j+1's right token is oracle[n_out + j]; a wrong one is the next id */
        int V = d->m->c.vocab_size;
        for (int j = 0; j < k; j++) {
            int right = lk->oracle[d->n_out + j] >= 0 ? lk->oracle[d->n_out + j] : 0;
            chain[j] = sampler_uniform(d->sampler) < lk->rate ? right : (right + 1) % V;
        }
    } else {
        lookup_sync(lk, d);
        k = lookup(lk, k, chain);
    }
    for (int j = 0; j < k; j++) {
        t->parent[t->n] = t->n - 1;
        t->token[t->n] = chain[j];
        t->sampled[t->n++] = 0;
    }
    return 0;
}

static int lookup_accepted(Drafter *dr, DecodeCtx *d, const DraftTree *t, const int *path, int n_path, int next,
                           const float *hidden, const int32_t *ids) {
    (void)d, (void)path, (void)next, (void)hidden, (void)ids;
    Lookup *lk = dr->self;
    if (lk->last_n && t->n > 1) {
        lk->kept[lk->last_n] += n_path - 1;
        lk->rounds[lk->last_n]++;
    }
    return 0;
}

static int lookup_start(Drafter *dr, DecodeCtx *d, const int32_t *prompt, int n_prompt, const float *hidden) {
    (void)hidden;
    Lookup *lk = dr->self;
    size_t cap = (size_t)n_prompt + d->max_new, slots = 16;
    while (slots < 2 * lk->ngram_max * cap) slots *= 2; /* load ≤ 1/2 */
    lk->text = pd_alloc(sizeof(int32_t) * cap);
    lk->slot = pd_alloc(sizeof(LookupSlot) * slots);
    if (!lk->text || !lk->slot) return -1;
    memset(lk->slot, 0, sizeof(LookupSlot) * slots);
    lk->mask = (uint32_t)slots - 1;
    memcpy(lk->text, prompt, sizeof(int32_t) * n_prompt);
    lk->len = lk->n_prompt = n_prompt;
    for (int n = 1; n <= LOOKUP_MAX_NGRAM; n++) lk->kept[n] = 1, lk->rounds[n] = 1;
    return 0;
}

static void lookup_free(Drafter *dr) {
    Lookup *lk = dr->self;
    if (!lk) return;
    free(lk->text);
    free(lk->slot);
    free(lk);
}

typedef struct {
    int ngram_max, draft_max;
} LookupOptions;

static const MethodOption lookup_options[] = {
    {"ngram-max", OPT_INT, 1, LOOKUP_MAX_NGRAM, "N", "3", "the longest n-gram looked up",
     offsetof(LookupOptions, ngram_max), 0, NULL},
    {"draft-max", OPT_INT, 1, LOOKUP_MAX_DRAFT, "K", "10", "drafts per round at most",
     offsetof(LookupOptions, draft_max), 0, NULL},
    DRAFTER_OPTIONS,
};

static int lookup_begin(DecodeCtx *d, const int32_t *prompt, int n_prompt, void **state) {
    static const LookupOptions lookup_none;
    const LookupOptions *o = d->mopt ? d->mopt : &lookup_none;
    const MethodShared *sh = &d->opt;
    Lookup *lk = pd_alloc(sizeof *lk);
    if (!lk) return -1;
    memset(lk, 0, sizeof *lk);
    lk->ngram_max = o->ngram_max ? o->ngram_max : LOOKUP_DEFAULT_NGRAM_MAX;
    lk->draft_max = o->draft_max ? o->draft_max : LOOKUP_DEFAULT_DRAFT_MAX;
    lk->rate = sh->oracle_rate;
    lk->oracle = sh->oracle_rate > 0 ? sh->oracle : NULL;
    Drafter dr = {lk, lookup_start, lookup_propose, lookup_accepted, lookup_free, 1, -1, NULL, 0};
    return drafter_begin(d, &dr, prompt, n_prompt, state);
}

const DecodeMethod method_prompt_lookup = {.name = "prompt-lookup",
                                           .summary = "drafts what followed the text's tail where it occurred before",
                                           .options = lookup_options,
                                           .n_options = sizeof lookup_options / sizeof lookup_options[0],
                                           .options_size = sizeof(LookupOptions),
                                           .samples = 1,
                                           .oracle = 1,
                                           .begin = lookup_begin,
                                           .step = drafter_step,
                                           .finish = drafter_finish};
