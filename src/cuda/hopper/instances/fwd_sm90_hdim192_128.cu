/* fwd_sm90_hdim192_128.cu - the forward kernels of head dim 192 with
 * head_dim_v 128, those listed in fwd_kernels.def (one file per head dim, so
 * that they compile in parallel). */
#include "../fwd/fwd_sm90_kernels.cuh"

fattn_status fwd_sm90_hdim192_128(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v, fwd_kernel k) {
    return fwd_sm90_run_file<false, 192, 128>(ctx, a, v, k);
}
