/* test_primitives.cu - each Hopper primitive the forward kernel uses, alone,
 * against a CPU product (HOPPER-PTX.md's "derived"/"unverified" layouts are
 * pinned down here rather than inside the attention kernel):
 *   1. TMA 4-D tiled load with the 128-byte swizzle, including an
 *      out-of-bounds tail (rows past the end read as zero);
 *   2. wgmma SS m64n128k16 (bf16, both operands K-major) over a K = 128 loop
 *      with descriptor advances inside and across the 64-column slabs;
 *   3. the accumulator fragment -> bf16 A fragment identity (HOPPER-PTX §3)
 *      and wgmma RS m64n128k16 with an MN-major B (trans-b), i.e. O = P V;
 *   4. an mbarrier ring (2 stages) under one producer and two consumer warps;
 *   5. wgmma e4m3 (k32) SS and RS (wgmma_e4m3.cuh) at N = 64 and 256 over a
 *      K = 256 loop (two 128-byte slabs), A in registers for RS;
 *   6. the 16-bit SS forms with MN-major A and/or B (wgmma_tnsp.cuh) over a
 *      K = 128 loop, bf16 at two N per form and f16 at one.
 * 5 and 6 write their tiles with the 128-byte swizzle by hand (the layout
 * TMA writes in 1 and 2) and use small integers: every product and partial
 * sum is an integer below 2^13, exact in fp32, so they must match exactly.
 * Exit 77 without a Hopper GPU. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpu/gpu_testutil.h"
#include "cuda/common/ptx.cuh"
#include "cuda/common/wgmma_e4m3.cuh"
#include "cuda/common/wgmma_tnsp.cuh"
#include "common/half.h"


enum { M = 64, N = 128, KD = 128, A_ROWS = 50 /* < M: rows 50..63 are out of bounds */ };

/* A [A_ROWS x KD], B [N x KD] (K-major), V [N keys x KD dims] (row-major =
 * MN-major for the PV product).  Outputs S [M x N] f32 and O [M x KD] f32. */
__global__ void __launch_bounds__(128, 1) k_wgmma(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tb,
                                               const __grid_constant__ CUtensorMap tv, float *S, float *O) {
    extern __shared__ uint8_t raw[];
    uint8_t *sm = (uint8_t *)(((uintptr_t)raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sA = sm, *sB = sA + M * KD * 2, *sV = sB + N * KD * 2;
    __shared__ uint64_t bar;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    if (tid == 0) {
        mbar_init(&bar, 1);
        ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
    }
    __syncthreads();
    if (tid == 0) {
        mbar_expect_tx_arrive(&bar, (M + 2 * N) * KD * 2); /* full boxes, OOB bytes count */
        for (int c = 0; c < KD / 64; ++c) {
            tma_load_4d(sA + c * M * 128, &ta, c * 64, 0, 0, 0, &bar);
            tma_load_4d(sB + c * N * 128, &tb, c * 64, 0, 0, 0, &bar);
            tma_load_4d(sV + c * N * 128, &tv, c * 64, 0, 0, 0, &bar);
        }
    }
    mbar_wait(&bar, 0);
    float s[N / 2], o[KD / 2];
    const uint64_t da = smem_desc_sw128(sA, 16, 1024), db = smem_desc_sw128(sB, 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KD / 16; ++kk)
        wgmma_op<N, true>::ss(s, desc_add(da, (kk / 4) * M * 128 + (kk % 4) * 32),
                              desc_add(db, (kk / 4) * N * 128 + (kk % 4) * 32), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(s);
    const int r0 = 16 * warp + lane / 4, q4 = lane % 4;
    for (int i = 0; i < N / 8; ++i)
        for (int e = 0; e < 4; ++e) S[(r0 + 8 * (e >> 1)) * N + 8 * i + 2 * q4 + (e & 1)] = s[4 * i + e];
    uint32_t p[N / 16][4];
    for (int ks = 0; ks < N / 16; ++ks)
        for (int j = 0; j < 4; ++j) p[ks][j] = pack_bf16x2(s[8 * ks + 2 * j], s[8 * ks + 2 * j + 1]);
    const uint64_t dv = smem_desc_sw128(sV, N * 128, 1024);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < N / 16; ++ks) wgmma_op<KD, true>::rs(o, p[ks], desc_add(dv, ks * 2048), ks > 0);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(o);
    for (int i = 0; i < KD / 8; ++i)
        for (int e = 0; e < 4; ++e) O[(r0 + 8 * (e >> 1)) * KD + 8 * i + 2 * q4 + (e & 1)] = o[4 * i + e];
}

/* Ring of 2 stages: thread 0 produces ITEMS values, warps 1 and 2 consume
 * every item and sum; each stage has a full (count 1) and an empty barrier
 * that every consumer thread arrives on (count 64), so each thread's own
 * shared-memory reads are released by its own arrive.  (An earlier version
 * had one arrive per warp after __syncwarp; correct under the memory model,
 * but compute-sanitizer's racecheck cannot see through it and reported a
 * hazard.) */
enum { ITEMS = 1000, STAGES = 2 };
__global__ void k_ring(unsigned long long *sums) {
    __shared__ uint64_t full[STAGES], empty[STAGES];
    __shared__ int slot[STAGES][32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0)
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 64);
        }
    __syncthreads();
    if (warp == 0) {
        if (lane == 0)
            for (int it = 0; it < ITEMS; ++it) {
                const int s = it % STAGES;
                const uint32_t ph = (it / STAGES) & 1;
                mbar_wait(&empty[s], ph ^ 1);
                for (int j = 0; j < 32; ++j) slot[s][j] = it * 32 + j;
                mbar_arrive(&full[s]); /* release semantics publish the stores */
            }
    } else {
        unsigned long long acc = 0;
        for (int it = 0; it < ITEMS; ++it) {
            const int s = it % STAGES;
            const uint32_t ph = (it / STAGES) & 1;
            mbar_wait(&full[s], ph);
            acc += (unsigned long long)slot[s][lane];
            mbar_arrive(&empty[s]);
        }
        atomicAdd(&sums[warp - 1], acc);
    }
}

/* ---- 5, 6: e4m3 and transposed-operand wgmma on hand-swizzled tiles ------- */
/* Byte offset of (row, byte) in a tile of 128-byte rows with the 128-byte
 * swizzle (TMA's SWIZZLE_128B, tile 1024-byte aligned): 16-byte chunk c of
 * row r is stored at chunk c ^ (r % 8).  Slabs or blocks of a tile that
 * follow each other continue the row count. */
__device__ __forceinline__ uint32_t sw128(uint32_t row, uint32_t byte) {
    return row * 128 + ((((byte >> 4) ^ row) & 7) << 4) + (byte & 15);
}
/* The f32 accumulator of m64nN into row-major D [64][N] (HOPPER-PTX §3). */
template <int NR> __device__ __forceinline__ void store_acc(const float (&d)[NR], float *D) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r0 = 16 * warp + lane / 4, q = lane % 4;
#pragma unroll
    for (int i = 0; i < NR / 4; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) D[(r0 + 8 * (e >> 1)) * (2 * NR) + 8 * i + 2 * q + (e & 1)] = d[4 * i + e];
}

enum { FK = 256 /* K of the e4m3 tests: two 128-byte slabs */, TK = 128 /* K of the transposed tests */ };

/* D = A B^T, A [64][FK] and B [N][FK] e4m3 codes, row-major = both K-major
 * (the only FP8 layout): slab s (k 128 s .. 128 s + 127) of a tile of R rows
 * at s R 128 bytes, a k32 step +32 bytes inside it.  RS reads A's fragment
 * (wgmma_e4m3.cuh) straight from global memory. */
template <int N, bool RS>
__global__ void __launch_bounds__(128, 1) k_e4m3(const uint8_t *A, const uint8_t *B, float *D) {
    extern __shared__ uint8_t raw[];
    uint8_t *sA = (uint8_t *)(((uintptr_t)raw + 1023) & ~(uintptr_t)1023), *sB = sA + 64 * FK;
    const int tid = threadIdx.x;
    for (int i = tid; i < 64 * FK; i += 128) sA[sw128((i % FK) / 128 * 64 + i / FK, i % 128)] = A[i];
    for (int i = tid; i < N * FK; i += 128) sB[sw128((i % FK) / 128 * N + i / FK, i % 128)] = B[i];
    fence_async_shared(); /* generic stores -> wgmma's async-proxy reads */
    __syncthreads();
    const int warp = tid / 32, lane = tid % 32, r0 = 16 * warp + lane / 4, q = lane % 4;
    uint32_t a[FK / 32][4];
    if (RS) {
        const uint32_t *A32 = (const uint32_t *)A;
#pragma unroll
        for (int kk = 0; kk < FK / 32; ++kk) {
            a[kk][0] = A32[(r0 * FK + 32 * kk + 4 * q) / 4];
            a[kk][1] = A32[((r0 + 8) * FK + 32 * kk + 4 * q) / 4];
            a[kk][2] = A32[(r0 * FK + 32 * kk + 16 + 4 * q) / 4];
            a[kk][3] = A32[((r0 + 8) * FK + 32 * kk + 16 + 4 * q) / 4];
        }
    }
    const uint64_t da = smem_desc_sw128(sA, 16, 1024), db = smem_desc_sw128(sB, 16, 1024);
    float d[N / 2];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < FK / 32; ++kk) {
        const uint32_t ob = (kk / 4) * N * 128 + (kk % 4) * 32;
        if constexpr (RS)
            wgmma_e4m3<N>::rs(d, a[kk], desc_add(db, ob), kk > 0);
        else
            wgmma_e4m3<N>::ss(d, desc_add(da, (kk / 4) * 64 * 128 + (kk % 4) * 32), desc_add(db, ob), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(d);
    store_acc(d, D);
}

/* D = A B^T, A [64][TK] and B [N][TK] 16-bit, row-major in global memory,
 * placed in shared memory K-major (T = 0: slab s of 64 k at s R 128 bytes, a
 * k16 step +32 bytes) or MN-major (T = 1: row k holds 64 m or n, block j of
 * 64 n at j TK 128 bytes = the LBO, a k16 step +2048 bytes). */
template <int N, int TA, int TB, bool BF16>
__global__ void __launch_bounds__(128, 1) k_tnsp(const uint16_t *A, const uint16_t *B, float *D) {
    static_assert(!TB || N % 64 == 0, "an MN-major B here is whole 64-column blocks");
    extern __shared__ uint8_t raw[];
    uint8_t *sA = (uint8_t *)(((uintptr_t)raw + 1023) & ~(uintptr_t)1023), *sB = sA + 64 * TK * 2;
    const int tid = threadIdx.x;
    for (int i = tid; i < 64 * TK; i += 128) {
        const int m = i / TK, k = i % TK;
        *(uint16_t *)(sA + (TA ? sw128(k, 2 * m) : sw128(k / 64 * 64 + m, 2 * (k % 64)))) = A[i];
    }
    for (int i = tid; i < N * TK; i += 128) {
        const int n = i / TK, k = i % TK;
        *(uint16_t *)(sB + (TB ? sw128(n / 64 * TK + k, 2 * (n % 64)) : sw128(k / 64 * N + n, 2 * (k % 64)))) = B[i];
    }
    fence_async_shared();
    __syncthreads();
    const uint64_t da = smem_desc_sw128(sA, TA ? TK * 128 : 16, 1024), db = smem_desc_sw128(sB, TB ? TK * 128 : 16, 1024);
    using WG = wgmma_tnsp<N, BF16>;
    float d[N / 2];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < TK / 16; ++kk) {
        const uint64_t a = desc_add(da, TA ? kk * 2048 : (kk / 4) * 64 * 128 + (kk % 4) * 32);
        const uint64_t b = desc_add(db, TB ? kk * 2048 : (kk / 4) * N * 128 + (kk % 4) * 32);
        if constexpr (TA && TB) /* the named forms, and ss_t for the K-major control */
            WG::ss_tab(d, a, b, kk > 0);
        else if constexpr (TA)
            WG::ss_ta(d, a, b, kk > 0);
        else if constexpr (TB)
            WG::ss_tb(d, a, b, kk > 0);
        else
            WG::template ss_t<0, 0>(d, a, b, kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(d);
    store_acc(d, D);
}

static void make_map(CUtensorMap *m, void *ptr, int rows, int box_rows) {
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    cuuint64_t gdim[4] = {KD, (cuuint64_t)rows, 1, 1};
    cuuint64_t gstr[3] = {KD * 2, (cuuint64_t)rows * KD * 2, (cuuint64_t)rows * KD * 2};
    cuuint32_t box[4] = {64, (cuuint32_t)box_rows, 1, 1}, es[4] = {1, 1, 1, 1};
    CUresult r = ((PFN_cuTensorMapEncodeTiled_v12000)fn)(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, ptr, gdim, gstr, box, es,
                                                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                                        CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "cuTensorMapEncodeTiled: %d\n", (int)r);
        exit(1);
    }
}

/* Runs one case of 5 or 6 on device inputs dA, dB (host copies a [64][K],
 * b [>= N][K] as doubles) and compares D = A B^T exactly with the CPU. */
static void check_gemm(void (*kern)(const void *, const void *, float *), const void *dA, const void *dB, float *dD,
                       int smem, const double *a, const double *b, int n, int k, const char *what) {
    CK(cudaFuncSetAttribute((const void *)kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CK(cudaMemset(dD, 0xFF, 64 * n * 4)); /* NaN: an element never written fails */
    void *args[] = {(void *)&dA, (void *)&dB, (void *)&dD};
    CK(cudaLaunchKernel((const void *)kern, dim3(1), dim3(128), args, smem, 0));
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    float *D = (float *)tu_malloc(64 * n * 4);
    CK(cudaMemcpy(D, dD, 64 * n * 4, cudaMemcpyDeviceToHost));
    double maxerr = 0, want = 0;
    int nbad = 0, first = -1;
    for (int i = 0; i < 64; ++i)
        for (int j = 0; j < n; ++j) {
            double acc = 0;
            for (int kk = 0; kk < k; ++kk) acc += a[i * k + kk] * b[j * k + kk];
            double e = fabs((double)D[i * n + j] - acc);
            if (e != e) e = INFINITY; /* NaN: not written */
            if (e > 0 && nbad++ == 0) first = i * n + j, want = acc;
            if (e > maxerr) maxerr = e;
        }
    if (nbad)
        fprintf(stderr, "  %s: %d of %d wrong, first D[%d][%d] = %g, want %g\n", what, nbad, 64 * n, first / n,
                first % n, (double)D[first], want);
    TU_EXPECT_LE(maxerr, 0.0, what);
    free(D);
}
template <typename K> static void (*as_kern(K k))(const void *, const void *, float *) {
    return (void (*)(const void *, const void *, float *))k;
}

/* 5: e4m3 SS and RS against the CPU, values -4..4 (integers, exact in e4m3). */
static void test_e4m3(tu_rng *rng) {
    uint8_t codes[256];
    int nc = 0;
    for (int c = 0; c < 256; ++c) {
        const float v = fattn_e4m3_to_f32((uint8_t)c);
        if (v == v && fabsf(v) <= 4.f && v == floorf(v)) codes[nc++] = (uint8_t)c;
    }
    TU_CHECK(nc == 10 && fattn_e4m3_to_f32(0x38) == 1.f && fattn_e4m3_to_f32(0xC4) == -3.f,
             "e4m3 decoding: %d integer codes in [-4, 4]", nc);
    uint8_t *ha = (uint8_t *)tu_malloc(64 * FK), *hb = (uint8_t *)tu_malloc(256 * FK);
    double *a = (double *)tu_malloc(64 * FK * 8), *b = (double *)tu_malloc(256 * FK * 8);
    for (int i = 0; i < 64 * FK; ++i) a[i] = fattn_e4m3_to_f32(ha[i] = codes[tu_rng_u64(rng) % nc]);
    for (int i = 0; i < 256 * FK; ++i) b[i] = fattn_e4m3_to_f32(hb[i] = codes[tu_rng_u64(rng) % nc]);
    void *dA, *dB;
    float *dD;
    CK(cudaMalloc(&dA, 64 * FK));
    CK(cudaMalloc(&dB, 256 * FK));
    CK(cudaMalloc(&dD, 64 * 256 * 4));
    CK(cudaMemcpy(dA, ha, 64 * FK, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB, hb, 256 * FK, cudaMemcpyHostToDevice));
#define E4M3_CASE(n, rs, what) \
    check_gemm(as_kern(k_e4m3<n, rs>), dA, dB, dD, (64 + n) * FK + 1024, a, b, n, FK, what)
    E4M3_CASE(64, false, "wgmma_e4m3<64>::ss (m64n64k32, K = 256): max abs err");
    E4M3_CASE(256, false, "wgmma_e4m3<256>::ss (m64n256k32, K = 256): max abs err");
    E4M3_CASE(64, true, "wgmma_e4m3<64>::rs (A fragment in registers): max abs err");
    E4M3_CASE(256, true, "wgmma_e4m3<256>::rs (A fragment in registers): max abs err");
#undef E4M3_CASE
    CK(cudaFree(dA));
    CK(cudaFree(dB));
    CK(cudaFree(dD));
    free(ha), free(hb), free(a), free(b);
}

/* 6: 16-bit SS with MN-major operands against the CPU, integers -4..4. */
static void test_tnsp(tu_rng *rng, bool bf16) {
    uint16_t *ha = (uint16_t *)tu_malloc(64 * TK * 2), *hb = (uint16_t *)tu_malloc(256 * TK * 2);
    double *a = (double *)tu_malloc(64 * TK * 8), *b = (double *)tu_malloc(256 * TK * 8);
    for (int i = 0; i < 64 * TK + 256 * TK; ++i) {
        const float v = (float)((int)(tu_rng_u64(rng) % 9) - 4);
        const uint16_t h = bf16 ? fattn_f32_to_bf16(v) : fattn_f32_to_f16(v);
        if (i < 64 * TK)
            ha[i] = h, a[i] = v;
        else
            hb[i - 64 * TK] = h, b[i - 64 * TK] = v;
    }
    void *dA, *dB;
    float *dD;
    CK(cudaMalloc(&dA, 64 * TK * 2));
    CK(cudaMalloc(&dB, 256 * TK * 2));
    CK(cudaMalloc(&dD, 64 * 256 * 4));
    CK(cudaMemcpy(dA, ha, 64 * TK * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dB, hb, 256 * TK * 2, cudaMemcpyHostToDevice));
#define TNSP_CASE(n, ta, tb, bf, what) \
    check_gemm(as_kern(k_tnsp<n, ta, tb, bf>), dA, dB, dD, (64 + n) * TK * 2 + 1024, a, b, n, TK, what)
    if (bf16) {
        TNSP_CASE(128, 0, 0, true, "wgmma_tnsp<128, bf16>::ss_t<0, 0> (both K-major: the hand swizzle): max abs err");
        TNSP_CASE(64, 1, 0, true, "wgmma_tnsp<64, bf16>::ss_ta (A MN-major): max abs err");
        TNSP_CASE(256, 1, 0, true, "wgmma_tnsp<256, bf16>::ss_ta (A MN-major): max abs err");
        TNSP_CASE(64, 0, 1, true, "wgmma_tnsp<64, bf16>::ss_tb (B MN-major): max abs err");
        TNSP_CASE(192, 0, 1, true, "wgmma_tnsp<192, bf16>::ss_tb (B MN-major, 3 blocks): max abs err");
        TNSP_CASE(128, 1, 1, true, "wgmma_tnsp<128, bf16>::ss_tab (both MN-major): max abs err");
        TNSP_CASE(256, 1, 1, true, "wgmma_tnsp<256, bf16>::ss_tab (both MN-major, 4 blocks): max abs err");
    } else {
        TNSP_CASE(96, 1, 0, false, "wgmma_tnsp<96, f16>::ss_ta (A MN-major): max abs err");
        TNSP_CASE(128, 0, 1, false, "wgmma_tnsp<128, f16>::ss_tb (B MN-major): max abs err");
        TNSP_CASE(64, 1, 1, false, "wgmma_tnsp<64, f16>::ss_tab (both MN-major): max abs err");
    }
#undef TNSP_CASE
    CK(cudaFree(dA));
    CK(cudaFree(dB));
    CK(cudaFree(dD));
    free(ha), free(hb), free(a), free(b);
}

int main(void) {
    int n = 0;
    cudaDeviceProp prop;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0 || cudaGetDeviceProperties(&prop, 0) != cudaSuccess ||
        prop.major != 9) {
        gpu_skip("no Hopper GPU");
    }
    tu_rng rng;
    tu_rng_init(&rng, (uint64_t)tu_seed());
    uint16_t *ha = (uint16_t *)tu_malloc(A_ROWS * KD * 2), *hb = (uint16_t *)tu_malloc(N * KD * 2),
             *hv = (uint16_t *)tu_malloc(N * KD * 2);
    for (int i = 0; i < A_ROWS * KD; ++i) ha[i] = fattn_f32_to_bf16((float)tu_rng_normal(&rng));
    for (int i = 0; i < N * KD; ++i) hb[i] = fattn_f32_to_bf16((float)tu_rng_normal(&rng));
    for (int i = 0; i < N * KD; ++i) hv[i] = fattn_f32_to_bf16((float)tu_rng_normal(&rng));
    void *da, *db, *dv;
    float *dS, *dO;
    CK(cudaMalloc(&da, A_ROWS * KD * 2));
    CK(cudaMalloc(&db, N * KD * 2));
    CK(cudaMalloc(&dv, N * KD * 2));
    CK(cudaMalloc(&dS, M * N * 4));
    CK(cudaMalloc(&dO, M * KD * 4));
    CK(cudaMemcpy(da, ha, A_ROWS * KD * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, hb, N * KD * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dv, hv, N * KD * 2, cudaMemcpyHostToDevice));
    CK(cudaMemset(dS, 0xFF, M * N * 4));
    CK(cudaMemset(dO, 0xFF, M * KD * 4));
    CUtensorMap ta, tb, tv;
    make_map(&ta, da, A_ROWS, M);
    make_map(&tb, db, N, N);
    make_map(&tv, dv, N, N);
    const int smem = (M + 2 * N) * KD * 2 + 1024;
    CK(cudaFuncSetAttribute(k_wgmma, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    k_wgmma<<<1, 128, smem>>>(ta, tb, tv, dS, dO);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    float *S = (float *)tu_malloc(M * N * 4), *O = (float *)tu_malloc(M * KD * 4);
    CK(cudaMemcpy(S, dS, M * N * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(O, dO, M * KD * 4, cudaMemcpyDeviceToHost));
    /* CPU: S = A B^T (rows >= A_ROWS are zero), O = bf16(S) V */
    double es = 0, ns = 0, eo = 0, no = 0;
    static float Sb[M * N];
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
            double acc = 0;
            if (i < A_ROWS)
                for (int k = 0; k < KD; ++k)
                    acc += (double)fattn_bf16_to_f32(ha[i * KD + k]) * fattn_bf16_to_f32(hb[j * KD + k]);
            es += (S[i * N + j] - acc) * (S[i * N + j] - acc);
            ns += acc * acc;
            Sb[i * N + j] = fattn_bf16_to_f32(fattn_f32_to_bf16(S[i * N + j])); /* P exactly as the GPU rounded it */
        }
    for (int i = 0; i < M; ++i)
        for (int d = 0; d < KD; ++d) {
            double acc = 0;
            for (int j = 0; j < N; ++j) acc += (double)Sb[i * N + j] * fattn_bf16_to_f32(hv[j * KD + d]);
            eo += (O[i * KD + d] - acc) * (O[i * KD + d] - acc);
            no += acc * acc;
        }
    /* fp32 accumulation of 128 products: relative error ~1e-6; a layout bug gives ~1 */
    TU_EXPECT_LE(sqrt(es / ns), 1e-5, "TMA (swizzle 128B, OOB tail) + wgmma SS m64n128k16 bf16: S rel err");
    TU_EXPECT_LE(sqrt(eo / no), 1e-5, "accumulator->A fragment + wgmma RS m64n128k16 (V MN-major): O rel err");
    int tail_ok = 1;
    for (int i = A_ROWS; i < M; ++i)
        for (int j = 0; j < N; ++j) tail_ok &= S[i * N + j] == 0.f;
    TU_CHECK(tail_ok, "rows past the tensor's end must load as zero");

    unsigned long long *dsum, hsum[2];
    CK(cudaMalloc(&dsum, 16));
    CK(cudaMemset(dsum, 0, 16));
    k_ring<<<1, 96>>>(dsum);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hsum, dsum, 16, cudaMemcpyDeviceToHost));
    const unsigned long long want = (unsigned long long)(ITEMS * 32) * (ITEMS * 32 - 1) / 2;
    TU_CHECK(hsum[0] == want && hsum[1] == want, "mbarrier ring sums %llu %llu, want %llu", hsum[0], hsum[1], want);
    printf("  [%s] mbarrier ring: 2 stages, 1 producer, 2 consumers, %d items\n",
           hsum[0] == want && hsum[1] == want ? "ok" : "FAIL", ITEMS);

    test_e4m3(&rng);
    test_tnsp(&rng, true);
    test_tnsp(&rng, false);
    return tu_finish("gpu primitives");
}
