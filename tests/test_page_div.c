/* test_page_div.c - the KV-cache forward's page arithmetic (src/cuda/hopper/
 * fwd/page_div.h; the same functions run on the device): the multiply-high
 * division against n / d for every page size 1..1100 on every key up to
 * 70000, on the keys near 2^31 and on random ones, page sizes up to 2^30;
 * and the TMA box rule (gcd of the key block and the page, when a multiple
 * of the 8-row swizzle atom; else 0: the gather) for the key blocks the
 * kernels use. */
#include <stdint.h>
#include <stdio.h>

#include "common/testutil.h"
#include "cuda/hopper/fwd/page_div.h"

static int check_div(int32_t d, int32_t n, uint32_t mul, int32_t shr) {
    const int32_t q = fattn_page_div(n, mul, shr);
    if (q == n / d) return 1;
    TU_CHECK(0, "page_div: %d / %d gave %d (mul %u, shr %d)", n, d, q, mul, shr);
    return 0;
}

int main(void) {
    long long checked = 0;
    int bad = 0;
    for (int32_t d = 1; d <= 1100 && !bad; ++d) {
        uint32_t mul;
        int32_t shr;
        fattn_page_div_make(d, &mul, &shr);
        for (int32_t n = 0; n <= 70000 && !bad; ++n, ++checked) bad = !check_div(d, n, mul, shr);
        for (int32_t n = INT32_MAX; n > INT32_MAX - 3000 && !bad; --n, ++checked) bad = !check_div(d, n, mul, shr);
    }
    /* large and odd divisors on random keys (xorshift, fixed seed) */
    uint64_t x = 0x9E3779B97F4A7C15ull;
    const int32_t ds[] = {3, 7, 48, 100, 528, 1056, 4097, 65537, 1000003, (1 << 20) + 1, 1 << 30, (1 << 30) + 7};
    for (size_t i = 0; i < sizeof ds / sizeof ds[0] && !bad; ++i) {
        uint32_t mul;
        int32_t shr;
        fattn_page_div_make(ds[i], &mul, &shr);
        for (int k = 0; k < 200000 && !bad; ++k, ++checked) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            bad = !check_div(ds[i], (int32_t)(x & 0x7fffffff), mul, shr);
        }
    }
    /* powers of two: a plain shift */
    for (int s = 0; s < 31; ++s) {
        uint32_t mul;
        int32_t shr;
        fattn_page_div_make(1 << s, &mul, &shr);
        TU_CHECK(mul == 1 && shr == s, "page_div_make(2^%d): mul %u shr %d, not 1 and %d", s, mul, shr, s);
    }
    /* the box rule on the kernels' key blocks */
    const struct {
        int bn, page, box;
    } boxes[] = {{128, 1, 0},    {128, 2, 0},    {128, 4, 0},     {128, 8, 8},    {128, 16, 16}, {128, 24, 8},
                 {128, 48, 16},  {128, 256, 128}, {128, 12, 0},   {176, 16, 16},  {176, 11, 0},  {176, 88, 88},
                 {176, 48, 16},  {80, 48, 16},   {80, 8, 8},      {80, 5, 0},     {112, 16, 16}, {112, 7, 0},
                 {112, 56, 56},  {112, 3, 0},    {80, 4096, 16},  {128, 1000, 8}, {176, 528, 176}};
    for (size_t i = 0; i < sizeof boxes / sizeof boxes[0]; ++i)
        TU_CHECK(fattn_page_box(boxes[i].bn, boxes[i].page) == boxes[i].box, "page_box(%d, %d) = %d, want %d",
                 boxes[i].bn, boxes[i].page, fattn_page_box(boxes[i].bn, boxes[i].page), boxes[i].box);
    printf("  %lld quotients checked\n", checked);
    return tu_finish("page arithmetic");
}
