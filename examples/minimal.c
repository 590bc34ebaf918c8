/* minimal.c - the smallest complete use of fattn: one attention forward on
 * the CPU.  README.md shows this file; CMake builds and runs it (ctest
 * example_minimal) and the install test builds it against the installed
 * package, so it stays true. */
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

    fattn_ctx_free(ctx);
    free(q), free(k), free(v), free(o);
    return 0;
}
