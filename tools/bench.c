/* bench.c - `fattn bench`: the forward sweep of docs/design.md section 7
 * (fixed total tokens, hidden 2048, seqlen and head dim varied, causal and
 * not), on the GPU when present, scaled down on the CPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "tool.h"

static const char *BENCH_HELP =
    "usage: fattn bench [options]\n"
    "\n"
    "Forward throughput sweep: total tokens fixed (batch = tokens / seqlen), hidden\n"
    "size 2048 (heads = 2048 / head_dim), every seqlen x head dim x causal mode.\n"
    "FLOPs = 4 * batch * heads * seqlen^2 * head_dim (halved when causal), over the\n"
    "median time.  Progress on stderr, the table on stdout.\n"
    "\n"
    "Defaults: GPU tokens 16384, seqlens 512,1024,2048,4096,8192,16384, bf16, 20 iters;\n"
    "          CPU tokens 2048,  seqlens 256,512,1024,2048, f32, 3 iters.\n"
    "\n"
    "options:\n"
    "  --backend auto|cpu|cuda   where to compute (default auto)\n"
    "  --tokens N                total tokens per case\n"
    "  --hidden N                heads * head_dim (default 2048)\n"
    "  --seqlens LIST            comma-separated sequence lengths\n"
    "  --head-dims LIST          comma-separated head dims (default 64,128,256)\n"
    "  --causal both|0|1         which masks to run (default both)\n"
    "  --dtype f32|f16|bf16      input and output type\n"
    "  --fp8 off|block|rotate    FP8 end to end through fattn_fwd_fp8: the 16-bit or f32\n"
    "                            inputs quantised to e4m3 (block scales of 128 rows; rotate:\n"
    "                            and the Hadamard rotation of Q and K), then attended;\n"
    "                            the time includes the quantisation (default off)\n"
    "  --iters N                 timed runs per case (median reported)\n"
    "  --threads N               CPU worker threads (0 = all cores)\n"
    "  --csv FILE                also write the results as CSV\n"
    "  --json FILE               also write the results as JSON\n";

typedef struct bench_row {
    int32_t batch, seqlen, heads, head_dim, causal;
    double ms, flops;
} bench_row;

int fattn_cmd_bench(int argc, char **argv) {
    const char *cmd = "fattn bench";
    fattn_backend backend = FATTN_BACKEND_AUTO;
    int32_t tokens = 0, hidden = 2048, iters = 0, threads = 0;
    int32_t seqlens[32], hdims[16];
    int nseq = 0, nhd = 0, causal_lo = 0, causal_hi = 1, dtype_set = 0;
    fattn_dtype dtype = FATTN_DTYPE_F32;
    const char *csv = NULL, *json = NULL;
    int fp8 = 0; /* 0 off, 1 block scales, 2 block scales + rotation */

    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(BENCH_HELP, stdout);
            return 0;
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--backend"))) {
            backend = tool_parse_backend(cmd, v);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--tokens"))) {
            tokens = tool_parse_int(cmd, "--tokens", v, 1, INT32_MAX);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--hidden"))) {
            hidden = tool_parse_int(cmd, "--hidden", v, 1, INT32_MAX);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--seqlens"))) {
            nseq = tool_parse_list(cmd, "--seqlens", v, seqlens, 32);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--head-dims"))) {
            nhd = tool_parse_list(cmd, "--head-dims", v, hdims, 16);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--causal"))) {
            if (!strcmp(v, "both")) causal_lo = 0, causal_hi = 1;
            else if (!strcmp(v, "0")) causal_lo = causal_hi = 0;
            else if (!strcmp(v, "1")) causal_lo = causal_hi = 1;
            else tool_usage_error(cmd, "--causal: '%s' is not one of both, 0, 1", v);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--dtype"))) {
            dtype = tool_parse_dtype(cmd, v);
            dtype_set = 1;
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--fp8"))) {
            if (!strcmp(v, "off")) fp8 = 0;
            else if (!strcmp(v, "block")) fp8 = 1;
            else if (!strcmp(v, "rotate")) fp8 = 2;
            else tool_usage_error(cmd, "--fp8: '%s' is not one of off, block, rotate", v);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--iters"))) {
            iters = tool_parse_int(cmd, "--iters", v, 1, 100000);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--threads"))) {
            threads = tool_parse_int(cmd, "--threads", v, 0, 4096);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--csv"))) {
            csv = v;
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--json"))) {
            json = v;
        } else {
            tool_usage_error(cmd, "unknown option '%s'", argv[i]);
        }
    }

    fattn_ctx *ctx = tool_ctx(cmd, backend, threads);
    int gpu = fattn_ctx_backend(ctx) == FATTN_BACKEND_CUDA;
    if (!tokens) tokens = gpu ? 16384 : 2048;
    if (!nseq) {
        static const int32_t gpu_seq[] = {512, 1024, 2048, 4096, 8192, 16384};
        static const int32_t cpu_seq[] = {256, 512, 1024, 2048};
        nseq = gpu ? 6 : 4;
        memcpy(seqlens, gpu ? gpu_seq : cpu_seq, sizeof(int32_t) * (size_t)nseq);
    }
    if (!nhd) hdims[0] = 64, hdims[1] = 128, hdims[2] = 256, nhd = 3;
    if (!dtype_set) dtype = gpu ? FATTN_DTYPE_BF16 : FATTN_DTYPE_F32;
    if (!iters) iters = gpu ? 20 : 3;
    for (int s = 0; s < nseq; s++)
        if (seqlens[s] > tokens)
            tool_usage_error(cmd, "--seqlens: %d is larger than --tokens %d", seqlens[s], tokens);
    for (int h = 0; h < nhd; h++)
        if (hidden % hdims[h])
            tool_usage_error(cmd, "--head-dims: %d does not divide --hidden %d", hdims[h], hidden);

    int ncases = nseq * nhd * (causal_hi - causal_lo + 1), n = 0;
    bench_row *rows = (bench_row *)calloc((size_t)ncases, sizeof *rows);
    if (!rows) tool_die(cmd, "out of memory");
    for (int c = causal_lo; c <= causal_hi; c++) {
        for (int h = 0; h < nhd; h++) {
            for (int s = 0; s < nseq; s++) {
                bench_row *r = &rows[n];
                fattn_problem p;
                memset(&p, 0, sizeof p);
                p.seqlen_q = p.seqlen_k = seqlens[s];
                p.batch = tokens / seqlens[s];
                p.head_dim = hdims[h];
                p.heads_q = p.heads_kv = hidden / hdims[h];
                p.causal = c;
                fprintf(stderr, "[%d/%d] %s %s batch %d seqlen %d heads %d head dim %d%s ...",
                        n + 1, ncases, gpu ? "cuda" : "cpu", fattn_dtype_name(dtype), p.batch,
                        p.seqlen_q, p.heads_q, p.head_dim, c ? " causal" : "");
                fflush(stderr);
                tool_problem tp;
                tool_problem_init(cmd, ctx, &tp, &p, dtype, (uint64_t)n + 1);
                fattn_fp8_options o;
                memset(&o, 0, sizeof o); /* block scales of 128 rows */
                o.rotate = fp8 == 2;
                r->ms = tool_time_fwd_fp8(cmd, ctx, &tp.a, fp8 ? &o : NULL, gpu ? 3 : 1, iters);
                tool_problem_free(ctx, &tp);
                r->batch = p.batch, r->seqlen = p.seqlen_q, r->heads = p.heads_q;
                r->head_dim = p.head_dim, r->causal = c;
                r->flops = tool_fwd_flops(&p);
                double rate = r->flops / (r->ms * 1e-3);
                fprintf(stderr, " %.3f ms, %.1f %s\n", r->ms, gpu ? rate * 1e-12 : rate * 1e-9,
                        gpu ? "TFLOP/s" : "GFLOP/s");
                n++;
            }
        }
    }

    const char *unit = gpu ? "TFLOP/s" : "GFLOP/s";
    double mul = gpu ? 1e-12 : 1e-9;
    static const char *const fp8_name[] = {"", ", FP8 end to end (block scales)",
                                           ", FP8 end to end (block scales + rotation)"};
    printf("fattn %s forward sweep: backend %s, dtype %s%s, %d tokens, hidden %d, median of %d\n\n",
           fattn_version_string(), gpu ? "cuda" : "cpu", fattn_dtype_name(dtype), fp8_name[fp8], tokens,
           hidden, iters);
    printf("| causal | head dim | seqlen | batch | heads | time (ms) | %s |\n", unit);
    printf("|--------|----------|--------|-------|-------|-----------|---------|\n");
    for (int i = 0; i < n; i++)
        printf("| %6s | %8d | %6d | %5d | %5d | %9.3f | %7.1f |\n", rows[i].causal ? "yes" : "no",
               rows[i].head_dim, rows[i].seqlen, rows[i].batch, rows[i].heads, rows[i].ms,
               rows[i].flops / (rows[i].ms * 1e-3) * mul);

    if (csv) {
        FILE *f = fopen(csv, "w");
        if (!f) tool_die(cmd, "cannot write %s", csv);
        fprintf(f, "backend,dtype,batch,seqlen,heads,head_dim,causal,ms,flops,%s\n",
                gpu ? "tflops" : "gflops");
        for (int i = 0; i < n; i++)
            fprintf(f, "%s,%s,%d,%d,%d,%d,%d,%.6f,%.0f,%.3f\n", gpu ? "cuda" : "cpu",
                    fattn_dtype_name(dtype), rows[i].batch, rows[i].seqlen, rows[i].heads,
                    rows[i].head_dim, rows[i].causal, rows[i].ms, rows[i].flops,
                    rows[i].flops / (rows[i].ms * 1e-3) * mul);
        fclose(f);
    }
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) tool_die(cmd, "cannot write %s", json);
        static const char *const fp8_json[] = {"off", "block", "rotate"};
        fprintf(f, "{\"version\": \"%s\", \"backend\": \"%s\", \"dtype\": \"%s\", \"fp8\": \"%s\", "
                   "\"tokens\": %d, \"hidden\": %d, \"iters\": %d, \"cases\": [\n",
                fattn_version_string(), gpu ? "cuda" : "cpu", fattn_dtype_name(dtype), fp8_json[fp8], tokens,
                hidden, iters);
        for (int i = 0; i < n; i++)
            fprintf(f, "  {\"batch\": %d, \"seqlen\": %d, \"heads\": %d, \"head_dim\": %d, "
                       "\"causal\": %d, \"ms\": %.6f, \"flops\": %.0f, \"%s\": %.3f}%s\n",
                    rows[i].batch, rows[i].seqlen, rows[i].heads, rows[i].head_dim, rows[i].causal,
                    rows[i].ms, rows[i].flops, gpu ? "tflops" : "gflops",
                    rows[i].flops / (rows[i].ms * 1e-3) * mul, i + 1 < n ? "," : "");
        fprintf(f, "]}\n");
        fclose(f);
    }
    free(rows);
    fattn_ctx_free(ctx);
    return 0;
}
