/* test_bwd_variants.cu - the Hopper 16-bit backward with the attention
 * variants (issue 37: sliding window, softcap, learnable sinks with d(sink))
 * against the FP64 oracle (tests/common/oracle.c, oracle_bwd_sink) on the
 * exact 16-bit inputs the kernels saw.
 *
 * Each case draws q (times qmul: large logits for softcap), k, v and dout
 * N(0, 1) rounded to the dtype, runs fattn_fwd on the CUDA context for o and
 * lse as a user would, then fattn_bwd with dq, dk, dv poisoned (NaN bits)
 * and dsink set to NaN.  Shapes have tails (17, 300, 777, 4097), GQA, causal
 * with unequal lengths and a variable-length batch (empty, 1 and 17-query
 * sequences); windows of 0, 1, smaller than a tile, one-sided, and longer
 * than the sequence; sinks of -30, 0 and +30.
 *
 * Tolerances: dq, dk and dv as test_bwd.cu's (its header: 1e-2 bf16, 2e-3
 * f16 Frobenius; 0.5 and 0.08 rms for the worst element), widened under
 * softcap by the approximate tanh's error: tanh.approx.f32 moves a capped
 * score by up to about cap 2^-11 (the forward test's bound), which moves P
 * by that much relative, so cap 2^-11 is added to the Frobenius bound and 8x
 * that to the worst element's.  d(sink) = -sum_i P_sink,i D_i sums terms of
 * either sign: it is held to 2^-7 (bf16) or 2^-9 (f16) of sum_i P_sink,i
 * |D_i|, the rounding of o (which D comes from) being 2^-9 / 2^-12 relative
 * per row.  Deterministic mode with a left-bounded window (its dQ turn
 * starts at the window's first key block) is run twice and must repeat
 * bitwise. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "common/oracle.h"
#include "gpu/gpu_testutil.h"
#include "fattn.h"

struct bvcase {
    fattn_dtype dt;
    int d, hq, hkv, causal;
    std::vector<int> lq, lk; /* one entry per batch entry; varlen when more than one length differs */
    bool varlen;
    int window, wl, wr;
    double softcap, qmul;
    bool sink;
    double sink_base;
    int deterministic;
};

static bvcase mk(fattn_dtype dt, int d, int B, int sq, int sk, int hq, int hkv, int causal, int window, int wl, int wr,
                 double cap = 0, bool sink = false, double sink_base = 0, double qmul = 1) {
    bvcase c;
    c.dt = dt, c.d = d, c.hq = hq, c.hkv = hkv, c.causal = causal;
    c.lq.assign(B, sq), c.lk.assign(B, sk), c.varlen = false;
    c.window = window, c.wl = wl, c.wr = wr, c.softcap = cap, c.qmul = qmul, c.sink = sink, c.sink_base = sink_base;
    c.deterministic = 0;
    return c;
}

static void *dev_copy(const void *h, size_t bytes) {
    void *d;
    CK(cudaMalloc(&d, bytes ? bytes : 4));
    if (bytes) CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

static std::vector<double> dev_get(const void *d, size_t n, fattn_dtype dt) {
    std::vector<uint16_t> h(n);
    std::vector<double> x(n);
    CK(cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost));
    tu_from_dtype(h.data(), n, dt, x.data());
    return x;
}

static void run_case(fattn_ctx *ctx, tu_rng *rng, const bvcase &c) {
    const int B = (int)c.lq.size(), HQ = c.hq, HK = c.hkv, D = c.d;
    std::vector<int32_t> cq, ck;
    int maxq, maxk;
    gpu_varlen_offsets(c.lq, c.lk, cq, ck, maxq, maxk);
    const int TQ = cq[B], TK = ck[B];
    const size_t nq = (size_t)TQ * HQ * D, nk = (size_t)TK * HK * D, nlse = (size_t)HQ * TQ;
    std::vector<double> q(nq), k(nk), v(nk), dout(nq), sink(HQ);
    tu_fill_normal(rng, q.data(), nq);
    tu_fill_normal(rng, k.data(), nk);
    tu_fill_normal(rng, v.data(), nk);
    tu_fill_normal(rng, dout.data(), nq);
    for (size_t i = 0; i < nq; ++i) q[i] *= c.qmul;
    for (std::vector<double> *x : {&q, &k, &v, &dout}) tu_round_to(x->data(), x->size(), c.dt);
    std::vector<float> sinkf(HQ);
    for (int h = 0; h < HQ; ++h) sinkf[h] = (float)(c.sink_base + 0.25 * (h % 3)), sink[h] = sinkf[h];
    std::vector<uint16_t> h16(nq > nk ? nq : nk);
    auto up = [&](const std::vector<double> &x) {
        tu_to_dtype(x.data(), x.size(), c.dt, h16.data());
        return dev_copy(h16.data(), x.size() * 2);
    };
    void *gq = up(q), *gk = up(k), *gv = up(v), *gdo = up(dout), *go, *gdq, *gdk, *gdv;
    float *glse, *gsink = NULL, *gdsink = NULL;
    CK(cudaMalloc(&go, nq * 2));
    CK(cudaMalloc(&gdq, nq * 2));
    CK(cudaMalloc(&gdk, nk * 2));
    CK(cudaMalloc(&gdv, nk * 2));
    CK(cudaMalloc(&glse, nlse * 4));
    if (c.sink) {
        gsink = (float *)dev_copy(sinkf.data(), HQ * 4);
        CK(cudaMalloc(&gdsink, HQ * 4));
        CK(cudaMemset(gdsink, 0xFF, HQ * 4));
    }
    int32_t *gcq = NULL, *gck = NULL;
    fattn_problem pr;
    if (c.varlen) {
        gcq = (int32_t *)dev_copy(cq.data(), (B + 1) * 4), gck = (int32_t *)dev_copy(ck.data(), (B + 1) * 4);
        pr = tu_problem(B, maxq, maxk, HQ, HK, D, 0, c.causal, gcq, gck);
        pr.total_q = TQ, pr.total_k = TK;
    } else {
        pr = tu_problem(B, maxq, maxk, HQ, HK, D, 0, c.causal, NULL, NULL);
    }
    pr.window = c.window, pr.window_left = c.wl, pr.window_right = c.wr;
    pr.softcap = (float)c.softcap;
    char what[300];
    snprintf(what, sizeof what, "%s %s b%d sq%d sk%d h%d/%d d%d%s window %s(%d, %d) softcap %g sink %s%s%s",
             fattn_dtype_name(c.dt), c.varlen ? "varlen" : "fixed", B, maxq, maxk, HQ, HK, D, c.causal ? " causal" : "",
             c.window ? "" : "off ", c.wl, c.wr, c.softcap, c.sink ? "" : "NULL", c.qmul != 1 ? " (Q scaled up)" : "",
             c.deterministic ? " deterministic" : "");
    if (c.sink) {
        char s[32];
        snprintf(s, sizeof s, "%+g", c.sink_base);
        strncat(what, s, sizeof what - strlen(what) - 1);
    }

    fattn_fwd_args fa;
    memset(&fa, 0, sizeof fa);
    fa.p = pr;
    fa.q = fattn_tensor_bshd(gq, c.dt), fa.k = fattn_tensor_bshd(gk, c.dt), fa.v = fattn_tensor_bshd(gv, c.dt);
    fa.o = fattn_tensor_bshd(go, c.dt);
    fa.lse = glse;
    fa.learnable_sink = gsink;
    fattn_status st = fattn_fwd(ctx, &fa);
    TU_CHECK(st == FATTN_OK, "%s: forward: %s: %s", what, fattn_status_string(st), fattn_last_error(ctx));

    fattn_bwd_args ba;
    memset(&ba, 0, sizeof ba);
    ba.p = pr;
    ba.q = fa.q, ba.k = fa.k, ba.v = fa.v, ba.o = fa.o;
    ba.dout = fattn_tensor_bshd(gdo, c.dt);
    ba.dq = fattn_tensor_bshd(gdq, c.dt), ba.dk = fattn_tensor_bshd(gdk, c.dt), ba.dv = fattn_tensor_bshd(gdv, c.dt);
    ba.lse = glse;
    ba.learnable_sink = gsink;
    ba.dsink = gdsink;
    ba.deterministic = c.deterministic;
    CK(cudaMemset(gdq, 0xFF, nq * 2));
    CK(cudaMemset(gdk, 0xFF, nk * 2));
    CK(cudaMemset(gdv, 0xFF, nk * 2));
    st = fattn_bwd(ctx, &ba);
    TU_CHECK(st == FATTN_OK, "%s: backward: %s: %s", what, fattn_status_string(st), fattn_last_error(ctx));
    const cudaError_t e = cudaDeviceSynchronize();
    TU_CHECK(e == cudaSuccess, "%s: kernel failed: %s", what, cudaGetErrorString(e));
    if (e != cudaSuccess) exit(1);
    const std::vector<double> gotq = dev_get(gdq, nq, c.dt), gotk = dev_get(gdk, nk, c.dt), gotv = dev_get(gdv, nk, c.dt);
    std::vector<float> gds(HQ);
    if (c.sink) CK(cudaMemcpy(gds.data(), gdsink, HQ * 4, cudaMemcpyDeviceToHost));

    if (c.deterministic) { /* a second run: the same bits */
        std::vector<uint16_t> a1(nq), a2(nq);
        CK(cudaMemcpy(a1.data(), gdq, nq * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemset(gdq, 0xFF, nq * 2));
        st = fattn_bwd(ctx, &ba);
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(a2.data(), gdq, nq * 2, cudaMemcpyDeviceToHost));
        TU_CHECK(st == FATTN_OK && memcmp(a1.data(), a2.data(), nq * 2) == 0, "%s: dq repeats bitwise", what);
    }

    oracle_problem op;
    memset(&op, 0, sizeof op);
    op.batch = B, op.seqlen_q = maxq, op.seqlen_k = maxk, op.heads_q = HQ, op.heads_kv = HK, op.head_dim = D;
    op.head_dim_v = D, op.causal = c.causal;
    op.scale = (double)(float)(1.0 / sqrt((double)D)); /* the float the library uses by default */
    if (c.varlen) op.cu_seqlens_q = cq.data(), op.cu_seqlens_k = ck.data();
    op.window = c.window, op.window_left = c.wl, op.window_right = c.wr;
    op.softcap = c.softcap;
    op.sink = c.sink ? sink.data() : NULL;
    std::vector<double> rq(nq), rk(nk), rv(nk), rds(HQ), ro(nq), rlse(nlse);
    oracle_bwd_sink(&op, q.data(), k.data(), v.data(), dout.data(), rq.data(), rk.data(), rv.data(),
                    c.sink ? rds.data() : NULL);
    const double capx = c.softcap * 0x1p-11;
    const struct {
        const char *name;
        const std::vector<double> &g, &r;
    } gs[] = {{"dq", gotq, rq}, {"dk", gotk, rk}, {"dv", gotv, rv}};
    for (const auto &x : gs) {
        const gstat s = grad_stat(x.g.data(), x.r.data(), x.g.size());
        char w[400];
        snprintf(w, sizeof w, "%s %s rel err (Frobenius)", what, x.name);
        TU_CHECK(s.nonfinite == 0, "%s: %zu non-finite", w, s.nonfinite);
        TU_EXPECT_LE(s.fro, tol_fro(c.dt) + capx, w);
        snprintf(w, sizeof w, "%s %s worst element / rms", what, x.name);
        TU_EXPECT_LE(s.maxr, tol_max(c.dt) + 8 * capx, w);
    }
    if (c.sink) {
        /* the bound: sum_i P_sink,i |D_i| from the oracle's O and LSE */
        oracle_fwd(&op, q.data(), k.data(), v.data(), ro.data(), rlse.data());
        std::vector<double> mag(HQ, 0.0);
        for (int b = 0; b < B; ++b)
            for (int i = 0; i < c.lq[b]; ++i)
                for (int h = 0; h < HQ; ++h) {
                    const size_t row = (size_t)cq[b] + i, li = c.varlen ? (size_t)h * TQ + row
                                                                         : ((size_t)b * HQ + h) * maxq + i;
                    if (rlse[li] == -INFINITY) continue;
                    double dd = 0;
                    for (int x = 0; x < D; ++x) dd += dout[(row * HQ + h) * D + x] * ro[(row * HQ + h) * D + x];
                    mag[h] += exp(sink[h] - rlse[li]) * fabs(dd);
                }
        const double rel = c.dt == FATTN_DTYPE_BF16 ? 0x1p-7 : 0x1p-9;
        for (int h = 0; h < HQ; ++h) {
            char w[400];
            snprintf(w, sizeof w, "%s dsink[%d] (%.6g, oracle %.6g) error / sum |terms|", what, h, (double)gds[h],
                     rds[h]);
            TU_CHECK(isfinite(gds[h]), "%s: not finite", w);
            TU_EXPECT_LE(fabs(gds[h] - rds[h]) / (mag[h] > 1e-30 ? mag[h] : 1e-30), rel + capx, w);
        }
    }
    printf("  [ran] %s\n", what);
    for (void *p : {gq, gk, gv, gdo, go, gdq, gdk, gdv}) cudaFree(p);
    cudaFree(glse);
    if (gsink) cudaFree(gsink), cudaFree(gdsink);
    if (gcq) cudaFree(gcq), cudaFree(gck);
}

int main(void) {
    fattn_ctx *ctx = gpu_ctx_or_skip();
    tu_rng rng;
    tu_rng_init(&rng, (uint64_t)tu_seed());
    const bool small = getenv("FATTN_TEST_SMALL") != NULL;
    const fattn_dtype BF = FATTN_DTYPE_BF16, F16 = FATTN_DTYPE_F16;
    const int dims[] = {64, 128, 256};
    for (int di = 0; di < 3; ++di) {
        const int d = dims[di];
        std::vector<bvcase> cs = {
            mk(BF, d, 2, 300, 300, 4, 2, 0, 1, 37, 5),           /* smaller than a tile, GQA */
            mk(BF, d, 1, 200, 200, 2, 1, 0, 1, 0, 0),            /* the diagonal only */
            mk(BF, d, 1, 200, 333, 2, 2, 0, 1, 1, 1, 0, true, 0), /* three keys a row, sink 0 */
            mk(BF, d, 1, 500, 900, 2, 1, 1, 1, 64, -1),          /* causal with a left side, unequal lengths */
            mk(BF, d, 1, 400, 400, 2, 2, 0, 1, -1, 20),          /* right side only */
            mk(BF, d, 1, 17, 4097, 2, 1, 0, 1, 5000, 5000),      /* longer than the sequence */
            mk(BF, d, 1, 300, 300, 2, 2, 0, 0, 0, 0, 30, false, 0, 4),  /* softcap, large logits */
            mk(BF, d, 1, 300, 500, 2, 1, 1, 0, 0, 0, 15, false, 0, 4),  /* causal softcap */
            mk(BF, d, 2, 200, 200, 2, 2, 0, 0, 0, 0, 0, true, -30),     /* sink only: the plain kernel */
            mk(BF, d, 1, 300, 300, 2, 2, 1, 0, 0, 0, 0, true, 30),      /* causal, sink +30 */
            mk(BF, d, 1, 300, 777, 4, 2, 0, 1, 64, 16, 30, true, 0, 4), /* all three */
        };
        if (d == 128) {
            cs.push_back(mk(F16, d, 1, 300, 300, 4, 2, 0, 1, 37, 5, 15, true, 0, 4));
            cs.push_back(mk(F16, d, 1, 300, 500, 2, 2, 1, 1, 100, -1));
        }
        /* variable length: empty, 1 and 17-query sequences */
        bvcase vc = mk(BF, d, 1, 1, 1, 4, 2, 0, 1, 37, 5, 30, true, 0, 4);
        vc.varlen = true;
        vc.lq = {1, 17, 0, 300, 17};
        vc.lk = {17, 300, 5, 777, 17};
        cs.push_back(vc);
        vc.window = 0, vc.wl = 0, vc.wr = 0, vc.softcap = 0, vc.causal = 1, vc.qmul = 1;
        cs.push_back(vc);
        /* deterministic with a left-bounded window (the dQ turn) */
        bvcase dc = mk(BF, d, 1, 700, 700, 2, 1, 1, 1, 200, -1);
        dc.deterministic = 1;
        cs.push_back(dc);
        for (size_t i = 0; i < cs.size(); ++i)
            if (!small || i % 4 == 0) run_case(ctx, &rng, cs[i]);
    }
    fattn_ctx_free(ctx);
    return tu_finish("gpu bwd variants");
}
