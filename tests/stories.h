/* stories.h — training text for the trainers' tests: the first 60 kB of the TinyStories
   sample. Include after check.h and fixture.h. */
#ifndef PD_TEST_STORIES_H
#define PD_TEST_STORIES_H
#include "train/dataset.h"

static inline int story_text(TextSet *ts, const char *what) {
    const char *path = test_data(what, "datasets/tinystories/tinystories_val_sample.txt.gz");
    char *bytes;
    size_t n;
    if (!path) return -1;
    if (pd_read_file_gz(path, &bytes, &n)) {
        CHECK(0, "%s", pd_errmsg());
        return -1;
    }
    int rc = dataset_parse(ts, bytes, n < 60000 ? n : 60000, NULL, "tinystories");
    free(bytes);
    CHECK(rc == 0, "%s", pd_errmsg());
    return rc;
}

#endif
