/* test_quantize.cu - fattn_quantize on a CUDA context against the CPU
 * engine's fattn_quantize on the same input: codes and scales must be the
 * same bits (src/cuda/ops/quantize.cu says why they can be: the same
 * butterflies, IEEE division, no flush to zero).
 *   - f32, f16, bf16 inputs; head dims 64, 128, 256 with and without
 *     rotation (two seeds), 8, 24, 32, 40, 512 without, 1 .. 32 with;
 *   - block_rows 1, 64, 128, 176, 4097 and per-tensor scales, seqlens 1, 17,
 *     1000, 4097 (tails), which between them take every path of the
 *     quantiser: whole blocks per CTA, a block over a cluster of 2 .. 8 CTAs,
 *     the two-pass reduction for huge blocks and for the tensor;
 *   - packed BSHD, padded head slices, padded BHSD, and a misaligned view
 *     (input one element off 16 bytes, output rows an odd number of bytes
 *     apart: element-wide loads and byte stores);
 *   - values: N(0, 1) with rare outliers up to 1e4, plus, in the special
 *     cases, all-zero and all-NaN blocks, NaN, +-Inf, -0, subnormal-range
 *     blocks (f32 and bf16 subnormals; f16 ones are normal in f32), and
 *     values near FLT_MAX whose rotation overflows to Inf, and blocks whose
 *     amax / 448 is below FLT_MIN (the scale's floor: no NaN code from
 *     finite input, issue 43);
 *   - the output is poisoned with two different bytes in two runs, so that
 *     an element left unwritten shows, and bytes outside the view must stay
 *     poison; scales are poisoned with NaN;
 *   - refusals write nothing: head_dim 20, rotation at head_dim 512, host
 *     pointers for in, out and out.scale, out overlapping in;
 *   - fattn_fwd_fp8: when the CUDA engine serves it (FATTN_OK), its O and
 *     LSE must be the bits of fattn_quantize + fattn_fwd done by hand; while
 *     the e4m3 forward is missing it answers UNSUPPORTED, which is reported;
 *     with V (and K) of zeros and f32 / bf16 subnormals its outputs are
 *     finite (issue 43).
 * Nothing here is allowed to differ from the CPU: no case is known where the
 * two cannot agree bitwise.  Inputs from the fixed seed of tu_seed
 * (FATTN_TEST_SEED overrides).  Exit 77 (ctest: skipped) without a Hopper
 * GPU; with FATTN_REQUIRE_GPU=1, exit 1. */
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/half.h"
#include "fattn.h"
#include "gpu/gpu_testutil.h"

enum layout_kind { L_PACKED, L_PADDED, L_BHSD, L_MISALIGNED, L_COUNT };
enum value_kind { V_NORMAL, V_SPECIAL, V_TINY, V_HUGE, V_SUBNORMAL };

static const char *layout_name(int l) {
    return l == L_PADDED ? "padded slice" : l == L_BHSD ? "padded BHSD" : l == L_MISALIGNED ? "misaligned" : "packed";
}
static const char *value_name(int v) {
    return v == V_SPECIAL     ? ", NaN/Inf/zero blocks"
           : v == V_TINY      ? ", subnormal-range blocks"
           : v == V_HUGE      ? ", near FLT_MAX"
           : v == V_SUBNORMAL ? ", blocks whose amax / 448 is below FLT_MIN (scale floor)"
                              : "";
}

struct qcase {
    fattn_dtype dt;
    int B, S, H, d;
    fattn_quant_granularity g;
    int br, rotate;
    uint64_t seed;
    int layout, values;
};

/* A [B, S, H, d] view inside a buffer: strides and offset in elements. */
struct view {
    int64_t sb, ss, sh, off;
    size_t n; /* buffer elements */
};

static view make_view(int kind, int B, int S, int H, int d, int is_out) {
    view v;
    v.off = 0;
    if (kind == L_PADDED) { /* heads 1 .. H of H + 2, 16 elements after each token, 32 after each batch */
        v.sh = d;
        v.ss = (int64_t)(H + 2) * d + 16;
        v.sb = S * v.ss + 32;
        v.off = d;
    } else if (kind == L_BHSD) {
        v.ss = d + 8;
        v.sh = S * v.ss + 8;
        v.sb = H * v.sh + 16;
        v.off = 8;
    } else if (kind == L_MISALIGNED) {
        /* input: one element past 16 bytes, rows d + 1 apart; output rows
         * d + 3 bytes apart */
        v.ss = is_out ? d + 3 : d + 1;
        v.sh = S * v.ss + 1;
        v.sb = H * v.sh + 5;
        v.off = 1;
    } else {
        v.sh = d;
        v.ss = (int64_t)H * d;
        v.sb = S * v.ss;
    }
    v.n = (size_t)(v.off + (B - 1) * v.sb + (S - 1) * v.ss + (H - 1) * v.sh + d + 64);
    return v;
}

static size_t at(const view &v, int b, int s, int h, int i) { return (size_t)(v.off + b * v.sb + s * v.ss + h * v.sh + i); }

static float draw(tu_rng *r) {
    double x = tu_rng_normal(r);
    double u = tu_rng_uniform(r);
    if (u < 0.002) x *= 100.0;
    else if (u < 0.0025) x *= 1e4;
    return (float)x;
}

static uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* The f32 value of each element (packed BSHD), before conversion. */
static void make_values(tu_rng *r, const qcase &c, float *x) {
    const size_t n = (size_t)c.B * c.S * c.H * c.d;
    for (size_t i = 0; i < n; ++i) x[i] = draw(r);
    if (c.values == V_NORMAL) return;
    const int br = c.g == FATTN_QUANT_TENSOR ? c.S : c.br;
    for (int b = 0; b < c.B; ++b)
        for (int h = 0; h < c.H; ++h)
            for (int s = 0; s < c.S; ++s) {
                const int blk = s / br;
                float *row = x + (((size_t)b * c.S + s) * c.H + h) * c.d;
                const int key = (b * c.H + h) * 7 + blk; /* which kind of block this is */
                if (c.values == V_SPECIAL) {
                    if (key % 5 == 1)
                        for (int i = 0; i < c.d; ++i) row[i] = 0.0f;
                    else if (key % 5 == 2)
                        for (int i = 0; i < c.d; ++i) row[i] = (i + s) % 3 ? NAN : 0.0f;
                    else if (key % 5 == 3 && s % 3 == 0)
                        row[(s * 7) % c.d] = (s & 1) ? INFINITY : -INFINITY;
                    /* scattered: NaN, -0, tiny values in every block */
                    for (int i = 0; i < c.d; ++i) {
                        const double u = tu_rng_uniform(r);
                        if (u < 0.003) row[i] = NAN;
                        else if (u < 0.006) row[i] = -0.0f;
                        else if (u < 0.009) row[i] = (float)(tu_rng_normal(r) * 1e-40);
                    }
                } else if (c.values == V_TINY) {
                    /* whole blocks of subnormal-range f32 (and bf16); f16 sees the
                     * smallest values as 0 or its own subnormals */
                    const double mag = c.dt == FATTN_DTYPE_F16 ? 1e-6 : (key % 2 ? 1e-39 : 1e-42);
                    for (int i = 0; i < c.d; ++i) row[i] = (float)(tu_rng_normal(r) * mag);
                } else if (c.values == V_SUBNORMAL) {
                    /* amax / 448 under FLT_MIN, so the scale is the floor
                     * 2^-126 (issue 43): f32 blocks of zeros and a few units of
                     * 2^-149 (amax / 448 rounds to 0 without the floor), of
                     * values up to 1e-40, and of values just under 448 FLT_MIN
                     * (amax / 448 a subnormal); bf16 keeps the last two (its
                     * smallest subnormal is 2^-133) */
                    const int kind = c.dt == FATTN_DTYPE_F32 ? key % 3 : 1 + key % 2;
                    for (int i = 0; i < c.d; ++i) {
                        const double u = tu_rng_uniform(r), sg = tu_rng_uniform(r) < 0.5 ? -1.0 : 1.0;
                        if (u < 0.4) row[i] = 0.0f;
                        else if (kind == 0) row[i] = (float)(sg * 0x1p-149 * (double)(1 + (int)(u * 8)));
                        else if (kind == 1) row[i] = (float)(sg * u * 1e-40);
                        else row[i] = (float)(sg * u * 5.2e-36);
                    }
                } else if (c.values == V_HUGE) {
                    /* f32 (and bf16) near FLT_MAX: the rotation's sums overflow */
                    if (key % 2)
                        for (int i = 0; i < c.d; ++i) row[i] = (float)((tu_rng_uniform(r) < 0.5 ? -1 : 1) * 3.0e38);
                }
            }
}

/* Element bits of the input dtype. */
static void to_dtype_bits(const float *x, size_t n, fattn_dtype dt, void *dst) {
    for (size_t i = 0; i < n; ++i) {
        if (dt == FATTN_DTYPE_F32) ((float *)dst)[i] = x[i];
        else if (dt == FATTN_DTYPE_F16) ((uint16_t *)dst)[i] = fattn_f32_to_f16(x[i]);
        else ((uint16_t *)dst)[i] = fattn_f32_to_bf16(x[i]);
    }
}

static fattn_quantize_args qargs(const qcase &c, void *in, const view &vi, void *out, const view &vo, float *scale) {
    fattn_quantize_args a;
    memset(&a, 0, sizeof a);
    const size_t esz = fattn_dtype_size(c.dt);
    fattn_tensor ti = {(char *)in + vi.off * esz, c.dt, vi.sb, vi.ss, vi.sh, NULL, 0};
    fattn_tensor to = {(uint8_t *)out + vo.off, FATTN_DTYPE_E4M3, vo.sb, vo.ss, vo.sh, scale, 0};
    a.in = ti;
    a.out = to;
    a.batch = c.B;
    a.seqlen = c.S;
    a.heads = c.H;
    a.head_dim = c.d;
    a.granularity = c.g;
    a.block_rows = c.br;
    a.rotate = c.rotate;
    a.seed = c.seed;
    return a;
}

static void run_case(fattn_ctx *gpu, fattn_ctx *cpu, tu_rng *rng, const qcase &c) {
    const size_t esz = fattn_dtype_size(c.dt), n = (size_t)c.B * c.S * c.H * c.d;
    const int64_t nb = ((int64_t)c.S + c.br - 1) / c.br;
    const size_t nscale = (size_t)c.B * c.H * nb;
    const view vi = make_view(c.layout, c.B, c.S, c.H, c.d, 0), vo = make_view(c.layout, c.B, c.S, c.H, c.d, 1);
    char head[320];
    snprintf(head, sizeof head, "%s b%d s%d h%d d%d, %s %d rows, %s%s", fattn_dtype_name(c.dt), c.B, c.S, c.H, c.d,
             c.g == FATTN_QUANT_TENSOR ? "tensor scale, layout of" : "block_rows", c.br, layout_name(c.layout),
             value_name(c.values));
    if (c.rotate) snprintf(head + strlen(head), sizeof head - strlen(head), ", rotate seed %llu", (unsigned long long)c.seed);

    float *x = (float *)tu_malloc(n * 4);
    make_values(rng, c, x);
    void *packed = tu_malloc(n * esz);
    to_dtype_bits(x, n, c.dt, packed);
    /* the input view inside a buffer of NaN: a read outside the view shows */
    uint8_t *hin = (uint8_t *)tu_malloc(vi.n * esz);
    for (size_t i = 0; i < vi.n; ++i) {
        if (esz == 4) ((uint32_t *)hin)[i] = 0x7FC00001u;
        else ((uint16_t *)hin)[i] = 0x7FC1;
    }
    for (int b = 0; b < c.B; ++b)
        for (int s = 0; s < c.S; ++s)
            for (int h = 0; h < c.H; ++h)
                memcpy(hin + at(vi, b, s, h, 0) * esz, (uint8_t *)packed + ((((size_t)b * c.S + s) * c.H + h) * c.d) * esz,
                       c.d * esz);

    /* the CPU engine's answer */
    uint8_t *ref = (uint8_t *)tu_malloc(vo.n), *got = (uint8_t *)tu_malloc(vo.n);
    float *ref_scale = (float *)tu_malloc(nscale * 4), *got_scale = (float *)tu_malloc(nscale * 4);
    void *din, *dout;
    float *dscale;
    CK(cudaMalloc(&din, vi.n * esz));
    CK(cudaMalloc(&dout, vo.n));
    CK(cudaMalloc(&dscale, nscale * 4));
    CK(cudaMemcpy(din, hin, vi.n * esz, cudaMemcpyHostToDevice));

    const uint8_t poisons[2] = {0xA5, 0x5A};
    long bad_codes = 0, bad_scales = 0;
    for (int pass = 0; pass < 2; ++pass) {
        memset(ref, poisons[pass], vo.n);
        memset(ref_scale, 0xFF, nscale * 4);
        fattn_quantize_args ca = qargs(c, hin, vi, ref, vo, ref_scale);
        fattn_status st = fattn_quantize(cpu, &ca);
        TU_CHECK(st == FATTN_OK, "%s: CPU fattn_quantize: %s", head, fattn_last_error(cpu));
        CK(cudaMemset(dout, poisons[pass], vo.n));
        CK(cudaMemset(dscale, 0xFF, nscale * 4));
        fattn_quantize_args ga = qargs(c, din, vi, dout, vo, dscale);
        st = fattn_quantize(gpu, &ga);
        TU_CHECK(st == FATTN_OK, "%s: CUDA fattn_quantize: %s: %s", head, fattn_status_string(st), fattn_last_error(gpu));
        cudaError_t e = cudaDeviceSynchronize();
        TU_CHECK(e == cudaSuccess, "%s: kernel failed: %s", head, cudaGetErrorString(e));
        if (e != cudaSuccess) exit(1);
        CK(cudaMemcpy(got, dout, vo.n, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(got_scale, dscale, nscale * 4, cudaMemcpyDeviceToHost));
        int shown = 0;
        for (size_t i = 0; i < nscale; ++i)
            if (f32_bits(got_scale[i]) != f32_bits(ref_scale[i])) {
                if (shown++ < 4)
                    fprintf(stderr, "  %s: scale[%zu] = %a (0x%08x), CPU %a (0x%08x)\n", head, i, got_scale[i],
                            f32_bits(got_scale[i]), ref_scale[i], f32_bits(ref_scale[i]));
                bad_scales++;
            }
        shown = 0;
        for (size_t i = 0; i < vo.n; ++i)
            if (got[i] != ref[i]) {
                if (shown++ < 6) {
                    /* locate the element (packed index) for the message */
                    long long bb = -1, ss = -1, hh = -1, ii = -1;
                    for (int b = 0; b < c.B && bb < 0; ++b)
                        for (int h = 0; h < c.H && bb < 0; ++h)
                            for (int s = 0; s < c.S && bb < 0; ++s) {
                                const size_t r0 = at(vo, b, s, h, 0);
                                if (i >= r0 && i < r0 + (size_t)c.d) bb = b, ss = s, hh = h, ii = (long long)(i - r0);
                            }
                    fprintf(stderr, "  %s: byte %zu (b %lld s %lld h %lld i %lld) = 0x%02x, CPU 0x%02x\n", head, i, bb, ss,
                            hh, ii, got[i], ref[i]);
                }
                bad_codes++;
            }
    }
    long nan_codes = 0; /* subnormal blocks are finite: no code may be NaN (0x7F, 0xFF) */
    if (c.values == V_SUBNORMAL)
        for (int b = 0; b < c.B; ++b)
            for (int s = 0; s < c.S; ++s)
                for (int h = 0; h < c.H; ++h)
                    for (int i = 0; i < c.d; ++i) nan_codes += (got[at(vo, b, s, h, i)] & 0x7F) == 0x7F;
    TU_CHECK(nan_codes == 0, "%s: %ld NaN codes from finite input (scale floor, issue 43)", head, nan_codes);
    const int ok = bad_codes == 0 && bad_scales == 0;
    if (!ok) tu_failures++;
    printf("  [%s] %s: %ld code bytes, %ld scales differ from the CPU (2 poisons)\n", ok ? "ok" : "FAIL", head, bad_codes,
           bad_scales);
    cudaFree(din);
    cudaFree(dout);
    cudaFree(dscale);
    free(x); free(packed); free(hin); free(ref); free(got); free(ref_scale); free(got_scale);
}

/* fattn_fwd_fp8 with a V of zeros and f32 subnormals (issue 43 item 1: v of
 * zeros and 1e-44 gave every output NaN, through a 0 scale; with bf16 a
 * subnormal scale that the kernels, built with fast math, flush to 0), and
 * then with K the same: every output finite and |O| <= 1.25 max |v| (O is
 * a convex combination of v's rows; e4m3 codes of v and P round by up to
 * 2^-4, and O to bf16). */
static void fwd_fp8_tiny(fattn_ctx *gpu, tu_rng *rng, fattn_dtype dt, double mag, int tiny_k) {
    const int B = 1, S = 512, H = 2, D = 128;
    const size_t n = (size_t)B * S * H * D, esz = fattn_dtype_size(dt);
    char what[160];
    snprintf(what, sizeof what, "fattn_fwd_fp8 %s d%d, v%s of zeros and |x| <= %.0e", fattn_dtype_name(dt), D,
             tiny_k ? " and k" : "", mag);
    float *x = (float *)tu_malloc(n * 4);
    void *bits = tu_malloc(n * esz);
    void *dq, *dk, *dv;
    uint16_t *o;
    CK(cudaMalloc(&dq, n * esz)); CK(cudaMalloc(&dk, n * esz)); CK(cudaMalloc(&dv, n * esz));
    CK(cudaMalloc(&o, n * 2));
    void *dst[3] = {dq, dk, dv};
    for (int t = 0; t < 3; ++t) {
        const int tiny = t == 2 || (t == 1 && tiny_k);
        for (size_t i = 0; i < n; ++i) {
            const double u = tu_rng_uniform(rng);
            x[i] = tiny ? (u < 0.5 ? 0.0f : (float)((u < 0.75 ? -1 : 1) * mag * u)) : (float)tu_rng_normal(rng);
        }
        to_dtype_bits(x, n, dt, bits);
        CK(cudaMemcpy(dst[t], bits, n * esz, cudaMemcpyHostToDevice));
    }
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p.batch = B; a.p.seqlen_q = a.p.seqlen_k = S; a.p.heads_q = a.p.heads_kv = H; a.p.head_dim = D;
    a.q = fattn_tensor_bshd(dq, dt);
    a.k = fattn_tensor_bshd(dk, dt);
    a.v = fattn_tensor_bshd(dv, dt);
    a.o = fattn_tensor_bshd(o, FATTN_DTYPE_BF16);
    CK(cudaMemset(o, 0xFF, n * 2));
    fattn_status st = fattn_fwd_fp8(gpu, &a, NULL);
    CK(cudaDeviceSynchronize());
    if (st == FATTN_ERROR_UNSUPPORTED) {
        printf("  [--] %s: UNSUPPORTED (%s)\n", what, fattn_last_error(gpu));
    } else {
        TU_CHECK(st == FATTN_OK, "%s: %s: %s", what, fattn_status_string(st), fattn_last_error(gpu));
        uint16_t *h = (uint16_t *)tu_malloc(n * 2);
        CK(cudaMemcpy(h, o, n * 2, cudaMemcpyDeviceToHost));
        size_t nonfinite = 0, big = 0;
        for (size_t i = 0; i < n; ++i) {
            nonfinite += (h[i] & 0x7F80) == 0x7F80;
            uint32_t u = (uint32_t)h[i] << 16;
            float f;
            memcpy(&f, &u, 4);
            big += fabsf(f) > (float)(1.25 * mag);
        }
        const int ok = st == FATTN_OK && nonfinite == 0 && big == 0;
        if (!ok) tu_failures++;
        printf("  [%s] %s: %zu of %zu outputs not finite, %zu above 1.25 max |v|\n", ok ? "ok" : "FAIL", what, nonfinite, n,
               big);
        free(h);
    }
    cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(o);
    free(x); free(bits);
}

/* Refusals: the status, and output and scales as they were. */
static void refusals(fattn_ctx *gpu) {
    const int B = 1, S = 300, H = 2, d = 64;
    const size_t n = (size_t)B * S * H * 512, nscale = 64;
    uint16_t *din;
    uint8_t *dout;
    float *dscale;
    CK(cudaMalloc(&din, n * 2));
    CK(cudaMalloc(&dout, n));
    CK(cudaMalloc(&dscale, nscale * 4));
    CK(cudaMemset(din, 0x3C, n * 2));
    void *host_in = tu_malloc(n * 2), *host_out = tu_malloc(n);
    float *host_scale = (float *)tu_malloc(nscale * 4);
    memset(host_out, 0x77, n);
    memset(host_scale, 0x77, nscale * 4);
    struct rcase {
        const char *what, *needle;
        int kind;
        fattn_status want;
    } cases[] = {
        {"head_dim 20 (not a multiple of 8)", "head_dim 20 is not supported by the CUDA engine", 0, FATTN_ERROR_UNSUPPORTED},
        {"rotation at head_dim 512", "head_dim 512 is not supported by the CUDA engine", 1, FATTN_ERROR_UNSUPPORTED},
        {"rotation at head_dim 48", "power-of-two head_dim", 2, FATTN_ERROR_UNSUPPORTED},
        {"in.data in host memory", "in.data", 3, FATTN_ERROR_INVALID_ARGUMENT},
        {"out.data in host memory", "out.data", 4, FATTN_ERROR_INVALID_ARGUMENT},
        {"out.scale in host memory", "out.scale", 5, FATTN_ERROR_INVALID_ARGUMENT},
        {"out overlapping in", "out overlaps in", 6, FATTN_ERROR_INVALID_ARGUMENT},
    };
    uint8_t *h = (uint8_t *)tu_malloc(n * 2);
    for (const auto &rc : cases) {
        fattn_quantize_args a;
        memset(&a, 0, sizeof a);
        a.in = fattn_tensor_bshd(din, FATTN_DTYPE_BF16);
        a.out = fattn_tensor_bshd(dout, FATTN_DTYPE_E4M3);
        a.out.scale = dscale;
        a.batch = B; a.seqlen = S; a.heads = H; a.head_dim = d;
        a.granularity = FATTN_QUANT_BLOCK;
        a.block_rows = 128;
        if (rc.kind == 0) a.head_dim = 20;
        if (rc.kind == 1) a.head_dim = 512, a.rotate = 1;
        if (rc.kind == 2) a.head_dim = 48, a.rotate = 1;
        if (rc.kind == 3) a.in.data = host_in;
        if (rc.kind == 4) a.out.data = host_out;
        if (rc.kind == 5) a.out.scale = host_scale;
        if (rc.kind == 6) a.out.data = (uint8_t *)din + 64;
        CK(cudaMemset(dout, 0xEE, n));
        CK(cudaMemset(dscale, 0xEE, nscale * 4));
        CK(cudaDeviceSynchronize());
        const fattn_status st = fattn_quantize(gpu, &a);
        CK(cudaDeviceSynchronize());
        const char *msg = fattn_last_error(gpu);
        int untouched = 1;
        CK(cudaMemcpy(h, dout, n, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; ++i) untouched &= h[i] == 0xEE;
        CK(cudaMemcpy(h, dscale, nscale * 4, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < nscale * 4; ++i) untouched &= h[i] == 0xEE;
        CK(cudaMemcpy(h, din, n * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n * 2; ++i) untouched &= h[i] == 0x3C;
        for (size_t i = 0; i < n; ++i) untouched &= ((uint8_t *)host_out)[i] == 0x77;
        for (size_t i = 0; i < nscale * 4; ++i) untouched &= ((uint8_t *)host_scale)[i] == 0x77;
        const int ok = st == rc.want && strstr(msg, rc.needle) && untouched;
        if (!ok) tu_failures++;
        printf("  [%s] refused: %s: %s, \"%s\"%s\n", ok ? "ok" : "FAIL", rc.what, fattn_status_string(st), msg,
               untouched ? "" : ", MEMORY WRITTEN");
    }
    free(h); free(host_in); free(host_out); free(host_scale);
    cudaFree(din); cudaFree(dout); cudaFree(dscale);
}

/* fattn_fwd_fp8 against fattn_quantize x 3 + fattn_fwd on the e4m3 tensors,
 * both on the GPU: the same bits of O and LSE (the same kernels on the same
 * codes).  Q and K rotated with one seed, V not; GQA heads. */
static void fwd_fp8(fattn_ctx *gpu, tu_rng *rng, fattn_quant_granularity g, int rotate, int causal) {
    const int B = 2, S = 1000, HQ = 8, HKV = 2, D = 128;
    const int bq = 128, bk = 128, bv = 128; /* what fattn_fwd_fp8 uses for the tensor too */
    const size_t nq = (size_t)B * S * HQ * D, nk = (size_t)B * S * HKV * D, nlse = (size_t)B * HQ * S;
    char what[160];
    snprintf(what, sizeof what, "fattn_fwd_fp8 bf16 b%d s%d h%d/%d d%d %s%s%s", B, S, HQ, HKV, D,
             g == FATTN_QUANT_TENSOR ? "tensor" : "default blocks", rotate ? ", rotate" : "", causal ? ", causal" : "");
    float *x = (float *)tu_malloc(nq * 4);
    uint16_t *bits = (uint16_t *)tu_malloc(nq * 2);
    uint16_t *dq, *dk, *dv, *o1, *o2;
    float *l1, *l2;
    CK(cudaMalloc(&dq, nq * 2)); CK(cudaMalloc(&dk, nk * 2)); CK(cudaMalloc(&dv, nk * 2));
    CK(cudaMalloc(&o1, nq * 2)); CK(cudaMalloc(&o2, nq * 2));
    CK(cudaMalloc(&l1, nlse * 4)); CK(cudaMalloc(&l2, nlse * 4));
    uint16_t *dst[3] = {dq, dk, dv};
    const size_t cnt[3] = {nq, nk, nk};
    for (int t = 0; t < 3; ++t) {
        for (size_t i = 0; i < cnt[t]; ++i) x[i] = draw(rng);
        to_dtype_bits(x, cnt[t], FATTN_DTYPE_BF16, bits);
        CK(cudaMemcpy(dst[t], bits, cnt[t] * 2, cudaMemcpyHostToDevice));
    }
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p.batch = B; a.p.seqlen_q = a.p.seqlen_k = S; a.p.heads_q = HQ; a.p.heads_kv = HKV; a.p.head_dim = D;
    a.p.causal = causal;
    a.q = fattn_tensor_bshd(dq, FATTN_DTYPE_BF16);
    a.k = fattn_tensor_bshd(dk, FATTN_DTYPE_BF16);
    a.v = fattn_tensor_bshd(dv, FATTN_DTYPE_BF16);
    a.o = fattn_tensor_bshd(o1, FATTN_DTYPE_BF16);
    a.lse = l1;
    fattn_fp8_options opt;
    memset(&opt, 0, sizeof opt);
    opt.granularity = g;
    opt.rotate = rotate;
    opt.seed = 12345;
    CK(cudaMemset(o1, 0xFF, nq * 2)); CK(cudaMemset(o2, 0xFF, nq * 2));
    CK(cudaMemset(l1, 0xFF, nlse * 4)); CK(cudaMemset(l2, 0xFF, nlse * 4));
    fattn_status st = fattn_fwd_fp8(gpu, &a, &opt);
    CK(cudaDeviceSynchronize());
    if (st == FATTN_ERROR_UNSUPPORTED) {
        printf("  [--] %s: UNSUPPORTED (%s): not compared\n", what, fattn_last_error(gpu));
    } else if (st != FATTN_OK) {
        tu_failures++;
        printf("  [FAIL] %s: %s: %s\n", what, fattn_status_string(st), fattn_last_error(gpu));
    } else {
        /* by hand */
        uint8_t *c8[3];
        float *sc[3];
        const int brs[3] = {bq, bk, bv}, heads[3] = {HQ, HKV, HKV};
        fattn_tensor t8[3];
        for (int t = 0; t < 3; ++t) {
            const size_t nsc = (size_t)B * heads[t] * ((S + brs[t] - 1) / brs[t]);
            CK(cudaMalloc(&c8[t], cnt[t]));
            CK(cudaMalloc(&sc[t], nsc * 4));
            fattn_quantize_args qa;
            memset(&qa, 0, sizeof qa);
            qa.in = fattn_tensor_bshd(dst[t], FATTN_DTYPE_BF16);
            qa.out = fattn_tensor_bshd(c8[t], FATTN_DTYPE_E4M3);
            qa.out.scale = sc[t];
            qa.batch = B; qa.seqlen = S; qa.heads = heads[t]; qa.head_dim = D;
            qa.granularity = g;
            qa.block_rows = brs[t];
            qa.rotate = rotate && t < 2;
            qa.seed = opt.seed;
            TU_EXPECT_OK(fattn_quantize(gpu, &qa));
            t8[t] = qa.out;
            t8[t].scale_block = brs[t];
        }
        fattn_fwd_args m = a;
        m.q = t8[0]; m.k = t8[1]; m.v = t8[2];
        m.o = fattn_tensor_bshd(o2, FATTN_DTYPE_BF16);
        m.lse = l2;
        TU_EXPECT_OK(fattn_fwd(gpu, &m));
        CK(cudaDeviceSynchronize());
        uint8_t *h1 = (uint8_t *)tu_malloc(nq * 2), *h2 = (uint8_t *)tu_malloc(nq * 2);
        CK(cudaMemcpy(h1, o1, nq * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(h2, o2, nq * 2, cudaMemcpyDeviceToHost));
        const int same_o = memcmp(h1, h2, nq * 2) == 0;
        size_t nonfinite = 0; /* bf16 with all exponent bits set: the poison, or a NaN */
        for (size_t i = 0; i < nq; ++i) nonfinite += (((const uint16_t *)h1)[i] & 0x7F80) == 0x7F80;
        TU_CHECK(nonfinite == 0, "%s: %zu of %zu O elements not finite (unwritten?)", what, nonfinite, nq);
        CK(cudaMemcpy(h1, l1, nlse * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(h2, l2, nlse * 4, cudaMemcpyDeviceToHost));
        const int same_l = memcmp(h1, h2, nlse * 4) == 0;
        if (!(same_o && same_l)) tu_failures++;
        printf("  [%s] %s: O %s, LSE %s the bits of quantize + fwd by hand\n", same_o && same_l ? "ok" : "FAIL", what,
               same_o ? "is" : "IS NOT", same_l ? "is" : "IS NOT");
        free(h1); free(h2);
        for (int t = 0; t < 3; ++t) { cudaFree(c8[t]); cudaFree(sc[t]); }
    }
    cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(o1); cudaFree(o2); cudaFree(l1); cudaFree(l2);
    free(x); free(bits);
}

int main(void) {
    fattn_ctx *gpu = gpu_ctx_or_skip();
    fattn_ctx *cpu = gpu_cpu_ctx();
    tu_rng rng;
    tu_rng_init(&rng, (uint64_t)tu_seed());
    const fattn_dtype F = FATTN_DTYPE_F32, H = FATTN_DTYPE_F16, B = FATTN_DTYPE_BF16;
    const fattn_dtype dts[3] = {B, H, F};
    const fattn_quant_granularity BL = FATTN_QUANT_BLOCK, TE = FATTN_QUANT_TENSOR;
    const uint64_t seeds[2] = {0x5eed, 0x0123456789abcdefull};
    printf("block scales: head dims 64/128/256, rotation off/on, every block_rows\n");
    {
        const int dims[3] = {64, 128, 256}, brs[5] = {1, 64, 128, 176, 4097}, seqs[4] = {1, 17, 1000, 4097};
        int i = 0;
        for (int di = 0; di < 3; ++di)
            for (int rot = 0; rot < 2; ++rot)
                for (int bi = 0; bi < 5; ++bi, ++i) {
                    qcase c = {dts[i % 3], 1 + (i % 2), seqs[(i + bi) % 4], 3, dims[di], BL, brs[bi], rot, seeds[i % 2],
                               i % L_COUNT, V_NORMAL};
                    if (c.S == 1) c.B = 3;
                    run_case(gpu, cpu, &rng, c);
                }
    }
    printf("per-tensor scales\n");
    {
        const int dims[3] = {64, 128, 256};
        int i = 0;
        for (int di = 0; di < 3; ++di)
            for (int rot = 0; rot < 2; ++rot)
                for (int si = 0; si < 2; ++si, ++i) {
                    qcase c = {dts[i % 3], 2, si ? 4097 : 17, 3, dims[di], TE, si ? 128 : 5, rot, seeds[si], i % L_COUNT,
                               V_NORMAL};
                    run_case(gpu, cpu, &rng, c);
                }
    }
    printf("other head dims\n");
    {
        const qcase cs[] = {
            {B, 2, 300, 3, 8, BL, 64, 0, 0, L_PACKED, V_NORMAL},    {H, 2, 300, 3, 24, BL, 64, 0, 0, L_PADDED, V_NORMAL},
            {F, 1, 1000, 2, 32, BL, 128, 0, 0, L_BHSD, V_NORMAL},   {B, 1, 500, 3, 40, BL, 7, 0, 0, L_MISALIGNED, V_NORMAL},
            {B, 1, 1000, 2, 512, BL, 128, 0, 0, L_PACKED, V_NORMAL}, {H, 2, 600, 2, 512, BL, 176, 0, 0, L_PADDED, V_NORMAL},
            {F, 1, 4097, 2, 512, BL, 4097, 0, 0, L_PACKED, V_NORMAL}, {B, 1, 700, 2, 512, TE, 128, 0, 0, L_BHSD, V_NORMAL},
            {F, 1, 1000, 2, 1, BL, 64, 1, 7, L_PACKED, V_NORMAL},   {B, 2, 1000, 2, 2, BL, 64, 1, 7, L_PADDED, V_NORMAL},
            {H, 1, 1000, 3, 4, BL, 100, 1, 7, L_MISALIGNED, V_NORMAL}, {B, 1, 1000, 3, 8, BL, 128, 1, 7, L_BHSD, V_NORMAL},
            {F, 1, 1000, 3, 16, BL, 1, 1, 9, L_PACKED, V_NORMAL},   {H, 1, 2000, 3, 32, TE, 64, 1, 9, L_PADDED, V_NORMAL},
        };
        for (const auto &c : cs) run_case(gpu, cpu, &rng, c);
    }
    printf("large tensors (CTAs that walk many tiles)\n");
    {
        const qcase cs[] = {
            {B, 4, 4097, 16, 64, BL, 128, 0, 0, L_PACKED, V_NORMAL},  {H, 2, 4097, 16, 128, BL, 64, 1, 11, L_PACKED, V_NORMAL},
            {F, 2, 4097, 8, 128, BL, 1, 0, 0, L_BHSD, V_NORMAL},      {B, 2, 4097, 8, 256, BL, 128, 1, 11, L_PACKED, V_NORMAL},
            {B, 2, 4097, 8, 128, BL, 176, 0, 0, L_PADDED, V_SPECIAL},
        };
        for (const auto &c : cs) run_case(gpu, cpu, &rng, c);
    }
    printf("special values\n");
    {
        const qcase cs[] = {
            {F, 2, 1000, 3, 128, BL, 64, 0, 0, L_PACKED, V_SPECIAL},   {F, 2, 1000, 3, 128, BL, 64, 1, 3, L_PADDED, V_SPECIAL},
            {B, 1, 4097, 2, 256, BL, 128, 1, 3, L_BHSD, V_SPECIAL},    {H, 1, 4097, 2, 64, BL, 4097, 1, 3, L_PACKED, V_SPECIAL},
            {B, 2, 1000, 2, 128, TE, 128, 0, 0, L_PACKED, V_SPECIAL},  {F, 1, 300, 2, 64, BL, 1, 1, 3, L_MISALIGNED, V_SPECIAL},
            {F, 2, 1000, 3, 128, BL, 176, 0, 0, L_PACKED, V_TINY},     {F, 2, 1000, 3, 256, BL, 64, 1, 5, L_BHSD, V_TINY},
            {B, 2, 1000, 3, 64, BL, 128, 1, 5, L_PADDED, V_TINY},      {H, 1, 1000, 3, 128, BL, 128, 1, 5, L_PACKED, V_TINY},
            {F, 1, 4097, 2, 128, TE, 128, 1, 5, L_PACKED, V_TINY},     {F, 2, 1000, 3, 128, BL, 64, 1, 5, L_PACKED, V_HUGE},
            {B, 2, 1000, 3, 256, BL, 4097, 1, 5, L_PADDED, V_HUGE},    {F, 1, 1000, 3, 64, TE, 64, 1, 5, L_BHSD, V_HUGE},
        };
        for (const auto &c : cs) run_case(gpu, cpu, &rng, c);
    }
    printf("scale floor: blocks whose amax / 448 is below FLT_MIN (issue 43)\n");
    {
        /* blocks of 1 to 4097 rows and per tensor: the on-chip, cluster and
         * two-pass paths, as in the cases above */
        const qcase cs[] = {
            {F, 2, 1000, 3, 128, BL, 64, 0, 0, L_PACKED, V_SUBNORMAL},  {F, 2, 1000, 3, 128, BL, 128, 1, 3, L_PADDED, V_SUBNORMAL},
            {B, 2, 1000, 3, 64, BL, 16, 0, 0, L_BHSD, V_SUBNORMAL},     {F, 1, 4097, 2, 64, BL, 4097, 1, 3, L_PACKED, V_SUBNORMAL},
            {F, 1, 4097, 2, 128, BL, 4097, 0, 0, L_PACKED, V_SUBNORMAL}, {B, 1, 4097, 2, 128, TE, 128, 0, 0, L_PACKED, V_SUBNORMAL},
            {F, 1, 300, 2, 64, BL, 1, 0, 0, L_MISALIGNED, V_SUBNORMAL},
        };
        for (const auto &c : cs) run_case(gpu, cpu, &rng, c);
    }
    printf("refusals\n");
    refusals(gpu);
    printf("fattn_fwd_fp8 on the GPU vs quantize + fwd by hand\n");
    fwd_fp8(gpu, &rng, BL, 0, 0);
    fwd_fp8(gpu, &rng, BL, 1, 1);
    fwd_fp8(gpu, &rng, TE, 1, 0);
    printf("fattn_fwd_fp8 with tiny V (and K): finite outputs (issue 43)\n");
    fwd_fp8_tiny(gpu, &rng, F, 1e-44, 0);
    fwd_fp8_tiny(gpu, &rng, F, 1e-44, 1);
    fwd_fp8_tiny(gpu, &rng, B, 1e-39, 0);
    fwd_fp8_tiny(gpu, &rng, B, 5e-36, 1);
    fattn_ctx_free(cpu);
    fattn_ctx_free(gpu);
    return tu_finish("gpu quantize");
}
