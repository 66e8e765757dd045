/* test_kvcache — the typed KV cache (f32, bf16, q8_0). What a slot reads back is its
   values rounded by the stated rule (bf16 within half a bf16 ulp, q8_0 within half a
   step d = amax / 127 of its head); kv_keep_path and kv_fork move the scales with the
   values, so a moved slot reads back bit for bit; the bytes a position takes are the
   formula's. Then, on the test model, a token's final hidden state is bit-identical
   whether its context came in one call or two, whether it is verified among siblings
   in a tree (then kept by kv_keep_path and continued), or batched with another
   sequence's token: for every type. The storage checks run on cuemu too. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fixture.h"
#include "model/forward.h"
#include "model/kvcache.h"
#include "model/linear.h"
#include "model/runner.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static unsigned urand(unsigned n) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (unsigned)((rng >> 33) % n);
}
static float frand(void) { return (float)urand(1u << 24) / (1u << 22) - 2.0f; }

static const char *const NAME[] = {"f32", "bf16", "q8_0"};

enum { LAYERS = 3, KVH = 2, HD = 8, KVD = KVH * HD, SLOTS = 40 };

/* is r what x rounds to, within the type's bound? amax: x's head's largest |x| */
static int close_enough(KVType t, float x, float r, float amax) {
    if (t == KV_F32) return r == x;
    if (t == KV_BF16) return fabs((double)x - r) <= ldexp(fabs(x), -8); /* half of 2^-7 ulps */
    double d = amax / 127.0f;
    return fabs((double)x - r) <= (0.5 + 0x1p-16) * d + ldexp(fabs(r), -24);
}

static void storage(KVType t, int bs) {
    Config c = {0};
    c.n_layers = LAYERS, c.n_kv_heads = KVH, c.head_dim = HD, c.n_heads = 2 * KVH, c.seq_len = 64;
    KVCache kv;
    if (kv_init_typed(&kv, &c, 3, 3 * 64, bs, t)) {
        CHECK(0, "kv_init_typed %s: %s", NAME[t], pd_errmsg());
        return;
    }
    static float X[LAYERS][SLOTS][2][KVD], R[LAYERS][SLOTS][2][KVD];
    int s = kv_seq_new(&kv), bad = 0;
    CHECK(s >= 0 && kv_reserve(&kv, s, SLOTS) == 0, "reserve");
    for (int l = 0; l < LAYERS; l++)
        for (int i = 0; i < SLOTS; i++) {
            for (int d = 0; d < KVD; d++) X[l][i][0][d] = frand(), X[l][i][1][d] = frand() * (1 + (float)i);
            if (i % 9 == 4)
                for (int d = 0; d < HD; d++) X[l][i][0][d] = 0; /* a head of zeros: scale 0 */
            kv_write(&kv, s, l, i, X[l][i][0], X[l][i][1]);
            kv_set_len(&kv, s, l, SLOTS);
        }
    for (int l = 0; l < LAYERS; l++)
        for (int i = 0; i < SLOTS; i++) {
            kv_read(&kv, s, l, i, R[l][i][0], R[l][i][1]);
            for (int w = 0; w < 2; w++)
                for (int d = 0; d < KVD; d++) {
                    float amax = 0;
                    for (int e = d / HD * HD; e < d / HD * HD + HD; e++)
                        amax = fabsf(X[l][i][w][e]) > amax ? fabsf(X[l][i][w][e]) : amax;
                    bad += !close_enough(t, X[l][i][w][d], R[l][i][w][d], amax);
                }
        }
    CHECK(bad == 0, "%s, block %d: %d elements read back outside the rounding bound", NAME[t], bs, bad);

    int f = kv_fork(&kv, s, 22), moved = 0;
    CHECK(f >= 0, "kv_fork: %s", pd_errmsg());
    static const int path[] = {0, 2, 5, 6, 11};
    CHECK(kv_keep_path(&kv, s, 20, path, 5) == 0, "kv_keep_path: %s", pd_errmsg());
    float k[KVD], v[KVD];
    for (int l = 0; l < LAYERS; l++) {
        CHECK(kv_len(&kv, s, l) == 25 && (f < 0 || kv_len(&kv, f, l) == 22), "lengths after the moves");
        for (int i = 0; i < 25; i++) {
            int from = i < 20 ? i : 20 + path[i - 20];
            kv_read(&kv, s, l, i, k, v);
            moved += memcmp(k, R[l][from][0], sizeof k) != 0 || memcmp(v, R[l][from][1], sizeof v) != 0;
        }
        for (int i = 0; f >= 0 && i < 22; i++) {
            kv_read(&kv, f, l, i, k, v);
            moved += memcmp(k, R[l][i][0], sizeof k) != 0 || memcmp(v, R[l][i][1], sizeof v) != 0;
        }
    }
    CHECK(moved == 0, "%s, block %d: %d slots differ after kv_keep_path / kv_fork", NAME[t], bs, moved);
    kv_free(&kv);
}

/* the last token's final hidden state in each of the checks, per type */
static void forward_invariance(const Model *m, KVType t) {
    const Config *c = &m->c;
    KVCache kv;
    Runner *r = runner_new(m);
    if (!r || kv_init_typed(&kv, c, 6, 6 * 64, 16, t)) {
        CHECK(0, "%s: %s", NAME[t], pd_errmsg());
        if (r) runner_free(r);
        return;
    }
    int L = c->n_layers, dim = c->dim;
    enum { P = 30 };
    int32_t tok[P + 2], pos[P + 2];
    for (int i = 0; i < P + 2; i++) tok[i] = (int32_t)(1 + urand((unsigned)c->vocab_size - 1)), pos[i] = i;
    float *h = malloc(sizeof(float) * (P + 2) * dim), *ref = malloc(sizeof(float) * 2 * dim);
    int differ = 0;
    /* the reference: the prompt in one call, then token P */
    int s0 = kv_seq_new(&kv);
    int32_t sq[P];
    for (int i = 0; i < P; i++) sq[i] = s0;
    Batch b = {P, tok, sq, pos, NULL, NULL};
    CHECK(forward_layers(r, &kv, &b, 0, L, h) == 0, "%s", pd_errmsg());
    memcpy(ref, h + (size_t)(P - 1) * dim, sizeof(float) * dim);
    b = (Batch){1, tok + P, sq, pos + P, NULL, NULL};
    CHECK(forward_layers(r, &kv, &b, 0, L, h) == 0, "%s", pd_errmsg());
    memcpy(ref + dim, h, sizeof(float) * dim);

    /* the prompt in two calls */
    int s1 = kv_seq_new(&kv);
    int32_t sq1[P];
    for (int i = 0; i < P; i++) sq1[i] = s1;
    b = (Batch){P / 2 + 3, tok, sq1, pos, NULL, NULL};
    forward_layers(r, &kv, &b, 0, L, h);
    b = (Batch){P - (P / 2 + 3), tok + P / 2 + 3, sq1, pos + P / 2 + 3, NULL, NULL};
    forward_layers(r, &kv, &b, 0, L, h);
    differ += memcmp(h + (size_t)(P - P / 2 - 4) * dim, ref, sizeof(float) * dim) != 0;

    /* token P-1 verified among two siblings, the branch kept, then token P */
    int s2 = kv_seq_new(&kv);
    int32_t sq2[P];
    for (int i = 0; i < P; i++) sq2[i] = s2;
    b = (Batch){P - 1, tok, sq2, pos, NULL, NULL};
    forward_layers(r, &kv, &b, 0, L, h);
    int32_t tt[3] = {tok[P + 1], tok[P - 1], (tok[P - 1] + 7) % c->vocab_size}, tp[3] = {P - 1, P - 1, P - 1};
    int32_t par[3] = {-1, -1, -1};
    b = (Batch){3, tt, sq2, tp, par, NULL};
    forward_layers(r, &kv, &b, 0, L, h);
    differ += memcmp(h + dim, ref, sizeof(float) * dim) != 0;
    int keep[1] = {1};
    CHECK(kv_keep_path(&kv, s2, P - 1, keep, 1) == 0, "%s", pd_errmsg());
    b = (Batch){1, tok + P, sq2, pos + P, NULL, NULL};
    forward_layers(r, &kv, &b, 0, L, h);
    differ += memcmp(h, ref + dim, sizeof(float) * dim) != 0;

    /* token P batched with another sequence's token, on a fork of the reference */
    int s3 = kv_fork(&kv, s0, P), s4 = kv_seq_new(&kv);
    int32_t bt[2] = {tok[0], tok[P]}, bp[2] = {0, P}, bs[2] = {s4, s3};
    b = (Batch){2, bt, bs, bp, NULL, NULL};
    CHECK(s3 >= 0 && s4 >= 0 && forward_layers(r, &kv, &b, 0, L, h) == 0, "%s", pd_errmsg());
    differ += memcmp(h + dim, ref + dim, sizeof(float) * dim) != 0;
    CHECK(differ == 0, "%s cache: %d of 4 hidden states differ from the one-call chain", NAME[t], differ);
    free(h), free(ref);
    kv_free(&kv);
    runner_free(r);
}

int main(void) {
    for (int t = 0; t < KV_COUNT; t++)
        for (int bs = 5; bs <= 16; bs += 11) storage((KVType)t, bs);
    /* on cuemu, as on a GPU: device storage and block tables, moves by the CUDA kernel,
       the host's reads and writes through copies */
    CHECK(model_device("cuemu") == 0, "%s", pd_errmsg());
    for (int t = 0; t < KV_COUNT; t++) storage((KVType)t, 5);
    model_device("cpu");
    CHECK(kv_bytes_per_token_layer(KV_F32, 192, 3) == 1536 && kv_bytes_per_token_layer(KV_BF16, 192, 3) == 768 &&
              kv_bytes_per_token_layer(KV_Q8_0, 192, 3) == 408,
          "SmolLM2's bytes a position and layer: 2·192·4, 2·192·2, 2·(192 + 3·4)");
    CHECK(kv_type_parse("q4_0") < 0 && kv_type_parse("Q8_0") < 0 && kv_type_parse("bf16") == KV_BF16, "type names");
    Model m;
    if (k_init(2) || test_model_load(&m)) return check_done("kvcache");
    for (int t = 0; t < KV_COUNT; t++) forward_invariance(&m, (KVType)t);
    model_free(&m);
    return check_done("kvcache");
}
