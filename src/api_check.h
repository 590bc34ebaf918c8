/* api_check.h - the engine-independent argument checks that api.c runs on a
 * private copy of every call's arguments before an engine sees them: sizes
 * and flags of a problem, dtypes, one tensor's pointer, strides and extent,
 * alignment, and overlap between what a call writes and what it reads.
 * Each returns FATTN_OK or records the failure on ctx (error.h).  Not
 * installed. */
#ifndef FATTN_API_CHECK_H
#define FATTN_API_CHECK_H

#include "internal.h"

#include <stddef.h>
#include <stdint.h>

/* Returns from the calling function when a check fails. */
#define CHECK(x)                                                                                   \
    do {                                                                                           \
        fattn_status st_ = (x);                                                                    \
        if (st_ != FATTN_OK) return st_;                                                           \
    } while (0)

/* Shape of one 4-D tensor as seen by a call.  In varlen mode `seqlen` is the
 * packed token count and there is no batch dimension. */
typedef struct fattn_shape4 {
    const char *name;
    int64_t batch, seqlen, heads, dim;
    const char *seqlen_name, *heads_name, *dim_name;
    int varlen;
    const char *batch_name; /* NULL: "batch" (a page pool: "num_pages") */
} fattn_shape4;

/* The bytes [lo, hi) that a call reads or writes through one pointer
 * (lo == hi: none). */
typedef struct fattn_span {
    const char *name;
    uint64_t lo, hi;
} fattn_span;

typedef struct fattn_tensor_shapes {
    fattn_shape4 q, k, v, o;
    int64_t total_q, total_k; /* total_k: seqlen_k without cu_seqlens_k */
    int varlen;               /* q, o and lse packed (cu_seqlens_q); k and v too with cu_seqlens_k */
} fattn_tensor_shapes;

/* Sizes and flags of the problem; resolves head_dim_v == 0, softmax_scale
 * == 0, and normalises causal and window to 0 or 1 in `p`. */
fattn_status fattn_check_problem(fattn_ctx *ctx, fattn_problem *p);
/* The shapes of q, k, v and o for a checked problem; for a varlen batch the
 * token totals (a CPU context reads cu_seqlens on the host, a CUDA context
 * takes p->total_q and p->total_k). */
fattn_status fattn_problem_shapes(fattn_ctx *ctx, const fattn_problem *p, fattn_tensor_shapes *ts);

/* d is one of the fattn_dtype values. */
fattn_status fattn_check_dtype(fattn_ctx *ctx, fattn_dtype d, const char *name);
/* t->dtype is want (ref names the tensor it must match). */
fattn_status fattn_check_same_dtype(fattn_ctx *ctx, const fattn_tensor *t, const char *name,
                                    fattn_dtype want, const char *ref);
/* An e4m3 tensor has a scale pointer and scale_block >= 1 (others: OK). */
fattn_status fattn_check_e4m3_scale(fattn_ctx *ctx, const fattn_tensor *t, const char *name);
/* Every scale of an e4m3 tensor is > 0 (reads them: host memory only). */
fattn_status fattn_check_e4m3_scale_values(fattn_ctx *ctx, const fattn_tensor *t,
                                           const fattn_shape4 *s, const char *name);

/* p (NULL passes) is a multiple of align; elem names the element type. */
fattn_status fattn_check_aligned(fattn_ctx *ctx, const void *p, size_t align, const char *name,
                                 const char *elem);
/* t->data is aligned for t->dtype. */
fattn_status fattn_check_data_aligned(fattn_ctx *ctx, const fattn_tensor *t, const char *name);
/* The paged-cache scalars: with a block table page_size, num_pages and
 * max_pages_per_seq are each >= 1, without one each is 0 (`without` opens
 * the message's reason: "a contiguous cache: "); block_table is int32-aligned. */
fattn_status fattn_check_paged(fattn_ctx *ctx, const int32_t *block_table, int32_t page_size,
                               int32_t num_pages, int32_t max_pages_per_seq, const char *without);

/* t's pointer, strides and extent against s; resolves the "all strides 0"
 * default to packed strides in t (the private copy). */
fattn_status fattn_check_tensor(fattn_ctx *ctx, fattn_tensor *t, const fattn_shape4 *s);
/* An output's elements are pairwise distinct (after fattn_check_tensor). */
fattn_status fattn_check_no_self_overlap(fattn_ctx *ctx, const fattn_tensor *t,
                                         const fattn_shape4 *s);

/* The bytes a checked tensor, a plain array (count elements of elem_bytes;
 * count <= 0: none) or an e4m3 tensor's scales cover. */
fattn_span fattn_tensor_span(const fattn_tensor *t, const fattn_shape4 *s);
fattn_span fattn_array_span(const char *name, const void *p, int64_t count, size_t elem_bytes);
fattn_span fattn_scale_span(const char *name, const fattn_tensor *t, const fattn_shape4 *s);
/* No output span shares a byte with an input span or with another output. */
fattn_status fattn_check_disjoint(fattn_ctx *ctx, const fattn_span *out, int nout,
                                  const fattn_span *in, int nin);

#endif
