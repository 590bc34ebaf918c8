/* options.c - experimental per-context knobs (fattn_ctx_set_option).  Only
 * stored here: an engine's entry point reads them once per call into a
 * struct for its kernels (src/cuda/entry.cu: cuda_fwd_options). */
#include "internal.h"

static fattn_status set_option_held(fattn_ctx *ctx, fattn_option option, int value) {
    if ((int)option < 0 || (int)option >= FATTN_OPTION_COUNT_)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "unknown option %d", (int)option);
    if (value != 0 && value != 1)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "option %d: value %d must be 0 or 1", (int)option, value);
    ctx->options[option] = value;
    return FATTN_OK;
}

fattn_status fattn_ctx_set_option(fattn_ctx *ctx, fattn_option option, int value) {
    fattn_status st = fattn_ctx_acquire(ctx, "fattn_ctx_set_option");
    if (st != FATTN_OK) return st;
    st = set_option_held(ctx, option, value);
    fattn_ctx_release(ctx);
    return st;
}
