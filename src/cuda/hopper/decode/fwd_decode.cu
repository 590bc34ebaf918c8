/* fwd_decode.cu - host side of the decoding forward (fwd_decode.cuh): which
 * problems take it, the key split, the tensor maps (contiguous or paged),
 * the launch of the kernel and of the split merge. */
#include <cuda_runtime.h>

#include <atomic>
#include <string.h>

#include "../../cuda_engine.h"
#include "fwd_decode.cuh"
#include "../fwd/fwd_sm90_dispatch.h"

bool fwd_decode_eligible(const fattn_fwd_args *a) {
    const fattn_problem *p = &a->p;
    if (a->q.dtype == FATTN_DTYPE_E4M3 || p->cu_seqlens_q || p->cu_seqlens_k) return false;
    /* its instances (fwd_decode_launch); 96 and 192 take the main kernels */
    if (p->head_dim != p->head_dim_v || (p->head_dim != 64 && p->head_dim != 128 && p->head_dim != 256)) return false;
    const int group = p->heads_q / p->heads_kv;
    return p->seqlen_q <= FWD_DECODE_MAX_SEQLEN_Q && (int64_t)group * p->seqlen_q <= fwd_decode_max_rows(p->head_dim);
}

/* Splits of the keys: the count whose CTAs fill the SMs' slots best, each
 * split's prologue (its first block's latency) counted as one more block,
 * one split (no merge) on ties.  units: (batch, kv head) pairs. */
static int decode_splits(int units, int nblocks, int slots, int *blocks_per_split) {
    int best = 1, best_bps = nblocks;
    double best_score = 0;
    const int max_s = nblocks < 256 ? nblocks : 256;
    for (int s = 1; s <= max_s; ++s) {
        const int bps = (nblocks + s - 1) / s, real = (nblocks + bps - 1) / bps;
        if (real != s) continue; /* the same split as a smaller s */
        const long long ctas = (long long)units * real, waves = (ctas + slots - 1) / slots;
        const double score = (double)ctas / ((double)waves * slots) * bps / (bps + 1.0) * (s == 1 ? 1.02 : 1.0);
        if (score > best_score + 1e-9) best_score = score, best = s, best_bps = bps;
    }
    *blocks_per_split = best_bps;
    return best;
}

template <class C>
static fattn_status decode_smem_attr(fattn_ctx *ctx) {
    static std::atomic<uint64_t> set{0};
    const uint64_t bit = ctx->device < 64 ? 1ull << ctx->device : 0;
    if (bit && (set.load(std::memory_order_relaxed) & bit)) return FATTN_OK;
    cudaError_t e = cudaFuncSetAttribute(fwd_decode_kernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM_BYTES);
    if (e != cudaSuccess) return fattn_fail(ctx, FATTN_ERROR_CUDA, "cudaFuncSetAttribute: %s", cudaGetErrorString(e));
    set.fetch_or(bit, std::memory_order_relaxed);
    return FATTN_OK;
}

template <class C>
static fattn_status decode_run(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v) {
    const fattn_problem *pr = &a->p;
    const fattn_cuda_state *st = (const fattn_cuda_state *)ctx->cuda;
    fattn_status s;
    DecParams p;
    memset(&p, 0, sizeof p);
    p.q = a->q.data;
    p.q_sb = a->q.stride_batch, p.q_ss = a->q.stride_seq, p.q_sh = a->q.stride_head;
    p.o = a->o.data;
    p.o_sb = a->o.stride_batch, p.o_ss = a->o.stride_seq, p.o_sh = a->o.stride_head;
    p.lse = a->lse;
    p.batch = pr->batch, p.heads_q = pr->heads_q, p.heads_kv = pr->heads_kv;
    p.group = pr->heads_q / pr->heads_kv;
    p.seqlen_q = pr->seqlen_q, p.seqlen_k = pr->seqlen_k, p.rows = p.group * pr->seqlen_q;
    p.causal = pr->causal != 0;
    p.seqused_k = a->seqused_k;
    p.softmax_scale = pr->softmax_scale;
    p.scale_log2 = pr->softmax_scale * 1.4426950408889634f;
    if (C::LOCAL) {
        /* the variants (fwd_local_of's conventions: causal folded into right
         * = 0; a side past every key unbounded) */
        p.win_left = pr->window && pr->window_left >= 0 && pr->window_left < pr->seqlen_k ? pr->window_left : -1;
        p.win_right = pr->causal ? 0
                      : pr->window && pr->window_right >= 0 && pr->window_right < pr->seqlen_q ? pr->window_right
                                                                                              : -1;
        if (pr->softcap > 0.f) {
            p.cap_a = pr->softcap / pr->softmax_scale;
            p.cap_b = pr->softmax_scale / pr->softcap;
        }
        p.sink = a->learnable_sink;
    }
    if (pr->batch > 65535 || pr->heads_kv > 65535)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED, "decoding kernel: batch %d and heads_kv %d must be <= 65535",
                          pr->batch, pr->heads_kv);
    CUtensorMap tk, tv;
    if (C::PAGED) {
        p.block_table = a->block_table;
        p.page_size = a->page_size, p.max_pages = a->max_pages_per_seq, p.num_pages = a->num_pages;
        while ((1 << p.page_shift) < a->page_size) ++p.page_shift;
        const int box = a->page_size < C::BN ? a->page_size : C::BN;
        if ((s = cuda_make_tensor_map(ctx, &tk, &a->k, C::D, a->page_size, pr->heads_kv, a->num_pages, box, "k")) != FATTN_OK)
            return s;
        if ((s = cuda_make_tensor_map(ctx, &tv, &a->v, C::D, a->page_size, pr->heads_kv, a->num_pages, box, "v")) != FATTN_OK)
            return s;
    } else {
        if ((s = cuda_make_tensor_map(ctx, &tk, &a->k, C::D, pr->seqlen_k, pr->heads_kv, pr->batch, C::BN, "k")) != FATTN_OK)
            return s;
        if ((s = cuda_make_tensor_map(ctx, &tv, &a->v, C::D, pr->seqlen_k, pr->heads_kv, pr->batch, C::BN, "v")) != FATTN_OK)
            return s;
    }
    int nblocks = (pr->seqlen_k + C::BN - 1) / C::BN;
    /* LOCAL: the splits share the window's blocks (dec_window), at most
     * ceil((left + seqlen_q + right) / BN) + 1 of them with a left side */
    if (C::LOCAL && p.win_left >= 0) {
        const int64_t span = (int64_t)p.win_left + pr->seqlen_q + (p.win_right < 0 ? 0 : p.win_right);
        const int64_t wnb = (span + C::BN - 1) / C::BN + 1;
        if (wnb < nblocks) nblocks = (int)wnb;
    }
    const int slots = st->num_sms * (C::D <= 128 ? 2 : 1);
    int bps = nblocks;
    int splits = v.split ? decode_splits(pr->batch * pr->heads_kv, nblocks, slots, &bps) : 1;
    void *ws = NULL;
    if (splits > 1) {
        const size_t bytes = (size_t)splits * pr->batch * pr->heads_kv * p.rows * (C::D + 1) * 4;
        if ((s = cuda_decode_workspace(ctx, bytes, &ws)) != FATTN_OK) return s;
        if (!ws) splits = 1, bps = nblocks; /* none now (graph capture): one split */
    }
    p.splits = splits, p.blocks_per_split = bps;
    if (splits > 1) {
        p.ws_o = (float *)ws;
        p.ws_lse = p.ws_o + (size_t)splits * pr->batch * pr->heads_kv * p.rows * C::D;
    }
    if ((s = decode_smem_attr<C>(ctx)) != FATTN_OK) return s;
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = dim3(splits, pr->heads_kv, pr->batch);
    cfg.blockDim = dim3(C::THREADS);
    cfg.dynamicSmemBytes = C::SMEM_BYTES;
    cfg.stream = (cudaStream_t)ctx->stream;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = v.pdl ? 1 : 0;
    cudaError_t e = cudaLaunchKernelEx(&cfg, fwd_decode_kernel<C>, tk, tv, p);
    if (e == cudaSuccess && splits > 1) {
        const int rows = pr->batch * pr->heads_kv * p.rows;
        cfg.gridDim = dim3((rows + 3) / 4);
        cfg.blockDim = dim3(128);
        cfg.dynamicSmemBytes = 0;
        e = cudaLaunchKernelEx(&cfg, fwd_decode_combine<C::D, C::BF16, C::LOCAL>, p);
    }
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess) return fattn_fail(ctx, FATTN_ERROR_CUDA, "decoding kernel launch: %s", cudaGetErrorString(e));
    return splits > 1 ? cuda_decode_workspace_done(ctx) : FATTN_OK;
}

template <int D, bool BF16, bool PAGED, bool LOCAL>
static fattn_status decode_rows(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v) {
    const int rows = a->p.heads_q / a->p.heads_kv * a->p.seqlen_q;
    if (rows <= 16) return decode_run<DecCfg<D, 1, BF16, PAGED, LOCAL>>(ctx, a, v);
    if (rows <= 32) return decode_run<DecCfg<D, 2, BF16, PAGED, LOCAL>>(ctx, a, v);
    if constexpr (D < 256) return decode_run<DecCfg<D, 4, BF16, PAGED, LOCAL>>(ctx, a, v);
    return fattn_fail(ctx, FATTN_ERROR_INTERNAL, "decoding kernel: %d rows at head dim %d", rows, D);
}

template <int D, bool LOCAL>
static fattn_status decode_dl(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v) {
    const bool paged = a->block_table != NULL;
    if (v.bf16)
        return paged ? decode_rows<D, true, true, LOCAL>(ctx, a, v) : decode_rows<D, true, false, LOCAL>(ctx, a, v);
    return paged ? decode_rows<D, false, true, LOCAL>(ctx, a, v) : decode_rows<D, false, false, LOCAL>(ctx, a, v);
}

/* the variants (window, softcap, sink: fwd_variant.local) on the LOCAL instances */
template <int D>
static fattn_status decode_d(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v) {
    return v.local ? decode_dl<D, true>(ctx, a, v) : decode_dl<D, false>(ctx, a, v);
}

fattn_status fwd_decode_launch(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v) {
    switch (a->p.head_dim) {
    case 64: return decode_d<64>(ctx, a, v);
    case 128: return decode_d<128>(ctx, a, v);
    case 256: return decode_d<256>(ctx, a, v);
    default: return fattn_fail(ctx, FATTN_ERROR_INTERNAL, "decoding kernel: head_dim %d", a->p.head_dim);
    }
}
