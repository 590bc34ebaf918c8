/* test_cpu_determinism.c - the CPU engine is bitwise reproducible: the same
 * call twice, and with 1, 2 and 3 worker threads, gives identical bytes for
 * O, LSE, dQ, dK and dV, with every forward instance this CPU has; and the
 * AVX-512 instance agrees bitwise with its AVX2 build (avx2w16). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/testutil.h"
#include "cpu_isas.h"
#include "fattn.h"

typedef struct dcase {
    const char *name;
    int batch, sq, sk, hq, hkv, d, causal;
    fattn_dtype dt;
    const int32_t *cuq, *cuk;
} dcase;

typedef struct outputs {
    tu_tensor o, dq, dk, dv;
    float *lse;
    size_t nlse;
} outputs;

static int run(fattn_ctx *ctx, const fattn_problem *p, tu_tensor *q, tu_tensor *k, tu_tensor *v,
               tu_tensor *dO, outputs *out) {
    tu_tensor_poison(&out->o);
    tu_tensor_poison(&out->dq);
    tu_tensor_poison(&out->dk);
    tu_tensor_poison(&out->dv);
    tu_poison(out->lse, sizeof(float) * out->nlse);
    fattn_fwd_args fa;
    memset(&fa, 0, sizeof fa);
    fa.p = *p;
    fa.q = q->t; fa.k = k->t; fa.v = v->t; fa.o = out->o.t;
    fa.lse = out->lse;
    fattn_status st = fattn_fwd(ctx, &fa);
    TU_CHECK(st == FATTN_OK, "fattn_fwd: %s", fattn_last_error(ctx));
    if (st != FATTN_OK) return 0;
    fattn_bwd_args ba;
    memset(&ba, 0, sizeof ba);
    ba.p = *p;
    ba.q = q->t; ba.k = k->t; ba.v = v->t; ba.o = out->o.t; ba.dout = dO->t;
    ba.dq = out->dq.t; ba.dk = out->dk.t; ba.dv = out->dv.t;
    ba.lse = out->lse;
    ba.deterministic = 1;
    st = fattn_bwd(ctx, &ba);
    TU_CHECK(st == FATTN_OK, "fattn_bwd: %s", fattn_last_error(ctx));
    return st == FATTN_OK;
}

static int same(const outputs *a, const outputs *b) {
    return memcmp(a->o.t.data, b->o.t.data, a->o.bytes) == 0 &&
           memcmp(a->dq.t.data, b->dq.t.data, a->dq.bytes) == 0 &&
           memcmp(a->dk.t.data, b->dk.t.data, a->dk.bytes) == 0 &&
           memcmp(a->dv.t.data, b->dv.t.data, a->dv.bytes) == 0 &&
           memcmp(a->lse, b->lse, sizeof(float) * a->nlse) == 0;
}

static void run_case(tu_rng *rng, const dcase *c) {
    const int varlen = c->cuq != NULL;
    const int tb = varlen ? 1 : c->batch;
    const int tsq = varlen ? c->cuq[c->batch] : c->sq;
    const int tsk = varlen ? c->cuk[c->batch] : c->sk;
    tu_tensor q, k, v, dO;
    tu_tensor_alloc(&q, c->dt, tb, tsq, c->hq, c->d, TU_BSHD, 1);
    tu_tensor_alloc(&k, c->dt, tb, tsk, c->hkv, c->d, TU_BSHD, 1);
    tu_tensor_alloc(&v, c->dt, tb, tsk, c->hkv, c->d, TU_BSHD, 1);
    tu_tensor_alloc(&dO, c->dt, tb, tsq, c->hq, c->d, TU_BSHD, 1);
    size_t n = q.count + k.count + v.count + dO.count;
    double *src = (double *)tu_malloc(sizeof(double) * n);
    tu_fill_normal(rng, src, n);
    tu_tensor_set(&q, src, NULL);
    tu_tensor_set(&k, src + q.count, NULL);
    tu_tensor_set(&v, src + q.count + k.count, NULL);
    tu_tensor_set(&dO, src + q.count + k.count + v.count, NULL);
    free(src);

    const fattn_problem p = tu_problem(c->batch, c->sq, c->sk, c->hq, c->hkv, c->d, 0, c->causal, c->cuq, c->cuk);

    outputs out[4];
    for (int i = 0; i < 4; i++) {
        tu_tensor_alloc(&out[i].o, c->dt, tb, tsq, c->hq, c->d, TU_BSHD, 1);
        tu_tensor_alloc(&out[i].dq, c->dt, tb, tsq, c->hq, c->d, TU_BSHD, 1);
        tu_tensor_alloc(&out[i].dk, c->dt, tb, tsk, c->hkv, c->d, TU_BSHD, 1);
        tu_tensor_alloc(&out[i].dv, c->dt, tb, tsk, c->hkv, c->d, TU_BSHD, 1);
        out[i].nlse = (size_t)tb * c->hq * tsq;
        out[i].lse = (float *)tu_malloc(sizeof(float) * (out[i].nlse + 1));
    }
    printf("%s\n", c->name);
    /* out[0], out[1]: default threads twice; out[2], out[3]: 1 and 3 threads;
     * then 2 threads into out[1] again. */
    const int threads[4] = {0, 0, 1, 3};
    int ok = 1, r0 = 0;
    for (int i = 0; i < 4; i++) {
        fattn_ctx *ctx = NULL;
        TU_EXPECT_OK(fattn_ctx_create(&ctx, FATTN_BACKEND_CPU, 0));
        if (!ctx) return;
        TU_EXPECT_OK(fattn_ctx_set_threads(ctx, threads[i]));
        ok &= run(ctx, &p, &q, &k, &v, &dO, &out[i]);
        if (i == 1) r0 = same(&out[0], &out[1]);
        if (i == 3) {
            TU_EXPECT_OK(fattn_ctx_set_threads(ctx, 2));
            ok &= run(ctx, &p, &q, &k, &v, &dO, &out[1]);
        }
        fattn_ctx_free(ctx);
    }
    if (ok) {
        int r1 = same(&out[0], &out[1]), r2 = same(&out[0], &out[2]), r3 = same(&out[0], &out[3]);
        printf("  [%s] same input twice: %s\n", r0 ? "ok" : "FAIL",
               r0 ? "bitwise identical" : "DIFFERENT");
        printf("  [%s] threads 2 vs default: %s\n", r1 ? "ok" : "FAIL",
               r1 ? "bitwise identical" : "DIFFERENT");
        printf("  [%s] threads 1 vs default: %s\n", r2 ? "ok" : "FAIL",
               r2 ? "bitwise identical" : "DIFFERENT");
        printf("  [%s] threads 3 vs default: %s\n", r3 ? "ok" : "FAIL",
               r3 ? "bitwise identical" : "DIFFERENT");
        TU_CHECK(r0 && r1 && r2 && r3, "%s: outputs differ", c->name);
    }
    for (int i = 0; i < 4; i++) {
        tu_tensor_free(&out[i].o);
        tu_tensor_free(&out[i].dq);
        tu_tensor_free(&out[i].dk);
        tu_tensor_free(&out[i].dv);
        free(out[i].lse);
    }
    tu_tensor_free(&q); tu_tensor_free(&k); tu_tensor_free(&v); tu_tensor_free(&dO);
}

/* The AVX-512 instance and avx2w16 (its code compiled for AVX2) give the
 * same bytes: on a machine with AVX-512 this checks the compiler's AVX-512
 * code against the one every AVX2 machine tests. */
static void instances_agree(tu_rng *rng) {
    fattn_fwd_kernel k;
    if (fattn_cpu_fwd_kernel_named("avx512", &k) != 0 ||
        fattn_cpu_fwd_kernel_named("avx2w16", &k) != 0) {
        printf("avx512 vs avx2w16: skipped (no AVX-512 on this CPU)\n");
        return;
    }
    const struct { int b, sq, sk, hq, hkv, d, causal; fattn_dtype dt; } cs[] = {
        {2, 300, 257, 4, 2, 64, 1, FATTN_DTYPE_F32},
        {1, 129, 400, 3, 3, 128, 0, FATTN_DTYPE_BF16},
        {1, 77, 90, 2, 1, 256, 1, FATTN_DTYPE_F32},
        {1, 40, 33, 2, 2, 5, 1, FATTN_DTYPE_F32},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        tu_tensor q, kk, v, o[2];
        tu_tensor_alloc(&q, cs[i].dt, cs[i].b, cs[i].sq, cs[i].hq, cs[i].d, TU_BSHD, 1);
        tu_tensor_alloc(&kk, cs[i].dt, cs[i].b, cs[i].sk, cs[i].hkv, cs[i].d, TU_BSHD, 1);
        tu_tensor_alloc(&v, cs[i].dt, cs[i].b, cs[i].sk, cs[i].hkv, cs[i].d, TU_BSHD, 1);
        size_t n = q.count + kk.count + v.count;
        double *src = (double *)tu_malloc(sizeof(double) * n);
        tu_fill_normal(rng, src, n);
        tu_tensor_set(&q, src, NULL);
        tu_tensor_set(&kk, src + q.count, NULL);
        tu_tensor_set(&v, src + q.count + kk.count, NULL);
        free(src);
        const size_t nlse = (size_t)cs[i].b * cs[i].hq * cs[i].sq;
        float *lse[2];
        fattn_ctx *ctx = NULL;
        for (int t = 0; t < 2; t++) {
            tu_tensor_alloc(&o[t], cs[i].dt, cs[i].b, cs[i].sq, cs[i].hq, cs[i].d, TU_BSHD, 1);
            tu_tensor_poison(&o[t]);
            lse[t] = (float *)tu_malloc(sizeof(float) * nlse);
            setenv("FATTN_CPU_ISA", t ? "avx2w16" : "avx512", 1); /* read by fattn_ctx_create */
            fattn_ctx_free(ctx);
            ctx = NULL;
            TU_EXPECT_OK(fattn_ctx_create(&ctx, FATTN_BACKEND_CPU, 0));
            fattn_fwd_args fa;
            memset(&fa, 0, sizeof fa);
            fa.p = tu_problem(cs[i].b, cs[i].sq, cs[i].sk, cs[i].hq, cs[i].hkv, cs[i].d, 0,
                              cs[i].causal, NULL, NULL);
            fa.q = q.t; fa.k = kk.t; fa.v = v.t; fa.o = o[t].t;
            fa.lse = lse[t];
            TU_EXPECT_OK(fattn_fwd(ctx, &fa));
        }
        unsetenv("FATTN_CPU_ISA");
        const int same = memcmp(o[0].t.data, o[1].t.data, o[0].bytes) == 0 &&
                         memcmp(lse[0], lse[1], sizeof(float) * nlse) == 0;
        printf("  [%s] avx512 vs avx2w16, case %zu: %s\n", same ? "ok" : "FAIL", i,
               same ? "bitwise identical" : "DIFFERENT");
        TU_CHECK(same, "avx512 and avx2w16 differ (case %zu)", i);
        for (int t = 0; t < 2; t++) {
            tu_tensor_free(&o[t]);
            free(lse[t]);
        }
        fattn_ctx_free(ctx);
        tu_tensor_free(&q); tu_tensor_free(&kk); tu_tensor_free(&v);
    }
}

int main(void) {
    tu_rng rng;
    tu_rng_init(&rng, (uint64_t)tu_seed());
    static const int32_t cuq[] = {0, 5, 5, 40, 200}, cuk[] = {0, 7, 7, 50, 180};
    const dcase cases[] = {
        {"f32 batch 2 q300 k257 causal GQA 2:1 d64", 2, 300, 257, 4, 2, 64, 1, FATTN_DTYPE_F32, 0, 0},
        {"f32 q129 k400 d128", 1, 129, 400, 3, 3, 128, 0, FATTN_DTYPE_F32, 0, 0},
        {"bf16 q200 k200 causal MQA d64", 1, 200, 200, 4, 1, 64, 1, FATTN_DTYPE_BF16, 0, 0},
        {"f16 varlen causal d32", 4, 0, 0, 2, 1, 32, 1, FATTN_DTYPE_F16, cuq, cuk},
        /* one head: the forward's task height is 256, 128 and 64 rows for
         * 1, 2 and 3 threads */
        {"f32 q1000 k1000 causal one head d64", 1, 1000, 1000, 1, 1, 64, 1, FATTN_DTYPE_F32, 0, 0},
        {"f32 q1000 k700 one head d96", 1, 1000, 700, 1, 1, 96, 0, FATTN_DTYPE_F32, 0, 0},
    };
    fattn_ctx *isa_ctx = NULL; /* run_case makes its own contexts under the variable */
    for (int isa = 0; cpu_isa_next(&isa, &isa_ctx);)
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dcase c = cases[i];
        if (c.cuq) { /* max lengths */
            c.sq = c.sk = 0;
            for (int b = 0; b < c.batch; b++) {
                if (c.cuq[b + 1] - c.cuq[b] > c.sq) c.sq = c.cuq[b + 1] - c.cuq[b];
                if (c.cuk[b + 1] - c.cuk[b] > c.sk) c.sk = c.cuk[b + 1] - c.cuk[b];
            }
        }
        run_case(&rng, &c);
    }
    fattn_ctx_free(isa_ctx);
    instances_agree(&rng);
    return tu_finish("test_cpu_determinism");
}
