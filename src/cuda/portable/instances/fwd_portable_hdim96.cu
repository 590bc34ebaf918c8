/* The portable forward at head dim 96: bf16 and f16, one ring depth (NS 2
 * fits 99 KB; fwd_portable_launch.cuh).  Rows of 96 elements in 64-byte
 * swizzle groups (portable::swz).  Built for sm_80 (SASS and PTX) and
 * sm_90a: CMakeLists.txt. */
#include "../fwd_portable_launch.cuh"

fattn_status fwd_portable_hdim96(fattn_ctx *ctx, const PortableFwdParams &p, bool bf16, int batch) {
    return fwd_portable_run<96>(ctx, p, bf16, batch);
}
