/* convert — import a checkpoint into a paradec model file.
   bin/convert SRC [--tokenizer TOK] [--dtype TYPE] -o OUT
   SRC: a Hugging Face directory, a llama.cpp GGUF file, a llama2.c .bin checkpoint, or a
   paradec model file; TYPE f32, bf16, a GGUF block type (q8_0 q4_0 q4_1 q4_k q5_k q6_k), or
   keep (the default for GGUF and paradec sources: block tensors stay as they are).
   bin/convert MODEL --layers L --heads EXIT_HEADS [--dtype f32|bf16] -o DRAFT
   a draft model for --method speculative: MODEL's first L layers and its exit head at
   layer L folded into the lm_head (draftmodel.h; docs/speculative.md). */
#include <sys/stat.h>

#include "heads/draftmodel.h"
#include "import/gguf_model.h"
#include "import/hf.h"
#include "import/llama2c.h"
#include "model/checkpoint.h"
#include "tool.h"

#define USAGE                                                                                                          \
    "SRC [--tokenizer TOK] [--dtype TYPE] -o OUT\n"                                                                    \
    "       convert MODEL --layers L --heads EXIT_HEADS [--dtype f32|bf16] -o DRAFT   (a draft model)"

#define NOTES                                                                                                          \
    "SRC: a Hugging Face directory (config.json, model.safetensors or shards with\n"                                   \
    "     model.safetensors.index.json, tokenizer.json, tokenizer_config.json's chat template),\n"                     \
    "     a llama.cpp GGUF file (F32/F16/BF16, and Q8_0/Q4_0/Q4_1/Q5_0/Q4_K/Q5_K/Q6_K kept as\n"                       \
    "     blocks; its tokenizer inside), a paradec model file (.safetensors[.zst]), or a llama2.c .bin\n"              \
    "     checkpoint (needs --tokenizer); - reads stdin (GGUF or llama2.c).\n"                                         \
    "TYPE: f32, bf16, q8_0, q4_0, q4_1, q5_0, q4_k, q5_k, q6_k, or keep. Default: keep for GGUF and paradec\n"         \
    "     sources (block tensors stay exactly as they are, F16/BF16/F32 become F32), f32 for the others.\n"            \
    "     A block type quantizes every 2-d weight (ggml's reference rules, formats/quant.c; norm gains and\n"          \
    "     biases stay F32; a row that is not whole blocks is padded with zeros); blocks of another type\n"             \
    "     are dequantized, then quantized (a note says so). f32 or bf16 dequantizes blocks.\n"                         \
    "TOK: a llama2.c tokenizer.bin, a tokenizer.json (or .json.gz), or a GGUF file (its vocabulary);\n"                \
    "     it replaces the source's own.\n"                                                                             \
    "--layers L --heads EXIT_HEADS: MODEL (a paradec model file, f32 or bf16) becomes a draft model for\n"             \
    "     --method speculative: its first L layers, and the exit head at layer L (trained with\n"                      \
    "     distill-heads --norm 1) folded into an lm_head (docs/speculative.md).\n\n"                                   \
    "memory: about the source file (read whole for a llama2.c checkpoint, mapped for safetensors and\n"                \
    "        GGUF) + the model as f32 (4 bytes a parameter), block matrices kept as they are (a copy of\n"             \
    "        their bytes); with --dtype bf16 or a block type, the converted copy on top (2 bytes a\n"                  \
    "        parameter or the blocks; blocks of another type also pass through f32). A draft holds MODEL\n"            \
    "        as f32 and the exit heads.\n"

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* a directory is Hugging Face's; a file starting "GGUF" (or named .gguf) llama.cpp's;
   zstd, a .safetensors name or a JSON header after 8 bytes a paradec model; anything
   else llama2.c's. stdin is read whole and told apart by GGUF's magic. *is_model: a
   source whose block tensors are kept by default */
static int read_source(Checkpoint *ck, const char *src, int *keeps) {
    struct stat st;
    *keeps = 0;
    if (strcmp(src, "-") && !stat(src, &st) && S_ISDIR(st.st_mode)) return hf_read_dir(ck, src);
    if (strcmp(src, "-")) {
        unsigned char magic[9] = {0};
        FILE *f = fopen(src, "rb");
        if (f) {
            size_t got = fread(magic, 1, 9, f);
            fclose(f);
            *keeps = 1;
            if ((got >= 4 && !memcmp(magic, "GGUF", 4)) || ends_with(src, ".gguf")) return gguf_read_model(ck, src);
            int zst = got >= 4 && magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd;
            if (zst || (got == 9 && magic[8] == '{') || ends_with(src, ".safetensors"))
                return ck_read_model_blocks(ck, src);
            *keeps = 0;
        }
        return llama2c_read(ck, src);
    }
    char *bytes;
    size_t n;
    if (pd_read_file(src, &bytes, &n)) return -1;
    *keeps = n >= 4 && !memcmp(bytes, "GGUF", 4);
    int rc = *keeps ? gguf_read_model_mem(ck, bytes, n, "-") : llama2c_read_mem(ck, bytes, n, "-");
    free(bytes);
    return rc;
}

int main(int argc, char **argv) {
    tool_name = "convert";
    const char *src = NULL, *tok = NULL, *out = NULL, *dtype = NULL, *heads = NULL;
    int layers = 0;
    Flag t[] = {
        {"-o, --output", "OUT", "required", "the model file to write (.safetensors[.zst]); - is stdout", F_STR(&out)},
        {"--tokenizer", "TOK", "the source's", "the tokenizer (needed for a llama2.c checkpoint)", F_STR(&tok)},
        {"--dtype", "TYPE", "keep/f32",
         "the weights' type: f32, bf16, q8_0, q4_0, q4_1, q5_0, q4_k, q5_k, q6_k or keep", F_STR(&dtype)},
        MODEL_FLAGS{"--layers", "L", NULL, "a draft model: the source's first L layers (with --heads)",
                    F_INT(&layers, 1, 1 << 20)},
        {"--heads", "EXIT_HEADS", NULL, "a draft model: the exit head at layer L folded into its lm_head",
         F_STR(&heads)},
    };
    const char *pos[2];
    int n_pos = flags_parse(t, N_FLAGS(t), argc, argv, pos, 2, USAGE, NOTES);
    if (n_pos == 2) die("%s: a second source (%s is the first)", pos[1], pos[0]);
    src = n_pos ? pos[0] : NULL;
    if (!src) usage("SRC (the checkpoint)");
    if (!out) usage("-o OUT");
    int q = dtype ? dtype_parse_quant(dtype) : -1;
    DType dt = !dtype                   ? DT_KEEP
               : !strcmp(dtype, "f32")  ? DT_F32
               : !strcmp(dtype, "bf16") ? DT_BF16
               : !strcmp(dtype, "keep") ? DT_KEEP
               : q >= 0                 ? (DType)q
                                        : (DType)-1;
    if ((int)dt < 0) die("--dtype: '%s' is not f32, bf16, q8_0, q4_0, q4_1, q4_k, q5_k, q6_k or keep", dtype);
    double t0 = pd_now();
    if (heads || layers) { /* a draft model */
        if (!heads || !layers) die("a draft model needs both --layers L and --heads EXIT_HEADS");
        if (dt == DT_KEEP) dt = DT_F32;
        if (dt != DT_F32 && dt != DT_BF16) die("--dtype: a draft model is written f32 or bf16");
        if (!dtype) dtype = "f32";
        if (tok) die("--tokenizer: a draft model keeps its source's tokenizer");
        if (draft_from_head(src, heads, layers, out, dt)) die_lib();
        fprintf(stderr, "convert: %s → %s (draft: layers 0..%d and the exit head at layer %d, %s, %.1f s)\n", src, out,
                layers - 1, layers, dtype, pd_now() - t0);
        return 0;
    }
    Checkpoint ck;
    int keeps;
    if (read_source(&ck, src, &keeps)) die_lib();
    if (dt == DT_KEEP && !keeps && dtype) die("--dtype keep: %s holds no block types to keep; f32 or bf16", src);
    if (dt == DT_KEEP && !keeps) dt = DT_F32;
    if (!dtype) dtype = dt == DT_KEEP ? "keep" : "f32";
    for (int i = 0; i < ck.n; i++)
        if (ck.t[i].raw && dtype_is_quant(dt) && ck.t[i].dtype != dt) {
            fprintf(stderr, "convert: note: %s blocks (%s, ...) are dequantized, then quantized to %s\n",
                    dtype_name(ck.t[i].dtype), ck.t[i].name, dtype_name(dt));
            break;
        }
    if (tok && ck_set_tokenizer(&ck, tok)) die_lib();
    if (!ck.tok) die("%s: no tokenizer inside: --tokenizer is needed (tokenizer.bin, tokenizer.json or a GGUF)", src);
    if (ck_write_model(&ck, out, dt)) die_lib();
    fprintf(stderr, "convert: %s → %s (%d layers, dim %d, vocab %d, %s, tokenizer %s, %.1f s)\n", src, out,
            ck.c.n_layers, ck.c.dim, ck.c.vocab_size, dtype, ck.tok_kind, pd_now() - t0);
    ck_free(&ck);
    return 0;
}
