/* tool.c - helpers shared by the `fattn` subcommands (see tool.h). */
#define _POSIX_C_SOURCE 200809L
#include "tool.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "common/half.h"

#ifdef FATTN_WITH_CUDA
#include <cuda_runtime.h>
#endif

void tool_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "%s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see '%s --help')\n", cmd);
    exit(TOOL_EXIT_USAGE);
}

void tool_die(const char *cmd, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "%s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

const char *tool_opt(const char *cmd, int argc, char **argv, int *i, const char *name) {
    const char *arg = argv[*i];
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0) return NULL;
    if (arg[n] == '=') return arg + n + 1;
    if (arg[n] != '\0') return NULL;
    if (*i + 1 >= argc) tool_usage_error(cmd, "option %s needs a value", name);
    *i += 1;
    return argv[*i];
}

int32_t tool_parse_int(const char *cmd, const char *opt, const char *s, int32_t min, int32_t max) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end != '\0')
        tool_usage_error(cmd, "%s: '%s' is not an integer", opt, s);
    if (v < min || v > max)
        tool_usage_error(cmd, "%s: %lld is out of range [%d, %d]", opt, v, (int)min, (int)max);
    return (int32_t)v;
}

uint64_t tool_parse_u64(const char *cmd, const char *opt, const char *s) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end != '\0' || s[0] == '-')
        tool_usage_error(cmd, "%s: '%s' is not a non-negative integer", opt, s);
    return (uint64_t)v;
}

fattn_dtype tool_parse_dtype(const char *cmd, const char *s) {
    if (!strcmp(s, "f32") || !strcmp(s, "fp32")) return FATTN_DTYPE_F32;
    if (!strcmp(s, "f16") || !strcmp(s, "fp16")) return FATTN_DTYPE_F16;
    if (!strcmp(s, "bf16")) return FATTN_DTYPE_BF16;
    tool_usage_error(cmd, "--dtype: '%s' is not one of f32, f16, bf16", s);
}

fattn_backend tool_parse_backend(const char *cmd, const char *s) {
    if (!strcmp(s, "auto")) return FATTN_BACKEND_AUTO;
    if (!strcmp(s, "cpu")) return FATTN_BACKEND_CPU;
    if (!strcmp(s, "cuda") || !strcmp(s, "gpu")) return FATTN_BACKEND_CUDA;
    tool_usage_error(cmd, "--backend: '%s' is not one of auto, cpu, cuda", s);
}

int tool_parse_list(const char *cmd, const char *opt, const char *s, int32_t *out, int max, int32_t min) {
    int n = 0;
    const char *p = s;
    char item[32];
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == 0 || len >= sizeof item) tool_usage_error(cmd, "%s: bad list '%s'", opt, s);
        if (n == max) tool_usage_error(cmd, "%s: more than %d values", opt, max);
        memcpy(item, p, len);
        item[len] = '\0';
        out[n++] = tool_parse_int(cmd, opt, item, min, INT32_MAX);
        p += len;
        if (*p == ',') p++;
    }
    if (n == 0) tool_usage_error(cmd, "%s: empty list", opt);
    return n;
}

void tool_parse_heads(const char *cmd, const char *opt, const char *s, int32_t *heads_q,
                      int32_t *heads_kv) {
    const char *slash = strchr(s, '/');
    char item[32];
    if (!slash) {
        *heads_q = *heads_kv = tool_parse_int(cmd, opt, s, 1, INT32_MAX);
        return;
    }
    size_t len = (size_t)(slash - s);
    if (len == 0 || len >= sizeof item) tool_usage_error(cmd, "%s: '%s' is not Q or Q/KV", opt, s);
    memcpy(item, s, len);
    item[len] = '\0';
    *heads_q = tool_parse_int(cmd, opt, item, 1, INT32_MAX);
    *heads_kv = tool_parse_int(cmd, opt, slash + 1, 1, INT32_MAX);
    if (*heads_q % *heads_kv)
        tool_usage_error(cmd, "%s: query heads %d are not a multiple of kv heads %d", opt,
                         (int)*heads_q, (int)*heads_kv);
}

void tool_varlen_lens(const char *cmd, int nq, int nk, const int32_t *lens_q, int32_t *lens_k) {
    if (nk && !nq) tool_usage_error(cmd, "--varlen-k needs --varlen");
    if (nk && nk != nq) tool_usage_error(cmd, "--varlen-k has %d lengths, --varlen %d", nk, nq);
    if (nq && !nk) memcpy(lens_k, lens_q, sizeof(int32_t) * (size_t)nq);
}

void tool_lens_text(char *buf, size_t size, const int32_t *lens, int n) {
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && k + 16 < size; i++) {
        if (k > 60) {
            snprintf(buf + k, size - k, ",... (%d)", n);
            return;
        }
        k += (size_t)snprintf(buf + k, size - k, "%s%d", i ? "," : "", (int)lens[i]);
    }
}

const char *tool_backend_name(fattn_backend b) {
    return b == FATTN_BACKEND_CUDA ? "cuda" : b == FATTN_BACKEND_CPU ? "cpu" : "auto";
}

fattn_ctx *tool_ctx(const char *cmd, fattn_backend backend, int threads) {
    fattn_ctx *ctx = NULL;
    fattn_status st = fattn_ctx_create(&ctx, backend, 0);
    if (st != FATTN_OK)
        tool_die(cmd, "cannot create a %s context: %s: %s", tool_backend_name(backend),
                 fattn_status_string(st), fattn_last_error(NULL));
    if (threads > 0) {
        st = fattn_ctx_set_threads(ctx, threads);
        if (st != FATTN_OK) tool_die(cmd, "set_threads: %s", fattn_last_error(ctx));
    }
    return ctx;
}

static int on_gpu(const fattn_ctx *ctx) { return fattn_ctx_backend(ctx) == FATTN_BACKEND_CUDA; }

#ifdef FATTN_WITH_CUDA
#define CUDA_OK(cmd, call)                                                                        \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess)                                                                    \
            tool_die(cmd, "%s:%d: %s: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_));    \
    } while (0)
#endif

void *tool_alloc(const char *cmd, const fattn_ctx *ctx, size_t bytes) {
    void *p = NULL;
    if (bytes == 0) bytes = 1;
    if (on_gpu(ctx)) {
#ifdef FATTN_WITH_CUDA
        CUDA_OK(cmd, cudaMalloc(&p, bytes));
#endif
    } else {
        p = malloc(bytes);
    }
    if (!p) tool_die(cmd, "cannot allocate %zu bytes", bytes);
    return p;
}

void tool_free(const fattn_ctx *ctx, void *p) {
    if (!p) return;
    if (on_gpu(ctx)) {
#ifdef FATTN_WITH_CUDA
        cudaFree(p);
#endif
    } else {
        free(p);
    }
}

void tool_upload(const char *cmd, const fattn_ctx *ctx, void *dst, const void *src, size_t bytes) {
    (void)cmd;
    if (on_gpu(ctx)) {
#ifdef FATTN_WITH_CUDA
        CUDA_OK(cmd, cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
#endif
    } else {
        memcpy(dst, src, bytes);
    }
}

void tool_download(const char *cmd, const fattn_ctx *ctx, void *dst, const void *src, size_t bytes) {
    (void)cmd;
    if (on_gpu(ctx)) {
#ifdef FATTN_WITH_CUDA
        CUDA_OK(cmd, cudaDeviceSynchronize());
        CUDA_OK(cmd, cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
#endif
    } else {
        memcpy(dst, src, bytes);
    }
}

void tool_poison(const char *cmd, const fattn_ctx *ctx, void *p, size_t bytes) {
    (void)cmd;
    if (on_gpu(ctx)) {
#ifdef FATTN_WITH_CUDA
        CUDA_OK(cmd, cudaMemset(p, 0xFF, bytes));
#endif
    } else {
        memset(p, 0xFF, bytes); /* NaN in every float format */
    }
}

/* splitmix64: small, seedable, good enough for test inputs. */
static uint64_t mix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uniform01(uint64_t *s) { return ((double)(mix64(s) >> 11) + 0.5) * 0x1.0p-53; }

void tool_fill_random(void *dst, fattn_dtype dtype, size_t n, uint64_t seed) {
    uint64_t s = seed * 0x2545f4914f6cdd1dull + 1;
    for (size_t i = 0; i < n; i += 2) {
        double u1 = uniform01(&s), u2 = uniform01(&s);
        double r = sqrt(-2.0 * log(u1));
        float x[2] = {(float)(r * cos(6.283185307179586 * u2)),
                      (float)(r * sin(6.283185307179586 * u2))};
        for (size_t j = 0; j < 2 && i + j < n; j++) {
            switch (dtype) {
            case FATTN_DTYPE_F16: ((uint16_t *)dst)[i + j] = fattn_f32_to_f16(x[j]); break;
            case FATTN_DTYPE_BF16: ((uint16_t *)dst)[i + j] = fattn_f32_to_bf16(x[j]); break;
            default: ((float *)dst)[i + j] = x[j]; break;
            }
        }
    }
}

double tool_load(const void *p, fattn_dtype dtype, size_t i) {
    switch (dtype) {
    case FATTN_DTYPE_F16: return fattn_f16_to_f32(((const uint16_t *)p)[i]);
    case FATTN_DTYPE_BF16: return fattn_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double tool_median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* fattn_fwd, or with fp8 fattn_fwd_fp8 (quantise, then attend) */
static void fwd_or_die(const char *cmd, fattn_ctx *ctx, const fattn_fwd_args *a,
                       const fattn_fp8_options *fp8) {
    fattn_status st = fp8 ? fattn_fwd_fp8(ctx, a, fp8) : fattn_fwd(ctx, a);
    if (st != FATTN_OK)
        tool_die(cmd, "%s: %s: %s", fp8 ? "fattn_fwd_fp8" : "fattn_fwd", fattn_status_string(st),
                 fattn_last_error(ctx));
}

double tool_time_fwd(const char *cmd, fattn_ctx *ctx, const fattn_fwd_args *a, int warmup,
                     int iters) {
    return tool_time_fwd_fp8(cmd, ctx, a, NULL, warmup, iters);
}

/* The median over `iters` rounds of one round's time: the n calls a[0..n-1]
 * back to back (warmup rounds first). */
static double time_rounds(const char *cmd, fattn_ctx *ctx, const fattn_fwd_args *a, int n,
                          const fattn_fp8_options *fp8, int warmup, int iters) {
    double *t = (double *)malloc(sizeof(double) * (size_t)iters);
    if (!t) tool_die(cmd, "out of memory");
    for (int i = 0; i < warmup; i++)
        for (int c = 0; c < n; c++) fwd_or_die(cmd, ctx, &a[c], fp8);
    if (on_gpu(ctx)) {
#ifdef FATTN_WITH_CUDA
        cudaStream_t stream = NULL; /* the tool never sets a stream */
        cudaEvent_t e0, e1;
        CUDA_OK(cmd, cudaEventCreate(&e0));
        CUDA_OK(cmd, cudaEventCreate(&e1));
        for (int i = 0; i < iters; i++) {
            CUDA_OK(cmd, cudaEventRecord(e0, stream));
            for (int c = 0; c < n; c++) fwd_or_die(cmd, ctx, &a[c], fp8);
            CUDA_OK(cmd, cudaEventRecord(e1, stream));
            CUDA_OK(cmd, cudaEventSynchronize(e1));
            float ms = 0;
            CUDA_OK(cmd, cudaEventElapsedTime(&ms, e0, e1));
            t[i] = ms;
        }
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
#endif
    } else {
        for (int i = 0; i < iters; i++) {
            double t0 = now_ms();
            for (int c = 0; c < n; c++) fwd_or_die(cmd, ctx, &a[c], fp8);
            t[i] = now_ms() - t0;
        }
    }
    double m = tool_median(t, iters);
    free(t);
    return m;
}

double tool_time_fwd_fp8(const char *cmd, fattn_ctx *ctx, const fattn_fwd_args *a, const fattn_fp8_options *fp8,
                         int warmup, int iters) {
    return time_rounds(cmd, ctx, a, 1, fp8, warmup, iters);
}

double tool_time_fwd_calls(const char *cmd, fattn_ctx *ctx, const fattn_fwd_args *a, int ncalls,
                           int warmup, int iters) {
    return time_rounds(cmd, ctx, a, ncalls, NULL, warmup, iters);
}

double tool_fwd_flops(const fattn_problem *p) {
    /* 2 for QK^T over head_dim, 2 for PV over head_dim_v (0: head_dim) */
    const double dv = p->head_dim_v ? p->head_dim_v : p->head_dim;
    double f = 2.0 * p->batch * p->heads_q * (double)p->seqlen_q * p->seqlen_k * (p->head_dim + dv);
    if (p->causal && p->seqlen_q == p->seqlen_k) f *= 0.5;
    return f;
}

double tool_peak_rss_mib(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return -1;
    return ru.ru_maxrss / 1024.0; /* Linux: KiB */
}

/* rows_q / rows_k: batch * seqlen, or the packed totals of a varlen batch */
static void problem_fill(const char *cmd, fattn_ctx *ctx, tool_problem *tp, const fattn_problem *p,
                         fattn_dtype dtype, uint64_t seed, size_t rows_q, size_t rows_k) {
    memset(tp, 0, sizeof *tp);
    int32_t dv = p->head_dim_v ? p->head_dim_v : p->head_dim;
    tp->nq = rows_q * p->heads_q * p->head_dim;
    tp->nk = rows_k * p->heads_kv * p->head_dim;
    tp->nv = rows_k * p->heads_kv * dv;
    tp->no = rows_q * p->heads_q * dv;
    size_t es = fattn_dtype_size(dtype);
    tp->hq = malloc(tp->nq * es);
    tp->hk = malloc(tp->nk * es);
    tp->hv = malloc(tp->nv * es);
    if (!tp->hq || !tp->hk || !tp->hv) tool_die(cmd, "cannot allocate the host inputs");
    tool_fill_random(tp->hq, dtype, tp->nq, seed * 3 + 0);
    tool_fill_random(tp->hk, dtype, tp->nk, seed * 3 + 1);
    tool_fill_random(tp->hv, dtype, tp->nv, seed * 3 + 2);

    fattn_fwd_args *a = &tp->a;
    a->p = *p;
    a->q = fattn_tensor_bshd(tool_alloc(cmd, ctx, tp->nq * es), dtype);
    a->k = fattn_tensor_bshd(tool_alloc(cmd, ctx, tp->nk * es), dtype);
    a->v = fattn_tensor_bshd(tool_alloc(cmd, ctx, tp->nv * es), dtype);
    a->o = fattn_tensor_bshd(tool_alloc(cmd, ctx, tp->no * es), dtype);
    a->lse = NULL;
    tool_upload(cmd, ctx, a->q.data, tp->hq, tp->nq * es);
    tool_upload(cmd, ctx, a->k.data, tp->hk, tp->nk * es);
    tool_upload(cmd, ctx, a->v.data, tp->hv, tp->nv * es);
    tool_poison(cmd, ctx, a->o.data, tp->no * es);
}

void tool_problem_init(const char *cmd, fattn_ctx *ctx, tool_problem *tp, const fattn_problem *p,
                       fattn_dtype dtype, uint64_t seed) {
    problem_fill(cmd, ctx, tp, p, dtype, seed, (size_t)p->batch * p->seqlen_q,
                 (size_t)p->batch * p->seqlen_k);
}

/* n int32 where ctx computes, a copy of host */
static int32_t *upload_ints(const char *cmd, const fattn_ctx *ctx, const int32_t *host, size_t n) {
    int32_t *d = (int32_t *)tool_alloc(cmd, ctx, n * sizeof(int32_t));
    tool_upload(cmd, ctx, d, host, n * sizeof(int32_t));
    return d;
}

static int32_t *host_ints(const char *cmd, size_t n) {
    int32_t *h = (int32_t *)malloc((n ? n : 1) * sizeof(int32_t));
    if (!h) tool_die(cmd, "out of memory");
    return h;
}

void tool_problem_init_varlen(const char *cmd, fattn_ctx *ctx, tool_problem *tp,
                              const fattn_problem *p, const int32_t *lens_q,
                              const int32_t *lens_k, fattn_dtype dtype, uint64_t seed) {
    const size_t nb = (size_t)p->batch;
    int32_t *cq = host_ints(cmd, nb + 1), *ck = host_ints(cmd, nb + 1);
    fattn_problem v = *p;
    v.seqlen_q = v.seqlen_k = 0;
    cq[0] = ck[0] = 0;
    for (size_t b = 0; b < nb; b++) {
        if ((int64_t)cq[b] + lens_q[b] > INT32_MAX || (int64_t)ck[b] + lens_k[b] > INT32_MAX)
            tool_die(cmd, "the varlen totals exceed int32");
        cq[b + 1] = cq[b] + lens_q[b];
        ck[b + 1] = ck[b] + lens_k[b];
        if (lens_q[b] > v.seqlen_q) v.seqlen_q = lens_q[b];
        if (lens_k[b] > v.seqlen_k) v.seqlen_k = lens_k[b];
    }
    v.cu_seqlens_q = v.cu_seqlens_k = NULL;
    /* the packed rows: a CUDA context takes the extents from these (it does
     * not read cu_seqlens on the host); a CPU context checks them */
    v.total_q = cq[nb];
    v.total_k = ck[nb];
    problem_fill(cmd, ctx, tp, &v, dtype, seed, (size_t)cq[nb], (size_t)ck[nb]);
    tp->hcu_q = cq;
    tp->hcu_k = ck;
    tp->a.p.cu_seqlens_q = upload_ints(cmd, ctx, cq, nb + 1);
    tp->a.p.cu_seqlens_k = upload_ints(cmd, ctx, ck, nb + 1);
}

void tool_problem_seqused(const char *cmd, fattn_ctx *ctx, tool_problem *tp, int32_t used) {
    const size_t nb = (size_t)tp->a.p.batch;
    int32_t *h = host_ints(cmd, nb);
    for (size_t b = 0; b < nb; b++) h[b] = used;
    free(tp->hused);
    tool_free(ctx, (void *)tp->a.seqused_k);
    tp->hused = h;
    tp->a.seqused_k = upload_ints(cmd, ctx, h, nb);
}

void tool_problem_page(const char *cmd, fattn_ctx *ctx, tool_problem *tp, int32_t page_size,
                       uint64_t seed) {
    const fattn_problem *p = &tp->a.p;
    if (tp->hcu_q || tp->htable) tool_die(cmd, "a paged cache of a varlen or paged batch");
    const int64_t sk = p->seqlen_k, npg = (sk + page_size - 1) / page_size;
    const int64_t np = (int64_t)p->batch * npg;
    if (np > INT32_MAX) tool_die(cmd, "%lld pages exceed int32", (long long)np);
    const fattn_dtype dt = tp->a.k.dtype;
    const size_t es = fattn_dtype_size(dt);
    const int32_t dv = p->head_dim_v ? p->head_dim_v : p->head_dim;
    const size_t rk = (size_t)p->heads_kv * p->head_dim * es, rv = (size_t)p->heads_kv * dv * es;

    /* the block table: a permutation of the pages (Fisher-Yates) */
    int32_t *table = host_ints(cmd, (size_t)np);
    for (int64_t i = 0; i < np; i++) table[i] = (int32_t)i;
    uint64_t rs = seed * 0x9e3779b97f4a7c15ull + 0x9a9e;
    for (int64_t i = np - 1; i > 0; i--) {
        int64_t j = (int64_t)(mix64(&rs) % (uint64_t)(i + 1));
        int32_t t = table[i];
        table[i] = table[j];
        table[j] = t;
    }
    const size_t pool_rows = (size_t)np * (size_t)page_size;
    char *pk = (char *)calloc(pool_rows ? pool_rows : 1, rk);
    char *pv = (char *)calloc(pool_rows ? pool_rows : 1, rv);
    if (!pk || !pv) tool_die(cmd, "cannot allocate the host page pools");
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t i = 0; i < npg; i++) {
            const int64_t k0 = i * page_size;
            const int64_t n = sk - k0 < page_size ? sk - k0 : page_size;
            const size_t dst = (size_t)table[b * npg + i] * (size_t)page_size;
            const size_t src = (size_t)(b * sk + k0);
            memcpy(pk + dst * rk, (const char *)tp->hk + src * rk, (size_t)n * rk);
            memcpy(pv + dst * rv, (const char *)tp->hv + src * rv, (size_t)n * rv);
        }
    tool_free(ctx, tp->a.k.data);
    tool_free(ctx, tp->a.v.data);
    tp->a.k = fattn_tensor_bshd(tool_alloc(cmd, ctx, pool_rows * rk), dt);
    tp->a.v = fattn_tensor_bshd(tool_alloc(cmd, ctx, pool_rows * rv), dt);
    tool_upload(cmd, ctx, tp->a.k.data, pk, pool_rows * rk);
    tool_upload(cmd, ctx, tp->a.v.data, pv, pool_rows * rv);
    free(pk);
    free(pv);
    tp->htable = table;
    tp->a.block_table = upload_ints(cmd, ctx, table, (size_t)np);
    tp->a.page_size = page_size;
    tp->a.num_pages = (int32_t)np;
    tp->a.max_pages_per_seq = (int32_t)npg;
}

void tool_problem_free(fattn_ctx *ctx, tool_problem *tp) {
    tool_free(ctx, tp->a.q.data);
    tool_free(ctx, tp->a.k.data);
    tool_free(ctx, tp->a.v.data);
    tool_free(ctx, tp->a.o.data);
    tool_free(ctx, (void *)tp->a.p.cu_seqlens_q);
    tool_free(ctx, (void *)tp->a.p.cu_seqlens_k);
    tool_free(ctx, (void *)tp->a.seqused_k);
    tool_free(ctx, (void *)tp->a.block_table);
    free(tp->hq);
    free(tp->hk);
    free(tp->hv);
    free(tp->hcu_q);
    free(tp->hcu_k);
    free(tp->hused);
    free(tp->htable);
    memset(tp, 0, sizeof *tp);
}

void tool_problem_seq(const tool_problem *tp, int64_t b, int64_t *qlen, int64_t *klen,
                      int64_t *used) {
    const fattn_problem *p = &tp->a.p;
    *qlen = tp->hcu_q ? (int64_t)tp->hcu_q[b + 1] - tp->hcu_q[b] : p->seqlen_q;
    *klen = tp->hcu_k ? (int64_t)tp->hcu_k[b + 1] - tp->hcu_k[b] : p->seqlen_k;
    *used = tp->hused && tp->hused[b] < *klen ? tp->hused[b] : *klen;
    if (*used < 0) *used = 0;
}

/* (query, key) pairs a sequence of ql queries and u keys computes */
static double seq_pairs(int64_t ql, int64_t u, int causal) {
    if (!causal) return (double)ql * (double)u;
    /* query i sees keys 0 .. i + u - ql (bottom-right aligned) */
    double pairs = 0;
    for (int64_t i = 0; i < ql; i++) {
        int64_t vis = i + u - ql + 1;
        if (vis > 0) pairs += (double)vis;
    }
    return pairs;
}

/* 4 heads_q head_dim x the (query, key) pairs; design: a causal sequence with
 * as many keys as queries counted as half its square (the paper's count). */
static double problem_flops(const tool_problem *tp, int design) {
    const fattn_problem *p = &tp->a.p;
    double pairs = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        int64_t ql, kl, u;
        tool_problem_seq(tp, b, &ql, &kl, &u);
        pairs += design && p->causal && ql == u ? 0.5 * (double)ql * (double)u : seq_pairs(ql, u, p->causal);
    }
    return 4.0 * p->heads_q * p->head_dim * pairs;
}

double tool_problem_flops(const tool_problem *tp) { return problem_flops(tp, 0); }

double tool_problem_design_flops(const tool_problem *tp) { return problem_flops(tp, 1); }

void tool_problem_seq_args(const char *cmd, const tool_problem *tp, int64_t b,
                           fattn_fwd_args *out) {
    const fattn_fwd_args *a = &tp->a;
    const fattn_problem *p = &a->p;
    const size_t es = fattn_dtype_size(a->q.dtype);
    const size_t dv = (size_t)(p->head_dim_v ? p->head_dim_v : p->head_dim);
    int64_t ql, kl, u;
    tool_problem_seq(tp, b, &ql, &kl, &u);
    if (tp->htable) tool_die(cmd, "a sequence of a paged batch as a call of its own");
    if (ql < 1 || u < 1)
        tool_die(cmd, "sequence %lld has %lld queries and %lld keys: no fixed-length call",
                 (long long)b, (long long)ql, (long long)u);
    const size_t q0 = (size_t)(tp->hcu_q ? tp->hcu_q[b] : b * p->seqlen_q);
    const size_t k0 = (size_t)(tp->hcu_k ? tp->hcu_k[b] : b * p->seqlen_k);
    *out = *a;
    out->p.batch = 1;
    out->p.seqlen_q = (int32_t)ql;
    out->p.seqlen_k = (int32_t)u;
    out->p.cu_seqlens_q = out->p.cu_seqlens_k = NULL;
    out->p.total_q = out->p.total_k = 0;
    out->q.data = (char *)a->q.data + q0 * (size_t)p->heads_q * (size_t)p->head_dim * es;
    out->k.data = (char *)a->k.data + k0 * (size_t)p->heads_kv * (size_t)p->head_dim * es;
    out->v.data = (char *)a->v.data + k0 * (size_t)p->heads_kv * dv * es;
    out->o.data = (char *)a->o.data + q0 * (size_t)p->heads_q * dv * es;
    out->lse = NULL;
    out->seqused_k = NULL;
}

void tool_check_rows(const char *cmd, fattn_ctx *ctx, const tool_problem *tp, int nsamples,
                     uint64_t seed, double *rel_fro, double *max_abs) {
    const fattn_problem *p = &tp->a.p;
    const fattn_dtype dt = tp->a.q.dtype;
    const int64_t D = p->head_dim, DV = p->head_dim_v ? p->head_dim_v : p->head_dim;
    const int64_t SQ = p->seqlen_q, SK = p->seqlen_k, HQ = p->heads_q, HK = p->heads_kv;
    const double scale = p->softmax_scale != 0.0f ? (double)p->softmax_scale : 1.0 / sqrt((double)D);
    size_t es = fattn_dtype_size(dt);
    void *ho = malloc(tp->no * es);
    double *s = (double *)malloc(sizeof(double) * (size_t)(SK + 1));
    double *ref = (double *)malloc(sizeof(double) * (size_t)DV);
    if (!ho || !s || !ref) tool_die(cmd, "cannot allocate the reference buffers");
    tool_download(cmd, ctx, ho, tp->a.o.data, tp->no * es);

    uint64_t rs = seed ^ 0x5eed;
    double err2 = 0, ref2 = 0, maxe = 0;
    int64_t total_q = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        int64_t ql, kl, u;
        tool_problem_seq(tp, b, &ql, &kl, &u);
        total_q += ql;
    }
    for (int n = 0; n < nsamples && total_q > 0; n++) {
        /* The first and last rows of the problem always, random rows between
         * (sequences of no queries skipped, varlen). */
        int64_t b, h, i, ql, kl, used;
        if (n == 0) {
            b = 0, h = 0;
        } else if (n == 1) {
            b = p->batch - 1, h = HQ - 1;
        } else {
            b = (int64_t)(mix64(&rs) % (uint64_t)p->batch);
            h = (int64_t)(mix64(&rs) % (uint64_t)HQ);
        }
        for (tool_problem_seq(tp, b, &ql, &kl, &used); ql == 0;
             tool_problem_seq(tp, b, &ql, &kl, &used))
            b = n == 1 ? (b + p->batch - 1) % p->batch : (b + 1) % p->batch;
        i = n == 0 ? 0 : n == 1 ? ql - 1 : (int64_t)(mix64(&rs) % (uint64_t)ql);
        /* packed row indices of query i and key 0 of sequence b */
        const int64_t qrow = tp->hcu_q ? tp->hcu_q[b] + i : b * SQ + i;
        const int64_t krow = tp->hcu_k ? tp->hcu_k[b] : b * SK;
        int64_t hk = h / (HQ / HK);
        int64_t last = p->causal ? i + used - ql : used - 1; /* last visible key */
        if (last > used - 1) last = used - 1;
        double m = -INFINITY;
        for (int64_t j = 0; j <= last; j++) {
            double acc = 0;
            size_t qo = (size_t)((qrow * HQ + h) * D);
            size_t ko = (size_t)(((krow + j) * HK + hk) * D);
            for (int64_t d = 0; d < D; d++)
                acc += tool_load(tp->hq, dt, qo + (size_t)d) * tool_load(tp->hk, dt, ko + (size_t)d);
            s[j] = acc * scale;
            if (s[j] > m) m = s[j];
        }
        double l = 0;
        for (int64_t j = 0; j <= last; j++) l += (s[j] = exp(s[j] - m));
        for (int64_t d = 0; d < DV; d++) ref[d] = 0;
        for (int64_t j = 0; j <= last; j++) {
            size_t vo = (size_t)(((krow + j) * HK + hk) * DV);
            for (int64_t d = 0; d < DV; d++) ref[d] += s[j] / l * tool_load(tp->hv, dt, vo + (size_t)d);
        }
        size_t oo = (size_t)((qrow * HQ + h) * DV);
        for (int64_t d = 0; d < DV; d++) {
            double got = tool_load(ho, dt, oo + (size_t)d);
            double e = got - ref[d];
            if (!(fabs(e) <= maxe)) maxe = isnan(e) ? INFINITY : fabs(e);
            err2 += isnan(e) ? INFINITY : e * e;
            ref2 += ref[d] * ref[d];
        }
    }
    *rel_fro = ref2 > 0 ? sqrt(err2 / ref2) : sqrt(err2);
    *max_abs = maxe;
    free(ho);
    free(s);
    free(ref);
}
