/* Growing a heap array by doubling (core/grow.h). */
#include "core/grow.h"

#include <stdint.h>
#include <stdlib.h>

#include "core/error.h"

pshard_status core_grow(void **p, size_t *cap, size_t want, size_t item_bytes) {
    if (want <= *cap) return PSHARD_OK;
    size_t n = *cap ? *cap : 64;
    while (n < want) n *= 2;
    if (item_bytes && n > SIZE_MAX / item_bytes) return core_fail(PSHARD_ERR_NOMEM, "out of memory (%zu items)", want);
    void *grown = realloc(*p, n * item_bytes);
    if (!grown) return core_fail(PSHARD_ERR_NOMEM, "out of memory (%zu items of %zu bytes)", want, item_bytes);
    *p = grown, *cap = n;
    return PSHARD_OK;
}
