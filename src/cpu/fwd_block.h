/* fwd_block.h - the CPU forward's inner loop: one key block against every
 * query panel of a task (attention_fwd.c drives it; fwd_block_tmpl.h is the
 * code, instantiated once per ISA in fwd_block.c).
 *
 * Layouts are query-major so that every vector runs along queries: a panel is
 * NR consecutive query rows, stored transposed.
 *   qp  [npanels][d][NR]    Q^T of each panel, times softmax_scale
 *   ot  [npanels][dv][NR]   unnormalised O^T of each panel
 *   s   [BN][NR]            S^T = K Q^T of one panel, then P^T
 * S^T = K Q^T and O^T += V^T P^T are register-tiled GEMMs whose vectors hold
 * NR queries and whose broadcasts come from K (or V) rows; the row max, the
 * rescale and the row sum of the online softmax are then plain vector ops,
 * with no horizontal reduction.
 *
 * Every result depends only on the panel it belongs to: panel boundaries sit
 * at multiples of NR from the sequence start and key blocks at multiples of
 * BN, whatever the task's height, so O and LSE are bitwise the same for any
 * thread count (the task height changes with it). */
#ifndef FATTN_CPU_FWD_BLOCK_H
#define FATTN_CPU_FWD_BLOCK_H

#include <stdint.h>

typedef struct fattn_fwd_block {
    const float *k; /* [jn] key rows of d floats, row stride ldk */
    const float *v; /* [jn] value rows of dv floats, row stride ldv */
    int64_t ldk, ldv;
    int jn;         /* keys in this block */
    int d, dv;
    int64_t j0;     /* sequence index of the block's first key */
    int npanels;
    int rows;       /* real query rows of the task (the last panel may be partial) */
    int64_t q0;     /* sequence index of the task's first query */
    int64_t off;    /* key j is visible to query i iff j <= i + off */
    int64_t left;   /* ... and j >= i + off - left (-1: no such bound; counted
                       from off: window_left + window_right with a right side) */
    float softcap;  /* > 0: scores s -> softcap * tanh(s / softcap) before the mask */
    int ot_zeroed;  /* ot holds zeros before the first key block (the window
                       may skip a panel's first blocks): always rescale */
    const float *qp;
    float *ot;
    float *m, *l;   /* [npanels * NR] running max and sum */
    float *s;       /* [BN * NR] scratch */
    float *alpha;   /* [NR] scratch: the block max, then the rescale factor */
} fattn_fwd_block;

typedef struct fattn_fwd_kernel {
    void (*run)(const fattn_fwd_block *b);
    /* dst[t * nr + c] = src[c * lds + t], c < nr, t < n (rows into a panel) */
    void (*pack)(const float *src, int64_t lds, int n, float *dst);
    /* dst[c * ldd + t] = src[t * nr + c], c < nr, t < n (a panel into rows) */
    void (*unpack)(const float *src, int n, float *dst, int64_t ldd);
    void (*exp)(float *x, int n); /* x[i] = exp(x[i]) by the instance's exp (tests) */
    int nr;          /* queries per panel (a divisor of 64) */
    int bn;          /* keys per block */
    const char *isa; /* "scalar", "generic", "avx2", "avx2w16", "avx512" */
} fattn_fwd_kernel;

/* Plain C (one float per "vector"): any compiler with GCC vector extensions,
 * any CPU. */
extern const fattn_fwd_kernel fattn_fwd_kernel_scalar;
/* 4-float vectors: SSE2 on x86-64, NEON on arm64, whatever the target has. */
extern const fattn_fwd_kernel fattn_fwd_kernel_generic;
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#define FATTN_FWD_X86 1
/* AVX2 + FMA: 8 floats, 6 x 16 register tile. */
extern const fattn_fwd_kernel fattn_fwd_kernel_avx2;
/* AVX-512F: 16 floats, 8 x 32 register tile. */
extern const fattn_fwd_kernel fattn_fwd_kernel_avx512;
/* The AVX-512 kernel's exact code compiled for AVX2 + FMA (the compiler
 * splits each 16-float vector in two): bitwise the same results as
 * fattn_fwd_kernel_avx512, so that machines without AVX-512 test its logic. */
extern const fattn_fwd_kernel fattn_fwd_kernel_avx2w16;
#endif

#endif
