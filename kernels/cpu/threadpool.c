/* threadpool.c - parallel-for over a fixed pool of pthreads (see threadpool.h).
 *
 * One job at a time: the caller publishes (fn, ctx, n_tasks), bumps the generation counter, and all
 * threads (caller included) take task indices from an atomic counter. Workers spin for a short while
 * after each job so back-to-back loops in a forward pass do not pay a futex wake-up each; spinning
 * threads yield the CPU now and then, for when the machine has more runnable threads than cores. */
#include "kernels/cpu/threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* Spin iterations before sleeping (~tens of microseconds). */
#define SPIN_LIMIT 20000
/* While spinning, give the CPU away every this many iterations: on a machine with more runnable
 * threads than cores, the thread being waited for may be the one waiting for this CPU. */
#define SPIN_YIELD 256

struct tp_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t gen;      /* bumped once per job */
    _Atomic int stop;
    _Atomic int64_t next;      /* next task index */
    _Atomic int active;        /* workers still inside the current job */
    tp_fn fn;
    void *ctx;
    int64_t n_tasks;
};

struct worker_arg {
    tp_pool *p;
    int id;
};

static void run_tasks(tp_pool *p, int id)
{
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (t >= p->n_tasks) break;
        p->fn(p->ctx, t, id);
    }
}

static void *worker_main(void *arg)
{
    struct worker_arg *wa = arg;
    tp_pool *p = wa->p;
    int id = wa->id;
    free(wa);
    uint64_t seen = 0;
    for (;;) {
        uint64_t g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
               !atomic_load(&p->stop)) {
            if (++spins < SPIN_LIMIT) {
                if (spins % SPIN_YIELD == 0)
                    sched_yield();
                else
                    cpu_relax();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) break;
        seen = g;
        run_tasks(p, id);
        atomic_fetch_sub_explicit(&p->active, 1, memory_order_release);
    }
    return NULL;
}

int tp_threads_for(int n_threads)
{
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    return n_threads > 256 ? 256 : n_threads;
}

tp_pool *tp_create(int n_threads, char *err, size_t errlen)
{
    n_threads = tp_threads_for(n_threads);
    tp_pool *p = calloc(1, sizeof *p);
    if (!p) goto oom;
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) goto oom;
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *wa = malloc(sizeof *wa);
        if (!wa) goto oom;
        wa->p = p;
        wa->id = i;
        int rc = pthread_create(&p->threads[i], NULL, worker_main, wa);
        if (rc != 0) {
            free(wa);
            snprintf(err, errlen, "cannot start worker thread: %s", strerror(rc));
            p->n_threads = i;
            tp_free(p);
            return NULL;
        }
    }
    return p;
oom:
    snprintf(err, errlen, "out of memory creating the thread pool");
    if (p) {
        p->n_threads = 1;
        tp_free(p);
    }
    return NULL;
}

void tp_free(tp_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p);
}

int tp_n_threads(const tp_pool *p) { return p->n_threads; }

void tp_run(tp_pool *p, tp_fn fn, void *ctx, int64_t n_tasks)
{
    if (n_tasks <= 0) return;
    if (p->n_threads == 1 || n_tasks == 1) {
        for (int64_t t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->active, p->n_threads - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    run_tasks(p, 0);
    for (unsigned spins = 1; atomic_load_explicit(&p->active, memory_order_acquire) > 0; spins++) {
        if (spins % SPIN_YIELD == 0)
            sched_yield();
        else
            cpu_relax();
    }
}
