/* launch.cuh - the host side the Hopper launchers share (the forward's
 * fwd_sm90_launch.cuh, the backward's bwd_sm90_launch.cuh, decoding's
 * fwd_decode_launch.cuh): a kernel's dynamic shared memory opted into once
 * per device, and one launch through cudaLaunchKernelExC with an optional
 * CTA cluster and programmatic dependent launch, its CUDA error turned into
 * the context's message; and the parameters they fill alike (the window). */
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include <atomic>

#include "../cuda_engine.h"

/* The variants' window and softcap as every kernel takes them (FwdLocal,
 * BwdParams, DecParams): causal folded into right = 0 (fattn.h: the
 * intersection), a side that reaches past every key of every sequence
 * unbounded (-1: left >= seqlen_k or right >= seqlen_q, the longest
 * sequence's under varlen); softcap as cap_a tanh(cap_b x), 0 when off. */
struct hopper_window {
    int left, right;
    float cap_a, cap_b;
};
inline hopper_window hopper_window_of(const fattn_problem *pr) {
    hopper_window w;
    w.left = pr->window && pr->window_left >= 0 && pr->window_left < pr->seqlen_k ? pr->window_left : -1;
    w.right = pr->causal ? 0
              : pr->window && pr->window_right >= 0 && pr->window_right < pr->seqlen_q ? pr->window_right
                                                                                      : -1;
    w.cap_a = pr->softcap > 0.f ? pr->softcap / pr->softmax_scale : 0.f;
    w.cap_b = pr->softcap > 0.f ? pr->softmax_scale / pr->softcap : 0.f;
    return w;
}

/* Opt kern, the one kernel of configuration C, into smem bytes of dynamic
 * shared memory, once per device (devices past 63 on every call): the set
 * costs a driver call, and the attribute stays with the function.  A
 * repeated set from two threads at once is harmless.  what prefixes the
 * message ("backward: " or ""). */
template <class C>
fattn_status hopper_smem_attr(fattn_ctx *ctx, const void *kern, int smem, const char *what) {
    static std::atomic<uint64_t> set{0};
    const uint64_t bit = ctx->device < 64 ? 1ull << ctx->device : 0;
    if (bit && (set.load(std::memory_order_relaxed) & bit)) return FATTN_OK;
    const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* not left for the next launch's check */
        return fattn_fail(ctx, FATTN_ERROR_CUDA, "%scudaFuncSetAttribute: %s", what, cudaGetErrorString(e));
    }
    set.fetch_or(bit, std::memory_order_relaxed);
    return FATTN_OK;
}

/* A launch's shape: grid, block, dynamic shared memory, CTAs per cluster
 * along x (1: no cluster) and PDL (programmatic dependent launch: the kernel
 * waits for its predecessor with griddepcontrol.wait before it touches
 * global memory). */
struct hopper_launch {
    dim3 grid, block;
    int smem = 0;
    int cluster = 1;
    bool pdl = false;
};

/* L as a launch configuration on the context's stream; attr holds its
 * attributes (the cluster's, then PDL's), so it must outlive the launch. */
inline cudaLaunchConfig_t hopper_launch_config(fattn_ctx *ctx, const hopper_launch &L, cudaLaunchAttribute (&attr)[2]) {
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = L.grid;
    cfg.blockDim = L.block;
    cfg.dynamicSmemBytes = (size_t)L.smem;
    cfg.stream = (cudaStream_t)ctx->stream;
    int n = 0;
    if (L.cluster > 1) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = (unsigned)L.cluster;
        attr[n].val.clusterDim.y = 1;
        attr[n].val.clusterDim.z = 1;
        ++n;
    }
    if (L.pdl) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n].val.programmaticStreamSerializationAllowed = 1;
        ++n;
    }
    cfg.attrs = attr;
    cfg.numAttrs = (unsigned)n;
    return cfg;
}

/* Launch kern (args: pointers to its arguments in the order of its
 * parameters) as L says; a failed launch, or an error left before it, is
 * the context's "<what> launch: <CUDA's message>". */
inline fattn_status hopper_launch_kernel(fattn_ctx *ctx, const hopper_launch &L, const void *kern, void **args,
                                         const char *what) {
    cudaLaunchAttribute attr[2];
    const cudaLaunchConfig_t cfg = hopper_launch_config(ctx, L, attr);
    cudaError_t e = cudaLaunchKernelExC(&cfg, kern, args);
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess) return fattn_fail(ctx, FATTN_ERROR_CUDA, "%s launch: %s", what, cudaGetErrorString(e));
    return FATTN_OK;
}
