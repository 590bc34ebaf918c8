/* gpu_testutil.h - what the GPU tests share: a CUDA error check that names
 * the call, and the "no Hopper GPU -> exit 77 (ctest: skipped)" rule. */
#pragma once
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/testutil.h"
#include "fattn.h"

#define CK(x)                                                                                     \
    do {                                                                                          \
        cudaError_t e_ = (x);                                                                     \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));   \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

/* A CUDA context on device 0, or exit 77 with the reason when this machine
 * has no Hopper GPU (or the library was built without CUDA). */
static inline fattn_ctx *gpu_ctx_or_skip(void) {
    fattn_ctx *ctx = NULL;
    fattn_status st = fattn_ctx_create(&ctx, FATTN_BACKEND_CUDA, 0);
    if (st == FATTN_ERROR_NO_DEVICE || st == FATTN_ERROR_UNSUPPORTED) {
        printf("SKIP: no Hopper GPU (%s)\n", fattn_last_error(NULL));
        exit(77);
    }
    if (st != FATTN_OK) {
        fprintf(stderr, "fattn_ctx_create: %s: %s\n", fattn_status_string(st), fattn_last_error(NULL));
        exit(1);
    }
    return ctx;
}
