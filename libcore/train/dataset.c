/* dataset.c — see dataset.h */
#include "train/dataset.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>
#include <zlib.h>

#include "base/util.h"

#define MAX_FIELDS 16

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

static int has_text(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!is_space(s[i])) return 1;
    return 0;
}

static int add_record(TextSet *ds, int *cap, const char *s, size_t n) {
    if (ds->n == *cap) {
        int nc = *cap ? 2 * *cap : 256;
        char **t = pd_realloc(ds->text, sizeof(char *) * nc);
        if (!t) return -1;
        ds->text = t;
        size_t *l = pd_realloc(ds->len, sizeof(size_t) * nc);
        if (!l) return -1;
        ds->len = l;
        *cap = nc;
    }
    char *c = pd_alloc(n + 1);
    if (!c) return -1;
    memcpy(c, s, n);
    ds->text[ds->n] = c;
    ds->len[ds->n++] = n;
    return 0;
}

/* records are runs of non-blank lines */
static int parse_plain(TextSet *ds, const char *s, size_t n, const char *what) {
    if (memchr(s, 0, n)) return pd_error("%s: NUL bytes: binary data, not text", what);
    int cap = 0;
    size_t start = 0, end = 0; /* the current record: [start, end) */
    int open = 0;
    for (size_t i = 0; i < n;) {
        const char *nl = memchr(s + i, '\n', n - i);
        size_t e = nl ? (size_t)(nl - s) : n; /* this line is [i, e) */
        if (has_text(s + i, e - i)) {
            if (!open) start = i, open = 1;
            end = e;
        } else if (open) {
            if (add_record(ds, &cap, s + start, end - start)) return -1;
            open = 0;
        }
        i = e + 1;
    }
    if (open && add_record(ds, &cap, s + start, end - start)) return -1;
    return 0;
}

/* a field's text: a string, or an array's strings joined by newlines */
static int field_text(json_t *v, char **out, size_t *len, size_t *cap) {
    if (json_is_string(v)) {
        size_t l = json_string_length(v);
        if (*len + l + 2 > *cap) {
            size_t nc = (*len + l + 2) * 2;
            char *nb = pd_realloc(*out, nc);
            if (!nb) return -1;
            *out = nb;
            *cap = nc;
        }
        if (*len) (*out)[(*len)++] = '\n';
        memcpy(*out + *len, json_string_value(v), l);
        *len += l;
        return 0;
    }
    if (json_is_array(v)) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) if (field_text(e, out, len, cap)) return -1;
    }
    return 0; /* numbers, objects, null: no text */
}

static int parse_jsonl(TextSet *ds, const char *s, size_t n, const char *fields, const char *what) {
    char names[MAX_FIELDS][64];
    int n_names = 0;
    for (const char *f = fields; *f;) {
        size_t l = strcspn(f, ",");
        if (l == 0 || l >= sizeof names[0] || n_names == MAX_FIELDS)
            return pd_error("%s: bad field list '%s'", what, fields);
        memcpy(names[n_names], f, l);
        names[n_names++][l] = 0;
        f += l + (f[l] == ',');
    }
    int cap = 0, line = 0, rc = 0;
    size_t tcap = 256, tlen;
    char *text = pd_alloc(tcap);
    if (!text) return -1;
    for (size_t i = 0; i < n && !rc; line++) {
        const char *nl = memchr(s + i, '\n', n - i);
        size_t e = nl ? (size_t)(nl - s) : n;
        if (has_text(s + i, e - i)) {
            json_error_t err;
            json_t *o = json_loadb(s + i, e - i, JSON_DECODE_ANY, &err);
            if (!json_is_object(o))
                rc = pd_error("%s:%d: not a JSON object%s%s", what, line + 1, o ? "" : ": ", o ? "" : err.text);
            tlen = 0;
            for (int k = 0; k < n_names && !rc; k++) {
                json_t *v = json_object_get(o, names[k]);
                if (v && field_text(v, &text, &tlen, &tcap)) rc = -1;
            }
            if (!rc && has_text(text, tlen)) rc = add_record(ds, &cap, text, tlen);
            json_decref(o);
        }
        i = e + 1;
    }
    free(text);
    return rc;
}

int dataset_parse(TextSet *ds, const void *bytes, size_t n, const char *fields, const char *what) {
    memset(ds, 0, sizeof *ds);
    const unsigned char *b = bytes;
    char *inflated = NULL;
    if (n >= 2 && b[0] == 0x1f && b[1] == 0x8b) {
        if (pd_gunzip(b, n, &inflated, &n, what)) return -1;
        b = (const unsigned char *)inflated;
    } else if (n >= 4 && b[0] == 0x28 && b[1] == 0xb5 && b[2] == 0x2f && b[3] == 0xfd) { /* zstd's magic */
        if (pd_unzstd(b, n, &inflated, &n, what)) return -1;
        b = (const unsigned char *)inflated;
    }
    const char *s = (const char *)b;
    size_t i = 0;
    while (i < n && is_space(s[i])) i++;
    int rc = 0;
    if (n == 0) rc = pd_error("%s: empty", what);
    else if (i < n && s[i] == '{') rc = parse_jsonl(ds, s, n, fields ? fields : "text", what);
    else rc = parse_plain(ds, s, n, what);
    if (!rc && ds->n == 0)
        rc = i < n && s[i] == '{'
                 ? pd_error("%s: no usable text: no record has text in field(s) '%s'", what, fields ? fields : "text")
                 : pd_error("%s: no usable text", what);
    if (!rc) {
        XXH128_hash_t d = XXH3_128bits(s, n);
        snprintf(ds->digest, sizeof ds->digest, "%016llx%016llx", (unsigned long long)d.high64,
                 (unsigned long long)d.low64);
        ds->bytes = n;
    }
    free(inflated);
    if (rc) dataset_free(ds);
    return rc;
}

int dataset_read(TextSet *ds, const char *path, const char *fields) {
    char *data;
    size_t n;
    memset(ds, 0, sizeof *ds);
    if (pd_read_file(path, &data, &n)) return -1;
    int rc = dataset_parse(ds, data, n, fields, path);
    free(data);
    return rc;
}

void dataset_free(TextSet *ds) {
    for (int i = 0; i < ds->n; i++) free(ds->text[i]);
    free(ds->text);
    free(ds->len);
    memset(ds, 0, sizeof *ds);
}

/* ---- tokenizing and packing ---- */

typedef struct {
    int32_t *tok;
    int64_t n, cap;
    int64_t *off; /* sequence starts, then the end */
    int n_seq, cap_seq;
} Packer;

static int pk_push_tokens(Packer *p, const int32_t *t, int64_t k) {
    if (p->n + k > p->cap) {
        int64_t nc = (p->n + k) * 2;
        int32_t *nt = pd_realloc(p->tok, pd_mul(sizeof(int32_t), (size_t)nc));
        if (!nt) return -1;
        p->tok = nt;
        p->cap = nc;
    }
    memcpy(p->tok + p->n, t, sizeof(int32_t) * k);
    p->n += k;
    return 0;
}

static int pk_start(Packer *p) {
    if (p->n_seq + 2 > p->cap_seq) {
        int nc = (p->n_seq + 2) * 2;
        int64_t *no = pd_realloc(p->off, sizeof(int64_t) * nc);
        if (!no) return -1;
        p->off = no;
        p->cap_seq = nc;
    }
    p->off[p->n_seq++] = p->n;
    return 0;
}

/* a record packs into the open sequence when it fits whole; else it starts one */
static int pk_record(Packer *p, const int32_t *t, int k, int seq_len) {
    int64_t cur = p->n_seq ? p->n - p->off[p->n_seq - 1] : seq_len;
    if (cur + k > seq_len) cur = seq_len;
    while (k > 0) {
        if (cur == seq_len) {
            if (pk_start(p)) return -1;
            cur = 0;
        }
        int take = k < seq_len - cur ? k : (int)(seq_len - cur);
        if (pk_push_tokens(p, t, take)) return -1;
        t += take;
        k -= take;
        cur += take;
    }
    return 0;
}

/* sequences whose index i has held[i] == want, copied out of the packer */
static int seqs_pick(Sequences *s, const Packer *p, const char *held, char want) {
    memset(s, 0, sizeof *s);
    int count = 0;
    int64_t n = 0;
    for (int i = 0; i < p->n_seq; i++)
        if (held[i] == want) count++, n += p->off[i + 1] - p->off[i];
    s->tok = pd_alloc(pd_mul(sizeof(int32_t), (size_t)n));
    s->off = pd_alloc(sizeof(int64_t) * (count + 1));
    if (!s->tok || !s->off) {
        seqs_free(s);
        return -1;
    }
    for (int i = 0; i < p->n_seq; i++) {
        if (held[i] != want) continue;
        int len = (int)(p->off[i + 1] - p->off[i]);
        memcpy(s->tok + s->off[s->n], p->tok + p->off[i], sizeof(int32_t) * len);
        s->off[s->n + 1] = s->off[s->n] + len;
        s->n++;
        if (len > s->max_len) s->max_len = len;
    }
    return 0;
}

int dataset_sequences(const TextSet *ds, const Tokenizer *tok, int seq_len, double heldout_frac, int special,
                      Sequences *train, Sequences *heldout, const char *what) {
    memset(train, 0, sizeof *train);
    memset(heldout, 0, sizeof *heldout);
    if (seq_len < 1) return pd_error("%s: sequence length %d", what, seq_len);
    if (!(heldout_frac > 0 && heldout_frac < 1)) return pd_error("%s: held-out fraction %g", what, heldout_frac);
    Packer p = {0};
    int rc = 0, flags = (tok_add_bos(tok) ? TOK_ADD_BOS : 0) | (special ? TOK_SPECIAL : 0);
    for (int r = 0; r < ds->n && !rc; r++) {
        int32_t *ids;
        int k;
        if (tok_encode_flags(tok, ds->text[r], ds->len[r], flags, &ids, &k)) {
            rc = pd_error_prefix(what);
            break;
        }
        rc = pk_record(&p, ids, k, seq_len);
        free(ids);
    }
    if (!rc) p.off[p.n_seq] = p.n;
    if (!rc && p.n_seq < 2)
        rc = pd_error("%s: too little text: %lld tokens make %d sequence(s) of up to %d; need two (one held out)", what,
                      (long long)p.n, p.n_seq, seq_len);
    char *held = rc ? NULL : pd_alloc(p.n_seq);
    if (held) {
        /* every stride-th sequence, spread over the whole text: a text's regions differ
           (on TinyStories, coverage at γ 0.75 moves by ±1.5 points between tenths) */
        int stride = (int)(1 / heldout_frac + 0.5), n_held = 0;
        stride = stride < 2 ? 2 : stride;
        for (int i = stride - 1; i < p.n_seq; i += stride) held[i] = 1, n_held++;
        if (!n_held) held[p.n_seq - 1] = 1;
        rc = seqs_pick(train, &p, held, 0) || seqs_pick(heldout, &p, held, 1);
        if (rc) seqs_free(train);
    } else rc = -1;
    free(held);
    free(p.tok);
    free(p.off);
    return rc ? -1 : 0;
}

void seqs_free(Sequences *s) {
    free(s->tok);
    free(s->off);
    memset(s, 0, sizeof *s);
}
