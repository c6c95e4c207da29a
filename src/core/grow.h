/* Growing a heap array: room for at least `want` items of `item_bytes`, doubling from *cap (or 64). */
#ifndef CORE_GROW_H
#define CORE_GROW_H

#include <stddef.h>

#include "pshard.h"

/* *p and *cap change only on success; PSHARD_ERR_NOMEM (with a message) when memory runs out. */
pshard_status core_grow(void **p, size_t *cap, size_t want, size_t item_bytes);

#endif
