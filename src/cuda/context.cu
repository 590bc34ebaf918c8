/* context.cu - the CUDA engine's per-context state: device discovery,
 * fattn_cuda_ctx_init/free (the driver's tensor-map encoder, the causal tile
 * counter and the event that orders its users), switching devices around a
 * call, launch ordering, the split forward's workspace and fattn_fwd_fp8's.
 * Plain C-style host code. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "cuda_engine.h"

/* ---- device / context ----------------------------------------------------- */

/* The device's compute capability, 10 x major + minor; 0 without a usable
 * device (api.c: AUTO's choice through fattn_engine_pick). */
extern "C" int fattn_cuda_device_sm(int device) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    if (device < 0 || device >= n) return 0;
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return prop.major * 10 + prop.minor;
}

/* Why cudaGetDeviceCount failed, in words a user can act on: the runtime
 * answers cudaErrorInsufficientDriver both without any driver and with one
 * older than itself, so ask the driver's version (0: none loaded). */
static const char *no_device_reason(cudaError_t e, char *buf, size_t n) {
    if (e == cudaSuccess) return "the NVIDIA driver reports no GPU";
    if (e == cudaErrorInsufficientDriver) {
        int dv = 0, rv = 0;
        if (cudaDriverGetVersion(&dv) != cudaSuccess || dv == 0)
            return "no NVIDIA driver found: libcuda.so.1 is not installed or cannot be loaded";
        cudaRuntimeGetVersion(&rv);
        snprintf(buf, n, "the NVIDIA driver supports CUDA %d.%d, older than this build's CUDA runtime %d.%d: "
                         "update the driver", dv / 1000, dv % 1000 / 10, rv / 1000, rv % 1000 / 10);
        return buf;
    }
    if (e == cudaErrorNoDevice) return "the NVIDIA driver reports no GPU";
    return cudaGetErrorString(e);
}

extern "C" const char *fattn_cuda_engine_name(const fattn_ctx *ctx) {
    const fattn_cuda_state *st = (const fattn_cuda_state *)ctx->cuda;
    return st ? st->name : "cuda";
}

/* The kernels a context on this device runs (fattn_engine_pick, engine_pick.h):
 * Hopper's on sm_90, the portable engine's on every other GPU from sm_80 on,
 * unless engine_env (FATTN_CUDA_ENGINE, read once by api.c) names one. */
extern "C" fattn_status fattn_cuda_ctx_init(fattn_ctx *ctx, const char *engine_env) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        char why[160];
        return fattn_fail(ctx, FATTN_ERROR_NO_DEVICE, "no CUDA device available (%s)",
                          no_device_reason(e, why, sizeof why));
    }
    if (ctx->device >= n)
        return fattn_fail(ctx, FATTN_ERROR_NO_DEVICE, "CUDA device %d does not exist (%d devices)", ctx->device, n);
    cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, ctx->device);
    if (e != cudaSuccess) return fattn_fail(ctx, FATTN_ERROR_CUDA, "cudaGetDeviceProperties: %s", cudaGetErrorString(e));
    const int sm = prop.major * 10 + prop.minor;
    fattn_engine engine;
    char why[256];
    fattn_status es = fattn_engine_pick(FATTN_BACKEND_CUDA, sm, engine_env, &engine, why, sizeof why);
    if (es != FATTN_OK) return fattn_fail(ctx, es, "CUDA device %d (%s): %s", ctx->device, prop.name, why);
    fattn_cuda_state *st = (fattn_cuda_state *)calloc(1, sizeof(fattn_cuda_state));
    if (!st) return fattn_fail(ctx, FATTN_ERROR_OUT_OF_MEMORY, "out of host memory");
    st->num_sms = prop.multiProcessorCount;
    st->engine = engine;
    st->sm = sm;
    st->smem_optin = (int)prop.sharedMemPerBlockOptin;
    fattn_engine_text(engine, sm, engine_env, st->name, sizeof st->name);
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

static void owned_workspace_free(cuda_owned_ws *w);

extern "C" void fattn_cuda_ctx_free(fattn_ctx *ctx) {
    if (!ctx || !ctx->cuda) return;
    fattn_cuda_state *st = (fattn_cuda_state *)ctx->cuda;
    /* on the context's device, after its last kernel */
    int prev;
    (void)cuda_device_enter(ctx->device, &prev);
    (void)cudaFree(st->tile_counter); /* synchronises with the device first */
    if (st->split_ws) (void)cudaFree(st->split_ws);
    for (int i = 0; i < st->split_nretired; ++i) (void)cudaFree(st->split_retired[i]);
    owned_workspace_free(&st->fp8);
    owned_workspace_free(&st->bwd);
    owned_workspace_free(&st->merge);
    owned_workspace_free(&st->dec);
    (void)cudaEventDestroy((cudaEvent_t)st->switch_event);
    cuda_device_leave(prev);
    (void)cudaGetLastError();
    free(ctx->cuda);
    ctx->cuda = NULL;
}

/* ---- launch state ----------------------------------------------------------- */

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

fattn_status cuda_ctx_enter(fattn_ctx *ctx, int *prev) {
    const cudaError_t e = cuda_device_enter(ctx->device, prev);
    if (e == cudaSuccess) return FATTN_OK;
    (void)cudaGetLastError();
    return fattn_fail(ctx, FATTN_ERROR_CUDA, "making CUDA device %d current: %s", ctx->device, cudaGetErrorString(e));
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

/* ---- workspaces owned by the context (fattn_fwd_fp8's, the backward's) -------- */

/* At least `bytes` of w (grown in 4 MB steps, at least doubled), ordered after
 * the previous call that used it (its event); `who` names the caller in the
 * messages.  Nothing is allocated during graph capture (UNSUPPORTED). */
static fattn_status owned_workspace(fattn_ctx *ctx, cuda_owned_ws *w, size_t bytes, void **ws, const char *who) {
    *ws = NULL;
    const int cap = stream_capturing(ctx);
    if (cap < 0) return FATTN_ERROR_CUDA;
    if (w->bytes < bytes) {
        if (cap)
            return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                              "%s needs a %zu-byte workspace and the context has %zu bytes: nothing is "
                              "allocated while the stream is being captured into a CUDA graph (make one such call "
                              "before the capture)",
                              who, bytes, w->bytes);
        size_t grow = (bytes + (4u << 20) - 1) / (4u << 20) * (4u << 20); /* 4 MB steps */
        if (grow < 2 * w->bytes) grow = 2 * w->bytes;
        int prev;
        cudaError_t e = cuda_device_enter(ctx->device, &prev);
        void *buf = NULL, **retired = NULL;
        if (e == cudaSuccess && !w->event) {
            cudaEvent_t ev;
            e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
            if (e == cudaSuccess) w->event = ev;
        }
        if (e == cudaSuccess) e = cudaMalloc(&buf, grow);
        cuda_device_leave(prev);
        if (e == cudaSuccess && w->buf) {
            retired = (void **)realloc(w->retired, sizeof(void *) * (size_t)(w->nretired + 1));
            if (!retired) {
                (void)cudaFree(buf);
                return fattn_fail(ctx, FATTN_ERROR_OUT_OF_MEMORY, "%s: out of host memory", who);
            }
            w->retired = retired;
            w->retired[w->nretired++] = w->buf; /* kept: a captured graph may use it */
        }
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return fattn_fail(ctx, e == cudaErrorMemoryAllocation ? FATTN_ERROR_OUT_OF_MEMORY : FATTN_ERROR_CUDA,
                              "%s: cannot allocate its %zu-byte workspace: %s", who, grow, cudaGetErrorString(e));
        }
        w->buf = buf;
        w->bytes = grow;
    }
    /* the previous call may still use the workspace on another stream (never
     * recorded: no wait; inside a capture the graph's order is the caller's) */
    if (!cap && w->event) {
        cudaError_t e = cudaStreamWaitEvent((cudaStream_t)ctx->stream, (cudaEvent_t)w->event, 0);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return fattn_fail(ctx, FATTN_ERROR_CUDA, "%s: ordering after the previous call: %s", who,
                              cudaGetErrorString(e));
        }
    }
    *ws = w->buf;
    return FATTN_OK;
}

/* The caller's last use of w is enqueued: record it for the next call. */
static fattn_status owned_workspace_done(fattn_ctx *ctx, cuda_owned_ws *w, const char *who) {
    const int cap = stream_capturing(ctx);
    if (cap || !w->event) return cap < 0 ? FATTN_ERROR_CUDA : FATTN_OK; /* never record inside a capture */
    cudaError_t e = cudaEventRecord((cudaEvent_t)w->event, (cudaStream_t)ctx->stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fattn_fail(ctx, FATTN_ERROR_CUDA, "%s: cudaEventRecord: %s", who, cudaGetErrorString(e));
    }
    return FATTN_OK;
}

static void owned_workspace_free(cuda_owned_ws *w) {
    if (w->buf) (void)cudaFree(w->buf);
    for (int i = 0; i < w->nretired; ++i) (void)cudaFree(w->retired[i]);
    free(w->retired);
    if (w->event) (void)cudaEventDestroy((cudaEvent_t)w->event);
}

extern "C" fattn_status fattn_cuda_fp8_workspace(fattn_ctx *ctx, size_t bytes, void **ws) {
    return owned_workspace(ctx, &((fattn_cuda_state *)ctx->cuda)->fp8, bytes, ws, "fattn_fwd_fp8");
}
extern "C" fattn_status fattn_cuda_fp8_workspace_done(fattn_ctx *ctx) {
    return owned_workspace_done(ctx, &((fattn_cuda_state *)ctx->cuda)->fp8, "fattn_fwd_fp8");
}
fattn_status cuda_bwd_workspace(fattn_ctx *ctx, size_t bytes, void **ws) {
    return owned_workspace(ctx, &((fattn_cuda_state *)ctx->cuda)->bwd, bytes, ws, "fattn_bwd");
}
fattn_status cuda_bwd_workspace_done(fattn_ctx *ctx) {
    return owned_workspace_done(ctx, &((fattn_cuda_state *)ctx->cuda)->bwd, "fattn_bwd");
}
fattn_status cuda_merge_workspace(fattn_ctx *ctx, size_t bytes, void **ws) {
    return owned_workspace(ctx, &((fattn_cuda_state *)ctx->cuda)->merge, bytes, ws, "fattn_merge");
}
fattn_status cuda_merge_workspace_done(fattn_ctx *ctx) {
    return owned_workspace_done(ctx, &((fattn_cuda_state *)ctx->cuda)->merge, "fattn_merge");
}
fattn_status cuda_decode_workspace(fattn_ctx *ctx, size_t bytes, void **ws) {
    cuda_owned_ws *w = &((fattn_cuda_state *)ctx->cuda)->dec;
    *ws = NULL;
    const int cap = stream_capturing(ctx);
    if (cap < 0) return FATTN_ERROR_CUDA;
    if (cap && w->bytes < bytes) return FATTN_OK;
    return owned_workspace(ctx, w, bytes, ws, "fattn_fwd (decoding)");
}
fattn_status cuda_decode_workspace_done(fattn_ctx *ctx) {
    return owned_workspace_done(ctx, &((fattn_cuda_state *)ctx->cuda)->dec, "fattn_fwd (decoding)");
}
