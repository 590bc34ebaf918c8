/* test_ctx_busy.c - one context used by two threads at once (issue 43 item
 * 5).  A context serves one call at a time: a call made while another
 * thread's call runs on the same context is refused with FATTN_ERROR_BUSY,
 * writes nothing (outputs, scales and the context's error message stay as
 * they were) and leaves its message in fattn_last_error(NULL) of the
 * refused thread.  Before the flag, such calls ran concurrently and
 * fattn_fwd_fp8 regrew the workspace the other call was reading.
 *
 * A worker thread runs fattn_fwd and fattn_fwd_fp8 calls of a few tens of
 * milliseconds on the shared context (retrying those refused because a
 * call of the main thread holds it); the main thread meanwhile tries
 * fattn_fwd, fattn_fwd_fp8, fattn_quantize, fattn_ctx_set_threads and
 * fattn_ctx_set_option on it.  Every worker call must succeed with its
 * results equal to the same calls on a private context, at least one of
 * the main thread's calls must be refused, and every refused one must
 * have left its canary-filled outputs alone. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/testutil.h"
#include "fattn.h"

enum { B = 1, S = 768, H = 4, D = 64, SS = 64, WORKER_CALLS = 6 };

static fattn_ctx *g_shared;
static atomic_int g_done, g_started, g_worker_busy;
static float *g_q, *g_k, *g_v;       /* [B, S, H, D] worker inputs */
static float *g_o[WORKER_CALLS];     /* worker outputs */
static fattn_status g_st[WORKER_CALLS];
static char g_err_after[WORKER_CALLS][128];

static fattn_fwd_args fwd_args(float *q, float *k, float *v, float *o, int s) {
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p.batch = B; a.p.seqlen_q = a.p.seqlen_k = s; a.p.heads_q = a.p.heads_kv = H; a.p.head_dim = D;
    a.p.causal = 1;
    a.q = fattn_tensor_bshd(q, FATTN_DTYPE_F32);
    a.k = fattn_tensor_bshd(k, FATTN_DTYPE_F32);
    a.v = fattn_tensor_bshd(v, FATTN_DTYPE_F32);
    a.o = fattn_tensor_bshd(o, FATTN_DTYPE_F32);
    return a;
}

/* call i of the worker: fattn_fwd on even i, fattn_fwd_fp8 on odd i */
static fattn_status worker_call(fattn_ctx *ctx, int i) {
    fattn_fwd_args a = fwd_args(g_q, g_k, g_v, g_o[i], S);
    return i % 2 ? fattn_fwd_fp8(ctx, &a, NULL) : fattn_fwd(ctx, &a);
}

static void *worker(void *arg) {
    (void)arg;
    for (int i = 0; i < WORKER_CALLS; i++) {
        atomic_store(&g_started, 1);
        /* the main thread's calls hold the context too: retry a refusal */
        while ((g_st[i] = worker_call(g_shared, i)) == FATTN_ERROR_BUSY) atomic_fetch_add(&g_worker_busy, 1);
        snprintf(g_err_after[i], sizeof g_err_after[i], "%s", fattn_last_error(g_shared));
    }
    atomic_store(&g_done, 1);
    return NULL;
}

static int all_bytes(const void *p, size_t n, unsigned char c) {
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != c) return 0;
    return 1;
}

int main(void) {
    tu_rng rng;
    tu_rng_init(&rng, (uint64_t)tu_seed());
    const size_t n = (size_t)B * S * H * D, ns = (size_t)B * SS * H * D;
    g_q = tu_malloc(n * 4); g_k = tu_malloc(n * 4); g_v = tu_malloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        g_q[i] = (float)tu_rng_normal(&rng);
        g_k[i] = (float)tu_rng_normal(&rng);
        g_v[i] = (float)tu_rng_normal(&rng);
    }
    for (int i = 0; i < WORKER_CALLS; i++) g_o[i] = tu_malloc(n * 4);
    /* the main thread's small inputs and canary outputs */
    float *sq = tu_malloc(ns * 4), *so = tu_malloc(ns * 4), *qs = tu_malloc(sizeof(float) * H);
    unsigned char *codes = tu_malloc(ns);
    for (size_t i = 0; i < ns; i++) sq[i] = (float)tu_rng_normal(&rng);

    TU_EXPECT_OK(fattn_ctx_create(&g_shared, FATTN_BACKEND_CPU, 0));
    TU_EXPECT_OK(fattn_ctx_set_threads(g_shared, 1)); /* long calls, one core each */
    pthread_t th;
    if (pthread_create(&th, NULL, worker, NULL) != 0) {
        printf("cannot start a thread\n");
        return 1;
    }
    while (!atomic_load(&g_started)) sched_yield();

    long tried = 0, busy = 0, wrote = 0, bad_msg = 0, other = 0;
    for (int round = 0; !atomic_load(&g_done); round++) {
        fattn_status st;
        const int kind = round % 5;
        memset(so, 0xA5, ns * 4);
        memset(codes, 0xA5, ns);
        memset(qs, 0xA5, sizeof(float) * H);
        if (kind == 0) {
            fattn_fwd_args a = fwd_args(sq, sq, sq, so, SS);
            st = fattn_fwd(g_shared, &a);
        } else if (kind == 1) {
            fattn_fwd_args a = fwd_args(sq, sq, sq, so, SS);
            st = fattn_fwd_fp8(g_shared, &a, NULL);
        } else if (kind == 2) {
            fattn_quantize_args a;
            memset(&a, 0, sizeof a);
            a.in = fattn_tensor_bshd(sq, FATTN_DTYPE_F32);
            a.out = fattn_tensor_bshd(codes, FATTN_DTYPE_E4M3);
            a.out.scale = qs;
            a.batch = B; a.seqlen = SS; a.heads = H; a.head_dim = D;
            a.block_rows = SS;
            st = fattn_quantize(g_shared, &a);
        } else if (kind == 3) {
            st = fattn_ctx_set_threads(g_shared, 1);
        } else {
            st = fattn_ctx_set_option(g_shared, FATTN_OPTION_DISABLE_SPLIT, 0);
        }
        tried++;
        if (st == FATTN_ERROR_BUSY) {
            busy++;
            if (!all_bytes(so, ns * 4, 0xA5) || !all_bytes(codes, ns, 0xA5) || !all_bytes(qs, sizeof(float) * H, 0xA5))
                wrote++;
            if (!strstr(fattn_last_error(NULL), "in use")) {
                if (bad_msg++ == 0) printf("  refusal message: \"%s\"\n", fattn_last_error(NULL));
            }
        } else if (st != FATTN_OK) {
            if (other++ == 0) printf("  unexpected status %s\n", fattn_status_string(st));
        }
    }
    pthread_join(th, NULL);
    printf("main thread: %ld calls on the shared context while the worker ran, %ld refused with BUSY\n", tried, busy);
    if (busy) printf("  a refusal's message: \"%s\"\n", fattn_last_error(NULL));
    TU_CHECK(busy > 0, "no call was refused while another thread's call ran on the context");
    TU_CHECK(wrote == 0, "%ld refused calls wrote to their outputs", wrote);
    TU_CHECK(bad_msg == 0, "%ld refusals without a message saying the context is in use", bad_msg);
    TU_CHECK(other == 0, "%ld calls failed otherwise", other);

    /* the worker's calls: all succeeded, their message untouched, their
     * results those of a private context */
    fattn_ctx *own = NULL;
    TU_EXPECT_OK(fattn_ctx_create(&own, FATTN_BACKEND_CPU, 0));
    float *ref = tu_malloc(n * 4);
    long bad_calls = 0;
    for (int i = 0; i < WORKER_CALLS; i++) {
        if (g_st[i] != FATTN_OK || g_err_after[i][0]) {
            printf("  worker call %d: %s \"%s\"\n", i, fattn_status_string(g_st[i]), g_err_after[i]);
            bad_calls++;
            continue;
        }
        fattn_fwd_args a = fwd_args(g_q, g_k, g_v, ref, S);
        fattn_status st = i % 2 ? fattn_fwd_fp8(own, &a, NULL) : fattn_fwd(own, &a);
        if (st != FATTN_OK || memcmp(ref, g_o[i], n * 4) != 0) bad_calls++;
    }
    printf("worker: %d calls (%d refusals retried), %ld failed or differ from a private context's\n", WORKER_CALLS,
           atomic_load(&g_worker_busy), bad_calls);
    TU_CHECK(bad_calls == 0, "%ld worker calls failed or changed", bad_calls);

    /* after the worker: the context serves the main thread again */
    fattn_fwd_args a = fwd_args(sq, sq, sq, so, SS);
    TU_EXPECT_OK(fattn_fwd(g_shared, &a));
    TU_CHECK(fattn_last_error(g_shared)[0] == '\0', "the shared context holds a message after a success");
    TU_CHECK(strcmp(fattn_status_string(FATTN_ERROR_BUSY), "unknown status") != 0,
             "FATTN_ERROR_BUSY has no status string");

    fattn_ctx_free(own);
    fattn_ctx_free(g_shared);
    free(ref); free(sq); free(so); free(qs); free(codes);
    free(g_q); free(g_k); free(g_v);
    for (int i = 0; i < WORKER_CALLS; i++) free(g_o[i]);
    return tu_finish("test_ctx_busy");
}
