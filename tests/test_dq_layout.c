/* test_dq_layout.c - the backward's dQ workspace orders (src/cuda/common/
 * bwd_dq_layout.h; the same functions run on the device): bwd_dq_index and
 * bwd_dq_index_emaj map a 64 x D tile one to one onto its 64 D floats for
 * every head dim and Hopper column width; the element-major order keeps
 * bwd_dq_index's 128-float groups, puts (row, col + 1) 32 floats after
 * (row, col), and is where the portable kernels' adds land: lane 4 g + t of
 * the warp of query group wq adds element e of its m16n8 fragment of
 * 8-column group c8 at (wq D / 8 + c8) 128 + 32 e + lane (pbwd_add_dq), and
 * each add instruction (fixed e) covers 128 contiguous bytes. */
#include <stdio.h>
#include <stdlib.h>

#include "cuda/common/bwd_dq_layout.h"

/* a failed check prints its message and makes the caller return 0 */
#define EXPECT(cond, ...)                                                                                              \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "test_dq_layout: " __VA_ARGS__);                                                           \
            fprintf(stderr, "\n");                                                                                     \
            return 0;                                                                                                  \
        }                                                                                                              \
    } while (0)

static int check_width_into(int d, int width, unsigned char *seen, unsigned char *seen_e) {
    const int n = 64 * d;
    for (int row = 0; row < 64; ++row)
        for (int col = 0; col < d; ++col) {
            const int i = bwd_dq_index(row, col, width), j = bwd_dq_index_emaj(row, col, width);
            EXPECT(i >= 0 && i < n && !seen[i], "d %d width %d: bwd_dq_index(%d, %d) = %d repeats or is out of range", d,
                   width, row, col, i);
            EXPECT(j >= 0 && j < n && !seen_e[j] && j / 128 == i / 128, "d %d width %d: emaj(%d, %d) = %d (index %d)", d,
                   width, row, col, j, i);
            if (col % 2 == 0)
                EXPECT(bwd_dq_index(row, col + 1, width) == i + 1 && bwd_dq_index_emaj(row, col + 1, width) == j + 32,
                       "d %d width %d: (%d, %d + 1) not beside (%d, %d)", d, width, row, col, row, col);
            seen[i] = seen_e[j] = 1;
        }
    return 1;
}

static int check_width(int d, int width) {
    unsigned char *seen = calloc((size_t)64 * d, 1), *seen_e = calloc((size_t)64 * d, 1);
    const int ok = seen && seen_e && check_width_into(d, width, seen, seen_e);
    free(seen);
    free(seen_e);
    return ok;
}

/* the portable kernels' add address of every fragment element against emaj */
static int check_adds(int d) {
    for (int wq = 0; wq < 4; ++wq)
        for (int c8 = 0; c8 < d / 8; ++c8)
            for (int e = 0; e < 4; ++e) {
                int lo = 1 << 30, hi = -1;
                for (int lane = 0; lane < 32; ++lane) {
                    const int g = lane / 4, t = lane % 4;
                    const int row = 16 * wq + g + 8 * (e >> 1), col = 8 * c8 + 2 * t + (e & 1);
                    const int at = (wq * (d / 8) + c8) * 128 + 32 * e + lane;
                    EXPECT(at == bwd_dq_index_emaj(row, col, d), "d %d: lane %d e %d of (%d, %d) adds at %d, emaj %d", d,
                           lane, e, row, col, at, bwd_dq_index_emaj(row, col, d));
                    lo = at < lo ? at : lo;
                    hi = at > hi ? at : hi;
                }
                EXPECT(hi - lo == 31 && lo % 32 == 0, "d %d: an add spans %d..%d", d, lo, hi);
            }
    return 1;
}

int main(void) {
    static const int dims[] = {64, 96, 128, 192, 256};
    int ok = 1;
    for (int k = 0; k < 5 && ok; ++k) {
        const int d = dims[k];
        ok = check_width(d, d);
        if (ok && d % 64 == 0) ok = check_adds(d);
        /* the Hopper backward's column parts: its consumers' dQ widths */
        for (int w = 32; w < d && ok; w *= 2)
            if (d % w == 0) ok = check_width(d, w);
    }
    printf("dq layout: %s\n", ok ? "all checks passed" : "FAILED");
    return ok ? 0 : 1;
}
