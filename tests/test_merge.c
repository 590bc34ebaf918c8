/* test_merge.c - fattn_merge on a CPU context: the keys of a random problem
 * split into 2-4 ranges (plus empty parts: lse -inf and O poisoned with NaN,
 * since fattn_fwd refuses seqlen_k 0), fattn_fwd on each range, merged, against
 * fattn_fwd over all keys; causal splits where some parts see no key of some
 * rows; mixed part dtypes (allowed) and strided layouts; NaN propagation; the
 * same bits for any thread count; bad arguments write nothing.
 *
 * Tolerance: both sides are f32 attention (a few ulps relative: 4e-6 absolute
 * is 8 ulps of |O| <= 4, lse 2e-6 relative), and the merge is a convex combination of the
 * parts, so rounding the parts to f16/bf16 moves O by at most u_part * max|O|
 * and rounding the output by u_out * max|O| (u = 2^-11 for f16, 2^-8 bf16). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/testutil.h"
#include "fattn.h"
#include "internal.h" /* struct fattn_ctx, for a CUDA context faked without a GPU */

enum { MAXP = 6 };

typedef struct mcase {
    const char *name;
    int batch, sq, sk, hq, hkv, d, causal;
    int ncuts;           /* ranges = ncuts + 1 */
    int cuts[4];         /* increasing key indices in (0, sk) */
    int empty_at;        /* insert an empty part before range empty_at (-1: none) */
    fattn_dtype part_dt[MAXP], out_dt;
    int bhsd;            /* parts and output in BHSD layout */
} mcase;

static double unit(fattn_dtype dt) {
    return dt == FATTN_DTYPE_F16 ? 0x1p-11 : dt == FATTN_DTYPE_BF16 ? 0x1p-8 : 0.0;
}

/* fattn_fwd (f32) over keys [k0, k1) of q/k/v (packed BSHD f32) into o_part
 * (packed BSHD f32) and lse_part [b, h, sq].  Causal: the full problem's mask
 * (bottom-right aligned on all sk keys) restricted to the range is causal on
 * rows [0, r1) with r1 = sq - (sk - k1) and sees the whole range below. */
static void fwd_range(fattn_ctx *ctx, const mcase *c, const float *q, const float *k,
                      const float *v, int k0, int k1, float *o_part, float *lse_part) {
    const int64_t qs = (int64_t)c->hq * c->d, ks = (int64_t)c->hkv * c->d;
    int r1 = c->causal ? c->sq - (c->sk - k1) : 0;
    if (r1 < 0) r1 = 0;
    float *lt = (float *)tu_malloc(sizeof(float) * (size_t)c->batch * c->hq * c->sq);
    for (int pass = 0; pass < 2; pass++) {
        const int r0 = pass == 0 ? 0 : r1, rn = pass == 0 ? r1 : c->sq - r1;
        if (rn <= 0) continue;
        fattn_fwd_args a;
        memset(&a, 0, sizeof a);
        a.p = tu_problem(c->batch, rn, k1 - k0, c->hq, c->hkv, c->d, 0, pass == 0, NULL, NULL);
        a.p.softmax_scale = (float)(1.0 / sqrt((double)c->d));
        fattn_tensor tq = {(void *)(q + r0 * qs), FATTN_DTYPE_F32, c->sq * qs, qs, c->d, NULL, 0};
        fattn_tensor tk = {(void *)(k + k0 * ks), FATTN_DTYPE_F32, c->sk * ks, ks, c->d, NULL, 0};
        fattn_tensor tv = tk;
        tv.data = (void *)(v + k0 * ks);
        fattn_tensor to = tq;
        to.data = o_part + r0 * qs;
        a.q = tq, a.k = tk, a.v = tv, a.o = to, a.lse = lt;
        TU_EXPECT_OK(fattn_fwd(ctx, &a));
        for (int bh = 0; bh < c->batch * c->hq; bh++)
            for (int s = 0; s < rn; s++) lse_part[(int64_t)bh * c->sq + r0 + s] = lt[(int64_t)bh * rn + s];
    }
    free(lt);
}

typedef struct parts_buf {
    int n;
    fattn_merge_part p[MAXP];
    void *odata[MAXP];
    float *lse[MAXP];
} parts_buf;

/* Strides of a [b, s, h, d] tensor: 0 (packed BSHD) or BHSD. */
static void set_layout(fattn_tensor *t, const mcase *c) {
    if (!c->bhsd) return;
    t->stride_batch = (int64_t)c->hq * c->sq * c->d;
    t->stride_head = (int64_t)c->sq * c->d;
    t->stride_seq = c->d;
}

/* packed BSHD f32 x -> t's layout and dtype */
static void put(const mcase *c, const float *x, fattn_tensor *t) {
    for (int b = 0; b < c->batch; b++)
        for (int s = 0; s < c->sq; s++)
            for (int h = 0; h < c->hq; h++) {
                const float *src = x + (((int64_t)b * c->sq + s) * c->hq + h) * c->d;
                int64_t off = c->bhsd ? (((int64_t)b * c->hq + h) * c->sq + s) * c->d
                                      : (((int64_t)b * c->sq + s) * c->hq + h) * c->d;
                double tmp[512];
                for (int i = 0; i < c->d; i++) tmp[i] = src[i];
                tu_to_dtype(tmp, (size_t)c->d, t->dtype,
                            (char *)t->data + off * (int64_t)fattn_dtype_size(t->dtype));
            }
}

/* t (c's layout) -> packed BSHD doubles */
static void get(const mcase *c, const fattn_tensor *t, double *x) {
    for (int b = 0; b < c->batch; b++)
        for (int s = 0; s < c->sq; s++)
            for (int h = 0; h < c->hq; h++) {
                int64_t off = c->bhsd ? (((int64_t)b * c->hq + h) * c->sq + s) * c->d
                                      : (((int64_t)b * c->sq + s) * c->hq + h) * c->d;
                tu_from_dtype((const char *)t->data + off * (int64_t)fattn_dtype_size(t->dtype),
                              (size_t)c->d, t->dtype,
                              x + (((int64_t)b * c->sq + s) * c->hq + h) * c->d);
            }
}

static void parts_free(parts_buf *pb) {
    for (int i = 0; i < pb->n; i++) free(pb->odata[i]), free(pb->lse[i]);
}

static fattn_status merge(fattn_ctx *ctx, const mcase *c, const parts_buf *pb, fattn_tensor o,
                          float *lse) {
    fattn_merge_args m;
    memset(&m, 0, sizeof m);
    m.batch = c->batch, m.seqlen = c->sq, m.heads = c->hq, m.head_dim = c->d;
    m.num_parts = pb->n, m.parts = pb->p, m.o = o, m.lse = lse;
    return fattn_merge(ctx, &m);
}

static void run_case(fattn_ctx *ctx, tu_rng *rng, const mcase *c) {
    const size_t nq = (size_t)c->batch * c->sq * c->hq * c->d;
    const size_t nk = (size_t)c->batch * c->sk * c->hkv * c->d;
    const size_t nl = (size_t)c->batch * c->hq * c->sq;
    float *q = tu_malloc(4 * nq), *k = tu_malloc(4 * nk), *v = tu_malloc(4 * nk);
    double *tmp = tu_malloc(8 * (nq > nk ? nq : nk));
    tu_fill_normal(rng, tmp, nq), tu_to_dtype(tmp, nq, FATTN_DTYPE_F32, q);
    tu_fill_normal(rng, tmp, nk), tu_to_dtype(tmp, nk, FATTN_DTYPE_F32, k);
    tu_fill_normal(rng, tmp, nk), tu_to_dtype(tmp, nk, FATTN_DTYPE_F32, v);
    free(tmp);

    /* reference: all keys at once */
    float *o_full = tu_malloc(4 * nq), *lse_full = tu_malloc(4 * nl);
    fwd_range(ctx, c, q, k, v, 0, c->sk, o_full, lse_full);

    parts_buf pb;
    memset(&pb, 0, sizeof pb);
    float *o_part = tu_malloc(4 * nq);
    int bounds[6], nb = 0;
    bounds[nb++] = 0;
    for (int i = 0; i < c->ncuts; i++) bounds[nb++] = c->cuts[i];
    bounds[nb++] = c->sk;
    for (int r = 0; r + 1 < nb; r++) {
        for (int e = 0; e < 2; e++) {
            const int empty = e == 0;
            if (empty && c->empty_at != r) continue;
            const int i = pb.n++;
            fattn_tensor *t = &pb.p[i].o;
            memset(t, 0, sizeof *t);
            t->dtype = c->part_dt[i];
            set_layout(t, c);
            pb.odata[i] = t->data = tu_malloc(nq * fattn_dtype_size(t->dtype));
            pb.lse[i] = tu_malloc(4 * nl);
            pb.p[i].lse = pb.lse[i];
            if (empty) { /* no key: lse -inf, O anything (NaN here) */
                tu_poison(t->data, nq * fattn_dtype_size(t->dtype));
                for (size_t j = 0; j < nl; j++) pb.lse[i][j] = -INFINITY;
                continue;
            }
            tu_poison(o_part, 4 * nq);
            fwd_range(ctx, c, q, k, v, bounds[r], bounds[r + 1], o_part, pb.lse[i]);
            put(c, o_part, t);
            /* rows of this range that see no key: lse -inf, O exactly 0 (fattn_fwd) */
        }
    }

    fattn_tensor o = {0};
    o.dtype = c->out_dt;
    set_layout(&o, c);
    o.data = tu_malloc(nq * fattn_dtype_size(o.dtype));
    float *lse = tu_malloc(4 * nl);
    tu_poison(o.data, nq * fattn_dtype_size(o.dtype));
    tu_poison(lse, 4 * nl);
    TU_EXPECT_OK(merge(ctx, c, &pb, o, lse));

    double *got = tu_malloc(8 * nq), *ref = tu_malloc(8 * nq);
    get(c, &o, got);
    double omax = 0.0;
    for (size_t j = 0; j < nq; j++) ref[j] = o_full[j], omax = fmax(omax, fabs(ref[j]));
    double upart = 0.0;
    for (int i = 0; i < pb.n; i++) upart = fmax(upart, unit(c->part_dt[i]));
    const double tol = 4e-6 + (upart + unit(c->out_dt)) * omax;
    char what[160];
    snprintf(what, sizeof what, "%s: O max abs err (%d parts)", c->name, pb.n);
    TU_EXPECT_LE(tu_max_abs_err(got, ref, nq), tol, what);
    double lerr = 0.0;
    int inf_rows = 0, inf_bad = 0;
    for (size_t j = 0; j < nl; j++) {
        if (lse_full[j] == -INFINITY) {
            inf_rows++;
            inf_bad += lse[j] != -INFINITY;
            continue;
        }
        double e = fabs((double)lse[j] - lse_full[j]) / fmax(1.0, fabs((double)lse_full[j]));
        lerr = isnan(e) ? INFINITY : fmax(lerr, e);
    }
    snprintf(what, sizeof what, "%s: lse max rel err", c->name);
    TU_EXPECT_LE(lerr, 2e-6, what);
    TU_CHECK(inf_bad == 0, "%s: %d of %d rows with no key lack lse -inf", c->name, inf_bad, inf_rows);
    if (c->causal && c->sq > c->sk) TU_CHECK(inf_rows > 0, "%s: expected rows with no key", c->name);
    /* rows with no key: O exactly 0 (the poison is NaN) */
    int zero_bad = 0;
    for (int b = 0; b < c->batch; b++)
        for (int h = 0; h < c->hq; h++)
            for (int s = 0; s < c->sq; s++)
                if (lse_full[((size_t)b * c->hq + h) * c->sq + s] == -INFINITY)
                    for (int i = 0; i < c->d; i++)
                        zero_bad += got[(((size_t)b * c->sq + s) * c->hq + h) * c->d + i] != 0.0;
    TU_CHECK(zero_bad == 0, "%s: %d elements of rows with no key are not 0", c->name, zero_bad);

    /* the same bits for any thread count */
    const size_t obytes = nq * fattn_dtype_size(o.dtype);
    void *o1 = tu_malloc(obytes);
    float *l1 = tu_malloc(4 * nl);
    memcpy(o1, o.data, obytes), memcpy(l1, lse, 4 * nl);
    const int threads[] = {1, 2, 3, 7};
    int diff = 0;
    for (int t = 0; t < 4; t++) {
        fattn_ctx_set_threads(ctx, threads[t]);
        tu_poison(o.data, obytes), tu_poison(lse, 4 * nl);
        TU_EXPECT_OK(merge(ctx, c, &pb, o, lse));
        diff += memcmp(o1, o.data, obytes) != 0 || memcmp(l1, lse, 4 * nl) != 0;
    }
    fattn_ctx_set_threads(ctx, 0);
    TU_CHECK(diff == 0, "%s: results differ between thread counts 1, 2, 3, 7 (%d)", c->name, diff);

    /* NaN propagation: a NaN lse in a participating part makes its row NaN;
     * a NaN in a participating O makes that element NaN, no other. */
    if (!c->bhsd) {
        int ip = c->empty_at == 0 ? 1 : 0; /* a real part */
        size_t row = nl - 1;               /* the last row sees every range */
        const int b = (int)(row / ((size_t)c->hq * c->sq)), h = (int)(row / c->sq % c->hq),
                  s = (int)(row % c->sq);
        const size_t orow = (((size_t)b * c->sq + s) * c->hq + h) * c->d;
        float keep = pb.lse[ip][row];
        pb.lse[ip][row] = NAN;
        TU_EXPECT_OK(merge(ctx, c, &pb, o, lse));
        get(c, &o, got);
        int nan_ok = isnan(lse[row]);
        for (int i = 0; i < c->d; i++) nan_ok = nan_ok && isnan(got[orow + i]);
        TU_CHECK(nan_ok, "%s: NaN lse does not make its row NaN", c->name);
        pb.lse[ip][row] = keep;
        double nan1 = NAN;
        size_t esz = fattn_dtype_size(c->part_dt[ip]);
        char *elem = (char *)pb.odata[ip] + (orow + 1) * esz, save[4];
        memcpy(save, elem, esz);
        tu_to_dtype(&nan1, 1, c->part_dt[ip], elem);
        TU_EXPECT_OK(merge(ctx, c, &pb, o, lse));
        get(c, &o, got);
        int fin = 0;
        for (int i = 0; i < c->d; i++) fin += isfinite(got[orow + i]) != 0;
        TU_CHECK(isnan(got[orow + 1]) && fin == c->d - 1 && isfinite(lse[row]),
                 "%s: NaN in O does not stay in its element (%d finite of %d)", c->name, fin, c->d);
        memcpy(elem, save, esz);
    }

    free(o1), free(l1), free(got), free(ref), free(o.data), free(lse), free(o_part);
    parts_free(&pb);
    free(q), free(k), free(v), free(o_full), free(lse_full);
}

/* ---- bad arguments -------------------------------------------------------- */

enum { EB = 2, ES = 8, EH = 2, ED = 16 };
#define EN ((size_t)EB * ES * EH * ED)
#define EL ((size_t)EB * EH * ES)
static float e_o[EN + 8], e_lse[EL + 8], p_o[2][EN + 8], p_lse[2][EL + 8];

static int outputs_untouched(void) {
    const uint8_t *a = (const uint8_t *)e_o, *b = (const uint8_t *)e_lse;
    for (size_t i = 0; i < sizeof e_o; i++) if (a[i] != 0xA5) return 0;
    for (size_t i = 0; i < sizeof e_lse; i++) if (b[i] != 0xA5) return 0;
    return 1;
}

#define BAD(ctx_, edit, want, word)                                                                \
    do {                                                                                           \
        memset(e_o, 0xA5, sizeof e_o), memset(e_lse, 0xA5, sizeof e_lse);                          \
        fattn_merge_part pp[2];                                                                    \
        pp[0].o = fattn_tensor_bshd(p_o[0], FATTN_DTYPE_F32), pp[0].lse = p_lse[0];                \
        pp[1].o = fattn_tensor_bshd(p_o[1], FATTN_DTYPE_F32), pp[1].lse = p_lse[1];                \
        fattn_merge_args m_;                                                                       \
        memset(&m_, 0, sizeof m_);                                                                 \
        m_.batch = EB, m_.seqlen = ES, m_.heads = EH, m_.head_dim = ED, m_.num_parts = 2;          \
        m_.parts = pp, m_.o = fattn_tensor_bshd(e_o, FATTN_DTYPE_F32), m_.lse = e_lse;             \
        edit;                                                                                      \
        fattn_merge_part before[2];                                                                \
        memcpy(before, pp, sizeof pp);                                                             \
        fattn_status st_ = fattn_merge(ctx_, &m_);                                                 \
        const char *msg_ = fattn_last_error(ctx_);                                                 \
        TU_CHECK(st_ == (want), "%s: status %d, want %d (%s)", #edit, (int)st_, (int)(want), msg_); \
        TU_CHECK(strstr(msg_, word) != NULL, "%s: message '%s' lacks '%s'", #edit, msg_, word);    \
        TU_CHECK(outputs_untouched(), "%s: a rejected call wrote its outputs", #edit);             \
        TU_CHECK(memcmp(before, pp, sizeof pp) == 0, "%s: the parts array was written", #edit);    \
    } while (0)

static void test_bad_args(fattn_ctx *ctx) {
    const fattn_status INV = FATTN_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < 2; i++)
        for (size_t j = 0; j < EL; j++) p_lse[i][j] = 0.0f;
    TU_CHECK(fattn_merge(NULL, NULL) == INV, "ctx NULL");
    TU_CHECK(fattn_merge(ctx, NULL) == INV && strstr(fattn_last_error(ctx), "args"), "args NULL");
    BAD(ctx, m_.batch = 0, INV, "batch");
    BAD(ctx, m_.seqlen = -1, INV, "seqlen");
    BAD(ctx, m_.heads = 0, INV, "heads");
    BAD(ctx, m_.head_dim = 0, INV, "head_dim");
    BAD(ctx, m_.num_parts = 0, INV, "num_parts");
    BAD(ctx, m_.num_parts = FATTN_MERGE_MAX_PARTS + 1, INV, "num_parts");
    BAD(ctx, m_.parts = NULL, INV, "parts is NULL");
    BAD(ctx, m_.o.dtype = FATTN_DTYPE_E4M3, INV, "o.dtype e4m3");
    BAD(ctx, pp[1].o.dtype = (fattn_dtype)7, INV, "parts[1].o.dtype");
    BAD(ctx, pp[0].o.dtype = FATTN_DTYPE_E4M3, INV, "parts[0].o.dtype e4m3");
    BAD(ctx, m_.o.data = NULL, INV, "o.data is NULL");
    BAD(ctx, pp[1].o.data = NULL, INV, "parts[1].o.data is NULL");
    BAD(ctx, pp[0].lse = NULL, INV, "parts[0].lse is NULL");
    BAD(ctx, m_.o.data = (char *)e_o + 2, INV, "o.data is not 4-byte aligned");
    BAD(ctx, m_.lse = (float *)((char *)e_lse + 1), INV, "lse is not 4-byte aligned");
    BAD(ctx, pp[1].lse = (const float *)((const char *)p_lse[1] + 2), INV, "parts[1].lse is not");
    BAD(ctx, pp[0].o.data = (char *)p_o[0] + 1, INV, "parts[0].o.data is not");
    BAD(ctx, pp[1].o.stride_seq = -1, INV, "parts[1].o.stride_seq");
    BAD(ctx, (pp[0].o.stride_head = ED, pp[0].o.stride_seq = 1, pp[0].o.stride_batch = EN),
        INV, "parts[0].o.stride_seq");
    /* o's heads on top of each other */
    BAD(ctx, (m_.o.stride_head = ED, m_.o.stride_seq = ED, m_.o.stride_batch = ES * ED), INV,
        "would overlap");
    BAD(ctx, m_.o.data = p_o[1], INV, "o overlaps parts[1].o");
    BAD(ctx, m_.lse = (float *)p_lse[0] + 3, INV, "lse overlaps parts[0].lse");
    BAD(ctx, m_.lse = e_o + 5, INV, "lse overlaps o");
    BAD(ctx, m_.o.data = p_lse[1], INV, "overlaps");
    /* sizes whose rows overflow the engine limit; the pointers are not read */
    BAD(ctx, (m_.batch = 1 << 16, m_.seqlen = 1 << 16, m_.heads = 1), INV, "exceeds");
    BAD(ctx, (pp[1].o.stride_batch = INT64_C(1) << 62, pp[1].o.stride_seq = ED * EH,
              pp[1].o.stride_head = ED),
        INV, "overflows");

    static fattn_ctx fake;
    memset(&fake, 0, sizeof fake);
    fake.backend = FATTN_BACKEND_CUDA;
#ifdef FATTN_WITH_CUDA
    /* the CUDA engine serves the call, and refuses these host pointers
     * ("not a CUDA pointer" without a GPU, "not device memory" with one) */
    BAD(&fake, (void)0, FATTN_ERROR_INVALID_ARGUMENT, "o.data (");
#else
    BAD(&fake, (void)0, FATTN_ERROR_NO_DEVICE, "without the CUDA engine");
#endif
    /* a valid call on the same buffers succeeds (the cases above fail for
     * their one reason) */
    fattn_merge_part pp[2];
    pp[0].o = fattn_tensor_bshd(p_o[0], FATTN_DTYPE_F32), pp[0].lse = p_lse[0];
    pp[1].o = fattn_tensor_bshd(p_o[1], FATTN_DTYPE_F32), pp[1].lse = p_lse[1];
    for (int i = 0; i < 2; i++)
        for (size_t j = 0; j < EN; j++) p_o[i][j] = (float)(i + 1);
    fattn_merge_args m;
    memset(&m, 0, sizeof m);
    m.batch = EB, m.seqlen = ES, m.heads = EH, m.head_dim = ED, m.num_parts = 2, m.parts = pp;
    m.o = fattn_tensor_bshd(e_o, FATTN_DTYPE_F32), m.lse = e_lse;
    TU_EXPECT_OK(fattn_merge(ctx, &m));
    /* equal weights: O = 1.5, lse = log 2 */
    TU_CHECK(e_o[0] == 1.5f && e_o[EN - 1] == 1.5f && fabsf(e_lse[0] - logf(2.0f)) < 1e-6f,
             "two equal parts: o %g, lse %g", (double)e_o[0], (double)e_lse[0]);
    m.lse = NULL; /* lse is optional */
    TU_EXPECT_OK(fattn_merge(ctx, &m));
}

int main(void) {
    tu_rng rng;
    tu_rng_init(&rng, (uint64_t)tu_seed());
    fattn_ctx *ctx = NULL;
    TU_EXPECT_OK(fattn_ctx_create(&ctx, FATTN_BACKEND_CPU, 0));
    if (!ctx) return tu_finish("test_merge");

    const fattn_dtype F32 = FATTN_DTYPE_F32, F16 = FATTN_DTYPE_F16, B16 = FATTN_DTYPE_BF16;
    const mcase cases[] = {
        {"2 parts f32", 2, 37, 50, 4, 2, 32, 0, 1, {20}, -1, {F32, F32}, F32, 0},
        {"3 parts + empty, f32", 1, 64, 129, 2, 1, 64, 0, 2, {1, 70}, 1, {F32, F32, F32, F32}, F32, 0},
        {"4 parts f32 BHSD", 2, 20, 90, 3, 3, 48, 0, 3, {10, 11, 60}, 0, {F32, F32, F32, F32, F32}, F32, 1},
        {"causal sq > sk, 3 parts", 2, 40, 33, 2, 2, 32, 1, 2, {5, 20}, -1, {F32, F32, F32}, F32, 0},
        {"causal sq < sk, 4 parts + empty", 1, 30, 100, 4, 2, 16, 1, 3, {25, 80, 90}, 3,
         {F32, F32, F32, F32, F32}, F32, 0},
        {"causal sq == sk, 2 parts", 3, 65, 65, 1, 1, 8, 1, 1, {33}, -1, {F32, F32}, F32, 0},
        {"mixed parts f16/bf16/f32 -> f16", 2, 33, 64, 2, 1, 32, 1, 2, {16, 40}, 2,
         {F16, B16, F32, F16}, F16, 0},
        {"parts f32 -> bf16, head_dim 200", 1, 17, 40, 2, 2, 200, 0, 1, {13}, -1, {F32, F32}, B16, 0},
        {"bf16 parts -> f32 BHSD", 1, 24, 48, 2, 2, 64, 1, 2, {12, 30}, -1, {B16, B16, B16}, F32, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(ctx, &rng, &cases[i]);
    test_bad_args(ctx);
    fattn_ctx_free(ctx);
    return tu_finish("test_merge");
}
