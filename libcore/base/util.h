/* util.h — errors, checked allocation, arenas, files, progress: the plumbing every
   libcore module shares. libcore never exits: a failing call returns -1 (or NULL)
   and leaves a one-line message ("path: what is wrong") for the tool to print. */
#ifndef PD_UTIL_H
#define PD_UTIL_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- errors ---- */
int pd_error(const char *fmt, ...) __attribute__((format(printf, 1, 2))); /* sets, returns -1 */
const char *pd_errmsg(void);
/* prefix the current message: "what: <old message>" (e.g. the file name) */
int pd_error_prefix(const char *what);

/* ---- allocation: zeroed; NULL + message naming file:line on failure ---- */
void *pd_alloc_(size_t n, const char *file, int line);
void *pd_realloc_(void *p, size_t n, const char *file, int line);
#define pd_alloc(n) pd_alloc_((n), __FILE__, __LINE__)
#define pd_realloc(p, n) pd_realloc_((p), (n), __FILE__, __LINE__)
char *pd_strdup(const char *s);
/* a*b with overflow check (SIZE_MAX on overflow, which every allocation refuses) */
size_t pd_mul(size_t a, size_t b);

/* ---- arena: one block per big object, 64-byte aligned pieces, freed at once ---- */
typedef struct {
    char *base;
    size_t cap, used;
} Arena;
int arena_init(Arena *a, size_t cap);
void *arena_push(Arena *a, size_t n); /* NULL + message when full */
void arena_free(Arena *a);

/* ---- files ---- */
/* whole file (or stdin for "-") into memory; *n bytes, NUL-terminated for text use */
int pd_read_file(const char *path, char **data, size_t *n);
/* reads path, inflating it when it ends in .gz or .zst */
int pd_read_file_gz(const char *path, char **data, size_t *n);
/* gzip bytes (every member, as gunzip does) → *out, malloc'd and NUL-terminated;
   what names the input in messages (corrupt, truncated, inflating past 16 GiB) */
int pd_gunzip(const void *gz, size_t n, char **out, size_t *out_n, const char *what);
/* the same for zstd frames (one or more) */
int pd_unzstd(const void *zst, size_t n, char **out, size_t *out_n, const char *what);

/* an output written atomically: data goes to a temp file beside `path` — unnamed
   (O_TMPFILE) where the filesystem allows, so a killed writer leaves nothing, else
   `path`.tmpPID — which becomes `path` only on commit; "-" streams to stdout instead. */
typedef struct {
    FILE *f;
    char *path, *tmp;
    int unnamed; /* f has no name yet: commit links it as tmp, then renames */
} AtomicFile;
int atomic_open(AtomicFile *af, const char *path);
int atomic_commit(AtomicFile *af); /* fflush+fsync+rename (+fsync of the directory); closes */
void atomic_abort(AtomicFile *af); /* removes the temp file; closes */

/* ---- paths to data: $PARADEC_DATA, else ./data, else the cache `make models` fills
   ($PARADEC_CACHE, default ~/.cache/paradec), else ../shared/data ---- */
const char *pd_cache_dir(void);
/* writes the first existing "<root>/<rel>" into out; -1 + message when none exists */
int pd_data_path(const char *rel, char *out, size_t outsz);

/* ---- time ---- */
double pd_now(void); /* seconds, monotonic */

/* ---- progress: a bar with rate and ETA on a terminal, one summary line otherwise ---- */
typedef struct {
    const char *what;
    int64_t total, done;
    double t0, last;
    int tty;
    const char *unit; /* progress_rate's, NULL: none */
    int64_t count;
} Progress;
void progress_begin(Progress *p, const char *what, int64_t total);
void progress_step(Progress *p, int64_t done);
/* a second count shown as its rate beside the steps' ("tok": tokens/s) */
void progress_rate(Progress *p, int64_t count, const char *unit);
void progress_end(Progress *p);

#endif
