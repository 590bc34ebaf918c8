/* test_varlen.cu - variable-length batches (cu_seqlens) on the Hopper
 * forward (fwd_sm90_varlen.cu) and backward (bwd_sm90_varlen.cu) against
 * the FP64 oracle.
 *
 * Ragged batches with empty sequences, length 1, lengths that are not
 * multiples of a tile or a key block, causal with seqlen_q != seqlen_k per
 * sequence both ways, GQA, head dims 64/128/256, bf16 and f16, and 160
 * short sequences in one batch.  Inputs N(0,1)
 * from a fixed seed (FATTN_TEST_SEED overrides); O and LSE poisoned with NaN
 * bytes; the oracle runs on the exact 16-bit values with the same cu_seqlens.
 * Tolerances: gpu_check_fwd (gpu_testutil.h), the dense forward's; the
 * backward (on every case whose oracle is cheap: all but the 4097-token
 * ones) grad_ok, test_bwd.cu's, with dq/dk/dv poisoned, and one case in
 * deterministic mode run twice for the same bits.  Also:
 * the CUDA engine refuses a varlen call without total_q/total_k, with O left
 * as it was; and arrays that break the rules run safely (check_bad_cu).  Exit 77 without a Hopper GPU (FATTN_REQUIRE_GPU=1: a failure);
 * FATTN_TEST_SMALL=1: the small cases only (compute-sanitizer).
 * FATTN_CUDA_ENGINE=portable (a ctest entry of its own): the forward and
 * the backward on the portable engine (head dims 64, 128, 192, 256). */
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

struct vcase {
    std::vector<int> lq, lk; /* per sequence */
    int hq, hkv, d, causal;
    fattn_dtype dt;
    int det = 0;           /* the backward in deterministic mode (twice) */
    std::vector<int> used; /* seqused_k per sequence (forward only), or none */
    int dv = 0;            /* head_dim_v; 0: d */
};


/* The backward of the same call (q, k, v, and the GPU forward's o and lse in
 * a), dout N(0, 1), dq/dk/dv poisoned, against oracle_bwd with test_bwd.cu's
 * tolerances (grad_ok); with c.det, deterministic mode twice: the same bits. */
static void check_bwd(fattn_ctx *ctx, tu_rng *rng, const vcase &c, const fattn_fwd_args &a, const oracle_problem &op,
                      const std::vector<double> &q, const std::vector<double> &k, const std::vector<double> &v,
                      const char *what) {
    const size_t nq = q.size(), nk = k.size(), nv = v.size();
    const size_t no = nq / op.head_dim * op.head_dim_v; /* O and dout */
    std::vector<double> dout(no), ref[3] = {std::vector<double>(nq), std::vector<double>(nk), std::vector<double>(nv)};
    tu_fill_normal(rng, dout.data(), no);
    tu_round_to(dout.data(), no, c.dt);
    oracle_bwd(&op, q.data(), k.data(), v.data(), dout.data(), ref[0].data(), ref[1].data(), ref[2].data());
    std::vector<uint16_t> h16(std::max(std::max(nq, no), std::max(nk, nv)));
    void *ddo, *dg[3];
    const size_t n[3] = {nq, nk, nv};
    CK(cudaMalloc(&ddo, no * 2));
    tu_to_dtype(dout.data(), no, c.dt, h16.data());
    CK(cudaMemcpy(ddo, h16.data(), no * 2, cudaMemcpyHostToDevice));
    for (int t = 0; t < 3; ++t) CK(cudaMalloc(&dg[t], n[t] * 2));
    fattn_bwd_args ba;
    memset(&ba, 0, sizeof ba);
    ba.p = a.p, ba.q = a.q, ba.k = a.k, ba.v = a.v, ba.o = a.o, ba.lse = a.lse;
    ba.dout = fattn_tensor_bshd(ddo, c.dt);
    ba.dq = fattn_tensor_bshd(dg[0], c.dt), ba.dk = fattn_tensor_bshd(dg[1], c.dt), ba.dv = fattn_tensor_bshd(dg[2], c.dt);
    static const char *names[3] = {"dq", "dk", "dv"};
    std::vector<uint16_t> first[3];
    for (int run = 0; run < (c.det ? 2 : 1); ++run) {
        ba.deterministic = c.det;
        for (int t = 0; t < 3; ++t) CK(cudaMemset(dg[t], 0xFF, n[t] * 2));
        const fattn_status st = fattn_bwd(ctx, &ba);
        TU_CHECK(st == FATTN_OK, "%s backward: %s: %s", what, fattn_status_string(st), fattn_last_error(ctx));
        const cudaError_t e = cudaDeviceSynchronize();
        TU_CHECK(e == cudaSuccess, "%s backward: kernel failed: %s", what, cudaGetErrorString(e));
        if (e != cudaSuccess) exit(1);
        for (int t = 0; t < 3; ++t) {
            std::vector<uint16_t> bits(n[t]);
            std::vector<double> g(n[t]);
            CK(cudaMemcpy(bits.data(), dg[t], n[t] * 2, cudaMemcpyDeviceToHost));
            tu_from_dtype(bits.data(), n[t], c.dt, g.data());
            const gstat gs = grad_stat(g.data(), ref[t].data(), n[t]);
            TU_CHECK(grad_ok(gs, c.dt), "%s backward %s%s: rel Frobenius %.3e (tol %.1e), max abs / rms %.3e (tol %.2f), %zu non-finite",
                     what, names[t], run ? " (deterministic, second run)" : "", gs.fro, tol_fro(c.dt), gs.maxr,
                     tol_max(c.dt), gs.nonfinite);
            if (run == 0) first[t] = bits;
            else TU_CHECK(bits == first[t], "%s backward %s: deterministic mode gave other bits on a second run", what, names[t]);
        }
    }
    printf("  %s: backward ok%s\n", what, c.det ? " (deterministic, twice the same bits)" : "");
    cudaFree(ddo);
    for (int t = 0; t < 3; ++t) cudaFree(dg[t]);
}

static void run_case(fattn_ctx *ctx, tu_rng *rng, const vcase &c) {
    const int B = (int)c.lq.size(), HQ = c.hq, HK = c.hkv, D = c.d, DV = c.dv ? c.dv : c.d;
    std::vector<int32_t> cq, ck;
    int maxq, maxk;
    gpu_varlen_offsets(c.lq, c.lk, cq, ck, maxq, maxk);
    const int TQ = cq[B], TK = ck[B];
    const size_t nq = (size_t)TQ * HQ * D, nk = (size_t)TK * HK * D, nlse = (size_t)HQ * TQ;
    const size_t nv = (size_t)TK * HK * DV, no = (size_t)TQ * HQ * DV;
    std::vector<double> q(nq), k(nk), v(nv), ref(no), ref_lse(nlse), got(no);
    tu_fill_normal(rng, q.data(), nq);
    tu_fill_normal(rng, k.data(), nk);
    tu_fill_normal(rng, v.data(), nv);
    tu_round_to(q.data(), nq, c.dt);
    tu_round_to(k.data(), nk, c.dt);
    tu_round_to(v.data(), nv, c.dt);
    std::vector<uint16_t> h16(std::max(std::max(nq, no), std::max(nk, nv)));
    void *dq, *dk, *dv, *dout;
    float *dlse;
    int32_t *dcq, *dck;
    CK(cudaMalloc(&dq, nq * 2));
    CK(cudaMalloc(&dk, nk * 2));
    CK(cudaMalloc(&dv, nv * 2));
    CK(cudaMalloc(&dout, no * 2));
    CK(cudaMalloc(&dlse, nlse * 4));
    CK(cudaMalloc(&dcq, (B + 1) * 4));
    CK(cudaMalloc(&dck, (B + 1) * 4));
    tu_to_dtype(q.data(), nq, c.dt, h16.data());
    CK(cudaMemcpy(dq, h16.data(), nq * 2, cudaMemcpyHostToDevice));
    tu_to_dtype(k.data(), nk, c.dt, h16.data());
    CK(cudaMemcpy(dk, h16.data(), nk * 2, cudaMemcpyHostToDevice));
    tu_to_dtype(v.data(), nv, c.dt, h16.data());
    CK(cudaMemcpy(dv, h16.data(), nv * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dcq, cq.data(), (B + 1) * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dck, ck.data(), (B + 1) * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(dout, 0xFF, no * 2));
    CK(cudaMemset(dlse, 0xFF, nlse * 4));
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = tu_problem(B, maxq, maxk, HQ, HK, D, 0, c.causal, dcq, dck);
    a.p.head_dim_v = DV;
    a.p.total_q = TQ, a.p.total_k = TK;
    a.q = fattn_tensor_bshd(dq, c.dt), a.k = fattn_tensor_bshd(dk, c.dt), a.v = fattn_tensor_bshd(dv, c.dt);
    a.o = fattn_tensor_bshd(dout, c.dt);
    a.lse = dlse;
    int32_t *dused = NULL;
    if (!c.used.empty()) {
        CK(cudaMalloc(&dused, B * 4));
        CK(cudaMemcpy(dused, c.used.data(), B * 4, cudaMemcpyHostToDevice));
        a.seqused_k = dused;
    }
    char what[200];
    char dvs[16] = "";
    if (DV != D) snprintf(dvs, sizeof dvs, "/%d", DV);
    snprintf(what, sizeof what, "%s varlen b%d (q %d, k %d tokens, max %d/%d) h%d/%d d%d%s%s%s", fattn_dtype_name(c.dt),
             B, TQ, TK, maxq, maxk, HQ, HK, D, dvs, c.causal ? " causal" : "", c.used.empty() ? "" : " seqused_k");
    const fattn_status st = fattn_fwd(ctx, &a);
    TU_CHECK(st == FATTN_OK, "%s: %s: %s", what, fattn_status_string(st), fattn_last_error(ctx));
    const cudaError_t e = cudaDeviceSynchronize();
    TU_CHECK(e == cudaSuccess, "%s: kernel failed: %s", what, cudaGetErrorString(e));
    if (e != cudaSuccess) exit(1);
    CK(cudaMemcpy(h16.data(), dout, no * 2, cudaMemcpyDeviceToHost));
    tu_from_dtype(h16.data(), no, c.dt, got.data());
    std::vector<float> glse(nlse);
    CK(cudaMemcpy(glse.data(), dlse, nlse * 4, cudaMemcpyDeviceToHost));
    oracle_problem op;
    memset(&op, 0, sizeof op);
    op.batch = B, op.seqlen_q = maxq, op.seqlen_k = maxk, op.heads_q = HQ, op.heads_kv = HK, op.head_dim = D;
    op.head_dim_v = DV, op.causal = c.causal, op.cu_seqlens_q = cq.data(), op.cu_seqlens_k = ck.data();
    if (c.used.empty()) {
        oracle_fwd(&op, q.data(), k.data(), v.data(), ref.data(), ref_lse.data());
    } else {
        /* seqused_k: the oracle sees each sequence's first min(used, len_k) keys only */
        std::vector<int32_t> cu2(B + 1, 0);
        std::vector<double> k2, v2;
        for (int b = 0; b < B; ++b) {
            const int n = std::max(0, std::min(c.used[b], c.lk[b]));
            cu2[b + 1] = cu2[b] + n;
            const size_t row = (size_t)HK * D, at = (size_t)ck[b] * row;
            const size_t row_v = (size_t)HK * DV, at_v = (size_t)ck[b] * row_v;
            k2.insert(k2.end(), k.begin() + at, k.begin() + at + n * row);
            v2.insert(v2.end(), v.begin() + at_v, v.begin() + at_v + n * row_v);
        }
        op.cu_seqlens_k = cu2.data();
        oracle_fwd(&op, q.data(), k2.data(), v2.data(), ref.data(), ref_lse.data());
        op.cu_seqlens_k = ck.data();
    }
    gpu_check_fwd(what, c.dt, got.data(), ref.data(), no, DV, glse.data(), ref_lse.data(), nlse);
    double work = 0; /* score entries: the single-threaded oracle's cost */
    for (int b = 0; b < B; ++b) work += (double)c.lq[b] * c.lk[b];
    if (work * HQ * D <= 4e9 && c.used.empty()) check_bwd(ctx, rng, c, a, op, q, k, v, what);
    if (c.lq.size() == 3 && c.d == 64) {
        /* the same call without the totals: refused, O untouched */
        CK(cudaMemset(dout, 0x5A, nq * 2));
        a.p.total_q = a.p.total_k = 0;
        const fattn_status s2 = fattn_fwd(ctx, &a);
        TU_CHECK(s2 == FATTN_ERROR_INVALID_ARGUMENT, "%s without totals: %s", what, fattn_status_string(s2));
        CK(cudaMemcpy(h16.data(), dout, nq * 2, cudaMemcpyDeviceToHost));
        size_t changed = 0;
        for (size_t i = 0; i < nq; ++i) changed += h16[i] != 0x5A5A;
        TU_CHECK(changed == 0, "%s: a refused call wrote %zu elements", what, changed);
    }
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dlse), cudaFree(dcq), cudaFree(dck);
    if (dused) cudaFree(dused);
}

/* cu_seqlens that break fattn.h's rules (the CUDA engine does not check
 * them): the forward and the backward must still return OK, run without a
 * CUDA error and (under compute-sanitizer memcheck, which runs these with
 * the small cases) touch nothing outside the exactly sized tensors. */
static void check_bad_cu(fattn_ctx *ctx) {
    const int T = 64, H = 2, D = 64, B = 3;
    const size_t n = (size_t)T * H * D;
    const int32_t bad[][B + 1] = {
        {0, 40, 10, 64},   /* decreasing */
        {0, 30, 200, 64},  /* past the packed rows */
        {-50, 20, 70, 64}, /* negative start, and a sequence longer than seqlen (32) */
        {64, 0, 64, 0},    /* back to 0: a negative last length */
    };
    void *buf[9];
    for (int i = 0; i < 8; ++i) {
        CK(cudaMalloc(&buf[i], n * 2));
        CK(cudaMemset(buf[i], 0x3C, n * 2)); /* bf16 ~1.2: finite inputs */
    }
    CK(cudaMalloc(&buf[8], (size_t)H * T * 4));
    int32_t *dcq, *dck;
    CK(cudaMalloc(&dcq, (B + 1) * 4));
    CK(cudaMalloc(&dck, (B + 1) * 4));
    int ok = 0, tried = 0;
    for (const auto &cu : bad)
        for (int causal = 0; causal < 2; ++causal) {
            CK(cudaMemcpy(dcq, cu, sizeof cu, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dck, cu, sizeof cu, cudaMemcpyHostToDevice));
            fattn_fwd_args a;
            memset(&a, 0, sizeof a);
            a.p = tu_problem(B, 32, 32, H, H, D, 0, causal, dcq, dck);
            a.p.total_q = a.p.total_k = T;
            const fattn_dtype BF = FATTN_DTYPE_BF16;
            a.q = fattn_tensor_bshd(buf[0], BF), a.k = fattn_tensor_bshd(buf[1], BF), a.v = fattn_tensor_bshd(buf[2], BF);
            a.o = fattn_tensor_bshd(buf[3], BF);
            a.lse = (float *)buf[8];
            fattn_bwd_args g;
            memset(&g, 0, sizeof g);
            g.p = a.p, g.q = a.q, g.k = a.k, g.v = a.v, g.o = a.o, g.lse = a.lse;
            g.dout = fattn_tensor_bshd(buf[4], BF);
            g.dq = fattn_tensor_bshd(buf[5], BF), g.dk = fattn_tensor_bshd(buf[6], BF), g.dv = fattn_tensor_bshd(buf[7], BF);
            const fattn_status sf = fattn_fwd(ctx, &a);
            const fattn_status sb = sf == FATTN_OK ? fattn_bwd(ctx, &g) : sf;
            const cudaError_t e = cudaDeviceSynchronize();
            ++tried;
            ok += sf == FATTN_OK && sb == FATTN_OK && e == cudaSuccess;
            TU_CHECK(sf == FATTN_OK && sb == FATTN_OK && e == cudaSuccess,
                     "unchecked cu_seqlens {%d, %d, %d, %d}%s: fwd %s, bwd %s, %s (%s)", cu[0], cu[1], cu[2], cu[3],
                     causal ? " causal" : "", fattn_status_string(sf), fattn_status_string(sb), cudaGetErrorString(e),
                     fattn_last_error(ctx));
            if (e != cudaSuccess) exit(1);
        }
    printf("  [%s] %d of %d calls with unchecked cu_seqlens (decreasing, past the rows, negative, too long) ran\n",
           ok == tried ? "ok" : "FAIL", ok, tried);
    for (int i = 0; i < 9; ++i) cudaFree(buf[i]);
    cudaFree(dcq), cudaFree(dck);
}

int main(void) {
    fattn_ctx *ctx = gpu_ctx_or_skip();
    tu_rng rng;
    tu_rng_init(&rng, (uint64_t)tu_seed());
    const fattn_dtype BF = FATTN_DTYPE_BF16, F16 = FATTN_DTYPE_F16;
    const int small = getenv("FATTN_TEST_SMALL") != NULL;
    std::vector<vcase> cases = {
        {{5, 0, 17}, {5, 3, 17}, 4, 2, 64, 0, BF},
        {{5, 0, 17}, {5, 3, 17}, 4, 2, 64, 1, F16},
        {{1, 200, 0, 33}, {1, 200, 0, 100}, 8, 2, 128, 1, BF}, /* sk 0: rows see no key */
        {{130, 1, 64}, {100, 1000, 64}, 4, 4, 128, 0, BF},
        {{300, 17}, {17, 300}, 2, 1, 256, 1, BF},               /* causal, sq > sk and sq < sk */
        {{257, 129, 1}, {257, 129, 1}, 2, 2, 256, 0, F16},
    };
    /* seqused_k (a padded cache per sequence): fewer keys than the sequence
     * holds, 0, negative (none), more than it holds (all), causal aligned
     * on the used count */
    vcase u1{{7, 40, 1, 130}, {200, 150, 64, 300}, 4, 2, 128, 1, BF};
    u1.used = {5, 0, 64, 1000};
    vcase u2{{3, 90, 17}, {100, 90, 333}, 8, 1, 64, 0, F16};
    u2.used = {-4, 33, 200};
    cases.push_back(u1);
    cases.push_back(u2);
    /* head dims 96, 192 and 192 with head_dim_v 128 (issue 37), forward
     * and backward: empty sequences, tails, causal both ways (rows with no
     * key), GQA, MQA, seqused_k (forward only) */
    {
        const int hd[3][2] = {{96, 96}, {192, 192}, {192, 128}};
        for (int i = 0; i < 3; ++i) {
            const int d = hd[i][0], dv = hd[i][1];
            if (gpu_portable_forced() && (d == 96 || dv != d)) continue; /* the portable engine: 64, 128, 192, 256 */
            vcase a{{5, 0, 17}, {5, 3, 17}, 4, 2, d, 1, i == 1 ? F16 : BF};
            vcase b{{300, 17, 1}, {17, 300, 65}, 4, 1, d, 1, i == 1 ? BF : F16};
            vcase e{{130, 1, 64}, {100, 1000, 64}, 2, 2, d, 0, BF};
            vcase u{{7, 40, 1, 130}, {200, 150, 64, 300}, 4, 2, d, 1, F16};
            u.used = {5, 0, 64, 1000};
            for (vcase *x : {&a, &b, &e, &u}) x->dv = dv, cases.push_back(*x);
            if (!small) {
                vcase l{{1000, 17, 4097, 0, 333}, {1000, 17, 4097, 5, 777}, 8, 2, d, 1, BF};
                vcase m{{2000, 100, 1}, {2000, 150, 3000}, 4, 1, d, 0, F16};
                for (vcase *x : {&l, &m}) x->dv = dv, cases.push_back(*x);
            }
        }
    }
    if (!small) {
        cases.push_back({{1000, 17, 4097, 0, 333}, {1000, 17, 4097, 5, 777}, 8, 2, 128, 1, BF});
        cases.push_back({{1000, 17, 4097, 0, 333}, {1000, 17, 4097, 5, 777}, 8, 2, 128, 0, F16});
        cases.push_back({{2000, 100, 1}, {2000, 150, 3000}, 8, 8, 64, 1, BF});
        cases.push_back({{2000, 100, 1}, {2000, 150, 3000}, 4, 1, 256, 0, BF});
    }
    if (!small) {
        /* many short sequences (0-300 rows, a quarter empty): the producer's
         * walk skips several sequences per tile of a static stride */
        vcase many{{}, {}, 4, 2, 128, 0, BF}, many_c{{}, {}, 4, 1, 64, 1, F16};
        for (int i = 0; i < 160; ++i) {
            const int n = tu_rng_uniform(&rng) < 0.25 ? 0 : 1 + (int)(300 * tu_rng_uniform(&rng));
            many.lq.push_back(n), many.lk.push_back(n);
            many_c.lq.push_back(n), many_c.lk.push_back(n + (int)(50 * tu_rng_uniform(&rng)));
        }
        many_c.det = 1;
        cases.push_back(many);
        cases.push_back(many_c);
    }
    for (const auto &c : cases) run_case(ctx, &rng, c);
    check_bad_cu(ctx);
    fattn_ctx_free(ctx);
    return tu_finish("gpu varlen");
}
