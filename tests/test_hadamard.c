/* test_hadamard.c - the incoherent-processing rotation x -> x diag(s) H/sqrt(d):
 * orthogonal (inverse recovers x, materialised matrix has orthonormal rows and
 * matches the closed form signs[i] (-1)^popcount(i&j) / sqrt(d)), leaves
 * Q K^T unchanged, and its signs are a deterministic function of the seed.
 * FATTN_TEST_SEED=<n> reproduces the random cases. */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/testutil.h"
#include "fattn.h"
#include "common/fp8.h"

static int g_fail = 0;

static tu_rng g_rng; /* tests/common/testutil, seeded from tu_seed() in main */
static uint64_t rng_next(void) { return tu_rng_u64(&g_rng); }
static double rng_uniform(void) { return tu_rng_uniform(&g_rng); }
static double rng_normal(void) { return tu_rng_normal(&g_rng); }
/* The FP8 protocol's inputs: N(0,1) plus, with probability 0.001, N(0, 10^2). */
static float rng_outlier(void) {
    double x = rng_normal();
    if (rng_uniform() < 0.001) x += 10.0 * rng_normal();
    return (float)x;
}

static void report(const char *what, double measured, double tol) {
    int ok = measured <= tol;
    printf("  %-58s %.3e (tolerance %.1e) %s\n", what, measured, tol, ok ? "ok" : "FAIL");
    if (!ok) g_fail++;
}

static void test_dim(int32_t d) {
    printf("d = %d\n", (int)d);
    float *signs = malloc(sizeof(float) * d), *x = malloc(sizeof(float) * d),
          *y = malloc(sizeof(float) * d), *m = malloc(sizeof(float) * (size_t)d * d);
    uint64_t seed = rng_next();
    if (fattn_rotation_signs(seed, d, signs) != FATTN_OK) g_fail++;
    char what[128];

    /* rotate then unrotate */
    double err = 0, xmax = 0;
    for (int t = 0; t < 20; t++) {
        for (int i = 0; i < d; i++) y[i] = x[i] = rng_outlier();
        fattn_rotate_row(y, signs, d);
        fattn_unrotate_row(y, signs, d);
        for (int i = 0; i < d; i++) {
            err = fmax(err, fabs((double)y[i] - x[i]));
            xmax = fmax(xmax, fabs(x[i]));
        }
    }
    snprintf(what, sizeof what, "inverse(rotate(x)) - x, max abs / max|x|");
    report(what, err / xmax, 1e-6);

    /* materialise M: row i = e_i M */
    for (int i = 0; i < d; i++) {
        float *r = m + (size_t)i * d;
        memset(r, 0, sizeof(float) * d);
        r[i] = 1.0f;
        fattn_rotate_row(r, signs, d);
    }
    double orth = 0, form = 0;
    for (int i = 0; i < d; i++) {
        for (int j = 0; j < d; j++) {
            double dot = 0;
            for (int k = 0; k < d; k++) dot += (double)m[(size_t)i * d + k] * m[(size_t)j * d + k];
            orth = fmax(orth, fabs(dot - (i == j ? 1.0 : 0.0)));
            double want = signs[i] * ((__builtin_popcount((unsigned)(i & j)) & 1) ? -1.0 : 1.0) /
                          sqrt((double)d);
            form = fmax(form, fabs(m[(size_t)i * d + j] - want));
        }
    }
    report("rows of M orthonormal: max |M M^T - I|", orth, 1e-6);
    report("M vs closed form signs[i] (-1)^popcount(i&j)/sqrt(d), max abs", form, 1e-7);

    /* Q K^T invariance, q and k with outliers, same seed for both */
    double rel = 0;
    for (int t = 0; t < 200; t++) {
        float q[256], k[256], qr[256], kr[256];
        for (int i = 0; i < d; i++) { qr[i] = q[i] = rng_outlier(); kr[i] = k[i] = rng_outlier(); }
        fattn_rotate_row(qr, signs, d);
        fattn_rotate_row(kr, signs, d);
        double a = 0, b = 0, nq = 0, nk = 0;
        for (int i = 0; i < d; i++) {
            a += (double)q[i] * k[i];
            b += (double)qr[i] * kr[i];
            nq += (double)q[i] * q[i];
            nk += (double)k[i] * k[i];
        }
        rel = fmax(rel, fabs(a - b) / sqrt(nq * nk));
    }
    report("q.k after rotating both: max |diff| / (|q||k|)", rel, 1e-5);
    free(signs); free(x); free(y); free(m);
}

static void test_signs(void) {
    printf("signs\n");
    enum { N = 4096 };
    static float a[N], b[N], c[N];
    uint64_t seed = rng_next();
    fattn_rotation_signs(seed, N, a);
    fattn_rotation_signs(seed, N, b);
    int same = memcmp(a, b, sizeof a) == 0, pm = 1, minus = 0;
    for (int i = 0; i < N; i++) {
        pm &= a[i] == 1.0f || a[i] == -1.0f;
        minus += a[i] < 0;
    }
    printf("  same seed twice: %s; all +-1: %s; %d of %d negative\n", same ? "identical" : "DIFFER",
           pm ? "yes" : "NO", minus, N);
    if (!same || !pm) g_fail++;
    /* 4096 fair coins: mean 2048, sd 32; 8 sd is a broken generator */
    report("|#negative - N/2| / sd", fabs(minus - N / 2.0) / 32.0, 8.0);
    fattn_rotation_signs(seed + 1, N, c);
    int diff = 0;
    for (int i = 0; i < N; i++) diff += a[i] != c[i];
    printf("  seed+1 differs in %d of %d signs\n", diff, N);
    report("|#differing - N/2| / sd for seed+1", fabs(diff - N / 2.0) / 32.0, 8.0);
    /* prefix property: n signs are the first n of a longer draw */
    fattn_rotation_signs(seed, 64, c);
    int prefix = memcmp(a, c, 64 * sizeof(float)) == 0;
    printf("  first 64 of n=4096 equal n=64: %s\n", prefix ? "yes" : "NO");
    if (!prefix) g_fail++;
    int inv = fattn_rotation_signs(seed, 0, c) == FATTN_ERROR_INVALID_ARGUMENT &&
              fattn_rotation_signs(seed, -3, c) == FATTN_ERROR_INVALID_ARGUMENT &&
              fattn_rotation_signs(seed, 8, NULL) == FATTN_ERROR_INVALID_ARGUMENT;
    printf("  n <= 0 or NULL -> INVALID_ARGUMENT: %s\n", inv ? "yes" : "NO");
    if (!inv) g_fail++;
}

int main(void) {
    tu_rng_init(&g_rng, (uint64_t)tu_seed()); /* prints the seed; FATTN_TEST_SEED reproduces */
    test_dim(64);
    test_dim(128);
    test_dim(256);
    test_signs();
    printf("test_hadamard: %d failed -> %s\n", g_fail, g_fail ? "FAIL" : "PASS");
    return g_fail ? 1 : 0;
}
