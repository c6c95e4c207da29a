/* pshard public C API: status codes, errors, version. Grows with each module. */
#ifndef PSHARD_H
#define PSHARD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PSHARD_VERSION "0.1.0"

/* Every public function returns a status; the message of the last failure on this thread is
 * available from pshard_last_error(). */
typedef enum pshard_status {
    PSHARD_OK = 0,
    PSHARD_ERR_IO,          /* a file could not be opened, read or mapped */
    PSHARD_ERR_FORMAT,      /* input is malformed (bad magic, truncated, out of bounds, ...) */
    PSHARD_ERR_UNSUPPORTED, /* well-formed but not supported (architecture, tensor type, ...) */
    PSHARD_ERR_NOT_FOUND,   /* a key, tensor or file that was asked for does not exist */
    PSHARD_ERR_INVALID_ARG, /* the caller passed a bad argument */
    PSHARD_ERR_NOMEM,       /* an allocation failed */
    PSHARD_ERR_RANGE,       /* a value or size is outside what is allowed */
    PSHARD_ERR_INTERNAL,    /* a bug: an invariant did not hold */
} pshard_status;

/* Message describing the last failure on the calling thread ("" if none). */
const char *pshard_last_error(void);

/* Short name of a status code ("ok", "format error", ...). */
const char *pshard_status_name(pshard_status status);

#ifdef __cplusplus
}
#endif

#endif /* PSHARD_H */
