/* recipe.c — recipes/NAME.yaml into a checked Recipe (see recipe.h), and the prompts
   its datasets give. The YAML is loaded as a libyaml document (nodes carry their line),
   then each section is read by key: every key is looked up in the section's list first,
   so an unknown or repeated key is reported at its own line before any value is read. */
#include "recipe/recipe.h"

#include <ctype.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <yaml.h>

#include "decode/method.h"
#include "heads/eagle_head.h" /* EAGLE_MAX_STEPS */
#include "tokenizer/chat.h"

/* the datasets paradec knows: file under the data folders, prompt template, and the
   seed guidance for adadecode's γ (0 = none: not a benchmark set) */
static const struct {
    const char *name, *file, *tmpl;
    float gamma;
} KNOWN[] = {
    {"xsum", "datasets/xsum/test_1000.jsonl.gz", "Summarize this article in one sentence.\n\n{document:1200}", 0.65f},
    {"humaneval", "datasets/humaneval/HumanEval.jsonl.gz", "Complete this Python function.\n\n{prompt}", 0.85f},
    {"gsm8k", "datasets/gsm8k/test.jsonl.gz", "{question}", 0.9f},
    {"tinystories", "datasets/tinystories/tinystories_val_sample.txt.gz", "{text:6w}", 0.65f},
    {"spec_bench", "datasets/spec_bench/question.jsonl.gz", "{turns}", 0},
    {"mt_bench", "datasets/mt_bench/question.jsonl", "{turns}", 0},
};
#define N_KNOWN (int)(sizeof KNOWN / sizeof KNOWN[0])
#define DEFAULT_GAMMA 0.75f
#define MAX_JSON_NODES 4096 /* random.config: aliases could make a small file a huge tree */

typedef struct {
    yaml_document_t doc;
    const char *name; /* the file, for messages */
    const char *hint; /* model.hint: said when the model's path is not set */
    int nodes;        /* visited while converting to JSON */
} P;

static yaml_node_t *node(P *p, int id) { return yaml_document_get_node(&p->doc, id); }
static int line_of(const yaml_node_t *n) { return (int)n->start_mark.line + 1; }

/* a key or value fit for a one-line message: control bytes become '?', long ones are cut */
static const char *shown(const char *s, size_t n, char *buf, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < n && k + 4 < cap; i++) buf[k++] = (unsigned char)s[i] < 32 || s[i] == 127 ? '?' : s[i];
    if (n > cap - 4) memcpy(buf + cap - 4, "...", 3), k = cap - 1;
    buf[k] = 0;
    return buf;
}

/* a mapping's or list's own line is its first item's; the key that holds it reads better */
static const yaml_node_t *key_of(P *p, const yaml_node_t *v) {
    if (!v || v->type == YAML_SCALAR_NODE) return v;
    int id = (int)(v - p->doc.nodes.start) + 1;
    for (yaml_node_t *m = p->doc.nodes.start; m < p->doc.nodes.top; m++)
        if (m->type == YAML_MAPPING_NODE)
            for (yaml_node_pair_t *a = m->data.mapping.pairs.start; a < m->data.mapping.pairs.top; a++)
                if (a->value == id) return node(p, a->key);
    return v;
}

__attribute__((format(printf, 4, 5))) static int bad(P *p, const yaml_node_t *n, const char *key, const char *fmt,
                                                     ...) {
    char msg[700], k[64];
    n = key_of(p, n);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return pd_error("%s:%d: key '%s': %s", p->name, n ? line_of(n) : 1, shown(key, strlen(key), k, sizeof k), msg);
}

static int is_scalar(const yaml_node_t *n) { return n && n->type == YAML_SCALAR_NODE; }
static const char *sval(const yaml_node_t *n) { return (const char *)n->data.scalar.value; }
static size_t slen(const yaml_node_t *n) { return n->data.scalar.length; }
static int plain(const yaml_node_t *n) { return n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE; }
static int is_null(const yaml_node_t *n) {
    return is_scalar(n) && plain(n) && (!slen(n) || !strcmp(sval(n), "~") || !strcmp(sval(n), "null"));
}
static const char *type_name(const yaml_node_t *n) {
    return n->type == YAML_MAPPING_NODE ? "a mapping" : n->type == YAML_SEQUENCE_NODE ? "a list" : "a value";
}

/* ---- sections: known keys, each at most once ---- */

static int check_keys(P *p, yaml_node_t *map, const char *section, const char *const *known) {
    for (yaml_node_pair_t *a = map->data.mapping.pairs.start; a < map->data.mapping.pairs.top; a++) {
        yaml_node_t *k = node(p, a->key);
        char buf[64];
        if (!is_scalar(k)) return bad(p, k, "?", "a key in %s must be a plain word, not %s", section, type_name(k));
        int found = 0;
        for (int i = 0; known[i]; i++) found |= slen(k) == strlen(known[i]) && !memcmp(sval(k), known[i], slen(k));
        if (!found) {
            char list[400] = "";
            for (int i = 0; known[i]; i++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", known[i]);
            return bad(p, k, shown(sval(k), slen(k), buf, sizeof buf), "unknown key in %s (known: %s)", section, list);
        }
        for (yaml_node_pair_t *b = map->data.mapping.pairs.start; b < a; b++) {
            yaml_node_t *kb = node(p, b->key);
            if (is_scalar(kb) && slen(kb) == slen(k) && !memcmp(sval(kb), sval(k), slen(k)))
                return bad(p, k, sval(k), "given twice in %s (first on line %d)", section, line_of(kb));
        }
    }
    return 0;
}

/* the value of a (checked) key, NULL when absent */
static yaml_node_t *get(P *p, yaml_node_t *map, const char *key) {
    for (yaml_node_pair_t *a = map->data.mapping.pairs.start; a < map->data.mapping.pairs.top; a++) {
        yaml_node_t *k = node(p, a->key);
        if (is_scalar(k) && !strcmp(sval(k), key)) return node(p, a->value);
    }
    return NULL;
}

static int want_map(P *p, yaml_node_t *v, const char *key) {
    if (v->type != YAML_MAPPING_NODE)
        return bad(p, v, key, "must be a mapping (indented keys below it), not %s", type_name(v));
    return 0;
}

/* ---- scalars ---- */

static int as_str(P *p, yaml_node_t *v, const char *key, char **out) {
    if (!is_scalar(v)) return bad(p, v, key, "must be text, not %s", type_name(v));
    if (is_null(v) || !slen(v)) return bad(p, v, key, "is empty");
    if (strlen(sval(v)) != slen(v)) return bad(p, v, key, "holds a NUL byte");
    free(*out);
    return (*out = pd_strdup(sval(v))) ? 0 : -1;
}

static int as_int(P *p, yaml_node_t *v, const char *key, long lo, long hi, int *out) {
    char buf[64];
    if (!is_scalar(v)) return bad(p, v, key, "must be a whole number, not %s", type_name(v));
    char *end;
    long x = strtol(sval(v), &end, 10);
    if (!slen(v) || end != sval(v) + slen(v) || isspace((unsigned char)sval(v)[0]) || x < lo || x > hi)
        return bad(p, v, key, "'%s' is not a whole number in [%ld, %ld]", shown(sval(v), slen(v), buf, sizeof buf), lo,
                   hi);
    *out = (int)x;
    return 0;
}

static int as_num(P *p, yaml_node_t *v, const char *key, double lo, double hi, double *out) {
    char buf[64];
    if (!is_scalar(v)) return bad(p, v, key, "must be a number, not %s", type_name(v));
    char *end;
    double x = strtod(sval(v), &end);
    if (!slen(v) || end != sval(v) + slen(v) || isspace((unsigned char)sval(v)[0]) || !(x >= lo && x <= hi))
        return bad(p, v, key, "'%s' is not a number in [%g, %g]", shown(sval(v), slen(v), buf, sizeof buf), lo, hi);
    *out = x;
    return 0;
}

static int as_float(P *p, yaml_node_t *v, const char *key, double lo, double hi, float *out) {
    double x;
    if (as_num(p, v, key, lo, hi, &x)) return -1;
    *out = (float)x;
    return 0;
}

static int as_bool(P *p, yaml_node_t *v, const char *key, int *out) {
    static const char *const yes[] = {"true", "yes", "on", "True", "Yes", "On", "TRUE"};
    static const char *const no[] = {"false", "no", "off", "False", "No", "Off", "FALSE"};
    char buf[64];
    if (is_scalar(v) && plain(v))
        for (int i = 0; i < 7; i++) {
            if (!strcmp(sval(v), yes[i])) return *out = 1, 0;
            if (!strcmp(sval(v), no[i])) return *out = 0, 0;
        }
    return bad(p, v, key, "'%s' is not true or false",
               is_scalar(v) ? shown(sval(v), slen(v), buf, sizeof buf) : type_name(v));
}

/* a list of items, or one scalar holding them comma-separated ("8,16,24"): joined
   with commas into *out after each item passed check(item) */
static int as_list(P *p, yaml_node_t *v, const char *key, int max, int (*check)(P *, yaml_node_t *, const char *),
                   char **out, int *count) {
    char buf[1024] = "";
    int n = 0;
    if (is_scalar(v)) {
        if (is_null(v) || !slen(v)) return bad(p, v, key, "is empty");
        if (strlen(sval(v)) != slen(v) || slen(v) >= sizeof buf) return bad(p, v, key, "is not a list");
        /* a comma-separated scalar: each piece is checked as its own scalar */
        snprintf(buf, sizeof buf, "%s", sval(v));
        for (char *s = buf, *e;; s = e + 1) {
            e = strchr(s, ',');
            size_t len = e ? (size_t)(e - s) : strlen(s);
            while (len && isspace((unsigned char)s[0])) s++, len--;
            while (len && isspace((unsigned char)s[len - 1])) len--;
            yaml_node_t item = *v;
            char one[256];
            snprintf(one, sizeof one, "%.*s", (int)len, s);
            item.data.scalar.value = (yaml_char_t *)one, item.data.scalar.length = strlen(one);
            if (!len) return bad(p, v, key, "has an empty item");
            if (++n > max) return bad(p, v, key, "has more than %d items", max);
            if (check && check(p, &item, key)) return -1;
            if (!e) break;
        }
        for (char *c = buf; *c; c++)
            if (isspace((unsigned char)*c)) memmove(c, c + 1, strlen(c)), c--;
    } else if (v->type == YAML_SEQUENCE_NODE) {
        for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
            yaml_node_t *x = node(p, *it);
            if (!is_scalar(x) || is_null(x) || !slen(x) || strlen(sval(x)) != slen(x) || strchr(sval(x), ','))
                return bad(p, x, key, "has an item that is not a single value");
            if (++n > max) return bad(p, x, key, "has more than %d items", max);
            if (check && check(p, x, key)) return -1;
            if (strlen(buf) + slen(x) + 2 > sizeof buf) return bad(p, x, key, "is too long");
            snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", n > 1 ? "," : "", sval(x));
        }
        if (!n) return bad(p, v, key, "is an empty list");
    } else return bad(p, v, key, "must be a list, not %s", type_name(v));
    if (count) *count = n;
    free(*out);
    return (*out = pd_strdup(buf)) ? 0 : -1;
}

static int item_layer(P *p, yaml_node_t *v, const char *key) {
    int x;
    return as_int(p, v, key, 1, 1 << 20, &x);
}
static int item_weight(P *p, yaml_node_t *v, const char *key) {
    double x;
    return as_num(p, v, key, 1e-6, 1e6, &x);
}
static int item_rate(P *p, yaml_node_t *v, const char *key) {
    double x;
    return as_num(p, v, key, 0, 1, &x);
}
static int item_field(P *p, yaml_node_t *v, const char *key) {
    for (size_t i = 0; i < slen(v); i++)
        if (!isalnum((unsigned char)sval(v)[i]) && sval(v)[i] != '_' && sval(v)[i] != '-')
            return bad(p, v, key, "field names are letters, digits, '_' and '-'");
    return 0;
}

/* ---- paths ---- */

/* $VAR, ${VAR}, ${VAR:-default}, a leading ~/ ; $PARADEC_CACHE defaults to the cache */
static int expand(P *p, yaml_node_t *v, const char *key, char **out) {
    const char *s = sval(v);
    size_t cap = 256, n = 0;
    char *o = pd_alloc(cap);
    if (!o) return -1;
#define PUT(src, len)                                                                                                  \
    do {                                                                                                               \
        size_t l_ = (len);                                                                                             \
        while (n + l_ + 1 > cap) {                                                                                     \
            char *g_ = pd_realloc(o, cap *= 2);                                                                        \
            if (!g_) return free(o), -1;                                                                               \
            o = g_;                                                                                                    \
        }                                                                                                              \
        memcpy(o + n, (src), l_), n += l_;                                                                             \
    } while (0)
    if (s[0] == '~' && s[1] == '/') {
        const char *home = getenv("HOME");
        if (!home || !home[0]) return free(o), bad(p, v, key, "~/ used but $HOME is not set");
        PUT(home, strlen(home));
        s++;
    }
    while (*s) {
        if (*s != '$') {
            PUT(s, 1);
            s++;
            continue;
        }
        char name[128], def[1024];
        int has_def = 0;
        const char *e;
        if (s[1] == '{') {
            e = strchr(s + 2, '}');
            const char *colon = e ? strstr(s + 2, ":-") : NULL;
            if (colon && colon > e) colon = NULL;
            const char *name_end = colon ? colon : e;
            if (!e || name_end == s + 2 || (size_t)(name_end - s - 2) >= sizeof name ||
                (colon && (size_t)(e - colon - 2) >= sizeof def))
                return free(o), bad(p, v, key, "a ${...} that does not close or names nothing");
            snprintf(name, sizeof name, "%.*s", (int)(name_end - s - 2), s + 2);
            if (colon) has_def = 1, snprintf(def, sizeof def, "%.*s", (int)(e - colon - 2), colon + 2);
            e++;
        } else {
            e = s + 1;
            while (isalnum((unsigned char)*e) || *e == '_') e++;
            if (e == s + 1 || (size_t)(e - s - 1) >= sizeof name)
                return free(o), bad(p, v, key, "a '$' that names no variable");
            snprintf(name, sizeof name, "%.*s", (int)(e - s - 1), s + 1);
        }
        for (const char *c = name; *c; c++)
            if (!isalnum((unsigned char)*c) && *c != '_')
                return free(o), bad(p, v, key, "'%s' is not a variable name", name);
        const char *val = getenv(name);
        if ((!val || !val[0]) && !strcmp(name, "PARADEC_CACHE")) val = pd_cache_dir();
        if ((!val || !val[0]) && has_def) val = def;
        if (!val || !val[0])
            return free(o), bad(p, v, key, "$%s is not set%s%s", name, p->hint ? ": " : "", p->hint ? p->hint : "");
        PUT(val, strlen(val));
        s = e;
    }
#undef PUT
    o[n] = 0;
    *out = o;
    return 0;
}

/* a path the make rules and shell commands can carry as one word */
static int make_safe(const char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 33 || strchr(":#$%;'\"\\`|&<>()*?[]{}=!", *s)) return 0;
    return 1;
}

/* expanded, then as given or under the data folders; kind: 'f' a file, 'd' a
   directory, 'a' either */
static int as_path(P *p, yaml_node_t *v, const char *key, int kind, char **out) {
    char *s = NULL, found[4096], buf[200];
    if (!is_scalar(v) || is_null(v) || !slen(v) || strlen(sval(v)) != slen(v))
        return bad(p, v, key, "must be a path, not %s", is_scalar(v) ? "an empty value" : type_name(v));
    if (expand(p, v, key, &s)) return -1;
    struct stat st;
    int ok = !stat(s, &st);
    if (ok) snprintf(found, sizeof found, "%s", s);
    else if (s[0] != '/' && !pd_data_path(s, found, sizeof found) && !stat(found, &st)) ok = 1;
    if (!ok) {
        int rc = bad(p, v, key, "'%s' does not exist%s%s%s", shown(s, strlen(s), buf, sizeof buf),
                     s[0] == '/' ? "" : " (nor under $PARADEC_DATA, data/, the cache or ../shared/data)",
                     p->hint ? ": " : "", p->hint ? p->hint : "");
        free(s);
        return rc;
    }
    free(s);
    if (kind == 'f' && S_ISDIR(st.st_mode))
        return bad(p, v, key, "'%s' is a directory, not a file", shown(found, strlen(found), buf, sizeof buf));
    if (kind == 'd' && !S_ISDIR(st.st_mode))
        return bad(p, v, key, "'%s' is not a directory", shown(found, strlen(found), buf, sizeof buf));
    if (!make_safe(found))
        return bad(p, v, key,
                   "'%s' has a space or a character make cannot take (:#$%%;'\"...): link it from a plainer path",
                   shown(found, strlen(found), buf, sizeof buf));
    free(*out);
    return (*out = pd_strdup(found)) ? 0 : -1;
}

/* ---- templates ---- */

/* "{field}", "{field:N}", "{field:Nw}", "{{", "}}": NULL when fine, else what is wrong */
static const char *template_error(const char *t) {
    int fields = 0;
    for (const char *s = t; *s; s++) {
        if (s[0] == '{' && s[1] == '{') {
            s++;
            continue;
        }
        if (s[0] == '}' && s[1] == '}') {
            s++;
            continue;
        }
        if (*s == '}') return "a '}' without its '{' (write '}}' for a brace)";
        if (*s != '{') continue;
        const char *e = strchr(s, '}');
        if (!e) return "a '{' without its '}' (write '{{' for a brace)";
        const char *c = s + 1;
        while (c < e && (isalnum((unsigned char)*c) || *c == '_' || *c == '-')) c++;
        if (c == s + 1) return "a {} that names no field";
        if (c < e) {
            if (*c++ != ':' || c == e || !isdigit((unsigned char)*c)) return "a field is {name}, {name:N} or {name:Nw}";
            long lim = strtol(c, (char **)&c, 10);
            if (lim < 1 || lim > 1000000) return "a limit is between 1 and 1000000";
            if (c < e && *c == 'w') c++;
            if (c != e) return "a field is {name}, {name:N} or {name:Nw}";
        }
        fields++;
        s = e;
    }
    return fields ? NULL : "names no field ({document}, {question}, ...)";
}

/* a field's value as text: a string, an array's first string, a number */
static const char *field_text(const json_t *rec, const char *text, const char *name, char *num, size_t cap) {
    if (!rec) return !strcmp(name, "text") ? text : NULL;
    json_t *v = json_object_get(rec, name);
    if (json_is_array(v)) v = json_array_get(v, 0);
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_integer(v)) return snprintf(num, cap, "%lld", (long long)json_integer_value(v)), num;
    if (json_is_real(v)) return snprintf(num, cap, "%g", json_real_value(v)), num;
    return NULL;
}

/* a growing output string */
typedef struct {
    char *s;
    size_t n, cap;
} Buf;

static int buf_put(Buf *b, const char *src, size_t len) {
    if (b->n + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (b->n + len + 1 > cap) cap *= 2;
        char *g = pd_realloc(b->s, cap);
        if (!g) return -1;
        b->s = g, b->cap = cap;
    }
    memcpy(b->s + b->n, src, len);
    b->s[b->n += len] = 0;
    return 0;
}

/* the first lim words of s, single spaces between them; *short_rec = 1 when fewer */
static int put_words(Buf *b, const char *s, long lim, int *short_rec) {
    int nw = 0;
    while (nw < lim) {
        while (*s && isspace((unsigned char)*s)) s++;
        if (!*s) break;
        const char *e = s;
        while (*e && !isspace((unsigned char)*e)) e++;
        if ((nw && buf_put(b, " ", 1)) || buf_put(b, s, e - s)) return -1;
        nw++, s = e;
    }
    if (nw < lim) *short_rec = 1;
    return 0;
}

/* renders a checked template; *short_rec = 1 when a {f:Nw} field had fewer than N words */
static char *render(const char *tmpl, const json_t *rec, const char *text, const char *what, int *short_rec) {
    Buf b = {0};
    char num[64], name[128];
    int rc = buf_put(&b, "", 0);
    for (const char *s = tmpl; *s && !rc; s++) {
        if ((s[0] == '{' && s[1] == '{') || (s[0] == '}' && s[1] == '}')) {
            rc = buf_put(&b, s++, 1);
            continue;
        }
        if (*s != '{') {
            rc = buf_put(&b, s, 1);
            continue;
        }
        const char *e = strchr(s, '}'), *c = s + 1;
        long lim = 0;
        int words = 0;
        while (c < e && *c != ':') c++;
        snprintf(name, sizeof name, "%.*s", (int)(c - s - 1), s + 1);
        if (c < e) lim = strtol(c + 1, (char **)&c, 10), words = *c == 'w';
        const char *v = field_text(rec, text, name, num, sizeof num);
        if (!v) rc = pd_error("%s: a record has no text field '%s' (the template names it)", what, name);
        else if (words) rc = put_words(&b, v, lim, short_rec);
        else {
            size_t len = strlen(v);
            if (lim && (size_t)lim < len) { /* bytes, cut back to a UTF-8 character's start */
                len = (size_t)lim;
                while (len && ((unsigned char)v[len] & 0xC0) == 0x80) len--;
            }
            rc = buf_put(&b, v, len);
        }
        s = e;
    }
    if (rc) free(b.s), b.s = NULL;
    return b.s;
}

char *recipe_render(const char *tmpl, const void *rec, const char *text, const char *what) {
    int short_rec = 0;
    const char *e = template_error(tmpl);
    if (e) return pd_error("%s: template: %s", what, e), NULL;
    return render(tmpl, rec, text, what, &short_rec);
}

/* ---- sections ---- */

static int known_dataset(const char *name) {
    for (int i = 0; i < N_KNOWN; i++)
        if (!strcmp(KNOWN[i].name, name)) return i;
    return -1;
}

static const char *known_names(void) {
    static char buf[256];
    buf[0] = 0;
    for (int i = 0; i < N_KNOWN; i++)
        snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%s%s", i ? ", " : "", KNOWN[i].name);
    return buf;
}

static void dataset_free(RecipeDataset *d) {
    free(d->name);
    free(d->file);
    free(d->tmpl);
    free(d->system);
    memset(d, 0, sizeof *d);
}

/* one dataset: a name, or a mapping; samples / max_new / chat default to the list's */
static int read_dataset(P *p, yaml_node_t *v, const RecipeDataset *def, float gamma, RecipeDataset *d) {
    static const char *const keys[] = {"name", "file",   "template", "samples", "max_new",
                                       "chat", "system", "gamma",    NULL};
    yaml_node_t *x, *nm = v;
    d->samples = def->samples, d->max_new = def->max_new, d->chat = def->chat, d->line = line_of(v);
    d->part = def->part, d->eval_pct = def->eval_pct;
    if (v->type == YAML_MAPPING_NODE) {
        if (check_keys(p, v, "a dataset", keys)) return -1;
        nm = get(p, v, "name");
    } else if (!is_scalar(v))
        return bad(p, v, "datasets", "an item must be a dataset's name or a mapping, not %s", type_name(v));
    if (nm && (as_str(p, nm, "name", &d->name) || item_field(p, nm, "name"))) return -1;
    int k = d->name ? known_dataset(d->name) : -1;
    if (v->type == YAML_MAPPING_NODE) {
        if ((x = get(p, v, "file")) && as_path(p, x, "file", 'f', &d->file)) return -1;
        if ((x = get(p, v, "template")) && as_str(p, x, "template", &d->tmpl)) return -1;
        if (x && template_error(d->tmpl)) return bad(p, x, "template", "%s", template_error(d->tmpl));
        if ((x = get(p, v, "samples")) && as_int(p, x, "samples", 1, 100000, &d->samples)) return -1;
        if ((x = get(p, v, "max_new")) && as_int(p, x, "max_new", 1, 1 << 20, &d->max_new)) return -1;
        if ((x = get(p, v, "chat")) && as_bool(p, x, "chat", &d->chat)) return -1;
        if ((x = get(p, v, "system")) && as_str(p, x, "system", &d->system)) return -1;
        if ((x = get(p, v, "gamma")) && as_float(p, x, "gamma", 1e-6, 1, &d->gamma)) return -1;
    }
    if (!d->name && !d->file) return bad(p, v, "name", "a dataset needs a name (%s) or a file", known_names());
    if (k < 0 && !d->file)
        return bad(p, nm, "name", "unknown dataset '%s' (known: %s; for another give 'file' and 'template')", d->name,
                   known_names());
    if (k < 0 && !d->tmpl)
        return bad(p, v, "template", "dataset '%s' is not one paradec knows: it needs a template",
                   d->name ? d->name : d->file);
    if (!d->name) { /* the file's base name, up to its first dot */
        const char *b = strrchr(d->file, '/');
        b = b ? b + 1 : d->file;
        if (!(d->name = strndup(b, strcspn(b, ".")))) return pd_error("out of memory");
    }
    if (!d->file) {
        char path[4096];
        if (pd_data_path(KNOWN[k].file, path, sizeof path))
            return bad(p, nm, "name",
                       "dataset '%s': %s not found under $PARADEC_DATA, data/, the cache or ../shared/data", d->name,
                       KNOWN[k].file);
        if (!(d->file = pd_strdup(path))) return -1;
    }
    if (!d->tmpl && !(d->tmpl = pd_strdup(KNOWN[k].tmpl))) return -1;
    if (!d->gamma) d->gamma = gamma > 0 ? gamma : k >= 0 && KNOWN[k].gamma > 0 ? KNOWN[k].gamma : DEFAULT_GAMMA;
    return 0;
}

static int read_datasets(P *p, yaml_node_t *v, const char *key, const RecipeDataset *def, float gamma,
                         RecipeDataset *ds, int *n) {
    if (v->type != YAML_SEQUENCE_NODE) return bad(p, v, key, "must be a list of datasets, not %s", type_name(v));
    for (yaml_node_item_t *it = v->data.sequence.items.start; it < v->data.sequence.items.top; it++) {
        yaml_node_t *x = node(p, *it);
        if (*n == RECIPE_MAX_DATASETS) return bad(p, x, key, "more than %d datasets", RECIPE_MAX_DATASETS);
        int rc = read_dataset(p, x, def, gamma, &ds[*n]);
        for (int j = 0; j < *n && !rc; j++)
            if (!strcmp(ds[j].name, ds[*n].name))
                rc = bad(p, x, key, "dataset '%s' twice (first on line %d)", ds[j].name, ds[j].line);
        if (rc) return dataset_free(&ds[*n]), -1; /* recipe_free frees the first *n */
        (*n)++;
    }
    if (!*n) return bad(p, v, key, "is an empty list");
    return 0;
}

/* a YAML tree as JSON: plain scalars that read as numbers, booleans or null are those */
static json_t *to_json(P *p, yaml_node_t *v, int depth) {
    if (++p->nodes > MAX_JSON_NODES || depth > 16) return bad(p, v, "config", "is nested too deep or too big"), NULL;
    if (v->type == YAML_MAPPING_NODE) {
        json_t *o = json_object();
        for (yaml_node_pair_t *a = v->data.mapping.pairs.start; o && a < v->data.mapping.pairs.top; a++) {
            yaml_node_t *k = node(p, a->key);
            if (!is_scalar(k) || strlen(sval(k)) != slen(k))
                return json_decref(o), bad(p, k, "config", "has a key that is not plain text"), NULL;
            json_t *x = to_json(p, node(p, a->value), depth + 1);
            if (!x) return json_decref(o), NULL;
            if (json_object_set_new(o, sval(k), x))
                return json_decref(o), bad(p, k, "config", "has a key that is not UTF-8"), NULL;
        }
        return o;
    }
    if (v->type == YAML_SEQUENCE_NODE) {
        json_t *a = json_array();
        for (yaml_node_item_t *it = v->data.sequence.items.start; a && it < v->data.sequence.items.top; it++) {
            json_t *x = to_json(p, node(p, *it), depth + 1);
            if (!x) return json_decref(a), NULL;
            json_array_append_new(a, x);
        }
        return a;
    }
    const char *s = sval(v);
    if (strlen(s) != slen(v)) return bad(p, v, "config", "holds a NUL byte"), NULL;
    if (plain(v) && slen(v) && !isspace((unsigned char)s[0])) {
        char *end;
        long long i = strtoll(s, &end, 10);
        if (!*end) return json_integer(i);
        double d = strtod(s, &end);
        if (!*end) return json_real(d);
        if (!strcmp(s, "true")) return json_true();
        if (!strcmp(s, "false")) return json_false();
    }
    if (is_null(v)) return json_null();
    json_t *str = json_stringn(s, slen(v));
    if (!str) bad(p, v, "config", "is not valid UTF-8");
    return str;
}

static int read_model(P *p, yaml_node_t *v, Recipe *r) {
    static const char *const keys[] = {"source", "tokenizer", "dtype", "random", "about", "hint", NULL};
    static const char *const rkeys[] = {"config", "seed", "chat_template", NULL};
    RecipeModel *m = &r->model;
    yaml_node_t *x, *rnd;
    if (want_map(p, v, "model") || check_keys(p, v, "model", keys)) return -1;
    if ((x = get(p, v, "hint"))) {
        if (!is_scalar(x) || is_null(x) || strlen(sval(x)) != slen(x)) return bad(p, x, "hint", "must be text");
        p->hint = sval(x);
    }
    if ((x = get(p, v, "about")) && as_str(p, x, "about", &m->about)) return -1;
    yaml_node_t *src = get(p, v, "source");
    rnd = get(p, v, "random");
    if (!src && !rnd) return bad(p, v, "model", "needs 'source' (a checkpoint) or 'random' (random weights)");
    if (src && rnd) return bad(p, rnd, "random", "'source' and 'random' exclude each other");
    if (src && as_path(p, src, "source", 'a', &m->source)) return -1;
    if ((x = get(p, v, "tokenizer")) && as_path(p, x, "tokenizer", 'f', &m->tokenizer)) return -1;
    if ((x = get(p, v, "dtype")) && as_str(p, x, "dtype", &m->dtype)) return -1;
    if (!m->dtype && !(m->dtype = pd_strdup("f32"))) return -1;
    if (strcmp(m->dtype, "f32") && strcmp(m->dtype, "bf16"))
        return bad(p, x, "dtype", "'%s' is not f32 or bf16", m->dtype);
    if (m->source) { /* a Hugging Face directory has its config.json */
        struct stat st;
        char cfg[4200];
        snprintf(cfg, sizeof cfg, "%s/config.json", m->source);
        if (!stat(m->source, &st) && S_ISDIR(st.st_mode) && access(cfg, R_OK))
            return bad(p, src, "source", "'%s' is a directory without config.json (not a Hugging Face checkpoint)",
                       m->source);
    }
    if (!rnd) return 0;
    if (want_map(p, rnd, "random") || check_keys(p, rnd, "model.random", rkeys)) return -1;
    if (!m->tokenizer) return bad(p, rnd, "random", "random weights need model.tokenizer (the vocabulary)");
    if ((x = get(p, rnd, "seed")) && as_int(p, x, "seed", 0, 0x7fffffff, &m->random_seed)) return -1;
    if ((x = get(p, rnd, "chat_template")) && as_path(p, x, "chat_template", 'f', &m->chat_template)) return -1;
    if (!(x = get(p, rnd, "config")))
        return bad(p, rnd, "random", "needs 'config' (the model's shape, Hugging Face key names)");
    if (want_map(p, x, "config")) return -1;
    json_t *j = to_json(p, x, 0);
    if (!j) return -1;
    if (!json_object_get(j, "architecture")) json_object_set_new(j, "architecture", json_string("llama"));
    m->random_config = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    Config c;
    if (!m->random_config) return pd_error("out of memory");
    if (config_from_json(&c, m->random_config, "config")) return bad(p, x, "config", "%s", pd_errmsg());
    return 0;
}

/* data: a path, or "answers" (the answers section's file) */
static int read_data(P *p, yaml_node_t *v, const Recipe *r, char **data, int *from_answers) {
    if (is_scalar(v) && !strcmp(sval(v), "answers")) {
        if (!r->answers.on) return bad(p, v, "data", "'answers' needs an 'answers' section (the model's own answers)");
        *from_answers = 1;
        return 0;
    }
    return as_path(p, v, "data", 'f', data);
}

static int answers_chat(const Recipe *r) {
    for (int i = 0; i < r->answers.n; i++)
        if (r->answers.ds[i].chat) return 1;
    return 0;
}

static int read_answers(P *p, yaml_node_t *v, Recipe *r) {
    static const char *const keys[] = {"datasets", "samples", "max_new", "chat", "parallel",
                                       "temp",     "seed",    "threads", NULL};
    RecipeDataset def = {.samples = 60, .max_new = 128, .chat = 1, .part = RECIPE_TRAIN, .eval_pct = r->split};
    yaml_node_t *x;
    if (want_map(p, v, "answers") || check_keys(p, v, "answers", keys)) return -1;
    r->answers.parallel = 16;
    if ((x = get(p, v, "parallel")) && as_int(p, x, "parallel", 1, 256, &r->answers.parallel)) return -1;
    if ((x = get(p, v, "threads")) && as_int(p, x, "threads", 1, 64, &r->answers.threads)) return -1;
    if ((x = get(p, v, "temp")) && as_float(p, x, "temp", 0, 2, &r->answers.temp)) return -1;
    if ((x = get(p, v, "seed")) && as_int(p, x, "seed", 0, 0x7fffffff, &r->answers.seed)) return -1;
    if ((x = get(p, v, "samples")) && as_int(p, x, "samples", 1, 100000, &def.samples)) return -1;
    if ((x = get(p, v, "max_new")) && as_int(p, x, "max_new", 1, 1 << 20, &def.max_new)) return -1;
    if ((x = get(p, v, "chat")) && as_bool(p, x, "chat", &def.chat)) return -1;
    if (!(x = get(p, v, "datasets"))) return bad(p, v, "answers", "needs 'datasets' (whose prompts the model answers)");
    if (read_datasets(p, x, "datasets", &def, 0, r->answers.ds, &r->answers.n)) return -1;
    r->answers.on = 1;
    return 0;
}

/* an exit head's training settings (exit_heads, or a draft's own head) */
static int read_training(P *p, yaml_node_t *v, RecipeExitHeads *h) {
    yaml_node_t *x;
    if ((x = get(p, v, "fields")) && as_list(p, x, "fields", 16, item_field, &h->fields, NULL)) return -1;
    if ((x = get(p, v, "special")) && as_bool(p, x, "special", &h->special)) return -1;
    if ((x = get(p, v, "steps")) && as_int(p, x, "steps", 1, 10000000, &h->steps)) return -1;
    if ((x = get(p, v, "lr")) && as_num(p, x, "lr", 1e-9, 100, &h->lr)) return -1;
    if ((x = get(p, v, "batch")) && as_int(p, x, "batch", 1, 4096, &h->batch)) return -1;
    if ((x = get(p, v, "seq_len")) && as_int(p, x, "seq_len", 2, 1 << 20, &h->seq_len)) return -1;
    if ((x = get(p, v, "seed")) && as_int(p, x, "seed", 0, 0x7fffffff, &h->seed)) return -1;
    return 0;
}

static int read_exit(P *p, yaml_node_t *v, Recipe *r) {
    static const char *const keys[] = {"layers", "data",    "fields", "special",     "steps", "lr",
                                       "batch",  "seq_len", "norm",   "check_vocab", "seed",  NULL};
    RecipeExitHeads *e = &r->exit;
    yaml_node_t *x;
    if (want_map(p, v, "exit_heads") || check_keys(p, v, "exit_heads", keys)) return -1;
    if ((x = get(p, v, "check_vocab")) && as_int(p, x, "check_vocab", 1, 1 << 20, &e->check_vocab)) return -1;
    e->norm = -1;
    if ((x = get(p, v, "layers"))) {
        if (is_scalar(x) && !strcmp(sval(x), "auto")) e->layers = pd_strdup("auto");
        else {
            int n;
            if (as_list(p, x, "layers", MAX_EXIT_HEADS, item_layer, &e->layers, &n)) return -1;
            int prev = 0;
            for (const char *s = e->layers; *s;) { /* increasing */
                int l = (int)strtol(s, (char **)&s, 10);
                if (l <= prev) return bad(p, x, "layers", "must increase (%d after %d)", l, prev);
                prev = l;
                s += *s == ',';
            }
        }
    } else e->layers = pd_strdup("auto");
    if (!e->layers) return -1;
    if (!(x = get(p, v, "data"))) return bad(p, v, "exit_heads", "needs 'data' (a text or jsonl file, or 'answers')");
    if (read_data(p, x, r, &e->data, &e->from_answers)) return -1;
    e->special = e->from_answers && answers_chat(r);
    if (read_training(p, v, e)) return -1;
    if ((x = get(p, v, "norm")) && !(is_scalar(x) && !strcmp(sval(x), "auto"))) {
        if (is_scalar(x) && (!strcmp(sval(x), "0") || !strcmp(sval(x), "1"))) e->norm = sval(x)[0] - '0';
        else if (as_bool(p, x, "norm", &e->norm)) return bad(p, x, "norm", "must be auto, 0 or 1");
    }
    e->on = 1;
    return 0;
}

static int read_medusa(P *p, yaml_node_t *v, Recipe *r) {
    static const char *const keys[] = {"heads",    "data",    "fields",       "special", "own_lm_head",
                                       "generate", "targets", "loss_weights", "steps",   "lr",
                                       "lm_lr",    "batch",   "seq_len",      "seed",    NULL};
    RecipeMedusa *m = &r->medusa;
    yaml_node_t *x;
    if (want_map(p, v, "medusa") || check_keys(p, v, "medusa", keys)) return -1;
    if (!(x = get(p, v, "heads"))) return bad(p, v, "medusa", "needs 'heads' (K, how many tokens ahead)");
    if (as_int(p, x, "heads", 1, MAX_MEDUSA, &m->heads)) return -1;
    if (!(x = get(p, v, "data"))) return bad(p, v, "medusa", "needs 'data' (a text or jsonl file, or 'answers')");
    if (read_data(p, x, r, &m->data, &m->from_answers)) return -1;
    m->special = m->from_answers && answers_chat(r);
    if ((x = get(p, v, "fields")) && as_list(p, x, "fields", 16, item_field, &m->fields, NULL)) return -1;
    if ((x = get(p, v, "special")) && as_bool(p, x, "special", &m->special)) return -1;
    if ((x = get(p, v, "own_lm_head")) && as_bool(p, x, "own_lm_head", &m->own_lm_head)) return -1;
    if ((x = get(p, v, "generate")) && as_int(p, x, "generate", 1, 1 << 20, &m->generate)) return -1;
    if ((x = get(p, v, "targets"))) {
        if (as_str(p, x, "targets", &m->targets)) return -1;
        if (strcmp(m->targets, "self") && strcmp(m->targets, "data"))
            return bad(p, x, "targets", "'%s' is not self or data", m->targets);
    }
    int n;
    if ((x = get(p, v, "loss_weights"))) {
        if (as_list(p, x, "loss_weights", MAX_MEDUSA, item_weight, &m->loss_weights, &n)) return -1;
        if (n != m->heads) return bad(p, x, "loss_weights", "%d weights for %d heads", n, m->heads);
    }
    if ((x = get(p, v, "steps")) && as_int(p, x, "steps", 1, 10000000, &m->steps)) return -1;
    if ((x = get(p, v, "lr")) && as_num(p, x, "lr", 1e-9, 100, &m->lr)) return -1;
    if ((x = get(p, v, "lm_lr")) && as_num(p, x, "lm_lr", 1e-9, 100, &m->lm_lr)) return -1;
    if ((x = get(p, v, "batch")) && as_int(p, x, "batch", 1, 4096, &m->batch)) return -1;
    if ((x = get(p, v, "seq_len")) && as_int(p, x, "seq_len", 2, 1 << 20, &m->seq_len)) return -1;
    if ((x = get(p, v, "seed")) && as_int(p, x, "seed", 0, 0x7fffffff, &m->seed)) return -1;
    m->on = 1;
    return 0;
}

static int read_eagle(P *p, yaml_node_t *v, Recipe *r) {
    static const char *const keys[] = {"data",        "fields", "special", "draft_vocab", "steps", "unroll",
                                       "unroll_from", "lr",     "batch",   "seq_len",     "seed",  NULL};
    RecipeEagle *e = &r->eagle;
    yaml_node_t *x;
    if (want_map(p, v, "eagle") || check_keys(p, v, "eagle", keys)) return -1;
    if (!(x = get(p, v, "data"))) return bad(p, v, "eagle", "needs 'data' (a text or jsonl file, or 'answers')");
    if (read_data(p, x, r, &e->data, &e->from_answers)) return -1;
    e->special = e->from_answers && answers_chat(r);
    if ((x = get(p, v, "fields")) && as_list(p, x, "fields", 16, item_field, &e->fields, NULL)) return -1;
    if ((x = get(p, v, "special")) && as_bool(p, x, "special", &e->special)) return -1;
    if ((x = get(p, v, "draft_vocab")) && as_int(p, x, "draft_vocab", 1, 1 << 20, &e->draft_vocab)) return -1;
    if ((x = get(p, v, "steps")) && as_int(p, x, "steps", 1, 10000000, &e->steps)) return -1;
    if ((x = get(p, v, "unroll")) && as_int(p, x, "unroll", 1, EAGLE_MAX_STEPS, &e->unroll)) return -1;
    if ((x = get(p, v, "unroll_from"))) {
        if (as_int(p, x, "unroll_from", 1, 10000000, &e->unroll_from)) return -1;
        if (e->unroll < 2) return bad(p, x, "eagle", "'unroll_from' needs 'unroll' of 2 or more");
        if (e->steps && e->unroll_from >= e->steps)
            return bad(p, x, "eagle", "'unroll_from' must come before the last of 'steps'");
    }
    if ((x = get(p, v, "lr")) && as_num(p, x, "lr", 1e-9, 100, &e->lr)) return -1;
    if ((x = get(p, v, "batch")) && as_int(p, x, "batch", 1, 4096, &e->batch)) return -1;
    if ((x = get(p, v, "seq_len")) && as_int(p, x, "seq_len", 2, 1 << 20, &e->seq_len)) return -1;
    if ((x = get(p, v, "seed")) && as_int(p, x, "seed", 0, 0x7fffffff, &e->seed)) return -1;
    e->on = 1;
    return 0;
}

static int has_layer(const char *layers, int l) {
    int found = 0;
    if (!strcmp(layers, "auto")) return 0;
    for (const char *s = layers; *s; s += *s == ',') found |= strtol(s, (char **)&s, 10) == l;
    return found;
}

static int read_draft(P *p, yaml_node_t *v, Recipe *r) {
    static const char *const keys[] = {"layer", "source", "tokenizer", "data",    "fields", "special",
                                       "steps", "lr",     "batch",     "seq_len", "seed",   NULL};
    static const char *const train[] = {"data", "fields", "special", "steps", "lr", "batch", "seq_len", "seed"};
    RecipeDraft *d = &r->draft;
    RecipeExitHeads *h = &d->heads;
    yaml_node_t *x, *lay, *src;
    if (want_map(p, v, "draft") || check_keys(p, v, "draft", keys)) return -1;
    lay = get(p, v, "layer");
    src = get(p, v, "source");
    if (!lay == !src)
        return bad(p, v, "draft", "needs either 'layer' (the model's first layers + an exit head) or 'source'");
    d->on = 1;
    if (src) {
        if (as_path(p, src, "source", 'a', &d->source)) return -1;
        if ((x = get(p, v, "tokenizer")) && as_path(p, x, "tokenizer", 'f', &d->tokenizer)) return -1;
        for (int i = 0; i < 8; i++)
            if ((x = get(p, v, train[i]))) return bad(p, x, train[i], "a 'source' draft is converted, not trained");
        return 0;
    }
    if ((x = get(p, v, "tokenizer"))) return bad(p, x, "tokenizer", "only a 'source' draft takes a tokenizer");
    if (as_int(p, lay, "layer", 1, 1 << 20, &d->layer)) return -1;
    int own = 0;
    for (int i = 0; i < 8; i++) own |= get(p, v, train[i]) != NULL;
    if (!own && r->exit.on && r->exit.norm == 1 && has_layer(r->exit.layers, d->layer))
        return 0; /* exit_heads' serves */
    if (!own && !r->exit.on)
        return bad(p, lay, "layer", "a draft from layer %d needs its head's 'data' (or an 'exit_heads' section)",
                   d->layer);
    /* a head of its own at that layer, with the final norm; unset settings from exit_heads */
    d->own_heads = 1;
    h->on = 1, h->norm = 1;
    char l[16];
    snprintf(l, sizeof l, "%d", d->layer);
    if (!(h->layers = pd_strdup(l))) return -1;
    if ((x = get(p, v, "data"))) {
        if (read_data(p, x, r, &h->data, &h->from_answers)) return -1;
        h->special = h->from_answers && answers_chat(r);
    } else {
        h->from_answers = r->exit.from_answers, h->special = r->exit.special;
        if (r->exit.data && !(h->data = pd_strdup(r->exit.data))) return -1;
        if (r->exit.fields && !(h->fields = pd_strdup(r->exit.fields))) return -1;
    }
    if (!h->data && !h->from_answers)
        return bad(p, v, "data", "the draft's head at layer %d needs training text ('data')", d->layer);
    h->steps = r->exit.steps, h->lr = r->exit.lr, h->batch = r->exit.batch, h->seq_len = r->exit.seq_len,
    h->seed = r->exit.seed;
    if (read_training(p, v, h)) return -1;
    return 0;
}

int recipe_method_needs(const char *m) {
    const DecodeMethod *dm = decode_method(m);
    int n = dm ? dm->needs : 0;
    return (n & NEEDS_EXIT_HEADS ? RECIPE_NEEDS_EXIT : 0) | (n & NEEDS_MEDUSA ? RECIPE_NEEDS_MEDUSA : 0) |
           (n & NEEDS_DRAFT ? RECIPE_NEEDS_DRAFT : 0) | (n & NEEDS_EAGLE ? RECIPE_NEEDS_EAGLE : 0);
}

int recipe_method_has_oracle(const char *m) {
    const DecodeMethod *dm = decode_method(m);
    return dm && dm->oracle;
}

const char *recipe_option(const RecipeDecoding *d, const char *key) {
    for (int i = 0; i < d->n_opts; i++)
        if (!strcmp(d->opt_key[i], key)) return d->opt_val[i];
    return NULL;
}

/* a method option's key: read as its type within its range (the registry's), for
   every listed method that reads it (their ranges may differ), or for the first that
   does when none is listed; kept as text for decode_option_set */
static int read_method_option(P *p, yaml_node_t *x, RecipeDecoding *d, const char *key) {
    const DecodeMethod *first = NULL;
    const MethodOption *o = decode_option_by_key(key, &first);
    char val[64] = "";
    char *text = NULL;
    for (int i = 0, any = 0; i <= d->n_methods; i++) {
        const DecodeMethod *dm = i < d->n_methods ? decode_method(d->methods[i]) : any ? NULL : first;
        const MethodOption *mo = dm ? decode_option_find(dm, o->name) : NULL;
        if (!mo) continue;
        any = 1;
        int n = 0, rc = 0;
        float f = 0;
        switch (mo->type) {
        case OPT_INT:
            rc = as_int(p, x, key, (long)mo->lo, (long)mo->hi, &n), snprintf(val, sizeof val, "%d", n);
            break;
        case OPT_FLOAT:
            rc = as_float(p, x, key, mo->lo, mo->hi, &f), snprintf(val, sizeof val, "%.9g", f);
            break;
        case OPT_SWITCH:
            rc = as_bool(p, x, key, &n), snprintf(val, sizeof val, "%d", n);
            break;
        case OPT_STR:
            rc = as_str(p, x, key, &text);
            break;
        }
        if (rc) return free(text), -1;
    }
    if (d->n_opts == RECIPE_MAX_OPTS) return free(text), bad(p, x, key, "more than %d method options", RECIPE_MAX_OPTS);
    d->opt_key[d->n_opts] = pd_strdup(key);
    d->opt_val[d->n_opts] = text ? text : pd_strdup(val);
    return d->opt_key[d->n_opts] && d->opt_val[d->n_opts++] ? 0 : -1;
}

static int add_method(P *p, yaml_node_t *at, Recipe *r, const char *name) {
    RecipeDecoding *d = &r->dec;
    for (int i = 0; i < d->n_methods; i++)
        if (!strcmp(d->methods[i], name))
            return strcmp(name, decode_reference()->name) ? bad(p, at, "methods", "'%s' twice", name) : 0;
    if (!decode_method(name)) return bad(p, at, "methods", "%s", pd_errmsg());
    int need = recipe_method_needs(name);
    if ((need & RECIPE_NEEDS_EXIT) && !r->exit.on)
        return bad(p, at, "methods", "'%s' needs an 'exit_heads' section", name);
    if ((need & RECIPE_NEEDS_MEDUSA) && !r->medusa.on)
        return bad(p, at, "methods", "'%s' needs a 'medusa' section", name);
    if ((need & RECIPE_NEEDS_DRAFT) && !r->draft.on) return bad(p, at, "methods", "'%s' needs a 'draft' section", name);
    if ((need & RECIPE_NEEDS_EAGLE) && !r->eagle.on)
        return bad(p, at, "methods", "'%s' needs an 'eagle' section", name);
    if (d->n_methods == RECIPE_MAX_METHODS) return bad(p, at, "methods", "more than %d methods", RECIPE_MAX_METHODS);
    return (d->methods[d->n_methods++] = pd_strdup(name)) ? 0 : -1;
}

static int read_decoding(P *p, yaml_node_t *v, Recipe *r) {
    /* the section's own keys, then every method option's (the registry's) */
    static char names[RECIPE_MAX_OPTS][64];
    const char *keys[6 + RECIPE_MAX_OPTS + 1] = {"methods", "gamma", "oracle", "oracle_samples", "repeat", "temp"};
    int n_keys = 6, n_names = 0;
    for (int i = 0; i < decode_method_count(); i++) {
        const DecodeMethod *dm = decode_method_at(i);
        for (int j = 0; j < dm->n_options && n_names < RECIPE_MAX_OPTS; j++) {
            const char *k = decode_option_key(&dm->options[j], names[n_names], sizeof names[0]);
            int dup = 0;
            for (int m = 0; m < n_keys && !dup; m++) dup = !strcmp(keys[m], k);
            if (!dup) keys[n_keys++] = k, n_names++;
        }
    }
    keys[n_keys] = NULL;
    RecipeDecoding *d = &r->dec;
    yaml_node_t *x;
    d->oracle_samples = 2, d->repeat = 1;
    if (v && (want_map(p, v, "decoding") || check_keys(p, v, "decoding", keys))) return -1;
    if (add_method(p, v, r, decode_reference()->name)) return -1; /* the reference, always first */
    if (v && (x = get(p, v, "methods"))) {
        char *list = NULL;
        if (as_list(p, x, "methods", RECIPE_MAX_METHODS, NULL, &list, NULL)) return -1;
        for (char *s = list, *e; s; s = e ? e + 1 : NULL) {
            if ((e = strchr(s, ','))) *e = 0;
            if (add_method(p, x, r, s)) return free(list), -1;
        }
        free(list);
    } else /* every method the recipe has what it needs for, in the registry's order */
        for (int i = 0; i < decode_method_count(); i++) {
            const char *name = decode_method_at(i)->name;
            int need = recipe_method_needs(name);
            if ((!(need & RECIPE_NEEDS_EXIT) || r->exit.on) && (!(need & RECIPE_NEEDS_MEDUSA) || r->medusa.on) &&
                (!(need & RECIPE_NEEDS_DRAFT) || r->draft.on) && (!(need & RECIPE_NEEDS_EAGLE) || r->eagle.on) &&
                add_method(p, v, r, name))
                return -1;
        }
    if (!v) return 0;
    if ((x = get(p, v, "gamma")) && as_float(p, x, "gamma", 1e-6, 1, &d->gamma)) return -1;
    for (int i = 6; i < n_keys; i++)
        if ((x = get(p, v, keys[i])) && read_method_option(p, x, d, keys[i])) return -1;
    if ((x = get(p, v, "temp")) && as_float(p, x, "temp", 0, 2, &d->temp)) return -1;
    if ((x = get(p, v, "repeat")) && as_int(p, x, "repeat", 1, 100, &d->repeat)) return -1;
    if ((x = get(p, v, "oracle_samples")) && as_int(p, x, "oracle_samples", 1, 100000, &d->oracle_samples)) return -1;
    if ((x = get(p, v, "oracle"))) {
        char *list = NULL;
        if (as_list(p, x, "oracle", RECIPE_MAX_ORACLE, item_rate, &list, &d->n_oracle)) return -1;
        int k = 0;
        for (char *s = list; *s; s += *s == ',') d->oracle[k++] = (float)strtod(s, &s);
        free(list);
    }
    const char *el = recipe_option(d, "exit_layer");
    if (el && r->exit.on && strcmp(r->exit.layers, "auto")) {
        if (!has_layer(r->exit.layers, atoi(el)))
            return bad(p, get(p, v, "exit_layer"), "exit_layer", "%s is not one of exit_heads.layers (%s)", el,
                       r->exit.layers);
    }
    return 0;
}

/* ---- the whole file ---- */

static int read_root(P *p, yaml_node_t *root, Recipe *r) {
    static const char *const keys[] = {"about",  "threads", "split", "model",    "answers",  "exit_heads",
                                       "medusa", "eagle",   "draft", "decoding", "datasets", NULL};
    yaml_node_t *x;
    if (root->type != YAML_MAPPING_NODE)
        return bad(p, root, "(top)", "a recipe is a mapping of sections (model:, datasets:, ...)");
    if (check_keys(p, root, "the recipe", keys)) return -1;
    r->threads = 1;
    if ((x = get(p, root, "about")) && as_str(p, x, "about", &r->about)) return -1;
    if ((x = get(p, root, "threads")) && as_int(p, x, "threads", 1, 64, &r->threads)) return -1;
    r->split = 20;
    if ((x = get(p, root, "split")) && as_int(p, x, "split", 0, 90, &r->split)) return -1;
    if (!(x = get(p, root, "model"))) return bad(p, root, "model", "missing: where the model comes from");
    if (read_model(p, x, r)) return -1;
    p->hint = NULL; /* it speaks of the model only */
    if ((x = get(p, root, "answers")) && read_answers(p, x, r)) return -1;
    if ((x = get(p, root, "exit_heads")) && read_exit(p, x, r)) return -1;
    if ((x = get(p, root, "medusa")) && read_medusa(p, x, r)) return -1;
    if ((x = get(p, root, "eagle")) && read_eagle(p, x, r)) return -1;
    if ((x = get(p, root, "draft")) && read_draft(p, x, r)) return -1;
    if (read_decoding(p, get(p, root, "decoding"), r)) return -1;
    if (!(x = get(p, root, "datasets"))) return bad(p, root, "datasets", "missing: whose prompts the bench decodes");
    RecipeDataset def = {.samples = 10, .max_new = 128, .part = RECIPE_EVAL, .eval_pct = r->split};
    return read_datasets(p, x, "datasets", &def, r->dec.gamma, r->ds, &r->n_datasets);
}

static int set_name(Recipe *r, const char *name) {
    const char *b = strrchr(name, '/');
    b = b ? b + 1 : name;
    size_t n = strlen(b);
    if (n > 5 && !strcmp(b + n - 5, ".yaml")) n -= 5;
    else if (n > 4 && !strcmp(b + n - 4, ".yml")) n -= 4;
    r->file = pd_strdup(name);
    r->name = strndup(b, n);
    if (!r->file || !r->name) return pd_error("out of memory");
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)b[i]) && !strchr("-_.", b[i]))
            return pd_error(
                "%s:1: key '(file name)': a recipe's name is letters, digits, '-', '_' and '.' (it names out/NAME/)",
                name);
    return 0;
}

int recipe_parse(Recipe *r, const char *bytes, size_t n, const char *name) {
    memset(r, 0, sizeof *r);
    yaml_parser_t yp;
    P p = {.name = name};
    if (set_name(r, name)) return recipe_free(r), -1;
    if (!yaml_parser_initialize(&yp)) return recipe_free(r), pd_error("%s: out of memory", name);
    yaml_parser_set_input_string(&yp, (const unsigned char *)bytes, n);
    int rc = 0;
    if (!yaml_parser_load(&yp, &p.doc)) {
        char prob[200];
        const char *what = yp.problem ? yp.problem : "not YAML";
        rc =
            pd_error("%s:%d: key '(yaml)': %s%s%s", name, (int)yp.problem_mark.line + 1,
                     shown(what, strlen(what), prob, sizeof prob), yp.context ? " " : "", yp.context ? yp.context : "");
        yaml_parser_delete(&yp);
        return recipe_free(r), rc;
    }
    yaml_node_t *root = yaml_document_get_root_node(&p.doc);
    if (!root) rc = pd_error("%s:1: key '(top)': the recipe is empty", name);
    else {
        rc = read_root(&p, root, r);
        yaml_document_t next; /* a second document would be silently ignored: refuse it */
        if (!rc && yaml_parser_load(&yp, &next)) {
            if (yaml_document_get_root_node(&next))
                rc = pd_error("%s:%d: key '(yaml)': more than one YAML document ('---')", name,
                              (int)next.start_mark.line + 1);
            yaml_document_delete(&next);
        } else if (!rc)
            rc = pd_error("%s:%d: key '(yaml)': %s", name, (int)yp.problem_mark.line + 1,
                          yp.problem ? yp.problem : "not YAML");
    }
    yaml_document_delete(&p.doc);
    yaml_parser_delete(&yp);
    if (rc) recipe_free(r);
    return rc;
}

int recipe_load(Recipe *r, const char *path) {
    char *bytes;
    size_t n;
    memset(r, 0, sizeof *r);
    if (pd_read_file(path, &bytes, &n)) return -1;
    int rc = recipe_parse(r, bytes, n, path);
    free(bytes);
    return rc;
}

void recipe_free(Recipe *r) {
    free(r->file), free(r->name), free(r->about);
    free(r->model.source), free(r->model.tokenizer), free(r->model.dtype), free(r->model.about);
    free(r->model.random_config), free(r->model.chat_template);
    for (int i = 0; i < r->answers.n; i++) dataset_free(&r->answers.ds[i]);
    free(r->exit.layers), free(r->exit.data), free(r->exit.fields);
    free(r->medusa.data), free(r->medusa.fields), free(r->medusa.targets), free(r->medusa.loss_weights);
    free(r->eagle.data), free(r->eagle.fields);
    free(r->draft.source), free(r->draft.tokenizer);
    free(r->draft.heads.layers), free(r->draft.heads.data), free(r->draft.heads.fields);
    for (int i = 0; i < r->dec.n_methods; i++) free(r->dec.methods[i]);
    for (int i = 0; i < r->dec.n_opts; i++) free(r->dec.opt_key[i]), free(r->dec.opt_val[i]);
    for (int i = 0; i < r->n_datasets; i++) dataset_free(&r->ds[i]);
    memset(r, 0, sizeof *r);
}

/* ---- prompts ---- */

void recipe_prompts_free(char **prompts, int n) {
    for (int i = 0; prompts && i < n; i++) free(prompts[i]);
    free(prompts);
}

static int by_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* the split of all[n]: is_eval[i] for the records whose hash is at most the
   ⌈n × eval_pct / 100⌉-th smallest (equal prompts fall on one side) */
static int split(const RecipeDataset *ds, char **all, int n, uint8_t *is_eval) {
    int k = (int)(((int64_t)n * ds->eval_pct + 99) / 100);
    uint64_t *h = pd_alloc(sizeof(uint64_t) * (n ? n : 1));
    if (!h) return -1;
    for (int i = 0; i < n; i++) h[i] = XXH64(all[i], strlen(all[i]), 0);
    uint64_t *sorted = pd_alloc(sizeof(uint64_t) * (n ? n : 1));
    if (!sorted) return free(h), -1;
    memcpy(sorted, h, sizeof(uint64_t) * n);
    qsort(sorted, n, sizeof(uint64_t), by_u64);
    for (int i = 0; i < n; i++) is_eval[i] = k > 0 && h[i] <= sorted[k - 1];
    free(h), free(sorted);
    return 0;
}

static int push(char ***v, int *n, int *cap, char *s) {
    if (!s) return -1;
    if (*n == *cap) {
        char **g = pd_realloc(*v, sizeof(char *) * (*cap = *cap ? 2 * *cap : 64));
        if (!g) return free(s), -1;
        *v = g;
    }
    (*v)[(*n)++] = s;
    return 0;
}

/* every record's rendering (records too short for a {f:Nw} field left out) */
static int all_records(const RecipeDataset *ds, char *text, size_t len, char ***out, int *n) {
    int cap = 0, rc = 0, line = 0;
    size_t i = 0;
    while (i < len && isspace((unsigned char)text[i])) i++;
    int jsonl = i < len && text[i] == '{';
    *out = NULL, *n = 0;
    for (char *s = text; !rc && s < text + len;) {
        char *e;
        int short_rec = 0;
        if (jsonl) {
            e = memchr(s, '\n', text + len - s);
            if (!e) e = text + len;
            line++;
            *e = 0;
            char *t = s;
            s = e + 1;
            while (isspace((unsigned char)*t)) t++;
            if (!*t) continue;
            json_error_t err;
            json_t *o = json_loads(t, 0, &err);
            char what[4200];
            snprintf(what, sizeof what, "%s:%d", ds->file, line);
            if (!json_is_object(o)) rc = pd_error("%s: not a JSON object (%s)", what, err.text);
            char *p = rc ? NULL : render(ds->tmpl, o, NULL, what, &short_rec);
            json_decref(o);
            if (!rc && !p) rc = -1;
            if (p && short_rec) free(p);
            else if (p) rc = push(out, n, &cap, p);
        } else { /* a paragraph: up to the next blank line */
            while (s < text + len && isspace((unsigned char)*s)) s++;
            if (s >= text + len) break;
            e = s;
            while (e < text + len) {
                char *nl = memchr(e, '\n', text + len - e);
                if (!nl) {
                    e = text + len;
                    break;
                }
                char *q = nl + 1;
                while (q < text + len && *q != '\n' && isspace((unsigned char)*q)) q++;
                if (q >= text + len || *q == '\n') {
                    e = nl;
                    break;
                }
                e = q;
            }
            char save = *e;
            *e = 0;
            char *p = render(ds->tmpl, NULL, s, ds->file, &short_rec);
            *e = save;
            s = e;
            if (!p) rc = -1;
            else if (short_rec) free(p);
            else rc = push(out, n, &cap, p);
        }
    }
    if (rc) recipe_prompts_free(*out, *n), *out = NULL, *n = 0;
    return rc;
}

int recipe_prompts(const RecipeDataset *ds, char ***prompts, int *n) {
    char *text, **all;
    size_t len;
    int n_all;
    *prompts = NULL, *n = 0;
    if (pd_read_file_gz(ds->file, &text, &len)) return -1;
    int rc = all_records(ds, text, len, &all, &n_all);
    free(text);
    if (rc) return -1;
    if (!n_all)
        return recipe_prompts_free(all, 0), pd_error("%s: no record gives a prompt through the template", ds->file);
    uint8_t *is_eval = pd_alloc(n_all);
    if (!is_eval || split(ds, all, n_all, is_eval)) return free(is_eval), recipe_prompts_free(all, n_all), -1;
    int kept = 0;
    for (int i = 0; i < n_all; i++) {
        if (ds->part == RECIPE_ALL || is_eval[i] == (ds->part == RECIPE_EVAL)) all[kept++] = all[i];
        else free(all[i]);
    }
    free(is_eval);
    if (!(n_all = kept))
        return free(all), pd_error("%s: none of its records is in the %s part (split: %d%% for evaluation)", ds->file,
                                   ds->part == RECIPE_EVAL ? "evaluation" : "training", ds->eval_pct);
    int take = ds->samples < n_all ? ds->samples : n_all;
    char **out = pd_alloc(sizeof(char *) * take);
    if (!out) return recipe_prompts_free(all, n_all), -1;
    for (int k = 0; k < take; k++) { /* evenly over the file: its regions differ */
        int at = (int)((int64_t)k * n_all / take);
        out[k] = all[at], all[at] = NULL;
    }
    recipe_prompts_free(all, n_all);
    *prompts = out, *n = take;
    return 0;
}

char *recipe_prompt_text(const Model *m, const RecipeDataset *ds, const char *prompt, int *add_bos) {
    if (!ds->chat) {
        *add_bos = tok_add_bos(m->tok);
        return pd_strdup(prompt);
    }
    int f = chat_format_detect(m->chat_template);
    if (f < 0) return pd_error_prefix(ds->name), NULL;
    return chat_apply((ChatFormat)f, m->chat_template, ds->system, prompt, add_bos);
}

int recipe_encode(const Model *m, const RecipeDataset *ds, const char *prompt, int32_t **ids, int *n) {
    int bos;
    char *text = recipe_prompt_text(m, ds, prompt, &bos);
    if (!text) return -1;
    int rc =
        tok_encode_flags(m->tok, text, strlen(text), (ds->chat ? TOK_SPECIAL : 0) | (bos ? TOK_ADD_BOS : 0), ids, n);
    free(text);
    return rc;
}
