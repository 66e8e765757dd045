/* tokenizer_impl.h — the Tokenizer's insides, shared by tokenizer.c (maps, encoding,
   decoding, llama2.c files) and the loaders tokenizer_json.c (Hugging Face) and
   tokenizer_gguf.c (GGUF). Not for use outside these files.

   A loader: tok_new() with the id count and a text budget, sets t->form, then
   tok_put_piece() per id, tok_index() (the piece map, byte tables, special-token
   list), tok_add_merge() per merge for TOK_BPE, tok_add_regex()/tok_add_step() for the
   pre-tokenizer, and tok_set_eog(). */
#ifndef PD_TOKENIZER_IMPL_H
#define PD_TOKENIZER_IMPL_H
#include "tokenizer/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* piece types, as GGUF's token_type says them (numbers differ) */
enum { PIECE_NORMAL, PIECE_CONTROL, PIECE_BYTE, PIECE_UNKNOWN, PIECE_USER, PIECE_UNUSED };
/* how the source writes a normal piece's text: raw bytes, GPT-2's byte alphabet, or
   with "▁" standing for a space (SentencePiece) */
enum { FORM_RAW, FORM_BYTELEVEL, FORM_SPACE };
/* where a space goes in front of a text fragment (the text between special tokens):
   SentencePiece's dummy prefix, HF's Prepend/Metaspace/ByteLevel(add_prefix_space) */
enum { PREFIX_NONE, PREFIX_FIRST, PREFIX_EVERY };
/* pre-tokenizer steps, each splitting every piece the previous step made */
enum { PRE_REGEX, PRE_SPACE_SPLIT };

/* the most entries a vocabulary may have: real ones stop near 256K, and a corrupt
   file must not make us build a table of hundreds of millions */
#define TOK_MAX_VOCAB (1 << 22)
#define TOK_MAX_PRE 8
#define TOK_MAX_EOG 16

typedef struct {
    int kind;
    int removed;    /* PRE_REGEX: matches are dropped (HF "Removed"), else kept ("Isolated") */
    pcre2_code *re; /* compiled UTF + UCP, JIT where available; read-only while encoding */
} PreStep;

typedef struct {
    int32_t left, right; /* the pair's ids; left < 0: empty slot */
    int32_t rank, id;    /* merge priority (lower first) and the merged piece */
} MergeSlot;

struct Tokenizer {
    TokKind kind;
    int n_vocab;
    char *text; /* every piece back to back, each NUL-terminated */
    size_t text_used, text_cap;
    uint32_t *off; /* [n_vocab] where piece i starts in text */
    uint32_t *len; /* [n_vocab] its length in bytes */
    float *score;  /* [n_vocab] SPM merge priority, higher merges first */
    uint8_t *type; /* [n_vocab] PIECE_* */
    int32_t *slot; /* [slot_mask+1] open-addressing map piece -> id, -1 = empty;
                              only normal pieces (what text may turn into) */
    uint32_t slot_mask;
    uint32_t max_len;  /* longest piece in the map: longer lookups miss unhashed */
    int byte_id[256];  /* id of the byte piece "<0xXX>" (PIECE_BYTE), -1 when absent */
    char bytes[256];   /* bytes[b] == b: what byte piece b decodes to */
    int unit_id[256];  /* byte-level BPE: id of the one-byte piece b, -1 when absent */
    int unk, bos, eos; /* -1 when absent */
    int add_bos;
    int eog[TOK_MAX_EOG], n_eog;

    int form;                /* FORM_*: how loaders' piece text is converted (tok_convert) */
    int16_t bl_byte[324];    /* GPT-2's byte alphabet backwards: code point -> byte, -1 */
    int prefix;              /* PREFIX_* */
    int prefix_unless_space; /* no prefix when the fragment already starts with ' ' */
    int strip_space;         /* decoding drops the one leading space the prefix added */

    /* TOK_BPE */
    int byte_units;    /* initial symbols are bytes (byte-level), else UTF-8 chars */
    int byte_fallback; /* a char not in the vocabulary becomes its <0xXX> pieces */
    int ignore_merges; /* a pre-token that is itself a piece is emitted whole */
    int fuse_unk;      /* runs of unknown chars give one <unk> */
    int unk_sym;       /* what a char with no piece becomes: this id, or -1: dropped
                              (HF without unk_token, llama.cpp's byte-level BPE) */
    int unk_blocks;    /* a dropped char still separates its neighbours (llama.cpp:
                              a c b stays a, b when c has no piece; HF merges a+b) */
    MergeSlot *merge;  /* [merge_mask+1] (left, right) -> (rank, id) */
    uint32_t merge_mask;
    int n_merges;
    PreStep pre[TOK_MAX_PRE];
    int n_pre;

    /* pieces matched in the text before anything else: control/unknown ones only when
       asked (TOK_SPECIAL), user-defined ones always. Sorted by first byte, longest
       first within one; special_from[c] .. special_from[c+1] start with byte c. */
    int32_t *special;
    int n_special, n_user;
    int special_from[257];
};

Tokenizer *tok_new(TokKind kind, int n_vocab, size_t text_budget);
/* text of piece `id` (as the source writes it when `convert`: through t->form) */
int tok_put_piece(Tokenizer *t, int id, const char *s, size_t n, int type, int convert, const char *what);
/* s (n bytes, as the source writes it) -> raw bytes in out (room for n); the length,
   -1 when s has a character outside the byte-level alphabet (the caller decides) */
int tok_convert(const Tokenizer *t, const char *s, size_t n, char *out);
int tok_index(Tokenizer *t, const char *what);
int tok_lookup(const Tokenizer *t, const char *s, size_t n);
int tok_merges_init(Tokenizer *t, int n_merges);
/* merge `rank`: pieces a and b (source form) -> the piece a+b; all three must exist */
int tok_add_merge(Tokenizer *t, const char *a, size_t na, const char *b, size_t nb, int rank, const char *what);
int tok_add_regex(Tokenizer *t, const char *pattern, size_t n, int literal, int removed, const char *what);
int tok_add_step(Tokenizer *t, int kind, const char *what);
/* the end-of-generation set: eos, `extra` ids (-1 skipped) and control pieces named like
   turn ends */
void tok_set_eog(Tokenizer *t, const int *extra, int n_extra);
/* "<0xXX>" -> XX, else -1 */
int tok_byte_piece_value(const char *s, uint32_t n);

#endif
