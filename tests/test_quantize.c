/* test_quantize.c - fattn_quantize on a CPU context: block and per-tensor
 * scales (exactly amax / 448), dequantisation error within half an e4m3 ulp,
 * bit-exact codes (fattn_f32_to_e4m3(x / scale)), rotation = manual rotation
 * then quantisation, tail blocks, f16/bf16 inputs, strided input, all-zero
 * blocks, thread-count independence, blocks of f32 subnormals (issue 43
 * item 1: the scale's floor FLT_MIN, never a 0 scale that codes every 0 as
 * NaN) and fattn_fwd_fp8 over them.  FATTN_TEST_SEED=<n> reproduces. */
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/testutil.h"
#include "fattn.h"
#include "common/fp8.h"
#include "common/half.h"

static int g_fail = 0;

static tu_rng g_rng; /* tests/common/testutil, seeded from tu_seed() in main */
static uint64_t rng_next(void) { return tu_rng_u64(&g_rng); }
static double rng_uniform(void) { return tu_rng_uniform(&g_rng); }
static double rng_normal(void) { return tu_rng_normal(&g_rng); }
static float rng_outlier(void) { /* N(0,1) + Bernoulli(0.01) N(0, 10^2) */
    double x = rng_normal();
    if (rng_uniform() < 0.01) x += 10.0 * rng_normal();
    return (float)x;
}

static void report(const char *what, double measured, double tol) {
    int ok = measured <= tol;
    printf("  %-62s %.3e (tolerance %.1e) %s\n", what, measured, tol, ok ? "ok" : "FAIL");
    if (!ok) g_fail++;
}
static void report_count(const char *what, long bad) {
    printf("  %-62s %ld mismatches %s\n", what, bad, bad ? "FAIL" : "ok");
    if (bad) g_fail++;
}

typedef struct shape {
    int32_t batch, seqlen, heads, d;
} shape;

/* Element (b, s, h, i) of an f32 master copy stored packed BSHD. */
static size_t bshd(const shape *sh, int b, int s, int h, int i) {
    return (((size_t)b * sh->seqlen + s) * sh->heads + h) * sh->d + i;
}

static int64_t nblocks_of(const shape *sh, int32_t br) { return (sh->seqlen + br - 1) / br; }

/* Runs fattn_quantize on packed BSHD data of `dtype` (converted from x). */
static fattn_status quantize(fattn_ctx *ctx, const shape *sh, const float *x, fattn_dtype dtype,
                             fattn_quant_granularity g, int32_t br, int rotate, uint64_t seed,
                             uint8_t *codes, float *scales) {
    size_t n = (size_t)sh->batch * sh->seqlen * sh->heads * sh->d;
    void *in = (void *)(uintptr_t)x; /* fattn_tensor.data is not const */
    uint16_t *h16 = NULL;
    if (dtype != FATTN_DTYPE_F32) {
        h16 = malloc(n * 2);
        for (size_t i = 0; i < n; i++)
            h16[i] = dtype == FATTN_DTYPE_F16 ? fattn_f32_to_f16(x[i]) : fattn_f32_to_bf16(x[i]);
        in = h16;
    }
    fattn_quantize_args a;
    memset(&a, 0, sizeof a);
    a.in = fattn_tensor_bshd(in, dtype);
    a.out = fattn_tensor_bshd(codes, FATTN_DTYPE_E4M3);
    a.out.scale = scales;
    a.batch = sh->batch; a.seqlen = sh->seqlen; a.heads = sh->heads; a.head_dim = sh->d;
    a.granularity = g;
    a.block_rows = br;
    a.rotate = rotate;
    a.seed = seed;
    fattn_status st = fattn_quantize(ctx, &a);
    free(h16);
    return st;
}

/* Checks codes/scales against the definition, for values xv (already rounded
 * to the input dtype and rotated where applicable). */
static void check_against_definition(const shape *sh, const float *xv, fattn_quant_granularity g,
                                     int32_t br, const uint8_t *codes, const float *scales,
                                     const char *label) {
    int64_t nb = nblocks_of(sh, br);
    long bad_scale = 0, bad_code = 0;
    double worst_rel = 0; /* error / allowed */
    float tensor_amax = 0;
    for (size_t i = 0; i < (size_t)sh->batch * sh->seqlen * sh->heads * sh->d; i++)
        tensor_amax = fmaxf(tensor_amax, fabsf(xv[i]));
    for (int b = 0; b < sh->batch; b++)
        for (int h = 0; h < sh->heads; h++)
            for (int64_t blk = 0; blk < nb; blk++) {
                int r0 = (int)(blk * br), r1 = r0 + br < sh->seqlen ? r0 + br : sh->seqlen;
                float amax = 0;
                for (int s = r0; s < r1; s++)
                    for (int i = 0; i < sh->d; i++)
                        amax = fmaxf(amax, fabsf(xv[bshd(sh, b, s, h, i)]));
                if (g == FATTN_QUANT_TENSOR) amax = tensor_amax;
                float want = amax > 0 ? fmaxf(amax / 448.0f, FLT_MIN) : 1.0f;
                float got = scales[((size_t)b * sh->heads + h) * nb + blk];
                if (got != want) bad_scale++;
                for (int s = r0; s < r1; s++)
                    for (int i = 0; i < sh->d; i++) {
                        size_t k = bshd(sh, b, s, h, i);
                        if (codes[k] != fattn_f32_to_e4m3(xv[k] / got)) bad_code++;
                        /* the float quotient is what the quantiser rounds; the
                         * double quotient can sit past a rounding tie by one
                         * float ulp and overstate the error */
                        double y = (double)(xv[k] / got);
                        double deq = fattn_e4m3_to_f32(codes[k]);
                        /* half an ulp: 2^-4 relative for normals (|y| >= 2^-6),
                         * half the subnormal step 2^-9 below */
                        double allowed = fabs(y) >= 0x1p-6 ? fabs(y) * 0x1p-4 : 0x1p-10;
                        worst_rel = fmax(worst_rel, fabs(deq - y) / allowed);
                    }
            }
    char what[160];
    snprintf(what, sizeof what, "%s: scales == amax/448 (bitwise)", label);
    report_count(what, bad_scale);
    snprintf(what, sizeof what, "%s: codes == f32_to_e4m3(x/scale)", label);
    report_count(what, bad_code);
    snprintf(what, sizeof what, "%s: max |deq - x/scale| / half-ulp", label);
    report(what, worst_rel, 1.0);
}

static void case_plain(fattn_ctx *ctx, fattn_dtype dtype, fattn_quant_granularity g, int32_t br) {
    shape sh = {2, 300, 3, 64}; /* 300 = 2 * 128 + a 44-row tail */
    size_t n = (size_t)sh.batch * sh.seqlen * sh.heads * sh.d;
    int64_t nb = nblocks_of(&sh, br);
    float *x = malloc(n * 4), *xv = malloc(n * 4);
    float *scales = malloc(sizeof(float) * sh.batch * sh.heads * nb);
    uint8_t *codes = malloc(n);
    for (size_t i = 0; i < n; i++) {
        x[i] = rng_outlier();
        xv[i] = dtype == FATTN_DTYPE_F32   ? x[i]
                : dtype == FATTN_DTYPE_F16 ? fattn_f16_to_f32(fattn_f32_to_f16(x[i]))
                                           : fattn_bf16_to_f32(fattn_f32_to_bf16(x[i]));
    }
    /* one all-zero block: (b 1, h 2, block 1) */
    for (int s = br; s < 2 * br && s < sh.seqlen; s++)
        for (int i = 0; i < sh.d; i++) x[bshd(&sh, 1, s, 2, i)] = xv[bshd(&sh, 1, s, 2, i)] = 0.0f;
    char label[96];
    snprintf(label, sizeof label, "%s %s rows %d", fattn_dtype_name(dtype),
             g == FATTN_QUANT_TENSOR ? "tensor" : "block", (int)br);
    printf("%s, shape [%d, %d, %d, %d], %lld blocks per head\n", label, sh.batch, sh.seqlen,
           sh.heads, sh.d, (long long)nb);
    fattn_status st = quantize(ctx, &sh, x, dtype, g, br, 0, 0, codes, scales);
    if (st != FATTN_OK) {
        printf("  fattn_quantize failed: %s (%s) FAIL\n", fattn_status_string(st), fattn_last_error(ctx));
        g_fail++;
    } else {
        check_against_definition(&sh, xv, g, br, codes, scales, label);
        if (g == FATTN_QUANT_BLOCK && br < sh.seqlen) {
            float z = scales[((size_t)1 * sh.heads + 2) * nb + 1];
            long bad = z != 1.0f;
            for (int s = br; s < 2 * br && s < sh.seqlen; s++)
                for (int i = 0; i < sh.d; i++) bad += codes[bshd(&sh, 1, s, 2, i)] != 0;
            report_count("all-zero block: scale 1 and codes 0", bad);
        }
        if (g == FATTN_QUANT_TENSOR) {
            long bad = 0;
            for (int64_t i = 1; i < sh.batch * sh.heads * nb; i++) bad += scales[i] != scales[0];
            report_count("per-tensor scale replicated in every entry", bad);
        }
    }
    free(x); free(xv); free(scales); free(codes);
}

/* rotate: equals fattn_rotate_row then quantisation (bitwise), and the
 * dequantised-and-unrotated rows are close to x in double precision. */
static void case_rotate(fattn_ctx *ctx, fattn_quant_granularity g, int32_t d) {
    shape sh = {1, 200, 2, d};
    const int32_t br = 64;
    size_t n = (size_t)sh.batch * sh.seqlen * sh.heads * sh.d;
    int64_t nb = nblocks_of(&sh, br);
    float *x = malloc(n * 4), *xr = malloc(n * 4), *signs = malloc(sizeof(float) * d);
    float *scales = malloc(sizeof(float) * sh.heads * nb);
    uint8_t *codes = malloc(n);
    uint64_t seed = rng_next();
    for (size_t i = 0; i < n; i++) xr[i] = x[i] = rng_outlier();
    fattn_rotation_signs(seed, d, signs);
    for (size_t r = 0; r < n / d; r++) fattn_rotate_row(xr + r * d, signs, d);
    char label[96];
    snprintf(label, sizeof label, "rotate d %d %s", (int)d, g == FATTN_QUANT_TENSOR ? "tensor" : "block");
    printf("%s, shape [%d, %d, %d, %d], seed %" PRIu64 "\n", label, sh.batch, sh.seqlen, sh.heads,
           sh.d, seed);
    fattn_status st = quantize(ctx, &sh, x, FATTN_DTYPE_F32, g, br, 1, seed, codes, scales);
    if (st != FATTN_OK) {
        printf("  fattn_quantize failed: %s FAIL\n", fattn_status_string(st));
        g_fail++;
    } else {
        check_against_definition(&sh, xr, g, br, codes, scales, label);
        /* dequantise, unrotate in double with the closed-form matrix, compare
         * with x: error bounded by the quantisation error's norm per row */
        double worst = 0;
        for (size_t r = 0; r < n / d; r++) {
            int64_t s = (int64_t)((r / sh.heads) % sh.seqlen), h = (int64_t)(r % sh.heads);
            float sc = scales[h * nb + s / br];
            double errn = 0, qn = 0;
            for (int j = 0; j < d; j++) {
                double v = 0;
                for (int k = 0; k < d; k++) {
                    double m = signs[j] * ((__builtin_popcount((unsigned)(j & k)) & 1) ? -1.0 : 1.0);
                    v += (double)fattn_e4m3_to_f32(codes[r * d + k]) * sc * m; /* y M^T */
                }
                v /= sqrt((double)d);
                errn += (v - x[r * d + j]) * (v - x[r * d + j]);
                double qe = (double)fattn_e4m3_to_f32(codes[r * d + j]) * sc - xr[r * d + j];
                qn += qe * qe;
            }
            /* orthogonal: ||deq M^T - x|| == ||deq - x M|| up to f32 rotation error */
            worst = fmax(worst, fabs(sqrt(errn) - sqrt(qn)) / (sqrt(qn) + 1e-30 + 1e-6));
        }
        report("| ||unrotate(deq) - x|| - ||deq - rotate(x)|| | / ||deq - rotate(x)||", worst, 1e-2);
    }
    free(x); free(xr); free(signs); free(scales); free(codes);
}

/* Strided BHSD input with padded rows gives the same codes and scales as the
 * packed copy; 1 thread and 4 threads agree. */
static void case_strided_threads(fattn_ctx *ctx) {
    shape sh = {2, 150, 3, 128};
    const int32_t br = 64, pad = 8;
    size_t n = (size_t)sh.batch * sh.seqlen * sh.heads * sh.d;
    int64_t nb = nblocks_of(&sh, br);
    size_t nstr = (size_t)sh.batch * sh.heads * sh.seqlen * (sh.d + pad);
    float *x = malloc(n * 4), *xs = malloc(nstr * 4);
    uint8_t *c0 = malloc(n), *c1 = malloc(n), *c2 = malloc(n);
    size_t nsc = (size_t)sh.batch * sh.heads * nb;
    float *s0 = malloc(nsc * 4), *s1 = malloc(nsc * 4), *s2 = malloc(nsc * 4);
    for (size_t i = 0; i < nstr; i++) xs[i] = NAN; /* padding must never be read */
    for (int b = 0; b < sh.batch; b++)
        for (int s = 0; s < sh.seqlen; s++)
            for (int h = 0; h < sh.heads; h++)
                for (int i = 0; i < sh.d; i++) {
                    float v = rng_outlier();
                    x[bshd(&sh, b, s, h, i)] = v;
                    xs[(((size_t)b * sh.heads + h) * sh.seqlen + s) * (sh.d + pad) + i] = v;
                }
    printf("strided BHSD input (row stride d + %d), rotate, block rows %d; threads 1 vs 4\n", pad, (int)br);
    uint64_t seed = rng_next();
    fattn_ctx_set_threads(ctx, 1);
    fattn_status st0 = quantize(ctx, &sh, x, FATTN_DTYPE_F32, FATTN_QUANT_BLOCK, br, 1, seed, c0, s0);
    fattn_ctx_set_threads(ctx, 4);
    fattn_status st1 = quantize(ctx, &sh, x, FATTN_DTYPE_F32, FATTN_QUANT_BLOCK, br, 1, seed, c1, s1);
    fattn_quantize_args a;
    memset(&a, 0, sizeof a);
    a.in = fattn_tensor_bshd(xs, FATTN_DTYPE_F32);
    a.in.stride_batch = (int64_t)sh.heads * sh.seqlen * (sh.d + pad);
    a.in.stride_head = (int64_t)sh.seqlen * (sh.d + pad);
    a.in.stride_seq = sh.d + pad;
    a.out = fattn_tensor_bshd(c2, FATTN_DTYPE_E4M3);
    a.out.scale = s2;
    a.batch = sh.batch; a.seqlen = sh.seqlen; a.heads = sh.heads; a.head_dim = sh.d;
    a.granularity = FATTN_QUANT_BLOCK; a.block_rows = br; a.rotate = 1; a.seed = seed;
    fattn_status st2 = fattn_quantize(ctx, &a);
    if (st0 || st1 || st2) {
        printf("  fattn_quantize failed (%d %d %d): %s FAIL\n", st0, st1, st2, fattn_last_error(ctx));
        g_fail++;
    } else {
        report_count("threads 4 vs 1: codes and scales",
                     (long)(memcmp(c0, c1, n) != 0) + (memcmp(s0, s1, nsc * 4) != 0));
        report_count("strided BHSD vs packed BSHD: codes and scales",
                     (long)(memcmp(c0, c2, n) != 0) + (memcmp(s0, s2, nsc * 4) != 0));
    }
    fattn_ctx_set_threads(ctx, 0);
    free(x); free(xs); free(c0); free(c1); free(c2); free(s0); free(s1); free(s2);
}

/* Blocks whose amax is an f32 subnormal or just above (amax / 448 would round
 * to 0 below ~3.1e-43, and be a subnormal up to 448 FLT_MIN): the scale is
 * max(amax / 448, FLT_MIN), so no finite entry codes NaN, and
 * fattn_fwd_fp8 with such a V (or K, Q) returns finite rows (issue 43 item 1:
 * before the floor, v of zeros and 1e-44 gave 1152 of 1152 outputs NaN). */
static void case_subnormal(fattn_ctx *ctx) {
    static const float amaxes[] = {0x1p-149f, 1e-44f, 3e-43f, 1e-40f, 0x1p-127f, 1e-37f, 5e-36f, 1e-35f};
    const int nam = (int)(sizeof amaxes / sizeof amaxes[0]);
    shape sh = {1, 16 * nam, 2, 64};
    const int32_t br = 16;
    size_t n = (size_t)sh.batch * sh.seqlen * sh.heads * sh.d;
    int64_t nb = nblocks_of(&sh, br);
    float *x = malloc(n * 4), *scales = malloc(sizeof(float) * sh.heads * nb);
    uint8_t *codes = malloc(n);
    for (int s = 0; s < sh.seqlen; s++)
        for (int h = 0; h < sh.heads; h++)
            for (int i = 0; i < sh.d; i++) {
                /* block s / 16 holds zeros (half), +-amax and amax times (0, 1) */
                const float am = amaxes[s / br];
                const uint64_t r = rng_next();
                float v = (r & 1) ? 0.0f : (r & 2) ? am : am * (float)rng_uniform();
                x[bshd(&sh, 0, s, h, i)] = (r & 4) ? -v : v;
            }
    printf("subnormal amax blocks (%d amaxes from 2^-149 to 1e-35), f32, block rows %d\n", nam, (int)br);
    for (int g = 0; g < 2; g++) {
        fattn_status st = quantize(ctx, &sh, x, FATTN_DTYPE_F32, g ? FATTN_QUANT_TENSOR : FATTN_QUANT_BLOCK, br,
                                   0, 0, codes, scales);
        if (st != FATTN_OK) {
            printf("  fattn_quantize failed: %s FAIL\n", fattn_last_error(ctx));
            g_fail++;
            continue;
        }
        long nan_codes = 0;
        for (size_t i = 0; i < n; i++) nan_codes += (codes[i] & 0x7F) == 0x7F;
        report_count(g ? "per tensor: no NaN code from finite input" : "block: no NaN code from finite input",
                     nan_codes);
        check_against_definition(&sh, x, g ? FATTN_QUANT_TENSOR : FATTN_QUANT_BLOCK, br, codes, scales,
                                 g ? "subnormal, tensor" : "subnormal, block");
    }
    /* fattn_fwd_fp8: v (and then q, k) of these values; every output finite */
    const int sk = sh.seqlen, sq = 24, d = sh.d;
    float *q = malloc(sizeof(float) * sq * d), *k = malloc(sizeof(float) * sk * d);
    float *v = malloc(sizeof(float) * sk * d), *o = malloc(sizeof(float) * sq * d);
    for (int i = 0; i < sq * d; i++) q[i] = (float)rng_normal();
    for (int i = 0; i < sk * d; i++) {
        k[i] = (float)rng_normal();
        v[i] = x[bshd(&sh, 0, i / d, 0, i % d)]; /* head 0 of the blocks above */
    }
    for (int which = 0; which < 3; which++) {
        float *src = which == 0 ? v : which == 1 ? k : q;
        float *saved = NULL;
        if (which > 0) { /* q or k tiny too (v stays tiny) */
            const int cnt = which == 1 ? sk * d : sq * d;
            saved = malloc(sizeof(float) * cnt);
            memcpy(saved, src, sizeof(float) * cnt);
            for (int i = 0; i < cnt; i++) src[i] = x[(size_t)i % n];
        }
        fattn_fwd_args a;
        memset(&a, 0, sizeof a);
        a.p.batch = 1; a.p.seqlen_q = sq; a.p.seqlen_k = sk; a.p.heads_q = 1; a.p.heads_kv = 1;
        a.p.head_dim = d;
        a.q = fattn_tensor_bshd(q, FATTN_DTYPE_F32);
        a.k = fattn_tensor_bshd(k, FATTN_DTYPE_F32);
        a.v = fattn_tensor_bshd(v, FATTN_DTYPE_F32);
        a.o = fattn_tensor_bshd(o, FATTN_DTYPE_F32);
        fattn_fp8_options opt;
        memset(&opt, 0, sizeof opt);
        opt.block_rows_q = opt.block_rows_k = opt.block_rows_v = br;
        fattn_status st = fattn_fwd_fp8(ctx, &a, &opt);
        long bad = st != FATTN_OK;
        double worst = 0;
        for (int i = 0; st == FATTN_OK && i < sq * d; i++) {
            bad += !isfinite(o[i]);
            worst = fmax(worst, fabs(o[i]));
        }
        char what[120];
        snprintf(what, sizeof what, "fattn_fwd_fp8, %s tiny: every output finite",
                 which == 0 ? "v" : which == 1 ? "k and v" : "q and v");
        report_count(what, bad);
        /* |o| <= max |v| = 1e-35 (a convex combination of dequantised rows) */
        snprintf(what, sizeof what, "fattn_fwd_fp8, %s tiny: max |o| / 1e-35", which == 0 ? "v" : which == 1 ? "k and v" : "q and v");
        report(what, worst / 1e-35, 1.0);
        if (saved) {
            memcpy(src, saved, sizeof(float) * (which == 1 ? sk * d : sq * d));
            free(saved);
        }
    }
    free(q); free(k); free(v); free(o);
    free(x); free(scales); free(codes);
}

static void case_unsupported(fattn_ctx *ctx) {
    shape sh = {1, 4, 1, 96};
    float x[4 * 96] = {0}, scales[1];
    uint8_t codes[4 * 96];
    fattn_status st = quantize(ctx, &sh, x, FATTN_DTYPE_F32, FATTN_QUANT_BLOCK, 4, 1, 1, codes, scales);
    printf("rotate with head_dim 96 -> %s (%s)\n", fattn_status_string(st), fattn_last_error(ctx));
    report_count("rotate with non-power-of-two head_dim is UNSUPPORTED", st != FATTN_ERROR_UNSUPPORTED);
}

int main(void) {
    tu_rng_init(&g_rng, (uint64_t)tu_seed()); /* prints the seed; FATTN_TEST_SEED reproduces */

    fattn_ctx *ctx = NULL;
    if (fattn_ctx_create(&ctx, FATTN_BACKEND_CPU, 0) != FATTN_OK) {
        printf("cannot create a CPU context: %s\n", fattn_last_error(NULL));
        return 1;
    }
    case_plain(ctx, FATTN_DTYPE_F32, FATTN_QUANT_BLOCK, 128);
    case_plain(ctx, FATTN_DTYPE_F32, FATTN_QUANT_BLOCK, 7);
    case_plain(ctx, FATTN_DTYPE_F16, FATTN_QUANT_BLOCK, 64);
    case_plain(ctx, FATTN_DTYPE_BF16, FATTN_QUANT_BLOCK, 128);
    case_plain(ctx, FATTN_DTYPE_F32, FATTN_QUANT_TENSOR, 128);
    case_plain(ctx, FATTN_DTYPE_F16, FATTN_QUANT_TENSOR, 1000);
    case_rotate(ctx, FATTN_QUANT_BLOCK, 64);
    case_rotate(ctx, FATTN_QUANT_BLOCK, 128);
    case_rotate(ctx, FATTN_QUANT_TENSOR, 256);
    case_strided_threads(ctx);
    case_subnormal(ctx);
    case_unsupported(ctx);
    fattn_ctx_free(ctx);
    printf("test_quantize: %d failed -> %s\n", g_fail, g_fail ? "FAIL" : "PASS");
    return g_fail ? 1 : 0;
}
