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

#define GT(name) gemm_generic_##name
#define GT_ATTR
#define GT_VT v4f
#define GT_W 4
#include "cpu/gemm_tmpl.h"
#undef GT
#undef GT_ATTR
#undef GT_VT
#undef GT_W
FATTN_DEFINE_EXP(exp_generic, , v4f, v4i, 4)

#ifdef FATTN_X86_DISPATCH
#define FATTN_ATTR_AVX2 __attribute__((target("avx2,fma")))
#define FATTN_ATTR_AVX512 __attribute__((target("avx512f,avx2,fma")))
#define GT(name) gemm_avx2_##name
#define GT_ATTR FATTN_ATTR_AVX2
#define GT_VT v8f
#define GT_W 8
#include "cpu/gemm_tmpl.h"
#undef GT
#undef GT_ATTR
#undef GT_VT
#undef GT_W
FATTN_DEFINE_EXP(exp_avx2, FATTN_ATTR_AVX2, v8f, v8i, 8)
#define GT(name) gemm_avx512_##name
#define GT_ATTR FATTN_ATTR_AVX512
#define GT_VT v16f
#define GT_W 16
#include "cpu/gemm_tmpl.h"
#undef GT
#undef GT_ATTR
#undef GT_VT
#undef GT_W
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

/* The backward's kernels of instance `isa` into *k, if this CPU runs them. */
static int bwd_instance(const char *isa, fattn_cpu_kernels *k) {
    if (!strcmp(isa, "generic")) {
        k->gemm = gemm_generic_gemm;
        k->gemm_tn = gemm_generic_gemm_tn;
        k->exp_sub = exp_generic;
        k->isa = "generic";
        return 0;
    }
#ifdef FATTN_X86_DISPATCH
    __builtin_cpu_init();
    if (!strcmp(isa, "avx2") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        k->gemm = gemm_avx2_gemm;
        k->gemm_tn = gemm_avx2_gemm_tn;
        k->exp_sub = exp_avx2;
        k->isa = "avx2";
        return 0;
    }
    if (!strcmp(isa, "avx512") && __builtin_cpu_supports("avx512f")) {
        k->gemm = gemm_avx512_gemm;
        k->gemm_tn = gemm_avx512_gemm_tn;
        k->exp_sub = exp_avx512;
        k->isa = "avx512";
        return 0;
    }
#endif
    return -1;
}

int fattn_cpu_bwd_kernels_named(const char *isa, fattn_cpu_kernels *out) {
    fattn_cpu_kernels k = fattn_cpu_kernels_get(NULL);
    if (bwd_instance(isa, &k) != 0) return -1;
    *out = k;
    return 0;
}

fattn_cpu_kernels fattn_cpu_kernels_get(const char *fwd_isa) {
    fattn_cpu_kernels k;
    if (bwd_instance("avx512", &k) != 0 && bwd_instance("avx2", &k) != 0) bwd_instance("generic", &k);
    k.fwd = fattn_fwd_kernel_generic;
#ifdef FATTN_FWD_X86
    if (fattn_cpu_fwd_kernel_named("avx512", &k.fwd) != 0)
        fattn_cpu_fwd_kernel_named("avx2", &k.fwd);
#endif
    if (fwd_isa) fattn_cpu_fwd_kernel_named(fwd_isa, &k.fwd);
    return k;
}

const char fattn_cpu_isa_names[] = "scalar, generic, avx2, avx2w16, avx512";

int fattn_cpu_isa_lookup(const char *name, const char **canonical) {
    static const char *const known[] = {"scalar", "generic", "avx2", "avx2w16", "avx512"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (strcmp(name, known[i]) != 0) continue;
        fattn_fwd_kernel k;
        if (fattn_cpu_fwd_kernel_named(known[i], &k) != 0) return 2;
        *canonical = known[i];
        return 0;
    }
    return 1;
}
