/* engine_pick.c - the engine decision of engine_pick.h: plain C, no CUDA, in
 * every build (tests/test_engine_pick.c runs it for sm_70 ... sm_120). */
#include "engine_pick.h"

#include <stdio.h>
#include <string.h>

int fattn_engine_forced(const char *env) { return env && *env && strcmp(env, "auto") != 0; }

/* why (n bytes, NULL when n is 0) gets the reason; st is returned. */
#define PICK_FAIL(st, ...)                                                                                        \
    do {                                                                                                          \
        if (why && n) snprintf(why, n, __VA_ARGS__);                                                              \
        return (st);                                                                                              \
    } while (0)

fattn_status fattn_engine_pick(fattn_backend backend, int sm, const char *env, fattn_engine *engine, char *why,
                               size_t n) {
    if (why && n) why[0] = '\0';
    if (backend == FATTN_BACKEND_CPU || (backend == FATTN_BACKEND_AUTO && sm < FATTN_ENGINE_MIN_SM)) {
        *engine = FATTN_ENGINE_CPU;
        return FATTN_OK;
    }
    if (backend != FATTN_BACKEND_AUTO && backend != FATTN_BACKEND_CUDA)
        PICK_FAIL(FATTN_ERROR_INVALID_ARGUMENT, "backend %d is not FATTN_BACKEND_AUTO, _CPU or _CUDA", (int)backend);
    if (sm <= 0) PICK_FAIL(FATTN_ERROR_NO_DEVICE, "no CUDA device available");
    if (sm < FATTN_ENGINE_MIN_SM)
        PICK_FAIL(FATTN_ERROR_UNSUPPORTED, "sm_%d; the CUDA engine needs sm_80 or newer (Ampere, Ada, Hopper, Blackwell)",
                  sm);
    const int hopper = sm == FATTN_ENGINE_HOPPER_SM;
    if (!fattn_engine_forced(env)) {
        *engine = hopper ? FATTN_ENGINE_CUDA_HOPPER : FATTN_ENGINE_CUDA_PORTABLE;
        return FATTN_OK;
    }
    if (!strcmp(env, "portable")) {
        *engine = FATTN_ENGINE_CUDA_PORTABLE;
        return FATTN_OK;
    }
    if (!strcmp(env, "hopper")) {
        if (!hopper)
            PICK_FAIL(FATTN_ERROR_UNSUPPORTED,
                      "sm_%d; FATTN_CUDA_ENGINE=hopper asks for the Hopper kernels, which need sm_90 (the portable "
                      "engine runs here: unset the variable or set it to portable)",
                      sm);
        *engine = FATTN_ENGINE_CUDA_HOPPER;
        return FATTN_OK;
    }
    PICK_FAIL(FATTN_ERROR_INVALID_ARGUMENT, "FATTN_CUDA_ENGINE=%.64s is not a CUDA engine (auto, hopper or portable, "
              "or unset)", env);
}

void fattn_engine_text(fattn_engine engine, int sm, const char *env, char *buf, size_t n) {
    if (!buf || !n) return;
    if (engine == FATTN_ENGINE_CPU) {
        snprintf(buf, n, "cpu");
        return;
    }
    snprintf(buf, n, "cuda %s sm_%d%s", engine == FATTN_ENGINE_CUDA_HOPPER ? "hopper" : "portable", sm,
             fattn_engine_forced(env) ? " (FATTN_CUDA_ENGINE)" : "");
}
