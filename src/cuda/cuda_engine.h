/* cuda_engine.h - what the CUDA engine's host files share: entry.cu (entry
 * points, limits, pointer checks, options), context.cu (context state,
 * device switching, launch ordering, split and FP8 workspaces), tensor_map.cu
 * (TMA maps), quantize.cu (fattn_quantize) and the kernels' launchers in
 * hopper/. */
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdlib.h>

#include "../engine_pick.h"
#include "../internal.h"

/* A workspace a context owns: NULL until first needed, grown (the outgrown
 * ones kept until the context is freed: a captured graph may use them),
 * each call ordered after the previous one's last use (event). */
struct cuda_owned_ws {
    void *buf;
    size_t bytes;
    void **retired;
    int nretired;
    void *event; /* cudaEvent_t */
};

struct fattn_cuda_state {
    int num_sms;
    /* which kernels the context runs: FATTN_ENGINE_CUDA_HOPPER (hopper/, sm_90
     * only) or _PORTABLE (portable/: every GPU from sm_80 on); chosen at
     * creation by fattn_engine_pick (engine_pick.h) */
    fattn_engine engine;
    int sm;         /* compute capability, 10 x major + minor (90: Hopper) */
    int smem_optin; /* shared memory per block a kernel may opt in to, bytes */
    char name[48];  /* fattn_ctx_engine's text */
    void *encode_tiled; /* PFN_cuTensorMapEncodeTiled, from the driver */
    unsigned *tile_counter; /* causal forward's tile scheduler, 2 words, zero between launches */
    void *switch_event;     /* cudaEvent_t recorded after each launch that uses tile_counter */
    /* both made with the context (fattn_cuda_ctx_init), freed with it */
    void *split_ws;         /* split forward's workspace (cuda_split_workspace), NULL until first needed */
    size_t split_bytes;     /* its slot bytes; CUDA_SPLIT_COUNTERS zeroed counters follow them */
    void *split_retired[8]; /* outgrown workspaces: a captured graph may still use them, freed with the context */
    int split_nretired;
    /* fattn_fwd_fp8's quantised Q, K, V (fattn_cuda_fp8_workspace), the
     * backward's dQ accumulator and row statistics (cuda_bwd_workspace) */
    cuda_owned_ws fp8, bwd;
    cuda_owned_ws merge; /* fattn_merge's running sums across launches (cuda_merge_workspace) */
    cuda_owned_ws dec; /* a fixed-length KV-cache call's cu_seqlens_q and LSE (cuda_decode_workspace) */
};

/* The split forward's workspace (v30): at least `bytes` of slots
 * and CUDA_SPLIT_COUNTERS counters that are zero between launches, made or
 * grown (at least doubled) on first need and zeroed in ctx->stream's order;
 * an outgrown one is kept until the context is freed, since a graph captured
 * earlier may use it.  *ws is NULL (and FATTN_OK returned) when none can be
 * had now: while ctx->stream is being captured into a graph, when the
 * allocation fails or after 8 growths; the caller then runs unsplit.
 * Launches that use it are ordered with cuda_order_before/after.  context.cu. */
#define CUDA_SPLIT_COUNTERS 4096
fattn_status cuda_split_workspace(fattn_ctx *ctx, size_t bytes, void **ws, unsigned **counters);

/* Kernels that share the context's tile counter must run one after another,
 * also when the context's stream changes between calls (or the old stream is
 * gone): cuda_order_before makes ctx->stream wait for the previous such launch
 * (an event), cuda_order_after records the event after this one.  Both do
 * nothing while ctx->stream is being captured into a CUDA graph.  context.cu. */
fattn_status cuda_order_before(fattn_ctx *ctx);
fattn_status cuda_order_after(fattn_ctx *ctx);
/* The backward's workspace (cuda_owned_ws: grown on first need, nothing
 * allocated during graph capture) and the record of its last use; context.cu. */
fattn_status cuda_bwd_workspace(fattn_ctx *ctx, size_t bytes, void **ws);
fattn_status cuda_bwd_workspace_done(fattn_ctx *ctx);
/* fattn_merge's running sums when a call takes several launches (merge.cu):
 * as the backward's (UNSUPPORTED during graph capture when too small). */
fattn_status cuda_merge_workspace(fattn_ctx *ctx, size_t bytes, void **ws);
fattn_status cuda_merge_workspace_done(fattn_ctx *ctx);
/* A fixed-length KV-cache call's cu_seqlens_q and moved LSE
 * (fwd_kvcache_fixed.cu; the decoding kernel's split partials live in the
 * split workspace since d11): as the backward's, except that during graph
 * capture a workspace too small gives *ws NULL and FATTN_OK; context.cu. */
fattn_status cuda_decode_workspace(fattn_ctx *ctx, size_t bytes, void **ws);
fattn_status cuda_decode_workspace_done(fattn_ctx *ctx);
/* Hopper 16-bit backward (hopper/instances/bwd_sm90.cu). */
fattn_status bwd_sm90_launch(fattn_ctx *ctx, const fattn_bwd_args *a);

/* After a <<<>>> launch: its error (or one left before it) as the context's
 * "<what> launch: <CUDA's message>" (FATTN_ERROR_CUDA), else FATTN_OK. */
inline fattn_status cuda_launch_error(fattn_ctx *ctx, const char *what) {
    const cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return FATTN_OK;
    return fattn_fail(ctx, FATTN_ERROR_CUDA, "%s launch: %s", what, cudaGetErrorString(e));
}

/* Make `device` the current device; *prev receives the device to give back to
 * cuda_device_leave (-1 when nothing was switched, also on failure). */
cudaError_t cuda_device_enter(int device, int *prev);
void cuda_device_leave(int prev);
/* cuda_device_enter(ctx->device, prev), the failure reported on ctx
 * (FATTN_ERROR_CUDA, the CUDA error cleared). */
fattn_status cuda_ctx_enter(fattn_ctx *ctx, int *prev);
/* The pointer must be device memory of ctx->device (or managed); entry.cu. */
fattn_status cuda_check_device_ptr(fattn_ctx *ctx, const void *ptr, const char *name);

/* Tensor maps (tensor_map.cu). */
/* TMA's rule for a tensor of `dtype` elements: base 16-byte aligned
 * (INVALID_ARGUMENT) and strides multiples of 16 bytes (UNSUPPORTED). */
fattn_status cuda_check_tma_layout(fattn_ctx *ctx, const fattn_tensor *t, fattn_dtype dtype, const char *name);
/* A 4-D map [dim, seq, heads, batch] over `t` read as `dtype` elements (bf16,
 * f16: 2 bytes, e4m3: 1, f32: 4), box [box_cols, box_rows, 1, 1] with
 * `swizzle`; out-of-bounds rows read as zero.  Checks the layout as above,
 * and the box (1..256 per dim, box_cols * element size a multiple of 16 bytes
 * within the swizzle span: FATTN_ERROR_INTERNAL, the box being the kernel's);
 * messages name the tensor. */
fattn_status cuda_tensor_map_4d(fattn_ctx *ctx, CUtensorMap *map, const fattn_tensor *t, fattn_dtype dtype, int64_t dim,
                                int64_t seq, int64_t heads, int64_t batch, int box_cols, int box_rows,
                                CUtensorMapSwizzle swizzle, const char *name);
/* 16-bit elements, a 64-column box with the 128-byte swizzle the wgmma
 * descriptors expect: cuda_tensor_map_4d(..., bf16, ..., 64, box_rows,
 * CU_TENSOR_MAP_SWIZZLE_128B, name). */
fattn_status cuda_make_tensor_map(fattn_ctx *ctx, CUtensorMap *map, const fattn_tensor *t, int64_t dim, int64_t seq,
                                  int64_t heads, int64_t batch, int box_rows, const char *name);

/* The forward's experimental knobs (fattn_ctx_set_option), read once per
 * call by fattn_cuda_fwd (entry.cu); true = the technique is on. */
struct cuda_fwd_options {
    bool overlap;  /* !FATTN_OPTION_DISABLE_OVERLAP */
    bool pingpong; /* !FATTN_OPTION_DISABLE_PINGPONG */
    bool under_pv; /* FATTN_OPTION_SOFTMAX_UNDER_PV */
    bool split;    /* !FATTN_OPTION_DISABLE_SPLIT */
    bool pdl;      /* !FATTN_OPTION_DISABLE_PDL */
};

/* Hopper 16-bit forward: picks the kernel instance for the problem, with the
 * options fattn_cuda_fwd read. */
fattn_status fwd_sm90_launch(fattn_ctx *ctx, const fattn_fwd_args *a, const cuda_fwd_options *opt);

/* its kernel choice and variants: hopper/fwd/fwd_sm90_dispatch.h */
