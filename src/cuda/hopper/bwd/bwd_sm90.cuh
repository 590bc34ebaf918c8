/* bwd_sm90.cuh - the Hopper 16-bit backward: dQ, dK, dV from Q, K,
 * V, dO and the forward's LSE, one CTA per (key block of BN = 128, kv head,
 * batch), looping over the query heads of its GQA group and their query
 * blocks of BM = 64 (FlashAttention-2/3's key-stationary order: dK and dV
 * stay in registers, dQ is accumulated in fp32 in global memory).
 *
 * Warp specialisation (paper §3.1, as in the forward):
 *   warpgroup 0, warp 0, one thread: K and V of the block once, then per
 *     iteration Q, dO and the 64 rows' LSE and D values (TMA)
 *     into a 2-stage ring (full_qdo / empty_qdo);
 *   warpgroup 0, warp 1: the dQ writer: per iteration it adds the
 *     consumers' fp32 dQ tile to the accumulator in global memory with bulk
 *     reduce-adds (cp.reduce.async.bulk .add.f32), so that no consumer waits
 *     on global memory; in deterministic mode it first waits for its turn
 *     on a counter per query block (bwd_dq_turn);
 *   warpgroups 1 and 2: the consumers, 64 keys each (keys 64 w .. 64 w + 63
 *     of the block), in lockstep, per iteration (all 16-bit GEMMs
 *     fp32-accumulated), in issue order:
 *       S^T  = K_w Q^T          wgmma SS, m64 (keys) n64 (queries); d64: RS,
 *       dP^T = V_w dO^T         K_w and V_w held in registers
 *       LSE, D                  ld.shared under those two GEMMs
 *       P^T  = exp2(S^T scale log2 e - LSE log2 e)      (masked: 0)
 *       dV  += P^T dO           wgmma RS: P^T is its own A fragment (the
 *                               accumulator and A layouts coincide); its
 *                               issue needs every exponential, so the dP^T
 *                               wait below stays under them
 *       dS^T = P^T (dP^T - D),  D = rowsum(dO O) (the preprocess)
 *       dS^T -> shared memory (16-bit, stmatrix), BAR_DS, then
 *       dQ   = dS K             wgmma SS with both operands MN-major: each
 *                               consumer DQ_N = D / 2 of dQ's columns over
 *                               all 128 keys (both halves of dS)
 *       dK  += dS^T Q           wgmma RS
 *       dQ (fp32) -> shared memory -> the writer, while dK runs.
 * dK is scaled by softmax_scale at the end, dQ by the postprocess.  Causal
 * grids run longest-first in L2-sized head groups (bwd_scheduler.cuh).
 *
 * Head dim 256 (BwdCfg::SPLIT_D): dK and dV of 64 keys x 256 columns in fp32
 * are 256 registers a thread, over the 240 a consumer has, so the head dim is
 * split instead of the keys (as FA3 does at d256): BN = 64 keys a CTA, and
 * both consumers work on the same 64 keys, consumer w on columns 128 w ..
 * 128 w + 127 of dK, dV and dQ (64 registers each).  Per iteration:
 *   consumer 0: S^T = K Q^T (SS, k = 256), P^T as above, P^T in fp32 to
 *     shared memory in its own fragment order (16 KB, float4 per thread and
 *     register group: conflict-free), named barrier BAR_P (arrive);
 *   consumer 1: dP^T = V dO^T, BAR_P (sync), P^T read back in fp32 (so dS^T
 *     = P^T (dP^T - D) is computed exactly as at d64/d128 and both consumers
 *     round P^T to 16 bits identically), dS^T (16-bit) -> shared memory;
 *   both: dV_w += P^T dO_w (RS, P^T packed from fp32 as at d128; B MN-major,
 *     the stage's slabs 2 w, 2 w + 1, LBO = BM * 128), BAR_DS (both sync),
 *     dK_w += dS^T Q_w (SS, A = dS^T K-major [key][query]) and dQ_w = dS K_w
 *     (SS, both MN-major, K's slabs 2 w, 2 w + 1, LBO = BN * 128).
 * Shared memory has no room for a separate 64 KB dQ tile next to two Q/dO
 * stages (K, V 64 KB + stages 128 KB), so the dQ tile goes into the Q/dO
 * stage it was computed from (Q(s) and dO(s) are adjacent: 64 KB, the tile's
 * size): both consumers meet at BAR_FREE once their GEMMs have read the stage,
 * store their halves of the tile, and hand it to the writer (BAR_DQ_FULL + s);
 * the writer, not the consumers, gives the stage back to the producer
 * (empty_qdo[s], one arrival) once its reduce-add has read it.
 *
 * The kernel is the wiring of its roles: bwd_traits.cuh (parameters,
 * options, tile sizes, shared memory), bwd_scheduler.cuh (which tile a CTA
 * does, the grid), bwd_producer.cuh (loads; the dQ writer),
 * bwd_mainloop.cuh (the consumers, d64/d128), bwd_mainloop_split_d.cuh
 * (d256), bwd_epilogue.cuh (dK, dV out), bwd_prepost.cuh (D and the LSE
 * before, dQ after); bwd_sm90_launch.cuh is the host side. */
#pragma once
#include "bwd_mainloop_split_d.cuh"
#include "bwd_producer.cuh"

/* The kernel's work for key block n of kv head hk, batch entry b: p holds
 * the tile's sequence lengths (VARLEN: its own copy, bwd_sm90_kernel), sq
 * where the sequence lies in the packed tensors and the workspace. */
template <class C>
__device__ __forceinline__ void bwd_sm90_body(const CUtensorMap &tm_q, const CUtensorMap &tm_k, const CUtensorMap &tm_v,
                                              const CUtensorMap &tm_do, const CUtensorMap &tm_stats,
                                              const BwdParams &p, const BwdSeq &sq, int n, int hk, int b) {
    constexpr int STAGES = C::STAGES;
    extern __shared__ uint8_t smem_raw[];
    const BwdSmem<C> sm(smem_raw);
    /* VARLEN: packed rows (batch coordinate 0) from the sequence's first */
    const int qrow0 = C::VARLEN ? sq.q0 : 0, krow0 = C::VARLEN ? sq.k0 : 0, bc = C::VARLEN ? 0 : b;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = threadIdx.x / 128;
    const BwdIter<C> iter(p, n);
    const int T = iter.total;
    if (threadIdx.x == 0) {
        mbar_init(sm.full_kv, 1);
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(&sm.full_qdo[s], 1);
            mbar_init(&sm.empty_qdo[s], C::EMPTY_ARRIVALS); /* each consumer warp; SPLIT_D: the writer */
        }
        ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
    }
    __syncthreads();

    if (wg == 0) {
        regs_dealloc<C::REGS_PRODUCER>();
        if (warp == 0 && lane == 0 && T > 0)
            bwd_producer<C>(sm, tm_q, tm_k, tm_v, tm_do, tm_stats, p, sq, iter, n, hk, b, qrow0, krow0, bc);
        else if (warp == 1 && T > 0)
            bwd_dq_writer<C>(sm, p, sq, iter, n, hk, b, lane);
        return;
    }
    regs_alloc<C::REGS_CONSUMER>();
    if constexpr (C::SPLIT_D) {
        bwd_consumer_split_d<C>(sm, p, iter, n, hk, b, sq);
    } else {
        bwd_consumer<C>(sm, p, iter, n, hk, b, sq);
    }
}

template <class C>
__global__ void __launch_bounds__(C::THREADS, 1)
    bwd_sm90_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                    const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                    const __grid_constant__ CUtensorMap tm_stats, const __grid_constant__ BwdParams p) {
    int n, hk, b;
    bwd_tile_coords<C>(p, n, hk, b);
    if constexpr (C::VARLEN) {
        /* the grid covers the longest sequence: a key block past this one's
         * used keys has nothing to do (its dK, dV rows are another
         * sequence's, or past seqused_k: not written) */
        BwdSeq sq;
        int lq, lk;
        varlen_rows(p.cu_q, b, p.total_q, p.seqlen_q, sq.q0, lq);
        varlen_rows(p.cu_k, b, p.total_k, p.seqlen_k, sq.k0, lk);
        varlen_used(p.seqused_q, b, lq);
        varlen_used(p.seqused_k, b, lk);
        if (n * C::BN >= lk) return;
        sq.rb = bwd_varlen_rb(sq.q0, b);
        BwdParams ps = p;
        ps.seqlen_q = lq, ps.seqlen_k = lk, ps.causal_offset = lk - lq, ps.m_blocks = (lq + C::BM - 1) / C::BM;
        bwd_sm90_body<C>(tm_q, tm_k, tm_v, tm_do, tm_stats, ps, sq, n, hk, b);
    } else {
        bwd_sm90_body<C>(tm_q, tm_k, tm_v, tm_do, tm_stats, p, BwdSeq{0, 0, 0}, n, hk, b);
    }
}
