/* error.c - status text and the detail of the last failure (fattn_fail,
 * fattn_last_error).  Kept apart from api.c so that the engines, which
 * report through fattn_fail, depend on this file only. */
#include <stdarg.h>
#include <stdio.h>

#include "internal.h"

const char *fattn_status_string(fattn_status status) {
    switch (status) {
    case FATTN_OK: return "ok";
    case FATTN_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case FATTN_ERROR_UNSUPPORTED: return "unsupported";
    case FATTN_ERROR_NO_DEVICE: return "no device";
    case FATTN_ERROR_OUT_OF_MEMORY: return "out of memory";
    case FATTN_ERROR_CUDA: return "CUDA error";
    case FATTN_ERROR_INTERNAL: return "internal error";
    case FATTN_ERROR_BUSY: return "context busy";
    }
    return "unknown status";
}

/* Failures that have no context to hold them (ctx creation, NULL ctx). */
static _Thread_local char tls_err[FATTN_ERRMSG_LEN];

fattn_status fattn_fail(fattn_ctx *ctx, fattn_status status, const char *fmt, ...) {
    char *buf = ctx ? ctx->err : tls_err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, FATTN_ERRMSG_LEN, fmt, ap);
    va_end(ap);
    return status;
}

void fattn_clear_error(fattn_ctx *ctx) { (ctx ? ctx->err : tls_err)[0] = '\0'; }

const char *fattn_last_error(const fattn_ctx *ctx) { return ctx ? ctx->err : tls_err; }
