/* util.c — see util.h */
#include "base/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

static _Thread_local char errbuf[1024];

/* control bytes as escapes: a message is one line even when it quotes a file's bytes */
static void one_line(char *dst, size_t cap, const char *src) {
    size_t k = 0;
    for (const unsigned char *s = (const unsigned char *)src; *s && k + 5 < cap; s++) {
        if (*s >= 0x20 && *s != 0x7f) dst[k++] = (char)*s;
        else k += (size_t)snprintf(dst + k, cap - k, *s == '\n' ? "\\n" : *s == '\t' ? "\\t" : "\\x%02x", *s);
    }
    dst[k] = 0;
}

int pd_error(const char *fmt, ...) {
    char raw[sizeof errbuf];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    one_line(errbuf, sizeof errbuf, raw);
    return -1;
}

const char *pd_errmsg(void) { return errbuf[0] ? errbuf : "unknown error"; }

int pd_error_prefix(const char *what) {
    char old[sizeof errbuf];
    memcpy(old, errbuf, sizeof old);
    return pd_error("%s: %s", what, old);
}

size_t pd_mul(size_t a, size_t b) {
    if (a && b > SIZE_MAX / a) return SIZE_MAX;
    return a * b;
}

void *pd_alloc_(size_t n, const char *file, int line) {
    /* refuse absurd sizes up front: a corrupt header must not make us try 1e15 bytes */
    void *p = n < ((size_t)1 << 40) ? calloc(1, n ? n : 1) : NULL;
    if (!p) pd_error("out of memory allocating %zu bytes (%s:%d)", n, file, line);
    return p;
}

void *pd_realloc_(void *p, size_t n, const char *file, int line) {
    void *q = n < ((size_t)1 << 40) ? realloc(p, n ? n : 1) : NULL;
    if (!q) pd_error("out of memory allocating %zu bytes (%s:%d)", n, file, line);
    return q;
}

char *pd_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = pd_alloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* big arenas come from mmap: the kernel hands out zero pages as they are touched,
   instead of a memset that touches them all up front */
#define ARENA_MMAP_MIN ((size_t)1 << 24)

int arena_init(Arena *a, size_t cap) {
    a->used = 0;
    a->cap = cap;
    a->base = NULL;
    if (cap >= ((size_t)1 << 40)) return pd_error("out of memory allocating an arena of %zu bytes", cap);
    if (cap >= ARENA_MMAP_MIN) {
        void *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return pd_error("out of memory allocating an arena of %zu bytes", cap);
        madvise(p, cap, MADV_HUGEPAGE); /* a hint: fewer page faults for big weights */
        a->base = p;
        return 0;
    }
    if (posix_memalign((void **)&a->base, 64, cap ? cap : 64)) {
        a->base = NULL;
        return pd_error("out of memory allocating an arena of %zu bytes", cap);
    }
    memset(a->base, 0, cap);
    return 0;
}

void *arena_push(Arena *a, size_t n) {
    size_t at = (a->used + 63) & ~(size_t)63;
    if (n > a->cap || at > a->cap - n) {
        pd_error("arena full (%zu of %zu bytes used, %zu asked)", a->used, a->cap, n);
        return NULL;
    }
    a->used = at + n;
    return a->base + at;
}

void arena_free(Arena *a) {
    if (a->base && a->cap >= ARENA_MMAP_MIN) munmap(a->base, a->cap);
    else free(a->base);
    a->base = NULL;
    a->cap = a->used = 0;
}

static int read_stream(FILE *f, const char *path, char **data, size_t *n) {
    size_t cap = 1 << 16, len = 0;
    char *buf = pd_alloc(cap + 1);
    if (!buf) return -1;
    for (;;) {
        if (len == cap) {
            char *nb = pd_realloc(buf, 2 * cap + 1);
            if (!nb) {
                free(buf);
                return -1;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        free(buf);
        return pd_error("%s: read error: %s", path, strerror(errno));
    }
    buf[len] = 0;
    *data = buf;
    *n = len;
    return 0;
}

int pd_read_file(const char *path, char **data, size_t *n) {
    if (!strcmp(path, "-")) return read_stream(stdin, "-", data, n);
    FILE *f = fopen(path, "rb");
    if (!f) return pd_error("%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        return pd_error("%s: is a directory", path);
    }
    int rc = read_stream(f, path, data, n);
    fclose(f);
    return rc;
}

#define MAX_INFLATED ((size_t)16 << 30) /* a gzip bomb stops here */

int pd_gunzip(const void *gz, size_t n, char **out, size_t *out_n, const char *what) {
    const unsigned char *in = gz;
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) return pd_error("%s: cannot start zlib", what);
    size_t cap = n * 4 + 4096, len = 0, used = 0;
    char *buf = pd_alloc(cap + 1);
    int rc = buf ? 0 : -1;
    while (!rc) {
        if (len == cap) {
            char *nb = cap * 2 > MAX_INFLATED ? NULL : pd_realloc(buf, cap * 2 + 1);
            if (!nb) {
                rc = pd_error("%s: inflates to more than %zu bytes", what, cap);
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t in_left = n - used, out_left = cap - len;
        z.next_in = (unsigned char *)in + used;
        z.avail_in = in_left > (1u << 30) ? (1u << 30) : (unsigned)in_left;
        z.next_out = (unsigned char *)buf + len;
        z.avail_out = out_left > (1u << 30) ? (1u << 30) : (unsigned)out_left;
        unsigned ai = z.avail_in, ao = z.avail_out;
        int zr = inflate(&z, Z_NO_FLUSH);
        used += ai - z.avail_in;
        len += ao - z.avail_out;
        if (zr == Z_STREAM_END) {
            if (used == n) break;
            inflateReset(&z);                                        /* another member follows */
        } else if (zr != Z_OK && !(zr == Z_BUF_ERROR && len == cap)) /* stuck with room left: input ended */
            rc = pd_error("%s: corrupt or truncated gzip data", what);
    }
    inflateEnd(&z);
    if (rc) {
        free(buf);
        return -1;
    }
    buf[len] = 0;
    *out = buf;
    *out_n = len;
    return 0;
}

int pd_unzstd(const void *zst, size_t n, char **out, size_t *out_n, const char *what) {
    ZSTD_DCtx *dz = ZSTD_createDCtx();
    size_t cap = n * 4 + 4096, last = 1;
    char *buf = dz ? pd_alloc(cap + 1) : NULL;
    int rc = buf ? 0 : dz ? -1 : pd_error("%s: cannot start zstd", what);
    ZSTD_inBuffer in = {zst, n, 0};
    ZSTD_outBuffer o = {buf, cap, 0};
    while (!rc && (in.pos < n || o.pos == o.size)) {
        if (o.pos == o.size) {
            char *nb = cap * 2 > MAX_INFLATED ? NULL : pd_realloc(buf, cap * 2 + 1);
            if (!nb) {
                rc = pd_error("%s: inflates to more than %zu bytes", what, cap);
                break;
            }
            buf = nb, cap *= 2, o.dst = buf, o.size = cap;
        }
        last = ZSTD_decompressStream(dz, &o, &in);
        if (ZSTD_isError(last)) rc = pd_error("%s: corrupt zstd data: %s", what, ZSTD_getErrorName(last));
    }
    if (!rc && last) rc = pd_error("%s: truncated zstd data", what); /* a frame not finished */
    ZSTD_freeDCtx(dz);
    if (rc) return free(buf), -1;
    buf[o.pos] = 0;
    *out = buf, *out_n = o.pos;
    return 0;
}

int pd_read_file_gz(const char *path, char **data, size_t *n) {
    size_t pl = strlen(path);
    if (pd_read_file(path, data, n)) return -1;
    int gz = pl >= 3 && !strcmp(path + pl - 3, ".gz"), zst = pl >= 4 && !strcmp(path + pl - 4, ".zst");
    if (!gz && !zst) return 0;
    char *packed = *data;
    int rc = (gz ? pd_gunzip : pd_unzstd)(packed, *n, data, n, path);
    free(packed);
    return rc;
}

/* the directory a path is in ("." for a bare name) */
static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return pd_strdup(".");
    char *d = pd_strdup(path);
    if (d) d[slash == path ? 1 : slash - path] = 0;
    return d;
}

/* an unnamed file in path's directory (O_TMPFILE): a writer killed before commit leaves
   nothing behind. NULL where the filesystem (or a missing /proc, through which commit
   names it) cannot. */
static FILE *open_unnamed(const char *path) {
    char *dir = dir_of(path);
    int fd = dir && access("/proc/self/fd", X_OK) == 0 ? open(dir, O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666) : -1;
    free(dir);
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f && fd >= 0) close(fd);
    return f;
}

static int name_unnamed(FILE *f, const char *name) {
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fileno(f));
    unlink(name); /* a stale one, left by a killed writer that had our pid */
    return linkat(AT_FDCWD, proc, AT_FDCWD, name, AT_SYMLINK_FOLLOW);
}

/* the rename itself made durable (a crash right after commit keeps the new file) */
static void sync_dir(const char *path) {
    char *dir = dir_of(path);
    int fd = dir ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    free(dir);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

int atomic_open(AtomicFile *af, const char *path) {
    memset(af, 0, sizeof *af);
    if (!strcmp(path, "-")) {
        af->f = stdout;
        return 0;
    }
    af->path = pd_strdup(path);
    af->tmp = pd_alloc(strlen(path) + 32);
    if (af->path && af->tmp) {
        /* same directory, so rename() is atomic */
        sprintf(af->tmp, "%s.tmp%ld", path, (long)getpid());
        af->f = open_unnamed(path);
        af->unnamed = af->f != NULL;
        if (!af->f) af->f = fopen(af->tmp, "wb");
        if (af->f) return 0;
        pd_error("%s: cannot write: %s", path, strerror(errno));
    }
    free(af->path);
    free(af->tmp);
    memset(af, 0, sizeof *af);
    return -1;
}

int atomic_commit(AtomicFile *af) {
    if (!af->path) { /* stdout */
        if (fflush(af->f)) return pd_error("-: write error: %s", strerror(errno));
        return 0;
    }
    int bad = fflush(af->f) != 0 || ferror(af->f) || fsync(fileno(af->f)) != 0;
    int e = errno;
    if (!bad && af->unnamed && name_unnamed(af->f, af->tmp)) bad = 1, e = errno;
    bad |= fclose(af->f) != 0;
    af->f = NULL;
    if (!bad && rename(af->tmp, af->path)) bad = 1, e = errno;
    if (bad) {
        remove(af->tmp);
        pd_error("%s: write failed: %s", af->path, strerror(e));
    } else sync_dir(af->path);
    free(af->path);
    free(af->tmp);
    af->path = af->tmp = NULL;
    return bad ? -1 : 0;
}

void atomic_abort(AtomicFile *af) {
    if (af->path) {
        if (af->f) fclose(af->f);
        if (!af->unnamed) remove(af->tmp);
        free(af->path);
        free(af->tmp);
    }
    memset(af, 0, sizeof *af);
}

const char *pd_cache_dir(void) {
    static char dir[4096];
    const char *env = getenv("PARADEC_CACHE"), *home = getenv("HOME");
    if (env && *env) snprintf(dir, sizeof dir, "%s", env);
    else snprintf(dir, sizeof dir, "%s/.cache/paradec", home ? home : ".");
    return dir;
}

int pd_data_path(const char *rel, char *out, size_t outsz) {
    const char *env = getenv("PARADEC_DATA");
    const char *roots[] = {env, "data", pd_cache_dir(), "../shared/data"};
    for (int i = 0; i < 4; i++) {
        if (!roots[i] || !roots[i][0]) continue;
        snprintf(out, outsz, "%s/%s", roots[i], rel);
        if (access(out, R_OK) == 0) return 0;
    }
    return pd_error("%s: not found under $PARADEC_DATA, data/, %s or ../shared/data", rel, pd_cache_dir());
}

double pd_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void progress_begin(Progress *p, const char *what, int64_t total) {
    p->what = what;
    p->total = total;
    p->done = 0;
    p->t0 = p->last = pd_now();
    p->tty = isatty(2);
    p->unit = NULL, p->count = 0;
}

void progress_rate(Progress *p, int64_t count, const char *unit) { p->count = count, p->unit = unit; }

void progress_step(Progress *p, int64_t done) {
    p->done = done;
    double now = pd_now();
    if (!p->tty || now - p->last < 0.1) return;
    p->last = now;
    double rate = done / (now - p->t0 + 1e-9);
    double eta = rate > 0 ? (p->total - done) / rate : 0;
    int w = 30, fill = p->total > 0 ? (int)(w * done / p->total) : 0;
    char bar[64];
    for (int i = 0; i < w; i++) bar[i] = i < fill ? '#' : '.';
    bar[w] = 0;
    fprintf(stderr, "\r%s [%s] %lld/%lld %.1f/s", p->what, bar, (long long)done, (long long)p->total, rate);
    if (p->unit) fprintf(stderr, " %.0f %s/s", p->count / (now - p->t0 + 1e-9), p->unit);
    fprintf(stderr, " ETA %.0fs ", eta);
}

void progress_end(Progress *p) {
    double dt = pd_now() - p->t0;
    if (p->tty) fprintf(stderr, "\r\033[K");
    fprintf(stderr, "%s: %lld done in %.2fs (%.1f/s", p->what, (long long)p->done, dt, p->done / (dt + 1e-9));
    if (p->unit) fprintf(stderr, ", %lld %s at %.1f/s", (long long)p->count, p->unit, p->count / (dt + 1e-9));
    fprintf(stderr, ")\n");
}
