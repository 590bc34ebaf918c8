/* test_fwd_fp8.c - fattn_fwd_fp8 on a CPU context: O and LSE are the bits
 * of fattn_quantize x 3 (Q and K rotated with the call's seed, V not) into
 * packed BSHD e4m3 buffers followed by fattn_fwd on them, for NULL options
 * (block 128, no rotation), other block sizes (1 per token for K), per-tensor
 * scales, rotation, GQA, causal, f16/bf16/f32 inputs with an output dtype of
 * their own, strided (BHSD) inputs, a variable-length batch, and the
 * workspace growing and shrinking between calls.  Bad arguments are refused
 * with nothing written to O or LSE.  FATTN_TEST_SEED=<n> reproduces. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/testutil.h"
#include "common/half.h"
#include "fattn.h"

typedef struct fcase {
    fattn_dtype in, out;
    int batch, sq, sk, hq, hkv, d, dv, causal;
    int bhsd;   /* inputs in BHSD layout */
    int varlen; /* cu_seqlens (lengths drawn below) */
    int use_opt;
    fattn_fp8_options opt;
} fcase;

static tu_rng g_rng;

/* n elements of dt from N(0, 1) plus rare outliers (the FP8 protocol's). */
static void *random_tensor(fattn_dtype dt, size_t n) {
    void *p = tu_malloc(n * fattn_dtype_size(dt));
    for (size_t i = 0; i < n; i++) {
        double x = tu_rng_normal(&g_rng);
        if (tu_rng_uniform(&g_rng) < 0.001) x += 10.0 * tu_rng_normal(&g_rng);
        const float f = (float)x;
        if (dt == FATTN_DTYPE_F32) ((float *)p)[i] = f;
        else if (dt == FATTN_DTYPE_F16) ((uint16_t *)p)[i] = fattn_f32_to_f16(f);
        else ((uint16_t *)p)[i] = fattn_f32_to_bf16(f);
    }
    return p;
}

/* A tensor over `data` holding [batch, seq, heads, dim] (varlen: [1, total,
 * heads, dim]), BSHD or BHSD. */
static fattn_tensor make_tensor(void *data, fattn_dtype dt, int batch, int seq, int heads, int dim, int bhsd) {
    fattn_tensor t = fattn_tensor_bshd(data, dt);
    if (bhsd) {
        t.stride_seq = dim;
        t.stride_head = (int64_t)seq * dim;
        t.stride_batch = (int64_t)heads * seq * dim;
        (void)batch;
    }
    return t;
}

static void run_case(fattn_ctx *ctx, const fcase *c) {
    const int dv = c->dv ? c->dv : c->d;
    int32_t cuq[9], cuk[9];
    int tq = c->sq, tk = c->sk, nb = c->batch;
    if (c->varlen) { /* lengths 0 .. max, one of them empty */
        cuq[0] = cuk[0] = 0;
        for (int b = 0; b < c->batch; b++) {
            const int lq = b == 1 ? 0 : 1 + (int)(tu_rng_uniform(&g_rng) * c->sq);
            const int lk = b == 1 ? 0 : 1 + (int)(tu_rng_uniform(&g_rng) * c->sk);
            cuq[b + 1] = cuq[b] + (lq > c->sq ? c->sq : lq);
            cuk[b + 1] = cuk[b] + (lk > c->sk ? c->sk : lk);
        }
        tq = cuq[c->batch];
        tk = cuk[c->batch];
        nb = 1;
    }
    const size_t nq = (size_t)nb * tq * c->hq * c->d, nk = (size_t)nb * tk * c->hkv * c->d;
    const size_t nv = (size_t)nb * tk * c->hkv * dv, no = (size_t)nb * tq * c->hq * dv;
    const size_t nlse = (size_t)nb * c->hq * tq;
    void *q = random_tensor(c->in, nq), *k = random_tensor(c->in, nk), *v = random_tensor(c->in, nv);
    const size_t osz = fattn_dtype_size(c->out);
    uint8_t *o1 = tu_malloc(no * osz), *o2 = tu_malloc(no * osz);
    float *l1 = tu_malloc(nlse * 4), *l2 = tu_malloc(nlse * 4);
    memset(o1, 0xFF, no * osz);
    memset(o2, 0xFF, no * osz);
    memset(l1, 0xFF, nlse * 4);
    memset(l2, 0xFF, nlse * 4);

    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = tu_problem(c->batch, c->sq, c->sk, c->hq, c->hkv, c->d, c->dv, c->causal, c->varlen ? cuq : NULL,
                     c->varlen ? cuk : NULL);
    a.q = make_tensor(q, c->in, nb, tq, c->hq, c->d, c->bhsd);
    a.k = make_tensor(k, c->in, nb, tk, c->hkv, c->d, c->bhsd);
    a.v = make_tensor(v, c->in, nb, tk, c->hkv, dv, c->bhsd);
    a.o = fattn_tensor_bshd(o1, c->out);
    a.lse = l1;
    /* scale fields are ignored: garbage must not matter */
    a.q.scale = (float *)(uintptr_t)0x10;
    a.k.scale_block = -3;

    char what[200];
    snprintf(what, sizeof what, "%s->%s b%d sq%d sk%d h%d/%d d%d/%d%s%s%s, %s", fattn_dtype_name(c->in),
             fattn_dtype_name(c->out), c->batch, c->sq, c->sk, c->hq, c->hkv, c->d, dv, c->causal ? " causal" : "",
             c->bhsd ? " BHSD" : "", c->varlen ? " varlen" : "", !c->use_opt ? "opt NULL" : "");
    if (c->use_opt)
        snprintf(what + strlen(what), sizeof what - strlen(what), "%s blocks %d/%d/%d%s",
                 c->opt.granularity == FATTN_QUANT_TENSOR ? "tensor," : "block", c->opt.block_rows_q,
                 c->opt.block_rows_k, c->opt.block_rows_v, c->opt.rotate ? ", rotate" : "");
    fattn_status st = fattn_fwd_fp8(ctx, &a, c->use_opt ? &c->opt : NULL);
    TU_CHECK(st == FATTN_OK, "%s: fattn_fwd_fp8: %s: %s", what, fattn_status_string(st), fattn_last_error(ctx));

    /* by hand */
    fattn_fp8_options o;
    memset(&o, 0, sizeof o);
    if (c->use_opt) o = c->opt;
    const int tensor = o.granularity == FATTN_QUANT_TENSOR;
    const int dkv = 128; /* the default (fattn.h) */
    const int br[3] = {tensor || !o.block_rows_q ? 128 : o.block_rows_q, tensor || !o.block_rows_k ? dkv : o.block_rows_k,
                       tensor || !o.block_rows_v ? dkv : o.block_rows_v};
    const int seqs[3] = {tq, tk, tk}, heads[3] = {c->hq, c->hkv, c->hkv}, dims[3] = {c->d, c->d, dv};
    const size_t cnt[3] = {nq, nk, nv};
    uint8_t *codes[3];
    float *scales[3];
    fattn_tensor e[3];
    const fattn_tensor src[3] = {a.q, a.k, a.v};
    for (int i = 0; i < 3; i++) {
        const size_t nsc = (size_t)nb * heads[i] * ((seqs[i] + br[i] - 1) / br[i]);
        codes[i] = tu_malloc(cnt[i] ? cnt[i] : 1);
        scales[i] = tu_malloc(nsc ? nsc * 4 : 4);
        e[i] = fattn_tensor_bshd(codes[i], FATTN_DTYPE_E4M3);
        e[i].scale = scales[i];
        e[i].scale_block = br[i];
        if (seqs[i] == 0) continue;
        fattn_quantize_args qa;
        memset(&qa, 0, sizeof qa);
        qa.in = src[i];
        qa.in.scale = NULL;
        qa.out = e[i];
        qa.batch = nb;
        qa.seqlen = seqs[i];
        qa.heads = heads[i];
        qa.head_dim = dims[i];
        qa.granularity = o.granularity;
        qa.block_rows = br[i];
        qa.rotate = o.rotate && i < 2;
        qa.seed = o.seed;
        TU_EXPECT_OK(fattn_quantize(ctx, &qa));
    }
    fattn_fwd_args m = a;
    m.q = e[0];
    m.k = e[1];
    m.v = e[2];
    m.o = fattn_tensor_bshd(o2, c->out);
    m.lse = l2;
    TU_EXPECT_OK(fattn_fwd(ctx, &m));
    const int same_o = memcmp(o1, o2, no * osz) == 0, same_l = memcmp(l1, l2, nlse * 4) == 0;
    size_t poisoned = 0;
    for (size_t i = 0; i < no * osz; i++) poisoned += o1[i] == 0xFF;
    TU_CHECK(same_o && same_l, "%s: O %s, LSE %s", what, same_o ? "same" : "DIFFERS", same_l ? "same" : "DIFFERS");
    TU_CHECK(poisoned < no * osz / 8, "%s: %zu of %zu O bytes still poison", what, poisoned, no * osz);
    printf("  [%s] %s: O and LSE the bits of quantize + fwd by hand\n", same_o && same_l ? "ok" : "FAIL", what);
    for (int i = 0; i < 3; i++) {
        free(codes[i]);
        free(scales[i]);
    }
    free(q); free(k); free(v); free(o1); free(o2); free(l1); free(l2);
}

/* Refusals: status, a message naming the problem, O and LSE untouched. */
static void refusals(fattn_ctx *ctx) {
    const int B = 1, S = 64, H = 2, D = 64;
    const size_t n = (size_t)B * S * H * D, nlse = (size_t)B * H * S;
    void *q = random_tensor(FATTN_DTYPE_BF16, n), *k = random_tensor(FATTN_DTYPE_BF16, n),
         *v = random_tensor(FATTN_DTYPE_BF16, n);
    uint16_t *o = tu_malloc(n * 2);
    float *lse = tu_malloc(nlse * 4), scale1 = 1.0f;
    fattn_fwd_args good;
    memset(&good, 0, sizeof good);
    good.p = tu_problem(B, S, S, H, H, D, 0, 0, NULL, NULL);
    good.q = fattn_tensor_bshd(q, FATTN_DTYPE_BF16);
    good.k = fattn_tensor_bshd(k, FATTN_DTYPE_BF16);
    good.v = fattn_tensor_bshd(v, FATTN_DTYPE_BF16);
    good.o = fattn_tensor_bshd(o, FATTN_DTYPE_BF16);
    good.lse = lse;
    struct {
        const char *what, *needle;
        fattn_status want;
    } cases[] = {
        {"args NULL", "args is NULL", FATTN_ERROR_INVALID_ARGUMENT},
        {"e4m3 inputs", "q.dtype e4m3", FATTN_ERROR_INVALID_ARGUMENT},
        {"o e4m3", "o.dtype e4m3", FATTN_ERROR_INVALID_ARGUMENT},
        {"k f16, q bf16", "k.dtype f16 differs from q.dtype bf16", FATTN_ERROR_INVALID_ARGUMENT},
        {"granularity 7", "opt.granularity 7", FATTN_ERROR_INVALID_ARGUMENT},
        {"block_rows_k -1", "opt.block_rows_k -1", FATTN_ERROR_INVALID_ARGUMENT},
        {"rotate at head_dim 48", "power-of-two head_dim", FATTN_ERROR_UNSUPPORTED},
        {"heads_q 3, heads_kv 2", "heads_q 3 is not a multiple of heads_kv 2", FATTN_ERROR_INVALID_ARGUMENT},
        {"o overlapping q", "o overlaps q", FATTN_ERROR_INVALID_ARGUMENT},
        {"lse overlapping o", "lse overlaps o", FATTN_ERROR_INVALID_ARGUMENT},
        {"v.data NULL", "v.data is NULL", FATTN_ERROR_INVALID_ARGUMENT},
        {"head_dim 600", "head_dim 600 is not supported by the CPU engine", FATTN_ERROR_UNSUPPORTED},
    };
    const int ncases = (int)(sizeof cases / sizeof cases[0]);
    uint16_t *big_q = tu_malloc((size_t)S * H * 600 * 2), *big_k = tu_malloc((size_t)S * H * 600 * 2);
    uint16_t *big_o = tu_malloc((size_t)S * H * 600 * 2);
    memset(big_q, 0, (size_t)S * H * 600 * 2);
    memset(big_k, 0, (size_t)S * H * 600 * 2);
    for (int i = 0; i < ncases; i++) {
        fattn_fwd_args a = good;
        fattn_fp8_options opt;
        memset(&opt, 0, sizeof opt);
        const fattn_fwd_args *pa = &a;
        switch (i) {
        case 0: pa = NULL; break;
        case 1: a.q.dtype = a.k.dtype = a.v.dtype = FATTN_DTYPE_E4M3;
                a.q.scale = a.k.scale = a.v.scale = &scale1;
                a.q.scale_block = a.k.scale_block = a.v.scale_block = 64; break;
        case 2: a.o.dtype = FATTN_DTYPE_E4M3; break;
        case 3: a.k.dtype = FATTN_DTYPE_F16; break;
        case 4: opt.granularity = (fattn_quant_granularity)7; break;
        case 5: opt.block_rows_k = -1; break;
        case 6: a.p.head_dim = 48; opt.rotate = 1; break; /* smaller rows in the same buffers */
        case 7: a.p.heads_q = 3; a.p.heads_kv = 2; break;
        case 8: a.o.data = (uint16_t *)q + 8; break;
        case 9: a.lse = (float *)o + 4; break;
        case 10: a.v.data = NULL; break;
        case 11: a.p.head_dim = 600; a.q.data = big_q; a.k.data = a.v.data = big_k; a.o.data = big_o; break;
        }
        memset(o, 0xEE, n * 2);
        memset(lse, 0xEE, nlse * 4);
        memset(big_o, 0xEE, (size_t)S * H * 600 * 2);
        const fattn_status st = fattn_fwd_fp8(ctx, pa, &opt);
        const char *msg = fattn_last_error(ctx);
        int untouched = 1;
        for (size_t j = 0; j < n * 2; j++) untouched &= ((uint8_t *)o)[j] == 0xEE;
        for (size_t j = 0; j < nlse * 4; j++) untouched &= ((uint8_t *)lse)[j] == 0xEE;
        for (size_t j = 0; j < (size_t)S * H * 600 * 2; j++) untouched &= ((uint8_t *)big_o)[j] == 0xEE;
        const int ok = st == cases[i].want && strstr(msg, cases[i].needle) != NULL && untouched;
        if (!ok) tu_failures++;
        printf("  [%s] refused: %s: %s, \"%s\"%s\n", ok ? "ok" : "FAIL", cases[i].what, fattn_status_string(st), msg,
               untouched ? "" : ", OUTPUT WRITTEN");
    }
    TU_CHECK(fattn_fwd_fp8(NULL, &good, NULL) == FATTN_ERROR_INVALID_ARGUMENT, "ctx NULL accepted");
    TU_CHECK(fattn_fwd_fp8(ctx, &good, NULL) == FATTN_OK, "the good call: %s", fattn_last_error(ctx));
    free(q); free(k); free(v); free(o); free(lse); free(big_q); free(big_k); free(big_o);
}

int main(void) {
    tu_rng_init(&g_rng, (uint64_t)tu_seed());
    fattn_ctx *ctx = NULL;
    if (fattn_ctx_create(&ctx, FATTN_BACKEND_CPU, 0) != FATTN_OK) {
        fprintf(stderr, "CPU context: %s\n", fattn_last_error(NULL));
        return 1;
    }
    const fattn_dtype F = FATTN_DTYPE_F32, H = FATTN_DTYPE_F16, B = FATTN_DTYPE_BF16;
    const fattn_quant_granularity BL = FATTN_QUANT_BLOCK, TE = FATTN_QUANT_TENSOR;
    const fcase cases[] = {
        /* in out batch sq sk hq hkv d dv causal bhsd varlen use_opt {granularity, bq, bk, bv, rotate, seed} */
        {B, B, 2, 300, 300, 4, 2, 64, 0, 0, 0, 0, 0, {BL, 0, 0, 0, 0, 0}},
        {B, F, 1, 200, 500, 4, 1, 128, 0, 1, 0, 0, 1, {BL, 64, 1, 256, 1, 42}},
        {H, H, 2, 257, 129, 2, 2, 64, 0, 1, 1, 0, 1, {TE, 0, 0, 0, 1, 7}},
        {F, B, 1, 100, 300, 6, 3, 32, 48, 0, 0, 0, 1, {BL, 17, 100, 128, 1, 9}},
        {B, H, 3, 150, 170, 4, 2, 64, 0, 1, 0, 1, 1, {BL, 32, 1, 64, 1, 3}},
        {H, F, 3, 90, 90, 2, 1, 16, 0, 0, 0, 1, 1, {TE, 0, 0, 0, 0, 0}},
        /* smaller again: the workspace is reused, not shrunk */
        {B, B, 1, 10, 10, 2, 2, 64, 0, 0, 0, 0, 0, {BL, 0, 0, 0, 0, 0}},
    };
    printf("fattn_fwd_fp8 vs fattn_quantize + fattn_fwd (CPU engine)\n");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(ctx, &cases[i]);
    printf("refusals\n");
    refusals(ctx);
    fattn_ctx_free(ctx);
    return tu_finish("fwd_fp8");
}
