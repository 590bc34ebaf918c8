/* bwd_sm90_varlen_hdim96.cu - the variable-length backward of head dim 96
 * (as bwd_sm90_hdim96.cu). */
#include "../bwd/bwd_sm90_launch.cuh"

fattn_status bwd_sm90_varlen_hdim96(fattn_ctx *ctx, const fattn_bwd_args *a, bool causal, bool bf16) {
    return bwd_run_base<BwdOpts{.d = 128, .varlen = true, .hd = 96}>(ctx, a, causal, bf16);
}
