/* fwd_sm90_varlen_hdim192_128.cu - the variable-length forward of head dim 192 with head_dim_v 128
 * (fwd_sm90_varlen.cu dispatches here; one file, so it compiles in parallel). */
#include "../fwd/fwd_sm90_kernels.cuh"

fattn_status fwd_sm90_varlen_hdim192_128(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v) {
    if (v.local) return fwd_sm90_run_varlen<FWD_D192_128_LOCAL>(ctx, a, v);
    return v.causal ? fwd_sm90_run_varlen<FWD_D192_128_CAUSAL>(ctx, a, v) : fwd_sm90_run_varlen<FWD_D192_128>(ctx, a, v);
}
