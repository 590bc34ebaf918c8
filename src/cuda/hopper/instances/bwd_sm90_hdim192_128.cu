/* bwd_sm90_hdim192_128.cu - the backward of head dim 192 with head_dim_v
 * 128: the d256 kernel, TMA filling Q's and K's columns 192..255 and V's and
 * dO's 128..255 with zeros (BwdOpts.hd, hdv); its own file, so that it
 * compiles in parallel. */
#include "../bwd/bwd_sm90_launch.cuh"

fattn_status bwd_sm90_hdim192_128(fattn_ctx *ctx, const fattn_bwd_args *a, bool causal, bool bf16) {
    return bwd_run_base<BwdOpts{.d = 256, .hd = 192, .hdv = 128}>(ctx, a, causal, bf16);
}
