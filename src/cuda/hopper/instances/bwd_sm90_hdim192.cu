/* bwd_sm90_hdim192.cu - the backward of head dim 192: the d256 kernel, TMA
 * filling columns 192..255 with zeros (BwdOpts.hd); its own file, so that it
 * compiles in parallel. */
#include "../bwd/bwd_sm90_launch.cuh"

fattn_status bwd_sm90_hdim192(fattn_ctx *ctx, const fattn_bwd_args *a, bool causal, bool bf16) {
    return bwd_run_base<BwdOpts{.d = 256, .hd = 192}>(ctx, a, causal, bf16);
}
