/* test_bwd.cu - the CUDA 16-bit backward (fattn_bwd on a CUDA context)
 * against an FP64 oracle of the gradients.
 *
 * Each case draws q, k, v and dout (N(0, 1), rounded to bf16 or f16), runs
 * fattn_fwd on the CUDA context for o and lse, as a user would, then
 * fattn_bwd with the outputs poisoned (0xFF bytes: NaN in both formats).
 * Every tensor lives inside a larger buffer: 64 guard elements on each side
 * at least, and in the padded cases a slice of the heads with gaps after
 * each token and batch, or BHSD rows with gaps; input bytes outside the
 * views hold NaN (a read outside shows), output bytes outside the views must
 * still hold the poison afterwards.
 *
 * The reference is the exact gradient of the exact function of the rounded
 * inputs, in double: S = scale q k^T with the causal mask bottom-right
 * aligned (key j visible to query i iff j <= i + seqlen_k - seqlen_q, as
 * fattn.h defines it), P = softmax(S), O = P V, D_i = dO_i . O_i with the
 * oracle's own O, dS = P (dP - D) with dP = dO V^T, dV = P^T dO,
 * dQ = scale dS K, dK = scale dS^T Q, dK and dV summed over the query heads
 * of a kv head (GQA).  The kernel gets the GPU forward's 16-bit o and forms
 * its D from that, so the error of that o is part of what is measured (it
 * is part of what a user gets).  The oracle is the one of tests/common
 * (oracle_bwd) reorganised into three passes that run on all host cores
 * (rows: LSE, O, D; rows: dq; keys: dk, dv); on the small cases it is
 * checked against oracle_bwd itself.  softmax_scale is the float the call
 * passes (1/sqrt(d) rounded to float by default), as the kernel sees it.
 *
 * Tolerances, per tensor g of dq, dk, dv against the reference g*:
 *   |g - g*|_F / |g*|_F <= 1e-2 (bf16), 2e-3 (f16);
 *   max_i |g_i - g*_i| <= 0.5 rms(g*) (bf16), 0.08 rms(g*) (f16), where
 *     rms(g*) = |g*|_F / sqrt(n).
 * Why.  With unit roundoff u (bf16 2^-8, f16 2^-11) the final rounding of g
 * alone gives a relative RMS error of ~u/sqrt(3) x 0.75 ~ 2^-9 (bf16; 1.66e-3
 * measured, 2.07e-4 for f16).  A FlashAttention-style backward also rounds P
 * and dS to the input dtype before the dV, dK and dQ GEMMs (fp32
 * accumulation): each element of P or dS carries a relative error of the
 * same ~2^-9, independent across the terms of a GEMM's sum, so it adds
 * another ~2^-9 relative to the result; D from the 16-bit o moves dS by
 * P_ij dO_i . (o_i - O_i), ~2^-9 |O_i| per row, which relative to dQ's row
 * is ~2^-9 / sqrt(keys seen) (it only matters in the cancellation regime of
 * tests/test_cpu_bwd.c, a peaked softmax, which these N(0, 1) inputs with
 * scores of std 0.8 .. 2.4 avoid).  Expected: sqrt(2) 2^-9 ~ 2.8e-3 for bf16.
 * An emulation of exactly that arithmetic (P from the fp32 scores and lse, P
 * and dS rounded, fp32 GEMMs, D from the rounded O of an emulated forward,
 * outputs rounded: bench/bwd_error_model.py --seeds 3) over this file's
 * shapes measured 2.2-3.0e-3 (bf16) and 2.6-4.2e-4 (f16) Frobenius: the
 * bounds leave 3.4x (bf16) and 4.8x (f16) of headroom, and a wrong mask, a
 * lost key block, a missing head of a GQA sum or a wrong scale give errors
 * of 1e-1 or more.
 * The per-element bound is about the worst element, which the Frobenius
 * error does not see (one wrong element among 10^6 moves it by 10^-3 of
 * its size): the largest gradients (early causal rows with few keys, the
 * last keys) are 20-50x rms(g*), and rounding errors scale with them; the
 * same emulation gave max |g - g*| of at most 0.15 rms(g*) (bf16) and 0.019
 * rms(g*) (f16), 0.20 and 0.027 with other seeds: 2.5x and 3x headroom over
 * the latter.  A tensor whose
 * reference is exactly 0 (seqlen 1: dq = dk = 0) is held to the same
 * numbers in absolute terms.  Rows that see no key (causal,
 * seqlen_q > seqlen_k) must have dq exactly 0; nothing may be NaN.
 * Self-checks, on each GPU result that passes: the same comparison must
 * reject it scaled by 1 + 3 tol, with the 64 tokens of one head of largest
 * norm zeroed (a lost tile: at least 1/sqrt(blocks) >= 0.06 of the norm
 * here), and with its largest element's sign flipped.
 *
 * Also: deterministic = 1 gives the same bits on repeated calls (causal and
 * not, thousands of tokens, many heads, GQA: where atomics would race);
 * refusals (lse NULL, heads_q % heads_kv != 0, e4m3, overlapping outputs)
 * leave dq, dk, dv as they were; the second of two identical calls,
 * captured into a CUDA graph on the context's stream (fattn_ctx_set_stream),
 * replays to the first call's result.
 *
 * Head dim 256: UNSUPPORTED from fattn_bwd prints "SKIP d256: <message>" and
 * the case is counted, not failed, unless FATTN_REQUIRE_BWD_D256=1.  Any
 * other status but FATTN_OK fails.  Exit 77 (ctest: skipped) without a Hopper
 * GPU, or while the CUDA engine has no backward at all (UNSUPPORTED for a
 * small d64 bf16 call); FATTN_REQUIRE_GPU=1 makes both a failure.
 * FATTN_CUDA_ENGINE=portable (a ctest entry of its own, tests/CMakeLists.txt):
 * the same cases on the portable backward (issue 41), whatever sm_80+ GPU
 * runs them.
 * FATTN_TEST_SMALL=1 runs the small shapes only (compute-sanitizer runs);
 * FATTN_TEST_SEED=N or =random draws other inputs. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "common/oracle.h"
#include "fattn.h"
#include "gpu/gpu_testutil.h"

static int env_on(const char *name) {
    const char *v = getenv(name);
    return v && v[0] && strcmp(v, "0") != 0;
}


static int g_skipped_d256 = 0;  /* cases whose fattn_bwd answered UNSUPPORTED at d256 */
static double g_oracle_s = 0.0; /* host seconds in the oracle */

/* ---- the host's cores ------------------------------------------------------- */

/* f(i, scratch) for i in [0, n) over the host's cores, one scratch object per
 * worker.  Every i writes its own outputs: the result is the same for any
 * thread count. */
template <class S, class F>
static void parallel_for(size_t n, F f) {
    unsigned nt = std::thread::hardware_concurrency();
    nt = nt ? std::min(nt, 64u) : 1u;
    if (n < 64) nt = 1;
    std::atomic<size_t> next{0};
    auto work = [&]() {
        S scratch;
        for (;;) {
            const size_t i0 = next.fetch_add(4);
            if (i0 >= n) break;
            for (size_t i = i0; i < std::min(n, i0 + 4); ++i) f(i, scratch);
        }
    };
    std::vector<std::thread> th;
    for (unsigned t = 1; t < nt; ++t) th.emplace_back(work);
    work();
    for (auto &t : th) t.join();
}

/* ---- the FP64 oracle ------------------------------------------------------------ */

struct shape {
    int B, sq, sk, hq, hkv, D, causal;
    double scale; /* as the kernel sees it */
};

static inline double dot(const double *a, const double *b, int n) {
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int t = 0;
    for (; t + 4 <= n; t += 4) {
        s0 += a[t] * b[t];
        s1 += a[t + 1] * b[t + 1];
        s2 += a[t + 2] * b[t + 2];
        s3 += a[t + 3] * b[t + 3];
    }
    for (; t < n; ++t) s0 += a[t] * b[t];
    return (s0 + s1) + (s2 + s3);
}

/* The last key query row i sees (< 0: none). */
static inline int64_t last_key(const shape &s, int64_t i) {
    int64_t last = s.causal ? i + s.sk - s.sq : s.sk - 1;
    return last < s.sk - 1 ? last : s.sk - 1;
}

struct oracle_out {
    std::vector<double> o, dq, dk, dv; /* packed BSHD */
    std::vector<double> lse, Dr;       /* [B, hq, sq] */
};

/* Packed BSHD doubles in; see the file comment for what is computed. */
static void ref_bwd(const shape &s, const double *q, const double *k, const double *v, const double *dout,
                    oracle_out &r) {
    const auto t0 = std::chrono::steady_clock::now();
    const int D = s.D, g = s.hq / s.hkv;
    const size_t nq = (size_t)s.B * s.sq * s.hq * D, nk = (size_t)s.B * s.sk * s.hkv * D;
    const size_t rows = (size_t)s.B * s.hq * s.sq, cols = (size_t)s.B * s.hkv * s.sk;
    r.o.assign(nq, 0.0);
    r.dq.assign(nq, 0.0);
    r.dk.assign(nk, 0.0);
    r.dv.assign(nk, 0.0);
    r.lse.assign(rows, -INFINITY);
    r.Dr.assign(rows, 0.0);
    auto qoff = [&](int64_t b, int64_t i, int64_t h) { return (size_t)(((b * s.sq + i) * s.hq + h) * D); };
    auto koff = [&](int64_t b, int64_t j, int64_t hk) { return (size_t)(((b * s.sk + j) * s.hkv + hk) * D); };
    /* pass 1, per query row (index in the LSE layout): LSE, O, D */
    parallel_for<std::vector<double>>(rows, [&](size_t row, std::vector<double> &sc) {
        const int64_t b = row / ((size_t)s.hq * s.sq), h = (row / s.sq) % s.hq, i = row % s.sq, hk = h / g;
        const int64_t last = last_key(s, i);
        if (last < 0) return;
        sc.resize((size_t)s.sk);
        const double *qi = q + qoff(b, i, h);
        double m = -INFINITY;
        for (int64_t j = 0; j <= last; ++j) {
            sc[j] = s.scale * dot(qi, k + koff(b, j, hk), D);
            m = std::max(m, sc[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j <= last; ++j) sum += exp(sc[j] - m);
        const double lse = m + log(sum);
        double *oi = r.o.data() + qoff(b, i, h);
        for (int64_t j = 0; j <= last; ++j) {
            const double p = exp(sc[j] - lse);
            const double *vj = v + koff(b, j, hk);
            for (int t = 0; t < D; ++t) oi[t] += p * vj[t];
        }
        r.lse[row] = lse;
        r.Dr[row] = dot(dout + qoff(b, i, h), oi, D);
    });
    /* pass 2, per query row: dq */
    parallel_for<int>(rows, [&](size_t row, int &) {
        const int64_t b = row / ((size_t)s.hq * s.sq), h = (row / s.sq) % s.hq, i = row % s.sq, hk = h / g;
        const int64_t last = last_key(s, i);
        const double *qi = q + qoff(b, i, h), *doi = dout + qoff(b, i, h);
        double *dqi = r.dq.data() + qoff(b, i, h);
        for (int64_t j = 0; j <= last; ++j) {
            const double *kj = k + koff(b, j, hk);
            const double p = exp(s.scale * dot(qi, kj, D) - r.lse[row]);
            const double ds = p * (dot(doi, v + koff(b, j, hk), D) - r.Dr[row]);
            for (int t = 0; t < D; ++t) dqi[t] += s.scale * ds * kj[t];
        }
    });
    /* pass 3, per key of a kv head: dk, dv summed over the group's query heads */
    parallel_for<int>(cols, [&](size_t col, int &) {
        const int64_t b = col / ((size_t)s.hkv * s.sk), hk = (col / s.sk) % s.hkv, j = col % s.sk;
        const double *kj = k + koff(b, j, hk), *vj = v + koff(b, j, hk);
        double *dkj = r.dk.data() + koff(b, j, hk), *dvj = r.dv.data() + koff(b, j, hk);
        const int64_t first = s.causal ? std::max<int64_t>(0, j - (s.sk - s.sq)) : 0; /* first row that sees j */
        for (int64_t h = hk * g; h < (hk + 1) * g; ++h)
            for (int64_t i = first; i < s.sq; ++i) {
                const size_t row = (size_t)((b * s.hq + h) * s.sq + i);
                const double *qi = q + qoff(b, i, h), *doi = dout + qoff(b, i, h);
                const double p = exp(s.scale * dot(qi, kj, D) - r.lse[row]);
                const double ds = p * (dot(doi, vj, D) - r.Dr[row]);
                for (int t = 0; t < D; ++t) {
                    dkj[t] += s.scale * ds * qi[t];
                    dvj[t] += p * doi[t];
                }
            }
    });
    g_oracle_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/* ---- views of larger buffers -------------------------------------------------- */

enum view_kind { V_PACKED, V_SLICE, V_BHSD, V_QKV };

static const char *view_name(int v) {
    return v == V_SLICE ? "padded head slices" : v == V_BHSD ? "padded BHSD" : v == V_QKV ? "packed QKV in" : "packed";
}

/* A [B, S, H, D] 16-bit tensor inside a larger buffer: strides and offset of
 * its first element (elements), and the buffer's length. 64 guard elements
 * (128 bytes, keeping 16-byte alignment) before and after every kind. */
struct view {
    int64_t sb, ss, sh, off;
    size_t n;
};

static view make_view(int kind, int B, int S, int H, int D) {
    view v;
    if (kind == V_SLICE) { /* heads 2 .. H + 1 of H + 3, 64 elements after each token, 128 after each batch */
        v.sh = D;
        v.ss = (int64_t)(H + 3) * D + 64;
        v.sb = S * v.ss + 128;
        v.off = 64 + 2 * D;
    } else if (kind == V_BHSD) { /* rows D + 8 apart, 8 more after each head, 16 after each batch */
        v.ss = D + 8;
        v.sh = S * v.ss + 8;
        v.sb = H * v.sh + 16;
        v.off = 64 + 8;
    } else {
        v.sh = D;
        v.ss = (int64_t)H * D;
        v.sb = S * v.ss;
        v.off = 64;
    }
    v.n = (size_t)(v.off + B * v.sb + 64);
    return v;
}

static size_t at(const view &v, int b, int s, int h) { return (size_t)(v.off + b * v.sb + s * v.ss + h * v.sh); }

static void scatter(uint16_t *buf, const view &v, const uint16_t *packed, int B, int S, int H, int D) {
    for (int b = 0; b < B; ++b)
        for (int s = 0; s < S; ++s)
            for (int h = 0; h < H; ++h)
                memcpy(buf + at(v, b, s, h), packed + (((size_t)b * S + s) * H + h) * D, 2 * (size_t)D);
}

static void gather(const uint16_t *buf, const view &v, uint16_t *packed, int B, int S, int H, int D) {
    for (int b = 0; b < B; ++b)
        for (int s = 0; s < S; ++s)
            for (int h = 0; h < H; ++h)
                memcpy(packed + (((size_t)b * S + s) * H + h) * D, buf + at(v, b, s, h), 2 * (size_t)D);
}

/* Elements of buf outside the view that no longer hold 0xFFFF. */
static size_t written_outside(uint16_t *buf, const view &v, int B, int S, int H, int D) {
    for (int b = 0; b < B; ++b)
        for (int s = 0; s < S; ++s)
            for (int h = 0; h < H; ++h)
                for (int e = 0; e < D; ++e) buf[at(v, b, s, h) + e] = 0xFFFF;
    size_t n = 0;
    for (size_t i = 0; i < v.n; ++i) n += buf[i] != 0xFFFF;
    return n;
}

static fattn_tensor tensor_of(uint16_t *base, const view &v, fattn_dtype dt) {
    fattn_tensor t = {base + v.off, dt, v.sb, v.ss, v.sh, NULL, 0};
    return t;
}

/* Doubles -> the dtype's bits, and `held` the exact values those bits are. */
static void to_bits(const double *x, size_t n, fattn_dtype dt, uint16_t *bits, double *held) {
    tu_to_dtype(x, n, dt, bits);
    tu_from_dtype(bits, n, dt, held);
}

/* ---- comparison ------------------------------------------------------------------ */

/* The self-checks: perturbed copies of a passing g that the comparison must
 * reject.  Returns the count rejected; *tried the count made (none when g*
 * is all zero).  Rows of the packed BSHD tensor [B, S, H, D]. */
static int perturbed_rejected(const double *g, const double *r, int B, int S, int H, int D, fattn_dtype dt,
                              int *tried) {
    const size_t n = (size_t)B * S * H * D;
    *tried = 0;
    double ss = 0, big = 0;
    size_t ibig = 0;
    for (size_t i = 0; i < n; ++i) {
        ss += r[i] * r[i];
        if (fabs(r[i]) > big) big = fabs(r[i]), ibig = i;
    }
    if (ss == 0) return 0;
    std::vector<double> p(g, g + n);
    int rejected = 0;
    /* scaled by 1 + 3 tol */
    for (size_t i = 0; i < n; ++i) p[i] = g[i] * (1 + 3 * tol_fro(dt));
    rejected += !grad_ok(grad_stat(p.data(), r, n), dt);
    /* the 64 tokens of one (batch, head) with the largest reference norm zeroed: a lost tile */
    double best = -1;
    int bb = 0, bs = 0, bh = 0;
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
            for (int s0 = 0; s0 < S; s0 += 64) {
                double e = 0;
                for (int s = s0; s < std::min(S, s0 + 64); ++s) {
                    const double *x = r + (((size_t)b * S + s) * H + h) * D;
                    for (int t = 0; t < D; ++t) e += x[t] * x[t];
                }
                if (e > best) best = e, bb = b, bs = s0, bh = h;
            }
    memcpy(p.data(), g, n * sizeof(double));
    for (int s = bs; s < std::min(S, bs + 64); ++s)
        for (int t = 0; t < D; ++t) p[(((size_t)bb * S + s) * H + bh) * D + t] = 0.0;
    rejected += !grad_ok(grad_stat(p.data(), r, n), dt);
    /* the largest element's sign flipped */
    memcpy(p.data(), g, n * sizeof(double));
    p[ibig] = -g[ibig];
    rejected += !grad_ok(grad_stat(p.data(), r, n), dt);
    *tried = 3;
    return rejected;
}

/* fattn_bwd's status for a case: 1 ran, 0 skipped (UNSUPPORTED at d256,
 * counted), -1 failed (counted). */
static int bwd_status(fattn_ctx *ctx, fattn_status st, int d, const char *what) {
    if (st == FATTN_OK) return 1;
    if (st == FATTN_ERROR_UNSUPPORTED && d == 256) {
        g_skipped_d256++;
        if (env_on("FATTN_REQUIRE_BWD_D256")) {
            tu_failures++;
            printf("FAIL d256 (FATTN_REQUIRE_BWD_D256 is set): %s: %s\n", what, fattn_last_error(ctx));
            return -1;
        }
        printf("SKIP d256: %s: %s\n", what, fattn_last_error(ctx));
        return 0;
    }
    tu_failures++;
    printf("FAIL %s: fattn_bwd: %s: %s\n", what, fattn_status_string(st), fattn_last_error(ctx));
    return -1;
}

/* ---- the cases against the oracle ---------------------------------------------- */

struct bcase {
    int batch, sq, sk, hq, hkv, d, causal;
    fattn_dtype dt;
    float scale; /* given to the call; 0: the default 1/sqrt(d) */
    int view;    /* view_kind of every tensor (V_QKV: q, k, v of one buffer, sq == sk; the rest V_SLICE) */
};

static void run_case(fattn_ctx *ctx, tu_rng *rng, const bcase &c, int deterministic) {
    const int B = c.batch, D = c.d;
    const float scale_f = c.scale > 0 ? c.scale : (float)(1.0 / sqrt((double)D));
    const shape sh = {B, c.sq, c.sk, c.hq, c.hkv, D, c.causal, (double)scale_f};
    const size_t nq = (size_t)B * c.sq * c.hq * D, nk = (size_t)B * c.sk * c.hkv * D, nlse = (size_t)B * c.hq * c.sq;
    char what[200];
    snprintf(what, sizeof what, "%s b%d sq%d sk%d h%d/%d d%d%s scale %.4g%s, %s", fattn_dtype_name(c.dt), B, c.sq,
             c.sk, c.hq, c.hkv, D, c.causal ? " causal" : "", (double)scale_f, c.scale > 0 ? "" : " (default)",
             view_name(c.view));

    /* inputs: rounded to the dtype; h* the exact values the kernel sees */
    std::vector<double> hq(nq), hk(nk), hv(nk), hdo(nq);
    std::vector<uint16_t> bq(nq), bk(nk), bv(nk), bdo(nq);
    tu_fill_normal(rng, hq.data(), nq);
    tu_fill_normal(rng, hk.data(), nk);
    tu_fill_normal(rng, hv.data(), nk);
    tu_fill_normal(rng, hdo.data(), nq);
    to_bits(hq.data(), nq, c.dt, bq.data(), hq.data());
    to_bits(hk.data(), nk, c.dt, bk.data(), hk.data());
    to_bits(hv.data(), nk, c.dt, bv.data(), hv.data());
    to_bits(hdo.data(), nq, c.dt, bdo.data(), hdo.data());

    const int shared = c.view == V_QKV, okind = shared ? V_SLICE : c.view;
    view vq, vk, vv;
    if (shared) {
        vq = make_view(V_PACKED, B, c.sq, c.hq + 2 * c.hkv, D);
        vk = vv = vq;
        vk.off += (int64_t)c.hq * D;
        vv.off += (int64_t)(c.hq + c.hkv) * D;
    } else {
        vq = make_view(c.view, B, c.sq, c.hq, D);
        vk = make_view(c.view, B, c.sk, c.hkv, D);
        vv = make_view(c.view, B, c.sk, c.hkv, D);
    }
    const view vo = make_view(okind, B, c.sq, c.hq, D), vdo = vo;
    const view vgq = make_view(okind, B, c.sq, c.hq, D), vgk = make_view(okind, B, c.sk, c.hkv, D), vgv = vgk;
    const size_t in_n = shared ? vq.n : vq.n + vk.n + vv.n;
    std::vector<uint16_t> host(std::max(in_n, vdo.n), 0x7FC1); /* NaN in both formats outside the views */
    uint16_t *hbq = host.data(), *hbk = shared ? hbq : hbq + vq.n, *hbv = shared ? hbq : hbk + vk.n;
    scatter(hbq, vq, bq.data(), B, c.sq, c.hq, D);
    scatter(hbk, vk, bk.data(), B, c.sk, c.hkv, D);
    scatter(hbv, vv, bv.data(), B, c.sk, c.hkv, D);
    uint16_t *din, *ddo, *dob, *dgq, *dgk, *dgv;
    float *dlse;
    CK(cudaMalloc(&din, in_n * 2));
    CK(cudaMalloc(&ddo, vdo.n * 2));
    CK(cudaMalloc(&dob, vo.n * 2));
    CK(cudaMalloc(&dgq, vgq.n * 2));
    CK(cudaMalloc(&dgk, vgk.n * 2));
    CK(cudaMalloc(&dgv, vgv.n * 2));
    CK(cudaMalloc(&dlse, nlse * 4));
    CK(cudaMemcpy(din, host.data(), in_n * 2, cudaMemcpyHostToDevice));
    std::fill(host.begin(), host.end(), (uint16_t)0x7FC1);
    scatter(host.data(), vdo, bdo.data(), B, c.sq, c.hq, D);
    CK(cudaMemcpy(ddo, host.data(), vdo.n * 2, cudaMemcpyHostToDevice));
    CK(cudaMemset(dob, 0xFF, vo.n * 2));
    CK(cudaMemset(dlse, 0xFF, nlse * 4));
    uint16_t *dq = din, *dk = shared ? din : din + vq.n, *dv = shared ? din : dk + vk.n;

    fattn_fwd_args fa;
    memset(&fa, 0, sizeof fa);
    fa.p = tu_problem(B, c.sq, c.sk, c.hq, c.hkv, D, 0, c.causal, NULL, NULL);
    fa.p.softmax_scale = c.scale;
    fa.q = tensor_of(dq, vq, c.dt);
    fa.k = tensor_of(dk, vk, c.dt);
    fa.v = tensor_of(dv, vv, c.dt);
    fa.o = tensor_of(dob, vo, c.dt);
    fa.lse = dlse;
    fattn_status st = fattn_fwd(ctx, &fa);
    int ran = -1;
    if (st != FATTN_OK) {
        tu_failures++;
        printf("FAIL %s: fattn_fwd: %s: %s\n", what, fattn_status_string(st), fattn_last_error(ctx));
    } else {
        fattn_bwd_args ba;
        memset(&ba, 0, sizeof ba);
        ba.p = fa.p;
        ba.q = fa.q;
        ba.k = fa.k;
        ba.v = fa.v;
        ba.o = fa.o;
        ba.dout = tensor_of(ddo, vdo, c.dt);
        ba.dq = tensor_of(dgq, vgq, c.dt);
        ba.dk = tensor_of(dgk, vgk, c.dt);
        ba.dv = tensor_of(dgv, vgv, c.dt);
        ba.lse = dlse;
        ba.deterministic = deterministic;
        CK(cudaMemset(dgq, 0xFF, vgq.n * 2));
        CK(cudaMemset(dgk, 0xFF, vgk.n * 2));
        CK(cudaMemset(dgv, 0xFF, vgv.n * 2));
        ran = bwd_status(ctx, fattn_bwd(ctx, &ba), D, what);
    }
    const cudaError_t e = cudaDeviceSynchronize();
    TU_CHECK(e == cudaSuccess, "%s: kernel failed: %s", what, cudaGetErrorString(e));
    if (e != cudaSuccess) exit(1);
    if (ran == 1) {
        /* the GPU's o (for the line: the forward's share) and gradients */
        std::vector<uint16_t> back(std::max({vo.n, vgq.n, vgk.n}));
        std::vector<uint16_t> bits(std::max(nq, nk));
        std::vector<double> go(nq), gq(nq), gk(nk), gv(nk);
        CK(cudaMemcpy(back.data(), dob, vo.n * 2, cudaMemcpyDeviceToHost));
        gather(back.data(), vo, bits.data(), B, c.sq, c.hq, D);
        tu_from_dtype(bits.data(), nq, c.dt, go.data());
        uint16_t *outs[3] = {dgq, dgk, dgv};
        const view *ov[3] = {&vgq, &vgk, &vgv};
        double *gd[3] = {gq.data(), gk.data(), gv.data()};
        const int S_[3] = {c.sq, c.sk, c.sk}, H_[3] = {c.hq, c.hkv, c.hkv};
        const char *names[3] = {"dq", "dk", "dv"};
        size_t outside_all = 0;
        for (int t = 0; t < 3; ++t) {
            CK(cudaMemcpy(back.data(), outs[t], ov[t]->n * 2, cudaMemcpyDeviceToHost));
            gather(back.data(), *ov[t], bits.data(), B, S_[t], H_[t], D);
            tu_from_dtype(bits.data(), (size_t)B * S_[t] * H_[t] * D, c.dt, gd[t]);
            const size_t outside = written_outside(back.data(), *ov[t], B, S_[t], H_[t], D);
            TU_CHECK(outside == 0, "%s: %zu elements written outside %s's view", what, outside, names[t]);
            outside_all += outside;
        }

        oracle_out r;
        ref_bwd(sh, hq.data(), hk.data(), hv.data(), hdo.data(), r);
        const double *refs[3] = {r.dq.data(), r.dk.data(), r.dv.data()};
        const size_t cnt[3] = {nq, nk, nk};
        char line[768];
        int len = snprintf(line, sizeof line, "%s:", what);
        int ok = 1, rejected = 0, tried = 0, oracle_ok = 1;
        for (int t = 0; t < 3; ++t) {
            const gstat gs = grad_stat(gd[t], refs[t], cnt[t]);
            const int pass = grad_ok(gs, c.dt);
            ok &= pass;
            len += snprintf(line + len, sizeof line - len, " %s %.2e max %.3f%s%s |", names[t], gs.fro, gs.maxr,
                            gs.nonfinite ? " NONFINITE" : "", pass ? "" : " FAIL");
            if (!pass)
                fprintf(stderr, "%s: %s: rel Frobenius %.3e (tol %.1e), max abs / rms %.3e (tol %.2f), %zu non-finite\n",
                        what, names[t], gs.fro, tol_fro(c.dt), gs.maxr, tol_max(c.dt), gs.nonfinite);
            if (pass) {
                int n_tried;
                rejected += perturbed_rejected(gd[t], refs[t], B, S_[t], H_[t], D, c.dt, &n_tried);
                tried += n_tried;
            }
        }
        /* rows that see no key: dq exactly 0 */
        size_t nonzero_rows = 0, empty_rows = 0;
        for (int b = 0; b < B; ++b)
            for (int i = 0; i < c.sq; ++i) {
                if (last_key(sh, i) >= 0) continue;
                for (int h = 0; h < c.hq; ++h) {
                    const double *x = gq.data() + (((size_t)b * c.sq + i) * c.hq + h) * D;
                    int nz = 0;
                    for (int t = 0; t < D; ++t) nz |= x[t] != 0.0;
                    nonzero_rows += nz;
                    empty_rows++;
                }
            }
        if (empty_rows) {
            len += snprintf(line + len, sizeof line - len, " %zu rows see no key%s |", empty_rows,
                            nonzero_rows ? " (NONZERO dq)" : ", dq 0");
            TU_CHECK(nonzero_rows == 0, "%s: %zu of the %zu rows that see no key have dq != 0", what, nonzero_rows,
                     empty_rows);
        }
        len += snprintf(line + len, sizeof line - len, " fwd O %.2e | perturbed %d/%d rejected",
                        tu_rel_err(go.data(), r.o.data(), nq), rejected, tried);
        TU_CHECK(rejected == tried, "%s: only %d of %d perturbed gradients were rejected", what, rejected, tried);
        /* the three-pass oracle against tests/common's oracle_bwd, where that is cheap */
        if ((double)B * c.hq * c.sq * c.sk * D <= 5e7) {
            oracle_problem op = {B, c.sq, c.sk, c.hq, c.hkv, D, D, (double)scale_f, c.causal, NULL, NULL};
            std::vector<double> x[3] = {std::vector<double>(nq), std::vector<double>(nk), std::vector<double>(nk)};
            oracle_bwd(&op, hq.data(), hk.data(), hv.data(), hdo.data(), x[0].data(), x[1].data(), x[2].data());
            double worst = 0;
            for (int t = 0; t < 3; ++t) worst = std::max(worst, tu_rel_err(x[t].data(), refs[t], cnt[t]));
            oracle_ok = worst <= 1e-12;
            TU_CHECK(oracle_ok, "%s: the oracle differs from oracle_bwd by %.3e", what, worst);
            len += snprintf(line + len, sizeof line - len, ", oracle = oracle_bwd %s", oracle_ok ? "ok" : "NO");
        }
        if (outside_all) len += snprintf(line + len, sizeof line - len, ", %zu ELEMENTS WRITTEN OUTSIDE", outside_all);
        if (!ok) tu_failures++;
        const int all_ok = ok && rejected == tried && !nonzero_rows && oracle_ok && !outside_all;
        printf("  [%s] %s\n", all_ok ? "ok" : "FAIL", line);
        fflush(stdout);
    }
    cudaFree(din); cudaFree(ddo); cudaFree(dob); cudaFree(dgq); cudaFree(dgk); cudaFree(dgv); cudaFree(dlse);
}

/* ---- device problems for the bit-for-bit checks ------------------------------- */

/* Packed BSHD bf16 q, k, v, dout of N(0, 1) values on the device, o and lse
 * from fattn_fwd, and `sets` sets of dq, dk, dv. */
struct dev_bwd {
    fattn_bwd_args a;
    uint16_t *q, *k, *v, *o, *dout, *g[3][3]; /* g[set][dq, dk, dv] */
    float *lse;
    size_t n[3]; /* elements of dq, dk, dv */
    int sets;
};

static void dev_bwd_make(dev_bwd *p, fattn_ctx *ctx, tu_rng *rng, int B, int S, int hq, int hkv, int D, int causal,
                         int sets) {
    memset(p, 0, sizeof *p);
    const fattn_dtype dt = FATTN_DTYPE_BF16;
    const size_t nq = (size_t)B * S * hq * D, nk = (size_t)B * S * hkv * D;
    p->n[0] = nq;
    p->n[1] = p->n[2] = nk;
    p->sets = sets;
    std::vector<double> x(nq);
    std::vector<uint16_t> bits(nq);
    uint16_t **in[4] = {&p->q, &p->k, &p->v, &p->dout};
    const size_t nin[4] = {nq, nk, nk, nq};
    for (int t = 0; t < 4; ++t) {
        CK(cudaMalloc(in[t], nin[t] * 2));
        tu_fill_normal(rng, x.data(), nin[t]);
        tu_to_dtype(x.data(), nin[t], dt, bits.data());
        CK(cudaMemcpy(*in[t], bits.data(), nin[t] * 2, cudaMemcpyHostToDevice));
    }
    CK(cudaMalloc(&p->o, nq * 2));
    CK(cudaMalloc(&p->lse, (size_t)B * hq * S * 4));
    for (int s = 0; s < sets; ++s)
        for (int t = 0; t < 3; ++t) CK(cudaMalloc(&p->g[s][t], p->n[t] * 2));
    fattn_bwd_args *a = &p->a;
    a->p = tu_problem(B, S, S, hq, hkv, D, 0, causal, NULL, NULL);
    a->q = fattn_tensor_bshd(p->q, dt);
    a->k = fattn_tensor_bshd(p->k, dt);
    a->v = fattn_tensor_bshd(p->v, dt);
    a->o = fattn_tensor_bshd(p->o, dt);
    a->dout = fattn_tensor_bshd(p->dout, dt);
    a->lse = p->lse;
    fattn_fwd_args fa;
    memset(&fa, 0, sizeof fa);
    fa.p = a->p;
    fa.q = a->q;
    fa.k = a->k;
    fa.v = a->v;
    fa.o = a->o;
    fa.lse = p->lse;
    const fattn_status st = fattn_fwd(ctx, &fa);
    TU_CHECK(st == FATTN_OK, "fattn_fwd: %s: %s", fattn_status_string(st), fattn_last_error(ctx));
    CK(cudaDeviceSynchronize());
}

/* Point the call's outputs at set s, poisoned (on `stream`). */
static void dev_bwd_use(dev_bwd *p, int s, cudaStream_t stream) {
    for (int t = 0; t < 3; ++t) CK(cudaMemsetAsync(p->g[s][t], 0xFF, p->n[t] * 2, stream));
    p->a.dq = fattn_tensor_bshd(p->g[s][0], FATTN_DTYPE_BF16);
    p->a.dk = fattn_tensor_bshd(p->g[s][1], FATTN_DTYPE_BF16);
    p->a.dv = fattn_tensor_bshd(p->g[s][2], FATTN_DTYPE_BF16);
}

/* Set s's dq, dk, dv to the host, one after another in h. */
static std::vector<uint16_t> dev_bwd_get(const dev_bwd *p, int s) {
    std::vector<uint16_t> h(p->n[0] + p->n[1] + p->n[2]);
    CK(cudaMemcpy(h.data(), p->g[s][0], p->n[0] * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h.data() + p->n[0], p->g[s][1], p->n[1] * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h.data() + p->n[0] + p->n[1], p->g[s][2], p->n[2] * 2, cudaMemcpyDeviceToHost));
    return h;
}

static void dev_bwd_free(dev_bwd *p) {
    cudaFree(p->q); cudaFree(p->k); cudaFree(p->v); cudaFree(p->o); cudaFree(p->dout); cudaFree(p->lse);
    for (int s = 0; s < p->sets; ++s)
        for (int t = 0; t < 3; ++t) cudaFree(p->g[s][t]);
}

static size_t count_poisoned(const std::vector<uint16_t> &h) {
    size_t n = 0;
    for (uint16_t x : h) n += x == 0xFFFF;
    return n;
}

/* The relative Frobenius difference of two bf16 gradient sets. */
static double bits_rel_diff(const std::vector<uint16_t> &a, const std::vector<uint16_t> &b) {
    std::vector<double> x(a.size()), y(b.size());
    tu_from_dtype(a.data(), a.size(), FATTN_DTYPE_BF16, x.data());
    tu_from_dtype(b.data(), b.size(), FATTN_DTYPE_BF16, y.data());
    return tu_rel_err(x.data(), y.data(), x.size());
}

/* deterministic = 1: `reps` more calls give the first call's bits.  Then
 * deterministic = 0 twice, for the record (bits may differ there). */
static void determinism(fattn_ctx *ctx, tu_rng *rng, int B, int S, int hq, int hkv, int D, int causal, int reps) {
    char what[160];
    snprintf(what, sizeof what, "determinism bf16 b%d s%d h%d/%d d%d%s", B, S, hq, hkv, D, causal ? " causal" : "");
    dev_bwd p;
    dev_bwd_make(&p, ctx, rng, B, S, hq, hkv, D, causal, 2);
    p.a.deterministic = 1;
    dev_bwd_use(&p, 0, 0);
    if (bwd_status(ctx, fattn_bwd(ctx, &p.a), D, what) != 1) {
        dev_bwd_free(&p);
        return;
    }
    CK(cudaDeviceSynchronize());
    const std::vector<uint16_t> first = dev_bwd_get(&p, 0);
    const size_t poisoned = count_poisoned(first);
    TU_CHECK(poisoned == 0, "%s: %zu gradient elements never written (or NaN)", what, poisoned);
    int differ = 0;
    for (int r = 0; r < reps; ++r) {
        dev_bwd_use(&p, 1, 0);
        const fattn_status st = fattn_bwd(ctx, &p.a);
        TU_CHECK(st == FATTN_OK, "%s: repeat %d: %s", what, r, fattn_last_error(ctx));
        CK(cudaDeviceSynchronize());
        differ += dev_bwd_get(&p, 1) != first;
    }
    TU_CHECK(differ == 0, "%s: %d of %d repeated deterministic calls differ from the first", what, differ, reps);
    /* deterministic = 0: allowed to differ; what it does is printed */
    p.a.deterministic = 0;
    std::vector<uint16_t> nd[2];
    int nd_ok = 1;
    for (int r = 0; r < 2; ++r) {
        dev_bwd_use(&p, r, 0);
        nd_ok &= fattn_bwd(ctx, &p.a) == FATTN_OK;
        CK(cudaDeviceSynchronize());
        nd[r] = dev_bwd_get(&p, r);
    }
    TU_CHECK(nd_ok, "%s: deterministic = 0: %s", what, fattn_last_error(ctx));
    const double nd_diff = bits_rel_diff(nd[1], nd[0]), det_diff = bits_rel_diff(nd[0], first);
    TU_CHECK(nd_diff <= tol_fro(FATTN_DTYPE_BF16) && det_diff <= tol_fro(FATTN_DTYPE_BF16),
             "%s: deterministic = 0 results %.3e apart, %.3e from the deterministic one", what, nd_diff, det_diff);
    printf("  [%s] %s: %d repeats with deterministic = 1 the same bits%s; deterministic = 0: two calls %s (rel diff "
           "%.2e), %.2e from deterministic = 1\n",
           differ == 0 && poisoned == 0 ? "ok" : "FAIL", what, reps, poisoned ? " (UNWRITTEN elements)" : "",
           nd[0] == nd[1] ? "the same bits" : "differ", nd_diff, det_diff);
    fflush(stdout);
    dev_bwd_free(&p);
}

/* Two identical calls on the context's stream, the second captured into a
 * CUDA graph (global capture mode, the strictest: nothing may allocate or
 * synchronise).  The graph, replayed twice, and an eager call after it must
 * reproduce the first call: the same bits with deterministic = 1, within the
 * bf16 tolerance of it with deterministic = 0. */
static void graph_capture(fattn_ctx *ctx, tu_rng *rng, int deterministic) {
    char what[160];
    snprintf(what, sizeof what, "graph bf16 b2 s1000 h8/2 d128 causal, deterministic = %d", deterministic);
    dev_bwd p;
    dev_bwd_make(&p, ctx, rng, 2, 1000, 8, 2, 128, 1, 1);
    p.a.deterministic = deterministic;
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    TU_CHECK(fattn_ctx_set_stream(ctx, st) == FATTN_OK, "graph: set_stream: %s", fattn_last_error(ctx));
    dev_bwd_use(&p, 0, st);
    fattn_status fs = fattn_bwd(ctx, &p.a);
    TU_CHECK(fs == FATTN_OK, "%s: eager call: %s", what, fattn_last_error(ctx));
    CK(cudaStreamSynchronize(st));
    const std::vector<uint16_t> eager = dev_bwd_get(&p, 0);
    TU_CHECK(count_poisoned(eager) == 0, "%s: eager call left elements unwritten", what);
    auto same = [&](const std::vector<uint16_t> &h) {
        return deterministic ? h == eager : bits_rel_diff(h, eager) <= tol_fro(FATTN_DTYPE_BF16);
    };

    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    int ok = fs == FATTN_OK;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    fs = fattn_bwd(ctx, &p.a);
    cudaError_t e = cudaStreamEndCapture(st, &graph);
    TU_CHECK(fs == FATTN_OK, "%s: call during capture: %s: %s", what, fattn_status_string(fs), fattn_last_error(ctx));
    TU_CHECK(e == cudaSuccess, "%s: end capture: %s", what, cudaGetErrorString(e));
    ok &= fs == FATTN_OK && e == cudaSuccess;
    if (ok) {
        e = cudaGraphInstantiate(&exec, graph, 0);
        TU_CHECK(e == cudaSuccess, "%s: instantiate: %s", what, cudaGetErrorString(e));
        ok &= e == cudaSuccess;
        for (int r = 0; ok && r < 2; ++r) {
            dev_bwd_use(&p, 0, st);
            e = cudaGraphLaunch(exec, st);
            if (e == cudaSuccess) e = cudaStreamSynchronize(st);
            TU_CHECK(e == cudaSuccess, "%s: replay %d: %s", what, r, cudaGetErrorString(e));
            const int s = e == cudaSuccess && same(dev_bwd_get(&p, 0));
            TU_CHECK(s, "%s: replay %d differs from the eager call", what, r);
            ok &= s;
        }
    }
    (void)cudaGetLastError();
    dev_bwd_use(&p, 0, st);
    fs = fattn_bwd(ctx, &p.a);
    CK(cudaStreamSynchronize(st));
    const int after = fs == FATTN_OK && same(dev_bwd_get(&p, 0));
    TU_CHECK(after, "%s: the eager call after the graph: %s", what, fs == FATTN_OK ? "differs" : fattn_last_error(ctx));
    printf("  [%s] %s: captured second call, two replays and an eager call after: %s\n", ok && after ? "ok" : "FAIL",
           what, deterministic ? "the first call's bits" : "within 1e-2 of the first call");
    fflush(stdout);
    fattn_ctx_set_stream(ctx, NULL);
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
    dev_bwd_free(&p);
}

/* ---- refusals ---------------------------------------------------------------------- */

/* A small bf16 problem on the device (b1 s128 h2 d64, buffers sized for 4
 * heads), o and lse from fattn_fwd; dq, dk, dv poisoned by refuse(). */
struct small_problem {
    fattn_bwd_args good;
    uint16_t *in[5], *out[3]; /* q k v o dout; dq dk dv */
    float *lse, *scale;
    size_t n;
};

static void small_make(small_problem *p, fattn_ctx *ctx, tu_rng *rng) {
    const int B = 1, S = 128, H = 2, D = 64;
    p->n = (size_t)B * S * 4 * D;
    std::vector<uint16_t> h(p->n);
    for (int t = 0; t < 5; ++t) {
        CK(cudaMalloc(&p->in[t], p->n * 2));
        for (size_t i = 0; i < p->n; ++i) h[i] = (uint16_t)(0x3C00 ^ (tu_rng_u64(rng) & 0x83FF)); /* bf16 in [2^-7, 2) */
        CK(cudaMemcpy(p->in[t], h.data(), p->n * 2, cudaMemcpyHostToDevice));
    }
    for (int t = 0; t < 3; ++t) CK(cudaMalloc(&p->out[t], p->n * 2));
    CK(cudaMalloc(&p->lse, (size_t)B * 4 * S * 4));
    CK(cudaMalloc(&p->scale, (size_t)B * 4 * S * 4));
    CK(cudaMemset(p->scale, 0, (size_t)B * 4 * S * 4));
    fattn_bwd_args *a = &p->good;
    memset(a, 0, sizeof *a);
    a->p = tu_problem(B, S, S, H, H, D, 0, 0, NULL, NULL);
    fattn_tensor *t[8] = {&a->q, &a->k, &a->v, &a->o, &a->dout, &a->dq, &a->dk, &a->dv};
    for (int i = 0; i < 8; ++i) *t[i] = fattn_tensor_bshd(i < 5 ? p->in[i] : p->out[i - 5], FATTN_DTYPE_BF16);
    a->lse = p->lse;
    fattn_fwd_args fa;
    memset(&fa, 0, sizeof fa);
    fa.p = a->p;
    fa.q = a->q;
    fa.k = a->k;
    fa.v = a->v;
    fa.o = a->o;
    fa.lse = p->lse;
    const fattn_status st = fattn_fwd(ctx, &fa);
    TU_CHECK(st == FATTN_OK, "small fattn_fwd: %s: %s", fattn_status_string(st), fattn_last_error(ctx));
    CK(cudaDeviceSynchronize());
}

static void small_free(small_problem *p) {
    for (int t = 0; t < 5; ++t) cudaFree(p->in[t]);
    for (int t = 0; t < 3; ++t) cudaFree(p->out[t]);
    cudaFree(p->lse);
    cudaFree(p->scale);
}

/* fattn_bwd on `a` with dq, dk, dv poisoned: the status must be one of
 * want[0..1] (want[1] -1: only want[0]), with a message, and every byte of
 * dq, dk, dv still 0xFF. */
static void refuse(fattn_ctx *ctx, small_problem *p, const fattn_bwd_args &a, const char *what, int want0, int want1) {
    for (int t = 0; t < 3; ++t) CK(cudaMemset(p->out[t], 0xFF, p->n * 2));
    const fattn_status st = fattn_bwd(ctx, &a);
    CK(cudaDeviceSynchronize());
    const char *msg = fattn_last_error(ctx);
    std::vector<uint8_t> h(p->n * 2);
    int untouched = 1;
    for (int t = 0; t < 3; ++t) {
        CK(cudaMemcpy(h.data(), p->out[t], p->n * 2, cudaMemcpyDeviceToHost));
        for (uint8_t x : h) untouched &= x == 0xFF;
    }
    const int ok = ((int)st == want0 || (int)st == want1) && msg[0] && untouched;
    if (!ok) tu_failures++;
    printf("  [%s] refused: %s: %s, \"%s\"%s\n", ok ? "ok" : "FAIL", what, fattn_status_string(st), msg,
           untouched ? "" : ", OUTPUTS WRITTEN");
    fflush(stdout);
}

/* Refusals api.c makes before the engine is asked (their status does not
 * depend on the CUDA backward existing). */
static void refusals_api(fattn_ctx *ctx, small_problem *p) {
    const int INV = FATTN_ERROR_INVALID_ARGUMENT;
    fattn_bwd_args a = p->good;
    a.lse = NULL;
    refuse(ctx, p, a, "lse NULL", INV, -1);
    a = p->good;
    a.p.heads_q = 3; /* heads_kv 2 */
    refuse(ctx, p, a, "heads_q 3, heads_kv 2", INV, -1);
    a = p->good;
    fattn_tensor *t[8] = {&a.q, &a.k, &a.v, &a.o, &a.dout, &a.dq, &a.dk, &a.dv};
    for (int i = 0; i < 8; ++i) {
        t[i]->dtype = FATTN_DTYPE_E4M3;
        t[i]->scale = p->scale;
        t[i]->scale_block = 128;
    }
    /* fattn.h: the backward takes f32/f16/bf16 only; api.c says INVALID_ARGUMENT, UNSUPPORTED would do too */
    refuse(ctx, p, a, "e4m3 tensors", INV, FATTN_ERROR_UNSUPPORTED);
    a = p->good;
    a.dq.dtype = FATTN_DTYPE_E4M3;
    refuse(ctx, p, a, "dq e4m3, the rest bf16", INV, FATTN_ERROR_UNSUPPORTED);
}

/* Refusals that api.c makes after the engine's limits (UNSUPPORTED would
 * come first while the CUDA engine has no backward). */
static void refusals_layout(fattn_ctx *ctx, small_problem *p) {
    const int INV = FATTN_ERROR_INVALID_ARGUMENT;
    fattn_bwd_args a = p->good;
    a.dk.data = a.dq.data;
    refuse(ctx, p, a, "dk on dq", INV, -1);
    a = p->good;
    a.dq.data = a.q.data;
    refuse(ctx, p, a, "dq on q", INV, -1);
    a = p->good;
    a.dv.data = (uint16_t *)a.o.data + 64; /* dv's span overlaps o's (inside o's buffer, 4 heads long) */
    refuse(ctx, p, a, "dv inside o", INV, -1);
}

int main(void) {
    fattn_ctx *ctx = gpu_ctx_or_skip();
    tu_rng rng;
    tu_rng_init(&rng, (uint64_t)tu_seed());
    const int small_only = env_on("FATTN_TEST_SMALL");
    small_problem sp;
    small_make(&sp, ctx, &rng);
    refusals_api(ctx, &sp);
    {
        /* does the CUDA engine have a backward at all? */
        for (int t = 0; t < 3; ++t) CK(cudaMemset(sp.out[t], 0xFF, sp.n * 2));
        const fattn_status st = fattn_bwd(ctx, &sp.good);
        CK(cudaDeviceSynchronize());
        if (st == FATTN_ERROR_UNSUPPORTED) {
            char why[700];
            snprintf(why, sizeof why, "the CUDA engine has no backward: fattn_bwd bf16 d64: UNSUPPORTED: %s",
                     fattn_last_error(ctx));
            small_free(&sp);
            gpu_skip(why);
        }
        TU_CHECK(st == FATTN_OK, "a small bf16 d64 backward: %s: %s", fattn_status_string(st), fattn_last_error(ctx));
    }
    refusals_layout(ctx, &sp);
    small_free(&sp);

    printf("tolerances: bf16 |g - g*|_F / |g*|_F <= %.0e and max |g - g*| <= %.2f rms(g*); f16 %.0e and %.2f "
           "(line: rel Frobenius error, max abs error / rms(g*))\n",
           tol_fro(FATTN_DTYPE_BF16), tol_max(FATTN_DTYPE_BF16), tol_fro(FATTN_DTYPE_F16), tol_max(FATTN_DTYPE_F16));
    const fattn_dtype B = FATTN_DTYPE_BF16, H = FATTN_DTYPE_F16;
    const bcase cases[] = {
        /* batch sq sk hq hkv d causal dtype scale view */
        /* seqlens 1 .. 4097, head dims 64, 128, 256 */
        {1, 1, 1, 1, 1, 64, 0, B, 0, V_PACKED},
        {1, 17, 17, 2, 2, 128, 1, B, 0, V_PACKED},
        {1, 17, 17, 2, 2, 64, 0, H, 0, V_PACKED},
        {2, 64, 64, 4, 4, 64, 0, B, 0, V_PACKED},
        {2, 64, 64, 2, 2, 256, 1, H, 0, V_PACKED},
        {2, 100, 100, 4, 2, 128, 1, B, 0, V_PACKED},
        {1, 100, 100, 2, 2, 256, 0, B, 0, V_PACKED},
        {2, 128, 128, 4, 4, 64, 1, B, 0, V_PACKED},
        {2, 128, 128, 2, 1, 128, 0, H, 0, V_PACKED},
        {1, 128, 128, 2, 2, 256, 1, B, 0, V_PACKED},
        {1, 1000, 1000, 4, 4, 64, 1, B, 0, V_PACKED},
        {1, 1000, 1000, 2, 2, 128, 0, B, 0, V_PACKED},
        {1, 1000, 1000, 2, 2, 256, 1, B, 0, V_PACKED},
        {1, 1000, 1000, 2, 1, 128, 1, H, 0, V_PACKED},
        {1, 4097, 4097, 1, 1, 64, 0, B, 0, V_PACKED},
        {1, 4097, 4097, 1, 1, 128, 1, B, 0, V_PACKED},
        {1, 4097, 4097, 1, 1, 256, 0, B, 0, V_PACKED},
        {1, 4097, 4097, 1, 1, 128, 0, H, 0, V_PACKED},
        /* causal with seqlen_q != seqlen_k both ways; sq > sk: rows 0 .. sq - sk - 1 see no key */
        {1, 100, 1000, 4, 2, 128, 1, B, 0, V_PACKED},
        {1, 1000, 100, 4, 2, 128, 1, B, 0, V_PACKED},
        {2, 100, 1000, 2, 1, 64, 1, H, 0, V_PACKED},
        {1, 1000, 100, 2, 2, 256, 1, B, 0, V_PACKED},
        {1, 1000, 100, 2, 1, 64, 1, H, 0, V_PACKED},
        {2, 129, 17, 2, 2, 64, 1, B, 0, V_PACKED},
        /* non-causal, unequal */
        {1, 17, 700, 2, 2, 256, 0, B, 0, V_PACKED},
        {1, 700, 17, 2, 2, 128, 0, H, 0, V_PACKED},
        /* GQA 8:2 and MQA 8:1 */
        {2, 513, 513, 8, 2, 128, 0, B, 0, V_PACKED},
        {1, 333, 777, 8, 1, 64, 1, H, 0, V_PACKED},
        {1, 200, 200, 8, 1, 256, 0, B, 0, V_PACKED},
        {2, 1024, 1024, 8, 2, 64, 1, B, 0, V_PACKED},
        {1, 300, 300, 8, 2, 256, 1, H, 0, V_PACKED},
        {1, 1000, 1000, 8, 1, 128, 0, B, 0, V_PACKED},
        /* softmax_scale other than 1/sqrt(d) (scores of std 0.8 .. 2.4: not the peaked regime) */
        {1, 300, 500, 4, 2, 64, 0, B, 0.3f, V_PACKED},
        {1, 500, 500, 2, 2, 128, 1, H, 0.2f, V_PACKED},
        {1, 400, 700, 2, 1, 256, 0, B, 0.1f, V_PACKED},
        {2, 333, 333, 4, 4, 64, 1, B, 0.1f, V_PACKED},
        /* views of larger tensors: every input and output */
        {2, 300, 400, 4, 2, 64, 1, B, 0, V_SLICE},
        {2, 300, 400, 4, 2, 128, 0, H, 0, V_SLICE},
        {1, 250, 250, 2, 2, 256, 0, B, 0, V_SLICE},
        {2, 200, 300, 4, 2, 128, 1, B, 0, V_BHSD},
        {1, 500, 500, 2, 1, 64, 0, H, 0, V_BHSD},
        {1, 300, 300, 4, 2, 256, 1, B, 0.08f, V_BHSD},
        {2, 512, 512, 4, 2, 128, 1, B, 0, V_QKV},
        {1, 256, 256, 8, 2, 64, 0, H, 0, V_QKV},
    };
    for (const auto &c : cases) {
        if (small_only && (long)c.sq * c.sk > 100000) continue;
        run_case(ctx, &rng, c, 0);
    }
    /* the deterministic kernels against the oracle too */
    const bcase det_cases[] = {
        {1, 1000, 1000, 4, 2, 128, 1, B, 0, V_PACKED},
        {1, 300, 300, 4, 1, 64, 0, H, 0, V_SLICE},
        /* causal with unequal lengths: the shortest-first order's last key
         * block of a query block depends on seqlen_k - seqlen_q */
        {1, 700, 1500, 4, 2, 64, 1, B, 0, V_PACKED},
        {2, 1500, 700, 4, 4, 256, 1, B, 0, V_PACKED},
    };
    for (const auto &c : det_cases) {
        if (small_only && (long)c.sq * c.sk > 100000) continue;
        run_case(ctx, &rng, c, 1);
    }
    if (small_only) {
        determinism(ctx, &rng, 1, 256, 8, 2, 64, 1, 2);
    } else {
        determinism(ctx, &rng, 2, 3000, 16, 4, 128, 1, 2);
        determinism(ctx, &rng, 1, 4096, 16, 16, 64, 0, 2);
        determinism(ctx, &rng, 1, 2048, 8, 2, 256, 0, 2);
        graph_capture(ctx, &rng, 1);
        graph_capture(ctx, &rng, 0);
    }
    printf("oracle: %.1f s on the host\n", g_oracle_s);
    if (g_skipped_d256)
        printf("d256: %d call(s) answered UNSUPPORTED and were skipped%s\n", g_skipped_d256,
               env_on("FATTN_REQUIRE_BWD_D256") ? " (FATTN_REQUIRE_BWD_D256: failures)"
                                                : "; FATTN_REQUIRE_BWD_D256=1 makes them failures");
    fattn_ctx_free(ctx);
    return tu_finish("gpu bwd");
}
