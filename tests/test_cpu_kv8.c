/* test_cpu_kv8.c - the FP8 KV cache on the CPU engine (fattn.h 0.5): e4m3 k
 * and v with f32 / f16 / bf16 queries, written by fattn_kv_append.
 *   - fattn_kv_append into e4m3 caches (paged and contiguous; scales per
 *     token, per page, per block inside a page, per sequence) is checked
 *     bytewise, codes and scales, against a model of the rule fattn.h
 *     documents, computed here in FP64: the scale of a block the call
 *     starts is max(amax / 448, 2^-126) (1 when zero), other blocks keep
 *     their stored scale, and code = e4m3(x / scale) with the quotient
 *     rounded once to f32 (double division then rounding to float is the
 *     correctly rounded f32 quotient) and e4m3 rounding to nearest even with
 *     saturation at 448, written out here from the format's grid;
 *   - after every append, fattn_fwd over the cache (paged, seqused_k, GQA,
 *     causal with several queries) against the FP64 oracle on the
 *     dequantised cache (code x scale, exact in double) and the queries as
 *     their dtype holds them.  So the tolerance is the CPU engine's for the
 *     query dtype (f32 arithmetic, O rounded to q's dtype: test_cpu_fwd.c's
 *     TOL_*), not e4m3's 2^-4: the quantisation error is in the oracle too;
 *   - rows and pages no sequence uses hold NaN codes, and their scales NaN:
 *     never read;
 *   - refusals name the field and write nothing. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/oracle.h"
#include "common/testutil.h"
#include "fattn.h"

#define TOL_F32 1e-5
#define TOL_F16 2e-3  /* one f16 output ulp is 2^-11 ~ 4.9e-4 relative, x4 margin */
#define TOL_BF16 1.6e-2 /* one bf16 output ulp is 2^-8 ~ 3.9e-3 relative, x4 margin */
#define TOL_LSE 1e-4  /* natural-log units: f32 sums of a few hundred terms */

#define CODE_UNUSED 0x7Fu /* e4m3 NaN: what rows nobody writes hold */

static fattn_ctx *g_ctx;
static int g_appends, g_fwds, g_refusals;

/* ---- the FP64 model of the quantiser -------------------------------------- */

/* e4m3 (OCP e4m3fn) of q: nearest value of the grid, ties to even, |q| >=
 * 448 to +-448 (464 rounds to 448: 480 is not a finite e4m3), NaN NaN. */
static double ref_e4m3(double q) {
    if (q != q) return NAN;
    const double a = fabs(q);
    double v;
    if (a >= 448.0) {
        v = 448.0;
    } else {
        int e;
        frexp(a, &e); /* a = m 2^e, m in [0.5, 1): normal quantum 2^(e - 4) */
        const double quantum = a < 0x1p-6 ? 0x1p-9 : ldexp(1.0, e - 4);
        v = nearbyint(a / quantum) * quantum; /* the quotient is exact; nearbyint rounds ties to even */
    }
    return copysign(v, q);
}

/* The code of a value of the grid (the library's table decodes codes; NaN
 * codes 0x7F, as fattn_f32_to_e4m3's). */
static uint8_t code_of(double v) {
    if (v != v) return 0x7F;
    for (int c = 0; c < 256; c++) {
        const double x = fattn_e4m3_to_f32((uint8_t)c);
        if (x == v && signbit(x) == signbit(v)) return (uint8_t)c;
    }
    fprintf(stderr, "code_of: %a is not an e4m3 value\n", v);
    abort();
}

/* The scale of a block of amax m (|x| of f32 values, NaN left out). */
static float ref_scale(float m) {
    if (!(m > 0.0f)) return 1.0f;
    const float s = (float)((double)m / 448.0);
    return s > 0x1p-126f ? s : 0x1p-126f;
}

static uint8_t ref_code(float x, float scale) {
    return code_of(ref_e4m3((double)(float)((double)x / (double)scale)));
}

/* ---- a cache and its model ------------------------------------------------- */

typedef struct kcfg {
    const char *name;
    int page_size;  /* 0: contiguous */
    int capacity;   /* contiguous: rows per sequence; paged: max_pages_per_seq * page_size */
    int sb_k, sb_v; /* scale_block of k_cache and v_cache */
} kcfg;

typedef struct cache {
    int entries, rows; /* batch entries or pages, rows per entry */
    int hkv, d;
    size_t ncode;
    uint8_t *k, *v;      /* [entries][rows][hkv][d], packed */
    float *ks, *vs;      /* [entries][hkv][nblocks] */
    int nbk, nbv;        /* scale blocks per (entry, head) */
    int32_t *table;      /* [batch][mpps], NULL: contiguous */
    int mpps;
} cache;

static void cache_init(cache *c, const kcfg *g, int batch, int hkv, int d, tu_rng *rng, float init_scale) {
    memset(c, 0, sizeof *c);
    c->hkv = hkv, c->d = d;
    if (g->page_size) {
        c->mpps = g->capacity / g->page_size;
        c->entries = batch * c->mpps + 3; /* spare pages nobody uses */
        c->rows = g->page_size;
        int *perm = (int *)tu_malloc(sizeof(int) * (size_t)c->entries);
        for (int i = 0; i < c->entries; i++) perm[i] = i;
        for (int i = c->entries - 1; i > 0; i--) {
            const int j = (int)(tu_rng_u64(rng) % (uint64_t)(i + 1)), x = perm[i];
            perm[i] = perm[j], perm[j] = x;
        }
        c->table = (int32_t *)tu_malloc(sizeof(int32_t) * (size_t)batch * c->mpps);
        for (int i = 0; i < batch * c->mpps; i++) c->table[i] = perm[i];
        free(perm);
    } else {
        c->entries = batch;
        c->rows = g->capacity;
    }
    c->ncode = (size_t)c->entries * c->rows * hkv * d;
    c->k = (uint8_t *)tu_malloc(c->ncode);
    c->v = (uint8_t *)tu_malloc(c->ncode);
    memset(c->k, CODE_UNUSED, c->ncode);
    memset(c->v, CODE_UNUSED, c->ncode);
    c->nbk = (c->rows + g->sb_k - 1) / g->sb_k;
    c->nbv = (c->rows + g->sb_v - 1) / g->sb_v;
    c->ks = (float *)tu_malloc(sizeof(float) * (size_t)c->entries * hkv * c->nbk);
    c->vs = (float *)tu_malloc(sizeof(float) * (size_t)c->entries * hkv * c->nbv);
    for (size_t i = 0; i < (size_t)c->entries * hkv * c->nbk; i++) c->ks[i] = init_scale;
    for (size_t i = 0; i < (size_t)c->entries * hkv * c->nbv; i++) c->vs[i] = init_scale;
}

static cache cache_copy(const cache *c) {
    cache x = *c;
    x.k = (uint8_t *)tu_malloc(c->ncode);
    x.v = (uint8_t *)tu_malloc(c->ncode);
    memcpy(x.k, c->k, c->ncode);
    memcpy(x.v, c->v, c->ncode);
    x.ks = (float *)tu_malloc(sizeof(float) * (size_t)c->entries * c->hkv * c->nbk);
    x.vs = (float *)tu_malloc(sizeof(float) * (size_t)c->entries * c->hkv * c->nbv);
    memcpy(x.ks, c->ks, sizeof(float) * (size_t)c->entries * c->hkv * c->nbk);
    memcpy(x.vs, c->vs, sizeof(float) * (size_t)c->entries * c->hkv * c->nbv);
    x.table = NULL; /* shared with c */
    return x;
}

static void cache_free(cache *c, int own_table) {
    free(c->k), free(c->v), free(c->ks), free(c->vs);
    if (own_table) free(c->table);
}

/* Position pos of sequence b: entry *e, row *r. */
static void loc(const cache *c, int b, int pos, int *e, int *r) {
    if (!c->table) {
        *e = b, *r = pos;
        return;
    }
    *e = c->table[b * c->mpps + pos / c->rows];
    *r = pos % c->rows;
}

/* The model's append of one cache (codes, scales, scale_block sb): new
 * rows x [batch][n][hkv][d] (as f32) at positions start[b] .. */
static void model_append(const cache *c, uint8_t *codes, float *scales, int nb, int sb, const float *x, int batch,
                         int n, const int32_t *start) {
    const int hkv = c->hkv, d = c->d;
    for (int b = 0; b < batch; b++)
        for (int h = 0; h < hkv; h++)
            for (int t0 = 0; t0 < n;) {
                int e, r, t1 = t0 + 1;
                loc(c, b, start[b] + t0, &e, &r);
                for (; t1 < n; t1++) { /* the run inside one scale block */
                    int e2, r2;
                    loc(c, b, start[b] + t1, &e2, &r2);
                    if (e2 != e || r2 / sb != r / sb) break;
                }
                float *sp = &scales[((size_t)e * hkv + h) * nb + r / sb];
                if (r % sb == 0) {
                    float m = 0.0f;
                    for (int t = t0; t < t1; t++)
                        for (int i = 0; i < d; i++) {
                            const float a = fabsf(x[(((size_t)b * n + t) * hkv + h) * d + i]);
                            if (a > m) m = a; /* NaN left out */
                        }
                    *sp = ref_scale(m);
                }
                for (int t = t0; t < t1; t++) {
                    int te, tr;
                    loc(c, b, start[b] + t, &te, &tr);
                    for (int i = 0; i < d; i++)
                        codes[(((size_t)te * c->rows + tr) * hkv + h) * d + i] =
                            ref_code(x[(((size_t)b * n + t) * hkv + h) * d + i], *sp);
                }
                t0 = t1;
            }
}

static fattn_kv_append_args append_args(const cache *c, const kcfg *g, int batch, int n, void *kn, void *vn,
                                        fattn_dtype dt, const int32_t *start) {
    fattn_kv_append_args a;
    memset(&a, 0, sizeof a);
    a.batch = batch, a.seqlen_new = n, a.heads_kv = c->hkv, a.head_dim = c->d;
    a.k_new = fattn_tensor_bshd(kn, dt);
    a.v_new = fattn_tensor_bshd(vn, dt);
    a.k_cache = fattn_tensor_bshd(c->k, FATTN_DTYPE_E4M3);
    a.v_cache = fattn_tensor_bshd(c->v, FATTN_DTYPE_E4M3);
    a.k_cache.scale = c->ks, a.k_cache.scale_block = g->sb_k;
    a.v_cache.scale = c->vs, a.v_cache.scale_block = g->sb_v;
    a.cache_seqlens = start;
    if (c->table) {
        a.block_table = c->table;
        a.page_size = c->rows, a.num_pages = c->entries, a.max_pages_per_seq = c->mpps;
    } else {
        a.capacity = c->rows;
    }
    return a;
}

/* n new rows per sequence in dtype dt: x holds the f32 values the library
 * converts (the dtype's own values) */
static void *new_rows(tu_rng *rng, fattn_dtype dt, size_t count, float *x, double spread, int specials) {
    double *dv = (double *)tu_malloc(sizeof(double) * count);
    for (size_t i = 0; i < count; i++) dv[i] = tu_rng_normal(rng) * spread;
    /* an outlier, a zero and a tiny value, where asked */
    if (specials && count > 8) {
        dv[1] *= 40.0;
        dv[2] = 0.0;
        dv[3] = -1e-5;
    }
    void *buf = tu_malloc(count * fattn_dtype_size(dt));
    tu_to_dtype(dv, count, dt, buf);
    tu_from_dtype(buf, count, dt, dv);
    for (size_t i = 0; i < count; i++) x[i] = (float)dv[i];
    free(dv);
    return buf;
}

static int same_bytes(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

/* ---- the forward over a cache ---------------------------------------------- */

/* fattn_fwd with sq queries per sequence (dtype dt) against keys pad[b] ..
 * used[b] - 1 of the cache (cache_leftpad, seqused_k), against the oracle
 * on the dequantised keys. */
static void check_fwd(tu_rng *rng, const cache *c, const kcfg *g, int batch, int hq, int sq, int causal,
                      const int32_t *pad, const int32_t *used, fattn_dtype dt, const char *what) {
    const int hkv = c->hkv, d = c->d, skmax = c->table ? c->mpps * c->rows : c->rows;
    const size_t nq = (size_t)batch * sq * hq * d;
    double *qd = (double *)tu_malloc(sizeof(double) * nq);
    tu_fill_normal(rng, qd, nq);
    void *qb = tu_malloc(nq * fattn_dtype_size(dt));
    void *ob = tu_malloc(nq * fattn_dtype_size(dt));
    tu_to_dtype(qd, nq, dt, qb);
    tu_from_dtype(qb, nq, dt, qd); /* the values q holds */
    tu_poison(ob, nq * fattn_dtype_size(dt));
    float *lse = (float *)tu_malloc(sizeof(float) * (size_t)batch * hq * sq);

    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = tu_problem(batch, sq, skmax, hq, hkv, d, 0, causal, NULL, NULL);
    a.q = fattn_tensor_bshd(qb, dt);
    a.o = fattn_tensor_bshd(ob, dt);
    a.k = fattn_tensor_bshd(c->k, FATTN_DTYPE_E4M3);
    a.v = fattn_tensor_bshd(c->v, FATTN_DTYPE_E4M3);
    a.k.scale = c->ks, a.k.scale_block = g->sb_k;
    a.v.scale = c->vs, a.v.scale_block = g->sb_v;
    a.lse = lse;
    a.seqused_k = used;
    a.cache_leftpad = pad;
    if (c->table) {
        a.block_table = c->table;
        a.page_size = c->rows, a.num_pages = c->entries, a.max_pages_per_seq = c->mpps;
    }
    fattn_status st = fattn_fwd(g_ctx, &a);
    TU_CHECK(st == FATTN_OK, "%s: fattn_fwd: %s: %s", what, fattn_status_string(st), fattn_last_error(g_ctx));

    double *o = (double *)tu_malloc(sizeof(double) * nq);
    tu_from_dtype(ob, nq, dt, o);
    double worst = 0.0, worst_lse = 0.0;
    for (int b = 0; b < batch; b++) {
        const int klen = used[b] - pad[b];
        const size_t krow = (size_t)hkv * d;
        double *kd = (double *)tu_malloc(sizeof(double) * ((size_t)klen * krow + 1));
        double *vd = (double *)tu_malloc(sizeof(double) * ((size_t)klen * krow + 1));
        for (int j = 0; j < klen; j++) {
            int e, r;
            loc(c, b, pad[b] + j, &e, &r);
            for (int h = 0; h < hkv; h++) {
                const double ksc = c->ks[((size_t)e * hkv + h) * c->nbk + r / g->sb_k];
                const double vsc = c->vs[((size_t)e * hkv + h) * c->nbv + r / g->sb_v];
                for (int i = 0; i < d; i++) {
                    const size_t src = (((size_t)e * c->rows + r) * hkv + h) * d + i;
                    kd[(size_t)j * krow + (size_t)h * d + i] = fattn_e4m3_to_f32(c->k[src]) * ksc;
                    vd[(size_t)j * krow + (size_t)h * d + i] = fattn_e4m3_to_f32(c->v[src]) * vsc;
                }
            }
        }
        const size_t qrow = (size_t)hq * d;
        double *ro = (double *)tu_malloc(sizeof(double) * sq * qrow), *rl = (double *)tu_malloc(sizeof(double) * sq * hq);
        if (klen == 0) {
            memset(ro, 0, sizeof(double) * sq * qrow);
            for (int i = 0; i < sq * hq; i++) rl[i] = -INFINITY;
        } else {
            oracle_problem p;
            memset(&p, 0, sizeof p);
            p.batch = 1, p.seqlen_q = sq, p.seqlen_k = klen, p.heads_q = hq, p.heads_kv = hkv;
            p.head_dim = p.head_dim_v = d, p.causal = causal;
            oracle_fwd(&p, qd + (size_t)b * sq * qrow, kd, vd, ro, rl);
        }
        const double err = tu_rel_err(o + (size_t)b * sq * qrow, ro, (size_t)sq * qrow);
        if (!(err <= worst)) worst = err;
        for (int h = 0; h < hq; h++)
            for (int i = 0; i < sq; i++) {
                const double want = rl[h * sq + i], got = lse[((size_t)b * hq + h) * sq + i];
                const double de = want == got ? 0.0 : fabs(got - want);
                if (!(de <= worst_lse)) worst_lse = de;
            }
        free(kd), free(vd), free(ro), free(rl);
    }
    const double tol = dt == FATTN_DTYPE_F32 ? TOL_F32 : dt == FATTN_DTYPE_F16 ? TOL_F16 : TOL_BF16;
    char msg[256];
    snprintf(msg, sizeof msg, "%s: fwd %s q, %d queries%s: O rel err", what, fattn_dtype_name(dt), sq,
             causal ? " causal" : "");
    TU_EXPECT_LE(worst, tol, msg);
    snprintf(msg, sizeof msg, "%s: fwd %s q: LSE max abs err", what, fattn_dtype_name(dt));
    TU_EXPECT_LE(worst_lse, TOL_LSE, msg);
    g_fwds++;
    free(qd), free(qb), free(ob), free(o), free(lse);
}

/* ---- append steps, each checked, each followed by a forward --------------------- */

static void run_case(tu_rng *rng, const kcfg *g, fattn_dtype dt, int with_offsets) {
    const int batch = 3, hkv = 2, hq = 8, d = 40;
    cache c;
    /* offsets into blocks nobody started read the stored scale: 1/16 (so
     * that 448 / 16 = 28 bounds what they can code); else NaN, never read */
    cache_init(&c, g, batch, hkv, d, rng, with_offsets ? 0.0625f : NAN);
    cache m = cache_copy(&c);
    m.table = c.table;
    int32_t pos[3], pad[3];
    if (with_offsets) {
        pos[0] = 5, pos[1] = 0, pos[2] = 13;
    } else { /* every block started by its first row (page and block boundaries) */
        const int unit = g->page_size ? g->page_size : g->capacity;
        pos[0] = 0, pos[1] = g->sb_k == 1 && g->sb_v == 1 ? 7 : 0, pos[2] = unit <= g->capacity / 2 && g->page_size ? unit : 0;
    }
    memcpy(pad, pos, sizeof pad);
    const int steps[] = {20, 1, 1, 3, 1, 9, 1};
    for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
        const int n = steps[s];
        int fits = 1;
        for (int b = 0; b < batch; b++) fits = fits && pos[b] + n <= g->capacity;
        if (!fits) break;
        const size_t cnt = (size_t)batch * n * hkv * d;
        float *xk = (float *)tu_malloc(sizeof(float) * cnt), *xv = (float *)tu_malloc(sizeof(float) * cnt);
        /* later steps larger than the first: per-page scales saturate them */
        void *kn = new_rows(rng, dt, cnt, xk, s == 3 ? 3.0 : 1.0, s == 0 || s == 5);
        void *vn = new_rows(rng, dt, cnt, xv, s == 3 ? 3.0 : 1.0, s == 0 || s == 5);
        /* a NaN element codes NaN (the forward over it would be NaN: appends only) */
        if (s == 5 && with_offsets) xk[7] = NAN, tu_to_dtype((const double[]){NAN}, 1, dt, (char *)kn + 7 * fattn_dtype_size(dt));
        fattn_kv_append_args a = append_args(&c, g, batch, n, kn, vn, dt, pos);
        fattn_status st = fattn_kv_append(g_ctx, &a);
        TU_CHECK(st == FATTN_OK, "%s %s step %zu: fattn_kv_append: %s: %s", g->name, fattn_dtype_name(dt), s,
                 fattn_status_string(st), fattn_last_error(g_ctx));
        model_append(&m, m.k, m.ks, m.nbk, g->sb_k, xk, batch, n, pos);
        model_append(&m, m.v, m.vs, m.nbv, g->sb_v, xv, batch, n, pos);
        int ok = same_bytes(c.k, m.k, c.ncode) && same_bytes(c.v, m.v, c.ncode) &&
                 same_bytes(c.ks, m.ks, sizeof(float) * (size_t)c.entries * hkv * c.nbk) &&
                 same_bytes(c.vs, m.vs, sizeof(float) * (size_t)c.entries * hkv * c.nbv);
        if (!ok) {
            size_t i = 0;
            while (i < c.ncode && c.k[i] == m.k[i]) i++;
            fprintf(stderr, "  first K code difference at %zu: 0x%02x, want 0x%02x\n", i, i < c.ncode ? c.k[i] : 0,
                    i < c.ncode ? m.k[i] : 0);
        }
        TU_CHECK(ok, "%s %s step %zu (%d new rows): cache codes and scales differ from the model", g->name,
                 fattn_dtype_name(dt), s, n);
        g_appends++;
        for (int b = 0; b < batch; b++) pos[b] += n;
        free(xk), free(xv), free(kn), free(vn);

        /* the forward over every used key (with offsets the rows before
         * them were never written: the forward starts at 0 without them) */
        if (!with_offsets) {
            char what[128];
            snprintf(what, sizeof what, "%s, %s new rows, step %zu", g->name, fattn_dtype_name(dt), s);
            check_fwd(rng, &c, g, batch, hq, 1, 0, pad, pos, dt, what);
            check_fwd(rng, &c, g, batch, hq, 3, 1, pad, pos, dt, what);
        }
    }
    cache_free(&m, 0);
    cache_free(&c, 1);
}

/* ---- refusals ------------------------------------------------------------------- */

static void expect_refusal(fattn_status st, fattn_status want, const char *needle, const char *what) {
    const char *msg = fattn_last_error(g_ctx);
    TU_CHECK(st == want && strstr(msg, needle), "%s: want %s naming '%s', got %s: '%s'", what,
             fattn_status_string(want), needle, fattn_status_string(st), msg);
    g_refusals++;
}

static void refusals(tu_rng *rng) {
    const kcfg g = {"paged 16, per token", 16, 64, 1, 1};
    const int batch = 3, hkv = 2, hq = 4, d = 32;
    cache c;
    cache_init(&c, &g, batch, hkv, d, rng, NAN);
    int32_t pos[3] = {0, 0, 0};
    const size_t cnt = (size_t)batch * 10 * hkv * d;
    float *x = (float *)tu_malloc(sizeof(float) * cnt);
    void *kn = new_rows(rng, FATTN_DTYPE_BF16, cnt, x, 1.0, 0);
    fattn_kv_append_args ap = append_args(&c, &g, batch, 10, kn, kn, FATTN_DTYPE_BF16, pos);
    TU_EXPECT_OK(fattn_kv_append(g_ctx, &ap));
    const int32_t used[3] = {10, 4, 7};

    /* the forward */
    const size_t nq = (size_t)batch * hq * d;
    uint16_t *q = (uint16_t *)tu_malloc(nq * 2), *o = (uint16_t *)tu_malloc(nq * 2), *o0 = (uint16_t *)tu_malloc(nq * 2);
    for (size_t i = 0; i < nq; i++) q[i] = 0x3f80; /* bf16 1.0 */
    memset(o, 0xA5, nq * 2);
    memcpy(o0, o, nq * 2);
    fattn_fwd_args f;
    memset(&f, 0, sizeof f);
    f.p = tu_problem(batch, 1, 64, hq, hkv, d, 0, 0, NULL, NULL);
    f.q = fattn_tensor_bshd(q, FATTN_DTYPE_BF16);
    f.o = fattn_tensor_bshd(o, FATTN_DTYPE_BF16);
    f.k = fattn_tensor_bshd(c.k, FATTN_DTYPE_E4M3);
    f.v = fattn_tensor_bshd(c.v, FATTN_DTYPE_E4M3);
    f.k.scale = c.ks, f.k.scale_block = 1;
    f.v.scale = c.vs, f.v.scale_block = 1;
    f.seqused_k = used;
    f.block_table = c.table, f.page_size = 16, f.num_pages = c.entries, f.max_pages_per_seq = c.mpps;
    const fattn_status INV = FATTN_ERROR_INVALID_ARGUMENT;
    fattn_fwd_args x2;
    TU_EXPECT_OK(fattn_fwd(g_ctx, &f)); /* unused scales are NaN: not read */
    memcpy(o, o0, nq * 2);

    x2 = f, x2.v.dtype = FATTN_DTYPE_BF16;
    expect_refusal(fattn_fwd(g_ctx, &x2), INV, "v.dtype bf16 differs from k.dtype e4m3", "fwd v bf16");
    x2 = f, x2.k.scale = NULL;
    expect_refusal(fattn_fwd(g_ctx, &x2), INV, "k.scale is NULL", "fwd no k.scale");
    x2 = f, x2.v.scale = (float *)((char *)c.vs + 2);
    expect_refusal(fattn_fwd(g_ctx, &x2), INV, "v.scale is not 4-byte aligned", "fwd v.scale unaligned");
    x2 = f, x2.v.scale_block = 0;
    expect_refusal(fattn_fwd(g_ctx, &x2), INV, "v.scale_block 0 must be >= 1", "fwd v.scale_block 0");
    x2 = f, x2.o.dtype = FATTN_DTYPE_F32;
    expect_refusal(fattn_fwd(g_ctx, &x2), INV, "o.dtype f32 differs from q.dtype bf16", "fwd o f32");
    /* a used key's scale: sequence 1, key 3 (page table[1][0], row 3), kv head 1 */
    {
        const int e = c.table[1 * c.mpps + 0];
        float *sp = &c.vs[((size_t)e * hkv + 1) * c.nbv + 3];
        const float keep = *sp;
        *sp = 0.0f;
        expect_refusal(fattn_fwd(g_ctx, &f), INV, "v.scale[", "fwd a used key's v scale 0");
        TU_CHECK(strstr(fattn_last_error(g_ctx), "key 3 of sequence 1, kv head 1") != NULL, "message: %s",
                 fattn_last_error(g_ctx));
        *sp = keep;
    }
    TU_CHECK(memcmp(o, o0, nq * 2) == 0, "a refused forward wrote o");
    {
        fattn_fp8_options opt;
        memset(&opt, 0, sizeof opt);
        x2 = f; /* without the serving fields, which fattn_fwd_fp8 refuses first */
        x2.seqused_k = NULL, x2.block_table = NULL, x2.page_size = x2.num_pages = x2.max_pages_per_seq = 0;
        expect_refusal(fattn_fwd_fp8(g_ctx, &x2, &opt), INV, "k.dtype e4m3: fattn_fwd_fp8 quantises", "fwd_fp8 e4m3 k");
    }

    /* fattn_kv_append */
    cache before = cache_copy(&c);
    pos[0] = 10, pos[1] = 10, pos[2] = 10;
    fattn_kv_append_args y = append_args(&c, &g, batch, 2, kn, kn, FATTN_DTYPE_BF16, pos);
    fattn_kv_append_args y2;
    y2 = y, y2.v_cache.dtype = FATTN_DTYPE_BF16;
    expect_refusal(fattn_kv_append(g_ctx, &y2), INV, "v_cache.dtype bf16 differs from k_cache.dtype e4m3",
                   "append v_cache bf16");
    y2 = y, y2.v_cache.scale = NULL;
    expect_refusal(fattn_kv_append(g_ctx, &y2), INV, "v_cache.scale is NULL", "append no v_cache.scale");
    y2 = y, y2.k_cache.scale_block = -2;
    expect_refusal(fattn_kv_append(g_ctx, &y2), INV, "k_cache.scale_block -2 must be >= 1", "append scale_block");
    y2 = y, y2.k_cache.scale = (float *)c.v; /* the scales inside the V cache */
    expect_refusal(fattn_kv_append(g_ctx, &y2), INV, "overlaps", "append k_cache.scale over v_cache");
    /* per page: rows 10, 11 continue page 0's block, whose stored scale is read */
    y2 = y, y2.k_cache.scale_block = 16, y2.v_cache.scale_block = 16;
    for (int i = 0; i < c.entries * hkv; i++) c.ks[i] = c.vs[i] = 1.0f; /* the first entries, as [pages][heads][1] */
    c.vs[((size_t)c.table[2 * c.mpps] * hkv + 1)] = -1.0f;
    memcpy(before.ks, c.ks, sizeof(float) * (size_t)c.entries * hkv);
    memcpy(before.vs, c.vs, sizeof(float) * (size_t)c.entries * hkv);
    expect_refusal(fattn_kv_append(g_ctx, &y2), INV, "v_cache.scale[", "append a stored scale < 0");
    TU_CHECK(strstr(fattn_last_error(g_ctx), "sequence 2 appends rows 10..11 of kv head 1") != NULL, "message: %s",
             fattn_last_error(g_ctx));
    TU_CHECK(same_bytes(c.k, before.k, c.ncode) && same_bytes(c.v, before.v, c.ncode) &&
                 same_bytes(c.ks, before.ks, sizeof(float) * (size_t)c.entries * hkv * c.nbk) &&
                 same_bytes(c.vs, before.vs, sizeof(float) * (size_t)c.entries * hkv * c.nbv),
             "a refused append wrote the cache or its scales");
    cache_free(&before, 0);
    cache_free(&c, 1);
    free(x), free(kn), free(q), free(o), free(o0);
}

/* The quantiser's corner cases through one append (per token): Inf makes
 * the row's scale Inf, its Inf entries NaN and the others +-0 (fattn.h);
 * a row of zeros gets scale 1; f32 subnormals the floor 2^-126. */
static void corners(void) {
    const kcfg g = {"contiguous 4, per token", 0, 4, 1, 1};
    cache c;
    tu_rng rng;
    tu_rng_init(&rng, 1);
    cache_init(&c, &g, 1, 1, 4, &rng, NAN);
    float x[4][4] = {{1.0f, INFINITY, -2.0f, -0.0f}, {0.0f, -0.0f, 0.0f, 0.0f}, {1e-40f, -3e-42f, 0.0f, 1e-45f},
                     {500.0f, -448.0f, 1.0f, NAN}};
    int32_t pos = 0;
    fattn_kv_append_args a = append_args(&c, &g, 1, 4, x, x, FATTN_DTYPE_F32, &pos);
    TU_EXPECT_OK(fattn_kv_append(g_ctx, &a));
    TU_CHECK(isinf(c.ks[0]) && c.ks[0] > 0, "Inf row: scale %g, want +Inf", (double)c.ks[0]);
    TU_CHECK(c.k[1] == 0x7F && c.k[0] == 0x00 && c.k[2] == 0x80 && c.k[3] == 0x80,
             "Inf row codes %02x %02x %02x %02x, want 00 7f 80 80", c.k[0], c.k[1], c.k[2], c.k[3]);
    TU_CHECK(c.ks[1] == 1.0f && c.k[4] == 0 && c.k[5] == 0x80, "zero row: scale %g, codes %02x %02x", (double)c.ks[1],
             c.k[4], c.k[5]);
    TU_CHECK(c.ks[2] == 0x1p-126f, "subnormal row: scale %a, want 2^-126", (double)c.ks[2]);
    TU_CHECK(c.ks[3] == ref_scale(500.0f) && c.k[15] == 0x7F && fattn_e4m3_to_f32(c.k[12]) == 448.0f,
             "row with 500 and NaN: scale %a, codes %02x .. %02x", (double)c.ks[3], c.k[12], c.k[15]);
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < 4; i++)
            TU_CHECK(c.k[r * 4 + i] == ref_code(x[r][i], c.ks[r]), "row %d element %d: code %02x, model %02x", r, i,
                     c.k[r * 4 + i], ref_code(x[r][i], c.ks[r]));
    cache_free(&c, 1);
}

int main(void) {
    const int seed = tu_seed();
    tu_rng rng;
    tu_rng_init(&rng, (uint64_t)seed);
    TU_EXPECT_OK(fattn_ctx_create(&g_ctx, FATTN_BACKEND_CPU, 0));

    /* the model's e4m3 against the library's conversion on a sweep of f32 values */
    {
        int bad = 0;
        for (int i = 0; i < 200000; i++) {
            const float f = (float)(tu_rng_normal(&rng) * ldexp(1.0, (int)(tu_rng_u64(&rng) % 40) - 20));
            if (code_of(ref_e4m3(f)) != fattn_f32_to_e4m3(f)) bad++;
        }
        TU_CHECK(bad == 0, "%d of 200000 values: the FP64 model of e4m3 rounding differs from fattn_f32_to_e4m3", bad);
    }
    corners();

    const kcfg cfgs[] = {
        {"paged 16, per token", 16, 64, 1, 1},
        {"paged 16, per page", 16, 64, 16, 16},
        {"paged 32, K per 8 rows, V per page", 32, 96, 8, 64},
        {"contiguous 60, per token", 0, 60, 1, 1},
        {"contiguous 60, per sequence", 0, 60, 60, 1000},
    };
    const fattn_dtype dts[] = {FATTN_DTYPE_BF16, FATTN_DTYPE_F16, FATTN_DTYPE_F32};
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++)
        for (size_t j = 0; j < 3; j++) {
            run_case(&rng, &cfgs[i], dts[j], 0);
            run_case(&rng, &cfgs[i], dts[j], 1);
        }
    refusals(&rng);

    printf("appends equal to the model, bytewise: %d; forwards against the FP64 oracle: %d; refusals: %d\n",
           g_appends, g_fwds, g_refusals);
    fattn_ctx_free(g_ctx);
    return tu_finish("test_cpu_kv8");
}
