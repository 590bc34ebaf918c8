/* fwd_kvcache_fixed.cu - a fixed-length call on a KV cache (block_table,
 * seqused_k or an FP8 cache) that the decoding kernel does not take (longer
 * queries, page sizes other than 2^k >= 8, softcap at d256 past 16 rows):
 * the same call as a variable-length batch of equal query counts on the
 * KV-cache kernels (FwdVarlen, cu_seqlens_q alone), cu_seqlens_q written by
 * a small kernel into the context's decoding workspace, and the LSE, which
 * the varlen kernels write as [heads_q, total_q], moved into the caller's
 * [batch, heads_q, seqlen_q] by another (batch 1: the same layout).  Q and O
 * must be packed along the batch (entry.cu: stride_batch = seqlen_q x
 * stride_seq), so that row i of sequence b is packed row b seqlen_q + i. */
#include <cuda_runtime.h>

#include <algorithm>

#include "fwd_sm90_dispatch.h"

__global__ void fixed_cu_seqlens_kernel(int32_t *cu, int batch, int seqlen_q) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= batch) cu[i] = i * seqlen_q;
}

/* lse[b][h][i] = packed[h][b seqlen_q + i] */
__global__ void fixed_lse_kernel(float *lse, const float *packed, int batch, int heads, int seqlen_q) {
    const int64_t n = (int64_t)batch * heads * seqlen_q;
    for (int64_t x = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; x < n; x += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = x % seqlen_q, bh = x / seqlen_q, h = bh % heads, b = bh / heads;
        lse[x] = packed[h * ((int64_t)batch * seqlen_q) + b * seqlen_q + i];
    }
}

fattn_status fwd_kvcache_fixed(fattn_ctx *ctx, const fattn_fwd_args *a, const fwd_variant &v) {
    const fattn_problem *p = &a->p;
    const int64_t total = (int64_t)p->batch * p->seqlen_q;
    const bool move_lse = a->lse && p->batch > 1;
    const size_t cu_bytes = ((size_t)(p->batch + 1) * 4 + 255) / 256 * 256;
    const size_t bytes = cu_bytes + (move_lse ? (size_t)total * p->heads_q * 4 : 0);
    void *ws = NULL;
    fattn_status s = cuda_decode_workspace(ctx, bytes, &ws);
    if (s != FATTN_OK) return s;
    if (!ws)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "a fixed-length KV-cache call the decoding kernel does not take runs as a varlen batch, whose "
                          "%zu-byte workspace the context cannot grow during a graph capture: make the same call once "
                          "before capturing, or pass cu_seqlens_q",
                          bytes);
    cudaStream_t st = (cudaStream_t)ctx->stream;
    int32_t *cu = (int32_t *)ws;
    fixed_cu_seqlens_kernel<<<(p->batch + 256) / 256, 256, 0, st>>>(cu, p->batch, p->seqlen_q);
    if ((s = cuda_launch_error(ctx, "fattn_fwd (fixed-length on a KV cache): cu_seqlens_q")) != FATTN_OK) return s;
    fattn_fwd_args b = *a;
    b.p.cu_seqlens_q = cu;
    b.p.total_q = (int)total;
    if (move_lse) b.lse = (float *)((char *)ws + cu_bytes);
    if ((s = fwd_sm90_varlen(ctx, &b, v)) != FATTN_OK) return s;
    if (move_lse) {
        const int64_t n = total * p->heads_q;
        const int blocks = (int)std::min<int64_t>((n + 255) / 256, 4096);
        fixed_lse_kernel<<<blocks, 256, 0, st>>>(a->lse, b.lse, p->batch, p->heads_q, p->seqlen_q);
        if ((s = cuda_launch_error(ctx, "fattn_fwd (fixed-length on a KV cache): lse")) != FATTN_OK) return s;
    }
    return cuda_decode_workspace_done(ctx);
}
