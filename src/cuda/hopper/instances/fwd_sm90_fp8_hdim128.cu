/* fwd_sm90_fp8_hdim128.cu - the FP8 forward kernels of head dim 128, those
 * listed in fwd_kernels.def (their own file, so that they compile in parallel
 * with the 16-bit ones). */
#include "../fwd/fwd_sm90_kernels.cuh"

fattn_status fwd_sm90_fp8_hdim128(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v, fwd_kernel k) {
    return fwd_sm90_run_file<true, 128, 128>(ctx, a, v, k);
}
