/* model_open.h — a model as users name it with -m: a paradec model file, a llama.cpp GGUF
   file or a Hugging Face directory (the last two imported in memory). */
#ifndef PD_MODEL_OPEN_H
#define PD_MODEL_OPEN_H
#include "model/checkpoint.h"

typedef enum { MODEL_SRC_FILE, MODEL_SRC_GGUF, MODEL_SRC_HF } ModelSource;

/* what path holds, told by content: a directory with config.json is Hugging Face's, a
   file starting "GGUF" llama.cpp's, anything else (stdin, "-", too) a paradec file, left
   to model_load to judge; -1 + message for a directory without config.json */
int model_source(const char *path);
/* load it: a paradec file with model_load; a GGUF file or a Hugging Face directory
   imported (import/gguf_model.h, import/hf.h), written as an f32 model file (what
   convert writes by default, so the digest and the text are the converted file's) into
   memory (/dev/shm, else $TMPDIR, else /tmp), opened, unlinked at once and loaded, so
   nothing is left behind; errors and m->tf.path name `path` */
int model_open(Model *m, const char *path);
/* its two halves, for a tool that says something between them: the source (of that
   kind) read into ck, its tokenizer required; then ck (freed either way) loaded */
int model_import(Checkpoint *ck, const char *path, int kind);
int model_load_imported(Model *m, Checkpoint *ck, const char *path);

#endif
