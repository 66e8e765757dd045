/* convert — import a checkpoint into a paradec model file.
   bin/convert SRC [--tokenizer TOK] [--dtype f32|bf16] -o OUT
   SRC: a llama2.c .bin checkpoint (legacy or version 1). */
#include "checkpoint.h"
#include "tool.h"

#define USAGE "SRC --tokenizer TOK [--dtype f32|bf16] -o OUT   (SRC: llama2.c .bin; '-o -' writes to stdout)"

int main(int argc, char **argv) {
    tool_name = "convert";
    const char *src = NULL, *tok = NULL, *out = NULL, *dtype = "f32";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokenizer")) tok = arg_next(argc, argv, &i);
        else if (!strcmp(argv[i], "-o")) out = arg_next(argc, argv, &i);
        else if (!strcmp(argv[i], "--dtype")) dtype = arg_next(argc, argv, &i);
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) usage(USAGE);
        else if (argv[i][0] == '-' && argv[i][1]) die("unknown flag %s (usage: convert %s)", argv[i], USAGE);
        else if (!src) src = argv[i];
        else die("more than one source: %s and %s", src, argv[i]);
    }
    if (!src || !out) usage(USAGE);
    if (!tok) die("%s: --tokenizer is needed (a llama2.c tokenizer.bin)", src);
    DType dt = !strcmp(dtype, "f32") ? DT_F32 : !strcmp(dtype, "bf16") ? DT_BF16 : (DType)-1;
    if ((int)dt < 0) die("--dtype: '%s' is not f32 or bf16", dtype);
    Checkpoint ck;
    if (llama2c_read(&ck, src) || ck_set_tokenizer(&ck, tok) || ck_write_model(&ck, out, dt)) die_lib();
    fprintf(stderr, "convert: %s → %s (%d layers, dim %d, vocab %d, %s)\n", src, out, ck.c.n_layers,
            ck.c.dim, ck.c.vocab_size, dtype);
    ck_free(&ck);
    return 0;
}
