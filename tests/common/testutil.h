/* testutil.h - helpers shared by the CPU and GPU tests (plain C). */
#ifndef FATTN_TESTUTIL_H
#define FATTN_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- failure counting ---------------------------------------------------- */

extern int tu_failures;

/* TU_CHECK(cond, "fmt", ...): counts a failure and prints file:line when cond
 * is false.  TU_EXPECT_LE(value, tol, "what"): prints "what: value (tol)". */
#define TU_CHECK(cond, ...)                                                        \
    do {                                                                           \
        if (!(cond)) {                                                             \
            tu_failures++;                                                         \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                          \
            fprintf(stderr, "\n");                                                 \
        }                                                                          \
    } while (0)

#define TU_EXPECT_OK(call)                                                          \
    do {                                                                            \
        fattn_status tu_st_ = (call);                                               \
        if (tu_st_ != FATTN_OK) {                                                   \
            tu_failures++;                                                          \
            fprintf(stderr, "%s:%d: %s returned %d (%s)\n", __FILE__, __LINE__, #call, \
                    (int)tu_st_, fattn_status_string(tu_st_));                      \
        }                                                                           \
    } while (0)

/* Prints "  [ok|FAIL] what: err = value (tol)" and counts a failure when
 * value > tol or value is NaN. Returns 1 if it passed. */
int tu_expect_le_at(const char *file, int line, double value, double tol, const char *what);
#define TU_EXPECT_LE(value, tol, what) tu_expect_le_at(__FILE__, __LINE__, (value), (tol), (what))

/* Prints a summary line; returns 0 when no check failed, else 1. */
int tu_finish(const char *test_name);

/* ---- random numbers ------------------------------------------------------ */

typedef struct tu_rng {
    uint64_t s[4];
} tu_rng;

/* Seed for this run: TU_DEFAULT_SEED, so that every run (and CI) draws the
 * same inputs; env FATTN_TEST_SEED=N overrides it, FATTN_TEST_SEED=random
 * draws a fresh time-based one.  Printed either way ("seed N ...: rerun with
 * FATTN_TEST_SEED=N"). */
#define TU_DEFAULT_SEED 20240527
int tu_seed(void);

/* The longest sequence of a varlen batch: max of cu[b + 1] - cu[b], b < batch. */
int tu_varlen_max(const int32_t *cu, int batch);
void tu_rng_init(tu_rng *r, uint64_t seed); /* splitmix64 -> xoshiro256** */
uint64_t tu_rng_u64(tu_rng *r);
double tu_rng_uniform(tu_rng *r); /* [0, 1) */
double tu_rng_normal(tu_rng *r);  /* N(0, 1) */
void tu_fill_normal(tu_rng *r, double *x, size_t n);

/* ---- numbers and buffers -------------------------------------------------- */

/* Aborts the test on allocation failure. */
void *tu_malloc(size_t bytes);
/* Fill with 0xFF bytes (NaN for every float format). */
void tu_poison(void *p, size_t bytes);

/* Element conversions double <-> dtype (f32, f16, bf16; e4m3 = the raw code's
 * value, no scale). */
void tu_to_dtype(const double *src, size_t n, fattn_dtype dt, void *dst);
void tu_from_dtype(const void *src, size_t n, fattn_dtype dt, double *dst);
/* Round in place to the nearest value representable in dt. */
void tu_round_to(double *x, size_t n, fattn_dtype dt);

/* ||x - ref||_F / ||ref||_F; +inf if any x is NaN/inf where ref is finite;
 * the absolute norm ||x - ref|| when ||ref|| == 0. */
double tu_rel_err(const double *x, const double *ref, size_t n);
/* The worst row: max over the rows of x (rows of `width` contiguous
 * elements, count / width of them) of tu_rel_err of that row.  One wrong row
 * among 10^5 barely moves the Frobenius error of the whole tensor; it moves
 * this.  *worst (may be NULL) receives the index of that row. */
double tu_max_row_rel_err(const double *x, const double *ref, size_t count, size_t width,
                          size_t *worst);
/* max |x - ref| (+inf on NaN). */
double tu_max_abs_err(const double *x, const double *ref, size_t n);
/* Count of non-finite entries. */
size_t tu_count_nonfinite(const double *x, size_t n);

/* ---- host tensors -------------------------------------------------------- */

/* A host tensor [batch, seq, heads, dim] of one dtype in BSHD or BHSD layout
 * (varlen: batch 1 and seq = total tokens), with e4m3 scales when needed. */
typedef enum tu_layout { TU_BSHD = 0, TU_BHSD = 1 } tu_layout;

typedef struct tu_tensor {
    fattn_tensor t; /* ready for the API (host pointers) */
    int batch, seq, heads, dim;
    tu_layout layout;
    size_t count;   /* elements */
    size_t bytes;
    size_t nscale;  /* e4m3 scale count */
} tu_tensor;

/* scale_block: rows per e4m3 scale (ignored for other dtypes). */
void tu_tensor_alloc(tu_tensor *x, fattn_dtype dt, int batch, int seq, int heads, int dim,
                     tu_layout layout, int scale_block);
void tu_tensor_free(tu_tensor *x);
/* Store packed-BSHD doubles `src` into x (rounding to its dtype; e4m3: per
 * block scale = max(amax / 448, 2^-126), 1 for an all-zero block).  If `held` is not NULL
 * it receives (packed BSHD) the exact values the tensor now represents. */
void tu_tensor_set(tu_tensor *x, const double *src, double *held);
/* Read x back as packed-BSHD doubles (scales applied). */
void tu_tensor_get(const tu_tensor *x, double *dst);
void tu_tensor_poison(tu_tensor *x);

/* The problem a test case describes (head_dim_v 0 = head_dim, cu_* NULL =
 * fixed lengths); every other field zero, so the library's defaults apply. */
fattn_problem tu_problem(int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv, int head_dim,
                         int head_dim_v, int causal, const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k);

#ifdef __cplusplus
}
#endif

#endif
