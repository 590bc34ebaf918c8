/* accuracy.c - `fattn accuracy`: the FP8 accuracy protocol of FlashAttention-3
 * (DESIGN.md section 7) on the CPU or the CUDA engine.
 *
 * Entries of Q, K, V are N(0,1) plus, with probability 0.001, an extra
 * N(0, 100) term (standard deviation 10); --inputs gaussian drops the extra
 * term.  Every row runs on the same f32 inputs and is compared with one FP64
 * reference computed on the CPU from them; the figure is the RMSE over all
 * output elements.  Rows:
 *   fp16-f32         Q, K, V rounded to fp16, the f32 path (CPU engine only)
 *   bf16, fp16       fattn_fwd with 16-bit inputs and output
 *   fp8-tensor       e4m3, one scale per tensor (the paper's baseline)
 *   fp8-block        e4m3, one scale per --block rows of Q, K and V
 *   fp8-block-had    block scales after the Hadamard rotation of Q and K
 *   fp8-token-had    one scale per token of Q and K, V per block, rotation
 *   fp8-tensor-had   one scale per tensor after the rotation
 * Quantisation is fattn_quantize on the engine's context (when the CUDA
 * engine answers UNSUPPORTED, on a CPU context, the codes and scales then
 * copied to the GPU, and the output says so), attention fattn_fwd on the
 * e4m3 tensors.  The CPU engine dequantises e4m3 inputs and computes in f32:
 * it does not round P to e4m3 as the Hopper kernel does.  A throwaway
 * emulation of that step (P = exp2(s - rowmax + 8) in [0, 256] -> e4m3, row
 * sum on the unrounded P) changed the RMSE by 0.2-0.5% at seqlen 8448, head
 * dim 128 (per tensor 2.078e-2 -> 2.081e-2, block + Hadamard 8.164e-3 ->
 * 8.200e-3): the protocol's error is input quantisation.
 * --dump DIR writes the inputs and the reference for bench/accuracy_peers.py,
 * which runs FlashAttention-3's FP8 on the same data. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, sysconf, mkdir */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "common/half.h"
#include "tool.h"

static const char *ACC_HELP =
    "usage: fattn accuracy [options]\n"
    "\n"
    "The FP8 accuracy protocol of FlashAttention-3: Q, K, V entries drawn from\n"
    "N(0,1) + N(0,100) * Bernoulli(0.001); RMSE of the attention output against an\n"
    "FP64 reference (computed once, on the CPU) for 16-bit inputs and for e4m3\n"
    "inputs quantised per tensor, per block of rows, per token, with and without\n"
    "the Hadamard rotation of Q and K.  Every row runs on the same inputs.\n"
    "Non-causal, seqlen_q = seqlen_k, softmax scale 1/sqrt(head_dim).\n"
    "\n"
    "rows (--rows picks some; the engine column says where each ran):\n"
    "  fp16-f32        Q,K,V rounded to fp16, f32 path (CPU engine; on the CUDA\n"
    "                  engine only when --rows names it, then on a CPU context)\n"
    "  bf16, fp16      fattn_fwd with 16-bit inputs and output\n"
    "  fp8-tensor      e4m3, one scale per tensor (the paper's baseline)\n"
    "  fp8-block       e4m3, one scale per --block rows of Q, K and V\n"
    "  fp8-block-had   block scales, Hadamard rotation of Q and K (FA3's recipe)\n"
    "  fp8-token-had   one scale per token of Q and K (block 1), V per --block,\n"
    "                  rotation\n"
    "  fp8-tensor-had  one scale per tensor, rotation\n"
    "FP8 rows quantise with fattn_quantize on the engine; where the CUDA engine\n"
    "answers unsupported, on a CPU context, then copied to the GPU (said in the\n"
    "output).  'vs tensor' is the ratio to the fp8-tensor row.\n"
    "\n"
    "The CPU engine computes e4m3 attention from dequantised inputs in f32; it\n"
    "does not convert P to e4m3 before the PV product as the Hopper kernel does.\n"
    "Emulating that step (P scaled to [0, 256], then e4m3) moved the RMSE by less\n"
    "than 0.5% at seqlen 8448, head dim 128: input quantisation dominates.\n"
    "Paper: fp16 1.9e-4, per tensor 2.4e-2, block + Hadamard 9.1e-3.\n"
    "\n"
    "options:\n"
    "  --engine auto|cpu|cuda  where the rows run (default auto: CUDA when a\n"
    "                  Hopper GPU is present, else the CPU)\n"
    "  --seqlen N      query and key length (default 8448)\n"
    "  --head-dim N    head dimension, a power of two for the rotation; the CUDA\n"
    "                  engine takes 64, 128, 256 (default 128)\n"
    "  --heads N       heads (default 2)\n"
    "  --batch N       batch size (default 1)\n"
    "  --block N       rows per FP8 scale block (default 128, FA3's query tile;\n"
    "                  the CUDA engine takes multiples of 128 for K and V)\n"
    "  --kv-block N    rows per scale block of K and V (default: --block; multiples\n"
    "                  of 192 run the CUDA engine's 192-key kernels at head dim 128)\n"
    "  --inputs protocol|gaussian  the paper's inputs (default) or plain N(0,1)\n"
    "  --fp8-from f32|bf16|f16  what the FP8 rows quantise (default f32, the\n"
    "                  original inputs)\n"
    "  --fp8-out bf16|f16|f32   output of the FP8 rows (default bf16, FA3's)\n"
    "  --rows LIST     comma-separated row names (default: all the engine runs)\n"
    "  --seed N        input and rotation seed (default 1)\n"
    "  --threads N     CPU threads of the reference and the CPU engine (0 = all)\n"
    "  --dump DIR      write q.f32, k.f32, v.f32 (packed [batch, seqlen, heads,\n"
    "                  head_dim], little-endian float32), ref.f64 (the FP64 output,\n"
    "                  float64) and accuracy.json (shape, files, this run's\n"
    "                  results) for bench/accuracy_peers.py\n"
    "  --csv           print CSV instead of a table\n"
    "  --json          print JSON instead of a table\n"
    "\n"
    "Exit status 1 when a row failed (its error is printed; the other rows run).\n"
    "The FP64 reference costs about 4 * batch * heads * seqlen^2 * head_dim\n"
    "double operations: seconds at the default shape on a few cores.\n";

/* ---------------------------------------------------------------- inputs */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double uniform01(uint64_t *s) { return ((double)(splitmix64(s) >> 11) + 0.5) * 0x1p-53; }
static double normal01(uint64_t *s) {
    return sqrt(-2.0 * log(uniform01(s))) * cos(6.283185307179586 * uniform01(s));
}

/* N(0,1) + N(0, 10^2) * Bernoulli(0.001) (protocol) or N(0,1), stored as f32
 * (the original input every row starts from). */
static void fill_inputs(float *x, size_t n, uint64_t seed, int protocol) {
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        double v = normal01(&s);
        if (protocol && uniform01(&s) < 0.001) v += 10.0 * normal01(&s);
        x[i] = (float)v;
    }
}

/* --------------------------------------------------------- FP64 reference */

typedef struct ref_job {
    int32_t batch, n, heads, d;
    const float *q, *k, *v; /* packed BSHD f32 */
    double *out;            /* packed BSHD */
    double *kt, *vd;        /* per (b, h): K^T [d][n] and V [n][d] in double */
    int32_t cur_b, cur_h;
    atomic_long next;       /* next query block */
} ref_job;

/* REF_ROWS query rows share every load of K^T and V (the loops were bound
 * by those loads with one row at a time); REF_KEYS keys at a time keep the
 * rows' scores in L1.  Each sum still runs over c (or t) in order, so the
 * result is the same to the bit as one row at a time. */
enum { REF_ROWS = 8, REF_KEYS = 256 };

static void ref_block(ref_job *j, int64_t blk, double *restrict s, double *restrict qd,
                      double *restrict o) {
    const int32_t n = j->n, d = j->d, H = j->heads;
    const int64_t r0 = blk * REF_ROWS;
    const int64_t rows = n - r0 < REF_ROWS ? n - r0 : REF_ROWS;
    const double scale = 1.0 / sqrt((double)d);
    for (int64_t r = 0; r < rows; r++) {
        const float *q = j->q + (((size_t)j->cur_b * n + (size_t)(r0 + r)) * H + j->cur_h) * d;
        for (int32_t c = 0; c < d; c++) qd[r * d + c] = (double)q[c] * scale;
    }
    for (int32_t t0 = 0; t0 < n; t0 += REF_KEYS) {
        const int32_t tn = n - t0 < REF_KEYS ? n - t0 : REF_KEYS;
        for (int64_t r = 0; r < rows; r++)
            for (int32_t t = 0; t < tn; t++) s[r * n + t0 + t] = 0.0;
        for (int32_t c = 0; c < d; c++) { /* inner loop over keys: vectorises */
            const double *restrict ktc = j->kt + (size_t)c * n + t0;
            for (int64_t r = 0; r < rows; r++) {
                const double qc = qd[r * d + c];
                double *restrict sr = s + r * n + t0;
                for (int32_t t = 0; t < tn; t++) sr[t] += qc * ktc[t];
            }
        }
    }
    double l[REF_ROWS];
    for (int64_t r = 0; r < rows; r++) {
        double *sr = s + r * n, m = -INFINITY, sum = 0.0;
        for (int32_t t = 0; t < n; t++) m = sr[t] > m ? sr[t] : m;
        for (int32_t t = 0; t < n; t++) sum += (sr[t] = exp(sr[t] - m));
        l[r] = sum;
        for (int32_t c = 0; c < d; c++) o[r * d + c] = 0.0;
    }
    for (int32_t t = 0; t < n; t++) {
        const double *restrict vt = j->vd + (size_t)t * d;
        for (int64_t r = 0; r < rows; r++) {
            const double p = s[r * n + t];
            double *restrict orow = o + r * d;
            for (int32_t c = 0; c < d; c++) orow[c] += p * vt[c];
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        double *dst = j->out + (((size_t)j->cur_b * n + (size_t)(r0 + r)) * H + j->cur_h) * d;
        for (int32_t c = 0; c < d; c++) dst[c] = o[r * d + c] / l[r];
    }
}

static void *ref_worker(void *arg) {
    ref_job *j = (ref_job *)arg;
    const int64_t nblk = (j->n + REF_ROWS - 1) / REF_ROWS;
    double *s = malloc(sizeof(double) * REF_ROWS * (size_t)j->n);
    double *qd = malloc(sizeof(double) * REF_ROWS * (size_t)j->d);
    double *o = malloc(sizeof(double) * REF_ROWS * (size_t)j->d);
    if (s && qd && o)
        for (;;) {
            long b = atomic_fetch_add(&j->next, 1);
            if (b >= nblk) break;
            ref_block(j, b, s, qd, o);
        }
    free(s);
    free(qd);
    free(o);
    return NULL;
}

/* O = softmax(Q K^T / sqrt(d)) V in double, exact two-pass softmax. */
static void reference_fp64(const char *cmd, int32_t batch, int32_t n, int32_t heads, int32_t d,
                           const float *q, const float *k, const float *v, double *out,
                           int threads) {
    ref_job j;
    memset(&j, 0, sizeof j);
    j.batch = batch; j.n = n; j.heads = heads; j.d = d;
    j.q = q; j.k = k; j.v = v; j.out = out;
    j.kt = malloc(sizeof(double) * (size_t)n * d);
    j.vd = malloc(sizeof(double) * (size_t)n * d);
    if (!j.kt || !j.vd) tool_die(cmd, "out of memory (FP64 reference)");
    if (threads > 64) threads = 64;
    for (int32_t b = 0; b < batch; b++)
        for (int32_t h = 0; h < heads; h++) {
            for (int32_t t = 0; t < n; t++) {
                const size_t off = (((size_t)b * n + t) * heads + h) * d;
                for (int32_t c = 0; c < d; c++) {
                    j.kt[(size_t)c * n + t] = k[off + c];
                    j.vd[(size_t)t * d + c] = v[off + c];
                }
            }
            j.cur_b = b; j.cur_h = h;
            atomic_store(&j.next, 0);
            pthread_t th[64];
            int started[64] = {0};
            for (int t = 1; t < threads; t++)
                started[t] = pthread_create(&th[t], NULL, ref_worker, &j) == 0;
            ref_worker(&j);
            for (int t = 1; t < threads; t++)
                if (started[t]) pthread_join(th[t], NULL);
        }
    free(j.kt);
    free(j.vd);
}

/* -------------------------------------------------------------------- rows */

typedef enum { ROW_F32, ROW_16BIT, ROW_FP8 } row_kind;

typedef struct row_spec {
    const char *name, *desc;
    row_kind kind;
    fattn_dtype dtype;         /* ROW_F32: the rounding; ROW_16BIT: in and out */
    fattn_quant_granularity g; /* ROW_FP8 */
    int token;                 /* ROW_FP8: Q and K one scale per token */
    int rotate;                /* ROW_FP8: Hadamard on Q and K */
} row_spec;

static const row_spec ROWS[] = {
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
/* indices of the rows the summary divides: fp8-tensor, fp8-block-had */
enum { NROWS = (int)(sizeof ROWS / sizeof ROWS[0]), ROW_BASE = 3, ROW_BLOCK_HAD = 5 };

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

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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

/* ------------------------------------------------------------------ output */

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, double x) {
    if (isfinite(x)) fprintf(f, "%.6e", x);
    else fputs("null", f);
}

typedef struct acc_meta {
    const char *inputs;
    double t_ref;
    int ref_threads;
} acc_meta;

static double ratio_to_base(const row_result *res, int i) {
    const double base = res[ROW_BASE].selected ? res[ROW_BASE].rmse : NAN;
    return res[i].rmse / base; /* NAN when either is */
}

static void write_json(FILE *f, const acc_run *r, const acc_meta *m, const row_result *res) {
    fprintf(f, "{\"engine\": \"%s\", \"batch\": %d, \"seqlen\": %d, \"heads\": %d, \"head_dim\": %d, "
               "\"block\": %d, \"seed\": %llu, \"inputs\": \"%s\", \"causal\": false, \"fp8_from\": \"%s\", "
               "\"fp8_out\": \"%s\", \"reference_s\": %.2f, \"reference_threads\": %d, \"quantize_note\": ",
            r->gpu ? "cuda" : "cpu", (int)r->batch, (int)r->n, (int)r->heads, (int)r->d, (int)r->block,
            (unsigned long long)r->seed, m->inputs, fattn_dtype_name(r->fp8_from),
            fattn_dtype_name(r->fp8_out), m->t_ref, m->ref_threads);
    if (r->quant_note[0]) json_str(f, r->quant_note);
    else fputs("null", f);
    fputs(", \"results\": [", f);
    int first = 1;
    for (int i = 0; i < NROWS; i++) {
        if (!res[i].selected) continue;
        const row_spec *sp = &ROWS[i];
        fprintf(f, "%s{\"method\": \"%s\", \"engine\": \"%s\", \"quantized_on\": \"%s\", "
                   "\"in_dtype\": \"%s\", \"out_dtype\": \"%s\", ",
                first ? "" : ", ", sp->name, res[i].engine ? res[i].engine : "-",
                res[i].quant_on, fattn_dtype_name(res[i].in_dtype), fattn_dtype_name(res[i].out_dtype));
        if (sp->kind == ROW_FP8)
            fprintf(f, "\"q_block\": %d, \"k_block\": %d, \"v_block\": %d, \"granularity\": \"%s\", "
                       "\"rotate\": %s, \"p_e4m3\": %s, ",
                    (int)res[i].bq, (int)res[i].bk, (int)res[i].bv,
                    sp->g == FATTN_QUANT_TENSOR ? "tensor" : "block", sp->rotate ? "true" : "false",
                    res[i].engine && !strcmp(res[i].engine, "cuda") ? "true" : "false");
        fputs("\"rmse\": ", f);
        json_num(f, res[i].rmse);
        fputs(", \"ratio_to_fp8_tensor\": ", f);
        json_num(f, ratio_to_base(res, i));
        fprintf(f, ", \"seconds\": %.2f, \"error\": ", res[i].seconds);
        if (res[i].error[0]) json_str(f, res[i].error);
        else fputs("null", f);
        fputc('}', f);
        first = 0;
    }
    fputs("], \"tensor_over_block_had\": ", f);
    json_num(f, res[ROW_BASE].rmse / (res[ROW_BLOCK_HAD].selected ? res[ROW_BLOCK_HAD].rmse : NAN));
    fputs("}", f);
}

/* ------------------------------------------------------------------- dump */

static void dump_file(const char *cmd, const char *dir, const char *name, const void *p, size_t bytes) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) tool_die(cmd, "--dump: cannot write %s: %s", path, strerror(errno));
    size_t w = fwrite(p, 1, bytes, f);
    if (fclose(f) != 0 || w != bytes) tool_die(cmd, "--dump: writing %s failed", path);
}

/* accuracy.json: what accuracy_peers.py reads (shape, files), and this run's
 * results (null until the rows have run). */
static void dump_meta(const char *cmd, const char *dir, const acc_run *r, const acc_meta *m,
                      const row_result *res) {
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/accuracy.json", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) tool_die(cmd, "--dump: cannot write %s: %s", tmp, strerror(errno));
    fprintf(f, "{\"format\": \"fattn-accuracy-dump 1\", \"layout\": \"bshd\", \"byteorder\": \"little\",\n"
               " \"batch\": %d, \"seqlen\": %d, \"heads\": %d, \"head_dim\": %d, \"causal\": false,\n"
               " \"softmax_scale\": %.17g, \"inputs\": \"%s\", \"seed\": %llu,\n"
               " \"files\": {\"q\": \"q.f32\", \"k\": \"k.f32\", \"v\": \"v.f32\", \"ref\": \"ref.f64\"},\n"
               " \"dtypes\": {\"q\": \"float32\", \"k\": \"float32\", \"v\": \"float32\", \"ref\": \"float64\"},\n"
               " \"fattn\": ",
            (int)r->batch, (int)r->n, (int)r->heads, (int)r->d, 1.0 / sqrt((double)r->d), m->inputs,
            (unsigned long long)r->seed);
    if (res) write_json(f, r, m, res);
    else fputs("null", f);
    fputs("}\n", f);
    if (fclose(f) != 0 || rename(tmp, path) != 0) tool_die(cmd, "--dump: writing %s failed", path);
}

/* -------------------------------------------------------------------- main */

enum { FMT_TABLE, FMT_CSV, FMT_JSON };

static fattn_dtype parse_dtype3(const char *cmd, const char *opt, const char *v) {
    if (!strcmp(v, "f32") || !strcmp(v, "fp32")) return FATTN_DTYPE_F32;
    if (!strcmp(v, "f16") || !strcmp(v, "fp16")) return FATTN_DTYPE_F16;
    if (!strcmp(v, "bf16")) return FATTN_DTYPE_BF16;
    tool_usage_error(cmd, "%s: '%s' is not one of f32, f16, bf16", opt, v);
}

static void parse_rows(const char *cmd, const char *s, int *sel) {
    for (int i = 0; i < NROWS; i++) sel[i] = 0;
    const char *p = s;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        int found = 0;
        for (int i = 0; i < NROWS; i++)
            if (strlen(ROWS[i].name) == len && !strncmp(ROWS[i].name, p, len)) sel[i] = found = 1;
        if (!found) {
            char names[256] = "";
            for (int i = 0; i < NROWS; i++) {
                strcat(names, i ? ", " : "");
                strcat(names, ROWS[i].name);
            }
            tool_usage_error(cmd, "--rows: '%.*s' is not one of %s", (int)len, p, names);
        }
        p += len;
        if (*p == ',') p++;
    }
}

int fattn_cmd_accuracy(int argc, char **argv) {
    const char *cmd = "fattn accuracy";
    int32_t n = 8448, d = 128, heads = 2, batch = 1, block = 128, kv_block = 0, threads = 0;
    uint64_t seed = 1;
    int fmt = FMT_TABLE, protocol = 1, rows_given = 0;
    int sel[NROWS];
    fattn_backend engine = FATTN_BACKEND_AUTO;
    fattn_dtype fp8_from = FATTN_DTYPE_F32, fp8_out = FATTN_DTYPE_BF16;
    const char *dump = NULL;
    const int32_t BIG = INT32_MAX;

    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(ACC_HELP, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--csv")) {
            fmt = FMT_CSV;
        } else if (!strcmp(argv[i], "--json")) {
            fmt = FMT_JSON;
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--engine"))) {
            if (!strcmp(v, "auto")) engine = FATTN_BACKEND_AUTO;
            else if (!strcmp(v, "cpu")) engine = FATTN_BACKEND_CPU;
            else if (!strcmp(v, "cuda") || !strcmp(v, "gpu")) engine = FATTN_BACKEND_CUDA;
            else tool_usage_error(cmd, "--engine: '%s' is not one of auto, cpu, cuda", v);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--seqlen"))) {
            n = tool_parse_int(cmd, "--seqlen", v, 1, BIG);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--head-dim"))) {
            d = tool_parse_int(cmd, "--head-dim", v, 1, 512);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--heads"))) {
            heads = tool_parse_int(cmd, "--heads", v, 1, BIG);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--batch"))) {
            batch = tool_parse_int(cmd, "--batch", v, 1, BIG);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--block"))) {
            block = tool_parse_int(cmd, "--block", v, 1, BIG);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--kv-block"))) {
            kv_block = tool_parse_int(cmd, "--kv-block", v, 1, BIG);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--inputs"))) {
            if (!strcmp(v, "protocol")) protocol = 1;
            else if (!strcmp(v, "gaussian")) protocol = 0;
            else tool_usage_error(cmd, "--inputs: '%s' is not one of protocol, gaussian", v);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--fp8-from"))) {
            fp8_from = parse_dtype3(cmd, "--fp8-from", v);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--fp8-out"))) {
            fp8_out = parse_dtype3(cmd, "--fp8-out", v);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--rows"))) {
            parse_rows(cmd, v, sel);
            rows_given = 1;
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--seed"))) {
            seed = tool_parse_u64(cmd, "--seed", v);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--threads"))) {
            threads = tool_parse_int(cmd, "--threads", v, 0, 4096);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--dump"))) {
            dump = v;
        } else {
            tool_usage_error(cmd, "unknown option '%s'", argv[i]);
        }
    }
    if (d & (d - 1)) tool_usage_error(cmd, "--head-dim %d: the rotation needs a power of two", (int)d);
    const size_t nel = (size_t)batch * n * heads * d;
    if (nel / (size_t)d / (size_t)heads / (size_t)batch != (size_t)n || nel > ((size_t)1 << 31))
        tool_usage_error(cmd, "tensor of %d x %d x %d x %d is too large", (int)batch, (int)n,
                         (int)heads, (int)d);
    if (dump) {
        const uint16_t one = 1;
        if (*(const uint8_t *)&one != 1) tool_die(cmd, "--dump writes little-endian files; this host is not");
        if (mkdir(dump, 0777) != 0 && errno != EEXIST)
            tool_die(cmd, "--dump: cannot create %s: %s", dump, strerror(errno));
    }

    fattn_ctx *ctx = tool_ctx(cmd, engine, threads);
    const int gpu = fattn_ctx_backend(ctx) == FATTN_BACKEND_CUDA;
    if (gpu && d != 64 && d != 128 && d != 256)
        tool_usage_error(cmd, "--head-dim %d: the CUDA engine takes 64, 128 or 256", (int)d);
    if (!rows_given)
        for (int i = 0; i < NROWS; i++) sel[i] = !(gpu && ROWS[i].kind == ROW_F32);
    int nthreads = threads;
    if (nthreads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        nthreads = c > 0 ? (int)c : 1;
    }

    float *x[3];
    for (int t = 0; t < 3; t++)
        if (!(x[t] = malloc(sizeof(float) * nel))) tool_die(cmd, "out of memory");
    double *ref = malloc(sizeof(double) * nel);
    if (!ref) tool_die(cmd, "out of memory");
    uint64_t ss = seed;
    for (int t = 0; t < 3; t++) fill_inputs(x[t], nel, splitmix64(&ss), protocol);
    const char *inputs = protocol ? "protocol" : "gaussian";
    if (dump) {
        dump_file(cmd, dump, "q.f32", x[0], sizeof(float) * nel);
        dump_file(cmd, dump, "k.f32", x[1], sizeof(float) * nel);
        dump_file(cmd, dump, "v.f32", x[2], sizeof(float) * nel);
    }

    fprintf(stderr, "%s: FP64 reference, %d x %d heads of %d x %d x %d, on %d threads\n", cmd,
            (int)batch, (int)heads, (int)n, (int)n, (int)d, nthreads > 64 ? 64 : nthreads);
    double t0 = now_s();
    reference_fp64(cmd, batch, n, heads, d, x[0], x[1], x[2], ref, nthreads);
    acc_meta meta = {inputs, now_s() - t0, nthreads > 64 ? 64 : nthreads};
    if (dump) dump_file(cmd, dump, "ref.f64", ref, sizeof(double) * nel);

    acc_run r;
    memset(&r, 0, sizeof r);
    r.cmd = cmd; r.ctx = ctx; r.cpu = gpu ? NULL : ctx; r.gpu = gpu; r.threads = threads;
    r.batch = batch; r.n = n; r.heads = heads; r.d = d; r.block = block; r.kv_block = kv_block ? kv_block : block; r.seed = seed;
    r.nel = nel; r.nsc_max = nscales(&r, 1);
    for (int t = 0; t < 3; t++) r.x[t] = x[t];
    r.ref = ref;
    r.fp8_from = fp8_from; r.fp8_out = fp8_out;
    if (dump) dump_meta(cmd, dump, &r, &meta, NULL);

    /* buffers where the engine computes (host memory on the CPU engine) */
    int any16 = 0, any8 = 0;
    for (int i = 0; i < NROWS; i++) {
        any16 |= sel[i] && ROWS[i].kind == ROW_16BIT;
        any8 |= sel[i] && ROWS[i].kind == ROW_FP8;
    }
    r.tmp_host = malloc(4 * nel);
    r.o_host = malloc(sizeof(float) * nel);
    if (!r.tmp_host || !r.o_host) tool_die(cmd, "out of memory");
    if (any16)
        for (int t = 0; t < 4; t++) r.x16_dev[t] = tool_alloc(cmd, ctx, 2 * nel);
    if (any8) {
        const size_t es = fattn_dtype_size(fp8_from);
        for (int t = 0; t < 3; t++) {
            if (fp8_from == FATTN_DTYPE_F32) {
                r.src_host[t] = x[t];
            } else {
                if (!(r.src_host[t] = malloc(es * nel))) tool_die(cmd, "out of memory");
                to_dtype(x[t], r.src_host[t], fp8_from, nel);
            }
            if (gpu) {
                r.src_dev[t] = tool_alloc(cmd, ctx, es * nel);
                tool_upload(cmd, ctx, r.src_dev[t], r.src_host[t], es * nel);
            } else {
                r.src_dev[t] = r.src_host[t];
            }
            r.codes_dev[t] = tool_alloc(cmd, ctx, nel);
            r.scales_dev[t] = tool_alloc(cmd, ctx, sizeof(float) * r.nsc_max);
        }
        r.o_dev = tool_alloc(cmd, ctx, 4 * nel);
    }

    row_result res[NROWS];
    memset(res, 0, sizeof res);
    int failed = 0;
    double t_rows = now_s();
    for (int i = 0; i < NROWS; i++) {
        res[i].selected = sel[i];
        res[i].rmse = NAN;
        res[i].quant_on = "-";
        if (!sel[i]) continue;
        double tr = now_s();
        switch (ROWS[i].kind) {
        case ROW_F32: row_f32(&r, &ROWS[i], &res[i]); break;
        case ROW_16BIT: row_16bit(&r, &ROWS[i], &res[i]); break;
        case ROW_FP8: row_fp8(&r, &ROWS[i], &res[i]); break;
        }
        res[i].seconds = now_s() - tr;
        failed += !isfinite(res[i].rmse);
        if (res[i].error[0])
            fprintf(stderr, "%s: %s on %s: %s\n", cmd, ROWS[i].name, res[i].engine, res[i].error);
        else
            fprintf(stderr, "%s: %s on %s: RMSE %.3e (%.1f s)\n", cmd, ROWS[i].name, res[i].engine,
                    res[i].rmse, res[i].seconds);
        if (dump) dump_meta(cmd, dump, &r, &meta, res); /* after every row: a crash keeps the rest */
    }
    t_rows = now_s() - t_rows;

    if (fmt == FMT_CSV) {
        printf("method,engine,quantized_on,rmse,ratio_to_fp8_tensor,batch,seqlen,heads,head_dim,block,"
               "seed,inputs,error\n");
        for (int i = 0; i < NROWS; i++) {
            if (!res[i].selected) continue;
            printf("%s,%s,%s,", ROWS[i].name, res[i].engine, res[i].quant_on);
            if (isfinite(res[i].rmse)) printf("%.6e", res[i].rmse);
            putchar(',');
            if (isfinite(ratio_to_base(res, i))) printf("%.6f", ratio_to_base(res, i));
            printf(",%d,%d,%d,%d,%d,%llu,%s,", (int)batch, (int)n, (int)heads, (int)d, (int)block,
                   (unsigned long long)seed, inputs);
            for (const char *e = res[i].error; *e; e++) putchar(*e == ',' ? ';' : *e);
            putchar('\n');
        }
    } else if (fmt == FMT_JSON) {
        write_json(stdout, &r, &meta, res);
        putchar('\n');
    } else {
        printf("fattn accuracy: batch %d, seqlen %d, heads %d, head dim %d, FP8 block %d rows, "
               "seed %llu, engine %s\n",
               (int)batch, (int)n, (int)heads, (int)d, (int)block, (unsigned long long)seed,
               gpu ? "cuda" : "cpu");
        printf("inputs %s; RMSE of O against FP64 (reference %.1f s on %d threads, rows %.1f s); "
               "FP8 rows quantise %s, write %s\n",
               protocol ? "N(0,1) + N(0,100)*Bernoulli(0.001)" : "N(0,1)", meta.t_ref, meta.ref_threads,
               t_rows, fattn_dtype_name(fp8_from), fattn_dtype_name(fp8_out));
        printf("%s\n", gpu ? "CUDA engine: the kernel rounds P to e4m3 (FA3's [0, 256] offset)"
                           : "CPU engine: P not rounded to e4m3 (see --help)");
        if (r.quant_note[0])
            printf("fattn_quantize on the CUDA engine: %s; FP8 rows with quant 'cpu' (or 'mixed': some of "
                   "Q, K, V) were quantised on a CPU context and copied to the GPU\n",
                   r.quant_note);
        printf("\n%-15s %-6s %-6s %-11s %-9s %s\n", "method", "engine", "quant", "RMSE", "vs tensor",
               "what");
        for (int i = 0; i < NROWS; i++) {
            if (!res[i].selected) continue;
            char rm[32] = "n/a", ra[32] = "-";
            if (isfinite(res[i].rmse)) snprintf(rm, sizeof rm, "%.3e", res[i].rmse);
            if (isfinite(ratio_to_base(res, i))) snprintf(ra, sizeof ra, "%.3f", ratio_to_base(res, i));
            printf("%-15s %-6s %-6s %-11s %-9s %s\n", ROWS[i].name, res[i].engine, res[i].quant_on, rm, ra,
                   res[i].error[0] ? "FAILED (below)" : ROWS[i].desc);
        }
        const double gain = res[ROW_BASE].rmse / (res[ROW_BLOCK_HAD].selected ? res[ROW_BLOCK_HAD].rmse : NAN);
        if (isfinite(gain))
            printf("\nper-tensor / block+Hadamard RMSE: %.2f (paper: 2.4e-2 / 9.1e-3 = 2.6)\n", gain);
        if (failed) {
            printf("\n");
            for (int i = 0; i < NROWS; i++)
                if (res[i].selected && res[i].error[0]) printf("%s: %s\n", ROWS[i].name, res[i].error);
        }
    }

    for (int t = 0; t < 4; t++) tool_free(ctx, r.x16_dev[t]);
    for (int t = 0; t < 3; t++) {
        if (gpu) tool_free(ctx, r.src_dev[t]);
        if (r.src_host[t] != x[t]) free(r.src_host[t]);
        tool_free(ctx, r.codes_dev[t]);
        tool_free(ctx, r.scales_dev[t]);
        free(x[t]);
    }
    tool_free(ctx, r.o_dev);
    free(r.tmp_host); free(r.o_host); free(r.fb_codes); free(r.fb_scales);
    free(ref);
    if (r.cpu && r.cpu != ctx) fattn_ctx_free(r.cpu);
    fattn_ctx_free(ctx);
    return failed ? 1 : 0;
}
