/* test_cpu_kernels.c - the CPU engine's vectorised exp, in every forward
 * instance this CPU can run (fwd_block.h) and in the backward's kernels
 * (kernels.h): error against exp in double over [-87.3, 88] in ulps of the
 * result (the forward's reference role asks for fp32-level accuracy: at
 * most 2 ulps), exactly 0 below ln 2^-126 and for -inf, NaN for NaN,
 * exp(0) = 1. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/testutil.h"
#include "cpu/fwd_block.h"
#include "cpu/kernels.h"

#define MAX_ULP 2.0

/* |y - ref| in ulps of ref (the float spacing at ref). */
static double ulps(float y, double ref) {
    int e;
    frexp(ref, &e);
    const double ulp = ldexp(1.0, e - 24);
    return fabs((double)y - ref) / ulp;
}

/* Runs f over the sweep; reports the worst ulp error and special values. */
static void check_exp(const char *name, void (*f)(float *x, int n, void *ctx), void *ctx) {
    enum { N = 1 << 20 };
    float *x = (float *)tu_malloc(sizeof(float) * N), *y = (float *)tu_malloc(sizeof(float) * N);
    const double lo = -87.33, hi = 88.0;
    for (int i = 0; i < N; i++) x[i] = (float)(lo + (hi - lo) * i / (N - 1));
    memcpy(y, x, sizeof(float) * N);
    f(y, N, ctx);
    double worst = 0.0;
    float worst_x = 0.0f;
    for (int i = 0; i < N; i++) {
        const double ref = exp((double)x[i]);
        if (ref < 0x1p-126) continue; /* subnormal results: not asked for */
        const double u = ulps(y[i], ref);
        if (!(u <= worst)) {
            worst = u;
            worst_x = x[i];
        }
    }
    float sp[8] = {NAN, -INFINITY, -87.5f, -88.0f, -1000.0f, -3.0e38f, 0.0f, -0.0f};
    f(sp, 8, ctx);
    const int nan_ok = isnan(sp[0]);
    const int zero_ok = sp[1] == 0.0f && sp[2] == 0.0f && sp[3] == 0.0f && sp[4] == 0.0f &&
                        sp[5] == 0.0f;
    const int one_ok = sp[6] == 1.0f && sp[7] == 1.0f;
    printf("  %-22s worst %.2f ulp (at x = %.7g); NaN -> %s; -inf, < -87.34 -> %s; 0 -> %s\n", name,
           worst, worst_x, nan_ok ? "NaN" : "NOT NaN", zero_ok ? "0" : "NOT 0",
           one_ok ? "1" : "NOT 1");
    TU_EXPECT_LE(worst, MAX_ULP, name);
    TU_CHECK(nan_ok && zero_ok && one_ok, "%s: special values wrong", name);
    free(x);
    free(y);
}

static void via_fwd(float *x, int n, void *ctx) { ((const fattn_fwd_kernel *)ctx)->exp(x, n); }
static void via_bwd(float *x, int n, void *ctx) {
    const fattn_cpu_kernels *k = (const fattn_cpu_kernels *)ctx;
    k->exp_sub(x, n, 0.0f);
}

int main(void) {
    static const char *isas[] = {"scalar", "generic", "avx2", "avx2w16", "avx512"};
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        fattn_fwd_kernel k;
        if (fattn_cpu_fwd_kernel_named(isas[i], &k) != 0) {
            printf("  forward %s: not on this CPU\n", isas[i]);
            continue;
        }
        char name[64];
        snprintf(name, sizeof name, "forward exp (%s)", isas[i]);
        check_exp(name, via_fwd, &k);
    }
    fattn_cpu_kernels kb = fattn_cpu_kernels_get();
    char name[64];
    snprintf(name, sizeof name, "backward exp (%s)", kb.isa);
    check_exp(name, via_bwd, &kb);
    return tu_finish("test_cpu_kernels");
}
