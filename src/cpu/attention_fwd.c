/* attention_fwd.c - CPU forward attention (DESIGN.md §1, tiled).
 *
 * Work is split into tasks (batch entry, query head, block of 64..256 query
 * rows).  A task loads its query block (times softmax_scale) to f32,
 * then streams the visible keys in blocks of FATTN_CPU_BN: K^T and V of the
 * block are converted to f32 scratch, S = Q K^T by the register-blocked GEMM,
 * the running max / sum / output are updated, O += P V by the same GEMM.
 * Every output row is produced by exactly one task with a fixed operation
 * order, so results do not depend on the thread count.  Scratch per worker is
 * O(BM*d + BN*d), never seqlen_q x seqlen_k. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/attention_common.h"
#include "cpu/kernels.h"
#include "cpu/load.h"
#include "cpu/threads.h"
#include "internal.h"

#define FATTN_CPU_FWD_BM_MAX 256

typedef struct fwd_job {
    const fattn_fwd_args *a;
    fattn_tasks tasks;
    fattn_cpu_kernels kern;
    const float *lut;
    fattn_cpu_dims m; /* sizes derived from the problem */
    int64_t bm;             /* query rows per task (64..FATTN_CPU_FWD_BM_MAX) */
    size_t scratch_floats;
    float *scratch;         /* per worker */
} fwd_job;

/* Per-worker scratch layout. */
typedef struct fwd_scratch {
    float *q;   /* [BM x dp]  query block times softmax_scale */
    float *kt;  /* [d x BN]   K^T of the key block */
    float *v;   /* [BN x dvp] V of the key block */
    float *s;   /* [BM x BN]  scores, then probabilities */
    float *o;   /* [BM x dvp] unnormalised output */
    float *m;   /* [BM] running max */
    float *l;   /* [BM] running sum */
    float *row; /* [max(d, dv)] conversion buffer */
} fwd_scratch;

static size_t fwd_scratch_layout(const fwd_job *j, float *base, fwd_scratch *s) {
    const int64_t BM = j->bm, BN = FATTN_CPU_BN;
    size_t off = 0;
#define TAKE(field, n) FATTN_SCRATCH_TAKE(s, base, off, field, n)
    TAKE(q, BM * j->m.dp);
    TAKE(kt, j->m.d * BN);
    TAKE(v, BN * j->m.dvp);
    TAKE(s, BM * BN);
    TAKE(o, BM * j->m.dvp);
    TAKE(m, BM);
    TAKE(l, BM);
    TAKE(row, (j->m.d > j->m.dv ? j->m.d : j->m.dv));
#undef TAKE
    return off;
}

static void fwd_task(void *arg, int64_t task, int worker) {
    const fwd_job *j = (const fwd_job *)arg;
    const fattn_fwd_args *a = j->a;
    const fattn_problem *p = &a->p;
    const int64_t BM = j->bm, BN = FATTN_CPU_BN;
    const int64_t d = j->m.d, dv = j->m.dv, dp = j->m.dp, dvp = j->m.dvp;
    fwd_scratch w;
    fwd_scratch_layout(j, j->scratch + (size_t)worker * j->scratch_floats, &w);

    int64_t b, h, qb;
    fattn_tasks_decode(&j->tasks, task, &b, &h, &qb);
    if (p->causal) qb = j->tasks.nblk[b] - 1 - qb; /* longest blocks first */
    const fattn_seq sq = fattn_seq_get(p, b);
    const int64_t hk = h / j->m.group;
    const int64_t i0 = qb * BM;
    const int64_t rows = sq.qlen - i0 < BM ? sq.qlen - i0 : BM;
    const int64_t rows4 = fattn_round_up(rows, 4);
    const float sm_scale = p->softmax_scale;

    /* Query block, scaled; padding rows zero. */
    for (int64_t r = 0; r < rows; r++) {
        int64_t tr = sq.q0 + i0 + r;
        float mul = sm_scale * fattn_row_scale(&a->q, sq.tb, p->heads_q, h, j->m.rows_q, tr);
        fattn_load_row(&a->q, fattn_row_offset(&a->q, sq.tb, tr, h), (int)d, mul, j->lut,
                       w.q + r * dp);
    }
    for (int64_t r = rows; r < rows4; r++) memset(w.q + r * dp, 0, sizeof(float) * (size_t)dp);
    memset(w.o, 0, sizeof(float) * (size_t)(rows4 * dvp));
    for (int64_t r = 0; r < rows4; r++) {
        w.m[r] = -INFINITY;
        w.l[r] = 0.0f;
    }

    /* Keys visible to the last row of the block. */
    int64_t kend = fattn_last_key(p, &sq, i0 + rows - 1) + 1;
    if (kend > sq.klen) kend = sq.klen;
    /* Keys visible to every row of the block (no masking needed below it). */
    const int64_t kfull = fattn_last_key(p, &sq, i0) + 1;

    for (int64_t j0 = 0; j0 < kend; j0 += BN) {
        const int64_t jn = kend - j0 < BN ? kend - j0 : BN;
        const int64_t jn16 = fattn_round_up(jn, 16);
        /* K^T and V of the block. */
        for (int64_t c = 0; c < jn; c++) {
            int64_t tr = sq.k0 + j0 + c;
            float ks = fattn_row_scale(&a->k, sq.tb, p->heads_kv, hk, j->m.rows_k, tr);
            fattn_load_row(&a->k, fattn_row_offset(&a->k, sq.tb, tr, hk), (int)d, ks, j->lut,
                           w.row);
            for (int64_t t = 0; t < d; t++) w.kt[t * BN + c] = w.row[t];
            float vs = fattn_row_scale(&a->v, sq.tb, p->heads_kv, hk, j->m.rows_k, tr);
            fattn_load_row(&a->v, fattn_row_offset(&a->v, sq.tb, tr, hk), (int)dv, vs, j->lut,
                           w.v + c * dvp);
        }
        if (jn < jn16)
            for (int64_t t = 0; t < d; t++)
                memset(w.kt + t * BN + jn, 0, sizeof(float) * (size_t)(jn16 - jn));

        j->kern.gemm((int)rows4, (int)jn16, (int)d, w.q, dp, w.kt, BN, w.s, BN, 0);

        const int need_mask = j0 + jn > kfull;
        for (int64_t r = 0; r < rows; r++) {
            float *srow = w.s + r * BN;
            int64_t vis = jn; /* visible columns of this row in the block */
            if (need_mask) {
                int64_t last = fattn_last_key(p, &sq, i0 + r);
                vis = last - j0 + 1;
                if (vis < 0) vis = 0;
                if (vis > jn) vis = jn;
            }
            float mx = -INFINITY;
            for (int64_t c = 0; c < vis; c++) mx = srow[c] > mx ? srow[c] : mx;
            const float m_old = w.m[r];
            const float m_new = mx > m_old ? mx : m_old;
            /* Max -inf (nothing finite seen yet): subtract 0 instead, so that
             * -inf scores give 0 and NaN scores stay NaN (FlashAttention's
             * guard; never skip the row, or a NaN q would look masked). */
            const float m_use = m_new == -INFINITY ? 0.0f : m_new;
            for (int64_t c = vis; c < jn; c++) srow[c] = -INFINITY;
            const float rs = j->kern.exp_sub(srow, (int)jn, m_use);
            if (m_new != m_old) {
                const float alpha = expf(m_old - m_use);
                float *orow = w.o + r * dvp;
                for (int64_t t = 0; t < dv; t++) orow[t] *= alpha;
                w.l[r] = w.l[r] * alpha + rs;
            } else {
                w.l[r] += rs;
            }
            w.m[r] = m_new;
        }
        /* padding rows of the tile: P = 0 */
        for (int64_t r = rows; r < rows4; r++) memset(w.s + r * BN, 0, sizeof(float) * (size_t)jn);

        j->kern.gemm((int)rows4, (int)dvp, (int)jn, w.s, BN, w.v, dvp, w.o, dvp, 1);
    }

    /* Normalise and store. */
    for (int64_t r = 0; r < rows; r++) {
        float *orow = w.o + r * dvp;
        float lse;
        if (w.l[r] == 0.0f) { /* no key visible, or all scores -inf; NaN l falls through */
            memset(orow, 0, sizeof(float) * (size_t)dv);
            lse = -INFINITY;
        } else {
            const float inv = 1.0f / w.l[r];
            for (int64_t t = 0; t < dv; t++) orow[t] *= inv;
            lse = w.m[r] + logf(w.l[r]);
        }
        int64_t tr = sq.q0 + i0 + r;
        fattn_store_row(&a->o, fattn_row_offset(&a->o, sq.tb, tr, h), (int)dv, orow);
        if (a->lse) a->lse[fattn_lse_index(p, &sq, b, h, i0 + r)] = lse;
    }
}

fattn_status fattn_cpu_fwd(fattn_ctx *ctx, const fattn_fwd_args *a) {
    const fattn_problem *p = &a->p;
    fwd_job j;
    memset(&j, 0, sizeof j);
    j.a = a;
    j.kern = fattn_cpu_kernels_get();
    j.m = fattn_cpu_dims_of(p);

    float lut[256];
    if (a->q.dtype == FATTN_DTYPE_E4M3) {
        fattn_e4m3_table(lut);
        j.lut = lut;
    }

    /* Query rows per task: as many as keep >= 4 tasks per worker (each task
     * streams all visible K/V once, so taller blocks mean less K/V traffic).
     * Every row's arithmetic is independent of the block height, so this
     * choice (which depends on the thread count) never changes results. */
    int nthreads = fattn_cpu_thread_count(ctx ? ctx->threads : 0);
    j.bm = FATTN_CPU_FWD_BM_MAX;
    for (;;) {
        if (fattn_tasks_init(&j.tasks, p, p->heads_q, 1, j.bm) != 0)
            return fattn_fail(ctx, FATTN_ERROR_OUT_OF_MEMORY, "cpu fwd: out of memory (task list)");
        if (j.bm <= FATTN_CPU_BM || fattn_tasks_count(&j.tasks) >= 4 * (int64_t)nthreads) break;
        fattn_tasks_free(&j.tasks);
        j.bm /= 2;
    }
    const int64_t ntasks = fattn_tasks_count(&j.tasks);
    if ((int64_t)nthreads > ntasks) nthreads = ntasks > 0 ? (int)ntasks : 1;

    j.scratch_floats = fwd_scratch_layout(&j, NULL, NULL);
    j.scratch = fattn_falloc(j.scratch_floats * (size_t)nthreads);
    if (!j.scratch) {
        fattn_tasks_free(&j.tasks);
        return fattn_fail(ctx, FATTN_ERROR_OUT_OF_MEMORY,
                          "cpu fwd: cannot allocate %zu bytes of scratch",
                          j.scratch_floats * (size_t)nthreads * sizeof(float));
    }
    fattn_parallel_for(nthreads, ntasks, fwd_task, &j);
    free(j.scratch);
    fattn_tasks_free(&j.tasks);
    return FATTN_OK;
}
