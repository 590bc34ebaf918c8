/* fwd_epilogue.cuh - a consumer warpgroup's finished tile: O / l and the LSE.
 *   register stores: with two consumer warpgroups each quad transposes its
 *     packed pairs so that every lane stores 16 contiguous bytes; else 4;
 *   OTMA: each warp stages its 16 rows in shared memory (stmatrix, 128-byte
 *     swizzle) and one lane stores them by TMA (OTMA_LATE: after the warp's
 *     next first QK^T, so the next tile's first loads go first);
 *   the empty tile (no key in sight): O = 0, LSE = -inf;
 *   SPLIT: a piece's partial (O, max, sum) to the workspace, and the merge of
 *     a tile's pieces by the warp that finishes last (v30, v36).
 * The merge and the finalize are common/lse_combine.cuh's form (b). */
#pragma once
#include "../../common/lse_combine.cuh"
#include "../../common/ptx.cuh"
#include "fwd_softmax.cuh"

template <class C, class SP>
struct FwdEpilogue {
    const FwdParams &p;
    const SP &sp;
    const CUtensorMap *tm_o; /* OTMA only */
    uint8_t *smem;           /* the 1024-aligned base */
    int wg, warp, lane, tid, r0, q4;
    float c2;
    /* OTMA_LATE: a staged O not yet stored (its TMA coordinates) */
    bool st_pend = false;
    int st_row = 0, st_h = 0, st_b = 0;
    /* VARLEN: the current tile's sequence (first packed row, queries) and
     * the packed rows of Q (the LSE's row stride) */
    int vq0 = 0, vlen_q = 0, vtotal = 0;
    const FwdLocal *loc = nullptr; /* LOCAL only: the learnable sink */

    /* row of the tile's sequence that exists (VARLEN: also inside the packed
     * O, whatever cu_seqlens_q says: the CUDA engine does not check it) */
    __device__ __forceinline__ bool row_in(int row) const {
        if constexpr (C::VARLEN) return row < vlen_q && vq0 + row >= 0 && vq0 + row < vtotal;
        else return row < p.seqlen_q;
    }
    __device__ __forceinline__ int64_t lse_index(int eb, int eh, int row) const {
        if constexpr (C::VARLEN) return (int64_t)eh * vtotal + vq0 + row;
        else return ((int64_t)eb * p.heads_q + eh) * p.seqlen_q + row;
    }
    __device__ __forceinline__ uint8_t *o_row(int eb, int eh, int row) const {
        if constexpr (C::VARLEN) return (uint8_t *)p.o + 2 * ((int64_t)(vq0 + row) * p.o_ss + eh * p.o_sh);
        else return (uint8_t *)p.o + 2 * (eb * p.o_sb + (int64_t)row * p.o_ss + eh * p.o_sh);
    }

    __device__ __forceinline__ void issue_o_store(int erow, int eh, int eb) {
        if constexpr (C::OTMA) {
            if (lane == 0) {
                const uint8_t *stage = smem + C::OFF_OST + (wg * 4 + warp) * C::OST_WARP_BYTES;
#pragma unroll
                for (int c = 0; c < C::V_SLABS; ++c) tma_store_4d(tm_o, stage + c * 2048, c * 64, erow, eh, eb);
                bulk_commit_group();
            }
        } else {
            (void)erow, (void)eh, (void)eb;
        }
    }
    /* OTMA_LATE: the previous tile's O, once this tile's loads have landed */
    __device__ __forceinline__ void flush_o_store() {
        if (C::OTMA_LATE && st_pend) {
            issue_o_store(st_row, st_h, st_b);
            st_pend = false;
        }
    }
    /* OTMA: this warp's last O store has landed before the CTA (and its
     * shared memory) goes */
    __device__ __forceinline__ void drain() {
        flush_o_store();
        if (C::OTMA && lane == 0) bulk_wait_all();
    }
    /* OTMA: O / l of this warp's 16 rows (erow + 16 warp ..) through its
     * staging buffer and a TMA store; inv: 1 / l of rows r0 and r0 + 8 */
    __device__ __forceinline__ void store_o_tma(const float (&o)[C::PV_N / 2], const float (&inv)[2], int eb, int eh,
                                                int erow) {
        if constexpr (C::OTMA) {
            flush_o_store();
            uint8_t *stage = smem + C::OFF_OST + (wg * 4 + warp) * C::OST_WARP_BYTES;
            const uint32_t sbase = smem_u32(stage);
            /* this lane's row address: matrix j = lane / 8 of each x4 is
             * (column block i + j / 2, rows 8 (j % 2) ..) */
            const int mrow = 8 * ((lane >> 3) & 1) + (lane & 7);
            auto packed = [&](int i, int r) {
                const float lo = o[4 * i + 2 * r] * inv[r], hi = o[4 * i + 2 * r + 1] * inv[r];
                return C::BF16 ? pack_bf16x2(lo, hi) : pack_f16x2(lo, hi);
            };
            if (lane == 0) bulk_wait_read_all(); /* the previous tile's store has read the buffer */
            __syncwarp();
#pragma unroll
            for (int i = 0; i < C::DV / 8; i += 2) {
                const int ib = i + (lane >> 4);
                const uint32_t addr = sbase + (ib / 8) * 2048 + mrow * 128 + (((ib % 8) ^ (mrow & 7)) << 4);
                stsm_x4(addr, packed(i, 0), packed(i, 1), packed(i + 1, 0), packed(i + 1, 1));
            }
            fence_async_shared(); /* visible to the TMA unit (async proxy) */
            __syncwarp();
            if (C::OTMA_LATE) {
                st_pend = true;
                st_row = erow + 16 * warp;
                st_h = eh;
                st_b = eb;
            } else {
                issue_o_store(erow + 16 * warp, eh, eb);
            }
        } else {
            (void)o, (void)inv, (void)eb, (void)eh, (void)erow;
        }
    }
    /* row r0 + 8 r of a finished tile: its sum over the quad, the LSE
     * written, and 1 / l returned (FP8: osc / l, osc the V scale O is in
     * units of; rmax in log2 units and P offset by 2^8, fwd_softmax.cuh) */
    __device__ __forceinline__ float finish_row(int r, const float (&rmax)[2], const float (&rsum)[2], int eb, int eh,
                                                int erow, float osc) const {
        if constexpr (C::LOCAL && !C::FP8) {
            if (loc->sink) return finish_row_sink(r, rmax, rsum, eb, eh, erow);
        }
        const float l = fwd_quad_sum(rsum[r]);
        /* l == 0: the row sees no key (LSE -inf, O 0); a NaN l (NaN or Inf in
         * its inputs) gives NaN for both, as the CPU engine does */
        const float inv = C::FP8 ? lse_finish_scale(l, osc) : lse_finish_scale(l);
        const int row = erow + r0 + 8 * r;
        if (p.lse && q4 == 0 && row_in(row))
            p.lse[lse_index(eb, eh, row)] = C::FP8 ? lse_finish_lse(l, rmax[r] - 8.f, 0.6931471805599453f)
                                                   : lse_finish_lse(l, rmax[r], p.softmax_scale);
        return inv;
    }
    /* LOCAL with a learnable sink (fattn_fwd_args; the CPU engine's
     * arithmetic): the sink's exp(sink - M) joins the row sum, M = max(row
     * max, sink) in natural-log units, and the LSE includes it; a row that
     * saw no key gets O = 0 and LSE = sink.  A NaN sink: NaN sum, NaN row. */
    __device__ __forceinline__ float finish_row_sink(int r, const float (&rmax)[2], const float (&rsum)[2], int eb,
                                                     int eh, int erow) const {
        const float l = fwd_quad_sum(rsum[r]);
        float inv, lse;
        lse_finish_sink(l, rmax[r], p.softmax_scale, loc->sink + eh, inv, lse);
        const int row = erow + r0 + 8 * r;
        if (p.lse && q4 == 0 && row_in(row)) p.lse[lse_index(eb, eh, row)] = lse;
        return inv;
    }
    /* O / l and LSE of a finished tile (rows erow + r0, + 8 of head eh, batch eb) */
    __device__ __forceinline__ void store(const float (&o)[C::PV_N / 2], const float (&rmax)[2], const float (&rsum)[2],
                                          int eb, int eh, int erow, float osc = 1.f) {
        if (C::OTMA && p.o_wide == 2) {
            float inv[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) inv[r] = finish_row(r, rmax, rsum, eb, eh, erow, osc);
            store_o_tma(o, inv, eb, eh, erow);
            return;
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float inv = finish_row(r, rmax, rsum, eb, eh, erow, osc);
            const int row = erow + r0 + 8 * r;
            const bool row_ok = row_in(row); /* the same for the 4 lanes of a quad */
            uint8_t *orow = o_row(eb, eh, row);
            /* columns 8i + 2*q4, +1 of this row, packed */
            auto packed = [&](int i) {
                const float lo = o[4 * i + 2 * r] * inv, hi = o[4 * i + 2 * r + 1] * inv;
                return C::BF16 ? pack_bf16x2(lo, hi) : pack_f16x2(lo, hi);
            };
            if (C::OSTORE == 16 && p.o_wide) {
                /* a quad holds 32 columns as a 4x4 matrix of packed pairs
                 * (lane, group): transpose it with two xor-shuffle steps
                 * (2x2 blocks across lanes ^2, then within blocks across
                 * ^1) so each lane owns 8 adjacent columns, one 16-byte
                 * store instead of four 4-byte ones */
#pragma unroll
                for (int j = 0; j < C::DV / 32; ++j) {
                    uint32_t m0 = packed(4 * j), m1 = packed(4 * j + 1), m2 = packed(4 * j + 2), m3 = packed(4 * j + 3);
                    const bool lo_half = (q4 & 2) == 0, even = (q4 & 1) == 0;
                    uint32_t s0 = lo_half ? m2 : m0, s1 = lo_half ? m3 : m1;
                    s0 = __shfl_xor_sync(0xffffffffu, s0, 2);
                    s1 = __shfl_xor_sync(0xffffffffu, s1, 2);
                    if (lo_half) { m2 = s0; m3 = s1; } else { m0 = s0; m1 = s1; }
                    uint32_t t0 = even ? m1 : m0, t1 = even ? m3 : m2;
                    t0 = __shfl_xor_sync(0xffffffffu, t0, 1);
                    t1 = __shfl_xor_sync(0xffffffffu, t1, 1);
                    if (even) { m1 = t0; m3 = t1; } else { m0 = t0; m2 = t1; }
                    if (row_ok) *(uint4 *)(orow + 16 * (4 * j + q4)) = make_uint4(m0, m1, m2, m3);
                }
            } else if (row_ok) {
#pragma unroll
                for (int i = 0; i < C::DV / 8; ++i) *(uint32_t *)(orow + 2 * (8 * i + 2 * q4)) = packed(i);
            }
        }
    }
    /* every row of this warpgroup sees no key: O = 0, LSE = -inf */
    __device__ __forceinline__ void store_empty(int eb, int eh, int row_base) const {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = row_base + r0 + 8 * r;
            if (!row_in(row)) continue;
            float lse = -INFINITY;
            if constexpr (C::LOCAL && !C::FP8) /* a row with no key: LSE = the sink */
                if (loc->sink) lse = __ldg(loc->sink + eh);
            if (p.lse && q4 == 0) p.lse[lse_index(eb, eh, row)] = lse;
            uint8_t *orow = o_row(eb, eh, row);
            for (int i = 0; i < C::DV / 8; ++i) *(uint32_t *)(orow + 2 * (8 * i + 2 * q4)) = 0u;
        }
    }
    /* SPLIT: a piece of tile t (keys split over workers) is finished: its
     * partial O, row max and row sum go to this worker's slot, each warp
     * counts itself on its tile's counter, and the warp that completes the
     * count merges every piece from the workspace, in worker order, and
     * writes the tile.  o is the merge's scratch afterwards. */
    __device__ __forceinline__ void split_finish(float (&o)[C::PV_N / 2], const float (&rmax)[2], const float (&rsum)[2],
                                                 int t, int eb, int eh, int erow) {
        if constexpr (C::SPLIT) {
            constexpr int NC = C::NC;
            const int rank = t % C::CLUSTER, wt = t / C::CLUSTER, rel = wt - sp.first;
            const int w_first = sp.owners[rel] & 0xffff, w_last = sp.owners[rel] >> 16;
            const int self = (int)blockIdx.x / C::CLUSTER;
            constexpr int CH = C::DV / 8 + 1; /* float4 per thread: O, then (max r0, max r0+8, sum, sum) */
            /* worker x's piece of this tile: slot 0 if x's range starts in it, else 1 */
            auto slot = [&](int x) {
                const int sl = sp.tile[x] == wt ? 0 : 1;
                return sp.ws + ((((size_t)x * 2 + sl) * C::CLUSTER + rank) * NC + wg) * CH * 128 + tid;
            };
            float l[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) l[r] = fwd_quad_sum(rsum[r]);
            {
                float4 *dst = slot(self);
#pragma unroll
                for (int c = 0; c < C::DV / 8; ++c)
                    __stcg(dst + c * 128, make_float4(o[4 * c], o[4 * c + 1], o[4 * c + 2], o[4 * c + 3]));
                __stcg(dst + (CH - 1) * 128, make_float4(rmax[0], rmax[1], l[0], l[1]));
            }
            __threadfence();
            __syncwarp();
            unsigned *cnt = sp.count + (((size_t)rel * C::CLUSTER + rank) * NC + wg) * 4 + warp;
            unsigned done = 0;
            if (lane == 0) done = atomicAdd(cnt, 1u);
            done = __shfl_sync(0xffffffffu, done, 0);
            if (done != (unsigned)(w_last - w_first)) return; /* a later piece merges */
            __threadfence();
            if (lane == 0) *cnt = 0u; /* zero for the next launch */
            /* every piece, this one too, is merged from the workspace in
             * worker order, so the result does not depend on which piece
             * finished last: identical calls give identical bits (v36) */
            float mm[2] = {-INFINITY, -INFINITY};
            l[0] = l[1] = 0.f;
#pragma unroll
            for (int i = 0; i < C::PV_N / 2; ++i) o[i] = 0.f;
            for (int x = w_first; x <= w_last; ++x) {
                const float4 *src = slot(x);
                const float4 ml = __ldcg(src + (CH - 1) * 128);
                const float mx[2] = {ml.x, ml.y}, lx[2] = {ml.z, ml.w};
                float fa[2], fb[2];
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const float mn = lse_running_max(mm[r], mx[r]);
                    fa[r] = lse_rescale(mm[r], mn, c2);
                    fb[r] = lse_rescale(mx[r], mn, c2);
                    l[r] = lse_rescale_add(l[r], fa[r], lx[r], fb[r]);
                    mm[r] = mn;
                }
#pragma unroll
                for (int c = 0; c < C::DV / 8; ++c) {
                    const float4 v = __ldcg(src + c * 128);
                    o[4 * c + 0] = lse_rescale_add(o[4 * c + 0], fa[0], v.x, fb[0]);
                    o[4 * c + 1] = lse_rescale_add(o[4 * c + 1], fa[0], v.y, fb[0]);
                    o[4 * c + 2] = lse_rescale_add(o[4 * c + 2], fa[1], v.z, fb[1]);
                    o[4 * c + 3] = lse_rescale_add(o[4 * c + 3], fa[1], v.w, fb[1]);
                }
            }
            /* store() sums its row sums over the quad */
            const float lq[2] = {q4 == 0 ? l[0] : 0.f, q4 == 0 ? l[1] : 0.f};
            store(o, mm, lq, eb, eh, erow);
        } else {
            (void)o, (void)rmax, (void)rsum, (void)t, (void)eb, (void)eh, (void)erow;
        }
    }
};
