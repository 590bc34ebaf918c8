/* bwd_layout.cuh - the backward's fp32 workspace layout, shared by the
 * Hopper backward (hopper/bwd/) and the portable one (portable/): where a
 * sequence's 64-row blocks start (varlen) and where an element of a dQ
 * tile lives.  Plain integer arithmetic: nothing here needs more than
 * compute_80, so bwd_prepost.cuh's kernels build for both engines. */
#pragma once
#include <stdint.h>

#include "bwd_dq_layout.h"

/* sequence b's first 64-row block of the dQ tiles, LSE and D (BM = 64): the
 * sequences' ranges cannot overlap, and all lie below rb_total =
 * (total_q + 64 batch) / 64 + 1 */
__device__ __forceinline__ int bwd_varlen_rb(int q0, int b) { return (int)(((int64_t)q0 + 64 * (int64_t)b) / 64); }

/* elements (row, col), (row, col + 1) of a dQ tile, col even: adjacent in
 * bwd_dq_index's order, 32 apart in the element-major one */
template <bool EMAJ> __device__ __forceinline__ float2 bwd_dq_pair(const float *tile, int row, int col, int width) {
    if (!EMAJ) return *(const float2 *)(tile + bwd_dq_index(row, col, width));
    const int i = bwd_dq_index_emaj(row, col, width);
    return make_float2(tile[i], tile[i + 32]);
}
