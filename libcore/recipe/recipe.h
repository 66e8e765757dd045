/* recipe.h — a model recipe (recipes/NAME.yaml, read with libyaml): where the model
   comes from, which heads to train on what text, which decoding methods to compare
   on which datasets' prompts. `make recipe=NAME` turns one into out/NAME/ (bin/recipe
   writes the make rules, bin/bench the tables); docs/recipes.md lists every key.

   Everything is checked while parsing, so a bad recipe fails before any work starts,
   with one line: "FILE:LINE: key 'x': what is wrong" (unknown key, wrong type, value
   out of range, a file or dataset that does not exist, an environment variable that
   is not set, a method whose heads the recipe does not train). Paths: $VAR, ${VAR},
   ${VAR:-default} and a leading ~/ are expanded ($PARADEC_CACHE defaults to the
   cache `make models` fills); a relative path that does not exist as given is looked
   up in the data folders (pd_data_path). */
#ifndef PD_RECIPE_H
#define PD_RECIPE_H
#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

#define RECIPE_MAX_DATASETS 8
#define RECIPE_MAX_METHODS 16
#define RECIPE_MAX_ORACLE 16
#define RECIPE_MAX_OPTS 32

/* prompts from one dataset file */
typedef struct {
    char *name;   /* xsum, humaneval, gsm8k, tinystories, spec_bench, mt_bench, or the recipe's own */
    char *file;   /* resolved path: jsonl (.gz or not) or plain text split at blank lines */
    char *tmpl;   /* the prompt: "{field}", "{field:N}" (first N bytes), "{field:Nw}"
                        (first N words), "{{" and "}}" for braces; a field holding an
                        array gives its first element; plain text's field is "text" */
    int samples;  /* prompts, taken evenly over the file's records */
    int max_new;  /* tokens to generate per prompt */
    int chat;     /* wrap in the model's chat format */
    char *system; /* chat: the system prompt, or NULL = the template's default */
    float gamma;  /* adadecode's γ on this dataset (seed guidance: 0.65 creative text,
                        0.85 code, 0.9 maths) */
    int line;     /* where the recipe names it */
} RecipeDataset;

typedef struct {
    char *source;        /* resolved: a Hugging Face dir, GGUF file or llama2.c .bin; NULL when random */
    char *tokenizer;     /* resolved, or NULL = the source's own */
    char *dtype;         /* "f32" or "bf16" */
    char *random_config; /* random weights (bin/randmodel): the config as JSON, HF key names */
    char *chat_template; /* random: a tokenizer_config.json whose chat_template the model gets */
    int random_seed;
    char *about; /* what the model is, for the tables */
} RecipeModel;

/* the model's own greedy answers to prompts: self-distillation text for the heads */
typedef struct {
    int on;
    int n;
    RecipeDataset ds[RECIPE_MAX_DATASETS];
} RecipeAnswers;

typedef struct {
    int on;
    char *layers; /* "8,16,24" or "auto" */
    char *data;   /* resolved path; NULL when from_answers */
    int from_answers;
    char *fields;                    /* jsonl fields "a,b", or NULL = text */
    int special;                     /* control tokens in the text are tokens (chat-formatted data) */
    int steps, batch, seq_len, seed; /* 0 = the tool's default */
    double lr;                       /* 0 = the tool's default */
    int norm;                        /* -1 auto, 0, 1 */
} RecipeExitHeads;

typedef struct {
    int on;
    int heads; /* K */
    char *data;
    int from_answers;
    char *fields;
    int special, own_lm_head, generate;
    char *targets;      /* "self", "data" or NULL = default */
    char *loss_weights; /* "1,0.8,0.6" or NULL */
    int steps, batch, seq_len, seed;
    double lr, lm_lr;
} RecipeMedusa;

/* speculative's draft model: the model's first `layer` layers plus an exit head there
   trained with the final norm (folded into an lm_head: draftmodel.h), or another model
   converted from `source`. The exit_heads' file serves when it has norm 1 and that
   layer; otherwise the draft trains its own head (heads: its settings, the ones it
   does not give taken from exit_heads) */
typedef struct {
    int on;
    int layer;
    int own_heads; /* layer: a head of its own (heads.on), not exit_heads' */
    RecipeExitHeads heads;
    char *source;
    char *tokenizer;
} RecipeDraft;

typedef struct {
    int n_methods;
    char *methods[RECIPE_MAX_METHODS]; /* "standard" first, always */
    float gamma;                       /* adadecode's γ where a dataset gives none (0: the dataset's guidance) */
    /* the methods' own options (decode_option_by_key: confidence, max_pending,
       draft_max, ...), as written, each checked against every listed method that reads it */
    int n_opts;
    char *opt_key[RECIPE_MAX_OPTS], *opt_val[RECIPE_MAX_OPTS];
    int n_oracle;
    float oracle[RECIPE_MAX_ORACLE]; /* oracle acceptance rates for the headroom plot */
    int oracle_samples;              /* prompts of the first dataset the sweep runs */
    int repeat;                      /* runs of each method on each prompt; the shortest time is kept (1) */
} RecipeDecoding;

typedef struct {
    char *file;  /* the recipe's path */
    char *name;  /* the file's base name without .yaml: out/NAME/ */
    char *about; /* one line for the tables */
    int threads;
    RecipeModel model;
    RecipeAnswers answers;
    RecipeExitHeads exit;
    RecipeMedusa medusa;
    RecipeDraft draft;
    RecipeDecoding dec;
    int n_datasets;
    RecipeDataset ds[RECIPE_MAX_DATASETS];
} Recipe;

/* parse and check a recipe held in memory (name: the file name errors use); on
   failure the message is "NAME:LINE: key 'x': what is wrong" and r is left empty */
int recipe_parse(Recipe *r, const char *bytes, size_t n, const char *name);
int recipe_load(Recipe *r, const char *path);
void recipe_free(Recipe *r);

/* what a method needs beyond the model */
enum { RECIPE_NEEDS_EXIT = 1, RECIPE_NEEDS_MEDUSA = 2, RECIPE_NEEDS_DRAFT = 4 };
int recipe_method_needs(const char *method);
/* a method option's value as the recipe wrote it (key as in decode_option_key), or NULL */
const char *recipe_option(const RecipeDecoding *d, const char *key);
/* does the method take MethodShared.oracle (an oracle that knows the standard
   continuation stands in for its heads / draft)? */
int recipe_method_has_oracle(const char *method);

/* the files a recipe's pipeline writes, under its out folder */
#define RECIPE_MODEL "model.safetensors"
#define RECIPE_ANSWERS "answers.jsonl"
#define RECIPE_EXIT "exit-heads.safetensors.zst"
#define RECIPE_MEDUSA "medusa-heads.safetensors.zst"
#define RECIPE_DRAFT "draft.safetensors"
#define RECIPE_DRAFT_HEADS "draft-heads.safetensors.zst"
#define RECIPE_BUNDLE "bundle.safetensors.zst"

/* a dataset's prompts, rendered through its template: *n of them (≤ samples; fewer
   when the file has fewer usable records), each malloc'd, in *prompts (malloc'd) */
int recipe_prompts(const RecipeDataset *ds, char ***prompts, int *n);
void recipe_prompts_free(char **prompts, int n);
/* render one template against a JSON object (jansson json_t *) or plain text
   (rec = NULL, text = the record); malloc'd, NULL + message on a missing field */
char *recipe_render(const char *tmpl, const void *rec, const char *text, const char *what);
/* a prompt's token ids: in the model's chat format when ds->chat (BOS as the format
   wants, control tokens recognised), else plain (BOS when the tokenizer wants one) */
int recipe_encode(const Model *m, const RecipeDataset *ds, const char *prompt, int32_t **ids, int *n);
/* the text recipe_encode encodes (the chat-formatted prompt, or the prompt itself) */
char *recipe_prompt_text(const Model *m, const RecipeDataset *ds, const char *prompt, int *add_bos);

#endif
