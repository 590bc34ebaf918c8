/* fwd_portable_launch.cuh - launches fwd_portable_kernel for head dim D: the
 * CTA width and ring depth that fit the device's shared memory per block,
 * the grid (query tiles, heads_q, batch), the context's stream.  Included by
 * one instance file per head dim. */
#pragma once
#include <cuda_runtime.h>

#include "fwd_portable.cuh"
#include "fwd_portable.h"

template <int D, int NW, int NS, bool BF16>
static fattn_status fwd_portable_launch_one(fattn_ctx *ctx, const PortableFwdParams &p, int batch) {
    using C = PortableCfg<D>;
    constexpr int smem = portable_fwd_smem_bytes<D, NW, NS>();
    auto kern = fwd_portable_kernel<D, NW, C::BN, NS, BF16, C::MT>;
    cudaError_t e = cudaSuccess;
    if (smem > 48 * 1024) e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fattn_fail(ctx, FATTN_ERROR_CUDA, "portable forward: cudaFuncSetAttribute (%d bytes of shared memory): %s",
                          smem, cudaGetErrorString(e));
    }
    constexpr int BM = 16 * C::MT * NW;
    const dim3 grid((unsigned)((p.seqlen_q + BM - 1) / BM), (unsigned)p.heads_q, (unsigned)batch);
    kern<<<grid, NW * 32, smem, (cudaStream_t)ctx->stream>>>(p);
    e = cudaGetLastError();
    if (e != cudaSuccess)
        return fattn_fail(ctx, FATTN_ERROR_CUDA, "portable forward kernel launch (head dim %d): %s", D,
                          cudaGetErrorString(e));
    return FATTN_OK;
}

template <int D, int NW, int NS>
static fattn_status fwd_portable_launch_tile(fattn_ctx *ctx, const PortableFwdParams &p, bool bf16, int batch) {
    return bf16 ? fwd_portable_launch_one<D, NW, NS, true>(ctx, p, batch)
                : fwd_portable_launch_one<D, NW, NS, false>(ctx, p, batch);
}

/* The first tile the device's opt-in shared memory per block holds: NW_BIG
 * warps with the deeper ring (d256 on H100/H200: 227 KB), NW warps with the
 * deeper ring (A100: 163 KB), NW warps with the shallower one (sm_86/89:
 * 99 KB). */
template <int D> static fattn_status fwd_portable_run(fattn_ctx *ctx, const PortableFwdParams &p, bool bf16, int batch) {
    using C = PortableCfg<D>;
    const int optin = ((const fattn_cuda_state *)ctx->cuda)->smem_optin;
    if constexpr (C::NW_BIG > 0) {
        if (portable_fwd_smem_bytes<D, C::NW_BIG, C::NS>() <= optin)
            return fwd_portable_launch_tile<D, C::NW_BIG, C::NS>(ctx, p, bf16, batch);
    }
    if (portable_fwd_smem_bytes<D, C::NW, C::NS>() <= optin)
        return fwd_portable_launch_tile<D, C::NW, C::NS>(ctx, p, bf16, batch);
    constexpr int small = portable_fwd_smem_bytes<D, C::NW, C::NS_SMALL>();
    if (small <= optin) return fwd_portable_launch_tile<D, C::NW, C::NS_SMALL>(ctx, p, bf16, batch);
    return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                      "the portable CUDA engine's head dim %d forward needs %d bytes of shared memory per block; "
                      "this GPU allows %d",
                      D, small, optin);
}
