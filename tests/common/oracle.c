/* oracle.c - see oracle.h. */
#include "common/oracle.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct seq_view {
    int64_t q0, k0;  /* first token row of the sequence in the arrays */
    int64_t qlen, klen;
    int64_t lse_base, lse_stride_h; /* lse index = lse_base + h * lse_stride_h + i */
} seq_view;

static seq_view view_of(const oracle_problem *p, int b) {
    seq_view s;
    if (p->cu_seqlens_q) {
        s.q0 = p->cu_seqlens_q[b];
        s.k0 = p->cu_seqlens_k[b];
        s.qlen = p->cu_seqlens_q[b + 1] - s.q0;
        s.klen = p->cu_seqlens_k[b + 1] - s.k0;
        s.lse_base = s.q0;
        s.lse_stride_h = p->cu_seqlens_q[p->batch];
    } else {
        s.q0 = (int64_t)b * p->seqlen_q;
        s.k0 = (int64_t)b * p->seqlen_k;
        s.qlen = p->seqlen_q;
        s.klen = p->seqlen_k;
        s.lse_base = (int64_t)b * p->heads_q * p->seqlen_q;
        s.lse_stride_h = p->seqlen_q;
    }
    return s;
}

static double scale_of(const oracle_problem *p) {
    return p->scale != 0.0 ? p->scale : 1.0 / sqrt((double)p->head_dim);
}

static int dv_of(const oracle_problem *p) { return p->head_dim_v > 0 ? p->head_dim_v : p->head_dim; }

/* The keys row i sees: [*first, *last] (may be empty). */
static void row_range(const oracle_problem *p, const seq_view *s, int64_t i, int64_t *first,
                      int64_t *last) {
    const int64_t off = s->klen - s->qlen;
    *first = 0;
    *last = s->klen - 1;
    if (p->window && p->window_left >= 0) *first = i + off - p->window_left;
    if (p->window && p->window_right >= 0 && i + off + p->window_right < *last) *last = i + off + p->window_right;
    if (p->causal && i + off < *last) *last = i + off;
    if (*first < 0) *first = 0;
}

/* Probabilities of row i of (sequence s, head h) into prow[0..klen); returns
 * the natural-log LSE (-inf when no key is visible and no sink, prow all 0).
 * trow (may be NULL) receives the softcap's derivative 1 - tanh^2(s / softcap)
 * of each visible key. */
static double row_probs_t(const oracle_problem *p, const seq_view *s, int h, int64_t i,
                          const double *q, const double *k, double *prow, double *trow) {
    const int d = p->head_dim, hk = h / (p->heads_q / p->heads_kv);
    const double sc = scale_of(p);
    int64_t first, last;
    row_range(p, s, i, &first, &last);
    const double *qi = q + ((s->q0 + i) * p->heads_q + h) * d;
    double mx = -INFINITY;
    for (int64_t j = 0; j < s->klen; j++) {
        if (j > last || j < first) {
            prow[j] = -INFINITY;
            continue;
        }
        const double *kj = k + ((s->k0 + j) * p->heads_kv + hk) * d;
        double acc = 0.0;
        for (int t = 0; t < d; t++) acc += qi[t] * kj[t];
        prow[j] = acc * sc;
        if (p->softcap > 0.0) {
            const double x = prow[j] / p->softcap, ch = cosh(x);
            if (trow) trow[j] = 1.0 / (ch * ch); /* 1 - tanh^2, also where tanh rounds to 1 */
            prow[j] = p->softcap * tanh(x);
        }
        if (prow[j] > mx) mx = prow[j];
    }
    const double sink = p->sink ? p->sink[h] : -INFINITY;
    if (sink > mx) mx = sink;
    if (mx == -INFINITY) {
        for (int64_t j = 0; j < s->klen; j++) prow[j] = 0.0;
        return -INFINITY;
    }
    double sum = p->sink ? exp(sink - mx) : 0.0;
    for (int64_t j = 0; j < s->klen; j++) {
        prow[j] = (j > last || j < first) ? 0.0 : exp(prow[j] - mx);
        sum += prow[j];
    }
    for (int64_t j = 0; j < s->klen; j++) prow[j] /= sum;
    return mx + log(sum);
}

static double row_probs(const oracle_problem *p, const seq_view *s, int h, int64_t i,
                        const double *q, const double *k, double *prow) {
    return row_probs_t(p, s, h, i, q, k, prow, NULL);
}

static int64_t max_klen(const oracle_problem *p) {
    int64_t m = p->cu_seqlens_k ? 0 : p->seqlen_k;
    if (p->cu_seqlens_k)
        for (int b = 0; b < p->batch; b++) {
            int64_t l = p->cu_seqlens_k[b + 1] - p->cu_seqlens_k[b];
            if (l > m) m = l;
        }
    return m > 0 ? m : 1;
}

void oracle_fwd(const oracle_problem *p, const double *q, const double *k, const double *v,
                double *o, double *lse) {
    const int dv = dv_of(p), group = p->heads_q / p->heads_kv;
    double *prow = (double *)malloc(sizeof(double) * (size_t)max_klen(p));
    if (!prow) abort();
    for (int b = 0; b < p->batch; b++) {
        seq_view s = view_of(p, b);
        for (int h = 0; h < p->heads_q; h++) {
            const int hk = h / group;
            for (int64_t i = 0; i < s.qlen; i++) {
                double l = row_probs(p, &s, h, i, q, k, prow);
                if (lse) lse[s.lse_base + h * s.lse_stride_h + i] = l;
                if (!o) continue;
                double *oi = o + ((s.q0 + i) * p->heads_q + h) * dv;
                for (int t = 0; t < dv; t++) oi[t] = 0.0;
                for (int64_t j = 0; j < s.klen; j++) {
                    if (prow[j] == 0.0) continue;
                    const double *vj = v + ((s.k0 + j) * p->heads_kv + hk) * dv;
                    for (int t = 0; t < dv; t++) oi[t] += prow[j] * vj[t];
                }
            }
        }
    }
    free(prow);
}

void oracle_bwd(const oracle_problem *p, const double *q, const double *k, const double *v,
                const double *dout, double *dq, double *dk, double *dv_out) {
    oracle_bwd_sink(p, q, k, v, dout, dq, dk, dv_out, NULL);
}

void oracle_bwd_sink(const oracle_problem *p, const double *q, const double *k, const double *v,
                     const double *dout, double *dq, double *dk, double *dv_out, double *dsink) {
    const int d = p->head_dim, dv = dv_of(p), group = p->heads_q / p->heads_kv;
    const double sc = scale_of(p);
    const int64_t kl = max_klen(p);
    double *prow = (double *)malloc(sizeof(double) * (size_t)kl);
    double *dprow = (double *)malloc(sizeof(double) * (size_t)kl);
    double *trow = (double *)malloc(sizeof(double) * (size_t)kl);
    if (dsink)
        for (int h = 0; h < p->heads_q; h++) dsink[h] = 0.0;
    int64_t tq = p->cu_seqlens_q ? p->cu_seqlens_q[p->batch] : (int64_t)p->batch * p->seqlen_q;
    int64_t tk = p->cu_seqlens_k ? p->cu_seqlens_k[p->batch] : (int64_t)p->batch * p->seqlen_k;
    /* local accumulators so that NULL outputs are allowed */
    double *gq = (double *)calloc((size_t)(tq * p->heads_q * d) + 1, sizeof(double));
    double *gk = (double *)calloc((size_t)(tk * p->heads_kv * d) + 1, sizeof(double));
    double *gv = (double *)calloc((size_t)(tk * p->heads_kv * dv) + 1, sizeof(double));
    if (!prow || !dprow || !trow || !gq || !gk || !gv) abort();
    for (int b = 0; b < p->batch; b++) {
        seq_view s = view_of(p, b);
        for (int h = 0; h < p->heads_q; h++) {
            const int hk = h / group;
            for (int64_t i = 0; i < s.qlen; i++) {
                double l = row_probs_t(p, &s, h, i, q, k, prow, trow);
                if (l == -INFINITY) continue;
                const double *qi = q + ((s.q0 + i) * p->heads_q + h) * d;
                const double *doi = dout + ((s.q0 + i) * p->heads_q + h) * dv;
                double Di = 0.0;
                for (int64_t j = 0; j < s.klen; j++) {
                    dprow[j] = 0.0;
                    if (prow[j] == 0.0) continue;
                    const double *vj = v + ((s.k0 + j) * p->heads_kv + hk) * dv;
                    double acc = 0.0;
                    for (int t = 0; t < dv; t++) acc += doi[t] * vj[t];
                    dprow[j] = acc;
                    Di += prow[j] * acc; /* = rowsum(dO * O) */
                }
                /* the sink's column: P = exp(sink - lse), no value row, so dP = 0 */
                if (dsink && p->sink) dsink[h] -= exp(p->sink[h] - l) * Di;
                double *gqi = gq + ((s.q0 + i) * p->heads_q + h) * d;
                for (int64_t j = 0; j < s.klen; j++) {
                    if (prow[j] == 0.0) continue;
                    double ds = prow[j] * (dprow[j] - Di) * sc;
                    if (p->softcap > 0.0) ds *= trow[j];
                    const double *kj = k + ((s.k0 + j) * p->heads_kv + hk) * d;
                    double *gkj = gk + ((s.k0 + j) * p->heads_kv + hk) * d;
                    double *gvj = gv + ((s.k0 + j) * p->heads_kv + hk) * dv;
                    for (int t = 0; t < d; t++) {
                        gqi[t] += ds * kj[t];
                        gkj[t] += ds * qi[t];
                    }
                    for (int t = 0; t < dv; t++) gvj[t] += prow[j] * doi[t];
                }
            }
        }
    }
    if (dq) memcpy(dq, gq, sizeof(double) * (size_t)(tq * p->heads_q * d));
    if (dk) memcpy(dk, gk, sizeof(double) * (size_t)(tk * p->heads_kv * d));
    if (dv_out) memcpy(dv_out, gv, sizeof(double) * (size_t)(tk * p->heads_kv * dv));
    free(prow);
    free(dprow);
    free(trow);
    free(gq);
    free(gk);
    free(gv);
}
