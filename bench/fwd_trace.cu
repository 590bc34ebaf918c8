/* fwd_trace.cu - timeline of one CTA of the Hopper forward (experiments only).
 * Build: nvcc ... -DFATTN_FWD_TRACE=5 bench/fwd_trace.cu build-gpu/libfattn.a -cudart static
 * Prints, per traced kernel, lines "wg clock event" for thread 0 of each
 * warpgroup of CTA FATTN_FWD_TRACE (events: see FWD_TRACE in fwd_sm90.cuh);
 * bench/fwd_trace.py summarises them. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/cuda/hopper/fwd_sm90_launch.cuh"
#include "fattn.h"

typedef fattn_status (*run_fn)(fattn_ctx *, const fattn_fwd_args *);
struct variant {
    const char *name;
    int d, causal, seqlen;
    run_fn fn;
};
/* SCHED and LAZY spelled out (the library's measured choices), so these
 * traced instances are distinct types from the untraced ones in libfattn.a;
 * CL and OS are FwdCfg's CLUSTER and OSTORE */
#define V_OPT(name, D, BN, NC, CAUSAL, S, CL, OS, OV) \
    {name, D, CAUSAL, S, fwd_sm90_run<FwdCfg<D, BN, NC, 2, CAUSAL, true, OV, true, CAUSAL ? 1 : 0, D != 128 ? 1 : 0, CL, OS>>}
/* V_CFG: any FwdCfg, spelled out */
#define V_CFG(name, D, CAUSAL, S, ...) {name, D, CAUSAL, S, fwd_sm90_run<FwdCfg<__VA_ARGS__>>}
/* OV: FwdCfg's OVERLAP (1 the measured wait placement, 2 ptxas's, 3 fenced) */
#define V(name, D, BN, NC, CAUSAL, S) V_OPT(name, D, BN, NC, CAUSAL, S, 1, -1, 1)
static const variant variants[] = {
    /* run 123: d256 (BN 80, the non-causal CTA pairs and the causal kernel,
     * as shipped but unsplit) at 1024 and 4096: what its tile boundary,
     * ~2.7-3.3 key blocks (run 89), is made of.  (Run 122's list: d128 BN
     * 176 unsplit at 4096 with and without PSUM, perf-notes v52; run 121's
     * the same with LSUM, v51, both options in no commit; run 120's: BN 128 with QEARLY and with XTILE
     * at 1024 and 4096; run 112's: BN 160 with and without OTMA 2 at 4096;
     * run 110's: BN 176 at 1024 and 4096.) */
    V_CFG("d256 pairs s1024", 256, false, 1024, 256, 80, 2, 2, false, true, 1, true, 0, 1, 2, -1, 0, 0, false, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
    V_CFG("d256 pairs s4096", 256, false, 4096, 256, 80, 2, 2, false, true, 1, true, 0, 1, 2, -1, 0, 0, false, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
    V_CFG("d256 causal s1024", 256, true, 1024, 256, 80, 2, 2, true, true, 1, true, 1, 1, 1, -1, 0, 0, false, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0),
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
        const int s = va.seqlen, b = 16384 / s, hh = 2048 / va.d, d = va.d;
        fattn_fwd_args a; memset(&a, 0, sizeof a);
        a.p.batch = b; a.p.seqlen_q = a.p.seqlen_k = s; a.p.heads_q = a.p.heads_kv = hh;
        a.p.head_dim = a.p.head_dim_v = d; a.p.softmax_scale = 1.f / sqrtf((float)d); a.p.causal = va.causal;
        fattn_tensor t = {q, FATTN_DTYPE_BF16, (int64_t)s * hh * d, (int64_t)hh * d, d, NULL, 0};
        a.q = t; a.k = t; a.k.data = k; a.v = t; a.v.data = v; a.o = t; a.o.data = o;
        int zero[4] = {0, 0, 0, 0};
        cudaMemcpyToSymbol(fwd_trace_len, zero, sizeof zero);
        /* warm up, then the traced call is the last of 5 back-to-back ones */
        for (int i = 0; i < 5; ++i) va.fn(ctx, &a);
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
