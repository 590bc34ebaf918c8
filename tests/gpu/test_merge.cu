/* test_merge.cu - fattn_merge on a CUDA context against the CPU engine's
 * fattn_merge on the same data (host copies of the same bytes, the same
 * layouts):
 *   - 1, 2, 3, 5, 7, 8, 300 and 1024 parts; head dims 1, 16, 37 (odd: 2-byte
 *     accesses and a partial last chunk), 40, 64, 128, 256 and 300 (rows of
 *     more than 32 chunks: two passes a lane);
 *   - part dtypes f32, f16, bf16, one for all or mixed (cycling), outputs
 *     f32, f16, bf16;
 *   - parts packed, padded head slices, padded BHSD, head slices of one
 *     shared buffer, and parts that each have their own strides and
 *     alignment (300 and 1024 parts of distinct layouts: more than the 256
 *     layout slots of one launch, so the call runs as several launches that
 *     carry the running sums in the context's workspace); outputs packed,
 *     padded slices and padded BHSD; bytes outside the output view must
 *     stay as they were;
 *   - rows where some parts are -inf (their O rows hold NaN: they must not
 *     be read), rows where every part is -inf (o = 0, lse = -inf), parts
 *     whose weight underflows (lse 150 below), a NaN lse (row NaN), a NaN in
 *     a participating O (that element NaN, lse finite), an lse of +inf (row
 *     NaN), a NaN lse in every part (row NaN); with more than 256 parts of
 *     distinct layouts (several launches), a row with no live part in the
 *     first launch and one with none after it (the running state empty, or
 *     alone); the same NaN / -inf pattern as the CPU's is required exactly,
 *     besides the explicit checks of those rows (the rules are
 *     src/cuda/common/lse_combine.cuh's form (a));
 *   - lse NULL (o the same bits, the LSE buffer untouched); the call
 *     captured into a CUDA graph (replays give the eager call's bits; a
 *     call that needs the workspace before the context has one is
 *     UNSUPPORTED during capture, and captures once it exists);
 *   - outputs poisoned (0xFF: NaN) before every run;
 *   - refusals leave o and lse as they were: num_parts 0 and 1025, parts,
 *     o.data and a part's o.data / lse NULL, host pointers for o, lse and a
 *     part's o and lse, o overlapping a part, o e4m3, o misaligned.
 *
 * Tolerance.  The CPU engine computes each row in double and rounds once to
 * f32 (then to o's dtype); the CUDA engine computes the weights w_i =
 * exp(lse_i - M) and their sum L in double, rounds each w_i to f32 (relative
 * error u = 2^-24) and accumulates acc = sum_i w_i O_i by one f32 fmaf per
 * part, then o = acc * fl(1 / L).  With Mrow = max |O_i| over the row's
 * participating parts: each fmaf rounds a partial sum bounded by sum_i w_i
 * |O_i| <= L Mrow, so after the division the accumulation contributes at
 * most P u Mrow, the weights' rounding u Mrow, the reciprocal and the
 * product 2 u |o| <= 2 u Mrow; a call of several launches adds two
 * roundings a launch (the rescaling of the running sum), fewer than P.  So
 *   |o_cuda - o_cpu| <= (2 P + 8) u Mrow                  (f32 output)
 * and for 16-bit outputs the two results, that close before rounding, may
 * round to neighbouring values: one ulp more, <= 2 u_out |o| (u_out 2^-8
 * bf16, 2^-11 f16; f16 also 2^-24 absolute for its subnormals).  This is a
 * bound, not an estimate: the errors are random in sign, so the typical
 * (Frobenius) relative error of f32 outputs is ~u sqrt(P) (the i-th
 * partial sum's error ~u |acc_i| / sqrt(3)); f32 outputs are also checked
 * against 4 u (sqrt(P) + 2), ~2e-6 at 1024 parts, 2.6e-7 at 2: "about 1e-6
 * relative".  LSE: both compute M + log(L) in double and round once, so
 * within 4 f32 ulps (2^-21 |lse|).
 *
 * Inputs from the fixed seed of tu_seed (FATTN_TEST_SEED overrides).  Exit
 * 77 (ctest: skipped) without a Hopper GPU; with FATTN_REQUIRE_GPU=1, exit 1. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "fattn.h"
#include "gpu/gpu_testutil.h"

enum view_kind { V_PACKED, V_PADDED, V_BHSD, V_DISTINCT, V_SHARED };
enum { DT_ONE = 0, DT_MIXED = 1 };

struct mcase {
    const char *name;
    int batch, seqlen, heads, d, nparts;
    int dt_mode; /* DT_ONE: every part pdt; DT_MIXED: f32, f16, bf16 cycling */
    fattn_dtype pdt, odt;
    int pview, oview;
    int specials; /* -inf rows, NaN and +inf injections */
    int lse_null; /* run again with lse NULL */
    int graph;    /* 1: capture the call; 2: also the capture before the workspace exists (fresh context) */
};

/* A [B, S, H, D] tensor inside a buffer: strides and offset in elements, and
 * the buffer's length. */
struct view {
    int64_t sb, ss, sh, off;
    size_t n;
};

static view make_view(int kind, int i, int B, int S, int H, int D, int P) {
    view v;
    switch (kind) {
    case V_PADDED: /* heads 1 .. H of H + 2, 8 elements after each token, 24 after each batch */
        v.sh = D;
        v.ss = (int64_t)(H + 2) * D + 8;
        v.sb = S * v.ss + 24;
        v.off = D;
        break;
    case V_BHSD: /* rows D + 4 apart, 8 more after each head, 16 after each batch */
        v.ss = D + 4;
        v.sh = S * v.ss + 8;
        v.sb = H * v.sh + 16;
        v.off = 4;
        break;
    case V_DISTINCT: /* part i: its own token stride and offset (alignment 2 .. 16 bytes) */
        v.sh = D;
        v.ss = (int64_t)H * D + 8 + 2 * i;
        v.sb = S * v.ss + 16;
        v.off = i % 4;
        break;
    case V_SHARED: /* part i: heads i H .. (i + 1) H - 1 of one packed [B, S, H P, D] buffer */
        v.sh = D;
        v.ss = (int64_t)H * P * D;
        v.sb = S * v.ss;
        v.off = (int64_t)i * H * D;
        break;
    default:
        v.sh = D;
        v.ss = (int64_t)H * D;
        v.sb = S * v.ss;
        v.off = 0;
        break;
    }
    v.n = kind == V_SHARED ? (size_t)B * v.sb : (size_t)(v.off + B * v.sb);
    return v;
}

static const char *view_name(int v) {
    return v == V_PADDED ? "padded slices" : v == V_BHSD ? "padded BHSD" : v == V_DISTINCT ? "distinct layouts"
           : v == V_SHARED ? "head slices of one buffer" : "packed";
}

static int64_t elem_at(const view &v, int b, int s, int h) { return v.off + b * v.sb + s * v.ss + h * v.sh; }

/* Host and device copies of one buffer. */
struct dual {
    uint8_t *h, *d;
    size_t bytes;
};

static dual dual_alloc(size_t bytes) {
    dual x;
    x.bytes = bytes;
    x.h = (uint8_t *)tu_malloc(bytes ? bytes : 1);
    CK(cudaMalloc(&x.d, bytes ? bytes : 1));
    return x;
}
static void dual_free(dual *x) {
    free(x->h);
    cudaFree(x->d);
}
static void dual_push(const dual &x) { CK(cudaMemcpy(x.d, x.h, x.bytes, cudaMemcpyHostToDevice)); }

/* A case's data: the parts in one pool (each part at a 256-byte boundary
 * plus its view offset; the shared view in one region), their LSE in
 * another; args for the CPU (host pointers) and the CUDA context. */
struct mdata {
    mcase c;
    int rows;
    std::vector<fattn_dtype> dt;
    std::vector<view> pv;
    std::vector<size_t> region; /* byte offset of part i's buffer in the pool */
    dual pool, lse;
    view ov;
    dual out, out_lse; /* host: the CPU engine's output; device: the CUDA engine's */
    std::vector<fattn_merge_part> hparts, dparts;
    fattn_merge_args ha, da;
    int row_nan_lse, row_nan_o, elem_nan_o, row_pinf; /* -1: none */
    int row_all_nan;                /* every part's lse NaN */
    int row_head_empty, row_tail_empty; /* > 256 parts: parts [0, 256) all -inf; parts [256, P) all -inf */
};

static size_t esz(fattn_dtype d) { return fattn_dtype_size(d); }

/* Element e of row (b, s, h) of part i (host copy) as a double. */
static double part_elem(const mdata &m, int i, int b, int s, int h, int e) {
    double x;
    const uint8_t *base = m.pool.h + m.region[i];
    tu_from_dtype(base + (elem_at(m.pv[i], b, s, h) + e) * esz(m.dt[i]), 1, m.dt[i], &x);
    return x;
}

static void set_part_elem(mdata &m, int i, int b, int s, int h, int e, double x) {
    uint8_t *base = m.pool.h + m.region[i];
    tu_to_dtype(&x, 1, m.dt[i], base + (elem_at(m.pv[i], b, s, h) + e) * esz(m.dt[i]));
}

static float *part_lse_h(mdata &m, int i) { return (float *)m.lse.h + (size_t)i * m.rows; }

static void mdata_make(mdata &m, const mcase &c, tu_rng *rng) {
    m.c = c;
    const int B = c.batch, S = c.seqlen, H = c.heads, D = c.d, P = c.nparts;
    m.rows = B * H * S;
    static const fattn_dtype cyc[3] = {FATTN_DTYPE_F32, FATTN_DTYPE_F16, FATTN_DTYPE_BF16};
    size_t bytes = 0;
    for (int i = 0; i < P; ++i) {
        m.dt.push_back(c.dt_mode == DT_MIXED ? cyc[i % 3] : c.pdt);
        m.pv.push_back(make_view(c.pview, i, B, S, H, D, P));
        if (c.pview == V_SHARED) {
            m.region.push_back(0);
            bytes = m.pv[i].n * esz(m.dt[i]);
        } else {
            m.region.push_back(bytes);
            bytes += (m.pv[i].n * esz(m.dt[i]) + 255) / 256 * 256;
        }
    }
    m.pool = dual_alloc(bytes);
    memset(m.pool.h, 0xFF, bytes); /* NaN: a read outside a view, or of a -inf part's row, shows */
    m.lse = dual_alloc((size_t)P * m.rows * 4);

    /* LSE: a row base, a spread, now and then 150 below (the weight
     * underflows in f32 and double alike: still taking part); -inf for a
     * quarter of the (row, part) pairs and every part of every 11th row */
    for (int q = 0; q < m.rows; ++q) {
        const double base = 6 * tu_rng_uniform(rng) - 3 + (q % 7 == 3 ? 60 : 0);
        for (int i = 0; i < P; ++i) {
            double l = base + 2 * tu_rng_normal(rng);
            if (tu_rng_uniform(rng) < 0.05) l -= 150;
            if (c.specials && (q % 11 == 5 || tu_rng_uniform(rng) < 0.25)) l = -INFINITY;
            part_lse_h(m, i)[q] = (float)l;
        }
    }
    /* O: N(0, 1) in the views, except rows whose lse is -inf (left NaN) */
    for (int i = 0; i < P; ++i)
        for (int b = 0; b < B; ++b)
            for (int h = 0; h < H; ++h)
                for (int s = 0; s < S; ++s) {
                    const int q = (b * H + h) * S + s;
                    if (part_lse_h(m, i)[q] == -INFINITY) continue;
                    for (int e = 0; e < D; ++e) set_part_elem(m, i, b, s, h, e, tu_rng_normal(rng));
                }
    /* NaN and +inf injections on rows with a participating part */
    m.row_nan_lse = m.row_nan_o = m.elem_nan_o = m.row_pinf = -1;
    if (c.specials) {
        int found = 0;
        for (int q = 0; q < m.rows && found < 3; ++q) {
            int live = -1;
            for (int i = 0; i < P && live < 0; ++i)
                if (part_lse_h(m, i)[q] != -INFINITY) live = i;
            if (live < 0) continue;
            const int s = q % S, h = q / S % H, b = q / S / H;
            if (found == 0) {
                m.row_nan_lse = q;
                part_lse_h(m, live)[q] = NAN;
            } else if (found == 1) {
                m.row_nan_o = q;
                m.elem_nan_o = D / 2;
                set_part_elem(m, live, b, s, h, D / 2, NAN);
            } else {
                m.row_pinf = q;
                part_lse_h(m, live)[q] = INFINITY;
            }
            ++found;
        }
    }
    /* rows from the end that no injection above took and that are not the
     * all -inf rows: every part's lse NaN (the max over live parts stays
     * -inf, each weight exp(NaN + inf) is NaN); with more than 256 parts
     * (distinct layouts: launches of 256), a row whose first launch has no
     * live part (its state carries l = 0 and is not live) and a row whose
     * later launches have none (the state alone reaches o) */
    m.row_all_nan = m.row_head_empty = m.row_tail_empty = -1;
    if (c.specials) {
        auto taken = [&](int q) {
            return q % 11 == 5 || q == m.row_nan_lse || q == m.row_nan_o || q == m.row_pinf || q == m.row_all_nan ||
                   q == m.row_head_empty || q == m.row_tail_empty;
        };
        auto live_in = [&](int q, int i0, int i1) {
            for (int i = i0; i < i1; ++i)
                if (part_lse_h(m, i)[q] != -INFINITY) return true;
            return false;
        };
        for (int q = m.rows - 1; q >= 0 && m.row_all_nan < 0; --q)
            if (!taken(q)) {
                m.row_all_nan = q;
                for (int i = 0; i < P; ++i) part_lse_h(m, i)[q] = NAN;
            }
        if (P > 256) {
            for (int q = m.rows - 1; q >= 0 && m.row_head_empty < 0; --q)
                if (!taken(q) && live_in(q, 256, P)) {
                    m.row_head_empty = q;
                    for (int i = 0; i < 256; ++i) part_lse_h(m, i)[q] = -INFINITY;
                }
            for (int q = m.rows - 1; q >= 0 && m.row_tail_empty < 0; --q)
                if (!taken(q) && live_in(q, 0, 256)) {
                    m.row_tail_empty = q;
                    for (int i = 256; i < P; ++i) part_lse_h(m, i)[q] = -INFINITY;
                }
        }
    }
    dual_push(m.pool);
    dual_push(m.lse);

    m.ov = make_view(c.oview, 0, B, S, H, D, 1);
    m.out = dual_alloc(m.ov.n * esz(c.odt));
    m.out_lse = dual_alloc((size_t)m.rows * 4);
    m.hparts.resize(P);
    m.dparts.resize(P);
    for (int i = 0; i < P; ++i) {
        const view &v = m.pv[i];
        const fattn_tensor th = {m.pool.h + m.region[i] + v.off * esz(m.dt[i]), m.dt[i], v.sb, v.ss, v.sh, NULL, 0};
        fattn_tensor td = th;
        td.data = m.pool.d + m.region[i] + v.off * esz(m.dt[i]);
        m.hparts[i].o = th;
        m.hparts[i].lse = part_lse_h(m, i);
        m.dparts[i].o = td;
        m.dparts[i].lse = (const float *)m.lse.d + (size_t)i * m.rows;
    }
    memset(&m.ha, 0, sizeof m.ha);
    m.ha.batch = B, m.ha.seqlen = S, m.ha.heads = H, m.ha.head_dim = D, m.ha.num_parts = P;
    m.da = m.ha;
    m.ha.parts = m.hparts.data();
    m.da.parts = m.dparts.data();
    const fattn_tensor oh = {m.out.h + m.ov.off * esz(c.odt), c.odt, m.ov.sb, m.ov.ss, m.ov.sh, NULL, 0};
    fattn_tensor od = oh;
    od.data = m.out.d + m.ov.off * esz(c.odt);
    m.ha.o = oh, m.da.o = od;
    m.ha.lse = (float *)m.out_lse.h;
    m.da.lse = (float *)m.out_lse.d;
}

static void mdata_free(mdata &m) {
    dual_free(&m.pool);
    dual_free(&m.lse);
    dual_free(&m.out);
    dual_free(&m.out_lse);
}

static void poison_device(const mdata &m) {
    CK(cudaMemset(m.out.d, 0xFF, m.out.bytes));
    CK(cudaMemset(m.out_lse.d, 0xFF, m.out_lse.bytes));
    CK(cudaDeviceSynchronize());
}

/* The CUDA engine's output (got, got_lse: host copies of the device buffers)
 * against the CPU's (m.out.h, m.out_lse.h), as the header comment says.
 * Returns the number of failures counted. */
static int compare(const mdata &m, const uint8_t *got, const float *got_lse, int with_lse, const char *what) {
    const mcase &c = m.c;
    const int B = c.batch, S = c.seqlen, H = c.heads, D = c.d, P = c.nparts;
    const double u = 0x1p-24;
    const double u_out = c.odt == FATTN_DTYPE_BF16 ? 0x1p-8 : c.odt == FATTN_DTYPE_F16 ? 0x1p-11 : 0x1p-24;
    const double floor_abs = c.odt == FATTN_DTYPE_F16 ? 0x1p-24 : 1e-37;
    const size_t oz = esz(c.odt);
    const int before = tu_failures;
    double worst = 0, fro_num = 0, fro_den = 0, lse_worst = 0;
    size_t kind_bad = 0, lse_kind_bad = 0, zero_rows = 0, zero_bad = 0;
    std::vector<double> ref(D), g(D);
    for (int b = 0; b < B; ++b)
        for (int h = 0; h < H; ++h)
            for (int s = 0; s < S; ++s) {
                const int q = (b * H + h) * S + s;
                double mrow = 0;
                int live = 0;
                for (int i = 0; i < P; ++i) {
                    if (m.hparts[i].lse[q] == -INFINITY) continue;
                    ++live;
                    for (int e = 0; e < D; ++e) {
                        const double x = fabs(part_elem(m, i, b, s, h, e));
                        if (isfinite(x) && x > mrow) mrow = x;
                    }
                }
                const int64_t off = elem_at(m.ov, b, s, h);
                tu_from_dtype(m.out.h + off * oz, (size_t)D, c.odt, ref.data());
                tu_from_dtype(got + off * oz, (size_t)D, c.odt, g.data());
                const double delta = (2.0 * P + 8) * u * mrow;
                int row_finite = 1;
                for (int e = 0; e < D; ++e) {
                    if (isnan(ref[e]) || isnan(g[e])) {
                        kind_bad += isnan(ref[e]) != isnan(g[e]);
                        row_finite = 0;
                        continue;
                    }
                    const double tol = delta + 2 * u_out * (fabs(ref[e]) + delta) + floor_abs;
                    const double err = fabs(g[e] - ref[e]);
                    if (!(err <= tol)) kind_bad += !isfinite(err);
                    if (err / tol > worst) worst = err / tol;
                }
                if (row_finite)
                    for (int e = 0; e < D; ++e) fro_num += (g[e] - ref[e]) * (g[e] - ref[e]), fro_den += ref[e] * ref[e];
                if (live == 0) {
                    ++zero_rows;
                    for (int e = 0; e < D; ++e) zero_bad += g[e] != 0.0;
                }
                if (!with_lse) continue;
                const float rl = m.out_lse.h ? ((const float *)m.out_lse.h)[q] : 0.0f, gl = got_lse[q];
                if (isnan(rl) || isinf(rl) || isnan(gl) || isinf(gl)) {
                    lse_kind_bad += !(isnan(rl) && isnan(gl)) && rl != gl;
                } else {
                    const double e = fabs((double)gl - rl) / (0x1p-21 * fabs((double)rl) + 1e-30);
                    if (e > lse_worst) lse_worst = e;
                }
            }
    char line[384];
    TU_CHECK(kind_bad == 0, "%s: %zu elements NaN on one engine and not the other (or not finite)", what, kind_bad);
    TU_CHECK(zero_bad == 0, "%s: %zu elements of the %zu rows with no part are not 0", what, zero_bad, zero_rows);
    snprintf(line, sizeof line, "%s: O max |cuda - cpu| / bound ((2P+8) u Mrow + ulp of o)", what);
    TU_EXPECT_LE(worst, 1.0, line);
    const double fro = fro_den > 0 ? sqrt(fro_num / fro_den) : sqrt(fro_num);
    if (c.odt == FATTN_DTYPE_F32) {
        snprintf(line, sizeof line, "%s: O Frobenius rel err, bound 4u(sqrt P + 2)", what);
        TU_EXPECT_LE(fro, 4 * u * (sqrt((double)P) + 2), line);
    } else {
        printf("  %s: O Frobenius rel err %.3g (the %s rounding: ~%.2g)\n", what, fro, fattn_dtype_name(c.odt),
               u_out / sqrt(3.0));
    }
    if (with_lse) {
        TU_CHECK(lse_kind_bad == 0, "%s: %zu LSE entries differ in kind (-inf / NaN / finite)", what, lse_kind_bad);
        snprintf(line, sizeof line, "%s: LSE max |cuda - cpu| / (2^-21 |lse|)", what);
        TU_EXPECT_LE(lse_worst, 1.0, line);
    }
    /* the injected rows, independently of the CPU */
    auto row_of = [&](int q, std::vector<double> &x) {
        const int s = q % S, h = q / S % H, b = q / S / H;
        tu_from_dtype(got + elem_at(m.ov, b, s, h) * oz, (size_t)D, c.odt, x.data());
    };
    if (m.row_nan_lse >= 0) {
        row_of(m.row_nan_lse, g);
        int n = 0;
        for (int e = 0; e < D; ++e) n += isnan(g[e]) != 0;
        TU_CHECK(n == D && (!with_lse || isnan(got_lse[m.row_nan_lse])), "%s: a NaN lse left %d of %d elements NaN%s",
                 what, n, D, with_lse && !isnan(got_lse[m.row_nan_lse]) ? " and the row's lse not NaN" : "");
    }
    if (m.row_nan_o >= 0) {
        row_of(m.row_nan_o, g);
        int fin = 0;
        for (int e = 0; e < D; ++e) fin += isfinite(g[e]) != 0;
        TU_CHECK(isnan(g[m.elem_nan_o]) && fin == D - 1 && (!with_lse || isfinite(got_lse[m.row_nan_o])),
                 "%s: a NaN in a participating O: %d of %d elements finite, lse %g", what, fin, D,
                 with_lse ? (double)got_lse[m.row_nan_o] : 0.0);
    }
    if (m.row_pinf >= 0) {
        row_of(m.row_pinf, g);
        int n = 0;
        for (int e = 0; e < D; ++e) n += isnan(g[e]) != 0;
        TU_CHECK(n == D, "%s: an lse of +inf left %d of %d elements NaN", what, n, D);
    }
    if (m.row_all_nan >= 0) {
        row_of(m.row_all_nan, g);
        int n = 0;
        for (int e = 0; e < D; ++e) n += isnan(g[e]) != 0;
        TU_CHECK(n == D && (!with_lse || isnan(got_lse[m.row_all_nan])),
                 "%s: NaN lse in every part left %d of %d elements NaN%s", what, n, D,
                 with_lse && !isnan(got_lse[m.row_all_nan]) ? " and the row's lse not NaN" : "");
    }
    for (int q : {m.row_head_empty, m.row_tail_empty}) {
        if (q < 0) continue;
        row_of(q, g);
        int fin = 0;
        for (int e = 0; e < D; ++e) fin += isfinite(g[e]) != 0;
        TU_CHECK(fin == D && (!with_lse || isfinite(got_lse[q])),
                 "%s: a row with no live part in %s 256 parts: %d of %d elements finite, lse %g", what,
                 q == m.row_head_empty ? "the first" : "all but the first", fin, D,
                 with_lse ? (double)got_lse[q] : 0.0);
    }
    printf("  [%s] %s: worst error %.3g of the bound, Frobenius %.3g, %zu rows with no part\n",
           tu_failures == before ? "ok" : "FAIL", what, worst, fro, zero_rows);
    fflush(stdout);
    return tu_failures - before;
}

/* The device output, and the check that nothing outside o's view changed. */
static std::vector<uint8_t> fetch_out(const mdata &m, const char *what) {
    std::vector<uint8_t> got(m.out.bytes);
    CK(cudaMemcpy(got.data(), m.out.d, m.out.bytes, cudaMemcpyDeviceToHost));
    std::vector<uint8_t> outside = got;
    const size_t oz = esz(m.c.odt);
    for (int b = 0; b < m.c.batch; ++b)
        for (int s = 0; s < m.c.seqlen; ++s)
            for (int h = 0; h < m.c.heads; ++h)
                memset(outside.data() + elem_at(m.ov, b, s, h) * oz, 0xFF, (size_t)m.c.d * oz);
    size_t n = 0;
    for (size_t i = 0; i < outside.size(); ++i) n += outside[i] != 0xFF;
    TU_CHECK(n == 0, "%s: %zu bytes written outside o's view", what, n);
    return got;
}

static std::vector<float> fetch_lse(const mdata &m) {
    std::vector<float> l((size_t)m.rows);
    CK(cudaMemcpy(l.data(), m.out_lse.d, (size_t)m.rows * 4, cudaMemcpyDeviceToHost));
    return l;
}

/* bitwise (NaN rows compare equal to themselves) */
static bool same_bits(const std::vector<float> &x, const std::vector<float> &y) {
    return x.size() == y.size() && memcmp(x.data(), y.data(), x.size() * 4) == 0;
}

/* The call captured into a graph on a fresh non-blocking stream, replayed
 * twice: o and lse must be the eager call's bits. */
static void graph_replay(fattn_ctx *ctx, const mdata &m, const std::vector<uint8_t> &eo,
                         const std::vector<float> &el, const char *what) {
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    TU_CHECK(fattn_ctx_set_stream(ctx, st) == FATTN_OK, "%s: set_stream: %s", what, fattn_last_error(ctx));
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    const fattn_status fs = fattn_merge(ctx, &m.da);
    cudaError_t e = cudaStreamEndCapture(st, &graph);
    TU_CHECK(fs == FATTN_OK, "%s: call during capture: %s: %s", what, fattn_status_string(fs), fattn_last_error(ctx));
    TU_CHECK(e == cudaSuccess, "%s: end capture: %s", what, cudaGetErrorString(e));
    int ok = fs == FATTN_OK && e == cudaSuccess;
    if (ok) {
        e = cudaGraphInstantiate(&exec, graph, 0);
        TU_CHECK(e == cudaSuccess, "%s: instantiate: %s", what, cudaGetErrorString(e));
        ok = e == cudaSuccess;
    }
    for (int r = 0; ok && r < 2; ++r) {
        poison_device(m);
        e = cudaGraphLaunch(exec, st);
        if (e == cudaSuccess) e = cudaStreamSynchronize(st);
        TU_CHECK(e == cudaSuccess, "%s: replay %d: %s", what, r, cudaGetErrorString(e));
        ok = e == cudaSuccess;
        if (!ok) break;
        const int same = fetch_out(m, what) == eo && same_bits(fetch_lse(m), el);
        TU_CHECK(same, "%s: replay %d differs from the eager call", what, r);
        ok = same;
    }
    printf("  [%s] %s: captured into a CUDA graph, two replays: the eager call's bits\n", ok ? "ok" : "FAIL", what);
    (void)cudaGetLastError();
    fattn_ctx_set_stream(ctx, NULL);
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
}

/* A fresh context (no workspace yet): the several-launch call is
 * UNSUPPORTED while captured, with o untouched; after one eager call it
 * captures and replays to the eager bits. */
static void graph_first_capture(const mdata &m, const std::vector<uint8_t> &eo, const std::vector<float> &el,
                                const char *what) {
    fattn_ctx *ctx = gpu_ctx_any_engine_or_skip();
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    fattn_ctx_set_stream(ctx, st);
    poison_device(m);
    cudaGraph_t graph = NULL;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    const fattn_status fs = fattn_merge(ctx, &m.da);
    const cudaError_t e = cudaStreamEndCapture(st, &graph);
    const char *msg = fattn_last_error(ctx);
    const int ok = fs == FATTN_ERROR_UNSUPPORTED && strstr(msg, "captured") != NULL && e == cudaSuccess;
    TU_CHECK(ok, "%s: first capture: status %d (want UNSUPPORTED), \"%s\", end capture %s", what, (int)fs, msg,
             cudaGetErrorString(e));
    if (graph) cudaGraphDestroy(graph);
    std::vector<uint8_t> untouched(m.out.bytes, 0xFF);
    std::vector<uint8_t> now(m.out.bytes);
    CK(cudaMemcpy(now.data(), m.out.d, m.out.bytes, cudaMemcpyDeviceToHost));
    TU_CHECK(now == untouched, "%s: the refused captured call wrote o", what);
    printf("  [%s] %s: captured before the context has a workspace: UNSUPPORTED (\"%s\")\n", ok ? "ok" : "FAIL",
           what, msg);
    fattn_ctx_set_stream(ctx, NULL);
    cudaStreamDestroy(st);
    poison_device(m);
    const fattn_status fe = fattn_merge(ctx, &m.da);
    TU_CHECK(fe == FATTN_OK && cudaDeviceSynchronize() == cudaSuccess, "%s: eager call: %s", what,
             fattn_last_error(ctx));
    TU_CHECK(fetch_out(m, what) == eo && same_bits(fetch_lse(m), el), "%s: a second context gives other bits", what);
    graph_replay(ctx, m, eo, el, what);
    fattn_ctx_free(ctx);
}

static void run_case(fattn_ctx *ctx, fattn_ctx *cpu, tu_rng *rng, const mcase &c) {
    char what[256];
    snprintf(what, sizeof what, "%s: %d x [%d, %d, %d, %d] %s (%s) -> %s (%s)", c.name, c.nparts, c.batch, c.seqlen,
             c.heads, c.d, c.dt_mode == DT_MIXED ? "f32/f16/bf16" : fattn_dtype_name(c.pdt), view_name(c.pview),
             fattn_dtype_name(c.odt), view_name(c.oview));
    printf("%s\n", what);
    fflush(stdout);
    mdata m;
    mdata_make(m, c, rng);

    memset(m.out.h, 0xFF, m.out.bytes);
    memset(m.out_lse.h, 0xFF, m.out_lse.bytes);
    fattn_status st = fattn_merge(cpu, &m.ha);
    TU_CHECK(st == FATTN_OK, "%s: CPU fattn_merge: %s", what, fattn_last_error(cpu));

    poison_device(m);
    st = fattn_merge(ctx, &m.da);
    TU_CHECK(st == FATTN_OK, "%s: fattn_merge: %s: %s", what, fattn_status_string(st), fattn_last_error(ctx));
    const cudaError_t e = cudaDeviceSynchronize();
    TU_CHECK(e == cudaSuccess, "%s: kernel failed: %s", what, cudaGetErrorString(e));
    if (e != cudaSuccess) exit(1);
    const std::vector<uint8_t> got = fetch_out(m, what);
    const std::vector<float> got_lse = fetch_lse(m);
    compare(m, got.data(), got_lse.data(), 1, what);

    if (c.lse_null) {
        poison_device(m);
        fattn_merge_args a = m.da;
        a.lse = NULL;
        st = fattn_merge(ctx, &a);
        TU_CHECK(st == FATTN_OK && cudaDeviceSynchronize() == cudaSuccess, "%s: lse NULL: %s", what,
                 fattn_last_error(ctx));
        const int same = fetch_out(m, what) == got;
        const std::vector<float> l = fetch_lse(m);
        size_t written = 0;
        for (float x : l) {
            uint32_t bits;
            memcpy(&bits, &x, 4);
            written += bits != 0xFFFFFFFFu;
        }
        TU_CHECK(same, "%s: o with lse NULL differs from o with lse", what);
        TU_CHECK(written == 0, "%s: lse NULL, yet %zu entries of the LSE buffer written", what, written);
        printf("  [%s] lse NULL: o the same bits, LSE buffer untouched\n", same && !written ? "ok" : "FAIL");
    }
    if (c.graph) graph_replay(ctx, m, got, got_lse, what);
    if (c.graph == 2) graph_first_capture(m, got, got_lse, what);
    mdata_free(m);
}

/* ---- refusals -------------------------------------------------------------- */

enum { RB = 1, RS = 16, RH = 2, RD = 64 };
#define RN ((size_t)RB * RS * RH * RD)
#define RL ((size_t)RB * RH * RS)

struct rbufs {
    uint16_t *o, *p[2];
    float *lse, *plse[2];
    uint8_t *host; /* host memory of the same sizes, for the host-pointer cases */
};

static void refuse(fattn_ctx *ctx, const rbufs &r, const fattn_merge_args &a, fattn_status want,
                   const char *needle1, const char *needle2, const char *what) {
    static uint8_t sentinel[RN * 2];
    for (size_t i = 0; i < sizeof sentinel; ++i) sentinel[i] = (uint8_t)(0xA5 ^ i);
    CK(cudaMemcpy(r.o, sentinel, RN * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(r.lse, sentinel, RL * 4, cudaMemcpyHostToDevice));
    memcpy(r.host, sentinel, RN * 2);
    const fattn_status st = fattn_merge(ctx, &a);
    CK(cudaDeviceSynchronize());
    const char *msg = fattn_last_error(ctx);
    static uint8_t back[RN * 2];
    CK(cudaMemcpy(back, r.o, RN * 2, cudaMemcpyDeviceToHost));
    int untouched = memcmp(back, sentinel, RN * 2) == 0;
    CK(cudaMemcpy(back, r.lse, RL * 4, cudaMemcpyDeviceToHost));
    untouched = untouched && memcmp(back, sentinel, RL * 4) == 0 && memcmp(r.host, sentinel, RN * 2) == 0;
    const int ok = st == want && strstr(msg, needle1) && (!needle2 || strstr(msg, needle2)) && untouched;
    if (!ok) tu_failures++;
    printf("  [%s] %s: status %d (want %d), \"%s\"%s\n", ok ? "ok" : "FAIL", what, (int)st, (int)want, msg,
           untouched ? "" : ", OUTPUT WRITTEN");
}

static void refusals(fattn_ctx *ctx) {
    printf("refusals\n");
    rbufs r;
    CK(cudaMalloc(&r.o, RN * 2 + 16));
    CK(cudaMalloc(&r.lse, RL * 4));
    for (int i = 0; i < 2; ++i) {
        CK(cudaMalloc(&r.p[i], RN * 2));
        CK(cudaMalloc(&r.plse[i], RL * 4));
        CK(cudaMemset(r.p[i], 0, RN * 2));
        CK(cudaMemset(r.plse[i], 0, RL * 4));
    }
    r.host = (uint8_t *)tu_malloc(RN * 2 + RL * 4);
    fattn_merge_part parts[2];
    for (int i = 0; i < 2; ++i) {
        parts[i].o = fattn_tensor_bshd(r.p[i], FATTN_DTYPE_BF16);
        parts[i].lse = r.plse[i];
    }
    fattn_merge_args good;
    memset(&good, 0, sizeof good);
    good.batch = RB, good.seqlen = RS, good.heads = RH, good.head_dim = RD, good.num_parts = 2, good.parts = parts;
    good.o = fattn_tensor_bshd(r.o, FATTN_DTYPE_BF16);
    good.lse = r.lse;
    const fattn_status INV = FATTN_ERROR_INVALID_ARGUMENT;
    fattn_merge_args a;
    fattn_merge_part pp[2];

    a = good, a.num_parts = 0;
    refuse(ctx, r, a, INV, "num_parts", NULL, "num_parts 0");
    a = good, a.num_parts = FATTN_MERGE_MAX_PARTS + 1;
    refuse(ctx, r, a, INV, "num_parts", NULL, "num_parts 1025");
    a = good, a.parts = NULL;
    refuse(ctx, r, a, INV, "parts is NULL", NULL, "parts NULL");
    a = good, a.o.data = NULL;
    refuse(ctx, r, a, INV, "o.data is NULL", NULL, "o.data NULL");
    memcpy(pp, parts, sizeof pp), a = good, a.parts = pp, pp[1].o.data = NULL;
    refuse(ctx, r, a, INV, "parts[1].o.data is NULL", NULL, "parts[1].o.data NULL");
    memcpy(pp, parts, sizeof pp), a = good, a.parts = pp, pp[0].lse = NULL;
    refuse(ctx, r, a, INV, "parts[0].lse is NULL", NULL, "parts[0].lse NULL");
    a = good, a.o.data = r.host;
    refuse(ctx, r, a, INV, "o.data (", "not device memory", "host pointer for o");
    a = good, a.lse = (float *)(r.host + RN * 2);
    refuse(ctx, r, a, INV, "lse (", "not device memory", "host pointer for lse");
    memcpy(pp, parts, sizeof pp), a = good, a.parts = pp, pp[1].o.data = r.host;
    refuse(ctx, r, a, INV, "parts[1].o.data (", "not device memory", "host pointer for parts[1].o");
    memcpy(pp, parts, sizeof pp), a = good, a.parts = pp, pp[0].lse = (const float *)(r.host + RN * 2);
    refuse(ctx, r, a, INV, "parts[0].lse (", "not device memory", "host pointer for parts[0].lse");
    memcpy(pp, parts, sizeof pp), a = good, a.parts = pp, pp[0].o.data = r.o;
    refuse(ctx, r, a, INV, "overlaps", NULL, "o on parts[0].o");
    a = good, a.o.dtype = FATTN_DTYPE_E4M3;
    refuse(ctx, r, a, INV, "e4m3", NULL, "o e4m3");
    a = good, a.o.data = (uint8_t *)r.o + 1;
    refuse(ctx, r, a, INV, "aligned", NULL, "o misaligned");
    /* and the arguments as they were run: equal parts of O = 0, lse 0 -> o 0, lse log 2 */
    CK(cudaMemset(r.o, 0xFF, RN * 2));
    const fattn_status st = fattn_merge(ctx, &good);
    std::vector<uint16_t> o(RN);
    std::vector<float> l(RL);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(o.data(), r.o, RN * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(l.data(), r.lse, RL * 4, cudaMemcpyDeviceToHost));
    int ok = st == FATTN_OK;
    for (size_t i = 0; i < RN; ++i) ok = ok && o[i] == 0;
    for (size_t i = 0; i < RL; ++i) ok = ok && fabsf(l[i] - logf(2.0f)) < 1e-6f;
    TU_CHECK(ok, "the valid call: %s", fattn_last_error(ctx));
    printf("  [%s] the same arguments, corrected, run (o 0, lse log 2)\n", ok ? "ok" : "FAIL");
    cudaFree(r.o);
    cudaFree(r.lse);
    for (int i = 0; i < 2; ++i) cudaFree(r.p[i]), cudaFree(r.plse[i]);
    free(r.host);
}

int main(void) {
    fattn_ctx *ctx = gpu_ctx_any_engine_or_skip();
    fattn_ctx *cpu = gpu_cpu_ctx();
    tu_rng rng;
    tu_rng_init(&rng, (uint64_t)tu_seed());
    const fattn_dtype F32 = FATTN_DTYPE_F32, F16 = FATTN_DTYPE_F16, B16 = FATTN_DTYPE_BF16;
    const mcase cases[] = {
        {"one part", 2, 33, 4, 128, 1, DT_ONE, B16, B16, V_PACKED, V_PACKED, 1, 1, 0},
        {"two parts", 1, 64, 3, 64, 2, DT_ONE, F32, F32, V_PACKED, V_PACKED, 1, 0, 0},
        {"large rows", 2, 2048, 8, 64, 2, DT_ONE, B16, B16, V_PACKED, V_PACKED, 1, 0, 1},
        {"seven parts", 2, 40, 3, 128, 7, DT_MIXED, F32, B16, V_PADDED, V_PADDED, 1, 1, 1},
        {"seven parts", 1, 50, 2, 256, 7, DT_MIXED, F32, F16, V_BHSD, V_BHSD, 1, 0, 0},
        {"seven parts", 2, 30, 2, 40, 7, DT_ONE, F16, F32, V_PACKED, V_PADDED, 1, 0, 0},
        {"odd head dim", 1, 45, 3, 37, 3, DT_ONE, B16, B16, V_PACKED, V_PACKED, 1, 1, 0},
        {"odd head dim", 1, 21, 3, 37, 3, DT_MIXED, F32, F32, V_BHSD, V_PADDED, 1, 0, 0},
        {"head dim 1", 1, 70, 2, 1, 5, DT_MIXED, F32, F32, V_PACKED, V_PACKED, 1, 0, 0},
        {"head dim 300", 1, 20, 2, 300, 3, DT_ONE, B16, B16, V_PADDED, V_PADDED, 1, 0, 0},
        {"shared buffer", 1, 64, 4, 128, 8, DT_ONE, B16, B16, V_SHARED, V_PACKED, 1, 1, 0},
        {"300 parts", 1, 20, 2, 64, 300, DT_ONE, B16, B16, V_SHARED, V_PACKED, 1, 0, 1},
        {"300 parts", 1, 16, 2, 40, 300, DT_MIXED, F32, F32, V_DISTINCT, V_PACKED, 1, 0, 2},
        {"1024 parts", 1, 12, 2, 64, 1024, DT_ONE, F32, B16, V_SHARED, V_PACKED, 1, 0, 1},
        {"1024 parts", 1, 8, 2, 16, 1024, DT_MIXED, F32, F16, V_DISTINCT, V_BHSD, 1, 1, 0},
        /* 256 layouts, then 24 parts: the small instance continuing the running sums */
        {"280 parts", 2, 5, 3, 24, 280, DT_MIXED, F32, B16, V_DISTINCT, V_PACKED, 1, 0, 0},
    };
    for (const mcase &c : cases) run_case(ctx, cpu, &rng, c);
    refusals(ctx);
    fattn_ctx_free(cpu);
    fattn_ctx_free(ctx);
    return tu_finish("gpu merge");
}
