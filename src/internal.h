/* internal.h - what the API layer and the engines share.  Not installed. */
#ifndef FATTN_INTERNAL_H
#define FATTN_INTERNAL_H

#include "fattn.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FATTN_ERRMSG_LEN 512

struct fattn_ctx {
    fattn_backend backend; /* CPU or CUDA, never AUTO */
    int device;            /* CUDA device ordinal */
    void *stream;          /* cudaStream_t */
    int threads;           /* CPU worker threads, 0 = all online CPUs */
    void *cuda;            /* engine state owned by src/cuda (NULL on CPU) */
    int options[FATTN_OPTION_COUNT_]; /* fattn_ctx_set_option, 0 = default */
    char err[FATTN_ERRMSG_LEN];
};

/* Record a failure on ctx (may be NULL: thread-local creation error) and
 * return `status`.  printf-style message. */
fattn_status fattn_fail(fattn_ctx *ctx, fattn_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Engines.  api.c has checked every argument and replaced the "all strides
 * zero" default by explicit BSHD strides, head_dim_v == 0 by head_dim and
 * softmax_scale == 0 by 1/sqrt(head_dim), before calling these. */
fattn_status fattn_cpu_fwd(fattn_ctx *ctx, const fattn_fwd_args *a);
fattn_status fattn_cpu_bwd(fattn_ctx *ctx, const fattn_bwd_args *a);
fattn_status fattn_cpu_quantize(fattn_ctx *ctx, const fattn_quantize_args *a);

/* CUDA engine (src/cuda; stubs returning NO_DEVICE when built without CUDA). */
int fattn_cuda_available(int device);           /* 1 if device is sm_90 */
fattn_status fattn_cuda_ctx_init(fattn_ctx *ctx);
void fattn_cuda_ctx_free(fattn_ctx *ctx);
fattn_status fattn_cuda_fwd(fattn_ctx *ctx, const fattn_fwd_args *a);
fattn_status fattn_cuda_bwd(fattn_ctx *ctx, const fattn_bwd_args *a);
fattn_status fattn_cuda_quantize(fattn_ctx *ctx, const fattn_quantize_args *a);
/* Copy n bytes device -> host (synchronous), for argument checks that must
 * read device memory (cu_seqlens). */
fattn_status fattn_cuda_copy_to_host(fattn_ctx *ctx, void *dst, const void *src, size_t n);

#ifdef __cplusplus
}
#endif

#endif
