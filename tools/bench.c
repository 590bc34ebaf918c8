/* bench.c - `fattn bench`: the forward sweep of docs/design.md section 7
 * (fixed total tokens, hidden 2048, seqlen and head dim varied, causal and
 * not), on the GPU when present, scaled down on the CPU; with --decode a
 * decoding sweep (few queries against a long KV cache, contiguous or
 * paged); with --varlen a variable-length prefill (one call on a packed
 * ragged batch against the dense kernel once per sequence). */
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
    "FLOPs = 4 * batch * heads * seqlen^2 * head_dim (halved when causal; with\n"
    "--head-dim-v, 2 * batch * heads * seqlen^2 * (head_dim + head_dim_v)), over the\n"
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
    "  --head-dim-v N            V's and O's head dim at every head dim (default: each\n"
    "                            one's own; the CUDA engine: 128 with head dim 192)\n"
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
    "  --seqlens and --fp8 do not apply.\n";

/* apart: ISO C's 4095 characters a string literal */
static const char *BENCH_HELP_VARLEN =
    "\n"
    "variable-length sweep (--varlen): one fattn_fwd call on a ragged batch packed\n"
    "[tokens, heads, head_dim] (cu_seqlens_q/k where the engine computes, total_q/k set)\n"
    "against the dense kernel on the same tokens: one fixed-length call per sequence\n"
    "(batch 1, that sequence's lengths), back to back, timed over the whole set; every\n"
    "head dim x causal mode.  FLOPs = the sum over the sequences of\n"
    "4 * heads_q * len_q * len_k * head_dim, halved when causal and len_q == len_k (causal\n"
    "with other key lengths: the visible pairs, as --decode).  Per row both median times,\n"
    "both rates and dense / varlen (the ratio of the times: above 1 the varlen call is the\n"
    "faster; the varlen call's rate over the dense calls').\n"
    "  --varlen [LENS]           run this sweep on these comma-separated sequence lengths\n"
    "                            (alone: GPU 8000,3000,2000,1200,800,500,384,300,100,100,\n"
    "                            16,384 tokens; CPU 500,300,100,37,1)\n"
    "  --varlen-k LENS           other key lengths, as many (default those of --varlen)\n"
    "  --hidden N                heads = N / head_dim (default 2048)\n"
    "  --heads Q/KV              instead of --hidden: these heads at every head dim\n"
    "  --head-dims LIST          as above (default 64,128,256; the CUDA engine: these three)\n"
    "  --causal both|0|1         as above (default both)\n"
    "  --dtype, --iters, --threads, --csv, --json, --backend as above (the CUDA engine:\n"
    "  f16 or bf16).\n";

/* The sweeps, for the options that belong to some of them only. */
enum { SWEEP_PREFILL = 1, SWEEP_DECODE = 2, SWEEP_VARLEN = 4 };

static double per_s(double amount, double ms, int gpu) {
    return amount / (ms * 1e-3) * (gpu ? 1e-12 : 1e-9);
}
static const char *flops_unit(int gpu) { return gpu ? "TFLOP/s" : "GFLOP/s"; }
static const char *flops_key(int gpu) { return gpu ? "tflops" : "gflops"; }

/* "[3/12] cuda bf16 " before a case's own words on stderr. */
static void progress(int n, int ncases, int gpu, fattn_dtype dtype) {
    fprintf(stderr, "[%d/%d] %s %s ", n + 1, ncases, gpu ? "cuda" : "cpu", fattn_dtype_name(dtype));
}

/* ---- results: a table on stdout; the same rows as CSV and JSON records ---- */

/* One value of a row: a table column (head: its header; NULL: not in the
 * table), a record field (key; NULL: not in the CSV and JSON), or both.  The
 * table prints text when set, else x; the records print x. */
typedef struct bench_field {
    const char *head, *key;
    int width, tprec, rprec; /* table column width; digits in the table, the records */
    double x;
    char text[48]; /* fits fattn_ctx_engine's longest, "cuda portable sm_120 (FATTN_CUDA_ENGINE)" */
    const char *json; /* the JSON header only: this JSON value instead */
} bench_field;

#define BENCH_MAX_FIELDS 24

typedef struct bench_fields {
    bench_field f[BENCH_MAX_FIELDS];
    int n;
} bench_fields;

static bench_field *put(bench_fields *r, const char *head, const char *key, int width, int tprec,
                        int rprec, double x) {
    if (r->n == BENCH_MAX_FIELDS) tool_die("fattn bench", "more than %d fields", BENCH_MAX_FIELDS);
    bench_field *f = &r->f[r->n++];
    f->head = head, f->key = key, f->width = width, f->tprec = tprec, f->rprec = rprec, f->x = x;
    f->text[0] = '\0';
    f->json = NULL;
    return f;
}

/* A column shown as text (the records, if key, have x as an integer). */
static void put_text(bench_fields *r, const char *head, const char *key, int width,
                     const char *text, double x) {
    snprintf(put(r, head, key, width, 0, 0, x)->text, sizeof r->f[0].text, "%s", text);
}

/* The header fields of the JSON file after "version" (a key with text: a
 * string); mode NULL for the prefill sweep. */
static void put_meta(bench_fields *m, const char *mode, const fattn_ctx *ctx, fattn_dtype dtype) {
    if (mode) put_text(m, NULL, "mode", 0, mode, 0);
    put_text(m, NULL, "backend", 0, fattn_ctx_backend(ctx) == FATTN_BACKEND_CUDA ? "cuda" : "cpu", 0);
    put_text(m, NULL, "engine", 0, fattn_ctx_engine(ctx), 0); /* "cuda portable sm_86", ... */
    put_text(m, NULL, "dtype", 0, fattn_dtype_name(dtype), 0);
}

/* Row i of a sweep's rows as fields. */
typedef void (*bench_fields_fn)(const void *rows, int i, int gpu, bench_fields *out);

static FILE *open_or_die(const char *cmd, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) tool_die(cmd, "cannot write %s", path);
    return f;
}

/* The table of the n rows on stdout (after the sweep's title line), then the
 * CSV (backend and dtype first) and the JSON file when asked for. */
static void bench_report(const char *cmd, const char *csv, const char *json, int gpu,
                         fattn_dtype dtype, const bench_fields *meta, const void *rows, int n,
                         bench_fields_fn fields) {
    bench_fields r;
    for (int i = 0; i < n; i++) {
        fields(rows, i, gpu, &r);
        if (i == 0) {
            for (int k = 0; k < r.n; k++)
                if (r.f[k].head) printf("| %*s ", r.f[k].width, r.f[k].head);
            printf("|\n");
            for (int k = 0; k < r.n; k++)
                if (r.f[k].head) printf("|%.*s", r.f[k].width + 2, "------------------------------");
            printf("|\n");
        }
        for (int k = 0; k < r.n; k++) {
            const bench_field *f = &r.f[k];
            if (!f->head) continue;
            if (f->text[0]) printf("| %*s ", f->width, f->text);
            else printf("| %*.*f ", f->width, f->tprec, f->x);
        }
        printf("|\n");
    }
    if (csv) {
        FILE *o = open_or_die(cmd, csv);
        for (int i = 0; i < n; i++) {
            fields(rows, i, gpu, &r);
            if (i == 0) {
                fprintf(o, "backend,dtype");
                for (int k = 0; k < r.n; k++)
                    if (r.f[k].key) fprintf(o, ",%s", r.f[k].key);
                fprintf(o, "\n");
            }
            fprintf(o, "%s,%s", gpu ? "cuda" : "cpu", fattn_dtype_name(dtype));
            for (int k = 0; k < r.n; k++)
                if (r.f[k].key) fprintf(o, ",%.*f", r.f[k].rprec, r.f[k].x);
            fprintf(o, "\n");
        }
        fclose(o);
    }
    if (json) {
        FILE *o = open_or_die(cmd, json);
        fprintf(o, "{\"version\": \"%s\"", fattn_version_string());
        for (int k = 0; k < meta->n; k++) {
            const bench_field *f = &meta->f[k];
            if (f->json) fprintf(o, ", \"%s\": %s", f->key, f->json);
            else if (f->text[0]) fprintf(o, ", \"%s\": \"%s\"", f->key, f->text);
            else fprintf(o, ", \"%s\": %.*f", f->key, f->rprec, f->x);
        }
        fprintf(o, ", \"cases\": [\n");
        for (int i = 0; i < n; i++) {
            fields(rows, i, gpu, &r);
            const char *sep = "  {";
            for (int k = 0; k < r.n; k++) {
                if (!r.f[k].key) continue;
                fprintf(o, "%s\"%s\": %.*f", sep, r.f[k].key, r.f[k].rprec, r.f[k].x);
                sep = ", ";
            }
            fprintf(o, "}%s\n", i + 1 < n ? "," : "");
        }
        fprintf(o, "]}\n");
        fclose(o);
    }
}

/* ---- the decoding sweep ---- */

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

/* The heads column, "32/8" (or "16" when as many kv heads as query heads, with
 * same_as_one), and heads_q, heads_kv as the CSV/JSON fields. */
static void put_heads(bench_fields *out, int32_t heads_q, int32_t heads_kv, int same_as_one) {
    char text[32];
    if (same_as_one && heads_q == heads_kv) snprintf(text, sizeof text, "%d", heads_q);
    else snprintf(text, sizeof text, "%d/%d", heads_q, heads_kv);
    put_text(out, "heads", NULL, 5, text, 0);
    put(out, NULL, "heads_q", 0, 0, 0, heads_q);
    put(out, NULL, "heads_kv", 0, 0, 0, heads_kv);
}

static void decode_fields(const void *rows, int i, int gpu, bench_fields *out) {
    const decode_row *r = &((const decode_row *)rows)[i];
    char text[32];
    out->n = 0;
    put(out, "batch", "batch", 5, 0, 0, r->batch);
    put(out, "seqlen_k", "seqlen_k", 8, 0, 0, r->seqlen_k);
    put_heads(out, r->heads_q, r->heads_kv, 0);
    put(out, "head dim", "head_dim", 8, 0, 0, r->head_dim);
    put(out, "seqlen_q", "seqlen_q", 8, 0, 0, r->seqlen_q);
    put_text(out, "causal", "causal", 6, r->causal ? "yes" : "no", r->causal);
    if (r->page) snprintf(text, sizeof text, "%d", r->page);
    else snprintf(text, sizeof text, "-");
    put_text(out, "page", "page", 4, text, r->page);
    put(out, "time (ms)", "ms", 9, 3, 6, r->ms);
    put(out, NULL, "kv_bytes", 0, 0, 0, r->bytes);
    put(out, NULL, "flops", 0, 0, 0, r->flops);
    /* GPU: TB/s and TFLOP/s; CPU: GB/s and GFLOP/s (as the prefill sweep) */
    put(out, gpu ? "TB/s" : "GB/s", gpu ? "tbps" : "gbps", 6, gpu ? 3 : 1, 4,
        per_s(r->bytes, r->ms, gpu));
    put(out, flops_unit(gpu), flops_key(gpu), 7, gpu ? 1 : 2, 4, per_s(r->flops, r->ms, gpu));
}

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
                progress(n, ncases, gpu, o->dtype);
                fprintf(stderr,
                        "decode batch %d seqlen_k %d heads %d/%d head dim %d seqlen_q %d %s%s ...",
                        p.batch, p.seqlen_k, p.heads_q, p.heads_kv, p.head_dim, p.seqlen_q,
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
                fprintf(stderr, " %.3f ms, %.3f %s, %.2f %s\n", r->ms, per_s(r->bytes, r->ms, gpu),
                        gpu ? "TB/s" : "GB/s", per_s(r->flops, r->ms, gpu), flops_unit(gpu));
                n++;
            }
        }
    }

    printf("fattn %s decoding sweep: backend %s, dtype %s, median of %d\n\n",
           fattn_version_string(), fattn_ctx_engine(ctx), fattn_dtype_name(o->dtype), o->iters);
    bench_fields meta = {0};
    put_meta(&meta, "decode", ctx, o->dtype);
    put(&meta, NULL, "iters", 0, 0, 0, o->iters);
    bench_report(cmd, o->csv, o->json, gpu, o->dtype, &meta, rows, n, decode_fields);
    free(rows);
    return 0;
}

/* ---- the variable-length sweep ---- */

typedef struct varlen_opts {
    const int32_t *lens_q, *lens_k;
    int nseq;
    int32_t heads_q, heads_kv; /* 0: hidden / head_dim, as many kv heads */
    int32_t hidden, iters;
    const int32_t *hdims;
    int nhd, causal_lo, causal_hi;
    fattn_dtype dtype;
    const char *csv, *json;
} varlen_opts;

typedef struct varlen_row {
    int32_t causal, head_dim, heads_q, heads_kv, seqs;
    double tokens_q, tokens_k, flops, ms, dense_ms;
} varlen_row;

static void varlen_fields(const void *rows, int i, int gpu, bench_fields *out) {
    const varlen_row *r = &((const varlen_row *)rows)[i];
    char text[32];
    out->n = 0;
    put_text(out, "causal", "causal", 6, r->causal ? "yes" : "no", r->causal);
    put(out, "head dim", "head_dim", 8, 0, 0, r->head_dim);
    put_heads(out, r->heads_q, r->heads_kv, 1);
    put(out, "seqs", "seqs", 4, 0, 0, r->seqs);
    if (r->tokens_q == r->tokens_k) snprintf(text, sizeof text, "%.0f", r->tokens_q);
    else snprintf(text, sizeof text, "%.0f/%.0f", r->tokens_q, r->tokens_k);
    put_text(out, "tokens", NULL, 9, text, 0);
    put(out, NULL, "tokens_q", 0, 0, 0, r->tokens_q);
    put(out, NULL, "tokens_k", 0, 0, 0, r->tokens_k);
    put(out, "GFLOP", NULL, 9, gpu ? 1 : 3, 0, r->flops * 1e-9);
    put(out, NULL, "flops", 0, 0, 0, r->flops);
    put(out, "varlen (ms)", "varlen_ms", 11, 3, 6, r->ms);
    put(out, flops_unit(gpu), gpu ? "varlen_tflops" : "varlen_gflops", 7, gpu ? 1 : 2, 4,
        per_s(r->flops, r->ms, gpu));
    put(out, "dense per seq (ms)", "dense_ms", 18, 3, 6, r->dense_ms);
    put(out, NULL, gpu ? "dense_tflops" : "dense_gflops", 0, 0, 4, per_s(r->flops, r->dense_ms, gpu));
    put(out, "dense / varlen", "dense_over_varlen", 14, 3, 4, r->dense_ms / r->ms);
}

/* "[500, 300, 100]" (malloc'd) */
static char *lens_json(const char *cmd, const int32_t *lens, int n) {
    size_t size = 3 + (size_t)n * 13, k = 1;
    char *s = (char *)malloc(size);
    if (!s) tool_die(cmd, "out of memory");
    s[0] = '[';
    for (int b = 0; b < n; b++)
        k += (size_t)snprintf(s + k, size - k, "%s%d", b ? ", " : "", (int)lens[b]);
    snprintf(s + k, size - k, "]");
    return s;
}

static int bench_varlen(const char *cmd, fattn_ctx *ctx, const varlen_opts *o) {
    const int gpu = fattn_ctx_backend(ctx) == FATTN_BACKEND_CUDA;
    const int ncases = o->nhd * (o->causal_hi - o->causal_lo + 1);
    varlen_row *rows = (varlen_row *)calloc((size_t)ncases, sizeof *rows);
    fattn_fwd_args *dense = (fattn_fwd_args *)calloc((size_t)o->nseq, sizeof *dense);
    if (!rows || !dense) tool_die(cmd, "out of memory");
    double tq = 0, tk = 0;
    for (int b = 0; b < o->nseq; b++) tq += o->lens_q[b], tk += o->lens_k[b];
    int n = 0;
    for (int c = o->causal_lo; c <= o->causal_hi; c++) {
        for (int h = 0; h < o->nhd; h++) {
            varlen_row *r = &rows[n];
            fattn_problem p;
            memset(&p, 0, sizeof p);
            p.batch = o->nseq;
            p.head_dim = o->hdims[h];
            p.heads_q = o->heads_q ? o->heads_q : o->hidden / p.head_dim;
            p.heads_kv = o->heads_q ? o->heads_kv : p.heads_q;
            p.causal = c;
            progress(n, ncases, gpu, o->dtype);
            fprintf(stderr, "varlen %d sequences, %.0f/%.0f tokens, heads %d/%d head dim %d%s ...",
                    p.batch, tq, tk, p.heads_q, p.heads_kv, p.head_dim, c ? " causal" : "");
            fflush(stderr);
            tool_problem tp;
            tool_problem_init_varlen(cmd, ctx, &tp, &p, o->lens_q, o->lens_k, o->dtype,
                                     (uint64_t)n + 1);
            r->ms = tool_time_fwd(cmd, ctx, &tp.a, gpu ? 3 : 1, o->iters);
            /* the dense kernel on the same tokens, one call per sequence */
            for (int b = 0; b < o->nseq; b++) tool_problem_seq_args(cmd, &tp, b, &dense[b]);
            r->dense_ms = tool_time_fwd_calls(cmd, ctx, dense, o->nseq, gpu ? 3 : 1, o->iters);
            r->flops = tool_problem_design_flops(&tp);
            tool_problem_free(ctx, &tp);
            r->causal = c, r->head_dim = p.head_dim, r->heads_q = p.heads_q;
            r->heads_kv = p.heads_kv, r->seqs = p.batch, r->tokens_q = tq, r->tokens_k = tk;
            fprintf(stderr, " %.3f ms, %.2f %s; dense per sequence %.3f ms; dense / varlen %.3f\n",
                    r->ms, per_s(r->flops, r->ms, gpu), flops_unit(gpu), r->dense_ms,
                    r->dense_ms / r->ms);
            n++;
        }
    }

    char lq[96], lk[96];
    tool_lens_text(lq, sizeof lq, o->lens_q, o->nseq);
    tool_lens_text(lk, sizeof lk, o->lens_k, o->nseq);
    printf("fattn %s varlen sweep: backend %s, dtype %s, %d sequences, median of %d\n",
           fattn_version_string(), fattn_ctx_engine(ctx), fattn_dtype_name(o->dtype), o->nseq,
           o->iters);
    printf("lengths q %s\n        k %s\n\n", lq, lk);
    bench_fields meta = {0};
    put_meta(&meta, "varlen", ctx, o->dtype);
    put(&meta, NULL, "iters", 0, 0, 0, o->iters);
    char *jq = lens_json(cmd, o->lens_q, o->nseq), *jk = lens_json(cmd, o->lens_k, o->nseq);
    put(&meta, NULL, "lens_q", 0, 0, 0, 0)->json = jq;
    put(&meta, NULL, "lens_k", 0, 0, 0, 0)->json = jk;
    bench_report(cmd, o->csv, o->json, gpu, o->dtype, &meta, rows, n, varlen_fields);
    free(jq);
    free(jk);
    free(dense);
    free(rows);
    return 0;
}

/* ---- the prefill sweep ---- */

typedef struct bench_row {
    int32_t batch, seqlen, heads, head_dim, head_dim_v, causal;
    double ms, flops;
} bench_row;

static void prefill_fields(const void *rows, int i, int gpu, bench_fields *out) {
    const bench_row *r = &((const bench_row *)rows)[i];
    double rate = per_s(r->flops, r->ms, gpu);
    out->n = 0;
    put_text(out, "causal", NULL, 6, r->causal ? "yes" : "no", 0);
    put(out, "head dim", NULL, 8, 0, 0, r->head_dim);
    put(out, NULL, "batch", 0, 0, 0, r->batch);
    put(out, "seqlen", "seqlen", 6, 0, 0, r->seqlen);
    put(out, "batch", NULL, 5, 0, 0, r->batch);
    put(out, "heads", "heads", 5, 0, 0, r->heads);
    put(out, NULL, "head_dim", 0, 0, 0, r->head_dim);
    put(out, NULL, "head_dim_v", 0, 0, 0, r->head_dim_v);
    put(out, NULL, "causal", 0, 0, 0, r->causal);
    put(out, "time (ms)", "ms", 9, 3, 6, r->ms);
    put(out, NULL, "flops", 0, 0, 0, r->flops);
    put(out, flops_unit(gpu), flops_key(gpu), 7, 1, 3, rate);
}

/* The option names seen that belong to some sweeps only, each with its
 * sweeps (SWEEP_*), for a usage error once the sweep is known. */
typedef struct sweep_only {
    const char *name[16];
    int sweeps[16];
    int n;
} sweep_only;

static void only_in(sweep_only *s, const char *name, int sweeps) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->name[i], name)) return;
    s->name[s->n] = name, s->sweeps[s->n] = sweeps, s->n++;
}

static const char *sweep_names(int sweeps) {
    switch (sweeps) {
    case SWEEP_PREFILL: return "the prefill sweep";
    case SWEEP_DECODE: return "--decode";
    case SWEEP_VARLEN: return "--varlen";
    case SWEEP_DECODE | SWEEP_VARLEN: return "--decode or --varlen";
    case SWEEP_PREFILL | SWEEP_VARLEN: return "the prefill sweep or --varlen";
    default: return "the prefill sweep or --decode";
    }
}

/* Exits 2 at the first option that is not the sweep's. */
static void check_sweep(const char *cmd, const sweep_only *s, int sweep) {
    for (int i = 0; i < s->n; i++) {
        if (s->sweeps[i] & sweep) continue;
        if (sweep == SWEEP_PREFILL)
            tool_usage_error(cmd, "%s needs %s", s->name[i], sweep_names(s->sweeps[i]));
        tool_usage_error(cmd, "%s is an option of %s, not of %s", s->name[i],
                         sweep_names(s->sweeps[i]), sweep_names(sweep));
    }
}

typedef struct prefill_opts {
    int32_t tokens; /* 0: the engine's default */
    int32_t hidden, iters;
    const int32_t *seqlens; /* nseq 0: the engine's default */
    int nseq;
    const int32_t *hdims;
    int nhd, causal_lo, causal_hi;
    int32_t hdim_v; /* 0: each head dim's own */
    int fp8; /* 0 off, 1 block scales, 2 block scales + rotation */
    fattn_dtype dtype;
    const char *csv, *json;
} prefill_opts;

/* The forward sweep: every (causal, head dim, seqlen) case at `tokens` tokens
 * (batch = tokens / seqlen) and hidden / head dim heads. */
static int bench_prefill(const char *cmd, fattn_ctx *ctx, const prefill_opts *o) {
    const int gpu = fattn_ctx_backend(ctx) == FATTN_BACKEND_CUDA;
    const fattn_dtype dtype = o->dtype;
    const int32_t hidden = o->hidden, iters = o->iters, *hdims = o->hdims;
    const int nhd = o->nhd, causal_lo = o->causal_lo, causal_hi = o->causal_hi, fp8 = o->fp8;
    int32_t tokens = o->tokens ? o->tokens : gpu ? 16384 : 2048;
    int32_t seqlens[32];
    int nseq = o->nseq;
    memcpy(seqlens, o->seqlens, sizeof(int32_t) * (size_t)nseq);
    if (!nseq) {
        static const int32_t gpu_seq[] = {512, 1024, 2048, 4096, 8192, 16384};
        static const int32_t cpu_seq[] = {256, 512, 1024, 2048};
        nseq = gpu ? 6 : 4;
        memcpy(seqlens, gpu ? gpu_seq : cpu_seq, sizeof(int32_t) * (size_t)nseq);
    }
    for (int s = 0; s < nseq; s++)
        if (seqlens[s] > tokens)
            tool_usage_error(cmd, "--seqlens: %d is larger than --tokens %d", seqlens[s], tokens);

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
                p.head_dim_v = o->hdim_v ? o->hdim_v : hdims[h];
                p.heads_q = p.heads_kv = hidden / hdims[h];
                p.causal = c;
                progress(n, ncases, gpu, dtype);
                fprintf(stderr, "batch %d seqlen %d heads %d head dim %d/%d%s ...", p.batch,
                        p.seqlen_q, p.heads_q, p.head_dim, p.head_dim_v, c ? " causal" : "");
                fflush(stderr);
                tool_problem tp;
                tool_problem_init(cmd, ctx, &tp, &p, dtype, (uint64_t)n + 1);
                fattn_fp8_options fo;
                memset(&fo, 0, sizeof fo); /* block scales of 128 rows */
                fo.rotate = fp8 == 2;
                r->ms = tool_time_fwd_fp8(cmd, ctx, &tp.a, fp8 ? &fo : NULL, gpu ? 3 : 1, iters);
                tool_problem_free(ctx, &tp);
                r->batch = p.batch, r->seqlen = p.seqlen_q, r->heads = p.heads_q;
                r->head_dim = p.head_dim, r->head_dim_v = p.head_dim_v, r->causal = c;
                r->flops = tool_fwd_flops(&p);
                fprintf(stderr, " %.3f ms, %.1f %s\n", r->ms, per_s(r->flops, r->ms, gpu),
                        flops_unit(gpu));
                n++;
            }
        }
    }

    static const char *const fp8_name[] = {"", ", FP8 end to end (block scales)",
                                           ", FP8 end to end (block scales + rotation)"};
    static const char *const fp8_json[] = {"off", "block", "rotate"};
    printf("fattn %s forward sweep: backend %s, dtype %s%s, %d tokens, hidden %d, median of %d",
           fattn_version_string(), fattn_ctx_engine(ctx), fattn_dtype_name(dtype), fp8_name[fp8], tokens,
           hidden, iters);
    if (o->hdim_v) printf(", head_dim_v %d", o->hdim_v);
    printf("\n\n");
    bench_fields meta = {0};
    put_meta(&meta, NULL, ctx, dtype);
    put_text(&meta, NULL, "fp8", 0, fp8_json[fp8], 0);
    put(&meta, NULL, "tokens", 0, 0, 0, tokens);
    put(&meta, NULL, "hidden", 0, 0, 0, hidden);
    put(&meta, NULL, "iters", 0, 0, 0, iters);
    bench_report(cmd, o->csv, o->json, gpu, dtype, &meta, rows, n, prefill_fields);
    free(rows);
    return 0;
}

int fattn_cmd_bench(int argc, char **argv) {
    const char *cmd = "fattn bench";
    fattn_backend backend = FATTN_BACKEND_AUTO;
    int32_t tokens = 0, hidden = 2048, iters = 0, threads = 0, hdim_v = 0;
    int32_t seqlens[32], hdims[16];
    int nseq = 0, nhd = 0, causal_lo = 0, causal_hi = 1, dtype_set = 0;
    fattn_dtype dtype = FATTN_DTYPE_F32;
    const char *csv = NULL, *json = NULL;
    int fp8 = 0; /* 0 off, 1 block scales, 2 block scales + rotation */
    int decode = 0, varlen = 0, causal_set = 0, heads_set = 0, hidden_set = 0;
    sweep_only only = {{0}, {0}, 0};
    static decode_opts dopt;
    memset(&dopt, 0, sizeof dopt);
    dopt.heads_q = 32, dopt.heads_kv = 8, dopt.seqlen_q = 1;
    static int32_t lens_q[TOOL_MAX_SEQS], lens_k[TOOL_MAX_SEQS];
    int nvar = 0, nvar_k = 0;

    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(BENCH_HELP, stdout);
            fputs(BENCH_HELP_VARLEN, stdout);
            return 0;
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--backend"))) {
            backend = tool_parse_backend(cmd, v);
        } else if (!strcmp(argv[i], "--decode")) {
            decode = 1;
        } else if (!strcmp(argv[i], "--varlen") && (i + 1 == argc || argv[i + 1][0] == '-')) {
            varlen = 1; /* the default lengths */
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--varlen"))) {
            nvar = tool_parse_list(cmd, "--varlen", v, lens_q, TOOL_MAX_SEQS, 1);
            varlen = 1;
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--varlen-k"))) {
            nvar_k = tool_parse_list(cmd, "--varlen-k", v, lens_k, TOOL_MAX_SEQS, 1);
            only_in(&only, "--varlen-k", SWEEP_VARLEN);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--decode-shapes"))) {
            dopt.nshapes = parse_shapes(cmd, v, dopt.batch, dopt.seqlen_k);
            only_in(&only, "--decode-shapes", SWEEP_DECODE);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--heads"))) {
            tool_parse_heads(cmd, "--heads", v, &dopt.heads_q, &dopt.heads_kv);
            only_in(&only, "--heads", SWEEP_DECODE | SWEEP_VARLEN);
            heads_set = 1;
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--seqlen-q"))) {
            dopt.seqlen_q = tool_parse_int(cmd, "--seqlen-q", v, 1, INT32_MAX);
            only_in(&only, "--seqlen-q", SWEEP_DECODE);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--page"))) {
            dopt.page = tool_parse_int(cmd, "--page", v, 0, INT32_MAX);
            only_in(&only, "--page", SWEEP_DECODE);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--tokens"))) {
            tokens = tool_parse_int(cmd, "--tokens", v, 1, INT32_MAX);
            only_in(&only, "--tokens", SWEEP_PREFILL);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--hidden"))) {
            hidden = tool_parse_int(cmd, "--hidden", v, 1, INT32_MAX);
            only_in(&only, "--hidden", SWEEP_PREFILL | SWEEP_VARLEN);
            hidden_set = 1;
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--seqlens"))) {
            nseq = tool_parse_list(cmd, "--seqlens", v, seqlens, 32, 1);
            only_in(&only, "--seqlens", SWEEP_PREFILL);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--head-dims"))) {
            nhd = tool_parse_list(cmd, "--head-dims", v, hdims, 16, 1);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--head-dim-v"))) {
            hdim_v = tool_parse_int(cmd, "--head-dim-v", v, 1, INT32_MAX);
            only_in(&only, "--head-dim-v", SWEEP_PREFILL);
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
            only_in(&only, "--fp8", SWEEP_PREFILL);
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

    if (decode && varlen) tool_usage_error(cmd, "--decode and --varlen: one sweep at a time");
    check_sweep(cmd, &only, decode ? SWEEP_DECODE : varlen ? SWEEP_VARLEN : SWEEP_PREFILL);
    if (varlen && heads_set && hidden_set)
        tool_usage_error(cmd, "--hidden and --heads with --varlen: give one (the heads at every "
                              "head dim are --heads, or --hidden / head dim)");

    fattn_ctx *ctx = tool_ctx(cmd, backend, threads);
    int gpu = fattn_ctx_backend(ctx) == FATTN_BACKEND_CUDA;
    if (!dtype_set) dtype = gpu ? FATTN_DTYPE_BF16 : FATTN_DTYPE_F32;
    if (!iters) iters = gpu ? 20 : 3;
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
        dopt.dtype = dtype;
        dopt.iters = iters;
        dopt.csv = csv, dopt.json = json;
        int rc = bench_decode(cmd, ctx, &dopt);
        fattn_ctx_free(ctx);
        return rc;
    }
    if (!nhd) hdims[0] = 64, hdims[1] = 128, hdims[2] = 256, nhd = 3;
    if (!heads_set)
        for (int h = 0; h < nhd; h++)
            if (hidden % hdims[h])
                tool_usage_error(cmd, "--head-dims: %d does not divide --hidden %d", hdims[h],
                                 hidden);
    if (varlen) {
        if (!nvar) {
            /* the ragged batch (16,384 tokens); on the CPU a few seconds' worth */
            static const int32_t gl[] = {8000, 3000, 2000, 1200, 800, 500, 384, 300, 100, 100};
            static const int32_t cl[] = {500, 300, 100, 37, 1};
            nvar = gpu ? 10 : 5;
            memcpy(lens_q, gpu ? gl : cl, sizeof(int32_t) * (size_t)nvar);
        }
        tool_varlen_lens(cmd, nvar, nvar_k, lens_q, lens_k);
        varlen_opts vo;
        memset(&vo, 0, sizeof vo);
        vo.lens_q = lens_q, vo.lens_k = lens_k, vo.nseq = nvar;
        if (heads_set) vo.heads_q = dopt.heads_q, vo.heads_kv = dopt.heads_kv;
        vo.hidden = hidden, vo.iters = iters;
        vo.hdims = hdims, vo.nhd = nhd, vo.causal_lo = causal_lo, vo.causal_hi = causal_hi;
        vo.dtype = dtype, vo.csv = csv, vo.json = json;
        int rc = bench_varlen(cmd, ctx, &vo);
        fattn_ctx_free(ctx);
        return rc;
    }
    prefill_opts po;
    memset(&po, 0, sizeof po);
    po.tokens = tokens, po.hidden = hidden, po.iters = iters, po.fp8 = fp8;
    po.seqlens = seqlens, po.nseq = nseq, po.hdims = hdims, po.nhd = nhd;
    po.causal_lo = causal_lo, po.causal_hi = causal_hi, po.hdim_v = hdim_v;
    po.dtype = dtype, po.csv = csv, po.json = json;
    int rc = bench_prefill(cmd, ctx, &po);
    fattn_ctx_free(ctx);
    return rc;
}
