/* fwd_sm90_kernels.cuh - the options of each shipped forward kernel, and how a
 * call runs one: in its dtype, and for the non-causal kernels with the
 * ablation's variants (bf16 only) when fattn_ctx_set_option turned a
 * technique off.  Each choice's tag (v22, f2) names its measurement in
 * docs/perf-notes.md. */
#pragma once
#include "fwd_sm90_launch.cuh"

/* Kernel k's options (fwd_kernels.def): its head dims, then its OPTS. */
constexpr FwdOpts fwd_kernel_opts(fwd_kernel k) {
    FwdOpts o;
    switch (k) {
#define FWD_KERNEL(E, NAME, D, DV, RUN, OPTS) \
    case E:                                   \
        o.d = D, o.dv = D == DV ? 0 : DV;     \
        OPTS;                                 \
        break;
#include "fwd_kernels.def"
    case FWD_KERNEL_COUNT_: break;
    }
    return o;
}
/* an entry's OPTS (which may copy another kernel's) keeps the head dims it
 * lists, and FP8 options go with RUN fp8 */
constexpr bool fwd_kernel_table_agrees() {
    for (int k = 0; k < FWD_KERNEL_COUNT_; ++k) {
        const FwdOpts o = fwd_kernel_opts((fwd_kernel)k);
        if (o.d != fwd_kernel_hdims[k][0] || (o.dv ? o.dv : o.d) != fwd_kernel_hdims[k][1]) return false;
        if (o.fp8 != fwd_kernel_fp8[k]) return false;
    }
    return true;
}
static_assert(fwd_kernel_table_agrees(), "fwd_kernels.def: an entry's options disagree with its D, DV or RUN");

constexpr FwdOpts fwd_opts_dtype(FwdOpts o, bool bf16) {
    o.bf16 = bf16;
    return o;
}
/* The ablation's variant of a non-causal kernel: its tile, cluster and O
 * store, overlap (0 off, 1 on, 3 softmax always under its own PV GEMM) and
 * pingpong as asked, none of the later techniques. */
constexpr FwdOpts fwd_opts_ablation(FwdOpts k, int overlap, bool pingpong) {
    FwdOpts o;
    o.d = k.d, o.dv = k.dv, o.bn = k.bn, o.nc = k.nc, o.stages = k.stages, o.cluster = k.cluster, o.otma = k.otma;
    o.overlap = overlap, o.pingpong = pingpong;
    return o;
}

/* What an instance with options O is told when it is launched directly (the
 * bench harnesses): its own dtype, overlap and pingpong, and the launch flags. */
inline fwd_variant fwd_variant_of(const FwdOpts &o, bool split, bool pdl) {
    fwd_variant v;
    v.bf16 = o.bf16;
    v.causal = o.causal;
    v.overlap = o.overlap != 0;
    v.pingpong = o.pingpong;
    v.under_pv = o.overlap == 3;
    v.split = split;
    v.pdl = pdl;
    v.local = o.local;
    return v;
}

/* The varlen instance of kernel K: its tile with VARLEN (each tile looks
 * its sequence up), without the techniques that need fixed lengths (split,
 * O by TMA, SITOUT, QEARLY, SKIPDIAG, CTA pairs: fwd_traits.cuh). */
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
/* cu_seqlens_q alone: the keys in a KV cache, dense or paged (FwdVarlen) */
constexpr FwdOpts fwd_opts_kvcache(FwdOpts o, bool bf16) {
    o = fwd_opts_varlen(o, bf16);
    o.kvcache = true;
    /* the page walk beside the causal sequence order spilled 8-24 bytes in
     * a 40-register producer */
    if (o.nc == 2) o.preg = 56;
    return o;
}
template <fwd_kernel K>
fattn_status fwd_sm90_run_varlen(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v) {
    if (!a->p.cu_seqlens_k) {
        if (v.bf16) return fwd_sm90_run<FwdCfg<fwd_opts_kvcache(fwd_kernel_opts(K), true)>>(ctx, a, v);
        return fwd_sm90_run<FwdCfg<fwd_opts_kvcache(fwd_kernel_opts(K), false)>>(ctx, a, v);
    }
    if (v.bf16) return fwd_sm90_run<FwdCfg<fwd_opts_varlen(fwd_kernel_opts(K), true)>>(ctx, a, v);
    return fwd_sm90_run<FwdCfg<fwd_opts_varlen(fwd_kernel_opts(K), false)>>(ctx, a, v);
}

/* FP8 kernel K with output dtype bf16 or f16 and the K scale per key or per block */
constexpr FwdOpts fwd_opts_fp8(FwdOpts o, bool bf16, bool kcol) {
    o.bf16 = bf16;
    o.kcol = kcol;
    /* the per-key K scales (BN / 4 registers) spill at 3 warpgroups' 152 */
    if (kcol && o.nc == 3) o.nc = 2;
    return o;
}
template <fwd_kernel K>
fattn_status fwd_sm90_run_fp8(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v) {
    constexpr FwdOpts O = fwd_kernel_opts(K);
    if constexpr (O.kvblk) { /* never per-key K (the dispatch sends that to BN 128) */
        if (v.bf16) return fwd_sm90_run<FwdCfg<fwd_opts_fp8(O, true, false)>>(ctx, a, v);
        return fwd_sm90_run<FwdCfg<fwd_opts_fp8(O, false, false)>>(ctx, a, v);
    } else {
        if (v.bf16) {
            if (v.kcol) return fwd_sm90_run<FwdCfg<fwd_opts_fp8(O, true, true)>>(ctx, a, v);
            return fwd_sm90_run<FwdCfg<fwd_opts_fp8(O, true, false)>>(ctx, a, v);
        }
        if (v.kcol) return fwd_sm90_run<FwdCfg<fwd_opts_fp8(O, false, true)>>(ctx, a, v);
        return fwd_sm90_run<FwdCfg<fwd_opts_fp8(O, false, false)>>(ctx, a, v);
    }
}

/* Run kernel K in the call's dtype. */
template <fwd_kernel K>
fattn_status fwd_sm90_run_kernel(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v) {
    if (v.bf16) return fwd_sm90_run<FwdCfg<fwd_opts_dtype(fwd_kernel_opts(K), true)>>(ctx, a, v);
    return fwd_sm90_run<FwdCfg<fwd_opts_dtype(fwd_kernel_opts(K), false)>>(ctx, a, v);
}

/* Run non-causal kernel K, or one of its ablation variants. */
template <fwd_kernel K>
fattn_status fwd_sm90_run_ablated(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v) {
    constexpr FwdOpts O = fwd_kernel_opts(K);
    static_assert(!O.causal, "fwd_kernels.def: RUN ablated for a causal kernel");
    if (v.full_design()) return fwd_sm90_run_kernel<K>(ctx, a, v);
    if (v.overlap && v.pingpong) return fwd_sm90_run<FwdCfg<fwd_opts_ablation(O, 3, true)>>(ctx, a, v);
    if (v.overlap) {
        if (v.under_pv) return fwd_sm90_run<FwdCfg<fwd_opts_ablation(O, 3, false)>>(ctx, a, v);
        return fwd_sm90_run<FwdCfg<fwd_opts_ablation(O, 1, false)>>(ctx, a, v);
    }
    if (v.pingpong) return fwd_sm90_run<FwdCfg<fwd_opts_ablation(O, 0, true)>>(ctx, a, v);
    return fwd_sm90_run<FwdCfg<fwd_opts_ablation(O, 0, false)>>(ctx, a, v);
}

/* The kernels of one instance file, FP8 or 16-bit, of head dims D and DV:
 * a switch over every entry of fwd_kernels.def that instantiates only the
 * file's own, so that a kernel is added in the list alone.  RUN names the
 * runner (fwd_sm90_run_kernel, _ablated or _fp8). */
constexpr bool fwd_kernel_in_file(fwd_kernel k, bool fp8, int d, int dv) {
    return fwd_kernel_fp8[k] == fp8 && fwd_kernel_hdims[k][0] == d && fwd_kernel_hdims[k][1] == dv;
}
template <bool FP8, int D, int DV>
fattn_status fwd_sm90_run_file(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v, fwd_kernel k) {
    switch (k) {
#define FWD_KERNEL(E, NAME, KD, KDV, RUN, OPTS)                                                     \
    case E:                                                                                          \
        if constexpr (fwd_kernel_in_file(E, FP8, D, DV)) return fwd_sm90_run_##RUN<E>(ctx, a, v); \
        break;
#include "fwd_kernels.def"
    case FWD_KERNEL_COUNT_: break;
    }
    if (DV != D)
        return fattn_fail(ctx, FATTN_ERROR_INTERNAL, "forward kernel %d is not one of head dim %d with head_dim_v %d",
                          (int)k, D, DV);
    return fattn_fail(ctx, FATTN_ERROR_INTERNAL, "forward kernel %d is not %s of head dim %d", (int)k,
                      FP8 ? "an FP8 one" : "one", D);
}
