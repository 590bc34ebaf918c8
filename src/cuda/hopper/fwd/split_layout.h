/* split_layout.h - where the split forward (FwdCfg SPLIT, v30) puts
 * each worker's key blocks.  Plain C, so the CPU tests check it
 * (tests/test_split_layout.c) without a GPU. */
#ifndef FATTN_SPLIT_LAYOUT_H
#define FATTN_SPLIT_LAYOUT_H

/* `rem` tail tiles of `nb` key blocks each, laid end to end as U = rem * nb
 * blocks; worker w < workers (1 <= workers <= U) takes blocks
 * [w U / workers, (w + 1) U / workers): at least one, at most a tile's worth
 * (workers >= rem), so at most two pieces, the end of one tile and the start
 * of the next.  Out:
 *   tile[w]        the tail tile (0-based) of worker w's first piece (its
 *                  second, if any, is tile[w] + 1);
 *   rng0[w], rng1[w]  key blocks lo | hi << 16 of its first and second piece
 *                  (rng1[w] = 0: none);
 *   owners[r]      first | last << 16: the workers whose pieces make up tail
 *                  tile r, consecutive.
 * Returns 0, or -1 when the arguments break the conditions above (nb must
 * also fit 15 bits: hi << 16 stays a positive int). */
static inline int fattn_split_layout(int rem, int nb, int workers, int *tile, int *rng0, int *rng1, int *owners) {
    const long long units = (long long)rem * nb;
    if (rem < 1 || nb < 1 || nb > 32767 || workers < rem || workers > units || workers > 65535) return -1;
    for (int r = 0; r < rem; ++r) owners[r] = -1;
    for (int w = 0; w < workers; ++w) {
        const long long lo = w * units / workers, hi = (w + 1) * units / workers;
        const long long r0 = lo / nb, end0 = (r0 + 1) * nb < hi ? (r0 + 1) * nb : hi;
        tile[w] = (int)r0;
        rng0[w] = (int)(lo - r0 * nb) | (int)(end0 - r0 * nb) << 16;
        rng1[w] = end0 < hi ? (int)(hi - end0) << 16 : 0;
        for (long long r = r0; r <= (hi - 1) / nb; ++r) {
            if (owners[r] == -1) owners[r] = w;
            owners[r] = (owners[r] & 0xffff) | w << 16;
        }
    }
    return 0;
}

#endif
