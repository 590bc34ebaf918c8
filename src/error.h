/* error.h - how every part of the library reports a failure: a status and a
 * one-line message on the context (or, without one, in a thread-local
 * buffer that fattn_last_error(NULL) reads).  The engines include this, not
 * api.c's interface. */
#ifndef FATTN_ERROR_H
#define FATTN_ERROR_H

#include "fattn.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FATTN_ERRMSG_LEN 512

/* Record a failure on ctx (NULL: the thread-local creation error) and return
 * `status`.  printf-style message. */
fattn_status fattn_fail(fattn_ctx *ctx, fattn_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Forget the last failure on ctx (NULL: the thread-local creation error);
 * every public call starts with this, so a success leaves "". */
void fattn_clear_error(fattn_ctx *ctx);

#ifdef __cplusplus
}
#endif

#endif
