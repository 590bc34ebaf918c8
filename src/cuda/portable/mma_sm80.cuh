/* mma_sm80.cuh - the Ampere instructions the portable engine is built from,
 * each a few lines of inline PTX: cp.async (16-byte global -> shared copies
 * with zero fill), ldmatrix (plain and .trans) and mma.sync m16n8k16 with
 * fp32 accumulators.  Every one exists from sm_80 on, so this header (unlike
 * ../common/ptx.cuh, which carries the Hopper wgmma and TMA wrappers) compiles
 * for compute_80. */
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace sm80 {

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
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* Wait until at most N of this thread's committed groups are pending. */
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* ---- ldmatrix --------------------------------------------------------------- */
/* Four 8x8 b16 matrices; lane l gives the address of row l % 8 of matrix
 * l / 8 and receives in r[j] matrix j's pair at (row lane / 4, columns
 * 2 (lane % 4), +1); .trans: at (rows 2 (lane % 4), +1, column lane / 4). */
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

/* ---- mma.sync m16n8k16 ------------------------------------------------------ */
/* d += a b: a row-major 16x16 (a0 (row g, k 2t), a1 (g + 8, 2t), a2 (g, 2t + 8),
 * a3 (g + 8, 2t + 8); g = lane / 4, t = lane % 4), b 16x8 "col" (b0: k 2t,
 * 2t + 1 of column g; b1: k + 8), d fp32 (d0, d1: row g, columns 2t, 2t + 1;
 * d2, d3: row g + 8). */
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

/* Two fp32 values as one register of 16-bit pairs (lo in the low half): the
 * accumulator pair (row, 2t), (row, 2t + 1) of m16n8k16 becomes the A
 * fragment pair of the next product (the FlashAttention-2 register reuse). */
template <bool BF16> __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    uint32_t r;
    if (BF16) {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        r = *reinterpret_cast<uint32_t *>(&h);
    } else {
        __half2 h = __floats2half2_rn(lo, hi);
        r = *reinterpret_cast<uint32_t *>(&h);
    }
    return r;
}

__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

} // namespace sm80
