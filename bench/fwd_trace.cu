/* fwd_trace.cu - timeline of one CTA of the Hopper forward (experiments only).
 * Built as build/bench/bench_fwd_trace (CTA 5) in a CUDA build
 * (bench/CMakeLists.txt); by hand, from the repo root after the library is
 * built into build-bench/:
 *   nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++20 -O3 --use_fast_math -Iinclude -Isrc \
 *        -DFATTN_FWD_TRACE=5 bench/fwd_trace.cu build-bench/libfattn.a -cudart static -o build-bench/fwd_trace
 * Prints, per traced kernel, lines "wg clock event" for thread 0 of each
 * warpgroup of CTA FATTN_FWD_TRACE (events: the FWD_TRACE points in
 * src/cuda/hopper/fwd/fwd_producer.cuh and fwd_mainloop.cuh, listed in
 * bench/fwd_trace.py, which summarises them). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/cuda/hopper/fwd/fwd_sm90_kernels.cuh"
#include "fattn.h"

/* The traced instances must be types of their own: FwdCfg<O> is also
 * instantiated, untraced, in libfattn.a, and the linker would keep one of
 * the two.  A derived config has FwdCfg<O>'s members and a distinct type;
 * its NoSplit (the instance a split kernel runs when it splits nothing) is
 * traced too. */
template <FwdOpts O>
struct FwdTraceCfg : FwdCfg<O> {
    using NoSplit = FwdTraceCfg<fwd_opts_no_split(O)>;
};

typedef fattn_status (*run_fn)(fattn_ctx *, const fattn_fwd_args *, const fwd_variant &);
struct variant {
    const char *name;
    int seqlen;
    FwdOpts o; /* bf16 */
    run_fn fn;
    bool split = true, pdl = true; /* fwd_variant.split, .pdl */
    constexpr variant no_split() const { variant v = *this; v.split = false; return v; }
};
template <FwdOpts O>
constexpr variant trace_variant(const char *name, int seqlen) {
    constexpr FwdOpts B = fwd_opts_dtype(O, true);
    return {name, seqlen, B, fwd_sm90_run<FwdTraceCfg<B>>};
}
/* V: any FwdOpts by designated initializers, e.g. V("d128 BN192 s4096",
 * 4096, .bn = 192); V_OPTS: from a constant expression, e.g. a shipped
 * kernel's fwd_kernel_opts(FWD_D256).  Either takes .no_split(). */
#define V(name, seqlen, ...) trace_variant<FwdOpts{__VA_ARGS__}>(name, seqlen)
#define V_OPTS(name, seqlen, ...) trace_variant<(__VA_ARGS__)>(name, seqlen)
static const variant variants[] = {
    /* run 123's list: d256 (BN 80, the non-causal CTA pairs and the causal
     * kernel, as shipped but unsplit) at 1024 and 4096: what its tile
     * boundary, ~2.7-3.3 key blocks (run 89), is made of.  Earlier lists
     * (runs 110-122) are in perf-notes by run number and in git history. */
    V_OPTS("d256 pairs s1024", 1024, fwd_kernel_opts(FWD_D256_PAIRED)).no_split(),
    V_OPTS("d256 pairs s4096", 4096, fwd_kernel_opts(FWD_D256_PAIRED)).no_split(),
    V_OPTS("d256 causal s1024", 1024, fwd_kernel_opts(FWD_D256_CAUSAL)),
};

int main() {
    fattn_ctx *ctx;
    if (fattn_ctx_create(&ctx, FATTN_BACKEND_CUDA, 0) != FATTN_OK) { printf("SKIP: no GPU\n"); return 77; }
    const size_t maxel = (size_t)16384 * 2048;
    uint16_t *q, *k, *v, *o;
    cudaMalloc(&q, maxel * 2); cudaMalloc(&k, maxel * 2); cudaMalloc(&v, maxel * 2); cudaMalloc(&o, maxel * 2);
    uint16_t *h = (uint16_t *)malloc(maxel * 2);
    srand(11);
    for (size_t i = 0; i < maxel; ++i) { float f = (float)rand() / RAND_MAX * 2 - 1; uint32_t u; memcpy(&u, &f, 4); h[i] = u >> 16; }
    cudaMemcpy(q, h, maxel * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(k, h + 7, (maxel - 7) * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(v, h + 13, (maxel - 13) * 2, cudaMemcpyHostToDevice);
    static unsigned long long buf[4][FWD_TRACE_N];
    for (const variant &va : variants) {
        const int s = va.seqlen, d = va.o.d, b = 16384 / s, hh = 2048 / d;
        fattn_fwd_args a; memset(&a, 0, sizeof a);
        a.p.batch = b; a.p.seqlen_q = a.p.seqlen_k = s; a.p.heads_q = a.p.heads_kv = hh;
        a.p.head_dim = a.p.head_dim_v = d; a.p.softmax_scale = 1.f / sqrtf((float)d); a.p.causal = va.o.causal;
        fattn_tensor t = {q, FATTN_DTYPE_BF16, (int64_t)s * hh * d, (int64_t)hh * d, d, NULL, 0};
        a.q = t; a.k = t; a.k.data = k; a.v = t; a.v.data = v; a.o = t; a.o.data = o;
        /* what fwd_sm90_run is told: the variant's flags, the rest as the instance has it */
        const fwd_variant fv = fwd_variant_of(va.o, va.split, va.pdl);
        int zero[4] = {0, 0, 0, 0};
        cudaMemcpyToSymbol(fwd_trace_len, zero, sizeof zero);
        /* warm up, then the traced call is the last of 5 back-to-back ones */
        fattn_status st = FATTN_OK;
        for (int i = 0; i < 5 && st == FATTN_OK; ++i) st = va.fn(ctx, &a, fv);
        if (st != FATTN_OK) fprintf(stderr, "%s: %s\n", va.name, fattn_last_error(ctx));
        cudaError_t e = cudaDeviceSynchronize();
        int len[4];
        cudaMemcpyFromSymbol(len, fwd_trace_len, sizeof len);
        cudaMemcpyFromSymbol(buf, fwd_trace_buf, sizeof buf);
        printf("# %s err=%s\n", va.name, cudaGetErrorString(e));
        for (int w = 0; w < 4; ++w)
            for (int i = 0; i < len[w] && i < FWD_TRACE_N; ++i) printf("%d %llu %llu\n", w, buf[w][i] >> 8, buf[w][i] & 255);
    }
    return 0;
}
