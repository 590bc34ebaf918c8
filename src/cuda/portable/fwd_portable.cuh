/* fwd_portable.cuh - the portable 16-bit forward (issue 41): FlashAttention-2's
 * design on what every NVIDIA GPU from sm_80 on has (mma.sync m16n8k16,
 * cp.async, ldmatrix).  One CTA per (query tile, head, batch entry); each warp
 * owns MT x 16 query rows, so the softmax's row statistics live in one quad
 * of lanes and no warp waits for another between the two products; with MT
 * 2 (FA2's 32 rows a warp at d64 / d128) each K and V fragment a warp loads
 * by ldmatrix feeds two MMAs, which halves the shared-memory reads per FLOP
 * (16 rows a warp read as much as the MMAs could use: perf-notes p4).
 *
 *   Q tile [BM = 16 MT NW][D] -> shared once; K, V blocks [BN][D] through an
 *   NS-slot cp.async ring (block n + NS - 1 is in flight while block n is
 *   used).  Per key block: S = Q K^T (ldmatrix of Q and K, fp32 accumulators),
 *   scaled into log2 units, masked (sequence end, causal diagonal) on the
 *   blocks that need it, running max per row (quad shuffles), P = exp2(S - m)
 *   rounded to 16 bits in registers and used as the A operand of O += P V
 *   (V through ldmatrix.trans).  O / l and the LSE at the end.
 *
 * Shared memory rows are D 16-bit elements, 16-byte chunks XOR-swizzled by
 * row % 8 so that ldmatrix's eight rows hit eight bank groups.  The kernel
 * reads q, k, v by their strides (head dim contiguous, rows 16-byte aligned:
 * entry.cu checks) and writes o with 4-byte stores (entry.cu checks that o
 * allows them). */
#pragma once
#include <math.h>
#include <stdint.h>

#include "../common/lse_combine.cuh"
#include "../common/varlen.cuh"
#include "mma_sm80.cuh"

/* What the kernel reads, filled by fwd_portable_launch (fwd_portable.cu). */
struct PortableFwdParams {
    const uint16_t *q, *k, *v;
    uint16_t *o;
    float *lse; /* NULL: not written */
    int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, o_sb, o_ss, o_sh; /* elements */
    int seqlen_q, seqlen_k; /* fixed length: the lengths; varlen: the longest */
    int heads_q, group;     /* group = heads_q / heads_kv */
    const int *cu_q, *cu_k; /* both or neither */
    int total_q, total_k;   /* varlen: the packed rows */
    const int *seqused_k;   /* NULL or int32[batch] */
    float scale_log2;       /* softmax_scale x log2(e); softcap: cap x log2(e) */
    int causal;
    /* The variants, read by fwd_portable_local_kernel only (appended, so the
     * other fields keep their offsets): the window as hopper_window_of gives
     * it (causal folded into win_right = 0, -1 unbounded), key j visible to
     * row i iff i + off - win_left <= j <= i + off + win_right; softcap: the
     * raw score x becomes tanh(cap_b x), cap_b = scale / cap, and scale_log2
     * is cap log2(e) (the Hopper forward's folding, perf-notes f8), 0 off;
     * sink: NULL or float[heads_q], natural-log units. */
    int win_left, win_right;
    float cap_b;
    const float *sink;
};

/* The tile shape of a head dim: warps, 16-row tiles per warp (rows per CTA
 * 16 MT NW), keys per block, ring slots; NS is the larger of two instances,
 * the launcher takes the smaller where the device's shared memory per block
 * is below the larger's (sm_86/89: 99 KB).  d192 and d256 keep 16 rows a
 * warp: two tiles' O accumulators do not fit beside S (FA2's choice too).
 * NW_BIG (0: none): the wider CTA, with the NS ring, taken where it fits. */
template <int D> struct PortableCfg;
template <> struct PortableCfg<64> { static constexpr int NW = 4, MT = 2, BN = 64, NS = 3, NS_SMALL = 2, NW_BIG = 0; };
/* d96: FA2's 128 rows; keys 32 a block, as d128 (64 spilled 64 bytes on sm_80); 60 / 48 KB */
template <> struct PortableCfg<96> { static constexpr int NW = 4, MT = 2, BN = 32, NS = 3, NS_SMALL = 2, NW_BIG = 0; };
template <> struct PortableCfg<128> { static constexpr int NW = 4, MT = 2, BN = 32, NS = 3, NS_SMALL = 2, NW_BIG = 0; };
template <> struct PortableCfg<192> { static constexpr int NW = 8, MT = 1, BN = 64, NS = 2, NS_SMALL = 1, NW_BIG = 0; };
/* d256 at 8 warps (FA2's 128-row CTA; 4 warps leave one per scheduler: p7) needs 192 KB: Hopper, not A100 */
template <> struct PortableCfg<256> { static constexpr int NW = 4, MT = 1, BN = 64, NS = 2, NS_SMALL = 1, NW_BIG = 8; };

/* Shared memory of head dim D's forward at NW warps and an NS-slot ring:
 * the Q tile (16 MT NW rows) and NS K and V blocks, rows of D 16-bit
 * elements.  The launcher's choice and entry.cu's refusal both use it. */
template <int D, int NW, int NS> constexpr int portable_fwd_smem_bytes() {
    using C = PortableCfg<D>;
    return (16 * C::MT * NW + 2 * NS * C::BN) * D * 2;
}

namespace portable {

using namespace sm80;

/* Byte offset of element (r, c) in a swizzled [rows][D] tile; c a multiple of 8
 * or any column inside the chunk.  D a multiple of 64: chunk ^ (r % 8) within
 * each 128-byte group.  D = 96 (FA2's layout when D % 64 != 0): 64-byte groups,
 * chunk ^ f(r % 8), f(x) = (x ^ x / 4) % 4, which maps the 8 rows of an
 * ldmatrix (192-byte row stride) onto 8 bank groups too (f of the even rows
 * 0, 2, 1, 3; of the odd rows 1, 3, 0, 2). */
template <int D> __device__ __forceinline__ uint32_t swz(int r, int c) {
    if constexpr (D % 64 == 0) {
        return (uint32_t)(r * D + ((((c >> 3) ^ (r & 7))) << 3) + (c & 7)) * 2u;
    } else {
        static_assert(D == 96, "head dim");
        const int f = (r ^ ((r >> 2) & 1)) & 3;
        return (uint32_t)(r * D + ((c >> 5) << 5) + ((((c >> 3) & 3) ^ f) << 3) + (c & 7)) * 2u;
    }
}

/* The address of the 16-byte chunk pair j (columns 16j .. 16j + 15) that a
 * lane reads with ldmatrix, in row `row_bytes` / (2 D) of a swizzled tile:
 * every ldmatrix row of a lane has the same row % 8 (= lane % 8), so the
 * swizzled chunk is 2j ^ y with y = lane % 8 ^ (the lane's half chunk), a
 * per-lane constant: four distinct values over j, the rest immediate
 * offsets.  (Swizzled per call, the addresses were hoisted one register
 * each: 227 registers at d128, spills at d256.)  D is the tile's row length
 * (64 for the backward's P^T, dS^T); at D = 96, two distinct values. */
template <int D> __device__ __forceinline__ uint32_t ldsm_addr(uint32_t tile, uint32_t row_bytes, int j, uint32_t y) {
    if constexpr (D % 64 == 0) {
        return tile + row_bytes + (uint32_t)(j >> 2) * 128u + ((((uint32_t)(j & 3) << 1) ^ y) << 4);
    } else { /* D = 96: y = x ^ h (x = lane % 8) gives h ^ f(x) = (y ^ y / 4) % 4 */
        const uint32_t y4 = (y ^ (y >> 2)) & 3u;
        return tile + row_bytes + (uint32_t)(j >> 1) * 64u + ((((uint32_t)(j & 1) << 1) ^ y4) << 4);
    }
}

/* R rows of D elements from `src` (row stride in elements) into the swizzled
 * tile at shared address `dst`; rows >= nvalid become zeros.  Thread tid
 * copies one 16-byte column chunk of every (NT / CPR)-th row; the loop is
 * kept rolled: unrolled, its hoisted row addresses cost d256 its spills. */
template <int D, int R, int NT>
__device__ __forceinline__ void load_tile(uint32_t dst, const uint16_t *src, int64_t stride, int nvalid, int tid) {
    constexpr int CPR = D / 8; /* 16-byte chunks per row */
    if constexpr (NT % CPR == 0) {
        constexpr int STEP = NT / CPR; /* rows per pass, one fixed chunk per thread */
        const int c = (tid % CPR) * 8;
        const uint16_t *s = src + c;
#pragma unroll 1
        for (int r = tid / CPR; r < R; r += STEP) {
            const bool ok = r < nvalid;
            cp_async_16(dst + swz<D>(r, c), ok ? s + (int64_t)r * stride : src, ok);
        }
    } else { /* d96, d192: 12, 24 chunks a row */
#pragma unroll 1
        for (int i = tid; i < R * CPR; i += NT) {
            const int r = i / CPR, c = (i % CPR) * 8;
            const bool ok = r < nvalid;
            cp_async_16(dst + swz<D>(r, c), ok ? src + (int64_t)r * stride + c : src, ok);
        }
    }
}

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

} // namespace portable

/* The epilogue: O / l, LSE = (m + log2 l) ln 2 of the thread's rows r_lo +
 * 16 mt (+ 8); a row with l = 0 (no key, or every score -inf) gets O = 0 and
 * LSE = -inf; NaN stays NaN.  LOCAL with a sink: lse_finish_sink (the
 * Hopper epilogue's and the CPU engine's arithmetic: O = 0 and LSE = sink
 * for a row with no key). */
template <int MT, int NT_O, bool BF16, bool LOCAL = false>
__device__ __forceinline__ void fwd_portable_store(const PortableFwdParams &p, int b, int h, int q0, int len_q, int r_lo,
                                                   int t, const float (&acc)[MT][NT_O][4], const float (&row_max)[MT][2],
                                                   const float (&row_sum)[MT][2]) {
    using namespace portable;
    const int64_t bo = p.cu_q ? 0 : (int64_t)b;
#pragma unroll
    for (int mr = 0; mr < 2 * MT; ++mr) {
        const int mt = mr / 2, r = mr % 2;
        const float l = quad_sum(row_sum[mt][r]);
        const int row = r_lo + 16 * mt + 8 * r;
        if (row >= len_q) continue;
        const bool empty = l == 0.f;
        float inv = empty ? 0.f : 1.f / l, lse_sink = 0.f;
        const bool sunk = LOCAL && p.sink != nullptr;
        if (sunk) lse_finish_sink(l, row_max[mt][r], 0.69314718055994531f, p.sink + h, inv, lse_sink);
        uint16_t *og = p.o + bo * p.o_sb + (int64_t)(q0 + row) * p.o_ss + (int64_t)h * p.o_sh;
#pragma unroll
        for (int j = 0; j < NT_O; ++j) {
            const uint32_t w = empty ? 0u : pack2<BF16>(acc[mt][j][2 * r] * inv, acc[mt][j][2 * r + 1] * inv);
            *reinterpret_cast<uint32_t *>(og + 8 * j + 2 * t) = w;
        }
        if (p.lse && t == 0) {
            const float lse = sunk    ? lse_sink
                              : empty ? -INFINITY
                                      : (row_max[mt][r] + __log2f(l)) * 0.69314718055994531f;
            const int64_t at = p.cu_q ? (int64_t)h * p.total_q + q0 + row
                                      : ((int64_t)b * p.heads_q + h) * p.seqlen_q + row;
            p.lse[at] = lse;
        }
    }
}

/* LOCAL: the window of a tile as bounds on key - query, dl <= j - i <= dr
 * (an unbounded side a bound every pair meets; entry.cu keeps seqlen_q +
 * seqlen_k < 2^30, so no sum overflows), and the key blocks it visits: from
 * the first row's first visible key to the last row's last one (the Hopper
 * forward's fwd_window_diag and fwd_tile_blocks).  K, V, len_k and the
 * bounds are then moved to the first visited block, so that the loop runs
 * over blocks 0 .. n_blocks - 1 as without a window. */
template <int BN>
__device__ __forceinline__ void fwd_portable_window(const PortableFwdParams &p, int len_q, int m0, int row_last,
                                                    int &len_k, int &n_blocks, int &dl, int &dr, const uint16_t *&kg,
                                                    const uint16_t *&vg) {
    const int off = len_k - len_q;
    dl = p.win_left < 0 ? -len_q : off - p.win_left;
    dr = p.win_right < 0 ? len_k : off + p.win_right;
    const int first = m0 + dl, last = row_last + dr;
    const int lo = first <= 0 ? 0 : first / BN;
    const int hi = last < 0 ? 0 : min(last / BN + 1, (len_k + BN - 1) / BN);
    n_blocks = hi > lo ? hi - lo : 0;
    const int shift = lo * BN;
    kg += (int64_t)shift * p.k_ss;
    vg += (int64_t)shift * p.v_ss;
    len_k -= shift, dl -= shift, dr -= shift;
}

/* LOCAL: the scores of the key block at kbase into log2 units, softcap
 * first (a uniform branch: tanh.approx.f32, as the Hopper forward's
 * fwd_softcap), masked to -inf past the sequence and outside the window
 * (dl <= key - row <= dr) on the blocks that cross an edge for some row of
 * this warp (rows w0 .. w0 + 16 MT - 1; the Hopper FwdMask::apply_window's
 * test, per warp). */
template <int MT, int NT_S>
__device__ __forceinline__ void fwd_portable_local_scores(float (&s)[MT][NT_S][4], const PortableFwdParams &p,
                                                          int kbase, int len_k, int r_lo, int t, int w0, int dl,
                                                          int dr) {
    using namespace portable;
    if (p.cap_b != 0.f) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < NT_S; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[mt][j][e] = tanh_approx(s[mt][j][e] * p.cap_b);
    }
    const bool need_mask =
        kbase + 8 * NT_S > len_k || kbase + 8 * NT_S - 1 - w0 > dr || kbase - (w0 + 16 * MT - 1) < dl;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NT_S; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[mt][j][e] *= p.scale_log2;
                if (need_mask) {
                    const int key = kbase + 8 * j + 2 * t + (e & 1), row = r_lo + 16 * mt + (e >> 1) * 8;
                    const int d = key - row;
                    if (!(key < len_k && d >= dl && d <= dr)) s[mt][j][e] = -INFINITY;
                }
            }
}

/* One CTA's query tile: the kernels below (LOCAL: the variants). */
template <int D, int NW, int BN, int NS, bool BF16, int MT, bool LOCAL>
__device__ __forceinline__ void fwd_portable_tile(const PortableFwdParams &p) {
    using namespace portable;
    constexpr int BM = 16 * MT * NW, NT = NW * 32;
    constexpr int NT_S = BN / 8, NT_O = D / 8; /* 8-column accumulator tiles of S and O per warp */
    /* the swizzle permutes chunks within 128-byte groups of a row (64-byte at d96) */
    static_assert((D % 64 == 0 || D == 96) && BN % 16 == 0, "tile shape");
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t sQ = smem_u32(smem);
    const uint32_t sK = sQ + BM * D * 2, sV = sK + NS * BN * D * 2;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int m_block = gridDim.x - 1 - blockIdx.x; /* the longest causal tiles first */
    const int h = blockIdx.y, b = blockIdx.z, hk = h / p.group;

    /* this sequence's rows */
    int q0 = 0, len_q = p.seqlen_q, k0 = 0, len_k = p.seqlen_k;
    if (p.cu_q) {
        varlen_rows(p.cu_q, b, p.total_q, p.seqlen_q, q0, len_q);
        varlen_rows(p.cu_k, b, p.total_k, p.seqlen_k, k0, len_k);
    }
    if (p.seqused_k) len_k = min(len_k, max(__ldg(p.seqused_k + b), 0));
    const int m0 = m_block * BM;
    if (m0 >= len_q) return;
    const int64_t bq = p.cu_q ? 0 : (int64_t)b; /* varlen: the batch entry is in q0/k0 */
    const uint16_t *qg = p.q + bq * p.q_sb + (int64_t)(q0 + m0) * p.q_ss + (int64_t)h * p.q_sh;
    const uint16_t *kg = p.k + bq * p.k_sb + (int64_t)k0 * p.k_ss + (int64_t)hk * p.k_sh;
    const uint16_t *vg = p.v + bq * p.v_sb + (int64_t)k0 * p.v_ss + (int64_t)hk * p.v_sh;

    /* key blocks this tile visits: causal stops at the last row's diagonal */
    const int off = len_k - len_q; /* bottom-right aligned: key j visible to row i iff j <= i + off */
    const int row_last = min(m0 + BM, len_q) - 1;
    int n_blocks = (len_k + BN - 1) / BN;
    if (p.causal) {
        const int last_key = row_last + off;
        n_blocks = last_key < 0 ? 0 : min(n_blocks, last_key / BN + 1);
    }
    int dl = 0, dr = 0; /* LOCAL: the window, from the first visited block's first key */
    if constexpr (LOCAL) fwd_portable_window<BN>(p, len_q, m0, row_last, len_k, n_blocks, dl, dr, kg, vg);

    float acc[MT][NT_O][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NT_O; ++j) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
    float row_max[MT][2], row_sum[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) row_max[mt][0] = row_max[mt][1] = -INFINITY, row_sum[mt][0] = row_sum[mt][1] = 0.f;
    /* this thread's rows of tile mt: r_lo + 16 mt and + 8 (in the sequence) */
    const int r_lo = m0 + warp * 16 * MT + g;
    /* ldmatrix rows and swizzle constants of this lane (ldsm_addr): Q and V
     * take matrices (rows 0-7, 8-15) x (chunk 0, 1), K (chunk 0, 1) x (rows) */
    const uint32_t x7 = lane & 7, hi3 = (lane >> 3) & 1, hi4 = lane >> 4;
    const uint32_t q_row = (warp * 16 * MT + x7 + hi3 * 8) * D * 2, q_y = x7 ^ hi4; /* + 16 mt rows */
    const uint32_t k_row = (x7 + hi4 * 8) * D * 2, k_y = x7 ^ hi3;
    const uint32_t v_row = (x7 + hi3 * 8) * D * 2, v_y = x7 ^ hi4;

    if (n_blocks > 0) {
        load_tile<D, BM, NT>(sQ, qg, p.q_ss, len_q - m0, tid);
        cp_async_commit();
#pragma unroll
        for (int s = 0; s < NS - 1; ++s) {
            if (s < n_blocks) {
                const int nv = len_k - s * BN;
                load_tile<D, BN, NT>(sK + s * BN * D * 2, kg + (int64_t)s * BN * p.k_ss, p.k_ss, nv, tid);
                load_tile<D, BN, NT>(sV + s * BN * D * 2, vg + (int64_t)s * BN * p.v_ss, p.v_ss, nv, tid);
            }
            cp_async_commit();
        }
    }

    for (int n = 0; n < n_blocks; ++n) {
        {
            const int nn = n + NS - 1, slot = nn % NS;
            if (nn < n_blocks) {
                const int nv = len_k - nn * BN;
                load_tile<D, BN, NT>(sK + slot * BN * D * 2, kg + (int64_t)nn * BN * p.k_ss, p.k_ss, nv, tid);
                load_tile<D, BN, NT>(sV + slot * BN * D * 2, vg + (int64_t)nn * BN * p.v_ss, p.v_ss, nv, tid);
            }
            cp_async_commit();
        }
        cp_async_wait<NS - 1>();
        __syncthreads();
        const uint32_t kS = sK + (n % NS) * BN * D * 2, vS = sV + (n % NS) * BN * D * 2;

        /* S = Q K^T for this warp's MT x 16 rows: each K fragment feeds MT tiles */
        float s[MT][NT_S][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < NT_S; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t qa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) ldsm_x4(qa[mt], ldsm_addr<D>(sQ, q_row + mt * 16 * D * 2, kk, q_y));
#pragma unroll
            for (int nn = 0; nn < BN / 16; ++nn) {
                uint32_t kb[4];
                ldsm_x4(kb, ldsm_addr<D>(kS + nn * 16 * D * 2, k_row, kk, k_y));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma_m16n8k16<BF16>(s[mt][2 * nn], qa[mt], kb[0], kb[1]);
                    mma_m16n8k16<BF16>(s[mt][2 * nn + 1], qa[mt], kb[2], kb[3]);
                }
            }
        }

        /* scale into log2 units; mask keys past the sequence and past the diagonal (LOCAL: the window) */
        const int kbase = n * BN;
        if constexpr (LOCAL) {
            fwd_portable_local_scores<MT, NT_S>(s, p, kbase, len_k, r_lo, t, r_lo - g, dl, dr);
        } else {
            const bool need_mask = kbase + BN > len_k || (p.causal && kbase + BN - 1 > m0 + off);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int j = 0; j < NT_S; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        s[mt][j][e] *= p.scale_log2;
                        if (need_mask) {
                            const int key = kbase + 8 * j + 2 * t + (e & 1), row = r_lo + 16 * mt + (e >> 1) * 8;
                            if (key >= len_k || (p.causal && key > row + off)) s[mt][j][e] = -INFINITY;
                        }
                    }
        }

        /* running max; P = exp2(S - m); rescale O and l by exp2(m_old - m_new) */
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float mx = row_max[mt][r];
#pragma unroll
                for (int j = 0; j < NT_S; ++j) mx = fmaxf(mx, fmaxf(s[mt][j][2 * r], s[mt][j][2 * r + 1]));
                mx = quad_max(mx);
                /* a row with every score so far -inf subtracts 0, not -inf (no inf - inf) */
                const float m_use = mx == -INFINITY ? 0.f : mx;
                const float alpha = exp2_approx(row_max[mt][r] - m_use);
                row_max[mt][r] = mx;
                float sum = 0.f;
#pragma unroll
                for (int j = 0; j < NT_S; ++j) {
                    s[mt][j][2 * r] = exp2_approx(s[mt][j][2 * r] - m_use);
                    s[mt][j][2 * r + 1] = exp2_approx(s[mt][j][2 * r + 1] - m_use);
                    sum += s[mt][j][2 * r] + s[mt][j][2 * r + 1];
                }
                row_sum[mt][r] = row_sum[mt][r] * alpha + sum;
#pragma unroll
                for (int j = 0; j < NT_O; ++j) {
                    acc[mt][j][2 * r] *= alpha;
                    acc[mt][j][2 * r + 1] *= alpha;
                }
            }

        /* O += P V: P's accumulator tiles 2kk, 2kk + 1 are the A fragment of keys 16kk .. 16kk + 15 */
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            uint32_t pa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                pa[mt][0] = pack2<BF16>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                pa[mt][1] = pack2<BF16>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                pa[mt][2] = pack2<BF16>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                pa[mt][3] = pack2<BF16>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int dn = 0; dn < D / 16; ++dn) {
                uint32_t vb[4];
                ldsm_x4_trans(vb, ldsm_addr<D>(vS + kk * 16 * D * 2, v_row, dn, v_y));
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma_m16n8k16<BF16>(acc[mt][2 * dn], pa[mt], vb[0], vb[1]);
                    mma_m16n8k16<BF16>(acc[mt][2 * dn + 1], pa[mt], vb[2], vb[3]);
                }
            }
        }
        __syncthreads(); /* every warp is done with this slot before it is refilled */
    }
    cp_async_wait<0>();

    fwd_portable_store<MT, NT_O, BF16, LOCAL>(p, b, h, q0, len_q, r_lo, t, acc, row_max, row_sum);
}

template <int D, int NW, int BN, int NS, bool BF16, int MT = 1>
__global__ void __launch_bounds__(NW * 32, 1) fwd_portable_kernel(const PortableFwdParams p) {
    fwd_portable_tile<D, NW, BN, NS, BF16, MT, false>(p);
}

/* The variants (window, softcap, learnable sink): instances of their own
 * (instances/fwd_portable_local_hdim*.cu), so that the kernels above keep
 * their code. */
template <int D, int NW, int BN, int NS, bool BF16, int MT = 1>
__global__ void __launch_bounds__(NW * 32, 1) fwd_portable_local_kernel(const PortableFwdParams p) {
    fwd_portable_tile<D, NW, BN, NS, BF16, MT, true>(p);
}
