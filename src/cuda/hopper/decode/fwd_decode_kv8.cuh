/* fwd_decode_kv8.cuh - the decoding kernel's FP8-cache parts (DecCfg::KV8):
 * the consumers read the stage's e4m3 codes straight into mma.sync's B
 * fragments and convert them in registers (cvt.rn.f16x2.e4m3x2, exact), so
 * no 16-bit copy of the block, no CTA barrier and no ldmatrix.
 *   - the MMAs are f16 whatever q's type: every e4m3 value is an f16; a bf16
 *     q row enters as f16 times a power of two that puts its largest |q| in
 *     [2^14, 2^15) (exact but for elements 2^28 below it), undone on S;
 *   - K: the k dimension (the head dim) is permuted the same way for Q and
 *     K, so that a lane's B fragments for all k-steps of a key are W
 *     contiguous bytes of each slab (dec_kcol8), one or two 16-byte loads;
 *   - V: the n dimension (O's columns) is permuted, so that a lane's B
 *     fragments of one k-step are 16 (d64: 8) contiguous bytes of each of
 *     its four key rows, paired by byte permutes (dec_vcol8 undoes it on O);
 *   - the stages are TMA-swizzled (128-byte; 64-byte at d64), which makes
 *     both patterns free of bank conflicts (d64's V: two-way);
 *   - V's scales go on P before it is rounded to f16 as vs / U, U the
 *     warp's running largest V scale (O carries the factor U, folded into
 *     the softmax's rescale when it grows and multiplied back at the end),
 *     so P stays in [0, 1] whatever the scales' magnitude. */
#pragma once
#include <float.h>

/* bytes of a slab row (one TMA box row), its lanes' share, and the V
 * fragment's bytes a row a lane */
template <class C>
struct Dec8 {
    static constexpr int RW = C::D < 128 ? C::D : 128, SL = C::D / RW, W = RW / 4, WV = RW / 8;
};

/* KV8: the whole producer warp, one key block a stage:
 *   - lane 0 issues the block's TMA loads of K and V codes (slabs of
 *     Dec8::RW bytes, swizzled; page by page when pages are shorter than a
 *     block) and one arrival with their bytes;
 *   - every lane copies the K and V scales of keys lane, lane + 32, ... into
 *     the stage by cp.async (zeros past the keys or for a table entry
 *     outside the pool, whose codes TMA reads as zeros) and arrives when
 *     they land (full's count: 1 + 32);
 *   - paged: lane l holds the table entry of page pbase + l, 32 pages read
 *     at once and shuffled to the keys, so no global load stands between
 *     the producer and its next TMA (d3 measured the FP8 call bound by
 *     the per-block table and scale loads of the lanes).
 * A page past the keys used reads page num_pages, outside the pool: zeros. */
template <class C>
__device__ __forceinline__ void dec_produce8(const DecParams &p, const CUtensorMap *tm_k, const CUtensorMap *tm_v,
                                            uint8_t *sm, uint64_t *full, uint64_t *empty, int n_lo, int n_hi, int hk,
                                            int b, int len, int lane) {
    constexpr int STAGES = C::STAGES, BN = C::BN, RW = Dec8<C>::RW, SL = Dec8<C>::SL;
    constexpr unsigned FULL = 0xffffffffu;
    static_assert(BN % 32 == 0, "whole keys a lane");
    if (lane == 0) {
        tma_prefetch_desc(tm_k);
        tma_prefetch_desc(tm_v);
    }
    int pbase = -64, ent = 0;
    for (int n = n_lo, it = 0; n < n_hi; ++n, ++it) {
        const int s = it % STAGES;
        if constexpr (C::PAGED) {
            const int first = (n * BN) >> p.page_shift, last = (n * BN + BN - 1) >> p.page_shift;
            if (first < pbase || last >= pbase + 32) { /* uniform */
                pbase = first;
                const int pi = pbase + lane;
                ent = pi < p.max_pages && ((int64_t)pi << p.page_shift) < len
                          ? __ldg(p.block_table + (int64_t)b * p.max_pages + pi)
                          : p.num_pages;
            }
        }
        if (it >= STAGES) mbar_wait(&empty[s], ((it / STAGES) - 1) & 1);
        uint8_t *kst = sm + s * C::STAGE_BYTES, *vst = kst + C::TILE8;
        if (lane == 0) mbar_expect_tx_arrive(&full[s], 2 * C::TILE8);
        const int pb = C::PAGED && p.page_size < BN ? p.page_size : BN;
        for (int k0 = 0; k0 < BN; k0 += pb) {
            int e = b, row = n * BN + k0;
            if constexpr (C::PAGED) {
                e = __shfl_sync(FULL, ent, ((n * BN + k0) >> p.page_shift) - pbase);
                row &= p.page_size - 1;
            }
            if (lane == 0)
                for (int c = 0; c < SL; ++c) {
                    tma_load_4d(kst + c * BN * RW + k0 * RW, tm_k, c * RW, row, hk, e, &full[s]);
                    tma_load_4d(vst + c * BN * RW + k0 * RW, tm_v, c * RW, row, hk, e, &full[s]);
                }
        }
        const uint32_t sc = smem_u32(sm + C::OFF_SC + s * C::SCALES);
#pragma unroll
        for (int h = 0; h < BN / 32; ++h) {
            const int key = n * BN + lane + 32 * h;
            int e = b, row = key;
            if constexpr (C::PAGED) {
                e = __shfl_sync(FULL, ent, (key >> p.page_shift) - pbase);
                row = key & (p.page_size - 1);
            }
            const bool ok = key < len && (!C::PAGED || (e >= 0 && e < p.num_pages));
            const int64_t eh = (int64_t)(ok ? e : 0) * p.heads_kv + hk;
            if (!ok) row = 0; /* a valid address, nothing read */
            cp_async_4(sc + 4 * (lane + 32 * h), p.k_scale + eh * p.k_nblocks + row / p.k_sb, ok);
            cp_async_4(sc + 4 * (BN + lane + 32 * h), p.v_scale + eh * p.v_nblocks + row / p.v_sb, ok);
        }
        cp_async_mbar_arrive_noinc(&full[s]);
    }
}


/* byte offset of byte x of row `row` in an e4m3 tile of BN rows (slabs of
 * RW bytes, TMA's 128-byte swizzle, or 64-byte for 64-byte rows) */
template <class C>
__device__ __forceinline__ uint32_t dec_sw8(int row, int x) {
    constexpr int RW = Dec8<C>::RW;
    const int s = x / RW, xb = x % RW, sw = RW == 128 ? (row & 7) : ((row >> 1) & 3);
    return (uint32_t)(s * C::BN * RW + row * RW + ((((xb >> 4) ^ sw) << 4) | (xb & 15)));
}

/* the head-dim column of k-step kk's first element for lane t (Q's a0 and
 * K's b0; +2 for a2 and b1): slab s, the lane's W bytes, 4 a k-step */
template <class C>
__device__ __forceinline__ int dec_kcol8(int kk, int t) {
    constexpr int KS = Dec8<C>::W / 4; /* k-steps a slab */
    return (kk / KS) * Dec8<C>::RW + Dec8<C>::W * t + 4 * (kk % KS);
}

/* O's column of accumulator tile dt, column n (0..7) of it */
template <class C>
__device__ __forceinline__ int dec_vcol8(int dt, int n) {
    constexpr int WV = Dec8<C>::WV;
    return (dt / WV) * Dec8<C>::RW + WV * n + dt % WV;
}

/* bf16 q: the fragments to f16 times 2^(14 - e) per row, e the exponent of
 * the row's largest |q| (the quad of lanes t holds the whole row); rinv
 * gets 2^(e - 14) (1 for a row of zeros or no finite maximum) */
template <class C>
__device__ __forceinline__ void dec_q8_to_f16(uint32_t (&qf)[C::D / 16][4], float (&rinv)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float m = 0.f;
#pragma unroll
        for (int kk = 0; kk < C::D / 16; ++kk)
#pragma unroll
            for (int e = h; e < 4; e += 2)
                m = fmaxf(m, fmaxf(fabsf(__uint_as_float(qf[kk][e] << 16)), fabsf(__uint_as_float(qf[kk][e] & 0xFFFF0000u))));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        float up = 1.f;
        rinv[h] = 1.f;
        if (m > 0.f && m <= FLT_MAX) {
            const int ex = max((int)((__float_as_uint(m) >> 23) & 0xFF) - 127, -112);
            up = __uint_as_float((uint32_t)(127 + 14 - ex) << 23);
            rinv[h] = __uint_as_float((uint32_t)(127 - 14 + ex) << 23);
        }
#pragma unroll
        for (int kk = 0; kk < C::D / 16; ++kk)
#pragma unroll
            for (int e = h; e < 4; e += 2)
                qf[kk][e] = pack_f16x2(__uint_as_float(qf[kk][e] << 16) * up, __uint_as_float(qf[kk][e] & 0xFFFF0000u) * up);
    }
}

/* S = Q K^T for this warp's KW keys of the e4m3 K tile at shared address kst: each n-tile's
 * key row, its W bytes a slab as 16-byte loads, two cvts a word (b0, b1) */
template <class C>
__device__ __forceinline__ void dec_s8(float (&sacc)[C::NT][4], const uint32_t (&qf)[C::D / 16][4], uint32_t kst,
                                       int kw0, int g, int t) {
    using E = Dec8<C>;
#pragma unroll
    for (int i = 0; i < C::NT; ++i) {
        const int row = kw0 + i * 8 + g;
#pragma unroll
        for (int s = 0; s < E::SL; ++s) {
            uint32_t w[E::W / 4];
#pragma unroll
            for (int c = 0; c < E::W / 16; ++c) {
                const uint4 v = ld_shared_b32x4(kst + dec_sw8<C>(row, s * E::RW + E::W * t + 16 * c));
                w[4 * c] = v.x, w[4 * c + 1] = v.y, w[4 * c + 2] = v.z, w[4 * c + 3] = v.w;
            }
#pragma unroll
            for (int j = 0; j < E::W / 4; ++j) {
                uint32_t b0, b1;
                e4m3x4_to_f16x2x2(w[j], b0, b1);
                mma_m16n8k16<false>(sacc[i], qf[s * (E::W / 4) + j], b0, b1);
            }
        }
    }
}

/* The warp's V unit: U grows to the largest V scale of the block's keys the
 * warp reads (vsc: the block's BN V scales); returns the factor O is
 * rescaled by (exactly 1 while U stands) and sets ru = 1 / U */
template <class C>
__device__ __forceinline__ float dec_vunit(const float *vsc, int kw0, int t, float &U, float &ru) {
    float m = 0.f;
#pragma unroll
    for (int i = 0; i < C::NT; ++i) {
        const float2 sc = ld_shared_f32x2(vsc + kw0 + i * 8 + 2 * t);
        m = fmaxf(m, fmaxf(sc.x, sc.y));
    }
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    float fac = 1.f;
    if (m > U) fac = U / m, U = m, ru = 1.f / m;
    return fac;
}

/* KV8: S's (or P's) columns times the scale of their keys (ksc: the block's
 * BN scales in shared memory) times f, and its rows' by r (q's power of two) */
template <class C>
__device__ __forceinline__ void dec_scale_cols(float (&sacc)[C::NT][4], const float *ksc, int kw0, int t, float f,
                                               const float (&r)[2]) {
#pragma unroll
    for (int i = 0; i < C::NT; ++i) {
        float2 sc = ld_shared_f32x2(ksc + kw0 + i * 8 + 2 * t);
        sc.x *= f, sc.y *= f;
        sacc[i][0] *= sc.x * r[0], sacc[i][1] *= sc.y * r[0];
        sacc[i][2] *= sc.x * r[1], sacc[i][3] *= sc.y * r[1];
    }
}

/* O in the V unit's multiples, after the last block (dec_vunit) */
template <class C>
__device__ __forceinline__ void dec_vunit_out(float (&oacc)[C::D / 8][4], float U) {
#pragma unroll
    for (int i = 0; i < C::D / 8; ++i) oacc[i][0] *= U, oacc[i][1] *= U, oacc[i][2] *= U, oacc[i][3] *= U;
}

/* The e4m3 V words a lane reads for one 16-key k-step of slab s: key rows
 * kw0 + 16 ks + (2t, 2t + 1, 2t + 8, 2t + 9), WV bytes each from column
 * WV g (rows past the sequence as zeros: 0 x whatever the cache holds
 * there); key0: the block's first key */
template <class C>
__device__ __forceinline__ void dec_v8_words(uint32_t (&w)[4][Dec8<C>::WV / 4], uint32_t vst, int kw0, int ks, int s,
                                             int g, int t, int key0, int len, bool tail) {
    using E = Dec8<C>;
    constexpr int NW = E::WV / 4;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int row = kw0 + ks * 16 + 2 * t + (r & 1) + 8 * (r >> 1);
        const uint32_t at = vst + dec_sw8<C>(row, s * E::RW + E::WV * g);
        if constexpr (NW == 4) {
            const uint4 v = ld_shared_b32x4(at);
            w[r][0] = v.x, w[r][1] = v.y, w[r][2] = v.z, w[r][3] = v.w;
        } else {
            const uint2 v = ld_shared_b32x2(at);
            w[r][0] = v.x, w[r][1] = v.y;
        }
        if (tail && key0 + row >= len)
#pragma unroll
            for (int m = 0; m < NW; ++m) w[r][m] = 0u;
    }
}

/* Word m's bytes 2 c2, 2 c2 + 1 of the rows (0, 1) and (2, 3), interleaved
 * and converted: lo0 / hi0 the keys 2t, 2t + 1 of O's 8-column tiles dt and
 * dt + 1 (dt = s WV + 4m + 2 c2, column g of each), lo1 / hi1 keys 2t + 8, 2t + 9 */
template <int NW>
__device__ __forceinline__ void dec_v8_pairs(const uint32_t (&w)[4][NW], int m, int c2, uint32_t &lo0, uint32_t &hi0,
                                             uint32_t &lo1, uint32_t &hi1) {
    const uint32_t sel = c2 ? 0x7362u : 0x5140u;
    e4m3x4_to_f16x2x2(__byte_perm(w[0][m], w[1][m], sel), lo0, hi0);
    e4m3x4_to_f16x2x2(__byte_perm(w[2][m], w[3][m], sel), lo1, hi1);
}

/* One 16-key k-step ks of the warp's V: for each slab its words
 * (dec_v8_words), then every O tile pair (dt, dt + 1) of it, dt = s WV + 4m +
 * 2 c2, with its converted pairs: mma(dt, lo0, hi0, lo1, hi1) (dec_v8_pairs) */
template <class C, class F>
__device__ __forceinline__ void dec_v8_step(uint32_t vst, int kw0, int ks, int g, int t, int key0, int len, bool tail,
                                            F &&mma) {
    using E = Dec8<C>;
    constexpr int NW = E::WV / 4; /* words a row a slab */
#pragma unroll
    for (int s = 0; s < E::SL; ++s) {
        uint32_t w[4][NW];
        dec_v8_words<C>(w, vst, kw0, ks, s, g, t, key0, len, tail);
#pragma unroll
        for (int m = 0; m < NW; ++m)
#pragma unroll
            for (int c2 = 0; c2 < 2; ++c2) {
                uint32_t lo0, hi0, lo1, hi1;
                dec_v8_pairs<NW>(w, m, c2, lo0, hi0, lo1, hi1);
                mma(s * E::WV + 4 * m + 2 * c2, lo0, hi0, lo1, hi1);
            }
    }
}

/* O += P V for this warp's KW keys of the e4m3 V tile at shared address vst (P
 * first times V's scales vsc over the V unit, ru = 1 / U): a k-step's
 * four key rows' words, byte pairs of rows (2t, 2t + 1) and
 * (2t + 8, 2t + 9) permuted into b0 and b1 (dec_v8_step) */
template <class C>
__device__ __forceinline__ void dec_pv8(float (&oacc)[C::D / 8][4], float (&sacc)[C::NT][4], const float *vsc, float ru,
                                        uint32_t vst, int kw0, int g, int t, int key0, int len, bool tail) {
    const float one[2] = {1.f, 1.f};
    dec_scale_cols<C>(sacc, vsc, kw0, t, ru, one); /* V's scales over the unit on P (l has the unscaled P) */
#pragma unroll
    for (int ks = 0; ks < C::KW / 16; ++ks) {
        uint32_t pa[4];
        pa[0] = pack_f16x2(sacc[2 * ks][0], sacc[2 * ks][1]);
        pa[1] = pack_f16x2(sacc[2 * ks][2], sacc[2 * ks][3]);
        pa[2] = pack_f16x2(sacc[2 * ks + 1][0], sacc[2 * ks + 1][1]);
        pa[3] = pack_f16x2(sacc[2 * ks + 1][2], sacc[2 * ks + 1][3]);
        dec_v8_step<C>(vst, kw0, ks, g, t, key0, len, tail,
                       [&](int dt, uint32_t lo0, uint32_t hi0, uint32_t lo1, uint32_t hi1) {
                           mma_m16n8k16<false>(oacc[dt], pa, lo0, lo1);
                           mma_m16n8k16<false>(oacc[dt + 1], pa, hi0, hi1);
                       });
    }
}
