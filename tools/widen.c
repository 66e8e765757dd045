/* widen — a small paradec model embedded function-preservingly in a big Llama shape:
   its greedy output is the small model's, its cost is the big shape's (DESIGN.md §7).
   bin/widen -m MODEL --preset NAME [--dtype f32|bf16] [--seed S] -o OUT
             [--llama2c OUT.bin] [--hf DIR] */
#include <unistd.h>

#include "tool.h"
#include "import/hf.h"
#include "import/llama2c.h"
#include "train/widen.h"

#define USAGE                                                                                                          \
    "-m MODEL --preset NAME [--dtype f32|bf16] [--seed S] -o OUT [--llama2c OUT.bin] [--hf DIR] [--heads HEADS "       \
    "--heads-out WIDE_HEADS]"

/* weights of a preset's shape (vocabulary left out: it is the model's) */
static double preset_params(const WidenPreset *p) {
    double D = p->dim, F = p->hidden_dim, Q = (double)p->n_heads * p->head_dim,
           KV = (double)p->n_kv_heads * p->head_dim;
    return p->n_layers * (2 * D + 2 * D * Q + 2 * D * KV + 3 * D * F) + D;
}

/* --help's notes: the presets, then what the flags do together */
static const char *notes(void) {
    static char b[8192];
    size_t n = snprintf(b, sizeof b,
                        "Embeds MODEL (e.g. stories260K) in a bigger Llama shape so that greedy output\n"
                        "stays the model's while every step costs what the big shape costs. Extra weights\n"
                        "are random (--seed) where they cannot reach the residual stream.\n\n"
                        "presets (dim, hidden, layers, heads, kv heads, head_dim; weights without the vocabulary):\n");
    for (int i = 0; i < widen_n_presets && n < sizeof b; i++) {
        const WidenPreset *p = &widen_presets[i];
        double k = preset_params(p);
        n += snprintf(b + n, sizeof b - n, "  %-9s %5d %6d %3d %3d %3d %4d  %6.0fM  f32 %5.2f GB, bf16 %5.2f GB  %s\n",
                      p->name, p->dim, p->hidden_dim, p->n_layers, p->n_heads, p->n_kv_heads, p->head_dim, k / 1e6,
                      k * 4 / 1e9, k * 2 / 1e9, p->about);
    }
    if (n < sizeof b)
        snprintf(b + n, sizeof b - n,
                 "\nmemory: about the output's size (the table) + MODEL as f32; with --llama2c or --hf the whole\n"
                 "        model is held in f32 (and a bf16 output besides), so write 8b as bf16 without them\n"
                 "        (~14 GB instead of ~42 GB).\n"
                 "Use a plain .safetensors name (not .zst) for big presets so decode can mmap it.\n"
                 "--llama2c writes the same model in llama2.c's legacy format (f32) for run.c and\n"
                 "llama.cpp; --hf DIR a Hugging Face directory (config.json, model.safetensors F32).\n"
                 "--heads HEADS --heads-out OUT carries exit or Medusa heads trained for MODEL over to the\n"
                 "wide model (the heads file's kind says which).\n");
    return b;
}

typedef struct {
    const char *model, *preset, *out, *llama2c, *hf, *heads, *heads_out;
    DType dt;
    uint64_t seed;
} Args;

static Args parse(int argc, char **argv) {
    Args a = {.dt = DT_F32, .seed = 1};
    const char *dtype = "f32";
    long long seed = 1;
    Flag t[] = {
        {"-m, --model", "MODEL", "required", "the small model", F_STR(&a.model)},
        {"--preset", "NAME", "required", "the big shape (below)", F_STR(&a.preset)},
        MODEL_FLAGS{"--dtype", "TYPE", "f32", "the weights' type: f32 or bf16", F_STR(&dtype)},
        {"-s, --seed", "S", "1", "the extra weights' seed", F_I64(&seed, 0, 1e19)},
        {"-o, --output", "OUT", "required", "the wide model to write; - is stdout", F_STR(&a.out)},
        {"--llama2c", "OUT.bin", NULL, "the same model in llama2.c's legacy format too", F_STR(&a.llama2c)},
        {"--hf", "DIR", NULL, "the same model as a Hugging Face directory too", F_STR(&a.hf)},
        {"--heads", "HEADS", NULL, "exit or Medusa heads of MODEL to carry over (with --heads-out)", F_STR(&a.heads)},
        {"--heads-out", "WIDE_HEADS", NULL, "where the carried heads go", F_STR(&a.heads_out)},
    };
    flags_parse(t, N_FLAGS(t), argc, argv, NULL, 0, USAGE, notes());
    a.seed = (uint64_t)seed;
    if (!a.model) usage("-m MODEL");
    if (!a.preset) usage("--preset NAME");
    if (!a.out) usage("-o OUT");
    if (!a.heads != !a.heads_out) die("--heads and --heads-out go together");
    if (a.heads && !strcmp(a.out, "-")) die("--heads needs the wide model in a file (-o FILE)");
    if (!strcmp(dtype, "bf16")) a.dt = DT_BF16;
    else if (strcmp(dtype, "f32")) die("--dtype: '%s' is not f32 or bf16", dtype);
    return a;
}

/* a bad output path fails now, not after the model is built */
static void probe_output(const char *path) {
    AtomicFile af;
    if (!path || !strcmp(path, "-")) return;
    if (atomic_open(&af, path)) die_lib();
    atomic_abort(&af);
}

static void take_back(const char *path) {
    if (path && strcmp(path, "-")) unlink(path);
}

/* --llama2c / --hf need the whole model in memory: build it once, write it thrice;
   a failing write takes back the files this run wrote before it */
static void write_all(const Args *a, const Checkpoint *src, const Config *dst, Progress *pg) {
    Checkpoint w;
    if (widen_checkpoint(src, dst, a->seed, &w, pg) || ck_write_model(&w, a->out, a->dt)) die_lib();
    if (a->llama2c && llama2c_write(&w, a->llama2c)) {
        take_back(a->out);
        die_lib();
    }
    if (a->hf && hf_write_dir(&w, a->hf)) {
        take_back(a->out);
        take_back(a->llama2c);
        die_lib();
    }
    ck_free(&w);
}

/* the heads file's kind decides how it widens (stdin, read only once: exit heads) */
static int widen_any_heads(const Args *a) {
    if (strcmp(a->heads, "-")) {
        TensorFile tf;
        if (tf_open(&tf, a->heads)) return -1;
        const char *kind = tf_meta(&tf, "paradec.kind");
        int medusa = kind && !strcmp(kind, "medusa-heads");
        tf_close(&tf);
        if (medusa) return widen_medusa(a->heads, a->model, a->out, a->heads_out);
    }
    return widen_heads(a->heads, a->model, a->out, a->heads_out);
}

int main(int argc, char **argv) {
    tool_name = "widen";
    Args a = parse(argc, argv);
    const WidenPreset *p = widen_preset(a.preset);
    if (!p) die_lib();
    Checkpoint src;
    if (ck_read_model(&src, a.model)) die_lib();
    Config dst = widen_shape(&src.c, p);
    char what[64];
    snprintf(what, sizeof what, "--preset %s", p->name);
    if (widen_check(&src.c, &dst, what)) die_lib();
    probe_output(a.out);
    probe_output(a.llama2c);
    double t0 = pd_now();
    Progress pg;
    if (a.llama2c || a.hf) write_all(&a, &src, &dst, &pg);
    else if (widen_write_model(&src, &dst, a.seed, a.out, a.dt, &pg)) die_lib();
    if (a.heads && widen_any_heads(&a)) {
        take_back(a.out);
        die_lib();
    }
    fprintf(stderr, "widen: %s → %s (%s: dim %d, hidden %d, %d layers, %d/%d heads, head_dim %d, %s) in %.1fs\n",
            a.model, a.out, p->name, dst.dim, dst.hidden_dim, dst.n_layers, dst.n_heads, dst.n_kv_heads, dst.head_dim,
            a.dt == DT_BF16 ? "bf16" : "f32", pd_now() - t0);
    ck_free(&src);
    return 0;
}
