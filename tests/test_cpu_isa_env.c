/* test_cpu_isa_env.c - FATTN_CPU_ISA (issue 43 item 7; fattn.h, Context):
 *   - it is read when a CPU context is created, once: an unknown value
 *     fails fattn_ctx_create with INVALID_ARGUMENT and a message naming
 *     the value and the known ones; an instance this CPU cannot run fails
 *     with UNSUPPORTED; empty means unset;
 *   - a context keeps the instance it was created with: changing the
 *     variable afterwards (even to garbage) changes nothing, and its results
 *     are the bits of a fresh context created with the same value. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/testutil.h"
#include "cpu/kernels.h"
#include "fattn.h"

static void run(fattn_ctx *ctx, const float *x, float *o, int n) {
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p.batch = 1; a.p.seqlen_q = a.p.seqlen_k = n; a.p.heads_q = a.p.heads_kv = 2; a.p.head_dim = 40;
    a.p.causal = 1;
    a.q = a.k = a.v = fattn_tensor_bshd((void *)x, FATTN_DTYPE_F32);
    a.o = fattn_tensor_bshd(o, FATTN_DTYPE_F32);
    TU_EXPECT_OK(fattn_fwd(ctx, &a));
}

int main(void) {
    tu_rng rng;
    tu_rng_init(&rng, (uint64_t)tu_seed());
    const int n = 150;
    const size_t cnt = (size_t)n * 2 * 40;
    float *x = tu_malloc(cnt * 4), *o1 = tu_malloc(cnt * 4), *o2 = tu_malloc(cnt * 4);
    for (size_t i = 0; i < cnt; i++) x[i] = (float)tu_rng_normal(&rng);

    fattn_ctx *ctx = NULL;
    setenv("FATTN_CPU_ISA", "avx3", 1);
    fattn_status st = fattn_ctx_create(&ctx, FATTN_BACKEND_CPU, 0);
    printf("FATTN_CPU_ISA=avx3: %s (%s)\n", fattn_status_string(st), fattn_last_error(NULL));
    TU_CHECK(st == FATTN_ERROR_INVALID_ARGUMENT && ctx == NULL, "an unknown FATTN_CPU_ISA is not refused");
    TU_CHECK(strstr(fattn_last_error(NULL), "avx3") && strstr(fattn_last_error(NULL), "generic"),
             "the message names neither the value nor the known ones");
    fattn_ctx_free(ctx);
    ctx = NULL;

    /* AUTO that lands on the CPU reads it too */
    if (fattn_ctx_create(&ctx, FATTN_BACKEND_AUTO, 0) == FATTN_OK && fattn_ctx_backend(ctx) == FATTN_BACKEND_CPU)
        TU_CHECK(0, "AUTO on the CPU accepted FATTN_CPU_ISA=avx3");
    fattn_ctx_free(ctx);
    ctx = NULL;

    /* an instance this CPU lacks: UNSUPPORTED */
    static const char *isas[] = {"scalar", "generic", "avx2", "avx2w16", "avx512"};
    for (int i = 0; i < 5; i++) {
        fattn_fwd_kernel k;
        if (fattn_cpu_fwd_kernel_named(isas[i], &k) == 0) continue;
        setenv("FATTN_CPU_ISA", isas[i], 1);
        st = fattn_ctx_create(&ctx, FATTN_BACKEND_CPU, 0);
        printf("FATTN_CPU_ISA=%s (not on this CPU): %s (%s)\n", isas[i], fattn_status_string(st), fattn_last_error(NULL));
        TU_CHECK(st == FATTN_ERROR_UNSUPPORTED, "FATTN_CPU_ISA=%s on a CPU without it is not UNSUPPORTED", isas[i]);
        fattn_ctx_free(ctx);
        ctx = NULL;
    }

    setenv("FATTN_CPU_ISA", "", 1);
    TU_EXPECT_OK(fattn_ctx_create(&ctx, FATTN_BACKEND_CPU, 0)); /* empty: the best instance */
    fattn_ctx_free(ctx);
    ctx = NULL;

    /* read once: each context keeps its instance */
    for (int i = 0; i < 5; i++) {
        fattn_fwd_kernel k;
        if (fattn_cpu_fwd_kernel_named(isas[i], &k) != 0) continue;
        setenv("FATTN_CPU_ISA", isas[i], 1);
        TU_EXPECT_OK(fattn_ctx_create(&ctx, FATTN_BACKEND_CPU, 0));
        setenv("FATTN_CPU_ISA", "garbage", 1); /* later changes are not read */
        memset(o1, 0xFF, cnt * 4);
        run(ctx, x, o1, n);
        TU_CHECK(fattn_last_error(ctx)[0] == '\0', "a call read FATTN_CPU_ISA=garbage");
        setenv("FATTN_CPU_ISA", isas[i], 1);
        fattn_ctx *fresh = NULL;
        TU_EXPECT_OK(fattn_ctx_create(&fresh, FATTN_BACKEND_CPU, 0));
        memset(o2, 0xFF, cnt * 4);
        run(fresh, x, o2, n);
        const int same = memcmp(o1, o2, cnt * 4) == 0;
        printf("  %-8s: a context created with it, the variable then changed: %s\n", isas[i],
               same ? "the same bits as a fresh context" : "DIFFERENT");
        TU_CHECK(same, "%s: results changed with the variable", isas[i]);
        fattn_ctx_free(fresh);
        fattn_ctx_free(ctx);
        ctx = NULL;
    }
    unsetenv("FATTN_CPU_ISA");
    free(x); free(o1); free(o2);
    return tu_finish("test_cpu_isa_env");
}
