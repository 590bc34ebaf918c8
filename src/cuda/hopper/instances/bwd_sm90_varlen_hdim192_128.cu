/* bwd_sm90_varlen_hdim192_128.cu - the variable-length backward of head dim
 * 192 with head_dim_v 128 (as bwd_sm90_hdim192_128.cu). */
#include "../bwd/bwd_sm90_launch.cuh"

fattn_status bwd_sm90_varlen_hdim192_128(fattn_ctx *ctx, const fattn_bwd_args *a, bool causal, bool bf16) {
    return bwd_run_base<BwdOpts{.d = 256, .varlen = true, .hd = 192, .hdv = 128}>(ctx, a, causal, bf16);
}
