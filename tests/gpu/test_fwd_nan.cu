/* test_fwd_nan.cu - NaN and Inf in the inputs of the Hopper 16-bit forward
 * (bf16, f16) reach the outputs where the CPU engine's fattn_fwd puts them
 * (issue 27 item 3 on the GPU; tests/test_cpu_nan.c says what the CPU engine
 * does and why).
 *
 * One input element (or row) of one (batch, kv head) is poisoned: a NaN or
 * +Inf in a Q row, a NaN, a +Inf row or one +Inf element in a K row, a NaN or
 * +Inf in a V row, and a NaN Q in the rows that see no key.  The same 16-bit
 * inputs go to the GPU and to the CPU engine.  Every element of O and every
 * LSE entry is classified (NaN, +Inf, -Inf, finite); the GPU's class must be
 * the CPU engine's, and every finite row must match the FP64 oracle on the
 * poisoned inputs (which equals the clean one wherever the poison does not
 * reach) to the worst-row tolerance of gpu_check_fwd (bf16 1.6e-2, f16
 * 3.9e-3), LSE to 1e-3.
 *
 * What the kernel does, from its source (src/cuda/hopper/fwd/fwd_softmax.cuh,
 * fwd_mainloop.cuh, fwd_epilogue.cuh):
 *   - the row max uses fmaxf, which skips NaN: a row of NaN scores keeps max
 *     -inf, its offset is 0, exp2(NaN) = NaN enters P and the row sum, and
 *     P V makes every column of O NaN.  A +inf score makes the max +inf and
 *     exp2(inf - inf) = NaN.  A -inf score (a +Inf k element against a
 *     negative q element) is a key dropped, as on the CPU.  So O is NaN in
 *     exactly the CPU engine's rows.
 *   - tiles split along the keys merge their pieces weighted by exp2 of
 *     (piece max - new max), 0 for a piece of max -inf (an all-NaN row): NaN
 *     times 0 stays NaN, so the merge keeps NaN rows NaN.
 *   - the mask writes -inf over the scores of keys a row does not see, after
 *     the QK^T GEMM, so a poisoned key never reaches a row that does not see
 *     it, and a poisoned q in a row that sees no key gives O = 0, LSE = -inf.
 *   - V: P V is one GEMM over a whole key block, so a key's NaN / Inf value
 *     meets every row of the warpgroup, and a row that does not see the key
 *     has P = 0 there: 0 * NaN = 0 * Inf = NaN.  Non-causal, every row sees
 *     every key, so the result is the CPU engine's (column t NaN, or +Inf,
 *     in every row of the head group; LSE finite).  Causal, a row that does
 *     not see key j gets NaN in column t when its tile visits j's block:
 *     tiles of BM <= 192 rows visit key blocks of BN <= 192 up to their last
 *     row's diagonal, so only rows with j - (i + seqlen_k - seqlen_q) <=
 *     BM + BN - 2 < 384 can; in the decoding kernel (seqlen_q <= 16) any
 *     row of the step.  fattn.h states this rule.  The CPU engine had the
 *     same effect with its own blocks until issue 43; now a row that does
 *     not see key j keeps the clean value there (test_cpu_nan.c).  Tested
 *     here: rows that see j have column t NaN (+Inf) like the CPU engine's;
 *     rows that do not see it have column t either NaN or the clean value,
 *     and the clean value when 384 keys or more short of j; every other
 *     column finite and right.
 *   - the epilogue (finish_row) treats l == 0 as "sees no key" (O = 0,
 *     LSE = -inf) and divides otherwise, so a NaN l gives NaN O and a NaN
 *     LSE, as the CPU engine does (attention_fwd.c: `l == 0.0f ? -inf :
 *     m + logf(l)`).  Until fc940d6 it tested l > 0 and wrote LSE = -inf for
 *     a NaN l, which fattn.h reserves for rows that see no key (a backward
 *     taking it would compute exp(s + inf)); a separate check names that
 *     case should it come back.
 * Shapes: non-causal and causal, GQA, seqlen_q < and > seqlen_k (rows that
 * see no key), all three head dims, several tiles, tiles split along the keys
 * (the merge of pieces), CTA pairs.  Fixed seed (FATTN_TEST_SEED overrides);
 * exit 77 without a Hopper GPU (FATTN_REQUIRE_GPU=1: a failure). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "common/oracle.h"
#include "fattn.h"
#include "gpu/gpu_testutil.h"

enum poison {
    P_Q_NAN,        /* q[b][i][h][3] = NaN */
    P_Q_INF,        /* q[b][i][h][3] = +Inf */
    P_K_NAN,        /* k[b][j][hk][5] = NaN */
    P_K_INF_ROW,    /* k[b][j][hk][:] = +Inf */
    P_K_INF_ELEM,   /* k[b][j][hk][2] = +Inf */
    P_V_NAN,        /* v[b][j][hk][1] = NaN */
    P_V_INF,        /* v[b][j][hk][1] = +Inf */
    P_Q_NAN_MASKED, /* q[b][i][h][:] = NaN for every row i that sees no key (causal, seqlen_q > seqlen_k) */
    P_COUNT_
};

static const char *poison_name[] = {"q NaN", "q +Inf", "k NaN", "k row +Inf", "k element +Inf",
                                    "v NaN", "v +Inf", "q NaN in rows without keys"};

struct ncase {
    int batch, sq, sk, hq, hkv, d, causal;
    fattn_dtype dt;
    const char *note;
};

/* The poison's place: the last batch entry, kv head 1 % hkv and the first
 * query head of its group; a query row that sees keys; a key that (causal)
 * only some rows see. */
struct site {
    int b, i, h, j, hk;
};

static site site_of(const ncase &c) {
    site s;
    s.b = c.batch - 1;
    s.hk = 1 % c.hkv;
    s.h = s.hk * (c.hq / c.hkv);
    s.i = c.sq - 1 - c.sq / 3;
    s.j = c.sk / 2;
    return s;
}

static int last_key(const ncase &c, int i) {
    const int last = c.causal ? i + c.sk - c.sq : c.sk - 1;
    return last < c.sk - 1 ? last : c.sk - 1;
}

static size_t at(int S, int H, int D, int b, int s, int h, int e) { return (((size_t)b * S + s) * H + h) * D + e; }

static uint16_t bits_of(fattn_dtype dt, double v) {
    if (dt == FATTN_DTYPE_BF16) return isnan(v) ? 0x7fc0 : 0x7f80;
    return isnan(v) ? 0x7e00 : 0x7c00;
}

/* 'n' NaN, '+' / '-' infinities, 'f' finite */
static char cls(double x) { return isnan(x) ? 'n' : isinf(x) ? (x > 0 ? '+' : '-') : 'f'; }

/* [1, S, nh, D] copy of heads h0 .. h0 + nh - 1 of batch entry b */
static std::vector<double> slice(const double *x, int S, int H, int D, int b, int h0, int nh) {
    std::vector<double> y((size_t)S * nh * D);
    for (int s = 0; s < S; ++s)
        for (int h = 0; h < nh; ++h)
            memcpy(&y[((size_t)s * nh + h) * D], x + at(S, H, D, b, s, h0 + h, 0), sizeof(double) * D);
    return y;
}

struct clean_case {
    std::vector<uint16_t> q, k, v;    /* the 16-bit inputs */
    std::vector<double> hq, hk, hv;   /* their values */
    std::vector<double> oref, lref;   /* the FP64 oracle on them */
};

/* The oracle of the poisoned inputs: the clean one, with the poisoned head
 * group (batch s.b, kv head s.hk) recomputed on the poisoned values. */
static void poisoned_oracle(const ncase &c, const site &s, const std::vector<double> &pq, const std::vector<double> &pk,
                            const std::vector<double> &pv, const clean_case &cl, std::vector<double> &oref,
                            std::vector<double> &lref) {
    const int D = c.d, group = c.hq / c.hkv;
    oref = cl.oref;
    lref = cl.lref;
    std::vector<double> sq = slice(pq.data(), c.sq, c.hq, D, s.b, s.hk * group, group);
    std::vector<double> sk = slice(pk.data(), c.sk, c.hkv, D, s.b, s.hk, 1);
    std::vector<double> sv = slice(pv.data(), c.sk, c.hkv, D, s.b, s.hk, 1);
    std::vector<double> so((size_t)c.sq * group * D), sl((size_t)group * c.sq);
    oracle_problem op = {1, c.sq, c.sk, group, 1, D, D, 0.0, c.causal, NULL, NULL};
    oracle_fwd(&op, sq.data(), sk.data(), sv.data(), so.data(), sl.data());
    for (int i = 0; i < c.sq; ++i)
        for (int g = 0; g < group; ++g) {
            const int h = s.hk * group + g;
            memcpy(&oref[at(c.sq, c.hq, D, s.b, i, h, 0)], &so[((size_t)i * group + g) * D], sizeof(double) * D);
            lref[((size_t)s.b * c.hq + h) * c.sq + i] = sl[(size_t)g * c.sq + i];
        }
}

/* The forward on `ctx` (GPU: device copies, O and LSE poisoned, the 16 bytes
 * past O's end checked untouched) into o (16-bit values as doubles), lse. */
static fattn_status run(fattn_ctx *ctx, int on_gpu, const ncase &c, const std::vector<uint16_t> &q,
                        const std::vector<uint16_t> &k, const std::vector<uint16_t> &v, std::vector<double> &o,
                        std::vector<float> &lse) {
    const size_t nq = q.size(), nk = k.size(), nlse = (size_t)c.batch * c.hq * c.sq;
    std::vector<uint16_t> ob(nq + 8, 0xFFFF);
    lse.assign(nlse, NAN);
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = tu_problem(c.batch, c.sq, c.sk, c.hq, c.hkv, c.d, 0, c.causal, NULL, NULL);
    fattn_status st;
    if (on_gpu) {
        uint16_t *dq, *dk, *dv, *dout;
        float *dlse;
        CK(cudaMalloc(&dq, nq * 2));
        CK(cudaMalloc(&dk, nk * 2));
        CK(cudaMalloc(&dv, nk * 2));
        CK(cudaMalloc(&dout, nq * 2 + 16));
        CK(cudaMalloc(&dlse, nlse * 4));
        CK(cudaMemcpy(dq, q.data(), nq * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dk, k.data(), nk * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dv, v.data(), nk * 2, cudaMemcpyHostToDevice));
        CK(cudaMemset(dout, 0xFF, nq * 2 + 16));
        CK(cudaMemset(dlse, 0xFF, nlse * 4));
        a.q = fattn_tensor_bshd(dq, c.dt);
        a.k = fattn_tensor_bshd(dk, c.dt);
        a.v = fattn_tensor_bshd(dv, c.dt);
        a.o = fattn_tensor_bshd(dout, c.dt);
        a.lse = dlse;
        st = fattn_fwd(ctx, &a);
        cudaError_t e = cudaDeviceSynchronize();
        TU_CHECK(e == cudaSuccess, "kernel failed: %s", cudaGetErrorString(e));
        if (e != cudaSuccess) exit(1);
        CK(cudaMemcpy(ob.data(), dout, nq * 2 + 16, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(lse.data(), dlse, nlse * 4, cudaMemcpyDeviceToHost));
        size_t past = 0;
        for (size_t t = nq; t < nq + 8; ++t) past += ob[t] != 0xFFFF;
        TU_CHECK(past == 0, "%zu elements written past the end of O", past);
        cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dout); cudaFree(dlse);
    } else {
        a.q = fattn_tensor_bshd((void *)q.data(), c.dt);
        a.k = fattn_tensor_bshd((void *)k.data(), c.dt);
        a.v = fattn_tensor_bshd((void *)v.data(), c.dt);
        a.o = fattn_tensor_bshd(ob.data(), c.dt);
        a.lse = lse.data();
        st = fattn_fwd(ctx, &a);
    }
    if (st != FATTN_OK)
        fprintf(stderr, "fattn_fwd (%s): %s: %s\n", on_gpu ? "GPU" : "CPU", fattn_status_string(st),
                fattn_last_error(ctx));
    o.resize(nq);
    tu_from_dtype(ob.data(), nq, c.dt, o.data());
    return st;
}

static void poison_case(fattn_ctx *gpu, fattn_ctx *cpu, const ncase &c, const clean_case &cl, poison what) {
    const int D = c.d, group = c.hq / c.hkv, off = c.sk - c.sq;
    const site s = site_of(c);
    std::vector<uint16_t> q = cl.q, k = cl.k, v = cl.v;
    std::vector<double> pq = cl.hq, pk = cl.hk, pv = cl.hv;
    auto put = [&](std::vector<uint16_t> &bits, std::vector<double> &val, size_t idx, double x) {
        bits[idx] = bits_of(c.dt, x);
        val[idx] = x;
    };
    const int t_v = 1; /* the poisoned column of V */
    switch (what) {
    case P_Q_NAN: put(q, pq, at(c.sq, c.hq, D, s.b, s.i, s.h, 3), NAN); break;
    case P_Q_INF: put(q, pq, at(c.sq, c.hq, D, s.b, s.i, s.h, 3), INFINITY); break;
    case P_K_NAN: put(k, pk, at(c.sk, c.hkv, D, s.b, s.j, s.hk, 5), NAN); break;
    case P_K_INF_ROW:
        for (int e = 0; e < D; ++e) put(k, pk, at(c.sk, c.hkv, D, s.b, s.j, s.hk, e), INFINITY);
        break;
    case P_K_INF_ELEM: put(k, pk, at(c.sk, c.hkv, D, s.b, s.j, s.hk, 2), INFINITY); break;
    case P_V_NAN: put(v, pv, at(c.sk, c.hkv, D, s.b, s.j, s.hk, t_v), NAN); break;
    case P_V_INF: put(v, pv, at(c.sk, c.hkv, D, s.b, s.j, s.hk, t_v), INFINITY); break;
    case P_Q_NAN_MASKED:
        for (int i = 0; i < c.sq && last_key(c, i) < 0; ++i)
            for (int e = 0; e < D; ++e) put(q, pq, at(c.sq, c.hq, D, s.b, i, s.h, e), NAN);
        break;
    default: break;
    }
    std::vector<double> og, oc, oref, lref;
    std::vector<float> lg, lc;
    const fattn_status sg = run(gpu, 1, c, q, k, v, og, lg);
    const fattn_status sc = run(cpu, 0, c, q, k, v, oc, lc);
    TU_CHECK(sg == FATTN_OK && sc == FATTN_OK, "%s / %s: a call failed", c.note, poison_name[what]);
    if (sg != FATTN_OK || sc != FATTN_OK) return;
    poisoned_oracle(c, s, pq, pk, pv, cl, oref, lref);

    const bool v_poison = what == P_V_NAN || what == P_V_INF;
    const double tol = c.dt == FATTN_DTYPE_BF16 ? 1.6e-2 : 3.9e-3;
    long o_mismatch = 0, lse_mismatch = 0, lse_nan_as_minf = 0, bad_rows = 0, nan_rows = 0, cpu_nan_rows = 0;
    long free_nan = 0, outside_nan = 0, checked_rows = 0;
    double worst = 0;
    for (int b = 0; b < c.batch; ++b)
        for (int h = 0; h < c.hq; ++h)
            for (int i = 0; i < c.sq; ++i) {
                const size_t oi = at(c.sq, c.hq, D, b, i, h, 0), li = ((size_t)b * c.hq + h) * c.sq + i;
                const int same_group = b == s.b && h / group == s.hk, last = last_key(c, i);
                /* causal V: column t of a row that does not see key j is not
                 * specified within 384 keys of j (header), clean beyond */
                const bool v_free_row = v_poison && c.causal && same_group && last < s.j;
                const bool v_window = v_free_row && s.j - (i + off) < 384;
                bool gpu_nonfinite = false, cpu_nonfinite = false;
                double num = 0, den = 0;
                for (int e = 0; e < D; ++e) {
                    const char g = cls(og[oi + e]), r = cls(oc[oi + e]);
                    gpu_nonfinite |= g != 'f';
                    cpu_nonfinite |= r != 'f';
                    if (v_free_row && e == t_v) {
                        if (g != 'f') {
                            if (v_window) ++free_nan;
                            else ++outside_nan, ++o_mismatch;
                            continue;
                        }
                    } else if (g != r) {
                        ++o_mismatch;
                        continue;
                    }
                    if (g == 'f') {
                        if (!isfinite(oref[oi + e])) { /* finite where the oracle is not */
                            ++o_mismatch;
                            continue;
                        }
                        num += (og[oi + e] - oref[oi + e]) * (og[oi + e] - oref[oi + e]);
                        den += oref[oi + e] * oref[oi + e];
                    }
                }
                nan_rows += gpu_nonfinite;
                cpu_nan_rows += cpu_nonfinite;
                if (den > 0 || num > 0) {
                    ++checked_rows;
                    /* a row of zeros (no key seen) must be zeros exactly */
                    const double err = den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0.0);
                    if (!(err <= tol)) ++bad_rows;
                    if (err > worst) worst = err;
                }
                const char lgc = cls(lg[li]), lcc = cls(lc[li]);
                if (lgc != lcc) {
                    ++lse_mismatch;
                    if (lcc == 'n' && lgc == '-') ++lse_nan_as_minf;
                } else if (lgc == 'f' && !(fabs(lg[li] - lref[li]) <= 1e-3)) {
                    ++lse_mismatch;
                }
            }
    printf("  %-26s rows with NaN/Inf: GPU %ld, CPU %ld; O class mismatches %ld; worst finite row %.2e (tol %.1e)",
           poison_name[what], nan_rows, cpu_nan_rows, o_mismatch, worst, tol);
    if (v_poison && c.causal) printf("; column %d NaN in %ld unseeing rows near the key", t_v, free_nan);
    printf("\n");
    if (what != P_Q_NAN_MASKED)
        TU_CHECK(cpu_nan_rows > 0, "%s / %s: the CPU engine gives no non-finite row (test setup)", c.note,
                 poison_name[what]);
    TU_CHECK(checked_rows > 0, "%s / %s: no finite row to compare", c.note, poison_name[what]);
    TU_CHECK(o_mismatch == 0, "%s / %s: %ld elements of O differ in kind (NaN / Inf / finite) from the CPU engine's%s",
             c.note, poison_name[what], o_mismatch,
             outside_nan ? " (some NaN / Inf 384 or more keys short of the poisoned V key)" : "");
    TU_CHECK(bad_rows == 0, "%s / %s: %ld finite rows off the FP64 oracle by more than %.1e (worst %.2e)", c.note,
             poison_name[what], bad_rows, tol, worst);
    TU_CHECK(lse_mismatch - lse_nan_as_minf == 0, "%s / %s: %ld LSE entries differ from the CPU engine's", c.note,
             poison_name[what], lse_mismatch - lse_nan_as_minf);
    TU_CHECK(lse_nan_as_minf == 0,
             "%s / %s: %ld NaN rows have LSE -inf on the GPU where the CPU engine gives NaN (-inf means 'sees no "
             "key'; fwd_epilogue.cuh finish_row must take only l == 0 as that)",
             c.note, poison_name[what], lse_nan_as_minf);
}

static void run_case(fattn_ctx *gpu, fattn_ctx *cpu, tu_rng *rng, const ncase &c) {
    printf("%s: %s b%d sq%d sk%d h%d/%d d%d%s\n", c.note, fattn_dtype_name(c.dt), c.batch, c.sq, c.sk, c.hq, c.hkv,
           c.d, c.causal ? " causal" : "");
    fflush(stdout);
    clean_case cl;
    const size_t nq = (size_t)c.batch * c.sq * c.hq * c.d, nk = (size_t)c.batch * c.sk * c.hkv * c.d;
    std::vector<double> *vals[3] = {&cl.hq, &cl.hk, &cl.hv};
    std::vector<uint16_t> *bits[3] = {&cl.q, &cl.k, &cl.v};
    for (int t = 0; t < 3; ++t) {
        const size_t n = t == 0 ? nq : nk;
        vals[t]->resize(n);
        bits[t]->resize(n);
        tu_fill_normal(rng, vals[t]->data(), n);
        tu_to_dtype(vals[t]->data(), n, c.dt, bits[t]->data());
        tu_from_dtype(bits[t]->data(), n, c.dt, vals[t]->data());
    }
    cl.oref.resize(nq);
    cl.lref.resize((size_t)c.batch * c.hq * c.sq);
    oracle_problem op = {c.batch, c.sq, c.sk, c.hq, c.hkv, c.d, c.d, 0.0, c.causal, NULL, NULL};
    oracle_fwd(&op, cl.hq.data(), cl.hk.data(), cl.hv.data(), cl.oref.data(), cl.lref.data());
    for (int w = 0; w < P_COUNT_; ++w) {
        if (w == P_Q_NAN_MASKED && !(c.causal && c.sq > c.sk)) continue;
        poison_case(gpu, cpu, c, cl, (poison)w);
    }
}

int main(void) {
    fattn_ctx *gpu = gpu_ctx_or_skip();
    fattn_ctx *cpu = gpu_cpu_ctx();
    tu_rng rng;
    tu_rng_init(&rng, (uint64_t)tu_seed());
    const fattn_dtype B = FATTN_DTYPE_BF16, H = FATTN_DTYPE_F16;
    const ncase cases[] = {
        /* b   sq    sk  hq hkv   d cau */
        {2, 37, 45, 4, 2, 64, 0, B, "GQA 2:1, tails"},
        {2, 37, 45, 4, 2, 64, 1, H, "causal GQA 2:1"},
        {1, 300, 500, 2, 2, 128, 1, B, "causal, seqlen_q < seqlen_k"},
        {1, 700, 300, 2, 1, 256, 1, H, "causal, rows that see no key"},
        {1, 1000, 1000, 2, 2, 128, 0, H, "several tiles"},
        {1, 1000, 1000, 2, 2, 64, 1, B, "causal, 192-row tiles"},
        {1, 600, 700, 4, 2, 64, 0, H, "d64, TMA stores of O"},
        {1, 30, 2900, 2, 2, 128, 0, B, "tiles split along the keys"},
        {2, 1, 4097, 8, 1, 64, 0, B, "one query row, split"},
        {1, 16, 24, 4, 1, 64, 1, H, "decoding kernel, causal step of 16 rows"},
        {2, 12, 700, 8, 2, 128, 1, B, "decoding kernel, causal, GQA 4:1"},
        {1, 250, 250, 2, 2, 256, 0, B, "CTA pairs"},
    };
    const int small = getenv("FATTN_TEST_SMALL") != NULL;
    for (const auto &c : cases) {
        if (small && (long)c.sq * c.sk > 300 * 300) continue;
        run_case(gpu, cpu, &rng, c);
    }
    fattn_ctx_free(cpu);
    fattn_ctx_free(gpu);
    return tu_finish("gpu fwd nan");
}
