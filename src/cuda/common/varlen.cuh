/* varlen.cuh - how every CUDA kernel reads a sequence of a variable-length
 * batch from cu_seqlens (the forward, the backward and its pre/postprocess
 * alike).  The arrays are never checked on the host (fattn.h), so a
 * sequence is clamped: its first row to [0, total], its length to
 * [0, min(max_len, total - first)], max_len being the longest length the
 * grids and workspaces were sized for.  Valid arrays pass unchanged.
 * FlashAttention-3's seqused_q / seqused_k (fattn.h) then cut a length to
 * its used count (varlen_used), in the forward and the backward alike. */
#pragma once

__device__ __forceinline__ void varlen_rows(const int *cu, int b, int total, int max_len, int &r0, int &len) {
    const int a = min(max(__ldg(cu + b), 0), total), e = __ldg(cu + b + 1);
    len = min(max(e - a, 0), min(max_len, total - a));
    r0 = a;
}

/* len cut to used[b] when the array is given (a negative entry: 0; the CUDA
 * engine does not check the entries on the host) */
__device__ __forceinline__ void varlen_used(const int *used, int b, int &len) {
    if (used) len = min(len, max(__ldg(used + b), 0));
}
