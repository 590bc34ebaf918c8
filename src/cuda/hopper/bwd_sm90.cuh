/* bwd_sm90.cuh - the Hopper 16-bit backward (issue 24): dQ, dK, dV from Q, K,
 * V, dO and the forward's LSE, one CTA per (key block of BN = 128, kv head,
 * batch), looping over the query heads of its GQA group and their query
 * blocks of BM = 64 (FlashAttention-2/3's key-stationary order: dK and dV
 * stay in registers, dQ is accumulated in fp32 in global memory).
 *
 * Warp specialisation (paper §3.1, as in the forward):
 *   warpgroup 0, warp 0, one thread: K and V of the block once, then per
 *     iteration Q, dO and the 64 rows' LSE and D values (TMA)
 *     into a 2-stage ring (full_qdo / empty_qdo);
 *   warpgroup 0, warp 1: the dQ writer: per iteration it adds the
 *     consumers' fp32 dQ tile to the accumulator in global memory with bulk
 *     reduce-adds (cp.reduce.async.bulk .add.f32), so that no consumer waits
 *     on global memory; in deterministic mode it first waits for the key
 *     blocks before its own to have added theirs (a counter per query block);
 *   warpgroups 1 and 2: the consumers, 64 keys each (keys 64 w .. 64 w + 63
 *     of the block), per iteration (all 16-bit GEMMs fp32-accumulated):
 *       S^T  = K_w Q^T          wgmma SS, m64 (keys) n64 (queries)
 *       dP^T = V_w dO^T         wgmma SS
 *       P^T  = exp2(S^T scale log2 e - LSE log2 e)      (masked: 0)
 *       dS^T = P^T (dP^T - D),  D = rowsum(dO O) (the preprocess)
 *       dV  += P^T dO           wgmma RS: P^T is its own A fragment (the
 *       dK  += dS^T Q           accumulator and A layouts coincide)
 *       dS^T -> shared memory (16-bit), then
 *       dQ   = dS K             wgmma SS with both operands MN-major:
 *                               head dim >= 128: each consumer one half of
 *                               dQ's columns over all 128 keys (both halves
 *                               of dS, a named barrier between them); d64:
 *                               each consumer all 64 columns over its own
 *                               64 keys (two partial tiles, both added)
 *       dQ (fp32) -> shared memory -> the writer.
 * dK is scaled by softmax_scale at the end, dQ by the postprocess.
 *
 * Head dim 256 (BwdCfg::SPLIT_D): dK and dV of 64 keys x 256 columns in fp32
 * are 256 registers a thread, over the 240 a consumer has, so the head dim is
 * split instead of the keys (as FA3 does at d256): BN = 64 keys a CTA, and
 * both consumers work on the same 64 keys, consumer w on columns 128 w ..
 * 128 w + 127 of dK, dV and dQ (64 registers each).  Per iteration:
 *   consumer 0: S^T = K Q^T (SS, k = 256), P^T as above, P^T in fp32 to
 *     shared memory in its own fragment order (16 KB, float4 per thread and
 *     register group: conflict-free), named barrier BAR_P (arrive);
 *   consumer 1: dP^T = V dO^T, BAR_P (sync), P^T read back in fp32 (so dS^T
 *     = P^T (dP^T - D) is computed exactly as at d64/d128 and both consumers
 *     round P^T to 16 bits identically), dS^T (16-bit) -> shared memory;
 *   both: dV_w += P^T dO_w (RS, P^T packed from fp32 as at d128; B MN-major,
 *     the stage's slabs 2 w, 2 w + 1, LBO = BM * 128), BAR_DS (both sync),
 *     dK_w += dS^T Q_w (SS, A = dS^T K-major [key][query]) and dQ_w = dS K_w
 *     (SS, both MN-major, K's slabs 2 w, 2 w + 1, LBO = BN * 128).
 * Shared memory has no room for a separate 64 KB dQ tile next to two Q/dO
 * stages (K, V 64 KB + stages 128 KB), so the dQ tile goes into the Q/dO
 * stage it was computed from (Q(s) and dO(s) are adjacent: 64 KB, the tile's
 * size): both consumers meet at BAR_FREE once their GEMMs have read the stage,
 * store their halves of the tile, and hand it to the writer (BAR_DQ_FULL + s);
 * the writer, not the consumers, gives the stage back to the producer
 * (empty_qdo[s], one arrival) once its reduce-add has read it. */
#pragma once
#include "../common/ptx.cuh"
#include "../common/varlen.cuh"
#include "../common/wgmma_gen.cuh"
#include "../common/wgmma_tnsp.cuh"

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
};

/* sequence b's first 64-row block of the dQ tiles, LSE and D (BM = 64): the
 * sequences' ranges cannot overlap, and all lie below rb_total =
 * (total_q + 64 batch) / 64 + 1 */
__device__ __forceinline__ int bwd_varlen_rb(int q0, int b) { return (int)(((int64_t)q0 + 64 * (int64_t)b) / 64); }

/* the tile's sequence in the packed tensors (fixed length: all 0) */
struct BwdSeq {
    int q0, k0, rb;
};

/* The named options of a backward kernel, as FwdOpts names the forward's: an
 * instance is BwdCfg<BwdOpts{.d = 128, .causal = true}>, options left out
 * take the defaults, which are the shipped kernels (bwd_sm90.cu); the others
 * are experiments for bench/bwd_variants.cu (perf-notes b6). */
struct BwdOpts {
    int d = 128;
    bool causal = false, bf16 = true;
    /* the next iteration's S^T under the dQ GEMM (b3): -1 where it measured
     * faster (d64 with order 0), 0 off, 1 on (d64/d128) */
    int prefetch_s = -1;
    /* the consumers' full_qdo waits with the suspend-time hint: 1 on (it
     * helped pingpong 1 at d128 non-causal, b7), 0 or -1 off */
    int sleep = -1;
    /* the producer's empty_qdo waits with the suspend-time hint (on or off
     * within the noise in lockstep, b9) */
    bool psleep = false;
    /* d64/d128: the consumers take turns issuing their GEMMs, a token passed
     * round named barriers BAR_PP, BAR_PP + 1 (the forward's PINGPONG):
     * 1 turns around the S^T/dP^T issue and the dV/dK issue, 2 also the dQ
     * issue (a prefetched S^T stays outside the token); 0 or -1 off: with
     * order 1 the consumers in lockstep measured 2-4% faster (b9) */
    int pingpong = -1;
    bool varlen = false; /* cu_seqlens (BwdParams' VARLEN fields) */
    /* issue order after the exponentials: 1 dV, then (barrier) dQ and dK
     * with dQ's hand-over under dK (FA3's order); 0 dV + dK, barrier, dQ,
     * all drained together (sessions 20-22) */
    int order = 1;
    /* LSE and D by ld.shared issued under the S^T / dP^T GEMMs (1), or
     * generic loads after the waits (0) */
    bool early_stats = true;
    bool stsm = true; /* dS^T to shared memory by stmatrix (1) or 4-byte stores (0) */
    /* d64: K_w and V_w held in registers as the A operands of S^T and dP^T
     * (saves 16 KB of shared-memory reads a warpgroup and iteration) */
    int kreg = -1;
    /* dQ split by columns between the consumers (one tile over all 128 keys,
     * a barrier per iteration) rather than two partial tiles over 64 keys
     * each; -1: every head dim */
    int dq_split = -1;
    /* causal: key blocks longest-first, heads grouped so that a group's Q,
     * dO and dQ accumulator fit in L2 (FA3's LPT order); -1: causal only */
    int lpt = -1;
};

template <BwdOpts O>
struct BwdCfg {
    static constexpr BwdOpts OPTS = O;
    static constexpr int D = O.d;
    /* d256: the consumers split the head dim of 64 keys, not 128 keys (top of file) */
    static constexpr bool SPLIT_D = D == 256;
    static constexpr int BN = SPLIT_D ? 64 : 128, BM = 64, STAGES = 2;
    static constexpr bool CAUSAL = O.causal, BF16 = O.bf16, VARLEN = O.varlen;
    static constexpr int SLABS = D / 64;              /* 128-byte swizzled slabs of 64 columns */
    static constexpr bool DQ_NSPLIT = D >= 128 || (O.dq_split != 0 && !SPLIT_D);
    static constexpr bool ORDER_FA3 = O.order != 0 && !SPLIT_D;
    static constexpr bool EARLY_STATS = O.early_stats, STSM = O.stsm;
    static constexpr bool KREG = O.kreg < 0 ? D == 64 : O.kreg != 0;
    static constexpr bool LPT = !O.varlen && (O.lpt < 0 ? O.causal : O.lpt != 0);
    static constexpr int DQ_N = DQ_NSPLIT ? D / 2 : D; /* columns of each consumer's dQ tile */
    static constexpr int DKV_N = SPLIT_D ? D / 2 : D;  /* columns of each consumer's dK, dV */
    static constexpr int DQ_BUFS = DQ_NSPLIT ? 1 : 2;  /* d64: one partial tile per consumer */
    /* the writer may lag an iteration; SPLIT_D: the dQ tile of stage s is the
     * Q/dO stage s itself (STAGES of them) */
    static constexpr int DQ_STAGES = 2;
    /* the next iteration's S^T issued right after the dQ GEMM: d64 +4%, d128
     * -6..-12% (it waits for the next Q before the dQ hand-over; run 145,
     * perf-notes b3) */
    static constexpr bool PREFETCH_S = !SPLIT_D && (O.prefetch_s < 0 ? D < 128 && O.order == 0 : O.prefetch_s != 0);
    static constexpr bool SLEEP = O.sleep > 0, PSLEEP = O.psleep;
    static constexpr int PINGPONG = SPLIT_D ? 0 : O.pingpong > 0 ? O.pingpong : 0;
    static constexpr int PP_TURNS = PINGPONG ? PINGPONG + 1 : 0; /* token turns per iteration */
    static constexpr int DQ_TILE_BYTES = BM * D * 4;   /* fp32, in bwd_dq_index's order */
    static constexpr int KV_BYTES = BN * D * 2, QT_BYTES = BM * D * 2, DS_BYTES = BN * BM * 2;
    /* SPLIT_D: stage s = Q(s), dO(s) adjacent (64 KB, then the dQ tile);
     * otherwise the Q stages, then the dO stages */
    static constexpr int STAGE_STRIDE = SPLIT_D ? 2 * QT_BYTES : QT_BYTES;
    static constexpr int OFF_K = 0, OFF_V = OFF_K + KV_BYTES, OFF_Q = OFF_V + KV_BYTES;
    static constexpr int OFF_DO = SPLIT_D ? OFF_Q + QT_BYTES : OFF_Q + STAGES * QT_BYTES;
    static constexpr int OFF_DS = OFF_Q + 2 * STAGES * QT_BYTES;
    static constexpr int PT_BYTES = SPLIT_D ? BN * BM * 4 : 0; /* SPLIT_D: P^T in fp32, consumer 0 -> 1 */
    static constexpr int OFF_PT = OFF_DS + 2 * DS_BYTES;
    static constexpr int OFF_DQ = OFF_PT + PT_BYTES;
    static constexpr int DQ_SMEM = SPLIT_D ? 0 : DQ_STAGES * DQ_BUFS * DQ_TILE_BYTES;
    static constexpr int OFF_LSE = OFF_DQ + DQ_SMEM, OFF_DSUM = OFF_LSE + STAGES * BM * 4;
    static constexpr int OFF_BAR = OFF_DSUM + STAGES * BM * 4;
    static constexpr int NUM_BARS = 1 + 2 * STAGES;
    static constexpr int SMEM_BYTES = OFF_BAR + NUM_BARS * 8 + 1024; /* + alignment slack */
    static constexpr int THREADS = 384;
    static constexpr int REGS_PRODUCER = 24, REGS_CONSUMER = 240;
    /* arrivals that free a Q/dO stage: one per consumer warp; SPLIT_D: the writer */
    static constexpr int EMPTY_ARRIVALS = SPLIT_D ? 1 : 8;
    /* named barriers (0 is __syncthreads; the forward's pingpong uses 8..) */
    /* dQ stage q: BAR_DQ_FULL + q, BAR_DQ_EMPTY + q (SPLIT_D: FULL only) */
    static constexpr int BAR_DS = 1, BAR_DQ_FULL = 2, BAR_DQ_EMPTY = 2 + DQ_STAGES;
    /* SPLIT_D: P^T written (consumer 0 arrives, 1 syncs); the stage read by both */
    static constexpr int BAR_P = BAR_DQ_EMPTY + DQ_STAGES, BAR_FREE = BAR_P + 1;
    /* PINGPONG: consumer w waits for its turn on BAR_PP + w */
    static constexpr int BAR_PP = 8;
    static_assert(SMEM_BYTES <= 227 * 1024, "shared memory");
    static_assert(BAR_FREE < BAR_PP && BAR_PP + 1 < 16, "named barriers");
    static_assert(O.pingpong >= -1 && O.pingpong <= 2 && (!SPLIT_D || O.pingpong <= 0), "pingpong: 0-2, d64/d128");
    static_assert(!SPLIT_D || O.prefetch_s <= 0, "prefetch_s: d64/d128");
    static_assert(D == 64 || D == 128 || D == 256, "head dims of this tiling");
    static_assert(!KREG || D == 64, "K_w, V_w in registers: d64 (16 registers each)");
    /* d256: K 32 + V 32 + 2 stages x (Q 32 + dO 32, then the dQ tile) + dS^T
     * 2 x 8 + P^T (fp32) 16 KB + LSE, D 1 KB + 5 mbarriers + 1 KB alignment
     * slack = 231,464 of 232,448 bytes */
    static_assert(!SPLIT_D || SMEM_BYTES == 231464, "d256 shared-memory budget");
    static_assert(!SPLIT_D || (DQ_TILE_BYTES == STAGE_STRIDE && DQ_STAGES == STAGES && DQ_BUFS == 1 &&
                               DQ_N == DKV_N && BN == BM),
                  "d256: the dQ tile of 64 queries x 256 fills a Q/dO stage; 64 x 64 P^T and dS^T");
};

/* Where element (row, col) of a 64-row dQ tile lives in the fp32 accumulator
 * (shared and global memory alike): in the order the consumers hold it, so
 * that a warp's stores are 512 contiguous bytes and the writer adds a whole
 * tile with one bulk reduce-add (FA3's permuted dQ accumulator):
 * [column part of `width` columns][warp][8-column group][lane][4], lane =
 * 4 (row % 8) + (col % 8) / 2, element 2 ((row % 16) / 8) + col % 2; width
 * is the columns of one consumer's dQ tile (BwdCfg::DQ_N). */
__host__ __device__ __forceinline__ int bwd_dq_index(int row, int col, int width) {
    const int part = col / width, c = col % width;
    const int wq = row / 16, r = row % 16;
    const int lane = 4 * (r % 8) + (c % 8) / 2, e = 2 * (r / 8) + c % 2;
    return (((part * 4 + wq) * (width / 8) + c / 8) * 32 + lane) * 4 + e;
}

__device__ __forceinline__ void bulk_reduce_add_f32(float *dst, const void *src, uint32_t bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                 "r"(smem_u32(src)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ int ld_acquire_gpu(const int *p) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void st_shared_u32(void *p, uint32_t v) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(smem_u32(p)), "r"(v) : "memory");
}

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
    __device__ __forceinline__ uint8_t *dq(int q, int buf) const {
        if constexpr (C::SPLIT_D) {
            (void)buf;
            return base + C::OFF_Q + q * C::STAGE_STRIDE; /* the Q/dO stage q */
        }
        return base + C::OFF_DQ + (q * C::DQ_BUFS + buf) * C::DQ_TILE_BYTES;
    }
    __device__ __forceinline__ float *lse(int s) const { return (float *)(base + C::OFF_LSE) + s * C::BM; }
    __device__ __forceinline__ float *dsum(int s) const { return (float *)(base + C::OFF_DSUM) + s * C::BM; }
};

/* The iterations of key block n: the query heads of the group (outer) and
 * the query blocks from the first that sees a key of the block (inner). */
template <class C>
struct BwdIter {
    int m_start, m_count, total;
    __device__ __forceinline__ BwdIter(const BwdParams &p, int n) {
        m_start = 0;
        if (C::CAUSAL) {
            /* query row i sees key j iff j <= i + causal_offset */
            const int first_q = n * C::BN - p.causal_offset;
            m_start = first_q <= 0 ? 0 : first_q / C::BM;
        }
        m_count = p.m_blocks > m_start ? p.m_blocks - m_start : 0;
        total = p.group * m_count;
    }
    __device__ __forceinline__ void decode(int it, int hk, const BwdParams &p, int &h, int &m) const {
        const int g = it / m_count;
        m = m_start + (it - g * m_count);
        h = hk * p.group + g;
    }
};

/* A consumer's S^T = K_w Q^T (or, dp, dP^T = V_w dO^T) for the iteration in
 * stage s (issue only: one commit group). */
template <class C>
__device__ __forceinline__ void bwd_issue_sdp(const BwdSmem<C> &sm, uint64_t desc_kv, int s, bool dp, float (&acc)[32]) {
    using WS = wgmma_op<64, C::BF16>; /* m64 (keys) n64 (queries) */
    constexpr int D = C::D, BN = C::BN, BM = C::BM;
    const uint64_t desc_b = smem_desc_sw128(dp ? sm.dout(s) : sm.q(s), 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
        WS::ss(acc, desc_add(desc_kv, (kk / 4) * BN * 128 + (kk % 4) * 32),
               desc_add(desc_b, (kk / 4) * BM * 128 + (kk % 4) * 32), kk > 0);
    wgmma_commit();
}

__device__ __forceinline__ void st_shared_f32x4(void *p, float4 v) {
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_u32(p)), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                 : "memory");
}
/* volatile, no memory clobber: stays where it is among the wgmma issues and
 * waits (what it reads landed before the stage's mbarrier wait) */
__device__ __forceinline__ float2 ld_shared_f32x2(const void *p) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(smem_u32(p)));
    return v;
}
__device__ __forceinline__ float4 ld_shared_f32x4(const void *p) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(smem_u32(p))
                 : "memory");
    return v;
}

/* dK / dV of the tile's sequence: batch b's (fixed length) or the packed
 * rows from the sequence's first key (VARLEN) */
template <class C>
__device__ __forceinline__ int64_t bwd_kv_offset(int b, const BwdSeq &sq, int64_t sb, int64_t ss) {
    if constexpr (C::VARLEN) return (int64_t)sq.k0 * ss;
    (void)sq, (void)ss;
    return (int64_t)b * sb;
}

/* The consumers at head dim 256 (BwdCfg::SPLIT_D; the tiling at the top of
 * the file): consumer cw = 0, 1 owns columns 128 cw .. 128 cw + 127 of dK, dV
 * and dQ for all BN = 64 keys of the block. */
/* P^T in place for 8-column group i of a consumer's S^T accumulator: element
 * 4 i + e is key key_r + 8 (e / 2), query query_c + 8 i + e % 2; P^T =
 * exp2(S^T scale log2 e - LSE log2 e), 0 where the causal mask hides the key
 * and (VARLEN) for a key past the sequence's (the next sequence's rows). */
template <class C>
__device__ __forceinline__ void bwd_p_group(float (&acc)[32], int i, float2 l, const BwdParams &p, bool need_mask,
                                            int key_r, int query_c) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        float x = exp2f(fmaf(acc[4 * i + e], p.scale_log2, -((e & 1) ? l.y : l.x)));
        if (need_mask) {
            const int key = key_r + 8 * (e >> 1), q = query_c + 8 * i + (e & 1);
            if ((C::CAUSAL && key > q + p.causal_offset) || (C::VARLEN && key >= p.seqlen_k)) x = 0.f;
        }
        acc[4 * i + e] = x;
    }
}

template <class C>
__device__ __forceinline__ void bwd_consumer_split_d(const BwdSmem<C> &sm, const BwdParams &p, const BwdIter<C> &iter,
                                                     int n, int hk, int b, const BwdSeq &sq) {
    constexpr int BN = C::BN, BM = C::BM, STAGES = C::STAGES, DN = C::DKV_N;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int cw = threadIdx.x / 128 - 1, wq = warp % 4, t = threadIdx.x % 128;
    const int r0 = 16 * wq + lane / 4, q4 = lane % 4;
    const int T = iter.total;
    using WD = wgmma_op<DN, C::BF16>;   /* dV: m64 n128, A = P^T from registers, B MN-major */
    using WT = wgmma_tnsp<DN, C::BF16>; /* dK: A K-major, B MN-major (ss_tb); dQ: both MN-major (ss_tab) */
    float dv[DN / 2], dk[DN / 2];
#pragma unroll
    for (int i = 0; i < DN / 2; ++i) dv[i] = dk[i] = 0.f;
    if (T > 0) mbar_wait(sm.full_kv, 0);
    /* S^T = K Q^T (consumer 0) or dP^T = V dO^T (consumer 1), all 64 keys */
    const uint64_t desc_kv = smem_desc_sw128(cw == 0 ? sm.k() : sm.v(), 16, 1024);
    const int key0 = n * BN;
    uint8_t *pt = sm.pt(); /* P^T fp32: float4 i of thread t at (i * 128 + t) * 16 */
    float acc[32];         /* S^T, then P^T (consumer 0); dP^T, then dS^T (consumer 1) */
    for (int it = 0; it < T; ++it) {
        int h, m;
        iter.decode(it, hk, p, h, m);
        (void)h;
        const int s = it % STAGES;
        mbar_wait<C::SLEEP>(&sm.full_qdo[s], (it / STAGES) & 1);
        bwd_issue_sdp<C>(sm, desc_kv, s, cw == 1, acc);
        wgmma_wait<0>();
        reg_fence(acc);
        /* element 4 i + e of acc: key r0 + 8 (e / 2), query 8 i + 2 q4 + e % 2;
         * pf[ks][j]: the P^T pair (acc[8 ks + 2 j], + 1), as at d64/d128 */
        uint32_t pf[4][4];
        uint8_t *dsb = sm.ds(it & 1);
        if (cw == 0) {
            const float *lse = sm.lse(s);
            const bool need_mask = (C::CAUSAL && key0 + BN - 1 > m * BM + p.causal_offset) ||
                                   (C::VARLEN && key0 + BN > p.seqlen_k);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                bwd_p_group<C>(acc, i, *(const float2 *)(lse + 8 * i + 2 * q4), p, need_mask, key0 + r0, m * BM + 2 * q4);
                st_shared_f32x4(pt + (i * 128 + t) * 16,
                                make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]));
            }
#pragma unroll
            for (int ks = 0; ks < 4; ++ks)
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    pf[ks][j] = C::BF16 ? pack_bf16x2(acc[8 * ks + 2 * j], acc[8 * ks + 2 * j + 1])
                                        : pack_f16x2(acc[8 * ks + 2 * j], acc[8 * ks + 2 * j + 1]);
            named_bar_arrive(C::BAR_P, 256); /* P^T written (generic stores, generic loads) */
        } else {
            named_bar_sync(C::BAR_P, 256);
            /* dS^T = P^T (dP^T - D) with consumer 0's fp32 P^T (the same
             * thread's fragment: same warp of the warpgroup, same lane) */
            const float *dsum = sm.dsum(s);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const float4 x = ld_shared_f32x4(pt + (i * 128 + t) * 16);
                const float2 dd = *(const float2 *)(dsum + 8 * i + 2 * q4);
                acc[4 * i] = x.x * (acc[4 * i] - dd.x);
                acc[4 * i + 1] = x.y * (acc[4 * i + 1] - dd.y);
                acc[4 * i + 2] = x.z * (acc[4 * i + 2] - dd.x);
                acc[4 * i + 3] = x.w * (acc[4 * i + 3] - dd.y);
                /* elements 4 i .. 4 i + 3 = pairs j = 2 (i % 2), + 1 of ks = i / 2 */
                pf[i / 2][2 * (i % 2)] = C::BF16 ? pack_bf16x2(x.x, x.y) : pack_f16x2(x.x, x.y);
                pf[i / 2][2 * (i % 2) + 1] = C::BF16 ? pack_bf16x2(x.z, x.w) : pack_f16x2(x.z, x.w);
            }
        }
        /* dV_w += P^T dO_w: B = dO's slabs 2 cw, 2 cw + 1 (MN-major: rows of
         * queries, 64-column slabs BM * 128 bytes apart), k16 step 16 rows */
        const uint64_t desc_dot = smem_desc_sw128(sm.dout(s) + 2 * cw * BM * 128, BM * 128, 1024);
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) WD::rs(dv, pf[ks], desc_add(desc_dot, ks * 2048), 1);
        wgmma_commit();
        if (cw == 1) {
            /* dS^T into shared memory: row = key, 128 bytes of 64 queries,
             * 128-byte swizzle (as at d64/d128, one consumer's 64 keys) */
#pragma unroll
            for (int ks = 0; ks < 4; ++ks)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const uint32_t d = C::BF16 ? pack_bf16x2(acc[8 * ks + 2 * j], acc[8 * ks + 2 * j + 1])
                                               : pack_f16x2(acc[8 * ks + 2 * j], acc[8 * ks + 2 * j + 1]);
                    const int row = r0 + 8 * (j & 1), chunk = 2 * ks + (j >> 1);
                    st_shared_u32(dsb + row * 128 + ((chunk ^ (row & 7)) << 4) + 4 * q4, d);
                }
            fence_async_shared(); /* read by wgmma (the async proxy) */
        }
        /* all 128 threads of consumer 1 have stored (and fenced) dS^T: its own
         * wgmmas below read every row too */
        named_bar_sync(C::BAR_DS, 256);
        /* dK_w += dS^T Q_w: A = dS^T K-major (rows of keys, the query index
         * along the 128-byte row: k16 step +32 bytes), B = Q's slabs 2 cw, + 1 */
        const uint64_t desc_ds = smem_desc_sw128(dsb, 16, 1024);
        const uint64_t desc_qt = smem_desc_sw128(sm.q(s) + 2 * cw * BM * 128, BM * 128, 1024);
        float dq[DN / 2];
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) WT::ss_tb(dk, desc_add(desc_ds, ks * 32), desc_add(desc_qt, ks * 2048), 1);
        /* dQ_w = dS K_w: A = dS^T stored [key][query] (MN-major A: K rows =
         * keys), B = K's slabs 2 cw, 2 cw + 1 (MN-major, BN * 128 bytes apart) */
        const uint64_t db = smem_desc_sw128(sm.k() + 2 * cw * BN * 128, BN * 128, 1024);
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
            WT::ss_tab(dq, desc_add(desc_ds, kk * 2048), desc_add(db, kk * 2048), kk > 0);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(dq);
        reg_fence(dv);
        reg_fence(dk);
        /* the LSE and D reads (generic proxy) before the producer's next bulk
         * copies into the stage (async proxy), after the writer frees it */
        fence_async_shared();
        /* both consumers' GEMMs have read Q(s) and dO(s): the dQ tile may
         * overwrite them */
        named_bar_sync(C::BAR_FREE, 256);
        /* float4 (rows r0, r0 + 8, columns 2 q4, + 1 of each 8-column group)
         * at bwd_dq_index's place (width DQ_N = 128): part cw of the tile */
        float4 *dqb = (float4 *)sm.dq(s, 0) + (cw * 4 + wq) * (DN / 8) * 32;
#pragma unroll
        for (int i = 0; i < DN / 8; ++i)
            st_shared_f32x4(dqb + i * 32 + lane, make_float4(dq[4 * i], dq[4 * i + 1], dq[4 * i + 2], dq[4 * i + 3]));
        fence_async_shared(); /* read by the bulk reduce (the async proxy) */
        named_bar_arrive(C::BAR_DQ_FULL + s, 288);
    }
    /* dK (times softmax_scale) and dV: rows key0 + r0 (+ 8), columns
     * 128 cw + ..., 4-byte stores */
    uint16_t *gk = (uint16_t *)p.dk + bwd_kv_offset<C>(b, sq, p.dk_sb, p.dk_ss) + (int64_t)hk * p.dk_sh;
    uint16_t *gv = (uint16_t *)p.dv + bwd_kv_offset<C>(b, sq, p.dv_sb, p.dv_ss) + (int64_t)hk * p.dv_sh;
#pragma unroll
    for (int e2 = 0; e2 < 2; ++e2) {
        const int key = key0 + r0 + 8 * e2;
        if (key >= p.seqlen_k) continue;
#pragma unroll
        for (int i = 0; i < DN / 8; ++i) {
            const int col = cw * DN + 8 * i + 2 * q4;
            const float k0 = dk[4 * i + 2 * e2] * p.scale, k1 = dk[4 * i + 2 * e2 + 1] * p.scale;
            const float v0 = dv[4 * i + 2 * e2], v1 = dv[4 * i + 2 * e2 + 1];
            *(uint32_t *)(gk + key * p.dk_ss + col) = C::BF16 ? pack_bf16x2(k0, k1) : pack_f16x2(k0, k1);
            *(uint32_t *)(gv + key * p.dv_ss + col) = C::BF16 ? pack_bf16x2(v0, v1) : pack_f16x2(v0, v1);
        }
    }
}

/* A consumer warpgroup at head dim 64 or 128: keys 64 cw .. 64 cw + 63 of
 * the block (the tiling at the top of the file).  Per iteration, with
 * ORDER_FA3: S^T and dP^T issued, LSE read under them; P^T; dV issued; D
 * read; dP^T waited for (dV may run); dS^T to shared memory; the barrier;
 * dQ and dK issued; dQ waited for and handed over while dK runs. */
template <class C>
__device__ __forceinline__ void bwd_consumer(const BwdSmem<C> &sm, const BwdParams &p, const BwdIter<C> &iter, int n,
                                             int hk, int b, const BwdSeq &sq) {
    constexpr int D = C::D, BN = C::BN, BM = C::BM, STAGES = C::STAGES;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int cw = threadIdx.x / 128 - 1, wq = warp % 4;
    const int r0 = 16 * wq + lane / 4, q4 = lane % 4;
    const int T = iter.total;
    using WD = wgmma_op<D, C::BF16>;         /* dV, dK: m64 nD, B MN-major */
    using WS = wgmma_op<64, C::BF16>;        /* S^T, dP^T with K_w, V_w in registers (KREG) */
    using WQ = wgmma_tnsp<C::DQ_N, C::BF16>; /* dQ: A and B MN-major */
    float dv[D / 2], dk[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) dv[i] = dk[i] = 0.f;
    if (T > 0) mbar_wait(sm.full_kv, 0);
    const uint64_t desc_k = smem_desc_sw128(sm.k() + cw * 64 * 128, 16, 1024);
    const uint64_t desc_v = smem_desc_sw128(sm.v() + cw * 64 * 128, 16, 1024);
    /* KREG: the A fragments of K_w and V_w, k step kk: matrices (rows 0-7,
     * columns 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) of the warp's 16 keys */
    uint32_t kf[C::KREG ? 4 : 1][4], vf[C::KREG ? 4 : 1][4];
    if constexpr (C::KREG) {
        const int row = cw * 64 + 16 * wq + lane % 8 + 8 * ((lane / 8) & 1);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            const uint32_t off = row * 128 + (((2 * kk + lane / 16) ^ (row & 7)) << 4);
            ldsm_x4(kf[kk], smem_u32(sm.k()) + off);
            ldsm_x4(vf[kk], smem_u32(sm.v()) + off);
        }
    }
    auto issue_sdp = [&](int s, bool dp, float(&acc)[32]) {
        if constexpr (C::KREG) {
            const uint64_t desc_b = smem_desc_sw128(dp ? sm.dout(s) : sm.q(s), 16, 1024);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) WS::rsk(acc, dp ? vf[kk] : kf[kk], desc_add(desc_b, kk * 32), kk > 0);
            wgmma_commit();
        } else {
            bwd_issue_sdp<C>(sm, dp ? desc_v : desc_k, s, dp, acc);
        }
    };
    const int key0 = n * BN + cw * 64; /* this warpgroup's first key */
    float st[32], dpt[32];
    /* PINGPONG: the GEMM issues of turns 1 (S^T, dP^T), 2 (dV; dK too
     * without ORDER_FA3) and, with pingpong 2, 3 (dQ; dK too with ORDER_FA3)
     * alternate between the consumers (0, 1, 0, ...), so that one's
     * exponentials run under the other's GEMMs.  No deadlock with BAR_DS or
     * the hand-overs: a consumer waiting for turn k of iteration i waits for
     * the other's previous turn, and the other reaches it without waiting on
     * the first: BAR_DS of i comes after both consumers' turns 1 and 2 of i
     * (each has handed the token on before it syncs there), turn 3 after
     * BAR_DS, which both have passed, and the producer's and the writer's
     * hand-overs wait for arrivals of earlier iterations only, which both
     * consumers made before their turns of i.  A consumer waits for its
     * Q/dO before its turn, not holding the token.  The token starts at
     * consumer 0 (consumer 1 hands it over once); consumer 0 takes the last
     * hand-over after the loop, so no arrival is left pending at exit. */
    const int bar_self = C::BAR_PP + cw, bar_next = C::BAR_PP + (cw ^ 1);
    auto pp_sync = [&](int turn) {
        if (turn <= C::PP_TURNS) named_bar_sync(bar_self, 256);
    };
    auto pp_arrive = [&](int turn) {
        if (turn <= C::PP_TURNS) named_bar_arrive(bar_next, 256);
    };
    if (C::PINGPONG && cw == 1) named_bar_arrive(bar_next, 256);
    for (int it = 0; it < T; ++it) {
        int h, m;
        iter.decode(it, hk, p, h, m);
        (void)h;
        const int s = it % STAGES;
        /* with PREFETCH_S only the first iteration issues its own S^T, every
         * later one finds it issued by the iteration before, under its dQ GEMM */
        const bool own_s = it == 0 || !C::PREFETCH_S;
        if (own_s) mbar_wait<C::SLEEP>(&sm.full_qdo[s], (it / STAGES) & 1);
        pp_sync(1);
        if (own_s) issue_sdp(s, false, st);
        issue_sdp(s, true, dpt);
        pp_arrive(1);
        const float *lse = sm.lse(s), *dsum = sm.dsum(s);
        float2 l2[8], d2[8];
        if constexpr (C::EARLY_STATS)
#pragma unroll
            for (int i = 0; i < 8; ++i) l2[i] = ld_shared_f32x2(lse + 8 * i + 2 * q4);
        wgmma_wait<1>();
        reg_fence(st);
        if constexpr (!C::EARLY_STATS)
#pragma unroll
            for (int i = 0; i < 8; ++i) l2[i] = *(const float2 *)(lse + 8 * i + 2 * q4);
        /* P^T: element 4 i + e is key r0 + 8 (e / 2), query 8 i + 2 q4 + e % 2 */
        const bool need_mask =
            (C::CAUSAL && key0 + 63 > m * BM + p.causal_offset) || (C::VARLEN && key0 + 64 > p.seqlen_k);
#pragma unroll
        for (int i = 0; i < 8; ++i) bwd_p_group<C>(st, i, l2[i], p, need_mask, key0 + r0, m * BM + 2 * q4);
        uint32_t pf[4][4], df[4][4];
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
#pragma unroll
            for (int j = 0; j < 4; ++j)
                pf[ks][j] = C::BF16 ? pack_bf16x2(st[8 * ks + 2 * j], st[8 * ks + 2 * j + 1])
                                    : pack_f16x2(st[8 * ks + 2 * j], st[8 * ks + 2 * j + 1]);
        /* dV += P^T dO, dK += dS^T Q (B MN-major: rows of queries, k16 step 16 rows) */
        const uint64_t desc_dot = smem_desc_sw128(sm.dout(s), BM * 128, 1024);
        const uint64_t desc_qt = smem_desc_sw128(sm.q(s), BM * 128, 1024);
        if constexpr (C::ORDER_FA3) {
            /* dV under the dS^T below: its issue needs every exponential, so
             * the dP^T wait cannot rise above them */
            pp_sync(2);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) WD::rs(dv, pf[ks], desc_add(desc_dot, ks * 2048), 1);
            wgmma_commit();
            pp_arrive(2);
        }
        if constexpr (C::EARLY_STATS)
#pragma unroll
            for (int i = 0; i < 8; ++i) d2[i] = ld_shared_f32x2(dsum + 8 * i + 2 * q4);
        if constexpr (C::ORDER_FA3)
            wgmma_wait<1>(); /* dP^T; dV may run */
        else
            wgmma_wait<0>();
        reg_fence(dpt);
        if constexpr (!C::EARLY_STATS)
#pragma unroll
            for (int i = 0; i < 8; ++i) d2[i] = *(const float2 *)(dsum + 8 * i + 2 * q4);
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) dpt[4 * i + e] = st[4 * i + e] * (dpt[4 * i + e] - ((e & 1) ? d2[i].y : d2[i].x));
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
#pragma unroll
            for (int j = 0; j < 4; ++j)
                df[ks][j] = C::BF16 ? pack_bf16x2(dpt[8 * ks + 2 * j], dpt[8 * ks + 2 * j + 1])
                                    : pack_f16x2(dpt[8 * ks + 2 * j], dpt[8 * ks + 2 * j + 1]);
        if constexpr (!C::ORDER_FA3) {
            pp_sync(2);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) WD::rs(dv, pf[ks], desc_add(desc_dot, ks * 2048), 1);
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) WD::rs(dk, df[ks], desc_add(desc_qt, ks * 2048), 1);
            wgmma_commit();
            pp_arrive(2);
        }
        /* dS^T into shared memory: row = key (64 cw + ...), 128 bytes of 64
         * queries, 128-byte swizzle; df[ks][j] holds queries 8 (2 ks + j / 2)
         * + 2 q4, + 1 of key r0 + 8 (j % 2) */
        uint8_t *dsb = sm.ds(it & 1);
        if constexpr (C::STSM) {
            /* lanes 8 j .. 8 j + 7 address the rows of matrix j = df[ks][j] */
            const int mat = lane / 8, row = cw * 64 + 16 * wq + lane % 8 + 8 * (mat & 1);
#pragma unroll
            for (int ks = 0; ks < 4; ++ks)
                stsm_x4(smem_u32(dsb) + row * 128 + (((2 * ks + (mat >> 1)) ^ (row & 7)) << 4), df[ks][0], df[ks][1],
                        df[ks][2], df[ks][3]);
        } else {
#pragma unroll
            for (int ks = 0; ks < 4; ++ks)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int row = cw * 64 + r0 + 8 * (j & 1), chunk = 2 * ks + (j >> 1);
                    st_shared_u32(dsb + row * 128 + ((chunk ^ (row & 7)) << 4) + 4 * q4, df[ks][j]);
                }
        }
        fence_async_shared(); /* read by wgmma (the async proxy) */
        if (C::DQ_NSPLIT) named_bar_sync(C::BAR_DS, 256);
        float dq[C::DQ_N / 2];
        pp_sync(3);
        wgmma_fence();
        if constexpr (C::DQ_NSPLIT) {
            /* columns DQ_N cw .. of dQ = dS K: A = dS (K rows = keys, 128
             * bytes of queries), B = K's columns DQ_N cw .. (slab cw at d128,
             * half of the one slab at d64) */
            const uint64_t da = smem_desc_sw128(dsb, 16, 1024);
            const uint64_t db = smem_desc_sw128(sm.k() + (D >= 128 ? cw * BN * 128 : cw * C::DQ_N * 2), 16, 1024);
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) WQ::ss_tab(dq, desc_add(da, kk * 2048), desc_add(db, kk * 2048), kk > 0);
        } else {
            /* all of dQ over this warpgroup's own 64 keys */
            const uint64_t da = smem_desc_sw128(dsb + cw * 64 * 128, 16, 1024);
            const uint64_t db = smem_desc_sw128(sm.k() + cw * 64 * 128, 16, 1024);
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) WQ::ss_tab(dq, desc_add(da, kk * 2048), desc_add(db, kk * 2048), kk > 0);
        }
        wgmma_commit();
        if constexpr (C::ORDER_FA3) {
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) WD::rs(dk, df[ks], desc_add(desc_qt, ks * 2048), 1);
            wgmma_commit();
        }
        pp_arrive(3);
        /* the next iteration's S^T under this dQ GEMM and the dQ hand-over */
        const bool pf_next = C::PREFETCH_S && it + 1 < T;
        if (pf_next) {
            mbar_wait<C::SLEEP>(&sm.full_qdo[(it + 1) % STAGES], ((it + 1) / STAGES) & 1);
            issue_sdp((it + 1) % STAGES, false, st);
        }
        /* dQ done: ORDER_FA3 leaves dK (and the prefetched S^T) running */
        constexpr int AFTER_DQ = C::ORDER_FA3 ? 1 : 0;
        if (pf_next)
            wgmma_wait<AFTER_DQ + 1>();
        else
            wgmma_wait<AFTER_DQ>();
        reg_fence(dq);
        auto release_stage = [&]() {
            reg_fence(dv);
            reg_fence(dk);
            /* the A fragments stay live until their GEMMs are done, so that
             * ptxas does not reuse their registers and wait early */
#pragma unroll
            for (int ks = 0; ks < 4; ++ks) {
                reg_fence(pf[ks]);
                reg_fence(df[ks]);
            }
            /* Q and dO of this stage are read by nobody now; the LSE and D
             * reads (generic proxy) are ordered before the producer's next
             * bulk copies into the stage (async proxy) */
            fence_async_shared();
            __syncwarp();
            if (lane == 0) mbar_arrive(&sm.empty_qdo[s]);
        };
        if constexpr (!C::ORDER_FA3) release_stage();
        /* dQ to the writer's buffer */
        const int dqs = it % C::DQ_STAGES;
        named_bar_sync(C::BAR_DQ_EMPTY + dqs, 288);
        /* float4 (rows r0, r0 + 8, columns 2 q4, + 1 of each 8-column group)
         * at bwd_dq_index's place: part cw (nsplit) or this consumer's own
         * tile (two partial tiles) */
        float4 *dqb = (float4 *)sm.dq(dqs, C::DQ_NSPLIT ? 0 : cw) + ((C::DQ_NSPLIT ? cw * 4 : 0) + wq) * (C::DQ_N / 8) * 32;
#pragma unroll
        for (int i = 0; i < C::DQ_N / 8; ++i)
            st_shared_f32x4(dqb + i * 32 + lane, make_float4(dq[4 * i], dq[4 * i + 1], dq[4 * i + 2], dq[4 * i + 3]));
        fence_async_shared(); /* read by the bulk reduce (the async proxy) */
        named_bar_arrive(C::BAR_DQ_FULL + dqs, 288);
        if constexpr (C::ORDER_FA3) {
            if (pf_next)
                wgmma_wait<1>();
            else
                wgmma_wait<0>();
            release_stage();
        }
    }
    if (C::PINGPONG && cw == 0) named_bar_sync(bar_self, 256); /* the last hand-over */
    /* dK (times softmax_scale) and dV: rows key0 + r0 (+ 8), 4-byte stores */
    uint16_t *gk = (uint16_t *)p.dk + bwd_kv_offset<C>(b, sq, p.dk_sb, p.dk_ss) + (int64_t)hk * p.dk_sh;
    uint16_t *gv = (uint16_t *)p.dv + bwd_kv_offset<C>(b, sq, p.dv_sb, p.dv_ss) + (int64_t)hk * p.dv_sh;
#pragma unroll
    for (int e2 = 0; e2 < 2; ++e2) {
        const int key = key0 + r0 + 8 * e2;
        if (key >= p.seqlen_k) continue;
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
            const int col = 8 * i + 2 * q4;
            const float k0 = dk[4 * i + 2 * e2] * p.scale, k1 = dk[4 * i + 2 * e2 + 1] * p.scale;
            const float v0 = dv[4 * i + 2 * e2], v1 = dv[4 * i + 2 * e2 + 1];
            *(uint32_t *)(gk + key * p.dk_ss + col) = C::BF16 ? pack_bf16x2(k0, k1) : pack_f16x2(k0, k1);
            *(uint32_t *)(gv + key * p.dv_ss + col) = C::BF16 ? pack_bf16x2(v0, v1) : pack_f16x2(v0, v1);
        }
    }
}

/* The kernel's work for key block n of kv head hk, batch entry b: p holds
 * the tile's sequence lengths (VARLEN: its own copy, bwd_sm90_kernel), sq
 * where the sequence lies in the packed tensors and the workspace. */
template <class C>
__device__ __forceinline__ void bwd_sm90_body(const CUtensorMap &tm_q, const CUtensorMap &tm_k, const CUtensorMap &tm_v,
                                              const CUtensorMap &tm_do, const CUtensorMap &tm_stats,
                                              const BwdParams &p, const BwdSeq &sq, int n, int hk, int b) {
    constexpr int D = C::D, BN = C::BN, BM = C::BM, STAGES = C::STAGES;
    extern __shared__ uint8_t smem_raw[];
    const BwdSmem<C> sm(smem_raw);
    /* VARLEN: packed rows (batch coordinate 0) from the sequence's first */
    const int qrow0 = C::VARLEN ? sq.q0 : 0, krow0 = C::VARLEN ? sq.k0 : 0, bc = C::VARLEN ? 0 : b;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = threadIdx.x / 128;
    const BwdIter<C> iter(p, n);
    const int T = iter.total;
    if (threadIdx.x == 0) {
        mbar_init(sm.full_kv, 1);
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(&sm.full_qdo[s], 1);
            mbar_init(&sm.empty_qdo[s], C::EMPTY_ARRIVALS); /* each consumer warp; SPLIT_D: the writer */
        }
        ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
    }
    __syncthreads();

    if (wg == 0) {
        regs_dealloc<C::REGS_PRODUCER>();
        if (warp == 0 && lane == 0 && T > 0) {
            /* the producer */
            mbar_expect_tx_arrive(sm.full_kv, 2 * C::KV_BYTES);
            for (int c = 0; c < C::SLABS; ++c) {
                tma_load_4d(sm.k() + c * BN * 128, &tm_k, c * 64, krow0 + n * BN, hk, bc, sm.full_kv);
                tma_load_4d(sm.v() + c * BN * 128, &tm_v, c * 64, krow0 + n * BN, hk, bc, sm.full_kv);
            }
            for (int it = 0; it < T; ++it) {
                int h, m;
                iter.decode(it, hk, p, h, m);
                const int s = it % STAGES;
                if (it >= STAGES) mbar_wait<C::PSLEEP>(&sm.empty_qdo[s], ((it / STAGES) - 1) & 1);
                mbar_expect_tx_arrive(&sm.full_qdo[s], 2 * C::QT_BYTES + 2 * BM * 4);
                for (int c = 0; c < C::SLABS; ++c) {
                    tma_load_4d(sm.q(s) + c * BM * 128, &tm_q, c * 64, qrow0 + m * BM, h, bc, &sm.full_qdo[s]);
                    tma_load_4d(sm.dout(s) + c * BM * 128, &tm_do, c * 64, qrow0 + m * BM, h, bc, &sm.full_qdo[s]);
                }
                /* the 64 rows' LSE and D: [2 batch][heads][m_blocks][64] f32 (lse2, then dsum);
                 * VARLEN: [2][heads][rb_total][64] */
                if constexpr (C::VARLEN) {
                    tma_load_4d(sm.lse(s), &tm_stats, 0, sq.rb + m, h, 0, &sm.full_qdo[s]);
                    tma_load_4d(sm.dsum(s), &tm_stats, 0, sq.rb + m, h, 1, &sm.full_qdo[s]);
                } else {
                    tma_load_4d(sm.lse(s), &tm_stats, 0, m, h, b, &sm.full_qdo[s]);
                    tma_load_4d(sm.dsum(s), &tm_stats, 0, m, h, p.batch + b, &sm.full_qdo[s]);
                }
            }
        } else if (warp == 1 && T > 0) {
            /* the dQ writer: the first hand-over of each dQ stage is free
             * (SPLIT_D: the tile is in the Q/dO stage, freed by full_qdo) */
            if constexpr (!C::SPLIT_D)
                for (int q = 0; q < C::DQ_STAGES; ++q) named_bar_arrive(C::BAR_DQ_EMPTY + q, 288);
            for (int it = 0; it < T; ++it) {
                int h, m;
                iter.decode(it, hk, p, h, m);
                const int dqs = it % C::DQ_STAGES;
                named_bar_sync(C::BAR_DQ_FULL + dqs, 288);
                const size_t tile = C::VARLEN ? (size_t)h * p.rb_total + sq.rb + m
                                              : ((size_t)b * p.heads_q + h) * p.m_blocks + m;
                float *dst = p.dq_acc + tile * (size_t)(BM * D); /* the tile, bwd_dq_index's order */
                int *sem = p.dq_sem + tile;
                if (p.deterministic) {
                    /* key blocks add in order: 0 .. n - 1 (every block before
                     * n sees query block m if n does); SPT: from the last
                     * block that sees query block m down to n + 1, which
                     * started before this CTA (shortest-first grid) */
                    int turn = n;
                    if (p.spt) {
                        const int last = (m * BM + BM - 1 + p.causal_offset) / BN, nblk = (p.seqlen_k + BN - 1) / BN;
                        turn = min(last, nblk - 1) - n;
                    }
                    if (lane == 0)
                        while (ld_acquire_gpu(sem) != turn) {
                        }
                    __syncwarp();
                }
                if (lane == 0)
                    for (int buf = 0; buf < C::DQ_BUFS; ++buf) {
                        bulk_reduce_add_f32(dst, sm.dq(dqs, buf), C::DQ_TILE_BYTES);
                        bulk_commit_group();
                        /* deterministic: the two partial tiles (d64) one after the other */
                        if (p.deterministic) bulk_wait_all();
                    }
                if (p.deterministic) {
                    __syncwarp();
                    if (lane == 0) {
                        asm volatile("fence.proxy.async.global;\n" ::: "memory");
                        __threadfence();
                        atomicAdd(sem, 1);
                    }
                } else if (lane == 0) {
                    bulk_wait_read_all(); /* the buffer may be rewritten */
                }
                __syncwarp();
                if constexpr (C::SPLIT_D) {
                    /* the stage's tile is read: the stage back to the producer */
                    if (lane == 0) mbar_arrive(&sm.empty_qdo[dqs]);
                } else if (it + C::DQ_STAGES < T) {
                    named_bar_arrive(C::BAR_DQ_EMPTY + dqs, 288);
                }
            }
            if (lane == 0) bulk_wait_all();
        }
        return;
    }
    regs_alloc<C::REGS_CONSUMER>();
    if constexpr (C::SPLIT_D) {
        bwd_consumer_split_d<C>(sm, p, iter, n, hk, b, sq);
    } else {
        bwd_consumer<C>(sm, p, iter, n, hk, b, sq);
    }
}

template <class C>
__global__ void __launch_bounds__(C::THREADS, 1)
    bwd_sm90_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                    const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                    const __grid_constant__ CUtensorMap tm_stats, const __grid_constant__ BwdParams p) {
    int n = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
    if (C::LPT && p.lpt_group > 0) {
        /* groups of lpt_group (kv head, batch) pairs; in a group the key
         * block is the slowest index, so the longest CTAs (n = 0 sees every
         * query block) start first and a group's CTAs share its Q and dO in L2 */
        const int nblk = (p.seqlen_k + C::BN - 1) / C::BN, pairs = p.heads_kv * p.batch;
        const int per_group = p.lpt_group * nblk, g = blockIdx.x / per_group, r = blockIdx.x - g * per_group;
        const int gsize = min(p.lpt_group, pairs - g * p.lpt_group), hb = g * p.lpt_group + r % gsize;
        n = r / gsize, hk = hb % p.heads_kv, b = hb / p.heads_kv;
        if (p.spt) n = nblk - 1 - n;
    }
    if constexpr (C::VARLEN) {
        /* the grid covers the longest sequence: a key block past this one's
         * has nothing to do (and its dK, dV rows are another sequence's) */
        BwdSeq sq;
        int lq, lk;
        varlen_rows(p.cu_q, b, p.total_q, p.seqlen_q, sq.q0, lq);
        varlen_rows(p.cu_k, b, p.total_k, p.seqlen_k, sq.k0, lk);
        if (n * C::BN >= lk) return;
        sq.rb = bwd_varlen_rb(sq.q0, b);
        BwdParams ps = p;
        ps.seqlen_q = lq, ps.seqlen_k = lk, ps.causal_offset = lk - lq, ps.m_blocks = (lq + C::BM - 1) / C::BM;
        bwd_sm90_body<C>(tm_q, tm_k, tm_v, tm_do, tm_stats, ps, sq, n, hk, b);
    } else {
        bwd_sm90_body<C>(tm_q, tm_k, tm_v, tm_do, tm_stats, p, BwdSeq{0, 0, 0}, n, hk, b);
    }
}
