/* Error reporting inside the library: set the calling thread's message and return a status. */
#ifndef CORE_ERROR_H
#define CORE_ERROR_H

#include "pshard.h"

/* Record a formatted message for this thread and return `status`, so a failure reads
 * `return core_fail(PSHARD_ERR_FORMAT, "%s: bad magic", path);`. */
pshard_status core_fail(pshard_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prepend context to the current message ("loading x.gguf: " + old message), keep status. */
pshard_status core_fail_context(pshard_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

void core_clear_error(void);

/* Propagate a failing status from a call. */
#define CORE_TRY(expr)                                                                           \
    do {                                                                                         \
        pshard_status core_try_status_ = (expr);                                                 \
        if (core_try_status_ != PSHARD_OK) return core_try_status_;                              \
    } while (0)

#endif
