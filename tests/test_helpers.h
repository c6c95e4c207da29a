/* Small helpers shared by the C tests. */
#ifndef TEST_HELPERS_H
#define TEST_HELPERS_H

#include <stdio.h>
#include <stdlib.h>

/* Path of a file under the test data folder (PSHARD_TEST_DATA, set by ctest). */
static inline const char *test_data_path(const char *relative) {
    static char path[4096];
    const char *root = getenv("PSHARD_TEST_DATA");
    snprintf(path, sizeof path, "%s/%s", root ? root : "tests/data", relative);
    return path;
}

/* Read a whole file into a malloc'ed buffer of exactly its size (so sanitizers catch any read
 * past the end). Returns NULL on failure. */
static inline unsigned char *test_read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *size = n > 0 ? (size_t)n : 0;
    return buf;
}

#endif
