/* fwd_sm90_hdim64.cu - forward kernel instances for head dim 64 (one file per
 * head dim so they compile in parallel).  Tile choices: docs/perf-notes.md. */
#include "fwd_sm90_launch.cuh"

fattn_status fwd_sm90_hdim64(fattn_ctx *ctx, const fattn_fwd_args *a, fwd_variant v) {
    /* D, BN, consumer warpgroups, K/V stages */
    if (v.causal) FWD_SM90_CAUSAL(64, 128, 3, 2);
    FWD_SM90_NONCAUSAL(64, 128, 3, 2);
}
