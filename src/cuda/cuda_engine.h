/* cuda_engine.h - what the CUDA engine's host files share. */
#pragma once
#include <cuda.h>
#include <stdlib.h>

#include "../internal.h"

struct fattn_cuda_state {
    int num_sms;
    void *encode_tiled; /* PFN_cuTensorMapEncodeTiled, from the driver */
    unsigned *tile_counter; /* causal forward's tile scheduler, 2 words, zero between launches */
    void *switch_event;     /* cudaEvent_t recorded after each launch that uses tile_counter */
    /* both made with the context (fattn_cuda_ctx_init), freed with it */
    void *split_ws;         /* split forward's workspace (cuda_split_workspace), NULL until first needed */
    size_t split_bytes;     /* its slot bytes; CUDA_SPLIT_COUNTERS zeroed counters follow them */
    void *split_retired[8]; /* outgrown workspaces: a captured graph may still use them, freed with the context */
    int split_nretired;
};

/* The split forward's workspace (perf-notes v30): at least `bytes` of slots
 * and CUDA_SPLIT_COUNTERS counters that are zero between launches, made or
 * grown (at least doubled) on first need and zeroed in ctx->stream's order;
 * an outgrown one is kept until the context is freed, since a graph captured
 * earlier may use it.  *ws is NULL (and FATTN_OK returned) when none can be
 * had now: while ctx->stream is being captured into a graph, when the
 * allocation fails or after 8 growths; the caller then runs unsplit.
 * Launches that use it are ordered with cuda_order_before/after. */
#define CUDA_SPLIT_COUNTERS 4096
fattn_status cuda_split_workspace(fattn_ctx *ctx, size_t bytes, void **ws, unsigned **counters);

/* Kernels that share the context's tile counter must run one after another,
 * also when the context's stream changes between calls (or the old stream is
 * gone): cuda_order_before makes ctx->stream wait for the previous such launch
 * (an event), cuda_order_after records the event after this one.  Both do
 * nothing while ctx->stream is being captured into a CUDA graph. */
fattn_status cuda_order_before(fattn_ctx *ctx);
fattn_status cuda_order_after(fattn_ctx *ctx);
/* Make `device` the current device; *prev receives the device to give back to
 * cuda_device_leave (-1 when nothing was switched, also on failure). */
cudaError_t cuda_device_enter(int device, int *prev);
void cuda_device_leave(int prev);
fattn_status cuda_check_device_ptr(fattn_ctx *ctx, const void *ptr, const char *name);
fattn_status cuda_make_tensor_map(fattn_ctx *ctx, CUtensorMap *map, const fattn_tensor *t, int64_t dim, int64_t seq,
                                  int64_t heads, int64_t batch, int box_rows, const char *name);

/* Hopper 16-bit forward: picks the kernel instance for the problem. */
fattn_status fwd_sm90_launch(fattn_ctx *ctx, const fattn_fwd_args *a);

/* Kernel variant knobs (the paper's ablation), from fattn_ctx_set_option. */
struct fwd_variant {
    bool bf16, causal, overlap, pingpong, under_pv;
    /* the full design: every fp16 call, and bf16 unless the ablation turned
     * a technique off (the ablation's variants are bf16 only) */
    bool full_design() const { return !bf16 || (overlap && pingpong && !under_pv); }
};
fattn_status fwd_sm90_hdim64(fattn_ctx *ctx, const fattn_fwd_args *a, fwd_variant v);
fattn_status fwd_sm90_hdim128(fattn_ctx *ctx, const fattn_fwd_args *a, fwd_variant v);
fattn_status fwd_sm90_hdim256(fattn_ctx *ctx, const fattn_fwd_args *a, fwd_variant v);
