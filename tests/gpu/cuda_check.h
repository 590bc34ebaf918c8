/* cuda_check.h - CK(call): a CUDA runtime call's error, named with its file
 * and line, ends the program.  For the GPU tests (gpu_testutil.h) and the
 * CUDA bench programs (bench/bench_cuda.h); the library returns statuses
 * instead and never uses it. */
#pragma once
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                                     \
    do {                                                                                          \
        cudaError_t e_ = (x);                                                                     \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));   \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)
