/* A timeline of a CUDA program's GPU work, where Nsight Systems is not installed: a CUPTI
 * injection library that records every kernel (graph nodes included), memory copy and memset with
 * its GPU start and end, and writes them as CSV when the program exits. bench/kernel_trace.py runs
 * a command under it and tells where a window of the run went: each kernel's time, the copies,
 * and the time the GPU sat idle between them (the host's share of a step).
 *
 *   CUDA_INJECTION64_PATH=build/tests/device/libkernel_trace.so KERNEL_TRACE_FILE=trace.csv CMD...
 *
 * Each line: kind (kernel, memcpy, memset), start and end in ns on the GPU's clock, stream,
 * grid and block (kernels), bytes (copies and memsets), copy direction, name. Records reach the
 * file through CUPTI's buffers: one CSV line costs nothing on the GPU, and the kernels run with
 * no serialization (CONCURRENT_KERNEL). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cupti.h>

enum { TRACE_BUFFER_BYTES = 8 << 20 };

static FILE *trace_out;

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, TRACE_BUFFER_BYTES);
    *size = *buffer ? TRACE_BUFFER_BYTES : 0;
    *max_records = 0;
}

static const char *copy_kind(uint8_t kind) {
    switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "PtoP";
    default: return "other";
    }
}

/* A kernel's name in the CSV: quoted, any quote inside doubled. */
static void put_name(const char *name) {
    fputc('"', trace_out);
    for (const char *c = name ? name : "?"; *c; c++) {
        if (*c == '"') fputc('"', trace_out);
        fputc(*c, trace_out);
    }
    fputs("\"\n", trace_out);
}

static void write_record(const CUpti_Activity *record) {
    switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)record;
        fprintf(trace_out, "kernel,%llu,%llu,%u,%dx%dx%d,%dx%dx%d,0,,", (unsigned long long)k->start,
                (unsigned long long)k->end, k->streamId, k->gridX, k->gridY, k->gridZ, k->blockX, k->blockY, k->blockZ);
        put_name(k->name);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)record;
        fprintf(trace_out, "memcpy,%llu,%llu,%u,,,%llu,%s,", (unsigned long long)m->start, (unsigned long long)m->end,
                m->streamId, (unsigned long long)m->bytes, copy_kind(m->copyKind));
        put_name("memcpy");
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)record;
        fprintf(trace_out, "memset,%llu,%llu,%u,,,%llu,,", (unsigned long long)m->start, (unsigned long long)m->end,
                m->streamId, (unsigned long long)m->bytes);
        put_name("memset");
        break;
    }
    default: break;
    }
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *record = NULL;
    while (trace_out && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) write_record(record);
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped)
        fprintf(stderr, "kernel_trace: CUPTI dropped %zu records\n", dropped);
    free(buffer);
}

static void finish(void) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (trace_out) fclose(trace_out);
    trace_out = NULL;
}

/* CUDA calls this once, at the program's first CUDA call, for the library CUDA_INJECTION64_PATH names. */
int InitializeInjection(void) {
    const char *path = getenv("KERNEL_TRACE_FILE");
    if (!path || !*path) path = "kernel_trace.csv";
    trace_out = fopen(path, "w");
    if (!trace_out) {
        fprintf(stderr, "kernel_trace: cannot write %s\n", path);
        return 0;
    }
    fputs("kind,start_ns,end_ns,stream,grid,block,bytes,copy,name\n", trace_out);
    const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                        CUPTI_ACTIVITY_KIND_MEMSET};
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_trace: CUPTI refused the activity buffers\n");
        return 0;
    }
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (cuptiActivityEnable(kinds[i]) != CUPTI_SUCCESS) {
            fprintf(stderr, "kernel_trace: CUPTI cannot record activity kind %d\n", (int)kinds[i]);
            return 0;
        }
    atexit(finish);
    return 1;
}
