/* threads.c - see threads.h. */
#define _POSIX_C_SOURCE 200809L
#include "cpu/threads.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

int fattn_cpu_thread_count(int requested) {
    if (requested > 0) return requested;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > 1024) n = 1024;
    return (int)n;
}

typedef struct pool_job {
    fattn_task_fn fn;
    void *arg;
    int64_t ntasks;
    atomic_llong next;
} pool_job;

typedef struct worker_arg {
    pool_job *job;
    int worker;
} worker_arg;

static void run_worker(pool_job *job, int worker) {
    for (;;) {
        int64_t t = (int64_t)atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed);
        if (t >= job->ntasks) break;
        job->fn(job->arg, t, worker);
    }
}

static void *worker_main(void *p) {
    worker_arg *w = (worker_arg *)p;
    run_worker(w->job, w->worker);
    return NULL;
}

int fattn_parallel_for(int nthreads, int64_t ntasks, fattn_task_fn fn, void *arg) {
    if (ntasks <= 0) return 0;
    if (nthreads < 1) nthreads = 1;
    if ((int64_t)nthreads > ntasks) nthreads = (int)ntasks;
    pool_job job;
    job.fn = fn;
    job.arg = arg;
    job.ntasks = ntasks;
    atomic_init(&job.next, 0);
    if (nthreads == 1) {
        run_worker(&job, 0);
        return 0;
    }
    pthread_t *tids = (pthread_t *)malloc(sizeof(pthread_t) * (size_t)(nthreads - 1));
    worker_arg *wargs = (worker_arg *)malloc(sizeof(worker_arg) * (size_t)(nthreads - 1));
    int started = 0;
    if (tids && wargs) {
        for (int i = 1; i < nthreads; i++) {
            wargs[started].job = &job;
            wargs[started].worker = i;
            if (pthread_create(&tids[started], NULL, worker_main, &wargs[started]) != 0) break;
            started++;
        }
    }
    run_worker(&job, 0);
    for (int i = 0; i < started; i++) pthread_join(tids[i], NULL);
    free(tids);
    free(wargs);
    return 0;
}
