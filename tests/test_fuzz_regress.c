/* test_fuzz_regress — the fuzz targets (tests/fuzz/targets.c) with a plain build, in
   make test: every seed in tests/fuzz/corpus/NAME/ is accepted (the corpus stays a set
   of valid inputs as formats change), and every input a fuzzer once broke a parser
   with, tests/fuzz/regress/NAME/, now runs clean (under make test's sanitizer run too). */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fuzz/targets.c"
#include "base/util.h"

/* each file of dir through the target; counts what it accepted */
static int replay(const FuzzTarget *t, const char *dir, int *files, int *skipped) {
    DIR *d = opendir(dir);
    int accepted = 0;
    *files = *skipped = 0;
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[4096], *data;
        size_t n;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        CHECK(pd_read_file(path, &data, &n) == 0, "%s", pd_errmsg());
        if (!data) continue;
        int ok = t->run((const uint8_t *)data, n);
        free(data);
        /* a seed (a recipe) naming data this machine lacks: skipped, saying which */
        if (!ok && strstr(dir, "/corpus/") &&
            (strstr(pd_errmsg(), "does not exist") || strstr(pd_errmsg(), "not found under"))) {
            printf("SKIP test_fuzz_regress: seed %s: needs data: %s\n", path, pd_errmsg());
            (*skipped)++;
            continue;
        }
        if (!ok && strstr(dir, "/corpus/")) fprintf(stderr, "%s: %s\n", path, pd_errmsg());
        accepted += ok;
        (*files)++;
    }
    closedir(d);
    return accepted;
}

int main(void) {
    int seeds = 0, regress = 0;
    for (int i = 0; i < N_FUZZ_TARGETS; i++) {
        const FuzzTarget *t = &FUZZ_TARGETS[i];
        char dir[256];
        int n, skipped;
        snprintf(dir, sizeof dir, "tests/fuzz/corpus/%s", t->name);
        int ok = replay(t, dir, &n, &skipped);
        CHECK(n + skipped > 0, "%s: no seeds in %s", t->name, dir);
        CHECK(ok == n, "%s: %d of %d seeds refused", t->name, n - ok, n);
        seeds += n;
        snprintf(dir, sizeof dir, "tests/fuzz/regress/%s", t->name);
        replay(t, dir, &n, &skipped);
        regress += n;
    }
    printf("fuzz regress: %d seeds accepted, %d saved crashers replayed\n", seeds, regress);
    return check_done("fuzz_regress");
}
