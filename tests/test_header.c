/* test_header.c - include/fattn.h stands alone: this file is compiled as C11
 * (and run), and by ctest as C99 and as C++ with -Wall -Wextra -pedantic
 * -Werror (tests/CMakeLists.txt, header_c99 / header_cxx), so it uses only
 * what all three accept. */
#include "fattn.h"
#include "fattn.h" /* the include guard works */

#include <stdio.h>
#include <string.h>

int main(void) {
    fattn_fwd_args fa;
    fattn_bwd_args ba;
    fattn_quantize_args qa;
    fattn_status st = FATTN_OK;
    fattn_backend be = FATTN_BACKEND_AUTO;
    fattn_dtype dt = FATTN_DTYPE_BF16;
    fattn_quant_granularity g = FATTN_QUANT_BLOCK;
    fattn_ctx *ctx = NULL;
    int ok = 1;
    memset(&fa, 0, sizeof fa);
    memset(&ba, 0, sizeof ba);
    memset(&qa, 0, sizeof qa);
    fa.q = fattn_tensor_bshd(NULL, dt);
    qa.granularity = g;
    (void)be;
    (void)st;
    (void)ctx;
    /* The stable numeric values of the status codes. */
    ok &= FATTN_OK == 0 && FATTN_ERROR_INVALID_ARGUMENT == 1 && FATTN_ERROR_UNSUPPORTED == 2 &&
          FATTN_ERROR_NO_DEVICE == 3 && FATTN_ERROR_OUT_OF_MEMORY == 4 && FATTN_ERROR_CUDA == 5 &&
          FATTN_ERROR_INTERNAL == 6 && FATTN_ERROR_BUSY == 7;
    ok &= FATTN_VERSION_NUMBER == fattn_version_number();
    ok &= fa.q.stride_seq == 0 && fa.q.dtype == FATTN_DTYPE_BF16;
    printf("test_header: fattn %s, %s\n", fattn_version_string(), ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}
