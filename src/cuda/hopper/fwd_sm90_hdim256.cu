/* fwd_sm90_hdim256.cu - forward kernel instances for head dim 256 (one file per
 * head dim so they compile in parallel).  Tile choices: docs/perf-notes.md. */
#include "fwd_sm90_launch.cuh"

fattn_status fwd_sm90_hdim256(fattn_ctx *ctx, const fattn_fwd_args *a, fwd_variant v) {
    /* D, BN, consumer warpgroups, K/V stages */
    /* causal: the first warpgroup skips a first key block it sees none of
     * (SKIPDIAG): +2.3 / +1.3 / +0.6 / -0.2 / +0.6% at 1024-16384 (run 50);
     * SITOUT (the key-block loop 711 -> 619 instructions, where no
     * warpgroup sits out): +2.1 / +2.6 / +2.3 / +1.7 / +2.5% at 1024-16384,
     * +2.1 / +3.5 / +2.3 / +1.3% at 1536 / 3000 / 6144 / 12000 (run 82,
     * perf-notes v34) */
    if (v.causal) FWD_SM90_CAUSAL_OPT(256, 80, 2, 2, 0, false, 1, 1);
    /* CTA pairs; their split instance with SITOUT and SPREAD: -0.5..+0.7%
     * (runs 74-75, perf-notes v31), kept for its shorter loop (656 against
     * 676 instructions per block) and fewer spilled bytes (4 against 16) */
    FWD_SM90_NONCAUSAL_PAIRED(256, 80, 2, 2, 2);
}
