/* test_kvcache_prefill.cu - varlen queries on a KV cache (chunked prefill):
 * fattn_fwd with cu_seqlens_q alone, keys in a dense cache [batch,
 * capacity, heads_kv, d] or a paged pool through block_table, each
 * sequence's used keys in seqused_k, on the Hopper varlen kernels'
 * KVCACHE instances (fwd_sm90_varlen.cu), against the FP64 oracle on each
 * sequence's used keys in order.
 *
 * Ragged query chunks (empty, 1, 17, not multiples of a tile), caches longer
 * than their chunk (the chunk is the last queries: causal is bottom-right
 * aligned on the used keys), GQA, head dims 64/96/128/192/256, bf16 and f16,
 * the pages shuffled in the pool and shared pages past the used keys, a
 * window with softcap (the LOCAL instances).  Page sizes: 16, 64, 256 and
 * 48 (TMA boxes of 16 rows, a page not a power of two), 8 and 24 (boxes of
 * 8 rows: one swizzle atom), and 1, 2, 3, 4, 5 and 12, whose gcd with the
 * key block is below 8 rows: the producer warpgroup's cp.async gather
 * (fwd_gather.cuh).  Unused cache rows hold finite noise (fattn.h: they
 * must be finite); two cases put page numbers outside the pool past the
 * used keys (TMA reads them as zeros, the gather never reads them).
 * Inputs N(0,1) from a fixed seed (FATTN_TEST_SEED overrides); O and LSE
 * poisoned with NaN bytes; tolerances: gpu_check_fwd (gpu_testutil.h), the
 * dense forward's.  Also FlashAttention-3's seqused_q, cache_batch_idx and
 * cache_leftpad on a dense cache (rows past seqused_q keep their poison).
 * Fixed-length calls (no cu_seqlens_q) that the decoding kernel does not
 * take run the same kernels (fwd_kvcache_fixed.cu): their LSE layout too.
 * An FP8 cache (e4m3 k and v beside 16-bit q, fattn.h): scales per (page or
 * sequence, kv head) and per (token, kv head), amax / 448; the oracle sees
 * what the kernel stages, code x scale rounded to q's dtype (fattn.h).
 * Exit 77 without a Hopper GPU (FATTN_REQUIRE_GPU=1: a failure);
 * FATTN_TEST_SMALL=1: the small cases only (compute-sanitizer). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "common/oracle.h"
#include "gpu/gpu_testutil.h"
#include "fattn.h"

struct kcase {
    std::vector<int> lq, used; /* per sequence: new queries, used cache keys (>= lq) */
    int capacity;              /* seqlen_k: keys a sequence may hold */
    int page;                  /* 0: a dense cache; else page_size */
    int hq, hkv, d, causal;
    fattn_dtype dt;
    int window = 0, wl = 0, wr = 0;
    float softcap = 0.f;
    int wild_pages = 0; /* table entries past the used keys outside the pool */
    int kv8 = 0;        /* an FP8 cache: 1 scales per page (dense: sequence) and kv head, 2 per token */
    int fixed = 0;      /* a fixed-length call (every lq equal, no cu_seqlens_q; LSE [batch, heads, seqlen_q]) */
};

/* KV8: the stored cache x (entries of `rows` rows [rows, hk, d]) as e4m3
 * codes with float32 scales amax / 448 (floored at FLT_MIN) per (entry, kv
 * head) or per (entry, kv head, row): fattn_tensor's layout; x becomes what
 * the kernel stages, f32(code) x scale rounded to f32, then to dt */
struct kv8_store {
    std::vector<uint8_t> codes;
    std::vector<float> scales;
    int scale_block;
};
static kv8_store kv8_quantise(std::vector<double> &x, int entries, int rows, int hk, int d, int per_token,
                              fattn_dtype dt) {
    kv8_store st;
    const int nb = per_token ? rows : 1;
    st.scale_block = per_token ? 1 : rows;
    st.codes.resize(x.size());
    st.scales.assign((size_t)entries * hk * nb, 0.f);
    for (int e = 0; e < entries; ++e)
        for (int h = 0; h < hk; ++h)
            for (int b = 0; b < nb; ++b) {
                const int r0 = per_token ? b : 0, r1 = per_token ? b + 1 : rows;
                double amax = 0;
                for (int r = r0; r < r1; ++r)
                    for (int i = 0; i < d; ++i) amax = std::max(amax, fabs(x[(((size_t)e * rows + r) * hk + h) * d + i]));
                const float sc = std::max((float)(amax / 448.0), 1.17549435e-38f);
                st.scales[((size_t)e * hk + h) * nb + b] = sc;
                for (int r = r0; r < r1; ++r)
                    for (int i = 0; i < d; ++i) {
                        const size_t at = (((size_t)e * rows + r) * hk + h) * d + i;
                        const uint8_t code = fattn_f32_to_e4m3((float)x[at] / sc);
                        st.codes[at] = code;
                        x[at] = (double)(fattn_e4m3_to_f32(code) * sc);
                    }
            }
    tu_round_to(x.data(), x.size(), dt);
    return st;
}
/* KV8: a tensor's codes and scales on the device in place of its data (its
 * strides, in elements, stay); freed by kv8_free */
static void kv8_upload(const kv8_store &st, fattn_tensor *t) {
    void *dc;
    float *ds;
    CK(cudaMalloc(&dc, st.codes.size()));
    CK(cudaMalloc(&ds, st.scales.size() * 4));
    CK(cudaMemcpy(dc, st.codes.data(), st.codes.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(ds, st.scales.data(), st.scales.size() * 4, cudaMemcpyHostToDevice));
    t->data = dc, t->dtype = FATTN_DTYPE_E4M3, t->scale = ds, t->scale_block = st.scale_block;
}
static void kv8_free(fattn_tensor *t) { cudaFree(t->data), cudaFree(t->scale); }

static void run_case(fattn_ctx *ctx, tu_rng *rng, const kcase &c) {
    const int B = (int)c.lq.size(), HQ = c.hq, HK = c.hkv, D = c.d, CAP = c.capacity;
    std::vector<int32_t> cq, cused;
    int maxq, dummy;
    gpu_varlen_offsets(c.lq, c.used, cq, cused, maxq, dummy);
    const int TQ = cq[B];
    const size_t row = (size_t)HK * D, nq = (size_t)TQ * HQ * D, nlse = (size_t)HQ * TQ;
    /* the logical keys of each sequence (capacity rows, used or not) */
    std::vector<double> q(nq), kl((size_t)B * CAP * row), vl((size_t)B * CAP * row);
    tu_fill_normal(rng, q.data(), nq);
    tu_fill_normal(rng, kl.data(), kl.size());
    tu_fill_normal(rng, vl.data(), vl.size());
    tu_round_to(q.data(), nq, c.dt);
    tu_round_to(kl.data(), kl.size(), c.dt);
    tu_round_to(vl.data(), vl.size(), c.dt);
    /* the cache: dense [B, CAP] rows, or pages of a pool in shuffled order */
    const int max_pages = c.page ? (CAP + c.page - 1) / c.page : 0;
    const int num_pages = c.page ? B * max_pages + 3 : 0; /* 3 spare pages of noise */
    const size_t cache_rows = c.page ? (size_t)num_pages * c.page : (size_t)B * CAP;
    std::vector<double> kc(cache_rows * row), vc(cache_rows * row);
    tu_fill_normal(rng, kc.data(), kc.size());
    tu_fill_normal(rng, vc.data(), vc.size());
    tu_round_to(kc.data(), kc.size(), c.dt);
    tu_round_to(vc.data(), vc.size(), c.dt);
    std::vector<int32_t> table;
    if (c.page) {
        std::vector<int32_t> perm(num_pages);
        for (int i = 0; i < num_pages; ++i) perm[i] = i;
        for (int i = num_pages - 1; i > 0; --i) std::swap(perm[i], perm[(int)(tu_rng_uniform(rng) * (i + 1)) % (i + 1)]);
        table.assign((size_t)B * max_pages, 0);
        int next = 0;
        for (int b = 0; b < B; ++b)
            for (int j = 0; j < max_pages; ++j) {
                const bool used = j * c.page < c.used[b];
                int32_t pg = used ? perm[next++] : perm[num_pages - 1 - (j % 3)]; /* shared noise pages */
                if (!used && c.wild_pages) pg = (j % 2) ? -7 : num_pages + 1000;
                table[(size_t)b * max_pages + j] = pg;
                if (!used) continue;
                for (int r = 0; r < c.page && j * c.page + r < CAP; ++r) {
                    const size_t src = ((size_t)b * CAP + j * c.page + r) * row, dst = ((size_t)pg * c.page + r) * row;
                    std::copy(kl.begin() + src, kl.begin() + src + row, kc.begin() + dst);
                    std::copy(vl.begin() + src, vl.begin() + src + row, vc.begin() + dst);
                }
            }
    } else {
        for (int b = 0; b < B; ++b)
            for (int j = 0; j < c.used[b]; ++j) {
                const size_t at = ((size_t)b * CAP + j) * row;
                std::copy(kl.begin() + at, kl.begin() + at + row, kc.begin() + at);
                std::copy(vl.begin() + at, vl.begin() + at + row, vc.begin() + at);
            }
    }
    kv8_store k8, v8;
    if (c.kv8) { /* the stored cache becomes e4m3; the oracle's keys what the kernel stages */
        const int entries = c.page ? num_pages : B, rows = c.page ? c.page : CAP;
        k8 = kv8_quantise(kc, entries, rows, HK, D, c.kv8 == 2, c.dt);
        v8 = kv8_quantise(vc, entries, rows, HK, D, c.kv8 == 2, c.dt);
        for (int b = 0; b < B; ++b)
            for (int j = 0; j < c.used[b]; ++j) {
                const size_t at = ((size_t)b * CAP + j) * row;
                const size_t src = c.page ? ((size_t)table[(size_t)b * max_pages + j / c.page] * c.page + j % c.page) * row : at;
                std::copy(kc.begin() + src, kc.begin() + src + row, kl.begin() + at);
                std::copy(vc.begin() + src, vc.begin() + src + row, vl.begin() + at);
            }
    }
    std::vector<uint16_t> h16(std::max(nq, kc.size()));
    void *dq, *dk, *dv, *dout;
    float *dlse;
    int32_t *dcq, *dused, *dtable = NULL;
    CK(cudaMalloc(&dq, nq * 2));
    CK(cudaMalloc(&dk, kc.size() * 2));
    CK(cudaMalloc(&dv, vc.size() * 2));
    CK(cudaMalloc(&dout, nq * 2));
    CK(cudaMalloc(&dlse, nlse * 4));
    CK(cudaMalloc(&dcq, (B + 1) * 4));
    CK(cudaMalloc(&dused, B * 4));
    tu_to_dtype(q.data(), nq, c.dt, h16.data());
    CK(cudaMemcpy(dq, h16.data(), nq * 2, cudaMemcpyHostToDevice));
    tu_to_dtype(kc.data(), kc.size(), c.dt, h16.data());
    CK(cudaMemcpy(dk, h16.data(), kc.size() * 2, cudaMemcpyHostToDevice));
    tu_to_dtype(vc.data(), vc.size(), c.dt, h16.data());
    CK(cudaMemcpy(dv, h16.data(), vc.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dcq, cq.data(), (B + 1) * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dused, c.used.data(), B * 4, cudaMemcpyHostToDevice));
    if (c.page) {
        CK(cudaMalloc(&dtable, table.size() * 4));
        CK(cudaMemcpy(dtable, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
    }
    CK(cudaMemset(dout, 0xFF, nq * 2));
    CK(cudaMemset(dlse, 0xFF, nlse * 4));
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = tu_problem(B, maxq, CAP, HQ, HK, D, 0, c.causal, c.fixed ? NULL : dcq, NULL);
    if (!c.fixed) a.p.total_q = TQ;
    a.p.window = c.window, a.p.window_left = c.wl, a.p.window_right = c.wr, a.p.softcap = c.softcap;
    a.q = fattn_tensor_bshd(dq, c.dt), a.k = fattn_tensor_bshd(dk, c.dt), a.v = fattn_tensor_bshd(dv, c.dt);
    a.o = fattn_tensor_bshd(dout, c.dt);
    a.lse = dlse;
    a.seqused_k = dused;
    if (c.page) {
        a.block_table = dtable, a.page_size = c.page, a.num_pages = num_pages, a.max_pages_per_seq = max_pages;
        /* a pool of pages: batch = page (fattn.h) */
        a.k.stride_batch = a.v.stride_batch = (int64_t)c.page * row;
    } else {
        a.k.stride_batch = a.v.stride_batch = (int64_t)CAP * row;
    }
    a.k.stride_seq = a.v.stride_seq = (int64_t)row, a.k.stride_head = a.v.stride_head = D;
    if (c.kv8) kv8_upload(k8, &a.k), kv8_upload(v8, &a.v); /* codes and scales; the strides stay (elements) */
    char what[240];
    snprintf(what, sizeof what, "%s kv-cache prefill%s b%d (q %d tokens, max %d; cap %d, %s %d) h%d/%d d%d%s%s%s%s",
             fattn_dtype_name(c.dt), c.fixed ? " (fixed-length)" : "", B, TQ, maxq, CAP, c.page ? "page" : "dense",
             c.page, HQ, HK, D,
             c.causal ? " causal" : "", c.window ? " window" : "", c.wild_pages ? " wild pages" : "",
             c.kv8 == 1 ? " e4m3 cache (scale per page)" : c.kv8 == 2 ? " e4m3 cache (scale per token)" : "");
    const fattn_status st = fattn_fwd(ctx, &a);
    TU_CHECK(st == FATTN_OK, "%s: %s: %s", what, fattn_status_string(st), fattn_last_error(ctx));
    const cudaError_t e = cudaDeviceSynchronize();
    TU_CHECK(e == cudaSuccess, "%s: kernel failed: %s", what, cudaGetErrorString(e));
    if (e != cudaSuccess) exit(1);
    std::vector<double> got(nq), ref(nq), ref_lse(nlse);
    CK(cudaMemcpy(h16.data(), dout, nq * 2, cudaMemcpyDeviceToHost));
    tu_from_dtype(h16.data(), nq, c.dt, got.data());
    std::vector<float> glse(nlse);
    CK(cudaMemcpy(glse.data(), dlse, nlse * 4, cudaMemcpyDeviceToHost));
    if (c.fixed) { /* [B, HQ, sq] to the oracle's [HQ, TQ] */
        const std::vector<float> f = glse;
        for (int b = 0; b < B; ++b)
            for (int h = 0; h < HQ; ++h)
                for (int i = 0; i < maxq; ++i) glse[(size_t)h * TQ + b * maxq + i] = f[((size_t)b * HQ + h) * maxq + i];
    }
    /* the oracle: each sequence's used keys, packed */
    std::vector<double> kp, vp;
    for (int b = 0; b < B; ++b) {
        const size_t at = (size_t)b * CAP * row;
        kp.insert(kp.end(), kl.begin() + at, kl.begin() + at + (size_t)c.used[b] * row);
        vp.insert(vp.end(), vl.begin() + at, vl.begin() + at + (size_t)c.used[b] * row);
    }
    oracle_problem op;
    memset(&op, 0, sizeof op);
    op.batch = B, op.seqlen_q = maxq, op.seqlen_k = CAP, op.heads_q = HQ, op.heads_kv = HK, op.head_dim = D;
    op.head_dim_v = D, op.causal = c.causal, op.cu_seqlens_q = cq.data(), op.cu_seqlens_k = cused.data();
    op.window = c.window, op.window_left = c.wl, op.window_right = c.wr, op.softcap = c.softcap;
    oracle_fwd(&op, q.data(), kp.data(), vp.data(), ref.data(), ref_lse.data());
    gpu_check_fwd(what, c.dt, got.data(), ref.data(), nq, D, glse.data(), ref_lse.data(), nlse,
                  c.softcap > 0 ? c.softcap * ldexp(1.0, -11) : 0.0);
    if (c.kv8) kv8_free(&a.k), kv8_free(&a.v);
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dlse), cudaFree(dcq), cudaFree(dused);
    if (dtable) cudaFree(dtable);
}

/* FlashAttention-3's serving fields on a dense cache: seqused_q (sequence b
 * computes its first qused[b] queries; the rest of o and lse keep their
 * poison), cache_batch_idx (sequence b reads entry idx[b] of a cache of
 * cache_batch entries) and cache_leftpad (its keys are rows pad[b] ..
 * used[b] - 1), against the oracle on exactly those queries and keys.
 * page > 0 (no idx): the same cache as pages of a shuffled pool, the left
 * pad counted through the block table (the gather path). */
struct scase {
    std::vector<int> lq, used, qused, idx, pad; /* qused, idx, pad empty: off */
    int capacity, cache_batch, hq, hkv, d, causal;
    fattn_dtype dt;
    int page = 0;
    int kv8 = 0; /* as kcase's */
};

static void run_serving_case(fattn_ctx *ctx, tu_rng *rng, const scase &c) {
    const int B = (int)c.lq.size(), HQ = c.hq, HK = c.hkv, D = c.d, CAP = c.capacity;
    const int CB = c.idx.empty() ? B : c.cache_batch;
    std::vector<int32_t> cq;
    int maxq, dummy;
    std::vector<int32_t> cu_used;
    gpu_varlen_offsets(c.lq, c.used, cq, cu_used, maxq, dummy);
    const int TQ = cq[B];
    const size_t row = (size_t)HK * D, nq = (size_t)TQ * HQ * D, nlse = (size_t)HQ * TQ, nc = (size_t)CB * CAP * row;
    std::vector<double> q(nq), kc(nc), vc(nc);
    tu_fill_normal(rng, q.data(), nq);
    tu_fill_normal(rng, kc.data(), nc);
    tu_fill_normal(rng, vc.data(), nc);
    tu_round_to(q.data(), nq, c.dt);
    tu_round_to(kc.data(), nc, c.dt);
    tu_round_to(vc.data(), nc, c.dt);
    std::vector<uint16_t> h16(std::max(nq, nc));
    void *dq, *dk, *dv, *dout;
    float *dlse;
    int32_t *dcq, *dused, *dqused = NULL, *didx = NULL, *dpad = NULL;
    CK(cudaMalloc(&dq, nq * 2));
    CK(cudaMalloc(&dk, nc * 2));
    CK(cudaMalloc(&dv, nc * 2));
    CK(cudaMalloc(&dout, nq * 2));
    CK(cudaMalloc(&dlse, nlse * 4));
    CK(cudaMalloc(&dcq, (B + 1) * 4));
    CK(cudaMalloc(&dused, B * 4));
    tu_to_dtype(q.data(), nq, c.dt, h16.data());
    CK(cudaMemcpy(dq, h16.data(), nq * 2, cudaMemcpyHostToDevice));
    /* paged: entry b's rows j * page .. as pool page table[b][j], pages shuffled */
    const int npp = c.page ? CAP / c.page : 0;
    std::vector<int32_t> table((size_t)CB * npp);
    std::vector<double> kpool, vpool;
    int32_t *dtable = NULL;
    if (c.page) {
        TU_CHECK(c.idx.empty() && CAP % c.page == 0, "serving case: pages need no idx and whole pages");
        std::vector<int32_t> perm((size_t)CB * npp);
        for (size_t i = 0; i < perm.size(); ++i) perm[i] = (int32_t)i;
        for (size_t i = perm.size() - 1; i > 0; --i) std::swap(perm[i], perm[(size_t)(tu_rng_uniform(rng) * (i + 1)) % (i + 1)]);
        kpool.assign(nc, 0.0), vpool.assign(nc, 0.0);
        for (int b = 0; b < CB; ++b)
            for (int j = 0; j < npp; ++j) {
                const int32_t pg = perm[(size_t)b * npp + j];
                table[(size_t)b * npp + j] = pg;
                const size_t src = ((size_t)b * CAP + (size_t)j * c.page) * row, dst = (size_t)pg * c.page * row;
                std::copy(kc.begin() + src, kc.begin() + src + c.page * row, kpool.begin() + dst);
                std::copy(vc.begin() + src, vc.begin() + src + c.page * row, vpool.begin() + dst);
            }
        CK(cudaMalloc(&dtable, table.size() * 4));
        CK(cudaMemcpy(dtable, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
    }
    kv8_store k8, v8;
    if (c.kv8) { /* the stored cache becomes e4m3; the oracle's keys what the kernel stages */
        std::vector<double> &ks = c.page ? kpool : kc, &vs = c.page ? vpool : vc;
        const int entries = c.page ? CB * npp : CB, rows = c.page ? c.page : CAP;
        k8 = kv8_quantise(ks, entries, rows, HK, D, c.kv8 == 2, c.dt);
        v8 = kv8_quantise(vs, entries, rows, HK, D, c.kv8 == 2, c.dt);
        if (c.page)
            for (int b = 0; b < CB; ++b)
                for (int j = 0; j < npp; ++j) {
                    const size_t dst = ((size_t)b * CAP + (size_t)j * c.page) * row;
                    const size_t src = (size_t)table[(size_t)b * npp + j] * c.page * row;
                    std::copy(kpool.begin() + src, kpool.begin() + src + c.page * row, kc.begin() + dst);
                    std::copy(vpool.begin() + src, vpool.begin() + src + c.page * row, vc.begin() + dst);
                }
    }
    tu_to_dtype((c.page ? kpool : kc).data(), nc, c.dt, h16.data());
    CK(cudaMemcpy(dk, h16.data(), nc * 2, cudaMemcpyHostToDevice));
    tu_to_dtype((c.page ? vpool : vc).data(), nc, c.dt, h16.data());
    CK(cudaMemcpy(dv, h16.data(), nc * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dcq, cq.data(), (B + 1) * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dused, c.used.data(), B * 4, cudaMemcpyHostToDevice));
    auto upload = [&](const std::vector<int> &h, int32_t **d) {
        if (h.empty()) return;
        CK(cudaMalloc(d, B * 4));
        CK(cudaMemcpy(*d, h.data(), B * 4, cudaMemcpyHostToDevice));
    };
    upload(c.qused, &dqused);
    upload(c.idx, &didx);
    upload(c.pad, &dpad);
    CK(cudaMemset(dout, 0xFF, nq * 2));
    CK(cudaMemset(dlse, 0xFF, nlse * 4));
    fattn_fwd_args a;
    memset(&a, 0, sizeof a);
    a.p = tu_problem(B, maxq, CAP, HQ, HK, D, 0, c.causal, dcq, NULL);
    a.p.total_q = TQ;
    a.q = fattn_tensor_bshd(dq, c.dt), a.k = fattn_tensor_bshd(dk, c.dt), a.v = fattn_tensor_bshd(dv, c.dt);
    a.o = fattn_tensor_bshd(dout, c.dt);
    a.lse = dlse;
    a.seqused_k = dused, a.seqused_q = dqused, a.cache_batch_idx = didx, a.cache_leftpad = dpad;
    if (didx) a.cache_batch = CB;
    if (c.page) { /* a pool of pages: batch = page (fattn.h) */
        a.block_table = dtable, a.page_size = c.page, a.num_pages = CB * npp, a.max_pages_per_seq = npp;
        a.k.stride_batch = a.v.stride_batch = (int64_t)c.page * row;
        a.k.stride_seq = a.v.stride_seq = (int64_t)row, a.k.stride_head = a.v.stride_head = D;
    }
    if (c.kv8) kv8_upload(k8, &a.k), kv8_upload(v8, &a.v); /* codes and scales; the strides stay (elements) */
    char what[240];
    snprintf(what, sizeof what, "%s kv-cache serving b%d (q %d tokens) cap %d, entries %d h%d/%d d%d%s%s%s%s%s%s",
             fattn_dtype_name(c.dt), B, TQ, CAP, CB, HQ, HK, D, c.causal ? " causal" : "", dqused ? " seqused_q" : "",
             didx ? " cache_batch_idx" : "", dpad ? " cache_leftpad" : "", c.page ? " paged" : "",
             c.kv8 ? " e4m3 cache" : "");
    const fattn_status st = fattn_fwd(ctx, &a);
    TU_CHECK(st == FATTN_OK, "%s: %s: %s", what, fattn_status_string(st), fattn_last_error(ctx));
    const cudaError_t e = cudaDeviceSynchronize();
    TU_CHECK(e == cudaSuccess, "%s: kernel failed: %s", what, cudaGetErrorString(e));
    if (e != cudaSuccess) exit(1);
    std::vector<uint16_t> out16(nq);
    std::vector<float> glse(nlse);
    CK(cudaMemcpy(out16.data(), dout, nq * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(glse.data(), dlse, nlse * 4, cudaMemcpyDeviceToHost));
    /* the oracle's problem: each sequence's computed queries and its keys, packed */
    std::vector<int32_t> oq(B + 1, 0), ok(B + 1, 0);
    std::vector<double> q2, k2, v2;
    size_t untouched_bad = 0;
    for (int b = 0; b < B; ++b) {
        const int ql = c.qused.empty() ? c.lq[b] : std::max(0, std::min(c.qused[b], c.lq[b]));
        const int ent = c.idx.empty() ? b : c.idx[b], end = std::min(c.used[b], CAP);
        const int lp = c.pad.empty() ? 0 : std::max(0, std::min(c.pad[b], end));
        oq[b + 1] = oq[b] + ql, ok[b + 1] = ok[b] + (end - lp);
        q2.insert(q2.end(), q.begin() + (size_t)cq[b] * HQ * D, q.begin() + ((size_t)cq[b] + ql) * HQ * D);
        const size_t at = ((size_t)ent * CAP + lp) * row;
        k2.insert(k2.end(), kc.begin() + at, kc.begin() + at + (size_t)(end - lp) * row);
        v2.insert(v2.end(), vc.begin() + at, vc.begin() + at + (size_t)(end - lp) * row);
        for (int i = ql; i < c.lq[b]; ++i) { /* rows past seqused_q: o and lse as they were */
            for (size_t x = 0; x < (size_t)HQ * D; ++x) untouched_bad += out16[((size_t)cq[b] + i) * HQ * D + x] != 0xFFFF;
            for (int h = 0; h < HQ; ++h) untouched_bad += !isnan(glse[(size_t)h * TQ + cq[b] + i]);
        }
    }
    TU_CHECK(untouched_bad == 0, "%s: %zu entries past seqused_q were written", what, untouched_bad);
    const int TQ2 = oq[B];
    std::vector<double> got((size_t)TQ2 * HQ * D), ref(got.size()), ref_lse((size_t)HQ * TQ2);
    std::vector<float> glse2((size_t)HQ * TQ2);
    for (int b = 0; b < B; ++b)
        for (int i = 0; i < oq[b + 1] - oq[b]; ++i) {
            tu_from_dtype(out16.data() + ((size_t)cq[b] + i) * HQ * D, (size_t)HQ * D, c.dt,
                          got.data() + ((size_t)oq[b] + i) * HQ * D);
            for (int h = 0; h < HQ; ++h) glse2[(size_t)h * TQ2 + oq[b] + i] = glse[(size_t)h * TQ + cq[b] + i];
        }
    oracle_problem op;
    memset(&op, 0, sizeof op);
    op.batch = B, op.seqlen_q = maxq, op.seqlen_k = CAP, op.heads_q = HQ, op.heads_kv = HK, op.head_dim = D;
    op.head_dim_v = D, op.causal = c.causal, op.cu_seqlens_q = oq.data(), op.cu_seqlens_k = ok.data();
    oracle_fwd(&op, q2.data(), k2.data(), v2.data(), ref.data(), ref_lse.data());
    gpu_check_fwd(what, c.dt, got.data(), ref.data(), got.size(), D, glse2.data(), ref_lse.data(), glse2.size());
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dout), cudaFree(dlse), cudaFree(dcq), cudaFree(dused);
    if (c.kv8) kv8_free(&a.k), kv8_free(&a.v);
    if (dqused) cudaFree(dqused);
    if (didx) cudaFree(didx);
    if (dpad) cudaFree(dpad);
    if (dtable) cudaFree(dtable);
}

int main(void) {
    fattn_ctx *ctx = gpu_ctx_or_skip();
    tu_rng rng;
    tu_rng_init(&rng, (uint64_t)tu_seed());
    const int small = getenv("FATTN_TEST_SMALL") != NULL;
    const fattn_dtype BF = FATTN_DTYPE_BF16, F16 = FATTN_DTYPE_F16;
    std::vector<kcase> cases;
    /* small: every head dim, dense and paged (TMA boxes of 16 and 64 rows, of
     * 8, and the gather of single rows), both masks */
    for (int d : {64, 128, 256})
        for (int page : {0, 16, 64, 8, 1})
            for (int causal : {0, 1}) {
                kcase c;
                c.lq = {1, 17, 0, 40}, c.used = {30, 17, 5, 200}, c.capacity = 256, c.page = page;
                c.hq = 4, c.hkv = 2, c.d = d, c.causal = causal, c.dt = (d == 128 && causal) ? F16 : BF;
                cases.push_back(c);
            }
    /* more page sizes (gathered: 2, 3, 4, 5, 12; TMA: 24 in boxes of 8, 48
     * in boxes of 16), GQA 4:1 and 1:1, head dims 96 and 192 (whole 64-column
     * slabs whose last columns are zeros, three slabs a row), tails of 1
     * and 17 keys and a sequence of 1000 */
    const struct {
        int page, d, causal, hq, hkv;
    } more[] = {{3, 128, 1, 8, 2}, {4, 64, 0, 4, 4},  {2, 256, 1, 4, 1},  {5, 96, 1, 4, 2},   {12, 192, 0, 4, 2},
                {4, 128, 0, 8, 2}, {24, 128, 1, 8, 2}, {24, 256, 0, 4, 2}, {48, 256, 1, 4, 1}, {48, 96, 0, 2, 2},
                {3, 192, 1, 4, 4}};
    for (const auto &m : more) {
        kcase c;
        c.lq = {1, 17, 300, 0, 7}, c.used = {1, 1017, 1000, 9, 30}, c.capacity = 1024, c.page = m.page;
        c.hq = m.hq, c.hkv = m.hkv, c.d = m.d, c.causal = m.causal, c.dt = m.page % 2 ? F16 : BF;
        cases.push_back(c);
    }
    { /* a window with softcap (LOCAL), paged */
        kcase c;
        c.lq = {33, 100}, c.used = {150, 100}, c.capacity = 160, c.page = 16;
        c.hq = 8, c.hkv = 2, c.d = 128, c.causal = 1, c.dt = BF, c.window = 1, c.wl = 40, c.wr = 0, c.softcap = 20.f;
        cases.push_back(c);
    }
    { /* a window with softcap (LOCAL), gathered */
        kcase c;
        c.lq = {33, 100}, c.used = {150, 100}, c.capacity = 160, c.page = 4;
        c.hq = 8, c.hkv = 2, c.d = 128, c.causal = 1, c.dt = BF, c.window = 1, c.wl = 40, c.wr = 0, c.softcap = 20.f;
        cases.push_back(c);
    }
    for (int page : {16, 1}) { /* page numbers outside the pool past the used keys */
        kcase c;
        c.lq = {5, 64}, c.used = {20, 64}, c.capacity = 256, c.page = page, c.wild_pages = 1;
        c.hq = 2, c.hkv = 2, c.d = 64, c.causal = 1, c.dt = BF;
        cases.push_back(c);
    }
    /* an FP8 cache: every head dim, dense and paged (the gather takes every
     * page size), scales per page and per token, both masks, GQA, bf16 and
     * f16, and the variants (LOCAL) */
    for (int d : {64, 128, 256})
        for (int page : {0, 16, 1, 5})
            for (int kv8 : {1, 2}) {
                kcase c;
                c.lq = {1, 17, 0, 40}, c.used = {30, 17, 5, 200}, c.capacity = 256, c.page = page;
                c.hq = 8, c.hkv = 2, c.d = d, c.causal = (page + kv8) % 2, c.dt = page == 1 ? F16 : BF;
                c.kv8 = kv8;
                cases.push_back(c);
            }
    {
        kcase c;
        c.lq = {33, 100}, c.used = {150, 100}, c.capacity = 160, c.page = 16, c.kv8 = 2;
        c.hq = 8, c.hkv = 2, c.d = 128, c.causal = 1, c.dt = BF, c.window = 1, c.wl = 40, c.wr = 0, c.softcap = 20.f;
        cases.push_back(c);
    }
    /* fixed-length calls the decoding kernel does not take: more rows, a
     * page size not 2^k >= 8, batch 1 (the LSE in place), an FP8 cache */
    const struct {
        int b, sq, page, kv8, d, causal;
    } fx[] = {{3, 40, 16, 0, 128, 1}, {2, 3, 5, 0, 64, 0}, {1, 70, 0, 0, 256, 1}, {3, 20, 0, 2, 128, 1},
              {2, 33, 4, 1, 64, 0}, {2, 24, 0, 0, 96, 1}};
    for (const auto &f : fx) {
        kcase c;
        c.lq.assign(f.b, f.sq), c.used.assign(f.b, 0), c.capacity = 320, c.page = f.page, c.fixed = 1;
        for (int b = 0; b < f.b; ++b) c.used[b] = f.sq + 37 * b + (b == 2 ? 200 : 0);
        c.hq = 8, c.hkv = 2, c.d = f.d, c.causal = f.causal, c.dt = f.page == 5 ? F16 : BF, c.kv8 = f.kv8;
        cases.push_back(c);
    }
    if (!small) {
        for (int page : {0, 64}) { /* a long chunk at an offset, FP8 */
            kcase c;
            c.lq = {600, 1, 333, 97}, c.used = {2000, 1500, 333, 4097}, c.capacity = 4224;
            c.page = page, c.hq = 8, c.hkv = 2, c.d = 128, c.causal = 1, c.dt = BF, c.kv8 = page ? 2 : 1;
            cases.push_back(c);
        }
        /* a chunk of a long prompt after its earlier chunks, and short ones beside it (the single-threaded
         * oracle's cost keeps these to one mask per head dim and page size: ~3e9 score entries in all) */
        for (int d : {64, 128, 256})
            for (int page : {0, 16, 256}) {
                kcase c;
                c.lq = {600, 1, 333, 97}, c.used = {2000, 1500, 333, 4097}, c.capacity = 4224;
                c.page = page, c.hq = 4, c.hkv = 2, c.d = d, c.causal = page != 16, c.dt = d == 64 ? F16 : BF;
                cases.push_back(c);
            }
        /* the gather on the same long sequences: single rows, and pages of 3 */
        for (int page : {1, 3}) {
            kcase c;
            c.lq = {600, 1, 333, 97}, c.used = {2000, 1500, 333, 4097}, c.capacity = 4224;
            c.page = page, c.hq = 4, c.hkv = 2, c.d = 128, c.causal = page == 1, c.dt = BF;
            cases.push_back(c);
        }
    }
    for (const kcase &c : cases) run_case(ctx, &rng, c);
    /* the serving fields: each alone, then all three, both masks */
    for (int causal : {0, 1}) {
        const scase base{{9, 0, 40, 17}, {30, 5, 200, 17}, {}, {}, {}, 256, 0, 4, 2, 128, causal, FATTN_DTYPE_BF16};
        scase s1 = base, s2 = base, s3 = base, s4 = base;
        s1.qused = {4, 0, 40, -3};                     /* fewer, none, all, negative (none) */
        s2.idx = {5, 0, 5, 2}, s2.cache_batch = 6;     /* repeated entries, others unused */
        s3.pad = {3, 5, 0, 16};                        /* sequence 1: all its keys padded */
        s4.qused = {9, 0, 33, 1}, s4.idx = {1, 3, 2, 0}, s4.cache_batch = 4, s4.pad = {29, 0, 100, 2};
        /* the left pad through a block table: pages of 16 (TMA could take them, the pad
         * sends them to the gather) and of 4, with seqused_q */
        scase s5 = s3, s6 = s3;
        s5.page = 16, s6.page = 4, s6.qused = {9, 0, 17, 1}, s6.pad = {29, 0, 100, 2};
        /* on an FP8 cache: all three on a dense one, the left pad on pages */
        scase s7 = s4, s8 = s6;
        s7.kv8 = 1 + causal, s8.kv8 = 2 - causal;
        for (const scase *sc : {&s1, &s2, &s3, &s4, &s5, &s6, &s7, &s8}) run_serving_case(ctx, &rng, *sc);
    }
    fattn_ctx_free(ctx);
    return tu_finish("gpu kv-cache prefill");
}
