/* mma_sm80.cuh - what the portable engine adds to ../common/sm80.cuh (the
 * ldmatrix, mma.sync and cp.async group wrappers it shares with the Hopper
 * kernels): the zero-filling 16-byte cp.async, the 16-bit packing of an
 * accumulator pair and the approximate exp2.  Everything compiles for
 * compute_80 (unlike ../common/ptx.cuh, which carries wgmma and TMA). */
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "../common/sm80.cuh"

namespace sm80 {

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

/* tanh by the MUFU (relative error <= 2^-11; sm_75 on): the softcap's, as
 * the Hopper kernels' */
__device__ __forceinline__ float tanh_approx(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

} // namespace sm80
