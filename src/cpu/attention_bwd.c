/* attention_bwd.c - CPU backward attention.
 *
 * Pass 0, over (batch, q-head, query block): D_i = rowsum(dO_i * O_i) for an
 *   f32 O, else rowsum(P_i * dP_i) over the visible keys (the same value without
 *   the rounding of a 16-bit O; see bwd_d_exact_task).
 * Pass 1, over (batch, kv-head, key block): for every query head of the GQA
 *   group and every query block that sees the key block, recompute
 *   S = Q K^T, P = exp(S * scale - lse), then dV += P^T dO, dP = dO V^T,
 *   dS = P * (dP - D) * scale, dK += dS^T Q.
 * Pass 2, over (batch, q-head, query block): loop over the visible key blocks,
 *   recompute P and dS the same way, dQ += dS K.
 * Every output row is accumulated by one task in a fixed order: deterministic
 * and independent of the thread count.  Scratch is O(block * head_dim) per
 * worker plus D (one float per query row and head). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/attention_common.h"
#include "cpu/kernels.h"
#include "cpu/load.h"
#include "cpu/threads.h"
#include "internal.h"

typedef struct bwd_job {
    const fattn_bwd_args *a;
    fattn_tasks qtasks; /* (b, h_q, query block) */
    fattn_tasks ktasks; /* (b, h_kv, key block) */
    fattn_cpu_kernels kern;
    fattn_seq_fields f; /* seqused_q, seqused_k */
    fattn_cpu_dims m; /* sizes derived from the problem */
    float *dbuf;        /* D, laid out like lse */
    size_t scratch_floats;
    float *scratch;
} bwd_job;

typedef struct bwd_scratch {
    float *q;   /* [BM x dp] */
    float *dO;  /* [BM x dvp] */
    float *kt;  /* [d x BN] */
    float *k;   /* [BN x dp]  (pass 2) */
    float *vt;  /* [dv x BN] */
    float *s;   /* [BM x BN] S, then P, then dS */
    float *dP;  /* [BM x BN] */
    float *dt;  /* [BM x BN] softcap: 1 - tanh^2(s / softcap), the derivative of the cap */
    float *acc1; /* pass 1: dK [BN x dp]; pass 2: dQ [BM x dp] */
    float *acc2; /* pass 1: dV [BN x dvp] */
    float *lse; /* [BM] */
    float *D;   /* [BM] */
    float *row; /* [max(d, dv)] */
} bwd_scratch;

static size_t bwd_scratch_layout(const bwd_job *j, float *base, bwd_scratch *s) {
    const int64_t BM = FATTN_CPU_BM, BN = FATTN_CPU_BN;
    const int64_t BX = BM > BN ? BM : BN;
    size_t off = 0;
#define TAKE(field, n) FATTN_SCRATCH_TAKE(s, base, off, field, n)
    TAKE(q, BM * j->m.dp);
    TAKE(dO, BM * j->m.dvp);
    TAKE(kt, j->m.d * BN);
    TAKE(k, BN * j->m.dp);
    TAKE(vt, j->m.dv * BN);
    TAKE(s, BM * BN);
    TAKE(dP, BM * BN);
    TAKE(dt, BM * BN);
    TAKE(acc1, BX * j->m.dp);
    TAKE(acc2, BN * j->m.dvp);
    TAKE(lse, BM);
    TAKE(D, BM);
    TAKE(row, (j->m.d > j->m.dv ? j->m.d : j->m.dv));
#undef TAKE
    return off;
}

static int64_t imin64(int64_t x, int64_t y) { return x < y ? x : y; }
static int64_t imax64(int64_t x, int64_t y) { return x > y ? x : y; }

/* ---- pass 0: D ---------------------------------------------------------- */

static void bwd_d_task(void *arg, int64_t task, int worker) {
    const bwd_job *j = (const bwd_job *)arg;
    const fattn_bwd_args *a = j->a;
    const fattn_problem *p = &a->p;
    bwd_scratch w;
    bwd_scratch_layout(j, j->scratch + (size_t)worker * j->scratch_floats, &w);
    int64_t b, h, qb;
    fattn_tasks_decode(&j->qtasks, task, &b, &h, &qb);
    const fattn_seq sq = fattn_seq_get(p, &j->f, b);
    const int64_t i0 = qb * FATTN_CPU_BM;
    const int64_t rows = imin64(sq.qlen - i0, FATTN_CPU_BM);
    for (int64_t r = 0; r < rows; r++) {
        int64_t tr = sq.q0 + i0 + r;
        fattn_load_row(&a->o, fattn_row_offset(&a->o, sq.tb, tr, h), (int)j->m.dv, 1.0f, NULL, w.dO);
        fattn_load_row(&a->dout, fattn_row_offset(&a->dout, sq.tb, tr, h), (int)j->m.dv, 1.0f, NULL,
                       w.row);
        float acc = 0.0f;
        for (int64_t t = 0; t < j->m.dv; t++) acc += w.dO[t] * w.row[t];
        j->dbuf[fattn_lse_index(p, &sq, b, h, i0 + r)] = acc;
    }
}

/* ---- shared pieces ----------------------------------------------------- */

/* Rows r0 .. r0 + n - 1 of head h into L2, len elements each.  The rows are
 * heads * d apart, which the hardware prefetchers do not follow: the next
 * block's rows are asked for while this block computes. */
static void prefetch_rows(const fattn_tensor *t, int64_t tb, int64_t r0, int64_t n, int64_t h, int64_t len) {
    const size_t es = fattn_dtype_size(t->dtype);
    for (int64_t r = 0; r < n; r++) {
        const char *row = (const char *)t->data + (size_t)fattn_row_offset(t, tb, r0 + r, h) * es;
        for (size_t b = 0; b < (size_t)len * es; b += 64) __builtin_prefetch(row + b, 0, 2);
    }
}

/* Load a query block of head h: q, dO, lse, D; zero the padding rows. */
static void load_q_block(const bwd_job *j, bwd_scratch *w, const fattn_seq *sq, int64_t b,
                         int64_t h, int64_t i0, int64_t rows) {
    const fattn_bwd_args *a = j->a;
    const fattn_problem *p = &a->p;
    const int64_t rows4 = fattn_round_up(rows, 4);
    for (int64_t r = 0; r < rows; r++) {
        int64_t tr = sq->q0 + i0 + r;
        fattn_load_row(&a->q, fattn_row_offset(&a->q, sq->tb, tr, h), (int)j->m.d, 1.0f, NULL,
                       w->q + r * j->m.dp);
        fattn_load_row(&a->dout, fattn_row_offset(&a->dout, sq->tb, tr, h), (int)j->m.dv, 1.0f, NULL,
                       w->dO + r * j->m.dvp);
        int64_t li = fattn_lse_index(p, sq, b, h, i0 + r);
        w->lse[r] = a->lse[li];
        w->D[r] = j->dbuf[li];
    }
    for (int64_t r = rows; r < rows4; r++) {
        memset(w->q + r * j->m.dp, 0, sizeof(float) * (size_t)j->m.dp);
        memset(w->dO + r * j->m.dvp, 0, sizeof(float) * (size_t)j->m.dvp);
        w->lse[r] = -INFINITY;
        w->D[r] = 0.0f;
    }
}

/* Load K^T (and K row-major if want_k) and V^T of keys [j0, j0 + jn) of
 * kv head hk; zero the padding columns up to a multiple of 16. */
static void load_k_block(const bwd_job *j, bwd_scratch *w, const fattn_seq *sq, int64_t hk,
                         int64_t j0, int64_t jn, int want_k) {
    const fattn_bwd_args *a = j->a;
    const int64_t BN = FATTN_CPU_BN;
    const int64_t jn16 = fattn_round_up(jn, 16);
    for (int64_t c = 0; c < jn; c++) {
        int64_t tr = sq->k0 + j0 + c;
        float *kr = want_k ? w->k + c * j->m.dp : w->row;
        fattn_load_row(&a->k, fattn_row_offset(&a->k, sq->kb, tr, hk), (int)j->m.d, 1.0f, NULL, kr);
        for (int64_t t = 0; t < j->m.d; t++) w->kt[t * BN + c] = kr[t];
        fattn_load_row(&a->v, fattn_row_offset(&a->v, sq->kb, tr, hk), (int)j->m.dv, 1.0f, NULL,
                       w->row);
        for (int64_t t = 0; t < j->m.dv; t++) w->vt[t * BN + c] = w->row[t];
    }
    if (jn < jn16) {
        for (int64_t t = 0; t < j->m.d; t++)
            memset(w->kt + t * BN + jn, 0, sizeof(float) * (size_t)(jn16 - jn));
        for (int64_t t = 0; t < j->m.dv; t++)
            memset(w->vt + t * BN + jn, 0, sizeof(float) * (size_t)(jn16 - jn));
    }
}

/* S, P and dP for the loaded (query block i0.., key block j0..) tile: P in
 * w->s, dP in w->dP, and in [vlo[r], vhi[r]) the keys row r sees (causal,
 * window).  With softcap, S is capped before P and w->dt keeps the cap's
 * derivative. */
static void tile_p(const bwd_job *j, bwd_scratch *w, const fattn_seq *sq, int64_t i0,
                   int64_t rows, int64_t j0, int64_t jn, int64_t *vlo, int64_t *vhi) {
    const fattn_problem *p = &j->a->p;
    const int64_t BN = FATTN_CPU_BN;
    const int64_t rows4 = fattn_round_up(rows, 4);
    const int64_t jn16 = fattn_round_up(jn, 16);
    const float scale = p->softmax_scale, cap = p->softcap;

    j->kern.gemm((int)rows4, (int)jn16, (int)j->m.d, w->q, j->m.dp, w->kt, BN, w->s, BN, 0);
    j->kern.gemm((int)rows4, (int)jn16, (int)j->m.dv, w->dO, j->m.dvp, w->vt, BN, w->dP, BN, 0);
    /* Keys a row does not see get P = 0 (and dS = 0 below) exactly, whatever
     * its LSE holds: exp(-inf - NaN) would be NaN. */
    for (int64_t r = 0; r < rows4; r++) {
        float *srow = w->s + r * BN;
        vlo[r] = vhi[r] = 0;
        if (r < rows && w->lse[r] != -INFINITY) {
            vhi[r] = imin64(imax64(fattn_last_key(p, sq, i0 + r) - j0 + 1, 0), jn);
            vlo[r] = imin64(imax64(fattn_first_key(p, sq, i0 + r) - j0, 0), vhi[r]);
        }
        for (int64_t c = vlo[r]; c < vhi[r]; c++) srow[c] *= scale;
        if (cap > 0.0f) {
            float *trow = w->dt + r * BN;
            for (int64_t c = vlo[r]; c < vhi[r]; c++) {
                /* 1 - tanh^2 as 1 / cosh^2: where the cap saturates, 1 - t * t
                 * of an f32 t near 1 keeps no correct digit */
                const float x = srow[c] / cap, ch = coshf(x);
                srow[c] = cap * tanhf(x);
                trow[c] = 1.0f / (ch * ch);
            }
        }
        j->kern.exp_sub(srow + vlo[r], (int)(vhi[r] - vlo[r]), w->lse[r]);
        memset(srow, 0, sizeof(float) * (size_t)vlo[r]);
        memset(srow + vhi[r], 0, sizeof(float) * (size_t)(jn16 - vhi[r]));
    }
}

/* w->s = dS * scale = P * (dP - D) * scale over the keys each row sees (tile_p
 * left P in w->s and dP in w->dP; the other entries stay 0); with softcap,
 * times the cap's derivative. */
static void tile_ds_from_p(const bwd_job *j, bwd_scratch *w, int64_t rows, const int64_t *vlo,
                           const int64_t *vhi) {
    const int64_t BN = FATTN_CPU_BN;
    const int64_t rows4 = fattn_round_up(rows, 4);
    const float scale = j->a->p.softmax_scale;
    const int cap = j->a->p.softcap > 0.0f;
    for (int64_t r = 0; r < rows4; r++) {
        float *srow = w->s + r * BN;
        const float *dprow = w->dP + r * BN;
        const float *trow = w->dt + r * BN;
        const float Dr = w->D[r];
        if (cap)
            for (int64_t c = vlo[r]; c < vhi[r]; c++) srow[c] = srow[c] * (dprow[c] - Dr) * scale * trow[c];
        else
            for (int64_t c = vlo[r]; c < vhi[r]; c++) srow[c] = srow[c] * (dprow[c] - Dr) * scale;
    }
}

/* The key blocks a query block [i0, i0 + rows) needs: [*kbeg, *kend), kbeg a
 * multiple of BN. */
static void key_range(const fattn_problem *p, const fattn_seq *sq, int64_t i0, int64_t rows,
                      int64_t *kbeg, int64_t *kend) {
    const int64_t BN = FATTN_CPU_BN;
    *kend = imin64(fattn_last_key(p, sq, i0 + rows - 1) + 1, sq->klen);
    const int64_t first = fattn_first_key(p, sq, i0);
    *kbeg = first <= 0 ? 0 : first / BN * BN;
}

/* ---- pass 0 for 16-bit O: D = rowsum(P * dP) ---------------------------- *
 * D_i = dO_i . O_i, and dS = P (dP - D) cancels: its rows sum to zero.  With
 * O rounded to f16 / bf16, D carries the rounding of O (2^-9 relative for
 * bf16) while dP - D is often much smaller than either, so dS loses most of
 * its digits (issue 27 item 8: bf16 causal 23 x 3, dq 8x the error of the
 * rounded exact gradient).  sum_j P_ij dP_ij is the same D computed from the
 * f32 P and dP the backward recomputes anyway, so dS only sees f32 rounding;
 * it costs the two GEMMs of S and dP once more (about 2/7 of the backward).
 * That sum is D only over all of a row's keys: a row whose P (with its sink)
 * sums to less than 1 - 2^-13 here was given the LSE of a larger call (ring
 * attention, FlashAttention's block backward) and takes D = dO . O from the
 * o passed, as the GPU engines do. */
static void bwd_d_exact_task(void *arg, int64_t task, int worker) {
    const bwd_job *j = (const bwd_job *)arg;
    const fattn_problem *p = &j->a->p;
    const int64_t BM = FATTN_CPU_BM, BN = FATTN_CPU_BN;
    bwd_scratch w;
    bwd_scratch_layout(j, j->scratch + (size_t)worker * j->scratch_floats, &w);
    int64_t b, h, qb;
    fattn_tasks_decode(&j->qtasks, task, &b, &h, &qb);
    const fattn_seq sq = fattn_seq_get(p, &j->f, b);
    const int64_t hk = h / j->m.group;
    const int64_t i0 = qb * BM;
    const int64_t rows = imin64(sq.qlen - i0, BM);
    float acc[FATTN_CPU_BM], psum[FATTN_CPU_BM];
    int64_t vlo[FATTN_CPU_BM], vhi[FATTN_CPU_BM];
    load_q_block(j, &w, &sq, b, h, i0, rows);
    for (int64_t r = 0; r < rows; r++) acc[r] = psum[r] = 0.0f;
    int64_t kbeg, kend;
    key_range(p, &sq, i0, rows, &kbeg, &kend);
    for (int64_t j0 = kbeg; j0 < kend; j0 += BN) {
        const int64_t jn = imin64(kend - j0, BN);
        load_k_block(j, &w, &sq, hk, j0, jn, 0);
        tile_p(j, &w, &sq, i0, rows, j0, jn, vlo, vhi);
        for (int64_t r = 0; r < rows; r++) {
            const float *prow = w.s + r * BN, *dprow = w.dP + r * BN;
            float t = acc[r], ps = psum[r];
            for (int64_t c = vlo[r]; c < vhi[r]; c++) t += prow[c] * dprow[c], ps += prow[c];
            acc[r] = t, psum[r] = ps;
        }
    }
    const fattn_bwd_args *a = j->a;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t li = fattn_lse_index(p, &sq, b, h, i0 + r);
        const float lse = a->lse[li];
        float mass = psum[r];
        if (a->learnable_sink && lse != -INFINITY) mass += expf(a->learnable_sink[h] - lse);
        if (lse != -INFINITY && mass < 1.0f - 0x1p-13f) { /* an outside LSE: D from the o given */
            const int64_t tr = sq.q0 + i0 + r;
            fattn_load_row(&a->o, fattn_row_offset(&a->o, sq.tb, tr, h), (int)j->m.dv, 1.0f, NULL, w.dO);
            fattn_load_row(&a->dout, fattn_row_offset(&a->dout, sq.tb, tr, h), (int)j->m.dv, 1.0f, NULL, w.row);
            float d = 0.0f;
            for (int64_t t = 0; t < j->m.dv; t++) d += w.dO[t] * w.row[t];
            acc[r] = d;
        }
        j->dbuf[li] = acc[r];
    }
}

/* ---- d(sink) ------------------------------------------------------------ *
 * The sink is one more column of each row's softmax, with no value row:
 * O_i = sum_j P_ij v_j, P_ij = exp(s_ij - LSE_i), LSE_i = log(exp(sink) +
 * sum_j exp(s_ij)).  d P_ij / d sink = -P_ij P_sink,i with P_sink,i =
 * exp(sink - LSE_i), so d O_i / d sink = -P_sink,i O_i and
 *     dsink = sum_i dO_i . dO_i/dsink = -sum_i P_sink,i D_i,  D_i = dO_i . O_i.
 * One pass over D after pass 0, in double, rows in order: deterministic.  A
 * row with LSE -inf (no key, no sink: O = 0) adds nothing. */
static void bwd_dsink(const bwd_job *j) {
    const fattn_bwd_args *a = j->a;
    const fattn_problem *p = &a->p;
    for (int64_t h = 0; h < p->heads_q; h++) {
        const double sink = a->learnable_sink[h];
        double acc = 0.0;
        for (int64_t b = 0; b < p->batch; b++) {
            const fattn_seq sq = fattn_seq_get(p, &j->f, b);
            for (int64_t i = 0; i < sq.qlen; i++) {
                const int64_t li = fattn_lse_index(p, &sq, b, h, i);
                if (a->lse[li] == -INFINITY) continue;
                acc -= exp(sink - (double)a->lse[li]) * (double)j->dbuf[li];
            }
        }
        a->dsink[h] = (float)acc;
    }
}

/* ---- pass 1: dK, dV ---------------------------------------------------- */

static void bwd_kv_task(void *arg, int64_t task, int worker) {
    const bwd_job *j = (const bwd_job *)arg;
    const fattn_bwd_args *a = j->a;
    const fattn_problem *p = &a->p;
    const int64_t BM = FATTN_CPU_BM, BN = FATTN_CPU_BN;
    bwd_scratch w;
    bwd_scratch_layout(j, j->scratch + (size_t)worker * j->scratch_floats, &w);
    int64_t b, hk, kb;
    fattn_tasks_decode(&j->ktasks, task, &b, &hk, &kb);
    const fattn_seq sq = fattn_seq_get(p, &j->f, b);
    const int64_t j0 = kb * BN;
    const int64_t jn = imin64(sq.klen - j0, BN);
    const int64_t jn4 = fattn_round_up(jn, 4);

    memset(w.acc1, 0, sizeof(float) * (size_t)(jn4 * j->m.dp));
    memset(w.acc2, 0, sizeof(float) * (size_t)(jn4 * j->m.dvp));
    load_k_block(j, &w, &sq, hk, j0, jn, 0);

    /* The queries that see a key of the block: [ifirst, iend).  Query i's
     * last key is i + (its offset), its first i + (another): the window and
     * causal bounds move with i. */
    int64_t ifirst = 0, iend = sq.qlen;
    if (p->causal || (p->window && p->window_right >= 0))
        ifirst = imax64(j0 - fattn_last_key(p, &sq, 0), 0);
    if (fattn_window_left(p) >= 0) iend = imin64(j0 + jn - 1 - fattn_first_key(p, &sq, 0) + 1, sq.qlen);
    for (int64_t g = 0; g < j->m.group; g++) {
        const int64_t h = hk * j->m.group + g;
        for (int64_t i0 = ifirst / BM * BM; i0 < iend; i0 += BM) {
            const int64_t rows = imin64(sq.qlen - i0, BM);
            load_q_block(j, &w, &sq, b, h, i0, rows);
            {   /* the next query block: this head's, or the next head's first */
                const int64_t ni = i0 + BM < iend ? i0 + BM : ifirst / BM * BM;
                const int64_t nh = i0 + BM < iend ? h : h + 1;
                if (nh < (hk + 1) * j->m.group) {
                    const int64_t nr = imin64(sq.qlen - ni, BM);
                    prefetch_rows(&a->q, sq.tb, sq.q0 + ni, nr, nh, j->m.d);
                    prefetch_rows(&a->dout, sq.tb, sq.q0 + ni, nr, nh, j->m.dv);
                }
            }
            int64_t vlo[FATTN_CPU_BM], vhi[FATTN_CPU_BM];
            tile_p(j, &w, &sq, i0, rows, j0, jn, vlo, vhi);
            /* dV += P^T dO, then dK += dS^T Q: P and dS read transposed in place */
            j->kern.gemm_tn((int)jn4, (int)j->m.dvp, (int)rows, w.s, BN, w.dO, j->m.dvp, w.acc2, j->m.dvp, 1);
            tile_ds_from_p(j, &w, rows, vlo, vhi);
            j->kern.gemm_tn((int)jn4, (int)j->m.dp, (int)rows, w.s, BN, w.q, j->m.dp, w.acc1, j->m.dp, 1);
        }
    }
    for (int64_t c = 0; c < jn; c++) {
        int64_t tr = sq.k0 + j0 + c;
        fattn_store_row(&a->dk, fattn_row_offset(&a->dk, sq.kb, tr, hk), (int)j->m.d,
                        w.acc1 + c * j->m.dp);
        fattn_store_row(&a->dv, fattn_row_offset(&a->dv, sq.kb, tr, hk), (int)j->m.dv,
                        w.acc2 + c * j->m.dvp);
    }
}

/* ---- pass 2: dQ -------------------------------------------------------- */

static void bwd_q_task(void *arg, int64_t task, int worker) {
    const bwd_job *j = (const bwd_job *)arg;
    const fattn_bwd_args *a = j->a;
    const fattn_problem *p = &a->p;
    const int64_t BM = FATTN_CPU_BM, BN = FATTN_CPU_BN;
    bwd_scratch w;
    bwd_scratch_layout(j, j->scratch + (size_t)worker * j->scratch_floats, &w);
    int64_t b, h, qb;
    fattn_tasks_decode(&j->qtasks, task, &b, &h, &qb);
    if (p->causal) qb = j->qtasks.nblk[b] - 1 - qb;
    const fattn_seq sq = fattn_seq_get(p, &j->f, b);
    const int64_t hk = h / j->m.group;
    const int64_t i0 = qb * BM;
    const int64_t rows = imin64(sq.qlen - i0, BM);
    const int64_t rows4 = fattn_round_up(rows, 4);

    load_q_block(j, &w, &sq, b, h, i0, rows);
    memset(w.acc1, 0, sizeof(float) * (size_t)(rows4 * j->m.dp));
    int64_t kbeg, kend;
    key_range(p, &sq, i0, rows, &kbeg, &kend);
    for (int64_t j0 = kbeg; j0 < kend; j0 += BN) {
        const int64_t jn = imin64(kend - j0, BN);
        load_k_block(j, &w, &sq, hk, j0, jn, 1);
        if (j0 + BN < kend) {
            const int64_t nn = imin64(kend - j0 - BN, BN);
            prefetch_rows(&a->k, sq.kb, sq.k0 + j0 + BN, nn, hk, j->m.d);
            prefetch_rows(&a->v, sq.kb, sq.k0 + j0 + BN, nn, hk, j->m.dv);
        }
        int64_t vlo[FATTN_CPU_BM], vhi[FATTN_CPU_BM];
        tile_p(j, &w, &sq, i0, rows, j0, jn, vlo, vhi);
        tile_ds_from_p(j, &w, rows, vlo, vhi);
        /* dQ += dS K */
        j->kern.gemm((int)rows4, (int)j->m.dp, (int)jn, w.s, BN, w.k, j->m.dp, w.acc1, j->m.dp, 1);
    }
    for (int64_t r = 0; r < rows; r++) {
        int64_t tr = sq.q0 + i0 + r;
        fattn_store_row(&a->dq, fattn_row_offset(&a->dq, sq.tb, tr, h), (int)j->m.d,
                        w.acc1 + r * j->m.dp);
    }
}

fattn_status fattn_cpu_bwd(fattn_ctx *ctx, const fattn_bwd_args *a) {
    const fattn_problem *p = &a->p;
    bwd_job j;
    memset(&j, 0, sizeof j);
    j.a = a;
    j.f.seqused_q = a->seqused_q;
    j.f.seqused_k = a->seqused_k;
    j.kern = fattn_cpu_kernels_get(ctx ? ctx->cpu_isa : NULL);
    j.m = fattn_cpu_dims_of(p);

    if (fattn_tasks_init(&j.qtasks, p, &j.f, p->heads_q, 1, FATTN_CPU_BM) != 0)
        return fattn_fail(ctx, FATTN_ERROR_OUT_OF_MEMORY, "cpu bwd: out of memory (task list)");
    if (fattn_tasks_init(&j.ktasks, p, &j.f, p->heads_kv, 0, FATTN_CPU_BN) != 0) {
        fattn_tasks_free(&j.qtasks);
        return fattn_fail(ctx, FATTN_ERROR_OUT_OF_MEMORY, "cpu bwd: out of memory (task list)");
    }
    const int64_t nq = fattn_tasks_count(&j.qtasks), nk = fattn_tasks_count(&j.ktasks);
    int nthreads = fattn_cpu_thread_count(ctx ? ctx->threads : 0);
    const int64_t most = nq > nk ? nq : nk;
    if ((int64_t)nthreads > most) nthreads = most > 0 ? (int)most : 1;

    const size_t nd = (size_t)(p->heads_q * fattn_rows_q(p) * (p->cu_seqlens_q ? 1 : p->batch));
    j.dbuf = fattn_falloc(nd);
    j.scratch_floats = bwd_scratch_layout(&j, NULL, NULL);
    j.scratch = fattn_falloc(j.scratch_floats * (size_t)nthreads);
    if (!j.dbuf || !j.scratch) {
        free(j.dbuf);
        free(j.scratch);
        fattn_tasks_free(&j.qtasks);
        fattn_tasks_free(&j.ktasks);
        return fattn_fail(ctx, FATTN_ERROR_OUT_OF_MEMORY, "cpu bwd: cannot allocate scratch");
    }
    /* D from the f32 O the caller holds, else from P and dP (see above). */
    fattn_parallel_for(nthreads, nq, a->o.dtype == FATTN_DTYPE_F32 ? bwd_d_task : bwd_d_exact_task,
                       &j);
    if (a->dsink) bwd_dsink(&j);
    fattn_parallel_for(nthreads, nk, bwd_kv_task, &j);
    fattn_parallel_for(nthreads, nq, bwd_q_task, &j);
    free(j.dbuf);
    free(j.scratch);
    fattn_tasks_free(&j.qtasks);
    fattn_tasks_free(&j.ktasks);
    return FATTN_OK;
}
