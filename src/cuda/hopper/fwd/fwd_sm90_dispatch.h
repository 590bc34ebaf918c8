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

/* The shipped kernels (fwd_sm90_kernels.cuh gives each one's options). */
enum fwd_kernel {
    FWD_D64_CAUSAL,      /* 192 x 128, 3 consumer warpgroups: seqlen_k >= 512 */
    FWD_D64_CAUSAL_2WG,  /* 128 x 128: shorter keys */
    FWD_D64,             /* 192 x 128, non-causal */
    FWD_D128_CAUSAL,     /* 128 x 128: seqlen_k < 8192 */
    FWD_D128_CAUSAL_176, /* 128 x 176: longer keys */
    FWD_D128_160,        /* non-causal: the key block whose padded keys cost least */
    FWD_D128_176,
    FWD_D128_192,
    FWD_D256_CAUSAL,     /* 128 x 80 */
    FWD_D256_PAIRED,     /* 128 x 80, CTA pairs share K/V (an even number of query blocks) */
    FWD_D256,            /* 128 x 80, single CTAs */
    FWD_FP8_D64_CAUSAL,  /* FP8 (e4m3 inputs): 192 x 128 (3 consumer warpgroups) */
    FWD_FP8_D64,
    FWD_FP8_D128_CAUSAL, /* 128 x 128 */
    FWD_FP8_D128,
    FWD_FP8_D128_192_CAUSAL, /* 128 x 192, where the K and V scale blocks are multiples of 192 */
    FWD_FP8_D128_192,
    FWD_FP8_D256_CAUSAL, /* 128 x 64 */
    FWD_FP8_D256,
    /* the variants (issue 37: window, softcap, learnable sinks; FP8: the
     * window only): each the head dim's causal kernel with its window at
     * runtime (FwdOpts.local) */
    FWD_D64_LOCAL,       /* 192 x 128 */
    FWD_D128_LOCAL,      /* 128 x 128 */
    FWD_D256_LOCAL,      /* 128 x 80 */
    FWD_FP8_D64_LOCAL,   /* 192 x 128 */
    FWD_FP8_D128_LOCAL,  /* 128 x 128 */
    FWD_FP8_D256_LOCAL,  /* 128 x 64 */
    /* head dims 96, 192 and 192 with head_dim_v 128 (issue 37; 16-bit;
     * compiled with no spills, tiles after FlashAttention-3's tile_size.h) */
    FWD_D96_CAUSAL,      /* 128 x 128 */
    FWD_D96,             /* 128 x 176 */
    FWD_D96_LOCAL,       /* 128 x 128 */
    FWD_D192_CAUSAL,     /* 128 x 112 */
    FWD_D192,            /* 128 x 112 */
    FWD_D192_LOCAL,      /* 128 x 112 */
    FWD_D192_128_CAUSAL, /* 128 x 128, V and O of head dim 128 (MLA prefill) */
    FWD_D192_128,        /* 128 x 128 */
    FWD_D192_128_LOCAL,  /* 128 x 128 */
    FWD_KERNEL_COUNT_    /* not a kernel: the number of them */
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

/* A paged KV cache in the variable-length forward (FwdVarlen): each key
 * block of bn rows is loaded in boxes of gcd(bn, page_size) rows, so that no
 * box crosses a page; entry.cu asks for page sizes that make it >= 16. */
inline int fwd_kv_box(int bn, int page_size) {
    int a = bn, b = page_size;
    while (b) {
        const int t = a % b;
        a = b;
        b = t;
    }
    return a;
}

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
/* Variable-length batches (cu_seqlens; fwd_sm90_varlen.cu): 16-bit; head
 * dims 96, 192 and 192/128 in files of their own (fwd_sm90_varlen_hdim*.cu). */
fattn_status fwd_sm90_varlen(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v);
fattn_status fwd_sm90_varlen_hdim96(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v);
fattn_status fwd_sm90_varlen_hdim192(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v);
fattn_status fwd_sm90_varlen_hdim192_128(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v);
fattn_status fwd_decode_launch(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v);
fattn_status fwd_decode_kv8_launch(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v);
