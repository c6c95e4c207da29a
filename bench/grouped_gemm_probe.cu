// Probe: can cuBLAS's grouped GEMM (cublasGemmGroupedBatchedEx) run a prompt step's MoE expert
// products, and how fast? A qwen30b-shaped layer (128 experts of 768 x 2048, top 8) over T tokens
// routed at random: each active expert's rows of X (f16, gathered by expert) times its f16 weights,
// as one grouped call per output type (f32, f16), against one cublasGemmEx per expert and against a
// single dense GEMM of all the pairs (the ceiling). Each grouped result is checked against the
// per-expert one. The group sizes are known on the host here; in the engine they would come down
// from the GPU's grouping once a layer.
// Build: nvcc -O3 -arch=sm_90 bench/grouped_gemm_probe.cu -lcublas -o grouped_gemm_probe
// Usage: grouped_gemm_probe [tokens=1024] [experts=128] [top_k=8] [rows=768] [cols=2048]
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x)                                                                                                        \
    do {                                                                                                             \
        cudaError_t e_ = (x);                                                                                        \
        if (e_ != cudaSuccess) {                                                                                     \
            printf("%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));                                     \
            exit(1);                                                                                                 \
        }                                                                                                            \
    } while (0)

static unsigned long long rng = 0x9e3779b97f4a7c15ull;
static unsigned next_u32(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (unsigned)(rng >> 11);
}

__global__ void fill_kernel(__half *x, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        x[i] = __float2half(((float)(h & 0xffff) / 65536.0f - 0.5f) * 0.25f);
    }
}

/* A device copy of n host pointers (the grouped call reads its matrices' addresses there). */
static void **device_pointers(const void *const *host, int n) {
    void **dev;
    CK(cudaMalloc(&dev, sizeof(void *) * n));
    CK(cudaMemcpy(dev, host, sizeof(void *) * n, cudaMemcpyHostToDevice));
    return dev;
}

static const char *status_name(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "ok";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "arch mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    default: return "other error";
    }
}

int main(int argc, char **argv) {
    const int T = argc > 1 ? atoi(argv[1]) : 1024, E = argc > 2 ? atoi(argv[2]) : 128, K = argc > 3 ? atoi(argv[3]) : 8;
    const int N_OUT = argc > 4 ? atoi(argv[4]) : 768, D = argc > 5 ? atoi(argv[5]) : 2048;
    if (T < 1 || E < 1 || K < 1 || K > E || N_OUT < 1 || D < 1) {
        printf("usage: grouped_gemm_probe [tokens] [experts] [top_k] [rows] [cols]\n");
        return 2;
    }
    const int P = T * K;
    /* Routing: each token's K distinct experts; rows of X grouped by expert. */
    int *count = (int *)calloc(E, sizeof(int)), *start = (int *)calloc(E + 1, sizeof(int));
    for (int t = 0; t < T; t++) {
        int chosen[64];
        for (int j = 0; j < K; j++) {
            int e, again;
            do {
                e = (int)(next_u32() % (unsigned)E), again = 0;
                for (int q = 0; q < j; q++) again |= chosen[q] == e;
            } while (again);
            chosen[j] = e, count[e]++;
        }
    }
    int active = 0, max_rows = 0;
    for (int e = 0; e < E; e++) start[e + 1] = start[e] + count[e], active += count[e] > 0, max_rows = count[e] > max_rows ? count[e] : max_rows;
    printf("grouped GEMM probe: %d tokens, %d experts top %d (%d active, %d pairs, up to %d an expert), %d x %d f16 weights\n",
           T, E, K, active, P, max_rows, N_OUT, D);

    __half *w, *x;
    float *c32, *ref;
    __half *c16;
    CK(cudaMalloc(&w, sizeof(__half) * (size_t)E * N_OUT * D));
    CK(cudaMalloc(&x, sizeof(__half) * (size_t)P * D));
    CK(cudaMalloc(&c32, sizeof(float) * (size_t)P * N_OUT));
    CK(cudaMalloc(&ref, sizeof(float) * (size_t)P * N_OUT));
    CK(cudaMalloc(&c16, sizeof(__half) * (size_t)P * N_OUT));
    fill_kernel<<<1024, 256>>>(w, (size_t)E * N_OUT * D, 17u);
    fill_kernel<<<1024, 256>>>(x, (size_t)P * D, 29u);
    CK(cudaDeviceSynchronize());
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
        printf("no cuBLAS handle\n");
        return 1;
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const double flop = 2.0 * P * (double)N_OUT * D;
    const float one = 1.0f, zero = 0.0f;
    /* Row-major C_e [n_e x N_OUT] = X_e [n_e x D] . W_e^T: column-major C^T = op_T(W_e) . X_e^T. */
    auto per_expert = [&](float *out) {
        for (int e = 0; e < E; e++) {
            if (!count[e]) continue;
            cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N_OUT, count[e], D, &one, w + (size_t)e * N_OUT * D, CUDA_R_16F, D,
                         x + (size_t)start[e] * D, CUDA_R_16F, D, &zero, out + (size_t)start[e] * N_OUT, CUDA_R_32F, N_OUT,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        }
    };
    auto time_it = [&](const char *what, auto run) {
        run();
        CK(cudaDeviceSynchronize());
        const int reps = 10;
        CK(cudaEventRecord(e0));
        for (int r = 0; r < reps; r++) run();
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        printf("  %-44s %8.3f ms  %6.1f TFLOP/s\n", what, ms / reps, flop / (ms / reps * 1e-3) / 1e12);
    };
    time_it("one cublasGemmEx per expert (f32 out)", [&] { per_expert(ref); });
    time_it("one dense cublasGemmEx of all pairs (ceiling)", [&] {
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N_OUT, P, D, &one, w, CUDA_R_16F, D, x, CUDA_R_16F, D, &zero, c32,
                     CUDA_R_32F, N_OUT, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    });

    /* The grouped call: one group per active expert (its own n), one problem each. */
    cublasOperation_t *ta = (cublasOperation_t *)malloc(sizeof *ta * E), *tb = (cublasOperation_t *)malloc(sizeof *tb * E);
    int *m = (int *)malloc(sizeof(int) * E), *n = (int *)malloc(sizeof(int) * E), *k = (int *)malloc(sizeof(int) * E);
    int *lda = (int *)malloc(sizeof(int) * E), *ldb = (int *)malloc(sizeof(int) * E), *ldc = (int *)malloc(sizeof(int) * E);
    int *gsize = (int *)malloc(sizeof(int) * E);
    float *alpha = (float *)malloc(sizeof(float) * E), *beta = (float *)malloc(sizeof(float) * E);
    const void **ha = (const void **)malloc(sizeof(void *) * E), **hb = (const void **)malloc(sizeof(void *) * E);
    void **hc32 = (void **)malloc(sizeof(void *) * E), **hc16 = (void **)malloc(sizeof(void *) * E);
    int g = 0;
    for (int e = 0; e < E; e++) {
        if (!count[e]) continue;
        ta[g] = CUBLAS_OP_T, tb[g] = CUBLAS_OP_N, m[g] = N_OUT, n[g] = count[e], k[g] = D;
        lda[g] = D, ldb[g] = D, ldc[g] = N_OUT, gsize[g] = 1, alpha[g] = 1.0f, beta[g] = 0.0f;
        ha[g] = w + (size_t)e * N_OUT * D, hb[g] = x + (size_t)start[e] * D;
        hc32[g] = c32 + (size_t)start[e] * N_OUT, hc16[g] = c16 + (size_t)start[e] * N_OUT;
        g++;
    }
    void **da = device_pointers(ha, g), **db = device_pointers(hb, g), **dc32 = device_pointers(hc32, g);
    void **dc16 = device_pointers(hc16, g);
    /* The grouped call over `groups` of the experts, their rows n_rows, f16 or f32 out. */
    auto grouped_call = [&](void **a_ptrs, void **b_ptrs, void **c_ptrs, cudaDataType_t ctype, const int *n_rows,
                            int groups) {
        return cublasGemmGroupedBatchedEx(h, ta, tb, m, n_rows, k, alpha, (const void *const *)a_ptrs, CUDA_R_16F, lda,
                                          (const void *const *)b_ptrs, CUDA_R_16F, ldb, beta, c_ptrs, ctype, ldc, groups,
                                          gsize, CUBLAS_COMPUTE_32F);
    };
    float *got = (float *)malloc(sizeof(float) * (size_t)P * N_OUT), *want = (float *)malloc(sizeof(float) * (size_t)P * N_OUT);
    __half *got16 = (__half *)malloc(sizeof(__half) * (size_t)P * N_OUT);
    CK(cudaMemcpy(want, ref, sizeof(float) * (size_t)P * N_OUT, cudaMemcpyDeviceToHost));
    for (int out16 = 0; out16 < 2; out16++) {
        auto grouped = [&]() { return grouped_call(da, db, out16 ? dc16 : dc32, out16 ? CUDA_R_16F : CUDA_R_32F, n, g); };
        CK(cudaMemset(out16 ? (void *)c16 : (void *)c32, 0, (out16 ? 2 : 4) * (size_t)P * N_OUT));
        const cublasStatus_t st = grouped();
        CK(cudaDeviceSynchronize());
        printf("grouped, f16 x f16 -> %s, compute 32F: %s\n", out16 ? "f16" : "f32", status_name(st));
        if (st != CUBLAS_STATUS_SUCCESS) continue;
        double worst = 0, scale = 0;
        if (out16) {
            CK(cudaMemcpy(got16, c16, sizeof(__half) * (size_t)P * N_OUT, cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < (size_t)P * N_OUT; i++) got[i] = __half2float(got16[i]);
        } else {
            CK(cudaMemcpy(got, c32, sizeof(float) * (size_t)P * N_OUT, cudaMemcpyDeviceToHost));
        }
        for (size_t i = 0; i < (size_t)P * N_OUT; i++) {
            worst = fmax(worst, fabs((double)got[i] - want[i]));
            scale = fmax(scale, fabs((double)want[i]));
        }
        printf("  against one GEMM per expert: max abs difference %.3g of %.3g\n", worst, scale);
        time_it(out16 ? "grouped (f16 out)" : "grouped (f32 out)", [&] { grouped(); });
        if (out16) continue;
        /* Every other group alone (as a call over the experts of one place would run them): the
         * same bits for those rows, or results that depend on which experts share the call? */
        int gh = 0;
        for (int i = 0; i < g; i += 2) gh++;
        void **hc_half = (void **)malloc(sizeof(void *) * gh);
        const void **ha_half = (const void **)malloc(sizeof(void *) * gh), **hb_half = (const void **)malloc(sizeof(void *) * gh);
        int *n_half = (int *)malloc(sizeof(int) * gh);
        float *c_half;
        CK(cudaMalloc(&c_half, sizeof(float) * (size_t)P * N_OUT));
        CK(cudaMemset(c_half, 0, sizeof(float) * (size_t)P * N_OUT));
        for (int i = 0, j = 0; i < g; i += 2, j++) {
            ha_half[j] = ha[i], hb_half[j] = hb[i], n_half[j] = n[i];
            hc_half[j] = (float *)c_half + ((float *)hc32[i] - c32);
        }
        const cublasStatus_t sh = grouped_call(device_pointers(ha_half, gh), device_pointers(hb_half, gh),
                                               device_pointers((const void *const *)hc_half, gh), CUDA_R_32F, n_half, gh);
        CK(cudaDeviceSynchronize());
        float *half_got = (float *)malloc(sizeof(float) * (size_t)P * N_OUT);
        CK(cudaMemcpy(half_got, c_half, sizeof(float) * (size_t)P * N_OUT, cudaMemcpyDeviceToHost));
        long differing = 0;
        for (int i = 0; i < g; i += 2) {
            const size_t at = (size_t)((float *)hc32[i] - c32), len = (size_t)n[i] * N_OUT;
            for (size_t q = 0; q < len; q++) differing += memcmp(&half_got[at + q], &got[at + q], sizeof(float)) != 0;
        }
        long per_expert_differing = 0;
        for (size_t q = 0; q < (size_t)P * N_OUT; q++) per_expert_differing += memcmp(&got[q], &want[q], sizeof(float)) != 0;
        printf("  every other expert alone (%s): %ld values not the same bits as in the whole call; the whole call: %ld "
               "values not the bits of one GEMM per expert\n", status_name(sh), differing, per_expert_differing);
    }
    printf("(host arrays of %d groups; pointer arrays in device memory)\n", g);
    cublasDestroy(h);
    return 0;
}
