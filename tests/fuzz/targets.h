/* targets.h — one entry point per parser that reads outside input, each taking the
   bytes of one input. libFuzzer runs them (tests/fuzz/main.c, make fuzz) and
   test_fuzz_regress replays the saved crashers through them with a plain build.
   Each returns 1 when the input was accepted, 0 when it was refused; a bug shows as a
   sanitizer report, or an abort() when what a parser accepted breaks its promises. */
#ifndef PD_FUZZ_TARGETS_H
#define PD_FUZZ_TARGETS_H
#include <stddef.h>
#include <stdint.h>

int fuzz_safetensors(const uint8_t *data, size_t n);     /* tf_parse: a plain file's bytes */
int fuzz_safetensors_zst(const uint8_t *data, size_t n); /* tf_load: plain or zstd */
int fuzz_llama2c(const uint8_t *data, size_t n);         /* llama2.c checkpoints */
int fuzz_tokenizer_bin(const uint8_t *data, size_t n);   /* llama2.c tokenizer.bin */
int fuzz_tokenizer_json(const uint8_t *data, size_t n);  /* Hugging Face tokenizer.json */
int fuzz_hf_config(const uint8_t *data, size_t n);       /* Hugging Face config.json */
int fuzz_gguf(const uint8_t *data, size_t n);            /* GGUF: metadata, tokenizer, model */
int fuzz_dataset(const uint8_t *data, size_t n);         /* training text: jsonl, plain, gzip */
int fuzz_recipe(const uint8_t *data, size_t n);          /* YAML recipes */
int fuzz_medusa_tree(const uint8_t *data, size_t n);     /* medusa --tree */
int fuzz_serve_request(const uint8_t *data, size_t n);   /* HTTP request bodies (bin/serve) */
int fuzz_serve_generate(const uint8_t *data, size_t n);  /* whole requests on a small model */

typedef struct {
    const char *name;
    int (*run)(const uint8_t *, size_t);
} FuzzTarget;

static const FuzzTarget FUZZ_TARGETS[] = {
    {"safetensors", fuzz_safetensors},
    {"safetensors_zst", fuzz_safetensors_zst},
    {"llama2c", fuzz_llama2c},
    {"tokenizer_bin", fuzz_tokenizer_bin},
    {"tokenizer_json", fuzz_tokenizer_json},
    {"hf_config", fuzz_hf_config},
    {"gguf", fuzz_gguf},
    {"dataset", fuzz_dataset},
    {"recipe", fuzz_recipe},
    {"medusa_tree", fuzz_medusa_tree},
    {"serve_request", fuzz_serve_request},
    {"serve_generate", fuzz_serve_generate},
};
#define N_FUZZ_TARGETS ((int)(sizeof FUZZ_TARGETS / sizeof *FUZZ_TARGETS))
#endif
