/* run.c - `fattn run`: one attention forward on the GPU when present (else
 * the CPU), timed, and checked against an FP64 reference on sampled rows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "tool.h"

static const char *RUN_HELP =
    "usage: fattn run [options]\n"
    "\n"
    "Runs one attention forward, O = softmax(Q K^T / sqrt(d)) V, on random inputs,\n"
    "on the GPU when one is present (sm_80 or newer), otherwise on the CPU.  Prints\n"
    "the engine that ran (cpu, cuda hopper sm_90, cuda portable sm_86, ...), the\n"
    "median time, the throughput and the error against an FP64 reference on sampled\n"
    "rows.  FATTN_CUDA_ENGINE=portable runs the portable engine on Hopper too.\n"
    "\n"
    "Defaults: GPU batch 4, seqlen 4096, heads 16, head dim 128, bf16;\n"
    "          CPU batch 1, seqlen 1024, heads 8,  head dim 128, f32.\n"
    "\n"
    "options:\n"
    "  --backend auto|cpu|cuda   where to compute (default auto)\n"
    "  --batch N                 batch size\n"
    "  --seqlen N                query and key length (--seqlen-q / --seqlen-k apart; one\n"
    "                            of them alone leaves the other at the default seqlen)\n"
    "  --heads N|Q/KV            query heads, or query/kv heads (GQA/MQA, e.g. 32/8); also\n"
    "                            --heads-kv N (default = heads)\n"
    "  --head-dim N              head dimension\n"
    "  --dtype f32|f16|bf16      input and output type\n"
    "  --causal 0|1              causal mask (bottom-right aligned)\n"
    "  --iters N                 timed runs (median reported)\n"
    "  --threads N               CPU worker threads (0 = all cores)\n"
    "  --samples N               rows checked against the reference (default 32)\n"
    "  --seed N                  input seed (default 1)\n"
    "\n"
    "serving (fattn_fwd_args' seqused_k and block table; a decoding call: --seqlen-q 1):\n"
    "  --page N                  the keys in a paged cache: pages of N tokens in a shuffled\n"
    "                            order, one block table (0 = contiguous, the default)\n"
    "  --seqused-k N             every sequence uses its first N keys only (seqused_k)\n"
    "  --varlen LENS             a variable-length batch: comma-separated sequence lengths\n"
    "                            (cu_seqlens for q and k; the batch is their count; 0 is an\n"
    "                            empty sequence, as the library allows)\n"
    "  --varlen-k LENS           with --varlen: other key lengths (default those of --varlen)\n"
    "A call the library refuses prints the library's message and exits 1 (so does a wrong\n"
    "result).  The serving options add lines to the report; the error is checked against\n"
    "the FP64 reference over the keys each sequence uses.\n";

int fattn_cmd_run(int argc, char **argv) {
    const char *cmd = "fattn run";
    fattn_backend backend = FATTN_BACKEND_AUTO;
    int32_t batch = 0, sq = 0, sk = 0, heads = 0, heads_kv = 0, hd = 0, causal = 0, iters = 0;
    int32_t threads = 0, samples = 32;
    int dtype_set = 0;
    fattn_dtype dtype = FATTN_DTYPE_F32;
    uint64_t seed = 1;
    const int32_t BIG = INT32_MAX;
    int32_t page = 0, seqused = -1; /* -1: no seqused_k */
    static int32_t lens_q[TOOL_MAX_SEQS], lens_k[TOOL_MAX_SEQS];
    int nvar = 0, nvar_k = 0, seq_set = 0;

    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(RUN_HELP, stdout);
            return 0;
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--backend"))) {
            backend = tool_parse_backend(cmd, v);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--batch"))) {
            batch = tool_parse_int(cmd, "--batch", v, 1, BIG);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--seqlen-q"))) {
            sq = tool_parse_int(cmd, "--seqlen-q", v, 1, BIG);
            seq_set = 1;
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--seqlen-k"))) {
            sk = tool_parse_int(cmd, "--seqlen-k", v, 1, BIG);
            seq_set = 1;
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--seqlen"))) {
            sq = sk = tool_parse_int(cmd, "--seqlen", v, 1, BIG);
            seq_set = 1;
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--heads-kv"))) {
            heads_kv = tool_parse_int(cmd, "--heads-kv", v, 1, BIG);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--heads"))) {
            if (strchr(v, '/'))
                tool_parse_heads(cmd, "--heads", v, &heads, &heads_kv);
            else
                heads = tool_parse_int(cmd, "--heads", v, 1, BIG);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--head-dim"))) {
            hd = tool_parse_int(cmd, "--head-dim", v, 1, BIG);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--dtype"))) {
            dtype = tool_parse_dtype(cmd, v);
            dtype_set = 1;
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--causal"))) {
            causal = tool_parse_int(cmd, "--causal", v, 0, 1);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--iters"))) {
            iters = tool_parse_int(cmd, "--iters", v, 1, 100000);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--threads"))) {
            threads = tool_parse_int(cmd, "--threads", v, 0, 4096);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--samples"))) {
            samples = tool_parse_int(cmd, "--samples", v, 1, 1000000);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--seed"))) {
            seed = tool_parse_u64(cmd, "--seed", v);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--page"))) {
            page = tool_parse_int(cmd, "--page", v, 0, BIG);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--seqused-k"))) {
            seqused = tool_parse_int(cmd, "--seqused-k", v, 0, BIG);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--varlen-k"))) {
            nvar_k = tool_parse_list(cmd, "--varlen-k", v, lens_k, TOOL_MAX_SEQS, 0);
        } else if ((v = tool_opt(cmd, argc, argv, &i, "--varlen"))) {
            nvar = tool_parse_list(cmd, "--varlen", v, lens_q, TOOL_MAX_SEQS, 0);
        } else {
            tool_usage_error(cmd, "unknown option '%s'", argv[i]);
        }
    }

    tool_varlen_lens(cmd, nvar, nvar_k, lens_q, lens_k);
    if (nvar) {
        if (batch && batch != nvar)
            tool_usage_error(cmd, "--batch %d but --varlen has %d lengths", batch, nvar);
        if (seq_set)
            tool_usage_error(cmd, "--seqlen, --seqlen-q and --seqlen-k do not apply with --varlen "
                                  "(the lengths are given there)");
        if (page)
            tool_usage_error(cmd, "--page with --varlen: the library takes no block table with "
                                  "cu_seqlens (use --seqused-k on a fixed-length batch)");
        batch = nvar;
        for (int b = 0; b < nvar; b++) {
            if (lens_q[b] > sq) sq = lens_q[b];
            if (lens_k[b] > sk) sk = lens_k[b];
        }
    }
    const int serving = page > 0 || seqused >= 0 || nvar > 0;

    fattn_ctx *ctx = tool_ctx(cmd, backend, threads);
    int gpu = fattn_ctx_backend(ctx) == FATTN_BACKEND_CUDA;
    if (!batch) batch = gpu ? 4 : 1;
    /* --seqlen-q alone (a decoding step, say) keeps the default key length,
     * not a 1 x 1 problem */
    if (!sq) sq = gpu ? 4096 : 1024;
    if (!sk) sk = gpu ? 4096 : 1024;
    if (!heads) heads = gpu ? 16 : 8;
    if (!heads_kv) heads_kv = heads;
    if (!hd) hd = 128;
    if (!dtype_set) dtype = gpu ? FATTN_DTYPE_BF16 : FATTN_DTYPE_F32;
    if (!iters) iters = gpu ? 20 : 5;
    if (heads % heads_kv) tool_usage_error(cmd, "--heads %d is not a multiple of --heads-kv %d",
                                           heads, heads_kv);

    fattn_problem p;
    memset(&p, 0, sizeof p);
    p.batch = batch;
    p.seqlen_q = sq;
    p.seqlen_k = sk;
    p.heads_q = heads;
    p.heads_kv = heads_kv;
    p.head_dim = hd;
    p.causal = causal;

    tool_problem tp;
    if (nvar)
        tool_problem_init_varlen(cmd, ctx, &tp, &p, lens_q, lens_k, dtype, seed);
    else
        tool_problem_init(cmd, ctx, &tp, &p, dtype, seed);
    if (seqused >= 0) tool_problem_seqused(cmd, ctx, &tp, seqused);
    if (page > 0) tool_problem_page(cmd, ctx, &tp, page, seed);

    /* Checked run first, on the poisoned output; then the timed runs. */
    double t_first = tool_time_fwd(cmd, ctx, &tp.a, 0, 1);
    (void)t_first;
    double rel = 0, maxabs = 0;
    tool_check_rows(cmd, ctx, &tp, samples, seed, &rel, &maxabs);
    double ms = tool_time_fwd(cmd, ctx, &tp.a, gpu ? 3 : 0, iters);
    double flops = serving ? tool_problem_flops(&tp) : tool_fwd_flops(&p);
    double rate = flops / (ms * 1e-3);

    char shape[128];
    if (nvar)
        snprintf(shape, sizeof shape,
                 "batch %d (varlen), longest q %d k %d, heads %d%s%.0d, head dim %d%s", batch, sq,
                 sk, heads, heads_kv == heads ? "" : "/",
                 heads_kv == heads ? 0 : heads_kv, hd, causal ? ", causal" : "");
    else if (sq == sk)
        snprintf(shape, sizeof shape, "batch %d, seqlen %d, heads %d%s%.0d, head dim %d%s", batch,
                 sq, heads, heads_kv == heads ? "" : "/", heads_kv == heads ? 0 : heads_kv, hd,
                 causal ? ", causal" : "");
    else
        snprintf(shape, sizeof shape, "batch %d, seqlen q %d k %d, heads %d%s%.0d, head dim %d%s",
                 batch, sq, sk, heads, heads_kv == heads ? "" : "/",
                 heads_kv == heads ? 0 : heads_kv, hd, causal ? ", causal" : "");

    printf("fattn %s - attention forward\n\n", fattn_version_string());
    /* "cpu", "cuda hopper sm_90", "cuda portable sm_86": the engine and architecture that ran */
    printf("  %-18s %s\n", "backend", fattn_ctx_engine(ctx));
    printf("  %-18s %s\n", "shape", shape);
    if (nvar) {
        char text[96];
        tool_lens_text(text, sizeof text, lens_q, nvar);
        printf("  %-18s %d sequences, q lengths %s\n", "varlen", nvar, text);
        tool_lens_text(text, sizeof text, lens_k, nvar);
        printf("  %-18s k lengths %s\n", "", text);
    }
    if (page > 0)
        printf("  %-18s paged: %d pages of %d tokens (shuffled), %d per sequence\n", "kv cache",
               (int)tp.a.num_pages, page, (int)tp.a.max_pages_per_seq);
    if (seqused >= 0)
        printf("  %-18s %d (each sequence reads at most its first %d keys)\n", "seqused_k", seqused,
               seqused);
    printf("  %-18s %s\n", "dtype", fattn_dtype_name(dtype));
    printf("  %-18s %.3f ms (median of %d)\n", "time", ms, iters);
    if (rate >= 1e12)
        printf("  %-18s %.1f TFLOP/s\n", "throughput", rate * 1e-12);
    else
        printf("  %-18s %.1f GFLOP/s\n", "throughput", rate * 1e-9);
    printf("  %-18s %.2e (%d sampled rows vs FP64)\n", "rel. Frobenius err", rel, samples);
    printf("  %-18s %.2e\n", "max abs err", maxabs);
    printf("  %-18s %.1f MiB (whole process, host)\n", "peak memory", tool_peak_rss_mib());

    tool_problem_free(ctx, &tp);
    fattn_ctx_free(ctx);
    /* A wrong answer is a failure of the program, not just a number. */
    double tol = dtype == FATTN_DTYPE_F32 ? 1e-4 : 2e-2;
    if (!(rel <= tol)) {
        fprintf(stderr, "%s: error %.2e exceeds the %s tolerance %.0e\n", cmd, rel,
                fattn_dtype_name(dtype), tol);
        return 1;
    }
    return 0;
}
