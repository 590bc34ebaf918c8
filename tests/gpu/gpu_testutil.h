/* gpu_testutil.h - what the GPU tests share: a CUDA error check that names
 * the call, and the "no suitable GPU -> exit 77 (ctest: skipped)" rule, which
 * FATTN_REQUIRE_GPU=1 turns into a failure. */
#pragma once
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "common/testutil.h"
#include "gpu/cuda_check.h"
#include "fattn.h"

/* A GPU test that cannot run: exit 77 (ctest: skipped) with the reason, or,
 * when the environment sets FATTN_REQUIRE_GPU=1 (scripts/gpu-check.sh does, on
 * the GPU host, where a skip means a broken driver or build), exit 1. */
static inline void gpu_skip(const char *why) {
    const char *req = getenv("FATTN_REQUIRE_GPU");
    if (req && req[0] && strcmp(req, "0") != 0) {
        fprintf(stderr, "FAIL: FATTN_REQUIRE_GPU=%s, and this test would skip: %s\n", req, why);
        printf("FAIL: FATTN_REQUIRE_GPU is set, and this test would skip: %s\n", why);
        exit(1);
    }
    printf("SKIP: %s\n", why);
    exit(77);
}

/* A CUDA context on device 0, or gpu_skip with the reason: no GPU from sm_80
 * on (or a build without CUDA); or, unless any_engine, a context that runs the
 * portable engine without FATTN_CUDA_ENGINE=portable asking for it (a GPU
 * other than Hopper, issue 41): the tests are the Hopper engine's, and the
 * ones the portable engine serves run there through ctest's gpu_portable_*
 * entries, which force it, so each runs once on such a GPU. */
static inline fattn_ctx *gpu_ctx_make_or_skip(int any_engine) {
    fattn_ctx *ctx = NULL;
    fattn_status st = fattn_ctx_create(&ctx, FATTN_BACKEND_CUDA, 0);
    if (st == FATTN_ERROR_NO_DEVICE || st == FATTN_ERROR_UNSUPPORTED) {
        char why[640]; /* the library's messages are shorter than 512 bytes */
        snprintf(why, sizeof why, "no CUDA GPU from sm_80 on (%s: %s)", fattn_status_string(st),
                 fattn_last_error(NULL));
        gpu_skip(why);
    }
    if (st != FATTN_OK) {
        fprintf(stderr, "fattn_ctx_create: %s: %s\n", fattn_status_string(st), fattn_last_error(NULL));
        exit(1);
    }
    const char *forced = getenv("FATTN_CUDA_ENGINE");
    if (!any_engine && strstr(fattn_ctx_engine(ctx), "portable") && !(forced && !strcmp(forced, "portable"))) {
        char why[160];
        snprintf(why, sizeof why, "device 0 runs the portable engine (%s): this test is the Hopper engine's (its "
                 "portable cases run as ctest's gpu_portable_* entries)", fattn_ctx_engine(ctx));
        fattn_ctx_free(ctx);
        gpu_skip(why);
    }
    return ctx;
}

static inline fattn_ctx *gpu_ctx_or_skip(void) { return gpu_ctx_make_or_skip(0); }

/* Whichever engine device 0 runs (calls both engines serve: fattn_merge). */
static inline fattn_ctx *gpu_ctx_any_engine_or_skip(void) { return gpu_ctx_make_or_skip(1); }

/* Whether FATTN_CUDA_ENGINE=portable forces the portable engine (issue 41)
 * on this run: ctest runs the forward and backward tests again so
 * (tests/CMakeLists.txt), and they skip what that engine refuses (FP8,
 * the backward's variants, head dim 96, head_dim_v != head_dim). */
static inline int gpu_portable_forced(void) {
    const char *e = getenv("FATTN_CUDA_ENGINE");
    return e && strcmp(e, "portable") == 0;
}

/* A CPU context, the reference engine the GPU tests compare against; exit 1
 * (a failure, not a skip) when even that cannot be made. */
static inline fattn_ctx *gpu_cpu_ctx(void) {
    fattn_ctx *cpu = NULL;
    if (fattn_ctx_create(&cpu, FATTN_BACKEND_CPU, 0) != FATTN_OK) {
        fprintf(stderr, "CPU context: %s\n", fattn_last_error(NULL));
        exit(1);
    }
    return cpu;
}

/* O and LSE of a 16-bit forward against the FP64 oracle run on the exact
 * 16-bit values the kernel saw, so that what is measured is the kernel's own
 * error: fp32 accumulation, P rounded to 16 bits before the PV GEMM, and the
 * final rounding of O.  u is the unit roundoff of the output: bf16 2^-8 ~
 * 3.9e-3, f16 2^-11 ~ 4.9e-4 (relative, per element).
 *   O, relative Frobenius error over the tensor: bf16 1e-2.  Rounding O alone
 *     gives ~u/sqrt(3) ~ 2e-3 RMS relative (less: mantissas are not all 1.0);
 *     P in bf16 adds a term of the same size; measured errors are ~3-4e-3,
 *     and torch's cuDNN SDPA lands in the same place (tests/gpu/
 *     test_vs_cudnn.py records both).  1e-2 is ~2.5x headroom and still
 *     catches any layout or masking bug (those give errors > 0.1).  f16 2e-3
 *     (the mantissa is 8x finer).
 *   O, the worst row's relative error (tu_max_row_rel_err; one fully wrong
 *     row among 80,000 moves the Frobenius error by ~0.0035 only): bf16
 *     1.6e-2 = 4u, f16 3.9e-3 = 8u.  Each element of a row rounds by up to u,
 *     so the output rounding alone can give a row an error near u; P's
 *     rounding adds a term that, for random V, is about the same fraction of
 *     every row's norm whatever the number of keys the row attends to.  A
 *     row's error and its norm are each chi-like in head_dim dimensions, so
 *     over 10^5 rows of head dim 64 the worst ratio is ~1.7x the typical one:
 *     from the measured ~0.9u (bf16), ~1.5u expected, 4u allowed.  f16 gets
 *     8u because no f16 row error has been measured on the device yet (the
 *     same argument gives ~2u); 8u = 3.9e-3 is still well below what one
 *     lost key does to a row over 1000 keys (~3e-2) or a wrong row (~1).
 *   LSE: max abs error 1e-3 (fp32 sums of exp2; the approximate ex2 has ~2
 *     ulp error; errors seen are ~1e-5, the bound catches mask bugs);
 *     -inf exactly where the oracle has -inf.
 * got / ref: packed BSHD [batch, seq, heads, d] doubles (count of them);
 * lse NULL: the call was given none.  extra: added to the O and LSE bounds
 * (twice to the worst row's): with softcap, cap x 2^-11, the error of a
 * capped score through the GPU's tanh.approx.f32, and so of each softmax
 * weight, relative (tests/gpu/test_fwd_variants.cu).  Counts failures in
 * tu_failures. */
/* The same check with the three bounds given: O's relative error, the worst
 * row's, and the LSE's absolute error (the FP8 cases of test_fwd_variants.cu). */
static inline void gpu_check_fwd_tol(const char *what, const double *got, const double *ref, size_t count, int d,
                                     const float *lse, const double *ref_lse, size_t nlse, double tol,
                                     double row_tol, double lse_tol) {
    char line[400];
    const size_t bad = tu_count_nonfinite(got, count);
    TU_CHECK(bad == 0, "%s: %zu non-finite outputs", what, bad);
    snprintf(line, sizeof line, "%s O rel err", what);
    TU_EXPECT_LE(tu_rel_err(got, ref, count), tol, line);
    size_t worst = 0;
    const double row_err = tu_max_row_rel_err(got, ref, count, (size_t)d, &worst);
    snprintf(line, sizeof line, "%s O worst row rel err (row %zu)", what, worst);
    TU_EXPECT_LE(row_err, row_tol, line);
    if (!lse) return;
    double lse_err = 0;
    size_t lse_bad = 0;
    for (size_t i = 0; i < nlse; ++i) {
        if (isinf(ref_lse[i])) {
            if (!(isinf(lse[i]) && lse[i] < 0)) lse_bad++;
        } else if (!isfinite(lse[i])) {
            lse_bad++;
        } else {
            double e = fabs(lse[i] - ref_lse[i]);
            if (e > lse_err) lse_err = e;
        }
    }
    TU_CHECK(lse_bad == 0, "%s: %zu LSE entries wrong in kind (-inf / finite / NaN)", what, lse_bad);
    snprintf(line, sizeof line, "%s LSE max abs err", what);
    TU_EXPECT_LE(lse_err, lse_tol, line);
}

static inline void gpu_check_fwd(const char *what, fattn_dtype dt, const double *got, const double *ref,
                                 size_t count, int d, const float *lse, const double *ref_lse, size_t nlse,
                                 double extra = 0) {
    gpu_check_fwd_tol(what, got, ref, count, d, lse, ref_lse, nlse, (dt == FATTN_DTYPE_BF16 ? 1e-2 : 2e-3) + extra,
                      (dt == FATTN_DTYPE_BF16 ? 1.6e-2 : 3.9e-3) + 2 * extra, 1e-3 + extra);
}

/* A variable-length batch of per-sequence lengths lq, lk: cu_seqlens (host,
 * [batch + 1], from 0) and the longest sequence of each side. */
static inline void gpu_varlen_offsets(const std::vector<int> &lq, const std::vector<int> &lk,
                                      std::vector<int32_t> &cq, std::vector<int32_t> &ck, int &maxq, int &maxk) {
    const size_t B = lq.size();
    cq.assign(B + 1, 0), ck.assign(B + 1, 0);
    maxq = maxk = 0;
    for (size_t b = 0; b < B; ++b) {
        cq[b + 1] = cq[b] + lq[b], ck[b + 1] = ck[b] + lk[b];
        maxq = lq[b] > maxq ? lq[b] : maxq, maxk = lk[b] > maxk ? lk[b] : maxk;
    }
}

/* The backward's gradient check (test_bwd.cu's header says why these
 * tolerances), shared by test_bwd.cu and test_varlen.cu: per tensor g of dq,
 * dk, dv against the FP64 reference g*, |g - g*|_F / |g*|_F <= tol_fro and
 * max |g - g*| <= tol_max rms(g*), nothing non-finite. */
static inline double tol_fro(fattn_dtype dt) { return dt == FATTN_DTYPE_BF16 ? 1e-2 : 2e-3; }
static inline double tol_max(fattn_dtype dt) { return dt == FATTN_DTYPE_BF16 ? 0.5 : 0.08; }

struct gstat {
    double fro;       /* |g - g*|_F / |g*|_F (absolute when g* = 0) */
    double maxr;      /* max |g - g*| / rms(g*) (absolute when g* = 0) */
    size_t nonfinite;
};

static inline gstat grad_stat(const double *g, const double *r, size_t n) {
    gstat st;
    st.nonfinite = tu_count_nonfinite(g, n);
    st.fro = tu_rel_err(g, r, n);
    double ss = 0;
    for (size_t i = 0; i < n; ++i) ss += r[i] * r[i];
    const double rms = sqrt(ss / (double)(n ? n : 1));
    const double mx = tu_max_abs_err(g, r, n);
    st.maxr = rms > 0 ? mx / rms : mx;
    return st;
}

static inline int grad_ok(const gstat &st, fattn_dtype dt) {
    return st.nonfinite == 0 && st.fro <= tol_fro(dt) && st.maxr <= tol_max(dt); /* false for NaN */
}

