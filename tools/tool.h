/* tool.h - what the `fattn` subcommands share: option parsing, buffers on
 * the host or the GPU, random inputs, timing and the FP64 reference. */
#ifndef FATTN_TOOL_H
#define FATTN_TOOL_H

#include <stddef.h>
#include <stdint.h>

#include "fattn.h"

/* Exit status for a bad command line. */
#define TOOL_EXIT_USAGE 2

/* One-line error on stderr, exit 2. */
void tool_usage_error(const char *cmd, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3), noreturn))
#endif
    ;
/* One-line error on stderr, exit 1. */
void tool_die(const char *cmd, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3), noreturn))
#endif
    ;

/* "--name value" or "--name=value": returns the value and advances *i, or
 * NULL when argv[*i] is not that option. */
const char *tool_opt(const char *cmd, int argc, char **argv, int *i, const char *name);
int32_t tool_parse_int(const char *cmd, const char *opt, const char *s, int32_t min, int32_t max);
uint64_t tool_parse_u64(const char *cmd, const char *opt, const char *s);
fattn_dtype tool_parse_dtype(const char *cmd, const char *s);
fattn_backend tool_parse_backend(const char *cmd, const char *s);
/* Comma-separated list of ints; returns the count (at most max). */
int tool_parse_list(const char *cmd, const char *opt, const char *s, int32_t *out, int max, int32_t min);
/* "Q" (heads_kv = Q) or "Q/KV" (GQA / MQA); Q a multiple of KV. */
void tool_parse_heads(const char *cmd, const char *opt, const char *s, int32_t *heads_q,
                      int32_t *heads_kv);

/* Longest --varlen list. */
#define TOOL_MAX_SEQS 4096
/* --varlen's nq lengths and --varlen-k's nk (0: not given): usage errors for
 * --varlen-k without --varlen or with another count; lens_k = lens_q when
 * --varlen-k is not given. */
void tool_varlen_lens(const char *cmd, int nq, int nk, const int32_t *lens_q, int32_t *lens_k);
/* "3,5,7" for a report (cut short after ~60 characters). */
void tool_lens_text(char *buf, size_t size, const int32_t *lens, int n);

/* Context for the requested backend (AUTO: GPU when present). */
fattn_ctx *tool_ctx(const char *cmd, fattn_backend backend, int threads);
const char *tool_backend_name(fattn_backend b);

/* Buffers where ctx computes. */
void *tool_alloc(const char *cmd, const fattn_ctx *ctx, size_t bytes);
void tool_free(const fattn_ctx *ctx, void *p);
void tool_upload(const char *cmd, const fattn_ctx *ctx, void *dst, const void *src, size_t bytes);
void tool_download(const char *cmd, const fattn_ctx *ctx, void *dst, const void *src, size_t bytes);
void tool_poison(const char *cmd, const fattn_ctx *ctx, void *p, size_t bytes);

/* Random N(0,1) values converted to dtype (f32/f16/bf16). */
void tool_fill_random(void *dst, fattn_dtype dtype, size_t n, uint64_t seed);
double tool_load(const void *p, fattn_dtype dtype, size_t i);

/* Runs fattn_fwd `iters` times and returns the median time in ms (GPU: CUDA
 * events on the context's stream; CPU: wall clock).  `warmup` runs first. */
double tool_time_fwd(const char *cmd, fattn_ctx *ctx, const fattn_fwd_args *a, int warmup,
                     int iters);
/* The same for fattn_fwd_fp8 with these options (quantise + attend, end to
 * end); fp8 NULL times fattn_fwd. */
double tool_time_fwd_fp8(const char *cmd, fattn_ctx *ctx, const fattn_fwd_args *a, const fattn_fp8_options *fp8,
                         int warmup, int iters);
/* The median time in ms of a round of the ncalls calls a[0..ncalls-1] of
 * fattn_fwd, back to back (timed as tool_time_fwd, over the whole round). */
double tool_time_fwd_calls(const char *cmd, fattn_ctx *ctx, const fattn_fwd_args *a, int ncalls,
                           int warmup, int iters);
/* FLOPs of a forward as DESIGN.md section 7 counts them (the PV half over head_dim_v). */
double tool_fwd_flops(const fattn_problem *p);
/* Median of n doubles (sorts in place). */
double tool_median(double *x, int n);

/* Peak resident set size of this process in MiB (getrusage). */
double tool_peak_rss_mib(void);

/* Problem on packed BSHD buffers, inputs random, with host copies of q, k, v
 * for the reference.  The serving fields (tool_problem_varlen, _seqused,
 * _page) keep the host copies as they are: packed, contiguous keys. */
typedef struct tool_problem {
    fattn_fwd_args a;
    void *hq, *hk, *hv; /* host copies (dtype) */
    size_t nq, nk, nv, no;
    /* host copies of what a.p.cu_seqlens_q/_k, a.seqused_k and a.block_table
     * point to (where ctx computes); NULL when not used */
    int32_t *hcu_q, *hcu_k, *hused, *htable;
} tool_problem;

void tool_problem_init(const char *cmd, fattn_ctx *ctx, tool_problem *tp, const fattn_problem *p,
                       fattn_dtype dtype, uint64_t seed);
/* A variable-length batch: p->batch sequences of lens_q[b] queries and
 * lens_k[b] keys, packed [total, heads, dim]; p's seqlen_q / seqlen_k are
 * set to the longest, total_q / total_k to the packed rows (p's cu_seqlens
 * and totals are ignored: made here, the arrays where ctx computes). */
void tool_problem_init_varlen(const char *cmd, fattn_ctx *ctx, tool_problem *tp,
                              const fattn_problem *p, const int32_t *lens_q,
                              const int32_t *lens_k, fattn_dtype dtype, uint64_t seed);
/* seqused_k: every sequence uses its first `used` keys. */
void tool_problem_seqused(const char *cmd, fattn_ctx *ctx, tool_problem *tp, int32_t used);
/* A paged cache of the same keys: k and v become pools of
 * batch * ceil(seqlen_k / page_size) pages of page_size rows, the block
 * table a permutation of them drawn from `seed`; the rows past seqlen_k of
 * each sequence's last page are zeros.  Fixed-length batches only. */
void tool_problem_page(const char *cmd, fattn_ctx *ctx, tool_problem *tp, int32_t page_size,
                       uint64_t seed);
void tool_problem_free(fattn_ctx *ctx, tool_problem *tp);
/* Sequence b's query count, key count (before seqused_k) and keys read. */
void tool_problem_seq(const tool_problem *tp, int64_t b, int64_t *qlen, int64_t *klen,
                      int64_t *used);
/* FLOPs of tp's call: 4 * heads_q * head_dim per visible (query, key) pair,
 * summed over the sequences (keys cut to seqused_k, the causal mask's pairs
 * counted exactly). */
double tool_problem_flops(const tool_problem *tp);

/* FLOPs of tp's call as DESIGN.md section 7 counts them, sequence by
 * sequence: 4 * heads_q * head_dim * qlen * klen, halved when causal and
 * qlen == klen (the keys cut to seqused_k); a causal sequence of other
 * lengths counts its visible pairs exactly (as tool_problem_flops). */
double tool_problem_design_flops(const tool_problem *tp);
/* Sequence b of tp as a fixed-length call of batch 1 (seqlen_q its queries,
 * seqlen_k the keys it uses) on views of tp's buffers: the same tokens, its
 * output written in place; no cu_seqlens, seqused_k or lse.  Not for a paged
 * cache, nor a sequence of no queries or keys (exit 1). */
void tool_problem_seq_args(const char *cmd, const tool_problem *tp, int64_t b,
                           fattn_fwd_args *out);

/* Error of the output on `nsamples` sampled rows against an FP64 reference:
 * relative Frobenius error of those rows and the max absolute error. */
void tool_check_rows(const char *cmd, fattn_ctx *ctx, const tool_problem *tp, int nsamples,
                     uint64_t seed, double *rel_fro, double *max_abs);

#endif
