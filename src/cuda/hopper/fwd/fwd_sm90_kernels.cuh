/* fwd_sm90_kernels.cuh - the options of each shipped forward kernel, and how a
 * call runs one: in its dtype, and for the non-causal kernels with the
 * ablation's variants (bf16 only) when fattn_ctx_set_option turned a
 * technique off.  Each choice's tag (v22, f2) names its measurement in
 * docs/perf-notes.md. */
#pragma once
#include "fwd_sm90_launch.cuh"

constexpr FwdOpts fwd_kernel_opts(fwd_kernel k) {
    FwdOpts o;
    switch (k) {
    case FWD_D64_CAUSAL: /* 3 warpgroups (160 registers) with SITOUT, SKIPDIAG, QREG and OTMA 2 (v22, v23, v26, v45) */
        o.d = 64, o.nc = 3, o.stages = 3, o.causal = true, o.sleep = true, o.sitout = 1, o.skipdiag = true;
        o.qreg = 1, o.otma = 2;
        break;
    case FWD_D64_CAUSAL_2WG:
        o.d = 64, o.causal = true, o.qreg = 2;
        break;
    case FWD_D64: /* SITOUT and SPREAD, Q's first slice in registers, O by TMA (v22, v26, v43) */
        o.d = 64, o.nc = 3, o.stages = 3, o.sitout = 1, o.spread = 1, o.qreg = 1, o.split = true, o.otma = 1;
        break;
    case FWD_D128_CAUSAL: /* QEARLY +1-1.5% at 1024-2048 (v17), QREG 2 (v26), OTMA 2 (v43b) */
        o.causal = true, o.qearly = true, o.sleep = true, o.qreg = 2, o.otma = 2;
        break;
    case FWD_D128_CAUSAL_176: /* SITOUT: ptxas's shorter loop, +1.5-2.1% (v22) */
        o.bn = 176, o.causal = true, o.sleep = true, o.sitout = 1;
        break;
    case FWD_D128_160: /* BN 160 stores O by TMA (v46-v47) */
        o.bn = 160, o.sitout = 2, o.spread = 2, o.split = true, o.otma = 2;
        break;
    case FWD_D128_176: /* SITOUT and SPREAD in the split instance only (v31) */
        o.bn = 176, o.sitout = 2, o.spread = 2, o.split = true;
        break;
    case FWD_D128_192:
        o.bn = 192, o.sitout = 2, o.spread = 2, o.split = true;
        break;
    case FWD_D256_CAUSAL:
        o.d = 256, o.bn = 80, o.causal = true, o.sitout = 1, o.skipdiag = true;
        break;
    case FWD_D256_PAIRED: /* K/V multicast to CTA pairs (v6) */
        o.d = 256, o.bn = 80, o.cluster = 2, o.sitout = 2, o.spread = 2, o.split = true;
        break;
    case FWD_D256:
        o.d = 256, o.bn = 80, o.split = true;
        break;
    /* d64: 3 consumer warpgroups (192 x 128) +17-30% over 2 (f2) */
    case FWD_FP8_D64_CAUSAL: o.d = 64, o.nc = 3, o.causal = true, o.fp8 = true; break;
    case FWD_FP8_D64: o.d = 64, o.nc = 3, o.fp8 = true; break;
    case FWD_FP8_D128_CAUSAL: o.causal = true, o.fp8 = true; break;
    case FWD_FP8_D128: o.fp8 = true; break;
    /* one K and V scale per 192-key block (f4) */
    case FWD_FP8_D128_192_CAUSAL: o.bn = 192, o.causal = true, o.fp8 = true, o.kvblk = true; break;
    case FWD_FP8_D128_192: o.bn = 192, o.fp8 = true, o.kvblk = true; break;
    /* d256: BN 128 is 12-17% faster but spills in its loop (13 instructions:
     * 232 registers, 128 of O and 64 of S; f2) */
    case FWD_FP8_D256_CAUSAL: o.d = 256, o.bn = 64, o.causal = true, o.fp8 = true; break;
    case FWD_FP8_D256: o.d = 256, o.bn = 64, o.fp8 = true; break;
    /* the variants: the causal kernel of the head dim, without SKIPDIAG
     * (its test reads the causal diagonal), the window at runtime */
    case FWD_D64_LOCAL:
        o = fwd_kernel_opts(FWD_D64_CAUSAL), o.skipdiag = false, o.local = true;
        break;
    case FWD_D128_LOCAL: o = fwd_kernel_opts(FWD_D128_CAUSAL), o.local = true; break;
    case FWD_D256_LOCAL:
        o = fwd_kernel_opts(FWD_D256_CAUSAL), o.skipdiag = false, o.local = true;
        break;
    case FWD_FP8_D64_LOCAL: o = fwd_kernel_opts(FWD_FP8_D64_CAUSAL), o.local = true; break;
    case FWD_FP8_D128_LOCAL: o = fwd_kernel_opts(FWD_FP8_D128_CAUSAL), o.local = true; break;
    case FWD_FP8_D256_LOCAL: o = fwd_kernel_opts(FWD_FP8_D256_CAUSAL), o.local = true; break;
    /* issue 37 (compiled, not measured): d96 as d128 (its shared tiles are
     * d128's, the last slab half zeros), without O by TMA */
    case FWD_D96_CAUSAL:
        o.d = 96, o.causal = true, o.qearly = true, o.sleep = true, o.qreg = 2;
        break;
    case FWD_D96: o.d = 96, o.bn = 176, o.sitout = 2, o.spread = 2, o.split = true; break;
    /* the producer spilled 8 bytes at 24 registers */
    case FWD_D96_LOCAL: o = fwd_kernel_opts(FWD_D96_CAUSAL), o.local = true, o.preg = 32; break;
    /* d192: BN 112 is what fits the shared memory (2 stages of 42 KB K and
     * V, 48 KB Q); SITOUT and SKIPDIAG as d256 */
    case FWD_D192_CAUSAL: o.d = 192, o.bn = 112, o.causal = true, o.sitout = 1, o.skipdiag = true; break;
    case FWD_D192: o.d = 192, o.bn = 112, o.split = true; break;
    case FWD_D192_LOCAL:
        o = fwd_kernel_opts(FWD_D192_CAUSAL), o.skipdiag = false, o.local = true;
        break;
    /* d192 with V and O of 128: BN 128 (144 would need 228 KB) */
    case FWD_D192_128_CAUSAL: o.d = 192, o.dv = 128, o.causal = true, o.sleep = true, o.sitout = 1; break;
    case FWD_D192_128: o.d = 192, o.dv = 128, o.sitout = 2, o.spread = 2, o.split = true; break;
    case FWD_D192_128_LOCAL: o = fwd_kernel_opts(FWD_D192_128_CAUSAL), o.local = true; break;
    case FWD_KERNEL_COUNT_: break;
    }
    return o;
}

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
    if (v.full_design()) return fwd_sm90_run_kernel<K>(ctx, a, v);
    if (v.overlap && v.pingpong) return fwd_sm90_run<FwdCfg<fwd_opts_ablation(O, 3, true)>>(ctx, a, v);
    if (v.overlap) {
        if (v.under_pv) return fwd_sm90_run<FwdCfg<fwd_opts_ablation(O, 3, false)>>(ctx, a, v);
        return fwd_sm90_run<FwdCfg<fwd_opts_ablation(O, 1, false)>>(ctx, a, v);
    }
    if (v.pingpong) return fwd_sm90_run<FwdCfg<fwd_opts_ablation(O, 0, true)>>(ctx, a, v);
    return fwd_sm90_run<FwdCfg<fwd_opts_ablation(O, 0, false)>>(ctx, a, v);
}
