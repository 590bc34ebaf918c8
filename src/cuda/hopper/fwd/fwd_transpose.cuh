/* fwd_transpose.cuh - FP8: warps 1-3 of the producer warpgroup turn each V
 * block that TMA landed row-major (keys x head dim, e4m3) into the K-major
 * V^T the PV GEMM needs (FP8 wgmma has no transposed B, HOPPER-PTX §1).
 *
 * A unit is 16 keys x 32 columns: ldmatrix.x4.trans reads four 8x8 b16
 * matrices (keys 0-7 and 8-15 of columns 0-15, then of 16-31); lane (c, q)
 * = (lane / 4, lane % 4) receives key pairs (2q, 2q+1) of column pair
 * (2c, 2c+1) from each; __byte_perm 0x6420 / 0x7531 splits even and odd
 * columns, giving column 2c's keys (2q, 2q+1, 8+2q, 9+2q) in one word; and
 * stmatrix.x4 writes them as bytes 4q..4q+3 of V^T row 2c (and 2c+1, 16+2c,
 * 17+2c).  So within every 16 keys V^T holds them in the order
 * 0 1 8 9 2 3 10 11 4 5 12 13 6 7 14 15: exactly the order in which a
 * thread's score accumulator holds its columns, so P needs no data movement
 * to become the PV GEMM's A fragment (FwdConsumer::convert_p; HOPPER-PTX §3).
 *
 * The transposers walk the ring positions in the producer's order: wait for
 * V (full_vraw) and for the V^T stage (empty_v, released by the consumers),
 * transpose, make the writes visible to wgmma (fence.proxy.async), arrive on
 * full_v and give the row-major stage back (empty_vraw).  The producer ends
 * them with a plain arrive whose ring position it writes in the end flag. */
#pragma once
#include "fwd_pipeline.cuh"

/* byte offset of (row, byte col) in a tile of W-byte rows with the W-byte
 * swizzle (W = 128: 16-byte chunk ^= row % 8; W = 64: ^= (row / 2) % 4),
 * the tile starting on a swizzle-atom boundary */
template <int W>
__device__ __forceinline__ uint32_t swz_offset(int row, int col) {
    const uint32_t lin = (uint32_t)(row * W + col);
    return lin ^ (((lin >> 7) & (W == 128 ? 7u : 3u)) << 4);
}

template <class C>
struct FwdTransposer {
    static constexpr int D = C::D, BN = C::BN, STAGES = C::STAGES;
    static constexpr int UNITS = (BN / 16) * (D / 32);
    const FwdSmem<C> &sm;
    int tw, lane; /* transposer warp 0..2 */

    /* Unit u of a block: 16 keys (group kg) x 32 columns (group dg).  Both
     * swizzles XOR a row's 16-byte chunk with bits of the row that are a
     * lane's own whatever the unit, and the stage bases are 1024-byte
     * aligned, so a unit's address is (stage + lane offset) XOR a constant
     * chunk (32 dg within the row for ldmatrix, 16 kg within 128 keys for
     * stmatrix) plus a constant: one LOP3 each, two lane registers (f7) */
    static constexpr int KG = BN / 16, ROWDG = C::SW / 32; /* column groups per swizzled row */
    struct Lanes {
        uint32_t ld, st;
    };
    __device__ __forceinline__ Lanes lanes() const {
        const int j = lane >> 3, i = lane & 7;
        /* ldmatrix: lane gives row i of matrix j: key 16 kg + 8 (j % 2) + i, columns 32 dg + 16 (j / 2) .. + 15;
         * stmatrix: lane gives row i of matrix j: V^T row (column of V) 32 dg + 16 (j / 2) + 2 i + j % 2,
         * keys 16 kg .. + 15 */
        return Lanes{swz_offset<C::SW>(8 * (j & 1) + i, 16 * (j >> 1)), swz_offset<128>(16 * (j >> 1) + 2 * i + (j & 1), 0)};
    }
    template <int U>
    __device__ __forceinline__ void load(uint32_t (&r)[4], uint32_t ld) const {
        constexpr int kg = U % KG, dg = U / KG;
        constexpr uint32_t flip = 32 * (dg % ROWDG), add = (dg / ROWDG) * BN * C::SW + 16 * kg * C::SW;
        ldsm_x4_trans(r, (ld ^ flip) + add);
    }
    template <int U>
    __device__ __forceinline__ void store(const uint32_t (&r)[4], uint32_t st) const {
        constexpr int kg = U % KG, dg = U / KG;
        constexpr uint32_t flip = 16 * (kg % 8), add = (kg / 8) * D * 128 + 32 * dg * 128;
        const uint32_t o0 = __byte_perm(r[0], r[1], 0x6420), o1 = __byte_perm(r[0], r[1], 0x7531);
        const uint32_t o2 = __byte_perm(r[2], r[3], 0x6420), o3 = __byte_perm(r[2], r[3], 0x7531);
        stsm_x4((st ^ flip) + add, o0, o1, o2, o3);
    }
    /* transposer warp TW's units TW, TW + 3, ..., unrolled, two loads in flight */
    template <int TW, int U = TW>
    __device__ __forceinline__ void units(uint32_t ld, uint32_t st) const {
        if constexpr (U + 3 < UNITS) {
            uint32_t a[4], b[4];
            load<U>(a, ld);
            load<U + 3>(b, ld);
            store<U>(a, st);
            store<U + 3>(b, st);
            units<TW, U + 6>(ld, st);
        } else if constexpr (U < UNITS) {
            uint32_t a[4];
            load<U>(a, ld);
            store<U>(a, st);
        }
    }
    __device__ __forceinline__ void transpose(int s, const Lanes &l) const {
        /* the stage bases are 1024-byte aligned: adding them keeps the XOR bits */
        const uint32_t ld = smem_u32(sm.vraw_stage(s)) + l.ld, st = smem_u32(sm.v_stage(s)) + l.st;
        if (tw == 0) units<0>(ld, st);
        else if (tw == 1) units<1>(ld, st);
        else units<2>(ld, st);
    }

    __device__ __forceinline__ void run() const {
        const Lanes l = lanes();
        for (int it = 0;; ++it) {
            const int s = ring_stage(it, STAGES);
            const uint32_t ph = ring_phase(it, STAGES);
            /* sleeping waits: spinning warps would take issue slots from the consumers */
            mbar_wait<true>(&sm.full_vraw[s], ph);
            /* the producer's end, at this position: read by the lane that
             * arrives on empty_vraw (so the read is ordered before the
             * producer's next write of the flag) and shared with the warp */
            int end = 0;
            if (lane == 0) end = ld_shared_s32(&sm.end_flag[s]) == it;
            if (__shfl_sync(0xffffffffu, end, 0)) break;
            mbar_wait<true>(&sm.empty_v[s], ph ^ 1);
            transpose(s, l);
            fence_async_shared(); /* V^T is read by wgmma (the async proxy) */
            __syncwarp();
            if (lane == 0) {
                mbar_arrive(&sm.full_v[s]);
                mbar_arrive(&sm.empty_vraw[s]);
            }
        }
    }
};
