/* test_cpu_variants.c - the attention variants of fattn.h (sliding window,
 * softcap, learnable sinks) on the CPU engine against the FP64 oracle:
 * forward (every forward instance this CPU has, cpu_isas.h) and backward
 * (dq, dk, dv and dsink), plus the argument checks of the new fields and a
 * finite-difference check of the oracle's d(sink). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/oracle.h"
#include "common/testutil.h"
#include "cpu_isas.h"
#include "fattn.h"

typedef struct vcase {
    const char *name;
    int batch, sq, sk, hq, hkv, d, causal;
    int window, wl, wr; /* window flag, left, right */
    float softcap;
    int sink;           /* nonzero: learnable_sink[h] = sink_base + 0.25 h */
    double sink_base;
    float scale;        /* softmax_scale, 0 = default */
    fattn_dtype dt;
    const int32_t *cuq, *cuk;
} vcase;

/* Forward: as test_cpu_fwd.c (4 output ulps of f16 / bf16). */
#define TOL_F32 1e-5
#define TOL_BF16 1.6e-2
#define TOL_LSE 1e-4
/* Backward: as test_cpu_bwd.c. */
#define TOL_BWD_F32 1e-4
#define TOL_BWD_BF16 1.6e-2

static int bwd_pass; /* 0: forward cases (every instance), 1: backward cases */

static void run_case(fattn_ctx *ctx, tu_rng *rng, const vcase *c) {
    const int varlen = c->cuq != NULL;
    const int tb = varlen ? 1 : c->batch;
    const int tsq = varlen ? c->cuq[c->batch] : c->sq;
    const int tsk = varlen ? c->cuk[c->batch] : c->sk;
    const int d = c->d;
    int sq = c->sq, sk = c->sk;
    if (varlen) { /* the longest sequence of the batch */
        sq = tu_varlen_max(c->cuq, c->batch);
        sk = tu_varlen_max(c->cuk, c->batch);
    }
    tu_tensor q, k, v, o, dO, dq, dk, dvt;
    tu_tensor_alloc(&q, c->dt, tb, tsq, c->hq, d, TU_BSHD, 1);
    tu_tensor_alloc(&k, c->dt, tb, tsk, c->hkv, d, TU_BSHD, 1);
    tu_tensor_alloc(&v, c->dt, tb, tsk, c->hkv, d, TU_BSHD, 1);
    tu_tensor_alloc(&o, c->dt, tb, tsq, c->hq, d, TU_BSHD, 1);
    tu_tensor_alloc(&dO, c->dt, tb, tsq, c->hq, d, TU_BSHD, 1);
    tu_tensor_alloc(&dq, c->dt, tb, tsq, c->hq, d, TU_BSHD, 1);
    tu_tensor_alloc(&dk, c->dt, tb, tsk, c->hkv, d, TU_BSHD, 1);
    tu_tensor_alloc(&dvt, c->dt, tb, tsk, c->hkv, d, TU_BSHD, 1);
    tu_tensor_poison(&o);
    const size_t nlse = (size_t)tb * c->hq * tsq;
    float *lse = (float *)tu_malloc(sizeof(float) * (nlse + 1));
    tu_poison(lse, sizeof(float) * nlse);
    float sink[64];
    double sinkd[64], r_dsink[64];
    float dsink[64];
    for (int h = 0; h < c->hq && h < 64; h++) {
        sinkd[h] = c->sink_base + 0.25 * h;
        sink[h] = (float)sinkd[h];
        sinkd[h] = sink[h];
    }

    const size_t nin = q.count + k.count + v.count + dO.count;
    double *src = (double *)tu_malloc(sizeof(double) * (nin + 1));
    double *h_q = (double *)tu_malloc(sizeof(double) * (q.count + 1));
    double *h_k = (double *)tu_malloc(sizeof(double) * (k.count + 1));
    double *h_v = (double *)tu_malloc(sizeof(double) * (v.count + 1));
    double *h_do = (double *)tu_malloc(sizeof(double) * (dO.count + 1));
    double *oref = (double *)tu_malloc(sizeof(double) * (o.count + 1));
    double *lref = (double *)tu_malloc(sizeof(double) * (nlse + 1));
    double *got = (double *)tu_malloc(sizeof(double) * (q.count + k.count + 1));
    double *r_dq = (double *)tu_malloc(sizeof(double) * (dq.count + 1));
    double *r_dk = (double *)tu_malloc(sizeof(double) * (dk.count + 1));
    double *r_dv = (double *)tu_malloc(sizeof(double) * (dvt.count + 1));
    tu_fill_normal(rng, src, nin);
    tu_tensor_set(&q, src, h_q);
    tu_tensor_set(&k, src + q.count, h_k);
    tu_tensor_set(&v, src + q.count + k.count, h_v);
    tu_tensor_set(&dO, src + q.count + k.count + v.count, h_do);

    oracle_problem op = {c->batch, sq, sk, c->hq, c->hkv, d, d, c->scale, c->causal, c->cuq, c->cuk,
                         c->window, c->wl, c->wr, c->softcap, c->sink ? sinkd : NULL};
    oracle_fwd(&op, h_q, h_k, h_v, oref, lref);

    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = tu_problem(c->batch, sq, sk, c->hq, c->hkv, d, 0, c->causal, c->cuq, c->cuk);
    a.p.softmax_scale = c->scale;
    a.p.window = c->window;
    a.p.window_left = c->wl;
    a.p.window_right = c->wr;
    a.p.softcap = c->softcap;
    a.q = q.t;
    a.k = k.t;
    a.v = v.t;
    a.o = o.t;
    a.lse = lse;
    a.learnable_sink = c->sink ? sink : NULL;
    printf("%s%s\n", bwd_pass ? "bwd: " : "", c->name);
    fattn_status st = fattn_fwd(ctx, &a);
    TU_CHECK(st == FATTN_OK, "fattn_fwd: %s (%s)", fattn_status_string(st), fattn_last_error(ctx));
    const double tol = c->dt == FATTN_DTYPE_F32 ? TOL_F32 : TOL_BF16;
    if (st == FATTN_OK && !bwd_pass) {
        tu_tensor_get(&o, got);
        TU_CHECK(tu_count_nonfinite(got, o.count) == 0, "%zu output entries not written/finite",
                 tu_count_nonfinite(got, o.count));
        TU_EXPECT_LE(tu_rel_err(got, oref, o.count), tol, "O rel err");
        /* row by row: one wrong row (a lane at a window's edge) barely moves
         * the norm of the whole tensor; rows the oracle has at 0 (no key) must
         * be 0 */
        double worst = 0.0;
        for (size_t r = 0; r < o.count / (size_t)d; r++) {
            double e = tu_rel_err(got + r * (size_t)d, oref + r * (size_t)d, (size_t)d);
            if (!(e <= worst)) worst = e;
        }
        TU_EXPECT_LE(worst, c->dt == FATTN_DTYPE_F32 ? 1e-4 : 4 * TOL_BF16, "O worst row rel err");
        size_t nan = 0, inf_mismatch = 0;
        double lerr = 0.0;
        for (size_t i = 0; i < nlse; i++) {
            nan += isnan(lse[i]);
            inf_mismatch += (lref[i] == -INFINITY) != (lse[i] == -INFINITY);
            if (lref[i] != -INFINITY && fabs(lse[i] - lref[i]) > lerr) lerr = fabs(lse[i] - lref[i]);
        }
        TU_CHECK(nan == 0 && inf_mismatch == 0, "lse: %zu NaN, %zu -inf mismatches", nan, inf_mismatch);
        TU_EXPECT_LE(lerr, c->dt == FATTN_DTYPE_F32 ? TOL_LSE : 1e-2, "LSE max abs err");
    }
    if (st == FATTN_OK && bwd_pass) {
        oracle_bwd_sink(&op, h_q, h_k, h_v, h_do, r_dq, r_dk, r_dv, r_dsink);
        fattn_bwd_args ba;
        memset(&ba, 0, sizeof ba);
        ba.p = a.p;
        ba.q = q.t; ba.k = k.t; ba.v = v.t; ba.o = o.t; ba.dout = dO.t;
        ba.dq = dq.t; ba.dk = dk.t; ba.dv = dvt.t;
        ba.lse = lse;
        ba.learnable_sink = a.learnable_sink;
        ba.dsink = c->sink ? dsink : NULL;
        st = fattn_bwd(ctx, &ba);
        TU_CHECK(st == FATTN_OK, "fattn_bwd: %s (%s)", fattn_status_string(st), fattn_last_error(ctx));
        if (st == FATTN_OK) {
            const double btol = c->dt == FATTN_DTYPE_F32 ? TOL_BWD_F32 : TOL_BWD_BF16;
            const tu_tensor *outs[3] = {&dq, &dk, &dvt};
            const double *refs[3] = {r_dq, r_dk, r_dv};
            const char *names[3] = {"dQ rel err", "dK rel err", "dV rel err"};
            for (int t = 0; t < 3; t++) {
                tu_tensor_get(outs[t], got);
                size_t bad = tu_count_nonfinite(got, outs[t]->count);
                TU_CHECK(bad == 0, "%s: %zu entries not written/finite", names[t], bad);
                TU_EXPECT_LE(tu_rel_err(got, refs[t], outs[t]->count), btol, names[t]);
            }
            if (c->sink) {
                double g[64];
                for (int h = 0; h < c->hq; h++) g[h] = dsink[h];
                /* relative to the largest |dsink| of the call, so a head whose
                 * dsink is ~0 (sink -30) is held to the others' scale */
                double mx = 0.0, err = 0.0;
                for (int h = 0; h < c->hq; h++) {
                    if (fabs(r_dsink[h]) > mx) mx = fabs(r_dsink[h]);
                    if (!(fabs(g[h] - r_dsink[h]) <= err)) err = fabs(g[h] - r_dsink[h]);
                }
                TU_EXPECT_LE(err / (mx > 1e-30 ? mx : 1.0), btol, "dsink max err / max |dsink|");
            }
        }
    }
    free(src); free(h_q); free(h_k); free(h_v); free(h_do); free(oref); free(lref); free(got);
    free(r_dq); free(r_dk); free(r_dv); free(lse);
    tu_tensor_free(&q); tu_tensor_free(&k); tu_tensor_free(&v); tu_tensor_free(&o);
    tu_tensor_free(&dO); tu_tensor_free(&dq); tu_tensor_free(&dk); tu_tensor_free(&dvt);
}

/* The oracle's d(sink) against central differences of sum(dout * O) in FP64:
 * the derivation dsink_h = -sum_i exp(sink_h - LSE_i) D_i checked once
 * without trusting it. */
static void sink_finite_difference(tu_rng *rng) {
    const int B = 2, S = 9, H = 3, D = 8;
    const size_t n = (size_t)B * S * H * D;
    double *q = (double *)tu_malloc(sizeof(double) * n * 5), *k = q + n, *v = k + n, *dout = v + n, *o = dout + n;
    tu_fill_normal(rng, q, n * 4);
    double sink[3] = {-1.0, 0.5, 2.0}, ds[3];
    oracle_problem op = {B, S, S, H, H, D, D, 0.0, 1, NULL, NULL, 1, 3, 0, 5.0, sink};
    oracle_bwd_sink(&op, q, k, v, dout, NULL, NULL, NULL, ds);
    double worst = 0.0;
    for (int h = 0; h < H; h++) {
        const double eps = 1e-5, s0 = sink[h];
        double lp = 0.0, lm = 0.0;
        sink[h] = s0 + eps;
        oracle_fwd(&op, q, k, v, o, NULL);
        for (size_t i = 0; i < n; i++) lp += dout[i] * o[i];
        sink[h] = s0 - eps;
        oracle_fwd(&op, q, k, v, o, NULL);
        for (size_t i = 0; i < n; i++) lm += dout[i] * o[i];
        sink[h] = s0;
        const double fd = (lp - lm) / (2 * eps);
        const double e = fabs(fd - ds[h]) / (fabs(fd) > 1e-3 ? fabs(fd) : 1e-3);
        if (e > worst) worst = e;
    }
    TU_EXPECT_LE(worst, 1e-6, "oracle dsink vs central differences");
    free(q);
}

/* A key a row does not see contributes nothing to it, whatever k and v hold
 * (fattn.h, issue 43), on a window's left side too: keys 0..9 of 100 hold
 * NaN and Inf in k and v, window (5, 0), so rows 15.. never see them; their
 * O and LSE must be the oracle's (which never reads a hidden key). */
static void hidden_nonfinite(fattn_ctx *ctx, tu_rng *rng) {
    enum { S = 100, H = 2, D = 32, BAD = 10 };
    const size_t n = (size_t)S * H * D;
    double *x = (double *)tu_malloc(sizeof(double) * (3 * n + n + S * H));
    double *oref = x + 3 * n, *lref = oref + n;
    float *buf = (float *)tu_malloc(sizeof(float) * (4 * n + S * H));
    tu_fill_normal(rng, x, 3 * n);
    for (int j = 0; j < BAD; j++)
        for (int h = 0; h < H; h++)
            for (int e = 0; e < D; e++) {
                const size_t i = ((size_t)j * H + h) * D + e;
                x[n + i] = e % 3 == 0 ? NAN : x[n + i];
                x[2 * n + i] = e % 2 ? INFINITY : NAN;
            }
    for (size_t i = 0; i < 3 * n; i++) buf[i] = (float)x[i];
    oracle_problem op = {1, S, S, H, H, D, D, 0.0, 0, NULL, NULL, 1, 5, 0, 0.0, NULL};
    oracle_fwd(&op, x, x + n, x + 2 * n, oref, lref);
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = tu_problem(1, S, S, H, H, D, 0, 0, NULL, NULL);
    a.p.window = 1;
    a.p.window_left = 5;
    a.q = fattn_tensor_bshd(buf, FATTN_DTYPE_F32);
    a.k = fattn_tensor_bshd(buf + n, FATTN_DTYPE_F32);
    a.v = fattn_tensor_bshd(buf + 2 * n, FATTN_DTYPE_F32);
    a.o = fattn_tensor_bshd(buf + 3 * n, FATTN_DTYPE_F32);
    a.lse = buf + 4 * n;
    TU_EXPECT_OK(fattn_fwd(ctx, &a));
    double worst = 0.0;
    for (int i = BAD + 5; i < S; i++)
        for (int h = 0; h < H; h++) {
            for (int e = 0; e < D; e++) {
                const size_t t = ((size_t)i * H + h) * D + e;
                const double err = fabs(buf[3 * n + t] - oref[t]);
                if (!(err <= worst)) worst = err;
            }
            const double le = fabs(a.lse[h * S + i] - lref[h * S + i]);
            if (!(le <= worst)) worst = le;
        }
    TU_EXPECT_LE(worst, 1e-5, "NaN/Inf in keys left of the window: rows that do not see them, max abs err");
    free(x);
    free(buf);
}

/* The bits do not depend on the thread count (fattn.h, Determinism): the
 * task height changes with it, and the first key block a task visits with
 * it (a window's left side), so O, LSE, dq, dk, dv and dsink of 1 and 3
 * threads must be the same bytes. */
static void thread_count_bits(fattn_ctx *ctx, tu_rng *rng) {
    enum { S = 300, H = 4, HKV = 2, D = 32 };
    const size_t nq = (size_t)S * H * D, nk = (size_t)S * HKV * D;
    float *in = (float *)tu_malloc(sizeof(float) * (2 * nq + 2 * nk));
    double *x = (double *)tu_malloc(sizeof(double) * (2 * nq + 2 * nk));
    tu_fill_normal(rng, x, 2 * nq + 2 * nk);
    for (size_t i = 0; i < 2 * nq + 2 * nk; i++) in[i] = (float)x[i];
    const float sink[H] = {-1.0f, 0.0f, 2.0f, 30.0f};
    float *out[2];
    const size_t nout = 2 * nq + 2 * nk + (size_t)H * S + H; /* o, dq, dk, dv, lse, dsink */
    for (int t = 0; t < 2; t++) {
        out[t] = (float *)tu_malloc(sizeof(float) * nout);
        float *o = out[t], *dq = o + nq, *dk = dq + nq, *dv = dk + nk, *lse = dv + nk, *dsink = lse + (size_t)H * S;
        TU_EXPECT_OK(fattn_ctx_set_threads(ctx, t == 0 ? 1 : 3));
        fattn_fwd_args a;
        memset(&a, 0, sizeof a);
        a.p = tu_problem(1, S, S, H, HKV, D, 0, 1, NULL, NULL);
        a.p.window = 1;
        a.p.window_left = 70;
        a.p.softcap = 10.0f;
        a.q = fattn_tensor_bshd(in, FATTN_DTYPE_F32);
        a.k = fattn_tensor_bshd(in + nq, FATTN_DTYPE_F32);
        a.v = fattn_tensor_bshd(in + nq + nk, FATTN_DTYPE_F32);
        a.o = fattn_tensor_bshd(o, FATTN_DTYPE_F32);
        a.lse = lse;
        a.learnable_sink = sink;
        TU_EXPECT_OK(fattn_fwd(ctx, &a));
        fattn_bwd_args b;
        memset(&b, 0, sizeof b);
        b.p = a.p;
        b.q = a.q; b.k = a.k; b.v = a.v; b.o = a.o;
        b.dout = fattn_tensor_bshd(in + nq + 2 * nk, FATTN_DTYPE_F32);
        b.dq = fattn_tensor_bshd(dq, FATTN_DTYPE_F32);
        b.dk = fattn_tensor_bshd(dk, FATTN_DTYPE_F32);
        b.dv = fattn_tensor_bshd(dv, FATTN_DTYPE_F32);
        b.lse = lse;
        b.learnable_sink = sink;
        b.dsink = dsink;
        TU_EXPECT_OK(fattn_bwd(ctx, &b));
    }
    TU_CHECK(memcmp(out[0], out[1], sizeof(float) * nout) == 0,
             "window, softcap, sinks: 1 and 3 threads give different bits");
    TU_EXPECT_OK(fattn_ctx_set_threads(ctx, 0));
    free(out[0]);
    free(out[1]);
    free(in);
    free(x);
}

/* Each new field's refusal names the field and writes nothing. */
static void refusals(fattn_ctx *ctx) {
    enum { B = 1, S = 8, H = 2, D = 16 };
    static float q[B * S * H * D], k[B * S * H * D], v[B * S * H * D], o[B * S * H * D], lse[B * H * S];
    static float dq[B * S * H * D], dk[B * S * H * D], dv[B * S * H * D], dout[B * S * H * D];
    static float sinkbuf[H + 1], dsinkbuf[H + 1];
    for (int i = 0; i < B * S * H * D; i++) q[i] = k[i] = v[i] = dout[i] = 0.01f * (float)(i % 7);
    struct {
        int window, wl, wr;
        float softcap;
        int sink_off; /* 0: none, 1: aligned, 2: misaligned */
        const char *field;
    } bad[] = {
        {0, 3, 0, 0.0f, 0, "window_left"},
        {0, 0, -1, 0.0f, 0, "window_left"},
        {1, -2, 0, 0.0f, 0, "window_left"},
        {1, 0, -5, 0.0f, 0, "window_right"},
        {0, 0, 0, -1.0f, 0, "softcap"},
        {0, 0, 0, INFINITY, 0, "softcap"},
        {0, 0, 0, NAN, 0, "softcap"},
        {0, 0, 0, 0.0f, 2, "learnable_sink"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fattn_fwd_args a;
        memset(&a, 0, sizeof a);
        a.p = tu_problem(B, S, S, H, H, D, 0, 0, NULL, NULL);
        a.p.window = bad[i].window;
        a.p.window_left = bad[i].wl;
        a.p.window_right = bad[i].wr;
        a.p.softcap = bad[i].softcap;
        a.q = fattn_tensor_bshd(q, FATTN_DTYPE_F32);
        a.k = fattn_tensor_bshd(k, FATTN_DTYPE_F32);
        a.v = fattn_tensor_bshd(v, FATTN_DTYPE_F32);
        a.o = fattn_tensor_bshd(o, FATTN_DTYPE_F32);
        a.lse = lse;
        if (bad[i].sink_off) a.learnable_sink = (const float *)((const char *)sinkbuf + (bad[i].sink_off == 2 ? 1 : 0));
        tu_poison(o, sizeof o);
        tu_poison(lse, sizeof lse);
        fattn_status st = fattn_fwd(ctx, &a);
        TU_CHECK(st == FATTN_ERROR_INVALID_ARGUMENT, "case %zu: %d", i, (int)st);
        TU_CHECK(strstr(fattn_last_error(ctx), bad[i].field) != NULL, "case %zu: message '%s' does not name %s", i,
                 fattn_last_error(ctx), bad[i].field);
        int untouched = 1;
        for (size_t t = 0; t < sizeof o / sizeof o[0]; t++) untouched &= isnan(o[t]);
        for (size_t t = 0; t < sizeof lse / sizeof lse[0]; t++) untouched &= isnan(lse[t]);
        TU_CHECK(untouched, "case %zu: a refused call wrote its outputs", i);
    }
    /* the backward: dsink without learnable_sink, dsink misaligned, dsink on dq */
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = tu_problem(B, S, S, H, H, D, 0, 1, NULL, NULL);
    a.q = fattn_tensor_bshd(q, FATTN_DTYPE_F32);
    a.k = fattn_tensor_bshd(k, FATTN_DTYPE_F32);
    a.v = fattn_tensor_bshd(v, FATTN_DTYPE_F32);
    a.o = fattn_tensor_bshd(o, FATTN_DTYPE_F32);
    a.lse = lse;
    a.learnable_sink = sinkbuf;
    TU_EXPECT_OK(fattn_fwd(ctx, &a));
    struct {
        const float *sink;
        float *dsink;
        const char *field;
    } bb[] = {{NULL, dsinkbuf, "dsink"},
              {sinkbuf, (float *)((char *)dsinkbuf + 2), "dsink"},
              {sinkbuf, dq + 3, "dsink"},
              {(const float *)((const char *)sinkbuf + 1), dsinkbuf, "learnable_sink"}};
    for (size_t i = 0; i < sizeof bb / sizeof bb[0]; i++) {
        fattn_bwd_args ba;
        memset(&ba, 0, sizeof ba);
        ba.p = a.p;
        ba.q = a.q; ba.k = a.k; ba.v = a.v; ba.o = a.o;
        ba.dout = fattn_tensor_bshd(dout, FATTN_DTYPE_F32);
        ba.dq = fattn_tensor_bshd(dq, FATTN_DTYPE_F32);
        ba.dk = fattn_tensor_bshd(dk, FATTN_DTYPE_F32);
        ba.dv = fattn_tensor_bshd(dv, FATTN_DTYPE_F32);
        ba.lse = lse;
        ba.learnable_sink = bb[i].sink;
        ba.dsink = bb[i].dsink;
        tu_poison(dq, sizeof dq);
        tu_poison(dsinkbuf, sizeof dsinkbuf);
        fattn_status st = fattn_bwd(ctx, &ba);
        TU_CHECK(st == FATTN_ERROR_INVALID_ARGUMENT, "bwd case %zu: %d", i, (int)st);
        TU_CHECK(strstr(fattn_last_error(ctx), bb[i].field) != NULL, "bwd case %zu: message '%s' does not name %s",
                 i, fattn_last_error(ctx), bb[i].field);
        int untouched = 1;
        for (size_t t = 0; t < sizeof dq / sizeof dq[0]; t++) untouched &= isnan(dq[t]);
        TU_CHECK(untouched && isnan(dsinkbuf[0]), "bwd case %zu: a refused call wrote its outputs", i);
    }
    printf("refusals: %s\n", tu_failures ? "FAILED" : "ok");
}

int main(void) {
    tu_rng rng;
    tu_rng_init(&rng, (uint64_t)tu_seed());
    fattn_ctx *ctx = NULL;
    TU_EXPECT_OK(fattn_ctx_create(&ctx, FATTN_BACKEND_CPU, 0));
    if (!ctx) return 1;

    static const int32_t cuq[] = {0, 1, 18, 118}, cuk[] = {0, 17, 34, 291};
    const fattn_dtype F32 = FATTN_DTYPE_F32, BF16 = FATTN_DTYPE_BF16;
    const vcase cases[] = {
        /* name                                  b  sq   sk hq hkv  d cau win  wl  wr  cap sink base scale dt */
        {"window (0,0) 17x17",                   1, 17,  17, 2, 2, 32, 0, 1,  0,  0, 0.f, 0, 0, 0.f, F32, 0, 0},
        {"window (1,1) 100x100 GQA",             2,100, 100, 4, 2, 64, 0, 1,  1,  1, 0.f, 0, 0, 0.f, F32, 0, 0},
        {"window (5,-1) 257x257 (left < tile)",  1,257, 257, 2, 1, 64, 0, 1,  5, -1, 0.f, 0, 0, 0.f, F32, 0, 0},
        {"window (40,3) q100 k257",              1,100, 257, 2, 2, 32, 0, 1, 40,  3, 0.f, 0, 0, 0.f, F32, 0, 0},
        {"window (-1,7) q257 k100 (empty rows)", 1,257, 100, 2, 2, 32, 0, 1, -1,  7, 0.f, 0, 0, 0.f, F32, 0, 0},
        {"window (1000,1000) > seq, 100x257",    1,100, 257, 2, 1, 64, 0, 1,1000,1000,0.f, 0, 0, 0.f, F32, 0, 0},
        {"causal + window (70,0) 257x257",       1,257, 257, 3, 1, 64, 1, 1, 70,  0, 0.f, 0, 0, 0.f, F32, 0, 0},
        {"causal + window (9,-1) q100 k257 GQA", 2,100, 257, 4, 2, 32, 1, 1,  9, -1, 0.f, 0, 0, 0.f, F32, 0, 0},
        {"causal + window (3,5) q257 k100",      1,257, 100, 2, 2, 32, 1, 1,  3,  5, 0.f, 0, 0, 0.f, F32, 0, 0},
        {"window (2,0) q1 k17",                  3,  1,  17, 2, 1, 64, 0, 1,  2,  0, 0.f, 0, 0, 0.f, F32, 0, 0},
        {"window (-1,-1) == none, 17x100",       1, 17, 100, 2, 2, 32, 0, 1, -1, -1, 0.f, 0, 0, 0.f, F32, 0, 0},
        {"window (20,10) varlen",                3,  0,   0, 2, 1, 32, 0, 1, 20, 10, 0.f, 0, 0, 0.f, F32, cuq, cuk},
        {"causal window (6,0) varlen",           3,  0,   0, 4, 2, 32, 1, 1,  6,  0, 0.f, 0, 0, 0.f, F32, cuq, cuk},
        {"softcap 30 100x100",                   1,100, 100, 2, 2, 64, 0, 0,  0,  0,30.f, 0, 0, 0.f, F32, 0, 0},
        {"softcap 5, logits ~ 30 causal 257",    1,257, 257, 2, 1, 64, 1, 0,  0,  0, 5.f, 0, 0, 2.f, F32, 0, 0},
        {"softcap 1, logits ~ 60 q17 k257",      2, 17, 257, 4, 2, 64, 0, 0,  0,  0, 1.f, 0, 0, 4.f, F32, 0, 0},
        {"softcap 10 varlen causal",             3,  0,   0, 2, 2, 32, 1, 0,  0,  0,10.f, 0, 0, 1.f, F32, cuq, cuk},
        {"sink -30 100x100 causal",              1,100, 100, 4, 2, 64, 1, 0,  0,  0, 0.f, 1,-30, 0.f, F32, 0, 0},
        {"sink 0 q17 k257 GQA",                  2, 17, 257, 4, 1, 64, 0, 0,  0,  0, 0.f, 1,  0, 0.f, F32, 0, 0},
        {"sink +30 257x257 causal",              1,257, 257, 2, 2, 32, 1, 0,  0,  0, 0.f, 1, 30, 0.f, F32, 0, 0},
        {"sink 0 q257 k17 causal (empty rows)",  1,257,  17, 2, 1, 32, 1, 0,  0,  0, 0.f, 1,  0, 0.f, F32, 0, 0},
        {"sink 1 q1 k1",                         2,  1,   1, 3, 1, 16, 0, 0,  0,  0, 0.f, 1,  1, 0.f, F32, 0, 0},
        {"sink 0 varlen causal",                 3,  0,   0, 2, 1, 32, 1, 0,  0,  0, 0.f, 1,  0, 0.f, F32, cuq, cuk},
        {"all: causal window (8,0) cap 20 sink 2",1,257, 257, 4, 2, 64, 1, 1,  8,  0,20.f, 1,  2, 1.f, F32, 0, 0},
        {"all: window (0,0) q100 k17 sink +30",  1,100,  17, 2, 2, 32, 0, 1,  0,  0,15.f, 1, 30, 0.f, F32, 0, 0},
        {"all: window (30,30) varlen cap 8 sink -30",3,0, 0, 2, 2, 32, 0, 1, 30, 30, 8.f, 1,-30, 0.f, F32, cuq, cuk},
        {"bf16 causal window (16,0) cap 15 sink 0",2,100,100, 4, 2, 64, 1, 1, 16,  0,15.f, 1,  0, 0.f, BF16, 0, 0},
    };
    const size_t ncases = sizeof cases / sizeof cases[0];
    for (int isa = 0; cpu_isa_next(&isa, &ctx);) {
        for (size_t i = 0; i < ncases; i++) run_case(ctx, &rng, &cases[i]);
        hidden_nonfinite(ctx, &rng);
        thread_count_bits(ctx, &rng);
    }
    bwd_pass = 1;
    for (size_t i = 0; i < ncases; i++) run_case(ctx, &rng, &cases[i]);
    sink_finite_difference(&rng);
    refusals(ctx);
    fattn_ctx_free(ctx);
    return tu_finish("test_cpu_variants");
}
