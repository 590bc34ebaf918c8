/* fwd_sm90_fp8_hdim64.cu - the FP8 forward kernels of head dim 64 (their own
 * file, so that they compile in parallel with the 16-bit ones). */
#include "../fwd/fwd_sm90_kernels.cuh"

fattn_status fwd_sm90_fp8_hdim64(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v, fwd_kernel k) {
    switch (k) {
    case FWD_FP8_D64_CAUSAL: return fwd_sm90_run_fp8<FWD_FP8_D64_CAUSAL>(ctx, a, v);
    case FWD_FP8_D64: return fwd_sm90_run_fp8<FWD_FP8_D64>(ctx, a, v);
    case FWD_FP8_D64_LOCAL: return fwd_sm90_run_fp8<FWD_FP8_D64_LOCAL>(ctx, a, v);
    default: return fattn_fail(ctx, FATTN_ERROR_INTERNAL, "forward kernel %d is not an FP8 one of head dim 64", (int)k);
    }
}
