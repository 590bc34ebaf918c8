/* threads.h - a tiny deterministic parallel-for over a persistent pthread
 * pool (CPU engine).
 *
 * fattn_parallel_for runs fn(arg, task, worker) for every task in
 * [0, ntasks) on `nthreads` workers (the calling thread is worker 0; the
 * others are pool threads, started on first use and kept asleep between
 * calls; a call that finds the pool held by another user thread's call
 * waits for it, and starts no threads of its own).  Tasks
 * are handed out dynamically (an atomic counter), so the assignment of tasks
 * to workers varies between runs; callers keep results deterministic by
 * making every task write a disjoint set of outputs and compute them in a
 * fixed order that does not depend on the worker (per-worker scratch is
 * reinitialised by each task). */
#ifndef FATTN_CPU_THREADS_H
#define FATTN_CPU_THREADS_H

#include <stdint.h>

typedef void (*fattn_task_fn)(void *arg, int64_t task, int worker);

/* Threads a call may use, per online CPU (fattn.h, fattn_ctx_set_threads):
 * more than that only adds pool threads that wait for cores. */
#define FATTN_MAX_THREADS_PER_CPU 4

/* Worker count for a request: 0 means the number of online CPUs, and any
 * request is bounded by FATTN_MAX_THREADS_PER_CPU x the online CPUs and by
 * 1024 (at least 1). */
int fattn_cpu_thread_count(int requested);

/* Runs every task; returns 0.  When threads cannot be started the remaining
 * work runs on the calling thread (results are the same).  nthreads is
 * bounded as fattn_cpu_thread_count bounds it.  A task that calls
 * fattn_parallel_for runs that inner call on its own thread. */
int fattn_parallel_for(int nthreads, int64_t ntasks, fattn_task_fn fn, void *arg);

#endif
