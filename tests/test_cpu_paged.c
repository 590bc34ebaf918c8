/* test_cpu_paged.c - fattn_fwd's serving fields on the CPU engine
 * (fattn.h, fattn_fwd_args: seqused_k, block_table, page_size, num_pages,
 * max_pages_per_seq):
 *   - a paged KV cache (pages 1, 3, 8, 16, 48, 64, 256 rows, in shuffled order, some
 *     shared by two sequences, unused pages and the rows past seqlen_k
 *     poisoned with NaN, table entries past the used pages garbage) gives
 *     bitwise the O and LSE of the same keys in a contiguous cache, every
 *     dtype, causal or not, packed and BHSD-ordered pools;
 *   - seqused_k (0, 1, seqlen_k, more than seqlen_k, between) gives bitwise
 *     the O and LSE of one call per sequence with seqlen_k cut to its used
 *     count, contiguous and paged, with and without cu_seqlens (the keys
 *     past the used count are NaN: never read);
 *   - every refusal of the fields (api.c, the CPU engine's host check,
 *     fattn_fwd_fp8) leaves o and lse as they were.
 * The CPU engine packs each block of keys into the same f32 scratch rows
 * whatever cache they come from, so the results are expected bitwise
 * equal, not within a tolerance. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/testutil.h"
#include "fattn.h"
#include "internal.h" /* struct fattn_ctx, for a CUDA context faked without a GPU */

static fattn_ctx *g_ctx;

static int imin(int a, int b) { return a < b ? a : b; }
static int cdiv(int a, int b) { return (a + b - 1) / b; }

static void fill_random(tu_rng *rng, tu_tensor *t) {
    double *x = (double *)tu_malloc(sizeof(double) * (t->count + 1));
    tu_fill_normal(rng, x, t->count);
    tu_tensor_set(t, x, NULL);
    free(x);
}

static size_t elem_off(const fattn_tensor *t, int64_t b, int64_t s, int64_t h) {
    return (size_t)(b * t->stride_batch + s * t->stride_seq + h * t->stride_head) *
           fattn_dtype_size(t->dtype);
}

/* Rows s0 .. s1 - 1 of batch entry b, every head, set to 0xFF bytes (NaN in
 * every float format, NaN for e4m3 too). */
static void poison_rows(tu_tensor *t, int b, int s0, int s1) {
    const size_t es = fattn_dtype_size(t->t.dtype);
    for (int s = s0; s < s1; s++)
        for (int h = 0; h < t->heads; h++)
            memset((char *)t->t.data + elem_off(&t->t, b, s, h), 0xFF, es * (size_t)t->dim);
}

/* ---- a KV cache, paged and contiguous -------------------------------------- */

typedef struct cache {
    int batch, seqlen_k, heads, d, page_size, npg, mpps, num_pages;
    tu_tensor kp, vp; /* page pools [num_pages, page_size, heads, d] */
    tu_tensor kc, vc; /* the same keys, contiguous [batch, seqlen_k, heads, d] */
    int32_t *table;   /* [batch][mpps] */
} cache;

/* Pools of random keys; the table gives sequence b pages of a random
 * permutation, then shares page 0 of sequence 0 with sequence 1 and page 1
 * of sequence 1 with sequence 2 (the pages they replace are unused, and
 * three more never are).  Unused pages and the rows past seqlen_k of each
 * last page are NaN; the table's last column (one past the pages needed)
 * holds garbage.  The contiguous copy is gathered through the table.  e4m3
 * scale blocks (scale_block rows, a divisor of page_size) are gathered with
 * the rows. */
static void cache_make(cache *c, tu_rng *rng, fattn_dtype dt, int batch, int sk, int heads, int d,
                       int ps, tu_layout pool_layout, int scale_block) {
    memset(c, 0, sizeof *c);
    c->batch = batch, c->seqlen_k = sk, c->heads = heads, c->d = d, c->page_size = ps;
    c->npg = cdiv(sk, ps);
    c->mpps = c->npg + 1;
    c->num_pages = batch * c->npg + 3;
    const int np = c->num_pages;
    int *perm = (int *)tu_malloc(sizeof(int) * (size_t)np);
    for (int i = 0; i < np; i++) perm[i] = i;
    for (int i = np - 1; i > 0; i--) {
        int j = (int)(tu_rng_u64(rng) % (uint64_t)(i + 1)), x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    c->table = (int32_t *)tu_malloc(sizeof(int32_t) * (size_t)batch * c->mpps);
    for (int b = 0; b < batch; b++) {
        for (int i = 0; i < c->npg; i++) c->table[b * c->mpps + i] = perm[b * c->npg + i];
        c->table[b * c->mpps + c->npg] = b % 2 ? -7 : INT32_MAX;
    }
    if (batch >= 2) c->table[1 * c->mpps + 0] = c->table[0];
    if (batch >= 3 && c->npg >= 2) c->table[2 * c->mpps + 1] = c->table[1 * c->mpps + 1];
    free(perm);

    const int sb = dt == FATTN_DTYPE_E4M3 ? scale_block : 1;
    if (ps % sb != 0) {
        fprintf(stderr, "cache_make: scale block %d does not divide page size %d\n", sb, ps);
        exit(1);
    }
    tu_tensor_alloc(&c->kp, dt, np, ps, heads, d, pool_layout, sb);
    tu_tensor_alloc(&c->vp, dt, np, ps, heads, d, pool_layout, sb);
    fill_random(rng, &c->kp);
    fill_random(rng, &c->vp);
    char *used = (char *)calloc((size_t)np, 1);
    for (int b = 0; b < batch; b++)
        for (int i = 0; i < c->npg; i++) used[c->table[b * c->mpps + i]] = 1;
    for (int pg = 0; pg < np; pg++)
        if (!used[pg]) poison_rows(&c->kp, pg, 0, ps), poison_rows(&c->vp, pg, 0, ps);
    free(used);
    /* a shared page sits at the same index of both sequences, so a last
     * page is the last one of every sequence that has it */
    for (int b = 0; b < batch; b++) {
        const int last = c->table[b * c->mpps + c->npg - 1];
        poison_rows(&c->kp, last, sk - (c->npg - 1) * ps, ps);
        poison_rows(&c->vp, last, sk - (c->npg - 1) * ps, ps);
    }

    tu_tensor_alloc(&c->kc, dt, batch, sk, heads, d, TU_BSHD, sb);
    tu_tensor_alloc(&c->vc, dt, batch, sk, heads, d, TU_BSHD, sb);
    const size_t row_bytes = fattn_dtype_size(dt) * (size_t)d;
    const int nbc = cdiv(sk, sb), nbp = cdiv(ps, sb);
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < sk; j++) {
            const int pg = c->table[b * c->mpps + j / ps], r = j % ps;
            for (int h = 0; h < heads; h++) {
                memcpy((char *)c->kc.t.data + elem_off(&c->kc.t, b, j, h),
                       (char *)c->kp.t.data + elem_off(&c->kp.t, pg, r, h), row_bytes);
                memcpy((char *)c->vc.t.data + elem_off(&c->vc.t, b, j, h),
                       (char *)c->vp.t.data + elem_off(&c->vp.t, pg, r, h), row_bytes);
                if (dt == FATTN_DTYPE_E4M3) {
                    c->kc.t.scale[(b * heads + h) * nbc + j / sb] = c->kp.t.scale[(pg * heads + h) * nbp + r / sb];
                    c->vc.t.scale[(b * heads + h) * nbc + j / sb] = c->vp.t.scale[(pg * heads + h) * nbp + r / sb];
                }
            }
        }
}

static void cache_free(cache *c) {
    tu_tensor_free(&c->kp);
    tu_tensor_free(&c->vp);
    tu_tensor_free(&c->kc);
    tu_tensor_free(&c->vc);
    free(c->table);
}

/* k and v of args: the pools and the table (paged) or the contiguous copy. */
static void cache_use(const cache *c, fattn_fwd_args *a, int paged) {
    if (paged) {
        a->k = c->kp.t;
        a->v = c->vp.t;
        a->block_table = c->table;
        a->page_size = c->page_size;
        a->num_pages = c->num_pages;
        a->max_pages_per_seq = c->mpps;
    } else {
        a->k = c->kc.t;
        a->v = c->vc.t;
    }
}

static fattn_status fwd(const fattn_fwd_args *a, const char *what) {
    fattn_status st = fattn_fwd(g_ctx, a);
    TU_CHECK(st == FATTN_OK, "%s: %s (%s)", what, fattn_status_string(st), fattn_last_error(g_ctx));
    return st;
}

/* ---- paged == contiguous --------------------------------------------------- */

static int g_paged_cases, g_paged_equal;

static void check_paged(tu_rng *rng, fattn_dtype dt, int ps, int causal, int d, tu_layout pool_layout) {
    enum { B = 3, SQ = 17, SK = 300, HQ = 8, HK = 2 };
    const int sb = ps < 16 ? ps : 16;
    const fattn_dtype odt = dt == FATTN_DTYPE_E4M3 ? FATTN_DTYPE_F32 : dt;
    char what[128];
    snprintf(what, sizeof what, "paged %s page %d %s d%d %s pool", fattn_dtype_name(dt), ps,
             causal ? "causal" : "non-causal", d, pool_layout == TU_BSHD ? "BSHD" : "BHSD");
    cache c;
    cache_make(&c, rng, dt, B, SK, HK, d, ps, pool_layout, sb);
    tu_tensor q, o1, o2;
    tu_tensor_alloc(&q, dt, B, SQ, HQ, d, TU_BSHD, 16);
    tu_tensor_alloc(&o1, odt, B, SQ, HQ, d, TU_BSHD, 1);
    tu_tensor_alloc(&o2, odt, B, SQ, HQ, d, TU_BSHD, 1);
    fill_random(rng, &q);
    const size_t nlse = (size_t)B * HQ * SQ;
    float *l1 = (float *)tu_malloc(sizeof(float) * nlse), *l2 = (float *)tu_malloc(sizeof(float) * nlse);
    tu_poison(l1, sizeof(float) * nlse);
    tu_poison(l2, sizeof(float) * nlse);

    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = tu_problem(B, SQ, SK, HQ, HK, d, 0, causal, NULL, NULL);
    a.q = q.t;
    a.o = o1.t;
    a.lse = l1;
    cache_use(&c, &a, 0);
    int ok = fwd(&a, what) == FATTN_OK;
    a.o = o2.t;
    a.lse = l2;
    cache_use(&c, &a, 1);
    ok = fwd(&a, what) == FATTN_OK && ok;
    g_paged_cases++;
    if (ok) {
        double *x = (double *)tu_malloc(sizeof(double) * o1.count);
        tu_tensor_get(&o1, x);
        const size_t bad = tu_count_nonfinite(x, o1.count);
        free(x);
        const int same = !memcmp(o1.t.data, o2.t.data, o1.bytes) && !memcmp(l1, l2, sizeof(float) * nlse);
        TU_CHECK(bad == 0, "%s: %zu non-finite outputs of the contiguous cache", what, bad);
        TU_CHECK(same, "%s: O or LSE differ from the contiguous cache's", what);
        g_paged_equal += same && bad == 0;
    }
    free(l1);
    free(l2);
    tu_tensor_free(&q);
    tu_tensor_free(&o1);
    tu_tensor_free(&o2);
    cache_free(&c);
}

/* ---- seqused_k == one call per sequence, cut ------------------------------ */

static int g_seq_cases, g_seq_refs;

/* Rows (row0 + i, i < n) of every head of o equal those of ref (batch 1,
 * rows 0..n-1) bitwise, LSE too; lse[h * lse_ld + lse0 + i] against
 * lref[h * n + i]. */
static int same_rows(const fattn_tensor *o, int64_t ob, int64_t row0, const fattn_tensor *ref, int n,
                     int heads, int dv, const float *lse, int64_t lse_ld, int64_t lse0, const float *lref) {
    const size_t rb = fattn_dtype_size(o->dtype) * (size_t)dv;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < heads; h++) {
            if (memcmp((const char *)o->data + elem_off(o, ob, row0 + i, h),
                       (const char *)ref->data + elem_off(ref, 0, i, h), rb))
                return 0;
            if (memcmp(&lse[h * lse_ld + lse0 + i], &lref[h * n + i], sizeof(float))) return 0;
        }
    return 1;
}

/* Rows that see no key: O exactly 0, LSE -inf. */
static int empty_rows(const fattn_tensor *o, int64_t ob, int64_t row0, int n, int heads, int dv,
                      const float *lse, int64_t lse_ld, int64_t lse0) {
    double *x = (double *)tu_malloc(sizeof(double) * (size_t)dv);
    int ok = 1;
    for (int i = 0; i < n && ok; i++)
        for (int h = 0; h < heads && ok; h++) {
            tu_from_dtype((const char *)o->data + elem_off(o, ob, row0 + i, h), (size_t)dv, o->dtype, x);
            for (int t = 0; t < dv; t++) ok = ok && x[t] == 0.0;
            ok = ok && lse[h * lse_ld + lse0 + i] == -INFINITY;
        }
    free(x);
    return ok;
}

/* The reference of one sequence: batch 1, its qlen queries (q rows q0.. of
 * batch entry qb), its first `used` keys (rows k0.. of batch entry kb of kc,
 * vc); o1 [1, qlen, heads, d] and l1 [heads, qlen] receive it. */
static fattn_status seq_reference(const fattn_fwd_args *full, int qb, int q0, int qlen, const tu_tensor *kc,
                                  const tu_tensor *vc, int kb, int k0, int used, tu_tensor *o1, float *l1) {
    fattn_fwd_args r;
    memset(&r, 0, sizeof r);
    r.p = tu_problem(1, qlen, used, full->p.heads_q, full->p.heads_kv, full->p.head_dim, 0,
                     full->p.causal, NULL, NULL);
    r.q = full->q;
    r.q.data = (char *)r.q.data + elem_off(&full->q, qb, q0, 0);
    r.k = kc->t;
    r.k.data = (char *)r.k.data + elem_off(&kc->t, kb, k0, 0);
    r.v = vc->t;
    r.v.data = (char *)r.v.data + elem_off(&vc->t, kb, k0, 0);
    r.o = o1->t;
    r.lse = l1;
    g_seq_refs++;
    return fwd(&r, "per-sequence reference");
}

static void check_seqused(tu_rng *rng, fattn_dtype dt, int sq, int causal, int d, int paged) {
    enum { B = 6, SK = 200, HQ = 8, HK = 2, PS = 16 };
    static const int32_t used[B] = {0, 1, SK, 37, 150, 999};
    char what[128];
    snprintf(what, sizeof what, "seqused_k %s sq %d %s d%d %s", fattn_dtype_name(dt), sq,
             causal ? "causal" : "non-causal", d, paged ? "paged (16)" : "contiguous");
    cache c;
    cache_make(&c, rng, dt, B, SK, HK, d, PS, TU_BSHD, 1);
    for (int b = 0; b < B; b++) {
        const int ue = imin(used[b], SK);
        /* keys past the used count are never read: NaN in the contiguous
         * cache, garbage table entries past the used pages */
        poison_rows(&c.kc, b, ue, SK);
        poison_rows(&c.vc, b, ue, SK);
        for (int i = cdiv(ue, PS); i < c.npg; i++) c.table[b * c.mpps + i] = -5 - i;
    }
    tu_tensor q, o, o1;
    tu_tensor_alloc(&q, dt, B, sq, HQ, d, TU_BSHD, 1);
    tu_tensor_alloc(&o, dt, B, sq, HQ, d, TU_BSHD, 1);
    tu_tensor_alloc(&o1, dt, 1, sq, HQ, d, TU_BSHD, 1);
    fill_random(rng, &q);
    float *lse = (float *)tu_malloc(sizeof(float) * B * HQ * sq), *l1 = (float *)tu_malloc(sizeof(float) * HQ * sq);
    tu_poison(lse, sizeof(float) * B * HQ * sq);

    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = tu_problem(B, sq, SK, HQ, HK, d, 0, causal, NULL, NULL);
    a.q = q.t;
    a.o = o.t;
    a.lse = lse;
    a.seqused_k = used;
    cache_use(&c, &a, paged);
    g_seq_cases++;
    if (fwd(&a, what) == FATTN_OK)
        for (int b = 0; b < B; b++) {
            const int ue = imin(used[b], SK);
            const float *lb = lse + (size_t)b * HQ * sq;
            if (ue == 0) {
                TU_CHECK(empty_rows(&o.t, b, 0, sq, HQ, d, lb, sq, 0),
                         "%s: sequence %d (seqused_k 0): O not 0 or LSE not -inf", what, b);
                continue;
            }
            if (seq_reference(&a, b, 0, sq, &c.kc, &c.vc, b, 0, ue, &o1, l1) != FATTN_OK) continue;
            TU_CHECK(same_rows(&o.t, b, 0, &o1.t, sq, HQ, d, lb, sq, 0, l1),
                     "%s: sequence %d (seqused_k %d): O or LSE differ from the cut call's", what, b,
                     (int)used[b]);
        }
    free(lse);
    free(l1);
    tu_tensor_free(&q);
    tu_tensor_free(&o);
    tu_tensor_free(&o1);
    cache_free(&c);
}

/* seqused_k with cu_seqlens: the used count caps each cu_seqlens_k length. */
static void check_seqused_varlen(tu_rng *rng, fattn_dtype dt, int causal) {
    enum { B = 5, HQ = 8, HK = 2, D = 64, TQ = 25, TK = 400 };
    static const int32_t cuq[B + 1] = {0, 1, 5, 5, 22, 25}, cuk[B + 1] = {0, 50, 50, 250, 300, 400};
    static const int32_t used[B] = {30, 10, 200, 999, 0};
    char what[96];
    snprintf(what, sizeof what, "seqused_k varlen %s %s", fattn_dtype_name(dt), causal ? "causal" : "non-causal");
    tu_tensor q, k, v, o, o1;
    tu_tensor_alloc(&q, dt, 1, TQ, HQ, D, TU_BSHD, 1);
    tu_tensor_alloc(&k, dt, 1, TK, HK, D, TU_BSHD, 1);
    tu_tensor_alloc(&v, dt, 1, TK, HK, D, TU_BSHD, 1);
    tu_tensor_alloc(&o, dt, 1, TQ, HQ, D, TU_BSHD, 1);
    tu_tensor_alloc(&o1, dt, 1, 17, HQ, D, TU_BSHD, 1);
    fill_random(rng, &q);
    fill_random(rng, &k);
    fill_random(rng, &v);
    for (int b = 0; b < B; b++) {
        const int klen = cuk[b + 1] - cuk[b], ue = imin(used[b], klen);
        poison_rows(&k, 0, cuk[b] + ue, cuk[b + 1]);
        poison_rows(&v, 0, cuk[b] + ue, cuk[b + 1]);
    }
    float *lse = (float *)tu_malloc(sizeof(float) * HQ * TQ), *l1 = (float *)tu_malloc(sizeof(float) * HQ * 17);
    tu_poison(lse, sizeof(float) * HQ * TQ);

    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = tu_problem(B, 17, 200, HQ, HK, D, 0, causal, cuq, cuk);
    a.q = q.t, a.k = k.t, a.v = v.t, a.o = o.t;
    a.lse = lse;
    a.seqused_k = used;
    g_seq_cases++;
    if (fwd(&a, what) == FATTN_OK)
        for (int b = 0; b < B; b++) {
            const int qlen = cuq[b + 1] - cuq[b], ue = imin(used[b], cuk[b + 1] - cuk[b]);
            if (qlen == 0) continue;
            if (ue == 0) {
                TU_CHECK(empty_rows(&o.t, 0, cuq[b], qlen, HQ, D, lse, TQ, cuq[b]),
                         "%s: sequence %d (no used key): O not 0 or LSE not -inf", what, b);
                continue;
            }
            if (seq_reference(&a, 0, cuq[b], qlen, &k, &v, 0, cuk[b], ue, &o1, l1) != FATTN_OK) continue;
            TU_CHECK(same_rows(&o.t, 0, cuq[b], &o1.t, qlen, HQ, D, lse, TQ, cuq[b], l1),
                     "%s: sequence %d (seqused_k %d, %d keys): O or LSE differ from the cut call's",
                     what, b, (int)used[b], cuk[b + 1] - cuk[b]);
        }
    free(lse);
    free(l1);
    tu_tensor_free(&q);
    tu_tensor_free(&k);
    tu_tensor_free(&v);
    tu_tensor_free(&o);
    tu_tensor_free(&o1);
}

/* ---- refusals --------------------------------------------------------------- */

/* batch 2, seqlen_q 4, seqlen_k 40, heads 4 / 2, head dim 32, f32; pages
 * of 16 rows (1024 floats, the size of q and o), 3 used per sequence (pages
 * 0..5 of 7), the 4th table column garbage. */
enum { RB = 2, RSQ = 4, RSK = 40, RHQ = 4, RHK = 2, RD = 32, RPS = 16, RMPPS = 4, RNP = 7 };
#define RPAGE (RPS * RHK * RD)
#define RNQ (RB * RSQ * RHQ * RD)
#define RNLSE (RB * RHQ * RSQ)
static float r_kpool[8 * RPAGE], r_vpool[RNP * RPAGE], r_q[RNQ], r_o[RNQ], r_lse[RNLSE];
static int32_t r_table[RB * RMPPS] = {3, 1, 5, -3, 2, 4, 0, 77};
static int g_refusals;

static fattn_fwd_args refusal_base(void) {
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = tu_problem(RB, RSQ, RSK, RHQ, RHK, RD, 0, 1, NULL, NULL);
    a.q = fattn_tensor_bshd(r_q, FATTN_DTYPE_F32);
    a.k = fattn_tensor_bshd(r_kpool, FATTN_DTYPE_F32);
    a.v = fattn_tensor_bshd(r_vpool, FATTN_DTYPE_F32);
    a.o = fattn_tensor_bshd(r_o, FATTN_DTYPE_F32);
    a.lse = r_lse;
    a.block_table = r_table;
    a.page_size = RPS;
    a.num_pages = RNP;
    a.max_pages_per_seq = RMPPS;
    return a;
}

static void poison_out(void) {
    memset(r_o, 0xA5, sizeof r_o);
    memset(r_lse, 0xA5, sizeof r_lse);
}

/* The call on `a` (fattn_fwd, or fattn_fwd_fp8 when fp8) answers `want`
 * with a message holding `needle`, and its o and lse (whatever they hold
 * now) are unchanged. */
static void expect_refusal(fattn_ctx *ctx, const fattn_fwd_args *a, int fp8, fattn_status want,
                           const char *needle, int line) {
    const size_t ob = sizeof(float) * RNQ, lb = sizeof(float) * RNLSE;
    unsigned char *o0 = (unsigned char *)tu_malloc(ob), *l0 = (unsigned char *)tu_malloc(lb);
    memcpy(o0, a->o.data, ob);
    if (a->lse) memcpy(l0, a->lse, lb);
    fattn_status st = fp8 ? fattn_fwd_fp8(ctx, a, NULL) : fattn_fwd(ctx, a);
    const char *msg = fattn_last_error(ctx);
    g_refusals++;
    if (st != want || !strstr(msg, needle)) {
        tu_failures++;
        fprintf(stderr, "%s:%d: want %s naming '%s', got %s: '%s'\n", __FILE__, line,
                fattn_status_string(want), needle, fattn_status_string(st), msg);
    } else {
        printf("  [ok] line %d: %s: %s\n", line, fattn_status_string(st), msg);
    }
    if (memcmp(o0, a->o.data, ob) || (a->lse && memcmp(l0, a->lse, lb))) {
        tu_failures++;
        fprintf(stderr, "%s:%d: a refused call wrote its outputs\n", __FILE__, line);
    }
    free(o0);
    free(l0);
}

#define INV FATTN_ERROR_INVALID_ARGUMENT
#define UNS FATTN_ERROR_UNSUPPORTED
#define REFUSE(mutation, want, needle)                                                             \
    do {                                                                                           \
        fattn_fwd_args a_ = refusal_base();                                                        \
        poison_out();                                                                              \
        mutation;                                                                                  \
        expect_refusal(g_ctx, &a_, 0, (want), (needle), __LINE__);                                 \
    } while (0)
#define ACCEPT(mutation, what)                                                                     \
    do {                                                                                           \
        fattn_fwd_args a_ = refusal_base();                                                        \
        poison_out();                                                                              \
        mutation;                                                                                  \
        fwd(&a_, what);                                                                            \
    } while (0)

static void check_refusals(tu_rng *rng) {
    float *all[] = {r_kpool, r_vpool, r_q};
    size_t n[] = {sizeof r_kpool / sizeof(float), sizeof r_vpool / sizeof(float), RNQ};
    for (int i = 0; i < 3; i++)
        for (size_t j = 0; j < n[i]; j++) all[i][j] = (float)tu_rng_normal(rng);

    /* the base call: garbage past the used pages (-3, 77) is never read */
    ACCEPT((void)0, "the refusal tests' base call");

    /* the three ints without a table, and a table without them */
    REFUSE((a_.block_table = NULL, a_.num_pages = a_.max_pages_per_seq = 0), INV, "page_size 16 is given but block_table is NULL");
    REFUSE((a_.block_table = NULL, a_.page_size = a_.max_pages_per_seq = 0), INV, "num_pages 7 is given but block_table is NULL");
    REFUSE((a_.block_table = NULL, a_.page_size = a_.num_pages = 0), INV, "max_pages_per_seq 4 is given but block_table is NULL");
    REFUSE(a_.page_size = 0, INV, "page_size 0 must be >= 1");
    REFUSE(a_.page_size = -16, INV, "page_size -16 must be >= 1");
    REFUSE(a_.num_pages = 0, INV, "num_pages 0 must be >= 1");
    REFUSE(a_.max_pages_per_seq = 0, INV, "max_pages_per_seq 0 must be >= 1");
    REFUSE(a_.max_pages_per_seq = -1, INV, "max_pages_per_seq -1 must be >= 1");
    /* 2 * 16 = 32 < 40 keys */
    REFUSE(a_.max_pages_per_seq = 2, INV, "seqlen_k 40 exceeds max_pages_per_seq * page_size = 2 * 16 = 32");
    {
        /* 32768 * 65536 = 2^31 (negative in int32) addresses 40 keys: one page
         * of 65536 rows per sequence, of which 40 are read; the pool is one
         * such page (16 MB, calloc'd, only 40 rows touched) */
        const int32_t ps = 65536, mpps = 32768;
        float *pool = (float *)calloc((size_t)ps * RHK * RD, sizeof(float));
        int32_t *table = (int32_t *)calloc((size_t)RB * mpps, sizeof(int32_t));
        if (!pool || !table) {
            fprintf(stderr, "out of memory\n");
            exit(1);
        }
        ACCEPT((a_.k.data = a_.v.data = pool, a_.block_table = table, a_.page_size = ps,
                a_.num_pages = 1, a_.max_pages_per_seq = mpps),
               "max_pages_per_seq * page_size = 2^31");
        free(pool);
        free(table);
    }
    {
        static const int32_t cuq[RB + 1] = {0, 2, 4}, cuk[RB + 1] = {0, 20, 40};
        REFUSE((a_.p.cu_seqlens_q = cuq, a_.p.cu_seqlens_k = cuk), UNS, "block_table with cu_seqlens");
    }

    /* the entries, checked on the host */
    {
        static const int32_t neg[RB] = {40, -1}, ok[RB] = {40, 17};
        REFUSE(a_.seqused_k = neg, INV, "seqused_k[1] is -1, must be >= 0");
        REFUSE((a_.seqused_k = neg, a_.block_table = NULL, a_.page_size = a_.num_pages = a_.max_pages_per_seq = 0,
                a_.k.data = r_kpool, a_.v.data = r_kpool),
               INV, "seqused_k[1] is -1");
        static int32_t t1[RB * RMPPS], t2[RB * RMPPS];
        memcpy(t1, r_table, sizeof t1);
        memcpy(t2, r_table, sizeof t2);
        t1[1 * RMPPS + 2] = -1;
        t2[0 * RMPPS + 1] = RNP;
        REFUSE(a_.block_table = t1, INV, "block_table[1][2] is -1, outside [0, num_pages 7)");
        REFUSE(a_.block_table = t2, INV, "block_table[0][1] is 7, outside [0, num_pages 7)");
        /* sequence 1 reads 17 keys, two pages: its third entry is not read */
        ACCEPT((a_.block_table = t1, a_.seqused_k = ok), "a bad entry past the pages seqused_k uses");
    }

    /* alignment */
    {
        static int32_t room[RB * RMPPS + 1];
        memcpy((char *)room + 2, r_table, sizeof r_table);
        REFUSE(a_.block_table = (const int32_t *)((char *)room + 2), INV, "block_table is not 4-byte aligned");
        REFUSE(a_.seqused_k = (const int32_t *)((char *)room + 2), INV, "seqused_k is not 4-byte aligned");
    }

    /* overlap: the table and seqused_k are inputs; the pools span num_pages
     * pages of page_size rows, used or not */
    REFUSE((memcpy(r_o + 8, r_table, sizeof r_table), a_.block_table = (const int32_t *)(r_o + 8)), INV,
           "o overlaps block_table");
    {
        static const int32_t ok[RB] = {40, 17};
        REFUSE((memcpy(r_lse + 4, ok, sizeof ok), a_.seqused_k = (const int32_t *)(r_lse + 4)), INV,
               "lse overlaps seqused_k");
    }
    /* o on page 6 of the k pool: no sequence reads it, but it is one of
     * num_pages 7 (batch 2 * seqlen_k 40 rows, the contiguous extent, would
     * end on page 5); on page 7 o is past the pool */
    REFUSE((a_.o.data = r_kpool + 6 * RPAGE, memset(a_.o.data, 0xA5, sizeof r_o)), INV, "o overlaps k");
    ACCEPT((a_.o.data = r_kpool + 7 * RPAGE), "o just past the k pool");
    /* a pool whose pages obviously overlap one another */
    REFUSE((a_.k.stride_seq = RHK * RD, a_.k.stride_head = RD, a_.k.stride_batch = 16), INV,
           "k.stride_batch 16 is smaller than head_dim 32 (pages would overlap)");

    /* fattn_fwd_fp8: none of the fields yet */
    {
        static const int32_t ok[RB] = {40, 17};
        fattn_fwd_args a = refusal_base();
        poison_out();
        expect_refusal(g_ctx, &a, 1, UNS, "fattn_fwd_fp8 does not take the serving fields", __LINE__);
        a = refusal_base();
        a.block_table = NULL, a.page_size = a.num_pages = a.max_pages_per_seq = 0, a.seqused_k = ok;
        a.k.data = a.v.data = r_vpool;
        expect_refusal(g_ctx, &a, 1, UNS, "fattn_fwd_fp8 does not take the serving fields", __LINE__);
        a.seqused_k = NULL, a.page_size = 16;
        expect_refusal(g_ctx, &a, 1, UNS, "fattn_fwd_fp8 does not take the serving fields", __LINE__);
    }

    /* A CUDA context (faked: no GPU needed) gets the scalar checks, which
     * read nothing (the table points at an unmapped address); its entries
     * are never read on the host. */
    {
        static fattn_ctx fake;
        memset(&fake, 0, sizeof fake);
        fake.backend = FATTN_BACKEND_CUDA;
        const int32_t *unmapped = (const int32_t *)(uintptr_t)16;
        fattn_fwd_args a = refusal_base();
        a.q.dtype = a.k.dtype = a.v.dtype = a.o.dtype = FATTN_DTYPE_BF16;
        a.block_table = unmapped;
        a.page_size = 0;
        poison_out();
        expect_refusal(&fake, &a, 0, INV, "page_size 0 must be >= 1", __LINE__);
#ifndef FATTN_WITH_CUDA
        /* without the CUDA engine its check answers: nothing was read */
        a.page_size = RPS;
        a.seqused_k = unmapped;
        expect_refusal(&fake, &a, 0, FATTN_ERROR_NO_DEVICE, "without the CUDA engine", __LINE__);
#endif
    }
}

int main(void) {
    tu_rng rng;
    tu_rng_init(&rng, (uint64_t)tu_seed());
    TU_EXPECT_OK(fattn_ctx_create(&g_ctx, FATTN_BACKEND_CPU, 0));
    if (!g_ctx) return 1;

    const fattn_dtype dts[] = {FATTN_DTYPE_F32, FATTN_DTYPE_BF16, FATTN_DTYPE_F16, FATTN_DTYPE_E4M3};
    const int pages[] = {1, 3, 8, 16, 48, 64, 256}; /* 3, 48: not powers of two */
    int i = 0;
    for (int pi = 0; pi < (int)(sizeof pages / sizeof pages[0]); pi++)
        for (int di = 0; di < 4; di++)
            for (int causal = 0; causal < 2; causal++, i++)
                check_paged(&rng, dts[di], pages[pi], causal, i % 3 ? 64 : 128, i % 4 == 1 ? TU_BHSD : TU_BSHD);
    printf("paged == contiguous, bitwise: %d of %d cases\n", g_paged_equal, g_paged_cases);

    const int sqs[] = {1, 4, 17};
    for (int si = 0; si < 3; si++)
        for (int causal = 0; causal < 2; causal++)
            for (int d = 64; d <= 128; d += 64)
                for (int di = 0; di < 2; di++)
                    for (int paged = 0; paged < 2; paged++)
                        check_seqused(&rng, dts[di], sqs[si], causal, d, paged);
    for (int di = 0; di < 2; di++)
        for (int causal = 0; causal < 2; causal++) check_seqused_varlen(&rng, dts[di], causal);
    printf("seqused_k == per-sequence calls, bitwise: %d calls against %d references\n", g_seq_cases, g_seq_refs);

    check_refusals(&rng);
    printf("refusals and acceptances checked: %d\n", g_refusals);

    fattn_ctx_free(g_ctx);
    return tu_finish("test_cpu_paged");
}
