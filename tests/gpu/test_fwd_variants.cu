/* test_fwd_variants.cu - the Hopper forward's variants (issue 37: the LOCAL
 * kernels, fwd_sm90_kernels.cuh) against the FP64 oracle: sliding windows,
 * softcap, learnable sinks and their composition; 16-bit fixed-length and
 * variable-length batches, and FP8 (e4m3) with a window (fattn_fwd on e4m3
 * tensors against the oracle, fattn_fwd_fp8 against the CPU engine's).
 *
 * Shapes with tails (seqlens 1, 17, 1000, 4097), GQA, causal with unequal
 * lengths both ways, head dims 64/128/256 (16-bit also 96, 192 and 192 with
 * head_dim_v 128), bf16 and f16; windows (0, 0),
 * (1, 1), (37, 5) (smaller than a tile), longer than the sequence,
 * left-only, right-only, and with causal; sinks -30, 0, +30 (f16: +8, since
 * +30 scales O below f16's smallest subnormal) and NULL; softcap 15 and 30
 * with Q scaled up 8x (scores of standard deviation ~8 at softmax_scale
 * 1/sqrt(d): most are capped).  Inputs N(0,1) from a fixed seed
 * (FATTN_TEST_SEED overrides); O and LSE poisoned with NaN bytes before each
 * call; every element checked.  The oracle runs on the exact values the
 * kernel sees (16-bit: rounded; FP8: the dequantised codes).
 *
 * Tolerances (per precision):
 *   16-bit: gpu_check_fwd's (gpu_testutil.h: O relative Frobenius bf16 1e-2,
 *     f16 2e-3; worst row bf16 1.6e-2, f16 3.9e-3; LSE max abs 1e-3), plus,
 *     with softcap, cap 2^-11 on each (2 cap 2^-11 on the worst row): the
 *     kernel's tanh.approx.f32 errs by at most 2^-11 relative, so a capped
 *     score by at most cap 2^-11 absolute, and each softmax weight by that
 *     much relative (O's relative error and the LSE's absolute one are
 *     bounded by it, plus the plain kernel's terms).  A masking bug (a key
 *     too many or too few in a window of <= 43 keys) moves a row by > 0.1.
 *   FP8 with a window: O relative Frobenius 0.08, worst row 0.25, LSE max abs
 *     2e-2.  P is rounded to e4m3 before the PV product (3 mantissa bits:
 *     relative error <= 2^-4, RMS ~3.6%, and O's relative error is of that
 *     order); LSE is summed on the unrounded P.  A control checks that the
 *     same output against the oracle without the window fails these bounds
 *     by far (the window changes the result more than the tolerance).
 * Also: refused calls (FP8 with softcap or a sink; softcap on the decoding
 * kernel at d256 with 32 rows) return UNSUPPORTED and leave O as it was.
 * The decoding kernel's variants (seqused_k, paged caches, split keys):
 * tests/gpu/test_decode.cu.
 * With FATTN_CUDA_ENGINE=portable (ctest's gpu_portable_test_fwd_variants)
 * the 16-bit cases run on the portable engine's LOCAL instances
 * (fwd_portable.cuh), those of its head dims (64, 96, 128, 192, 256,
 * head_dim_v equal: 192/128 is skipped); the FP8 cases are skipped with a
 * printed reason (it has no FP8 forward), and the refused calls must still
 * be refused.  The test is
 * forward-only: the backward's variants are test_bwd_variants.cu's, which
 * the portable engine refuses.
 * Exit 77 without a Hopper GPU (FATTN_REQUIRE_GPU=1: a failure). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "common/oracle.h"
#include "gpu/gpu_testutil.h"
#include "fattn.h"

enum { SINK_NONE = 0, SINK_M30, SINK_0, SINK_P30, SINK_P8 };
static const double sink_base[] = {0, -30, 0, 30, 8};

struct vcase {
    std::vector<int> lq, lk; /* per sequence; fixed-length: one entry and batch */
    int batch;               /* fixed-length batch (ignored with varlen) */
    bool varlen;
    int hq, hkv, d, causal;
    fattn_dtype dt;
    int window, wl, wr;
    double softcap;
    int sink;
    double qmul; /* Q scaled up (large logits) */
    int dv = 0;  /* head_dim_v; 0: d */
};

static vcase mk(fattn_dtype dt, int d, int B, int sq, int sk, int hq, int hkv, int causal, int window, int wl, int wr,
                double cap = 0, int sink = SINK_NONE, double qmul = 1) {
    vcase c;
    c.lq = {sq}, c.lk = {sk}, c.batch = B, c.varlen = false, c.hq = hq, c.hkv = hkv, c.d = d, c.causal = causal;
    c.dt = dt, c.window = window, c.wl = wl, c.wr = wr, c.softcap = cap, c.sink = sink, c.qmul = qmul;
    return c;
}

static void run_case(fattn_ctx *ctx, tu_rng *rng, const vcase &c) {
    const int B = c.varlen ? (int)c.lq.size() : c.batch, HQ = c.hq, HK = c.hkv, D = c.d, DV = c.dv ? c.dv : c.d;
    std::vector<int32_t> cq(B + 1, 0), ck(B + 1, 0);
    int maxq = 0, maxk = 0;
    for (int b = 0; b < B; ++b) {
        const int lq = c.varlen ? c.lq[b] : c.lq[0], lk = c.varlen ? c.lk[b] : c.lk[0];
        cq[b + 1] = cq[b] + lq, ck[b + 1] = ck[b] + lk;
        maxq = lq > maxq ? lq : maxq, maxk = lk > maxk ? lk : maxk;
    }
    const int TQ = cq[B], TK = ck[B];
    const size_t nq = (size_t)TQ * HQ * D, nk = (size_t)TK * HK * D, nlse = (size_t)HQ * TQ;
    const size_t nv = (size_t)TK * HK * DV, no = (size_t)TQ * HQ * DV;
    std::vector<double> q(nq), k(nk), v(nv), ref(no), ref_lse(nlse), got(no), sink(HQ);
    tu_fill_normal(rng, q.data(), nq);
    tu_fill_normal(rng, k.data(), nk);
    tu_fill_normal(rng, v.data(), nv);
    for (size_t i = 0; i < nq; ++i) q[i] *= c.qmul;
    tu_round_to(q.data(), nq, c.dt);
    tu_round_to(k.data(), nk, c.dt);
    tu_round_to(v.data(), nv, c.dt);
    std::vector<float> sinkf(HQ);
    for (int h = 0; h < HQ; ++h) sinkf[h] = (float)(sink_base[c.sink] + 0.25 * (h % 3)), sink[h] = sinkf[h];
    std::vector<uint16_t> h16(std::max(std::max(nq, no), std::max(nk, nv)));
    void *dq, *dk, *dv, *dout;
    float *dlse, *dsink = NULL;
    int32_t *dcq = NULL, *dck = NULL;
    CK(cudaMalloc(&dq, nq * 2));
    CK(cudaMalloc(&dk, nk * 2));
    CK(cudaMalloc(&dv, nv * 2));
    CK(cudaMalloc(&dout, no * 2));
    CK(cudaMalloc(&dlse, nlse * 4));
    tu_to_dtype(q.data(), nq, c.dt, h16.data());
    CK(cudaMemcpy(dq, h16.data(), nq * 2, cudaMemcpyHostToDevice));
    tu_to_dtype(k.data(), nk, c.dt, h16.data());
    CK(cudaMemcpy(dk, h16.data(), nk * 2, cudaMemcpyHostToDevice));
    tu_to_dtype(v.data(), nv, c.dt, h16.data());
    CK(cudaMemcpy(dv, h16.data(), nv * 2, cudaMemcpyHostToDevice));
    CK(cudaMemset(dout, 0xFF, no * 2));
    CK(cudaMemset(dlse, 0xFF, nlse * 4));
    if (c.sink != SINK_NONE) {
        CK(cudaMalloc(&dsink, HQ * 4));
        CK(cudaMemcpy(dsink, sinkf.data(), HQ * 4, cudaMemcpyHostToDevice));
    }
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    if (c.varlen) {
        CK(cudaMalloc(&dcq, (B + 1) * 4));
        CK(cudaMalloc(&dck, (B + 1) * 4));
        CK(cudaMemcpy(dcq, cq.data(), (B + 1) * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dck, ck.data(), (B + 1) * 4, cudaMemcpyHostToDevice));
        a.p = tu_problem(B, maxq, maxk, HQ, HK, D, 0, c.causal, dcq, dck);
        a.p.total_q = TQ, a.p.total_k = TK;
    } else {
        a.p = tu_problem(B, maxq, maxk, HQ, HK, D, 0, c.causal, NULL, NULL);
    }
    a.p.head_dim_v = DV;
    a.p.window = c.window, a.p.window_left = c.wl, a.p.window_right = c.wr;
    a.p.softcap = (float)c.softcap;
    a.q = fattn_tensor_bshd(dq, c.dt), a.k = fattn_tensor_bshd(dk, c.dt), a.v = fattn_tensor_bshd(dv, c.dt);
    a.o = fattn_tensor_bshd(dout, c.dt);
    a.lse = dlse;
    a.learnable_sink = dsink;
    char what[300];
    snprintf(what, sizeof what, "%s %s b%d sq%d sk%d h%d/%d d%d/%d%s window %s(%d, %d) softcap %g sink %s%s",
             fattn_dtype_name(c.dt), c.varlen ? "varlen" : "fixed", B, maxq, maxk, HQ, HK, D, DV,
             c.causal ? " causal" : "", c.window ? "" : "off ", c.wl, c.wr, c.softcap,
             c.sink == SINK_NONE ? "NULL" : c.sink == SINK_M30 ? "-30" : c.sink == SINK_0 ? "0" : c.sink == SINK_P30 ? "+30" : "+8",
             c.qmul != 1 ? " (Q x8)" : "");
    const fattn_status st = fattn_fwd(ctx, &a);
    TU_CHECK(st == FATTN_OK, "%s: %s: %s", what, fattn_status_string(st), fattn_last_error(ctx));
    const cudaError_t e = cudaDeviceSynchronize();
    TU_CHECK(e == cudaSuccess, "%s: kernel failed: %s", what, cudaGetErrorString(e));
    if (e != cudaSuccess) exit(1);
    CK(cudaMemcpy(h16.data(), dout, no * 2, cudaMemcpyDeviceToHost));
    tu_from_dtype(h16.data(), no, c.dt, got.data());
    std::vector<float> glse(nlse);
    CK(cudaMemcpy(glse.data(), dlse, nlse * 4, cudaMemcpyDeviceToHost));
    /* the fixed-length LSE is [batch, heads, seqlen_q]; the oracle's, given
     * no cu_seqlens, the same */
    oracle_problem op;
    memset(&op, 0, sizeof op);
    op.batch = B, op.seqlen_q = maxq, op.seqlen_k = maxk, op.heads_q = HQ, op.heads_kv = HK, op.head_dim = D;
    op.head_dim_v = DV, op.causal = c.causal;
    if (c.varlen) op.cu_seqlens_q = cq.data(), op.cu_seqlens_k = ck.data();
    op.window = c.window, op.window_left = c.wl, op.window_right = c.wr;
    op.softcap = c.softcap;
    op.sink = c.sink != SINK_NONE ? sink.data() : NULL;
    oracle_fwd(&op, q.data(), k.data(), v.data(), ref.data(), ref_lse.data());
    const double capx = c.softcap * 0x1p-11; /* tanh.approx.f32: the capped score's absolute error */
    gpu_check_fwd(what, c.dt, got.data(), ref.data(), no, DV, glse.data(), ref_lse.data(), nlse, capx);
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dlse);
    if (dsink) cudaFree(dsink);
    if (dcq) cudaFree(dcq), cudaFree(dck);
}

/* FP8 (e4m3 Q, K, V with block scales: Q 64 rows, K `kb` (1: per key), V
 * 128) with a window, o in `odt`, against the oracle on the dequantised
 * values; the control: the same output against the oracle without the
 * window must miss the bounds by far. */
static void run_fp8(fattn_ctx *ctx, tu_rng *rng, fattn_dtype odt, int d, int sq, int sk, int hq, int hkv, int causal,
                    int wl, int wr, int kb) {
    const int B = 1;
    tu_tensor q, k, v, o;
    tu_tensor_alloc(&q, FATTN_DTYPE_E4M3, B, sq, hq, d, TU_BSHD, 64);
    tu_tensor_alloc(&k, FATTN_DTYPE_E4M3, B, sk, hkv, d, TU_BSHD, kb);
    tu_tensor_alloc(&v, FATTN_DTYPE_E4M3, B, sk, hkv, d, TU_BSHD, 128);
    tu_tensor_alloc(&o, odt, B, sq, hq, d, TU_BSHD, 1);
    std::vector<double> hq_(q.count), hk(k.count), hv(v.count), ref(o.count), ref0(o.count), got(o.count);
    std::vector<double> ref_lse((size_t)hq * sq), ref_lse0((size_t)hq * sq);
    tu_fill_normal(rng, hq_.data(), q.count);
    tu_fill_normal(rng, hk.data(), k.count);
    tu_fill_normal(rng, hv.data(), v.count);
    tu_tensor_set(&q, hq_.data(), hq_.data());
    tu_tensor_set(&k, hk.data(), hk.data());
    tu_tensor_set(&v, hv.data(), hv.data());
    void *dd[3], *dout;
    float *ds[3], *dlse;
    tu_tensor *ts[3] = {&q, &k, &v};
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    fattn_tensor *at[3] = {&a.q, &a.k, &a.v};
    for (int t = 0; t < 3; ++t) {
        CK(cudaMalloc(&dd[t], ts[t]->bytes));
        CK(cudaMalloc(&ds[t], ts[t]->nscale * 4));
        CK(cudaMemcpy(dd[t], ts[t]->t.data, ts[t]->bytes, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(ds[t], ts[t]->t.scale, ts[t]->nscale * 4, cudaMemcpyHostToDevice));
        *at[t] = ts[t]->t;
        at[t]->data = dd[t];
        at[t]->scale = ds[t];
    }
    const size_t nlse = (size_t)hq * sq;
    CK(cudaMalloc(&dout, o.bytes));
    CK(cudaMalloc(&dlse, nlse * 4));
    CK(cudaMemset(dout, 0xFF, o.bytes));
    CK(cudaMemset(dlse, 0xFF, nlse * 4));
    a.p = tu_problem(B, sq, sk, hq, hkv, d, 0, causal, NULL, NULL);
    a.p.window = 1, a.p.window_left = wl, a.p.window_right = wr;
    a.o = o.t;
    a.o.data = dout;
    a.lse = dlse;
    char what[200];
    snprintf(what, sizeof what, "e4m3 -> %s sq%d sk%d h%d/%d d%d%s window (%d, %d) k scale block %d",
             fattn_dtype_name(odt), sq, sk, hq, hkv, d, causal ? " causal" : "", wl, wr, kb);
    const fattn_status st = fattn_fwd(ctx, &a);
    TU_CHECK(st == FATTN_OK, "%s: %s: %s", what, fattn_status_string(st), fattn_last_error(ctx));
    const cudaError_t e = cudaDeviceSynchronize();
    TU_CHECK(e == cudaSuccess, "%s: kernel failed: %s", what, cudaGetErrorString(e));
    if (e != cudaSuccess) exit(1);
    CK(cudaMemcpy(o.t.data, dout, o.bytes, cudaMemcpyDeviceToHost));
    tu_tensor_get(&o, got.data());
    std::vector<float> glse(nlse);
    CK(cudaMemcpy(glse.data(), dlse, nlse * 4, cudaMemcpyDeviceToHost));
    oracle_problem op;
    memset(&op, 0, sizeof op);
    op.batch = B, op.seqlen_q = sq, op.seqlen_k = sk, op.heads_q = hq, op.heads_kv = hkv, op.head_dim = d;
    op.head_dim_v = d, op.causal = causal;
    oracle_fwd(&op, hq_.data(), hk.data(), hv.data(), ref0.data(), ref_lse0.data()); /* no window: the control */
    op.window = 1, op.window_left = wl, op.window_right = wr;
    oracle_fwd(&op, hq_.data(), hk.data(), hv.data(), ref.data(), ref_lse.data());
    gpu_check_fwd_tol(what, got.data(), ref.data(), o.count, d, glse.data(), ref_lse.data(), nlse, 0.08, 0.25, 2e-2);
    const double ctl = tu_rel_err(got.data(), ref0.data(), o.count);
    TU_CHECK(ctl > 0.3, "%s: control: against the oracle without the window the error is only %.3e (the bounds "
             "would not see a window ignored)", what, ctl);
    for (int t = 0; t < 3; ++t) cudaFree(dd[t]), cudaFree(ds[t]);
    cudaFree(dout), cudaFree(dlse);
    tu_tensor_free(&q), tu_tensor_free(&k), tu_tensor_free(&v), tu_tensor_free(&o);
}

/* fattn_fwd_fp8 (quantise on the device, then the e4m3 forward) with a
 * window, bf16 in and out, against the CPU engine's fattn_fwd_fp8 of the same
 * call (the same codes and scales: fattn_quantize gives both engines' bits;
 * the CPU attends in f32 without rounding P): FP8's bounds, and the control
 * against the CPU's result without the window. */
static void run_fp8_oneshot(fattn_ctx *ctx, fattn_ctx *cpu, tu_rng *rng, int d, int sq, int sk, int wl, int wr) {
    const int B = 1, HQ = 4, HK = 2;
    const size_t nq = (size_t)B * sq * HQ * d, nk = (size_t)B * sk * HK * d, nlse = (size_t)B * HQ * sq;
    std::vector<double> x[3] = {std::vector<double>(nq), std::vector<double>(nk), std::vector<double>(nk)};
    std::vector<uint16_t> h16[3];
    void *dd[3], *dout;
    float *dlse;
    for (int t = 0; t < 3; ++t) {
        tu_fill_normal(rng, x[t].data(), x[t].size());
        h16[t].resize(x[t].size());
        tu_to_dtype(x[t].data(), x[t].size(), FATTN_DTYPE_BF16, h16[t].data());
        CK(cudaMalloc(&dd[t], x[t].size() * 2));
        CK(cudaMemcpy(dd[t], h16[t].data(), x[t].size() * 2, cudaMemcpyHostToDevice));
    }
    CK(cudaMalloc(&dout, nq * 2));
    CK(cudaMalloc(&dlse, nlse * 4));
    CK(cudaMemset(dout, 0xFF, nq * 2));
    CK(cudaMemset(dlse, 0xFF, nlse * 4));
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = tu_problem(B, sq, sk, HQ, HK, d, 0, 0, NULL, NULL);
    a.p.window = 1, a.p.window_left = wl, a.p.window_right = wr;
    a.q = fattn_tensor_bshd(dd[0], FATTN_DTYPE_BF16), a.k = fattn_tensor_bshd(dd[1], FATTN_DTYPE_BF16);
    a.v = fattn_tensor_bshd(dd[2], FATTN_DTYPE_BF16), a.o = fattn_tensor_bshd(dout, FATTN_DTYPE_BF16);
    a.lse = dlse;
    char what[160];
    snprintf(what, sizeof what, "fattn_fwd_fp8 bf16 sq%d sk%d h%d/%d d%d window (%d, %d)", sq, sk, HQ, HK, d, wl, wr);
    fattn_status st = fattn_fwd_fp8(ctx, &a, NULL);
    TU_CHECK(st == FATTN_OK, "%s: %s: %s", what, fattn_status_string(st), fattn_last_error(ctx));
    const cudaError_t e = cudaDeviceSynchronize();
    TU_CHECK(e == cudaSuccess, "%s: kernel failed: %s", what, cudaGetErrorString(e));
    if (e != cudaSuccess) exit(1);
    std::vector<uint16_t> go(nq), co(nq);
    std::vector<float> glse(nlse), clse(nlse), clse0(nlse);
    CK(cudaMemcpy(go.data(), dout, nq * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(glse.data(), dlse, nlse * 4, cudaMemcpyDeviceToHost));
    /* the CPU engine: the same call on host copies, with and without the window */
    fattn_fwd_args h = a;
    h.q.data = h16[0].data(), h.k.data = h16[1].data(), h.v.data = h16[2].data(), h.o.data = co.data();
    h.lse = clse.data();
    std::vector<double> got(nq), ref(nq), ref0(nq), rl(nlse), rl0(nlse);
    st = fattn_fwd_fp8(cpu, &h, NULL);
    TU_CHECK(st == FATTN_OK, "%s (CPU): %s: %s", what, fattn_status_string(st), fattn_last_error(cpu));
    tu_from_dtype(co.data(), nq, FATTN_DTYPE_BF16, ref.data());
    for (size_t i = 0; i < nlse; ++i) rl[i] = clse[i];
    h.p.window = 0, h.p.window_left = h.p.window_right = 0, h.lse = clse0.data();
    st = fattn_fwd_fp8(cpu, &h, NULL);
    TU_CHECK(st == FATTN_OK, "%s (CPU, no window): %s", what, fattn_last_error(cpu));
    tu_from_dtype(co.data(), nq, FATTN_DTYPE_BF16, ref0.data());
    tu_from_dtype(go.data(), nq, FATTN_DTYPE_BF16, got.data());
    gpu_check_fwd_tol(what, got.data(), ref.data(), nq, d, glse.data(), rl.data(), nlse, 0.08, 0.25, 2e-2);
    const double ctl = tu_rel_err(got.data(), ref0.data(), nq);
    TU_CHECK(ctl > 0.3, "%s: control: against the CPU without the window the error is only %.3e", what, ctl);
    for (int t = 0; t < 3; ++t) cudaFree(dd[t]);
    cudaFree(dout), cudaFree(dlse);
}

/* Calls the CUDA engine refuses: UNSUPPORTED, O untouched. */
static void check_refused(fattn_ctx *ctx) {
    const int S = 64, H = 4, D = 256; /* the buffers' size; the calls use less */
    const size_t n = (size_t)S * H * D;
    void *buf, *dout;
    float *dsink, *scale;
    int32_t *used;
    CK(cudaMalloc(&buf, n * 2));
    CK(cudaMalloc(&dout, n * 2));
    CK(cudaMalloc(&dsink, H * 4));
    CK(cudaMalloc(&scale, 64 * 4));
    CK(cudaMalloc(&used, 4));
    CK(cudaMemset(buf, 0, n * 2));
    CK(cudaMemset(dsink, 0, H * 4));
    CK(cudaMemset(used, 0, 4));
    CK(cudaMemset(scale, 0, 64 * 4));
    std::vector<uint16_t> h(n);
    /* (softcap with seqused_k at d256 past 16 rows, refused until the fixed-length
     * cache calls ran as varlen queries, is served since: test_kvcache_prefill) */
    for (int which = 0; which < 2; ++which) {
        fattn_fwd_args a;
        memset(&a, 0, sizeof a);
        a.p = tu_problem(1, S, S, 2, 2, 64, 0, 0, NULL, NULL);
        const char *name;
        if (which < 2) { /* FP8 with softcap, with a sink */
            fattn_tensor t = {buf, FATTN_DTYPE_E4M3, 0, 0, 0, scale, 128};
            a.q = a.k = a.v = t;
            if (which == 0) a.p.softcap = 30.f, name = "FP8 with softcap";
            else a.learnable_sink = dsink, name = "FP8 with learnable_sink";
        } else { /* the decoding kernel (seqused_k) with softcap at d256 and 32 rows (DecCfg::SOFTCAP) */
            a.q = a.k = a.v = fattn_tensor_bshd(buf, FATTN_DTYPE_BF16);
            a.p = tu_problem(1, 16, S, 4, 2, 256, 0, 0, NULL, NULL);
            a.seqused_k = used;
            a.p.softcap = 30.f;
            name = "softcap with seqused_k at d256, 32 rows";
        }
        a.o = fattn_tensor_bshd(dout, FATTN_DTYPE_BF16);
        CK(cudaMemset(dout, 0x5A, n * 2));
        const fattn_status st = fattn_fwd(ctx, &a);
        TU_CHECK(st == FATTN_ERROR_UNSUPPORTED, "%s: %s (%s), expected UNSUPPORTED", name, fattn_status_string(st),
                 fattn_last_error(ctx));
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(h.data(), dout, n * 2, cudaMemcpyDeviceToHost));
        size_t changed = 0;
        for (size_t i = 0; i < n; ++i) changed += h[i] != 0x5A5A;
        TU_CHECK(changed == 0, "%s: the refused call wrote %zu elements", name, changed);
        printf("  %s: refused (%s)\n", name, fattn_last_error(ctx));
    }
    cudaFree(buf), cudaFree(dout), cudaFree(dsink), cudaFree(scale), cudaFree(used);
}

int main(void) {
    fattn_ctx *ctx = gpu_ctx_or_skip();
    tu_rng rng;
    tu_rng_init(&rng, (uint64_t)tu_seed());
    const fattn_dtype dts[2] = {FATTN_DTYPE_BF16, FATTN_DTYPE_F16};
    const bool small = getenv("FATTN_TEST_SMALL") != NULL;
    const bool portable = gpu_portable_forced() != 0; /* its head dims; no FP8 */
    const int dims[3] = {64, 128, 256};
    /* the 16-bit head dims (d, head_dim_v): issue 37 added 96, 192, 192/128 */
    const int hdims[6][2] = {{64, 64}, {128, 128}, {256, 256}, {96, 96}, {192, 192}, {192, 128}};
    for (int di = 0; di < 6; ++di)
        for (int ti = 0; ti < 2; ++ti) {
            const int d = hdims[di][0], dv = hdims[di][1];
            const fattn_dtype dt = dts[ti];
            if (portable && dv != d) {
                if (ti == 0) printf("  d%d/%d: skipped (the portable engine has head_dim_v == head_dim only)\n", d, dv);
                continue;
            }
            const int big = dt == FATTN_DTYPE_BF16 ? SINK_P30 : SINK_P8;
            std::vector<vcase> cs = {
                /* windows: smaller than a tile, GQA, batch 2 */
                mk(dt, d, 2, 1000, 1000, 4, 2, 0, 1, 37, 5),
                /* the diagonal alone, and (1, 1), with unequal lengths both ways */
                mk(dt, d, 1, 17, 1000, 2, 1, 0, 1, 0, 0),
                mk(dt, d, 1, 1000, 17, 2, 2, 0, 1, 1, 1),
                /* one query (decode-sized: the decoding kernel's LOCAL instance), left-only */
                mk(dt, d, 2, 1, 4097, 4, 1, 0, 1, 100, -1),
                /* longer than the sequence; right-only */
                mk(dt, d, 1, 1000, 1000, 2, 2, 0, 1, 5000, 5000),
                mk(dt, d, 1, 1000, 4097, 2, 1, 0, 1, -1, 50),
                /* causal: plain (through a sink), with unequal lengths (rows that see
                 * nothing: LSE = sink), with a left side */
                mk(dt, d, 1, 1000, 17, 2, 2, 1, 0, 0, 0, 0, SINK_0),
                mk(dt, d, 1, 17, 1000, 2, 1, 1, 0, 0, 0, 0, SINK_M30),
                mk(dt, d, 1, 1000, 1000, 2, 1, 1, 1, 300, 7),
                /* sinks, NULL sink and window (-1, -1) (no window: the plain path) */
                mk(dt, d, 1, 1000, 1000, 2, 2, 0, 0, 0, 0, 0, SINK_M30),
                mk(dt, d, 1, 1000, 1000, 2, 2, 0, 0, 0, 0, 0, big),
                mk(dt, d, 1, 1000, 1000, 2, 2, 0, 1, -1, -1),
                /* softcap with large logits */
                mk(dt, d, 1, 1000, 1000, 2, 1, 0, 0, 0, 0, 15, SINK_NONE, 8),
                mk(dt, d, 1, 1000, 1000, 2, 2, 1, 0, 0, 0, 30, SINK_NONE, 8),
                /* all three together, GQA, unequal lengths */
                mk(dt, d, 1, 1000, 4097, 4, 2, 0, 1, 64, 16, 30, SINK_0, 8),
            };
            /* the longest: causal with a left side at 4097 (d64, d128) */
            if (d <= 128) cs.push_back(mk(dt, d, 1, 4097, 4097, 1, 1, 1, 1, 1000, -1, 0, big));
            for (vcase &c : cs) c.dv = dv;
            /* sanitizer runs (FATTN_TEST_SMALL): a quarter of the new head dims' cases */
            for (size_t i = 0; i < cs.size(); ++i)
                if (!small || di < 3 || i % 4 == 0) run_case(ctx, &rng, cs[i]);
            /* variable length: empty, 1, 17 and 1000-query sequences, keys 17 .. 4097 */
            vcase vc = mk(dt, d, 0, 0, 0, 4, 2, 0, 1, 37, 5, 30, SINK_0, 8);
            vc.varlen = true;
            vc.dv = dv;
            vc.lq = {1, 17, 0, 1000, 17};
            vc.lk = {17, 1000, 5, 4097, 17};
            run_case(ctx, &rng, vc);
            vc.window = 0, vc.wl = 0, vc.wr = 0, vc.softcap = 0, vc.causal = 1, vc.sink = SINK_M30, vc.qmul = 1;
            run_case(ctx, &rng, vc);
        }
    /* FP8 with a window: each head dim, both outputs, K scales per block and per key */
    if (portable) printf("  FP8 with a window: skipped (the portable engine has no FP8 forward)\n");
    for (int di = 0; di < 3 && !portable; ++di) {
        run_fp8(ctx, &rng, FATTN_DTYPE_BF16, dims[di], 1000, 1000, 2, 1, 0, 5, 3, 128);
        run_fp8(ctx, &rng, FATTN_DTYPE_F16, dims[di], 17, 1000, 2, 2, 1, 37, 0, 1);
        run_fp8(ctx, &rng, FATTN_DTYPE_BF16, dims[di], 1000, 4097, 2, 2, 0, 200, -1, 128);
    }
    if (!portable) {
        fattn_ctx *cpu = gpu_cpu_ctx();
        run_fp8_oneshot(ctx, cpu, &rng, 128, 300, 700, 37, 5);
        fattn_ctx_free(cpu);
    }
    check_refused(ctx);
    fattn_ctx_free(ctx);
    return tu_finish("gpu fwd variants");
}
