/* bwd_smoke.cu - a quick look at the Hopper backward against the CPU engine's
 * fattn_bwd on the same bf16 inputs (o and lse from the GPU forward, copied),
 * and its speed at 16k tokens.  An experiment, not a test: tests/gpu/
 * test_bwd.cu is the test.
 * Built as build/bench/bench_bwd_smoke in a CUDA build (bench/CMakeLists.txt).
 *   build/bench/bench_bwd_smoke [check|time|both] */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "bench_cuda.h"
#include "fattn.h"

#define FK(ctx, x)                                                                              \
    do {                                                                                        \
        fattn_status s_ = (x);                                                                  \
        if (s_ != FATTN_OK) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, fattn_last_error(ctx)); \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

static uint64_t rng = 88172645463325252ull;
static float urand() {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * 0x1p-53) * 2.f - 1.f;
}
static uint16_t f2bf(float f) {
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

struct shape {
    int b, sq, sk, hq, hkv, d, causal;
};

static void args_of(fattn_bwd_args &a, const shape &c, void *q, void *k, void *v, void *o, void *dout, void *dq,
                    void *dk, void *dv, const float *lse, int det) {
    memset(&a, 0, sizeof a);
    a.p.batch = c.b, a.p.seqlen_q = c.sq, a.p.seqlen_k = c.sk, a.p.heads_q = c.hq, a.p.heads_kv = c.hkv;
    a.p.head_dim = c.d, a.p.head_dim_v = c.d, a.p.causal = c.causal, a.p.softmax_scale = 1.f / sqrtf((float)c.d);
    a.q = fattn_tensor_bshd(q, FATTN_DTYPE_BF16), a.k = fattn_tensor_bshd(k, FATTN_DTYPE_BF16);
    a.v = fattn_tensor_bshd(v, FATTN_DTYPE_BF16), a.o = fattn_tensor_bshd(o, FATTN_DTYPE_BF16);
    a.dout = fattn_tensor_bshd(dout, FATTN_DTYPE_BF16), a.dq = fattn_tensor_bshd(dq, FATTN_DTYPE_BF16);
    a.dk = fattn_tensor_bshd(dk, FATTN_DTYPE_BF16), a.dv = fattn_tensor_bshd(dv, FATTN_DTYPE_BF16);
    a.lse = lse;
    a.deterministic = det;
}

/* returns the worst relative Frobenius error of dq, dk, dv against the CPU */
static double check(fattn_ctx *g, fattn_ctx *cpu, const shape &c, bool timeit, int det) {
    const size_t nq = (size_t)c.b * c.sq * c.hq * c.d, nk = (size_t)c.b * c.sk * c.hkv * c.d;
    const size_t nl = (size_t)c.b * c.hq * c.sq;
    std::vector<uint16_t> hq(nq), hk(nk), hv(nk), hdo(nq);
    for (auto *vv : {&hq, &hdo})
        for (auto &x : *vv) x = f2bf(urand());
    for (auto *vv : {&hk, &hv})
        for (auto &x : *vv) x = f2bf(urand());
    void *q, *k, *v, *o, *dout, *dq, *dk, *dv;
    float *lse;
    CK(cudaMalloc(&q, nq * 2));
    CK(cudaMalloc(&o, nq * 2));
    CK(cudaMalloc(&dout, nq * 2));
    CK(cudaMalloc(&dq, nq * 2));
    CK(cudaMalloc(&k, nk * 2));
    CK(cudaMalloc(&v, nk * 2));
    CK(cudaMalloc(&dk, nk * 2));
    CK(cudaMalloc(&dv, nk * 2));
    CK(cudaMalloc(&lse, nl * 4));
    CK(cudaMemcpy(q, hq.data(), nq * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dout, hdo.data(), nq * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(k, hk.data(), nk * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(v, hv.data(), nk * 2, cudaMemcpyHostToDevice));
    fattn_fwd_args fa;
    memset(&fa, 0, sizeof fa);
    fattn_bwd_args a;
    args_of(a, c, q, k, v, o, dout, dq, dk, dv, lse, det);
    fa.p = a.p, fa.q = a.q, fa.k = a.k, fa.v = a.v, fa.o = a.o, fa.lse = lse;
    FK(g, fattn_fwd(g, &fa));
    CK(cudaMemset(dq, 0xff, nq * 2));
    CK(cudaMemset(dk, 0xff, nk * 2));
    CK(cudaMemset(dv, 0xff, nk * 2));
    FK(g, fattn_bwd(g, &a));
    CK(cudaDeviceSynchronize());
    double worst = 0;
    if (!timeit) {
        std::vector<uint16_t> ho(nq), gq(nq), gk(nk), gv(nk);
        std::vector<float> hl(nl);
        CK(cudaMemcpy(ho.data(), o, nq * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hl.data(), lse, nl * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(gq.data(), dq, nq * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(gk.data(), dk, nk * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(gv.data(), dv, nk * 2, cudaMemcpyDeviceToHost));
        std::vector<uint16_t> cq(nq), ck(nk), cv(nk);
        fattn_bwd_args ca;
        args_of(ca, c, hq.data(), hk.data(), hv.data(), ho.data(), hdo.data(), cq.data(), ck.data(), cv.data(),
                hl.data(), 0);
        FK(cpu, fattn_bwd(cpu, &ca));
        const char *names[3] = {"dq", "dk", "dv"};
        const std::vector<uint16_t> *gg[3] = {&gq, &gk, &gv}, *cc[3] = {&cq, &ck, &cv};
        printf("b%d sq%-5d sk%-5d h%d/%d d%-3d %s%s:", c.b, c.sq, c.sk, c.hq, c.hkv, c.d, c.causal ? "causal" : "full  ",
               det ? " det" : "");
        for (int t = 0; t < 3; ++t) {
            double num = 0, den = 0;
            bool nan = false;
            for (size_t i = 0; i < gg[t]->size(); ++i) {
                const double x = bf2f((*gg[t])[i]), y = bf2f((*cc[t])[i]);
                if (!(x == x)) nan = true;
                num += (x - y) * (x - y);
                den += y * y;
            }
            const double rel = nan ? INFINITY : sqrt(num / (den > 0 ? den : 1));
            worst = std::max(worst, rel);
            printf("  %s %.2e", names[t], rel);
        }
        printf("\n");
    } else {
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        std::vector<float> ms;
        for (int r = 0; r < 7; ++r) {
            CK(cudaEventRecord(e0));
            for (int i = 0; i < 5; ++i) fattn_bwd(g, &a);
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float t;
            CK(cudaEventElapsedTime(&t, e0, e1));
            ms.push_back(t / 5);
        }
        std::sort(ms.begin(), ms.end());
        const double fl = 2.5 * 4.0 * c.b * c.hq * (double)c.sq * c.sk * c.d / (c.causal ? 2 : 1);
        printf("time b%d s%-5d h%d d%-3d %s%s: %.3f ms  %.0f TFLOPs/s (bwd, 2.5x fwd FLOPs)\n", c.b, c.sq, c.hq, c.d,
               c.causal ? "causal" : "full  ", det ? " det" : "", ms[3], fl / ms[3] / 1e9);
    }
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(o), cudaFree(dout), cudaFree(dq), cudaFree(dk), cudaFree(dv);
    cudaFree(lse);
    return worst;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "both";
    fattn_ctx *g = NULL, *cpu = NULL;
    if (fattn_ctx_create(&g, FATTN_BACKEND_CUDA, 0) != FATTN_OK || fattn_ctx_create(&cpu, FATTN_BACKEND_CPU, 0) != FATTN_OK) {
        fprintf(stderr, "ctx: %s\n", fattn_last_error(NULL));
        return 1;
    }
    int bad = 0;
    if (strcmp(mode, "time") != 0) {
        const shape cs[] = {
            {1, 128, 128, 1, 1, 128, 0}, {1, 1, 1, 1, 1, 64, 0},      {1, 17, 17, 2, 1, 128, 0},
            {2, 300, 500, 4, 2, 64, 0},  {1, 1000, 1000, 2, 2, 128, 1}, {1, 100, 1000, 4, 1, 128, 1},
            {1, 1000, 100, 2, 2, 64, 1}, {1, 777, 777, 2, 2, 64, 1},    {2, 513, 257, 8, 2, 128, 0},
            {1, 300, 500, 4, 2, 256, 1}, {2, 257, 129, 4, 1, 256, 0},  {1, 1, 65, 2, 2, 256, 0},
        };
        for (const shape &c : cs)
            for (int det = 0; det < 2; ++det)
                if (check(g, cpu, c, false, det) > 2e-2) ++bad;
    }
    if (strcmp(mode, "check") != 0) {
        for (int d : {64, 128, 256})
            for (int s : {4096, 16384})
                for (int causal = 0; causal < 2; ++causal) {
                    const shape c = {16384 / s, s, s, 2048 / d, 2048 / d, d, causal};
                    check(g, cpu, c, true, 0);
                    if (s == 4096 && d == 128) check(g, cpu, c, true, 1);
                }
    }
    printf("%s\n", bad ? "SOME CHECKS OVER 2e-2" : "all checks within 2e-2");
    return bad != 0;
}
