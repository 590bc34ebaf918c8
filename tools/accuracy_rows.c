/* accuracy_rows.c - the rows of `fattn accuracy` (accuracy.h): each puts
 * the same f32 inputs through one path of the library (16-bit inputs, or
 * e4m3 from fattn_quantize at one granularity) and measures the RMSE of the
 * output against the FP64 reference. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accuracy.h"
#include "common/half.h"
#include "tool.h"

static const row_spec ROW_TABLE[] = {
    {"fp16-f32", "Q,K,V rounded to fp16; f32 accumulation and output", ROW_F32, FATTN_DTYPE_F16,
     FATTN_QUANT_BLOCK, 0, 0},
    {"bf16", "fattn_fwd bf16 in, bf16 out", ROW_16BIT, FATTN_DTYPE_BF16, FATTN_QUANT_BLOCK, 0, 0},
    {"fp16", "fattn_fwd f16 in, f16 out", ROW_16BIT, FATTN_DTYPE_F16, FATTN_QUANT_BLOCK, 0, 0},
    {"fp8-tensor", "e4m3, one scale per tensor", ROW_FP8, FATTN_DTYPE_E4M3, FATTN_QUANT_TENSOR, 0, 0},
    {"fp8-block", "e4m3, one scale per block of rows", ROW_FP8, FATTN_DTYPE_E4M3, FATTN_QUANT_BLOCK, 0, 0},
    {"fp8-block-had", "e4m3, block scales, Hadamard on Q,K", ROW_FP8, FATTN_DTYPE_E4M3,
     FATTN_QUANT_BLOCK, 0, 1},
    {"fp8-token-had", "e4m3, Q,K per token, V per block, Hadamard", ROW_FP8, FATTN_DTYPE_E4M3,
     FATTN_QUANT_BLOCK, 1, 1},
    {"fp8-tensor-had", "e4m3, one scale per tensor, Hadamard on Q,K", ROW_FP8, FATTN_DTYPE_E4M3,
     FATTN_QUANT_TENSOR, 0, 1},
};
_Static_assert(sizeof ROW_TABLE / sizeof ROW_TABLE[0] == NROWS, "NROWS counts the rows");
const row_spec *const ROWS = ROW_TABLE;

static void to_dtype(const float *src, void *dst, fattn_dtype dt, size_t n) {
    for (size_t i = 0; i < n; i++) {
        switch (dt) {
        case FATTN_DTYPE_F16: ((uint16_t *)dst)[i] = fattn_f32_to_f16(src[i]); break;
        case FATTN_DTYPE_BF16: ((uint16_t *)dst)[i] = fattn_f32_to_bf16(src[i]); break;
        default: ((float *)dst)[i] = src[i]; break;
        }
    }
}

static void to_f32(const void *src, fattn_dtype dt, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = (float)tool_load(src, dt, i);
}

static double rmse_f32(const acc_run *r, const float *o) {
    double e = 0;
    for (size_t i = 0; i < r->nel; i++) {
        double t = (double)o[i] - r->ref[i];
        e += t * t;
    }
    return sqrt(e / (double)r->nel);
}

static fattn_problem problem_of(const acc_run *r) {
    fattn_problem p;
    memset(&p, 0, sizeof p);
    p.batch = r->batch;
    p.seqlen_q = p.seqlen_k = r->n;
    p.heads_q = p.heads_kv = r->heads;
    p.head_dim = p.head_dim_v = r->d;
    return p;
}

static size_t nscales(const acc_run *r, int32_t block) {
    return (size_t)r->batch * (size_t)r->heads * (((size_t)r->n + (size_t)block - 1) / (size_t)block);
}

static fattn_ctx *cpu_ctx(acc_run *r) {
    if (!r->cpu) r->cpu = tool_ctx(r->cmd, FATTN_BACKEND_CPU, r->threads);
    return r->cpu;
}

static int fwd_ok(fattn_ctx *ctx, const fattn_fwd_args *a, row_result *res, const char *what) {
    fattn_status st = fattn_fwd(ctx, a);
    if (st == FATTN_OK) return 1;
    snprintf(res->error, sizeof res->error, "fattn_fwd (%s): %s: %s", what, fattn_status_string(st),
             fattn_last_error(ctx));
    return 0;
}

/* fp16-f32: the f16-rounded inputs through the f32 path of a CPU context. */
static void row_f32(acc_run *r, const row_spec *sp, row_result *res) {
    fattn_ctx *ctx = cpu_ctx(r);
    res->engine = "cpu";
    res->in_dtype = res->out_dtype = FATTN_DTYPE_F32;
    float *buf = malloc(sizeof(float) * r->nel * 3);
    if (!buf) tool_die(r->cmd, "out of memory");
    for (int t = 0; t < 3; t++)
        for (size_t i = 0; i < r->nel; i++)
            buf[t * r->nel + i] = sp->dtype == FATTN_DTYPE_BF16
                                      ? fattn_bf16_to_f32(fattn_f32_to_bf16(r->x[t][i]))
                                      : fattn_f16_to_f32(fattn_f32_to_f16(r->x[t][i]));
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = problem_of(r);
    a.q = fattn_tensor_bshd(buf, FATTN_DTYPE_F32);
    a.k = fattn_tensor_bshd(buf + r->nel, FATTN_DTYPE_F32);
    a.v = fattn_tensor_bshd(buf + 2 * r->nel, FATTN_DTYPE_F32);
    a.o = fattn_tensor_bshd(r->o_host, FATTN_DTYPE_F32);
    if (fwd_ok(ctx, &a, res, "f32")) res->rmse = rmse_f32(r, r->o_host);
    free(buf);
}

/* bf16 / fp16: inputs rounded to the dtype, fattn_fwd on the engine. */
static void row_16bit(acc_run *r, const row_spec *sp, row_result *res) {
    const fattn_dtype dt = sp->dtype;
    const size_t bytes = r->nel * 2;
    res->engine = r->gpu ? "cuda" : "cpu";
    res->in_dtype = res->out_dtype = dt;
    for (int t = 0; t < 3; t++) {
        to_dtype(r->x[t], r->tmp_host, dt, r->nel);
        tool_upload(r->cmd, r->ctx, r->x16_dev[t], r->tmp_host, bytes);
    }
    tool_poison(r->cmd, r->ctx, r->x16_dev[3], bytes);
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = problem_of(r);
    a.q = fattn_tensor_bshd(r->x16_dev[0], dt);
    a.k = fattn_tensor_bshd(r->x16_dev[1], dt);
    a.v = fattn_tensor_bshd(r->x16_dev[2], dt);
    a.o = fattn_tensor_bshd(r->x16_dev[3], dt);
    if (!fwd_ok(r->ctx, &a, res, fattn_dtype_name(dt))) return;
    tool_download(r->cmd, r->ctx, r->tmp_host, r->x16_dev[3], bytes);
    to_f32(r->tmp_host, dt, r->o_host, r->nel);
    res->rmse = rmse_f32(r, r->o_host);
}

/* Tensor t (0 q, 1 k, 2 v) to e4m3 into codes_dev[t] / scales_dev[t] with
 * fattn_quantize on the engine, or, where the CUDA engine answers
 * UNSUPPORTED, on a CPU context and copied.  Returns 0 (cpu), 1 (engine) or
 * -1 (failed, res->error set). */
static int quantize_one(acc_run *r, const row_spec *sp, row_result *res, int t, int32_t block) {
    fattn_quantize_args q;
    memset(&q, 0, sizeof q);
    q.in = fattn_tensor_bshd(r->src_dev[t], r->fp8_from);
    q.out = fattn_tensor_bshd(r->codes_dev[t], FATTN_DTYPE_E4M3);
    q.out.scale = r->scales_dev[t];
    q.out.scale_block = block;
    q.batch = r->batch; q.seqlen = r->n; q.heads = r->heads; q.head_dim = r->d;
    q.granularity = sp->g;
    q.block_rows = block;
    q.rotate = sp->rotate && t < 2; /* V is never rotated */
    q.seed = r->seed;
    fattn_status st = fattn_quantize(r->ctx, &q);
    if (st == FATTN_OK) return 1;
    if (!(r->gpu && st == FATTN_ERROR_UNSUPPORTED)) {
        snprintf(res->error, sizeof res->error, "fattn_quantize (%c): %s: %s", "qkv"[t],
                 fattn_status_string(st), fattn_last_error(r->ctx));
        return -1;
    }
    if (!r->quant_note[0])
        snprintf(r->quant_note, sizeof r->quant_note, "%s", fattn_last_error(r->ctx));
    fattn_ctx *cpu = cpu_ctx(r);
    if (!r->fb_codes) {
        r->fb_codes = malloc(r->nel);
        r->fb_scales = malloc(sizeof(float) * r->nsc_max);
        if (!r->fb_codes || !r->fb_scales) tool_die(r->cmd, "out of memory");
    }
    q.in.data = r->src_host[t];
    q.out.data = r->fb_codes;
    q.out.scale = r->fb_scales;
    st = fattn_quantize(cpu, &q);
    if (st != FATTN_OK) {
        snprintf(res->error, sizeof res->error, "fattn_quantize (%c, CPU fallback): %s: %s", "qkv"[t],
                 fattn_status_string(st), fattn_last_error(cpu));
        return -1;
    }
    tool_upload(r->cmd, r->ctx, r->codes_dev[t], r->fb_codes, r->nel);
    tool_upload(r->cmd, r->ctx, r->scales_dev[t], r->fb_scales, sizeof(float) * nscales(r, block));
    return 0;
}

/* e4m3 rows: quantise q, k, v, then fattn_fwd on the codes and scales. */
static void row_fp8(acc_run *r, const row_spec *sp, row_result *res) {
    const int32_t blk[3] = {sp->token ? 1 : r->block, sp->token ? 1 : r->kv_block, r->kv_block};
    res->engine = r->gpu ? "cuda" : "cpu";
    res->in_dtype = FATTN_DTYPE_E4M3;
    res->out_dtype = r->fp8_out;
    res->bq = blk[0]; res->bk = blk[1]; res->bv = blk[2];
    int on_engine = 0;
    for (int t = 0; t < 3; t++) {
        int w = quantize_one(r, sp, res, t, blk[t]);
        if (w < 0) return;
        on_engine += w;
    }
    res->quant_on = on_engine == 3 ? res->engine : on_engine == 0 ? "cpu" : "mixed";
    const size_t obytes = r->nel * fattn_dtype_size(r->fp8_out);
    tool_poison(r->cmd, r->ctx, r->o_dev, obytes);
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = problem_of(r);
    fattn_tensor *ts[3] = {&a.q, &a.k, &a.v};
    for (int t = 0; t < 3; t++) {
        *ts[t] = fattn_tensor_bshd(r->codes_dev[t], FATTN_DTYPE_E4M3);
        ts[t]->scale = r->scales_dev[t];
        ts[t]->scale_block = blk[t];
    }
    a.o = fattn_tensor_bshd(r->o_dev, r->fp8_out);
    if (!fwd_ok(r->ctx, &a, res, "e4m3")) return;
    tool_download(r->cmd, r->ctx, r->tmp_host, r->o_dev, obytes);
    to_f32(r->tmp_host, r->fp8_out, r->o_host, r->nel);
    res->rmse = rmse_f32(r, r->o_host);
}

void acc_alloc_buffers(acc_run *r, const int *sel) {
    const char *cmd = r->cmd;
    fattn_ctx *ctx = r->ctx;
    const size_t nel = r->nel;
    r->nsc_max = nscales(r, 1);
    int any16 = 0, any8 = 0;
    for (int i = 0; i < NROWS; i++) {
        any16 |= sel[i] && ROWS[i].kind == ROW_16BIT;
        any8 |= sel[i] && ROWS[i].kind == ROW_FP8;
    }
    r->tmp_host = malloc(4 * nel);
    r->o_host = malloc(sizeof(float) * nel);
    if (!r->tmp_host || !r->o_host) tool_die(cmd, "out of memory");
    if (any16)
        for (int t = 0; t < 4; t++) r->x16_dev[t] = tool_alloc(cmd, ctx, 2 * nel);
    if (any8) {
        const size_t es = fattn_dtype_size(r->fp8_from);
        for (int t = 0; t < 3; t++) {
            if (r->fp8_from == FATTN_DTYPE_F32) {
                r->src_host[t] = (void *)r->x[t];
            } else {
                if (!(r->src_host[t] = malloc(es * nel))) tool_die(cmd, "out of memory");
                to_dtype(r->x[t], r->src_host[t], r->fp8_from, nel);
            }
            if (r->gpu) {
                r->src_dev[t] = tool_alloc(cmd, ctx, es * nel);
                tool_upload(cmd, ctx, r->src_dev[t], r->src_host[t], es * nel);
            } else {
                r->src_dev[t] = r->src_host[t];
            }
            r->codes_dev[t] = tool_alloc(cmd, ctx, nel);
            r->scales_dev[t] = tool_alloc(cmd, ctx, sizeof(float) * r->nsc_max);
        }
        r->o_dev = tool_alloc(cmd, ctx, 4 * nel);
    }
}

void acc_free_buffers(acc_run *r) {
    fattn_ctx *ctx = r->ctx;
    for (int t = 0; t < 4; t++) tool_free(ctx, r->x16_dev[t]);
    for (int t = 0; t < 3; t++) {
        if (r->gpu) tool_free(ctx, r->src_dev[t]);
        if (r->src_host[t] != r->x[t]) free(r->src_host[t]);
        tool_free(ctx, r->codes_dev[t]);
        tool_free(ctx, r->scales_dev[t]);
    }
    tool_free(ctx, r->o_dev);
    free(r->tmp_host); free(r->o_host); free(r->fb_codes); free(r->fb_scales);
    if (r->cpu && r->cpu != ctx) fattn_ctx_free(r->cpu);
}

void acc_run_row(acc_run *r, int i, row_result *res) {
    switch (ROWS[i].kind) {
    case ROW_F32: row_f32(r, &ROWS[i], res); break;
    case ROW_16BIT: row_16bit(r, &ROWS[i], res); break;
    case ROW_FP8: row_fp8(r, &ROWS[i], res); break;
    }
}
