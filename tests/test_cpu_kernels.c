/* test_cpu_kernels.c - the CPU engine's vectorised exp, in every forward
 * instance this CPU can run (fwd_block.h) and in every instance of the
 * backward's kernels (kernels.h): error against exp in double over
 * [-87.3, 88] in ulps of the result (the forward's reference role asks for
 * fp32-level accuracy: at most 2 ulps), exactly 0 below ln 2^-126 and for
 * -inf, NaN for NaN, exp(0) = 1.  And the backward's GEMMs (gemm, gemm_tn)
 * in every instance: against a double product within the f32 bound, gemm_tn
 * on a transposed copy of A the same bits as gemm, nothing written outside
 * C's m x n entries. */
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

/* |C - ref| <= (k + 2) * 2^-24 * (sum_p |a_ip b_pj| + |C0_ij|) for a chain of k
 * multiply-adds (fused or not) onto C0, plus a little slack for the last
 * rounding of that bound's own value. */
static void check_gemm(const fattn_cpu_kernels *kern, uint64_t seed) {
    static const int ms[] = {4, 8, 12, 64, 68}, ns[] = {16, 32, 48, 64, 80}, ks[] = {0, 1, 7, 64, 129};
    tu_rng rng;
    tu_rng_init(&rng, seed);
    double worst = 0.0;
    int bits_differ = 0, outside = 0, cases = 0;
    for (int mi = 0; mi < 5; mi++)
        for (int ni = 0; ni < 5; ni++)
            for (int ki = 0; ki < 5; ki++)
                for (int acc = 0; acc < 2; acc++) {
                    const int m = ms[mi], n = ns[ni], k = ks[ki];
                    const int lda = k + 3, ldat = m + 5, ldb = n + 16, ldc = n + 16;
                    float *A = (float *)tu_malloc(sizeof(float) * (size_t)(m * lda + 1));
                    float *At = (float *)tu_malloc(sizeof(float) * (size_t)(k * ldat + 1));
                    float *B = (float *)tu_malloc(sizeof(float) * (size_t)(k * ldb + 1));
                    float *C = (float *)tu_malloc(sizeof(float) * (size_t)(m * ldc));
                    float *C2 = (float *)tu_malloc(sizeof(float) * (size_t)(m * ldc));
                    float *C0 = (float *)tu_malloc(sizeof(float) * (size_t)(m * ldc));
                    for (int i = 0; i < m; i++)
                        for (int p = 0; p < k; p++) A[i * lda + p] = At[p * ldat + i] = (float)tu_rng_normal(&rng);
                    for (int i = 0; i < k * ldb; i++) B[i] = (float)tu_rng_normal(&rng);
                    for (int i = 0; i < m * ldc; i++) C0[i] = (float)tu_rng_normal(&rng);
                    memcpy(C, C0, sizeof(float) * (size_t)(m * ldc));
                    memcpy(C2, C0, sizeof(float) * (size_t)(m * ldc));
                    kern->gemm(m, n, k, A, lda, B, ldb, C, ldc, acc);
                    kern->gemm_tn(m, n, k, At, ldat, B, ldb, C2, ldc, acc);
                    for (int i = 0; i < m; i++)
                        for (int j = 0; j < ldc; j++) {
                            const float c = C[i * ldc + j];
                            if (j >= n) {
                                outside += memcmp(&c, &C0[i * ldc + j], sizeof c) != 0;
                                continue;
                            }
                            double ref = acc ? C0[i * ldc + j] : 0.0, mag = fabs(ref);
                            for (int p = 0; p < k; p++) {
                                const double t = (double)A[i * lda + p] * B[p * ldb + j];
                                ref += t;
                                mag += fabs(t);
                            }
                            const double bound = (k + 2) * 0x1p-24 * mag + 1e-30;
                            const double e = fabs((double)c - ref) / bound;
                            if (!(e <= worst)) worst = e;
                            bits_differ += memcmp(&c, &C2[i * ldc + j], sizeof c) != 0;
                        }
                    cases++;
                    free(A); free(At); free(B); free(C); free(C2); free(C0);
                }
    printf("  backward gemm (%s)    %d shapes: worst error %.3f of the bound; gemm_tn != gemm in %d "
           "elements; %d written outside C\n", kern->isa, cases, worst, bits_differ, outside);
    TU_EXPECT_LE(worst, 1.0, "gemm error / bound");
    TU_CHECK(bits_differ == 0, "%s: gemm_tn differs from gemm in %d elements", kern->isa, bits_differ);
    TU_CHECK(outside == 0, "%s: %d entries outside C's m x n written", kern->isa, outside);
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
    static const char *bwd_isas[] = {"generic", "avx2", "avx512"};
    const uint64_t seed = (uint64_t)tu_seed();
    for (size_t i = 0; i < sizeof bwd_isas / sizeof bwd_isas[0]; i++) {
        fattn_cpu_kernels kb;
        if (fattn_cpu_bwd_kernels_named(bwd_isas[i], &kb) != 0) {
            printf("  backward %s: not on this CPU\n", bwd_isas[i]);
            continue;
        }
        char name[64];
        snprintf(name, sizeof name, "backward exp (%s)", kb.isa);
        check_exp(name, via_bwd, &kb);
        check_gemm(&kb, seed);
    }
    return tu_finish("test_cpu_kernels");
}
