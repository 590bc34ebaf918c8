/* fwd_scheduler.cuh - which tile a persistent CTA works on next, and what a
 * tile is: (query block m, head, batch) and its range of key blocks.
 *   static:  CTA c takes tiles c, c + G, c + 2G, ... (G = gridDim.x), or
 *            rotated within each wave (SPREAD);
 *   dynamic: causal tiles grabbed from a global counter, longest first,
 *            heads in groups whose K/V fit in L2; the last CTA rewinds it;
 *   split:   whole tiles for the full waves, then each worker's one or two
 *            pieces of the tail tiles (FwdSplit, laid out by the host).
 * The producer alone runs the scheduler (first / next) and hands each tile
 * index to the consumers; both sides decode it with fwd_tile_decode. */
#pragma once
#include "../../common/ptx.cuh"
#include "../../common/varlen.cuh"
#include "fwd_params.cuh"
#include "fwd_traits.cuh"

/* Tile t -> (m_block, head, batch).  Non-causal: m fastest, so the CTAs in
 * flight share the K/V of one or two heads in L2.  Causal: heads are taken in
 * p.head_groups groups of p.head_group (the last takes the rest, up to twice
 * that); inside a group the longest rows (largest m) come first, so each
 * group's tail is short tiles. */
template <bool CAUSAL>
__device__ __forceinline__ void fwd_tile_decode(const FwdParams &p, int t, int &m, int &h, int &b, bool m_up = false) {
    int bh;
    if (CAUSAL) {
        const int nbh = p.batch * p.heads_q;
        const int per_group = p.head_group * p.num_m_blocks;
        const int g = min(t / per_group, p.head_groups - 1), within = t - g * per_group;
        const int gsize = g == p.head_groups - 1 ? nbh - g * p.head_group : p.head_group;
        /* LOCAL m_up (FwdLocal): a left-bound window's longest tiles are its first */
        m = m_up ? within / gsize : p.num_m_blocks - 1 - within / gsize;
        bh = g * p.head_group + within % gsize;
    } else {
        m = t % p.num_m_blocks;
        bh = t / p.num_m_blocks;
    }
    h = bh % p.heads_q;
    b = bh / p.heads_q;
}

/* fwd_tile_decode of a kernel with options C (LOCAL: the order FwdLocal asks for) */
template <class C>
__device__ __forceinline__ void fwd_decode(const FwdParams &p, const FwdLocal *loc, int t, int &m, int &h, int &b) {
    if constexpr (C::LOCAL) fwd_tile_decode<C::CAUSAL>(p, t, m, h, b, loc->m_up != 0);
    else (void)loc, fwd_tile_decode<C::CAUSAL>(p, t, m, h, b);
}

/* LOCAL: the window of sequence s as bounds on j - i (key minus query
 * index): dl <= j - i <= dr; an unbounded side becomes a bound every pair
 * meets (j - i lies in [-(len_q - 1), len_k - 1]).  FwdLocal's host-side
 * limits keep every sum in an int. */
__device__ __forceinline__ void fwd_window_diag(const FwdLocal *loc, const FwdSeq &s, int &dl, int &dr) {
    const int off = s.len_k - s.len_q;
    dl = loc->left < 0 ? -s.len_q : off - loc->left;
    dr = loc->right < 0 ? s.len_k : off + loc->right;
}

/* Number of key blocks tile m must visit (0 when every row is masked). */
template <class C>
__device__ __forceinline__ int fwd_num_n_blocks(const FwdParams &p, int m) {
    int n = (p.seqlen_k + C::BN - 1) / C::BN;
    if (C::CAUSAL) {
        /* last visible key of the tile's last row: (m+1)*BM - 1 + offset */
        int last = (m + 1) * C::BM - 1 + p.causal_offset;
        int nc = last < 0 ? 0 : last / C::BN + 1;
        n = nc < n ? nc : n;
    }
    return n;
}

/* VARLEN: tile batch b's sequence, from cu_seqlens through varlen_rows'
 * clamp, its keys cut to seqused_k[b] (a negative entry: none); else the
 * fixed lengths */
template <class C>
__device__ __forceinline__ FwdSeq fwd_seq(const FwdParams &p, const FwdVarlen *vl, int b) {
    FwdSeq s;
    if constexpr (C::VARLEN) {
        varlen_rows(vl->cu_q, b, vl->total_q, p.seqlen_q, s.q0, s.len_q);
        if constexpr (C::KVCACHE) { /* batch entry (or pages of) b, FwdVarlen */
            s.k0 = 0;
            s.len_k = p.seqlen_k;
        } else {
            varlen_rows(vl->cu_k, b, vl->total_k, p.seqlen_k, s.k0, s.len_k);
        }
        varlen_used(vl->seqused_k, b, s.len_k);
        varlen_used(vl->seqused_q, b, s.len_q);
        if constexpr (C::KVCACHE) {
            if (vl->cache_leftpad) { /* keys from row leftpad on: k0 is their offset in the cache row */
                s.k0 = min(max(__ldg(vl->cache_leftpad + b), 0), s.len_k);
                s.len_k -= s.k0;
            }
        }
    } else {
        (void)vl, (void)b;
        s.q0 = s.k0 = 0;
        s.len_q = p.seqlen_q;
        s.len_k = p.seqlen_k;
    }
    return s;
}

/* fwd_num_n_blocks for a tile of sequence s: VARLEN tiles past their
 * sequence's queries have none (they write nothing either) */
template <class C>
__device__ __forceinline__ int fwd_tile_n_blocks(const FwdParams &p, const FwdSeq &s, int m) {
    if constexpr (C::VARLEN) {
        if (m * C::BM >= s.len_q) return 0;
        int n = (s.len_k + C::BN - 1) / C::BN;
        if (C::CAUSAL) {
            const int last = (m + 1) * C::BM - 1 + s.len_k - s.len_q;
            const int nc = last < 0 ? 0 : last / C::BN + 1;
            n = nc < n ? nc : n;
        }
        return n < 0 ? 0 : n; /* unchecked cu_seqlens_k (decreasing): no key, never a hang */
    } else {
        (void)s;
        return fwd_num_n_blocks<C>(p, m);
    }
}

/* The key blocks tile m of sequence s visits: lo .. lo + count - 1, the
 * count returned (0: none).  LOCAL: from the first key its first row sees
 * to the last key its last row sees (the tile's rows past the sequence
 * only widen the range; the mask covers them); else from block 0. */
template <class C>
__device__ __forceinline__ int fwd_tile_blocks(const FwdParams &p, const FwdLocal *loc, const FwdSeq &s, int m,
                                               int &lo) {
    if constexpr (C::LOCAL) {
        if (C::VARLEN && m * C::BM >= s.len_q) {
            lo = 0;
            return 0;
        }
        int dl, dr;
        fwd_window_diag(loc, s, dl, dr);
        const int first = m * C::BM + dl, last = (m + 1) * C::BM - 1 + dr;
        const int nb = (s.len_k + C::BN - 1) / C::BN;
        lo = first <= 0 ? 0 : first / C::BN;
        const int hi = last < 0 ? 0 : min(last / C::BN + 1, nb);
        return hi > lo ? hi - lo : 0;
    } else {
        (void)loc;
        lo = 0;
        return fwd_tile_n_blocks<C>(p, s, m);
    }
}

/* VARLEN causal: the order in which the producer walks the sequences,
 * longest first (most keys, then batch order: a causal tile's cost grows
 * with the keys its rows see, and the longest ones must not come last),
 * ranked by the producer warpgroup's 128 threads into sm.vorder before the
 * producer starts; batches of more than FWD_VARLEN_ORDER_MAX sequences keep
 * batch order.  A sequence with no query has no tile: it goes last. */
template <class C, class SM>
__device__ __forceinline__ void fwd_varlen_order(const SM &sm, const FwdParams &p, const FwdVarlen *vl, int tid) {
    if (p.batch > FWD_VARLEN_ORDER_MAX) return;
    int key = 0;
    if (tid < p.batch) {
        const FwdSeq s = fwd_seq<C>(p, vl, tid);
        key = s.len_q > 0 ? s.len_k : -1;
        st_shared_s32(&sm.vkey[tid], key);
    }
    named_bar_sync(1, 128);
    if (tid < p.batch) {
        int r = 0;
        for (int j = 0; j < p.batch; ++j) {
            const int kj = ld_shared_s32(&sm.vkey[j]);
            r += kj > key || (kj == key && j < tid);
        }
        st_shared_s32(&sm.vorder[r], tid);
    }
    named_bar_sync(1, 128);
}

/* The producer's side: a tile index and (SPLIT) its key-block range
 * lo | hi << 16; an index >= p.num_tiles means no more work. */
template <class C, class SP>
struct FwdScheduler {
    const FwdParams &p;
    const SP &sp;
    uint32_t cta_rank;

    /* static tiles t, t + gridDim.x, ...: with a cluster (gridDim.x even,
     * peers at blockIdx 2c and 2c+1) the peers hold tiles 2k and 2k+1.
     * SPREAD: the k-th static tile rotated within its wave, so the cheap
     * tiles SITOUT makes (the last m-block) are shared out */
    __device__ __forceinline__ int static_tile(int k) const {
        return C::SPREAD ? k * (int)gridDim.x + ((int)blockIdx.x + C::CLUSTER * k) % (int)gridDim.x
                         : k * (int)gridDim.x + (int)blockIdx.x;
    }
    /* SPLIT: this CTA's k-th item (FwdSplit); num_tiles when it has no more */
    __device__ __forceinline__ int split_item(int k, int &rng) const {
        if constexpr (C::SPLIT) {
            if (k < sp.waves) {
                const int st = static_tile(k);
                return st < p.num_tiles ? st : p.num_tiles;
            }
            int w = (int)blockIdx.x / C::CLUSTER;
            const int j = k - sp.waves;
            /* opaque per call: sp.tile[w] is then read from the parameter bank
             * where it is used, not hoisted into a register the producer lacks */
            asm volatile("" : "+r"(w));
            if (w >= sp.workers || j > 1 || sp.rng[j][w] == 0) return p.num_tiles;
            rng = sp.rng[j][w];
            return (sp.tile[w] + j) * C::CLUSTER + (int)cta_rank;
        } else {
            (void)rng;
            return static_tile(k);
        }
    }
    /* the first tile (grid <= num_tiles without SPLIT: static_tile(0)) */
    __device__ __forceinline__ int first(int &rng) const {
        rng = fwd_num_n_blocks<C>(p, 0) << 16; /* SPLIT: whole tiles until the tail */
        return C::SPLIT ? split_item(0, rng) : (int)blockIdx.x;
    }
    /* the tile after `wave` earlier ones */
    __device__ __forceinline__ int next(int wave, int &rng) const {
        return C::DYNAMIC ? (int)gridDim.x + (int)atomicAdd(&p.tile_counter[0], 1u)
               : C::SPLIT ? split_item(wave, rng)
                          : static_tile(wave);
    }
    /* after the CTA's last grab: the last CTA done rewinds the counter for
     * the next launch in the stream */
    __device__ __forceinline__ void finish() const {
        if (C::DYNAMIC) {
            __threadfence();
            if (atomicAdd(&p.tile_counter[1], 1u) == gridDim.x - 1) {
                p.tile_counter[0] = 0;
                p.tile_counter[1] = 0;
                __threadfence();
            }
        }
    }
};

/* The consumers' side of SPLIT: tile t's key blocks n_lo .. n_hi - 1 (all of
 * them unless it is a tail tile: this worker's first or second piece). */
template <class C, class SP>
__device__ __forceinline__ void fwd_split_range(const SP &sp, int t, int &n_lo, int &n_hi) {
    if constexpr (C::SPLIT) {
        if (t >= sp.first * C::CLUSTER) {
            const int w = (int)blockIdx.x / C::CLUSTER;
            const int rng = sp.rng[t / C::CLUSTER == sp.tile[w] ? 0 : 1][w];
            n_lo = rng & 0xffff;
            n_hi = rng >> 16;
        }
    } else {
        (void)sp, (void)t, (void)n_lo, (void)n_hi;
    }
}
