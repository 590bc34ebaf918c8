/* test_fwd_args.cu - the Hopper 16-bit forward with the arguments that
 * test_fwd.cu leaves at their defaults, against the FP64 oracle (O by its
 * Frobenius and worst-row errors, LSE by its max abs error: gpu_check_fwd in
 * gpu_testutil.h gives the tolerances and why):
 *   - softmax_scale other than 1/sqrt(head_dim), small and large;
 *   - lse = NULL: O must be the bits of the same call with lse;
 *   - q, k, v and o as views of larger tensors: padded token and batch
 *     strides with a slice of the heads, BHSD with padding, q, k and v heads
 *     of one packed QKV buffer; whatever lies outside O's view stays as it was;
 *   - PDL off (FATTN_OPTION_DISABLE_PDL), and two calls chained on one stream
 *     (the second reads the first's O as its Q) with PDL on and off;
 *   - rows whose max rises while the kernel walks its key blocks, so that the
 *     lazy rescaling of d64 and d256 (FwdCfg LAZY) moves a row's reference
 *     max after the first block (rising_inputs says why it must);
 *   - refusals with device pointers: q misaligned, O on K, lse on O.
 * Inputs from the fixed seed of tu_seed (FATTN_TEST_SEED overrides).  Exit 77
 * (ctest: skipped) without a Hopper GPU; with FATTN_REQUIRE_GPU=1, exit 1. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/oracle.h"
#include "fattn.h"
#include "gpu/gpu_testutil.h"

enum view_kind { V_PACKED, V_PADDED_SLICE, V_BHSD_PADDED, V_QKV };
enum input_kind { IN_NORMAL, IN_RISING };

struct acase {
    int batch, sq, sk, hq, hkv, d, causal;
    fattn_dtype dt;
    float scale;  /* softmax_scale given to the call; 0: the default 1/sqrt(d) */
    int view;     /* view_kind of q, k, v (V_QKV: sq == sk) and o */
    int inputs;   /* input_kind */
    int lse_null; /* run again with lse = NULL: O must be the same bits */
    int pdl_off;  /* FATTN_OPTION_DISABLE_PDL for this call */
};

/* A [batch, seq, heads, d] 16-bit tensor inside a larger buffer: strides and
 * the offset of its first element (elements), the buffer's length. */
struct view {
    int64_t sb, ss, sh, off;
    size_t n;
};

static view make_view(int kind, int B, int S, int H, int D) {
    view v;
    if (kind == V_PADDED_SLICE) { /* heads 2 .. H + 1 of H + 3, 64 elements after each token, 128 after each batch */
        v.sh = D;
        v.ss = (int64_t)(H + 3) * D + 64;
        v.sb = S * v.ss + 128;
        v.off = 2 * D;
    } else if (kind == V_BHSD_PADDED) { /* BHSD, rows D + 8 apart, 8 more after each head, 16 after each batch */
        v.ss = D + 8;
        v.sh = S * v.ss + 8;
        v.sb = H * v.sh + 16;
        v.off = 8;
    } else {
        v.sh = D;
        v.ss = (int64_t)H * D;
        v.sb = S * v.ss;
        v.off = 0;
    }
    v.n = (size_t)(v.off + B * v.sb + 64);
    return v;
}

/* packed BSHD bits <-> the view's elements inside buf; fill_view writes `bits` at every element of the view */
static void scatter(uint16_t *buf, const view &v, const uint16_t *packed, int B, int S, int H, int D) {
    for (int b = 0; b < B; ++b)
        for (int s = 0; s < S; ++s)
            for (int h = 0; h < H; ++h)
                memcpy(buf + v.off + b * v.sb + s * v.ss + h * v.sh, packed + (((size_t)b * S + s) * H + h) * D, 2 * (size_t)D);
}

static void gather(const uint16_t *buf, const view &v, uint16_t *packed, int B, int S, int H, int D) {
    for (int b = 0; b < B; ++b)
        for (int s = 0; s < S; ++s)
            for (int h = 0; h < H; ++h)
                memcpy(packed + (((size_t)b * S + s) * H + h) * D, buf + v.off + b * v.sb + s * v.ss + h * v.sh, 2 * (size_t)D);
}

static void fill_view(uint16_t *buf, const view &v, uint16_t bits, int B, int S, int H, int D) {
    for (int b = 0; b < B; ++b)
        for (int s = 0; s < S; ++s)
            for (int h = 0; h < H; ++h)
                for (int e = 0; e < D; ++e) buf[v.off + b * v.sb + s * v.ss + h * v.sh + e] = bits;
}

/* Doubles -> the dtype's bits, and `held` the exact values those bits are. */
static void to_bits(const double *x, size_t n, fattn_dtype dt, uint16_t *bits, double *held) {
    tu_to_dtype(x, n, dt, bits);
    tu_from_dtype(bits, n, dt, held);
}

/* Rising row maxima.  Dims 0 and 1 of key j are R (cos theta_j, sin
 * theta_j), theta_j = pi j / sk (half a circle), and of query row r
 * R (cos phi_r, sin phi_r); the other dims are N(0, 1).  Row r's scores are
 * then R^2 cos(theta_j - phi_r) + noise, one bump over the keys with its peak
 * at theta_j = phi_r, R^2 scale log2 e = 128 (log2 units) above the level
 * where the bump is a quarter circle wide.  phi_r lies 40-100% of the way down
 * from the last key the row sees (theta_last) to key 0.  The kernel walks a
 * row's key blocks from that last key down to the first; the block max then
 * climbs toward the peak, for a row that sees all 1000 keys by at least
 * 128 (1 - cos(0.4 pi - BN pi / sk)) ~ 27 past the first block's max (BN 192),
 * far more than LAZY_LOG2 = 8, so the reference max must move after the first
 * block.  Rows that see fewer keys than about two blocks (the first causal
 * rows) cannot rise; lazy_fraction counts the rows that must move by the
 * kernel's rule. */
static void rising_inputs(const acase &c, double scale, double *q, double *k) {
    const double pi = 3.141592653589793, R = sqrt(128.0 / (scale * 1.4426950408889634));
    const size_t rows_q = (size_t)c.batch * c.sq * c.hq, rows_k = (size_t)c.batch * c.sk * c.hkv;
    for (size_t r = 0; r < rows_q; ++r) {
        const int i = (int)((r / c.hq) % c.sq);
        int last = c.causal ? i + c.sk - c.sq : c.sk - 1;
        if (last > c.sk - 1) last = c.sk - 1;
        const double u = 0.6 * fmod((double)r * 0.6180339887498949, 1.0);
        const double phi = pi * (last > 0 ? last : 0) / c.sk * u;
        q[r * c.d] = R * cos(phi);
        q[r * c.d + 1] = R * sin(phi);
    }
    for (size_t r = 0; r < rows_k; ++r) {
        const double theta = pi * (double)((r / c.hkv) % c.sk) / c.sk;
        k[r * c.d] = R * cos(theta);
        k[r * c.d + 1] = R * sin(theta);
    }
}

/* The share of the rows (that see a key) whose reference max moves after the
 * first key block the kernel visits, by FwdSoftmax's rule: blocks of bn keys
 * walked from the last the row sees down to the first; the max moves when a
 * block's max passes it by more than 8 in log2 units.  The smallest share
 * over the key blocks the kernels use. */
static double lazy_fraction(const acase &c, double scale, const double *q, const double *k) {
    static const int bns[] = {64, 80, 96, 128, 160, 176, 192};
    const int nbn = (int)(sizeof bns / sizeof bns[0]);
    const double c2 = scale * 1.4426950408889634;
    double *s = (double *)tu_malloc(sizeof(double) * c.sk);
    long moved[sizeof bns / sizeof bns[0]] = {0}, rows = 0;
    for (int b = 0; b < c.batch; ++b)
        for (int i = 0; i < c.sq; ++i)
            for (int h = 0; h < c.hq; ++h) {
                const int last = c.causal ? (i + c.sk - c.sq < c.sk - 1 ? i + c.sk - c.sq : c.sk - 1) : c.sk - 1;
                if (last < 0) continue;
                ++rows;
                const double *qr = q + (((size_t)b * c.sq + i) * c.hq + h) * c.d;
                const int hk = h / (c.hq / c.hkv);
                for (int j = 0; j <= last; ++j) {
                    const double *kr = k + (((size_t)b * c.sk + j) * c.hkv + hk) * c.d;
                    double acc = 0;
                    for (int e = 0; e < c.d; ++e) acc += qr[e] * kr[e];
                    s[j] = acc * c2;
                }
                for (int t = 0; t < nbn; ++t) {
                    double ref = -INFINITY;
                    int moves = 0;
                    for (int n = last / bns[t]; n >= 0; --n) {
                        double mx = -INFINITY;
                        for (int j = n * bns[t]; j < (n + 1) * bns[t] && j <= last; ++j) mx = fmax(mx, s[j]);
                        if (ref == -INFINITY) ref = mx;
                        else if (mx - ref > 8.0) ref = mx, ++moves;
                    }
                    moved[t] += moves > 0;
                }
            }
    free(s);
    double least = 1.0;
    for (int t = 0; t < nbn; ++t) least = fmin(least, rows ? (double)moved[t] / rows : 0.0);
    return least;
}

static const char *view_name(int v) {
    return v == V_PADDED_SLICE ? "padded head slices" : v == V_BHSD_PADDED ? "padded BHSD" : v == V_QKV ? "packed QKV" : "packed";
}

static void run_case(fattn_ctx *ctx, tu_rng *rng, const acase &c) {
    const double scale = c.scale > 0 ? c.scale : 1.0 / sqrt((double)c.d);
    const int B = c.batch, D = c.d;
    const size_t nq = (size_t)B * c.sq * c.hq * D, nk = (size_t)B * c.sk * c.hkv * D, nlse = (size_t)B * c.hq * c.sq;
    double *hq = (double *)tu_malloc(nq * 8), *hk = (double *)tu_malloc(nk * 8), *hv = (double *)tu_malloc(nk * 8);
    double *ref = (double *)tu_malloc(nq * 8), *got = (double *)tu_malloc(nq * 8), *ref_lse = (double *)tu_malloc(nlse * 8);
    uint16_t *bq = (uint16_t *)tu_malloc(nq * 2), *bk = (uint16_t *)tu_malloc(nk * 2), *bv = (uint16_t *)tu_malloc(nk * 2);
    uint16_t *bo = (uint16_t *)tu_malloc(nq * 2);
    float *lse = (float *)tu_malloc(nlse * 4);
    tu_fill_normal(rng, hq, nq);
    tu_fill_normal(rng, hk, nk);
    tu_fill_normal(rng, hv, nk);
    if (c.inputs == IN_RISING) rising_inputs(c, scale, hq, hk);
    to_bits(hq, nq, c.dt, bq, hq);
    to_bits(hk, nk, c.dt, bk, hk);
    to_bits(hv, nk, c.dt, bv, hv);

    /* q, k and v: three buffers, or one (V_QKV: [B, S, hq + 2 hkv, D]) */
    view vq, vk, vv, vo;
    if (c.view == V_QKV) {
        vq = make_view(V_PACKED, B, c.sq, c.hq + 2 * c.hkv, D);
        vk = vv = vq;
        vk.off = (int64_t)c.hq * D;
        vv.off = (int64_t)(c.hq + c.hkv) * D;
    } else {
        vq = make_view(c.view, B, c.sq, c.hq, D);
        vk = make_view(c.view, B, c.sk, c.hkv, D);
        vv = make_view(c.view, B, c.sk, c.hkv, D);
    }
    vo = make_view(c.view == V_QKV ? V_PADDED_SLICE : c.view, B, c.sq, c.hq, D);
    const int shared = c.view == V_QKV;
    uint16_t *host = (uint16_t *)tu_malloc(vq.n * 2 + vk.n * 2 + vv.n * 2);
    uint16_t *hbq = host, *hbk = shared ? host : host + vq.n, *hbv = shared ? host : hbk + vk.n;
    const size_t in_elems = shared ? vq.n : vq.n + vk.n + vv.n;
    for (size_t i = 0; i < in_elems; ++i) host[i] = 0x7FC1; /* NaN in both formats: a read outside a view shows */
    scatter(hbq, vq, bq, B, c.sq, c.hq, D);
    scatter(hbk, vk, bk, B, c.sk, c.hkv, D);
    scatter(hbv, vv, bv, B, c.sk, c.hkv, D);
    uint16_t *din, *dout;
    float *dlse;
    CK(cudaMalloc(&din, in_elems * 2));
    CK(cudaMalloc(&dout, vo.n * 2));
    CK(cudaMalloc(&dlse, nlse * 4));
    CK(cudaMemcpy(din, host, in_elems * 2, cudaMemcpyHostToDevice));
    uint16_t *dq = din, *dk = shared ? din : din + vq.n, *dv = shared ? din : dk + vk.n;

    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p.batch = B;
    a.p.seqlen_q = c.sq;
    a.p.seqlen_k = c.sk;
    a.p.heads_q = c.hq;
    a.p.heads_kv = c.hkv;
    a.p.head_dim = D;
    a.p.causal = c.causal;
    a.p.softmax_scale = c.scale;
    const fattn_tensor tq = {dq + vq.off, c.dt, vq.sb, vq.ss, vq.sh, NULL, 0};
    const fattn_tensor tk = {dk + vk.off, c.dt, vk.sb, vk.ss, vk.sh, NULL, 0};
    const fattn_tensor tv = {dv + vv.off, c.dt, vv.sb, vv.ss, vv.sh, NULL, 0};
    const fattn_tensor to = {dout + vo.off, c.dt, vo.sb, vo.ss, vo.sh, NULL, 0};
    a.q = tq;
    a.k = tk;
    a.v = tv;
    a.o = to;
    a.lse = dlse;

    char what[200];
    snprintf(what, sizeof what, "%s b%d sq%d sk%d h%d/%d d%d%s scale %g%s, %s%s%s", fattn_dtype_name(c.dt), B, c.sq, c.sk,
             c.hq, c.hkv, D, c.causal ? " causal" : "", scale, c.scale > 0 ? "" : " (default)", view_name(c.view),
             c.inputs == IN_RISING ? ", rising max" : "", c.pdl_off ? ", PDL off" : "");
    printf("%s\n", what);

    uint16_t *back = (uint16_t *)tu_malloc(vo.n * 2);
    fattn_ctx_set_option(ctx, FATTN_OPTION_DISABLE_PDL, c.pdl_off);
    for (int pass = 0; pass < (c.lse_null ? 2 : 1); ++pass) {
        CK(cudaMemset(dout, 0xFF, vo.n * 2));
        CK(cudaMemset(dlse, 0xFF, nlse * 4));
        a.lse = pass == 0 ? dlse : NULL;
        fattn_status st = fattn_fwd(ctx, &a);
        TU_CHECK(st == FATTN_OK, "%s%s: fattn_fwd: %s: %s", what, pass ? " (lse NULL)" : "", fattn_status_string(st),
                 fattn_last_error(ctx));
        cudaError_t e = cudaDeviceSynchronize();
        TU_CHECK(e == cudaSuccess, "%s: kernel failed: %s", what, cudaGetErrorString(e));
        if (e != cudaSuccess) exit(1);
        if (pass == 0) {
            CK(cudaMemcpy(back, dout, vo.n * 2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(lse, dlse, nlse * 4, cudaMemcpyDeviceToHost));
            gather(back, vo, bo, B, c.sq, c.hq, D);
            /* everything outside O's view still holds the 0xFF poison */
            fill_view(back, vo, 0xFFFF, B, c.sq, c.hq, D);
            size_t outside = 0;
            for (size_t i = 0; i < vo.n; ++i) outside += back[i] != 0xFFFF;
            TU_CHECK(outside == 0, "%s: %zu elements written outside O's view", what, outside);
        } else {
            /* lse NULL: the same O, bit for bit, and nothing else written */
            uint16_t *again = (uint16_t *)tu_malloc(vo.n * 2);
            CK(cudaMemcpy(again, dout, vo.n * 2, cudaMemcpyDeviceToHost));
            uint16_t *first = (uint16_t *)tu_malloc(vo.n * 2);
            memset(first, 0xFF, vo.n * 2);
            scatter(first, vo, bo, B, c.sq, c.hq, D);
            const int same = memcmp(again, first, vo.n * 2) == 0;
            TU_CHECK(same, "%s: O with lse NULL differs from O with lse", what);
            uint32_t *lse2 = (uint32_t *)tu_malloc(nlse * 4);
            CK(cudaMemcpy(lse2, dlse, nlse * 4, cudaMemcpyDeviceToHost));
            size_t written = 0;
            for (size_t i = 0; i < nlse; ++i) written += lse2[i] != 0xFFFFFFFFu;
            free(lse2);
            TU_CHECK(written == 0, "%s: lse NULL, yet %zu entries of the LSE buffer written", what, written);
            printf("  [%s] lse NULL: O the same bits, LSE buffer untouched\n", same && !written ? "ok" : "FAIL");
            free(again);
            free(first);
        }
    }
    fattn_ctx_set_option(ctx, FATTN_OPTION_DISABLE_PDL, 0);
    tu_from_dtype(bo, nq, c.dt, got);

    oracle_problem op;
    memset(&op, 0, sizeof op);
    op.batch = B; op.seqlen_q = c.sq; op.seqlen_k = c.sk; op.heads_q = c.hq; op.heads_kv = c.hkv;
    op.head_dim = D; op.head_dim_v = D; op.scale = c.scale; op.causal = c.causal;
    oracle_fwd(&op, hq, hk, hv, ref, ref_lse);
    if (c.inputs == IN_RISING || scale * sqrt((double)D) > 4) {
        /* the lazy branch: by construction for the rising inputs, by chance for large scales */
        const double share = lazy_fraction(c, scale, hq, hk);
        printf("  rows whose reference max must move after the first key block: %.1f%% (least over BN 64..192)\n",
               100 * share);
        if (c.inputs == IN_RISING) TU_CHECK(share >= 0.5, "%s: only %.1f%% of rows rescale", what, 100 * share);
    }
    gpu_check_fwd(what, c.dt, got, ref, nq, D, lse, ref_lse, nlse);

    cudaFree(din); cudaFree(dout); cudaFree(dlse);
    free(hq); free(hk); free(hv); free(ref); free(got); free(ref_lse);
    free(bq); free(bk); free(bv); free(bo); free(lse); free(host); free(back);
}

/* o1 = attn(q, k, v), then o2 = attn(o1, k, v) on the same stream with no
 * host sync between: with PDL the second kernel's set-up overlaps the end of
 * the first, and its griddepcontrol.wait must come before it reads o1.  o2 is
 * checked against the oracle on the o1 the first call returned, with PDL on
 * and off, and the two o2 must be the same bits. */
static void chained(fattn_ctx *ctx, tu_rng *rng, int causal, int D) {
    const int B = 1, S = 1000, H = 4;
    const fattn_dtype dt = FATTN_DTYPE_BF16;
    const size_t n = (size_t)B * S * H * D, nlse = (size_t)B * H * S;
    double *hq = (double *)tu_malloc(n * 8), *hk = (double *)tu_malloc(n * 8), *hv = (double *)tu_malloc(n * 8);
    double *ho1 = (double *)tu_malloc(n * 8), *ref = (double *)tu_malloc(n * 8), *got = (double *)tu_malloc(n * 8);
    double *ref_lse = (double *)tu_malloc(nlse * 8);
    uint16_t *bits = (uint16_t *)tu_malloc(n * 2), *o2[2];
    float *lse = (float *)tu_malloc(nlse * 4);
    uint16_t *dq, *dk, *dv, *do1, *do2;
    float *dlse;
    CK(cudaMalloc(&dq, n * 2)); CK(cudaMalloc(&dk, n * 2)); CK(cudaMalloc(&dv, n * 2));
    CK(cudaMalloc(&do1, n * 2)); CK(cudaMalloc(&do2, n * 2)); CK(cudaMalloc(&dlse, nlse * 4));
    double *hs[3] = {hq, hk, hv};
    uint16_t *ds[3] = {dq, dk, dv};
    for (int t = 0; t < 3; ++t) {
        tu_fill_normal(rng, hs[t], n);
        to_bits(hs[t], n, dt, bits, hs[t]);
        CK(cudaMemcpy(ds[t], bits, n * 2, cudaMemcpyHostToDevice));
    }
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p.batch = B; a.p.seqlen_q = a.p.seqlen_k = S; a.p.heads_q = a.p.heads_kv = H; a.p.head_dim = D;
    a.p.causal = causal;
    a.q = fattn_tensor_bshd(dq, dt);
    a.k = fattn_tensor_bshd(dk, dt);
    a.v = fattn_tensor_bshd(dv, dt);
    oracle_problem op;
    memset(&op, 0, sizeof op);
    op.batch = B; op.seqlen_q = op.seqlen_k = S; op.heads_q = op.heads_kv = H; op.head_dim = op.head_dim_v = D;
    op.causal = causal;
    double *ref1 = (double *)tu_malloc(n * 8);
    oracle_fwd(&op, hq, hk, hv, ref1, NULL);
    for (int pdl_off = 0; pdl_off < 2; ++pdl_off) {
        fattn_ctx_set_option(ctx, FATTN_OPTION_DISABLE_PDL, pdl_off);
        CK(cudaMemset(do1, 0xFF, n * 2));
        CK(cudaMemset(do2, 0xFF, n * 2));
        CK(cudaMemset(dlse, 0xFF, nlse * 4));
        CK(cudaDeviceSynchronize());
        fattn_fwd_args a1 = a, a2 = a;
        a1.o = fattn_tensor_bshd(do1, dt);
        a2.q = fattn_tensor_bshd(do1, dt);
        a2.o = fattn_tensor_bshd(do2, dt);
        a2.lse = dlse;
        fattn_status s1 = fattn_fwd(ctx, &a1), s2 = fattn_fwd(ctx, &a2);
        TU_CHECK(s1 == FATTN_OK && s2 == FATTN_OK, "chained calls: %s", fattn_last_error(ctx));
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(bits, do1, n * 2, cudaMemcpyDeviceToHost));
        tu_from_dtype(bits, n, dt, ho1);
        o2[pdl_off] = (uint16_t *)tu_malloc(n * 2);
        CK(cudaMemcpy(o2[pdl_off], do2, n * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(lse, dlse, nlse * 4, cudaMemcpyDeviceToHost));
        tu_from_dtype(o2[pdl_off], n, dt, got);
        char what[128];
        snprintf(what, sizeof what, "chained bf16 b%d s%d h%d d%d%s, PDL %s: first call", B, S, H, D,
                 causal ? " causal" : "", pdl_off ? "off" : "on");
        gpu_check_fwd(what, dt, ho1, ref1, n, D, NULL, NULL, 0);
        oracle_fwd(&op, ho1, hk, hv, ref, ref_lse);
        snprintf(what + strlen(what) - strlen("first call"), 16, "second call");
        gpu_check_fwd(what, dt, got, ref, n, D, lse, ref_lse, nlse);
    }
    fattn_ctx_set_option(ctx, FATTN_OPTION_DISABLE_PDL, 0);
    TU_CHECK(memcmp(o2[0], o2[1], n * 2) == 0, "chained d%d: the second call's O differs with PDL on and off", D);
    cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(do1); cudaFree(do2); cudaFree(dlse);
    free(hq); free(hk); free(hv); free(ho1); free(ref); free(got); free(ref_lse); free(bits); free(lse);
    free(o2[0]); free(o2[1]); free(ref1);
}

/* Refusals that api.c makes for every engine, here with device memory: the
 * status, a message naming the argument, and O, LSE and K as they were. */
static void refusals(fattn_ctx *ctx) {
    const int B = 1, S = 256, H = 2, D = 128;
    const size_t n = (size_t)B * S * H * D, nlse = (size_t)B * H * S;
    uint16_t *dq, *dk, *dv, *dout;
    float *dlse;
    CK(cudaMalloc(&dq, n * 2 + 16)); CK(cudaMalloc(&dk, n * 2)); CK(cudaMalloc(&dv, n * 2));
    CK(cudaMalloc(&dout, n * 2)); CK(cudaMalloc(&dlse, nlse * 4));
    CK(cudaMemset(dq, 0, n * 2 + 16)); CK(cudaMemset(dk, 0x3C, n * 2)); CK(cudaMemset(dv, 0, n * 2));
    fattn_fwd_args good;
    memset(&good, 0, sizeof good);
    good.p.batch = B; good.p.seqlen_q = good.p.seqlen_k = S; good.p.heads_q = good.p.heads_kv = H;
    good.p.head_dim = D;
    good.q = fattn_tensor_bshd(dq, FATTN_DTYPE_BF16);
    good.k = fattn_tensor_bshd(dk, FATTN_DTYPE_BF16);
    good.v = fattn_tensor_bshd(dv, FATTN_DTYPE_BF16);
    good.o = fattn_tensor_bshd(dout, FATTN_DTYPE_BF16);
    good.lse = dlse;
    struct { const char *what, *needle; int kind; } cases[] = {
        {"q one byte off", "q.data is not 2-byte aligned", 0},
        {"o on k", "o overlaps k", 1},
        {"lse on o", "lse overlaps o", 2},
    };
    uint8_t *h = (uint8_t *)tu_malloc(n * 2);
    for (const auto &c : cases) {
        fattn_fwd_args a = good;
        if (c.kind == 0) a.q.data = (uint8_t *)dq + 1;
        if (c.kind == 1) a.o.data = dk;
        if (c.kind == 2) a.lse = (float *)dout + 16;
        CK(cudaMemset(dout, 0xFF, n * 2));
        CK(cudaMemset(dlse, 0xFF, nlse * 4));
        fattn_status st = fattn_fwd(ctx, &a);
        CK(cudaDeviceSynchronize());
        const char *msg = fattn_last_error(ctx);
        int untouched = 1;
        CK(cudaMemcpy(h, dout, n * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n * 2; ++i) untouched &= h[i] == 0xFF;
        CK(cudaMemcpy(h, dlse, nlse * 4, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < nlse * 4; ++i) untouched &= h[i] == 0xFF;
        CK(cudaMemcpy(h, dk, n * 2, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n * 2; ++i) untouched &= h[i] == 0x3C;
        const int ok = st == FATTN_ERROR_INVALID_ARGUMENT && strstr(msg, c.needle) && untouched;
        if (!ok) tu_failures++;
        printf("  [%s] refused: %s: status %d, \"%s\"%s\n", ok ? "ok" : "FAIL", c.what, (int)st, msg,
               untouched ? "" : ", MEMORY WRITTEN");
    }
    TU_CHECK(fattn_fwd(ctx, &good) == FATTN_OK && cudaDeviceSynchronize() == cudaSuccess,
             "the same call with good pointers: %s", fattn_last_error(ctx));
    free(h);
    cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dout); cudaFree(dlse);
}

int main(void) {
    fattn_ctx *ctx = gpu_ctx_or_skip();
    tu_rng rng;
    tu_rng_init(&rng, (uint64_t)tu_seed());
    const fattn_dtype B = FATTN_DTYPE_BF16, H = FATTN_DTYPE_F16;
    const acase cases[] = {
        /* batch sq sk hq hkv d causal dtype scale view inputs lse_null pdl_off */
        /* softmax_scale: small (flat softmax) and large (scores of std 16 to 32: one or two keys per row) */
        {1, 300, 500, 4, 2, 64, 0, B, 0.3f, V_PACKED, IN_NORMAL, 0, 0},
        {1, 500, 500, 2, 2, 128, 1, H, 0.05f, V_PACKED, IN_NORMAL, 0, 0},
        {1, 400, 700, 2, 1, 256, 0, B, 2.0f, V_PACKED, IN_NORMAL, 0, 0},
        {2, 333, 333, 4, 4, 64, 1, H, 2.0f, V_PACKED, IN_NORMAL, 0, 0},
        {1, 300, 1200, 4, 2, 128, 0, B, 1.5f, V_PACKED, IN_NORMAL, 0, 0},
        /* lse NULL: non-causal, causal, split along the keys (72 tiles) */
        {1, 1000, 1000, 2, 2, 128, 0, B, 0, V_PACKED, IN_NORMAL, 1, 0},
        {2, 300, 300, 4, 2, 64, 1, H, 0, V_PACKED, IN_NORMAL, 1, 0},
        {1, 200, 1500, 36, 12, 256, 0, B, 0, V_PACKED, IN_NORMAL, 1, 0},
        /* views of larger tensors; d256 250 rows runs as CTA pairs (multicast
         * K/V loads); 600 x 3000 with 16 heads is 80 tiles, all split */
        {2, 300, 400, 4, 2, 64, 1, B, 0, V_PADDED_SLICE, IN_NORMAL, 0, 0},
        {2, 300, 400, 4, 2, 128, 0, H, 0, V_PADDED_SLICE, IN_NORMAL, 0, 0},
        {1, 250, 250, 2, 2, 256, 0, B, 0, V_PADDED_SLICE, IN_NORMAL, 0, 0},
        {1, 600, 3000, 16, 4, 128, 0, B, 0, V_PADDED_SLICE, IN_NORMAL, 1, 0},
        {2, 200, 300, 4, 2, 128, 1, B, 0, V_BHSD_PADDED, IN_NORMAL, 0, 0},
        {1, 500, 500, 2, 1, 64, 0, H, 0, V_BHSD_PADDED, IN_NORMAL, 0, 0},
        {1, 300, 300, 4, 2, 256, 1, H, 0, V_BHSD_PADDED, IN_NORMAL, 0, 0},
        {2, 512, 512, 4, 2, 128, 1, B, 0, V_QKV, IN_NORMAL, 0, 0},
        {1, 700, 700, 8, 2, 64, 0, H, 0, V_QKV, IN_NORMAL, 0, 0},
        {1, 256, 256, 2, 2, 256, 0, B, 0, V_QKV, IN_NORMAL, 0, 0},
        /* PDL off: causal (dynamic scheduler), split, CTA pairs */
        {1, 1000, 1000, 2, 2, 64, 1, B, 0, V_PACKED, IN_NORMAL, 0, 1},
        {1, 300, 9000, 4, 2, 128, 0, H, 0, V_PACKED, IN_NORMAL, 0, 1},
        {2, 256, 256, 4, 2, 256, 0, B, 0, V_PADDED_SLICE, IN_NORMAL, 0, 1},
        /* rising row maxima: the lazy rescaling of d64 and d256 (causal and
         * not, split tiles), and d128 (which always rescales) for contrast */
        {1, 1000, 1000, 2, 2, 64, 0, B, 0, V_PACKED, IN_RISING, 0, 0},
        {1, 1000, 1000, 2, 2, 64, 1, H, 0, V_PACKED, IN_RISING, 0, 0},
        {1, 1000, 1000, 2, 1, 256, 0, B, 0, V_PACKED, IN_RISING, 0, 0},
        {1, 1000, 1000, 2, 2, 256, 1, H, 0, V_PACKED, IN_RISING, 0, 0},
        {1, 600, 2000, 4, 2, 64, 0, B, 0.5f, V_PADDED_SLICE, IN_RISING, 0, 0},
        {1, 300, 4000, 4, 4, 256, 0, H, 0, V_PACKED, IN_RISING, 1, 0},
        {1, 1000, 1000, 2, 2, 128, 0, B, 0, V_PACKED, IN_RISING, 0, 0},
    };
    for (const auto &c : cases) run_case(ctx, &rng, c);
    chained(ctx, &rng, 0, 128);
    chained(ctx, &rng, 1, 64);
    refusals(ctx);
    fattn_ctx_free(ctx);
    return tu_finish("gpu fwd args");
}
