/* fwd_sm90_dispatch.cu - choose the forward kernel instance for a problem. */
#include <cuda_runtime.h>

#include "../cuda_engine.h"

fattn_status fwd_sm90_launch(fattn_ctx *ctx, const fattn_fwd_args *a) {
    fwd_variant v;
    v.bf16 = a->q.dtype == FATTN_DTYPE_BF16;
    v.causal = a->p.causal != 0;
    v.overlap = !ctx->options[FATTN_OPTION_DISABLE_OVERLAP];
    v.pingpong = !ctx->options[FATTN_OPTION_DISABLE_PINGPONG];
    v.under_pv = ctx->options[FATTN_OPTION_SOFTMAX_UNDER_PV] != 0;
    int prev;
    const cudaError_t e = cuda_device_enter(ctx->device, &prev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fattn_fail(ctx, FATTN_ERROR_CUDA, "making CUDA device %d current: %s", ctx->device,
                          cudaGetErrorString(e));
    }
    fattn_status s;
    switch (a->p.head_dim) {
    case 64: s = fwd_sm90_hdim64(ctx, a, v); break;
    case 128: s = fwd_sm90_hdim128(ctx, a, v); break;
    default: s = fwd_sm90_hdim256(ctx, a, v); break;
    }
    cuda_device_leave(prev);
    return s;
}
