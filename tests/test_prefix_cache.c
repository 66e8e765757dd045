/* test_prefix_cache — the KV cache's shared prefix blocks (kv_prefix_*). Every slot
   holds values that are a function of the tokens up to it (a hash of that prefix), as a
   real forward pass's keys and values are; so a slot that reads back anything else was
   attached from the wrong block, evicted while held, or overwritten through a shared
   block. The cases by hand (a hit, a miss after a different block, copy on write,
   eviction of the least recently used block and of a block's predecessor), then
   thousands of random operations checked against that rule and the pool's accounting:
   for every element type and on cuemu too. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fixture.h"
#include "model/kvcache.h"
#include "model/linear.h"

enum { LAYERS = 3, KVH = 2, HD = 4, KVD = KVH * HD, BS = 4, MAXLEN = 40 };

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
static int seq_start(KVCache *kv, Seq *s, const int32_t *tok, int n) {
    memcpy(s->tok, tok, sizeof(int32_t) * n);
    s->seq = kv_seq_new(kv);
    int got = kv_prefix_attach(kv, s->seq, tok, n - 1);
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
    kv_prefix_publish(&kv, A.seq, a, 14);
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
    kv_prefix_publish(&kv, A.seq, a, 14);
    CHECK(seq_start(&kv, &B, a, 14) == 12 && wrong_slots(&kv, &B) == 0, "republished");
    seq_end(&kv, &A), seq_end(&kv, &B);

    /* a block whose contents changed is a new block to its successors: E attaches a's
       first block, is cut inside it (the only holder: it leaves the cache) and writes
       the same tokens again; republished, it no longer leads to a's second block */
    Seq E;
    int32_t e[6] = {100, 101, 102, 103, 5, 6};
    CHECK(seq_start(&kv, &E, e, 6) == 4 && kv_truncate(&kv, E.seq, 2) == 0, "E on a's first block, cut");
    E.n = 4, write_slots(&kv, &E, 2);
    kv_prefix_publish(&kv, E.seq, e, 4);
    seq_end(&kv, &E);
    CHECK(seq_start(&kv, &A, a, 14) == 4 && wrong_slots(&kv, &A) == 0, "only the first block found again");
    seq_end(&kv, &A);
    kv_free(&kv);
}

static void random_ops(KVType t, int n_ops) {
    Config c = {.n_layers = LAYERS, .n_kv_heads = KVH, .head_dim = HD, .n_heads = KVH, .seq_len = MAXLEN};
    KVCache kv;
    if (kv_init_typed(&kv, &c, 4, 14 * BS, BS, t)) {
        CHECK(0, "kv_init: %s", pd_errmsg());
        return;
    }
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
            int got = seq_start(&kv, x, tok, n);
            bad += got > n - 1 || (got > 0 && got % BS != 0);
            attached += got > 0;
        } else if (urand(3) == 0) {
            seq_end(&kv, x);
        } else if (urand(2) == 0) {
            kv_prefix_publish(&kv, x->seq, x->tok, x->n);
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
    CHECK(books == 0, "%s: the pool's accounting was off after %d operations", kv_type_name(t), books);
    CHECK(attached > n_ops / 20 && kv.prefix_hits > n_ops / 10, "%s: prefixes found (%d sequences, %lld blocks)",
          kv_type_name(t), attached, (long long)kv.prefix_hits);
    kv_free(&kv);
}

int main(void) {
    int n_ops = getenv("PARADEC_SAN") ? 1500 : 6000;
    for (int t = 0; t < KV_COUNT; t++) by_hand((KVType)t), random_ops((KVType)t, n_ops);
    CHECK(model_device("cuemu") == 0, "%s", pd_errmsg());
    by_hand(KV_Q8_0);
    random_ops(KV_BF16, n_ops / 4);
    model_device("cpu");
    return check_done("prefix_cache");
}
