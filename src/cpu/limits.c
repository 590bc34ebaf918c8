/* limits.c - what the CPU engine can serve, checked before api.c looks at
 * strides (internal.h: fattn_cpu_*_check), and its host-side checks of
 * variable-length batches and of the serving fields (seqused_q, seqused_k,
 * cache_batch_idx, cache_leftpad, block_table). */
#include "cpu/attention_common.h"
#include "internal.h"

/* The CPU engine keeps a few rows of head_dim floats on the stack. */
#define CPU_MAX_HEAD_DIM 512

static fattn_status check_head_dims(fattn_ctx *ctx, const fattn_problem *p) {
    if (p->head_dim > CPU_MAX_HEAD_DIM)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "head_dim %d is not supported by the CPU engine (1..%d)",
                          (int)p->head_dim, CPU_MAX_HEAD_DIM);
    if (p->head_dim_v > CPU_MAX_HEAD_DIM)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "head_dim_v %d is not supported by the CPU engine (1..%d)",
                          (int)p->head_dim_v, CPU_MAX_HEAD_DIM);
    return FATTN_OK;
}

/* Every dtype the header allows is served (e4m3 forward included). */
fattn_status fattn_cpu_fwd_check(fattn_ctx *ctx, const fattn_fwd_args *a) {
    return check_head_dims(ctx, &a->p);
}

fattn_status fattn_cpu_bwd_check(fattn_ctx *ctx, const fattn_bwd_args *a) {
    return check_head_dims(ctx, &a->p);
}

static fattn_status check_cu_seqlens(fattn_ctx *ctx, const int32_t *cu, int32_t batch,
                                     int32_t maxlen, const char *name, const char *max_name,
                                     int64_t *total) {
    if (cu[0] != 0)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "%s[0] is %d, must be 0", name,
                          (int)cu[0]);
    for (int32_t b = 0; b < batch; b++) {
        const int64_t len = (int64_t)cu[b + 1] - cu[b];
        if (len < 0)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "%s decreases at index %d (%d -> %d)", name, (int)(b + 1),
                              (int)cu[b], (int)cu[b + 1]);
        if (len > maxlen)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "%s: sequence %d has length %lld > %s %d", name, (int)b,
                              (long long)len, max_name, (int)maxlen);
    }
    *total = cu[batch];
    return FATTN_OK;
}

fattn_status fattn_cpu_varlen_totals(fattn_ctx *ctx, const fattn_problem *p, int64_t *total_q,
                                     int64_t *total_k) {
    fattn_status st = check_cu_seqlens(ctx, p->cu_seqlens_q, p->batch, p->seqlen_q,
                                       "cu_seqlens_q", "seqlen_q", total_q);
    if (st != FATTN_OK) return st;
    *total_k = p->seqlen_k; /* cu_seqlens_q alone: fixed-length keys */
    if (!p->cu_seqlens_k) return FATTN_OK;
    return check_cu_seqlens(ctx, p->cu_seqlens_k, p->batch, p->seqlen_k, "cu_seqlens_k",
                            "seqlen_k", total_k);
}

/* An int32[batch] serving array's entries are >= 0. */
static fattn_status check_nonnegative(fattn_ctx *ctx, const int32_t *x, int32_t batch, const char *name) {
    for (int32_t b = 0; x && b < batch; b++)
        if (x[b] < 0)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "%s[%d] is %d, must be >= 0", name, (int)b,
                              (int)x[b]);
    return FATTN_OK;
}

/* The serving fields' entries (CPU contexts only: host memory there), after
 * api.c has checked their scalars and fattn_cpu_varlen_totals the
 * cu_seqlens: seqused_q[b], seqused_k[b] >= 0, cache_batch_idx[b] inside
 * [0, cache_batch), 0 <= cache_leftpad[b] <= end_b (the used end of its keys,
 * fattn.h), and the block-table entries of the pages sequence b reads (those
 * holding positions cache_leftpad[b] .. end_b - 1) inside [0, num_pages).
 * The entries past those are never read. */
fattn_status fattn_cpu_serving_check(fattn_ctx *ctx, const fattn_fwd_args *a) {
    const fattn_problem *p = &a->p;
    fattn_status st = check_nonnegative(ctx, a->seqused_q, p->batch, "seqused_q");
    if (st == FATTN_OK) st = check_nonnegative(ctx, a->seqused_k, p->batch, "seqused_k");
    if (st != FATTN_OK) return st;
    if (!a->seqused_k && !a->block_table && !a->cache_batch_idx && !a->cache_leftpad) return FATTN_OK;
    const int32_t ncache = a->cache_batch ? a->cache_batch : p->batch;
    for (int32_t b = 0; b < p->batch; b++) {
        if (a->cache_batch_idx && (a->cache_batch_idx[b] < 0 || a->cache_batch_idx[b] >= ncache))
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "cache_batch_idx[%d] is %d, outside [0, %s %d) (the batch entries of k and v)",
                              (int)b, (int)a->cache_batch_idx[b], a->cache_batch ? "cache_batch" : "batch",
                              (int)ncache);
        int64_t end = p->cu_seqlens_k ? (int64_t)p->cu_seqlens_k[b + 1] - p->cu_seqlens_k[b] : p->seqlen_k;
        if (a->seqused_k && a->seqused_k[b] < end) end = a->seqused_k[b];
        const int64_t pad = a->cache_leftpad ? a->cache_leftpad[b] : 0;
        if (pad < 0 || pad > end)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "cache_leftpad[%d] is %lld, outside [0, %lld] (sequence %d's keys end at row "
                              "%lld: %s)",
                              (int)b, (long long)pad, (long long)end, (int)b, (long long)end,
                              a->seqused_k ? "min(seqused_k, its key count)" : "its key count");
        if (!a->block_table) continue;
        /* the pages holding positions pad .. end - 1: none when pad == end */
        const int64_t first = pad / a->page_size;
        const int64_t npages = end > pad ? (end + a->page_size - 1) / a->page_size : first;
        const int32_t *row = a->block_table + (int64_t)b * a->max_pages_per_seq;
        for (int64_t i = first; i < npages; i++)
            if (row[i] < 0 || row[i] >= a->num_pages)
                return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                                  "block_table[%d][%lld] is %d, outside [0, num_pages %d) (sequence "
                                  "%d reads keys %lld..%lld: pages %lld..%lld of its row)",
                                  (int)b, (long long)i, (int)row[i], (int)a->num_pages, (int)b,
                                  (long long)pad, (long long)(end - 1), (long long)first,
                                  (long long)(npages - 1));
    }
    return FATTN_OK;
}

fattn_status fattn_cpu_bwd_serving_check(fattn_ctx *ctx, const fattn_bwd_args *a) {
    fattn_status st = check_nonnegative(ctx, a->seqused_q, a->p.batch, "seqused_q");
    if (st != FATTN_OK) return st;
    return check_nonnegative(ctx, a->seqused_k, a->p.batch, "seqused_k");
}

/* The e4m3 scales of the keys each sequence uses (an FP8 KV cache: e4m3 k
 * and v beside 16-bit or f32 q), after fattn_cpu_serving_check: > 0 (NaN,
 * zero and negative refused, +Inf allowed, as fattn_tensor says).  The rest
 * of the scale arrays belongs to pages and rows no sequence uses, which a
 * cache leaves unwritten, so it is not read. */
fattn_status fattn_cpu_kv8_scale_check(fattn_ctx *ctx, const fattn_fwd_args *a) {
    const fattn_problem *p = &a->p;
    const fattn_seq_fields f = {a->seqused_q, a->seqused_k, a->cache_batch_idx, a->cache_leftpad};
    const int64_t rows = a->block_table ? a->page_size : fattn_rows_k(p);
    const fattn_tensor *t[2] = {&a->k, &a->v};
    const char *name[2] = {"k.scale", "v.scale"};
    for (int64_t b = 0; b < p->batch; b++) {
        const fattn_seq sq = fattn_seq_get(p, &f, b);
        for (int64_t j = 0; j < sq.klen; j++) {
            const int64_t pos = sq.k0 + j;
            int64_t e = sq.kb, r = pos;
            if (a->block_table) {
                e = a->block_table[b * a->max_pages_per_seq + pos / a->page_size];
                r = pos % a->page_size;
            }
            for (int i = 0; i < 2; i++) {
                const int64_t sb = t[i]->scale_block, nblocks = (rows + sb - 1) / sb;
                const int64_t idx = (e * p->heads_kv) * nblocks + r / sb;
                for (int64_t h = 0; h < p->heads_kv; h++) {
                    const float s = t[i]->scale[idx + h * nblocks];
                    if (!(s > 0.0f))
                        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                                          "%s[%lld] = %g (key %lld of sequence %d, kv head %lld): e4m3 "
                                          "dequantisation scales must be > 0 (NaN, zero and negative scales "
                                          "are refused)",
                                          name[i], (long long)(idx + h * nblocks), (double)s, (long long)j,
                                          (int)b, (long long)h);
                }
            }
        }
    }
    return FATTN_OK;
}
