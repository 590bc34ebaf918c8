/* kernels.h - the CPU engine's inner loops, compiled for several x86 ISA
 * levels (AVX-512, AVX2+FMA, baseline) and chosen at run time (cpuid): the
 * forward's key-block loop (fwd_block.h), and for the backward a
 * register-blocked f32 GEMM micro-kernel and a vectorised exp. */
#ifndef FATTN_CPU_KERNELS_H
#define FATTN_CPU_KERNELS_H

#include <stdint.h>

#include "cpu/fwd_block.h"

/* C[m x n] = (accumulate ? C : 0) + A[m x k] * B[k x n], all row-major f32
 * with row strides lda, ldb, ldc (elements).  m must be a multiple of 4 and n a
 * multiple of 16 (callers pad with zeros); k >= 0. */
typedef void (*fattn_gemm_fn)(int m, int n, int k, const float *A, int64_t lda, const float *B,
                              int64_t ldb, float *C, int64_t ldc, int accumulate);

/* x[i] = exp(x[i] - sub) for i < n, |rel err| <= ~2 ulp; arguments below
 * -87.33 (including -inf) give exactly 0, NaN gives NaN; the sum of the
 * results is returned (accumulated in a fixed order). */
typedef float (*fattn_exp_fn)(float *x, int n, float sub);

typedef struct fattn_cpu_kernels {
    fattn_gemm_fn gemm;
    fattn_gemm_fn gemm_tn; /* the same, A given transposed: k x m, row stride lda */
    fattn_exp_fn exp_sub;
    const char *isa;      /* of gemm and exp_sub: "avx512", "avx2", "generic" */
    fattn_fwd_kernel fwd; /* the forward's inner loop (fwd_block.h) */
} fattn_cpu_kernels;

/* The best kernels for this CPU (thread-safe), with the forward's instance
 * `fwd_isa` instead when it is not NULL (a name fattn_cpu_isa_lookup
 * accepted: a context's FATTN_CPU_ISA, read once when it was created).
 * Nothing here reads the environment. */
fattn_cpu_kernels fattn_cpu_kernels_get(const char *fwd_isa);

/* The forward instances' names, for messages: "scalar, generic, avx2,
 * avx2w16, avx512". */
extern const char fattn_cpu_isa_names[];

/* FATTN_CPU_ISA's value `name`: 0 when this CPU runs the instance of that
 * name (*canonical = the instance's static name), 1 for an unknown name,
 * 2 for an instance this CPU (or build) cannot run. */
int fattn_cpu_isa_lookup(const char *name, const char **canonical);

/* The backward's kernels (gemm, gemm_tn, exp_sub) of instance `isa`
 * (generic, avx2, avx512), the rest as fattn_cpu_kernels_get gives it, if
 * this CPU can run it: 0 and *out set, else -1 (tests). */
int fattn_cpu_bwd_kernels_named(const char *isa, fattn_cpu_kernels *out);

/* The forward instance called `isa`, if this CPU can run it: 0 and *out set,
 * else -1. */
int fattn_cpu_fwd_kernel_named(const char *isa, fattn_fwd_kernel *out);

#endif
