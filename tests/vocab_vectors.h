/* vocab_vectors.h — llama.cpp's tokenizer test vectors: a .inp file of cases joined by
   "\n__ggml_vocab_test__\n" (and ending with it), a .out file with one line of
   " id id ..." per case (no BOS). Each test decides what to check per case. */
#ifndef PD_VOCAB_VECTORS_H
#define PD_VOCAB_VECTORS_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *text; /* not NUL-terminated */
    size_t len;
    int32_t want[2048];
    int nw;
} VocabCase;

/* calls fn for every case, in order; returns the number of cases. *whole is 1 when
   both files were used up exactly (no text after the last separator, no extra line).
   out is modified (lines are cut). */
static inline int vocab_cases(char *inp, size_t ni, char *out, void (*fn)(void *ctx, const VocabCase *c, int i),
                              void *ctx, int *whole) {
    static const char sep[] = "\n__ggml_vocab_test__\n";
    size_t seplen = sizeof sep - 1;
    char *ip = inp, *op = out, *iend = inp + ni;
    int cases = 0;
    VocabCase c;
    *whole = 0;
    for (char *hit; (hit = memmem(ip, (size_t)(iend - ip), sep, seplen)); cases++) {
        char *nl = strchr(op, '\n');
        if (!nl) return cases; /* fewer lines than cases */
        *nl = 0;
        c.nw = 0;
        for (char *s = op, *e; c.nw < 2048; s = e) {
            long v = strtol(s, &e, 10);
            if (e == s) break;
            c.want[c.nw++] = (int32_t)v;
        }
        c.text = ip;
        c.len = (size_t)(hit - ip);
        fn(ctx, &c, cases);
        ip = hit + seplen;
        op = nl + 1;
    }
    *whole = ip == iend && *op == 0;
    return cases;
}
#endif
