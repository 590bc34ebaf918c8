/* test_fuzz.c - random-argument fuzz of the public API on a CPU context
 * (issue 27): fattn_fwd (with its serving fields), fattn_bwd,
 * fattn_quantize, fattn_fwd_fp8, fattn_merge and fattn_kv_append.
 *
 * Each case draws a tiny valid call (batch <= 3, seqlens <= 40, head dims
 * <= 64; every dtype; packed, explicit, permuted and padded layouts; GQA,
 * causal with any seqlen_q / seqlen_k, variable-length batches with empty
 * sequences and any maximum; k and v in one buffer, q, k and v slices of one
 * packed buffer; ignored fields holding garbage; fattn_fwd's seqused_k,
 * below, at and above each key count, fixed-length and varlen, its
 * cache_leftpad (0 .. the used end; the keys before it NaN), seqused_q
 * (0 .. past the query count: the rows past it checked unwritten, causal
 * aligned on it), cache_batch_idx on a dense fixed-length cache of 1 ..
 * batch + 2 entries (repeats; the entries no sequence reads NaN), and paged
 * K/V: page pools of 1..64-row pages in any layout, tables with pages in
 * any order, shared between sequences, garbage in the entries no used key
 * reads, with GQA, causal, e4m3 pools; NaN in every key row no sequence
 * uses; fattn_merge of 1..4 parts, or FATTN_MERGE_MAX_PARTS repeating
 * up to 4, each part its own dtype and layout, -inf lse entries whose o
 * rows are NaN, rows -inf in every part, a NaN or +inf lse or a NaN in a
 * participating o row (NaN expected where the header says), lse optional;
 * fattn_kv_append into contiguous caches or page pools, pages shared between sequences
 * where their rows do not collide, garbage in the table entries no new row
 * reads and in a paged call's capacity, k_new = v_new, rows of random bits;
 * the attention variants on fwd, bwd and fwd_fp8: sliding windows of any
 * sides (-1, 0, small, past the sequence, with causal and seqused_k),
 * softcap 0.5 .. 30, learnable sinks (+-30 among them) and bwd's dsink,
 * checked by the references below written from fattn.h's definitions)
 * and then, in two cases out of three, breaks it in one to three ways:
 * sizes zero, negative or whose products overflow the limits, head dims
 * the CPU engine lacks, heads_q %
 * heads_kv != 0, softmax_scale NaN / Inf / negative, NULL or misaligned
 * pointers, dtypes that are no fattn_dtype or do not match, e4m3 tensors
 * without scales or with scale_block <= 0, cu_seqlens given on one side only,
 * not starting at 0, decreasing or longer than seqlen_q / seqlen_k, negative
 * or overflowing strides, strides that make a tensor overlap itself, an
 * output laid over (or just next to) an input or another output, bad
 * quantisation granularity and block sizes (fattn_quantize and
 * fattn_fwd_fp8's options), rotation of a non-power-of-two head dim, a
 * negative seqused_k or seqused_q entry, a cache_batch_idx entry outside
 * [0, cache_batch), seqused_k / block_table misaligned, the table
 * NULL with its sizes given or sizes given without it, page_size /
 * num_pages / max_pages_per_seq zero, negative or making a pool of >= 2^31
 * rows, seqlen_k > max_pages_per_seq * page_size, an e4m3 scale entry
 * NaN, -inf, zero or negative, a used table entry
 * outside [0, num_pages), a table with cu_seqlens (UNSUPPORTED), fwd_fp8
 * with seqused_k (UNSUPPORTED), merge's num_parts 0, negative or past
 * FATTN_MERGE_MAX_PARTS, parts NULL, a part's o or lse NULL, an e4m3 part
 * or o, kv_append's cache_seqlens negative, one row past the cache or
 * overflowing, two new rows into one cache row (a second sequence or a
 * second table entry onto written rows: the rules decide), a written
 * page's entry outside [0, num_pages), page sizes <= 0 or given without a
 * table, capacity <= 0, caches of >= 2^31 rows, e4m3 or mixed dtypes,
 * NULL cache_seqlens, NULL ctx or args, a window side < -1 or given
 * without the window flag, softcap NaN / +-Inf / negative, learnable_sink
 * or dsink misaligned, dsink without learnable_sink.  Whether the call is valid is
 * decided from the header's rules (fattn.h, docs/design.md section 3), not
 * from src/api.c.
 *
 * All buffers of a case live in one arena: 0xFF bytes (NaN in every float
 * format) everywhere except the input views, guard bytes between buffers.
 * Every call must
 *   - not crash (nor trip ASan / UBSan);
 *   - return FATTN_OK with fattn_last_error "" or an error status with a
 *     non-empty one-line message: OK for a valid call, INVALID_ARGUMENT for
 *     an invalid one (UNSUPPORTED where the only fault is a head dim over 512,
 *     a rotation of a non-power-of-two head dim, a block table with
 *     cu_seqlens or fwd_fp8 with seqused_k);
 *   - if refused, leave every byte of the arena as it was; if accepted,
 *     change bytes inside its outputs' views only (fattn_kv_append: the
 *     appended rows only); never write its argument structs (nor merge's
 *     parts array);
 *   - if accepted on finite inputs, write every output element, finite:
 *     O 0 and LSE -inf exactly on rows that see no key, |O| within the range
 *     of V, e4m3 codes never NaN, scales finite and positive, dq / dk / dv
 *     finite; and match a reference (issue 43 item 10):
 *     . fattn_fwd: O and LSE an FP64 attention that gathers each sequence's
 *       used keys itself (seqused_k, through the table for paged K/V);
 *     . fattn_bwd: dq, dk, dv an FP64 backward from the same o, dout and
 *       lse, each element within a bound made of the same sums over
 *       absolute values (exactly 0 where nothing contributes);
 *     . fattn_quantize: every code byte and scale bit of the header's
 *       definition, written out here (rotation, amax, the 2^-126 floor of
 *       the scale, fattn_f32_to_e4m3(x / scale));
 *     . fattn_fwd_fp8: that definition applied to q, k, v with the
 *       options' blocks, then the FP64 attention over the dequantised
 *       values;
 *     . merge's o and lse a double-precision merge of the parts;
 *       kv_append's new rows, byte for byte, in the cache rows the header
 *       names (checked on any input bits).
 *     Quantize and fwd_fp8 inputs get rows of f32 / bf16 subnormals in one
 *     case in five (blocks whose amax / 448 is under FLT_MIN or rounds to 0:
 *     issue 43 item 1).
 *
 * Environment: FATTN_TEST_SEED (testutil.h: fixed default), FATTN_FUZZ_CASES
 * (default 10000: 4.6-5.3 s in a Release build, 10 s of CPU / 14 s wall
 * under ASan + UBSan, on 2 cores shared with a CUDA build; 3.3 s and 8 s
 * before the references of issue 43),
 * FATTN_FUZZ_ONLY=n (case n alone, its call printed: every case draws from
 * its own stream, seeded by the seed and n), FATTN_FUZZ_VERBOSE=1 (print
 * every call before it is made).  A failure prints the case, its call in one
 * line and the command that replays it; so does a crash or an ASan report.
 * A UBSan report does not (its runtime calls no hook before exiting): rerun
 * with FATTN_FUZZ_VERBOSE=1, the last case printed is the one.  The long
 * run, by hand (ASan + UBSan, a few minutes):
 *
 *   make sanitize && FATTN_FUZZ_CASES=100000 build-sanitize/tests/test_fuzz
 *
 * (about 6 minutes each on 2 shared cores; issue 43's last runs: seeds
 * 4343003, 4343004 and 4343005, all checks passed.)
 */
#define _POSIX_C_SOURCE 200809L
#include <float.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/testutil.h"
#include "common/half.h"
#include "fattn.h"

#define DEFAULT_CASES 10000
#define MAX_BATCH 3
#define MAX_FAILURES_SHOWN 20
#define MAX_PAGES 96 /* table entries per sequence */
#define MAX_POOL 512 /* kv_append's pages */

/* ------------------------------------------------------------------------ */
/* One case                                                                 */
/* ------------------------------------------------------------------------ */

typedef enum api_kind { API_FWD, API_BWD, API_QUANT, API_FP8, API_MERGE, API_KVA, API_N } api_kind;
static const char *const api_name[API_N] = {"fwd", "bwd", "quantize", "fwd_fp8", "merge", "kv_append"};

/* Pointer arguments.  fattn_quantize uses BQ (in), BO (out), BQS (out.scale);
 * fattn_merge BO and BLSE (o, lse) and BP0.. / BPL0.. (the distinct parts'
 * o and lse); fattn_kv_append BK, BV (k_new, v_new), BDK, BDV (k_cache,
 * v_cache), BCSL (cache_seqlens) and BTABLE. */
#define MERGE_DISTINCT 4 /* parts with storage of their own; more repeat them */
enum { BQ, BK, BV, BO, BDOUT, BDQ, BDK, BDV, BLSE, BQS, BKS, BVS, BCUQ, BCUK, BSEQU, BTABLE, BCSL, BPAD, BSQU, BCBI,
       BP0, BPL0 = BP0 + MERGE_DISTINCT, NBUF = BPL0 + MERGE_DISTINCT };

typedef struct buf {
    const char *name;
    int alloc;      /* has storage in the arena */
    int passed;     /* its pointer is an argument of the call (set with the args) */
    int output;
    int tensor;     /* 4-D view, else an array of `count` elements */
    size_t es;      /* element bytes */
    int64_t n[4];   /* batch (1 in varlen mode), seq, heads, dim */
    int64_t st[3];  /* strides as passed: batch, seq, head (all 0 = packed) */
    int64_t count;  /* arrays */
    int bad_stride; /* negative or overflowing strides (the call is invalid) */
    size_t region;  /* offset of its own storage */
    size_t off;     /* offset its pointer points to (another buffer's storage when laid over it) */
    size_t bytes;   /* storage: the span (packed for a bad_stride; q's also holds k and v when packed) */
} buf;

/* What can be wrong with a call (or, for the layout kinds, may be). */
typedef enum mkind {
    M_STRIDE_BAD,  /* strides < head dim, equal, interleaved, 0: the rules decide */
    M_STRIDE_NEG,
    M_STRIDE_HUGE, /* the largest element offset >= 2^59 or overflowing int64 */
    M_OVERLAP,     /* an output laid over an input or another output */
    M_TOUCH,       /* an output right next to one: valid unless it meets a third */
    M_CTX_NULL,
    M_ARGS_NULL,
    M_SIZE_BAD,  /* 0 or negative */
    M_SIZE_HUGE, /* batch * seqlen * heads >= 2^31, offsets >= 2^59 */
    M_DIM_BIG,   /* head dim > 512: UNSUPPORTED on the CPU */
    M_GQA,
    M_SCALE_BAD,
    M_DTYPE_ENUM,
    M_DTYPE_MIX,
    M_NULL_PTR,
    M_MISALIGN,
    M_E4M3_NOSCALE,
    M_E4M3_BLOCK,
    M_CU_ONE_NULL,
    M_CU_START,
    M_CU_DECREASE,
    M_CU_TOO_LONG,
    M_QUANT_GRAN,
    M_QUANT_BLOCK,
    M_ROTATE, /* rotation of a non-power-of-two head dim: UNSUPPORTED */
    /* fattn_fwd's serving fields */
    M_SEQU_NEG,   /* a seqused_k entry < 0 */
    M_SERV_PTR,   /* seqused_k / block_table misaligned; the table NULL with its sizes given */
    M_PAGE_FIELD, /* page_size / num_pages / max_pages_per_seq <= 0 (paged), != 0 (not paged) */
    M_PAGE_HUGE,  /* a pool of >= 2^31 rows, a table of >= 2^31 entries */
    M_PAGE_SHORT, /* seqlen_k > max_pages_per_seq * page_size */
    M_PAGE_ENTRY, /* a table entry that a used key reads outside [0, num_pages) */
    M_PAGE_VARLEN,/* a table with cu_seqlens: UNSUPPORTED */
    M_FP8_SERVING,/* fattn_fwd_fp8 with seqused_k: UNSUPPORTED */
    M_MERGE_NPARTS, /* num_parts 0, negative, > FATTN_MERGE_MAX_PARTS */
    M_KVA_SEQLENS,  /* a cache_seqlens entry < 0 or running past the cache */
    M_KVA_TWICE,    /* two new rows into one cache row (paged): the rules decide */
    M_KVA_PAGE,     /* a written page's entry out of range, page sizes <= 0 / given without a table, capacity <= 0 */
    M_KVA_HUGE,     /* a cache of >= 2^31 rows */
    M_VARIANT,      /* window / softcap / learnable_sink / dsink out of their rules */
    M_SERV_RANGE,   /* a seqused_q entry < 0, or a cache_batch_idx entry outside [0, cache_batch) */
    M_N
} mkind;
static const char *const mkind_name[M_N] = {
    "stride_bad", "stride_neg", "stride_huge", "overlap",   "touch",      "ctx_null",     "args_null",
    "size_bad",   "size_huge",  "dim_big",     "gqa",       "scale_bad",  "dtype_enum",   "dtype_mix",
    "null_ptr",   "misalign",   "e4m3_noscale", "e4m3_block", "cu_one_null", "cu_start", "cu_decrease",
    "cu_too_long", "quant_gran", "quant_block", "rotate", "sequ_neg", "serv_ptr", "page_field",
    "page_huge", "page_short", "page_entry", "page_varlen", "fp8_serving",
    "merge_nparts", "kva_seqlens", "kva_twice", "kva_page", "kva_huge", "variant", "serv_range"};

#define ALLOW_INV (1u << FATTN_ERROR_INVALID_ARGUMENT)
#define ALLOW_UNSUP (1u << FATTN_ERROR_UNSUPPORTED)

typedef struct fcase {
    int64_t index;
    tu_rng rng;
    api_kind api;
    char desc[3072];
    size_t dlen;
    /* the valid problem */
    int batch, sq, sk, hq, hkv, d, dv, dv_arg, causal, varlen, threads;
    int sq_arg, sk_arg; /* seqlen_q / seqlen_k as passed (varlen: maxima) */
    int lens_q[MAX_BATCH], lens_k[MAX_BATCH];
    int32_t cuq[MAX_BATCH + 1], cuk[MAX_BATCH + 1];
    int tq, tk;            /* rows per batch entry of q / k (varlen: totals) */
    fattn_dtype dt, dto;   /* inputs, output */
    int32_t blk[3];        /* e4m3 scale blocks of q, k, v; quantize: block_rows */
    float softmax_scale;
    int want_lse, kv_shared, qkv_packed, rotate;
    /* fattn_fwd's serving fields (fwd_fp8: seqused_k for M_FP8_SERVING) */
    int has_sequ, paged, ps, npages, mpps, poisoned;
    int32_t sequ[MAX_BATCH];
    int has_pad;           /* cache_leftpad given (fattn_fwd only) */
    int32_t pad[MAX_BATCH]; /* its entries: sequence b's keys start at row pad[b] */
    int used[MAX_BATCH]; /* keys sequence b attends to: min(seqused_k[b], its key count) - pad[b] */
    int has_squ;           /* seqused_q given (fattn_fwd only) */
    int32_t squ[MAX_BATCH];
    int has_cbi, cbatch;   /* cache_batch_idx given (fixed-length, dense K/V), cache_batch */
    int32_t cbi[MAX_BATCH];
    int32_t table[MAX_BATCH * MAX_PAGES];
    /* fattn_merge: batch, sq (seqlen), hq (heads), d (head_dim), dto (o) */
    int nparts, nd;              /* parts passed, parts with storage of their own (part i is i % nd) */
    fattn_dtype pdt[MERGE_DISTINCT];
    int lse_inf;                 /* -inf entries in the parts' lse (their o rows NaN) */
    fattn_merge_part parts[FATTN_MERGE_MAX_PARTS + 1];
    fattn_merge_args ma;
    /* fattn_kv_append: batch, sq (seqlen_new), hkv, d, dt, paged, ps, npages,
     * mpps, table; kv_shared: v_new is k_new's memory */
    int32_t cs[MAX_BATCH]; /* cache_seqlens */
    int32_t cap;           /* capacity as passed (paged: garbage, ignored) */
    fattn_kv_append_args ka;
    /* the attention variants (fattn_problem, fattn_fwd_args, fattn_bwd_args):
     * host arrays outside the arena (the sink is an input, dsink an output) */
    int win, wl, wr, has_sink, want_dsink;
    float softcap;
    float sink[16], dsink[16];
    buf b[NBUF];
    mkind mut[3];
    int nmut;
    /* the arena */
    uint8_t *arena, *before;
    size_t arena_bytes, front;
    /* the call */
    fattn_fwd_args fa;
    fattn_bwd_args ba;
    fattn_quantize_args qa;
    fattn_fp8_options opt;
    int opt_null, ctx_null, args_null;
    int mutated_args; /* an argument-level fault was applied */
    int nonfinite;    /* an input holds NaN / Inf: no finiteness checks */
    int setup_failed; /* bwd: the forward that makes o and lse refused the layout */
    int bad_scale;    /* an e4m3 scale entry NaN, zero or negative: INVALID_ARGUMENT */
} fcase;

static int g_seed;
static int g_verbose;
static const char *g_prog = "test_fuzz";
static char g_replay[512]; /* for the crash handlers */
static long g_mut_count[M_N], g_mut_refused[M_N];
static long g_ref_checked[API_N]; /* accepted calls checked against a reference */

static void say(fcase *c, const char *fmt, ...) {
    if (c->dlen >= sizeof c->desc - 1) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(c->desc + c->dlen, sizeof c->desc - c->dlen, fmt, ap);
    va_end(ap);
    if (k > 0) c->dlen += (size_t)k;
    if (c->dlen > sizeof c->desc - 1) c->dlen = sizeof c->desc - 1;
}

static uint32_t rnd(fcase *c, uint32_t n) { return n ? (uint32_t)(tu_rng_u64(&c->rng) % n) : 0; }
static int chance(fcase *c, double p) { return tu_rng_uniform(&c->rng) < p; }
static int is_pow2(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }
static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static int draw_seq(fcase *c) {
    uint32_t r = rnd(c, 100);
    if (r < 50) return 1 + (int)rnd(c, 8);
    if (r < 85) return 9 + (int)rnd(c, 16);
    return 25 + (int)rnd(c, 16);
}

static int draw_dim(fcase *c) {
    static const int dims[] = {1, 2, 3, 4, 5, 7, 8, 12, 15, 16, 24, 31, 32, 33, 48, 63, 64};
    return dims[rnd(c, sizeof dims / sizeof dims[0])];
}

static int32_t draw_block(fcase *c) {
    static const int32_t blocks[] = {1, 2, 3, 7, 16, 64, 128, 1000, INT32_MAX - 1, INT32_MAX};
    return blocks[rnd(c, sizeof blocks / sizeof blocks[0])];
}

static fattn_dtype draw_float_dtype(fcase *c) { return (fattn_dtype)rnd(c, 3); /* f32, f16, bf16 */ }

/* ------------------------------------------------------------------------ */
/* Buffers and layouts                                                      */
/* ------------------------------------------------------------------------ */

static void tensor_buf(buf *x, const char *name, int output, fattn_dtype dt, int64_t b, int64_t s,
                       int64_t h, int64_t d) {
    memset(x, 0, sizeof *x);
    x->name = name;
    x->alloc = 1;
    x->output = output;
    x->tensor = 1;
    x->es = fattn_dtype_size(dt);
    x->n[0] = b, x->n[1] = s, x->n[2] = h, x->n[3] = d;
}

static void array_buf(buf *x, const char *name, int output, size_t es, int64_t count) {
    memset(x, 0, sizeof *x);
    x->name = name;
    x->alloc = 1;
    x->output = output;
    x->es = es;
    x->count = count;
}

/* Strides as the library resolves them: all zero = packed BSHD. */
static void strides_of(const buf *x, int64_t st[3]) {
    if (x->st[0] == 0 && x->st[1] == 0 && x->st[2] == 0) {
        st[2] = x->n[3];
        st[1] = x->n[2] * x->n[3];
        st[0] = x->n[1] * st[1];
    } else {
        memcpy(st, x->st, sizeof x->st);
    }
}

/* Bytes from the first element to the last (0: no elements). */
static size_t span_bytes(const buf *x) {
    if (!x->tensor) return (size_t)(x->count > 0 ? x->count : 0) * x->es;
    for (int i = 0; i < 4; i++)
        if (x->n[i] <= 0) return 0;
    int64_t st[3], off = x->n[3] - 1;
    strides_of(x, st);
    for (int i = 0; i < 3; i++) off += (x->n[i] - 1) * st[i];
    return (size_t)(off + 1) * x->es;
}

/* Dimensions ordered outer -> inner by perm (0 batch, 1 seq, 2 head), pad[i]
 * elements after each step of level i. */
static void layout_perm(buf *x, const int perm[3], const int64_t pad[3]) {
    int64_t ext = x->n[3];
    for (int i = 2; i >= 0; i--) {
        const int dm = perm[i];
        x->st[dm] = ext + pad[i];
        ext = x->st[dm] * x->n[dm];
    }
}

static const char *const dim_letter = "bsh";

/* A valid layout: packed (all zero or explicit), or the dimensions in any
 * order with padding; sometimes a size-1 dimension with any stride (it is
 * never multiplied by more than 0), and in varlen mode any stride_batch
 * (ignored). */
static void draw_layout(fcase *c, buf *x) {
    uint32_t r = rnd(c, 100);
    if (r < 45) {
        say(c, " %s:packed0", x->name);
        return;
    }
    int perm[3] = {0, 1, 2};
    int64_t pad[3] = {0, 0, 0};
    if (r >= 55) {
        for (int i = 2; i > 0; i--) {
            int j = (int)rnd(c, (uint32_t)i + 1), t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        for (int i = 0; i < 3; i++)
            if (chance(c, 0.35)) pad[i] = 1 + rnd(c, 9);
    }
    layout_perm(x, perm, pad);
    say(c, " %s:%c%c%c", x->name, dim_letter[perm[0]], dim_letter[perm[1]], dim_letter[perm[2]]);
    if (pad[0] || pad[1] || pad[2]) say(c, "+pad%lld.%lld.%lld", (long long)pad[0], (long long)pad[1], (long long)pad[2]);
    for (int i = 0; i < 3; i++) {
        if (x->n[i] == 1 && chance(c, 0.15)) {
            static const int64_t any[] = {0, 1, 3, 12345, INT64_MAX / 3, INT64_MAX};
            x->st[i] = any[rnd(c, 6)];
            say(c, ",s%c=%lld(size 1)", dim_letter[i], (long long)x->st[i]);
        }
    }
    if (c->varlen && chance(c, 0.1)) {
        /* stride_batch is ignored in varlen mode (fattn.h, fattn_tensor),
         * if not negative: strides are non-negative (fattn.h Conventions,
         * docs/design.md 3 item 6) */
        static const int64_t any[] = {1, 7, 1000000, INT64_MAX};
        x->st[0] = any[rnd(c, 4)];
        say(c, ",sb=%lld(varlen, ignored)", (long long)x->st[0]);
    }
    if (x->st[0] == 0 && x->st[1] == 0 && x->st[2] == 0) x->st[2] = x->n[3]; /* stay explicit */
}

/* M_STRIDE_BAD: a head / seq / batch stride below the head dim, seq and head
 * strides equal (fattn.h's example), or small interleaved strides.  Whether
 * the call may take them is the rules' business (layout_ok). */
static void draw_bad_strides(fcase *c, buf *x) {
    static const int perm[3] = {0, 1, 2};
    static const int64_t nopad[3] = {0, 0, 0};
    layout_perm(x, perm, nopad);
    x->bad_stride = 0; /* a second fault on the same tensor replaces the first */
    const int64_t d = x->n[3];
    for (int tries = 0; tries < 4; tries++) {
        uint32_t r = rnd(c, 5);
        if (r < 3) {
            int dm = 2 - (int)r; /* head, seq, batch */
            if (x->n[dm] <= 1) continue;
            x->st[dm] = rnd(c, (uint32_t)d);
            say(c, " %s:s%c=%lld<d", x->name, dim_letter[dm], (long long)x->st[dm]);
        } else if (r == 3) {
            if (x->n[1] <= 1 || x->n[2] <= 1) continue;
            x->st[1] = x->st[2] = d;
            say(c, " %s:ss=sh=d", x->name);
        } else {
            break;
        }
        if (x->st[0] == 0 && x->st[1] == 0 && x->st[2] == 0) x->st[1] = d + 1;
        return;
    }
    x->st[2] = d + rnd(c, (uint32_t)(2 * d + 3));
    x->st[1] = d + rnd(c, (uint32_t)(2 * d + 3));
    x->st[0] = d + rnd(c, (uint32_t)(x->n[1] * x->n[2] * d * 2 + 1));
    say(c, " %s:interleave(%lld,%lld,%lld)", x->name, (long long)x->st[0], (long long)x->st[1],
        (long long)x->st[2]);
}

static void draw_neg_stride(fcase *c, buf *x) {
    static const int perm[3] = {0, 1, 2};
    static const int64_t nopad[3] = {0, 0, 0};
    layout_perm(x, perm, nopad);
    const int dm = (int)rnd(c, 3);
    x->st[dm] = chance(c, 0.2) ? INT64_MIN : -(int64_t)(1 + rnd(c, (uint32_t)(2 * x->n[3])));
    x->bad_stride = 1; /* negative strides are refused, with elements or without */
    say(c, " %s:s%c=%lld", x->name, dim_letter[dm], (long long)x->st[dm]);
}

/* 0 when every dimension has size 1 (no stride can overflow then).  A
 * tensor without elements (a varlen total of 0) has no largest offset: any
 * non-negative stride is valid there. */
static int draw_huge_stride(fcase *c, buf *x) {
    int cand[3], nc = 0;
    for (int i = c->varlen ? 1 : 0; i < 3; i++)
        if (x->n[i] > 1) cand[nc++] = i;
    if (!nc) return 0;
    static const int perm[3] = {0, 1, 2};
    static const int64_t nopad[3] = {0, 0, 0};
    layout_perm(x, perm, nopad);
    const int dm = cand[rnd(c, (uint32_t)nc)];
    const int64_t m = x->n[dm] - 1;
    switch (rnd(c, 3)) {
    case 0: x->st[dm] = ((INT64_C(1) << 59) + m - 1) / m + (int64_t)rnd(c, 3); break;
    case 1: x->st[dm] = INT64_MAX / 2; break;
    default: x->st[dm] = INT64_MAX; break;
    }
    x->bad_stride = x->n[1] > 0;
    say(c, " %s:s%c=%lld%s", x->name, dim_letter[dm], (long long)x->st[dm], x->bad_stride ? "" : "(no elements)");
    return 1;
}

/* ------------------------------------------------------------------------ */
/* Drawing a case                                                           */
/* ------------------------------------------------------------------------ */

/* lse's entry of query row r of sequence b, head h: [batch, heads_q,
 * seqlen_q], varlen [heads_q, total_q] */
static int64_t lse_index(const fcase *c, int b, int64_t h, int r) {
    return c->varlen ? h * c->tq + c->cuq[b] + r : ((int64_t)b * c->hq + h) * c->tq + r;
}

/* Query rows sequence b computes: its count, or fewer with seqused_q */
static int qlen_of(const fcase *c, int b) {
    const int lq = c->varlen ? c->lens_q[b] : c->sq;
    return c->api == API_FWD && c->has_squ && c->squ[b] < lq ? c->squ[b] : lq;
}

static int attention(const fcase *c) { return c->api == API_FWD || c->api == API_BWD || c->api == API_FP8; }

/* Whether fault k can be applied to the case as drawn so far. */
static int applicable(const fcase *c, mkind k) {
    switch (k) {
    case M_DIM_BIG: return attention(c) || c->api == API_KVA;
    case M_GQA:
    case M_SCALE_BAD:
    case M_CU_ONE_NULL: return attention(c);
    case M_E4M3_NOSCALE:
    case M_E4M3_BLOCK: return c->api == API_FWD && c->dt == FATTN_DTYPE_E4M3;
    case M_CU_START:
    case M_CU_DECREASE:
    case M_CU_TOO_LONG: return attention(c) && c->varlen && (c->sq > 0 || c->sk > 0);
    case M_SIZE_HUGE: return !(attention(c) && c->varlen) || c->tq >= 2 || c->tk >= 2;
    case M_QUANT_GRAN:
    case M_QUANT_BLOCK: return c->api == API_QUANT || c->api == API_FP8;
    case M_ROTATE: return (c->api == API_QUANT || c->api == API_FP8) && !is_pow2(c->d);
    case M_SEQU_NEG: return c->api == API_FWD && c->has_sequ;
    case M_SERV_RANGE: return c->api == API_FWD && (c->has_squ || c->has_cbi);
    case M_SERV_PTR: return c->api == API_FWD && (c->has_sequ || c->paged);
    case M_PAGE_FIELD: return c->api == API_FWD;
    case M_PAGE_HUGE:
    case M_PAGE_SHORT:
    case M_PAGE_ENTRY:
    case M_PAGE_VARLEN: return c->api == API_FWD && c->paged;
    case M_FP8_SERVING: return c->api == API_FP8;
    case M_MERGE_NPARTS: return c->api == API_MERGE;
    case M_KVA_SEQLENS:
    case M_KVA_PAGE: return c->api == API_KVA;
    case M_KVA_TWICE: return c->api == API_KVA && c->paged;
    case M_KVA_HUGE: return c->api == API_KVA && (c->paged || c->batch * c->hkv >= 2);
    case M_VARIANT: return attention(c);
    default: return 1;
    }
}

/* fattn_fwd's serving fields on the drawn problem: seqused_k (any mode),
 * a paged K/V (fixed-length batches; k and v become page pools).  Table
 * entries that no used key reads may hold anything (fattn_fwd_args). */
static void draw_serving(fcase *c) {
    c->has_sequ = chance(c, 0.3);
    c->paged = !c->varlen && !c->qkv_packed && chance(c, 0.3);
    for (int b = 0; b < c->batch; b++) {
        const int lk = c->varlen ? c->lens_k[b] : c->sk;
        c->used[b] = lk;
        if (!c->has_sequ) continue;
        switch (rnd(c, 6)) {
        case 0: c->sequ[b] = 0; break;
        case 1: case 2: c->sequ[b] = (int32_t)rnd(c, (uint32_t)lk + 1); break;
        case 3: c->sequ[b] = lk; break;
        case 4: c->sequ[b] = lk + 1 + (int32_t)rnd(c, 5); break;
        default: c->sequ[b] = INT32_MAX; break;
        }
        if (c->sequ[b] < lk) c->used[b] = c->sequ[b];
    }
    /* cache_leftpad: 0 .. the used end (fattn_fwd_args), often 0 or the end */
    c->has_pad = chance(c, 0.25);
    for (int b = 0; b < c->batch; b++) {
        c->pad[b] = !c->has_pad ? 0 : chance(c, 0.2) ? c->used[b] : (int32_t)rnd(c, (uint32_t)c->used[b] + 1);
        c->used[b] -= c->pad[b];
    }
    /* seqused_q: any count, the rows past it not written; cache_batch_idx:
     * a dense fixed-length cache of cache_batch entries, any (repeated) ones */
    c->has_squ = chance(c, 0.25);
    for (int b = 0; b < c->batch && c->has_squ; b++) {
        const int lq = c->varlen ? c->lens_q[b] : c->sq;
        switch (rnd(c, 5)) {
        case 0: c->squ[b] = 0; break;
        case 1: case 2: c->squ[b] = (int32_t)rnd(c, (uint32_t)lq + 1); break;
        case 3: c->squ[b] = lq + (int32_t)rnd(c, 3); break;
        default: c->squ[b] = INT32_MAX; break;
        }
    }
    c->has_cbi = !c->varlen && !c->paged && !c->qkv_packed && chance(c, 0.25);
    c->cbatch = c->has_cbi ? 1 + (int)rnd(c, (uint32_t)c->batch + 2) : 0;
    for (int b = 0; b < c->batch && c->has_cbi; b++) c->cbi[b] = (int32_t)rnd(c, (uint32_t)c->cbatch);
    if (c->paged) {
        static const int ps_values[] = {1, 2, 3, 4, 5, 8, 16, 64};
        c->ps = ps_values[rnd(c, 8)];
        const int need = (int)cdiv(c->sk, c->ps);
        c->mpps = need + (chance(c, 0.3) ? (int)rnd(c, 3) : 0);
        c->npages = 1 + (int)rnd(c, (uint32_t)(c->batch * need + 2)); /* fewer than needed: shared pages */
        const int garbage = chance(c, 0.3);
        for (int b = 0; b < c->batch; b++)
            for (int i = 0; i < c->mpps; i++) {
                int32_t e = (int32_t)rnd(c, (uint32_t)c->npages);
                if (garbage && (c->used[b] == 0 || i < c->pad[b] / c->ps ||
                                i >= cdiv(c->pad[b] + c->used[b], c->ps))) { /* not read */
                    static const int32_t g[] = {-1, INT32_MIN, INT32_MAX, 12345};
                    e = chance(c, 0.2) ? c->npages : g[rnd(c, 4)];
                }
                c->table[b * c->mpps + i] = e;
            }
    }
}

static void say_serving(fcase *c) {
    if (c->has_sequ) {
        say(c, " seqused_k[");
        for (int b = 0; b < c->batch; b++) say(c, "%s%d", b ? "," : "", (int)c->sequ[b]);
        say(c, "]");
    }
    if (c->has_pad) {
        say(c, " cache_leftpad[");
        for (int b = 0; b < c->batch; b++) say(c, "%s%d", b ? "," : "", (int)c->pad[b]);
        say(c, "]");
    }
    if (c->has_squ) {
        say(c, " seqused_q[");
        for (int b = 0; b < c->batch; b++) say(c, "%s%d", b ? "," : "", (int)c->squ[b]);
        say(c, "]");
    }
    if (c->has_cbi) {
        say(c, " cache_batch %d cache_batch_idx[", c->cbatch);
        for (int b = 0; b < c->batch; b++) say(c, "%s%d", b ? "," : "", (int)c->cbi[b]);
        say(c, "]");
    }
    if (c->paged) {
        say(c, " paged ps%d pages%d mpps%d table[", c->ps, c->npages, c->mpps);
        for (int i = 0; i < c->batch * c->mpps; i++) say(c, "%s%d", i ? (i % c->mpps ? "," : "|") : "", (int)c->table[i]);
        say(c, "]");
    }
}

/* fattn_kv_append: cache_seqlens, the cache, the table.  Pages that new
 * rows land in are drawn so that no cache row is written twice (shared
 * pages included); entries no new row reads may hold anything. */
static void draw_kv_append(fcase *c) {
    c->batch = 1 + (int)rnd(c, MAX_BATCH);
    c->sq = chance(c, 0.7) ? 1 + (int)rnd(c, 4) : draw_seq(c);
    c->hkv = 1 + (int)rnd(c, 3);
    c->d = draw_dim(c);
    c->dt = c->dto = draw_float_dtype(c);
    c->kv_shared = chance(c, 0.1);
    int rows = 0;
    for (int b = 0; b < c->batch; b++) {
        c->cs[b] = chance(c, 0.2) ? 0 : (int32_t)rnd(c, 41);
        if (c->cs[b] + c->sq > rows) rows = c->cs[b] + c->sq;
    }
    c->paged = chance(c, 0.5);
    say(c, "kv_append %s b%d new%d hkv%d d%d cache_seqlens[", fattn_dtype_name(c->dt), c->batch, c->sq, c->hkv, c->d);
    for (int b = 0; b < c->batch; b++) say(c, "%s%d", b ? "," : "", (int)c->cs[b]);
    say(c, "]%s", c->kv_shared ? " k_new=v_new" : "");
    if (!c->paged) {
        c->cap = rows + (chance(c, 0.5) ? (int32_t)rnd(c, 4) : 0);
        say(c, " capacity %d", (int)c->cap);
        return;
    }
    static const int ps_values[] = {1, 2, 3, 4, 8, 16};
    static uint8_t claimed[MAX_POOL][16];
    memset(claimed, 0, sizeof claimed);
    c->ps = ps_values[rnd(c, 6)];
    const int need = (int)cdiv(rows, c->ps);
    c->mpps = need + (chance(c, 0.3) ? (int)rnd(c, 3) : 0);
    c->npages = 1 + (int)rnd(c, (uint32_t)(c->batch * need + 2));
    const int garbage = chance(c, 0.3);
    for (int b = 0; b < c->batch; b++)
        for (int i = 0; i < c->mpps; i++) {
            const int lo = i * c->ps > c->cs[b] ? i * c->ps : c->cs[b];
            const int hi = (i + 1) * c->ps < c->cs[b] + c->sq ? (i + 1) * c->ps : c->cs[b] + c->sq;
            int32_t e;
            if (lo < hi) { /* new rows land in page i */
                int tries = 0, ok = 0;
                do {
                    e = (int32_t)rnd(c, (uint32_t)c->npages);
                    ok = 1;
                    for (int r = lo; r < hi; r++) ok &= !claimed[e][r - i * c->ps];
                } while (!ok && ++tries < 6);
                if (!ok && c->npages < MAX_POOL) e = c->npages++;
                for (int r = lo; r < hi; r++) claimed[e][r - i * c->ps] = 1;
            } else if (garbage) {
                static const int32_t g[] = {-1, INT32_MIN, INT32_MAX, 12345};
                e = chance(c, 0.2) ? MAX_POOL : g[rnd(c, 4)];
            } else {
                e = (int32_t)rnd(c, (uint32_t)c->npages);
            }
            c->table[b * c->mpps + i] = e;
        }
    if (chance(c, 0.5)) {
        static const int32_t g[] = {0, -1, INT32_MIN, 5, INT32_MAX};
        c->cap = g[rnd(c, 5)]; /* ignored with a table */
    }
    say(c, " capacity %d", (int)c->cap);
    say_serving(c);
}

/* batch, seqlen, heads and head_dim of a merge or quantize call */
static void draw_bshd(fcase *c) {
    c->batch = 1 + (int)rnd(c, MAX_BATCH);
    c->sq = c->tq = draw_seq(c);
    c->hq = 1 + (int)rnd(c, 4);
    c->d = draw_dim(c);
}

static void draw_problem(fcase *c) {
    if (c->api == API_KVA) {
        draw_kv_append(c);
        return;
    }
    if (c->api == API_MERGE) {
        draw_bshd(c);
        c->dto = draw_float_dtype(c);
        c->nparts = chance(c, 0.03) ? FATTN_MERGE_MAX_PARTS : 1 + (int)rnd(c, MERGE_DISTINCT);
        c->nd = c->nparts <= MERGE_DISTINCT ? c->nparts : 1 + (int)rnd(c, MERGE_DISTINCT);
        for (int i = 0; i < c->nd; i++) c->pdt[i] = draw_float_dtype(c);
        c->want_lse = chance(c, 0.7);
        c->lse_inf = chance(c, 0.4);
        say(c, "merge b%d s%d h%d d%d parts %d (%d distinct:", c->batch, c->sq, c->hq, c->d, c->nparts, c->nd);
        for (int i = 0; i < c->nd; i++) say(c, " %s", fattn_dtype_name(c->pdt[i]));
        say(c, ") -> %s%s%s", fattn_dtype_name(c->dto), c->want_lse ? " lse" : "", c->lse_inf ? " -inf parts" : "");
        return;
    }
    if (c->api == API_QUANT) {
        draw_bshd(c);
        c->dt = draw_float_dtype(c);
        c->blk[0] = draw_block(c);
        c->rotate = is_pow2(c->d) && chance(c, 0.4);
        say(c, "quantize %s b%d s%d h%d d%d block_rows %d%s", fattn_dtype_name(c->dt), c->batch, c->sq, c->hq,
            c->d, (int)c->blk[0], c->rotate ? " rotate" : "");
        return;
    }
    c->qkv_packed = chance(c, 0.08);
    c->kv_shared = !c->qkv_packed && chance(c, 0.1);
    c->batch = 1 + (int)rnd(c, MAX_BATCH);
    c->hkv = 1 + (int)rnd(c, 3);
    c->hq = c->hkv * (c->qkv_packed ? 1 : 1 + (int)rnd(c, 3));
    c->d = draw_dim(c);
    c->dv = (c->qkv_packed || c->kv_shared || chance(c, 0.7)) ? c->d : draw_dim(c);
    c->dv_arg = (c->dv == c->d && chance(c, 0.5)) ? 0 : c->dv;
    static const int causal_values[] = {0, 0, 0, 1, 1, 7, -3};
    c->causal = causal_values[rnd(c, 7)];
    c->varlen = chance(c, 0.25);
    if (c->varlen) {
        int mq = 0, mk = 0;
        c->cuq[0] = c->cuk[0] = 0;
        for (int b = 0; b < c->batch; b++) {
            c->lens_q[b] = chance(c, 0.1) ? 0 : draw_seq(c);
            c->lens_k[b] = c->qkv_packed ? c->lens_q[b] : chance(c, 0.1) ? 0 : draw_seq(c);
            if (c->lens_q[b] > mq) mq = c->lens_q[b];
            if (c->lens_k[b] > mk) mk = c->lens_k[b];
            c->cuq[b + 1] = c->cuq[b] + c->lens_q[b];
            c->cuk[b + 1] = c->cuk[b] + c->lens_k[b];
        }
        c->tq = c->cuq[c->batch];
        c->tk = c->cuk[c->batch];
        c->sq = mq, c->sk = mk;
        c->sq_arg = chance(c, 0.04) ? INT32_MAX : mq + (chance(c, 0.3) ? (int)rnd(c, 5) : 0);
        c->sk_arg = chance(c, 0.04) ? INT32_MAX : mk + (chance(c, 0.3) ? (int)rnd(c, 5) : 0);
    } else {
        c->sq = c->tq = c->sq_arg = draw_seq(c);
        c->sk = c->tk = c->sk_arg = c->qkv_packed ? c->sq : draw_seq(c);
    }
    switch (c->api) {
    case API_FWD: {
        c->dt = (fattn_dtype)rnd(c, 4);
        c->dto = c->dt == FATTN_DTYPE_E4M3 ? draw_float_dtype(c) : c->dt;
        if (c->dt == FATTN_DTYPE_E4M3)
            for (int i = 0; i < 3; i++) c->blk[i] = draw_block(c);
        draw_serving(c);
        break;
    }
    case API_BWD: c->dt = c->dto = draw_float_dtype(c); break;
    default: /* API_FP8 */
        c->dt = draw_float_dtype(c);
        c->dto = draw_float_dtype(c);
        c->opt_null = chance(c, 0.2);
        if (!c->opt_null) {
            static const int32_t blocks[] = {0, 0, 1, 2, 5, 16, 128, 1000, INT32_MAX};
            c->opt.granularity = chance(c, 0.3) ? FATTN_QUANT_TENSOR : FATTN_QUANT_BLOCK;
            c->opt.block_rows_q = blocks[rnd(c, 9)];
            c->opt.block_rows_k = blocks[rnd(c, 9)];
            c->opt.block_rows_v = blocks[rnd(c, 9)];
            c->opt.rotate = is_pow2(c->d) && chance(c, 0.4) ? (chance(c, 0.5) ? 1 : -2) : 0;
            c->opt.seed = tu_rng_u64(&c->rng);
        }
        break;
    }
    c->want_lse = c->api == API_BWD || chance(c, 0.7);
    switch (rnd(c, 10)) {
    case 0: case 1: case 2: case 3: c->softmax_scale = 0.0f; break;
    case 4: c->softmax_scale = -0.0f; break; /* == 0: the default */
    case 5: c->softmax_scale = 1e-40f; break; /* subnormal */
    default: c->softmax_scale = (float)(0.01 + tu_rng_uniform(&c->rng)); break;
    }
    /* the variants: a window of any sides (-1 unbounded), softcap, sinks */
    if (chance(c, 0.3)) {
        static const int sides[] = {-1, -1, 0, 1, 2, 5, 17, 100};
        c->win = chance(c, 0.5) ? 1 : 3; /* any nonzero value is the flag */
        c->wl = sides[rnd(c, 8)];
        c->wr = sides[rnd(c, 8)];
    }
    if (chance(c, 0.2)) {
        static const float caps[] = {0.5f, 5.0f, 30.0f};
        c->softcap = caps[rnd(c, 3)];
    }
    if (chance(c, 0.25)) {
        c->has_sink = 1;
        for (int h = 0; h < c->hq; h++) c->sink[h] = (float)(tu_rng_normal(&c->rng) * 3.0);
        if (chance(c, 0.2)) c->sink[rnd(c, (uint32_t)c->hq)] = chance(c, 0.5) ? 30.0f : -30.0f;
        c->want_dsink = c->api == API_BWD && chance(c, 0.8);
    }
    say(c, "%s %s->%s b%d sq%d sk%d hq%d hkv%d d%d dv%d%s causal%d scale%g%s", api_name[c->api],
        fattn_dtype_name(c->dt), fattn_dtype_name(c->dto), c->batch, c->sq_arg, c->sk_arg, c->hq, c->hkv, c->d,
        c->dv_arg, c->dv_arg ? "" : "(=d)", c->causal, (double)c->softmax_scale, c->want_lse ? " lse" : "");
    if (c->varlen) {
        say(c, " varlen q[");
        for (int b = 0; b < c->batch; b++) say(c, "%s%d", b ? "," : "", c->lens_q[b]);
        say(c, "] k[");
        for (int b = 0; b < c->batch; b++) say(c, "%s%d", b ? "," : "", c->lens_k[b]);
        say(c, "]");
    }
    if (c->dt == FATTN_DTYPE_E4M3 && c->api == API_FWD)
        say(c, " blocks %d,%d,%d", (int)c->blk[0], (int)c->blk[1], (int)c->blk[2]);
    if (c->api == API_FP8) {
        if (c->opt_null) say(c, " opt NULL");
        else
            say(c, " opt{%s q%d k%d v%d rot%d}", c->opt.granularity == FATTN_QUANT_TENSOR ? "tensor" : "block",
                (int)c->opt.block_rows_q, (int)c->opt.block_rows_k, (int)c->opt.block_rows_v, (int)c->opt.rotate);
    }
    if (c->qkv_packed) say(c, " qkv-packed");
    if (c->kv_shared) say(c, " k=v");
    if (c->win) say(c, " window%d(%d,%d)", c->win, c->wl, c->wr);
    if (c->softcap > 0.0f) say(c, " softcap%g", (double)c->softcap);
    if (c->has_sink) say(c, " sink%s", c->want_dsink ? "+dsink" : "");
    say_serving(c);
}

static int has_mut(const fcase *c, mkind k) {
    for (int i = 0; i < c->nmut; i++)
        if (c->mut[i] == k) return 1;
    return 0;
}

static const char *const part_names[2][MERGE_DISTINCT] = {{"parts[0].o", "parts[1].o", "parts[2].o", "parts[3].o"},
                                                           {"parts[0].lse", "parts[1].lse", "parts[2].lse", "parts[3].lse"}};

static void make_bufs(fcase *c) {
    memset(c->b, 0, sizeof c->b);
    if (c->api == API_KVA) {
        const int64_t cb = c->paged ? c->npages : c->batch, cr = c->paged ? c->ps : c->cap;
        tensor_buf(&c->b[BK], "k_new", 0, c->dt, c->batch, c->sq, c->hkv, c->d);
        tensor_buf(&c->b[BV], "v_new", 0, c->dt, c->batch, c->sq, c->hkv, c->d);
        tensor_buf(&c->b[BDK], "k_cache", 1, c->dt, cb, cr, c->hkv, c->d);
        tensor_buf(&c->b[BDV], "v_cache", 1, c->dt, cb, cr, c->hkv, c->d);
        array_buf(&c->b[BCSL], "cache_seqlens", 0, 4, c->batch);
        if (c->paged) array_buf(&c->b[BTABLE], "block_table", 0, 4, (int64_t)c->batch * c->mpps);
        return;
    }
    if (c->api == API_MERGE) {
        const int64_t rows = (int64_t)c->batch * c->hq * c->sq;
        for (int i = 0; i < c->nd; i++) {
            tensor_buf(&c->b[BP0 + i], part_names[0][i], 0, c->pdt[i], c->batch, c->sq, c->hq, c->d);
            array_buf(&c->b[BPL0 + i], part_names[1][i], 0, 4, rows);
        }
        tensor_buf(&c->b[BO], "o", 1, c->dto, c->batch, c->sq, c->hq, c->d);
        if (c->want_lse) array_buf(&c->b[BLSE], "lse", 1, 4, rows);
        return;
    }
    if (c->api == API_QUANT) {
        tensor_buf(&c->b[BQ], "in", 0, c->dt, c->batch, c->sq, c->hq, c->d);
        tensor_buf(&c->b[BO], "out", 1, FATTN_DTYPE_E4M3, c->batch, c->sq, c->hq, c->d);
        array_buf(&c->b[BQS], "out.scale", 1, 4, (int64_t)c->batch * c->hq * cdiv(c->sq, c->blk[0]));
        return;
    }
    const int64_t nb = c->varlen ? 1 : c->batch;
    tensor_buf(&c->b[BQ], "q", 0, c->dt, nb, c->tq, c->hq, c->d);
    const int64_t kb = c->paged ? c->npages : c->has_cbi ? c->cbatch : nb, kt = c->paged ? c->ps : c->tk; /* page pools */
    tensor_buf(&c->b[BK], "k", 0, c->dt, kb, kt, c->hkv, c->d);
    tensor_buf(&c->b[BV], "v", 0, c->dt, kb, kt, c->hkv, c->dv);
    tensor_buf(&c->b[BO], "o", c->api != API_BWD, c->dto, nb, c->tq, c->hq, c->dv);
    if (c->want_lse) array_buf(&c->b[BLSE], "lse", c->api != API_BWD, 4, nb * c->hq * c->tq);
    if (c->api == API_BWD) {
        tensor_buf(&c->b[BDOUT], "dout", 0, c->dt, nb, c->tq, c->hq, c->dv);
        tensor_buf(&c->b[BDQ], "dq", 1, c->dt, nb, c->tq, c->hq, c->d);
        tensor_buf(&c->b[BDK], "dk", 1, c->dt, nb, c->tk, c->hkv, c->d);
        tensor_buf(&c->b[BDV], "dv", 1, c->dt, nb, c->tk, c->hkv, c->dv);
    }
    if (c->api == API_FWD && c->dt == FATTN_DTYPE_E4M3) {
        array_buf(&c->b[BQS], "q.scale", 0, 4, nb * c->hq * cdiv(c->tq, c->blk[0]));
        array_buf(&c->b[BKS], "k.scale", 0, 4, kb * c->hkv * cdiv(kt, c->blk[1]));
        array_buf(&c->b[BVS], "v.scale", 0, 4, kb * c->hkv * cdiv(kt, c->blk[2]));
    }
    if (c->api == API_FP8 && has_mut(c, M_FP8_SERVING)) {
        c->has_sequ = 1;
        for (int b = 0; b < c->batch; b++) c->sequ[b] = c->varlen ? c->lens_k[b] : c->sk;
    }
    if (c->has_sequ) array_buf(&c->b[BSEQU], "seqused_k", 0, 4, c->batch);
    if (c->has_pad) array_buf(&c->b[BPAD], "cache_leftpad", 0, 4, c->batch);
    if (c->has_squ) array_buf(&c->b[BSQU], "seqused_q", 0, 4, c->batch);
    if (c->has_cbi) array_buf(&c->b[BCBI], "cache_batch_idx", 0, 4, c->batch);
    if (c->paged) array_buf(&c->b[BTABLE], "block_table", 0, 4, (int64_t)c->batch * c->mpps);
    /* always there: a fixed-length call may be given one of them (M_CU_ONE_NULL) */
    array_buf(&c->b[BCUQ], "cu_seqlens_q", 0, 4, c->batch + 1);
    array_buf(&c->b[BCUK], "cu_seqlens_k", 0, 4, c->batch + 1);
}

static int tensor_ids(const fcase *c, int *ids) {
    int n = 0;
    for (int i = 0; i < NBUF; i++)
        if (c->b[i].alloc && c->b[i].tensor) ids[n++] = i;
    return n;
}

static int output_ids(const fcase *c, int *ids) {
    int n = 0;
    for (int i = 0; i < NBUF; i++)
        if (c->b[i].alloc && c->b[i].output) ids[n++] = i;
    return n;
}

static void draw_layouts(fcase *c) {
    int ids[NBUF], n = tensor_ids(c, ids);
    for (int i = 0; i < n; i++) {
        buf *x = &c->b[ids[i]];
        if ((c->qkv_packed && (ids[i] == BK || ids[i] == BV)) || (c->kv_shared && ids[i] == BV)) continue;
        if (c->qkv_packed && ids[i] == BQ) {
            /* [batch, seq, 3, heads, d]: q, k, v slices 0, 1, 2 */
            const int64_t hd = x->n[2] * x->n[3];
            x->st[2] = x->n[3];
            x->st[1] = 3 * hd;
            x->st[0] = x->n[1] * 3 * hd;
            say(c, " q:qkv");
            continue;
        }
        draw_layout(c, x);
    }
    for (int m = 0; m < c->nmut; m++) {
        const mkind k = c->mut[m];
        if (k != M_STRIDE_BAD && k != M_STRIDE_NEG && k != M_STRIDE_HUGE) continue;
        for (int tries = 0; tries < 8; tries++) {
            buf *x = &c->b[ids[rnd(c, (uint32_t)n)]];
            if (c->qkv_packed && (x == &c->b[BQ] || x == &c->b[BK] || x == &c->b[BV])) continue;
            if (c->kv_shared && (x == &c->b[BK] || x == &c->b[BV])) continue;
            say(c, " |");
            if (k == M_STRIDE_BAD) draw_bad_strides(c, x);
            else if (k == M_STRIDE_NEG) draw_neg_stride(c, x);
            else if (!draw_huge_stride(c, x)) {
                say(c, " (no dim > 1 in %s)", x->name);
                continue;
            }
            break;
        }
    }
    if (c->qkv_packed) {
        memcpy(c->b[BK].st, c->b[BQ].st, sizeof c->b[BQ].st);
        memcpy(c->b[BV].st, c->b[BQ].st, sizeof c->b[BQ].st);
    }
    if (c->kv_shared) memcpy(c->b[BV].st, c->b[BK].st, sizeof c->b[BK].st);
}

/* ------------------------------------------------------------------------ */
/* The arena                                                                */
/* ------------------------------------------------------------------------ */

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static void place(fcase *c) {
    size_t maxb = 64;
    for (int i = 0; i < NBUF; i++) {
        buf *x = &c->b[i];
        if (!x->alloc) continue;
        if (x->bad_stride) { /* storage as if packed */
            int64_t st[3];
            memcpy(st, x->st, sizeof st);
            memset(x->st, 0, sizeof x->st);
            x->bytes = span_bytes(x);
            memcpy(x->st, st, sizeof st);
        } else {
            x->bytes = span_bytes(x);
        }
        if (x->bytes > maxb) maxb = x->bytes;
    }
    if (c->qkv_packed) c->b[BQ].bytes = span_bytes(&c->b[BQ]) + 2 * (size_t)c->hq * c->d * c->b[BQ].es;
    if (c->b[BQ].bytes > maxb) maxb = c->b[BQ].bytes;
    /* room before the first and after the last buffer for an output laid
     * just outside one, three times over: up to three mutations can chain
     * such moves (o just before lse, which was moved just before q) */
    c->front = align_up(3 * (maxb + 64), 64);
    size_t cur = c->front;
    for (int i = 0; i < NBUF; i++) {
        buf *x = &c->b[i];
        if (!x->alloc || (c->qkv_packed && (i == BK || i == BV)) || (c->kv_shared && i == BV)) continue;
        cur = align_up(cur + 8 + rnd(c, 64), 64);
        /* e4m3 data at any address; others at a random multiple of their size */
        cur += x->es * rnd(c, x->es == 1 ? 16 : 16 / (uint32_t)x->es);
        x->region = x->off = cur;
        cur += x->bytes ? x->bytes : 1;
    }
    if (c->qkv_packed) {
        const size_t slice = (size_t)c->hq * c->d * c->b[BQ].es;
        c->b[BK].off = c->b[BQ].off + slice;
        c->b[BV].off = c->b[BQ].off + 2 * slice;
        c->b[BK].region = c->b[BV].region = c->b[BQ].region;
        c->b[BK].alloc = c->b[BV].alloc = 0; /* storage is q's */
    }
    if (c->kv_shared) {
        c->b[BV].off = c->b[BV].region = c->b[BK].off;
        c->b[BV].alloc = 0;
    }
    c->arena_bytes = align_up(cur + 64 + c->front, 64);
    c->arena = (uint8_t *)aligned_alloc(64, c->arena_bytes);
    c->before = (uint8_t *)malloc(c->arena_bytes);
    if (!c->arena || !c->before) {
        fprintf(stderr, "test_fuzz: out of memory (%zu bytes)\n", c->arena_bytes);
        exit(1);
    }
}

/* The bytes a buffer spans (a refused layout: its storage). */
static size_t span_or_storage(const buf *x) { return x->bad_stride ? x->bytes : span_bytes(x); }

/* Alignment of what a buffer's pointer holds. */
static size_t align_of(const buf *x) { return x->es; }

/* M_OVERLAP / M_TOUCH: an output's pointer moved into (or just outside)
 * another buffer of the call.  Its own storage stays, untouched. */
static void lay_over(fcase *c, int touch) {
    int outs[NBUF], no = output_ids(c, outs);
    for (int tries = 0; tries < 16; tries++) {
        buf *x = &c->b[outs[rnd(c, (uint32_t)no)]];
        const int yi = (int)rnd(c, NBUF);
        buf *y = &c->b[yi];
        const size_t xb = span_or_storage(x), yb = span_or_storage(y);
        if (y == x || !y->name || !yb || !xb) continue;
        if ((yi == BCUQ || yi == BCUK) && !c->varlen) continue;
        const size_t a = align_of(x);
        size_t off;
        if (touch) {
            off = chance(c, 0.5) ? align_up(y->off + yb, a) : (y->off - xb) / a * a;
        } else {
            const int64_t lo = -(int64_t)xb + 1, hi = (int64_t)yb - 1;
            const int64_t delta = lo + (int64_t)(tu_rng_u64(&c->rng) % (uint64_t)(hi - lo + 1));
            off = (size_t)((int64_t)y->off + delta) / a * a;
        }
        x->off = off;
        say(c, " | %s %s %s (%+lld B)", x->name, touch ? "next to" : "over", y->name,
            (long long)((int64_t)off - (int64_t)y->off));
        return;
    }
}

/* Element (b, s, h, e) of a tensor: its byte offset in the arena. */
static size_t elem_off(const buf *x, const int64_t st[3], int64_t b, int64_t s, int64_t h, int64_t e) {
    return x->off + (size_t)(b * st[0] + s * st[1] + h * st[2] + e) * x->es;
}

static void put(uint8_t *p, fattn_dtype dt, double v) {
    const float f = (float)v;
    switch (dt) {
    case FATTN_DTYPE_F32: memcpy(p, &f, 4); break;
    case FATTN_DTYPE_F16: { uint16_t h = fattn_f32_to_f16(f); memcpy(p, &h, 2); break; }
    case FATTN_DTYPE_BF16: { uint16_t h = fattn_f32_to_bf16(f); memcpy(p, &h, 2); break; }
    default: *p = fattn_f32_to_e4m3(f); break;
    }
}

static double get(const uint8_t *p, fattn_dtype dt) {
    switch (dt) {
    case FATTN_DTYPE_F32: { float f; memcpy(&f, p, 4); return f; }
    case FATTN_DTYPE_F16: { uint16_t h; memcpy(&h, p, 2); return fattn_f16_to_f32(h); }
    case FATTN_DTYPE_BF16: { uint16_t h; memcpy(&h, p, 2); return fattn_bf16_to_f32(h); }
    default: return fattn_e4m3_to_f32(*p);
    }
}

static fattn_dtype dtype_of(const fcase *c, int id) {
    if (c->api == API_MERGE) return id >= BP0 && id < BP0 + MERGE_DISTINCT ? c->pdt[id - BP0] : c->dto;
    if (c->api == API_QUANT) return id == BO ? FATTN_DTYPE_E4M3 : c->dt;
    return id == BO ? c->dto : c->dt;
}

static void fill_tensor(fcase *c, int id) {
    const buf *x = &c->b[id];
    const fattn_dtype dt = dtype_of(c, id);
    int64_t st[3];
    strides_of(x, st);
    for (int64_t b = 0; b < x->n[0]; b++)
        for (int64_t s = 0; s < x->n[1]; s++)
            for (int64_t h = 0; h < x->n[2]; h++)
                for (int64_t e = 0; e < x->n[3]; e++) {
                    const double v = tu_rng_normal(&c->rng) * (dt == FATTN_DTYPE_E4M3 ? 16.0 : 1.0);
                    put(c->arena + elem_off(x, st, b, s, h, e), dt, v);
                }
}

static void put_f32(fcase *c, const buf *x, int64_t i, float f) { memcpy(c->arena + x->off + 4 * (size_t)i, &f, 4); }

/* Row s of batch entry (page) b of k / v that key j of sequence bb reads
 * (j counts from its left pad). */
static void key_row(const fcase *c, int bb, int j, int64_t *b, int64_t *s) {
    j += c->pad[bb];
    if (c->paged) *b = c->table[bb * c->mpps + j / c->ps], *s = j % c->ps;
    else if (c->varlen) *b = 0, *s = c->cuk[bb] + j;
    else *b = c->has_cbi ? c->cbi[bb] : bb, *s = j;
}

/* NaN (0xFF in every dtype) in the rows of k and v that no sequence uses:
 * keys past seqused_k, pages no used key reads.  They must not reach o
 * (fattn_fwd_args: "whatever they hold, NaN included").  Bytes that a used
 * row or q also holds (k = v, packed qkv, rows aliased by their strides)
 * stay. */
static void poison_unused_keys(fcase *c) {
    const buf *q = &c->b[BQ], *k = &c->b[BK], *v = &c->b[BV];
    if (q->bad_stride || k->bad_stride || v->bad_stride) return;
    const int64_t rows = k->n[0] * k->n[1];
    uint8_t *used = (uint8_t *)calloc((size_t)rows + 1, 1), *keep = (uint8_t *)calloc(c->arena_bytes, 1);
    if (!used || !keep) exit(1);
    for (int bb = 0; bb < c->batch; bb++)
        for (int j = 0; j < c->used[bb]; j++) {
            int64_t b, s;
            key_row(c, bb, j, &b, &s);
            used[b * k->n[1] + s] = 1;
        }
    int64_t qst[3], kst[3], vst[3], n = 0;
    strides_of(q, qst);
    strides_of(k, kst);
    strides_of(v, vst);
    for (int64_t b = 0; b < q->n[0]; b++)
        for (int64_t s = 0; s < q->n[1]; s++)
            for (int64_t h = 0; h < q->n[2]; h++) memset(keep + elem_off(q, qst, b, s, h, 0), 1, (size_t)q->n[3] * q->es);
    for (int pass = 0; pass < 2; pass++)
        for (int64_t b = 0; b < k->n[0]; b++)
            for (int64_t s = 0; s < k->n[1]; s++) {
                if (used[b * k->n[1] + s] != !pass) continue; /* pass 0: mark the used rows; 1: poison the others */
                n += pass;
                for (int64_t h = 0; h < k->n[2]; h++) {
                    const size_t ko = elem_off(k, kst, b, s, h, 0), vo = elem_off(v, vst, b, s, h, 0);
                    const size_t kn = (size_t)k->n[3] * k->es, vn = (size_t)v->n[3] * v->es;
                    if (!pass) {
                        memset(keep + ko, 1, kn), memset(keep + vo, 1, vn);
                        continue;
                    }
                    for (size_t i = 0; i < kn; i++)
                        if (!keep[ko + i]) c->arena[ko + i] = 0xFF;
                    for (size_t i = 0; i < vn; i++)
                        if (!keep[vo + i]) c->arena[vo + i] = 0xFF;
                }
            }
    free(used);
    free(keep);
    c->poisoned = n > 0;
    if (n) say(c, " | %lld unused key rows NaN", (long long)n);
}

/* fattn_merge: a part whose lse is -inf for a row "may hold anything, NaN
 * included" there: its o row is NaN (bytes that a read row also holds, in a
 * part whose strides alias its rows, stay). */
static void poison_unread_parts(fcase *c) {
    uint8_t *keep = (uint8_t *)calloc(c->arena_bytes, 1);
    if (!keep) exit(1);
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < c->nd && i < MERGE_DISTINCT; i++) {
            const buf *x = &c->b[BP0 + i], *l = &c->b[BPL0 + i];
            if (x->bad_stride) continue;
            int64_t st[3];
            strides_of(x, st);
            const size_t nb = (size_t)x->n[3] * x->es;
            for (int64_t b = 0; b < x->n[0]; b++)
                for (int64_t h = 0; h < x->n[2]; h++)
                    for (int64_t s = 0; s < x->n[1]; s++) {
                        float f;
                        memcpy(&f, c->arena + l->off + 4 * (size_t)((b * x->n[2] + h) * x->n[1] + s), 4);
                        const size_t off = elem_off(x, st, b, s, h, 0);
                        if (!pass && f != -INFINITY) memset(keep + off, 1, nb);
                        if (pass && f == -INFINITY)
                            for (size_t k = 0; k < nb; k++)
                                if (!keep[off + k]) c->arena[off + k] = 0xFF;
                    }
        }
    free(keep);
}

/* The drawn int32 array behind buffer id (seqused_k, block_table,
 * cache_seqlens, cache_leftpad, seqused_q, cache_batch_idx), or NULL */
static const int32_t *host_array(const fcase *c, int id) {
    switch (id) {
    case BSEQU: return c->sequ;
    case BTABLE: return c->table;
    case BCSL: return c->cs;
    case BPAD: return c->pad;
    case BSQU: return c->squ;
    case BCBI: return c->cbi;
    default: return NULL;
    }
}

static void fill(fcase *c) {
    memset(c->arena, 0xFF, c->arena_bytes);
    for (int i = 0; i < NBUF; i++) {
        const buf *x = &c->b[i];
        if (!x->name || x->output || x->bad_stride) continue;
        if (x->tensor) {
            fill_tensor(c, i);
        } else if (i == BCUQ || i == BCUK) {
            const int32_t *cu = i == BCUQ ? c->cuq : c->cuk;
            for (int b = 0; b <= c->batch; b++) {
                /* a fixed-length call: prefix sums of its lengths */
                const int32_t v = c->varlen ? cu[b] : b * (i == BCUQ ? c->sq : c->sk);
                memcpy(c->arena + x->off + 4 * (size_t)b, &v, 4);
            }
        } else if (i >= BPL0 && i < BPL0 + MERGE_DISTINCT) {
            for (int64_t k = 0; k < x->count; k++)
                put_f32(c, x, k, c->lse_inf && chance(c, 0.3) ? -INFINITY : (float)(3.0 * tu_rng_normal(&c->rng)));
        } else if (host_array(c, i)) {
            memcpy(c->arena + x->off, host_array(c, i), (size_t)x->count * 4);
        } else if (i == BLSE) {
            for (int64_t k = 0; k < x->count; k++) put_f32(c, x, k, (float)(2.0 + tu_rng_normal(&c->rng)));
        } else { /* e4m3 scales */
            for (int64_t k = 0; k < x->count; k++)
                put_f32(c, x, k, (float)(ldexp(1.0 + tu_rng_uniform(&c->rng), -2 - (int)rnd(c, 5))));
        }
    }
    if (c->api == API_FWD && (c->has_sequ || c->paged || c->has_cbi) && chance(c, 0.3)) poison_unused_keys(c);
    if (c->api == API_MERGE && c->lse_inf) poison_unread_parts(c);
    if (c->api == API_MERGE && chance(c, 0.08) && c->nd <= MERGE_DISTINCT) {
        /* NaN propagates as torch's would (fattn_merge): a NaN or +inf
         * lse_i makes the row NaN, a NaN in a participating O_i its element;
         * checked by check_merge_reference */
        const int i = (int)rnd(c, (uint32_t)c->nd);
        const buf *x = &c->b[BP0 + i], *l = &c->b[BPL0 + i];
        const int64_t r = rnd(c, (uint32_t)l->count);
        if (chance(c, 0.5)) {
            put_f32(c, l, r, chance(c, 0.5) ? NAN : INFINITY);
            say(c, " | %s[%lld] non-finite", l->name, (long long)r);
        } else if (!x->bad_stride) {
            int64_t st[3];
            strides_of(x, st);
            const int64_t h = r / x->n[1] % x->n[2], b = r / (x->n[1] * x->n[2]), sq = r % x->n[1];
            put(c->arena + elem_off(x, st, b, sq, h, rnd(c, (uint32_t)x->n[3])), c->pdt[i], NAN);
            say(c, " | %s row %lld holds NaN", x->name, (long long)r);
        }
    }
    if (c->api == API_KVA) {
        /* the caches' old rows: any finite values (the padding stays 0xFF) */
        for (int i = BDK; i <= BDV; i++)
            if (!c->b[i].bad_stride && c->b[i].off == c->b[i].region) fill_tensor(c, i);
        if (chance(c, 0.15) && !c->b[BK].bad_stride) { /* any bits, NaN payloads included: copied as they are */
            const buf *x = &c->b[BK];
            int64_t st[3];
            strides_of(x, st);
            for (int64_t b = 0; b < x->n[0]; b++)
                for (int64_t s = 0; s < x->n[1]; s++)
                    for (int64_t h = 0; h < x->n[2]; h++)
                        for (int64_t e = 0; e < x->n[3] * (int64_t)x->es; e++)
                            c->arena[elem_off(x, st, b, s, h, 0) + (size_t)e] = (uint8_t)rnd(c, 256);
            say(c, " | k_new random bits");
        }
    }
    if ((c->api == API_QUANT || c->api == API_FP8) && c->dt != FATTN_DTYPE_F16 && chance(c, 0.2)) {
        /* rows of f32 / bf16 subnormals (issue 43 item 1): a block's amax
         * / 448 under FLT_MIN, down to amax / 448 rounding to 0 in f32 */
        const int id = c->api == API_QUANT ? BQ : (int)(BQ + rnd(c, 3));
        const buf *x = &c->b[id];
        if (!x->bad_stride && x->n[1] > 0) {
            int64_t st[3];
            strides_of(x, st);
            const int64_t s0 = rnd(c, (uint32_t)x->n[1]), s1 = s0 + 1 + rnd(c, (uint32_t)(x->n[1] - s0));
            const int f32 = c->dt == FATTN_DTYPE_F32, kind = (int)rnd(c, 3);
            for (int64_t b = 0; b < x->n[0]; b++)
                for (int64_t sr = s0; sr < s1; sr++)
                    for (int64_t h = 0; h < x->n[2]; h++)
                        for (int64_t e = 0; e < x->n[3]; e++) {
                            const double g = tu_rng_normal(&c->rng);
                            const double v = kind == 0 && f32 ? floor(g * 3.0) * 0x1p-149 /* amax / 448 -> 0 */
                                             : kind == 1     ? g * 1e-39
                                                             : g * 1e-36; /* amax / 448 a subnormal */
                            put(c->arena + elem_off(x, st, b, sr, h, e), c->dt, v);
                        }
            say(c, " | %s rows %lld..%lld tiny (%s)", x->name, (long long)s0, (long long)s1 - 1,
                kind == 0 && f32 ? "units of 2^-149" : kind == 1 ? "~1e-39" : "~1e-36");
        }
    }
    if (c->api == API_FWD && c->dt == FATTN_DTYPE_E4M3 && chance(c, 0.03)) {
        /* a zero or negative e4m3 scale: refused on a CPU context (issue 43 item 8) */
        const int id = BQS + (int)rnd(c, 3);
        const buf *x = &c->b[id];
        if (x->name && x->count > 0) {
            const int64_t i = rnd(c, (uint32_t)x->count);
            const float bad = chance(c, 0.5) ? 0.0f : -(float)ldexp(1.0, -(int)rnd(c, 8));
            put_f32(c, x, i, bad);
            c->bad_scale = 1;
            say(c, " | %s[%lld] = %g", x->name, (long long)i, (double)bad);
        }
    }
    if (chance(c, 0.04)) {
        /* one non-finite input element: only the write checks apply */
        static const int in_ids[] = {BQ, BK, BV, BDOUT, BQS, BKS, BVS};
        for (int tries = 0; tries < 8; tries++) {
            const int id = in_ids[rnd(c, 7)];
            const buf *x = &c->b[id];
            if (!x->name || x->bad_stride || !x->bytes) continue;
            const double bad = chance(c, 0.5) ? NAN : chance(c, 0.5) ? INFINITY : -INFINITY;
            if (x->tensor) {
                int64_t st[3];
                strides_of(x, st);
                const int64_t b = rnd(c, (uint32_t)x->n[0]), s = rnd(c, (uint32_t)x->n[1]);
                const int64_t h = rnd(c, (uint32_t)x->n[2]), e = rnd(c, (uint32_t)x->n[3]);
                put(c->arena + elem_off(x, st, b, s, h, e), dtype_of(c, id), bad);
            } else {
                put_f32(c, x, rnd(c, (uint32_t)x->count), (float)bad);
                /* an e4m3 scale NaN or -inf: a CPU context refuses it (fattn.h) */
                if (c->api == API_FWD && !(bad > 0)) c->bad_scale = 1;
            }
            c->nonfinite = 1;
            say(c, " | %s holds %g", x->name, bad);
            break;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Arguments                                                                */
/* ------------------------------------------------------------------------ */

static void *ptr(fcase *c, int id) { return c->arena + c->b[id].off; }

/* Pointers that fields ignored for a dtype may hold: an address that would
 * fault, or an output (which would count as an overlapping input if read). */
static float *garbage_ptr(fcase *c) {
    if (chance(c, 0.5)) return (float *)(uintptr_t)(16 + 4 * rnd(c, 64));
    return (float *)ptr(c, BO);
}

static fattn_tensor tensor_arg(fcase *c, int id, int scale_id, int32_t block) {
    const buf *x = &c->b[id];
    fattn_tensor t;
    memset(&t, 0, sizeof t);
    t.data = ptr(c, id);
    t.dtype = dtype_of(c, id);
    t.stride_batch = x->st[0];
    t.stride_seq = x->st[1];
    t.stride_head = x->st[2];
    if (scale_id >= 0) {
        t.scale = (float *)ptr(c, scale_id);
        t.scale_block = block;
    } else if (chance(c, 0.2)) {
        t.scale = garbage_ptr(c);
        t.scale_block = (int32_t)(tu_rng_u64(&c->rng) % 7) - 3;
    }
    return t;
}

/* The page table fields of fattn_fwd_args and fattn_kv_append_args (the same
 * names in both), the table passed. */
static void pass_pages(fcase *c, const int32_t **table, int32_t *page_size, int32_t *num_pages,
                       int32_t *max_pages_per_seq) {
    *table = (const int32_t *)ptr(c, BTABLE);
    *page_size = c->ps;
    *num_pages = c->npages;
    *max_pages_per_seq = c->mpps;
    c->b[BTABLE].passed = 1;
}

static void build_args(fcase *c) {
    for (int i = 0; i < NBUF; i++) c->b[i].passed = 0;
#define PASS(id) (c->b[id].passed = 1)
    if (c->api == API_KVA) {
        fattn_kv_append_args *a = &c->ka;
        memset(a, 0, sizeof *a);
        a->batch = c->batch;
        a->seqlen_new = c->sq;
        a->heads_kv = c->hkv;
        a->head_dim = c->d;
        a->k_new = tensor_arg(c, BK, -1, 0);
        a->v_new = tensor_arg(c, BV, -1, 0);
        a->k_cache = tensor_arg(c, BDK, -1, 0);
        a->v_cache = tensor_arg(c, BDV, -1, 0);
        a->capacity = c->cap;
        a->cache_seqlens = (const int32_t *)ptr(c, BCSL);
        PASS(BK), PASS(BV), PASS(BDK), PASS(BDV), PASS(BCSL);
        if (c->paged) pass_pages(c, &a->block_table, &a->page_size, &a->num_pages, &a->max_pages_per_seq);
        return;
    }
    if (c->api == API_MERGE) {
        fattn_merge_args *a = &c->ma;
        memset(a, 0, sizeof *a);
        memset(c->parts, 0, sizeof c->parts);
        for (int i = 0; i < c->nd; i++) {
            c->parts[i].o = tensor_arg(c, BP0 + i, -1, 0);
            c->parts[i].lse = (const float *)ptr(c, BPL0 + i);
            PASS(BP0 + i), PASS(BPL0 + i);
        }
        for (int i = c->nd; i <= FATTN_MERGE_MAX_PARTS; i++) c->parts[i] = c->parts[i % c->nd]; /* [max]: for M_MERGE_NPARTS */
        a->batch = c->batch;
        a->seqlen = c->sq;
        a->heads = c->hq;
        a->head_dim = c->d;
        a->num_parts = c->nparts;
        a->parts = c->parts;
        a->o = tensor_arg(c, BO, -1, 0);
        a->lse = c->want_lse ? (float *)ptr(c, BLSE) : NULL;
        PASS(BO);
        if (c->want_lse) PASS(BLSE);
        return;
    }
    if (c->api == API_QUANT) {
        fattn_quantize_args *a = &c->qa;
        memset(a, 0, sizeof *a);
        a->in = tensor_arg(c, BQ, -1, 0);
        a->out = tensor_arg(c, BO, -1, 0);
        a->out.scale = (float *)ptr(c, BQS);
        a->out.scale_block = chance(c, 0.5) ? 0 : (int32_t)rnd(c, 1000) - 500; /* ignored */
        a->batch = c->batch;
        a->seqlen = c->sq;
        a->heads = c->hq;
        a->head_dim = c->d;
        a->granularity = chance(c, 0.3) ? FATTN_QUANT_TENSOR : FATTN_QUANT_BLOCK;
        a->block_rows = c->blk[0];
        a->rotate = c->rotate ? (chance(c, 0.5) ? 1 : 9) : 0;
        a->seed = tu_rng_u64(&c->rng);
        PASS(BQ), PASS(BO), PASS(BQS);
        say(c, " %s", a->granularity == FATTN_QUANT_TENSOR ? "tensor" : "block");
        return;
    }
    fattn_problem p;
    memset(&p, 0, sizeof p);
    p.batch = c->batch;
    p.seqlen_q = c->sq_arg;
    p.seqlen_k = c->sk_arg;
    p.heads_q = c->hq;
    p.heads_kv = c->hkv;
    p.head_dim = c->d;
    p.head_dim_v = c->dv_arg;
    p.softmax_scale = c->softmax_scale;
    p.causal = c->causal;
    p.window = c->win;
    if (c->win) p.window_left = c->wl, p.window_right = c->wr;
    p.softcap = c->softcap;
    if (c->varlen) {
        p.cu_seqlens_q = (const int32_t *)ptr(c, BCUQ);
        p.cu_seqlens_k = (const int32_t *)ptr(c, BCUK);
        PASS(BCUQ), PASS(BCUK);
    }
    const int e4m3 = c->api == API_FWD && c->dt == FATTN_DTYPE_E4M3;
    if (c->api == API_BWD) {
        fattn_bwd_args *a = &c->ba;
        memset(a, 0, sizeof *a);
        a->p = p;
        a->q = tensor_arg(c, BQ, -1, 0);
        a->k = tensor_arg(c, BK, -1, 0);
        a->v = tensor_arg(c, BV, -1, 0);
        a->o = tensor_arg(c, BO, -1, 0);
        a->dout = tensor_arg(c, BDOUT, -1, 0);
        a->dq = tensor_arg(c, BDQ, -1, 0);
        a->dk = tensor_arg(c, BDK, -1, 0);
        a->dv = tensor_arg(c, BDV, -1, 0);
        a->lse = (const float *)ptr(c, BLSE);
        a->deterministic = (int32_t)rnd(c, 3) - 1;
        if (c->has_sink) a->learnable_sink = c->sink;
        if (c->want_dsink) a->dsink = c->dsink;
        for (int h = 0; h < 16; h++) c->dsink[h] = NAN;
        PASS(BQ), PASS(BK), PASS(BV), PASS(BO), PASS(BDOUT), PASS(BDQ), PASS(BDK), PASS(BDV), PASS(BLSE);
        return;
    }
    fattn_fwd_args *a = &c->fa;
    memset(a, 0, sizeof *a);
    a->p = p;
    a->q = tensor_arg(c, BQ, e4m3 ? BQS : -1, c->blk[0]);
    a->k = tensor_arg(c, BK, e4m3 ? BKS : -1, c->blk[1]);
    a->v = tensor_arg(c, BV, e4m3 ? BVS : -1, c->blk[2]);
    a->o = tensor_arg(c, BO, -1, 0);
    a->lse = c->want_lse ? (float *)ptr(c, BLSE) : NULL;
    if (c->has_sink) a->learnable_sink = c->sink;
    PASS(BQ), PASS(BK), PASS(BV), PASS(BO);
    if (c->want_lse) PASS(BLSE);
    if (e4m3) PASS(BQS), PASS(BKS), PASS(BVS);
    if (c->api == API_FWD && c->has_sequ) a->seqused_k = (const int32_t *)ptr(c, BSEQU), PASS(BSEQU);
    if (c->api == API_FWD && c->has_pad) a->cache_leftpad = (const int32_t *)ptr(c, BPAD), PASS(BPAD);
    if (c->api == API_FWD && c->has_squ) a->seqused_q = (const int32_t *)ptr(c, BSQU), PASS(BSQU);
    if (c->api == API_FWD && c->has_cbi)
        a->cache_batch_idx = (const int32_t *)ptr(c, BCBI), a->cache_batch = c->cbatch, PASS(BCBI);
    if (c->paged) pass_pages(c, &a->block_table, &a->page_size, &a->num_pages, &a->max_pages_per_seq);
#undef PASS
}

/* bwd: o and lse from the forward on the same tensors (its inputs as the
 * backward expects them).  A layout the forward refuses (o interleaved, say)
 * keeps the random o and lse: then only the write checks apply. */
static void bwd_setup(fcase *c, fattn_ctx *ctx) {
    fattn_fwd_args f;
    memset(&f, 0, sizeof f);
    f.p = c->ba.p;
    f.q = c->ba.q;
    f.k = c->ba.k;
    f.v = c->ba.v;
    f.o = c->ba.o;
    f.lse = (float *)ptr(c, BLSE);
    f.learnable_sink = c->has_sink ? c->sink : NULL;
    if (fattn_fwd(ctx, &f) != FATTN_OK) c->setup_failed = 1;
}

/* ------------------------------------------------------------------------ */
/* Faults in the arguments                                                  */
/* ------------------------------------------------------------------------ */

static fattn_problem *problem(fcase *c) { return c->api == API_BWD ? &c->ba.p : &c->fa.p; }

/* The tensor arguments of the call and their names. */
static int tensor_args(fcase *c, fattn_tensor **t, const char **names) {
    int n = 0;
#define ADD(x, nm) (t[n] = &(x), names[n++] = (nm))
    switch (c->api) {
    case API_QUANT: ADD(c->qa.in, "in"), ADD(c->qa.out, "out"); break;
    case API_BWD:
        ADD(c->ba.q, "q"), ADD(c->ba.k, "k"), ADD(c->ba.v, "v"), ADD(c->ba.o, "o");
        ADD(c->ba.dout, "dout"), ADD(c->ba.dq, "dq"), ADD(c->ba.dk, "dk"), ADD(c->ba.dv, "dv");
        break;
    case API_KVA:
        ADD(c->ka.k_new, "k_new"), ADD(c->ka.v_new, "v_new"), ADD(c->ka.k_cache, "k_cache"), ADD(c->ka.v_cache, "v_cache");
        break;
    case API_MERGE:
        for (int i = 0; i < c->nd; i++) ADD(c->parts[i].o, part_names[0][i]);
        ADD(c->ma.o, "o");
        break;
    default: ADD(c->fa.q, "q"), ADD(c->fa.k, "k"), ADD(c->fa.v, "v"), ADD(c->fa.o, "o"); break;
    }
#undef ADD
    return n;
}

static fattn_dtype other_float(fcase *c, fattn_dtype not_this) {
    fattn_dtype d;
    do d = (fattn_dtype)rnd(c, 3);
    while (d == not_this);
    return d;
}

static int32_t bad_size(fcase *c, int allow_zero) {
    static const int32_t v[] = {0, -1, -2, -40, INT32_MIN};
    return v[allow_zero ? rnd(c, 5) : 1 + rnd(c, 4)];
}

/* Rows (batch * seqlen * heads) of q and k for the problem as it now is. */
static int rows_over_limit(const fcase *c, const fattn_problem *p) {
    const double nb = c->varlen ? 1 : p->batch;
    const double tq = c->varlen ? c->tq : p->seqlen_q, tk = c->varlen ? c->tk : p->seqlen_k;
    return nb * tq * p->heads_q >= 0x1p31 || nb * tk * p->heads_kv >= 0x1p31;
}

static int32_t *cu_in_arena(fcase *c, int id) { return (int32_t *)ptr(c, id); }

/* Applies argument fault k; returns the statuses a refusal may then have
 * (0: not applied). */
/* One of a call's four sizes (batch, a length, heads, head_dim) made zero,
 * negative or too large for int32 products. */
static unsigned break_a_size(fcase *c, int32_t *const f[4], const char *const fn[4]) {
    const int i = (int)rnd(c, 4);
    *f[i] = bad_size(c, 1);
    say(c, " %s %d", fn[i], (int)*f[i]);
    return ALLOW_INV;
}

static unsigned mutate(fcase *c, mkind k) {
    fattn_tensor *t[MERGE_DISTINCT + 8];
    const char *tn[MERGE_DISTINCT + 8];
    const int nt = tensor_args(c, t, tn);
    say(c, " |");
    switch (k) {
    case M_CTX_NULL: c->ctx_null = 1; say(c, " ctx NULL"); return ALLOW_INV;
    case M_ARGS_NULL: c->args_null = 1; say(c, " args NULL"); return ALLOW_INV;
    case M_SIZE_BAD: {
        if (c->api == API_KVA) {
            int32_t *f[4] = {&c->ka.batch, &c->ka.seqlen_new, &c->ka.heads_kv, &c->ka.head_dim};
            static const char *const fn[4] = {"batch", "seqlen_new", "heads_kv", "head_dim"};
            return break_a_size(c, f, fn);
        }
        if (c->api == API_MERGE) {
            int32_t *f[4] = {&c->ma.batch, &c->ma.seqlen, &c->ma.heads, &c->ma.head_dim};
            static const char *const fn[4] = {"batch", "seqlen", "heads", "head_dim"};
            return break_a_size(c, f, fn);
        }
        if (c->api == API_QUANT) {
            int32_t *f[4] = {&c->qa.batch, &c->qa.seqlen, &c->qa.heads, &c->qa.head_dim};
            static const char *const fn[4] = {"batch", "seqlen", "heads", "head_dim"};
            return break_a_size(c, f, fn);
        }
        fattn_problem *p = problem(c);
        int32_t *f[7] = {&p->batch, &p->seqlen_q, &p->seqlen_k, &p->heads_q, &p->heads_kv, &p->head_dim, &p->head_dim_v};
        static const char *fn[7] = {"batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim", "head_dim_v"};
        const int i = (int)rnd(c, 7);
        /* varlen seqlens are maxima (0 allowed); head_dim_v 0 is the default */
        *f[i] = bad_size(c, !(i == 6 || (c->varlen && (i == 1 || i == 2))));
        say(c, " %s %d", fn[i], (int)*f[i]);
        return ALLOW_INV;
    }
    case M_SIZE_HUGE: {
        const int32_t big = (1 << 16) + (int32_t)rnd(c, 1 << 14);
        if (c->api == API_KVA) { /* rows of k_new >= 2^31 (the batch stays: int32[batch] arrays) */
            c->ka.seqlen_new = big, c->ka.heads_kv = chance(c, 0.5) ? INT32_MAX : big;
            say(c, " seqlen_new %d heads_kv %d", (int)c->ka.seqlen_new, (int)c->ka.heads_kv);
            return ALLOW_INV;
        }
        if (c->api == API_MERGE) { /* batch * seqlen * heads >= 2^31 */
            fattn_merge_args *a = &c->ma;
            switch (rnd(c, 4)) {
            case 0: a->batch = big, a->seqlen = big; break;
            case 1: a->seqlen = big, a->heads = big; break;
            case 2: a->batch = big, a->heads = big; break;
            default: a->batch = INT32_MAX, a->seqlen = a->seqlen < 2 ? 2 : a->seqlen; break;
            }
            say(c, " batch %d seqlen %d heads %d", (int)a->batch, (int)a->seqlen, (int)a->heads);
            return ALLOW_INV;
        }
        if (c->api == API_QUANT) {
            fattn_quantize_args *a = &c->qa;
            switch (rnd(c, 5)) {
            case 0: a->batch = big, a->seqlen = big; break;
            case 1: a->seqlen = big, a->heads = big; break;
            case 2: a->batch = big, a->heads = big; break;
            case 3: a->batch = INT32_MAX, a->seqlen = a->seqlen < 2 ? 2 : a->seqlen; break;
            default: a->seqlen = 1 << 30, a->head_dim = 1 << 30; break; /* offsets >= 2^60 */
            }
            say(c, " batch %d seqlen %d heads %d head_dim %d", (int)a->batch, (int)a->seqlen, (int)a->heads,
                (int)a->head_dim);
            return ALLOW_INV;
        }
        fattn_problem *p = problem(c);
        if (c->has_sequ || c->paged) {
            /* int32[batch] arrays: the batch stays (a larger one would make
             * the call read past them, the caller's fault) */
            p->seqlen_q = big, p->heads_q = p->heads_kv = big;
        } else if (c->varlen) { /* rows = total * heads */
            p->heads_q = p->heads_kv = chance(c, 0.5) ? INT32_MAX : big;
        } else {
            switch (rnd(c, 4)) {
            case 0: p->batch = big, p->seqlen_q = big; break;
            case 1: p->batch = big, p->seqlen_k = big; break;
            case 2: p->seqlen_q = big, p->heads_q = p->heads_kv = big; break;
            default: p->batch = INT32_MAX; break;
            }
        }
        if (!rows_over_limit(c, p)) p->heads_q = p->heads_kv = INT32_MAX; /* applicable(): enough rows */
        say(c, " batch %d seqlen_q %d seqlen_k %d heads %d/%d", (int)p->batch, (int)p->seqlen_q,
            (int)p->seqlen_k, (int)p->heads_q, (int)p->heads_kv);
        return ALLOW_INV;
    }
    case M_DIM_BIG: {
        static const int32_t v[] = {513, 1000, 4096, 1 << 20, INT32_MAX};
        if (c->api == API_KVA) {
            c->ka.head_dim = v[rnd(c, 5)];
            say(c, " head_dim %d", (int)c->ka.head_dim);
            return ALLOW_UNSUP | ALLOW_INV;
        }
        fattn_problem *p = problem(c);
        if (chance(c, 0.5)) {
            p->head_dim = v[rnd(c, 5)];
            say(c, " head_dim %d", (int)p->head_dim);
        } else {
            p->head_dim_v = v[rnd(c, 5)];
            say(c, " head_dim_v %d", (int)p->head_dim_v);
        }
        /* the new dims also break the explicit strides */
        return ALLOW_UNSUP | ALLOW_INV;
    }
    case M_GQA: {
        /* (another fault may have made the heads huge or negative) */
        fattn_problem *p = problem(c);
        if (p->heads_kv >= 2 && p->heads_kv <= 1000 && chance(c, 0.5))
            p->heads_q = p->heads_kv * (1 + (int32_t)rnd(c, 3)) + 1 + (int32_t)rnd(c, (uint32_t)p->heads_kv - 1);
        else if (p->heads_q >= 1 && p->heads_q <= 1000)
            p->heads_kv = p->heads_q + 1 + (int32_t)rnd(c, 3);
        else
            p->heads_q = INT32_MAX, p->heads_kv = 2;
        say(c, " heads_q %d heads_kv %d", (int)p->heads_q, (int)p->heads_kv);
        return ALLOW_INV;
    }
    case M_VARIANT: {
        fattn_problem *p = problem(c);
        static const int32_t bad_side[] = {-2, -3, -1000, INT32_MIN};
        const float bad_cap[] = {NAN, INFINITY, -INFINITY, -1.0f, -FLT_MIN / 4};
        switch (rnd(c, 5)) {
        case 0: /* a side without the flag */
            p->window = 0;
            if (chance(c, 0.5)) p->window_left = chance(c, 0.5) ? -1 : 1 + (int32_t)rnd(c, 50);
            else p->window_right = chance(c, 0.5) ? -1 : 1 + (int32_t)rnd(c, 50);
            say(c, " window 0 with (%d,%d)", (int)p->window_left, (int)p->window_right);
            break;
        case 1:
            p->window = 1;
            if (chance(c, 0.5)) p->window_left = bad_side[rnd(c, 4)];
            else p->window_right = bad_side[rnd(c, 4)];
            say(c, " window (%d,%d)", (int)p->window_left, (int)p->window_right);
            break;
        case 2:
            p->softcap = bad_cap[rnd(c, 5)];
            say(c, " softcap %g", (double)p->softcap);
            break;
        default: /* a misaligned sink, dsink without a sink or misaligned */
            if (c->api == API_BWD && chance(c, 0.5)) {
                c->ba.dsink = (float *)((char *)c->dsink + 1 + rnd(c, 3));
                c->ba.learnable_sink = chance(c, 0.5) ? NULL : c->sink;
                say(c, " dsink %s", c->ba.learnable_sink ? "misaligned" : "without learnable_sink");
            } else {
                const float *bad = (const float *)((const char *)c->sink + 1 + rnd(c, 3));
                if (c->api == API_BWD) c->ba.learnable_sink = bad, c->ba.dsink = c->dsink;
                else c->fa.learnable_sink = bad;
                say(c, " learnable_sink misaligned");
            }
            break;
        }
        return ALLOW_INV;
    }
    case M_SCALE_BAD: {
        const float v[] = {NAN, INFINITY, -INFINITY, -1.0f, -1e-30f, -FLT_MIN / 4};
        problem(c)->softmax_scale = v[rnd(c, 6)];
        say(c, " softmax_scale %g", (double)problem(c)->softmax_scale);
        return ALLOW_INV;
    }
    case M_DTYPE_ENUM: {
        static const int v[] = {4, 5, 77, -1, 0x7fffffff};
        const int i = (int)rnd(c, (uint32_t)nt), val = v[rnd(c, 5)];
        t[i]->dtype = (fattn_dtype)val;
        say(c, " %s.dtype %d", tn[i], val);
        return ALLOW_INV;
    }
    case M_DTYPE_MIX: {
        if (c->api == API_KVA) {
            if (chance(c, 0.3)) { /* e4m3 caches: not yet */
                for (int i = 0; i < nt; i++) t[i]->dtype = FATTN_DTYPE_E4M3;
                say(c, " every dtype e4m3");
            } else {
                const int i = (int)rnd(c, (uint32_t)nt);
                t[i]->dtype = chance(c, 0.3) ? FATTN_DTYPE_E4M3 : other_float(c, c->dt);
                say(c, " %s.dtype %s", tn[i], fattn_dtype_name(t[i]->dtype));
            }
            return ALLOW_INV;
        }
        if (c->api == API_MERGE) { /* float dtypes mix freely: e4m3 is the fault */
            const int i = (int)rnd(c, (uint32_t)nt);
            t[i]->dtype = FATTN_DTYPE_E4M3;
            say(c, " %s.dtype e4m3", tn[i]);
            return ALLOW_INV;
        }
        if (c->api == API_QUANT) {
            if (chance(c, 0.5)) t[0]->dtype = FATTN_DTYPE_E4M3, say(c, " in.dtype e4m3");
            else t[1]->dtype = draw_float_dtype(c), say(c, " out.dtype %s", fattn_dtype_name(t[1]->dtype));
            return ALLOW_INV;
        }
        if (c->api == API_BWD) {
            if (chance(c, 0.25)) {
                for (int i = 0; i < nt; i++) t[i]->dtype = FATTN_DTYPE_E4M3;
                say(c, " every dtype e4m3");
            } else {
                const int i = 1 + (int)rnd(c, (uint32_t)nt - 1);
                t[i]->dtype = chance(c, 0.3) ? FATTN_DTYPE_E4M3 : other_float(c, c->dt);
                say(c, " %s.dtype %s", tn[i], fattn_dtype_name(t[i]->dtype));
            }
            return ALLOW_INV;
        }
        /* fwd, fwd_fp8: q k v o */
        const int fp8 = c->api == API_FP8;
        switch (rnd(c, 4)) {
        case 0: /* o */
            if (fp8 || c->dt == FATTN_DTYPE_E4M3 || chance(c, 0.3)) t[3]->dtype = FATTN_DTYPE_E4M3;
            else t[3]->dtype = other_float(c, c->dt);
            say(c, " o.dtype %s", fattn_dtype_name(t[3]->dtype));
            break;
        case 1:
            if (fp8) {
                for (int i = 0; i < 3; i++) t[i]->dtype = FATTN_DTYPE_E4M3;
                say(c, " q,k,v e4m3");
                break;
            }
            /* fallthrough */
        default: {
            const int i = (int)rnd(c, 3);
            if (c->dt == FATTN_DTYPE_E4M3) t[i]->dtype = draw_float_dtype(c);
            else t[i]->dtype = chance(c, 0.3) ? FATTN_DTYPE_E4M3 : other_float(c, c->dt);
            say(c, " %s.dtype %s", tn[i], fattn_dtype_name(t[i]->dtype));
            break;
        }
        }
        return ALLOW_INV;
    }
    case M_NULL_PTR: {
        if (c->api == API_KVA) {
            const int i = (int)rnd(c, (uint32_t)nt + 1);
            if (i < nt) t[i]->data = NULL, say(c, " %s.data NULL", tn[i]);
            else c->ka.cache_seqlens = NULL, say(c, " cache_seqlens NULL");
            return ALLOW_INV;
        }
        if (c->api == API_MERGE) { /* the output lse is optional, a part's is required */
            const uint32_t r = rnd(c, 4);
            const int i = (int)rnd(c, (uint32_t)c->nd);
            if (r == 0) c->ma.parts = NULL, say(c, " parts NULL");
            else if (r == 1) c->parts[i].lse = NULL, say(c, " parts[%d].lse NULL", i);
            else if (r == 2) c->parts[i].o.data = NULL, say(c, " parts[%d].o.data NULL", i);
            else c->ma.o.data = NULL, say(c, " o.data NULL");
            return ALLOW_INV;
        }
        /* fattn_fwd's lse is optional: NULL there is valid */
        const int i = (int)rnd(c, (uint32_t)nt + (c->api == API_QUANT || c->api == API_BWD));
        if (i < nt) {
            t[i]->data = NULL;
            say(c, " %s.data NULL", tn[i]);
        } else if (c->api == API_QUANT) {
            c->qa.out.scale = NULL;
            say(c, " out.scale NULL");
        } else if (c->api == API_BWD) {
            c->ba.lse = NULL;
            say(c, " lse NULL");
        }
        return ALLOW_INV;
    }
    case M_MISALIGN: {
        for (int tries = 0; tries < 16; tries++) {
            const int i = (int)rnd(c, (uint32_t)nt + 3);
            if (i < nt) {
                const size_t es = fattn_dtype_size(t[i]->dtype);
                if (es < 2 || !t[i]->data) continue;
                const size_t by = 1 + rnd(c, (uint32_t)es - 1);
                if (((uintptr_t)t[i]->data + by) % es == 0) continue; /* misaligned twice */
                t[i]->data = (uint8_t *)t[i]->data + by;
                say(c, " %s.data +%zu B", tn[i], by);
                return ALLOW_INV;
            }
            const size_t by = 1 + rnd(c, 3);
            if (i == nt && c->api == API_KVA) {
                const int32_t **l = c->paged && chance(c, 0.5) ? &c->ka.block_table : &c->ka.cache_seqlens;
                if (!*l || ((uintptr_t)*l + by) % 4 == 0) continue;
                *l = (const int32_t *)((const uint8_t *)*l + by);
                say(c, " %s +%zu B", l == &c->ka.block_table ? "block_table" : "cache_seqlens", by);
                return ALLOW_INV;
            }
            if (i == nt && c->api == API_MERGE) {
                const int j = (int)rnd(c, (uint32_t)c->nd + 1);
                const float **l = j < c->nd ? &c->parts[j].lse : (const float **)&c->ma.lse;
                if (!*l || ((uintptr_t)*l + by) % 4 == 0) continue;
                *l = (const float *)((const uint8_t *)*l + by);
                say(c, " %s +%zu B", j < c->nd ? part_names[1][j] : "lse", by);
                return ALLOW_INV;
            }
            const void *p4 = c->api == API_QUANT ? (const void *)c->qa.out.scale
                             : c->api == API_BWD ? (const void *)c->ba.lse : (const void *)c->fa.lse;
            if (i == nt) { /* lse / out.scale */
                if (((uintptr_t)p4 + by) % 4 == 0) continue;
                if (c->api == API_QUANT && c->qa.out.scale) c->qa.out.scale = (float *)((uint8_t *)c->qa.out.scale + by);
                else if (c->api == API_BWD && c->ba.lse) c->ba.lse = (const float *)((const uint8_t *)c->ba.lse + by);
                else if (attention(c) && c->api != API_BWD && c->fa.lse) c->fa.lse = (float *)((uint8_t *)c->fa.lse + by);
                else continue;
                say(c, " %s +%zu B", c->api == API_QUANT ? "out.scale" : "lse", by);
                return ALLOW_INV;
            }
            if (i == nt + 1) { /* e4m3 scales */
                if (!(c->api == API_FWD && c->dt == FATTN_DTYPE_E4M3)) continue;
                const int j = (int)rnd(c, 3);
                if (!t[j]->scale || ((uintptr_t)t[j]->scale + by) % 4 == 0) continue;
                t[j]->scale = (float *)((uint8_t *)t[j]->scale + by);
                say(c, " %s.scale +%zu B", tn[j], by);
                return ALLOW_INV;
            }
            if (!attention(c) || !c->varlen) continue;
            fattn_problem *p = problem(c);
            if (!p->cu_seqlens_q || !p->cu_seqlens_k) continue;
            if (((uintptr_t)p->cu_seqlens_q + by) % 4 == 0 || ((uintptr_t)p->cu_seqlens_k + by) % 4 == 0) continue;
            if (chance(c, 0.5)) p->cu_seqlens_q = (const int32_t *)((const uint8_t *)p->cu_seqlens_q + by);
            else p->cu_seqlens_k = (const int32_t *)((const uint8_t *)p->cu_seqlens_k + by);
            say(c, " cu_seqlens +%zu B", by);
            return ALLOW_INV;
        }
        say(c, " (nothing to misalign)");
        return 0;
    }
    case M_E4M3_NOSCALE: {
        const int j = (int)rnd(c, 3);
        t[j]->scale = NULL;
        say(c, " %s.scale NULL", tn[j]);
        return ALLOW_INV;
    }
    case M_E4M3_BLOCK: {
        static const int32_t v[] = {0, -1, -128, INT32_MIN};
        const int j = (int)rnd(c, 3);
        t[j]->scale_block = v[rnd(c, 4)];
        say(c, " %s.scale_block %d", tn[j], (int)t[j]->scale_block);
        return ALLOW_INV;
    }
    case M_CU_ONE_NULL: {
        /* cu_seqlens_k without cu_seqlens_q, however often this fault is
         * applied (cu_seqlens_q alone is valid since 0.4: varlen queries
         * against fixed-length keys) */
        fattn_problem *p = problem(c);
        p->cu_seqlens_q = NULL;
        if (!p->cu_seqlens_k) p->cu_seqlens_k = cu_in_arena(c, BCUK);
        say(c, c->varlen ? " cu_seqlens_q NULL" : " cu_seqlens_k given alone");
        return ALLOW_INV;
    }
    case M_CU_START: {
        static const int32_t v[] = {1, -1, 5, INT32_MIN, INT32_MAX};
        const int q = chance(c, 0.5);
        int32_t *cu = cu_in_arena(c, q ? BCUQ : BCUK), x = v[rnd(c, 5)];
        memcpy(cu, &x, 4);
        say(c, " cu_seqlens_%c[0] %d", q ? 'q' : 'k', (int)x);
        return ALLOW_INV;
    }
    case M_CU_DECREASE: {
        const int q = chance(c, 0.5);
        int32_t *cu = cu_in_arena(c, q ? BCUQ : BCUK), prev, x;
        const int b = 1 + (int)rnd(c, (uint32_t)c->batch);
        memcpy(&prev, cu + b - 1, 4);
        x = chance(c, 0.2) || prev < INT32_MIN + 4 ? INT32_MIN : prev - 1 - (int32_t)rnd(c, 3);
        memcpy(cu + b, &x, 4);
        say(c, " cu_seqlens_%c[%d] %d < %d", q ? 'q' : 'k', b, (int)x, (int)prev);
        return ALLOW_INV;
    }
    case M_CU_TOO_LONG: {
        fattn_problem *p = problem(c);
        int q = chance(c, 0.5);
        if ((q ? c->sq : c->sk) < 1) q = !q; /* applicable(): one side has a token */
        const int longest = q ? c->sq : c->sk;
        const int32_t v = (int32_t)rnd(c, (uint32_t)longest);
        if (q) p->seqlen_q = v;
        else p->seqlen_k = v;
        say(c, " seqlen_%c %d < longest %d", q ? 'q' : 'k', (int)v, longest);
        return ALLOW_INV;
    }
    case M_QUANT_GRAN: {
        static const int v[] = {2, 3, -1, 1000};
        const int g = v[rnd(c, 4)];
        if (c->api == API_QUANT) c->qa.granularity = (fattn_quant_granularity)g;
        else c->opt_null = 0, c->opt.granularity = (fattn_quant_granularity)g;
        say(c, " granularity %d", g);
        return ALLOW_INV;
    }
    case M_QUANT_BLOCK: {
        if (c->api == API_QUANT) {
            static const int32_t v[] = {0, -1, -128, INT32_MIN};
            c->qa.block_rows = v[rnd(c, 4)];
            say(c, " block_rows %d", (int)c->qa.block_rows);
        } else {
            static const int32_t v[] = {-1, -128, INT32_MIN};
            int32_t *f[3] = {&c->opt.block_rows_q, &c->opt.block_rows_k, &c->opt.block_rows_v};
            const int i = (int)rnd(c, 3);
            c->opt_null = 0;
            *f[i] = v[rnd(c, 3)];
            say(c, " opt.block_rows_%c %d", "qkv"[i], (int)*f[i]);
        }
        return ALLOW_INV;
    }
    case M_SEQU_NEG: {
        static const int32_t v[] = {-1, -2, -1000, INT32_MIN};
        const int b = (int)rnd(c, (uint32_t)c->batch);
        const int32_t x = v[rnd(c, 4)];
        memcpy((uint8_t *)ptr(c, BSEQU) + 4 * b, &x, 4);
        say(c, " seqused_k[%d] %d", b, (int)x);
        return ALLOW_INV;
    }
    case M_SERV_RANGE: {
        const int b = (int)rnd(c, (uint32_t)c->batch);
        if (c->has_squ && (!c->has_cbi || chance(c, 0.5))) {
            static const int32_t v[] = {-1, -7, INT32_MIN};
            const int32_t x = v[rnd(c, 3)];
            memcpy((uint8_t *)ptr(c, BSQU) + 4 * b, &x, 4);
            say(c, " seqused_q[%d] %d", b, (int)x);
        } else {
            const int32_t v[] = {-1, c->cbatch, c->cbatch + 5, INT32_MIN, INT32_MAX};
            const int32_t x = v[rnd(c, 5)];
            memcpy((uint8_t *)ptr(c, BCBI) + 4 * b, &x, 4);
            say(c, " cache_batch_idx[%d] %d (cache_batch %d)", b, (int)x, c->cbatch);
        }
        return ALLOW_INV;
    }
    case M_SERV_PTR: {
        fattn_fwd_args *a = &c->fa;
        size_t by = 1 + rnd(c, 3);
        const uint32_t r = rnd(c, 3);
        /* misaligned whatever another fault did to the pointer first */
        const uintptr_t cur = (uintptr_t)(r == 1 && a->block_table ? (const void *)a->block_table : (const void *)a->seqused_k);
        if ((cur + by) % 4 == 0) by = by % 3 + 1;
        if (r == 0 && a->seqused_k) {
            a->seqused_k = (const int32_t *)((const uint8_t *)a->seqused_k + by);
            say(c, " seqused_k +%zu B", by);
        } else if (r == 1 && a->block_table) {
            a->block_table = (const int32_t *)((const uint8_t *)a->block_table + by);
            say(c, " block_table +%zu B", by);
        } else if (a->block_table) {
            a->block_table = NULL; /* without a table the three sizes must be 0 */
            say(c, " block_table NULL (sizes kept)");
        } else {
            a->seqused_k = (const int32_t *)((const uint8_t *)a->seqused_k + by);
            say(c, " seqused_k +%zu B", by);
        }
        return ALLOW_INV;
    }
    case M_PAGE_FIELD: {
        fattn_fwd_args *a = &c->fa;
        int32_t *f[3] = {&a->page_size, &a->num_pages, &a->max_pages_per_seq};
        static const char *fn[3] = {"page_size", "num_pages", "max_pages_per_seq"};
        const int i = (int)rnd(c, 3);
        if (c->paged) {
            *f[i] = bad_size(c, 1);
        } else {
            static const int32_t v[] = {1, 16, -1, INT32_MAX};
            *f[i] = v[rnd(c, 4)]; /* no table: all three must be 0 */
        }
        say(c, " %s %d%s", fn[i], (int)*f[i], c->paged ? "" : " without a table");
        return ALLOW_INV;
    }
    case M_PAGE_HUGE: {
        fattn_fwd_args *a = &c->fa;
        /* (the valid batch-1 variant only on fields no other fault changed) */
        const int clean = a->max_pages_per_seq == c->mpps && a->page_size == c->ps && a->num_pages == c->npages &&
                          a->p.seqlen_k == c->sk_arg;
        const uint32_t r = rnd(c, c->batch == 1 && clean ? 3 : 2);
        if (r == 0) { /* pool rows num_pages * page_size * heads_kv >= 2^31 */
            a->page_size = chance(c, 0.5) ? INT32_MAX : (int32_t)(((int64_t)1 << 31) / c->hkv / c->npages + 1);
        } else if (r == 1) {
            a->num_pages = chance(c, 0.5) ? INT32_MAX : (int32_t)(((int64_t)1 << 31) / c->hkv / c->ps + 1);
        } else {
            /* batch 1: a table of up to INT32_MAX entries, only the first
             * read (row b starts at b * max_pages_per_seq, so a larger batch
             * would read past the arena: the caller's fault).  Valid where
             * the table's declared span meets no output (layout_ok). */
            a->max_pages_per_seq = chance(c, 0.5) ? INT32_MAX : (1 << 30) + (int32_t)rnd(c, 1000);
            c->b[BTABLE].count = a->max_pages_per_seq;
            say(c, " max_pages_per_seq %d (batch 1)", (int)a->max_pages_per_seq);
            return 0;
        }
        say(c, " page_size %d num_pages %d", (int)a->page_size, (int)a->num_pages);
        return ALLOW_INV;
    }
    case M_PAGE_SHORT: {
        fattn_fwd_args *a = &c->fa;
        const int need = (int)cdiv(c->sk, c->ps);
        if (need >= 2 && chance(c, 0.7)) {
            a->max_pages_per_seq = 1 + (int32_t)rnd(c, (uint32_t)need - 1);
        } else { /* more keys than the table maps (the drawn table: an earlier
                  * fault may have widened max_pages_per_seq or page_size) */
            a->max_pages_per_seq = c->mpps, a->page_size = c->ps;
            const int64_t lim = (int64_t)c->mpps * c->ps;
            a->p.seqlen_k = (int32_t)(lim + 1 + rnd(c, 3));
        }
        say(c, " seqlen_k %d > max_pages_per_seq %d * page_size %d", (int)a->p.seqlen_k, (int)a->max_pages_per_seq,
            c->ps);
        return ALLOW_INV;
    }
    case M_PAGE_ENTRY: {
        int cand[MAX_BATCH], nc = 0;
        for (int b = 0; b < c->batch; b++)
            if (c->used[b] > 0) cand[nc++] = b;
        if (!nc) {
            say(c, " (no sequence uses a key)");
            return 0;
        }
        const int b = cand[rnd(c, (uint32_t)nc)];
        const int first = c->pad[b] / c->ps; /* the pages holding its keys */
        const int i = first + (int)rnd(c, (uint32_t)(cdiv(c->pad[b] + c->used[b], c->ps) - first));
        static const int32_t v[] = {-1, INT32_MIN, INT32_MAX};
        const int32_t x = chance(c, 0.4) ? c->npages : v[rnd(c, 3)];
        memcpy((uint8_t *)ptr(c, BTABLE) + 4 * (size_t)(b * c->mpps + i), &x, 4);
        say(c, " block_table[%d][%d] %d (used, %d pages)", b, i, (int)x, c->npages);
        return ALLOW_INV;
    }
    case M_PAGE_VARLEN: {
        /* valid prefix sums for the fixed-length batch (the arena holds
         * them): the call may still be refused as INVALID_ARGUMENT, k and
         * v being pools, not packed [total_k, heads, dim] tensors */
        fattn_problem *p = &c->fa.p;
        p->cu_seqlens_q = cu_in_arena(c, BCUQ);
        p->cu_seqlens_k = cu_in_arena(c, BCUK);
        c->b[BCUQ].passed = c->b[BCUK].passed = 1;
        say(c, " cu_seqlens with a table");
        return ALLOW_UNSUP;
    }
    case M_KVA_SEQLENS: {
        const int b = (int)rnd(c, (uint32_t)c->batch);
        const int64_t rows = c->paged ? (int64_t)c->mpps * c->ps : c->cap;
        int32_t x;
        switch (rnd(c, 4)) {
        case 0: x = chance(c, 0.5) ? -1 : INT32_MIN; break;
        case 1: x = (int32_t)(rows - c->sq + 1 + (int64_t)rnd(c, 3)); break; /* one row past the cache */
        case 2: x = INT32_MAX - (int32_t)rnd(c, (uint32_t)c->sq); break;    /* cache_seqlens + seqlen_new overflows */
        default: x = INT32_MAX; break;
        }
        memcpy((uint8_t *)ptr(c, BCSL) + 4 * b, &x, 4);
        say(c, " cache_seqlens[%d] %d (%lld rows)", b, (int)x, (long long)rows);
        return ALLOW_INV;
    }
    case M_KVA_TWICE: {
        /* the rules decide (kv_append_rules_ok): a second table row, or a
         * second page index of one row, mapped onto written rows.  Not with
         * kva_page's bad entry: copying a good entry over it would make the
         * call valid again while kva_page expects a refusal (seed 4343003,
         * case 18696: block_table[0][1] INT32_MAX, then = [0][0]) */
        if (has_mut(c, M_KVA_PAGE)) {
            say(c, " (kva_twice left out: a table entry is broken)");
            return 0;
        }
        int32_t *cs = (int32_t *)ptr(c, BCSL), *tb = (int32_t *)ptr(c, BTABLE);
        const int b1 = (int)rnd(c, (uint32_t)c->batch);
        int32_t c1;
        memcpy(&c1, cs + b1, 4);
        if (c1 < 0 || (int64_t)c1 + c->sq > (int64_t)c->mpps * c->ps) return 0; /* another fault got here first */
        const int i1 = c1 / c->ps, i2 = (c1 + c->sq - 1) / c->ps;
        if (c->batch >= 2) {
            const int b2 = (b1 + 1 + (int)rnd(c, (uint32_t)c->batch - 1)) % c->batch;
            memcpy(cs + b2, &c1, 4);
            for (int i = i1; i <= i2; i++) memcpy(tb + b2 * c->mpps + i, tb + b1 * c->mpps + i, 4);
            say(c, " sequence %d appends into sequence %d's rows (cache_seqlens %d, pages %d..%d)", b2, b1, (int)c1, i1, i2);
        } else if (i2 > i1) {
            memcpy(tb + b1 * c->mpps + i2, tb + b1 * c->mpps + i1, 4);
            say(c, " block_table[%d][%d] = [%d][%d]", b1, i2, b1, i1);
        } else {
            say(c, " (one page written)");
        }
        return 0;
    }
    case M_KVA_PAGE: {
        fattn_kv_append_args *a = &c->ka;
        if (!c->paged) {
            if (chance(c, 0.5)) {
                a->capacity = bad_size(c, 1);
                say(c, " capacity %d", (int)a->capacity);
            } else {
                static const int32_t v[] = {1, 16, -1, INT32_MAX};
                int32_t *f[3] = {&a->page_size, &a->num_pages, &a->max_pages_per_seq};
                const int i = (int)rnd(c, 3);
                *f[i] = v[rnd(c, 4)];
                say(c, " %s %d without a table", i == 0 ? "page_size" : i == 1 ? "num_pages" : "max_pages_per_seq",
                    (int)*f[i]);
            }
            return ALLOW_INV;
        }
        switch (rnd(c, 3)) {
        case 0: {
            const int b = (int)rnd(c, (uint32_t)c->batch);
            const int i = (c->cs[b] + (int)rnd(c, (uint32_t)c->sq)) / c->ps; /* a page new rows land in */
            static const int32_t v[] = {-1, INT32_MIN, INT32_MAX};
            const int32_t x = chance(c, 0.4) ? c->npages : v[rnd(c, 3)];
            memcpy((uint8_t *)ptr(c, BTABLE) + 4 * (size_t)(b * c->mpps + i), &x, 4);
            say(c, " block_table[%d][%d] %d (written, %d pages)", b, i, (int)x, c->npages);
            break;
        }
        case 1: {
            int32_t *f[3] = {&a->page_size, &a->num_pages, &a->max_pages_per_seq};
            const int i = (int)rnd(c, 3);
            *f[i] = bad_size(c, 1);
            say(c, " %s %d", i == 0 ? "page_size" : i == 1 ? "num_pages" : "max_pages_per_seq", (int)*f[i]);
            break;
        }
        default:
            a->block_table = NULL;
            say(c, " block_table NULL (sizes kept)");
            break;
        }
        return ALLOW_INV;
    }
    case M_KVA_HUGE: {
        fattn_kv_append_args *a = &c->ka;
        if (c->paged) {
            if (chance(c, 0.5)) a->page_size = chance(c, 0.5) ? INT32_MAX : (int32_t)(((int64_t)1 << 31) / c->hkv / c->npages + 1);
            else a->num_pages = chance(c, 0.5) ? INT32_MAX : (int32_t)(((int64_t)1 << 31) / c->hkv / c->ps + 1);
            say(c, " page_size %d num_pages %d", (int)a->page_size, (int)a->num_pages);
        } else {
            a->capacity = chance(c, 0.5) ? INT32_MAX : (int32_t)(((int64_t)1 << 31) / (c->batch * c->hkv) + 1);
            say(c, " capacity %d (batch %d heads_kv %d)", (int)a->capacity, c->batch, c->hkv);
        }
        return ALLOW_INV;
    }
    case M_MERGE_NPARTS: {
        static const int32_t v[] = {0, -1, INT32_MIN, FATTN_MERGE_MAX_PARTS + 1, INT32_MAX};
        c->ma.num_parts = v[rnd(c, 5)];
        say(c, " num_parts %d", (int)c->ma.num_parts);
        return ALLOW_INV;
    }
    case M_FP8_SERVING: {
        c->fa.seqused_k = (const int32_t *)ptr(c, BSEQU);
        c->b[BSEQU].passed = 1;
        say(c, " fwd_fp8 with seqused_k");
        return ALLOW_UNSUP;
    }
    case M_ROTATE: {
        const int32_t r = chance(c, 0.5) ? 1 : -1;
        if (c->api == API_QUANT) c->qa.rotate = r;
        else c->opt_null = 0, c->opt.rotate = r;
        say(c, " rotate %d (head_dim %d)", (int)r, c->d);
        return ALLOW_UNSUP;
    }
    default: return 0;
    }
}

/* ------------------------------------------------------------------------ */
/* The rules                                                                */
/* ------------------------------------------------------------------------ */

/* 1 when the layout and placement of the call's buffers is one the header
 * allows (fattn.h Conventions; docs/design.md 3, item 6): strides below a
 * row only for dimensions of size 1, an output's dimensions nested (sorted
 * by stride, each stride at least the extent of those inside), an output's
 * byte span disjoint from every input's and every other output's. */
static int layout_ok(const fcase *c, char *why, size_t wn) {
    for (int i = 0; i < NBUF; i++) {
        const buf *x = &c->b[i];
        if (!x->passed || !x->tensor) continue;
        if (x->bad_stride) {
            snprintf(why, wn, "%s has a negative or overflowing stride", x->name);
            return 0;
        }
        const int packed = x->st[0] == 0 && x->st[1] == 0 && x->st[2] == 0;
        for (int dm = 0; dm < 3 && !packed; dm++)
            if (x->n[dm] > 1 && x->st[dm] < x->n[3]) {
                snprintf(why, wn, "%s.stride_%c %lld < row %lld", x->name, dim_letter[dm], (long long)x->st[dm],
                         (long long)x->n[3]);
                return 0;
            }
        if (!x->output || x->n[1] == 0) continue; /* no elements: nothing to overlap */
        int64_t st[3], n[3], extent = x->n[3];
        strides_of(x, st);
        memcpy(n, x->n, sizeof n);
        for (int a = 1; a < 3; a++) /* sort the dimensions by stride */
            for (int b = a; b > 0 && st[b] < st[b - 1]; b--) {
                int64_t t = st[b];
                st[b] = st[b - 1], st[b - 1] = t;
                t = n[b], n[b] = n[b - 1], n[b - 1] = t;
            }
        for (int a = 0; a < 3; a++) {
            if (n[a] <= 1) continue;
            if (st[a] < extent) {
                snprintf(why, wn, "%s overlaps itself (stride %lld < extent %lld)", x->name, (long long)st[a],
                         (long long)extent);
                return 0;
            }
            extent += (n[a] - 1) * st[a];
        }
    }
    for (int i = 0; i < NBUF; i++) {
        const buf *x = &c->b[i];
        if (!x->passed || !x->output) continue;
        const size_t xb = span_bytes(x);
        for (int j = 0; j < NBUF; j++) {
            const buf *y = &c->b[j];
            if (j == i || !y->passed) continue;
            const size_t yb = span_bytes(y);
            if (xb && yb && x->off < y->off + yb && y->off < x->off + xb) {
                snprintf(why, wn, "%s [%zu, %zu) overlaps %s [%zu, %zu)", x->name, x->off, x->off + xb, y->name,
                         y->off, y->off + yb);
                return 0;
            }
        }
    }
    return 1;
}

/* ------------------------------------------------------------------------ */
/* Checks of an accepted call                                               */
/* ------------------------------------------------------------------------ */

/* fattn_kv_append: cache row (batch entry or page, row) that new row t of
 * sequence b lands in, from cache_seqlens and the table as the arena holds
 * them (M_KVA_TWICE may have changed the drawn ones). */
static void kva_dest(const fcase *c, int b, int t, int64_t *cb, int64_t *cr) {
    int32_t cs, e;
    memcpy(&cs, c->arena + c->b[BCSL].region + 4 * (size_t)b, 4);
    const int64_t j = (int64_t)cs + t;
    if (c->paged) {
        memcpy(&e, c->arena + c->b[BTABLE].region + 4 * (size_t)(b * c->mpps + j / c->ps), 4);
        *cb = e, *cr = j % c->ps;
    } else {
        *cb = b, *cr = j;
    }
}

/* fattn_kv_append's rules on the entries of cache_seqlens and block_table
 * as they are in the arena (fattn.h, fattn_kv_append): cache_seqlens[b] >=
 * 0, cache_seqlens[b] + seqlen_new <= capacity (paged: max_pages_per_seq *
 * page_size), the entries of the pages new rows land in inside [0,
 * num_pages), no cache row written by two new rows. */
static int kv_append_rules_ok(const fcase *c, char *why, size_t wn) {
    const int64_t rows = c->paged ? (int64_t)c->mpps * c->ps : c->cap;
    int32_t cs[MAX_BATCH];
    memcpy(cs, c->arena + c->b[BCSL].region, 4 * (size_t)c->batch);
    for (int b = 0; b < c->batch; b++)
        if (cs[b] < 0 || (int64_t)cs[b] + c->sq > rows) {
            snprintf(why, wn, "cache_seqlens[%d] %d + seqlen_new %d outside [0, %lld]", b, (int)cs[b], c->sq, (long long)rows);
            return 0;
        }
    if (!c->paged) return 1;
    static uint8_t claimed[MAX_POOL][16];
    memset(claimed, 0, sizeof claimed);
    const uint8_t *tb = c->arena + c->b[BTABLE].region;
    for (int b = 0; b < c->batch; b++)
        for (int t = 0; t < c->sq; t++) {
            const int j = cs[b] + t;
            int32_t e;
            memcpy(&e, tb + 4 * (size_t)(b * c->mpps + j / c->ps), 4);
            if (e < 0 || e >= c->npages) {
                snprintf(why, wn, "block_table[%d][%d] %d outside [0, %d) (written)", b, j / c->ps, (int)e, c->npages);
                return 0;
            }
            if (claimed[e][j % c->ps]++) {
                snprintf(why, wn, "row %d of page %d written twice", j % c->ps, (int)e);
                return 0;
            }
        }
    return 1;
}

static void mark_outputs(const fcase *c, uint8_t *mask) {
    if (c->api == API_KVA) { /* only the appended rows */
        for (int i = BDK; i <= BDV; i++) {
            const buf *x = &c->b[i];
            int64_t st[3];
            strides_of(x, st);
            for (int b = 0; b < c->batch; b++)
                for (int t = 0; t < c->sq; t++) {
                    int64_t cb, cr;
                    kva_dest(c, b, t, &cb, &cr);
                    for (int64_t h = 0; h < x->n[2]; h++) memset(mask + elem_off(x, st, cb, cr, h, 0), 1, (size_t)x->n[3] * x->es);
                }
        }
        return;
    }
    if (c->api == API_FWD && c->has_squ) { /* only the rows seqused_q computes, o and lse */
        const buf *o = &c->b[BO];
        int64_t st[3];
        strides_of(o, st);
        for (int b = 0; b < c->batch; b++)
            for (int r = 0; r < qlen_of(c, b); r++) {
                const int64_t ob = c->varlen ? 0 : b, os = c->varlen ? c->cuq[b] + r : r;
                for (int64_t h = 0; h < o->n[2]; h++) {
                    memset(mask + elem_off(o, st, ob, os, h, 0), 1, (size_t)o->n[3] * o->es);
                    if (c->want_lse && c->b[BLSE].passed) {
                        memset(mask + c->b[BLSE].off + 4 * (size_t)lse_index(c, b, h, r), 1, 4);
                    }
                }
            }
        return;
    }
    for (int i = 0; i < NBUF; i++) {
        const buf *x = &c->b[i];
        if (!x->passed || !x->output) continue;
        if (!x->tensor) {
            memset(mask + x->off, 1, span_bytes(x));
            continue;
        }
        int64_t st[3];
        strides_of(x, st);
        for (int64_t b = 0; b < x->n[0]; b++)
            for (int64_t s = 0; s < x->n[1]; s++)
                for (int64_t h = 0; h < x->n[2]; h++)
                    memset(mask + elem_off(x, st, b, s, h, 0), 1, (size_t)x->n[3] * x->es);
    }
}

/* Where byte `off` of the arena is, for messages. */
static void where(const fcase *c, size_t off, char *out, size_t n) {
    for (int i = 0; i < NBUF; i++) {
        const buf *x = &c->b[i];
        if (x->name && off >= x->off && off < x->off + span_or_storage(x)) {
            snprintf(out, n, "byte %zu of %s's span", off - x->off, x->name);
            return;
        }
    }
    for (int i = 0; i < NBUF; i++) {
        const buf *x = &c->b[i];
        if (x->alloc && off >= x->region && off < x->region + x->bytes) {
            snprintf(out, n, "byte %zu of %s's storage", off - x->region, x->name);
            return;
        }
    }
    snprintf(out, n, "arena byte %zu, a guard", off);
}

static int64_t g_fail_cases;
static int g_case_failed;

static void fail(fcase *c, const char *fmt, ...) {
    tu_failures++;
    if (!g_case_failed) g_fail_cases++;
    if (g_fail_cases > MAX_FAILURES_SHOWN) {
        g_case_failed = 1;
        return;
    }
    if (!g_case_failed)
        fprintf(stderr, "case %lld FAILED: %s\n  replay: FATTN_TEST_SEED=%d FATTN_FUZZ_ONLY=%lld %s\n",
                (long long)c->index, c->desc, g_seed, (long long)c->index, g_prog);
    g_case_failed = 1;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "  - ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

/* Does row i of a sequence of lq queries and lk (used) keys see key j
 * (causal, window: fattn.h's definitions, written out here)? */
static int key_visible(const fcase *c, int i, int j, int lq, int lk) {
    const int64_t last = (int64_t)i + lk - lq;
    if (c->causal && j > last) return 0;
    if (c->win && c->wr >= 0 && j > last + c->wr) return 0;
    if (c->win && c->wl >= 0 && j < last - c->wl) return 0;
    return 1;
}

/* Row r (packed index in varlen mode) of batch entry b: does it see a key? */
static int sees_key(const fcase *c, int b, int r) {
    const int lq = qlen_of(c, b);
    const int lk = c->api == API_FWD ? c->used[b] : c->varlen ? c->lens_k[b] : c->sk; /* causal: the used count */
    for (int j = 0; j < lk; j++)
        if (key_visible(c, r, j, lq, lk)) return 1;
    return 0;
}

static void check_fwd_values(fcase *c) {
    const buf *o = &c->b[BO], *v = &c->b[BV], *lse = &c->b[BLSE];
    const int e4m3 = c->api == API_FWD && c->dt == FATTN_DTYPE_E4M3;
    int64_t st[3], vst[3];
    strides_of(o, st);
    strides_of(v, vst);
    double vmax = 0;
    for (int64_t b = 0; b < v->n[0]; b++)
        for (int64_t s = 0; s < v->n[1]; s++)
            for (int64_t h = 0; h < v->n[2]; h++)
                for (int64_t e = 0; e < v->n[3]; e++) {
                    double x = fabs(get(c->arena + elem_off(v, vst, b, s, h, e), c->dt));
                    if (e4m3) {
                        float sc;
                        const int64_t nbl = cdiv(v->n[1], c->blk[2]);
                        memcpy(&sc, c->arena + c->b[BVS].off + 4 * (size_t)((b * v->n[2] + h) * nbl + s / c->blk[2]), 4);
                        x *= sc;
                    }
                    if (x > vmax) vmax = x;
                }
    const double bound = 1.25 * vmax + 1e-6; /* O is a convex combination of V's rows (FP8: rounded) */
    int bad = 0;
    for (int b = 0; b < c->batch && bad < 3; b++) {
        const int lq = qlen_of(c, b); /* seqused_q: the rows past it are checked unwritten (mark_outputs) */
        for (int r = 0; r < lq && bad < 3; r++) {
            const int64_t ob = c->varlen ? 0 : b, os = c->varlen ? c->cuq[b] + r : r;
            const int sees = sees_key(c, b, r);
            for (int64_t h = 0; h < o->n[2]; h++) {
                for (int64_t e = 0; e < o->n[3]; e++) {
                    const double x = get(c->arena + elem_off(o, st, ob, os, h, e), c->dto);
                    if (!isfinite(x) || fabs(x) > bound || (!sees && x != 0.0)) {
                        fail(c, "o[%d, %lld, %lld, %lld] = %g (%s; |v| <= %g)", b, (long long)os, (long long)h,
                             (long long)e, x, sees ? "sees keys" : "sees no key: 0 expected", vmax);
                        bad++;
                        break;
                    }
                }
                if (c->want_lse) {
                    float l;
                    const int64_t li = lse_index(c, b, h, r);
                    memcpy(&l, c->arena + lse->off + 4 * (size_t)li, 4);
                    /* a row that sees no key: -inf, or the sink's logit */
                    const float none = c->has_sink ? c->sink[h] : -INFINITY;
                    if (sees ? !isfinite(l) : l != none) {
                        fail(c, "lse[%lld] (batch %d, head %lld, row %d) = %g (%s %g)", (long long)li, b, (long long)h, r,
                             (double)l, sees ? "finite expected" : "sees no key:", (double)none);
                        bad++;
                    }
                }
            }
        }
    }
}

/* An input element as the library reads it (e4m3: code * scale). */
static double in_val(const fcase *c, int id, int scale_id, int32_t blk, int64_t b, int64_t s, int64_t h, int64_t e) {
    const buf *x = &c->b[id];
    int64_t st[3];
    strides_of(x, st);
    double v = get(c->arena + elem_off(x, st, b, s, h, e), c->dt);
    if (c->dt == FATTN_DTYPE_E4M3) {
        float sc;
        const int64_t nbl = cdiv(x->n[1], blk);
        memcpy(&sc, c->arena + c->b[scale_id].off + 4 * (size_t)((b * x->n[2] + h) * nbl + s / blk), 4);
        v *= sc;
    }
    return v;
}

/* The serving fields against an FP64 reference that gathers each
 * sequence's used keys itself (through the table for a paged K/V): o within
 * a few roundings of o's dtype relative to max |v|, lse within 1e-4. */
static double arena_val(const fcase *c, int which, int64_t b, int64_t s, int64_t h, int64_t e);
static void check_fwd_reference_with(fcase *c, double (*val)(const fcase *, int, int64_t, int64_t, int64_t, int64_t));
static void check_fwd_reference(fcase *c) { check_fwd_reference_with(c, arena_val); }

static void check_fwd_reference_with(fcase *c, double (*val)(const fcase *, int, int64_t, int64_t, int64_t, int64_t)) {
    const buf *o = &c->b[BO];
    const int e4m3 = c->dt == FATTN_DTYPE_E4M3 || c->api == API_FP8;
    const double scale = c->softmax_scale == 0.0f ? 1.0 / sqrt((double)c->d) : (double)c->softmax_scale;
    const double tol = c->dto == FATTN_DTYPE_F32 ? (e4m3 ? 1e-4 : 2e-5) : c->dto == FATTN_DTYPE_F16 ? 3e-3 : 2e-2;
    int64_t ost[3];
    strides_of(o, ost);
    double sc[64], acc[64];
    int bad = 0;
    for (int b = 0; b < c->batch && bad < 3; b++) {
        const int lq = qlen_of(c, b), u = c->used[b];
        for (int i = 0; i < lq && bad < 3; i++) {
            const int64_t qb = c->varlen ? 0 : b, qs = c->varlen ? c->cuq[b] + i : i;
            for (int h = 0; h < c->hq && bad < 3; h++) {
                const int hk = h / (c->hq / c->hkv);
                double m = -INFINITY, vmax = 0;
                int nk = 0;
                for (int j = 0; j < u; j++) {
                    sc[j] = -INFINITY;
                    if (!key_visible(c, i, j, lq, u)) continue;
                    int64_t kb, ks;
                    key_row(c, b, j, &kb, &ks);
                    double dot = 0;
                    for (int e = 0; e < c->d; e++) dot += val(c, 0, qb, qs, h, e) * val(c, 1, kb, ks, hk, e);
                    sc[j] = dot * scale;
                    if (c->softcap > 0.0f) sc[j] = c->softcap * tanh(sc[j] / c->softcap);
                    if (sc[j] > m) m = sc[j];
                    nk++;
                }
                if (!nk) continue; /* check_fwd_values: o 0, lse -inf (or the sink) */
                double sum = 0;
                if (c->has_sink) { /* one more column of the softmax, with no value row */
                    if (c->sink[h] > m) m = c->sink[h];
                    sum = exp(c->sink[h] - m);
                }
                for (int e = 0; e < c->dv; e++) acc[e] = 0;
                for (int j = 0; j < u; j++) {
                    if (sc[j] == -INFINITY) continue;
                    const double w = exp(sc[j] - m);
                    int64_t kb, ks;
                    key_row(c, b, j, &kb, &ks);
                    sum += w;
                    for (int e = 0; e < c->dv; e++) {
                        const double v = val(c, 2, kb, ks, hk, e);
                        acc[e] += w * v;
                        if (fabs(v) > vmax) vmax = fabs(v);
                    }
                }
                for (int e = 0; e < c->dv; e++) {
                    const double ref = acc[e] / sum, x = get(c->arena + elem_off(o, ost, qb, qs, h, e), c->dto);
                    if (!(fabs(x - ref) <= tol * vmax + 1e-30)) {
                        fail(c, "o[%d, %lld, %d, %d] = %.9g, the FP64 reference over the %d used keys %.9g (tol %g)", b,
                             (long long)qs, h, e, x, u, ref, tol * vmax);
                        bad++;
                        break;
                    }
                }
                if (c->want_lse) {
                    float l;
                    const int64_t li = lse_index(c, b, h, i);
                    memcpy(&l, c->arena + c->b[BLSE].off + 4 * (size_t)li, 4);
                    const double ref = m + log(sum);
                    if (!(fabs(l - ref) <= 1e-4 * (1 + fabs(ref)))) {
                        fail(c, "lse (batch %d, head %d, row %d) = %.9g, the FP64 reference %.9g", b, h, i, (double)l, ref);
                        bad++;
                    }
                }
            }
        }
    }
}

/* fattn_merge against a double-precision merge of the parts (the CPU
 * engine's own arithmetic, then rounded once to f32 and to o's dtype): o
 * within an ulp or two of its dtype relative to max |O_i|, lse within 1e-6,
 * rows -inf in every part o = 0 and lse = -inf exactly. */
static void check_merge_reference(fcase *c) {
    const buf *o = &c->b[BO];
    const double tol = c->dto == FATTN_DTYPE_F32 ? 1e-6 : c->dto == FATTN_DTYPE_F16 ? 1.5e-3 : 1e-2;
    int64_t ost[3], pst[MERGE_DISTINCT][3];
    strides_of(o, ost);
    if (c->nd > MERGE_DISTINCT) return;
    for (int i = 0; i < c->nd; i++) strides_of(&c->b[BP0 + i], pst[i]);
    double acc[64], w[MERGE_DISTINCT];
    int bad = 0;
    for (int b = 0; b < c->batch && bad < 3; b++)
        for (int h = 0; h < c->hq && bad < 3; h++)
            for (int s = 0; s < c->sq && bad < 3; s++) {
                const size_t li = (size_t)((b * c->hq + h) * c->sq + s);
                double lse[MERGE_DISTINCT], m = -INFINITY, sum = 0, omax = 0;
                int nan_row = 0;
                for (int i = 0; i < c->nd; i++) {
                    float f;
                    memcpy(&f, c->arena + c->b[BPL0 + i].off + 4 * li, 4);
                    lse[i] = f;
                    if (lse[i] > m) m = lse[i];
                    nan_row |= isnan(f) || f == INFINITY;
                }
                if (nan_row) { /* every element of o and the lse NaN */
                    for (int e = 0; e < c->d; e++) {
                        const double x = get(c->arena + elem_off(o, ost, b, s, h, e), c->dto);
                        if (!isnan(x)) {
                            fail(c, "o[%d, %d, %d, %d] = %g, NaN expected (a part's lse is NaN or +inf)", b, s, h, e, x);
                            bad++;
                            break;
                        }
                    }
                    float l;
                    if (c->want_lse && (memcpy(&l, c->arena + c->b[BLSE].off + 4 * li, 4), !isnan(l))) {
                        fail(c, "lse[%zu] = %g, NaN expected (a part's lse is NaN or +inf)", li, (double)l);
                        bad++;
                    }
                    continue;
                }
                for (int e = 0; e < c->d; e++) acc[e] = 0;
                for (int i = 0; i < c->nd; i++) {
                    w[i] = m == -INFINITY ? 0 : exp(lse[i] - m);
                    if (w[i] == 0) continue;
                    sum += w[i] * (c->nparts / c->nd + (i < c->nparts % c->nd)); /* part i and its repeats */
                }
                for (int i = 0; i < c->nd && m != -INFINITY; i++) {
                    if (w[i] == 0) continue;
                    const double wi = w[i] * (c->nparts / c->nd + (i < c->nparts % c->nd)) / sum;
                    for (int e = 0; e < c->d; e++) {
                        const double x = get(c->arena + elem_off(&c->b[BP0 + i], pst[i], b, s, h, e), c->pdt[i]);
                        acc[e] += wi * x;
                        if (fabs(x) > omax) omax = fabs(x);
                    }
                }
                for (int e = 0; e < c->d; e++) {
                    const double x = get(c->arena + elem_off(o, ost, b, s, h, e), c->dto);
                    const double ref = m == -INFINITY ? 0 : acc[e];
                    if (isnan(ref) ? !isnan(x) : m == -INFINITY ? x != 0 : !(fabs(x - ref) <= tol * omax + 1e-300)) {
                        fail(c, "o[%d, %d, %d, %d] = %.9g, the FP64 merge %.9g (tol %g%s)", b, s, h, e, x, ref,
                             tol * omax, m == -INFINITY ? "; -inf in every part: 0 exactly" : "");
                        bad++;
                        break;
                    }
                }
                if (c->want_lse) {
                    float l;
                    memcpy(&l, c->arena + c->b[BLSE].off + 4 * li, 4);
                    const double ref = m == -INFINITY ? -INFINITY : m + log(sum);
                    if (m == -INFINITY ? !(isinf(l) && l < 0) : !(fabs(l - ref) <= 1e-6 * (1 + fabs(ref)))) {
                        fail(c, "lse[%zu] (batch %d, head %d, row %d) = %.9g, the FP64 merge %.9g", li, b, h, s, (double)l,
                             ref);
                        bad++;
                    }
                }
            }
}

/* fattn_kv_append: each new row's bytes in the cache row the header names. */
static void check_kv_append(fcase *c) {
    for (int i = 0; i < 2; i++) {
        const buf *x = &c->b[i ? BV : BK], *y = &c->b[i ? BDV : BDK];
        int64_t xs[3], ys[3];
        strides_of(x, xs);
        strides_of(y, ys);
        const size_t nb = (size_t)x->n[3] * x->es;
        for (int b = 0; b < c->batch; b++)
            for (int t = 0; t < c->sq; t++) {
                int64_t cb, cr;
                kva_dest(c, b, t, &cb, &cr);
                for (int64_t h = 0; h < x->n[2]; h++)
                    if (memcmp(c->arena + elem_off(x, xs, b, t, h, 0), c->arena + elem_off(y, ys, cb, cr, h, 0), nb)) {
                        fail(c, "%s row (%d, %d, head %lld) is not in %s row (%lld, %lld) as copied bytes", x->name, b, t,
                             (long long)h, y->name, (long long)cb, (long long)cr);
                        return;
                    }
            }
    }
}

static void check_tensor_finite(fcase *c, int id) {
    const buf *x = &c->b[id];
    const fattn_dtype dt = dtype_of(c, id);
    int64_t st[3];
    strides_of(x, st);
    for (int64_t b = 0; b < x->n[0]; b++)
        for (int64_t s = 0; s < x->n[1]; s++)
            for (int64_t h = 0; h < x->n[2]; h++)
                for (int64_t e = 0; e < x->n[3]; e++) {
                    const double v = get(c->arena + elem_off(x, st, b, s, h, e), dt);
                    if (!isfinite(v)) {
                        fail(c, "%s[%lld, %lld, %lld, %lld] = %g on finite inputs", x->name, (long long)b,
                             (long long)s, (long long)h, (long long)e, v);
                        return;
                    }
                }
}

/* fattn_quantize's definition (fattn.h), written out independently of
 * src/cpu/quantize.c: x packed [nb][ns][nh][d] (the input as f32), each row
 * rotated when asked (x * signs of fattn_rotation_signs, then the
 * Walsh-Hadamard butterflies h = 1, 2, 4, ...: x[j] = a + b, x[j + h] =
 * a - b, then times (float)(1 / sqrt(d))), amax over the block skipping NaN,
 * scale max(amax / 448, 2^-126) (1 for an all-zero block; per tensor one
 * amax), code fattn_f32_to_e4m3(x / scale).  codes packed like x, scales
 * [nb][nh][ceil(ns / br)]. */
static void quantize_ref(float *x, int64_t nb, int64_t ns, int64_t nh, int64_t d, int tensor, int64_t br, int rotate,
                         uint64_t seed, uint8_t *codes, float *scales) {
    if (rotate) {
        float signs[64];
        fattn_rotation_signs(seed, (int32_t)d, signs);
        for (int64_t r = 0; r < nb * ns * nh; r++) {
            float *row = x + r * d;
            for (int64_t i = 0; i < d; i++) row[i] *= signs[i];
            for (int64_t hh = 1; hh < d; hh <<= 1)
                for (int64_t i = 0; i < d; i += hh << 1)
                    for (int64_t j = i; j < i + hh; j++) {
                        const float a = row[j], b = row[j + hh];
                        row[j] = a + b;
                        row[j + hh] = a - b;
                    }
            const float norm = (float)(1.0 / sqrt((double)d));
            for (int64_t i = 0; i < d; i++) row[i] *= norm;
        }
    }
    const int64_t nbl = cdiv(ns, br);
    float tamax = 0.0f;
    if (tensor)
        for (int64_t i = 0; i < nb * ns * nh * d; i++) tamax = fmaxf(tamax, fabsf(x[i]));
    for (int64_t b = 0; b < nb; b++)
        for (int64_t h = 0; h < nh; h++)
            for (int64_t blk = 0; blk < nbl; blk++) {
                const int64_t r0 = blk * br, r1 = r0 + br < ns ? r0 + br : ns;
                float amax = tamax;
                if (!tensor)
                    for (int64_t r = r0; r < r1; r++)
                        for (int64_t e = 0; e < d; e++) amax = fmaxf(amax, fabsf(x[((b * ns + r) * nh + h) * d + e]));
                float sc = 1.0f;
                if (amax > 0.0f) {
                    sc = amax / 448.0f;
                    if (!(sc > 0x1p-126f)) sc = 0x1p-126f;
                }
                scales[(b * nh + h) * nbl + blk] = sc;
                for (int64_t r = r0; r < r1; r++)
                    for (int64_t e = 0; e < d; e++) {
                        const int64_t k = ((b * ns + r) * nh + h) * d + e;
                        codes[k] = fattn_f32_to_e4m3(x[k] / sc);
                    }
            }
}

/* Input id of the case, packed [n0][n1][n2][n3] as f32 (as the library reads
 * it). */
static float *load_f32(const fcase *c, int id) {
    const buf *x = &c->b[id];
    int64_t st[3];
    strides_of(x, st);
    float *out = (float *)malloc(sizeof(float) * (size_t)(x->n[0] * x->n[1] * x->n[2] * x->n[3]) + 1);
    if (!out) exit(1);
    size_t k = 0;
    for (int64_t b = 0; b < x->n[0]; b++)
        for (int64_t sr = 0; sr < x->n[1]; sr++)
            for (int64_t h = 0; h < x->n[2]; h++)
                for (int64_t e = 0; e < x->n[3]; e++) out[k++] = (float)get(c->arena + elem_off(x, st, b, sr, h, e), dtype_of(c, id));
    return out;
}

/* fattn_quantize against quantize_ref: every code byte and scale bit. */
static void check_quantize_reference(fcase *c) {
    const buf *in = &c->b[BQ], *out = &c->b[BO], *sb = &c->b[BQS];
    const int64_t nb = in->n[0], ns = in->n[1], nh = in->n[2], d = in->n[3];
    float *x = load_f32(c, BQ);
    uint8_t *codes = (uint8_t *)malloc((size_t)(nb * ns * nh * d) + 1);
    float *scales = (float *)malloc(sizeof(float) * (size_t)sb->count + 1);
    if (!codes || !scales) exit(1);
    quantize_ref(x, nb, ns, nh, d, c->qa.granularity == FATTN_QUANT_TENSOR, c->qa.block_rows, c->qa.rotate != 0,
                 c->qa.seed, codes, scales);
    for (int64_t i = 0; i < sb->count; i++) {
        float f;
        memcpy(&f, c->arena + sb->off + 4 * (size_t)i, 4);
        if (memcmp(&f, &scales[i], 4) != 0) {
            fail(c, "out.scale[%lld] = %a, the definition's %a", (long long)i, (double)f, (double)scales[i]);
            break;
        }
    }
    int64_t st[3];
    strides_of(out, st);
    size_t k = 0;
    int bad = 0;
    for (int64_t b = 0; b < nb && !bad; b++)
        for (int64_t sr = 0; sr < ns && !bad; sr++)
            for (int64_t h = 0; h < nh && !bad; h++)
                for (int64_t e = 0; e < d; e++, k++) {
                    const uint8_t got = c->arena[elem_off(out, st, b, sr, h, e)];
                    if (got != codes[k]) {
                        fail(c, "out[%lld, %lld, %lld, %lld] = 0x%02x, the definition's 0x%02x (x / scale = %a)",
                             (long long)b, (long long)sr, (long long)h, (long long)e, got, codes[k],
                             (double)(x[k] / scales[(b * nh + h) * cdiv(ns, c->qa.block_rows) + sr / c->qa.block_rows]));
                        bad = 1;
                        break;
                    }
                }
    free(x); free(codes); free(scales);
}

/* fattn_fwd_fp8 = quantize_ref on q, k (rotated when asked) and v (blocks
 * of the options, 128 by default and per tensor; varlen: over the packed
 * tokens), then an FP64 attention over the dequantised values: O within the
 * e4m3 fattn_fwd's tolerance, LSE within 1e-4. */
static double *g_deq[3]; /* q, k, v dequantised, packed like their buffers */
static double deq_val(const fcase *c, int which, int64_t b, int64_t s, int64_t h, int64_t e) {
    const buf *x = &c->b[which == 0 ? BQ : which == 1 ? BK : BV];
    return g_deq[which][((b * x->n[1] + s) * x->n[2] + h) * x->n[3] + e];
}
static double arena_val(const fcase *c, int which, int64_t b, int64_t s, int64_t h, int64_t e) {
    return which == 0 ? in_val(c, BQ, BQS, c->blk[0], b, s, h, e)
           : which == 1 ? in_val(c, BK, BKS, c->blk[1], b, s, h, e)
                        : in_val(c, BV, BVS, c->blk[2], b, s, h, e);
}

static void check_fp8_reference(fcase *c) {
    const int tensor = !c->opt_null && c->opt.granularity == FATTN_QUANT_TENSOR;
    const int32_t want[3] = {c->opt_null ? 0 : c->opt.block_rows_q, c->opt_null ? 0 : c->opt.block_rows_k,
                             c->opt_null ? 0 : c->opt.block_rows_v};
    const int rotate = !c->opt_null && c->opt.rotate != 0;
    int ok = 1;
    for (int t = 0; t < 3; t++) {
        const int id = BQ + t;
        const buf *x = &c->b[id];
        const int64_t nb = x->n[0], ns = x->n[1], nh = x->n[2], d = x->n[3], n = nb * ns * nh * d;
        const int64_t br = tensor || want[t] == 0 ? 128 : want[t];
        float *v = load_f32(c, id);
        uint8_t *codes = (uint8_t *)malloc((size_t)n + 1);
        float *scales = (float *)malloc(sizeof(float) * (size_t)(nb * nh * cdiv(ns > 0 ? ns : 1, br)) + 1);
        g_deq[t] = (double *)malloc(sizeof(double) * (size_t)n + 1);
        if (!codes || !scales || !g_deq[t]) exit(1);
        if (ns > 0) quantize_ref(v, nb, ns, nh, d, tensor, br, rotate && t < 2, c->opt.seed, codes, scales);
        for (int64_t k = 0; k < n; k++) {
            const int64_t r = k / d, h = r % nh, sr = r / nh % ns, b = r / (nh * ns);
            g_deq[t][k] = (double)fattn_e4m3_to_f32(codes[k]) * scales[(b * nh + h) * cdiv(ns, br) + sr / br];
            if (!isfinite(g_deq[t][k])) ok = 0;
        }
        free(v); free(codes); free(scales);
    }
    if (ok) {
        for (int b = 0; b < c->batch; b++) c->used[b] = c->varlen ? c->lens_k[b] : c->sk;
        check_fwd_reference_with(c, deq_val);
    } else {
        fail(c, "the definition's dequantised q, k or v is not finite on finite inputs");
    }
    for (int t = 0; t < 3; t++) free(g_deq[t]), g_deq[t] = NULL;
}

/* fattn_bwd against an FP64 backward from the same q, k, v, o, dout and lse
 * (P = exp(scale q.k - lse), D = dout.o, dS = P (dP - D)): each element of
 * dq, dk, dv within tol x the same sums taken over absolute values (an
 * error bound that holds through dS's cancellation), tol 1e-4 for f32 and
 * the output's rounding for f16 (2e-3) / bf16 (2e-2), plus the f32 (and
 * output) subnormal steps for a subnormal softmax_scale; rows with lse -inf
 * give dq = 0 and add nothing, and so keys no row sees get dk = dv = 0
 * exactly. */
static void check_bwd_reference(fcase *c) {
    const double scale = c->softmax_scale == 0.0f ? 1.0 / sqrt((double)c->d) : (double)c->softmax_scale;
    const double tol = c->dt == FATTN_DTYPE_F32 ? 1e-4 : c->dt == FATTN_DTYPE_F16 ? 2e-3 : 2e-2;
    const double floor_abs = (double)(c->sq + c->sk + c->d + c->dv + 8) * 0x1p-149 +
                             (c->dt == FATTN_DTYPE_F16 ? 0x1p-25 : c->dt == FATTN_DTYPE_BF16 ? 0x1p-134 : 0.0);
    const buf *q = &c->b[BQ], *k = &c->b[BK];
    const int64_t nq = q->n[0] * q->n[1] * q->n[2], nk = k->n[0] * k->n[1] * k->n[2];
    double *dq = (double *)calloc((size_t)(nq * c->d) + 1, sizeof(double));
    double *dqa = (double *)calloc((size_t)(nq * c->d) + 1, sizeof(double));
    double *dk = (double *)calloc((size_t)(nk * c->d) + 1, sizeof(double));
    double *dka = (double *)calloc((size_t)(nk * c->d) + 1, sizeof(double));
    double *dv = (double *)calloc((size_t)(nk * c->dv) + 1, sizeof(double));
    double *dva = (double *)calloc((size_t)(nk * c->dv) + 1, sizeof(double));
    float *fq = load_f32(c, BQ), *fk = load_f32(c, BK), *fv = load_f32(c, BV), *fo = load_f32(c, BO);
    float *fdo = load_f32(c, BDOUT);
    if (!dq || !dqa || !dk || !dka || !dv || !dva) exit(1);
    const int group = c->hq / c->hkv, d = c->d, dvv = c->dv;
    double dsk[16] = {0}, dska[16] = {0};
    for (int b = 0; b < c->batch; b++) {
        const int lq = c->varlen ? c->lens_q[b] : c->sq, lk = c->varlen ? c->lens_k[b] : c->sk;
        const int64_t qb = c->varlen ? 0 : b, q0 = c->varlen ? c->cuq[b] : 0, k0 = c->varlen ? c->cuk[b] : 0;
        for (int h = 0; h < c->hq; h++) {
            const int hk = h / group;
            for (int i = 0; i < lq; i++) {
                float l;
                const int64_t li = lse_index(c, b, h, i);
                memcpy(&l, c->arena + c->b[BLSE].off + 4 * (size_t)li, 4);
                if (l == -INFINITY) continue;
                const int64_t qr = (qb * q->n[1] + q0 + i) * c->hq + h; /* row of q, o, dout, dq */
                double D = 0, Da = 0;
                for (int e = 0; e < dvv; e++) {
                    D += (double)fdo[qr * dvv + e] * fo[qr * dvv + e];
                    Da += fabs((double)fdo[qr * dvv + e] * fo[qr * dvv + e]);
                }
                if (c->want_dsink) { /* dsink = -sum_i exp(sink - lse_i) D_i */
                    dsk[h] -= exp(c->sink[h] - (double)l) * D;
                    dska[h] += exp(c->sink[h] - (double)l) * Da;
                }
                for (int j = 0; j < lk; j++) {
                    if (!key_visible(c, i, j, lq, lk)) continue;
                    const int64_t kr = (qb * k->n[1] + k0 + j) * c->hkv + hk; /* row of k, v, dk, dv */
                    double sdot = 0, dp = 0, dpa = 0;
                    for (int e = 0; e < d; e++) sdot += (double)fq[qr * d + e] * fk[kr * d + e];
                    for (int e = 0; e < dvv; e++) {
                        dp += (double)fdo[qr * dvv + e] * fv[kr * dvv + e];
                        dpa += fabs((double)fdo[qr * dvv + e] * fv[kr * dvv + e]);
                    }
                    /* softcap: s -> cap tanh(s / cap), ds'/ds = 1 - tanh^2 = 1 / cosh^2
                     * (1 - t * t is 0 once tanh rounds to 1, 1 / cosh^2 is not) */
                    double s = sdot * scale, dcap = 1.0;
                    if (c->softcap > 0.0f) {
                        const double ch = cosh(s / c->softcap);
                        s = c->softcap * tanh(s / c->softcap);
                        dcap = 1.0 / (ch * ch);
                    }
                    const double P = exp(s - (double)l), dS = P * (dp - D) * dcap, dSa = P * (dpa + Da) * dcap;
                    for (int e = 0; e < d; e++) {
                        dq[qr * d + e] += scale * dS * fk[kr * d + e];
                        dqa[qr * d + e] += scale * dSa * fabs((double)fk[kr * d + e]);
                        dk[kr * d + e] += scale * dS * fq[qr * d + e];
                        dka[kr * d + e] += scale * dSa * fabs((double)fq[qr * d + e]);
                    }
                    for (int e = 0; e < dvv; e++) {
                        dv[kr * dvv + e] += P * fdo[qr * dvv + e];
                        dva[kr * dvv + e] += P * fabs((double)fdo[qr * dvv + e]);
                    }
                }
            }
        }
    }
    const int ids[3] = {BDQ, BDK, BDV};
    const double *ref[3] = {dq, dk, dv}, *abs_[3] = {dqa, dka, dva};
    for (int t = 0; t < 3; t++) {
        const buf *x = &c->b[ids[t]];
        int64_t st[3];
        strides_of(x, st);
        size_t kk = 0;
        int bad = 0;
        for (int64_t b = 0; b < x->n[0] && !bad; b++)
            for (int64_t sr = 0; sr < x->n[1] && !bad; sr++)
                for (int64_t h = 0; h < x->n[2] && !bad; h++)
                    for (int64_t e = 0; e < x->n[3]; e++, kk++) {
                        const double got = get(c->arena + elem_off(x, st, b, sr, h, e), c->dt);
                        const double lim = abs_[t][kk] == 0.0 ? 0.0 : tol * abs_[t][kk] + floor_abs;
                        if (!(fabs(got - ref[t][kk]) <= lim)) {
                            fail(c, "%s[%lld, %lld, %lld, %lld] = %.9g, the FP64 backward %.9g (bound %.3g)", x->name,
                                 (long long)b, (long long)sr, (long long)h, (long long)e, got, ref[t][kk], lim);
                            bad = 1;
                            break;
                        }
                    }
    }
    if (c->want_dsink)
        for (int h = 0; h < c->hq; h++) {
            /* plus an absolute 1e-6: the reference's D is from the stored o,
             * the engine's (16-bit o) from P and dP, and an o rounded to 0
             * (a +30 sink) leaves the reference's bound at 0 */
            const double lim = tol * dska[h] + floor_abs + 1e-6;
            if (!(fabs((double)c->dsink[h] - dsk[h]) <= lim)) {
                fail(c, "dsink[%d] = %.9g, the FP64 -sum exp(sink - lse) D %.9g (bound %.3g)", h, (double)c->dsink[h],
                     dsk[h], lim);
                break;
            }
        }
    free(dq); free(dqa); free(dk); free(dka); free(dv); free(dva);
    free(fq); free(fk); free(fv); free(fo); free(fdo);
}

static void check_values(fcase *c) {
    switch (c->api) {
    case API_FWD:
        check_fwd_values(c);
        check_fwd_reference(c), g_ref_checked[c->api]++;
        break;
    case API_FP8:
        check_fwd_values(c);
        check_fp8_reference(c), g_ref_checked[c->api]++;
        break;
    case API_MERGE: check_merge_reference(c), g_ref_checked[c->api]++; break;
    case API_KVA: check_kv_append(c), g_ref_checked[c->api]++; break;
    case API_BWD:
        check_tensor_finite(c, BDQ);
        check_tensor_finite(c, BDK);
        check_tensor_finite(c, BDV);
        check_bwd_reference(c), g_ref_checked[c->api]++;
        break;
    default: {
        check_tensor_finite(c, BO); /* NaN codes are the only non-finite e4m3 */
        check_quantize_reference(c), g_ref_checked[c->api]++;
        const buf *s = &c->b[BQS];
        for (int64_t i = 0; i < s->count; i++) {
            float f;
            memcpy(&f, c->arena + s->off + 4 * (size_t)i, 4);
            if (!isfinite(f) || !(f > 0)) {
                fail(c, "out.scale[%lld] = %g on finite inputs (finite, > 0 expected)", (long long)i, (double)f);
                break;
            }
        }
        break;
    }
    }
}

/* ------------------------------------------------------------------------ */
/* One case                                                                 */
/* ------------------------------------------------------------------------ */

static fattn_status call(fcase *c, fattn_ctx *ctx) {
    fattn_ctx *x = c->ctx_null ? NULL : ctx;
    switch (c->api) {
    case API_FWD: return fattn_fwd(x, c->args_null ? NULL : &c->fa);
    case API_BWD: return fattn_bwd(x, c->args_null ? NULL : &c->ba);
    case API_QUANT: return fattn_quantize(x, c->args_null ? NULL : &c->qa);
    case API_MERGE: return fattn_merge(x, c->args_null ? NULL : &c->ma);
    case API_KVA: return fattn_kv_append(x, c->args_null ? NULL : &c->ka);
    default: return fattn_fwd_fp8(x, c->args_null ? NULL : &c->fa, c->opt_null ? NULL : &c->opt);
    }
}

static long g_calls[API_N], g_ok[API_N], g_valid[API_N];

static void run_case(fattn_ctx *ctx, int64_t index) {
    static fcase cs;
    fcase *c = &cs;
    memset(c, 0, sizeof *c);
    c->index = index;
    tu_rng_init(&c->rng, (uint64_t)g_seed * 0x9E3779B97F4A7C15ull ^ (uint64_t)index);
    g_case_failed = 0;
    snprintf(g_replay, sizeof g_replay,
             "test_fuzz: died in case %lld; replay: FATTN_TEST_SEED=%d FATTN_FUZZ_ONLY=%lld %s\n",
             (long long)index, g_seed, (long long)index, g_prog);

    const uint32_t r = rnd(c, 100);
    c->api = r < 29 ? API_FWD : r < 45 ? API_BWD : r < 58 ? API_QUANT : r < 72 ? API_FP8 : r < 86 ? API_MERGE : API_KVA;
    c->threads = (int)rnd(c, 4);
    draw_problem(c);
    say(c, " thr%d", c->threads);
    const uint32_t m = rnd(c, 100);
    const int want = m < 35 ? 0 : m < 80 ? 1 : m < 94 ? 2 : 3;
    for (int i = 0; i < want; i++) {
        mkind k;
        do k = (mkind)rnd(c, M_N);
        while (!applicable(c, k));
        c->mut[c->nmut++] = k;
    }
    make_bufs(c);
    draw_layouts(c);
    place(c);
    for (int i = 0; i < c->nmut; i++)
        if (c->mut[i] == M_OVERLAP || c->mut[i] == M_TOUCH) lay_over(c, c->mut[i] == M_TOUCH);
    fill(c);
    build_args(c);
    fattn_ctx_set_threads(ctx, c->threads);
    if (c->api == API_BWD) {
        if (g_verbose) {
            printf("case %lld: fattn_fwd making o and lse for the backward\n", (long long)index);
            fflush(stdout);
        }
        bwd_setup(c, ctx);
    }

    unsigned allow = 0; /* the statuses a refusal may have: union over what is wrong */
    char why[256] = "";
    for (int i = 0; i < c->nmut; i++) {
        const mkind k = c->mut[i];
        if (k <= M_TOUCH) continue; /* layouts: the rules decide (layout_ok) */
        const unsigned a = mutate(c, k);
        if (!a) continue;
        c->mutated_args = 1;
        allow |= a;
        snprintf(why + strlen(why), sizeof why - strlen(why), "%s%s", why[0] ? ", " : "", mkind_name[k]);
    }
    char rule[192];
    if (!layout_ok(c, rule, sizeof rule) || (c->api == API_KVA && !kv_append_rules_ok(c, rule, sizeof rule))) {
        allow |= ALLOW_INV;
        snprintf(why + strlen(why), sizeof why - strlen(why), "%s%s", why[0] ? ", " : "", rule);
    }
    if (c->bad_scale) {
        allow |= ALLOW_INV;
        snprintf(why + strlen(why), sizeof why - strlen(why), "%san e4m3 scale NaN or <= 0", why[0] ? ", " : "");
    }
    const int valid = allow == 0;
    if (g_verbose) {
        printf("case %lld: %s%s%s\n", (long long)index, c->desc, valid ? "" : " => refuse: ", why);
        fflush(stdout); /* the last line printed before a crash is its case */
    }

    /* the call */
    fattn_fwd_args fa;
    fattn_bwd_args ba;
    fattn_quantize_args qa;
    fattn_fp8_options opt;
    fattn_merge_args ma;
    fattn_kv_append_args ka;
    static fattn_merge_part parts[FATTN_MERGE_MAX_PARTS + 1];
    memcpy(&ma, &c->ma, sizeof ma);
    memcpy(&ka, &c->ka, sizeof ka);
    memcpy(parts, c->parts, sizeof parts);
    memcpy(&fa, &c->fa, sizeof fa); /* padding included */
    memcpy(&ba, &c->ba, sizeof ba);
    memcpy(&qa, &c->qa, sizeof qa);
    memcpy(&opt, &c->opt, sizeof opt);
    memcpy(c->before, c->arena, c->arena_bytes);
    const fattn_status st = call(c, ctx);
    const char *msg = fattn_last_error(c->ctx_null ? NULL : ctx);
    g_calls[c->api]++;
    g_valid[c->api] += valid;
    if (st == FATTN_OK) g_ok[c->api]++;
    for (int i = 0; i < c->nmut; i++) {
        g_mut_count[c->mut[i]]++;
        if (st != FATTN_OK) g_mut_refused[c->mut[i]]++;
    }

    if ((int)st < 0 || (int)st > FATTN_ERROR_BUSY) fail(c, "status %d is no fattn_status", (int)st);
    if (st == FATTN_ERROR_BUSY) fail(c, "BUSY from a context no other thread uses");
    if (!msg) {
        fail(c, "fattn_last_error returned NULL");
        msg = "";
    }
    if (st == FATTN_OK && msg[0]) fail(c, "FATTN_OK with a message: \"%s\"", msg);
    if (st != FATTN_OK && (!msg[0] || strchr(msg, '\n')))
        fail(c, "%s with an empty or multi-line message: \"%s\"", fattn_status_string(st), msg);
    if (valid && st != FATTN_OK) fail(c, "valid call refused: %s: %s", fattn_status_string(st), msg);
    if (!valid && st == FATTN_OK) fail(c, "invalid call accepted (%s)", why);
    if (!valid && st > FATTN_OK && st <= FATTN_ERROR_INTERNAL && !(allow & (1u << (unsigned)st)))
        fail(c, "refused with %s (%s), expected %s", fattn_status_string(st), msg,
             allow == ALLOW_UNSUP ? "UNSUPPORTED" : allow & ALLOW_UNSUP ? "INVALID_ARGUMENT or UNSUPPORTED" : "INVALID_ARGUMENT");
    if (memcmp(&fa, &c->fa, sizeof fa) || memcmp(&ba, &c->ba, sizeof ba) || memcmp(&qa, &c->qa, sizeof qa) ||
        memcmp(&opt, &c->opt, sizeof opt) || memcmp(&ma, &c->ma, sizeof ma) || memcmp(parts, c->parts, sizeof parts) ||
        memcmp(&ka, &c->ka, sizeof ka))
        fail(c, "the call wrote its argument struct");

    /* the arena */
    if (st != FATTN_OK) {
        if (memcmp(c->before, c->arena, c->arena_bytes)) {
            size_t i = 0, nd = 0;
            while (c->before[i] == c->arena[i]) i++;
            for (size_t j = i; j < c->arena_bytes; j++) nd += c->before[j] != c->arena[j];
            char w[128];
            where(c, i, w, sizeof w);
            fail(c, "refused (%s), yet %zu bytes changed, the first at %s", msg, nd, w);
        }
    } else if (valid || !c->mutated_args) {
        uint8_t *mask = (uint8_t *)calloc(c->arena_bytes, 1);
        if (!mask) exit(1);
        int geometry_ok = 1;
        for (int i = 0; i < NBUF; i++) geometry_ok &= !(c->b[i].passed && c->b[i].bad_stride);
        if (geometry_ok) {
            mark_outputs(c, mask);
            size_t nd = 0, first = 0;
            for (size_t j = 0; j < c->arena_bytes; j++)
                if (c->before[j] != c->arena[j] && !mask[j]) {
                    if (!nd) first = j;
                    nd++;
                }
            if (nd) {
                char w[128];
                where(c, first, w, sizeof w);
                fail(c, "accepted, and %zu bytes outside the outputs' views changed, the first at %s", nd, w);
            }
        }
        free(mask);
        if (valid && (!c->nonfinite || c->api == API_KVA) && !c->setup_failed) check_values(c); /* bytes are bytes */
    }
    free(c->arena);
    free(c->before);
}

/* ------------------------------------------------------------------------ */
/* main                                                                     */
/* ------------------------------------------------------------------------ */

static void on_death(void) {
    if (write(2, g_replay, strlen(g_replay)) < 0) return;
}

static void on_signal(int sig) {
    on_death();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* The sanitizers' runtime, when linked in: say which case died. */
extern void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

static int64_t env_int(const char *name, int64_t dflt) {
    const char *s = getenv(name);
    if (!s || !*s) return dflt;
    char *end;
    long long v = strtoll(s, &end, 0);
    if (*end || v < 0) {
        fprintf(stderr, "test_fuzz: %s=%s is not a non-negative integer\n", name, s);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv) {
    (void)argc;
    if (argv[0]) g_prog = argv[0];
    g_seed = tu_seed();
    const int64_t ncases = env_int("FATTN_FUZZ_CASES", DEFAULT_CASES);
    const int64_t only = env_int("FATTN_FUZZ_ONLY", -1);
    g_verbose = env_int("FATTN_FUZZ_VERBOSE", 0) != 0 || only >= 0;
    signal(SIGSEGV, on_signal);
    signal(SIGBUS, on_signal);
    signal(SIGFPE, on_signal);
    signal(SIGILL, on_signal);
    signal(SIGABRT, on_signal);
    if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(on_death);

    fattn_ctx *ctx = NULL;
    if (fattn_ctx_create(&ctx, FATTN_BACKEND_CPU, 0) != FATTN_OK) {
        fprintf(stderr, "test_fuzz: no CPU context: %s\n", fattn_last_error(NULL));
        return 1;
    }
    if (only >= 0) {
        printf("case %lld only\n", (long long)only);
        run_case(ctx, only);
    } else {
        printf("%lld cases (FATTN_FUZZ_CASES; FATTN_FUZZ_ONLY=n replays case n)\n", (long long)ncases);
        fflush(stdout);
        for (int64_t i = 0; i < ncases; i++) run_case(ctx, i);
    }
    fattn_ctx_free(ctx);

    for (int a = 0; a < API_N; a++)
        printf("  %-9s %6ld calls, %6ld valid, %6ld accepted, %6ld checked against a reference\n", api_name[a],
               g_calls[a], g_valid[a], g_ok[a], g_ref_checked[a]);
    printf("  faults (cases with it / refused):");
    for (int k = 0; k < M_N; k++) printf("%s %s %ld/%ld", k % 6 ? "," : "\n   ", mkind_name[k], g_mut_count[k], g_mut_refused[k]);
    printf("\n");
    if (g_fail_cases) printf("%lld case(s) failed (the first %d are printed above)\n", (long long)g_fail_cases, MAX_FAILURES_SHOWN);
    return tu_finish("test_fuzz");
}
