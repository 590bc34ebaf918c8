/* The portable backward's main kernel at head dim 64: bf16 and f16
 * (bwd_portable_launch.cuh).  One file per head dim so they compile in
 * parallel.  Built for sm_80 (SASS and PTX) and sm_90a: CMakeLists.txt. */
#include "../bwd_portable_launch.cuh"

fattn_status bwd_portable_hdim64(fattn_ctx *ctx, const PortableBwdParams &p, bool bf16, dim3 grid) {
    return bwd_portable_run<64>(ctx, p, bf16, grid);
}
