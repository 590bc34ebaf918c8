/* gemm_tmpl.h - the backward's f32 GEMM (kernels.h, fattn_gemm_fn) for one
 * ISA.  kernels.c includes it once per instance with GT(name) (a name
 * prefix), GT_ATTR (the target attribute), GT_VT (the vector type) and GT_W
 * (its float lanes) defined.
 *
 * C's rows go six at a time (then four, then two: m is a multiple of 4), its
 * columns two vectors at a time (then one): a 6 x 2W tile holds 12 vector
 * accumulators, enough FMAs in flight to cover their latency, with A's
 * elements broadcast straight from memory.  Every element of C is the same
 * chain of one multiply-add per p in p order whatever the tile, so the tile
 * shape never changes a bit of the result. */

typedef GT_VT GT(vtu) __attribute__((aligned(4), may_alias));
#define GT_INLINE GT_ATTR static inline __attribute__((always_inline))

/* Rows [0, R) and columns [0, NV * W) of C (R, NV, AT constants at each
 * call).  AT: A is stored transposed (k x m), its element (r, p) at
 * A[p * lda + r]. */
GT_INLINE void GT(tile)(const int R, const int NV, const int AT, int k, const float *A, int64_t lda,
                        const float *B, int64_t ldb, float *C, int64_t ldc, int accumulate) {
    GT_VT x[6][2];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) {
            x[r][v] = (GT_VT){0};
            if (accumulate) x[r][v] = *(const GT(vtu) *)(C + r * ldc + v * GT_W);
        }
    for (int p = 0; p < k; p++, B += ldb) {
        GT_VT b[2];
        for (int v = 0; v < NV; v++) b[v] = *(const GT(vtu) *)(B + v * GT_W);
        for (int r = 0; r < R; r++) {
            const float a = AT ? A[p * lda + r] : A[r * lda + p];
            const GT_VT s = a - (GT_VT){0}; /* x - 0 is x for every x: a broadcast */
            for (int v = 0; v < NV; v++) x[r][v] += s * b[v];
        }
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) *(GT(vtu) *)(C + r * ldc + v * GT_W) = x[r][v];
}

/* R rows of C, every column. */
GT_INLINE void GT(rows)(const int R, const int AT, int n, int k, const float *A, int64_t lda, const float *B,
                        int64_t ldb, float *C, int64_t ldc, int accumulate) {
    int j = 0;
    for (; j + 2 * GT_W <= n; j += 2 * GT_W)
        GT(tile)(R, 2, AT, k, A, lda, B + j, ldb, C + j, ldc, accumulate);
    for (; j < n; j += GT_W) GT(tile)(R, 1, AT, k, A, lda, B + j, ldb, C + j, ldc, accumulate);
}

GT_INLINE void GT(any)(const int AT, int m, int n, int k, const float *A, int64_t lda, const float *B,
                       int64_t ldb, float *C, int64_t ldc, int accumulate) {
    int i = 0;
#define GT_ROWS(R)                                                                                  \
    GT(rows)(R, AT, n, k, AT ? A + i : A + i * lda, lda, B, ldb, C + i * ldc, ldc, accumulate)
    for (; i + 6 <= m; i += 6) GT_ROWS(6);
    for (; i + 4 <= m; i += 4) GT_ROWS(4);
    for (; i < m; i += 2) GT_ROWS(2);
#undef GT_ROWS
}

GT_ATTR static void GT(gemm)(int m, int n, int k, const float *A, int64_t lda, const float *B, int64_t ldb,
                             float *C, int64_t ldc, int accumulate) {
    GT(any)(0, m, n, k, A, lda, B, ldb, C, ldc, accumulate);
}

/* The same with A stored k x m (C = A^T B): no transposed copy of A. */
GT_ATTR static void GT(gemm_tn)(int m, int n, int k, const float *A, int64_t lda, const float *B, int64_t ldb,
                                float *C, int64_t ldc, int accumulate) {
    GT(any)(1, m, n, k, A, lda, B, ldb, C, ldc, accumulate);
}

#undef GT_INLINE
