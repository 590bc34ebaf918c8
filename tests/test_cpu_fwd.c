/* test_cpu_fwd.c - CPU forward vs the FP64 oracle, with every forward
 * instance this CPU has (cpu_isas.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/oracle.h"
#include "common/testutil.h"
#include "cpu_isas.h"
#include "fattn.h"

typedef struct fcase {
    const char *name;
    int batch, sq, sk, hq, hkv, d, dv, causal;
    fattn_dtype dt, odt;
    tu_layout layout;
    const int32_t *cuq, *cuk; /* varlen when set */
    int scale_block;          /* e4m3 */
    double tol;               /* relative Frobenius error of O */
} fcase;

#define TOL_F32 1e-5
#define TOL_F16 2e-3  /* one f16 output ulp is 2^-11 ~ 4.9e-4 relative, x4 margin */
#define TOL_BF16 1.6e-2 /* one bf16 output ulp is 2^-8 ~ 3.9e-3 relative, x4 margin */
#define TOL_LSE 1e-4

static void run_case(fattn_ctx *ctx, tu_rng *rng, const fcase *c) {
    const int varlen = c->cuq != NULL;
    const int tb = varlen ? 1 : c->batch;
    const int tsq = varlen ? c->cuq[c->batch] : c->sq;
    const int tsk = varlen ? c->cuk[c->batch] : c->sk;
    const int dv = c->dv ? c->dv : c->d;
    int sq = c->sq, sk = c->sk;
    if (varlen) { /* the longest sequence of the batch */
        sq = tu_varlen_max(c->cuq, c->batch);
        sk = tu_varlen_max(c->cuk, c->batch);
    }
    tu_tensor q, k, v, o;
    tu_tensor_alloc(&q, c->dt, tb, tsq, c->hq, c->d, c->layout, c->scale_block);
    tu_tensor_alloc(&k, c->dt, tb, tsk, c->hkv, c->d, c->layout, c->scale_block);
    tu_tensor_alloc(&v, c->dt, tb, tsk, c->hkv, dv, c->layout, c->scale_block);
    tu_tensor_alloc(&o, c->odt, tb, tsq, c->hq, dv, c->layout, 1);
    const size_t nlse = (size_t)tb * c->hq * tsq;
    float *lse = (float *)tu_malloc(sizeof(float) * (nlse ? nlse : 1));
    tu_poison(lse, sizeof(float) * nlse);

    double *src = (double *)tu_malloc(sizeof(double) * (q.count + k.count + v.count + 1));
    double *hq_ = (double *)tu_malloc(sizeof(double) * (q.count + 1));
    double *hk_ = (double *)tu_malloc(sizeof(double) * (k.count + 1));
    double *hv_ = (double *)tu_malloc(sizeof(double) * (v.count + 1));
    double *oref = (double *)tu_malloc(sizeof(double) * (o.count + 1));
    double *ogot = (double *)tu_malloc(sizeof(double) * (o.count + 1));
    double *lref = (double *)tu_malloc(sizeof(double) * (nlse + 1));
    double *lgot = (double *)tu_malloc(sizeof(double) * (nlse + 1));
    tu_fill_normal(rng, src, q.count + k.count + v.count);
    tu_tensor_set(&q, src, hq_);
    tu_tensor_set(&k, src + q.count, hk_);
    tu_tensor_set(&v, src + q.count + k.count, hv_);

    oracle_problem op = {c->batch, sq, sk, c->hq, c->hkv, c->d, dv, 0.0, c->causal, c->cuq, c->cuk};
    oracle_fwd(&op, hq_, hk_, hv_, oref, lref);

    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = tu_problem(c->batch, sq, sk, c->hq, c->hkv, c->d, c->dv, c->causal, c->cuq, c->cuk);
    a.q = q.t;
    a.k = k.t;
    a.v = v.t;
    a.o = o.t;
    a.lse = lse;
    printf("%s\n", c->name);
    fattn_status st = fattn_fwd(ctx, &a);
    TU_CHECK(st == FATTN_OK, "fattn_fwd: %s (%s)", fattn_status_string(st), fattn_last_error(ctx));
    if (st == FATTN_OK) {
        tu_tensor_get(&o, ogot);
        for (size_t i = 0; i < nlse; i++) lgot[i] = lse[i];
        TU_CHECK(tu_count_nonfinite(ogot, o.count) == 0, "%zu output entries not written/finite",
                 tu_count_nonfinite(ogot, o.count));
        TU_EXPECT_LE(tu_rel_err(ogot, oref, o.count), c->tol, "O rel err");
        /* and row by row, to the same tolerance (it counts ulps of the output
         * type, which bound every row too): one wrong row, say one lane of a
         * panel, barely moves the norm of the whole tensor */
        double worst_row = 0.0;
        for (size_t r = 0; r < o.count / (size_t)dv; r++) {
            double e = tu_rel_err(ogot + r * (size_t)dv, oref + r * (size_t)dv, (size_t)dv);
            if (!(e <= worst_row)) worst_row = e;
        }
        TU_EXPECT_LE(worst_row, c->tol, "O worst row rel err");
        size_t nan = 0, inf_mismatch = 0;
        for (size_t i = 0; i < nlse; i++) {
            nan += isnan(lgot[i]);
            inf_mismatch += (lref[i] == -INFINITY) != (lgot[i] == -INFINITY);
        }
        TU_CHECK(nan == 0 && inf_mismatch == 0, "lse: %zu NaN, %zu -inf mismatches", nan,
                 inf_mismatch);
        TU_EXPECT_LE(tu_max_abs_err(lgot, lref, nlse), TOL_LSE, "LSE max abs err");
    }
    free(src); free(hq_); free(hk_); free(hv_); free(oref); free(ogot); free(lref); free(lgot);
    free(lse);
    tu_tensor_free(&q); tu_tensor_free(&k); tu_tensor_free(&v); tu_tensor_free(&o);
}

int main(void) {
    tu_rng rng;
    tu_rng_init(&rng, (uint64_t)tu_seed());
    fattn_ctx *ctx = NULL;
    TU_EXPECT_OK(fattn_ctx_create(&ctx, FATTN_BACKEND_CPU, 0));
    if (!ctx) return 1;

    static const int32_t cuq[] = {0, 5, 5, 40}, cuk[] = {0, 7, 7, 50};
    static const int32_t cuq2[] = {0, 0, 129, 146}, cuk2[] = {0, 3, 20, 166};
    const fattn_dtype F32 = FATTN_DTYPE_F32, F16 = FATTN_DTYPE_F16, BF16 = FATTN_DTYPE_BF16,
                      E4M3 = FATTN_DTYPE_E4M3;
    const fcase cases[] = {
        /* name                                   b   sq    sk  hq hkv  d   dv  cau  dt   odt */
        {"f32 1x1 d64",                            1,   1,    1, 2, 2,  64,  0, 0, F32, F32, TU_BSHD, 0, 0, 0, TOL_F32},
        {"f32 1x1 causal d64",                     2,   1,    1, 2, 2,  64,  0, 1, F32, F32, TU_BSHD, 0, 0, 0, TOL_F32},
        {"f32 2x2 causal d32",                     1,   2,    2, 3, 3,  32,  0, 1, F32, F32, TU_BSHD, 0, 0, 0, TOL_F32},
        {"f32 17x17 causal d32",                   2,  17,   17, 2, 2,  32,  0, 1, F32, F32, TU_BSHD, 0, 0, 0, TOL_F32},
        {"f32 17x17 d96",                          1,  17,   17, 2, 1,  96,  0, 0, F32, F32, TU_BSHD, 0, 0, 0, TOL_F32},
        {"f32 129x129 d96 batch 2",                2, 129,  129, 2, 2,  96,  0, 0, F32, F32, TU_BSHD, 0, 0, 0, TOL_F32},
        {"f32 129x129 causal d128",                1, 129,  129, 2, 2, 128,  0, 1, F32, F32, TU_BSHD, 0, 0, 0, TOL_F32},
        {"f32 q17 k129 causal GQA 4:1 d128",       1,  17,  129, 8, 2, 128,  0, 1, F32, F32, TU_BSHD, 0, 0, 0, TOL_F32},
        {"f32 q129 k17 causal (empty rows) d64",   2, 129,   17, 4, 1,  64,  0, 1, F32, F32, TU_BSHD, 0, 0, 0, TOL_F32},
        {"f32 q129 k17 non-causal MQA d64",        1, 129,   17, 4, 1,  64,  0, 0, F32, F32, TU_BSHD, 0, 0, 0, TOL_F32},
        {"f32 q2 k1000 d32",                       1,   2, 1000, 2, 2,  32,  0, 0, F32, F32, TU_BSHD, 0, 0, 0, TOL_F32},
        {"f32 1000x1000 causal MQA d64",           1,1000, 1000, 4, 1,  64,  0, 1, F32, F32, TU_BSHD, 0, 0, 0, TOL_F32},
        {"f32 1000x1000 d128",                     1,1000, 1000, 1, 1, 128,  0, 0, F32, F32, TU_BSHD, 0, 0, 0, TOL_F32},
        {"f32 129x200 causal d256",                1, 129,  200, 2, 1, 256,  0, 1, F32, F32, TU_BSHD, 0, 0, 0, TOL_F32},
        {"f32 d64 dv32 causal",                    1,  70,   90, 2, 2,  64, 32, 1, F32, F32, TU_BSHD, 0, 0, 0, TOL_F32},
        {"f32 d32 dv96",                           1,  33,   65, 2, 1,  32, 96, 0, F32, F32, TU_BSHD, 0, 0, 0, TOL_F32},
        {"f32 d5 (odd head dim)",                  1,  20,   31, 1, 1,   5,  0, 1, F32, F32, TU_BSHD, 0, 0, 0, TOL_F32},
        {"f32 d512 dv100 causal GQA",              1,  70,  230, 4, 2, 512,100, 1, F32, F32, TU_BSHD, 0, 0, 0, TOL_F32},
        {"f32 d1 dv512",                           2,  33,   40, 1, 1,   1,512, 0, F32, F32, TU_BSHD, 0, 0, 0, TOL_F32},
        {"f32 BHSD batch 3 causal GQA",            3,  77,  100, 4, 2,  64,  0, 1, F32, F32, TU_BHSD, 0, 0, 0, TOL_F32},
        {"f32 varlen {0,5,5,40}/{0,7,7,50} causal",3,   0,    0, 4, 2,  64,  0, 1, F32, F32, TU_BSHD, cuq, cuk, 0, TOL_F32},
        {"f32 varlen {0,5,5,40}/{0,7,7,50}",       3,   0,    0, 2, 2,  32,  0, 0, F32, F32, TU_BSHD, cuq, cuk, 0, TOL_F32},
        {"f32 varlen {0,0,129,146}/{0,3,20,166} causal", 3, 0, 0, 2, 1, 64, 0, 1, F32, F32, TU_BSHD, cuq2, cuk2, 0, TOL_F32},
        {"f16 129x129 causal d128 batch 2",        2, 129,  129, 2, 2, 128,  0, 1, F16, F16, TU_BSHD, 0, 0, 0, TOL_F16},
        {"f16 q17 k129 GQA d64",                   1,  17,  129, 4, 1,  64,  0, 0, F16, F16, TU_BSHD, 0, 0, 0, TOL_F16},
        {"bf16 129x129 causal d128 batch 2",       2, 129,  129, 2, 2, 128,  0, 1, BF16, BF16, TU_BSHD, 0, 0, 0, TOL_BF16},
        {"bf16 BHSD 100x60 causal d64",            2, 100,   60, 2, 1,  64,  0, 1, BF16, BF16, TU_BHSD, 0, 0, 0, TOL_BF16},
        {"e4m3->f32 129x200 block 64 d128",        2, 129,  200, 2, 1, 128,  0, 0, E4M3, F32, TU_BSHD, 0, 0, 64, TOL_F32},
        {"e4m3->f32 causal block 16 d64",          1, 100,  100, 2, 2,  64,  0, 1, E4M3, F32, TU_BSHD, 0, 0, 16, TOL_F32},
        {"e4m3->f16 block 128 d64",                1,  65,  130, 2, 2,  64,  0, 0, E4M3, F16, TU_BSHD, 0, 0, 128, TOL_F16},
        {"e4m3->bf16 BHSD block 32 d64",           2,  50,   70, 2, 1,  64,  0, 1, E4M3, BF16, TU_BHSD, 0, 0, 32, TOL_BF16},
        {"e4m3->f32 varlen block 8 causal",        3,   0,    0, 2, 1,  64,  0, 1, E4M3, F32, TU_BSHD, cuq, cuk, 8, TOL_F32},
    };
    for (int isa = 0; cpu_isa_next(&isa, &ctx);)
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(ctx, &rng, &cases[i]);
    fattn_ctx_free(ctx);
    return tu_finish("test_cpu_fwd");
}
