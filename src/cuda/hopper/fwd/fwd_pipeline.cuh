/* fwd_pipeline.cuh - the forward's shared memory and its barriers.
 *   K/V ring: STAGES stages of one K and one V block; each has a full
 *     barrier (the producer's TMA bytes landed) and an empty one (every
 *     consumer warp, of both CTAs with a cluster, is done reading it).
 *     Position `it` counts blocks: stage it % STAGES, parity (it / STAGES) & 1.
 *   Q slots: per consumer warpgroup and Q buffer (QBUF, two with QEARLY) a
 *     64-row Q buffer, a full / empty barrier pair and a tile-index slot.  The
 *     producer writes the index, then loads Q (or only arrives); the arrive
 *     on full publishes the index; each consumer thread arrives on empty once
 *     it has read the index and its last QK^T of that tile is done.
 *   FP8: V lands row-major in a ring of its own (VRAW: full_vraw by TMA,
 *     empty_vraw by the transposers); the transposer warps write V^T into
 *     the V stage and arrive on its full barrier (one per warp); the
 *     producer ends them with a plain arrive on full_vraw after writing the
 *     ring position of that arrive into the stage's end flag: one flag per
 *     stage, so that the write comes after every read of the flag the
 *     producer has seen released (empty_vraw) and before the next.
 *   KVCACHE gathered by cp.async (FwdPaged kv_box 0, fwd_gather.cuh): a job
 *     barrier and a job slot per stage, the producer's hand-over of each key
 *     block to the gather warps; full_k and full_v then count the gather
 *     threads' cp.async arrivals instead of the producer's TMA bytes. */
#pragma once
#include "../../common/ptx.cuh"
#include "fwd_traits.cuh"

template <class C>
struct FwdSmem {
    uint8_t *base, *q, *k, *v, *vraw;
    uint64_t *full_k, *empty_k, *full_v, *empty_v;
    uint64_t *full_vraw, *empty_vraw; /* FP8 only */
    int *end_flag;                    /* FP8 only: [STAGES] */
    uint64_t *full_q, *empty_q; /* index w * QBUF + buffer */
    int *tile_slot;             /* st/ld_shared_s32 only */
    int *vkey, *vorder;         /* VARLEN causal: fwd_varlen_order's keys and order */
    uint64_t *job;              /* KVCACHE: [STAGES] */
    int *job_slot;              /* KVCACHE: [STAGES][4], 16-byte aligned */

    __device__ __forceinline__ explicit FwdSmem(uint8_t *smem_raw) {
        base = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
        q = base + C::OFF_Q;
        k = base + C::OFF_K;
        v = base + C::OFF_V;
        vraw = base + C::OFF_VRAW;
        uint64_t *bars = (uint64_t *)(base + C::OFF_BAR);
        full_k = bars;
        empty_k = bars + C::STAGES;
        full_v = bars + 2 * C::STAGES;
        empty_v = bars + 3 * C::STAGES;
        full_q = bars + 4 * C::STAGES;
        empty_q = full_q + C::NC * C::QBUF;
        tile_slot = (int *)(base + C::OFF_SLOT);
        full_vraw = empty_q + C::NC * C::QBUF;
        empty_vraw = full_vraw + C::STAGES;
        end_flag = tile_slot + C::NC * C::QBUF;
        vkey = (int *)(base + C::OFF_ORDER);
        vorder = vkey + FWD_VARLEN_ORDER_MAX;
        if constexpr (C::KVCACHE) {
            job = empty_q + C::NC * C::QBUF;
            job_slot = (int *)(base + C::OFF_JOB);
        }
    }
    /* by one thread, before anyone uses them; kv_arrivals: full_k's and
     * (16-bit) full_v's count, the producer's one arrive.expect_tx, or with
     * the KVCACHE gather one cp.async arrival per gather thread */
    __device__ __forceinline__ void init_barriers(uint32_t kv_arrivals = 1) const {
        for (int s = 0; s < C::STAGES; ++s) {
            mbar_init(&full_k[s], kv_arrivals);
            mbar_init(&full_v[s], C::FP8 ? 3 : kv_arrivals); /* FP8: one arrival per transposer warp */
            /* one arrival per consumer warp, after its wgmma reads are waited for */
            mbar_init(&empty_k[s], 4 * C::NC * C::CLUSTER);
            mbar_init(&empty_v[s], 4 * C::NC * C::CLUSTER);
        }
        if (C::FP8) {
            for (int s = 0; s < C::STAGES; ++s) {
                mbar_init(&full_vraw[s], 1);
                mbar_init(&empty_vraw[s], 3);
            }
            for (int s = 0; s < C::STAGES; ++s) st_shared_s32(&end_flag[s], -1);
        }
        if constexpr (C::KVCACHE)
            for (int s = 0; s < C::STAGES; ++s) mbar_init(&job[s], 1); /* the producer's arrive */
        for (int w = 0; w < C::NC * C::QBUF; ++w) {
            mbar_init(&full_q[w], 1);
            mbar_init(&empty_q[w], 128); /* every consumer thread: it read the tile slot */
        }
        ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
    }
    /* consumer warpgroup w's 64 Q rows in buffer qb (slab c at + c BM SW) */
    __device__ __forceinline__ uint8_t *q_rows(int qb, int w) const { return q + qb * C::Q_BYTES + w * 64 * C::SW; }
    __device__ __forceinline__ uint8_t *k_stage(int s) const { return k + s * C::K_BYTES; }
    __device__ __forceinline__ uint8_t *v_stage(int s) const { return v + s * C::V_BYTES; }
    __device__ __forceinline__ uint8_t *vraw_stage(int s) const { return vraw + s * C::VRAW_BYTES; }
};

__device__ __forceinline__ int ring_stage(int it, int stages) { return it % stages; }
__device__ __forceinline__ uint32_t ring_phase(int it, int stages) { return (it / stages) & 1; }

/* Producer: a K/V stage is free (with a cluster its arrivals come from both CTAs). */
template <class C>
__device__ __forceinline__ void ring_wait_empty(uint64_t *bar, uint32_t parity) {
    if (C::CLUSTER > 1) mbar_wait_cluster<C::SLEEP>(bar, parity);
    else mbar_wait<C::SLEEP>(bar, parity);
}

/* Consumer warp: a K/V stage is released to this CTA's producer and, with a
 * cluster, to the peer's, whose multicast refills it here too. */
template <class C>
__device__ __forceinline__ void ring_release(uint64_t *bar, int lane, uint32_t cta_rank) {
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
    if (C::CLUSTER > 1 && lane == 1) mbar_arrive_cluster(bar, cta_rank ^ 1u);
}

/* Consumer warpgroup wg: wait for its next tile; returns the Q slot qi and
 * the tile index, through a lane-0 shuffle so the compiler knows it is
 * warp-uniform (read straight from shared memory, the stage counters and
 * descriptors derived from it left the uniform datapath: d64 581 -> 610
 * instructions per key block, -8%). */
template <class C>
__device__ __forceinline__ int qslot_receive(const FwdSmem<C> &sm, int wg, int &q_iter, int &qi) {
    qi = wg * C::QBUF + q_iter % C::QBUF;
    mbar_wait<C::SLEEP>(&sm.full_q[qi], (q_iter / C::QBUF) & 1);
    ++q_iter;
    return __shfl_sync(0xffffffffu, ld_shared_s32(&sm.tile_slot[qi]), 0);
}
