/* bwd_sm90_launch.cuh - host side of one Hopper 16-bit backward instance
 * (bwd_sm90.cuh): the dQ accumulator zeroed, the preprocess, the main
 * kernel and the postprocess (bwd_prepost.cuh), and the context-owned
 * workspace they share. */
#pragma once
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

#include "../../cuda_engine.h"
#include "../launch.cuh"
#include "bwd_prepost.cuh"
#include "bwd_sm90.cuh"

/* One backward through kernel instance C (a BwdCfg): the library's entry
 * (bwd_sm90.cu) with the shipped instances, bench/bwd_variants.cu with others. */
template <class C>
fattn_status bwd_sm90_run(fattn_ctx *ctx, const fattn_bwd_args *a) {
    const fattn_problem *pr = &a->p;
    const cudaStream_t stream = (cudaStream_t)ctx->stream;
    constexpr int D = C::D, HD = C::HD, HDV = C::HDV; /* the kernel's head dim, the call's */
    BwdParams p;
    memset(&p, 0, sizeof p);
    p.batch = pr->batch;
    p.heads_q = pr->heads_q;
    p.heads_kv = pr->heads_kv;
    p.group = pr->heads_q / pr->heads_kv;
    p.seqlen_q = pr->seqlen_q;
    p.seqlen_k = pr->seqlen_k;
    p.causal_offset = pr->seqlen_k - pr->seqlen_q;
    p.m_blocks = (pr->seqlen_q + C::BM - 1) / C::BM;
    p.sq_pad = p.m_blocks * C::BM;
    p.scale = pr->softmax_scale;
    p.scale_log2 = pr->softmax_scale * 1.4426950408889634f;
    p.deterministic = a->deterministic != 0;
    p.dk = a->dk.data, p.dk_sb = a->dk.stride_batch, p.dk_ss = a->dk.stride_seq, p.dk_sh = a->dk.stride_head;
    p.dv = a->dv.data, p.dv_sb = a->dv.stride_batch, p.dv_ss = a->dv.stride_seq, p.dv_sh = a->dv.stride_head;
    if constexpr (C::LOCAL) {
        const hopper_window w = hopper_window_of(pr); /* as the forward's */
        p.win_left = w.left, p.win_right = w.right, p.cap_a = w.cap_a, p.cap_b = w.cap_b;
        if (pr->softcap > 0.f) p.cap_t = 1.f / (pr->softcap * 1.4426950408889634f);
    }

    if constexpr (C::VARLEN) {
        p.cu_q = pr->cu_seqlens_q, p.cu_k = pr->cu_seqlens_k;
        p.total_q = pr->total_q, p.total_k = pr->total_k;
        p.rb_total = (int)(((int64_t)pr->total_q + 64 * (int64_t)pr->batch) / 64 + 1);
        p.seqused_q = a->seqused_q, p.seqused_k = a->seqused_k; /* fixed length: refused (entry.cu) */
    }
    /* workspace: dQ accumulator, LSE log2, D, the deterministic mode's
     * counters; per 64-row block of [batch][heads_q][m_blocks], VARLEN of
     * [heads_q][rb_total] */
    const size_t blocks = C::VARLEN ? (size_t)pr->heads_q * p.rb_total : (size_t)pr->batch * pr->heads_q * p.m_blocks;
    const size_t rows = blocks * C::BM;
    const size_t acc_bytes = rows * D * 4, row_bytes = (rows * 4 + 255) / 256 * 256;
    const size_t sem_bytes = blocks * 4;
    void *ws;
    fattn_status s;
    if ((s = cuda_bwd_workspace(ctx, acc_bytes + 2 * row_bytes + sem_bytes, &ws)) != FATTN_OK) return s;
    p.dq_acc = (float *)ws;
    p.lse2 = (const float *)((char *)ws + acc_bytes);
    p.dsum = (const float *)((char *)ws + acc_bytes + row_bytes);
    p.dq_sem = (int *)((char *)ws + acc_bytes + 2 * row_bytes);

    /* VARLEN: maps over the packed [total, heads, dim] tensors (batch 1).
     * The call's head dims: D / 64 boxes of 64 columns load the kernel's
     * tiles, TMA filling the columns past HD (HDV) with zeros */
    const int rq = C::VARLEN ? pr->total_q : pr->seqlen_q, rk = C::VARLEN ? pr->total_k : pr->seqlen_k;
    const int bt = C::VARLEN ? 1 : pr->batch;
    CUtensorMap tq, tk, tv, tdo, tstats;
    if ((s = cuda_make_tensor_map(ctx, &tq, &a->q, HD, rq, pr->heads_q, bt, C::BM, "q")) != FATTN_OK) return s;
    if ((s = cuda_make_tensor_map(ctx, &tk, &a->k, HD, rk, pr->heads_kv, bt, C::BN, "k")) != FATTN_OK) return s;
    if ((s = cuda_make_tensor_map(ctx, &tv, &a->v, HDV, rk, pr->heads_kv, bt, C::BN, "v")) != FATTN_OK) return s;
    if ((s = cuda_make_tensor_map(ctx, &tdo, &a->dout, HDV, rq, pr->heads_q, bt, C::BM, "dout")) != FATTN_OK) return s;

    /* LSE and D side by side as one f32 tensor [2 batch][heads][m_blocks][64]
     * (VARLEN: [2][heads][rb_total][64]): 64 rows per box */
    const int stat_blocks = C::VARLEN ? p.rb_total : p.m_blocks, stat_b = C::VARLEN ? 1 : pr->batch;
    fattn_tensor stats;
    memset(&stats, 0, sizeof stats);
    stats.data = (void *)p.lse2;
    stats.dtype = FATTN_DTYPE_F32;
    stats.stride_seq = C::BM;
    stats.stride_head = (int64_t)stat_blocks * C::BM;
    stats.stride_batch = (int64_t)pr->heads_q * stat_blocks * C::BM;
    if ((s = cuda_tensor_map_4d(ctx, &tstats, &stats, FATTN_DTYPE_F32, C::BM, stat_blocks, pr->heads_q, 2 * stat_b,
                                C::BM, 1, CU_TENSOR_MAP_SWIZZLE_NONE, "lse/D workspace")) != FATTN_OK)
        return s;
    static_assert(C::BM * 4 % 256 == 0, "D follows the LSE with no gap");

    cudaError_t e = cudaMemsetAsync(p.dq_acc, 0, acc_bytes, stream);
    if (e == cudaSuccess && p.deterministic) e = cudaMemsetAsync(p.dq_sem, 0, sem_bytes, stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fattn_fail(ctx, FATTN_ERROR_CUDA, "backward: cudaMemsetAsync: %s", cudaGetErrorString(e));
    }
    /* VARLEN: grids over the longest sequence's blocks (a length 0 launches nothing) */
    const dim3 qgrid((unsigned)p.m_blocks, (unsigned)pr->heads_q, (unsigned)pr->batch);
    if constexpr (C::VARLEN) {
        if (p.m_blocks > 0)
            bwd_pre_varlen_kernel<C::BF16><<<qgrid, 256, 0, stream>>>(
                (const uint16_t *)a->o.data, a->o.stride_seq, a->o.stride_head, (const uint16_t *)a->dout.data,
                a->dout.stride_seq, a->dout.stride_head, a->lse, (float *)p.lse2, (float *)p.dsum, p.cu_q, p.seqused_q,
                p.total_q, pr->seqlen_q, p.rb_total, HDV);
    } else {
        bwd_pre_kernel<C::BF16><<<(unsigned)((rows + 7) / 8), 256, 0, stream>>>(
            (const uint16_t *)a->o.data, a->o.stride_batch, a->o.stride_seq, a->o.stride_head,
            (const uint16_t *)a->dout.data, a->dout.stride_batch, a->dout.stride_seq, a->dout.stride_head, a->lse,
            (float *)p.lse2, (float *)p.dsum, pr->heads_q, pr->seqlen_q, p.sq_pad, HDV, (int64_t)rows);
    }
    if ((s = cuda_launch_error(ctx, "backward preprocess")) != FATTN_OK) return s;
    if (a->dsink) {
        bwd_dsink_kernel<C::VARLEN><<<(unsigned)pr->heads_q, 256, 0, stream>>>(
            p.lse2, p.dsum, a->learnable_sink, a->dsink, pr->batch, pr->heads_q, pr->seqlen_q, p.sq_pad, p.cu_q,
            p.total_q, p.rb_total, p.seqused_q);
        if ((s = cuda_launch_error(ctx, "backward d(sink)")) != FATTN_OK) return s;
    }

    const void *kern = (const void *)bwd_sm90_kernel<C>;
    if ((s = hopper_smem_attr<C>(ctx, kern, C::SMEM_BYTES, "backward: ")) != FATTN_OK) return s;
    hopper_launch L;
    L.grid = bwd_grid<C>(pr, p);
    L.block = dim3(C::THREADS);
    L.smem = C::SMEM_BYTES;
    void *args[6] = {&tq, &tk, &tv, &tdo, &tstats, &p};
    if (L.grid.x > 0 && (s = hopper_launch_kernel(ctx, L, kern, args, "backward main kernel")) != FATTN_OK) return s;

    if constexpr (C::VARLEN) {
        if (p.m_blocks > 0)
            bwd_post_varlen_kernel<C::BF16><<<qgrid, 256, 0, stream>>>(
                p.dq_acc, (uint16_t *)a->dq.data, a->dq.stride_seq, a->dq.stride_head, p.cu_q, p.seqused_q,
                p.total_q, pr->seqlen_q, p.rb_total, C::DQ_N, HD, D, pr->softmax_scale);
    } else {
        const int64_t pairs = (int64_t)pr->batch * pr->heads_q * pr->seqlen_q * HD / 2;
        bwd_post_kernel<C::BF16><<<(unsigned)((pairs + 255) / 256), 256, 0, stream>>>(
            p.dq_acc, (uint16_t *)a->dq.data, a->dq.stride_batch, a->dq.stride_seq, a->dq.stride_head, pr->heads_q,
            pr->seqlen_q, C::DQ_N, HD, D, pr->softmax_scale, pairs);
    }
    if ((s = cuda_launch_error(ctx, "backward postprocess")) != FATTN_OK) return s;
    return cuda_bwd_workspace_done(ctx);
}

/* The shipped instances of base options O (its head dim and VARLEN) by mask
 * and dtype: BwdOpts' defaults otherwise (bwd_sm90.cu, bwd_sm90_varlen.cu). */
template <BwdOpts O>
fattn_status bwd_run_opts(fattn_ctx *ctx, const fattn_bwd_args *a, bool causal, bool bf16) {
    constexpr BwdOpts CB = [] { BwdOpts o = O; o.causal = true, o.bf16 = true; return o; }();
    constexpr BwdOpts CH = [] { BwdOpts o = O; o.causal = true, o.bf16 = false; return o; }();
    constexpr BwdOpts NB = [] { BwdOpts o = O; o.causal = false, o.bf16 = true; return o; }();
    constexpr BwdOpts NH = [] { BwdOpts o = O; o.causal = false, o.bf16 = false; return o; }();
    if (causal) return bf16 ? bwd_sm90_run<BwdCfg<CB>>(ctx, a) : bwd_sm90_run<BwdCfg<CH>>(ctx, a);
    return bf16 ? bwd_sm90_run<BwdCfg<NB>>(ctx, a) : bwd_sm90_run<BwdCfg<NH>>(ctx, a);
}

/* The variants' instances (BwdOpts.local) of base options O by dtype. */
template <BwdOpts O>
fattn_status bwd_run_local(fattn_ctx *ctx, const fattn_bwd_args *a, bool bf16) {
    constexpr BwdOpts LB = [] { BwdOpts o = O; o.local = true, o.bf16 = true; return o; }();
    constexpr BwdOpts LH = [] { BwdOpts o = O; o.local = true, o.bf16 = false; return o; }();
    return bf16 ? bwd_sm90_run<BwdCfg<LB>>(ctx, a) : bwd_sm90_run<BwdCfg<LH>>(ctx, a);
}

/* A call that needs the variants' kernel: a window or softcap (a sink needs
 * only d(sink), bwd_dsink_kernel, beside any instance). */
inline bool bwd_wants_local(const fattn_problem *pr) { return pr->window || pr->softcap > 0.f; }

/* The instances of base options O (head dim; fixed-length or VARLEN): a
 * window or softcap on the LOCAL ones, else by mask and dtype. */
template <BwdOpts O>
fattn_status bwd_run_base(fattn_ctx *ctx, const fattn_bwd_args *a, bool causal, bool bf16) {
    if (bwd_wants_local(&a->p)) return bwd_run_local<O>(ctx, a, bf16);
    return bwd_run_opts<O>(ctx, a, causal, bf16);
}

/* variable-length batches: the instances of bwd_sm90_varlen.cu (D 64, 128, 256) */
template <int D>
fattn_status bwd_sm90_varlen_d(fattn_ctx *ctx, const fattn_bwd_args *a, bool causal, bool bf16);
/* head dims 96, 192 and 192/128 (issue 37: the d128 and d256 kernels with
 * BwdOpts.hd, hdv), fixed-length and VARLEN, one file each */
fattn_status bwd_sm90_hdim96(fattn_ctx *ctx, const fattn_bwd_args *a, bool causal, bool bf16);
fattn_status bwd_sm90_hdim192(fattn_ctx *ctx, const fattn_bwd_args *a, bool causal, bool bf16);
fattn_status bwd_sm90_hdim192_128(fattn_ctx *ctx, const fattn_bwd_args *a, bool causal, bool bf16);
fattn_status bwd_sm90_varlen_hdim96(fattn_ctx *ctx, const fattn_bwd_args *a, bool causal, bool bf16);
fattn_status bwd_sm90_varlen_hdim192(fattn_ctx *ctx, const fattn_bwd_args *a, bool causal, bool bf16);
fattn_status bwd_sm90_varlen_hdim192_128(fattn_ctx *ctx, const fattn_bwd_args *a, bool causal, bool bf16);
