/* bwd_sm90_launch.cuh - host side of one Hopper 16-bit backward instance
 * (bwd_sm90.cuh): the preprocess (D = rowsum(dO O), the LSE in log2 units,
 * the dQ accumulator zeroed), the main kernel, the postprocess (dQ =
 * softmax_scale dQ_acc in the output dtype), and the context-owned workspace
 * they share. */
#pragma once
#include <cuda_runtime.h>
#include <math.h>
#include <string.h>

#include "../cuda_engine.h"
#include "bwd_sm90.cuh"

template <bool BF16>
__device__ __forceinline__ float bwd_load16(uint16_t x) {
    return BF16 ? __bfloat162float(__ushort_as_bfloat16(x)) : __half2float(__ushort_as_half(x));
}
template <bool BF16>
__device__ __forceinline__ void bwd_store16x2(uint16_t *dst, float x0, float x1) {
    if (BF16) {
        dst[0] = __bfloat16_as_ushort(__float2bfloat16_rn(x0));
        dst[1] = __bfloat16_as_ushort(__float2bfloat16_rn(x1));
    } else {
        dst[0] = __half_as_ushort(__float2half_rn(x0));
        dst[1] = __half_as_ushort(__float2half_rn(x1));
    }
}

/* One warp per query row: D = sum(dO O) over the head dim, in fp32, and the
 * LSE in log2 units (+inf where the row saw no key or is padding: P = 0). */
template <bool BF16>
__global__ void __launch_bounds__(256) bwd_pre_kernel(const uint16_t *o, int64_t o_sb, int64_t o_ss, int64_t o_sh,
                                                      const uint16_t *dout, int64_t d_sb, int64_t d_ss, int64_t d_sh,
                                                      const float *lse, float *lse2, float *dsum, int heads, int seqlen_q,
                                                      int sq_pad, int d, int64_t rows) {
    const int64_t row = (int64_t)blockIdx.x * 8 + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const int i = (int)(row % sq_pad);
    const int64_t bh = row / sq_pad;
    const int h = (int)(bh % heads), b = (int)(bh / heads);
    float acc = 0.f, l2 = INFINITY;
    if (i < seqlen_q) {
        const uint16_t *po = o + b * o_sb + i * o_ss + h * o_sh, *pd = dout + b * d_sb + i * d_ss + h * d_sh;
        for (int c = lane; c < d; c += 32) acc = fmaf(bwd_load16<BF16>(po[c]), bwd_load16<BF16>(pd[c]), acc);
        const float l = lse[bh * seqlen_q + i];
        l2 = l == -INFINITY ? INFINITY : l * 1.4426950408889634f;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) {
        dsum[row] = acc;
        lse2[row] = l2;
    }
}

/* dq = softmax_scale dq_acc (tiles in bwd_dq_index's order), two elements per thread. */
template <bool BF16>
__global__ void __launch_bounds__(256) bwd_post_kernel(const float *acc, uint16_t *dq, int64_t q_sb, int64_t q_ss,
                                                       int64_t q_sh, int heads, int seqlen_q, int width, int d,
                                                       float scale, int64_t pairs) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= pairs) return;
    const int64_t e = 2 * t;
    const int c = (int)(e % d);
    const int64_t row = e / d; /* over [batch][heads][seqlen_q] */
    const int i = (int)(row % seqlen_q);
    const int64_t bh = row / seqlen_q;
    const int h = (int)(bh % heads), b = (int)(bh / heads);
    const float *tile = acc + (bh * ((seqlen_q + 63) / 64) + i / 64) * 64 * d;
    const float2 x = *(const float2 *)(tile + bwd_dq_index(i % 64, c, width)); /* c even: c, c + 1 adjacent */
    uint16_t *dst = dq + b * q_sb + i * q_ss + h * q_sh + c;
    bwd_store16x2<BF16>(dst, x.x * scale, x.y * scale);
}

/* VARLEN preprocess: block (m, h, b) = query block m of head h, sequence b
 * (the grid covers the longest); 8 warps, 8 rows each: D and the LSE in log2
 * units at the row's place in the workspace ([2][heads][rb_total][64]),
 * the block's rows past the sequence as padding (D 0, LSE +inf: P = 0). */
template <bool BF16>
__global__ void __launch_bounds__(256) bwd_pre_varlen_kernel(const uint16_t *o, int64_t o_ss, int64_t o_sh,
                                                             const uint16_t *dout, int64_t d_ss, int64_t d_sh,
                                                             const float *lse, float *lse2, float *dsum,
                                                             const int *cu_q, int total_q, int max_q, int rb_total,
                                                             int d) {
    const int m = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    int q0, lq;
    varlen_rows(cu_q, b, total_q, max_q, q0, lq);
    if (m * 64 >= lq) return;
    const size_t tile = ((size_t)h * rb_total + bwd_varlen_rb(q0, b) + m) * 64;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int r = warp; r < 64; r += 8) {
        const int i = m * 64 + r;
        float acc = 0.f, l2 = INFINITY;
        if (i < lq) {
            const int64_t row = (int64_t)q0 + i;
            const uint16_t *po = o + row * o_ss + h * o_sh, *pd = dout + row * d_ss + h * d_sh;
            for (int c = lane; c < d; c += 32) acc = fmaf(bwd_load16<BF16>(po[c]), bwd_load16<BF16>(pd[c]), acc);
            const float l = lse[(int64_t)h * total_q + row];
            l2 = l == -INFINITY ? INFINITY : l * 1.4426950408889634f;
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (lane == 0) {
            dsum[tile + r] = acc;
            lse2[tile + r] = l2;
        }
    }
}

/* VARLEN postprocess: block (m, h, b) writes dq = softmax_scale dq_acc for
 * the rows of query block m of sequence b that exist. */
template <bool BF16>
__global__ void __launch_bounds__(256) bwd_post_varlen_kernel(const float *acc, uint16_t *dq, int64_t q_ss, int64_t q_sh,
                                                              const int *cu_q, int total_q, int max_q, int rb_total,
                                                              int width, int d, float scale) {
    const int m = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    int q0, lq;
    varlen_rows(cu_q, b, total_q, max_q, q0, lq);
    if (m * 64 >= lq) return;
    const float *tile = acc + ((size_t)h * rb_total + bwd_varlen_rb(q0, b) + m) * 64 * d;
    const int rows = min(64, lq - m * 64);
    for (int t = threadIdx.x; t < rows * d / 2; t += blockDim.x) {
        const int r = 2 * t / d, c = 2 * t % d;
        const float2 x = *(const float2 *)(tile + bwd_dq_index(r, c, width)); /* c even: c, c + 1 adjacent */
        uint16_t *dst = dq + ((int64_t)q0 + m * 64 + r) * q_ss + h * q_sh + c;
        bwd_store16x2<BF16>(dst, x.x * scale, x.y * scale);
    }
}

static inline fattn_status bwd_launch_error(fattn_ctx *ctx, const char *what) {
    const cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return FATTN_OK;
    return fattn_fail(ctx, FATTN_ERROR_CUDA, "backward %s launch: %s", what, cudaGetErrorString(e));
}

/* One backward through kernel instance C (a BwdCfg): the library's entry
 * (bwd_sm90.cu) with the shipped instances, bench/bwd_variants.cu with others. */
template <class C>
fattn_status bwd_sm90_run(fattn_ctx *ctx, const fattn_bwd_args *a) {
    const fattn_problem *pr = &a->p;
    const cudaStream_t stream = (cudaStream_t)ctx->stream;
    constexpr int D = C::D;
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

    if constexpr (C::VARLEN) {
        p.cu_q = pr->cu_seqlens_q, p.cu_k = pr->cu_seqlens_k;
        p.total_q = pr->total_q, p.total_k = pr->total_k;
        p.rb_total = (int)(((int64_t)pr->total_q + 64 * (int64_t)pr->batch) / 64 + 1);
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

    /* VARLEN: maps over the packed [total, heads, dim] tensors (batch 1) */
    const int rq = C::VARLEN ? pr->total_q : pr->seqlen_q, rk = C::VARLEN ? pr->total_k : pr->seqlen_k;
    const int bt = C::VARLEN ? 1 : pr->batch;
    CUtensorMap tq, tk, tv, tdo, tstats;
    if ((s = cuda_make_tensor_map(ctx, &tq, &a->q, D, rq, pr->heads_q, bt, C::BM, "q")) != FATTN_OK) return s;
    if ((s = cuda_make_tensor_map(ctx, &tk, &a->k, D, rk, pr->heads_kv, bt, C::BN, "k")) != FATTN_OK) return s;
    if ((s = cuda_make_tensor_map(ctx, &tv, &a->v, D, rk, pr->heads_kv, bt, C::BN, "v")) != FATTN_OK) return s;
    if ((s = cuda_make_tensor_map(ctx, &tdo, &a->dout, D, rq, pr->heads_q, bt, C::BM, "dout")) != FATTN_OK) return s;

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
                a->dout.stride_seq, a->dout.stride_head, a->lse, (float *)p.lse2, (float *)p.dsum, p.cu_q, p.total_q,
                pr->seqlen_q, p.rb_total, D);
    } else {
        bwd_pre_kernel<C::BF16><<<(unsigned)((rows + 7) / 8), 256, 0, stream>>>(
            (const uint16_t *)a->o.data, a->o.stride_batch, a->o.stride_seq, a->o.stride_head,
            (const uint16_t *)a->dout.data, a->dout.stride_batch, a->dout.stride_seq, a->dout.stride_head, a->lse,
            (float *)p.lse2, (float *)p.dsum, pr->heads_q, pr->seqlen_q, p.sq_pad, D, (int64_t)rows);
    }
    if ((s = bwd_launch_error(ctx, "preprocess")) != FATTN_OK) return s;

    auto kern = bwd_sm90_kernel<C>;
    e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM_BYTES);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fattn_fail(ctx, FATTN_ERROR_CUDA, "backward: cudaFuncSetAttribute: %s", cudaGetErrorString(e));
    }
    const unsigned nblk = (unsigned)((pr->seqlen_k + C::BN - 1) / C::BN);
    dim3 grid(nblk, (unsigned)pr->heads_kv, (unsigned)pr->batch);
    if (C::LPT && (uint64_t)nblk * pr->heads_kv * pr->batch <= 0x7FFFFFFFu) {
        /* as many kv heads a group as keep their Q, dO (16-bit) and dQ
         * accumulator (fp32) within 32 MiB of the 60 MB L2 */
        const double head_bytes = (double)pr->seqlen_q * D * 8.0 * (pr->heads_q / pr->heads_kv);
        const double g = (32.0 * 1024 * 1024) / (head_bytes > 1.0 ? head_bytes : 1.0);
        p.lpt_group = g < 1.0 ? 1 : g > (double)pr->heads_kv * pr->batch ? pr->heads_kv * pr->batch : (int)g;
        grid = dim3(nblk * (unsigned)pr->heads_kv * (unsigned)pr->batch, 1, 1);
        p.spt = C::CAUSAL && p.deterministic;
    }
    if (grid.x > 0) kern<<<grid, C::THREADS, C::SMEM_BYTES, stream>>>(tq, tk, tv, tdo, tstats, p);
    if ((s = bwd_launch_error(ctx, "main kernel")) != FATTN_OK) return s;

    if constexpr (C::VARLEN) {
        if (p.m_blocks > 0)
            bwd_post_varlen_kernel<C::BF16><<<qgrid, 256, 0, stream>>>(
                p.dq_acc, (uint16_t *)a->dq.data, a->dq.stride_seq, a->dq.stride_head, p.cu_q, p.total_q,
                pr->seqlen_q, p.rb_total, C::DQ_N, D, pr->softmax_scale);
    } else {
        const int64_t pairs = (int64_t)pr->batch * pr->heads_q * pr->seqlen_q * D / 2;
        bwd_post_kernel<C::BF16><<<(unsigned)((pairs + 255) / 256), 256, 0, stream>>>(
            p.dq_acc, (uint16_t *)a->dq.data, a->dq.stride_batch, a->dq.stride_seq, a->dq.stride_head, pr->heads_q,
            pr->seqlen_q, C::DQ_N, D, pr->softmax_scale, pairs);
    }
    if ((s = bwd_launch_error(ctx, "postprocess")) != FATTN_OK) return s;
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

/* variable-length batches: the instances of bwd_sm90_varlen.cu (D 64, 128, 256) */
template <int D>
fattn_status bwd_sm90_varlen_d(fattn_ctx *ctx, const fattn_bwd_args *a, bool causal, bool bf16);
