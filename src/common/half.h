/* half.h - scalar f16 / bf16 <-> f32 conversions for host code (C11).
 * Round to nearest even, NaN kept, as the GPU's cvt.rn does. */
#ifndef FATTN_COMMON_HALF_H
#define FATTN_COMMON_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t fattn_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float fattn_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline float fattn_bf16_to_f32(uint16_t h) { return fattn_bits_f32((uint32_t)h << 16); }

static inline uint16_t fattn_f32_to_bf16(float f) {
    uint32_t u = fattn_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float fattn_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return fattn_bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) { /* zero or subnormal: man * 2^-24 */
        float f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    return fattn_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t fattn_f32_to_f16(float f) {
    uint32_t u = fattn_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);       /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);      /* >= 65520 rounds to inf */
    if (a < 0x38800000u) {                                        /* below 2^-14: subnormal */
        /* value / 2^-24, rounded to nearest even by the FPU's default mode */
        float m = fattn_bits_f32(a) * 16777216.0f;
        uint32_t r = (uint32_t)m;
        float frac = m - (float)r;
        if (frac > 0.5f || (frac == 0.5f && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);
    return (uint16_t)(sign | (r >> 13));
}

#endif
