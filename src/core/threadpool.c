/* Persistent worker threads with a generation counter: the caller publishes a job by bumping
 * the generation; workers spin on it, then fall back to a condition variable; completion is an
 * atomic countdown the caller spins on. */
#include "core/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

enum { SPIN_ROUNDS = 1 << 16 };

struct threadpool {
    int n_threads;
    pthread_t *threads;
    threadpool_fn fn;
    void *ctx;
    _Atomic uint64_t generation; /* bumped once per job */
    _Atomic int pending;         /* workers still running the current job */
    _Atomic int stop;
    _Atomic int n_sleeping;
    pthread_mutex_t mutex;
    pthread_cond_t wake;
};

struct worker_arg {
    struct threadpool *pool;
    int index;
};

static uint64_t wait_for_job(struct threadpool *pool, uint64_t seen) {
    for (int i = 0; i < SPIN_ROUNDS; i++) {
        uint64_t g = atomic_load_explicit(&pool->generation, memory_order_acquire);
        if (g != seen || atomic_load_explicit(&pool->stop, memory_order_relaxed)) return g;
        CPU_RELAX();
    }
    pthread_mutex_lock(&pool->mutex);
    atomic_fetch_add(&pool->n_sleeping, 1);
    uint64_t g;
    while ((g = atomic_load(&pool->generation)) == seen && !atomic_load(&pool->stop))
        pthread_cond_wait(&pool->wake, &pool->mutex);
    atomic_fetch_sub(&pool->n_sleeping, 1);
    pthread_mutex_unlock(&pool->mutex);
    return g;
}

static void *worker_main(void *p) {
    struct worker_arg arg = *(struct worker_arg *)p;
    free(p);
    struct threadpool *pool = arg.pool;
    uint64_t seen = 0;
    for (;;) {
        seen = wait_for_job(pool, seen);
        if (atomic_load(&pool->stop)) break;
        pool->fn(pool->ctx, arg.index, pool->n_threads);
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_release);
    }
    return NULL;
}

int threadpool_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

pshard_status threadpool_create(int n_threads, struct threadpool **out) {
    *out = NULL;
    if (n_threads <= 0) n_threads = threadpool_cpu_count();
    if (n_threads > 1024) return core_fail(PSHARD_ERR_INVALID_ARG, "thread count %d is too large", n_threads);
    struct threadpool *pool = calloc(1, sizeof *pool);
    if (!pool) return core_fail(PSHARD_ERR_NOMEM, "out of memory for the thread pool");
    pool->n_threads = n_threads;
    pthread_mutex_init(&pool->mutex, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pool->threads = calloc((size_t)n_threads, sizeof *pool->threads);
    if (!pool->threads) {
        threadpool_free(pool);
        return core_fail(PSHARD_ERR_NOMEM, "out of memory for the thread pool");
    }
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *arg = malloc(sizeof *arg);
        if (!arg || (arg->pool = pool, arg->index = i, pthread_create(&pool->threads[i], NULL, worker_main, arg)) != 0) {
            free(arg);
            pool->n_threads = i; /* only these exist */
            threadpool_free(pool);
            return core_fail(PSHARD_ERR_NOMEM, "cannot start worker thread %d", i);
        }
    }
    *out = pool;
    return PSHARD_OK;
}

void threadpool_free(struct threadpool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->mutex);
    atomic_store(&pool->stop, 1);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mutex);
    for (int i = 1; i < pool->n_threads; i++) pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->mutex);
    pthread_cond_destroy(&pool->wake);
    free(pool->threads);
    free(pool);
}

int threadpool_size(const struct threadpool *pool) { return pool->n_threads; }

void threadpool_run(struct threadpool *pool, threadpool_fn fn, void *ctx) {
    if (pool->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store_explicit(&pool->pending, pool->n_threads - 1, memory_order_relaxed);
    atomic_fetch_add(&pool->generation, 1); /* seq_cst: pairs with n_sleeping in wait_for_job */
    if (atomic_load(&pool->n_sleeping) > 0) {
        pthread_mutex_lock(&pool->mutex);
        pthread_cond_broadcast(&pool->wake);
        pthread_mutex_unlock(&pool->mutex);
    }
    fn(ctx, 0, pool->n_threads);
    while (atomic_load_explicit(&pool->pending, memory_order_acquire) > 0) CPU_RELAX();
}

void threadpool_range(int64_t n, int64_t grain, int thread, int n_threads, int64_t *begin, int64_t *end) {
    if (grain < 1) grain = 1;
    int64_t units = (n + grain - 1) / grain;
    int64_t b = units * thread / n_threads, e = units * (thread + 1) / n_threads;
    *begin = b * grain < n ? b * grain : n;
    *end = e * grain < n ? e * grain : n;
}
