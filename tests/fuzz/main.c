/* main.c — one libFuzzer binary per target: built with -DFUZZ_TARGET=fuzz_NAME
   (make fuzz: build-fuzz/fuzz_NAME). */
#include "targets.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FUZZ_TARGET(data, size);
    return 0; /* (libFuzzer's only other answer, -1, keeps an input out of the corpus) */
}
