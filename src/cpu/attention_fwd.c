/* attention_fwd.c - CPU forward attention (DESIGN.md section 1, tiled).
 *
 * Work is split into tasks (batch entry, query head, block of 64..512 query
 * rows).  A task packs its queries (times softmax_scale) into panels of NR
 * transposed rows, then streams the keys it can see in blocks of BN: each
 * block is handed, with every panel, to the ISA's inner loop (fwd_block.h:
 * S^T = K Q^T and O^T += V^T P^T by register-tiled GEMMs, the online softmax
 * in between), then the panels are normalised and stored.  K and V are
 * converted (copied, for f32) block by block.  Results depend
 * only on each panel's own queries, never on the task height or the thread
 * count.  Scratch per worker is O(BM * d + BN * d), never seqlen_q x
 * seqlen_k.
 *
 * Serving fields: seqused_q, seqused_k, cache_leftpad and cache_batch_idx
 * only move a sequence's rows (fattn_seq_get), and with a block table the
 * rows of a key block are gathered from the pages of a page pool, run by run
 * (fwd_key_run); the block the inner loop sees is the same f32 block as for
 * a contiguous cache, so are the results. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/attention_common.h"
#include "cpu/kernels.h"
#include "cpu/load.h"
#include "cpu/scratch.h"
#include "cpu/threads.h"
#include "internal.h"

/* Query rows per task at most: each task packs every key block it sees
 * once, so taller tasks copy K and V less often (512 against 256: +2-4% at
 * 2 threads; q and o panels then take 4 KB per unit of head dim per worker). */
#define FATTN_CPU_FWD_BM_MAX 512

typedef struct fwd_job {
    const fattn_fwd_args *a;
    fattn_tasks tasks;
    fattn_fwd_kernel kern;
    const float *lut;
    fattn_seq_fields f; /* the serving fields that cut and move sequences */
    fattn_cpu_dims m; /* sizes derived from the problem (paged: rows_k = page_size) */
    int64_t bm;       /* query rows per task (64..FATTN_CPU_FWD_BM_MAX, a multiple of NR) */
    size_t scratch_floats;
    float *scratch;   /* per worker */
} fwd_job;

/* Per-worker scratch layout. */
typedef struct fwd_scratch {
    float *qp;    /* [BM/NR][d][NR]  Q^T panels, times softmax_scale */
    float *ot;    /* [BM/NR][dv][NR] unnormalised O^T panels */
    float *k;     /* [BN][dp]        the key block as f32 */
    float *v;     /* [BN][dvp]       the value block as f32 */
    float *s;     /* [BN][NR]        S^T, then P^T, of one panel */
    float *m;     /* [BM] running max */
    float *l;     /* [BM] running sum */
    float *alpha; /* [NR] */
    float *rows;  /* [NR][max(dp, dvp)] rows of one panel, before packing / after unpacking */
} fwd_scratch;

static size_t fwd_scratch_layout(const fwd_job *j, float *base, fwd_scratch *s) {
    const int64_t BM = j->bm, BN = j->kern.bn, NR = j->kern.nr;
    size_t off = 0;
    /* Each array starts one more cache line past a 4 KB boundary than the
     * last (the sizes are often multiples of 4 KB): the S stores and the Q,
     * K loads of the inner loop then never share their low 12 address bits,
     * which Intel cores mistake for a store-to-load dependency. */
#define TAKE(field, n) FATTN_SCRATCH_TAKE(s, base, off, field, (n) + 16 * skew++)
    int skew = 1;
    TAKE(qp, BM * j->m.d);
    TAKE(ot, BM * j->m.dv);
    TAKE(k, BN * j->m.dp);
    TAKE(v, BN * j->m.dvp);
    TAKE(s, BN * NR);
    TAKE(m, BM);
    TAKE(l, BM);
    TAKE(alpha, NR);
    TAKE(rows, NR * (j->m.dp > j->m.dvp ? j->m.dp : j->m.dvp));
#undef TAKE
    return off;
}

/* Keys key .. key + *n - 1 of sequence b, at most `want` of them, are rows
 * *row .. of batch entry *tb of k and v: the whole range for a contiguous
 * cache, else the part of it inside one page (a run; a left pad moves the
 * sequence's first key to position k0 of its table row). */
static inline void fwd_key_run(const fattn_fwd_args *a, const fattn_seq *sq, int64_t b,
                               int64_t key, int64_t want, int64_t *tb, int64_t *row, int64_t *n) {
    if (!a->block_table) {
        *tb = sq->kb;
        *row = sq->k0 + key;
        *n = want;
        return;
    }
    const int64_t ps = a->page_size, pos = sq->k0 + key, r = pos % ps;
    *tb = a->block_table[b * a->max_pages_per_seq + pos / ps];
    *row = r;
    *n = ps - r < want ? ps - r : want;
}

/* Rows of Q and O prefetched ahead of the one being converted. */
#define FWD_AHEAD 8

/* Ask for the cache lines of n elements at element offset off of t (to be
 * written when write). */
static void fwd_prefetch_row(const fattn_tensor *t, int64_t off, int64_t n, int write) {
    const size_t es = fattn_dtype_size(t->dtype);
    const char *p = (const char *)t->data + (size_t)off * es;
    for (size_t b = 0; b < (size_t)n * es; b += 64) {
        if (write) __builtin_prefetch(p + b, 1, 2);
        else __builtin_prefetch(p + b, 0, 2);
    }
}

/* The K and V rows of keys from .. to - 1 of sequence b, kv head hk. */
static void fwd_prefetch_keys(const fattn_fwd_args *a, const fattn_seq *sq, int64_t b, int64_t hk,
                              int64_t d, int64_t dv, int64_t from, int64_t to) {
    for (int64_t c = from; c < to;) {
        int64_t tb, r0, n;
        fwd_key_run(a, sq, b, c, to - c, &tb, &r0, &n);
        for (int64_t t = 0; t < n; t++) {
            fwd_prefetch_row(&a->k, fattn_row_offset(&a->k, tb, r0 + t, hk), d, 0);
            fwd_prefetch_row(&a->v, fattn_row_offset(&a->v, tb, r0 + t, hk), dv, 0);
        }
        c += n;
    }
}

static void fwd_task(void *arg, int64_t task, int worker) {
    const fwd_job *j = (const fwd_job *)arg;
    const fattn_fwd_args *a = j->a;
    const fattn_problem *p = &a->p;
    const int64_t BM = j->bm, BN = j->kern.bn, NR = j->kern.nr;
    const int64_t d = j->m.d, dv = j->m.dv;
    fwd_scratch w;
    fwd_scratch_layout(j, j->scratch + (size_t)worker * j->scratch_floats, &w);

    int64_t b, h, qb;
    fattn_tasks_decode(&j->tasks, task, &b, &h, &qb);
    if (p->causal) qb = j->tasks.nblk[b] - 1 - qb; /* longest blocks first */
    const fattn_seq sq = fattn_seq_get(p, &j->f, b);
    const int64_t hk = h / j->m.group;
    const int64_t i0 = qb * BM;
    const int64_t rows = sq.qlen - i0 < BM ? sq.qlen - i0 : BM;
    const int64_t npanels = (rows + NR - 1) / NR;
    const float sm_scale = p->softmax_scale;

    /* Keys visible to the last row of the task; with a window's left side,
     * the key blocks wholly before the first row's first key are skipped
     * (kbeg stays a multiple of BN, so each panel sees the same blocks
     * whatever the task's height). */
    int64_t kend = fattn_last_key(p, &sq, i0 + rows - 1) + 1;
    if (kend > sq.klen) kend = sq.klen;
    int64_t kbeg = fattn_first_key(p, &sq, i0);
    kbeg = kbeg <= 0 ? 0 : kbeg / BN * BN;

    /* Rows are heads * d apart in memory, a page or more: the hardware
     * prefetchers do not follow them, so the first key block and the query
     * rows a few ahead are asked for here (loads of cold rows were 10-25% of
     * short sequences). */
    if (kbeg < kend) fwd_prefetch_keys(a, &sq, b, hk, d, dv, kbeg, kbeg + BN < kend ? kbeg + BN : kend);
    for (int64_t r = 0; r < FWD_AHEAD && r < rows; r++)
        fwd_prefetch_row(&a->q, fattn_row_offset(&a->q, sq.tb, sq.q0 + i0 + r, h), d, 0);

    /* Query panels, scaled and transposed; padding lanes zero. */
    const int64_t ldr = j->m.dp > j->m.dvp ? j->m.dp : j->m.dvp;
    for (int64_t pi = 0; pi < npanels; pi++) {
        for (int64_t c = 0; c < NR; c++) {
            const int64_t r = pi * NR + c;
            float *row = w.rows + c * ldr;
            if (r >= rows) {
                memset(row, 0, sizeof(float) * (size_t)d);
                continue;
            }
            const int64_t tr = sq.q0 + i0 + r;
            if (r + FWD_AHEAD < rows)
                fwd_prefetch_row(&a->q, fattn_row_offset(&a->q, sq.tb, tr + FWD_AHEAD, h), d, 0);
            float mul = sm_scale * fattn_row_scale(&a->q, sq.tb, p->heads_q, h, j->m.rows_q, tr);
            fattn_load_row(&a->q, fattn_row_offset(&a->q, sq.tb, tr, h), (int)d, mul, j->lut, row);
        }
        j->kern.pack(w.rows, ldr, (int)d, w.qp + pi * d * NR);
    }
    for (int64_t r = 0; r < npanels * NR; r++) {
        w.m[r] = -INFINITY;
        w.l[r] = 0.0f;
    }

    fattn_fwd_block blk;
    blk.d = (int)d;
    blk.dv = (int)dv;
    blk.npanels = (int)npanels;
    blk.rows = (int)rows;
    blk.q0 = i0;
    /* key j visible to query i iff i + off - left <= j <= i + off */
    blk.off = p->causal || (p->window && p->window_right >= 0) ? fattn_last_key(p, &sq, 0) : sq.klen;
    /* the left side counted from off (which a right side has moved) */
    blk.left = fattn_window_left(p);
    if (blk.left >= 0) blk.left += blk.off - (sq.klen - sq.qlen);
    blk.softcap = p->softcap;
    /* a window's left side can skip a panel's first blocks: its O^T starts
     * at zero instead of being set by its first block */
    blk.ot_zeroed = blk.left >= 0;
    if (blk.ot_zeroed) memset(w.ot, 0, sizeof(float) * (size_t)(npanels * NR * dv));
    blk.qp = w.qp;
    blk.ot = w.ot;
    blk.m = w.m;
    blk.l = w.l;
    blk.s = w.s;
    blk.alpha = w.alpha;
    blk.k = w.k;
    blk.v = w.v;
    blk.ldk = j->m.dp;
    blk.ldv = j->m.dvp;
    for (int64_t j0 = kbeg; j0 < kend; j0 += BN) {
        const int64_t jn = kend - j0 < BN ? kend - j0 : BN;
        /* The next block's rows, strided by heads * d in memory, are fetched
         * while this block computes (copying them cold was 13% of d64). */
        if (j0 + BN < kend)
            fwd_prefetch_keys(a, &sq, b, hk, d, dv, j0 + BN, j0 + 2 * BN < kend ? j0 + 2 * BN : kend);
        /* Packed, even for f32: rows heads * d apart in the tensor share L1
         * sets (reading them in place measured 6-8% slower).  One run for a
         * contiguous cache, one per page touched for a paged one. */
        for (int64_t c = 0; c < jn;) {
            int64_t tb, r0, n;
            fwd_key_run(a, &sq, b, j0 + c, jn - c, &tb, &r0, &n);
            for (int64_t t = 0; t < n; t++, c++) {
                const int64_t tr = r0 + t;
                float ks = fattn_row_scale(&a->k, tb, p->heads_kv, hk, j->m.rows_k, tr);
                fattn_load_row(&a->k, fattn_row_offset(&a->k, tb, tr, hk), (int)d, ks, j->lut,
                               w.k + c * j->m.dp);
                float vs = fattn_row_scale(&a->v, tb, p->heads_kv, hk, j->m.rows_k, tr);
                fattn_load_row(&a->v, fattn_row_offset(&a->v, tb, tr, hk), (int)dv, vs, j->lut,
                               w.v + c * j->m.dvp);
            }
        }
        blk.j0 = j0;
        blk.jn = (int)jn;
        j->kern.run(&blk);
    }

    /* Normalise and store.  A sum of exactly 0 means no key was visible (or
     * every score was -inf): O = 0, LSE = -inf.  A NaN sum falls through and
     * makes O and LSE NaN.  A learnable sink adds exp(sink - M) to the sum
     * (M = max(m, sink)) and nothing to O; LSE includes it; a row that saw
     * no key gets O = 0 and LSE = sink (fattn.h). */
    const int has_sink = a->learnable_sink != NULL;
    const float sink = has_sink ? a->learnable_sink[h] : -INFINITY;
    for (int64_t r = 0; r < FWD_AHEAD && r < rows; r++)
        fwd_prefetch_row(&a->o, fattn_row_offset(&a->o, sq.tb, sq.q0 + i0 + r, h), dv, 1);
    for (int64_t r = 0; r < rows; r++) {
        if (r % NR == 0) j->kern.unpack(w.ot + (r / NR) * dv * NR, (int)dv, w.rows, ldr);
        if (r + FWD_AHEAD < rows)
            fwd_prefetch_row(&a->o, fattn_row_offset(&a->o, sq.tb, sq.q0 + i0 + r + FWD_AHEAD, h),
                             dv, 1);
        float *row = w.rows + (r % NR) * ldr;
        const float l = w.l[r];
        float lse;
        if (l == 0.0f) {
            memset(row, 0, sizeof(float) * (size_t)dv);
            lse = has_sink ? sink : -INFINITY;
        } else if (has_sink) {
            const float m = w.m[r];
            const float mx = sink > m ? sink : m; /* a NaN sink: m, then NaN below */
            const float keep = expf(m - mx);
            const float sum = l * keep + expf(sink - mx);
            const float mul = keep / sum;
            for (int64_t t = 0; t < dv; t++) row[t] *= mul;
            lse = mx + logf(sum);
        } else {
            const float inv = 1.0f / l;
            for (int64_t t = 0; t < dv; t++) row[t] *= inv;
            lse = w.m[r] + logf(l);
        }
        int64_t tr = sq.q0 + i0 + r;
        fattn_store_row(&a->o, fattn_row_offset(&a->o, sq.tb, tr, h), (int)dv, row);
        if (a->lse) a->lse[fattn_lse_index(p, &sq, b, h, i0 + r)] = lse;
    }
}

fattn_status fattn_cpu_fwd(fattn_ctx *ctx, const fattn_fwd_args *a) {
    const fattn_problem *p = &a->p;
    fwd_job j;
    memset(&j, 0, sizeof j);
    j.a = a;
    j.f.seqused_q = a->seqused_q;
    j.f.seqused_k = a->seqused_k;
    j.f.cache_batch_idx = a->cache_batch_idx;
    j.f.cache_leftpad = a->cache_leftpad;
    j.kern = fattn_cpu_kernels_get(ctx ? ctx->cpu_isa : NULL).fwd;
    j.m = fattn_cpu_dims_of(p);
    /* a page pool's e4m3 scales: [num_pages, heads_kv, ceil(page_size / block)] */
    if (a->block_table) j.m.rows_k = a->page_size;

    float lut[256];
    /* e4m3 inputs, or an FP8 KV cache beside 16-bit or f32 q */
    if (a->q.dtype == FATTN_DTYPE_E4M3 || a->k.dtype == FATTN_DTYPE_E4M3) {
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
        if (fattn_tasks_init(&j.tasks, p, &j.f, p->heads_q, 1, j.bm) != 0)
            return fattn_fail(ctx, FATTN_ERROR_OUT_OF_MEMORY, "cpu fwd: out of memory (task list)");
        if (j.bm <= FATTN_CPU_BM || fattn_tasks_count(&j.tasks) >= 4 * (int64_t)nthreads) break;
        fattn_tasks_free(&j.tasks);
        j.bm /= 2;
    }
    const int64_t ntasks = fattn_tasks_count(&j.tasks);
    if ((int64_t)nthreads > ntasks) nthreads = ntasks > 0 ? (int)ntasks : 1;

    j.scratch_floats = fwd_scratch_layout(&j, NULL, NULL);
    j.scratch = fattn_cpu_scratch_get(j.scratch_floats * (size_t)nthreads);
    if (!j.scratch) {
        fattn_tasks_free(&j.tasks);
        return fattn_fail(ctx, FATTN_ERROR_OUT_OF_MEMORY,
                          "cpu fwd: cannot allocate %zu bytes of scratch",
                          j.scratch_floats * (size_t)nthreads * sizeof(float));
    }
    fattn_parallel_for(nthreads, ntasks, fwd_task, &j);
    fattn_cpu_scratch_put(j.scratch);
    fattn_tasks_free(&j.tasks);
    return FATTN_OK;
}
