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
 * which runs FlashAttention-3's FP8 on the same data.
 *
 * This file is the command line, the output and --dump; the inputs and the
 * reference are accuracy_ref.c's, the rows accuracy_rows.c's. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, sysconf, mkdir */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "accuracy.h"
#include "commands.h"
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
    "                  GPU from sm_80 on is present, else the CPU; FP8 rows need\n"
    "                  Hopper: the portable engine answers unsupported)\n"
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

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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

/* ----------------------------------------------------------- CSV, table */

static void print_csv(const acc_run *r, const acc_meta *m, const row_result *res) {
    printf("method,engine,quantized_on,rmse,ratio_to_fp8_tensor,batch,seqlen,heads,head_dim,block,"
           "seed,inputs,error\n");
    for (int i = 0; i < NROWS; i++) {
        if (!res[i].selected) continue;
        printf("%s,%s,%s,", ROWS[i].name, res[i].engine, res[i].quant_on);
        if (isfinite(res[i].rmse)) printf("%.6e", res[i].rmse);
        putchar(',');
        if (isfinite(ratio_to_base(res, i))) printf("%.6f", ratio_to_base(res, i));
        printf(",%d,%d,%d,%d,%d,%llu,%s,", (int)r->batch, (int)r->n, (int)r->heads, (int)r->d,
               (int)r->block, (unsigned long long)r->seed, m->inputs);
        for (const char *e = res[i].error; *e; e++) putchar(*e == ',' ? ';' : *e);
        putchar('\n');
    }
}

static void print_table(const acc_run *r, const acc_meta *m, const row_result *res, double t_rows,
                        int failed) {
    printf("fattn accuracy: batch %d, seqlen %d, heads %d, head dim %d, FP8 block %d rows, "
           "seed %llu, engine %s\n",
           (int)r->batch, (int)r->n, (int)r->heads, (int)r->d, (int)r->block,
           (unsigned long long)r->seed, fattn_ctx_engine(r->ctx));
    printf("inputs %s; RMSE of O against FP64 (reference %.1f s on %d threads, rows %.1f s); "
           "FP8 rows quantise %s, write %s\n",
           strcmp(m->inputs, "protocol") ? "N(0,1)" : "N(0,1) + N(0,100)*Bernoulli(0.001)", m->t_ref,
           m->ref_threads, t_rows, fattn_dtype_name(r->fp8_from), fattn_dtype_name(r->fp8_out));
    printf("%s\n", r->gpu ? "CUDA engine: the kernel rounds P to e4m3 (FA3's [0, 256] offset)"
                          : "CPU engine: P not rounded to e4m3 (see --help)");
    if (r->quant_note[0])
        printf("fattn_quantize on the CUDA engine: %s; FP8 rows with quant 'cpu' (or 'mixed': some of "
               "Q, K, V) were quantised on a CPU context and copied to the GPU\n",
               r->quant_note);
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
    acc_fill_inputs(x, nel, seed, protocol);
    const char *inputs = protocol ? "protocol" : "gaussian";
    if (dump) {
        dump_file(cmd, dump, "q.f32", x[0], sizeof(float) * nel);
        dump_file(cmd, dump, "k.f32", x[1], sizeof(float) * nel);
        dump_file(cmd, dump, "v.f32", x[2], sizeof(float) * nel);
    }

    fprintf(stderr, "%s: FP64 reference, %d x %d heads of %d x %d x %d, on %d threads\n", cmd,
            (int)batch, (int)heads, (int)n, (int)n, (int)d, nthreads > 64 ? 64 : nthreads);
    double t0 = now_s();
    acc_reference_fp64(cmd, batch, n, heads, d, x[0], x[1], x[2], ref, nthreads);
    acc_meta meta = {inputs, now_s() - t0, nthreads > 64 ? 64 : nthreads};
    if (dump) dump_file(cmd, dump, "ref.f64", ref, sizeof(double) * nel);

    acc_run r;
    memset(&r, 0, sizeof r);
    r.cmd = cmd; r.ctx = ctx; r.cpu = gpu ? NULL : ctx; r.gpu = gpu; r.threads = threads;
    r.batch = batch; r.n = n; r.heads = heads; r.d = d; r.block = block; r.kv_block = kv_block ? kv_block : block; r.seed = seed;
    r.nel = nel;
    for (int t = 0; t < 3; t++) r.x[t] = x[t];
    r.ref = ref;
    r.fp8_from = fp8_from; r.fp8_out = fp8_out;
    if (dump) dump_meta(cmd, dump, &r, &meta, NULL);

    /* buffers where the engine computes (host memory on the CPU engine) */
    acc_alloc_buffers(&r, sel);

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
        acc_run_row(&r, i, &res[i]);
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
        print_csv(&r, &meta, res);
    } else if (fmt == FMT_JSON) {
        write_json(stdout, &r, &meta, res);
        putchar('\n');
    } else {
        print_table(&r, &meta, res, t_rows, failed);
    }
    acc_free_buffers(&r);
    for (int t = 0; t < 3; t++) free(x[t]);
    free(ref);
    fattn_ctx_free(ctx);
    return failed ? 1 : 0;
}