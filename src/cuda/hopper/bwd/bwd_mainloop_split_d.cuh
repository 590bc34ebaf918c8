/* bwd_mainloop_split_d.cuh - the backward's consumer warpgroups at head dim
 * 256 (BwdCfg::SPLIT_D: the consumers split the head dim of 64 keys, and
 * P^T goes from consumer 0 to consumer 1 through shared memory; the tiling
 * in bwd_sm90.cuh), built from bwd_mainloop.cuh's tile operations and
 * bwd_epilogue.cuh's store. */
#pragma once
#include "bwd_mainloop.cuh"

/* The consumers at head dim 256 (BwdCfg::SPLIT_D; the tiling in
 * bwd_sm90.cuh): consumer cw = 0, 1 owns columns 128 cw .. 128 cw + 127 of dK, dV
 * and dQ for all BN = 64 keys of the block. */
template <class C>
__device__ __forceinline__ void bwd_consumer_split_d(const BwdSmem<C> &sm, const BwdParams &p, const BwdIter<C> &iter,
                                                     int n, int hk, int b, const BwdSeq &sq) {
    constexpr int BN = C::BN, BM = C::BM, STAGES = C::STAGES, DN = C::DKV_N;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int cw = threadIdx.x / 128 - 1, wq = warp % 4, t = threadIdx.x % 128;
    const int r0 = 16 * wq + lane / 4, q4 = lane % 4;
    const int T = iter.total;
    using WD = wgmma_op<DN, C::BF16>;   /* dV: m64 n128, A = P^T from registers, B MN-major */
    using WT = wgmma_tnsp<DN, C::BF16>; /* dK: A K-major, B MN-major (ss_tb); dQ: both MN-major (ss_tab) */
    float dv[DN / 2], dk[DN / 2];
#pragma unroll
    for (int i = 0; i < DN / 2; ++i) dv[i] = dk[i] = 0.f;
    if (T > 0) mbar_wait(sm.full_kv, 0);
    /* S^T = K Q^T (consumer 0) or dP^T = V dO^T (consumer 1), all 64 keys */
    const uint64_t desc_kv = smem_desc_sw128(cw == 0 ? sm.k() : sm.v(), 16, 1024);
    const int key0 = n * BN;
    uint8_t *pt = sm.pt(); /* P^T fp32: float4 i of thread t at (i * 128 + t) * 16 */
    float acc[32];         /* S^T, then P^T (consumer 0); dP^T, then dS^T (consumer 1) */
    for (int it = 0; it < T; ++it) {
        int h, m;
        iter.decode(it, hk, p, h, m);
        (void)h;
        const int s = it % STAGES;
        mbar_wait<C::SLEEP>(&sm.full_qdo[s], (it / STAGES) & 1);
        bwd_issue_sdp<C>(sm, desc_kv, s, cw == 1, acc);
        wgmma_wait<0>();
        reg_fence(acc);
        /* element 4 i + e of acc: key r0 + 8 (e / 2), query 8 i + 2 q4 + e % 2;
         * pf[ks][j]: the P^T pair (acc[8 ks + 2 j], + 1), as at d64/d128 */
        uint32_t pf[4][4];
        uint8_t *dsb = sm.ds(it & 1);
        if (cw == 0) {
            const float *lse = sm.lse(s);
            const bool need_mask = bwd_need_mask<C>(p, key0, m * BM); /* BN = BM = 64 */
            bwd_p_tile<C>(p, need_mask, [&](auto cap, auto mask) {
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    bwd_p_group<C, decltype(cap)::value, decltype(mask)::value>(acc, i, ld_shared_f32x2(lse + 8 * i + 2 * q4), p, need_mask,
                                                          key0 + r0, m * BM + 2 * q4);
                    st_shared_f32x4(pt + (i * 128 + t) * 16,
                                    make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]));
                }
            });
            bwd_pack_frag<C>(acc, pf);
            named_bar_arrive(C::BAR_P, 256); /* P^T written (generic stores, generic loads) */
        } else {
            named_bar_sync(C::BAR_P, 256);
            /* dS^T = P^T (dP^T - D) with consumer 0's fp32 P^T (the same
             * thread's fragment: same warp of the warpgroup, same lane) */
            const float *dsum = sm.dsum(s), *lse = sm.lse(s);
            auto ds_tile = [&](auto cap) {
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const float4 x = ld_shared_f32x4(pt + (i * 128 + t) * 16);
                    const float2 dd = ld_shared_f32x2(dsum + 8 * i + 2 * q4);
                    bwd_ds_group<C, decltype(cap)::value>(
                        acc, x, i, dd, p, decltype(cap)::value ? ld_shared_f32x2(lse + 8 * i + 2 * q4) : float2{0.f, 0.f});
                    /* elements 4 i .. 4 i + 3 = pairs j = 2 (i % 2), + 1 of ks = i / 2 */
                    pf[i / 2][2 * (i % 2)] = C::BF16 ? pack_bf16x2(x.x, x.y) : pack_f16x2(x.x, x.y);
                    pf[i / 2][2 * (i % 2) + 1] = C::BF16 ? pack_bf16x2(x.z, x.w) : pack_f16x2(x.z, x.w);
                }
            };
            if (C::LOCAL && p.cap_b != 0.f) ds_tile(bwd_bool<true>{});
            else ds_tile(bwd_bool<false>{});
        }
        /* dV_w += P^T dO_w: B = dO's slabs 2 cw, 2 cw + 1 (MN-major: rows of
         * queries, 64-column slabs BM * 128 bytes apart), k16 step 16 rows */
        const uint64_t desc_dot = smem_desc_sw128(sm.dout(s) + 2 * cw * BM * 128, BM * 128, 1024);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) WD::rs(dv, pf[ks], desc_add(desc_dot, ks * 2048), 1);
        wgmma_commit();
        if (cw == 1) {
            /* dS^T into shared memory, as at d64/d128 (one consumer's 64 keys) */
            uint32_t df[4][4];
            bwd_pack_frag<C>(acc, df);
            bwd_store_ds(dsb, 0, wq, lane, df);
            fence_async_shared(); /* read by wgmma (the async proxy) */
        }
        /* all 128 threads of consumer 1 have stored (and fenced) dS^T: its own
         * wgmmas below read every row too */
        named_bar_sync(C::BAR_DS, 256);
        /* dK_w += dS^T Q_w: A = dS^T K-major (rows of keys, the query index
         * along the 128-byte row: k16 step +32 bytes), B = Q's slabs 2 cw, + 1 */
        const uint64_t desc_ds = smem_desc_sw128(dsb, 16, 1024);
        const uint64_t desc_qt = smem_desc_sw128(sm.q(s) + 2 * cw * BM * 128, BM * 128, 1024);
        float dq[DN / 2];
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) WT::ss_tb(dk, desc_add(desc_ds, ks * 32), desc_add(desc_qt, ks * 2048), 1);
        /* dQ_w = dS K_w: A = dS^T stored [key][query] (MN-major A: K rows =
         * keys), B = K's slabs 2 cw, 2 cw + 1 (MN-major, BN * 128 bytes apart) */
        const uint64_t db = smem_desc_sw128(sm.k() + 2 * cw * BN * 128, BN * 128, 1024);
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
            WT::ss_tab(dq, desc_add(desc_ds, kk * 2048), desc_add(db, kk * 2048), kk > 0);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(dq);
        reg_fence(dv);
        reg_fence(dk);
        /* the LSE and D reads (generic proxy) before the producer's next bulk
         * copies into the stage (async proxy), after the writer frees it */
        fence_async_shared();
        /* both consumers' GEMMs have read Q(s) and dO(s): the dQ tile may
         * overwrite them */
        named_bar_sync(C::BAR_FREE, 256);
        /* float4 (rows r0, r0 + 8, columns 2 q4, + 1 of each 8-column group)
         * at bwd_dq_index's place (width DQ_N = 128): part cw of the tile */
        float4 *dqb = (float4 *)sm.dq(s) + (cw * 4 + wq) * (DN / 8) * 32;
        bwd_put_dq<DN>(dqb, lane, dq);
        fence_async_shared(); /* read by the bulk reduce (the async proxy) */
        named_bar_arrive(C::BAR_DQ_FULL + s, 288);
    }
    bwd_store_dkdv<C, DN>(p, sq, b, hk, key0 + r0, cw * DN, q4, dk, dv);
}
