/* scratch.c - see scratch.h. */
#include "cpu/scratch.h"

#include <stdatomic.h>
#include <stdlib.h>

/* Each buffer starts with a 64-byte header holding its capacity in floats. */
#define HDR 64

static _Atomic(char *) cached;

static size_t cap_of(char *h) { return *(size_t *)h; }

float *fattn_cpu_scratch_get(size_t floats) {
    char *h = atomic_exchange(&cached, NULL);
    if (h && cap_of(h) >= floats) return (float *)(h + HDR);
    free(h);
    if (floats > (((size_t)-1) - 2 * HDR) / sizeof(float)) return NULL;
    const size_t bytes = (HDR + floats * sizeof(float) + 63) / 64 * 64;
    h = (char *)aligned_alloc(64, bytes);
    if (!h) return NULL;
    *(size_t *)h = (bytes - HDR) / sizeof(float);
    return (float *)(h + HDR);
}

void fattn_cpu_scratch_put(float *p) {
    if (!p) return;
    char *h = (char *)p - HDR;
    char *old = atomic_exchange(&cached, h);
    if (old && cap_of(old) > cap_of(h)) { /* keep the larger one */
        char *mine = atomic_exchange(&cached, old);
        free(mine);
    } else {
        free(old);
    }
}

__attribute__((destructor)) static void scratch_free(void) { free(atomic_exchange(&cached, NULL)); }
