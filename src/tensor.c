/* tensor.c - the public tensor helpers (dtype sizes and names,
 * fattn_tensor_bshd), which the API layer and the engines both use. */
#include <string.h>

#include "fattn.h"

size_t fattn_dtype_size(fattn_dtype dtype) {
    switch (dtype) {
    case FATTN_DTYPE_F32: return 4;
    case FATTN_DTYPE_F16: return 2;
    case FATTN_DTYPE_BF16: return 2;
    case FATTN_DTYPE_E4M3: return 1;
    }
    return 0;
}

const char *fattn_dtype_name(fattn_dtype dtype) {
    switch (dtype) {
    case FATTN_DTYPE_F32: return "f32";
    case FATTN_DTYPE_F16: return "f16";
    case FATTN_DTYPE_BF16: return "bf16";
    case FATTN_DTYPE_E4M3: return "e4m3";
    }
    return "?";
}

fattn_tensor fattn_tensor_bshd(void *data, fattn_dtype dtype) {
    fattn_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    return t;
}
