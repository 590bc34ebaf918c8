/* kv_append.cu - fattn_kv_append on a CUDA context (include/fattn.h): the
 * new rows of K and V copied into a contiguous cache or page pools, on the
 * context's stream, with no allocation and no host synchronisation (the
 * call can be captured in a CUDA graph with the forward it feeds).  The CPU
 * engine is src/cpu/kv_append.c.
 *
 * The entries of cache_seqlens and block_table are device memory, read by
 * the kernel only: a new row whose destination is out of range (a negative
 * or too large row, a table entry outside [0, num_pages)) is skipped, every
 * head, and the others are written.
 *
 * Work layout: a row is (sequence b, new row t, head h), head_dim elements;
 * `lanes` = min(32, next power of two >= chunks) consecutive threads of a
 * warp copy a row's chunks of W bytes (a lane takes chunks lane, lane +
 * lanes, ...), K's and V's loads both issued before the stores.  W is the
 * widest of 16, 8, 4, 2 bytes that divides the four tensors' base
 * addresses, their byte strides (dimensions of extent > 1) and the row's
 * bytes, so a row is copied whole in W-byte accesses.  256-thread CTAs,
 * at most 16 per SM, striding over the rows. */
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "../common/e4m3_quant.cuh"
#include "../cuda_engine.h"

#define KVA_THREADS 256
#define KVA_CTAS_PER_SM 16

/* One tensor's base and byte strides (batch entry or page, row, head). */
struct kva_tensor {
    char *base;
    int64_t sb, ss, sh;
};

struct kva_params {
    kva_tensor kn, vn, kc, vc;
    const int32_t *cache_seqlens;
    const int32_t *block_table; /* NULL: contiguous */
    int32_t seqlen_new, heads;
    int32_t chunks;     /* W-byte chunks per row */
    int32_t lanes_log2; /* lanes per row: 1 << lanes_log2 <= 32 */
    int64_t rows;       /* batch * seqlen_new * heads (< 2^31: api.c) */
    int64_t dest_rows;  /* rows a sequence can address: capacity, or max_pages_per_seq * page_size */
    int32_t page_size, num_pages, max_pages_per_seq;
};

template <int W> struct kva_word;
template <> struct kva_word<16> { typedef uint4 type; };
template <> struct kva_word<8> { typedef uint2 type; };
template <> struct kva_word<4> { typedef unsigned int type; };
template <> struct kva_word<2> { typedef unsigned short type; };

template <int W>
__global__ void __launch_bounds__(KVA_THREADS) kv_append_kernel(const __grid_constant__ kva_params p) {
    typedef typename kva_word<W>::type word;
    const int lanes_log2 = p.lanes_log2, lanes = 1 << lanes_log2;
    const int lr = (int)(threadIdx.x & (lanes - 1));
    const int64_t rows_per_cta = KVA_THREADS >> lanes_log2;
    const int64_t stride = (int64_t)gridDim.x * rows_per_cta;
    for (int64_t r = (int64_t)blockIdx.x * rows_per_cta + (threadIdx.x >> lanes_log2); r < p.rows; r += stride) {
        const int32_t row = (int32_t)r; /* < 2^31 */
        const int32_t h = row % p.heads, bt = row / p.heads;
        const int32_t t = bt % p.seqlen_new, b = bt / p.seqlen_new;
        const int64_t pos = (int64_t)__ldg(p.cache_seqlens + b) + t;
        if (pos < 0 || pos >= p.dest_rows) continue; /* out of range: skipped */
        int64_t db = b, ds = pos;
        if (p.block_table) {
            const int32_t pg = __ldg(p.block_table + (int64_t)b * p.max_pages_per_seq + pos / p.page_size);
            if (pg < 0 || pg >= p.num_pages) continue;
            db = pg;
            ds = pos % p.page_size;
        }
        const char *kn = p.kn.base + (int64_t)b * p.kn.sb + (int64_t)t * p.kn.ss + (int64_t)h * p.kn.sh;
        const char *vn = p.vn.base + (int64_t)b * p.vn.sb + (int64_t)t * p.vn.ss + (int64_t)h * p.vn.sh;
        char *kc = p.kc.base + db * p.kc.sb + ds * p.kc.ss + (int64_t)h * p.kc.sh;
        char *vc = p.vc.base + db * p.vc.sb + ds * p.vc.ss + (int64_t)h * p.vc.sh;
        for (int c = lr; c < p.chunks; c += lanes) {
            /* the new rows are inputs the kernel never writes (api.c: no
             * overlap with the caches), so the read-only path is safe */
            const word k = __ldg((const word *)(kn + (int64_t)c * W));
            const word v = __ldg((const word *)(vn + (int64_t)c * W));
            *(word *)(kc + (int64_t)c * W) = k;
            *(word *)(vc + (int64_t)c * W) = v;
        }
    }
}

/* ---- FP8 caches: quantised rows ------------------------------------------------------
 * One warp per (sequence, kv head, run): a run is the new rows of the
 * sequence inside one scale block (blocks of u = min(scale_block,
 * page_size) positions: the host requires page_size % scale_block == 0
 * below a page), so the warp that holds a block's first row holds every
 * row of its sequence that the call puts there.  It reduces their amax
 * (lanes over elements, rows in turn), writes the block's scale, then the
 * codes, a byte per element; a run that does not start its block reads
 * the stored scale.  The arithmetic is the CPU's (e4m3_quant.cuh).  K and
 * V are separate launches' worth of warps in one grid (y = 0, 1). */

struct kv8_cache {
    kva_tensor src;  /* the new rows (bytes) */
    kva_tensor dst;  /* the cache (bytes = elements) */
    float *scale;
    int32_t sb, nblocks, u; /* scale_block, blocks per (entry, head), run length */
};

struct kv8_params {
    kv8_cache c[2]; /* K, V */
    const int32_t *cache_seqlens;
    const int32_t *block_table;
    int32_t batch, seqlen_new, heads, head_dim, dtype; /* dtype: of the new rows */
    int64_t dest_rows;
    int32_t page_size, num_pages, max_pages_per_seq;
};

/* element i of a new row as f32, exactly (bf16 by its bits: its subnormals stay) */
__device__ __forceinline__ float kv8_load(const char *row, int i, int dtype) {
    if (dtype == FATTN_DTYPE_F32) return __ldg((const float *)row + i);
    const unsigned short h = __ldg((const unsigned short *)row + i);
    if (dtype == FATTN_DTYPE_BF16) return __uint_as_float((uint32_t)h << 16);
    float f;
    asm("{\n .reg .f16 t;\n mov.b16 t, %1;\n cvt.f32.f16 %0, t;\n}" : "=f"(f) : "h"(h));
    return f;
}

/* floor(a / u) for u >= 1 */
__device__ __forceinline__ int64_t kv8_floor_div(int64_t a, int64_t u) { return a >= 0 ? a / u : -((-a + u - 1) / u); }

__global__ void __launch_bounds__(KVA_THREADS) kv_append_e4m3_kernel(const __grid_constant__ kv8_params p) {
    const kv8_cache &c = p.c[blockIdx.y];
    const int lane = threadIdx.x & 31;
    const int64_t nruns = (int64_t)p.seqlen_new < (p.seqlen_new - 1) / c.u + 2 ? p.seqlen_new : (p.seqlen_new - 1) / c.u + 2;
    const int64_t w = (int64_t)blockIdx.x * (KVA_THREADS / 32) + threadIdx.x / 32;
    if (w >= (int64_t)p.batch * p.heads * nruns) return;
    const int32_t r = (int32_t)(w % nruns), h = (int32_t)(w / nruns % p.heads), b = (int32_t)(w / nruns / p.heads);
    const int64_t pos0 = __ldg(p.cache_seqlens + b), fb = kv8_floor_div(pos0, c.u);
    int64_t lo = (fb + r) * c.u, hi = lo + c.u;
    lo = lo > pos0 ? lo : pos0;
    hi = hi < pos0 + p.seqlen_new ? hi : pos0 + p.seqlen_new;
    /* rows out of range are skipped (fattn.h): those of the run before 0 or past the cache */
    const int64_t first_pos = lo;
    lo = lo > 0 ? lo : 0;
    hi = hi < p.dest_rows ? hi : p.dest_rows;
    if (lo >= hi) return;
    int64_t e = b, row0 = lo;
    if (p.block_table) {
        const int32_t pg = __ldg(p.block_table + (int64_t)b * p.max_pages_per_seq + lo / p.page_size);
        if (pg < 0 || pg >= p.num_pages) return;
        e = pg, row0 = lo % p.page_size;
    }
    float *sp = c.scale + (e * p.heads + h) * c.nblocks + row0 / c.sb;
    const char *src = c.src.base + (int64_t)b * c.src.sb + (int64_t)h * c.src.sh;
    const int64_t t0 = lo - pos0; /* the run's first new row */
    float scale;
    if (first_pos == lo && row0 % c.sb == 0) {
        float m = 0.f;
        for (int64_t t = t0; t < t0 + (hi - lo); ++t)
            for (int i = lane; i < p.head_dim; i += 32) m = f32_amax(m, kv8_load(src + t * c.src.ss, i, p.dtype));
        uint32_t mb = __float_as_uint(m); /* >= +0: the max of the bits is the max of the values */
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mb = max(mb, __shfl_xor_sync(0xffffffffu, mb, o));
        scale = scale_of_amax(mb);
        if (lane == 0) *sp = scale;
    } else {
        scale = *sp;
    }
    for (int64_t t = t0; t < t0 + (hi - lo); ++t) {
        uint8_t *dst = (uint8_t *)c.dst.base + e * c.dst.sb + (row0 + (t - t0)) * c.dst.ss + (int64_t)h * c.dst.sh;
        for (int i = lane; i < p.head_dim; i += 32)
            dst[i] = (uint8_t)(e4m3x2(f32_div(kv8_load(src + t * c.src.ss, i, p.dtype), scale), 0.f) & 0xFFu);
    }
}

/* ---- host side ---------------------------------------------------------------------- */

/* t's base and strides in bytes; a dimension of extent 1 gets stride 0 (it
 * is never stepped, and must not narrow the access width). */
static kva_tensor kva_tensor_of(const fattn_tensor *t, int64_t nb, int64_t ns, int64_t nh) {
    const int64_t es = (int64_t)fattn_dtype_size(t->dtype);
    kva_tensor x;
    x.base = (char *)t->data;
    x.sb = nb > 1 ? t->stride_batch * es : 0;
    x.ss = ns > 1 ? t->stride_seq * es : 0;
    x.sh = nh > 1 ? t->stride_head * es : 0;
    return x;
}

static uint64_t kva_bits(const kva_tensor &x) {
    return (uint64_t)(uintptr_t)x.base | (uint64_t)x.sb | (uint64_t)x.ss | (uint64_t)x.sh;
}

template <int W>
static cudaError_t kva_launch(const kva_params &p, dim3 grid, cudaStream_t stream) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(KVA_THREADS);
    cfg.stream = stream;
    return cudaLaunchKernelEx(&cfg, kv_append_kernel<W>, p);
}

/* An FP8 cache: the scales' pointers, the runs' length, the launch. */
static fattn_status kv_append_e4m3(fattn_ctx *ctx, const fattn_kv_append_args *a) {
    fattn_status st;
    const bool paged = a->block_table != NULL;
    const fattn_tensor *caches[2] = {&a->k_cache, &a->v_cache};
    const char *names[2] = {"k_cache.scale", "v_cache.scale"};
    for (int i = 0; i < 2; ++i) {
        if ((st = cuda_check_device_ptr(ctx, caches[i]->scale, names[i])) != FATTN_OK) return st;
        const int32_t sb = caches[i]->scale_block;
        if (paged && sb < a->page_size && a->page_size % sb != 0)
            return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                              "%s: scale_block %d with page_size %d: the CUDA engine's fattn_kv_append takes a "
                              "scale_block that divides page_size or is at least page_size (the CPU engine takes any)",
                              names[i], (int)sb, (int)a->page_size);
    }
    const int64_t cb = paged ? a->num_pages : a->batch, cs = paged ? a->page_size : a->capacity;
    kv8_params p;
    memset(&p, 0, sizeof p);
    const fattn_tensor *srcs[2] = {&a->k_new, &a->v_new};
    int64_t nruns = 1;
    for (int i = 0; i < 2; ++i) {
        kv8_cache &c = p.c[i];
        c.src = kva_tensor_of(srcs[i], a->batch, a->seqlen_new, a->heads_kv);
        c.dst = kva_tensor_of(caches[i], cb, cs, a->heads_kv);
        c.scale = caches[i]->scale;
        c.sb = caches[i]->scale_block;
        c.nblocks = (int32_t)((cs + c.sb - 1) / c.sb);
        c.u = paged && c.sb > a->page_size ? a->page_size : c.sb;
        const int64_t n = a->seqlen_new < (a->seqlen_new - 1) / c.u + 2 ? a->seqlen_new : (a->seqlen_new - 1) / c.u + 2;
        if (n > nruns) nruns = n;
    }
    p.cache_seqlens = a->cache_seqlens;
    p.block_table = a->block_table;
    p.batch = a->batch, p.seqlen_new = a->seqlen_new, p.heads = a->heads_kv, p.head_dim = a->head_dim;
    p.dtype = (int32_t)a->k_new.dtype;
    p.dest_rows = paged ? (int64_t)a->max_pages_per_seq * a->page_size : a->capacity;
    p.page_size = paged ? a->page_size : 1;
    p.num_pages = a->num_pages;
    p.max_pages_per_seq = a->max_pages_per_seq;
    /* warps: batch x heads x runs (< 2^31 rows x 2, api.c), 8 a CTA */
    const int64_t warps = (int64_t)a->batch * a->heads_kv * nruns;
    const int64_t ctas = (warps + KVA_THREADS / 32 - 1) / (KVA_THREADS / 32);
    if (ctas > 0x7fffffff)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED, "fattn_kv_append: %lld runs of new rows is too many",
                          (long long)warps);
    int prev;
    if ((st = cuda_ctx_enter(ctx, &prev)) != FATTN_OK) return st;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)ctas, 2);
    cfg.blockDim = dim3(KVA_THREADS);
    cfg.stream = (cudaStream_t)ctx->stream;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kv_append_e4m3_kernel, p);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        st = fattn_fail(ctx, FATTN_ERROR_CUDA, "fattn_kv_append (e4m3 caches): kernel launch (%lld CTAs): %s",
                        (long long)ctas, cudaGetErrorString(e));
    }
    cuda_device_leave(prev);
    return st;
}

/* api.c has checked the arguments (fattn_kv_append) and resolved the
 * default strides; this checks where the pointers live and enqueues the
 * kernel on ctx->stream (FP8 caches: kv_append_e4m3). */
extern "C" fattn_status fattn_cuda_kv_append(fattn_ctx *ctx, const fattn_kv_append_args *a) {
    fattn_status st;
    const struct {
        const void *ptr;
        const char *name;
    } ptrs[] = {{a->k_new.data, "k_new.data"},     {a->v_new.data, "v_new.data"},
                {a->k_cache.data, "k_cache.data"}, {a->v_cache.data, "v_cache.data"},
                {a->cache_seqlens, "cache_seqlens"}, {a->block_table, "block_table"}};
    for (const auto &x : ptrs)
        if (x.ptr && (st = cuda_check_device_ptr(ctx, x.ptr, x.name)) != FATTN_OK) return st;

    const bool paged = a->block_table != NULL;
    const int64_t cb = paged ? a->num_pages : a->batch, cs = paged ? a->page_size : a->capacity;
    if (a->k_cache.dtype == FATTN_DTYPE_E4M3) return kv_append_e4m3(ctx, a);
    kva_params p;
    memset(&p, 0, sizeof p);
    p.kn = kva_tensor_of(&a->k_new, a->batch, a->seqlen_new, a->heads_kv);
    p.vn = kva_tensor_of(&a->v_new, a->batch, a->seqlen_new, a->heads_kv);
    p.kc = kva_tensor_of(&a->k_cache, cb, cs, a->heads_kv);
    p.vc = kva_tensor_of(&a->v_cache, cb, cs, a->heads_kv);
    p.cache_seqlens = a->cache_seqlens;
    p.block_table = a->block_table;
    p.seqlen_new = a->seqlen_new;
    p.heads = a->heads_kv;
    p.rows = (int64_t)a->batch * a->seqlen_new * a->heads_kv;
    p.dest_rows = paged ? (int64_t)a->max_pages_per_seq * a->page_size : a->capacity;
    p.page_size = paged ? a->page_size : 1;
    p.num_pages = a->num_pages;
    p.max_pages_per_seq = a->max_pages_per_seq;

    /* the widest access every address and stride allows (api.c: 2-byte
     * aligned for 16-bit elements, 4 for f32) */
    const uint64_t row_bytes = (uint64_t)a->head_dim * fattn_dtype_size(a->k_new.dtype);
    const uint64_t bits = kva_bits(p.kn) | kva_bits(p.vn) | kva_bits(p.kc) | kva_bits(p.vc) | row_bytes | 16u;
    const int w = (int)(bits & (~bits + 1));
    p.chunks = (int32_t)(row_bytes / (uint64_t)w);
    p.lanes_log2 = 0;
    while ((1 << p.lanes_log2) < p.chunks && p.lanes_log2 < 5) ++p.lanes_log2;

    const int64_t rows_per_cta = KVA_THREADS >> p.lanes_log2;
    int64_t ctas = (p.rows + rows_per_cta - 1) / rows_per_cta;
    const int sms = ctx->cuda ? ((const fattn_cuda_state *)ctx->cuda)->num_sms : 0;
    const int64_t cap = (int64_t)(sms > 0 ? sms : 132) * KVA_CTAS_PER_SM;
    if (ctas > cap) ctas = cap;
    const dim3 grid((unsigned)ctas);

    int prev;
    if ((st = cuda_ctx_enter(ctx, &prev)) != FATTN_OK) return st;
    const cudaStream_t stream = (cudaStream_t)ctx->stream;
    cudaError_t e;
    switch (w) {
    case 16: e = kva_launch<16>(p, grid, stream); break;
    case 8: e = kva_launch<8>(p, grid, stream); break;
    case 4: e = kva_launch<4>(p, grid, stream); break;
    default: e = kva_launch<2>(p, grid, stream); break;
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        st = fattn_fail(ctx, FATTN_ERROR_CUDA, "fattn_kv_append: kernel launch (%u CTAs, %d-byte accesses): %s",
                        grid.x, w, cudaGetErrorString(e));
    }
    cuda_device_leave(prev);
    return st;
}
