/* bwd_traits.cuh - the Hopper 16-bit backward's parameters, named options,
 * tile sizes (BwdCfg: one constexpr function of the options) and
 * shared-memory map (BwdSmem); the tiling itself is described in
 * bwd_sm90.cuh. */
#pragma once
#include "../../common/ptx.cuh"
#include "../../common/bwd_layout.cuh"
#include "../../common/varlen.cuh"

struct BwdParams {
    void *dk, *dv;                                    /* 16-bit, element strides below */
    int64_t dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh;
    float *dq_acc;                                    /* fp32 [batch][heads_q][m_blocks][64 D] (bwd_dq_index) */
    const float *lse2;                                /* [batch][heads_q][sq_pad]: LSE log2 e; +inf: no key */
    const float *dsum;                                /* [batch][heads_q][sq_pad]: rowsum(dO O), right after lse2 */
    int *dq_sem;                                      /* deterministic: [batch][heads_q][m_blocks], zeroed */
    int batch, heads_q, heads_kv, group, seqlen_q, seqlen_k, causal_offset, sq_pad, m_blocks;
    float scale, scale_log2;
    int deterministic;
    /* VARLEN (cu_seqlens; after the fixed-length fields, so their offsets stay):
     * q, k, v, dout, dq, dk, dv packed [total, heads, dim]; the fp32 dQ tiles,
     * LSE, D and counters of query head h and row block r at h * rb_total + r,
     * sequence b's row blocks from (cu_q[b] + 64 b) / 64 (bwd_varlen_seq) */
    const int *cu_q, *cu_k;
    int total_q, total_k, rb_total;
    /* LPT: (kv head, batch) pairs a group, the grid 1-D; 0: the 3-D grid */
    int lpt_group;
    /* deterministic causal on the 1-D grid: key blocks shortest-first, and
     * each query block's dQ added by its key blocks from the last down (the
     * order in which they reach it; FA3's SPT) */
    int spt;
    /* LOCAL (the variants, issue 37): the window, query i seeing keys i +
     * causal_offset - win_left .. i + causal_offset + win_right (-1: that
     * side unbounded; causal is right = 0), and softcap: the score x becomes
     * cap_a tanh(cap_b x) before the softmax as in the forward (cap_b 0:
     * off), cap_t = 1 / (softcap log2 e) recovers tanh from P and the LSE */
    int win_left, win_right;
    float cap_a, cap_b, cap_t;
    /* VARLEN: FlashAttention-3's seqused_q / seqused_k (fattn.h) or NULL:
     * sequence b's first seqused_q[b] queries and seqused_k[b] keys (last,
     * so that no other field moves: the fixed-length kernels' SASS stays) */
    const int *seqused_q, *seqused_k;
};

/* the tile's sequence in the packed tensors (fixed length: all 0) */
struct BwdSeq {
    int q0, k0, rb;
};

/* The named options of a backward kernel, as FwdOpts names the forward's: an
 * instance is BwdCfg<BwdOpts{.d = 128, .causal = true}>, options left out
 * take the defaults, which are the shipped kernels (bwd_sm90.cu); the others
 * are experiments for bench/bwd_variants.cu.  Options that lost are in git
 * history with their measurements (b3, b7, b9): the next S^T
 * prefetched under dQ, the pingpong token, dV + dK before the barrier, two
 * partial dQ tiles at d64, generic LSE/D loads, 4-byte dS^T stores, the
 * lagged dQ (b10). */
struct BwdOpts {
    int d = 128;
    bool causal = false, bf16 = true;
    /* the consumers' full_qdo waits with the suspend-time hint (within the
     * noise in lockstep, b9) */
    bool sleep = false;
    /* the producer's empty_qdo waits with the suspend-time hint (within the
     * noise, b9) */
    bool psleep = false;
    bool varlen = false; /* cu_seqlens (BwdParams' VARLEN fields) */
    /* d64: K_w and V_w held in registers as the A operands of S^T and dP^T
     * (16 KB less shared-memory reading a warpgroup and iteration: +8%, b9) */
    int kreg = -1;
    /* causal: key blocks longest-first, heads grouped so that a group's Q,
     * dO and dQ accumulator fit in L2 (FA3's LPT order); -1: causal only */
    int lpt = -1;
    /* dK's A operand (dS^T) read from the shared-memory tile stored for dQ
     * rather than from registers (+1-3% at d128, 0% at d64, b11); -1: d128 */
    int dkss = -1;
    /* the variants' kernel: a sliding window (causal included) and softcap
     * from BwdParams at run time (issue 37); not with causal */
    bool local = false;
    /* the call's head dims of Q, K (hd) and of V, O, dO (hdv) where they are
     * smaller than d (issue 37: 96 on the d128 kernel, 192 and 192/128 on
     * the d256 one); hd 0: d, hdv 0: hd.  TMA fills the columns past them
     * with zeros, so every product is exact and the columns past them of
     * dQ, dK, dV are zero and not written */
    int hd = 0, hdv = 0;
};

template <BwdOpts O>
struct BwdCfg {
    static constexpr BwdOpts OPTS = O;
    static constexpr int D = O.d;
    static constexpr int HD = O.hd ? O.hd : D, HDV = O.hdv ? O.hdv : HD; /* the call's (above) */
    /* d256: the consumers split the head dim of 64 keys, not 128 keys (top of file) */
    static constexpr bool SPLIT_D = D == 256;
    static constexpr int BN = SPLIT_D ? 64 : 128, BM = 64, STAGES = 2;
    static constexpr bool CAUSAL = O.causal, BF16 = O.bf16, VARLEN = O.varlen, LOCAL = O.local;
    static constexpr int SLABS = D / 64;              /* 128-byte swizzled slabs of 64 columns */
    static constexpr bool KREG = O.kreg < 0 ? D == 64 : O.kreg != 0;
    static constexpr bool LPT = !O.varlen && (O.lpt < 0 ? O.causal : O.lpt != 0);
    /* each consumer's dQ tile: D / 2 columns over all the block's keys (d256:
     * over the 64 keys both consumers share) */
    static constexpr int DQ_N = D / 2;
    /* columns of each consumer's dK, dV: at d64 / d128 the call's head dim
     * (96: the dV and dK GEMMs' N = 96, 1.5 swizzle atoms of the MN-major dO
     * and Q tiles, as the forward's PV_N; D is the fallback); at d256 half of
     * D (a count that differed between the consumers would serialise their
     * wgmmas) */
    static constexpr int DKV_N = SPLIT_D ? D / 2 : HD;
    /* the writer may lag an iteration; SPLIT_D: the dQ tile of stage s is the
     * Q/dO stage s itself (STAGES of them) */
    static constexpr int DQ_STAGES = 2, DS_BUFS = 2;
    static constexpr bool SLEEP = O.sleep, PSLEEP = O.psleep;
    static constexpr bool DKSS = !SPLIT_D && (O.dkss < 0 ? D == 128 : O.dkss != 0);
    static constexpr int DQ_TILE_BYTES = BM * D * 4;   /* fp32, in bwd_dq_index's order */
    static constexpr int KV_BYTES = BN * D * 2, QT_BYTES = BM * D * 2, DS_BYTES = BN * BM * 2;
    /* SPLIT_D: stage s = Q(s), dO(s) adjacent (64 KB, then the dQ tile);
     * otherwise the Q stages, then the dO stages */
    static constexpr int STAGE_STRIDE = SPLIT_D ? 2 * QT_BYTES : QT_BYTES;
    static constexpr int OFF_K = 0, OFF_V = OFF_K + KV_BYTES, OFF_Q = OFF_V + KV_BYTES;
    static constexpr int OFF_DO = SPLIT_D ? OFF_Q + QT_BYTES : OFF_Q + STAGES * QT_BYTES;
    static constexpr int OFF_DS = OFF_Q + 2 * STAGES * QT_BYTES;
    static constexpr int PT_BYTES = SPLIT_D ? BN * BM * 4 : 0; /* SPLIT_D: P^T in fp32, consumer 0 -> 1 */
    static constexpr int OFF_PT = OFF_DS + DS_BUFS * DS_BYTES;
    static constexpr int OFF_DQ = OFF_PT + PT_BYTES;
    static constexpr int DQ_SMEM = SPLIT_D ? 0 : DQ_STAGES * DQ_TILE_BYTES;
    static constexpr int OFF_LSE = OFF_DQ + DQ_SMEM, OFF_DSUM = OFF_LSE + STAGES * BM * 4;
    static constexpr int OFF_BAR = OFF_DSUM + STAGES * BM * 4;
    static constexpr int NUM_BARS = 1 + 2 * STAGES;
    static constexpr int SMEM_BYTES = OFF_BAR + NUM_BARS * 8 + 1024; /* + alignment slack */
    static constexpr int THREADS = 384;
    static constexpr int REGS_PRODUCER = 24, REGS_CONSUMER = 240;
    /* arrivals that free a Q/dO stage: one per consumer warp; SPLIT_D: the writer */
    static constexpr int EMPTY_ARRIVALS = SPLIT_D ? 1 : 8;
    /* named barriers (0 is __syncthreads) */
    /* dQ stage q: BAR_DQ_FULL + q, BAR_DQ_EMPTY + q (SPLIT_D: FULL only) */
    static constexpr int BAR_DS = 1, BAR_DQ_FULL = 2, BAR_DQ_EMPTY = 2 + DQ_STAGES;
    /* SPLIT_D: P^T written (consumer 0 arrives, 1 syncs); the stage read by both */
    static constexpr int BAR_P = BAR_DQ_EMPTY + DQ_STAGES, BAR_FREE = BAR_P + 1;
    static_assert(SMEM_BYTES <= 227 * 1024, "shared memory");
    static_assert(BAR_FREE < 16, "named barriers");
    static_assert(D == 64 || D == 128 || D == 256, "head dims of this tiling");
    static_assert(HD <= D && HDV <= D && HD % 16 == 0 && HDV % 16 == 0, "the call's head dims within the kernel's");
    static_assert(SPLIT_D || HD == HDV, "d64 / d128: one head dim for dK and dV (DKV_N)");
    static_assert(!(LOCAL && CAUSAL), "LOCAL kernels take causal as the window (-1, 0)");
    static_assert(!KREG || D == 64, "K_w, V_w in registers: d64 (16 registers each)");
    /* d256: K 32 + V 32 + 2 stages x (Q 32 + dO 32, then the dQ tile) + dS^T
     * 2 x 8 + P^T (fp32) 16 KB + LSE, D 1 KB + 5 mbarriers + 1 KB alignment
     * slack = 231,464 of 232,448 bytes */
    static_assert(!SPLIT_D || SMEM_BYTES == 231464, "d256 shared-memory budget");
    static_assert(!SPLIT_D || (DQ_TILE_BYTES == STAGE_STRIDE && DQ_STAGES == STAGES && DQ_N == DKV_N && BN == BM),
                  "d256: the dQ tile of 64 queries x 256 fills a Q/dO stage; 64 x 64 P^T and dS^T");
};

template <class C>
struct BwdSmem {
    uint8_t *base;
    uint64_t *full_kv, *full_qdo, *empty_qdo;
    __device__ __forceinline__ explicit BwdSmem(uint8_t *raw) {
        base = (uint8_t *)(((uintptr_t)raw + 1023) & ~(uintptr_t)1023);
        uint64_t *bars = (uint64_t *)(base + C::OFF_BAR);
        full_kv = bars;
        full_qdo = bars + 1;
        empty_qdo = bars + 1 + C::STAGES;
    }
    __device__ __forceinline__ uint8_t *k() const { return base + C::OFF_K; }
    __device__ __forceinline__ uint8_t *v() const { return base + C::OFF_V; }
    __device__ __forceinline__ uint8_t *q(int s) const { return base + C::OFF_Q + s * C::STAGE_STRIDE; }
    __device__ __forceinline__ uint8_t *dout(int s) const { return base + C::OFF_DO + s * C::STAGE_STRIDE; }
    __device__ __forceinline__ uint8_t *ds(int i) const { return base + C::OFF_DS + i * C::DS_BYTES; }
    __device__ __forceinline__ uint8_t *pt() const { return base + C::OFF_PT; }
    __device__ __forceinline__ uint8_t *dq(int q) const {
        if constexpr (C::SPLIT_D) return base + C::OFF_Q + q * C::STAGE_STRIDE; /* the Q/dO stage q */
        return base + C::OFF_DQ + q * C::DQ_TILE_BYTES;
    }
    __device__ __forceinline__ float *lse(int s) const { return (float *)(base + C::OFF_LSE) + s * C::BM; }
    __device__ __forceinline__ float *dsum(int s) const { return (float *)(base + C::OFF_DSUM) + s * C::BM; }
};

