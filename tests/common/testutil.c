/* testutil.c - see testutil.h. */
#include "common/testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/half.h"

int tu_failures = 0;

int tu_expect_le_at(const char *file, int line, double value, double tol, const char *what) {
    int ok = value <= tol; /* false for NaN */
    printf("  [%s] %s: %.3e (tol %.1e)\n", ok ? "ok" : "FAIL", what, value, tol);
    if (!ok) {
        tu_failures++;
        fprintf(stderr, "%s:%d: %s: %.6e exceeds %.1e\n", file, line, what, value, tol);
    }
    fflush(stdout);
    return ok;
}

int tu_finish(const char *test_name) {
    if (tu_failures) {
        printf("%s: %d check(s) FAILED\n", test_name, tu_failures);
        return 1;
    }
    printf("%s: all checks passed\n", test_name);
    return 0;
}

/* ---- random ---------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int tu_varlen_max(const int32_t *cu, int batch) {
    int m = 0;
    for (int b = 0; b < batch; b++)
        if (cu[b + 1] - cu[b] > m) m = cu[b + 1] - cu[b];
    return m;
}

int tu_seed(void) {
    const char *env = getenv("FATTN_TEST_SEED");
    int seed;
    if (env && *env && strcmp(env, "random") != 0) {
        seed = (int)(strtoul(env, NULL, 0) & 0x7fffffffu);
        printf("seed %d (from FATTN_TEST_SEED)\n", seed);
    } else if (env && *env) {
        struct timespec ts;
        timespec_get(&ts, TIME_UTC);
        uint64_t x = (uint64_t)ts.tv_sec * 1000000007ull + (uint64_t)ts.tv_nsec;
        seed = (int)(splitmix64(&x) & 0x7fffffffu);
        printf("seed %d (FATTN_TEST_SEED=random): rerun with FATTN_TEST_SEED=%d to reproduce\n", seed,
               seed);
    } else {
        seed = TU_DEFAULT_SEED;
        printf("seed %d (the default; FATTN_TEST_SEED=N or =random draws other inputs)\n", seed);
    }
    fflush(stdout);
    return seed;
}

void tu_rng_init(tu_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t tu_rng_u64(tu_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double tu_rng_uniform(tu_rng *r) { return (double)(tu_rng_u64(r) >> 11) * 0x1.0p-53; }

double tu_rng_normal(tu_rng *r) {
    double u1 = tu_rng_uniform(r), u2 = tu_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}

void tu_fill_normal(tu_rng *r, double *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = tu_rng_normal(r);
}

/* ---- numbers ----------------------------------------------------------------- */

void *tu_malloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "test: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

void tu_poison(void *p, size_t bytes) { memset(p, 0xFF, bytes); }

void tu_to_dtype(const double *src, size_t n, fattn_dtype dt, void *dst) {
    for (size_t i = 0; i < n; i++) {
        float f = (float)src[i];
        switch (dt) {
        case FATTN_DTYPE_F32: ((float *)dst)[i] = f; break;
        case FATTN_DTYPE_F16: ((uint16_t *)dst)[i] = fattn_f32_to_f16(f); break;
        case FATTN_DTYPE_BF16: ((uint16_t *)dst)[i] = fattn_f32_to_bf16(f); break;
        case FATTN_DTYPE_E4M3: ((uint8_t *)dst)[i] = fattn_f32_to_e4m3(f); break;
        }
    }
}

void tu_from_dtype(const void *src, size_t n, fattn_dtype dt, double *dst) {
    for (size_t i = 0; i < n; i++) {
        switch (dt) {
        case FATTN_DTYPE_F32: dst[i] = ((const float *)src)[i]; break;
        case FATTN_DTYPE_F16: dst[i] = fattn_f16_to_f32(((const uint16_t *)src)[i]); break;
        case FATTN_DTYPE_BF16: dst[i] = fattn_bf16_to_f32(((const uint16_t *)src)[i]); break;
        case FATTN_DTYPE_E4M3: dst[i] = fattn_e4m3_to_f32(((const uint8_t *)src)[i]); break;
        default: dst[i] = NAN; break;
        }
    }
}

void tu_round_to(double *x, size_t n, fattn_dtype dt) {
    for (size_t i = 0; i < n; i++) {
        unsigned char tmp[4];
        tu_to_dtype(&x[i], 1, dt, tmp);
        tu_from_dtype(tmp, 1, dt, &x[i]);
    }
}

double tu_rel_err(const double *x, const double *ref, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) {
            if (x[i] == ref[i]) continue; /* same infinity */
            return INFINITY;
        }
        double d = x[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

double tu_max_row_rel_err(const double *x, const double *ref, size_t count, size_t width,
                          size_t *worst) {
    double m = 0.0;
    size_t at = 0;
    for (size_t r = 0; width && r < count / width; r++) {
        double e = tu_rel_err(x + r * width, ref + r * width, width);
        if (isnan(e)) e = INFINITY;
        if (e > m) m = e, at = r;
    }
    if (worst) *worst = at;
    return m;
}

double tu_max_abs_err(const double *x, const double *ref, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (x[i] == ref[i]) continue; /* includes equal infinities */
        double d = fabs(x[i] - ref[i]);
        if (!(d <= m)) m = isnan(d) ? INFINITY : d;
    }
    return m;
}

size_t tu_count_nonfinite(const double *x, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += !isfinite(x[i]);
    return c;
}

/* ---- tensors ---------------------------------------------------------------- */

static size_t tt_index(const tu_tensor *x, size_t b, size_t s, size_t h) {
    return (size_t)((int64_t)b * x->t.stride_batch + (int64_t)s * x->t.stride_seq +
                    (int64_t)h * x->t.stride_head);
}

void tu_tensor_alloc(tu_tensor *x, fattn_dtype dt, int batch, int seq, int heads, int dim,
                     tu_layout layout, int scale_block) {
    memset(x, 0, sizeof *x);
    x->batch = batch;
    x->seq = seq;
    x->heads = heads;
    x->dim = dim;
    x->layout = layout;
    x->count = (size_t)batch * (size_t)seq * (size_t)heads * (size_t)dim;
    x->bytes = x->count * fattn_dtype_size(dt);
    x->t.data = tu_malloc(x->bytes);
    x->t.dtype = dt;
    if (layout == TU_BSHD) {
        x->t.stride_head = dim;
        x->t.stride_seq = (int64_t)heads * dim;
        x->t.stride_batch = (int64_t)seq * heads * dim;
    } else {
        x->t.stride_seq = dim;
        x->t.stride_head = (int64_t)seq * dim;
        x->t.stride_batch = (int64_t)heads * seq * dim;
    }
    if (dt == FATTN_DTYPE_E4M3) {
        int sb = scale_block >= 1 ? scale_block : 1;
        int nb = (seq + sb - 1) / sb;
        x->nscale = (size_t)batch * heads * (size_t)nb;
        x->t.scale = (float *)tu_malloc(sizeof(float) * (x->nscale ? x->nscale : 1));
        x->t.scale_block = sb;
        for (size_t i = 0; i < x->nscale; i++) x->t.scale[i] = 1.0f;
    }
    tu_tensor_poison(x);
}

void tu_tensor_free(tu_tensor *x) {
    free(x->t.data);
    free(x->t.scale);
    memset(x, 0, sizeof *x);
}

void tu_tensor_poison(tu_tensor *x) { tu_poison(x->t.data, x->bytes); }

fattn_problem tu_problem(int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv, int head_dim,
                         int head_dim_v, int causal, const int32_t *cu_seqlens_q, const int32_t *cu_seqlens_k) {
    fattn_problem p;
    memset(&p, 0, sizeof p);
    p.batch = batch;
    p.seqlen_q = seqlen_q;
    p.seqlen_k = seqlen_k;
    p.heads_q = heads_q;
    p.heads_kv = heads_kv;
    p.head_dim = head_dim;
    p.head_dim_v = head_dim_v;
    p.causal = causal;
    p.cu_seqlens_q = cu_seqlens_q;
    p.cu_seqlens_k = cu_seqlens_k;
    return p;
}

void tu_tensor_set(tu_tensor *x, const double *src, double *held) {
    const size_t es = fattn_dtype_size(x->t.dtype);
    const int D = x->dim;
    if (x->t.dtype == FATTN_DTYPE_E4M3) {
        const int sb = x->t.scale_block, nb = (x->seq + sb - 1) / sb;
        for (int b = 0; b < x->batch; b++)
            for (int h = 0; h < x->heads; h++)
                for (int blk = 0; blk < nb; blk++) {
                    double amax = 0.0;
                    for (int s = blk * sb; s < x->seq && s < (blk + 1) * sb; s++)
                        for (int d = 0; d < D; d++) {
                            double v = fabs(src[(((size_t)b * x->seq + s) * x->heads + h) * D + d]);
                            if (v > amax) amax = v;
                        }
                    float sc = amax > 0.0 ? (float)(amax / 448.0) : 1.0f;
                    if (amax > 0.0 && !(sc >= 0x1p-126f)) sc = 0x1p-126f; /* fattn_quantize's floor */
                    x->t.scale[((size_t)b * x->heads + h) * nb + blk] = sc;
                }
    }
    for (int b = 0; b < x->batch; b++)
        for (int s = 0; s < x->seq; s++)
            for (int h = 0; h < x->heads; h++) {
                const double *row = src + (((size_t)b * x->seq + s) * x->heads + h) * D;
                unsigned char *dst = (unsigned char *)x->t.data + tt_index(x, b, s, h) * es;
                if (x->t.dtype == FATTN_DTYPE_E4M3) {
                    const int sb = x->t.scale_block, nb = (x->seq + sb - 1) / sb;
                    float sc = x->t.scale[((size_t)b * x->heads + h) * nb + s / sb];
                    for (int d = 0; d < D; d++) dst[d] = fattn_f32_to_e4m3((float)(row[d] / sc));
                } else {
                    tu_to_dtype(row, (size_t)D, x->t.dtype, dst);
                }
            }
    if (held) tu_tensor_get(x, held);
}

void tu_tensor_get(const tu_tensor *x, double *dst) {
    const size_t es = fattn_dtype_size(x->t.dtype);
    const int D = x->dim;
    for (int b = 0; b < x->batch; b++)
        for (int s = 0; s < x->seq; s++)
            for (int h = 0; h < x->heads; h++) {
                double *row = dst + (((size_t)b * x->seq + s) * x->heads + h) * D;
                const unsigned char *p = (const unsigned char *)x->t.data + tt_index(x, b, s, h) * es;
                tu_from_dtype(p, (size_t)D, x->t.dtype, row);
                if (x->t.dtype == FATTN_DTYPE_E4M3) {
                    const int sb = x->t.scale_block, nb = (x->seq + sb - 1) / sb;
                    double sc = x->t.scale[((size_t)b * x->heads + h) * nb + s / sb];
                    for (int d = 0; d < D; d++) row[d] *= sc;
                }
            }
}
