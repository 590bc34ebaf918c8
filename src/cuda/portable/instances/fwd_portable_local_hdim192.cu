/* The portable forward's variants (window, softcap, learnable sink) at head
 * dim 192: fwd_portable_local_kernel, bf16 and f16, two ring depths each
 * (fwd_portable_launch.cuh).  A file of its own so that the plain instances
 * keep their code and both compile in parallel.  Built for sm_80 (SASS and
 * PTX) and sm_90a: CMakeLists.txt. */
#include "../fwd_portable_launch.cuh"

fattn_status fwd_portable_local_hdim192(fattn_ctx *ctx, const PortableFwdParams &p, bool bf16, int batch) {
    return fwd_portable_run<192, true>(ctx, p, bf16, batch);
}
