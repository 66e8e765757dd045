/* llama2c.h — llama2.c checkpoints, in and out. */
#ifndef PD_LLAMA2C_H
#define PD_LLAMA2C_H
#include "model/checkpoint.h"

/* llama2.c checkpoints: legacy (7-int header, negative vocab = separate classifier)
   and version 1 ("ak42" magic); q/k rows are permuted into rotate-half order */
int llama2c_read(Checkpoint *ck, const char *path);
int llama2c_read_mem(Checkpoint *ck, const void *bytes, size_t n, const char *what);
/* and back, legacy format (what llama2.c's run.c and llama.cpp's converter read) */
int llama2c_write(const Checkpoint *ck, const char *path);

#endif
