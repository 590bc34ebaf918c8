/* merge.cu - fattn_merge on a CUDA context: per row (b, s, h) of the output,
 *   M = max_i lse_i,  w_i = exp(lse_i - M),
 *   o = sum_i w_i O_i / sum_i w_i,  lse = M + log(sum_i w_i),
 * over the parts whose lse_i is not -inf (include/fattn.h; the CPU engine is
 * src/cpu/merge.c).
 *
 * Precision: the policy of common/lse_combine.cuh, form (a), which the
 * decoding kernel's split combine shares.  The weights and their sum are
 * computed in double (exp, log and one division per row and part: cheap
 * next to the row's O), each w_i rounded once to f32; O is accumulated in
 * f32 by fma, parts in index order, multiplied by the f32 rounding of
 * 1 / sum and rounded once to o's dtype.  Against the CPU engine (double
 * throughout, one rounding to f32): an element of o differs by at most
 * about (P + 4) u max_i |O_i| over its row (u = 2^-24, P parts: one
 * rounding per fma, each bounded by the running sum, which never exceeds
 * sum_i w_i |O_i|), typically ~u sqrt(P) relative, plus one ulp of a 16-bit
 * output; lse by an ulp or two.
 * tests/gpu/test_merge.cu derives the bounds it checks.
 *
 * Work layout.  A thread holds a chunk of 8 consecutive elements of a row,
 * `lanes` = min(32, next power of two >= ceil(head_dim / 8)) lanes of one
 * warp a row (rows wider than 256 elements: each lane takes chunks lane,
 * lane + 32, ...), 256-thread CTAs, each on consecutive tokens of one head,
 * the CTAs next to it on the other heads of those tokens.  A row's lanes
 * first reduce max lse over the parts (each lane a strided subset, then
 * shuffles); then, for each tile of `lanes` parts, lane k computes the
 * weight of part t0 + k (one exp), a ballot says which parts take part, the
 * weights go round by shuffles, and U parts at a time have their chunks
 * loaded (all U loads in flight before the first fmaf), so O is read once,
 * by 16-byte loads where a part's address and strides allow (8, 4 or 2
 * bytes otherwise; element by element for the last chunk when head_dim is
 * not a multiple of 8).  A part with lse -inf on a row is not read.
 *
 * Parameters.  Parts travel in the kernel's parameters (CUDA 12.1+ allows
 * 32764 bytes on Hopper; nvcc 13 accepts them for sm_90a): per part its O
 * pointer, its LSE pointer and a one-byte index into a table of layouts
 * (dtype, access width, strides in bytes) that the launch's parts share.
 * Two instances by capacity: MERGE_SMALL parts with a slot each (~1.7 KB of
 * parameters), and FATTN_MERGE_MAX_PARTS parts sharing MERGE_MAX_LAYOUTS
 * slots (~26 KB); and two by the widest part element (16-bit only, or some
 * f32).  One launch serves a call whose parts use at most MERGE_MAX_LAYOUTS
 * distinct layouts (all the usual cases: parts of one shape usually share
 * one): no allocation, no host synchronisation, so the call can be captured
 * in a CUDA graph.  A call whose parts need more slots runs as several
 * launches over consecutive parts, each but the last leaving the running
 * state (the f32 sum of w_i O_i, its max, the double sum of the weights) in
 * a workspace the context owns (cuda_merge_workspace: made on first need,
 * never during a graph capture, where it answers UNSUPPORTED when too
 * small), which the next launch rescales by exp(M_old - M_new) and
 * continues.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../common/lse_combine.cuh"
#include "../cuda_engine.h"

#define MERGE_THREADS 256
#define MERGE_CHUNK 8   /* elements per thread chunk */
#define MERGE_SMALL 32
#define MERGE_MAX_LAYOUTS 256 /* a part's slot is one byte */

/* A layout the parts of a launch share: dtype, widest access (bytes: 16, 8,
 * 4, or the element size) and strides in bytes (0 for a dimension of extent
 * 1, so that parts differing there only share it). */
struct merge_layout {
    int64_t sb, ss, sh;
    int32_t dtype; /* fattn_dtype: F32, F16, BF16 */
    int32_t width;
};

/* N parts at most, NL layouts */
template <int N, int NL = (N < MERGE_MAX_LAYOUTS ? N : MERGE_MAX_LAYOUTS)>
struct merge_params {
    /* the output (final launch) */
    char *o;
    int64_t o_sb, o_ss, o_sh; /* bytes */
    int32_t o_dtype, o_width;
    float *lse;               /* may be NULL */
    /* the running state between launches (NULL for a single launch):
     * acc [rows][dpad] f32, m [rows] f32, l [rows] double */
    float *ws_acc;
    float *ws_m;
    double *ws_l;
    int32_t state_in;  /* this launch continues the state in the workspace */
    int32_t final_out; /* this launch writes o and lse (else the state) */
    int32_t seqlen, heads, head_dim, dpad;
    int32_t chunks;     /* ceil(head_dim / 8) */
    int32_t lanes_log2; /* lanes per row: 1 << lanes_log2 <= 32 */
    int32_t rows;       /* batch * heads * seqlen (< 2^31: api.c) */
    int32_t tile_s;     /* tokens of a row tile: min(seqlen, rows a CTA holds) */
    int32_t nparts;
    merge_layout layout[NL];
    const char *po[N];
    const float *plse[N];
    uint8_t play[N];
};

/* The largest instance fits the 32764 bytes of kernel parameters that CUDA
 * 12.1+ allows on Hopper (nvcc 13 accepts it for sm_90a); the small one the
 * classic 4 KB, so that a merge of a few parts copies little at launch. */
static_assert(sizeof(merge_params<FATTN_MERGE_MAX_PARTS>) <= 32764, "merge parameters exceed the 32764-byte limit");
static_assert(sizeof(merge_params<MERGE_SMALL>) <= 4096, "small merge parameters exceed 4 KB");

/* ---- loads and stores ------------------------------------------------------- */

__device__ __forceinline__ uint4 merge_ld16(const char *p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

/* The chunk at p (ne elements of esz bytes, ne <= 8) into raw words: element
 * e of a 16-bit chunk is half (e & 1) of raw[e / 2], of an f32 chunk raw[e].
 * Full chunks by accesses of `width` bytes, a partial one element by element.
 * PW: the widest element of the instance (2: 16-bit parts only). */
template <int PW>
__device__ __forceinline__ void merge_load_chunk(uint32_t (&raw)[2 * PW], const char *p, int esz, int width, int ne) {
#pragma unroll
    for (int k = 0; k < 2 * PW; ++k) raw[k] = 0;
    if (ne == MERGE_CHUNK) {
        const int nbytes = MERGE_CHUNK * esz; /* 16 or 32 */
        if (width == 16) {
#pragma unroll
            for (int k = 0; k < PW / 2; ++k)
                if (k * 16 < nbytes) {
                    const uint4 v = merge_ld16(p + 16 * k);
                    raw[4 * k] = v.x, raw[4 * k + 1] = v.y, raw[4 * k + 2] = v.z, raw[4 * k + 3] = v.w;
                }
        } else if (width == 8) {
#pragma unroll
            for (int k = 0; k < PW; ++k)
                if (k * 8 < nbytes) {
                    const uint2 v = __ldg((const uint2 *)(p + 8 * k));
                    raw[2 * k] = v.x, raw[2 * k + 1] = v.y;
                }
        } else if (width == 4) {
#pragma unroll
            for (int k = 0; k < 2 * PW; ++k)
                if (k * 4 < nbytes) raw[k] = __ldg((const unsigned *)(p + 4 * k));
        } else { /* 2: 16-bit elements only */
#pragma unroll
            for (int k = 0; k < MERGE_CHUNK; ++k)
                raw[k >> 1] |= (uint32_t)__ldg((const unsigned short *)(p + 2 * k)) << (16 * (k & 1));
        }
        return;
    }
    if constexpr (PW == 4) {
        if (esz == 4) {
#pragma unroll
            for (int e = 0; e < MERGE_CHUNK; ++e)
                if (e < ne) raw[e] = __ldg((const unsigned *)(p + 4 * e));
            return;
        }
    }
    {
#pragma unroll
        for (int e = 0; e < MERGE_CHUNK; ++e)
            if (e < ne) raw[e >> 1] |= (uint32_t)__ldg((const unsigned short *)(p + 2 * e)) << (16 * (e & 1));
    }
}

/* acc[e] += w * x[e], x the chunk in raw (dtype dt; uniform over the warp). */
template <int PW>
__device__ __forceinline__ void merge_accumulate(float (&acc)[MERGE_CHUNK], float w, const uint32_t (&raw)[2 * PW],
                                                 int dt) {
    if constexpr (PW == 4) {
        if (dt == FATTN_DTYPE_F32) {
#pragma unroll
            for (int e = 0; e < MERGE_CHUNK; ++e) acc[e] = lse_accumulate(acc[e], w, __uint_as_float(raw[e]));
            return;
        }
    }
    if (dt == FATTN_DTYPE_BF16) {
#pragma unroll
        for (int e = 0; e < MERGE_CHUNK; ++e) {
            const uint32_t word = raw[e >> 1];
            const float x = __uint_as_float((e & 1) ? (word & 0xFFFF0000u) : (word << 16));
            acc[e] = lse_accumulate(acc[e], w, x);
        }
    } else {
#pragma unroll
        for (int e = 0; e < MERGE_CHUNK; ++e) {
            const uint32_t word = raw[e >> 1];
            const float x = __half2float(__ushort_as_half((unsigned short)((e & 1) ? word >> 16 : word & 0xFFFFu)));
            acc[e] = lse_accumulate(acc[e], w, x);
        }
    }
}

/* The chunk of v (ne elements) to p in dtype dt, by stores of `width` bytes
 * (a partial chunk element by element). */
__device__ __forceinline__ void merge_store_chunk(char *p, const float (&v)[MERGE_CHUNK], int dt, int width, int ne) {
    uint32_t w[MERGE_CHUNK];
    int esz = 2;
    if (dt == FATTN_DTYPE_F32) {
        esz = 4;
#pragma unroll
        for (int e = 0; e < MERGE_CHUNK; ++e) w[e] = __float_as_uint(v[e]);
    } else if (dt == FATTN_DTYPE_BF16) {
#pragma unroll
        for (int e = 0; e < MERGE_CHUNK / 2; ++e)
            w[e] = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v[2 * e])) |
                   (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(v[2 * e + 1])) << 16;
    } else {
#pragma unroll
        for (int e = 0; e < MERGE_CHUNK / 2; ++e)
            w[e] = (uint32_t)__half_as_ushort(__float2half_rn(v[2 * e])) |
                   (uint32_t)__half_as_ushort(__float2half_rn(v[2 * e + 1])) << 16;
    }
    if (ne == MERGE_CHUNK) {
        const int nwords = esz * 2; /* 8 or 4 */
        if (width == 16) {
            *(uint4 *)p = make_uint4(w[0], w[1], w[2], w[3]);
            if (nwords == 8) *(uint4 *)(p + 16) = make_uint4(w[4], w[5], w[6], w[7]);
        } else if (width == 8) {
#pragma unroll
            for (int k = 0; k < 4; ++k)
                if (2 * k < nwords) *(uint2 *)(p + 8 * k) = make_uint2(w[2 * k], w[2 * k + 1]);
        } else if (width == 4) {
#pragma unroll
            for (int k = 0; k < 8; ++k)
                if (k < nwords) *(uint32_t *)(p + 4 * k) = w[k];
        } else {
#pragma unroll
            for (int k = 0; k < MERGE_CHUNK; ++k) *(unsigned short *)(p + 2 * k) = (unsigned short)(w[k >> 1] >> (16 * (k & 1)));
        }
    } else if (esz == 4) {
#pragma unroll
        for (int e = 0; e < MERGE_CHUNK; ++e)
            if (e < ne) *(uint32_t *)(p + 4 * e) = w[e];
    } else {
#pragma unroll
        for (int e = 0; e < MERGE_CHUNK; ++e)
            if (e < ne) *(unsigned short *)(p + 2 * e) = (unsigned short)(w[e >> 1] >> (16 * (e & 1)));
    }
}

/* ---- the kernel --------------------------------------------------------------- */

#define MERGE_FULL 0xFFFFFFFFu

template <int N, int PW>
__global__ void __launch_bounds__(MERGE_THREADS, 3) merge_kernel(const __grid_constant__ merge_params<N> p) {
    constexpr int U = PW == 2 ? 4 : 2; /* parts whose loads are in flight together: 64 bytes a thread */
    const int lanes_log2 = p.lanes_log2, lanes = 1 << lanes_log2;
    const int lane = (int)(threadIdx.x & 31);
    const int lr = lane & (lanes - 1);  /* lane within the row */
    const int gbase = lane & ~(lanes - 1);
    const int64_t r64 = ((int64_t)blockIdx.x * (MERGE_THREADS / 32) + (threadIdx.x >> 5)) * (32 >> lanes_log2) +
                        (lane >> lanes_log2);
    const bool valid = r64 < p.rows;
    /* Row r of the grid: batch-major, then tiles of tile_s tokens, heads,
     * tokens within the tile (a last, shorter tile likewise), so that a CTA
     * takes tile_s consecutive tokens of one head (its LSE reads coalesce)
     * and the CTAs next to it the other heads of those tokens (with heads
     * interleaved in memory, as BSHD, CTAs running together read whole
     * stretches of memory). */
    int b, h, s;
    {
        const int r = valid ? (int)r64 : 0, hs = p.heads * p.seqlen, ts = p.tile_s;
        b = r / hs;
        const int rem = r - b * hs, full = p.seqlen / ts * ts; /* tokens in whole tiles */
        if (rem < full * p.heads) {
            const int tile = rem / (ts * p.heads), x = rem - tile * ts * p.heads;
            h = x / ts;
            s = tile * ts + (x - h * ts);
        } else {
            const int lt = p.seqlen - full, x = rem - full * p.heads;
            h = x / lt;
            s = full + (x - h * lt);
        }
    }
    const int q = (b * p.heads + h) * p.seqlen + s; /* LSE index */
    const int n = p.nparts;

    /* max lse over the parts that take part (fmaxf: a NaN never wins) */
    float m = -INFINITY;
    int any = 0;
    if (valid)
        for (int i = lr; i < n; i += lanes) {
            const float l = __ldg(p.plse[i] + q);
            if (lse_part_live(l)) any = 1, m = lse_running_max(m, l);
        }
    for (int off = lanes >> 1; off > 0; off >>= 1) {
        m = lse_running_max(m, __shfl_xor_sync(MERGE_FULL, m, off));
        any |= __shfl_xor_sync(MERGE_FULL, any, off);
    }
    /* the running state of earlier launches: a part of weight l_in exp(m_in - M) */
    float m_in = -INFINITY;
    double l_in = 0.0;
    bool st_live = false;
    if (p.state_in && valid) {
        m_in = p.ws_m[q];
        l_in = p.ws_l[q];
        st_live = !(l_in == 0.0); /* NaN: live */
    }
    if (st_live) any = 1, m = lse_running_max(m, m_in);
    const double M = (double)m;
    const double st_scale = st_live ? lse_part_weight(m_in, M) : 0.0;

    double lsum = 0.0, L = 0.0;
    const int64_t o_row = (int64_t)b * p.o_sb + (int64_t)s * p.o_ss + (int64_t)h * p.o_sh;
    const int passes = (p.chunks + lanes - 1) >> lanes_log2;
    for (int cp = 0; cp < passes; ++cp) {
        const int c = lr + (cp << lanes_log2);
        const bool has_chunk = valid && c < p.chunks;
        const int e0 = c * MERGE_CHUNK;
        const int ne = has_chunk ? min(MERGE_CHUNK, p.head_dim - e0) : 0;
        float acc[MERGE_CHUNK];
#pragma unroll
        for (int e = 0; e < MERGE_CHUNK; ++e) acc[e] = 0.0f;
        if (st_live && has_chunk) {
            const float4 *src = (const float4 *)(p.ws_acc + (int64_t)q * p.dpad + e0);
            const float4 x0 = src[0], x1 = src[1];
            const float sc = (float)st_scale;
            acc[0] = x0.x * sc, acc[1] = x0.y * sc, acc[2] = x0.z * sc, acc[3] = x0.w * sc;
            acc[4] = x1.x * sc, acc[5] = x1.y * sc, acc[6] = x1.z * sc, acc[7] = x1.w * sc;
        }
        for (int t0 = 0; t0 < n; t0 += lanes) {
            /* lane lr: the weight of part t0 + lr */
            const int i = t0 + lr;
            float w = 0.0f;
            int live = 0;
            if (valid && i < n) {
                const float l = __ldg(p.plse[i] + q);
                if (lse_part_live(l)) {
                    live = 1;
                    const double wd = lse_part_weight(l, M);
                    w = (float)wd;
                    if (cp == 0) lsum += wd;
                }
            }
            const uint32_t lm = __ballot_sync(MERGE_FULL, live) >> gbase;
            const int cnt = min(lanes, n - t0);
            for (int j0 = 0; j0 < cnt; j0 += U) {
                float wj[U];
                bool go[U];
                uint32_t raw[U][2 * PW];
                int dts[U];
#pragma unroll
                for (int u = 0; u < U; ++u) wj[u] = __shfl_sync(MERGE_FULL, w, (j0 + u) & (lanes - 1), lanes);
#pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int j = j0 + u;
                    go[u] = has_chunk && j < cnt && ((lm >> j) & 1u);
                    dts[u] = FATTN_DTYPE_BF16;
                    if (j < cnt) {
                        const int k = t0 + j;
                        const merge_layout &ly = p.layout[p.play[k]];
                        dts[u] = ly.dtype;
                        const int esz = PW == 4 && ly.dtype == FATTN_DTYPE_F32 ? 4 : 2;
                        if (go[u]) {
                            const char *ptr = p.po[k] + (int64_t)b * ly.sb + (int64_t)s * ly.ss + (int64_t)h * ly.sh +
                                              (int64_t)e0 * esz;
                            merge_load_chunk<PW>(raw[u], ptr, esz, ly.width, ne);
                        }
                    }
                }
#pragma unroll
                for (int u = 0; u < U; ++u)
                    if (go[u]) merge_accumulate<PW>(acc, wj[u], raw[u], dts[u]);
            }
        }
        if (cp == 0) {
            for (int off = lanes >> 1; off > 0; off >>= 1) lsum += __shfl_xor_sync(MERGE_FULL, lsum, off);
            L = lsum + (st_live ? l_in * st_scale : 0.0);
        }
        if (p.final_out) {
            float v[MERGE_CHUNK];
            const float inv = lse_out_scale(any, L);
#pragma unroll
            for (int e = 0; e < MERGE_CHUNK; ++e) v[e] = lse_out(any, acc[e], inv);
            if (has_chunk) {
                const int esz = p.o_dtype == FATTN_DTYPE_F32 ? 4 : 2;
                merge_store_chunk(p.o + o_row + (int64_t)e0 * esz, v, p.o_dtype, p.o_width, ne);
            }
            if (cp == 0 && lr == 0 && valid && p.lse) p.lse[q] = lse_out_lse(any, M, L);
        } else {
            __syncwarp(); /* every lane of the row has read the state before it is overwritten */
            if (has_chunk) {
                float4 *dst = (float4 *)(p.ws_acc + (int64_t)q * p.dpad + e0);
                dst[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
                dst[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
            }
            if (cp == 0 && lr == 0 && valid) {
                p.ws_m[q] = any ? m : -INFINITY;
                p.ws_l[q] = any ? L : 0.0;
            }
        }
    }
}

/* ---- host side ----------------------------------------------------------------- */

extern "C" fattn_status fattn_cuda_merge_check(fattn_ctx *ctx, const fattn_merge_args *a) {
    /* Every merge api.c accepts is served: any head_dim, part and output
     * dtypes f32/f16/bf16, any strides and element-aligned pointers. */
    (void)ctx;
    (void)a;
    return FATTN_OK;
}

/* The widest access (16, 8, 4 or 2 bytes) the base address and the strides
 * (bytes) of the dimensions of extent > 1 allow. */
static int32_t merge_width(const void *base, int64_t sb, int64_t ss, int64_t sh) {
    const uint64_t bits = (uint64_t)(uintptr_t)base | (uint64_t)sb | (uint64_t)ss | (uint64_t)sh | 16u;
    return (int32_t)(bits & (~bits + 1));
}

/* The layout of tensor t (strides in elements) for the kernel. */
static merge_layout merge_layout_of(const fattn_merge_args *a, const fattn_tensor *t) {
    const int64_t esz = (int64_t)fattn_dtype_size(t->dtype);
    merge_layout ly;
    memset(&ly, 0, sizeof ly);
    ly.sb = a->batch > 1 ? t->stride_batch * esz : 0;
    ly.ss = a->seqlen > 1 ? t->stride_seq * esz : 0;
    ly.sh = a->heads > 1 ? t->stride_head * esz : 0;
    ly.dtype = (int32_t)t->dtype;
    ly.width = merge_width(t->data, ly.sb, ly.ss, ly.sh);
    return ly;
}

static bool merge_layout_eq(const merge_layout &x, const merge_layout &y) {
    return x.sb == y.sb && x.ss == y.ss && x.sh == y.sh && x.dtype == y.dtype && x.width == y.width;
}

/* The slot of ly in tab (nt entries), added when there is room; -1 when the
 * table is full and lacks it. */
static int merge_slot(merge_layout *tab, int *nt, int cap, const merge_layout &ly) {
    for (int i = *nt - 1; i >= 0; --i) /* latest first: parts in a row tend to share one */
        if (merge_layout_eq(tab[i], ly)) return i;
    if (*nt == cap) return -1;
    tab[*nt] = ly;
    return (*nt)++;
}

/* What a launch shares with the others of its call. */
struct merge_shape {
    int32_t lanes_log2, chunks, dpad, rows;
    float *ws_acc, *ws_m;
    double *ws_l;
};

/* One launch over parts [first, first + count) of a (count <= N). */
template <int N, int PW>
static fattn_status merge_launch(fattn_ctx *ctx, const fattn_merge_args *a, const merge_shape &sh, int first,
                                 int count, int state_in, int final_out) {
    /* on the heap: the large instance is ~26 KB */
    merge_params<N> *pp = (merge_params<N> *)calloc(1, sizeof(merge_params<N>));
    if (!pp) return fattn_fail(ctx, FATTN_ERROR_OUT_OF_MEMORY, "fattn_merge: out of host memory");
    merge_params<N> &p = *pp;
    const int64_t rows_per_cta = (int64_t)(MERGE_THREADS / 32) * (32 >> sh.lanes_log2);
    const merge_layout lo = merge_layout_of(a, &a->o);
    p.o = (char *)a->o.data;
    p.o_sb = lo.sb, p.o_ss = lo.ss, p.o_sh = lo.sh;
    p.o_dtype = lo.dtype, p.o_width = lo.width;
    p.lse = a->lse;
    p.ws_acc = sh.ws_acc, p.ws_m = sh.ws_m, p.ws_l = sh.ws_l;
    p.state_in = state_in, p.final_out = final_out;
    p.seqlen = a->seqlen, p.heads = a->heads, p.head_dim = a->head_dim, p.dpad = sh.dpad;
    p.chunks = sh.chunks, p.lanes_log2 = sh.lanes_log2, p.rows = sh.rows;
    p.tile_s = (int32_t)(a->seqlen < rows_per_cta ? a->seqlen : rows_per_cta);
    p.nparts = count;
    int nt = 0;
    for (int i = 0; i < count; ++i) {
        const fattn_merge_part *pt = &a->parts[first + i];
        const int slot = merge_slot(p.layout, &nt, (int)(sizeof p.layout / sizeof p.layout[0]), merge_layout_of(a, &pt->o));
        if (slot < 0) {
            free(pp);
            return fattn_fail(ctx, FATTN_ERROR_INTERNAL, "fattn_merge: launch plan exceeds the layout table");
        }
        p.po[i] = (const char *)pt->o.data;
        p.plse[i] = pt->lse;
        p.play[i] = (uint8_t)slot;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(((int64_t)sh.rows + rows_per_cta - 1) / rows_per_cta));
    cfg.blockDim = dim3(MERGE_THREADS);
    cfg.stream = (cudaStream_t)ctx->stream;
    const cudaError_t e = cudaLaunchKernelEx(&cfg, merge_kernel<N, PW>, p); /* copies p */
    free(pp);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fattn_fail(ctx, FATTN_ERROR_CUDA, "fattn_merge: kernel launch (%u CTAs, %d parts, %zu bytes of parameters): %s",
                          cfg.gridDim.x, count, sizeof(merge_params<N>), cudaGetErrorString(e));
    }
    return FATTN_OK;
}

static fattn_status merge_launch_any(fattn_ctx *ctx, const fattn_merge_args *a, const merge_shape &sh, int first,
                                     int count, int state_in, int final_out) {
    bool f32 = false;
    for (int i = 0; i < count; ++i) f32 = f32 || a->parts[first + i].o.dtype == FATTN_DTYPE_F32;
    if (count <= MERGE_SMALL)
        return f32 ? merge_launch<MERGE_SMALL, 4>(ctx, a, sh, first, count, state_in, final_out)
                   : merge_launch<MERGE_SMALL, 2>(ctx, a, sh, first, count, state_in, final_out);
    return f32 ? merge_launch<FATTN_MERGE_MAX_PARTS, 4>(ctx, a, sh, first, count, state_in, final_out)
               : merge_launch<FATTN_MERGE_MAX_PARTS, 2>(ctx, a, sh, first, count, state_in, final_out);
}

/* api.c has checked the arguments (fattn_merge) and resolved the parts'
 * strides in its private copy; this checks where the pointers live, plans the
 * launches and enqueues them on ctx->stream. */
extern "C" fattn_status fattn_cuda_merge(fattn_ctx *ctx, const fattn_merge_args *a) {
    fattn_status st = fattn_cuda_merge_check(ctx, a);
    if (st != FATTN_OK) return st;
    if ((st = cuda_check_device_ptr(ctx, a->o.data, "o.data")) != FATTN_OK) return st;
    if (a->lse && (st = cuda_check_device_ptr(ctx, a->lse, "lse")) != FATTN_OK) return st;
    char name[32];
    for (int i = 0; i < a->num_parts; ++i) {
        snprintf(name, sizeof name, "parts[%d].o.data", i);
        if ((st = cuda_check_device_ptr(ctx, a->parts[i].o.data, name)) != FATTN_OK) return st;
        snprintf(name, sizeof name, "parts[%d].lse", i);
        if ((st = cuda_check_device_ptr(ctx, a->parts[i].lse, name)) != FATTN_OK) return st;
    }

    /* launches: consecutive parts, as many as a layout table holds (a launch
     * of up to MERGE_SMALL parts has a slot for each) */
    int starts[FATTN_MERGE_MAX_PARTS + 1], nlaunch = 0;
    {
        merge_layout tab[MERGE_MAX_LAYOUTS];
        int nt = 0;
        for (int i = 0; i < a->num_parts; ++i) {
            const merge_layout ly = merge_layout_of(a, &a->parts[i].o);
            if (i == 0 || merge_slot(tab, &nt, MERGE_MAX_LAYOUTS, ly) < 0) {
                starts[nlaunch++] = i;
                nt = 0;
                (void)merge_slot(tab, &nt, MERGE_MAX_LAYOUTS, ly);
            }
        }
        starts[nlaunch] = a->num_parts;
    }

    merge_shape sh;
    memset(&sh, 0, sizeof sh);
    sh.chunks = (a->head_dim + MERGE_CHUNK - 1) / MERGE_CHUNK;
    sh.dpad = sh.chunks * MERGE_CHUNK;
    sh.lanes_log2 = 0;
    while ((1 << sh.lanes_log2) < sh.chunks && sh.lanes_log2 < 5) ++sh.lanes_log2;
    sh.rows = (int32_t)((int64_t)a->batch * a->heads * a->seqlen);

    int prev;
    if ((st = cuda_ctx_enter(ctx, &prev)) != FATTN_OK) return st;
    if (nlaunch > 1) {
        const size_t rows = (size_t)sh.rows;
        const size_t acc_bytes = (rows * (size_t)sh.dpad * 4 + 255) / 256 * 256;
        const size_t m_bytes = (rows * 4 + 255) / 256 * 256;
        void *ws = NULL;
        st = cuda_merge_workspace(ctx, acc_bytes + m_bytes + rows * 8, &ws);
        if (st == FATTN_OK) {
            sh.ws_acc = (float *)ws;
            sh.ws_m = (float *)((char *)ws + acc_bytes);
            sh.ws_l = (double *)((char *)ws + acc_bytes + m_bytes);
        }
    }
    for (int l = 0; l < nlaunch && st == FATTN_OK; ++l)
        st = merge_launch_any(ctx, a, sh, starts[l], starts[l + 1] - starts[l], l > 0, l == nlaunch - 1);
    if (st == FATTN_OK && nlaunch > 1) st = cuda_merge_workspace_done(ctx);
    cuda_device_leave(prev);
    return st;
}
