/* fp8_fwd.c - fattn_fwd_fp8: FP8 attention from f32/f16/bf16 inputs in one
 * call.  After fattn_fwd's checks (api.c, with fattn_fwd_fp8's dtype rules
 * and the engine's limits asked of the e4m3 call to come), Q, K and V are
 * quantised by the engine's fattn_quantize (Q and K rotated with one seed
 * when asked, never V) into packed BSHD e4m3 tensors in a workspace the
 * context owns, and the engine's e4m3 forward runs on them.  The result is
 * the bits of fattn_quantize x 3 into such tensors followed by fattn_fwd:
 * the same engine functions on the same arguments.
 *
 * The workspace: host memory on a CPU context (grown with malloc, the calls
 * being synchronous), device memory on a CUDA context (context.cu: grown,
 * never freed while a captured graph may use it, each call ordered after the
 * previous one on whatever stream). */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define FP8_DEFAULT_BLOCK 128
#define FP8_WS_ALIGN 256 /* TMA wants 16 bytes; cudaMalloc gives 256 */

static size_t ws_align(size_t x) { return (x + FP8_WS_ALIGN - 1) / FP8_WS_ALIGN * FP8_WS_ALIGN; }

static fattn_status check_block(fattn_ctx *ctx, int32_t rows, const char *name) {
    if (rows < 0)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "opt.%s %d must be >= 0 (0 = %d rows)", name,
                          (int)rows, FP8_DEFAULT_BLOCK);
    return FATTN_OK;
}

static fattn_status fattn_fwd_fp8_held(fattn_ctx *ctx, const fattn_fwd_args *args, const fattn_fp8_options *opt) {
    if (!args) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "args is NULL");
    fattn_fp8_options o;
    if (opt) o = *opt;
    else memset(&o, 0, sizeof o);
    fattn_status st;
    if (o.granularity != FATTN_QUANT_BLOCK && o.granularity != FATTN_QUANT_TENSOR)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "opt.granularity %d is not FATTN_QUANT_BLOCK or FATTN_QUANT_TENSOR", (int)o.granularity);
    if ((st = check_block(ctx, o.block_rows_q, "block_rows_q")) != FATTN_OK) return st;
    if ((st = check_block(ctx, o.block_rows_k, "block_rows_k")) != FATTN_OK) return st;
    if ((st = check_block(ctx, o.block_rows_v, "block_rows_v")) != FATTN_OK) return st;
    o.rotate = o.rotate != 0;

    /* rows per scale of Q, K, V; one scale everywhere makes the layout ours
     * to choose: the key block of the CUDA FP8 kernel */
    int32_t blocks[3] = {FP8_DEFAULT_BLOCK, FP8_DEFAULT_BLOCK, FP8_DEFAULT_BLOCK};
    if (o.granularity == FATTN_QUANT_BLOCK) {
        if (o.block_rows_q) blocks[0] = o.block_rows_q;
        if (o.block_rows_k) blocks[1] = o.block_rows_k;
        if (o.block_rows_v) blocks[2] = o.block_rows_v;
    }

    /* the quantiser works on dense [batch, seqlen] tensors: no page pools,
     * and no seqused_k yet (it would quantise keys never read) */
    if (args->seqused_k || args->block_table || args->page_size || args->num_pages ||
        args->max_pages_per_seq || args->seqused_q || args->cache_batch_idx || args->cache_batch ||
        args->cache_leftpad)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "fattn_fwd_fp8 does not take the serving fields yet (seqused_k, "
                          "block_table, page_size, num_pages, max_pages_per_seq, seqused_q, "
                          "cache_batch_idx, cache_batch, cache_leftpad must be 0): "
                          "quantise with fattn_quantize and call fattn_fwd");
    if (args->p.cu_seqlens_q && !args->p.cu_seqlens_k)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "fattn_fwd_fp8 does not take cu_seqlens_q without cu_seqlens_k yet (varlen "
                          "queries against fixed-length keys): quantise with fattn_quantize and call fattn_fwd");

    fattn_fwd_args a = *args;
    int64_t total_q = 0, total_k = 0;
    if ((st = fattn_fwd_prepare(ctx, &a, blocks, &total_q, &total_k)) != FATTN_OK) return st;
    if (o.rotate && (a.p.head_dim & (a.p.head_dim - 1)) != 0)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "rotate needs a power-of-two head_dim (Walsh-Hadamard); head_dim is %d",
                          (int)a.p.head_dim);

    /* Q, K, V: what fattn_quantize is given, the codes packed BSHD
     * (varlen: [1, total, heads, dim], scales counted over the packed tokens,
     * as fattn_tensor says) */
    const int varlen = a.p.cu_seqlens_q != NULL, cuda = ctx->backend == FATTN_BACKEND_CUDA;
    const fattn_tensor *src[3] = {&a.q, &a.k, &a.v};
    const int64_t seq[3] = {total_q, total_k, total_k};
    const int32_t heads[3] = {a.p.heads_q, a.p.heads_kv, a.p.heads_kv};
    const int32_t dims[3] = {a.p.head_dim, a.p.head_dim, a.p.head_dim_v};
    const int32_t nbatch = varlen ? 1 : a.p.batch;
    fattn_quantize_args qa[3];
    size_t code_off[3], scale_off[3], bytes = 0;
    for (int i = 0; i < 3; i++) {
        const int64_t codes = (int64_t)nbatch * seq[i] * heads[i] * dims[i];
        const int64_t nscale = (int64_t)nbatch * heads[i] * ((seq[i] + blocks[i] - 1) / blocks[i]);
        code_off[i] = bytes;
        bytes += ws_align((size_t)codes);
        scale_off[i] = bytes;
        bytes += ws_align((size_t)nscale * sizeof(float));
        memset(&qa[i], 0, sizeof qa[i]);
        qa[i].in = *src[i];
        qa[i].in.scale = NULL;
        qa[i].in.scale_block = 0;
        qa[i].out.dtype = FATTN_DTYPE_E4M3;
        qa[i].out.stride_head = dims[i];
        qa[i].out.stride_seq = (int64_t)heads[i] * dims[i];
        qa[i].out.stride_batch = varlen ? 0 : seq[i] * heads[i] * dims[i];
        qa[i].out.scale_block = blocks[i];
        qa[i].batch = nbatch;
        qa[i].seqlen = (int32_t)seq[i];
        qa[i].heads = heads[i];
        qa[i].head_dim = dims[i];
        qa[i].granularity = o.granularity;
        qa[i].block_rows = blocks[i];
        qa[i].rotate = o.rotate && i < 2;
        qa[i].seed = o.seed;
        /* the quantiser's own limits, before anything is written */
        if (cuda && (st = fattn_cuda_quantize_check(ctx, &qa[i])) != FATTN_OK) return st;
    }

    char *ws = NULL;
    if (cuda) {
        if ((st = fattn_cuda_fp8_workspace(ctx, bytes, (void **)&ws)) != FATTN_OK) return st;
    } else if (ctx->fp8_ws_bytes < bytes) {
        void *grown = malloc(bytes);
        if (!grown)
            return fattn_fail(ctx, FATTN_ERROR_OUT_OF_MEMORY, "fattn_fwd_fp8: cannot allocate its %zu-byte workspace",
                              bytes);
        free(ctx->fp8_ws);
        ctx->fp8_ws = grown;
        ctx->fp8_ws_bytes = bytes;
    }
    if (!cuda) ws = (char *)ctx->fp8_ws;

    fattn_fwd_args e = a;
    fattn_tensor *dst[3] = {&e.q, &e.k, &e.v};
    for (int i = 0; i < 3 && st == FATTN_OK; i++) {
        qa[i].out.data = ws + code_off[i];
        qa[i].out.scale = (float *)(ws + scale_off[i]);
        *dst[i] = qa[i].out;
        if (seq[i] == 0) continue; /* varlen batch of empty sequences: nothing to quantise */
        st = cuda ? fattn_cuda_quantize(ctx, &qa[i]) : fattn_cpu_quantize(ctx, &qa[i]);
    }
    if (st == FATTN_OK) st = fattn_fwd_run(ctx, &e);
    if (cuda) {
        fattn_status done = fattn_cuda_fp8_workspace_done(ctx);
        if (st == FATTN_OK) st = done;
    }
    return st;
}

fattn_status fattn_fwd_fp8(fattn_ctx *ctx, const fattn_fwd_args *args, const fattn_fp8_options *opt) {
    fattn_status st = fattn_ctx_acquire(ctx, "fattn_fwd_fp8");
    if (st != FATTN_OK) return st;
    st = fattn_fwd_fp8_held(ctx, args, opt);
    fattn_ctx_release(ctx);
    return st;
}
