/* fwd_sm90_fp8_hdim64.cu - the FP8 forward kernels of head dim 64, those listed
 * in fwd_kernels.def (their own file, so that they compile in parallel with
 * the 16-bit ones). */
#include "../fwd/fwd_sm90_kernels.cuh"

fattn_status fwd_sm90_fp8_hdim64(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v, fwd_kernel k) {
    return fwd_sm90_run_file<true, 64, 64>(ctx, a, v, k);
}
