/* fwd_decode_t8.cuh - the FP8 cache's consumers with the tile swapped
 * (DecCfg::T8: KV8, at most 8 rows, no variants): keys and O's columns are
 * mma.sync's m16 side, the <= 8 query rows its n8 side (perf-notes d6, d8):
 *   - S^T = K Q^T: A = 16 keys x 16 head-dim columns of K, read as dec_s8
 *     reads a key row (dec_kcol8's permutation, the same 4 bytes a lane a
 *     k-step), B = Q^T, lane (g, t)'s row g of q (f16, a bf16 row times its
 *     power of two as dec_q8_to_f16), kept in registers (D / 8 of them);
 *   - the softmax runs down S^T's columns (rows of q): the lanes of one t
 *     share a column, so the max is three shuffles over g; the sums stay
 *     per lane until the end;
 *   - O^T = V^T P^T: A = V^T, the four key rows and byte pairs dec_pv8
 *     reads for its B operand (a pair of its 8-column tiles, dt and dt + 1,
 *     as A's rows g and g + 8), B = P^T, S^T's accumulators rounded to f16
 *     and transposed by movmatrix (8 x 8 halves: keys 0-7 and 8-15);
 *   - against the 16-row tile (4 real rows with GQA 32/8): half the MMAs, O
 *     in 32 registers at d128 instead of 64, half the exponentials.
 * The stages, producer, scales, V unit and epilogue merge are the KV8
 * kernel's (fwd_decode_kv8.cuh, dec_epilogue_merge). */
#pragma once

/* 8 x 8 b16 matrix transposed across the warp (m8n8 fragment: lane (g, t)
 * holds row g, columns 2t, 2t + 1) */
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

/* q's rows g + 8j (j < NQ) as Q^T's B fragments (b0: their k columns 2t,
 * 2t + 1 of each k-step, b1: 2t + 8, 2t + 9, under dec_kcol8's permutation),
 * f16; bf16 rows times 2^(14 - e) as dec_q8_to_f16 (the four lanes of g hold
 * the row).  rc[j]: the power of two back for S^T's columns 2t, 2t + 1 of
 * n-tile j (q rows 8j + 2t, + 1). */
template <class C>
__device__ __forceinline__ void dec_q8t_frags(const DecParams &p, uint32_t (&qb)[C::D / 16][C::NQ][2],
                                              float (&rc)[C::NQ][2], int hk, int b, int g, int t) {
#pragma unroll
    for (int j = 0; j < C::NQ; ++j) {
        const int r = g + 8 * j;
        const uint16_t *qr = nullptr;
        if (r < p.rows) {
            const int sq = r / p.group, h = r - sq * p.group;
            qr = (const uint16_t *)p.q + b * p.q_sb + (int64_t)sq * p.q_ss + (int64_t)(hk * p.group + h) * p.q_sh;
        }
#pragma unroll
        for (int kk = 0; kk < C::D / 16; ++kk) {
            qb[kk][j][0] = qr ? *(const uint32_t *)(qr + dec_kcol8<C>(kk, t)) : 0u;
            qb[kk][j][1] = qr ? *(const uint32_t *)(qr + dec_kcol8<C>(kk, t) + 2) : 0u;
        }
        float rinv = 1.f;
        if constexpr (C::BF16) {
            float m = 0.f;
#pragma unroll
            for (int kk = 0; kk < C::D / 16; ++kk)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    m = fmaxf(m, fmaxf(fabsf(__uint_as_float(qb[kk][j][e] << 16)),
                                       fabsf(__uint_as_float(qb[kk][j][e] & 0xFFFF0000u))));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
            float up = 1.f;
            if (m > 0.f && m <= FLT_MAX) {
                const int ex = max((int)((__float_as_uint(m) >> 23) & 0xFF) - 127, -112);
                up = __uint_as_float((uint32_t)(127 + 14 - ex) << 23);
                rinv = __uint_as_float((uint32_t)(127 - 14 + ex) << 23);
            }
#pragma unroll
            for (int kk = 0; kk < C::D / 16; ++kk)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    qb[kk][j][e] = pack_f16x2(__uint_as_float(qb[kk][j][e] << 16) * up,
                                              __uint_as_float(qb[kk][j][e] & 0xFFFF0000u) * up);
        }
        rc[j][0] = __shfl_sync(0xffffffffu, rinv, 8 * t);     /* lane of g = 2t */
        rc[j][1] = __shfl_sync(0xffffffffu, rinv, 8 * t + 4); /* g = 2t + 1 */
    }
}

/* S^T = K Q^T for this warp's KW keys (m-tiles of 16 from kw0) and the NQ
 * n-tiles of rows: A from key rows kw0 + 16 mi + g and + 8, 16 bytes (4
 * k-steps) of each at a time, each A fragment used for every n-tile */
template <class C>
__device__ __forceinline__ void dec_s8t(float (&st)[C::KW / 16][C::NQ][4], const uint32_t (&qb)[C::D / 16][C::NQ][2],
                                        uint32_t kst, int kw0, int g, int t) {
    using E = Dec8<C>;
    constexpr int KS = E::W / 4; /* k-steps a slab */
#pragma unroll
    for (int mi = 0; mi < C::KW / 16; ++mi) {
        const int row = kw0 + mi * 16 + g;
#pragma unroll
        for (int s = 0; s < E::SL; ++s)
#pragma unroll
            for (int c = 0; c < E::W / 16; ++c) {
                const uint4 v0 = ld_shared_b32x4(kst + dec_sw8<C>(row, s * E::RW + E::W * t + 16 * c));
                const uint4 v1 = ld_shared_b32x4(kst + dec_sw8<C>(row + 8, s * E::RW + E::W * t + 16 * c));
                const uint32_t w0[4] = {v0.x, v0.y, v0.z, v0.w}, w1[4] = {v1.x, v1.y, v1.z, v1.w};
#pragma unroll
                for (int x = 0; x < 4; ++x) {
                    uint32_t a[4]; /* (g, k 2t), (g + 8, 2t), (g, 2t + 8), (g + 8, 2t + 8) */
                    e4m3x4_to_f16x2x2(w0[x], a[0], a[2]);
                    e4m3x4_to_f16x2x2(w1[x], a[1], a[3]);
                    const int kk = s * KS + 4 * c + x;
#pragma unroll
                    for (int j = 0; j < C::NQ; ++j) mma_m16n8k16<false>(st[mi][j], a, qb[kk][j][0], qb[kk][j][1]);
                }
            }
    }
}

/* S^T's rows (keys kw0 + 16 mi + g, + 8) times their scale in ksc (the
 * block's) times f, its columns by rc */
template <class C>
__device__ __forceinline__ void dec_scale_rows_t(float (&st)[C::KW / 16][C::NQ][4], const float *ksc, int kw0, int g,
                                                 float f, const float (&rc)[C::NQ][2]) {
#pragma unroll
    for (int mi = 0; mi < C::KW / 16; ++mi) {
        const float s0 = ld_shared_f32(ksc + kw0 + mi * 16 + g) * f, s1 = ld_shared_f32(ksc + kw0 + mi * 16 + g + 8) * f;
#pragma unroll
        for (int j = 0; j < C::NQ; ++j) {
            st[mi][j][0] *= s0 * rc[j][0], st[mi][j][1] *= s0 * rc[j][1];
            st[mi][j][2] *= s1 * rc[j][0], st[mi][j][3] *= s1 * rc[j][1];
        }
    }
}

/* O^T += V^T P^T for this warp's KW keys of the e4m3 V tile at vst: P^T's
 * m-tile ks of each n-tile (S^T's accumulators, already times V's scales
 * over the unit) to B by movmatrix, then dec_pv8's words and pairs (dec_v8_step)
 * as A for O^T's m-tiles (dt, dt + 1), each A for every n-tile */
template <class C>
__device__ __forceinline__ void dec_pv8t(float (&ot)[C::D / 16][C::NQ][4], const float (&st)[C::KW / 16][C::NQ][4],
                                         uint32_t vst, int kw0, int g, int t, int key0, int len, bool tail) {
#pragma unroll
    for (int ks = 0; ks < C::KW / 16; ++ks) {
        uint32_t b0[C::NQ], b1[C::NQ];
#pragma unroll
        for (int j = 0; j < C::NQ; ++j) {
            b0[j] = movmatrix_trans(pack_f16x2(st[ks][j][0], st[ks][j][1])); /* keys 2t, 2t + 1 of row 8j + g */
            b1[j] = movmatrix_trans(pack_f16x2(st[ks][j][2], st[ks][j][3])); /* keys 2t + 8, 2t + 9 */
        }
        dec_v8_step<C>(vst, kw0, ks, g, t, key0, len, tail,
                       [&](int dt, uint32_t lo0, uint32_t hi0, uint32_t lo1, uint32_t hi1) {
                           /* (dt col g, keys 2t), (dt + 1, 2t), (dt, 2t + 8), (dt + 1, 2t + 8) */
                           const uint32_t a[4] = {lo0, hi0, lo1, hi1};
#pragma unroll
                           for (int j = 0; j < C::NQ; ++j) mma_m16n8k16<false>(ot[dt / 2][j], a, b0[j], b1[j]);
                       });
    }
}

/* The T8 consumers: the split's blocks n_lo..n_hi - 1, then the warp's O^T,
 * max and sum to the epilogue's scratch and dec_epilogue_merge.  Columns
 * (j, c): q row 8j + 2t + c. */
template <class C>
__device__ __forceinline__ void dec_consume_t8(const DecParams &p, uint8_t *sm, float *ml, uint64_t *full,
                                               uint64_t *empty, int n_lo, int n_hi, int len, int warp, int lane,
                                               int split, int hk, int b) {
    constexpr int D = C::D, BN = C::BN, MT = C::KW / 16, NQ = C::NQ;
    const int g = lane / 4, t = lane % 4, kw0 = warp * C::KW;
    uint32_t qb[D / 16][NQ][2];
    float rc[NQ][2];
    dec_q8t_frags<C>(p, qb, rc, hk, b, g, t);
    float ot[D / 16][NQ][4];
#pragma unroll
    for (int i = 0; i < D / 16; ++i)
#pragma unroll
        for (int j = 0; j < NQ; ++j) ot[i][j][0] = ot[i][j][1] = ot[i][j][2] = ot[i][j][3] = 0.f;
    float mrow[NQ][2], lrow[NQ][2];
#pragma unroll
    for (int j = 0; j < NQ; ++j) mrow[j][0] = mrow[j][1] = -INFINITY, lrow[j][0] = lrow[j][1] = 0.f;
    int qlast[NQ][2]; /* key k is visible to row r's query iff k <= r / group + len - seqlen_q */
    for (int j = 0; j < NQ; ++j)
        for (int c = 0; c < 2; ++c) {
            const int r = min(8 * j + 2 * t + c, p.rows - 1);
            qlast[j][c] = min(p.causal ? r / p.group + len - p.seqlen_q : len - 1, len - 1);
        }
    float vU = FLT_MIN, vru = 1.f / FLT_MIN;
    const float sl2 = p.scale_log2;
    for (int n = n_lo, it = 0; n < n_hi; ++n, ++it) {
        const int s = it % C::STAGES;
        mbar_wait(&full[s], (it / C::STAGES) & 1);
        const uint32_t kbase = smem_u32(sm + s * C::STAGE_BYTES), vbase = kbase + C::V_OFF;
        const float *scales = (const float *)(sm + C::OFF_SC + s * C::SCALES); /* K's, then V's */
        float st[MT][NQ][4];
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NQ; ++j) st[i][j][0] = st[i][j][1] = st[i][j][2] = st[i][j][3] = 0.f;
        dec_s8t<C>(st, qb, kbase, kw0, g, t);
        dec_scale_rows_t<C>(st, scales, kw0, g, 1.f, rc);
        const int key0 = n * BN + kw0;
        const bool tail = (n + 1) * BN > len;
        if (tail || (p.causal && (n + 1) * BN - 1 > len - p.seqlen_q))
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < NQ; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (key0 + i * 16 + g + 8 * (e >> 1) > qlast[j][e & 1]) st[i][j][e] = -INFINITY;
        const float vfac = dec_vunit<C>(scales + BN, kw0, t, vU, vru);
        float alpha[NQ][2];
        bool rescale = false;
#pragma unroll
        for (int j = 0; j < NQ; ++j)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                float bm = -INFINITY;
#pragma unroll
                for (int i = 0; i < MT; ++i) bm = fmaxf(bm, fmaxf(st[i][j][c], st[i][j][c + 2]));
#pragma unroll
                for (int x = 4; x < 32; x <<= 1) bm = fmaxf(bm, __shfl_xor_sync(0xffffffffu, bm, x));
                const float mu = dec_softmax_max(mrow[j][c], bm, sl2, alpha[j][c]);
                float sum = 0.f;
#pragma unroll
                for (int i = 0; i < MT; ++i) {
                    st[i][j][c] = exp2f(fmaf(st[i][j][c], sl2, -mu));
                    st[i][j][c + 2] = exp2f(fmaf(st[i][j][c + 2], sl2, -mu));
                    sum += st[i][j][c] + st[i][j][c + 2];
                }
                lrow[j][c] = lrow[j][c] * alpha[j][c] + sum;
                alpha[j][c] *= vfac;
                rescale = rescale || alpha[j][c] != 1.f;
            }
        if (__any_sync(0xffffffffu, rescale))
#pragma unroll
            for (int i = 0; i < D / 16; ++i)
#pragma unroll
                for (int j = 0; j < NQ; ++j) {
                    ot[i][j][0] *= alpha[j][0], ot[i][j][1] *= alpha[j][1];
                    ot[i][j][2] *= alpha[j][0], ot[i][j][3] *= alpha[j][1];
                }
        float one[NQ][2];
#pragma unroll
        for (int j = 0; j < NQ; ++j) one[j][0] = one[j][1] = 1.f;
        dec_scale_rows_t<C>(st, scales + BN, kw0, g, vru, one); /* V's scales over the unit on P (l has the unscaled P) */
        dec_pv8t<C>(ot, st, vbase, kw0, g, t, n * BN, len, tail);
        __syncwarp();
        mbar_arrive(&empty[s]); /* each thread releases its own reads */
    }
    /* O^T in the V unit's multiples; the warp's (max, sum) and O^T to the
     * scratch (rows 8j + 2t + c of the warp's 16; columns as dec_pv8 permuted
     * them) once every warp is past its last block */
    named_bar_sync(1, 128);
    float *scr = (float *)sm;
#pragma unroll
    for (int j = 0; j < NQ; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            float l = lrow[j][c];
#pragma unroll
            for (int x = 4; x < 32; x <<= 1) l += __shfl_xor_sync(0xffffffffu, l, x);
            const int r = warp * 16 + 8 * j + 2 * t + c;
            if (g == 0) {
                ml[r * 2] = mrow[j][c];
                ml[r * 2 + 1] = l;
            }
            float *at = scr + r * D;
#pragma unroll
            for (int i = 0; i < D / 16; ++i) {
                at[dec_vcol8<C>(2 * i, g)] = ot[i][j][c] * vU;
                at[dec_vcol8<C>(2 * i + 1, g)] = ot[i][j][c + 2] * vU;
            }
        }
    dec_epilogue_merge<C>(p, sm, ml, split, hk, b);
}
