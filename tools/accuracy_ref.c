/* accuracy_ref.c - the inputs of `fattn accuracy` and its FP64 reference
 * (accuracy.h): every row of the protocol is compared with this one output,
 * computed on the CPU from the f32 inputs. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "accuracy.h"
#include "tool.h"

/* ---------------------------------------------------------------- inputs */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double uniform01(uint64_t *s) { return ((double)(splitmix64(s) >> 11) + 0.5) * 0x1p-53; }
static double normal01(uint64_t *s) {
    return sqrt(-2.0 * log(uniform01(s))) * cos(6.283185307179586 * uniform01(s));
}

/* N(0,1) + N(0, 10^2) * Bernoulli(0.001) (protocol) or N(0,1), stored as f32
 * (the original input every row starts from). */
static void fill_inputs(float *x, size_t n, uint64_t seed, int protocol) {
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        double v = normal01(&s);
        if (protocol && uniform01(&s) < 0.001) v += 10.0 * normal01(&s);
        x[i] = (float)v;
    }
}

void acc_fill_inputs(float *const x[3], size_t n, uint64_t seed, int protocol) {
    uint64_t ss = seed;
    for (int t = 0; t < 3; t++) fill_inputs(x[t], n, splitmix64(&ss), protocol);
}

/* --------------------------------------------------------- FP64 reference */

typedef struct ref_job {
    int32_t batch, n, heads, d;
    const float *q, *k, *v; /* packed BSHD f32 */
    double *out;            /* packed BSHD */
    double *kt, *vd;        /* per (b, h): K^T [d][n] and V [n][d] in double */
    int32_t cur_b, cur_h;
    atomic_long next;       /* next query block */
} ref_job;

/* REF_ROWS query rows share every load of K^T and V (the loops were bound
 * by those loads with one row at a time); REF_KEYS keys at a time keep the
 * rows' scores in L1.  Each sum still runs over c (or t) in order, so the
 * result is the same to the bit as one row at a time. */
enum { REF_ROWS = 8, REF_KEYS = 256 };

static void ref_block(ref_job *j, int64_t blk, double *restrict s, double *restrict qd,
                      double *restrict o) {
    const int32_t n = j->n, d = j->d, H = j->heads;
    const int64_t r0 = blk * REF_ROWS;
    const int64_t rows = n - r0 < REF_ROWS ? n - r0 : REF_ROWS;
    const double scale = 1.0 / sqrt((double)d);
    for (int64_t r = 0; r < rows; r++) {
        const float *q = j->q + (((size_t)j->cur_b * n + (size_t)(r0 + r)) * H + j->cur_h) * d;
        for (int32_t c = 0; c < d; c++) qd[r * d + c] = (double)q[c] * scale;
    }
    for (int32_t t0 = 0; t0 < n; t0 += REF_KEYS) {
        const int32_t tn = n - t0 < REF_KEYS ? n - t0 : REF_KEYS;
        for (int64_t r = 0; r < rows; r++)
            for (int32_t t = 0; t < tn; t++) s[r * n + t0 + t] = 0.0;
        for (int32_t c = 0; c < d; c++) { /* inner loop over keys: vectorises */
            const double *restrict ktc = j->kt + (size_t)c * n + t0;
            for (int64_t r = 0; r < rows; r++) {
                const double qc = qd[r * d + c];
                double *restrict sr = s + r * n + t0;
                for (int32_t t = 0; t < tn; t++) sr[t] += qc * ktc[t];
            }
        }
    }
    double l[REF_ROWS];
    for (int64_t r = 0; r < rows; r++) {
        double *sr = s + r * n, m = -INFINITY, sum = 0.0;
        for (int32_t t = 0; t < n; t++) m = sr[t] > m ? sr[t] : m;
        for (int32_t t = 0; t < n; t++) sum += (sr[t] = exp(sr[t] - m));
        l[r] = sum;
        for (int32_t c = 0; c < d; c++) o[r * d + c] = 0.0;
    }
    for (int32_t t = 0; t < n; t++) {
        const double *restrict vt = j->vd + (size_t)t * d;
        for (int64_t r = 0; r < rows; r++) {
            const double p = s[r * n + t];
            double *restrict orow = o + r * d;
            for (int32_t c = 0; c < d; c++) orow[c] += p * vt[c];
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        double *dst = j->out + (((size_t)j->cur_b * n + (size_t)(r0 + r)) * H + j->cur_h) * d;
        for (int32_t c = 0; c < d; c++) dst[c] = o[r * d + c] / l[r];
    }
}

static void *ref_worker(void *arg) {
    ref_job *j = (ref_job *)arg;
    const int64_t nblk = (j->n + REF_ROWS - 1) / REF_ROWS;
    double *s = malloc(sizeof(double) * REF_ROWS * (size_t)j->n);
    double *qd = malloc(sizeof(double) * REF_ROWS * (size_t)j->d);
    double *o = malloc(sizeof(double) * REF_ROWS * (size_t)j->d);
    if (s && qd && o)
        for (;;) {
            long b = atomic_fetch_add(&j->next, 1);
            if (b >= nblk) break;
            ref_block(j, b, s, qd, o);
        }
    free(s);
    free(qd);
    free(o);
    return NULL;
}

/* O = softmax(Q K^T / sqrt(d)) V in double, exact two-pass softmax. */
void acc_reference_fp64(const char *cmd, int32_t batch, int32_t n, int32_t heads, int32_t d,
                        const float *q, const float *k, const float *v, double *out,
                        int threads) {
    ref_job j;
    memset(&j, 0, sizeof j);
    j.batch = batch; j.n = n; j.heads = heads; j.d = d;
    j.q = q; j.k = k; j.v = v; j.out = out;
    j.kt = malloc(sizeof(double) * (size_t)n * d);
    j.vd = malloc(sizeof(double) * (size_t)n * d);
    if (!j.kt || !j.vd) tool_die(cmd, "out of memory (FP64 reference)");
    if (threads > 64) threads = 64;
    for (int32_t b = 0; b < batch; b++)
        for (int32_t h = 0; h < heads; h++) {
            for (int32_t t = 0; t < n; t++) {
                const size_t off = (((size_t)b * n + t) * heads + h) * d;
                for (int32_t c = 0; c < d; c++) {
                    j.kt[(size_t)c * n + t] = k[off + c];
                    j.vd[(size_t)t * d + c] = v[off + c];
                }
            }
            j.cur_b = b; j.cur_h = h;
            atomic_store(&j.next, 0);
            pthread_t th[64];
            int started[64] = {0};
            for (int t = 1; t < threads; t++)
                started[t] = pthread_create(&th[t], NULL, ref_worker, &j) == 0;
            ref_worker(&j);
            for (int t = 1; t < threads; t++)
                if (started[t]) pthread_join(th[t], NULL);
        }
    free(j.kt);
    free(j.vd);
}
