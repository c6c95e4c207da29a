/* The CUDA backend's C interface when pshard is built without CUDA: no device is present. */
#include "cuda/cuda_backend.h"

int cuda_device_count(void) { return 0; }

pshard_status cuda_device_describe(int device, struct cuda_device_info *info) {
    (void)device; (void)info;
    return core_fail(PSHARD_ERR_UNSUPPORTED, "this build of pshard has no CUDA backend");
}
