/* test_limits — sizes read from a file are checked before anything is allocated: a
   header that claims 10^15 bytes (or elements, or entries) is refused with one line
   naming the input and what is wrong, never attempted. Every reader of outside input:
   safetensors (plain and zstd), llama2.c checkpoints, tokenizer.bin, GGUF,
   tokenizer.json, Hugging Face config.json, paradec.config. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "formats/gguf.h"
#include "formats/tensorfile.h"
#include "import/hf.h"
#include "import/llama2c.h"
#include "model/checkpoint.h"
#include "tokenizer/tokenizer.h"

#define HUGE_CLAIM 1000000000000000ull /* 10^15 */

/* refused, with one line naming `what` and saying `says` */
static void refused(int rc, const char *what, const char *says, const char *test) {
    const char *m = pd_errmsg();
    CHECK(rc == -1 && strstr(m, what) && strstr(m, says) && !strchr(m, '\n'), "%s: rc %d, message: %s", test, rc, m);
}

/* ---- byte builders ---- */

typedef struct {
    unsigned char p[4096];
    size_t n;
} Bytes;

static void put(Bytes *b, const void *src, size_t n) {
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u32(Bytes *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(Bytes *b, uint64_t v) { put(b, &v, 8); }
static void put_str(Bytes *b, const char *s) { put_u64(b, strlen(s)), put(b, s, strlen(s)); }

/* a safetensors file: the JSON header, then `data` bytes of zeros */
static Bytes safetensors(const char *header, size_t data) {
    Bytes b = {{0}, 0};
    put_u64(&b, strlen(header));
    put(&b, header, strlen(header));
    b.n += data;
    return b;
}

static void test_safetensors(void) {
    TensorFile tf;
    Bytes b = safetensors("{}", 0);
    uint64_t huge = HUGE_CLAIM;
    memcpy(b.p, &huge, 8);
    refused(tf_parse(&tf, b.p, b.n, "hdr.safetensors"), "hdr.safetensors",
            "header length 1000000000000000 exceeds the file", "safetensors header length");
    b = safetensors("{\"w\":{\"dtype\":\"F32\",\"shape\":[250000000000000],\"data_offsets\":[0,1000000000000000]}}",
                    16);
    refused(tf_parse(&tf, b.p, b.n, "big.safetensors"), "big.safetensors", "exceed the data section (16 bytes)",
            "safetensors tensor of 10^15 bytes");
    b = safetensors("{\"w\":{\"dtype\":\"F32\",\"shape\":[1000000000000000,1000000000000000],\"data_offsets\":[0,16]}}",
                    16);
    refused(tf_parse(&tf, b.p, b.n, "ovf.safetensors"), "ovf.safetensors", "overflows", "safetensors shape overflow");

    /* a zstd frame that says it holds 10^15 bytes: single frame header, an 8-byte
       content size, then one empty raw block */
    Bytes z = {{0}, 0};
    put_u32(&z, 0xFD2FB528u);
    unsigned char fhd[2] = {0xC0, 0x00}; /* 8-byte content size; a window descriptor */
    put(&z, fhd, 2);
    put_u64(&z, HUGE_CLAIM);
    unsigned char block[3] = {0x01, 0x00, 0x00}; /* last block, raw, 0 bytes */
    put(&z, block, 3);
    refused(tf_load(&tf, z.p, z.n, "huge.safetensors.zst"), "huge.safetensors.zst",
            "decompressed size 1000000000000000 exceeds 64 GiB", "zstd content size");
}

/* llama2.c headers whose shapes need ~2·10^15 bytes of weights, in a file of 28 or 256 */
static void test_llama2c(void) {
    Checkpoint ck;
    int32_t h[7] = {1 << 17, 1 << 17, 4096, 64, 64, 32000, 2048};
    Bytes b = {{0}, 0};
    put(&b, h, sizeof h);
    refused(llama2c_read_mem(&ck, b.p, b.n, "huge.bin"), "huge.bin", "the header's shapes need 1",
            "llama2.c legacy header");
    CHECK(strstr(pd_errmsg(), "bytes of weights, the file has 0"), "%s", pd_errmsg());
    double need = atof(strstr(pd_errmsg(), "need ") + 5);
    CHECK(need > 1e15, "the shapes claim %.3g bytes", need);
    b.n = 0;
    put_u32(&b, 0x616b3432u); /* "ak42", version 1 */
    put_u32(&b, 1);
    put(&b, h, sizeof h);
    b.n = 256;
    refused(llama2c_read_mem(&ck, b.p, b.n, "huge_v1.bin"), "huge_v1.bin", "the header's shapes need",
            "llama2.c v1 header");
    h[0] = 1 << 30; /* beyond any config: refused before the sizes are multiplied */
    b.n = 0;
    put(&b, h, sizeof h);
    refused(llama2c_read_mem(&ck, b.p, b.n, "dim.bin"), "dim.bin", "beyond what paradec handles", "llama2.c dim 2^30");
}

/* tokenizer.bin: an entry whose length is the largest an int32 says, a max_token_length
   of 10^9 */
static void test_tokenizer_bin(void) {
    Tokenizer *t;
    Bytes b = {{0}, 0};
    put_u32(&b, 16);
    float score = 0;
    put(&b, &score, 4);
    put_u32(&b, 0x7fffffff);
    put(&b, "abc", 3);
    refused(tok_load_llama2c(&t, b.p, b.n, "tok.bin"), "tok.bin",
            "entry 0 is truncated (length 2147483647, 3 bytes left)", "tokenizer.bin entry length");
    uint32_t mtl = 1000000000;
    memcpy(b.p, &mtl, 4);
    refused(tok_load_llama2c(&t, b.p, b.n, "mtl.bin"), "mtl.bin", "max_token_length 1000000000 is not plausible",
            "tokenizer.bin max_token_length");
}

/* GGUF: counts, string lengths, array lengths and tensor sizes of 10^15 */
static Bytes gguf_head(uint64_t n_tensors, uint64_t n_kv) {
    Bytes b = {{0}, 0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, n_tensors);
    put_u64(&b, n_kv);
    return b;
}

/* one key: an array of 10^15 elements of the given type */
static Bytes gguf_array_claim(const char *key, uint32_t type) {
    Bytes b = gguf_head(0, 1);
    put_str(&b, key);
    put_u32(&b, GGUF_ARRAY);
    put_u32(&b, type);
    put_u64(&b, HUGE_CLAIM);
    return b;
}

static void test_gguf(void) {
    Gguf g;
    Bytes b = gguf_head(0, HUGE_CLAIM);
    b.n += 64;
    refused(gguf_parse(&g, b.p, b.n, "kv.gguf"), "kv.gguf", "claims 1000000000000000 keys", "gguf key count");
    b = gguf_head(HUGE_CLAIM, 0);
    b.n += 64;
    refused(gguf_parse(&g, b.p, b.n, "t.gguf"), "t.gguf", "1000000000000000 tensors, more than the file can hold",
            "gguf tensor count");
    b = gguf_head(0, 1);
    put_str(&b, "general.name");
    put_u32(&b, GGUF_STRING);
    put_u64(&b, HUGE_CLAIM);
    refused(gguf_parse(&g, b.p, b.n, "s.gguf"), "s.gguf", "a string of 1000000000000000 bytes", "gguf string length");
    b = gguf_array_claim("k.arr", GGUF_U64);
    refused(gguf_parse(&g, b.p, b.n, "a.gguf"), "a.gguf", "truncated: key 'k.arr' needs 8000000000000000 bytes",
            "gguf array length");
    b = gguf_array_claim("tokenizer.ggml.tokens", GGUF_STRING);
    refused(gguf_parse(&g, b.p, b.n, "v.gguf"), "v.gguf", "1000000000000000 strings cannot fit", "gguf string array");
    b = gguf_head(1, 0);
    put_str(&b, "token_embd.weight");
    put_u32(&b, 2);
    put_u64(&b, 1000000);
    put_u64(&b, 250000000);
    put_u32(&b, GGML_F32);
    put_u64(&b, 0);
    b.n = (b.n + 31) / 32 * 32 + 64;
    refused(gguf_parse(&g, b.p, b.n, "w.gguf"), "w.gguf", "tensor 'token_embd.weight' (1000000000000000 bytes",
            "gguf tensor of 10^15 bytes");
}

/* text formats: ids, sizes and contexts of 10^15, and a model config's RoPE tables */
static void test_text(void) {
    Tokenizer *t;
    const char *tj = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":1000000000000000},\"merges\":[]}}";
    refused(tok_load_hf_json(&t, tj, strlen(tj), "tokenizer.json"), "tokenizer.json", "has no valid id",
            "tokenizer.json id");
    Config c;
    const char *hf = "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":1000000000000000,"
                     "\"intermediate_size\":64,\"num_hidden_layers\":1,\"num_attention_heads\":1,"
                     "\"vocab_size\":8,\"max_position_embeddings\":8}";
    refused(hf_config_parse(&c, hf, strlen(hf), "config.json"), "config.json",
            "'hidden_size' = 1000000000000000 is out of range", "config.json size");
    const char *pd = "{\"architecture\":\"llama\",\"hidden_size\":64,\"intermediate_size\":64,\"num_hidden_layers\":1,"
                     "\"num_attention_heads\":1,\"num_key_value_heads\":1,\"head_dim\":4096,\"vocab_size\":8,"
                     "\"max_position_embeddings\":4194304,\"rms_norm_eps\":1e-5,\"rope_theta\":10000,"
                     "\"tie_word_embeddings\":true}";
    refused(config_from_json(&c, pd, "m.safetensors"), "m.safetensors", "65536 MiB of RoPE tables",
            "paradec.config context × head_dim");
}

int main(void) {
    test_safetensors();
    test_llama2c();
    test_tokenizer_bin();
    test_gguf();
    test_text();
    return check_done("limits");
}
