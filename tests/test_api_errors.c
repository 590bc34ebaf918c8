/* test_api_errors.c - every bad input gets its status, a message naming the
 * offending argument, and leaves the outputs (and inputs) untouched:
 * sizes, dtypes, strides, varlen offsets, misaligned pointers, outputs that
 * overlap themselves, an input or another output. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fattn.h"
#include "internal.h" /* struct fattn_ctx, for a CUDA context faked without a GPU */

static int failures = 0;
static int checks = 0;

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        checks++;                                                                                  \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__);                                 \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

/* Problem: batch 2, seqlen 16, heads 4 (kv 2), head dim 32, f32. */
enum { B = 2, S = 16, HQ = 4, HK = 2, D = 32 };
#define NQ ((size_t)B * S * HQ * D)
#define NK ((size_t)B * S * HK * D)
#define NLSE ((size_t)B * HQ * S)
#define SENTINEL 0xA5

static float q[NQ], k[NK], v[NK], o[NQ], dout[NQ], dq[NQ], dk[NK], dv[NK], lse[NLSE];
static float o_ref[NQ], lse_ref[NLSE], dq_ref[NQ], dk_ref[NK], dv_ref[NK];
static uint8_t q8[NQ];
static float qscale[B * HQ * S];
/* The inputs as main() set them: a rejected call writes no input either
 * (the overlap tests alias outputs with them). */
static float q_in[NQ], k_in[NK], v_in[NK], dout_in[NQ];
/* Memory the overlap tests carve tensors from, so that a call accepted by
 * mistake still writes only memory the test owns; all sentinel bytes. */
#define NARENA (4 * NQ)
static float arena[NARENA];
/* cu_seqlens of the overlap tests ({0, 10, 16}, then 0xA5 bytes): room for an
 * lse laid over it */
static int32_t cubuf[NLSE];

static void poison_outputs(void) {
    memset(o, SENTINEL, sizeof o);
    memset(lse, SENTINEL, sizeof lse);
    memset(dq, SENTINEL, sizeof dq);
    memset(dk, SENTINEL, sizeof dk);
    memset(dv, SENTINEL, sizeof dv);
    memset(q8, SENTINEL, sizeof q8);
    memset(qscale, SENTINEL, sizeof qscale);
    memset(arena, SENTINEL, sizeof arena);
    memset(cubuf, SENTINEL, sizeof cubuf);
    cubuf[0] = 0, cubuf[1] = 10, cubuf[2] = 16;
    memcpy(o_ref, o, sizeof o);
    memcpy(lse_ref, lse, sizeof lse);
    memcpy(dq_ref, dq, sizeof dq);
    memcpy(dk_ref, dk, sizeof dk);
    memcpy(dv_ref, dv, sizeof dv);
}

static int outputs_untouched(void) {
    static uint8_t q8_ref[NQ];
    static float qscale_ref[B * HQ * S];
    static float arena_ref[NARENA];
    static int32_t cubuf_ref[NLSE];
    memset(q8_ref, SENTINEL, sizeof q8_ref);
    memset(qscale_ref, SENTINEL, sizeof qscale_ref);
    memset(arena_ref, SENTINEL, sizeof arena_ref);
    memset(cubuf_ref, SENTINEL, sizeof cubuf_ref);
    cubuf_ref[0] = 0, cubuf_ref[1] = 10, cubuf_ref[2] = 16;
    return !memcmp(o, o_ref, sizeof o) && !memcmp(lse, lse_ref, sizeof lse) &&
           !memcmp(dq, dq_ref, sizeof dq) && !memcmp(dk, dk_ref, sizeof dk) &&
           !memcmp(dv, dv_ref, sizeof dv) && !memcmp(q8, q8_ref, sizeof q8) &&
           !memcmp(qscale, qscale_ref, sizeof qscale) && !memcmp(arena, arena_ref, sizeof arena) &&
           !memcmp(cubuf, cubuf_ref, sizeof cubuf) && !memcmp(q, q_in, sizeof q) &&
           !memcmp(k, k_in, sizeof k) && !memcmp(v, v_in, sizeof v) &&
           !memcmp(dout, dout_in, sizeof dout);
}

static fattn_fwd_args good_fwd(void) {
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p.batch = B;
    a.p.seqlen_q = a.p.seqlen_k = S;
    a.p.heads_q = HQ;
    a.p.heads_kv = HK;
    a.p.head_dim = D;
    a.q = fattn_tensor_bshd(q, FATTN_DTYPE_F32);
    a.k = fattn_tensor_bshd(k, FATTN_DTYPE_F32);
    a.v = fattn_tensor_bshd(v, FATTN_DTYPE_F32);
    a.o = fattn_tensor_bshd(o, FATTN_DTYPE_F32);
    a.lse = lse;
    return a;
}

static fattn_bwd_args good_bwd(void) {
    fattn_bwd_args a;
    memset(&a, 0, sizeof a);
    fattn_fwd_args f = good_fwd();
    a.p = f.p;
    a.q = f.q, a.k = f.k, a.v = f.v;
    a.o = fattn_tensor_bshd(o, FATTN_DTYPE_F32);
    a.dout = fattn_tensor_bshd(dout, FATTN_DTYPE_F32);
    a.dq = fattn_tensor_bshd(dq, FATTN_DTYPE_F32);
    a.dk = fattn_tensor_bshd(dk, FATTN_DTYPE_F32);
    a.dv = fattn_tensor_bshd(dv, FATTN_DTYPE_F32);
    a.lse = lse;
    return a;
}

static fattn_quantize_args good_quant(void) {
    fattn_quantize_args a;
    memset(&a, 0, sizeof a);
    a.in = fattn_tensor_bshd(q, FATTN_DTYPE_F32);
    a.out = fattn_tensor_bshd(q8, FATTN_DTYPE_E4M3);
    a.out.scale = qscale;
    a.batch = B, a.seqlen = S, a.heads = HQ, a.head_dim = D;
    a.granularity = FATTN_QUANT_BLOCK;
    a.block_rows = 1;
    return a;
}

/* The call must fail with `want`, name `word` in its message, and leave every
 * output as it was. */
static void expect_fail(const char *what, fattn_ctx *ctx, fattn_status got, fattn_status want,
                        const char *word, int line) {
    const char *msg = fattn_last_error(ctx);
    checks++;
    if (got != want || !msg || !msg[0] || !strstr(msg, word) || !outputs_untouched()) {
        failures++;
        fprintf(stderr,
                "test_api_errors.c:%d: FAIL: %s: status %d (%s), want %d; message '%s' should "
                "name '%s'; outputs %s\n",
                line, what, (int)got, fattn_status_string(got), (int)want, msg ? msg : "(null)",
                word, outputs_untouched() ? "untouched" : "WRITTEN");
    }
}

#define FWD_FAIL(ctx, mutate, want, word)                                                          \
    do {                                                                                           \
        fattn_fwd_args a_ = good_fwd();                                                            \
        mutate;                                                                                    \
        poison_outputs();                                                                          \
        fattn_status st_ = fattn_fwd(ctx, &a_);                                                    \
        expect_fail("fwd: " #mutate, ctx, st_, want, word, __LINE__);                              \
    } while (0)

#define BWD_FAIL(ctx, mutate, want, word)                                                          \
    do {                                                                                           \
        fattn_bwd_args a_ = good_bwd();                                                            \
        mutate;                                                                                    \
        poison_outputs();                                                                          \
        fattn_status st_ = fattn_bwd(ctx, &a_);                                                    \
        expect_fail("bwd: " #mutate, ctx, st_, want, word, __LINE__);                              \
    } while (0)

#define QUANT_FAIL(ctx, mutate, want, word)                                                        \
    do {                                                                                           \
        fattn_quantize_args a_ = good_quant();                                                     \
        mutate;                                                                                    \
        poison_outputs();                                                                          \
        fattn_status st_ = fattn_quantize(ctx, &a_);                                               \
        expect_fail("quantize: " #mutate, ctx, st_, want, word, __LINE__);                         \
    } while (0)

#define INV FATTN_ERROR_INVALID_ARGUMENT
#define UNS FATTN_ERROR_UNSUPPORTED

static void test_status_and_version(void) {
    const fattn_status all[] = {FATTN_OK,
                                FATTN_ERROR_INVALID_ARGUMENT,
                                FATTN_ERROR_UNSUPPORTED,
                                FATTN_ERROR_NO_DEVICE,
                                FATTN_ERROR_OUT_OF_MEMORY,
                                FATTN_ERROR_CUDA,
                                FATTN_ERROR_INTERNAL,
                                FATTN_ERROR_BUSY};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        const char *s = fattn_status_string(all[i]);
        EXPECT(s && s[0], "status %d has no text", (int)all[i]);
        for (size_t j = 0; j < i; j++)
            EXPECT(strcmp(s, fattn_status_string(all[j])) != 0, "statuses %zu and %zu share text", i, j);
    }
    const char *u = fattn_status_string((fattn_status)99);
    EXPECT(u && u[0], "unknown status has no text");
    u = fattn_status_string((fattn_status)-1);
    EXPECT(u && u[0], "negative status has no text");

    EXPECT(fattn_version_number() == FATTN_VERSION_NUMBER, "version number mismatch");
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", FATTN_VERSION_MAJOR, FATTN_VERSION_MINOR,
             FATTN_VERSION_PATCH);
    EXPECT(!strcmp(fattn_version_string(), want), "version string %s", fattn_version_string());

    EXPECT(fattn_dtype_size(FATTN_DTYPE_F32) == 4 && fattn_dtype_size(FATTN_DTYPE_F16) == 2 &&
               fattn_dtype_size(FATTN_DTYPE_BF16) == 2 && fattn_dtype_size(FATTN_DTYPE_E4M3) == 1 &&
               fattn_dtype_size((fattn_dtype)7) == 0,
           "dtype sizes");
    EXPECT(!strcmp(fattn_dtype_name(FATTN_DTYPE_BF16), "bf16") &&
               !strcmp(fattn_dtype_name(FATTN_DTYPE_E4M3), "e4m3") &&
               !strcmp(fattn_dtype_name((fattn_dtype)7), "?"),
           "dtype names");
    fattn_tensor t = fattn_tensor_bshd(q, FATTN_DTYPE_F16);
    EXPECT(t.data == q && t.dtype == FATTN_DTYPE_F16 && t.stride_batch == 0 && t.stride_seq == 0 &&
               t.stride_head == 0 && t.scale == NULL && t.scale_block == 0,
           "fattn_tensor_bshd");
}

static void test_contexts(void) {
    fattn_ctx *ctx = (fattn_ctx *)&ctx; /* must be reset to NULL on failure */
    fattn_status st = fattn_ctx_create(&ctx, (fattn_backend)7, 0);
    EXPECT(st == INV && ctx == NULL && strstr(fattn_last_error(NULL), "backend"),
           "bad backend: %d '%s'", (int)st, fattn_last_error(NULL));
    st = fattn_ctx_create(&ctx, FATTN_BACKEND_CPU, -1);
    EXPECT(st == INV && ctx == NULL && strstr(fattn_last_error(NULL), "device"),
           "negative device: %d '%s'", (int)st, fattn_last_error(NULL));
    st = fattn_ctx_create(NULL, FATTN_BACKEND_CPU, 0);
    EXPECT(st == INV && strstr(fattn_last_error(NULL), "ctx"), "NULL ctx pointer: %d", (int)st);

    st = fattn_ctx_create(&ctx, FATTN_BACKEND_CPU, 0);
    EXPECT(st == FATTN_OK && ctx && fattn_ctx_backend(ctx) == FATTN_BACKEND_CPU, "cpu ctx");
    EXPECT(!strcmp(fattn_ctx_engine(ctx), "cpu") && !strcmp(fattn_ctx_engine(NULL), ""), "fattn_ctx_engine: %s",
           fattn_ctx_engine(ctx));
    EXPECT(fattn_last_error(NULL)[0] == '\0', "creation error not cleared after success");
    int dummy;
    st = fattn_ctx_set_stream(ctx, &dummy);
    EXPECT(st == INV && strstr(fattn_last_error(ctx), "stream"), "CPU ctx accepted a stream");
    EXPECT(fattn_ctx_set_stream(ctx, NULL) == FATTN_OK && fattn_last_error(ctx)[0] == '\0',
           "NULL stream on CPU, or error not cleared");
    st = fattn_ctx_set_threads(ctx, -3);
    EXPECT(st == INV && strstr(fattn_last_error(ctx), "threads"), "negative threads");
    EXPECT(fattn_ctx_set_threads(ctx, 2) == FATTN_OK, "set_threads 2");
    EXPECT(fattn_ctx_set_stream(NULL, NULL) == INV, "set_stream(NULL ctx)");
    /* experimental options: known ones take 0 or 1, nothing else */
    EXPECT(fattn_ctx_set_option(ctx, FATTN_OPTION_DISABLE_PDL, 1) == FATTN_OK &&
               fattn_ctx_set_option(ctx, FATTN_OPTION_DISABLE_PDL, 0) == FATTN_OK,
           "set_option DISABLE_PDL 1 / 0");
    EXPECT(fattn_ctx_set_option(ctx, FATTN_OPTION_SOFTMAX_UNDER_PV, 1) == FATTN_OK &&
               fattn_ctx_set_option(ctx, FATTN_OPTION_SOFTMAX_UNDER_PV, 0) == FATTN_OK,
           "set_option SOFTMAX_UNDER_PV 1 / 0");
    EXPECT(fattn_ctx_set_option(ctx, FATTN_OPTION_DISABLE_SPLIT, 1) == FATTN_OK &&
               fattn_ctx_set_option(ctx, FATTN_OPTION_DISABLE_SPLIT, 0) == FATTN_OK,
           "set_option DISABLE_SPLIT 1 / 0");
    EXPECT(fattn_ctx_set_option(ctx, FATTN_OPTION_DISABLE_OVERLAP, 2) == INV && fattn_last_error(ctx)[0] != '\0',
           "set_option value 2");
    EXPECT(fattn_ctx_set_option(ctx, FATTN_OPTION_COUNT_, 0) == INV, "set_option unknown option");
    EXPECT(fattn_ctx_set_option(ctx, (fattn_option)-1, 0) == INV, "set_option negative option");
    EXPECT(fattn_ctx_set_option(NULL, FATTN_OPTION_DISABLE_PDL, 0) == INV, "set_option(NULL ctx)");
    EXPECT(fattn_ctx_set_threads(NULL, 1) == INV, "set_threads(NULL ctx)");
    fattn_ctx_free(ctx);
    fattn_ctx_free(NULL);

    /* AUTO always gives a usable context. */
    st = fattn_ctx_create(&ctx, FATTN_BACKEND_AUTO, 0);
    EXPECT(st == FATTN_OK && ctx && fattn_ctx_backend(ctx) != FATTN_BACKEND_AUTO, "auto ctx");
    int have_gpu = st == FATTN_OK && fattn_ctx_backend(ctx) == FATTN_BACKEND_CUDA;
    fattn_ctx_free(ctx);

    if (!have_gpu) {
        ctx = (fattn_ctx *)&ctx;
        st = fattn_ctx_create(&ctx, FATTN_BACKEND_CUDA, 0);
        EXPECT(st == FATTN_ERROR_NO_DEVICE && ctx == NULL && fattn_last_error(NULL)[0],
               "CUDA ctx without a GPU: status %d, message '%s'", (int)st, fattn_last_error(NULL));
    } else {
        printf("test_api_errors: a GPU is present, the NO_DEVICE check is skipped\n");
    }
}

static void test_fwd(fattn_ctx *ctx) {
    /* NULL ctx / args */
    poison_outputs();
    fattn_fwd_args a = good_fwd();
    expect_fail("fwd NULL ctx", NULL, fattn_fwd(NULL, &a), INV, "ctx", __LINE__);
    expect_fail("fwd NULL args", ctx, fattn_fwd(ctx, NULL), INV, "args", __LINE__);

    /* NULL data */
    FWD_FAIL(ctx, a_.q.data = NULL, INV, "q.data");
    FWD_FAIL(ctx, a_.k.data = NULL, INV, "k.data");
    FWD_FAIL(ctx, a_.v.data = NULL, INV, "v.data");
    FWD_FAIL(ctx, a_.o.data = NULL, INV, "o.data");

    /* dtypes */
    FWD_FAIL(ctx, a_.q.dtype = (fattn_dtype)9, INV, "q.dtype");
    FWD_FAIL(ctx, a_.o.dtype = (fattn_dtype)-2, INV, "o.dtype");
    FWD_FAIL(ctx, a_.k.dtype = FATTN_DTYPE_F16, INV, "k.dtype");
    FWD_FAIL(ctx, a_.v.dtype = FATTN_DTYPE_BF16, INV, "v.dtype");
    FWD_FAIL(ctx, a_.o.dtype = FATTN_DTYPE_F16, INV, "o.dtype");
    FWD_FAIL(ctx, (a_.q.dtype = a_.k.dtype = a_.v.dtype = FATTN_DTYPE_E4M3), INV, "q.scale");
    FWD_FAIL(ctx,
             (a_.q.dtype = a_.k.dtype = a_.v.dtype = FATTN_DTYPE_E4M3, a_.q.scale = a_.k.scale =
                  a_.v.scale = qscale, a_.q.scale_block = a_.k.scale_block = 1,
              a_.v.scale_block = 0),
             INV, "v.scale_block");
    FWD_FAIL(ctx,
             (a_.q.dtype = a_.k.dtype = a_.v.dtype = a_.o.dtype = FATTN_DTYPE_E4M3,
              a_.q.scale = a_.k.scale = a_.v.scale = qscale,
              a_.q.scale_block = a_.k.scale_block = a_.v.scale_block = 1),
             INV, "o.dtype");

    /* sizes */
    FWD_FAIL(ctx, a_.p.batch = 0, INV, "batch");
    FWD_FAIL(ctx, a_.p.batch = -1, INV, "batch");
    FWD_FAIL(ctx, a_.p.seqlen_q = 0, INV, "seqlen_q");
    FWD_FAIL(ctx, a_.p.seqlen_k = -5, INV, "seqlen_k");
    FWD_FAIL(ctx, a_.p.heads_q = 0, INV, "heads_q");
    FWD_FAIL(ctx, a_.p.heads_kv = -1, INV, "heads_kv");
    FWD_FAIL(ctx, a_.p.head_dim = 0, INV, "head_dim");
    FWD_FAIL(ctx, a_.p.head_dim = -32, INV, "head_dim");
    FWD_FAIL(ctx, a_.p.head_dim_v = -1, INV, "head_dim_v");
    FWD_FAIL(ctx, (a_.p.heads_q = 12, a_.p.heads_kv = 5), INV, "heads_kv 5");
    FWD_FAIL(ctx, a_.p.heads_kv = 3, INV, "heads_q 4 is not a multiple of heads_kv 3");
    FWD_FAIL(ctx, a_.p.softmax_scale = -1.0f, INV, "softmax_scale");
    FWD_FAIL(ctx, a_.p.softmax_scale = NAN, INV, "softmax_scale");
    FWD_FAIL(ctx, a_.p.softmax_scale = INFINITY, INV, "softmax_scale");

    /* CPU engine limit */
    FWD_FAIL(ctx, a_.p.head_dim = 1000, UNS, "head_dim 1000");
    FWD_FAIL(ctx, a_.p.head_dim_v = 600, UNS, "head_dim_v 600");

    /* overflow: the pointers are fake; validation must reject before reading */
    static char fake[64];
    FWD_FAIL(ctx,
             (a_.p.batch = 1 << 30, a_.p.seqlen_q = a_.p.seqlen_k = 1 << 30, a_.p.heads_q = 1,
              a_.p.heads_kv = 1, a_.q.data = a_.k.data = a_.v.data = a_.o.data = fake,
              a_.lse = (float *)fake),
             INV, "q");
    /* rows fit in int32 but element offsets overflow int64 through strides */
    FWD_FAIL(ctx,
             (a_.p.batch = 1, a_.p.seqlen_q = a_.p.seqlen_k = 1 << 20, a_.p.heads_q = 1,
              a_.p.heads_kv = 1, a_.q.stride_seq = INT64_C(1) << 50, a_.q.stride_head = D,
              a_.q.data = a_.k.data = a_.v.data = a_.o.data = fake, a_.lse = (float *)fake),
             INV, "64-bit");
    /* batch * heads * seqlen above 2^31 rows (the CUDA kernels' int32 rows) */
    FWD_FAIL(ctx,
             (a_.p.batch = 1 << 16, a_.p.seqlen_q = a_.p.seqlen_k = 1 << 16, a_.p.heads_q = 1,
              a_.p.heads_kv = 1, a_.p.head_dim = 1,
              a_.q.data = a_.k.data = a_.v.data = a_.o.data = fake, a_.lse = (float *)fake),
             INV, "rows");

    /* strides */
    FWD_FAIL(ctx, (a_.q.stride_seq = -HQ * D, a_.q.stride_head = D, a_.q.stride_batch = S * HQ * D),
             INV, "q.stride_seq");
    FWD_FAIL(ctx, (a_.k.stride_batch = -1, a_.k.stride_seq = HK * D, a_.k.stride_head = D), INV,
             "k.stride_batch");
    FWD_FAIL(ctx, (a_.v.stride_head = -D), INV, "v.stride_head");
    FWD_FAIL(ctx, (a_.o.stride_batch = S * HQ * D, a_.o.stride_seq = HQ * D, a_.o.stride_head = 8),
             INV, "o.stride_head");
    FWD_FAIL(ctx, (a_.q.stride_batch = S * HQ * D, a_.q.stride_seq = 4, a_.q.stride_head = D * S),
             INV, "q.stride_seq");
    FWD_FAIL(ctx, (a_.o.stride_batch = 0, a_.o.stride_seq = HQ * D, a_.o.stride_head = D), INV,
             "o.stride_batch");

    /* varlen */
    int32_t cu_ok[B + 1] = {0, 10, 16};
    int32_t cu_start[B + 1] = {1, 10, 16};
    int32_t cu_dec[B + 1] = {0, 12, 8};
    int32_t cu_long[B + 1] = {0, 2, 16}; /* sequence 1 has 14 > max 10 */
    /* cu_seqlens_q alone is valid since 0.4 (varlen queries against
     * fixed-length keys: test_cpu_serving); its keys are not packed */
    FWD_FAIL(ctx, (a_.p.cu_seqlens_q = cu_ok, a_.p.total_k = 16), INV, "total_k 16");
    FWD_FAIL(ctx, a_.p.cu_seqlens_k = cu_ok, INV, "cu_seqlens_q");
    FWD_FAIL(ctx, (a_.p.cu_seqlens_q = cu_start, a_.p.cu_seqlens_k = cu_ok), INV, "cu_seqlens_q[0]");
    FWD_FAIL(ctx, (a_.p.cu_seqlens_q = cu_ok, a_.p.cu_seqlens_k = cu_dec), INV, "cu_seqlens_k");
    FWD_FAIL(ctx, (a_.p.cu_seqlens_q = cu_long, a_.p.cu_seqlens_k = cu_ok, a_.p.seqlen_q = 10), INV,
             "seqlen_q");
    FWD_FAIL(ctx, (a_.p.cu_seqlens_q = cu_ok, a_.p.cu_seqlens_k = cu_ok, a_.p.seqlen_q = -1), INV,
             "seqlen_q");
    /* the packed rows: nonzero only with cu_seqlens, and then cu_seqlens[batch] */
    FWD_FAIL(ctx, a_.p.total_q = 16, INV, "total_q 16");
    FWD_FAIL(ctx, a_.p.total_k = 16, INV, "without its cu_seqlens");
    FWD_FAIL(ctx, (a_.p.cu_seqlens_q = cu_ok, a_.p.cu_seqlens_k = cu_ok, a_.p.total_q = -16), INV,
             "total_q -16");
    FWD_FAIL(ctx, (a_.p.cu_seqlens_q = cu_ok, a_.p.cu_seqlens_k = cu_ok, a_.p.total_q = 15), INV,
             "differ from cu_seqlens");
    FWD_FAIL(ctx, (a_.p.cu_seqlens_q = cu_ok, a_.p.cu_seqlens_k = cu_ok, a_.p.total_k = 17), INV,
             "differ from cu_seqlens");

    /* A good call succeeds and clears the previous error. */
    a = good_fwd();
    fattn_status st = fattn_fwd(ctx, &a);
    EXPECT(st == FATTN_OK, "good fwd failed: %s", fattn_last_error(ctx));
    EXPECT(fattn_last_error(ctx)[0] == '\0', "last_error not cleared after success: '%s'",
           fattn_last_error(ctx));
    EXPECT(isfinite(o[0]) && isfinite(lse[0]), "good fwd wrote no finite output");
    /* Varlen with valid offsets and zero-length sequences allowed. */
    a = good_fwd();
    int32_t cu_q[B + 1] = {0, 0, 16}, cu_k[B + 1] = {0, 16, 32};
    a.p.cu_seqlens_q = cu_q;
    a.p.cu_seqlens_k = cu_k;
    st = fattn_fwd(ctx, &a);
    EXPECT(st == FATTN_OK, "good varlen fwd failed: %s", fattn_last_error(ctx));
    a.p.total_q = 16, a.p.total_k = 32; /* the right totals are accepted */
    st = fattn_fwd(ctx, &a);
    EXPECT(st == FATTN_OK, "varlen fwd with its totals failed: %s", fattn_last_error(ctx));
}

static void test_bwd(fattn_ctx *ctx) {
    poison_outputs();
    expect_fail("bwd NULL ctx", NULL, fattn_bwd(NULL, NULL), INV, "ctx", __LINE__);
    expect_fail("bwd NULL args", ctx, fattn_bwd(ctx, NULL), INV, "args", __LINE__);
    BWD_FAIL(ctx, a_.lse = NULL, INV, "lse");
    BWD_FAIL(ctx, a_.dout.data = NULL, INV, "dout.data");
    BWD_FAIL(ctx, a_.dq.data = NULL, INV, "dq.data");
    BWD_FAIL(ctx, a_.dv.data = NULL, INV, "dv.data");
    BWD_FAIL(ctx, a_.dk.dtype = FATTN_DTYPE_BF16, INV, "dk.dtype");
    BWD_FAIL(ctx,
             (a_.q.dtype = a_.k.dtype = a_.v.dtype = a_.o.dtype = a_.dout.dtype = a_.dq.dtype =
                  a_.dk.dtype = a_.dv.dtype = FATTN_DTYPE_E4M3),
             INV, "e4m3");
    BWD_FAIL(ctx, a_.p.heads_kv = 3, INV, "heads_kv");
    BWD_FAIL(ctx, a_.p.seqlen_k = 0, INV, "seqlen_k");
    BWD_FAIL(ctx, (a_.dq.stride_head = -1), INV, "dq.stride_head");
    BWD_FAIL(ctx, a_.p.head_dim = 1000, UNS, "head_dim");
    int32_t cu_ok[B + 1] = {0, 10, 16}, cu_dec[B + 1] = {0, 12, 8};
    BWD_FAIL(ctx, (a_.p.cu_seqlens_q = cu_ok, a_.p.cu_seqlens_k = cu_dec), INV, "cu_seqlens_k");
}

/* A pointer misaligned for its elements is refused on every engine before
 * anything is read through it (under UBSan a read would be reported). */
#define OFF(p, bytes) ((void *)((char *)(p) + (bytes)))
static void test_alignment(fattn_ctx *ctx) {
    FWD_FAIL(ctx, a_.q.data = OFF(q, 1), INV, "q.data is not 4-byte aligned");
    FWD_FAIL(ctx, a_.k.data = OFF(k, 2), INV, "k.data is not 4-byte aligned");
    FWD_FAIL(ctx, a_.o.data = OFF(o, 2), INV, "o.data is not 4-byte aligned");
    FWD_FAIL(ctx, a_.lse = (float *)OFF(lse, 1), INV, "lse is not 4-byte aligned");
    FWD_FAIL(ctx,
             (a_.q.dtype = a_.k.dtype = a_.v.dtype = a_.o.dtype = FATTN_DTYPE_BF16,
              a_.v.data = OFF(v, 1)),
             INV, "v.data is not 2-byte aligned");
    FWD_FAIL(ctx,
             (a_.q.dtype = a_.k.dtype = a_.v.dtype = FATTN_DTYPE_E4M3,
              a_.q.data = a_.k.data = a_.v.data = OFF(q8, 1), a_.q.scale = a_.v.scale = qscale,
              a_.k.scale = (float *)OFF(qscale, 1),
              a_.q.scale_block = a_.k.scale_block = a_.v.scale_block = 1),
             INV, "k.scale is not 4-byte aligned");
    int32_t cu_k[B + 1] = {0, 10, 16};
    FWD_FAIL(ctx, (a_.p.cu_seqlens_q = (const int32_t *)OFF(cubuf, 2), a_.p.cu_seqlens_k = cu_k),
             INV, "cu_seqlens_q is not 4-byte aligned");
    BWD_FAIL(ctx, a_.dout.data = OFF(dout, 1), INV, "dout.data is not 4-byte aligned");
    BWD_FAIL(ctx, a_.dq.data = OFF(dq, 2), INV, "dq.data is not 4-byte aligned");
    BWD_FAIL(ctx, a_.lse = (const float *)OFF(lse, 3), INV, "lse is not 4-byte aligned");
    BWD_FAIL(ctx, (a_.p.cu_seqlens_q = cu_k, a_.p.cu_seqlens_k = (const int32_t *)OFF(cubuf, 1)),
             INV, "cu_seqlens_k is not 4-byte aligned");
    QUANT_FAIL(ctx, a_.in.data = OFF(q, 1), INV, "in.data is not 4-byte aligned");
    QUANT_FAIL(ctx, (a_.in.dtype = FATTN_DTYPE_F16, a_.in.data = OFF(q, 3)), INV,
               "in.data is not 2-byte aligned");
    QUANT_FAIL(ctx, a_.out.scale = (float *)OFF(qscale, 2), INV, "out.scale is not 4-byte aligned");

    /* e4m3 codes are bytes: any address will do */
    fattn_quantize_args qa = good_quant();
    qa.out.data = OFF(arena, 1);
    fattn_status st = fattn_quantize(ctx, &qa);
    EXPECT(st == FATTN_OK, "quantize into out.data 1 byte off: %s", fattn_last_error(ctx));
}

/* max |x - y| (inf on NaN) */
static double max_diff(const float *x, const float *y, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)x[i] - (double)y[i]);
        if (!(d <= m)) m = isnan(d) ? INFINITY : d;
    }
    return m;
}

/* Outputs that overlap themselves, an input or another output are refused
 * (fattn.h, Conventions); the tensors are carved from `arena` (all inside
 * it) so that a call accepted by mistake writes only memory the test owns. */
static void test_overlap(fattn_ctx *ctx) {
    float *A = arena;
    /* an output's own elements: rows of heads on top of each other */
    FWD_FAIL(ctx, (a_.o.stride_batch = S * HQ * D, a_.o.stride_seq = D, a_.o.stride_head = D), INV,
             "o.stride_head");
    /* batches on top of tokens */
    FWD_FAIL(ctx, (a_.o.stride_batch = HQ * D, a_.o.stride_seq = HQ * D, a_.o.stride_head = D),
             INV, "o.stride_seq");
    BWD_FAIL(ctx, (a_.dq.stride_batch = S * HQ * D, a_.dq.stride_seq = D, a_.dq.stride_head = D),
             INV, "dq.stride_head");
    BWD_FAIL(ctx, (a_.dv.stride_batch = HK * D, a_.dv.stride_seq = HK * D, a_.dv.stride_head = D),
             INV, "dv.stride_seq");
    QUANT_FAIL(ctx, (a_.out.stride_batch = S * HQ * D, a_.out.stride_seq = D, a_.out.stride_head = D),
               INV, "out.stride_head");

    /* an output on an input */
    FWD_FAIL(ctx, a_.o.data = q, INV, "o overlaps q");
    FWD_FAIL(ctx, (a_.k.data = A, a_.o.data = A + NK - D), INV, "o overlaps k");
    FWD_FAIL(ctx, (a_.v.data = A + 2 * NQ, a_.o.data = A + NQ + 1), INV, "o overlaps v"); /* by 1 float */
    FWD_FAIL(ctx, a_.lse = k, INV, "lse overlaps k");
    FWD_FAIL(ctx,
             (a_.q.dtype = a_.k.dtype = a_.v.dtype = FATTN_DTYPE_E4M3,
              a_.q.data = a_.k.data = a_.v.data = q8, a_.q.scale = a_.k.scale = qscale,
              a_.v.scale = A, a_.q.scale_block = a_.k.scale_block = a_.v.scale_block = 1,
              a_.o.data = A + 32),
             INV, "o overlaps v.scale");
    /* varlen: the cu_seqlens are inputs too (lse [heads_q, total_q] = 64
     * floats fits in cubuf) */
    int32_t cu_k[B + 1] = {0, 10, 16};
    FWD_FAIL(ctx, (a_.p.cu_seqlens_q = cubuf, a_.p.cu_seqlens_k = cu_k, a_.lse = (float *)cubuf),
             INV, "lse overlaps cu_seqlens_q");
    BWD_FAIL(ctx, a_.dq.data = dout, INV, "dq overlaps dout");
    BWD_FAIL(ctx, a_.dv.data = o, INV, "dv overlaps o");
    BWD_FAIL(ctx, (a_.lse = A + 10, a_.dq.data = A), INV, "dq overlaps lse");
    BWD_FAIL(ctx, (a_.k.data = A + NQ - D, a_.dq.data = A), INV, "dq overlaps k");
    QUANT_FAIL(ctx, a_.out.data = q, INV, "out overlaps in");
    QUANT_FAIL(ctx, a_.out.scale = q + 8, INV, "out.scale overlaps in");

    /* an output on another output */
    FWD_FAIL(ctx, (a_.o.data = A, a_.lse = A + NQ - 4), INV, "lse overlaps o");
    BWD_FAIL(ctx, a_.dv.data = dk, INV, "dv overlaps dk");
    BWD_FAIL(ctx, (a_.dq.data = A, a_.dk.data = A + NQ - 1), INV, "dk overlaps dq");
    QUANT_FAIL(ctx, (a_.out.data = A, a_.out.scale = A + 16), INV, "out.scale overlaps out");

    /* What stays allowed: inputs that overlap each other (k and v the same
     * memory; q, k and v heads of one packed [batch, seq, HQ + 2 HK, D]
     * buffer), padded and transposed outputs.  Each call's O equals the one
     * of separate packed tensors. */
    fattn_fwd_args a = good_fwd();
    fattn_status st = fattn_fwd(ctx, &a);
    EXPECT(st == FATTN_OK, "packed fwd: %s", fattn_last_error(ctx));
    static float o_packed[NQ];
    memcpy(o_packed, o, sizeof o);

    enum { W = (HQ + 2 * HK) * D };
    for (int b = 0; b < B; b++)
        for (int t = 0; t < S; t++) {
            float *row = A + ((size_t)b * S + t) * W;
            memcpy(row, q + ((size_t)b * S + t) * HQ * D, sizeof(float) * HQ * D);
            memcpy(row + HQ * D, k + ((size_t)b * S + t) * HK * D, sizeof(float) * HK * D);
            memcpy(row + (HQ + HK) * D, v + ((size_t)b * S + t) * HK * D, sizeof(float) * HK * D);
        }
    a = good_fwd();
    fattn_tensor packed = {A, FATTN_DTYPE_F32, (int64_t)S * W, W, D, NULL, 0};
    a.q = a.k = a.v = packed;
    a.k.data = A + HQ * D;
    a.v.data = A + (HQ + HK) * D;
    memset(o, SENTINEL, sizeof o);
    st = fattn_fwd(ctx, &a);
    EXPECT(st == FATTN_OK && max_diff(o, o_packed, NQ) <= 1e-6,
           "q, k, v heads of one packed buffer: status %d (%s), O differs by %g", (int)st,
           fattn_last_error(ctx), max_diff(o, o_packed, NQ));

    a = good_fwd();
    a.v.data = k; /* v = k */
    st = fattn_fwd(ctx, &a);
    EXPECT(st == FATTN_OK, "v the same memory as k: %s", fattn_last_error(ctx));

    /* O padded (8 floats after each token) in the arena, past the packed
     * inputs, and O transposed (BHSD) */
    float *P = A + 2 * NQ;
    memset(P, SENTINEL, sizeof(float) * 2 * NQ);
    a = good_fwd();
    a.o.data = P;
    a.o.stride_head = D;
    a.o.stride_seq = HQ * D + 8;
    a.o.stride_batch = (int64_t)S * (HQ * D + 8);
    st = fattn_fwd(ctx, &a);
    double diff = 0.0;
    int gaps = 1;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < S; t++) {
            const float *row = P + (size_t)b * a.o.stride_batch + (size_t)t * a.o.stride_seq;
            double d = max_diff(row, o_packed + ((size_t)b * S + t) * HQ * D, HQ * D);
            if (!(d <= diff)) diff = d;
            for (size_t i = 0; i < 8 * sizeof(float); i++)
                gaps &= ((const uint8_t *)(row + HQ * D))[i] == SENTINEL;
        }
    EXPECT(st == FATTN_OK && diff <= 1e-6 && gaps, "padded O: status %d (%s), O differs by %g, gaps %s",
           (int)st, fattn_last_error(ctx), diff, gaps ? "untouched" : "WRITTEN");
    a = good_fwd();
    a.o.stride_seq = D;
    a.o.stride_head = (int64_t)S * D;
    a.o.stride_batch = (int64_t)HQ * S * D;
    st = fattn_fwd(ctx, &a);
    EXPECT(st == FATTN_OK, "BHSD O: %s", fattn_last_error(ctx));
}

/* A CUDA context answers a varlen request before anything reads cu_seqlens:
 * they point at an unmapped address, so a host read would crash and a device
 * copy would fail with another message.  The context is faked (no GPU is
 * needed): the refusal comes before the engine touches its state. */
static void test_cuda_varlen_unread(void) {
    static fattn_ctx fake;
    memset(&fake, 0, sizeof fake);
    fake.backend = FATTN_BACKEND_CUDA;
    const int32_t *bad = (const int32_t *)(uintptr_t)16;
#ifdef FATTN_WITH_CUDA
    /* the forward serves varlen given total_q/total_k (not given here) */
    const fattn_status want = UNS, want_fwd = INV;
    const char *fwd_word = "needs total_q and total_k", *bwd_word = "backward";
#else
    const fattn_status want_fwd = FATTN_ERROR_NO_DEVICE;
    const fattn_status want = FATTN_ERROR_NO_DEVICE;
    const char *fwd_word = "without the CUDA engine", *bwd_word = fwd_word;
#endif
    /* a request the Hopper kernel serves but for cu_seqlens */
    FWD_FAIL(&fake,
             (a_.p.head_dim = 64, a_.p.cu_seqlens_q = a_.p.cu_seqlens_k = bad,
              a_.q.dtype = a_.k.dtype = a_.v.dtype = a_.o.dtype = FATTN_DTYPE_BF16),
             want_fwd, fwd_word);
    BWD_FAIL(&fake, (a_.p.head_dim = 64, a_.p.cu_seqlens_q = a_.p.cu_seqlens_k = bad), want, bwd_word);
    /* alignment is checked before the engine's limits, overlap after them,
     * and neither reads memory: both hold on a CUDA context too (q is 16 KB,
     * the size of bf16 [2, 16, 4, 64]) */
    FWD_FAIL(&fake,
             (a_.p.head_dim = 64, a_.q.dtype = a_.k.dtype = a_.v.dtype = a_.o.dtype = FATTN_DTYPE_BF16,
              a_.q.data = OFF(q, 1)),
             INV, "q.data is not 2-byte aligned");
#ifdef FATTN_WITH_CUDA
    FWD_FAIL(&fake,
             (a_.p.head_dim = 64, a_.q.dtype = a_.k.dtype = a_.v.dtype = a_.o.dtype = FATTN_DTYPE_BF16,
              a_.o.data = q),
             INV, "o overlaps q");
#endif
}

/* Head dims 96 and 192 (issue 37): the CUDA engine's 16-bit forward and
 * backward serve them; what it has no kernel for is refused by name before
 * anything is read (e4m3, seqused_k on a fixed-length batch whose q is not
 * packed, head_dim_v other than 128 at 192), on the fake context above. */
static void test_cuda_head_dims(void) {
#ifdef FATTN_WITH_CUDA
    static fattn_ctx fake;
    memset(&fake, 0, sizeof fake);
    fake.backend = FATTN_BACKEND_CUDA;
    static float scale[64];
    const int32_t *bad = (const int32_t *)(uintptr_t)16;
    FWD_FAIL(&fake,
             (a_.p.head_dim = 96, a_.q.dtype = a_.k.dtype = a_.v.dtype = FATTN_DTYPE_E4M3,
              a_.o.dtype = FATTN_DTYPE_BF16, a_.q.scale = a_.k.scale = a_.v.scale = scale,
              a_.q.scale_block = a_.k.scale_block = a_.v.scale_block = 128),
             UNS, "head_dim 96 with e4m3");
    /* a fixed-length cache call past the decoding kernel runs as varlen
     * queries, which needs q packed along the batch */
    FWD_FAIL(&fake,
             (a_.p.batch = 2, a_.p.head_dim = 192, a_.p.head_dim_v = 128, a_.seqused_k = bad,
              a_.q.dtype = a_.k.dtype = a_.v.dtype = a_.o.dtype = FATTN_DTYPE_BF16, a_.q.stride_head = 192,
              a_.q.stride_seq = 192 * HQ, a_.q.stride_batch = 192 * HQ * (S + 1)),
             UNS, "packed along the batch");
    FWD_FAIL(&fake,
             (a_.p.head_dim = 192, a_.p.head_dim_v = 96,
              a_.q.dtype = a_.k.dtype = a_.v.dtype = a_.o.dtype = FATTN_DTYPE_BF16),
             UNS, "only 192 with 128");
    BWD_FAIL(&fake,
             (a_.p.head_dim = 192, a_.p.head_dim_v = 96,
              a_.q.dtype = a_.k.dtype = a_.v.dtype = a_.o.dtype = a_.dout.dtype = FATTN_DTYPE_BF16,
              a_.dq.dtype = a_.dk.dtype = a_.dv.dtype = FATTN_DTYPE_BF16),
             UNS, "only 192 with 128");
#endif
}

static void test_quantize(fattn_ctx *ctx) {
    poison_outputs();
    expect_fail("quantize NULL ctx", NULL, fattn_quantize(NULL, NULL), INV, "ctx", __LINE__);
    expect_fail("quantize NULL args", ctx, fattn_quantize(ctx, NULL), INV, "args", __LINE__);
    QUANT_FAIL(ctx, a_.in.data = NULL, INV, "in.data");
    QUANT_FAIL(ctx, a_.out.data = NULL, INV, "out.data");
    QUANT_FAIL(ctx, a_.out.scale = NULL, INV, "out.scale");
    QUANT_FAIL(ctx, a_.out.dtype = FATTN_DTYPE_F16, INV, "out.dtype");
    QUANT_FAIL(ctx, a_.in.dtype = FATTN_DTYPE_E4M3, INV, "in.dtype");
    QUANT_FAIL(ctx, a_.block_rows = 0, INV, "block_rows");
    QUANT_FAIL(ctx, a_.granularity = (fattn_quant_granularity)5, INV, "granularity");
    QUANT_FAIL(ctx, a_.seqlen = 0, INV, "seqlen");
    QUANT_FAIL(ctx, a_.heads = -1, INV, "heads");
    QUANT_FAIL(ctx, (a_.head_dim = 24, a_.heads = 4, a_.rotate = 1), UNS, "head_dim");
    QUANT_FAIL(ctx, (a_.in.stride_seq = -1), INV, "in.stride_seq");
}

/* Rotation on head dim 96 is unsupported (not a power of two). */
static void test_quantize_rotate96(fattn_ctx *ctx) {
    enum { QD = 96, QS = 4 };
    static float in[QS * QD];
    static uint8_t out[QS * QD];
    static float sc[QS];
    memset(out, SENTINEL, sizeof out);
    memset(sc, SENTINEL, sizeof sc);
    fattn_quantize_args a;
    memset(&a, 0, sizeof a);
    a.in = fattn_tensor_bshd(in, FATTN_DTYPE_F32);
    a.out = fattn_tensor_bshd(out, FATTN_DTYPE_E4M3);
    a.out.scale = sc;
    a.batch = 1, a.seqlen = QS, a.heads = 1, a.head_dim = QD, a.block_rows = 1, a.rotate = 1;
    fattn_status st = fattn_quantize(ctx, &a);
    int untouched = 1;
    for (size_t i = 0; i < sizeof out; i++) untouched &= out[i] == SENTINEL;
    for (size_t i = 0; i < sizeof sc; i++) untouched &= ((uint8_t *)sc)[i] == SENTINEL;
    EXPECT(st == UNS && strstr(fattn_last_error(ctx), "head_dim") && untouched,
           "rotate on head_dim 96: status %d '%s' untouched %d", (int)st, fattn_last_error(ctx),
           untouched);
}

int main(void) {
    for (size_t i = 0; i < NQ; i++) q[i] = (float)((i * 7919) % 101) / 101.0f - 0.5f;
    for (size_t i = 0; i < NK; i++) k[i] = (float)((i * 104729) % 97) / 97.0f - 0.5f;
    for (size_t i = 0; i < NK; i++) v[i] = (float)((i * 1299709) % 89) / 89.0f - 0.5f;
    for (size_t i = 0; i < NQ; i++) dout[i] = (float)((i * 15485863) % 83) / 83.0f - 0.5f;
    memcpy(q_in, q, sizeof q);
    memcpy(k_in, k, sizeof k);
    memcpy(v_in, v, sizeof v);
    memcpy(dout_in, dout, sizeof dout);

    test_status_and_version();
    test_contexts();

    fattn_ctx *ctx = NULL;
    if (fattn_ctx_create(&ctx, FATTN_BACKEND_CPU, 0) != FATTN_OK) {
        fprintf(stderr, "cannot create a CPU context: %s\n", fattn_last_error(NULL));
        return 1;
    }
    test_fwd(ctx);
    test_bwd(ctx);
    test_quantize(ctx);
    test_quantize_rotate96(ctx);
    test_alignment(ctx);
    test_overlap(ctx);
    fattn_ctx_free(ctx);
    test_cuda_varlen_unread();
    test_cuda_head_dims();

    printf("test_api_errors: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
