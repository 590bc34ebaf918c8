/* hadamard.c - the incoherent-processing rotation of FlashAttention-3 (§5 of
 * docs/design.md): x -> x diag(signs) H / sqrt(d), H the d x d Walsh-Hadamard
 * matrix (Sylvester order), signs +-1 drawn from a seed.  Orthogonal, so
 * applying it to the rows of Q and of K with the same seed leaves Q K^T
 * unchanged while spreading outlier features over all d columns. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "fattn.h"
#include "common/fp8.h"

/* splitmix64 (Steele, Lea, Flood 2014): state advances by the golden-ratio
 * increment, output is the finalised state. */
static uint64_t splitmix64_next(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* signs[i] is the top bit of the i-th output of a splitmix64 stream seeded
 * with `seed` (1 -> -1.0f, 0 -> +1.0f).  The stream is the contract: any
 * engine (CPU, CUDA) that needs the signs gets them from here. */
fattn_status fattn_rotation_signs(uint64_t seed, int32_t n, float *signs) {
    if (n <= 0 || signs == NULL) return FATTN_ERROR_INVALID_ARGUMENT;
    uint64_t state = seed;
    for (int32_t i = 0; i < n; i++)
        signs[i] = (splitmix64_next(&state) >> 63) ? -1.0f : 1.0f;
    return FATTN_OK;
}

void fattn_fwht(float *x, int32_t n) {
    for (int32_t h = 1; h < n; h <<= 1) {
        for (int32_t i = 0; i < n; i += h << 1) {
            for (int32_t j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
        }
    }
    /* log2(n) butterfly levels grow the norm by sqrt(n); for even log2(n) the
     * factor is an exact power of two. */
    const float norm = (float)(1.0 / sqrt((double)n));
    for (int32_t i = 0; i < n; i++) x[i] *= norm;
}

void fattn_rotate_row(float *x, const float *signs, int32_t n) {
    for (int32_t i = 0; i < n; i++) x[i] *= signs[i];
    fattn_fwht(x, n);
}

void fattn_unrotate_row(float *x, const float *signs, int32_t n) {
    fattn_fwht(x, n);
    for (int32_t i = 0; i < n; i++) x[i] *= signs[i];
}
