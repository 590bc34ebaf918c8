/* fwd_params.cuh - the forward kernel's runtime parameters (FwdParams, and
 * FwdSplit for the instances that split the last wave along the keys), shared
 * by the host launcher and the device roles, and the timeline probe. */
#pragma once
#include <stdint.h>
#include <vector_types.h>

#include "page_div.h"

struct FwdParams {
    void *o;
    float *lse;
    int64_t o_sb, o_ss, o_sh; /* O strides, elements */
    int o_wide;               /* O base 16-byte aligned, strides multiples of 8: 16-byte stores; 2: and OTMA's map of O */
    int batch, heads_q, heads_kv, group; /* group = heads_q / heads_kv */
    int seqlen_q, seqlen_k;
    int causal_offset; /* seqlen_k - seqlen_q */
    int num_m_blocks, num_tiles;
    int head_group;  /* causal schedule: (batch, head) pairs per group ... */
    int head_groups; /* ... and the number of groups; the last takes the rest */
    unsigned *tile_counter; /* causal: [next tile - gridDim.x, CTAs done], zero between launches */
    float softmax_scale, scale_log2;
};

/* FP8: the dequantisation scales [batch, heads, blocks] (fattn_tensor.scale),
 * a kernel parameter of the FP8 instances only (in FwdParams it changed the
 * 16-bit kernels' code); rows per scale q_block, k_block, v_block (K, V:
 * multiples of 128; K with KCOL: 1) and their log2 where they are powers of
 * two (-1 else: a division). */
struct FwdFp8 {
    const float *q_scale, *k_scale, *v_scale;
    int q_block, q_nblocks, k_block, k_nblocks, v_block, v_nblocks;
    int k_shift, v_shift;
};

/* SPLIT (v30): the kernel's second parameter block, only in the
 * instances with SPLIT (with these tables in FwdParams every kernel's
 * key-block loop changed, d128 811 -> 817 SASS instructions).  Workers are
 * CTAs, or CTA pairs with a cluster; work tiles are tiles, or pairs of tiles.  Each worker runs its first `waves` items
 * whole, in the static order; the work tiles from `first` on (those that do
 * not fill a wave) are laid end to end as key blocks, and each worker w <
 * `workers` takes an equal run of them: at most two pieces, the end of one
 * tile and the start of the next.  The host lays this out in the tables, so
 * the kernel divides nothing: ranges computed in the kernel (from the tile
 * count, or with runtime divisions) moved the key-block loop's counters and
 * descriptors off the uniform datapath, 817 -> 866-901 SASS instructions per
 * block at d128. */
#define FWD_SPLIT_MAX_WORKERS 160 /* H100 / H200 have 132 SMs */
struct FwdSplit {
    int waves, first, workers;
    float4 *ws;      /* two slots per worker: partial O, row max, row sum (fragment order) */
    unsigned *count; /* pieces done per tail tile, CTA of a pair, warpgroup and warp; zero between launches */
    int tile[FWD_SPLIT_MAX_WORKERS];    /* worker w: work tile of its first piece */
    int rng[2][FWD_SPLIT_MAX_WORKERS];  /* worker w: key blocks lo | hi << 16 of its pieces (0: none) */
    int owners[FWD_SPLIT_MAX_WORKERS];  /* tail tile r: workers first | last << 16 of its pieces */
};
struct FwdNoSplit {};

/* VARLEN (variable-length batches, cu_seqlens): the parameter after
 * FwdParams of the varlen instances only (in FwdParams it would move every
 * other kernel's parameter offsets); Q, K, V, O are packed [total, heads,
 * dim] (batch 1 in the tensor maps), LSE [heads_q, total_q]. */
struct FwdVarlen {
    const int *cu_q, *cu_k;
    const int *seqused_k; /* or NULL: sequence b's first seqused_k[b] keys only */
    int total_q, total_k;
    /* cu_k NULL (varlen queries on a KV cache): sequence b's keys are rows
     * 0 .. seqlen_k - 1 of batch entry b of k and v, or with block_table
     * pages of page_size rows (key j: row j % page_size of page
     * block_table[b * max_pages + j / page_size], the quotient
     * fattn_page_div(j, page_mul, page_shr): page_div.h); how a key block
     * is loaded: FwdPaged */
    const int *block_table;
    int page_size;
    uint32_t page_mul;
    int page_shr, max_pages;
    /* FlashAttention-3's serving fields (fattn.h): sequence b computes its
     * first seqused_q[b] queries; on a dense cache (KVCACHE, no table) its
     * keys are rows cache_leftpad[b] .. end - 1 of batch entry
     * cache_batch_idx[b]; NULL: off */
    const int *seqused_q, *cache_batch_idx, *cache_leftpad;
};
/* KVCACHE on a page pool (block_table): the parameter after FwdVarlen of
 * those instances only (FwdVarlen's size is every varlen and LOCAL
 * kernel's parameter layout).  kv_box > 0: each key block is BN / kv_box
 * TMA boxes of kv_box rows (fattn_page_box: a multiple of 8, dividing BN
 * and the page); 0: the producer warpgroup's warps 1-3 gather its rows with
 * cp.async (fwd_gather.cuh) from the pools k and v, [num_pages, page_size,
 * heads_kv, d] with these byte strides.  A dense cache: kv_box BN. */
/* KV8 (an FP8 cache): where a tensor's row scale is, fattn_tensor's layout
 * [entries, heads_kv, nb]: entry e, kv head h, row r at e s_entry + h s_head
 * + r / sblock (nb 1: + 0, no division) */
struct FwdKv8Scale {
    int64_t s_entry;
    int s_head, nb, sblock;
};
struct FwdPaged {
    const uint8_t *k, *v;
    int64_t k_page, k_row, k_head; /* bytes */
    int64_t v_page, v_row, v_head;
    int num_pages, kv_box; /* KV8 on a dense cache: num_pages = its batch entries */
    /* KV8 instances only (after the fields every KV-cache kernel reads):
     * the e4m3 pools' float32 scales, gathered with the codes (fwd_gather.cuh) */
    const float *k_scale, *v_scale;
    FwdKv8Scale ks, vs;
};
/* LOCAL (the variants, issue 37): the parameter after FwdParams of those
 * instances only.  Query i sees key j iff i + off - left <= j <= i + off +
 * right (off = seqlen_k - seqlen_q of the sequence), -1 unbounded; the host
 * folds causal into right = 0 and sets a side that reaches past every key
 * to -1 (fwd_local_of), and keeps seqlen_q + seqlen_k below 2^30, so no
 * bound overflows an int.  Softcap (cap > 0): the raw score x becomes
 * tanh(cap_b x), cap_b = scale / cap, and the launcher makes FwdParams'
 * softmax_scale cap (scale_log2 cap log2 e), so that the softmax sees
 * cap tanh(scale x / cap); cap_b 0: off.
 * sink: NULL or float[heads_q], natural-log units (fattn_fwd_args).
 * m_up: the dynamic scheduler takes a head's query blocks in ascending
 * order (a window whose left side binds: the first blocks see the most
 * keys); else descending, as causal. */
struct FwdLocal {
    int left, right;
    float cap_b;
    const float *sink;
    int m_up;
};

/* a tile's sequence: its first packed row of Q and of K, and its lengths
 * (fixed-length instances: 0, 0, seqlen_q, seqlen_k) */
struct FwdSeq {
    int q0, k0, len_q, len_k;
};

/* Timeline probe for experiments (bench/fwd_trace.cu): compiled only with
 * -DFATTN_FWD_TRACE=<cta>; thread 0 of each warpgroup of that CTA records
 * (clock64 << 8 | event) at the points marked FWD_TRACE. */
#ifdef FATTN_FWD_TRACE
#define FWD_TRACE_N 4096
__device__ unsigned long long fwd_trace_buf[4][FWD_TRACE_N];
__device__ int fwd_trace_len[4];
#define FWD_TRACE(code)                                                                                \
    do {                                                                                               \
        if (blockIdx.x == FATTN_FWD_TRACE && threadIdx.x % 128 == 0 && trace_n < FWD_TRACE_N)          \
            fwd_trace_buf[threadIdx.x / 128][trace_n++] = ((unsigned long long)clock64() << 8) | (code); \
    } while (0)
#define FWD_TRACE_END() \
    do { if (blockIdx.x == FATTN_FWD_TRACE && threadIdx.x % 128 == 0) fwd_trace_len[threadIdx.x / 128] = trace_n; } while (0)
#else
#define FWD_TRACE(code) do { } while (0)
#define FWD_TRACE_END() do { } while (0)
#endif

