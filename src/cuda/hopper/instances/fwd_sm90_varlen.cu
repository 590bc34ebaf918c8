/* fwd_sm90_varlen.cu - the forward for variable-length batches (cu_seqlens):
 * the shipped kernels' tiles with VARLEN (each tile looks its sequence up),
 * without the techniques that need fixed lengths (split, O by TMA, SITOUT,
 * QEARLY, SKIPDIAG, CTA pairs: fwd_traits.cuh). */
#include "../fwd/fwd_sm90_kernels.cuh"

constexpr FwdOpts fwd_opts_varlen(FwdOpts o, bool bf16) {
    o.bf16 = bf16;
    o.varlen = true;
    o.split = false, o.otma = 0, o.sitout = 0, o.spread = 0, o.qearly = false, o.skipdiag = false, o.cluster = 1;
    /* the sequence walk's registers: with 3 consumer warpgroups (160
     * registers) and with the producer at 24 or 32 ptxas spilled 4-40
     * bytes; at 40 the two consumer warpgroups keep their 232 */
    if (o.d == 64) o.nc = 2, o.stages = 2;
    if (o.nc == 2) o.preg = 40;
    return o;
}

constexpr FwdOpts fwd_opts_kvcache(FwdOpts o, bool bf16) {
    o = fwd_opts_varlen(o, bf16);
    o.kvcache = true;
    /* the page walk beside the causal sequence order spilled 8-24 bytes in
     * a 40-register producer */
    if (o.nc == 2) o.preg = 56;
    return o;
}

template <fwd_kernel K>
static fattn_status run_varlen(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v) {
    /* cu_seqlens_q alone: the keys in a KV cache, dense or paged */
    if (!a->p.cu_seqlens_k) {
        if (v.bf16) return fwd_sm90_run<FwdCfg<fwd_opts_kvcache(fwd_kernel_opts(K), true)>>(ctx, a, v);
        return fwd_sm90_run<FwdCfg<fwd_opts_kvcache(fwd_kernel_opts(K), false)>>(ctx, a, v);
    }
    if (v.bf16) return fwd_sm90_run<FwdCfg<fwd_opts_varlen(fwd_kernel_opts(K), true)>>(ctx, a, v);
    return fwd_sm90_run<FwdCfg<fwd_opts_varlen(fwd_kernel_opts(K), false)>>(ctx, a, v);
}

fattn_status fwd_sm90_varlen(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v) {
    if (a->p.seqlen_q == 0) return FATTN_OK; /* no sequence has a query: no tile, nothing to write */
    if (v.local) { /* the variants: LOCAL's runtime window, softcap, sinks */
        switch (a->p.head_dim) {
        case 64: return run_varlen<FWD_D64_LOCAL>(ctx, a, v);
        case 128: return run_varlen<FWD_D128_LOCAL>(ctx, a, v);
        case 256: return run_varlen<FWD_D256_LOCAL>(ctx, a, v);
        default: return fattn_fail(ctx, FATTN_ERROR_INTERNAL, "varlen forward: head_dim %d", a->p.head_dim);
        }
    }
    switch (a->p.head_dim) {
    case 64: return v.causal ? run_varlen<FWD_D64_CAUSAL>(ctx, a, v) : run_varlen<FWD_D64>(ctx, a, v);
    case 128: return v.causal ? run_varlen<FWD_D128_CAUSAL>(ctx, a, v) : run_varlen<FWD_D128_176>(ctx, a, v);
    case 256: return v.causal ? run_varlen<FWD_D256_CAUSAL>(ctx, a, v) : run_varlen<FWD_D256>(ctx, a, v);
    default: return fattn_fail(ctx, FATTN_ERROR_INTERNAL, "varlen forward: head_dim %d", a->p.head_dim);
    }
}
