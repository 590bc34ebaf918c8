/* main.c - the `fattn` program: runs, benchmarks and checks the library.
 * The library never prints; this program does. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "fattn.h"
#include "tool.h"

static const char *HELP =
    "usage: fattn <command> [options]\n"
    "\n"
    "fattn is a fused attention library (O = softmax(Q K^T * scale) V without the\n"
    "N x N score matrix in memory) with a CUDA engine (Hopper kernels on sm_90,\n"
    "portable kernels on every other GPU from sm_80 on) and a CPU engine.\n"
    "\n"
    "commands:\n"
    "  run        one forward on the GPU when present (else the CPU): time, FLOP/s\n"
    "             and the error against an FP64 reference (also paged, seqused_k, varlen)\n"
    "  bench      the forward throughput sweep (seqlen x head dim x causal); --decode:\n"
    "             the decoding sweep (batch x seqlen_k, contiguous or paged cache);\n"
    "             --varlen: one call on a ragged batch against one dense call per sequence\n"
    "  accuracy   FlashAttention-3's FP8 accuracy protocol on the GPU or the CPU\n"
    "             (RMSE against FP64 of 16-bit and FP8 rows on the same inputs)\n"
    "\n"
    "  fattn <command> --help   options of a command\n"
    "  fattn --version          library version\n";

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs(HELP, stderr);
        return TOOL_EXIT_USAGE;
    }
    const char *c = argv[1];
    if (!strcmp(c, "--help") || !strcmp(c, "-h") || !strcmp(c, "help")) {
        fputs(HELP, stdout);
        return 0;
    }
    if (!strcmp(c, "--version") || !strcmp(c, "-V")) {
        printf("fattn %s\n", fattn_version_string());
        return 0;
    }
    if (!strcmp(c, "run")) return fattn_cmd_run(argc - 1, argv + 1);
    if (!strcmp(c, "bench")) return fattn_cmd_bench(argc - 1, argv + 1);
    if (!strcmp(c, "accuracy")) return fattn_cmd_accuracy(argc - 1, argv + 1);
    fprintf(stderr, "fattn: unknown command '%s' (see 'fattn --help')\n", c);
    return TOOL_EXIT_USAGE;
}
