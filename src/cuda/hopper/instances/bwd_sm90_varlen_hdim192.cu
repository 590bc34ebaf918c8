/* bwd_sm90_varlen_hdim192.cu - the variable-length backward of head dim 192
 * (as bwd_sm90_hdim192.cu). */
#include "../bwd/bwd_sm90_launch.cuh"

fattn_status bwd_sm90_varlen_hdim192(fattn_ctx *ctx, const fattn_bwd_args *a, bool causal, bool bf16) {
    return bwd_run_base<BwdOpts{.d = 256, .varlen = true, .hd = 192}>(ctx, a, causal, bf16);
}
