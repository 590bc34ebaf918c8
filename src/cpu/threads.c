/* threads.c - see threads.h.
 *
 * A persistent pool: workers are started on first use (and when a call asks
 * for more than have been started), then sleep on a condition variable
 * between calls, so a call costs a wake-up instead of a pthread_create per
 * worker.  One call uses the pool at a time; a call made while another holds
 * it (two user threads at once) waits for it (pool_call_mu): until issue 43
 * it started threads of its own, up to ntasks - 1 per call.  The pool never
 * grows past FATTN_MAX_THREADS_PER_CPU x the online CPUs.  After fork() the
 * child starts from an empty pool; unloading the library stops and joins
 * the workers. */
#define _POSIX_C_SOURCE 200809L
#include "cpu/threads.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#define POOL_MAX 1024

/* The online CPUs, read once per process: sysconf reads a /sys file, tens of
 * microseconds that a small call would pay twice. */
static int g_online_cpus;
static void read_online_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    if (n > POOL_MAX) n = POOL_MAX;
    g_online_cpus = (int)n;
}
static int online_cpus(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, read_online_cpus);
    return g_online_cpus;
}

static int thread_bound(void) {
    const int n = online_cpus();
    return n > POOL_MAX / FATTN_MAX_THREADS_PER_CPU ? POOL_MAX : n * FATTN_MAX_THREADS_PER_CPU;
}

int fattn_cpu_thread_count(int requested) {
    const int bound = thread_bound();
    if (requested <= 0) return online_cpus();
    return requested < bound ? requested : bound;
}

typedef struct pool_job {
    fattn_task_fn fn;
    void *arg;
    int64_t ntasks;
    atomic_llong next;
} pool_job;

static _Thread_local int in_pool_task; /* this thread runs a task: an inner call runs here */

static void run_worker(pool_job *job, int worker) {
    const int outer = in_pool_task;
    in_pool_task = 1;
    for (;;) {
        int64_t t = (int64_t)atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed);
        if (t >= job->ntasks) break;
        job->fn(job->arg, t, worker);
    }
    in_pool_task = outer;
}

/* ---- the pool ------------------------------------------------------------ */

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_work = PTHREAD_COND_INITIALIZER; /* a new job or quit */
static pthread_cond_t pool_done = PTHREAD_COND_INITIALIZER; /* the last worker finished */
static pthread_mutex_t pool_call_mu = PTHREAD_MUTEX_INITIALIZER; /* held by the call using the pool */
static pthread_t pool_tid[POOL_MAX];
static int pool_started;          /* workers 1..pool_started exist */
static uint64_t pool_gen;         /* job generation */
static pool_job *pool_cur;        /* the job of generation pool_gen */
static int pool_want;             /* workers 1..pool_want - 1 take part in it */
static int pool_active;           /* of those, still running it */
static int pool_quit;

static void *pool_main(void *p) {
    const int id = (int)(intptr_t)p;
    uint64_t seen = 0;
    pthread_mutex_lock(&pool_mu);
    seen = pool_gen; /* a worker started for a job takes part in it (see below) */
    if (id < pool_want && pool_cur) seen--;
    for (;;) {
        while (pool_gen == seen && !pool_quit) pthread_cond_wait(&pool_work, &pool_mu);
        if (pool_quit) break;
        seen = pool_gen;
        if (id >= pool_want) continue;
        pool_job *job = pool_cur;
        pthread_mutex_unlock(&pool_mu);
        run_worker(job, id);
        pthread_mutex_lock(&pool_mu);
        if (--pool_active == 0) pthread_cond_signal(&pool_done);
    }
    pthread_mutex_unlock(&pool_mu);
    return NULL;
}

static void pool_after_fork_child(void) {
    /* Only the forking thread exists in the child: forget the workers. */
    pthread_mutex_init(&pool_mu, NULL);
    pthread_cond_init(&pool_work, NULL);
    pthread_cond_init(&pool_done, NULL);
    pool_started = 0;
    pool_cur = NULL;
    pool_want = pool_active = pool_quit = 0;
    pthread_mutex_init(&pool_call_mu, NULL);
}

static void pool_init_once(void) { pthread_atfork(NULL, NULL, pool_after_fork_child); }

__attribute__((destructor)) static void pool_stop(void) {
    pthread_mutex_lock(&pool_mu);
    pool_quit = 1;
    pthread_cond_broadcast(&pool_work);
    const int n = pool_started;
    pthread_mutex_unlock(&pool_mu);
    for (int i = 1; i <= n; i++) pthread_join(pool_tid[i], NULL);
    pool_started = 0;
}

/* Runs the job on the pool's workers 1..nthreads-1 and the caller (fewer
 * workers if some cannot be started); the caller holds the pool (pool_call_mu). */
static void pool_run(pool_job *job, int nthreads) {
    pthread_mutex_lock(&pool_mu);
    if (nthreads > POOL_MAX) nthreads = POOL_MAX;
    pool_cur = job;
    pool_want = nthreads;
    pool_active = 0;
    pool_gen++;
    /* Workers that exist take part; start the missing ones (a new worker
     * sees pool_cur set and joins this generation). */
    while (pool_started + 1 < nthreads) {
        const int id = pool_started + 1;
        if (pthread_create(&pool_tid[id], NULL, pool_main, (void *)(intptr_t)id) != 0) break;
        pool_started = id;
    }
    if (pool_want > pool_started + 1) pool_want = pool_started + 1; /* could not start them all */
    pool_active = pool_want - 1;
    pthread_cond_broadcast(&pool_work);
    pthread_mutex_unlock(&pool_mu);

    run_worker(job, 0);

    pthread_mutex_lock(&pool_mu);
    while (pool_active > 0) pthread_cond_wait(&pool_done, &pool_mu);
    pool_cur = NULL;
    pthread_mutex_unlock(&pool_mu);
}

int fattn_parallel_for(int nthreads, int64_t ntasks, fattn_task_fn fn, void *arg) {
    if (ntasks <= 0) return 0;
    if (nthreads < 1 || in_pool_task) nthreads = 1; /* an inner call: the pool is this call's */
    if (nthreads > thread_bound()) nthreads = thread_bound();
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
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, pool_init_once);
    /* a call that finds the pool busy queues here rather than start threads */
    pthread_mutex_lock(&pool_call_mu);
    pool_run(&job, nthreads);
    pthread_mutex_unlock(&pool_call_mu);
    return 0;
}
