/* test_attention — k_attention against a slow double-precision softmax reference, and
   batch invariance of the kernel itself. A token's output must be bit-identical
   whether its keys are all committed slots, partly this call's contiguous slots, or
   partly lone slots scattered through the blocks (a tree's ancestors), and whether it
   is computed alone or among other tokens, on 1 or 2 threads. Shapes reach every
   path: head sizes below, at and above a vector, GQA groups of 1 to 12 (12 goes in two
   parts), and a block size that is not a multiple of 16 (the scalar path).
   Every shape runs on an f32, a bf16 and a q8_0 cache, written by k_kv_write_typed:
   the stored elements are checked against the rounding rule (bf16: the nearer of the
   two bf16 neighbours, ties to the even one; q8_0: d = amax / 127, |x - d q| ≤ d / 2 (+ the float division's
   half ulp of x / d ≤ 127: 2^-17 d),
   the largest |q| 127), and the output against the double reference on the elements
   dequantized here. Every fourth token sees up to 600 keys: FlashDecoding's chunks,
   the same bits with the kernel's own room for them (alone) and the caller's (batch). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "check.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static unsigned urand(unsigned n) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (unsigned)((rng >> 33) % n);
}
static float frand(void) { return (float)urand(1u << 24) / (1u << 23) - 1.0f; }

enum { MAX_KEYS = 600, SLOTS = 6 * MAX_KEYS, MAX_CASES = 8 }; /* past ATT_SPLIT: FlashDecoding's chunks */

typedef struct {
    int n_heads, n_kv, hd, bs;
    int n_blocks, table[SLOTS];
    KVType type;
    void *k, *v;    /* [n_blocks][kv_dim][bs] elements of type */
    float *ks, *vs; /* q8_0: [n_blocks][n_kv][bs] */
    int rule_bad;   /* stored elements that break the rounding rule */
} Cache;

static float bits_f32(uint32_t w) {
    float f;
    memcpy(&f, &w, sizeof f);
    return f;
}

/* element d of slot as this test reads the storage: widened, or scale × integer */
static float stored(const Cache *c, int val, int slot, int d) {
    size_t b = (size_t)c->table[slot / c->bs] * c->n_kv * c->hd * c->bs + (size_t)d * c->bs + slot % c->bs;
    const void *x = val ? c->v : c->k;
    if (c->type == KV_F32) return ((const float *)x)[b];
    if (c->type == KV_BF16) return bits_f32((uint32_t)((const uint16_t *)x)[b] << 16);
    size_t sb = (size_t)c->table[slot / c->bs] * c->n_kv * c->bs + (size_t)(d / c->hd) * c->bs + slot % c->bs;
    return (val ? c->vs : c->ks)[sb] * (float)((const int8_t *)x)[b];
}

/* does the stored x follow the rule? */
static int rule_ok(const Cache *c, int val, int slot, const float *x, int d) {
    if (c->type == KV_F32) return stored(c, val, slot, d) == x[d];
    if (c->type == KV_BF16) {
        uint32_t w;
        memcpy(&w, &x[d], sizeof w);
        double lo = bits_f32(w & 0xffff0000u), hi = bits_f32((w & 0xffff0000u) + 0x10000u), y = stored(c, val, slot, d);
        double dl = fabs(x[d] - lo), dh = fabs(hi - x[d]);
        int even_lo = !(w & 0x10000u);
        return dl < dh ? y == lo : dh < dl ? y == hi : y == (even_lo ? lo : hi);
    }
    const float *h = x + d / c->hd * c->hd;
    float amax = 0;
    for (int i = 0; i < c->hd; i++) amax = fabsf(h[i]) > amax ? fabsf(h[i]) : amax;
    size_t b = (size_t)c->table[slot / c->bs] * c->n_kv * c->hd * c->bs + (size_t)d * c->bs + slot % c->bs;
    size_t sb = (size_t)c->table[slot / c->bs] * c->n_kv * c->bs + (size_t)(d / c->hd) * c->bs + slot % c->bs;
    float sc = (val ? c->vs : c->ks)[sb];
    int q = ((const int8_t *)(val ? c->v : c->k))[b];
    int top = 0; /* the head's largest |q| */
    for (int i = 0; i < c->hd; i++) {
        int qi = ((const int8_t *)(val ? c->v : c->k))[b - (size_t)(d % c->hd) * c->bs + (size_t)i * c->bs];
        top = abs(qi) > top ? abs(qi) : top;
    }
    return sc == amax / 127.0f && fabs((double)x[d] - (double)sc * q) <= (0.5 + 0x1p-16) * sc && top == 127;
}

static void put(Cache *c, int slot, const float *k, const float *v) {
    int kvd = c->n_kv * c->hd;
    float row[2 * 64 * 8];
    memcpy(row, k, sizeof(float) * kvd);
    memcpy(row + kvd, v, sizeof(float) * kvd);
    const int *tables[1] = {c->table};
    int32_t s = slot;
    k_kv_write_typed(c->type, c->k, c->v, c->ks, c->vs, (size_t)kvd * c->bs, (size_t)c->n_kv * c->bs, c->bs, c->n_kv,
                     c->hd, tables, &s, row, 0, (size_t)kvd, 1);
    for (int d = 0; d < kvd; d++) c->rule_bad += !rule_ok(c, 0, slot, k, d) + !rule_ok(c, 1, slot, v, d);
}

/* one token's view: keys 0..n_keys-1 in position order; its first n_ctx are slots
   0..n_ctx-1, the rest at slots extra[] */
typedef struct {
    int n_keys, n_ctx, n_extra, extra[MAX_KEYS];
    float *q, *out; /* [n_heads*hd] */
} View;

static void run(Cache *c, View *const *views, int n) {
    static int n_ctx[MAX_CASES], off[MAX_CASES + 1], extra[MAX_CASES * MAX_KEYS];
    static const int *tables[MAX_CASES];
    int qd = c->n_heads * c->hd;
    float *q = malloc(sizeof(float) * n * qd), *out = malloc(sizeof(float) * n * qd);
    off[0] = 0;
    for (int t = 0; t < n; t++) {
        memcpy(q + (size_t)t * qd, views[t]->q, sizeof(float) * qd);
        n_ctx[t] = views[t]->n_ctx;
        tables[t] = c->table;
        memcpy(extra + off[t], views[t]->extra, sizeof(int) * views[t]->n_extra);
        off[t + 1] = off[t] + views[t]->n_extra;
    }
    memset(out, 0xff, sizeof(float) * n * qd);
    int f32 = c->type == KV_F32;
    AttnArgs a = {n,
                  c->n_heads,
                  c->n_kv,
                  c->hd,
                  1.0f / sqrtf((float)c->hd),
                  q,
                  (size_t)qd,
                  out,
                  f32 ? c->k : NULL,
                  f32 ? c->v : NULL,
                  (size_t)c->n_kv * c->hd * c->bs,
                  c->bs,
                  tables,
                  n_ctx,
                  off,
                  extra,
                  c->type,
                  c->k,
                  c->v,
                  c->ks,
                  c->vs,
                  (size_t)c->n_kv * c->bs,
                  NULL,
                  0,
                  0};
    float *split = NULL; /* a batch gets the forward pass's room for the chunks, a token alone the kernel's own */
    if (n > 1) { /* in passes of 3 tokens */
        a.max_chunks = attn_chunks(MAX_KEYS), a.split_tokens = 3;
        a.split = split = malloc(sizeof(float) * 3 * c->n_heads * a.max_chunks * (c->hd + 2));
    }
    k_attention(&a);
    free(split);
    for (int t = 0; t < n; t++) memcpy(views[t]->out, out + (size_t)t * qd, sizeof(float) * qd);
    free(q), free(out);
}

static double reference_error(const Cache *c, float (*K)[64 * 8], float (*V)[64 * 8], const View *w) {
    int group = c->n_heads / c->n_kv;
    double worst = 0, s[MAX_KEYS];
    for (int h = 0; h < c->n_heads; h++) {
        int kh = h / group;
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < w->n_keys; j++) {
            s[j] = 0;
            for (int d = 0; d < c->hd; d++) s[j] += (double)w->q[h * c->hd + d] * K[j][kh * c->hd + d];
            s[j] /= sqrt((double)c->hd);
            mx = s[j] > mx ? s[j] : mx;
        }
        for (int j = 0; j < w->n_keys; j++) sum += s[j] = exp(s[j] - mx);
        for (int d = 0; d < c->hd; d++) {
            double ref = 0, mag = 0;
            for (int j = 0; j < w->n_keys; j++) {
                ref += s[j] / sum * V[j][kh * c->hd + d];
                mag += fabs(s[j] / sum * V[j][kh * c->hd + d]);
            }
            double err = fabs(w->out[h * c->hd + d] - ref) / (mag + 1e-30);
            if (!(err <= worst)) worst = err;
        }
    }
    return worst;
}

static void check_shape(int n_heads, int n_kv, int hd, int bs, KVType type) {
    Cache c = {n_heads, n_kv, hd, bs, SLOTS / bs + 1, {0}, type, NULL, NULL, NULL, NULL, 0};
    static const int elem[] = {4, 2, 1};
    int kvd = n_kv * hd, qd = n_heads * hd;
    for (int b = 0; b < c.n_blocks; b++) c.table[b] = b;
    for (int b = c.n_blocks - 1; b > 0; b--) { /* the blocks in a random order */
        int o = (int)urand((unsigned)b + 1), x = c.table[b];
        c.table[b] = c.table[o], c.table[o] = x;
    }
    c.k = calloc((size_t)c.n_blocks * kvd * bs, elem[type]);
    c.v = calloc((size_t)c.n_blocks * kvd * bs, elem[type]);
    if (type == KV_Q8_0) {
        c.ks = calloc((size_t)c.n_blocks * n_kv * bs, sizeof(float));
        c.vs = calloc((size_t)c.n_blocks * n_kv * bs, sizeof(float));
    }
    static float K[MAX_KEYS][64 * 8], V[MAX_KEYS][64 * 8], KD[MAX_KEYS][64 * 8], VD[MAX_KEYS][64 * 8];
    View alone[MAX_CASES], split[MAX_CASES], lone[MAX_CASES];
    View *va[MAX_CASES], *vs[MAX_CASES], *vl[MAX_CASES];
    int differ = 0, cases = 0;
    double worst = 0;
    for (int round = 0; round < 6; round++) {
        /* MAX_CASES tokens of one sequence: token t sees keys 0..n_keys-1, held at
           slot = position; its split view takes the keys past n_ctx as this call's
           slots, its lone view reads copies of them from scattered slots */
        for (int j = 0; j < MAX_KEYS; j++) {
            for (int d = 0; d < kvd; d++) K[j][d] = frand(), V[j][d] = frand();
            put(&c, j, K[j], V[j]);
            for (int d = 0; d < kvd; d++) KD[j][d] = stored(&c, 0, j, d), VD[j][d] = stored(&c, 1, j, d);
        }
        int next_lone = 2 * MAX_KEYS;
        for (int t = 0; t < MAX_CASES; t++) {
            int nk = 1 + (int)urand(t % 4 == 3 ? MAX_KEYS : 70), nc = (int)urand((unsigned)nk + 1);
            View *w[3] = {&alone[t], &split[t], &lone[t]};
            for (int i = 0; i < 3; i++) {
                *w[i] = (View){nk, nc, nk - nc, {0}, malloc(sizeof(float) * qd), malloc(sizeof(float) * qd)};
                for (int d = 0; d < qd; d++) w[i]->q[d] = i ? w[0]->q[d] : frand() * 3;
            }
            alone[t].n_ctx = nk, alone[t].n_extra = 0;
            if (next_lone + 3 * (nk - nc) > SLOTS) next_lone = 2 * MAX_KEYS; /* earlier tokens' copies are done with */
            for (int j = nc; j < nk; j++) {
                split[t].extra[j - nc] = j;
                int s = j == nc && urand(2) ? j : next_lone + (int)urand(3); /* sometimes a run of one */
                next_lone = s >= next_lone ? s + 1 : next_lone;
                lone[t].extra[j - nc] = s;
                put(&c, s, K[j], V[j]);
            }
            va[t] = &alone[t], vs[t] = &split[t], vl[t] = &lone[t];
            run(&c, &va[t], 1), run(&c, &vs[t], 1), run(&c, &vl[t], 1);
            differ += memcmp(alone[t].out, split[t].out, sizeof(float) * qd) != 0;
            differ += memcmp(alone[t].out, lone[t].out, sizeof(float) * qd) != 0;
            double e = reference_error(&c, KD, VD, &alone[t]);
            worst = e > worst || e != e ? e : worst;
            cases += 2;
        }
        run(&c, vs, MAX_CASES); /* all split views in one call */
        for (int t = 0; t < MAX_CASES; t++, cases++)
            differ += memcmp(alone[t].out, split[t].out, sizeof(float) * qd) != 0;
        for (int t = 0; t < MAX_CASES; t++)
            for (int i = 0; i < 3; i++) {
                View *w = i == 0 ? &alone[t] : i == 1 ? &split[t] : &lone[t];
                free(w->q), free(w->out);
            }
    }
    static const char *const name[] = {"f32", "bf16", "q8_0"};
    CHECK(c.rule_bad == 0, "%s cache, heads %d/%d, hd %d: %d stored elements break the rounding rule", name[type],
          n_heads, n_kv, hd, c.rule_bad);
    CHECK(worst < 2e-6, "%s cache, heads %d/%d, hd %d, block %d: worst error %g of Σ|terms| against double softmax",
          name[type], n_heads, n_kv, hd, bs, worst);
    CHECK(differ == 0,
          "%s cache, heads %d/%d, hd %d, block %d, %d threads: %d of %d outputs differ from the all-committed one",
          name[type], n_heads, n_kv, hd, bs, k_threads(), differ, cases);
    free(c.k), free(c.v), free(c.ks), free(c.vs);
}

int main(void) {
    static const int shapes[][4] = {/* heads, kv heads, head size, block size */
                                    {8, 4, 8, 16},  {2, 2, 64, 16}, {4, 2, 64, 32}, {3, 1, 8, 16}, {8, 1, 16, 16},
                                    {12, 1, 4, 16}, {4, 4, 6, 16},  {2, 1, 2, 48},  {6, 3, 8, 5},  {8, 8, 64, 64}};
    for (int threads = 1; threads <= 2; threads++) {
        if (k_init(threads)) {
            CHECK(0, "k_init(%d)", threads);
            continue;
        }
        for (int t = 0; t < KV_COUNT; t++)
            for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
                check_shape(shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], (KVType)t);
    }
    return check_done("attention");
}
