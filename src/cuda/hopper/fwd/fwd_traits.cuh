/* fwd_traits.cuh - the named options of a Hopper forward kernel (FwdOpts) and
 * everything derived from them at compile time (FwdCfg): tile shape, shared
 * layout, register split, which techniques are on.  A kernel instance is
 * FwdCfg<FwdOpts{.d = 128, .bn = 176, ...}>: options left out take the
 * defaults below.  The measurements behind each option: docs/perf-notes.md
 * (the version named in its comment). */
#pragma once
#include <stdint.h>

/* VARLEN causal: batches of up to this many sequences are taken longest
 * first; larger ones in batch order */
constexpr int FWD_VARLEN_ORDER_MAX = 128;

struct FwdOpts {
    int d = 128, bn = 128;       /* head dim (of Q and K), key block */
    int dv = 0;                  /* head dim of V and O; 0: d (16-bit only: 192 with 128, issue 37) */
    int nc = 2, stages = 2;      /* consumer warpgroups (query tile 64 nc), K/V ring depth */
    bool causal = false, bf16 = true;
    /* intra-warpgroup overlap (paper §3.2): 0 off; 1 on, with the PV wait
     * fenced below the softmax where that measured faster (d <= 128
     * non-causal, v8); 3 on and always fenced (the ablation's "softmax under
     * its own PV GEMM") */
    int overlap = 1;
    bool pingpong = true;        /* inter-warpgroup pingpong (paper §3.1) */
    int cluster = 1;             /* 2: CTA pairs share each K/V load by TMA multicast (d256 non-causal) */
    bool qearly = false;         /* two Q buffers per warpgroup, each tile's Q loaded a tile early (v17) */
    bool sleep = false;          /* mbarrier waits with a suspend-time hint (v16, v20) */
    int sitout = 0;              /* warpgroups past seqlen_q skip the tile's work: 1; 2 in the split instance only (v22, v31) */
    int spread = 0;              /* static order rotated per wave: 1; 2 in the split instance only (v22, v31) */
    bool skipdiag = false;       /* causal: a warpgroup skips a first key block it sees none of (v23) */
    int qreg = 0;                /* first k 16-column slices of Q in registers, -1 all (v26) */
    bool split = false;          /* the last wave's tiles split along the keys (FwdSplit, v30) */
    int otma = 0;                /* O by TMA store: 1 at the tile's end, 2 after the next first QK^T (v43) */
    /* FP8 (paper §3.3): e4m3 Q, K, V with fp32 scales, 16-bit O (bf16 selects
     * bf16 or f16); V is transposed in shared memory by the producer
     * warpgroup's warps 1-3 (fwd_transpose.cuh) */
    bool fp8 = false;
    bool kcol = false;           /* FP8: one K scale per key (a column vector), else one per key block */
    bool kvblk = false;          /* FP8: K and V scale blocks are multiples of BN (one scale pair per key block) */
    int preg = 0;                /* producer warpgroup's registers; 0: the default split */
    bool varlen = false;         /* cu_seqlens: each tile's sequence looked up (FwdVarlen) */
    /* the attention variants (issue 37): a runtime sliding window (causal is
     * its (-1, 0)), softcap and learnable sinks, all read from FwdLocal, a
     * kernel parameter of these instances only; set with causal, whose
     * dynamic longest-first scheduler and mask path it generalises */
    bool local = false;
    /* with varlen: queries packed by cu_seqlens_q, keys in a KV cache (no
     * cu_seqlens_k): batch entry b of k and v, or pages of a block_table
     * (FwdVarlen); instances of their own, so the producer's page walk
     * costs the packed-keys instances no registers */
    bool kvcache = false;
    /* with kvcache: an FP8 cache (e4m3 k and v, 16-bit q), every key block
     * gathered and dequantised into the 16-bit stages (fwd_gather.cuh) */
    bool kv8 = false;
};

/* the same options without the key split (the instance that runs when the
 * host splits nothing) */
constexpr FwdOpts fwd_opts_no_split(FwdOpts o) {
    o.split = false;
    return o;
}

template <FwdOpts O>
struct FwdCfg {
    static constexpr FwdOpts OPTS = O;
    static constexpr int D = O.d, BN = O.bn, NC = O.nc, STAGES = O.stages;
    static constexpr int DV = O.dv ? O.dv : O.d;
    static constexpr bool CAUSAL = O.causal, BF16 = O.bf16, OVERLAP = O.overlap != 0;
    static constexpr bool PINGPONG = O.pingpong && O.nc > 1;
    /* Where the wait for the PV GEMM lands (v8): fenced, the softmax runs
     * under the warpgroup's own PV GEMM (the paper's placement); unfenced,
     * ptxas hoists the wait above the softmax, which then overlaps only the
     * other warpgroups' GEMMs.  Fenced measured +0..+3% at d64 and d128
     * non-causal, -1..-11% at d128 causal and d64 causal with 3 warpgroups. */
    static constexpr bool SCHED_FENCE = O.overlap == 3 || (O.overlap == 1 && O.d <= 128 && !O.causal);
    static constexpr int BM = 64 * NC;
    static constexpr int THREADS = 128 * (NC + 1);
    static constexpr bool FP8 = O.fp8, KCOL = O.fp8 && O.kcol;
    static constexpr int ELEM = FP8 ? 1 : 2; /* bytes per Q/K/V element */
    /* Q, K (and 16-bit V) tiles are slabs of SW-byte swizzled rows: 128
     * bytes (64 16-bit or 128 e4m3 columns), 64 for FP8 head dim 64 */
    static constexpr int SW = D * ELEM < 128 ? D * ELEM : 128;
    static constexpr int SLAB_COLS = SW / ELEM;
    /* a head dim that is not a multiple of 64 (96) takes whole slabs: TMA
     * fills the last one's columns past the head dim with zeros, and the
     * GEMMs stop at D (QK^T's k-steps) and DV (the PV GEMM's N) */
    static constexpr int SLABS = (D + SLAB_COLS - 1) / SLAB_COLS;
    static constexpr int V_SLABS = (DV + SLAB_COLS - 1) / SLAB_COLS; /* of V and OTMA's O */
    /* the PV GEMM's N and O's accumulator columns: DV.  At DV 96 that is 1.5
     * swizzle atoms of the MN-major V tile, not yet run on a device (issue
     * 37); V_SLABS * SLAB_COLS (its columns past DV zeros, never stored) is
     * the fallback should the hardware want whole atoms */
    static constexpr int PV_N = DV;
    /* k-steps of the QK^T GEMM (k16 16-bit, k32 e4m3: 32 bytes each) and per slab */
    static constexpr int QK_STEPS = D * ELEM / 32, STEPS_PER_SLAB = SW / 32;
    /* P's A fragments: one per k-step of the PV GEMM */
    static constexpr int P_STEPS = BN * ELEM / 32;
    /* FP8: K and V scale blocks are multiples of 128 keys (entry.cu), so the
     * columns of a key block fall into NG groups of SG that each have one K
     * and one V scale: SG = gcd(BN, 128); with kvblk the blocks are
     * multiples of BN and there is one group */
    static constexpr int SG = O.kvblk ? BN : (BN % 128 == 0) ? 128 : (BN % 64 == 0) ? 64 : 32;
    static constexpr int NG = BN / SG;
    static constexpr bool QEARLY = O.qearly;
    static constexpr int QBUF = QEARLY ? 2 : 1;
    static constexpr bool SLEEP = O.sleep;
    static constexpr bool SPLIT = O.split;
    static constexpr bool SITOUT = O.sitout == 1 || (O.sitout == 2 && O.split);
    static constexpr bool SPREAD = O.spread == 1 || (O.spread == 2 && O.split);
    static constexpr bool LOCAL = O.local;
    static constexpr bool SKIPDIAG = O.skipdiag && O.causal && !O.local;
    static constexpr int QREGK = O.qreg < 0 ? QK_STEPS : (O.qreg < QK_STEPS ? O.qreg : QK_STEPS);
    static constexpr bool QREG = QREGK > 0;
    static constexpr bool QREG_ALL = QREGK == QK_STEPS; /* the Q buffer goes back at the tile's start */
    static constexpr int Q_BYTES = BM * SLABS * SW;   /* one Q buffer set */
    static constexpr int QWG_BYTES = 64 * SLABS * SW; /* one consumer warpgroup's Q rows */
    static constexpr int K_BYTES = BN * SLABS * SW;
    /* FP8: the PV GEMM's V^T (D rows of keys, K-major) in slabs of 128 keys
     * with the 128-byte swizzle; TMA lands V row-major in its own ring (VRAW) */
    static constexpr int VT_SLABS = FP8 ? (BN + 127) / 128 : 0;
    static constexpr int V_BYTES = FP8 ? VT_SLABS * D * 128 : BN * V_SLABS * SW;
    static constexpr int VRAW_BYTES = FP8 ? K_BYTES : 0;
    /* Shared layout (offsets from a 1024-aligned base). */
    static constexpr int OFF_Q = 0;
    static constexpr int OFF_K = OFF_Q + QBUF * Q_BYTES;
    static constexpr int OFF_V = OFF_K + STAGES * K_BYTES;
    static constexpr int OFF_VRAW = OFF_V + STAGES * V_BYTES;
    static constexpr int OFF_BAR = OFF_VRAW + STAGES * VRAW_BYTES;
    static constexpr bool KVCACHE = O.varlen && O.kvcache;
    static constexpr bool KV8 = KVCACHE && O.kv8;
    /* KVCACHE: a job barrier per stage for the gather (fwd_gather.cuh) */
    static constexpr int NUM_BARS = (FP8 ? 6 : 4) * STAGES + 2 * NC * QBUF + (KVCACHE ? STAGES : 0);
    static constexpr int OFF_SLOT = OFF_BAR + NUM_BARS * 8; /* tile index per consumer warpgroup and Q buffer */
    using NoSplit = FwdCfg<fwd_opts_no_split(O)>;
    /* OTMA: each consumer warp stages its 16 rows of O / l in shared memory
     * and one lane stores them by TMA; only where O's base and strides suit
     * TMA (FwdParams.o_wide 2), else the register stores.  Needs NC x 8 KB
     * (d64) or 16 KB (d128), which d128 BN 176 and d256 do not have. */
    static constexpr bool OTMA = O.otma != 0;
    static constexpr bool OTMA_LATE = O.otma == 2; /* the next tile's first K/V loads go first */
    static constexpr int END_SLOT = OFF_SLOT + NC * QBUF * 4 + (FP8 ? 4 * STAGES : 0); /* FP8: the transposers' end flags */
    static constexpr int OFF_OST = (END_SLOT + 1023) / 1024 * 1024;
    static constexpr int OST_WARP_BYTES = 16 * V_SLABS * 128;
    /* VARLEN causal: the sequences' order, longest first (fwd_varlen_order):
     * keys and ranks of up to FWD_VARLEN_ORDER_MAX sequences */
    static constexpr int OFF_ORDER = END_SLOT, END_ORDER = END_SLOT + (O.varlen && O.causal ? 8 * FWD_VARLEN_ORDER_MAX : 0);
    /* KVCACHE: the gather's job per stage (sequence, kv head, first key, keys used) */
    static constexpr int OFF_JOB = (END_ORDER + 15) / 16 * 16;
    static constexpr int END_JOB = KVCACHE ? OFF_JOB + 16 * STAGES : END_ORDER;
    static constexpr int SMEM_BYTES = (OTMA ? OFF_OST + 4 * NC * OST_WARP_BYTES : END_JOB) + 1024; /* + alignment slack */
    static constexpr bool DYNAMIC = CAUSAL; /* causal tiles are grabbed from an atomic counter, longest first */
    static constexpr int CLUSTER = O.cluster;
    static constexpr bool VARLEN = O.varlen;
    /* O stores of 16 bytes after a quad transpose; three consumers (160
     * registers) spill with the transpose and store 4 bytes */
    static constexpr int OSTORE = NC == 2 ? 16 : 4;
    /* lazy rescaling (FA4): a row's reference max moves only when the block
     * max passes it by more than LAZY_LOG2; d64 +1-4%, d256 +3-7%, d128
     * -1-2% (v5) */
    static constexpr bool LAZY = D != 128 && !FP8; /* FP8: P must stay below e4m3's 448 */
    static constexpr float LAZY_LOG2 = 8.f;
    /* Registers per thread after setmaxnreg (FA3's split, HOPPER-PTX §6). */
    /* 24 spills with a cluster, and at d64, whose consumers use < 190 */
    static constexpr bool PRODUCER_24 = NC == 2 && CLUSTER == 1 && D > 64 && !FP8;
    /* FP8: the V transposers need 40 */
    static constexpr int REGS_PRODUCER = O.preg ? O.preg : FP8 ? 40 : PRODUCER_24 ? 24 : 32;
    /* two consumers: 240 beside a 24-register producer, 232 beside 32 or 40, 224 beside 56 (KVCACHE) */
    static constexpr int REGS_CONSUMER =
        NC == 2 ? (REGS_PRODUCER == 24 ? 240 : REGS_PRODUCER > 40 ? 224 : 232) : FP8 ? 152 : 160;
    /* setmaxnreg.inc waits until the CTA's pool has the registers: the split
     * must fit in the launch's allocation, or the consumers hang (v6) */
    static_assert(REGS_PRODUCER * 128 + REGS_CONSUMER * 128 * NC <= 65536 / (128 * (NC + 1)) / 8 * 8 * 128 * (NC + 1),
                  "register split exceeds the launch allocation");
    static_assert(BN % 16 == 0 && BN <= 256 && D <= 256 && DV <= 256, "tile shape");
    /* 16-bit: k16 steps of QK^T; DV / 32 column groups of the quad-transposed O store */
    static_assert(FP8 ? D % 64 == 0 && DV == D : D % 16 == 0 && DV % 32 == 0, "head dims");
    static_assert(SMEM_BYTES <= 227 * 1024, "shared memory");
    static_assert(CLUSTER == 1 || (CLUSTER == 2 && SLABS % 2 == 0 && V_SLABS % 2 == 0 && !CAUSAL), "cluster variant");
    static_assert(!SPLIT || (!CAUSAL && !QEARLY), "SPLIT: static non-causal kernels");
    static_assert(!LOCAL || CAUSAL, "LOCAL: the causal kernels' scheduler and mask path, with a runtime window");
    static_assert(!FP8 || (BN % 32 == 0 && CLUSTER == 1 && !OTMA && !SPLIT && !QEARLY && !SITOUT && !SKIPDIAG),
                  "FP8: the techniques it has");
    static_assert(!FP8 || !QREG || SW == 128, "FP8 QREG: 128-byte rows (head dim >= 128)");
    /* VARLEN: O by register stores (a TMA box would cross into the next
     * sequence); none of the techniques that read seqlen outside the tile's
     * own lookup */
    static_assert(!VARLEN || (!SPLIT && !OTMA && !SITOUT && !QEARLY && !SKIPDIAG && CLUSTER == 1 && !FP8),
                  "VARLEN: the techniques it has");
    static_assert(!O.kv8 || (KVCACHE && D == DV && D % 64 == 0), "KV8: a KV-cache instance of head dim 64, 128 or 256");
};
