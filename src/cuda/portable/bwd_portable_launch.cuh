/* bwd_portable_launch.cuh - launches bwd_portable_kernel for head dim D: the
 * ring depth that fits the device's shared memory per block, on the
 * context's stream.  Included by one instance file per head dim. */
#pragma once
#include <cuda_runtime.h>

#include "bwd_portable.cuh"
#include "bwd_portable.h"

template <int D, int NS, bool BF16>
static fattn_status bwd_portable_launch_one(fattn_ctx *ctx, const PortableBwdParams &p, dim3 grid) {
    constexpr int smem = portable_bwd_smem_bytes<D, NS>();
    auto kern = bwd_portable_kernel<D, NS, BF16>;
    cudaError_t e = cudaSuccess;
    if (smem > 48 * 1024) e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fattn_fail(ctx, FATTN_ERROR_CUDA, "portable backward: cudaFuncSetAttribute (%d bytes of shared memory): %s",
                          smem, cudaGetErrorString(e));
    }
    kern<<<grid, PBWD_NW * 32, smem, (cudaStream_t)ctx->stream>>>(p);
    e = cudaGetLastError();
    if (e != cudaSuccess)
        return fattn_fail(ctx, FATTN_ERROR_CUDA, "portable backward kernel launch (head dim %d): %s", D,
                          cudaGetErrorString(e));
    return FATTN_OK;
}

/* The deeper ring where the device's opt-in shared memory per block holds it
 * (A100: 163 KB, H100/H200: 227 KB), else the shallower one (sm_86/89: 99 KB). */
template <int D> static fattn_status bwd_portable_run(fattn_ctx *ctx, const PortableBwdParams &p, bool bf16, dim3 grid) {
    using C = PortableBwdCfg<D>;
    constexpr int NS_SMALL = C::NS_SMALL ? C::NS_SMALL : C::NS; /* unused where 0: refused below */
    const int optin = ((const fattn_cuda_state *)ctx->cuda)->smem_optin;
    const bool deep = portable_bwd_smem_bytes<D, C::NS>() <= optin;
    if (!deep && (!C::NS_SMALL || portable_bwd_smem_bytes<D, NS_SMALL>() > optin))
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "the portable CUDA engine's head dim %d backward needs %d bytes of shared memory per block; "
                          "this GPU allows %d",
                          D, portable_bwd_smem_bytes<D, NS_SMALL>(), optin);
    if constexpr (C::NS_SMALL == 0 || C::NS_SMALL == C::NS) {
        return bf16 ? bwd_portable_launch_one<D, C::NS, true>(ctx, p, grid)
                    : bwd_portable_launch_one<D, C::NS, false>(ctx, p, grid);
    } else {
        if (bf16) return deep ? bwd_portable_launch_one<D, C::NS, true>(ctx, p, grid)
                              : bwd_portable_launch_one<D, C::NS_SMALL, true>(ctx, p, grid);
        return deep ? bwd_portable_launch_one<D, C::NS, false>(ctx, p, grid)
                    : bwd_portable_launch_one<D, C::NS_SMALL, false>(ctx, p, grid);
    }
}
