/* quantize.cu - fattn_quantize on a CUDA context: f32/f16/bf16 -> e4m3 with
 * one fp32 scale per block of rows of each (batch, head), or one per tensor,
 * after the optional incoherent-processing rotation x <- (x * signs) H /
 * sqrt(d).  The codes and scales are bitwise those of the CPU engine
 * (src/cpu/quantize.c, src/common/hadamard.c, fp8.c):
 *   - the rotation is the CPU's fast Walsh-Hadamard transform, the same
 *     butterflies in the same stage order (h = 1, 2, 4, ...; x[j] = a + b,
 *     x[j+h] = a - b), then the multiply by the same float (float)(1 /
 *     sqrt((double)d));
 *   - amax skips NaN (fmaxf), scale = max(amax / 448, FLT_MIN) (1 for an
 *     all-zero block; the floor keeps a block of f32 subnormals from a 0
 *     scale, whose zeros would code NaN),
 *     code = cvt.rn.satfinite.e4m3x2.f32(x / scale) with an IEEE division.
 * Every float operation on those paths is inline PTX without .ftz: the
 * library is built with --use_fast_math, under which nvcc turns even
 * __fdiv_rn / __fadd_rn / fmaxf into their .ftz forms and flushes the
 * subnormals (bf16 and f32 inputs have them, and so do scales of tiny blocks)
 * that the CPU keeps.
 *
 * Work layout.  A thread holds E consecutive elements of a row (a "chunk":
 * E = 8 without rotation, min(16, d) with it), C = d / E threads a row, Y =
 * 256 / C rows per pass of a 256-thread CTA, K chunks (rows y, y + Y, ...)
 * per thread in registers: a CTA holds R = K * Y rows.  Three ways through:
 *   - on chip (block granularity, block_rows <= 8 R): one pass over DRAM.  A
 *     CTA holds G = R / block_rows whole blocks; a block larger than R is
 *     spread over a cluster of CL <= 8 CTAs (the smallest power of two that
 *     holds it), whose amax is combined through distributed shared memory.
 *     Each row is loaded once, its block's amax reduced (lanes of a row by
 *     shuffles, rows by shared-memory atomics), and the codes and the scale
 *     written from the registers.
 *   - per tensor, and blocks larger than 8 R (e.g. block_rows 4097 at d 128):
 *     two passes.  An amax kernel reduces each tile and atomically maxes
 *     amax / 448 into the scale entry (scale[0] for the tensor: a division
 *     by 448 is monotonic, so the max of the quotients is the quotient of
 *     the max), then a second kernel re-reads the input, in reverse tile
 *     order so that the tiles the first kernel read last are still in L2,
 *     and writes the codes (and 1 over a 0, the all-zero case).  The input
 *     is read twice: a tensor or block larger than the chip cannot be held.
 * The signs of the rotation are passed in the kernel's parameters as a
 * 256-bit mask (fattn_rotation_signs on the host).
 * Measured on the H200 (bench/quant_bw.cu, bf16 [4, 16384, 16, d], block
 * 128): 0.57-0.60 of the copy bandwidth without rotation, 0.38-0.49 with;
 * per tensor 0.50 (0.83 counting both reads) and 0.29-0.32.  A CTA waits
 * for the last of its loads before the block's amax is known, so DRAM idles
 * while it computes.  A persistent kernel that keeps the next tiles in
 * flight by cp.async was written and ran bitwise-correct with one tile per
 * CTA, but had not run with several when it left the file (git history:
 * bebe204; q1). */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/fp8.h"
#include "../common/e4m3_quant.cuh"
#include "../common/sm80.cuh" /* cp_async_commit, cp_async_wait */
#include "../cuda_engine.h"

#define QUANT_THREADS 256
#define QUANT_MAX_CLUSTER 8
#define QUANT_MAX_ROT_DIM 256
#define QUANT_MAX_DIM 512

/* ---- what a kernel instance holds ---------------------------------------- */

/* Elements per chunk: 8 without rotation (head_dim a multiple of 8); with
 * rotation min(16, d), so that the first four butterfly stages stay inside
 * a thread and only log2(d / 16) go through shuffles. */
__host__ __device__ constexpr int quant_chunk(int rot) { return rot == 0 ? 8 : (rot < 16 ? rot : 16); }
/* Chunks per thread (rows y, y + Y, ...). */
__host__ __device__ constexpr int quant_items(int dt, int rot) {
    return rot >= 16 ? 2 : (rot == 0 && dt == FATTN_DTYPE_F32 ? 4 : 8);
}
/* CTAs per SM the registers are capped for (64 registers at 4): 8 chunks of
 * 16-bit words, 4 of f32, 2 rotated chunks of 16 floats; 8 rotated chunks of
 * up to 8 floats take 2.  4 CTAs measured faster than 2 holding twice the
 * rows (rotated d 128: 0.44 of copy bandwidth against 0.36). */
__host__ __device__ constexpr int quant_min_ctas(int dt, int rot) { return rot == 0 || rot >= 16 ? 4 : 2; }

enum quant_mode {
    QUANT_ONCHIP = 0,     /* block granularity, one pass */
    QUANT_AMAX = 1,       /* first pass: the scale of each tile's amax atomically maxed into scale[] */
    QUANT_FROM_SCALE = 2  /* second pass: codes from the scale[] the first wrote */
};

struct quant_params {
    const char *in;   /* element 0 of batch 0, head 0, row 0 */
    uint8_t *out;
    float *scale;
    int64_t in_sb, in_ss, in_sh;    /* strides in bytes */
    int64_t out_sb, out_ss, out_sh; /* e4m3: bytes = elements */
    int32_t heads, seqlen;
    int32_t C, Y, R;     /* threads per row, rows per pass, rows per CTA */
    int32_t br, nb;      /* block_rows, blocks per (batch, head) */
    uint32_t br_magic;   /* ceil(2^32 / br) for br >= 2 (on-chip slot of a row) */
    int32_t G, groups;   /* on chip: blocks per CTA (or cluster), groups per (batch, head) */
    int32_t CL;          /* on chip: CTAs per cluster */
    int32_t tiles;       /* two passes: tiles of R rows per (batch, head); pipelined: groups in all */
    int32_t mode;        /* quant_mode */
    int32_t tensor;      /* FATTN_QUANT_TENSOR (two passes) */
    int32_t nscale;      /* entries of scale[] */
    int32_t w_in, w_out; /* widest access (bytes) the pointers and strides allow */
    int32_t lane_reduce; /* C a power of two <= 32: a row's chunks sit in C aligned lanes */
    int32_t head_fast;   /* the grid walks heads before rows (stride_head < stride_seq) */
    uint32_t sign[8];    /* bit i set: element i of the row is negated first */
    float norm;          /* (float)(1 / sqrt((double)d)) */
};

/* ---- float arithmetic without .ftz: common/e4m3_quant.cuh ---------------------- */

/* ---- memory ----------------------------------------------------------------- */

/* L2 policies: inputs read once are evicted first; the first of two passes
 * leaves them at normal priority for the second. */
__device__ __forceinline__ uint64_t l2_policy(bool evict_first) {
    uint64_t p;
    if (evict_first)
        asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    else
        asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p));
    return p;
}
__device__ __forceinline__ void ld16(const char *p, uint64_t pol, uint32_t *w) {
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                 : "l"(p), "l"(pol));
}
__device__ __forceinline__ void ld8(const char *p, uint64_t pol, uint32_t *w) {
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;"
                 : "=r"(w[0]), "=r"(w[1])
                 : "l"(p), "l"(pol));
}
__device__ __forceinline__ uint32_t ld4(const char *p, uint64_t pol) {
    uint32_t w;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(w) : "l"(p), "l"(pol));
    return w;
}
__device__ __forceinline__ uint32_t ld2(const char *p, uint64_t pol) {
    uint16_t h;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.u16 %0, [%1], %2;" : "=h"(h) : "l"(p), "l"(pol));
    return h;
}
/* A relaxed load of a scale entry that another CTA of this grid may be
 * writing (the 0 -> 1 of an all-zero block; both values mean scale 1). */
__device__ __forceinline__ uint32_t ld_relaxed(const float *p) {
    uint32_t v;
    asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* cp.async (LDGSTS): w bytes global -> shared, completion per thread
 * through commit/wait groups.  No L2 cache hint: with one, ptxas 13.0 gave
 * the copy in the persistent loop a descriptor in an odd uniform register
 * (desc[UR1]) and the device raised "illegal instruction". */
__device__ __forceinline__ void cp_async(uint32_t dst, const char *src, int w) {
    if (w >= 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
    else if (w >= 8)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(src) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}

/* Element i of a chunk as float (exact for every input dtype). */
template <int DT> __device__ __forceinline__ float elem_f32(const uint32_t *w, int i) {
    if (DT == FATTN_DTYPE_F32) return __uint_as_float(w[i]);
    const uint32_t h = (w[i >> 1] >> ((i & 1) * 16)) & 0xFFFFu;
    if (DT == FATTN_DTYPE_BF16) return __uint_as_float(h << 16);
    return __half2float(__ushort_as_half((unsigned short)h));
}

/* B bytes at p into words, read w bytes at a time (w: the widest access the
 * pointers and strides allow; uniform over the grid, B a power of two). */
template <int B>
__device__ __forceinline__ void load_words(const char *p, int w, uint64_t pol, uint32_t (&wd)[(B + 3) / 4]) {
    if (B >= 16 && w >= 16) {
#pragma unroll
        for (int i = 0; i < B / 16; ++i) ld16(p + 16 * i, pol, wd + 4 * i);
    } else if (B >= 8 && w >= 8) {
#pragma unroll
        for (int i = 0; i < B / 8; ++i) ld8(p + 8 * i, pol, wd + 2 * i);
    } else if (B >= 4 && w >= 4) {
#pragma unroll
        for (int i = 0; i < B / 4; ++i) wd[i] = ld4(p + 4 * i, pol);
    } else { /* 16-bit elements, 2-byte aligned */
#pragma unroll
        for (int i = 0; i < (B + 3) / 4; ++i) wd[i] = 0;
#pragma unroll
        for (int i = 0; i < B / 2; ++i) wd[i >> 1] |= ld2(p + 2 * i, pol) << ((i & 1) * 16);
    }
}

/* E elements at p as floats. */
template <int DT, int E>
__device__ __forceinline__ void load_chunk(const char *p, int w, uint64_t pol, float (&x)[E]) {
    constexpr int ESZ = DT == FATTN_DTYPE_F32 ? 4 : 2, B = E * ESZ;
    uint32_t wd[(B + 3) / 4];
    load_words<B>(p, ESZ == 4 && w < 4 ? 4 : w, pol, wd); /* f32 pointers are 4-byte aligned */
#pragma unroll
    for (int i = 0; i < E; ++i) x[i] = elem_f32<DT>(wd, i);
}

/* E codes (4 per word, element 0 in the lowest byte) to p, w bytes at a time. */
template <int E> __device__ __forceinline__ void store_codes(uint8_t *p, int w, const uint32_t (&c)[(E + 3) / 4]) {
    if (E >= 16 && w >= 16) {
#pragma unroll
        for (int i = 0; i < E / 16; ++i) *(uint4 *)(p + 16 * i) = make_uint4(c[4 * i], c[4 * i + 1], c[4 * i + 2], c[4 * i + 3]);
    } else if (E >= 8 && w >= 8) {
#pragma unroll
        for (int i = 0; i < E / 8; ++i) *(uint2 *)(p + 8 * i) = make_uint2(c[2 * i], c[2 * i + 1]);
    } else if (E >= 4 && w >= 4) {
#pragma unroll
        for (int i = 0; i < E / 4; ++i) *(uint32_t *)(p + 4 * i) = c[i];
    } else {
#pragma unroll
        for (int i = 0; i < E; ++i) p[i] = (uint8_t)(c[i >> 2] >> ((i & 3) * 8));
    }
}

/* ---- cluster: distributed shared memory ----------------------------------- */

__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire;" ::: "memory"); }
/* The u32 at `p`'s offset in the shared memory of CTA `rank` of the cluster. */
__device__ __forceinline__ uint32_t ld_cluster_u32(const uint32_t *p, uint32_t rank) {
    uint32_t local = (uint32_t)__cvta_generic_to_shared(p), remote, v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(remote) : "memory");
    return v;
}

/* ---- the kernel -------------------------------------------------------------- */

/* The incoherent-processing rotation of one row chunk (C threads a row, in
 * aligned lanes), bitwise fattn_rotate_row: signs, the butterflies in the
 * CPU's stage order (h < E inside the thread, then lane distance h / E), the
 * normalisation.  All C lanes of a row run it together, also for rows past
 * the end (their zeros go nowhere). */
template <int ROT, int E>
__device__ __forceinline__ void rotate_chunk(float (&x)[E], uint32_t sbits, int c, float norm) {
#pragma unroll
    for (int e = 0; e < E; ++e) x[e] = __uint_as_float(__float_as_uint(x[e]) ^ (((sbits >> e) & 1u) << 31));
#pragma unroll
    for (int h = 1; h < E; h <<= 1)
#pragma unroll
        for (int e = 0; e < E; ++e)
            if (!(e & h)) {
                const float a = x[e], b = x[e + h];
                x[e] = f32_add(a, b);
                x[e + h] = f32_sub(a, b);
            }
#pragma unroll
    for (int m = 1; m < ROT / E; m <<= 1) {
        /* the lane with bit m clear holds a, its partner b: a + b here, a - b there */
        const float sg = (c & m) ? -1.0f : 1.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) x[e] = f32_fma(x[e], sg, __shfl_xor_sync(0xFFFFFFFFu, x[e], m));
    }
#pragma unroll
    for (int e = 0; e < E; ++e) x[e] = f32_mul(x[e], norm);
}

/* Row rl's block slot within an on-chip group: rl / br (rl < 2^11 and the
 * quotient exact for any br with ceil(2^32 / br)). */
__device__ __forceinline__ int onchip_slot(int rl, const quant_params &p) {
    return p.br == 1 ? rl : (int)__umulhi((uint32_t)rl, p.br_magic);
}

/* ---- x / scale for a chunk ----------------------------------------------------
 * div.rn.f32 is a correctly rounded fast path (MUFU.RCP, a Newton step for
 * the reciprocal, q0 = x r, one FMA correction) guarded by FCHK with a
 * branch to a slow path, per element: 16 branches a chunk, none interleaved.
 * Here the reciprocal is made once a chunk (the scale is the block's) and
 * the elements go through the same fast path without branches, when the
 * scale lies in [2^-60, 2^60] (one test a chunk, else div.rn per element):
 *   - where |x / s| >= 2^-20 both x and the quotient are normal, far from
 *     any overflow or underflow, and the sequence is the one div.rn takes
 *     there (correct rounding is unique, so the bits are div.rn's);
 *   - where |x / s| < 2^-20 the code is +-0 with x's sign whatever the
 *     quotient's last bits (e4m3 rounds |q| <= 2^-10 to zero): the
 *     sequence keeps the sign and the magnitude within a factor 2;
 *   - x = +-0 keeps its sign (the correction would give +0 for -0), NaN
 *     stays NaN; an Inf x means amax = Inf, a scale out of the range.
 * So the codes are those of div.rn, which are the CPU's. */
__device__ __forceinline__ bool scale_fast_ok(float s) {
    const uint32_t e = __float_as_uint(s) >> 23; /* s > 0: no sign bit */
    return e >= 127 - 60 && e <= 127 + 60;
}
__device__ __forceinline__ float rcp_refined(float s) {
    float r;
    asm("{\n .reg .f32 r0, t, n;\n rcp.approx.ftz.f32 r0, %1;\n neg.f32 n, %1;\n fma.rn.f32 t, r0, n, 0f3F800000;\n"
        " fma.rn.f32 %0, t, r0, r0;\n}"
        : "=f"(r)
        : "f"(s));
    return r;
}
__device__ __forceinline__ float quot_fast(float x, float s, float r) {
    float q;
    asm("{\n .reg .f32 q0, e, n, q1;\n .reg .pred z;\n mul.rn.f32 q0, %1, %3;\n neg.f32 n, q0;\n"
        " fma.rn.f32 e, n, %2, %1;\n fma.rn.f32 q1, %3, e, q0;\n setp.eq.f32 z, %1, 0f00000000;\n"
        " selp.f32 %0, %1, q1, z;\n}"
        : "=f"(q)
        : "f"(x), "f"(s), "f"(r));
    return q;
}

/* The codes of a chunk: x / scale (quot_fast where the scale allows), e4m3,
 * stored. */
template <int E> __device__ __forceinline__ void quantize_store(float (&v)[E], float scale, uint8_t *dst, int w) {
    if (scale_fast_ok(scale)) {
        const float r = rcp_refined(scale);
#pragma unroll
        for (int e = 0; e < E; ++e) v[e] = quot_fast(v[e], scale, r);
    } else {
#pragma unroll
        for (int e = 0; e < E; ++e) v[e] = f32_div(v[e], scale);
    }
    uint32_t codes[(E + 3) / 4];
#pragma unroll
    for (int i = 0; i < (E + 3) / 4; ++i) codes[i] = 0;
#pragma unroll
    for (int e = 0; e < E; e += 2) {
        const uint32_t pr = e + 1 < E ? e4m3x2(v[e], v[e + 1]) : (e4m3x2(v[e], 0.0f) & 0xFFu);
        codes[e >> 2] |= pr << ((e & 3) * 8);
    }
    store_codes<E>(dst, w, codes);
}

/* What a thread keeps of each chunk between the amax and the codes: the
 * 16-bit words as loaded without rotation (half the registers), else the
 * (rotated) floats. */
template <int DT, int ROT> struct quant_store {
    static constexpr bool RAW = ROT == 0 && DT != FATTN_DTYPE_F32;
};

template <int DT, int E>
__device__ __forceinline__ void unpack16(const uint32_t (&w)[E / 2], float (&x)[E]) {
#pragma unroll
    for (int i = 0; i < E; ++i) x[i] = elem_f32<DT>(w, i);
}

template <int DT, int ROT>
__global__ void __launch_bounds__(QUANT_THREADS, quant_min_ctas(DT, ROT))
    quant_kernel(const __grid_constant__ quant_params p) {
    constexpr int E = quant_chunk(ROT), K = quant_items(DT, ROT);
    constexpr int ESZ = DT == FATTN_DTYPE_F32 ? 4 : 2;
    constexpr bool RAW = quant_store<DT, ROT>::RAW;
    constexpr int MAX_SLOTS = 8 * QUANT_THREADS; /* rows a CTA can hold (R <= 2048) */
    __shared__ uint32_t slot_amax[MAX_SLOTS];
    __shared__ float slot_scale[MAX_SLOTS];

    const int C = ROT ? ROT / E : p.C;
    const int t = threadIdx.x, c = t % C, y = t / C;
    const int mode = p.mode;

    /* This CTA's rows [s0, s1) of (batch, head) `pair`: group (or tile) gi
     * of it.  With heads interleaved in memory (BSHD) the heads of one group
     * are neighbours in the grid, so that the CTAs running together read
     * and write whole stretches of memory, not one head's rows 4 kB apart. */
    int pair, s0, s1, rank = 0, gi;
    {
        const int per_pair = mode == QUANT_ONCHIP ? p.groups : p.tiles;
        int idx = mode == QUANT_ONCHIP ? (int)blockIdx.x / p.CL : (int)blockIdx.x;
        /* the second pass walks the tiles backwards: the first pass's last
         * tiles are the ones still in L2 */
        if (mode == QUANT_FROM_SCALE) idx = (int)gridDim.x - 1 - idx;
        if (p.head_fast) {
            const int bb = idx / (per_pair * p.heads), r = idx % (per_pair * p.heads);
            gi = r / p.heads;
            pair = bb * p.heads + r % p.heads;
        } else {
            pair = idx / per_pair;
            gi = idx % per_pair;
        }
    }
    if (mode == QUANT_ONCHIP) {
        rank = blockIdx.x % p.CL;
        const int group_s0 = gi * p.G * p.br;
        const int group_s1 = (int)min((int64_t)p.seqlen, (int64_t)group_s0 + (int64_t)p.G * p.br);
        s0 = group_s0 + rank * p.R;
        s1 = min(group_s1, s0 + p.R);
    } else {
        s0 = gi * p.R;
        s1 = min(p.seqlen, s0 + p.R);
    }
    const int b = pair / p.heads, h = pair % p.heads;
    const char *in = p.in + b * p.in_sb + h * p.in_sh + (int64_t)c * E * ESZ;
    uint8_t *out = p.out + b * p.out_sb + h * p.out_sh + (int64_t)c * E;
    const uint64_t pol = l2_policy(mode != QUANT_AMAX);

    /* every chunk of the tile is loaded before anything waits for one */
    float x[RAW ? 1 : K][E];
    uint32_t raw[RAW ? K : 1][(E + 1) / 2];
#pragma unroll
    for (int k = 0; k < K; ++k) {
        const int s = s0 + y + k * p.Y;
        if constexpr (RAW) {
            if (s < s1) load_words<E * ESZ>(in + s * p.in_ss, p.w_in, pol, raw[k]);
            else
#pragma unroll
                for (int i = 0; i < E / 2; ++i) raw[k][i] = 0;
        } else {
            if (s < s1) load_chunk<DT, E>(in + s * p.in_ss, p.w_in, pol, x[k]);
            else
#pragma unroll
                for (int e = 0; e < E; ++e) x[k][e] = 0.0f;
        }
    }

    /* Two passes over huge blocks: the blocks this tile's rows belong to
     * (at most two: R < br there). */
    int blk0 = 0, next_start = 0x7FFFFFFF;
    if (mode != QUANT_ONCHIP && !p.tensor) {
        blk0 = s0 / p.br;
        next_start = (int)min((int64_t)(blk0 + 1) * p.br, (int64_t)0x7FFFFFFF);
    }
    if (mode != QUANT_FROM_SCALE) {
        for (int i = t; i < (mode == QUANT_ONCHIP ? p.G : 2); i += blockDim.x) slot_amax[i] = 0;
        __syncthreads();
    }

    if constexpr (ROT != 0) {
        const int first = c * E; /* element index of x[k][0] in the row */
        uint32_t word = p.sign[0];
#pragma unroll
        for (int j = 1; j < 8; ++j)
            if ((first >> 5) == j) word = p.sign[j];
        const uint32_t sbits = word >> (first & 31);
#pragma unroll
        for (int k = 0; k < K; ++k) rotate_chunk<ROT, E>(x[k], sbits, c, p.norm);
    }

    /* ---- amax of each block ---- */
    if (mode != QUANT_FROM_SCALE) {
        const bool lanes = ROT || p.lane_reduce;
#pragma unroll
        for (int k = 0; k < K; ++k) {
            float m = 0.0f;
            if constexpr (RAW) {
                float v[E];
                unpack16<DT, E>(raw[k], v);
#pragma unroll
                for (int e = 0; e < E; ++e) m = f32_amax(m, v[e]);
            } else {
#pragma unroll
                for (int e = 0; e < E; ++e) m = f32_amax(m, x[k][e]);
            }
            if (lanes)
                for (int o = 1; o < C; o <<= 1) m = f32_max(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
            const int rl = y + k * p.Y, s = s0 + rl;
            const uint32_t mb = __float_as_uint(m); /* >= +0: unsigned order is float order */
            if (s < s1 && mb && (!lanes || c == 0)) {
                const int slot = mode == QUANT_ONCHIP ? (p.CL > 1 ? 0 : onchip_slot(rl, p)) : (s >= next_start);
                atomicMax(&slot_amax[slot], mb);
            }
        }
        __syncthreads();
    }

    if (mode == QUANT_AMAX) {
        /* the quotient by 448 and the floor are monotonic: max of the scales =
     * scale of the max */
        if (t < (p.tensor ? 1 : 2)) {
            const uint32_t m = slot_amax[t];
            const int blk = blk0 + t;
            if (m && (p.tensor || blk < p.nb))
                atomicMax((unsigned *)p.scale + (p.tensor ? 0 : pair * p.nb + blk),
                          __float_as_uint(scale_of_nonzero_amax(__uint_as_float(m))));
        }
        return;
    }

    if (mode == QUANT_ONCHIP) {
        const int64_t first_blk = (int64_t)pair * p.nb + (int64_t)gi * p.G;
        if (p.CL > 1) {
            /* one block over the cluster: every CTA's slot is final after the
             * first barrier; after the second arrive nobody reads remote slots */
            cluster_arrive();
            cluster_wait();
            if (t == 0) {
                uint32_t m = 0;
                for (int r = 0; r < p.CL; ++r) m = max(m, ld_cluster_u32(&slot_amax[0], (uint32_t)r));
                slot_scale[0] = scale_of_amax(m);
                if (rank == 0) p.scale[first_blk] = slot_scale[0];
            }
            cluster_arrive();
        } else {
            const int nslots = min(p.G, p.nb - gi * p.G);
            for (int i = t; i < nslots; i += blockDim.x) {
                slot_scale[i] = scale_of_amax(slot_amax[i]);
                p.scale[first_blk + i] = slot_scale[i];
            }
        }
        __syncthreads();
    }

    /* ---- codes ---- */
    uint32_t tensor_v = 0;
    if (mode == QUANT_FROM_SCALE && p.tensor) tensor_v = ld_relaxed(p.scale);
#pragma unroll
    for (int k = 0; k < K; ++k) {
        const int rl = y + k * p.Y, s = s0 + rl;
        if (s >= s1) continue;
        float scale;
        if (mode == QUANT_ONCHIP) {
            scale = slot_scale[p.CL > 1 ? 0 : onchip_slot(rl, p)];
        } else {
            const int64_t g = p.tensor ? 0 : (int64_t)pair * p.nb + blk0 + (s >= next_start);
            const uint32_t v = p.tensor ? tensor_v : ld_relaxed(p.scale + g);
            scale = v ? __uint_as_float(v) : 1.0f;
            /* an all-zero block (or tensor) left 0 in its entry: make it 1 */
            const bool first_row = p.tensor ? (pair == 0 && s == 0) : (s % p.br == 0);
            if (!v && c == 0 && first_row) atomicExch(p.scale + g, 1.0f);
        }
        float v[E];
        if constexpr (RAW) unpack16<DT, E>(raw[k], v);
        else
#pragma unroll
            for (int e = 0; e < E; ++e) v[e] = x[k][e];
        quantize_store<E>(v, scale, out + s * p.out_ss, p.w_out);
    }

    if (mode == QUANT_FROM_SCALE && p.tensor) {
        /* every other entry of scale[]; entry 0 holds the reduction */
        const float scale = tensor_v ? __uint_as_float(tensor_v) : 1.0f;
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + t + 1; i < p.nscale; i += (int64_t)gridDim.x * blockDim.x)
            p.scale[i] = scale;
    }
    if (mode == QUANT_ONCHIP && p.CL > 1) cluster_wait(); /* peers are done with our slot */
}

/* ---- host side ------------------------------------------------------------------ */

typedef void (*quant_kernel_fn)(quant_params);

/* [dtype f32, f16, bf16][rotation: none, d = 1, 2, 4, ..., 256] */
#define QK_ROW(DT)                                                                                                    \
    {quant_kernel<DT, 0>,  quant_kernel<DT, 1>,  quant_kernel<DT, 2>,  quant_kernel<DT, 4>,   quant_kernel<DT, 8>,   \
     quant_kernel<DT, 16>, quant_kernel<DT, 32>, quant_kernel<DT, 64>, quant_kernel<DT, 128>, quant_kernel<DT, 256>}
static const quant_kernel_fn quant_kernels[3][10] = {
    QK_ROW(FATTN_DTYPE_F32), QK_ROW(FATTN_DTYPE_F16), QK_ROW(FATTN_DTYPE_BF16)};

static int log2_pow2(int n) {
    int l = 0;
    while ((1 << l) < n) ++l;
    return l;
}

/* The widest power-of-two access (<= cap bytes) that the base address and
 * every stride (in bytes) of a dimension longer than 1 allow. */
static int access_width(const void *base, const int64_t *stride_bytes, const int64_t *extent, int n, int cap) {
    uint64_t bits = (uint64_t)(uintptr_t)base | (uint64_t)cap;
    for (int i = 0; i < n; ++i)
        if (extent[i] > 1) bits |= (uint64_t)stride_bytes[i];
    return (int)(bits & (~bits + 1)); /* lowest set bit */
}

extern "C" fattn_status fattn_cuda_quantize_check(fattn_ctx *ctx, const fattn_quantize_args *a) {
    const int d = a->head_dim;
    /* its kernels use Hopper's clusters and are built for sm_90a only */
    const fattn_cuda_state *st = (const fattn_cuda_state *)ctx->cuda;
    if (st->engine == FATTN_ENGINE_CUDA_PORTABLE)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "fattn_quantize: the portable CUDA engine (sm_%d) has no FP8 quantiser yet (the CUDA one "
                          "needs Hopper's thread-block clusters); the CPU engine has one",
                          st->sm);
    if (a->rotate) {
        if (d > QUANT_MAX_ROT_DIM || !fattn_is_pow2(d))
            return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                              "fattn_quantize with rotation: head_dim %d is not supported by the CUDA engine "
                              "(a power of two up to %d)",
                              d, QUANT_MAX_ROT_DIM);
    } else if (d % 8 != 0 || d > QUANT_MAX_DIM) {
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "fattn_quantize: head_dim %d is not supported by the CUDA engine (a multiple of 8 up to "
                          "%d; with rotation a power of two up to %d)",
                          d, QUANT_MAX_DIM, QUANT_MAX_ROT_DIM);
    }
    return FATTN_OK;
}

static fattn_status launch_quant(fattn_ctx *ctx, quant_kernel_fn fn, const quant_params &p, int blocks, int threads,
                                 int cluster) {
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = dim3((unsigned)blocks);
    cfg.blockDim = dim3((unsigned)threads);
    cfg.stream = (cudaStream_t)ctx->stream;
    cudaLaunchAttribute attr[1];
    if (cluster > 1) {
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = (unsigned)cluster;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
    cudaError_t e = cudaLaunchKernelEx(&cfg, fn, p);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fattn_fail(ctx, FATTN_ERROR_CUDA, "fattn_quantize: kernel launch (%d CTAs of %d threads, cluster %d): %s",
                          blocks, threads, cluster, cudaGetErrorString(e));
    }
    return FATTN_OK;
}

/* api.c has checked the arguments (fattn_quantize) and resolved the strides;
 * this checks the engine's limits and where the pointers live, then
 * enqueues the kernels on ctx->stream. */
extern "C" fattn_status fattn_cuda_quantize(fattn_ctx *ctx, const fattn_quantize_args *a) {
    fattn_status st = fattn_cuda_quantize_check(ctx, a);
    if (st != FATTN_OK) return st;
    if ((st = cuda_check_device_ptr(ctx, a->in.data, "in.data")) != FATTN_OK) return st;
    if ((st = cuda_check_device_ptr(ctx, a->out.data, "out.data")) != FATTN_OK) return st;
    if ((st = cuda_check_device_ptr(ctx, a->out.scale, "out.scale")) != FATTN_OK) return st;

    const int d = a->head_dim, rot = a->rotate ? d : 0;
    const int E = quant_chunk(rot), K = quant_items(a->in.dtype, rot);
    const int esz = (int)fattn_dtype_size(a->in.dtype);
    const int dt = a->in.dtype == FATTN_DTYPE_F32 ? 0 : a->in.dtype == FATTN_DTYPE_F16 ? 1 : 2;

    quant_params p;
    memset(&p, 0, sizeof p);
    p.in = (const char *)a->in.data;
    p.out = (uint8_t *)a->out.data;
    p.scale = a->out.scale;
    p.in_sb = a->in.stride_batch * esz;
    p.in_ss = a->in.stride_seq * esz;
    p.in_sh = a->in.stride_head * esz;
    p.out_sb = a->out.stride_batch;
    p.out_ss = a->out.stride_seq;
    p.out_sh = a->out.stride_head;
    p.heads = a->heads;
    p.seqlen = a->seqlen;
    p.C = (rot ? rot : d) / E;
    p.Y = QUANT_THREADS / p.C;
    p.R = K * p.Y;
    p.br = a->block_rows;
    p.nb = (int32_t)(((int64_t)a->seqlen + a->block_rows - 1) / a->block_rows);
    p.br_magic = p.br >= 2 ? (uint32_t)((((uint64_t)1 << 32) + (uint64_t)p.br - 1) / (uint64_t)p.br) : 0;
    p.tensor = a->granularity == FATTN_QUANT_TENSOR;
    p.nscale = (int32_t)((int64_t)a->batch * a->heads * p.nb);
    p.lane_reduce = fattn_is_pow2(p.C) && p.C <= 32;
    p.head_fast = a->heads > 1 && a->in.stride_head < a->in.stride_seq;
    {
        const int64_t ext[3] = {a->batch, a->seqlen, a->heads};
        const int64_t sin[3] = {p.in_sb, p.in_ss, p.in_sh}, sout[3] = {p.out_sb, p.out_ss, p.out_sh};
        p.w_in = access_width(a->in.data, sin, ext, 3, E * esz < 16 ? E * esz : 16);
        p.w_out = access_width(a->out.data, sout, ext, 3, E < 16 ? E : 16);
    }
    if (rot) {
        float signs[QUANT_MAX_ROT_DIM];
        fattn_rotation_signs(a->seed, d, signs);
        for (int i = 0; i < d; ++i)
            if (signs[i] < 0.0f) p.sign[i >> 5] |= 1u << (i & 31);
        p.norm = (float)(1.0 / sqrt((double)d));
    }
    int threads = p.C * p.Y;
    const int64_t pairs = (int64_t)a->batch * a->heads;
    const int ki = rot ? 1 + log2_pow2(rot) : 0;
    const quant_kernel_fn fn = quant_kernels[dt][ki];

    int prev;
    if ((st = cuda_ctx_enter(ctx, &prev)) != FATTN_OK) return st;
    cudaStream_t stream = (cudaStream_t)ctx->stream;
    if (!p.tensor && p.br <= QUANT_MAX_CLUSTER * p.R) {
        /* on chip: whole blocks per CTA, or one block per cluster */
        p.mode = QUANT_ONCHIP;
        p.CL = 1;
        while (p.CL * p.R < p.br) p.CL *= 2;
        p.G = p.CL > 1 ? 1 : (p.R / p.br < p.nb ? p.R / p.br : p.nb);
        p.groups = (p.nb + p.G - 1) / p.G;
        st = launch_quant(ctx, fn, p, (int)(pairs * p.groups * p.CL), threads, p.CL);
    } else {
        /* two passes: the reduction lands in scale[], zeroed first (only
         * entry 0 for the tensor: the second pass writes the others) */
        p.tiles = (p.seqlen + p.R - 1) / p.R;
        const int blocks = (int)(pairs * p.tiles);
        const cudaError_t e = cudaMemsetAsync(p.scale, 0, (p.tensor ? 1 : (size_t)p.nscale) * sizeof(float), stream);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            st = fattn_fail(ctx, FATTN_ERROR_CUDA, "fattn_quantize: cudaMemsetAsync: %s", cudaGetErrorString(e));
        } else {
            p.mode = QUANT_AMAX;
            st = launch_quant(ctx, fn, p, blocks, threads, 1);
            if (st == FATTN_OK) {
                p.mode = QUANT_FROM_SCALE;
                st = launch_quant(ctx, fn, p, blocks, threads, 1);
            }
        }
    }
    cuda_device_leave(prev);
    return st;
}
