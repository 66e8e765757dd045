/* test_prefix_cache — the KV cache's shared prefix blocks (kv_prefix_*). Every slot
   holds values that are a function of the tokens up to it (a hash of that prefix), as a
   real forward pass's keys and values are; so a slot that reads back anything else was
   attached from the wrong block, evicted while held, or overwritten through a shared
   block. The cases by hand (a hit, a miss after a different block, copy on write,
   eviction of the least recently used block and of a block's predecessor), then
   thousands of random operations checked against that rule and the pool's accounting:
   for every element type and on cuemu too. The states a cache may keep with published
   blocks follow the same rule: each a function of the prefix up to its slot. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fixture.h"
#include "model/kvcache.h"
#include "model/linear.h"

enum { LAYERS = 3, KVH = 2, HD = 4, KVD = KVH * HD, BS = 4, MAXLEN = 40, SD = 5 };

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static unsigned urand(unsigned n) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (unsigned)(rng % n);
}

/* what slot `n - 1` of a sequence whose tokens start tok[0..n) holds in layer l:
   integers in [-127, 127] with 127 first in each head, exact in every element type */
static void value(const int32_t *tok, int n, int l, float *k, float *v) {
    uint64_t h = 1469598103934665603ull + (uint64_t)l;
    for (int i = 0; i < n; i++) h = (h ^ (uint64_t)(tok[i] + 1)) * 1099511628211ull;
    for (int d = 0; d < KVD; d++) {
        h = h * 6364136223846793005ull + 1442695040888963407ull;
        k[d] = d % HD ? (float)((int)(h >> 33) % 255 - 127) : 127;
        v[d] = d % HD ? (float)((int)(h >> 41) % 255 - 127) : -127;
    }
}

/* the state after the last layer at slot n - 1 of tok[0..n): another layer's keys */
static void state_of(const int32_t *tok, int n, float *st) {
    float k[KVD], v[KVD];
    value(tok, n, LAYERS, k, v);
    memcpy(st, k, sizeof(float) * SD);
}

/* states[n][SD] of tok[0..n) */
static void states_of(const int32_t *tok, int n, float *states) {
    for (int i = 0; i < n; i++) state_of(tok, i + 1, states + (size_t)i * SD);
}

/* the states an attach gave, states[got][SD]: how many are not their prefix's */
static int wrong_states(const int32_t *tok, int got, const float *states) {
    float want[MAXLEN * SD];
    states_of(tok, got, want);
    return got ? memcmp(states, want, sizeof(float) * SD * got) != 0 : 0;
}

typedef struct {
    int seq, n; /* -1: not in use; slots written (every layer) */
    int32_t tok[MAXLEN];
} Seq;

static void write_slots(KVCache *kv, Seq *s, int from) {
    float k[KVD], v[KVD];
    for (int l = 0; l < LAYERS; l++) {
        for (int i = from; i < s->n; i++) value(s->tok, i + 1, l, k, v), kv_write(kv, s->seq, l, i, k, v);
        kv_set_len(kv, s->seq, l, s->n);
    }
}

/* slots that do not read back their prefix's values */
static int wrong_slots(const KVCache *kv, const Seq *s) {
    float k[KVD], v[KVD], K[KVD], V[KVD];
    int bad = 0;
    for (int l = 0; l < LAYERS; l++)
        for (int i = 0; i < s->n; i++) {
            value(s->tok, i + 1, l, K, V), kv_read(kv, s->seq, l, i, k, v);
            bad += memcmp(k, K, sizeof k) || memcmp(v, V, sizeof v);
        }
    return bad;
}

/* a new sequence of tokens tok[0..n): attached as far as the cache has it, the rest
   written; returns the slots attached, -1 when the pool is short */
static int seq_start_states(KVCache *kv, Seq *s, const int32_t *tok, int n, float *states) {
    memcpy(s->tok, tok, sizeof(int32_t) * n);
    s->seq = kv_seq_new(kv);
    int got = kv_prefix_attach(kv, s->seq, tok, n - 1, states);
    s->n = got;
    if (kv_reserve(kv, s->seq, n)) {
        kv_seq_free(kv, s->seq);
        s->seq = -1;
        return -1;
    }
    s->n = n;
    write_slots(kv, s, got);
    return got;
}

static int seq_start(KVCache *kv, Seq *s, const int32_t *tok, int n) { return seq_start_states(kv, s, tok, n, NULL); }

static void seq_end(KVCache *kv, Seq *s) {
    kv_seq_free(kv, s->seq);
    s->seq = -1;
}

/* every block is free, idle (published, held by none) or held; references add up; a
   published block is where a look-up by its hash finds it */
static int accounting_ok(const KVCache *kv, const Seq *ss, int n_ss) {
    int *refs = calloc(kv->n_blocks, sizeof(int)), held = 0, ok = 1;
    for (int i = 0; i < n_ss; i++)
        for (int b = 0; ss[i].seq >= 0 && b < kv->n_table[ss[i].seq]; b++) refs[kv_table(kv, ss[i].seq)[b]]++;
    for (int b = 0; b < kv->n_blocks; b++) {
        held += refs[b] > 0;
        ok &= refs[b] == kv->ref[b];
    }
    ok &= held + kv_blocks_available(kv) == kv->n_blocks;
    for (int b = 0; b < kv->n_blocks; b++) {
        int i = (int)(kv->hash[b] & (uint64_t)(kv->map_cap - 1));
        while (kv->hash[b] && kv->map[i] >= 0 && kv->map[i] != b) i = (i + 1) & (kv->map_cap - 1);
        ok &= !kv->hash[b] || kv->map[i] == b;
    }
    free(refs);
    return ok;
}

static void by_hand(KVType t) {
    Config c = {.n_layers = LAYERS, .n_kv_heads = KVH, .head_dim = HD, .n_heads = KVH, .seq_len = MAXLEN};
    KVCache kv;
    if (kv_init_typed(&kv, &c, 4, 10 * BS, BS, t)) {
        CHECK(0, "kv_init: %s", pd_errmsg());
        return;
    }
    int32_t a[14], b[14];
    for (int i = 0; i < 14; i++) a[i] = b[i] = 100 + i;
    b[9] = 7; /* b leaves a in its third block */
    Seq A, B, C;
    CHECK(seq_start(&kv, &A, a, 14) == 0, "an empty cache attaches nothing");
    kv_prefix_publish(&kv, A.seq, a, 14, NULL, 0);
    CHECK(seq_start(&kv, &B, a, 14) == 12, "the same tokens: three full blocks attached (the last token is computed)");
    CHECK(kv_table(&kv, B.seq)[2] == kv_table(&kv, A.seq)[2] && kv.ref[kv_table(&kv, A.seq)[0]] == 2, "shared");
    CHECK(seq_start(&kv, &C, b, 14) == 8, "a different third block: two attached");
    CHECK(wrong_slots(&kv, &A) + wrong_slots(&kv, &B) + wrong_slots(&kv, &C) == 0, "every slot its prefix's values");
    CHECK(kv.prefix_hits == 5 && kv.prefix_queried == 7, "hits %lld of %lld", (long long)kv.prefix_hits,
          (long long)kv.prefix_queried);

    /* copy on write: B cut inside a block it shares with A, then written with new tokens */
    int shared = kv_table(&kv, B.seq)[1];
    CHECK(kv_truncate(&kv, B.seq, 6) == 0 && kv_table(&kv, B.seq)[1] != shared, "B's cut block is its own copy");
    B.n = 6;
    CHECK(wrong_slots(&kv, &B) == 0, "the copy holds the slots before the cut");
    B.tok[6] = B.tok[7] = 3, B.n = 8;
    write_slots(&kv, &B, 6);
    CHECK(wrong_slots(&kv, &A) == 0 && wrong_slots(&kv, &B) == 0, "A's block untouched by B's writes");

    /* idle blocks stay published; the least recently used is taken first */
    Seq ss[3] = {A, B, C};
    seq_end(&kv, &A), seq_end(&kv, &B), seq_end(&kv, &C);
    ss[0].seq = ss[1].seq = ss[2].seq = -1;
    CHECK(kv.n_idle == 3 && kv_blocks_available(&kv) == 10 && accounting_ok(&kv, ss, 3), "idle %d", kv.n_idle);
    CHECK(seq_start(&kv, &A, a, 14) == 12, "published blocks outlive their sequences");
    seq_end(&kv, &A);
    /* 7 free blocks, then the idle ones from the least recently used: a's first block
       (released last by A's second run, after its two others) is the last to go */
    Seq D;
    int32_t d[36];
    for (int i = 0; i < 36; i++) d[i] = 300 + i;
    CHECK(seq_start(&kv, &D, d, 36) == 0 && kv.n_idle == 1, "nine blocks: one idle left (%d)", kv.n_idle);
    seq_end(&kv, &D);
    CHECK(seq_start(&kv, &A, a, 14) == 4, "a's first block survived; its second was taken");
    kv_prefix_publish(&kv, A.seq, a, 14, NULL, 0);
    CHECK(seq_start(&kv, &B, a, 14) == 12 && wrong_slots(&kv, &B) == 0, "republished");
    seq_end(&kv, &A), seq_end(&kv, &B);

    /* a block whose contents changed is a new block to its successors: E attaches a's
       first block, is cut inside it (the only holder: it leaves the cache) and writes
       the same tokens again; republished, it no longer leads to a's second block */
    Seq E;
    int32_t e[6] = {100, 101, 102, 103, 5, 6};
    CHECK(seq_start(&kv, &E, e, 6) == 4 && kv_truncate(&kv, E.seq, 2) == 0, "E on a's first block, cut");
    E.n = 4, write_slots(&kv, &E, 2);
    kv_prefix_publish(&kv, E.seq, e, 4, NULL, 0);
    seq_end(&kv, &E);
    CHECK(seq_start(&kv, &A, a, 14) == 4 && wrong_slots(&kv, &A) == 0, "only the first block found again");
    seq_end(&kv, &A);
    kv_free(&kv);
}

/* a cache that keeps states: an attach that wants them takes only blocks that have them */
static void states_by_hand(void) {
    Config c = {.n_layers = LAYERS, .n_kv_heads = KVH, .head_dim = HD, .n_heads = KVH, .seq_len = MAXLEN};
    KVCache kv;
    if (kv_init(&kv, &c, 4, 10 * BS, BS) || kv_prefix_states(&kv, SD)) {
        CHECK(0, "kv_init: %s", pd_errmsg());
        return;
    }
    int32_t a[14];
    float st[14 * SD], got[14 * SD];
    for (int i = 0; i < 14; i++) a[i] = 100 + i;
    states_of(a, 14, st);
    Seq A, B;
    seq_start(&kv, &A, a, 14);
    kv_prefix_publish(&kv, A.seq, a, 14, st, 6); /* states for a block and a half */
    CHECK(seq_start_states(&kv, &B, a, 14, got) == 4 && !wrong_states(a, 4, got), "states for the first block only");
    seq_end(&kv, &B);
    CHECK(seq_start(&kv, &B, a, 14) == 12, "without states wanted: all three blocks");
    seq_end(&kv, &B);
    kv_prefix_publish(&kv, A.seq, a, 14, st, 14); /* the published blocks get theirs */
    memset(got, 0, sizeof got);
    CHECK(seq_start_states(&kv, &B, a, 14, got) == 12 && !wrong_states(a, 12, got), "states for all three");
    seq_end(&kv, &A), seq_end(&kv, &B);
    kv_free(&kv);
    CHECK(kv_init(&kv, &c, 4, 10 * BS, BS) == 0, "kv_init: %s", pd_errmsg());
    seq_start(&kv, &A, a, 14);
    kv_prefix_publish(&kv, A.seq, a, 14, st, 14);
    CHECK(seq_start_states(&kv, &B, a, 14, got) == 0, "a cache without states gives none");
    kv_free(&kv);
}

static void random_ops(KVType t, int n_ops) {
    Config c = {.n_layers = LAYERS, .n_kv_heads = KVH, .head_dim = HD, .n_heads = KVH, .seq_len = MAXLEN};
    KVCache kv;
    if (kv_init_typed(&kv, &c, 4, 14 * BS, BS, t) || kv_prefix_states(&kv, SD)) {
        CHECK(0, "kv_init: %s", pd_errmsg());
        return;
    }
    float st[MAXLEN * SD];
    int bad_states = 0, stated = 0;
    Seq s[4] = {{.seq = -1}, {.seq = -1}, {.seq = -1}, {.seq = -1}};
    int32_t doc[3][MAXLEN];
    for (int d = 0; d < 3; d++)
        for (int i = 0; i < MAXLEN; i++) doc[d][i] = d == 2 && i < 12 ? doc[0][i] : 20 * d + i % 17;
    int bad = 0, books = 0, attached = 0;
    for (int op = 0; op < n_ops; op++) {
        Seq *x = &s[urand(4)];
        if (x->seq < 0) { /* a document's start, maybe with a token changed */
            int32_t tok[MAXLEN];
            int n = 1 + (int)urand(MAXLEN - 1);
            memcpy(tok, doc[urand(3)], sizeof tok);
            if (urand(3) == 0) tok[urand((unsigned)n)] = 99;
            int want = urand(2), got = seq_start_states(&kv, x, tok, n, want ? st : NULL);
            bad += got > n - 1 || (got > 0 && got % BS != 0);
            if (want && got > 0) bad_states += wrong_states(tok, got, st), stated++;
            attached += got > 0;
        } else if (urand(3) == 0) {
            seq_end(&kv, x);
        } else if (urand(2) == 0) {
            states_of(x->tok, x->n, st); /* states for some of the blocks, or none */
            kv_prefix_publish(&kv, x->seq, x->tok, x->n, urand(3) ? st : NULL, (int)urand((unsigned)x->n + 1));
        } else { /* cut, then continue with other tokens */
            int cut = (int)urand((unsigned)x->n + 1), n = cut + (int)urand((unsigned)(MAXLEN - cut));
            for (int i = cut; i < n; i++) x->tok[i] = (int32_t)urand(40);
            if (kv_truncate(&kv, x->seq, cut) || kv_reserve(&kv, x->seq, n)) {
                seq_end(&kv, x); /* the pool is short: the sequence goes, as a server's would */
                continue;
            }
            x->n = cut;
            bad += wrong_slots(&kv, x);
            x->n = n;
            write_slots(&kv, x, cut);
        }
        for (int i = 0; i < 4; i++) bad += s[i].seq >= 0 ? wrong_slots(&kv, &s[i]) : 0;
        books += !accounting_ok(&kv, s, 4);
    }
    CHECK(bad == 0, "%s: %d slots read back another prefix's values", kv_type_name(t), bad);
    CHECK(bad_states == 0 && stated > n_ops / 50, "%s: %d of %d attaches gave states not their prefix's",
          kv_type_name(t), bad_states, stated);
    CHECK(books == 0, "%s: the pool's accounting was off after %d operations", kv_type_name(t), books);
    CHECK(attached > n_ops / 20 && kv.prefix_hits > n_ops / 10, "%s: prefixes found (%d sequences, %lld blocks)",
          kv_type_name(t), attached, (long long)kv.prefix_hits);
    kv_free(&kv);
}

int main(void) {
    int n_ops = getenv("PARADEC_SAN") ? 1500 : 6000;
    for (int t = 0; t < KV_COUNT; t++) by_hand((KVType)t), random_ops((KVType)t, n_ops);
    states_by_hand();
    CHECK(model_device("cuemu") == 0, "%s", pd_errmsg());
    by_hand(KV_Q8_0);
    random_ops(KV_BF16, n_ops / 4);
    model_device("cpu");
    return check_done("prefix_cache");
}
