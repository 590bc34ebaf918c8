/* bwd_portable.h - the portable backward's host entry (issue 41): what
 * entry.cu calls on a portable-engine context.  bwd_portable.cu runs the
 * preprocess, the head dim's main kernel (instances/bwd_portable_hdim*.cu,
 * each launching bwd_portable_kernel of bwd_portable.cuh through
 * bwd_portable_launch.cuh) and the postprocess. */
#pragma once
#include "../cuda_engine.h"

struct PortableBwdParams;

/* entry.cu has checked the arguments (16-bit, head_dim == head_dim_v of
 * bwd_portable_head_dims, no variant; seqused_q / seqused_k varlen only). */
fattn_status bwd_portable_launch(fattn_ctx *ctx, const fattn_bwd_args *a);

/* The head dims the instances serve: the forward's. */
extern const int bwd_portable_head_dims[5];

/* 0 when head dim head_dim's backward fits optin bytes of shared memory per
 * block, else the bytes it needs (d192 and d256 on 99 KB GPUs): entry.cu
 * refuses such a call before the workspace and the preprocess. */
int bwd_portable_smem_need(int head_dim, int optin);

/* One head dim's main kernel (bf16 and f16; d64 / d96 / d128: 128 or 64 keys a
 * CTA, by shared memory; two ring depths each) on grid (key blocks, heads_kv,
 * batch), the key blocks' count set by the kernel taken. */
fattn_status bwd_portable_hdim64(fattn_ctx *ctx, const PortableBwdParams &p, bool bf16, dim3 grid);
fattn_status bwd_portable_hdim96(fattn_ctx *ctx, const PortableBwdParams &p, bool bf16, dim3 grid);
fattn_status bwd_portable_hdim128(fattn_ctx *ctx, const PortableBwdParams &p, bool bf16, dim3 grid);
fattn_status bwd_portable_hdim192(fattn_ctx *ctx, const PortableBwdParams &p, bool bf16, dim3 grid);
fattn_status bwd_portable_hdim256(fattn_ctx *ctx, const PortableBwdParams &p, bool bf16, dim3 grid);
