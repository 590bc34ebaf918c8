/* fwd_sm90.cuh - Hopper (sm_90a) 16-bit attention forward, FlashAttention-3 style.
 *
 * One persistent CTA per SM.  Warpgroup 0 is the producer: it gives registers
 * away and one thread issues TMA loads of the Q tile and of K and V tiles into
 * a STAGES-deep ring, each stage guarded by full/empty mbarriers.  Warpgroups
 * 1..NC are consumers, each owning 64 query rows of the BM = 64*NC row tile:
 *   S = Q K^T        wgmma, both operands in shared memory (SS)
 *   online softmax   registers, exp2 with scale*log2(e) folded in
 *   O += P V         wgmma with P from registers (RS), V MN-major (trans-b)
 * OVERLAP (paper §3.2, intra-warpgroup): S_{j} = Q K_j^T is issued together
 *   with O += P_{j-1} V_{j-1}; the softmax of block j runs while the PV GEMM
 *   is still in flight.
 * PINGPONG (paper §3.1, inter-warpgroup): consumers take turns issuing their
 *   GEMMs, ordered by named barriers, so one warpgroup's softmax hides under
 *   the other's GEMMs.
 * Key blocks are visited from the last to the first, so the blocks that need
 * a mask (seqlen_k tail, causal diagonal) come first and the rest run unmasked.
 * A warpgroup with no row in the sequence only keeps the protocol going for
 * its tile (SITOUT), and a causal warpgroup that sees none of its tile's first
 * key block does the same for that block (SKIPDIAG).  Part of a warpgroup's
 * Q can be copied into registers when its tile starts (QREG): those k-steps
 * of S = Q K^T then read only K from shared memory.
 *
 * Tile boundaries: each consumer warpgroup has its own 64-row Q buffer with its
 * own full/empty mbarriers, so its next Q is loaded as soon as it has issued
 * its own last QK^T, and the producer prefetches the next tile's Q into L2 a
 * whole tile ahead (QEARLY: two Q buffers, the next Q loaded a tile ahead).  The producer alone picks tiles and hands each consumer
 * warpgroup the index through a shared slot published with its Q barrier
 * (an index >= num_tiles ends the consumers' loop).  Non-causal tiles are
 * all equally long: static round-robin.  Causal tiles are not: they are
 * grabbed from a global counter (greedy over a longest-first list), which
 * the last CTA to finish resets to zero for the next launch.  The pingpong
 * token goes round the consumers without a break across tiles: warpgroup 0
 * starts tile t+1 while the last warpgroup still finishes tile t.
 *
 * Epilogue: O / l from registers; with two consumer warpgroups each quad
 * transposes its packed pairs so every lane stores 16 contiguous bytes.  With
 * OTMA each warp stages its rows in shared memory (stmatrix) and stores them
 * with TMA, after its next tile's first QK^T (OTMA 2).
 * CLUSTER 2 (d256 non-causal): CTA pairs on adjacent query blocks of one head
 * share each K/V load through TMA multicast.  Timeline probe: FWD_TRACE.
 *
 * Shared tiles use the 128-byte swizzle: a head_dim-D tile is D/64 "slabs" of
 * rows x 64 elements (128 bytes per row), each written by one TMA box.
 */
#pragma once
#include <math.h>
#include <stdint.h>

#include "../common/ptx.cuh"

/* Timeline probe for experiments (bench/fwd_trace.cu): compiled only with
 * -DFATTN_FWD_TRACE=<cta>; thread 0 of each warpgroup of that CTA records
 * (clock64 << 8 | event) at the points marked FWD_TRACE. */
#ifdef FATTN_FWD_TRACE
#define FWD_TRACE_N 4096
__device__ unsigned long long fwd_trace_buf[4][FWD_TRACE_N];
__device__ int fwd_trace_len[4];
#define FWD_TRACE(code)                                                                                \
    do {                                                                                               \
        if (blockIdx.x == FATTN_FWD_TRACE && threadIdx.x % 128 == 0 && trace_n < FWD_TRACE_N)          \
            fwd_trace_buf[threadIdx.x / 128][trace_n++] = ((unsigned long long)clock64() << 8) | (code); \
    } while (0)
#define FWD_TRACE_END() \
    do { if (blockIdx.x == FATTN_FWD_TRACE && threadIdx.x % 128 == 0) fwd_trace_len[threadIdx.x / 128] = trace_n; } while (0)
#else
#define FWD_TRACE(code) do { } while (0)
#define FWD_TRACE_END() do { } while (0)
#endif

struct FwdParams {
    void *o;
    float *lse;
    int64_t o_sb, o_ss, o_sh; /* O strides, elements */
    int o_wide;               /* O base 16-byte aligned, strides multiples of 8: 16-byte stores; 2: and OTMA's map of O */
    int batch, heads_q, heads_kv, group; /* group = heads_q / heads_kv */
    int seqlen_q, seqlen_k;
    int causal_offset; /* seqlen_k - seqlen_q */
    int num_m_blocks, num_tiles;
    int head_group;  /* causal schedule: (batch, head) pairs per group ... */
    int head_groups; /* ... and the number of groups; the last takes the rest */
    unsigned *tile_counter; /* causal: [next tile - gridDim.x, CTAs done], zero between launches */
    float softmax_scale, scale_log2;
};

/* SPLIT (perf-notes v30): the kernel's second parameter block, only in the
 * instances with SPLIT (with these tables in FwdParams every kernel's
 * key-block loop changed, d128 811 -> 817 SASS instructions).  Workers are
 * CTAs, or CTA pairs with a cluster; work tiles are tiles, or pairs of tiles.  Each worker runs its first `waves` items
 * whole, in the static order; the work tiles from `first` on (those that do
 * not fill a wave) are laid end to end as key blocks, and each worker w <
 * `workers` takes an equal run of them: at most two pieces, the end of one
 * tile and the start of the next.  The host lays this out in the tables, so
 * the kernel divides nothing: ranges computed in the kernel (from the tile
 * count, or with runtime divisions) moved the key-block loop's counters and
 * descriptors off the uniform datapath, 817 -> 866-901 SASS instructions per
 * block at d128. */
#define FWD_SPLIT_MAX_WORKERS 160 /* H100 / H200 have 132 SMs */
struct FwdSplit {
    int waves, first, workers;
    float4 *ws;      /* two slots per worker: partial O, row max, row sum (fragment order) */
    unsigned *count; /* pieces done per tail tile, CTA of a pair, warpgroup and warp; zero between launches */
    int tile[FWD_SPLIT_MAX_WORKERS];    /* worker w: work tile of its first piece */
    int rng[2][FWD_SPLIT_MAX_WORKERS];  /* worker w: key blocks lo | hi << 16 of its pieces (0: none) */
    int owners[FWD_SPLIT_MAX_WORKERS];  /* tail tile r: workers first | last << 16 of its pieces */
};
struct FwdNoSplit {};

template <int D_, int BN_, int NC_, int STAGES_, bool CAUSAL_, bool BF16_,
          int OVERLAP_ /* 0 off; on: 1 measured wait placement, 2 wait where ptxas puts it, 3 fenced */,
          bool PINGPONG_,
          int SCHED_ = -1 /* 1 dynamic, 0 static, -1 dynamic for causal only */,
          int LAZY_ = -1 /* 1 lazy rescaling, 0 eager, -1 measured choice per D */,
          int CLUSTER_ = 1 /* 2: CTA pairs share each K/V load (TMA multicast) */,
          int OSTORE_ = -1 /* O stores: 16 bytes after a quad transpose (when O allows) or 4; -1: 16 with 2 consumers */,
          int XTILE_ = 0 /* 1: a tile's last PV GEMM goes with the next tile's first QK^T (an experiment) */,
          int QEARLY_ = 0 /* 1: two Q buffers per warpgroup, each tile's Q loaded a tile early (perf-notes v17) */,
          bool SLEEP_ = false /* true: mbarrier waits sleep (suspend-time hint; perf-notes v16, v20) */,
          int L2HINT_ = 0 /* 1: K and V loaded with L2 evict_last; 2: and Q with evict_first (perf-notes v18) */,
          int ROWMASK_ = 0 /* 1: query rows past seqlen_q masked, so their P is 0 (perf-notes v19) */,
          int TREEMAX_ = 0 /* 1: each row's block max as a pairwise tree, not a chain (perf-notes v21) */,
          int SITOUT_ = 0 /* 1: a warpgroup with no row before seqlen_q skips its tile's work (perf-notes v22); 2: with SPLIT only (v31) */,
          int SPREAD_ = 0 /* 1: static order k*G + (c + k) mod G, so each CTA's m cycles (perf-notes v22); 2: with SPLIT only (v31) */,
          int SKIPDIAG_ = 0 /* 1: causal: a warpgroup skips its tile's first key block when it sees none of it (perf-notes v23) */,
          int QREG_ = 0 /* k > 0: the first k 16-column slices of each warpgroup's Q in registers for S = Q K^T, -1 all (perf-notes v26) */,
          int SPLIT_ = 0 /* 1: tiles past the last full wave split along the keys (FwdSplit, perf-notes v30) */,
          int UNIWG_ = 0 /* 1: the consumer's warpgroup index through a lane-0 shuffle without SITOUT (perf-notes v32); 2: the Q descriptor rebuilt per key block (v32b); neither shipped */,
          int OTMA_ = 0 /* 1: O through shared memory and a TMA store, per warp (perf-notes v43); 2: the store issued after the next tile's first QK^T */>
struct FwdCfg {
    static constexpr int D = D_, BN = BN_, NC = NC_, STAGES = STAGES_;
    static constexpr bool CAUSAL = CAUSAL_, BF16 = BF16_, OVERLAP = OVERLAP_ != 0, PINGPONG = PINGPONG_ && NC_ > 1;
    /* Where the wait for the PV GEMM lands (perf-notes v8).  Fenced (3),
     * the softmax runs under the warpgroup's own PV GEMM, the paper's
     * placement; unfenced (2), ptxas hoists the wait above the softmax, which
     * then overlaps only the other warpgroups' GEMMs.  Measured interleaved
     * (runs 18-19, back to back): fenced +2-3% for d64 non-causal, -1..-11%
     * for d128 and -4..-7% for the causal d64 (3 warpgroups) and d128
     * kernels, d256 +-1.5%.  With settled timing (runs 29, 32, 34) fenced
     * d128 non-causal is +0..+3% (7 of 7 ablation rounds ahead), d256
     * -0.2..+2%.  1 takes the measured choice: fenced for d64 and d128
     * non-causal. */
    static constexpr bool SCHED_FENCE = OVERLAP_ == 3 || (OVERLAP_ == 1 && D_ <= 128 && !CAUSAL_);
    static constexpr int BM = 64 * NC;
    static constexpr int THREADS = 128 * (NC + 1);
    static constexpr int SLABS = D / 64;
    /* XTILE: the overlap runs on across tile boundaries: a warpgroup issues
     * its next tile's first QK^T together with its last PV GEMM, then runs
     * that block's softmax and the finished tile's epilogue under the other
     * warpgroups' GEMMs.  Needs the next Q in shared memory a tile early, so
     * each warpgroup has two Q buffers (QBUF), used by alternate tiles.
     * Measured 1-11% slower (perf-notes v7): off unless asked for. */
    static constexpr bool XTILE = XTILE_ == 1;
    /* QEARLY: the producer's side of XTILE alone: two Q buffers per
     * consumer warpgroup, and the next tile's Q is loaded while the
     * current tile starts, so it has landed before the tile boundary; the
     * consumers run each tile as without it. */
    static constexpr bool QEARLY = XTILE || QEARLY_ == 1;
    static constexpr int QBUF = QEARLY ? 2 : 1;
    /* SLEEP: mbarrier waits with a suspend-time hint, so a waiting warp
     * sleeps in NANOSLEEP.SYNCS instead of re-issuing TRYWAIT in a loop
     * (ptx.cuh).  Measured against the loop (runs 36 and 41, back to back):
     * -0.5..-1.8% for d128 / d256 non-causal, d256 causal and d64 causal with
     * 2 warpgroups, +0.3..+1.8% for d128 causal and d64 causal with 3, which
     * are the kernels launched with it (fwd_sm90_hdim*.cu). */
    static constexpr bool SLEEP = SLEEP_;
    /* L2HINT: TMA loads of K and V carry an L2 evict_last policy (FA3 does
     * the same), so the K/V of the heads in flight stay in L2 while Q and O
     * stream past; 2 also marks the Q loads evict_first. */
    static constexpr int L2HINT = L2HINT_;
    /* ROWMASK: a warpgroup with rows past seqlen_q (the last m-block; with
     * BM 192 and seqlen 1024 two of its three warpgroups have no valid row)
     * masks those rows' scores, so their P is 0 and the PV GEMM multiplies
     * zeros instead of ones (Q past the end is TMA's zero fill, S = 0, P = 1):
     * the same output, less switching in the tensor cores. */
    static constexpr bool ROWMASK = ROWMASK_ == 1;
    /* TREEMAX: the max of a row's BN/4 scores in a thread as a pairwise
     * tree (depth log2(BN/8) + 1) instead of the chain ptxas keeps from
     * the source loop (BN/8 dependent FMNMX), which sits between S and the
     * first exponential. */
    static constexpr bool TREEMAX = TREEMAX_ == 1;
    /* SITOUT: a consumer warpgroup whose 64 rows all lie past seqlen_q (the
     * last m-block of a length that BM does not divide) gets no Q and runs
     * a loop of its own over the tile's key blocks: it only waits for each
     * K and V, releases the stages and passes the pingpong token as often as
     * a working warpgroup does, so the tile's other warpgroups run with
     * fewer partners and the tile ends sooner.  SITOUT_ (and SPREAD_) 2:
     * only in the SPLIT instance, not in its NoSplit twin: at d128 the split
     * instance's loop then loses its 16 R2UR (819 -> 798 SASS instructions
     * per block) and runs 2.3-3.0% faster where it splits, while the
     * unsplit kernel with SITOUT loses 1.3% (runs 48, 74, 75; perf-notes v31). */
    static constexpr bool SITOUT = (SITOUT_ == 1 || (SITOUT_ == 2 && SPLIT_ == 1)) && !XTILE;
    /* SPREAD: static (non-dynamic) order.  CTA c's k-th tile is
     * k*G + (c + CLUSTER*k) mod G instead of k*G + c (G = gridDim.x): each
     * wave covers the same tiles (the same heads in L2), but a CTA's m-block
     * changes from wave to wave, so the cheap tiles SITOUT makes (the last
     * m-block) are shared out instead of all landing on the CTAs with
     * c = num_m_blocks - 1 (mod num_m_blocks) when num_m_blocks divides G. */
    static constexpr bool SPREAD = SPREAD_ == 1 || (SPREAD_ == 2 && SPLIT_ == 1);
    /* SKIPDIAG (causal): the tile's first key block (the last one, visited
     * first) ends past the tile's last row, so with three warpgroups, or
     * BN not a multiple of 64, the first warpgroups may see none of its
     * keys: their QK^T, softmax and PV of that block only multiply masked
     * scores.  Such a warpgroup only waits for the block's K and V, passes
     * the pingpong token once and releases the stages, then starts its tile
     * at the next block. */
    static constexpr bool SKIPDIAG = SKIPDIAG_ == 1 && CAUSAL_ && !XTILE;
    /* QREG: when its tile starts, a warpgroup copies the first QREGK
     * 16-column slices of its 64 Q rows from shared memory into registers
     * (ldmatrix, the wgmma A fragment); those k-steps of every S = Q K^T read
     * only K from shared memory (RS wgmma, B K-major), the others stay SS.
     * Costs 4 registers per thread and slice.  With all D/16 slices
     * (QREG_ALL) the Q buffer goes back to the producer at once; else after
     * the tile's last QK^T, as without QREG. */
    static constexpr int QREGK = XTILE ? 0 : QREG_ < 0 ? D / 16 : (QREG_ < D / 16 ? QREG_ : D / 16);
    static constexpr bool QREG = QREGK > 0;
    static constexpr bool QREG_ALL = QREGK == D / 16; /* the Q buffer goes back at the tile's start */
    static constexpr int Q_BYTES = BM * D * 2; /* one Q buffer set */
    static constexpr int QWG_BYTES = 64 * D * 2; /* one consumer warpgroup's Q rows */
    static constexpr int KV_BYTES = BN * D * 2;
    /* Shared layout (offsets from a 1024-aligned base). */
    static constexpr int OFF_Q = 0;
    static constexpr int OFF_K = OFF_Q + QBUF * Q_BYTES;
    static constexpr int OFF_V = OFF_K + STAGES * KV_BYTES;
    static constexpr int OFF_BAR = OFF_V + STAGES * KV_BYTES;
    static constexpr int NUM_BARS = 4 * STAGES + 2 * NC * QBUF;
    static constexpr int OFF_SLOT = OFF_BAR + NUM_BARS * 8; /* tile index per consumer warpgroup and Q buffer */
    static constexpr bool SPLIT = SPLIT_ == 1;
    /* UNIWG 1: the warpgroup index through the lane-0 shuffle SITOUT uses
     * (see there), so the Q descriptors are known to be warp-uniform; 2: the
     * Q descriptor rebuilt per key block (experiments, v32, v32b) */
    static constexpr int UNIWG = UNIWG_;
    /* the same kernel without SPLIT, which runs when the host splits nothing
     * (without SITOUT the split instance's key-block loop is 0.5-3% longer:
     * d128 810 -> 819, d256 CTA pairs 655 -> 676 SASS instructions; with
     * SITOUT_ 2 only the split instance takes it: 798, 656; v31) */
    using NoSplit = FwdCfg<D_, BN_, NC_, STAGES_, CAUSAL_, BF16_, OVERLAP_, PINGPONG_, SCHED_, LAZY_, CLUSTER_, OSTORE_,
                           XTILE_, QEARLY_, SLEEP_, L2HINT_, ROWMASK_, TREEMAX_, SITOUT_, SPREAD_, SKIPDIAG_, QREG_, 0,
                           UNIWG_, OTMA_>;
    /* OTMA: each consumer warp stages its 16 rows of O / l in shared memory
     * (stmatrix into the 128-byte swizzle, D / 64 slabs of 16 x 128 bytes)
     * and one lane stores them with TMA (box 64 x 16; rows past seqlen_q
     * are outside the tensor and not written).  Before the warp writes its
     * staging again, that lane waits until the previous store has read it.
     * Only where O's base and strides suit TMA (FwdParams.o_wide 2), else
     * the register stores below; needs NC x 8 KB (d64) or 16 KB (d128) of
     * shared memory, which d128 BN 176 and d256 do not have. */
    static constexpr bool OTMA = OTMA_ != 0;
    /* OTMA 2: the TMA store is issued only once the warp has issued its
     * next tile's first QK^T (or at its end), not at the tile boundary,
     * where the next tile's first K and V loads wait */
    static constexpr bool OTMA_LATE = OTMA_ == 2;
    static constexpr int END_SLOT = OFF_SLOT + NC * QBUF * 4;
    static constexpr int OFF_OST = (END_SLOT + 1023) / 1024 * 1024;
    static constexpr int OST_WARP_BYTES = 16 * D * 2;
    static constexpr int SMEM_BYTES = (OTMA ? OFF_OST + 4 * NC * OST_WARP_BYTES : END_SLOT) + 1024; /* + alignment slack */
    static constexpr bool DYNAMIC = SCHED_ < 0 ? CAUSAL : SCHED_ == 1; /* tile scheduler: atomic counter */
    /* CLUSTER 2: the two CTAs of a cluster work on tiles 2k and 2k+1, adjacent
     * m-blocks of one head (the launcher requires an even number of m-blocks),
     * in lockstep over the same key blocks.  Each CTA's producer loads half
     * the slabs of every K and V block and multicasts them to both, so the
     * L2 -> SM traffic for K and V halves; a stage is refilled only when the
     * consumers of both CTAs have released it. */
    static constexpr int CLUSTER = CLUSTER_;
    /* three consumers (160 registers) spill 4-32 bytes with the transpose */
    static constexpr int OSTORE = OSTORE_ < 0 ? (NC == 2 ? 16 : 4) : OSTORE_;
    /* lazy rescaling (FA4): a row's reference max moves only when the block
     * max exceeds it by more than LAZY_LOG2 (log2 units), so P <= 2^8 and O
     * is rescaled only by warps where some row's reference moved.  Measured
     * interleaved against eager (perf-notes v5): d64 +1-4%, d256 +3-7%, d128
     * -1-2% (causal +-1%). */
    static constexpr bool LAZY = LAZY_ < 0 ? D_ != 128 : LAZY_ == 1;
    static constexpr float LAZY_LOG2 = 8.f;
    /* Registers per thread after setmaxnreg (FA3's split, HOPPER-PTX §6). */
    static constexpr int REGS_PRODUCER = NC == 2 && CLUSTER_ == 1 ? 24 : 32; /* 24 spills with a cluster */
    static constexpr int REGS_CONSUMER = NC == 2 ? (CLUSTER_ == 1 ? 240 : 232) : 160;
    /* setmaxnreg.inc waits until the CTA's pool (the launch's 168 x THREADS
     * for NC 2) has the registers: the split must fit in it, or the
     * consumers hang (32 + 2 x 240 did, run 11) */
    static_assert(REGS_PRODUCER * 128 + REGS_CONSUMER * 128 * NC <= 65536 / (128 * (NC + 1)) / 8 * 8 * 128 * (NC + 1),
                  "register split exceeds the launch allocation");
    static_assert(D % 64 == 0 && BN % 16 == 0 && BN <= 256 && D <= 256, "tile shape");
    static_assert(SMEM_BYTES <= 227 * 1024, "shared memory");
    static_assert(CLUSTER == 1 || (CLUSTER == 2 && SLABS % 2 == 0 && !CAUSAL && !DYNAMIC), "cluster variant");
    static_assert(!SPLIT || (!CAUSAL && !DYNAMIC && !XTILE && !QEARLY), "SPLIT: static non-causal kernels");
};

/* Tile t -> (m_block, head, batch).  Non-causal: m fastest, so the CTAs in
 * flight share the K/V of one or two heads in L2.  Causal: heads are taken in
 * p.head_groups groups of p.head_group (the last takes the rest, up to twice
 * that); inside a group the longest rows (largest m) come first, so each
 * group's tail is short tiles. */
template <bool CAUSAL>
__device__ __forceinline__ void fwd_tile_decode(const FwdParams &p, int t, int &m, int &h, int &b) {
    int bh;
    if (CAUSAL) {
        const int nbh = p.batch * p.heads_q;
        const int per_group = p.head_group * p.num_m_blocks;
        const int g = min(t / per_group, p.head_groups - 1), within = t - g * per_group;
        const int gsize = g == p.head_groups - 1 ? nbh - g * p.head_group : p.head_group;
        m = p.num_m_blocks - 1 - within / gsize;
        bh = g * p.head_group + within % gsize;
    } else {
        m = t % p.num_m_blocks;
        bh = t / p.num_m_blocks;
    }
    h = bh % p.heads_q;
    b = bh / p.heads_q;
}

/* Number of key blocks tile m must visit (0 when every row is masked). */
template <class C>
__device__ __forceinline__ int fwd_num_n_blocks(const FwdParams &p, int m) {
    int n = (p.seqlen_k + C::BN - 1) / C::BN;
    if (C::CAUSAL) {
        /* last visible key of the tile's last row: (m+1)*BM - 1 + offset */
        int last = (m + 1) * C::BM - 1 + p.causal_offset;
        int nc = last < 0 ? 0 : last / C::BN + 1;
        n = nc < n ? nc : n;
    }
    return n;
}

/* The kernel's body; sp: the FwdSplit parameter with SPLIT (the kernels
 * without SPLIT keep the parameter list they had: an empty struct after
 * FwdParams moved the d256 CTA-pair kernel's key-block loop from 656 to 669
 * SASS instructions). */
template <class C, class SP>
__device__ __forceinline__ void fwd_sm90_body(const CUtensorMap &tm_q, const CUtensorMap &tm_k,
                                              const CUtensorMap &tm_v, const FwdParams p, const SP &sp,
                                              const CUtensorMap *tm_o /* OTMA only */) {
    constexpr int D = C::D, BN = C::BN, BM = C::BM, NC = C::NC, STAGES = C::STAGES;
    using WG = wgmma_op<BN, C::BF16>;  /* S = Q K^T: m64 n=BN k16 */
    using WGO = wgmma_op<D, C::BF16>;  /* O += P V:  m64 n=D  k16 */

    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sQ = smem + C::OFF_Q;
    uint8_t *sK = smem + C::OFF_K;
    uint8_t *sV = smem + C::OFF_V;
    uint64_t *bars = (uint64_t *)(smem + C::OFF_BAR);
    uint64_t *full_k = bars, *empty_k = bars + STAGES, *full_v = bars + 2 * STAGES, *empty_v = bars + 3 * STAGES;
    /* one pair per consumer warpgroup and Q buffer: index w * QBUF + buffer */
    uint64_t *full_q = bars + 4 * STAGES, *empty_q = full_q + NC * C::QBUF;
    int *tile_slot = (int *)(smem + C::OFF_SLOT); /* st/ld_shared_s32 only */

    const int warpgroup = threadIdx.x / 128;
    const int tid = threadIdx.x % 128;
    const int warp = tid / 32, lane = tid % 32;
#ifdef FATTN_FWD_TRACE
    int trace_n = 0;
#endif

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(&full_k[s], 1);
            mbar_init(&full_v[s], 1);
            /* one arrival per consumer warp, after its wgmma reads are waited for */
            mbar_init(&empty_k[s], 4 * NC * C::CLUSTER);
            mbar_init(&empty_v[s], 4 * NC * C::CLUSTER);
        }
        for (int w = 0; w < NC * C::QBUF; ++w) {
            mbar_init(&full_q[w], 1);
            mbar_init(&empty_q[w], 128); /* every consumer thread: it read the tile slot */
        }
        ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
    }
    /* with a cluster, the peer's barriers must be initialised before this
     * CTA multicasts into its shared memory or arrives on them */
    if (C::CLUSTER > 1) cluster_sync_all();
    else __syncthreads();
    const uint32_t cta_rank = C::CLUSTER > 1 ? cluster_ctarank() : 0;
    /* Programmatic dependent launch: the set-up above may overlap the tail of
     * the previous kernel in the stream; nothing below touches global memory
     * before that kernel has finished.  The next kernel may be scheduled as
     * soon as this one's CTAs leave SMs (it waits the same way). */
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

    if (warpgroup == 0) {
        /* ------------------------------ producer ------------------------------ */
        regs_dealloc<C::REGS_PRODUCER>();
        if (warp != 0 || lane != 0) {
            /* a CTA leaves only when its peer is done with its shared memory */
            if (C::CLUSTER > 1) cluster_sync_all();
            return;
        }
        tma_prefetch_desc(&tm_q);
        tma_prefetch_desc(&tm_k);
        tma_prefetch_desc(&tm_v);
        int it = 0, q_iter = 0;
        const uint64_t pol_kv = C::L2HINT ? l2_policy_evict_last() : 0;
        const uint64_t pol_q = C::L2HINT == 2 ? l2_policy_evict_first() : 0;
        /* Hand warpgroup w its next tile: wait until it has released the Q
         * buffer (its last QK^T of the tile that last used that buffer), write
         * the tile index, then load that tile's Q rows, or just arrive (no
         * key to see, the end, or with SITOUT no row of w in the sequence);
         * the arrive on full_q publishes the index (release semantics).
         * ++q_iter after all warpgroups. */
        auto hand_over = [&](int w, int tile, bool load, int m, int h, int b) {
            const int qb = q_iter % C::QBUF, qi = w * C::QBUF + qb;
            if (q_iter >= C::QBUF) mbar_wait<C::SLEEP>(&empty_q[qi], (q_iter / C::QBUF - 1) & 1);
            st_shared_s32(&tile_slot[qi], tile);
            if (!load || (C::SITOUT && m * BM + w * 64 >= p.seqlen_q)) {
                mbar_arrive(&full_q[qi]);
                return;
            }
            mbar_expect_tx_arrive(&full_q[qi], C::QWG_BYTES);
            for (int c = 0; c < C::SLABS; ++c) {
                uint8_t *dst = sQ + qb * C::Q_BYTES + c * BM * 128 + w * 64 * 128;
                if (C::L2HINT == 2) tma_load_4d_hint(dst, &tm_q, c * 64, m * BM + w * 64, h, b, &full_q[qi], pol_q);
                else tma_load_4d(dst, &tm_q, c * 64, m * BM + w * 64, h, b, &full_q[qi]);
            }
        };
        /* all consumer warpgroups' next tile (QEARLY: handed over a tile early) */
        auto hand_over_all = [&](int tile) {
            int m = 0, h = 0, b = 0;
            bool load = tile < p.num_tiles;
            if (load) {
                fwd_tile_decode<C::CAUSAL>(p, tile, m, h, b);
                load = fwd_num_n_blocks<C>(p, m) > 0;
            }
            for (int w = 0; w < NC; ++w) hand_over(w, tile, load, m, h, b);
            ++q_iter;
        };
        /* K or V block n into a stage: all slabs, or with a cluster this
         * CTA's half of them, multicast to both CTAs (each CTA's full
         * barrier expects the whole block: its own half and the peer's) */
        auto load_kv = [&](uint8_t *dst, const CUtensorMap *map, int n, int hk, int b, uint64_t *bar) {
            constexpr int PER_CTA = C::SLABS / C::CLUSTER;
#pragma unroll
            for (int i = 0; i < PER_CTA; ++i) {
                const int c = (int)cta_rank * PER_CTA + i;
                if (C::CLUSTER > 1 && C::L2HINT)
                    tma_load_4d_multicast_hint(dst + c * BN * 128, map, c * 64, n * BN, hk, b, bar, (uint16_t)0x3,
                                               pol_kv);
                else if (C::CLUSTER > 1)
                    tma_load_4d_multicast(dst + c * BN * 128, map, c * 64, n * BN, hk, b, bar, (uint16_t)0x3);
                else if (C::L2HINT)
                    tma_load_4d_hint(dst + c * BN * 128, map, c * 64, n * BN, hk, b, bar, pol_kv);
                else
                    tma_load_4d(dst + c * BN * 128, map, c * 64, n * BN, hk, b, bar);
            }
        };
        /* a K/V stage is free: with a cluster its arrivals come from both CTAs */
        auto wait_empty = [&](uint64_t *bar, uint32_t parity) {
            if (C::CLUSTER > 1) mbar_wait_cluster<C::SLEEP>(bar, parity);
            else mbar_wait<C::SLEEP>(bar, parity);
        };
        /* static tiles t, t + gridDim.x, ...: with a cluster (gridDim.x even,
         * peers at blockIdx 2c and 2c+1) the peers hold tiles 2k and 2k+1 */
        /* SPREAD: the k-th static tile rotated within its wave (a cluster's
         * peers, 2c and 2c+1, stay on tiles 2j and 2j+1) */
        auto static_tile = [&](int k) {
            return C::SPREAD ? k * (int)gridDim.x + ((int)blockIdx.x + C::CLUSTER * k) % (int)gridDim.x
                             : k * (int)gridDim.x + (int)blockIdx.x;
        };
        /* SPLIT: this CTA's k-th item, a tile and its key-block range lo | hi
         * << 16 (FwdSplit); num_tiles when it has no more */
        auto split_item = [&](int k, int &rng) {
            if constexpr (C::SPLIT) {
                if (k < sp.waves) {
                    const int st = static_tile(k);
                    return st < p.num_tiles ? st : p.num_tiles;
                }
                const int w = (int)blockIdx.x / C::CLUSTER, j = k - sp.waves;
                if (w >= sp.workers || j > 1 || sp.rng[j][w] == 0) return p.num_tiles;
                rng = sp.rng[j][w];
                return (sp.tile[w] + j) * C::CLUSTER + (int)cta_rank;
            } else {
                (void)rng;
                return static_tile(k);
            }
        };
        int rng = fwd_num_n_blocks<C>(p, 0) << 16; /* SPLIT: whole tiles until the tail */
        int t = C::SPLIT ? split_item(0, rng) : (int)blockIdx.x; /* else grid <= num_tiles; static_tile(0) */
        int wave = 0;
        if (C::QEARLY) hand_over_all(t);
        for (bool go = !C::SPLIT || t < p.num_tiles; go;) {
            /* the next tile is picked one ahead, so its Q can be prefetched */
            ++wave;
            int rng_next = rng;
            const int t_next = C::DYNAMIC ? (int)gridDim.x + (int)atomicAdd(&p.tile_counter[0], 1u)
                               : C::SPLIT ? split_item(wave, rng_next)
                                          : static_tile(wave);
            int m, h, b;
            fwd_tile_decode<C::CAUSAL>(p, t, m, h, b);
            const int nblocks = fwd_num_n_blocks<C>(p, m);
            const int n_lo = C::SPLIT ? rng & 0xffff : 0, n_hi = C::SPLIT ? rng >> 16 : nblocks;
            const int hk = h / p.group;
            FWD_TRACE(20);
            /* Q is read once, from DRAM: start pulling the next tile's Q into
             * L2 now, a tile ahead of its load into shared memory (QEARLY
             * loads that Q itself after this tile's first V: no prefetch) */
            if (!C::QEARLY && t_next < p.num_tiles) {
                int m2, h2, b2;
                fwd_tile_decode<C::CAUSAL>(p, t_next, m2, h2, b2);
                for (int w = 0; w < NC; ++w)
                    for (int c = 0; c < C::SLABS; ++c) tma_prefetch_l2_4d(&tm_q, c * 64, m2 * BM + w * 64, h2, b2);
            }
            if (nblocks == 0) {
                /* every row masked: the consumers only write O = 0, LSE = -inf
                 * (QEARLY: this tile was handed over already; hand over the next) */
                if (C::QEARLY) {
                    hand_over_all(t_next);
                } else {
                    for (int w = 0; w < NC; ++w) hand_over(w, t, false, m, h, b);
                    ++q_iter;
                }
            }
            for (int n = n_hi - 1; n >= n_lo; --n, ++it) {
                const int s = it % STAGES;
                const uint32_t ph = (it / STAGES) & 1;
                wait_empty(&empty_k[s], ph ^ 1);
                FWD_TRACE(21);
                mbar_expect_tx_arrive(&full_k[s], C::KV_BYTES);
                load_kv(sK + s * C::KV_BYTES, &tm_k, n, hk, b, &full_k[s]);
                if (!C::QEARLY && n == n_hi - 1) {
                    /* the first K's stage frees before the Q buffers do (one
                     * block earlier), so K goes first; then each warpgroup's
                     * tile index and Q, as soon as that warpgroup has issued
                     * its last QK^T of the previous tile */
                    for (int w = 0; w < NC; ++w) hand_over(w, t, true, m, h, b);
                    ++q_iter;
                    FWD_TRACE(22);
                }
                wait_empty(&empty_v[s], ph ^ 1);
                FWD_TRACE(23);
                mbar_expect_tx_arrive(&full_v[s], C::KV_BYTES);
                load_kv(sV + s * C::KV_BYTES, &tm_v, n, hk, b, &full_v[s]);
                /* QEARLY: the next tile's Q goes into the other buffer during
                 * this tile.  That buffer's previous tile (two back) has
                 * issued its last QK^T by now: the V stage just waited for
                 * was freed after it. */
                if (C::QEARLY && n == n_hi - 1) hand_over_all(t_next);
            }
            t = t_next;
            rng = rng_next;
            if (t >= p.num_tiles) break;
        }
        /* end of work for the consumers (QEARLY: handed over with the last tile) */
        if (!C::QEARLY) hand_over_all(p.num_tiles);
        if (C::DYNAMIC) {
            /* every CTA's last grab precedes its "done"; the last one done
             * rewinds the counter for the next launch in the stream */
            __threadfence();
            if (atomicAdd(&p.tile_counter[1], 1u) == gridDim.x - 1) {
                p.tile_counter[0] = 0;
                p.tile_counter[1] = 0;
                __threadfence();
            }
        }
        FWD_TRACE_END();
        if (C::CLUSTER > 1) cluster_sync_all();
        return;
    }

    /* ------------------------------ consumers ------------------------------ */
    regs_alloc<C::REGS_CONSUMER>();
    /* SITOUT: the warpgroup index through a lane-0 shuffle, which the
     * compiler knows to be warp-uniform: from threadIdx, the sit-out branch
     * looked divergent and the stage counter and descriptors of the
     * key-block loop left the uniform datapath (d64: 611 -> 644 SASS
     * instructions per block).  Without SITOUT the shuffle moves other
     * kernels' loops by -32..+13 instructions: kept out of them. */
    const int wg = C::SITOUT || C::UNIWG == 1 ? __shfl_sync(0xffffffffu, warpgroup - 1, 0) : warpgroup - 1;
    const int r0 = 16 * warp + lane / 4; /* accumulator rows r0 and r0 + 8 (HOPPER-PTX §3) */
    const int q4 = lane % 4;
    const float c2 = p.scale_log2;
    const int bar_self = 8 + wg, bar_next = 8 + (wg + 1) % NC;

    float sacc[BN / 2];
    float oacc[D / 2];
    uint32_t pfrag[BN / 16][4];
    uint32_t qfrag[C::QREG ? C::QREGK : 1][4]; /* QREG: this tile's Q, A fragments per 16 columns */

    /* Pingpong token ring over the consumers (named barriers 8 .. 8+NC-1),
     * kept going across tiles: warpgroup 0 holds the token first. */
    if (C::PINGPONG && wg == NC - 1) named_bar_arrive(8, 256);
    auto pp_sync = [&]() {
        if (C::PINGPONG) named_bar_sync(bar_self, 256);
    };
    auto pp_arrive = [&]() {
        if (C::PINGPONG) named_bar_arrive(bar_next, 256);
    };
    /* a K/V stage is released to this CTA's producer and, with a cluster, to
     * the peer's, whose multicast refills it here too */
    auto release = [&](uint64_t *bar) {
        __syncwarp();
        if (lane == 0) mbar_arrive(bar);
        if (C::CLUSTER > 1 && lane == 1) mbar_arrive_cluster(bar, cta_rank ^ 1u);
    };
    /* A key block this warpgroup has no use for (SITOUT, SKIPDIAG): its
     * pingpong turn and the release of its two stages, nothing else (the
     * waits spin: sleeping ones lengthened the 3-warpgroup causal loop) */
    auto pass_block = [&](int s, uint32_t ph) {
        mbar_wait<false>(&full_k[s], ph);
        pp_sync();
        pp_arrive();
        release(&empty_k[s]);
        mbar_wait<false>(&full_v[s], ph);
        release(&empty_v[s]);
    };
    /* O += P V_s (issue only). */
    auto issue_pv = [&](int s) {
        const uint64_t desc_v = smem_desc_sw128(sV + s * C::KV_BYTES, BN * 128, 1024);
#pragma unroll
        for (int ks = 0; ks < BN / 16; ++ks)
            WGO::rs(oacc, pfrag[ks], desc_add(desc_v, ks * 2048), 1);
    };
    /* S accumulator -> bf16/f16 A fragments of the PV GEMM (HOPPER-PTX §3:
     * the layouts coincide, no data movement across threads). */
    auto convert_p = [&]() {
#pragma unroll
        for (int ks = 0; ks < BN / 16; ++ks)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float lo = sacc[8 * ks + 2 * j], hi = sacc[8 * ks + 2 * j + 1];
                pfrag[ks][j] = C::BF16 ? pack_bf16x2(lo, hi) : pack_f16x2(lo, hi);
            }
    };
    auto rescale_o = [&](const float (&alpha)[2], bool rescale) {
        if (!rescale) return; /* warp-uniform: every alpha of this warp is 1 */
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
            oacc[4 * i + 0] *= alpha[0];
            oacc[4 * i + 1] *= alpha[0];
            oacc[4 * i + 2] *= alpha[1];
            oacc[4 * i + 3] *= alpha[1];
        }
    };
    /* OTMA_LATE: a staged O not yet stored (its TMA coordinates) */
    bool st_pend = false;
    int st_row = 0, st_h = 0, st_b = 0;
    auto issue_o_store = [&](int erow, int eh, int eb) {
        if constexpr (C::OTMA) {
            if (lane == 0) {
                const uint8_t *stage = smem + C::OFF_OST + (wg * 4 + warp) * C::OST_WARP_BYTES;
#pragma unroll
                for (int c = 0; c < C::SLABS; ++c) tma_store_4d(tm_o, stage + c * 2048, c * 64, erow, eh, eb);
                bulk_commit_group();
            }
        } else {
            (void)erow, (void)eh, (void)eb;
        }
    };
    auto flush_o_store = [&]() {
        if (C::OTMA_LATE && st_pend) {
            issue_o_store(st_row, st_h, st_b);
            st_pend = false;
        }
    };
    /* OTMA: O / l of this warp's 16 rows (erow + 16 warp ..) through its
     * staging buffer and a TMA store issued by lane 0 (OTMA_LATE: after the
     * warp's next first QK^T); inv: 1 / l of rows r0 and r0 + 8 */
    auto store_o_tma = [&](const float (&inv)[2], int eb, int eh, int erow) {
        if constexpr (C::OTMA) {
            flush_o_store();
            uint8_t *stage = smem + C::OFF_OST + (wg * 4 + warp) * C::OST_WARP_BYTES;
            const uint32_t sbase = smem_u32(stage);
            /* this lane's row address: matrix j = lane / 8 of each x4 is
             * (column block i + j / 2, rows 8 (j % 2) ..) */
            const int mrow = 8 * ((lane >> 3) & 1) + (lane & 7);
            auto packed = [&](int i, int r) {
                const float lo = oacc[4 * i + 2 * r] * inv[r], hi = oacc[4 * i + 2 * r + 1] * inv[r];
                return C::BF16 ? pack_bf16x2(lo, hi) : pack_f16x2(lo, hi);
            };
            if (lane == 0) bulk_wait_read_all(); /* the previous tile's store has read the buffer */
            __syncwarp();
#pragma unroll
            for (int i = 0; i < D / 8; i += 2) {
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
            (void)inv, (void)eb, (void)eh, (void)erow;
        }
    };
    /* row r0 + 8 r of a finished tile: its sum over the quad, the LSE
     * written, and 1 / l returned */
    auto finish_row = [&](int r, const float (&rmax)[2], const float (&rsum)[2], int eb, int eh, int erow) {
        float l = rsum[r];
        l += __shfl_xor_sync(0xffffffff, l, 1);
        l += __shfl_xor_sync(0xffffffff, l, 2);
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const int row = erow + r0 + 8 * r;
        if (p.lse && q4 == 0 && row < p.seqlen_q)
            p.lse[((int64_t)eb * p.heads_q + eh) * p.seqlen_q + row] =
                l > 0.f ? rmax[r] * p.softmax_scale + logf(l) : -INFINITY;
        return inv;
    };
    /* O / l and LSE of a finished tile (rows erow + r0, + 8 of head eh, batch eb) */
    auto epilogue = [&](const float (&rmax)[2], const float (&rsum)[2], int eb, int eh, int erow) {
        if (C::OTMA && p.o_wide == 2) {
            float inv[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) inv[r] = finish_row(r, rmax, rsum, eb, eh, erow);
            store_o_tma(inv, eb, eh, erow);
            FWD_TRACE(9);
            return;
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const float inv = finish_row(r, rmax, rsum, eb, eh, erow);
            const int row = erow + r0 + 8 * r;
            const bool row_ok = row < p.seqlen_q; /* the same for the 4 lanes of a quad */
            uint8_t *orow = (uint8_t *)p.o + 2 * (eb * p.o_sb + (int64_t)row * p.o_ss + eh * p.o_sh);
            /* columns 8i + 2*q4, +1 of this row, packed */
            auto packed = [&](int i) {
                const float lo = oacc[4 * i + 2 * r] * inv, hi = oacc[4 * i + 2 * r + 1] * inv;
                return C::BF16 ? pack_bf16x2(lo, hi) : pack_f16x2(lo, hi);
            };
            if (C::OSTORE == 16 && p.o_wide) {
                /* a quad holds 32 columns as a 4x4 matrix of packed pairs
                 * (lane, group): transpose it with two xor-shuffle steps
                 * (2x2 blocks across lanes ^2, then within blocks across
                 * ^1) so each lane owns 8 adjacent columns, one 16-byte
                 * store instead of four 4-byte ones */
#pragma unroll
                for (int j = 0; j < D / 32; ++j) {
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
                for (int i = 0; i < D / 8; ++i) *(uint32_t *)(orow + 2 * (8 * i + 2 * q4)) = packed(i);
            }
        }
        FWD_TRACE(9);
    };
    /* A finished tile whose last PV GEMM is still to be issued (its P in
     * pfrag, O already rescaled, V in stage (it - 1) % STAGES): without XTILE
     * it is issued at once, alone; with XTILE together with the next tile's
     * first QK^T.  XTILE keeps the tile index and its softmax statistics
     * (few registers: the 160-register d64 kernel is tight). */
    int pend_t = 0;
    float pend_max[2] = {0.f, 0.f}, pend_sum[2] = {0.f, 0.f};
    bool pending = false;
    int it = 0;
    /* SPLIT: a piece of tile t (keys split over workers) is finished: its
     * partial O, row max and row sum go to this worker's slot, each warp
     * counts itself on its tile's counter, and the warp that completes the
     * count merges every piece from the workspace, in worker order, and
     * writes the tile (perf-notes v30, v36). */
    auto split_finish = [&](const float (&rmax)[2], const float (&rsum)[2], int t, int eb, int eh, int erow) {
        if constexpr (C::SPLIT) {
            const int rank = t % C::CLUSTER, wt = t / C::CLUSTER, rel = wt - sp.first;
            const int w_first = sp.owners[rel] & 0xffff, w_last = sp.owners[rel] >> 16;
            const int self = (int)blockIdx.x / C::CLUSTER;
            constexpr int CH = D / 8 + 1; /* float4 per thread: O, then (max r0, max r0+8, sum, sum) */
            /* worker x's piece of this tile: slot 0 if x's range starts in it, else 1 */
            auto slot = [&](int x) {
                const int sl = sp.tile[x] == wt ? 0 : 1;
                return sp.ws + ((((size_t)x * 2 + sl) * C::CLUSTER + rank) * NC + wg) * CH * 128 + tid;
            };
            float l[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                l[r] = rsum[r];
                l[r] += __shfl_xor_sync(0xffffffff, l[r], 1);
                l[r] += __shfl_xor_sync(0xffffffff, l[r], 2);
            }
            {
                float4 *dst = slot(self);
#pragma unroll
                for (int c = 0; c < D / 8; ++c)
                    __stcg(dst + c * 128, make_float4(oacc[4 * c], oacc[4 * c + 1], oacc[4 * c + 2], oacc[4 * c + 3]));
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
             * finished last: identical calls give identical bits (merging
             * into this piece's registers made the rounding follow the
             * finishing order, run 84) */
            float mm[2] = {-INFINITY, -INFINITY};
            l[0] = l[1] = 0.f;
#pragma unroll
            for (int i = 0; i < D / 2; ++i) oacc[i] = 0.f;
            for (int x = w_first; x <= w_last; ++x) {
                const float4 *src = slot(x);
                const float4 ml = __ldcg(src + (CH - 1) * 128);
                const float mx[2] = {ml.x, ml.y}, lx[2] = {ml.z, ml.w};
                float fa[2], fb[2];
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const float mn = fmaxf(mm[r], mx[r]);
                    fa[r] = mm[r] == -INFINITY ? 0.f : exp2f((mm[r] - mn) * c2);
                    fb[r] = mx[r] == -INFINITY ? 0.f : exp2f((mx[r] - mn) * c2);
                    l[r] = l[r] * fa[r] + lx[r] * fb[r];
                    mm[r] = mn;
                }
#pragma unroll
                for (int c = 0; c < D / 8; ++c) {
                    const float4 v = __ldcg(src + c * 128);
                    oacc[4 * c + 0] = oacc[4 * c + 0] * fa[0] + v.x * fb[0];
                    oacc[4 * c + 1] = oacc[4 * c + 1] * fa[0] + v.y * fb[0];
                    oacc[4 * c + 2] = oacc[4 * c + 2] * fa[1] + v.z * fb[1];
                    oacc[4 * c + 3] = oacc[4 * c + 3] * fa[1] + v.w * fb[1];
                }
            }
            /* the epilogue sums its row sums over the quad */
            const float lq[2] = {q4 == 0 ? l[0] : 0.f, q4 == 0 ? l[1] : 0.f};
            epilogue(mm, lq, eb, eh, erow);
        }
    };
    auto last_pv_and_epilogue = [&](int ps, uint32_t pph, const float (&rmax)[2], const float (&rsum)[2], int eb,
                                    int eh, int erow, int split_t = -1) {
        mbar_wait<C::SLEEP>(&full_v[ps], pph);
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
        release(&empty_v[ps]);
        if (C::SPLIT && split_t >= 0) split_finish(rmax, rsum, split_t, eb, eh, erow);
        else epilogue(rmax, rsum, eb, eh, erow);
    };
    /* the pending tile's coordinates, for its epilogue */
    auto pend_epilogue = [&]() {
        int pm, ph_, pb;
        fwd_tile_decode<C::CAUSAL>(p, pend_t, pm, ph_, pb);
        epilogue(pend_max, pend_sum, pb, ph_, pm * BM + wg * 64);
    };
    auto finish_pending = [&]() {
        int pm, ph_, pb;
        fwd_tile_decode<C::CAUSAL>(p, pend_t, pm, ph_, pb);
        last_pv_and_epilogue((it - 1) % STAGES, ((it - 1) / STAGES) & 1, pend_max, pend_sum, pb, ph_, pm * BM + wg * 64);
    };

    int q_iter = 0;
    for (;;) {
        /* the producer publishes this warpgroup's next tile with its Q */
        const int qi = wg * C::QBUF + q_iter % C::QBUF; /* Q buffer, barriers and slot of this tile */
        mbar_wait<C::SLEEP>(&full_q[qi], (q_iter / C::QBUF) & 1);
        ++q_iter;
        /* through a lane-0 shuffle so the compiler knows t is warp-uniform:
         * read straight from shared memory, everything derived from it
         * (stage counters, descriptors) left the uniform datapath and the
         * key-block loop grew by 5% (d64: 581 -> 610 instructions, -8%) */
        const int t = __shfl_sync(0xffffffffu, ld_shared_s32(&tile_slot[qi]), 0);
        FWD_TRACE(1);
        if (t >= p.num_tiles) break;
        int m, h, b;
        fwd_tile_decode<C::CAUSAL>(p, t, m, h, b);
        const int nblocks = fwd_num_n_blocks<C>(p, m);
        /* SPLIT: this tile's key blocks n_lo .. n_hi - 1 (all of them unless
         * it is a tail tile: this worker's first or second piece) */
        int n_lo = 0, n_hi = nblocks;
        if constexpr (C::SPLIT) {
            if (t >= sp.first * C::CLUSTER) {
                const int w = (int)blockIdx.x / C::CLUSTER;
                const int rng = sp.rng[t / C::CLUSTER == sp.tile[w] ? 0 : 1][w];
                n_lo = rng & 0xffff;
                n_hi = rng >> 16;
            }
        }
        const int row_base = m * BM + wg * 64; /* first query row of this warpgroup */

        /* SITOUT: no row of this warpgroup is in the sequence (it got no Q) */
        const bool sit_out = C::SITOUT && row_base >= p.seqlen_q;
        if (nblocks > 0 && !sit_out) {
            float row_max[2] = {-INFINITY, -INFINITY};
            float row_sum[2] = {0.f, 0.f};
            if (!pending) { /* else O is still the pending tile's: zeroed after its epilogue */
#pragma unroll
                for (int i = 0; i < D / 2; ++i) oacc[i] = 0.f;
            }

            const uint8_t *sq_wg = sQ + (qi % C::QBUF) * C::Q_BYTES + wg * 64 * 128; /* this warpgroup's Q rows */
            const uint64_t desc_q_tile = smem_desc_sw128(sq_wg, 16, 1024);
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
                    /* the producer may overwrite the buffer (async proxy)
                     * once every thread's reads are done */
                    fence_async_shared();
                    mbar_arrive(&empty_q[qi]);
                }
            }

            /* S = Q K_n^T into sacc (issue only). */
            auto issue_qk = [&](int s) {
                const uint64_t desc_k = smem_desc_sw128(sK + s * C::KV_BYTES, 16, 1024);
                uint64_t desc_q = desc_q_tile;
                if constexpr (C::UNIWG == 2) {
                    /* per block from a fresh shuffle: nothing of it lives
                     * across the loop (v32) */
                    const int wgu = __shfl_sync(0xffffffffu, warpgroup - 1, 0);
                    desc_q = smem_desc_sw128(sQ + (qi % C::QBUF) * C::Q_BYTES + wgu * 64 * 128, 16, 1024);
                }
#pragma unroll
                for (int kk = 0; kk < D / 16; ++kk) {
                    const uint32_t off_q = (kk / 4) * BM * 128 + (kk % 4) * 32;
                    const uint32_t off_k = (kk / 4) * BN * 128 + (kk % 4) * 32;
                    if (kk < C::QREGK) WG::rsk(sacc, qfrag[C::QREG ? kk : 0], desc_add(desc_k, off_k), kk > 0);
                    else WG::ss(sacc, desc_add(desc_q, off_q), desc_add(desc_k, off_k), kk > 0);
                }
            };
            /* Mask, new running max, p = exp2(s*c - m*c) in place, partial row
             * sums; returns the factor the old O and l must be scaled by. */
            auto softmax_step = [&](int n, float (&alpha)[2], bool &rescale) {
                const int col0 = (n + n_lo) * BN; /* n counts from the tile's (SPLIT: piece's) first block */
                const bool need_mask = col0 + BN > p.seqlen_k ||
                                       (C::CAUSAL && col0 + BN - 1 > m * BM + p.causal_offset) ||
                                       (C::ROWMASK && row_base + 64 > p.seqlen_q);
                if (need_mask) {
#pragma unroll
                    for (int i = 0; i < BN / 8; ++i)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const int col = col0 + 8 * i + 2 * q4 + (e & 1);
                            const int row = row_base + r0 + (e >> 1) * 8;
                            bool ok = col < p.seqlen_k;
                            if (C::CAUSAL) ok = ok && col <= row + p.causal_offset;
                            if (C::ROWMASK) ok = ok && row < p.seqlen_q;
                            if (!ok) sacc[4 * i + e] = -INFINITY;
                        }
                }
                bool moved = false;
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    float mx = row_max[r];
                    if (C::TREEMAX) {
                        float t[BN / 8];
#pragma unroll
                        for (int i = 0; i < BN / 8; ++i) t[i] = fmaxf(sacc[4 * i + 2 * r], sacc[4 * i + 2 * r + 1]);
#pragma unroll
                        for (int w = 1; w < BN / 8; w *= 2)
#pragma unroll
                            for (int i = 0; i + w < BN / 8; i += 2 * w) t[i] = fmaxf(t[i], t[i + w]);
                        mx = fmaxf(mx, t[0]);
                    } else {
#pragma unroll
                        for (int i = 0; i < BN / 8; ++i)
                            mx = fmaxf(mx, fmaxf(sacc[4 * i + 2 * r], sacc[4 * i + 2 * r + 1]));
                    }
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
                    /* row_max is the reference the exponents are taken against:
                     * with LAZY it moves only when the block max passes it by
                     * more than 2^8 (or the row had seen no key yet) */
                    const bool move = !C::LAZY || row_max[r] == -INFINITY || (mx - row_max[r]) * c2 > C::LAZY_LOG2;
                    if (move) {
                        /* rows that have seen no key keep max -inf: use 0 so exp2 gives 0, not NaN */
                        const float mnew = mx == -INFINITY ? 0.f : mx * c2;
                        alpha[r] = exp2f(row_max[r] * c2 - mnew);
                        row_max[r] = mx;
                        moved = true;
                    } else {
                        alpha[r] = 1.f;
                    }
                    const float mscaled = row_max[r] == -INFINITY ? 0.f : row_max[r] * c2;
                    float sum = 0.f;
#pragma unroll
                    for (int i = 0; i < BN / 8; ++i) {
                        float a = exp2f(fmaf(sacc[4 * i + 2 * r], c2, -mscaled));
                        float bb = exp2f(fmaf(sacc[4 * i + 2 * r + 1], c2, -mscaled));
                        sacc[4 * i + 2 * r] = a;
                        sacc[4 * i + 2 * r + 1] = bb;
                        sum += a + bb;
                    }
                    row_sum[r] = row_sum[r] * alpha[r] + sum;
                }
                rescale = !C::LAZY || __any_sync(0xffffffffu, moved); /* warp-uniform */
            };

            /* O starts at zero and is rescaled by the pending alpha right
             * before each PV GEMM adds to it (FA3's placement: with the
             * overlap, under the QK^T GEMM just issued). */
            float alpha[2];
            bool rescale;
            /* One slot of the overlapped loop: S = Q K_n^T into stage s issued
             * with O += P V from stage pv_s; O is rescaled by the pending
             * factor under the QK^T when rescale_now; the softmax of block n
             * runs under the PV GEMM; after_pv() once that GEMM is done. */
            auto overlap_step = [&](int s, uint32_t ph, int pv_s, uint32_t pv_ph, int n, bool rescale_now,
                                    auto &&after_pv) {
                /* V_{j-1} landed before K_j: waiting for both before the
                 * fence keeps ptxas from injecting a second warpgroup.arrive
                 * (C7519) between the two GEMMs */
                mbar_wait<C::SLEEP>(&full_v[pv_s], pv_ph);
                mbar_wait<C::SLEEP>(&full_k[s], ph);
                FWD_TRACE(2);
                pp_sync();
                FWD_TRACE(4);
                wgmma_fence();
                issue_qk(s);
                wgmma_commit();
                if (rescale_now) rescale_o(alpha, rescale); /* while S = Q K^T runs */
                wgmma_fence();
                issue_pv(pv_s);
                wgmma_commit();
                pp_arrive();
                wgmma_wait<1>(); /* S done, PV may still run */
                reg_fence(sacc);
                FWD_TRACE(5);
                release(&empty_k[s]);
                if (!C::QREG_ALL && n == 0) mbar_arrive(&empty_q[qi]);
                softmax_step(n, alpha, rescale); /* under the PV GEMM */
                FWD_TRACE(6);
                /* keeps the wait below the softmax in the SASS (both rows' sums) */
                if (C::SCHED_FENCE) sched_fence(__float_as_uint(row_sum[0]) & __float_as_uint(row_sum[1]));
                wgmma_wait<0>();
                reg_fence(oacc);
                /* P is read by the PV GEMM until this wait: keeping it live
                 * to here stops ptxas from giving its registers to softmax
                 * temporaries, which made it wait for the PV GEMM before the
                 * softmax and undid the overlap (perf-notes v8) */
                if (C::SCHED_FENCE)
#pragma unroll
                    for (int ks = 0; ks < BN / 16; ++ks) reg_fence(pfrag[ks]);
                FWD_TRACE(7);
                release(&empty_v[pv_s]);
                after_pv();
                convert_p();
            };
            /* n counts the tile's (SPLIT: piece's) key blocks down to 0; the
             * block itself is n + n_lo */
            int n = n_hi - n_lo - 1;
            int s = it % STAGES;
            uint32_t ph = (it / STAGES) & 1;
            if (C::SKIPDIAG && n > 0 && n * BN > row_base + 63 + p.causal_offset) {
                /* no row of this warpgroup sees a key of block n (the tile's
                 * other blocks and turns follow as usual) */
                pass_block(s, ph);
                ++it;
                --n;
                s = it % STAGES;
                ph = (it / STAGES) & 1;
            }
            if (C::XTILE && pending) {
                /* this tile's first QK^T with the pending tile's last PV (its
                 * O already rescaled); then this block's softmax under that PV
                 * GEMM, and the pending tile's epilogue, both under the other
                 * warpgroups' GEMMs */
                overlap_step(s, ph, (it - 1) % STAGES, ((it - 1) / STAGES) & 1, n, false, [&]() {
                    pend_epilogue();
#pragma unroll
                    for (int i = 0; i < D / 2; ++i) oacc[i] = 0.f;
                });
                pending = false;
            } else {
                /* peeled first block: S, softmax (no PV yet).  Data is waited
                 * for before taking the token, so a warpgroup never holds it
                 * idle. */
                mbar_wait<C::SLEEP>(&full_k[s], ph);
                FWD_TRACE(2);
                pp_sync();
                FWD_TRACE(3);
                wgmma_fence();
                issue_qk(s);
                wgmma_commit();
                pp_arrive();
                flush_o_store(); /* OTMA_LATE: the previous tile's O, now that this tile's loads have landed */
                wgmma_wait<0>();
                reg_fence(sacc);
                FWD_TRACE(5);
                release(&empty_k[s]);
                if (!C::QREG_ALL && n == 0) mbar_arrive(&empty_q[qi]);
                softmax_step(n, alpha, rescale);
                convert_p();
                FWD_TRACE(6);
            }
            int prev_s = s;
            uint32_t prev_ph = ph;
            ++it;

            for (--n; n >= 0; --n, ++it) {
                s = it % STAGES;
                ph = (it / STAGES) & 1;
                if (C::OVERLAP) {
                    overlap_step(s, ph, prev_s, prev_ph, n, true, []() {});
                } else {
                    /* PV of the previous block, then S of this one, each waited for */
                    rescale_o(alpha, rescale);
                    mbar_wait<C::SLEEP>(&full_v[prev_s], prev_ph);
                    mbar_wait<C::SLEEP>(&full_k[s], ph);
                    pp_sync();
                    wgmma_fence();
                    issue_pv(prev_s);
                    wgmma_commit();
                    issue_qk(s);
                    wgmma_commit();
                    pp_arrive();
                    wgmma_wait<0>();
                    reg_fence(sacc);
                    reg_fence(oacc);
                    release(&empty_v[prev_s]);
                    release(&empty_k[s]);
                    if (!C::QREG_ALL && n == 0) mbar_arrive(&empty_q[qi]);
                    softmax_step(n, alpha, rescale);
                    convert_p();
                }
                prev_s = s;
                prev_ph = ph;
            }
            /* the last PV GEMM: now, alone, or (XTILE) with the next tile's
             * first QK^T */
            rescale_o(alpha, rescale);
            if (C::XTILE) {
                pending = true;
                pend_t = t;
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    pend_max[r] = row_max[r];
                    pend_sum[r] = row_sum[r];
                }
            } else {
                last_pv_and_epilogue(prev_s, prev_ph, row_max, row_sum, b, h, row_base,
                                     C::SPLIT && (n_lo > 0 || n_hi < nblocks) ? t : -1);
            }
        } else if (nblocks > 0) {
            /* sitting out: the same waits, releases and pingpong turns as the
             * working loop (one turn per key block and one for the last PV
             * GEMM), nothing else; the epilogue would write nothing */
            mbar_arrive(&empty_q[qi]);
            const int nblk = n_hi - n_lo;
            for (int j = it; j < it + nblk; ++j) pass_block(j % STAGES, (j / STAGES) & 1);
            it += nblk;
            pp_sync();
            pp_arrive();
        } else {
            /* every row of this tile sees no key: O = 0, LSE = -inf */
            if (C::XTILE && pending) {
                finish_pending();
                pending = false;
            }
            mbar_arrive(&empty_q[qi]);
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int row = row_base + r0 + 8 * r;
                if (row >= p.seqlen_q) continue;
                if (p.lse && q4 == 0) p.lse[((int64_t)b * p.heads_q + h) * p.seqlen_q + row] = -INFINITY;
                uint8_t *orow = (uint8_t *)p.o + 2 * (b * p.o_sb + (int64_t)row * p.o_ss + h * p.o_sh);
                for (int i = 0; i < D / 8; ++i) *(uint32_t *)(orow + 2 * (8 * i + 2 * q4)) = 0u;
            }
        }
    }
    if (C::XTILE && pending) finish_pending();
    /* OTMA: this warp's last O store has landed before the CTA (and its
     * shared memory) goes */
    flush_o_store();
    if (C::OTMA && lane == 0) bulk_wait_all();
    /* the ring's last hand-over (to warpgroup 0) has no taker: take it, so no
     * arrival is left pending on a named barrier at exit */
    if (C::PINGPONG && wg == 0) named_bar_sync(8, 256);
    FWD_TRACE_END();
    if (C::CLUSTER > 1) cluster_sync_all();
}

template <class C>
__global__ void __launch_bounds__(C::THREADS, 1)
    fwd_sm90_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                    const __grid_constant__ CUtensorMap tm_v, const FwdParams p) {
    fwd_sm90_body<C>(tm_q, tm_k, tm_v, p, FwdNoSplit(), nullptr);
}

template <class C>
__global__ void __launch_bounds__(C::THREADS, 1)
    fwd_sm90_split_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                          const __grid_constant__ CUtensorMap tm_v, const FwdParams p,
                          const __grid_constant__ FwdSplit sp) {
    fwd_sm90_body<C>(tm_q, tm_k, tm_v, p, sp, nullptr);
}

/* OTMA: the same kernels with O's tensor map (box 64 x 16) */
template <class C>
__global__ void __launch_bounds__(C::THREADS, 1)
    fwd_sm90_kernel_o(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                      const __grid_constant__ CUtensorMap tm_v, const FwdParams p,
                      const __grid_constant__ CUtensorMap tm_o) {
    fwd_sm90_body<C>(tm_q, tm_k, tm_v, p, FwdNoSplit(), &tm_o);
}

template <class C>
__global__ void __launch_bounds__(C::THREADS, 1)
    fwd_sm90_split_kernel_o(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                            const __grid_constant__ CUtensorMap tm_v, const FwdParams p,
                            const __grid_constant__ FwdSplit sp, const __grid_constant__ CUtensorMap tm_o) {
    fwd_sm90_body<C>(tm_q, tm_k, tm_v, p, sp, &tm_o);
}
