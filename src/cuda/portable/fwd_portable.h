/* fwd_portable.h - the portable forward's host entry (issue 41): what entry.cu
 * calls on a portable-engine context.  fwd_portable.cu picks the head dim's
 * instance file (instances/fwd_portable_hdim*.cu), each of which launches
 * fwd_portable_kernel (fwd_portable.cuh) through fwd_portable_launch.cuh. */
#pragma once
#include "../cuda_engine.h"

struct PortableFwdParams;

/* api.c and entry.cu have checked the arguments (16-bit, head dims of
 * fwd_portable_head_dims, no block table; the variants with seqlen_q +
 * seqlen_k < 2^30). */
fattn_status fwd_portable_launch(fattn_ctx *ctx, const fattn_fwd_args *a);

/* The head dims the instances serve. */
extern const int fwd_portable_head_dims[5];

/* 0 when head dim head_dim's forward fits optin bytes of shared memory per
 * block (the device's opt-in limit), else the bytes it needs: entry.cu
 * refuses such a call before any work. */
int fwd_portable_smem_need(int head_dim, int optin);

/* One head dim's instances (bf16 and f16, two ring depths each; d256 also 8
 * warps where they fit); 192 is the portable engine's alone (the Hopper
 * kernels have 64, 128, 256). */
fattn_status fwd_portable_hdim64(fattn_ctx *ctx, const PortableFwdParams &p, bool bf16, int batch);
fattn_status fwd_portable_hdim96(fattn_ctx *ctx, const PortableFwdParams &p, bool bf16, int batch);
fattn_status fwd_portable_hdim128(fattn_ctx *ctx, const PortableFwdParams &p, bool bf16, int batch);
fattn_status fwd_portable_hdim192(fattn_ctx *ctx, const PortableFwdParams &p, bool bf16, int batch);
fattn_status fwd_portable_hdim256(fattn_ctx *ctx, const PortableFwdParams &p, bool bf16, int batch);

/* The same with the variants (window, softcap, learnable sink):
 * fwd_portable_local_kernel, instances of their own. */
fattn_status fwd_portable_local_hdim64(fattn_ctx *ctx, const PortableFwdParams &p, bool bf16, int batch);
fattn_status fwd_portable_local_hdim96(fattn_ctx *ctx, const PortableFwdParams &p, bool bf16, int batch);
fattn_status fwd_portable_local_hdim128(fattn_ctx *ctx, const PortableFwdParams &p, bool bf16, int batch);
fattn_status fwd_portable_local_hdim192(fattn_ctx *ctx, const PortableFwdParams &p, bool bf16, int batch);
fattn_status fwd_portable_local_hdim256(fattn_ctx *ctx, const PortableFwdParams &p, bool bf16, int batch);
