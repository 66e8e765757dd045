/* tokenizer.h — text ↔ token ids.
   Two kinds behind the same calls:
   - TOK_SPM: SentencePiece-style BPE merging by piece score (llama2.c's tokenizer.bin,
     GGUF tokenizer.ggml.model "llama"): dummy-prefix space, byte fallback <0xXX>.
   - TOK_BPE: BPE merging by pair rank (Hugging Face tokenizer.json model "BPE", GGUF
     "gpt2"): byte-level (GPT-2 / Llama 3 / SmolLM, pre-tokenizer regexes run with
     PCRE2) or SentencePiece-style (Llama 2 HF: "▁" prefix, byte fallback).
   Pieces are held as the raw bytes they stand for: a byte-level vocabulary is mapped
   back from GPT-2's byte alphabet and "▁" becomes ' ' at load, so decoding is a
   concatenation and every text (any bytes, not only UTF-8) round-trips.

   Special tokens: control tokens (BOS, <|eot_id|>, ...) are recognised in the text
   only with TOK_SPECIAL; user-defined added tokens (HF "special": false, GGUF type 4)
   always are. Matching is leftmost-longest, as HF does. */
#ifndef PD_TOKENIZER_H
#define PD_TOKENIZER_H
#include <stddef.h>
#include <stdint.h>

typedef enum { TOK_SPM, TOK_BPE } TokKind;

typedef struct Tokenizer Tokenizer;
typedef struct Gguf Gguf; /* formats/gguf.h: only tok_load_gguf takes one */

/* flags for tok_encode_flags / tok_decode_flags */
enum {
    TOK_ADD_BOS = 1, /* encode: BOS in front */
    TOK_SPECIAL = 2, /* encode: control tokens written in the text become those tokens;
                        decode: control tokens print their text instead of nothing */
};

/* llama2.c tokenizer.bin from memory (validated; `what` names it in errors) */
int tok_load_llama2c(Tokenizer **out, const void *bytes, size_t n, const char *what);
/* Hugging Face tokenizer.json from memory (the JSON text, not gzipped) */
int tok_load_hf_json(Tokenizer **out, const void *bytes, size_t n, const char *what);
/* the tokenizer.* keys of a GGUF file (a model or a vocab-only file) */
int tok_load_gguf(Tokenizer **out, const Gguf *g, const char *what);
/* from bytes of a known kind: "llama2c", "hf-json" or "gguf" (a vocab-only GGUF);
   NULL: recognised from the content */
int tok_load_bytes(Tokenizer **out, const void *bytes, size_t n, const char *kind, const char *what);
/* from a file: tokenizer.bin, tokenizer.json, tokenizer.json.gz, *.gguf (by content;
   .gz by name) */
int tok_load_file(Tokenizer **out, const char *path);
void tok_free(Tokenizer *t);

int tok_vocab_size(const Tokenizer *t);
int tok_bos(const Tokenizer *t); /* -1 when none */
int tok_eos(const Tokenizer *t);
/* whether the vocabulary asks for BOS in front of a prompt (SentencePiece and Llama 3:
   yes; GPT-2, SmolLM2: no) */
int tok_add_bos(const Tokenizer *t);
/* end of generation: EOS, and the control tokens that end a turn (<|eot_id|>,
   <|im_end|>, <|end_of_text|>, </s>, ... and GGUF's eot/eom ids) */
int tok_is_eog(const Tokenizer *t, int id);
/* the id of a piece written exactly so (control tokens included), -1 when none:
   "<|eot_id|>", "<|im_start|>" — for chat templates */
int tok_find(const Tokenizer *t, const char *piece);
TokKind tok_kind(const Tokenizer *t);
/* 1 when both have the same pieces (every id's text, byte for byte); else 0 and why[n]
   says where they first differ (a draft model must share the target's vocabulary) */
int tok_same_vocab(const Tokenizer *a, const Tokenizer *b, char *why, size_t n);

/* encode len bytes of text; *ids is malloc'd (caller frees), *n its length */
int tok_encode(const Tokenizer *t, const char *text, size_t len, int add_bos, int32_t **ids, int *n);
int tok_encode_flags(const Tokenizer *t, const char *text, size_t len, int flags, int32_t **ids, int *n);
/* decode a whole sequence (the dummy-prefix space of the first piece is dropped,
   control tokens print nothing); *text malloc'd and NUL-terminated (the tests'; the
   tools print piece by piece, tok_piece) */
int tok_decode(const Tokenizer *t, const int32_t *ids, int n, char **text, size_t *len);
int tok_decode_flags(const Tokenizer *t, const int32_t *ids, int n, int flags, char **text, size_t *len);
/* the bytes one token adds when it follows `prev` (streaming output, as run.c does:
   after BOS the leading space is dropped); *len bytes, not NUL-terminated. A byte-level
   token may end inside a UTF-8 character: the caller prints bytes, not characters. */
const char *tok_piece(const Tokenizer *t, int prev, int id, size_t *len);

#endif
