/* test_header_rules.c - the rules fattn.h states for the gaps of issue 43
 * item 8, on a CPU context:
 *   - e4m3 scales: NaN, zero or negative entries of q.scale, k.scale or
 *     v.scale are refused (INVALID_ARGUMENT naming the tensor and the entry,
 *     nothing written); +Inf is accepted and gives NaN rows, as the
 *     quantiser's scale of an Inf block does; a positive subnormal scale is
 *     accepted;
 *   - a self-overlapping input (a broadcast K, stride_batch 0 with batch 2,
 *     or stride_head 0) is refused with a message saying why;
 *   - fattn_rotation_signs with n <= 0 or NULL signs is INVALID_ARGUMENT and
 *     writes nothing;
 *   - a row whose scores are all -inf because of the inputs (q negative
 *     against a +Inf element in every key) gets O = 0 and LSE = -inf. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/testutil.h"
#include "fattn.h"

enum { B = 2, S = 16, H = 2, D = 8, BLK = 4, NB = S / BLK };

static uint8_t q8[B * S * H * D], k8[B * S * H * D], v8[B * S * H * D];
static float qs[B * H * NB], ks[B * H * NB], vs[B * H * NB];
static float o[B * S * H * D], lse[B * H * S];

static fattn_fwd_args e4m3_args(void) {
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p.batch = B; a.p.seqlen_q = a.p.seqlen_k = S; a.p.heads_q = a.p.heads_kv = H; a.p.head_dim = D;
    a.q = fattn_tensor_bshd(q8, FATTN_DTYPE_E4M3);
    a.k = fattn_tensor_bshd(k8, FATTN_DTYPE_E4M3);
    a.v = fattn_tensor_bshd(v8, FATTN_DTYPE_E4M3);
    a.q.scale = qs; a.k.scale = ks; a.v.scale = vs;
    a.q.scale_block = a.k.scale_block = a.v.scale_block = BLK;
    a.o = fattn_tensor_bshd(o, FATTN_DTYPE_F32);
    a.lse = lse;
    return a;
}

static int all_poison(void) {
    const uint8_t *p = (const uint8_t *)o, *l = (const uint8_t *)lse;
    for (size_t i = 0; i < sizeof o; i++)
        if (p[i] != 0xA5) return 0;
    for (size_t i = 0; i < sizeof lse; i++)
        if (l[i] != 0xA5) return 0;
    return 1;
}

static void scales(fattn_ctx *ctx, tu_rng *rng) {
    for (size_t i = 0; i < sizeof q8; i++) {
        q8[i] = fattn_f32_to_e4m3((float)tu_rng_normal(rng));
        k8[i] = fattn_f32_to_e4m3((float)tu_rng_normal(rng));
        v8[i] = fattn_f32_to_e4m3((float)tu_rng_normal(rng));
    }
    float *arr[3] = {qs, ks, vs};
    const char *names[3] = {"q.scale", "k.scale", "v.scale"};
    const float bad[4] = {NAN, 0.0f, -0.0f, -1.0f};
    for (int t = 0; t < 3; t++)
        for (int w = 0; w < 4; w++) {
            for (int i = 0; i < B * H * NB; i++) qs[i] = ks[i] = vs[i] = 0.25f;
            const int at = (t * 5 + w * 3) % (B * H * NB);
            arr[t][at] = bad[w];
            memset(o, 0xA5, sizeof o);
            memset(lse, 0xA5, sizeof lse);
            fattn_fwd_args a = e4m3_args();
            fattn_status st = fattn_fwd(ctx, &a);
            char entry[32];
            snprintf(entry, sizeof entry, "[%d]", at);
            const int named = strstr(fattn_last_error(ctx), names[t]) && strstr(fattn_last_error(ctx), entry);
            printf("  %s%s = %g: %s (%s)\n", names[t], entry, (double)bad[w], fattn_status_string(st),
                   fattn_last_error(ctx));
            TU_CHECK(st == FATTN_ERROR_INVALID_ARGUMENT, "%s%s = %g accepted", names[t], entry, (double)bad[w]);
            TU_CHECK(named, "the message does not name %s%s", names[t], entry);
            TU_CHECK(all_poison(), "a refused call wrote its outputs");
        }
    /* +Inf: accepted, the rows that see that block are NaN (as a quantised Inf block) */
    for (int i = 0; i < B * H * NB; i++) qs[i] = ks[i] = vs[i] = 0.25f;
    vs[0] = INFINITY; /* batch 0, head 0, keys 0..3 */
    fattn_fwd_args a = e4m3_args();
    TU_EXPECT_OK(fattn_fwd(ctx, &a));
    int nan_rows = 0;
    for (int i = 0; i < S; i++) nan_rows += isnan(o[(size_t)i * H * D]) != 0;
    printf("  v.scale[0] = +inf: accepted, %d of %d rows of (batch 0, head 0) NaN\n", nan_rows, S);
    TU_CHECK(nan_rows == S, "v.scale +inf: %d rows NaN, %d expected", nan_rows, S);
    /* a positive subnormal scale is a value like any other on the CPU */
    vs[0] = 1e-40f;
    TU_EXPECT_OK(fattn_fwd(ctx, &a));
    int finite = 1;
    for (size_t i = 0; i < sizeof o / sizeof o[0]; i++) finite &= isfinite(o[i]) != 0;
    TU_CHECK(finite, "a subnormal v.scale gave non-finite outputs");
}

static void broadcast(fattn_ctx *ctx) {
    static float q[B * S * H * D], k[S * H * D], v[B * S * H * D], of[B * S * H * D];
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) q[i] = v[i] = 0.5f;
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) k[i] = 0.5f;
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p.batch = B; a.p.seqlen_q = a.p.seqlen_k = S; a.p.heads_q = a.p.heads_kv = H; a.p.head_dim = D;
    a.q = fattn_tensor_bshd(q, FATTN_DTYPE_F32);
    a.k = fattn_tensor_bshd(k, FATTN_DTYPE_F32);
    a.k.stride_batch = 0; /* torch's expand() over the batch */
    a.k.stride_seq = H * D;
    a.k.stride_head = D;
    a.v = fattn_tensor_bshd(v, FATTN_DTYPE_F32);
    a.o = fattn_tensor_bshd(of, FATTN_DTYPE_F32);
    fattn_status st = fattn_fwd(ctx, &a);
    printf("  k broadcast over the batch (stride_batch 0): %s (%s)\n", fattn_status_string(st), fattn_last_error(ctx));
    TU_CHECK(st == FATTN_ERROR_INVALID_ARGUMENT && strstr(fattn_last_error(ctx), "stride_batch"),
             "a broadcast k is not refused with its stride named");
    a.k.stride_batch = (int64_t)S * H * D;
    a.k.stride_head = 0; /* one head for all: GQA is heads_kv, not a broadcast */
    st = fattn_fwd(ctx, &a);
    TU_CHECK(st == FATTN_ERROR_INVALID_ARGUMENT, "k with stride_head 0 accepted");
}

static void rotation_signs(void) {
    float signs[4] = {7, 7, 7, 7};
    TU_CHECK(fattn_rotation_signs(1, 0, signs) == FATTN_ERROR_INVALID_ARGUMENT, "n = 0 not refused");
    TU_CHECK(fattn_rotation_signs(1, -3, signs) == FATTN_ERROR_INVALID_ARGUMENT, "n < 0 not refused");
    TU_CHECK(fattn_rotation_signs(1, 4, NULL) == FATTN_ERROR_INVALID_ARGUMENT, "NULL signs not refused");
    TU_CHECK(signs[0] == 7 && signs[3] == 7, "a refused fattn_rotation_signs wrote signs");
    TU_EXPECT_OK(fattn_rotation_signs(1, 4, signs));
    TU_CHECK(fabsf(signs[0]) == 1 && fabsf(signs[3]) == 1, "signs are not +-1");
}

static void all_minus_inf(fattn_ctx *ctx) {
    enum { SQ = 3, SK = 5, DD = 4 };
    float q[SQ * DD], k[SK * DD], v[SK * DD], oo[SQ * DD], l[SQ];
    for (int i = 0; i < SQ * DD; i++) q[i] = 1.0f;
    for (int e = 0; e < DD; e++) q[1 * DD + e] = -1.0f; /* row 1: negative throughout */
    for (int j = 0; j < SK * DD; j++) k[j] = v[j] = 0.5f;
    for (int j = 0; j < SK; j++) k[j * DD + 2] = INFINITY; /* every key: q.k = -inf for row 1, +inf else */
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p.batch = 1; a.p.seqlen_q = SQ; a.p.seqlen_k = SK; a.p.heads_q = a.p.heads_kv = 1; a.p.head_dim = DD;
    a.q = fattn_tensor_bshd(q, FATTN_DTYPE_F32);
    a.k = fattn_tensor_bshd(k, FATTN_DTYPE_F32);
    a.v = fattn_tensor_bshd(v, FATTN_DTYPE_F32);
    a.o = fattn_tensor_bshd(oo, FATTN_DTYPE_F32);
    a.lse = l;
    TU_EXPECT_OK(fattn_fwd(ctx, &a));
    int zero = l[1] == -INFINITY;
    for (int e = 0; e < DD; e++) zero &= oo[DD + e] == 0.0f;
    printf("  row whose scores are all -inf: o = %g %g %g %g, lse = %g\n", oo[DD], oo[DD + 1], oo[DD + 2],
           oo[DD + 3], (double)l[1]);
    TU_CHECK(zero, "a row whose scores are all -inf is not O = 0, LSE = -inf");
    TU_CHECK(isnan(oo[0]) && isnan(l[0]), "a row of +inf scores is not NaN");
}

int main(void) {
    tu_rng rng;
    tu_rng_init(&rng, (uint64_t)tu_seed());
    fattn_ctx *ctx = NULL;
    TU_EXPECT_OK(fattn_ctx_create(&ctx, FATTN_BACKEND_CPU, 0));
    printf("e4m3 scales\n");
    scales(ctx, &rng);
    printf("broadcast inputs\n");
    broadcast(ctx);
    printf("fattn_rotation_signs\n");
    rotation_signs();
    printf("rows whose scores are all -inf\n");
    all_minus_inf(ctx);
    fattn_ctx_free(ctx);
    return tu_finish("test_header_rules");
}
