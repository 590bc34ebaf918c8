/* test_errors.cu - requests the Hopper kernels cannot serve return a status and
 * a message naming the problem, and leave O and LSE (the forward) or dQ, dK and
 * dV (the backward) untouched, checked byte for byte against a sentinel.  Exit
 * 77 without a Hopper GPU. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu_testutil.h"
#include "fattn.h"

enum { B = 1, S = 64, H = 2, D = 128, N = B * S * H * 256 + 64 };

static uint8_t *dq, *dk, *dv, *dout, *ddo, *ddq, *ddk, *ddv;
static float *dlse;
static uint8_t sentinel[N * 2];

static fattn_fwd_args base_args(void) {
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p.batch = B; a.p.seqlen_q = S; a.p.seqlen_k = S; a.p.heads_q = H; a.p.heads_kv = H; a.p.head_dim = D;
    a.q = fattn_tensor_bshd(dq, FATTN_DTYPE_BF16);
    a.k = fattn_tensor_bshd(dk, FATTN_DTYPE_BF16);
    a.v = fattn_tensor_bshd(dv, FATTN_DTYPE_BF16);
    a.o = fattn_tensor_bshd(dout, FATTN_DTYPE_BF16);
    a.lse = dlse;
    return a;
}

/* Output regions: filled with the sentinel before a call, compared after it. */
typedef struct {
    void *p;
    size_t n;
} region;

static void poison(const region *r, int n) {
    for (int i = 0; i < n; ++i)
        if (cudaMemcpy(r[i].p, sentinel, r[i].n, cudaMemcpyHostToDevice) != cudaSuccess) exit(1);
}

static int untouched(const region *r, int n) {
    static uint8_t back[N * 2];
    int same = 1;
    for (int i = 0; i < n; ++i) {
        cudaMemcpy(back, r[i].p, r[i].n, cudaMemcpyDeviceToHost);
        same = same && memcmp(back, sentinel, r[i].n) == 0;
    }
    return same;
}

/* A refusal must name the problem and leave the outputs alone; a call expected
 * to run (want FATTN_OK) must just succeed. */
static void verdict(fattn_ctx *ctx, fattn_status st, fattn_status want, const char *needle, int same,
                    const char *what) {
    const char *msg = fattn_last_error(ctx);
    const int refused = want != FATTN_OK;
    int ok = st == want && (!refused || (strstr(msg, needle) != NULL && same));
    if (!ok) tu_failures++;
    printf("  [%s] %s: status %d (want %d), \"%s\"%s\n", ok ? "ok" : "FAIL", what, (int)st, (int)want, msg,
           refused && !same ? ", OUTPUT WRITTEN" : "");
}

static void expect(fattn_ctx *ctx, const fattn_fwd_args *a, fattn_status want, const char *needle, const char *what) {
    const region out[] = {{dout, N * 2}, {dlse, B * H * S * 4}};
    poison(out, 2);
    fattn_status st = fattn_fwd(ctx, a);
    cudaDeviceSynchronize();
    verdict(ctx, st, want, needle, untouched(out, 2), what);
}

static fattn_bwd_args bwd_base_args(void) {
    fattn_bwd_args b;
    memset(&b, 0, sizeof b);
    const fattn_fwd_args f = base_args();
    b.p = f.p;
    b.q = f.q; b.k = f.k; b.v = f.v; b.o = f.o;
    b.dout = fattn_tensor_bshd(ddo, FATTN_DTYPE_BF16);
    b.dq = fattn_tensor_bshd(ddq, FATTN_DTYPE_BF16);
    b.dk = fattn_tensor_bshd(ddk, FATTN_DTYPE_BF16);
    b.dv = fattn_tensor_bshd(ddv, FATTN_DTYPE_BF16);
    b.lse = dlse;
    return b;
}

static void expect_bwd(fattn_ctx *ctx, const fattn_bwd_args *b, fattn_status want, const char *needle,
                       const char *what) {
    const region out[] = {{ddq, N * 2}, {ddk, N * 2}, {ddv, N * 2}};
    poison(out, 3);
    fattn_status st = fattn_bwd(ctx, b);
    cudaDeviceSynchronize();
    char label[160];
    snprintf(label, sizeof label, "backward, %s", what);
    verdict(ctx, st, want, needle, untouched(out, 3), label);
}

int main(void) {
    fattn_ctx *ctx = gpu_ctx_or_skip();
    fattn_status st;
    for (int i = 0; i < N * 2; ++i) sentinel[i] = (uint8_t)(0xA5 ^ i);
    if (cudaMalloc(&dq, N * 2) || cudaMalloc(&dk, N * 2) || cudaMalloc(&dv, N * 2) || cudaMalloc(&dout, N * 2) ||
        cudaMalloc(&dlse, B * H * S * 4) || cudaMalloc(&ddo, N * 2) || cudaMalloc(&ddq, N * 2) ||
        cudaMalloc(&ddk, N * 2) || cudaMalloc(&ddv, N * 2)) return 1;
    cudaMemset(dq, 0, N * 2); cudaMemset(dk, 0, N * 2); cudaMemset(dv, 0, N * 2); cudaMemset(ddo, 0, N * 2);
    const fattn_fwd_args good = base_args();
    fattn_fwd_args a;

    a = good; a.p.head_dim = 80;
    expect(ctx, &a, FATTN_ERROR_UNSUPPORTED, "head_dim 80", "head dim 80");
    a = good; a.p.batch = 2; a.p.head_dim = 192; a.p.head_dim_v = 128; a.seqused_k = (const int32_t *)dq;
    a.o.stride_seq = 2 * a.p.heads_q * 128, a.o.stride_head = 128, a.o.stride_batch = a.p.seqlen_q * a.o.stride_seq + 8;
    expect(ctx, &a, FATTN_ERROR_UNSUPPORTED, "packed along the batch", "fixed-length seqused_k with o not packed");
    a = good; a.p.head_dim_v = 64;
    expect(ctx, &a, FATTN_ERROR_UNSUPPORTED, "head_dim_v", "head_dim != head_dim_v");
    a = good; a.q.data = dq + 2; a.k.data = dk; /* 2-byte offset: bf16-aligned, not 16-byte */
    expect(ctx, &a, FATTN_ERROR_INVALID_ARGUMENT, "16-byte aligned", "q misaligned for TMA");
    a = good; a.q.stride_head = 132; a.q.stride_seq = 2 * 132; a.q.stride_batch = (int64_t)S * 2 * 132;
    expect(ctx, &a, FATTN_ERROR_UNSUPPORTED, "multiples of 8", "q stride not a multiple of 8 elements");
    static uint8_t host_buf[N * 2];
    a = good; a.k.data = host_buf;
    expect(ctx, &a, FATTN_ERROR_INVALID_ARGUMENT, "k", "host pointer given to a CUDA context");
    a = good; a.q.dtype = a.k.dtype = a.v.dtype = a.o.dtype = FATTN_DTYPE_F32;
    expect(ctx, &a, FATTN_ERROR_UNSUPPORTED, "f32", "f32 inputs on the CUDA engine");
    int32_t *cu;
    cudaMalloc(&cu, 8);
    int32_t hcu[2] = {0, S};
    cudaMemcpy(cu, hcu, 8, cudaMemcpyHostToDevice);
    a = good; a.p.cu_seqlens_q = cu; a.p.cu_seqlens_k = cu;
    expect(ctx, &a, FATTN_ERROR_INVALID_ARGUMENT, "needs total_q and total_k", "varlen on the CUDA engine without totals");
    static int32_t host_cu[2] = {0, S};
    a = good; a.p.cu_seqlens_q = host_cu; a.p.cu_seqlens_k = cu; a.p.total_q = a.p.total_k = S;
    expect(ctx, &a, FATTN_ERROR_INVALID_ARGUMENT, "cu_seqlens_q", "varlen with host cu_seqlens on a CUDA context");
    a = good; a.p.cu_seqlens_q = a.p.cu_seqlens_k = cu; a.p.total_q = a.p.total_k = S; a.seqused_q = host_cu;
    expect(ctx, &a, FATTN_ERROR_INVALID_ARGUMENT, "seqused_q", "varlen with a host seqused_q on a CUDA context");
    a = good; a.p.cu_seqlens_q = cu; a.p.total_q = S; a.cache_leftpad = host_cu;
    expect(ctx, &a, FATTN_ERROR_INVALID_ARGUMENT, "cache_leftpad", "a host cache_leftpad on a CUDA context");
    a = good; a.p.cu_seqlens_q = a.p.cu_seqlens_k = cu; a.p.total_q = a.p.total_k = S;
    a.p.batch = 100000; a.p.seqlen_q = 1 << 24;
    expect(ctx, &a, FATTN_ERROR_UNSUPPORTED, "2^31 - 1 tiles", "varlen tiles past int32 (batch x longest x heads)");
    a = good; a.p.heads_kv = 3;
    expect(ctx, &a, FATTN_ERROR_INVALID_ARGUMENT, "heads_kv", "heads_q not a multiple of heads_kv");
    a = good; a.p.seqlen_q = 0;
    expect(ctx, &a, FATTN_ERROR_INVALID_ARGUMENT, "seqlen_q", "seqlen_q 0");
    a = good; a.o.data = NULL;
    expect(ctx, &a, FATTN_ERROR_INVALID_ARGUMENT, "o", "o NULL");
    /* and the unchanged request works (the checks above are not over-eager) */
    st = fattn_fwd(ctx, &good);
    TU_CHECK(st == FATTN_OK && cudaDeviceSynchronize() == cudaSuccess, "valid call failed: %s", fattn_last_error(ctx));
    printf("  [%s] the same arguments, corrected, run\n", st == FATTN_OK ? "ok" : "FAIL");

    /* the backward's launch limits (grid y and z; the varlen workspace's row blocks
     * counted in an int), refused by the engine check before any size or
     * overlap check, so the small buffers above stand in for huge tensors */
    const fattn_bwd_args bgood = bwd_base_args();
    fattn_bwd_args b;
    b = bgood; b.p.head_dim = b.p.head_dim_v = 80;
    expect_bwd(ctx, &b, FATTN_ERROR_UNSUPPORTED, "head_dim 80", "head dim 80");
    b = bgood; b.q.dtype = b.k.dtype = b.v.dtype = b.o.dtype = b.dout.dtype = FATTN_DTYPE_F32;
    b.dq.dtype = b.dk.dtype = b.dv.dtype = FATTN_DTYPE_F32;
    expect_bwd(ctx, &b, FATTN_ERROR_UNSUPPORTED, "f32", "f32 inputs");
    b = bgood; b.p.batch = 65536;
    expect_bwd(ctx, &b, FATTN_ERROR_UNSUPPORTED, "at most 65535", "batch 65536");
    b = bgood; b.p.heads_q = b.p.heads_kv = 65536;
    expect_bwd(ctx, &b, FATTN_ERROR_UNSUPPORTED, "at most 65535", "heads_q 65536");
    b = bgood; b.p.cu_seqlens_q = b.p.cu_seqlens_k = cu; b.p.heads_q = b.p.heads_kv = 65535;
    b.p.total_q = b.p.total_k = 64 * 40000;
    expect_bwd(ctx, &b, FATTN_ERROR_UNSUPPORTED, "row blocks", "varlen workspace row blocks past int32");
    /* and the unchanged backward runs, after a forward wrote its LSE */
    st = fattn_fwd(ctx, &good);
    TU_CHECK(st == FATTN_OK && cudaDeviceSynchronize() == cudaSuccess, "forward for the backward failed: %s",
             fattn_last_error(ctx));
    expect_bwd(ctx, &bgood, FATTN_OK, "", "the same arguments, corrected");
    cudaFree(cu);
    uint8_t *bufs[] = {dq, dk, dv, dout, ddo, ddq, ddk, ddv};
    for (int i = 0; i < 8; ++i) cudaFree(bufs[i]);
    cudaFree(dlse);
    fattn_ctx_free(ctx);
    return tu_finish("gpu errors");
}
