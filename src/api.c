/* api.c - the public entry points: version, contexts, and the
 * engine-independent argument check of every call before it reaches an
 * engine.  What only one engine can serve (head dims, dtypes, varlen) is that
 * engine's check (internal.h); failures are recorded through error.c, the
 * tensor helpers live in tensor.c.
 *
 * Every call works on a private copy of its arguments: defaults are resolved
 * in the copy (packed strides, head_dim_v, softmax_scale) and the caller's
 * structs and buffers are never written until every check has passed. */
#include "internal.h"
#include "cpu/kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Offsets must stay addressable in bytes (x 8 bytes per element at most, with
 * head room), so the largest element offset allowed is 2^59. */
#define FATTN_MAX_ELEMENT_OFFSET (INT64_C(1) << 59)
/* The CUDA kernels index rows (batch * heads * seqlen) with int32; the limit
 * holds on every engine, so that a call valid on one is valid on all. */
#define FATTN_MAX_ROWS (INT64_C(1) << 31)

/* Returns from the calling function when a check fails. */
#define CHECK(x)                                                                                   \
    do {                                                                                           \
        fattn_status st_ = (x);                                                                    \
        if (st_ != FATTN_OK) return st_;                                                           \
    } while (0)

/* ------------------------------------------------------------------------ */
/* Version                                                                  */
/* ------------------------------------------------------------------------ */

#define FATTN_STR2(x) #x
#define FATTN_STR(x) FATTN_STR2(x)

const char *fattn_version_string(void) {
    return FATTN_STR(FATTN_VERSION_MAJOR) "." FATTN_STR(FATTN_VERSION_MINOR) "." FATTN_STR(
        FATTN_VERSION_PATCH);
}

int fattn_version_number(void) { return FATTN_VERSION_NUMBER; }

/* ------------------------------------------------------------------------ */
/* Contexts                                                                 */
/* ------------------------------------------------------------------------ */

fattn_status fattn_ctx_create(fattn_ctx **out, fattn_backend backend, int device) {
    fattn_clear_error(NULL);
    if (!out) return fattn_fail(NULL, FATTN_ERROR_INVALID_ARGUMENT, "ctx is NULL");
    *out = NULL;
    if (backend != FATTN_BACKEND_AUTO && backend != FATTN_BACKEND_CPU &&
        backend != FATTN_BACKEND_CUDA)
        return fattn_fail(NULL, FATTN_ERROR_INVALID_ARGUMENT,
                          "backend %d is not FATTN_BACKEND_AUTO, _CPU or _CUDA", (int)backend);
    if (device < 0)
        return fattn_fail(NULL, FATTN_ERROR_INVALID_ARGUMENT, "device %d must be >= 0", device);

    fattn_backend chosen = backend;
    if (backend == FATTN_BACKEND_AUTO)
        chosen = fattn_cuda_available(device) ? FATTN_BACKEND_CUDA : FATTN_BACKEND_CPU;

    fattn_ctx *ctx = (fattn_ctx *)calloc(1, sizeof *ctx);
    if (!ctx)
        return fattn_fail(NULL, FATTN_ERROR_OUT_OF_MEMORY, "cannot allocate a context (%zu bytes)",
                          sizeof *ctx);
    ctx->backend = chosen;
    ctx->device = device;
    if (chosen == FATTN_BACKEND_CPU) {
        /* FATTN_CPU_ISA is read here, once per context, never during a call */
        const char *want = getenv("FATTN_CPU_ISA");
        if (want && *want) {
            const int r = fattn_cpu_isa_lookup(want, &ctx->cpu_isa);
            if (r != 0) {
                free(ctx);
                if (r == 1)
                    return fattn_fail(NULL, FATTN_ERROR_INVALID_ARGUMENT,
                                      "FATTN_CPU_ISA=%.64s is not a CPU forward instance (one of %s, or unset)",
                                      want, fattn_cpu_isa_names);
                return fattn_fail(NULL, FATTN_ERROR_UNSUPPORTED,
                                  "FATTN_CPU_ISA=%.64s: this CPU (or build) cannot run that instance", want);
            }
        }
    }
    if (chosen == FATTN_BACKEND_CUDA) {
        fattn_status st = fattn_cuda_ctx_init(ctx);
        if (st != FATTN_OK) {
            /* The engine wrote its reason into ctx->err; creation errors live
             * in the thread-local buffer. */
            fattn_fail(NULL, st, "%s", ctx->err[0] ? ctx->err : "CUDA context init failed");
            fattn_cuda_ctx_free(ctx);
            free(ctx);
            return st;
        }
    }
    fattn_clear_error(ctx);
    *out = ctx;
    return FATTN_OK;
}

fattn_status fattn_ctx_acquire(fattn_ctx *ctx, const char *fn) {
    if (!ctx) return fattn_fail(NULL, FATTN_ERROR_INVALID_ARGUMENT, "ctx is NULL");
    int idle = 0;
    if (!__atomic_compare_exchange_n(&ctx->in_use, &idle, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        return fattn_fail(NULL, FATTN_ERROR_BUSY,
                          "%s: the context is in use by a call on another thread (a context serves one "
                          "call at a time: use one context per thread)",
                          fn);
    fattn_clear_error(ctx);
    return FATTN_OK;
}

void fattn_ctx_release(fattn_ctx *ctx) { __atomic_store_n(&ctx->in_use, 0, __ATOMIC_RELEASE); }

void fattn_ctx_free(fattn_ctx *ctx) {
    if (!ctx) return;
    if (ctx->backend == FATTN_BACKEND_CUDA) fattn_cuda_ctx_free(ctx);
    free(ctx->fp8_ws);
    free(ctx);
}

fattn_backend fattn_ctx_backend(const fattn_ctx *ctx) {
    return ctx ? ctx->backend : FATTN_BACKEND_AUTO;
}

static fattn_status fattn_ctx_set_stream_held(fattn_ctx *ctx, void *stream) {
    if (ctx->backend == FATTN_BACKEND_CPU && stream != NULL)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "stream %p given to a CPU context (only NULL is allowed)", stream);
    ctx->stream = stream;
    return FATTN_OK;
}

static fattn_status fattn_ctx_set_threads_held(fattn_ctx *ctx, int threads) {
    if (threads < 0)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "threads %d must be >= 0", threads);
    ctx->threads = threads;
    return FATTN_OK;
}

/* ------------------------------------------------------------------------ */
/* Argument checks                                                          */
/* ------------------------------------------------------------------------ */

static int dtype_valid(fattn_dtype d) {
    return d == FATTN_DTYPE_F32 || d == FATTN_DTYPE_F16 || d == FATTN_DTYPE_BF16 ||
           d == FATTN_DTYPE_E4M3;
}

static int mul_ok(int64_t a, int64_t b, int64_t *r) { return !__builtin_mul_overflow(a, b, r); }
static int add_ok(int64_t a, int64_t b, int64_t *r) { return !__builtin_add_overflow(a, b, r); }

/* Shape of one 4-D tensor as seen by a call.  In varlen mode `seqlen` is the
 * packed token count and there is no batch dimension. */
typedef struct shape4 {
    const char *name;
    int64_t batch, seqlen, heads, dim;
    const char *seqlen_name, *heads_name, *dim_name;
    int varlen;
    const char *batch_name; /* NULL: "batch" (a page pool: "num_pages") */
} shape4;

static const char *batch_name(const shape4 *s) { return s->batch_name ? s->batch_name : "batch"; }

/* Checks the pointer, strides and extent of `t` against `s` and replaces the
 * "all strides 0" default by packed strides (in the private copy). */
static fattn_status check_tensor(fattn_ctx *ctx, fattn_tensor *t, const shape4 *s) {
    if (!t->data) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "%s.data is NULL", s->name);
    if (t->stride_batch < 0)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "%s.stride_batch %lld is negative",
                          s->name, (long long)t->stride_batch);
    if (t->stride_seq < 0)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "%s.stride_seq %lld is negative",
                          s->name, (long long)t->stride_seq);
    if (t->stride_head < 0)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "%s.stride_head %lld is negative",
                          s->name, (long long)t->stride_head);

    /* Rows: the GPU engine indexes (batch, head, token) rows with int32. */
    int64_t rows = 0;
    int64_t b = s->varlen ? 1 : s->batch;
    if (!mul_ok(b, s->seqlen, &rows) || !mul_ok(rows, s->heads, &rows) || rows >= FATTN_MAX_ROWS)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "%s: %s * %s * %s = %lld * %lld * %lld rows exceeds the engine "
                          "limit of 2^31 - 1",
                          s->name, batch_name(s), s->seqlen_name, s->heads_name, (long long)b,
                          (long long)s->seqlen, (long long)s->heads);

    int defaulted = t->stride_batch == 0 && t->stride_seq == 0 && t->stride_head == 0;
    if (defaulted) {
        int64_t sh = s->dim, ss, sb = 0;
        if (!mul_ok(s->heads, s->dim, &ss) || (!s->varlen && !mul_ok(ss, s->seqlen, &sb)))
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "%s: %s * %s * %s overflows the 64-bit index range", s->name,
                              s->seqlen_name, s->heads_name, s->dim_name);
        t->stride_head = sh;
        t->stride_seq = ss;
        t->stride_batch = sb;
    } else {
        /* Only layouts that obviously overlap are rejected: with more than
         * one head (token, batch), consecutive ones must be at least a row
         * of head_dim apart. */
        if (s->heads > 1 && t->stride_head < s->dim)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "%s.stride_head %lld is smaller than %s %lld (heads would overlap)",
                              s->name, (long long)t->stride_head, s->dim_name, (long long)s->dim);
        if (s->seqlen > 1 && t->stride_seq < s->dim)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "%s.stride_seq %lld is smaller than %s %lld (tokens would overlap)",
                              s->name, (long long)t->stride_seq, s->dim_name, (long long)s->dim);
        if (!s->varlen && s->batch > 1 && t->stride_batch < s->dim)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "%s.stride_batch %lld is smaller than %s %lld (%s would overlap)",
                              s->name, (long long)t->stride_batch, s->dim_name, (long long)s->dim,
                              s->batch_name ? "pages" : "batches");
    }
    if (s->varlen) t->stride_batch = 0; /* ignored in varlen mode */

    /* Largest element offset the engine will touch. */
    if (rows > 0) {
        int64_t off = s->dim - 1, x;
        int ok = 1;
        if (!s->varlen) ok = ok && mul_ok(s->batch - 1, t->stride_batch, &x) && add_ok(off, x, &off);
        ok = ok && mul_ok(s->seqlen - 1, t->stride_seq, &x) && add_ok(off, x, &off);
        ok = ok && mul_ok(s->heads - 1, t->stride_head, &x) && add_ok(off, x, &off);
        if (!ok || off >= FATTN_MAX_ELEMENT_OFFSET)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "%s: the largest element offset (%s %lld, %s %lld, %s %lld, %s "
                              "%lld with strides %lld, %lld, %lld) overflows the 64-bit index range",
                              s->name, batch_name(s), (long long)s->batch, s->seqlen_name,
                              (long long)s->seqlen,
                              s->heads_name, (long long)s->heads, s->dim_name, (long long)s->dim,
                              (long long)t->stride_batch, (long long)t->stride_seq,
                              (long long)t->stride_head);
    }
    return FATTN_OK;
}

static fattn_status check_e4m3_scale(fattn_ctx *ctx, const fattn_tensor *t, const char *name) {
    if (t->dtype != FATTN_DTYPE_E4M3) return FATTN_OK;
    if (!t->scale)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "%s.scale is NULL (e4m3 tensors need dequantisation scales)", name);
    if (t->scale_block < 1)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "%s.scale_block %d must be >= 1",
                          name, (int)t->scale_block);
    return FATTN_OK;
}

/* ------------------------------------------------------------------------ */
/* Alignment and overlap                                                    */
/* ------------------------------------------------------------------------ */

/* A pointer must be aligned for the elements it holds: the engines load whole
 * elements (an f32 pointer one byte off is undefined behaviour in C and a
 * misaligned-address fault on the GPU). */
static fattn_status check_aligned(fattn_ctx *ctx, const void *p, size_t align, const char *name,
                                  const char *elem) {
    if (p && (uintptr_t)p % align != 0)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "%s is not %zu-byte aligned (%p; %s elements)", name, align, p, elem);
    return FATTN_OK;
}

static fattn_status check_data_aligned(fattn_ctx *ctx, const fattn_tensor *t, const char *name) {
    char what[32];
    snprintf(what, sizeof what, "%s.data", name);
    return check_aligned(ctx, t->data, fattn_dtype_size(t->dtype), what, fattn_dtype_name(t->dtype));
}

/* The bytes [lo, hi) that a call reads or writes through one pointer
 * (lo == hi: none). */
typedef struct span {
    const char *name;
    uint64_t lo, hi;
} span;

static span span_of(const char *name, const void *p, uint64_t bytes) {
    span r = {name, (uint64_t)(uintptr_t)p, (uint64_t)(uintptr_t)p};
    if (!p) return r;
    r.hi = r.lo + bytes;
    if (r.hi < r.lo) r.hi = UINT64_MAX;
    return r;
}

/* A tensor after check_tensor: strides are non-negative, so its first
 * element has the lowest address, and the largest offset fits (< 2^59). */
static span tensor_span(const fattn_tensor *t, const shape4 *s) {
    int64_t b = s->varlen ? 1 : s->batch;
    if (b < 1 || s->seqlen < 1 || s->heads < 1 || s->dim < 1) return span_of(s->name, t->data, 0);
    int64_t off = (s->dim - 1) + (b - 1) * t->stride_batch + (s->seqlen - 1) * t->stride_seq +
                  (s->heads - 1) * t->stride_head;
    return span_of(s->name, t->data, (uint64_t)(off + 1) * fattn_dtype_size(t->dtype));
}

/* count elements of elem_bytes each (count <= 0: none) */
static span array_span(const char *name, const void *p, int64_t count, size_t elem_bytes) {
    return span_of(name, p, count > 0 ? (uint64_t)count * elem_bytes : 0);
}

/* An e4m3 tensor's scales: float32 [batch, heads, ceil(seqlen / scale_block)]. */
static span scale_span(const char *name, const fattn_tensor *t, const shape4 *s) {
    if (t->dtype != FATTN_DTYPE_E4M3 || t->scale_block < 1) return span_of(name, NULL, 0);
    int64_t b = s->varlen ? 1 : s->batch;
    int64_t blocks = (s->seqlen + t->scale_block - 1) / t->scale_block;
    return array_span(name, t->scale, b * s->heads * blocks, sizeof(float));
}

/* Every entry of an e4m3 tensor's scale array (host memory: CPU contexts
 * only) > 0: NaN, zero and negative scales are refused (fattn.h, fattn_tensor);
 * +Inf is a scale like the quantiser's of an Inf block. */
static fattn_status check_e4m3_scale_values(fattn_ctx *ctx, const fattn_tensor *t, const shape4 *s,
                                            const char *name) {
    if (t->dtype != FATTN_DTYPE_E4M3) return FATTN_OK;
    const span sp = scale_span(name, t, s);
    const int64_t n = (int64_t)((sp.hi - sp.lo) / sizeof(float));
    for (int64_t i = 0; i < n; i++)
        if (!(t->scale[i] > 0.0f))
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "%s[%lld] = %g: e4m3 dequantisation scales must be > 0 (NaN, zero and negative "
                              "scales are refused)",
                              name, (long long)i, (double)t->scale[i]);
    return FATTN_OK;
}

/* An output's own elements are distinct: with its dimensions of size > 1
 * sorted by stride (head_dim, contiguous, innermost), each stride is at least
 * the extent in elements of the dimensions inside it.  This is sufficient,
 * not necessary: a layout whose dimensions interleave is refused even where
 * no two elements happen to coincide. */
static fattn_status check_no_self_overlap(fattn_ctx *ctx, const fattn_tensor *t, const shape4 *s) {
    struct {
        int64_t n, stride;
        const char *stride_name, *dim_name;
    } d[3] = {{s->varlen ? 1 : s->batch, t->stride_batch, "stride_batch", batch_name(s)},
              {s->seqlen, t->stride_seq, "stride_seq", s->seqlen_name},
              {s->heads, t->stride_head, "stride_head", s->heads_name}},
      x;
    for (int i = 1; i < 3; i++) /* stable insertion sort by stride */
        for (int j = i; j > 0 && d[j].stride < d[j - 1].stride; j--) x = d[j], d[j] = d[j - 1], d[j - 1] = x;
    /* a tensor with no element (an empty side of a varlen call) overlaps
     * nothing; check_tensor does not bound its strides */
    for (int i = 0; i < 3; i++)
        if (d[i].n == 0) return FATTN_OK;
    int64_t extent = s->dim; /* elements spanned by the dimensions inside */
    char inner[96];
    snprintf(inner, sizeof inner, "%s", s->dim_name);
    for (int i = 0; i < 3; i++) {
        if (d[i].n <= 1) continue;
        if (d[i].stride < extent)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "%s.%s %lld is smaller than %lld, the extent in elements of %s's "
                              "dimensions with smaller strides (%s): elements of the output %s "
                              "would overlap",
                              s->name, d[i].stride_name, (long long)d[i].stride, (long long)extent,
                              s->name, inner, s->name);
        /* bounded by check_tensor; saturate all the same (a later stride can
         * then only be refused) */
        int64_t span_i;
        if (!mul_ok(d[i].n - 1, d[i].stride, &span_i) || !add_ok(extent, span_i, &extent)) extent = INT64_MAX;
        size_t used = strlen(inner);
        snprintf(inner + used, sizeof inner - used, ", %s", d[i].dim_name);
    }
    return FATTN_OK;
}

/* Outputs share no byte with an input or with another output (interval
 * tests on the spans: cheap, and conservative for outputs interleaved with
 * inputs in one buffer). */
static fattn_status check_disjoint(fattn_ctx *ctx, const span *out, int nout, const span *in,
                                   int nin) {
    for (int i = 0; i < nout; i++) {
        const span *a = &out[i];
        if (a->lo == a->hi) continue;
        for (int j = 0; j < nin + i; j++) {
            const span *b = j < nin ? &in[j] : &out[j - nin];
            if (b->lo == b->hi || a->hi <= b->lo || b->hi <= a->lo) continue;
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "%s overlaps %s in memory (bytes [%p, %p) and [%p, %p)): %s", a->name,
                              b->name, (void *)(uintptr_t)a->lo, (void *)(uintptr_t)a->hi,
                              (void *)(uintptr_t)b->lo, (void *)(uintptr_t)b->hi,
                              j < nin ? "an output must not share memory with an input"
                                      : "outputs must not share memory");
        }
    }
    return FATTN_OK;
}

/* Sizes and flags of the problem; fills the defaults in `p`. */
static fattn_status check_problem(fattn_ctx *ctx, fattn_problem *p) {
    int varlen = p->cu_seqlens_q != NULL || p->cu_seqlens_k != NULL;
    if ((p->cu_seqlens_q == NULL) != (p->cu_seqlens_k == NULL))
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "%s is NULL but %s is not (give both or neither)",
                          p->cu_seqlens_q ? "cu_seqlens_k" : "cu_seqlens_q",
                          p->cu_seqlens_q ? "cu_seqlens_q" : "cu_seqlens_k");
    if (p->total_q < 0 || p->total_k < 0 || (!varlen && (p->total_q || p->total_k)))
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "total_q %d, total_k %d: the packed rows of a variable-length batch (>= 0; both 0 "
                          "without cu_seqlens)",
                          (int)p->total_q, (int)p->total_k);
    CHECK(check_aligned(ctx, p->cu_seqlens_q, sizeof(int32_t), "cu_seqlens_q", "int32"));
    CHECK(check_aligned(ctx, p->cu_seqlens_k, sizeof(int32_t), "cu_seqlens_k", "int32"));
    if (p->batch < 1)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "batch %d must be >= 1", (int)p->batch);
    if (varlen) {
        if (p->seqlen_q < 0)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "seqlen_q %d must be >= 0 (varlen: the maximum length)",
                              (int)p->seqlen_q);
        if (p->seqlen_k < 0)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "seqlen_k %d must be >= 0 (varlen: the maximum length)",
                              (int)p->seqlen_k);
    } else {
        if (p->seqlen_q < 1)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "seqlen_q %d must be >= 1",
                              (int)p->seqlen_q);
        if (p->seqlen_k < 1)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "seqlen_k %d must be >= 1",
                              (int)p->seqlen_k);
    }
    if (p->heads_q < 1)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "heads_q %d must be >= 1",
                          (int)p->heads_q);
    if (p->heads_kv < 1)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "heads_kv %d must be >= 1",
                          (int)p->heads_kv);
    if (p->heads_q % p->heads_kv != 0)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "heads_q %d is not a multiple of heads_kv %d", (int)p->heads_q,
                          (int)p->heads_kv);
    if (p->head_dim < 1)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "head_dim %d must be >= 1",
                          (int)p->head_dim);
    if (p->head_dim_v < 0)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "head_dim_v %d must be >= 1 (or 0 for head_dim)", (int)p->head_dim_v);
    if (p->head_dim_v == 0) p->head_dim_v = p->head_dim;
    if (!isfinite(p->softmax_scale) || p->softmax_scale < 0.0f)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "softmax_scale %g must be finite and >= 0 (0 = 1/sqrt(head_dim))",
                          (double)p->softmax_scale);
    if (p->softmax_scale == 0.0f) p->softmax_scale = (float)(1.0 / sqrt((double)p->head_dim));
    p->causal = p->causal != 0; /* the header defines any nonzero value as causal */
    if (!p->window && (p->window_left != 0 || p->window_right != 0))
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "window_left %d, window_right %d are set but window is 0 (set window nonzero to "
                          "use a sliding window; without it both must be 0)",
                          (int)p->window_left, (int)p->window_right);
    if (p->window && p->window_left < -1)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "window_left %d must be >= 0, or -1 for unbounded", (int)p->window_left);
    if (p->window && p->window_right < -1)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "window_right %d must be >= 0, or -1 for unbounded", (int)p->window_right);
    p->window = p->window != 0;
    if (p->softcap != 0.0f && !(isfinite(p->softcap) && p->softcap > 0.0f))
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "softcap %g must be finite and > 0 (or 0 for no softcap)", (double)p->softcap);
    return FATTN_OK;
}

typedef struct tensor_shapes {
    shape4 q, k, v, o;
    int64_t total_q, total_k;
    int varlen;
} tensor_shapes;

static fattn_status problem_shapes(fattn_ctx *ctx, const fattn_problem *p, tensor_shapes *ts) {
    ts->varlen = p->cu_seqlens_q != NULL;
    ts->total_q = p->seqlen_q;
    ts->total_k = p->seqlen_k;
    if (ts->varlen) {
        /* Only the CPU engine's check lets varlen batches through, and its
         * cu_seqlens are host memory: nothing is read from a device here. */
        if (ctx->backend != FATTN_BACKEND_CPU) {
            /* the arrays are device memory: the extents come from the totals */
            if (p->total_q < 1 || p->total_k < 1)
                return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                                  "a variable-length batch on a CUDA context needs total_q and total_k "
                                  "(cu_seqlens_q[batch], cu_seqlens_k[batch], >= 1; here %d, %d): the "
                                  "engine does not read cu_seqlens on the host",
                                  (int)p->total_q, (int)p->total_k);
            ts->total_q = p->total_q;
            ts->total_k = p->total_k;
        } else {
            fattn_status st = fattn_cpu_varlen_totals(ctx, p, &ts->total_q, &ts->total_k);
            if (st != FATTN_OK) return st;
            if ((p->total_q && p->total_q != ts->total_q) || (p->total_k && p->total_k != ts->total_k))
                return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                                  "total_q %d, total_k %d differ from cu_seqlens_q[batch] %lld, "
                                  "cu_seqlens_k[batch] %lld",
                                  (int)p->total_q, (int)p->total_k, (long long)ts->total_q,
                                  (long long)ts->total_k);
        }
    }
    int64_t sq = ts->varlen ? ts->total_q : p->seqlen_q;
    int64_t sk = ts->varlen ? ts->total_k : p->seqlen_k;
    const char *sqn = ts->varlen ? "total_q" : "seqlen_q";
    const char *skn = ts->varlen ? "total_k" : "seqlen_k";
    shape4 q = {"q", p->batch, sq, p->heads_q, p->head_dim, sqn, "heads_q", "head_dim", ts->varlen,
                NULL};
    shape4 k = {"k", p->batch, sk, p->heads_kv, p->head_dim, skn, "heads_kv", "head_dim", ts->varlen,
                NULL};
    shape4 v = {"v", p->batch, sk, p->heads_kv, p->head_dim_v, skn, "heads_kv", "head_dim_v",
                ts->varlen, NULL};
    shape4 o = {"o", p->batch, sq, p->heads_q, p->head_dim_v, sqn, "heads_q", "head_dim_v",
                ts->varlen, NULL};
    ts->q = q;
    ts->k = k;
    ts->v = v;
    ts->o = o;
    return FATTN_OK;
}

static fattn_status check_dtype(fattn_ctx *ctx, fattn_dtype d, const char *name) {
    if (!dtype_valid(d))
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "%s.dtype %d is not a fattn_dtype",
                          name, (int)d);
    return FATTN_OK;
}

static fattn_status check_same_dtype(fattn_ctx *ctx, const fattn_tensor *t, const char *name,
                                     fattn_dtype want, const char *ref) {
    if (t->dtype != want)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "%s.dtype %s differs from %s.dtype %s",
                          name, fattn_dtype_name(t->dtype), ref, fattn_dtype_name(want));
    return FATTN_OK;
}

/* ------------------------------------------------------------------------ */
/* Forward                                                                  */
/* ------------------------------------------------------------------------ */

/* The serving fields' scalars (fattn_fwd_args): they read nothing behind a
 * pointer, so they hold on every engine.  The entries of seqused_k and
 * block_table are the engine's business (the CPU engine's host-side check,
 * fattn_cpu_serving_check; the CUDA engine never reads them on the host). */
static fattn_status check_serving(fattn_ctx *ctx, const fattn_fwd_args *a) {
    CHECK(check_aligned(ctx, a->seqused_k, sizeof(int32_t), "seqused_k", "int32"));
    CHECK(check_aligned(ctx, a->block_table, sizeof(int32_t), "block_table", "int32"));
    const struct {
        int32_t value;
        const char *name;
    } ints[] = {{a->page_size, "page_size"},
                {a->num_pages, "num_pages"},
                {a->max_pages_per_seq, "max_pages_per_seq"}};
    for (int i = 0; i < 3; i++) {
        if (!a->block_table && ints[i].value != 0)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "%s %d is given but block_table is NULL (without a block table "
                              "page_size, num_pages and max_pages_per_seq must be 0)",
                              ints[i].name, (int)ints[i].value);
        if (a->block_table && ints[i].value < 1)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "%s %d must be >= 1 (block_table is given: a paged KV cache)",
                              ints[i].name, (int)ints[i].value);
    }
    if (!a->block_table) return FATTN_OK;
    const int64_t addressable = (int64_t)a->max_pages_per_seq * a->page_size;
    if (a->p.seqlen_k > addressable)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "seqlen_k %d exceeds max_pages_per_seq * page_size = %d * %d = %lld "
                          "(the block table cannot address every key)",
                          (int)a->p.seqlen_k, (int)a->max_pages_per_seq, (int)a->page_size,
                          (long long)addressable);
    if (a->p.cu_seqlens_q || a->p.cu_seqlens_k)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "block_table with cu_seqlens (a paged variable-length batch) is not "
                          "supported: pass fixed-length q and each sequence's key count in "
                          "seqused_k");
    return FATTN_OK;
}

fattn_status fattn_fwd_prepare(fattn_ctx *ctx, fattn_fwd_args *args, const int32_t *fp8_blocks,
                               int64_t *total_q, int64_t *total_k) {
    fattn_fwd_args a = *args;

    CHECK(check_problem(ctx, &a.p));
    CHECK(check_serving(ctx, &a));

    CHECK(check_dtype(ctx, a.q.dtype, "q"));
    CHECK(check_dtype(ctx, a.k.dtype, "k"));
    CHECK(check_dtype(ctx, a.v.dtype, "v"));
    CHECK(check_dtype(ctx, a.o.dtype, "o"));
    CHECK(check_same_dtype(ctx, &a.k, "k", a.q.dtype, "q"));
    CHECK(check_same_dtype(ctx, &a.v, "v", a.q.dtype, "q"));
    if (fp8_blocks) {
        /* fattn_fwd_fp8: 16-bit or f32 inputs, o any output dtype, scales ignored */
        if (a.q.dtype == FATTN_DTYPE_E4M3)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "q.dtype e4m3: fattn_fwd_fp8 quantises f32, f16 or bf16 inputs itself "
                              "(fattn_fwd takes e4m3 tensors)");
        if (a.o.dtype == FATTN_DTYPE_E4M3)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "o.dtype e4m3 is not an output dtype (o is f32, f16 or bf16)");
    } else if (a.q.dtype == FATTN_DTYPE_E4M3) {
        if (a.o.dtype == FATTN_DTYPE_E4M3)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "o.dtype e4m3 is not an output dtype (e4m3 inputs: o is f32, f16 "
                              "or bf16)");
    } else {
        CHECK(check_same_dtype(ctx, &a.o, "o", a.q.dtype, "q"));
    }
    if (!fp8_blocks) {
        CHECK(check_e4m3_scale(ctx, &a.q, "q"));
        CHECK(check_e4m3_scale(ctx, &a.k, "k"));
        CHECK(check_e4m3_scale(ctx, &a.v, "v"));
    }

    /* Null data pointers before anything reads cu_seqlens. */
    if (!a.q.data) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "q.data is NULL");
    if (!a.k.data) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "k.data is NULL");
    if (!a.v.data) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "v.data is NULL");
    if (!a.o.data) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "o.data is NULL");
    CHECK(check_data_aligned(ctx, &a.q, "q"));
    CHECK(check_data_aligned(ctx, &a.k, "k"));
    CHECK(check_data_aligned(ctx, &a.v, "v"));
    CHECK(check_data_aligned(ctx, &a.o, "o"));
    CHECK(check_aligned(ctx, a.lse, sizeof(float), "lse", "f32"));
    CHECK(check_aligned(ctx, a.learnable_sink, sizeof(float), "learnable_sink", "f32"));
    if (a.q.dtype == FATTN_DTYPE_E4M3) {
        CHECK(check_aligned(ctx, a.q.scale, sizeof(float), "q.scale", "f32"));
        CHECK(check_aligned(ctx, a.k.scale, sizeof(float), "k.scale", "f32"));
        CHECK(check_aligned(ctx, a.v.scale, sizeof(float), "v.scale", "f32"));
    }

    /* the engine's limits (internal.h), before anything reads cu_seqlens;
     * fattn_fwd_fp8 asks them about the e4m3 call it will make (the checks
     * read nothing behind a pointer: the scales are placeholders here) */
    {
        fattn_fwd_args e = a;
        if (fp8_blocks) {
            static float placeholder;
            fattn_tensor *t[3] = {&e.q, &e.k, &e.v};
            for (int i = 0; i < 3; i++) {
                t[i]->dtype = FATTN_DTYPE_E4M3;
                t[i]->scale = &placeholder;
                t[i]->scale_block = fp8_blocks[i];
            }
        }
        CHECK(ctx->backend == FATTN_BACKEND_CUDA ? fattn_cuda_fwd_check(ctx, &e)
                                                 : fattn_cpu_fwd_check(ctx, &e));
    }
    tensor_shapes ts;
    CHECK(problem_shapes(ctx, &a.p, &ts));
    /* seqused_k and block_table entries: host memory on a CPU context only
     * (after problem_shapes, which has checked cu_seqlens on the host) */
    if (ctx->backend == FATTN_BACKEND_CPU) CHECK(fattn_cpu_serving_check(ctx, &a));
    if (a.block_table) {
        /* k and v are page pools: [num_pages, page_size, heads_kv, dim] */
        shape4 *kv[2] = {&ts.k, &ts.v};
        for (int i = 0; i < 2; i++) {
            kv[i]->batch = a.num_pages;
            kv[i]->seqlen = a.page_size;
            kv[i]->seqlen_name = "page_size";
            kv[i]->batch_name = "num_pages";
        }
    }
    CHECK(check_tensor(ctx, &a.q, &ts.q));
    CHECK(check_tensor(ctx, &a.k, &ts.k));
    CHECK(check_tensor(ctx, &a.v, &ts.v));
    CHECK(check_tensor(ctx, &a.o, &ts.o));
    CHECK(check_no_self_overlap(ctx, &a.o, &ts.o));
    {
        const int64_t nb = ts.varlen ? 1 : a.p.batch, ncu = ts.varlen ? (int64_t)a.p.batch + 1 : 0;
        const int64_t ntable = a.block_table ? (int64_t)a.p.batch * a.max_pages_per_seq : 0;
        const span in[] = {tensor_span(&a.q, &ts.q),
                           tensor_span(&a.k, &ts.k),
                           tensor_span(&a.v, &ts.v),
                           scale_span("q.scale", &a.q, &ts.q),
                           scale_span("k.scale", &a.k, &ts.k),
                           scale_span("v.scale", &a.v, &ts.v),
                           array_span("cu_seqlens_q", a.p.cu_seqlens_q, ncu, sizeof(int32_t)),
                           array_span("cu_seqlens_k", a.p.cu_seqlens_k, ncu, sizeof(int32_t)),
                           array_span("seqused_k", a.seqused_k, a.p.batch, sizeof(int32_t)),
                           array_span("block_table", a.block_table, ntable, sizeof(int32_t)),
                           array_span("learnable_sink", a.learnable_sink, a.p.heads_q, sizeof(float))};
        const span out[] = {tensor_span(&a.o, &ts.o),
                            array_span("lse", a.lse, nb * a.p.heads_q * ts.total_q, sizeof(float))};
        CHECK(check_disjoint(ctx, out, 2, in, (int)(sizeof in / sizeof in[0])));
    }
    /* e4m3 scales: host memory on a CPU context, read after every other check */
    if (!fp8_blocks && ctx->backend == FATTN_BACKEND_CPU) {
        CHECK(check_e4m3_scale_values(ctx, &a.q, &ts.q, "q.scale"));
        CHECK(check_e4m3_scale_values(ctx, &a.k, &ts.k, "k.scale"));
        CHECK(check_e4m3_scale_values(ctx, &a.v, &ts.v, "v.scale"));
    }
    if (total_q) *total_q = ts.total_q;
    if (total_k) *total_k = ts.total_k;
    *args = a;
    return FATTN_OK;
}

static fattn_status fattn_fwd_held(fattn_ctx *ctx, const fattn_fwd_args *args) {
    if (!args) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "args is NULL");
    fattn_fwd_args a = *args;
    CHECK(fattn_fwd_prepare(ctx, &a, NULL, NULL, NULL));
    return fattn_fwd_run(ctx, &a);
}

fattn_status fattn_fwd_run(fattn_ctx *ctx, const fattn_fwd_args *a) {
    if (ctx->backend == FATTN_BACKEND_CUDA) return fattn_cuda_fwd(ctx, a);
    return fattn_cpu_fwd(ctx, a);
}

/* ------------------------------------------------------------------------ */
/* Backward                                                                 */
/* ------------------------------------------------------------------------ */

static fattn_status fattn_bwd_held(fattn_ctx *ctx, const fattn_bwd_args *args) {
    if (!args) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "args is NULL");
    fattn_bwd_args a = *args;

    CHECK(check_problem(ctx, &a.p));

    struct {
        fattn_tensor *t;
        const char *name;
    } all[] = {{&a.q, "q"},       {&a.k, "k"},   {&a.v, "v"},   {&a.o, "o"},
               {&a.dout, "dout"}, {&a.dq, "dq"}, {&a.dk, "dk"}, {&a.dv, "dv"}};
    const int n = (int)(sizeof all / sizeof all[0]);
    for (int i = 0; i < n; i++) CHECK(check_dtype(ctx, all[i].t->dtype, all[i].name));
    if (a.q.dtype == FATTN_DTYPE_E4M3)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "q.dtype e4m3 is not supported by the backward (f32, f16, bf16 only)");
    for (int i = 1; i < n; i++) CHECK(check_same_dtype(ctx, all[i].t, all[i].name, a.q.dtype, "q"));
    for (int i = 0; i < n; i++)
        if (!all[i].t->data)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "%s.data is NULL", all[i].name);
    if (!a.lse)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "lse is NULL (the backward needs the forward's log-sum-exp)");
    for (int i = 0; i < n; i++) CHECK(check_data_aligned(ctx, all[i].t, all[i].name));
    CHECK(check_aligned(ctx, a.lse, sizeof(float), "lse", "f32"));
    if (a.dsink && !a.learnable_sink)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "dsink is given but learnable_sink is NULL (d(sink) needs the sink's values)");
    CHECK(check_aligned(ctx, a.learnable_sink, sizeof(float), "learnable_sink", "f32"));
    CHECK(check_aligned(ctx, a.dsink, sizeof(float), "dsink", "f32"));
    a.deterministic = a.deterministic != 0;

    /* the engine's limits (internal.h), before anything reads cu_seqlens */
    CHECK(ctx->backend == FATTN_BACKEND_CUDA ? fattn_cuda_bwd_check(ctx, &a)
                                             : fattn_cpu_bwd_check(ctx, &a));
    tensor_shapes ts;
    CHECK(problem_shapes(ctx, &a.p, &ts));
    shape4 sdout = ts.o, sdq = ts.q, sdk = ts.k, sdv = ts.v;
    sdout.name = "dout";
    sdq.name = "dq";
    sdk.name = "dk";
    sdv.name = "dv";
    CHECK(check_tensor(ctx, &a.q, &ts.q));
    CHECK(check_tensor(ctx, &a.k, &ts.k));
    CHECK(check_tensor(ctx, &a.v, &ts.v));
    CHECK(check_tensor(ctx, &a.o, &ts.o));
    CHECK(check_tensor(ctx, &a.dout, &sdout));
    CHECK(check_tensor(ctx, &a.dq, &sdq));
    CHECK(check_tensor(ctx, &a.dk, &sdk));
    CHECK(check_tensor(ctx, &a.dv, &sdv));
    CHECK(check_no_self_overlap(ctx, &a.dq, &sdq));
    CHECK(check_no_self_overlap(ctx, &a.dk, &sdk));
    CHECK(check_no_self_overlap(ctx, &a.dv, &sdv));
    {
        const int64_t nb = ts.varlen ? 1 : a.p.batch, ncu = ts.varlen ? (int64_t)a.p.batch + 1 : 0;
        const span in[] = {tensor_span(&a.q, &ts.q),
                           tensor_span(&a.k, &ts.k),
                           tensor_span(&a.v, &ts.v),
                           tensor_span(&a.o, &ts.o),
                           tensor_span(&a.dout, &sdout),
                           array_span("lse", a.lse, nb * a.p.heads_q * ts.total_q, sizeof(float)),
                           array_span("cu_seqlens_q", a.p.cu_seqlens_q, ncu, sizeof(int32_t)),
                           array_span("cu_seqlens_k", a.p.cu_seqlens_k, ncu, sizeof(int32_t)),
                           array_span("learnable_sink", a.dsink ? a.learnable_sink : NULL, a.p.heads_q,
                                      sizeof(float))};
        const span out[] = {tensor_span(&a.dq, &sdq), tensor_span(&a.dk, &sdk),
                            tensor_span(&a.dv, &sdv),
                            array_span("dsink", a.dsink, a.p.heads_q, sizeof(float))};
        CHECK(check_disjoint(ctx, out, 4, in, (int)(sizeof in / sizeof in[0])));
    }

    if (ctx->backend == FATTN_BACKEND_CUDA) return fattn_cuda_bwd(ctx, &a);
    return fattn_cpu_bwd(ctx, &a);
}

/* ------------------------------------------------------------------------ */
/* Quantisation                                                             */
/* ------------------------------------------------------------------------ */

/* The sizes of a dense [batch, seqlen, heads, head_dim] call (fattn_quantize,
 * fattn_merge): each >= 1. */
static fattn_status check_dense_sizes(fattn_ctx *ctx, int32_t batch, int32_t seqlen, int32_t heads,
                                      int32_t head_dim) {
    if (batch < 1) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "batch %d must be >= 1", (int)batch);
    if (seqlen < 1) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "seqlen %d must be >= 1", (int)seqlen);
    if (heads < 1) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "heads %d must be >= 1", (int)heads);
    if (head_dim < 1)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "head_dim %d must be >= 1", (int)head_dim);
    return FATTN_OK;
}

static fattn_status fattn_quantize_held(fattn_ctx *ctx, const fattn_quantize_args *args) {
    if (!args) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "args is NULL");
    fattn_quantize_args a = *args;

    CHECK(check_dense_sizes(ctx, a.batch, a.seqlen, a.heads, a.head_dim));
    if (a.granularity != FATTN_QUANT_BLOCK && a.granularity != FATTN_QUANT_TENSOR)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "granularity %d is not FATTN_QUANT_BLOCK or FATTN_QUANT_TENSOR",
                          (int)a.granularity);
    if (a.block_rows < 1)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "block_rows %d must be >= 1",
                          (int)a.block_rows);
    CHECK(check_dtype(ctx, a.in.dtype, "in"));
    CHECK(check_dtype(ctx, a.out.dtype, "out"));
    if (a.in.dtype == FATTN_DTYPE_E4M3)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "in.dtype e4m3 cannot be quantised (f32, f16 or bf16 only)");
    if (a.out.dtype != FATTN_DTYPE_E4M3)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "out.dtype %s must be e4m3",
                          fattn_dtype_name(a.out.dtype));
    if (!a.out.scale)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "out.scale is NULL (it receives the scales)");
    a.out.scale_block = a.block_rows;
    a.rotate = a.rotate != 0;
    CHECK(check_data_aligned(ctx, &a.in, "in"));
    CHECK(check_aligned(ctx, a.out.scale, sizeof(float), "out.scale", "f32"));

    shape4 sin = {"in", a.batch, a.seqlen, a.heads, a.head_dim, "seqlen", "heads", "head_dim", 0, NULL};
    shape4 sout = sin;
    sout.name = "out";
    CHECK(check_tensor(ctx, &a.in, &sin));
    CHECK(check_tensor(ctx, &a.out, &sout));
    CHECK(check_no_self_overlap(ctx, &a.out, &sout));
    {
        const span in[] = {tensor_span(&a.in, &sin)};
        const span out[] = {tensor_span(&a.out, &sout), scale_span("out.scale", &a.out, &sout)};
        CHECK(check_disjoint(ctx, out, 2, in, 1));
    }

    if (a.rotate && (a.head_dim & (a.head_dim - 1)) != 0)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "rotate needs a power-of-two head_dim (Walsh-Hadamard); head_dim is %d",
                          (int)a.head_dim);
    /* the engine's limits (the CPU serves every head_dim) */
    if (ctx->backend == FATTN_BACKEND_CUDA) CHECK(fattn_cuda_quantize_check(ctx, &a));

    if (ctx->backend == FATTN_BACKEND_CUDA) return fattn_cuda_quantize(ctx, &a);
    return fattn_cpu_quantize(ctx, &a);
}

/* ------------------------------------------------------------------------ */
/* Merge of partial results                                                 */
/* ------------------------------------------------------------------------ */

static fattn_status check_merge_dtype(fattn_ctx *ctx, fattn_dtype d, const char *name) {
    CHECK(check_dtype(ctx, d, name));
    if (d == FATTN_DTYPE_E4M3)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "%s.dtype e4m3 is not supported by fattn_merge (f32, f16, bf16 only)", name);
    return FATTN_OK;
}

/* `a` is the private copy; `parts` (num_parts entries, checked by the
 * caller) receives the parts with their strides resolved. */
static fattn_status merge_prepare(fattn_ctx *ctx, fattn_merge_args *a, fattn_merge_part *parts) {
    char name[24], lname[24];
    shape4 so = {"o", a->batch, a->seqlen, a->heads, a->head_dim, "seqlen", "heads", "head_dim", 0,
                 NULL};
    CHECK(check_merge_dtype(ctx, a->o.dtype, "o"));
    for (int32_t i = 0; i < a->num_parts; i++) {
        snprintf(name, sizeof name, "parts[%d].o", (int)i);
        CHECK(check_merge_dtype(ctx, parts[i].o.dtype, name));
    }
    if (!a->o.data) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "o.data is NULL");
    for (int32_t i = 0; i < a->num_parts; i++) {
        if (!parts[i].o.data)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "parts[%d].o.data is NULL", (int)i);
        if (!parts[i].lse)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "parts[%d].lse is NULL (a part's weight is its log-sum-exp)", (int)i);
    }
    CHECK(check_data_aligned(ctx, &a->o, "o"));
    CHECK(check_aligned(ctx, a->lse, sizeof(float), "lse", "f32"));
    for (int32_t i = 0; i < a->num_parts; i++) {
        snprintf(name, sizeof name, "parts[%d].o", (int)i);
        snprintf(lname, sizeof lname, "parts[%d].lse", (int)i);
        CHECK(check_data_aligned(ctx, &parts[i].o, name));
        CHECK(check_aligned(ctx, parts[i].lse, sizeof(float), lname, "f32"));
    }

    /* the engine's limits */
    if (ctx->backend == FATTN_BACKEND_CUDA) CHECK(fattn_cuda_merge_check(ctx, a));

    CHECK(check_tensor(ctx, &a->o, &so));
    CHECK(check_no_self_overlap(ctx, &a->o, &so));
    /* check_tensor bounds batch * heads * seqlen below 2^31 */
    const int64_t nlse = (int64_t)a->batch * a->heads * a->seqlen;
    const span out[] = {tensor_span(&a->o, &so), array_span("lse", a->lse, nlse, sizeof(float))};
    for (int32_t i = 0; i < a->num_parts; i++) {
        shape4 sp = so;
        snprintf(name, sizeof name, "parts[%d].o", (int)i);
        snprintf(lname, sizeof lname, "parts[%d].lse", (int)i);
        sp.name = name;
        CHECK(check_tensor(ctx, &parts[i].o, &sp));
        const span in[] = {tensor_span(&parts[i].o, &sp),
                           array_span(lname, parts[i].lse, nlse, sizeof(float))};
        CHECK(check_disjoint(ctx, out, 2, in, 2));
    }
    a->parts = parts;
    return FATTN_OK;
}

static fattn_status fattn_merge_held(fattn_ctx *ctx, const fattn_merge_args *args) {
    if (!args) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "args is NULL");
    fattn_merge_args a = *args;

    CHECK(check_dense_sizes(ctx, a.batch, a.seqlen, a.heads, a.head_dim));
    if (a.num_parts < 1 || a.num_parts > FATTN_MERGE_MAX_PARTS)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "num_parts %d must be in 1..%d",
                          (int)a.num_parts, FATTN_MERGE_MAX_PARTS);
    if (!a.parts) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "parts is NULL");

    /* The private copy of the parts, where their default strides are
     * resolved: the caller's array is never written. */
    fattn_merge_part *parts = (fattn_merge_part *)malloc((size_t)a.num_parts * sizeof *parts);
    if (!parts)
        return fattn_fail(ctx, FATTN_ERROR_OUT_OF_MEMORY, "cannot copy %d merge parts",
                          (int)a.num_parts);
    memcpy(parts, a.parts, (size_t)a.num_parts * sizeof *parts);
    fattn_status st = merge_prepare(ctx, &a, parts);
    if (st == FATTN_OK)
        st = ctx->backend == FATTN_BACKEND_CUDA ? fattn_cuda_merge(ctx, &a) : fattn_cpu_merge(ctx, &a);
    free(parts);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Append to a KV cache                                                     */
/* ------------------------------------------------------------------------ */

/* The widest row fattn_kv_append takes on every engine: the CPU forward's
 * head_dim limit (src/cpu/limits.c), so that what it writes the CPU engine
 * can attend over, and a call valid on one engine is valid on all. */
#define FATTN_KV_APPEND_MAX_HEAD_DIM 512

static fattn_status check_kv_append_dtype(fattn_ctx *ctx, const fattn_kv_append_args *a) {
    const struct {
        const fattn_tensor *t;
        const char *name;
    } all[] = {{&a->k_new, "k_new"}, {&a->v_new, "v_new"}, {&a->k_cache, "k_cache"}, {&a->v_cache, "v_cache"}};
    for (int i = 0; i < 4; i++) CHECK(check_dtype(ctx, all[i].t->dtype, all[i].name));
    for (int i = 1; i < 4; i++) CHECK(check_same_dtype(ctx, all[i].t, all[i].name, a->k_new.dtype, "k_new"));
    if (a->k_new.dtype == FATTN_DTYPE_E4M3)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "k_new.dtype e4m3 is not supported by fattn_kv_append (f32, f16, bf16 "
                          "only: an e4m3 cache would need its scales appended too)");
    for (int i = 0; i < 4; i++)
        if (!all[i].t->data)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "%s.data is NULL", all[i].name);
    for (int i = 0; i < 4; i++) CHECK(check_data_aligned(ctx, all[i].t, all[i].name));
    return FATTN_OK;
}

static fattn_status fattn_kv_append_held(fattn_ctx *ctx, const fattn_kv_append_args *args) {
    if (!args) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "args is NULL");
    fattn_kv_append_args a = *args;

    if (a.batch < 1)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "batch %d must be >= 1", (int)a.batch);
    if (a.seqlen_new < 1)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "seqlen_new %d must be >= 1 (the new rows per sequence)", (int)a.seqlen_new);
    if (a.heads_kv < 1)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "heads_kv %d must be >= 1", (int)a.heads_kv);
    if (a.head_dim < 1)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "head_dim %d must be >= 1", (int)a.head_dim);
    if (a.head_dim > FATTN_KV_APPEND_MAX_HEAD_DIM)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "head_dim %d is not supported by fattn_kv_append (1..%d, the CPU forward's "
                          "limit)",
                          (int)a.head_dim, FATTN_KV_APPEND_MAX_HEAD_DIM);
    CHECK(check_aligned(ctx, a.cache_seqlens, sizeof(int32_t), "cache_seqlens", "int32"));
    CHECK(check_aligned(ctx, a.block_table, sizeof(int32_t), "block_table", "int32"));
    {
        const struct {
            int32_t value;
            const char *name;
        } ints[] = {{a.page_size, "page_size"},
                    {a.num_pages, "num_pages"},
                    {a.max_pages_per_seq, "max_pages_per_seq"}};
        for (int i = 0; i < 3; i++) {
            if (!a.block_table && ints[i].value != 0)
                return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                                  "%s %d is given but block_table is NULL (a contiguous cache: "
                                  "page_size, num_pages and max_pages_per_seq must be 0)",
                                  ints[i].name, (int)ints[i].value);
            if (a.block_table && ints[i].value < 1)
                return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                                  "%s %d must be >= 1 (block_table is given: a paged KV cache)",
                                  ints[i].name, (int)ints[i].value);
        }
    }
    if (!a.block_table && a.capacity < 1)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "capacity %d must be >= 1 (the rows per sequence of a contiguous cache)",
                          (int)a.capacity);
    CHECK(check_kv_append_dtype(ctx, &a));
    if (!a.cache_seqlens)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "cache_seqlens is NULL (required: the cache row where each sequence's new "
                          "rows start)");

    shape4 skn = {"k_new", a.batch, a.seqlen_new, a.heads_kv, a.head_dim, "seqlen_new", "heads_kv",
                  "head_dim", 0, NULL};
    shape4 svn = skn;
    svn.name = "v_new";
    shape4 skc = {"k_cache", a.batch, a.capacity, a.heads_kv, a.head_dim, "capacity", "heads_kv",
                  "head_dim", 0, NULL};
    if (a.block_table) {
        skc.batch = a.num_pages;
        skc.seqlen = a.page_size;
        skc.seqlen_name = "page_size";
        skc.batch_name = "num_pages";
    }
    shape4 svc = skc;
    svc.name = "v_cache";
    CHECK(check_tensor(ctx, &a.k_new, &skn));
    CHECK(check_tensor(ctx, &a.v_new, &svn));
    CHECK(check_tensor(ctx, &a.k_cache, &skc));
    CHECK(check_tensor(ctx, &a.v_cache, &svc));
    CHECK(check_no_self_overlap(ctx, &a.k_cache, &skc));
    CHECK(check_no_self_overlap(ctx, &a.v_cache, &svc));
    {
        const int64_t ntable = a.block_table ? (int64_t)a.batch * a.max_pages_per_seq : 0;
        const span in[] = {tensor_span(&a.k_new, &skn), tensor_span(&a.v_new, &svn),
                           array_span("cache_seqlens", a.cache_seqlens, a.batch, sizeof(int32_t)),
                           array_span("block_table", a.block_table, ntable, sizeof(int32_t))};
        const span out[] = {tensor_span(&a.k_cache, &skc), tensor_span(&a.v_cache, &svc)};
        CHECK(check_disjoint(ctx, out, 2, in, 4));
    }
    if (a.block_table) a.capacity = 0; /* ignored: the engines never see a stale value */

    if (ctx->backend == FATTN_BACKEND_CUDA) return fattn_cuda_kv_append(ctx, &a);
    return fattn_cpu_kv_append(ctx, &a);
}

/* ------------------------------------------------------------------------ */
/* Entry points: the context's in-use flag around each call                 */
/* ------------------------------------------------------------------------ */

/* fattn_NAME(ctx, arg): fattn_NAME_held between acquire and release (the
 * refusal names the call) */
#define FATTN_ENTRY(name, type)                              \
    fattn_status name(fattn_ctx *ctx, type arg) {            \
        fattn_status st = fattn_ctx_acquire(ctx, #name);     \
        if (st != FATTN_OK) return st;                       \
        st = name##_held(ctx, arg);                          \
        fattn_ctx_release(ctx);                              \
        return st;                                           \
    }
FATTN_ENTRY(fattn_ctx_set_stream, void *)
FATTN_ENTRY(fattn_ctx_set_threads, int)
FATTN_ENTRY(fattn_fwd, const fattn_fwd_args *)
FATTN_ENTRY(fattn_bwd, const fattn_bwd_args *)
FATTN_ENTRY(fattn_quantize, const fattn_quantize_args *)
FATTN_ENTRY(fattn_merge, const fattn_merge_args *)
FATTN_ENTRY(fattn_kv_append, const fattn_kv_append_args *)
#undef FATTN_ENTRY
