/* fwd_sm90_dispatch.h - the Hopper forward's kernel choice: the shipped
 * kernels by name, the options of a call (read once, at dispatch), and the
 * tile-size function that maps a problem to a kernel. */
#pragma once
#include "../../cuda_engine.h"

/* The call's dtype and mask, and its options (the paper's ablation knobs,
 * split, PDL: cuda_fwd_options, read once by entry.cu). */
struct fwd_variant : cuda_fwd_options {
    bool bf16, causal; /* bf16: of the output (16-bit calls: of every tensor) */
    bool fp8, kcol;    /* e4m3 inputs; one K scale per key */
    bool fp8_kv192;    /* FP8: K and V scale blocks are multiples of 192 keys (and K's not per key) */
    bool local;        /* a window, softcap or learnable sink: the LOCAL kernels (never split) */
    /* the full design: every fp16 call, and bf16 unless the ablation turned
     * a technique off (the ablation's variants are bf16 only) */
    bool full_design() const { return !bf16 || (overlap && pingpong && !under_pv); }
};

/* The shipped kernels, one per entry of fwd_kernels.def (their options:
 * fwd_sm90_kernels.cuh's fwd_kernel_opts). */
enum fwd_kernel {
#define FWD_KERNEL(E, NAME, D, DV, RUN, OPTS) E,
#include "fwd_kernels.def"
    FWD_KERNEL_COUNT_ /* not a kernel: the number of them */
};
/* Each kernel's short name (bench programs print it), head dims (D, DV). */
inline constexpr const char *fwd_kernel_names[FWD_KERNEL_COUNT_] = {
#define FWD_KERNEL(E, NAME, D, DV, RUN, OPTS) NAME,
#include "fwd_kernels.def"
};
inline constexpr int fwd_kernel_hdims[FWD_KERNEL_COUNT_][2] = {
#define FWD_KERNEL(E, NAME, D, DV, RUN, OPTS) {D, DV},
#include "fwd_kernels.def"
};
/* FP8 or 16-bit: its RUN (fwd_sm90_kernels.cuh checks its options agree) */
#define FWD_RUN_FP8_kernel false
#define FWD_RUN_FP8_ablated false
#define FWD_RUN_FP8_fp8 true
inline constexpr bool fwd_kernel_fp8[FWD_KERNEL_COUNT_] = {
#define FWD_KERNEL(E, NAME, D, DV, RUN, OPTS) FWD_RUN_FP8_##RUN,
#include "fwd_kernels.def"
};

/* The tile-size function: which kernel serves this problem (head dim 64,
 * 96, 128, 192 or 256, and 192 with head_dim_v 128; checked by the caller). */
fwd_kernel fwd_sm90_pick(const fattn_problem *pr, const fwd_variant &v);

fattn_status fwd_sm90_hdim64(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v, fwd_kernel k);
fattn_status fwd_sm90_hdim128(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v, fwd_kernel k);
fattn_status fwd_sm90_hdim256(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v, fwd_kernel k);
fattn_status fwd_sm90_hdim96(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v, fwd_kernel k);
fattn_status fwd_sm90_hdim192(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v, fwd_kernel k);
fattn_status fwd_sm90_hdim192_128(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v, fwd_kernel k);
fattn_status fwd_sm90_fp8_hdim64(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v, fwd_kernel k);
fattn_status fwd_sm90_fp8_hdim128(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v, fwd_kernel k);
fattn_status fwd_sm90_fp8_hdim256(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v, fwd_kernel k);

/* Decoding (fwd_decode.cu): seqlen_q <= FWD_DECODE_MAX_SEQLEN_Q queries whose
 * GQA group packs into one tile of <= FWD_DECODE_MAX_ROWS rows (group x
 * seqlen_q; half that at head dim 256), 16-bit q (with a 16-bit or an FP8 cache), fixed-length batches; the
 * only path for seqused_k, paged K/V and FP8 caches on the CUDA engine. */
#define FWD_DECODE_MAX_SEQLEN_Q 16
#define FWD_DECODE_MAX_ROWS 64
/* d256 with 64 rows spilled 96 bytes (4 row blocks: S of 64 keys beside O and Q);
 * its instances are head dims 64, 128 and 256 (head_dim == head_dim_v) */
inline int fwd_decode_max_rows(int head_dim) { return head_dim == 256 ? FWD_DECODE_MAX_ROWS / 2 : FWD_DECODE_MAX_ROWS; }
/* An FP8 KV cache (e4m3 k and v, 16-bit q; fwd_decode_kv8.cu): the decoding
 * kernel's shapes only, until the paged prefill exists (entry.cu refuses
 * the others). */
inline bool fwd_kv8(const fattn_fwd_args *a) {
    return a->k.dtype == FATTN_DTYPE_E4M3 && a->q.dtype != FATTN_DTYPE_E4M3;
}
/* The rows a call's instances take: an FP8 cache at d256 16 (with 32 rows
 * its scales beside O, Q and S spilled at 255 registers) */
inline int fwd_decode_max_rows_of(const fattn_fwd_args *a) {
    return fwd_kv8(a) && a->p.head_dim == 256 ? FWD_DECODE_MAX_ROWS / 4 : fwd_decode_max_rows(a->p.head_dim);
}
bool fwd_decode_eligible(const fattn_fwd_args *a);
/* The decoding kernel's variants (its LOCAL instances): all but softcap at
 * head dim 256 with more than 16 rows (DecCfg::SOFTCAP) */
inline bool fwd_decode_softcap_ok(const fattn_fwd_args *a) {
    return a->p.softcap == 0.f || a->p.head_dim != 256 || a->p.heads_q / a->p.heads_kv * a->p.seqlen_q <= 16;
}
/* A fixed-length call with a KV cache's fields (block_table, seqused_k, an
 * FP8 cache, cache_batch_idx, cache_leftpad) ... */
inline bool fwd_fixed_kv(const fattn_fwd_args *a) {
    return !a->p.cu_seqlens_q && !a->p.cu_seqlens_k &&
           (a->seqused_k || a->block_table || fwd_kv8(a) || a->cache_batch_idx || a->cache_leftpad);
}
/* ... which the decoding kernel takes (its shapes, softcap, pages of 2^k >= 8
 * rows: TMA boxes at shifts; no batch index or left pad); the others run as
 * a varlen batch of equal query counts on the KV-cache kernels
 * (fwd_kvcache_fixed.cu) */
inline bool fwd_fixed_kv_decodes(const fattn_fwd_args *a) {
    return fwd_decode_eligible(a) && fwd_decode_softcap_ok(a) && !a->cache_batch_idx && !a->cache_leftpad &&
           (!a->block_table || (a->page_size >= 8 && (a->page_size & (a->page_size - 1)) == 0));
}
fattn_status fwd_kvcache_fixed(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v);
/* Variable-length batches (cu_seqlens; fwd_sm90_varlen.cu): 16-bit; head
 * dims 96, 192 and 192/128 in files of their own (fwd_sm90_varlen_hdim*.cu). */
fattn_status fwd_sm90_varlen(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v);
fattn_status fwd_sm90_varlen_hdim96(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v);
/* varlen queries on an FP8 KV cache (fwd_sm90_kvcache_kv8.cu): head dims 64, 128, 256 */
fattn_status fwd_sm90_kvcache_kv8(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v);
fattn_status fwd_sm90_varlen_hdim192(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v);
fattn_status fwd_sm90_varlen_hdim192_128(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v);
fattn_status fwd_decode_launch(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v);
fattn_status fwd_decode_kv8_launch(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v);
