/* bwd_prepost.cuh - the kernels around the backward's main kernel: the
 * preprocess (D = rowsum(dO O) and the LSE in log2 units, per query row)
 * and the postprocess (dQ = softmax_scale dQ_acc in the output dtype, from
 * the fp32 tiles in bwd_dq_index's order), fixed-length and VARLEN.  Plain
 * CUDA on sm_80's instructions: the portable backward launches them too. */
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "../../common/bwd_layout.cuh"
#include "../../common/varlen.cuh"

template <bool BF16>
__device__ __forceinline__ float bwd_load16(uint16_t x) {
    return BF16 ? __bfloat162float(__ushort_as_bfloat16(x)) : __half2float(__ushort_as_half(x));
}
template <bool BF16>
__device__ __forceinline__ void bwd_store16x2(uint16_t *dst, float x0, float x1) {
    if (BF16) {
        dst[0] = __bfloat16_as_ushort(__float2bfloat16_rn(x0));
        dst[1] = __bfloat16_as_ushort(__float2bfloat16_rn(x1));
    } else {
        dst[0] = __half_as_ushort(__float2half_rn(x0));
        dst[1] = __half_as_ushort(__float2half_rn(x1));
    }
}

/* One warp per query row: D = sum(dO O) over the head dim, in fp32, and the
 * LSE in log2 units (+inf where the row saw no key or is padding: P = 0). */
template <bool BF16>
__global__ void __launch_bounds__(256) bwd_pre_kernel(const uint16_t *o, int64_t o_sb, int64_t o_ss, int64_t o_sh,
                                                      const uint16_t *dout, int64_t d_sb, int64_t d_ss, int64_t d_sh,
                                                      const float *lse, float *lse2, float *dsum, int heads, int seqlen_q,
                                                      int sq_pad, int d, int64_t rows) {
    const int64_t row = (int64_t)blockIdx.x * 8 + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const int i = (int)(row % sq_pad);
    const int64_t bh = row / sq_pad;
    const int h = (int)(bh % heads), b = (int)(bh / heads);
    float acc = 0.f, l2 = INFINITY;
    if (i < seqlen_q) {
        const uint16_t *po = o + b * o_sb + i * o_ss + h * o_sh, *pd = dout + b * d_sb + i * d_ss + h * d_sh;
        for (int c = lane; c < d; c += 32) acc = fmaf(bwd_load16<BF16>(po[c]), bwd_load16<BF16>(pd[c]), acc);
        const float l = lse[bh * seqlen_q + i];
        l2 = l == -INFINITY ? INFINITY : l * 1.4426950408889634f;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) {
        dsum[row] = acc;
        lse2[row] = l2;
    }
}

/* dq = softmax_scale dq_acc (tiles of 64 x dt columns in bwd_dq_index's
 * order, EMAJ: bwd_dq_index_emaj's; dt the kernel's head dim, d <= dt the
 * call's), two elements per thread. */
template <bool BF16, bool EMAJ = false>
__global__ void __launch_bounds__(256) bwd_post_kernel(const float *acc, uint16_t *dq, int64_t q_sb, int64_t q_ss,
                                                       int64_t q_sh, int heads, int seqlen_q, int width, int d, int dt,
                                                       float scale, int64_t pairs) {
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= pairs) return;
    const int64_t e = 2 * t;
    const int c = (int)(e % d);
    const int64_t row = e / d; /* over [batch][heads][seqlen_q] */
    const int i = (int)(row % seqlen_q);
    const int64_t bh = row / seqlen_q;
    const int h = (int)(bh % heads), b = (int)(bh / heads);
    const float *tile = acc + (bh * ((seqlen_q + 63) / 64) + i / 64) * 64 * dt;
    const float2 x = bwd_dq_pair<EMAJ>(tile, i % 64, c, width);
    uint16_t *dst = dq + b * q_sb + i * q_ss + h * q_sh + c;
    bwd_store16x2<BF16>(dst, x.x * scale, x.y * scale);
}

/* VARLEN preprocess: block (m, h, b) = query block m of head h, sequence b
 * (the grid covers the longest); 8 warps, 8 rows each: D and the LSE in log2
 * units at the row's place in the workspace ([2][heads][rb_total][64]),
 * the block's rows past the sequence (or past seqused_q[b], used_q not
 * NULL: their o and lse are not read) as padding (D 0, LSE +inf: P = 0). */
template <bool BF16>
__global__ void __launch_bounds__(256) bwd_pre_varlen_kernel(const uint16_t *o, int64_t o_ss, int64_t o_sh,
                                                             const uint16_t *dout, int64_t d_ss, int64_t d_sh,
                                                             const float *lse, float *lse2, float *dsum,
                                                             const int *cu_q, const int *used_q, int total_q,
                                                             int max_q, int rb_total, int d) {
    const int m = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    int q0, lq;
    varlen_rows(cu_q, b, total_q, max_q, q0, lq);
    varlen_used(used_q, b, lq);
    if (m * 64 >= lq) return;
    const size_t tile = ((size_t)h * rb_total + bwd_varlen_rb(q0, b) + m) * 64;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int r = warp; r < 64; r += 8) {
        const int i = m * 64 + r;
        float acc = 0.f, l2 = INFINITY;
        if (i < lq) {
            const int64_t row = (int64_t)q0 + i;
            const uint16_t *po = o + row * o_ss + h * o_sh, *pd = dout + row * d_ss + h * d_sh;
            for (int c = lane; c < d; c += 32) acc = fmaf(bwd_load16<BF16>(po[c]), bwd_load16<BF16>(pd[c]), acc);
            const float l = lse[(int64_t)h * total_q + row];
            l2 = l == -INFINITY ? INFINITY : l * 1.4426950408889634f;
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (lane == 0) {
            dsum[tile + r] = acc;
            lse2[tile + r] = l2;
        }
    }
}

/* VARLEN postprocess: block (m, h, b) writes dq = softmax_scale dq_acc for
 * the rows of query block m of sequence b that exist and are used (below
 * seqused_q[b] with used_q; the others are not written), tiles of 64 x dt
 * columns (EMAJ as bwd_post_kernel's), d <= dt written. */
template <bool BF16, bool EMAJ = false>
__global__ void __launch_bounds__(256) bwd_post_varlen_kernel(const float *acc, uint16_t *dq, int64_t q_ss, int64_t q_sh,
                                                              const int *cu_q, const int *used_q, int total_q,
                                                              int max_q, int rb_total, int width, int d, int dt,
                                                              float scale) {
    const int m = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    int q0, lq;
    varlen_rows(cu_q, b, total_q, max_q, q0, lq);
    varlen_used(used_q, b, lq);
    if (m * 64 >= lq) return;
    const float *tile = acc + ((size_t)h * rb_total + bwd_varlen_rb(q0, b) + m) * 64 * dt;
    const int rows = min(64, lq - m * 64);
    for (int t = threadIdx.x; t < rows * d / 2; t += blockDim.x) {
        const int r = 2 * t / d, c = 2 * t % d;
        const float2 x = bwd_dq_pair<EMAJ>(tile, r, c, width);
        uint16_t *dst = dq + ((int64_t)q0 + m * 64 + r) * q_ss + h * q_sh + c;
        bwd_store16x2<BF16>(dst, x.x * scale, x.y * scale);
    }
}

/* d(sink) (fattn_bwd_args.dsink): one block per query head h,
 *     dsink[h] = -sum over the head's rows of exp2(sink_h log2 e - lse2_i) D_i
 * from the preprocess's workspace (lse2 +inf on rows that saw no key and on
 * padding: no term); VARLEN: a sequence's used rows (used_q, the
 * preprocess's: the blocks past them hold no row's values).  Each thread
 * sums a fixed set of rows in double, then a fixed-order tree: the same
 * bits on every call.  used_q is the last parameter, so that the
 * fixed-length instance's others keep their offsets. */
template <bool VARLEN>
__global__ void __launch_bounds__(256) bwd_dsink_kernel(const float *lse2, const float *dsum, const float *sink,
                                                        float *dsink, int batch, int heads, int seqlen_q, int sq_pad,
                                                        const int *cu_q, int total_q, int rb_total,
                                                        const int *used_q) {
    const int h = blockIdx.x;
    const double s2 = (double)sink[h] * 1.4426950408889634;
    double acc = 0.0;
    for (int b = 0; b < batch; ++b) {
        int q0 = 0, lq = seqlen_q;
        size_t base = ((size_t)b * heads + h) * sq_pad;
        if constexpr (VARLEN) {
            varlen_rows(cu_q, b, total_q, seqlen_q, q0, lq);
            varlen_used(used_q, b, lq);
            base = ((size_t)h * rb_total + bwd_varlen_rb(q0, b)) * 64;
        } else {
            (void)used_q;
        }
        for (int i = threadIdx.x; i < lq; i += blockDim.x) {
            const float l = lse2[base + i];
            if (l != INFINITY) acc -= exp2(s2 - (double)l) * (double)dsum[base + i];
        }
    }
    __shared__ double part[256];
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) dsink[h] = (float)part[0];
}
