/* test_fwd.cu - the Hopper 16-bit forward against the FP64 oracle.
 *
 * Random inputs from a fixed seed (printed; FATTN_TEST_SEED=N or =random
 * draws others), O and LSE poisoned with NaN bytes before each call, every
 * element checked: O by its relative Frobenius error and by its worst row's,
 * LSE by its max abs error, with the tolerances (and why) of gpu_check_fwd in
 * gpu_testutil.h.  The oracle runs on the exact 16-bit values the kernel
 * sees, so the error measured is the kernel's own.  softmax_scale, lse NULL,
 * views of larger tensors, PDL off and rising row maxima are in
 * test_fwd_args.cu.
 * Exit 77 (ctest: skipped) when no Hopper GPU is present (FATTN_REQUIRE_GPU=1:
 * a failure). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/oracle.h"
#include "gpu/gpu_testutil.h"
#include "fattn.h"


struct fwd_case {
    int batch, sq, sk, hq, hkv, d, causal;
    fattn_dtype dt;
    tu_layout layout;
    int o_off; /* O placed this many elements past a 16-byte boundary (0: aligned) */
    const char *variant; /* the fattn_ctx_set_option knobs set for this case, for the report */
    int dv;              /* head_dim_v; 0: d */
};

/* run_case with the device memory exhausted around the fattn_fwd call
 * (hog_device_memory), so that a workspace the call wants cannot be made */
static int g_hog = 0;
static size_t g_hog_free = 0; /* free device memory at the hogged call */

/* Allocate device memory in halving chunks until not even 1 MB is left;
 * returns the count of chunks in hog[] (at most 4096). */
static int hog_device_memory(void **hog) {
    int n = 0;
    for (size_t chunk = (size_t)1 << 32; chunk >= ((size_t)1 << 20) && n < 4096;) {
        if (cudaMalloc(&hog[n], chunk) == cudaSuccess) ++n;
        else {
            (void)cudaGetLastError();
            chunk /= 2;
        }
    }
    return n;
}

static int run_case(fattn_ctx *ctx, tu_rng *rng, const fwd_case &c) {
    const int fails_before = tu_failures;
    const int hdv = c.dv ? c.dv : c.d; /* head_dim_v */
    tu_tensor q, k, v, o;
    tu_tensor_alloc(&q, c.dt, c.batch, c.sq, c.hq, c.d, c.layout, 1);
    tu_tensor_alloc(&k, c.dt, c.batch, c.sk, c.hkv, c.d, c.layout, 1);
    tu_tensor_alloc(&v, c.dt, c.batch, c.sk, c.hkv, hdv, c.layout, 1);
    tu_tensor_alloc(&o, c.dt, c.batch, c.sq, c.hq, hdv, c.layout, 1);
    double *hq = (double *)tu_malloc(q.count * 8), *hk = (double *)tu_malloc(k.count * 8);
    double *hv = (double *)tu_malloc(v.count * 8), *ref = (double *)tu_malloc(o.count * 8);
    double *got = (double *)tu_malloc(o.count * 8);
    size_t nlse = (size_t)c.batch * c.hq * c.sq;
    double *ref_lse = (double *)tu_malloc(nlse * 8);
    float *lse = (float *)tu_malloc(nlse * 4);
    tu_fill_normal(rng, hq, q.count);
    tu_fill_normal(rng, hk, k.count);
    tu_fill_normal(rng, hv, v.count);
    tu_tensor_set(&q, hq, hq);
    tu_tensor_set(&k, hk, hk);
    tu_tensor_set(&v, hv, hv);

    void *dq, *dk, *dv, *dout;
    float *dlse;
    CK(cudaMalloc(&dq, q.bytes));
    CK(cudaMalloc(&dk, k.bytes));
    CK(cudaMalloc(&dv, v.bytes));
    CK(cudaMalloc(&dout, o.bytes + 16));
    CK(cudaMalloc(&dlse, nlse * 4));
    CK(cudaMemcpy(dq, q.t.data, q.bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dk, k.t.data, k.bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dv, v.t.data, v.bytes, cudaMemcpyHostToDevice));
    CK(cudaMemset(dout, 0xFF, o.bytes + 16));
    uint8_t *dout_at = (uint8_t *)dout + 2 * c.o_off;
    CK(cudaMemset(dlse, 0xFF, nlse * 4));

    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p.batch = c.batch;
    a.p.seqlen_q = c.sq;
    a.p.seqlen_k = c.sk;
    a.p.heads_q = c.hq;
    a.p.heads_kv = c.hkv;
    a.p.head_dim = c.d;
    a.p.head_dim_v = hdv;
    a.p.causal = c.causal;
    a.q = q.t; a.q.data = dq;
    a.k = k.t; a.k.data = dk;
    a.v = v.t; a.v.data = dv;
    a.o = o.t; a.o.data = dout_at;
    a.lse = dlse;
    static void *hog[4096];
    int nhog = 0;
    if (g_hog) {
        CK(cudaDeviceSynchronize());
        nhog = hog_device_memory(hog);
        size_t total;
        CK(cudaMemGetInfo(&g_hog_free, &total));
    }
    fattn_status st = fattn_fwd(ctx, &a);
    if (st != FATTN_OK) {
        fprintf(stderr, "fattn_fwd: %s: %s\n", fattn_status_string(st), fattn_last_error(ctx));
        tu_failures++;
    }
    cudaError_t e = cudaDeviceSynchronize();
    for (int i = 0; i < nhog; ++i) cudaFree(hog[i]);
    TU_CHECK(e == cudaSuccess, "kernel failed: %s", cudaGetErrorString(e));
    if (e != cudaSuccess) exit(1);
    CK(cudaMemcpy(o.t.data, dout_at, o.bytes, cudaMemcpyDeviceToHost));
    {
        /* the poisoned bytes past O's last element stay untouched: a store
         * of rows past seqlen_q (a TMA box not clipped, a row test off by
         * one) of the last head lands there first */
        uint8_t tail[16];
        const size_t nt = 16 - 2 * (size_t)c.o_off;
        CK(cudaMemcpy(tail, dout_at + o.bytes, nt, cudaMemcpyDeviceToHost));
        size_t bad = 0;
        for (size_t i = 0; i < nt; ++i) bad += tail[i] != 0xFF;
        TU_CHECK(bad == 0, "%zu bytes written past the end of O", bad);
    }
    CK(cudaMemcpy(lse, dlse, nlse * 4, cudaMemcpyDeviceToHost));
    tu_tensor_get(&o, got);

    oracle_problem op;
    memset(&op, 0, sizeof op);
    op.batch = c.batch; op.seqlen_q = c.sq; op.seqlen_k = c.sk; op.heads_q = c.hq; op.heads_kv = c.hkv;
    op.head_dim = c.d; op.head_dim_v = hdv; op.causal = c.causal;
    oracle_fwd(&op, hq, hk, hv, ref, ref_lse);

    char what[256], dvs[16] = "";
    if (hdv != c.d) snprintf(dvs, sizeof dvs, "/%d", hdv);
    snprintf(what, sizeof what, "%s b%d sq%d sk%d h%d/%d d%d%s %s%s%s%s%s", fattn_dtype_name(c.dt), c.batch,
             c.sq, c.sk, c.hq, c.hkv, c.d, dvs, c.causal ? "causal " : "", c.layout == TU_BHSD ? "BHSD" : "BSHD",
             c.o_off ? " O+4B" : "", c.variant ? " " : "", c.variant ? c.variant : "");
    gpu_check_fwd(what, c.dt, got, ref, o.count, hdv, lse, ref_lse, nlse);

    cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dout); cudaFree(dlse);
    tu_tensor_free(&q); tu_tensor_free(&k); tu_tensor_free(&v); tu_tensor_free(&o);
    free(hq); free(hk); free(hv); free(ref); free(got); free(ref_lse); free(lse);
    return tu_failures == fails_before;
}

/* A packed-BSHD causal problem on the device for the tests that compare
 * several runs of one call bit for bit.  q, k, v hold 16-bit patterns
 * 0x3C00 ^ (random sign and low 10 bits): fp16 magnitudes in [1, 2), bf16 in
 * [2^-7, 2).  `outs` outputs of the same shape, poisoned with 0xFF bytes. */
struct dev_problem {
    fattn_fwd_args a;
    void *q, *k, *v, *o[3];
    int outs;
    size_t n; /* elements of each tensor */
};

static void dev_problem_make(dev_problem *dp, tu_rng *rng, fattn_dtype dt, int B, int S, int H, int D, int outs) {
    memset(dp, 0, sizeof *dp);
    dp->n = (size_t)B * S * H * D;
    dp->outs = outs;
    uint16_t *h = (uint16_t *)tu_malloc(dp->n * 2);
    void **src[3] = {&dp->q, &dp->k, &dp->v};
    for (int t = 0; t < 3; ++t) {
        CK(cudaMalloc(src[t], dp->n * 2));
        for (size_t i = 0; i < dp->n; ++i) h[i] = (uint16_t)(0x3C00 ^ (tu_rng_u64(rng) & 0x83FF));
        CK(cudaMemcpy(*src[t], h, dp->n * 2, cudaMemcpyHostToDevice));
    }
    for (int i = 0; i < outs; ++i) {
        CK(cudaMalloc(&dp->o[i], dp->n * 2));
        CK(cudaMemset(dp->o[i], 0xFF, dp->n * 2));
    }
    free(h);
    fattn_fwd_args *a = &dp->a;
    a->p.batch = B; a->p.seqlen_q = a->p.seqlen_k = S; a->p.heads_q = a->p.heads_kv = H;
    a->p.head_dim = D; a->p.causal = 1;
    fattn_tensor t = {dp->q, dt, 0, 0, 0, NULL, 0};
    a->q = t; a->k = t; a->k.data = dp->k; a->v = t; a->v.data = dp->v; a->o = t; a->o.data = dp->o[0];
}

/* Outputs of a dev_problem (copied to the host) still holding the 0xFF
 * poison: elements no call wrote */
static size_t count_poisoned(const uint16_t *h, size_t n) {
    size_t poisoned = 0;
    for (size_t i = 0; i < n; ++i) poisoned += h[i] == 0xFFFF;
    return poisoned;
}

static void dev_problem_free(dev_problem *dp) {
    cudaFree(dp->q); cudaFree(dp->k); cudaFree(dp->v);
    for (int i = 0; i < dp->outs; ++i) cudaFree(dp->o[i]);
}

/* The same causal multi-tile problem on two streams back to back, no host
 * sync between: the context orders its kernels across the stream switch
 * (they share its tile counter), and the second stream's output must equal
 * the first's bit for bit.  Then again on the first stream (counter reused). */
static void two_streams(fattn_ctx *ctx, tu_rng *rng) {
    dev_problem dp;
    dev_problem_make(&dp, rng, FATTN_DTYPE_F16, 2, 1024, 16, 128, 3);
    const size_t n = dp.n;
    cudaStream_t st[2];
    CK(cudaStreamCreateWithFlags(&st[0], cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&st[1], cudaStreamNonBlocking));
    int ok = 1;
    for (int i = 0; i < 3; ++i) {
        dp.a.o.data = dp.o[i];
        ok &= fattn_ctx_set_stream(ctx, st[i % 2]) == FATTN_OK;
        ok &= fattn_fwd(ctx, &dp.a) == FATTN_OK;
    }
    TU_CHECK(ok, "two streams: a call failed: %s", fattn_last_error(ctx));
    CK(cudaDeviceSynchronize());
    uint16_t *h = (uint16_t *)tu_malloc(n * 2), *g = (uint16_t *)tu_malloc(n * 2);
    CK(cudaMemcpy(h, dp.o[0], n * 2, cudaMemcpyDeviceToHost));
    const size_t poisoned = count_poisoned(h, n);
    TU_CHECK(poisoned == 0, "two streams: %zu outputs never written", poisoned);
    for (int i = 1; i < 3; ++i) {
        CK(cudaMemcpy(g, dp.o[i], n * 2, cudaMemcpyDeviceToHost));
        TU_CHECK(memcmp(g, h, n * 2) == 0, "two streams: call %d differs from call 0", i);
    }
    fattn_ctx_set_stream(ctx, NULL);
    cudaStreamDestroy(st[0]);
    cudaStreamDestroy(st[1]);
    dev_problem_free(&dp);
    free(h); free(g);
}

/* A causal call captured into a CUDA graph (global capture mode, the
 * strictest): the graph, replayed twice, and an eager call after it must give
 * the eager result bit for bit (the tile counter is rewound by every run). */
static void graph_capture(fattn_ctx *ctx, tu_rng *rng) {
    dev_problem dp;
    dev_problem_make(&dp, rng, FATTN_DTYPE_BF16, 2, 1000, 8, 128, 2);
    const size_t n = dp.n;
    fattn_fwd_args *a = &dp.a;
    uint16_t *h = (uint16_t *)tu_malloc(n * 2), *g = (uint16_t *)tu_malloc(n * 2);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    TU_CHECK(fattn_ctx_set_stream(ctx, st) == FATTN_OK, "graph: set_stream");
    a->o.data = dp.o[0];
    TU_CHECK(fattn_fwd(ctx, a) == FATTN_OK, "graph: eager call: %s", fattn_last_error(ctx));
    CK(cudaStreamSynchronize(st));
    CK(cudaMemcpy(h, dp.o[0], n * 2, cudaMemcpyDeviceToHost));

    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    a->o.data = dp.o[1];
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    fattn_status fs = fattn_fwd(ctx, a);
    cudaError_t e = cudaStreamEndCapture(st, &graph);
    TU_CHECK(fs == FATTN_OK, "graph: call during capture: %s", fattn_last_error(ctx));
    TU_CHECK(e == cudaSuccess, "graph: end capture: %s", cudaGetErrorString(e));
    if (fs == FATTN_OK && e == cudaSuccess) {
        e = cudaGraphInstantiate(&exec, graph, 0);
        TU_CHECK(e == cudaSuccess, "graph: instantiate: %s", cudaGetErrorString(e));
        for (int r = 0; e == cudaSuccess && r < 2; ++r) {
            CK(cudaMemset(dp.o[1], 0xFF, n * 2));
            e = cudaGraphLaunch(exec, st);
            if (e == cudaSuccess) e = cudaStreamSynchronize(st);
            TU_CHECK(e == cudaSuccess, "graph: replay %d: %s", r, cudaGetErrorString(e));
            CK(cudaMemcpy(g, dp.o[1], n * 2, cudaMemcpyDeviceToHost));
            TU_CHECK(memcmp(g, h, n * 2) == 0, "graph: replay %d differs from the eager call", r);
        }
    }
    (void)cudaGetLastError();
    CK(cudaMemset(dp.o[1], 0xFF, n * 2));
    TU_CHECK(fattn_fwd(ctx, a) == FATTN_OK, "graph: eager call after the graph: %s", fattn_last_error(ctx));
    CK(cudaStreamSynchronize(st));
    CK(cudaMemcpy(g, dp.o[1], n * 2, cudaMemcpyDeviceToHost));
    TU_CHECK(memcmp(g, h, n * 2) == 0, "graph: eager call after the graph differs");
    fattn_ctx_set_stream(ctx, NULL);
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
    dev_problem_free(&dp);
    free(h); free(g);
}

/* Non-causal calls whose last wave of tiles is split along the keys: the
 * pieces are merged by whichever CTA finishes last, and the merge must not
 * depend on which one that is.  Each shape is called seven times; every
 * output must equal the first bit for bit (the merge that started from the
 * last piece's registers failed this in 6, 5 and 6 of the 6 repeats, run 85;
 * perf-notes v36). */
static void split_repeats(fattn_ctx *ctx, tu_rng *rng) {
    const struct { fattn_dtype dt; int B, S, H, D; } shapes[] = {
        {FATTN_DTYPE_BF16, 4, 4096, 16, 128}, /* 2048 tiles: 15.5 waves, the last split */
        {FATTN_DTYPE_F16, 4, 4096, 8, 256},   /* CTA pairs */
        {FATTN_DTYPE_BF16, 2, 4000, 32, 64},  /* 192-row tiles, pieces across tiles */
    };
    for (const auto &sh : shapes) {
        dev_problem dp;
        dev_problem_make(&dp, rng, sh.dt, sh.B, sh.S, sh.H, sh.D, 2);
        dp.a.p.causal = 0;
        const size_t n = dp.n;
        uint16_t *h = (uint16_t *)tu_malloc(n * 2), *g = (uint16_t *)tu_malloc(n * 2);
        dp.a.o.data = dp.o[0];
        TU_CHECK(fattn_fwd(ctx, &dp.a) == FATTN_OK, "split repeats d%d: %s", sh.D, fattn_last_error(ctx));
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(h, dp.o[0], n * 2, cudaMemcpyDeviceToHost));
        const size_t poisoned = count_poisoned(h, n);
        TU_CHECK(poisoned == 0, "split repeats d%d: %zu outputs never written", sh.D, poisoned);
        int differ = 0;
        dp.a.o.data = dp.o[1];
        for (int r = 0; r < 6; ++r) {
            CK(cudaMemset(dp.o[1], 0xFF, n * 2));
            TU_CHECK(fattn_fwd(ctx, &dp.a) == FATTN_OK, "split repeats d%d: %s", sh.D, fattn_last_error(ctx));
            CK(cudaMemcpy(g, dp.o[1], n * 2, cudaMemcpyDeviceToHost));
            differ += memcmp(g, h, n * 2) != 0;
        }
        TU_CHECK(differ == 0, "split repeats d%d %s: %d of 6 repeated calls differ from the first", sh.D,
                 sh.dt == FATTN_DTYPE_BF16 ? "bf16" : "fp16", differ);
        dev_problem_free(&dp);
        free(h); free(g);
    }
}

int main(void) {
    fattn_ctx *ctx = gpu_ctx_or_skip();
    tu_rng rng;
    tu_rng_init(&rng, (uint64_t)tu_seed());
    const fattn_dtype B = FATTN_DTYPE_BF16, H = FATTN_DTYPE_F16;
    const fwd_case cases[] = {
        /* batch sq sk hq hkv d causal dtype layout */
        {1, 1, 1, 1, 1, 64, 0, B, TU_BSHD},
        {1, 17, 17, 2, 2, 128, 0, B, TU_BSHD},
        {1, 17, 17, 2, 2, 128, 1, H, TU_BSHD},
        {2, 128, 128, 2, 1, 64, 0, H, TU_BSHD},
        {2, 128, 128, 2, 2, 256, 1, B, TU_BSHD},
        {1, 1000, 1000, 2, 2, 64, 1, B, TU_BSHD},
        {1, 1000, 1000, 2, 2, 128, 0, H, TU_BHSD},
        {1, 1000, 1000, 1, 1, 256, 0, H, TU_BSHD},
        {1, 1000, 1000, 2, 2, 256, 1, H, TU_BHSD},
        {1, 4097, 4097, 1, 1, 128, 1, B, TU_BSHD},
        {1, 4097, 4097, 1, 1, 64, 0, H, TU_BSHD},
        {1, 4097, 4097, 1, 1, 256, 0, B, TU_BSHD},
        /* unequal lengths, causal bottom-right aligned (rows with no key when sq > sk) */
        {1, 300, 1000, 2, 1, 128, 1, B, TU_BSHD},
        {1, 1000, 300, 2, 1, 128, 1, B, TU_BSHD},
        {2, 129, 17, 2, 2, 64, 1, H, TU_BSHD},
        {1, 17, 700, 2, 2, 256, 0, B, TU_BHSD},
        /* GQA 8:1 and MQA */
        {2, 513, 513, 8, 1, 128, 0, B, TU_BSHD},
        {1, 333, 777, 16, 2, 64, 1, H, TU_BSHD},
        {2, 200, 200, 8, 1, 256, 0, H, TU_BSHD},
        {3, 257, 257, 4, 2, 128, 1, H, TU_BHSD},
        /* more tiles than an H200 has SMs (132), so persistent CTAs take
         * several tiles each: causal (dynamic scheduler, GQA), causal with
         * seqlen_q > seqlen_k (most tiles fully masked), non-causal (static) */
        {2, 1024, 1024, 16, 4, 64, 1, B, TU_BSHD},
        {2, 1500, 300, 12, 4, 128, 1, H, TU_BSHD},
        {1, 1100, 1100, 20, 20, 128, 0, B, TU_BHSD},
        /* non-causal d128/d256 with an even number of 128-row query blocks
         * run as CTA pairs sharing K/V loads (cluster multicast): tails in
         * both lengths, GQA, and more tile pairs than clusters */
        {2, 256, 256, 4, 2, 128, 0, B, TU_BSHD},
        {1, 250, 90, 2, 2, 128, 0, B, TU_BHSD},
        {2, 2000, 1999, 20, 5, 128, 0, B, TU_BSHD},
        {1, 1500, 700, 8, 2, 256, 0, B, TU_BHSD},
        /* O only 4-byte aligned: the epilogue's 4-byte stores instead of the
         * 16-byte ones (with 2 consumer warpgroups) */
        {1, 300, 300, 2, 2, 128, 0, H, TU_BSHD, 2},
        {2, 100, 140, 4, 2, 256, 1, B, TU_BSHD, 2},
        {1, 200, 200, 2, 1, 64, 1, B, TU_BHSD, 2},
        /* ... and in the kernels that otherwise store O with TMA (FwdCfg
         * OTMA: d64 causal from seqlen_k 512, d64 non-causal, d128 causal
         * below 8192, d128 non-causal with BN 160, as the 300 x 300 case
         * above) */
        {1, 600, 700, 2, 1, 64, 1, H, TU_BSHD, 2},
        {1, 300, 500, 4, 2, 128, 1, B, TU_BHSD, 2},
        {2, 400, 333, 4, 2, 64, 0, B, TU_BSHD, 2},
        /* the TMA-store kernels on a shape small enough for the sanitizer
         * runs: 160 tiles on 132 CTAs (a staging buffer used twice), rows past seqlen_q */
        {4, 120, 600, 40, 8, 64, 1, B, TU_BSHD},
        /* 192-row tiles (d64 non-causal; d64 causal from seqlen_k 2048) whose
         * last warpgroups have no row in the sequence sit the tile out
         * (FwdCfg SITOUT): one or two of the three, causal with unequal
         * lengths, GQA; non-causal with several waves of tiles per CTA in
         * the spread static order (SPREAD) */
        {1, 40, 2048, 2, 1, 64, 1, B, TU_BSHD},
        {1, 1970, 2048, 2, 2, 64, 1, B, TU_BHSD},
        {1, 2000, 2100, 4, 1, 64, 1, H, TU_BSHD},
        {2, 1000, 1000, 40, 8, 64, 0, H, TU_BSHD},
        /* a long seqlen_k with short seqlen_q: d64 causal with three
         * warpgroups, whose last sits its tile out; d128 causal from seqlen_k
         * 8192: BN 176 (below it BN 128 with part of Q in registers) */
        {1, 100, 8200, 2, 1, 64, 1, B, TU_BSHD},
        {1, 1000, 8200, 2, 1, 128, 1, H, TU_BSHD},
        /* causal with seqlen_q > seqlen_k where warpgroups skip a first key
         * block they see none of (SKIPDIAG: d64 three warpgroups, d256) */
        {1, 2500, 2048, 2, 2, 64, 1, H, TU_BSHD},
        {1, 700, 300, 2, 1, 256, 1, B, TU_BSHD},
        /* non-causal tiles split along the keys (FwdCfg SPLIT, perf-notes
         * v30, where it saves 6 key blocks, 4 at d128, 10 at d256): past the last full
         * wave (136 tiles: one wave and 4, pieces of one key block; d64 160 tiles of 192 rows whose pieces cross
         * tiles; d256 72 CTA pairs on the pairs that fit), and below one
         * wave all tiles (GQA, BHSD, seqlen_q 1 with two of three
         * warpgroups sitting out); the small ones also run under the
         * sanitizers */
        {1, 1000, 2000, 17, 17, 128, 0, B, TU_BSHD},
        {1, 700, 1500, 40, 8, 64, 0, H, TU_BSHD},
        {1, 512, 1000, 36, 12, 256, 0, B, TU_BSHD},
        {1, 300, 9000, 4, 2, 128, 0, H, TU_BHSD},
        {2, 1, 4097, 8, 1, 64, 0, B, TU_BSHD},
        {1, 30, 2900, 2, 1, 128, 0, B, TU_BSHD},
        {1, 30, 2900, 2, 2, 64, 0, H, TU_BSHD},
        {1, 40, 2000, 2, 1, 256, 0, B, TU_BHSD},
        /* split instances with SITOUT and SPREAD (d128, d256 CTA pairs;
         * perf-notes v31): a tail split past one wave in the spread order
         * whose last m-block's second warpgroup sits out (1030 rows), and
         * CTA pairs below one wave whose second CTA's second warpgroup sits
         * out (180 rows) */
        {1, 1030, 2000, 16, 4, 128, 0, H, TU_BSHD},
        {1, 180, 3000, 4, 2, 256, 0, B, TU_BSHD},
        /* causal head groups (perf-notes v42) with a remainder merged into
         * the last group: 640 (batch, head) pairs of one 192-row tile each
         * in groups of 264 (two waves), 640 = 264 + 376 */
        {4, 1, 2048, 160, 32, 64, 1, H, TU_BSHD},
        /* d128 non-causal takes the key block that pads seqlen_k least
         * (perf-notes v46-v47): 160 keys with TMA stores of O (17, 90, 256,
         * 300 and 1100 above run it too; here 160 tiles on 132 CTAs, small
         * enough for the sanitizers) and 192 keys (9000 above; here GQA 3:1
         * with tails in both lengths over two and a half waves, and four
         * tiles split along the keys, small enough for the sanitizers) */
        {4, 250, 300, 20, 4, 128, 0, H, TU_BSHD},
        {2, 777, 720, 24, 8, 128, 0, B, TU_BSHD},
        {1, 50, 1536, 4, 2, 128, 0, H, TU_BSHD},
    };
    const int only = getenv("FATTN_TEST_SMALL") ? 1 : 0; /* sanitizer runs: small shapes only */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        if (only && (long)cases[i].sq * cases[i].sk > 300 * 300) continue;
        run_case(ctx, &rng, cases[i]);
    }
    /* head dims 96, 192 and 192 with head_dim_v 128 (issue 37), each on the
     * shapes above: one tile; seqlen_q 1 against 4097 keys (MQA, split);
     * causal both ways (rows with no key); BHSD; several waves (causal
     * dynamic, GQA); split tails past one wave and below it; O 4-byte
     * aligned; SKIPDIAG (d192 causal, sq > sk); SITOUT (1030 rows) */
    const int hd[3][2] = {{96, 96}, {192, 192}, {192, 128}};
    for (int i = 0; i < 3; ++i) {
        const int d = hd[i][0], dv = hd[i][1];
        if (gpu_portable_forced() && dv != d) continue; /* the portable engine: 64, 96, 128, 192, 256, dv == d */
        const fwd_case hcases[] = {
            {2, 128, 128, 2, 1, d, 0, H, TU_BSHD, 0, NULL, dv},
            {2, 128, 128, 2, 2, d, 1, B, TU_BSHD, 0, NULL, dv},
            {2, 1, 4097, 8, 1, d, 0, B, TU_BSHD, 0, NULL, dv},
            {2, 17, 300, 2, 2, d, 1, H, TU_BSHD, 0, NULL, dv},
            {2, 129, 17, 2, 2, d, 1, B, TU_BHSD, 0, NULL, dv},
            {1, 250, 300, 20, 4, d, 0, B, TU_BSHD, 2, NULL, dv},
            {1, 200, 200, 2, 1, d, 1, H, TU_BHSD, 2, NULL, dv},
            {1, 1000, 1000, 2, 2, d, 1, B, TU_BHSD, 0, NULL, dv},
            {1, 4097, 4097, 1, 1, d, 0, H, TU_BSHD, 0, NULL, dv},
            {2, 1500, 300, 12, 4, d, 1, H, TU_BSHD, 0, NULL, dv},
            {3, 257, 257, 4, 2, d, 1, B, TU_BHSD, 0, NULL, dv},
            {1, 1000, 2000, 17, 17, d, 0, B, TU_BSHD, 0, NULL, dv},
            {1, 40, 2000, 2, 1, d, 0, H, TU_BHSD, 0, NULL, dv},
            {1, 1030, 2000, 16, 4, d, 0, H, TU_BSHD, 0, NULL, dv},
            {1, 700, 300, 2, 1, d, 1, B, TU_BSHD, 0, NULL, dv},
            {2, 1024, 1024, 16, 4, d, 1, B, TU_BSHD, 0, NULL, dv},
        };
        for (const fwd_case &hc : hcases) {
            if (only && (long)hc.sq * hc.sk > 300 * 300) continue;
            run_case(ctx, &rng, hc);
        }
    }
    /* the ablation's kernels (bf16 non-causal, fattn_ctx_set_option): overlap
     * and/or pingpong off, and the softmax always under the warpgroup's own
     * PV GEMM; tails in both lengths, GQA; d256 250 rows runs as CTA pairs */
    const struct { int ov, pp, upv; const char *name; } knobs[] = {
        {0, 0, 0, "[overlap off, pingpong off]"}, {0, 1, 0, "[pingpong only]"}, {1, 0, 0, "[overlap only]"},
        {1, 0, 1, "[overlap only, softmax under PV]"}, {1, 1, 1, "[softmax under PV]"}};
    for (int d = 64; d <= 256; d *= 2)
        for (const auto &kn : knobs) {
            fattn_ctx_set_option(ctx, FATTN_OPTION_DISABLE_OVERLAP, !kn.ov);
            fattn_ctx_set_option(ctx, FATTN_OPTION_DISABLE_PINGPONG, !kn.pp);
            fattn_ctx_set_option(ctx, FATTN_OPTION_SOFTMAX_UNDER_PV, kn.upv);
            run_case(ctx, &rng, fwd_case{1, 250, 290, 4, 2, d, 0, B, TU_BSHD, 0, kn.name});
        }
    fattn_ctx_set_option(ctx, FATTN_OPTION_DISABLE_OVERLAP, 0);
    fattn_ctx_set_option(ctx, FATTN_OPTION_DISABLE_PINGPONG, 0);
    fattn_ctx_set_option(ctx, FATTN_OPTION_SOFTMAX_UNDER_PV, 0);
    /* the same kernels with the split turned off */
    fattn_ctx_set_option(ctx, FATTN_OPTION_DISABLE_SPLIT, 1);
    run_case(ctx, &rng, fwd_case{1, 1000, 2000, 17, 17, 128, 0, B, TU_BSHD, 0, "[split off]"});
    run_case(ctx, &rng, fwd_case{1, 40, 2000, 2, 1, 256, 0, H, TU_BSHD, 0, "[split off]"});
    fattn_ctx_set_option(ctx, FATTN_OPTION_DISABLE_SPLIT, 0);
    if (!only) {
        split_repeats(ctx, &rng);
        two_streams(ctx, &rng);
        graph_capture(ctx, &rng);
        /* a split whose workspace cannot be made: a fresh context (no
         * workspace yet) with the device memory exhausted around the call,
         * which then runs unsplit.  The kernels it uses are loaded first,
         * by the same call with the split turned off. */
        fattn_ctx *c2 = NULL;
        if (fattn_ctx_create(&c2, FATTN_BACKEND_CUDA, 0) != FATTN_OK) {
            fprintf(stderr, "fattn_ctx_create: %s\n", fattn_last_error(NULL));
            tu_failures++;
        } else {
            const fwd_case oom{1, 300, 9000, 4, 2, 128, 0, B, TU_BSHD, 0, "[split workspace out of memory]"};
            fattn_ctx_set_option(c2, FATTN_OPTION_DISABLE_SPLIT, 1);
            run_case(c2, &rng, oom);
            fattn_ctx_set_option(c2, FATTN_OPTION_DISABLE_SPLIT, 0);
            g_hog = 1;
            run_case(c2, &rng, oom);
            g_hog = 0;
            /* the d128 workspace is 20 MB: the hog must have left less (16 MB
             * leaves room for the 2 MB allocation granularity; other GPU
             * tests running beside this one under ctest -j4 move the free
             * memory by a few MB: 9.5 MB was seen at the call) */
            TU_CHECK(g_hog_free < ((size_t)16 << 20), "device memory left at the hogged call: %zu bytes", g_hog_free);
            printf("split workspace out of memory: %zu bytes of device memory free at the call\n", g_hog_free);
            run_case(c2, &rng, fwd_case{1, 300, 9000, 4, 2, 128, 0, B, TU_BSHD, 0, "[split after the out-of-memory call]"});
            fattn_ctx_free(c2);
        }
    }
    fattn_ctx_free(ctx);
    return tu_finish("gpu fwd");
}
