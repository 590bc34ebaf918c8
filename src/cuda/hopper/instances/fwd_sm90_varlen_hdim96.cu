/* fwd_sm90_varlen_hdim96.cu - the variable-length forward of head dim 96
 * (fwd_sm90_varlen.cu dispatches here; one file, so it compiles in parallel). */
#include "../fwd/fwd_sm90_kernels.cuh"

fattn_status fwd_sm90_varlen_hdim96(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v) {
    if (v.local) return fwd_sm90_run_varlen<FWD_D96_LOCAL>(ctx, a, v);
    return v.causal ? fwd_sm90_run_varlen<FWD_D96_CAUSAL>(ctx, a, v) : fwd_sm90_run_varlen<FWD_D96>(ctx, a, v);
}
