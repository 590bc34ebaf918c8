/* load.h - moving rows of fattn tensors to and from f32 (CPU engine). */
#ifndef FATTN_CPU_LOAD_H
#define FATTN_CPU_LOAD_H

#include <stdint.h>
#include <string.h>

#include "common/half.h"
#include "fattn.h"

/* Dequantisation table of the 256 e4m3 codes (scale not applied). */
static inline void fattn_e4m3_table(float lut[256]) {
    for (int i = 0; i < 256; i++) lut[i] = fattn_e4m3_to_f32((uint8_t)i);
}

/* Element offset of row `r` (token index inside the batch entry, or packed
 * token index in varlen mode with b = 0), head `h`, batch `b`. */
static inline int64_t fattn_row_offset(const fattn_tensor *t, int64_t b, int64_t r, int64_t h) {
    return b * t->stride_batch + r * t->stride_seq + h * t->stride_head;
}

/* The e4m3 scale of row r of (b, h): scale[(b*heads + h)*nblocks + r/scale_block]
 * where nblocks = ceil(rows / scale_block) and rows is the seqlen (or the total
 * token count in varlen mode).  1 for other dtypes. */
static inline float fattn_row_scale(const fattn_tensor *t, int64_t b, int64_t heads, int64_t h,
                                    int64_t rows, int64_t r) {
    if (t->dtype != FATTN_DTYPE_E4M3 || !t->scale) return 1.0f;
    int64_t sb = t->scale_block >= 1 ? t->scale_block : 1;
    int64_t nblocks = (rows + sb - 1) / sb;
    return t->scale[(b * heads + h) * nblocks + r / sb];
}

/* dst[0..n) = row of n elements at element offset `off` of t, times `mul`
 * (mul is the e4m3 scale times any extra factor; pass 1 for none).  lut is
 * the e4m3 table (may be NULL for other dtypes). */
static inline void fattn_load_row(const fattn_tensor *t, int64_t off, int n, float mul,
                                  const float *lut, float *restrict dst) {
    switch (t->dtype) {
    case FATTN_DTYPE_F32: {
        const float *s = (const float *)t->data + off;
        if (mul == 1.0f) memcpy(dst, s, sizeof(float) * (size_t)n);
        else for (int i = 0; i < n; i++) dst[i] = s[i] * mul;
        break;
    }
    case FATTN_DTYPE_F16: {
        const uint16_t *s = (const uint16_t *)t->data + off;
        for (int i = 0; i < n; i++) dst[i] = fattn_f16_to_f32(s[i]) * mul;
        break;
    }
    case FATTN_DTYPE_BF16: {
        const uint16_t *s = (const uint16_t *)t->data + off;
        for (int i = 0; i < n; i++) dst[i] = fattn_bf16_to_f32(s[i]) * mul;
        break;
    }
    case FATTN_DTYPE_E4M3: {
        const uint8_t *s = (const uint8_t *)t->data + off;
        for (int i = 0; i < n; i++) dst[i] = lut[s[i]] * mul;
        break;
    }
    default:
        memset(dst, 0, sizeof(float) * (size_t)n);
        break;
    }
}

/* Store n f32 values to the row at element offset `off` of t (f32/f16/bf16). */
static inline void fattn_store_row(const fattn_tensor *t, int64_t off, int n,
                                   const float *restrict src) {
    switch (t->dtype) {
    case FATTN_DTYPE_F32:
        memcpy((float *)t->data + off, src, sizeof(float) * (size_t)n);
        break;
    case FATTN_DTYPE_F16: {
        uint16_t *d = (uint16_t *)t->data + off;
        for (int i = 0; i < n; i++) d[i] = fattn_f32_to_f16(src[i]);
        break;
    }
    case FATTN_DTYPE_BF16: {
        uint16_t *d = (uint16_t *)t->data + off;
        for (int i = 0; i < n; i++) d[i] = fattn_f32_to_bf16(src[i]);
        break;
    }
    default:
        break;
    }
}

#endif
