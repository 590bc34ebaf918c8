/* bwd_producer.cuh - the backward's producer warpgroup (warpgroup 0, 24
 * registers): warp 0's one thread loads K and V of the key block once and,
 * per iteration, Q, dO and the 64 rows' LSE and D into the 2-stage ring
 * (TMA, full_qdo / empty_qdo); warp 1 is the dQ writer, which adds each
 * iteration's fp32 dQ tile to the accumulator in global memory with bulk
 * reduce-adds, so that no consumer waits on global memory. */
#pragma once
#include "bwd_scheduler.cuh"

/* The load thread; VARLEN: packed rows (batch coordinate 0) from the
 * sequence's first, q/krow0 and bc as bwd_sm90_body gives them. */
template <class C>
__device__ __forceinline__ void bwd_producer(const BwdSmem<C> &sm, const CUtensorMap &tm_q, const CUtensorMap &tm_k,
                                             const CUtensorMap &tm_v, const CUtensorMap &tm_do,
                                             const CUtensorMap &tm_stats, const BwdParams &p, const BwdSeq &sq,
                                             const BwdIter<C> &iter, int n, int hk, int b, int qrow0, int krow0,
                                             int bc) {
    constexpr int BN = C::BN, BM = C::BM, STAGES = C::STAGES;
    mbar_expect_tx_arrive(sm.full_kv, 2 * C::KV_BYTES);
    for (int c = 0; c < C::SLABS; ++c) {
        tma_load_4d(sm.k() + c * BN * 128, &tm_k, c * 64, krow0 + n * BN, hk, bc, sm.full_kv);
        tma_load_4d(sm.v() + c * BN * 128, &tm_v, c * 64, krow0 + n * BN, hk, bc, sm.full_kv);
    }
    for (int it = 0; it < iter.total; ++it) {
        int h, m;
        iter.decode(it, hk, p, h, m);
        const int s = it % STAGES;
        if (it >= STAGES) mbar_wait<C::PSLEEP>(&sm.empty_qdo[s], ((it / STAGES) - 1) & 1);
        mbar_expect_tx_arrive(&sm.full_qdo[s], 2 * C::QT_BYTES + 2 * BM * 4);
        for (int c = 0; c < C::SLABS; ++c) {
            tma_load_4d(sm.q(s) + c * BM * 128, &tm_q, c * 64, qrow0 + m * BM, h, bc, &sm.full_qdo[s]);
            tma_load_4d(sm.dout(s) + c * BM * 128, &tm_do, c * 64, qrow0 + m * BM, h, bc, &sm.full_qdo[s]);
        }
        /* the 64 rows' LSE and D: [2 batch][heads][m_blocks][64] f32 (lse2, then dsum);
         * VARLEN: [2][heads][rb_total][64] */
        if constexpr (C::VARLEN) {
            tma_load_4d(sm.lse(s), &tm_stats, 0, sq.rb + m, h, 0, &sm.full_qdo[s]);
            tma_load_4d(sm.dsum(s), &tm_stats, 0, sq.rb + m, h, 1, &sm.full_qdo[s]);
        } else {
            tma_load_4d(sm.lse(s), &tm_stats, 0, m, h, b, &sm.full_qdo[s]);
            tma_load_4d(sm.dsum(s), &tm_stats, 0, m, h, p.batch + b, &sm.full_qdo[s]);
        }
    }
}

/* The dQ writer warp: per iteration, once the consumers have staged the
 * tile (BAR_DQ_FULL), one bulk reduce-add of it; in deterministic
 * mode it first waits for its turn (bwd_dq_turn) on the query block's
 * counter, and adds one after its add has landed. */
template <class C>
__device__ __forceinline__ void bwd_dq_writer(const BwdSmem<C> &sm, const BwdParams &p, const BwdSeq &sq,
                                              const BwdIter<C> &iter, int n, int hk, int b, int lane) {
    const int T = iter.total;
    /* the first hand-over of each dQ stage is free (SPLIT_D: the tile is in
     * the Q/dO stage, freed by full_qdo) */
    if constexpr (!C::SPLIT_D)
        for (int q = 0; q < C::DQ_STAGES; ++q) named_bar_arrive(C::BAR_DQ_EMPTY + q, 288);
    for (int it = 0; it < T; ++it) {
        int h, m;
        iter.decode(it, hk, p, h, m);
        const int dqs = it % C::DQ_STAGES;
        named_bar_sync(C::BAR_DQ_FULL + dqs, 288);
        const size_t tile = C::VARLEN ? (size_t)h * p.rb_total + sq.rb + m : ((size_t)b * p.heads_q + h) * p.m_blocks + m;
        float *dst = p.dq_acc + tile * (size_t)(C::BM * C::D); /* the tile, bwd_dq_index's order */
        int *sem = p.dq_sem + tile;
        if (p.deterministic) {
            const int turn = bwd_dq_turn<C>(p, n, m);
            if (lane == 0)
                while (ld_acquire_gpu(sem) != turn) {
                }
            __syncwarp();
        }
        if (lane == 0) {
            bulk_reduce_add_f32(dst, sm.dq(dqs), C::DQ_TILE_BYTES);
            bulk_commit_group();
            if (p.deterministic) bulk_wait_all(); /* landed before the counter moves */
        }
        if (p.deterministic) {
            __syncwarp();
            if (lane == 0) {
                asm volatile("fence.proxy.async.global;\n" ::: "memory");
                __threadfence();
                atomicAdd(sem, 1);
            }
        } else if (lane == 0) {
            bulk_wait_read_all(); /* the buffer may be rewritten */
        }
        __syncwarp();
        if constexpr (C::SPLIT_D) {
            /* the stage's tile is read: the stage back to the producer */
            if (lane == 0) mbar_arrive(&sm.empty_qdo[dqs]);
        } else if (it + C::DQ_STAGES < T) {
            named_bar_arrive(C::BAR_DQ_EMPTY + dqs, 288);
        }
    }
    if (lane == 0) bulk_wait_all();
}
