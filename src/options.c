/* options.c - experimental per-context knobs (fattn_ctx_set_option).  Only
 * stored here: an engine's entry point reads them once per call into a
 * struct for its kernels (src/cuda/entry.cu: cuda_fwd_options). */
#include "internal.h"

fattn_status fattn_ctx_set_option(fattn_ctx *ctx, fattn_option option, int value) {
    if (!ctx) return fattn_fail(NULL, FATTN_ERROR_INVALID_ARGUMENT, "ctx is NULL");
    ctx->err[0] = '\0';
    if ((int)option < 0 || (int)option >= FATTN_OPTION_COUNT_)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "unknown option %d", (int)option);
    if (value != 0 && value != 1)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "option %d: value %d must be 0 or 1", (int)option, value);
    ctx->options[option] = value;
    return FATTN_OK;
}
