// Probe: can the GPU read an mmapped weight file directly? Registers a read-only file mapping
// (cudaHostRegisterReadOnly), then measures DMA (cudaMemcpyAsync) and zero-copy kernel reads
// from it and from cudaHostAlloc'd memory. Usage: host_read_probe FILE [MB]
#include <cuda_runtime.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

__global__ void sum_kernel(const int4 *src, size_t n, int *out) {
    int acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int4 v = src[i];
        acc += v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678) *out = acc;
}

static void bench_read(const char *what, const void *host, size_t bytes, void *dev, int *dflag) {
    const void *dptr = NULL;
    cudaError_t e = cudaHostGetDevicePointer((void **)&dptr, (void *)host, 0);
    if (e != cudaSuccess) { printf("%s: no device pointer: %s\n", what, cudaGetErrorString(e)); return; }
    for (int grid : {132, 264, 528, 1056}) {
        for (int rep = 0; rep < 2; rep++) {
            cudaDeviceSynchronize();
            double t0 = now();
            sum_kernel<<<grid, 512>>>((const int4 *)dptr, bytes / 16, dflag);
            e = cudaDeviceSynchronize();
            double t = now() - t0;
            if (rep) printf("%s zero-copy read, grid %d: %.1f GB/s (%s)\n", what, grid, bytes / t / 1e9, cudaGetErrorString(e));
        }
    }
    for (int rep = 0; rep < 2; rep++) {
        double t0 = now();
        e = cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice);
        double t = now() - t0;
        if (rep) printf("%s memcpy H2D: %.1f GB/s (%s)\n", what, bytes / t / 1e9, cudaGetErrorString(e));
    }
}

int main(int argc, char **argv) {
    const char *path = argv[1];
    size_t mb = argc > 2 ? atoi(argv[2]) : 1024, bytes = mb << 20;
    int fd = open(path, O_RDONLY);
    struct stat st;
    fstat(fd, &st);
    if ((size_t)st.st_size < bytes) bytes = st.st_size & ~(size_t)4095;
    void *map = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
    volatile unsigned char sink = 0;
    for (size_t i = 0; i < bytes; i += 4096) sink ^= ((unsigned char *)map)[i];
    void *dev;
    int *dflag;
    cudaMalloc(&dev, bytes);
    cudaMalloc(&dflag, 4);
    double t0 = now();
    cudaError_t e = cudaHostRegister(map, bytes, cudaHostRegisterReadOnly | cudaHostRegisterMapped | cudaHostRegisterPortable);
    printf("cudaHostRegister(read-only mmap, %zu MB): %s in %.3f s\n", bytes >> 20, cudaGetErrorString(e), now() - t0);
    if (e == cudaSuccess) bench_read("registered mmap", map, bytes, dev, dflag);
    else cudaGetLastError();
    void *pinned;
    t0 = now();
    e = cudaHostAlloc(&pinned, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
    printf("cudaHostAlloc(%zu MB): %s in %.3f s\n", bytes >> 20, cudaGetErrorString(e), now() - t0);
    memcpy(pinned, map, bytes);
    bench_read("pinned", pinned, bytes, dev, dflag);
    return 0;
}
