/* threadpool.h - a fixed set of worker threads that run parallel-for loops.
 *
 * The engine dispatches a few hundred small loops per generated token, so waking workers must cost
 * microseconds: workers spin briefly on a generation counter before sleeping on a condition variable.
 * The calling thread takes part in every loop. Not a general task system. */
#ifndef KVCHAT_THREADPOOL_H
#define KVCHAT_THREADPOOL_H

#include <stddef.h>
#include <stdint.h>

typedef struct tp_pool tp_pool;

/* fn(ctx, task, thread) is called once for every task in [0, n_tasks); thread is in [0, n_threads). */
typedef void (*tp_fn)(void *ctx, int64_t task, int thread);

/* n_threads <= 0 means one per online core. Returns NULL on failure (message in err). */
tp_pool *tp_create(int n_threads, char *err, size_t errlen);
/* The threads tp_create(n_threads) starts: all cores for n_threads <= 0, at most 256. */
int tp_threads_for(int n_threads);
void tp_free(tp_pool *p);
int tp_n_threads(const tp_pool *p);
/* Runs fn over n_tasks tasks, distributed dynamically; returns when all are done. */
void tp_run(tp_pool *p, tp_fn fn, void *ctx, int64_t n_tasks);

#endif
