/* fwd_sm90_launch.cuh - host side of one forward kernel instance: tensor
 * maps, parameters, persistent grid, launch. */
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <string.h>

#include "../../cuda_engine.h"
#include "../launch.cuh"
#include "fwd_sm90.cuh"
#include "fwd_sm90_dispatch.h"
#include "split_layout.h"

/* the kernel's parameters (three tensor maps, FwdParams, SPLIT's tables
 * and OTMA's map of O) stay within the classic 4 KB limit */
static_assert(4 * sizeof(CUtensorMap) + sizeof(FwdParams) + sizeof(FwdSplit) <= 4096, "kernel parameters");
static_assert(3 * sizeof(CUtensorMap) + sizeof(FwdParams) + sizeof(FwdFp8) <= 4096, "FP8 kernel parameters");
static_assert(4 * sizeof(CUtensorMap) + sizeof(FwdParams) + sizeof(FwdLocal) + sizeof(FwdVarlen) + sizeof(FwdFp8) + 64 <=
                  4096,
              "LOCAL kernel parameters");
static_assert(3 * sizeof(CUtensorMap) + sizeof(FwdParams) + sizeof(FwdVarlen) + sizeof(FwdPaged) + sizeof(FwdLocal) + 64 <=
                  4096,
              "KVCACHE kernel parameters");

/* the kernel of an instance: (Q, K, V tensor maps, FwdParams), with SPLIT a
 * FwdSplit after FwdParams, with OTMA O's tensor map last; the launch passes
 * its arguments in that order */
template <class C>
auto fwd_sm90_kernel_of() {
    if constexpr (C::KVCACHE) return fwd_sm90_kvcache_kernel<C>;
    else if constexpr (C::LOCAL) return fwd_sm90_local_kernel<C>;
    else if constexpr (C::VARLEN) return fwd_sm90_varlen_kernel<C>;
    else if constexpr (C::FP8) return fwd_sm90_fp8_kernel<C>;
    else if constexpr (C::SPLIT && C::OTMA) return fwd_sm90_split_kernel_o<C>;
    else if constexpr (C::SPLIT) return fwd_sm90_split_kernel<C>;
    else if constexpr (C::OTMA) return fwd_sm90_kernel_o<C>;
    else return fwd_sm90_kernel<C>;
}

/* LOCAL: the call's window, softcap and sink (fattn_problem, fattn_fwd_args)
 * as FwdLocal (hopper_window_of's conventions), and the query-block order
 * of the dynamic scheduler (fixed length: ascending where the first block
 * sees more key blocks than the last).  With that and
 * entry.cu's seqlen_q + seqlen_k < 2^30, fwd_tile_blocks's sums stay below
 * 2^30 + 2 BM. */
inline FwdLocal fwd_local_of(const fattn_fwd_args *a, int bm, int bn, bool varlen) {
    const fattn_problem *pr = &a->p;
    FwdLocal L;
    memset(&L, 0, sizeof L);
    const hopper_window w = hopper_window_of(pr);
    L.left = w.left, L.right = w.right, L.cap_b = w.cap_b;
    L.sink = a->learnable_sink;
    L.m_up = 0;
    if (!varlen && L.left >= 0 && pr->seqlen_q > 0) {
        /* blocks of tile m: the host's copy of fwd_tile_blocks */
        auto count = [&](int64_t m) {
            const int64_t off = (int64_t)pr->seqlen_k - pr->seqlen_q;
            const int64_t first = m * bm + off - L.left;
            const int64_t last = (m + 1) * bm - 1 + (L.right < 0 ? pr->seqlen_k : off + L.right);
            const int64_t nb = (pr->seqlen_k + bn - 1) / bn;
            const int64_t lo = first <= 0 ? 0 : first / bn, hi = last < 0 ? 0 : std::min(last / bn + 1, nb);
            return hi > lo ? hi - lo : 0;
        };
        const int64_t nm = (pr->seqlen_q + bm - 1) / bm;
        L.m_up = count(0) > count(nm - 1);
    }
    return L;
}

/* SPLIT (v30): the work tiles that do not fill the last wave of
 * W workers are split along the keys, so that every worker gets the same
 * number of key blocks; with fewer tiles than workers, all of them (pieces
 * of at least SPLIT_MIN_BLOCKS).  Only where that shortens the run by
 * SPLIT_MIN_GAIN key blocks (a piece's own prologue, epilogue and workspace
 * traffic cost about a block or two each, more at d256: gains of 2-3 blocks
 * lost 1.2-3.8% at 1024, v38; d128 from 4 since v31) and by 0.5% of the
 * run.  *split false: the caller runs the instance without SPLIT. */
template <class C>
fattn_status fwd_split_plan(fattn_ctx *ctx, const fwd_variant &v, const fattn_problem *pr, int num_tiles, int max_ctas,
                            FwdSplit *sp, int *grid, bool *split) {
    constexpr int SPLIT_MIN_BLOCKS = 4;
    /* d128: 4 since its split instance's loop got shorter (v31): +1.2 /
     * +2.1% at 1536 / 2048 with gains of 4 / 5 blocks, +0.3% at 1024 with
     * 2 (v33) */
    const int SPLIT_MIN_GAIN = C::D > 128 ? 10 : C::D == 128 ? 4 : 6;
    *split = false;
    const int nb = (pr->seqlen_k + C::BN - 1) / C::BN;
    if (!v.split || nb > 32767) return FATTN_OK;
    const int W = max_ctas / C::CLUSTER, work = num_tiles / C::CLUSTER;
    int waves = 0, rem = 0;
    long long units = 0, workers = 0;
    if (work >= W) {
        waves = work / W;
        rem = work - waves * W;
        if (rem > 0 && (double)(W - rem) >= 0.005 * W * (waves + 1)) {
            units = (long long)rem * nb;
            workers = units < W ? units : W;
        }
    } else {
        rem = work;
        units = (long long)work * nb;
        workers = units / SPLIT_MIN_BLOCKS < W ? units / SPLIT_MIN_BLOCKS : W;
        if (workers <= work) units = 0; /* no more workers than tiles: nothing to gain */
    }
    /* the last wave: nb blocks whole, ceil(units / workers) split */
    if (units == 0 || nb - (units + workers - 1) / workers < SPLIT_MIN_GAIN) return FATTN_OK;
    if ((size_t)rem * C::CLUSTER * C::NC * 4 > CUDA_SPLIT_COUNTERS || workers > FWD_SPLIT_MAX_WORKERS ||
        rem > FWD_SPLIT_MAX_WORKERS)
        return FATTN_OK;
    /* worker w: at most two pieces, the end of one tail tile and the start
     * of the next (split_layout.h); tail tiles are numbered from sp->first */
    if (fattn_split_layout(rem, nb, (int)workers, sp->tile, sp->rng[0], sp->rng[1], sp->owners) != 0) return FATTN_OK;
    const size_t bytes = 2 * (size_t)workers * C::CLUSTER * C::NC * 128 * (C::DV / 8 + 1) * 16;
    void *ws;
    unsigned *cnt;
    fattn_status s;
    if ((s = cuda_split_workspace(ctx, bytes, &ws, &cnt)) != FATTN_OK) return s;
    if (!ws) return FATTN_OK; /* none now (graph capture, out of memory): unsplit */
    *split = true;
    sp->waves = waves;
    sp->first = waves * W;
    sp->workers = (int)workers;
    sp->ws = (float4 *)ws;
    sp->count = cnt;
    for (int w = 0; w < (int)workers; ++w) sp->tile[w] += sp->first;
    *grid = (int)(waves > 0 ? W : workers) * C::CLUSTER;
    return FATTN_OK;
}

/* The persistent grid's size for instance C: one CTA per SM, or as many
 * CTA pairs as fit at once with a cluster.  Also opts the kernel into its
 * dynamic shared memory (once per function and device). */
template <class C>
fattn_status fwd_sm90_max_ctas(fattn_ctx *ctx, int *max_ctas_out) {
    const fattn_cuda_state *st = (const fattn_cuda_state *)ctx->cuda;
    const void *kern = (const void *)fwd_sm90_kernel_of<C>();
    fattn_status s = hopper_smem_attr<C>(ctx, kern, C::SMEM_BYTES, "");
    if (s != FATTN_OK) return s;
    int max_ctas = st->num_sms;
    if (C::CLUSTER > 1) {
        /* persistent: as many clusters as fit at once (SMs of a GPC pair up;
         * an odd one out stays idle), asked once per device */
        static std::atomic<int> max_clusters[64];
        int mc = ctx->device < 64 ? max_clusters[ctx->device].load(std::memory_order_relaxed) : 0;
        if (mc <= 0) {
            hopper_launch L;
            L.grid = dim3(max_ctas - max_ctas % C::CLUSTER);
            L.block = dim3(C::THREADS);
            L.smem = C::SMEM_BYTES;
            L.cluster = C::CLUSTER;
            cudaLaunchAttribute attr[2];
            const cudaLaunchConfig_t cfg = hopper_launch_config(ctx, L, attr);
            const cudaError_t e = cudaOccupancyMaxActiveClusters(&mc, kern, &cfg);
            if (e != cudaSuccess || mc <= 0)
                return fattn_fail(ctx, FATTN_ERROR_CUDA, "cudaOccupancyMaxActiveClusters: %s (%d clusters)",
                                  cudaGetErrorString(e), mc);
            if (ctx->device < 64) max_clusters[ctx->device].store(mc, std::memory_order_relaxed);
        }
        if (max_ctas > C::CLUSTER * mc) max_ctas = C::CLUSTER * mc;
        max_ctas -= max_ctas % C::CLUSTER;
    }
    *max_ctas_out = max_ctas;
    return FATTN_OK;
}

/* FwdVarlen of a call: its cu_seqlens and serving arrays, and a paged
 * cache's page arithmetic (any page_size >= 1: page_div.h) */
inline FwdVarlen fwd_varlen_of(const fattn_fwd_args *a) {
    const fattn_problem *pr = &a->p;
    FwdVarlen vl;
    vl.cu_q = pr->cu_seqlens_q;
    vl.cu_k = pr->cu_seqlens_k;
    vl.seqused_k = a->seqused_k;
    vl.total_q = pr->total_q;
    vl.total_k = pr->total_k;
    vl.block_table = a->block_table;
    vl.seqused_q = a->seqused_q;
    vl.cache_batch_idx = a->cache_batch_idx;
    vl.cache_leftpad = a->cache_leftpad;
    vl.page_size = a->block_table ? a->page_size : 1;
    fattn_page_div_make(vl.page_size, &vl.page_mul, &vl.page_shr);
    vl.max_pages = a->max_pages_per_seq;
    return vl;
}

/* FwdPaged of a KV-cache call: the TMA box rows of the key maps (a dense
 * cache: BN), or 0 and the pools' addresses and byte strides for the
 * gather (fwd_gather.cuh) */
inline FwdPaged fwd_paged_of(const fattn_fwd_args *a, int kv_box, bool kv8, int64_t entries) {
    FwdPaged pg;
    memset(&pg, 0, sizeof pg);
    pg.kv_box = kv_box;
    pg.num_pages = (int)entries; /* the pool's pages, or the dense cache's batch entries */
    if (kv_box == 0) {
        const int64_t es = kv8 ? 1 : 2; /* e4m3 or 16-bit: entry.cu */
        pg.k = (const uint8_t *)a->k.data, pg.v = (const uint8_t *)a->v.data;
        pg.k_page = a->k.stride_batch * es, pg.k_row = a->k.stride_seq * es, pg.k_head = a->k.stride_head * es;
        pg.v_page = a->v.stride_batch * es, pg.v_row = a->v.stride_seq * es, pg.v_head = a->v.stride_head * es;
    }
    if (kv8) { /* fattn_tensor's scale layout over entries of page_size (or seqlen_k) rows */
        const int rows = a->block_table ? a->page_size : a->p.seqlen_k;
        auto scale_of = [&](const fattn_tensor &t, FwdKv8Scale &sl) {
            sl.sblock = t.scale_block;
            sl.nb = (int)(((int64_t)rows + t.scale_block - 1) / t.scale_block);
            sl.s_head = sl.nb;
            sl.s_entry = (int64_t)a->p.heads_kv * sl.nb;
        };
        pg.k_scale = a->k.scale, pg.v_scale = a->v.scale;
        scale_of(a->k, pg.ks);
        scale_of(a->v, pg.vs);
    }
    return pg;
}

/* Launch instance C; sp: SPLIT's tables (split instances only), grid: the
 * grid the split plan chose (else from the tile count). */
template <class C>
fattn_status fwd_sm90_launch_inst(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v, int max_ctas,
                                  const FwdSplit *sp, int grid) {
    const fattn_problem *pr = &a->p;
    fattn_status s;
    const fattn_cuda_state *st = (const fattn_cuda_state *)ctx->cuda;
    FwdParams p;
    memset(&p, 0, sizeof p);
    p.o = a->o.data;
    p.lse = a->lse;
    p.o_sb = a->o.stride_batch;
    p.o_ss = a->o.stride_seq;
    p.o_sh = a->o.stride_head;
    p.o_wide = (uintptr_t)a->o.data % 16 == 0 && p.o_sb % 8 == 0 && p.o_ss % 8 == 0 && p.o_sh % 8 == 0;
    p.batch = pr->batch;
    p.heads_q = pr->heads_q;
    p.heads_kv = pr->heads_kv;
    p.group = pr->heads_q / pr->heads_kv;
    p.seqlen_q = pr->seqlen_q;
    p.seqlen_k = pr->seqlen_k;
    p.causal_offset = pr->seqlen_k - pr->seqlen_q;
    p.num_m_blocks = (pr->seqlen_q + C::BM - 1) / C::BM;
    p.num_tiles = p.num_m_blocks * pr->heads_q * pr->batch;
    if (C::CAUSAL) {
        /* Causal head groups (fwd_tile_decode).  The dynamic scheduler takes
         * a group's tiles longest first, so a group must hold enough work
         * for its longest tiles not to run alone at its end; only the last
         * group's end is not covered by the next group's tiles.
         * - groups whose K and V take ~24 MB of the 50 MB L2 (H100/H200),
         *   GQA heads that share a kv head counted once, but at least two
         *   waves of tiles per group (v3: d256 causal 8192 fell from 0.88x
         *   to 0.68x cuDNN with 2-head groups);
         * - a remainder smaller than the two-waves minimum joins the last
         *   group (up to twice the size) instead of running its longest
         *   tiles alone at the end (v41, v42: d128 causal 1024 +2.5%;
         *   d256 causal 8192, 5 + 5 + 5 + 1 heads before, 1.04x -> 1.10x
         *   cuDNN in compare.py).
         * Not taken (v42): all pairs in one group.  It won 3-20%
         * in fwd_variants' short A/Bs, but under compare.py's sustained load
         * its extra DRAM reads take power and the power limit the clock:
         * d128 causal 4096 -5%, d64 8192 -4%, and with 16 pairs or fewer
         * +1% at d256, -3.7% at d128 16384 against the merge alone. */
        const long nbh = (long)pr->batch * pr->heads_q;
        const double kv_bytes = (double)pr->seqlen_k * (C::D + C::DV) * C::ELEM;
        const long min_hg = (2L * st->num_sms + p.num_m_blocks - 1) / p.num_m_blocks;
        long hg = (long)(24.0e6 / kv_bytes) * p.group;
        if (hg < min_hg) hg = min_hg;
        if (hg > nbh) hg = nbh;
        long ng = (nbh + hg - 1) / hg;
        const long rem = nbh - (ng - 1) * hg; /* 1 .. hg */
        if (ng > 1 && rem < min_hg) ng--;
        p.head_group = (int)hg;
        p.head_groups = (int)ng;
        /* VARLEN: the producer orders the tiles itself (FwdProducer::tile_of)
         * and encodes them for one group of every (batch, head) */
        if (C::VARLEN) p.head_group = (int)nbh, p.head_groups = 1;
    }
    p.tile_counter = NULL;
    if (C::DYNAMIC) p.tile_counter = st->tile_counter;
    p.softmax_scale = pr->softmax_scale;
    p.scale_log2 = pr->softmax_scale * 1.4426950408889634f;
    if (C::LOCAL && !C::FP8 && pr->softcap > 0.f) {
        /* softcap: the kernel's scores are tanh(scale x / cap) (FwdLocal), so
         * the softmax's scale is cap itself, as FlashAttention-3 folds it */
        p.softmax_scale = pr->softcap;
        p.scale_log2 = pr->softcap * 1.4426950408889634f;
    }
    if (!sp) grid = p.num_tiles < max_ctas ? p.num_tiles : max_ctas; /* num_tiles is even with a cluster */

    CUtensorMap tq, tk, tv;
    int vl_box = C::BN;
    int64_t vl_entries = 0; /* KVCACHE: the cache's pages or batch entries (FwdPaged.num_pages) */
    FwdFp8 f8;
    memset(&f8, 0, sizeof f8);
    if constexpr (C::FP8) {
        /* e4m3 tiles of SW-byte rows (fwd_traits.cuh); the scales' layout:
         * fattn_tensor (entry.cu checked that K's and V's blocks suit BN) */
        const CUtensorMapSwizzle sw = C::SW == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
        if ((s = cuda_tensor_map_4d(ctx, &tq, &a->q, FATTN_DTYPE_E4M3, C::D, pr->seqlen_q, pr->heads_q, pr->batch,
                                    C::SLAB_COLS, 64, sw, "q")) != FATTN_OK)
            return s;
        if ((s = cuda_tensor_map_4d(ctx, &tk, &a->k, FATTN_DTYPE_E4M3, C::D, pr->seqlen_k, pr->heads_kv, pr->batch,
                                    C::SLAB_COLS, C::BN, sw, "k")) != FATTN_OK)
            return s;
        if ((s = cuda_tensor_map_4d(ctx, &tv, &a->v, FATTN_DTYPE_E4M3, C::D, pr->seqlen_k, pr->heads_kv, pr->batch,
                                    C::SLAB_COLS, C::BN, sw, "v")) != FATTN_OK)
            return s;
        f8.q_scale = a->q.scale;
        f8.k_scale = a->k.scale;
        f8.v_scale = a->v.scale;
        f8.q_block = a->q.scale_block;
        f8.q_nblocks = (pr->seqlen_q + a->q.scale_block - 1) / a->q.scale_block;
        f8.k_block = a->k.scale_block;
        f8.k_nblocks = (pr->seqlen_k + a->k.scale_block - 1) / a->k.scale_block;
        f8.v_block = a->v.scale_block;
        f8.v_nblocks = (pr->seqlen_k + a->v.scale_block - 1) / a->v.scale_block;
        auto log2_or = [](int x) {
            int k = 0;
            while ((1 << k) < x) ++k;
            return (1 << k) == x ? k : -1;
        };
        f8.k_shift = log2_or(f8.k_block);
        f8.v_shift = log2_or(f8.v_block);
        if ((C::KCOL ? f8.k_block != 1 : f8.k_block % C::SG != 0) || f8.v_block % C::SG != 0)
            return fattn_fail(ctx, FATTN_ERROR_INTERNAL,
                              "FP8 kernel: scale blocks k %d, v %d do not suit its column groups of %d",
                              a->k.scale_block, a->v.scale_block, C::SG);
    } else {
        /* VARLEN: maps over the packed [total, heads, dim] tensors (batch 1);
         * a tile's rows start at its sequence's first row (FwdVarlen); on a
         * KV cache (no cu_seqlens_k) k and v keep their batch, or pages.  A
         * head dim of 96 is 2 boxes of 64 columns, the second half out of
         * bounds: TMA fills it with zeros */
        const int64_t rq = C::VARLEN ? pr->total_q : pr->seqlen_q;
        int64_t rk = C::VARLEN ? pr->total_k : pr->seqlen_k, bk = C::VARLEN ? 1 : pr->batch;
        int kv_box = C::BN;
        if (C::KVCACHE) {
            rk = a->block_table ? a->page_size : pr->seqlen_k;
            bk = a->block_table ? a->num_pages : a->cache_batch_idx && a->cache_batch ? a->cache_batch : pr->batch;
            /* pages: boxes that start on a swizzle atom, or 0: gathered, no key
             * maps (a left pad shifts a sequence's keys off the page starts) */
            if (a->block_table) kv_box = a->cache_leftpad ? 0 : fattn_page_box(C::BN, a->page_size);
            if (C::KV8) kv_box = 0; /* dequantised by the gather, dense caches too */
        }
        vl_entries = bk;
        vl_box = kv_box;
        if ((s = cuda_make_tensor_map(ctx, &tq, &a->q, C::D, rq, pr->heads_q, C::VARLEN ? 1 : pr->batch, 64, "q")) !=
            FATTN_OK)
            return s;
        memset(&tk, 0, sizeof tk);
        memset(&tv, 0, sizeof tv);
        if (kv_box > 0) {
            if ((s = cuda_make_tensor_map(ctx, &tk, &a->k, C::D, rk, pr->heads_kv, bk, kv_box, "k")) != FATTN_OK)
                return s;
            if ((s = cuda_make_tensor_map(ctx, &tv, &a->v, C::DV, rk, pr->heads_kv, bk, kv_box, "v")) != FATTN_OK)
                return s;
        }
    }
    const FwdLocal loc = fwd_local_of(a, C::BM, C::BN, C::VARLEN);
    if (C::KVCACHE != (C::VARLEN && !pr->cu_seqlens_k))
        return fattn_fail(ctx, FATTN_ERROR_INTERNAL, "varlen forward: a KV-cache instance for packed keys or back");
    const FwdVarlen vl = fwd_varlen_of(a);
    const FwdPaged pg = fwd_paged_of(a, vl_box, C::KV8, vl_entries);
    /* OTMA: O through TMA stores where TMA can address it (o_wide: base and
     * strides 16-byte multiples; strides below 2^40 bytes), else the
     * kernel's register stores (the map is then never read) */
    CUtensorMap to;
    memset(&to, 0, sizeof to);
    if (C::OTMA && p.o_wide) {
        const int64_t lim = (int64_t)1 << 39; /* elements: 2^40 bytes */
        if (p.o_sb < lim && p.o_ss < lim && p.o_sh < lim) {
            if ((s = cuda_make_tensor_map(ctx, &to, &a->o, C::DV, pr->seqlen_q, pr->heads_q, pr->batch, 16, "o")) !=
                FATTN_OK)
                return s;
            p.o_wide = 2;
        }
    }
    /* the tile counter and the split workspace are the context's: their
     * users run one after another */
    const bool ordered = C::DYNAMIC || sp;
    if (ordered && (s = cuda_order_before(ctx)) != FATTN_OK) return s;
    hopper_launch L;
    L.grid = dim3(grid);
    L.block = dim3(C::THREADS);
    L.smem = C::SMEM_BYTES;
    L.cluster = C::CLUSTER;
    L.pdl = v.pdl;
    /* the arguments in the order of the kernel's parameters (fwd_sm90_kernel_of) */
    void *args[8] = {&tq, &tk, &tv, &p};
    int nargs = 4;
    if constexpr (C::KVCACHE) { /* fwd_sm90_kvcache_kernel */
        args[nargs++] = const_cast<FwdVarlen *>(&vl);
        args[nargs++] = const_cast<FwdPaged *>(&pg);
        args[nargs++] = const_cast<FwdLocal *>(&loc);
    } else if constexpr (C::LOCAL) { /* fwd_sm90_local_kernel: every block, in its order */
        args[nargs++] = const_cast<FwdLocal *>(&loc);
        args[nargs++] = const_cast<FwdVarlen *>(&vl);
        args[nargs++] = &f8;
        args[nargs++] = &to;
    } else {
        if constexpr (C::VARLEN) args[nargs++] = const_cast<FwdVarlen *>(&vl);
        if constexpr (C::SPLIT) args[nargs++] = const_cast<FwdSplit *>(sp);
        if constexpr (C::OTMA) args[nargs++] = &to;
        if constexpr (C::FP8) args[nargs++] = &f8;
    }
    if ((s = hopper_launch_kernel(ctx, L, (const void *)fwd_sm90_kernel_of<C>(), args, "forward kernel")) != FATTN_OK)
        return s;
    return ordered ? cuda_order_after(ctx) : FATTN_OK;
}

/* Run instance C.  A split instance plans the split first, from the tile
 * count and the grid alone, and runs the instance without SPLIT when it
 * splits nothing (the common call), so the host work is done once. */
template <class C>
fattn_status fwd_sm90_run(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v) {
    const fattn_problem *pr = &a->p;
    const int num_m_blocks = (pr->seqlen_q + C::BM - 1) / C::BM;
    if (C::CLUSTER > 1 && num_m_blocks % C::CLUSTER != 0)
        return fattn_fail(ctx, FATTN_ERROR_INTERNAL, "cluster kernel needs an even number of query blocks (%d)",
                          num_m_blocks);
    fattn_status s;
    int max_ctas;
    if constexpr (C::SPLIT) {
        if ((s = fwd_sm90_max_ctas<C>(ctx, &max_ctas)) != FATTN_OK) return s;
        const int num_tiles = num_m_blocks * pr->heads_q * pr->batch;
        FwdSplit sp;
        memset(&sp, 0, sizeof sp);
        int grid = 0;
        bool split = false;
        if ((s = fwd_split_plan<C>(ctx, v, pr, num_tiles, max_ctas, &sp, &grid, &split)) != FATTN_OK) return s;
        if (split) return fwd_sm90_launch_inst<C>(ctx, a, v, max_ctas, &sp, grid);
        /* the instance without SPLIT sets its own shared-memory attribute */
        if ((s = fwd_sm90_max_ctas<typename C::NoSplit>(ctx, &max_ctas)) != FATTN_OK) return s;
        return fwd_sm90_launch_inst<typename C::NoSplit>(ctx, a, v, max_ctas, NULL, 0);
    } else {
        if ((s = fwd_sm90_max_ctas<C>(ctx, &max_ctas)) != FATTN_OK) return s;
        return fwd_sm90_launch_inst<C>(ctx, a, v, max_ctas, NULL, 0);
    }
}

