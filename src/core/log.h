/* Logging: one process-wide sink (stderr by default) and a level threshold. */
#ifndef CORE_LOG_H
#define CORE_LOG_H

enum log_level { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_QUIET };

void log_set_level(enum log_level level);
void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define LOG_I(...) log_msg(LOG_INFO, __VA_ARGS__)
#define LOG_W(...) log_msg(LOG_WARN, __VA_ARGS__)
#define LOG_D(...) log_msg(LOG_DEBUG, __VA_ARGS__)

#endif
