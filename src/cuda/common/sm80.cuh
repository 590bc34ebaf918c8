/* sm80.cuh - the warp-level instructions every GPU from sm_80 on has, each a
 * few lines of inline PTX: the shared-memory address of a pointer, cp.async
 * (copy, commit, wait, mbarrier arrival), ldmatrix (plain and .trans) and mma.sync m16n8k16 with fp32
 * accumulators.  The Hopper kernels (ptx.cuh includes it), the portable
 * engine (../portable/mma_sm80.cuh) and the quantiser share them; nothing
 * here needs more than compute_80. */
#pragma once
#include <stdint.h>

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* ---- cp.async ------------------------------------------------------------- */
/* 16 bytes from global `src` to shared `dst`; valid false reads nothing and
 * writes 16 zero bytes (src-size 0), so rows past a sequence's end are zeros
 * in shared memory: no NaN left in a buffer by an earlier block can reach a
 * product through P = 0 (0 x NaN).  src must still be a valid address. */
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void *src, bool valid) {
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
/* 4 bytes, the same way (valid false: 4 zero bytes) */
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void *src, bool valid) {
    const int n = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* Wait until at most N of this thread's committed groups are pending. */
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
/* ... and for all of its cp.async, committed or not */
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
/* An arrival on the mbarrier at `bar` once every cp.async this thread has
 * issued so far has landed (.noinc: it is one of the arrivals the barrier
 * was initialised to count).  The data is written through the generic
 * proxy: a reader through the async proxy (wgmma) needs a
 * fence.proxy.async after its wait. */
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(uint64_t *bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

/* ---- ldmatrix ------------------------------------------------------------ */
/* Four 8x8 b16 matrices; lane l gives the shared address of row l % 8 of
 * matrix l / 8, and receives in r[j] the pair of matrix j at (row lane / 4,
 * columns 2 (lane % 4), +1): for a 16x16 tile loaded as (rows 0-7, k 0-7),
 * (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15) that is the
 * A fragment of a wgmma (HOPPER-PTX §3). */
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

/* The same with .trans: r[j] holds matrix j's elements (row 2 (lane % 4),
 * column lane / 4) in its low half and (row 2 (lane % 4) + 1, same column)
 * in its high half. */
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

/* ---- mma.sync (warp-level tensor cores, for tiles below wgmma's 64 rows) -- */
/* d += a b: m16n8k16, a row-major 16x16 (4 regs of b16 pairs: (row g, k 2t),
 * (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8) with g = lane / 4, t = lane % 4),
 * b 16x8 "col" (b0: k 2t, 2t + 1 of column g; b1: k + 8), d fp32 (rows g and
 * g + 8, columns 2t, 2t + 1). */
template <bool BF16>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if (BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
