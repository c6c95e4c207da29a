/* A persistent pool of worker threads for data-parallel kernels. The caller's thread takes
 * part, so a pool of n threads starts n - 1. A job is n parts, each run once by whichever of the
 * threads claims it first, so a thread the OS does not schedule holds nothing up. Between jobs
 * the workers spin briefly (a decode step issues jobs microseconds apart), then sleep on a
 * condition variable. */
#ifndef CORE_THREADPOOL_H
#define CORE_THREADPOOL_H

#include "pshard.h"

struct threadpool;

/* Work of one job: called once per part (0 .. n_threads - 1), on whichever thread claims it;
 * one thread may run several parts, one after another. */
typedef void (*threadpool_fn)(void *ctx, int thread, int n_threads);

pshard_status threadpool_create(int n_threads, struct threadpool **out);
void threadpool_free(struct threadpool *pool);
int threadpool_size(const struct threadpool *pool);

/* Run fn's n_threads parts on the pool's threads and return when all are done. Not reentrant:
 * one job at a time, from one caller thread. */
void threadpool_run(struct threadpool *pool, threadpool_fn fn, void *ctx);

/* Split [0, n) evenly: the range of part `thread` out of n_threads, in multiples of `grain`. */
void threadpool_range(int64_t n, int64_t grain, int thread, int n_threads, int64_t *begin, int64_t *end);

/* Number of online CPUs (at least 1). */
int threadpool_cpu_count(void);

#endif
