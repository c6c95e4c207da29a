/* Persistent worker threads. A job is n_threads parts, each run once by whichever thread claims
 * it: the caller publishes the job by bumping the generation, then claims parts itself; workers
 * spin on the generation, then fall back to a condition variable, and claim what is left. The
 * caller returns once every part is done, not once every worker has come by: a worker the OS
 * has not scheduled (another process on the cores) is not waited for, its parts run on the
 * threads that are running; and idle workers yield their core now and then while they spin.
 * Waiting for every worker instead, decode of the default model with two threads on two cores
 * beside one busy process ran at 30-49 tokens/s, against 92-100 now and 96-116 with one thread
 * (bench/RESULTS.md). */
#include "core/threadpool.h"

#include <pthread.h>
#include <sched.h>
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

/* Spin rounds before a worker sleeps, how often a spinning worker yields its core, and after how
 * many rounds the caller, waiting for parts still running, yields it on every round. */
enum { SPIN_ROUNDS = 1 << 16, YIELD_EVERY = 256, YIELD_AFTER = 1 << 12 };

struct threadpool {
    int n_threads;
    pthread_t *threads;
    threadpool_fn fn;
    void *ctx;
    /* The job's generation (high 32 bits) and its next unclaimed part (low 32): a claim is a
     * compare-and-swap on both, so a late worker cannot claim a part of a job that has ended. */
    _Atomic uint64_t state;
    _Atomic int done; /* parts of the current job finished */
    _Atomic int stop;
    _Atomic int n_sleeping;
    pthread_mutex_t mutex;
    pthread_cond_t wake;
};

struct worker_arg {
    struct threadpool *pool;
};

static uint32_t generation_of(uint64_t state) { return (uint32_t)(state >> 32); }

/* Runs parts of generation `gen` while any are left to claim. */
static void run_parts(struct threadpool *pool, uint32_t gen) {
    uint64_t seen = atomic_load_explicit(&pool->state, memory_order_acquire);
    for (;;) {
        const uint32_t part = (uint32_t)seen;
        if (generation_of(seen) != gen || part >= (uint32_t)pool->n_threads) return;
        if (!atomic_compare_exchange_weak_explicit(&pool->state, &seen, seen + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue; /* seen now holds the current state */
        /* Claimed: the job cannot end (nor fn and ctx change) before this part is done. */
        pool->fn(pool->ctx, (int)part, pool->n_threads);
        atomic_fetch_add_explicit(&pool->done, 1, memory_order_release);
        seen = atomic_load_explicit(&pool->state, memory_order_acquire);
    }
}

static uint32_t wait_for_job(struct threadpool *pool, uint32_t seen) {
    for (int i = 0; i < SPIN_ROUNDS; i++) {
        const uint32_t g = generation_of(atomic_load_explicit(&pool->state, memory_order_acquire));
        if (g != seen || atomic_load_explicit(&pool->stop, memory_order_relaxed)) return g;
        if (i % YIELD_EVERY == YIELD_EVERY - 1) sched_yield();
        else CPU_RELAX();
    }
    pthread_mutex_lock(&pool->mutex);
    atomic_fetch_add(&pool->n_sleeping, 1);
    uint32_t g;
    while ((g = generation_of(atomic_load(&pool->state))) == seen && !atomic_load(&pool->stop))
        pthread_cond_wait(&pool->wake, &pool->mutex);
    atomic_fetch_sub(&pool->n_sleeping, 1);
    pthread_mutex_unlock(&pool->mutex);
    return g;
}

static void *worker_main(void *p) {
    struct worker_arg arg = *(struct worker_arg *)p;
    free(p);
    struct threadpool *pool = arg.pool;
    uint32_t seen = 0;
    for (;;) {
        seen = wait_for_job(pool, seen);
        if (atomic_load(&pool->stop)) break;
        run_parts(pool, seen);
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
        if (!arg || (arg->pool = pool, pthread_create(&pool->threads[i], NULL, worker_main, arg)) != 0) {
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
    /* No part of the last job is claimable any more and all are done: nothing reads fn, ctx
     * or done until the new generation is published. */
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store_explicit(&pool->done, 0, memory_order_relaxed);
    const uint32_t gen = generation_of(atomic_load_explicit(&pool->state, memory_order_relaxed)) + 1;
    atomic_store(&pool->state, (uint64_t)gen << 32); /* seq_cst: pairs with n_sleeping in wait_for_job */
    if (atomic_load(&pool->n_sleeping) > 0) {
        pthread_mutex_lock(&pool->mutex);
        pthread_cond_broadcast(&pool->wake);
        pthread_mutex_unlock(&pool->mutex);
    }
    run_parts(pool, gen);
    /* Parts still running: spin a while, then yield the core (to their thread, if the OS took
     * it off the core for someone else). */
    for (int i = 0; atomic_load_explicit(&pool->done, memory_order_acquire) < pool->n_threads; i++) {
        if (i < YIELD_AFTER) CPU_RELAX();
        else sched_yield();
    }
}

void threadpool_range(int64_t n, int64_t grain, int thread, int n_threads, int64_t *begin, int64_t *end) {
    if (grain < 1) grain = 1;
    int64_t units = (n + grain - 1) / grain;
    int64_t b = units * thread / n_threads, e = units * (thread + 1) / n_threads;
    *begin = b * grain < n ? b * grain : n;
    *end = e * grain < n ? e * grain : n;
}
