/* fwd_sm90_dispatch.cu - the forward's kernel choice (the tile-size function)
 * and its entry point.  Each choice's tag (v26, f4) names its measurement
 * in docs/perf-notes.md. */
#include <cuda_runtime.h>

#include "fwd_sm90_dispatch.h"

fwd_kernel fwd_sm90_pick(const fattn_problem *pr, const fwd_variant &v) {
    const int64_t sk = pr->seqlen_k;
    if (v.local) { /* the variants: one kernel per head dim (fwd_sm90_launch) */
        switch (pr->head_dim) {
        case 64: return v.fp8 ? FWD_FP8_D64_LOCAL : FWD_D64_LOCAL;
        case 128: return v.fp8 ? FWD_FP8_D128_LOCAL : FWD_D128_LOCAL;
        case 96: return FWD_D96_LOCAL; /* 16-bit only (entry.cu) */
        case 192: return pr->head_dim_v == 128 ? FWD_D192_128_LOCAL : FWD_D192_LOCAL;
        default: return v.fp8 ? FWD_FP8_D256_LOCAL : FWD_D256_LOCAL;
        }
    }
    if (v.fp8) {
        switch (pr->head_dim) {
        case 64: return v.causal ? FWD_FP8_D64_CAUSAL : FWD_FP8_D64;
        /* BN 192 with one K and one V scale per key block: +13% non-causal,
         * +5% causal over BN 128 (f4); with 128-key scale blocks it lost 11% (f2) */
        case 128:
            if (v.fp8_kv192) return v.causal ? FWD_FP8_D128_192_CAUSAL : FWD_FP8_D128_192;
            return v.causal ? FWD_FP8_D128_CAUSAL : FWD_FP8_D128;
        default: return v.causal ? FWD_FP8_D256_CAUSAL : FWD_FP8_D256;
        }
    }
    switch (pr->head_dim) {
    case 64:
        /* 3 warpgroups (192-row tiles) with OTMA 2 win from seqlen_k 512
         * (v43b); below, 2 warpgroups waste less diagonal */
        if (v.causal) return sk >= 512 ? FWD_D64_CAUSAL : FWD_D64_CAUSAL_2WG;
        return FWD_D64;
    case 128:
        /* BN 176 from seqlen_k 8192: +2.7% at 4096 for BN 128 with QREG 2,
         * -1.5% at 16384 (v26) */
        if (v.causal) return sk >= 8192 ? FWD_D128_CAUSAL_176 : FWD_D128_CAUSAL;
        /* the key block whose padded keys cost least: per key, BN 160 costs
         * 2.8% more than BN 176 and BN 192 the same (v46, v47); ties go
         * to BN 176; the ablation keeps BN 176 */
        if (v.full_design()) {
            const double k160 = 1.028 * (double)((sk + 159) / 160 * 160);
            const double k176 = (double)((sk + 175) / 176 * 176), k192 = (double)((sk + 191) / 192 * 192);
            if (k192 < k176 && k192 <= k160) return FWD_D128_192;
            if (k160 < k176) return FWD_D128_160;
        }
        return FWD_D128_176;
    /* issue 37 (compiled, not yet measured): FlashAttention-3's tiles, but
     * 2 consumer warpgroups at d96 (its 192 x 144 keeps P in shared memory) */
    case 96: return v.causal ? FWD_D96_CAUSAL : FWD_D96;
    case 192:
        if (pr->head_dim_v == 128) return v.causal ? FWD_D192_128_CAUSAL : FWD_D192_128;
        return v.causal ? FWD_D192_CAUSAL : FWD_D192;
    default:
        if (v.causal) return FWD_D256_CAUSAL;
        /* CTA pairs need the query blocks of each head to pair up */
        return ((pr->seqlen_q + 127) / 128) % 2 == 0 ? FWD_D256_PAIRED : FWD_D256;
    }
}

/* every kernel of fwd_kernels.def has an instance file fwd_sm90_launch calls:
 * 16-bit or FP8 at head dims 64, 128 and 256, 16-bit at 96, 192 and 192/128 */
constexpr bool fwd_kernels_have_files() {
    for (int k = 0; k < FWD_KERNEL_COUNT_; ++k) {
        const int d = fwd_kernel_hdims[k][0], dv = fwd_kernel_hdims[k][1];
        const bool both = d == dv && (d == 64 || d == 128 || d == 256);
        const bool b16 = !fwd_kernel_fp8[k] && (d == 96 || d == 192) && (dv == d || (d == 192 && dv == 128));
        if (!both && !b16) return false;
    }
    return true;
}
static_assert(fwd_kernels_have_files(), "fwd_kernels.def: a kernel's head dims have no instance file");

fattn_status fwd_sm90_launch(fattn_ctx *ctx, const fattn_fwd_args *a, const cuda_fwd_options *opt) {
    fwd_variant v;
    static_cast<cuda_fwd_options &>(v) = *opt;
    v.fp8 = a->q.dtype == FATTN_DTYPE_E4M3;
    v.bf16 = (v.fp8 ? a->o.dtype : a->q.dtype) == FATTN_DTYPE_BF16;
    v.causal = a->p.causal != 0;
    v.kcol = v.fp8 && a->k.scale_block == 1;
    v.fp8_kv192 = v.fp8 && !v.kcol && a->k.scale_block % 192 == 0 && a->v.scale_block % 192 == 0;
    /* window, softcap or sink (entry.cu: FP8 the window only; never with
     * the decoding kernel's seqused_k or block_table) */
    v.local = a->p.window || a->p.softcap != 0.f || a->learnable_sink;
    int prev;
    fattn_status s = cuda_ctx_enter(ctx, &prev);
    if (s != FATTN_OK) return s;
    if (a->p.cu_seqlens_q) {
        s = fwd_sm90_varlen(ctx, a, v);
        cuda_device_leave(prev);
        return s;
    }
    if (fwd_fixed_kv(a) && !fwd_fixed_kv_decodes(a)) {
        s = fwd_kvcache_fixed(ctx, a, v);
        cuda_device_leave(prev);
        return s;
    }
    /* the variants too (its LOCAL instances), but softcap where it has none */
    if (fwd_decode_eligible(a) && fwd_decode_softcap_ok(a)) {
        s = fwd_kv8(a) ? fwd_decode_kv8_launch(ctx, a, v) : fwd_decode_launch(ctx, a, v);
        cuda_device_leave(prev);
        return s;
    }
    const fwd_kernel k = fwd_sm90_pick(&a->p, v);
    switch (a->p.head_dim) {
    case 64: s = v.fp8 ? fwd_sm90_fp8_hdim64(ctx, a, v, k) : fwd_sm90_hdim64(ctx, a, v, k); break;
    case 128: s = v.fp8 ? fwd_sm90_fp8_hdim128(ctx, a, v, k) : fwd_sm90_hdim128(ctx, a, v, k); break;
    /* 16-bit only (entry.cu) */
    case 96: s = fwd_sm90_hdim96(ctx, a, v, k); break;
    case 192: s = a->p.head_dim_v == 128 ? fwd_sm90_hdim192_128(ctx, a, v, k) : fwd_sm90_hdim192(ctx, a, v, k); break;
    default: s = v.fp8 ? fwd_sm90_fp8_hdim256(ctx, a, v, k) : fwd_sm90_hdim256(ctx, a, v, k); break;
    }
    cuda_device_leave(prev);
    return s;
}

