/* bwd_sm90.cu - the library's entry to the Hopper 16-bit backward: the
 * shipped kernel instances (BwdOpts' defaults) by head dim, mask and dtype;
 * the host side of an instance is bwd_sm90_launch.cuh, the kernel
 * bwd_sm90.cuh. */
#include "../bwd/bwd_sm90_launch.cuh"

template <int D>
static fattn_status bwd_run_d(fattn_ctx *ctx, const fattn_bwd_args *a, bool causal, bool bf16) {
    if (a->p.cu_seqlens_q) return bwd_sm90_varlen_d<D>(ctx, a, causal, bf16);
    if (bwd_wants_local(&a->p)) return bwd_run_local<BwdOpts{.d = D}>(ctx, a, bf16);
    return bwd_run_opts<BwdOpts{.d = D}>(ctx, a, causal, bf16);
}

fattn_status bwd_sm90_launch(fattn_ctx *ctx, const fattn_bwd_args *a) {
    int prev;
    fattn_status s = cuda_ctx_enter(ctx, &prev);
    if (s != FATTN_OK) return s;
    const bool causal = a->p.causal != 0, bf16 = a->q.dtype == FATTN_DTYPE_BF16, vl = a->p.cu_seqlens_q != NULL;
    switch (a->p.head_dim) {
    case 64: s = bwd_run_d<64>(ctx, a, causal, bf16); break;
    case 128: s = bwd_run_d<128>(ctx, a, causal, bf16); break;
    case 256: s = bwd_run_d<256>(ctx, a, causal, bf16); break;
    /* issue 37: the d128 and d256 kernels with the call's head dims (BwdOpts.hd, hdv) */
    case 96: s = vl ? bwd_sm90_varlen_hdim96(ctx, a, causal, bf16) : bwd_sm90_hdim96(ctx, a, causal, bf16); break;
    case 192:
        if (a->p.head_dim_v == 128)
            s = vl ? bwd_sm90_varlen_hdim192_128(ctx, a, causal, bf16) : bwd_sm90_hdim192_128(ctx, a, causal, bf16);
        else
            s = vl ? bwd_sm90_varlen_hdim192(ctx, a, causal, bf16) : bwd_sm90_hdim192(ctx, a, causal, bf16);
        break;
    default:
        s = fattn_fail(ctx, FATTN_ERROR_INTERNAL, "backward: head_dim %d has no kernel", a->p.head_dim);
        break;
    }
    cuda_device_leave(prev);
    return s;
}
