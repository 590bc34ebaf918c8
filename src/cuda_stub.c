/* cuda_stub.c - the CUDA engine entry points for builds without CUDA.
 * CMakeLists.txt leaves this file out when the CUDA engine is compiled. */
#include "internal.h"

#define FATTN_NO_CUDA_MSG "fattn was built without the CUDA engine"

int fattn_cuda_device_sm(int device) {
    (void)device;
    return 0;
}

fattn_status fattn_cuda_ctx_init(fattn_ctx *ctx, const char *engine_env) {
    (void)engine_env;
    return fattn_fail(ctx, FATTN_ERROR_NO_DEVICE, FATTN_NO_CUDA_MSG);
}

void fattn_cuda_ctx_free(fattn_ctx *ctx) { (void)ctx; }

const char *fattn_cuda_engine_name(const fattn_ctx *ctx) {
    (void)ctx;
    return "cuda";
}

/* fattn_status NAME(fattn_ctx *, const ARGS *): NO_DEVICE */
#define FATTN_CUDA_STUB(name, args)                                                                \
    fattn_status name(fattn_ctx *ctx, const args *a) {                                             \
        (void)a;                                                                                   \
        return fattn_fail(ctx, FATTN_ERROR_NO_DEVICE, FATTN_NO_CUDA_MSG);                          \
    }
FATTN_CUDA_STUB(fattn_cuda_fwd_check, fattn_fwd_args)
FATTN_CUDA_STUB(fattn_cuda_bwd_check, fattn_bwd_args)
FATTN_CUDA_STUB(fattn_cuda_fwd, fattn_fwd_args)
FATTN_CUDA_STUB(fattn_cuda_bwd, fattn_bwd_args)
FATTN_CUDA_STUB(fattn_cuda_quantize_check, fattn_quantize_args)
FATTN_CUDA_STUB(fattn_cuda_quantize, fattn_quantize_args)
FATTN_CUDA_STUB(fattn_cuda_merge_check, fattn_merge_args)
FATTN_CUDA_STUB(fattn_cuda_merge, fattn_merge_args)
FATTN_CUDA_STUB(fattn_cuda_kv_append, fattn_kv_append_args)
#undef FATTN_CUDA_STUB

fattn_status fattn_cuda_fp8_workspace(fattn_ctx *ctx, size_t bytes, void **ws) {
    (void)bytes;
    *ws = NULL;
    return fattn_fail(ctx, FATTN_ERROR_NO_DEVICE, FATTN_NO_CUDA_MSG);
}

fattn_status fattn_cuda_fp8_workspace_done(fattn_ctx *ctx) {
    return fattn_fail(ctx, FATTN_ERROR_NO_DEVICE, FATTN_NO_CUDA_MSG);
}
