/* bwd_variants.cu - kernel experiments for the Hopper 16-bit backward: each
 * variant is one BwdCfg<BwdOpts{...}> instance run through bwd_sm90_run (the
 * library's host path: preprocess, main kernel, postprocess), bf16, 16k
 * tokens, hidden 2048, o and lse from the library's forward; each variant's
 * dq, dk, dv are checked against the group's first variant (max |diff|: dk
 * and dv should agree exactly, dq to the rounding of the unordered fp32
 * reduce-adds) and all are timed interleaved (median of 7 rounds, CUDA
 * events), TFLOPs/s counting 2.5x the forward's FLOPs.
 * Built per head dim as build/bench/bench_bwd_variants_d{64,128,256} in a
 * CUDA build (bench/CMakeLists.txt); by hand, one head dim per binary, from
 * the repo root after `cmake --build build-fp8 --target fattn_static`:
 *   nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++20 -O3 --use_fast_math -DFATTN_WITH_CUDA=1 \
 *        -Iinclude -Isrc -Xptxas=--warn-on-spills -DBV_D=128 bench/bwd_variants.cu build-fp8/libfattn.a \
 *        -cudart static -o bwdv128
 * Run: ./bwdv128 [seqlen ...]  (default 4096 16384).  BV_MATCH=pp1,sleep keeps, besides each
 * mask's shipped kernel, only the variants whose names contain one of the words (a variant that
 * hangs can then be run apart from the others under a timeout).
 * Results: docs/perf-notes.md (b-numbers; the options: b6). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "../src/cuda/hopper/bwd/bwd_sm90_launch.cuh"
#include "bench_cuda.h"
#include "fattn.h"

#ifndef BV_D
#define BV_D 128
#endif


typedef fattn_status (*run_fn)(fattn_ctx *, const fattn_bwd_args *);
struct variant {
    const char *name;
    BwdOpts o;
    run_fn fn;
};
template <BwdOpts O>
constexpr variant mk(const char *name) {
    return {name, O, bwd_sm90_run<BwdCfg<O>>};
}
#define V(name, ...) mk<BwdOpts{__VA_ARGS__}>(name)

/* the first of each mask is the shipped kernel (BwdOpts' defaults) */
static const variant variants[] = {
#if BV_D == 64
    V("d64 shipped", .d = 64),
    V("d64 kreg 0", .d = 64, .kreg = 0),
    V("d64 dkss", .d = 64, .dkss = 1),
    V("d64 sleep", .d = 64, .sleep = true),
    V("d64 causal shipped", .d = 64, .causal = true),
    V("d64 causal lpt 0", .d = 64, .causal = true, .lpt = 0),
#elif BV_D == 128
    V("d128 shipped", .d = 128),
    V("d128 sleep", .d = 128, .sleep = true),
    V("d128 psleep", .d = 128, .psleep = true),
    V("d128 dkss 0", .d = 128, .dkss = 0),
    V("d128 causal shipped", .d = 128, .causal = true),
    V("d128 causal lpt 0", .d = 128, .causal = true, .lpt = 0),
    V("d128 causal dkss 0", .d = 128, .causal = true, .dkss = 0),
#else
    V("d256 shipped", .d = 256),
    V("d256 causal shipped", .d = 256, .causal = true),
    V("d256 causal lpt 0", .d = 256, .causal = true, .lpt = 0),
#endif
};
enum { NV = sizeof(variants) / sizeof(variants[0]) };

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint16_t rnd_bf16() { /* uniform in (-1, 1), rounded to bf16 */
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    const float f = (float)((rs >> 11) * 0x1p-53) * 2.f - 1.f;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
static float bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static double max_diff(const uint16_t *x, const uint16_t *y, size_t n) {
    double m = 0;
    for (size_t j = 0; j < n; ++j) {
        const float fx = bf2f(x[j]), fy = bf2f(y[j]);
        if (!(fy == fy) || !(fx == fx)) return INFINITY;
        m = fmax(m, fabs((double)fx - fy));
    }
    return m;
}

int main(int argc, char **argv) {
    std::vector<int> seqs;
    for (int i = 1; i < argc; ++i) seqs.push_back(atoi(argv[i]));
    if (seqs.empty()) seqs = {4096, 16384};
    setvbuf(stdout, NULL, _IOLBF, 0); /* a hang under `timeout` keeps what was printed */
    fattn_ctx *ctx = NULL;
    if (fattn_ctx_create(&ctx, FATTN_BACKEND_CUDA, 0) != FATTN_OK) {
        fprintf(stderr, "ctx: %s\n", fattn_last_error(NULL));
        return 1;
    }
    const int d = BV_D, h = 2048 / d;
    for (int s : seqs) {
        const int b = 16384 / s;
        const size_t n = (size_t)b * s * h * d, nl = (size_t)b * h * s;
        std::vector<uint16_t> hx(n);
        void *q, *k, *v, *o, *dout, *g[2][3]; /* g[0]: the group's first variant's dq, dk, dv; g[1]: the others' */
        float *lse;
        for (void **x : {&q, &k, &v, &o, &dout}) CK(cudaMalloc(x, n * 2));
        for (int i = 0; i < 2; ++i)
            for (int t = 0; t < 3; ++t) CK(cudaMalloc(&g[i][t], n * 2));
        CK(cudaMalloc(&lse, nl * 4));
        for (void *x : {q, k, v, dout}) {
            for (auto &c : hx) c = rnd_bf16();
            CK(cudaMemcpy(x, hx.data(), n * 2, cudaMemcpyHostToDevice));
        }
        for (int causal = 0; causal < 2; ++causal) {
            fattn_bwd_args a;
            memset(&a, 0, sizeof a);
            a.p.batch = b, a.p.seqlen_q = s, a.p.seqlen_k = s, a.p.heads_q = h, a.p.heads_kv = h, a.p.head_dim = d;
            a.p.head_dim_v = d, a.p.causal = causal, a.p.softmax_scale = 1.f / sqrtf((float)d);
            a.q = fattn_tensor_bshd(q, FATTN_DTYPE_BF16), a.k = fattn_tensor_bshd(k, FATTN_DTYPE_BF16);
            a.v = fattn_tensor_bshd(v, FATTN_DTYPE_BF16), a.o = fattn_tensor_bshd(o, FATTN_DTYPE_BF16);
            a.dout = fattn_tensor_bshd(dout, FATTN_DTYPE_BF16);
            a.dq = fattn_tensor_bshd(g[0][0], FATTN_DTYPE_BF16), a.dk = fattn_tensor_bshd(g[0][1], FATTN_DTYPE_BF16);
            a.dv = fattn_tensor_bshd(g[0][2], FATTN_DTYPE_BF16);
            for (fattn_tensor *t : {&a.q, &a.k, &a.v, &a.o, &a.dout, &a.dq, &a.dk, &a.dv}) { /* packed BSHD strides */
                t->stride_head = d, t->stride_seq = (int64_t)h * d, t->stride_batch = (int64_t)s * h * d;
            }
            a.lse = lse;
            fattn_fwd_args fa;
            memset(&fa, 0, sizeof fa);
            fa.p = a.p, fa.q = a.q, fa.k = a.k, fa.v = a.v, fa.o = a.o, fa.lse = lse;
            if (fattn_fwd(ctx, &fa) != FATTN_OK) {
                fprintf(stderr, "forward: %s\n", fattn_last_error(ctx));
                return 1;
            }
            std::vector<int> idx;
            const char *match = getenv("BV_MATCH");
            for (int i = 0; i < NV; ++i) {
                if (variants[i].o.causal != (causal != 0)) continue;
                bool keep = idx.empty() || !match || !*match; /* the mask's first (shipped) always */
                for (const char *w = match; !keep && w && *w;) {
                    const char *e = strchr(w, ',');
                    const size_t len = e ? (size_t)(e - w) : strlen(w);
                    for (const char *p = variants[i].name; !keep && *p; ++p) keep = len && !strncmp(p, w, len);
                    w = e ? e + 1 : NULL;
                }
                if (keep) idx.push_back(i);
            }
            std::vector<std::vector<float>> ms(NV);
            std::vector<double> diff[3];
            for (auto &dd : diff) dd.assign(NV, 0.0);
            bool first = true;
            std::vector<uint16_t> x(n), y(n);
            for (int i : idx) { /* check against the group's first */
                const variant &va = variants[i];
                void **gi = g[first ? 0 : 1];
                a.dq.data = gi[0], a.dk.data = gi[1], a.dv.data = gi[2];
                for (int t = 0; t < 3; ++t) CK(cudaMemset(gi[t], 0xff, n * 2));
                const fattn_status st = va.fn(ctx, &a);
                CK(cudaDeviceSynchronize());
                if (st != FATTN_OK) {
                    printf("%s: %s\n", va.name, fattn_last_error(ctx));
                    for (auto &dd : diff) dd[i] = NAN;
                    continue;
                }
                for (int t = 0; t < 3; ++t) {
                    CK(cudaMemcpy(y.data(), gi[t], n * 2, cudaMemcpyDeviceToHost));
                    if (first) {
                        diff[t][i] = max_diff(y.data(), y.data(), n); /* NaN check only */
                    } else {
                        CK(cudaMemcpy(x.data(), g[0][t], n * 2, cudaMemcpyDeviceToHost));
                        diff[t][i] = max_diff(x.data(), y.data(), n);
                    }
                }
                first = false;
                printf("s%-6d %-24s checked\n", s, va.name);
            }
            a.dq.data = g[1][0], a.dk.data = g[1][1], a.dv.data = g[1][2];
            cudaEvent_t e0, e1;
            CK(cudaEventCreate(&e0));
            CK(cudaEventCreate(&e1));
            for (int round = 0; round < 7; ++round)
                for (size_t jj = 0; jj < idx.size(); ++jj) {
                    const int i = idx[(jj + round) % idx.size()];
                    for (int w = 0; w < 2; ++w) variants[i].fn(ctx, &a);
                    CK(cudaEventRecord(e0));
                    for (int r = 0; r < 5; ++r) variants[i].fn(ctx, &a);
                    CK(cudaEventRecord(e1));
                    CK(cudaEventSynchronize(e1));
                    float t;
                    CK(cudaEventElapsedTime(&t, e0, e1));
                    ms[i].push_back(t / 5);
                }
            CK(cudaGetLastError());
            const double fl = 2.5 * 4.0 * b * h * (double)s * s * d / (causal ? 2 : 1);
            for (int i : idx) {
                if (ms[i].empty()) continue;
                std::sort(ms[i].begin(), ms[i].end());
                const float med = ms[i][ms[i].size() / 2];
                printf("s%-6d %-24s %8.3f ms %6.0f TFLOPs/s  maxdiff dq %.3g dk %.3g dv %.3g\n", s, variants[i].name,
                       med, fl / med / 1e9, diff[0][i], diff[1][i], diff[2][i]);
            }
            CK(cudaEventDestroy(e0));
            CK(cudaEventDestroy(e1));
        }
        for (void *x : {q, k, v, o, dout}) cudaFree(x);
        for (int i = 0; i < 2; ++i)
            for (int t = 0; t < 3; ++t) cudaFree(g[i][t]);
        cudaFree(lse);
    }
    fattn_ctx_free(ctx);
    return 0;
}
