/* engine.cu - the CUDA engine's entry points (declared in src/internal.h):
 * device discovery, context state, the checks only this engine needs
 * (pointer location, alignment, head dims), and dispatch to the kernels.
 * Plain C-style host code; compiled by nvcc only because it shares types
 * with the kernel launchers. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <stdint.h>
#include <string.h>

#include "cuda_engine.h"

/* ---- device / context ----------------------------------------------------- */

extern "C" int fattn_cuda_available(int device) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    if (device < 0 || device >= n) return 0;
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return 0;
    return prop.major == 9 && prop.minor == 0;
}

extern "C" fattn_status fattn_cuda_ctx_init(fattn_ctx *ctx) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        return fattn_fail(ctx, FATTN_ERROR_NO_DEVICE, "no CUDA device available (%s)",
                          e == cudaSuccess ? "device count is 0" : cudaGetErrorString(e));
    }
    if (ctx->device >= n)
        return fattn_fail(ctx, FATTN_ERROR_NO_DEVICE, "CUDA device %d does not exist (%d devices)", ctx->device, n);
    cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, ctx->device);
    if (e != cudaSuccess) return fattn_fail(ctx, FATTN_ERROR_CUDA, "cudaGetDeviceProperties: %s", cudaGetErrorString(e));
    if (!(prop.major == 9 && prop.minor == 0))
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "CUDA device %d is sm_%d%d (%s); the CUDA engine needs a Hopper GPU (sm_90)", ctx->device,
                          prop.major, prop.minor, prop.name);
    fattn_cuda_state *st = (fattn_cuda_state *)calloc(1, sizeof(fattn_cuda_state));
    if (!st) return fattn_fail(ctx, FATTN_ERROR_OUT_OF_MEMORY, "out of host memory");
    st->num_sms = prop.multiProcessorCount;
    cudaDriverEntryPointQueryResult q;
    void *fn = NULL;
    e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !fn) {
        free(st);
        return fattn_fail(ctx, FATTN_ERROR_CUDA, "cuTensorMapEncodeTiled is not available from the driver");
    }
    st->encode_tiled = fn;
    /* The causal scheduler's counter and the event that orders its users,
     * made here rather than on first use: allocation is not allowed while a
     * stream is being captured into a CUDA graph. */
    int prev;
    e = cuda_device_enter(ctx->device, &prev);
    void *counter = NULL;
    cudaEvent_t ev = NULL;
    cudaStream_t zs = NULL;
    if (e == cudaSuccess) e = cudaMalloc(&counter, 2 * sizeof(unsigned));
    /* zeroed on a private stream and waited for: a plain cudaMemset would sit
     * on the default stream, unordered with kernels on the caller's
     * non-blocking streams */
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&zs, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMemsetAsync(counter, 0, 2 * sizeof(unsigned), zs);
    if (e == cudaSuccess) e = cudaStreamSynchronize(zs);
    if (zs) (void)cudaStreamDestroy(zs);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        if (counter) cudaFree(counter);
        (void)cudaGetLastError();
        cuda_device_leave(prev);
        free(st);
        return fattn_fail(ctx, e == cudaErrorMemoryAllocation ? FATTN_ERROR_OUT_OF_MEMORY : FATTN_ERROR_CUDA,
                          "CUDA context state (tile counter, event): %s", cudaGetErrorString(e));
    }
    cuda_device_leave(prev);
    st->tile_counter = (unsigned *)counter;
    st->switch_event = ev;
    ctx->cuda = st;
    return FATTN_OK;
}

extern "C" void fattn_cuda_ctx_free(fattn_ctx *ctx) {
    if (!ctx || !ctx->cuda) return;
    fattn_cuda_state *st = (fattn_cuda_state *)ctx->cuda;
    /* on the context's device, after its last kernel */
    int prev;
    (void)cuda_device_enter(ctx->device, &prev);
    (void)cudaFree(st->tile_counter); /* synchronises with the device first */
    if (st->split_ws) (void)cudaFree(st->split_ws);
    for (int i = 0; i < st->split_nretired; ++i) (void)cudaFree(st->split_retired[i]);
    (void)cudaEventDestroy((cudaEvent_t)st->switch_event);
    cuda_device_leave(prev);
    (void)cudaGetLastError();
    free(ctx->cuda);
    ctx->cuda = NULL;
}

extern "C" fattn_status fattn_cuda_copy_to_host(fattn_ctx *ctx, void *dst, const void *src, size_t n) {
    cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "cannot read %zu bytes of device memory at %p: %s", n,
                          src, cudaGetErrorString(e));
    }
    return FATTN_OK;
}

/* ---- per-context launch state --------------------------------------------- */

cudaError_t cuda_device_enter(int device, int *prev) {
    *prev = -1;
    int cur = -1;
    cudaError_t e = cudaGetDevice(&cur);
    if (e != cudaSuccess || cur == device) return e;
    e = cudaSetDevice(device);
    if (e == cudaSuccess) *prev = cur;
    return e;
}

void cuda_device_leave(int prev) {
    if (prev >= 0) (void)cudaSetDevice(prev);
}

/* Whether ctx->stream is being captured into a CUDA graph (1), not (0), or the
 * query failed (-1, error recorded on ctx). */
static int stream_capturing(fattn_ctx *ctx) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing((cudaStream_t)ctx->stream, &cs);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        fattn_fail(ctx, FATTN_ERROR_CUDA, "cudaStreamIsCapturing: %s", cudaGetErrorString(e));
        return -1;
    }
    return cs != cudaStreamCaptureStatusNone;
}

fattn_status cuda_order_before(fattn_ctx *ctx) {
    fattn_cuda_state *st = (fattn_cuda_state *)ctx->cuda;
    /* Inside a capture, stream order is the only dependency allowed to cross
     * the capture boundary (waiting on an outside event is an error), and the
     * graph's kernels run when it is launched: their order is the caller's. */
    const int cap = stream_capturing(ctx);
    if (cap) return cap < 0 ? FATTN_ERROR_CUDA : FATTN_OK;
    /* The event was recorded on the stream of the previous launch, whatever
     * has become of that stream since (never recorded: no wait); on the same
     * stream this is a no-op. */
    cudaError_t e = cudaStreamWaitEvent((cudaStream_t)ctx->stream, (cudaEvent_t)st->switch_event, 0);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fattn_fail(ctx, FATTN_ERROR_CUDA, "ordering after the previous launch: %s", cudaGetErrorString(e));
    }
    return FATTN_OK;
}

fattn_status cuda_order_after(fattn_ctx *ctx) {
    fattn_cuda_state *st = (fattn_cuda_state *)ctx->cuda;
    const int cap = stream_capturing(ctx);
    if (cap) return cap < 0 ? FATTN_ERROR_CUDA : FATTN_OK; /* never record inside a capture */
    cudaError_t e = cudaEventRecord((cudaEvent_t)st->switch_event, (cudaStream_t)ctx->stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fattn_fail(ctx, FATTN_ERROR_CUDA, "cudaEventRecord: %s", cudaGetErrorString(e));
    }
    return FATTN_OK;
}

fattn_status cuda_split_workspace(fattn_ctx *ctx, size_t bytes, void **ws, unsigned **counters) {
    fattn_cuda_state *st = (fattn_cuda_state *)ctx->cuda;
    *ws = NULL;
    *counters = NULL;
    if (st->split_bytes < bytes) {
        const int cap = stream_capturing(ctx);
        if (cap < 0) return FATTN_ERROR_CUDA;
        if (cap) return FATTN_OK; /* no allocation inside a capture: unsplit */
        if (st->split_ws && st->split_nretired == 8) return FATTN_OK;
        size_t grow = (bytes + (4u << 20) - 1) / (4u << 20) * (4u << 20); /* 4 MB steps */
        if (grow < 2 * st->split_bytes) grow = 2 * st->split_bytes;
        void *buf = NULL;
        cudaError_t e = cudaMalloc(&buf, grow + CUDA_SPLIT_COUNTERS * sizeof(unsigned));
        if (e == cudaSuccess)
            e = cudaMemsetAsync((char *)buf + grow, 0, CUDA_SPLIT_COUNTERS * sizeof(unsigned),
                                (cudaStream_t)ctx->stream);
        if (e != cudaSuccess) { /* out of memory, say: this call runs unsplit */
            if (buf) (void)cudaFree(buf);
            (void)cudaGetLastError();
            return FATTN_OK;
        }
        /* kept, not freed: a graph captured while it was current may use it */
        if (st->split_ws) st->split_retired[st->split_nretired++] = st->split_ws;
        st->split_ws = buf;
        st->split_bytes = grow;
    }
    *ws = st->split_ws;
    *counters = (unsigned *)((char *)st->split_ws + st->split_bytes);
    return FATTN_OK;
}

/* ---- checks shared by the kernels ---------------------------------------- */

/* The pointer must be device memory of ctx->device (or managed). */
fattn_status cuda_check_device_ptr(fattn_ctx *ctx, const void *ptr, const char *name) {
    cudaPointerAttributes at;
    cudaError_t e = cudaPointerGetAttributes(&at, ptr);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "%s (%p) is not a CUDA pointer", name, ptr);
    }
    if (at.type != cudaMemoryTypeDevice && at.type != cudaMemoryTypeManaged)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "%s (%p) is not device memory (a CUDA context needs device pointers)",
                          name, ptr);
    if (at.device != ctx->device)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "%s (%p) lives on device %d, the context on device %d", name,
                          ptr, at.device, ctx->device);
    return FATTN_OK;
}

/* A 4-D tensor map [dim, seq, heads, batch] over a 16-bit tensor, box
 * [64, box_rows, 1, 1] with the 128-byte swizzle the wgmma descriptors
 * expect.  Out-of-bounds rows read as zero. */
fattn_status cuda_make_tensor_map(fattn_ctx *ctx, CUtensorMap *map, const fattn_tensor *t, int64_t dim, int64_t seq,
                                  int64_t heads, int64_t batch, int box_rows, const char *name) {
    fattn_cuda_state *st = (fattn_cuda_state *)ctx->cuda;
    const int64_t es = 2;
    cuuint64_t gdim[4] = {(cuuint64_t)dim, (cuuint64_t)seq, (cuuint64_t)heads, (cuuint64_t)batch};
    /* strides of size-1 dims are irrelevant but must still be legal */
    int64_t sb = batch > 1 ? t->stride_batch : seq * heads * dim;
    int64_t sh = heads > 1 ? t->stride_head : dim;
    int64_t ss = seq > 1 ? t->stride_seq : dim * heads;
    cuuint64_t gstride[3] = {(cuuint64_t)(ss * es), (cuuint64_t)(sh * es), (cuuint64_t)(sb * es)};
    cuuint32_t box[4] = {64, (cuuint32_t)box_rows, 1, 1};
    cuuint32_t estride[4] = {1, 1, 1, 1};
    PFN_cuTensorMapEncodeTiled_v12000 enc = (PFN_cuTensorMapEncodeTiled_v12000)st->encode_tiled;
    CUresult r = enc(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 /* 16-bit payload; dtype does not matter for a copy */,
                     4, t->data, gdim, gstride, box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE,
                     CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "TMA cannot describe %s (strides seq %lld, head %lld, batch %lld elements; error %d)", name,
                          (long long)t->stride_seq, (long long)t->stride_head, (long long)t->stride_batch, (int)r);
    return FATTN_OK;
}

/* 16-byte alignment of the base and of every stride, as TMA needs. */
static fattn_status check_tma_tensor(fattn_ctx *ctx, const fattn_tensor *t, const char *name) {
    fattn_status s = cuda_check_device_ptr(ctx, t->data, name);
    if (s != FATTN_OK) return s;
    if ((uintptr_t)t->data % 16)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "%s.data (%p) must be 16-byte aligned for the CUDA engine (TMA)", name, t->data);
    if (t->stride_seq % 8 || t->stride_head % 8 || t->stride_batch % 8)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "%s strides (batch %lld, seq %lld, head %lld) must be multiples of 8 elements (16 bytes) for "
                          "the CUDA engine (TMA)",
                          name, (long long)t->stride_batch, (long long)t->stride_seq, (long long)t->stride_head);
    return FATTN_OK;
}

/* ---- forward -------------------------------------------------------------- */

extern "C" fattn_status fattn_cuda_fwd(fattn_ctx *ctx, const fattn_fwd_args *a) {
    const fattn_problem *p = &a->p;
    const fattn_dtype dt = a->q.dtype;
    if (dt != FATTN_DTYPE_BF16 && dt != FATTN_DTYPE_F16)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "q.dtype %s is not supported by the CUDA engine yet; supported: bf16, f16", fattn_dtype_name(dt));
    if (a->o.dtype != dt)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED, "o.dtype %s must equal q.dtype %s on the CUDA engine",
                          fattn_dtype_name(a->o.dtype), fattn_dtype_name(dt));
    if (p->head_dim != p->head_dim_v)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "head_dim %d != head_dim_v %d is not supported by the Hopper kernel", p->head_dim, p->head_dim_v);
    if (p->head_dim != 64 && p->head_dim != 128 && p->head_dim != 256)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "head_dim %d is not supported by the Hopper 16-bit kernel; supported: 64, 128, 256", p->head_dim);
    if (p->cu_seqlens_q || p->cu_seqlens_k)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "variable-length batches (cu_seqlens) are not supported by the CUDA engine yet");
    fattn_status s;
    if ((s = check_tma_tensor(ctx, &a->q, "q")) != FATTN_OK) return s;
    if ((s = check_tma_tensor(ctx, &a->k, "k")) != FATTN_OK) return s;
    if ((s = check_tma_tensor(ctx, &a->v, "v")) != FATTN_OK) return s;
    if ((s = cuda_check_device_ptr(ctx, a->o.data, "o")) != FATTN_OK) return s;
    if ((uintptr_t)a->o.data % 4 || a->o.stride_seq % 2 || a->o.stride_head % 2 || a->o.stride_batch % 2)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "o.data must be 4-byte aligned and o's strides even for the CUDA engine");
    if (a->lse) {
        if ((s = cuda_check_device_ptr(ctx, a->lse, "lse")) != FATTN_OK) return s;
        if ((uintptr_t)a->lse % 4) return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT, "lse must be 4-byte aligned");
    }
    return fwd_sm90_launch(ctx, a);
}

extern "C" fattn_status fattn_cuda_bwd(fattn_ctx *ctx, const fattn_bwd_args *a) {
    (void)a;
    return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED, "the backward pass is not implemented on the CUDA engine yet");
}

extern "C" fattn_status fattn_cuda_quantize(fattn_ctx *ctx, const fattn_quantize_args *a) {
    (void)a;
    return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED, "fattn_quantize is not implemented on the CUDA engine yet");
}
