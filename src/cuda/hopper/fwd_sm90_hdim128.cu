/* fwd_sm90_hdim128.cu - forward kernel instances for head dim 128 (one file per
 * head dim so they compile in parallel).  Tile choices and their measurements:
 * docs/perf-notes.md (2026-11-29 variant sweep): non-causal 128 x 176 beat
 * 128 x 128 by 4% at seqlen 8192; causal 128 x 176 wins at long seqlens (+6%
 * at 8192) but loses at short ones (-11% at 1024), so causal switches on
 * seqlen_k. */
#include "fwd_sm90_launch.cuh"

fattn_status fwd_sm90_hdim128(fattn_ctx *ctx, const fattn_fwd_args *a, fwd_variant v) {
    /* D, BN, consumer warpgroups, K/V stages */
    if (v.causal) {
        /* causal: sleeping mbarrier waits (SLEEP), +0.3..+1.8% in runs 36 and
         * 41 at every length; BN 128 also loads each tile's Q a tile early
         * (QEARLY): +1.5 / +1.0% at seqlen 1024 / 2048 (run 37); BN 176
         * leaves no room for a second Q buffer (perf-notes v16, v17, v20) */
        /* BN 176 with SITOUT: +1.5..+2.1% at 4096-16384 (run 48), where no
         * warpgroup sits out at lengths that are multiples of 128: ptxas
         * builds a shorter key-block loop (878 against 910 instructions);
         * SKIPDIAG on top: +0.3 / -0.4 / -0.7% at 4096-16384 (run 50), off */
        /* BN 128 with the first 32 of Q's 128 columns in registers (QREG 2):
         * +1.1 / +1.7 / +2.0 / +2.6 / +1.8% over BN 128 without at 1024-16384
         * (run 60; all of Q: -0.4..0%), and against BN 176 +17.6 / +13.0 / +9.0
         * / +2.7 / -0.6 / -1.5% at 512 / 1024 / 1536 / 4096 / 8192 / 16384 (run
         * 61, perf-notes v26), and +2.6 / +1.1 / -0.1 / -0.4 / +0.3% at 4096 / 5120
         * / 6144 / 7168 / 8192 (run 63): BN 176 from seqlen_k 8192 (was 4096) */
        if (a->p.seqlen_k >= 8192) FWD_SM90_CAUSAL_OPT(128, 176, 2, 2, 0, true, 1, 0);
        /* O through shared memory and a TMA store issued after the next
         * tile's first QK^T (OTMA 2): +0.7 / +0.7 / +0.8 / +0.3 / +0.2 / +0.1 /
         * +1.0% at 512-8192; issued at the tile's end (OTMA 1) -1.5..-2.5%
         * (run 100, perf-notes v43b) */
        FWD_SM90_CAUSAL_QO(128, 128, 2, 2, 1, true, 0, 0, 2, 2);
    }
    /* the split instance with SITOUT and SPREAD (2: not its unsplit twin):
     * +2.6 / +2.5 / +0.8% at 4096 / 8192 / 16384 and +3.0 / +2.8 / +2.3% at
     * 3000 / 6144 / 12000, where it splits (run 75; run 74's larger figures
     * had fwd_variants' position bias); the unsplit kernel with them -1.3 /
     * -1.4% at 1024 / 2048 (runs 48, 74; perf-notes v31) */
    /* The key block whose padded keys (seqlen_k rounded up to whole blocks)
     * cost least: per key, BN 160 costs 2.8% more than BN 176 and BN 192 the
     * same (runs 106-107, perf-notes v46-v47), so BN 160 takes lengths it
     * pads much less (640, 800, 1100, 1280, 1440: +5.9..+7.1% over BN 176),
     * BN 192 those it pads less at all (720, 900, 3000, 6144, 8192, 12000,
     * 16384: +9.4 / +5.7 / +2.4 / +1.3 / +0.7 / +1.2 / +0.7%), BN 176 the
     * rest and the ties (1000, 1024, 2048, 4096).  BN 160 stores O with TMA (OTMA 2); BN 176
     * and 192 leave no shared memory for it.  The full design only (the
     * ablation's variants keep BN 176). */
    if (v.full_design()) {
        const int64_t sk = a->p.seqlen_k;
        const double k160 = 1.028 * (double)((sk + 159) / 160 * 160);
        const double k176 = (double)((sk + 175) / 176 * 176), k192 = (double)((sk + 191) / 192 * 192);
        if (k192 < k176 && k192 <= k160) FWD_SM90_NONCAUSAL_FULL(128, 192, 2, 2, 1, 2, 0, 0);
        if (k160 < k176) FWD_SM90_NONCAUSAL_FULL(128, 160, 2, 2, 1, 2, 0, 2);
    }
    FWD_SM90_NONCAUSAL_SO(128, 176, 2, 2, 1, 2);
}
