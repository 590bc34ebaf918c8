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

/* api.c has checked the arguments (fattn_kv_append) and resolved the
 * default strides; this checks where the pointers live and enqueues the
 * kernel on ctx->stream. */
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
