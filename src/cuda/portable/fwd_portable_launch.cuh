/* fwd_portable_launch.cuh - launches fwd_portable_kernel (LOCAL:
 * fwd_portable_local_kernel, the variants) for head dim D: the CTA width and
 * ring depth that fit the device's shared memory per block, the grid (query
 * tiles, heads_q, batch), the context's stream.  Included by one instance
 * file per head dim (and per head dim for the variants). */
#pragma once
#include <cuda_runtime.h>

#include "fwd_portable.cuh"
#include "fwd_portable.h"

/* the kernel of a tile (if constexpr: an instance file instantiates only its own) */
template <int D, int NW, int NS, bool BF16, bool LOCAL> static auto fwd_portable_kernel_of() {
    using C = PortableCfg<D>;
    if constexpr (LOCAL) return fwd_portable_local_kernel<D, NW, C::BN, NS, BF16, C::MT>;
    else return fwd_portable_kernel<D, NW, C::BN, NS, BF16, C::MT>;
}

template <int D, int NW, int NS, bool BF16, bool LOCAL>
static fattn_status fwd_portable_launch_one(fattn_ctx *ctx, const PortableFwdParams &p, int batch) {
    using C = PortableCfg<D>;
    constexpr int smem = portable_fwd_smem_bytes<D, NW, NS>();
    auto kern = fwd_portable_kernel_of<D, NW, NS, BF16, LOCAL>();
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

template <int D, int NW, int NS, bool LOCAL>
static fattn_status fwd_portable_launch_tile(fattn_ctx *ctx, const PortableFwdParams &p, bool bf16, int batch) {
    return bf16 ? fwd_portable_launch_one<D, NW, NS, true, LOCAL>(ctx, p, batch)
                : fwd_portable_launch_one<D, NW, NS, false, LOCAL>(ctx, p, batch);
}

/* The first tile the device's opt-in shared memory per block holds: NW_BIG
 * warps with the deeper ring (d256 on H100/H200: 227 KB), NW warps with the
 * deeper ring (A100: 163 KB), NW warps with the shallower one (sm_86/89:
 * 99 KB). */
template <int D, bool LOCAL = false>
static fattn_status fwd_portable_run(fattn_ctx *ctx, const PortableFwdParams &p, bool bf16, int batch) {
    using C = PortableCfg<D>;
    const int optin = ((const fattn_cuda_state *)ctx->cuda)->smem_optin;
    if constexpr (C::NW_BIG > 0) {
        if (portable_fwd_smem_bytes<D, C::NW_BIG, C::NS>() <= optin)
            return fwd_portable_launch_tile<D, C::NW_BIG, C::NS, LOCAL>(ctx, p, bf16, batch);
    }
    if (portable_fwd_smem_bytes<D, C::NW, C::NS>() <= optin)
        return fwd_portable_launch_tile<D, C::NW, C::NS, LOCAL>(ctx, p, bf16, batch);
    constexpr int small = portable_fwd_smem_bytes<D, C::NW, C::NS_SMALL>();
    if (small <= optin) return fwd_portable_launch_tile<D, C::NW, C::NS_SMALL, LOCAL>(ctx, p, bf16, batch);
    return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                      "the portable CUDA engine's head dim %d forward needs %d bytes of shared memory per block; "
                      "this GPU allows %d",
                      D, small, optin);
}
