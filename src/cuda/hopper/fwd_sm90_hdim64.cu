/* fwd_sm90_hdim64.cu - forward kernel instances for head dim 64 (one file per
 * head dim so they compile in parallel).  Tile choices: docs/perf-notes.md. */
#include "fwd_sm90_launch.cuh"

fattn_status fwd_sm90_hdim64(fattn_ctx *ctx, const fattn_fwd_args *a, fwd_variant v) {
    /* D, BN (non-causal), BN (causal), consumer warpgroups, K/V stages */
    FWD_SM90_DISPATCH(64, 128, 128, 3, 2)
}
