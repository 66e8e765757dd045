/* dataset.h — training text for the head trainers (distill-heads, train-medusa).

   Input: plain text, gzip'd or not (recognised by its magic number, so "-" = stdin
   may be gzip'd too), or jsonl (the first non-blank byte is '{'): one JSON object a
   line, whose `text` field — or the fields a recipe names, joined by newlines; an
   array of strings counts as its strings joined by newlines — is one record. Plain
   text is split into records at blank lines (TinyStories separates stories and
   paragraphs so).

   Records are tokenized one by one (BOS in front when the tokenizer asks for one)
   and packed whole into sequences of at most seq_len tokens, as llama2.c packed its
   pretraining data: a sequence always starts at a record's start, a record longer
   than seq_len is cut into pieces. Every round(1/heldout_frac)-th sequence (at
   least one; at most every second) is held out for evaluation: spread over the
   whole text, because a text's regions differ. */
#ifndef PD_DATASET_H
#define PD_DATASET_H
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

typedef struct {
    int n;           /* records */
    char **text;     /* [n] NUL-terminated */
    size_t *len;     /* [n] */
    size_t bytes;    /* the input's size (inflated) */
    char digest[40]; /* xxh3-128 of the input bytes (inflated), hex */
} TextSet;

/* parse bytes already in memory (gzip'd or not); fields: NULL = "text", else a
   comma-separated list of jsonl fields. Refused: empty input, NUL bytes in plain
   text, a jsonl line that is not an object, no record with usable text. */
int dataset_parse(TextSet *ds, const void *bytes, size_t n, const char *fields, const char *what);
/* a file, "-" = stdin */
int dataset_read(TextSet *ds, const char *path, const char *fields);
void dataset_free(TextSet *ds);

typedef struct {
    int n;        /* sequences */
    int32_t *tok; /* all their tokens, one after another */
    int64_t *off; /* [n+1]: sequence i is tok[off[i] .. off[i+1]) */
    int max_len;  /* longest sequence */
} Sequences;

static inline int seq_len_of(const Sequences *s, int i) { return (int)(s->off[i + 1] - s->off[i]); }
static inline int64_t seqs_tokens(const Sequences *s) { return s->off[s->n]; }

/* tokenize, pack and split (see above); special: control tokens written in the text
   (<|im_start|>, ...: chat-formatted data) become those tokens. Refused when the text
   makes fewer than two sequences (one to train on, one to hold out) */
int dataset_sequences(const TextSet *ds, const Tokenizer *tok, int seq_len, double heldout_frac, int special,
                      Sequences *train, Sequences *heldout, const char *what);
void seqs_free(Sequences *s);

#endif
