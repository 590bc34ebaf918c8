/* fp8.h - FP8 numerics and the Hadamard rotation shared by both engines
 * (CPU attention and quantiser, CUDA quantiser), the tools and the tests.  Not installed. */
#ifndef FATTN_COMMON_FP8_H
#define FATTN_COMMON_FP8_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Value of every e4m3 code (fattn_e4m3_to_f32 as a table, for inner loops). */
extern const float fattn_e4m3_values[256];

/* Largest finite e4m3 value. */
#define FATTN_E4M3_MAX 448.0f

/* The scale of a block whose amax > 0 (NaN left out, +Inf kept):
 * max(amax / 448, FLT_MIN).  Without the floor a block of f32 subnormals
 * (amax below ~3.1e-43) gets scale 0, and every 0 in it codes NaN (0 / 0);
 * FLT_MIN (2^-126) keeps 1 / scale finite for the attention kernels, and
 * the CUDA quantiser takes the same max (src/cuda/ops/quantize.cu). */
#define FATTN_E4M3_SCALE_MIN 0x1p-126f
static inline float fattn_e4m3_scale(float amax) {
    const float s = amax / FATTN_E4M3_MAX;
    return s > FATTN_E4M3_SCALE_MIN ? s : FATTN_E4M3_SCALE_MIN;
}

/* 1 if n is a power of two >= 1. */
static inline int fattn_is_pow2(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

/* In-place fast Walsh-Hadamard transform of x[0..n), n a power of two,
 * normalised by 1/sqrt(n) so that it is orthogonal (and its own inverse).
 * Sylvester ordering: y[i] = sum_j (-1)^popcount(i & j) x[j] / sqrt(n). */
void fattn_fwht(float *x, int32_t n);

/* The incoherent-processing rotation of one row, in place:
 *   x <- (x * signs) H / sqrt(n)          (x M with M = diag(signs) H / sqrt(n))
 * fattn_unrotate_row applies M^T = M^-1:  x <- (x H / sqrt(n)) * signs. */
void fattn_rotate_row(float *x, const float *signs, int32_t n);
void fattn_unrotate_row(float *x, const float *signs, int32_t n);

#ifdef __cplusplus
}
#endif

#endif
