/* kv_append.c - fattn_kv_append on a CPU context (include/fattn.h): the
 * entries of cache_seqlens and block_table are checked on the host, then the
 * new rows are copied, byte for byte, into the contiguous cache or the page
 * pools.  Nothing is written until every entry has passed, so a refused call
 * leaves the caches as they were.
 *
 * Every (sequence, new row, head) is one memcpy of head_dim elements; an
 * append larger than KV_APPEND_TASK_BYTES is spread over the context's
 * threads in tasks of whole new rows (each task writes rows no other task
 * writes: the check below refuses a cache row written twice), a decoding
 * step (a few KB) stays on the calling thread.
 *
 * FP8 caches quantise instead of copying: each (sequence, kv head) is one
 * task, its new rows walked in runs that stay inside one scale block; a run
 * that starts its block sets the block's scale from its amax, others keep
 * the stored scale (fattn.h).  The stored scales a call reads are checked
 * before anything is written. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/fp8.h"
#include "cpu/load.h"
#include "cpu/threads.h"
#include "internal.h"

#define KV_APPEND_TASK_BYTES ((int64_t)1 << 20)
/* api.c's head_dim limit (FATTN_KV_APPEND_MAX_HEAD_DIM): one row of floats on the stack */
#define FATTN_KV_APPEND_MAX_ROW 512

/* ---- the entries --------------------------------------------------------------- */

/* The rows [lo, hi) of `page` that sequence b writes through its table
 * entry `slot`. */
typedef struct page_run {
    int32_t page, lo, hi, b;
    int64_t slot;
} page_run;

static int run_cmp(const void *x, const void *y) {
    const page_run *a = (const page_run *)x, *b = (const page_run *)y;
    if (a->page != b->page) return a->page < b->page ? -1 : 1;
    if (a->lo != b->lo) return a->lo < b->lo ? -1 : 1;
    if (a->b != b->b) return a->b < b->b ? -1 : 1;
    return a->slot < b->slot ? -1 : a->slot > b->slot;
}

/* No cache row of the pools written twice: the runs of rows each sequence
 * writes per page, sorted by page and first row; runs of one page must not
 * overlap.  (A contiguous cache gives each sequence its own rows.) */
static fattn_status check_no_row_twice(fattn_ctx *ctx, const fattn_kv_append_args *a) {
    const int64_t ps = a->page_size, n = a->seqlen_new;
    int64_t nruns = 0;
    for (int32_t b = 0; b < a->batch; b++) {
        const int64_t pos = a->cache_seqlens[b];
        nruns += (pos + n - 1) / ps - pos / ps + 1;
    }
    page_run *runs = (page_run *)malloc((size_t)nruns * sizeof *runs);
    if (!runs)
        return fattn_fail(ctx, FATTN_ERROR_OUT_OF_MEMORY,
                          "fattn_kv_append: cannot allocate %lld page runs for the check that no "
                          "cache row is written twice",
                          (long long)nruns);
    int64_t k = 0;
    for (int32_t b = 0; b < a->batch; b++) {
        const int64_t pos = a->cache_seqlens[b], end = pos + n;
        const int32_t *row = a->block_table + (int64_t)b * a->max_pages_per_seq;
        for (int64_t i = pos / ps; i * ps < end; i++, k++) {
            const int64_t lo = i * ps > pos ? i * ps : pos, hi = (i + 1) * ps < end ? (i + 1) * ps : end;
            runs[k].page = row[i];
            runs[k].lo = (int32_t)(lo - i * ps);
            runs[k].hi = (int32_t)(hi - i * ps);
            runs[k].b = b;
            runs[k].slot = i;
        }
    }
    qsort(runs, (size_t)nruns, sizeof *runs, run_cmp);
    fattn_status st = FATTN_OK;
    int64_t top = 0; /* the run of the current page that reaches furthest */
    for (int64_t i = 1; i < nruns && st == FATTN_OK; i++) {
        if (runs[i].page != runs[top].page) {
            top = i;
            continue;
        }
        if (runs[i].lo < runs[top].hi)
            st = fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                            "row %d of page %d would be written twice: by sequence %d "
                            "(block_table[%d][%lld]) and sequence %d (block_table[%d][%lld]); "
                            "one call must not write a cache row twice (copy a shared page "
                            "before appending to it)",
                            (int)runs[i].lo, (int)runs[i].page, (int)runs[top].b, (int)runs[top].b,
                            (long long)runs[top].slot, (int)runs[i].b, (int)runs[i].b,
                            (long long)runs[i].slot);
        if (runs[i].hi > runs[top].hi) top = i;
    }
    free(runs);
    return st;
}

/* cache_seqlens[b] >= 0 and its new rows inside the cache; with a table,
 * the entries of the pages they land in inside [0, num_pages). */
static fattn_status check_entries(fattn_ctx *ctx, const fattn_kv_append_args *a) {
    const int64_t n = a->seqlen_new;
    const int64_t rows = a->block_table ? (int64_t)a->max_pages_per_seq * a->page_size : a->capacity;
    for (int32_t b = 0; b < a->batch; b++) {
        const int64_t pos = a->cache_seqlens[b];
        if (pos < 0)
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "cache_seqlens[%d] is %d, must be >= 0",
                              (int)b, (int)pos);
        if (pos + n > rows) {
            if (a->block_table)
                return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                                  "cache_seqlens[%d] is %d: its %d new rows would end at row %lld, "
                                  "past max_pages_per_seq * page_size = %d * %d = %lld",
                                  (int)b, (int)pos, (int)n, (long long)(pos + n), (int)a->max_pages_per_seq,
                                  (int)a->page_size, (long long)rows);
            return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                              "cache_seqlens[%d] is %d: its %d new rows would end at row %lld, past "
                              "capacity %d",
                              (int)b, (int)pos, (int)n, (long long)(pos + n), (int)a->capacity);
        }
        if (!a->block_table) continue;
        const int64_t first = pos / a->page_size, last = (pos + n - 1) / a->page_size;
        const int32_t *row = a->block_table + (int64_t)b * a->max_pages_per_seq;
        for (int64_t i = first; i <= last; i++)
            if (row[i] < 0 || row[i] >= a->num_pages)
                return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                                  "block_table[%d][%lld] is %d, outside [0, num_pages %d) (sequence "
                                  "%d appends rows %lld..%lld: pages %lld..%lld of its row)",
                                  (int)b, (long long)i, (int)row[i], (int)a->num_pages, (int)b,
                                  (long long)pos, (long long)(pos + n - 1), (long long)first,
                                  (long long)last);
    }
    return a->block_table ? check_no_row_twice(ctx, a) : FATTN_OK;
}

/* ---- the copy ------------------------------------------------------------------- */

typedef struct append_job {
    const fattn_kv_append_args *a;
    int64_t rows_per_task; /* new rows (sequence, t) per task */
    size_t row_bytes;      /* head_dim elements */
} append_job;

static void append_task(void *arg, int64_t task, int worker) {
    (void)worker;
    const append_job *j = (const append_job *)arg;
    const fattn_kv_append_args *a = j->a;
    const size_t es = fattn_dtype_size(a->k_new.dtype);
    const int64_t total = (int64_t)a->batch * a->seqlen_new;
    const int64_t r0 = task * j->rows_per_task;
    const int64_t r1 = r0 + j->rows_per_task < total ? r0 + j->rows_per_task : total;
    for (int64_t r = r0; r < r1; r++) {
        const int32_t b = (int32_t)(r / a->seqlen_new), t = (int32_t)(r % a->seqlen_new);
        const int64_t pos = (int64_t)a->cache_seqlens[b] + t;
        int64_t db = b, ds = pos; /* destination (batch entry or page, row) */
        if (a->block_table) {
            db = a->block_table[(int64_t)b * a->max_pages_per_seq + pos / a->page_size];
            ds = pos % a->page_size;
        }
        const int64_t kn = (int64_t)b * a->k_new.stride_batch + (int64_t)t * a->k_new.stride_seq;
        const int64_t vn = (int64_t)b * a->v_new.stride_batch + (int64_t)t * a->v_new.stride_seq;
        const int64_t kc = db * a->k_cache.stride_batch + ds * a->k_cache.stride_seq;
        const int64_t vc = db * a->v_cache.stride_batch + ds * a->v_cache.stride_seq;
        for (int32_t h = 0; h < a->heads_kv; h++) {
            memcpy((char *)a->k_cache.data + (size_t)(kc + (int64_t)h * a->k_cache.stride_head) * es,
                   (const char *)a->k_new.data + (size_t)(kn + (int64_t)h * a->k_new.stride_head) * es,
                   j->row_bytes);
            memcpy((char *)a->v_cache.data + (size_t)(vc + (int64_t)h * a->v_cache.stride_head) * es,
                   (const char *)a->v_new.data + (size_t)(vn + (int64_t)h * a->v_new.stride_head) * es,
                   j->row_bytes);
        }
    }
}

/* ---- FP8 caches: quantised rows (fattn.h, fattn_kv_append_args) ---------------- */

/* Cache row `pos` of sequence b: batch entry or page *e, row *r in it. */
static inline void cache_loc(const fattn_kv_append_args *a, int32_t b, int64_t pos, int64_t *e, int64_t *r) {
    if (!a->block_table) {
        *e = b;
        *r = pos;
        return;
    }
    *e = a->block_table[(int64_t)b * a->max_pages_per_seq + pos / a->page_size];
    *r = pos % a->page_size;
}

/* One run of sequence b's new rows t0 .. *t1 - 1 inside one scale block of
 * cache c (its entry, the block's scale index, and whether the run starts
 * at the block's first row). */
typedef struct scale_run {
    int64_t t1, scale_idx;
    int first;
} scale_run;

static scale_run next_run(const fattn_kv_append_args *a, const fattn_tensor *c, int32_t b, int32_t h,
                          int64_t t0) {
    const int64_t sb = c->scale_block, rows = a->block_table ? a->page_size : a->capacity;
    const int64_t nblocks = (rows + sb - 1) / sb, pos0 = (int64_t)a->cache_seqlens[b];
    int64_t e, r, e2, r2;
    cache_loc(a, b, pos0 + t0, &e, &r);
    scale_run run;
    run.first = r % sb == 0;
    run.scale_idx = (e * a->heads_kv + h) * nblocks + r / sb;
    run.t1 = t0 + 1;
    while (run.t1 < a->seqlen_new) {
        cache_loc(a, b, pos0 + run.t1, &e2, &r2);
        if (e2 != e || r2 / sb != r / sb) break;
        run.t1++;
    }
    return run;
}

/* The stored scale of every block a run appends to without starting it is
 * read: > 0 (fattn_tensor's rule), checked before anything is written. */
static fattn_status check_stored_scales(fattn_ctx *ctx, const fattn_kv_append_args *a) {
    const fattn_tensor *c[2] = {&a->k_cache, &a->v_cache};
    const char *name[2] = {"k_cache.scale", "v_cache.scale"};
    for (int i = 0; i < 2; i++)
        for (int32_t b = 0; b < a->batch; b++)
            for (int32_t h = 0; h < a->heads_kv; h++)
                for (int64_t t = 0; t < a->seqlen_new;) {
                    const scale_run run = next_run(a, c[i], b, h, t);
                    const float s = c[i]->scale[run.scale_idx];
                    if (!run.first && !(s > 0.0f))
                        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                                          "%s[%lld] = %g: sequence %d appends rows %lld..%lld of kv head %d "
                                          "to a scale block it does not start, whose stored scale must be "
                                          "> 0 (an earlier append's)",
                                          name[i], (long long)run.scale_idx, (double)s, (int)b,
                                          (long long)(a->cache_seqlens[b] + t),
                                          (long long)(a->cache_seqlens[b] + run.t1 - 1), (int)h);
                    t = run.t1;
                }
    return FATTN_OK;
}

/* Sequence b's new rows of head h quantised into cache c, run by run: a run
 * that starts its block sets the block's scale from its own amax, any other
 * keeps the stored one (fattn_quantize's scale and codes). */
static void quantise_head(const fattn_kv_append_args *a, const fattn_tensor *src, const fattn_tensor *c,
                          int32_t b, int32_t h) {
    float row[FATTN_KV_APPEND_MAX_ROW];
    const int d = a->head_dim;
    const int64_t pos0 = (int64_t)a->cache_seqlens[b];
    for (int64_t t0 = 0; t0 < a->seqlen_new;) {
        const scale_run run = next_run(a, c, b, h, t0);
        float scale = c->scale[run.scale_idx];
        if (run.first) {
            float m = 0.0f;
            for (int64_t t = t0; t < run.t1; t++) {
                fattn_load_row(src, b * src->stride_batch + t * src->stride_seq + h * src->stride_head, d, 1.0f,
                               NULL, row);
                for (int i = 0; i < d; i++) m = fmaxf(m, fabsf(row[i])); /* fmaxf skips NaN */
            }
            scale = m > 0.0f ? fattn_e4m3_scale(m) : 1.0f;
            c->scale[run.scale_idx] = scale;
        }
        for (int64_t t = t0; t < run.t1; t++) {
            int64_t e, r;
            cache_loc(a, b, pos0 + t, &e, &r);
            fattn_load_row(src, b * src->stride_batch + t * src->stride_seq + h * src->stride_head, d, 1.0f, NULL,
                           row);
            uint8_t *dst = (uint8_t *)c->data + e * c->stride_batch + r * c->stride_seq + h * c->stride_head;
            for (int i = 0; i < d; i++) dst[i] = fattn_f32_to_e4m3(row[i] / scale);
        }
        t0 = run.t1;
    }
}

/* One (sequence, kv head) unit: its K and V rows. */
static void quantise_task(void *arg, int64_t unit, int worker) {
    (void)worker;
    const fattn_kv_append_args *a = (const fattn_kv_append_args *)arg;
    const int32_t b = (int32_t)(unit / a->heads_kv), h = (int32_t)(unit % a->heads_kv);
    quantise_head(a, &a->k_new, &a->k_cache, b, h);
    quantise_head(a, &a->v_new, &a->v_cache, b, h);
}

fattn_status fattn_cpu_kv_append(fattn_ctx *ctx, const fattn_kv_append_args *a) {
    fattn_status st = check_entries(ctx, a);
    if (st != FATTN_OK) return st;
    if (a->k_cache.dtype == FATTN_DTYPE_E4M3) {
        if ((st = check_stored_scales(ctx, a)) != FATTN_OK) return st;
        const int64_t units = (int64_t)a->batch * a->heads_kv;
        const int64_t bytes = (int64_t)a->seqlen_new * a->head_dim * 2 * units;
        int nthreads = bytes < KV_APPEND_TASK_BYTES ? 1 : fattn_cpu_thread_count(ctx->threads);
        if ((int64_t)nthreads > units) nthreads = (int)units;
        if (nthreads <= 1)
            for (int64_t u = 0; u < units; u++) quantise_task((void *)a, u, 0);
        else
            fattn_parallel_for(nthreads, units, quantise_task, (void *)a);
        return FATTN_OK;
    }

    append_job j;
    j.a = a;
    j.row_bytes = fattn_dtype_size(a->k_new.dtype) * (size_t)a->head_dim;
    const int64_t bytes_per_row = 2 * (int64_t)j.row_bytes * a->heads_kv; /* K and V of one new row */
    j.rows_per_task = KV_APPEND_TASK_BYTES / bytes_per_row;
    if (j.rows_per_task < 1) j.rows_per_task = 1;
    const int64_t total = (int64_t)a->batch * a->seqlen_new;
    const int64_t ntasks = (total + j.rows_per_task - 1) / j.rows_per_task;
    if (ntasks == 1) {
        append_task(&j, 0, 0);
        return FATTN_OK;
    }
    int nthreads = fattn_cpu_thread_count(ctx->threads);
    if ((int64_t)nthreads > ntasks) nthreads = (int)ntasks;
    fattn_parallel_for(nthreads, ntasks, append_task, &j);
    return FATTN_OK;
}
