/* bwd_portable.cu - the portable backward's host side: the workspace (the
 * Hopper backward's layout: fp32 dQ tiles, LSE log2 e and D per 64-row
 * block, the deterministic mode's counters), the preprocess and
 * postprocess (hopper/bwd/bwd_prepost.cuh, plain CUDA) around the head
 * dim's main kernel, on the context's device and stream. */
#include <string.h>

#include "../hopper/bwd/bwd_prepost.cuh"
#include "bwd_portable.cuh"
#include "bwd_portable.h"

const int bwd_portable_head_dims[5] = {64, 96, 128, 192, 256};

/* the shallowest ring's bytes when even they exceed optin (bwd_portable_run's
 * rule: NS_SMALL 0 has no shallower ring) */
template <int D> static int bwd_smem_need(int optin) {
    using C = PortableBwdCfg<D>;
    constexpr int least = portable_bwd_smem_bytes<D, C::NS_SMALL ? C::NS_SMALL : C::NS>();
    return least <= optin ? 0 : least;
}

int bwd_portable_smem_need(int head_dim, int optin) {
    switch (head_dim) {
    case 64: return bwd_smem_need<64>(optin);
    case 96: return bwd_smem_need<96>(optin);
    case 128: return bwd_smem_need<128>(optin);
    case 192: return bwd_smem_need<192>(optin);
    default: return bwd_smem_need<256>(optin);
    }
}

static fattn_status pbwd_main(fattn_ctx *ctx, const PortableBwdParams &p, bool bf16, int d, dim3 grid) {
    switch (d) {
    case 64: return bwd_portable_hdim64(ctx, p, bf16, grid);
    case 96: return bwd_portable_hdim96(ctx, p, bf16, grid);
    case 128: return bwd_portable_hdim128(ctx, p, bf16, grid);
    case 192: return bwd_portable_hdim192(ctx, p, bf16, grid);
    case 256: return bwd_portable_hdim256(ctx, p, bf16, grid);
    default: return fattn_fail(ctx, FATTN_ERROR_INTERNAL, "portable backward: head_dim %d has no kernel", d);
    }
}

template <bool BF16>
static fattn_status pbwd_run(fattn_ctx *ctx, const fattn_bwd_args *a) {
    const fattn_problem *pr = &a->p;
    const cudaStream_t stream = (cudaStream_t)ctx->stream;
    const int D = pr->head_dim, BM = PBWD_BM;
    const bool varlen = pr->cu_seqlens_q != NULL;
    PortableBwdParams p;
    memset(&p, 0, sizeof p);
    p.q = (const uint16_t *)a->q.data;
    p.k = (const uint16_t *)a->k.data;
    p.v = (const uint16_t *)a->v.data;
    p.dout = (const uint16_t *)a->dout.data;
    p.dk = (uint16_t *)a->dk.data;
    p.dv = (uint16_t *)a->dv.data;
    p.q_sb = a->q.stride_batch, p.q_ss = a->q.stride_seq, p.q_sh = a->q.stride_head;
    p.k_sb = a->k.stride_batch, p.k_ss = a->k.stride_seq, p.k_sh = a->k.stride_head;
    p.v_sb = a->v.stride_batch, p.v_ss = a->v.stride_seq, p.v_sh = a->v.stride_head;
    p.do_sb = a->dout.stride_batch, p.do_ss = a->dout.stride_seq, p.do_sh = a->dout.stride_head;
    p.dk_sb = a->dk.stride_batch, p.dk_ss = a->dk.stride_seq, p.dk_sh = a->dk.stride_head;
    p.dv_sb = a->dv.stride_batch, p.dv_ss = a->dv.stride_seq, p.dv_sh = a->dv.stride_head;
    p.seqlen_q = pr->seqlen_q;
    p.seqlen_k = pr->seqlen_k;
    p.heads_q = pr->heads_q;
    p.group = pr->heads_q / pr->heads_kv;
    p.m_blocks = (pr->seqlen_q + BM - 1) / BM;
    p.scale = pr->softmax_scale;
    p.scale_log2 = pr->softmax_scale * 1.4426950408889634f;
    p.causal = pr->causal != 0;
    p.deterministic = a->deterministic != 0;
    if (varlen) {
        p.cu_q = pr->cu_seqlens_q, p.cu_k = pr->cu_seqlens_k;
        p.total_q = pr->total_q, p.total_k = pr->total_k;
        p.rb_total = (int)(((int64_t)pr->total_q + BM * (int64_t)pr->batch) / BM + 1);
        p.seqused_q = a->seqused_q, p.seqused_k = a->seqused_k; /* fixed length: refused (entry.cu) */
    }
    /* workspace: dQ accumulator, LSE log2, D, the counters; per 64-row block
     * of [batch][heads_q][m_blocks], varlen of [heads_q][rb_total] */
    const size_t blocks = varlen ? (size_t)pr->heads_q * p.rb_total : (size_t)pr->batch * pr->heads_q * p.m_blocks;
    const size_t rows = blocks * BM;
    const size_t acc_bytes = rows * D * 4, row_bytes = (rows * 4 + 255) / 256 * 256, sem_bytes = blocks * 4;
    void *ws;
    fattn_status s;
    if ((s = cuda_bwd_workspace(ctx, acc_bytes + 2 * row_bytes + sem_bytes, &ws)) != FATTN_OK) return s;
    p.dq_acc = (float *)ws;
    p.lse2 = (const float *)((char *)ws + acc_bytes);
    p.dsum = (const float *)((char *)ws + acc_bytes + row_bytes);
    p.dq_sem = (int *)((char *)ws + acc_bytes + 2 * row_bytes);

    cudaError_t e = cudaMemsetAsync(p.dq_acc, 0, acc_bytes, stream);
    if (e == cudaSuccess && p.deterministic) e = cudaMemsetAsync(p.dq_sem, 0, sem_bytes, stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fattn_fail(ctx, FATTN_ERROR_CUDA, "portable backward: cudaMemsetAsync: %s", cudaGetErrorString(e));
    }
    /* varlen: grids over the longest sequence's blocks (a length 0 launches nothing) */
    const dim3 qgrid((unsigned)p.m_blocks, (unsigned)pr->heads_q, (unsigned)pr->batch);
    if (varlen) {
        if (p.m_blocks > 0)
            bwd_pre_varlen_kernel<BF16><<<qgrid, 256, 0, stream>>>(
                (const uint16_t *)a->o.data, a->o.stride_seq, a->o.stride_head, (const uint16_t *)a->dout.data,
                a->dout.stride_seq, a->dout.stride_head, a->lse, (float *)p.lse2, (float *)p.dsum, p.cu_q, p.seqused_q,
                p.total_q, pr->seqlen_q, p.rb_total, D);
    } else {
        bwd_pre_kernel<BF16><<<(unsigned)((rows + 7) / 8), 256, 0, stream>>>(
            (const uint16_t *)a->o.data, a->o.stride_batch, a->o.stride_seq, a->o.stride_head,
            (const uint16_t *)a->dout.data, a->dout.stride_batch, a->dout.stride_seq, a->dout.stride_head, a->lse,
            (float *)p.lse2, (float *)p.dsum, pr->heads_q, pr->seqlen_q, p.m_blocks * BM, D, (int64_t)rows);
    }
    if ((s = cuda_launch_error(ctx, "portable backward preprocess")) != FATTN_OK) return s;

    /* one CTA per (key block, kv head, batch entry), grid.x the kernel's
     * (bwd_portable_launch_one); key block n before n + 1 in the launch
     * order, which the deterministic turns rely on */
    const dim3 grid(0u, (unsigned)pr->heads_kv, (unsigned)pr->batch);
    if (pr->seqlen_k > 0 && (s = pbwd_main(ctx, p, BF16, D, grid)) != FATTN_OK) return s;

    if (varlen) {
        if (p.m_blocks > 0)
            bwd_post_varlen_kernel<BF16, true><<<qgrid, 256, 0, stream>>>(p.dq_acc, (uint16_t *)a->dq.data,
                                                                    a->dq.stride_seq, a->dq.stride_head, p.cu_q,
                                                                    p.seqused_q, p.total_q, pr->seqlen_q,
                                                                    p.rb_total, D, D, D, pr->softmax_scale);
    } else {
        const int64_t pairs = (int64_t)pr->batch * pr->heads_q * pr->seqlen_q * D / 2;
        bwd_post_kernel<BF16, true><<<(unsigned)((pairs + 255) / 256), 256, 0, stream>>>(
            p.dq_acc, (uint16_t *)a->dq.data, a->dq.stride_batch, a->dq.stride_seq, a->dq.stride_head, pr->heads_q,
            pr->seqlen_q, D, D, D, pr->softmax_scale, pairs);
    }
    if ((s = cuda_launch_error(ctx, "portable backward postprocess")) != FATTN_OK) return s;
    return cuda_bwd_workspace_done(ctx);
}

fattn_status bwd_portable_launch(fattn_ctx *ctx, const fattn_bwd_args *a) {
    /* (varlen with no query at all still writes dk, dv: zeros) */
    int prev;
    fattn_status s = cuda_ctx_enter(ctx, &prev);
    if (s != FATTN_OK) return s;
    s = a->q.dtype == FATTN_DTYPE_BF16 ? pbwd_run<true>(ctx, a) : pbwd_run<false>(ctx, a);
    cuda_device_leave(prev);
    return s;
}
