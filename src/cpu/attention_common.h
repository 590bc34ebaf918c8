/* attention_common.h - shared by the CPU forward and backward engines. */
#ifndef FATTN_CPU_ATTENTION_COMMON_H
#define FATTN_CPU_ATTENTION_COMMON_H

#include <stdint.h>
#include <stdlib.h>

#include "fattn.h"

/* The backward's block sizes: BM query rows x BN keys per tile.  BN is a
 * multiple of 16 (its GEMM micro-kernel's column granule).  The forward's
 * come from its kernel instance (fwd_block.h). */
#define FATTN_CPU_BM 64
#define FATTN_CPU_BN 64

static inline int64_t fattn_round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* Carve one array of n floats out of a worker's scratch buffer, 16-float
 * aligned; with s == NULL only the size is counted (off is the running total). */
#define FATTN_SCRATCH_TAKE(s, base, off, field, n)              \
    do {                                                        \
        if (s) (s)->field = (base) + (off);                     \
        (off) += (size_t)fattn_round_up((int64_t)(n), 16);      \
    } while (0)

/* The per-sequence serving fields of a call (fattn_fwd_args, fattn_bwd_args;
 * NULL: absent), checked by fattn_cpu_serving_check: entries >= 0, batch
 * indices in range, left pads inside the used keys. */
typedef struct fattn_seq_fields {
    const int32_t *seqused_q, *seqused_k, *cache_batch_idx, *cache_leftpad;
} fattn_seq_fields;

/* One batch entry: where its rows live and how many there are.  Its keys are
 * rows k0 .. k0 + klen - 1 of batch entry kb of k and v (with a block table,
 * positions k0 .. of the sequence's table row); causal and window alignment
 * use qlen and klen (fattn.h, Serving). */
typedef struct fattn_seq {
    int64_t tb;      /* batch index of q, o rows (0 with cu_seqlens_q) */
    int64_t kb;      /* batch index of k, v rows (0 with cu_seqlens_k; cache_batch_idx[b]) */
    int64_t q0, k0;  /* first row index in the tensors (packed offset, + cache_leftpad[b]) */
    int64_t qlen, klen;
} fattn_seq;

/* Sequence b: its rows from cu_seqlens (either side may be fixed-length),
 * then cut by the serving fields f (NULL: none): the queries to the first
 * seqused_q[b], the keys to [cache_leftpad[b], min(seqused_k[b], count)). */
static inline fattn_seq fattn_seq_get(const fattn_problem *p, const fattn_seq_fields *f, int64_t b) {
    fattn_seq s;
    s.tb = p->cu_seqlens_q ? 0 : b;
    s.q0 = p->cu_seqlens_q ? p->cu_seqlens_q[b] : 0;
    s.qlen = p->cu_seqlens_q ? p->cu_seqlens_q[b + 1] - s.q0 : p->seqlen_q;
    s.kb = p->cu_seqlens_k ? 0 : b;
    s.k0 = p->cu_seqlens_k ? p->cu_seqlens_k[b] : 0;
    s.klen = p->cu_seqlens_k ? p->cu_seqlens_k[b + 1] - s.k0 : p->seqlen_k;
    if (!f) return s;
    if (f->seqused_q && f->seqused_q[b] < s.qlen) s.qlen = f->seqused_q[b];
    if (f->seqused_k && f->seqused_k[b] < s.klen) s.klen = f->seqused_k[b];
    if (f->cache_batch_idx) s.kb = f->cache_batch_idx[b];
    if (f->cache_leftpad) {
        s.k0 += f->cache_leftpad[b];
        s.klen -= f->cache_leftpad[b];
    }
    return s;
}

/* Total row counts of the Q and K tensors per batch entry (for e4m3 scale
 * block counts and the varlen LSE layout). */
static inline int64_t fattn_rows_q(const fattn_problem *p) {
    return p->cu_seqlens_q ? p->cu_seqlens_q[p->batch] : p->seqlen_q;
}
static inline int64_t fattn_rows_k(const fattn_problem *p) {
    return p->cu_seqlens_k ? p->cu_seqlens_k[p->batch] : p->seqlen_k;
}

/* Sizes both passes derive from the problem (api.c has already resolved
 * head_dim_v): head dims, their widths padded for the micro-kernels, tensor
 * rows per batch entry (e4m3 scale layout) and the GQA group size. */
typedef struct fattn_cpu_dims {
    int64_t d, dv, dp, dvp;
    int64_t rows_q, rows_k;
    int64_t group; /* heads_q / heads_kv */
} fattn_cpu_dims;

static inline fattn_cpu_dims fattn_cpu_dims_of(const fattn_problem *p) {
    fattn_cpu_dims m;
    m.d = p->head_dim;
    m.dv = p->head_dim_v > 0 ? p->head_dim_v : p->head_dim;
    m.dp = fattn_round_up(m.d, 16);
    m.dvp = fattn_round_up(m.dv, 16);
    m.rows_q = fattn_rows_q(p);
    m.rows_k = fattn_rows_k(p);
    m.group = p->heads_q / p->heads_kv;
    return m;
}

/* Index of the LSE of query row i (within its sequence) of (b, h). */
static inline int64_t fattn_lse_index(const fattn_problem *p, const fattn_seq *s, int64_t b,
                                      int64_t h, int64_t i) {
    if (p->cu_seqlens_q) return h * (int64_t)p->cu_seqlens_q[p->batch] + s->q0 + i;
    return (b * p->heads_q + h) * (int64_t)p->seqlen_q + i;
}

/* The keys query i sees are fattn_first_key .. fattn_last_key (fattn.h:
 * causal, window): either may fall outside [0, klen), callers clamp.
 * Causal: the last is i + klen - qlen (may be < 0); a window's right side
 * adds window_right to that (causal wins: the mask is the intersection),
 * its left side starts at i + klen - qlen - window_left. */
static inline int64_t fattn_last_key(const fattn_problem *p, const fattn_seq *s, int64_t i) {
    if (p->causal) return i + s->klen - s->qlen;
    if (p->window && p->window_right >= 0) return i + s->klen - s->qlen + p->window_right;
    return s->klen - 1;
}
static inline int64_t fattn_first_key(const fattn_problem *p, const fattn_seq *s, int64_t i) {
    if (p->window && p->window_left >= 0) return i + s->klen - s->qlen - p->window_left;
    return 0;
}
/* The left side of the window, or -1 when unbounded. */
static inline int64_t fattn_window_left(const fattn_problem *p) {
    return p->window ? p->window_left : -1;
}

/* A 64-byte aligned zeroed float buffer (NULL on failure). */
static inline float *fattn_falloc(size_t n) {
    size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    if (bytes == 0) bytes = 64;
    void *ptr = aligned_alloc(64, bytes);
    if (ptr) {
        float *f = (float *)ptr;
        for (size_t i = 0; i < bytes / sizeof(float); i++) f[i] = 0.0f;
    }
    return (float *)ptr;
}

/* Task list over (batch entry, head, block): block counts per batch entry
 * and prefix sums, so task t -> (b, h, blk) is a binary search. */
typedef struct fattn_tasks {
    int64_t *base;  /* [batch + 1] first task of each batch entry */
    int64_t *nblk;  /* [batch] blocks per head in batch entry b */
    int64_t heads;
    int64_t batch;
} fattn_tasks;

/* rows_of_b: 1 -> blocks over queries, 0 -> over keys. */
static inline int fattn_tasks_init(fattn_tasks *t, const fattn_problem *p, const fattn_seq_fields *f,
                                   int64_t heads, int over_queries, int64_t block) {
    t->batch = p->batch;
    t->heads = heads;
    t->base = (int64_t *)malloc(sizeof(int64_t) * (size_t)(p->batch + 1));
    t->nblk = (int64_t *)malloc(sizeof(int64_t) * (size_t)(p->batch + 1));
    if (!t->base || !t->nblk) {
        free(t->base);
        free(t->nblk);
        t->base = t->nblk = NULL;
        return -1;
    }
    t->base[0] = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        fattn_seq s = fattn_seq_get(p, f, b);
        int64_t len = over_queries ? s.qlen : s.klen;
        t->nblk[b] = (len + block - 1) / block;
        t->base[b + 1] = t->base[b] + heads * t->nblk[b];
    }
    return 0;
}

static inline void fattn_tasks_free(fattn_tasks *t) {
    free(t->base);
    free(t->nblk);
}

static inline int64_t fattn_tasks_count(const fattn_tasks *t) { return t->base[t->batch]; }

static inline void fattn_tasks_decode(const fattn_tasks *t, int64_t task, int64_t *b, int64_t *h,
                                      int64_t *blk) {
    int64_t lo = 0, hi = t->batch - 1;
    while (lo < hi) { /* last b with base[b] <= task */
        int64_t mid = (lo + hi + 1) / 2;
        if (t->base[mid] <= task) lo = mid;
        else hi = mid - 1;
    }
    /* skip empty batch entries sharing the same base */
    while (lo + 1 <= t->batch - 1 && t->base[lo + 1] <= task) lo++;
    int64_t r = task - t->base[lo];
    *b = lo;
    *h = r / t->nblk[lo];
    *blk = r % t->nblk[lo];
}

#endif
