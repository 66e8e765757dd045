/* pack — a model, its tokenizer and its head sets in one file.
   bin/pack -m MODEL HEADS... -o BUNDLE     (any of them "-" = stdin, once; -o - = stdout)
   bin/pack --list FILE                     what a bundle (or any paradec file) holds
   bin/decode -m BUNDLE --method adadecode|self-speculative|medusa then finds its heads
   inside. Heads trained for another model are refused, both digests named. */
#include "bundle.h"
#include "tool.h"

#define USAGE "-m MODEL HEADS... -o BUNDLE | --list FILE"
#define MEMORY "memory: about the model file and every heads file, held whole (a .zst one decompressed; a plain one\n" \
               "        mapped); the bundle is written from them as it is compressed.\n"

int main(int argc, char **argv) {
    tool_name = "pack";
    const char *model = NULL, *out = NULL, *list = NULL, *heads[256];
    int n = 0, stdin_uses = 0;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "-m")) model = arg_next(argc, argv, &i);
        else if (!strcmp(f, "--no-verify")) pd_verify_weights = 0;
        else if (!strcmp(f, "-o")) out = arg_next(argc, argv, &i);
        else if (!strcmp(f, "--list")) list = arg_next(argc, argv, &i);
        else if (!strcmp(f, "-h") || !strcmp(f, "--help")) help_exit(USAGE, MEMORY);
        else if (f[0] == '-' && f[1]) die("unknown flag %s (usage: pack %s)", f, USAGE);
        else if (n == 256) die("more than 256 head sets");
        else heads[n++] = f;
    }
    if (list) {
        if (model || out || n) usage(USAGE);
        if (bundle_list(list, stdout)) die_lib();
        return 0;
    }
    if (!model || !out) usage(USAGE);
    stdin_uses = !strcmp(model, "-");
    for (int i = 0; i < n; i++) stdin_uses += !strcmp(heads[i], "-");
    if (stdin_uses > 1) die("only one input can be stdin (\"-\")");
    if (bundle_write(out, model, heads, n)) die_lib();
    fprintf(stderr, "pack: %s + %d head set%s → %s\n", model, n, n == 1 ? "" : "s", out);
    return 0;
}
