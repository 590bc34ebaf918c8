/* fwd_sm90_hdim64.cu - forward kernel instances for head dim 64 (one file per
 * head dim so they compile in parallel).  Tile choices: docs/perf-notes.md. */
#include "fwd_sm90_launch.cuh"

fattn_status fwd_sm90_hdim64(fattn_ctx *ctx, const fattn_fwd_args *a, fwd_variant v) {
    /* D, BN, consumer warpgroups, K/V stages */
    if (v.causal) {
        /* 192-row tiles waste more of the diagonal and leave ragged last
         * m-blocks at short lengths: 2 warpgroups measured +8% at 512 and
         * 1024, 3 warpgroups +9% at 2048 and +12% at 8192 (perf-notes, v4,
         * run 5) */
        /* with 3 warpgroups the waits sleep (SLEEP): +0.3..+1.0% in runs 36
         * and 41; with 2 they spin (sleeping measured -0.8..-1.8%, run 36) */
        /* a warpgroup with no row in the sequence sits its tile out
         * (SITOUT), and one that sees none of the tile's first key block
         * skips it (SKIPDIAG): +7.6 / +5.9 / +2.0 / +1.4% at 2048 / 4096 /
         * 8192 / 16384 against neither (run 50, perf-notes v22, v23); with
         * both, 3 warpgroups against 2: -0.5 / -1.0 / +9.0 / +9.1% at 512 /
         * 1024 / 1536 / 2048 (run 53), so 3 from seqlen_k 1536 (was 2048) */
        /* O through shared memory and a TMA store issued after the next
         * tile's first QK^T (OTMA 2; the 4-byte register stores of three
         * warpgroups go): +10.2 / +8.6 / +7.4 / +4.5 / +3.4 / +1.9 / +1.4% at
         * 512 / 768 / 1024 / 1536 / 2048 / 4096 / 8192, and against two
         * warpgroups +7.6 / +13.1 / +5.6% at 512 / 768 / 1024 (run 100,
         * perf-notes v43b), so 3 from seqlen_k 512 (was 1536) */
        /* three K/V stages and the first 16 of Q's columns in registers
         * (QREG 1), as the non-causal kernel: +0.5 / +2.1 / +1.0 / +1.5 / +2.1 /
         * +2.1% at 512 / 1024 / 1536 / 2048 / 4096 / 8192 (run 104, perf-notes
         * v45; QREG 1 alone +0.2..+2.4%, three stages alone -2.0..+0.8%) */
        if (a->p.seqlen_k >= 512) FWD_SM90_CAUSAL_QO(64, 128, 3, 3, 0, true, 1, 1, 1, 2);
        /* the first 32 of Q's 64 columns in registers (QREG 2): +1.7 / +1.4%
         * at 1024 (runs 60, 61), +2.1 / +1.1% at 512 / 1536 (run 61; perf-notes v26) */
        FWD_SM90_CAUSAL_Q(64, 128, 2, 2, 0, false, 0, 0, 2);
    }
    /* 3 K/V stages: +1-2% at seqlen 1024-4096 with the fenced wait (run 19);
     * warpgroups with no row in the sequence sit the tile out and the static
     * order spreads those short tiles over the CTAs (SITOUT, SPREAD): +7.5%
     * at 1024, +3.2..+3.6% at 2048-4096, +0.4..+1.4% at 8192-16384 (run 48) */
    /* the first 16 of Q's 64 columns in registers (QREG 1; all of them
     * spill at 160 registers): +2.1 / +2.0 / +1.6 / +1.6 / +0.5% (run 59) and
     * +2.2 / +2.6 / +1.9 / +1.4 / +1.5% (run 60) at 1024-16384 (perf-notes v26) */
    /* O through shared memory and a TMA store at the tile's end (OTMA 1):
     * +5.3 / +3.1 / +1.7 / +1.6 / +1.8 / +0.3 / +1.0% at 512 / 768 / 1024 /
     * 1536 / 2048 / 4096 / 8192 (run 100) and +5.3 / +3.0 / +1.5 / +1.9 / +1.6
     * / +1.1 / +1.4 / +1.1% at 512 / 768 / 1024 / 2048 / 3000 / 4096 / 8192 /
     * 16384 (run 106); run 99: -1.4..+0.6% at 1024-8192 (perf-notes v43, v46).
     * Issued after the next QK^T (OTMA 2) it lost 1.6-4% from 1536 (run 100) */
    FWD_SM90_NONCAUSAL_SOQO(64, 128, 3, 3, 1, 1, 1, 1);
}
