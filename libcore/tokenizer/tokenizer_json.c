/* tokenizer_json.c — Hugging Face tokenizer.json (the `tokenizers` library's format) into
   a TOK_BPE Tokenizer. What is read:
   - model: type "BPE" only (Unigram, WordPiece, WordLevel are refused by name); vocab
     {piece: id}; merges as "a b" strings or [a, b] pairs, rank = position; byte_fallback,
     ignore_merges, fuse_unk, unk_token.
   - normalizer: none, Prepend("▁"), Replace(" " → "▁"), Sequence of those, and NFC,
     taken as a no-op (paradec assumes NFC text; text that is not NFC is tokenised
     unnormalised). Anything else is refused by name.
   - pre_tokenizer: ByteLevel (use_regex: GPT-2's regex; add_prefix_space), Split
     (Regex or String pattern, behaviour Isolated or Removed, the regex compiled as
     written with PCRE2), Digits, Metaspace (replacement "▁", prepend_scheme, split),
     Sequence of those.
   - added_tokens: id, content, special (special: matched in text only with
     TOK_SPECIAL; non-special: always). lstrip/rstrip/single_word/normalized are not
     read.
   - the decoder is implied: byte-level pieces decode to their bytes; SentencePiece-
     style ones ("▁" for space) drop the one leading space the prefix added.
   BOS/EOS: a TemplateProcessing post-processor's special token before $A is BOS (and
   add_bos is on), one after $A is EOS; Roberta/BertProcessing's cls/sep likewise. Where
   the file says nothing, BOS is the first piece found of <|begin_of_text|>, <s>,
   <|startoftext|>, <bos> (add_bos on when one is found: Llama 3's and SentencePiece
   models expect it; the first Llama 3 tokenizer.json has no template), EOS the first of
   <|end_of_text|>, </s>, <|endoftext|>, <eos>. tokenizer_config.json is not read. */
#include "base/util.h"
#include "tokenizer/tokenizer_impl.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define META "\xe2\x96\x81" /* "▁", SentencePiece's space */

/* GPT-2's pre-tokenizer regex, which ByteLevel(use_regex: true) applies */
static const char GPT2_REGEX[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

typedef struct {
    int kind, literal, removed;
    const char *pat;
    size_t plen;
} Step;

/* what normalizer and pre-tokenizer say, gathered before the Tokenizer exists */
typedef struct {
    const char *what;
    int bytelevel, space_meta, metaspace, prepend;
    int prefix, prefix_unless_space;
    Step step[TOK_MAX_PRE];
    int n_step;
} Pipe;

static const char *str_of(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static int bool_of(json_t *o, const char *key, int dflt) {
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static const char *type_of(json_t *o) {
    const char *s = str_of(o, "type");
    return s ? s : "(no type)";
}

static int add_step(Pipe *p, int kind, const char *pat, size_t plen, int literal, int removed) {
    if (p->n_step == TOK_MAX_PRE) return pd_error("%s: more than %d pre-tokenizer steps", p->what, TOK_MAX_PRE);
    p->step[p->n_step++] = (Step){kind, literal, removed, pat, plen};
    return 0;
}

static int normalizer(Pipe *p, json_t *n) {
    if (!n || json_is_null(n)) return 0;
    if (!json_is_object(n)) return pd_error("%s: normalizer is not an object", p->what);
    const char *ty = type_of(n);
    if (!strcmp(ty, "Sequence")) {
        json_t *list = json_object_get(n, "normalizers"), *e;
        size_t i;
        if (!json_is_array(list)) return pd_error("%s: Sequence normalizer without a list", p->what);
        json_array_foreach(list, i, e) if (normalizer(p, e)) return -1;
        return 0;
    }
    if (!strcmp(ty, "NFC")) return 0; /* see the top of the file */
    if (!strcmp(ty, "Prepend")) {
        const char *s = str_of(n, "prepend");
        if (!s || strcmp(s, META))
            return pd_error("%s: normalizer Prepend('%s') is not supported (only \"" META "\")", p->what, s ? s : "?");
        p->prepend = 1;
        return 0;
    }
    if (!strcmp(ty, "Replace")) {
        json_t *pat = json_object_get(n, "pattern");
        const char *from = json_is_object(pat) ? str_of(pat, "String") : NULL;
        const char *to = str_of(n, "content");
        if (!from || !to || strcmp(from, " ") || strcmp(to, META))
            return pd_error("%s: normalizer Replace('%s' -> '%s') is not supported (only "
                            "' ' -> '" META "')",
                            p->what, from ? from : "?", to ? to : "?");
        p->space_meta = 1;
        return 0;
    }
    return pd_error("%s: normalizer '%s' is not supported", p->what, ty);
}

/* a step that puts a space in front must come first: the space goes in front of the
   whole fragment, before any split */
static int set_prefix(Pipe *p, int prefix, const char *who) {
    if (prefix == PREFIX_NONE) return 0;
    if (p->n_step > 0 || p->prefix != PREFIX_NONE)
        return pd_error("%s: %s with a prefix space after another pre-tokenizer step is not "
                        "supported",
                        p->what, who);
    p->prefix = prefix;
    p->prefix_unless_space = 1;
    return 0;
}

static int pre_tokenizer(Pipe *p, json_t *n) {
    if (!n || json_is_null(n)) return 0;
    if (!json_is_object(n)) return pd_error("%s: pre_tokenizer is not an object", p->what);
    const char *ty = type_of(n);
    if (!strcmp(ty, "Sequence")) {
        json_t *list = json_object_get(n, "pretokenizers"), *e;
        size_t i;
        if (!json_is_array(list)) return pd_error("%s: Sequence pre-tokenizer without a list", p->what);
        json_array_foreach(list, i, e) if (pre_tokenizer(p, e)) return -1;
        return 0;
    }
    if (!strcmp(ty, "ByteLevel")) {
        p->bytelevel = 1;
        if (set_prefix(p, bool_of(n, "add_prefix_space", 0) ? PREFIX_EVERY : PREFIX_NONE, "ByteLevel")) return -1;
        if (bool_of(n, "use_regex", 1)) return add_step(p, PRE_REGEX, GPT2_REGEX, sizeof GPT2_REGEX - 1, 0, 0);
        return 0;
    }
    if (!strcmp(ty, "Split")) {
        json_t *pat = json_object_get(n, "pattern");
        const char *re = json_is_object(pat) ? str_of(pat, "Regex") : NULL;
        const char *lit = json_is_object(pat) ? str_of(pat, "String") : NULL;
        const char *beh = str_of(n, "behavior");
        if (!re && !lit) return pd_error("%s: Split pre-tokenizer without a pattern", p->what);
        if (bool_of(n, "invert", 0))
            return pd_error("%s: Split pre-tokenizer with invert: true is not supported", p->what);
        int removed = beh && !strcmp(beh, "Removed");
        if (!beh || (!removed && strcmp(beh, "Isolated")))
            return pd_error("%s: Split behavior '%s' is not supported (Isolated, Removed)", p->what, beh ? beh : "?");
        const char *s = re ? re : lit;
        json_t *v = json_object_get(pat, re ? "Regex" : "String");
        return add_step(p, PRE_REGEX, s, json_string_length(v), !re, removed);
    }
    if (!strcmp(ty, "Digits")) {
        int each = bool_of(n, "individual_digits", 0);
        return add_step(p, PRE_REGEX, each ? "[0-9]" : "[0-9]+", each ? 5 : 6, 0, 0);
    }
    if (!strcmp(ty, "Metaspace")) {
        const char *r = str_of(n, "replacement");
        if (r && strcmp(r, META))
            return pd_error("%s: Metaspace replacement '%s' is not supported (only \"" META "\")", p->what, r);
        const char *scheme = str_of(n, "prepend_scheme");
        int prefix = bool_of(n, "add_prefix_space", 1) ? PREFIX_EVERY : PREFIX_NONE;
        if (scheme) {
            if (!strcmp(scheme, "always")) prefix = PREFIX_EVERY;
            else if (!strcmp(scheme, "first")) prefix = PREFIX_FIRST;
            else if (!strcmp(scheme, "never")) prefix = PREFIX_NONE;
            else return pd_error("%s: Metaspace prepend_scheme '%s' is unknown", p->what, scheme);
        }
        p->metaspace = 1;
        if (set_prefix(p, prefix, "Metaspace")) return -1;
        return bool_of(n, "split", 1) ? add_step(p, PRE_SPACE_SPLIT, NULL, 0, 0, 0) : 0;
    }
    return pd_error("%s: pre-tokenizer '%s' is not supported", p->what, ty);
}

/* the model's options paradec does not implement, refused rather than ignored */
static int check_model(json_t *model, const char *what) {
    const char *ty = str_of(model, "type");
    if (!ty && !json_object_get(model, "merges")) return pd_error("%s: the model has no type and no merges", what);
    if (ty && strcmp(ty, "BPE"))
        return pd_error("%s: tokenizer model type '%s' is not supported (paradec reads BPE)", what, ty);
    static const char *affix[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const char *s = str_of(model, affix[i]);
        if (s && *s) return pd_error("%s: BPE %s '%s' is not supported", what, affix[i], s);
    }
    json_t *d = json_object_get(model, "dropout");
    if (json_is_number(d) && json_number_value(d) != 0)
        return pd_error("%s: BPE dropout %g is not supported", what, json_number_value(d));
    if (!json_is_object(json_object_get(model, "vocab"))) return pd_error("%s: the model has no vocab object", what);
    if (!json_is_array(json_object_get(model, "merges"))) return pd_error("%s: the model has no merges list", what);
    return 0;
}

static int id_of(json_t *v, const char *what, const char *which) {
    json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
    if (id < 0 || id >= TOK_MAX_VOCAB) {
        pd_error("%s: %s has no valid id (0 ≤ id < %d)", what, which, TOK_MAX_VOCAB);
        return -1;
    }
    return (int)id;
}

/* the vocabulary's size and the bytes its text needs */
static int measure(json_t *vocab, json_t *added, const char *what, int *n_vocab, size_t *bytes) {
    const char *key;
    json_t *v;
    int hi = -1;
    size_t total = 0;
    json_object_foreach(vocab, key, v) {
        char which[80];
        snprintf(which, sizeof which, "vocab entry '%.40s'", key);
        int id = id_of(v, what, which);
        if (id < 0) return -1;
        if (id > hi) hi = id;
        total += strlen(key);
    }
    size_t i;
    json_array_foreach(added, i, v) {
        char which[48];
        snprintf(which, sizeof which, "added token %zu", i);
        const char *content = json_is_object(v) ? str_of(v, "content") : NULL;
        if (!content) return pd_error("%s: %s has no content", what, which);
        int id = id_of(json_object_get(v, "id"), what, which);
        if (id < 0) return -1;
        if (id > hi) hi = id;
        total += json_string_length(json_object_get(v, "content")) + 1; /* + its NUL: it
                                                     may come on top of a vocab entry's */
    }
    if (hi < 0) return pd_error("%s: empty vocabulary", what);
    *n_vocab = hi + 1;
    *bytes = total;
    return 0;
}

static int put_vocab(Tokenizer *t, json_t *vocab, json_t *added, int byte_fallback, const char *unk, const char *what) {
    uint8_t *seen = pd_alloc((size_t)t->n_vocab);
    if (!seen) return -1;
    const char *key;
    json_t *v;
    int rc = 0;
    json_object_foreach(vocab, key, v) {
        int id = (int)json_integer_value(v);
        if (seen[id]) {
            rc = pd_error("%s: vocab gives id %d to two pieces ('%.40s' and '%.40s')", what, id, t->text + t->off[id],
                          key);
            break;
        }
        seen[id] = 1;
        size_t n = strlen(key);
        int type = PIECE_NORMAL;
        if (byte_fallback && !t->byte_units && tok_byte_piece_value(key, (uint32_t)n) >= 0) type = PIECE_BYTE;
        if (unk && !strcmp(key, unk)) type = PIECE_UNKNOWN;
        if ((rc = tok_put_piece(t, id, key, n, type, 1, what))) break;
    }
    size_t i;
    json_array_foreach(added, i, v) {
        if (rc) break;
        int id = (int)json_integer_value(json_object_get(v, "id"));
        json_t *c = json_object_get(v, "content");
        const char *s = json_string_value(c);
        int type = bool_of(v, "special", 0) ? PIECE_CONTROL : PIECE_USER;
        if (unk && !strcmp(s, unk)) type = PIECE_UNKNOWN;
        /* added tokens are written as raw text; they win over a vocab entry of their id */
        rc = tok_put_piece(t, id, s, json_string_length(c), type, 0, what);
    }
    free(seen);
    return rc;
}

static int put_merges(Tokenizer *t, json_t *merges, const char *what) {
    if (json_array_size(merges) > (size_t)TOK_MAX_VOCAB * 4)
        return pd_error("%s: %zu merges is not plausible", what, json_array_size(merges));
    if (tok_merges_init(t, (int)json_array_size(merges))) return pd_error_prefix(what);
    size_t i;
    json_t *m;
    json_array_foreach(merges, i, m) {
        const char *a, *b;
        size_t na, nb;
        if (json_is_string(m)) { /* "a b": exactly one space (pieces never hold one) */
            a = json_string_value(m);
            const char *sp = strchr(a, ' ');
            size_t n = json_string_length(m);
            if (!sp || sp == a || memchr(sp + 1, ' ', n - (size_t)(sp + 1 - a)) || sp + 1 == a + n)
                return pd_error("%s: merge %zu ('%.60s') is not two pieces", what, i, a);
            na = (size_t)(sp - a);
            b = sp + 1;
            nb = n - na - 1;
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            na = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            nb = json_string_length(json_array_get(m, 1));
        } else {
            return pd_error("%s: merge %zu is neither \"a b\" nor [a, b]", what, i);
        }
        if (tok_add_merge(t, a, na, b, nb, (int)i, what)) return -1;
    }
    return 0;
}

/* the id a post-processor names: its own ids list, else the piece of that text */
static int special_id(const Tokenizer *t, json_t *specials, const char *name) {
    json_t *e = json_object_get(specials, name);
    json_t *ids = json_is_object(e) ? json_object_get(e, "ids") : NULL;
    json_t *first = json_is_array(ids) ? json_array_get(ids, 0) : NULL;
    if (json_is_integer(first)) {
        json_int_t id = json_integer_value(first);
        return id >= 0 && id < t->n_vocab ? (int)id : -1;
    }
    return tok_find(t, name);
}

/* BOS / EOS from a post-processor; 1 when one said anything */
static int post_processor(Tokenizer *t, json_t *pp) {
    if (!json_is_object(pp)) return 0;
    const char *ty = type_of(pp);
    if (!strcmp(ty, "Sequence")) {
        json_t *list = json_object_get(pp, "processors"), *e;
        size_t i;
        int said = 0;
        json_array_foreach(list, i, e) said |= post_processor(t, e);
        return said;
    }
    if (!strcmp(ty, "RobertaProcessing") || !strcmp(ty, "BertProcessing")) {
        json_t *cls = json_object_get(pp, "cls"), *sep = json_object_get(pp, "sep");
        json_t *c = json_array_get(cls, 1), *s = json_array_get(sep, 1);
        if (json_is_integer(c) && json_integer_value(c) >= 0 && json_integer_value(c) < t->n_vocab) {
            t->bos = (int)json_integer_value(c);
            t->add_bos = 1;
        }
        if (json_is_integer(s) && json_integer_value(s) >= 0 && json_integer_value(s) < t->n_vocab)
            t->eos = (int)json_integer_value(s);
        return 1;
    }
    if (strcmp(ty, "TemplateProcessing")) return 0;
    json_t *single = json_object_get(pp, "single"), *specials = json_object_get(pp, "special_tokens");
    json_t *item;
    size_t i;
    int seen_text = 0;
    t->add_bos = 0;
    json_array_foreach(single, i, item) {
        json_t *st = json_object_get(item, "SpecialToken");
        if (json_object_get(item, "Sequence")) seen_text = 1;
        const char *name = json_is_object(st) ? str_of(st, "id") : NULL;
        if (!name) continue;
        int id = special_id(t, specials, name);
        if (id < 0) continue;
        if (!seen_text) {
            t->bos = id;
            t->add_bos = 1;
        } else t->eos = id;
    }
    return 1;
}

static int first_of(const Tokenizer *t, const char *const *names, int n) {
    for (int i = 0; i < n; i++) {
        int id = tok_find(t, names[i]);
        if (id >= 0) return id;
    }
    return -1;
}

static void specials(Tokenizer *t, json_t *root) {
    static const char *const bos[] = {"<|begin_of_text|>", "<s>", "<|startoftext|>", "<bos>"};
    static const char *const eos[] = {"<|end_of_text|>", "</s>", "<|endoftext|>", "<eos>"};
    t->bos = first_of(t, bos, 4);
    t->eos = first_of(t, eos, 4);
    t->add_bos = t->bos >= 0;
    post_processor(t, json_object_get(root, "post_processor"));
    tok_set_eog(t, NULL, 0);
}

static int from_json(Tokenizer **out, json_t *root, const char *what) {
    if (!json_is_object(root)) return pd_error("%s: not a tokenizer.json (not an object)", what);
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return pd_error("%s: not a tokenizer.json (no model)", what);
    if (check_model(model, what)) return -1;
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_array(added) && !json_is_null(added)) return pd_error("%s: added_tokens is not a list", what);
    Pipe p = {.what = what};
    if (normalizer(&p, json_object_get(root, "normalizer")) ||
        pre_tokenizer(&p, json_object_get(root, "pre_tokenizer")))
        return -1;
    if (p.bytelevel && (p.metaspace || p.space_meta || p.prepend))
        return pd_error("%s: a byte-level pre-tokenizer together with '" META "' spaces is not "
                        "supported",
                        what);
    if (p.prepend && !p.space_meta && !p.metaspace)
        return pd_error("%s: normalizer Prepend('" META "') without spaces written as '" META "' is not supported",
                        what);
    if (p.prepend) {
        if (p.prefix != PREFIX_NONE) return pd_error("%s: both a Prepend normalizer and a Metaspace prefix", what);
        p.prefix = PREFIX_EVERY; /* Prepend adds "▁" to every non-empty fragment */
        p.prefix_unless_space = 0;
    }
    int n_vocab = 0;
    size_t bytes = 0;
    if (measure(vocab, added, what, &n_vocab, &bytes)) return -1;
    Tokenizer *t = tok_new(TOK_BPE, n_vocab, bytes);
    if (!t) return pd_error_prefix(what);
    t->form = p.bytelevel ? FORM_BYTELEVEL : p.space_meta || p.metaspace ? FORM_SPACE : FORM_RAW;
    t->byte_units = p.bytelevel;
    t->byte_fallback = bool_of(model, "byte_fallback", 0);
    t->ignore_merges = bool_of(model, "ignore_merges", 0);
    t->fuse_unk = bool_of(model, "fuse_unk", 0);
    t->prefix = p.prefix;
    t->prefix_unless_space = p.prefix_unless_space;
    t->strip_space = t->form == FORM_SPACE && p.prefix != PREFIX_NONE;
    const char *unk = str_of(model, "unk_token");
    int rc = put_vocab(t, vocab, added, t->byte_fallback, unk, what);
    rc = rc ? rc : tok_index(t, what);
    if (!rc && unk) {
        t->unk = tok_find(t, unk);
        if (t->unk < 0) rc = pd_error("%s: unk_token '%.40s' is not in the vocabulary", what, unk);
        t->unk_sym = t->unk;
    }
    rc = rc ? rc : put_merges(t, merges, what);
    for (int i = 0; !rc && i < p.n_step; i++) {
        Step *s = &p.step[i];
        rc = s->kind == PRE_REGEX ? tok_add_regex(t, s->pat, s->plen, s->literal, s->removed, what)
                                  : tok_add_step(t, s->kind, what);
    }
    if (rc) {
        tok_free(t);
        return -1;
    }
    specials(t, root);
    *out = t;
    return 0;
}

int tok_load_hf_json(Tokenizer **out, const void *bytes, size_t n, const char *what) {
    *out = NULL;
    json_error_t err;
    json_t *root = json_loadb(bytes, n, JSON_ALLOW_NUL, &err);
    if (!root) return pd_error("%s: not valid JSON (line %d, column %d: %s)", what, err.line, err.column, err.text);
    int rc = from_json(out, root, what);
    json_decref(root);
    return rc;
}
