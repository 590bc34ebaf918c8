/* The portable backward's main kernel at head dim 96: bf16 and f16
 * (bwd_portable_launch.cuh): the 128-key kernel where 113 KB fit (A100,
 * Hopper), else the 64-key one (91 KB: sm_86/89).  Built for sm_80 (SASS and
 * PTX) and sm_90a: CMakeLists.txt. */
#include "../bwd_portable_launch.cuh"

fattn_status bwd_portable_hdim96(fattn_ctx *ctx, const PortableBwdParams &p, bool bf16, dim3 grid) {
    return bwd_portable_run<96>(ctx, p, bf16, grid);
}
