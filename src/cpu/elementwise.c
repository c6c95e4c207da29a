/* Element-wise and small reduction operators: RMSNorm, residual adds, SwiGLU, softmax, top-k. */
#include <math.h>

#include "cpu/cpu_ops.h"

void cpu_rmsnorm(const float *x, const float *w, float *out, int64_t n, float eps) {
    /* Sum in double: the reference implementations do the same, and it costs nothing here. */
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += (double)x[i] * x[i];
    const float scale = 1.0f / sqrtf((float)(sum / (double)n) + eps);
    if (w)
        for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * w[i];
    else
        for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale;
}

void cpu_add(float *acc, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) acc[i] += x[i];
}

void cpu_add_bias(float *x, const float *bias, int64_t n_tokens, int64_t n) {
    for (int64_t t = 0; t < n_tokens; t++) cpu_add(x + t * n, bias, n);
}

void cpu_swiglu(const float *gate, const float *up, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

struct swiglu_job {
    const float *gate, *up;
    float *out;
    int64_t n;
};

static void swiglu_worker(void *p, int thread, int n_threads) {
    const struct swiglu_job *job = p;
    int64_t begin, end;
    threadpool_range(job->n, 64, thread, n_threads, &begin, &end);
    if (begin < end) cpu_swiglu(job->gate + begin, job->up + begin, job->out + begin, end - begin);
}

void cpu_swiglu_parallel(struct threadpool *pool, const float *gate, const float *up, float *out, int64_t n) {
    struct swiglu_job job = {gate, up, out, n};
    if (!pool || n < 16384) swiglu_worker(&job, 0, 1); /* a pool round costs more than a short loop */
    else threadpool_run(pool, swiglu_worker, &job);
}

void cpu_softmax(float *x, int64_t n) {
    float max = x[0];
    for (int64_t i = 1; i < n; i++) max = x[i] > max ? x[i] : max;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

void cpu_topk(const float *x, int64_t n, int k, int32_t *idx) {
    /* k is small (experts used per token): insertion into a sorted list of k. */
    int have = 0;
    for (int64_t i = 0; i < n; i++) {
        int pos = have;
        while (pos > 0 && x[idx[pos - 1]] < x[i]) pos--;
        if (pos >= k) continue;
        for (int j = (have < k ? have : k - 1); j > pos; j--) idx[j] = idx[j - 1];
        idx[pos] = (int32_t)i;
        if (have < k) have++;
    }
}
