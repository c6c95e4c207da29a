/* Shared helpers of the GPU tests that drive the executor (exec_kv_pool.c, exec_chain.c): one
 * PASS/FAIL line a case, counted, and a failed call's message. */
#ifndef TESTS_DEVICE_EXEC_TEST_H
#define TESTS_DEVICE_EXEC_TEST_H

#include <stdbool.h>
#include <stdio.h>

#include "pshard.h"

static int failures, cases;

static inline void check(bool ok, const char *what) {
    cases++;
    failures += !ok;
    printf("%s %s\n", ok ? "PASS" : "FAIL", what);
}

/* Whether a call succeeded; its message on stderr where it did not. */
static inline bool ok_status(pshard_status st, const char *what) {
    if (st != PSHARD_OK) fprintf(stderr, "%s: %s\n", what, pshard_last_error());
    return st == PSHARD_OK;
}

#endif
