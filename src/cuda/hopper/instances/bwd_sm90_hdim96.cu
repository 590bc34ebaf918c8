/* bwd_sm90_hdim96.cu - the backward of head dim 96: the d128 kernel, TMA
 * filling columns 96..127 with zeros (BwdOpts.hd); its own file, so that it
 * compiles in parallel. */
#include "../bwd/bwd_sm90_launch.cuh"

fattn_status bwd_sm90_hdim96(fattn_ctx *ctx, const fattn_bwd_args *a, bool causal, bool bf16) {
    return bwd_run_base<BwdOpts{.d = 128, .hd = 96}>(ctx, a, causal, bf16);
}
