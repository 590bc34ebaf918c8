/* oracle.h - FP64 reference attention for the tests (plain O(N^2) per head). */
#ifndef FATTN_ORACLE_H
#define FATTN_ORACLE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Sizes as in fattn_problem.  Arrays are packed BSHD doubles:
 *   q [batch, seqlen_q, heads_q, head_dim], k [batch, seqlen_k, heads_kv, head_dim],
 *   v [batch, seqlen_k, heads_kv, head_dim_v], o / dout [batch, seqlen_q, heads_q, head_dim_v],
 *   lse [batch, heads_q, seqlen_q] (natural log).
 * Variable length: cu_seqlens_q/k (host, int32[batch + 1]) non-NULL; then the
 * arrays are packed [total, heads, dim] and lse is [heads_q, total_q].
 * causal: key j visible to query i iff j <= i + seqlen_k - seqlen_q (per
 * sequence); a row with no visible key gets O = 0, LSE = -inf and zero
 * gradients.  Query head h reads kv head h / (heads_q / heads_kv). */
typedef struct oracle_problem {
    int batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v;
    double scale; /* 0 = 1/sqrt(head_dim) */
    int causal;
    const int32_t *cu_seqlens_q, *cu_seqlens_k;
    /* Variants (fattn.h, fattn_problem and fattn_fwd_args); zero = off.
     * window nonzero: query i sees key j iff i + off - window_left <= j <=
     * i + off + window_right, off = seqlen_k - seqlen_q, -1 unbounded.
     * softcap > 0: s -> softcap * tanh(s / softcap).  sink: NULL or
     * double[heads_q], an extra logit in each row's denominator (included in
     * the LSE; a row with no key gets O = 0, LSE = sink). */
    int window, window_left, window_right;
    double softcap;
    const double *sink;
} oracle_problem;

/* o and lse may be NULL when not wanted. */
void oracle_fwd(const oracle_problem *p, const double *q, const double *k, const double *v,
                double *o, double *lse);

/* dq, dk, dv of sum(dout * O).  Any output may be NULL. */
void oracle_bwd(const oracle_problem *p, const double *q, const double *k, const double *v,
                const double *dout, double *dq, double *dk, double *dv);

/* oracle_bwd, and dsink[heads_q] (may be NULL) = d sum(dout * O) / d sink. */
void oracle_bwd_sink(const oracle_problem *p, const double *q, const double *k, const double *v,
                     const double *dout, double *dq, double *dk, double *dv, double *dsink);

#ifdef __cplusplus
}
#endif

#endif
