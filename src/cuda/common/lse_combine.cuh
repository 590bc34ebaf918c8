/* lse_combine.cuh - the one numeric policy by which device code combines
 * partial attention results over disjoint key sets (issue 42).  Every
 * combine takes its max, weights, empty and NaN rules, accumulation and
 * finalize from these functions:
 *   fattn_merge (ops/merge.cu), the decoding kernel's split combine
 *   (fwd_decode_combine) and its warps' merge (dec_epilogue), the 16-bit
 *   forward's split pieces (FwdEpilogue::split_finish) and the finalize they
 *   end in (FwdEpilogue::finish_row, finish_row_sink).  The portable engine
 *   has no combine of its own (its fattn_merge is merge.cu built for sm_80);
 *   its forward's row finalize has form (b)'s rule (l == 0: O = 0, LSE
 *   -inf; a NaN l divides) in log2 units, an expression of its own, and
 *   with a learnable sink lse_finish_sink (fwd_portable_store).
 *
 * Two forms of partial, one rule each for what "empty" means:
 *
 * (a) Normalised parts (O_i = o_i / l_i, lse_i): fattn_merge's parts, the
 *     decoding splits.  Per row
 *       M = max lse_i over the live parts,  w_i = exp(lse_i - M),
 *       L = sum_i w_i,  O = sum_i w_i O_i / L,  lse = M + log L.
 *     - live: lse_i != -inf.  A part of lse -inf (no key of its range seen
 *       by the row) takes no part: its O_i is not read, so it may hold
 *       anything (0 * NaN never enters the row).  No live part: O = 0,
 *       lse = -inf (fattn_fwd's row that sees no key), nothing divided.
 *     - NaN as torch: a NaN lse_i is live; the max skips it (fmaxf), its
 *       weight exp(NaN - M) is NaN, so L, every element of O and lse are
 *       NaN.  A NaN in a live O_i makes those elements NaN (w_i NaN = NaN),
 *       lse stays finite.  lse_i = +inf (fattn_fwd never writes it): M =
 *       +inf, w_i = exp(inf - inf) = NaN, a NaN row.
 *     - precision: M in f32 (a max rounds nothing); w_i and L in double
 *       (exp and log of double), each w_i rounded once to f32; O summed by
 *       one f32 fmaf per part, in part order; multiplied by fl32(1 / L);
 *       lse = fl32(M + log L).  A 16-bit output is that f32 rounded once,
 *       to nearest even.  The order in which L's doubles are summed is the
 *       kernel's (fixed, so every run gives the same bits); at double
 *       precision it does not reach the f32 results but by rare ties.
 *     - a learnable sink counted once at the combine is one more live part
 *       with O = 0: in M and in L, not in the sum of O (no part seen: O = 0,
 *       lse = sink; a NaN sink: a NaN row).
 *
 * (b) Unnormalised partials (m_i, l_i, o_i), m_i the row max of the raw
 *     scores in units where exp2((m_i - M) c) is the rescale (c the softmax
 *     scale times log2 e): the forward's SPLIT pieces, the decoding
 *     kernel's WN warps of a row.  Per row M = max m_i (fmaxf), factors
 *     f_i = exp2f((m_i - M) c) in f32, L = sum f_i l_i, O = sum f_i o_i,
 *     then the finalize: O / L and lse = M scale + log L.
 *     - m_i = -inf does not mean empty here: an all-NaN score row keeps max
 *       -inf with l_i NaN.  So its factor is 0 (never exp2(-inf + inf) =
 *       NaN for an empty partial) and it is still multiplied in: 0 * l_i,
 *       0 * o_i are 0 for a partial that saw no key (l_i = 0, o_i = 0) and
 *       NaN for a NaN row, which therefore stays NaN.
 *     - finalize: L == 0 is the row that saw no key: O = 0, lse = -inf (with
 *       a sink: O = 0, lse = sink).  Anything else divides, so a NaN L gives
 *       a NaN O and lse (never -inf, which the backward reads as "no key").
 *       f32 throughout (the kernels' registers); the sink joins as in (a),
 *       in f32 (__expf, __logf).
 * Why two forms: (a)'s parts were written normalised by someone else
 * (fattn_fwd, another GPU) and an lse of -inf is only ever written for
 * L == 0 (finalize), so skipping such a part is exact and protects against
 * garbage; (b)'s partials are a kernel's own registers or workspace, where
 * the NaN row must survive the rescale.
 * The CPU engine's fattn_merge (src/cpu/merge.c) keeps (a)'s rules in double
 * throughout: it is the reference the GPU is checked against (design.md,
 * section 3). */
#pragma once
#include <math.h>

/* The running max of both forms: fmaxf, so a NaN never wins (its NaN
 * reaches the row through its weight instead). */
__device__ __forceinline__ float lse_running_max(float m, float x) { return fmaxf(m, x); }

/* ---- (a) normalised parts ------------------------------------------------ */

/* A part takes part in a row unless its lse is -inf (NaN takes part). */
__device__ __forceinline__ bool lse_part_live(float lse) { return lse != -INFINITY; }

/* A live part's weight exp(lse - M), in double (round it once to f32 for
 * the sum of O; keep the double for L). */
__device__ __forceinline__ double lse_part_weight(float lse, double M) { return exp((double)lse - M); }

/* acc += w x: one f32 fma a part, parts in order.  Written as a sum, which
 * nvcc contracts to the fma (-fmad=true, the default): with fmaf
 * dec_epilogue's code changed, merge_kernel's is the same either way. */
__device__ __forceinline__ float lse_accumulate(float acc, float w, float x) { return acc + w * x; }

/* The f32 factor of the summed O: fl32(1 / L); 0 for a row with no live
 * part (any: nonzero when some part is live; an int, as the kernels reduce
 * it by shuffles). */
__device__ __forceinline__ float lse_out_scale(int any, double L) { return any ? (float)(1.0 / L) : 0.0f; }

/* An element of the combined O, in f32 (round it once to a 16-bit output). */
__device__ __forceinline__ float lse_out(int any, float acc, float inv) { return any ? acc * inv : 0.0f; }

/* The combined LSE: fl32(M + log L); -inf for a row with no live part. */
__device__ __forceinline__ float lse_out_lse(int any, double M, double L) {
    return any ? (float)(M + log(L)) : -INFINITY;
}

/* ---- (b) unnormalised partials -------------------------------------------- */

/* The factor of a partial of row max m (scaled units) against the new max M:
 * exp2f((m - M) c), 0 when m is -inf, applied to its l and o alike. */
__device__ __forceinline__ float lse_rescale(float m, float M, float c) {
    return m == -INFINITY ? 0.f : exp2f((m - M) * c);
}

/* A partial's l or o joined to the running sum: acc fa + x fb (fa the
 * running sum's factor against the new max, fb the partial's; f32). */
__device__ __forceinline__ float lse_rescale_add(float acc, float fa, float x, float fb) { return acc * fa + x * fb; }

/* The finalize of a combined (M, L): O's factor 1 / L (FP8 forward: num / L,
 * num the V scale O is in units of), 0 for a row that saw no key (L == 0). */
__device__ __forceinline__ float lse_finish_scale(float L) { return L == 0.f ? 0.f : 1.f / L; }
__device__ __forceinline__ float lse_finish_scale(float L, float num) { return L == 0.f ? 0.f : num / L; }

/* ... and its LSE, m c + log L (m the max in the units of c, c the factor to
 * natural-log units), -inf for a row that saw no key; a NaN L gives NaN. */
__device__ __forceinline__ float lse_finish_lse(float L, float m, float c) {
    return L == 0.f ? -INFINITY : m * c + logf(L);
}

/* Both, for a kernel that writes both: the same two expressions, written
 * out (calling the two functions above compiled dec_epilogue to another
 * branch layout). */
__device__ __forceinline__ void lse_finish(float L, float m, float c, float &scale, float &lse) {
    scale = L == 0.f ? 0.f : 1.f / L;
    lse = L == 0.f ? -INFINITY : m * c + logf(L);
}

/* The finalize with a learnable sink (natural-log units, counted once): with
 * Mn = m c and X = max(Mn, sink) the row's sum is L e^(Mn - X) + e^(sink - X);
 * O's factor e^(Mn - X) / sum, lse = X + log sum.  No key (L == 0): 0 and
 * the sink.  The sink is loaded here from sink_at and Mn formed inside the
 * branch, as the kernels did (a sink passed by value compiled the max's
 * comparison the other way round). */
__device__ __forceinline__ void lse_finish_sink(float L, float m, float c, const float *sink_at, float &scale,
                                                float &lse) {
    const float sink = __ldg(sink_at);
    scale = 0.f, lse = sink;
    if (L != 0.f) {
        const float mn = m * c;
        const float mx = sink > mn ? sink : mn;
        const float keep = __expf(mn - mx);
        const float sum = L * keep + __expf(sink - mx);
        scale = keep / sum;
        lse = mx + __logf(sum);
    }
}
