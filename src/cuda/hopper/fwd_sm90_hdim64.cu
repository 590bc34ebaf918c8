/* fwd_sm90_hdim64.cu - forward kernel instances for head dim 64 (one file per
 * head dim so they compile in parallel).  Tile choices: docs/perf-notes.md. */
#include "fwd_sm90_launch.cuh"

fattn_status fwd_sm90_hdim64(fattn_ctx *ctx, const fattn_fwd_args *a, fwd_variant v) {
    /* D, BN, consumer warpgroups, K/V stages */
    if (v.causal) {
        /* 192-row tiles waste more of the diagonal and leave ragged last
         * m-blocks at short lengths: 2 warpgroups measured +5-23% at
         * 512-2048, 3 warpgroups ahead at 8192 (perf-notes, v4) */
        if (a->p.seqlen_k >= 4096) FWD_SM90_CAUSAL(64, 128, 3, 2);
        FWD_SM90_CAUSAL(64, 128, 2, 2);
    }
    FWD_SM90_NONCAUSAL(64, 128, 3, 2);
}
