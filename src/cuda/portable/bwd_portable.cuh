/* bwd_portable.cuh - the portable 16-bit backward (issue 41): FlashAttention-2's
 * backward on what every NVIDIA GPU from sm_80 on has (mma.sync m16n8k16,
 * cp.async, ldmatrix), beside the forward of fwd_portable.cuh.  One CTA of
 * 8 warps per (key block of BN = 64 keys, kv head, batch entry); K and V
 * stay in shared memory while the CTA loops over the group's query heads
 * and, for each, the query blocks (BM = 64) that see its keys, Q, dO, the
 * LSE and D of block i + NS - 1 in flight (cp.async ring) while block i is used:
 *
 *   1. S^T = K Q^T, dP^T = V dO^T: warp (key group kg, query half qg) takes
 *      16 keys x 32 queries of both; P^T = exp2(S^T scale log2e - LSE2),
 *      dS^T = P^T (dP^T - D) in registers, both stored as 16-bit [key][query]
 *      tiles (the dV and dK products reduce over all 64 queries, which no
 *      one warp holds).
 *   2. dV += P^T dO, dK += dS^T Q: warp (kg, column half dg) owns 16 keys x
 *      D / 2 columns of each in fp32 registers for the whole CTA (GQA: the
 *      group's sum, so dK and dV are written once, with no workspace).
 *   3. dQ += dS K: warp (16-query group, column half) in pieces of <= 64
 *      columns, added to the fp32 workspace tile with atomics in
 *      bwd_dq_index_emaj's order (each add of a warp 128 contiguous
 *      bytes); deterministic: the CTA first waits for its turn on the query
 *      tile's counter (key blocks in order 0, 1, ..., as the Hopper
 *      backward's bwd_dq_turn without SPT).
 *
 * The preprocess (D, LSE in log2 units) and the postprocess (dQ to 16 bits,
 * times softmax_scale) are the Hopper backward's (hopper/bwd/bwd_prepost.cuh),
 * on the same workspace layout (64-row blocks, bwd_layout.cuh).  Shared
 * tiles are swizzled as the forward's (portable::swz, d96's 64-byte groups
 * included); P^T and dS^T rows are 64 elements, one 128-byte group. */
#pragma once
#include "../common/bwd_layout.cuh"
#include "fwd_portable.cuh"

/* What the kernel reads, filled by bwd_portable_launch (bwd_portable.cu). */
struct PortableBwdParams {
    const uint16_t *q, *k, *v, *dout;
    uint16_t *dk, *dv;
    int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, do_sb, do_ss, do_sh; /* elements */
    int64_t dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh;
    float *dq_acc;     /* fp32 64 x D tiles, bwd_dq_index_emaj's order (width D), zeroed */
    const float *lse2; /* per 64-row block: LSE log2 e, +inf where the row saw no key or is padding */
    const float *dsum; /* the same rows: rowsum(dO O) */
    int *dq_sem;       /* deterministic: one counter per dQ tile, zeroed */
    int seqlen_q, seqlen_k; /* fixed length: the lengths; varlen: the longest */
    int heads_q, group, m_blocks; /* m_blocks: fixed length's 64-row blocks per (batch, head) */
    const int *cu_q, *cu_k; /* both or neither */
    int total_q, total_k, rb_total; /* varlen: packed rows, the workspace's blocks per head */
    const int *seqused_q, *seqused_k; /* varlen: NULL, or sequence b's used queries and keys (fattn.h) */
    float scale, scale_log2; /* softmax_scale, x log2(e) */
    int causal, deterministic;
};

/* The tile shape of a head dim: 64 keys a CTA, 64 queries an iteration, 8
 * warps; NS ring slots of Q and dO where the device's shared memory per
 * block holds them, NS_SMALL else (0: none smaller).  Bytes
 * (portable_bwd_smem_bytes): d64 66,560; d96 91,136; d128 115,712 (NS 2) or
 * 82,432 (sm_86/89's 99 KB); d192 164,864 (A100's 163 KB); d256 214,016
 * (H100/H200) or 147,968 (A100); d192 and d256 do not fit sm_86/89.  MINB:
 * CTAs per SM for the register bound (d128 at 2, 128 registers, spills; d96's
 * 64-key kernel runs on 99 KB GPUs only, one CTA an SM there by shared memory).
 * RP_NS: the ring of bwd_portable_rp_kernel (128 keys a CTA,
 * bwd_portable_rp.cuh), taken where it fits (d96: 113 KB, d128: 145 KB; not
 * sm_86/89), 0: none. */
template <int D> struct PortableBwdCfg;
template <> struct PortableBwdCfg<64> { static constexpr int NS = 2, NS_SMALL = 2, MINB = 2, RP_NS = 2; };
template <> struct PortableBwdCfg<96> { static constexpr int NS = 2, NS_SMALL = 2, MINB = 1, RP_NS = 2; };
template <> struct PortableBwdCfg<128> { static constexpr int NS = 2, NS_SMALL = 1, MINB = 1, RP_NS = 2; };
template <> struct PortableBwdCfg<192> { static constexpr int NS = 2, NS_SMALL = 0, MINB = 1, RP_NS = 0; };
template <> struct PortableBwdCfg<256> { static constexpr int NS = 2, NS_SMALL = 1, MINB = 1, RP_NS = 0; };

/* d256's dQ pieces: the width without spills beside its 128 dK, dV
 * accumulators, by ptxas (nvcc 13.0) per target */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PBWD_PW256 64
#else
#define PBWD_PW256 32
#endif

#define PBWD_BM 64
#define PBWD_BN 64
#define PBWD_NW 8

/* K, V; NS x (Q, dO); P^T, dS^T; NS x (LSE2, D) */
template <int D, int NS> constexpr int portable_bwd_smem_bytes() {
    return 2 * PBWD_BN * D * 2 + NS * 2 * PBWD_BM * D * 2 + 2 * PBWD_BN * PBWD_BM * 2 + NS * 2 * PBWD_BM * 4;
}

/* The kernel's compile-time shape: warp roles per phase, shared-memory map. */
template <int D, int NS> struct PbwdShape {
    static constexpr int BM = PBWD_BM, BN = PBWD_BN, NW = PBWD_NW, NT = NW * 32;
    static constexpr int WK = BN / 16;       /* key groups of 16 (phases 1, 2) */
    static constexpr int WQ = NW / WK;       /* query parts of phase 1 = column parts of phase 2 */
    static constexpr int QW = BM / WQ;       /* queries a warp in S^T, dP^T */
    static constexpr int DW = D / WQ;        /* dK, dV columns a warp */
    static constexpr int WM = BM / 16;       /* query groups of phase 3 */
    static constexpr int CW = D / (NW / WM); /* dQ columns a warp */
    /* dQ pieces: <= 32 accumulators live beside dK and dV */
    static constexpr int PW = D == 256 ? PBWD_PW256 : CW <= 64 ? CW : CW % 64 == 0 ? 64 : 48;
    /* d256: S^T, dP^T in two parts of 16 queries (K, V fragments loaded
     * twice) beside the 128 dK, dV accumulators: in one, ptxas spilled on sm_90a */
    static constexpr int NQS = D == 256 ? 2 : 1, QS = QW / NQS;
    static constexpr uint32_t KV_B = BN * D * 2, QT_B = BM * D * 2, PT_B = BN * BM * 2;
    static constexpr uint32_t O_K = 0, O_V = KV_B, O_Q = 2 * KV_B, O_DO = O_Q + NS * QT_B, O_P = O_DO + NS * QT_B,
                              O_DS = O_P + PT_B, O_LSE = O_DS + PT_B, O_DSUM = O_LSE + NS * BM * 4;
    static_assert((D % 64 == 0 || D == 96) && NW % WK == 0 && NW % WM == 0, "tile shape");
    static_assert(DW % 16 == 0 && QS % 16 == 0 && CW % PW == 0 && PW % 16 == 0, "warp tiles");
};

/* Deterministic mode: wait until key blocks 0 .. n_block - 1 have added
 * this query tile (every block before this one sees it if this one does). */
__device__ __forceinline__ void pbwd_wait_turn(const int *sem, int n_block) {
    if (threadIdx.x == 0) {
        int v;
        do {
            asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(sem) : "memory");
        } while (v != n_block);
    }
    __syncthreads();
}

/* dK = softmax_scale dS^T Q and dV of keys 16 kg .. + 15, columns DW qg ..
 * + DW - 1: the group's sums, written once (zeros for keys that no query
 * sees).  k0 is read again (a volatile load: not kept live across the
 * loop, where d256 has no register to spare). */
template <int DW, bool BF16>
__device__ __forceinline__ void pbwd_store(const PortableBwdParams &p, int b, int hk, int n0, int len_k, int kg, int qg,
                                           int g, int t, const float (&dv)[DW / 8][4], const float (&dk)[DW / 8][4]) {
    using namespace portable;
    const int64_t bo = p.cu_q ? 0 : (int64_t)b;
    int ke = 0;
    if (p.cu_k) {
        asm volatile("ld.global.nc.s32 %0, [%1];\n" : "=r"(ke) : "l"(p.cu_k + b));
        ke = min(max(ke, 0), p.total_k);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int key = n0 + kg * 16 + g + 8 * r;
        if (key >= len_k) continue;
        uint16_t *dkp = p.dk + bo * p.dk_sb + (int64_t)(ke + key) * p.dk_ss + (int64_t)hk * p.dk_sh + qg * DW + 2 * t;
        uint16_t *dvp = p.dv + bo * p.dv_sb + (int64_t)(ke + key) * p.dv_ss + (int64_t)hk * p.dv_sh + qg * DW + 2 * t;
#pragma unroll
        for (int j = 0; j < DW / 8; ++j) {
            *reinterpret_cast<uint32_t *>(dkp + 8 * j) = pack2<BF16>(dk[j][2 * r] * p.scale, dk[j][2 * r + 1] * p.scale);
            *reinterpret_cast<uint32_t *>(dvp + 8 * j) = pack2<BF16>(dv[j][2 * r], dv[j][2 * r + 1]);
        }
    }
}

/* The rows a CTA of key block n0 .. n0 + bn - 1 works on: its sequence's
 * (varlen: used) queries and keys, the workspace block of its first query
 * (rb), the causal offset and the query blocks of BM rows that see a key of
 * the block (m_first .. m_first + nm - 1; causal starts at the first key's
 * diagonal). */
struct PbwdRows {
    int q0, len_q, k0, len_k, rb, off, m_first, nm;
};

template <int BM> __device__ __forceinline__ PbwdRows pbwd_rows(const PortableBwdParams &p, int b, int n0) {
    PbwdRows w = {0, p.seqlen_q, 0, p.seqlen_k, 0, 0, 0, 0};
    if (p.cu_q) {
        varlen_rows(p.cu_q, b, p.total_q, p.seqlen_q, w.q0, w.len_q);
        varlen_rows(p.cu_k, b, p.total_k, p.seqlen_k, w.k0, w.len_k);
        varlen_used(p.seqused_q, b, w.len_q);
        varlen_used(p.seqused_k, b, w.len_k);
        w.rb = bwd_varlen_rb(w.q0, b);
    }
    w.off = w.len_k - w.len_q; /* bottom-right aligned: key j visible to row i iff j <= i + off */
    const int m_end = (w.len_q + BM - 1) / BM;
    if (p.causal) {
        const int first_q = n0 - w.off;
        w.m_first = first_q <= 0 ? 0 : min(first_q / BM, m_end);
    }
    w.nm = m_end - w.m_first;
    return w;
}

/* the workspace tile (dQ, LSE2, D) of query block m of head h */
__device__ __forceinline__ size_t pbwd_tile(const PortableBwdParams &p, const PbwdRows &w, int b, int h, int m) {
    return p.cu_q ? (size_t)h * p.rb_total + w.rb + m : ((size_t)b * p.heads_q + h) * p.m_blocks + m;
}

/* Q, dO, LSE2 and D of iteration it (query head hk group + it / nm, query
 * block m_first + it % nm) into one ring slot: tiles at sq, sdo, BM floats
 * at slse, sdsum */
template <int D, int BM, int NT>
__device__ __forceinline__ void pbwd_load_qdo(const PortableBwdParams &p, const PbwdRows &w, int b, int hk, int it,
                                              uint32_t sq, uint32_t sdo, uint32_t slse, uint32_t sdsum, int tid) {
    using namespace portable;
    const int h = hk * p.group + it / w.nm, m = w.m_first + it % w.nm, r0 = m * BM;
    const int64_t bb = p.cu_q ? 0 : (int64_t)b;
    const uint16_t *qs = p.q + bb * p.q_sb + (int64_t)(w.q0 + r0) * p.q_ss + (int64_t)h * p.q_sh;
    const uint16_t *ds = p.dout + bb * p.do_sb + (int64_t)(w.q0 + r0) * p.do_ss + (int64_t)h * p.do_sh;
    load_tile<D, BM, NT>(sq, qs, p.q_ss, w.len_q - r0, tid);
    load_tile<D, BM, NT>(sdo, ds, p.do_ss, w.len_q - r0, tid);
    const size_t tile = pbwd_tile(p, w, b, h, m);
    if (tid < 2 * BM / 4) { /* 16 bytes a thread: LSE2 then D */
        const int c = tid % (BM / 4);
        const float *src = (tid < BM / 4 ? p.lse2 : p.dsum) + tile * BM + 4 * c;
        cp_async_16((tid < BM / 4 ? slse : sdsum) + 16 * c, src, true);
    }
}

/* K and V rows n0 .. n0 + BN - 1 of kv head hk into the tiles at sk, sv */
template <int D, int BN, int NT>
__device__ __forceinline__ void pbwd_load_kv(const PortableBwdParams &p, const PbwdRows &w, int b, int hk, int n0,
                                             uint32_t sk, uint32_t sv, int tid) {
    using namespace portable;
    const int64_t bb = p.cu_q ? 0 : (int64_t)b;
    const uint16_t *ks = p.k + bb * p.k_sb + (int64_t)(w.k0 + n0) * p.k_ss + (int64_t)hk * p.k_sh;
    const uint16_t *vs = p.v + bb * p.v_sb + (int64_t)(w.k0 + n0) * p.v_ss + (int64_t)hk * p.v_sh;
    load_tile<D, BN, NT>(sk, ks, p.k_ss, w.len_k - n0, tid);
    load_tile<D, BN, NT>(sv, vs, p.v_ss, w.len_k - n0, tid);
}

/* dQ of a warp's 16 queries (16 mg ..) and PW columns from col0: added to the
 * tile's fp32 workspace in bwd_dq_index_emaj's order, each add 32 lanes x 4
 * contiguous bytes */
template <int D, int PW>
__device__ __forceinline__ void pbwd_add_dq(float *dq_tile, int mg, int col0, int lane, const float (&dq)[PW / 8][4]) {
#pragma unroll
    for (int j = 0; j < PW / 8; ++j) {
        float *at = dq_tile + (mg * (D / 8) + col0 / 8 + j) * 128 + lane;
#pragma unroll
        for (int e = 0; e < 4; ++e) atomicAdd(at + 32 * e, dq[j][e]);
    }
}

/* P^T = exp2(S^T scale log2e - LSE2) and dS^T = P^T (dP^T - D) in place, for
 * one m16n8 accumulator of keys key_lo, key_lo + 8 and queries row0, row0 + 1
 * (l2, d2 theirs): a row with no key (LSE2 +inf) and padding get 0; keys
 * past the sequence and past the diagonal are masked to -inf when need_mask */
__device__ __forceinline__ void pbwd_softmax(float (&st)[4], float (&dpt)[4], float2 l2, float2 d2, bool need_mask,
                                             int key_lo, int row0, int len_k, int causal, int off, float scale_log2) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        float s = st[e] * scale_log2;
        if (need_mask) {
            const int key = key_lo + 8 * (e >> 1), row = row0 + (e & 1);
            if (key >= len_k || (causal && key > row + off)) s = -INFINITY;
        }
        const float pe = sm80::exp2_approx(s - ((e & 1) ? l2.y : l2.x));
        st[e] = pe;
        dpt[e] = pe * (dpt[e] - ((e & 1) ? d2.y : d2.x));
    }
}

/* This lane's ldmatrix patterns (portable::ldsm_addr), row and swizzle:
 * PA gives the A fragment of a row-major tile (and, .trans, the B fragment
 * of a [k][n] tile), PB the B fragments of two 8-row n tiles (and, .trans,
 * the A fragment of a [k][m] tile). */
struct PbwdLanes {
    uint32_t pa_r, pa_y, pb_r, pb_y;
};

__device__ __forceinline__ PbwdLanes pbwd_lanes(int lane) {
    const uint32_t x7 = lane & 7, hi3 = (lane >> 3) & 1, hi4 = lane >> 4;
    return {x7 + hi3 * 8, x7 ^ hi4, x7 + hi4 * 8, x7 ^ hi3};
}

/* An iteration's ring slot: Q and dO tiles (shared addresses), BM floats of
 * LSE2 and D.  The query head and block stay out (PbwdRing::head, block):
 * returned in here, they cost d128's 64-key kernel 193 -> 245 registers
 * (nvcc 13.0, sm_80). */
struct PbwdSlot {
    uint32_t q, dout;
    const float *lse2, *dsum;
};

/* The Q / dO ring of a kernel of shape S (NS slots at O_Q, O_DO, O_LSE,
 * O_DSUM; K, V at O_K, O_V): T iterations (query heads of kv head hk x
 * query blocks), iteration it + NS - 1 in flight while it is used. */
template <int D, int NS, class S> struct PbwdRing {
    const PortableBwdParams &p;
    const PbwdRows &w;
    uint8_t *smem;
    uint32_t s0;
    int b, hk, T, tid;

    /* Q, dO, LSE2 and D of iteration it into ring slot `slot` */
    __device__ __forceinline__ void load(int it, int slot) const {
        pbwd_load_qdo<D, S::BM, S::NT>(p, w, b, hk, it, s0 + S::O_Q + slot * S::QT_B, s0 + S::O_DO + slot * S::QT_B,
                                       s0 + S::O_LSE + slot * S::BM * 4, s0 + S::O_DSUM + slot * S::BM * 4, tid);
    }

    /* K and V of keys n0 .. n0 + BN - 1, then iterations 0 .. NS - 2, a
     * commit group each */
    __device__ __forceinline__ void prologue(int n0) const {
        if (T > 0) {
            pbwd_load_kv<D, S::BN, S::NT>(p, w, b, hk, n0, s0 + S::O_K, s0 + S::O_V, tid);
#pragma unroll
            for (int s = 0; s < NS - 1; ++s) {
                if (s < T) load(s, s);
                cp_async_commit(); /* K and V ride with the first group */
            }
        }
    }

    /* Issues iteration it + NS - 1 and waits for iteration it's slot, seen
     * by every thread; a group is committed even past T, so that the wait
     * for NS - 1 pending groups stays right */
    __device__ __forceinline__ PbwdSlot next(int it) const {
        if (it + NS - 1 < T) load(it + NS - 1, (it + NS - 1) % NS);
        cp_async_commit();
        cp_async_wait<NS - 1>();
        __syncthreads();
        const int slot = it % NS;
        return {s0 + S::O_Q + slot * S::QT_B, s0 + S::O_DO + slot * S::QT_B,
                (const float *)(smem + S::O_LSE + slot * S::BM * 4), (const float *)(smem + S::O_DSUM + slot * S::BM * 4)};
    }

    /* the query head and query block of iteration it (pbwd_load_qdo's) */
    __device__ __forceinline__ int head(int it) const { return hk * p.group + it / w.nm; }
    __device__ __forceinline__ int block(int it) const { return w.m_first + it % w.nm; }
};

/* Phase 3 of a kernel of shape S: dQ += dS K for queries 16 mg .. + 15,
 * columns CW cg .. + CW - 1 in pieces of PW (dS^T at O_DS, by ldmatrix.trans
 * the A fragment; K at O_K), added to the dQ tile of query head h, block m;
 * deterministic: in key-block order (pbwd_wait_turn).  Ends at the barrier
 * after which dS^T (and the 64-key kernel's P^T) and the ring slot are free. */
template <int D, class S, bool BF16>
__device__ __forceinline__ void pbwd_dq(const PortableBwdParams &p, const PbwdRows &w, int b, int h, int m, int n_block,
                                        uint32_t s0, const PbwdLanes &l, int mg, int cg, int lane, int tid) {
    using namespace portable;
    constexpr int BM = S::BM, BN = S::BN, CW = S::CW, PW = S::PW;
    const size_t tile = pbwd_tile(p, w, b, h, m);
    if (p.deterministic) pbwd_wait_turn(p.dq_sem + tile, n_block);
    float *dq_tile = p.dq_acc + tile * (size_t)(BM * D);
#pragma unroll
    for (int pc = 0; pc < CW / PW; ++pc) {
        float dq[PW / 8][4];
#pragma unroll
        for (int j = 0; j < PW / 8; ++j) dq[j][0] = dq[j][1] = dq[j][2] = dq[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            uint32_t da[4];
            ldsm_x4_trans(da, ldsm_addr<BM>(s0 + S::O_DS, (kk * 16 + l.pb_r) * BM * 2, mg, l.pb_y));
#pragma unroll
            for (int dn = 0; dn < PW / 16; ++dn) {
                uint32_t kb[4];
                ldsm_x4_trans(kb, ldsm_addr<D>(s0 + S::O_K, (kk * 16 + l.pa_r) * D * 2, (cg * CW + pc * PW) / 16 + dn, l.pa_y));
                mma_m16n8k16<BF16>(dq[2 * dn], da, kb[0], kb[1]);
                mma_m16n8k16<BF16>(dq[2 * dn + 1], da, kb[2], kb[3]);
            }
        }
        pbwd_add_dq<D, PW>(dq_tile, mg, cg * CW + pc * PW, lane, dq);
    }
    if (p.deterministic) __threadfence(); /* the adds land before the counter moves */
    __syncthreads();
    if (p.deterministic && tid == 0) atomicAdd(p.dq_sem + tile, 1);
}

/* The main kernel (top of file); ldmatrix lane patterns PA, PB: PbwdLanes. */
template <int D, int NS, bool BF16>
__global__ void __launch_bounds__(PBWD_NW * 32, PortableBwdCfg<D>::MINB) bwd_portable_kernel(const PortableBwdParams p) {
    using namespace portable;
    using S = PbwdShape<D, NS>;
    constexpr int BM = S::BM, BN = S::BN, WK = S::WK, QW = S::QW, DW = S::DW, NQS = S::NQS, QS = S::QS;
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t s0 = smem_u32(smem);
    constexpr uint32_t O_K = S::O_K, O_V = S::O_V, O_P = S::O_P, O_DS = S::O_DS;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int n_block = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;

    const int n0 = n_block * BN;
    const PbwdRows w = pbwd_rows<BM>(p, b, n0);
    if (n0 >= w.len_k) return;
    const int len_k = w.len_k, off = w.off, T = w.nm * p.group;

    const PbwdLanes lanes = pbwd_lanes(lane);
    const auto [pa_r, pa_y, pb_r, pb_y] = lanes;
    const int kg = warp % WK, qg = warp / WK; /* phases 1, 2: qg is the query part, then the column part */
    const int mg = warp % S::WM, cg = warp / S::WM; /* phase 3 */

    const PbwdRing<D, NS, S> ring{p, w, smem, s0, b, hk, T, tid};
    ring.prologue(n0);

    float dv[DW / 8][4], dk[DW / 8][4];
#pragma unroll
    for (int j = 0; j < DW / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) dv[j][e] = dk[j][e] = 0.f;

    for (int it = 0; it < T; ++it) {
        const auto [sQ, sDO, lse2, dsum] = ring.next(it);
        const int h = ring.head(it), m = ring.block(it);

        /* 1. S^T and dP^T for keys 16 kg .. + 15, queries QW qg .. + QW - 1,
         * in NQS parts of QS queries */
#pragma unroll 1
        for (int qs = 0; qs < NQS; ++qs) {
            const int qw0 = qg * QW + qs * QS; /* the part's first query in the block */
            float st[QS / 8][4], dpt[QS / 8][4];
#pragma unroll
            for (int j = 0; j < QS / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) st[j][e] = dpt[j][e] = 0.f;
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                uint32_t ka[4], va[4];
                ldsm_x4(ka, ldsm_addr<D>(s0 + O_K, (kg * 16 + pa_r) * D * 2, kk, pa_y));
                ldsm_x4(va, ldsm_addr<D>(s0 + O_V, (kg * 16 + pa_r) * D * 2, kk, pa_y));
#pragma unroll
                for (int nn = 0; nn < QS / 16; ++nn) {
                    uint32_t qb[4], ob[4];
                    ldsm_x4(qb, ldsm_addr<D>(sQ, (qw0 + nn * 16 + pb_r) * D * 2, kk, pb_y));
                    mma_m16n8k16<BF16>(st[2 * nn], ka, qb[0], qb[1]);
                    mma_m16n8k16<BF16>(st[2 * nn + 1], ka, qb[2], qb[3]);
                    ldsm_x4(ob, ldsm_addr<D>(sDO, (qw0 + nn * 16 + pb_r) * D * 2, kk, pb_y));
                    mma_m16n8k16<BF16>(dpt[2 * nn], va, ob[0], ob[1]);
                    mma_m16n8k16<BF16>(dpt[2 * nn + 1], va, ob[2], ob[3]);
                }
            }
            /* P^T, dS^T (pbwd_softmax), masked on the blocks that need it */
            const int key_lo = n0 + kg * 16 + g;
            const bool need_mask = n0 + BN > len_k || (p.causal && n0 + BN - 1 > m * BM + off);
#pragma unroll
            for (int j = 0; j < QS / 8; ++j) {
                const int qc = qw0 + 8 * j + 2 * t; /* this thread's query pair in the block */
                const float2 l2 = *reinterpret_cast<const float2 *>(lse2 + qc);
                const float2 d2 = *reinterpret_cast<const float2 *>(dsum + qc);
                pbwd_softmax(st[j], dpt[j], l2, d2, need_mask, key_lo, m * BM + qc, len_k, p.causal, off, p.scale_log2);
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const uint32_t at = swz<BM>(kg * 16 + g + 8 * r, qc);
                    *reinterpret_cast<uint32_t *>(smem + O_P + at) = pack2<BF16>(st[j][2 * r], st[j][2 * r + 1]);
                    *reinterpret_cast<uint32_t *>(smem + O_DS + at) = pack2<BF16>(dpt[j][2 * r], dpt[j][2 * r + 1]);
                }
            }
        }
        __syncthreads();

        /* 2. dV += P^T dO, dK += dS^T Q: keys 16 kg .. + 15, columns DW qg .. + DW - 1 */
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk) {
            uint32_t pa[4], sa[4];
            ldsm_x4(pa, ldsm_addr<BM>(s0 + O_P, (kg * 16 + pa_r) * BM * 2, kk, pa_y));
            ldsm_x4(sa, ldsm_addr<BM>(s0 + O_DS, (kg * 16 + pa_r) * BM * 2, kk, pa_y));
#pragma unroll
            for (int dn = 0; dn < DW / 16; ++dn) {
                const int cj = qg * (DW / 16) + dn;
                uint32_t ob[4], qb[4];
                ldsm_x4_trans(ob, ldsm_addr<D>(sDO, (kk * 16 + pa_r) * D * 2, cj, pa_y));
                mma_m16n8k16<BF16>(dv[2 * dn], pa, ob[0], ob[1]);
                mma_m16n8k16<BF16>(dv[2 * dn + 1], pa, ob[2], ob[3]);
                ldsm_x4_trans(qb, ldsm_addr<D>(sQ, (kk * 16 + pa_r) * D * 2, cj, pa_y));
                mma_m16n8k16<BF16>(dk[2 * dn], sa, qb[0], qb[1]);
                mma_m16n8k16<BF16>(dk[2 * dn + 1], sa, qb[2], qb[3]);
            }
        }

        /* 3. dQ += dS K for queries 16 mg .. + 15, columns CW cg .. + CW - 1 */
        pbwd_dq<D, S, BF16>(p, w, b, h, m, n_block, s0, lanes, mg, cg, lane, tid);
    }
    cp_async_wait<0>();

    pbwd_store<DW, BF16>(p, b, hk, n0, len_k, kg, qg, g, t, dv, dk);
}
