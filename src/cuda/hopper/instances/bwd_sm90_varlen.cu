/* bwd_sm90_varlen.cu - the backward's instances for variable-length
 * batches (cu_seqlens; BwdOpts.varlen), in their own translation unit so
 * that they compile beside the fixed-length ones in bwd_sm90.cu. */
#include "../bwd/bwd_sm90_launch.cuh"

template <int D>
fattn_status bwd_sm90_varlen_d(fattn_ctx *ctx, const fattn_bwd_args *a, bool causal, bool bf16) {
    if (bwd_wants_local(&a->p)) return bwd_run_local<BwdOpts{.d = D, .varlen = true}>(ctx, a, bf16);
    return bwd_run_opts<BwdOpts{.d = D, .varlen = true}>(ctx, a, causal, bf16);
}

template fattn_status bwd_sm90_varlen_d<64>(fattn_ctx *, const fattn_bwd_args *, bool, bool);
template fattn_status bwd_sm90_varlen_d<128>(fattn_ctx *, const fattn_bwd_args *, bool, bool);
template fattn_status bwd_sm90_varlen_d<256>(fattn_ctx *, const fattn_bwd_args *, bool, bool);
