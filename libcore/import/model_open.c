/* model_open.c — -m as users give it (model_open.h). */
#include "import/model_open.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "import/gguf_model.h"
#include "import/hf.h"
#include "model/checkpoint.h"

int model_source(const char *path) {
    struct stat st;
    if (!strcmp(path, "-") || stat(path, &st)) return MODEL_SRC_FILE; /* model_load says what is wrong */
    if (S_ISDIR(st.st_mode)) {
        char cfg[PATH_MAX];
        snprintf(cfg, sizeof cfg, "%s/config.json", path);
        if (access(cfg, F_OK)) return pd_error("%s: a directory without config.json: not a Hugging Face model", path);
        return MODEL_SRC_HF;
    }
    FILE *f = fopen(path, "rb");
    char magic[4] = {0};
    size_t got = f ? fread(magic, 1, 4, f) : 0;
    if (f) fclose(f);
    return got == 4 && !memcmp(magic, "GGUF", 4) ? MODEL_SRC_GGUF : MODEL_SRC_FILE;
}

/* where an imported model's file lives while it is loaded: memory if the system has it */
static const char *scratch_dir(void) {
    struct stat st;
    if (!stat("/dev/shm", &st) && S_ISDIR(st.st_mode) && !access("/dev/shm", W_OK | X_OK)) return "/dev/shm";
    const char *t = getenv("TMPDIR");
    return t && *t ? t : "/tmp";
}

int model_import(Checkpoint *ck, const char *path, int kind) {
    if (kind == MODEL_SRC_GGUF ? gguf_read_model(ck, path) : hf_read_dir(ck, path)) return -1;
    if (ck->tok) return 0;
    ck_free(ck);
    return pd_error("%s: no tokenizer inside (convert it with --tokenizer)", path);
}

/* The packed copy is what the matmuls read (mat_packed_alone): the layer matrices' bytes in the
   scratch file are needed no more, and in /dev/shm they are memory the kernel cannot
   reclaim (model_load's madvise unmaps them, but the file keeps them), so they are cut
   out of the file and their Mat.w cleared (nothing reads them: heads and tools use
   the packed products, the embedding, the lm_head and the norms, which stay). */
static void punch_packed(Model *m, int fd) {
    long pg = sysconf(_SC_PAGESIZE);
    size_t page = pg > 0 ? (size_t)pg : 4096;
    for (int l = 0; l < m->c.n_layers; l++) {
        Layer *L = &m->layers[l];
        Mat *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w1, &L->w3, &L->w2};
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) {
            if (!w[i]->w || !mat_packed_alone(w[i])) continue;
            size_t off = (size_t)((const char *)w[i]->w - (const char *)m->tf.map);
            size_t n = (size_t)w[i]->rows * mat_row_bytes(w[i]);
            if (off + n > m->tf.map_len) continue; /* not in this mapping: leave it */
            size_t a = (off + page - 1) / page * page, e = (off + n) / page * page;
            if (e > a) fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)a, (off_t)(e - a));
            w[i]->w = NULL;
        }
    }
}

int model_load_imported(Model *m, Checkpoint *ck, const char *path) {
    memset(m, 0, sizeof *m);
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s/paradec-import-XXXXXX.safetensors", scratch_dir());
    int fd = mkstemps(tmp, (int)strlen(".safetensors"));
    if (fd < 0) {
        ck_free(ck);
        return pd_error("%s: cannot make a file to import into (%s): %s", path, tmp, strerror(errno));
    }
    close(fd);
    int rc = ck_write_model(ck, tmp, DT_KEEP); /* as convert does: block types stay; renames over tmp */
    ck_free(ck);
    fd = rc ? -1 : open(tmp, O_RDWR | O_CLOEXEC); /* writable: punch_packed cuts holes */
    unlink(tmp); /* from here on a crash leaves nothing: the open descriptor holds the file */
    if (rc) return -1;
    if (fd < 0) return pd_error("%s: cannot reopen %s: %s", path, tmp, strerror(errno));
    char fdpath[64];
    snprintf(fdpath, sizeof fdpath, "/proc/self/fd/%d", fd);
    rc = model_load(m, fdpath);
    if (!rc && m->tf.map) punch_packed(m, fd);
    close(fd); /* the mapping keeps the file until model_free */
    if (rc) {  /* the message names the descriptor: name the source instead */
        const char *e = pd_errmsg();
        size_t k = strlen(fdpath);
        return strncmp(e, fdpath, k) || e[k] != ':' ? pd_error_prefix(path) : pd_error("%s%s", path, e + k);
    }
    char *p = pd_strdup(path);
    if (!p) {
        model_free(m);
        return -1;
    }
    free(m->tf.path);
    m->tf.path = p;
    return 0;
}

int model_open(Model *m, const char *path) {
    memset(m, 0, sizeof *m);
    int kind = model_source(path);
    if (kind < 0) return -1;
    if (kind == MODEL_SRC_FILE) return model_load(m, path);
    Checkpoint ck;
    return model_import(&ck, path, kind) ? -1 : model_load_imported(m, &ck, path);
}
