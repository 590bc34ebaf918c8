/* entry.cu - the CUDA engine's entry points (declared in src/internal.h):
 * its limits, as small tables of what the kernels serve, checked before
 * api.c reads anything behind a pointer (fattn_cuda_*_check); the checks that
 * need the device (pointer location, alignment); the options, read once per
 * call; and dispatch to the kernels.  Plain C-style host code. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "cuda_engine.h"
#include "hopper/fwd/fwd_sm90_dispatch.h"
#include "portable/bwd_portable.h"
#include "portable/fwd_portable.h"

/* ---- limits ------------------------------------------------------------------ */

/* What the Hopper forward serves (src/cuda/hopper/instances/fwd_sm90_*hdim*.cu):
 * head_dim == head_dim_v of these, or 192 with head_dim_v 128 (16-bit); FP8
 * and the decoding kernel only fwd_fp8_head_dims. */
static const int fwd_head_dims[] = {64, 96, 128, 192, 256};
static const int fwd_fp8_head_dims[] = {64, 128, 256};
static const fattn_dtype fwd_dtypes[] = {FATTN_DTYPE_BF16, FATTN_DTYPE_F16, FATTN_DTYPE_E4M3};
/* FP8: K's scale blocks are 1 (per key) or multiples of this, V's multiples
 * of it; every FP8 kernel's key block divides it, or is split into column
 * groups that do (FwdCfg::SG, src/cuda/hopper/fwd/fwd_traits.cuh).  Head dim 128
 * also takes K and V blocks that are both multiples of the _D128 unit: its
 * 192-key kernels, one K and one V scale per key block. */
#define FWD_FP8_SCALE_UNIT 128
#define FWD_FP8_SCALE_UNIT_D128 192
#define COUNT(x) ((int)(sizeof(x) / sizeof((x)[0])))

/* An e4m3 scale block that covers the whole sequence (one scale per batch
 * entry and head: FlashAttention-3's q/k/v_descale) suits every FP8 kernel;
 * it is passed on as the smallest multiple of the scale unit that covers
 * the rows, so the kernels' column groups accept it (nblocks stays 1). */
static int fp8_scale_block(int block, int rows) {
    if (rows > 0 && block >= rows) return (rows + FWD_FP8_SCALE_UNIT - 1) / FWD_FP8_SCALE_UNIT * FWD_FP8_SCALE_UNIT;
    return block;
}

/* "64, 128, 256" or "bf16, f16" into buf, for the messages. */
static const char *list_ints(char *buf, size_t n, const int *v, int count) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < count && used < n; ++i)
        used += (size_t)snprintf(buf + used, n - used, "%s%d", i ? ", " : "", v[i]);
    return buf;
}

static const char *list_dtypes(char *buf, size_t n, const fattn_dtype *v, int count) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < count && used < n; ++i)
        used += (size_t)snprintf(buf + used, n - used, "%s%s", i ? ", " : "", fattn_dtype_name(v[i]));
    return buf;
}

/* The backward's variants (issue 37): a window or softcap run on the LOCAL
 * instances (bwd_sm90_launch.cuh), dsink on a small kernel beside any
 * instance; the kernels count keys and queries in an int, as the forward's. */
static fattn_status check_bwd_variants(fattn_ctx *ctx, const fattn_bwd_args *a) {
    const fattn_problem *p = &a->p;
    if (!p->window && p->softcap == 0.0f && !a->dsink) return FATTN_OK;
    if ((int64_t)p->seqlen_q + p->seqlen_k >= ((int64_t)1 << 30))
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "window, softcap or dsink with seqlen_q %d + seqlen_k %d >= 2^30: the CUDA engine's "
                          "variant kernels count keys in an int",
                          p->seqlen_q, p->seqlen_k);
    return FATTN_OK;
}

/* The forward's variants (issue 37) run on the LOCAL kernels
 * (fwd_sm90_kernels.cuh): 16-bit inputs take a window, softcap and a
 * learnable sink, fixed-length or variable-length; e4m3 inputs the window
 * only, with K scale blocks of 1 or multiples of 128 keys and V's multiples
 * of 128 (the 128-key kernels' column groups: not the 192-key ones).  The
 * decoding kernel (seqlen_q <= 16; seqused_k, block_table with fixed-length
 * batches) has LOCAL instances too.  The kernels count keys and queries in
 * an int: the window's bounds (FwdLocal) need seqlen_q + seqlen_k < 2^30. */
static fattn_status check_fwd_variants(fattn_ctx *ctx, const fattn_fwd_args *a) {
    const fattn_problem *p = &a->p;
    if (!p->window && p->softcap == 0.0f && !a->learnable_sink) return FATTN_OK;
    if (a->q.dtype == FATTN_DTYPE_E4M3) {
        if (p->softcap != 0.0f)
            return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                              "softcap %g: the CUDA engine's FP8 forward has no softcap yet (its 16-bit forward "
                              "and the CPU engine serve it)",
                              (double)p->softcap);
        if (a->learnable_sink)
            return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                              "learnable_sink: the CUDA engine's FP8 forward has no learnable sinks yet (its 16-bit "
                              "forward and the CPU engine serve them)");
        const int kb = fp8_scale_block(a->k.scale_block, p->seqlen_k), vb = fp8_scale_block(a->v.scale_block, p->seqlen_k);
        if ((kb != 1 && kb % FWD_FP8_SCALE_UNIT != 0) || vb % FWD_FP8_SCALE_UNIT != 0)
            return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                              "window with k.scale_block %d, v.scale_block %d: the CUDA FP8 window kernels take K's "
                              "1 (one scale per key) or a multiple of %d, V's a multiple of %d",
                              kb, vb, FWD_FP8_SCALE_UNIT, FWD_FP8_SCALE_UNIT);
    }
    if ((int64_t)p->seqlen_q + p->seqlen_k >= ((int64_t)1 << 30))
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "window, softcap or learnable_sink with seqlen_q %d + seqlen_k %d >= 2^30: the CUDA "
                          "engine's variant kernels count keys in an int",
                          p->seqlen_q, p->seqlen_k);
    return FATTN_OK;
}

/* An FP8 KV cache (fattn.h 0.5): e4m3 k and v with f16 / bf16 q, served by
 * the decoding kernel's KV8 instances (fwd_decode_kv8.cu) on fixed-length
 * batches of its shapes, and by the KV-cache varlen kernels' KV8 instances
 * (fwd_sm90_kvcache_kv8.cu) on varlen queries (cu_seqlens_q alone) and on
 * the other fixed-length calls (fwd_kvcache_fixed.cu), at head dims 64, 128
 * and 256.  Any scale_block: the kernels look each key's scale up. */
static fattn_status check_fwd_kv8(fattn_ctx *ctx, const fattn_fwd_args *a) {
    const fattn_problem *p = &a->p;
    if (a->q.dtype != FATTN_DTYPE_BF16 && a->q.dtype != FATTN_DTYPE_F16)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "an FP8 KV cache with q.dtype %s is not supported by the CUDA engine: q bf16 or f16 (the "
                          "CPU engine also takes f32)",
                          fattn_dtype_name(a->q.dtype));
    if (p->cu_seqlens_k)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "an FP8 KV cache (e4m3 k and v) with cu_seqlens_k (packed keys) is not supported by the "
                          "CUDA engine: a cache is read by batch entry or page (cu_seqlens_q alone; the CPU engine "
                          "serves packed keys)");
    if (p->head_dim != p->head_dim_v || (p->head_dim != 64 && p->head_dim != 128 && p->head_dim != 256))
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "an FP8 KV cache at head_dim %d (head_dim_v %d): the CUDA engine's kernels take head_dim == "
                          "head_dim_v in {64, 128, 256} (the CPU engine serves every head dim)",
                          p->head_dim, p->head_dim_v);
    return FATTN_OK;
}

static bool portable_engine(const fattn_ctx *ctx) {
    /* a context without device state (tests/test_api_errors.c's host-only checks) is Hopper's */
    return ctx->cuda && ((const fattn_cuda_state *)ctx->cuda)->engine == FATTN_ENGINE_CUDA_PORTABLE;
}

/* Who refuses, for the messages: "the portable CUDA engine (sm_86)", "the
 * Hopper CUDA engine (sm_90)"; "the CUDA engine" without device state. */
static const char *engine_words(const fattn_ctx *ctx, char *buf, size_t n) {
    const fattn_cuda_state *st = (const fattn_cuda_state *)ctx->cuda;
    if (!st) return "the CUDA engine";
    snprintf(buf, n, "the %s CUDA engine (sm_%d)", st->engine == FATTN_ENGINE_CUDA_PORTABLE ? "portable" : "Hopper",
             st->sm);
    return buf;
}

/* FlashAttention-3's serving arguments of 0.4 (fattn.h, fattn_fwd_args):
 * the CPU engine serves them all; the Hopper forward's varlen kernels
 * (kv_cache_ok) serve seqused_q with cu_seqlens_q, cache_batch_idx with
 * cu_seqlens_q alone on a dense cache, and cache_leftpad with cu_seqlens_q
 * alone, dense or paged (paged: the gather, fwd_gather.cuh) (FwdVarlen); the
 * rest is refused by name rather than ignored.  (The backward's seqused_q
 * and seqused_k: bwd_check_seqused.) */
static fattn_status check_serving_fields(fattn_ctx *ctx, const fattn_problem *p, const int32_t *seqused_q,
                                         const int32_t *cache_batch_idx, const int32_t *cache_leftpad,
                                         const int32_t *block_table, bool kv_cache_ok, const char *call) {
    /* keys in a cache: cu_seqlens_q alone, or a fixed-length batch (which
     * runs as varlen queries on the cache: fwd_kvcache_fixed.cu) */
    const bool kv_cache = kv_cache_ok && !p->cu_seqlens_k;
    const struct {
        const void *set;
        bool served;
        const char *name, *needs;
    } fields[] = {{seqused_q, kv_cache_ok && p->cu_seqlens_q, "seqused_q", "with cu_seqlens_q"},
                  {cache_batch_idx, kv_cache && !block_table, "cache_batch_idx",
                   "on a dense cache without cu_seqlens_k"},
                  {cache_leftpad, kv_cache, "cache_leftpad", "without cu_seqlens_k"}};
    char who[48];
    for (int i = 0; i < COUNT(fields); ++i)
        if (fields[i].set && !fields[i].served)
            return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                              "%s is not supported by the %s of %s here (%s; the CPU engine serves it everywhere)",
                              fields[i].name, call, engine_words(ctx, who, sizeof who),
                              kv_cache_ok ? fields[i].needs : "not on this engine");
    if (p->cu_seqlens_q && !p->cu_seqlens_k && !kv_cache_ok)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "cu_seqlens_q without cu_seqlens_k (varlen queries against fixed-length keys) is not "
                          "supported by the %s of %s yet (the CPU engine serves it)",
                          call, engine_words(ctx, who, sizeof who));
    return FATTN_OK;
}

/* The portable engine's shape limits, forward or backward: head_dim ==
 * head_dim_v among the engine's head dims, its smallest ring in this GPU's
 * shared memory, grids of at most 65535 batch entries and heads. */
static fattn_status portable_shape_check(fattn_ctx *ctx, const fattn_problem *p, bool bwd) {
    const int sm = ((const fattn_cuda_state *)ctx->cuda)->sm;
    const char *eng = bwd ? "the portable CUDA engine's backward" : "the portable CUDA engine";
    char list[64];
    if (p->head_dim != p->head_dim_v)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED, "head_dim %d != head_dim_v %d is not supported by %s (sm_%d)",
                          p->head_dim, p->head_dim_v, eng, sm);
    const int *dims = bwd ? bwd_portable_head_dims : fwd_portable_head_dims;
    const int ndims = bwd ? COUNT(bwd_portable_head_dims) : COUNT(fwd_portable_head_dims);
    bool ok = false;
    for (int i = 0; i < ndims; ++i) ok = ok || p->head_dim == dims[i];
    if (!ok)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED, "head_dim %d is not supported by %s (sm_%d); supported: %s",
                          p->head_dim, eng, sm, list_ints(list, sizeof list, dims, ndims));
    const int optin = ((const fattn_cuda_state *)ctx->cuda)->smem_optin;
    const int need = bwd ? bwd_portable_smem_need(p->head_dim, optin) : fwd_portable_smem_need(p->head_dim, optin);
    if (need)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "head_dim %d: the %s of the portable CUDA engine (sm_%d) needs %d bytes of shared memory "
                          "per block; this GPU allows %d%s",
                          p->head_dim, bwd ? "backward" : "forward", sm, need, optin,
                          bwd ? " (its forward runs; the CPU engine serves the backward)" : "");
    /* grids (query tiles or key blocks, heads, batch) */
    if (p->batch > 65535 || p->heads_q > 65535)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED, "batch %d, heads_q %d: %s takes at most 65535 of each",
                          p->batch, p->heads_q, bwd ? "the portable CUDA backward" : "the portable CUDA engine");
    return FATTN_OK;
}

/* The portable engine (portable/fwd_portable.cuh) on this context's GPU:
 * 16-bit inputs, head_dim == head_dim_v of fwd_portable_head_dims (64, 96,
 * 128, 192, 256), causal, GQA, varlen and seqused_k, the variants (window,
 * softcap, learnable sink: its LOCAL instances, with check_fwd_variants'
 * int limit); no FP8 or paged KV.  Its grid is (query tiles, heads_q,
 * batch). */
static fattn_status portable_fwd_check(fattn_ctx *ctx, const fattn_fwd_args *a) {
    const fattn_problem *p = &a->p;
    const int sm = ((const fattn_cuda_state *)ctx->cuda)->sm;
    if (a->q.dtype != FATTN_DTYPE_BF16 && a->q.dtype != FATTN_DTYPE_F16)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "q.dtype %s is not supported by the portable CUDA engine (sm_%d)%s; supported: bf16, f16",
                          fattn_dtype_name(a->q.dtype), sm,
                          a->q.dtype == FATTN_DTYPE_E4M3 ? ": it has no FP8 forward yet" : "");
    if (a->block_table)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "block_table: the portable CUDA engine (sm_%d) has no paged KV cache yet", sm);
    const fattn_status vs = check_fwd_variants(ctx, a);
    if (vs != FATTN_OK) return vs;
    return portable_shape_check(ctx, p, false);
}

extern "C" fattn_status fattn_cuda_fwd_check(fattn_ctx *ctx, const fattn_fwd_args *a) {
    const fattn_problem *p = &a->p;
    char list[64];
    /* varlen queries on a KV cache: the Hopper varlen kernels (FwdVarlen) */
    fattn_status ss = check_serving_fields(ctx, p, a->seqused_q, a->cache_batch_idx, a->cache_leftpad,
                                           a->block_table, !portable_engine(ctx), "forward");
    if (ss != FATTN_OK) return ss;
    if (fwd_kv8(a) && portable_engine(ctx))
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "an FP8 KV cache (e4m3 k and v with %s q) is not served by the portable CUDA engine (sm_%d); "
                          "the Hopper engine's decoding kernel and the CPU engine serve it",
                          fattn_dtype_name(a->q.dtype), ((const fattn_cuda_state *)ctx->cuda)->sm);
    if (portable_engine(ctx)) return portable_fwd_check(ctx, a);
    bool ok = false;
    for (int i = 0; i < COUNT(fwd_dtypes); ++i) ok = ok || a->q.dtype == fwd_dtypes[i];
    if (!ok)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "q.dtype %s is not supported by the CUDA engine's forward yet; supported: %s",
                          fattn_dtype_name(a->q.dtype), list_dtypes(list, sizeof list, fwd_dtypes, COUNT(fwd_dtypes)));
    if (a->q.dtype == FATTN_DTYPE_E4M3) {
        if (a->o.dtype != FATTN_DTYPE_BF16 && a->o.dtype != FATTN_DTYPE_F16)
            return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                              "o.dtype %s with e4m3 inputs is not supported by the CUDA engine; supported: bf16, f16",
                              fattn_dtype_name(a->o.dtype));
        const int kb = fp8_scale_block(a->k.scale_block, p->seqlen_k), vb = fp8_scale_block(a->v.scale_block, p->seqlen_k);
        /* head dim 128 also has 192-key kernels: K and V blocks both multiples
         * of FWD_FP8_SCALE_UNIT_D128 (fwd_sm90_pick) */
        const bool d128_wide =
            p->head_dim == 128 && kb % FWD_FP8_SCALE_UNIT_D128 == 0 && vb % FWD_FP8_SCALE_UNIT_D128 == 0;
        if (!d128_wide && ((kb > 1 && kb % FWD_FP8_SCALE_UNIT != 0) || vb % FWD_FP8_SCALE_UNIT != 0))
            return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                              "k.scale_block %d, v.scale_block %d are not supported by the CUDA FP8 kernels: K's 1 (one "
                              "scale per key) or a multiple of %d, V's a multiple of %d; at head dim 128 also both "
                              "multiples of %d",
                              kb, vb, FWD_FP8_SCALE_UNIT, FWD_FP8_SCALE_UNIT, FWD_FP8_SCALE_UNIT_D128);
    }
    if (fwd_kv8(a)) {
        fattn_status ks = check_fwd_kv8(ctx, a);
        if (ks != FATTN_OK) return ks;
    }
    fattn_status vs = check_fwd_variants(ctx, a);
    if (vs != FATTN_OK) return vs;
    if (p->head_dim != p->head_dim_v && !(p->head_dim == 192 && p->head_dim_v == 128))
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "head_dim %d != head_dim_v %d is not supported by the Hopper kernels (only 192 with 128)",
                          p->head_dim, p->head_dim_v);
    ok = false;
    for (int i = 0; i < COUNT(fwd_head_dims); ++i) ok = ok || p->head_dim == fwd_head_dims[i];
    if (!ok)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "head_dim %d is not supported by the Hopper kernels; supported: %s", p->head_dim,
                          list_ints(list, sizeof list, fwd_head_dims, COUNT(fwd_head_dims)));
    /* head dims 96 and 192 (issue 37): the 16-bit kernels only */
    bool fp8_dim = false;
    for (int i = 0; i < COUNT(fwd_fp8_head_dims); ++i) fp8_dim = fp8_dim || p->head_dim == fwd_fp8_head_dims[i];
    if (!fp8_dim && a->q.dtype == FATTN_DTYPE_E4M3)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "head_dim %d with e4m3 inputs is not supported by the Hopper FP8 kernels; supported: %s "
                          "(16-bit inputs also take 96 and 192)",
                          p->head_dim, list_ints(list, sizeof list, fwd_fp8_head_dims, COUNT(fwd_fp8_head_dims)));
    /* Variable-length batches: 16-bit, with the packed rows given (api.c
     * takes the extents from total_q/total_k: nothing reads cu_seqlens on
     * the host); the kernel reads cu_seqlens on the device */
    if ((p->cu_seqlens_q || p->cu_seqlens_k) && a->q.dtype == FATTN_DTYPE_E4M3)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "variable-length batches (cu_seqlens_q/k) with e4m3 inputs are not supported by the CUDA engine");
    /* the varlen kernels count tiles over the padded batch x seqlen_q (the
     * max) x heads_q in an int; 64 rows per tile bounds every instance's */
    const int64_t tiles = (int64_t)p->batch * ((p->seqlen_q + 63) / 64) * p->heads_q;
    if ((p->cu_seqlens_q || p->cu_seqlens_k) && tiles > INT32_MAX)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "variable-length batch of %d sequences, the longest %d queries, %d heads: batch x "
                          "ceil(seqlen_q / 64) x heads_q exceeds 2^31 - 1 tiles for the CUDA engine",
                          p->batch, p->seqlen_q, p->heads_q);
    /* (api.c refuses block_table with cu_seqlens_k on every engine) */
    /* varlen queries on a paged cache: any page_size.  The varlen kernels
     * load a key block in TMA boxes of gcd(its rows, page_size) rows when
     * that is a multiple of 8 (a box must start on a 128-byte swizzle
     * atom), else their producer warpgroup gathers the rows with cp.async
     * (page_div.h, fwd_gather.cuh) */
    /* fixed-length seqused_k, paged K/V and FP8 caches: the decoding kernel
     * where it takes the call (fwd_fixed_kv_decodes), else the KV-cache
     * varlen kernels on the queries as a varlen batch of equal lengths
     * (fwd_kvcache_fixed.cu), which needs q and o packed along the batch */
    if (fwd_fixed_kv(a) && !fwd_fixed_kv_decodes(a)) {
        const fattn_tensor *t[2] = {&a->q, &a->o};
        for (int i = 0; i < 2; ++i)
            if (p->batch > 1 && t[i]->stride_batch != (int64_t)p->seqlen_q * t[i]->stride_seq)
                return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                                  "%s on a fixed-length batch past the CUDA decoding kernel's shapes (seqlen_q %d, "
                                  "%d rows a kv head%s) runs as variable-length queries on the cache, which needs %s "
                                  "packed along the batch (stride_batch %lld = seqlen_q x stride_seq %lld); or pass "
                                  "cu_seqlens_q yourself",
                                  a->block_table ? "block_table" : a->seqused_k ? "seqused_k" : "an FP8 KV cache",
                                  p->seqlen_q, p->seqlen_q * (p->heads_q / p->heads_kv),
                                  a->block_table ? ", or a page_size other than 2^k >= 8" : "", i ? "o" : "q",
                                  (long long)t[i]->stride_batch, (long long)t[i]->stride_seq);
        if ((int64_t)p->batch * p->seqlen_q > INT32_MAX || tiles > INT32_MAX)
            return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                              "a fixed-length KV-cache call of batch %d x seqlen_q %d x %d heads exceeds 2^31 - 1 "
                              "rows or tiles for the CUDA engine's KV-cache kernels",
                              p->batch, p->seqlen_q, p->heads_q);
    }
    return FATTN_OK;
}

/* What the Hopper backward serves (src/cuda/hopper/instances/bwd_sm90*.cu):
 * head_dim == head_dim_v of these, or 192 with head_dim_v 128 (96 and 192
 * run the d128 and d256 kernels, BwdOpts.hd and hdv). */
static const int bwd_head_dims[] = {64, 96, 128, 192, 256};

/* The portable backward (portable/bwd_portable.cuh) on this context's GPU:
 * what its forward serves (16-bit, head_dim == head_dim_v of
 * bwd_portable_head_dims, causal, GQA, varlen), the deterministic mode and,
 * varlen, seqused_q / seqused_k; no variants (window, softcap, dsink) yet. */
static fattn_status portable_bwd_check(fattn_ctx *ctx, const fattn_bwd_args *a) {
    const fattn_problem *p = &a->p;
    const int sm = ((const fattn_cuda_state *)ctx->cuda)->sm;
    if (a->q.dtype != FATTN_DTYPE_BF16 && a->q.dtype != FATTN_DTYPE_F16)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "q.dtype %s is not supported by the portable CUDA engine's backward (sm_%d); supported: "
                          "bf16, f16",
                          fattn_dtype_name(a->q.dtype), sm);
    /* learnable_sink alone is not read (dq, dk, dv need only the forward's o
     * and lse), as on the Hopper engine: only dsink is sink arithmetic */
    if (p->window || p->softcap != 0.0f || a->dsink)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "%s: the portable CUDA engine (sm_%d) has no backward variants (window, softcap, dsink) "
                          "yet; the Hopper engine and the CPU engine serve them",
                          p->window ? "window" : p->softcap != 0.0f ? "softcap" : "dsink", sm);
    fattn_status sc = portable_shape_check(ctx, p, true);
    if (sc != FATTN_OK) return sc;
    /* the workspace's 64-row blocks are counted in an int */
    if ((p->cu_seqlens_q || p->cu_seqlens_k) && (int64_t)p->heads_q * ((p->total_q + 64LL * p->batch) / 64 + 1) > INT32_MAX)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "variable-length batch: heads_q x (total_q / 64 + batch) exceeds 2^31 - 1 row blocks for the "
                          "portable CUDA backward");
    return FATTN_OK;
}

/* The backward's seqused_q and seqused_k: both engines' variable-length
 * kernels read them on the device (varlen_used: a negative entry is 0);
 * the fixed-length kernels have no field for them. */
static fattn_status bwd_check_seqused(fattn_ctx *ctx, const fattn_bwd_args *a) {
    if ((a->seqused_q || a->seqused_k) && !(a->p.cu_seqlens_q && a->p.cu_seqlens_k))
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "%s in the CUDA engine's backward needs a variable-length batch (cu_seqlens_q and "
                          "cu_seqlens_k; a fixed-length batch can be given as one with equal lengths); the CPU engine "
                          "serves it on fixed-length batches too",
                          a->seqused_q ? "seqused_q" : "seqused_k");
    return FATTN_OK;
}

extern "C" fattn_status fattn_cuda_bwd_check(fattn_ctx *ctx, const fattn_bwd_args *a) {
    const fattn_problem *p = &a->p;
    char list[64];
    /* cu_seqlens_q alone: refused; seqused_q: bwd_check_seqused's */
    fattn_status ss = check_serving_fields(ctx, p, NULL, NULL, NULL, NULL, false, "backward");
    if (ss != FATTN_OK) return ss;
    if ((ss = bwd_check_seqused(ctx, a)) != FATTN_OK) return ss;
    if (portable_engine(ctx)) return portable_bwd_check(ctx, a);
    /* learnable_sink alone is not read by the backward (dq, dk, dv come from
     * the sink-inclusive lse and o): only dsink asks for sink arithmetic */
    fattn_status vs = check_bwd_variants(ctx, a);
    if (vs != FATTN_OK) return vs;
    if (a->q.dtype != FATTN_DTYPE_BF16 && a->q.dtype != FATTN_DTYPE_F16)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "q.dtype %s is not supported by the CUDA engine's backward; supported: bf16, f16",
                          fattn_dtype_name(a->q.dtype));
    if (p->head_dim != p->head_dim_v && !(p->head_dim == 192 && p->head_dim_v == 128))
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "head_dim %d != head_dim_v %d is not supported by the Hopper backward (only 192 with 128)",
                          p->head_dim, p->head_dim_v);
    bool ok = false;
    for (int i = 0; i < COUNT(bwd_head_dims); ++i) ok = ok || p->head_dim == bwd_head_dims[i];
    if (!ok)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "head_dim %d is not supported by the Hopper backward yet; supported: %s", p->head_dim,
                          list_ints(list, sizeof list, bwd_head_dims, COUNT(bwd_head_dims)));
    /* one CTA per (key block, kv head, batch entry): grid y and z */
    if (p->batch > 65535 || p->heads_q > 65535)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "batch %d, heads_q %d: the CUDA backward takes at most 65535 of each", p->batch, p->heads_q);
    /* variable-length batches: the row blocks of the workspace are counted in an int */
    if ((p->cu_seqlens_q || p->cu_seqlens_k) && (int64_t)p->heads_q * ((p->total_q + 64LL * p->batch) / 64 + 1) > INT32_MAX)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "variable-length batch: heads_q x (total_q / 64 + batch) exceeds 2^31 - 1 row blocks for the "
                          "CUDA backward");
    return FATTN_OK;
}

/* ---- checks that need the device ---------------------------------------------- */

/* The pointer must be device memory of ctx->device (or managed). */
fattn_status cuda_check_device_ptr(fattn_ctx *ctx, const void *ptr, const char *name) {
    cudaPointerAttributes at;
    cudaError_t e = cudaPointerGetAttributes(&at, ptr);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "%s (%p) is not a CUDA pointer", name, ptr);
    }
    if (at.type != cudaMemoryTypeDevice && at.type != cudaMemoryTypeManaged)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "%s (%p) is not device memory (a CUDA context needs device pointers)",
                          name, ptr);
    if (at.device != ctx->device)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "%s (%p) lives on device %d, the context on device %d", name,
                          ptr, at.device, ctx->device);
    return FATTN_OK;
}

/* Device memory TMA can load: q, k and v. */
static fattn_status check_tma_input(fattn_ctx *ctx, const fattn_tensor *t, const char *name) {
    fattn_status s = cuda_check_device_ptr(ctx, t->data, name);
    return s != FATTN_OK ? s : cuda_check_tma_layout(ctx, t, t->dtype, name);
}

/* ---- options --------------------------------------------------------------------- */

/* ctx->options, read once per call: nothing below the entry point reads them. */
static cuda_fwd_options fwd_options(const fattn_ctx *ctx) {
    cuda_fwd_options o;
    o.overlap = !ctx->options[FATTN_OPTION_DISABLE_OVERLAP];
    o.pingpong = !ctx->options[FATTN_OPTION_DISABLE_PINGPONG];
    o.under_pv = ctx->options[FATTN_OPTION_SOFTMAX_UNDER_PV] != 0;
    o.split = !ctx->options[FATTN_OPTION_DISABLE_SPLIT];
    o.pdl = !ctx->options[FATTN_OPTION_DISABLE_PDL];
    return o;
}

/* ---- entry points ------------------------------------------------------------------ */

/* api.c has run fattn_cuda_fwd_check and its own checks on these arguments. */
extern "C" fattn_status fattn_cuda_fwd(fattn_ctx *ctx, const fattn_fwd_args *a) {
    fattn_status s;
    if ((s = check_tma_input(ctx, &a->q, "q")) != FATTN_OK) return s;
    if ((s = check_tma_input(ctx, &a->k, "k")) != FATTN_OK) return s;
    if ((s = check_tma_input(ctx, &a->v, "v")) != FATTN_OK) return s;
    if ((s = cuda_check_device_ptr(ctx, a->o.data, "o")) != FATTN_OK) return s;
    if (a->q.dtype == FATTN_DTYPE_E4M3 && (s = cuda_check_device_ptr(ctx, a->q.scale, "q.scale")) != FATTN_OK)
        return s;
    if (a->k.dtype == FATTN_DTYPE_E4M3) {
        if ((s = cuda_check_device_ptr(ctx, a->k.scale, "k.scale")) != FATTN_OK) return s;
        if ((s = cuda_check_device_ptr(ctx, a->v.scale, "v.scale")) != FATTN_OK) return s;
    }
    /* O is written with 4-byte stores at least (two 16-bit values) */
    if ((uintptr_t)a->o.data % 4 || a->o.stride_seq % 2 || a->o.stride_head % 2 || a->o.stride_batch % 2)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "o.data must be 4-byte aligned and o's strides even for the CUDA engine");
    if (a->lse) {
        if ((s = cuda_check_device_ptr(ctx, a->lse, "lse")) != FATTN_OK) return s;
        if ((uintptr_t)a->lse % 4) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "lse must be 4-byte aligned");
    }
    const struct {
        const int32_t *ptr;
        const char *name;
    } ints[] = {{a->seqused_k, "seqused_k"},
                {a->block_table, "block_table"},
                {a->p.cu_seqlens_q, "cu_seqlens_q"},
                {a->p.cu_seqlens_k, "cu_seqlens_k"},
                {a->seqused_q, "seqused_q"},
                {a->cache_batch_idx, "cache_batch_idx"},
                {a->cache_leftpad, "cache_leftpad"}};
    for (const auto &x : ints) {
        if (!x.ptr) continue;
        if ((s = cuda_check_device_ptr(ctx, x.ptr, x.name)) != FATTN_OK) return s;
        if ((uintptr_t)x.ptr % 4) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "%s must be 4-byte aligned", x.name);
    }
    /* read by the kernel's epilogue (api.c checked its alignment) */
    if (a->learnable_sink && (s = cuda_check_device_ptr(ctx, a->learnable_sink, "learnable_sink")) != FATTN_OK)
        return s;
    if (portable_engine(ctx)) return fwd_portable_launch(ctx, a);
    const cuda_fwd_options opt = fwd_options(ctx);
    if (a->q.dtype == FATTN_DTYPE_E4M3 && !a->p.cu_seqlens_k) {
        fattn_fwd_args b = *a; /* per-head K/V scales as a block the kernels take */
        b.k.scale_block = fp8_scale_block(a->k.scale_block, a->p.seqlen_k);
        b.v.scale_block = fp8_scale_block(a->v.scale_block, a->p.seqlen_k);
        return fwd_sm90_launch(ctx, &b, &opt);
    }
    return fwd_sm90_launch(ctx, a, &opt);
}

/* api.c has run fattn_cuda_bwd_check and its own checks on these arguments. */
extern "C" fattn_status fattn_cuda_bwd(fattn_ctx *ctx, const fattn_bwd_args *a) {
    fattn_status s;
    if ((s = check_tma_input(ctx, &a->q, "q")) != FATTN_OK) return s;
    if ((s = check_tma_input(ctx, &a->k, "k")) != FATTN_OK) return s;
    if ((s = check_tma_input(ctx, &a->v, "v")) != FATTN_OK) return s;
    if ((s = check_tma_input(ctx, &a->dout, "dout")) != FATTN_OK) return s;
    if ((s = cuda_check_device_ptr(ctx, a->o.data, "o")) != FATTN_OK) return s;
    if ((s = cuda_check_device_ptr(ctx, a->lse, "lse")) != FATTN_OK) return s;
    const struct {
        const fattn_tensor *t;
        const char *name;
    } outs[] = {{&a->dq, "dq"}, {&a->dk, "dk"}, {&a->dv, "dv"}};
    for (const auto &x : outs) {
        if ((s = cuda_check_device_ptr(ctx, x.t->data, x.name)) != FATTN_OK) return s;
        /* written with 4-byte stores (two 16-bit values) */
        if ((uintptr_t)x.t->data % 4 || x.t->stride_seq % 2 || x.t->stride_head % 2 || x.t->stride_batch % 2)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "%s.data must be 4-byte aligned and %s's strides even for the CUDA engine", x.name,
                              x.name);
    }
    /* int32 arrays the kernels read (api.c checked their alignment); their
     * entries are not read on the host, as the forward's seqused_k */
    const struct {
        const int32_t *ptr;
        const char *name;
    } ints[] = {{a->p.cu_seqlens_q, "cu_seqlens_q"},
                {a->p.cu_seqlens_k, "cu_seqlens_k"},
                {a->seqused_q, "seqused_q"},
                {a->seqused_k, "seqused_k"}};
    for (const auto &x : ints)
        if (x.ptr && (s = cuda_check_device_ptr(ctx, x.ptr, x.name)) != FATTN_OK) return s;
    if (portable_engine(ctx)) return bwd_portable_launch(ctx, a);
    return bwd_sm90_launch(ctx, a);
}
