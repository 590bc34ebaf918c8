/* bench.c - `fattn bench`: the forward sweep of docs/design.md section 7
 * (fixed total tokens, hidden 2048, seqlen and head dim varied, causal and
 * not), on the GPU when present, scaled down on the CPU; with --decode a
 * decoding sweep (few queries against a long KV cache, contiguous or
 * paged). */
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
    "  --json FILE               also write the results as JSON\n"
    "\n"
    "decoding sweep (--decode): seqlen_q queries a sequence against seqlen_k cached keys,\n"
    "every shape x head dim; per row the K/V bytes a call must read\n"
    "(2 * batch * seqlen_k * heads_kv * head_dim * element size) per second and the\n"
    "FLOPs (4 * batch * heads_q * seqlen_q * seqlen_k * head_dim; with --causal 1 only the\n"
    "visible pairs) per second, over the median time (the same timing as the sweep); TB/s\n"
    "and TFLOP/s on the GPU, GB/s and GFLOP/s on the CPU.\n"
    "  --decode                  run the decoding sweep instead of the sweep above\n"
    "  --decode-shapes LIST      comma-separated BATCHxSEQLEN_K (GPU default\n"
    "                            64x4096,8x8192,1x131072; CPU 4x1024,1x8192)\n"
    "  --heads Q/KV              query / kv heads (default 32/8; Q alone: as many kv heads)\n"
    "  --head-dims LIST          as above (default 128)\n"
    "  --seqlen-q N              queries per sequence (default 1)\n"
    "  --page N                  0: a contiguous cache (default); N > 0: the same keys in a\n"
    "                            page pool of N-token pages, in a shuffled order, read\n"
    "                            through a block table (the CUDA engine: powers of two >= 16)\n"
    "  --causal 0|1|both         the mask (default 0; matters for seqlen_q > 1)\n"
    "  --dtype, --iters, --threads, --csv, --json, --backend as above; --tokens, --hidden,\n"
    "  --seqlens and --fp8 are the prefill sweep's only.\n";

typedef struct decode_row {
    int32_t batch, seqlen_k, heads_q, heads_kv, head_dim, seqlen_q, page, causal;
    double ms, bytes, flops;
} decode_row;

#define BENCH_MAX_SHAPES 64

/* "64x4096,8x8192": batch and seqlen_k pairs; returns the count. */
static int parse_shapes(const char *cmd, const char *s, int32_t *batch, int32_t *seqlen_k) {
    int n = 0;
    const char *p = s;
    char item[64];
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == 0 || len >= sizeof item)
            tool_usage_error(cmd, "--decode-shapes: bad list '%s'", s);
        if (n == BENCH_MAX_SHAPES)
            tool_usage_error(cmd, "--decode-shapes: more than %d shapes", BENCH_MAX_SHAPES);
        memcpy(item, p, len);
        item[len] = '\0';
        char *x = strchr(item, 'x');
        if (!x) tool_usage_error(cmd, "--decode-shapes: '%s' is not BATCHxSEQLEN_K", item);
        *x = '\0';
        batch[n] = tool_parse_int(cmd, "--decode-shapes", item, 1, INT32_MAX);
        seqlen_k[n] = tool_parse_int(cmd, "--decode-shapes", x + 1, 1, INT32_MAX);
        n++;
        p += len;
        if (*p == ',') p++;
    }
    if (n == 0) tool_usage_error(cmd, "--decode-shapes: empty list");
    return n;
}

typedef struct decode_opts {
    int32_t batch[BENCH_MAX_SHAPES], seqlen_k[BENCH_MAX_SHAPES];
    int nshapes;
    int32_t heads_q, heads_kv, seqlen_q, page, iters;
    const int32_t *hdims;
    int nhd, causal_lo, causal_hi;
    fattn_dtype dtype;
    const char *csv, *json;
} decode_opts;

static int bench_decode(const char *cmd, fattn_ctx *ctx, const decode_opts *o) {
    const int gpu = fattn_ctx_backend(ctx) == FATTN_BACKEND_CUDA;
    const int ncases = o->nshapes * o->nhd * (o->causal_hi - o->causal_lo + 1);
    decode_row *rows = (decode_row *)calloc((size_t)ncases, sizeof *rows);
    if (!rows) tool_die(cmd, "out of memory");
    const size_t es = fattn_dtype_size(o->dtype);
    int n = 0;
    for (int c = o->causal_lo; c <= o->causal_hi; c++) {
        for (int h = 0; h < o->nhd; h++) {
            for (int s = 0; s < o->nshapes; s++) {
                decode_row *r = &rows[n];
                fattn_problem p;
                memset(&p, 0, sizeof p);
                p.batch = o->batch[s];
                p.seqlen_q = o->seqlen_q;
                p.seqlen_k = o->seqlen_k[s];
                p.heads_q = o->heads_q;
                p.heads_kv = o->heads_kv;
                p.head_dim = o->hdims[h];
                p.causal = c;
                fprintf(stderr,
                        "[%d/%d] %s %s decode batch %d seqlen_k %d heads %d/%d head dim %d "
                        "seqlen_q %d %s%s ...",
                        n + 1, ncases, gpu ? "cuda" : "cpu", fattn_dtype_name(o->dtype), p.batch,
                        p.seqlen_k, p.heads_q, p.heads_kv, p.head_dim, p.seqlen_q,
                        o->page ? "paged" : "contiguous", c ? " causal" : "");
                fflush(stderr);
                tool_problem tp;
                tool_problem_init(cmd, ctx, &tp, &p, o->dtype, (uint64_t)n + 1);
                if (o->page) tool_problem_page(cmd, ctx, &tp, o->page, (uint64_t)n + 1);
                r->ms = tool_time_fwd(cmd, ctx, &tp.a, gpu ? 3 : 1, o->iters);
                r->flops = tool_problem_flops(&tp);
                tool_problem_free(ctx, &tp);
                r->batch = p.batch, r->seqlen_k = p.seqlen_k, r->heads_q = p.heads_q;
                r->heads_kv = p.heads_kv, r->head_dim = p.head_dim, r->seqlen_q = p.seqlen_q;
                r->page = o->page, r->causal = c;
                r->bytes = 2.0 * p.batch * (double)p.seqlen_k * p.heads_kv * p.head_dim * (double)es;
                double sec = r->ms * 1e-3;
                fprintf(stderr, " %.3f ms, %.3f %s, %.2f %s\n", r->ms,
                        r->bytes / sec * (gpu ? 1e-12 : 1e-9), gpu ? "TB/s" : "GB/s",
                        r->flops / sec * (gpu ? 1e-12 : 1e-9), gpu ? "TFLOP/s" : "GFLOP/s");
                n++;
            }
        }
    }

    /* GPU: TB/s and TFLOP/s; CPU: GB/s and GFLOP/s (as the prefill sweep) */
    const double mul = gpu ? 1e-12 : 1e-9;
    const char *bw = gpu ? "TB/s" : "GB/s", *fl = gpu ? "TFLOP/s" : "GFLOP/s";
    printf("fattn %s decoding sweep: backend %s, dtype %s, median of %d\n\n",
           fattn_version_string(), gpu ? "cuda" : "cpu", fattn_dtype_name(o->dtype), o->iters);
    printf("| batch | seqlen_k | heads | head dim | seqlen_q | causal | page | time (ms) | %6s | %7s "
           "|\n",
           bw, fl);
    printf("|-------|----------|-------|----------|----------|--------|------|-----------|--------|"
           "---------|\n");
    for (int i = 0; i < n; i++) {
        const decode_row *r = &rows[i];
        char heads[32], page[16];
        snprintf(heads, sizeof heads, "%d/%d", r->heads_q, r->heads_kv);
        if (r->page) snprintf(page, sizeof page, "%d", r->page);
        else snprintf(page, sizeof page, "-");
        double sec = r->ms * 1e-3;
        printf("| %5d | %8d | %5s | %8d | %8d | %6s | %4s | %9.3f | %6.*f | %7.*f |\n", r->batch,
               r->seqlen_k, heads, r->head_dim, r->seqlen_q, r->causal ? "yes" : "no", page, r->ms,
               gpu ? 3 : 1, r->bytes / sec * mul, gpu ? 1 : 2, r->flops / sec * mul);
    }

    if (o->csv) {
        FILE *f = fopen(o->csv, "w");
        if (!f) tool_die(cmd, "cannot write %s", o->csv);
        fprintf(f, "backend,dtype,batch,seqlen_k,heads_q,heads_kv,head_dim,seqlen_q,causal,page,ms,"
                   "kv_bytes,flops,%s,%s\n",
                gpu ? "tbps" : "gbps", gpu ? "tflops" : "gflops");
        for (int i = 0; i < n; i++) {
            const decode_row *r = &rows[i];
            double sec = r->ms * 1e-3;
            fprintf(f, "%s,%s,%d,%d,%d,%d,%d,%d,%d,%d,%.6f,%.0f,%.0f,%.4f,%.4f\n",
                    gpu ? "cuda" : "cpu", fattn_dtype_name(o->dtype), r->batch, r->seqlen_k,
                    r->heads_q, r->heads_kv, r->head_dim, r->seqlen_q, r->causal, r->page, r->ms,
                    r->bytes, r->flops, r->bytes / sec * mul, r->flops / sec * mul);
        }
        fclose(f);
    }
    if (o->json) {
        FILE *f = fopen(o->json, "w");
        if (!f) tool_die(cmd, "cannot write %s", o->json);
        fprintf(f, "{\"version\": \"%s\", \"mode\": \"decode\", \"backend\": \"%s\", \"dtype\": "
                   "\"%s\", \"iters\": %d, \"cases\": [\n",
                fattn_version_string(), gpu ? "cuda" : "cpu", fattn_dtype_name(o->dtype), o->iters);
        for (int i = 0; i < n; i++) {
            const decode_row *r = &rows[i];
            double sec = r->ms * 1e-3;
            fprintf(f, "  {\"batch\": %d, \"seqlen_k\": %d, \"heads_q\": %d, \"heads_kv\": %d, "
                       "\"head_dim\": %d, \"seqlen_q\": %d, \"causal\": %d, \"page\": %d, "
                       "\"ms\": %.6f, \"kv_bytes\": %.0f, \"flops\": %.0f, \"%s\": %.4f, "
                       "\"%s\": %.4f}%s\n",
                    r->batch, r->seqlen_k, r->heads_q, r->heads_kv, r->head_dim, r->seqlen_q,
                    r->causal, r->page, r->ms, r->bytes, r->flops, gpu ? "tbps" : "gbps",
                    r->bytes / sec * mul, gpu ? "tflops" : "gflops", r->flops / sec * mul,
                    i + 1 < n ? "," : "");
        }
        fprintf(f, "]}\n");
        fclose(f);
    }
    free(rows);
    return 0;
}

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
    /* --decode; the first option of each sweep's own, for a usage error */
    int decode = 0, causal_set = 0;
    const char *prefill_only = NULL, *decode_only = NULL;
    static decode_opts dopt;
    memset(&dopt, 0, sizeof dopt);
    dopt.heads_q = 32, dopt.heads_kv = 8, dopt.seqlen_q = 1;

    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(BENCH_HELP, stdout);
            return 0;
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--backend"))) {
            backend = tool_parse_backend(cmd, v);
        } else if (!strcmp(argv[i], "--decode")) {
            decode = 1;
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--decode-shapes"))) {
            dopt.nshapes = parse_shapes(cmd, v, dopt.batch, dopt.seqlen_k);
            if (!decode_only) decode_only = "--decode-shapes";
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--heads"))) {
            tool_parse_heads(cmd, "--heads", v, &dopt.heads_q, &dopt.heads_kv);
            if (!decode_only) decode_only = "--heads";
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--seqlen-q"))) {
            dopt.seqlen_q = tool_parse_int(cmd, "--seqlen-q", v, 1, INT32_MAX);
            if (!decode_only) decode_only = "--seqlen-q";
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--page"))) {
            dopt.page = tool_parse_int(cmd, "--page", v, 0, INT32_MAX);
            if (!decode_only) decode_only = "--page";
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--tokens"))) {
            tokens = tool_parse_int(cmd, "--tokens", v, 1, INT32_MAX);
            if (!prefill_only) prefill_only = "--tokens";
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--hidden"))) {
            hidden = tool_parse_int(cmd, "--hidden", v, 1, INT32_MAX);
            if (!prefill_only) prefill_only = "--hidden";
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--seqlens"))) {
            nseq = tool_parse_list(cmd, "--seqlens", v, seqlens, 32);
            if (!prefill_only) prefill_only = "--seqlens";
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--head-dims"))) {
            nhd = tool_parse_list(cmd, "--head-dims", v, hdims, 16);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--causal"))) {
            if (!strcmp(v, "both")) causal_lo = 0, causal_hi = 1;
            else if (!strcmp(v, "0")) causal_lo = causal_hi = 0;
            else if (!strcmp(v, "1")) causal_lo = causal_hi = 1;
            else tool_usage_error(cmd, "--causal: '%s' is not one of both, 0, 1", v);
            causal_set = 1;
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--dtype"))) {
            dtype = tool_parse_dtype(cmd, v);
            dtype_set = 1;
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--fp8"))) {
            if (!strcmp(v, "off")) fp8 = 0;
            else if (!strcmp(v, "block")) fp8 = 1;
            else if (!strcmp(v, "rotate")) fp8 = 2;
            else tool_usage_error(cmd, "--fp8: '%s' is not one of off, block, rotate", v);
            if (!prefill_only) prefill_only = "--fp8";
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

    if (decode && prefill_only)
        tool_usage_error(cmd, "%s is an option of the prefill sweep, not of --decode", prefill_only);
    if (!decode && decode_only) tool_usage_error(cmd, "%s needs --decode", decode_only);

    fattn_ctx *ctx = tool_ctx(cmd, backend, threads);
    int gpu = fattn_ctx_backend(ctx) == FATTN_BACKEND_CUDA;
    if (decode) {
        if (!dopt.nshapes) {
            static const int32_t gb[] = {64, 8, 1}, gs[] = {4096, 8192, 131072};
            static const int32_t cb[] = {4, 1}, cs[] = {1024, 8192};
            dopt.nshapes = gpu ? 3 : 2;
            memcpy(dopt.batch, gpu ? gb : cb, sizeof(int32_t) * (size_t)dopt.nshapes);
            memcpy(dopt.seqlen_k, gpu ? gs : cs, sizeof(int32_t) * (size_t)dopt.nshapes);
        }
        if (!nhd) hdims[0] = 128, nhd = 1;
        dopt.hdims = hdims, dopt.nhd = nhd;
        dopt.causal_lo = causal_set ? causal_lo : 0;
        dopt.causal_hi = causal_set ? causal_hi : 0;
        dopt.dtype = dtype_set ? dtype : gpu ? FATTN_DTYPE_BF16 : FATTN_DTYPE_F32;
        dopt.iters = iters ? iters : gpu ? 20 : 3;
        dopt.csv = csv, dopt.json = json;
        int rc = bench_decode(cmd, ctx, &dopt);
        fattn_ctx_free(ctx);
        return rc;
    }
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
