/* The portable forward at head dim 128: bf16 and f16, two ring depths each
 * (fwd_portable_launch.cuh).  One file per head dim so they compile in
 * parallel.  Built for sm_80 (SASS and PTX) and sm_90a: CMakeLists.txt. */
#include "../fwd_portable_launch.cuh"

fattn_status fwd_portable_hdim128(fattn_ctx *ctx, const PortableFwdParams &p, bool bf16, int batch) {
    return fwd_portable_run<128>(ctx, p, bf16, batch);
}
