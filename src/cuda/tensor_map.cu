/* tensor_map.cu - TMA tensor maps over fattn tensors (cuTensorMapEncodeTiled,
 * reached through the driver entry point that fattn_cuda_ctx_init looked up,
 * so the library does not link libcuda), and the layout rules TMA imposes. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdint.h>

#include "cuda_engine.h"

/* TMA addresses global memory in 16-byte units: base and strides (the
 * portable engine's cp.async loads 16-byte chunks of rows: the same rule). */
fattn_status cuda_check_tma_layout(fattn_ctx *ctx, const fattn_tensor *t, fattn_dtype dtype, const char *name) {
    const int64_t es = (int64_t)fattn_dtype_size(dtype);
    if (es == 0) return fattn_fail(ctx, FATTN_ERROR_INTERNAL, "%s: dtype %d has no element size", name, (int)dtype);
    if ((uintptr_t)t->data % 16)
        return fattn_fail(ctx, FATTN_ERROR_INVALID_ARGUMENT,
                          "%s.data (%p) must be 16-byte aligned for the CUDA engine (16-byte loads: TMA, cp.async)",
                          name, t->data);
    const int64_t step = 16 / es; /* elements per 16 bytes */
    if (t->stride_seq % step || t->stride_head % step || t->stride_batch % step)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "%s strides (batch %lld, seq %lld, head %lld) must be multiples of %lld elements (16 bytes) "
                          "for the CUDA engine (16-byte loads: TMA, cp.async)",
                          name, (long long)t->stride_batch, (long long)t->stride_seq, (long long)t->stride_head,
                          (long long)step);
    return FATTN_OK;
}

/* Bytes of one swizzle row, which a box row may not exceed (-1: no swizzle,
 * no limit; 0: a mode Hopper lacks). */
static int swizzle_span(CUtensorMapSwizzle swizzle) {
    switch (swizzle) {
    case CU_TENSOR_MAP_SWIZZLE_NONE: return -1;
    case CU_TENSOR_MAP_SWIZZLE_32B: return 32;
    case CU_TENSOR_MAP_SWIZZLE_64B: return 64;
    case CU_TENSOR_MAP_SWIZZLE_128B: return 128;
    default: return 0; /* the 128B-atom modes are Blackwell's */
    }
}

static bool map_dtype(fattn_dtype dtype, CUtensorMapDataType *out) {
    switch (dtype) {
    case FATTN_DTYPE_BF16: *out = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16; return true;
    case FATTN_DTYPE_F16: *out = CU_TENSOR_MAP_DATA_TYPE_FLOAT16; return true;
    case FATTN_DTYPE_F32: *out = CU_TENSOR_MAP_DATA_TYPE_FLOAT32; return true;
    case FATTN_DTYPE_E4M3: *out = CU_TENSOR_MAP_DATA_TYPE_UINT8; return true; /* TMA has no fp8 type: bytes */
    }
    return false;
}

fattn_status cuda_tensor_map_4d(fattn_ctx *ctx, CUtensorMap *map, const fattn_tensor *t, fattn_dtype dtype, int64_t dim,
                                int64_t seq, int64_t heads, int64_t batch, int box_cols, int box_rows,
                                CUtensorMapSwizzle swizzle, const char *name) {
    CUtensorMapDataType cdt;
    if (!map_dtype(dtype, &cdt))
        return fattn_fail(ctx, FATTN_ERROR_INTERNAL, "%s: dtype %d has no tensor-map type", name, (int)dtype);
    const int64_t es = (int64_t)fattn_dtype_size(dtype);
    fattn_status s = cuda_check_tma_layout(ctx, t, dtype, name);
    if (s != FATTN_OK) return s;
    /* The box is the kernel's choice, never the caller's: a bad one is a bug. */
    const int span = swizzle_span(swizzle);
    if (span == 0)
        return fattn_fail(ctx, FATTN_ERROR_INTERNAL, "%s: swizzle mode %d is not one Hopper's TMA has", name,
                          (int)swizzle);
    if (box_cols < 1 || box_cols > 256 || box_rows < 1 || box_rows > 256)
        return fattn_fail(ctx, FATTN_ERROR_INTERNAL, "%s: TMA box %d x %d (columns x rows) must be 1..256 each", name,
                          box_cols, box_rows);
    const int64_t row_bytes = (int64_t)box_cols * es;
    if (row_bytes % 16)
        return fattn_fail(ctx, FATTN_ERROR_INTERNAL,
                          "%s: a TMA box row of %d %s elements (%lld bytes) must be a multiple of 16 bytes", name,
                          box_cols, fattn_dtype_name(dtype), (long long)row_bytes);
    if (span > 0 && row_bytes > span)
        return fattn_fail(ctx, FATTN_ERROR_INTERNAL,
                          "%s: a TMA box row of %d %s elements (%lld bytes) is wider than the %d-byte swizzle", name,
                          box_cols, fattn_dtype_name(dtype), (long long)row_bytes, span);
    fattn_cuda_state *st = (fattn_cuda_state *)ctx->cuda;
    cuuint64_t gdim[4] = {(cuuint64_t)dim, (cuuint64_t)seq, (cuuint64_t)heads, (cuuint64_t)batch};
    /* strides of size-1 dims are irrelevant but must still be legal */
    const int64_t sb = batch > 1 ? t->stride_batch : seq * heads * dim;
    const int64_t sh = heads > 1 ? t->stride_head : dim;
    const int64_t ss = seq > 1 ? t->stride_seq : dim * heads;
    cuuint64_t gstride[3] = {(cuuint64_t)(ss * es), (cuuint64_t)(sh * es), (cuuint64_t)(sb * es)};
    cuuint32_t box[4] = {(cuuint32_t)box_cols, (cuuint32_t)box_rows, 1, 1};
    cuuint32_t estride[4] = {1, 1, 1, 1};
    PFN_cuTensorMapEncodeTiled_v12000 enc = (PFN_cuTensorMapEncodeTiled_v12000)st->encode_tiled;
    CUresult r = enc(map, cdt, 4, t->data, gdim, gstride, box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return fattn_fail(ctx, FATTN_ERROR_UNSUPPORTED,
                          "TMA cannot describe %s (strides seq %lld, head %lld, batch %lld elements; error %d)", name,
                          (long long)t->stride_seq, (long long)t->stride_head, (long long)t->stride_batch, (int)r);
    return FATTN_OK;
}

fattn_status cuda_make_tensor_map(fattn_ctx *ctx, CUtensorMap *map, const fattn_tensor *t, int64_t dim, int64_t seq,
                                  int64_t heads, int64_t batch, int box_rows, const char *name) {
    return cuda_tensor_map_4d(ctx, map, t, FATTN_DTYPE_BF16 /* any 16-bit type: TMA copies, never converts */, dim,
                              seq, heads, batch, 64, box_rows, CU_TENSOR_MAP_SWIZZLE_128B, name);
}
