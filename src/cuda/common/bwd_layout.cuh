/* bwd_layout.cuh - the backward's fp32 workspace layout, shared by the
 * Hopper backward (hopper/bwd/) and the portable one (portable/): where a
 * sequence's 64-row blocks start (varlen) and where an element of a dQ
 * tile lives.  Plain integer arithmetic: nothing here needs more than
 * compute_80, so bwd_prepost.cuh's kernels build for both engines. */
#pragma once
#include <stdint.h>

/* sequence b's first 64-row block of the dQ tiles, LSE and D (BM = 64): the
 * sequences' ranges cannot overlap, and all lie below rb_total =
 * (total_q + 64 batch) / 64 + 1 */
__device__ __forceinline__ int bwd_varlen_rb(int q0, int b) { return (int)(((int64_t)q0 + 64 * (int64_t)b) / 64); }

/* Where element (row, col) of a 64-row dQ tile lives in the fp32 accumulator
 * (shared and global memory alike): in the order the consumers hold it, so
 * that a warp's stores are 512 contiguous bytes and the writer adds a whole
 * tile with one bulk reduce-add (FA3's permuted dQ accumulator):
 * [column part of `width` columns][warp][8-column group][lane][4], lane =
 * 4 (row % 8) + (col % 8) / 2, element 2 ((row % 16) / 8) + col % 2; width
 * is the columns of one consumer's dQ tile (BwdCfg::DQ_N; the portable
 * backward's m16n8k16 fragments sit in the same order with width = D). */
__host__ __device__ __forceinline__ int bwd_dq_index(int row, int col, int width) {
    const int part = col / width, c = col % width;
    const int wq = row / 16, r = row % 16;
    const int lane = 4 * (r % 8) + (c % 8) / 2, e = 2 * (r / 8) + c % 2;
    return (((part * 4 + wq) * (width / 8) + c / 8) * 32 + lane) * 4 + e;
}

/* The portable backward's order: bwd_dq_index's 128-float groups, element-
 * major inside each (element e of the group's 32 lanes contiguous), so each
 * of a warp's four fp32 atomic adds covers 128 contiguous bytes (4 sectors,
 * not 16): the atomics' L2 work per element falls 4x. */
__host__ __device__ __forceinline__ int bwd_dq_index_emaj(int row, int col, int width) {
    const int i = bwd_dq_index(row, col, width);
    return (i & ~127) | ((i & 3) << 5) | ((i >> 2) & 31);
}

/* elements (row, col), (row, col + 1) of a dQ tile, col even: adjacent in
 * bwd_dq_index's order, 32 apart in the element-major one */
template <bool EMAJ> __device__ __forceinline__ float2 bwd_dq_pair(const float *tile, int row, int col, int width) {
    if (!EMAJ) return *(const float2 *)(tile + bwd_dq_index(row, col, width));
    const int i = bwd_dq_index_emaj(row, col, width);
    return make_float2(tile[i], tile[i + 32]);
}

