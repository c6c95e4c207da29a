/* A stand-in for a game beside pshard: it keeps a working set of device memory (its assets) and
 * renders "frames" at a target rate, each a kernel reading a share of every asset. What it wants
 * changes over time in a scripted pattern (a level loads, a scene changes); it takes memory in
 * chunks with cudaMalloc and gives it back with cudaFree. Where it cannot have what it wants (the
 * memory is taken), each frame streams its share of the missing assets from pinned host memory
 * instead (as a game streams textures it could not keep), so its frames slow down and miss their
 * deadline. Every second it logs (CSV) the frame rate, frame times, missed frames, the memory it
 * has and wants, and the device's free memory.
 *
 * Build: nvcc -O2 -o game_standin bench/game_standin.cu   (bench/coexec.sh does)
 * Usage: game_standin --pattern T:SIZE[,T:SIZE...] [--fps N] [--read F] [--chunk SIZE] [--duration S]
 *                     [--log FILE] [--device N]
 *   --pattern   from second T on it wants SIZE (e.g. 0:4G,20:12G,40:6G)
 *   --fps       target frame rate (default 60)
 *   --read      share of each asset a frame reads (default 0.25)
 *   --chunk     allocation unit (default 256M)
 *   --duration  seconds to run (default: the last pattern time + 20)
 */
#include <cuda_runtime.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#define CHECK(expr)                                                                                          \
    do {                                                                                                     \
        cudaError_t e_ = (expr);                                                                             \
        if (e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "game_standin: %s: %s (%s:%d)\n", #expr, cudaGetErrorString(e_), __FILE__, __LINE__); \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

enum { MAX_STEPS = 64, STREAM_BUFFER_MB = 256, RETRY_MS = 100 };

struct step {
    double at_s;
    size_t want;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* "4G", "512M", "100K", "123" in bytes; 0 on a bad one. */
static size_t parse_size(const char *s) {
    char *end;
    const double v = strtod(s, &end);
    double mult = 1;
    if (*end == 'G' || *end == 'g') mult = 1 << 30, end++;
    else if (*end == 'M' || *end == 'm') mult = 1 << 20, end++;
    else if (*end == 'K' || *end == 'k') mult = 1 << 10, end++;
    if (*end || v < 0 || end == s) return 0;
    return (size_t)(v * mult);
}

static int parse_pattern(const char *text, struct step *steps) {
    int n = 0;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", text);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(tok, ':');
        if (!colon || n == MAX_STEPS) return -1;
        *colon = 0;
        steps[n].at_s = atof(tok);
        steps[n].want = parse_size(colon + 1);
        if (!steps[n].want && strcmp(colon + 1, "0")) return -1;
        if (n && steps[n].at_s < steps[n - 1].at_s) return -1;
        n++;
    }
    return n;
}

/* Rendering: every thread sums a strided slice of the bytes it is given (so the read is real). */
__global__ void render(const uint4 *data, size_t n, unsigned *sink) {
    uint32_t acc = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = data[i];
        acc ^= v.x + v.y + v.z + v.w;
    }
    if (acc == 0x12345678u) atomicAdd(sink, 1u);
}

int main(int argc, char **argv) {
    const char *pattern = NULL, *log_path = NULL;
    double fps = 60, read_share = 0.25, duration = -1;
    size_t chunk = 256u << 20;
    int device = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) { fprintf(stderr, "game_standin: %s needs a value\n", a); return 2; }
        if (!strcmp(a, "--pattern")) pattern = v;
        else if (!strcmp(a, "--fps")) fps = atof(v);
        else if (!strcmp(a, "--read")) read_share = atof(v);
        else if (!strcmp(a, "--chunk")) chunk = parse_size(v);
        else if (!strcmp(a, "--duration")) duration = atof(v);
        else if (!strcmp(a, "--log")) log_path = v;
        else if (!strcmp(a, "--device")) device = atoi(v);
        else { fprintf(stderr, "game_standin: unknown option %s\n", a); return 2; }
        i++;
    }
    struct step steps[MAX_STEPS];
    const int n_steps = pattern ? parse_pattern(pattern, steps) : -1;
    if (n_steps <= 0 || fps <= 0 || fps > 1000 || read_share <= 0 || read_share > 1 || chunk < (1u << 20)) {
        fprintf(stderr, "usage: game_standin --pattern T:SIZE[,T:SIZE...] [--fps N] [--read F] [--chunk SIZE] "
                        "[--duration S] [--log FILE] [--device N]\n");
        return 2;
    }
    if (duration < 0) duration = steps[n_steps - 1].at_s + 20;
    FILE *log = log_path ? fopen(log_path, "w") : stdout;
    if (!log) { fprintf(stderr, "game_standin: %s: %s\n", log_path, strerror(errno)); return 1; }
    fprintf(log, "t_s,fps,frame_ms_p50,frame_ms_p99,missed,have_mib,want_mib,device_free_mib\n");
    fflush(log);

    CHECK(cudaSetDevice(device));
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    unsigned *sink;
    CHECK(cudaMalloc(&sink, sizeof *sink));
    void *host = NULL, *staging = NULL; /* where assets not in VRAM come from, and where they land */
    const size_t stream_bytes = (size_t)STREAM_BUFFER_MB << 20;
    CHECK(cudaMallocHost(&host, stream_bytes));
    memset(host, 1, stream_bytes);
    CHECK(cudaMalloc(&staging, stream_bytes));

    std::vector<void *> chunks;
    const double interval = 1.0 / fps, start = now_s();
    double next_frame = start, last_try = 0, second = start;
    std::vector<double> frame_ms;
    int missed = 0;
    for (double t = 0; t < duration; t = now_s() - start) {
        size_t want = 0;
        for (int s = 0; s < n_steps; s++)
            if (t >= steps[s].at_s) want = steps[s].want;
        const size_t want_chunks = (want + chunk - 1) / chunk;
        while (chunks.size() > want_chunks) { /* give back what the scene no longer needs */
            CHECK(cudaFree(chunks.back()));
            chunks.pop_back();
        }
        if (chunks.size() < want_chunks && now_s() - last_try >= RETRY_MS / 1e3) { /* take what it wants, if free */
            last_try = now_s();
            while (chunks.size() < want_chunks) {
                void *p = NULL;
                if (cudaMalloc(&p, chunk) != cudaSuccess) {
                    cudaGetLastError();
                    break;
                }
                CHECK(cudaMemsetAsync(p, 1, chunk, stream));
                chunks.push_back(p);
            }
        }
        /* The frame: read a share of every asset in VRAM; stream the share of the missing ones. */
        const double f0 = now_s();
        const size_t per = (size_t)(chunk * read_share) / sizeof(uint4);
        for (void *p : chunks) render<<<264, 256, 0, stream>>>((const uint4 *)p, per, sink);
        size_t missing = (want_chunks - chunks.size()) * (size_t)(chunk * read_share);
        while (missing > 0) {
            const size_t n = std::min(missing, stream_bytes);
            CHECK(cudaMemcpyAsync(staging, host, n, cudaMemcpyHostToDevice, stream));
            render<<<264, 256, 0, stream>>>((const uint4 *)staging, n / sizeof(uint4), sink);
            missing -= n;
        }
        CHECK(cudaStreamSynchronize(stream));
        const double took = now_s() - f0;
        frame_ms.push_back(took * 1e3);
        next_frame += interval;
        if (now_s() > next_frame + interval / 2) { /* missed its deadline: the next one starts now */
            missed++;
            next_frame = now_s();
        }
        const double sleep_s = next_frame - now_s();
        if (sleep_s > 0) usleep((useconds_t)(sleep_s * 1e6));
        if (now_s() - second >= 1.0) {
            std::sort(frame_ms.begin(), frame_ms.end());
            size_t free_b = 0, total_b = 0;
            cudaMemGetInfo(&free_b, &total_b);
            const double span = now_s() - second;
            fprintf(log, "%.2f,%.1f,%.2f,%.2f,%d,%zu,%zu,%zu\n", now_s() - start, frame_ms.size() / span,
                    frame_ms[frame_ms.size() / 2], frame_ms[(frame_ms.size() * 99) / 100],
                    missed, chunks.size() * chunk >> 20, want >> 20, free_b >> 20);
            fflush(log);
            frame_ms.clear();
            missed = 0;
            second = now_s();
        }
    }
    for (void *p : chunks) cudaFree(p);
    cudaFree(staging);
    cudaFreeHost(host);
    cudaFree(sink);
    cudaStreamDestroy(stream);
    if (log != stdout) fclose(log);
    return 0;
}
