/* Device discovery through the CUDA runtime. */
extern "C" {
#include "cuda/cuda_backend.h"
}

#include <cuda_runtime.h>
#include <string.h>

extern "C" int cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        return 0;
    }
    return n;
}

extern "C" pshard_status cuda_device_describe(int device, struct cuda_device_info *info) {
    cudaDeviceProp prop;
    cudaError_t err = cudaGetDeviceProperties(&prop, device);
    if (err != cudaSuccess)
        return core_fail(PSHARD_ERR_IO, "CUDA device %d: %s", device, cudaGetErrorString(err));
    memset(info, 0, sizeof *info);
    strncpy(info->name, prop.name, sizeof info->name - 1);
    info->compute_major = prop.major;
    info->compute_minor = prop.minor;
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaSetDevice(device) == cudaSuccess && cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
        info->free_bytes = free_bytes;
        info->total_bytes = total_bytes;
    }
    cudaDriverGetVersion(&info->driver_version);
    cudaRuntimeGetVersion(&info->runtime_version);
    return PSHARD_OK;
}
