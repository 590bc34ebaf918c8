/* fwd_sm90_hdim96.cu - the forward kernels of head dim 96 (one file per
 * head dim, so that they compile in parallel). */
#include "../fwd/fwd_sm90_kernels.cuh"

fattn_status fwd_sm90_hdim96(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v, fwd_kernel k) {
    switch (k) {
    case FWD_D96_CAUSAL: return fwd_sm90_run_kernel<FWD_D96_CAUSAL>(ctx, a, v);
    case FWD_D96: return fwd_sm90_run_kernel<FWD_D96>(ctx, a, v);
    case FWD_D96_LOCAL: return fwd_sm90_run_kernel<FWD_D96_LOCAL>(ctx, a, v);
    default: return fattn_fail(ctx, FATTN_ERROR_INTERNAL, "forward kernel %d is not one of head dim 96", (int)k);
    }
}
