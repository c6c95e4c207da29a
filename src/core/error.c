/* Per-thread error messages behind pshard_last_error(). */
#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

enum { ERROR_MESSAGE_BYTES = 1024 };

static _Thread_local char error_message[ERROR_MESSAGE_BYTES];

pshard_status core_fail(pshard_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_message, sizeof error_message, fmt, ap);
    va_end(ap);
    return status;
}

pshard_status core_fail_context(pshard_status status, const char *fmt, ...) {
    char prefix[ERROR_MESSAGE_BYTES];
    char old[ERROR_MESSAGE_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, error_message, sizeof old);
    /* Truncation is fine: the message is for people. */
    size_t used = strlen(prefix);
    if (used > sizeof error_message - 3) used = sizeof error_message - 3;
    memcpy(error_message, prefix, used);
    memcpy(error_message + used, ": ", 2);
    size_t rest = sizeof error_message - used - 3;
    strncpy(error_message + used + 2, old, rest);
    error_message[sizeof error_message - 1] = '\0';
    return status;
}

void core_clear_error(void) { error_message[0] = '\0'; }

const char *pshard_last_error(void) { return error_message; }

const char *pshard_status_name(pshard_status status) {
    switch (status) {
    case PSHARD_OK: return "ok";
    case PSHARD_ERR_IO: return "I/O error";
    case PSHARD_ERR_FORMAT: return "format error";
    case PSHARD_ERR_UNSUPPORTED: return "unsupported";
    case PSHARD_ERR_NOT_FOUND: return "not found";
    case PSHARD_ERR_INVALID_ARG: return "invalid argument";
    case PSHARD_ERR_NOMEM: return "out of memory";
    case PSHARD_ERR_RANGE: return "out of range";
    case PSHARD_ERR_INTERNAL: return "internal error";
    case PSHARD_ERR_BUSY: return "busy";
    }
    return "unknown status";
}
