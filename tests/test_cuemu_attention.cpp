/* test_cuemu_attention.cpp — kernels/cuda/attention.cu under cuemu against
   k_attention / k_attention_rel bit for bit: f32, bf16 and q8_0 caches (written by
   k_kv_write_typed), GQA groups below, at and past the CPU's 8-head units, odd head
   sizes, block sizes on and off the CPU's 16-key fast path, shuffled block tables,
   committed lengths from 0 to past one 256-key chunk, visible lists that continue the
   committed run and lone slots after it, both thread orders. */
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

extern "C" {
#include "backend.h"
}
#include "check.h"
#include "cuda/cuda_kernels.h"
#include "cuda/cuemu.h"
#include "rand.h"

struct Shape {
    int n_heads, n_kv, hd, bs;
};

/* one cache of every type with the same values, and tokens that read it */
struct Case {
    Shape s;
    int n_seq, bps; /* sequences, blocks per sequence */
    size_t block_stride, scale_stride;
    std::vector<float> kf, vf, ks, vs;
    std::vector<uint16_t> kb, vb;
    std::vector<int8_t> k8, v8;
    std::vector<std::vector<int>> rows; /* each sequence's block table */
    std::vector<const int *> table;     /* per token */
    std::vector<int> n_ctx, extra_off, extra_abs, extra_rel;
    std::vector<float> q;
    size_t q_stride;
    std::vector<float> split; /* attention's FlashDecoding chunks */
};

static void fill_cache(Case &c) {
    const Shape &s = c.s;
    int n_blocks = c.n_seq * c.bps, kv_dim = s.n_kv * s.hd;
    c.block_stride = (size_t)kv_dim * s.bs;
    c.scale_stride = (size_t)s.n_kv * s.bs;
    size_t elems = n_blocks * c.block_stride, scales = n_blocks * c.scale_stride;
    c.kf.assign(elems, 0), c.vf.assign(elems, 0), c.kb.assign(elems, 0), c.vb.assign(elems, 0);
    c.k8.assign(elems, 0), c.v8.assign(elems, 0), c.ks.assign(scales, 0), c.vs.assign(scales, 0);
    /* every slot of every block, one source row (key then value) each */
    int n = n_blocks * s.bs;
    std::vector<int> ids(n_blocks);
    std::vector<const int *> tab(n);
    std::vector<int32_t> slot(n);
    std::vector<float> src((size_t)n * 2 * kv_dim);
    for (int b = 0; b < n_blocks; b++) ids[b] = b;
    for (int i = 0; i < n; i++) tab[i] = &ids[i / s.bs], slot[i] = i % s.bs;
    for (float &x : src) x = frand(-2.0f, 2.0f);
    const int *const *t = tab.data();
    size_t st = 2 * (size_t)kv_dim;
    k_kv_write_typed(KV_F32, c.kf.data(), c.vf.data(), 0, 0, c.block_stride, c.scale_stride, s.bs, s.n_kv, s.hd, t,
                     slot.data(), src.data(), st, kv_dim, n);
    k_kv_write_typed(KV_BF16, c.kb.data(), c.vb.data(), 0, 0, c.block_stride, c.scale_stride, s.bs, s.n_kv, s.hd, t,
                     slot.data(), src.data(), st, kv_dim, n);
    k_kv_write_typed(KV_Q8_0, c.k8.data(), c.v8.data(), c.ks.data(), c.vs.data(), c.block_stride, c.scale_stride, s.bs,
                     s.n_kv, s.hd, t, slot.data(), src.data(), st, kv_dim, n);
    /* each sequence's blocks, shuffled over the pool */
    std::vector<int> perm(n_blocks);
    for (int b = 0; b < n_blocks; b++) perm[b] = b;
    for (int b = n_blocks - 1; b > 0; b--) std::swap(perm[b], perm[urand(b + 1)]);
    c.rows.assign(c.n_seq, std::vector<int>(c.bps));
    for (int q = 0; q < c.n_seq; q++)
        for (int b = 0; b < c.bps; b++) c.rows[q][b] = perm[q * c.bps + b];
}

/* n tokens with committed lengths up to max_ctx and visible lists: a run that continues
   the committed slots, then lone slots anywhere in the sequence's capacity */
static void make_tokens(Case &c, int n, int max_ctx, int min_ctx = 0) {
    int cap = c.bps * c.s.bs;
    c.table.assign(n, nullptr), c.n_ctx.assign(n, 0), c.extra_off.assign(n + 1, 0);
    c.extra_abs.clear(), c.extra_rel.clear();
    for (int t = 0; t < n; t++) {
        c.table[t] = c.rows[urand(c.n_seq)].data();
        int ctx = min_ctx + urand(max_ctx - min_ctx + 1);
        if (!min_ctx && urand(6) == 0) ctx = urand(3); /* empty and nearly empty contexts */
        int run = urand(4), lone = min_ctx ? 8 + urand(12) : urand(3) ? urand(12) : 0;
        if (ctx == 0 && t == 0) run = lone = 0; /* one token that sees nothing (0 · ∞: NaN on both) */
        if (ctx + run > cap) ctx = cap - run;
        c.n_ctx[t] = ctx;
        for (int i = 0; i < run; i++) c.extra_abs.push_back(ctx + i);
        for (int i = 0; i < lone; i++) c.extra_abs.push_back(urand(cap));
        c.extra_off[t + 1] = (int)c.extra_abs.size();
        for (int i = c.extra_off[t]; i < c.extra_off[t + 1]; i++) c.extra_rel.push_back(c.extra_abs[i] - ctx);
    }
    int qdim = c.s.n_heads * c.s.hd;
    c.q_stride = qdim + urand(2) * 3; /* rows packed or padded */
    c.q.assign((size_t)n * c.q_stride, 0);
    for (float &x : c.q) x = frand(-1.5f, 1.5f);
}

static AttnArgs args(Case &c, KVType kt, int rel, float *out, int n) {
    AttnArgs a;
    memset(&a, 0, sizeof a);
    a.n = n, a.n_heads = c.s.n_heads, a.n_kv = c.s.n_kv, a.hd = c.s.hd;
    a.scale = 1.0f / sqrtf((float)c.s.hd);
    a.q = c.q.data(), a.q_stride = c.q_stride, a.out = out;
    a.k = c.kf.data(), a.v = c.vf.data(), a.block_stride = c.block_stride, a.block_size = c.s.bs;
    a.table = c.table.data(), a.n_ctx = c.n_ctx.data(), a.extra_off = c.extra_off.data();
    a.extra = rel ? c.extra_rel.data() : c.extra_abs.data();
    a.kv_type = kt;
    if (kt == KV_BF16) a.kq = c.kb.data(), a.vq = c.vb.data();
    if (kt == KV_Q8_0) a.kq = c.k8.data(), a.vq = c.v8.data(), a.k_scale = c.ks.data(), a.v_scale = c.vs.data();
    a.scale_stride = c.scale_stride;
    int keys = 0; /* FlashDecoding's room: the chunks of the longest token */
    for (int t = 0; t < n; t++) keys = std::max(keys, c.n_ctx[t] + c.extra_off[t + 1] - c.extra_off[t]);
    a.max_chunks = attn_chunks(keys), a.split_tokens = std::max(1, n / 2); /* two passes */
    c.split.assign((size_t)a.split_tokens * a.n_heads * a.max_chunks * (a.hd + 2), 5.0f);
    a.split = c.split.data();
    return a;
}

static int compared;

static void run_case(const Shape &s, int n, int max_ctx, uint64_t seed, int min_ctx = 0) {
    Case c;
    c.s = s;
    test_rng = seed;
    c.n_seq = 3;
    c.bps = (max_ctx + 16) / s.bs + 2;
    fill_cache(c);
    make_tokens(c, n, max_ctx, min_ctx);
    size_t outn = (size_t)n * s.n_heads * s.hd;
    for (int kt = 0; kt < KV_COUNT; kt++)
        for (int rel = 0; rel < 2; rel++) {
            std::vector<float> want(outn, 7.0f);
            AttnArgs a = args(c, (KVType)kt, rel, want.data(), n);
            a.split = nullptr; /* the CPU's own room, the GPU the caller's */
            (rel ? k_attention_rel : k_attention)(&a);
            a.split = c.split.data();
            for (int order = 0; order < 2; order++) {
                std::vector<float> got(outn, 3.0f);
                a.out = got.data();
                cuemu_order = order;
                (rel ? cuda_attention_rel : cuda_attention)(&a);
                int bad = 0;
                for (size_t i = 0; i < outn; i++) bad += memcmp(&want[i], &got[i], sizeof(float)) != 0;
                CHECK(bad == 0, "%d of %zu differ: heads %d/%d hd %d bs %d n %d ctx<=%d type %d rel %d order %d", bad,
                      outn, s.n_heads, s.n_kv, s.hd, s.bs, n, max_ctx, kt, rel, order);
                compared++;
            }
        }
}

/* the comparison can fail: another scale gives other bits */
static void test_sensitive(void) {
    Case c;
    c.s = {4, 2, 16, 16};
    test_rng = 0xa77e0001;
    c.n_seq = 2, c.bps = 4;
    fill_cache(c);
    make_tokens(c, 3, 40);
    c.n_ctx[0] = 20; /* no token that sees nothing: NaN would compare equal by bits anyway */
    size_t outn = (size_t)3 * 4 * 16;
    std::vector<float> want(outn), got(outn);
    AttnArgs a = args(c, KV_F32, 0, want.data(), 3);
    k_attention(&a);
    a.out = got.data();
    a.scale *= 1.0001f;
    cuemu_order = 0;
    cuda_attention(&a);
    CHECK(memcmp(want.data(), got.data(), outn * sizeof(float)) != 0, "a changed scale must change the result");
}

int main(void) {
    static const Shape shapes[] = {
        {4, 1, 8, 16},  {4, 2, 16, 16}, {6, 3, 48, 32}, {2, 2, 64, 16}, {8, 1, 72, 16},
        {16, 2, 16, 7}, {12, 1, 8, 16}, {3, 3, 72, 5},  {2, 1, 48, 64},
    };
    static const int ns[] = {1, 2, 3, 5, 9};
    bool san = getenv("PARADEC_SAN") != nullptr; /* the sanitizer run (fibers under ASan are slow): fewer cases */
    for (int k = 0; k < (int)(sizeof shapes / sizeof *shapes); k++) {
        for (int x = 0; x < 5; x++)
            if (!san || x == 0 || x == 2 || (x == 4 && k % 3 == 1))
                run_case(shapes[k], ns[x], ns[x] <= 3 ? 40 : 120, 0x5eed0a00 + 97 * k + x);
        if (!san || k % 3 == 0) run_case(shapes[k], 4, 300, 0x5eed0b00 + k); /* past one 256-key chunk: recomputing */
    }
    run_case({4, 2, 16, 16}, san ? 11 : 17, 60, 0x5eed0c00); /* a bigger batch */
    /* lone keys on both sides of the chunk boundary at 256, and the committed ones ending near it */
    run_case({4, 2, 16, 16}, san ? 4 : 9, 262, 0x5eed0d00, 236);
    run_case({2, 1, 48, 7}, san ? 3 : 6, 256, 0x5eed0e00, 240);
    run_case({4, 2, 16, 16}, san ? 2 : 4, 700, 0x5eed0f00, 520); /* three FlashDecoding chunks */
    test_sensitive();
    printf("compared %d launches\n", compared);
    return check_done("cuemu_attention");
}
