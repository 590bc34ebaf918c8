/* fwd_mainloop.cuh - a consumer warpgroup of the 16-bit forward: 64 query rows
 * of each tile the producer hands it.
 *   S = Q K^T        wgmma, both operands in shared memory (SS), or the first
 *                    QREGK k-steps with Q in registers (RS, B K-major)
 *   online softmax   registers (fwd_softmax.cuh)
 *   O += P V         wgmma with P from registers (RS), V MN-major (trans-b);
 *                    N = DV, V's head dim (192 with 128: issue 37)
 * OVERLAP (paper §3.2): S_j = Q K_j^T is issued together with O += P_{j-1}
 *   V_{j-1}, and the softmax of block j runs while the PV GEMM is in flight.
 * PINGPONG (paper §3.1): the consumers take turns issuing their GEMMs, a
 *   token passed round named barriers 8 .. 8+NC-1 without a break across
 *   tiles, so one warpgroup's softmax hides under the other's GEMMs.
 * SITOUT: a warpgroup with no row in the sequence only keeps the protocol
 *   going for its tile; SKIPDIAG: a causal warpgroup that sees none of the
 *   tile's first key block does the same for that block.
 * FP8 (e4m3 Q, K, V): both GEMMs are k32 e4m3 wgmma; the PV GEMM's B is the
 *   V^T the transposers wrote (fwd_transpose.cuh), whose key order makes the
 *   score accumulator P's A fragment after a register renaming (convert_p);
 *   the Q and K scales scale the scores (a factor per row, or with KCOL a
 *   column vector too) and O is kept in units of the current V block's
 *   scale, the ratio folded into the rescale factor. */
#pragma once
#include "../../common/wgmma_e4m3.cuh"
#include "../../common/wgmma_gen.cuh"
#include "fwd_epilogue.cuh"
#include "fwd_pipeline.cuh"
#include "fwd_scheduler.cuh"
#include "fwd_softmax.cuh"

template <class C, class SP>
struct FwdConsumer {
    static constexpr int D = C::D, BN = C::BN, BM = C::BM, NC = C::NC, STAGES = C::STAGES;
    using WG = wgmma_op<BN, C::BF16>; /* S = Q K^T: m64 n=BN k16 */
    using WGO = wgmma_op<C::PV_N, C::BF16>; /* O += P V:  m64 n=DV k16 (fwd_traits.cuh: PV_N) */

    const FwdParams &p;
    const SP &sp;
    const FwdSmem<C> &sm;
    FwdEpilogue<C, SP> &epi;
    int wg, warp, lane, r0, q4;
    uint32_t cta_rank;
    float c2;
    int bar_self, bar_next;
    const FwdFp8 *f8; /* FP8 only */
    const FwdVarlen *vl; /* VARLEN only */
    const FwdLocal *loc = nullptr; /* LOCAL only */
    int it = 0; /* K/V ring position */
#ifdef FATTN_FWD_TRACE
    int trace_n = 0;
#endif

    float sacc[BN / 2];
    float oacc[C::PV_N / 2];
    uint32_t pfrag[C::P_STEPS][4];
    /* FP8: c2 q_scale of rows r0, r0 + 8; this tile's K and V scale rows; the
     * current key block's K scale (KCOL: its columns' scales) and V scale,
     * and the V scale O is in units of */
    float qf[2];
    const float *ks_row, *vs_row;
    float sk_g[C::NG], sv_g[C::NG], sv_units; /* per column group of SG keys */
    float kcol[C::KCOL ? BN / 4 : 1];
    uint32_t qfrag[C::QREG ? C::QREGK : 1][4]; /* QREG: this tile's Q, A fragments per 16 columns */
    uint64_t desc_q_tile;
    /* KVCACHE only, set by the kernel (with a default initialiser beside
     * loc, the other kernels' PTX registers were renumbered: other SASS) */
    const FwdPaged *pg;

    __device__ __forceinline__ void pp_sync() const {
        if (C::PINGPONG) named_bar_sync(bar_self, 256);
    }
    __device__ __forceinline__ void pp_arrive() const {
        if (C::PINGPONG) named_bar_arrive(bar_next, 256);
    }
    __device__ __forceinline__ void release(uint64_t *bar) const { ring_release<C>(bar, lane, cta_rank); }
    /* after the full waits of a stage the gather warps wrote (KVCACHE, kv_box
     * 0): their cp.async writes are generic-proxy, the wgmma reads
     * async-proxy (fwd_gather.cuh) */
    __device__ __forceinline__ void gather_fence() const {
        if constexpr (C::KVCACHE) {
            if (pg->kv_box == 0) fence_async_shared();
        }
    }
    /* A key block this warpgroup has no use for (SITOUT, SKIPDIAG): its
     * pingpong turn and the release of its two stages, nothing else (the
     * waits spin: sleeping ones lengthened the 3-warpgroup causal loop) */
    __device__ __forceinline__ void pass_block(int s, uint32_t ph) const {
        mbar_wait<false>(&sm.full_k[s], ph);
        pp_sync();
        pp_arrive();
        release(&sm.empty_k[s]);
        mbar_wait<false>(&sm.full_v[s], ph);
        release(&sm.empty_v[s]);
    }
    /* S = Q K_s^T into sacc (issue only). */
    __device__ __forceinline__ void issue_qk(int s) {
        if constexpr (C::FP8) {
            const uint64_t desc_k = smem_desc_kmajor<C::SW>(sm.k_stage(s));
#pragma unroll
            for (int kk = 0; kk < C::QK_STEPS; ++kk) {
                const uint32_t off = (kk % C::STEPS_PER_SLAB) * 32, slab = kk / C::STEPS_PER_SLAB;
                /* QREG: Q's k32 slices from registers (ldmatrix gives the e4m3
                 * A layout: a b16 pair is 4 bytes of k, load_q) */
                if (kk < C::QREGK)
                    wgmma_e4m3<BN>::rs(sacc, qfrag[C::QREG ? kk : 0], desc_add(desc_k, slab * BN * C::SW + off), kk > 0);
                else
                    wgmma_e4m3<BN>::ss(sacc, desc_add(desc_q_tile, slab * BM * C::SW + off),
                                       desc_add(desc_k, slab * BN * C::SW + off), kk > 0);
            }
        } else {
            const uint64_t desc_k = smem_desc_sw128(sm.k_stage(s), 16, 1024);
            const uint64_t desc_q = desc_q_tile;
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                const uint32_t off_q = (kk / 4) * BM * 128 + (kk % 4) * 32;
                const uint32_t off_k = (kk / 4) * BN * 128 + (kk % 4) * 32;
                if (kk < C::QREGK) WG::rsk(sacc, qfrag[C::QREG ? kk : 0], desc_add(desc_k, off_k), kk > 0);
                else WG::ss(sacc, desc_add(desc_q, off_q), desc_add(desc_k, off_k), kk > 0);
            }
        }
    }
    /* O += P V_s (issue only). */
    __device__ __forceinline__ void issue_pv(int s) {
        if constexpr (C::FP8) {
            /* V^T: D rows of 128-key slabs, K-major; k32 steps of 32 bytes */
            const uint64_t desc_vt = smem_desc_sw128(sm.v_stage(s), 16, 1024);
#pragma unroll
            for (int ks = 0; ks < C::P_STEPS; ++ks)
                wgmma_e4m3<D>::rs(oacc, pfrag[ks], desc_add(desc_vt, (ks / 4) * D * 128 + (ks % 4) * 32), 1);
        } else {
            const uint64_t desc_v = smem_desc_sw128(sm.v_stage(s), BN * 128, 1024);
#pragma unroll
            for (int ks = 0; ks < BN / 16; ++ks) WGO::rs(oacc, pfrag[ks], desc_add(desc_v, ks * 2048), 1);
        }
    }
    /* S accumulator -> bf16/f16 A fragments of the PV GEMM (HOPPER-PTX §3:
     * the layouts coincide, no data movement across threads). */
    __device__ __forceinline__ void convert_p() {
        if constexpr (C::FP8) {
            /* k32 step ks covers column groups g = 4 ks .. 4 ks + 3; with V^T's
             * key order (fwd_transpose.cuh) the A fragment's bytes 4q..4q+3
             * of a row are its columns (2q, 2q+1) of groups g and g + 1:
             * FA3's swap of 64-bit pairs, here a renaming */
#pragma unroll
            for (int ks = 0; ks < C::P_STEPS; ++ks) {
                const float *g = sacc + 16 * ks;
                pfrag[ks][0] = pack_e4m3x4(g[0], g[1], g[4], g[5]);
                pfrag[ks][1] = pack_e4m3x4(g[2], g[3], g[6], g[7]);
                pfrag[ks][2] = pack_e4m3x4(g[8], g[9], g[12], g[13]);
                pfrag[ks][3] = pack_e4m3x4(g[10], g[11], g[14], g[15]);
            }
        } else {
#pragma unroll
            for (int ks = 0; ks < BN / 16; ++ks)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const float lo = sacc[8 * ks + 2 * j], hi = sacc[8 * ks + 2 * j + 1];
                    pfrag[ks][j] = C::BF16 ? pack_bf16x2(lo, hi) : pack_f16x2(lo, hi);
                }
        }
    }
    /* FP8: this tile's Q scales (rows r0, r0 + 8 of the warpgroup) and its K
     * and V scale rows */
    __device__ __forceinline__ void fp8_tile(int b, int h, int row_base) {
        if constexpr (C::FP8) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int row = min(row_base + r0 + 8 * r, p.seqlen_q - 1);
                qf[r] = c2 * __ldg(f8->q_scale + (int64_t)(b * p.heads_q + h) * f8->q_nblocks + row / f8->q_block);
            }
            const int64_t bh = (int64_t)b * p.heads_kv + h / p.group;
            ks_row = f8->k_scale + bh * f8->k_nblocks;
            vs_row = f8->v_scale + bh * f8->v_nblocks;
        } else {
            (void)b, (void)h, (void)row_base;
        }
    }
    /* FP8: the scales of key block col0's column groups, loaded before its
     * S is waited for */
    __device__ __forceinline__ static int scale_index(int key, int shift, int block) {
        return shift >= 0 ? key >> shift : key / block;
    }
    __device__ __forceinline__ void fp8_load(int col0) {
        if constexpr (C::FP8) {
#pragma unroll
            for (int g = 0; g < C::NG; ++g) {
                const int key = col0 + g * C::SG;
                sv_g[g] = __ldg(vs_row + scale_index(key, f8->v_shift, f8->v_block));
                if (!C::KCOL) sk_g[g] = __ldg(ks_row + scale_index(key, f8->k_shift, f8->k_block));
            }
            if constexpr (C::KCOL) {
#pragma unroll
                for (int i = 0; i < BN / 8; ++i)
#pragma unroll
                    for (int e = 0; e < 2; ++e)
                        kcol[2 * i + e] = __ldg(ks_row + min(col0 + 8 * i + 2 * q4 + e, p.seqlen_k - 1));
            }
        } else {
            (void)col0;
        }
    }
    /* mask and online softmax of the block in sacc (first: the tile's first) */
    __device__ __forceinline__ void softmax(const FwdMask<C> &mask, FwdSoftmax<C> &sf, int col0, bool first,
                                            float (&alpha)[2], bool &rescale) {
        if constexpr (C::FP8) {
            float f[C::NG][2];
            if constexpr (C::KCOL) {
#pragma unroll
                for (int i = 0; i < BN / 8; ++i)
#pragma unroll
                    for (int e = 0; e < 4; ++e) sacc[4 * i + e] *= kcol[2 * i + (e & 1)];
            }
#pragma unroll
            for (int g = 0; g < C::NG; ++g)
#pragma unroll
                for (int r = 0; r < 2; ++r) f[g][r] = C::KCOL ? qf[r] : qf[r] * sk_g[g];
            /* V: the block's largest scale is the unit of O from here on; a
             * group with a smaller one gets its ratio into P (an exponent
             * offset, so P stays <= 256) and out of the row sum */
            float sv_ref = sv_g[0], lr[C::NG], inv_ratio[C::NG];
#pragma unroll
            for (int g = 1; g < C::NG; ++g) sv_ref = fmaxf(sv_ref, sv_g[g]);
#pragma unroll
            for (int g = 0; g < C::NG; ++g) {
                inv_ratio[g] = C::NG == 1 ? 1.f : __fdividef(sv_ref, sv_g[g]);
                lr[g] = C::NG == 1 ? 0.f : -__log2f(inv_ratio[g]);
            }
            mask.apply(sacc, col0);
            sf.step_fp8(sacc, f, lr, inv_ratio, alpha);
            /* O (in units of the previous block's V scale) goes to this one's */
            const float ratio = first ? 1.f : __fdividef(sv_units, sv_ref);
            alpha[0] *= ratio;
            alpha[1] *= ratio;
            sv_units = sv_ref;
            rescale = true;
        } else {
            (void)first;
            /* LOCAL: softcap at runtime (a uniform branch: calls without it
             * pay no MUFU); before the mask, whose -inf it would not keep */
            if constexpr (C::LOCAL)
                if (loc->cap_b != 0.f) fwd_softcap<C>(sacc, loc->cap_b);
            mask.apply(sacc, col0);
            sf.step(sacc, c2, alpha, rescale);
        }
    }
    /* this tile's Q: its descriptor, and (QREG) the first QREGK slices in
     * registers; with all of them the buffer goes back to the producer */
    __device__ __forceinline__ void load_q(int qi) {
        const uint8_t *sq_wg = sm.q_rows(qi % C::QBUF, wg);
        if constexpr (C::FP8) desc_q_tile = smem_desc_kmajor<C::SW>(sq_wg);
        else desc_q_tile = smem_desc_sw128(sq_wg, 16, 1024);
        if (C::QREG) {
            /* 16x16 block kk of warp w: rows 16w + (j % 2) 8 + lane % 8,
             * 16-byte chunk 2 (kk % 4) + j / 2 of slab kk / 4 for matrix
             * j = lane / 8, chunk index xor row % 8 (128-byte swizzle) */
            const uint32_t qbase = smem_u32(sq_wg);
            const int qrow = 16 * warp + ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
            for (int kk = 0; kk < C::QREGK; ++kk) {
                const int chunk = 2 * (kk % 4) + (lane >> 4);
                ldsm_x4(qfrag[kk], qbase + (kk / 4) * BM * 128 + qrow * 128 + ((chunk ^ (qrow & 7)) << 4));
            }
            if (C::QREG_ALL) {
                /* the producer may overwrite the buffer (async proxy) once
                 * every thread's reads are done */
                fence_async_shared();
                mbar_arrive(&sm.empty_q[qi]);
            }
        }
    }
    /* One slot of the overlapped loop: S = Q K_n^T into stage s issued with
     * O += P V from stage pv_s; O is rescaled by the pending factor under the
     * QK^T; the softmax of block n runs under the PV GEMM. */
    __device__ __forceinline__ void overlap_step(int s, uint32_t ph, int pv_s, uint32_t pv_ph, int n, int qi,
                                                 int col0, const FwdMask<C> &mask, FwdSoftmax<C> &sf,
                                                 float (&alpha)[2], bool &rescale) {
        fp8_load(col0);
        /* V_{j-1} landed before K_j: waiting for both before the fence keeps
         * ptxas from injecting a second warpgroup.arrive (C7519) between the
         * two GEMMs */
        mbar_wait<C::SLEEP>(&sm.full_v[pv_s], pv_ph);
        mbar_wait<C::SLEEP>(&sm.full_k[s], ph);
        gather_fence();
        FWD_TRACE(2);
        pp_sync();
        FWD_TRACE(4);
        wgmma_fence();
        issue_qk(s);
        wgmma_commit();
        fwd_rescale_o<C>(oacc, alpha, rescale); /* while S = Q K^T runs */
        wgmma_fence();
        issue_pv(pv_s);
        wgmma_commit();
        pp_arrive();
        wgmma_wait<1>(); /* S done, PV may still run */
        reg_fence(sacc);
        FWD_TRACE(5);
        release(&sm.empty_k[s]);
        if (!C::QREG_ALL && n == 0) mbar_arrive(&sm.empty_q[qi]);
        softmax(mask, sf, col0, false, alpha, rescale); /* under the PV GEMM */
        FWD_TRACE(6);
        /* keeps the wait below the softmax in the SASS (both rows' sums) */
        if (C::SCHED_FENCE) sched_fence(__float_as_uint(sf.row_sum[0]) & __float_as_uint(sf.row_sum[1]));
        wgmma_wait<0>();
        reg_fence(oacc);
        /* P is read by the PV GEMM until this wait: keeping it live to here
         * stops ptxas from giving its registers to softmax temporaries,
         * which made it wait for the PV GEMM before the softmax (v8) */
        if (C::SCHED_FENCE)
#pragma unroll
            for (int ks = 0; ks < C::P_STEPS; ++ks) reg_fence(pfrag[ks]);
        FWD_TRACE(7);
        release(&sm.empty_v[pv_s]);
        convert_p();
    }
    /* Without the overlap: PV of the previous block, then S of this one,
     * each waited for. */
    __device__ __forceinline__ void serial_step(int s, uint32_t ph, int pv_s, uint32_t pv_ph, int n, int qi, int col0,
                                                const FwdMask<C> &mask, FwdSoftmax<C> &sf, float (&alpha)[2],
                                                bool &rescale) {
        fp8_load(col0);
        fwd_rescale_o<C>(oacc, alpha, rescale);
        mbar_wait<C::SLEEP>(&sm.full_v[pv_s], pv_ph);
        mbar_wait<C::SLEEP>(&sm.full_k[s], ph);
        gather_fence();
        pp_sync();
        wgmma_fence();
        issue_pv(pv_s);
        wgmma_commit();
        issue_qk(s);
        wgmma_commit();
        pp_arrive();
        wgmma_wait<0>();
        reg_fence(sacc);
        reg_fence(oacc);
        release(&sm.empty_v[pv_s]);
        release(&sm.empty_k[s]);
        if (!C::QREG_ALL && n == 0) mbar_arrive(&sm.empty_q[qi]);
        softmax(mask, sf, col0, false, alpha, rescale);
        convert_p();
    }
    /* The tile's last PV GEMM, alone, then its epilogue (split_t >= 0: a
     * piece of a split tile, merged through the workspace). */
    __device__ __forceinline__ void last_pv_and_epilogue(int ps, uint32_t pph, const FwdSoftmax<C> &sf, int eb, int eh,
                                                         int erow, int split_t) {
        mbar_wait<C::SLEEP>(&sm.full_v[ps], pph);
        gather_fence();
        FWD_TRACE(2);
        pp_sync();
        FWD_TRACE(8);
        wgmma_fence();
        issue_pv(ps);
        wgmma_commit();
        pp_arrive();
        wgmma_wait<0>();
        reg_fence(oacc);
        FWD_TRACE(7);
        release(&sm.empty_v[ps]);
        if (C::SPLIT && split_t >= 0) epi.split_finish(oacc, sf.row_max, sf.row_sum, split_t, eb, eh, erow);
        else epi.store(oacc, sf.row_max, sf.row_sum, eb, eh, erow, C::FP8 ? sv_units : 1.f);
        FWD_TRACE(9);
    }
    /* One tile's key blocks n_lo .. n_hi - 1, from the last to the first. */
    __device__ __forceinline__ void run_tile(int t, int qi, int m, int h, int b, int row_base, int n_lo, int n_hi,
                                             int nblocks, const FwdSeq &seq) {
        FwdSoftmax<C> sf;
        FwdMask<C> mask{p, m * BM, row_base, r0, q4, seq.len_k, seq.len_k - seq.len_q};
        if constexpr (C::LOCAL) fwd_window_diag(loc, seq, mask.dl, mask.dr);
#pragma unroll
        for (int i = 0; i < C::PV_N / 2; ++i) oacc[i] = 0.f;
        load_q(qi);
        fp8_tile(b, h, row_base);
        /* O starts at zero and is rescaled by the pending alpha right before
         * each PV GEMM adds to it (FA3's placement: with the overlap, under
         * the QK^T GEMM just issued). */
        float alpha[2];
        bool rescale;
        /* n counts the tile's (SPLIT: piece's) key blocks down to 0; the
         * block itself is n + n_lo */
        int n = n_hi - n_lo - 1;
        int s = ring_stage(it, STAGES);
        uint32_t ph = ring_phase(it, STAGES);
        if (C::SKIPDIAG && n > 0 && n * BN > row_base + 63 + p.causal_offset) {
            /* no row of this warpgroup sees a key of block n (the tile's
             * other blocks and turns follow as usual) */
            pass_block(s, ph);
            ++it;
            --n;
            s = ring_stage(it, STAGES);
            ph = ring_phase(it, STAGES);
        }
        /* peeled first block: S, softmax (no PV yet).  Data is waited for
         * before taking the token, so a warpgroup never holds it idle. */
        fp8_load((n + n_lo) * BN);
        mbar_wait<C::SLEEP>(&sm.full_k[s], ph);
        gather_fence();
        FWD_TRACE(2);
        pp_sync();
        FWD_TRACE(3);
        wgmma_fence();
        issue_qk(s);
        wgmma_commit();
        pp_arrive();
        epi.flush_o_store(); /* OTMA_LATE: the previous tile's O, now that this tile's loads have landed */
        wgmma_wait<0>();
        reg_fence(sacc);
        FWD_TRACE(5);
        release(&sm.empty_k[s]);
        if (!C::QREG_ALL && n == 0) mbar_arrive(&sm.empty_q[qi]);
        softmax(mask, sf, (n + n_lo) * BN, true, alpha, rescale);
        convert_p();
        FWD_TRACE(6);
        int prev_s = s;
        uint32_t prev_ph = ph;
        ++it;
        for (--n; n >= 0; --n, ++it) {
            s = ring_stage(it, STAGES);
            ph = ring_phase(it, STAGES);
            if (C::OVERLAP) overlap_step(s, ph, prev_s, prev_ph, n, qi, (n + n_lo) * BN, mask, sf, alpha, rescale);
            else serial_step(s, ph, prev_s, prev_ph, n, qi, (n + n_lo) * BN, mask, sf, alpha, rescale);
            prev_s = s;
            prev_ph = ph;
        }
        fwd_rescale_o<C>(oacc, alpha, rescale);
        last_pv_and_epilogue(prev_s, prev_ph, sf, b, h, row_base,
                             C::SPLIT && (n_lo > 0 || n_hi < nblocks) ? t : -1);
    }
    /* SITOUT: the same waits, releases and pingpong turns as the working
     * loop (one turn per key block and one for the last PV GEMM), nothing
     * else; the epilogue would write nothing */
    __device__ __forceinline__ void sit_out_tile(int qi, int nblk) {
        mbar_arrive(&sm.empty_q[qi]);
        for (int j = it; j < it + nblk; ++j) pass_block(ring_stage(j, STAGES), ring_phase(j, STAGES));
        it += nblk;
        pp_sync();
        pp_arrive();
    }

    __device__ __forceinline__ void run() {
        /* the token starts at warpgroup 0 */
        if (C::PINGPONG && wg == NC - 1) named_bar_arrive(8, 256);
        int q_iter = 0;
        for (;;) {
            /* the producer publishes this warpgroup's next tile with its Q */
            int qi;
            const int t = qslot_receive(sm, wg, q_iter, qi);
            FWD_TRACE(1);
            if (t >= p.num_tiles) break;
            int m, h, b;
            fwd_decode<C>(p, loc, t, m, h, b);
            const FwdSeq seq = fwd_seq<C>(p, vl, b);
            int lo; /* LOCAL: the window's first block; else 0 */
            const int nblocks = fwd_tile_blocks<C>(p, loc, seq, m, lo);
            if constexpr (C::VARLEN) epi.vq0 = seq.q0, epi.vlen_q = seq.len_q;
            int n_lo = lo, n_hi = lo + nblocks;
            fwd_split_range<C>(sp, t, n_lo, n_hi);
            const int row_base = m * BM + wg * 64; /* first query row of this warpgroup */
            /* SITOUT: no row of this warpgroup is in the sequence (it got no Q) */
            const bool sit_out = C::SITOUT && row_base >= p.seqlen_q;
            if (nblocks > 0 && !sit_out) {
                run_tile(t, qi, m, h, b, row_base, n_lo, n_hi, nblocks, seq);
            } else if (nblocks > 0) {
                sit_out_tile(qi, n_hi - n_lo);
            } else {
                mbar_arrive(&sm.empty_q[qi]);
                epi.store_empty(b, h, row_base);
                FWD_TRACE(9);
            }
        }
        epi.drain();
        /* the ring's last hand-over (to warpgroup 0) has no taker: take it, so
         * no arrival is left pending on a named barrier at exit */
        if (C::PINGPONG && wg == 0) named_bar_sync(8, 256);
        FWD_TRACE_END();
    }
};
