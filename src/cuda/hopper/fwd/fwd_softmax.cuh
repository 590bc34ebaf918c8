/* fwd_softmax.cuh - the mask and the online softmax of one consumer warpgroup's
 * 64 query rows, on the wgmma accumulator layout (HOPPER-PTX §3): a thread
 * holds rows r0 and r0 + 8 (r0 = 16 warp + lane / 4), columns 8 i + 2 q4 and
 * + 1 (q4 = lane % 4) of each 8-column group i; element 4 i + 2 r + e. */
#pragma once
#include <math.h>

#include "fwd_params.cuh"

/* Key blocks that reach past seqlen_k or the causal diagonal get -inf where
 * a key is out of a row's sight; the rest pass untouched. */
template <class C>
struct FwdMask {
    const FwdParams &p;
    int tile_row0; /* first row of the query tile (m * BM) */
    int row_base;  /* first row of this warpgroup */
    int r0, q4;
    int len_k, coff; /* VARLEN: the tile's sequence's keys and seqlen_k - seqlen_q */
    int dl = 0, dr = 0; /* LOCAL: the window, dl <= key - query <= dr (fwd_window_diag) */

    /* the fixed-length kernels read p's fields where they are used, as before
     * VARLEN existed (a hoisted copy moved their register allocation) */
    __device__ __forceinline__ int sk() const {
        if constexpr (C::VARLEN) return len_k;
        else return p.seqlen_k;
    }
    __device__ __forceinline__ int off() const {
        if constexpr (C::VARLEN) return coff;
        else return p.causal_offset;
    }
    __device__ __forceinline__ void apply(float (&s)[C::BN / 2], int col0) const {
        if constexpr (C::LOCAL) {
            apply_window(s, col0);
            return;
        }
        const bool need_mask = col0 + C::BN > sk() || (C::CAUSAL && col0 + C::BN - 1 > tile_row0 + off());
        if (!need_mask) return;
#pragma unroll
        for (int i = 0; i < C::BN / 8; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = col0 + 8 * i + 2 * q4 + (e & 1);
                const int row = row_base + r0 + (e >> 1) * 8;
                bool ok = col < sk();
                if (C::CAUSAL) ok = ok && col <= row + off();
                if (!ok) s[4 * i + e] = -INFINITY;
            }
    }
    /* LOCAL: a block that crosses seqlen_k or either edge of the window for
     * some row of this warpgroup (rows row_base .. row_base + 63) */
    __device__ __forceinline__ void apply_window(float (&s)[C::BN / 2], int col0) const {
        const bool need_mask =
            col0 + C::BN > sk() || col0 + C::BN - 1 - row_base > dr || col0 - (row_base + 63) < dl;
        if (!need_mask) return;
#pragma unroll
        for (int i = 0; i < C::BN / 8; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = col0 + 8 * i + 2 * q4 + (e & 1);
                const int d = col - (row_base + r0 + (e >> 1) * 8);
                if (!(col < sk() && d >= dl && d <= dr)) s[4 * i + e] = -INFINITY;
            }
    }
};

/* LOCAL softcap: the raw scores x -> tanh(b x), b = scale / cap (the
 * softmax's scale is then cap: fwd_sm90_launch), by the MUFU's
 * tanh.approx.f32 (max relative error 2^-11, as FlashAttention-3's softcap) */
template <class C>
__device__ __forceinline__ void fwd_softcap(float (&s)[C::BN / 2], float b) {
#pragma unroll
    for (int i = 0; i < C::BN / 2; ++i) asm("tanh.approx.f32 %0, %1;" : "=f"(s[i]) : "f"(s[i] * b));
}

/* Running row max and row sum of the two rows; scores become
 * p = exp2(s * c2 - m * c2) in place (c2 = softmax_scale * log2 e). */
template <class C>
struct FwdSoftmax {
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.f, 0.f};

    /* New running max, P in place, partial row sums; alpha: the factor the
     * old O and l are scaled by; rescale: whether any row of the warp moved
     * (warp-uniform; with LAZY most blocks move none) */
    __device__ __forceinline__ void step(float (&s)[C::BN / 2], float c2, float (&alpha)[2], bool &rescale) {
        bool moved = false;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = row_max[r];
#pragma unroll
            for (int i = 0; i < C::BN / 8; ++i) mx = fmaxf(mx, fmaxf(s[4 * i + 2 * r], s[4 * i + 2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
            /* row_max is the reference the exponents are taken against:
             * with LAZY it moves only when the block max passes it by more
             * than 2^8 (or the row had seen no key yet) */
            const bool move = !C::LAZY || row_max[r] == -INFINITY || (mx - row_max[r]) * c2 > C::LAZY_LOG2;
            if (move) {
                /* rows that have seen no key keep max -inf: use 0 so exp2 gives 0, not NaN */
                const float mnew = mx == -INFINITY ? 0.f : mx * c2;
                alpha[r] = exp2f(row_max[r] * c2 - mnew);
                row_max[r] = mx;
                moved = true;
            } else {
                alpha[r] = 1.f;
            }
            const float mscaled = row_max[r] == -INFINITY ? 0.f : row_max[r] * c2;
            float sum = 0.f;
#pragma unroll
            for (int i = 0; i < C::BN / 8; ++i) {
                float a = exp2f(fmaf(s[4 * i + 2 * r], c2, -mscaled));
                float bb = exp2f(fmaf(s[4 * i + 2 * r + 1], c2, -mscaled));
                s[4 * i + 2 * r] = a;
                s[4 * i + 2 * r + 1] = bb;
                sum += a + bb;
            }
            row_sum[r] = row_sum[r] * alpha[r] + sum;
        }
        rescale = !C::LAZY || __any_sync(0xffffffffu, moved); /* warp-uniform */
    }

    /* FP8: the same with a factor per row and column group g of SG keys,
     * f = log2(e) softmax_scale q_scale k_scale (the scales vary, so row_max
     * is kept scaled, in log2 units), and P = exp2(s f - max + 8 + lr) in
     * [0, 256] so that its e4m3 codes use the format's range (FA3); lr <= 0
     * is the log2 of the group's V scale over the block's largest (0 with one
     * group), taken back out of the row sum (inv_ratio), which is summed on
     * this P before it is rounded. */
    __device__ __forceinline__ void step_fp8(float (&s)[C::BN / 2], const float (&f)[C::NG][2],
                                             const float (&lr)[C::NG], const float (&inv_ratio)[C::NG],
                                             float (&alpha)[2]) {
        constexpr int GI = C::SG / 8; /* 8-column groups per column group */
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = -INFINITY;
#pragma unroll
            for (int g = 0; g < C::NG; ++g) {
                float mg = -INFINITY;
#pragma unroll
                for (int i = g * GI; i < (g + 1) * GI; ++i) mg = fmaxf(mg, fmaxf(s[4 * i + 2 * r], s[4 * i + 2 * r + 1]));
                mx = C::NG == 1 ? mg : fmaxf(mx, mg * f[g][r]);
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
            const float mnew = fmaxf(row_max[r], C::NG == 1 ? mx * f[0][r] : mx);
            /* a row that has seen no key keeps max -inf: use 0 so exp2 gives 0, not NaN */
            const float mref = mnew == -INFINITY ? 0.f : mnew;
            alpha[r] = exp2f(row_max[r] - mref);
            row_max[r] = mnew;
            float sum = 0.f;
#pragma unroll
            for (int g = 0; g < C::NG; ++g) {
                const float off = 8.f - mref + lr[g];
                float sg = 0.f;
#pragma unroll
                for (int i = g * GI; i < (g + 1) * GI; ++i) {
                    const float a = exp2f(fmaf(s[4 * i + 2 * r], f[g][r], off));
                    const float bb = exp2f(fmaf(s[4 * i + 2 * r + 1], f[g][r], off));
                    s[4 * i + 2 * r] = a;
                    s[4 * i + 2 * r + 1] = bb;
                    sg += a + bb;
                }
                sum = C::NG == 1 ? sg : fmaf(sg, inv_ratio[g], sum);
            }
            row_sum[r] = row_sum[r] * alpha[r] + sum;
        }
    }
};

/* O *= alpha per row (skipped when no row of the warp moved) */
template <class C>
__device__ __forceinline__ void fwd_rescale_o(float (&o)[C::PV_N / 2], const float (&alpha)[2], bool rescale) {
    if (!rescale) return; /* warp-uniform: every alpha of this warp is 1 */
#pragma unroll
    for (int i = 0; i < C::PV_N / 8; ++i) {
        o[4 * i + 0] *= alpha[0];
        o[4 * i + 1] *= alpha[0];
        o[4 * i + 2] *= alpha[1];
        o[4 * i + 3] *= alpha[1];
    }
}

/* A row's sum over its quad (the four threads that share it) */
__device__ __forceinline__ float fwd_quad_sum(float l) {
    l += __shfl_xor_sync(0xffffffff, l, 1);
    l += __shfl_xor_sync(0xffffffff, l, 2);
    return l;
}
