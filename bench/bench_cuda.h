/* bench_cuda.h - what the CUDA bench programs of bench/ share: CK (the GPU
 * tests' CUDA error check, which names the call and exits) and one call timed
 * by events. */
#pragma once
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include "../tests/gpu/cuda_check.h" /* CK */

/* Microseconds that what fn() queues on `stream` takes, between events e0 and e1. */
template <class F>
static inline double bench_time_us(cudaStream_t stream, cudaEvent_t e0, cudaEvent_t e1, F &&fn) {
    float ms;
    CK(cudaEventRecord(e0, stream));
    fn();
    CK(cudaEventRecord(e1, stream));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms * 1e3;
}
