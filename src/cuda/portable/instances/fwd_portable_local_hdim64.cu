/* The portable forward's variants (window, softcap, learnable sink) at head
 * dim 64: fwd_portable_local_kernel, bf16 and f16, two ring depths each
 * (fwd_portable_launch.cuh).  A file of its own so that the plain instances
 * keep their code and both compile in parallel.  Built for sm_80 (SASS and
 * PTX) and sm_90a: CMakeLists.txt. */
#include "../fwd_portable_launch.cuh"

fattn_status fwd_portable_local_hdim64(fattn_ctx *ctx, const PortableFwdParams &p, bool bf16, int batch) {
    return fwd_portable_run<64, true>(ctx, p, bf16, batch);
}
