/* quantize.c - fattn_quantize on a CPU context: f32/f16/bf16 -> e4m3 with one
 * scale per block of rows of each (batch, head), or one per tensor, after the
 * optional incoherent-processing rotation (hadamard.c).
 *
 * scale = max(amax / 448, FLT_MIN) of the (rotated) block, 1 for an
 * all-zero block, and
 * code = fattn_f32_to_e4m3(x / scale): the division, not a multiplication by
 * a rounded reciprocal, so that the CUDA quantiser can reproduce it exactly.
 * Work is split over (batch, head) pairs on the engine's worker pool
 * (threads.c), ctx->threads workers at most. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "internal.h"
#include "common/fp8.h"
#include "common/half.h"
#include "cpu/threads.h"

typedef struct quant_job {
    const fattn_quantize_args *a;
    const float *signs;   /* head_dim signs, or NULL without rotation */
    int64_t nblocks;      /* per (batch, head) */
    float tensor_scale;   /* phase 2 of FATTN_QUANT_TENSOR */
    int phase;            /* 0: per-unit amax only, 1: quantise */
    float *unit_amax;     /* [batch * heads], phase 0 */
    int nthreads;
    float *bufs;          /* nthreads rows of head_dim floats */
} quant_job;

/* Row s of (b, h) as f32 (rotated when asked) into buf[0..d). */
static void load_row(const fattn_quantize_args *a, const float *signs, int32_t b, int32_t s,
                     int32_t h, float *buf) {
    const int64_t off = (int64_t)b * a->in.stride_batch + (int64_t)s * a->in.stride_seq +
                        (int64_t)h * a->in.stride_head;
    const int32_t d = a->head_dim;
    switch (a->in.dtype) {
    case FATTN_DTYPE_F32: {
        const float *p = (const float *)a->in.data + off;
        for (int32_t i = 0; i < d; i++) buf[i] = p[i];
        break;
    }
    case FATTN_DTYPE_F16: {
        const uint16_t *p = (const uint16_t *)a->in.data + off;
        for (int32_t i = 0; i < d; i++) buf[i] = fattn_f16_to_f32(p[i]);
        break;
    }
    default: { /* BF16; api.c has rejected everything else */
        const uint16_t *p = (const uint16_t *)a->in.data + off;
        for (int32_t i = 0; i < d; i++) buf[i] = fattn_bf16_to_f32(p[i]);
        break;
    }
    }
    if (signs) fattn_rotate_row(buf, signs, d);
}

static float row_amax(const float *x, int32_t d) {
    float m = 0.0f;
    for (int32_t i = 0; i < d; i++) m = fmaxf(m, fabsf(x[i])); /* fmaxf skips NaN */
    return m;
}

/* amax / 448, floored at FLT_MIN: below amax ~ 3.1e-43 the quotient rounds to
 * 0 (every 0 would code NaN, 0 / 0), and a subnormal scale has no reciprocal
 * in f32 for the attention kernels to fold in (issue 43). */
static float scale_of(float amax) { return amax > 0.0f ? fattn_e4m3_scale(amax) : 1.0f; }

static void store_row(const fattn_quantize_args *a, int32_t b, int32_t s, int32_t h,
                      const float *buf, float scale) {
    const int64_t off = (int64_t)b * a->out.stride_batch + (int64_t)s * a->out.stride_seq +
                        (int64_t)h * a->out.stride_head;
    uint8_t *p = (uint8_t *)a->out.data + off;
    for (int32_t i = 0; i < a->head_dim; i++) p[i] = fattn_f32_to_e4m3(buf[i] / scale);
}

/* One (batch, head) pair. */
static void quantize_unit(quant_job *job, int64_t unit, float *buf) {
    const fattn_quantize_args *a = job->a;
    const int32_t b = (int32_t)(unit / a->heads), h = (int32_t)(unit % a->heads);
    const int32_t d = a->head_dim, br = a->block_rows;

    if (job->phase == 0) { /* per-tensor amax, first pass */
        float m = 0.0f;
        for (int32_t s = 0; s < a->seqlen; s++) {
            load_row(a, job->signs, b, s, h, buf);
            m = fmaxf(m, row_amax(buf, d));
        }
        job->unit_amax[unit] = m;
        return;
    }
    float *scales = a->out.scale + unit * job->nblocks;
    for (int64_t blk = 0; blk < job->nblocks; blk++) {
        const int32_t r0 = (int32_t)(blk * br);
        const int32_t r1 = (int32_t)((int64_t)r0 + br < a->seqlen ? r0 + br : a->seqlen);
        float scale;
        if (a->granularity == FATTN_QUANT_TENSOR) {
            scale = job->tensor_scale;
        } else {
            /* Two passes over the block (the second reloads and re-rotates
             * each row) keep memory at one row however large block_rows is. */
            float m = 0.0f;
            for (int32_t s = r0; s < r1; s++) {
                load_row(a, job->signs, b, s, h, buf);
                m = fmaxf(m, row_amax(buf, d));
            }
            scale = scale_of(m);
        }
        scales[blk] = scale;
        for (int32_t s = r0; s < r1; s++) {
            load_row(a, job->signs, b, s, h, buf);
            store_row(a, b, s, h, buf, scale);
        }
    }
}

static void quant_task(void *arg, int64_t unit, int worker) {
    quant_job *job = (quant_job *)arg;
    quantize_unit(job, unit, job->bufs + (size_t)worker * (size_t)job->a->head_dim);
}

/* Every (batch, head) unit on the engine's worker pool (threads.c). */
static void run_job(quant_job *job) {
    const int64_t units = (int64_t)job->a->batch * job->a->heads;
    fattn_parallel_for(job->nthreads, units, quant_task, job);
}

fattn_status fattn_cpu_quantize(fattn_ctx *ctx, const fattn_quantize_args *a) {
    const int32_t d = a->head_dim;
    if (a->rotate && !fattn_is_pow2(d))
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "fattn_quantize: rotate needs a power-of-two head_dim, got %d", (int)d);

    quant_job job = {0};
    job.a = a;
    job.nblocks = ((int64_t)a->seqlen + a->block_rows - 1) / a->block_rows;
    const int64_t units = (int64_t)a->batch * a->heads;

    float *signs = NULL;
    if (a->rotate) {
        signs = (float *)malloc(sizeof(float) * (size_t)d);
        if (!signs) return fattn_fail(ctx, FATTN_ERROR_OUT_OF_MEMORY, "fattn_quantize: out of memory");
        fattn_rotation_signs(a->seed, d, signs);
        job.signs = signs;
    }

    int nt = fattn_cpu_thread_count(ctx->threads);
    if ((int64_t)nt > units) nt = (int)units;
    /* Threads cost tens of microseconds each: not worth it for small tensors. */
    if (units * a->seqlen * (int64_t)d < (1 << 16)) nt = 1;
    job.nthreads = nt;

    /* Everything is allocated before any output is written. */
    job.bufs = (float *)malloc(sizeof(float) * (size_t)d * (size_t)nt);
    if (a->granularity == FATTN_QUANT_TENSOR)
        job.unit_amax = (float *)malloc(sizeof(float) * (size_t)units);
    if (!job.bufs || (a->granularity == FATTN_QUANT_TENSOR && !job.unit_amax)) {
        free(job.bufs);
        free(job.unit_amax);
        free(signs);
        return fattn_fail(ctx, FATTN_ERROR_OUT_OF_MEMORY, "fattn_quantize: out of memory");
    }
    if (a->granularity == FATTN_QUANT_TENSOR) {
        job.phase = 0;
        run_job(&job);
        float m = 0.0f;
        for (int64_t u = 0; u < units; u++) m = fmaxf(m, job.unit_amax[u]);
        job.tensor_scale = scale_of(m);
    }
    job.phase = 1;
    run_job(&job);
    free(job.bufs);
    free(job.unit_amax);
    free(signs);
    return FATTN_OK;
}
