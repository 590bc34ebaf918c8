/* test_portable_fwd.cu - the portable CUDA forward (src/cuda/portable/, issue
 * 41) against the FP64 oracle, forced on whatever sm_80+ GPU runs the test
 * (this test sets FATTN_CUDA_ENGINE=portable itself, so on an H200 it runs
 * the Ampere-class kernels; ctest also runs test_fwd, test_fwd_args,
 * test_fwd_nan and test_varlen in that mode: tests/CMakeLists.txt).
 *
 * Shapes with tails (seqlen 1, 17, 1000, 4097), causal with unequal lengths
 * both ways (rows that see no key: O = 0, LSE = -inf), GQA and MQA, head
 * dims 64, 96, 128, 192, 256, bf16 and f16, q, k, v and o as padded views (BSHD and
 * BHSD strides with gaps between heads, rows and batch entries): every
 * element of O's buffer poisoned with 0xFF bytes before the call, the view
 * checked against the oracle with gpu_check_fwd's tolerances (the Hopper
 * forward's), the gaps checked untouched.  Then what the engine refuses
 * (UNSUPPORTED, nothing written): head dim 80 in the forward (whose
 * variants are gpu_portable_test_fwd_variants'), a window in the backward;
 * and FATTN_CUDA_ENGINE values.  Its
 * backward is checked by test_bwd, test_bwd_hdims and test_varlen, which
 * ctest reruns with FATTN_CUDA_ENGINE=portable.  Exit 77 without an sm_80+ GPU
 * (FATTN_REQUIRE_GPU=1: a failure); FATTN_TEST_SMALL=1: small shapes only
 * (compute-sanitizer). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "common/oracle.h"
#include "fattn.h"
#include "gpu/gpu_testutil.h"

enum pad_layout { PACKED, PAD_BSHD, PAD_BHSD };

struct pcase {
    int batch, sq, sk, hq, hkv, d, causal;
    fattn_dtype dt;
    pad_layout layout;
};

/* A device tensor [batch, seq, heads, dim] in `layout`: strides in
 * elements (multiples of 8: 16-byte rows), and the buffer's element count. */
struct dev_view {
    fattn_tensor t;
    size_t elems;
};

static dev_view view_make(fattn_dtype dt, int B, int S, int H, int D, pad_layout l) {
    dev_view v;
    memset(&v, 0, sizeof v);
    v.t.dtype = dt;
    if (l == PACKED) {
        v.t.stride_head = D, v.t.stride_seq = (int64_t)H * D, v.t.stride_batch = (int64_t)S * H * D;
    } else if (l == PAD_BSHD) {
        v.t.stride_head = D + 8, v.t.stride_seq = (int64_t)H * (D + 8) + 16;
        v.t.stride_batch = (int64_t)S * v.t.stride_seq + 24;
    } else {
        v.t.stride_seq = D + 16, v.t.stride_head = (int64_t)S * (D + 16) + 8;
        v.t.stride_batch = (int64_t)H * v.t.stride_head + 32;
    }
    v.elems = (size_t)(B * v.t.stride_batch);
    void *p = NULL;
    CK(cudaMalloc(&p, v.elems * 2));
    CK(cudaMemset(p, 0xFF, v.elems * 2));
    v.t.data = p;
    return v;
}

static size_t at(const fattn_tensor &t, int b, int s, int h, int d) {
    return (size_t)(b * t.stride_batch + s * t.stride_seq + h * t.stride_head + d);
}

/* packed-BSHD doubles (already 16-bit values) into the view */
static void view_set(dev_view &v, const double *x, int B, int S, int H, int D) {
    std::vector<uint16_t> h(v.elems, 0xFFFF), one(1);
    for (int b = 0; b < B; ++b)
        for (int s = 0; s < S; ++s)
            for (int hh = 0; hh < H; ++hh) {
                const double *src = x + (((size_t)b * S + s) * H + hh) * D;
                tu_to_dtype(src, (size_t)D, v.t.dtype, &h[at(v.t, b, s, hh, 0)]);
            }
    CK(cudaMemcpy(v.t.data, h.data(), v.elems * 2, cudaMemcpyHostToDevice));
}

/* the view back as packed-BSHD doubles; *gaps_written: elements outside it
 * that no longer hold the 0xFFFF poison */
static void view_get(const dev_view &v, double *x, int B, int S, int H, int D, size_t *gaps_written) {
    std::vector<uint16_t> h(v.elems);
    std::vector<char> inside(v.elems, 0);
    CK(cudaMemcpy(h.data(), v.t.data, v.elems * 2, cudaMemcpyDeviceToHost));
    for (int b = 0; b < B; ++b)
        for (int s = 0; s < S; ++s)
            for (int hh = 0; hh < H; ++hh) {
                const size_t a = at(v.t, b, s, hh, 0);
                tu_from_dtype(&h[a], (size_t)D, v.t.dtype, x + (((size_t)b * S + s) * H + hh) * D);
                memset(&inside[a], 1, (size_t)D);
            }
    size_t n = 0;
    for (size_t i = 0; i < v.elems; ++i) n += !inside[i] && h[i] != 0xFFFF;
    *gaps_written = n;
}

static const char *layout_name(pad_layout l) { return l == PACKED ? "packed" : l == PAD_BSHD ? "padded BSHD" : "padded BHSD"; }

static void run_case(fattn_ctx *ctx, tu_rng *rng, const pcase &c) {
    const size_t nq = (size_t)c.batch * c.sq * c.hq * c.d, nk = (size_t)c.batch * c.sk * c.hkv * c.d;
    const size_t nlse = (size_t)c.batch * c.hq * c.sq;
    std::vector<double> q(nq), k(nk), v(nk), ref(nq), got(nq), ref_lse(nlse);
    tu_fill_normal(rng, q.data(), nq);
    tu_fill_normal(rng, k.data(), nk);
    tu_fill_normal(rng, v.data(), nk);
    tu_round_to(q.data(), nq, c.dt);
    tu_round_to(k.data(), nk, c.dt);
    tu_round_to(v.data(), nk, c.dt);
    dev_view dq = view_make(c.dt, c.batch, c.sq, c.hq, c.d, c.layout);
    dev_view dk = view_make(c.dt, c.batch, c.sk, c.hkv, c.d, c.layout);
    dev_view dv = view_make(c.dt, c.batch, c.sk, c.hkv, c.d, c.layout);
    dev_view dout = view_make(c.dt, c.batch, c.sq, c.hq, c.d, c.layout);
    view_set(dq, q.data(), c.batch, c.sq, c.hq, c.d);
    view_set(dk, k.data(), c.batch, c.sk, c.hkv, c.d);
    view_set(dv, v.data(), c.batch, c.sk, c.hkv, c.d);
    float *dlse;
    CK(cudaMalloc(&dlse, nlse * 4 + 16));
    CK(cudaMemset(dlse, 0xFF, nlse * 4 + 16));

    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = tu_problem(c.batch, c.sq, c.sk, c.hq, c.hkv, c.d, 0, c.causal, NULL, NULL);
    a.q = dq.t, a.k = dk.t, a.v = dv.t, a.o = dout.t;
    a.lse = dlse;
    char what[200];
    snprintf(what, sizeof what, "portable %s b%d sq%d sk%d h%d/%d d%d%s %s", fattn_dtype_name(c.dt), c.batch, c.sq,
             c.sk, c.hq, c.hkv, c.d, c.causal ? " causal" : "", layout_name(c.layout));
    const fattn_status st = fattn_fwd(ctx, &a);
    TU_CHECK(st == FATTN_OK, "%s: %s: %s", what, fattn_status_string(st), fattn_last_error(ctx));
    const cudaError_t e = cudaDeviceSynchronize();
    TU_CHECK(e == cudaSuccess, "%s: kernel failed: %s", what, cudaGetErrorString(e));
    if (e != cudaSuccess) exit(1);
    size_t gaps = 0;
    view_get(dout, got.data(), c.batch, c.sq, c.hq, c.d, &gaps);
    TU_CHECK(gaps == 0, "%s: %zu elements of O's buffer outside the view written", what, gaps);
    std::vector<float> lse(nlse + 4);
    CK(cudaMemcpy(lse.data(), dlse, nlse * 4 + 16, cudaMemcpyDeviceToHost));
    size_t tail = 0;
    for (int i = 0; i < 4; ++i) tail += *(uint32_t *)&lse[nlse + i] != 0xFFFFFFFFu;
    TU_CHECK(tail == 0, "%s: %zu LSE entries written past the end", what, tail);

    oracle_problem op;
    memset(&op, 0, sizeof op);
    op.batch = c.batch, op.seqlen_q = c.sq, op.seqlen_k = c.sk, op.heads_q = c.hq, op.heads_kv = c.hkv;
    op.head_dim = op.head_dim_v = c.d, op.causal = c.causal;
    oracle_fwd(&op, q.data(), k.data(), v.data(), ref.data(), ref_lse.data());
    gpu_check_fwd(what, c.dt, got.data(), ref.data(), nq, c.d, lse.data(), ref_lse.data(), nlse);

    cudaFree(dq.t.data), cudaFree(dk.t.data), cudaFree(dv.t.data), cudaFree(dout.t.data), cudaFree(dlse);
}

/* Calls the portable engine refuses: UNSUPPORTED, naming the engine, with
 * O (and the backward's outputs) left as they were. */
static void refusals(fattn_ctx *ctx) {
    const int S = 64, H = 2, D = 64;
    const size_t n = (size_t)S * H * D;
    void *buf[8];
    for (int i = 0; i < 8; ++i) {
        CK(cudaMalloc(&buf[i], n * 2 * 2)); /* room for head dim 128 */
        CK(cudaMemset(buf[i], i < 3 ? 0x3C : 0x5A, n * 2 * 2));
    }
    float *lse;
    CK(cudaMalloc(&lse, (size_t)H * S * 4));
    const fattn_dtype BF = FATTN_DTYPE_BF16;
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = tu_problem(1, S, S, H, H, D, 0, 0, NULL, NULL);
    a.q = fattn_tensor_bshd(buf[0], BF), a.k = fattn_tensor_bshd(buf[1], BF), a.v = fattn_tensor_bshd(buf[2], BF);
    a.o = fattn_tensor_bshd(buf[3], BF);
    a.lse = lse;
    struct {
        const char *name;
        int d80;
    } fw[] = {{"head_dim 80", 1}};
    std::vector<uint16_t> h(n * 2);
    for (const auto &f : fw) {
        fattn_fwd_args b = a;
        if (f.d80) b.p.head_dim = 80;
        const fattn_status st = fattn_fwd(ctx, &b);
        TU_CHECK(st == FATTN_ERROR_UNSUPPORTED && strstr(fattn_last_error(ctx), "portable"),
                 "portable fwd with %s: %s (%s), expected UNSUPPORTED naming the portable engine", f.name,
                 fattn_status_string(st), fattn_last_error(ctx));
        printf("  %s: %s: %s\n", f.name, fattn_status_string(st), fattn_last_error(ctx));
        CK(cudaMemcpy(h.data(), buf[3], n * 2 * 2, cudaMemcpyDeviceToHost));
        size_t changed = 0;
        for (size_t i = 0; i < n * 2; ++i) changed += h[i] != 0x5A5A;
        TU_CHECK(changed == 0, "portable fwd with %s: refused, yet %zu elements of O written", f.name, changed);
    }
    fattn_bwd_args g;
    memset(&g, 0, sizeof g);
    g.p = a.p, g.q = a.q, g.k = a.k, g.v = a.v, g.o = a.o, g.lse = lse;
    g.dout = fattn_tensor_bshd(buf[4], BF);
    g.dq = fattn_tensor_bshd(buf[5], BF), g.dk = fattn_tensor_bshd(buf[6], BF), g.dv = fattn_tensor_bshd(buf[7], BF);
    g.p.window = 1, g.p.window_left = 8, g.p.window_right = -1; /* the backward has no variants */
    const fattn_status sb = fattn_bwd(ctx, &g);
    TU_CHECK(sb == FATTN_ERROR_UNSUPPORTED && strstr(fattn_last_error(ctx), "portable"),
             "portable bwd with a window: %s (%s), expected UNSUPPORTED naming the portable engine",
             fattn_status_string(sb), fattn_last_error(ctx));
    printf("  backward with a window: %s: %s\n", fattn_status_string(sb), fattn_last_error(ctx));
    for (int i = 5; i < 8; ++i) {
        CK(cudaMemcpy(h.data(), buf[i], n * 2 * 2, cudaMemcpyDeviceToHost));
        size_t changed = 0;
        for (size_t j = 0; j < n * 2; ++j) changed += h[j] != 0x5A5A;
        TU_CHECK(changed == 0, "portable bwd with a window: refused, yet %zu elements of d%c written", changed,
                 "qkv"[i - 5]);
    }
    for (int i = 0; i < 8; ++i) cudaFree(buf[i]);
    cudaFree(lse);
}

int main(void) {
    /* a value that names no engine: refused at creation */
    setenv("FATTN_CUDA_ENGINE", "ampere", 1);
    fattn_ctx *bad = NULL;
    const fattn_status sbad = fattn_ctx_create(&bad, FATTN_BACKEND_CUDA, 0);
    setenv("FATTN_CUDA_ENGINE", "portable", 1);
    fattn_ctx *ctx = gpu_ctx_or_skip();
    TU_CHECK(sbad == FATTN_ERROR_INVALID_ARGUMENT && !bad, "FATTN_CUDA_ENGINE=ampere: %s, expected INVALID_ARGUMENT",
             fattn_status_string(sbad));
    if (bad) fattn_ctx_free(bad);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("portable engine forced on %s (sm_%d%d): fattn_ctx_engine \"%s\"\n", prop.name, prop.major, prop.minor,
           fattn_ctx_engine(ctx));
    TU_CHECK(strstr(fattn_ctx_engine(ctx), "cuda portable") != NULL, "fattn_ctx_engine: %s", fattn_ctx_engine(ctx));

    tu_rng rng;
    tu_rng_init(&rng, (uint64_t)tu_seed());
    const fattn_dtype B = FATTN_DTYPE_BF16, H = FATTN_DTYPE_F16;
    const pcase cases[] = {
        /* batch sq sk hq hkv d causal dtype layout */
        {1, 1, 1, 1, 1, 64, 0, B, PACKED},
        {1, 1, 1, 1, 1, 256, 1, H, PAD_BSHD},
        {2, 17, 17, 4, 2, 64, 1, H, PAD_BSHD},
        {2, 17, 17, 2, 2, 128, 0, B, PAD_BHSD},
        {1, 17, 1000, 2, 1, 128, 1, B, PAD_BHSD}, /* causal, sq < sk */
        {1, 1000, 17, 2, 1, 128, 1, H, PACKED},   /* causal, sq > sk: rows that see no key */
        {2, 129, 17, 2, 2, 64, 1, B, PAD_BSHD},
        {2, 100, 64, 2, 2, 256, 1, B, PAD_BHSD},
        {1, 1000, 1000, 2, 2, 64, 1, B, PACKED},
        {2, 1000, 1000, 4, 1, 256, 1, B, PAD_BSHD},
        {1, 1000, 1000, 2, 2, 128, 0, H, PAD_BSHD},
        {3, 129, 257, 8, 2, 128, 0, B, PAD_BSHD}, /* GQA 4:1 */
        {2, 300, 300, 6, 3, 64, 1, H, PACKED},
        {2, 200, 200, 8, 1, 256, 0, H, PACKED},   /* MQA */
        {1, 1, 4097, 8, 1, 256, 1, H, PAD_BSHD},  /* one query row, a long cache */
        {1, 4097, 4097, 1, 1, 128, 1, H, PACKED},
        {1, 4097, 1000, 2, 2, 64, 0, B, PAD_BHSD},
        {1, 1000, 4097, 2, 1, 256, 0, H, PACKED},
        {1, 4097, 4097, 1, 1, 64, 1, B, PAD_BSHD},
        {1, 2000, 4097, 2, 1, 128, 1, B, PACKED},
        /* head dim 96: rows of 96 elements in 64-byte swizzle groups (padded views: loads stop at 96 columns) */
        {1, 17, 17, 2, 1, 96, 1, B, PAD_BSHD},
        {2, 257, 1000, 4, 2, 96, 1, H, PACKED},
        {1, 1000, 300, 2, 2, 96, 0, B, PAD_BHSD},
        {1, 4097, 4097, 1, 1, 96, 1, H, PAD_BSHD},
        /* head dim 192: the portable engine's only (no Hopper kernel) */
        {1, 17, 17, 2, 1, 192, 1, B, PAD_BSHD},
        {2, 257, 1000, 4, 2, 192, 1, H, PACKED},
        {1, 1000, 300, 2, 2, 192, 0, B, PAD_BHSD},
        {1, 4097, 4097, 1, 1, 192, 1, B, PACKED},
    };
    const int small = getenv("FATTN_TEST_SMALL") != NULL;
    for (const auto &c : cases) {
        if (small && (long)c.sq * c.sk > 300 * 300) continue;
        run_case(ctx, &rng, c);
    }
    refusals(ctx);
    fattn_ctx_free(ctx);
    return tu_finish("gpu portable fwd");
}
