/* test_cpu_threads.c - the CPU engine's thread pool (src/cpu/threads.c):
 * every task runs exactly once with worker ids below the thread count, for
 * thread counts 1..5 called in turn, from three user threads at once (the
 * pool is held by one, the others wait for it: test_cpu_pool.c counts the
 * threads), and in a child after fork() (which starts from an empty pool). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/testutil.h"
#include "cpu/threads.h"

#define NTASKS 97

typedef struct call {
    atomic_int seen[NTASKS];
    atomic_int bad_worker;
    int nthreads;
} call;

static void task(void *arg, int64_t t, int worker) {
    call *c = (call *)arg;
    atomic_fetch_add(&c->seen[t], 1);
    if (worker < 0 || worker >= c->nthreads) atomic_fetch_add(&c->bad_worker, 1);
}

/* Returns the number of problems over `calls` calls. */
static int calls(int id, int ncalls) {
    int bad = 0;
    for (int i = 0; i < ncalls; i++) {
        call c;
        memset(&c, 0, sizeof c);
        c.nthreads = 1 + (i + id) % 5;
        fattn_parallel_for(c.nthreads, NTASKS, task, &c);
        for (int t = 0; t < NTASKS; t++) bad += atomic_load(&c.seen[t]) != 1;
        bad += atomic_load(&c.bad_worker);
    }
    return bad;
}

static int user_bad[3];
static void *user(void *p) {
    const int id = (int)(intptr_t)p;
    user_bad[id] = calls(id, 300);
    return NULL;
}

int main(void) {
    int bad = calls(0, 50);
    printf("  one user thread: %d problems\n", bad);
    TU_CHECK(bad == 0, "one user thread: %d tasks run twice, never, or on a bad worker", bad);

    pthread_t th[3];
    for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, user, (void *)(intptr_t)i);
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    bad = user_bad[0] + user_bad[1] + user_bad[2];
    printf("  three user threads at once: %d problems\n", bad);
    TU_CHECK(bad == 0, "three user threads: %d problems", bad);

    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) _exit(calls(1, 50) == 0 ? 0 : 1);
    int status = 0;
    TU_CHECK(pid > 0 && waitpid(pid, &status, 0) == pid, "fork/waitpid failed");
    const int child_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    printf("  after fork, in the child: %s\n", child_ok ? "ok" : "FAILED");
    TU_CHECK(child_ok, "the pool in a forked child: status %d", status);

    bad = calls(2, 50); /* the parent's pool still works */
    TU_CHECK(bad == 0, "after fork, in the parent: %d problems", bad);
    return tu_finish("test_cpu_threads");
}
