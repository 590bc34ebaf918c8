/* test_engine_pick.c - which engine a context computes with (issue 41;
 * src/engine_pick.h, fattn.h's fattn_ctx_create), on a machine without the
 * GPUs it is about:
 *   - fattn_engine_pick's table: backend AUTO / CUDA / CPU x compute
 *     capability (none, sm_70, 75, 80, 86, 87, 89, 90, 100, 103, 120, 121) x
 *     FATTN_CUDA_ENGINE (unset, "", auto, portable, hopper, a bad name):
 *     Hopper's kernels on sm_90 only, the portable engine on every other GPU
 *     from sm_80 on, the CPU below it under AUTO; the forced values; the
 *     statuses and reasons of the refusals;
 *   - fattn_ctx_engine's texts;
 *   - the library agrees with the table on this machine's device 0 (none
 *     here: AUTO is the CPU whatever the variable says, CUDA is NO_DEVICE;
 *     on a GPU machine the same check holds for its architecture).
 * The GPU runs of the engines themselves: tests/gpu (the portable ones
 * forced on an H200 through FATTN_CUDA_ENGINE=portable). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/testutil.h"
#include "engine_pick.h"
#include "fattn.h"
#include "internal.h"

#define CPU FATTN_ENGINE_CPU
#define HOP FATTN_ENGINE_CUDA_HOPPER
#define POR FATTN_ENGINE_CUDA_PORTABLE
#define OK FATTN_OK
#define NODEV FATTN_ERROR_NO_DEVICE
#define UNSUP FATTN_ERROR_UNSUPPORTED
#define INVAL FATTN_ERROR_INVALID_ARGUMENT

static const char *engine_name(fattn_engine e) { return e == CPU ? "cpu" : e == HOP ? "hopper" : "portable"; }

static const char *backend_name(fattn_backend b) {
    return b == FATTN_BACKEND_AUTO ? "AUTO" : b == FATTN_BACKEND_CPU ? "CPU" : "CUDA";
}

/* One row: what (backend, sm, env) must give, and a word the reason must hold. */
static void expect(fattn_backend b, int sm, const char *env, fattn_status want_st, fattn_engine want, const char *word) {
    fattn_engine got = (fattn_engine)99;
    char why[256];
    const fattn_status st = fattn_engine_pick(b, sm, env, &got, why, sizeof why);
    const char *envs = env ? env : "(unset)";
    TU_CHECK(st == want_st, "%s sm_%d FATTN_CUDA_ENGINE=%s: %s, expected %s (%s)", backend_name(b), sm, envs,
             fattn_status_string(st), fattn_status_string(want_st), why);
    if (want_st == OK)
        TU_CHECK(st != OK || got == want, "%s sm_%d FATTN_CUDA_ENGINE=%s: engine %s, expected %s", backend_name(b), sm,
                 envs, got == (fattn_engine)99 ? "unset" : engine_name(got), engine_name(want));
    else
        TU_CHECK(got == (fattn_engine)99 && word && strstr(why, word),
                 "%s sm_%d FATTN_CUDA_ENGINE=%s: engine written on failure, or the reason '%s' lacks '%s'",
                 backend_name(b), sm, envs, why, word ? word : "");
}

/* The table over the architectures: what a GPU of each runs. */
static void table(void) {
    static const int sms[] = {0, 70, 75, 80, 86, 87, 89, 90, 100, 103, 120, 121};
    static const char *const envs_auto[] = {NULL, "", "auto"};
    for (size_t i = 0; i < sizeof sms / sizeof sms[0]; ++i) {
        const int sm = sms[i];
        const int cuda = sm >= 80, hopper = sm == 90;
        /* unset, empty, auto: by the architecture */
        for (int e = 0; e < 3; ++e) {
            const char *env = envs_auto[e];
            expect(FATTN_BACKEND_AUTO, sm, env, OK, !cuda ? CPU : hopper ? HOP : POR, NULL);
            if (sm == 0)
                expect(FATTN_BACKEND_CUDA, sm, env, NODEV, CPU, "no CUDA device");
            else if (!cuda)
                expect(FATTN_BACKEND_CUDA, sm, env, UNSUP, CPU, "needs sm_80");
            else
                expect(FATTN_BACKEND_CUDA, sm, env, OK, hopper ? HOP : POR, NULL);
            expect(FATTN_BACKEND_CPU, sm, env, OK, CPU, NULL);
        }
        /* portable: forced on any sm_80+ GPU, Hopper included */
        expect(FATTN_BACKEND_AUTO, sm, "portable", OK, cuda ? POR : CPU, NULL);
        if (cuda) expect(FATTN_BACKEND_CUDA, sm, "portable", OK, POR, NULL);
        /* hopper: sm_90 only, a named refusal elsewhere (AUTO included: the
         * variable pins the engine down, it is not a hint) */
        if (hopper) {
            expect(FATTN_BACKEND_AUTO, sm, "hopper", OK, HOP, NULL);
            expect(FATTN_BACKEND_CUDA, sm, "hopper", OK, HOP, NULL);
        } else if (cuda) {
            expect(FATTN_BACKEND_AUTO, sm, "hopper", UNSUP, CPU, "need sm_90");
            expect(FATTN_BACKEND_CUDA, sm, "hopper", UNSUP, CPU, "need sm_90");
        } else {
            expect(FATTN_BACKEND_AUTO, sm, "hopper", OK, CPU, NULL);
        }
        /* a bad name is refused wherever a CUDA engine would run, named */
        if (cuda) {
            expect(FATTN_BACKEND_AUTO, sm, "ampere", INVAL, CPU, "FATTN_CUDA_ENGINE=ampere");
            expect(FATTN_BACKEND_CUDA, sm, "Portable", INVAL, CPU, "FATTN_CUDA_ENGINE=Portable");
        } else {
            expect(FATTN_BACKEND_AUTO, sm, "ampere", OK, CPU, NULL); /* AUTO's CPU context does not read it */
        }
        expect(FATTN_BACKEND_CPU, sm, "ampere", OK, CPU, NULL);
    }
    /* the reason names the architecture; a long bad value is cut, not overrun */
    char why[64], longenv[300];
    fattn_engine e;
    fattn_engine_pick(FATTN_BACKEND_CUDA, 75, NULL, &e, why, sizeof why);
    TU_CHECK(strstr(why, "sm_75") != NULL, "reason '%s' does not name sm_75", why);
    fattn_engine_pick(FATTN_BACKEND_CUDA, 120, "hopper", &e, why, sizeof why);
    TU_CHECK(strstr(why, "sm_120") != NULL, "reason '%s' does not name sm_120", why);
    memset(longenv, 'x', sizeof longenv - 1);
    longenv[sizeof longenv - 1] = '\0';
    TU_CHECK(fattn_engine_pick(FATTN_BACKEND_CUDA, 86, longenv, &e, why, sizeof why) == INVAL &&
                 strlen(why) < sizeof why,
             "a 299-character FATTN_CUDA_ENGINE");
    TU_CHECK(fattn_engine_pick(FATTN_BACKEND_CUDA, 86, "hopper", &e, NULL, 0) == UNSUP, "why NULL");
}

static void texts(void) {
    static const struct {
        fattn_engine e;
        int sm;
        const char *env, *want;
    } rows[] = {{CPU, 0, NULL, "cpu"},
                {CPU, 90, "portable", "cpu"},
                {HOP, 90, NULL, "cuda hopper sm_90"},
                {HOP, 90, "auto", "cuda hopper sm_90"},
                {HOP, 90, "hopper", "cuda hopper sm_90 (FATTN_CUDA_ENGINE)"},
                {POR, 90, "portable", "cuda portable sm_90 (FATTN_CUDA_ENGINE)"},
                {POR, 80, NULL, "cuda portable sm_80"},
                {POR, 86, "", "cuda portable sm_86"},
                {POR, 89, NULL, "cuda portable sm_89"},
                {POR, 100, NULL, "cuda portable sm_100"},
                {POR, 120, NULL, "cuda portable sm_120"}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; ++i) {
        char buf[48]; /* fattn_cuda_state's name[48] */
        fattn_engine_text(rows[i].e, rows[i].sm, rows[i].env, buf, sizeof buf);
        TU_CHECK(!strcmp(buf, rows[i].want), "text '%s', expected '%s'", buf, rows[i].want);
    }
}

/* fattn_ctx_create on this machine's device 0 against the table. */
static void this_machine(void) {
    const int sm = fattn_cuda_device_sm(0);
    static const char *const envs[] = {NULL, "portable", "hopper", "ampere"};
    printf("device 0: %s\n", sm ? "a CUDA GPU" : "none (or a build without CUDA)");
    for (int i = 0; i < 4; ++i) {
        if (envs[i])
            setenv("FATTN_CUDA_ENGINE", envs[i], 1);
        else
            unsetenv("FATTN_CUDA_ENGINE");
        for (int b = 0; b < 2; ++b) {
            const fattn_backend backend = b ? FATTN_BACKEND_CUDA : FATTN_BACKEND_AUTO;
            fattn_engine want;
            const fattn_status want_st = fattn_engine_pick(backend, sm, envs[i], &want, NULL, 0);
            fattn_ctx *ctx = NULL;
            const fattn_status st = fattn_ctx_create(&ctx, backend, 0);
            printf("  %s, FATTN_CUDA_ENGINE=%s: %s, engine \"%s\"%s%s\n", backend_name(backend),
                   envs[i] ? envs[i] : "(unset)", fattn_status_string(st), ctx ? fattn_ctx_engine(ctx) : "",
                   st ? ": " : "", st ? fattn_last_error(NULL) : "");
            /* NO_DEVICE for sm 0 comes from the engine, with the driver's reason */
            TU_CHECK(st == want_st, "%s FATTN_CUDA_ENGINE=%s: %s, the table says %s", backend_name(backend),
                     envs[i] ? envs[i] : "(unset)", fattn_status_string(st), fattn_status_string(want_st));
            if (st == FATTN_OK && want_st == FATTN_OK) {
                char text[48];
                fattn_engine_text(want, sm, envs[i], text, sizeof text);
                TU_CHECK(!strcmp(fattn_ctx_engine(ctx), text), "fattn_ctx_engine \"%s\", the table says \"%s\"",
                         fattn_ctx_engine(ctx), text);
                TU_CHECK(fattn_ctx_backend(ctx) == (want == CPU ? FATTN_BACKEND_CPU : FATTN_BACKEND_CUDA),
                         "fattn_ctx_backend");
            }
            TU_CHECK(st == FATTN_OK || ctx == NULL, "ctx not NULL after a failure");
            fattn_ctx_free(ctx);
        }
    }
    unsetenv("FATTN_CUDA_ENGINE");
}

int main(void) {
    table();
    texts();
    this_machine();
    return tu_finish("test_engine_pick");
}
