/* fwd_block.c - the instances of fwd_block_tmpl.h (see fwd_block.h).
 *
 * The library is built for the baseline ISA (no -march); the AVX2 and
 * AVX-512 instances carry a per-function target attribute and are only
 * called after kernels.c has checked the CPU (__builtin_cpu_supports). */
#include "cpu/fwd_block.h"

/* The avx2w16 instance passes 64-byte vectors between AVX2 functions; they
 * are all static and inlined, so the ABI note does not apply (GCC emits it
 * where it first sees such a parameter, hence file scope). */
#pragma GCC diagnostic ignored "-Wpsabi"

#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef FATTN_FWD_X86
#include <immintrin.h>
#endif

/* ---- scalar: one float per vector, 4 x 4 tile ------------------------------ */
#define KT_ISA scalar
#define KT_ATTR
#define KT_W 1
#define KT_NV 4
#define KT_MR 4
#define KT_BN 64
#include "cpu/fwd_block_tmpl.h"

/* ---- generic: 4 floats (SSE2, NEON, ...), 4 x 8 tile ------------------------ */
#define KT_ISA generic
#define KT_ATTR
#define KT_W 4
#define KT_NV 2
#define KT_MR 4
#define KT_BN 64
#include "cpu/fwd_block_tmpl.h"

#ifdef FATTN_FWD_X86
/* dst[i * ldd + j] = src[j * lds + i], i, j < 8 (packing Q^T and unpacking
 * O^T panels; every x86 instance but the scalar and generic ones). */
__attribute__((target("avx2,fma"))) static inline void fwd_transpose8(const float *src,
                                                                      int64_t lds, float *dst,
                                                                      int64_t ldd) {
    __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + lds);
    __m256 r2 = _mm256_loadu_ps(src + 2 * lds), r3 = _mm256_loadu_ps(src + 3 * lds);
    __m256 r4 = _mm256_loadu_ps(src + 4 * lds), r5 = _mm256_loadu_ps(src + 5 * lds);
    __m256 r6 = _mm256_loadu_ps(src + 6 * lds), r7 = _mm256_loadu_ps(src + 7 * lds);
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
    __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    _mm256_storeu_ps(dst, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_storeu_ps(dst + ldd, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_storeu_ps(dst + 2 * ldd, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_storeu_ps(dst + 3 * ldd, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_storeu_ps(dst + 4 * ldd, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_storeu_ps(dst + 5 * ldd, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_storeu_ps(dst + 6 * ldd, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_storeu_ps(dst + 7 * ldd, _mm256_permute2f128_ps(u3, u7, 0x31));
}
#define KT_TRANSPOSE8 fwd_transpose8

/* ---- AVX2 + FMA: 8 floats, 6 x 16 tile (12 accumulators of 16 ymm) --------- */
#define KT_ISA avx2
#define KT_ATTR __attribute__((target("avx2,fma")))
#define KT_W 8
#define KT_NV 2
#define KT_MR 6
#define KT_BN 96
#define KT_MAX(a, b) ((VT)__builtin_ia32_maxps256((a), (b)))
#include "cpu/fwd_block_tmpl.h"

/* ---- 16 floats, 8 x 32 tile (16 accumulators of 32 zmm), twice -------------- */
#define KT_ISA avx512
#define KT_ATTR __attribute__((target("avx512f,avx2,fma")))
#define KT_W 16
#define KT_NV 2
#define KT_MR 8
#define KT_BN 64
#define KT_MAX(a, b) ((VT)_mm512_max_ps((a), (b)))
#include "cpu/fwd_block_tmpl.h"
#define KT_ISA avx2w16
#define KT_ATTR __attribute__((target("avx2,fma")))
#define KT_W 16
#define KT_NV 2
#define KT_MR 8
#define KT_BN 64
#include "cpu/fwd_block_tmpl.h"
#endif
