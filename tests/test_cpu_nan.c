/* test_cpu_nan.c - NaN and Inf in the inputs reach the outputs as they do in
 * torch's SDPA (issue 27 item 3), on the CPU engine:
 *   - a NaN in q makes its row of O and its LSE NaN;
 *   - a NaN in k makes every row that sees that key NaN, and so does a key row
 *     of +Inf, except for rows whose q is negative throughout (score -inf: the
 *     key drops out, as in torch);
 *   - one +Inf element k[j][t] gives the score +inf (NaN row) where q[i][t] > 0
 *     and -inf (key j dropped, row finite) where q[i][t] < 0;
 *   - a NaN (or +Inf) v[j][t] makes column t of every row that sees key j
 *     NaN (non-finite), and nothing else: a row that the causal mask hides
 *     key j from stays the oracle's (issue 43 item 2: P = 0 of a masked key
 *     used to multiply the NaN, which made whole query panels NaN);
 *   - a row that sees no key (causal, seqlen_q > seqlen_k) stays O = 0,
 *     LSE = -inf even when its own q is NaN;
 *   - every other row equals the FP64 oracle of the clean inputs.
 * Backward: every gradient that depends on the NaN is NaN (dq of the rows that
 * see the poisoned key or hold the poisoned query, dk / dv of the keys those
 * rows see); gradients of other heads and batch entries equal the oracle's.
 * Others of the same head may be NaN too: dK = dS^T Q and dQ = dS K multiply
 * the exact zeros of dS by the NaN row (torch's math backward does the same
 * for the whole head), so those are only checked when finite.
 * Quantize: a block holding +-Inf gets scale +Inf and dequantises to NaN
 * (fattn.h), and attention over it gives NaN rows.
 * Every forward instance this CPU has (cpu_isas.h).  Fixed seed
 * (FATTN_TEST_SEED overrides). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/oracle.h"
#include "common/testutil.h"
#include "cpu_isas.h"
#include "fattn.h"

typedef enum poison {
    P_Q_NAN,      /* q[b][i][h][3 % d] = NaN */
    P_K_NAN,      /* k[b][j][hk][5 % d] = NaN */
    P_K_INF_ROW,  /* k[b][j][hk][:] = +Inf */
    P_K_INF_ELEM, /* k[b][j][hk][2 % d] = +Inf */
    P_V_NAN,      /* v[b][j][hk][1] = NaN */
    P_V_INF,      /* v[b][j][hk][1] = +Inf */
} poison;

static const char *poison_name[] = {"q NaN", "k NaN", "k row +Inf", "k element +Inf", "v NaN", "v +Inf"};

typedef struct ncase {
    const char *name;
    int batch, sq, sk, hq, hkv, d, causal;
    fattn_dtype dt;
} ncase;

/* Where the poison goes: the last batch entry, kv head 1 % hkv, query head
 * the first of that group; a query row that sees keys and a key that only
 * some rows see (causal). */
typedef struct site {
    int b, i, h, j, hk;
} site;

static site site_of(const ncase *c) {
    site s;
    s.b = c->batch - 1;
    s.hk = 1 % c->hkv;
    s.h = s.hk * (c->hq / c->hkv);
    s.i = c->sq - 1 - c->sq / 3; /* sees keys up to i + sk - sq when causal */
    s.j = c->sk / 2;
    return s;
}

static int64_t last_key(const ncase *c, int64_t i) {
    int64_t last = c->causal ? i + c->sk - c->sq : c->sk - 1;
    return last < c->sk - 1 ? last : c->sk - 1;
}

static void put(tu_tensor *x, int b, int s, int h, int e, float val) {
    int64_t off = (int64_t)b * x->t.stride_batch + (int64_t)s * x->t.stride_seq +
                  (int64_t)h * x->t.stride_head + e;
    if (x->t.dtype == FATTN_DTYPE_F32) {
        ((float *)x->t.data)[off] = val;
    } else { /* bf16 / f16: NaN and Inf patterns */
        uint16_t bits;
        if (x->t.dtype == FATTN_DTYPE_BF16) bits = isnan(val) ? 0x7fc0 : 0x7f80;
        else bits = isnan(val) ? 0x7e00 : 0x7c00;
        ((uint16_t *)x->t.data)[off] = bits;
    }
}

/* Packed BSHD index of element e of (b, s, h) in a tensor of `heads` x `dim`. */
static size_t bshd(int seq, int heads, int dim, int b, int s, int h, int e) {
    return (((size_t)b * seq + s) * heads + h) * dim + e;
}

static double rel_err_row(const double *x, const double *ref, int n) {
    double num = 0.0, den = 0.0;
    for (int t = 0; t < n; t++) {
        num += (x[t] - ref[t]) * (x[t] - ref[t]);
        den += ref[t] * ref[t];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

static int row_all_nan(const double *x, int n) {
    for (int t = 0; t < n; t++)
        if (!isnan(x[t])) return 0;
    return 1;
}

static int row_any_nonfinite(const double *x, int n) {
    for (int t = 0; t < n; t++)
        if (!isfinite(x[t])) return 1;
    return 0;
}

/* Per-row tolerance of a clean row against the FP64 oracle. */
static double tol_of(fattn_dtype dt) { return dt == FATTN_DTYPE_F32 ? 2e-5 : 2e-2; }

/* ---- forward ------------------------------------------------------------- */

static void fwd_case(fattn_ctx *ctx, tu_rng *rng, const ncase *c, poison what) {
    const int d = c->d;
    site s = site_of(c);
    tu_tensor q, k, v, o;
    tu_tensor_alloc(&q, c->dt, c->batch, c->sq, c->hq, d, TU_BSHD, 1);
    tu_tensor_alloc(&k, c->dt, c->batch, c->sk, c->hkv, d, TU_BSHD, 1);
    tu_tensor_alloc(&v, c->dt, c->batch, c->sk, c->hkv, d, TU_BSHD, 1);
    tu_tensor_alloc(&o, c->dt, c->batch, c->sq, c->hq, d, TU_BSHD, 1);
    const size_t nlse = (size_t)c->batch * c->hq * c->sq;
    float *lse = (float *)tu_malloc(sizeof(float) * nlse);
    double *src = (double *)tu_malloc(sizeof(double) * (q.count + k.count + v.count));
    double *hq_ = (double *)tu_malloc(sizeof(double) * q.count);
    double *hk_ = (double *)tu_malloc(sizeof(double) * k.count);
    double *hv_ = (double *)tu_malloc(sizeof(double) * v.count);
    double *oref = (double *)tu_malloc(sizeof(double) * o.count);
    double *lref = (double *)tu_malloc(sizeof(double) * nlse);
    double *ogot = (double *)tu_malloc(sizeof(double) * o.count);
    tu_fill_normal(rng, src, q.count + k.count + v.count);
    tu_tensor_set(&q, src, hq_);
    tu_tensor_set(&k, src + q.count, hk_);
    tu_tensor_set(&v, src + q.count + k.count, hv_);
    tu_tensor_poison(&o);
    tu_poison(lse, sizeof(float) * nlse);

    /* The oracle of the clean inputs, except for +Inf in k, where the
     * oracle's IEEE arithmetic on the poisoned input is the reference: its
     * scores are +inf or NaN (the row is NaN) or -inf (the key is dropped: a
     * +Inf row meets a q whose every element is negative, or one element a
     * negative q element). */
    switch (what) {
    case P_Q_NAN: put(&q, s.b, s.i, s.h, 3 % d, NAN); break;
    case P_K_NAN: put(&k, s.b, s.j, s.hk, 5 % d, NAN); break;
    case P_K_INF_ROW:
        for (int e = 0; e < d; e++) {
            put(&k, s.b, s.j, s.hk, e, INFINITY);
            hk_[bshd(c->sk, c->hkv, d, s.b, s.j, s.hk, e)] = INFINITY;
        }
        break;
    case P_K_INF_ELEM:
        put(&k, s.b, s.j, s.hk, 2 % d, INFINITY);
        hk_[bshd(c->sk, c->hkv, d, s.b, s.j, s.hk, 2 % d)] = INFINITY;
        break;
    case P_V_NAN: put(&v, s.b, s.j, s.hk, 1, NAN); break;
    case P_V_INF: put(&v, s.b, s.j, s.hk, 1, INFINITY); break;
    }
    oracle_problem op = {c->batch, c->sq, c->sk, c->hq, c->hkv, d, d, 0.0, c->causal, NULL, NULL};
    oracle_fwd(&op, hq_, hk_, hv_, oref, lref);

    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = tu_problem(c->batch, c->sq, c->sk, c->hq, c->hkv, d, 0, c->causal, NULL, NULL);
    a.q = q.t; a.k = k.t; a.v = v.t; a.o = o.t;
    a.lse = lse;
    fattn_status st = fattn_fwd(ctx, &a);
    TU_CHECK(st == FATTN_OK, "fattn_fwd: %s (%s)", fattn_status_string(st), fattn_last_error(ctx));
    if (st == FATTN_OK) {
        tu_tensor_get(&o, ogot);
        const int group = c->hq / c->hkv;
        long bad_nan = 0, bad_masked = 0, bad_clean = 0, n_nan = 0, n_masked = 0;
        double worst = 0.0;
        for (int b = 0; b < c->batch; b++)
            for (int h = 0; h < c->hq; h++)
                for (int i = 0; i < c->sq; i++) {
                    const size_t oi = bshd(c->sq, c->hq, d, b, i, h, 0);
                    const size_t li = ((size_t)b * c->hq + h) * c->sq + i;
                    const int64_t last = last_key(c, i);
                    const int same = b == s.b && h / group == s.hk;
                    int expect_nan = 0;
                    if (last >= 0 && same) {
                        if (what == P_Q_NAN) expect_nan = i == s.i && h == s.h;
                        else if (what == P_K_NAN) expect_nan = s.j <= last;
                        else if (what == P_V_NAN || what == P_V_INF) expect_nan = s.j <= last;
                        else expect_nan = isnan(oref[oi]); /* +Inf: the oracle says */
                    }
                    if (last < 0) { /* sees no key: exactly 0 and -inf */
                        n_masked++;
                        int ok = lse[li] == -INFINITY;
                        for (int t = 0; t < d; t++) ok &= ogot[oi + t] == 0.0;
                        bad_masked += !ok;
                    } else if (expect_nan) {
                        n_nan++;
                        if (what == P_V_NAN || what == P_V_INF) { /* only column 1 of O; LSE unaffected */
                            int ok = (what == P_V_NAN ? isnan(ogot[oi + 1]) : !isfinite(ogot[oi + 1])) &&
                                     fabs((double)lse[li] - lref[li]) <= 1e-4;
                            for (int t = 0; t < d; t++) ok &= t == 1 || isfinite(ogot[oi + t]);
                            bad_nan += !ok;
                        } else {
                            bad_nan += !(row_all_nan(ogot + oi, d) && isnan(lse[li]));
                        }
                    } else {
                        double e = row_any_nonfinite(ogot + oi, d) || !isfinite(lse[li])
                                       ? INFINITY
                                       : rel_err_row(ogot + oi, oref + oi, d);
                        double le = fabs((double)lse[li] - lref[li]);
                        if (!(le <= 1e-4)) e = INFINITY;
                        if (!(e <= tol_of(c->dt))) bad_clean++;
                        if (e > worst) worst = e;
                    }
                }
        printf("  %-15s %ld NaN rows, %ld masked rows, worst clean row %.2e\n", poison_name[what],
               n_nan, n_masked, worst);
        TU_CHECK(n_nan > 0, "%s / %s: no row was expected to be NaN (test setup)", c->name,
                 poison_name[what]);
        TU_CHECK(bad_nan == 0, "%s / %s: %ld rows should hold NaN (in O and LSE; v: in O column 1) and do not", c->name,
                 poison_name[what], bad_nan);
        TU_CHECK(bad_masked == 0, "%s / %s: %ld rows that see no key are not O = 0, LSE = -inf",
                 c->name, poison_name[what], bad_masked);
        TU_CHECK(bad_clean == 0, "%s / %s: %ld clean rows are wrong or not finite (worst %.2e)",
                 c->name, poison_name[what], bad_clean, worst);
    }
    free(lse); free(src); free(hq_); free(hk_); free(hv_); free(oref); free(lref); free(ogot);
    tu_tensor_free(&q); tu_tensor_free(&k); tu_tensor_free(&v); tu_tensor_free(&o);
}

/* A NaN q in a row that sees no key: that row stays 0 / -inf. */
static void fwd_masked_nan(fattn_ctx *ctx, tu_rng *rng, fattn_dtype dt) {
    const int b = 1, sq = 40, sk = 10, h = 2, d = 32;
    tu_tensor q, k, v, o;
    tu_tensor_alloc(&q, dt, b, sq, h, d, TU_BSHD, 1);
    tu_tensor_alloc(&k, dt, b, sk, h, d, TU_BSHD, 1);
    tu_tensor_alloc(&v, dt, b, sk, h, d, TU_BSHD, 1);
    tu_tensor_alloc(&o, dt, b, sq, h, d, TU_BSHD, 1);
    float lse[2 * 40];
    double *src = (double *)tu_malloc(sizeof(double) * (q.count + k.count + v.count));
    double *ogot = (double *)tu_malloc(sizeof(double) * o.count);
    tu_fill_normal(rng, src, q.count + k.count + v.count);
    tu_tensor_set(&q, src, NULL);
    tu_tensor_set(&k, src + q.count, NULL);
    tu_tensor_set(&v, src + q.count + k.count, NULL);
    for (int i = 0; i < sq - sk; i++) /* every row that sees no key */
        for (int e = 0; e < d; e++) put(&q, 0, i, 1, e, NAN);
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = tu_problem(b, sq, sk, h, h, d, 0, 1, NULL, NULL);
    a.q = q.t; a.k = k.t; a.v = v.t; a.o = o.t;
    a.lse = lse;
    TU_EXPECT_OK(fattn_fwd(ctx, &a));
    tu_tensor_get(&o, ogot);
    long bad = 0;
    for (int i = 0; i < sq - sk; i++) {
        int ok = lse[sq + i] == -INFINITY;
        for (int e = 0; e < d; e++) ok &= ogot[bshd(sq, h, d, 0, i, 1, e)] == 0.0;
        bad += !ok;
    }
    printf("  NaN q in rows that see no key (%s): %ld rows not 0 / -inf\n", fattn_dtype_name(dt), bad);
    TU_CHECK(bad == 0, "rows that see no key with NaN q: %ld not O = 0, LSE = -inf", bad);
    free(src); free(ogot);
    tu_tensor_free(&q); tu_tensor_free(&k); tu_tensor_free(&v); tu_tensor_free(&o);
}

/* ---- backward ------------------------------------------------------------ */

static void bwd_case(fattn_ctx *ctx, tu_rng *rng, const ncase *c, poison what) {
    const int d = c->d, group = c->hq / c->hkv;
    site s = site_of(c);
    tu_tensor q, k, v, o, dO, dq, dk, dv;
    tu_tensor_alloc(&q, c->dt, c->batch, c->sq, c->hq, d, TU_BSHD, 1);
    tu_tensor_alloc(&k, c->dt, c->batch, c->sk, c->hkv, d, TU_BSHD, 1);
    tu_tensor_alloc(&v, c->dt, c->batch, c->sk, c->hkv, d, TU_BSHD, 1);
    tu_tensor_alloc(&o, c->dt, c->batch, c->sq, c->hq, d, TU_BSHD, 1);
    tu_tensor_alloc(&dO, c->dt, c->batch, c->sq, c->hq, d, TU_BSHD, 1);
    tu_tensor_alloc(&dq, c->dt, c->batch, c->sq, c->hq, d, TU_BSHD, 1);
    tu_tensor_alloc(&dk, c->dt, c->batch, c->sk, c->hkv, d, TU_BSHD, 1);
    tu_tensor_alloc(&dv, c->dt, c->batch, c->sk, c->hkv, d, TU_BSHD, 1);
    const size_t nlse = (size_t)c->batch * c->hq * c->sq;
    float *lse = (float *)tu_malloc(sizeof(float) * nlse);
    const size_t nin = q.count + k.count + v.count + dO.count;
    double *src = (double *)tu_malloc(sizeof(double) * nin);
    double *h[4], *ref[3], *got[3];
    const tu_tensor *ins[4] = {&q, &k, &v, &dO};
    tu_tensor *outs[3] = {&dq, &dk, &dv};
    tu_fill_normal(rng, src, nin);
    size_t off = 0;
    for (int t = 0; t < 4; t++) {
        h[t] = (double *)tu_malloc(sizeof(double) * ins[t]->count);
        tu_tensor_set((tu_tensor *)ins[t], src + off, h[t]);
        off += ins[t]->count;
    }
    for (int t = 0; t < 3; t++) {
        ref[t] = (double *)tu_malloc(sizeof(double) * outs[t]->count);
        got[t] = (double *)tu_malloc(sizeof(double) * outs[t]->count);
        tu_tensor_poison(outs[t]);
    }
    oracle_problem op = {c->batch, c->sq, c->sk, c->hq, c->hkv, d, d, 0.0, c->causal, NULL, NULL};
    oracle_bwd(&op, h[0], h[1], h[2], h[3], ref[0], ref[1], ref[2]); /* clean */
    if (what == P_Q_NAN) put(&q, s.b, s.i, s.h, 3 % d, NAN);
    else put(&k, s.b, s.j, s.hk, 5 % d, NAN);

    const fattn_problem p = tu_problem(c->batch, c->sq, c->sk, c->hq, c->hkv, d, 0, c->causal, NULL, NULL);
    fattn_fwd_args fa;
    memset(&fa, 0, sizeof fa);
    fa.p = p;
    fa.q = q.t; fa.k = k.t; fa.v = v.t; fa.o = o.t;
    fa.lse = lse;
    fattn_status st = fattn_fwd(ctx, &fa);
    TU_CHECK(st == FATTN_OK, "fattn_fwd: %s", fattn_last_error(ctx));
    fattn_bwd_args ba;
    memset(&ba, 0, sizeof ba);
    ba.p = p;
    ba.q = q.t; ba.k = k.t; ba.v = v.t; ba.o = o.t; ba.dout = dO.t;
    ba.dq = dq.t; ba.dk = dk.t; ba.dv = dv.t;
    ba.lse = lse;
    ba.deterministic = 1;
    if (st == FATTN_OK) {
        st = fattn_bwd(ctx, &ba);
        TU_CHECK(st == FATTN_OK, "fattn_bwd: %s", fattn_last_error(ctx));
    }
    if (st == FATTN_OK) {
        for (int t = 0; t < 3; t++) tu_tensor_get(outs[t], got[t]);
        /* Rows of (b, head group of s.hk) whose forward is NaN. */
        char *row_nan = (char *)tu_malloc((size_t)c->sq);
        for (int i = 0; i < c->sq; i++) {
            const int64_t last = last_key(c, i);
            row_nan[i] = what == P_Q_NAN ? (i == s.i && last >= 0) : (last >= s.j);
        }
        long bad[3] = {0, 0, 0}, nnan[3] = {0, 0, 0}, nspread[3] = {0, 0, 0};
        double worst[3] = {0, 0, 0};
        for (int t = 0; t < 3; t++) {
            const int rows = t == 0 ? c->sq : c->sk, heads = t == 0 ? c->hq : c->hkv;
            for (int b = 0; b < c->batch; b++)
                for (int hh = 0; hh < heads; hh++)
                    for (int r = 0; r < rows; r++) {
                        const size_t gi = bshd(rows, heads, d, b, r, hh, 0);
                        int expect_nan = 0;
                        if (b == s.b && (t == 0 ? hh / group : hh) == s.hk) {
                            if (t == 0) { /* dq row r: NaN if its forward row is */
                                expect_nan = row_nan[r] && (what != P_Q_NAN || hh == s.h);
                            } else { /* dk / dv row r: NaN if a NaN row sees key r */
                                for (int i = 0; i < c->sq && !expect_nan; i++)
                                    expect_nan = row_nan[i] && r <= last_key(c, i);
                            }
                        }
                        const int same = b == s.b && (t == 0 ? hh / group : hh) == s.hk;
                        if (expect_nan) {
                            nnan[t]++;
                            bad[t] += !row_all_nan(got[t] + gi, d);
                        } else if (same && row_any_nonfinite(got[t] + gi, d)) {
                            nspread[t]++; /* allowed: see the header */
                        } else {
                            /* Clean gradients: relative to the norm of the row, or
                             * absolute when the row's gradient is tiny. */
                            double e = 0.0, den = 0.0;
                            for (int x = 0; x < d; x++) {
                                e += (got[t][gi + x] - ref[t][gi + x]) * (got[t][gi + x] - ref[t][gi + x]);
                                den += ref[t][gi + x] * ref[t][gi + x];
                            }
                            e = row_any_nonfinite(got[t] + gi, d) ? INFINITY : sqrt(e / (den > 1e-2 ? den : 1e-2));
                            if (!(e <= 10 * tol_of(c->dt))) bad[t]++;
                            if (e > worst[t]) worst[t] = e;
                        }
                    }
        }
        const char *nm[3] = {"dq", "dk", "dv"};
        for (int t = 0; t < 3; t++) {
            printf("  bwd %-8s %s: %ld NaN rows, %ld more in the same head, worst clean row %.2e\n",
                   poison_name[what], nm[t], nnan[t], nspread[t], worst[t]);
            TU_CHECK(bad[t] == 0, "%s / bwd %s: %ld %s rows wrong (NaN expected: %ld)", c->name,
                     poison_name[what], bad[t], nm[t], nnan[t]);
        }
        free(row_nan);
    }
    free(lse); free(src);
    for (int t = 0; t < 4; t++) free(h[t]);
    for (int t = 0; t < 3; t++) { free(ref[t]); free(got[t]); }
    tu_tensor_free(&q); tu_tensor_free(&k); tu_tensor_free(&v); tu_tensor_free(&o);
    tu_tensor_free(&dO); tu_tensor_free(&dq); tu_tensor_free(&dk); tu_tensor_free(&dv);
}

/* ---- quantize -------------------------------------------------------------- */

/* fattn_quantize propagates a non-finite input as fattn.h says: a block
 * holding +-Inf gets scale +Inf, its Inf entries code NaN (0x7F) and its finite
 * entries +-0, so it dequantises (code * scale) to NaN throughout and attention
 * on it gives NaN; a NaN entry codes NaN and is left out of amax.  Other blocks
 * are untouched.  Then attention over the quantised K: every row that sees a
 * key of the +Inf block is NaN, every other row is finite. */
static void quantize_inf(fattn_ctx *ctx, tu_rng *rng, int rotate, fattn_quant_granularity g) {
    enum { S = 40, H = 2, D = 64, BR = 16, NB = (S + BR - 1) / BR };
    const size_t n = (size_t)S * H * D;
    float *x = (float *)tu_malloc(sizeof(float) * n);
    uint8_t *codes = (uint8_t *)tu_malloc(n);
    float scales[H * NB];
    for (size_t i = 0; i < n; i++) x[i] = (float)tu_rng_normal(rng);
    const size_t at_pinf = bshd(S, H, D, 0, 20, 1, 7);  /* head 1, block 1 */
    const size_t at_ninf = bshd(S, H, D, 0, 3, 0, 0);   /* head 0, block 0 */
    const size_t at_nan = bshd(S, H, D, 0, 35, 1, 9);   /* head 1, block 2 */
    x[at_pinf] = INFINITY;
    x[at_ninf] = -INFINITY;
    x[at_nan] = NAN;
    fattn_quantize_args a;
    memset(&a, 0, sizeof a);
    a.in = fattn_tensor_bshd(x, FATTN_DTYPE_F32);
    a.out = fattn_tensor_bshd(codes, FATTN_DTYPE_E4M3);
    a.out.scale = scales;
    a.batch = 1; a.seqlen = S; a.heads = H; a.head_dim = D;
    a.granularity = g;
    a.block_rows = BR;
    a.rotate = rotate;
    a.seed = 5;
    TU_EXPECT_OK(fattn_quantize(ctx, &a));
    long bad = 0;
    for (int h = 0; h < H; h++)
        for (int blk = 0; blk < NB; blk++) {
            const int inf_blk = g == FATTN_QUANT_TENSOR || (h == 1 && blk == 1) || (h == 0 && blk == 0);
            const float sc = scales[h * NB + blk];
            if (inf_blk) {
                bad += !(sc == INFINITY);
                /* every entry dequantises to NaN (a finite code times +Inf is
                 * NaN only for code 0; a rotated row of an Inf is +-Inf
                 * throughout, which codes NaN) */
                for (int r = blk * BR; r < S && r < (blk + 1) * BR; r++)
                    for (int e = 0; e < D; e++)
                        bad += !isnan(fattn_e4m3_to_f32(codes[bshd(S, H, D, 0, r, h, e)]) * sc);
            } else {
                bad += !(isfinite(sc) && sc > 0.0f);
            }
        }
    if (!rotate && g == FATTN_QUANT_BLOCK) {
        bad += codes[at_pinf] != 0x7f || codes[at_ninf] != 0x7f || codes[at_nan] != 0x7f;
        for (size_t i = bshd(S, H, D, 0, 32, 1, 0); i < bshd(S, H, D, 0, 33, 1, 0); i++)
            bad += i != at_nan && !isfinite(fattn_e4m3_to_f32(codes[i]) * scales[1 * NB + 2]);
    }
    printf("  quantize %s%s with +-Inf and NaN: %ld wrong scales / codes\n",
           g == FATTN_QUANT_TENSOR ? "per tensor" : "blocks", rotate ? " + rotation" : "", bad);
    TU_CHECK(bad == 0, "quantize with Inf: %ld wrong scales or codes", bad);

    if (!rotate && g == FATTN_QUANT_BLOCK) {
        /* Attention with that tensor as K (head 1 has the +Inf block 1, rows
         * 16..31; head 0 the -Inf block 0), causal, Q and V quantised clean. */
        float *y = (float *)tu_malloc(sizeof(float) * n);
        uint8_t *qc = (uint8_t *)tu_malloc(n), *vc = (uint8_t *)tu_malloc(n);
        float qs[H * NB], vs[H * NB], o[S * H * D], lse[H * S];
        fattn_quantize_args b = a;
        for (size_t i = 0; i < n; i++) y[i] = (float)tu_rng_normal(rng);
        b.in.data = y; b.out.data = qc; b.out.scale = qs;
        TU_EXPECT_OK(fattn_quantize(ctx, &b));
        b.out.data = vc; b.out.scale = vs;
        TU_EXPECT_OK(fattn_quantize(ctx, &b));
        fattn_fwd_args f;
        memset(&f, 0, sizeof f);
        f.p = tu_problem(1, S, S, H, H, D, 0, 1, NULL, NULL);
        f.q = fattn_tensor_bshd(qc, FATTN_DTYPE_E4M3); f.q.scale = qs; f.q.scale_block = BR;
        f.k = fattn_tensor_bshd(codes, FATTN_DTYPE_E4M3); f.k.scale = scales; f.k.scale_block = BR;
        f.v = fattn_tensor_bshd(vc, FATTN_DTYPE_E4M3); f.v.scale = vs; f.v.scale_block = BR;
        f.o = fattn_tensor_bshd(o, FATTN_DTYPE_F32);
        f.lse = lse;
        TU_EXPECT_OK(fattn_fwd(ctx, &f));
        long wrong = 0;
        for (int h = 0; h < H; h++)
            for (int i = 0; i < S; i++) {
                /* head 0: block 0 (keys 0..15) is seen by every row; head 1:
                 * block 1 (keys 16..31) by rows i >= 16 */
                const int want_nan = h == 0 || i >= 16;
                int all_nan = isnan(lse[h * S + i]), all_fin = isfinite(lse[h * S + i]);
                for (int e = 0; e < D; e++) {
                    float v = o[bshd(S, H, D, 0, i, h, e)];
                    all_nan &= isnan(v) != 0;
                    all_fin &= isfinite(v) != 0;
                }
                wrong += want_nan ? !all_nan : !all_fin;
            }
        printf("  attention over the quantised K: %ld rows wrong\n", wrong);
        TU_CHECK(wrong == 0, "attention over a quantised +-Inf block: %ld rows wrong", wrong);
        free(y); free(qc); free(vc);
    }
    free(x); free(codes);
}

int main(void) {
    tu_rng rng;
    const char *env = getenv("FATTN_TEST_SEED");
    tu_rng_init(&rng, env && *env ? (uint64_t)tu_seed() : 27u);
    fattn_ctx *ctx = NULL;
    TU_EXPECT_OK(fattn_ctx_create(&ctx, FATTN_BACKEND_CPU, 0));
    if (!ctx) return 1;
    const fattn_dtype F32 = FATTN_DTYPE_F32, BF16 = FATTN_DTYPE_BF16;
    const ncase cases[] = {
        /* name                                   b   sq   sk hq hkv    d cau */
        {"f32 37x45 GQA 2:1 d64",                 2,  37,  45, 4, 2,  64, 0, F32},
        {"f32 37x45 causal GQA 2:1 d64",          2,  37,  45, 4, 2,  64, 1, F32},
        {"f32 130x300 causal d128",               1, 130, 300, 2, 2, 128, 1, F32},
        {"f32 300x130 causal (masked rows) d32",  1, 300, 130, 2, 2,  32, 1, F32},
        {"f32 70x200 d256",                       1,  70, 200, 2, 2, 256, 0, F32},
        {"f32 40x33 causal d5",                   1,  40,  33, 2, 2,   5, 1, F32},
        {"bf16 37x45 causal d64",                 2,  37,  45, 4, 2,  64, 1, BF16},
        {"bf16 100x150 d128",                     1, 100, 150, 2, 1, 128, 0, BF16},
        {"f32 16x16 causal d8 (issue 43)",        1,  16,  16, 1, 1,   8, 1, F32},
        {"f32 64x64 causal d32",                  1,  64,  64, 2, 2,  32, 1, F32},
        {"f32 200x90 causal d16",                 1, 200,  90, 1, 1,  16, 1, F32},
    };
    const int ncases = (int)(sizeof cases / sizeof cases[0]);
    for (int isa = 0; cpu_isa_next(&isa, &ctx);) {
        for (int ci = 0; ci < ncases; ci++) {
            const ncase *c = &cases[ci];
            printf("%s\n", c->name);
            for (int w = P_Q_NAN; w <= P_V_INF; w++) fwd_case(ctx, &rng, c, (poison)w);
            bwd_case(ctx, &rng, c, P_Q_NAN);
            bwd_case(ctx, &rng, c, P_K_NAN);
        }
        fwd_masked_nan(ctx, &rng, F32);
        fwd_masked_nan(ctx, &rng, BF16);
    }
    printf("quantize\n");
    quantize_inf(ctx, &rng, 0, FATTN_QUANT_BLOCK);
    quantize_inf(ctx, &rng, 1, FATTN_QUANT_BLOCK);
    quantize_inf(ctx, &rng, 0, FATTN_QUANT_TENSOR);
    fattn_ctx_free(ctx);
    return tu_finish("test_cpu_nan");
}
