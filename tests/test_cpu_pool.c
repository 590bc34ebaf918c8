/* test_cpu_pool.c - the bound on CPU threads (issue 43 item 6):
 *   - fattn_cpu_thread_count never exceeds FATTN_MAX_THREADS_PER_CPU x the
 *     online CPUs (and 1024), whatever fattn_ctx_set_threads was given
 *     (INT_MAX included);
 *   - after fattn_ctx_set_threads(ctx, INT_MAX) and a forward with more
 *     tasks than that, the process holds no more threads than the bound;
 *   - a call that finds the pool busy (two user threads at once) waits for
 *     it instead of starting threads of its own: while two callers run
 *     8-thread calls, the process never holds more than the pool, the two
 *     callers, the sampler and the main thread.
 * Linux only for the counts (/proc/self/task); elsewhere those checks
 * skip. */
#include <dirent.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/testutil.h"
#include "cpu/threads.h"
#include "fattn.h"

/* Threads of this process, -1 when /proc is not there. */
static int thread_count(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

static atomic_int g_sampling, g_max_threads;
static void *sampler(void *arg) {
    (void)arg;
    while (atomic_load(&g_sampling)) {
        int n = thread_count();
        int m = atomic_load(&g_max_threads);
        while (n > m && !atomic_compare_exchange_weak(&g_max_threads, &m, n)) {
        }
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

#define NTASKS 48
typedef struct call {
    atomic_int seen[NTASKS];
    atomic_int bad_worker;
    int nthreads;
} call;

static void slow_task(void *arg, int64_t t, int worker) {
    call *c = (call *)arg;
    atomic_fetch_add(&c->seen[t], 1);
    if (worker < 0 || worker >= c->nthreads) atomic_fetch_add(&c->bad_worker, 1);
    struct timespec ts = {0, 1000000}; /* 1 ms: the two callers overlap */
    nanosleep(&ts, NULL);
}

static atomic_int g_bad;
static void *caller(void *arg) {
    (void)arg;
    for (int i = 0; i < 4; i++) {
        call c;
        memset(&c, 0, sizeof c);
        c.nthreads = 8;
        fattn_parallel_for(8, NTASKS, slow_task, &c);
        for (int t = 0; t < NTASKS; t++) atomic_fetch_add(&g_bad, atomic_load(&c.seen[t]) != 1);
        atomic_fetch_add(&g_bad, atomic_load(&c.bad_worker));
    }
    return NULL;
}

int main(void) {
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu < 1) ncpu = 1;
    const int bound = (int)(ncpu * FATTN_MAX_THREADS_PER_CPU < 1024 ? ncpu * FATTN_MAX_THREADS_PER_CPU : 1024);
    printf("%ld online CPUs: at most %d threads a call\n", ncpu, bound);
    TU_CHECK(fattn_cpu_thread_count(INT_MAX) == bound, "fattn_cpu_thread_count(INT_MAX) = %d, expected %d",
             fattn_cpu_thread_count(INT_MAX), bound);
    TU_CHECK(fattn_cpu_thread_count(bound + 1) == bound, "fattn_cpu_thread_count(%d) = %d", bound + 1,
             fattn_cpu_thread_count(bound + 1));
    TU_CHECK(fattn_cpu_thread_count(3) == (3 < bound ? 3 : bound), "fattn_cpu_thread_count(3) = %d",
             fattn_cpu_thread_count(3));
    TU_CHECK(fattn_cpu_thread_count(0) >= 1 && fattn_cpu_thread_count(0) <= bound, "fattn_cpu_thread_count(0) = %d",
             fattn_cpu_thread_count(0));

    const int base = thread_count();
    if (base < 0) {
        printf("no /proc/self/task: thread counts not checked\n");
        return tu_finish("test_cpu_pool");
    }

    /* set_threads(INT_MAX), then a forward of 2048 tasks (batch x heads) */
    fattn_ctx *ctx = NULL;
    TU_EXPECT_OK(fattn_ctx_create(&ctx, FATTN_BACKEND_CPU, 0));
    TU_EXPECT_OK(fattn_ctx_set_threads(ctx, INT_MAX));
    {
        const int b = 64, s = 4, h = 32, d = 8;
        const size_t n = (size_t)b * s * h * d;
        float *x = tu_malloc(n * 4), *o = tu_malloc(n * 4);
        for (size_t i = 0; i < n; i++) x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f;
        fattn_fwd_args a;
        memset(&a, 0, sizeof a);
        a.p.batch = b; a.p.seqlen_q = a.p.seqlen_k = s; a.p.heads_q = a.p.heads_kv = h; a.p.head_dim = d;
        a.q = a.k = a.v = fattn_tensor_bshd(x, FATTN_DTYPE_F32);
        a.o = fattn_tensor_bshd(o, FATTN_DTYPE_F32);
        TU_EXPECT_OK(fattn_fwd(ctx, &a));
        free(x); free(o);
    }
    const int after = thread_count();
    printf("threads: %d before, %d after a forward with set_threads(INT_MAX)\n", base, after);
    TU_CHECK(after - base <= bound - 1, "%d pool threads started (bound %d - 1)", after - base, bound);
    fattn_ctx_free(ctx);

    /* two callers at once: the second waits for the pool */
    {
        call c;
        memset(&c, 0, sizeof c);
        c.nthreads = 8;
        fattn_parallel_for(8, NTASKS, slow_task, &c); /* the pool at its size for 8 */
    }
    const int warm = thread_count();
    atomic_store(&g_sampling, 1);
    atomic_store(&g_max_threads, warm);
    pthread_t ts, t1, t2;
    pthread_create(&ts, NULL, sampler, NULL);
    pthread_create(&t1, NULL, caller, NULL);
    pthread_create(&t2, NULL, caller, NULL);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    atomic_store(&g_sampling, 0);
    pthread_join(ts, NULL);
    const int peak = atomic_load(&g_max_threads);
    printf("two callers of 8-thread calls: %d threads with the pool warm, at most %d during the calls "
           "(pool + 2 callers + sampler: %d)\n",
           warm, peak, warm + 3);
    TU_CHECK(peak <= warm + 3, "a caller that found the pool busy started threads of its own (%d > %d)", peak,
             warm + 3);
    TU_CHECK(atomic_load(&g_bad) == 0, "%d tasks ran other than once, or on a worker id out of range",
             atomic_load(&g_bad));
    return tu_finish("test_cpu_pool");
}
