/* Device discovery, the per-device context (streams, cuBLAS), and what the context costs in
 * device memory: the budget counts only the arena, so the context is measured and reported. */
#include "cuda/cuda_internal.cuh"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

pshard_status cuda_fail(cudaError_t err, const char *expr, const char *file, int line) {
    cudaGetLastError(); /* clear a non-sticky error so later calls are not blamed for it */
    return core_fail(err == cudaErrorMemoryAllocation ? PSHARD_ERR_NOMEM : PSHARD_ERR_IO, "%s:%d: %s: %s (%s)",
                     file, line, expr, cudaGetErrorString(err), cudaGetErrorName(err));
}

pshard_status cuda_fail_blas(cublasStatus_t err, const char *expr, const char *file, int line) {
    return core_fail(err == CUBLAS_STATUS_ALLOC_FAILED ? PSHARD_ERR_NOMEM : PSHARD_ERR_IO, "%s:%d: %s: %s", file,
                     line, expr, cublasGetStatusString(err));
}

/* Every kernel is loaded when the runtime starts, not at its first launch: lazily loaded
 * modules would take device memory after the context was measured, outside the budget. A
 * CUDA_MODULE_LOADING the user set is kept. */
static void load_modules_eagerly(void) { setenv("CUDA_MODULE_LOADING", "EAGER", 0); }

bool cuda_dep_launch = false;

__global__ void dep_probe_kernel() {}

/* Whether this device runs the kernels as their sm_90 code (compiled from compute_90 PTX), which
 * has the dependent-launch instructions: not an older GPU, nor a newer one JIT-compiling the
 * compute_75 PTX (cuda_internal.cuh). */
static bool dep_launch_runs(void) {
    cudaFuncAttributes attr;
    if (cudaFuncGetAttributes(&attr, dep_probe_kernel) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return attr.ptxVersion >= 90 && attr.binaryVersion >= 90;
}

extern "C" int cuda_device_count(void) {
    load_modules_eagerly();
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
    snprintf(info->name, sizeof info->name, "%s", prop.name);
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

extern "C" pshard_status cuda_device_identify(int device, char *name, size_t name_size, int *driver_version) {
    cudaDeviceProp prop;
    cudaError_t err = cudaGetDeviceProperties(&prop, device);
    if (err != cudaSuccess)
        return core_fail(PSHARD_ERR_IO, "CUDA device %d: %s", device, cudaGetErrorString(err));
    snprintf(name, name_size, "%s", prop.name);
    cudaDriverGetVersion(driver_version);
    return PSHARD_OK;
}

extern "C" pshard_status cuda_device_memory(uint64_t *free_bytes, uint64_t *total_bytes) {
    size_t f = 0, t = 0;
    CUDA_TRY(cudaMemGetInfo(&f, &t));
    *free_bytes = f;
    *total_bytes = t;
    return PSHARD_OK;
}

/* Free device memory before any CUDA context exists: only NVML can see it (every runtime
 * call that reports memory creates the context first). Loaded at run time so that pshard
 * does not link against the driver's management library. */
static bool nvml_free_bytes(const char *pci_bus_id, uint64_t *free_bytes) {
    struct nvml_memory { unsigned long long total, free, used; } mem;
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return false;
    typedef int (*init_fn)(void);
    typedef int (*handle_fn)(const char *, void **);
    typedef int (*mem_fn)(void *, struct nvml_memory *);
    init_fn init = (init_fn)dlsym(lib, "nvmlInit_v2");
    init_fn shutdown = (init_fn)dlsym(lib, "nvmlShutdown");
    handle_fn by_bus = (handle_fn)dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
    mem_fn get_mem = (mem_fn)dlsym(lib, "nvmlDeviceGetMemoryInfo");
    bool ok = false;
    if (init && shutdown && by_bus && get_mem && init() == 0) {
        void *dev = NULL;
        if (by_bus(pci_bus_id, &dev) == 0 && get_mem(dev, &mem) == 0) {
            *free_bytes = mem.free;
            ok = true;
        }
        shutdown();
    }
    dlclose(lib);
    return ok;
}

extern "C" pshard_status cuda_ctx_create(int device, struct cuda_ctx **out) {
    *out = NULL;
    struct cuda_ctx *ctx = (struct cuda_ctx *)calloc(1, sizeof *ctx);
    if (!ctx) return core_fail(PSHARD_ERR_NOMEM, "CUDA context: out of host memory");
    ctx->device = device;
    struct cuda_ctx_info *info = &ctx->info;

    cudaDeviceProp prop;
    pshard_status st = PSHARD_OK;
    char bus_id[64] = "";
#define CTX_TRY(expr)                                                                            \
    do {                                                                                         \
        cudaError_t e_ = (expr);                                                                 \
        if (e_ != cudaSuccess) {                                                                 \
            st = cuda_fail(e_, #expr, __FILE__, __LINE__);                                       \
            goto fail;                                                                           \
        }                                                                                        \
    } while (0)
    CTX_TRY(cudaGetDeviceProperties(&prop, device));
    snprintf(info->name, sizeof info->name, "%s", prop.name);
    info->sm_count = prop.multiProcessorCount;
    info->l2_bytes = (uint64_t)prop.l2CacheSize;
    if (cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device) == cudaSuccess)
        info->measured_before = nvml_free_bytes(bus_id, &info->free_before_bytes);
    else
        cudaGetLastError();

    load_modules_eagerly();
    CTX_TRY(cudaSetDevice(device));
    CTX_TRY(cudaFree(0)); /* creates the primary context now, so it is measured here */
    cuda_dep_launch = dep_launch_runs();
    CTX_TRY(cudaStreamCreateWithFlags(&ctx->compute, cudaStreamNonBlocking));
    CTX_TRY(cudaStreamCreateWithFlags(&ctx->copy, cudaStreamNonBlocking));
    {
        size_t f = 0, t = 0;
        CTX_TRY(cudaMemGetInfo(&f, &t));
        info->free_after_bytes = f;
        info->total_bytes = t;
        info->context_bytes = info->measured_before && info->free_before_bytes > f ? info->free_before_bytes - f
                                                                                    : (uint64_t)(t - f);
    }
    {
        /* cuBLAS takes device memory at its first products too (kernels, handles of its Lt
         * layer), not only at creation: one product of each kind the executor runs, on a
         * scratch buffer freed again, so all of it is measured here and not later inside
         * the budget. */
        size_t f0 = 0, f1 = 0, t = 0;
        CTX_TRY(cudaMemGetInfo(&f0, &t));
        cublasStatus_t bs = cublasCreate(&ctx->blas);
        if (bs != CUBLAS_STATUS_SUCCESS) {
            ctx->blas = NULL;
            st = cuda_fail_blas(bs, "cublasCreate", __FILE__, __LINE__);
            goto fail;
        }
        enum { N = 256, WORK = 4 << 20 };
        void *scratch = NULL;
        CTX_TRY(cudaMalloc(&scratch, 3 * N * N * 4 + WORK));
        uint8_t *a = (uint8_t *)scratch, *b = a + N * N * 4, *c = b + N * N * 4, *work = c + N * N * 4;
        CTX_TRY(cudaMemset(scratch, 0, 3 * N * N * 4));
        const float one = 1.0f, zero = 0.0f;
        cublasSetStream(ctx->blas, ctx->compute);
        cublasSetWorkspace(ctx->blas, work, WORK);
        const cudaDataType types[] = {CUDA_R_16F, CUDA_R_16BF, CUDA_R_32F};
        for (int i = 0; i < 3; i++)
            for (int n = 16; n <= N; n *= 4)
                cublasGemmEx(ctx->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, n, N, &one, a, types[i], N, b, types[i], N, &zero, c,
                             CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        CTX_TRY(cudaStreamSynchronize(ctx->compute));
        cublasSetWorkspace(ctx->blas, NULL, 0);
        CTX_TRY(cudaFree(scratch));
        CTX_TRY(cudaMemGetInfo(&f1, &t));
        info->blas_bytes = f0 > f1 ? f0 - f1 : 0;
    }
#undef CTX_TRY
    ctx->gemm_path = CUDA_GEMM_AUTO;
    *out = ctx;
    return PSHARD_OK;
fail:
    cuda_ctx_destroy(ctx);
    return st;
}

extern "C" void cuda_ctx_destroy(struct cuda_ctx *ctx) {
    if (!ctx) return;
    if (ctx->blas) cublasDestroy(ctx->blas);
    if (ctx->copy) cudaStreamDestroy(ctx->copy);
    if (ctx->compute) cudaStreamDestroy(ctx->compute);
    free(ctx);
}

extern "C" const struct cuda_ctx_info *cuda_ctx_info(const struct cuda_ctx *ctx) { return &ctx->info; }
extern "C" cuda_stream cuda_ctx_compute_stream(const struct cuda_ctx *ctx) { return (cuda_stream)ctx->compute; }
extern "C" cuda_stream cuda_ctx_copy_stream(const struct cuda_ctx *ctx) { return (cuda_stream)ctx->copy; }

extern "C" pshard_status cuda_ctx_set_blas_workspace(struct cuda_ctx *ctx, void *dev, size_t bytes) {
    BLAS_TRY(cublasSetWorkspace(ctx->blas, dev, bytes));
    return PSHARD_OK;
}

extern "C" void cuda_ctx_set_gemm_path(struct cuda_ctx *ctx, enum cuda_gemm_path path) { ctx->gemm_path = path; }

/* ---- block geometry */

int cuda_block_elems(enum quant_type type) {
    switch (type) {
    case QUANT_F32: case QUANT_F16: case QUANT_BF16:
    case QUANT_Q4_0: case QUANT_Q4_1: case QUANT_Q5_0: case QUANT_Q5_1: case QUANT_Q8_0: return 32;
    case QUANT_Q2_K: case QUANT_Q3_K: case QUANT_Q4_K: case QUANT_Q5_K: case QUANT_Q6_K: return 256;
    default: return 0;
    }
}

int cuda_block_bytes(enum quant_type type) {
    switch (type) {
    case QUANT_F32: return 128;
    case QUANT_F16: case QUANT_BF16: return 64;
    case QUANT_Q4_0: return 18;
    case QUANT_Q4_1: return 20;
    case QUANT_Q5_0: return 22;
    case QUANT_Q5_1: return 24;
    case QUANT_Q8_0: return 34;
    case QUANT_Q2_K: return 84;
    case QUANT_Q3_K: return 110;
    case QUANT_Q4_K: return 144;
    case QUANT_Q5_K: return 176;
    case QUANT_Q6_K: return 210;
    default: return 0;
    }
}

extern "C" bool cuda_type_supported(enum quant_type type) { return cuda_block_elems(type) != 0; }

