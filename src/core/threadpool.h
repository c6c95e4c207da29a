/* A persistent pool of worker threads for data-parallel kernels. The caller's thread takes
 * part as worker 0, so a pool of n threads starts n - 1. Between jobs the workers spin briefly
 * (a decode step issues jobs microseconds apart), then sleep on a condition variable. */
#ifndef CORE_THREADPOOL_H
#define CORE_THREADPOOL_H

#include "pshard.h"

struct threadpool;

/* Work of one job: called once per thread with its index (0 .. n_threads - 1). */
typedef void (*threadpool_fn)(void *ctx, int thread, int n_threads);

pshard_status threadpool_create(int n_threads, struct threadpool **out);
void threadpool_free(struct threadpool *pool);
int threadpool_size(const struct threadpool *pool);

/* Run fn on every thread of the pool and return when all are done. Not reentrant: one job at
 * a time, from one caller thread. */
void threadpool_run(struct threadpool *pool, threadpool_fn fn, void *ctx);

/* Split [0, n) evenly: the range of `thread` out of n_threads, in multiples of `grain`. */
void threadpool_range(int64_t n, int64_t grain, int thread, int n_threads, int64_t *begin, int64_t *end);

/* Number of online CPUs (at least 1). */
int threadpool_cpu_count(void);

#endif
