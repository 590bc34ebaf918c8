/* ptx.cuh - the Hopper instructions <cuda/ptx> does not wrap, each a few
 * lines of inline PTX (see ../shared/HOPPER-PTX.md for the sources), plus thin
 * named helpers over <cuda/ptx> for TMA and mbarriers so kernel code reads as
 * a sequence of tile operations. */
#pragma once
#include <stdint.h>
#include <cuda.h>
#include <cuda/ptx>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "sm80.cuh" /* smem_u32, ldmatrix, mma.sync */
#include "wgmma_gen.cuh"

namespace ptx = cuda::ptx;

/* ---- register reallocation (setmaxnreg) --------------------------------- */
template <int N> __device__ __forceinline__ void regs_dealloc() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void regs_alloc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

/* ---- named barriers (bar.sync / bar.arrive) ----------------------------- */
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/* ---- shared-memory words (explicit .shared: a generic access to a
 * computed shared pointer compiles to a slower generic ST/LD) ------------- */
__device__ __forceinline__ void st_shared_s32(void *p, int v) {
    asm volatile("st.shared.s32 [%0], %1;\n" ::"r"(smem_u32(p)), "r"(v) : "memory");
}
__device__ __forceinline__ int ld_shared_s32(const void *p) {
    int v;
    asm volatile("ld.shared.s32 %0, [%1];\n" : "=r"(v) : "r"(smem_u32(p)) : "memory");
    return v;
}

/* four words at a 16-byte aligned shared address */
__device__ __forceinline__ void st_shared_s32x4(void *p, int a, int b, int c, int d) {
    asm volatile("st.shared.v4.s32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_u32(p)), "r"(a), "r"(b), "r"(c), "r"(d)
                 : "memory");
}
__device__ __forceinline__ int4 ld_shared_s32x4(const void *p) {
    int4 v;
    asm volatile("ld.shared.v4.s32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(smem_u32(p))
                 : "memory");
    return v;
}

/* ---- wgmma bookkeeping --------------------------------------------------- */
/* wgmma.fence: order register accesses to accumulators / A fragments before a
 * following wgmma that uses them. */
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Scheduling fence for ptxas: ends the basic block with a branch that
 * depends on x.  ptxas schedules within a block and moves a
 * wgmma.wait_group freely above math it does not depend on, so without a
 * block boundary it hoisted the wait for the PV GEMM above the softmax meant
 * to run under it (v8).  x is a float result; 0xFFFFFFFF is a
 * NaN pattern GPU arithmetic never produces (its NaN is 0x7FFFFFFF), and the
 * branch, were it ever taken, only sleeps 0 ns. */
__device__ __forceinline__ void sched_fence(uint32_t x) {
    if (x == 0xFFFFFFFFu) __nanosleep(0);
}
/* Compiler-level fence on an accumulator array: keeps the compiler from
 * moving reads/writes of these registers across an async wgmma window. */
template <int N> __device__ __forceinline__ void reg_fence(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N> __device__ __forceinline__ void reg_fence(uint32_t (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

/* Shared-memory matrix descriptor, 128-byte swizzle (HOPPER-PTX §2).
 * lbo/sbo in bytes.  Tiles must sit on 1024-byte boundaries (base offset 0). */
__device__ __forceinline__ uint64_t smem_desc_sw128(const void *p, uint32_t lbo, uint32_t sbo) {
    uint64_t d = 0;
    d |= (uint64_t)((smem_u32(p) & 0x3FFFF) >> 4);
    d |= (uint64_t)((lbo >> 4) & 0x3FFF) << 16;
    d |= (uint64_t)((sbo >> 4) & 0x3FFF) << 32;
    d |= (uint64_t)1 << 62; /* 128B swizzle */
    return d;
}
/* The same for a K-major tile whose rows are SW = 128 or 64 bytes wide (the
 * 128- or 64-byte swizzle: layout type 1 or 2, SBO = 8 rows); 64-byte rows
 * are the FP8 head-dim-64 tiles, whose atoms sit on 512-byte boundaries. */
template <int SW>
__device__ __forceinline__ uint64_t smem_desc_kmajor(const void *p) {
    static_assert(SW == 128 || SW == 64, "swizzle span");
    uint64_t d = 0;
    d |= (uint64_t)((smem_u32(p) & 0x3FFFF) >> 4);
    d |= (uint64_t)1 << 16; /* LBO: unused by swizzled K-major tiles */
    d |= (uint64_t)(((8 * SW) >> 4) & 0x3FFF) << 32;
    d |= (uint64_t)(SW == 128 ? 1 : 2) << 62;
    return d;
}
/* Advance a descriptor's start address by `bytes` (multiple of 16). */
__device__ __forceinline__ uint64_t desc_add(uint64_t d, uint32_t bytes) { return d + (uint64_t)(bytes >> 4); }

/* ---- mbarriers (via <cuda/ptx>) ------------------------------------------ */
__device__ __forceinline__ void mbar_init(uint64_t *bar, uint32_t count) { ptx::mbarrier_init(bar, count); }
__device__ __forceinline__ void mbar_expect_tx_arrive(uint64_t *bar, uint32_t bytes) {
    (void)ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, bar, bytes);
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) { (void)ptx::mbarrier_arrive(bar); }
/* Wait until the phase of parity `parity` has completed.  SLEEP passes
 * try_wait a suspend-time hint (10 ms, CUTLASS's value): ptxas then emits
 * TRYWAIT, NANOSLEEP.SYNCS (the warp sleeps until an mbarrier of the CTA
 * completes a phase, or the time runs out) and a re-check.  Without the hint
 * the wait is a loop of TRYWAIT and a branch that keeps issuing while it
 * waits.  Which is faster depends on the kernel (v16, v20): the
 * loop is the default, the forward kernels choose per instance (FwdCfg SLEEP). */
constexpr uint32_t MBAR_SUSPEND_NS = 0x989680u;
template <bool SLEEP = false> __device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
    if (SLEEP) {
        uint32_t ok;
        do {
            asm volatile(
                "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n"
                " selp.u32 %0, 1, 0, p;\n}\n"
                : "=r"(ok)
                : "r"(smem_u32(bar)), "r"(parity), "r"(MBAR_SUSPEND_NS)
                : "memory");
        } while (!ok);
    } else {
        while (!ptx::mbarrier_try_wait_parity(bar, parity)) {
        }
    }
}

/* ---- clusters ------------------------------------------------------------ */
__device__ __forceinline__ uint32_t cluster_ctarank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
/* Arrive on the mbarrier at `bar`'s offset in CTA `rank` of the cluster. */
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t *bar, uint32_t rank) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(smem_u32(bar)), "r"(rank));
    /* default .release.cta, as CUTLASS's ClusterBarrier::arrive: the caller's
     * reads of the stage (wgmma, waited for) are complete; .release.cluster
     * would put a MEMBAR.ALL.GPU in front of every release */
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}
/* Wait for a phase whose arrivals may come from other CTAs of the cluster. */
template <bool SLEEP = false> __device__ __forceinline__ void mbar_wait_cluster(uint64_t *bar, uint32_t parity) {
    uint32_t ok;
    do {
        if (SLEEP)
            asm volatile(
                "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2, %3;\n"
                " selp.u32 %0, 1, 0, p;\n}\n"
                : "=r"(ok)
                : "r"(smem_u32(bar)), "r"(parity), "r"(MBAR_SUSPEND_NS)
                : "memory");
        else
            asm volatile(
                "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
                " selp.u32 %0, 1, 0, p;\n}\n"
                : "=r"(ok)
                : "r"(smem_u32(bar)), "r"(parity)
                : "memory");
    } while (!ok);
}
/* Every thread of every CTA of the cluster (not .aligned: callers may be
 * divergent). */
__device__ __forceinline__ void cluster_sync_all() {
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

/* ---- TMA (via <cuda/ptx>) ------------------------------------------------ */
/* 4-D tiled load [d, seq, head, batch] -> shared, completing on `bar`. */
__device__ __forceinline__ void tma_load_4d(void *dst, const CUtensorMap *map, int c0, int c1, int c2, int c3,
                                            uint64_t *bar) {
    const int32_t coords[4] = {c0, c1, c2, c3};
    ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, dst, map, coords, bar);
}
/* The same load, written into shared memory at the same offset in every CTA
 * of the cluster named by cta_mask, each of whose mbarrier at `bar`'s offset
 * gets the bytes that land there (HOPPER-PTX §4). */
__device__ __forceinline__ void tma_load_4d_multicast(void *dst, const CUtensorMap *map, int c0, int c1, int c2,
                                                      int c3, uint64_t *bar, uint16_t cta_mask) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(smem_u32(dst)),
        "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar)), "h"(cta_mask)
        : "memory");
}
/* L2 eviction priority of a load (HOPPER-PTX §4; createpolicy): a 64-bit
 * cache policy for the .L2::cache_hint forms below.  FA3 loads K and V with
 * evict_last (CUTLASS's CacheHintSm90::EVICT_LAST). */
__device__ __forceinline__ uint64_t l2_policy_evict_last() {
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(pol));
    return pol;
}
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
    return pol;
}
/* tma_load_4d and tma_load_4d_multicast with an L2 cache policy */
__device__ __forceinline__ void tma_load_4d_hint(void *dst, const CUtensorMap *map, int c0, int c1, int c2, int c3,
                                                 uint64_t *bar, uint64_t policy) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(smem_u32(dst)),
        "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar)), "l"(policy)
        : "memory");
}
__device__ __forceinline__ void tma_load_4d_multicast_hint(void *dst, const CUtensorMap *map, int c0, int c1, int c2,
                                                           int c3, uint64_t *bar, uint16_t cta_mask, uint64_t policy) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster.L2::cache_hint"
        " [%0], [%1, {%2, %3, %4, %5}], [%6], %7, %8;\n" ::"r"(smem_u32(dst)),
        "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar)), "h"(cta_mask), "l"(policy)
        : "memory");
}
/* Pull the box at these coordinates into L2 only (no shared memory, no
 * mbarrier): a hint that a later tma_load_4d of it will hit L2. */
__device__ __forceinline__ void tma_prefetch_l2_4d(const CUtensorMap *map, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];\n" ::"l"(map), "r"(c0),
                 "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}
__device__ __forceinline__ void tma_prefetch_desc(const CUtensorMap *map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}
/* ---- TMA store (bulk-group completion; HOPPER-PTX §4) --------------------- */
/* 4-D tiled store shared -> global [d, seq, head, batch]: elements outside
 * the tensor's bounds are not written.  Completes in this thread's bulk
 * async-group (commit, then wait). */
__device__ __forceinline__ void tma_store_4d(const CUtensorMap *map, const void *src, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(map),
                 "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/* this thread's committed bulk groups have finished reading shared memory */
__device__ __forceinline__ void bulk_wait_read_all() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
/* ... and finished altogether (their writes performed) */
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
/* Four 8x8 b16 matrices from registers to shared memory: register j of each
 * lane holds row lane / 4, columns 2 (lane % 4), +1 of matrix j (the wgmma
 * accumulator's layout); lanes 8j .. 8j + 7 give the 16-byte row addresses
 * of matrix j. */
__device__ __forceinline__ void stsm_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
                 "r"(r2), "r"(r3)
                 : "memory");
}
/* Make generic-proxy shared-memory writes visible to the async proxy
 * (wgmma operand reads, TMA stores). */
__device__ __forceinline__ void fence_async_shared() { ptx::fence_proxy_async(ptx::space_shared); }

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* Two e4m3 codes (lo in the low byte) to f16x2, lo in the low half: exact
 * (every e4m3 value is an f16) */
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two) {
    uint32_t h;
    asm("{\n .reg .b16 c;\n cvt.u16.u32 c, %1;\n cvt.rn.f16x2.e4m3x2 %0, c;\n}" : "=r"(h) : "r"(two));
    return h;
}
/* Four e4m3 codes to two f16x2: bytes 0, 1 to lo, bytes 2, 3 to hi (exact) */
__device__ __forceinline__ void e4m3x4_to_f16x2x2(uint32_t four, uint32_t &lo, uint32_t &hi) {
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}"
        : "=r"(lo), "=r"(hi)
        : "r"(four));
}
__device__ __forceinline__ float2 f16x2_to_f32x2(uint32_t h) {
    float2 f;
    asm("{\n .reg .f16 l, u;\n mov.b32 {l, u}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, u;\n}"
        : "=f"(f.x), "=f"(f.y)
        : "r"(h));
    return f;
}
/* An FP8 cache's 8 codes (one 16-byte chunk of a 16-bit row) times their
 * scale, rounded once to bf16 or f16 (the paged prefill's gather) */
template <bool BF16>
__device__ __forceinline__ uint4 kv8_dequant8(uint2 w, float scale) {
    const uint32_t c[4] = {w.x & 0xFFFFu, w.x >> 16, w.y & 0xFFFFu, w.y >> 16};
    uint32_t r[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 f = f16x2_to_f32x2(e4m3x2_to_f16x2(c[i]));
        r[i] = BF16 ? pack_bf16x2(f.x * scale, f.y * scale) : pack_f16x2(f.x * scale, f.y * scale);
    }
    return make_uint4(r[0], r[1], r[2], r[3]);
}
/* 16 bytes at a 16-byte aligned shared address */
__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint4 v) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

/* Four floats to four e4m3 codes (saturating, round to nearest even), a0 in
 * the lowest byte: cvt.rn.satfinite.e4m3x2 puts its first source in the
 * upper byte, so each pair goes in high-first. */
__device__ __forceinline__ uint32_t pack_e4m3x4(float a0, float a1, float a2, float a3) {
    uint32_t r;
    asm("{\n .reg .b16 lo, hi;\n cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
        " mov.b32 %0, {lo, hi};\n}\n"
        : "=r"(r)
        : "f"(a0), "f"(a1), "f"(a2), "f"(a3));
    return r;
}

/* ---- the backward's bulk reduce, semaphores and shared-memory vectors ---- */
/* dst += src (fp32, `bytes` of them), from shared to global memory, in the
 * thread's bulk group */
__device__ __forceinline__ void bulk_reduce_add_f32(float *dst, const void *src, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                 "r"(smem_u32(src)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ int ld_acquire_gpu(const int *p) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_shared_u32(void *p, uint32_t v) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(smem_u32(p)), "r"(v) : "memory");
}

__device__ __forceinline__ void st_shared_f32x4(void *p, float4 v) {
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_u32(p)), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                 : "memory");
}
/* volatile, no memory clobber: stays where it is among the wgmma issues and
 * waits (what it reads landed before the stage's mbarrier wait) */
__device__ __forceinline__ float2 ld_shared_f32x2(const void *p) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(smem_u32(p)));
    return v;
}
__device__ __forceinline__ float ld_shared_f32(const void *p) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(smem_u32(p)));
    return v;
}
/* 16 and 8 bytes at a shared address (as ld_shared_f32x2: volatile, no clobber) */
__device__ __forceinline__ uint4 ld_shared_b32x4(uint32_t addr) {
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}
__device__ __forceinline__ uint2 ld_shared_b32x2(uint32_t addr) {
    uint2 v;
    asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
    return v;
}
__device__ __forceinline__ float4 ld_shared_f32x4(const void *p) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(smem_u32(p))
                 : "memory");
    return v;
}
