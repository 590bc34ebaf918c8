/* minimal.c - the smallest complete use of fattn: one attention forward on
 * the CPU, and a check of a few of its rows against attention written out
 * in plain C (exit 1 if they differ).  README.md shows this file; CMake
 * builds and runs it (ctest example_minimal) and the install test builds it
 * against the installed package, so it stays true. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <fattn.h>

int main(void) {
    enum { BATCH = 2, SEQ = 256, HEADS = 4, DIM = 64 };
    size_t n = (size_t)BATCH * SEQ * HEADS * DIM; /* packed [batch, seq, heads, dim] */
    float *q = malloc(n * sizeof *q), *k = malloc(n * sizeof *k);
    float *v = malloc(n * sizeof *v), *o = malloc(n * sizeof *o);
    if (!q || !k || !v || !o) return 1;
    for (size_t i = 0; i < n; i++) {
        q[i] = sinf(0.01f * (float)i);
        k[i] = cosf(0.02f * (float)i);
        v[i] = (float)(i % 7) - 3.0f;
    }

    fattn_ctx *ctx;
    fattn_status st = fattn_ctx_create(&ctx, FATTN_BACKEND_CPU, 0);
    if (st != FATTN_OK) {
        fprintf(stderr, "fattn_ctx_create: %s: %s\n", fattn_status_string(st), fattn_last_error(NULL));
        return 1;
    }

    fattn_fwd_args args = {0};
    args.p.batch = BATCH;
    args.p.seqlen_q = args.p.seqlen_k = SEQ;
    args.p.heads_q = args.p.heads_kv = HEADS;
    args.p.head_dim = DIM;   /* head_dim_v 0 = head_dim, softmax_scale 0 = 1/sqrt(DIM) */
    args.p.causal = 1;
    args.q = fattn_tensor_bshd(q, FATTN_DTYPE_F32);
    args.k = fattn_tensor_bshd(k, FATTN_DTYPE_F32);
    args.v = fattn_tensor_bshd(v, FATTN_DTYPE_F32);
    args.o = fattn_tensor_bshd(o, FATTN_DTYPE_F32);

    st = fattn_fwd(ctx, &args);
    if (st != FATTN_OK) {
        fprintf(stderr, "fattn_fwd: %s: %s\n", fattn_status_string(st), fattn_last_error(ctx));
        return 1;
    }
    printf("fattn %s: o[0] = %.4f, o[last] = %.4f\n", fattn_version_string(), o[0], o[n - 1]);

    /* Row i of head h sees keys 0..i (causal): o = sum_j softmax_j(q.k_j / sqrt(DIM)) v_j.
     * fattn computes in f32 with a fast exp (errors of a few 1e-6 relative);
     * a wrong key or row is off by far more than the 1e-4 allowed. */
    double worst = 0.0;
    const int rows[][3] = {{0, 0, 0}, {0, 1, 3}, {1, 100, 2}, {1, SEQ - 1, HEADS - 1}}; /* batch, token, head */
    for (int r = 0; r < 4; r++) {
        const int b = rows[r][0], i = rows[r][1], h = rows[r][2];
        const float *qi = q + (((size_t)b * SEQ + i) * HEADS + h) * DIM;
        double s[SEQ], smax = -INFINITY, sum = 0.0, ref[DIM] = {0.0}, norm = 0.0, err = 0.0;
        for (int j = 0; j <= i; j++) {
            const float *kj = k + (((size_t)b * SEQ + j) * HEADS + h) * DIM;
            s[j] = 0.0;
            for (int d = 0; d < DIM; d++) s[j] += (double)qi[d] * kj[d];
            s[j] /= sqrt((double)DIM);
            if (s[j] > smax) smax = s[j];
        }
        for (int j = 0; j <= i; j++) {
            const float *vj = v + (((size_t)b * SEQ + j) * HEADS + h) * DIM;
            const double p = exp(s[j] - smax);
            sum += p;
            for (int d = 0; d < DIM; d++) ref[d] += p * vj[d];
        }
        const float *oi = o + (((size_t)b * SEQ + i) * HEADS + h) * DIM;
        for (int d = 0; d < DIM; d++) {
            ref[d] /= sum;
            norm += ref[d] * ref[d];
            err += (oi[d] - ref[d]) * (oi[d] - ref[d]);
        }
        const double rel = sqrt(err / norm);
        if (!(rel <= worst)) worst = rel; /* NaN counts */
    }
    printf("4 rows against plain C: largest relative error %.2e\n", worst);
    fattn_ctx_free(ctx);
    free(q), free(k), free(v), free(o);
    if (!(worst <= 1e-4)) {
        fprintf(stderr, "minimal: fattn's output differs from the plain C attention\n");
        return 1;
    }
    return 0;
}
