/* limits.c - what the CPU engine can serve, checked before api.c looks at
 * strides (internal.h: fattn_cpu_*_check), and its host-side check of
 * variable-length batches. */
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
    return check_cu_seqlens(ctx, p->cu_seqlens_k, p->batch, p->seqlen_k, "cu_seqlens_k",
                            "seqlen_k", total_k);
}
