/* cpu_isas.h - runs a CPU test once per forward instance this CPU has
 * (fwd_block.h), through FATTN_CPU_ISA, which the engine reads on every call:
 *
 *     for (int i = 0; cpu_isa_next(&i);) { ...the test... }
 *
 * prints the instance's name and leaves FATTN_CPU_ISA set to it; after the
 * last one the variable is unset again (the engine's own choice). */
#ifndef FATTN_TESTS_CPU_ISAS_H
#define FATTN_TESTS_CPU_ISAS_H

#include <stdio.h>
#include <stdlib.h>

#include "cpu/kernels.h"

static int cpu_isa_next(int *i) {
    static const char *isas[] = {"scalar", "generic", "avx2", "avx2w16", "avx512"};
    const int n = (int)(sizeof isas / sizeof isas[0]);
    for (; *i < n; (*i)++) {
        fattn_fwd_kernel k;
        if (fattn_cpu_fwd_kernel_named(isas[*i], &k) != 0) continue;
        setenv("FATTN_CPU_ISA", isas[*i], 1);
        printf("=== forward instance %s\n", isas[*i]);
        (*i)++;
        return 1;
    }
    unsetenv("FATTN_CPU_ISA");
    return 0;
}

#endif
