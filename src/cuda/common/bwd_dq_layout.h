/* bwd_dq_layout.h - where an element of a 64-row dQ tile lives in the
 * backward's fp32 workspace: bwd_dq_index (the Hopper backward's order) and
 * bwd_dq_index_emaj (the portable backward's).  Plain C (host and device),
 * so the CPU tests check both orders and the portable kernel's add
 * addresses against them (tests/test_dq_layout.c) without a GPU. */
#ifndef FATTN_BWD_DQ_LAYOUT_H
#define FATTN_BWD_DQ_LAYOUT_H

#if defined(__CUDACC__)
#define FATTN_DQ_FN __host__ __device__ __forceinline__
#else
#define FATTN_DQ_FN static inline
#endif

/* Where element (row, col) of a 64-row dQ tile lives in the fp32 accumulator
 * (shared and global memory alike): in the order the consumers hold it, so
 * that a warp's stores are 512 contiguous bytes and the writer adds a whole
 * tile with one bulk reduce-add (FA3's permuted dQ accumulator):
 * [column part of `width` columns][warp][8-column group][lane][4], lane =
 * 4 (row % 8) + (col % 8) / 2, element 2 ((row % 16) / 8) + col % 2; width
 * is the columns of one consumer's dQ tile (BwdCfg::DQ_N; the portable
 * backward's m16n8k16 fragments sit in the same order with width = D). */
FATTN_DQ_FN int bwd_dq_index(int row, int col, int width) {
    const int part = col / width, c = col % width;
    const int wq = row / 16, r = row % 16;
    const int lane = 4 * (r % 8) + (c % 8) / 2, e = 2 * (r / 8) + c % 2;
    return (((part * 4 + wq) * (width / 8) + c / 8) * 32 + lane) * 4 + e;
}

/* The portable backward's order: bwd_dq_index's 128-float groups, element-
 * major inside each (element e of the group's 32 lanes contiguous), so each
 * of a warp's four fp32 atomic adds covers 128 contiguous bytes (4 sectors,
 * not 16): the atomics' L2 work per element falls 4x. */
FATTN_DQ_FN int bwd_dq_index_emaj(int row, int col, int width) {
    const int i = bwd_dq_index(row, col, width);
    return (i & ~127) | ((i & 3) << 5) | ((i >> 2) & 31);
}

#endif
