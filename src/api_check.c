/* api_check.c - the argument checks every call shares (api_check.h): they
 * hold on every engine, and read nothing behind a pointer except where a CPU
 * context's host memory is named (cu_seqlens through the CPU engine, e4m3
 * scale values). */
#include "api_check.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Offsets must stay addressable in bytes (x 8 bytes per element at most, with
 * head room), so the largest element offset allowed is 2^59. */
#define FATTN_MAX_ELEMENT_OFFSET (INT64_C(1) << 59)
/* The CUDA kernels index rows (batch * heads * seqlen) with int32; the limit
 * holds on every engine, so that a call valid on one is valid on all. */
#define FATTN_MAX_ROWS (INT64_C(1) << 31)

static int dtype_valid(fattn_dtype d) {
    return d == FATTN_DTYPE_F32 || d == FATTN_DTYPE_F16 || d == FATTN_DTYPE_BF16 ||
           d == FATTN_DTYPE_E4M3;
}

static int mul_ok(int64_t a, int64_t b, int64_t *r) { return !__builtin_mul_overflow(a, b, r); }
static int add_ok(int64_t a, int64_t b, int64_t *r) { return !__builtin_add_overflow(a, b, r); }

static const char *batch_name(const fattn_shape4 *s) { return s->batch_name ? s->batch_name : "batch"; }

/* Checks the pointer, strides and extent of `t` against `s` and replaces the
 * "all strides 0" default by packed strides (in the private copy). */
fattn_status fattn_check_tensor(fattn_ctx *ctx, fattn_tensor *t, const fattn_shape4 *s) {
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

fattn_status fattn_check_e4m3_scale(fattn_ctx *ctx, const fattn_tensor *t, const char *name) {
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
fattn_status fattn_check_aligned(fattn_ctx *ctx, const void *p, size_t align, const char *name,
                                 const char *elem) {
    if (p && (uintptr_t)p % align != 0)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "%s is not %zu-byte aligned (%p; %s elements)", name, align, p, elem);
    return FATTN_OK;
}

fattn_status fattn_check_data_aligned(fattn_ctx *ctx, const fattn_tensor *t, const char *name) {
    char what[32];
    snprintf(what, sizeof what, "%s.data", name);
    return fattn_check_aligned(ctx, t->data, fattn_dtype_size(t->dtype), what, fattn_dtype_name(t->dtype));
}

fattn_status fattn_check_paged(fattn_ctx *ctx, const int32_t *block_table, int32_t page_size,
                               int32_t num_pages, int32_t max_pages_per_seq, const char *without) {
    CHECK(fattn_check_aligned(ctx, block_table, sizeof(int32_t), "block_table", "int32"));
    const struct {
        int32_t value;
        const char *name;
    } ints[] = {{page_size, "page_size"},
                {num_pages, "num_pages"},
                {max_pages_per_seq, "max_pages_per_seq"}};
    for (int i = 0; i < 3; i++) {
        if (!block_table && ints[i].value != 0)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "%s %d is given but block_table is NULL (%spage_size, num_pages and "
                              "max_pages_per_seq must be 0)",
                              ints[i].name, (int)ints[i].value, without);
        if (block_table && ints[i].value < 1)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "%s %d must be >= 1 (block_table is given: a paged KV cache)",
                              ints[i].name, (int)ints[i].value);
    }
    return FATTN_OK;
}

static fattn_span span_of(const char *name, const void *p, uint64_t bytes) {
    fattn_span r = {name, (uint64_t)(uintptr_t)p, (uint64_t)(uintptr_t)p};
    if (!p) return r;
    r.hi = r.lo + bytes;
    if (r.hi < r.lo) r.hi = UINT64_MAX;
    return r;
}

/* A tensor after fattn_check_tensor: strides are non-negative, so its first
 * element has the lowest address, and the largest offset fits (< 2^59). */
fattn_span fattn_tensor_span(const fattn_tensor *t, const fattn_shape4 *s) {
    int64_t b = s->varlen ? 1 : s->batch;
    if (b < 1 || s->seqlen < 1 || s->heads < 1 || s->dim < 1) return span_of(s->name, t->data, 0);
    int64_t off = (s->dim - 1) + (b - 1) * t->stride_batch + (s->seqlen - 1) * t->stride_seq +
                  (s->heads - 1) * t->stride_head;
    return span_of(s->name, t->data, (uint64_t)(off + 1) * fattn_dtype_size(t->dtype));
}

/* count elements of elem_bytes each (count <= 0: none) */
fattn_span fattn_array_span(const char *name, const void *p, int64_t count, size_t elem_bytes) {
    return span_of(name, p, count > 0 ? (uint64_t)count * elem_bytes : 0);
}

/* An e4m3 tensor's scales: float32 [batch, heads, ceil(seqlen / scale_block)]. */
fattn_span fattn_scale_span(const char *name, const fattn_tensor *t, const fattn_shape4 *s) {
    if (t->dtype != FATTN_DTYPE_E4M3 || t->scale_block < 1) return span_of(name, NULL, 0);
    int64_t b = s->varlen ? 1 : s->batch;
    int64_t blocks = (s->seqlen + t->scale_block - 1) / t->scale_block;
    return fattn_array_span(name, t->scale, b * s->heads * blocks, sizeof(float));
}

/* Every entry of an e4m3 tensor's scale array (host memory: CPU contexts
 * only) > 0: NaN, zero and negative scales are refused (fattn.h, fattn_tensor);
 * +Inf is a scale like the quantiser's of an Inf block. */
fattn_status fattn_check_e4m3_scale_values(fattn_ctx *ctx, const fattn_tensor *t, const fattn_shape4 *s,
                                           const char *name) {
    if (t->dtype != FATTN_DTYPE_E4M3) return FATTN_OK;
    const fattn_span sp = fattn_scale_span(name, t, s);
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
fattn_status fattn_check_no_self_overlap(fattn_ctx *ctx, const fattn_tensor *t, const fattn_shape4 *s) {
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
     * nothing; fattn_check_tensor does not bound its strides */
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
        /* bounded by fattn_check_tensor; saturate all the same (a later stride can
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
fattn_status fattn_check_disjoint(fattn_ctx *ctx, const fattn_span *out, int nout, const fattn_span *in,
                                  int nin) {
    for (int i = 0; i < nout; i++) {
        const fattn_span *a = &out[i];
        if (a->lo == a->hi) continue;
        for (int j = 0; j < nin + i; j++) {
            const fattn_span *b = j < nin ? &in[j] : &out[j - nin];
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
fattn_status fattn_check_problem(fattn_ctx *ctx, fattn_problem *p) {
    /* cu_seqlens_q alone: varlen queries against fixed-length keys (a cache) */
    int varlen = p->cu_seqlens_q != NULL;
    if (!p->cu_seqlens_q && p->cu_seqlens_k)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "cu_seqlens_q is NULL but cu_seqlens_k is not (give both, cu_seqlens_q alone for "
                          "varlen queries against fixed-length keys, or neither)");
    if (p->total_q < 0 || p->total_k < 0 || (!p->cu_seqlens_q && p->total_q) || (!p->cu_seqlens_k && p->total_k))
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "total_q %d, total_k %d: the packed rows of a variable-length batch (>= 0; each 0 "
                          "without its cu_seqlens)",
                          (int)p->total_q, (int)p->total_k);
    CHECK(fattn_check_aligned(ctx, p->cu_seqlens_q, sizeof(int32_t), "cu_seqlens_q", "int32"));
    CHECK(fattn_check_aligned(ctx, p->cu_seqlens_k, sizeof(int32_t), "cu_seqlens_k", "int32"));
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


fattn_status fattn_problem_shapes(fattn_ctx *ctx, const fattn_problem *p, fattn_tensor_shapes *ts) {
    /* varlen: the queries are packed; the keys too with cu_seqlens_k */
    ts->varlen = p->cu_seqlens_q != NULL;
    const int varlen_k = p->cu_seqlens_k != NULL;
    ts->total_q = p->seqlen_q;
    ts->total_k = p->seqlen_k;
    if (ts->varlen) {
        /* Only the CPU engine's check lets varlen batches through, and its
         * cu_seqlens are host memory: nothing is read from a device here. */
        if (ctx->backend != FATTN_BACKEND_CPU) {
            /* the arrays are device memory: the extents come from the totals */
            if (p->total_q < 1 || (varlen_k && p->total_k < 1))
                return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                                  "a variable-length batch on a CUDA context needs total_q and total_k "
                                  "(cu_seqlens_q[batch] and, with cu_seqlens_k, cu_seqlens_k[batch], >= 1; "
                                  "here %d, %d): the engine does not read cu_seqlens on the host",
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
    if (!varlen_k) ts->total_k = p->seqlen_k;
    int64_t sq = ts->varlen ? ts->total_q : p->seqlen_q;
    int64_t sk = varlen_k ? ts->total_k : p->seqlen_k;
    const char *sqn = ts->varlen ? "total_q" : "seqlen_q";
    const char *skn = varlen_k ? "total_k" : "seqlen_k";
    fattn_shape4 q = {"q", p->batch, sq, p->heads_q, p->head_dim, sqn, "heads_q", "head_dim", ts->varlen,
                NULL};
    fattn_shape4 k = {"k", p->batch, sk, p->heads_kv, p->head_dim, skn, "heads_kv", "head_dim", varlen_k,
                NULL};
    fattn_shape4 v = {"v", p->batch, sk, p->heads_kv, p->head_dim_v, skn, "heads_kv", "head_dim_v",
                varlen_k, NULL};
    fattn_shape4 o = {"o", p->batch, sq, p->heads_q, p->head_dim_v, sqn, "heads_q", "head_dim_v",
                ts->varlen, NULL};
    ts->q = q;
    ts->k = k;
    ts->v = v;
    ts->o = o;
    return FATTN_OK;
}

fattn_status fattn_check_dtype(fattn_ctx *ctx, fattn_dtype d, const char *name) {
    if (!dtype_valid(d))
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "%s.dtype %d is not a fattn_dtype",
                          name, (int)d);
    return FATTN_OK;
}

fattn_status fattn_check_same_dtype(fattn_ctx *ctx, const fattn_tensor *t, const char *name,
                                    fattn_dtype want, const char *ref) {
    if (t->dtype != want)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "%s.dtype %s differs from %s.dtype %s",
                          name, fattn_dtype_name(t->dtype), ref, fattn_dtype_name(want));
    return FATTN_OK;
}
