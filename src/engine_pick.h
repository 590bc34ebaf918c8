/* engine_pick.h - which engine a context computes with (issue 41), as a pure
 * function of the backend asked for, the device's compute capability and
 * FATTN_CUDA_ENGINE, so that tests/test_engine_pick.c checks the choice for
 * every architecture on a machine without a GPU.  api.c (AUTO: CPU or CUDA)
 * and cuda/context.cu (which CUDA engine) both ask it.  Not installed. */
#ifndef FATTN_ENGINE_PICK_H
#define FATTN_ENGINE_PICK_H

#include <stddef.h>

#include "fattn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    FATTN_ENGINE_CPU = 0,
    FATTN_ENGINE_CUDA_HOPPER = 1,   /* src/cuda/hopper/: sm_90 only (its code is sm_90a) */
    FATTN_ENGINE_CUDA_PORTABLE = 2, /* src/cuda/portable/: sm_80 and newer (sm_80 SASS + PTX, sm_90a) */
} fattn_engine;

/* The oldest architecture the CUDA engine runs on (mma.sync m16n8k16 bf16,
 * cp.async, ldmatrix: Ampere), and the one the Hopper kernels need. */
#define FATTN_ENGINE_MIN_SM 80
#define FATTN_ENGINE_HOPPER_SM 90

/* sm: the device's compute capability as 10 x major + minor (86 = sm_86,
 * 120 = sm_120); 0 when there is no usable CUDA device or the build has no
 * CUDA engine.  env: FATTN_CUDA_ENGINE's value, NULL when unset.
 *   backend CPU: the CPU engine, whatever sm and env.
 *   backend AUTO: the CPU engine below sm_80 (sm 0 included; env not read),
 *     otherwise what CUDA gives, failures included (a bad env value is
 *     refused, not ignored: the variable exists to pin the engine down).
 *   backend CUDA: sm 0 NO_DEVICE; below sm_80 UNSUPPORTED; env NULL, "" or
 *     "auto": the Hopper engine on sm_90 and the portable engine on every
 *     other GPU; "portable": the portable engine (Hopper included);
 *     "hopper": the Hopper engine, UNSUPPORTED on any other GPU; any other
 *     value INVALID_ARGUMENT.
 * On success *engine is set; on failure it is untouched and why (n bytes,
 * may be NULL when n is 0) says why, written to follow "CUDA device D: ". */
fattn_status fattn_engine_pick(fattn_backend backend, int sm, const char *env, fattn_engine *engine, char *why,
                               size_t n);

/* 1 when env (FATTN_CUDA_ENGINE's value) asks for an engine by name rather
 * than leaving the choice to the architecture (unset, "" or "auto"). */
int fattn_engine_forced(const char *env);

/* fattn_ctx_engine's text into buf (n bytes): "cpu", "cuda hopper sm_90",
 * "cuda portable sm_86", with " (FATTN_CUDA_ENGINE)" appended when env
 * forced a CUDA engine. */
void fattn_engine_text(fattn_engine engine, int sm, const char *env, char *buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif
