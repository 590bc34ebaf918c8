/* fwd_producer.cuh - the producer warpgroup's one working thread: it runs the
 * tile scheduler, hands each consumer warpgroup its tile index and Q rows
 * (the Q slots), and streams the tile's K and V blocks into the ring by TMA,
 * from the last key block to the first (the masked blocks come first); on
 * KV-cache pages TMA cannot load, it posts each block to the gather warps
 * instead (fwd_gather.cuh). */
#pragma once
#include "fwd_pipeline.cuh"
#include "fwd_scheduler.cuh"

template <class C, class SP>
struct FwdProducer {
    const CUtensorMap &tm_q, &tm_k, &tm_v;
    const FwdParams &p;
    const FwdSmem<C> &sm;
    uint32_t cta_rank;
    const FwdVarlen *vl; /* VARLEN only */
    const FwdLocal *loc = nullptr; /* LOCAL only */
    const FwdPaged *pg = nullptr; /* KVCACHE only */
    int q_iter = 0;
    /* VARLEN: the walk's position vb in the order of the sequences, that
     * sequence vs, its first compact tile vbase and its tile count vn */
    int vb = -1, vs = 0, vbase = 0, vn = 0;

    /* VARLEN: the scheduler hands out compact indices c over the tiles that
     * exist, sequence by sequence (ceil(len_q / BM) x heads_q each, m fastest,
     * longest first when causal), the sequences in batch order or, causal,
     * longest first (fwd_varlen_order); this maps c to the padded index the
     * consumers decode (fwd_tile_decode over batch x heads x num_m_blocks;
     * causal as one head group), or num_tiles past the last sequence.  c only
     * grows on a CTA (static: + grid; dynamic: a counter), so the sequence is
     * found by walking forward.  A sequence's tiles come from varlen_rows'
     * clamped length, at most num_m_blocks, so the walk's sums stay <=
     * num_tiles. */
    __device__ __forceinline__ int tile_of(int c) {
        if constexpr (C::VARLEN) {
            while (c >= vbase + vn) {
                if (vb + 1 >= p.batch) return p.num_tiles;
                vbase += vn;
                ++vb;
                vs = C::CAUSAL && p.batch <= FWD_VARLEN_ORDER_MAX ? ld_shared_s32(&sm.vorder[vb]) : vb;
                int q0, lq;
                varlen_rows(vl->cu_q, vs, vl->total_q, p.seqlen_q, q0, lq);
                vn = min((lq + C::BM - 1) / C::BM, p.num_m_blocks) * p.heads_q;
            }
            const int nm = vn / p.heads_q, w = c - vbase;
            const int h = w / nm, r = w - h * nm;
            const int bh = vs * p.heads_q + h;
            /* causal: m = nm - 1 - r, so t's row (num_m_blocks - 1 - m) is num_m_blocks - nm + r */
            return C::CAUSAL ? (p.num_m_blocks - nm + r) * (p.batch * p.heads_q) + bh : bh * p.num_m_blocks + r;
        } else {
            return c;
        }
    }

    /* Hand warpgroup w its next tile: wait until it has released the Q
     * buffer (its last QK^T of the tile that last used that buffer), write
     * the tile index, then load that tile's Q rows, or just arrive (no key
     * to see, the end, or with SITOUT no row of w in the sequence); the
     * arrive on full_q publishes the index (release semantics).  ++q_iter
     * after all warpgroups. */
    __device__ __forceinline__ void hand_over(int w, int tile, bool load, int m, int h, int b, int q0) {
        const int qb = q_iter % C::QBUF, qi = w * C::QBUF + qb;
        if (q_iter >= C::QBUF) mbar_wait<C::SLEEP>(&sm.empty_q[qi], (q_iter / C::QBUF - 1) & 1);
        st_shared_s32(&sm.tile_slot[qi], tile);
        if (!load || (C::SITOUT && m * C::BM + w * 64 >= p.seqlen_q)) {
            mbar_arrive(&sm.full_q[qi]);
            return;
        }
        mbar_expect_tx_arrive(&sm.full_q[qi], C::QWG_BYTES);
        for (int c = 0; c < C::SLABS; ++c)
            tma_load_4d(sm.q_rows(qb, w) + c * C::BM * C::SW, &tm_q, c * C::SLAB_COLS,
                        (C::VARLEN ? q0 : 0) + m * C::BM + w * 64, h, C::VARLEN ? 0 : b, &sm.full_q[qi]);
    }
    /* every warpgroup the same tile; after the first, the index is read back
     * from the slot just written, so it need not stay in one of the few
     * registers the producer has (a spill at 24) */
    __device__ __forceinline__ void hand_over_each(int tile, bool load, int m, int h, int b, int q0) {
        hand_over(0, tile, load, m, h, b, q0);
        for (int w = 1; w < C::NC; ++w)
            hand_over(w, ld_shared_s32(&sm.tile_slot[(w - 1) * C::QBUF + q_iter % C::QBUF]), load, m, h, b, q0);
        ++q_iter;
    }
    /* all consumer warpgroups' next tile (QEARLY: handed over a tile early) */
    __device__ __forceinline__ void hand_over_all(int tile) {
        int m = 0, h = 0, b = 0, q0 = 0;
        bool load = tile < p.num_tiles;
        if (load) {
            fwd_decode<C>(p, loc, tile, m, h, b);
            const FwdSeq seq = fwd_seq<C>(p, vl, b);
            q0 = seq.q0;
            int lo;
            load = fwd_tile_blocks<C>(p, loc, seq, m, lo) > 0;
        }
        hand_over_each(tile, load, m, h, b, q0);
    }
    /* K or V block n into a stage (SLABS: K's or V's): all slabs, or with a
     * cluster this CTA's half of them, multicast to both CTAs (each CTA's
     * full barrier expects the whole block: its own half and the peer's) */
    template <int SLABS>
    __device__ __forceinline__ void load_kv(uint8_t *dst, const CUtensorMap *map, int n, int hk, int b, int k0,
                                            uint64_t *bar) const {
        if constexpr (C::KVCACHE) { /* a KV cache (FwdVarlen): batch entry b's rows, or its pages */
            load_kv_cache(dst, map, n, hk, b, k0, bar);
            return;
        }
        /* VARLEN: rows of the packed tensor from the sequence's first key */
        const int row = (C::VARLEN ? k0 : 0) + n * C::BN, bb = C::VARLEN ? 0 : b;
        constexpr int PER_CTA = SLABS / C::CLUSTER;
#pragma unroll
        for (int i = 0; i < PER_CTA; ++i) {
            const int c = (int)cta_rank * PER_CTA + i;
            if (C::CLUSTER > 1)
                tma_load_4d_multicast(dst + c * C::BN * C::SW, map, c * C::SLAB_COLS, row, hk, bb, bar,
                                      (uint16_t)0x3);
            else
                tma_load_4d(dst + c * C::BN * C::SW, map, c * C::SLAB_COLS, row, hk, bb, bar);
        }
    }
    /* VARLEN on a KV cache: key block n of sequence b from batch entry b
     * (one box of BN rows), or from its pages, a box of kv_box rows at a
     * time, each from the page that holds it (a page number out of the
     * pool reads as zeros: TMA bounds) */
    __device__ __forceinline__ void load_kv_cache(uint8_t *dst, const CUtensorMap *map, int n, int hk, int b,
                                                  int lpad, uint64_t *bar) const {
        const int k0 = n * C::BN;
        if (!vl->block_table) { /* rows from the sequence's left pad (fwd_seq), of its batch entry */
            const int bb = vl->cache_batch_idx ? __ldg(vl->cache_batch_idx + b) : b;
#pragma unroll
            for (int c = 0; c < C::SLABS; ++c)
                tma_load_4d(dst + c * C::BN * C::SW, map, c * C::SLAB_COLS, lpad + k0, hk, bb, bar);
            return;
        }
        for (int r = 0; r < C::BN; r += pg->kv_box) {
            const int key = k0 + r;
            const int j = fattn_page_div(key, vl->page_mul, vl->page_shr);
            const int page = __ldg(vl->block_table + b * vl->max_pages + min(j, vl->max_pages - 1));
            const int row = key - j * vl->page_size;
#pragma unroll
            for (int c = 0; c < C::SLABS; ++c)
                tma_load_4d(dst + (c * C::BN + r) * C::SW, map, c * C::SLAB_COLS, row, hk, page, bar);
        }
    }
    /* KVCACHE on pages TMA cannot load (FwdPaged kv_box 0): the gather
     * warps load the stages (fwd_gather.cuh).  Its uses sit under `if
     * constexpr (C::KVCACHE)`: even folded to false, a plain `if` renumbered
     * the other kernels' PTX registers, and ptxas allocated them otherwise */
    __device__ __forceinline__ bool gathers() const { return C::KV8 || pg->kv_box == 0; }
    /* ... and this thread posts them each block (after empty_k[s]): its
     * sequence, kv head, first key and used keys; b < 0: the end */
    __device__ __forceinline__ void post_job(int s, int b, int hk, int k0, int len) const {
        if constexpr (C::KVCACHE) {
            st_shared_s32x4(sm.job_slot + 4 * s, b, hk, k0, len);
            mbar_arrive(&sm.job[s]);
        }
    }
    /* the K and V maps into the descriptor cache */
    __device__ __forceinline__ void prefetch_kv_maps() const {
        tma_prefetch_desc(&tm_k);
        tma_prefetch_desc(&tm_v);
    }
    /* K block n into stage s by TMA, the stage's full barrier expecting its bytes */
    __device__ __forceinline__ void load_k(int s, int n, int hk, int b, int k0) const {
        mbar_expect_tx_arrive(&sm.full_k[s], C::K_BYTES);
        load_kv<C::SLABS>(sm.k_stage(s), &tm_k, n, hk, b, k0, &sm.full_k[s]);
    }
    /* Q is read once, from DRAM: pull the next tile's Q into L2 a tile ahead
     * of its load into shared memory */
    __device__ __forceinline__ void prefetch_q(int t_next) const {
        int m2, h2, b2;
        fwd_decode<C>(p, loc, t_next, m2, h2, b2);
        const int q0 = C::VARLEN ? fwd_seq<C>(p, vl, b2).q0 : 0;
        for (int w = 0; w < C::NC; ++w)
            for (int c = 0; c < C::SLABS; ++c)
                tma_prefetch_l2_4d(&tm_q, c * C::SLAB_COLS, q0 + m2 * C::BM + w * 64, h2, C::VARLEN ? 0 : b2);
    }

    __device__ __forceinline__ void run(const FwdScheduler<C, SP> &sched) {
#ifdef FATTN_FWD_TRACE
        int trace_n = 0;
#endif
        tma_prefetch_desc(&tm_q);
        if constexpr (C::KVCACHE) {
            if (!gathers()) prefetch_kv_maps(); /* the gather's maps are not made */
        } else {
            prefetch_kv_maps();
        }
        int it = 0;
        int rng;
        int t = tile_of(sched.first(rng));
        int wave = 0;
        if (C::QEARLY) hand_over_all(t);
        /* VARLEN: a CTA may have no tile at all */
        for (bool go = !(C::SPLIT || C::VARLEN) || t < p.num_tiles; go;) {
            /* the next tile is picked one ahead, so its Q can be prefetched */
            ++wave;
            int rng_next = rng;
            const int t_next = tile_of(sched.next(wave, rng_next));
            int m, h, b;
            fwd_decode<C>(p, loc, t, m, h, b);
            const FwdSeq seq = fwd_seq<C>(p, vl, b);
            int lo; /* LOCAL: the window's first block; else 0 */
            const int nblocks = fwd_tile_blocks<C>(p, loc, seq, m, lo);
            const int n_lo = C::SPLIT ? rng & 0xffff : lo, n_hi = C::SPLIT ? rng >> 16 : lo + nblocks;
            const int hk = h / p.group;
            FWD_TRACE(20);
            /* QEARLY loads the next Q itself after this tile's first V: no prefetch */
            /* (KVCACHE: the page walk has the producer's registers) */
            if (!C::QEARLY && !C::KVCACHE && t_next < p.num_tiles) prefetch_q(t_next);
            if (nblocks == 0) {
                /* every row masked: the consumers only write O = 0, LSE = -inf
                 * (QEARLY: this tile was handed over already; hand over the next) */
                if (C::QEARLY) {
                    hand_over_all(t_next);
                } else {
                    hand_over_each(t, false, m, h, b, seq.q0);
                }
            }
            for (int n = n_hi - 1; n >= n_lo; --n, ++it) {
                const int s = ring_stage(it, C::STAGES);
                const uint32_t ph = ring_phase(it, C::STAGES);
                ring_wait_empty<C>(&sm.empty_k[s], ph ^ 1);
                FWD_TRACE(21);
                if constexpr (C::KVCACHE) {
                    /* K and V: the gather warps, keys counted from the cache row's start
                     * (seq.k0: the left pad) */
                    if (gathers()) post_job(s, b, hk, seq.k0 + n * C::BN, seq.k0 + seq.len_k);
                    else load_k(s, n, hk, b, seq.k0);
                } else {
                    load_k(s, n, hk, b, seq.k0);
                }
                if (!C::QEARLY && n == n_hi - 1) {
                    /* the first K's stage frees before the Q buffers do (one
                     * block earlier), so K goes first; then each warpgroup's
                     * tile index and Q, as soon as that warpgroup has issued
                     * its last QK^T of the previous tile */
                    hand_over_each(t, true, m, h, b, seq.q0);
                    FWD_TRACE(22);
                }
                if constexpr (C::KVCACHE) {
                    if (gathers()) continue;
                }
                /* FP8: V row-major into its own ring, for the transposers */
                uint64_t *v_empty = C::FP8 ? &sm.empty_vraw[s] : &sm.empty_v[s];
                uint64_t *v_full = C::FP8 ? &sm.full_vraw[s] : &sm.full_v[s];
                ring_wait_empty<C>(v_empty, ph ^ 1);
                FWD_TRACE(23);
                mbar_expect_tx_arrive(v_full, C::FP8 ? C::VRAW_BYTES : C::V_BYTES);
                load_kv<C::FP8 ? C::SLABS : C::V_SLABS>(C::FP8 ? sm.vraw_stage(s) : sm.v_stage(s), &tm_v, n, hk, b,
                                                        seq.k0, v_full);
                /* QEARLY: the next tile's Q goes into the other buffer during
                 * this tile.  That buffer's previous tile (two back) has
                 * issued its last QK^T by now: the V stage just waited for
                 * was freed after it. */
                if (C::QEARLY && n == n_hi - 1) hand_over_all(t_next);
            }
            t = t_next;
            rng = rng_next;
            if (t >= p.num_tiles) break;
        }
        /* end of work for the consumers (QEARLY: handed over with the last tile) */
        if (!C::QEARLY) hand_over_all(p.num_tiles);
        if constexpr (C::KVCACHE) {
            if (gathers()) { /* the gather warps' end, once the stage's job slot is free */
                const int s = ring_stage(it, C::STAGES);
                ring_wait_empty<C>(&sm.empty_k[s], ring_phase(it, C::STAGES) ^ 1);
                post_job(s, -1, 0, 0, 0);
            }
        }
        if (C::FP8) {
            /* the transposers' end: the next V stage's turn comes with the flag set */
            const int s = ring_stage(it, C::STAGES);
            ring_wait_empty<C>(&sm.empty_vraw[s], ring_phase(it, C::STAGES) ^ 1);
            st_shared_s32(&sm.end_flag[s], it);
            mbar_arrive(&sm.full_vraw[s]);
        }
        sched.finish();
        FWD_TRACE_END();
    }
};
