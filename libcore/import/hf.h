/* hf.h — Hugging Face checkpoint directories, in and out. */
#ifndef PD_HF_H
#define PD_HF_H
#include "model/checkpoint.h"

/* a Hugging Face directory: config.json + model.safetensors (F32) */
int hf_write_dir(const Checkpoint *ck, const char *dir);
/* and back, any Hugging Face Llama/Mistral/Qwen2 directory: config.json, model.safetensors
   or shards with model.safetensors.index.json (F32/F16/BF16), tokenizer.json (kind
   "hf-json") or tokenizer.bin (llama2c), tokenizer_config.json's chat_template.
   Unsupported architectures and features are refused by name. */
int hf_read_dir(Checkpoint *ck, const char *dir);
/* the config.json part of it, from the JSON text in memory (`what` names it in errors) */
int hf_config_parse(Config *c, const void *json, size_t n, const char *what);

#endif
