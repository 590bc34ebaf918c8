/* test_split_layout.c - the split forward's tail layout (src/cuda/hopper/fwd/
 * split_layout.h, perf-notes v30), checked exhaustively on small cases and on
 * the shapes the benchmarks split: every key block of every tail tile is in
 * exactly one worker's piece, a worker has one or two pieces, each inside one
 * tile, its blocks are U / workers rounded down or up, and owners[] names
 * exactly the workers whose pieces make up each tile. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/testutil.h"
#include "cuda/hopper/fwd/split_layout.h"

#define MAXW 160

static void check(int rem, int nb, int workers) {
    int tile[MAXW], rng0[MAXW], rng1[MAXW], owners[MAXW];
    char what[128];
    snprintf(what, sizeof what, "layout rem %d nb %d workers %d", rem, nb, workers);
    if (fattn_split_layout(rem, nb, workers, tile, rng0, rng1, owners) != 0) {
        TU_CHECK(0, "%s: rejected", what);
        return;
    }
    const long long units = (long long)rem * nb;
    unsigned char *seen = calloc((size_t)units, 1);
    int first[MAXW], last[MAXW];
    for (int r = 0; r < rem; ++r) first[r] = last[r] = -1;
    int bad = 0;
    for (int w = 0; w < workers && !bad; ++w) {
        const int rngs[2] = {rng0[w], rng1[w]};
        long long got = 0;
        for (int j = 0; j < 2; ++j) {
            if (j == 1 && rngs[j] == 0) break;
            const int lo = rngs[j] & 0xffff, hi = rngs[j] >> 16, r = tile[w] + j;
            if (!(lo < hi && hi <= nb && r >= 0 && r < rem) || (j == 1 && lo != 0) ||
                (j == 0 && rngs[1] != 0 && hi != nb)) {
                bad = 1;
                break;
            }
            for (int n = lo; n < hi; ++n) seen[(long long)r * nb + n]++;
            got += hi - lo;
            if (first[r] < 0) first[r] = w;
            last[r] = w;
        }
        if (got != (w + 1) * units / workers - w * units / workers) bad = 1;
    }
    for (long long u = 0; u < units && !bad; ++u)
        if (seen[u] != 1) bad = 1;
    for (int r = 0; r < rem && !bad; ++r)
        if (owners[r] != (first[r] | last[r] << 16)) bad = 1;
    TU_CHECK(!bad, "%s: pieces, coverage or owners wrong", what);
    free(seen);
}

int main(void) {
    int cases = 0;
    for (int rem = 1; rem <= 12; ++rem)
        for (int nb = 1; nb <= 20; ++nb)
            for (int workers = rem; workers <= rem * nb && workers <= MAXW; ++workers, ++cases) check(rem, nb, workers);
    /* the benchmarks' splits: d128 16k tokens (68 tail tiles on 132 SMs),
     * d256 CTA pairs (50 on 66), d64 192-row tiles, few tiles with long keys */
    const int big[][3] = {{68, 24, 132}, {68, 47, 132}, {68, 94, 132}, {50, 52, 66}, {50, 103, 66},
                          {44, 16, 132}, {64, 187, 132}, {8, 410, 132}, {1, 32767, 132}, {131, 2, 132}};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; ++i, ++cases) check(big[i][0], big[i][1], big[i][2]);
    int t[MAXW], a[MAXW], b[MAXW], o[MAXW];
    TU_CHECK(fattn_split_layout(4, 3, 3, t, a, b, o) != 0, "layout: fewer workers than tiles rejected");
    TU_CHECK(fattn_split_layout(2, 3, 7, t, a, b, o) != 0, "layout: more workers than blocks rejected");
    TU_CHECK(fattn_split_layout(1, 32768, 2, t, a, b, o) != 0, "layout: 32768 blocks per tile rejected");
    printf("  %d layouts checked\n", cases);
    return tu_finish("split layout");
}
