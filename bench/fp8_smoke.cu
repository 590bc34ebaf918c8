/* fp8_smoke.cu - a quick look at the FP8 forward on the GPU against the CPU
 * engine on the same e4m3 inputs (the CPU engine dequantises and computes in
 * f32; the GPU also rounds P to e4m3, so ~1e-2 relative differences are
 * expected), and its speed.  An experiment, not a test: tests/gpu/
 * test_fwd_fp8.cu is the test.
 * Built as build/bench/bench_fp8_smoke in a CUDA build (bench/CMakeLists.txt).
 *   build/bench/bench_fp8_smoke [time] */
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


static uint64_t rng = 88172645463325252ull;
static float urand() {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 11) * 0x1p-53) * 2.f - 1.f;
}

struct Quant {
    std::vector<uint8_t> code;
    std::vector<float> scale;
    int blk;
};

/* random f32 [b, s, h, d] quantised on the CPU context */
static Quant make(fattn_ctx *cpu, int b, int s, int h, int d, int blk, float mag) {
    std::vector<float> x((size_t)b * s * h * d);
    for (auto &v : x) v = mag * urand();
    Quant q;
    q.blk = blk;
    q.code.resize(x.size());
    q.scale.resize((size_t)b * h * ((s + blk - 1) / blk));
    fattn_quantize_args a;
    memset(&a, 0, sizeof a);
    a.in = fattn_tensor_bshd(x.data(), FATTN_DTYPE_F32);
    a.out = fattn_tensor_bshd(q.code.data(), FATTN_DTYPE_E4M3);
    a.out.scale = q.scale.data();
    a.batch = b, a.seqlen = s, a.heads = h, a.head_dim = d;
    a.granularity = FATTN_QUANT_BLOCK;
    a.block_rows = blk;
    if (fattn_quantize(cpu, &a) != FATTN_OK) {
        fprintf(stderr, "quantize: %s\n", fattn_last_error(cpu));
        exit(1);
    }
    return q;
}

template <class T>
static T *dev(const std::vector<T> &v) {
    T *p;
    CK(cudaMalloc(&p, v.size() * sizeof(T) + 16));
    CK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return p;
}

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static int run(fattn_ctx *gpu, fattn_ctx *cpu, int b, int sq, int sk, int hq, int hk, int d, int causal, int kblk,
               bool timeit) {
    Quant q = make(cpu, b, sq, hq, d, 128, 1.f), k = make(cpu, b, sk, hk, d, kblk, 1.f),
          v = make(cpu, b, sk, hk, d, 128, 1.f);
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p.batch = b, a.p.seqlen_q = sq, a.p.seqlen_k = sk, a.p.heads_q = hq, a.p.heads_kv = hk, a.p.head_dim = d;
    a.p.causal = causal;
    std::vector<float> o_cpu((size_t)b * sq * hq * d), lse_cpu((size_t)b * hq * sq);
    a.q = fattn_tensor_bshd(q.code.data(), FATTN_DTYPE_E4M3), a.q.scale = q.scale.data(), a.q.scale_block = q.blk;
    a.k = fattn_tensor_bshd(k.code.data(), FATTN_DTYPE_E4M3), a.k.scale = k.scale.data(), a.k.scale_block = k.blk;
    a.v = fattn_tensor_bshd(v.code.data(), FATTN_DTYPE_E4M3), a.v.scale = v.scale.data(), a.v.scale_block = v.blk;
    a.o = fattn_tensor_bshd(o_cpu.data(), FATTN_DTYPE_F32);
    a.lse = lse_cpu.data();
    if (!timeit && fattn_fwd(cpu, &a) != FATTN_OK) {
        fprintf(stderr, "cpu fwd: %s\n", fattn_last_error(cpu));
        exit(1);
    }
    fattn_fwd_args g = a;
    g.q.data = dev(q.code), g.q.scale = dev(q.scale);
    g.k.data = dev(k.code), g.k.scale = dev(k.scale);
    g.v.data = dev(v.code), g.v.scale = dev(v.scale);
    uint16_t *o_d;
    float *lse_d;
    const size_t on = (size_t)b * sq * hq * d;
    CK(cudaMalloc(&o_d, on * 2));
    CK(cudaMalloc(&lse_d, (size_t)b * hq * sq * 4));
    CK(cudaMemset(o_d, 0xff, on * 2));
    CK(cudaMemset(lse_d, 0xff, (size_t)b * hq * sq * 4));
    g.o = fattn_tensor_bshd(o_d, FATTN_DTYPE_BF16);
    g.lse = lse_d;
    fattn_status st = fattn_fwd(gpu, &g);
    if (st != FATTN_OK) {
        printf("b%d sq%d sk%d h%d/%d d%d causal%d kblk%d: %s: %s\n", b, sq, sk, hq, hk, d, causal, kblk,
               fattn_status_string(st), fattn_last_error(gpu));
        return 1;
    }
    CK(cudaDeviceSynchronize());
    int bad = 0;
    if (!timeit) {
        std::vector<uint16_t> o_g(on);
        std::vector<float> lse_g((size_t)b * hq * sq);
        CK(cudaMemcpy(o_g.data(), o_d, on * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(lse_g.data(), lse_d, lse_g.size() * 4, cudaMemcpyDeviceToHost));
        double se = 0, sr = 0, mx = 0, lmx = 0;
        size_t nan = 0;
        for (size_t i = 0; i < on; ++i) {
            const float gv = bf16_to_f32(o_g[i]);
            if (!(gv == gv)) ++nan;
            const double e = (double)gv - o_cpu[i];
            se += e * e, sr += (double)o_cpu[i] * o_cpu[i];
            mx = fmax(mx, fabs(e));
        }
        for (size_t i = 0; i < lse_g.size(); ++i)
            if (isfinite(lse_cpu[i])) lmx = fmax(lmx, fabs((double)lse_g[i] - lse_cpu[i]));
            else if (lse_g[i] != lse_cpu[i]) lmx = INFINITY;
        const double rel = sqrt(se / (sr > 0 ? sr : 1));
        bad = nan > 0 || !(rel < 3e-2) || !(lmx < 1e-2);
        printf("%s b%d sq%d sk%d h%d/%d d%d causal%d kblk%d: rel %.3e max %.3e lse %.3e nan %zu\n", bad ? "BAD" : "ok ",
               b, sq, sk, hq, hk, d, causal, kblk, rel, mx, lmx, nan);
    } else {
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        std::vector<float> ms;
        for (int r = 0; r < 30; ++r) {
            CK(cudaEventRecord(e0));
            for (int i = 0; i < 5; ++i) fattn_fwd(gpu, &g);
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float t;
            CK(cudaEventElapsedTime(&t, e0, e1));
            ms.push_back(t / 5);
        }
        std::sort(ms.begin(), ms.end());
        const double fl = 4.0 * b * hq * (double)sq * sk * d / (causal ? 2 : 1);
        printf("time b%d s%d h%d d%d causal%d: %.3f ms  %.0f TFLOPs/s\n", b, sq, hq, d, causal, ms[15],
               fl / ms[15] / 1e9);
    }
    cudaFree((void *)g.q.data), cudaFree(g.q.scale), cudaFree((void *)g.k.data), cudaFree(g.k.scale);
    cudaFree((void *)g.v.data), cudaFree(g.v.scale), cudaFree(o_d), cudaFree(lse_d);
    return bad;
}

int main(int argc, char **argv) {
    fattn_ctx *gpu = NULL, *cpu = NULL;
    if (fattn_ctx_create(&gpu, FATTN_BACKEND_CUDA, 0) != FATTN_OK || fattn_ctx_create(&cpu, FATTN_BACKEND_CPU, 0)) {
        fprintf(stderr, "contexts: %s\n", fattn_last_error(NULL));
        return 1;
    }
    int bad = 0;
    if (argc > 1 && !strcmp(argv[1], "time")) {
        for (int d : {64, 128, 256})
            for (int s : {1024, 4096, 16384})
                for (int c : {0, 1}) run(gpu, cpu, 16384 / s, s, s, 2048 / d, 2048 / d, d, c, 128, true);
        return 0;
    }
    for (int d : {64, 128, 256}) {
        bad += run(gpu, cpu, 1, 128, 128, 1, 1, d, 0, 128, false);
        bad += run(gpu, cpu, 2, 300, 517, 4, 2, d, 0, 128, false);
        bad += run(gpu, cpu, 1, 1000, 1000, 2, 2, d, 1, 128, false);
        bad += run(gpu, cpu, 1, 200, 777, 4, 1, d, 1, 256, false);
        bad += run(gpu, cpu, 1, 777, 200, 2, 2, d, 1, 128, false);
        bad += run(gpu, cpu, 1, 17, 4097, 2, 1, d, 0, 1, false);
        bad += run(gpu, cpu, 2, 1024, 1024, 2, 2, d, 1, 1, false);
    }
    printf("%s (%d bad)\n", bad ? "FAILED" : "all ok", bad);
    return bad != 0;
}
