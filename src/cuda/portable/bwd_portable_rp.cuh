/* bwd_portable_rp.cuh - the portable backward at d64 / d96 / d128 in FlashAttention-2's
 * shape: one CTA of 8 warps per 128 keys (twice bwd_portable_kernel's), so each
 * Q / dO tile loaded and each dQ tile added serves twice the FLOPs, and P^T,
 * dS^T stay in registers for dV, dK.  Warp w owns keys 16 w .. 16 w + 15 of
 * the block through phases 1 and 2:
 *
 *   1. S^T = K Q^T, dP^T = V dO^T for its 16 keys x the 64 queries of the
 *      iteration; P^T, dS^T by pbwd_softmax; dS^T to shared memory (phase 3
 *      reads it by query).
 *   2. dV += P^T dO, dK += dS^T Q: the fp32 accumulators of phase 1 are,
 *      rounded to 16 bits, the A fragments of these products (the forward's
 *      P reuse), so no barrier stands between the phases; dK, dV of all D
 *      columns a warp, in fp32 registers for the whole CTA.
 *   3. after one barrier: dQ += dS K, warp (16-query group, column half),
 *      added by pbwd_add_dq.
 *
 * The ring, rows, softmax, phase 3 (pbwd_dq) and stores are bwd_portable.cuh's. */
#pragma once
#include "bwd_portable.cuh"

#define PBWD_RP_BN 128

/* K, V; NS x (Q, dO); dS^T; NS x (LSE2, D) */
template <int D, int NS> constexpr int portable_bwd_rp_smem_bytes() {
    return 2 * PBWD_RP_BN * D * 2 + NS * 2 * PBWD_BM * D * 2 + PBWD_RP_BN * PBWD_BM * 2 + NS * 2 * PBWD_BM * 4;
}

template <int D, int NS> struct PbwdRpShape {
    static constexpr int BM = PBWD_BM, BN = PBWD_RP_BN, NW = 8, NT = NW * 32;
    static constexpr int NQ = BM / 8;  /* 8-query n tiles of S^T */
    static constexpr int CW = D / 2;   /* dQ columns a warp (phase 3: 4 query groups x 2 halves) */
    static constexpr int PW = CW;      /* dQ in one piece: at most 32 accumulators */
    static constexpr uint32_t KV_B = BN * D * 2, QT_B = BM * D * 2;
    static constexpr uint32_t O_K = 0, O_V = KV_B, O_Q = 2 * KV_B, O_DO = O_Q + NS * QT_B, O_DS = O_DO + NS * QT_B,
                              O_LSE = O_DS + BN * BM * 2, O_DSUM = O_LSE + NS * BM * 4;
    static_assert(BN == 16 * NW && (D == 64 || D == 96 || D == 128), "tile shape");
};

template <int D, int NS, bool BF16>
__global__ void __launch_bounds__(256, 1) bwd_portable_rp_kernel(const PortableBwdParams p) {
    using namespace portable;
    using S = PbwdRpShape<D, NS>;
    constexpr int BM = S::BM, BN = S::BN, NQ = S::NQ;
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t s0 = smem_u32(smem);
    constexpr uint32_t O_K = S::O_K, O_V = S::O_V, O_DS = S::O_DS;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int n_block = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
    const int n0 = n_block * BN;
    const PbwdRows w = pbwd_rows<BM>(p, b, n0);
    if (n0 >= w.len_k) return;
    const int len_k = w.len_k, off = w.off, T = w.nm * p.group;

    const PbwdLanes lanes = pbwd_lanes(lane);
    const auto [pa_r, pa_y, pb_r, pb_y] = lanes;
    const int mg = warp % 4, cg = warp / 4; /* phase 3 */

    const PbwdRing<D, NS, S> ring{p, w, smem, s0, b, hk, T, tid};
    ring.prologue(n0);

    float dv[D / 8][4], dk[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) dv[j][e] = dk[j][e] = 0.f;

    for (int it = 0; it < T; ++it) {
        const auto [sQ, sDO, lse2, dsum] = ring.next(it);
        const int h = ring.head(it), m = ring.block(it);

        /* 1. S^T, dP^T: this warp's 16 keys x 64 queries */
        float st[NQ][4], dpt[NQ][4];
#pragma unroll
        for (int j = 0; j < NQ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) st[j][e] = dpt[j][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t ka[4], va[4];
            ldsm_x4(ka, ldsm_addr<D>(s0 + O_K, (warp * 16 + pa_r) * D * 2, kk, pa_y));
            ldsm_x4(va, ldsm_addr<D>(s0 + O_V, (warp * 16 + pa_r) * D * 2, kk, pa_y));
#pragma unroll
            for (int nn = 0; nn < BM / 16; ++nn) {
                uint32_t qb[4], ob[4];
                ldsm_x4(qb, ldsm_addr<D>(sQ, (nn * 16 + pb_r) * D * 2, kk, pb_y));
                mma_m16n8k16<BF16>(st[2 * nn], ka, qb[0], qb[1]);
                mma_m16n8k16<BF16>(st[2 * nn + 1], ka, qb[2], qb[3]);
                ldsm_x4(ob, ldsm_addr<D>(sDO, (nn * 16 + pb_r) * D * 2, kk, pb_y));
                mma_m16n8k16<BF16>(dpt[2 * nn], va, ob[0], ob[1]);
                mma_m16n8k16<BF16>(dpt[2 * nn + 1], va, ob[2], ob[3]);
            }
        }
        /* P^T, dS^T as 16-bit A fragments of phase 2 (k = queries: n tile j
         * is half j % 2 of k step j / 2); dS^T also to shared memory */
        const int key_lo = n0 + warp * 16 + g;
        const bool need_mask = n0 + BN > len_k || (p.causal && n0 + BN - 1 > m * BM + off);
        uint32_t pf[BM / 16][4], sf[BM / 16][4];
#pragma unroll
        for (int j = 0; j < NQ; ++j) {
            const int qc = 8 * j + 2 * t;
            const float2 l2 = *reinterpret_cast<const float2 *>(lse2 + qc);
            const float2 d2 = *reinterpret_cast<const float2 *>(dsum + qc);
            pbwd_softmax(st[j], dpt[j], l2, d2, need_mask, key_lo, m * BM + qc, len_k, p.causal, off, p.scale_log2);
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                pf[j / 2][2 * (j % 2) + r] = pack2<BF16>(st[j][2 * r], st[j][2 * r + 1]);
                sf[j / 2][2 * (j % 2) + r] = pack2<BF16>(dpt[j][2 * r], dpt[j][2 * r + 1]);
                *reinterpret_cast<uint32_t *>(smem + O_DS + swz<BM>(warp * 16 + g + 8 * r, qc)) = sf[j / 2][2 * (j % 2) + r];
            }
        }

        /* 2. dV += P^T dO, dK += dS^T Q: this warp's 16 keys x D columns */
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk) {
#pragma unroll
            for (int dn = 0; dn < D / 16; ++dn) {
                uint32_t ob[4], qb[4];
                ldsm_x4_trans(ob, ldsm_addr<D>(sDO, (kk * 16 + pa_r) * D * 2, dn, pa_y));
                mma_m16n8k16<BF16>(dv[2 * dn], pf[kk], ob[0], ob[1]);
                mma_m16n8k16<BF16>(dv[2 * dn + 1], pf[kk], ob[2], ob[3]);
                ldsm_x4_trans(qb, ldsm_addr<D>(sQ, (kk * 16 + pa_r) * D * 2, dn, pa_y));
                mma_m16n8k16<BF16>(dk[2 * dn], sf[kk], qb[0], qb[1]);
                mma_m16n8k16<BF16>(dk[2 * dn + 1], sf[kk], qb[2], qb[3]);
            }
        }
        __syncthreads(); /* dS^T complete */

        /* 3. dQ += dS K: queries 16 mg .. + 15, columns CW cg .. + CW - 1 */
        pbwd_dq<D, S, BF16>(p, w, b, h, m, n_block, s0, lanes, mg, cg, lane, tid);
    }
    cp_async_wait<0>();

    pbwd_store<D, BF16>(p, b, hk, n0, len_k, warp, 0, g, t, dv, dk);
}
