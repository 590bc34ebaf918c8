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
 * deterministic mode run twice for the same bits.  seqused_q and seqused_k
 * (fattn_fwd_args, fattn_bwd_args), forward and backward: the oracle runs on
 * each sequence's used rows alone, and the rows past them (o, lse, dq; dk,
 * dv) must still hold their poison after the calls.  Also:
 * the CUDA engine refuses a varlen call without total_q/total_k, with O left
 * as it was; and arrays that break the rules run safely (check_bad_cu).  Exit 77 without a Hopper GPU (FATTN_REQUIRE_GPU=1: a failure);
 * FATTN_TEST_SMALL=1: the small cases only (compute-sanitizer).
 * FATTN_CUDA_ENGINE=portable (a ctest entry of its own): the forward and
 * the backward on the portable engine (head dims 64, 96, 128, 192, 256). */
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
    std::vector<int> used; /* seqused_k per sequence, or none */
    int dv = 0;            /* head_dim_v; 0: d */
    std::vector<int> usedq; /* seqused_q per sequence, or none */
};

/* The rows a side of the batch uses (seqused_q or seqused_k: each sequence's
 * first min(used[b], len[b]) rows, a negative entry none; without the array
 * all): their packed indices in order, and the cu_seqlens of those rows
 * alone, on which the oracle runs. */
struct used_rows {
    std::vector<size_t> rows;
    std::vector<int32_t> cu;
    size_t total; /* the packed rows, used or not */
};

static used_rows used_rows_of(const std::vector<int32_t> &cu, const std::vector<int> &used) {
    used_rows u;
    const size_t B = cu.size() - 1;
    u.cu.assign(B + 1, 0);
    u.total = (size_t)cu[B];
    for (size_t b = 0; b < B; ++b) {
        const int len = cu[b + 1] - cu[b];
        const int n = used.empty() ? len : std::max(0, std::min(used[b], len));
        for (int i = 0; i < n; ++i) u.rows.push_back((size_t)cu[b] + i);
        u.cu[b + 1] = u.cu[b] + n;
    }
    return u;
}

/* the used rows of a packed [total, width] array */
template <class T>
static std::vector<T> gather_rows(const std::vector<T> &x, size_t width, const used_rows &u) {
    std::vector<T> y(u.rows.size() * width);
    for (size_t i = 0; i < u.rows.size(); ++i)
        std::copy(x.begin() + u.rows[i] * width, x.begin() + (u.rows[i] + 1) * width, y.begin() + i * width);
    return y;
}

/* elements of the packed [total, width] 16-bit array x outside the used rows
 * that no longer hold the poison bits */
static size_t poison_lost(const std::vector<uint16_t> &x, size_t width, const used_rows &u, uint16_t poison) {
    std::vector<char> used(u.total, 0);
    for (size_t r : u.rows) used[r] = 1;
    size_t n = 0;
    for (size_t r = 0; r < u.total; ++r)
        if (!used[r])
            for (size_t i = 0; i < width; ++i) n += x[r * width + i] != poison;
    return n;
}


/* The backward of the same call (q, k, v, and the GPU forward's o and lse in
 * a, its seqused_q / seqused_k too), dout N(0, 1), dq/dk/dv poisoned, against
 * oracle_bwd on the used rows (uq, uk; op over them) with test_bwd.cu's
 * tolerances (grad_ok), and the rows past them still poisoned; with c.det,
 * deterministic mode twice: the same bits. */
static void check_bwd(fattn_ctx *ctx, tu_rng *rng, const vcase &c, const fattn_fwd_args &a, const oracle_problem &op,
                      const std::vector<double> &q, const std::vector<double> &k, const std::vector<double> &v,
                      const used_rows &uq, const used_rows &uk, const char *what) {
    const size_t nq = q.size(), nk = k.size(), nv = v.size();
    const size_t no = nq / op.head_dim * op.head_dim_v; /* O and dout */
    const size_t wq = (size_t)op.heads_q * op.head_dim, wk = (size_t)op.heads_kv * op.head_dim;
    const size_t wv = (size_t)op.heads_kv * op.head_dim_v, wo = (size_t)op.heads_q * op.head_dim_v;
    const size_t width[3] = {wq, wk, wv};
    const used_rows *urows[3] = {&uq, &uk, &uk};
    std::vector<double> dout(no);
    tu_fill_normal(rng, dout.data(), no);
    tu_round_to(dout.data(), no, c.dt);
    std::vector<double> ref[3];
    {
        const std::vector<double> qc = gather_rows(q, wq, uq), kc = gather_rows(k, wk, uk), vc = gather_rows(v, wv, uk);
        const std::vector<double> dc = gather_rows(dout, wo, uq);
        ref[0].resize(qc.size()), ref[1].resize(kc.size()), ref[2].resize(vc.size());
        oracle_problem ou = op;
        ou.cu_seqlens_q = uq.cu.data(), ou.cu_seqlens_k = uk.cu.data();
        oracle_bwd(&ou, qc.data(), kc.data(), vc.data(), dc.data(), ref[0].data(), ref[1].data(), ref[2].data());
    }
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
    ba.seqused_q = a.seqused_q, ba.seqused_k = a.seqused_k;
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
            CK(cudaMemcpy(bits.data(), dg[t], n[t] * 2, cudaMemcpyDeviceToHost));
            /* the rows past seqused_q (dq) and seqused_k (dk, dv) are not written */
            const size_t lost = poison_lost(bits, width[t], *urows[t], 0xFFFF);
            TU_CHECK(lost == 0, "%s backward %s: %zu elements past the used rows were written", what, names[t], lost);
            const std::vector<uint16_t> used = gather_rows(bits, width[t], *urows[t]);
            std::vector<double> g(used.size());
            tu_from_dtype(used.data(), used.size(), c.dt, g.data());
            const gstat gs = grad_stat(g.data(), ref[t].data(), g.size());
            TU_CHECK(grad_ok(gs, c.dt), "%s backward %s%s: rel Frobenius %.3e (tol %.1e), max abs / rms %.3e (tol %.2f), %zu non-finite",
                     what, names[t], run ? " (deterministic, second run)" : "", gs.fro, tol_fro(c.dt), gs.maxr,
                     tol_max(c.dt), gs.nonfinite);
            if (run == 0) first[t] = bits;
            else TU_CHECK(bits == first[t], "%s backward %s: deterministic mode gave other bits on a second run", what, names[t]);
        }
    }
    printf("  %s: backward ok%s%s\n", what, c.det ? " (deterministic, twice the same bits)" : "",
           a.seqused_q || a.seqused_k ? " (rows past seqused untouched)" : "");
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
    int32_t *dused = NULL, *dusedq = NULL;
    if (!c.used.empty()) {
        CK(cudaMalloc(&dused, B * 4));
        CK(cudaMemcpy(dused, c.used.data(), B * 4, cudaMemcpyHostToDevice));
        a.seqused_k = dused;
    }
    if (!c.usedq.empty()) {
        CK(cudaMalloc(&dusedq, B * 4));
        CK(cudaMemcpy(dusedq, c.usedq.data(), B * 4, cudaMemcpyHostToDevice));
        a.seqused_q = dusedq;
    }
    char what[200];
    char dvs[16] = "";
    if (DV != D) snprintf(dvs, sizeof dvs, "/%d", DV);
    snprintf(what, sizeof what, "%s varlen b%d (q %d, k %d tokens, max %d/%d) h%d/%d d%d%s%s%s%s", fattn_dtype_name(c.dt),
             B, TQ, TK, maxq, maxk, HQ, HK, D, dvs, c.causal ? " causal" : "", c.usedq.empty() ? "" : " seqused_q",
             c.used.empty() ? "" : " seqused_k");
    /* the oracle on each sequence's used rows alone (all without seqused) */
    const used_rows uq = used_rows_of(cq, c.usedq), uk = used_rows_of(ck, c.used);
    const size_t nq2 = uq.rows.size(), no2 = nq2 * HQ * DV, nlse2 = (size_t)HQ * nq2;
    oracle_problem op;
    memset(&op, 0, sizeof op);
    op.batch = B, op.seqlen_q = maxq, op.seqlen_k = maxk, op.heads_q = HQ, op.heads_kv = HK, op.head_dim = D;
    op.head_dim_v = DV, op.causal = c.causal, op.cu_seqlens_q = uq.cu.data(), op.cu_seqlens_k = uk.cu.data();
    {
        const std::vector<double> qc = gather_rows(q, (size_t)HQ * D, uq), kc = gather_rows(k, (size_t)HK * D, uk);
        const std::vector<double> vc = gather_rows(v, (size_t)HK * DV, uk);
        ref.resize(no2), ref_lse.resize(nlse2);
        oracle_fwd(&op, qc.data(), kc.data(), vc.data(), ref.data(), ref_lse.data());
    }
    /* the portable engine has no seqused_q in its forward (fattn.h): its
     * backward gets the oracle's o and lse on the used rows instead */
    const bool oracle_o = !c.usedq.empty() && gpu_portable_forced();
    if (oracle_o) {
        std::vector<uint16_t> o16(no, 0xFFFF), r16(no2);
        std::vector<float> l32(nlse);
        memset(l32.data(), 0xFF, nlse * 4);
        tu_to_dtype(ref.data(), no2, c.dt, r16.data());
        for (size_t i = 0; i < nq2; ++i) {
            std::copy(r16.begin() + i * HQ * DV, r16.begin() + (i + 1) * HQ * DV, o16.begin() + uq.rows[i] * HQ * DV);
            for (int h = 0; h < HQ; ++h) l32[(size_t)h * TQ + uq.rows[i]] = (float)ref_lse[(size_t)h * nq2 + i];
        }
        CK(cudaMemcpy(dout, o16.data(), no * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dlse, l32.data(), nlse * 4, cudaMemcpyHostToDevice));
        printf("  %s: forward from the oracle (the portable engine's forward has no seqused_q)\n", what);
    } else {
        const fattn_status st = fattn_fwd(ctx, &a);
        TU_CHECK(st == FATTN_OK, "%s: %s: %s", what, fattn_status_string(st), fattn_last_error(ctx));
        const cudaError_t e = cudaDeviceSynchronize();
        TU_CHECK(e == cudaSuccess, "%s: kernel failed: %s", what, cudaGetErrorString(e));
        if (e != cudaSuccess) exit(1);
        CK(cudaMemcpy(h16.data(), dout, no * 2, cudaMemcpyDeviceToHost));
        std::vector<uint16_t> o16(h16.begin(), h16.begin() + no);
        const std::vector<uint16_t> used16 = gather_rows(o16, (size_t)HQ * DV, uq);
        got.resize(no2);
        tu_from_dtype(used16.data(), no2, c.dt, got.data());
        std::vector<float> glse(nlse), glse2(nlse2);
        CK(cudaMemcpy(glse.data(), dlse, nlse * 4, cudaMemcpyDeviceToHost));
        size_t lse_lost = 0; /* the LSE of rows past seqused_q is not written either */
        std::vector<char> qused(TQ, 0);
        for (size_t i = 0; i < nq2; ++i) qused[uq.rows[i]] = 1;
        for (int h = 0; h < HQ; ++h) {
            for (size_t i = 0; i < nq2; ++i) glse2[(size_t)h * nq2 + i] = glse[(size_t)h * TQ + uq.rows[i]];
            for (int r = 0; r < TQ; ++r) {
                uint32_t bits;
                memcpy(&bits, &glse[(size_t)h * TQ + r], 4);
                lse_lost += !qused[r] && bits != 0xFFFFFFFFu;
            }
        }
        const size_t o_lost = poison_lost(o16, (size_t)HQ * DV, uq, 0xFFFF);
        TU_CHECK(o_lost == 0 && lse_lost == 0, "%s: the forward wrote %zu elements of o and %zu of lse past seqused_q",
                 what, o_lost, lse_lost);
        gpu_check_fwd(what, c.dt, got.data(), ref.data(), no2, DV, glse2.data(), ref_lse.data(), nlse2);
    }
    double work = 0; /* score entries: the single-threaded oracle's cost */
    for (int b = 0; b < B; ++b) work += (double)c.lq[b] * c.lk[b];
    if (work * HQ * D <= 4e9) check_bwd(ctx, rng, c, a, op, q, k, v, uq, uk, what);
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
    if (dusedq) cudaFree(dusedq);
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
    /* seqused_q with seqused_k, forward and backward (the backward's
     * preprocess, main kernel, dQ postprocess and dK/dV epilogue on the used
     * counts): tails of 1, 17 and 1000 rows, 0 (a sequence with queries and
     * no used key, and one with no used query), negative (none), more than
     * the sequence holds (all); causal aligned on the used counts both ways;
     * GQA and MQA; deterministic mode (twice, the same bits) */
    vcase s1{{5, 17, 3, 40}, {9, 17, 2, 64}, 2, 2, 64, 1, F16};
    s1.usedq = {1, 17, 0, 33}, s1.used = {5, 0, 2, 64};
    vcase s2{{130, 65, 0, 257}, {200, 64, 33, 257}, 4, 1, 256, 0, BF};
    s2.usedq = {129, 0, 3, 200}, s2.used = {17, 64, -2, 256};
    s2.det = 1;
    vcase s3{{64, 200, 1, 90}, {128, 130, 77, 90}, 8, 2, 128, 1, BF};
    s3.usedq = {64, 17, 1, -5}, s3.used = {1, 129, 0, 90};
    cases.push_back(s1);
    cases.push_back(s2);
    cases.push_back(s3);
    if (!small) {
        vcase s4{{40, 300, 1, 1100, 17}, {64, 250, 90, 1100, 0}, 8, 2, 128, 1, BF};
        s4.usedq = {17, 1, 5, 1000, 0}, s4.used = {1, 200, 0, 999, 3};
        vcase s5 = s4;
        s5.causal = 0, s5.dt = F16, s5.d = 64, s5.hkv = 1, s5.det = 1;
        vcase s6 = s4;
        s6.d = 256, s6.det = 1, s6.hq = 4;
        cases.push_back(s4);
        cases.push_back(s5);
        cases.push_back(s6);
    }
    /* head dims 96, 192 and 192 with head_dim_v 128 (issue 37), forward
     * and backward: empty sequences, tails, causal both ways (rows with no
     * key), GQA, MQA, seqused_k and seqused_q */
    {
        const int hd[3][2] = {{96, 96}, {192, 192}, {192, 128}};
        for (int i = 0; i < 3; ++i) {
            const int d = hd[i][0], dv = hd[i][1];
            if (gpu_portable_forced() && dv != d) continue; /* the portable engine: 64, 96, 128, 192, 256, dv == d */
            vcase a{{5, 0, 17}, {5, 3, 17}, 4, 2, d, 1, i == 1 ? F16 : BF};
            vcase b{{300, 17, 1}, {17, 300, 65}, 4, 1, d, 1, i == 1 ? BF : F16};
            vcase e{{130, 1, 64}, {100, 1000, 64}, 2, 2, d, 0, BF};
            vcase u{{7, 40, 1, 130}, {200, 150, 64, 300}, 4, 2, d, 1, F16};
            u.used = {5, 0, 64, 1000}, u.usedq = {7, 17, 0, 129};
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
