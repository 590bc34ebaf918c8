/* test_fp8.c - fattn_f32_to_e4m3 / fattn_e4m3_to_f32 against independent
 * references: a closed-form decoder, a brute-force nearest-value encoder and a
 * port of the double-precision algorithm of CUDA's cuda_fp8.hpp (the host
 * fallback of __nv_cvt_float_to_fp8 with __NV_SATFINITE, __NV_E4M3).
 * FATTN_TEST_SEED=<n> reproduces the random cases. */
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/testutil.h"
#include "fattn.h"

static int g_fail = 0;
static long g_checks = 0;

#define CHECK(cond, ...)                                      \
    do {                                                      \
        g_checks++;                                           \
        if (!(cond)) {                                        \
            if (g_fail < 20) {                                \
                printf("  FAIL %s:%d: ", __FILE__, __LINE__); \
                printf(__VA_ARGS__);                          \
                printf("\n");                                 \
            }                                                 \
            g_fail++;                                         \
        }                                                     \
    } while (0)

static uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float float_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static tu_rng g_rng; /* tests/common/testutil, seeded from tu_seed() in main */
static uint64_t rng_next(void) { return tu_rng_u64(&g_rng); }

/* Independent decoder: the OCP formula with ldexp. */
static double ref_decode(uint8_t c) {
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    double v = e == 0 ? ldexp((double)m, -9) : ldexp(8.0 + m, e - 10);
    return s ? -v : v;
}

/* Brute force: nearest of the 127 non-negative finite magnitudes, ties to the
 * even code, saturation above 448 + half an ulp (= 464, exclusive), NaN ->
 * 0x7F, sign of x kept (also on zero). */
static uint8_t ref_encode_brute(float x) {
    if (isnan(x)) return 0x7f;
    uint8_t sign = signbit(x) ? 0x80 : 0;
    double a = fabs((double)x);
    if (a > 464.0) return sign | 0x7e;
    int best = 0;
    double bestd = INFINITY;
    for (int c = 0; c <= 0x7e; c++) {
        double d = fabs(ref_decode((uint8_t)c) - a);
        if (d < bestd || (d == bestd && (c & 1) == 0)) { best = c; bestd = d; }
    }
    return (uint8_t)(sign | best);
}

/* Port of __nv_cvt_double_to_fp8 (E4M3, SATFINITE) of cuda_fp8.hpp, applied
 * to (double)x after NaN canonicalisation, as __nv_cvt_float_to_fp8 does. */
static uint8_t ref_encode_cuda(float xf) {
    uint32_t fb = bits_of(xf);
    if ((fb & 0x7fffffffu) > 0x7f800000u) fb = 0x7fffffffu;
    double x = (double)float_of(fb);
    uint64_t xb;
    memcpy(&xb, &x, 8);
    const uint64_t half_ulp = 1ull << (53 - 4 - 1);
    uint8_t sign = (uint8_t)((xb >> 63) << 7);
    uint8_t exp = (uint8_t)((((unsigned)(xb >> 52)) & 0x7ffu) - 1023u + 7u);
    uint8_t mant = (uint8_t)((xb >> (53 - 4)) & 7u);
    uint64_t ax = xb & 0x7fffffffffffffffull;
    uint8_t res;
    if (ax <= 0x3F50000000000000ull) res = 0;
    else if (ax > 0x7FF0000000000000ull) res = 0x7f;
    else if (ax > 0x407D000000000000ull) res = 0x7e;
    else if (ax >= 0x3F90000000000000ull) {
        res = (uint8_t)((exp << 3) | mant);
        uint64_t round = xb & ((half_ulp << 1) - 1);
        if (round > half_ulp || (round == half_ulp && (mant & 1u))) res++;
    } else {
        uint8_t shift = (uint8_t)(1u - exp);
        mant |= 8u;
        res = (uint8_t)(mant >> shift);
        uint64_t round = (xb | (1ull << 52)) & ((half_ulp << (shift + 1)) - 1);
        if (round > (half_ulp << shift) || (round == (half_ulp << shift) && (res & 1u))) res++;
    }
    return (uint8_t)(res | sign);
}

static void test_decode(void) {
    int bad = 0;
    for (int c = 0; c < 256; c++) {
        float got = fattn_e4m3_to_f32((uint8_t)c);
        double want = ref_decode((uint8_t)c);
        if (isnan(want)) {
            if (!isnan(got)) bad++;
            CHECK(isnan(got), "decode(0x%02x) = %g, want NaN", c, got);
        } else {
            int ok = (double)got == want && !signbit(got) == !signbit(want);
            if (!ok) bad++;
            CHECK(ok, "decode(0x%02x) = %a, want %a", c, got, want);
        }
    }
    printf("decode: all 256 codes vs closed form: %d mismatches (tolerance 0, bitwise)\n", bad);
    CHECK(fattn_e4m3_to_f32(0x7e) == 448.0f, "max finite");
    CHECK(fattn_e4m3_to_f32(0x01) == ldexpf(1.0f, -9), "min subnormal");
    CHECK(fattn_e4m3_to_f32(0x08) == ldexpf(1.0f, -6), "min normal");
}

static void test_roundtrip(void) {
    int bad = 0;
    for (int c = 0; c < 256; c++) {
        float v = fattn_e4m3_to_f32((uint8_t)c);
        uint8_t back = fattn_f32_to_e4m3(v);
        uint8_t want = ((c & 0x7f) == 0x7f) ? 0x7f : (uint8_t)c;
        if (back != want) bad++;
        CHECK(back == want, "encode(decode(0x%02x)) = 0x%02x, want 0x%02x", c, back, want);
    }
    printf("round trip: 254 finite codes and 2 NaN codes: %d mismatches\n", bad);
}

/* For each pair of adjacent representable values, both signs: the midpoint
 * goes to the even code, midpoint -+ 1 ulp(f32) to the nearer code. */
static void test_boundaries(void) {
    int bad = 0, n = 0;
    for (int c = 0; c < 0x7e; c++) {
        float lo = fattn_e4m3_to_f32((uint8_t)c), hi = fattn_e4m3_to_f32((uint8_t)(c + 1));
        float mid = (float)(((double)lo + (double)hi) / 2); /* exact: 5 significant bits */
        uint8_t even = (c & 1) ? (uint8_t)(c + 1) : (uint8_t)c;
        for (int s = 0; s < 2; s++) {
            float sg = s ? -1.0f : 1.0f;
            uint8_t sb = s ? 0x80 : 0;
            float below = nextafterf(mid, 0.0f), above = nextafterf(mid, INFINITY);
            uint8_t g0 = fattn_f32_to_e4m3(sg * mid), g1 = fattn_f32_to_e4m3(sg * below),
                    g2 = fattn_f32_to_e4m3(sg * above);
            int ok = g0 == (sb | even) && g1 == (sb | c) && g2 == (sb | (c + 1));
            n += 3;
            if (!ok) bad++;
            CHECK(ok, "boundary %a..%a sign %d: mid->0x%02x below->0x%02x above->0x%02x", lo, hi, s,
                  g0, g1, g2);
        }
    }
    printf("rounding boundaries: %d cases (midpoint ties to even, +-1 ulp to nearer): %d bad\n", n,
           bad);
}

static void test_saturation_nan_zero(void) {
    struct { float x; uint8_t want; const char *what; } cases[] = {
        {448.0f, 0x7e, "448"}, {449.0f, 0x7e, "449"}, {464.0f, 0x7e, "464 (tie, even = 448)"},
        {465.0f, 0x7e, "465"}, {480.0f, 0x7e, "480"}, {1e6f, 0x7e, "1e6"},
        {FLT_MAX, 0x7e, "FLT_MAX"}, {INFINITY, 0x7e, "+inf"}, {-449.0f, 0xfe, "-449"},
        {-1e6f, 0xfe, "-1e6"}, {-INFINITY, 0xfe, "-inf"}, {0.0f, 0x00, "+0"},
        {-0.0f, 0x80, "-0"}, {1e-30f, 0x00, "1e-30"}, {-1e-30f, 0x80, "-1e-30"},
        {0x1p-10f, 0x00, "2^-10 (tie, even = 0)"}, {-0x1p-10f, 0x80, "-2^-10"},
        {0x1.000002p-10f, 0x01, "2^-10 + ulp"}, {0x1p-9f, 0x01, "2^-9"},
        {0x1.8p-9f, 0x02, "1.5 * 2^-9 (tie, even = 2)"}, {0x1.4p-6f, 0x0a, "1.25 * 2^-6"},
        {0x1.ep-7f, 0x08, "0x1.ep-7 (tie between 0x07 and 0x08, even = 0x08)"},
        {FLT_TRUE_MIN, 0x00, "f32 denormal"}, {-FLT_TRUE_MIN, 0x80, "-f32 denormal"},
        {NAN, 0x7f, "NaN"}, {-NAN, 0x7f, "-NaN"},
        {float_of(0x7f800001u), 0x7f, "sNaN"}, {float_of(0xffc00001u), 0x7f, "-qNaN payload"},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t got = fattn_f32_to_e4m3(cases[i].x);
        if (got != cases[i].want) bad++;
        CHECK(got == cases[i].want, "%s: got 0x%02x want 0x%02x", cases[i].what, got, cases[i].want);
    }
    printf("saturation / NaN / zero / subnormal cases: %zu, %d bad\n",
           sizeof cases / sizeof cases[0], bad);
}

static float random_float(void) {
    uint64_t r = rng_next();
    switch (r & 3) {
    case 0: return float_of((uint32_t)(r >> 32)); /* any bit pattern */
    case 1: { /* magnitudes around the e4m3 range, 2^-12 .. 2^10 */
        double e = -12.0 + 22.0 * (double)(r >> 40) / (double)(1ull << 24);
        return (float)(((r >> 2) & 1) ? -1 : 1) * (float)exp2(e);
    }
    case 2: { /* near a representable value: exact, or a few ulps off */
        uint8_t c = (uint8_t)(r >> 8);
        float v = fattn_e4m3_to_f32(c);
        if (isnan(v)) v = 448.0f;
        int32_t k = (int32_t)((r >> 16) & 7) - 3;
        return float_of(bits_of(v) + (uint32_t)k);
    }
    default: { /* near a midpoint */
        uint8_t c = (uint8_t)((r >> 8) % 0x7e);
        double mid = (ref_decode(c) + ref_decode((uint8_t)(c + 1))) / 2;
        int32_t k = (int32_t)((r >> 16) & 3) - 1;
        float m = float_of(bits_of((float)mid) + (uint32_t)k);
        return ((r >> 20) & 1) ? -m : m;
    }
    }
}

static void test_random_vs_references(void) {
    const int n = 300000;
    int bad_b = 0, bad_c = 0;
    for (int i = 0; i < n; i++) {
        float x = random_float();
        uint8_t got = fattn_f32_to_e4m3(x);
        uint8_t b = ref_encode_brute(x), c = ref_encode_cuda(x);
        if (got != b) bad_b++;
        if (got != c) bad_c++;
        CHECK(got == b && got == c, "x = %a (0x%08x): got 0x%02x brute 0x%02x cuda-port 0x%02x", x,
              bits_of(x), got, b, c);
    }
    printf("random inputs: %d vs brute-force nearest: %d bad; vs cuda_fp8.hpp port: %d bad\n", n,
           bad_b, bad_c);
}

/* Every 997th f32 bit pattern (4.3 M inputs) against the cuda_fp8.hpp port. */
static void test_sweep_vs_cuda_port(void) {
    int bad = 0;
    long n = 0;
    for (uint64_t u = rng_next() % 997; u <= 0xffffffffull; u += 997, n++) {
        float x = float_of((uint32_t)u);
        uint8_t got = fattn_f32_to_e4m3(x), want = ref_encode_cuda(x);
        if (got != want) {
            bad++;
            CHECK(0, "x = %a (0x%08x): got 0x%02x cuda-port 0x%02x", x, (uint32_t)u, got, want);
        }
    }
    printf("bit-pattern sweep (stride 997): %ld inputs vs cuda_fp8.hpp port: %d bad\n", n, bad);
}

int main(void) {
    tu_rng_init(&g_rng, (uint64_t)tu_seed()); /* prints the seed; FATTN_TEST_SEED reproduces */

    test_decode();
    test_roundtrip();
    test_boundaries();
    test_saturation_nan_zero();
    test_random_vs_references();
    test_sweep_vs_cuda_port();

    printf("test_fp8: %ld checks, %d failed -> %s\n", g_checks, g_fail, g_fail ? "FAIL" : "PASS");
    return g_fail ? 1 : 0;
}
