/* e4m3_quant.cuh - the e4m3 quantiser's float arithmetic, bitwise the CPU's
 * (src/cpu/quantize.c, src/common/fp8.c): fattn_quantize's kernels
 * (ops/quantize.cu) and fattn_kv_append's into FP8 caches (ops/kv_append.cu).
 * Every operation is inline PTX without .ftz: the library is built with
 * --use_fast_math, under which nvcc turns even __fdiv_rn / fmaxf into their
 * .ftz forms and flushes the subnormals (bf16 and f32 inputs have them, and
 * so do scales of tiny blocks) that the CPU keeps. */
#pragma once
#include <stdint.h>

#include "common/fp8.h"

/* name(a, b): one PTX instruction, a and b its operands */
#define QUANT_F32_OP2(name, ins)                                                                   \
    __device__ __forceinline__ float name(float a, float b) {                                      \
        float r;                                                                                   \
        asm(ins " %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));                                        \
        return r;                                                                                  \
    }
QUANT_F32_OP2(f32_add, "add.rn.f32")
QUANT_F32_OP2(f32_sub, "sub.rn.f32")
QUANT_F32_OP2(f32_mul, "mul.rn.f32")
QUANT_F32_OP2(f32_div, "div.rn.f32") /* IEEE division, correctly rounded, subnormals kept */
QUANT_F32_OP2(f32_max, "max.f32")
#undef QUANT_F32_OP2
/* a * s + b rounded once; with s = +-1 the product is exact, so this is
 * a + b or b - a rounded once, bitwise the CPU's add or subtract. */
__device__ __forceinline__ float f32_fma(float a, float s, float b) {
    float r;
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(s), "f"(b));
    return r;
}
/* max(m, |x|), NaN x leaving m (fmaxf(m, fabsf(x)) of the CPU). */
__device__ __forceinline__ float f32_amax(float m, float x) {
    float r;
    asm("{\n .reg .f32 t;\n abs.f32 t, %2;\n max.f32 %0, %1, t;\n}" : "=f"(r) : "f"(m), "f"(x));
    return r;
}
/* fattn_f32_to_e4m3 (src/common/fp8.c) in integer arithmetic, for GPUs
 * without the e4m3 cvt (before sm_89: fattn_kv_append's sm_80 code) */
__device__ __forceinline__ uint32_t e4m3_of_bits(float x) {
    const uint32_t u = __float_as_uint(x), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7fu;        /* NaN, sign dropped */
    if (a > 0x43e80000u) return sign | 0x7eu; /* > 464 and inf: 448 */
    if (a >= 0x3c800000u) {                   /* normal: 3 of 23 mantissa bits, to nearest even */
        const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
        return sign | ((r >> 20) - (120u << 3));
    }
    const uint32_t e = a >> 23;
    if (e < 115u) return sign; /* below 2^-12: +-0 */
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u, shift = 141u - e;
    uint32_t q = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return sign | q;
}

/* Two floats to two e4m3 codes, lo in the low byte: cvt puts its first
 * source in the upper byte.  Bitwise fattn_f32_to_e4m3 (src/common/fp8.c). */
__device__ __forceinline__ uint32_t e4m3x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    uint16_t r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return e4m3_of_bits(lo) | e4m3_of_bits(hi) << 8;
#endif
}

/* amax / 448 floored at FLT_MIN, fattn_e4m3_scale of the CPU (an amax of
 * f32 subnormals would give scale 0 and NaN codes for its zeros).  max.f32
 * without .ftz; Inf stays Inf. */
__device__ __forceinline__ float scale_of_nonzero_amax(float amax) {
    return f32_max(f32_div(amax, FATTN_E4M3_MAX), FATTN_E4M3_SCALE_MIN);
}
/* amax by its bits (>= +0: a subnormal amax is not 0, whatever .ftz says);
 * 1 for an all-zero block */
__device__ __forceinline__ float scale_of_amax(uint32_t amax_bits) {
    return amax_bits ? scale_of_nonzero_amax(__uint_as_float(amax_bits)) : 1.0f;
}
