/* page_div.h - the paged KV cache's arithmetic in the variable-length
 * forward's KV-cache instances (FwdVarlen, FwdPaged): a key's page and row
 * for any page size, and how a key block is loaded (TMA boxes or the
 * cp.async gather).  Plain C (host and device), so the CPU tests check it
 * (tests/test_page_div.c) without a GPU. */
#ifndef FATTN_PAGE_DIV_H
#define FATTN_PAGE_DIV_H

#include <stdint.h>

#if defined(__CUDACC__)
#define FATTN_PAGE_HD __host__ __device__
#else
#define FATTN_PAGE_HD
#endif

/* n / d for 0 <= n < 2^31 and 1 <= d < 2^31 as a multiply-high, an add and
 * a shift (Granlund-Montgomery's round-up method, CUTLASS's FastDivmod):
 * shr = ceil(log2 d), mul = floor(2^32 (2^shr - d) / d) + 1.  Powers of two
 * get mul 1, so the quotient is n >> shr; d = 1 gives mul 1, shr 0. */
static inline void fattn_page_div_make(int32_t d, uint32_t *mul, int32_t *shr) {
    int32_t s = 0;
    while (((int64_t)1 << s) < d) ++s;
    *shr = s;
    *mul = (uint32_t)((((uint64_t)1 << 32) * (((uint64_t)1 << s) - (uint64_t)d)) / (uint64_t)d + 1);
}
static inline FATTN_PAGE_HD int32_t fattn_page_div(int32_t n, uint32_t mul, int32_t shr) {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi((uint32_t)n, mul);
#else
    const uint32_t hi = (uint32_t)(((uint64_t)(uint32_t)n * mul) >> 32);
#endif
    return (int32_t)((hi + (uint32_t)n) >> shr); /* < 2^32: hi < n < 2^31 */
}

/* Rows per TMA box of a key block of bn rows on pages of page_size rows:
 * g = gcd(bn, page_size), so that no box crosses a page, if g is a multiple
 * of 8; else 0, the gather path.  Why 8: the tiles use the 128-byte swizzle,
 * whose atom is 8 rows of 128 bytes; TMA swizzles a box from its own first
 * row, so a box must start on an atom (row r of a tile at r * 128 bytes from
 * a 1024-byte aligned slab: r a multiple of 8) or its rows land with the
 * wrong XOR pattern for the wgmma descriptor (silent wrong data). */
static inline int32_t fattn_page_box(int32_t bn, int32_t page_size) {
    int32_t a = bn, b = page_size;
    while (b) {
        const int32_t t = a % b;
        a = b;
        b = t;
    }
    return a % 8 == 0 ? a : 0;
}

#endif
