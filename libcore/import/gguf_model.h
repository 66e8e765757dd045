/* gguf_model.h — a llama.cpp GGUF model as a Checkpoint (the file format itself is
   formats/gguf.h). */
#ifndef PD_GGUF_MODEL_H
#define PD_GGUF_MODEL_H
#include "model/checkpoint.h"

/* a llama.cpp GGUF model (architecture llama or qwen2; F32, F16, BF16, Q8_0, Q4_0, Q4_1
   dequantised to f32; q/k rows un-permuted from llama.cpp's Meta order); its tokenizer
   metadata becomes a vocabulary-only GGUF of kind "gguf" */
int gguf_read_model(Checkpoint *ck, const char *path);
int gguf_read_model_mem(Checkpoint *ck, const void *bytes, size_t n, const char *what);

#endif
