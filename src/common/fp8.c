/* fp8.c - float32 <-> float8 e4m3fn (OCP) conversions on the host.
 *
 * e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities;
 * S.1111.111 (0x7F, 0xFF) is NaN; largest finite 448 (0x7E); smallest
 * subnormal 2^-9 (0x01).
 *
 * Encoding matches the device's cvt.rn.satfinite.e4m3x2.f32, i.e. the host
 * fallback of __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) in the CUDA
 * toolkit's cuda_fp8.hpp, bit for bit:
 *   - round to nearest, ties to even;
 *   - |x| > 464 (448 + half an ulp), including +-inf, saturates to +-448 (0x7E
 *     | sign); exactly 464 is a tie and rounds to the even code 448;
 *   - |x| <= 2^-10 (half the smallest subnormal) becomes a zero that keeps the
 *     sign of x (so -0.0f and tiny negatives give 0x80);
 *   - any NaN, whatever its sign or payload, gives 0x7F (cuda_fp8.hpp first
 *     replaces NaN by the canonical 0x7FFFFFFF, so the sign is dropped).
 * Decoding is exact; both NaN codes decode to a positive quiet NaN (the CUDA
 * host fallback also discards the sign of an e4m3 NaN).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fattn.h"
#include "common/fp8.h"

#define FATTN_E4M3_NAN NAN

/* code -> value for all 256 codes (exact: each has at most 4 significant
 * bits). */
const float fattn_e4m3_values[256] = {
    0.0f, 0x1p-9f, 0x1p-8f, 0x1.8p-8f, 0x1p-7f, 0x1.4p-7f, 0x1.8p-7f, 0x1.cp-7f,
    0x1p-6f, 0x1.2p-6f, 0x1.4p-6f, 0x1.6p-6f, 0x1.8p-6f, 0x1.ap-6f, 0x1.cp-6f, 0x1.ep-6f,
    0x1p-5f, 0x1.2p-5f, 0x1.4p-5f, 0x1.6p-5f, 0x1.8p-5f, 0x1.ap-5f, 0x1.cp-5f, 0x1.ep-5f,
    0x1p-4f, 0x1.2p-4f, 0x1.4p-4f, 0x1.6p-4f, 0x1.8p-4f, 0x1.ap-4f, 0x1.cp-4f, 0x1.ep-4f,
    0x1p-3f, 0x1.2p-3f, 0x1.4p-3f, 0x1.6p-3f, 0x1.8p-3f, 0x1.ap-3f, 0x1.cp-3f, 0x1.ep-3f,
    0x1p-2f, 0x1.2p-2f, 0x1.4p-2f, 0x1.6p-2f, 0x1.8p-2f, 0x1.ap-2f, 0x1.cp-2f, 0x1.ep-2f,
    0x1p-1f, 0x1.2p-1f, 0x1.4p-1f, 0x1.6p-1f, 0x1.8p-1f, 0x1.ap-1f, 0x1.cp-1f, 0x1.ep-1f,
    0x1p+0f, 0x1.2p+0f, 0x1.4p+0f, 0x1.6p+0f, 0x1.8p+0f, 0x1.ap+0f, 0x1.cp+0f, 0x1.ep+0f,
    0x1p+1f, 0x1.2p+1f, 0x1.4p+1f, 0x1.6p+1f, 0x1.8p+1f, 0x1.ap+1f, 0x1.cp+1f, 0x1.ep+1f,
    0x1p+2f, 0x1.2p+2f, 0x1.4p+2f, 0x1.6p+2f, 0x1.8p+2f, 0x1.ap+2f, 0x1.cp+2f, 0x1.ep+2f,
    0x1p+3f, 0x1.2p+3f, 0x1.4p+3f, 0x1.6p+3f, 0x1.8p+3f, 0x1.ap+3f, 0x1.cp+3f, 0x1.ep+3f,
    0x1p+4f, 0x1.2p+4f, 0x1.4p+4f, 0x1.6p+4f, 0x1.8p+4f, 0x1.ap+4f, 0x1.cp+4f, 0x1.ep+4f,
    0x1p+5f, 0x1.2p+5f, 0x1.4p+5f, 0x1.6p+5f, 0x1.8p+5f, 0x1.ap+5f, 0x1.cp+5f, 0x1.ep+5f,
    0x1p+6f, 0x1.2p+6f, 0x1.4p+6f, 0x1.6p+6f, 0x1.8p+6f, 0x1.ap+6f, 0x1.cp+6f, 0x1.ep+6f,
    0x1p+7f, 0x1.2p+7f, 0x1.4p+7f, 0x1.6p+7f, 0x1.8p+7f, 0x1.ap+7f, 0x1.cp+7f, 0x1.ep+7f,
    0x1p+8f, 0x1.2p+8f, 0x1.4p+8f, 0x1.6p+8f, 0x1.8p+8f, 0x1.ap+8f, 0x1.cp+8f, FATTN_E4M3_NAN,
    -0.0f, -0x1p-9f, -0x1p-8f, -0x1.8p-8f, -0x1p-7f, -0x1.4p-7f, -0x1.8p-7f, -0x1.cp-7f,
    -0x1p-6f, -0x1.2p-6f, -0x1.4p-6f, -0x1.6p-6f, -0x1.8p-6f, -0x1.ap-6f, -0x1.cp-6f, -0x1.ep-6f,
    -0x1p-5f, -0x1.2p-5f, -0x1.4p-5f, -0x1.6p-5f, -0x1.8p-5f, -0x1.ap-5f, -0x1.cp-5f, -0x1.ep-5f,
    -0x1p-4f, -0x1.2p-4f, -0x1.4p-4f, -0x1.6p-4f, -0x1.8p-4f, -0x1.ap-4f, -0x1.cp-4f, -0x1.ep-4f,
    -0x1p-3f, -0x1.2p-3f, -0x1.4p-3f, -0x1.6p-3f, -0x1.8p-3f, -0x1.ap-3f, -0x1.cp-3f, -0x1.ep-3f,
    -0x1p-2f, -0x1.2p-2f, -0x1.4p-2f, -0x1.6p-2f, -0x1.8p-2f, -0x1.ap-2f, -0x1.cp-2f, -0x1.ep-2f,
    -0x1p-1f, -0x1.2p-1f, -0x1.4p-1f, -0x1.6p-1f, -0x1.8p-1f, -0x1.ap-1f, -0x1.cp-1f, -0x1.ep-1f,
    -0x1p+0f, -0x1.2p+0f, -0x1.4p+0f, -0x1.6p+0f, -0x1.8p+0f, -0x1.ap+0f, -0x1.cp+0f, -0x1.ep+0f,
    -0x1p+1f, -0x1.2p+1f, -0x1.4p+1f, -0x1.6p+1f, -0x1.8p+1f, -0x1.ap+1f, -0x1.cp+1f, -0x1.ep+1f,
    -0x1p+2f, -0x1.2p+2f, -0x1.4p+2f, -0x1.6p+2f, -0x1.8p+2f, -0x1.ap+2f, -0x1.cp+2f, -0x1.ep+2f,
    -0x1p+3f, -0x1.2p+3f, -0x1.4p+3f, -0x1.6p+3f, -0x1.8p+3f, -0x1.ap+3f, -0x1.cp+3f, -0x1.ep+3f,
    -0x1p+4f, -0x1.2p+4f, -0x1.4p+4f, -0x1.6p+4f, -0x1.8p+4f, -0x1.ap+4f, -0x1.cp+4f, -0x1.ep+4f,
    -0x1p+5f, -0x1.2p+5f, -0x1.4p+5f, -0x1.6p+5f, -0x1.8p+5f, -0x1.ap+5f, -0x1.cp+5f, -0x1.ep+5f,
    -0x1p+6f, -0x1.2p+6f, -0x1.4p+6f, -0x1.6p+6f, -0x1.8p+6f, -0x1.ap+6f, -0x1.cp+6f, -0x1.ep+6f,
    -0x1p+7f, -0x1.2p+7f, -0x1.4p+7f, -0x1.6p+7f, -0x1.8p+7f, -0x1.ap+7f, -0x1.cp+7f, -0x1.ep+7f,
    -0x1p+8f, -0x1.2p+8f, -0x1.4p+8f, -0x1.6p+8f, -0x1.8p+8f, -0x1.ap+8f, -0x1.cp+8f, FATTN_E4M3_NAN,
};

float fattn_e4m3_to_f32(uint8_t code) { return fattn_e4m3_values[code]; }

uint8_t fattn_f32_to_e4m3(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    const uint32_t a = u & 0x7fffffffu;

    if (a > 0x7f800000u) return 0x7f;               /* NaN, sign dropped */
    if (a > 0x43e80000u) return (uint8_t)(sign | 0x7e); /* > 464 and inf: 448 */
    if (a >= 0x3c800000u) {
        /* Normal range [2^-6, 464]: keep 3 of the 23 mantissa bits, rounding
         * the 20 dropped bits to nearest even.  A carry out of the mantissa
         * correctly bumps the exponent; 464 itself is a tie that stays on
         * 448 (mantissa 110 is even), so the result never reaches 0x7F. */
        uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
        return (uint8_t)(sign | ((r >> 20) - (120u << 3)));
    }
    /* Subnormal range: the result is round(|x| / 2^-9) in 0..8 (8 is the
     * smallest normal 0x08, reached by rounding up).  |x| = mant * 2^(e-150)
     * with the implicit bit for e >= 1, so |x| / 2^-9 = mant >> (141 - e). */
    uint32_t e = a >> 23;
    if (e < 115u) return sign; /* |x| < 2^-12, far below the 2^-10 tie: +-0 */
    uint32_t mant = (a & 0x7fffffu) | 0x800000u; /* e >= 115 is never f32-subnormal */
    uint32_t shift = 141u - e;                    /* 21 .. 26 */
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint8_t)(sign | q);
}
