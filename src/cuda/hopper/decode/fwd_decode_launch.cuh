/* fwd_decode_launch.cuh - the decoding forward's host side, shared by its
 * two instance files (fwd_decode.cu: 16-bit caches; fwd_decode_kv8.cu: FP8
 * caches, DecCfg::KV8): the key split, the tensor maps, the launch of the
 * kernel and of the split merge, and the choice of instance by rows, dtype,
 * paging and variant. */
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <string.h>

#include "../../cuda_engine.h"
#include "../fwd/fwd_sm90_dispatch.h"
#include "../launch.cuh"
#include "fwd_decode.cuh"

/* Splits of the keys: the count whose CTAs fill the SMs' slots best, each
 * split's prologue (its first block's latency) counted as one more block,
 * one split (no merge) on ties.  units: (batch, kv head) pairs. */
static inline int decode_splits(int units, int nblocks, int slots, int *blocks_per_split) {
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
    return hopper_smem_attr<C>(ctx, (const void *)fwd_decode_kernel<C>, C::SMEM_BYTES, "");
}

/* KV8: the e4m3 caches' tensor maps (bytes, BN or page_size rows of
 * Dec8::RW, TMA's 128-byte swizzle or 64-byte for 64-byte rows: dec_sw8)
 * and their scales.  Scale
 * blocks count rows of a page (paged) or of a sequence (contiguous). */
template <class C>
static fattn_status decode_kv8_setup(fattn_ctx *ctx, const fattn_fwd_args *a, DecParams *p, CUtensorMap *tk,
                                     CUtensorMap *tv) {
    const fattn_problem *pr = &a->p;
    int64_t rows = pr->seqlen_k, entries = pr->batch;
    int box = C::BN;
    if (C::PAGED) {
        p->block_table = a->block_table;
        p->page_size = a->page_size, p->max_pages = a->max_pages_per_seq, p->num_pages = a->num_pages;
        while ((1 << p->page_shift) < a->page_size) ++p->page_shift;
        rows = a->page_size, entries = a->num_pages;
        box = a->page_size < C::BN ? a->page_size : C::BN;
    }
    fattn_status s;
    constexpr int RW = Dec8<C>::RW;
    const CUtensorMapSwizzle sw = RW == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
    if ((s = cuda_tensor_map_4d(ctx, tk, &a->k, FATTN_DTYPE_E4M3, C::D, rows, pr->heads_kv, entries, RW, box, sw, "k")) !=
        FATTN_OK)
        return s;
    if ((s = cuda_tensor_map_4d(ctx, tv, &a->v, FATTN_DTYPE_E4M3, C::D, rows, pr->heads_kv, entries, RW, box, sw, "v")) !=
        FATTN_OK)
        return s;
    p->k_scale = a->k.scale, p->v_scale = a->v.scale;
    p->k_sb = a->k.scale_block, p->v_sb = a->v.scale_block;
    p->k_nblocks = (int)((rows + p->k_sb - 1) / p->k_sb);
    p->v_nblocks = (int)((rows + p->v_sb - 1) / p->v_sb);
    return FATTN_OK;
}

/* KV8: CTAs per SM of the instance (its registers and shared memory), asked
 * of the runtime once per device */
template <class C>
static fattn_status decode_kv8_per_sm(fattn_ctx *ctx, int *per_sm) {
    static std::atomic<int> known[64];
    const int dev = ctx->device;
    if (dev < 64 && known[dev].load(std::memory_order_relaxed) > 0) {
        *per_sm = known[dev].load(std::memory_order_relaxed);
        return FATTN_OK;
    }
    fattn_status s = decode_smem_attr<C>(ctx);
    if (s != FATTN_OK) return s;
    int n = 0;
    cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fwd_decode_kernel<C>, C::THREADS, C::SMEM_BYTES);
    if (e != cudaSuccess) return fattn_fail(ctx, FATTN_ERROR_CUDA, "cudaOccupancyMaxActiveBlocksPerMultiprocessor: %s",
                                            cudaGetErrorString(e));
    *per_sm = n > 0 ? n : 1;
    if (dev < 64) known[dev].store(*per_sm, std::memory_order_relaxed);
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
        const hopper_window w = hopper_window_of(pr); /* the variants, as the forward's */
        p.win_left = w.left, p.win_right = w.right, p.cap_a = w.cap_a, p.cap_b = w.cap_b;
        p.sink = a->learnable_sink;
    }
    if (pr->batch > 65535 || pr->heads_kv > 65535)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED, "decoding kernel: batch %d and heads_kv %d must be <= 65535",
                          pr->batch, pr->heads_kv);
    CUtensorMap tk, tv;
    if constexpr (C::KV8) {
        if ((s = decode_kv8_setup<C>(ctx, a, &p, &tk, &tv)) != FATTN_OK) return s;
    } else if (C::PAGED) {
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
    /* KV8: the CTAs an SM holds as the registers allow (d128 with 64 rows
     * takes ~225 a thread, one CTA; the others two at d <= 128) */
    int per_sm = C::D <= 128 ? 2 : 1;
    if constexpr (C::KV8) {
        if ((s = decode_kv8_per_sm<C>(ctx, &per_sm)) != FATTN_OK) return s;
    }
    const int slots = st->num_sms * per_sm;
    int bps = nblocks;
    /* KV8's 16-row tile unsplit: split, its O changed from call to call at 16
     * rows x 20000 keys (run s30-4; unsplit bitwise stable; cause not found) */
    const bool split_ok = v.split && (!C::KV8 || C::T8);
    /* a merge counter per (batch, kv head): more units than counters run
     * unsplit (thousands of CTAs, where decode_splits picks one split anyway) */
    const int units = pr->batch * pr->heads_kv;
    int splits = split_ok && units <= CUDA_SPLIT_COUNTERS ? decode_splits(units, nblocks, slots, &bps) : 1;
    void *ws = NULL;
    unsigned *cnt = NULL;
    if (splits > 1) {
        const size_t bytes = (size_t)splits * units * p.rows * (C::D + 1) * 4;
        if ((s = cuda_split_workspace(ctx, bytes, &ws, &cnt)) != FATTN_OK) return s;
        if (!ws) splits = 1, bps = nblocks; /* none now (graph capture, out of memory): one split */
    }
    p.splits = splits, p.blocks_per_split = bps;
    if (splits > 1) {
        p.ws_o = (float *)ws;
        p.ws_lse = p.ws_o + (size_t)splits * units * p.rows * C::D;
        p.ws_cnt = cnt;
        /* the counters and partials are shared with the other launches of the split workspace */
        if ((s = cuda_order_before(ctx)) != FATTN_OK) return s;
    }
    if ((s = decode_smem_attr<C>(ctx)) != FATTN_OK) return s;
    hopper_launch L;
    L.grid = dim3(splits, pr->heads_kv, pr->batch);
    L.block = dim3(C::THREADS);
    L.smem = C::SMEM_BYTES;
    L.pdl = v.pdl;
    void *args[3] = {&tk, &tv, &p};
    if ((s = hopper_launch_kernel(ctx, L, (const void *)fwd_decode_kernel<C>, args, "decoding kernel")) != FATTN_OK)
        return s;
    return splits > 1 ? cuda_order_after(ctx) : FATTN_OK;
}

template <int D, bool BF16, bool PAGED, bool LOCAL, bool KV8>
static fattn_status decode_rows(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v) {
    const int rows = a->p.heads_q / a->p.heads_kv * a->p.seqlen_q;
    if constexpr (KV8 && !LOCAL) { /* the swapped tile (fwd_decode_t8.cuh), one or two n-tiles of 8 rows */
        if (rows <= 8) return decode_run<DecCfg<D, 1, BF16, PAGED, LOCAL, KV8, 1>>(ctx, a, v);
        if (rows <= 16) return decode_run<DecCfg<D, 1, BF16, PAGED, LOCAL, KV8, 2>>(ctx, a, v);
    }
    if (rows <= 16) return decode_run<DecCfg<D, 1, BF16, PAGED, LOCAL, KV8>>(ctx, a, v);
    if constexpr (!KV8 || D < 256) /* fwd_decode_max_rows_of */
        if (rows <= 32) return decode_run<DecCfg<D, 2, BF16, PAGED, LOCAL, KV8>>(ctx, a, v);
    if constexpr (D < 256) return decode_run<DecCfg<D, 4, BF16, PAGED, LOCAL, KV8>>(ctx, a, v);
    return fattn_fail(ctx, FATTN_ERROR_INTERNAL, "decoding kernel: %d rows at head dim %d", rows, D);
}

template <int D, bool LOCAL, bool KV8>
static fattn_status decode_dl(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v) {
    const bool paged = a->block_table != NULL;
    if (v.bf16)
        return paged ? decode_rows<D, true, true, LOCAL, KV8>(ctx, a, v)
                     : decode_rows<D, true, false, LOCAL, KV8>(ctx, a, v);
    return paged ? decode_rows<D, false, true, LOCAL, KV8>(ctx, a, v) : decode_rows<D, false, false, LOCAL, KV8>(ctx, a, v);
}

/* the variants (window, softcap, sink: fwd_variant.local) on the LOCAL instances */
template <int D, bool KV8>
static fattn_status decode_d(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v) {
    return v.local ? decode_dl<D, true, KV8>(ctx, a, v) : decode_dl<D, false, KV8>(ctx, a, v);
}

/* head dim 64, 128 or 256 (entry.cu's check) */
template <bool KV8>
static fattn_status decode_launch(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v) {
    switch (a->p.head_dim) {
    case 64: return decode_d<64, KV8>(ctx, a, v);
    case 128: return decode_d<128, KV8>(ctx, a, v);
    case 256: return decode_d<256, KV8>(ctx, a, v);
    default: return fattn_fail(ctx, FATTN_ERROR_INTERNAL, "decoding kernel: head_dim %d", a->p.head_dim);
    }
}

