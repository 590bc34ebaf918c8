/* bwd_portable_launch.cuh - launches bwd_portable_kernel for head dim D: the
 * ring depth that fits the device's shared memory per block, on the
 * context's stream.  Included by one instance file per head dim. */
#pragma once
#include <cuda_runtime.h>

#include "bwd_portable.h"
#include "bwd_portable_rp.cuh"

/* RP: bwd_portable_rp_kernel, else bwd_portable_kernel; grid.x = the key blocks */
template <int D, int NS, bool BF16, bool RP = false>
static fattn_status bwd_portable_launch_one(fattn_ctx *ctx, const PortableBwdParams &p, dim3 grid) {
    constexpr int smem = RP ? portable_bwd_rp_smem_bytes<D, NS>() : portable_bwd_smem_bytes<D, NS>();
    constexpr int BN = RP ? PBWD_RP_BN : PBWD_BN;
    grid.x = (unsigned)((p.seqlen_k + BN - 1) / BN);
    void (*kern)(PortableBwdParams);
    if constexpr (RP) kern = bwd_portable_rp_kernel<D, NS, BF16>;
    else kern = bwd_portable_kernel<D, NS, BF16>;
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

/* The 128-key kernel where the head dim has one and the device's opt-in
 * shared memory per block holds it; else the 64-key kernel's deeper ring
 * where it fits (A100: 163 KB, H100/H200: 227 KB), else its shallower one
 * (sm_86/89: 99 KB).  grid: (-, heads_kv, batch). */
template <int D> static fattn_status bwd_portable_run(fattn_ctx *ctx, const PortableBwdParams &p, bool bf16, dim3 grid) {
    using C = PortableBwdCfg<D>;
    constexpr int NS_SMALL = C::NS_SMALL ? C::NS_SMALL : C::NS; /* unused where 0: refused below */
    constexpr int RP_NS = C::RP_NS ? C::RP_NS : 1;
    const int optin = ((const fattn_cuda_state *)ctx->cuda)->smem_optin;
    if (C::RP_NS && portable_bwd_rp_smem_bytes<D, RP_NS>() <= optin)
        return bf16 ? bwd_portable_launch_one<D, RP_NS, true, C::RP_NS != 0>(ctx, p, grid)
                    : bwd_portable_launch_one<D, RP_NS, false, C::RP_NS != 0>(ctx, p, grid);
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
