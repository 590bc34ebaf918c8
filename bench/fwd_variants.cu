/* fwd_variants.cu - kernel experiments for the Hopper forward (llm.c style:
 * each variant is one FwdCfg instance; the variants of one (head dim, causal)
 * group are checked against the group's first and timed interleaved, 5 rounds,
 * each starting at the next variant, so that drift of the machine and the
 * clock a slower predecessor leaves hit them alike).
 * Build (from the repo root, after the library is built into build-gpu/):
 *   nvcc -gencode=arch=compute_90a,code=sm_90a -std=c++17 -O3 --use_fast_math -Iinclude -Isrc \
 *        bench/fwd_variants.cu build-gpu/libfattn.a -cudart static -o build-gpu/fwd_variants
 * Run: [FV_NORMAL=1] [FV_SEED=n] [FV_SETTLE_MS=ms] build-gpu/fwd_variants [seqlen ...]
 * (FV_SETTLE_MS: each variant runs alone that long before its samples in
 * every round, as in compare.py; use it for changes in DRAM traffic, v42)
 * (TFLOPs/s per variant and seqlen, bf16,
 * 16k tokens, hidden 2048, the largest difference from the group's first
 * variant, the median time, SM clock and board power of the samples (NVML,
 * 0 where it is missing); seqlens 1024 2048 4096 8192 16384 unless given, at
 * most 8).
 * Results of past runs: bench/results-ab-run*.txt. */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/cuda/hopper/fwd_sm90_launch.cuh"
#include "fattn.h"

typedef fattn_status (*run_fn)(fattn_ctx *, const fattn_fwd_args *);
struct variant {
    const char *name;
    int d, causal;
    run_fn fn;
    int no_pdl; /* FATTN_OPTION_DISABLE_PDL */
    int no_split; /* FATTN_OPTION_DISABLE_SPLIT */
    int min_gain; /* SPLIT's minimum gain in key blocks (fwd_split_min_gain_ab; 0: the library's rule) */
    int sk_mult;  /* > 0: seqlen_k rounded down to a multiple of it (no partial last key block) */
    int sk_x;     /* > 1: seqlen_k = sk_x * seqlen (then rounded down as above), K and V sized for it */
    int hg;       /* causal head groups (fwd_head_group_ab): 0 the library's rule, else a mode of fwd_sm90_launch.cuh's */
};
/* One variant: FwdCfg<D, BN, NC, STAGES, CAUSAL, bf16, overlap, pingpong, ...>
 * with the later options at their defaults (V, V_NOPDL: launched without
 * programmatic dependent launch) or spelled out (V_OPT: OVERLAP (1 measured
 * wait placement, 2 ptxas's, 3 fenced), SCHED, LAZY, CLUSTER, OSTORE, XTILE as
 * FwdCfg documents them). */
#define V_OPT(name, D, BN, NC, ST, CAUSAL, OV, SCHED, LAZY, CL, OS, XT) \
    {name, D, CAUSAL, fwd_sm90_run<FwdCfg<D, BN, NC, ST, CAUSAL, true, OV, true, SCHED, LAZY, CL, OS, XT>>, 0}
#define V(name, D, BN, NC, ST, CAUSAL) V_OPT(name, D, BN, NC, ST, CAUSAL, 1, -1, -1, 1, -1, 0)
#define V_NOPDL(name, D, BN, NC, ST, CAUSAL) {name, D, CAUSAL, fwd_sm90_run<FwdCfg<D, BN, NC, ST, CAUSAL, true, 1, true>>, 1}
/* A/B against an earlier kernel: build with -DFATTN_AB_SNAPSHOT='"path"' naming a
 * copy of the old fwd_sm90.cuh + launch code with its symbols renamed *V3/_v3
 * (not kept in the repository).  The first variant of each (d, causal) group is
 * the reference the others are diffed against. */
#ifdef FATTN_AB_SNAPSHOT
#include FATTN_AB_SNAPSHOT
#define OLD(name, D, BN, NC, ST, CAUSAL) {name, D, CAUSAL, fwd_sm90_run_v3<FwdCfgV3<D, BN, NC, ST, CAUSAL, true, true, true>>, 0},
#else
#define OLD(name, D, BN, NC, ST, CAUSAL)
#endif
/* V_SK: the shipped kernel of a causal shape with SITOUT (perf-notes v22)
 * and SKIPDIAG (v23) on or off. */
#define V_SK(name, D, BN, NC, ST, QE, SL, SO, SK) \
    {name, D, 1, fwd_sm90_run<FwdCfg<D, BN, NC, ST, true, true, 1, true, -1, -1, 1, -1, 0, QE, SL, 0, 0, 0, SO, 0, SK>>, 0}
/* V_CFG: any FwdCfg, spelled out; V_CFG_NOSPLIT: launched with FATTN_OPTION_DISABLE_SPLIT */
#define V_CFG(name, D, CAUSAL, ...) {name, D, CAUSAL, fwd_sm90_run<FwdCfg<__VA_ARGS__>>, 0, 0}
#define V_CFG_NOSPLIT(name, D, CAUSAL, ...) {name, D, CAUSAL, fwd_sm90_run<FwdCfg<__VA_ARGS__>>, 0, 1}
/* V_CFG_GAIN: any FwdCfg, split wherever that saves at least g key blocks */
#define V_CFG_GAIN(name, g, D, CAUSAL, ...) {name, D, CAUSAL, fwd_sm90_run<FwdCfg<__VA_ARGS__>>, 0, 0, g}
/* V_CFG_WHOLE: any FwdCfg, run with seqlen_k rounded down to a multiple of m
 * (its output is not comparable: maxdiff is printed but means nothing) */
#define V_CFG_WHOLE(name, m, D, CAUSAL, ...) {name, D, CAUSAL, fwd_sm90_run<FwdCfg<__VA_ARGS__>>, 0, 0, 0, m}
/* V_CFG_KEYS: any FwdCfg, launched without the split, with seqlen_k = x
 * times the length rounded down to a multiple of m: the same tiles with x
 * times the key blocks, to fit time = per tile + per block (run 89) */
#define V_CFG_KEYS(name, x, m, D, CAUSAL, ...) {name, D, CAUSAL, fwd_sm90_run<FwdCfg<__VA_ARGS__>>, 0, 1, 0, m, x}
/* V_CFG_HG: any FwdCfg, causal heads grouped by g (fwd_head_group_ab) */
#define V_CFG_HG(name, g, D, CAUSAL, ...) {name, D, CAUSAL, fwd_sm90_run<FwdCfg<__VA_ARGS__>>, 0, 0, 0, 0, 0, g}
/* Configurations (FwdCfg's parameters up to UNIWG; V_CFG appends OTMA):
 * d128 non-causal BN 176 (shipped, the split instance) and BN 192 with
 * eager and lazy rescaling (perf-notes v53), d256 CTA pairs and d256
 * causal with 16- and 4-byte O stores: this list ran as run 124.
 * Earlier lists, with their configurations, are in perf-notes: runs 119
 * (d128 BN 128 with QEARLY and XTILE, v50), 107 and 113 (BN 160 / 192,
 * d64 OTMA 1), 95-98 (head groups, v42), 89 (V_CFG_KEYS), 99-100 (OTMA,
 * v43-v43b), 104 (d64 causal: QREG 1, three stages, QEARLY, v45), 106 (BN
 * 160 with and without OTMA 2); runs 90 and 92 (QPF, KVPF), 102 (OSTORE 0),
 * 103 (OLATE), 121 (LSUM, v51) and 122 (PSUM, v52) ran code that is no
 * longer here (102 and 103: commits 249ca85 and 1f4454f, v44; 121-122: in
 * no commit). */
#define C176N 128, 176, 2, 2, false, true, 1, true, -1, -1, 1, -1, 0, 0, false, 0, 0, 0, 2, 2, 0, 0, 1, 0
#define C192N 128, 192, 2, 2, false, true, 1, true, -1, -1, 1, -1, 0, 0, false, 0, 0, 0, 2, 2, 0, 0, 1, 0
#define C256P 256, 80, 2, 2, false, true, 1, true, -1, -1, 2, -1, 0, 0, false, 0, 0, 0, 2, 2, 0, 0, 1, 0
#define C256P4 256, 80, 2, 2, false, true, 1, true, -1, -1, 2, 4, 0, 0, false, 0, 0, 0, 2, 2, 0, 0, 1, 0
#define C256C 256, 80, 2, 2, true, true, 1, true, -1, -1, 1, -1, 0, 0, false, 0, 0, 0, 1, 0, 1, 0, 0, 0
#define C256C4 256, 80, 2, 2, true, true, 1, true, -1, -1, 1, 4, 0, 0, false, 0, 0, 0, 1, 0, 1, 0, 0, 0
#define C176L 128, 176, 2, 2, false, true, 1, true, -1, 1, 1, -1, 0, 0, false, 0, 0, 0, 2, 2, 0, 0, 1, 0
#define C192L 128, 192, 2, 2, false, true, 1, true, -1, 1, 1, -1, 0, 0, false, 0, 0, 0, 2, 2, 0, 0, 1, 0
static const variant variants[] = {
    V_CFG("d128 BN176 shipped", 128, 0, C176N, 0),
    V_CFG("d128 BN176 LAZY", 128, 0, C176L, 0),
    V_CFG("d128 BN192", 128, 0, C192N, 0),
    V_CFG("d128 BN192 LAZY", 128, 0, C192L, 0),
    V_CFG("d128 BN176 again", 128, 0, C176N, 0),
    V_CFG("d256 pairs shipped", 256, 0, C256P, 0),
    V_CFG("d256 pairs OSTORE 4", 256, 0, C256P4, 0),
    V_CFG("d256 pairs again", 256, 0, C256P, 0),
    V_CFG("d256 causal shipped", 256, 1, C256C, 0),
    V_CFG("d256 causal OSTORE 4", 256, 1, C256C4, 0),
    V_CFG("d256 causal again", 256, 1, C256C, 0),
};

/* The SM clock and board power through NVML (dlopen'd, so nothing more to
 * link; absent on a machine without the driver's libnvidia-ml): read after
 * each timed sample, so a variant's median clock shows when the power limit,
 * not the kernel, made it faster or slower (perf-notes v41, run 94). */
struct nvml_probe {
    void *dev = NULL;
    int (*clock)(void *, int, unsigned *) = NULL;
    int (*power)(void *, unsigned *) = NULL;
    bool init() {
        void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
        if (!lib) return false;
        auto nvml_init = (int (*)(void))dlsym(lib, "nvmlInit_v2");
        auto by_bus = (int (*)(const char *, void **))dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
        clock = (int (*)(void *, int, unsigned *))dlsym(lib, "nvmlDeviceGetClockInfo");
        power = (int (*)(void *, unsigned *))dlsym(lib, "nvmlDeviceGetPowerUsage");
        char bus[32];
        if (!nvml_init || !by_bus || !clock || !power || nvml_init() != 0) return false;
        if (cudaDeviceGetPCIBusId(bus, sizeof bus, 0) != cudaSuccess || by_bus(bus, &dev) != 0) return false;
        return true;
    }
    /* SM clock in MHz (NVML_CLOCK_SM = 1) and power in W; 0 when unknown */
    void read(float *mhz, float *watts) const {
        unsigned c = 0, mw = 0;
        if (dev && clock(dev, 1, &c) == 0) *mhz = (float)c;
        else *mhz = 0.f;
        if (dev && power(dev, &mw) == 0) *watts = mw / 1000.f;
        else *watts = 0.f;
    }
};

static float median15(float *x) {
    for (int i = 0; i < 15; ++i) for (int j = i + 1; j < 15; ++j) if (x[j] < x[i]) { float y = x[i]; x[i] = x[j]; x[j] = y; }
    return x[7];
}

static float bf16f(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }

int main(int argc, char **argv) {
    fattn_ctx *ctx;
    if (fattn_ctx_create(&ctx, FATTN_BACKEND_CUDA, 0) != FATTN_OK) { printf("SKIP: no GPU\n"); return 77; }
    /* seqlens: the arguments (at most 8, each dividing 16384 tokens into
     * whole sequences or not: batch = 16384 / seqlen), else five defaults */
    int seqlens[8] = {1024, 2048, 4096, 8192, 16384};
    int nseq = 5;
    if (argc > 1) {
        nseq = 0;
        for (int i = 1; i < argc && nseq < 8; ++i) {
            const int sl = atoi(argv[i]);
            if (sl < 1 || sl > 16384) { fprintf(stderr, "seqlen %s: must be 1..16384\n", argv[i]); return 2; }
            seqlens[nseq++] = sl;
        }
    }
    const size_t maxel = (size_t)16384 * 2048;
    uint16_t *q, *k, *v, *o, *o0[8];
    /* K and V hold 4 copies of their maxel elements (V_CFG_KEYS up to 4x) */
    cudaMalloc(&q, maxel * 2); cudaMalloc(&k, 4 * maxel * 2); cudaMalloc(&v, 4 * maxel * 2);
    cudaMalloc(&o, maxel * 2);
    for (int si = 0; si < nseq; ++si) cudaMalloc(&o0[si], maxel * 2); /* the reference output per seqlen */
    uint16_t *h = (uint16_t *)malloc(maxel * 2);
    srand(getenv("FV_SEED") ? (unsigned)atoi(getenv("FV_SEED")) : 5u);
    if (getenv("FV_NORMAL")) {
        /* independent N(0, 1) Q, K and V, as bench/compare.py draws them */
        printf("inputs: independent normal Q, K, V\n");
        uint16_t *dst[3] = {q, k, v};
        for (int x = 0; x < 3; ++x) {
            for (size_t i = 0; i < maxel; ++i) {
                const double u1 = (rand() + 1.0) / ((double)RAND_MAX + 2.0), u2 = rand() / ((double)RAND_MAX + 1.0);
                const float f = (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
                uint32_t u;
                memcpy(&u, &f, 4);
                h[i] = (uint16_t)(u >> 16);
            }
            cudaMemcpy(dst[x], h, maxel * 2, cudaMemcpyHostToDevice);
        }
    } else {
        /* uniform in [-1, 1]: K is Q with its lowest bit flipped, V is -K */
        printf("inputs: uniform Q; K = Q (last bit flipped), V = -K\n");
        for (size_t i = 0; i < maxel; ++i) { float f = (float)rand() / RAND_MAX * 2 - 1; uint32_t u; memcpy(&u, &f, 4); h[i] = u >> 16; }
        cudaMemcpy(q, h, maxel * 2, cudaMemcpyHostToDevice);
        for (size_t i = 0; i < maxel; ++i) h[i] ^= 0x0001;
        cudaMemcpy(k, h, maxel * 2, cudaMemcpyHostToDevice);
        for (size_t i = 0; i < maxel; ++i) h[i] ^= 0x8000;
        cudaMemcpy(v, h, maxel * 2, cudaMemcpyHostToDevice);
    }
    for (int c = 1; c < 4; ++c) {
        cudaMemcpy(k + c * maxel, k, maxel * 2, cudaMemcpyDeviceToDevice);
        cudaMemcpy(v + c * maxel, v, maxel * 2, cudaMemcpyDeviceToDevice);
    }
    uint16_t *ha = (uint16_t *)malloc(maxel * 2), *hb = (uint16_t *)malloc(maxel * 2);
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    /* a variant's options and bench knobs, for the calls that follow */
    auto select = [&](const variant &va) {
        fattn_ctx_set_option(ctx, FATTN_OPTION_DISABLE_PDL, va.no_pdl);
        fattn_ctx_set_option(ctx, FATTN_OPTION_DISABLE_SPLIT, va.no_split);
        fwd_split_min_gain_ab = va.min_gain;
        fwd_head_group_ab = va.hg;
    };
    /* the selected variant alone for ms milliseconds, in bursts of 10 calls */
    auto run_alone = [&](const variant &va, fattn_fwd_args &args, float ms_total) {
        cudaEventRecord(e0);
        for (float ms = 0.f; ms < ms_total;) {
            for (int c = 0; c < 10; ++c) va.fn(ctx, &args);
            cudaEventRecord(e1);
            cudaEventSynchronize(e1);
            cudaEventElapsedTime(&ms, e0, e1);
        }
    };
    nvml_probe nv;
    if (!nv.init()) nv.dev = NULL;
    const float settle_ms = getenv("FV_SETTLE_MS") ? (float)atof(getenv("FV_SETTLE_MS")) : 0.f;
    if (settle_ms > 0.f) printf("each variant runs alone for %.0f ms before its samples in every round\n", settle_ms);
    printf("%-24s %6s %9s %9s %9s %6s %5s\n", "variant", "seqlen", "TFLOPs/s", "maxdiff", "us", "MHz", "W");
    const int nvar = (int)(sizeof variants / sizeof variants[0]);
    /* variants with the same (d, causal) form a group: checked against the
     * group's first, and timed interleaved (round r times every variant of
     * the group once) so that drift of the machine hits them alike */
    for (int g0 = 0, g1; g0 < nvar; g0 = g1) {
        for (g1 = g0 + 1; g1 < nvar && variants[g1].d == variants[g0].d && variants[g1].causal == variants[g0].causal; ++g1) {
        }
        const int d = variants[g0].d, causal = variants[g0].causal;
        for (int si = 0; si < nseq; ++si) {
            int s = seqlens[si], b = 16384 / s, hh = 2048 / d;
            fattn_fwd_args a; memset(&a, 0, sizeof a);
            a.p.batch = b; a.p.seqlen_q = a.p.seqlen_k = s; a.p.heads_q = a.p.heads_kv = hh;
            a.p.head_dim = a.p.head_dim_v = d; a.p.softmax_scale = 1.f / sqrtf((float)d); a.p.causal = causal;
            fattn_tensor t = {q, FATTN_DTYPE_BF16, (int64_t)s * hh * d, (int64_t)hh * d, d, NULL, 0};
            a.q = t; a.k = t; a.k.data = k; a.v = t; a.v.data = v; a.o = t; a.o.data = o;
            const size_t n = (size_t)b * s * hh * d;
            float md[32] = {0};
            int ok[32] = {0};
            fattn_fwd_args av[32]; /* per variant: seqlen_k cut for V_CFG_WHOLE */
            for (int vi = g0; vi < g1; ++vi) {
                av[vi - g0] = a;
                const int sx = variants[vi].sk_x > 1 ? variants[vi].sk_x * s : s;
                if (variants[vi].sk_mult > 0 && sx >= variants[vi].sk_mult) av[vi - g0].p.seqlen_k = sx / variants[vi].sk_mult * variants[vi].sk_mult;
                else av[vi - g0].p.seqlen_k = sx;
                av[vi - g0].k.stride_batch = av[vi - g0].v.stride_batch = (int64_t)av[vi - g0].p.seqlen_k * hh * d;
            }
            for (int vi = g0; vi < g1; ++vi) {
                const variant &va = variants[vi];
                cudaMemset(o, 0xFF, n * 2);
                select(va);
                if (va.fn(ctx, &av[vi - g0]) != FATTN_OK) { printf("%s: %s\n", va.name, fattn_last_error(ctx)); continue; }
                cudaDeviceSynchronize();
                ok[vi - g0] = 1;
                if (vi == g0) cudaMemcpy(o0[si], o, n * 2, cudaMemcpyDeviceToDevice);
                else {
                    cudaMemcpy(ha, o, n * 2, cudaMemcpyDeviceToHost); cudaMemcpy(hb, o0[si], n * 2, cudaMemcpyDeviceToHost);
                    for (size_t i = 0; i < n; ++i) { float x = fabsf(bf16f(ha[i]) - bf16f(hb[i])); if (!(x <= md[vi - g0])) md[vi - g0] = x; }
                }
            }
            /* the group's first variant runs alone for 500 ms first: the GPU
             * then starts the rounds at the clock its 700 W limit sustains
             * (run 33: started cold, the first timing of the run was 15% above
             * an identical later one) */
            select(variants[g0]);
            run_alone(variants[g0], av[0], 500.f);
            /* 5 rounds x 3 samples, each (events around 10 back-to-back calls)
             * / 10, so host-side launch cost overlaps the previous call */
            float ts[32][15], mhz[32][15], watts[32][15];
            /* round r starts at the group's variant r (mod the group's
             * size): a variant that always followed a slower one ran ~1.5%
             * faster than its identical twin (run 75, perf-notes v32) */
            for (int r = 0; r < 5; ++r)
                for (int vj = 0; vj < g1 - g0; ++vj) {
                    const int vi = g0 + (vj + r) % (g1 - g0);
                    if (!ok[vi - g0]) continue;
                    const variant &va = variants[vi];
                    select(va);
                    for (int w = 0; w < 2; ++w) va.fn(ctx, &av[vi - g0]);
                    /* FV_SETTLE_MS: the variant alone first, as compare.py's
                     * turns, so its samples run at the clock its own draw
                     * sustains at the power limit (v42: short samples after
                     * other variants overstated a schedule that reads more
                     * from DRAM) */
                    if (settle_ms > 0.f) run_alone(va, av[vi - g0], settle_ms);
                    for (int j = 0; j < 3; ++j) {
                        cudaEventRecord(e0);
                        for (int c = 0; c < 10; ++c) va.fn(ctx, &av[vi - g0]);
                        cudaEventRecord(e1);
                        cudaEventSynchronize(e1);
                        float ms;
                        cudaEventElapsedTime(&ms, e0, e1);
                        ts[vi - g0][3 * r + j] = ms / 10;
                        nv.read(&mhz[vi - g0][3 * r + j], &watts[vi - g0][3 * r + j]);
                    }
                }
            for (int vi = g0; vi < g1; ++vi) {
                if (!ok[vi - g0]) continue;
                const float t = median15(ts[vi - g0]);
                const float f = median15(mhz[vi - g0]), w = median15(watts[vi - g0]);
                double fl = 4.0 * b * hh * (double)s * av[vi - g0].p.seqlen_k * d * (causal ? 0.5 : 1.0);
                printf("%-24s %6d %9.1f %9.2e %9.1f %6.0f %5.0f\n", variants[vi].name, s, fl / (t * 1e-3) / 1e12, md[vi - g0],
                       t * 1e3, f, w);
            }
            fflush(stdout);
        }
    }
    cudaError_t e = cudaDeviceSynchronize();
    printf("final: %s\n", cudaGetErrorString(e));
    return 0;
}
