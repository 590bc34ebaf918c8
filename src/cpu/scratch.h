/* scratch.h - the CPU engine's per-call scratch memory, kept between calls.
 *
 * A call's scratch (every worker's tiles) used to be allocated and zeroed by
 * each call: up to ~2 MB, whose page faults and zeroing cost a few percent
 * of a short call.  Now one buffer is cached: a call takes it (or a larger
 * one replaces it), and gives it back when done.  Two calls at once simply
 * get two buffers; the larger is kept. */
#ifndef FATTN_CPU_SCRATCH_H
#define FATTN_CPU_SCRATCH_H

#include <stddef.h>

/* At least `floats` floats, 64-byte aligned, contents undefined; NULL when
 * memory is short. */
float *fattn_cpu_scratch_get(size_t floats);

/* Give back a buffer from fattn_cpu_scratch_get (NULL is ignored). */
void fattn_cpu_scratch_put(float *p);

#endif
