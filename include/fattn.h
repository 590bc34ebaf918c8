/*
 * fattn.h - fused attention for NVIDIA GPUs from Ampere (sm_80) on, with
 * FlashAttention-3-style kernels on Hopper (sm_90), and a CPU engine that
 * computes the same function anywhere.
 *
 *   O = softmax(Q K^T * softmax_scale [+ causal mask]) V
 *
 * and its variants (fattn_problem, fattn_fwd_args): a sliding window,
 * logit softcapping and learnable attention sinks,
 *
 * computed without ever writing the seqlen_q x seqlen_k score matrix to memory
 * (the running-softmax loop of FlashAttention; see docs/design.md).
 *
 * This header is the documentation of the public API: if it is not written
 * here, it is not API.  Everything is plain C99; the header also compiles as
 * C++.
 *
 * Conventions
 * -----------
 * - Every call returns a fattn_status.  FATTN_OK is 0.  On failure the
 *   context's fattn_last_error() holds a one-line detail message.  Nothing in
 *   the library aborts, exits or prints.
 * - Every argument is checked before any work starts.  A rejected call writes
 *   nothing to its outputs.
 * - Pointers live where the context computes: host memory for a CPU context,
 *   device memory of the context's device for a CUDA context (this includes
 *   cu_seqlens, seqused_q, seqused_k, cache_batch_idx, cache_leftpad,
 *   block_table and cache_seqlens arrays, LSE and quantisation scales).
 * - Sizes are int32_t, strides are int64_t and counted in ELEMENTS (not bytes).
 *   Index arithmetic inside the library is 64-bit; sizes whose products do not
 *   fit the engine's limits are rejected with FATTN_ERROR_INVALID_ARGUMENT.
 *   On every call, every tensor (a page pool counted as num_pages x
 *   page_size rows) must hold fewer than 2^31 (batch, token, head) rows.
 *   Arrays indexed by sequence (cu_seqlens, seqused_q, seqused_k,
 *   cache_batch_idx, cache_leftpad, cache_seqlens, the batch x
 *   max_pages_per_seq block_table) have no limit of their own: the
 *   library indexes them in 64 bits and reads only the entries the call
 *   uses, so they must be as large as the sizes declare.
 * - Tensors are 4-D [batch, seqlen, heads, head_dim] ("BSHD") with the head
 *   dimension contiguous.  Any other layout whose head dim is contiguous
 *   (e.g. BHSD) is described through strides.  Inputs do not broadcast:
 *   along every dimension of size > 1 the stride must be at least head_dim
 *   (INVALID_ARGUMENT otherwise), so a view expanded with stride 0 (torch's
 *   expand()) must be materialised first; GQA and MQA are heads_kv, not a
 *   broadcast of k and v over the query heads.
 * - Every pointer is aligned for its elements, on every engine: f32 data,
 *   lse and e4m3 scales 4 bytes, f16/bf16 data 2 bytes, cu_seqlens and
 *   the other int32 arrays (seqused_q/k, cache_batch_idx, cache_leftpad,
 *   block_table, cache_seqlens) 4 bytes (INVALID_ARGUMENT otherwise; the CUDA engine asks for more, see
 *   fattn_fwd).
 * - Outputs never overlap (INVALID_ARGUMENT otherwise), checked with
 *   interval tests that read no memory:
 *   . an output's own elements are distinct.  The test is sufficient, not
 *     necessary: with its dimensions of size > 1 sorted by stride (head_dim,
 *     stride 1, innermost), each stride must be at least the extent in
 *     elements of the dimensions inside it, e.g. rows of o with
 *     stride_seq == stride_head == head_dim_v and heads_q > 1 are refused,
 *     and so is a layout whose dimensions interleave even where no two
 *     elements coincide;
 *   . the bytes an output spans, from its first element to its last (the
 *     strides are non-negative), share none with the bytes any input spans
 *     (tensors, lse of the backward, e4m3 scales, cu_seqlens, seqused_q,
 *     seqused_k, cache_batch_idx, cache_leftpad, block_table,
 *     cache_seqlens; a page pool spans all num_pages pages) or
 *     another output spans (o and lse; dq, dk and dv; quantize's out and
 *     out.scale; kv_append's k_cache and v_cache).
 *     An output interleaved with an input inside one buffer is refused even
 *     where their elements are disjoint.  Inputs may overlap one another
 *     (k and v may be the same memory, q, k and v slices of one packed
 *     buffer).
 */
#ifndef FATTN_H
#define FATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32) && defined(FATTN_BUILD_SHARED)
#define FATTN_API __declspec(dllexport)
#elif defined(__GNUC__)
#define FATTN_API __attribute__((visibility("default")))
#else
#define FATTN_API
#endif

/* ------------------------------------------------------------------------ */
/* Version                                                                  */
/* ------------------------------------------------------------------------ */

#define FATTN_VERSION_MAJOR 0
#define FATTN_VERSION_MINOR 5
#define FATTN_VERSION_PATCH 0
/* 0.2: fattn_fwd_args gained the serving fields (seqused_k, block_table,
 * page_size, num_pages, max_pages_per_seq); fattn_kv_append.  Code built
 * against 0.1's header must be rebuilt (fattn_fwd_args grew).
 * 0.3: the attention variants: fattn_problem gained the sliding window
 * (window, window_left, window_right) and softcap; fattn_fwd_args gained
 * learnable_sink, fattn_bwd_args learnable_sink and dsink.  Zero-initialised
 * structs keep 0.2's meaning; code built against 0.2's header must be
 * rebuilt (the structs grew).
 * 0.4: FlashAttention-3's serving arguments: fattn_fwd_args gained
 * seqused_q, cache_batch_idx, cache_batch and cache_leftpad, fattn_bwd_args
 * seqused_q and seqused_k; cu_seqlens_q may come without cu_seqlens_k (a
 * variable-length batch of queries against fixed-length or paged keys).
 * Zero-initialised structs keep 0.3's meaning; code built against 0.3's
 * header must be rebuilt (the structs grew).
 * 0.5: an FP8 KV cache with 16-bit queries: fattn_fwd takes e4m3 k and v
 * (with their fattn_tensor scales, one per (page or batch entry, kv head,
 * block of scale_block rows)) beside f16, bf16 or f32 q; fattn_kv_append
 * quantises f32 / f16 / bf16 new rows into e4m3 caches and writes their
 * scales (fattn_kv_append_args, FP8 caches).  No struct grew and no field
 * changed meaning: code built against 0.4's header works unchanged, and
 * every call 0.4 accepted means what it meant. */
#define FATTN_VERSION_NUMBER \
    (FATTN_VERSION_MAJOR * 10000 + FATTN_VERSION_MINOR * 100 + FATTN_VERSION_PATCH)

/* Version of the library actually linked, e.g. "0.1.0". Static storage. */
FATTN_API const char *fattn_version_string(void);
/* FATTN_VERSION_NUMBER of the library actually linked. */
FATTN_API int fattn_version_number(void);

/* ------------------------------------------------------------------------ */
/* Status codes (stable numeric values)                                     */
/* ------------------------------------------------------------------------ */

typedef enum fattn_status {
    FATTN_OK = 0,
    /* A null pointer, a size <= 0, inconsistent sizes or strides, an
     * unaligned pointer, an output that overlaps itself, an input or another
     * output (see Conventions), int32 overflow of a size product, ... */
    FATTN_ERROR_INVALID_ARGUMENT = 1,
    /* A valid request this build, engine or device cannot serve (a head dim or
     * dtype the kernel lacks, FP8 or a variant's backward on the portable
     * engine, a CUDA context on a GPU older than sm_80, ...); the message
     * names the engine and, for the CUDA engine, the architecture. */
    FATTN_ERROR_UNSUPPORTED = 2,
    /* FATTN_BACKEND_CUDA asked for, but no usable CUDA device (or the library
     * was built without CUDA). */
    FATTN_ERROR_NO_DEVICE = 3,
    FATTN_ERROR_OUT_OF_MEMORY = 4,
    /* The CUDA runtime or driver reported an error; see fattn_last_error. */
    FATTN_ERROR_CUDA = 5,
    FATTN_ERROR_INTERNAL = 6,
    /* The context is in use by a call on another thread (see Context);
     * nothing was done.  The message is in fattn_last_error(NULL) of the
     * refused thread: the context's own belongs to the call in flight. */
    FATTN_ERROR_BUSY = 7
} fattn_status;

/* Static text for a status ("invalid argument", ...). Never NULL. */
FATTN_API const char *fattn_status_string(fattn_status status);

/* ------------------------------------------------------------------------ */
/* Context                                                                  */
/* ------------------------------------------------------------------------ */

typedef enum fattn_backend {
    FATTN_BACKEND_AUTO = 0, /* CUDA on a GPU from sm_80 on, else CPU (ctx_create) */
    FATTN_BACKEND_CPU = 1,
    FATTN_BACKEND_CUDA = 2
} fattn_backend;

typedef struct fattn_ctx fattn_ctx;

/*
 * Threads.  A context serves one call at a time.  Every call that takes a
 * context (fattn_fwd, fattn_fwd_fp8, fattn_bwd, fattn_quantize, fattn_merge,
 * fattn_kv_append, fattn_ctx_set_stream, fattn_ctx_set_threads,
 * fattn_ctx_set_option) holds it, through an atomic in-use flag, from its
 * first check to its return; a call made on a context while another
 * thread's call holds it is refused with FATTN_ERROR_BUSY, without waiting
 * and without writing anything (outputs, the context's workspace and error
 * message stay as they were).  Use one context per thread, or serialise the
 * calls yourself.  fattn_ctx_free must not race with any call on the
 * context, and fattn_last_error(ctx) is the last call's message only while
 * no other call runs on it.  Different contexts are independent: calls on
 * them may run concurrently from any threads (a CPU context's calls then
 * share the library's worker pool, see fattn_ctx_set_threads).
 */

/*
 * Create a context.  `device` is the CUDA device ordinal (ignored for the CPU
 * backend).  Which engine computes, by the device's architecture:
 *
 *   device                      AUTO               CUDA
 *   none, or built without CUDA CPU                NO_DEVICE
 *   older than sm_80            CPU                UNSUPPORTED
 *   sm_90 (Hopper)              Hopper engine      Hopper engine
 *   any other from sm_80 on     portable engine    portable engine
 *   (sm_80/86/87/89 A100, RTX 30, L40S, RTX 40; sm_100/103/120 Blackwell)
 *
 * The Hopper engine is what the rest of this header calls the CUDA engine
 * (FP8, decoding, paged caches, the variants).  The portable engine
 * (FlashAttention-2's design, mma.sync) serves the 16-bit forward (head
 * dims 64, 96, 128, 192, 256 with head_dim_v equal; causal, GQA, varlen,
 * seqused_k, LSE; window, softcap, learnable_sink), the 16-bit backward
 * (the same head dims; causal, GQA, varlen with seqused_q / seqused_k,
 * deterministic), fattn_merge and fattn_kv_append; every other request
 * (e4m3 inputs, fattn_fwd_fp8, fattn_quantize, an FP8 KV cache,
 * block_table, the backward's window, softcap and dsink, other head dims,
 * the serving fields) returns UNSUPPORTED with a message naming "the portable
 * CUDA engine (sm_NN)", and writes nothing.  A call is never moved to
 * another engine: an AUTO context is a CUDA context once created (its
 * pointers are device pointers), so the caller decides (Python:
 * fattn.attention raises NotImplementedError, fattn.sdpa computes such
 * calls with a torch composite).
 *
 * Fails with INVALID_ARGUMENT (ctx NULL, unknown backend, device < 0, a bad
 * FATTN_CUDA_ENGINE where a CUDA engine would run), NO_DEVICE (CUDA asked
 * for and unavailable), UNSUPPORTED (CUDA asked for on a GPU older than
 * sm_80, or FATTN_CUDA_ENGINE=hopper on a GPU other than sm_90, AUTO
 * included), OUT_OF_MEMORY.
 *
 * FATTN_CUDA_ENGINE: read once, here, when a CUDA engine would run (CUDA,
 * or AUTO on a GPU from sm_80 on).  Unset, empty or auto: by the
 * architecture, as above; portable: the portable engine on any sm_80+ GPU,
 * Hopper included (tests, and comparisons of the two engines on one GPU);
 * hopper: the Hopper engine (sm_90 only).  fattn_ctx_engine says which ran.
 * *ctx is set to NULL on failure.  Failure details of ctx creation are
 * available through fattn_last_error(NULL) (thread-local).
 *
 * FATTN_CPU_ISA: a CPU context (asked for, or AUTO without a GPU) reads this
 * environment variable once, here, and keeps what it names for its life;
 * calls never read it.  Unset or empty: the best forward instance this CPU
 * runs (avx512, else avx2, else generic).  scalar | generic | avx2 |
 * avx2w16 | avx512 picks the CPU forward's inner loop (tests, benchmarks;
 * avx2w16 is avx512's code on AVX2 hardware, the same bits).  Any other
 * value: INVALID_ARGUMENT naming the value; an instance this CPU or build
 * cannot run: UNSUPPORTED.  The backward's kernels are always the best the
 * CPU has.
 *
 * Determinism.  On one machine, a call repeated with the same inputs and
 * the same context settings gives the same bits:
 *   - CPU engine: every call, for any thread count and any run, with the
 *     same FATTN_CPU_ISA instance (avx512 and avx2w16 give the same bits).
 *     Instances differ in vector width and FMA use, so two CPUs (or two
 *     values of FATTN_CPU_ISA) agree to rounding, not to the bit: results
 *     are not promised bit-identical across machines.
 *   - CUDA engine: see fattn_ctx_set_stream (the forward, split and
 *     captured calls) and fattn_bwd (deterministic); same GPU model and
 *     library build.
 */
FATTN_API fattn_status fattn_ctx_create(fattn_ctx **ctx, fattn_backend backend, int device);

/* Free a context and its workspace.  fattn_ctx_free(NULL) does nothing. */
FATTN_API void fattn_ctx_free(fattn_ctx *ctx);

/* The backend a context actually computes on (never AUTO). */
FATTN_API fattn_backend fattn_ctx_backend(const fattn_ctx *ctx);

/* The engine and architecture a context computes with, in words for
 * reports: "cpu", or "cuda hopper sm_90", "cuda portable sm_86", "cuda
 * portable sm_120", "cuda portable sm_90 (FATTN_CUDA_ENGINE)" when the
 * environment chose it; "" for NULL.  Owned by the context, valid until
 * fattn_ctx_free. */
FATTN_API const char *fattn_ctx_engine(const fattn_ctx *ctx);

/* CUDA contexts: the cudaStream_t (passed as void*) that later calls are
 * enqueued on; NULL = the legacy default stream.  Calls on a CUDA context are
 * asynchronous with respect to the host unless stated otherwise.  Causal
 * forward calls, and non-causal ones that split tiles along the keys (see
 * FATTN_OPTION_DISABLE_SPLIT), share per-context state, so each one waits for
 * the context's previous such call, whatever stream that ran on (even one
 * since destroyed); other calls on different streams may overlap.  For such
 * work on concurrent streams use one context per stream; a context is not for
 * use from two threads at once.  Calls may be captured into CUDA graphs: the
 * only allocation a call can make, the split workspace (16-36 MB by head dim,
 * kept until fattn_ctx_free), is never made during a capture (a captured call that
 * would need it first runs unsplit, with the same values up to rounding, as
 * does a call whose workspace cannot be allocated).  Otherwise a forward call
 * repeated on the same GPU gives the same bits.  A captured call
 * that uses the shared state is ordered by the graph's streams only, so such
 * a graph must not run concurrently with other causal or split work of the
 * same context.
 * CPU contexts: INVALID_ARGUMENT unless stream is NULL. */
FATTN_API fattn_status fattn_ctx_set_stream(fattn_ctx *ctx, void *stream);

/* CPU contexts: number of worker threads a call uses (0 = the number of
 * online CPUs, the default, counted once per process; INVALID_ARGUMENT
 * below 0).  A call uses at most 4 x the online CPUs (and 1024) whatever
 * was asked: more threads than that
 * would only wait for cores.  The workers form one pool per process, shared
 * by every CPU context: started on first need and kept asleep between
 * calls, so the process holds at most 4 x online CPUs - 1 of them.  One
 * call uses the pool at a time; a call that finds it busy with another
 * thread's call (another context) waits for it rather than starting
 * threads.  Results do not depend on the count.  CUDA contexts: ignored,
 * returns FATTN_OK. */
FATTN_API fattn_status fattn_ctx_set_threads(fattn_ctx *ctx, int threads);

/* EXPERIMENTAL: kernel knobs for experiments such as the paper's ablation.
 * Values are 0 (default) or 1.  Knobs a backend does not use are accepted and
 * ignored.  May change between releases. */
typedef enum fattn_option {
    /* CUDA forward: turn off the intra-warpgroup overlap of softmax with the
     * GEMMs (bf16, non-causal kernels of head dims 64, 128, 256; others
     * always run the full design). */
    FATTN_OPTION_DISABLE_OVERLAP = 0,
    /* CUDA forward: turn off pingpong scheduling of the consumer warpgroups
     * (bf16, non-causal kernels of head dims 64, 128, 256). */
    FATTN_OPTION_DISABLE_PINGPONG = 1,
    /* CUDA forward: launch without programmatic dependent launch (by default
     * a kernel's set-up may overlap the end of the previous kernel in the
     * stream; it waits for that kernel before touching memory). */
    FATTN_OPTION_DISABLE_PDL = 2,
    /* CUDA forward, overlapped bf16 non-causal kernels: 1 = the softmax of a
     * block always runs under the warpgroup's own PV GEMM (the paper's
     * placement of the wait); 0 (default) = per kernel, the placement that
     * measured faster (docs/perf-notes.md, v8). */
    FATTN_OPTION_SOFTMAX_UNDER_PV = 3,
    /* CUDA forward, non-causal 16-bit kernels: 1 = never split a tile's keys
     * over CTAs.  By default the tiles that do not fill the last wave of CTAs
     * (or all tiles, when there are fewer tiles than SMs) are split along
     * the keys and their pieces merged, in a fixed order, by the CTA that
     * finishes last, using a workspace the context allocates on first use
     * (docs/design.md). */
    FATTN_OPTION_DISABLE_SPLIT = 4,
    FATTN_OPTION_COUNT_ = 5
} fattn_option;

/* Set an experimental option; INVALID_ARGUMENT for an unknown option or a
 * value other than 0 or 1. */
FATTN_API fattn_status fattn_ctx_set_option(fattn_ctx *ctx, fattn_option option, int value);

/* Detail of the last failure on `ctx` (or, for ctx NULL, of the last failed
 * fattn_ctx_create on this thread).  "" when the last call succeeded.
 * Valid until the next call on the same context. */
FATTN_API const char *fattn_last_error(const fattn_ctx *ctx);

/* ------------------------------------------------------------------------ */
/* Tensors                                                                  */
/* ------------------------------------------------------------------------ */

typedef enum fattn_dtype {
    FATTN_DTYPE_F32 = 0,
    FATTN_DTYPE_F16 = 1,
    FATTN_DTYPE_BF16 = 2,
    FATTN_DTYPE_E4M3 = 3 /* float8 e4m3fn (OCP), saturating, max 448 */
} fattn_dtype;

/* Size of one element in bytes (0 for an unknown dtype). */
FATTN_API size_t fattn_dtype_size(fattn_dtype dtype);
/* "f32", "f16", "bf16", "e4m3"; "?" for an unknown dtype. */
FATTN_API const char *fattn_dtype_name(fattn_dtype dtype);

/*
 * A 4-D tensor [batch, seqlen, heads, head_dim], head_dim contiguous.
 * Strides are in elements.  All three strides 0 means packed BSHD:
 *   stride_head = head_dim, stride_seq = heads * head_dim,
 *   stride_batch = seqlen * heads * head_dim.
 * For BHSD pass stride_batch = heads*seqlen*d, stride_head = seqlen*d,
 * stride_seq = d.
 * In variable-length mode (cu_seqlens given) tensors are packed
 * [total_tokens, heads, head_dim]; stride_batch is not used (it must still be >= 0,
 * as every stride).
 *
 * e4m3 tensors carry dequantisation scales: real value = code * scale.
 * Every scale must be > 0; +Inf is allowed (it is what fattn_quantize
 * writes for a block holding Inf, and makes the block's values NaN).  A CPU
 * context reads the whole scale array on the host before any work and
 * refuses a NaN, zero or negative entry (INVALID_ARGUMENT naming it); of an
 * FP8 KV cache (e4m3 k and v beside 16-bit q, fattn_fwd) only the entries
 * of the keys the call uses.  A
 * CUDA context reads scales on the device only: there a NaN, zero,
 * negative or subnormal (< 2^-126: its kernels flush it to zero) scale
 * gives unspecified values, NaN included.
 * `scale` points to float32 [batch, heads, ceil(seqlen / scale_block)]
 * (varlen: [1, heads, ceil(total_tokens / scale_block)], blocks counted over
 * the packed token index).  Row r of batch b, head h uses
 * scale[(b * heads + h) * nblocks + r / scale_block].  Unused for other dtypes.
 * A page pool (fattn_fwd_args.block_table) counts pages as batch entries
 * and page_size as seqlen: [num_pages, heads, ceil(page_size / scale_block)].
 * A scale_block of at least seqlen gives one scale per (batch entry, head):
 * FlashAttention-3's q/k/v_descale granularity (its q_descale is per kv
 * head: repeat it over each query-head group for q's [batch, heads_q]);
 * the CUDA FP8 kernels take it for K and V whatever its value.
 */
typedef struct fattn_tensor {
    void *data;
    fattn_dtype dtype;
    int64_t stride_batch;
    int64_t stride_seq;
    int64_t stride_head;
    float *scale;         /* e4m3 only */
    int32_t scale_block;  /* e4m3 only: rows per scale, >= 1 */
} fattn_tensor;

/* Shorthand: a packed BSHD tensor with no scales. */
FATTN_API fattn_tensor fattn_tensor_bshd(void *data, fattn_dtype dtype);

/* ------------------------------------------------------------------------ */
/* The attention problem                                                    */
/* ------------------------------------------------------------------------ */

typedef struct fattn_problem {
    int32_t batch;      /* >= 1 */
    int32_t seqlen_q;   /* >= 1; varlen: max over the batch (>= 0 allowed) */
    int32_t seqlen_k;   /* >= 1; varlen: max over the batch (>= 0 allowed) */
    int32_t heads_q;    /* >= 1 */
    int32_t heads_kv;   /* >= 1, heads_q % heads_kv == 0 (GQA; 1 = MQA) */
    int32_t head_dim;   /* of Q and K */
    int32_t head_dim_v; /* of V and O; 0 = head_dim */
    float softmax_scale;/* 0 = 1 / sqrt(head_dim) */
    int32_t causal;     /* nonzero: key j is visible to query i iff
                           j <= i + seqlen_k - seqlen_q (bottom-right aligned,
                           as FlashAttention); rows that see no key get
                           O = 0 and LSE = -inf */
    /* Variable-length batches: both NULL, or both int32[batch + 1],
     * non-decreasing, starting at 0, no sequence longer than seqlen_q
     * (seqlen_k).  Sequence b has cu_seqlens_q[b+1] - cu_seqlens_q[b]
     * queries (0 allowed).  cu_seqlens_q alone (cu_seqlens_k NULL) is a
     * variable-length batch of queries against fixed-length keys: q, o and
     * lse are packed as above, k and v are [batch, seqlen_k, ...] (or a
     * cache: fattn_fwd_args, Serving), every sequence has seqlen_k keys
     * (before seqused_k); FlashAttention-3's flash_attn_with_kvcache with
     * cu_seqlens_q.  CUDA (Hopper): the forward, 16-bit, on the varlen
     * kernels (k and v dense [batch, seqlen_k, ...] or page pools of any
     * page_size >= 1; the variants too); its backward and the portable
     * engine: UNSUPPORTED.  cu_seqlens_k
     * alone is INVALID_ARGUMENT.  Checked where the arrays live, never through a
     * copy from the device:
     * - a CPU context checks them on the host before any work
     *   (INVALID_ARGUMENT);
     * - the CUDA engine never reads them on the host (a call can be captured
     *   in a CUDA graph, and nothing waits for the device): it needs
     *   total_q and total_k instead, and its kernels read cu_seqlens on the
     *   device without checking them.  What it does with arrays that break
     *   the rules above: every read and write stays inside q, k, v, o, lse
     *   (and the backward's dq, dk, dv and workspace); a sequence's start is
     *   clamped to [0, total], its length to [0, min(seqlen, total -
     *   start)] (a negative length is 0, a longer one is cut); rows that
     *   no sequence covers are not written; overlapping sequences give
     *   unspecified values in the rows they share.  Results are then not
     *   meaningful, but the call is safe.
     * - Between sequences: a key block that holds a sequence's last keys
     *   may also load the next sequence's first rows of k and v (masked out
     *   of the scores).  On the CUDA engine a NaN or Inf in those rows of v
     *   (forward), or of q, k, v or dout (backward), can reach the masked
     *   sequence's results as NaN (0 x Inf); finite values cannot. */
    const int32_t *cu_seqlens_q;
    const int32_t *cu_seqlens_k;
    /* Variable-length batches: the rows of the packed q and o (total_q =
     * cu_seqlens_q[batch]) and of k and v (total_k = cu_seqlens_k[batch]),
     * for an engine that cannot read cu_seqlens on the host; 0 = not given.
     * A CPU context reads the totals from cu_seqlens, and a nonzero total
     * must equal them (INVALID_ARGUMENT).  A CUDA context requires both
     * (>= 1, INVALID_ARGUMENT otherwise) and takes them as the packed
     * tensors' row counts.  Each 0 without its cu_seqlens. */
    int32_t total_q;
    int32_t total_k;
    /* Sliding window (FlashAttention's window_size = (left, right)).
     * window 0 (the default): no window, and window_left and window_right
     * must be 0 (INVALID_ARGUMENT otherwise, so that a window set without
     * the flag is not silently ignored).  window nonzero: query i sees key
     * j iff
     *     i + seqlen_k - seqlen_q - window_left <= j
     *                                   <= i + seqlen_k - seqlen_q + window_right
     * (per sequence: its own lengths, seqlen_k cut to seqused_k when given),
     * where -1 means unbounded on that side; each >= -1 (INVALID_ARGUMENT
     * otherwise).  (-1, -1) is no window, (-1, 0) is causal, (0, 0) the
     * diagonal key alone.  With causal the mask is the intersection:
     * causal + (left, right) is (left, 0), as FlashAttention's causal
     * overrides the right side.  Rows that see no key follow the causal
     * rule (O = 0, LSE = -inf, unless a learnable sink is given). */
    int32_t window;
    int32_t window_left;
    int32_t window_right;
    /* Logit softcapping (Gemma 2, FlashAttention's softcap): 0 = off; else
     * finite and > 0 (INVALID_ARGUMENT otherwise), and each scaled score s
     * (q.k * softmax_scale) becomes softcap * tanh(s / softcap) before the
     * mask and the softmax.  The backward multiplies dS by the derivative
     * 1 - tanh^2(s / softcap).  The LSE is of the capped scores. */
    float softcap;
} fattn_problem;

/*
 * Forward.
 *   q:  [batch, seqlen_q, heads_q,  head_dim]    f32 | f16 | bf16 | e4m3
 *   k:  [batch, seqlen_k, heads_kv, head_dim]    same dtype as q, or e4m3
 *                                                 (an FP8 KV cache, below)
 *   v:  [batch, seqlen_k, heads_kv, head_dim_v]  the dtype of k
 *   o:  [batch, seqlen_q, heads_q,  head_dim_v]  f32 | f16 | bf16
 *       (16-bit and f32 q: o.dtype == q.dtype; e4m3 q: o f16/bf16/f32)
 *   lse: optional float32 [batch, heads_q, seqlen_q] (varlen: [heads_q, total_q]),
 *        natural-log log-sum-exp of each row of scaled scores; -inf for a row
 *        that sees no key.
 * Engines: CPU: all dtypes, head_dim and head_dim_v 1..512, every variant
 *          (window, softcap, learnable_sink; fattn_fwd_fp8 too).
 *          CUDA (Hopper): f16/bf16 take every variant (window, softcap,
 *          learnable_sink), fixed-length and variable-length, on kernels of
 *          their own (the causal tiles with the window at runtime; checked
 *          on an H200: see docs/status.md); e4m3 (fattn_fwd_fp8
 *          included) takes the window with k's scale blocks 1 or multiples
 *          of 128 and v's multiples of 128, softcap and learnable_sink
 *          UNSUPPORTED; the decoding kernel (seqused_k, block_table) takes
 *          them too, but softcap at head_dim 256 with more than 16 rows
 *          (seqlen_q x heads_q / heads_kv: UNSUPPORTED); a variant needs
 *          seqlen_q + seqlen_k < 2^30.  The softcap uses the GPU's
 *          approximate tanh (relative error <= 2^-11: a capped score within
 *          softcap x 2^-11 of the exact one, as in FlashAttention-3).
 *          CUDA (portable engine): f16/bf16 take every variant (window,
 *          softcap, learnable_sink), fixed-length and variable-length, with
 *          the same semantics and limit (compiled, not yet run on a GPU).
 *          f16/bf16, and e4m3 with f16/bf16 output (q's scale
 *          blocks any size, k's 1 or a multiple of 128, v's a multiple of 128,
 *          or at head_dim 128 both multiples of 192 (then 192-key kernels
 *          run); the scales in device memory; P is rounded to e4m3 before the PV
 *          product, as in FlashAttention-3; O is accumulated in units of
 *          the current key block's v scale, so v scales that fall by more
 *          than about 2^100 from one key block of a row to the next (a
 *          block of subnormal-range values, scale 2^-126, after a block of
 *          ordinary nonzero ones) can overflow O to Inf / NaN there; the
 *          CPU engine has no such limit); head_dim == head_dim_v in
 *          {64, 128, 256}, and for f16/bf16 also in {96, 192} or head_dim
 *          192 with head_dim_v 128 (DeepSeek MLA prefill): fixed-length
 *          and variable-length, causal, GQA, window, softcap and
 *          learnable_sink; e4m3 inputs at head dims 96 and 192 are
 *          UNSUPPORTED; data pointers 16-byte aligned, strides multiples of
 *          16 bytes.  Variable-length batches (cu_seqlens, with total_q and
 *          total_k): f16/bf16 only (e4m3 UNSUPPORTED), seqused_k allowed
 *          (below), batch x ceil(seqlen_q / 64) x heads_q < 2^31.
 *          CUDA (portable engine, sm_80 on but Hopper): f16/bf16,
 *          head_dim == head_dim_v in {64, 96, 128, 192, 256}, fixed-length
 *          and variable-length, causal, GQA, seqused_k, lse, the variants
 *          (above), batch and heads_q <= 65535, the same alignment rules;
 *          e4m3, block_table, an FP8 KV cache and the serving fields
 *          UNSUPPORTED (fattn_ctx_create).
 * FP8 KV cache (0.5; FlashInfer's and vLLM's fp8 cache with 16-bit
 * queries): q f16, bf16 or f32 with k and v e4m3 (both; o.dtype ==
 * q.dtype).  Key j's K row is k's codes times its k.scale entry, its V row
 * v's codes times its v.scale entry (fattn_tensor: rows r of batch entry or
 * page e, kv head h read scale[(e * heads_kv + h) * nblocks + r /
 * scale_block]).  The two granularities a cache uses:
 *   - per (page, kv head): scale_block >= page_size, scales float32
 *     [num_pages, heads_kv, 1] (contiguous cache: scale_block >= seqlen_k,
 *     [batch or cache_batch, heads_kv, 1], one per (sequence, kv head));
 *   - per (token, kv head): scale_block = 1, scales float32 [num_pages,
 *     heads_kv, page_size] (contiguous: [batch, heads_kv, seqlen_k]).
 *   Any other scale_block >= 1 means what fattn_tensor says, on every
 *   engine.  k and v may use different scale_blocks.  fattn_kv_append
 *   writes codes and scales in this layout (fattn_kv_append_args).
 * Only the scales of the keys a row can use are read (its sequence's used
 * keys, cache_leftpad .. end - 1, through the block table): pages and
 * rows no sequence uses may hold anything, unwritten scales included.  A
 * CPU context checks those scales on the host (> 0, +Inf allowed,
 * INVALID_ARGUMENT naming the entry), a CUDA context reads them on the
 * device only (fattn_tensor's rule: a NaN, zero or negative one gives
 * unspecified values).
 * Engines: CPU: every shape, variant and serving field of fattn_fwd, any
 *   seqlen_q (the prefill of a cache is one call), f32 arithmetic on the
 *   dequantised rows, as for every dtype.  CUDA (Hopper), q f16 | bf16,
 *   head_dim == head_dim_v in {64, 128, 256}, k and v 16-byte aligned with
 *   strides multiples of 16 bytes, causal, seqused_k and the variants as
 *   for 16-bit caches:
 *   - fixed-length batches: the decoding kernel's shapes, seqlen_q <= 16
 *     and seqlen_q * heads_q / heads_kv <= 64 (16 at head_dim 256),
 *     contiguous or paged (page_size a power of two >= 8); other
 *     fixed-length calls as variable-length queries (seqused_k, below);
 *   - variable-length queries on the cache (cu_seqlens_q alone): any
 *     query counts, contiguous or paged with any page_size, and
 *     cache_batch_idx, cache_leftpad and seqused_q as for 16-bit caches.
 *     These kernels stage each key block in q's type: a row's codes times
 *     its scale, the f32 product rounded once to q's type (f16 q: values
 *     past 65504 become Inf), then the 16-bit kernels' arithmetic.
 *   cu_seqlens_k, other head dims, and the portable engine are
 *   UNSUPPORTED (the CPU engine serves them).  In the decoding kernel the
 *   codes are converted exactly to f16 and the products run in f16 with
 *   f32 sums whatever q's 16-bit type: a bf16 q row enters as f16 times a
 *   power of two that puts its largest |q| in [2^14, 2^15) (exact but for
 *   elements over 2^28 below it); K's scale multiplies the f32 scores; V's
 *   multiplies P before P is rounded to f16 for the PV product (the FP8
 *   forward's v scale placement), as its ratio to the largest v scale a
 *   warp has met so far (O carries that factor back), so P stays in
 *   [0, 1] whatever the scales' size; a product below 2^-126 flushes to
 *   zero (the kernels' f32 arithmetic flushes subnormals).
 * NaN and Inf in the inputs reach O and LSE as in torch's SDPA, through
 * the keys a row sees and nothing else:
 *   - a NaN in q makes its row's O and LSE NaN; a NaN (or a +inf score) in
 *     k makes every row that sees that key NaN; a NaN or Inf in v[j][t]
 *     makes column t of O non-finite in every row that sees key j;
 *   - a row whose scores are all -inf because of the inputs (e.g. a +Inf
 *     element of k against a negative element of q, for every key it
 *     sees) gets O = 0 and LSE = -inf, as a row that sees no key, and as
 *     torch >= 2.5 does;
 *   - CPU engine: a key a row does not see (causal mask, past seqused_k,
 *     another sequence) contributes nothing to that row, whatever k and v
 *     hold there, in every instance (FATTN_CPU_ISA).
 *   - CUDA engine: q and k cannot cross the mask (it applies to the
 *     scores), but P V runs on the tensor cores over whole key blocks, and
 *     a hidden key's P = 0 still multiplies its v (0 x NaN = 0 x Inf =
 *     NaN).  So a NaN or Inf in v[j][t] can also make column t NaN in rows
 *     that do not see key j but load its block: causal rows i with
 *     j - (i + seqlen_k - seqlen_q) < 384 (query tiles of at most 192
 *     rows visit key blocks of at most 192 keys up to their diagonal; the
 *     decoding kernel: every row of the step, seqlen_q <= 16), the
 *     neighbour sequence's rows of a variable-length batch (fattn_problem)
 *     and, with cu_seqlens, v rows past seqused_k in the block of the last
 *     used key (below).  Finite values never cross.  Rows farther from the
 *     poisoned key, other heads and other batch entries are exact.
 * The backward (either engine) follows the same rule for the rows and keys
 * that see each other; a NaN or Inf in a q, k or v row can in addition make
 * NaN the dq of other rows and the dk of other keys of the same head (the
 * exact zeros of dS multiply it: dQ = dS K, dK = dS^T Q), as torch's math
 * backward does.
 */
typedef struct fattn_fwd_args {
    fattn_problem p;
    fattn_tensor q, k, v, o;
    float *lse;
    /* Serving (all optional; zero-initialised args keep the behaviour above).
     *
     * seqused_k: int32[batch] or NULL.  Sequence b attends to its first
     *   min(seqused_k[b], its key count) keys only (its key count: seqlen_k,
     *   or its cu_seqlens_k length); the rest of its keys do not take part
     *   (a padded KV cache: whatever they hold, NaN included, cannot reach
     *   O; an engine may still load the block they share with used keys).
     *   Causal alignment then uses the used count as the sequence's
     *   seqlen_k.  A negative entry is INVALID_ARGUMENT on the CPU
     *   engine (checked on the host); the CUDA engine reads it on the device
     *   and takes a negative entry as 0 (the rows see no key: O = 0, LSE
     *   -inf).
     *
     * block_table: int32[batch][max_pages_per_seq] or NULL: a paged KV cache.
     *   k and v are then page pools: k [num_pages, page_size, heads_kv,
     *   head_dim] and v likewise, described by fattn_tensor as batch =
     *   page (stride_batch = the page stride; all three strides 0 = packed).
     *   Key j of sequence b is row j % page_size of page
     *   block_table[b * max_pages_per_seq + j / page_size].  Requires
     *   page_size, num_pages and max_pages_per_seq >= 1 and seqlen_k <=
     *   max_pages_per_seq * page_size (INVALID_ARGUMENT otherwise; without
     *   a table all three must be 0); not with cu_seqlens_k (UNSUPPORTED:
     *   give each sequence's key count in seqused_k), but with cu_seqlens_q
     *   alone (varlen queries on a paged cache); the pages of a sequence may be
     *   in any order and shared between sequences.  e4m3 pools: the scales
     *   are [num_pages, heads_kv, ceil(page_size / scale_block)], row r of
     *   page p read as row r of batch entry p.  Entries
     *   outside [0, num_pages) for the keys a sequence uses: the CPU engine
     *   checks them on the host (INVALID_ARGUMENT); the CUDA engine does not
     *   read the table on the host, and such a page reads as zeros there
     *   (TMA bounds), never out of bounds.
     * CUDA: on fixed-length batches, seqused_k and block_table (and an FP8
     *   KV cache) are served by the decoding kernel where it takes the
     *   call: 16-bit q, head_dim == head_dim_v in {64, 128, 256},
     *   seqlen_q <= 16 and seqlen_q * heads_q / heads_kv <= 64 (32 at
     *   head_dim 256, 16 with an FP8 cache), page_size a power of two >= 8
     *   (8 .. 256 tested).  Every other such call runs as the same queries
     *   given as a variable-length batch (cu_seqlens_q alone, below: any
     *   count, any page_size, head dims 96 and 192 too), which needs q and
     *   o packed along the batch (stride_batch = seqlen_q x stride_seq,
     *   else UNSUPPORTED) and uses the context's workspace (during a CUDA
     *   graph capture it must have been grown by the same call before:
     *   else UNSUPPORTED).  With cu_seqlens, seqused_k and
     *   (cu_seqlens_q alone) block_table are served by the variable-length
     *   kernels (forward and, with cu_seqlens_k, fattn_bwd; 16-bit k and
     *   v; any page_size >= 1: pages whose rows the kernel's
     *   key block (80 to 176 keys) cannot take in TMA boxes of a multiple
     *   of 8 rows, e.g. 1, 2, 4 or odd sizes, are gathered row by row, at
     *   a cost in speed not yet measured); there the rows of v past a
     *   sequence's used keys, in the key block that holds its last used key
     *   (its page, or the pages its table names past them, a page number
     *   outside the pool reading as zeros), must be finite where the pages
     *   are loaded by TMA: a NaN or Inf there reaches O as NaN (0 x Inf),
     *   as the next sequence's rows can (fattn_problem); gathered pages
     *   read no row past the used keys. */
    const int32_t *seqused_k;
    const int32_t *block_table;
    int32_t page_size;
    int32_t num_pages;
    int32_t max_pages_per_seq;
    /* Learnable attention sinks (gpt-oss; FlashAttention-4's
     * learnable_sink): NULL, or float32[heads_q], 4-byte aligned, where the
     * context computes.  Query head h's softmax gains one more column of
     * logit learnable_sink[h] (natural-log units, like the scaled and
     * capped scores: neither softmax_scale nor softcap applies to it) with
     * no value row: it enlarges every row's denominator and contributes
     * nothing to O:
     *     O_i = sum_j exp(s_ij) v_j / (exp(sink_h) + sum_j exp(s_ij)).
     * The returned LSE includes the sink, as FA4's does:
     *     LSE_i = log(exp(sink_h) + sum_j exp(s_ij)),
     * so fattn_bwd given that LSE (and the sink-scaled O) is the gradient of
     * the sink-aware forward.  A row that sees no key gets O = 0 and
     * LSE = sink_h (FA4's rule; without a sink it stays -inf).  A NaN sink
     * makes its head's rows NaN; +-Inf is not refused (+Inf gives NaN rows,
     * -Inf is no sink).  Not with fattn_merge over parts that each counted
     * the sink: a merge counts it once per part (pass it to one part). */
    const float *learnable_sink;
    /* More serving fields (0.4; FlashAttention-3's flash_attn_with_kvcache
     * and varlen arguments).  All optional: NULL / 0 keep the meaning above.
     * Arrays are int32[batch], 4-byte aligned, where the context computes.
     * With them, sequence b's queries and keys are:
     *   queries: its first qlen_b = min(seqused_q[b], its query count)
     *     rows (its query count: seqlen_q, or its cu_seqlens_q length);
     *   keys: positions leftpad_b .. end_b - 1 of its cache row, where
     *     end_b = min(seqused_k[b], its key count) (without seqused_k: its
     *     key count) and leftpad_b = cache_leftpad[b] (0 without it), in
     *     batch entry cache_batch_idx[b] of k and v (b without it; a block
     *     table maps positions to pages as above); klen_b = end_b -
     *     leftpad_b keys, FlashAttention-3's rule (its seqlen_k is
     *     seqused_k - leftpad_k, its key offset leftpad_k).
     * Causal and window alignment use qlen_b and klen_b as the sequence's
     * seqlen_q and seqlen_k: query i sees key leftpad_b + j iff j <= i +
     * klen_b - qlen_b (causal), and the window likewise.  Keys outside
     * [leftpad_b, end_b) take no part, whatever they hold (NaN included).
     *
     * seqused_q: int32[batch] or NULL.  Only the first qlen_b query rows of
     *   sequence b are computed: the rows of o and lse past them are not
     *   written (left as they were; FlashAttention-3's own tests mask
     *   those rows out before comparing, promising nothing there).
     *   Fixed-length or variable-length batches.
     * cache_batch_idx: int32[batch] or NULL.  Sequence b reads batch entry
     *   cache_batch_idx[b] of k and v (FlashAttention-3's cache_batch_idx:
     *   a cache holding more sequences than the call), each in
     *   [0, cache_batch); entries may repeat.  Not with a block table
     *   (the table already picks each sequence's pages) nor with
     *   cu_seqlens_k (packed keys have no batch entries): INVALID_ARGUMENT.
     * cache_batch: the number of batch entries of k and v (and of their
     *   e4m3 scales) with cache_batch_idx; 0 = batch.  Must be 0 without
     *   cache_batch_idx (INVALID_ARGUMENT), >= 0.
     * cache_leftpad: int32[batch] or NULL.  Sequence b's keys start at row
     *   cache_leftpad[b] of its cache row (contiguous, paged, or its
     *   cu_seqlens_k range); the rows before it take no part.  seqused_k
     *   (FlashAttention-3's cache_seqlens) still counts from row 0, pad
     *   included.  0 <= cache_leftpad[b] <= end_b (INVALID_ARGUMENT
     *   otherwise; equal: the sequence has no key, its rows get O = 0 and
     *   LSE = -inf, or the sink).  With a block table only the pages that
     *   hold positions leftpad_b .. end_b - 1 are read and checked.
     * Checks of the entries (CPU: on the host, before anything is written,
     *   INVALID_ARGUMENT naming the field, the sequence and the value):
     *   seqused_q[b] >= 0, seqused_k[b] >= 0, cache_batch_idx[b] in
     *   [0, cache_batch), 0 <= cache_leftpad[b] <= end_b, and the table
     *   entries of the pages read inside [0, num_pages).
     * CUDA (Hopper forward, 16-bit and FP8 caches): seqused_q with
     *   cu_seqlens_q (the variable-length kernels); cache_batch_idx on a
     *   dense cache and cache_leftpad on a dense cache or a block table
     *   (whose pages are then gathered whatever their size, as small pages
     *   are), with cu_seqlens_q alone or on a fixed-length batch (run as
     *   varlen queries on the cache, seqused_k above; not the decoding
     *   kernel); the CUDA backward (both engines) takes seqused_q with
     *   cu_seqlens_q and cu_seqlens_k (fattn_bwd_args).  Elsewhere, and in
     *   the portable engine's forward, they are UNSUPPORTED (the CPU engine
     *   serves them everywhere).  The CUDA engine
     *   does not check the entries: it clamps seqused_q[b] and
     *   cache_leftpad[b] into range (a negative one is 0), and takes
     *   cache_batch_idx[b] outside [0, cache_batch) as a batch entry of
     *   zeros (TMA bounds). */
    const int32_t *seqused_q;
    const int32_t *cache_batch_idx;
    int32_t cache_batch;
    const int32_t *cache_leftpad;
} fattn_fwd_args;

FATTN_API fattn_status fattn_fwd(fattn_ctx *ctx, const fattn_fwd_args *args);

/*
 * Merge of partial results: the attention of each query row over the union
 * of disjoint key ranges, from fattn_fwd's (o, lse) over each range (split-KV
 * across calls, context parallelism across GPUs).  Per row, with O_i and
 * lse_i the row's output and LSE in part i:
 *   m = max_i lse_i,  w_i = exp(lse_i - m),
 *   o = sum_i w_i O_i / sum_i w_i,  lse = m + log(sum_i w_i).
 *   parts[i].o:   [batch, seqlen, heads, head_dim]  f32 | f16 | bf16, any
 *                 strides (head_dim contiguous); parts may differ in dtype
 *                 from each other and from o
 *   parts[i].lse: float32 [batch, heads, seqlen] (fattn_fwd's LSE layout),
 *                 required
 *   o:   [batch, seqlen, heads, head_dim]  f32 | f16 | bf16
 *   lse: optional float32 [batch, heads, seqlen]
 * `parts` is a host array of 1..FATTN_MERGE_MAX_PARTS entries, read during
 * the call (like args); the tensors and lse arrays it names live where the
 * context computes.  Parts are inputs: they may overlap one another, not o
 * or lse.
 * A part whose lse_i is -inf for a row (no key of its range visible to the
 * row) takes no part in that row: w_i = 0 and its O_i is not read, so it may
 * hold anything, NaN included.  A row that is -inf in every part gets o = 0
 * and lse = -inf, as fattn_fwd's rows that see no key.  NaN propagates as
 * torch's would: a NaN lse_i makes the row's o and lse NaN, a NaN in a
 * participating O_i makes those elements of o NaN (an lse of +inf, which
 * fattn_fwd does not produce, gives NaN too).
 * The CPU engine accumulates in double, parts in index order, then rounds
 * once to f32 (and from f32 to o's dtype): the same bits for any thread
 * count.  Fixed-length batches only (for varlen outputs describe the packed
 * [total, heads, dim] tensors as batch 1, seqlen total: the LSE layout
 * [heads, total] is then the same).
 * Engines: CPU; CUDA (both engines: Hopper's, the portable one): any
 *   head_dim, dtypes and strides as above.
 *   Accumulates in f32: weights and their sum in double, each weight
 *   rounded to f32, o summed by f32 fma in part order and rounded once to
 *   o's dtype (within ~(num_parts + 4) * 2^-24 * max_i |O_i| of the CPU's
 *   row, typically ~2^-24 sqrt(num_parts) relative, plus an ulp of a
 *   16-bit o; lse within a few f32 ulps), the same bits on every run.  No
 *   alignment beyond the elements': 16-byte accesses where a tensor's
 *   address and strides are multiples of 16 bytes, narrower ones otherwise.
 *   Asynchronous on the context's stream, with no allocation and no host
 *   synchronisation, so it can be captured in a CUDA graph; except that
 *   parts using more than 256 distinct layouts (dtype, strides, alignment)
 *   take several launches and a workspace the context owns (made on first
 *   need, kept until fattn_ctx_free; during a capture before it exists:
 *   UNSUPPORTED).
 */
#define FATTN_MERGE_MAX_PARTS 1024

typedef struct fattn_merge_part {
    fattn_tensor o;
    const float *lse;
} fattn_merge_part;

typedef struct fattn_merge_args {
    int32_t batch, seqlen, heads, head_dim;
    int32_t num_parts;              /* 1..FATTN_MERGE_MAX_PARTS */
    const fattn_merge_part *parts;  /* num_parts entries */
    fattn_tensor o;
    float *lse;
} fattn_merge_args;

FATTN_API fattn_status fattn_merge(fattn_ctx *ctx, const fattn_merge_args *args);

/*
 * Append to a KV cache: the new step's K and V rows, seqlen_new of them per
 * sequence, are copied into a cache that fattn_fwd reads, contiguous or
 * paged.  A decoding step is fattn_kv_append, then fattn_fwd on the cache
 * with seqused_k[b] = cache_seqlens[b] + seqlen_new.  fattn_kv_append reads
 * cache_seqlens and never writes it: the caller owns the lengths, keeps the
 * seqused_k array the forward takes, and advances both itself.
 *   k_new, v_new: [batch, seqlen_new, heads_kv, head_dim]  f32 | f16 | bf16,
 *       any strides (head_dim contiguous)
 *   k_cache, v_cache: the caches, the dtype of k_new (all four tensors one
 *       dtype), or both e4m3 (an FP8 cache, below: k_new and v_new then
 *       f32 | f16 | bf16, one dtype); v's rows are head_dim long too.
 *     block_table NULL: contiguous [batch, capacity, heads_kv, head_dim],
 *       any strides; row j of sequence b is (b, j).  capacity >= 1, and
 *       page_size, num_pages, max_pages_per_seq must be 0.
 *     block_table int32[batch][max_pages_per_seq]: page pools [num_pages,
 *       page_size, heads_kv, head_dim] as in fattn_fwd_args (batch = page,
 *       all three strides 0 = packed); row j of sequence b is row
 *       j % page_size of page block_table[b * max_pages_per_seq +
 *       j / page_size].  page_size, num_pages, max_pages_per_seq >= 1;
 *       capacity is ignored.
 *   cache_seqlens: int32[batch], required: new row t of sequence b (t <
 *       seqlen_new) becomes cache row cache_seqlens[b] + t, every head.
 * batch, seqlen_new, heads_kv >= 1 (seqlen_new 0 is INVALID_ARGUMENT, not
 * a no-op), head_dim 1..512 on every engine (UNSUPPORTED above: the CPU
 * forward's limit).  The bytes of each row are copied as they are (NaN
 * payloads included; FP8 caches: quantised, below).  Only the appended rows are written: every other
 * byte of the caches (rows, padding between strided rows, other pages) is
 * left as it was.  k_cache and v_cache are the call's outputs: each spans
 * its whole cache (a pool all num_pages pages), which must not overlap the
 * other cache, k_new, v_new, cache_seqlens or block_table (Conventions),
 * so K and V interleaved in one buffer are refused; k_new and v_new may
 * overlap.  Sharing pages between sequences is allowed as in fattn_fwd,
 * but one call must not write a cache row twice.
 * The entries of cache_seqlens and block_table are read where they live:
 *   CPU: checked on the host before anything is written (INVALID_ARGUMENT
 *     naming the sequence and the value): cache_seqlens[b] >= 0,
 *     cache_seqlens[b] + seqlen_new <= capacity (paged: <=
 *     max_pages_per_seq * page_size), the table entries of the pages the
 *     new rows land in inside [0, num_pages) (the other entries are not
 *     read), and no cache row written by two new rows (two sequences
 *     appending into the same rows of a shared page, or one page listed
 *     twice in a sequence's table row with new rows landing on the same
 *     rows of it through both entries; a page listed twice whose written
 *     rows do not coincide is accepted).
 *   CUDA: read on the device only.  A new row whose destination is out of
 *     range (cache_seqlens[b] + t negative or >= capacity, paged >=
 *     max_pages_per_seq * page_size, or its table entry outside
 *     [0, num_pages)) is skipped, every head: nothing is written for it,
 *     the other rows are.  A cache row that two new rows write ends up
 *     holding bytes of either, possibly mixed within the row.
 * FP8 caches (0.5): k_cache and v_cache e4m3, each with its float32
 *   scales (k_cache.scale, scale_block >= 1, 4-byte aligned) in fattn_fwd's
 *   layout: [num_pages, heads_kv, ceil(page_size / scale_block)] for page
 *   pools, [batch, heads_kv, ceil(capacity / scale_block)] for a
 *   contiguous cache (scale_block 1: per (token, kv head); >= page_size:
 *   per (page, kv head)).  The scales are read and written: they count as
 *   outputs for the overlap rules.  The new rows of each (sequence, kv
 *   head) are quantised block by block of the scales:
 *   - a block whose first row (r % scale_block == 0 of its page or cache
 *     row) this call writes gets scale = max(amax / 448, 2^-126) over the
 *     rows of the block that this sequence's call writes (amax of |x|,
 *     NaN left out; 1 when they are all zero; +Inf when one is +-Inf),
 *     stored in its entry: fattn_quantize's rule (scale_block 1: each
 *     row's own amax);
 *   - any other block keeps its stored scale (an earlier append's), which
 *     is read (CPU: checked > 0 before anything is written,
 *     INVALID_ARGUMENT naming the entry; CUDA: unspecified codes if not);
 *   then code = fattn_f32_to_e4m3(x / scale): the quotient rounded once
 *   to f32 (IEEE division), then to e4m3 to nearest even, saturating to
 *   +-448 (NaN codes NaN; with an Inf in the block its Inf entries code
 *   NaN and the others +-0, so every value of the block reads NaN, as
 *   fattn_quantize's).  So rows appended later into a block whose scale
 *   is set saturate at 448 x its scale: per-page scales suit pages
 *   written whole (a prefill) or values bounded by the page's first
 *   rows; decoding token by token loses nothing to saturation with
 *   scale_block 1.  Two sequences appending in one call into one scale
 *   block of a shared page, one of them writing its first row: the
 *   other's rows are coded with either scale (unspecified).  Both
 *   engines give the same bits.  CUDA: scale_block < page_size must
 *   divide page_size (UNSUPPORTED otherwise).
 * Engines: CPU (the context's threads for large appends); CUDA (both engines):
 *   any head_dim and strides as above, no alignment beyond the elements':
 *   16-byte loads and stores where the four tensors' addresses and strides
 *   and the row's bytes are multiples of 16 bytes, 8-, 4- or 2-byte
 *   accesses otherwise.  Asynchronous on the
 *   context's stream, with no allocation and no host synchronisation, so
 *   it can be captured in a CUDA graph (with the forward it feeds).
 */
typedef struct fattn_kv_append_args {
    int32_t batch, seqlen_new, heads_kv, head_dim;
    fattn_tensor k_new, v_new;     /* [batch, seqlen_new, heads_kv, head_dim] */
    fattn_tensor k_cache, v_cache; /* contiguous caches or page pools */
    int32_t capacity;              /* contiguous: rows per sequence (ignored with a table) */
    const int32_t *cache_seqlens;  /* int32[batch], required; read, never written */
    const int32_t *block_table;    /* NULL: contiguous; else [batch][max_pages_per_seq] */
    int32_t page_size, num_pages, max_pages_per_seq;
} fattn_kv_append_args;

FATTN_API fattn_status fattn_kv_append(fattn_ctx *ctx, const fattn_kv_append_args *args);

/*
 * Backward: dq, dk, dv from q, k, v, o, dout and the forward's lse.
 *   q, k, v, o, lse as in fattn_fwd (lse required); dout like o;
 *   dq like q, dk like k, dv like v (same dtype as q; f32/f16/bf16 only).
 *   With GQA, dk and dv are sums over the query heads of each kv head.
 *   D = rowsum(dout * o) is computed from the o passed here: the forward's
 *   own output, or the o and lse of a larger call when this call is one
 *   block of its keys (ring attention, FlashAttention's block backward).
 *   The CPU engine with f16 / bf16 o takes D as sum_j P_ij dP_ij over this
 *   call's keys instead (the same value without o's rounding) in the rows
 *   where those keys (and the sink) hold the whole softmax, P summing to
 *   at least 1 - 2^-13; in the others, dout . o.
 *   A row whose lse is -inf (it saw no key) gets
 *   dq = 0 and adds nothing to dk, dv.
 *   deterministic: nonzero asks for bitwise-reproducible results (the CPU
 *   engine always is).  On CUDA without it, dq is accumulated across key
 *   blocks in fp32 in an order that varies from run to run (last-bit
 *   differences); with it, in a fixed order (slower: docs/benchmarks.md).
 * Engines: CPU: as for fattn_fwd (window, softcap and dsink included).
 *          CUDA (Hopper): window, softcap and dsink (seqlen_q + seqlen_k <
 *          2^30; a learnable_sink without dsink is not read, since dq, dk,
 *          dv need only the sink-aware forward's o and lse); bf16 / f16, head_dim == head_dim_v in {64, 96,
 *          128, 192, 256} or head_dim 192 with head_dim_v 128, batch and heads_q <= 65535, fixed-length or variable-length
 *          batches (cu_seqlens with total_q and total_k; the workspace then
 *          holds (total_q / 64 + batch + 1) x heads_q 64-row blocks); q, k, v, dout
 *          16-byte aligned with strides multiples of 16 bytes (TMA);
 *          dq, dk, dv 4-byte aligned with even strides.  Asynchronous on the
 *          context's stream.  It uses a workspace the context owns (fp32 dq
 *          and two floats per query row, rows padded to 64): made or grown on
 *          first need and kept; nothing is allocated while the stream is being
 *          captured into a CUDA graph, so a captured call that needs a larger
 *          workspace than earlier calls made answers UNSUPPORTED (make one such
 *          call before the capture).  Calls on one context share it and run
 *          one after another, whatever stream each was issued on.
 *          CUDA (portable engine, sm_80 on): bf16 / f16, head_dim ==
 *          head_dim_v in {64, 96, 128, 192, 256} (192 and 256 need the shared
 *          memory of an A100 or Hopper: UNSUPPORTED where a block gets
 *          99 KB, sm_86/89/120), causal,
 *          GQA, fixed-length or variable-length batches, deterministic,
 *          batch and heads_q <= 65535; the same alignment, workspace and
 *          graph-capture rules as above; seqused_q and seqused_k with
 *          cu_seqlens; window, softcap and dsink UNSUPPORTED.
 */
typedef struct fattn_bwd_args {
    fattn_problem p;
    fattn_tensor q, k, v, o, dout, dq, dk, dv;
    const float *lse;
    int32_t deterministic;
    /* Learnable sinks (fattn_fwd_args): dq, dk and dv need only the
     * forward's sink-inclusive lse and o, so learnable_sink is read only
     * for dsink.  dsink: NULL, or float32[heads_q] (4-byte aligned, an
     * output: it must not overlap any tensor of the call), which receives
     *     dsink[h] = -sum over the rows i of head h (every sequence)
     *                of exp(sink_h - LSE_i) * D_i,   D_i = rowsum(dout_i * o_i),
     * the gradient of the loss with respect to learnable_sink[h].  dsink
     * without learnable_sink is INVALID_ARGUMENT.  The CPU engine sums each
     * head's rows in double, in row order (deterministic). */
    const float *learnable_sink;
    float *dsink;
    /* 0.4: seqused_q, seqused_k: int32[batch] or NULL, as in
     * fattn_fwd_args (pass the forward's): sequence b's first min(seqused_q[b],
     * its query count) queries and first min(seqused_k[b], its key count)
     * keys take part; causal and window alignment use those counts.  The
     * rows of dq past its used queries and of dk, dv past its used keys are
     * not written (left as they were, their gradient being zero;
     * FlashAttention-3's tests mask those rows out before comparing).  lse, o and dout are read for the used rows only.
     * CPU: entries checked on the host (>= 0, INVALID_ARGUMENT naming the
     * field).  CUDA (Hopper and portable engines): with cu_seqlens_q and
     * cu_seqlens_k (a variable-length batch; on a fixed-length one
     * UNSUPPORTED, give it as cu_seqlens of equal lengths); the entries are
     * read on the device only, a negative one taken as 0.  Hopper loads
     * whole 64-query and 128-key (d256: 64-key) blocks, so the rows of q,
     * dout, k and v past a sequence's used counts in the block of its last
     * used query (key) must be finite, as the forward's rule for v (a NaN
     * or Inf there reaches dq, dk, dv as 0 x NaN); the portable engine
     * loads them as zeros.  cu_seqlens_q without cu_seqlens_k works here as
     * in the forward (CPU only). */
    const int32_t *seqused_q;
    const int32_t *seqused_k;
} fattn_bwd_args;

FATTN_API fattn_status fattn_bwd(fattn_ctx *ctx, const fattn_bwd_args *args);

/* ------------------------------------------------------------------------ */
/* FP8 quantisation                                                         */
/* ------------------------------------------------------------------------ */

typedef enum fattn_quant_granularity {
    /* One scale per block of `block_rows` rows of each (batch, head). */
    FATTN_QUANT_BLOCK = 0,
    /* One scale for the whole tensor (the per-tensor baseline); it is still
     * written to every entry of out.scale so that attention reads it the
     * same way. */
    FATTN_QUANT_TENSOR = 1
} fattn_quant_granularity;

/*
 * Quantise a 16-bit or f32 tensor [batch, seqlen, heads, head_dim] to e4m3.
 *   in:  f32 | f16 | bf16, any strides (head_dim contiguous)
 *   out: e4m3; out.scale must point to float32
 *        [batch, heads, ceil(seqlen / block_rows)] which receives
 *        scale = max(amax / 448, 2^-126) of each block (1 for an all-zero
 *        block).  The floor (FLT_MIN) serves blocks whose amax is an f32
 *        subnormal or barely above (< 448 x 2^-126 ~ 5.3e-36): their
 *        entries of magnitude <= 2^-136 code as zeros, never NaN, and the scale
 *        stays a normal float whose reciprocal the attention kernels can
 *        take;
 *        out.scale_block is ignored on input (block_rows is used).
 *   rotate: nonzero first multiplies each row by M = diag(signs) H / sqrt(d)
 *        (the incoherent processing of FlashAttention-3): signs are +-1 drawn
 *        from `seed`, H is the Walsh-Hadamard matrix; head_dim must be a power
 *        of two (64, 128, 256 ...).  Apply it to Q and K with the same seed
 *        (never to V): Q M (K M)^T = Q K^T.
 * Conversion rounds to nearest even and saturates to +-448 (NaN stays NaN).
 * Non-finite input propagates, as torch's would (entries taken after the
 * rotation, when asked): a NaN entry codes NaN (0x7F) and is left out of
 * amax; a block holding +-Inf gets scale = +Inf, its Inf entries code NaN and
 * its finite entries +-0, so that every entry of the block dequantises
 * (code * scale) to NaN and attention over it gives NaN, never a finite
 * result.  With FATTN_QUANT_TENSOR one Inf makes every scale +Inf.
 * Engines: CPU any head_dim; CUDA head_dim a multiple of 8 up to 512, with
 * rotation a power of two up to 256 (UNSUPPORTED otherwise), asynchronous
 * on the context's stream.  Both give the same bits of codes and scales.
 */
typedef struct fattn_quantize_args {
    fattn_tensor in;
    fattn_tensor out;
    int32_t batch, seqlen, heads, head_dim;
    fattn_quant_granularity granularity;
    int32_t block_rows; /* >= 1 (for FATTN_QUANT_TENSOR it only sets the
                           layout of out.scale) */
    int32_t rotate;
    uint64_t seed;
} fattn_quantize_args;

FATTN_API fattn_status fattn_quantize(fattn_ctx *ctx, const fattn_quantize_args *args);

/*
 * FP8 attention from 16-bit (or f32) inputs in one call: Q, K and V are
 * quantised to e4m3 (fattn_quantize, Q and K optionally rotated) into a
 * workspace the context owns, then fattn_fwd runs on the e4m3 tensors.
 *   args: as for fattn_fwd with q, k, v f16 | bf16 | f32 (one dtype) and
 *         o f16 | bf16 | f32; their .scale fields are ignored; the serving
 *         fields (seqused_k ... max_pages_per_seq, seqused_q ...
 *         cache_leftpad) must be 0, and cu_seqlens_q needs cu_seqlens_k,
 *         for now (UNSUPPORTED).
 *   opt:  NULL = block scales of 128 rows, no rotation.
 * Block sizes the CUDA engine serves (others: UNSUPPORTED; the CPU engine
 * serves any): Q any; K 1 (one scale per token) or a multiple of 128; V a
 * multiple of 128; at head dim 128 also K and V both multiples of 192.  Per-tensor granularity writes one scale into every block
 * (any block size works then).  The workspace (1 byte per element of Q, K and
 * V plus their scales) grows on first need and is freed with the context; on
 * a CUDA context it is device memory and the call is asynchronous on the
 * context's stream, like fattn_fwd.  Calls on one context share the
 * workspace: each waits for the previous fattn_fwd_fp8 of the context,
 * whatever stream that ran on.  Nothing is allocated while the stream is
 * being captured into a CUDA graph: a captured call that needs a larger
 * workspace than earlier calls made answers UNSUPPORTED (make one such call
 * before the capture); a captured call is ordered by the graph's streams
 * only, as for the split workspace (fattn_ctx_set_stream).  The result is
 * the bits of fattn_quantize on Q, K, V into packed BSHD e4m3 tensors (per
 * tensor: blocks of 128 rows) followed by fattn_fwd on them.
 */
typedef struct fattn_fp8_options {
    fattn_quant_granularity granularity; /* FATTN_QUANT_BLOCK (0) or FATTN_QUANT_TENSOR */
    int32_t block_rows_q;  /* rows per scale of Q; 0 = 128 */
    int32_t block_rows_k;  /* of K; 0 = 128; 1 = one scale per token */
    int32_t block_rows_v;  /* of V; 0 = 128 */
    int32_t rotate;        /* nonzero: the random-sign Hadamard on Q and K */
    uint64_t seed;         /* the rotation's signs (fattn_rotation_signs) */
} fattn_fp8_options;

FATTN_API fattn_status fattn_fwd_fp8(fattn_ctx *ctx, const fattn_fwd_args *args, const fattn_fp8_options *opt);

/* Host-side scalar conversions, identical to the device's saturating
 * round-to-nearest-even cvt.rn.satfinite.e4m3x2.f32 (NaN -> 0x7F). */
FATTN_API uint8_t fattn_f32_to_e4m3(float x);
FATTN_API float fattn_e4m3_to_f32(uint8_t code);

/* The +-1 signs of the rotation for a seed: signs[i] = +1 or -1, i < n.
 * n >= 1 and signs non-NULL, INVALID_ARGUMENT otherwise with nothing
 * written (a request for no signs is taken as a caller's mistake, as every
 * size <= 0 in fattn; the quantiser asks for n = head_dim >= 1).  It takes
 * no context, so no message is recorded. */
FATTN_API fattn_status fattn_rotation_signs(uint64_t seed, int32_t n, float *signs);

#ifdef __cplusplus
}
#endif

#endif /* FATTN_H */
