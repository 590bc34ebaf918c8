/* bwd_mainloop.cuh - the backward's consumer warpgroups at head dims 64 and
 * 128 (bwd_consumer; the tiling in bwd_sm90.cuh) and the tile operations
 * the head-dim-256 form (bwd_mainloop_split_d.cuh) shares with it: the
 * S^T / dP^T GEMM issue, P^T from S^T, dS^T into shared memory, a dQ tile
 * into its staging buffer. */
#pragma once
#include <climits>
#include <type_traits>
#include "../../common/wgmma_gen.cuh"
#include "../../common/wgmma_tnsp.cuh"
#include "bwd_epilogue.cuh"
#include "bwd_scheduler.cuh"

/* A consumer's S^T = K_w Q^T (or, dp, dP^T = V_w dO^T) for the iteration in
 * stage s (issue only: one commit group); k-steps up to the larger of the
 * call's head dims (BwdCfg::HD, HDV: the columns past them are zeros), the
 * same count for both, since at d256 dp differs between the consumers and a
 * divergent count serialised the wgmmas (ptxas C7520). */
template <class C>
__device__ __forceinline__ void bwd_issue_sdp(const BwdSmem<C> &sm, uint64_t desc_kv, int s, bool dp, float (&acc)[32]) {
    using WS = wgmma_op<64, C::BF16>; /* m64 (keys) n64 (queries) */
    constexpr int D = C::D, BN = C::BN, BM = C::BM;
    const uint64_t desc_b = smem_desc_sw128(dp ? sm.dout(s) : sm.q(s), 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
        if (16 * kk < (C::HD > C::HDV ? C::HD : C::HDV))
            WS::ss(acc, desc_add(desc_kv, (kk / 4) * BN * 128 + (kk % 4) * 32),
                   desc_add(desc_b, (kk / 4) * BM * 128 + (kk % 4) * 32), kk > 0);
    wgmma_commit();
}

/* How bwd_p_group masks: per element under the tile's run-time need_mask
 * (the plain kernels), or known for the whole tile (LOCAL, bwd_p_tile) */
enum BwdMask { BWD_MASK_RUNTIME, BWD_MASK_NONE, BWD_MASK_ALL };

/* P^T in place for 8-column group i of a consumer's S^T accumulator: element
 * 4 i + e is key key_r + 8 (e / 2), query query_c + 8 i + e % 2; P^T =
 * exp2(S^T scale log2 e - LSE log2 e), 0 where the causal mask hides the key
 * and (VARLEN) for a key past the sequence's (the next sequence's rows).
 * CAP: LOCAL's softcap first. */
template <class C, bool CAP, BwdMask MASK>
__device__ __forceinline__ void bwd_p_group(float (&acc)[32], int i, float2 l, const BwdParams &p, bool need_mask,
                                            int key_r, int query_c) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        float sc = acc[4 * i + e];
        if constexpr (CAP) { /* softcap, as the forward's fwd_softcap */
            float t;
            asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(sc * p.cap_b));
            sc = p.cap_a * t;
        }
        float x = exp2f(fmaf(sc, p.scale_log2, -((e & 1) ? l.y : l.x)));
        if (MASK == BWD_MASK_ALL || (MASK == BWD_MASK_RUNTIME && need_mask)) {
            const int key = key_r + 8 * (e >> 1), q = query_c + 8 * i + (e & 1);
            if constexpr (C::LOCAL) {
                /* key - q against the window's sides as selects, no branches
                 * (hopper_window_of bounds the sides: no overflow) */
                const int hi = p.win_right >= 0 ? p.causal_offset + p.win_right : INT_MAX;
                const int lo = p.win_left >= 0 ? p.causal_offset - p.win_left : INT_MIN;
                const int kq = key - q;
                x = (kq > hi) | (kq < lo) | (C::VARLEN && key >= p.seqlen_k) ? 0.f : x;
            } else if ((C::CAUSAL && key > q + p.causal_offset) || (C::VARLEN && key >= p.seqlen_k)) {
                x = 0.f;
            }
        }
        acc[4 * i + e] = x;
    }
}

template <bool V> using bwd_bool = std::integral_constant<bool, V>;
template <BwdMask V> using bwd_mask = std::integral_constant<BwdMask, V>;

/* f(cap, mask) for one sub-tile, with bwd_p_group's CAP and MASK as types.
 * LOCAL: the softcap and the mask chosen once for the tile, since tested per
 * element they became branches (BSSY/BRA) around every exponential, which
 * cost the LOCAL kernels ~1.35-1.4x the plain ones per tile (perf-notes
 * "Variants: first measurement") */
template <class C, class F>
__device__ __forceinline__ void bwd_p_tile(const BwdParams &p, bool need_mask, F &&f) {
    if constexpr (C::LOCAL) {
        if (p.cap_b != 0.f) {
            if (need_mask) f(bwd_bool<true>{}, bwd_mask<BWD_MASK_ALL>{});
            else f(bwd_bool<true>{}, bwd_mask<BWD_MASK_NONE>{});
        } else {
            if (need_mask) f(bwd_bool<false>{}, bwd_mask<BWD_MASK_ALL>{});
            else f(bwd_bool<false>{}, bwd_mask<BWD_MASK_NONE>{});
        }
    } else {
        f(bwd_bool<false>{}, bwd_mask<BWD_MASK_RUNTIME>{});
    }
}

/* Whether the 64 x 64 sub-tile of keys key0 .. key0 + 63 and queries q0 ..
 * q0 + 63 has an element the mask hides (causal, LOCAL's window) or a key
 * past the sequence (VARLEN). */
template <class C>
__device__ __forceinline__ bool bwd_need_mask(const BwdParams &p, int key0, int q0) {
    bool m = (C::CAUSAL && key0 + 63 > q0 + p.causal_offset) || (C::VARLEN && key0 + 64 > p.seqlen_k);
    if (C::LOCAL)
        m = m || (p.win_right >= 0 && key0 + 63 > q0 + p.causal_offset + p.win_right) ||
            (p.win_left >= 0 && key0 < q0 + 63 + p.causal_offset - p.win_left);
    return m;
}

/* Group i (elements 4 i .. 4 i + 3) of a 32-float accumulator. */
__device__ __forceinline__ float4 bwd_group4(const float (&a)[32], int i) {
    return make_float4(a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3]);
}

/* dS^T = P^T (dP^T - D) for 8-column group i, in place in dp (element 4 i +
 * e: query column e % 2 of the pair, d the pair's D; pg the group's four P^T
 * values); LOCAL with softcap
 * times the cap's derivative 1 - tanh^2, tanh recovered from P and the LSE
 * (l, log2 units): cap tanh = (log2 P + l) / (scale log2 e); P = 0 (masked,
 * or too small to matter) gives 0. */
template <class C, bool CAP>
__device__ __forceinline__ void bwd_ds_group(float (&dp)[32], float4 pg, int i, float2 d, const BwdParams &p,
                                             float2 l) {
    const float pv[4] = {pg.x, pg.y, pg.z, pg.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const float P = pv[e];
        float ds = P * (dp[4 * i + e] - ((e & 1) ? d.y : d.x));
        if constexpr (CAP) {
            const float t = (__log2f(P) + ((e & 1) ? l.y : l.x)) * p.cap_t;
            ds = P > 0.f ? ds * (1.f - t * t) : 0.f;
        }
        dp[4 * i + e] = ds;
    }
}

/* A 32-float accumulator (P^T or dS^T) as the 16-bit A fragments of an RS
 * wgmma, k step ks: the pairs (acc[8 ks + 2 j], + 1), j = 0..3 (the
 * accumulator and A layouts coincide) */
template <class C>
__device__ __forceinline__ void bwd_pack_frag(const float (&acc)[32], uint32_t (&f)[4][4]) {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
#pragma unroll
        for (int j = 0; j < 4; ++j)
            f[ks][j] = C::BF16 ? pack_bf16x2(acc[8 * ks + 2 * j], acc[8 * ks + 2 * j + 1])
                               : pack_f16x2(acc[8 * ks + 2 * j], acc[8 * ks + 2 * j + 1]);
}

/* dS^T (16-bit, fragment pairs) into shared memory: row = key (row0 + ...),
 * 128 bytes of 64 queries, 128-byte swizzle; df[ks][j] holds queries 8 (2 ks
 * + j / 2) + 2 q4, + 1 of key 16 wq + lane / 4 + 8 (j % 2), which is matrix j
 * of a stmatrix (lanes 8 j .. 8 j + 7 address its rows) */
__device__ __forceinline__ void bwd_store_ds(uint8_t *dsb, int row0, int wq, int lane, const uint32_t (&df)[4][4]) {
    const int mat = lane / 8, row = row0 + 16 * wq + lane % 8 + 8 * (mat & 1);
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
        stsm_x4(smem_u32(dsb) + row * 128 + (((2 * ks + (mat >> 1)) ^ (row & 7)) << 4), df[ks][0], df[ks][1], df[ks][2],
                df[ks][3]);
}

/* N columns of a warp's dQ accumulator (rows r0, r0 + 8, columns 2 q4, + 1
 * of each 8-column group) at their bwd_dq_index places from dqb */
template <int N>
__device__ __forceinline__ void bwd_put_dq(float4 *dqb, int lane, const float (&dq)[N / 2]) {
#pragma unroll
    for (int i = 0; i < N / 8; ++i)
        st_shared_f32x4(dqb + i * 32 + lane, make_float4(dq[4 * i], dq[4 * i + 1], dq[4 * i + 2], dq[4 * i + 3]));
}

/* A consumer warpgroup at head dim 64 or 128: keys 64 cw .. 64 cw + 63 of
 * the block (the tiling and the issue order in bwd_sm90.cuh). */
template <class C>
__device__ __forceinline__ void bwd_consumer(const BwdSmem<C> &sm, const BwdParams &p, const BwdIter<C> &iter, int n,
                                             int hk, int b, const BwdSeq &sq) {
    constexpr int D = C::D, BN = C::BN, BM = C::BM, STAGES = C::STAGES, DQ_N = C::DQ_N;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int cw = threadIdx.x / 128 - 1, wq = warp % 4;
    const int r0 = 16 * wq + lane / 4, q4 = lane % 4;
    const int T = iter.total;
    constexpr int DN = C::DKV_N; /* dK's and dV's columns: D, or the call's head dim (BwdOpts.hd) */
    using WD = wgmma_op<DN, C::BF16>; /* dV, dK: m64 nDN, B MN-major */
    using WS = wgmma_op<64, C::BF16>; /* S^T, dP^T with K_w, V_w in registers (KREG) */
    using WQ = wgmma_tnsp<DQ_N, C::BF16>; /* dQ: A and B MN-major */
    using WT = wgmma_tnsp<DN, C::BF16>;   /* DKSS: dK with A from shared memory, B MN-major */
    float dv[DN / 2], dk[DN / 2];
#pragma unroll
    for (int i = 0; i < DN / 2; ++i) dv[i] = dk[i] = 0.f;
    if (T > 0) mbar_wait(sm.full_kv, 0);
    const uint64_t desc_k = smem_desc_sw128(sm.k() + cw * 64 * 128, 16, 1024);
    const uint64_t desc_v = smem_desc_sw128(sm.v() + cw * 64 * 128, 16, 1024);
    /* KREG: the A fragments of K_w and V_w, k step kk: matrices (rows 0-7,
     * columns 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) of the warp's 16 keys */
    uint32_t kf[C::KREG ? 4 : 1][4], vf[C::KREG ? 4 : 1][4];
    if constexpr (C::KREG) {
        const int row = cw * 64 + 16 * wq + lane % 8 + 8 * ((lane / 8) & 1);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            const uint32_t off = row * 128 + (((2 * kk + lane / 16) ^ (row & 7)) << 4);
            ldsm_x4(kf[kk], smem_u32(sm.k()) + off);
            ldsm_x4(vf[kk], smem_u32(sm.v()) + off);
        }
    }
    auto issue_sdp = [&](int s, bool dp, float(&acc)[32]) {
        if constexpr (C::KREG) {
            const uint64_t desc_b = smem_desc_sw128(dp ? sm.dout(s) : sm.q(s), 16, 1024);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) WS::rsk(acc, dp ? vf[kk] : kf[kk], desc_add(desc_b, kk * 32), kk > 0);
            wgmma_commit();
        } else {
            bwd_issue_sdp<C>(sm, dp ? desc_v : desc_k, s, dp, acc);
        }
    };
    /* columns DQ_N cw .. of dQ = dS K over all BN keys: A = dS (K rows =
     * keys, 128 bytes of queries: both consumers' halves), B = K's columns
     * DQ_N cw .. (slab cw at d128, half of the one slab at d64) */
    auto issue_dq = [&](const uint8_t *dsb, float(&dq)[DQ_N / 2]) {
        const uint64_t da = smem_desc_sw128(dsb, 16, 1024);
        const uint64_t db = smem_desc_sw128(sm.k() + (D >= 128 ? cw * BN * 128 : cw * DQ_N * 2), 16, 1024);
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) WQ::ss_tab(dq, desc_add(da, kk * 2048), desc_add(db, kk * 2048), kk > 0);
        wgmma_commit();
    };
    /* iteration q's dQ to the writer's buffer: part cw of the tile */
    auto stage_dq = [&](int q, const float(&dq)[DQ_N / 2]) {
        const int dqs = q % C::DQ_STAGES;
        named_bar_sync(C::BAR_DQ_EMPTY + dqs, 288);
        bwd_put_dq<DQ_N>((float4 *)sm.dq(dqs) + (cw * 4 + wq) * (DQ_N / 8) * 32, lane, dq);
        fence_async_shared(); /* read by the bulk reduce (the async proxy) */
        named_bar_arrive(C::BAR_DQ_FULL + dqs, 288);
    };
    const int key0 = n * BN + cw * 64; /* this warpgroup's first key */
    float st[32], dpt[32];
    auto step = [&](int it) {
        int h, m;
        iter.decode(it, hk, p, h, m);
        (void)h;
        const int s = it % STAGES;
        mbar_wait<C::SLEEP>(&sm.full_qdo[s], (it / STAGES) & 1);
        issue_sdp(s, false, st);
        issue_sdp(s, true, dpt);
        const float *lse = sm.lse(s), *dsum = sm.dsum(s);
        float2 l2[8], d2[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) l2[i] = ld_shared_f32x2(lse + 8 * i + 2 * q4);
        wgmma_wait<1>();
        reg_fence(st);
        /* P^T: element 4 i + e is key r0 + 8 (e / 2), query 8 i + 2 q4 + e % 2 */
        const bool need_mask = bwd_need_mask<C>(p, key0, m * BM);
        bwd_p_tile<C>(p, need_mask, [&](auto cap, auto mask) {
#pragma unroll
            for (int i = 0; i < 8; ++i)
                bwd_p_group<C, decltype(cap)::value, decltype(mask)::value>(st, i, l2[i], p, need_mask, key0 + r0, m * BM + 2 * q4);
        });
        uint32_t pf[4][4], df[4][4];
        bwd_pack_frag<C>(st, pf);
        /* dV += P^T dO, dK += dS^T Q (B MN-major: rows of queries, k16 step 16 rows) */
        const uint64_t desc_dot = smem_desc_sw128(sm.dout(s), BM * 128, 1024);
        const uint64_t desc_qt = smem_desc_sw128(sm.q(s), BM * 128, 1024);
        /* dV under the dS^T below: its issue needs every exponential, so the
         * dP^T wait cannot rise above them */
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) WD::rs(dv, pf[ks], desc_add(desc_dot, ks * 2048), 1);
        wgmma_commit();
#pragma unroll
        for (int i = 0; i < 8; ++i) d2[i] = ld_shared_f32x2(dsum + 8 * i + 2 * q4);
        wgmma_wait<1>(); /* dP^T; dV may run */
        reg_fence(dpt);
        if (C::LOCAL && p.cap_b != 0.f) {
#pragma unroll
            for (int i = 0; i < 8; ++i)
                bwd_ds_group<C, true>(dpt, bwd_group4(st, i), i, d2[i], p, ld_shared_f32x2(lse + 8 * i + 2 * q4));
        } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) bwd_ds_group<C, false>(dpt, bwd_group4(st, i), i, d2[i], p, float2{0.f, 0.f});
        }
        bwd_pack_frag<C>(dpt, df);
        uint8_t *dsb = sm.ds(it % C::DS_BUFS);
        bwd_store_ds(dsb, cw * 64, wq, lane, df);
        fence_async_shared(); /* read by wgmma (the async proxy) */
        /* both consumers' dS^T stored; dQ, then dK; dQ's hand-over while dK runs */
        named_bar_sync(C::BAR_DS, 256);
        float dq[DQ_N / 2];
        wgmma_fence();
        issue_dq(dsb, dq);
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
            if constexpr (C::DKSS) /* A = this consumer's rows of the dS^T tile (K-major) */
                WT::ss_tb(dk, desc_add(smem_desc_sw128(dsb + cw * 64 * 128, 16, 1024), ks * 32),
                          desc_add(desc_qt, ks * 2048), 1);
            else
                WD::rs(dk, df[ks], desc_add(desc_qt, ks * 2048), 1);
        }
        wgmma_commit();
        wgmma_wait<1>(); /* dV, dQ */
        reg_fence(dq);
        stage_dq(it, dq);
        wgmma_wait<0>(); /* dK */
        reg_fence(dv);
        reg_fence(dk);
        /* the A fragments stay live until their GEMMs are done, so that ptxas
         * does not reuse their registers and wait early */
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
            reg_fence(pf[ks]);
            if constexpr (!C::DKSS) reg_fence(df[ks]);
        }
        /* Q and dO of this stage are read by nobody now; the LSE and D reads
         * (generic proxy) are ordered before the producer's next bulk copies
         * into the stage (async proxy) */
        fence_async_shared();
        __syncwarp();
        if (lane == 0) mbar_arrive(&sm.empty_qdo[s]);
    };
    for (int it = 0; it < T; ++it) step(it);
    bwd_store_dkdv<C, DN>(p, sq, b, hk, key0 + r0, 0, q4, dk, dv);
}
