/* bwd_epilogue.cuh - the backward's dK and dV out of a consumer's
 * accumulators, once per CTA (after every query block): dK times
 * softmax_scale, both rounded to the 16-bit dtype, 4-byte stores of the
 * fragment's column pairs straight to global memory. */
#pragma once
#include "bwd_traits.cuh"

/* dK / dV of the tile's sequence: batch b's (fixed length) or the packed
 * rows from the sequence's first key (VARLEN) */
template <class C>
__device__ __forceinline__ int64_t bwd_kv_offset(int b, const BwdSeq &sq, int64_t sb, int64_t ss) {
    if constexpr (C::VARLEN) return (int64_t)sq.k0 * ss;
    (void)sq, (void)ss;
    return (int64_t)b * sb;
}

/* A consumer's N columns of dK and dV from column col0, rows key_r and key_r
 * + 8 (the accumulator's: element 4 i + e is row key_r + 8 (e / 2), column
 * col0 + 8 i + 2 q4 + e % 2); rows at or past seqlen_k, and columns past
 * the call's head dims (BwdCfg::HD, HDV), are not written. */
template <class C, int N>
__device__ __forceinline__ void bwd_store_dkdv(const BwdParams &p, const BwdSeq &sq, int b, int hk, int key_r,
                                               int col0, int q4, const float (&dk)[N / 2], const float (&dv)[N / 2]) {
    uint16_t *gk = (uint16_t *)p.dk + bwd_kv_offset<C>(b, sq, p.dk_sb, p.dk_ss) + (int64_t)hk * p.dk_sh;
    uint16_t *gv = (uint16_t *)p.dv + bwd_kv_offset<C>(b, sq, p.dv_sb, p.dv_ss) + (int64_t)hk * p.dv_sh;
#pragma unroll
    for (int e2 = 0; e2 < 2; ++e2) {
        const int key = key_r + 8 * e2;
        if (key >= p.seqlen_k) continue;
#pragma unroll
        for (int i = 0; i < N / 8; ++i) {
            const int col = col0 + 8 * i + 2 * q4;
            const float k0 = dk[4 * i + 2 * e2] * p.scale, k1 = dk[4 * i + 2 * e2 + 1] * p.scale;
            const float v0 = dv[4 * i + 2 * e2], v1 = dv[4 * i + 2 * e2 + 1];
            /* columns past the call's head dims (BwdOpts.hd, hdv) are not its */
            if (C::HD == C::D || col < C::HD)
                *(uint32_t *)(gk + key * p.dk_ss + col) = C::BF16 ? pack_bf16x2(k0, k1) : pack_f16x2(k0, k1);
            if (C::HDV == C::D || col < C::HDV)
                *(uint32_t *)(gv + key * p.dv_ss + col) = C::BF16 ? pack_bf16x2(v0, v1) : pack_f16x2(v0, v1);
        }
    }
}
