/* kernels.c - see kernels.h.
 *
 * One source, three instantiations: the macros below are expanded with GCC /
 * Clang vector extensions of 4, 8 or 16 floats and a per-function target
 * attribute, so the library itself is built for the baseline ISA (no
 * -march=native) and still runs AVX2/AVX-512 code where the CPU has it. */
#include "cpu/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#define FATTN_X86_DISPATCH 1
#endif

typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
#ifdef FATTN_X86_DISPATCH
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
#endif

/* 4 x (2*W) register tile: 8 vector accumulators. */
#define FATTN_DEFINE_GEMM(NAME, ATTR, VT, W)                                                    \
    ATTR static void NAME(int m, int n, int k, const float *A, int64_t lda, const float *B,     \
                          int64_t ldb, float *C, int64_t ldc, int accumulate) {                \
        for (int i = 0; i < m; i += 4) {                                                        \
            const float *a0 = A + (int64_t)i * lda, *a1 = a0 + lda, *a2 = a1 + lda,             \
                        *a3 = a2 + lda;                                                         \
            float *c0 = C + (int64_t)i * ldc, *c1 = c0 + ldc, *c2 = c1 + ldc, *c3 = c2 + ldc;   \
            int j = 0;                                                                          \
            for (; j + 2 * (W) <= n; j += 2 * (W)) {                                            \
                VT x00, x01, x10, x11, x20, x21, x30, x31;                                      \
                if (accumulate) {                                                               \
                    memcpy(&x00, c0 + j, sizeof(VT)); memcpy(&x01, c0 + j + (W), sizeof(VT));   \
                    memcpy(&x10, c1 + j, sizeof(VT)); memcpy(&x11, c1 + j + (W), sizeof(VT));   \
                    memcpy(&x20, c2 + j, sizeof(VT)); memcpy(&x21, c2 + j + (W), sizeof(VT));   \
                    memcpy(&x30, c3 + j, sizeof(VT)); memcpy(&x31, c3 + j + (W), sizeof(VT));   \
                } else {                                                                        \
                    x00 = x01 = x10 = x11 = x20 = x21 = x30 = x31 = (VT){0};                    \
                }                                                                               \
                const float *b = B + j;                                                         \
                for (int p = 0; p < k; p++, b += ldb) {                                         \
                    VT b0, b1;                                                                  \
                    memcpy(&b0, b, sizeof(VT));                                                 \
                    memcpy(&b1, b + (W), sizeof(VT));                                           \
                    VT s0 = (VT){0} + a0[p], s1 = (VT){0} + a1[p];                              \
                    x00 += s0 * b0; x01 += s0 * b1;                                             \
                    x10 += s1 * b0; x11 += s1 * b1;                                             \
                    VT s2 = (VT){0} + a2[p], s3 = (VT){0} + a3[p];                              \
                    x20 += s2 * b0; x21 += s2 * b1;                                             \
                    x30 += s3 * b0; x31 += s3 * b1;                                             \
                }                                                                               \
                memcpy(c0 + j, &x00, sizeof(VT)); memcpy(c0 + j + (W), &x01, sizeof(VT));       \
                memcpy(c1 + j, &x10, sizeof(VT)); memcpy(c1 + j + (W), &x11, sizeof(VT));       \
                memcpy(c2 + j, &x20, sizeof(VT)); memcpy(c2 + j + (W), &x21, sizeof(VT));       \
                memcpy(c3 + j, &x30, sizeof(VT)); memcpy(c3 + j + (W), &x31, sizeof(VT));       \
            }                                                                                   \
            for (; j < n; j += (W)) {                                                           \
                VT x0, x1, x2, x3;                                                              \
                if (accumulate) {                                                               \
                    memcpy(&x0, c0 + j, sizeof(VT)); memcpy(&x1, c1 + j, sizeof(VT));           \
                    memcpy(&x2, c2 + j, sizeof(VT)); memcpy(&x3, c3 + j, sizeof(VT));           \
                } else {                                                                        \
                    x0 = x1 = x2 = x3 = (VT){0};                                                \
                }                                                                               \
                const float *b = B + j;                                                         \
                for (int p = 0; p < k; p++, b += ldb) {                                         \
                    VT b0;                                                                      \
                    memcpy(&b0, b, sizeof(VT));                                                 \
                    x0 += ((VT){0} + a0[p]) * b0; x1 += ((VT){0} + a1[p]) * b0;                 \
                    x2 += ((VT){0} + a2[p]) * b0; x3 += ((VT){0} + a3[p]) * b0;                 \
                }                                                                               \
                memcpy(c0 + j, &x0, sizeof(VT)); memcpy(c1 + j, &x1, sizeof(VT));               \
                memcpy(c2 + j, &x2, sizeof(VT)); memcpy(c3 + j, &x3, sizeof(VT));               \
            }                                                                                   \
        }                                                                                       \
    }

/* exp(x - sub): Cephes-style range reduction x = n ln2 + r, |r| <= ln2/2, and
 * a degree-6 polynomial; ~1-2 ulp.  Arguments below -87.33 (ln 2^-126, and
 * -inf) give exactly 0; NaN gives NaN (it must reach O and LSE, as in torch).
 * n is taken from the bits of x log2e + 1.5 * 2^23 (round to nearest), so no
 * float -> int conversion ever sees a NaN. */
#define FATTN_EXP_C1 0.693359375f
#define FATTN_EXP_C2 -2.12194440e-4f
#define FATTN_EXP_LO -87.3365479f
#define FATTN_DEFINE_EXP(NAME, ATTR, VT, VI, W)                                                 \
    ATTR static float NAME(float *x, int n, float sub) {                                        \
        VT acc = (VT){0};                                                                       \
        const VT lo = (VT){0} + FATTN_EXP_LO, magic = (VT){0} + 12582912.0f;                    \
        VI magic_bits;                                                                          \
        memcpy(&magic_bits, &magic, sizeof magic_bits);                                         \
        int i = 0;                                                                              \
        for (; i < n; i += (W)) {                                                               \
            VT v;                                                                               \
            int rem = n - i;                                                                    \
            if (rem >= (W)) memcpy(&v, x + i, sizeof(VT));                                      \
            else {                                                                              \
                float tmp[W];                                                                   \
                for (int t = 0; t < (W); t++) tmp[t] = t < rem ? x[i + t] : -INFINITY;          \
                memcpy(&v, tmp, sizeof(VT));                                                    \
            }                                                                                   \
            v = v - sub;                                                                        \
            VI under = v < lo;                       /* -1 below the range; 0 for NaN */        \
            VI vb, lb;                                                                          \
            memcpy(&vb, &v, sizeof vb);                                                         \
            memcpy(&lb, &lo, sizeof lb);                                                        \
            vb = (vb & ~under) | (lb & under);                                                  \
            VT vc;                                                                              \
            memcpy(&vc, &vb, sizeof vc);                                                        \
            VT kf = vc * 1.44269504088896341f + magic;                                          \
            VI e;                                                                               \
            memcpy(&e, &kf, sizeof e);                                                          \
            e = (e - magic_bits + 127) << 23;                                                   \
            VT fx = kf - magic;                                                                 \
            VT r = vc - fx * FATTN_EXP_C1;                                                      \
            r = r - fx * FATTN_EXP_C2;                                                          \
            VT r2 = r * r;                                                                      \
            VT y = 1.9875691500E-4f * r + 1.3981999507E-3f;                                     \
            y = y * r + 8.3334519073E-3f;                                                       \
            y = y * r + 4.1665795894E-2f;                                                       \
            y = y * r + 1.6666665459E-1f;                                                       \
            y = y * r + 5.0000001201E-1f;                                                       \
            y = y * r2 + r + 1.0f;                                                              \
            VT pw;                                                                              \
            memcpy(&pw, &e, sizeof pw);                                                         \
            y = y * pw;                                                                         \
            VI yb;                                                                              \
            memcpy(&yb, &y, sizeof yb);                                                         \
            yb &= ~under;                                                                       \
            memcpy(&y, &yb, sizeof y);                                                          \
            acc += y;                                                                           \
            if (rem >= (W)) memcpy(x + i, &y, sizeof(VT));                                      \
            else {                                                                              \
                float tmp[W];                                                                   \
                memcpy(tmp, &y, sizeof(VT));                                                    \
                for (int t = 0; t < rem; t++) x[i + t] = tmp[t];                                \
            }                                                                                   \
        }                                                                                       \
        float lanes[W], s = 0.0f;                                                               \
        memcpy(lanes, &acc, sizeof(VT));                                                        \
        for (int t = 0; t < (W); t++) s += lanes[t];                                            \
        return s;                                                                               \
    }

FATTN_DEFINE_GEMM(gemm_generic, , v4f, 4)
FATTN_DEFINE_EXP(exp_generic, , v4f, v4i, 4)

#ifdef FATTN_X86_DISPATCH
#define FATTN_ATTR_AVX2 __attribute__((target("avx2,fma")))
#define FATTN_ATTR_AVX512 __attribute__((target("avx512f,avx2,fma")))
FATTN_DEFINE_GEMM(gemm_avx2, FATTN_ATTR_AVX2, v8f, 8)
FATTN_DEFINE_EXP(exp_avx2, FATTN_ATTR_AVX2, v8f, v8i, 8)
FATTN_DEFINE_GEMM(gemm_avx512, FATTN_ATTR_AVX512, v16f, 16)
FATTN_DEFINE_EXP(exp_avx512, FATTN_ATTR_AVX512, v16f, v16i, 16)
#endif

int fattn_cpu_fwd_kernel_named(const char *isa, fattn_fwd_kernel *out) {
    const fattn_fwd_kernel *k = NULL;
    if (!strcmp(isa, "scalar")) k = &fattn_fwd_kernel_scalar;
    else if (!strcmp(isa, "generic")) k = &fattn_fwd_kernel_generic;
#ifdef FATTN_FWD_X86
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (!strcmp(isa, "avx2") && avx2) k = &fattn_fwd_kernel_avx2;
    else if (!strcmp(isa, "avx2w16") && avx2) k = &fattn_fwd_kernel_avx2w16;
    else if (!strcmp(isa, "avx512") && __builtin_cpu_supports("avx512f")) k = &fattn_fwd_kernel_avx512;
#endif
    if (!k) return -1;
    *out = *k;
    return 0;
}

fattn_cpu_kernels fattn_cpu_kernels_get(void) {
    fattn_cpu_kernels k;
    k.gemm = gemm_generic;
    k.exp_sub = exp_generic;
    k.isa = "generic";
    k.fwd = fattn_fwd_kernel_generic;
#ifdef FATTN_X86_DISPATCH
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        k.gemm = gemm_avx512;
        k.exp_sub = exp_avx512;
        k.isa = "avx512";
    } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        k.gemm = gemm_avx2;
        k.exp_sub = exp_avx2;
        k.isa = "avx2";
    }
#endif
#ifdef FATTN_FWD_X86
    if (fattn_cpu_fwd_kernel_named("avx512", &k.fwd) != 0)
        fattn_cpu_fwd_kernel_named("avx2", &k.fwd);
#endif
    const char *want = getenv("FATTN_CPU_ISA");
    if (want && *want) fattn_cpu_fwd_kernel_named(want, &k.fwd);
    return k;
}
