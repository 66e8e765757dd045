/* test_cuemu_ops.cpp — kernels/cuda's matmul.cu and ops.cu under cuemu against the CPU
   kernels bit for bit, in both thread orders: matmul (f32, bf16; one source and three
   stacked, odd sizes, token counts across the CPU's tile paths), rope, add, silu,
   add_rows, silu_mul_rows, the KV write (f32, bf16, q8_0) and the embedding lookup; the
   bf16 weights unpacked to the f32 layout (the cuBLAS path's input) against k_pack's;
   every GGUF block type on the file's blocks against k_matmul, and its embedding lookup. */
#include <cstdlib>
#include <cstring>
#include <vector>

#include "check.h"
#include "cuda/cuda_kernels.h"
#include "cuda/cuemu.h"
#include "rand.h"

static bool same(const void *a, const void *b, size_t n) { return !memcmp(a, b, n); }

static std::vector<float> randv(size_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (float &x : v) x = frand(lo, hi);
    return v;
}

static void test_matmul(int order) {
    static const int colss[] = {1, 7, 63, 64, 65, 129};
    static const int rowss[] = {1, 15, 17, 64, 100, 130};
    static const int ns[] = {1, 2, 3, 5, 8, 9, 17};
    for (WType wt : {WT_F32, WT_BF16})
        for (int cols : colss)
            for (int rows : rowss)
                for (int stacked = 0; stacked < 2; stacked++) {
                    int n = ns[(cols + rows + stacked) % 7], parts[3] = {rows, stacked ? rows / 2 + 1 : 0, 3};
                    int n_src = stacked ? 3 : 1, total = 0;
                    std::vector<std::vector<uint16_t>> src16(n_src);
                    std::vector<std::vector<float>> src32(n_src);
                    const void *src[3];
                    for (int s = 0; s < n_src; s++) {
                        total += parts[s];
                        src32[s] = randv((size_t)parts[s] * cols, -1, 1);
                        src16[s].resize(src32[s].size());
                        for (size_t i = 0; i < src32[s].size(); i++) {
                            uint32_t u;
                            memcpy(&u, &src32[s][i], 4);
                            src16[s][i] = (uint16_t)(u >> 16);
                        }
                        src[s] = wt == WT_F32 ? (const void *)src32[s].data() : (const void *)src16[s].data();
                    }
                    size_t bytes = k_packed_bytes(wt, total, cols);
                    void *packed = aligned_alloc(64, (bytes + 63) / 64 * 64);
                    k_pack(packed, wt, cols, n_src, src, parts);
                    std::vector<float> x = randv((size_t)n * cols, -2, 2), want((size_t)n * total), got(want.size());
                    k_matmul(want.data(), x.data(), packed, wt, n, cols, total);
                    cuda_matmul(got.data(), x.data(), packed, wt, n, cols, total);
                    CHECK(same(want.data(), got.data(), got.size() * 4), "matmul %s %dx%d (%d sources) n %d order %d",
                          wt == WT_F32 ? "f32" : "bf16", total, cols, n_src, n, order);
                    if (wt == WT_BF16) { /* the cuBLAS path's input: the f32 layout of the widened weights */
                        std::vector<std::vector<float>> wide(n_src);
                        const void *wsrc[3];
                        for (int s = 0; s < n_src; s++) {
                            for (uint16_t h : src16[s]) {
                                uint32_t u = (uint32_t)h << 16;
                                float f;
                                memcpy(&f, &u, 4);
                                wide[s].push_back(f);
                            }
                            wsrc[s] = wide[s].data();
                        }
                        size_t fb = k_packed_bytes(WT_F32, total, cols);
                        std::vector<float> f32((fb + 3) / 4), un(f32.size());
                        k_pack(f32.data(), WT_F32, cols, n_src, wsrc, parts);
                        int r0 = total > 64 ? 64 : 0; /* from the second 64-row block, when there is one */
                        size_t at = (size_t)r0 * cols, used = 0;
                        for (int rb = r0; rb < total; rb += 64)
                            used += (size_t)((total - rb + 15) / 16 < 4 ? (total - rb + 15) / 16 : 4) * 16 * cols;
                        cuda_unpack_bf16(un.data(), packed, cols, total, r0, total - r0);
                        CHECK(same(un.data(), f32.data() + at, used * 4), "unpack bf16 %dx%d from row %d order %d",
                              total, cols, r0, order);
                    }
                    free(packed);
                }
}

static void test_elementwise(int order) {
    for (int n : {1, 3, 9, 17}) {
        int heads = 5, hd = 12, half = hd / 2, stride = heads * hd + 3, seq = 40;
        std::vector<float> x = randv((size_t)n * stride, -3, 3), y = x, ct = randv((size_t)seq * half, -1, 1),
                           st = randv((size_t)seq * half, -1, 1);
        std::vector<int32_t> pos(n);
        for (int i = 0; i < n; i++) pos[i] = (int)urand(seq);
        k_rope(x.data(), stride, pos.data(), n, heads, hd, ct.data(), st.data());
        cuda_rope(y.data(), stride, pos.data(), n, heads, hd, ct.data(), st.data());
        CHECK(same(x.data(), y.data(), x.size() * 4), "rope n %d order %d", n, order);

        size_t m = (size_t)n * 100 + 7;
        std::vector<float> a = randv(m, -100, 100), b = randv(m, -3, 3), a2 = a;
        a[0] = 1e30f, a[1] = -1e30f, a[2] = 0, a[3] = 88.9f; /* past the exp clamp both ways */
        a2 = a;
        k_add(a.data(), b.data(), m), cuda_add(a2.data(), b.data(), m);
        CHECK(same(a.data(), a2.data(), m * 4), "add %zu order %d", m, order);
        std::vector<float> s1(m), s2(m);
        k_silu(s1.data(), a.data(), m), cuda_silu(s2.data(), a.data(), m);
        CHECK(same(s1.data(), s2.data(), m * 4), "silu %zu order %d", m, order);

        int cols = 37, rstride = 50;
        std::vector<float> r1 = randv((size_t)n * rstride, -1, 1), r2 = r1, bias = randv(cols, -1, 1);
        k_add_rows(r1.data(), rstride, bias.data(), n, cols), cuda_add_rows(r2.data(), rstride, bias.data(), n, cols);
        CHECK(same(r1.data(), r2.data(), r1.size() * 4), "add_rows n %d order %d", n, order);
        std::vector<float> gu = randv((size_t)n * 2 * cols, -20, 20), m1((size_t)n * cols), m2(m1.size());
        k_silu_mul_rows(m1.data(), gu.data(), n, cols), cuda_silu_mul_rows(m2.data(), gu.data(), n, cols);
        CHECK(same(m1.data(), m2.data(), m1.size() * 4), "silu_mul_rows n %d order %d", n, order);

        int vocab = 50, dim = 33;
        std::vector<float> emb = randv((size_t)vocab * dim, -1, 1), e1((size_t)n * dim), e2(e1.size());
        std::vector<uint16_t> emb16(emb.size());
        for (size_t i = 0; i < emb.size(); i++) emb16[i] = (uint16_t)(urand(1u << 16));
        std::vector<int32_t> ids(n);
        for (int i = 0; i < n; i++) ids[i] = (int)urand(vocab);
        for (WType wt : {WT_F32, WT_BF16}) {
            const void *w = wt == WT_F32 ? (const void *)emb.data() : (const void *)emb16.data();
            for (int i = 0; i < n; i++) k_row_to_f32(e1.data() + (size_t)i * dim, w, wt, (size_t)ids[i], dim);
            cuda_rows_to_f32(e2.data(), w, wt, ids.data(), n, dim);
            CHECK(same(e1.data(), e2.data(), e1.size() * 4), "rows_to_f32 %d n %d order %d", (int)wt, n, order);
        }
    }
}

/* n tokens' K/V rows into shuffled blocks of every cache type */
static void test_kv_write(int order) {
    int bs = 5, n_kv = 3, hd = 7, kvd = n_kv * hd, nblocks = 6, qd = 11;
    size_t block_stride = (size_t)kvd * bs, scale_stride = (size_t)n_kv * bs;
    for (KVType t : {KV_F32, KV_BF16, KV_Q8_0})
        for (int n : {1, 4, 9}) {
            size_t el = t == KV_F32 ? 4 : t == KV_BF16 ? 2 : 1, cells = block_stride * nblocks;
            std::vector<unsigned char> k1(cells * el, 0x5a), v1 = k1, k2 = k1, v2 = k1;
            std::vector<float> ks1(scale_stride * nblocks, 7), vs1 = ks1, ks2 = ks1, vs2 = ks1;
            int table_row[] = {4, 1, 5, 0, 2, 3};
            std::vector<const int *> table(n, table_row);
            std::vector<int32_t> slot(n);
            for (int i = 0; i < n; i++) slot[i] = 3 + 2 * i; /* across blocks */
            size_t src_stride = (size_t)qd + 2 * kvd;
            std::vector<float> src = randv((size_t)n * src_stride, -4, 4);
            src[qd] = 0, src[qd + 1] = 1e-40f;                  /* a zero and a subnormal */
            for (int d = 0; d < hd; d++) src[qd + kvd + d] = 0; /* a kv head of zeros: scale 0 */
            k_kv_write_typed(t, k1.data(), v1.data(), ks1.data(), vs1.data(), block_stride, scale_stride, bs, n_kv, hd,
                             table.data(), slot.data(), src.data() + qd, src_stride, kvd, n);
            cuda_kv_write_typed(t, k2.data(), v2.data(), ks2.data(), vs2.data(), block_stride, scale_stride, bs, n_kv,
                                hd, table.data(), slot.data(), src.data() + qd, src_stride, kvd, n);
            bool ok = k1 == k2 && v1 == v2 && same(ks1.data(), ks2.data(), ks1.size() * 4) &&
                      same(vs1.data(), vs2.data(), vs1.size() * 4);
            CHECK(ok, "kv_write type %d n %d order %d", (int)t, n, order);
        }
}

/* the block types on the file's blocks against k_matmul on k_pack_blocks' (random bytes,
   the f16 scales finite), stacked sources, cols not a multiple of the block included
   (short rows of the K types too), token counts across the CPU's tiles; and the
   embedding lookup's dequantizing */
static void test_blocks(int order) {
    static const int colss[] = {32, 64, 100, 160, 288, 600};
    static const int rowss[] = {1, 17, 64, 130};
    static const struct {
        WType t;
        int bytes, f16_at[2], elems; /* where the f16 scales are (-1: none), elements a block */
        const char *name;
    } T[] = {{WT_Q8_0, 34, {0, -1}, 32, "q8_0"},    {WT_Q4_0, 18, {0, -1}, 32, "q4_0"},
             {WT_Q4_1, 20, {0, 2}, 32, "q4_1"},     {WT_Q5_0, 22, {0, -1}, 32, "q5_0"},
             {WT_Q4_K, 144, {0, 2}, 256, "q4_k"},   {WT_Q5_K, 176, {0, 2}, 256, "q5_k"},
             {WT_Q6_K, 210, {208, -1}, 256, "q6_k"}};
    for (const auto &ty : T)
        for (int cols : colss)
            for (int rows : rowss)
                for (int stacked = 0; stacked < 2; stacked++) {
                    int nb = (cols + ty.elems - 1) / ty.elems, n = 1 + (cols + rows + stacked) % 9;
                    int parts[2] = {rows, 5};
                    int n_src = stacked ? 2 : 1, total = rows + (stacked ? 5 : 0), bb = ty.bytes;
                    size_t rb = (size_t)nb * bb;
                    std::vector<uint8_t> file((size_t)total * rb);
                    for (size_t b = 0; b < file.size() / bb; b++) {
                        for (int k = 0; k < bb; k++) file[b * bb + k] = (uint8_t)urand(256);
                        for (int h = 0; h < 2 && ty.f16_at[h] >= 0; h++) {
                            uint16_t f = (uint16_t)(urand(2) << 15 | (5 + urand(16)) << 10 | urand(1024));
                            memcpy(&file[b * bb + ty.f16_at[h]], &f, 2);
                        }
                    }
                    const void *src[2] = {file.data(), file.data() + (size_t)rows * rb};
                    WType types[2] = {ty.t, ty.t};
                    size_t bytes = k_packed_bytes_blocks(cols, n_src, parts, types);
                    void *packed = aligned_alloc(64, (bytes + 63) / 64 * 64);
                    k_pack_blocks(packed, cols, n_src, src, parts, types);
                    std::vector<float> x = randv((size_t)n * cols, -2, 2), want((size_t)n * total), got(want.size());
                    x[0] = 0; /* a zero and a block of zeros: scale 0 */
                    for (int c = 32; c < 64 && c < cols; c++) x[c] = 0;
                    k_matmul(want.data(), x.data(), packed, ty.t, n, cols, total);
                    cuda_matmul(got.data(), x.data(), file.data(), ty.t, n, cols, total);
                    CHECK(same(want.data(), got.data(), got.size() * 4), "matmul %s %dx%d (%d sources) n %d order %d",
                          ty.name, total, cols, n_src, n, order);
                    free(packed);
                    std::vector<int32_t> ids = {0, total - 1, total / 2};
                    std::vector<float> e1(3 * (size_t)cols), e2(e1.size());
                    for (int i = 0; i < 3; i++)
                        k_row_to_f32(e1.data() + (size_t)i * cols, file.data(), ty.t, ids[i], cols);
                    cuda_rows_to_f32(e2.data(), file.data(), ty.t, ids.data(), 3, cols);
                    CHECK(same(e1.data(), e2.data(), e1.size() * 4), "rows_to_f32 %s %dx%d order %d", ty.name, total,
                          cols, order);
                }
}

int main(void) {
    k_init(1);
    for (int order = 0; order < 2; order++) {
        cuemu_order = order;
        test_rng = 0x0b5e0024u + (uint32_t)order;
        test_matmul(order);
        test_elementwise(order);
        test_kv_write(order);
        test_blocks(order);
    }
    return check_done("cuemu_ops");
}
