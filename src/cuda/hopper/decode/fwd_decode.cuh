/* fwd_decode.cuh - the Hopper forward for decoding: few query rows against a
 * long KV cache, at the memory-bandwidth limit.
 *   - the query heads of a GQA group and their seqlen_q <= 16 queries are one
 *     tile of ROWS = group * seqlen_q <= 64 rows (row r: query r / group, head
 *     hk * group + r % group), so each kv head's K and V are read once;
 *   - one CTA per (key split, kv head, batch): a producer warp streams the
 *     split's key blocks (BN keys of K and V) into a ring of STAGES by TMA,
 *     from a contiguous cache or page by page from a paged one (block
 *     table), through the engine's tensor maps and mbarrier helpers;
 *   - four consumer warps, WM of them along the rows (16 each) times WN along
 *     each block's keys, mma.sync m16n8k16 (wgmma's 64-row minimum would pad
 *     4-16 rows to 64 on every block), the online softmax per warp, and the
 *     warps' (max, sum, O) merged through shared memory at the end;
 *   - with more than one split each CTA writes its normalised partial O and
 *     LSE (fp32) to the context's split workspace, and the unit's last CTA
 *     to finish (a counter per (batch, kv head)) merges them in split order
 *     with fattn_merge's arithmetic (dec_combine_row; common/lse_combine.cuh,
 *     form (a)): no second kernel; the warps' merge and the final
 *     normalisation are its form (b).
 * Keys past a sequence's length (seqused_k, or the block's tail) are masked
 * in S, and their V rows zeroed in shared memory before the PV product, so
 * whatever the cache holds there (NaN included) cannot reach O.
 * LOCAL (the variants, issue 37; instances of their own, so the others keep
 * their code): a sliding window (a CTA's splits cover only the key blocks
 * its rows can see), softcap before the mask, and the learnable sink in the
 * final normalisation (one split) or in the combine (several).
 * KV8 (an FP8 KV cache, fattn.h 0.5; instances of their own, in
 * fwd_decode_kv8.cu): the stages hold e4m3 codes (TMA, swizzled) and each
 * key's K and V scales (the producer warp's lanes fetch them); the
 * consumers read the codes into f16 MMA fragments in registers
 * (fwd_decode_kv8.cuh) and run the same loop, with K's scale multiplied
 * into S and V's into P before P is rounded, as the FP8 forward places its
 * v scale.  At most 8 rows without variants take the swapped tile
 * (DecCfg::T8, fwd_decode_t8.cuh): keys as the MMAs' m16 side, rows as n8. */
#pragma once
#include <math.h>
#include <stdint.h>

#include "../../common/lse_combine.cuh"
#include "../../common/ptx.cuh"

struct DecParams {
    const void *q;
    int64_t q_sb, q_ss, q_sh; /* elements */
    void *o;
    int64_t o_sb, o_ss, o_sh;
    float *lse;
    int batch, heads_q, heads_kv, group, seqlen_q, seqlen_k, rows; /* rows = group * seqlen_q */
    int causal;
    const int32_t *seqused_k;   /* NULL: seqlen_k keys */
    const int32_t *block_table; /* NULL: contiguous K, V */
    int page_size, page_shift, max_pages, num_pages;
    int splits, blocks_per_split;
    float *ws_o, *ws_lse; /* splits > 1: [split][batch][kv head][rows] x D, and x 1 */
    unsigned *ws_cnt;     /* splits > 1: a counter per (batch, kv head), zero between calls */
    float softmax_scale, scale_log2;
    /* LOCAL only (after the fields the other instances read): the window
     * (FwdLocal's convention: -1 unbounded, causal folded into right = 0),
     * softcap x -> cap_a tanh(cap_b x) (cap_b 0: off), the sink (or NULL) */
    int win_left, win_right;
    float cap_a, cap_b;
    const float *sink;
    /* KV8 only (after every field the other instances read): the e4m3
     * scales, scale index (entry * heads_kv + kv head) * nblocks + row / sb */
    const float *k_scale, *v_scale;
    int k_sb, v_sb, k_nblocks, v_nblocks;
};

template <int D_, int WM_, bool BF16_, bool PAGED_, bool LOCAL_ = false, bool KV8_ = false, int T8_ = 0>
struct DecCfg {
    /* BN: KV8 with 16 rows at d <= 128 takes 128-key blocks, 32 keys a warp:
     * twice the independent MMAs a warp has in flight per block, over the
     * same shuffles and waits (d3/d4: the FP8 loop's latency, 2 warps a
     * scheduler, set its pace) */
    static constexpr int D = D_, WM = WM_, WN = 4 / WM_, BN = KV8_ && WM_ == 1 && D_ <= 128 ? 128 : 64;
    static constexpr bool BF16 = BF16_, PAGED = PAGED_, LOCAL = LOCAL_, KV8 = KV8_;
    /* T8: KV8's swapped tile (fwd_decode_t8.cuh) for <= 8 x NQ rows, not with the variants */
    static constexpr bool T8 = T8_ > 0;
    static constexpr int NQ = T8_ > 0 ? T8_ : 1;
    static_assert(!T8_ || (KV8_ && WM_ == 1 && !LOCAL_), "T8: the FP8 cache's 16-row instances without variants");
    /* LOCAL's softcap: not at d256 with 32 rows, where its tanh spilled 92
     * bytes at 255 registers (fwd_decode_softcap_ok keeps such calls off) */
    static constexpr bool SOFTCAP = LOCAL_ && !(D_ == 256 && WM_ == 2);
    static constexpr int KW = BN / WN; /* keys of a block per warp: 16, 32, 64 */
    static constexpr int NT = KW / 8;  /* S n-tiles per warp */
    static constexpr int SLABS = D / 64;
    static constexpr int TILE_BYTES = BN * D * 2; /* K or V block: SLABS slabs of BN rows x 128 bytes */
    /* KV8: a stage is e4m3 K and V blocks (BN rows of D bytes, Dec8's
     * slabs) and their scales (BN of K's, BN of V's) */
    static constexpr int TILE8 = BN * D, SCALES = 2 * BN * 4;
    /* D <= 128: two CTAs per SM (96 KB of ring each); d256: one, 3 x 64 KB (KV8 6 x 32 KB) */
    static constexpr int STAGES = KV8 ? (D == 256 ? 196608 : 98304) / (2 * BN * D) : D == 256 ? 3 : D == 128 ? 3 : 6;
    static constexpr int STAGE_BYTES = KV8 ? 2 * TILE8 : 2 * TILE_BYTES, V_OFF = KV8 ? TILE8 : TILE_BYTES;
    static constexpr int OFF_SC = STAGES * STAGE_BYTES; /* KV8: each stage's scales */
    static constexpr int OFF_BAR = OFF_SC + (KV8 ? STAGES * SCALES : 0);
    static constexpr int OFF_ML = OFF_BAR + 2 * STAGES * 8;    /* per warp: max, sum of its 16 rows */
    static constexpr int SMEM_BYTES = OFF_ML + 4 * 16 * 2 * 4 + 1024; /* + alignment slack */
    static constexpr int THREADS = 160; /* warps 0-3 consumers, warp 4 the producer */
    /* KV8: one CTA per SM as the bound ptxas plans registers for (two fit by
     * shared memory at D <= 128; without it ptxas kept d128's 32-row tile at
     * 168 registers and spilled a loop invariant); 0 = no bound, the 16-bit
     * instances' code */
    static constexpr int MIN_CTAS = KV8 ? 1 : 0;
    static_assert(4 * 16 * D * 4 <= STAGES * STAGE_BYTES, "the merge's O scratch fits in the ring");
};

/* A row's online-softmax step at a block whose max over the row's keys is
 * bm: the running max m updated, O's factor alpha (0 while m was -inf), and
 * the returned exponent offset mu (0 while the row has seen no key) */
__device__ __forceinline__ float dec_softmax_max(float &m, float bm, float sl2, float &alpha) {
    const float mn = fmaxf(m, bm);
    const float mu = mn == -INFINITY ? 0.f : mn * sl2;
    alpha = exp2f(m * sl2 - mu);
    m = mn;
    return mu;
}

/* keys sequence b attends to */
__device__ __forceinline__ int dec_len_k(const DecParams &p, int b) {
    int len = p.seqlen_k;
    if (p.seqused_k) len = min(len, max(p.seqused_k[b], 0));
    return len;
}

/* LOCAL: sequence b's window over its len keys as bounds on key - query
 * (dl <= j - i <= dr), and the key blocks that some query of it sees:
 * lo .. hi - 1 (none: hi <= lo) */
template <class C>
__device__ __forceinline__ void dec_window(const DecParams &p, int len, int &dl, int &dr, int &lo, int &hi) {
    const int off = len - p.seqlen_q;
    dl = p.win_left < 0 ? -p.seqlen_q : off - p.win_left;
    dr = p.win_right < 0 ? len : off + p.win_right;
    const int first = dl, last = p.seqlen_q - 1 + dr; /* query 0's first key, the last query's last */
    lo = first <= 0 ? 0 : first / C::BN;
    hi = last < 0 ? 0 : min(last / C::BN + 1, (len + C::BN - 1) / C::BN);
}

/* the key blocks of split `split`: n_lo .. n_hi - 1 (LOCAL: of the window's
 * blocks only, and the window's bounds dl, dr) */
template <class C>
__device__ __forceinline__ void dec_split_blocks(const DecParams &p, int len, int split, int &n_lo, int &n_hi, int &dl,
                                                 int &dr) {
    if constexpr (C::LOCAL) {
        int wlo, whi;
        dec_window<C>(p, len, dl, dr, wlo, whi);
        n_lo = wlo + split * p.blocks_per_split, n_hi = min(n_lo + p.blocks_per_split, whi);
    } else {
        const int nb = (len + C::BN - 1) / C::BN;
        n_lo = split * p.blocks_per_split, n_hi = min(n_lo + p.blocks_per_split, nb);
    }
}

/* byte offset of (row, 16-byte chunk ch of the 64 columns of slab c) in a
 * TMA tile of R rows with the 128-byte swizzle */
template <int R>
__device__ __forceinline__ uint32_t dec_sw(int row, int col) {
    return (uint32_t)((col >> 6) * R * 128 + row * 128 + ((((col & 63) >> 3) ^ (row & 7)) << 4));
}

/* A paged key's page and row in it; a key past the ones used reads page
 * num_pages, outside the pool: zeros (TMA bounds) */
__device__ __forceinline__ void dec_page_row(const DecParams &p, int key, int len, int b, int &pg, int &row) {
    pg = p.num_pages, row = 0;
    if (key < len) {
        pg = p.block_table[(int64_t)b * p.max_pages + (key >> p.page_shift)];
        row = key & (p.page_size - 1);
    }
}

template <class C>
__device__ __forceinline__ void dec_load_block(const DecParams &p, const CUtensorMap *tm_k, const CUtensorMap *tm_v,
                                               uint8_t *kst, uint8_t *vst, uint64_t *bar, int n, int hk, int b,
                                               int len) {
    if constexpr (C::PAGED) {
        /* page_size >= BN (a multiple of it): the block is rows of one page;
         * else BN / page_size whole pages.  A page past the keys used, or a
         * table entry outside the pool, reads as zeros (TMA bounds). */
        const int pb = p.page_size < C::BN ? p.page_size : C::BN;
        for (int k0 = 0; k0 < C::BN; k0 += pb) {
            int pg, row;
            dec_page_row(p, n * C::BN + k0, len, b, pg, row);
            for (int c = 0; c < C::SLABS; ++c) {
                tma_load_4d(kst + c * C::BN * 128 + k0 * 128, tm_k, c * 64, row, hk, pg, bar);
                tma_load_4d(vst + c * C::BN * 128 + k0 * 128, tm_v, c * 64, row, hk, pg, bar);
            }
        }
    } else {
        (void)len;
        for (int c = 0; c < C::SLABS; ++c) {
            tma_load_4d(kst + c * C::BN * 128, tm_k, c * 64, n * C::BN, hk, b, bar);
            tma_load_4d(vst + c * C::BN * 128, tm_v, c * 64, n * C::BN, hk, b, bar);
        }
    }
}

/* The producer warp's lane 0: the split's key blocks n_lo..n_hi - 1 into
 * the ring of STAGES, each stage once the four consumers have released it. */
template <class C>
__device__ __forceinline__ void dec_produce(const DecParams &p, const CUtensorMap *tm_k, const CUtensorMap *tm_v,
                                           uint8_t *sm, uint64_t *full, uint64_t *empty, int n_lo, int n_hi, int hk,
                                           int b, int len) {
    constexpr int STAGES = C::STAGES;
    tma_prefetch_desc(tm_k);
    tma_prefetch_desc(tm_v);
    for (int n = n_lo, it = 0; n < n_hi; ++n, ++it) {
        const int s = it % STAGES;
        if (it >= STAGES) mbar_wait(&empty[s], ((it / STAGES) - 1) & 1);
        mbar_expect_tx_arrive(&full[s], 2 * C::TILE_BYTES);
        dec_load_block<C>(p, tm_k, tm_v, sm + s * 2 * C::TILE_BYTES, sm + s * 2 * C::TILE_BYTES + C::TILE_BYTES,
                          &full[s], n, hk, b, len);
    }
}

#include "fwd_decode_kv8.cuh"

/* LOCAL: x -> cap_a tanh(cap_b x) on S, when the call asks for it (p.cap_b != 0) */
template <class C>
__device__ __forceinline__ void dec_softcap(const DecParams &p, float (&sacc)[C::NT][4]) {
    if (p.cap_b != 0.f)
#pragma unroll
        for (int i = 0; i < C::NT; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float th;
                asm("tanh.approx.f32 %0, %1;" : "=f"(th) : "f"(sacc[i][e] * p.cap_b));
                sacc[i][e] = p.cap_a * th;
            }
}

/* O += P V for this warp's KW keys of the block at vbase */
template <class C>
__device__ __forceinline__ void dec_pv(float (&oacc)[C::D / 8][4], const float (&sacc)[C::NT][4], uint32_t vbase, int kw0,
                                       int j8, int rr) {
    constexpr int D = C::D, BN = C::BN;
#pragma unroll
    for (int ks = 0; ks < C::KW / 16; ++ks) {
        uint32_t pa[4];
        pa[0] = C::BF16 ? pack_bf16x2(sacc[2 * ks][0], sacc[2 * ks][1]) : pack_f16x2(sacc[2 * ks][0], sacc[2 * ks][1]);
        pa[1] = C::BF16 ? pack_bf16x2(sacc[2 * ks][2], sacc[2 * ks][3]) : pack_f16x2(sacc[2 * ks][2], sacc[2 * ks][3]);
        pa[2] = C::BF16 ? pack_bf16x2(sacc[2 * ks + 1][0], sacc[2 * ks + 1][1])
                        : pack_f16x2(sacc[2 * ks + 1][0], sacc[2 * ks + 1][1]);
        pa[3] = C::BF16 ? pack_bf16x2(sacc[2 * ks + 1][2], sacc[2 * ks + 1][3])
                        : pack_f16x2(sacc[2 * ks + 1][2], sacc[2 * ks + 1][3]);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
            /* matrices (keys +0, d +0), (keys +8, d +0), (keys +0, d +8), (keys +8, d +8), transposed */
            const int key = kw0 + ks * 16 + (j8 & 1) * 8 + rr, col = dp * 16 + (j8 >> 1) * 8;
            uint32_t bv[4];
            ldsm_x4_trans(bv, vbase + dec_sw<BN>(key, col));
            mma_m16n8k16<C::BF16>(oacc[2 * dp], pa, bv[0], bv[1]);
            mma_m16n8k16<C::BF16>(oacc[2 * dp + 1], pa, bv[2], bv[3]);
        }
    }
}

/* columns lane * PER .. + PER - 1 of a partial (16-byte loads where PER allows) */
template <int PER>
__device__ __forceinline__ void dec_combine_load(float (&x)[PER], const float *src) {
    if constexpr (PER % 4 == 0) {
#pragma unroll
        for (int j = 0; j < PER; j += 4) {
            const float4 v = __ldcg((const float4 *)(src + j));
            x[j] = v.x, x[j + 1] = v.y, x[j + 2] = v.z, x[j + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int j = 0; j < PER; j += 2) {
            const float2 v = __ldcg((const float2 *)(src + j));
            x[j] = v.x, x[j + 1] = v.y;
        }
    }
}

/* splits > 1: one warp merges row gw (of batch x kv head x rows) over the
 * splits' partials with fattn_merge's arithmetic (common/lse_combine.cuh,
 * form (a)): lane k reads the LSE of splits k, k + 32, ... for the max and
 * computes their weights (in double, one exp a split), the weights go round
 * by shuffles, and each lane sums its D / 32 columns over the splits in
 * split order by f32 fma, U splits' loads in flight.  A split that saw no
 * key of the row (LSE -inf) is not read.  LOCAL: the sink is one more part,
 * with O = 0.  Reads go through L2 (__ldcg): other CTAs of this grid wrote
 * the partials. */
template <int D, bool BF16, bool LOCAL>
__device__ __forceinline__ void dec_combine_row(const DecParams &p, int gw, int lane) {
    constexpr unsigned FULL = 0xffffffffu;
    constexpr int PER = D / 32, U = 4;
    const int row = gw % p.rows, bh = gw / p.rows, hk = bh % p.heads_kv, b = bh / p.heads_kv;
    const int sq = row / p.group, h = hk * p.group + (row - sq * p.group);
    const int64_t sstride = (int64_t)p.batch * p.heads_kv * p.rows;
    const int n = p.splits;
    const float *lse_at = p.ws_lse + gw; /* split i: lse_at[i * sstride] */

    /* the max over the live splits (and the sink) */
    float m = -INFINITY;
    int any = 0;
    for (int i = lane; i < n; i += 32) {
        const float l = __ldcg(lse_at + i * sstride);
        if (lse_part_live(l)) any = 1, m = lse_running_max(m, l);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        m = lse_running_max(m, __shfl_xor_sync(FULL, m, off));
        any |= __shfl_xor_sync(FULL, any, off);
    }
    float sink = -INFINITY; /* not live: no sink */
    if constexpr (LOCAL) {
        if (p.sink) {
            sink = __ldg(p.sink + h);
            if (lse_part_live(sink)) any = 1, m = lse_running_max(m, sink);
        }
    }
    const double M = (double)m;

    float acc[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) acc[j] = 0.f;
    double lsum = 0.0;
    for (int t0 = 0; t0 < n; t0 += 32) {
        /* lane k: the weight of split t0 + k */
        const int i = t0 + lane;
        float w = 0.f;
        int live = 0;
        if (i < n) {
            const float l = __ldcg(lse_at + i * sstride);
            if (lse_part_live(l)) {
                live = 1;
                const double wd = lse_part_weight(l, M);
                w = (float)wd;
                lsum += wd;
            }
        }
        const uint32_t lm = __ballot_sync(FULL, live);
        const int cnt = min(32, n - t0);
        for (int j0 = 0; j0 < cnt; j0 += U) {
            float wj[U], x[U][PER];
            bool go[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                wj[u] = __shfl_sync(FULL, w, (j0 + u) & 31);
                go[u] = j0 + u < cnt && ((lm >> (j0 + u)) & 1u);
#pragma unroll
                for (int j = 0; j < PER; ++j) x[u][j] = 0.f;
                if (go[u]) dec_combine_load<PER>(x[u], p.ws_o + ((t0 + j0 + u) * sstride + gw) * D + lane * PER);
            }
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (go[u])
#pragma unroll
                    for (int j = 0; j < PER; ++j) acc[j] = lse_accumulate(acc[j], wj[u], x[u][j]);
        }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) lsum += __shfl_xor_sync(FULL, lsum, off);
    if (lse_part_live(sink)) lsum += lse_part_weight(sink, M); /* LOCAL: the sink's weight, O = 0 */
    const float inv = lse_out_scale(any, lsum), lse = lse_out_lse(any, M, lsum);
    uint16_t *o = (uint16_t *)p.o + b * p.o_sb + (int64_t)sq * p.o_ss + (int64_t)h * p.o_sh + lane * PER;
#pragma unroll
    for (int j = 0; j < PER; j += 2) {
        const float lo = lse_out(any, acc[j], inv), hi = lse_out(any, acc[j + 1], inv);
        ((uint32_t *)o)[j / 2] = BF16 ? pack_bf16x2(lo, hi) : pack_f16x2(lo, hi);
    }
    if (lane == 0 && p.lse) p.lse[((int64_t)b * p.heads_q + h) * p.seqlen_q + sq] = lse;
}

/* splits > 1, once this CTA's partial is written (by its 128 consumer
 * threads): the unit's counter counts the finished splits; the CTA that
 * finishes last merges the unit's rows, a warp a row, in split order (the
 * bits do not depend on which CTA was last), and zeroes the counter for the
 * next call.  ml's first word carries the count to the 4 warps. */
template <class C>
__device__ __forceinline__ void dec_merge_last(const DecParams &p, float *ml, int hk, int b) {
    __threadfence();
    named_bar_sync(1, 128);
    unsigned *cnt = p.ws_cnt + (int64_t)b * p.heads_kv + hk;
    volatile unsigned *done = (volatile unsigned *)ml;
    if (threadIdx.x == 0) *done = atomicAdd(cnt, 1u);
    named_bar_sync(1, 128);
    if (*done != (unsigned)p.splits - 1) return;
    __threadfence();
    if (threadIdx.x == 0) *cnt = 0u;
    const int unit = b * p.heads_kv + hk;
    for (int r = threadIdx.x / 32; r < p.rows; r += 4)
        dec_combine_row<C::D, C::BF16, C::LOCAL>(p, unit * p.rows + r, threadIdx.x % 32);
}

/* the same, a call of its own: inlined, it made the FP8 d256 instances spill
 * 52 bytes (255 registers, not 254); the 16-bit d128 64-row ones spill
 * when it is not inlined */
template <class C>
__device__ __noinline__ void dec_merge_last_call(const DecParams &p, float *ml, int hk, int b) {
    dec_merge_last<C>(p, ml, hk, b);
}

template <class C>
__device__ __forceinline__ void dec_epilogue_merge(const DecParams &p, uint8_t *sm, float *ml, int split, int hk,
                                                   int b);

/* The consumers' end: the WN warps of each row block merged through shared
 * memory (stage 0, free once every consumer is past its last block), then
 * each row's O and LSE written, normalised (LOCAL with one split: with the
 * sink): to o and lse, or with more than one split to the workspace for
 * fwd_decode_combine. */
template <class C>
__device__ __forceinline__ void dec_epilogue(const DecParams &p, uint8_t *sm, float *ml, const float (&oacc)[C::D / 8][4],
                                             const float (&mrow)[2], const float (&lrow)[2], int warp, int g, int t,
                                             int split, int hk, int b) {
    constexpr int D = C::D;
    named_bar_sync(1, 128);
    float *scr = (float *)sm;
    for (int h = 0; h < 2; ++h) {
        float l = lrow[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        if (t == 0) {
            ml[(warp * 16 + g + 8 * h) * 2] = mrow[h];
            ml[(warp * 16 + g + 8 * h) * 2 + 1] = l;
        }
    }
#pragma unroll
    for (int i = 0; i < D / 8; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float *at = scr + (warp * 16 + g + 8 * h) * D;
            if constexpr (C::KV8) { /* O's columns as dec_pv8 permuted them */
                at[dec_vcol8<C>(i, 2 * t)] = oacc[i][2 * h];
                at[dec_vcol8<C>(i, 2 * t + 1)] = oacc[i][2 * h + 1];
            } else {
                *(float2 *)(at + i * 8 + 2 * t) = make_float2(oacc[i][2 * h], oacc[i][2 * h + 1]);
            }
        }
    dec_epilogue_merge<C>(p, sm, ml, split, hk, b);
}

/* The epilogue's second half, once every warp's (max, sum) are in ml and its
 * O in the scratch (rows warp * 16 + r, D floats each, columns as stored) */
template <class C>
__device__ __forceinline__ void dec_epilogue_merge(const DecParams &p, uint8_t *sm, float *ml, int split, int hk,
                                                   int b) {
    constexpr int D = C::D;
    const float sl2 = p.scale_log2;
    const float *scr = (const float *)sm;
    named_bar_sync(1, 128);
    const int tid = threadIdx.x;
    for (int idx = tid; idx < C::WM * 16 * (D / 4); idx += 128) {
        const int row = idx / (D / 4), c4 = idx % (D / 4);
        if (row >= p.rows) continue;
        const int mt = row / 16, rw = row % 16;
        float mm = -INFINITY;
#pragma unroll
        for (int x = 0; x < C::WN; ++x) mm = lse_running_max(mm, ml[((mt * C::WN + x) * 16 + rw) * 2]);
        float L = 0.f;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int x = 0; x < C::WN; ++x) {
            const int w = mt * C::WN + x;
            const float mx = ml[(w * 16 + rw) * 2];
            const float wgt = lse_rescale(mx, mm, sl2);
            L = lse_accumulate(L, wgt, ml[(w * 16 + rw) * 2 + 1]);
            const float4 v = *(const float4 *)(scr + (w * 16 + rw) * D + 4 * c4);
            acc.x = lse_accumulate(acc.x, wgt, v.x), acc.y = lse_accumulate(acc.y, wgt, v.y);
            acc.z = lse_accumulate(acc.z, wgt, v.z), acc.w = lse_accumulate(acc.w, wgt, v.w);
        }
        /* L == 0: the row saw no key (O 0, LSE -inf); NaN propagates */
        float inv, lse;
        lse_finish(L, mm, p.softmax_scale, inv, lse);
        if constexpr (C::LOCAL) {
            /* one split: the sink joins the sum here (FwdEpilogue's
             * finish_row_sink); several: in the combine */
            if (p.sink && p.splits == 1) {
                lse_finish_sink(L, mm, p.softmax_scale, p.sink + hk * p.group + (row - (row / p.group) * p.group), inv,
                                lse);
            }
        }
        acc.x *= inv, acc.y *= inv, acc.z *= inv, acc.w *= inv;
        const int sq = row / p.group, h = hk * p.group + (row - sq * p.group);
        if (p.splits > 1) {
            const int64_t pr = (((int64_t)split * p.batch + b) * p.heads_kv + hk) * p.rows + row;
            *(float4 *)(p.ws_o + pr * D + 4 * c4) = acc;
            if (c4 == 0) p.ws_lse[pr] = lse;
        } else {
            uint16_t *o = (uint16_t *)p.o + b * p.o_sb + (int64_t)sq * p.o_ss + (int64_t)h * p.o_sh + 4 * c4;
            const uint32_t lo = C::BF16 ? pack_bf16x2(acc.x, acc.y) : pack_f16x2(acc.x, acc.y);
            const uint32_t hi = C::BF16 ? pack_bf16x2(acc.z, acc.w) : pack_f16x2(acc.z, acc.w);
            ((uint32_t *)o)[0] = lo;
            ((uint32_t *)o)[1] = hi;
            if (c4 == 0 && p.lse) p.lse[((int64_t)b * p.heads_q + h) * p.seqlen_q + sq] = lse;
        }
    }
    if (p.splits > 1) {
        if constexpr (C::KV8 && C::D == 256) dec_merge_last_call<C>(p, ml, hk, b);
        else dec_merge_last<C>(p, ml, hk, b);
    }
}

#include "fwd_decode_t8.cuh"

template <class C>
__global__ void __launch_bounds__(C::THREADS, C::MIN_CTAS)
    fwd_decode_kernel(const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v,
                      const __grid_constant__ DecParams p) {
    constexpr int D = C::D, BN = C::BN, STAGES = C::STAGES;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *sm = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint64_t *full = (uint64_t *)(sm + C::OFF_BAR), *empty = full + STAGES;
    float *ml = (float *)(sm + C::OFF_ML);
    const int split = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(&full[s], C::KV8 ? 33 : 1); /* KV8: the TMA arrival and the 32 lanes' scales */
            mbar_init(&empty[s], C::KV8 ? 128 : 4); /* KV8: every consumer thread */
        }
    }
    __syncthreads();
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    const int len = dec_len_k(p, b);
    int n_lo, n_hi;
    int wdl = 0, wdr = 0; /* LOCAL: the window (dec_window) */
    dec_split_blocks<C>(p, len, split, n_lo, n_hi, wdl, wdr);

    if (warp == 4) {
        if constexpr (C::KV8) dec_produce8<C>(p, &tm_k, &tm_v, sm, full, empty, n_lo, n_hi, hk, b, len, lane);
        else if (lane == 0) dec_produce<C>(p, &tm_k, &tm_v, sm, full, empty, n_lo, n_hi, hk, b, len);
        return;
    }
    if constexpr (C::T8) {
        dec_consume_t8<C>(p, sm, ml, full, empty, n_lo, n_hi, len, warp, lane, split, hk, b);
        return;
    }

    const int wm = warp / C::WN, wn = warp % C::WN;
    const int g = lane / 4, t = lane % 4;
    const int r_lo = wm * 16 + g; /* rows r_lo and r_lo + 8 of the tile */
    /* Q's A fragments for every k-step, straight from global memory (a few KB) */
    uint32_t qf[D / 16][4];
    {
        const uint16_t *q = (const uint16_t *)p.q;
        const uint16_t *qrow[2] = {nullptr, nullptr};
        for (int h = 0; h < 2; ++h) {
            const int r = r_lo + 8 * h;
            if (r < p.rows) {
                const int sq = r / p.group, j = r - sq * p.group;
                qrow[h] = q + b * p.q_sb + (int64_t)sq * p.q_ss + (int64_t)(hk * p.group + j) * p.q_sh;
            }
        }
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const uint16_t *qr = qrow[e & 1];
                /* KV8: the k dimension permuted as K's codes are read */
                const int col = C::KV8 ? dec_kcol8<C>(kk, t) + 2 * (e >> 1) : kk * 16 + 2 * t + 8 * (e >> 1);
                qf[kk][e] = qr ? *(const uint32_t *)(qr + col) : 0u;
            }
    }
    float qrinv[2] = {1.f, 1.f}; /* KV8: S's rows times q's power of two back */
    if constexpr (C::KV8 && C::BF16) dec_q8_to_f16<C>(qf, qrinv);
    float vU = FLT_MIN, vru = 1.f / FLT_MIN; /* KV8: the warp's V unit (dec_vunit) */
    float oacc[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.f;
    float mrow[2] = {-INFINITY, -INFINITY}, lrow[2] = {0.f, 0.f};
    /* the query index of rows r_lo, r_lo + 8, for the causal bound */
    int qlast[2], qfirst[2] = {0, 0};
    for (int h = 0; h < 2; ++h) {
        const int r = min(r_lo + 8 * h, p.rows - 1);
        if constexpr (C::LOCAL) {
            /* LOCAL: the window's keys of query r / group, within the sequence */
            qfirst[h] = max(r / p.group + wdl, 0);
            qlast[h] = min(r / p.group + wdr, len - 1);
        } else {
            /* key j is visible to query i iff j <= i + len - seqlen_q */
            qlast[h] = p.causal ? r / p.group + len - p.seqlen_q : len - 1;
            qlast[h] = min(qlast[h], len - 1);
        }
    }
    const float sl2 = p.scale_log2;
    const int kw0 = wn * C::KW; /* this warp's first key of each block */

    for (int n = n_lo, it = 0; n < n_hi; ++n, ++it) {
        const int s = it % STAGES;
        mbar_wait(&full[s], (it / STAGES) & 1);
        uint8_t *kst = sm + s * C::STAGE_BYTES, *vst = kst + C::V_OFF;
        const uint32_t kbase = smem_u32(kst), vbase = smem_u32(vst);
        /* S = Q K^T for this warp's KW keys */
        float sacc[C::NT][4];
#pragma unroll
        for (int i = 0; i < C::NT; ++i) sacc[i][0] = sacc[i][1] = sacc[i][2] = sacc[i][3] = 0.f;
        const int j8 = lane / 8, rr = lane % 8;
        const float *scales = (const float *)(sm + C::OFF_SC + s * C::SCALES); /* KV8: K's, then V's */
        if constexpr (C::KV8) dec_s8<C>(sacc, qf, kbase, kw0, g, t);
        else
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
            for (int np = 0; np < C::NT / 2; ++np) {
                /* matrices: (keys +0, d +0), (keys +0, d +8), (keys +8, d +0), (keys +8, d +8) */
                const int key = kw0 + np * 16 + (j8 >> 1) * 8 + rr, col = kk * 16 + (j8 & 1) * 8;
                uint32_t bk[4];
                ldsm_x4(bk, kbase + dec_sw<BN>(key, col));
                mma_m16n8k16<C::BF16>(sacc[2 * np], qf[kk], bk[0], bk[1]);
                mma_m16n8k16<C::BF16>(sacc[2 * np + 1], qf[kk], bk[2], bk[3]);
            }
        /* KV8: K's scales, per key, on S (and q's power of two) */
        if constexpr (C::KV8) dec_scale_cols<C>(sacc, scales, kw0, t, 1.f, qrinv);
        /* LOCAL: softcap (a uniform branch), before the mask */
        if constexpr (C::SOFTCAP) dec_softcap<C>(p, sacc);
        /* mask keys past the sequence or the causal bound (LOCAL: the window's edges) */
        const int key0 = n * BN + kw0;
        const bool tail = (n + 1) * BN > len;
        if constexpr (C::LOCAL) {
            if (tail || (n + 1) * BN - 1 > wdr || n * BN < p.seqlen_q - 1 + wdl) {
#pragma unroll
                for (int i = 0; i < C::NT; ++i)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int key = key0 + i * 8 + 2 * t + (e & 1);
                        if (key > qlast[e >> 1] || key < qfirst[e >> 1]) sacc[i][e] = -INFINITY;
                    }
            }
        } else if (tail || (p.causal && (n + 1) * BN - 1 > len - p.seqlen_q)) {
#pragma unroll
            for (int i = 0; i < C::NT; ++i)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = key0 + i * 8 + 2 * t + (e & 1);
                    if (key > qlast[e >> 1]) sacc[i][e] = -INFINITY;
                }
        }
        /* KV8: O's rescale by a grown V unit, with the softmax's */
        float vfac = 1.f;
        if constexpr (C::KV8) vfac = dec_vunit<C>(scales + BN, kw0, t, vU, vru);
        /* online softmax, rows r_lo (e 0, 1) and r_lo + 8 (e 2, 3) */
        float alpha[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float bm = -INFINITY;
#pragma unroll
            for (int i = 0; i < C::NT; ++i) bm = fmaxf(bm, fmaxf(sacc[i][2 * h], sacc[i][2 * h + 1]));
            bm = fmaxf(bm, __shfl_xor_sync(0xffffffffu, bm, 1));
            bm = fmaxf(bm, __shfl_xor_sync(0xffffffffu, bm, 2));
            const float mu = dec_softmax_max(mrow[h], bm, sl2, alpha[h]);
            float sum = 0.f;
#pragma unroll
            for (int i = 0; i < C::NT; ++i) {
                sacc[i][2 * h] = exp2f(fmaf(sacc[i][2 * h], sl2, -mu));
                sacc[i][2 * h + 1] = exp2f(fmaf(sacc[i][2 * h + 1], sl2, -mu));
                sum += sacc[i][2 * h] + sacc[i][2 * h + 1];
            }
            lrow[h] = lrow[h] * alpha[h] + sum;
            if constexpr (C::KV8) alpha[h] *= vfac;
        }
        /* KV8: not when every row's factor is 1 (most blocks once the maxima settle) */
        if (!C::KV8 || __any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f))
#pragma unroll
            for (int i = 0; i < D / 8; ++i) {
                oacc[i][0] *= alpha[0];
                oacc[i][1] *= alpha[0];
                oacc[i][2] *= alpha[1];
                oacc[i][3] *= alpha[1];
            }
        /* V rows past the sequence: zeros (0 x anything = 0; first row block's warps, then all meet) */
        if (!C::KV8 && tail) { /* KV8: zeroed in registers by dec_pv8 */
            if (wm == 0 && key0 + C::KW > len)
                for (int x = lane; x < C::KW * C::SLABS * 8; x += 32) {
                    const int row = kw0 + x / (C::SLABS * 8), c = x % (C::SLABS * 8);
                    if (n * BN + row >= len)
                        *(uint4 *)(vst + (c / 8) * BN * 128 + row * 128 + (c % 8) * 16) = make_uint4(0, 0, 0, 0);
                }
            named_bar_sync(2, 128);
        }
        /* O += P V, P's fragments straight from S's accumulators */
        if constexpr (C::KV8) {
            dec_pv8<C>(oacc, sacc, scales + BN, vru, vbase, kw0, g, t, n * BN, len, tail);
        } else {
            dec_pv<C>(oacc, sacc, vbase, kw0, j8, rr);
            /* the zeroing above was a generic-proxy write the next TMA load overwrites */
            if (tail) fence_async_shared();
        }
        /* KV8: each thread releases its own reads (racecheck tracks the scales' cp.async) */
        __syncwarp();
        if (C::KV8 || lane == 0) mbar_arrive(&empty[s]);
    }
    if constexpr (C::KV8) dec_vunit_out<C>(oacc, vU);

    dec_epilogue<C>(p, sm, ml, oacc, mrow, lrow, warp, g, t, split, hk, b);
}
