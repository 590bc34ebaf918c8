/* fwd_portable_launch.cuh - launches fwd_portable_kernel for head dim D: the
 * ring depth that fits the device's shared memory per block, the grid
 * (query tiles, heads_q, batch), the context's stream.  Included by one
 * instance file per head dim. */
#pragma once
#include <cuda_runtime.h>

#include "fwd_portable.cuh"
#include "fwd_portable.h"

template <int D, int NS, bool BF16>
static fattn_status fwd_portable_launch_one(fattn_ctx *ctx, const PortableFwdParams &p, int batch) {
    using C = PortableCfg<D>;
    constexpr int smem = portable_smem_bytes<D, C::NW, C::BN, NS, C::MT>();
    auto kern = fwd_portable_kernel<D, C::NW, C::BN, NS, BF16, C::MT>;
    cudaError_t e = cudaSuccess;
    if (smem > 48 * 1024) e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fattn_fail(ctx, FATTN_ERROR_CUDA, "portable forward: cudaFuncSetAttribute (%d bytes of shared memory): %s",
                          smem, cudaGetErrorString(e));
    }
    constexpr int BM = 16 * C::MT * C::NW;
    const dim3 grid((unsigned)((p.seqlen_q + BM - 1) / BM), (unsigned)p.heads_q, (unsigned)batch);
    kern<<<grid, C::NW * 32, smem, (cudaStream_t)ctx->stream>>>(p);
    e = cudaGetLastError();
    if (e != cudaSuccess)
        return fattn_fail(ctx, FATTN_ERROR_CUDA, "portable forward kernel launch (head dim %d): %s", D,
                          cudaGetErrorString(e));
    return FATTN_OK;
}

/* The deeper ring where the device's opt-in shared memory per block holds it
 * (A100, H100/H200: 163 / 227 KB), else the shallower one (sm_86/89: 99 KB). */
template <int D> static fattn_status fwd_portable_run(fattn_ctx *ctx, const PortableFwdParams &p, bool bf16, int batch) {
    using C = PortableCfg<D>;
    const int optin = ((const fattn_cuda_state *)ctx->cuda)->smem_optin;
    const bool deep = portable_smem_bytes<D, C::NW, C::BN, C::NS, C::MT>() <= optin;
    if (!deep && portable_smem_bytes<D, C::NW, C::BN, C::NS_SMALL, C::MT>() > optin)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "the portable CUDA engine's head dim %d forward needs %d bytes of shared memory per block; "
                          "this GPU allows %d",
                          D, portable_smem_bytes<D, C::NW, C::BN, C::NS_SMALL, C::MT>(), optin);
    if (bf16) return deep ? fwd_portable_launch_one<D, C::NS, true>(ctx, p, batch)
                          : fwd_portable_launch_one<D, C::NS_SMALL, true>(ctx, p, batch);
    return deep ? fwd_portable_launch_one<D, C::NS, false>(ctx, p, batch)
                : fwd_portable_launch_one<D, C::NS_SMALL, false>(ctx, p, batch);
}
