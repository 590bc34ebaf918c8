/* fp8_variants.cu - kernel experiments for the Hopper FP8 forward: each
 * variant is one FwdCfg<FwdOpts{...}> instance with e4m3 inputs and bf16
 * output, run through fwd_sm90_run directly, checked against the group's
 * first variant (max |diff|) and timed interleaved (median of the rounds),
 * 16k tokens, hidden 2048, scales per 13440 keys (a multiple of every key
 * block tried here, 128 to 224; the codes are random, so only the timing and the
 * agreement between variants mean anything).
 * Built per head dim as build/bench/bench_fp8_variants_d{64,128,256} in a
 * CUDA build (bench/CMakeLists.txt); by hand, one head dim per binary, from
 * the repo root after the library is built into build-gpu/:
 *   nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++20 -O3 --use_fast_math -Iinclude -Isrc \
 *        -DFV_D=128 bench/fp8_variants.cu build-gpu/libfattn.a -cudart static -o fp8v128
 * Run: ./fp8v128 [seqlen ...]  (default 4096 16384).
 * Results: docs/perf-notes.md (f-numbers). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "../src/cuda/hopper/fwd/fwd_sm90_kernels.cuh"
#include "bench_cuda.h"
#include "fattn.h"

#ifndef FV_D
#define FV_D 128
#endif


typedef fattn_status (*run_fn)(fattn_ctx *, const fattn_fwd_args *, const fwd_variant &);
struct variant {
    const char *name;
    FwdOpts o;
    run_fn fn;
};
template <FwdOpts O>
constexpr variant mk(const char *name) {
    constexpr FwdOpts B = fwd_opts_fp8(O, true, false);
    return {name, B, fwd_sm90_run<FwdCfg<B>>};
}
#define V(name, ...) mk<FwdOpts{__VA_ARGS__}>(name)

static const variant variants[] = {
#if FV_D == 64
    V("d64 192x128 nc3", .d = 64, .nc = 3, .fp8 = true),
    V("d64 192x160 nc3 kvblk", .d = 64, .bn = 160, .nc = 3, .fp8 = true, .kvblk = true),
    V("d64 causal 192x128 nc3", .d = 64, .nc = 3, .causal = true, .fp8 = true),
    V("d64 causal 192x160 nc3 kvblk", .d = 64, .bn = 160, .nc = 3, .causal = true, .fp8 = true, .kvblk = true),
#elif FV_D == 128
    V("d128 128x128", .fp8 = true),
    V("d128 128x128 p24", .fp8 = true, .preg = 24),
    V("d128 192x64 nc3", .bn = 64, .nc = 3, .fp8 = true),
    V("d128 128x192 kvblk", .bn = 192, .fp8 = true, .kvblk = true),
    V("d128 128x192 kvblk p24", .bn = 192, .fp8 = true, .kvblk = true, .preg = 24),
    V("d128 128x224 kvblk", .bn = 224, .fp8 = true, .kvblk = true),
    V("d128 128x224 kvblk p24", .bn = 224, .fp8 = true, .kvblk = true, .preg = 24),
    V("d128 causal 128x128", .causal = true, .fp8 = true),
    V("d128 causal 128x192 kvblk", .bn = 192, .causal = true, .fp8 = true, .kvblk = true),
    V("d128 causal 128x224 kvblk p24", .bn = 224, .causal = true, .fp8 = true, .kvblk = true, .preg = 24),
#else
    V("d256 128x64", .d = 256, .bn = 64, .fp8 = true),
    V("d256 128x128", .d = 256, .bn = 128, .fp8 = true),
    V("d256 128x128 p24", .d = 256, .bn = 128, .fp8 = true, .preg = 24),
    V("d256 128x96 kvblk p24", .d = 256, .bn = 96, .fp8 = true, .kvblk = true, .preg = 24),
    V("d256 causal 128x64", .d = 256, .bn = 64, .causal = true, .fp8 = true),
    V("d256 causal 128x128 p24", .d = 256, .bn = 128, .causal = true, .fp8 = true, .preg = 24),
#endif
};
enum { NV = sizeof(variants) / sizeof(variants[0]), SBLK = 13440 };

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint32_t rnd() {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (uint32_t)(rs >> 32);
}

int main(int argc, char **argv) {
    std::vector<int> seqs;
    for (int i = 1; i < argc; ++i) seqs.push_back(atoi(argv[i]));
    if (seqs.empty()) seqs = {4096, 16384};
    fattn_ctx *ctx = NULL;
    if (fattn_ctx_create(&ctx, FATTN_BACKEND_CUDA, 0) != FATTN_OK) {
        fprintf(stderr, "ctx: %s\n", fattn_last_error(NULL));
        return 1;
    }
    const int d = FV_D, h = 2048 / d;
    for (int s : seqs) {
        const int b = 16384 / s;
        const size_t n = (size_t)b * s * h * d, ns = (size_t)b * h * ((s + SBLK - 1) / SBLK);
        std::vector<uint8_t> hc(n);
        for (auto &c : hc) c = (uint8_t)(rnd() % 0x7e) | (rnd() & 0x80); /* finite codes up to 448 */
        std::vector<float> hs(ns);
        for (auto &x : hs) x = (1.f + (rnd() % 64) / 64.f) / 448.f;
        uint8_t *q, *k, *v;
        float *sq, *sk, *sv;
        uint16_t *o, *o0;
        CK(cudaMalloc(&q, n));
        CK(cudaMalloc(&k, n));
        CK(cudaMalloc(&v, n));
        CK(cudaMalloc(&sq, ns * 4));
        CK(cudaMalloc(&sk, ns * 4));
        CK(cudaMalloc(&sv, ns * 4));
        CK(cudaMalloc(&o, n * 2));
        CK(cudaMalloc(&o0, n * 2));
        for (uint8_t *x : {q, k, v}) {
            for (auto &c : hc) c = (uint8_t)(rnd() % 0x40) | (rnd() & 0x80); /* |x| < 2: scores stay moderate */
            CK(cudaMemcpy(x, hc.data(), n, cudaMemcpyHostToDevice));
        }
        for (float *x : {sq, sk, sv}) CK(cudaMemcpy(x, hs.data(), ns * 4, cudaMemcpyHostToDevice));
        for (int causal = 0; causal < 2; ++causal) {
            fattn_fwd_args a;
            memset(&a, 0, sizeof a);
            a.p.batch = b, a.p.seqlen_q = s, a.p.seqlen_k = s, a.p.heads_q = h, a.p.heads_kv = h, a.p.head_dim = d;
            a.p.head_dim_v = d, a.p.causal = causal, a.p.softmax_scale = 1.f / sqrtf((float)d);
            a.q = fattn_tensor_bshd(q, FATTN_DTYPE_E4M3), a.q.scale = sq, a.q.scale_block = SBLK;
            a.k = fattn_tensor_bshd(k, FATTN_DTYPE_E4M3), a.k.scale = sk, a.k.scale_block = SBLK;
            a.v = fattn_tensor_bshd(v, FATTN_DTYPE_E4M3), a.v.scale = sv, a.v.scale_block = SBLK;
            for (fattn_tensor *t : {&a.q, &a.k, &a.v}) { /* packed BSHD strides spelled out */
                t->stride_head = d, t->stride_seq = (int64_t)h * d, t->stride_batch = (int64_t)s * h * d;
            }
            a.o = fattn_tensor_bshd(o, FATTN_DTYPE_BF16);
            a.o.stride_head = d, a.o.stride_seq = (int64_t)h * d, a.o.stride_batch = (int64_t)s * h * d;
            std::vector<int> idx;
            for (int i = 0; i < NV; ++i)
                if (variants[i].o.causal == (causal != 0)) idx.push_back(i);
            std::vector<std::vector<float>> ms(NV);
            std::vector<double> diff(NV, 0.0);
            bool first = true;
            for (int i : idx) { /* check against the group's first */
                const variant &va = variants[i];
                fwd_variant fv = fwd_variant_of(va.o, false, true);
                fv.fp8 = true, fv.kcol = false;
                a.o.data = first ? (void *)o0 : (void *)o;
                CK(cudaMemset(a.o.data, 0xff, n * 2));
                fattn_status st = va.fn(ctx, &a, fv);
                CK(cudaDeviceSynchronize());
                if (st != FATTN_OK) {
                    printf("%s: %s\n", va.name, fattn_last_error(ctx));
                    diff[i] = NAN;
                    continue;
                }
                if (!first) {
                    std::vector<uint16_t> x(n), y(n);
                    CK(cudaMemcpy(x.data(), o0, n * 2, cudaMemcpyDeviceToHost));
                    CK(cudaMemcpy(y.data(), o, n * 2, cudaMemcpyDeviceToHost));
                    for (size_t j = 0; j < n; j += 7) {
                        uint32_t ux = (uint32_t)x[j] << 16, uy = (uint32_t)y[j] << 16;
                        float fx, fy;
                        memcpy(&fx, &ux, 4), memcpy(&fy, &uy, 4);
                        diff[i] = fmax(diff[i], fabs((double)fx - fy));
                        if (!(fy == fy)) diff[i] = INFINITY;
                    }
                }
                first = false;
            }
            a.o.data = o;
            cudaEvent_t e0, e1;
            CK(cudaEventCreate(&e0));
            CK(cudaEventCreate(&e1));
            for (int round = 0; round < 7; ++round)
                for (size_t jj = 0; jj < idx.size(); ++jj) {
                    const variant &va = variants[idx[(jj + round) % idx.size()]];
                    fwd_variant fv = fwd_variant_of(va.o, false, true);
                    fv.fp8 = true, fv.kcol = false;
                    for (int w = 0; w < 3; ++w) va.fn(ctx, &a, fv);
                    CK(cudaEventRecord(e0));
                    for (int r = 0; r < 10; ++r) va.fn(ctx, &a, fv);
                    CK(cudaEventRecord(e1));
                    CK(cudaEventSynchronize(e1));
                    float t;
                    CK(cudaEventElapsedTime(&t, e0, e1));
                    ms[idx[(jj + round) % idx.size()]].push_back(t / 10);
                }
            const double fl = 4.0 * b * h * (double)s * s * d / (causal ? 2 : 1);
            for (int i : idx) {
                std::sort(ms[i].begin(), ms[i].end());
                const float med = ms[i][ms[i].size() / 2];
                printf("s%-6d %-26s %8.3f ms %6.0f TFLOPs/s  maxdiff %.3g\n", s, variants[i].name, med,
                       fl / med / 1e9, diff[i]);
            }
        }
        cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(sq), cudaFree(sk), cudaFree(sv), cudaFree(o), cudaFree(o0);
    }
    return 0;
}
