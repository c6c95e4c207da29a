/* Kernel benchmarks of the CUDA backend on the GPU at hand, printed as markdown tables for
 * bench/cuda_kernels.md: the context's size, the HBM copy bandwidth (the ceiling), matvec GB/s
 * per format at 1..8 tokens on 4096 x 14336 matrices, prefill GEMM TFLOP/s (fused kernel
 * against dequantize + cuBLAS) at 512 and 1024 tokens, attention (decode at 4K context,
 * prefill of 1K tokens, and the two kernels against each other for steps of 8-128 tokens of one
 * sequence over caches of 1K-32K cells), products reading host memory in place (by memory kind
 * and work buffer, and F16 by llama8b's shapes) and one MoE layer of qwen30b's shape. Weights rotate through copies
 * larger than the L2 cache so every number is an HBM number. Speed does not depend on the
 * values, so weights are random bytes.
 *
 * Build: with the device tests (tests/device/CMakeLists.txt), as cuda_bench.
 * Run:   build-dev/cuda_bench   (tests/device/run.sh runs it after the tests);
 *        build-dev/cuda_bench attention   the attention tables alone
 *        build-dev/cuda_bench matvec      the copy ceiling and the matrix-vector table alone
 *        build-dev/cuda_bench moe [N...]  the MoE layer alone (at N tokens only, e.g. under a profiler)
 *        build-dev/cuda_bench in-place    the in-place tables alone */
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "device_test.h"

static const enum quant_type all_types[] = {QUANT_F32, QUANT_F16, QUANT_BF16, QUANT_Q4_0, QUANT_Q4_1, QUANT_Q5_0,
                                            QUANT_Q5_1, QUANT_Q8_0, QUANT_Q2_K, QUANT_Q3_K, QUANT_Q4_K, QUANT_Q5_K,
                                            QUANT_Q6_K};

enum { ROTATE_BYTES = 512 << 20 }; /* weights cycled through per measurement: ~8x the L2 */

static struct dt D;
static cuda_event ev0, ev1;

/* Fill device memory with random 64-bit words ANDed with `mask` (which keeps the exponents
 * of the floats inside small in magnitude: no NaN or infinity), uploaded in 64 MiB pieces. */
static void random_device(void *dev, size_t bytes, uint64_t mask) {
    const size_t piece = 64 << 20;
    uint64_t *h = dt_malloc(piece);
    for (size_t i = 0; i < piece / 8; i++) h[i] = dt_next() & mask;
    for (size_t at = 0; at < bytes; at += piece)
        DT_CHECK(cuda_copy_h2d((uint8_t *)dev + at, h, bytes - at < piece ? bytes - at : piece, D.s));
    DT_CHECK(cuda_stream_sync(D.s));
    free(h);
}

#define MASK_F32 0xbf7fffffbf7fffffull  /* |x| < 2 */
#define MASK_F16 0xbbffbbffbbffbbffull  /* |x| < 1 */
#define MASK_BF16 0xbf7fbf7fbf7fbf7full /* |x| < 2 */

/* `copies` copies of one random matrix (quantized formats: random quants and scales with sane
 * multipliers, as the tests make them). */
static void *random_weights(enum quant_type type, int64_t rows, int64_t cols, int copies) {
    const size_t bytes = quant_row_bytes(type, cols) * (size_t)rows;
    uint8_t *dev = dt_alloc(&D, bytes * (size_t)copies);
    if (type == QUANT_F32 || type == QUANT_F16 || type == QUANT_BF16) {
        random_device(dev, bytes, type == QUANT_F32 ? MASK_F32 : type == QUANT_F16 ? MASK_F16 : MASK_BF16);
    } else {
        uint8_t *host = dt_malloc(bytes);
        dt_random_weights(type, host, rows, cols);
        DT_CHECK(cuda_copy_h2d(dev, host, bytes, D.s));
        DT_CHECK(cuda_stream_sync(D.s));
        free(host);
    }
    for (int c = 1; c < copies; c++) DT_CHECK(cuda_copy_d2d(dev + bytes * (size_t)c, dev, bytes, D.s));
    DT_CHECK(cuda_stream_sync(D.s));
    return dev;
}

static float elapsed_ms(void) {
    float ms;
    DT_CHECK(cuda_event_sync(ev1));
    DT_CHECK(cuda_event_elapsed_ms(ev0, ev1, &ms));
    return ms;
}

static void bench_copy(void) {
    const size_t bytes = 1u << 30, mark = cuda_arena_mark(&D.arena);
    void *a = dt_alloc(&D, bytes), *b = dt_alloc(&D, bytes);
    DT_CHECK(cuda_copy_d2d(b, a, bytes, D.s));
    DT_CHECK(cuda_event_record(ev0, D.s));
    for (int i = 0; i < 10; i++) DT_CHECK(cuda_copy_d2d(i % 2 ? a : b, i % 2 ? b : a, bytes, D.s));
    DT_CHECK(cuda_event_record(ev1, D.s));
    const float ms = elapsed_ms();
    printf("\nHBM device-to-device copy of 1 GiB: %.0f GB/s counting read + write (%.0f GB/s each way)\n",
           20.0 * bytes / (ms * 1e6), 10.0 * bytes / (ms * 1e6));
    cuda_arena_reset(&D.arena, mark);
}

static void bench_matvec(void) {
    printf("\n### matvec, weight GB/s (microseconds per product), weights cycled through %d MiB\n\n",
           ROTATE_BYTES >> 20);
    printf("| format | rows x cols | 1 token | 2 tokens | 4 tokens | 8 tokens |\n|---|---|---|---|---|---|\n");
    const int64_t shapes[][2] = {{14336, 4096}, {4096, 14336}};
    for (size_t t = 0; t < sizeof all_types / sizeof all_types[0]; t++)
        for (int s = 0; s < 2; s++) {
            const size_t mark = cuda_arena_mark(&D.arena);
            const enum quant_type type = all_types[t];
            const int64_t rows = shapes[s][0], cols = shapes[s][1];
            const size_t bytes = quant_row_bytes(type, cols) * (size_t)rows;
            const int copies = (int)(ROTATE_BYTES / bytes) + 1;
            uint8_t *w = random_weights(type, rows, cols, copies);
            float *x = dt_alloc(&D, sizeof(float) * (size_t)(8 * cols));
            random_device(x, sizeof(float) * (size_t)(8 * cols), MASK_F32);
            const enum quant_type at = cuda_act_type(type);
            void *act = dt_alloc(&D, cuda_act_row_bytes(at, cols) * 8);
            float *y = dt_alloc(&D, sizeof(float) * (size_t)(8 * rows));
            DT_CHECK(cuda_quantize(at, x, cols, 8, act, D.s));
            printf("| %s | %lld x %lld |", quant_type_name(type), (long long)rows, (long long)cols);
            const int nts[] = {1, 2, 4, 8};
            for (int i = 0; i < 4; i++) {
                const int iters = copies * (copies < 20 ? 200 / copies : 1) + copies;
                struct cuda_matrix m = {type, w, cols, rows, 1, quant_row_bytes(type, cols), false};
                DT_CHECK(cuda_matvec(&m, act, nts[i], y, rows, D.s)); /* warm-up */
                DT_CHECK(cuda_event_record(ev0, D.s));
                for (int it = 0; it < iters; it++) {
                    m.data = w + bytes * (size_t)(it % copies);
                    DT_CHECK(cuda_matvec(&m, act, nts[i], y, rows, D.s));
                }
                DT_CHECK(cuda_event_record(ev1, D.s));
                const double us = elapsed_ms() * 1e3 / iters;
                printf(" %.0f (%.1f) |", bytes / (us * 1e3), us);
            }
            printf("\n");
            cuda_arena_reset(&D.arena, mark);
        }
}

static void bench_gemm(void) {
    printf("\n### prefill GEMM, TFLOP/s (ms per product); cuBLAS times include dequantizing to f16\n\n");
    printf("| format | rows x cols | tokens | fused | dequant + cuBLAS |\n|---|---|---|---|---|\n");
    const enum quant_type types[] = {QUANT_Q4_0, QUANT_Q4_K, QUANT_Q6_K, QUANT_Q8_0, QUANT_F16};
    const int64_t shapes[][2] = {{14336, 4096}, {4096, 14336}};
    const int64_t tokens[] = {512, 1024};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (int s = 0; s < 2; s++)
            for (int n = 0; n < 2; n++) {
                const size_t mark = cuda_arena_mark(&D.arena);
                const int64_t rows = shapes[s][0], cols = shapes[s][1], nt = tokens[n];
                struct cuda_matrix m = {types[t], random_weights(types[t], rows, cols, 1), cols, rows, 1,
                                        quant_row_bytes(types[t], cols), false};
                float *x = dt_alloc(&D, sizeof(float) * (size_t)(nt * cols)), *y = dt_alloc(&D, sizeof(float) * (size_t)(nt * rows));
                float *hx = dt_malloc(sizeof(float) * (size_t)(nt * cols));
                dt_fill(hx, nt * cols, -1.0f, 1.0f);
                DT_CHECK(cuda_copy_h2d(x, hx, sizeof(float) * (size_t)(nt * cols), D.s));
                free(hx);
                const size_t work_bytes = (size_t)nt * (size_t)cols * 2 + (size_t)rows * (size_t)cols * 2 + 4096;
                void *work = dt_alloc(&D, work_bytes);
                printf("| %s | %lld x %lld | %lld |", quant_type_name(types[t]), (long long)rows, (long long)cols, (long long)nt);
                const enum cuda_gemm_path paths[] = {CUDA_GEMM_FUSED, CUDA_GEMM_CUBLAS};
                for (int p = 0; p < 2; p++) {
                    cuda_ctx_set_gemm_path(D.ctx, paths[p]);
                    DT_CHECK(cuda_matmul(D.ctx, &m, x, nt, y, rows, work, work_bytes, D.s));
                    const int iters = 10;
                    DT_CHECK(cuda_event_record(ev0, D.s));
                    for (int it = 0; it < iters; it++) DT_CHECK(cuda_matmul(D.ctx, &m, x, nt, y, rows, work, work_bytes, D.s));
                    DT_CHECK(cuda_event_record(ev1, D.s));
                    const double ms = elapsed_ms() / iters;
                    printf(" %.0f (%.3f) |", 2.0 * rows * cols * nt / (ms * 1e9), ms);
                }
                printf("\n");
                cuda_ctx_set_gemm_path(D.ctx, CUDA_GEMM_AUTO);
                cuda_arena_reset(&D.arena, mark);
            }
}

/* A block table for n_seq sequences of n_ctx cells, each's blocks in order (as the executor's pool
 * hands them to sequences grown alone): a layer's cache of [n_seq][n_ctx] cells read through it. */
static const int32_t *ordered_blocks(int64_t n_seq, int64_t n_ctx) {
    const int64_t n = n_seq * (n_ctx / CUDA_KV_TILE);
    int32_t *blocks = dt_malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) blocks[i] = (int32_t)i;
    const int32_t *dev = dt_upload(&D, blocks, sizeof(int32_t) * (size_t)n);
    free(blocks);
    return dev;
}

static void bench_attention(void) {
    printf("\n### attention over an f16 KV cache\n\n| case | time | rate |\n|---|---|---|\n");
    const int shapes[][3] = {{32, 8, 128}, {32, 4, 128}};
    const char *names[] = {"llama8b 32/8 x 128", "qwen30b 32/4 x 128"};
    for (int s = 0; s < 2; s++) {
        const struct cuda_attn_shape a = {shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][2],
                                          1.0f / sqrtf((float)shapes[s][2])};
        const int64_t n_ctx = 4096, n_seq = 8, width = (int64_t)a.n_head_kv * a.head_k;
        const size_t layer_bytes = 2 * (size_t)(n_seq * n_ctx * width);
        const int layers = 8; /* cycled, so the cache is read from HBM */
        const size_t mark = cuda_arena_mark(&D.arena);
        uint16_t *k = dt_alloc(&D, layer_bytes * layers), *v = dt_alloc(&D, layer_bytes * layers);
        random_device(k, layer_bytes * layers, MASK_F16);
        random_device(v, layer_bytes * layers, MASK_F16);
        const int32_t *blocks = ordered_blocks(n_seq, n_ctx);
        float *q = dt_alloc(&D, sizeof(float) * 1024 * (size_t)a.n_head * a.head_k);
        float *hq = dt_malloc(sizeof(float) * 1024 * (size_t)a.n_head * a.head_k);
        dt_fill(hq, 1024 * a.n_head * a.head_k, -1.0f, 1.0f);
        DT_CHECK(cuda_copy_h2d(q, hq, sizeof(float) * 1024 * (size_t)a.n_head * a.head_k, D.s));
        free(hq);
        int32_t hseq[1024], hpos[1024];
        float *out = dt_alloc(&D, sizeof(float) * 1024 * (size_t)a.n_head * a.head_v);
        for (int nt = 1; nt <= 8; nt *= 8) {
            for (int t = 0; t < nt; t++) hseq[t] = t, hpos[t] = (int32_t)n_ctx - 1;
            int32_t *seq = dt_upload(&D, hseq, sizeof(int32_t) * (size_t)nt), *pos = dt_upload(&D, hpos, sizeof(int32_t) * (size_t)nt);
            const size_t wb = cuda_attention_decode_work_bytes(&a, nt, (int32_t)n_ctx);
            void *work = dt_alloc(&D, wb);
            const int iters = 64;
            for (int it = -1; it < iters; it++) {
                if (it == 0) DT_CHECK(cuda_event_record(ev0, D.s));
                const int l = (it + layers) % layers;
                struct cuda_kv_layer kv = {(uint16_t *)((uint8_t *)k + layer_bytes * (size_t)l),
                                           (uint16_t *)((uint8_t *)v + layer_bytes * (size_t)l), blocks,
                                           (int32_t)(n_ctx / CUDA_KV_TILE), CUDA_KV_TILE};
                DT_CHECK(cuda_attention_decode(&a, &kv, q, seq, pos, nt, (int32_t)n_ctx, out, work, wb, D.s));
            }
            DT_CHECK(cuda_event_record(ev1, D.s));
            const double us = elapsed_ms() * 1e3 / iters;
            const double kv_bytes = 2.0 * nt * n_ctx * width * 2;
            printf("| %s, decode %d token%s x 4096 cells | %.1f us | %.0f GB/s of KV |\n", names[s], nt, nt > 1 ? "s (8 sequences)" : "",
                   us, kv_bytes / (us * 1e3));
        }
        /* Prefill: 1024 tokens of sequence 0 at positions 0..1023. */
        for (int t = 0; t < 1024; t++) hpos[t] = t;
        int32_t *pos = dt_upload(&D, hpos, sizeof hpos);
        struct cuda_kv_layer kv = {k, v, blocks, (int32_t)(n_ctx / CUDA_KV_TILE), CUDA_KV_TILE};
        DT_CHECK(cuda_attention_prefill(&a, &kv, q, 0, pos, 1024, 1024, out, NULL, 0, D.s)); /* 512 blocks: one slice */
        DT_CHECK(cuda_event_record(ev0, D.s));
        for (int it = 0; it < 10; it++) DT_CHECK(cuda_attention_prefill(&a, &kv, q, 0, pos, 1024, 1024, out, NULL, 0, D.s));
        DT_CHECK(cuda_event_record(ev1, D.s));
        const double ms = elapsed_ms() / 10;
        const double flops = 4.0 * a.n_head * a.head_k * (1024.0 * 1025.0 / 2.0);
        printf("| %s, prefill 1024 tokens (causal) | %.3f ms | %.1f TFLOP/s |\n", names[s], ms, flops / (ms * 1e9));
        cuda_arena_reset(&D.arena, mark);
    }
}

/* Steps of a few to a hundred tokens of one sequence at the end of a long cache: the split-KV
 * kernel (which reads the cache once per token) against the tensor-core prompt kernel (once per
 * tile of 64 queries, one block per head and tile), with one block walking the whole cache and
 * with the cache in slices, to say from how many tokens the prompt kernel pays at each cache
 * length (cuda_attention_prefill_pays). Layers rotate through copies larger than the L2 cache. */
static void bench_attention_crossover(void) {
    printf("\n### attention: split-KV against the prompt kernel, one sequence\n\n"
           "| shape | cache cells | tokens | split-KV | prompt kernel, one slice | prompt kernel, sliced |\n"
           "|---|---|---|---|---|---|\n");
    const int shapes[][3] = {{32, 4, 128}, {32, 8, 128}};
    const char *names[] = {"qwen30b 32/4 x 128", "llama8b 32/8 x 128"};
    const int ctxs[] = {1024, 4096, 16384, 32768};
    const int tokens[] = {8, 16, 24, 32, 40, 48, 56, 63, 64, 96, 128};
    const int n_tok = (int)(sizeof tokens / sizeof tokens[0]), max_tok = 128;
    for (int s = 0; s < 2; s++) {
        const struct cuda_attn_shape a = {shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][2],
                                          1.0f / sqrtf((float)shapes[s][2])};
        const int64_t width = (int64_t)a.n_head_kv * a.head_k, max_ctx = 32768;
        const size_t layer_bytes = 2 * (size_t)(max_ctx * width);
        const int layers = 4;
        const size_t mark = cuda_arena_mark(&D.arena);
        uint16_t *k = dt_alloc(&D, layer_bytes * layers), *v = dt_alloc(&D, layer_bytes * layers);
        random_device(k, layer_bytes * layers, MASK_F16);
        random_device(v, layer_bytes * layers, MASK_F16);
        const int32_t *blocks = ordered_blocks(1, max_ctx);
        const size_t q_floats = (size_t)max_tok * a.n_head * a.head_k;
        float *q = dt_alloc(&D, sizeof(float) * q_floats), *hq = dt_malloc(sizeof(float) * q_floats);
        dt_fill(hq, (int64_t)q_floats, -1.0f, 1.0f);
        DT_CHECK(cuda_copy_h2d(q, hq, sizeof(float) * q_floats, D.s));
        free(hq);
        float *out = dt_alloc(&D, sizeof(float) * (size_t)max_tok * a.n_head * a.head_v);
        size_t wb = 0;
        for (int c = 0; c < 4; c++)
            for (int t = 0; t < n_tok; t++) {
                const size_t need = cuda_attention_decode_work_bytes(&a, tokens[t], ctxs[c]),
                             sliced = cuda_attention_prefill_work_bytes(&a, tokens[t], ctxs[c]);
                wb = need > wb ? need : wb;
                wb = sliced > wb ? sliced : wb;
            }
        void *work = dt_alloc(&D, wb);
        int32_t hseq[128] = {0}, hpos[128];
        int32_t *seq = dt_upload(&D, hseq, sizeof hseq), *pos = dt_alloc(&D, sizeof hpos);
        for (int c = 0; c < 4; c++)
            for (int t = 0; t < n_tok; t++) {
                const int nt = tokens[t], ctx = ctxs[c];
                for (int i = 0; i < nt; i++) hpos[i] = ctx - nt + i;
                DT_CHECK(cuda_copy_h2d(pos, hpos, sizeof(int32_t) * (size_t)nt, D.s));
                double us[3];
                for (int kernel = 0; kernel < 3; kernel++) {
                    const int iters = 16;
                    for (int it = -1; it < iters; it++) {
                        if (it == 0) DT_CHECK(cuda_event_record(ev0, D.s));
                        const int l = (it + layers) % layers;
                        struct cuda_kv_layer kv = {(uint16_t *)((uint8_t *)k + layer_bytes * (size_t)l),
                                                   (uint16_t *)((uint8_t *)v + layer_bytes * (size_t)l), blocks, 0,
                                                   CUDA_KV_TILE};
                        if (kernel == 0)
                            DT_CHECK(cuda_attention_decode(&a, &kv, q, seq, pos, nt, ctx, out, work, wb, D.s));
                        else
                            DT_CHECK(cuda_attention_prefill(&a, &kv, q, 0, pos, nt, ctx, out, kernel == 2 ? work : NULL,
                                                            wb, D.s));
                    }
                    DT_CHECK(cuda_event_record(ev1, D.s));
                    us[kernel] = elapsed_ms() * 1e3 / iters;
                }
                printf("| %s | %d | %d | %.1f us | %.1f us | %.1f us%s |\n", names[s], ctx, nt, us[0], us[1], us[2],
                       us[2] < us[0] ? " *" : "");
            }
        cuda_arena_reset(&D.arena, mark);
    }
}

/* Matrix products reading their weights from host memory in place (how streamed shards run):
 * llama8b's FFN shape in Q4_0, four copies cycled, in memory from cudaMallocHost (as the profile
 * measures) and in a registered file mapping (as the executor reads the model), with a work
 * buffer the size of the profile's (256 MB) and of plans' (64 MB; llama8b at 4 GB: 14 MB): above 8 tokens a product
 * dequantizes the rows to f16 in chunks the work buffer holds, then multiplies them. */
static void bench_in_place(void) {
    printf("\n### matmul reading host memory in place, llama8b FFN 14336 x 4096 Q4_0, weight GB/s\n\n"
           "| memory | work buffer | 1 token | 8 | 16 | 64 |\n|---|---|---|---|---|---|\n");
    const int64_t rows = 14336, cols = 4096, copies = 4;
    const size_t row = quant_row_bytes(QUANT_Q4_0, cols), bytes = row * (size_t)rows;
    const size_t mark = cuda_arena_mark(&D.arena);
    float *x = dt_alloc(&D, sizeof(float) * 64 * (size_t)cols), *y = dt_alloc(&D, sizeof(float) * 64 * (size_t)rows);
    float *hx = dt_malloc(sizeof(float) * 64 * (size_t)cols);
    dt_fill(hx, 64 * cols, -1.0f, 1.0f);
    DT_CHECK(cuda_copy_h2d(x, hx, sizeof(float) * 64 * (size_t)cols, D.s));
    free(hx);
    void *work = dt_alloc(&D, (size_t)256 << 20);
    /* Random quants with scales of small halves (no infinities). */
    uint8_t *image = dt_malloc(bytes * copies);
    for (size_t i = 0; i < bytes * copies; i++) image[i] = (uint8_t)dt_next();
    for (size_t r = 0; r < (size_t)rows * copies; r++)
        for (size_t b = 0; b < row; b += 18) image[r * row + b + 1] = 0x1c; /* half exponent near 2^-8 */
    struct cuda_pinned alloc = {0}, reg = {0};
    DT_CHECK(cuda_host_alloc(bytes * copies, &alloc));
    memcpy(alloc.ptr, image, bytes * copies);
    char path[] = "/dev/shm/cuda_bench_XXXXXX";
    const int fd = mkstemp(path);
    const bool written = fd >= 0 && write(fd, image, bytes * copies) == (ssize_t)(bytes * copies);
    void *map = written ? mmap(NULL, bytes * copies, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (fd >= 0) close(fd), unlink(path);
    free(image);
    if (map == MAP_FAILED) {
        printf("(no file mapping in /dev/shm: skipped)\n");
        cuda_pinned_release(&alloc);
        cuda_arena_reset(&D.arena, mark);
        return;
    }
    DT_CHECK(cuda_host_register(map, bytes * copies, true, &reg));
    const void *host[2] = {alloc.ptr, map};
    const char *names[2] = {"cudaMallocHost", "registered file mapping"};
    const size_t works[3] = {(size_t)256 << 20, (size_t)64 << 20, (size_t)14 << 20};
    const int tokens[4] = {1, 8, 16, 64};
    for (int h = 0; h < 2; h++) {
        const uint8_t *dev;
        DT_CHECK(cuda_host_device_pointer(host[h], (const void **)&dev));
        for (int wi = 0; wi < 3; wi++) {
            printf("| %s | %zu MB |", names[h], works[wi] >> 20);
            for (int t = 0; t < 4; t++) {
                const int iters = 8;
                for (int it = -1; it < iters; it++) {
                    if (it == 0) DT_CHECK(cuda_event_record(ev0, D.s));
                    const struct cuda_matrix m = {QUANT_Q4_0, dev + bytes * (size_t)((it + copies) % copies), cols, rows, 1, row, true};
                    DT_CHECK(cuda_matmul(D.ctx, &m, x, tokens[t], y, rows, work, works[wi], D.s));
                }
                DT_CHECK(cuda_event_record(ev1, D.s));
                const double ms = elapsed_ms() / iters;
                printf(" %.1f (%.2f ms) |", bytes / (ms * 1e6), ms);
            }
            printf("\n");
        }
    }
    cuda_pinned_release(&reg);
    cuda_pinned_release(&alloc);
    munmap(map, bytes * copies);
    cuda_arena_reset(&D.arena, mark);
}

/* F16 products reading host memory in place by the shape of llama8b's matrices: cuBLAS reading
 * the mapped pages itself (above 8 tokens) reads them in as many tiles as the rows give, so its
 * rate depends on the shape more than on the bytes; the executor's path copies them first. Two
 * copies of each cycled, from pinned memory and from a registered file mapping. */
static void bench_in_place_shapes(void) {
    printf("\n### F16 matmul reading host memory in place by shape (llama8b), weight GB/s\n\n"
           "| shape (rows x columns) | memory | 1 token | 8 | 16 | 64 |\n|---|---|---|---|---|---|\n");
    static const int64_t shapes[][2] = {{14336, 4096}, {4096, 14336}, {4096, 4096}, {1024, 4096}};
    const int tokens[4] = {1, 8, 16, 64};
    const size_t mark = cuda_arena_mark(&D.arena);
    float *x = dt_alloc(&D, sizeof(float) * 64 * 14336), *y = dt_alloc(&D, sizeof(float) * 64 * 14336);
    float *hx = dt_malloc(sizeof(float) * 64 * 14336);
    dt_fill(hx, 64 * 14336, -1.0f, 1.0f);
    DT_CHECK(cuda_copy_h2d(x, hx, sizeof(float) * 64 * 14336, D.s));
    free(hx);
    void *work = dt_alloc(&D, (size_t)64 << 20);
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int64_t rows = shapes[si][0], cols = shapes[si][1];
        const size_t row = (size_t)cols * 2, bytes = row * (size_t)rows;
        struct cuda_pinned alloc = {0}, reg = {0};
        DT_CHECK(cuda_host_alloc(2 * bytes, &alloc));
        uint16_t *h = alloc.ptr;
        for (size_t i = 0; i < bytes; i++) h[i] = half_from_f32(dt_uniform(-1.0f, 1.0f)); /* both copies */
        /* The same bytes in a registered mapping of a file in /dev/shm, as the executor reads a model. */
        char path[] = "/dev/shm/cuda_bench_XXXXXX";
        const int fd = mkstemp(path);
        const size_t mapped = 2 * bytes + 4096; /* room for the copies 96 bytes in */
        const bool written = fd >= 0 && write(fd, alloc.ptr, 2 * bytes) == (ssize_t)(2 * bytes) &&
                             ftruncate(fd, (off_t)mapped) == 0;
        void *map = written ? mmap(NULL, mapped, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
        if (fd >= 0) close(fd), unlink(path);
        if (map != MAP_FAILED) DT_CHECK(cuda_host_register(map, mapped, true, &reg));
        /* A model file's tensors are 32-byte aligned, not page aligned (gguf-synth's llama8b: 96 bytes past 128): the mapping 96 bytes in too. */
        /* The first row as cuBLAS reads host memory itself; the others as the executor reads a
         * streamed matrix (in_place: F16 copied into the work buffer in chunks above 8 tokens). */
        const void *host[4] = {alloc.ptr, alloc.ptr, map, map};
        const size_t skip[4] = {0, 0, 0, 96};
        const char *kinds[4] = {"cudaMallocHost, cuBLAS reads it", "cudaMallocHost", "registered file mapping",
                                "file mapping, 96 bytes in"};
        for (int k = 0; k < (map != MAP_FAILED ? 4 : 2); k++) {
            const uint8_t *dev;
            DT_CHECK(cuda_host_device_pointer(host[k], (const void **)&dev));
            dev += skip[k];
            printf("| %lld x %lld | %s |", (long long)rows, (long long)cols, kinds[k]);
            for (int t = 0; t < 4; t++) {
                const int iters = 8;
                for (int it = -1; it < iters; it++) {
                    if (it == 0) DT_CHECK(cuda_event_record(ev0, D.s));
                    const struct cuda_matrix m = {QUANT_F16, dev + bytes * (size_t)((it + 2) % 2), cols, rows, 1, row, k > 0};
                    DT_CHECK(cuda_matmul(D.ctx, &m, x, tokens[t], y, rows, work, (size_t)64 << 20, D.s));
                }
                DT_CHECK(cuda_event_record(ev1, D.s));
                const double ms = elapsed_ms() / iters;
                printf(" %.1f (%.2f ms) |", bytes / (ms * 1e6), ms);
            }
            printf("\n");
        }
        if (map != MAP_FAILED) cuda_pinned_release(&reg), munmap(map, mapped);
        cuda_pinned_release(&alloc);
    }
    cuda_arena_reset(&D.arena, mark);
}

/* One MoE layer's time (routing + FFN) at nt tokens: m as given (its kernel bound too) with its
 * matrices' data moved to each of `layers` copies in turn, the copies gate_layer bytes apart for
 * gate and up and down_layer for down. */
static double moe_layer_us(struct cuda_moe m, bool fused, size_t gate_layer, size_t down_layer, int layers, int64_t nt,
                           const float *x, const float *logits, int32_t *ids, float *w, float *out) {
    const uint8_t *gate = m.gate.data, *up = m.up.data, *down = m.down.data;
    const size_t wb = cuda_moe_work_bytes(&m, nt), wmark = cuda_arena_mark(&D.arena);
    void *work = dt_alloc(&D, wb);
    const int iters = nt >= 64 ? 8 : 32;
    for (int it = -1; it < iters; it++) {
        if (it == 0) DT_CHECK(cuda_event_record(ev0, D.s));
        const int l = (it + layers) % layers;
        m.gate.data = gate + gate_layer * (size_t)l, m.up.data = up + gate_layer * (size_t)l;
        m.down.data = down + down_layer * (size_t)l;
        DT_CHECK(cuda_moe_route(logits + (size_t)l * 7 * m.n_expert, nt, m.n_expert, m.k, true, ids, w, D.s));
        DT_CHECK((fused ? cuda_moe_ffn : cuda_moe_ffn_grouped)(&m, x, ids, w, nt, out, false, work, wb, D.s));
    }
    DT_CHECK(cuda_event_record(ev1, D.s));
    const double us = elapsed_ms() * 1e3 / iters;
    cuda_arena_reset(&D.arena, wmark);
    return us;
}

/* The qwen30b-shaped MoE layer by token count (each of `only`, else the table's), on the fused
 * kernels (up to CUDA_MOE_FUSED_MAX_TOKENS), its expert groups on the matrix-vector kernel and on
 * the tiled GEMM, with the experts in VRAM and read in place from pinned host memory. */
static void bench_moe(enum quant_type type, const char *const *only, int n_only) {
    printf("\n### MoE layer, qwen30b shape (128 experts, top 8, 2048 x 768, %s): routing + FFN, us "
           "(GB/s of the experts touched)\n\n| tokens | experts touched | VRAM, fused | VRAM, matrix-vector | VRAM, tiled | "
           "host in place, fused | host in place, matrix-vector | host in place, tiled |\n|---|---|---|---|---|---|---|---|\n",
           quant_type_name(type));
    const int n_expert = 128, k = 8, layers = 4;
    const int64_t d = 2048, ff = 768;
    const size_t mark = cuda_arena_mark(&D.arena);
    const size_t gb = quant_row_bytes(type, d), db = quant_row_bytes(type, ff);
    const size_t gate_layer = gb * (size_t)(ff * n_expert), down_layer = db * (size_t)(d * n_expert);
    uint8_t *gate = random_weights(type, ff * n_expert, d, layers), *up = random_weights(type, ff * n_expert, d, layers);
    uint8_t *down = random_weights(type, d * n_expert, ff, layers);
    /* The same layers in pinned host memory. */
    struct cuda_pinned host = {0};
    const size_t layer_bytes = 2 * gate_layer + down_layer;
    DT_CHECK(cuda_host_alloc(layer_bytes * layers, &host));
    uint8_t *hp = host.ptr;
    dt_random_weights(type, hp, ff * n_expert, d);
    dt_random_weights(type, hp + gate_layer, ff * n_expert, d);
    dt_random_weights(type, hp + 2 * gate_layer, d * n_expert, ff);
    for (int l = 1; l < layers; l++) memcpy(hp + layer_bytes * (size_t)l, hp, layer_bytes);
    const uint8_t *hdev;
    DT_CHECK(cuda_host_device_pointer(hp, (const void **)&hdev));
    const int64_t max_tokens = 1024;
    float *hx = dt_malloc(sizeof(float) * (size_t)(max_tokens * d));
    dt_fill(hx, max_tokens * d, -1.0f, 1.0f);
    float *x = dt_upload(&D, hx, sizeof(float) * (size_t)(max_tokens * d));
    const size_t n_logits = (size_t)(max_tokens + 7 * layers) * n_expert;
    float *hl = dt_malloc(sizeof(float) * n_logits);
    dt_fill(hl, (int64_t)n_logits, -3.0f, 3.0f);
    float *logits = dt_upload(&D, hl, sizeof(float) * n_logits);
    free(hx), free(hl);
    int32_t *ids = dt_alloc(&D, sizeof(int32_t) * (size_t)(max_tokens * k));
    float *w = dt_alloc(&D, sizeof(float) * (size_t)(max_tokens * k));
    float *out = dt_alloc(&D, sizeof(float) * (size_t)(max_tokens * d));
    const double expert_bytes = 2.0 * ff * gb + (double)d * db;
    const int64_t tokens[] = {1, 4, 8, 16, 32, 64, 128, 256, 1024};
    const int n_rows = n_only ? n_only : (int)(sizeof tokens / sizeof tokens[0]);
    for (int i = 0; i < n_rows; i++) {
        const int64_t nt = n_only ? atoll(only[i]) : tokens[i];
        if (nt < 1 || nt > max_tokens) {
            fprintf(stderr, "cuda_bench moe: %s tokens (1..%lld)\n", only[i], (long long)max_tokens);
            continue;
        }
        const double touched = n_expert * (1 - pow(1 - (double)k / n_expert, (double)nt));
        printf("| %lld | %.0f |", (long long)nt, touched);
        for (int h = 0; h < 2; h++) {
            struct cuda_moe m = {.n_expert = n_expert, .k = k};
            m.gate = (struct cuda_matrix){type, h ? hdev : gate, d, ff, n_expert, gb, h};
            m.up = (struct cuda_matrix){type, h ? hdev + gate_layer : up, d, ff, n_expert, gb, h};
            m.down = (struct cuda_matrix){type, h ? hdev + 2 * gate_layer : down, ff, d, n_expert, db, h};
            const size_t gl = h ? layer_bytes : gate_layer, dl = h ? layer_bytes : down_layer;
            for (int kernel = 0; kernel < 3; kernel++) { /* fused, grouped matrix-vector, tiled */
                const bool tiled = kernel == 2;
                if ((tiled && nt == 1) || (kernel == 0 && nt > CUDA_MOE_FUSED_MAX_TOKENS)) { printf(" - |"); continue; }
                m.matvec_max_tokens = tiled ? 1 : 1 << 30;
                const double us = moe_layer_us(m, kernel == 0, gl, dl, layers, nt, x, logits, ids, w, out);
                printf(" %.1f (%.0f) |", us, touched * expert_bytes / (us * 1e3));
            }
        }
        printf("\n");
        fflush(stdout);
    }
    cuda_pinned_release(&host);
    cuda_arena_reset(&D.arena, mark);
}

int main(int argc, char **argv) {
    dt_init(&D, "cuda_bench", (size_t)6 << 30);
    dt_seed(7);
    DT_CHECK(cuda_event_create(true, &ev0));
    DT_CHECK(cuda_event_create(true, &ev1));
    const struct cuda_ctx_info *info = cuda_ctx_info(D.ctx);
    printf("\nCUDA context: %.1f MiB of device memory (%s), cuBLAS handle %.1f MiB\n", info->context_bytes / 1048576.0,
           info->measured_before ? "NVML free before - cudaMemGetInfo free after" : "total - free after; NVML absent",
           info->blas_bytes / 1048576.0);
    void *ws = dt_alloc(&D, CUDA_BLAS_WORKSPACE_BYTES);
    DT_CHECK(cuda_ctx_set_blas_workspace(D.ctx, ws, CUDA_BLAS_WORKSPACE_BYTES));
    if (argc > 1 && !strcmp(argv[1], "attention")) { /* just the attention tables */
        bench_attention();
        bench_attention_crossover();
    } else if (argc > 1 && !strcmp(argv[1], "moe")) { /* moe [--type T] [TOKENS...]: the experts' format, Q4_0 default */
        enum quant_type type = QUANT_Q4_0;
        int first = 2;
        if (argc > 3 && !strcmp(argv[2], "--type")) {
            first = 4;
            for (uint32_t t = 0; t < 64; t++)
                if (quant_type_name(t) && !strcmp(quant_type_name(t), argv[3])) type = (enum quant_type)t;
            if (strcmp(quant_type_name(type), argv[3]) || !cuda_type_supported(type)) {
                fprintf(stderr, "cuda_bench moe: --type %s: not a format the kernels compute\n", argv[3]);
                return 2;
            }
        }
        bench_moe(type, (const char *const *)argv + first, argc - first);
    } else if (argc > 1 && !strcmp(argv[1], "matvec")) { /* the ceiling and the matrix-vector table */
        bench_copy();
        bench_matvec();
    } else if (argc > 1 && !strcmp(argv[1], "in-place")) {
        bench_in_place();
        bench_in_place_shapes();
    } else {
        bench_copy();
        bench_matvec();
        bench_gemm();
        bench_attention();
        bench_attention_crossover();
        bench_in_place();
        bench_in_place_shapes();
        bench_moe(QUANT_Q4_0, NULL, 0);
    }
    uint64_t free_b, total_b;
    DT_CHECK(cuda_device_memory(&free_b, &total_b));
    char report[2048];
    cuda_arena_report(&D.arena, report, sizeof report);
    printf("\n%s\n", report);
    printf("device memory in use at the end, all kernels loaded: %.1f MiB outside the %.1f MiB arena\n",
           (total_b - free_b - D.arena.size) / 1048576.0, D.arena.size / 1048576.0);
    cuda_event_destroy(ev0);
    cuda_event_destroy(ev1);
    return dt_finish(&D);
}
