/* tokenizer.h — text ↔ token ids.
   Kinds: SentencePiece-style BPE as llama2.c's tokenizer.bin stores it (merges by
   score, dummy-prefix space, byte fallback <0xXX>). Later: byte-level BPE from
   tokenizer.json / GGUF (merges by rank, pre-tokenizer regex) slot in as more kinds
   behind the same calls. */
#ifndef PD_TOKENIZER_H
#define PD_TOKENIZER_H
#include <stddef.h>
#include <stdint.h>

typedef enum { TOK_SPM, TOK_BPE } TokKind;

typedef struct Tokenizer Tokenizer;

/* llama2.c tokenizer.bin from memory (validated; `what` names it in errors) */
int tok_load_llama2c(Tokenizer **out, const void *bytes, size_t n, const char *what);
/* from a file; the format is recognised from the content */
int tok_load_file(Tokenizer **out, const char *path);
void tok_free(Tokenizer *t);

int tok_vocab_size(const Tokenizer *t);
int tok_bos(const Tokenizer *t); /* -1 when none */
int tok_eos(const Tokenizer *t);
TokKind tok_kind(const Tokenizer *t);

/* encode len bytes of text; *ids is malloc'd (caller frees), *n its length */
int tok_encode(const Tokenizer *t, const char *text, size_t len, int add_bos, int32_t **ids,
               int *n);
/* decode a whole sequence (the dummy-prefix space of the first piece is dropped,
   BOS/EOS print nothing); *text malloc'd and NUL-terminated */
int tok_decode(const Tokenizer *t, const int32_t *ids, int n, char **text, size_t *len);
/* the bytes one token adds when it follows `prev` (streaming output, as run.c does:
   after BOS the leading space is dropped); *len bytes, not NUL-terminated */
const char *tok_piece(const Tokenizer *t, int prev, int id, size_t *len);

#endif
