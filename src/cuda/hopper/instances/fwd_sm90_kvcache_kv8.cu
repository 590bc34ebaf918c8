/* fwd_sm90_kvcache_kv8.cu - varlen queries on an FP8 KV cache (e4m3 k and v,
 * f16 / bf16 q; fattn.h): the KV-cache instances of the head dim 64, 128
 * and 256 kernels with KV8, their key blocks gathered and dequantised into
 * the 16-bit stages (fwd_gather.cuh); one file, so it compiles in parallel. */
#include "../fwd/fwd_sm90_kernels.cuh"

constexpr FwdOpts fwd_opts_kv8(FwdOpts o, bool bf16) {
    o = fwd_opts_kvcache(o, bf16);
    o.kv8 = true;
    return o;
}
template <fwd_kernel K>
static fattn_status run_kv8(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v) {
    if (v.bf16) return fwd_sm90_run<FwdCfg<fwd_opts_kv8(fwd_kernel_opts(K), true)>>(ctx, a, v);
    return fwd_sm90_run<FwdCfg<fwd_opts_kv8(fwd_kernel_opts(K), false)>>(ctx, a, v);
}

fattn_status fwd_sm90_kvcache_kv8(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v) {
    switch (a->p.head_dim) {
    case 64:
        return v.local ? run_kv8<FWD_D64_LOCAL>(ctx, a, v)
                       : v.causal ? run_kv8<FWD_D64_CAUSAL>(ctx, a, v) : run_kv8<FWD_D64>(ctx, a, v);
    case 128:
        return v.local ? run_kv8<FWD_D128_LOCAL>(ctx, a, v)
                       : v.causal ? run_kv8<FWD_D128_CAUSAL>(ctx, a, v) : run_kv8<FWD_D128_176>(ctx, a, v);
    case 256:
        return v.local ? run_kv8<FWD_D256_LOCAL>(ctx, a, v)
                       : v.causal ? run_kv8<FWD_D256_CAUSAL>(ctx, a, v) : run_kv8<FWD_D256>(ctx, a, v);
    default: return fattn_fail(ctx, FATTN_ERROR_INTERNAL, "FP8 KV cache prefill: head_dim %d", a->p.head_dim);
    }
}
