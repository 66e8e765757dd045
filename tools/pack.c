/* pack — a model, its tokenizer and its head sets in one file.
   bin/pack -m MODEL HEADS... -o BUNDLE     (any of them "-" = stdin, once; -o - = stdout)
   bin/pack --list FILE                     what a bundle (or any paradec file) holds
   bin/decode -m BUNDLE --method adadecode|self-speculative|medusa then finds its heads
   inside. Heads trained for another model are refused, both digests named. */
#include "heads/bundle.h"
#include "tool.h"

#define USAGE "-m MODEL HEADS... -o BUNDLE | --list FILE"
#define MEMORY                                                                                                         \
    "memory: about the model file and every heads file, held whole (a .zst one decompressed; a plain one\n"            \
    "        mapped); the bundle is written from them as it is compressed.\n"

int main(int argc, char **argv) {
    tool_name = "pack";
    const char *model = NULL, *out = NULL, *list = NULL, *heads[256];
    int stdin_uses = 0;
    Flag t[] = {
        {"-m, --model", "MODEL", "required", "the model file; - is stdin", F_STR(&model)},
        {"-o, --output", "BUNDLE", "required", "the bundle to write; - is stdout", F_STR(&out)},
        MODEL_FLAGS{"--list", "FILE", NULL, "say what a bundle (or any paradec file) holds, and stop", F_STR(&list)},
    };
    int n = flags_parse(t, N_FLAGS(t), argc, argv, heads, 256, USAGE, MEMORY);
    if (list) {
        if (model || out || n) die("--list: only the file to list, with nothing to pack");
        if (bundle_list(list, stdout)) die_lib();
        return 0;
    }
    if (!model) usage("-m MODEL");
    if (!out) usage("-o BUNDLE");
    stdin_uses = !strcmp(model, "-");
    for (int i = 0; i < n; i++) stdin_uses += !strcmp(heads[i], "-");
    if (stdin_uses > 1) die("only one input can be stdin (\"-\")");
    if (bundle_write(out, model, heads, n)) die_lib();
    fprintf(stderr, "pack: %s + %d head set%s → %s\n", model, n, n == 1 ? "" : "s", out);
    return 0;
}
