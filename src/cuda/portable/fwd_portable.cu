/* fwd_portable.cu - the portable forward's host side: fattn_fwd_args into
 * PortableFwdParams, the head dim's instance (a window, softcap or sink: the
 * LOCAL one), on the context's device. */
#include <math.h>

#include "../hopper/launch.cuh" /* hopper_window_of: the window every CUDA kernel takes (host code only) */
#include "fwd_portable.cuh"
#include "fwd_portable.h"

const int fwd_portable_head_dims[5] = {64, 96, 128, 192, 256};

/* the shallower ring's bytes when even they exceed optin (fwd_portable_run's rule) */
template <int D> static int fwd_smem_need(int optin) {
    using C = PortableCfg<D>;
    constexpr int small = portable_fwd_smem_bytes<D, C::NW, C::NS_SMALL>();
    return small <= optin ? 0 : small;
}

int fwd_portable_smem_need(int head_dim, int optin) {
    switch (head_dim) {
    case 64: return fwd_smem_need<64>(optin);
    case 96: return fwd_smem_need<96>(optin);
    case 128: return fwd_smem_need<128>(optin);
    case 192: return fwd_smem_need<192>(optin);
    default: return fwd_smem_need<256>(optin);
    }
}

/* head dim head_dim's instance file, plain or LOCAL (the variants) */
using fwd_portable_fn = fattn_status (*)(fattn_ctx *, const PortableFwdParams &, bool, int);
static fwd_portable_fn fwd_portable_instance(int head_dim, bool local) {
    switch (head_dim) {
    case 64: return local ? fwd_portable_local_hdim64 : fwd_portable_hdim64;
    case 96: return local ? fwd_portable_local_hdim96 : fwd_portable_hdim96;
    case 128: return local ? fwd_portable_local_hdim128 : fwd_portable_hdim128;
    case 192: return local ? fwd_portable_local_hdim192 : fwd_portable_hdim192;
    default: return local ? fwd_portable_local_hdim256 : fwd_portable_hdim256;
    }
}

fattn_status fwd_portable_launch(fattn_ctx *ctx, const fattn_fwd_args *a) {
    const fattn_problem *pr = &a->p;
    PortableFwdParams p;
    p.q = (const uint16_t *)a->q.data;
    p.k = (const uint16_t *)a->k.data;
    p.v = (const uint16_t *)a->v.data;
    p.o = (uint16_t *)a->o.data;
    p.lse = a->lse;
    p.q_sb = a->q.stride_batch; p.q_ss = a->q.stride_seq; p.q_sh = a->q.stride_head;
    p.k_sb = a->k.stride_batch; p.k_ss = a->k.stride_seq; p.k_sh = a->k.stride_head;
    p.v_sb = a->v.stride_batch; p.v_ss = a->v.stride_seq; p.v_sh = a->v.stride_head;
    p.o_sb = a->o.stride_batch; p.o_ss = a->o.stride_seq; p.o_sh = a->o.stride_head;
    p.seqlen_q = pr->seqlen_q;
    p.seqlen_k = pr->seqlen_k;
    p.heads_q = pr->heads_q;
    p.group = pr->heads_q / pr->heads_kv;
    p.cu_q = pr->cu_seqlens_q;
    p.cu_k = pr->cu_seqlens_k;
    p.total_q = pr->total_q;
    p.total_k = pr->total_k;
    p.seqused_k = a->seqused_k;
    p.scale_log2 = pr->softmax_scale * 1.4426950408889634f;
    p.causal = pr->causal != 0;
    /* the variants as the Hopper forward takes them (fwd_local_of, fwd_sm90_launch.cuh) */
    const bool local = pr->window || pr->softcap > 0.f || a->learnable_sink;
    const hopper_window w = hopper_window_of(pr);
    p.win_left = w.left, p.win_right = w.right, p.cap_b = w.cap_b;
    p.sink = a->learnable_sink;
    if (pr->softcap > 0.f) p.scale_log2 = pr->softcap * 1.4426950408889634f;
    const bool bf16 = a->q.dtype == FATTN_DTYPE_BF16;
    /* varlen: the grid covers the longest sequence; nothing to do without rows */
    if (pr->seqlen_q <= 0 || (p.cu_q && p.total_q <= 0)) return FATTN_OK;
    int prev;
    fattn_status s = cuda_ctx_enter(ctx, &prev);
    if (s != FATTN_OK) return s;
    s = fwd_portable_instance(pr->head_dim, local)(ctx, p, bf16, pr->batch);
    cuda_device_leave(prev);
    return s;
}
