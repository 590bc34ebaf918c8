/* accuracy.h - what the files of `fattn accuracy` share: accuracy.c (the
 * command line, the output and --dump), accuracy_ref.c (the inputs and the
 * FP64 reference) and accuracy_rows.c (the protocol's rows on an engine). */
#ifndef FATTN_TOOLS_ACCURACY_H
#define FATTN_TOOLS_ACCURACY_H

#include <stddef.h>
#include <stdint.h>

#include "fattn.h"

typedef enum { ROW_F32, ROW_16BIT, ROW_FP8 } row_kind;

typedef struct row_spec {
    const char *name, *desc;
    row_kind kind;
    fattn_dtype dtype;         /* ROW_F32: the rounding; ROW_16BIT: in and out */
    fattn_quant_granularity g; /* ROW_FP8 */
    int token;                 /* ROW_FP8: Q and K one scale per token */
    int rotate;                /* ROW_FP8: Hadamard on Q and K */
} row_spec;

/* the rows, in output order; the indices of the two the summary divides:
 * fp8-tensor, fp8-block-had */
enum { NROWS = 8, ROW_BASE = 3, ROW_BLOCK_HAD = 5 };
extern const row_spec *const ROWS;

typedef struct row_result {
    int selected;
    const char *engine;   /* where fattn_fwd ran */
    const char *quant_on; /* where fattn_quantize ran: cpu, cuda, mixed, - */
    int32_t bq, bk, bv;   /* FP8 rows: rows per scale */
    fattn_dtype in_dtype, out_dtype;
    double rmse;          /* NAN: the row failed */
    double seconds;
    char error[400];
} row_result;

typedef struct acc_run {
    const char *cmd;
    fattn_ctx *ctx;      /* the engine */
    fattn_ctx *cpu;      /* a CPU context: ctx on the CPU engine, else made on first need */
    int gpu, threads;
    int32_t batch, n, heads, d, block, kv_block;
    uint64_t seed;
    size_t nel;          /* elements per tensor */
    size_t nsc_max;      /* scales per tensor at block 1 */
    const float *x[3];   /* q, k, v: the f32 inputs */
    const double *ref;
    fattn_dtype fp8_from, fp8_out;
    void *src_host[3];   /* x in fp8_from (x itself for f32) */
    void *src_dev[3];    /* the same where the engine computes */
    void *x16_dev[4];    /* 16-bit q, k, v, o */
    uint8_t *codes_dev[3];
    float *scales_dev[3];
    void *o_dev;         /* FP8 rows' output */
    void *tmp_host;      /* 4 * nel bytes */
    float *o_host;
    uint8_t *fb_codes;   /* CPU fallback of the quantisation */
    float *fb_scales;
    char quant_note[400];/* why the CUDA quantiser was not used */
} acc_run;

/* x[0..2] (q, k, v; n elements each): N(0,1) + N(0, 10^2) * Bernoulli(0.001)
 * (protocol) or N(0,1), from seed; the original f32 inputs of every row. */
void acc_fill_inputs(float *const x[3], size_t n, uint64_t seed, int protocol);
/* O = softmax(Q K^T / sqrt(d)) V in double from packed BSHD f32 q, k, v into
 * out (packed BSHD), on `threads` threads (at most 64). */
void acc_reference_fp64(const char *cmd, int32_t batch, int32_t n, int32_t heads, int32_t d,
                        const float *q, const float *k, const float *v, double *out, int threads);

/* The buffers of the rows sel[] picks (r's sizes, inputs and dtypes set):
 * host scratch, and where the engine computes (host memory on the CPU
 * engine).  acc_free_buffers releases them and the CPU context r->cpu made
 * on the way, not r->ctx nor r->x. */
void acc_alloc_buffers(acc_run *r, const int *sel);
void acc_free_buffers(acc_run *r);
/* Row i on r's engine into res (rmse NAN and res->error set on failure). */
void acc_run_row(acc_run *r, int i, row_result *res);

#endif
