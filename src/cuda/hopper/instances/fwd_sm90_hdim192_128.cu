/* fwd_sm90_hdim192_128.cu - the forward kernels of head dim 192 with
 * head_dim_v 128 (one file per head dim, so that they compile in parallel). */
#include "../fwd/fwd_sm90_kernels.cuh"

fattn_status fwd_sm90_hdim192_128(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v, fwd_kernel k) {
    switch (k) {
    case FWD_D192_128_CAUSAL: return fwd_sm90_run_kernel<FWD_D192_128_CAUSAL>(ctx, a, v);
    case FWD_D192_128: return fwd_sm90_run_kernel<FWD_D192_128>(ctx, a, v);
    case FWD_D192_128_LOCAL: return fwd_sm90_run_kernel<FWD_D192_128_LOCAL>(ctx, a, v);
    default:
        return fattn_fail(ctx, FATTN_ERROR_INTERNAL, "forward kernel %d is not one of head dim 192 with head_dim_v 128",
                          (int)k);
    }
}
