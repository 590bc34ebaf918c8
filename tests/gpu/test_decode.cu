/* test_decode.cu - the CUDA decoding path (src/cuda/hopper/decode/fwd_decode.cu:
 * seqlen_q <= 16 with the GQA group packed into one tile, split keys,
 * seqused_k, paged K/V) against the FP64 oracle.
 *
 * Random N(0,1) inputs from a fixed seed (FATTN_TEST_SEED overrides), O and
 * LSE poisoned with NaN bytes before each call; the oracle runs per sequence
 * on the exact 16-bit values and on the keys the sequence uses.  Keys a
 * sequence does not use (past seqused_k, and the rows of a partly used page)
 * hold NaN in the cache, and the block table's entries for pages a sequence
 * does not use hold out-of-range indices: neither may reach O.  Tolerances:
 * gpu_check_fwd (gpu_testutil.h), the same as the dense forward's, which
 * this kernel meets with fp32 accumulation, P rounded to 16 bits and the
 * splits merged by fattn_merge's arithmetic (src/cuda/common/lse_combine.cuh:
 * weights in double, O summed in fp32; splits whose LSE is -inf not read;
 * a sink one more part with O = 0).  Splits left empty by seqused_k (every
 * split of a sequence of length 0, all but the first at length 1) and a
 * combine over two tiles of 32 splits are among the cases; NaN partials
 * (a NaN LSE in one split, NaN in one split's O, every split NaN) are
 * test_fwd_nan.cu's, whose decoding cases with 4097 and 700 keys split.
 * The variants (issue 37: the decoding kernel's LOCAL instances): a sliding
 * window (relative to each sequence's used keys), softcap (bounds widened
 * by cap x 2^-11, gpu_check_fwd's extra) and learnable sinks, with split
 * keys, seqused_k and paged caches.  Exit 77
 * without a Hopper GPU (FATTN_REQUIRE_GPU=1: a failure).
 * An FP8 KV cache (fattn.h 0.5: e4m3 k and v, the KV8 instances): the
 * same cases with the keys quantised on the host (scales per token, per
 * page or sequence, blocks of 8, K and V apart), NaN codes and NaN scales
 * where no sequence looks, and the oracle on the dequantised values
 * (code x scale, exact in double), so gpu_check_fwd's 16-bit tolerances
 * hold: the kernel's own rounding is at most the 16-bit path's (codes
 * exact in f16, K's scale on the f32 scores, V's on P before its rounding
 * to f16).
 * FATTN_TEST_SMALL=1: the small cases only (compute-sanitizer). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "common/oracle.h"
#include "gpu/gpu_testutil.h"
#include "fattn.h"

struct dcase {
    int batch, sq, sk, hq, hkv, d, causal;
    fattn_dtype dt;
    int page;     /* 0: contiguous K/V; else the page size of a shuffled pool */
    int used;     /* 1: seqused_k, random per sequence (0 and 1 among them) */
    int no_split; /* FATTN_OPTION_DISABLE_SPLIT */
    /* the variants (zero: none): window (wl, wr), softcap, and a learnable
     * sink of sink_base + h / 4 for query head h when has_sink */
    int window, wl, wr;
    double softcap;
    int has_sink;
    double sink_base;
    /* an FP8 KV cache (fattn.h 0.5): 0 none; the scale_block of K and V:
     * 1 per token, 2 per page (contiguous: per sequence), 3 K per token and
     * V per page, 4 blocks of 8 rows; 5 and 6 per token with magnitudes
     * (bf16 only: O reaches 2^40): q times 2^17 (softmax_scale times
     * 2^-17; past f16's range), and V's 64-key blocks times 1, 2^40, 2^-40
     * in turn (5) or all times 2^-60 (6), scales from 2^-68 to 2^32 */
    int kv8;
};

/* scale_block of K (i = 0) or V (1) for the mode: `unit` rows a page or sequence */
static int kv8_block(int mode, int i, int unit) {
    switch (mode) {
    case 1: return 1;
    case 2: return unit;
    case 3: return i == 0 ? 1 : unit;
    case 5: case 6: return 1;
    default: return 8;
    }
}

/* The FP8 cache of one tensor: codes where the 16-bit cache has its rows
 * (0x7F, NaN, elsewhere), scales max(amax / 448, 2^-126) of each block's used
 * rows (NaN for blocks nobody uses), and x replaced by what the cache holds
 * (code x scale, exact in double), for the oracle. */
static void kv8_quantise(std::vector<double> &x, const std::vector<int32_t> &used, const std::vector<int32_t> &table,
                         int B, int SK, int HK, int D, int page, int maxp, int entries, int sb,
                         std::vector<uint8_t> &codes, std::vector<float> &scales) {
    const int rows = page ? page : SK, nb = (rows + sb - 1) / sb;
    const size_t row = (size_t)HK * D;
    codes.assign((size_t)entries * rows * row, 0x7F);
    scales.assign((size_t)entries * HK * nb, NAN);
    std::vector<float> amax(scales.size(), 0.f);
    auto where = [&](int b, int j, int &e, int &r) {
        e = page ? table[(size_t)b * maxp + j / page] : b;
        r = page ? j % page : j;
    };
    for (int pass = 0; pass < 3; ++pass)
        for (int b = 0; b < B; ++b)
            for (int j = 0; j < used[b]; ++j) {
                int e, r;
                where(b, j, e, r);
                for (int h = 0; h < HK; ++h) {
                    const size_t si = ((size_t)e * HK + h) * nb + r / sb;
                    double *xs = &x[((size_t)b * SK + j) * row + (size_t)h * D];
                    uint8_t *cs = &codes[((size_t)e * rows + r) * row + (size_t)h * D];
                    for (int i = 0; i < D; ++i) {
                        const float f = (float)xs[i];
                        if (pass == 0) amax[si] = fmaxf(amax[si], fabsf(f));
                        if (pass == 1 && i == 0) scales[si] = amax[si] > 0.f ? fmaxf(amax[si] / 448.f, 0x1p-126f) : 1.f;
                        if (pass == 2) {
                            cs[i] = fattn_f32_to_e4m3(f / scales[si]);
                            xs[i] = (double)fattn_e4m3_to_f32(cs[i]) * scales[si];
                        }
                    }
                }
            }
}

/* the pool or cache of codes and scales on the device, as k or v */
static void kv8_upload(fattn_tensor *t, const std::vector<uint8_t> &codes, const std::vector<float> &scales, int sb,
                       std::vector<void *> &frees) {
    void *dc, *ds;
    CK(cudaMalloc(&dc, codes.size()));
    CK(cudaMalloc(&ds, scales.size() * 4));
    CK(cudaMemcpy(dc, codes.data(), codes.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ds, scales.data(), scales.size() * 4, cudaMemcpyHostToDevice));
    t->data = dc, t->dtype = FATTN_DTYPE_E4M3, t->scale = (float *)ds, t->scale_block = sb;
    frees.push_back(dc), frees.push_back(ds);
}

static uint16_t nan16(fattn_dtype dt) { return dt == FATTN_DTYPE_BF16 ? 0x7FC0 : 0x7E00; }

static void run_case(fattn_ctx *ctx, tu_rng *rng, const dcase &c) {
    const int B = c.batch, SQ = c.sq, SK = c.sk, HQ = c.hq, HK = c.hkv, D = c.d;
    const size_t nq = (size_t)B * SQ * HQ * D, nkv = (size_t)B * SK * HK * D;
    std::vector<double> q(nq), k(nkv), v(nkv);
    tu_fill_normal(rng, q.data(), nq);
    tu_fill_normal(rng, k.data(), nkv);
    tu_fill_normal(rng, v.data(), nkv);
    const bool mags = c.kv8 >= 5; /* kv8_block's modes 5 and 6: powers of two, exact */
    if (mags) {
        for (double &x : q) x = ldexp(x, 17);
        for (size_t i = 0; i < nkv; ++i) {
            const int j = (int)(i / ((size_t)HK * D) % (size_t)SK);
            v[i] = ldexp(v[i], c.kv8 == 6 ? -60 : (j / 64) % 3 == 1 ? 40 : (j / 64) % 3 == 2 ? -40 : 0);
        }
    }
    tu_round_to(q.data(), nq, c.dt);
    tu_round_to(k.data(), nkv, c.dt);
    tu_round_to(v.data(), nkv, c.dt);
    std::vector<int32_t> used(B, SK);
    if (c.used)
        for (int b = 0; b < B; ++b)
            used[b] = b == 0 ? 0 : b == 1 ? 1 : b == B - 1 ? SK : (int)(tu_rng_u64(rng) % (uint64_t)(SK + 1));
    /* K/V in the cache's layout, NaN wherever a sequence does not look */
    std::vector<uint16_t> hq16(nq);
    tu_to_dtype(q.data(), nq, c.dt, hq16.data());
    const size_t row = (size_t)HK * D; /* elements per key */
    int npages = 0, maxp = 0;
    std::vector<int32_t> table;
    std::vector<uint16_t> hk16, hv16;
    std::vector<uint16_t> krow(row), vrow(row);
    if (c.page) {
        maxp = (SK + c.page - 1) / c.page + 1; /* one spare column, never read */
        const int need = B * (maxp - 1);
        npages = need + 3; /* and pages nobody uses */
        std::vector<int> perm(npages);
        for (int i = 0; i < npages; ++i) perm[i] = i;
        for (int i = npages - 1; i > 0; --i) std::swap(perm[i], perm[tu_rng_u64(rng) % (uint64_t)(i + 1)]);
        table.assign((size_t)B * maxp, 0);
        hk16.assign((size_t)npages * c.page * row, nan16(c.dt));
        hv16.assign(hk16.size(), nan16(c.dt));
        int next = 0;
        for (int b = 0; b < B; ++b)
            for (int i = 0; i < maxp; ++i) {
                const bool in_use = i * c.page < used[b];
                /* pages a sequence does not use: out of range, both ways */
                table[(size_t)b * maxp + i] = i < maxp - 1 ? perm[next++] : 0;
                if (!in_use) table[(size_t)b * maxp + i] = (i % 2) ? -5 : npages + 1000;
            }
        for (int b = 0; b < B; ++b)
            for (int j = 0; j < used[b]; ++j) {
                const int pg = table[(size_t)b * maxp + j / c.page];
                tu_to_dtype(&k[((size_t)b * SK + j) * row], row, c.dt, krow.data());
                tu_to_dtype(&v[((size_t)b * SK + j) * row], row, c.dt, vrow.data());
                memcpy(&hk16[((size_t)pg * c.page + j % c.page) * row], krow.data(), row * 2);
                memcpy(&hv16[((size_t)pg * c.page + j % c.page) * row], vrow.data(), row * 2);
            }
    } else {
        hk16.assign(nkv, nan16(c.dt));
        hv16.assign(nkv, nan16(c.dt));
        for (int b = 0; b < B; ++b)
            for (int j = 0; j < used[b]; ++j) {
                tu_to_dtype(&k[((size_t)b * SK + j) * row], row, c.dt, &hk16[((size_t)b * SK + j) * row]);
                tu_to_dtype(&v[((size_t)b * SK + j) * row], row, c.dt, &hv16[((size_t)b * SK + j) * row]);
            }
    }
    void *dq, *dk, *dv, *dout;
    float *dlse;
    int32_t *dused = NULL, *dtable = NULL;
    const size_t nlse = (size_t)B * HQ * SQ;
    CK(cudaMalloc(&dq, nq * 2));
    CK(cudaMalloc(&dk, hk16.size() * 2));
    CK(cudaMalloc(&dv, hv16.size() * 2));
    CK(cudaMalloc(&dout, nq * 2));
    CK(cudaMalloc(&dlse, nlse * 4));
    CK(cudaMemcpy(dq, hq16.data(), nq * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dk, hk16.data(), hk16.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dv, hv16.data(), hv16.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemset(dout, 0xFF, nq * 2));
    CK(cudaMemset(dlse, 0xFF, nlse * 4));
    if (c.used) {
        CK(cudaMalloc(&dused, B * 4));
        CK(cudaMemcpy(dused, used.data(), B * 4, cudaMemcpyHostToDevice));
    }
    if (c.page) {
        CK(cudaMalloc(&dtable, table.size() * 4));
        CK(cudaMemcpy(dtable, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
    }
    std::vector<float> sinkf(HQ);
    std::vector<double> sinkd(HQ);
    for (int h = 0; h < HQ; ++h) sinkf[h] = (float)(c.sink_base + h / 4.0), sinkd[h] = sinkf[h];
    float *dsink = NULL;
    if (c.has_sink) {
        CK(cudaMalloc(&dsink, HQ * 4));
        CK(cudaMemcpy(dsink, sinkf.data(), HQ * 4, cudaMemcpyHostToDevice));
    }
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = tu_problem(B, SQ, SK, HQ, HK, D, 0, c.causal, NULL, NULL);
    a.q = fattn_tensor_bshd(dq, c.dt);
    a.k = fattn_tensor_bshd(dk, c.dt);
    a.v = fattn_tensor_bshd(dv, c.dt);
    a.o = fattn_tensor_bshd(dout, c.dt);
    a.lse = dlse;
    a.seqused_k = dused;
    a.p.window = c.window, a.p.window_left = c.wl, a.p.window_right = c.wr;
    a.p.softcap = (float)c.softcap;
    if (mags) a.p.softmax_scale = (float)ldexp(1.0 / sqrt((double)D), -17);
    a.learnable_sink = dsink;
    if (c.page) {
        a.block_table = dtable;
        a.page_size = c.page;
        a.num_pages = npages;
        a.max_pages_per_seq = maxp;
        /* the pool: [num_pages, page, heads_kv, d] */
        for (fattn_tensor *t : {&a.k, &a.v}) {
            t->stride_head = D;
            t->stride_seq = (int64_t)HK * D;
            t->stride_batch = (int64_t)c.page * HK * D;
        }
    }
    std::vector<void *> kv8_frees;
    if (c.kv8) {
        /* the same keys, quantised: the oracle then sees the dequantised values */
        const int unit = c.page ? c.page : SK, entries = c.page ? npages : B;
        const int sbk = kv8_block(c.kv8, 0, unit), sbv = kv8_block(c.kv8, 1, unit);
        std::vector<uint8_t> kc, vc;
        std::vector<float> ks, vs;
        kv8_quantise(k, used, table, B, SK, HK, D, c.page, maxp, entries, sbk, kc, ks);
        kv8_quantise(v, used, table, B, SK, HK, D, c.page, maxp, entries, sbv, vc, vs);
        kv8_upload(&a.k, kc, ks, sbk, kv8_frees);
        kv8_upload(&a.v, vc, vs, sbv, kv8_frees);
    }
    if (c.no_split) TU_EXPECT_OK(fattn_ctx_set_option(ctx, FATTN_OPTION_DISABLE_SPLIT, 1));
    const fattn_status st = fattn_fwd(ctx, &a);
    if (c.no_split) TU_EXPECT_OK(fattn_ctx_set_option(ctx, FATTN_OPTION_DISABLE_SPLIT, 0));
    char what[320];
    snprintf(what, sizeof what, "%s b%d sq%d sk%d h%d/%d d%d%s%s%s%s", fattn_dtype_name(c.dt), B, SQ, SK, HQ, HK, D,
             c.causal ? " causal" : "", c.page ? " paged" : "", c.used ? " seqused_k" : "", c.no_split ? " no-split" : "");
    if (c.kv8) {
        const size_t len = strlen(what);
        snprintf(what + len, sizeof what - len, " e4m3 cache (mode %d)", c.kv8);
    }
    if (c.window || c.softcap != 0 || c.has_sink) {
        const size_t len = strlen(what);
        snprintf(what + len, sizeof what - len, " window %s(%d, %d) softcap %g sink %s%g", c.window ? "" : "off ",
                 c.wl, c.wr, c.softcap, c.has_sink ? "" : "none ", c.has_sink ? c.sink_base : 0.0);
    }
    TU_CHECK(st == FATTN_OK, "%s: fattn_fwd: %s: %s", what, fattn_status_string(st), fattn_last_error(ctx));
    const cudaError_t e = cudaDeviceSynchronize();
    TU_CHECK(e == cudaSuccess, "%s: kernel failed: %s", what, cudaGetErrorString(e));
    if (e != cudaSuccess) exit(1);
    std::vector<uint16_t> go(nq);
    std::vector<float> glse(nlse);
    CK(cudaMemcpy(go.data(), dout, nq * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(glse.data(), dlse, nlse * 4, cudaMemcpyDeviceToHost));
    /* the same call twice more, O poisoned before each, gives the same bits
     * (run s30-4: the split 16-row FP8 tile's O changed from call to call) */
    for (int rep = 0; rep < 2; ++rep) {
        std::vector<uint16_t> again(nq);
        CK(cudaMemset(dout, 0xFF, nq * 2));
        if (c.no_split) TU_EXPECT_OK(fattn_ctx_set_option(ctx, FATTN_OPTION_DISABLE_SPLIT, 1));
        const fattn_status st2 = fattn_fwd(ctx, &a);
        if (c.no_split) TU_EXPECT_OK(fattn_ctx_set_option(ctx, FATTN_OPTION_DISABLE_SPLIT, 0));
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(again.data(), dout, nq * 2, cudaMemcpyDeviceToHost));
        TU_CHECK(st2 == FATTN_OK && again == go, "%s: call %d's O is not the first call's, bit for bit", what, rep + 2);
    }
    std::vector<double> got(nq), ref(nq, 0.0), ref_lse(nlse, -INFINITY);
    tu_from_dtype(go.data(), nq, c.dt, got.data());
    /* the oracle per sequence, on its used keys */
    for (int b = 0; b < B; ++b) {
        if (used[b] == 0) { /* no key: O 0, LSE -inf (with a sink: the sink) */
            if (c.has_sink)
                for (int h = 0; h < HQ; ++h)
                    for (int i = 0; i < SQ; ++i) ref_lse[((size_t)b * HQ + h) * SQ + i] = sinkd[h];
            continue;
        }
        oracle_problem op;
        memset(&op, 0, sizeof op);
        op.batch = 1, op.seqlen_q = SQ, op.seqlen_k = used[b], op.heads_q = HQ, op.heads_kv = HK;
        op.head_dim = D, op.head_dim_v = D, op.causal = c.causal;
        op.window = c.window, op.window_left = c.wl, op.window_right = c.wr;
        op.softcap = c.softcap;
        op.scale = a.p.softmax_scale;
        op.sink = c.has_sink ? sinkd.data() : NULL;
        std::vector<double> kb(k.begin() + (size_t)b * SK * row, k.begin() + ((size_t)b * SK + used[b]) * row);
        std::vector<double> vb(v.begin() + (size_t)b * SK * row, v.begin() + ((size_t)b * SK + used[b]) * row);
        oracle_fwd(&op, &q[(size_t)b * SQ * HQ * D], kb.data(), vb.data(), &ref[(size_t)b * SQ * HQ * D],
                   &ref_lse[(size_t)b * HQ * SQ]);
    }
    gpu_check_fwd(what, c.dt, got.data(), ref.data(), nq, D, glse.data(), ref_lse.data(), nlse, c.softcap * 0x1p-11);
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dlse), cudaFree(dused), cudaFree(dtable);
    if (dsink) cudaFree(dsink);
    for (void *x : kv8_frees) cudaFree(x);
}

/* what the CUDA engine refuses, with O left as it was: a fixed-length call
 * on a KV cache past the decoding kernel's shapes runs as varlen queries on
 * the cache (test_kvcache_prefill.cu), which needs q and o packed along the
 * batch */
static void refusals(fattn_ctx *ctx) {
    const int B = 2, S = 64, H = 4, D = 64;
    void *buf;
    int32_t *dt;
    const size_t n = (size_t)B * S * H * D;
    CK(cudaMalloc(&buf, 5 * n * 2));
    CK(cudaMalloc(&dt, 64));
    CK(cudaMemset(dt, 0, 64));
    uint16_t *q = (uint16_t *)buf, *k = q + 2 * n, *v = k + n, *o = v + n;
    CK(cudaMemset(o, 0x5A, n * 2));
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = tu_problem(B, S, S, H, H, D, 0, 0, NULL, NULL);
    a.q = fattn_tensor_bshd(q, FATTN_DTYPE_BF16), a.k = fattn_tensor_bshd(k, FATTN_DTYPE_BF16);
    a.v = fattn_tensor_bshd(v, FATTN_DTYPE_BF16), a.o = fattn_tensor_bshd(o, FATTN_DTYPE_BF16);
    a.q.stride_seq = H * D, a.q.stride_head = D, a.q.stride_batch = 2 * S * H * D; /* batch entries 2 S rows apart */
    a.seqused_k = dt; /* seqlen_q 64: not a decoding shape */
    fattn_status st = fattn_fwd(ctx, &a);
    TU_CHECK(st == FATTN_ERROR_UNSUPPORTED && strstr(fattn_last_error(ctx), "packed along the batch"),
             "seqused_k at seqlen_q 64, q not packed: %s: %s", fattn_status_string(st), fattn_last_error(ctx));
    a.k.dtype = a.v.dtype = FATTN_DTYPE_E4M3; /* the same on an FP8 cache */
    a.k.scale = a.v.scale = (float *)dt, a.k.scale_block = a.v.scale_block = 1;
    st = fattn_fwd(ctx, &a);
    TU_CHECK(st == FATTN_ERROR_UNSUPPORTED && strstr(fattn_last_error(ctx), "packed along the batch"),
             "FP8 cache at seqlen_q 64, q not packed: %s: %s", fattn_status_string(st), fattn_last_error(ctx));
    a.p.head_dim = a.p.head_dim_v = 96; /* no FP8-cache kernel at head dim 96 */
    a.q = fattn_tensor_bshd(q, FATTN_DTYPE_BF16);
    st = fattn_fwd(ctx, &a);
    TU_CHECK(st == FATTN_ERROR_UNSUPPORTED && strstr(fattn_last_error(ctx), "{64, 128, 256}"),
             "FP8 cache at head dim 96: %s: %s", fattn_status_string(st), fattn_last_error(ctx));
    std::vector<uint16_t> h(n);
    CK(cudaMemcpy(h.data(), o, h.size() * 2, cudaMemcpyDeviceToHost));
    size_t changed = 0;
    for (uint16_t x : h) changed += x != 0x5A5A;
    TU_CHECK(changed == 0, "a refused call wrote %zu elements of O", changed);
    cudaFree(buf), cudaFree(dt);
}

int main(void) {
    fattn_ctx *ctx = gpu_ctx_or_skip();
    tu_rng rng;
    tu_rng_init(&rng, (uint64_t)tu_seed());
    const fattn_dtype BF = FATTN_DTYPE_BF16, F16 = FATTN_DTYPE_F16;
    const dcase cases[] = {
        /* batch sq sk hq hkv d causal dtype page used no_split */
        {2, 1, 1, 8, 2, 128, 0, BF, 0, 0, 0},
        {3, 1, 17, 4, 4, 64, 0, F16, 0, 0, 0},
        {4, 1, 1000, 32, 8, 128, 0, BF, 0, 0, 0},
        {1, 1, 4097, 8, 1, 128, 0, BF, 0, 0, 0},  /* one (batch, kv head): split keys */
        {1, 1, 4097, 8, 1, 128, 0, BF, 0, 0, 1},  /* the same unsplit */
        {1, 1, 20000, 32, 8, 128, 0, BF, 0, 0, 0},
        {2, 4, 1000, 32, 8, 128, 1, BF, 0, 0, 0}, /* 16 rows */
        {2, 16, 777, 8, 2, 128, 1, F16, 0, 0, 0}, /* 64 rows: 4 row blocks */
        {2, 8, 500, 8, 2, 256, 1, BF, 0, 0, 0},   /* 32 rows at d256 */
        {2, 3, 300, 6, 2, 64, 1, BF, 0, 0, 0},    /* 9 rows */
        {1, 1, 131, 16, 16, 256, 0, F16, 0, 0, 0},
        {1, 16, 5, 4, 4, 64, 1, BF, 0, 0, 0},     /* causal, sq > sk: rows that see no key */
        {2, 16, 100, 8, 1, 64, 1, F16, 0, 0, 0},  /* MQA, 128 rows would be too many: dense kernel (8 x 16) */
        {5, 1, 600, 32, 8, 128, 0, BF, 0, 1, 0},  /* seqused_k */
        {3, 4, 300, 8, 2, 64, 1, F16, 0, 1, 0},
        {1, 1, 3000, 4, 4, 256, 0, BF, 0, 1, 0},
        {3, 1, 1000, 32, 8, 128, 0, BF, 16, 1, 0}, /* paged */
        {2, 2, 777, 16, 4, 128, 1, F16, 64, 0, 0},
        {2, 1, 2000, 8, 8, 256, 0, BF, 256, 1, 0},
        {4, 1, 100, 4, 1, 64, 0, BF, 32, 1, 0},
        {3, 4, 5000, 32, 8, 128, 1, BF, 128, 1, 0},
        {3, 1, 1000, 32, 8, 128, 0, BF, 8, 1, 0}, /* pages of 8: boxes of one swizzle atom */
        {2, 4, 300, 8, 2, 64, 1, F16, 8, 1, 0},
        /* 64 splits (two tiles of 32 in the combine); seqused_k 0 (every split
         * empty: LSE -inf), 1 (one live split, 63 empty), random and full */
        {4, 1, 8192, 8, 1, 128, 0, BF, 0, 1, 0},
        /* the variants: batch sq sk hq hkv d causal dtype page used no_split, window wl wr, softcap, sink? base */
        {5, 1, 600, 32, 8, 128, 0, BF, 0, 1, 0, 1, 100, -1, 0, 1, 0},       /* seqused_k, left window, sink */
        {3, 4, 300, 8, 2, 64, 1, F16, 0, 1, 0, 1, 37, 5, 2, 0, 0},          /* causal + window, softcap */
        {3, 1, 1000, 32, 8, 128, 0, BF, 16, 1, 0, 1, 200, 0, 0, 1, -30},    /* paged, sink -30 */
        {1, 1, 20000, 32, 8, 128, 0, BF, 0, 0, 0, 1, 3000, -1, 0, 1, 30},   /* split over the window's blocks */
        {1, 1, 4097, 8, 1, 128, 0, BF, 0, 0, 1, 1, 1000, -1, 0, 1, 0},      /* the same unsplit */
        {2, 16, 777, 8, 2, 128, 1, F16, 0, 0, 0, 1, 64, 16, 2, 1, 0},       /* 64 rows, all three */
        {2, 8, 500, 8, 2, 256, 1, BF, 0, 0, 0, 1, 40, -1, 0, 1, 0},         /* 32 rows at d256 */
        {2, 1, 2000, 8, 8, 256, 0, BF, 256, 1, 0, 1, 500, 500, 2, 1, 0},    /* paged d256, 1 row, softcap */
        {1, 16, 5, 4, 4, 64, 1, BF, 0, 0, 0, 1, 2, -1, 0, 1, 0},            /* rows that see no key: LSE = sink */
        {4, 1, 100, 4, 1, 64, 0, F16, 32, 1, 0, 0, 0, 0, 30, 1, 8},         /* softcap and sink, no window */
        {4, 1, 8192, 8, 1, 128, 0, F16, 0, 1, 0, 0, 0, 0, 0, 1, 2},         /* 64 splits, the sink one more part */
        /* an FP8 KV cache (last field: the scales' mode, kv8_block) */
        {2, 1, 1, 8, 2, 128, 0, BF, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
        {4, 1, 1000, 32, 8, 128, 0, BF, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2},    /* per sequence */
        {1, 1, 20000, 32, 8, 128, 0, F16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},  /* split keys */
        {1, 1, 4097, 8, 1, 128, 0, BF, 0, 0, 1, 0, 0, 0, 0, 0, 0, 3},     /* unsplit */
        {5, 1, 600, 32, 8, 128, 0, BF, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1},     /* seqused_k */
        {3, 4, 300, 8, 2, 64, 1, F16, 0, 1, 0, 0, 0, 0, 0, 0, 0, 4},
        {2, 16, 777, 8, 2, 128, 1, BF, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},     /* 64 rows */
        {2, 8, 500, 8, 2, 128, 1, F16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3},     /* 32 rows */
        {1, 1, 3000, 4, 4, 256, 0, BF, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1},
        {2, 4, 500, 8, 2, 256, 1, F16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2},     /* 16 rows at d256 */
        {3, 1, 1000, 32, 8, 128, 0, BF, 16, 1, 0, 0, 0, 0, 0, 0, 0, 1},   /* paged, per token */
        {3, 1, 1000, 32, 8, 128, 0, BF, 16, 1, 0, 0, 0, 0, 0, 0, 0, 2},   /* paged, per page */
        {2, 2, 777, 16, 4, 128, 1, F16, 64, 0, 0, 0, 0, 0, 0, 0, 0, 3},
        {2, 1, 2000, 8, 8, 256, 0, BF, 256, 1, 0, 0, 0, 0, 0, 0, 0, 2},
        {4, 1, 100, 4, 1, 64, 0, BF, 32, 1, 0, 0, 0, 0, 0, 0, 0, 4},
        {3, 4, 5000, 32, 8, 128, 1, BF, 128, 1, 0, 0, 0, 0, 0, 0, 0, 1},
        {3, 1, 1000, 32, 8, 64, 0, BF, 8, 1, 0, 0, 0, 0, 0, 0, 0, 1},     /* pages of 8 (512-byte boxes), per token */
        {1, 16, 5, 4, 4, 64, 1, BF, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},        /* rows that see no key */
        {3, 1, 1000, 32, 8, 128, 0, BF, 16, 1, 0, 1, 200, 0, 0, 1, -30, 1}, /* paged, window, sink */
        {3, 4, 300, 8, 2, 64, 1, F16, 0, 1, 0, 1, 37, 5, 2, 0, 0, 2},       /* causal + window, softcap */
        {3, 1, 1000, 32, 8, 128, 0, BF, 16, 1, 0, 0, 0, 0, 0, 0, 0, 5},     /* magnitudes: V 1, 2^40, 2^-40 */
        {1, 1, 20000, 32, 8, 128, 0, BF, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5},     /* the same over split keys */
        {2, 4, 777, 8, 2, 64, 1, BF, 0, 0, 0, 0, 0, 0, 0, 0, 0, 6},         /* V all 2^-60 */
        {2, 1, 3000, 8, 8, 256, 0, BF, 256, 1, 0, 0, 0, 0, 0, 0, 0, 5},
        /* <= 8 rows take the swapped tile (fwd_decode_t8.cuh): causal over several queries */
        {2, 2, 500, 8, 2, 64, 1, BF, 0, 1, 0, 0, 0, 0, 0, 0, 0, 6},         /* 8 rows, seqused_k, V 2^-60 */
        {2, 8, 300, 2, 2, 128, 1, F16, 16, 0, 0, 0, 0, 0, 0, 0, 0, 1},      /* group 1, 8 queries, pages of 16 */
        {1, 2, 1500, 8, 2, 256, 1, BF, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4},       /* d256 */
        /* 16 rows over 20000 keys: where the split 16-row tile's O changed between calls (d9) */
        {1, 1, 20000, 128, 8, 128, 0, F16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1},
    };
    const int small = getenv("FATTN_TEST_SMALL") != NULL; /* sanitizer runs: small shapes only */
    for (const auto &c : cases)
        if (!small || (long)c.batch * c.sk * c.hkv <= 20000) run_case(ctx, &rng, c);
    refusals(ctx);
    fattn_ctx_free(ctx);
    return tu_finish("gpu decode");
}
