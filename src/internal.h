/* internal.h - what the API layer and the engines share.  Not installed. */
#ifndef FATTN_INTERNAL_H
#define FATTN_INTERNAL_H

#include "error.h"
#include "fattn.h"

#ifdef __cplusplus
extern "C" {
#endif

struct fattn_ctx {
    fattn_backend backend; /* CPU or CUDA, never AUTO */
    int device;            /* CUDA device ordinal */
    void *stream;          /* cudaStream_t */
    int threads;           /* CPU worker threads, 0 = all online CPUs */
    const char *cpu_isa;   /* CPU contexts: FATTN_CPU_ISA's forward instance, read at creation (NULL: the best) */
    void *cuda;            /* engine state owned by src/cuda (NULL on CPU) */
    int options[FATTN_OPTION_COUNT_]; /* fattn_ctx_set_option, 0 = default; read by the engine's entry point */
    void *fp8_ws;          /* CPU contexts: fattn_fwd_fp8's host workspace (CUDA: in ctx->cuda) */
    size_t fp8_ws_bytes;
    char err[FATTN_ERRMSG_LEN];
    int in_use;            /* 1 while a call holds the context (fattn_ctx_acquire); atomic builtins only */
};

/* The context's in-use flag (fattn.h, Context): every public call that takes
 * a context starts with fattn_ctx_acquire and ends with fattn_ctx_release.
 * Acquire fails with INVALID_ARGUMENT for a NULL ctx and with BUSY when
 * another call holds it (message in the thread-local buffer, nothing of the
 * context touched); on success it clears the context's message. */
fattn_status fattn_ctx_acquire(fattn_ctx *ctx, const char *fn);
void fattn_ctx_release(fattn_ctx *ctx);

/* Each call passes through three steps.  api.c checks what holds for every
 * engine (sizes, dtype rules of the header, null pointers; the checks the
 * calls share are api_check.c's), then asks the
 * engine's *_check for its limits (head dims, dtypes, varlen: small tables in
 * src/cpu/limits.c and src/cuda/entry.cu; they read no memory behind a
 * pointer), then checks strides and extents and calls the engine, which
 * checks what needs the device (pointer location, alignment) and runs.
 *
 * By the time an engine's run function is called, api.c has replaced the
 * "all strides zero" default by explicit BSHD strides, head_dim_v == 0 by
 * head_dim and softmax_scale == 0 by 1/sqrt(head_dim). */

/* fattn_fwd's checks (api.c) on a copy of its arguments, which they resolve
 * (packed strides, head_dim_v, softmax_scale) and write back on success;
 * fattn_fwd_run then dispatches to the engine.  fp8_blocks non-NULL: the
 * rules of fattn_fwd_fp8 (f32/f16/bf16 inputs, o any output dtype, scales
 * ignored), and the engine's limits asked of the e4m3 call it will make with
 * scale blocks fp8_blocks[0..2] for q, k, v.  total_q/k (may be NULL): the
 * token counts (varlen: cu_seqlens[batch]). */
fattn_status fattn_fwd_prepare(fattn_ctx *ctx, fattn_fwd_args *a, const int32_t *fp8_blocks,
                               int64_t *total_q, int64_t *total_k);
fattn_status fattn_fwd_run(fattn_ctx *ctx, const fattn_fwd_args *a);

/* CPU engine (src/cpu). */
fattn_status fattn_cpu_fwd_check(fattn_ctx *ctx, const fattn_fwd_args *a);
fattn_status fattn_cpu_bwd_check(fattn_ctx *ctx, const fattn_bwd_args *a);
/* Varlen batches (CPU contexts only: cu_seqlens are host memory there):
 * cu_seqlens_q/k start at 0, never decrease, and no sequence is longer than
 * seqlen_q/seqlen_k; *total_q = cu_seqlens_q[batch], *total_k likewise
 * (seqlen_k without cu_seqlens_k). */
fattn_status fattn_cpu_varlen_totals(fattn_ctx *ctx, const fattn_problem *p, int64_t *total_q,
                                     int64_t *total_k);
/* fattn_fwd's serving fields (CPU contexts only: host memory there), after
 * the varlen check: no negative seqused_q or seqused_k entry, batch indices
 * inside [0, cache_batch), left pads inside the used keys, and the
 * block-table entries of the pages each sequence reads inside
 * [0, num_pages).  The backward's: seqused_q and seqused_k >= 0. */
fattn_status fattn_cpu_serving_check(fattn_ctx *ctx, const fattn_fwd_args *a);
fattn_status fattn_cpu_bwd_serving_check(fattn_ctx *ctx, const fattn_bwd_args *a);
/* An FP8 KV cache (e4m3 k and v, q not e4m3; CPU contexts only), after
 * fattn_cpu_serving_check: the k and v scales of every key a sequence uses
 * are > 0 (the scales of unused pages and rows are not read). */
fattn_status fattn_cpu_kv8_scale_check(fattn_ctx *ctx, const fattn_fwd_args *a);
fattn_status fattn_cpu_fwd(fattn_ctx *ctx, const fattn_fwd_args *a);
fattn_status fattn_cpu_bwd(fattn_ctx *ctx, const fattn_bwd_args *a);
fattn_status fattn_cpu_quantize(fattn_ctx *ctx, const fattn_quantize_args *a);
/* api.c has checked every part and resolved its default strides in a
 * private copy of the parts array, which a->parts points to. */
fattn_status fattn_cpu_merge(fattn_ctx *ctx, const fattn_merge_args *a);
/* fattn_kv_append (kv_append.c): api.c has checked the sizes, dtypes,
 * tensors and overlaps and resolved default strides (a->capacity is 0 with
 * a block table); this checks the entries of cache_seqlens and block_table
 * on the host (INVALID_ARGUMENT, nothing written) and copies the rows. */
fattn_status fattn_cpu_kv_append(fattn_ctx *ctx, const fattn_kv_append_args *a);

/* CUDA engine (src/cuda; src/cuda_stub.c answers NO_DEVICE when built
 * without CUDA).  Its checks refuse varlen batches: nothing reads cu_seqlens
 * from the device while arguments are checked. */
/* The compute capability of CUDA device `device` as 10 x major + minor (0: no
 * usable device, or no CUDA engine): what fattn_engine_pick decides AUTO on. */
int fattn_cuda_device_sm(int device);
/* The context's CUDA state; engine_env is FATTN_CUDA_ENGINE's value as api.c
 * read it at creation (NULL: unset), which fattn_engine_pick turns into the
 * engine (Hopper's or the portable one). */
fattn_status fattn_cuda_ctx_init(fattn_ctx *ctx, const char *engine_env);
/* fattn_ctx_engine's text for a CUDA context (context.cu; the stub: "cuda"). */
const char *fattn_cuda_engine_name(const fattn_ctx *ctx);
void fattn_cuda_ctx_free(fattn_ctx *ctx);
fattn_status fattn_cuda_fwd_check(fattn_ctx *ctx, const fattn_fwd_args *a);
fattn_status fattn_cuda_bwd_check(fattn_ctx *ctx, const fattn_bwd_args *a);
fattn_status fattn_cuda_fwd(fattn_ctx *ctx, const fattn_fwd_args *a);
fattn_status fattn_cuda_bwd(fattn_ctx *ctx, const fattn_bwd_args *a);
/* The CUDA quantiser's limits (head dims), read nothing behind a pointer;
 * fattn_cuda_quantize runs it again itself. */
fattn_status fattn_cuda_quantize_check(fattn_ctx *ctx, const fattn_quantize_args *a);
fattn_status fattn_cuda_quantize(fattn_ctx *ctx, const fattn_quantize_args *a);
/* fattn_merge (merge.cu): the check refuses nothing (the kernel serves
 * every merge api.c accepts); the run function repeats it, checks where the
 * pointers live and enqueues the kernel. */
fattn_status fattn_cuda_merge_check(fattn_ctx *ctx, const fattn_merge_args *a);
fattn_status fattn_cuda_merge(fattn_ctx *ctx, const fattn_merge_args *a);
/* fattn_kv_append (kv_append.cu), after api.c's checks as for the CPU:
 * checks where the pointers live and enqueues the copy kernel; the entries
 * are read on the device only (rows with an out-of-range destination are
 * skipped).  No engine limit beyond api.c's, so no separate check. */
fattn_status fattn_cuda_kv_append(fattn_ctx *ctx, const fattn_kv_append_args *a);
/* fattn_fwd_fp8's device workspace (context.cu): at least `bytes`, made or
 * grown (at least doubled) on first need, an outgrown one kept until the
 * context is freed (a graph captured earlier may use it); ctx->stream is
 * made to wait for the previous fattn_fwd_fp8 on this context, whatever
 * stream that ran on.  While ctx->stream is being captured nothing is
 * allocated or waited for: a workspace too small then is UNSUPPORTED.
 * fattn_cuda_fp8_workspace_done records the end of this call's use. */
fattn_status fattn_cuda_fp8_workspace(fattn_ctx *ctx, size_t bytes, void **ws);
fattn_status fattn_cuda_fp8_workspace_done(fattn_ctx *ctx);

#ifdef __cplusplus
}
#endif

#endif
