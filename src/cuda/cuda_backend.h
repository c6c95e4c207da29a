/* The CUDA backend as the rest of pshard sees it: plain C, no CUDA headers. Builds without
 * CUDA link src/cuda/none.c, where no device exists. */
#ifndef CUDA_CUDA_BACKEND_H
#define CUDA_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

struct cuda_device_info {
    char name[256];
    int compute_major, compute_minor;
    uint64_t total_bytes; /* device memory */
    uint64_t free_bytes;
    int driver_version, runtime_version;
};

/* Number of usable CUDA devices (0 when there is no driver, no GPU, or no CUDA in the build). */
int cuda_device_count(void);

pshard_status cuda_device_describe(int device, struct cuda_device_info *info);

#endif
