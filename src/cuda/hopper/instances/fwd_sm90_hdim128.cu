/* fwd_sm90_hdim128.cu - the forward kernels of head dim 128, those listed in
 * fwd_kernels.def (one file per head dim, so that they compile in parallel). */
#include "../fwd/fwd_sm90_kernels.cuh"

fattn_status fwd_sm90_hdim128(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v, fwd_kernel k) {
    return fwd_sm90_run_file<false, 128, 128>(ctx, a, v, k);
}
