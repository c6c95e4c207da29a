/* Small helpers shared by the C tests. */
#ifndef TEST_HELPERS_H
#define TEST_HELPERS_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

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

/* Write gguf-synth's tiny Qwen2.5-VL pair to /tmp/pshard-test-TAG-PID.gguf and ...-mmproj.gguf
 * (gguf-synth from PSHARD_BUILD_DIR); the paths go to lm and mmproj. Returns 0, or -1 with a
 * message where gguf-synth failed. */
static inline int test_synth_vision_pair(const char *tag, char *lm, size_t lm_size, char *mmproj, size_t mmproj_size) {
    const char *build = getenv("PSHARD_BUILD_DIR");
    snprintf(lm, lm_size, "/tmp/pshard-test-%s-%d.gguf", tag, (int)getpid());
    snprintf(mmproj, mmproj_size, "/tmp/pshard-test-%s-%d-mmproj.gguf", tag, (int)getpid());
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s/gguf-synth' --shape tiny-qwen25vl --quiet -o '%s' && '%s/gguf-synth' --shape "
             "tiny-qwen25vl-mmproj --quiet -o '%s'", build ? build : ".", lm, build ? build : ".", mmproj);
    if (system(cmd) == 0) return 0;
    fprintf(stderr, "cannot make the tiny pair with gguf-synth (PSHARD_BUILD_DIR)\n");
    return -1;
}

#endif
