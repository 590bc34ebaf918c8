/* fwd_sm90.cuh - Hopper (sm_90a) 16-bit attention forward, FlashAttention-3
 * style: the kernel is the wiring of its roles.
 *   fwd_traits.cuh     FwdOpts (named options) -> FwdCfg (tile, layout, registers)
 *   fwd_params.cuh     runtime parameters (FwdParams, FwdSplit)
 *   fwd_pipeline.cuh   shared memory: the K/V ring and the Q slots, their barriers
 *   fwd_scheduler.cuh  tile order (static, causal longest-first, split) and decode
 *   fwd_producer.cuh   warpgroup 0: scheduler, Q hand-over, K/V loads by TMA
 *   fwd_gather.cuh     KVCACHE on small pages: warps 1-3 of warpgroup 0
 *                      gather K/V rows by cp.async
 *   fwd_mainloop.cuh   warpgroups 1..NC: QK^T, softmax, PV (overlap, pingpong)
 *   fwd_softmax.cuh    mask and online softmax
 *   fwd_epilogue.cuh   O / l and LSE (registers or TMA), empty tiles, split merge
 *   fwd_transpose.cuh  FP8: warps 1-3 of warpgroup 0 transpose V in shared memory
 * One persistent CTA per SM; the producer gives registers away and one of
 * its threads works, the consumers take them (setmaxnreg).  CLUSTER 2 (d256
 * non-causal): CTA pairs on adjacent query blocks of one head share each K/V
 * load through TMA multicast.  Shared tiles use the 128-byte swizzle: a
 * head_dim-D tile is ceil(D/64) slabs of rows x 64 elements (128 bytes per
 * row), each written by one TMA box (at D 96 the last box half zeros). */
#pragma once
#include "fwd_mainloop.cuh"
#include "fwd_gather.cuh"
#include "fwd_producer.cuh"
#include "fwd_transpose.cuh"
#include "fwd_traits.cuh"

/* The kernel's body; sp: the FwdSplit parameter with SPLIT (the kernels
 * without SPLIT keep the parameter list they had: an empty struct after
 * FwdParams moved the d256 CTA-pair kernel's key-block loop from 656 to 669
 * SASS instructions). */
template <class C, class SP>
__device__ __forceinline__ void fwd_sm90_body(const CUtensorMap &tm_q, const CUtensorMap &tm_k,
                                              const CUtensorMap &tm_v, const FwdParams p, const SP &sp,
                                              const CUtensorMap *tm_o /* OTMA only */,
                                              const FwdFp8 *f8 /* FP8 only */,
                                              const FwdVarlen *vl = nullptr /* VARLEN only */,
                                              const FwdLocal *loc = nullptr /* LOCAL only */,
                                              const FwdPaged *pg = nullptr /* KVCACHE only */) {
    extern __shared__ uint8_t smem_raw[];
    const FwdSmem<C> sm(smem_raw);
    const int warpgroup = threadIdx.x / 128;
    const int tid = threadIdx.x % 128;
    const int warp = tid / 32, lane = tid % 32;

    if (threadIdx.x == 0) {
        if constexpr (C::KVCACHE) sm.init_barriers(pg->kv_box == 0 ? FWD_GATHER_THREADS : 1);
        else sm.init_barriers();
    }
    /* with a cluster, the peer's barriers must be initialised before this
     * CTA multicasts into its shared memory or arrives on them */
    if (C::CLUSTER > 1) cluster_sync_all();
    else __syncthreads();
    const uint32_t cta_rank = C::CLUSTER > 1 ? cluster_ctarank() : 0;
    /* Programmatic dependent launch: the set-up above may overlap the tail of
     * the previous kernel in the stream; nothing below touches global memory
     * before that kernel has finished.  The next kernel may be scheduled as
     * soon as this one's CTAs leave SMs (it waits the same way). */
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

    if (warpgroup == 0) {
        regs_dealloc<C::REGS_PRODUCER>();
        if constexpr (C::FP8) {
            if (warp >= 1) {
                const FwdTransposer<C> tr{sm, warp - 1, lane};
                tr.run();
                return;
            }
        }
        if constexpr (C::VARLEN && C::CAUSAL) fwd_varlen_order<C>(sm, p, vl, tid);
        if constexpr (C::KVCACHE) {
            if (warp >= 1 && pg->kv_box == 0) {
                const FwdGather<C> ga{sm, *vl, *pg, tid - 32};
                ga.run();
                return;
            }
        }
        /* one working thread: warp 0, lane 0; a CTA leaves only when its
         * peer is done with its shared memory */
        if (threadIdx.x != 0) {
            if (C::CLUSTER > 1) cluster_sync_all();
            return;
        }
        const FwdScheduler<C, SP> sched{p, sp, cta_rank};
        FwdProducer<C, SP> prod{tm_q, tm_k, tm_v, p, sm, cta_rank, vl, loc, pg};
        prod.run(sched);
        if (C::CLUSTER > 1) cluster_sync_all();
        return;
    }

    regs_alloc<C::REGS_CONSUMER>();
    /* SITOUT: the warpgroup index through a lane-0 shuffle, which the
     * compiler knows to be warp-uniform: from threadIdx, the sit-out branch
     * looked divergent and the key-block loop's stage counter and
     * descriptors left the uniform datapath (d64: 611 -> 644 SASS
     * instructions per block).  Without SITOUT the shuffle moves other
     * kernels' loops by -32..+13 instructions: kept out of them. */
    const int wg = C::SITOUT ? __shfl_sync(0xffffffffu, warpgroup - 1, 0) : warpgroup - 1;
    const int r0 = 16 * warp + lane / 4; /* accumulator rows r0 and r0 + 8 (HOPPER-PTX §3) */
    const int q4 = lane % 4;
    FwdEpilogue<C, SP> epi{p, sp, tm_o, sm.base, wg, warp, lane, tid, r0, q4, p.scale_log2};
    if constexpr (C::VARLEN) epi.vtotal = vl->total_q;
    epi.loc = loc;
    FwdConsumer<C, SP> cons{p,  sp,       sm,           epi,    wg,
                            warp, lane, r0, q4, cta_rank, p.scale_log2, 8 + wg, 8 + (wg + 1) % C::NC, f8, vl, loc};
    if constexpr (C::KVCACHE) cons.pg = pg;
    cons.run();
    if (C::CLUSTER > 1) cluster_sync_all();
}

template <class C>
__global__ void __launch_bounds__(C::THREADS, 1)
    fwd_sm90_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                    const __grid_constant__ CUtensorMap tm_v, const FwdParams p) {
    fwd_sm90_body<C>(tm_q, tm_k, tm_v, p, FwdNoSplit(), nullptr, nullptr);
}

/* FP8: the scales after FwdParams */
template <class C>
__global__ void __launch_bounds__(C::THREADS, 1)
    fwd_sm90_fp8_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                        const __grid_constant__ CUtensorMap tm_v, const FwdParams p,
                        const __grid_constant__ FwdFp8 f8) {
    fwd_sm90_body<C>(tm_q, tm_k, tm_v, p, FwdNoSplit(), nullptr, &f8);
}

template <class C>
__global__ void __launch_bounds__(C::THREADS, 1)
    fwd_sm90_split_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                          const __grid_constant__ CUtensorMap tm_v, const FwdParams p,
                          const __grid_constant__ FwdSplit sp) {
    fwd_sm90_body<C>(tm_q, tm_k, tm_v, p, sp, nullptr, nullptr);
}

/* OTMA: the same kernels with O's tensor map (box 64 x 16) */
template <class C>
__global__ void __launch_bounds__(C::THREADS, 1)
    fwd_sm90_kernel_o(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                      const __grid_constant__ CUtensorMap tm_v, const FwdParams p,
                      const __grid_constant__ CUtensorMap tm_o) {
    fwd_sm90_body<C>(tm_q, tm_k, tm_v, p, FwdNoSplit(), &tm_o, nullptr);
}

template <class C>
__global__ void __launch_bounds__(C::THREADS, 1)
    fwd_sm90_split_kernel_o(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                            const __grid_constant__ CUtensorMap tm_v, const FwdParams p,
                            const __grid_constant__ FwdSplit sp, const __grid_constant__ CUtensorMap tm_o) {
    fwd_sm90_body<C>(tm_q, tm_k, tm_v, p, sp, &tm_o, nullptr);
}

/* VARLEN: the packed tensors' sequences after FwdParams */
template <class C>
__global__ void __launch_bounds__(C::THREADS, 1)
    fwd_sm90_varlen_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                           const __grid_constant__ CUtensorMap tm_v, const FwdParams p,
                           const __grid_constant__ FwdVarlen vl) {
    fwd_sm90_body<C>(tm_q, tm_k, tm_v, p, FwdNoSplit(), nullptr, nullptr, &vl);
}

/* KVCACHE (varlen queries on a KV cache): one signature for the plain and
 * the LOCAL instances, with the page pool's FwdPaged (a kernel of their
 * own, so that the other varlen and LOCAL kernels keep their parameter
 * layout) */
template <class C>
__global__ void __launch_bounds__(C::THREADS, 1)
    fwd_sm90_kvcache_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                            const __grid_constant__ CUtensorMap tm_v, const FwdParams p,
                            const __grid_constant__ FwdVarlen vl, const __grid_constant__ FwdPaged pg,
                            const __grid_constant__ FwdLocal loc) {
    fwd_sm90_body<C>(tm_q, tm_k, tm_v, p, FwdNoSplit(), nullptr, nullptr, &vl, C::LOCAL ? &loc : nullptr, &pg);
}

/* LOCAL (the variants: window, softcap, sinks): one signature for every
 * such instance, fixed-length or VARLEN, 16-bit or FP8, with or without
 * OTMA: the parameter blocks an instance does not use are passed and not
 * read (the plain kernels above keep their own parameter lists) */
template <class C>
__global__ void __launch_bounds__(C::THREADS, 1)
    fwd_sm90_local_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                          const __grid_constant__ CUtensorMap tm_v, const FwdParams p,
                          const __grid_constant__ FwdLocal loc, const __grid_constant__ FwdVarlen vl,
                          const __grid_constant__ FwdFp8 f8, const __grid_constant__ CUtensorMap tm_o) {
    fwd_sm90_body<C>(tm_q, tm_k, tm_v, p, FwdNoSplit(), C::OTMA ? &tm_o : nullptr, C::FP8 ? &f8 : nullptr,
                     C::VARLEN ? &vl : nullptr, &loc);
}
