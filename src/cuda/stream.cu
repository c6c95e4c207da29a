/* Streams, events, asynchronous copies and pinned host memory: the pieces the executor uses to
 * overlap weight streaming (copy stream) with compute (compute stream). */
#include "cuda/cuda_internal.cuh"

#include <string.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
static inline void cpu_relax(void) { _mm_pause(); }
#else
static inline void cpu_relax(void) {}
#endif

extern "C" pshard_status cuda_stream_create(cuda_stream *out) {
    cudaStream_t s;
    CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *out = (cuda_stream)s;
    return PSHARD_OK;
}

extern "C" void cuda_stream_destroy(cuda_stream s) {
    if (s) cudaStreamDestroy(raw_stream(s));
}

extern "C" pshard_status cuda_stream_sync(cuda_stream s) {
    CUDA_TRY(cudaStreamSynchronize(raw_stream(s)));
    return PSHARD_OK;
}

extern "C" pshard_status cuda_graph_capture_begin(cuda_stream s) {
    /* Relaxed: cuBLAS and other libraries may make calls that are unsafe only for the
     * other capture modes; nothing else runs on this thread meanwhile. */
    CUDA_TRY(cudaStreamBeginCapture(raw_stream(s), cudaStreamCaptureModeRelaxed));
    return PSHARD_OK;
}

extern "C" pshard_status cuda_graph_capture_end(cuda_stream s, cuda_graph *out) {
    *out = NULL;
    cudaGraph_t graph;
    CUDA_TRY(cudaStreamEndCapture(raw_stream(s), &graph));
    cudaGraphExec_t exec;
    cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    CUDA_TRY(err);
    *out = (cuda_graph)exec;
    return PSHARD_OK;
}

extern "C" pshard_status cuda_graph_launch(cuda_graph g, cuda_stream s) {
    CUDA_TRY(cudaGraphLaunch((cudaGraphExec_t)g, raw_stream(s)));
    return PSHARD_OK;
}

extern "C" void cuda_graph_destroy(cuda_graph g) {
    if (g) cudaGraphExecDestroy((cudaGraphExec_t)g);
}

/* The GPU's clock, in ns. */
__device__ static inline uint64_t global_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Copies before the raise have landed in host memory when it runs (stream order); the fence
 * orders the flag (and the stamp) after any earlier writes of this stream's kernels. */
__global__ void flag_raise_kernel(volatile uint32_t *flag, volatile uint64_t *stamp) {
    if (stamp) *stamp = global_ns();
    __threadfence_system();
    *flag = 1;
}

__global__ void flag_wait_kernel(volatile uint32_t *flag, volatile uint64_t *stamp) {
    while (*flag != 1) __nanosleep(100);
    *flag = 0;
    if (stamp) *stamp = global_ns();
    __threadfence_system();
}

extern "C" pshard_status cuda_flag_raise(uint32_t *flag_dev, uint64_t *stamp_dev, cuda_stream s) {
    flag_raise_kernel<<<1, 1, 0, raw_stream(s)>>>(flag_dev, stamp_dev);
    CUDA_TRY_LAUNCH("flag raise");
    return PSHARD_OK;
}

extern "C" pshard_status cuda_flag_wait(uint32_t *flag_dev, uint64_t *stamp_dev, cuda_stream s) {
    flag_wait_kernel<<<1, 1, 0, raw_stream(s)>>>(flag_dev, stamp_dev);
    CUDA_TRY_LAUNCH("flag wait");
    return PSHARD_OK;
}

extern "C" pshard_status cuda_flag_host_wait(volatile uint32_t *flag, cuda_stream s) {
    for (uint32_t spins = 1; __atomic_load_n(flag, __ATOMIC_ACQUIRE) != 1; spins++) {
        cpu_relax();
        if (spins % 65536 == 0) { /* now and then: has the stream failed (or ended without us)? */
            const cudaError_t err = cudaStreamQuery(raw_stream(s));
            if (err == cudaSuccess && __atomic_load_n(flag, __ATOMIC_ACQUIRE) != 1)
                return core_fail(PSHARD_ERR_INTERNAL, "the GPU finished its step without the hand-off the host waits for");
            if (err != cudaSuccess && err != cudaErrorNotReady) CUDA_TRY(err);
        }
    }
    *flag = 0;
    return PSHARD_OK;
}

extern "C" void cuda_flag_host_raise(volatile uint32_t *flag) { __atomic_store_n(flag, 1u, __ATOMIC_RELEASE); }

extern "C" pshard_status cuda_event_create(bool timing, cuda_event *out) {
    cudaEvent_t e;
    CUDA_TRY(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
    *out = (cuda_event)e;
    return PSHARD_OK;
}

extern "C" void cuda_event_destroy(cuda_event e) {
    if (e) cudaEventDestroy((cudaEvent_t)e);
}

extern "C" pshard_status cuda_event_record(cuda_event e, cuda_stream s) {
    CUDA_TRY(cudaEventRecord((cudaEvent_t)e, raw_stream(s)));
    return PSHARD_OK;
}

extern "C" pshard_status cuda_stream_wait(cuda_stream s, cuda_event e) {
    CUDA_TRY(cudaStreamWaitEvent(raw_stream(s), (cudaEvent_t)e, 0));
    return PSHARD_OK;
}

extern "C" pshard_status cuda_event_sync(cuda_event e) {
    CUDA_TRY(cudaEventSynchronize((cudaEvent_t)e));
    return PSHARD_OK;
}

extern "C" pshard_status cuda_event_done(cuda_event e, bool *done) {
    cudaError_t err = cudaEventQuery((cudaEvent_t)e);
    if (err == cudaErrorNotReady) {
        *done = false;
        return PSHARD_OK;
    }
    CUDA_TRY(err);
    *done = true;
    return PSHARD_OK;
}

extern "C" pshard_status cuda_event_elapsed_ms(cuda_event start, cuda_event end, float *ms) {
    CUDA_TRY(cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end));
    return PSHARD_OK;
}

extern "C" pshard_status cuda_copy_h2d(void *dst_dev, const void *src_host, size_t bytes, cuda_stream s) {
    CUDA_TRY(cudaMemcpyAsync(dst_dev, src_host, bytes, cudaMemcpyHostToDevice, raw_stream(s)));
    return PSHARD_OK;
}

extern "C" pshard_status cuda_copy_d2h(void *dst_host, const void *src_dev, size_t bytes, cuda_stream s) {
    CUDA_TRY(cudaMemcpyAsync(dst_host, src_dev, bytes, cudaMemcpyDeviceToHost, raw_stream(s)));
    return PSHARD_OK;
}

extern "C" pshard_status cuda_copy_d2d(void *dst_dev, const void *src_dev, size_t bytes, cuda_stream s) {
    CUDA_TRY(cudaMemcpyAsync(dst_dev, src_dev, bytes, cudaMemcpyDeviceToDevice, raw_stream(s)));
    return PSHARD_OK;
}

extern "C" pshard_status cuda_memset(void *dst_dev, int value, size_t bytes, cuda_stream s) {
    CUDA_TRY(cudaMemsetAsync(dst_dev, value, bytes, raw_stream(s)));
    return PSHARD_OK;
}

/* ---- pinned host memory */

/* The range a registration of [ptr, ptr + bytes) covers: registration works on whole pages, and an
 * mmapped tensor rarely starts on one. */
static void page_span(void *ptr, size_t bytes, struct cuda_pinned *out) {
    memset(out, 0, sizeof *out);
    out->ptr = ptr;
    out->bytes = bytes;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t begin = (uintptr_t)ptr & ~(page - 1);
    out->base = (void *)begin;
    out->base_bytes = (((uintptr_t)ptr + bytes + page - 1) & ~(page - 1)) - begin;
}

extern "C" pshard_status cuda_host_register(void *ptr, size_t bytes, bool required, struct cuda_pinned *out) {
    page_span(ptr, bytes, out);
    CUDA_ARG(ptr && bytes > 0, "cudaHostRegister: empty range");
    /* Read-only first: a PROT_READ file mapping can only be registered that way. */
    cudaError_t err = cudaHostRegister(out->base, out->base_bytes, cudaHostRegisterReadOnly | cudaHostRegisterPortable | cudaHostRegisterMapped);
    if (err == cudaSuccess) {
        out->pinned = out->read_only = true;
        return PSHARD_OK;
    }
    cudaGetLastError();
    cudaError_t err2 = cudaHostRegister(out->base, out->base_bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
    if (err2 == cudaSuccess) {
        out->pinned = true;
        return PSHARD_OK;
    }
    cudaGetLastError();
    if (!required) return PSHARD_OK; /* stays pageable: correct, but copies run at ~1/5 speed */
    return core_fail(PSHARD_ERR_IO,
                     "cannot pin %.1f MiB of host memory at %p for GPU copies (read-only: %s; read-write: %s); "
                     "check the locked-memory limit (ulimit -l) or that the range is mapped",
                     out->base_bytes / 1048576.0, out->base, cudaGetErrorString(err), cudaGetErrorString(err2));
}

extern "C" pshard_status cuda_host_register_writable(void *ptr, size_t bytes, struct cuda_pinned *out) {
    page_span(ptr, bytes, out);
    CUDA_ARG(ptr && bytes > 0, "cudaHostRegister: empty range");
    if (cudaHostRegister(out->base, out->base_bytes, cudaHostRegisterPortable) == cudaSuccess) out->pinned = true;
    else cudaGetLastError(); /* stays pageable: correct, slower */
    return PSHARD_OK;
}

extern "C" pshard_status cuda_host_device_pointer(const void *host, const void **dev) {
    void *p = NULL;
    cudaError_t err = cudaHostGetDevicePointer(&p, (void *)host, 0);
    if (err != cudaSuccess) {
        cudaGetLastError();
        *dev = NULL;
        return core_fail(PSHARD_ERR_INTERNAL, "host address %p is not readable by the GPU: %s", host,
                         cudaGetErrorString(err));
    }
    *dev = p;
    return PSHARD_OK;
}

extern "C" pshard_status cuda_host_alloc(size_t bytes, struct cuda_pinned *out) {
    memset(out, 0, sizeof *out);
    CUDA_ARG(bytes > 0, "cudaMallocHost: size 0");
    void *p = NULL;
    cudaError_t err = cudaMallocHost(&p, bytes);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return core_fail(PSHARD_ERR_NOMEM, "cannot allocate %.1f MiB of pinned host memory: %s", bytes / 1048576.0,
                         cudaGetErrorString(err));
    }
    out->ptr = out->base = p;
    out->bytes = out->base_bytes = bytes;
    out->pinned = out->allocated = true;
    return PSHARD_OK;
}

/* Zeroed pinned memory and the address the GPU reads and writes it through. */
static pshard_status mapped_zeroed(size_t bytes, struct cuda_pinned *out, void **dev) {
    CORE_TRY(cuda_host_alloc(bytes, out));
    memset(out->ptr, 0, out->bytes);
    const void *d = NULL;
    const pshard_status st = cuda_host_device_pointer(out->ptr, &d);
    *dev = (void *)d;
    return st;
}

extern "C" pshard_status cuda_flags_alloc(size_t n, struct cuda_pinned *out, uint32_t **dev) {
    return mapped_zeroed(sizeof(uint32_t) * n, out, (void **)dev);
}

extern "C" pshard_status cuda_stamps_alloc(size_t n, struct cuda_pinned *out, uint64_t **dev) {
    return mapped_zeroed(sizeof(uint64_t) * n, out, (void **)dev);
}

extern "C" void cuda_pinned_release(struct cuda_pinned *p) {
    if (p->allocated) cudaFreeHost(p->base);
    else if (p->pinned) cudaHostUnregister(p->base);
    memset(p, 0, sizeof *p);
}
