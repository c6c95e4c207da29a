/* The log sink. */
#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>

static enum log_level log_threshold = LOG_WARN;

void log_set_level(enum log_level level) { log_threshold = level; }

void log_msg(enum log_level level, const char *fmt, ...) {
    if (level < log_threshold) return;
    static const char *const prefix[] = {"debug: ", "", "warning: ", "error: "};
    va_list ap;
    va_start(ap, fmt);
    fputs(prefix[level], stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}
