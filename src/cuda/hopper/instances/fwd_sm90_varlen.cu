/* fwd_sm90_varlen.cu - the forward for variable-length batches (cu_seqlens):
 * the shipped kernels' tiles with VARLEN (fwd_opts_varlen); head dims 96,
 * 192 and 192/128 in fwd_sm90_varlen_hdim*.cu, so they compile in parallel. */
#include "../fwd/fwd_sm90_kernels.cuh"

fattn_status fwd_sm90_varlen(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v) {
    if (a->p.seqlen_q == 0) return FATTN_OK; /* no sequence has a query: no tile, nothing to write */
    if (fwd_kv8(a)) return fwd_sm90_kvcache_kv8(ctx, a, v);
    switch (a->p.head_dim) {
    case 96: return fwd_sm90_varlen_hdim96(ctx, a, v);
    case 192:
        return a->p.head_dim_v == 128 ? fwd_sm90_varlen_hdim192_128(ctx, a, v) : fwd_sm90_varlen_hdim192(ctx, a, v);
    default: break;
    }
    if (v.local) { /* the variants: LOCAL's runtime window, softcap, sinks */
        switch (a->p.head_dim) {
        case 64: return fwd_sm90_run_varlen<FWD_D64_LOCAL>(ctx, a, v);
        case 128: return fwd_sm90_run_varlen<FWD_D128_LOCAL>(ctx, a, v);
        case 256: return fwd_sm90_run_varlen<FWD_D256_LOCAL>(ctx, a, v);
        default: return fattn_fail(ctx, FATTN_ERROR_INTERNAL, "varlen forward: head_dim %d", a->p.head_dim);
        }
    }
    switch (a->p.head_dim) {
    case 64: return v.causal ? fwd_sm90_run_varlen<FWD_D64_CAUSAL>(ctx, a, v) : fwd_sm90_run_varlen<FWD_D64>(ctx, a, v);
    case 128: return v.causal ? fwd_sm90_run_varlen<FWD_D128_CAUSAL>(ctx, a, v) : fwd_sm90_run_varlen<FWD_D128_176>(ctx, a, v);
    case 256: return v.causal ? fwd_sm90_run_varlen<FWD_D256_CAUSAL>(ctx, a, v) : fwd_sm90_run_varlen<FWD_D256>(ctx, a, v);
    default: return fattn_fail(ctx, FATTN_ERROR_INTERNAL, "varlen forward: head_dim %d", a->p.head_dim);
    }
}
