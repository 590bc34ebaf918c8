/* cpu_isas.h - runs a CPU test once per forward instance this CPU has
 * (fwd_block.h), through FATTN_CPU_ISA, which fattn_ctx_create reads:
 *
 *     for (int i = 0; cpu_isa_next(&i, &ctx);) { ...the test on ctx... }
 *
 * prints the instance's name, sets FATTN_CPU_ISA to it and replaces *ctx
 * (freed if not NULL) by a new CPU context created under it; after the last
 * one the variable is unset again (the engine's own choice) and *ctx is a
 * context created without it. */
#ifndef FATTN_TESTS_CPU_ISAS_H
#define FATTN_TESTS_CPU_ISAS_H

#include <stdio.h>
#include <stdlib.h>

#include "cpu/kernels.h"
#include "fattn.h"

static int cpu_isa_next(int *i, fattn_ctx **ctx) {
    static const char *isas[] = {"scalar", "generic", "avx2", "avx2w16", "avx512"};
    const int n = (int)(sizeof isas / sizeof isas[0]);
    for (; *i < n; (*i)++) {
        fattn_fwd_kernel k;
        if (fattn_cpu_fwd_kernel_named(isas[*i], &k) != 0) continue;
        setenv("FATTN_CPU_ISA", isas[*i], 1);
        printf("=== forward instance %s\n", isas[*i]);
        (*i)++;
        fattn_ctx_free(*ctx);
        *ctx = NULL;
        if (fattn_ctx_create(ctx, FATTN_BACKEND_CPU, 0) != FATTN_OK) {
            printf("cannot create a CPU context under FATTN_CPU_ISA=%s: %s\n", isas[*i - 1], fattn_last_error(NULL));
            exit(1);
        }
        return 1;
    }
    unsetenv("FATTN_CPU_ISA");
    fattn_ctx_free(*ctx);
    *ctx = NULL;
    if (fattn_ctx_create(ctx, FATTN_BACKEND_CPU, 0) != FATTN_OK) exit(1);
    return 0;
}

#endif
