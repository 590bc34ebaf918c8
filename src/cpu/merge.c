/* merge.c - fattn_merge on a CPU context: the attention over disjoint key
 * ranges from each range's (O, LSE), row by row (include/fattn.h).
 *
 * Each row is computed alone, in double, parts in index order, so the result
 * does not depend on how rows are spread over threads.  Parts whose LSE is
 * -inf for a row are skipped before anything is read of their O: a weight of
 * 0 times a garbage (NaN) O would otherwise poison the row.  These are the
 * rules of the CUDA engine's combines (src/cuda/common/lse_combine.cuh, form
 * (a): -inf parts skipped, a NaN lse a NaN row, no part o = 0 and lse -inf);
 * the arithmetic stays double where the device rounds the weights and the
 * sum of O to f32, since this is the reference that engine is checked
 * against (docs/design.md, section 3). */
#include <math.h>
#include <stdint.h>

#include "common/half.h"
#include "cpu/threads.h"
#include "internal.h"

/* Rows (tokens of one batch and head) per task; the chunk of head_dim
 * accumulated at once (a stack buffer, so any head_dim works). */
#define MERGE_ROWS_PER_TASK 64
#define MERGE_DIM_CHUNK 128

typedef struct merge_job {
    const fattn_merge_args *a;
    int64_t row_blocks; /* per (batch, head) */
} merge_job;

static int64_t row_offset(const fattn_tensor *t, int32_t b, int32_t s, int32_t h) {
    return (int64_t)b * t->stride_batch + (int64_t)s * t->stride_seq + (int64_t)h * t->stride_head;
}

/* acc[i] += w * x[i], x the n elements of t at `off` (f32, f16 or bf16). */
static void accumulate(double *acc, double w, const fattn_tensor *t, int64_t off, int32_t n) {
    switch (t->dtype) {
    case FATTN_DTYPE_F32: {
        const float *p = (const float *)t->data + off;
        for (int32_t i = 0; i < n; i++) acc[i] += w * (double)p[i];
        break;
    }
    case FATTN_DTYPE_F16: {
        const uint16_t *p = (const uint16_t *)t->data + off;
        for (int32_t i = 0; i < n; i++) acc[i] += w * (double)fattn_f16_to_f32(p[i]);
        break;
    }
    default: { /* BF16; api.c has rejected everything else */
        const uint16_t *p = (const uint16_t *)t->data + off;
        for (int32_t i = 0; i < n; i++) acc[i] += w * (double)fattn_bf16_to_f32(p[i]);
        break;
    }
    }
}

/* t's n elements at `off` = x[i] * scale, rounded once to f32, then to t's dtype. */
static void store(const fattn_tensor *t, int64_t off, const double *x, double scale, int32_t n) {
    switch (t->dtype) {
    case FATTN_DTYPE_F32: {
        float *p = (float *)t->data + off;
        for (int32_t i = 0; i < n; i++) p[i] = (float)(x[i] * scale);
        break;
    }
    case FATTN_DTYPE_F16: {
        uint16_t *p = (uint16_t *)t->data + off;
        for (int32_t i = 0; i < n; i++) p[i] = fattn_f32_to_f16((float)(x[i] * scale));
        break;
    }
    default: {
        uint16_t *p = (uint16_t *)t->data + off;
        for (int32_t i = 0; i < n; i++) p[i] = fattn_f32_to_bf16((float)(x[i] * scale));
        break;
    }
    }
}

static void merge_row(const fattn_merge_args *a, int32_t b, int32_t h, int32_t s) {
    const int64_t r = ((int64_t)b * a->heads + h) * a->seqlen + s; /* LSE index */
    const int64_t oo = row_offset(&a->o, b, s, h);
    double w[FATTN_MERGE_MAX_PARTS];
    int32_t live[FATTN_MERGE_MAX_PARTS], nlive = 0;

    /* m over the participating parts; a NaN lse participates (and never
     * wins the comparison), so its weight exp(NaN - m) is NaN. */
    double m = -INFINITY;
    for (int32_t i = 0; i < a->num_parts; i++) {
        const float l = a->parts[i].lse[r];
        if (l == -INFINITY) continue;
        live[nlive++] = i;
        if ((double)l > m) m = (double)l;
    }
    if (nlive == 0) { /* no key in any part: fattn_fwd's empty row */
        const double zero[1] = {0.0};
        for (int32_t d = 0; d < a->head_dim; d++) store(&a->o, oo + d, zero, 0.0, 1);
        if (a->lse) a->lse[r] = -INFINITY;
        return;
    }
    double sum = 0.0;
    for (int32_t j = 0; j < nlive; j++) {
        w[j] = exp((double)a->parts[live[j]].lse[r] - m);
        sum += w[j];
    }
    const double inv = 1.0 / sum;

    double acc[MERGE_DIM_CHUNK];
    for (int32_t d0 = 0; d0 < a->head_dim; d0 += MERGE_DIM_CHUNK) {
        const int32_t n = a->head_dim - d0 < MERGE_DIM_CHUNK ? a->head_dim - d0 : MERGE_DIM_CHUNK;
        for (int32_t i = 0; i < n; i++) acc[i] = 0.0;
        for (int32_t j = 0; j < nlive; j++) {
            const fattn_tensor *t = &a->parts[live[j]].o;
            accumulate(acc, w[j], t, row_offset(t, b, s, h) + d0, n);
        }
        store(&a->o, oo + d0, acc, inv, n);
    }
    if (a->lse) a->lse[r] = (float)(m + log(sum));
}

static void merge_task(void *arg, int64_t task, int worker) {
    (void)worker;
    const merge_job *j = (const merge_job *)arg;
    const fattn_merge_args *a = j->a;
    const int64_t bh = task / j->row_blocks;
    const int32_t b = (int32_t)(bh / a->heads), h = (int32_t)(bh % a->heads);
    const int64_t s0 = (task % j->row_blocks) * MERGE_ROWS_PER_TASK;
    const int64_t s1 = s0 + MERGE_ROWS_PER_TASK < a->seqlen ? s0 + MERGE_ROWS_PER_TASK : a->seqlen;
    for (int64_t s = s0; s < s1; s++) merge_row(a, b, h, (int32_t)s);
}

fattn_status fattn_cpu_merge(fattn_ctx *ctx, const fattn_merge_args *a) {
    merge_job j;
    j.a = a;
    j.row_blocks = ((int64_t)a->seqlen + MERGE_ROWS_PER_TASK - 1) / MERGE_ROWS_PER_TASK;
    const int64_t ntasks = (int64_t)a->batch * a->heads * j.row_blocks;
    int nthreads = fattn_cpu_thread_count(ctx->threads);
    if ((int64_t)nthreads > ntasks) nthreads = (int)ntasks;
    fattn_parallel_for(nthreads, ntasks, merge_task, &j);
    return FATTN_OK;
}
