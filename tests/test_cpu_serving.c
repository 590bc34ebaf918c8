/* test_cpu_serving.c - FlashAttention-3's serving arguments on the CPU engine
 * (fattn.h, fattn_fwd_args: seqused_q, cache_batch_idx, cache_batch,
 * cache_leftpad; cu_seqlens_q without cu_seqlens_k; fattn_bwd_args:
 * seqused_q, seqused_k), against the FP64 oracle:
 *   - the reference of each sequence is built by gathering the rows it uses
 *     (its first seqused_q queries, its keys leftpad .. end - 1 of cache
 *     entry cache_batch_idx[b], through the block table for a paged cache)
 *     and calling oracle_fwd / oracle_bwd on that one sequence, so the
 *     oracle needs no serving fields of its own;
 *   - every row and page that no sequence uses holds NaN, and the table
 *     entries of pages wholly outside a sequence's keys hold garbage:
 *     never read;
 *   - the rows of o, lse, dq, dk, dv past the used counts are checked
 *     untouched (their sentinel bits stay);
 *   - every refusal of the new fields says which field and writes nothing.
 * f32 tensors: the tolerances are the CPU engine's f32 accumulation. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/oracle.h"
#include "common/testutil.h"
#include "fattn.h"

static fattn_ctx *g_ctx;
static int g_cases, g_refusals;

#define O_SENTINEL 0x7fc0beefu /* a NaN whose payload fattn never writes */
#define LSE_SENTINEL 777.0f

static int imin(int a, int b) { return a < b ? a : b; }
static int cdiv(int a, int b) { return (a + b - 1) / b; }

static float f_nan(void) { return nanf(""); }

static float *falloc(size_t n) { return (float *)tu_malloc(sizeof(float) * (n ? n : 1)); }

/* n random normal values rounded to f32, in both forms */
static void fill(tu_rng *rng, float *f, size_t n) {
    for (size_t i = 0; i < n; i++) f[i] = (float)tu_rng_normal(rng);
}

static void fill_bits(float *f, size_t n, uint32_t bits) {
    for (size_t i = 0; i < n; i++) memcpy(&f[i], &bits, 4);
}

static int is_bits(float f, uint32_t bits) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u == bits;
}

static void to_double(const float *f, size_t n, double *d) {
    for (size_t i = 0; i < n; i++) d[i] = f[i];
}

/* ---- forward: one case ---------------------------------------------------- */

typedef struct scase {
    const char *name;
    int batch, hq, hkv, d, causal;
    int window, wl, wr;
    int sq;               /* fixed-length seqlen_q, or the max with qlens */
    const int32_t *qlens; /* NULL: fixed length; else varlen queries (cu_seqlens_q) */
    int sk;               /* cache rows per sequence (fixed), or the max with klens */
    const int32_t *klens; /* NULL: fixed-length keys; else cu_seqlens_k */
    int cache_batch;      /* fattn's field (0 = batch) */
    const int32_t *bidx, *leftpad, *used_k, *used_q;
    int page_size;        /* 0: contiguous */
} scase;

static int32_t *cu_of(const int32_t *lens, int batch) {
    int32_t *cu = (int32_t *)tu_malloc(sizeof(int32_t) * (size_t)(batch + 1));
    cu[0] = 0;
    for (int b = 0; b < batch; b++) cu[b + 1] = cu[b] + lens[b];
    return cu;
}

/* The rows sequence b uses: queries [0, qlen), keys [pad, end) of its row. */
typedef struct used {
    int qcount, qlen, kcount, pad, end;
} used;

static used used_of(const scase *c, int b) {
    used u;
    u.qcount = c->qlens ? c->qlens[b] : c->sq;
    u.qlen = c->used_q ? imin(c->used_q[b], u.qcount) : u.qcount;
    u.kcount = c->klens ? c->klens[b] : c->sk;
    u.end = c->used_k ? imin(c->used_k[b], u.kcount) : u.kcount;
    u.pad = c->leftpad ? c->leftpad[b] : 0;
    return u;
}

/* One sequence's reference: q rows [qlen][hq][d] and keys [klen][hkv][d] in
 * doubles; o [qlen][hq][d], lse [hq][qlen]. */
static void oracle_seq(const scase *c, int qlen, int klen, const double *q, const double *k, const double *v,
                       double *o, double *lse) {
    if (klen == 0) { /* no key: O = 0, LSE = -inf (fattn.h) */
        memset(o, 0, sizeof(double) * (size_t)qlen * c->hq * c->d);
        for (int i = 0; i < qlen * c->hq; i++) lse[i] = -INFINITY;
        return;
    }
    oracle_problem p;
    memset(&p, 0, sizeof p);
    p.batch = 1, p.seqlen_q = qlen, p.seqlen_k = klen, p.heads_q = c->hq, p.heads_kv = c->hkv;
    p.head_dim = p.head_dim_v = c->d;
    p.causal = c->causal;
    p.window = c->window, p.window_left = c->wl, p.window_right = c->wr;
    oracle_fwd(&p, q, k, v, o, lse);
}

static void run_fwd_case(tu_rng *rng, const scase *c) {
    const int B = c->batch, hq = c->hq, hkv = c->hkv, d = c->d;
    const size_t qrow = (size_t)hq * d, krow = (size_t)hkv * d;
    int32_t *cu_q = c->qlens ? cu_of(c->qlens, B) : NULL;
    int32_t *cu_k = c->klens ? cu_of(c->klens, B) : NULL;
    const int total_q = cu_q ? cu_q[B] : B * c->sq;
    const int nent = c->bidx ? (c->cache_batch ? c->cache_batch : B) : B;
    /* the logical cache: contiguous [nent][sk] rows, or packed cu_k rows;
     * paged: [B][sk] rows, scattered into the pool below */
    const int klog = cu_k ? cu_k[B] : nent * c->sk;
    float *q = falloc((size_t)total_q * qrow), *kl = falloc((size_t)klog * krow), *vl = falloc((size_t)klog * krow);
    fill(rng, q, (size_t)total_q * qrow);
    fill(rng, kl, (size_t)klog * krow);
    fill(rng, vl, (size_t)klog * krow);
    /* a row no sequence uses is NaN in what fattn reads */
    char *row_used = (char *)calloc((size_t)klog + 1, 1);
    for (int b = 0; b < B; b++) {
        const used u = used_of(c, b);
        const int base = cu_k ? cu_k[b] : (c->bidx ? c->bidx[b] : b) * c->sk;
        for (int j = u.pad; j < u.end; j++) row_used[base + j] = 1;
    }
    float *kt = kl, *vt = vl; /* what fattn reads */
    int32_t *table = NULL;
    int num_pages = 0, mpps = 0;
    if (c->page_size) {
        const int ps = c->page_size, npg = cdiv(c->sk, ps);
        mpps = npg;
        num_pages = B * npg + 2;
        int *perm = (int *)tu_malloc(sizeof(int) * (size_t)num_pages);
        for (int i = 0; i < num_pages; i++) perm[i] = i;
        for (int i = num_pages - 1; i > 0; i--) {
            int j = (int)(tu_rng_u64(rng) % (uint64_t)(i + 1)), x = perm[i];
            perm[i] = perm[j], perm[j] = x;
        }
        table = (int32_t *)tu_malloc(sizeof(int32_t) * (size_t)B * mpps);
        kt = falloc((size_t)num_pages * ps * krow);
        vt = falloc((size_t)num_pages * ps * krow);
        for (size_t i = 0; i < (size_t)num_pages * ps * krow; i++) kt[i] = vt[i] = f_nan();
        for (int b = 0; b < B; b++) {
            const used u = used_of(c, b);
            for (int i = 0; i < npg; i++) {
                const int read = (i + 1) * ps > u.pad && i * ps < u.end; /* holds a used key */
                table[b * mpps + i] = read ? perm[b * npg + i] : (i % 2 ? -3 : INT32_MAX);
                if (!read) continue;
                for (int r = 0; r < ps; r++) {
                    const int pos = i * ps + r;
                    if (pos < u.pad || pos >= u.end) continue;
                    const size_t src = ((size_t)b * c->sk + pos) * krow;
                    const size_t dst = ((size_t)perm[b * npg + i] * ps + r) * krow;
                    memcpy(kt + dst, kl + src, sizeof(float) * krow);
                    memcpy(vt + dst, vl + src, sizeof(float) * krow);
                }
            }
        }
        free(perm);
    } else {
        kt = falloc((size_t)klog * krow);
        vt = falloc((size_t)klog * krow);
        for (int r = 0; r < klog; r++)
            for (size_t t = 0; t < krow; t++) {
                kt[r * krow + t] = row_used[r] ? kl[r * krow + t] : f_nan();
                vt[r * krow + t] = row_used[r] ? vl[r * krow + t] : f_nan();
            }
    }
    /* queries past seqused_q are NaN too: never read */
    float *qt = falloc((size_t)total_q * qrow);
    memcpy(qt, q, sizeof(float) * (size_t)total_q * qrow);
    for (int b = 0; b < B; b++) {
        const used u = used_of(c, b);
        const int q0 = cu_q ? cu_q[b] : b * c->sq;
        for (int i = u.qlen; i < u.qcount; i++)
            for (size_t t = 0; t < qrow; t++) qt[(q0 + i) * qrow + t] = f_nan();
    }

    const size_t nlse = (size_t)total_q * hq;
    float *o = falloc((size_t)total_q * qrow), *lse = falloc(nlse);
    fill_bits(o, (size_t)total_q * qrow, O_SENTINEL);
    for (size_t i = 0; i < nlse; i++) lse[i] = LSE_SENTINEL;

    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = tu_problem(B, c->sq, c->sk, hq, hkv, d, 0, c->causal, cu_q, cu_k);
    a.p.window = c->window, a.p.window_left = c->wl, a.p.window_right = c->wr;
    a.q = fattn_tensor_bshd(qt, FATTN_DTYPE_F32);
    a.k = fattn_tensor_bshd(kt, FATTN_DTYPE_F32);
    a.v = fattn_tensor_bshd(vt, FATTN_DTYPE_F32);
    a.o = fattn_tensor_bshd(o, FATTN_DTYPE_F32);
    a.lse = lse;
    a.seqused_k = c->used_k;
    a.seqused_q = c->used_q;
    a.cache_batch_idx = c->bidx;
    a.cache_batch = c->cache_batch;
    a.cache_leftpad = c->leftpad;
    if (table) a.block_table = table, a.page_size = c->page_size, a.num_pages = num_pages, a.max_pages_per_seq = mpps;
    fattn_status st = fattn_fwd(g_ctx, &a);
    TU_CHECK(st == FATTN_OK, "%s: fattn_fwd: %s", c->name, fattn_last_error(g_ctx));

    double worst_o = 0.0, worst_lse = 0.0;
    int untouched_bad = 0;
    for (int b = 0; st == FATTN_OK && b < B; b++) {
        const used u = used_of(c, b);
        const int klen = u.end - u.pad, q0 = cu_q ? cu_q[b] : b * c->sq;
        const int kbase = cu_k ? cu_k[b] : (c->bidx ? c->bidx[b] : b) * c->sk;
        const int lbase = c->page_size ? b * c->sk : kbase; /* paged: logical rows of sequence b */
        double *qd = (double *)tu_malloc(sizeof(double) * ((size_t)u.qlen * qrow + 1));
        double *kd = (double *)tu_malloc(sizeof(double) * ((size_t)klen * krow + 1));
        double *vd = (double *)tu_malloc(sizeof(double) * ((size_t)klen * krow + 1));
        double *od = (double *)tu_malloc(sizeof(double) * ((size_t)u.qlen * qrow + 1));
        double *ld = (double *)tu_malloc(sizeof(double) * ((size_t)u.qlen * hq + 1));
        double *got = (double *)tu_malloc(sizeof(double) * ((size_t)u.qlen * qrow + 1));
        to_double(q + (size_t)q0 * qrow, (size_t)u.qlen * qrow, qd);
        to_double(kl + (size_t)(lbase + u.pad) * krow, (size_t)klen * krow, kd);
        to_double(vl + (size_t)(lbase + u.pad) * krow, (size_t)klen * krow, vd);
        oracle_seq(c, u.qlen, klen, qd, kd, vd, od, ld);
        to_double(o + (size_t)q0 * qrow, (size_t)u.qlen * qrow, got);
        double e = tu_max_abs_err(got, od, (size_t)u.qlen * qrow);
        if (e > worst_o) worst_o = e;
        for (int h = 0; h < hq; h++)
            for (int i = 0; i < u.qcount; i++) {
                const size_t li = cu_q ? (size_t)h * total_q + q0 + i : ((size_t)b * hq + h) * c->sq + i;
                if (i < u.qlen) {
                    const double want = ld[h * u.qlen + i], have = lse[li];
                    const double el = want == -INFINITY ? (have == -INFINITY ? 0.0 : INFINITY) : fabs(have - want);
                    if (!(el <= worst_lse)) worst_lse = el;
                } else {
                    untouched_bad += lse[li] != LSE_SENTINEL;
                    for (int t = 0; t < d; t++) untouched_bad += !is_bits(o[(size_t)(q0 + i) * qrow + h * d + t], O_SENTINEL);
                }
            }
        free(qd), free(kd), free(vd), free(od), free(ld), free(got);
    }
    char what[160];
    snprintf(what, sizeof what, "%s: O max abs err", c->name);
    TU_EXPECT_LE(worst_o, 2e-5, what);
    snprintf(what, sizeof what, "%s: LSE max abs err", c->name);
    TU_EXPECT_LE(worst_lse, 2e-5, what);
    TU_CHECK(untouched_bad == 0, "%s: %d values of o/lse past seqused_q were written", c->name, untouched_bad);
    g_cases++;

    free(q), free(kl), free(vl), free(qt), free(o), free(lse), free(row_used), free(table);
    free(kt), free(vt), free(cu_q), free(cu_k);
}

static void check_forward(tu_rng *rng) {
    /* each field alone */
    {
        const int32_t used_q[] = {3, 0, 7, 5};
        scase c = {"seqused_q, fixed-length", 4, 4, 2, 32, 1, 0, 0, 0, 7, NULL, 20, NULL, 0,
                   NULL, NULL, NULL, used_q, 0};
        run_fwd_case(rng, &c);
        c.name = "seqused_q, fixed-length, not causal";
        c.causal = 0;
        run_fwd_case(rng, &c);
    }
    {
        const int32_t qlens[] = {5, 0, 9, 3}, used_q[] = {2, 0, 9, 100};
        scase c = {"seqused_q, varlen queries", 4, 4, 1, 32, 1, 0, 0, 0, 9, qlens, 33, NULL, 0,
                   NULL, NULL, NULL, used_q, 0};
        run_fwd_case(rng, &c);
    }
    {
        const int32_t bidx[] = {4, 0, 2, 0}; /* permuted, repeated, entries 1 and 3 unused */
        scase c = {"cache_batch_idx permuted (cache_batch 5)", 4, 4, 2, 32, 1, 0, 0, 0, 3, NULL, 40, NULL, 5,
                   bidx, NULL, NULL, NULL, 0};
        run_fwd_case(rng, &c);
        const int32_t bidx2[] = {3, 2, 1, 0};
        scase c2 = {"cache_batch_idx reversed (cache_batch 0 = batch)", 4, 2, 2, 16, 0, 0, 0, 0, 5, NULL, 17, NULL,
                    0, bidx2, NULL, NULL, NULL, 0};
        run_fwd_case(rng, &c2);
    }
    {
        const int32_t pad[] = {0, 5, 19, 20};
        scase c = {"cache_leftpad, causal", 4, 4, 2, 32, 1, 0, 0, 0, 4, NULL, 20, NULL, 0,
                   NULL, pad, NULL, NULL, 0};
        run_fwd_case(rng, &c);
        c.name = "cache_leftpad, window (3, 1)";
        c.causal = 0, c.window = 1, c.wl = 3, c.wr = 1;
        run_fwd_case(rng, &c);
    }
    {
        const int32_t qlens[] = {4, 1, 0, 17, 2};
        scase c = {"varlen queries on a contiguous cache", 5, 6, 2, 32, 1, 0, 0, 0, 17, qlens, 30, NULL, 0,
                   NULL, NULL, NULL, NULL, 0};
        run_fwd_case(rng, &c);
    }
    /* combined */
    {
        const int32_t pad[] = {2, 0, 11, 30}, used_k[] = {25, 3, 40, 30};
        scase c = {"leftpad + seqused_k + causal", 4, 4, 2, 32, 1, 0, 0, 0, 5, NULL, 40, NULL, 0,
                   NULL, pad, used_k, NULL, 0};
        run_fwd_case(rng, &c);
        c.name = "leftpad + seqused_k + causal, paged 16";
        c.page_size = 16;
        run_fwd_case(rng, &c);
        c.name = "leftpad + seqused_k + causal, paged 1";
        c.page_size = 1;
        run_fwd_case(rng, &c);
    }
    {
        const int32_t qlens[] = {3, 1, 12, 0, 6}, used_k[] = {50, 1, 64, 10, 0};
        scase c = {"varlen queries on a paged cache (16), seqused_k", 5, 8, 2, 64, 1, 0, 0, 0, 12, qlens, 64, NULL,
                   0, NULL, NULL, used_k, NULL, 16};
        run_fwd_case(rng, &c);
        const int32_t pad[] = {7, 0, 33, 10, 0}, used_q[] = {2, 1, 5, 0, 6};
        c.name = "varlen queries, paged (16), seqused_k, leftpad, seqused_q";
        c.leftpad = pad, c.used_q = used_q;
        run_fwd_case(rng, &c);
        c.name = "varlen queries, paged (64), seqused_k, leftpad, seqused_q, not causal";
        c.page_size = 64, c.causal = 0;
        run_fwd_case(rng, &c);
        /* small pages (the CUDA engine gathers 1, 3 and 4 row by row, and
         * takes 8 in TMA boxes of one swizzle atom) */
        static const int small_pages[] = {1, 3, 4, 8};
        c.leftpad = NULL, c.used_q = NULL, c.causal = 1;
        for (int i = 0; i < 4; i++) {
            char name[64];
            snprintf(name, sizeof name, "varlen queries on a paged cache (%d), seqused_k", small_pages[i]);
            c.name = name, c.page_size = small_pages[i];
            run_fwd_case(rng, &c);
        }
    }
    {
        const int32_t bidx[] = {1, 1, 0}, pad[] = {4, 0, 9}, used_k[] = {20, 8, 9}, used_q[] = {1, 3, 2};
        const int32_t qlens[] = {2, 3, 4};
        scase c = {"cache_batch_idx + leftpad + seqused_k + seqused_q + varlen queries", 3, 4, 4, 32, 1, 0, 0, 0,
                   4, qlens, 24, NULL, 2, bidx, pad, used_k, used_q, 0};
        run_fwd_case(rng, &c);
    }
    {
        const int32_t qlens[] = {3, 6, 2}, klens[] = {10, 7, 30}, pad[] = {2, 7, 5}, used_k[] = {9, 7, 28};
        scase c = {"cu_seqlens_q/k + leftpad + seqused_k", 3, 2, 1, 32, 1, 0, 0, 0, 6, qlens, 30, klens, 0,
                   NULL, pad, used_k, NULL, 0};
        run_fwd_case(rng, &c);
    }
}

/* ---- backward: seqused_q, seqused_k --------------------------------------- */

typedef struct bcase {
    const char *name;
    int batch, hq, hkv, d, causal;
    int sq;
    const int32_t *qlens;
    int sk;
    const int32_t *klens;
    const int32_t *used_q, *used_k;
} bcase;

static void run_bwd_case(tu_rng *rng, const bcase *c) {
    const int B = c->batch, hq = c->hq, hkv = c->hkv, d = c->d;
    const size_t qrow = (size_t)hq * d, krow = (size_t)hkv * d;
    int32_t *cu_q = c->qlens ? cu_of(c->qlens, B) : NULL;
    int32_t *cu_k = c->klens ? cu_of(c->klens, B) : NULL;
    const int tq = cu_q ? cu_q[B] : B * c->sq, tk = cu_k ? cu_k[B] : B * c->sk;
    float *q = falloc((size_t)tq * qrow), *dout = falloc((size_t)tq * qrow), *k = falloc((size_t)tk * krow),
          *v = falloc((size_t)tk * krow);
    fill(rng, q, (size_t)tq * qrow);
    fill(rng, dout, (size_t)tq * qrow);
    fill(rng, k, (size_t)tk * krow);
    fill(rng, v, (size_t)tk * krow);
    /* rows past the used counts are NaN: never read */
    for (int b = 0; b < B; b++) {
        const int qc = c->qlens ? c->qlens[b] : c->sq, kc = c->klens ? c->klens[b] : c->sk;
        const int q0 = cu_q ? cu_q[b] : b * c->sq, k0 = cu_k ? cu_k[b] : b * c->sk;
        for (int i = imin(c->used_q ? c->used_q[b] : qc, qc); i < qc; i++)
            for (size_t t = 0; t < qrow; t++) q[(q0 + i) * qrow + t] = dout[(q0 + i) * qrow + t] = f_nan();
        for (int j = imin(c->used_k ? c->used_k[b] : kc, kc); j < kc; j++)
            for (size_t t = 0; t < krow; t++) k[(k0 + j) * krow + t] = v[(k0 + j) * krow + t] = f_nan();
    }
    float *o = falloc((size_t)tq * qrow), *lse = falloc((size_t)tq * hq);
    float *dq = falloc((size_t)tq * qrow), *dk = falloc((size_t)tk * krow), *dv = falloc((size_t)tk * krow);
    for (size_t i = 0; i < (size_t)tq * qrow; i++) o[i] = f_nan();
    for (size_t i = 0; i < (size_t)tq * hq; i++) lse[i] = f_nan();
    fill_bits(dq, (size_t)tq * qrow, O_SENTINEL);
    fill_bits(dk, (size_t)tk * krow, O_SENTINEL);
    fill_bits(dv, (size_t)tk * krow, O_SENTINEL);

    fattn_fwd_args f;
    memset(&f, 0, sizeof f);
    f.p = tu_problem(B, c->sq, c->sk, hq, hkv, d, 0, c->causal, cu_q, cu_k);
    f.q = fattn_tensor_bshd(q, FATTN_DTYPE_F32);
    f.k = fattn_tensor_bshd(k, FATTN_DTYPE_F32);
    f.v = fattn_tensor_bshd(v, FATTN_DTYPE_F32);
    f.o = fattn_tensor_bshd(o, FATTN_DTYPE_F32);
    f.lse = lse;
    f.seqused_q = c->used_q;
    f.seqused_k = c->used_k;
    TU_EXPECT_OK(fattn_fwd(g_ctx, &f));
    fattn_bwd_args a;
    memset(&a, 0, sizeof a);
    a.p = f.p;
    a.q = f.q, a.k = f.k, a.v = f.v, a.o = f.o;
    a.dout = fattn_tensor_bshd(dout, FATTN_DTYPE_F32);
    a.dq = fattn_tensor_bshd(dq, FATTN_DTYPE_F32);
    a.dk = fattn_tensor_bshd(dk, FATTN_DTYPE_F32);
    a.dv = fattn_tensor_bshd(dv, FATTN_DTYPE_F32);
    a.lse = lse;
    a.seqused_q = c->used_q;
    a.seqused_k = c->used_k;
    fattn_status st = fattn_bwd(g_ctx, &a);
    TU_CHECK(st == FATTN_OK, "%s: fattn_bwd: %s", c->name, fattn_last_error(g_ctx));

    double worst[3] = {0, 0, 0};
    int untouched_bad = 0;
    for (int b = 0; st == FATTN_OK && b < B; b++) {
        const int qc = c->qlens ? c->qlens[b] : c->sq, kc = c->klens ? c->klens[b] : c->sk;
        const int q0 = cu_q ? cu_q[b] : b * c->sq, k0 = cu_k ? cu_k[b] : b * c->sk;
        const int qlen = imin(c->used_q ? c->used_q[b] : qc, qc), klen = imin(c->used_k ? c->used_k[b] : kc, kc);
        const size_t nq = (size_t)qlen * qrow, nk = (size_t)klen * krow;
        double *qd = (double *)tu_malloc(sizeof(double) * (nq + 1)), *dod = (double *)tu_malloc(sizeof(double) * (nq + 1));
        double *kd = (double *)tu_malloc(sizeof(double) * (nk + 1)), *vd = (double *)tu_malloc(sizeof(double) * (nk + 1));
        double *rq = (double *)tu_malloc(sizeof(double) * (nq + 1)), *rk = (double *)tu_malloc(sizeof(double) * (nk + 1));
        double *rv = (double *)tu_malloc(sizeof(double) * (nk + 1)), *got = (double *)tu_malloc(sizeof(double) * (nq + nk + 1));
        to_double(q + (size_t)q0 * qrow, nq, qd);
        to_double(dout + (size_t)q0 * qrow, nq, dod);
        to_double(k + (size_t)k0 * krow, nk, kd);
        to_double(v + (size_t)k0 * krow, nk, vd);
        if (qlen > 0 && klen > 0) {
            oracle_problem p;
            memset(&p, 0, sizeof p);
            p.batch = 1, p.seqlen_q = qlen, p.seqlen_k = klen, p.heads_q = hq, p.heads_kv = hkv;
            p.head_dim = p.head_dim_v = d;
            p.causal = c->causal;
            oracle_bwd(&p, qd, kd, vd, dod, rq, rk, rv);
        } else {
            memset(rq, 0, sizeof(double) * (nq + 1));
            memset(rk, 0, sizeof(double) * (nk + 1));
            memset(rv, 0, sizeof(double) * (nk + 1));
        }
        to_double(dq + (size_t)q0 * qrow, nq, got);
        double e = tu_max_abs_err(got, rq, nq);
        if (!(e <= worst[0])) worst[0] = e;
        to_double(dk + (size_t)k0 * krow, nk, got);
        e = tu_max_abs_err(got, rk, nk);
        if (!(e <= worst[1])) worst[1] = e;
        to_double(dv + (size_t)k0 * krow, nk, got);
        e = tu_max_abs_err(got, rv, nk);
        if (!(e <= worst[2])) worst[2] = e;
        for (size_t t = (size_t)(q0 + qlen) * qrow; t < (size_t)(q0 + qc) * qrow; t++)
            untouched_bad += !is_bits(dq[t], O_SENTINEL);
        for (size_t t = (size_t)(k0 + klen) * krow; t < (size_t)(k0 + kc) * krow; t++)
            untouched_bad += !is_bits(dk[t], O_SENTINEL) + !is_bits(dv[t], O_SENTINEL);
        free(qd), free(dod), free(kd), free(vd), free(rq), free(rk), free(rv), free(got);
    }
    const char *names[3] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; i++) {
        char what[160];
        snprintf(what, sizeof what, "%s: %s max abs err", c->name, names[i]);
        TU_EXPECT_LE(worst[i], 1e-4, what);
    }
    TU_CHECK(untouched_bad == 0, "%s: %d values of dq/dk/dv past seqused were written", c->name, untouched_bad);
    g_cases++;
    free(q), free(dout), free(k), free(v), free(o), free(lse), free(dq), free(dk), free(dv), free(cu_q), free(cu_k);
}

static void check_backward(tu_rng *rng) {
    const int32_t uq[] = {5, 0, 70, 1}, uk[] = {9, 3, 80, 0};
    bcase c = {"bwd seqused_q + seqused_k, fixed-length, causal", 4, 4, 2, 32, 1, 70, NULL, 80, NULL, uq, uk};
    run_bwd_case(rng, &c);
    c.name = "bwd seqused_q + seqused_k, fixed-length, not causal";
    c.causal = 0;
    run_bwd_case(rng, &c);
    c.name = "bwd seqused_q alone";
    c.used_k = NULL;
    run_bwd_case(rng, &c);
    c.name = "bwd seqused_k alone, causal";
    c.used_k = uk, c.used_q = NULL, c.causal = 1;
    run_bwd_case(rng, &c);
    const int32_t qlens[] = {6, 70, 2, 9}, klens[] = {9, 100, 1, 4}, uq2[] = {3, 65, 2, 0}, uk2[] = {9, 66, 0, 2};
    bcase v = {"bwd varlen, seqused_q + seqused_k, causal", 4, 2, 1, 32, 1, 70, qlens, 100, klens, uq2, uk2};
    run_bwd_case(rng, &v);
    bcase w = {"bwd varlen queries, fixed-length keys, seqused_q + seqused_k", 4, 2, 2, 32, 1, 70, qlens, 50, NULL,
               uq2, uk};
    run_bwd_case(rng, &w);
}

/* ---- refusals --------------------------------------------------------------- */

/* A small valid forward: batch 2, seqlen_q 3, cache rows 8, f32, the fields
 * below set per refusal. */
typedef struct small {
    float q[2 * 3 * 2 * 16], k[4 * 8 * 2 * 16], v[4 * 8 * 2 * 16], o[2 * 3 * 2 * 16], lse[2 * 2 * 3];
    int32_t cu_q[3], cu_k[3], table[2 * 2];
} small;

static fattn_fwd_args small_args(small *s) {
    for (size_t i = 0; i < sizeof s->q / 4; i++) s->q[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < sizeof s->k / 4; i++) s->k[i] = s->v[i] = (float)(i % 5) * 0.1f;
    fill_bits(s->o, sizeof s->o / 4, O_SENTINEL);
    for (size_t i = 0; i < sizeof s->lse / 4; i++) s->lse[i] = LSE_SENTINEL;
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = tu_problem(2, 3, 8, 2, 2, 16, 0, 1, NULL, NULL);
    a.q = fattn_tensor_bshd(s->q, FATTN_DTYPE_F32);
    a.k = fattn_tensor_bshd(s->k, FATTN_DTYPE_F32);
    a.v = fattn_tensor_bshd(s->v, FATTN_DTYPE_F32);
    a.o = fattn_tensor_bshd(s->o, FATTN_DTYPE_F32);
    a.lse = s->lse;
    return a;
}

static void expect_refused(const char *what, fattn_fwd_args *a, small *s, fattn_status want, const char *field) {
    fattn_status st = fattn_fwd(g_ctx, a);
    const char *msg = fattn_last_error(g_ctx);
    TU_CHECK(st == want, "%s: status %d (%s), want %d: %s", what, (int)st, fattn_status_string(st), (int)want, msg);
    TU_CHECK(strstr(msg, field) != NULL, "%s: the message does not name %s: %s", what, field, msg);
    int bad = 0;
    for (size_t i = 0; i < sizeof s->o / 4; i++) bad += !is_bits(s->o[i], O_SENTINEL);
    for (size_t i = 0; i < sizeof s->lse / 4; i++) bad += s->lse[i] != LSE_SENTINEL;
    TU_CHECK(bad == 0, "%s: refused, but %d values of o/lse were written", what, bad);
    g_refusals++;
}

static void check_refusals(void) {
    small s;
    fattn_fwd_args a;
    {
        const int32_t neg[] = {1, -1};
        a = small_args(&s), a.seqused_q = neg;
        expect_refused("seqused_q negative", &a, &s, FATTN_ERROR_INVALID_ARGUMENT, "seqused_q[1]");
        a = small_args(&s), a.seqused_k = neg;
        expect_refused("seqused_k negative", &a, &s, FATTN_ERROR_INVALID_ARGUMENT, "seqused_k[1]");
        a = small_args(&s), a.cache_batch_idx = neg;
        expect_refused("cache_batch_idx negative", &a, &s, FATTN_ERROR_INVALID_ARGUMENT, "cache_batch_idx[1]");
        a = small_args(&s), a.cache_leftpad = neg;
        expect_refused("cache_leftpad negative", &a, &s, FATTN_ERROR_INVALID_ARGUMENT, "cache_leftpad[1]");
    }
    {
        const int32_t idx[] = {0, 2};
        a = small_args(&s), a.cache_batch_idx = idx;
        expect_refused("cache_batch_idx past batch", &a, &s, FATTN_ERROR_INVALID_ARGUMENT, "cache_batch_idx[1]");
        a = small_args(&s), a.cache_batch_idx = idx, a.cache_batch = 2;
        expect_refused("cache_batch_idx past cache_batch", &a, &s, FATTN_ERROR_INVALID_ARGUMENT, "cache_batch");
        a = small_args(&s), a.cache_batch = 3;
        expect_refused("cache_batch without cache_batch_idx", &a, &s, FATTN_ERROR_INVALID_ARGUMENT, "cache_batch");
        const int32_t ok[] = {3, 0};
        a = small_args(&s), a.cache_batch_idx = ok, a.cache_batch = -1;
        expect_refused("cache_batch negative", &a, &s, FATTN_ERROR_INVALID_ARGUMENT, "cache_batch");
        /* k and v hold 4 entries: cache_batch 4 and an index of 3 are accepted */
        a = small_args(&s), a.cache_batch_idx = ok, a.cache_batch = 4;
        TU_EXPECT_OK(fattn_fwd(g_ctx, &a));
        s.table[0] = 0, s.table[1] = 1, s.table[2] = 2, s.table[3] = 3;
        a = small_args(&s), a.cache_batch_idx = ok, a.block_table = s.table, a.page_size = 4, a.num_pages = 8,
        a.max_pages_per_seq = 2;
        expect_refused("cache_batch_idx with block_table", &a, &s, FATTN_ERROR_INVALID_ARGUMENT, "cache_batch_idx");
        s.cu_q[0] = 0, s.cu_q[1] = 3, s.cu_q[2] = 6, s.cu_k[0] = 0, s.cu_k[1] = 8, s.cu_k[2] = 16;
        a = small_args(&s), a.cache_batch_idx = ok, a.p.cu_seqlens_q = s.cu_q, a.p.cu_seqlens_k = s.cu_k;
        expect_refused("cache_batch_idx with cu_seqlens_k", &a, &s, FATTN_ERROR_INVALID_ARGUMENT, "cu_seqlens_k");
    }
    {
        const int32_t pad[] = {0, 9}, pad2[] = {6, 0}, used[] = {5, 8};
        a = small_args(&s), a.cache_leftpad = pad;
        expect_refused("cache_leftpad past the cache", &a, &s, FATTN_ERROR_INVALID_ARGUMENT, "cache_leftpad[1]");
        a = small_args(&s), a.cache_leftpad = pad2, a.seqused_k = used;
        expect_refused("cache_leftpad past seqused_k", &a, &s, FATTN_ERROR_INVALID_ARGUMENT, "cache_leftpad[0]");
        /* a bad table entry in a page the left pad skips is not read; one in a
         * page it reads is refused */
        const int32_t pad4[] = {4, 4};
        s.table[0] = -1, s.table[1] = 1, s.table[2] = 99, s.table[3] = 3;
        a = small_args(&s), a.cache_leftpad = pad4, a.block_table = s.table, a.page_size = 4, a.num_pages = 8,
        a.max_pages_per_seq = 2;
        TU_EXPECT_OK(fattn_fwd(g_ctx, &a));
        const int32_t pad3[] = {4, 3};
        a = small_args(&s), a.cache_leftpad = pad3, a.block_table = s.table, a.page_size = 4, a.num_pages = 8,
        a.max_pages_per_seq = 2;
        expect_refused("block_table entry in a page past the left pad", &a, &s, FATTN_ERROR_INVALID_ARGUMENT,
                       "block_table[1][0]");
    }
    {
        a = small_args(&s), a.p.cu_seqlens_k = s.cu_k;
        expect_refused("cu_seqlens_k without cu_seqlens_q", &a, &s, FATTN_ERROR_INVALID_ARGUMENT, "cu_seqlens_q");
        s.table[0] = 0, s.table[1] = 1, s.table[2] = 2, s.table[3] = 3;
        a = small_args(&s), a.p.cu_seqlens_q = s.cu_q, a.p.cu_seqlens_k = s.cu_k, a.block_table = s.table,
        a.page_size = 4, a.num_pages = 8, a.max_pages_per_seq = 2;
        expect_refused("block_table with cu_seqlens_k", &a, &s, FATTN_ERROR_UNSUPPORTED, "cu_seqlens_k");
        a = small_args(&s), a.p.cu_seqlens_q = s.cu_q, a.p.total_k = 16;
        expect_refused("total_k without cu_seqlens_k", &a, &s, FATTN_ERROR_INVALID_ARGUMENT, "total_k");
        a = small_args(&s), a.seqused_q = (const int32_t *)((const char *)s.cu_q + 1);
        expect_refused("seqused_q misaligned", &a, &s, FATTN_ERROR_INVALID_ARGUMENT, "seqused_q");
        a = small_args(&s), a.cache_leftpad = (const int32_t *)((const char *)s.cu_q + 2);
        expect_refused("cache_leftpad misaligned", &a, &s, FATTN_ERROR_INVALID_ARGUMENT, "cache_leftpad");
        a = small_args(&s), a.cache_batch_idx = (const int32_t *)((const char *)s.cu_q + 1);
        expect_refused("cache_batch_idx misaligned", &a, &s, FATTN_ERROR_INVALID_ARGUMENT, "cache_batch_idx");
        /* an array that overlaps the output */
        a = small_args(&s), a.cache_leftpad = (const int32_t *)s.o;
        expect_refused("cache_leftpad overlapping o", &a, &s, FATTN_ERROR_INVALID_ARGUMENT, "cache_leftpad");
    }
    {
        const int32_t used[] = {1, 2};
        a = small_args(&s), a.seqused_q = used;
        fattn_status st = fattn_fwd_fp8(g_ctx, &a, NULL);
        TU_CHECK(st == FATTN_ERROR_UNSUPPORTED && strstr(fattn_last_error(g_ctx), "seqused_q"),
                 "fattn_fwd_fp8 with seqused_q: %d %s", (int)st, fattn_last_error(g_ctx));
        int bad = 0;
        for (size_t i = 0; i < sizeof s.o / 4; i++) bad += !is_bits(s.o[i], O_SENTINEL);
        TU_CHECK(bad == 0, "fattn_fwd_fp8 with seqused_q: refused, but %d values of o were written", bad);
        g_refusals++;
    }
    /* the backward's */
    {
        float dq[sizeof s.q / 4], dk[sizeof s.k / 4], dv[sizeof s.v / 4], dout[sizeof s.o / 4];
        const int32_t neg[] = {-2, 1};
        for (int which = 0; which < 2; which++) {
            a = small_args(&s);
            for (size_t i = 0; i < sizeof dout / 4; i++) dout[i] = 0.5f;
            fill_bits(dq, sizeof dq / 4, O_SENTINEL);
            fill_bits(dk, sizeof dk / 4, O_SENTINEL);
            fill_bits(dv, sizeof dv / 4, O_SENTINEL);
            fattn_bwd_args b;
            memset(&b, 0, sizeof b);
            b.p = tu_problem(2, 3, 8, 2, 2, 16, 0, 1, NULL, NULL);
            b.q = a.q, b.k = a.k, b.v = a.v, b.o = a.o, b.lse = s.lse;
            b.dout = fattn_tensor_bshd(dout, FATTN_DTYPE_F32);
            b.dq = fattn_tensor_bshd(dq, FATTN_DTYPE_F32);
            b.dk = fattn_tensor_bshd(dk, FATTN_DTYPE_F32);
            b.dv = fattn_tensor_bshd(dv, FATTN_DTYPE_F32);
            if (which) b.seqused_k = neg;
            else b.seqused_q = neg;
            fattn_status st = fattn_bwd(g_ctx, &b);
            const char *field = which ? "seqused_k[0]" : "seqused_q[0]";
            TU_CHECK(st == FATTN_ERROR_INVALID_ARGUMENT && strstr(fattn_last_error(g_ctx), field),
                     "bwd %s negative: %d %s", field, (int)st, fattn_last_error(g_ctx));
            int bad = 0;
            for (size_t i = 0; i < sizeof dq / 4; i++) bad += !is_bits(dq[i], O_SENTINEL);
            for (size_t i = 0; i < sizeof dk / 4; i++) bad += !is_bits(dk[i], O_SENTINEL) + !is_bits(dv[i], O_SENTINEL);
            TU_CHECK(bad == 0, "bwd %s negative: %d values written", field, bad);
            g_refusals++;
        }
    }
    /* zero-initialised new fields keep 0.3's behaviour: covered by every
     * other test; here one explicit call */
    a = small_args(&s);
    TU_EXPECT_OK(fattn_fwd(g_ctx, &a));
}

int main(void) {
    tu_rng rng;
    tu_rng_init(&rng, (uint64_t)tu_seed());
    TU_EXPECT_OK(fattn_ctx_create(&g_ctx, FATTN_BACKEND_CPU, 0));
    if (!g_ctx) return 1;
    check_forward(&rng);
    check_backward(&rng);
    check_refusals();
    printf("serving cases against the FP64 oracle: %d; refusals: %d\n", g_cases, g_refusals);
    fattn_ctx_free(g_ctx);
    return tu_finish("test_cpu_serving");
}
